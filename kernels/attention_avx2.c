/* attention_avx2.c - the fused attention loops (attention_simd.h) with AVX2,
 * FMA and F16C, 8 floats a step; compiled with -mavx2 -mfma -mf16c
 * (kernels/CMakeLists.txt) and used only after dispatch.c chose a SIMD path.
 * Rows are multiples of 8 elements (n_multiple; attention.c takes others
 * through its portable loops), so every load is of bytes the row has.
 *
 * Decoding 8 codes of b bits (1..4): their b bytes are loaded into one word,
 * a byte shuffle puts the two bytes that hold code i into 16-bit lane i, the
 * lanes are widened and shifted so the code sits in the low bits, and two
 * 8-entry permutes (one for b < 4) look the float up in the 16-entry table.
 * The score tile is 4 query rows by two keys (8 accumulators, each query
 * step loaded once for both), the value tile 4 rows by 16 elements: 8
 * accumulators, within the 16 registers AVX2 has. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/attention_simd.h"

#include "kernels/force_inline.h" /* AI */
/* The tiles' small loops, unrolled so their accumulators stay in registers (-O2 would keep them in memory). */
#define UNROLL _Pragma("GCC unroll 4")

typedef struct unpack8 {
  __m128i ctl;
  __m256i sh;
} unpack8;

static unpack8 unpack_of(uint32_t bits) {
  int8_t c[16];
  int32_t s[8];
  for (int i = 0; i < 8; i++) {
    int bit = i * (int)bits;
    c[2 * i] = (int8_t)(bit / 8);
    c[2 * i + 1] = (int8_t)(bit / 8 + 1);
    s[i] = bit % 8;
  }
  unpack8 u = {_mm_loadu_si128((const __m128i *)c), _mm256_loadu_si256((const __m256i *)s)};
  return u;
}

/* The 8 code indices (low bits of each lane) of elements [d, d+8) of a packed row. */
AI __m256i codes8(const uint8_t *row, uint32_t d, uint32_t bits, const unpack8 *u) {
  const uint8_t *p = row + (size_t)d * bits / 8u;
  uint32_t w;
  uint16_t h;
  switch (bits) { /* exactly the b bytes of the 8 codes, assembled in a register (a 3-byte copy through
                     memory stalls on the 4-byte load that follows it) */
  case 4: memcpy(&w, p, 4); break;
  case 3: memcpy(&h, p, 2), w = (uint32_t)h | (uint32_t)p[2] << 16; break;
  case 2: memcpy(&h, p, 2), w = h; break;
  default: w = p[0]; break;
  }
  __m128i x = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)w), u->ctl);
  return _mm256_srlv_epi32(_mm256_cvtepu16_epi32(x), u->sh);
}

/* Table lookup of 8 indices in a 16-entry table (lo: entries 0..7, hi: 8..15). */
AI __m256 lookup(__m256i i, __m256 lo, __m256 hi, uint32_t bits) {
  __m256 a = _mm256_permutevar8x32_ps(lo, i);
  if (bits < 4) return a; /* the table repeats every 2^b <= 8 entries */
  __m256 b = _mm256_permutevar8x32_ps(hi, i);
  return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
}

AI __m256 dec8(const uint8_t *row, uint32_t d, const int enc, uint32_t bits, __m256 lo, __m256 hi, const unpack8 *u) {
  switch (enc) {
  case CKV_AENC_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2u * d)));
  case CKV_AENC_BF16:
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 2u * d))), 16));
  case CKV_AENC_I8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(row + d))));
  default: return lookup(codes8(row, d, bits, u), lo, hi, bits);
  }
}

AI __m128 red4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Prefetching along the rows (ckv_arows.pf): `per` lines a step from *pf while *left lasts. */
AI void pf_step(const uint8_t **pf, uint32_t *left, uint32_t per) {
  for (uint32_t z = 0; z < per && *left; z++, (*left)--, *pf += 64) __builtin_prefetch(*pf, 0, 2);
}
AI uint32_t pf_per(uint32_t lines, size_t steps) { return steps ? (uint32_t)((lines + steps - 1) / steps) : lines; }

AI void score_tile(const float *q, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni, uint32_t n,
                   float *out, size_t ldo, const int NR, const int enc, __m256 lo, __m256 hi, const unpack8 *u,
                   const uint8_t *pf, uint32_t pfl) {
  const uint32_t per = pf_per(pfl, (ni + 1) / 2);
  size_t i = 0;
  for (; i + 2 <= ni; i += 2) { /* two rows at a time: each query step loaded once for both (8 accumulators) */
    const uint8_t *r0 = k->base + idx[i] * k->stride, *r1 = k->base + idx[i + 1] * k->stride;
    pf_step(&pf, &pfl, per);
    __m256 s[2][4];
    UNROLL
    for (int r = 0; r < 4; r++) s[0][r] = s[1][r] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < n; d += 8) {
      __m256 x0 = dec8(r0, d, enc, k->bits, lo, hi, u), x1 = dec8(r1, d, enc, k->bits, lo, hi, u);
      UNROLL
      for (int r = 0; r < NR; r++) {
        __m256 qv = _mm256_loadu_ps(q + r * ldq + d);
        s[0][r] = _mm256_fmadd_ps(qv, x0, s[0][r]);
        s[1][r] = _mm256_fmadd_ps(qv, x1, s[1][r]);
      }
    }
    float v[8];
    _mm_storeu_ps(v, red4(s[0][0], s[0][1], s[0][2], s[0][3]));
    _mm_storeu_ps(v + 4, red4(s[1][0], s[1][1], s[1][2], s[1][3]));
    UNROLL
    for (int r = 0; r < NR; r++) {
      out[r * ldo + idx[i]] = v[r];
      out[r * ldo + idx[i + 1]] = v[4 + r];
    }
  }
  pf_step(&pf, &pfl, pfl);
  for (; i < ni; i++) {
    uint32_t t = idx[i];
    const uint8_t *row = k->base + t * k->stride;
    __m256 s[4][2];
    UNROLL
    for (int r = 0; r < 4; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
    uint32_t d = 0;
    for (; d + 16 <= n; d += 16) {
      __m256 x0 = dec8(row, d, enc, k->bits, lo, hi, u), x1 = dec8(row, d + 8, enc, k->bits, lo, hi, u);
      UNROLL
      for (int r = 0; r < NR; r++) {
        s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * ldq + d), x0, s[r][0]);
        s[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * ldq + d + 8), x1, s[r][1]);
      }
    }
    if (d < n) {
      __m256 x0 = dec8(row, d, enc, k->bits, lo, hi, u);
      UNROLL
      for (int r = 0; r < NR; r++) s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * ldq + d), x0, s[r][0]);
    }
    UNROLL
    for (int r = 0; r < 4; r++) s[r][0] = _mm256_add_ps(s[r][0], s[r][1]);
    float v[4];
    _mm_storeu_ps(v, red4(s[0][0], s[1][0], s[2][0], s[3][0]));
    UNROLL
    for (int r = 0; r < NR; r++) out[r * ldo + t] = v[r];
  }
}

AI void scores_enc(const float *q, size_t nq, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni,
                   uint32_t n, float *out, size_t ldo, const int enc) {
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  if (enc == CKV_AENC_PACK) lo = _mm256_loadu_ps(k->lut), hi = _mm256_loadu_ps(k->lut + 8);
  unpack8 u = unpack_of(enc == CKV_AENC_PACK ? k->bits : 1u);
  for (size_t r0 = 0; r0 < nq; r0 += 4) {
    const float *qr = q + r0 * ldq;
    float *o = out + r0 * ldo;
    const uint8_t *pf = r0 ? NULL : k->pf; /* the lines asked for along the first tile's rows */
    uint32_t pfl = r0 || !k->pf ? 0 : k->pf_lines;
    switch (nq - r0 >= 4 ? 4 : nq - r0) {
    case 4: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 4, enc, lo, hi, &u, pf, pfl); break;
    case 3: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 3, enc, lo, hi, &u, pf, pfl); break;
    case 2: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 2, enc, lo, hi, &u, pf, pfl); break;
    default: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 1, enc, lo, hi, &u, pf, pfl); break;
    }
  }
}

static void a_scores(const float *q, size_t nq, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni,
                     uint32_t n, float *out, size_t ldo) {
  switch (k->enc) {
  case CKV_AENC_F16: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_F16); break;
  case CKV_AENC_BF16: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_BF16); break;
  case CKV_AENC_I8: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_I8); break;
  default: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_PACK); break;
  }
}

/* NR (1..4) accumulator rows by elements [d0, d0+16) (d0 + 8 <= n: one or two steps). */
AI void value_tile(const float *w, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni, uint32_t d0,
                   uint32_t n, float *acc, size_t lda, const int NR, const int enc, __m256 lo, __m256 hi,
                   const unpack8 *u, const uint8_t *pf, uint32_t pfl) {
  const int two = d0 + 16u <= n;
  const uint32_t per = pf_per(pfl, ni);
  __m256 a[4][2];
  UNROLL
  for (int r = 0; r < NR; r++) {
    a[r][0] = _mm256_loadu_ps(acc + r * lda + d0);
    a[r][1] = two ? _mm256_loadu_ps(acc + r * lda + d0 + 8) : _mm256_setzero_ps();
  }
  const __m256 i0 = lo, i8 = hi; /* AFFINE: code i mod 2^b, so the table repeats as the codes do */
  for (size_t i = 0; i < ni; i++) {
    uint32_t t = idx[i];
    const uint8_t *row = v->base + t * v->stride;
    __m256 x0, x1 = _mm256_setzero_ps();
    pf_step(&pf, &pfl, per);
    if (enc == CKV_AENC_AFFINE) { /* d0 % 16 == 0, n % 32 == 0: both steps in group d0/32 */
      const float *p = v->par + t * v->ldpar + 2u * (d0 / 32u);
      __m256 s = _mm256_set1_ps(p[0]), z = _mm256_set1_ps(p[1]);
      __m256 l0 = _mm256_add_ps(_mm256_mul_ps(i0, s), z), l1 = _mm256_add_ps(_mm256_mul_ps(i8, s), z);
      x0 = lookup(codes8(row, d0, v->bits, u), l0, l1, v->bits);
      if (two) x1 = lookup(codes8(row, d0 + 8, v->bits, u), l0, l1, v->bits);
    } else {
      x0 = dec8(row, d0, enc, v->bits, lo, hi, u);
      if (two) x1 = dec8(row, d0 + 8, enc, v->bits, lo, hi, u);
    }
    UNROLL
    for (int r = 0; r < NR; r++) {
      __m256 wr = _mm256_broadcast_ss(w + r * ldw + t);
      a[r][0] = _mm256_fmadd_ps(wr, x0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(wr, x1, a[r][1]);
    }
  }
  UNROLL
  for (int r = 0; r < NR; r++) {
    _mm256_storeu_ps(acc + r * lda + d0, a[r][0]);
    if (two) _mm256_storeu_ps(acc + r * lda + d0 + 8, a[r][1]);
  }
}

AI void values_enc(const float *w, size_t nq, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni,
                   uint32_t n, float *acc, size_t lda, const int enc) {
  const int packed = enc == CKV_AENC_PACK || enc == CKV_AENC_AFFINE;
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  if (packed) lo = _mm256_loadu_ps(v->lut), hi = _mm256_loadu_ps(v->lut + 8);
  unpack8 u = unpack_of(packed ? v->bits : 1u);
  for (size_t r0 = 0; r0 < nq; r0 += 4) {
    const float *wr = w + r0 * ldw;
    float *ar = acc + r0 * lda;
    for (uint32_t d0 = 0; d0 < n; d0 += 16) {
      const uint8_t *pf = r0 || d0 ? NULL : v->pf; /* the lines asked for along the first tile's rows */
      uint32_t pfl = r0 || d0 || !v->pf ? 0 : v->pf_lines;
      switch (nq - r0 >= 4 ? 4 : nq - r0) {
      case 4: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 4, enc, lo, hi, &u, pf, pfl); break;
      case 3: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 3, enc, lo, hi, &u, pf, pfl); break;
      case 2: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 2, enc, lo, hi, &u, pf, pfl); break;
      default: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 1, enc, lo, hi, &u, pf, pfl); break;
      }
    }
  }
}

static void a_values(const float *w, size_t nq, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni,
                     uint32_t n, float *acc, size_t lda) {
  switch (v->enc) {
  case CKV_AENC_F16: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_F16); break;
  case CKV_AENC_BF16: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_BF16); break;
  case CKV_AENC_I8: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_I8); break;
  case CKV_AENC_AFFINE: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_AFFINE); break;
  default: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_PACK); break;
  }
}

static float a_maxf(const float *x, size_t n, float m) {
  __m256 v = _mm256_set1_ps(m);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) v = _mm256_max_ps(_mm256_loadu_ps(x + i), v); /* NaN in x: v kept */
  float l[8];
  _mm256_storeu_ps(l, v);
  for (int k = 0; k < 8; k++) m = l[k] > m ? l[k] : m;
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

static uint32_t a_nonzero(const float *E, size_t nq, size_t lde, uint32_t n, uint16_t *out) {
  uint32_t c = 0, t = 0;
  for (; t + 8 <= n; t += 8) {
    unsigned m = 0;
    for (size_t r = 0; r < nq; r++)
      m |= (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(E + r * lde + t), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    while (m) {
      out[c++] = (uint16_t)(t + (uint32_t)__builtin_ctz(m));
      m &= m - 1u;
    }
  }
  for (; t < n; t++) {
    bool any = false;
    for (size_t r = 0; r < nq && !any; r++) any = E[r * lde + t] != 0.0f;
    if (any) out[c++] = (uint16_t)t;
  }
  return c;
}

static void a_scale_add(float *x, const float *s, float b, size_t n) {
  __m256 vb = _mm256_set1_ps(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(s + i)), vb));
  for (; i < n; i++) x[i] = x[i] * s[i] + b;
}

const ckv_attnops ckv_attnops_avx2 = {.name = "avx2",
                                      .n_multiple = 8,
                                      .packp = false,
                                      .spread_prefetch = true,
                                      .scores = a_scores,
                                      .values = a_values,
                                      .nonzero = a_nonzero,
                                      .scale_add = a_scale_add,
                                      .maxf = a_maxf};
