/* idot_avx512.c - the integer dot products (idot.h) with AVX-512 VNNI:
 * dpbusd multiplies unsigned by signed bytes and adds each group of four
 * products straight into int32 (no int16 step, nothing to saturate).
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
 * (kernels/CMakeLists.txt), called only after dispatch.c checked the CPU.
 *
 * Tokens across lanes: 16 rows (tokens) are loaded 64 bytes at a time and
 * transposed as a 16 x 16 matrix of dwords, so lane i of vector j holds
 * dword j of token i; each dpbusd then multiplies four codes of 16 tokens by
 * the same four query bytes (one broadcast dword) and adds into token i's
 * own int32 lane.  No horizontal sum is left at the end: a tile's 16 lanes
 * are 16 tokens' scores for one query row, stored as they are.  The
 * transpose (64 shuffles per 16 tokens and 64 bytes) is paid once for every
 * query row of the group, where a sum per (token, row) would be paid per
 * row.  Per dword: INT8 rows are biased to unsigned (k ^ 0x80 = k + 128,
 * 128 * sum(q) taken off once per row), 4-bit rows give two planes (low
 * and high nibbles: channels 8J + 2k and 8J + 2k + 1 of dword J, which the
 * query's nibble order keeps in four contiguous bytes), 2-bit rows four
 * (crumb order, idot.h).  Channels past the last whole dword (n not a
 * multiple of 4, 8 or 16) are summed by the scalar tails; tokens past nt in
 * the last group read the last row again and are not stored. */
#include <immintrin.h>
#include <string.h>

/* The float epilogue must equal the plain C one bit for bit: no product fused into a sum (GCC in
 * ISO C mode does not contract; clang would within an expression without this). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "kernels/idot.h"

#define UNROLL _Pragma("GCC unroll 16")
#if defined(__SANITIZE_ADDRESS__)
#define AI static inline
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AI static inline
#endif
#endif
#ifndef AI
#define AI static inline __attribute__((always_inline))
#endif

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
  if (bits == 8) return 4u * J;
  if (bits == 4) return 64u * (J / 8u) + 32u * (size_t)p + 4u * (J % 8u);
  return 16u * J + 4u * (size_t)p;
}
AI __m512i qdword(const int8_t *q, size_t off) {
  int32_t v;
  memcpy(&v, q + off, sizeof v);
  return _mm512_set1_epi32(v);
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
  const __m512i bias = _mm512_set1_epi8((char)0x80), m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
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
      if (bits == 8) {
        __m512i u = _mm512_xor_si512(x[j], bias);
        UNROLL
        for (int r = 0; r < NR; r++) acc[r] = _mm512_dpbusd_epi32(acc[r], u, qdword(q[r], qoff(8, J, 0)));
      } else if (bits == 4) {
        __m512i lo = _mm512_and_si512(x[j], m4), hi = _mm512_and_si512(_mm512_srli_epi16(x[j], 4), m4);
        UNROLL
        for (int r = 0; r < NR; r++) {
          acc[r] = _mm512_dpbusd_epi32(acc[r], lo, qdword(q[r], qoff(4, J, 0)));
          acc[r] = _mm512_dpbusd_epi32(acc[r], hi, qdword(q[r], qoff(4, J, 1)));
        }
      } else {
        __m512i c0 = _mm512_and_si512(x[j], m2), c1 = _mm512_and_si512(_mm512_srli_epi16(x[j], 2), m2);
        __m512i c2 = _mm512_and_si512(_mm512_srli_epi16(x[j], 4), m2), c3 = _mm512_and_si512(_mm512_srli_epi16(x[j], 6), m2);
        UNROLL
        for (int r = 0; r < NR; r++) {
          acc[r] = _mm512_dpbusd_epi32(acc[r], c0, qdword(q[r], qoff(2, J, 0)));
          acc[r] = _mm512_dpbusd_epi32(acc[r], c1, qdword(q[r], qoff(2, J, 1)));
          acc[r] = _mm512_dpbusd_epi32(acc[r], c2, qdword(q[r], qoff(2, J, 2)));
          acc[r] = _mm512_dpbusd_epi32(acc[r], c3, qdword(q[r], qoff(2, J, 3)));
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

/* Rows of more than this many queries are done in several calls of `lanes` (add's size). */
#define V_MAX_ROWS 64u

static void v_i8(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  if (nq > V_MAX_ROWS) { /* (never in attention: a KV head's group is a few rows) */
    for (size_t i = 0; i < nq; i += V_MAX_ROWS)
      v_i8(p + i * ldp, nq - i < V_MAX_ROWS ? nq - i : V_MAX_ROWS, ldp, rows, stride, nt, n, out + i * ldo, ldo);
    return;
  }
  size_t nd = n / 4u;
  int32_t add[V_MAX_ROWS + 8];
  for (size_t r = 0; r < nq; r++) { /* -128 * sum(q) over the whole dwords: undoes the bias */
    int32_t s = 0;
    for (size_t j = 0; j < 4u * nd; j++) s += p[r * ldp + j];
    add[r] = -128 * s;
  }
  if (nd) lanes(p, nq, ldp, (const uint8_t *)rows, stride, nt, nd, out, ldo, add, 8);
  for (size_t t = 0; 4u * nd < n && t < nt; t++) /* channels past the whole dwords */
    for (size_t r = 0; r < nq; r++) {
      int32_t s = ckv_idot_i8_tail(p + r * ldp, rows + t * stride, 4u * nd, n);
      out[r * ldo + t] = nd ? out[r * ldo + t] + s : s;
    }
}

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

const ckv_idotops ckv_idot_avx512vnni = {.name = "avx512vnni", .i8 = v_i8, .u4 = v_u4, .u2 = v_u2,
                                         .finish = v_finish, .dot16 = v_dot16};
