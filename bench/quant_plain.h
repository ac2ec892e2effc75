/* quant_plain.h - a plain-C INT8 quantizer, the baseline that
 * `commitkv-bench kernels` runs beside the fused quantize_int8 (quant_plain.c). */
#ifndef CKV_BENCH_QUANT_PLAIN_H
#define CKV_BENCH_QUANT_PLAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"

/* Whether this CPU runs the baseline (AVX2, FMA, F16C). */
bool ckv_bench_quant_plain_supported(void);
/* Quantizes every slot of every layer's K and V of n_blocks draft blocks to
 * symmetric INT8 with one FP16 scale per staged group (the staged layout's
 * group length), into codes[block][layer][kv][slot][elems] and
 * scales[block][layer][kv][slot][group].  head_dim a multiple of 8.  0, or -1
 * when out of memory. */
int ckv_bench_plain_quantize_int8(const ckv_geometry *g, void *const *blocks, size_t n_blocks, int8_t *codes,
                                  uint16_t *scales);

#endif
