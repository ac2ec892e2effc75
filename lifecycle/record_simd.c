/* record_simd.c - AVX2 and AVX-512 bodies of the round's record pass (see
 * record_simd.h), compiled for their targets by attribute and called only
 * where the CPU has them.  Each lane does what the scalar loop does to one
 * token: the same float multiply and add, the same table entry, the same
 * integer compare; the ring bytes are merged into whole 8-byte history rows
 * (one row per token), so neighbouring rounds' bytes are written back as
 * they were. */
#include "lifecycle/record_simd.h"

#include <float.h>

#include "lifecycle/token_states.h"

#if defined(__x86_64__)
#include <immintrin.h>

_Static_assert(CKV_ATTN_HISTORY == 8, "the vector paths merge one 8-byte history row per token");

__attribute__((target("avx2"))) size_t ckv_record_span_avx2(const ckv_record_span *a, size_t p, size_t end) {
  const __m256 zero = _mm256_setzero_ps(), fmax = _mm256_set1_ps(FLT_MAX), inv = _mm256_set1_ps(a->inv);
  const __m256 floor_ = _mm256_set1_ps(CKV_ATTENDED_FLOOR);
  const __m256i lo = _mm256_set1_epi32((int)CKV_ENC_LO), minus1 = _mm256_set1_epi32(-1);
  const __m256i bins = _mm256_set1_epi32((int)CKV_ENC_BINS), one = _mm256_set1_epi32(1);
  const __m256i low_bits = _mm256_set1_epi32((int)(CKV_ENC_NONE - 1)), off_bits = _mm256_set1_epi32(0xFFFFFF);
  const __m256i recycled = _mm256_set1_epi32(CKV_STATE_RECYCLED), round = _mm256_set1_epi32((int)a->round);
  const __m128i shift = _mm_cvtsi32_si128((int)(a->ring * 8));
  const __m256i byte_mask = _mm256_set1_epi64x((long long)(0xFFull << (a->ring * 8)));
  uint8_t *rows = a->ring_col - a->ring; /* token p's history row: rows + 8 p */
  for (; p + 8 <= end; p += 8) {
    __m256 m = _mm256_loadu_ps(a->attn + (p - a->first));
    __m256i st = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(a->state + p)));
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(m, zero, _CMP_GT_OQ), _mm256_cmp_ps(m, fmax, _CMP_LE_OQ));
    ok = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(st, recycled)), ok);
    __m256 rel = _mm256_mul_ps(_mm256_and_ps(m, ok), inv);
    __m256i u = _mm256_castps_si256(rel);
    __m256i b = _mm256_srai_epi32(_mm256_sub_epi32(u, lo), CKV_ENC_SHIFT);
    b = _mm256_min_epi32(_mm256_max_epi32(b, minus1), bins);
    __m256i e = _mm256_i32gather_epi32((const int *)a->enc, _mm256_add_epi32(b, one), 4);
    /* code = e >> 24, plus one when the low bits reach the bin's boundary
     * (both sides below 2^24: a signed compare is the unsigned one) */
    __m256i below = _mm256_cmpgt_epi32(_mm256_and_si256(e, off_bits), _mm256_and_si256(u, low_bits));
    __m256i code = _mm256_add_epi32(_mm256_add_epi32(_mm256_srli_epi32(e, 24), one), below);
    __m256i c0 = _mm256_sll_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(code)), shift);
    __m256i c1 = _mm256_sll_epi64(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(code, 1)), shift);
    __m256i *row = (__m256i *)(rows + p * 8);
    _mm256_storeu_si256(row, _mm256_blendv_epi8(_mm256_loadu_si256(row), c0, byte_mask));
    _mm256_storeu_si256(row + 1, _mm256_blendv_epi8(_mm256_loadu_si256(row + 1), c1, byte_mask));
    _mm256_storeu_ps(a->cum + p, _mm256_add_ps(_mm256_loadu_ps(a->cum + p), rel));
    __m256i hit = _mm256_castps_si256(_mm256_cmp_ps(rel, floor_, _CMP_GE_OQ));
    __m256i last = _mm256_loadu_si256((const __m256i *)(a->last + p));
    _mm256_storeu_si256((__m256i *)(a->last + p), _mm256_blendv_epi8(last, round, hit));
  }
  return p;
}

__attribute__((target("avx2"))) size_t ckv_record_mass_avx2(const float *attn, const uint8_t *state, size_t first,
                                                          size_t end, double lane[8]) {
  const __m256 zero = _mm256_setzero_ps(), fmax = _mm256_set1_ps(FLT_MAX);
  const __m256i recycled = _mm256_set1_epi32(CKV_STATE_RECYCLED);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  size_t p = first;
  for (; p + 8 <= end; p += 8) {
    __m256 m = _mm256_loadu_ps(attn + (p - first));
    __m256i st = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(state + p)));
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(m, zero, _CMP_GT_OQ), _mm256_cmp_ps(m, fmax, _CMP_LE_OQ));
    ok = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(st, recycled)), ok);
    m = _mm256_and_ps(m, ok);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(m)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(m, 1)));
  }
  _mm256_storeu_pd(lane, lo);
  _mm256_storeu_pd(lane + 4, hi);
  return p;
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) size_t ckv_record_span_avx512(const ckv_record_span *a, size_t p,
                                                                                   size_t end) {
  const __m512 zero = _mm512_setzero_ps(), fmax = _mm512_set1_ps(FLT_MAX), inv = _mm512_set1_ps(a->inv);
  const __m512 floor_ = _mm512_set1_ps(CKV_ATTENDED_FLOOR);
  const __m512i lo = _mm512_set1_epi32((int)CKV_ENC_LO), minus1 = _mm512_set1_epi32(-1);
  const __m512i bins = _mm512_set1_epi32((int)CKV_ENC_BINS), one = _mm512_set1_epi32(1);
  const __m512i low_bits = _mm512_set1_epi32((int)(CKV_ENC_NONE - 1)), off_bits = _mm512_set1_epi32(0xFFFFFF);
  const __m128i recycled = _mm_set1_epi8(CKV_STATE_RECYCLED);
  const __m512i round = _mm512_set1_epi32((int)a->round);
  const __mmask64 byte_mask = 0x0101010101010101ull << a->ring;
  const __m128i shift = _mm_cvtsi32_si128((int)(a->ring * 8));
  uint8_t *rows = a->ring_col - a->ring; /* token p's history row: rows + 8 p */
  for (; p + 16 <= end; p += 16) {
    __m512 m = _mm512_loadu_ps(a->attn + (p - a->first));
    __mmask16 live = ~_mm_cmpeq_epi8_mask(_mm_loadu_si128((const __m128i *)(a->state + p)), recycled);
    __mmask16 ok = live & _mm512_cmp_ps_mask(m, zero, _CMP_GT_OQ) & _mm512_cmp_ps_mask(m, fmax, _CMP_LE_OQ);
    __m512 rel = _mm512_mul_ps(_mm512_maskz_mov_ps(ok, m), inv);
    __m512i u = _mm512_castps_si512(rel);
    __m512i b = _mm512_srai_epi32(_mm512_sub_epi32(u, lo), CKV_ENC_SHIFT);
    b = _mm512_min_epi32(_mm512_max_epi32(b, minus1), bins);
    __m512i e = _mm512_i32gather_epi32(_mm512_add_epi32(b, one), (const int *)a->enc, 4);
    __m512i code = _mm512_srli_epi32(e, 24);
    __mmask16 up = _mm512_cmpge_epu32_mask(_mm512_and_si512(u, low_bits), _mm512_and_si512(e, off_bits));
    code = _mm512_mask_add_epi32(code, up, code, one);
    __m512i c0 = _mm512_sll_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(code)), shift);
    __m512i c1 = _mm512_sll_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(code, 1)), shift);
    uint8_t *row = rows + p * 8;
    _mm512_mask_storeu_epi8(row, byte_mask, c0);
    _mm512_mask_storeu_epi8(row + 64, byte_mask, c1);
    _mm512_storeu_ps(a->cum + p, _mm512_add_ps(_mm512_loadu_ps(a->cum + p), rel));
    _mm512_mask_storeu_epi32(a->last + p, _mm512_cmp_ps_mask(rel, floor_, _CMP_GE_OQ), round);
  }
  return p;
}

#else /* no vector paths on this architecture: tokens.c never calls these */

size_t ckv_record_span_avx2(const ckv_record_span *a, size_t p, size_t end) {
  (void)a, (void)end;
  return p;
}
size_t ckv_record_span_avx512(const ckv_record_span *a, size_t p, size_t end) {
  (void)a, (void)end;
  return p;
}
size_t ckv_record_mass_avx2(const float *attn, const uint8_t *state, size_t first, size_t end, double lane[8]) {
  (void)attn, (void)state, (void)end, (void)lane;
  return first;
}

#endif
