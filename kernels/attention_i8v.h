/* attention_i8v.h - private: the values of INT8 staged blocks summed with
 * integer dot products (attention_i8v.c, AVX-512 VNNI), for attention_blocks.c. */
#ifndef CKV_ATTENTION_I8V_H
#define CKV_ATTENTION_I8V_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Tokens per weight scale: each query row's weights are quantized to 8 bits per this many tokens. */
#define CKV_I8V_GROUP 16u

/* Whether this CPU runs ckv_avalues_i8_staged (AVX-512 F/BW/VL and AVX512_VNNI; dispatch.c). */
bool ckv_avalues_i8_supported(void);

/* acc[r * lda + i] += sum over tokens t < nt of w[r * ldw + t] * code(t, i), r < nq, i < n, the codes
 * int8 at base + t * stride + i: per row and group of CKV_I8V_GROUP tokens, the weights are rounded to
 * unsigned 8-bit multiples of d = (the group's largest) / 255, the group's products summed exactly in
 * int32 (vpdpbusd, four tokens a lane) and d * that sum added to acc (one FMA per channel and group).
 * Requires nt % CKV_I8V_GROUP == 0 and n % 64 == 0; returns false, acc untouched, when they do not
 * hold or a weight is negative or not finite (the caller sums those blocks in FP32).  Scratch: wq of
 * nq * nt bytes, dq of nq * nt / CKV_I8V_GROUP floats.  pf_lines cache lines from pf (the next
 * block's; NULL: none) are asked for along the work.  Only after ckv_avalues_i8_supported(). */
bool ckv_avalues_i8_staged(const float *w, size_t nq, size_t ldw, const int8_t *base, size_t stride, uint32_t nt,
                           uint32_t n, uint8_t *wq, float *dq, float *acc, size_t lda, const uint8_t *pf,
                           uint32_t pf_lines);

#endif
