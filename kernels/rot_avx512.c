/* rot_avx512.c - the rotated formats' quantization of a head, and a row
 * read back, with AVX-512 F (compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx2 -mfma -mf16c; rot.c and dequant.c call them only on the AVX-512
 * path, head_dim a multiple of 8, of 16 for the reading).  The rules sum every squared
 * error in 8 lanes in index order (ckv_lanes8_total), so 16 lanes cannot
 * take 16 elements of one candidate scale without changing the sums; they
 * take 8 elements of two candidates instead (one in each half), which halves
 * the instructions of the search, the costliest step.  The sum of squares,
 * the candidates and the packing are rot_avx2.c's; the bytes are the scalar
 * path's (test_kernels_rot compares them, and the floats read back). */
#include <immintrin.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/rot.h"

static float lanes_total(__m256 acc) {
  float l[8];
  _mm256_storeu_ps(l, acc);
  return ckv_lanes8_total(l);
}

/* NP pairs of scales (lanes 0-7 one, 8-15 the other) over y; as rot_avx2.c's sq_errors_n, two at a time. */
static inline __attribute__((always_inline)) void sq_errors_pairs(const float *y, uint32_t n, int NP, const float *sc,
                                                                   const float *inv, float half, float *err) {
  __m512 e[3], vs[3], vi[3];
  const __m512 h = _mm512_set1_ps(0.5f), lo = _mm512_set1_ps(-half), hi = _mm512_set1_ps(half - 1.0f);
  for (int p = 0; p < NP; p++) {
    e[p] = _mm512_setzero_ps();
    vs[p] = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(sc[2 * p]), _mm512_set1_ps(sc[2 * p + 1]));
    vi[p] = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(inv[2 * p]), _mm512_set1_ps(inv[2 * p + 1]));
  }
  for (uint32_t i = 0; i < n; i += 8) {
    __m512 v = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(y + i))));
    for (int p = 0; p < NP; p++) {
      __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(v, vi[p]), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
      __m512 d = _mm512_sub_ps(v, _mm512_mul_ps(_mm512_add_ps(q, h), vs[p]));
      e[p] = _mm512_add_ps(_mm512_mul_ps(d, d), e[p]);
    }
  }
  for (int p = 0; p < NP; p++) {
    err[2 * p] = lanes_total(_mm512_castps512_ps256(e[p]));
    err[2 * p + 1] = lanes_total(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e[p]), 1)));
  }
}

void ckv_rot_quant_head_avx512(const float *y, uint32_t n, uint32_t bits, uint8_t *ret_scale, uint8_t *row) {
  float ss, am;
  ckv_rot_stats_avx2(y, n, &ss, &am);
  uint8_t cand[CKV_ROT_CANDIDATES], u[CKV_ROT_CANDIDATES];
  int at[CKV_ROT_CANDIDATES], nu = 0;
  ckv_rot_candidates(ss, am, n, bits, cand);
  for (int k = 0; k < CKV_ROT_CANDIDATES; k++) { /* each code once: a repeated code has the same error */
    int j = 0;
    while (j < nu && u[j] != cand[k]) j++;
    if (j == nu) u[nu++] = cand[k];
    at[k] = j;
  }
  float sc[CKV_ROT_CANDIDATES], inv[CKV_ROT_CANDIDATES], ue[CKV_ROT_CANDIDATES], err[CKV_ROT_CANDIDATES];
  for (int k = 0; k < CKV_ROT_CANDIDATES; k++) { /* an odd count: the last pair's second half repeats a code */
    uint8_t c = u[k < nu ? k : nu - 1];
    sc[k] = ckv_rot_scale_value(c);
    inv[k] = ckv_rot_scale_inv(c);
  }
  float half = (float)(1u << (bits - 1u));
  if (nu <= 2)
    sq_errors_pairs(y, n, 1, sc, inv, half, ue);
  else if (nu <= 4)
    sq_errors_pairs(y, n, 2, sc, inv, half, ue);
  else
    sq_errors_pairs(y, n, 3, sc, inv, half, ue);
  for (int k = 0; k < CKV_ROT_CANDIDATES; k++) err[k] = ue[at[k]];
  uint8_t s8 = ckv_rot_best(cand, err);
  ckv_rot_pack_avx2(y, n, bits, ckv_rot_scale_inv(s8), row);
  *ret_scale = s8;
}

/* ---- a rotated row read back (ckv_kernels_dequantize), 16 lanes: rot_avx2.c's ckv_rot_dequant_row_avx2
 * with twice the width (head_dim a multiple of 16); the same operations in the same order per element. */

/* One butterfly stage inside each 16-float vector: lanes of mask take s - v (a - b), the others v + s. */
#define STAGE16(v, s, mask) _mm512_mask_blend_ps((mask), _mm512_add_ps((v), (s)), _mm512_sub_ps((s), (v)))

static inline __m512 fwht16(__m512 v) { /* stages 1, 2, 4, 8: inside a vector */
  v = STAGE16(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);
  v = STAGE16(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);
  v = STAGE16(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)), 0xF0F0);
  return STAGE16(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)), 0xFF00);
}

/* The stages of ckv_fwht from len 16 on (n a multiple of 16), two per pass where they pair up. */
static void fwht_from16(float *x, uint32_t n) {
  uint32_t len = 16;
  for (; len * 4 <= n; len <<= 2)
    for (uint32_t i = 0; i < n; i += len << 2)
      for (uint32_t j = i; j < i + len; j += 16) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + len);
        __m512 c = _mm512_loadu_ps(x + j + 2 * len), d = _mm512_loadu_ps(x + j + 3 * len);
        __m512 ab = _mm512_add_ps(a, b), as = _mm512_sub_ps(a, b), cd = _mm512_add_ps(c, d), cs = _mm512_sub_ps(c, d);
        _mm512_storeu_ps(x + j, _mm512_add_ps(ab, cd));
        _mm512_storeu_ps(x + j + len, _mm512_add_ps(as, cs));
        _mm512_storeu_ps(x + j + 2 * len, _mm512_sub_ps(ab, cd));
        _mm512_storeu_ps(x + j + 3 * len, _mm512_sub_ps(as, cs));
      }
  for (; len < n; len <<= 1)
    for (uint32_t i = 0; i < n; i += len << 1)
      for (uint32_t j = i; j < i + len; j += 16) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + len);
        _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
        _mm512_storeu_ps(x + j + len, _mm512_sub_ps(a, b));
      }
}

/* The 16 sign bits of (layer, kv, head) from element i: ckv_rot_sign's hash, 16 at a time. */
static inline __m512i signs16(uint32_t key0, uint32_t i) {
  __m512i h = _mm512_add_epi32(_mm512_set1_epi32((int)(key0 + i)),
                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  h = _mm512_xor_si512(h, _mm512_set1_epi32((int)CKV_ROT_SEED));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85ebca6bu));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xc2b2ae35u));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  return _mm512_and_si512(h, _mm512_set1_epi32((int)0x80000000u));
}

/* 16 codes of a packed row from element i (a multiple of 16; `bits` <= 4, so 8 codes fill at most 32 bits):
 * each half of the vector takes one 32-bit group, shifted apart. */
static inline __m512 unpack16(const uint8_t *row, uint32_t i, uint32_t bits, __m512i sh, __m512i mask) {
  const uint8_t *p = row + (size_t)i * bits / 8u;
  uint64_t u = 0; /* 2 * bits bytes: fixed-size copies, plain loads (a variable size would be a call) */
  uint16_t a;
  uint32_t b;
  switch (bits) {
    case 1: memcpy(&a, p, 2); u = a; break;
    case 2: memcpy(&b, p, 4); u = b; break;
    case 3: memcpy(&b, p, 4); memcpy(&a, p + 4, 2); u = b | (uint64_t)a << 32; break;
    default: memcpy(&u, p, 8); break;
  }
  __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)(uint32_t)u)),
                                 _mm256_set1_epi32((int)(uint32_t)(u >> (8u * bits))), 1);
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, sh), mask));
}

void ckv_rot_dequant_row_avx512(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer,
                                uint32_t kv, uint32_t slot, float *dst) {
  uint32_t fmt = h->format, bits = ckv_format_code_bits(fmt), D = g->head_dim, H = g->n_kv_heads;
  size_t rb = ckv_rot_row_bytes(fmt, g);
  const uint8_t *sc = (const uint8_t *)blk + ckv_rot_scales_offset(fmt, g, h->capacity, layer, kv) + (size_t)slot * H;
  const uint8_t *codes = (const uint8_t *)blk + ckv_rot_codes_offset(fmt, g, h->capacity, layer, kv) + (size_t)slot * H * rb;
  const __m512i sh = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm512_set1_epi32((int)bits));
  const __m512i mask = _mm512_set1_epi32((int)ckv_qa_levels(bits));
  const __m512 off = _mm512_set1_ps(ckv_rot_offset(bits)), r = _mm512_set1_ps(ckv_rot_norm(D));
  const __m512 lo = _mm512_set1_ps(-CKV_F16_MAX), hi = _mm512_set1_ps(CKV_F16_MAX);
  for (uint32_t hd = 0; hd < H; hd++) {
    float *x = dst + (size_t)hd * D;
    const uint8_t *row = codes + (size_t)hd * rb;
    const __m512 s = _mm512_set1_ps(ckv_rot_scale_value(sc[hd]));
    const uint16_t *m = (const uint16_t *)((const uint8_t *)blk + ckv_rot_mean_offset(g, h->capacity, layer, hd));
    for (uint32_t i = 0; i < D; i += 16) {
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(unpack16(row, i, bits, sh, mask), off), s);
      if (kv == 0) { /* + ckv_rot_finite(mean): NaN -> 0, then clamped (F16C widening: exact) */
        __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m + i)));
        mv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mv, mv, _CMP_ORD_Q), mv);
        v = _mm512_add_ps(v, _mm512_min_ps(_mm512_max_ps(mv, lo), hi));
      }
      _mm512_storeu_ps(x + i, fwht16(v));
    }
    fwht_from16(x, D);
    uint32_t key0 = ((layer * 2u + kv) * CKV_MAX_KV_HEADS + hd) * CKV_MAX_HEAD_DIM;
    for (uint32_t i = 0; i < D; i += 16) { /* x * r, then the sign bit flipped where the sign is -1 */
      __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), r);
      _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), signs16(key0, i))));
    }
  }
}

/* ckv_rot_forward_with 16 lanes at a time (n a multiple of 16): finite (NaN -> 0, clamped) times the sign,
 * the transform, the norm; rot_avx2.c's ckv_rot_forward_avx2 at twice the width. */
void ckv_rot_forward_avx512(float *x, uint32_t n, const float *signs) {
  const __m512 lo = _mm512_set1_ps(-CKV_F16_MAX), hi = _mm512_set1_ps(CKV_F16_MAX);
  for (uint32_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm512_storeu_ps(x + i, fwht16(_mm512_mul_ps(v, _mm512_loadu_ps(signs + i))));
  }
  fwht_from16(x, n);
  const __m512 r = _mm512_set1_ps(ckv_rot_norm(n));
  for (uint32_t i = 0; i < n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), r));
}
