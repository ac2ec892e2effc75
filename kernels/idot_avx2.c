/* idot_avx2.c - the integer dot products (idot.h) with AVX2: maddubs
 * (unsigned x signed bytes, pairs summed to int16 with saturation), widened
 * to int32 by madd with ones after every step.  Compiled with -mavx2
 * (kernels/CMakeLists.txt), called only after dispatch.c checked the CPU.
 *
 * Saturation cannot happen: INT8 rows use ggml's sign trick, |k| (0..128,
 * unsigned) times sign(q, k) (q in [-127, 127], so never negated past
 * 127), a pair at most 2 * 128 * 127 = 32512; 4-bit codes (0..15) times q
 * give pairs of at most 2 * 15 * 127 = 3810, two such sums 7620.  Four
 * queries share each row load; channels left over after whole vectors are
 * summed by the scalar tails, which give the same integers.  2-bit rows:
 * four planes of codes, each against 32 contiguous query bytes (crumb order). */
#include <immintrin.h>

#include "kernels/idot.h"

/* [sum a, sum b, sum c, sum d] of four int32 vectors. */
static inline __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
  __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d), abcd = _mm256_hadd_epi32(ab, cd);
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

/* Query pointers of the group starting at i: a short last group repeats its last query (results dropped). */
static inline void group(const int8_t *p, size_t nq, size_t ldp, size_t i, const int8_t *q[4]) {
  for (size_t r = 0; r < 4; r++) q[r] = p + (i + r < nq ? i + r : nq - 1) * ldp;
}
static inline void store4(__m128i v, size_t nq, size_t i, int32_t *out, size_t ldo, size_t t, const int32_t tail[4]) {
  int32_t s[4];
  _mm_storeu_si128((__m128i *)s, v);
  for (size_t r = 0; r < 4 && i + r < nq; r++) out[(i + r) * ldo + t] = s[r] + tail[r];
}

static inline __m256i dot32_i8(__m256i acc, __m256i ak, __m256i k, const int8_t *q, __m256i ones) {
  __m256i sq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)q), k);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ak, sq), ones));
}

void ckv_idot_avx2_i8(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  const __m256i ones = _mm256_set1_epi16(1);
  size_t full = n & ~(size_t)31;
  for (size_t t = 0; t < nt; t++) {
    const int8_t *k = rows + t * stride;
    for (size_t i = 0; i < nq; i += 4) {
      const int8_t *q[4];
      group(p, nq, ldp, i, q);
      __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
      for (size_t d = 0; d < full; d += 32) {
        __m256i kv = _mm256_loadu_si256((const __m256i *)(k + d)), ak = _mm256_abs_epi8(kv);
        s0 = dot32_i8(s0, ak, kv, q[0] + d, ones);
        s1 = dot32_i8(s1, ak, kv, q[1] + d, ones);
        s2 = dot32_i8(s2, ak, kv, q[2] + d, ones);
        s3 = dot32_i8(s3, ak, kv, q[3] + d, ones);
      }
      int32_t tail[4];
      for (size_t r = 0; r < 4; r++) tail[r] = ckv_idot_i8_tail(q[r], k, full, n);
      store4(hsum4(s0, s1, s2, s3), nq, i, out, ldo, t, tail);
    }
  }
}

/* 64 channels (32 code bytes) of one query: lo nibbles x q[0..32), hi x q[32..64). */
static inline __m256i dot64_u4(__m256i acc, __m256i lo, __m256i hi, const int8_t *q, __m256i ones) {
  __m256i m = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q)),
                               _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 32))));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(m, ones));
}
/* 32 channels (16 code bytes) at the start of a 64-channel block: evens x q[0..16), odds x q[32..48). */
static inline __m256i dot32_u4(__m256i acc, __m256i c, const int8_t *q, __m256i ones) {
  __m256i qv = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(q + 32)), _mm_loadu_si128((const __m128i *)q));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, qv), ones));
}

static void a_u4(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0f);
  size_t full = n & ~(size_t)63, half = n - full >= 32 ? full + 32 : full;
  for (size_t t = 0; t < nt; t++) {
    const uint8_t *k = rows + t * stride;
    for (size_t i = 0; i < nq; i += 4) {
      const int8_t *q[4];
      group(p, nq, ldp, i, q);
      __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
      for (size_t d = 0; d < full; d += 64) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(k + d / 2));
        __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        s0 = dot64_u4(s0, lo, hi, q[0] + d, ones);
        s1 = dot64_u4(s1, lo, hi, q[1] + d, ones);
        s2 = dot64_u4(s2, lo, hi, q[2] + d, ones);
        s3 = dot64_u4(s3, lo, hi, q[3] + d, ones);
      }
      if (half > full) {
        __m128i b = _mm_loadu_si128((const __m128i *)(k + full / 2)), m = _mm256_castsi256_si128(m4);
        __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
        s0 = dot32_u4(s0, c, q[0] + full, ones);
        s1 = dot32_u4(s1, c, q[1] + full, ones);
        s2 = dot32_u4(s2, c, q[2] + full, ones);
        s3 = dot32_u4(s3, c, q[3] + full, ones);
      }
      int32_t tail[4];
      for (size_t r = 0; r < 4; r++) tail[r] = ckv_idot_u4_tail(q[r], k, half, n);
      store4(hsum4(s0, s1, s2, s3), nq, i, out, ldo, t, tail);
    }
  }
}

/* 2-bit rows: 128 channels (32 code bytes) at a time, four planes of codes (bits 2p of each byte)
 * against the crumb order's four contiguous 32-byte runs of the query; pairs of at most
 * 2 * 3 * 127, four planes' at most 3048 in int16, widened once per block. */
static void a_u2(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  const __m256i ones = _mm256_set1_epi16(1), m2 = _mm256_set1_epi8(0x03);
  size_t full = n & ~(size_t)127;
  for (size_t t = 0; t < nt; t++) {
    const uint8_t *k = rows + t * stride;
    for (size_t i = 0; i < nq; i += 4) {
      const int8_t *q[4];
      group(p, nq, ldp, i, q);
      __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      for (size_t d = 0; d < full; d += 128) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(k + d / 4)), c[4];
        for (int pl = 0; pl < 4; pl++) c[pl] = _mm256_and_si256(_mm256_srli_epi16(b, 2 * pl), m2);
        for (int r = 0; r < 4; r++) {
          __m256i m = _mm256_maddubs_epi16(c[0], _mm256_loadu_si256((const __m256i *)(q[r] + d)));
          for (int pl = 1; pl < 4; pl++)
            m = _mm256_add_epi16(m, _mm256_maddubs_epi16(c[pl], _mm256_loadu_si256((const __m256i *)(q[r] + d + 32 * pl))));
          s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(m, ones));
        }
      }
      int32_t tail[4];
      for (size_t r = 0; r < 4; r++) tail[r] = ckv_idot_u2_tail(q[r], k, full, n);
      store4(hsum4(s[0], s[1], s[2], s[3]), nq, i, out, ldo, t, tail);
    }
  }
}

const ckv_idotops ckv_idot_avx2 = {.name = "avx2", .i8 = ckv_idot_avx2_i8, .u4 = a_u4, .u2 = a_u2,
                                   .finish = ckv_idot_scalar_finish, .dot16 = ckv_idot_scalar_dot16};
