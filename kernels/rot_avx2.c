/* rot_avx2.c - the rotated formats' hot steps with AVX2 (compiled with
 * -mavx2 -mfma -mf16c; rot.c and dequant.c call them only when the CPU path
 * is AVX2 or AVX-512 and head_dim is a multiple of 8): the forward rotation
 * of a head, its quantization, and a head read back and rotated back.  Each
 * computes what kernels/quant.h's rules compute, operation for operation:
 * the butterflies are the same additions and subtractions, element-wise
 * products are the same products, and the sums run in the 16 lanes the rules
 * prescribe (ckv_lanes16_total: two vectors), so the bytes equal the scalar path's and
 * CUDA's (test_kernels_rot checks every path).  Where a step is written
 * differently it is exact either way, and the comment there says why. */
#include <immintrin.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

/* The `bits` bytes (1..4) of 8 codes at p, little-endian, and back: fixed-size copies per case, which the
 * compiler turns into plain loads and stores (a memcpy of a variable size would be a call). */
static inline uint32_t load_bytes(const uint8_t *p, uint32_t bits) {
  uint16_t a;
  uint32_t v;
  switch (bits) {
    case 1: return p[0];
    case 2: memcpy(&a, p, 2); return a;
    case 3: memcpy(&a, p, 2); return a | (uint32_t)p[2] << 16;
    default: memcpy(&v, p, 4); return v;
  }
}
static inline void store_bytes(uint8_t *p, uint32_t v, uint32_t bits) {
  uint16_t a = (uint16_t)v;
  switch (bits) {
    case 1: p[0] = (uint8_t)v; return;
    case 2: memcpy(p, &a, 2); return;
    case 3: memcpy(p, &a, 2); p[2] = (uint8_t)(v >> 16); return;
    default: memcpy(p, &v, 4); return;
  }
}

/* One butterfly stage within each 8-float vector: lanes of mask take s - v
 * (a - b), the others v + s (a + b); s is v with the partners swapped.  A
 * macro: the blend's mask must be an immediate, also at -O0. */
#define STAGE_IN(v, s, mask) _mm256_blend_ps(_mm256_add_ps((v), (s)), _mm256_sub_ps((s), (v)), (mask))

static inline __m256 fwht8(__m256 v) { /* stages 1, 2, 4: inside a vector */
  __m256 s = _mm256_permute_ps(v, 0xB1);
  v = STAGE_IN(v, s, 0xAA);
  s = _mm256_permute_ps(v, 0x4E);
  v = STAGE_IN(v, s, 0xCC);
  s = _mm256_permute2f128_ps(v, v, 0x01);
  return STAGE_IN(v, s, 0xF0);
}

/* The stages of ckv_fwht from len 8 on (n a multiple of 8); the callers did stages 1, 2, 4 (fwht8). */
static void fwht_from8(float *x, uint32_t n) {
  uint32_t len = 8;
  for (; len * 4 <= n; len <<= 2) /* two stages (len, 2 len) per pass over x: half the loads and stores */
    for (uint32_t i = 0; i < n; i += len << 2)
      for (uint32_t j = i; j < i + len; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
        __m256 c = _mm256_loadu_ps(x + j + 2 * len), d = _mm256_loadu_ps(x + j + 3 * len);
        __m256 ab = _mm256_add_ps(a, b), as = _mm256_sub_ps(a, b), cd = _mm256_add_ps(c, d), cs = _mm256_sub_ps(c, d);
        _mm256_storeu_ps(x + j, _mm256_add_ps(ab, cd));
        _mm256_storeu_ps(x + j + len, _mm256_add_ps(as, cs));
        _mm256_storeu_ps(x + j + 2 * len, _mm256_sub_ps(ab, cd));
        _mm256_storeu_ps(x + j + 3 * len, _mm256_sub_ps(as, cs));
      }
  for (; len < n; len <<= 1)
    for (uint32_t i = 0; i < n; i += len << 1)
      for (uint32_t j = i; j < i + len; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + len, _mm256_sub_ps(a, b));
      }
}

/* fwht8 with each stage as fma(v, +-1, s) (v * +-1 is exact: one rounding, the addition's; the same float as
 * the add / sub blend of STAGE_IN, in 2 instructions instead of 3). */
static inline __m256 fwht8_fma(__m256 v) {
  v = _mm256_fmadd_ps(v, _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), _mm256_permute_ps(v, 0xB1));
  v = _mm256_fmadd_ps(v, _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1), _mm256_permute_ps(v, 0x4E));
  return _mm256_fmadd_ps(v, _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1), _mm256_permute2f128_ps(v, v, 0x01));
}

/* The forward rotation of NV vectors (NV a power of two, 1..8, a constant at each call) in registers, before
 * the norm: finite times the sign, stages 1, 2, 4 per vector, the later ones across vectors. */
static inline __attribute__((always_inline)) void forward_regs8(const float *x, int NV, const float *signs, __m256 *v) {
  const __m256 lo = _mm256_set1_ps(-CKV_F16_MAX), hi = _mm256_set1_ps(CKV_F16_MAX);
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++) {
    __m256 t = _mm256_loadu_ps(x + 8 * k);
    t = _mm256_blendv_ps(t, _mm256_setzero_ps(), _mm256_cmp_ps(t, t, _CMP_UNORD_Q));
    v[k] = fwht8_fma(_mm256_mul_ps(_mm256_min_ps(_mm256_max_ps(t, lo), hi), _mm256_loadu_ps(signs + 8 * k)));
  }
#pragma GCC unroll 4
  for (int len = 1; len < 8; len <<= 1)
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
      if (len < NV && j < NV && !(j & len) && j + len < 8) {
        __m256 a = v[j], b = v[j + len];
        v[j] = _mm256_add_ps(a, b);
        v[j + len] = _mm256_sub_ps(a, b);
      }
}

/* n = 8 * NV <= 64 in registers, the norm, one store. */
static inline __attribute__((always_inline)) void forward_small(float *x, int NV, const float *signs, __m256 r) {
  __m256 v[8];
  forward_regs8(x, NV, signs, v);
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++) _mm256_storeu_ps(x + 8 * k, _mm256_mul_ps(v[k], r));
}

/* n = 128: each half of 64 in registers, then the last stage (len 64) with the norm, as the halves are stored. */
static void forward_128(float *x, const float *signs, __m256 r) {
  __m256 a[8], b[8];
  forward_regs8(x, 8, signs, a);
  forward_regs8(x + 64, 8, signs + 64, b);
  for (int k = 0; k < 8; k++) {
    _mm256_storeu_ps(x + 8 * k, _mm256_mul_ps(_mm256_add_ps(a[k], b[k]), r));
    _mm256_storeu_ps(x + 64 + 8 * k, _mm256_mul_ps(_mm256_sub_ps(a[k], b[k]), r));
  }
}

void ckv_rot_forward_avx2(float *x, uint32_t n, const float *signs) {
  const __m256 rn = _mm256_set1_ps(ckv_rot_norm(n));
  switch (n) {
    case 8: forward_small(x, 1, signs, rn); return;
    case 16: forward_small(x, 2, signs, rn); return;
    case 32: forward_small(x, 4, signs, rn); return;
    case 64: forward_small(x, 8, signs, rn); return;
    case 128: forward_128(x, signs, rn); return;
    default: break;
  }
  const __m256 lo = _mm256_set1_ps(-CKV_F16_MAX), hi = _mm256_set1_ps(CKV_F16_MAX);
  for (uint32_t i = 0; i < n; i += 8) { /* ckv_rot_finite (NaN -> 0, clamp) times the sign, then stages 1, 2, 4 */
    __m256 v = _mm256_loadu_ps(x + i);
    v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm256_storeu_ps(x + i, fwht8(_mm256_mul_ps(v, _mm256_loadu_ps(signs + i))));
  }
  fwht_from8(x, n);
  const __m256 r = _mm256_set1_ps(ckv_rot_norm(n));
  for (uint32_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), r));
}

/* floor(v * inv) clamped to [-2^(b-1), 2^(b-1) - 1]: ckv_rot_code less 2^(b-1).  Clamping before adding
 * 2^(b-1) gives the same codes: the sum is exact inside the range, and rounds monotonically outside it. */
static inline __m256 q8(__m256 v, __m256 inv, __m256 lo, __m256 hi) {
  return _mm256_min_ps(_mm256_max_ps(_mm256_floor_ps(_mm256_mul_ps(v, inv)), lo), hi);
}

/* ckv_lanes16_total of 16 lanes held as two vectors (lanes 0-7, 8-15): the pairs added lane by lane, then the
 * rules' tree over the 8 sums. */
static float lanes16_total(__m256 lo, __m256 hi) {
  float l[16];
  _mm256_storeu_ps(l, lo);
  _mm256_storeu_ps(l + 8, hi);
  return ckv_lanes16_total(l);
}

/* The squared errors of the two candidate scales in one pass over y (ckv_rot_sq_errors: in units of the scale,
 * t - ckv_rot_mid(t) with t = y * inv), each in the rules' 16 lanes (two vectors: elements i mod 16 < 8 and
 * >= 8), four independent accumulators. */
static void sq_errors2(const float *y, uint32_t n, uint32_t bits, const uint8_t cand[CKV_ROT_CANDIDATES],
                       float err[CKV_ROT_CANDIDATES]) {
  float half = (float)(1u << (bits - 1u));
  const __m256 lo = _mm256_set1_ps(0.5f - half), hi = _mm256_set1_ps(half - 0.5f), h = _mm256_set1_ps(0.5f);
  const __m256 i0 = _mm256_set1_ps(ckv_rot_scale_inv(cand[0])), i1 = _mm256_set1_ps(ckv_rot_scale_inv(cand[1]));
  __m256 e0[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, e1[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (uint32_t i = 0; i < n; i += 8) {
    int k = (i >> 3) & 1;
    __m256 v = _mm256_loadu_ps(y + i);
    __m256 t0 = _mm256_mul_ps(v, i0), t1 = _mm256_mul_ps(v, i1);
    __m256 d0 = _mm256_sub_ps(t0, _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(_mm256_floor_ps(t0), h), lo), hi));
    __m256 d1 = _mm256_sub_ps(t1, _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(_mm256_floor_ps(t1), h), lo), hi));
    e0[k] = _mm256_add_ps(_mm256_mul_ps(d0, d0), e0[k]);
    e1[k] = _mm256_add_ps(_mm256_mul_ps(d1, d1), e1[k]);
  }
  float s0 = ckv_rot_scale_value(cand[0]), s1 = ckv_rot_scale_value(cand[1]);
  err[0] = (s0 * s0) * lanes16_total(e0[0], e0[1]);
  err[1] = (s1 * s1) * lanes16_total(e1[0], e1[1]);
}

/* Sum of squares (in the rules' 16 lanes) and absmax of a head. */
void ckv_rot_stats_avx2(const float *y, uint32_t n, float *ret_ss, float *ret_am) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 ss[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, am = _mm256_setzero_ps();
  for (uint32_t i = 0; i < n; i += 8) {
    int k = (i >> 3) & 1;
    __m256 v = _mm256_loadu_ps(y + i);
    ss[k] = _mm256_add_ps(_mm256_mul_ps(v, v), ss[k]);
    am = _mm256_max_ps(am, _mm256_and_ps(v, absmask));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  *ret_ss = lanes16_total(ss[0], ss[1]);
  *ret_am = _mm_cvtss_f32(m); /* finite inputs: no NaN in any lane */
}

/* Packs the codes of y with inverse scale inv into row (ckv_pack_code's layout, every byte written). */
void ckv_rot_pack_avx2(const float *y, uint32_t n, uint32_t bits, float inv, uint8_t *row) {
  float half = (float)(1u << (bits - 1u));
  const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-half), hi = _mm256_set1_ps(half - 1.0f),
               vh = _mm256_set1_ps(half);
  uint32_t i = 0;
  if (bits == 4)
    for (; i + 32 <= n; i += 32) { /* 32 codes -> 16 bytes */
      __m256i w0 = _mm256_cvttps_epi32(_mm256_add_ps(q8(_mm256_loadu_ps(y + i), vi, lo, hi), vh));
      __m256i w1 = _mm256_cvttps_epi32(_mm256_add_ps(q8(_mm256_loadu_ps(y + i + 8), vi, lo, hi), vh));
      __m256i w2 = _mm256_cvttps_epi32(_mm256_add_ps(q8(_mm256_loadu_ps(y + i + 16), vi, lo, hi), vh));
      __m256i w3 = _mm256_cvttps_epi32(_mm256_add_ps(q8(_mm256_loadu_ps(y + i + 24), vi, lo, hi), vh));
      __m256i p01 = _mm256_packs_epi32(w0, w1), p23 = _mm256_packs_epi32(w2, w3); /* lanes interleaved by 128 */
      __m256i b = _mm256_packus_epi16(p01, p23);
      /* b's dwords in the order 0 2 4 6 1 3 5 7 of the codes' groups of 4: put them back in order */
      b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      /* bytes c0 c1 ... -> c0 | c1 << 4 per 16-bit lane */
      __m256i m = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x1001));
      __m128i r = _mm_packus_epi16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
      _mm_storeu_si128((__m128i *)(row + i / 2), r);
    }
  const __m256i sh = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)bits));
  for (; i < n; i += 8) { /* 8 codes -> `bits` bytes: shifted into place and OR'ed across the lanes */
    __m256i w = _mm256_cvttps_epi32(_mm256_add_ps(q8(_mm256_loadu_ps(y + i), vi, lo, hi), vh));
    w = _mm256_sllv_epi32(w, sh);
    __m128i t = _mm_or_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    t = _mm_or_si128(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_or_si128(t, _mm_shuffle_epi32(t, 0xB1));
    store_bytes(row + (size_t)i * bits / 8u, (uint32_t)_mm_cvtsi128_si32(t), bits);
  }
}

void ckv_rot_quant_head_avx2(const float *y, uint32_t n, uint32_t bits, uint8_t *ret_scale, uint8_t *row) {
  float ss, am;
  ckv_rot_stats_avx2(y, n, &ss, &am);
  uint8_t cand[CKV_ROT_CANDIDATES];
  float err[CKV_ROT_CANDIDATES];
  ckv_rot_candidates(ss, am, n, bits, cand);
  sq_errors2(y, n, bits, cand, err);
  uint8_t s8 = ckv_rot_best(cand, err);
  ckv_rot_pack_avx2(y, n, bits, ckv_rot_scale_inv(s8), row);
  *ret_scale = s8;
}

/* ckv_rot_quant_head_avx2 for the nh heads of a row, 4 at a time and each step for the 4 before the next (as
 * rot_avx512.c does): one head's chain of sums, square root and divisions overlaps the others'. */
void ckv_rot_quant_heads_avx2(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales, uint8_t *rows) {
  enum { GROUP = 4 };
  size_t rb = (size_t)n * bits / 8u;
  for (uint32_t h0 = 0; h0 < nh; h0 += GROUP) {
    uint32_t g = nh - h0 < GROUP ? nh - h0 : GROUP;
    const float *x = y + (size_t)h0 * n;
    float ss[GROUP], am[GROUP], err[GROUP][CKV_ROT_CANDIDATES];
    uint8_t cand[GROUP][CKV_ROT_CANDIDATES];
    for (uint32_t k = 0; k < g; k++) ckv_rot_stats_avx2(x + (size_t)k * n, n, &ss[k], &am[k]);
    for (uint32_t k = 0; k < g; k++) ckv_rot_candidates(ss[k], am[k], n, bits, cand[k]);
    for (uint32_t k = 0; k < g; k++) sq_errors2(x + (size_t)k * n, n, bits, cand[k], err[k]);
    for (uint32_t k = 0; k < g; k++) {
      uint8_t s8 = ckv_rot_best(cand[k], err[k]);
      ckv_rot_pack_avx2(x + (size_t)k * n, n, bits, ckv_rot_scale_inv(s8), rows + (h0 + k) * rb);
      ret_scales[h0 + k] = s8;
    }
  }
}

/* 8 codes of a packed row from element i (i a multiple of 8), as floats: `bits` bytes shifted apart. */
static inline __m256 unpack8(const uint8_t *row, uint32_t i, uint32_t bits, __m256i sh, __m256i mask) {
  uint32_t v = load_bytes(row + (size_t)i * bits / 8u, bits);
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)v), sh), mask));
}

/* The 8 signs of (layer, kv, head) from element i as sign bits (0 or 0x80000000): ckv_rot_sign's hash, 8 at a time. */
static inline __m256i signs8(uint32_t key0, uint32_t i) {
  __m256i h = _mm256_add_epi32(_mm256_set1_epi32((int)(key0 + i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  h = _mm256_xor_si256(h, _mm256_set1_epi32((int)CKV_ROT_SEED));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xc2b2ae35u));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  return _mm256_and_si256(h, _mm256_set1_epi32((int)0x80000000u));
}

/* ckv_kernels_dequantize of a rotated block's row: per head ckv_rot_read_rotated then ckv_rot_inverse, with
 * the codes unpacked and the key mean widened (F16C: exact) in registers.  x * r * sign flips the sign bit of
 * x * r where the sign is -1: the same float. */
void ckv_rot_dequant_row_avx2(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer,
                              uint32_t kv, uint32_t slot, float *dst) {
  uint32_t fmt = h->format, bits = ckv_format_code_bits(fmt), D = g->head_dim, H = g->n_kv_heads;
  size_t rb = ckv_rot_row_bytes(fmt, g);
  const uint8_t *sc = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, h->capacity, layer, kv)) + (size_t)slot * H;
  const uint8_t *codes = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, h->capacity, layer, kv)) + (size_t)slot * H * rb;
  const __m256i sh = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)bits));
  const __m256i mask = _mm256_set1_epi32((int)ckv_qa_levels(bits));
  const __m256 off = _mm256_set1_ps(ckv_rot_offset(bits)), r = _mm256_set1_ps(ckv_rot_norm(D));
  const __m256 lo = _mm256_set1_ps(-CKV_F16_MAX), hi = _mm256_set1_ps(CKV_F16_MAX);
  for (uint32_t hd = 0; hd < H; hd++) {
    float *x = dst + (size_t)hd * D;
    const uint8_t *row = codes + (size_t)hd * rb;
    const __m256 s = _mm256_set1_ps(ckv_rot_scale_value(sc[hd]));
    const uint16_t *m = (const uint16_t *)ckv_cb(blk, ckv_rot_mean_offset(g, h->capacity, layer, hd));
    for (uint32_t i = 0; i < D; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_sub_ps(unpack8(row, i, bits, sh, mask), off), s);
      if (kv == 0) { /* + ckv_rot_finite(mean): NaN -> 0, then clamped */
        __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + i)));
        mv = _mm256_blendv_ps(mv, _mm256_setzero_ps(), _mm256_cmp_ps(mv, mv, _CMP_UNORD_Q));
        v = _mm256_add_ps(v, _mm256_min_ps(_mm256_max_ps(mv, lo), hi));
      }
      _mm256_storeu_ps(x + i, fwht8(v));
    }
    fwht_from8(x, D);
    uint32_t key0 = ((layer * 2u + kv) * CKV_MAX_KV_HEADS + hd) * CKV_MAX_HEAD_DIM;
    for (uint32_t i = 0; i < D; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), r);
      _mm256_storeu_ps(x + i, _mm256_xor_ps(v, _mm256_castsi256_ps(signs8(key0, i))));
    }
  }
}
