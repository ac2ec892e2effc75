/* attention_bf16.c - the values of ROT4 and ROT2 blocks (sum over tokens of weight x
 * decoded code) with AVX-512 BF16 dot products: vdpbf16ps multiplies pairs
 * of BF16 numbers and adds both products to an FP32 lane, 32 products an
 * instruction where an FMA does 16.  Compiled with -mavx512f -mavx512bw
 * -mavx512bf16 (kernels/CMakeLists.txt), called only after
 * ckv_avalues_bf16_supported().
 *
 * Tokens go in pairs: the pair's weights become one dword of two BF16 halves
 * (rounded to nearest even from the FP32 weights, which already carry the
 * token's scale), broadcast by the instruction itself; the pair's rows are
 * interleaved byte by byte (unpacks within 128-bit lanes), each byte pair
 * widened to two 16-bit code indices and looked up (vpermw) in the table of
 * the code values as BF16 (code - 7.5 or code - 1.5, exact), so lane i of a
 * vector holds channel i's value for both tokens.  The accumulators are in
 * the order those unpacks give (ckv_avalues_bf16_channel), put back once per
 * call by attention.c.
 *
 * The error is the weights' rounding to BF16 (8 significant bits: 2^-9
 * relative at most); test_kernels_bf16 measures what it does to outputs. */
#include <immintrin.h>

#include "kernels/attention_bf16.h"

#include "kernels/force_inline.h" /* AI */
#define UNROLL _Pragma("GCC unroll 4")

/* acc + the pair products of x and the dword at p broadcast to every lane (vdpbf16ps with an embedded
 * broadcast: GCC does not fold a separate one into it). */
AI __m512 dp_w(__m512 acc, __m512i x, const uint32_t *p) {
#if defined(__GNUC__) && !defined(CKV_NO_INLINE_ASM)
  __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*p));
  return acc;
#else
  return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)_mm512_set1_epi32((int)*p));
#endif
}

/* The four vectors of pass `pass` (of 2) over one 128-channel chunk of a pair's rows A, B (64 bytes of
 * 4-bit codes, or 32 of 2-bit codes in the low halves): lane i of x[g] holds both tokens' value of
 * one channel as BF16 (ckv_avalues_bf16_channel). */
AI void decode_pair(__m512i A, __m512i B, __m512i table, const int bits, const int pass, __m512i x[4]) {
  if (bits == 4) { /* the pass's nibble plane; byte unpacks, then bytes widened to words */
    const __m512i m4 = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
    if (pass) A = _mm512_srli_epi16(A, 4), B = _mm512_srli_epi16(B, 4);
    A = _mm512_and_si512(A, m4), B = _mm512_and_si512(B, m4);
    __m512i zl = _mm512_unpacklo_epi8(A, B), zh = _mm512_unpackhi_epi8(A, B);
    x[0] = _mm512_permutexvar_epi16(_mm512_unpacklo_epi8(zl, zero), table);
    x[1] = _mm512_permutexvar_epi16(_mm512_unpackhi_epi8(zl, zero), table);
    x[2] = _mm512_permutexvar_epi16(_mm512_unpacklo_epi8(zh, zero), table);
    x[3] = _mm512_permutexvar_epi16(_mm512_unpackhi_epi8(zh, zero), table);
    return;
  }
  /* 2 bits: crumb planes 2 pass and 2 pass + 1, each a byte unpack of the 32-byte rows widened to words */
  const __m256i m2 = _mm256_set1_epi8(0x03);
  __m256i a = _mm512_castsi512_si256(A), b = _mm512_castsi512_si256(B);
  for (int k = 0; k < 2; k++) {
    int sh = 2 * (2 * pass + k);
    __m256i ap = _mm256_and_si256(_mm256_srli_epi16(a, sh), m2), bp = _mm256_and_si256(_mm256_srli_epi16(b, sh), m2);
    x[2 * k] = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm256_unpacklo_epi8(ap, bp)), table);
    x[2 * k + 1] = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm256_unpackhi_epi8(ap, bp)), table);
  }
}

/* NR (1..4) rows by the 64 channels of pass `pass` of one 128-channel chunk: 16 accumulators across
 * every pair of tokens. */
AI void tile(const uint32_t *wb, size_t ldb, const uint8_t *base, size_t stride, uint32_t np, __m512i table,
             float *acc, size_t lda, const int NR, const int bits, const int pass, const uint8_t *pf, uint32_t pfl) {
  const uint32_t per = np ? (pfl + np - 1u) / np : pfl;
  const __mmask64 bytes = bits == 4 ? ~(__mmask64)0 : (__mmask64)0xffffffffu; /* a chunk's row bytes */
  __m512 a[4][4];
  UNROLL
  for (int r = 0; r < NR; r++)
    UNROLL
    for (int g = 0; g < 4; g++) a[r][g] = _mm512_loadu_ps(acc + r * lda + 16 * g);
  for (uint32_t j = 0; j < np; j++) {
    for (uint32_t z = 0; z < per && pfl; z++, pfl--, pf += 64) __builtin_prefetch(pf, 0, 2);
    __m512i A = _mm512_maskz_loadu_epi8(bytes, base + (size_t)(2u * j) * stride);
    __m512i B = _mm512_maskz_loadu_epi8(bytes, base + (size_t)(2u * j + 1u) * stride);
    __m512i x[4];
    decode_pair(A, B, table, bits, pass, x);
    UNROLL
    for (int r = 0; r < NR; r++)
      UNROLL
      for (int g = 0; g < 4; g++) a[r][g] = dp_w(a[r][g], x[g], wb + r * ldb + j);
  }
  UNROLL
  for (int r = 0; r < NR; r++)
    UNROLL
    for (int g = 0; g < 4; g++) _mm512_storeu_ps(acc + r * lda + 16 * g, a[r][g]);
  for (; pfl; pfl--, pf += 64) __builtin_prefetch(pf, 0, 2);
}

void ckv_avalues_bf16_rot(uint32_t bits, const float *w, size_t nq, size_t ldw, const uint8_t *base, size_t stride,
                          uint32_t nt, uint32_t n, const float *lut, uint32_t *wb, float *acc, size_t lda,
                          const uint8_t *pf, uint32_t pf_lines) {
  uint32_t np = nt / 2u;
  for (size_t r = 0; r < nq; r++) /* the weights as BF16 pairs: dword j = tokens 2j (low half), 2j + 1 */
    for (uint32_t t = 0; t < nt; t += 32) {
      uint32_t left = nt - t;
      __mmask16 ml = left >= 16u ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
      __mmask16 mh = left >= 32u ? (__mmask16)0xffff : left > 16u ? (__mmask16)((1u << (left - 16u)) - 1u) : 0;
      __m512 lo = _mm512_maskz_loadu_ps(ml, w + r * ldw + t), hi = _mm512_maskz_loadu_ps(mh, w + r * ldw + t + 16);
      __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      uint32_t nd = left >= 32u ? 16u : left / 2u;
      _mm512_mask_storeu_epi32(wb + r * np + t / 2u, (__mmask16)((1u << nd) - 1u), pairs);
    }
  /* the 16 code values as BF16, twice (vpermw reads 32 words) */
  __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lut));
  __m512i table = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
  for (uint32_t c = 0; c < n; c += 128)
    for (int pass = 0; pass < 2; pass++)
      for (size_t r0 = 0; r0 < nq; r0 += 4) {
        const uint32_t *wr = wb + r0 * np;
        const uint8_t *p = c || pass || r0 ? NULL : pf; /* the lines asked for along the first tile's pairs */
        uint32_t pl = p ? pf_lines : 0;
        const uint8_t *b = base + (size_t)c * bits / 8u;
        float *ar = acc + r0 * lda + c + 64u * (uint32_t)pass;
        int nr = nq - r0 >= 4 ? 4 : (int)(nq - r0);
#define TILE(NR) (bits == 4 ? (pass ? tile(wr, np, b, stride, np, table, ar, lda, NR, 4, 1, p, pl)             \
                                    : tile(wr, np, b, stride, np, table, ar, lda, NR, 4, 0, p, pl))           \
                            : (pass ? tile(wr, np, b, stride, np, table, ar, lda, NR, 2, 1, p, pl)             \
                                    : tile(wr, np, b, stride, np, table, ar, lda, NR, 2, 0, p, pl)))
        switch (nr) {
        case 4: TILE(4); break;
        case 3: TILE(3); break;
        case 2: TILE(2); break;
        default: TILE(1); break;
        }
#undef TILE
      }
}
