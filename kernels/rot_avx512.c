/* rot_avx512.c - the rotated formats' quantization of a head with AVX-512
 * F (compiled with -mavx512f -mavx2 -mfma -mf16c; rot.c calls it only on
 * the AVX-512 path, head_dim a multiple of 8).  The rules sum every squared
 * error in 8 lanes in index order (ckv_lanes8_total), so 16 lanes cannot
 * take 16 elements of one candidate scale without changing the sums; they
 * take 8 elements of two candidates instead (one in each half), which halves
 * the instructions of the search, the costliest step.  The sum of squares,
 * the candidates and the packing are rot_avx2.c's; the bytes are the scalar
 * path's (test_kernels_rot compares them). */
#include <immintrin.h>

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
