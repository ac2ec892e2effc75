/* session_snap.c - a live session to a snapshot and back (see session_snap.h). */
#include "common/fail.h"
#include "persist/session_snap.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commitkv/status.h"
#include "store/blockmem.h"
#include "store/session.h"
#include "store/prefix.h"
#include "store/shared.h"
#include "persist/snapshot.h"
#include "store/tenant.h"
#include "lifecycle/policy.h"
#include "shm/arena.h"
#include "shm/slab.h"

static uint64_t realtime_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Copies the token columns (the snapshot may change states: committed_only). */
static int copy_tokens(const ckv_tokens *src, ckv_tokens *dst) {
  ckv_tokens_init(dst);
  return ckv_tokens_append_rows(dst, src);
}

/* How a capture holds each block's payload. */
typedef enum {
  CAPTURE_COPY,   /* copied into the snapshot's buffer */
  CAPTURE_REFS,   /* not at all: a warm-restart journal entry (the payload stays in the kept arena) */
  CAPTURE_PINNED, /* read in place from the arena (the tenant pinned), fill blocks copied */
} capture_mode;

/* Whether block i is one the session still writes into (a fill block). */
static bool filling(const ckv_srv_session *s, size_t i) {
  for (int f = 0; f < CKV_FILL_COUNT; f++)
    if (s->fill[f] == i) return true;
  return false;
}

/* Whether a capture copies block i's payload: always for a copy; pinned,
 * only for the blocks still being filled (by the worker or the compressor:
 * every other block's payload is fixed until it is freed, and a pinned
 * tenant frees nothing). */
static bool copies_payload(const ckv_srv_session *s, capture_mode mode, size_t i) {
  return mode == CAPTURE_COPY || (mode == CAPTURE_PINNED && filling(s, i));
}

static int capture(const ckv_srv_session *s, bool committed_only, capture_mode mode, ckv_snap *ret,
                   uint64_t *ret_tokens, char *err, size_t errlen) {
  const bool refs = mode == CAPTURE_REFS;
  if (s->tenant->mem != &ckv_blockmem_host)
    return ckv_fail(err, errlen, CKV_ERR_UNSUPPORTED, "snapshots need a host arena (this tenant's memory is %s)",
                s->tenant->mem->name);
  if (s->jobs_inflight) return ckv_fail(err, errlen, CKV_ERR_BUSY, "moves of session '%s' are in flight", s->id);
  ckv_snap snap;
  memset(&snap, 0, sizeof snap);
  snprintf(snap.tenant, sizeof snap.tenant, "%s", s->tenant->name);
  snprintf(snap.session_id, sizeof snap.session_id, "%s", s->id);
  snprintf(snap.model_id, sizeof snap.model_id, "%s", s->model_id);
  snprintf(snap.model_revision, sizeof snap.model_revision, "%s", s->model_revision);
  snprintf(snap.policy, sizeof snap.policy, "%s", s->policy);
  snap.saved_at_ms = realtime_ms();
  snap.flags = committed_only ? CKV_SNAP_COMMITTED_ONLY : 0;
  snap.geom = s->geom;
  snap.draft_tokens = s->draft_tokens;
  snap.staged_tokens = s->staged_tokens;
  snap.commit_tokens = s->commit_tokens;
  snap.params = s->params;
  snap.params.mlp = NULL;
  snap.params_mlp = s->params.mlp != NULL;
  snap.epoch = s->epoch;
  snap.incarnation = s->incarnation;
  snap.rounds = s->rounds;
  snap.last_round = s->last_round;
  snap.semantic_given = s->semantic_given;
  memcpy(snap.count_by_state, s->count_by_state, sizeof snap.count_by_state);
  memcpy(snap.transitions, s->transitions, sizeof snap.transitions);
  for (int f = 0; f < CKV_FORMAT_COUNT_; f++) snap.fill[f] = f < CKV_FILL_COUNT ? s->fill[f] : CKV_NO_BLOCK;
  snap.n_table = (uint32_t)s->n_blocks;
  int r = copy_tokens(&s->tokens, &snap.tokens);
  if (r == CKV_OK) r = ckv_srv_session_id_counts(s, &snap.ids, &snap.n_ids);
  bool *keep = calloc(s->n_blocks ? s->n_blocks : 1, sizeof(*keep));
  snap.blocks = calloc(s->n_blocks ? s->n_blocks : 1, sizeof(*snap.blocks));
  if (r < 0 || !keep || !snap.blocks) {
    r = ckv_fail(err, errlen, -ENOMEM, "out of memory building the snapshot");
    goto out;
  }
  ckv_tokens *t = &snap.tokens;
  for (size_t p = 0; p < t->n; p++) {
    if (t->flags[p] & CKV_TOKEN_PENDING) {
      r = ckv_fail(err, errlen, CKV_ERR_BUSY, "token %zu of session '%s' is being moved", p, s->id);
      goto out;
    }
    if (committed_only && t->state[p] != CKV_STATE_COMMITTED && t->state[p] != CKV_STATE_RECYCLED) {
      /* not kept: recycled in the snapshot, and counted so the restore can say it */
      snap.count_by_state[t->state[p]]--;
      snap.count_by_state[CKV_STATE_RECYCLED]++;
      t->state[p] = CKV_STATE_RECYCLED;
      t->block[p] = CKV_NO_BLOCK;
      snap.dropped_tokens++;
    }
    if (t->block[p] != CKV_NO_BLOCK && t->block[p] < s->n_blocks) keep[t->block[p]] = true;
  }
  /* Every kept block's bytes are copied into one buffer (the snapshot owns
   * it as buf_): the file is written later, on the I/O thread, while the
   * session goes on changing; the copy is the session as of now. */
  uint64_t total = 0;
  for (size_t i = 0; i < s->n_blocks; i++) {
    const ckv_sblock *b = &s->blocks[i];
    if (b->format == CKV_BLOCK_UNUSED) continue;
    if (!committed_only) keep[i] = true;
    if (keep[i]) total += copies_payload(s, mode, i) ? b->bytes : ckv_block_payload_offset(b->capacity);
  }
  if (!(snap.buf_ = malloc(total ? total : 1))) {
    r = ckv_fail(err, errlen, -ENOMEM, "out of memory copying %llu bytes of blocks", (unsigned long long)total);
    goto out;
  }
  snap.buf_len_ = total;
  uint8_t *at = snap.buf_;
  for (size_t i = 0; i < s->n_blocks; i++) {
    const ckv_sblock *b = &s->blocks[i];
    if (b->format == CKV_BLOCK_UNUSED) continue;
    if (!keep[i]) {
      for (int f = 0; f < CKV_FORMAT_COUNT_; f++)
        if (snap.fill[f] == i) snap.fill[f] = CKV_NO_BLOCK;
      continue;
    }
    size_t head = ckv_block_payload_offset(b->capacity);
    /* the header region from the daemon's private shadow, the payload from the arena */
    memcpy(at, b->meta, head);
    const uint8_t *arena_payload = (const uint8_t *)ckv_tenant_ptr(s->tenant, b->offset) + head;
    bool copied = copies_payload(s, mode, i);
    if (copied) memcpy(at + head, arena_payload, b->bytes - head);
    if (committed_only) { /* the valid bits of the tokens not kept are cleared in the copy */
      const uint32_t *pos = ckv_block_positions_const(at);
      for (uint32_t slot = 0; slot < b->capacity; slot++)
        if (ckv_block_slot_valid(at, slot) &&
            (pos[slot] >= t->n || t->block[pos[slot]] != i || t->slot[pos[slot]] != slot))
          ckv_block_set_valid(at, slot, false);
    }
    const ckv_block_header *h = (const ckv_block_header *)b->meta;
    snap.blocks[snap.n_blocks++] = (ckv_snap_block){
        .index = (uint32_t)i, .format = b->format, .capacity = b->capacity, .used = b->used,
        .kept = ckv_format_is_commit(b->format) ? h->kept_channels : 0, .bytes = b->bytes, .meta = at,
        .payload = copied ? at + head : refs ? NULL : arena_payload};
    at += copied ? b->bytes : head;
  }
  uint64_t live = 0;
  for (size_t p = 0; p < t->n; p++) live += t->state[p] != CKV_STATE_RECYCLED;
  if (ret_tokens) *ret_tokens = live;
  free(keep);
  *ret = snap;
  return CKV_OK;
out:
  free(keep);
  ckv_snap_done(&snap);
  return r;
}

int ckv_session_snap_capture(const ckv_srv_session *s, bool committed_only, ckv_snap *ret, uint64_t *ret_tokens,
                             char *err, size_t errlen) {
  return capture(s, committed_only, CAPTURE_COPY, ret, ret_tokens, err, errlen);
}

int ckv_session_snap_capture_pinned(const ckv_srv_session *s, bool committed_only, ckv_snap *ret,
                                    uint64_t *ret_tokens, char *err, size_t errlen) {
  int r = capture(s, committed_only, CAPTURE_PINNED, ret, ret_tokens, err, errlen);
  if (r == CKV_OK) ckv_tenant_pin(s->tenant);
  return r;
}

int ckv_session_snap_save(const ckv_srv_session *s, const char *dir, const char *name, bool committed_only,
                          uint64_t *ret_bytes, uint64_t *ret_tokens, uint64_t *ret_dropped, char *err, size_t errlen) {
  ckv_snap snap;
  uint64_t tokens = 0;
  int r = ckv_session_snap_capture(s, committed_only, &snap, &tokens, err, errlen);
  if (r < 0) return r;
  r = ckv_snap_write(dir, name, &snap, ret_bytes, err, errlen);
  if (r == CKV_OK) {
    if (ret_tokens) *ret_tokens = tokens;
    if (ret_dropped) *ret_dropped = snap.dropped_tokens;
  }
  ckv_snap_done(&snap);
  return r;
}

static int restore(const ckv_snap *snap, const char *id, ckv_tenant *t, const ckv_mlp *mlp, uint64_t *next_block_id,
                   bool kept, ckv_srv_session **ret, char *err, size_t errlen) {
  if (kept != ((snap->flags & CKV_SNAP_BLOCK_REFS) != 0))
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, kept ? "a journal entry without block references"
                                                  : "a warm-restart journal entry, not a snapshot");
  if (t->mem != &ckv_blockmem_host)
    return ckv_fail(err, errlen, CKV_ERR_UNSUPPORTED, "snapshots need a host arena (this tenant's memory is %s)",
                t->mem->name);
  if (snap->staged_tokens != snap->commit_tokens)
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, "staged blocks of %u tokens (this build makes them %u)",
                snap->staged_tokens, snap->commit_tokens);
  /* which blocks hold anything (or are being filled): only those come back */
  const ckv_tokens *st = &snap->tokens;
  uint16_t *refs = calloc(snap->n_table ? snap->n_table : 1, sizeof(*refs));
  if (!refs) return ckv_fail(err, errlen, -ENOMEM, "out of memory restoring");
  for (size_t p = 0; p < st->n; p++)
    if (st->block[p] != CKV_NO_BLOCK) refs[st->block[p]]++; /* cross-checked by the reader */
  uint64_t need = 0;
  for (size_t i = 0; i < snap->n_blocks; i++) need += snap->blocks[i].bytes;
  if (!ckv_tenant_would_fit(t, need)) {
    free(refs);
    return ckv_fail(err, errlen, CKV_ERR_QUOTA, "the snapshot needs %llu bytes; tenant '%s' has %llu of %llu in use",
                (unsigned long long)need, t->name, (unsigned long long)t->bytes_used,
                (unsigned long long)t->quota_bytes);
  }
  ckv_judge_params params = snap->params;
  params.mlp = snap->params_mlp ? mlp : NULL;
  ckv_srv_session *s = NULL;
  int r = ckv_srv_session_new(id, t, &snap->geom, snap->draft_tokens, snap->commit_tokens, snap->policy, &params,
                              next_block_id, &s);
  if (r < 0) {
    free(refs);
    return ckv_fail(err, errlen, r, "cannot create session: %s", ckv_strerror(r));
  }
  snprintf(s->model_id, sizeof s->model_id, "%s", snap->model_id);
  snprintf(s->model_revision, sizeof s->model_revision, "%s", snap->model_revision);
  for (size_t i = 0; i < snap->n_blocks; i++) {
    const ckv_snap_block *sb = &snap->blocks[i];
    bool filling = false;
    for (int f = 0; f < CKV_FORMAT_COUNT_; f++) filling |= snap->fill[f] == sb->index;
    if (!refs[sb->index] && !filling) continue; /* empty: it would be retired at once */
    if (kept) {
      const uint64_t lo = CKV_ARENA_HEADER_BYTES;
      if (sb->arena_offset < lo || sb->arena_offset > ckv_arena_size(t->arena) ||
          sb->bytes > ckv_arena_size(t->arena) - sb->arena_offset) {
        r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %u at offset %llu (%llu bytes) lies outside the arena",
                 sb->index, (unsigned long long)sb->arena_offset, (unsigned long long)sb->bytes);
        goto bad;
      }
      /* A block two sessions shared (store/prefix.h): the first one put it
       * back, the others point at it. */
      ckv_pblock *pb = ckv_prefix_at_offset(t, sb->arena_offset);
      if (pb) {
        uint32_t got;
        if (sb->format != pb->format || sb->bytes != pb->bytes || sb->capacity != pb->capacity) {
          r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %u at offset %llu is another session's block of another shape",
                       sb->index, (unsigned long long)sb->arena_offset);
          goto bad;
        }
        if ((r = ckv_srv_session_link_block(s, pb, sb->index, &got)) < 0) {
          ckv_fail(err, errlen, r, "cannot share block %u: %s", sb->index, ckv_strerror(r));
          goto bad;
        }
        s->blocks[sb->index].used = sb->used;
        s->blocks[sb->index].refs = refs[sb->index];
        continue;
      }
      t->claim.pending = true;
      t->claim.offset = sb->arena_offset;
      t->claim.slab_offset = sb->slab_offset;
    }
    r = ckv_srv_session_restore_block(s, sb->index, sb->format);
    t->claim.pending = false;
    if (r == CKV_OK && kept && s->blocks[sb->index].offset != sb->arena_offset) r = CKV_ERR_INTERNAL;
    if (r < 0) {
      ckv_fail(err, errlen, r, "cannot allocate block %u (%llu bytes): %s", sb->index, (unsigned long long)sb->bytes,
           ckv_strerror(r));
      goto bad;
    }
    ckv_sblock *b = &s->blocks[sb->index];
    if (b->bytes != sb->bytes || b->capacity != sb->capacity ||
        (ckv_format_is_commit(b->format) && ckv_srv_session_block_header(s, sb->index)->kept_channels != sb->kept)) {
      r = ckv_fail(err, errlen, CKV_ERR_CORRUPT,
               "block %u (format %u): %llu bytes, %u slots in the snapshot; the session's rules give %llu, %u",
               sb->index, sb->format, (unsigned long long)sb->bytes, sb->capacity, (unsigned long long)b->bytes,
               b->capacity);
      goto bad;
    }
    /* the header is the daemon's own (fresh generation); positions and valid
     * bits are the file's, cross-checked against the tokens by the reader */
    uint8_t *meta = ckv_srv_session_block_meta(s, sb->index);
    size_t from = ckv_block_positions_offset(), head = ckv_block_payload_offset(sb->capacity);
    memcpy(meta + from, sb->meta + from, head - from);
    ((ckv_block_header *)meta)->n_valid = refs[sb->index];
    b->used = sb->used;
    b->refs = refs[sb->index];
    if (kept) { /* the payload is where it was: the arena outlived the daemon */
      if ((r = ckv_prefix_note_claim(s, sb->index)) < 0) {
        ckv_fail(err, errlen, r, "out of memory noting block %u", sb->index);
        goto bad;
      }
      continue;
    }
    ckv_meta_write w = {.offset = b->offset + head, .src = sb->payload, .bytes = sb->bytes - head};
    if ((r = t->mem->write(ckv_tenant_ptr(t, 0), &w, 1)) < 0) {
      ckv_fail(err, errlen, r, "writing block %u into the arena: %s", sb->index, ckv_strerror(r));
      goto bad;
    }
  }
  ckv_srv_session_restore_free_list(s);
  for (int f = 0; f < CKV_FILL_COUNT; f++) s->fill[f] = f < CKV_FORMAT_COUNT_ ? snap->fill[f] : CKV_NO_BLOCK;
  ckv_tokens *tt = &s->tokens;
  tt->n = 0; /* a new session: no rows yet */
  if ((r = ckv_tokens_append_rows(tt, st)) < 0) {
    ckv_fail(err, errlen, r, "out of memory for %zu tokens", st->n);
    goto bad;
  }
  for (size_t i = 0; i < snap->n_ids; i++)
    if ((r = ckv_srv_session_set_id_count(s, snap->ids[2 * i], snap->ids[2 * i + 1])) < 0) {
      ckv_fail(err, errlen, r == -ENOMEM ? r : CKV_ERR_CORRUPT, "token id %u cannot be counted", snap->ids[2 * i]);
      if (r != -ENOMEM) r = CKV_ERR_CORRUPT;
      goto bad;
    }
  /* epochs go on from the saved one: a reader of the old daemon never sees one again */
  if (snap->epoch + 1 > s->epoch) s->epoch = snap->epoch + 1;
  s->rounds = snap->rounds;
  s->incarnation = snap->incarnation;
  s->last_round = snap->last_round;
  s->semantic_given = snap->semantic_given;
  memcpy(s->count_by_state, snap->count_by_state, sizeof s->count_by_state);
  memcpy(s->transitions, snap->transitions, sizeof s->transitions);
  s->plan_dirty = true; /* tokens whose bytes lag their state move on the next plan */
  free(refs);
  *ret = s;
  return CKV_OK;
bad:
  free(refs);
  s->dirty_head = NULL;
  ckv_srv_session_free(s);
  return r;
}

int ckv_session_snap_restore(const ckv_snap *snap, const char *id, ckv_tenant *t, const ckv_mlp *mlp,
                             uint64_t *next_block_id, ckv_srv_session **ret, char *err, size_t errlen) {
  return restore(snap, id, t, mlp, next_block_id, /* kept= */ false, ret, err, errlen);
}

int ckv_session_snap_restore_kept(const ckv_snap *snap, const char *id, ckv_tenant *t, const ckv_mlp *mlp,
                                  uint64_t *next_block_id, ckv_srv_session **ret, char *err, size_t errlen) {
  return restore(snap, id, t, mlp, next_block_id, /* kept= */ true, ret, err, errlen);
}

int ckv_session_snap_capture_refs(const ckv_srv_session *s, ckv_snap *ret, char *err, size_t errlen) {
  uint64_t tokens = 0;
  int r = capture(s, /* committed_only= */ false, CAPTURE_REFS, ret, &tokens, err, errlen);
  if (r < 0) return r;
  /* the same description, each block by its place instead of its bytes */
  ret->flags |= CKV_SNAP_BLOCK_REFS;
  for (size_t i = 0; i < ret->n_blocks; i++) {
    ckv_snap_block *b = &ret->blocks[i];
    const ckv_sblock *sb = &s->blocks[b->index];
    b->arena_offset = sb->offset;
    if ((r = ckv_slab_block_slab(s->tenant->slab, sb->offset, &b->slab_offset)) < 0) {
      ckv_snap_done(ret);
      return ckv_fail(err, errlen, CKV_ERR_INTERNAL, "block %u is not a live block of the allocator", b->index);
    }
  }
  return CKV_OK;
}
