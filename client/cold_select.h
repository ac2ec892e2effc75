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
 * Summaries are keyed by block id and kept across views; one is made anew
 * when its block's valid slots or their positions changed (a token recalled
 * out of it, a slot filled again: a quantized slot's bytes never change).  A
 * summary also holds each valid slot's key sketch (cold_sketch.h), which
 * cold_gather.c ranks tokens with. */
#ifndef CKV_CLIENT_COLD_SELECT_H
#define CKV_CLIENT_COLD_SELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv/commitkv.h"
#include "kernels/format.h"

typedef struct ckv_cold_cache ckv_cold_cache;

void ckv_cold_cache_free(ckv_cold_cache *c);
/* The bytes the cache's summaries hold (key bounds, sketches, slot lists, the
 * records themselves) at geometry g: worker memory that serves the cold tier,
 * which commitkv-dialogue counts in its total bytes.  0 for NULL. */
size_t ckv_cold_cache_bytes(const ckv_cold_cache *c, const ckv_geometry *g);

/* What a cold block's summary says of its slots: n_valid of them, in slot
 * order; slot[i] is the i-th valid slot, and where head_dim takes a sketch
 * (sign non-NULL) sign + ((i * n_layers + layer) * n_kv_heads + kv) * words
 * and alpha[(i * n_layers + layer) * n_kv_heads + kv] are its key's sketch.
 * unknown: the block's bytes could not be read back (nothing else is set).
 * The arrays stay valid until the block leaves the view. */
typedef struct ckv_cold_summary {
  uint32_t n_valid;
  bool unknown;
  const uint32_t *slot;
  const uint64_t *sign;
  const float *alpha;
} ckv_cold_summary;

/* The slots of a cold block that can be read: its header's capacity, at
 * most the view's. */
static inline uint32_t ckv_cold_block_slots(const ckv_block_view *b) {
  uint32_t cap = ((const ckv_block_header *)b->data)->capacity;
  return b->capacity < cap ? b->capacity : cap;
}

/* Whether the cold gather scores block b's keys straight from its codes
 * (cold_gather.c): a rotated block of 1, 2 or 4 bits per element, whose
 * bytes (the view's, from the daemon) hold its layout at the view's
 * capacity.  Such blocks keep no sketches in their summaries: their codes
 * are a smaller and exact summary of themselves. */
static inline bool ckv_cold_code_scored(const ckv_geometry *g, const ckv_block_view *b) {
  if (!ckv_format_is_rot(b->format) || !ckv_format_valid(b->format, g, b->capacity, 0)) return false;
  const uint32_t bits = ckv_format_code_bits(b->format);
  return (bits == 1u || bits == 2u || bits == 4u) && b->bytes >= ckv_rot_block_bytes(b->format, g, b->capacity);
}

/* scale * qh . k over d elements: one query head's exact score of one key
 * (possibly non-finite: the callers decide). */
float ckv_cold_head_score(const float *qh, const float *k, uint32_t d, float scale);

/* The summary of view->cold[i], computed on first use (*cache is created
 * then).  Call it for i = 0 first in a pass over the view: that call forgets
 * the summaries of blocks no longer cold.  Returns CKV_OK, CKV_ERR_INVALID,
 * -ENOMEM. */
int ckv_cold_cache_summary(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v, size_t i,
                           ckv_cold_summary *ret);

/* Forgets the summaries of blocks no longer cold in v, as the summary of
 * view->cold[0] does (*cache is created on first use).  Returns CKV_OK,
 * CKV_ERR_INVALID, -ENOMEM. */
int ckv_cold_cache_forget(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v);

/* ckv_session_cold_select_top's work on a host-memory view (max_blocks 0:
 * no cap); *cache is created on first use.  Returns CKV_OK,
 * CKV_ERR_INVALID, -ENOMEM. */
int ckv_cold_select(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v, uint32_t layer, const float *q,
                    uint32_t n_q_heads, float scale, float min_weight, size_t max_blocks, uint32_t *ret_idx,
                    size_t *ret_n);

#endif
