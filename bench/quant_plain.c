/* quant_plain.c - the baselines the kernels' quantize / dequantize / prune
 * figures are measured against: every format written and read as a user
 * would write it in plain C from kernels/format.h and the rules of
 * kernels/quant.h, with simple loops (the compiler vectorises what it can)
 * and F16C for every FP16 conversion.  Built with -O3 -mavx2 -mfma -mf16c
 * -fno-math-errno -fno-trapping-math -ffinite-math-only -fno-signed-zeros
 * -ffp-contract=off
 * (bench/CMakeLists.txt): the flags that let GCC vectorise min / max
 * reductions without changing a rounding (-ffast-math would reassociate the
 * rules' sums and replace x / 127 by a product, and write other bytes).  The
 * bench checks these bytes equal the kernels'; call them only where
 * ckv_bench_quant_plain_supported(). */
#include "bench/quant_plain.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"

bool ckv_bench_quant_plain_supported(void) { return ckv_kernels_path_supported(CKV_PATH_AVX2); /* AVX2, FMA, F16C */ }

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
/* Round to nearest even; -0 as +0 (integer test: the flags may not keep a zero's sign). */
static inline uint16_t f2h(float f) {
  uint16_t h = (uint16_t)_cvtss_sh(f, 0);
  return h == 0x8000u ? 0 : h;
}
/* quant.h's FP16 rounding up (scales) and down (zero points), with F16C. */
static uint16_t f16_up(float v) {
  if (!(v > 0.0f)) v = 0.0f;
  if (v > CKV_F16_MAX) v = CKV_F16_MAX;
  uint16_t h = f2h(v);
  return h2f(h) < v ? (uint16_t)(h + 1u) : h;
}
static uint16_t f16_down(float v) {
  if (v < -CKV_F16_MAX) v = -CKV_F16_MAX;
  if (v > CKV_F16_MAX) v = CKV_F16_MAX;
  uint16_t h = f2h(v);
  if (h2f(h) > v) h = h == 0 ? 0x8001u : (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
  return h;
}
static inline float clampf(float v, float lo, float hi) { return v > lo ? (v < hi ? v : hi) : lo; } /* NaN -> lo */
static inline uint8_t *at(void *blk, size_t off) { return (uint8_t *)blk + off; }

/* One draft row (K or V of a layer) widened. */
static void widen(const ckv_geometry *g, void *const *src, size_t t, uint32_t l, uint32_t kv, float *x) {
  const uint16_t *h = (const uint16_t *)at(src[t / 16], ckv_draft_kv_offset(g, 16, l, kv, (uint32_t)(t % 16)));
  size_t te = ckv_draft_token_elems(g);
  if (g->dtype == CKV_DTYPE_BF16)
    for (size_t i = 0; i < te; i++) x[i] = ckv_bf16_to_f32(h[i]);
  else
    for (size_t i = 0; i < te; i += 8) _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}

/* ---- staged INT8 ---- */
static void q8_row(const float *x, size_t te, size_t gl, int8_t *codes, uint16_t *scales) {
  for (size_t lo = 0, q = 0; lo < te; lo += gl, q++) {
    size_t n = te - lo < gl ? te - lo : gl;
    float am = 0.0f;
    for (size_t i = 0; i < n; i++) am = fabsf(x[lo + i]) > am ? fabsf(x[lo + i]) : am;
    uint16_t s = f16_up(am / 127.0f);
    float sf = h2f(s), inv = sf > 0.0f ? 1.0f / sf : 0.0f;
    scales[q] = s;
    for (size_t i = 0; i < n; i++) codes[lo + i] = (int8_t)clampf(rintf(x[lo + i] * inv), -127.0f, 127.0f);
  }
}

/* ---- committed INT4 / INT2 ---- */
typedef struct qa {
  uint16_t s, z;
  float zf, inv;
} qa;
static qa qa_of(float mn, float mx, uint32_t bits) {
  if (!(mn <= mx)) mn = mx = 0.0f;
  qa p;
  p.z = f16_down(mn);
  p.zf = h2f(p.z);
  p.s = f16_up(((mx < CKV_F16_MAX ? mx : CKV_F16_MAX) - p.zf) / (float)ckv_qa_levels(bits));
  float sf = h2f(p.s);
  p.inv = sf > 0.0f ? 1.0f / sf : 0.0f;
  return p;
}
static inline uint32_t qa_code(float x, float zf, float inv, float top) {
  return (uint32_t)clampf(rintf((x - zf) * inv), 0.0f, top);
}

/* One 32-token chunk (tokens t0.. of dst block b, n of them) of one layer. */
static void commit_chunk(const ckv_geometry *g, void *const *src, void *dst, uint32_t fmt, uint32_t cap, size_t t0,
                         uint32_t chunk, uint32_t l, float *rows) {
  uint32_t D = g->head_dim, H = g->n_kv_heads, T = CKV_COMMIT_CHUNK_TOKENS, bits = ckv_format_code_bits(fmt);
  uint32_t ng = ckv_commit_value_groups(g);
  size_t te = ckv_draft_token_elems(g), krow = ckv_commit_key_row_bytes(fmt, D), vrow = ckv_commit_value_row_bytes(fmt, g);
  float top = (float)ckv_qa_levels(bits);
  for (uint32_t i = 0; i < T; i++) widen(g, src, t0 + i, l, 0, rows + i * te);
  for (uint32_t hd = 0; hd < H; hd++) {
    uint64_t *mask = (uint64_t *)at(dst, ckv_commit_mask_offset(fmt, g, cap, D, l, hd));
    for (uint32_t w = 0; w < ckv_commit_mask_words(g); w++) mask[w] = D - 64u * w >= 64u ? ~0ull : (1ull << (D - 64u * w)) - 1u;
    uint8_t *c = at(dst, ckv_commit_key_chunk_offset(fmt, g, cap, D, l, hd, chunk));
    memset(c, 0, ckv_commit_key_chunk_bytes(fmt, D));
    uint16_t *sc = (uint16_t *)c, *zp = sc + D;
    float mn[CKV_MAX_HEAD_DIM], mx[CKV_MAX_HEAD_DIM], zf[CKV_MAX_HEAD_DIM], inv[CKV_MAX_HEAD_DIM];
    for (uint32_t j = 0; j < D; j++) mn[j] = INFINITY, mx[j] = -INFINITY;
    for (uint32_t i = 0; i < T; i++) {
      const float *x = rows + i * te + (size_t)hd * D;
      for (uint32_t j = 0; j < D; j++) {
        mn[j] = x[j] < mn[j] ? x[j] : mn[j];
        mx[j] = x[j] > mx[j] ? x[j] : mx[j];
      }
    }
    for (uint32_t j = 0; j < D; j++) {
      qa p = qa_of(mn[j], mx[j], bits);
      sc[j] = p.s, zp[j] = p.z, zf[j] = p.zf, inv[j] = p.inv;
    }
    for (uint32_t i = 0; i < T; i++) {
      const float *x = rows + i * te + (size_t)hd * D;
      uint8_t *row = c + (size_t)D * 4u + i * krow;
      for (uint32_t j = 0; j < D; j++) ckv_pack_code(row, j, bits, qa_code(x[j], zf[j], inv[j], top));
    }
  }
  uint16_t *par = (uint16_t *)at(dst, ckv_commit_value_params_offset(fmt, g, cap, D, l));
  uint8_t *vcodes = at(dst, ckv_commit_value_codes_offset(fmt, g, cap, D, l));
  float *x = rows;
  for (uint32_t i = 0; i < T; i++) {
    uint32_t slot = chunk * T + i;
    widen(g, src, t0 + i, l, 1, x);
    uint8_t *row = vcodes + (size_t)slot * vrow;
    memset(row, 0, vrow);
    for (uint32_t q = 0; q < ng; q++) {
      size_t lo = (size_t)q * CKV_COMMIT_VALUE_GROUP, n = te - lo < CKV_COMMIT_VALUE_GROUP ? te - lo : CKV_COMMIT_VALUE_GROUP;
      float a = INFINITY, b = -INFINITY;
      for (size_t e = lo; e < lo + n; e++) {
        a = x[e] < a ? x[e] : a;
        b = x[e] > b ? x[e] : b;
      }
      qa p = qa_of(a, b, bits);
      par[((size_t)slot * ng + q) * 2u] = p.s;
      par[((size_t)slot * ng + q) * 2u + 1u] = p.z;
      for (size_t e = lo; e < lo + n; e++) ckv_pack_code(row, e, bits, qa_code(x[e], p.zf, p.inv, top));
    }
  }
}

/* ---- rotated ---- */
/* ckv_fwht, the loops as quant.h writes them. */
static void fwht(float *x, uint32_t n) {
  for (uint32_t len = 1; len < n; len <<= 1)
    for (uint32_t i = 0; i < n; i += len << 1)
      for (uint32_t j = i; j < i + len; j++) {
        float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}
static inline float make_finite(float v) { return v != v ? 0.0f : clampf(v, -CKV_F16_MAX, CKV_F16_MAX); }
/* The head's signs: the hash once per head and call, not per element. */
static void head_signs(uint32_t l, uint32_t kv, uint32_t hd, uint32_t D, float *s) {
  for (uint32_t i = 0; i < D; i++) s[i] = ckv_rot_sign(l, kv, hd, i);
}
/* Every head of a token's row rotated: x <- R x (finite, signs, transform, norm). */
static void rotate_row(const ckv_geometry *g, const float *signs, float *x) {
  uint32_t D = g->head_dim;
  float r = ckv_rot_norm(D);
  for (uint32_t hd = 0; hd < g->n_kv_heads; hd++) {
    float *v = x + (size_t)hd * D;
    const float *s = signs + (size_t)hd * D;
    for (uint32_t i = 0; i < D; i++) v[i] = make_finite(v[i]) * s[i];
    fwht(v, D);
    for (uint32_t i = 0; i < D; i++) v[i] = v[i] * r;
  }
}
/* ckv_rot_quant_head: sum of squares in 16 lanes and absmax, the rules' candidates and errors, the codes. */
static void rot_head(const float *y, uint32_t n, uint32_t bits, uint8_t *ret_scale, uint8_t *row) {
  float ss[16] = {0}, am = 0.0f;
  for (uint32_t i = 0; i < n; i += 8)
    for (uint32_t j = 0; j < 8; j++) {
      ss[(i + j) & 15u] = y[i + j] * y[i + j] + ss[(i + j) & 15u];
      am = fabsf(y[i + j]) > am ? fabsf(y[i + j]) : am;
    }
  uint8_t cand[CKV_ROT_CANDIDATES];
  float err[CKV_ROT_CANDIDATES];
  ckv_rot_candidates(ckv_lanes16_total(ss), am, n, bits, cand);
  ckv_rot_sq_errors(y, n, bits, cand, err);
  uint8_t sc = ckv_rot_best(cand, err);
  float inv = ckv_rot_scale_inv(sc), half = (float)(1u << (bits - 1u)), top = (float)ckv_qa_levels(bits);
  memset(row, 0, (size_t)n * bits / 8u);
  for (uint32_t i = 0; i < n; i++) ckv_pack_code(row, i, bits, (uint32_t)clampf(floorf(y[i] * inv) + half, 0.0f, top));
  *ret_scale = sc;
}
/* One rotated block: per layer, the keys of its tokens rotated, their mean, the keys less it, the values. */
static void rot_block(const ckv_geometry *g, void *const *src, void *dst, uint32_t fmt, uint32_t cap, size_t t0,
                      float *rows, float *signs) {
  uint32_t D = g->head_dim, H = g->n_kv_heads, bits = ckv_format_code_bits(fmt);
  size_t te = ckv_draft_token_elems(g), rb = ckv_rot_row_bytes(fmt, g);
  float mean[CKV_MAX_HEAD_DIM];
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++) {
      for (uint32_t hd = 0; hd < H; hd++) head_signs(l, kv, hd, D, signs + (size_t)hd * D);
      uint8_t *sc = at(dst, ckv_rot_scales_offset(fmt, g, cap, l, kv)), *codes = at(dst, ckv_rot_codes_offset(fmt, g, cap, l, kv));
      for (uint32_t i = 0; i < cap; i++) {
        widen(g, src, t0 + i, l, kv, rows + i * te);
        rotate_row(g, signs, rows + i * te);
      }
      if (kv == 0)
        for (uint32_t hd = 0; hd < H; hd++) {
          uint16_t *m = (uint16_t *)at(dst, ckv_rot_mean_offset(g, cap, l, hd));
          for (uint32_t e = 0; e < D; e++) {
            float s = 0.0f;
            for (uint32_t i = 0; i < cap; i++) s = s + rows[i * te + (size_t)hd * D + e];
            m[e] = (uint16_t)_cvtss_sh(make_finite(s / (float)cap), 0); /* as ckv_rot_mean_f16: a -0 stays -0 */
            mean[e] = make_finite(h2f(m[e]));
          }
          for (uint32_t i = 0; i < cap; i++)
            for (uint32_t e = 0; e < D; e++) rows[i * te + (size_t)hd * D + e] -= mean[e];
        }
      for (uint32_t i = 0; i < cap; i++)
        for (uint32_t hd = 0; hd < H; hd++) {
          size_t k = (size_t)i * H + hd;
          rot_head(rows + i * te + (size_t)hd * D, D, bits, &sc[k], codes + k * rb);
        }
    }
  *(uint32_t *)at(dst, ckv_rot_meta_offset(cap)) |= CKV_ROT_MEANS_SET;
}

int ckv_bench_plain_quantize(uint32_t fmt, const ckv_geometry *g, void *const *src, void *const *dst, uint32_t cap,
                             size_t t0, size_t t1) {
  size_t te = ckv_draft_token_elems(g);
  float *rows = malloc((size_t)cap * te * sizeof(float)), *signs = malloc(te * sizeof(float));
  if (!rows || !signs) {
    free(rows);
    free(signs);
    return -1;
  }
  for (size_t t = t0; t < t1; t += cap) {
    void *d = dst[t / cap];
    for (uint32_t i = 0; i < cap; i++) ckv_block_positions(d)[i] = ckv_block_positions_const(src[(t + i) / 16])[(t + i) % 16];
    if (fmt == CKV_FORMAT_STAGED) {
      uint32_t ng = ckv_staged_groups(g);
      size_t gl = (size_t)ckv_staged_group_heads(g) * g->head_dim;
      for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
          for (uint32_t i = 0; i < cap; i++) {
            widen(g, src, t + i, l, kv, rows);
            q8_row(rows, te, gl, (int8_t *)at(d, ckv_staged_codes_offset(g, cap, l, kv)) + (size_t)i * te,
                   (uint16_t *)at(d, ckv_staged_scales_offset(g, cap, l, kv)) + (size_t)i * ng);
          }
    } else if (ckv_format_is_commit(fmt)) {
      for (uint32_t c = 0; c < ckv_commit_chunks(cap); c++)
        for (uint32_t l = 0; l < g->n_layers; l++)
          commit_chunk(g, src, d, fmt, cap, t + (size_t)c * CKV_COMMIT_CHUNK_TOKENS, c, l, rows);
      *(uint32_t *)at(d, ckv_commit_meta_offset(cap)) |= (uint32_t)((1ull << ckv_commit_chunks(cap)) - 1u);
    } else {
      rot_block(g, src, d, fmt, cap, t, rows, signs);
    }
  }
  free(rows);
  free(signs);
  return 0;
}

/* ---- dequantize ---- */
static void dequant_row(const ckv_geometry *g, const void *blk, uint32_t l, uint32_t kv, uint32_t slot, float *x) {
  const ckv_block_header *h = blk;
  uint32_t fmt = h->format, cap = h->capacity, D = g->head_dim, H = g->n_kv_heads, bits = ckv_format_code_bits(fmt);
  size_t te = ckv_draft_token_elems(g);
  const uint8_t *b = blk;
  if (fmt == CKV_FORMAT_STAGED) {
    const int8_t *c = (const int8_t *)(b + ckv_staged_codes_offset(g, cap, l, kv)) + (size_t)slot * te;
    const uint16_t *sc = (const uint16_t *)(b + ckv_staged_scales_offset(g, cap, l, kv)) + (size_t)slot * ckv_staged_groups(g);
    size_t gl = (size_t)ckv_staged_group_heads(g) * D;
    for (size_t lo = 0, q = 0; lo < te; lo += gl, q++) {
      float s = h2f(sc[q]);
      for (size_t i = lo; i < lo + gl && i < te; i++) x[i] = (float)c[i] * s;
    }
  } else if (ckv_format_is_commit(fmt)) {
    uint32_t kept = h->kept_channels, chunk = slot / CKV_COMMIT_CHUNK_TOKENS;
    if (kv == 0) {
      for (uint32_t hd = 0; hd < H; hd++) { /* nothing pruned: channel j is kept channel j */
        const uint8_t *c = b + ckv_commit_key_chunk_offset(fmt, g, cap, kept, l, hd, chunk);
        const uint16_t *sc = (const uint16_t *)c, *zp = sc + kept;
        const uint8_t *row = c + (size_t)kept * 4u + (slot % CKV_COMMIT_CHUNK_TOKENS) * ckv_commit_key_row_bytes(fmt, kept);
        for (uint32_t j = 0; j < D; j++) x[(size_t)hd * D + j] = (float)ckv_unpack_code(row, j, bits) * h2f(sc[j]) + h2f(zp[j]);
      }
    } else {
      const uint16_t *par = (const uint16_t *)(b + ckv_commit_value_params_offset(fmt, g, cap, kept, l)) +
                            (size_t)slot * ckv_commit_value_groups(g) * 2u;
      const uint8_t *row = b + ckv_commit_value_codes_offset(fmt, g, cap, kept, l) + (size_t)slot * ckv_commit_value_row_bytes(fmt, g);
      for (size_t lo = 0, q = 0; lo < te; lo += CKV_COMMIT_VALUE_GROUP, q++) {
        float s = h2f(par[2 * q]), z = h2f(par[2 * q + 1]);
        for (size_t e = lo; e < lo + CKV_COMMIT_VALUE_GROUP && e < te; e++) x[e] = (float)ckv_unpack_code(row, e, bits) * s + z;
      }
    }
  } else { /* rotated: the values, the key mean, the inverse rotation */
    size_t rb = ckv_rot_row_bytes(fmt, g);
    const uint8_t *sc = b + ckv_rot_scales_offset(fmt, g, cap, l, kv) + (size_t)slot * H;
    const uint8_t *codes = b + ckv_rot_codes_offset(fmt, g, cap, l, kv) + (size_t)slot * H * rb;
    float off = ckv_rot_offset(bits), r = ckv_rot_norm(D), s[CKV_MAX_HEAD_DIM];
    for (uint32_t hd = 0; hd < H; hd++) {
      float *v = x + (size_t)hd * D, scale = ckv_rot_scale_value(sc[hd]);
      const uint16_t *m = (const uint16_t *)(b + ckv_rot_mean_offset(g, cap, l, hd));
      for (uint32_t i = 0; i < D; i++) {
        v[i] = ((float)ckv_unpack_code(codes + hd * rb, i, bits) - off) * scale;
        if (kv == 0) v[i] = v[i] + make_finite(h2f(m[i]));
      }
      fwht(v, D);
      head_signs(l, kv, hd, D, s);
      for (uint32_t i = 0; i < D; i++) v[i] = v[i] * r * s[i];
    }
  }
}

void ckv_bench_plain_dequantize(const ckv_geometry *g, void *const *blk, size_t b0, size_t b1, float *ring,
                                size_t ring_floats) {
  size_t te = ckv_draft_token_elems(g), pos = 0;
  for (size_t b = b0; b < b1; b++) {
    uint32_t cap = ((const ckv_block_header *)blk[b])->capacity;
    for (uint32_t s = 0; s < cap; s++)
      for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          if (pos + te > ring_floats) pos = 0;
          dequant_row(g, blk[b], l, kv, s, ring + pos);
          pos += te;
        }
  }
}

/* ---- pruning ---- */
typedef struct ranked {
  float mag;
  uint32_t ch;
} ranked;
static int by_magnitude(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->mag != y->mag) return x->mag > y->mag ? -1 : 1;
  return x->ch < y->ch ? -1 : x->ch > y->ch;
}

int ckv_bench_plain_prune(const ckv_geometry *g, void *const *src, void *const *dst, uint32_t cap, size_t t0,
                          size_t t1) {
  size_t te = ckv_draft_token_elems(g);
  float *row = malloc(te * sizeof(float)), *mag = malloc(te * sizeof(float));
  if (!row || !mag) {
    free(row);
    free(mag);
    return -1;
  }
  uint32_t D = g->head_dim;
  for (size_t t = t0; t < t1; t += cap) {
    void *d = dst[t / cap];
    const ckv_block_header *h = d;
    for (uint32_t l = 0; l < g->n_layers; l++) {
      memset(mag, 0, te * sizeof(float));
      for (uint32_t i = 0; i < cap; i++) {
        widen(g, src, t + i, l, 0, row);
        for (size_t e = 0; e < te; e++) mag[e] += fabsf(row[e]);
      }
      for (uint32_t hd = 0; hd < g->n_kv_heads; hd++) {
        ranked rk[CKV_MAX_HEAD_DIM];
        for (uint32_t c = 0; c < D; c++) rk[c] = (ranked){mag[(size_t)hd * D + c], c};
        qsort(rk, D, sizeof rk[0], by_magnitude);
        uint64_t *m = (uint64_t *)at(d, ckv_commit_mask_offset(h->format, g, cap, h->kept_channels, l, hd));
        memset(m, 0, ckv_commit_mask_words(g) * sizeof(uint64_t));
        for (uint32_t i = 0; i < h->kept_channels; i++) m[rk[i].ch / 64u] |= 1ull << (rk[i].ch % 64u);
      }
    }
  }
  free(row);
  free(mag);
  return 0;
}
