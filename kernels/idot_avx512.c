/* idot_avx512.c - the integer dot products (idot.h) with AVX-512 VNNI:
 * dpbusd multiplies unsigned by signed bytes and adds each group of four
 * products straight into int32 (no int16 step, nothing to saturate).
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
 * (kernels/CMakeLists.txt), called only after dispatch.c checked the CPU.
 *
 * 4-bit and 2-bit rows, tokens across lanes: 16 rows (tokens) are loaded
 * 64 bytes at a time and transposed as a 16 x 16 matrix of dwords, so lane
 * i of vector j holds dword j of token i; each dpbusd then multiplies four
 * codes of 16 tokens by the same four query bytes (one broadcast dword) and
 * adds into token i's own int32 lane.  No horizontal sum is left at the
 * end: a tile's 16 lanes are 16 tokens' scores for one query row, stored as
 * they are.  The transpose (64 shuffles per 16 tokens and 64 bytes) is paid
 * once for every query row of the group, where a sum per (token, row) would
 * be paid per row.  Per dword: 4-bit rows give two planes (low and high
 * nibbles: channels 8J + 2k and 8J + 2k + 1 of dword J, which the query's
 * nibble order keeps in four contiguous bytes), 2-bit rows four (the crumb
 * order does the same, idot.h).  Channels past the last whole dword (n not a multiple of
 * 8 or 16) are summed by the scalar tails; tokens past nt in the last group
 * read the last row again and are not stored.
 *
 * INT8 rows are summed per (token, row) over 64-channel steps instead (a
 * row is 32 dwords at 128 channels: the two transposes cost more than the
 * sums they save, measured), biased to unsigned (k ^ 0x80 = k + 128) with
 * 128 * sum(q) taken off each sum, so any byte, -128 included, is exact. */
#include <immintrin.h>
#include <string.h>

/* The float epilogue must equal the plain C one bit for bit: no product fused into a sum (GCC in
 * ISO C mode does not contract; clang would within an expression without this). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "kernels/idot.h"

#define UNROLL _Pragma("GCC unroll 16")
#include "kernels/force_inline.h" /* AI */

/* In place: r[j] lane i = dword j of r[i] (a 16 x 16 dword transpose: unpacks within 128-bit
 * lanes, then two rounds of 128-bit lane shuffles). */
AI void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  UNROLL
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  UNROLL
  for (int g = 0; g < 4; g++) { /* u[4g + k] lane L: dword 4L + k of rows 4g..4g+3 */
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  UNROLL
  for (int k = 0; k < 4; k++) {
    __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xee);
    __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xee);
    r[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    r[8 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

/* The query's four bytes that meet plane p of dword J of a row of `bits`-bit codes (idot.h's orders). */
AI size_t qoff(const int bits, size_t J, int p) {
  if (bits == 4) return 64u * (J / 8u) + 32u * (size_t)p + 4u * (J % 8u);
  return 128u * (J / 8u) + 32u * (size_t)p + 4u * (J % 8u);
}
/* acc + the dpbusd of codes u by the query dword at q + off broadcast to every lane: dpbusd with an
 * embedded broadcast (one instruction, the dword read from L1; GCC will not fold the set1 of a
 * separate broadcast into it, and 128 separate broadcasts a tile cost a fifth of the loop). */
typedef int32_t ckv_u32a __attribute__((may_alias, aligned(1)));
AI __m512i dp_q(__m512i acc, __m512i u, const int8_t *q, size_t off) {
#if defined(__GNUC__) && !defined(CKV_NO_INLINE_ASM)
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const ckv_u32a *)(const void *)(q + off)));
  return acc;
#else
  return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(*(const ckv_u32a *)(const void *)(q + off)));
#endif
}

/* NR query rows (rows past nq repeat the last; not stored) against tokens [t0, t0 + 16) of nd whole
 * dwords each: out[r * ldo + t] = the integer sum, plus add[r]. */
AI void tile(const int8_t *p, size_t nq, size_t ldp, size_t i0, const uint8_t *rows, size_t stride, size_t nt,
             size_t t0, size_t nd, int32_t *out, size_t ldo, const int32_t *add, const int NR, const int bits) {
  const int8_t *q[8];
  UNROLL
  for (int r = 0; r < NR; r++) q[r] = p + (i0 + (size_t)r < nq ? i0 + (size_t)r : nq - 1) * ldp;
  const uint8_t *row[16];
  UNROLL
  for (int i = 0; i < 16; i++) row[i] = rows + (t0 + (size_t)i < nt ? t0 + (size_t)i : nt - 1) * stride;
  __m512i acc[8];
  UNROLL
  for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_si512();
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
  for (size_t c = 0; c < nd; c += 16) {
    size_t left = nd - c;
    __mmask16 m = left >= 16u ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512i x[16];
    UNROLL
    for (int i = 0; i < 16; i++) x[i] = _mm512_maskz_loadu_epi32(m, row[i] + 4u * c);
    transpose16(x);
    UNROLL
    for (int j = 0; j < 16; j++) {
      if ((size_t)j >= left) break;
      size_t J = c + (size_t)j;
      if (bits == 4) {
        __m512i lo = _mm512_and_si512(x[j], m4), hi = _mm512_and_si512(_mm512_srli_epi16(x[j], 4), m4);
        UNROLL
        for (int r = 0; r < NR; r++) {
          acc[r] = dp_q(acc[r], lo, q[r], qoff(4, J, 0));
          acc[r] = dp_q(acc[r], hi, q[r], qoff(4, J, 1));
        }
      } else {
        __m512i c0 = _mm512_and_si512(x[j], m2), c1 = _mm512_and_si512(_mm512_srli_epi16(x[j], 2), m2);
        __m512i c2 = _mm512_and_si512(_mm512_srli_epi16(x[j], 4), m2), c3 = _mm512_and_si512(_mm512_srli_epi16(x[j], 6), m2);
        UNROLL
        for (int r = 0; r < NR; r++) {
          acc[r] = dp_q(acc[r], c0, q[r], qoff(2, J, 0));
          acc[r] = dp_q(acc[r], c1, q[r], qoff(2, J, 1));
          acc[r] = dp_q(acc[r], c2, q[r], qoff(2, J, 2));
          acc[r] = dp_q(acc[r], c3, q[r], qoff(2, J, 3));
        }
      }
    }
  }
  __mmask16 st = nt - t0 >= 16u ? (__mmask16)0xffff : (__mmask16)((1u << (nt - t0)) - 1u);
  UNROLL
  for (int r = 0; r < NR; r++)
    if (i0 + (size_t)r < nq)
      _mm512_mask_storeu_epi32(out + (i0 + (size_t)r) * ldo + t0, st, _mm512_add_epi32(acc[r], _mm512_set1_epi32(add[r])));
}

/* Every row group (8 rows, then 4) and token group of one bit width; add: [nq] per row. */
AI void lanes(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t nd,
              int32_t *out, size_t ldo, const int32_t *add, const int bits) {
  for (size_t i0 = 0; i0 < nq;) {
    size_t nr = nq - i0 > 4u ? 8u : 4u;
    for (size_t t0 = 0; t0 < nt; t0 += 16) {
      if (nr == 8)
        tile(p, nq, ldp, i0, rows, stride, nt, t0, nd, out, ldo, add + i0, 8, bits);
      else
        tile(p, nq, ldp, i0, rows, stride, nt, t0, nd, out, ldo, add + i0, 4, bits);
    }
    i0 += nr;
  }
}


/* INT8 rows sum each (token, row) over its own 64-channel steps instead (measured: at 128 channels,
 * 32 dwords a token, two transposes cost more than the per-(token, row) sums they save). */
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

/* Stores a 4 x 4 tile: out[(i + r) * ldo + t + j] = sum lane 4r + j + add[j][r], rows i + r < nq. */
static inline void store16(__m512i v, size_t nq, size_t i, int32_t *out, size_t ldo, size_t t, const int32_t add[4][4]) {
  int32_t s[16];
  _mm512_storeu_si512(s, v);
  for (size_t r = 0; r < 4 && i + r < nq; r++)
    for (size_t j = 0; j < 4; j++) out[(i + r) * ldo + t + j] = s[4 * r + j] + add[j][r];
}

static void v_i8_rows(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
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

/* Rows of more than this many queries are done in several calls of `lanes` (add's size). */
#define V_MAX_ROWS 64u

/* 4-bit and 2-bit rows: whole dwords through the lanes, the rest by the scalar tail. */
static void v_un(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo, const int bits) {
  if (nq > V_MAX_ROWS) {
    for (size_t i = 0; i < nq; i += V_MAX_ROWS)
      v_un(p + i * ldp, nq - i < V_MAX_ROWS ? nq - i : V_MAX_ROWS, ldp, rows, stride, nt, n, out + i * ldo, ldo, bits);
    return;
  }
  size_t per = 32u / (size_t)bits, nd = n / per; /* channels per dword, whole dwords */
  int32_t add[V_MAX_ROWS + 8] = {0};
  if (nd) {
    if (bits == 4)
      lanes(p, nq, ldp, rows, stride, nt, nd, out, ldo, add, 4);
    else
      lanes(p, nq, ldp, rows, stride, nt, nd, out, ldo, add, 2);
  }
  for (size_t t = 0; per * nd < n && t < nt; t++)
    for (size_t r = 0; r < nq; r++) {
      const int8_t *q = p + r * ldp;
      const uint8_t *k = rows + t * stride;
      int32_t s = bits == 4 ? ckv_idot_u4_tail(q, k, per * nd, n) : ckv_idot_u2_tail(q, k, per * nd, n);
      out[r * ldo + t] = nd ? out[r * ldo + t] + s : s;
    }
}

static void v_u4(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  v_un(p, nq, ldp, rows, stride, nt, n, out, ldo, 4);
}
static void v_u2(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  v_un(p, nq, ldp, rows, stride, nt, n, out, ldo, 2);
}

static void v_finish(const int32_t *acc, int32_t m, int32_t ps, float k, const float *st, float b, bool add_b, float *o,
                     size_t n) {
  const __m512i vm = _mm512_set1_epi32(m), vps = _mm512_set1_epi32(ps);
  const __m512 vk = _mm512_set1_ps(k), vb = _mm512_set1_ps(b);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 l = n - i >= 16u ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
    __m512i a = _mm512_sub_epi32(_mm512_mullo_epi32(_mm512_maskz_loadu_epi32(l, acc + i), vm), vps);
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), vk);
    v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(l, st + i));
    if (add_b) v = _mm512_add_ps(v, vb);
    _mm512_mask_storeu_ps(o + i, l, v);
  }
}

static float v_dot16(const float *x, const float *y, size_t n) {
  __m512 v = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  float acc[16];
  _mm512_storeu_ps(acc, v);
  for (size_t l = 0; i < n; i++, l++) acc[l] += x[i] * y[i];
  __m512 a = _mm512_loadu_ps(acc); /* the tree: halves, quarters, pairs, then lanes 0 and 1 */
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}

const ckv_idotops ckv_idot_avx512vnni = {.name = "avx512vnni", .i8 = v_i8_rows, .u4 = v_u4, .u2 = v_u2,
                                         .finish = v_finish, .dot16 = v_dot16};
