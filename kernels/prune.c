/* prune.c - structured pruning of committed key channels (ThinK-style): per
 * (layer, head) keep the kept_channels channels with the largest magnitude
 * (sum of |k| over the tokens bound for the block, summed in destination-slot
 * order so the CUDA code gets the same floats), and write the block's mask. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/kernels.h"

/* A channel's place in the ranking as one integer: magnitude descending (NaN
 * as -1), then channel ascending, so keys are distinct and the r smallest
 * keys are the r channels a sort by (magnitude, channel) would put first.
 * The float's bits map to an order-preserving unsigned (negative: all bits
 * flipped; else the sign bit set), then flipped for descending. */
static uint64_t rank_key(float mag, uint32_t ch) {
  if (isnan(mag)) mag = -1.0f;
  if (mag == 0.0f) mag = 0.0f; /* -0 ranks with +0 (they compare equal) */
  uint32_t u;
  memcpy(&u, &mag, sizeof u);
  u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
  return (uint64_t)~u << 32 | ch;
}
static void swap64(uint64_t *a, uint64_t *b) {
  uint64_t t = *a;
  *a = *b;
  *b = t;
}
/* Reorders a[0..n) so that a[0..k) are its k smallest (quickselect, median-of-three pivots; k < n). */
static void smallest_first(uint64_t *a, uint32_t n, uint32_t k) {
  uint32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (a[mid] < a[lo]) swap64(&a[mid], &a[lo]);
    if (a[hi] < a[lo]) swap64(&a[hi], &a[lo]);
    if (a[mid] < a[hi]) swap64(&a[mid], &a[hi]); /* a[hi]: the median */
    uint64_t p = a[hi];
    uint32_t i = lo;
    for (uint32_t j = lo; j < hi; j++)
      if (a[j] < p) swap64(&a[i++], &a[j]);
    swap64(&a[i], &a[hi]);
    if (i == k) return;
    if (i < k) lo = i + 1;
    else hi = i - 1;
  }
}

void ckv_kernels_select_channels(const float *mag, uint32_t head_dim, uint32_t r, uint64_t *ret_mask) {
  uint64_t key[CKV_MAX_HEAD_DIM];
  uint32_t words = (head_dim + 63u) / 64u;
  memset(ret_mask, 0, words * sizeof(uint64_t));
  if (head_dim > CKV_MAX_HEAD_DIM) return;
  if (r >= head_dim) { /* every channel */
    for (uint32_t c = 0; c < head_dim; c++) ret_mask[c / 64u] |= 1ull << (c % 64u);
    return;
  }
  for (uint32_t c = 0; c < head_dim; c++) key[c] = rank_key(mag[c], c);
  smallest_first(key, head_dim, r);
  for (uint32_t i = 0; i < r; i++) {
    uint32_t ch = (uint32_t)key[i];
    ret_mask[ch / 64u] |= 1ull << (ch % 64u);
  }
}

static bool mask_empty(const ckv_geometry *g, const ckv_block_header *bh, const void *blk) {
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t h = 0; h < g->n_kv_heads; h++) {
      const uint64_t *m = ckv_commit_mask(g, bh, blk, l, h);
      for (uint32_t w = 0; w < ckv_commit_mask_words(g); w++)
        if (m[w]) return false;
    }
  return true;
}

int ckv_prune_block(const ckv_rowops *ops, const ckv_geometry *g, void *dst, const ckv_block_header *h,
                    const ckv_move *moves, const size_t *order, size_t n) {
  if (!mask_empty(g, h, dst)) return CKV_OK;
  if (ckv_sealed_chunks_of(h, dst)) return CKV_ERR_STATE;
  uint32_t D = g->head_dim, H = g->n_kv_heads, kept = h->kept_channels, words = ckv_commit_mask_words(g);
  size_t te = ckv_draft_token_elems(g);
  float *row = malloc(te * sizeof(float)), *mag = calloc(te, sizeof(float));
  if (!row || !mag) {
    free(row);
    free(mag);
    return -12; /* -ENOMEM */
  }
  for (uint32_t l = 0; l < g->n_layers; l++) {
    if (kept == D) {
      for (uint32_t hd = 0; hd < H; hd++) ckv_kernels_select_channels(mag, D, D, (uint64_t *)ckv_commit_mask(g, h, dst, l, hd));
      continue;
    }
    memset(mag, 0, te * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      const ckv_move *mv = &moves[order[i]];
      const ckv_block_header *sh = ckv_move_src_hdr(mv);
      if (sh->format == CKV_FORMAT_DRAFT && ops->absadd_h) { /* widened in registers */
        ops->absadd_h((const uint16_t *)ckv_cb(mv->src, ckv_draft_kv_offset(g, sh->capacity, l, 0, mv->src_slot)),
                      g->dtype == CKV_DTYPE_BF16, mag, te);
        continue;
      }
      ckv_read_row(ops, g, mv->src, sh, l, 0, mv->src_slot, row);
      for (size_t e = 0; e < te; e++) mag[e] += fabsf(row[e]);
    }
    for (uint32_t hd = 0; hd < H; hd++) {
      uint64_t m[CKV_MAX_HEAD_DIM / 64u];
      ckv_kernels_select_channels(mag + (size_t)hd * D, D, kept, m);
      memcpy((uint64_t *)ckv_commit_mask(g, h, dst, l, hd), m, words * sizeof(uint64_t));
    }
  }
  free(row);
  free(mag);
  return CKV_OK;
}

ckv_status ckv_kernels_prune_keys(const ckv_geometry *g, const ckv_move *moves, size_t n_moves) {
  size_t *order = NULL;
  int st = ckv_moves_sorted(g, moves, n_moves, &order);
  if (st != CKV_OK) return (ckv_status)st;
  const ckv_rowops *ops = ckv_rowops_get();
  for (size_t i = 0; i < n_moves && st == CKV_OK;) {
    size_t j = i;
    while (j < n_moves && moves[order[j]].dst == moves[order[i]].dst) j++;
    const ckv_block_header *dh = ckv_move_dst_hdr(&moves[order[i]]);
    if (ckv_format_is_commit(dh->format)) st = ckv_prune_block(ops, g, moves[order[i]].dst, dh, moves, order + i, j - i);
    i = j;
  }
  free(order);
  return (ckv_status)st;
}
