/* session.c - a session's blocks, tokens and epochs (see session.h). */
#include "daemon/session.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "daemon/tenant.h"

#define DEFAULT_DRAFT_TOKENS 16u
#define DEFAULT_COMMIT_TOKENS 64u

int ckv_srv_session_check_geometry(ckv_geometry *g, uint32_t *draft_tokens, uint32_t *commit_tokens) {
  if (!g->n_layers || !g->n_kv_heads || !g->head_dim) return CKV_ERR_INVALID;
  if (g->dtype != CKV_DTYPE_FP16 && g->dtype != CKV_DTYPE_BF16) return CKV_ERR_INVALID;
  if (g->n_layers > CKV_MAX_LAYERS || g->n_kv_heads > CKV_MAX_KV_HEADS || g->head_dim > CKV_MAX_HEAD_DIM)
    return CKV_ERR_LIMIT;
  if (g->head_dim % 2) return CKV_ERR_INVALID; /* packing and RoPE pairs need even dims */
  if (!*draft_tokens) *draft_tokens = DEFAULT_DRAFT_TOKENS;
  if (!*commit_tokens) *commit_tokens = DEFAULT_COMMIT_TOKENS;
  if (*draft_tokens > CKV_MAX_BLOCK_TOKENS || *commit_tokens > CKV_MAX_BLOCK_TOKENS) return CKV_ERR_LIMIT;
  if (*commit_tokens < 32u) return CKV_ERR_LIMIT; /* per-channel key groups need >= 32 tokens */
  return CKV_OK;
}

int ckv_srv_session_new(const char *id, ckv_tenant *tenant, const ckv_geometry *g, uint32_t draft_tokens,
                    uint32_t commit_tokens, const char *policy, uint64_t *next_block_id, ckv_srv_session **ret) {
  ckv_srv_session *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  snprintf(s->id, sizeof(s->id), "%s", id);
  snprintf(s->policy, sizeof(s->policy), "%s", policy ? policy : "commitkv");
  s->tenant = tenant;
  s->geom = *g;
  s->draft_tokens = draft_tokens;
  s->commit_tokens = commit_tokens;
  s->cur_draft = CKV_NO_BLOCK;
  s->epoch = 1;
  s->acked_epoch = 0;
  s->next_block_id = next_block_id;
  ckv_tokens_init(&s->tokens);
  *ret = s;
  return CKV_OK;
}

static void block_release(ckv_srv_session *s, uint64_t offset, uint64_t bytes, uint8_t format) {
  ckv_tenant_block_free(s->tenant, offset, bytes, format);
}

ckv_srv_session *ckv_srv_session_free(ckv_srv_session *s) {
  if (!s) return NULL;
  for (size_t i = 0; i < s->n_blocks; i++)
    if (s->blocks[i].format != CKV_BLOCK_UNUSED)
      block_release(s, s->blocks[i].offset, s->blocks[i].bytes, s->blocks[i].format);
  ckv_srv_session_release_retired(s);
  ckv_tokens_done(&s->tokens);
  free(s->blocks);
  free(s->retired);
  free(s);
  return NULL;
}

/* Find or make a free entry in the block table. */
static int table_slot(ckv_srv_session *s, uint32_t *ret) {
  for (size_t i = 0; i < s->n_blocks; i++)
    if (s->blocks[i].format == CKV_BLOCK_UNUSED) {
      *ret = (uint32_t)i;
      return CKV_OK;
    }
  if (s->n_blocks == s->cap_blocks) {
    size_t ncap = s->cap_blocks ? s->cap_blocks * 2 : 16;
    ckv_sblock *nb = realloc(s->blocks, ncap * sizeof(*nb));
    if (!nb) return -ENOMEM;
    s->blocks = nb;
    s->cap_blocks = ncap;
  }
  s->blocks[s->n_blocks].format = CKV_BLOCK_UNUSED;
  *ret = (uint32_t)s->n_blocks++;
  return CKV_OK;
}

static void header_init(ckv_srv_session *s, ckv_sblock *b, void *base) {
  ckv_block_header *h = base;
  memset(base, 0, ckv_block_payload_offset(b->capacity)); /* header, positions, bitmap */
  h->format = b->format;
  h->dtype = (uint8_t)s->geom.dtype;
  h->capacity = b->capacity;
  h->kept_channels = s->geom.head_dim;
  h->generation = b->id;
  atomic_thread_fence(memory_order_release);
  h->magic = CKV_BLOCK_MAGIC;
}

/* Allocate a new draft block and make it current. */
static int new_draft_block(ckv_srv_session *s) {
  uint32_t idx;
  int r = table_slot(s, &idx);
  if (r < 0) return r;
  uint64_t bytes = ckv_draft_block_bytes(&s->geom, s->draft_tokens), off;
  r = ckv_tenant_block_alloc(s->tenant, bytes, CKV_FORMAT_DRAFT, &off);
  if (r < 0) return r;
  ckv_sblock *b = &s->blocks[idx];
  *b = (ckv_sblock){.id = ++*s->next_block_id, .offset = off, .bytes = bytes, .format = CKV_FORMAT_DRAFT,
                    .capacity = (uint16_t)s->draft_tokens};
  header_init(s, b, ckv_tenant_ptr(s->tenant, off));
  s->cur_draft = idx;
  s->epoch++; /* the block set changed */
  return CKV_OK;
}

size_t ckv_srv_session_max_runs(const ckv_srv_session *s, uint32_t count) { return count / s->draft_tokens + 2; }

int ckv_srv_session_append(ckv_srv_session *s, uint32_t count, const uint8_t *roles, const uint8_t *tags,
                       const float *semantic, const uint32_t *token_ids, ckv_slot_run *runs, size_t *ret_n_runs,
                       uint64_t *ret_first_position) {
  if (!count) return CKV_ERR_INVALID;
  /* Check room for every new block first, so a refusal changes nothing. */
  uint32_t room = s->cur_draft == CKV_NO_BLOCK ? 0 : s->blocks[s->cur_draft].capacity - s->blocks[s->cur_draft].used;
  uint64_t new_blocks = count > room ? (count - room + s->draft_tokens - 1) / s->draft_tokens : 0;
  uint64_t block_bytes = ckv_draft_block_bytes(&s->geom, s->draft_tokens);
  if (new_blocks && !ckv_tenant_would_fit(s->tenant, new_blocks * block_bytes)) return CKV_ERR_QUOTA;
  int r = ckv_tokens_reserve(&s->tokens, count);
  if (r < 0) return r;

  const uint64_t first = s->tokens.n;
  size_t n_runs = 0;
  for (uint32_t done = 0; done < count;) {
    if (s->cur_draft == CKV_NO_BLOCK || s->blocks[s->cur_draft].used == s->blocks[s->cur_draft].capacity) {
      r = new_draft_block(s);
      if (r < 0) return r; /* only on arena exhaustion, which would_fit rules out */
    }
    ckv_sblock *b = &s->blocks[s->cur_draft];
    uint8_t *base = ckv_tenant_ptr(s->tenant, b->offset);
    ckv_block_header *h = (ckv_block_header *)base;
    uint32_t *positions = (uint32_t *)(base + ckv_block_positions_offset());
    _Atomic uint64_t *bitmap = (_Atomic uint64_t *)(base + ckv_block_bitmap_offset(b->capacity));
    uint32_t take = b->capacity - b->used;
    if (take > count - done) take = count - done;
    runs[n_runs++] = (ckv_slot_run){.block = s->cur_draft, .first_slot = b->used, .count = take,
                                    .first_position = first + done};
    for (uint32_t i = 0; i < take; i++, done++) {
      uint16_t slot = b->used++;
      uint64_t pos = ckv_tokens_push(&s->tokens, roles ? roles[done] : 0, tags ? tags[done] : 0,
                                     semantic ? semantic[done] : -1.f, token_ids ? token_ids[done] : UINT32_MAX,
                                     s->cur_draft, slot);
      positions[slot] = (uint32_t)pos;
      atomic_fetch_or_explicit(&bitmap[slot / 64], 1ull << (slot % 64), memory_order_release);
      b->live++;
    }
    h->n_valid = b->live;
  }
  s->count_by_state[CKV_STATE_DRAFT] += count;
  *ret_n_runs = n_runs;
  *ret_first_position = first;
  return CKV_OK;
}

int ckv_srv_session_report_round(ckv_srv_session *s, uint64_t round, uint64_t first, const float *attn, size_t n,
                             const uint32_t *sem_pos, const float *sem_scores, size_t n_sem) {
  if (round <= s->last_round && s->rounds) return CKV_ERR_INVALID;
  if (round > UINT32_MAX) return CKV_ERR_RANGE;
  if (first > s->tokens.n || n > s->tokens.n - first) return CKV_ERR_RANGE;
  for (size_t i = 0; i < n_sem; i++)
    if (sem_pos[i] >= s->tokens.n) return CKV_ERR_RANGE;
  ckv_tokens_record_round(&s->tokens, (uint32_t)round, first, attn, n, 1e-4f);
  for (size_t i = 0; i < n_sem; i++) s->tokens.semantic[sem_pos[i]] = ckv_q16_from_unit(sem_scores[i]);
  s->rounds++;
  s->last_round = round;
  return CKV_OK;
}

void ckv_srv_session_retire_block(ckv_srv_session *s, uint32_t idx) {
  ckv_sblock *b = &s->blocks[idx];
  if (b->format == CKV_BLOCK_UNUSED) return;
  s->epoch++;
  if (s->cur_draft == idx) s->cur_draft = CKV_NO_BLOCK;
  ckv_retired rt = {.offset = b->offset, .bytes = b->bytes, .format = b->format, .epoch = s->epoch};
  b->format = CKV_BLOCK_UNUSED;
  if (s->owner == 0) { /* nobody can be reading: free now */
    block_release(s, rt.offset, rt.bytes, rt.format);
    return;
  }
  if (s->n_retired == s->cap_retired) {
    size_t ncap = s->cap_retired ? s->cap_retired * 2 : 16;
    ckv_retired *nr = realloc(s->retired, ncap * sizeof(*nr));
    if (!nr) { /* cannot defer: keep the memory until the session ends rather than free under a reader */
      b->format = rt.format;
      return;
    }
    s->retired = nr;
    s->cap_retired = ncap;
  }
  s->retired[s->n_retired++] = rt;
}

int ckv_srv_session_ack(ckv_srv_session *s, uint64_t epoch, uint64_t *ret_reclaimed) {
  if (epoch > s->epoch) return CKV_ERR_RANGE;
  if (epoch > s->acked_epoch) s->acked_epoch = epoch;
  uint64_t reclaimed = 0;
  size_t keep = 0;
  for (size_t i = 0; i < s->n_retired; i++) {
    ckv_retired *rt = &s->retired[i];
    if (rt->epoch <= s->acked_epoch) {
      block_release(s, rt->offset, rt->bytes, rt->format);
      reclaimed += rt->bytes;
    } else {
      s->retired[keep++] = *rt;
    }
  }
  s->n_retired = keep;
  if (ret_reclaimed) *ret_reclaimed = reclaimed;
  return CKV_OK;
}

uint64_t ckv_srv_session_release_retired(ckv_srv_session *s) {
  uint64_t reclaimed = 0;
  for (size_t i = 0; i < s->n_retired; i++) {
    block_release(s, s->retired[i].offset, s->retired[i].bytes, s->retired[i].format);
    reclaimed += s->retired[i].bytes;
  }
  s->n_retired = 0;
  return reclaimed;
}

uint64_t ckv_srv_session_bytes(const ckv_srv_session *s) {
  uint64_t total = 0;
  for (size_t i = 0; i < s->n_blocks; i++)
    if (s->blocks[i].format != CKV_BLOCK_UNUSED) total += s->blocks[i].bytes;
  for (size_t i = 0; i < s->n_retired; i++) total += s->retired[i].bytes;
  return total;
}

uint64_t ckv_srv_session_fp16_bytes(const ckv_srv_session *s) {
  uint64_t live = s->tokens.n - s->count_by_state[CKV_STATE_RECYCLED];
  return live * 2u * s->geom.n_layers * s->geom.n_kv_heads * s->geom.head_dim * 2u;
}
