/* block.c - block headers: initialising a block, checking a header against a
 * session geometry, and the slot valid bits (the only words readers and the
 * daemon share concurrently, so they go through atomic builtins). */
#include <string.h>

#include "kernels/access.h"
#include "kernels/kernels.h"

ckv_status ckv_block_init_header(void *hdr, uint32_t fmt, const ckv_geometry *g, uint32_t capacity,
                                 uint32_t kept_channels, uint64_t generation) {
  if (!hdr || !ckv_format_valid(fmt, g, capacity, kept_channels)) return CKV_ERR_INVALID;
  ckv_block_header *h = hdr;
  memset(hdr, 0, ckv_block_payload_offset(capacity));
  h->magic = CKV_BLOCK_MAGIC;
  h->format = (uint8_t)fmt;
  h->dtype = (uint8_t)g->dtype;
  h->capacity = (uint16_t)capacity;
  h->n_valid = 0;
  h->kept_channels = ckv_format_is_commit(fmt) ? ckv_commit_kept(g, kept_channels) : g->head_dim;
  h->generation = generation;
  return CKV_OK;
}

ckv_status ckv_block_init(void *blk, uint32_t fmt, const ckv_geometry *g, uint32_t capacity,
                          uint32_t kept_channels, uint64_t generation) {
  ckv_status st = ckv_block_init_header(blk, fmt, g, capacity, kept_channels, generation);
  if (st == CKV_OK && ckv_format_is_rot(fmt))
    memset((uint8_t *)blk + ckv_rot_meta_offset(capacity), 0, ckv_rot_sections_offset(g, capacity) - ckv_rot_meta_offset(capacity));
  if (st != CKV_OK || !ckv_format_is_commit(fmt)) return st;
  const ckv_block_header *h = blk;
  uint8_t *b = blk;
  memset(b + ckv_commit_meta_offset(capacity), 0, CKV_COMMIT_META_BYTES);
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t hd = 0; hd < g->n_kv_heads; hd++)
      memset(b + ckv_commit_mask_offset(fmt, g, capacity, h->kept_channels, l, hd), 0, ckv_commit_mask_words(g) * 8u);
  return CKV_OK;
}

ckv_status ckv_block_check(const void *blk, const ckv_geometry *g) {
  if (!blk || !g) return CKV_ERR_INVALID;
  const ckv_block_header *h = blk;
  if (h->magic != CKV_BLOCK_MAGIC) return CKV_ERR_CORRUPT;
  if (h->dtype != g->dtype || !ckv_format_valid(h->format, g, h->capacity, h->kept_channels))
    return CKV_ERR_FORMAT;
  if (ckv_format_is_commit(h->format) && h->kept_channels == 0) return CKV_ERR_FORMAT;
  return CKV_OK;
}

bool ckv_block_slot_valid(const void *blk, uint32_t slot) {
  const ckv_block_header *h = blk;
  const uint64_t *w = (const uint64_t *)((const uint8_t *)blk + ckv_block_bitmap_offset(h->capacity));
  return slot < h->capacity && ((__atomic_load_n(&w[slot / 64u], __ATOMIC_ACQUIRE) >> (slot % 64u)) & 1u);
}

void ckv_block_set_valid(void *blk, uint32_t slot, bool valid) {
  ckv_set_valid_at(blk, ckv_hdr(blk)->capacity, slot, valid);
}

uint32_t *ckv_block_positions(void *blk) { return (uint32_t *)((uint8_t *)blk + ckv_block_positions_offset()); }
const uint32_t *ckv_block_positions_const(const void *blk) {
  return (const uint32_t *)((const uint8_t *)blk + ckv_block_positions_offset());
}

uint32_t ckv_block_sealed_chunks(const void *blk) { return ckv_sealed_chunks_of(ckv_hdr(blk), blk); }
