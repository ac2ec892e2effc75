/* idot_avx512.c - the integer dot products (idot.h) with AVX-512 VNNI:
 * dpbusd multiplies unsigned by signed bytes and adds each group of four
 * products straight into int32 (no int16 step, nothing to saturate).
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
 * (kernels/CMakeLists.txt), called only after dispatch.c checked the CPU.
 *
 * INT8 rows are signed: they are biased to unsigned (k ^ 0x80 = k + 128) and
 * 128 * sum(q) is taken off each sum, so any byte, -128 included, is exact.
 * 4-bit codes are already unsigned.  Row tails: masked loads for INT8, the
 * scalar tail for 4-bit channels after whole 32-channel steps. */
#include <immintrin.h>

#include "kernels/idot.h"

/* [sum a, sum b, sum c, sum d] of four int32 vectors. */
static inline __m128i hsum4(__m512i a, __m512i b, __m512i c, __m512i d) {
#define HALF(v) _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
  __m256i ab = _mm256_hadd_epi32(HALF(a), HALF(b)), cd = _mm256_hadd_epi32(HALF(c), HALF(d));
#undef HALF
  __m256i abcd = _mm256_hadd_epi32(ab, cd);
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

static inline void group(const int8_t *p, size_t nq, size_t ldp, size_t i, const int8_t *q[4]) {
  for (size_t r = 0; r < 4; r++) q[r] = p + (i + r < nq ? i + r : nq - 1) * ldp;
}
static inline void store4(__m128i v, size_t nq, size_t i, int32_t *out, size_t ldo, size_t t, const int32_t add[4]) {
  int32_t s[4];
  _mm_storeu_si128((__m128i *)s, v);
  for (size_t r = 0; r < 4 && i + r < nq; r++) out[(i + r) * ldo + t] = s[r] + add[r];
}

/* The 16 sums of s[token][row] (4 x 4 int32 vectors) as one vector, lane 4 * row + token: halves,
 * quads, then a transpose within 128-bit lanes (a macro: an array argument would keep the 16
 * accumulators in memory). */
#define PS(v) _mm512_castsi512_ps(v)
#define SI(v) _mm512_castps_si512(v)
static inline __m512i fold2(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xee));
}
static inline __m512i fold4(__m512i u0, __m512i u1) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xdd));
}
#define RED16I(s, ret)                                                                                   \
  do {                                                                                                   \
    __m512i w0_ = fold4(fold2(s[0][0], s[0][1]), fold2(s[0][2], s[0][3]));                               \
    __m512i w1_ = fold4(fold2(s[1][0], s[1][1]), fold2(s[1][2], s[1][3]));                               \
    __m512i w2_ = fold4(fold2(s[2][0], s[2][1]), fold2(s[2][2], s[2][3]));                               \
    __m512i w3_ = fold4(fold2(s[3][0], s[3][1]), fold2(s[3][2], s[3][3]));                               \
    __m512i a_ = _mm512_add_epi32(_mm512_unpacklo_epi32(w0_, w1_), _mm512_unpackhi_epi32(w0_, w1_));     \
    __m512i b_ = _mm512_add_epi32(_mm512_unpacklo_epi32(w2_, w3_), _mm512_unpackhi_epi32(w2_, w3_));     \
    (ret) = _mm512_add_epi32(SI(_mm512_shuffle_ps(PS(a_), PS(b_), 0x44)), SI(_mm512_shuffle_ps(PS(a_), PS(b_), 0xee))); \
  } while (0)
#define UNROLL _Pragma("GCC unroll 4")

/* Stores a 4 x 4 tile: out[(i + r) * ldo + t + j] = sum lane 4r + j + add[j][r], rows i + r < nq. */
static inline void store16(__m512i v, size_t nq, size_t i, int32_t *out, size_t ldo, size_t t, const int32_t add[4][4]) {
  int32_t s[16];
  _mm512_storeu_si512(s, v);
  for (size_t r = 0; r < 4 && i + r < nq; r++)
    for (size_t j = 0; j < 4; j++) out[(i + r) * ldo + t + j] = s[4 * r + j] + add[j][r];
}

static void v_i8(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  const __m512i bias = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
  size_t full = n & ~(size_t)63;
  __mmask64 tm = n > full ? (~(__mmask64)0) >> (64u - (n - full)) : 0;
  for (size_t i = 0; i < nq; i += 4) {
    const int8_t *q[4];
    group(p, nq, ldp, i, q);
    int32_t corr[4]; /* -128 * sum(q) over the n channels: undoes the bias (ones x q, four bytes a lane) */
    for (size_t r = 0; r < 4; r++) {
      __m512i s = _mm512_setzero_si512();
      for (size_t d = 0; d < full + (tm ? 64u : 0u); d += 64)
        s = _mm512_dpbusd_epi32(s, ones, _mm512_maskz_loadu_epi8(d < full ? ~(__mmask64)0 : tm, q[r] + d));
      corr[r] = -128 * _mm512_reduce_add_epi32(s);
    }
    size_t t = 0;
    for (; t + 4 <= nt; t += 4) { /* four rows at a time: each query step loaded once for four */
      __m512i s[4][4];
      UNROLL
      for (int j = 0; j < 4; j++) {
        UNROLL
        for (int r = 0; r < 4; r++) s[j][r] = _mm512_setzero_si512();
      }
      for (size_t d = 0; d < full + (tm ? 64u : 0u); d += 64) {
        __mmask64 m = d < full ? ~(__mmask64)0 : tm; /* lanes past n: codes 0 ^ 0x80 times queries 0 */
        __m512i kv[4];
        UNROLL
        for (int j = 0; j < 4; j++) kv[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, rows + (t + j) * stride + d), bias);
        UNROLL
        for (int r = 0; r < 4; r++) {
          __m512i qv = _mm512_maskz_loadu_epi8(m, q[r] + d);
          UNROLL
          for (int j = 0; j < 4; j++) s[j][r] = _mm512_dpbusd_epi32(s[j][r], kv[j], qv);
        }
      }
      __m512i sum;
      RED16I(s, sum);
      int32_t add[4][4];
      for (int j = 0; j < 4; j++)
        for (int r = 0; r < 4; r++) add[j][r] = corr[r];
      store16(sum, nq, i, out, ldo, t, add);
    }
    for (; t < nt; t++) {
      const int8_t *k = rows + t * stride;
      __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
      for (size_t d = 0; d < full; d += 64) {
        __m512i kv = _mm512_xor_si512(_mm512_loadu_si512(k + d), bias);
        s0 = _mm512_dpbusd_epi32(s0, kv, _mm512_loadu_si512(q[0] + d));
        s1 = _mm512_dpbusd_epi32(s1, kv, _mm512_loadu_si512(q[1] + d));
        s2 = _mm512_dpbusd_epi32(s2, kv, _mm512_loadu_si512(q[2] + d));
        s3 = _mm512_dpbusd_epi32(s3, kv, _mm512_loadu_si512(q[3] + d));
      }
      if (tm) { /* lanes past n: codes 0 ^ 0x80 times queries 0 */
        __m512i kv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(tm, k + full), bias);
        s0 = _mm512_dpbusd_epi32(s0, kv, _mm512_maskz_loadu_epi8(tm, q[0] + full));
        s1 = _mm512_dpbusd_epi32(s1, kv, _mm512_maskz_loadu_epi8(tm, q[1] + full));
        s2 = _mm512_dpbusd_epi32(s2, kv, _mm512_maskz_loadu_epi8(tm, q[2] + full));
        s3 = _mm512_dpbusd_epi32(s3, kv, _mm512_maskz_loadu_epi8(tm, q[3] + full));
      }
      store4(hsum4(s0, s1, s2, s3), nq, i, out, ldo, t, corr);
    }
  }
}

static void v_u4(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  size_t full = n & ~(size_t)63, half = n - full >= 32 ? full + 32 : full;
  for (size_t i = 0; i < nq; i += 4) {
    const int8_t *q[4];
    group(p, nq, ldp, i, q);
    /* the half block's query bytes: evens q[0..16), odds q[32..48) of the block */
    __m512i qh[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (size_t r = 0; r < 4 && half > full; r++)
      qh[r] = _mm512_zextsi256_si512(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(q[r] + full + 32)),
                                                      _mm_loadu_si128((const __m128i *)(q[r] + full))));
    size_t t = 0;
    for (; t + 4 <= nt; t += 4) {
      /* four rows at a time; a block's 32 code bytes broadcast to both halves, low nibbles kept in
       * the low half and high nibbles shifted down in the high one: no cross-lane shuffle */
      const __m512i m4x = _mm512_set1_epi8(0x0f);
      __m512i s[4][4];
      UNROLL
      for (int j = 0; j < 4; j++) {
        UNROLL
        for (int r = 0; r < 4; r++) s[j][r] = _mm512_setzero_si512();
      }
      for (size_t d = 0; d < full; d += 64) {
        __m512i c[4];
        UNROLL
        for (int j = 0; j < 4; j++) {
          __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(rows + (t + j) * stride + d / 2)));
          c[j] = _mm512_and_si512(_mm512_mask_srli_epi16(b, 0xffff0000u, b, 4), m4x);
        }
        UNROLL
        for (int r = 0; r < 4; r++) {
          __m512i qv = _mm512_loadu_si512(q[r] + d);
          UNROLL
          for (int j = 0; j < 4; j++) s[j][r] = _mm512_dpbusd_epi32(s[j][r], c[j], qv);
        }
      }
      if (half > full) {
        __m128i m = _mm256_castsi256_si128(m4);
        UNROLL
        for (int j = 0; j < 4; j++) {
          __m128i b = _mm_loadu_si128((const __m128i *)(rows + (t + j) * stride + full / 2));
          __m512i c = _mm512_zextsi256_si512(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m)));
          UNROLL
          for (int r = 0; r < 4; r++) s[j][r] = _mm512_dpbusd_epi32(s[j][r], c, qh[r]);
        }
      }
      __m512i sum;
      RED16I(s, sum);
      int32_t add[4][4] = {{0}};
      if (half < n) /* channels past the last whole half block */
        for (int j = 0; j < 4; j++)
          for (int r = 0; r < 4; r++) add[j][r] = ckv_idot_u4_tail(q[r], rows + (t + j) * stride, half, n);
      store16(sum, nq, i, out, ldo, t, add);
    }
    for (; t < nt; t++) {
      const uint8_t *k = rows + t * stride;
      __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
      for (size_t d = 0; d < full; d += 64) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(k + d / 2));
        __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        s0 = _mm512_dpbusd_epi32(s0, c, _mm512_loadu_si512(q[0] + d));
        s1 = _mm512_dpbusd_epi32(s1, c, _mm512_loadu_si512(q[1] + d));
        s2 = _mm512_dpbusd_epi32(s2, c, _mm512_loadu_si512(q[2] + d));
        s3 = _mm512_dpbusd_epi32(s3, c, _mm512_loadu_si512(q[3] + d));
      }
      if (half > full) {
        __m128i b = _mm_loadu_si128((const __m128i *)(k + full / 2)), m = _mm256_castsi256_si128(m4);
        __m512i c = _mm512_zextsi256_si512(
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m)));
        s0 = _mm512_dpbusd_epi32(s0, c, qh[0]);
        s1 = _mm512_dpbusd_epi32(s1, c, qh[1]);
        s2 = _mm512_dpbusd_epi32(s2, c, qh[2]);
        s3 = _mm512_dpbusd_epi32(s3, c, qh[3]);
      }
      int32_t tail[4];
      for (size_t r = 0; r < 4; r++) tail[r] = ckv_idot_u4_tail(q[r], k, half, n);
      store4(hsum4(s0, s1, s2, s3), nq, i, out, ldo, t, tail);
    }
  }
}

const ckv_idotops ckv_idot_avx512vnni = {.name = "avx512vnni", .i8 = v_i8, .u4 = v_u4};
