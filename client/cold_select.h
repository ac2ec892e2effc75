/* cold_select.h - which cold blocks of a view a query could need (internal
 * to libcommitkv; the API is ckv_session_cold_select in commitkv.h).
 *
 * Each cold block gets a summary the first time a query tests it: per
 * (layer, kv head, channel) the minimum and maximum of its keys, dequantized
 * (Quest's bound).  q.k <= sum_c max(q_c min_c, q_c max_c) for every key of
 * the block, so a block whose bound, times its token count, stays below
 * min_weight times the softmax weight of a key that attention surely reads
 * (the best exact score over the view's draft blocks: sinks and the recent
 * window) cannot take min_weight of any head's attention: it is skipped.
 * Summaries are keyed by block id (a cold block's bytes never change) and
 * kept across views. */
#ifndef CKV_CLIENT_COLD_SELECT_H
#define CKV_CLIENT_COLD_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "commitkv/commitkv.h"
#include "kernels/format.h"

typedef struct ckv_cold_cache ckv_cold_cache;

void ckv_cold_cache_free(ckv_cold_cache *c);

/* ckv_session_cold_select_top's work on a host-memory view (max_blocks 0:
 * no cap); *cache is created on first use.  Returns CKV_OK,
 * CKV_ERR_INVALID, -ENOMEM. */
int ckv_cold_select(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v, uint32_t layer, const float *q,
                    uint32_t n_q_heads, float scale, float min_weight, size_t max_blocks, uint32_t *ret_idx,
                    size_t *ret_n);

#endif
