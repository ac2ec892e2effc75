/* rot_avx2.c - the rotated formats' two hot steps with AVX2 (compiled with
 * -mavx2 -mfma -mf16c; rot.c calls them only when the CPU path is AVX2 or
 * AVX-512 and head_dim is a multiple of 8): the forward rotation of a head
 * and its quantization.  Each computes what kernels/quant.h's rules compute,
 * operation for operation: the butterflies are the same additions and
 * subtractions, element-wise products are the same products, and the sums
 * run in the 8 lanes the rules prescribe (ckv_lanes8_total), so the bytes
 * equal the scalar path's and CUDA's (test_kernels_rot checks every path). */
#include <immintrin.h>

#include "kernels/quant.h"
#include "kernels/rot.h"

/* One butterfly stage within each 8-float vector: lanes of mask take s - v
 * (a - b), the others v + s (a + b); s is v with the partners swapped.  A
 * macro: the blend's mask must be an immediate, also at -O0. */
#define STAGE_IN(v, s, mask) _mm256_blend_ps(_mm256_add_ps((v), (s)), _mm256_sub_ps((s), (v)), (mask))

/* ckv_fwht for n a multiple of 8. */
static void fwht_avx2(float *x, uint32_t n) {
  for (uint32_t i = 0; i < n; i += 8) { /* stages 1, 2, 4: inside a vector */
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 s = _mm256_permute_ps(v, 0xB1);
    v = STAGE_IN(v, s, 0xAA);
    s = _mm256_permute_ps(v, 0x4E);
    v = STAGE_IN(v, s, 0xCC);
    s = _mm256_permute2f128_ps(v, v, 0x01);
    v = STAGE_IN(v, s, 0xF0);
    _mm256_storeu_ps(x + i, v);
  }
  for (uint32_t len = 8; len < n; len <<= 1)
    for (uint32_t i = 0; i < n; i += len << 1)
      for (uint32_t j = i; j < i + len; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + len, _mm256_sub_ps(a, b));
      }
}

void ckv_rot_forward_avx2(float *x, uint32_t n, const float *signs) {
  const __m256 lo = _mm256_set1_ps(-CKV_F16_MAX), hi = _mm256_set1_ps(CKV_F16_MAX);
  for (uint32_t i = 0; i < n; i += 8) { /* ckv_rot_finite (NaN -> 0, clamp) times the sign */
    __m256 v = _mm256_loadu_ps(x + i);
    v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(v, _mm256_loadu_ps(signs + i)));
  }
  fwht_avx2(x, n);
  const __m256 r = _mm256_set1_ps(ckv_rot_norm(n));
  for (uint32_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), r));
}

/* ckv_rot_code of 8 elements: clamp(floor(v * inv) + half, 0, top). */
static inline __m256 codes8(__m256 v, __m256 inv, __m256 half, __m256 top) {
  __m256 c = _mm256_add_ps(_mm256_floor_ps(_mm256_mul_ps(v, inv)), half);
  return _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), top);
}

static float lanes_total(__m256 acc) {
  float l[8];
  _mm256_storeu_ps(l, acc);
  return ckv_lanes8_total(l);
}

/* Packs codes c[0..n) of `bits` bits low bits first (ckv_pack_code's layout). */
static void pack(const int32_t *c, uint32_t n, uint32_t bits, uint8_t *row) {
  switch (bits) {
    case 4:
      for (uint32_t b = 0; b < n / 2; b++) row[b] = (uint8_t)(c[2 * b] | c[2 * b + 1] << 4);
      return;
    case 2:
      for (uint32_t b = 0; b < n / 4; b++)
        row[b] = (uint8_t)(c[4 * b] | c[4 * b + 1] << 2 | c[4 * b + 2] << 4 | c[4 * b + 3] << 6);
      return;
    case 1:
      for (uint32_t b = 0; b < n / 8; b++) {
        uint32_t v = 0;
        for (uint32_t k = 0; k < 8; k++) v |= (uint32_t)c[8 * b + k] << k;
        row[b] = (uint8_t)v;
      }
      return;
    default:
      for (size_t b = 0; b < (size_t)n * bits / 8u; b++) row[b] = 0;
      for (uint32_t i = 0; i < n; i++) ckv_pack_code(row, i, bits, (uint32_t)c[i]);
  }
}

void ckv_rot_quant_head_avx2(const float *y, uint32_t n, uint32_t bits, uint8_t *ret_scale, uint8_t *row) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 ss = _mm256_setzero_ps(), am = _mm256_setzero_ps();
  for (uint32_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(y + i);
    ss = _mm256_add_ps(_mm256_mul_ps(v, v), ss);
    am = _mm256_max_ps(am, _mm256_and_ps(v, absmask));
  }
  float amx[8], m = 0.0f;
  _mm256_storeu_ps(amx, am);
  for (int j = 0; j < 8; j++) m = amx[j] > m ? amx[j] : m;
  uint8_t cand[CKV_ROT_CANDIDATES];
  float err[CKV_ROT_CANDIDATES];
  ckv_rot_candidates(lanes_total(ss), m, n, bits, cand);
  const __m256 half = _mm256_set1_ps((float)(1u << (bits - 1u))), top = _mm256_set1_ps((float)ckv_qa_levels(bits)),
               off = _mm256_set1_ps(ckv_rot_offset(bits));
  for (int k = 0; k < CKV_ROT_CANDIDATES; k++) {
    if (k && cand[k] == cand[k - 1]) { /* the same code: the same error */
      err[k] = err[k - 1];
      continue;
    }
    const __m256 sc = _mm256_set1_ps(ckv_rot_scale_value(cand[k])), inv = _mm256_set1_ps(ckv_rot_scale_inv(cand[k]));
    __m256 e = _mm256_setzero_ps();
    for (uint32_t i = 0; i < n; i += 8) {
      __m256 v = _mm256_loadu_ps(y + i);
      __m256 d = _mm256_sub_ps(v, _mm256_mul_ps(_mm256_sub_ps(codes8(v, inv, half, top), off), sc));
      e = _mm256_add_ps(_mm256_mul_ps(d, d), e);
    }
    err[k] = lanes_total(e);
  }
  uint8_t s8 = ckv_rot_best(cand, err);
  const __m256 inv = _mm256_set1_ps(ckv_rot_scale_inv(s8));
  int32_t c[CKV_MAX_HEAD_DIM];
  for (uint32_t i = 0; i < n; i += 8)
    _mm256_storeu_si256((__m256i *)(c + i), _mm256_cvttps_epi32(codes8(_mm256_loadu_ps(y + i), inv, half, top)));
  pack(c, n, bits, row);
  *ret_scale = s8;
}
