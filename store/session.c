/* session.c - a session's blocks, tokens and epochs (see session.h). */
#include "store/session.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "store/blockmem.h"
#include "store/shared.h"
#include "store/tenant.h"
#include "kernels/kernels.h"

#define DEFAULT_DRAFT_TOKENS 16u
#define DEFAULT_COMMIT_TOKENS 32u

/* token id -> occurrences in this session (open addressing, power-of-two size) */
typedef struct idcount {
  uint32_t *keys; /* id + 1; 0 = empty */
  uint32_t *counts;
  size_t cap, n;
} idcount;

static uint32_t *idcount_slot(idcount *m, uint32_t id) {
  size_t mask = m->cap - 1, i = (id * 2654435761u) & mask;
  while (m->keys[i] && m->keys[i] != id + 1) i = (i + 1) & mask;
  return &m->keys[i];
}

/* Occurrences of `id` before this one (and counts it). -1 on allocation failure. */
static long idcount_bump(idcount *m, uint32_t id) {
  if ((m->n + 1) * 2 > m->cap) {
    idcount old = *m;
    size_t ncap = old.cap ? old.cap * 2 : 1024;
    m->keys = calloc(ncap, 4);
    m->counts = calloc(ncap, 4);
    if (!m->keys || !m->counts) {
      free(m->keys);
      free(m->counts);
      *m = old;
      return -1;
    }
    m->cap = ncap;
    m->n = 0;
    for (size_t i = 0; i < old.cap; i++)
      if (old.keys[i]) {
        uint32_t *k = idcount_slot(m, old.keys[i] - 1);
        *k = old.keys[i];
        m->counts[k - m->keys] = old.counts[i];
        m->n++;
      }
    free(old.keys);
    free(old.counts);
  }
  uint32_t *k = idcount_slot(m, id);
  size_t i = (size_t)(k - m->keys);
  if (!*k) {
    *k = id + 1;
    m->n++;
  }
  return (long)m->counts[i]++;
}

int ckv_srv_session_check_geometry(ckv_geometry *g, uint32_t *draft_tokens, uint32_t *commit_tokens) {
  if (!g->n_layers || !g->n_kv_heads || !g->head_dim) return CKV_ERR_INVALID;
  if (g->dtype != CKV_DTYPE_FP16 && g->dtype != CKV_DTYPE_BF16) return CKV_ERR_INVALID;
  if (g->n_layers > CKV_MAX_LAYERS || g->n_kv_heads > CKV_MAX_KV_HEADS || g->head_dim > CKV_MAX_HEAD_DIM)
    return CKV_ERR_LIMIT;
  if (g->head_dim % 2) return CKV_ERR_INVALID; /* packing and RoPE pairs need even dims */
  if (!*draft_tokens) *draft_tokens = DEFAULT_DRAFT_TOKENS;
  if (!*commit_tokens) *commit_tokens = DEFAULT_COMMIT_TOKENS;
  if (*draft_tokens > CKV_MAX_BLOCK_TOKENS || *commit_tokens > CKV_MAX_BLOCK_TOKENS) return CKV_ERR_LIMIT;
  /* per-channel key groups need >= 32 tokens; committed blocks hold whole chunks */
  if (*commit_tokens < CKV_COMMIT_CHUNK_TOKENS || *commit_tokens % CKV_COMMIT_CHUNK_TOKENS) return CKV_ERR_LIMIT;
  return CKV_OK;
}

int ckv_srv_session_new(const char *id, ckv_tenant *tenant, const ckv_geometry *g, uint32_t draft_tokens,
                        uint32_t commit_tokens, const char *policy, const ckv_judge_params *params,
                        uint64_t *next_block_id, ckv_srv_session **ret) {
  ckv_srv_session *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->ids = calloc(1, sizeof(*s->ids));
  if (!s->ids) {
    free(s);
    return -ENOMEM;
  }
  snprintf(s->id, sizeof(s->id), "%s", id);
  snprintf(s->policy, sizeof(s->policy), "%s", policy ? policy : "commitkv");
  s->tenant = tenant;
  s->geom = *g;
  s->draft_tokens = draft_tokens;
  /* Staged blocks as large as committed ones: a partly filled staged block
   * is the one block per session this format wastes, so it should not be larger. */
  s->staged_tokens = commit_tokens;
  s->commit_tokens = commit_tokens;
  if (params) s->params = *params;
  for (int i = 0; i < CKV_FILL_COUNT; i++) s->fill[i] = CKV_NO_BLOCK;
  s->epoch = 1;
  s->next_block_id = next_block_id;
  ckv_tokens_init(&s->tokens);
  *ret = s;
  return CKV_OK;
}

static void dirty_unlist(ckv_srv_session *s) {
  if (!s->dirty_listed) return;
  if (s->dirty_prev)
    s->dirty_prev->dirty_next = s->dirty_next;
  else
    *s->dirty_head = s->dirty_next;
  if (s->dirty_next) s->dirty_next->dirty_prev = s->dirty_prev;
  s->dirty_prev = s->dirty_next = NULL;
  s->dirty_listed = false;
}

static void drop_meta(ckv_sblock *b) {
  free(b->meta);
  b->meta = NULL;
}

/* A block leaves this session for good: back to the allocator, or, when it
 * is shared (prefix.h), one holder fewer. */
static void give_back(ckv_srv_session *s, uint64_t offset, uint64_t bytes, uint32_t format, ckv_pblock *pb) {
  if (pb)
    ckv_prefix_unref(s->tenant, pb);
  else
    ckv_tenant_block_free(s->tenant, offset, bytes, format);
}

ckv_srv_session *ckv_srv_session_free(ckv_srv_session *s) {
  if (!s) return NULL;
  if (s->swap && s->swap_abandon) s->swap_abandon(s); /* a compression never published (the daemon stops) */
  for (size_t i = 0; i < s->n_blocks; i++) {
    if (s->blocks[i].format != CKV_BLOCK_UNUSED) {
      if (s->blocks[i].shared) ckv_shared_user_del(s->blocks[i].shared, s, (uint32_t)i);
      give_back(s, s->blocks[i].offset, s->blocks[i].bytes, s->blocks[i].format, s->blocks[i].shared);
    }
    drop_meta(&s->blocks[i]);
  }
  dirty_unlist(s);
  free(s->dirty);
  ckv_srv_session_release_retired(s);
  ckv_prefix_chain_free(s->chain);
  ckv_tokens_done(&s->tokens);
  if (s->ids) {
    free(s->ids->keys);
    free(s->ids->counts);
    free(s->ids);
  }
  free(s->blocks);
  free(s->free_idx);
  free(s->retired);
  free(s->recall);
  free(s);
  return NULL;
}

uint64_t ckv_srv_session_evict_blocks(ckv_srv_session *s) {
  uint64_t freed = ckv_srv_session_release_retired(s);
  for (size_t i = 0; i < s->n_blocks; i++) {
    if (s->blocks[i].format != CKV_BLOCK_UNUSED) {
      /* a shared block stays for its other holders: it frees nothing here */
      if (!s->blocks[i].shared || s->blocks[i].shared->holders == 1) freed += s->blocks[i].bytes;
      if (s->blocks[i].shared) ckv_shared_user_del(s->blocks[i].shared, s, (uint32_t)i);
      give_back(s, s->blocks[i].offset, s->blocks[i].bytes, s->blocks[i].format, s->blocks[i].shared);
    }
    drop_meta(&s->blocks[i]);
    s->blocks[i].shared = NULL;
    s->blocks[i].format = CKV_BLOCK_UNUSED;
  }
  dirty_unlist(s);
  s->n_dirty = 0;
  s->n_blocks = 0;
  s->n_free_idx = 0;
  for (int i = 0; i < CKV_FILL_COUNT; i++) s->fill[i] = CKV_NO_BLOCK;
  return freed;
}

void *ckv_srv_session_block_ptr(const ckv_srv_session *s, uint32_t index) {
  return ckv_tenant_ptr(s->tenant, s->blocks[index].offset);
}

/* Notes block `index` as dirty (once) and the session on the daemon's list. */
static void mark_dirty(ckv_srv_session *s, uint32_t index, uint8_t state) {
  ckv_sblock *b = &s->blocks[index];
  if (b->meta_state == CKV_META_CLEAN) s->dirty[s->n_dirty++] = index; /* room: cap_blocks */
  if (state > b->meta_state) b->meta_state = state;
  if (!s->dirty_listed && s->dirty_head) {
    s->dirty_prev = NULL;
    s->dirty_next = *s->dirty_head;
    if (s->dirty_next) s->dirty_next->dirty_prev = s;
    *s->dirty_head = s;
    s->dirty_listed = true;
  }
}

void *ckv_srv_session_block_meta(ckv_srv_session *s, uint32_t index) {
  mark_dirty(s, index, CKV_META_DIRTY);
  return s->blocks[index].meta;
}

const ckv_block_header *ckv_srv_session_block_header(const ckv_srv_session *s, uint32_t index) {
  return (const ckv_block_header *)s->blocks[index].meta;
}

int ckv_srv_session_flush_meta(ckv_srv_session *s) {
  if (!s->n_dirty) {
    dirty_unlist(s);
    return CKV_OK;
  }
  ckv_meta_write stack[32], *w = s->n_dirty <= 32 ? stack : malloc(s->n_dirty * sizeof(*w));
  if (!w) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < s->n_dirty; i++) {
    const ckv_sblock *b = &s->blocks[s->dirty[i]];
    if (b->format == CKV_BLOCK_UNUSED || !b->meta) continue; /* retired since: nothing to write */
    if (ckv_pblock_frozen(b->shared)) continue; /* shared: read-only to every session (never dirtied) */
    uint64_t head = ckv_block_payload_offset(b->capacity);
    /* A new committed block's payload starts with its seal word and channel
     * masks, which must read zero (ckv_block_init); draft and staged payloads
     * are written before any slot of them is valid. */
    bool fresh = b->meta_state == CKV_META_FRESH;
    uint64_t zero = fresh && ckv_format_is_commit(b->format) ? b->bytes - head
                    : fresh && ckv_format_is_rot(b->format)  ? ckv_rot_sections_offset(&s->geom, b->capacity) - head
                                                             : 0; /* rotated: the meta word and key means */
    w[n++] = (ckv_meta_write){.offset = b->offset, .src = b->meta, .bytes = head, .zero_bytes = zero};
  }
  int r = n ? s->tenant->mem->write(ckv_tenant_ptr(s->tenant, 0), w, n) : CKV_OK;
  if (w != stack) free(w);
  if (r < 0) return r;
  for (size_t i = 0; i < s->n_dirty; i++) s->blocks[s->dirty[i]].meta_state = CKV_META_CLEAN;
  s->n_dirty = 0;
  dirty_unlist(s);
  return CKV_OK;
}

int ckv_srv_session_flush_all_meta(ckv_srv_session **head) {
  int first = CKV_OK;
  for (ckv_srv_session *s = *head, *next; s; s = next) {
    next = s->dirty_next;
    int r = ckv_srv_session_flush_meta(s);
    if (r < 0 && first == CKV_OK) first = r;
  }
  return first;
}

/* Find or make a free entry in the block table. */
static int table_slot(ckv_srv_session *s, uint32_t *ret) {
  while (s->n_free_idx) {
    uint32_t i = s->free_idx[--s->n_free_idx];
    if (i < s->n_blocks && s->blocks[i].format == CKV_BLOCK_UNUSED) {
      *ret = i;
      return CKV_OK;
    }
  }
  if (s->n_blocks == s->cap_blocks) {
    size_t ncap = s->cap_blocks ? s->cap_blocks * 2 : 16;
    ckv_sblock *nb = realloc(s->blocks, ncap * sizeof(*nb));
    if (!nb) return -ENOMEM;
    s->blocks = nb;
    uint32_t *nf = realloc(s->free_idx, ncap * sizeof(*nf));
    if (!nf) return -ENOMEM;
    s->free_idx = nf;
    uint32_t *nd = realloc(s->dirty, ncap * sizeof(*nd));
    if (!nd) return -ENOMEM;
    s->dirty = nd;
    s->cap_blocks = ncap;
  }
  s->blocks[s->n_blocks] = (ckv_sblock){.format = CKV_BLOCK_UNUSED, .meta_state = CKV_META_CLEAN};
  *ret = (uint32_t)s->n_blocks++;
  return CKV_OK;
}

static uint32_t capacity_of(const ckv_srv_session *s, uint32_t format) {
  return format == CKV_FORMAT_DRAFT ? s->draft_tokens : format == CKV_FORMAT_STAGED ? s->staged_tokens
                                                                                    : s->commit_tokens;
}

static uint32_t kept_of(const ckv_srv_session *s, uint32_t format) {
  if (!ckv_format_is_commit(format)) return 0;
  double keep = s->params.prune_keep > 0.f && s->params.prune_keep < 1.f ? s->params.prune_keep : 1.0;
  uint32_t k = (uint32_t)lround(keep * s->geom.head_dim);
  return k < 1 ? 1 : k > s->geom.head_dim ? s->geom.head_dim : k;
}

static uint64_t block_bytes(const ckv_srv_session *s, uint32_t format) {
  return ckv_format_block_bytes(format, &s->geom, capacity_of(s, format), kept_of(s, format));
}

int ckv_srv_session_new_block(ckv_srv_session *s, uint32_t format, uint32_t *ret_index) {
  uint32_t idx;
  int r = table_slot(s, &idx);
  if (r < 0) return r;
  uint64_t bytes = block_bytes(s, format), off;
  if (!bytes) {
    s->free_idx[s->n_free_idx++] = idx;
    return CKV_ERR_INVALID;
  }
  r = ckv_tenant_block_alloc(s->tenant, bytes, format, &off);
  if (r < 0) {
    s->free_idx[s->n_free_idx++] = idx; /* the entry stays unused */
    return r;
  }
  ckv_sblock *b = &s->blocks[idx];
  uint8_t meta_state = b->meta_state; /* a retired entry may still sit on the dirty list */
  uint8_t *meta = NULL;
  uint32_t capacity = capacity_of(s, format);
  if (!(meta = malloc(ckv_block_payload_offset(capacity)))) {
    ckv_tenant_block_free(s->tenant, off, bytes, format);
    s->free_idx[s->n_free_idx++] = idx;
    return -ENOMEM;
  }
  *b = (ckv_sblock){.id = ++*s->next_block_id, .offset = off, .bytes = bytes, .format = (uint8_t)format,
                    .capacity = (uint16_t)capacity, .meta_state = meta_state, .meta = meta};
  r = ckv_block_init_header(meta, format, &s->geom, capacity, kept_of(s, format), b->id);
  if (r < 0) { /* cannot happen for a checked geometry; never leak the block */
    ckv_tenant_block_free(s->tenant, off, bytes, format);
    drop_meta(b);
    b->format = CKV_BLOCK_UNUSED;
    s->free_idx[s->n_free_idx++] = idx;
    return r;
  }
  mark_dirty(s, idx, CKV_META_FRESH); /* the flush also zeroes the payload's committed meta */
  s->epoch++; /* the block set changed */
  *ret_index = idx;
  return CKV_OK;
}

int ckv_srv_session_restore_block(ckv_srv_session *s, uint32_t index, uint32_t format) {
  if (format >= CKV_FORMAT_COUNT_) return CKV_ERR_INVALID;
  while (s->n_blocks <= index) { /* grow the table with unused entries */
    uint32_t idx;
    s->n_free_idx = 0; /* rebuilt by ckv_srv_session_restore_free_list */
    int r = table_slot(s, &idx);
    if (r < 0) return r;
  }
  ckv_sblock *b = &s->blocks[index];
  if (b->format != CKV_BLOCK_UNUSED) return CKV_ERR_INVALID;
  uint64_t bytes = block_bytes(s, format), off;
  uint32_t capacity = capacity_of(s, format);
  if (!bytes) return CKV_ERR_INVALID;
  int r = ckv_tenant_block_alloc(s->tenant, bytes, format, &off);
  if (r < 0) return r;
  uint8_t *meta = malloc(ckv_block_payload_offset(capacity));
  if (!meta) {
    ckv_tenant_block_free(s->tenant, off, bytes, format);
    return -ENOMEM;
  }
  *b = (ckv_sblock){.id = ++*s->next_block_id, .offset = off, .bytes = bytes, .format = (uint8_t)format,
                    .capacity = (uint16_t)capacity, .meta_state = CKV_META_CLEAN, .meta = meta};
  r = ckv_block_init_header(meta, format, &s->geom, capacity, kept_of(s, format), b->id);
  if (r < 0) {
    ckv_tenant_block_free(s->tenant, off, bytes, format);
    drop_meta(b);
    b->format = CKV_BLOCK_UNUSED;
    return r;
  }
  mark_dirty(s, index, CKV_META_DIRTY);
  s->epoch++;
  return CKV_OK;
}

int ckv_srv_session_link_block(ckv_srv_session *s, ckv_pblock *pb, uint32_t index, uint32_t *ret_index) {
  uint32_t idx = index;
  int r;
  if (index == CKV_NO_BLOCK) {
    if ((r = table_slot(s, &idx)) < 0) return r;
  } else {
    while (s->n_blocks <= index) { /* restore: grow the table with unused entries */
      s->n_free_idx = 0; /* rebuilt by ckv_srv_session_restore_free_list */
      if ((r = table_slot(s, &idx)) < 0) return r;
    }
    idx = index;
    if (s->blocks[idx].format != CKV_BLOCK_UNUSED) return CKV_ERR_INVALID;
  }
  size_t head = ckv_block_payload_offset(pb->capacity);
  uint8_t *meta = malloc(head);
  if (!meta) {
    if (index == CKV_NO_BLOCK) s->free_idx[s->n_free_idx++] = idx;
    return -ENOMEM;
  }
  memcpy(meta, pb->meta, head);
  ckv_sblock *b = &s->blocks[idx];
  uint8_t meta_state = b->meta_state; /* a retired entry may still sit on the dirty list */
  if (ckv_shared_user_add(pb, s, idx) < 0) {
    free(meta);
    if (index == CKV_NO_BLOCK) s->free_idx[s->n_free_idx++] = idx;
    return -ENOMEM;
  }
  *b = (ckv_sblock){.id = pb->id, .offset = pb->offset, .bytes = pb->bytes, .format = pb->format,
                    .capacity = pb->capacity, .used = pb->capacity, .refs = pb->capacity,
                    .meta_state = meta_state, .meta = meta, .shared = pb};
  ckv_prefix_hold(s->tenant, pb);
  s->epoch++; /* the block set changed */
  *ret_index = idx;
  return CKV_OK;
}

void ckv_srv_session_restore_free_list(ckv_srv_session *s) {
  s->n_free_idx = 0;
  for (size_t i = s->n_blocks; i-- > 0;)
    if (s->blocks[i].format == CKV_BLOCK_UNUSED) s->free_idx[s->n_free_idx++] = (uint32_t)i;
}

int ckv_srv_session_id_counts(const ckv_srv_session *s, uint32_t **ret_pairs, size_t *ret_n) {
  *ret_pairs = NULL;
  *ret_n = 0;
  if (!s->ids->n) return CKV_OK;
  uint32_t *v = malloc(s->ids->n * 2 * sizeof(*v));
  if (!v) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < s->ids->cap; i++)
    if (s->ids->keys[i]) {
      v[2 * n] = s->ids->keys[i] - 1;
      v[2 * n + 1] = s->ids->counts[i];
      n++;
    }
  *ret_pairs = v;
  *ret_n = n;
  return CKV_OK;
}

int ckv_srv_session_set_id_count(ckv_srv_session *s, uint32_t id, uint32_t count) {
  if (id == UINT32_MAX) return CKV_ERR_INVALID; /* keys are id + 1 */
  if (idcount_bump(s->ids, id) < 0) return -ENOMEM; /* makes the entry (and room) */
  s->ids->counts[idcount_slot(s->ids, id) - s->ids->keys] = count;
  return CKV_OK;
}

size_t ckv_srv_session_max_runs(const ckv_srv_session *s, uint32_t count) { return count / s->draft_tokens + 2; }

uint64_t ckv_srv_session_append_bytes(const ckv_srv_session *s, uint32_t count) {
  uint32_t cur = s->fill[CKV_FILL_DRAFT];
  uint32_t room = cur == CKV_NO_BLOCK || s->blocks[cur].shared ? 0 : s->blocks[cur].capacity - s->blocks[cur].used;
  uint64_t new_blocks = count > room ? (count - room + s->draft_tokens - 1) / s->draft_tokens : 0;
  return new_blocks * block_bytes(s, CKV_FORMAT_DRAFT);
}

static float estimate_semantic(ckv_srv_session *s, const uint32_t *token_ids, uint32_t i) {
  /* Without a score from the worker: rarity of the token id in this session
   * (1 for a first occurrence, 1/(1+k/8) after k earlier ones), so templated
   * filler that repeats scores low.  Without ids either: a neutral 0.5. */
  if (!token_ids || !s->params.semantic_estimate_enabled) return 0.5f;
  long seen = idcount_bump(s->ids, token_ids[i]);
  return seen < 0 ? 0.5f : 1.0f / (1.0f + (float)seen / 8.0f);
}

int ckv_srv_session_append(ckv_srv_session *s, uint32_t count, const uint8_t *roles, const uint8_t *tags,
                           const float *semantic, const uint32_t *token_ids, ckv_slot_run *runs, size_t *ret_n_runs,
                           uint64_t *ret_first_position) {
  if (!count) return CKV_ERR_INVALID;
  /* Check room for every new block first, so a refusal changes nothing. */
  uint64_t need = ckv_srv_session_append_bytes(s, count);
  if (need && !ckv_tenant_would_fit(s->tenant, need)) return CKV_ERR_QUOTA;
  int r = ckv_tokens_reserve(&s->tokens, count);
  if (r < 0) return r;

  const uint64_t first = s->tokens.n;
  size_t n_runs = 0;
  for (uint32_t done = 0; done < count;) {
    uint32_t cur = s->fill[CKV_FILL_DRAFT];
    /* a shared block is never written: appends go to a block of our own */
    if (cur == CKV_NO_BLOCK || s->blocks[cur].used == s->blocks[cur].capacity || s->blocks[cur].shared) {
      uint32_t idx;
      r = ckv_srv_session_new_block(s, CKV_FORMAT_DRAFT, &idx);
      if (r < 0) return r; /* only on arena exhaustion, which would_fit rules out */
      s->fill[CKV_FILL_DRAFT] = idx;
      if (cur != CKV_NO_BLOCK && s->blocks[cur].refs == 0) ckv_srv_session_retire_block(s, cur);
      cur = idx;
    }
    ckv_sblock *b = &s->blocks[cur];
    uint8_t *base = ckv_srv_session_block_meta(s, cur);
    uint32_t *positions = ckv_block_positions(base);
    uint32_t take = b->capacity - b->used;
    if (take > count - done) take = count - done;
    runs[n_runs++] = (ckv_slot_run){.block = cur, .first_slot = b->used, .count = take, .first_position = first + done};
    for (uint32_t i = 0; i < take; i++, done++) {
      uint16_t slot = b->used++;
      float sem = semantic ? semantic[done] : estimate_semantic(s, token_ids, done);
      uint64_t pos = ckv_tokens_push(&s->tokens, roles ? roles[done] : 0, tags ? tags[done] : 0, sem,
                                     (uint32_t)s->last_round, cur, slot);
      if (!semantic) s->tokens.flags[pos] &= (uint8_t)~CKV_TOKEN_SEM_GIVEN;
      else s->semantic_given++;
      positions[slot] = (uint32_t)pos;
      ckv_block_set_valid(base, slot, true);
      b->refs++;
    }
  }
  s->count_by_state[CKV_STATE_DRAFT] += count;
  *ret_n_runs = n_runs;
  *ret_first_position = first;
  return CKV_OK;
}

int ckv_srv_session_report_round(ckv_srv_session *s, uint64_t round, uint64_t first, const float *attn, size_t n,
                                 const uint32_t *sem_pos, const float *sem_scores, size_t n_sem) {
  if (round <= s->last_round) return CKV_ERR_INVALID;
  if (round > UINT32_MAX) return CKV_ERR_RANGE;
  if (first > s->tokens.n || n > s->tokens.n - first) return CKV_ERR_RANGE;
  for (size_t i = 0; i < n_sem; i++)
    if (sem_pos[i] >= s->tokens.n) return CKV_ERR_RANGE;
  ckv_tokens_record_round(&s->tokens, (uint32_t)round, first, attn, n,
                          s->tokens.n - s->count_by_state[CKV_STATE_RECYCLED]);
  for (size_t i = 0; i < n_sem; i++) {
    s->tokens.semantic[sem_pos[i]] = ckv_q16_from_unit(sem_scores[i]);
    if (!(s->tokens.flags[sem_pos[i]] & CKV_TOKEN_SEM_GIVEN)) s->semantic_given++; /* each token once */
    s->tokens.flags[sem_pos[i]] |= CKV_TOKEN_SEM_GIVEN;
  }
  s->rounds++;
  s->last_round = round;
  s->reported_tokens = s->tokens.n;
  return CKV_OK;
}

static bool is_filling(const ckv_srv_session *s, uint32_t idx) {
  const ckv_sblock *b = &s->blocks[idx];
  if (b->used >= b->capacity) return false;
  for (int i = 0; i < CKV_FILL_COUNT; i++)
    if (s->fill[i] == idx) return true;
  return false;
}

void ckv_srv_session_release_slot(ckv_srv_session *s, uint32_t idx) {
  ckv_sblock *b = &s->blocks[idx];
  if (b->refs) b->refs--;
  if (b->refs == 0 && !is_filling(s, idx)) ckv_srv_session_retire_block(s, idx);
}

void ckv_srv_session_retire_block(ckv_srv_session *s, uint32_t idx) {
  ckv_sblock *b = &s->blocks[idx];
  if (b->format == CKV_BLOCK_UNUSED) return;
  s->epoch++;
  for (int i = 0; i < CKV_FILL_COUNT; i++)
    if (s->fill[i] == idx) s->fill[i] = CKV_NO_BLOCK;
  ckv_retired rt = {.offset = b->offset, .bytes = b->bytes, .format = b->format, .epoch = s->epoch, .shared = b->shared};
  if (b->shared) ckv_shared_user_del(b->shared, s, idx); /* a retired entry holds it from here on */
  if (s->n_free_idx < s->cap_blocks) s->free_idx[s->n_free_idx++] = idx;
  if (s->owner == 0) { /* nobody can be reading: free now */
    drop_meta(b);
    b->format = CKV_BLOCK_UNUSED;
    b->shared = NULL;
    give_back(s, rt.offset, rt.bytes, rt.format, rt.shared);
    return;
  }
  if (s->n_retired == s->cap_retired) {
    size_t ncap = s->cap_retired ? s->cap_retired * 2 : 16;
    ckv_retired *nr = realloc(s->retired, ncap * sizeof(*nr));
    if (!nr) { /* cannot defer: keep the block (until the session ends) rather than free under a reader */
      s->n_free_idx--;
      if (rt.shared) (void)ckv_shared_user_add(rt.shared, s, idx);
      return;
    }
    s->retired = nr;
    s->cap_retired = ncap;
  }
  drop_meta(b); /* the daemon writes a retired block no more */
  b->format = CKV_BLOCK_UNUSED;
  b->shared = NULL; /* the retired entry holds it now */
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
      if (!rt->shared || rt->shared->holders == 1) reclaimed += rt->bytes;
      give_back(s, rt->offset, rt->bytes, rt->format, rt->shared);
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
    const ckv_retired *rt = &s->retired[i];
    if (!rt->shared || rt->shared->holders == 1) reclaimed += rt->bytes;
    give_back(s, rt->offset, rt->bytes, rt->format, rt->shared);
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
  /* Every token appended, recycled ones included: what an uncompressed cache
   * of this session would hold, so eviction policies compare fairly. */
  return (uint64_t)s->tokens.n * 2u * s->geom.n_layers * s->geom.n_kv_heads * s->geom.head_dim * 2u;
}

void ckv_srv_session_figures(const ckv_srv_session *s, uint64_t tok4[4], uint64_t bytes5[5]) {
  for (int i = 0; i < 4; i++) tok4[i] += s->count_by_state[i];
  for (size_t i = 0; i < s->n_blocks; i++) {
    const ckv_sblock *b = &s->blocks[i];
    if (b->format == CKV_BLOCK_UNUSED) continue;
    bytes5[b->format == CKV_FORMAT_DRAFT ? 0 : b->format == CKV_FORMAT_STAGED ? 1 : 2] += b->bytes;
  }
  bytes5[3] += ckv_srv_session_bytes(s);
  bytes5[4] += ckv_srv_session_fp16_bytes(s);
}
