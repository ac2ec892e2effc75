/* attention_bf16.h - private: the values of ROT4 and ROT2 blocks summed with
 * BF16 dot products (attention_bf16.c, AVX-512 BF16), for attention_blocks.c. */
#ifndef CKV_ATTENTION_BF16_H
#define CKV_ATTENTION_BF16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this CPU runs ckv_avalues_bf16_rot (AVX-512 F/BW and AVX512_BF16; dispatch.c). */
bool ckv_avalues_bf16_supported(void);

/* The accumulators of ckv_avalues_bf16_rot are in a pair order: position pos of a row of n channels
 * (n % 128 == 0) of b-bit codes sums channel ckv_avalues_bf16_channel(b, pos): what byte unpacks of
 * two tokens' rows give without a cross-lane shuffle.  In each 128-channel chunk, vector v = pos / 16
 * (of 8), lane l: 4 bits, the low (v < 4) or high nibble of code byte 16 (l / 4) + 4 (v % 4) + l % 4;
 * 2 bits, crumb v / 2 of code byte l % 8 + 16 (l / 8) + 8 (v % 2). */
static inline uint32_t ckv_avalues_bf16_channel(uint32_t bits, uint32_t pos) {
  uint32_t r = pos % 128u, v = r / 16u, l = r % 16u;
  if (bits == 4u) return pos - r + 2u * (16u * (l / 4u) + 4u * (v % 4u) + l % 4u) + v / 4u;
  return pos - r + 4u * (l % 8u + 16u * (l / 8u) + 8u * (v % 2u)) + v / 2u;
}

/* acc[r * lda + pos] += sum over tokens t < nt of bf16(w[r * ldw + t]) * bf16(lut[code of token t's
 * channel ckv_avalues_bf16_channel(bits, pos)]), r < nq, pos < n: tokens in pairs (t, t + 1), each
 * pair's two products and the accumulator summed by one vdpbf16ps (FP32 sums, round to nearest even),
 * the pairs in increasing order.  Rows of n b-bit codes (b = 4 or 2) at base + t * stride; lut: the
 * 16 code values (code mod 2^b less the offset: exact in BF16); nt even, n % 128 == 0; wb: scratch of
 * nq * nt / 2 dwords; pf_lines cache lines from pf (the next block's) are asked for along the first
 * tile's pairs (pf NULL: none).  Only after ckv_avalues_bf16_supported(). */
void ckv_avalues_bf16_rot(uint32_t bits, const float *w, size_t nq, size_t ldw, const uint8_t *base, size_t stride,
                          uint32_t nt, uint32_t n, const float *lut, uint32_t *wb, float *acc, size_t lda,
                          const uint8_t *pf, uint32_t pf_lines);

#endif
