/* attention_plain.h - a plain-C FP16 decode attention, the baseline that
 * `commitkv-bench kernels` runs beside the fused kernel (attention_plain.c). */
#ifndef CKV_BENCH_ATTENTION_PLAIN_H
#define CKV_BENCH_ATTENTION_PLAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/format.h"

/* Whether this CPU runs the baseline (AVX2, FMA, F16C). */
bool ckv_bench_plain_supported(void);
/* out[n_q_heads][head_dim] = softmax(q K^T / sqrt(head_dim)) V over the
 * valid slots of layer 0 of draft blocks (one query row; at most 64 query
 * heads per KV head, head_dim a multiple of 8).  0, or -1 when out of memory. */
int ckv_bench_plain_attention(const ckv_geometry *g, const void *const *blocks, uint32_t n_blocks, uint32_t n_q_heads,
                              const float *q, float *out);

#endif
