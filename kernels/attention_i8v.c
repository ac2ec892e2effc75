/* attention_i8v.c - the values of INT8 staged blocks (sum over tokens of
 * weight x code, the token's scale already on its weight) with AVX-512 VNNI:
 * vpdpbusd multiplies four unsigned bytes by four signed bytes and adds the
 * four products to an int32 lane, 64 products an instruction where an FMA
 * does 16, and with nothing to decode: the codes are the signed bytes as
 * they are stored.  Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512vnni (kernels/CMakeLists.txt), called only after
 * ckv_avalues_i8_supported().
 *
 * Per query row and group of CKV_I8V_GROUP tokens the weights are rounded to
 * q = round(w / d), d = max w / 255 (unsigned bytes); four tokens' q are one
 * dword, broadcast; four tokens' rows are interleaved byte by byte (two
 * rounds of unpacks within 128-bit lanes), so lane i of a vector holds the
 * four codes of one channel; the group's int32 sums are exact, converted
 * and put back into the natural channel order (a 4 x 4 transpose of 128-bit
 * blocks) once per group, and d * sum added to the FP32 accumulators.
 *
 * The error is the weights' rounding: at most d / 2 per weight, i.e. 1/510
 * of the group's largest weight (BF16 weights: 1/512 of each weight's own);
 * test_kernels_i8v measures what it does to outputs. */
#include <immintrin.h>
#include <math.h>

#include "kernels/attention_i8v.h"

#include "kernels/force_inline.h" /* AI */
/* A group is one vector of 16 weights and four steps of four tokens. */
_Static_assert(CKV_I8V_GROUP == 16u, "the weights of a group are one 16-lane vector");
typedef int32_t i8v_u32 __attribute__((may_alias, aligned(1)));
#define UNROLL _Pragma("GCC unroll 4")

/* NR (1..4) rows of one 64-channel slice of every group: int32 sums per group, then into acc. */
AI void slice(const uint8_t *wq, size_t nt, const float *dq, const int8_t *base, size_t stride, float *acc,
              size_t lda, const int NR, const uint8_t **pf, uint32_t *pfl, uint32_t per) {
  uint32_t ng = (uint32_t)(nt / CKV_I8V_GROUP);
  for (uint32_t g = 0; g < ng; g++) {
    __m512i a[4][4];
    UNROLL
    for (int r = 0; r < NR; r++)
      UNROLL
      for (int k = 0; k < 4; k++) a[r][k] = _mm512_setzero_si512();
    for (uint32_t j = 0; j < CKV_I8V_GROUP; j += 4) {
      size_t t = (size_t)g * CKV_I8V_GROUP + j;
      for (uint32_t z = 0; z < per && *pfl; z++, (*pfl)--, *pf += 64) __builtin_prefetch(*pf, 0, 2);
      const int8_t *p = base + t * stride;
      __m512i r0 = _mm512_loadu_si512(p), r1 = _mm512_loadu_si512(p + stride);
      __m512i r2 = _mm512_loadu_si512(p + 2 * stride), r3 = _mm512_loadu_si512(p + 3 * stride);
      __m512i l01 = _mm512_unpacklo_epi8(r0, r1), h01 = _mm512_unpackhi_epi8(r0, r1);
      __m512i l23 = _mm512_unpacklo_epi8(r2, r3), h23 = _mm512_unpackhi_epi8(r2, r3);
      __m512i x[4]; /* x[k] lane 4b + i: the four tokens' codes of channel 16b + 4k + i */
      x[0] = _mm512_unpacklo_epi16(l01, l23), x[1] = _mm512_unpackhi_epi16(l01, l23);
      x[2] = _mm512_unpacklo_epi16(h01, h23), x[3] = _mm512_unpackhi_epi16(h01, h23);
      UNROLL
      for (int r = 0; r < NR; r++) {
        __m512i wv = _mm512_set1_epi32(*(const i8v_u32 *)(const void *)(wq + (size_t)r * nt + t));
        UNROLL
        for (int k = 0; k < 4; k++) a[r][k] = _mm512_dpbusd_epi32(a[r][k], wv, x[k]);
      }
    }
    UNROLL
    for (int r = 0; r < NR; r++) {
      float d = dq[(size_t)r * ng + g];
      if (d == 0.0f) continue; /* every weight of the group rounds to 0 */
      __m512 f0 = _mm512_cvtepi32_ps(a[r][0]), f1 = _mm512_cvtepi32_ps(a[r][1]);
      __m512 f2 = _mm512_cvtepi32_ps(a[r][2]), f3 = _mm512_cvtepi32_ps(a[r][3]);
      /* block b of natural vector k is block k of f[b] */
      __m512 t0 = _mm512_shuffle_f32x4(f0, f1, 0x44), t1 = _mm512_shuffle_f32x4(f0, f1, 0xee);
      __m512 t2 = _mm512_shuffle_f32x4(f2, f3, 0x44), t3 = _mm512_shuffle_f32x4(f2, f3, 0xee);
      __m512 n[4] = {_mm512_shuffle_f32x4(t0, t2, 0x88), _mm512_shuffle_f32x4(t0, t2, 0xdd),
                     _mm512_shuffle_f32x4(t1, t3, 0x88), _mm512_shuffle_f32x4(t1, t3, 0xdd)};
      __m512 vd = _mm512_set1_ps(d);
      float *o = acc + (size_t)r * lda;
      UNROLL
      for (int k = 0; k < 4; k++) _mm512_storeu_ps(o + 16 * k, _mm512_fmadd_ps(n[k], vd, _mm512_loadu_ps(o + 16 * k)));
    }
  }
}

bool ckv_avalues_i8_staged(const float *w, size_t nq, size_t ldw, const int8_t *base, size_t stride, uint32_t nt,
                           uint32_t n, uint8_t *wq, float *dq, float *acc, size_t lda, const uint8_t *pf,
                           uint32_t pf_lines) {
  if (!nt || nt % CKV_I8V_GROUP || n % 64u || !nq) return false;
  uint32_t ng = nt / CKV_I8V_GROUP;
  const __m512 zero = _mm512_setzero_ps();
  for (size_t r = 0; r < nq; r++) /* the weights, checked first: acc is untouched on refusal */
    for (uint32_t g = 0; g < ng; g++) {
      __m512 v = _mm512_loadu_ps(w + r * ldw + (size_t)g * CKV_I8V_GROUP);
      if (_mm512_cmp_ps_mask(v, zero, _CMP_GE_OQ) != 0xffff) return false; /* negative or NaN */
      float m = _mm512_reduce_max_ps(v);
      if (!(m <= 3.0e38f)) return false; /* not finite */
      __m128i q = _mm_setzero_si128();
      dq[r * ng + g] = m / 255.0f;
      if (m > 0.0f) q = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(255.0f / m))));
      _mm_storeu_si128((__m128i *)(void *)(wq + r * nt + (size_t)g * CKV_I8V_GROUP), q);
    }
  uint32_t steps = (n / 64u) * (uint32_t)((nq + 3u) / 4u) * (nt / 4u), per = (pf_lines + steps - 1u) / steps;
  if (!pf) pf_lines = 0;
  for (uint32_t c = 0; c < n; c += 64)
    for (size_t r0 = 0; r0 < nq; r0 += 4) {
      const uint8_t *wr = wq + r0 * nt;
      const float *dr = dq + r0 * ng;
      float *ar = acc + r0 * lda + c;
      const int8_t *b = base + c;
      switch (nq - r0 >= 4 ? 4 : nq - r0) {
      case 4: slice(wr, nt, dr, b, stride, ar, lda, 4, &pf, &pf_lines, per); break;
      case 3: slice(wr, nt, dr, b, stride, ar, lda, 3, &pf, &pf_lines, per); break;
      case 2: slice(wr, nt, dr, b, stride, ar, lda, 2, &pf, &pf_lines, per); break;
      default: slice(wr, nt, dr, b, stride, ar, lda, 1, &pf, &pf_lines, per); break;
      }
    }
  for (; pf_lines; pf_lines--, pf += 64) __builtin_prefetch(pf, 0, 2);
  return true;
}
