/* quant_plain.h - plain-C quantizers and dequantizers of every format, the
 * baselines that `commitkv-bench kernels` runs beside ours on the same
 * buffers (quant_plain.c).  They write the same bytes as the kernels (the
 * bench checks it), so the comparison is of speed alone. */
#ifndef CKV_BENCH_QUANT_PLAIN_H
#define CKV_BENCH_QUANT_PLAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"

/* Whether this CPU runs the baselines (AVX2, FMA, F16C). */
bool ckv_bench_quant_plain_supported(void);
/* Tokens t0..t1 of the draft blocks src (16 slots each: token t in block t/16,
 * slot t%16) into blocks dst of format fmt (staged, committed or rotated;
 * token t in block t/cap, slot t%cap; t0 and t1 multiples of cap; dst
 * initialised, nothing pruned), positions copied, committed chunks sealed,
 * rotated key means set from these tokens: what ckv_kernels_move writes.
 * head_dim a multiple of 8.  0, or -1 when out of memory. */
int ckv_bench_plain_quantize(uint32_t fmt, const ckv_geometry *g, void *const *src, void *const *dst, uint32_t cap,
                             size_t t0, size_t t1);
/* Every (slot, layer, K|V) of blocks blk[b0..b1) (one format, quantized and
 * sealed), dequantized in that order into consecutive rows of ring (wrapping
 * at ring_floats): what ckv_kernels_dequantize returns. */
void ckv_bench_plain_dequantize(const ckv_geometry *g, void *const *blk, size_t b0, size_t b1, float *ring,
                                size_t ring_floats);
/* The key channel masks of committed blocks dst (kept channels < head_dim,
 * masks empty) from tokens t0..t1 of src, as ckv_kernels_prune_keys chooses
 * them.  0, or -1 when out of memory. */
int ckv_bench_plain_prune(const ckv_geometry *g, void *const *src, void *const *dst, uint32_t cap, size_t t0,
                          size_t t1);

#endif
