/* compact.c - byte-exact copies of tokens between blocks of one format (see compact.h). */
#include "store/compact.h"

#include <string.h>

#include "commitkv/status.h"

int ckv_copy_slots(const ckv_geometry *g, const ckv_move *moves, size_t n_moves) {
  for (size_t i = 0; i < n_moves; i++) {
    const ckv_move *m = &moves[i];
    /* The daemon's own records when given: the blocks' headers are worker-writable. */
    const ckv_block_header *sh = m->src_hdr ? m->src_hdr : m->src;
    const ckv_block_header *dh = m->dst_hdr ? m->dst_hdr : m->dst;
    if (sh->format != dh->format || sh->dtype != dh->dtype) return CKV_ERR_FORMAT;
    if (m->src_slot >= sh->capacity || m->dst_slot >= dh->capacity) return CKV_ERR_INVALID;
    const uint8_t *src = m->src;
    uint8_t *dst = m->dst;
    size_t elems = ckv_draft_token_elems(g);
    for (uint32_t l = 0; l < g->n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        if (sh->format == CKV_FORMAT_DRAFT) {
          memcpy(dst + ckv_draft_kv_offset(g, dh->capacity, l, kv, m->dst_slot),
                 src + ckv_draft_kv_offset(g, sh->capacity, l, kv, m->src_slot), elems * 2u);
        } else if (sh->format == CKV_FORMAT_STAGED) {
          size_t groups = ckv_staged_groups(g);
          memcpy(dst + ckv_staged_codes_offset(g, dh->capacity, l, kv) + (size_t)m->dst_slot * elems,
                 src + ckv_staged_codes_offset(g, sh->capacity, l, kv) + (size_t)m->src_slot * elems, elems);
          memcpy(dst + ckv_staged_scales_offset(g, dh->capacity, l, kv) + (size_t)m->dst_slot * groups * 2u,
                 src + ckv_staged_scales_offset(g, sh->capacity, l, kv) + (size_t)m->src_slot * groups * 2u,
                 groups * 2u);
        } else {
          return CKV_ERR_UNSUPPORTED;
        }
      }
    /* with trusted headers the daemon keeps the position in its shadow (set at publish) */
    if (!m->dst_hdr) ckv_block_positions(m->dst)[m->dst_slot] = ckv_block_positions_const(m->src)[m->src_slot];
  }
  return CKV_OK;
}
