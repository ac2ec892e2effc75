/* cold.c - a session's cold tier (see cold.h). */
#include "store/cold.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>

#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "lifecycle/token_states.h"

static bool filling(const ckv_srv_session *s, uint32_t idx) {
  const ckv_sblock *b = &s->blocks[idx];
  if (b->used >= b->capacity) return false;
  for (int f = 0; f < CKV_FILL_COUNT; f++)
    if (s->fill[f] == idx) return true;
  return false;
}

bool ckv_cold_block(const ckv_srv_session *s, uint32_t idx) {
  const ckv_sblock *b = &s->blocks[idx];
  if (b->format == CKV_BLOCK_UNUSED || !ckv_format_is_committed_state(b->format) || !b->refs || !b->meta ||
      filling(s, idx))
    return false;
  const uint32_t *positions = ckv_block_positions_const(b->meta);
  const ckv_tokens *t = &s->tokens;
  bool any = false;
  for (uint32_t slot = 0; slot < b->used; slot++) {
    if (!ckv_block_slot_valid(b->meta, slot)) continue;
    uint32_t p = positions[slot];
    if (p >= t->n || t->state[p] != CKV_STATE_RECYCLED || t->block[p] != idx) return false;
    any = true;
  }
  return any;
}

int ckv_cold_note_report(ckv_srv_session *s, uint64_t first, const float *attn, size_t n) {
  const ckv_tokens *t = &s->tokens;
  uint64_t cold = s->count_by_state[CKV_STATE_RECYCLED];
  if (!s->params.demote || !cold || s->params.recall_attn <= 0.f) return CKV_OK;
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    float a = attn[i];
    if (a > 0.f && a <= FLT_MAX && t->state[first + i] != CKV_STATE_RECYCLED) sum += a;
  }
  uint64_t live = t->n - cold;
  if (sum <= 0.0 || !live) return CKV_OK;
  const double floor = s->params.recall_attn * sum / (double)live;
  for (size_t i = 0; i < n; i++) {
    size_t p = first + i;
    float a = attn[i];
    if (!(a > 0.f && a <= FLT_MAX) || (double)a < floor || t->state[p] != CKV_STATE_RECYCLED ||
        t->block[p] == CKV_NO_BLOCK)
      continue;
    if (s->n_recall == s->cap_recall) {
      size_t ncap = s->cap_recall ? 2 * s->cap_recall : 64;
      uint32_t *nr = realloc(s->recall, ncap * sizeof(*nr));
      if (!nr) return -ENOMEM;
      s->recall = nr;
      s->cap_recall = ncap;
    }
    s->recall[s->n_recall++] = (uint32_t)p;
  }
  return CKV_OK;
}

void ckv_cold_figures_add(const ckv_srv_session *s, ckv_cold_figures *add) {
  const ckv_tokens *t = &s->tokens;
  for (size_t p = 0; p < t->n; p++) add->cold_tokens += t->state[p] == CKV_STATE_RECYCLED && t->block[p] != CKV_NO_BLOCK;
  for (uint32_t i = 0; i < s->n_blocks; i++)
    if (ckv_cold_block(s, i)) add->cold_bytes += s->blocks[i].bytes;
  add->dropped_tokens += s->tokens_dropped;
  add->recalled_tokens += s->tokens_recalled;
  add->recalled_blocks += s->recalled_blocks;
}
