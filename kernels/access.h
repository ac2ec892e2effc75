/* access.h - private helpers shared by the CPU kernels: typed pointers into a
 * block (offsets from format.h) and reading one token's K or V row of a layer
 * as FP32 from a draft or staged block. */
#ifndef CKV_ACCESS_H
#define CKV_ACCESS_H

#include "kernels/format.h"
#include "kernels/rowops.h"

static inline const ckv_block_header *ckv_hdr(const void *blk) { return (const ckv_block_header *)blk; }
static inline const uint8_t *ckv_cb(const void *blk, size_t off) { return (const uint8_t *)blk + off; }
static inline uint8_t *ckv_b(void *blk, size_t off) { return (uint8_t *)blk + off; }

/* Reads K (kv=0) or V (kv=1) of one slot of one layer from a draft or staged
 * block into dst[n_kv_heads*head_dim]. */
void ckv_read_row(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t kv,
                  uint32_t slot, float *dst);

/* Channel mask words of (layer, head) of a committed block. */
static inline const uint64_t *ckv_commit_mask(const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t head) {
  const ckv_block_header *h = ckv_hdr(blk);
  return (const uint64_t *)ckv_cb(blk, ckv_commit_mask_offset(h->format, g, h->capacity, h->kept_channels, layer, head));
}
/* Fills idx[0..kept) with the kept channel numbers in increasing order; returns how many bits were set. */
static inline uint32_t ckv_mask_channels(const uint64_t *mask, uint32_t head_dim, uint32_t *idx) {
  uint32_t n = 0;
  for (uint32_t c = 0; c < head_dim; c++)
    if ((mask[c / 64u] >> (c % 64u)) & 1u) idx[n++] = c;
  return n;
}

struct ckv_move;
/* Validates moves[order[0..n)] (all bound for committed block dst, sorted by
 * destination slot) and, when dst's masks are empty, chooses and writes them
 * (prune.c).  Returns CKV_ERR_STATE if dst has sealed chunks but empty masks. */
int ckv_prune_block(const ckv_rowops *ops, const ckv_geometry *g, void *dst, const struct ckv_move *moves,
                    const size_t *order, size_t n);
/* Sorts move indices by (destination block, destination slot) and rejects
 * bad slots or duplicate destinations (move.c).  *ret_order is malloc'ed. */
int ckv_moves_sorted(const ckv_geometry *g, const struct ckv_move *moves, size_t n, size_t **ret_order);

#endif
