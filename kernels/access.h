/* access.h - private helpers shared by the CPU kernels: typed pointers into a
 * block (offsets from format.h) and reading one token's K or V row of a layer
 * as FP32 from a draft or staged block. */
#ifndef CKV_ACCESS_H
#define CKV_ACCESS_H

#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/rowops.h"

static inline const ckv_block_header *ckv_hdr(const void *blk) { return (const ckv_block_header *)blk; }
static inline const uint8_t *ckv_cb(const void *blk, size_t off) { return (const uint8_t *)blk + off; }
static inline uint8_t *ckv_b(void *blk, size_t off) { return (uint8_t *)blk + off; }

/* The headers a move is computed from: the trusted copies when the caller
 * gave them (kernels.h ckv_move), else the blocks' own. */
static inline const ckv_block_header *ckv_move_src_hdr(const ckv_move *m) {
  return m->src_hdr ? m->src_hdr : ckv_hdr(m->src);
}
static inline const ckv_block_header *ckv_move_dst_hdr(const ckv_move *m) {
  return m->dst_hdr ? m->dst_hdr : ckv_hdr(m->dst);
}

/* Reads K (kv=0) or V (kv=1) of one slot of one layer from a draft or staged
 * block described by header h into dst[n_kv_heads*head_dim]. */
void ckv_read_row(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, const ckv_block_header *h,
                  uint32_t layer, uint32_t kv, uint32_t slot, float *dst);

/* Channel mask words of (layer, head) of the committed block blk described by h. */
static inline const uint64_t *ckv_commit_mask(const ckv_geometry *g, const ckv_block_header *h, const void *blk,
                                              uint32_t layer, uint32_t head) {
  return (const uint64_t *)ckv_cb(blk, ckv_commit_mask_offset(h->format, g, h->capacity, h->kept_channels, layer, head));
}
/* Sets or clears a slot's valid bit and adjusts n_valid (atomic RMW,
 * release) in block blk of `capacity` slots: the capacity comes from the
 * caller's header, which may be a trusted copy. */
static inline void ckv_set_valid_at(void *blk, uint32_t capacity, uint32_t slot, bool valid) {
  if (slot >= capacity) return;
  uint64_t *w = (uint64_t *)ckv_b(blk, ckv_block_bitmap_offset(capacity)) + slot / 64u;
  uint32_t *n_valid = &((ckv_block_header *)blk)->n_valid;
  uint64_t bit = 1ull << (slot % 64u), old;
  if (valid) {
    old = __atomic_fetch_or(w, bit, __ATOMIC_RELEASE);
    if (!(old & bit)) __atomic_fetch_add(n_valid, 1u, __ATOMIC_RELEASE);
  } else {
    old = __atomic_fetch_and(w, ~bit, __ATOMIC_RELEASE);
    if (old & bit) __atomic_fetch_sub(n_valid, 1u, __ATOMIC_RELEASE);
  }
}
/* Sealed-chunk mask of the block blk described by h (0 for other formats). */
static inline uint32_t ckv_sealed_chunks_of(const ckv_block_header *h, const void *blk) {
  if (!ckv_format_is_commit(h->format)) return 0;
  return __atomic_load_n((const uint32_t *)ckv_cb(blk, ckv_commit_meta_offset(h->capacity)), __ATOMIC_ACQUIRE);
}
/* Fills idx[0..kept) with the kept channel numbers in increasing order; returns how many bits were set. */
static inline uint32_t ckv_mask_channels(const uint64_t *mask, uint32_t head_dim, uint32_t *idx) {
  uint32_t n = 0;
  for (uint32_t c = 0; c < head_dim; c++)
    if ((mask[c / 64u] >> (c % 64u)) & 1u) idx[n++] = c;
  return n;
}

struct ckv_move;
/* Validates moves[order[0..n)] (all bound for committed block dst, described
 * by header dh, sorted by destination slot) and, when dst's masks are empty,
 * chooses and writes them (prune.c).  Returns CKV_ERR_STATE if dst has sealed
 * chunks but empty masks. */
int ckv_prune_block(const ckv_rowops *ops, const ckv_geometry *g, void *dst, const ckv_block_header *dh,
                    const struct ckv_move *moves, const size_t *order, size_t n);
/* Sorts move indices by (destination block, destination slot) and rejects
 * bad slots or duplicate destinations (move.c).  *ret_order is malloc'ed. */
int ckv_moves_sorted(const ckv_geometry *g, const struct ckv_move *moves, size_t n, size_t **ret_order);

#endif
