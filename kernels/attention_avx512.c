/* attention_avx512.c - the fused attention loops (attention_simd.h) with
 * AVX-512 F/BW/VL, 16 floats a step; compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx2 -mfma -mf16c (kernels/CMakeLists.txt) and used only
 * after dispatch.c chose the AVX-512 path.
 *
 * Decoding 16 codes of b bits (1..4): the 2b bytes that hold them are
 * broadcast to the four 128-bit lanes, a byte shuffle puts the two bytes
 * that hold code i into lane i, a per-lane shift brings the code to the low
 * bits, and a permute through the 16-entry table gives the float (the table
 * repeats every 2^b entries, so the bits above the code need no mask).
 * Near a row's end a load is a masked load of the bytes the row has, so the
 * last row of a block is never read past its end.  ROT4, ROT2 and committed
 * INT4 rows of whole 16-byte groups are read in CKV_AENC_PACKP's permuted
 * order instead: one broadcast load and one per-lane shift per 16 codes, no
 * byte shuffle.  Scores take four rows at a time (16 accumulators, each
 * query step loaded once for four rows, one 16-sum reduction); the value
 * tile keeps 4 query rows by 64 elements in registers across the tokens. */
#include <immintrin.h>
#include <stdbool.h>

#include "kernels/attention_simd.h"

#include "kernels/force_inline.h" /* AI */
/* The tiles' small loops, unrolled so their accumulators stay in registers (-O2 would keep them in memory). */
#define UNROLL _Pragma("GCC unroll 4")

/* Shuffle control and shifts that bring code i of a 16-code group of b bits into lane i:
 * lane i takes bytes i*b/8 and i*b/8 + 1 of the group and shifts by i*b mod 8. */
#define CB(i, b) (int8_t)((i) * (b) / 8), (int8_t)((i) * (b) / 8 + 1), (int8_t)0x80, (int8_t)0x80
#define CROW(b) {CB(0, b), CB(1, b), CB(2, b), CB(3, b), CB(4, b), CB(5, b), CB(6, b), CB(7, b), \
                 CB(8, b), CB(9, b), CB(10, b), CB(11, b), CB(12, b), CB(13, b), CB(14, b), CB(15, b)}
#define SB(i, b) ((i) * (b) % 8)
#define SROW(b) {SB(0, b), SB(1, b), SB(2, b), SB(3, b), SB(4, b), SB(5, b), SB(6, b), SB(7, b), \
                 SB(8, b), SB(9, b), SB(10, b), SB(11, b), SB(12, b), SB(13, b), SB(14, b), SB(15, b)}
static const int8_t unpack_ctl[5][64] __attribute__((aligned(64))) = {{0}, CROW(1), CROW(2), CROW(3), CROW(4)};
static const int32_t unpack_sh[5][16] __attribute__((aligned(64))) = {{0}, SROW(1), SROW(2), SROW(3), SROW(4)};
#undef CB
#undef CROW
#undef SB
#undef SROW

typedef struct unpack16 {
  __m512i ctl, sh;
  __mmask16 bytes; /* the 2b bytes of a whole group */
  uint32_t safe;   /* groups that start below this byte of the row may load 16 bytes whole */
  /* CKV_AENC_PACKP: 16 code bytes broadcast to the four 128-bit lanes, lane i shifted by
   * 8 * (i / 4) + m * b brings code m of byte 4 * (i % 4) + i / 4 to its low bits */
  __m512i psh[4];
  uint32_t gshift, vmask; /* a group of 16 bytes is 2^gshift elements; V - 1 */
} unpack16;

static unpack16 unpack_of(uint32_t bits, uint32_t n) {
  size_t row = ((size_t)n * bits + 7u) / 8u;
  unpack16 u = {_mm512_load_si512(unpack_ctl[bits]), _mm512_load_si512(unpack_sh[bits]),
                (__mmask16)((1u << (2u * bits)) - 1u), row >= 16u ? (uint32_t)(row - 16u) + 1u : 0u,
                {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()},
                bits == 2u ? 6u : 5u, bits == 2u ? 3u : 1u};
  const __m512i base = _mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0);
  for (uint32_t m = 0; m < 4; m++) u.psh[m] = _mm512_add_epi32(base, _mm512_set1_epi32((int)(m * bits)));
  return u;
}

/* Lanes of a 16-element step at element d of an n-element row. */
AI __mmask16 lanes(uint32_t d, uint32_t n) {
  return n - d >= 16u ? (__mmask16)0xffff : (__mmask16)((1u << (n - d)) - 1u);
}

/* The 16 code indices (in the low bits of each lane) of elements [d, d+16) of a packed row. */
AI __m512i codes16(const uint8_t *row, uint32_t d, uint32_t n, uint32_t bits, const unpack16 *u) {
  size_t off = (size_t)d * bits / 8u;
  __m512i x;
  if (off < u->safe) { /* a broadcast load: no shuffle to spread it */
    x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(row + off)));
  } else { /* near the row's end: only its bytes */
    __mmask16 m = u->bytes;
    if (n - d < 16u) m = (__mmask16)((1u << (((n - d) * bits + 7u) / 8u)) - 1u);
    x = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(m, row + off));
  }
  x = _mm512_shuffle_epi8(x, u->ctl);
  return _mm512_srlv_epi32(x, u->sh);
}

/* CKV_AENC_PACKP: the code indices at position d (whole groups of 16 bytes: a broadcast load, one shift). */
AI __m512i pcodes16(const uint8_t *row, uint32_t d, const unpack16 *u) {
  __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(row + ((d >> u->gshift) << 4))));
  return _mm512_srlv_epi32(b, u->psh[(d >> 4) & u->vmask]);
}

/* Elements [d, d+16) of a row (lanes past n: 0 for F16/BF16/I8, finite table values for packed rows). */
AI __m512 dec16(const uint8_t *row, uint32_t d, uint32_t n, const int enc, uint32_t bits, __m512 lut,
                const unpack16 *u) {
  __mmask16 m = lanes(d, n);
  if (m == 0xffff) switch (enc) { /* a whole step: plain loads */
    case CKV_AENC_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2u * d)));
    case CKV_AENC_BF16:
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2u * d))), 16));
    case CKV_AENC_I8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + d))));
    default: break;
    }
  switch (enc) {
  case CKV_AENC_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)(const void *)row + d));
  case CKV_AENC_BF16:
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)(const void *)row + d)), 16));
  case CKV_AENC_I8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, row + d)));
  case CKV_AENC_PACKP: return _mm512_permutexvar_ps(pcodes16(row, d, u), lut);
  default: return _mm512_permutexvar_ps(codes16(row, d, n, bits, u), lut);
  }
}

/* [sum a, sum b, sum c, sum d] */
AI __m128 red4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define HALF8(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
  __m256 ab = _mm256_hadd_ps(HALF8(a), HALF8(b)), cd = _mm256_hadd_ps(HALF8(c), HALF8(d));
#undef HALF8
  __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Two vectors' halves summed: quads 0, 1 of the result from a, 2, 3 from b. */
AI __m512 fold2(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
}
/* Of two folds: quad q holds the four partial sums of the q-th of their four vectors. */
AI __m512 fold4(__m512 u0, __m512 u1) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xdd));
}
/* The 16 sums of v_k = s[k/4][k%4] (token k/4, row k%4) as one vector, lane 4 * row + token.
 * (A macro: an array argument would keep the 16 accumulators in memory.) */
#define RED16(s, ret)                                                                              \
  do {                                                                                             \
    __m512 w0_ = fold4(fold2(s[0][0], s[0][1]), fold2(s[0][2], s[0][3]));                          \
    __m512 w1_ = fold4(fold2(s[1][0], s[1][1]), fold2(s[1][2], s[1][3]));                          \
    __m512 w2_ = fold4(fold2(s[2][0], s[2][1]), fold2(s[2][2], s[2][3]));                          \
    __m512 w3_ = fold4(fold2(s[3][0], s[3][1]), fold2(s[3][2], s[3][3]));                          \
    __m512 a_ = _mm512_add_ps(_mm512_unpacklo_ps(w0_, w1_), _mm512_unpackhi_ps(w0_, w1_));         \
    __m512 b_ = _mm512_add_ps(_mm512_unpacklo_ps(w2_, w3_), _mm512_unpackhi_ps(w2_, w3_));         \
    (ret) = _mm512_add_ps(_mm512_shuffle_ps(a_, b_, 0x44), _mm512_shuffle_ps(a_, b_, 0xee));       \
  } while (0)

/* Prefetching along the rows (ckv_arows.pf): `per` lines a step from *pf while *left lasts. */
AI void pf_step(const uint8_t **pf, uint32_t *left, uint32_t per) {
  for (uint32_t z = 0; z < per && *left; z++, (*left)--, *pf += 64) __builtin_prefetch(*pf, 0, 2);
}
AI uint32_t pf_per(uint32_t lines, size_t steps) { return steps ? (uint32_t)((lines + steps - 1) / steps) : lines; }

/* NR (1..4) query rows against every listed row: four rows at a time (16 accumulators, each query
 * step loaded once for four tokens, one reduction for 16 sums), then the rest one at a time with
 * two partial sums per query row (even and odd steps).  Sums in a fixed order either way. */
AI void score_tile(const float *q, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni, uint32_t n,
                   float *out, size_t ldo, const int NR, const int enc, __m512 lut, const unpack16 *u, const uint8_t *pf,
                   uint32_t pfl) {
  uint32_t full = n & ~15u;
  __mmask16 mt = lanes(full, n);
  size_t i = 0;
  const uint32_t per = pf_per(pfl, (ni + 3) / 4);
  for (; i + 4 <= ni; i += 4) {
    pf_step(&pf, &pfl, per);
    const uint8_t *row[4];
    UNROLL
    for (int j = 0; j < 4; j++) row[j] = k->base + idx[i + j] * k->stride;
    __m512 s[4][4];
    UNROLL
    for (int j = 0; j < 4; j++) {
      UNROLL
      for (int r = 0; r < 4; r++) s[j][r] = _mm512_setzero_ps();
    }
    for (uint32_t d = 0; d < n; d += 16) {
      __m512 x[4];
      UNROLL
      for (int j = 0; j < 4; j++) x[j] = dec16(row[j], d, n, enc, k->bits, lut, u);
      __mmask16 m = d < full ? (__mmask16)0xffff : mt;
      UNROLL
      for (int r = 0; r < NR; r++) {
        __m512 qv = _mm512_maskz_loadu_ps(m, q + r * ldq + d);
        UNROLL
        for (int j = 0; j < 4; j++) s[j][r] = _mm512_fmadd_ps(qv, x[j], s[j][r]);
      }
    }
    float v[16];
    __m512 sum;
    RED16(s, sum);
    _mm512_storeu_ps(v, sum);
    UNROLL
    for (int r = 0; r < NR; r++) {
      UNROLL
      for (int j = 0; j < 4; j++) out[r * ldo + idx[i + j]] = v[4 * r + j];
    }
  }
  pf_step(&pf, &pfl, pfl);
  for (; i < ni; i++) {
    uint32_t t = idx[i];
    const uint8_t *row = k->base + t * k->stride;
    __m512 s[4][2];
    UNROLL
    for (int r = 0; r < 4; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
    uint32_t d = 0;
    for (; d + 32 <= full; d += 32) {
      __m512 x0 = dec16(row, d, n, enc, k->bits, lut, u), x1 = dec16(row, d + 16, n, enc, k->bits, lut, u);
      UNROLL
      for (int r = 0; r < NR; r++) {
        s[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * ldq + d), x0, s[r][0]);
        s[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * ldq + d + 16), x1, s[r][1]);
      }
    }
    if (d < full) {
      __m512 x0 = dec16(row, d, n, enc, k->bits, lut, u);
      UNROLL
      for (int r = 0; r < NR; r++) s[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * ldq + d), x0, s[r][0]);
      d += 16;
    }
    if (mt != 0xffff && d < n) {
      __m512 x1 = dec16(row, d, n, enc, k->bits, lut, u);
      UNROLL
      for (int r = 0; r < NR; r++) s[r][1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, q + r * ldq + d), x1, s[r][1]);
    }
    UNROLL
    for (int r = 0; r < 4; r++) s[r][0] = _mm512_add_ps(s[r][0], s[r][1]);
    float v[4];
    _mm_storeu_ps(v, red4(s[0][0], s[1][0], s[2][0], s[3][0]));
    UNROLL
    for (int r = 0; r < NR; r++) out[r * ldo + t] = v[r];
  }
}

AI void scores_enc(const float *q, size_t nq, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni,
                   uint32_t n, float *out, size_t ldo, const int enc) {
  const int packed = enc == CKV_AENC_PACK || enc == CKV_AENC_PACKP;
  __m512 lut = packed ? _mm512_loadu_ps(k->lut) : _mm512_setzero_ps();
  unpack16 u = unpack_of(packed ? k->bits : 1u, n);
  for (size_t r0 = 0; r0 < nq; r0 += 4) {
    const float *qr = q + r0 * ldq;
    float *o = out + r0 * ldo;
    const uint8_t *pf = r0 ? NULL : k->pf; /* the lines asked for along the first tile's rows */
    uint32_t pfl = r0 || !k->pf ? 0 : k->pf_lines;
    switch (nq - r0 >= 4 ? 4 : nq - r0) {
    case 4: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 4, enc, lut, &u, pf, pfl); break;
    case 3: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 3, enc, lut, &u, pf, pfl); break;
    case 2: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 2, enc, lut, &u, pf, pfl); break;
    default: score_tile(qr, ldq, k, idx, ni, n, o, ldo, 1, enc, lut, &u, pf, pfl); break;
    }
  }
}

AI void scores_n(const float *q, size_t nq, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni,
                 uint32_t n, float *out, size_t ldo) {
  switch (k->enc) {
  case CKV_AENC_F16: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_F16); break;
  case CKV_AENC_BF16: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_BF16); break;
  case CKV_AENC_I8: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_I8); break;
  case CKV_AENC_PACKP: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_PACKP); break;
  default: scores_enc(q, nq, ldq, k, idx, ni, n, out, ldo, CKV_AENC_PACK); break;
  }
}
/* head_dim 128 (the common geometry) gets loops whose masks and row-end tests fold away. */
static void z_scores(const float *q, size_t nq, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni,
                     uint32_t n, float *out, size_t ldo) {
  if (n == 128u) scores_n(q, nq, ldq, k, idx, ni, 128u, out, ldo);
  else scores_n(q, nq, ldq, k, idx, ni, n, out, ldo);
}

/* The table of one token's 32-element group g: code c -> c * scale + zero (two roundings). */
AI __m512 affine_lut(const ckv_arows *v, uint32_t t, uint32_t g, __m512 iota) {
  const float *p = v->par + t * v->ldpar + 2u * g;
  return _mm512_add_ps(_mm512_mul_ps(iota, _mm512_set1_ps(p[0])), _mm512_set1_ps(p[1]));
}

/* NR (1..4) accumulator rows by elements [d0, d0+64): 16 registers across every listed token. */
AI void value_tile(const float *w, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni, uint32_t d0,
                   uint32_t n, float *acc, size_t lda, const int NR, const int enc, __m512 lut, const unpack16 *u,
                   const uint8_t *pf, uint32_t pfl) {
  const uint32_t per = pf_per(pfl, ni);
  __mmask16 m[4];
  UNROLL
  for (int j = 0; j < 4; j++) m[j] = d0 + 16u * j < n ? lanes(d0 + 16u * j, n) : 0;
  const int nv = n - d0 >= 64u ? 4 : (int)((n - d0 + 15u) / 16u);
  __m512 a[4][4];
  UNROLL
  for (int r = 0; r < NR; r++)
    UNROLL
    for (int j = 0; j < 4; j++) a[r][j] = _mm512_maskz_loadu_ps(m[j], acc + r * lda + d0 + 16u * j);
  const __m512 iota = lut; /* AFFINE: code i mod 2^b, so the table repeats as the codes do */
  for (size_t i = 0; i < ni; i++) {
    uint32_t t = idx[i];
    const uint8_t *row = v->base + t * v->stride;
    __m512 x[4];
    pf_step(&pf, &pfl, per);
    if (enc == CKV_AENC_AFFINE || enc == CKV_AENC_AFFINEP) {
      /* d0 % 64 == 0 and n % 32 == 0: steps 0, 1 in group d0/32, 2, 3 in the next (AFFINEP: the
       * permutation keeps each group's elements in the group) */
#define CODES(d) (enc == CKV_AENC_AFFINEP ? pcodes16(row, d, u) : codes16(row, d, n, v->bits, u))
      __m512 l0 = affine_lut(v, t, d0 / 32u, iota);
      x[0] = _mm512_permutexvar_ps(CODES(d0), l0);
      x[1] = nv > 1 ? _mm512_permutexvar_ps(CODES(d0 + 16), l0) : _mm512_setzero_ps();
      if (nv > 2) {
        __m512 l1 = affine_lut(v, t, d0 / 32u + 1u, iota);
        x[2] = _mm512_permutexvar_ps(CODES(d0 + 32), l1);
        x[3] = _mm512_permutexvar_ps(CODES(d0 + 48), l1);
      } else {
        x[2] = x[3] = _mm512_setzero_ps();
      }
#undef CODES
    } else {
      UNROLL
      for (int j = 0; j < 4; j++)
        x[j] = j < nv ? dec16(row, d0 + 16u * j, n, enc, v->bits, lut, u) : _mm512_setzero_ps();
    }
    UNROLL
    for (int r = 0; r < NR; r++) {
      __m512 wr = _mm512_set1_ps(w[r * ldw + t]);
      UNROLL
      for (int j = 0; j < 4; j++) a[r][j] = _mm512_fmadd_ps(wr, x[j], a[r][j]);
    }
  }
  UNROLL
  for (int r = 0; r < NR; r++)
    UNROLL
    for (int j = 0; j < 4; j++) _mm512_mask_storeu_ps(acc + r * lda + d0 + 16u * j, m[j], a[r][j]);
}

AI void values_enc(const float *w, size_t nq, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni,
                   uint32_t n, float *acc, size_t lda, const int enc) {
  const int packed = enc == CKV_AENC_PACK || enc == CKV_AENC_AFFINE || enc == CKV_AENC_PACKP || enc == CKV_AENC_AFFINEP;
  __m512 lut = packed ? _mm512_loadu_ps(v->lut) : _mm512_setzero_ps();
  unpack16 u = unpack_of(packed ? v->bits : 1u, n);
  for (size_t r0 = 0; r0 < nq; r0 += 4) {
    const float *wr = w + r0 * ldw;
    float *ar = acc + r0 * lda;
    for (uint32_t d0 = 0; d0 < n; d0 += 64) {
      const uint8_t *pf = r0 || d0 ? NULL : v->pf; /* the lines asked for along the first tile's rows */
      uint32_t pfl = r0 || d0 || !v->pf ? 0 : v->pf_lines;
      switch (nq - r0 >= 4 ? 4 : nq - r0) {
      case 4: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 4, enc, lut, &u, pf, pfl); break;
      case 3: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 3, enc, lut, &u, pf, pfl); break;
      case 2: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 2, enc, lut, &u, pf, pfl); break;
      default: value_tile(wr, ldw, v, idx, ni, d0, n, ar, lda, 1, enc, lut, &u, pf, pfl); break;
      }
    }
  }
}

AI void values_n(const float *w, size_t nq, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni,
                 uint32_t n, float *acc, size_t lda) {
  switch (v->enc) {
  case CKV_AENC_F16: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_F16); break;
  case CKV_AENC_BF16: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_BF16); break;
  case CKV_AENC_I8: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_I8); break;
  case CKV_AENC_AFFINE: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_AFFINE); break;
  case CKV_AENC_PACKP: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_PACKP); break;
  case CKV_AENC_AFFINEP: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_AFFINEP); break;
  default: values_enc(w, nq, ldw, v, idx, ni, n, acc, lda, CKV_AENC_PACK); break;
  }
}
static void z_values(const float *w, size_t nq, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni,
                     uint32_t n, float *acc, size_t lda) {
  if (n == 128u) values_n(w, nq, ldw, v, idx, ni, 128u, acc, lda);
  else values_n(w, nq, ldw, v, idx, ni, n, acc, lda);
}

static float z_maxf(const float *x, size_t n, float m) {
  __m512 v = _mm512_set1_ps(m);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) v = _mm512_max_ps(_mm512_loadu_ps(x + i), v); /* NaN in x: v kept */
  if (i < n) v = _mm512_mask_max_ps(v, (__mmask16)((1u << (n - i)) - 1u), _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1u), x + i), v);
  return _mm512_reduce_max_ps(v);
}

static uint32_t z_nonzero(const float *E, size_t nq, size_t lde, uint32_t n, uint16_t *out) {
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  uint32_t c = 0;
  for (uint32_t t = 0; t < n; t += 16) {
    __mmask16 l = lanes(t, n), m = 0;
    for (size_t r = 0; r < nq; r++)
      m |= _mm512_mask_cmp_ps_mask(l, _mm512_maskz_loadu_ps(l, E + r * lde + t), _mm512_setzero_ps(), _CMP_NEQ_UQ);
    __m512i i = _mm512_maskz_compress_epi32(m, _mm512_add_epi32(iota, _mm512_set1_epi32((int)t)));
    _mm256_storeu_si256((__m256i *)(void *)(out + c), _mm512_cvtepi32_epi16(i)); /* 16 entries, popcount kept */
    c += (uint32_t)__builtin_popcount(m);
  }
  return c;
}

static void z_scale_add(float *x, const float *s, float b, size_t n) {
  __m512 vb = _mm512_set1_ps(b);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 l = lanes((uint32_t)i, (uint32_t)n);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(l, x + i), _mm512_maskz_loadu_ps(l, s + i));
    _mm512_mask_storeu_ps(x + i, l, _mm512_add_ps(v, vb));
  }
}

static void z_permute32(const float *x, const uint8_t *perm, float *y, size_t n) {
  __m512i i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)perm));
  __m512i i1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(perm + 16)));
  for (size_t g = 0; g < n; g += 32) {
    __m512 lo = _mm512_loadu_ps(x + g), hi = _mm512_loadu_ps(x + g + 16);
    _mm512_storeu_ps(y + g, _mm512_permutex2var_ps(lo, i0, hi));
    _mm512_storeu_ps(y + g + 16, _mm512_permutex2var_ps(lo, i1, hi));
  }
}

const ckv_attnops ckv_attnops_avx512 = {.name = "avx512",
                                        .n_multiple = 1,
                                        .packp = true,
                                        .spread_prefetch = true,
                                        .scores = z_scores,
                                        .values = z_values,
                                        .nonzero = z_nonzero,
                                        .scale_add = z_scale_add,
                                        .permute32 = z_permute32,
                                        .maxf = z_maxf};
