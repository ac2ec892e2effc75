/* shared_moves.c - a shared prefix compressed once (see shared_moves.h). */
#include "store/shared_moves.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "kernels/kernels.h"
#include "store/compressor.h"
#include "store/prefix.h"
#include "store/session.h"
#include "store/shared.h"
#include "store/tenant.h"

/* At most this many source blocks in one compression (a staged block of up
 * to CKV_MAX_BLOCK_TOKENS slots over draft blocks of at least one). */
#define SWAP_MAX_SRC 64u

/* A compression in flight (s->swap of its leader). */
typedef struct ckv_shared_swap {
  ckv_job *job;
  uint32_t dst;        /* the new block, in the leader's table */
  uint32_t format;     /* its format */
  uint32_t n_src;
  ckv_pblock *src[SWAP_MAX_SRC];
  uint32_t *pos;       /* the moved tokens' positions */
  uint16_t *dst_slot;  /* and their slots in dst */
  uint32_t n;
} ckv_shared_swap;

/* The sources may be compressed by another holder again (call while the
 * leader still holds them). */
static void unmark(ckv_shared_swap *sw) {
  for (uint32_t j = 0; j < sw->n_src; j++) sw->src[j]->swapping = false;
}

static void swap_free(ckv_shared_swap *sw) {
  if (!sw) return;
  free(sw->pos);
  free(sw->dst_slot);
  free(sw);
}

/* The entry of session u that points at pb (UINT32_MAX: none). */
static uint32_t user_idx(const ckv_pblock *pb, const ckv_srv_session *u) {
  for (uint32_t i = 0; i < pb->n_users; i++)
    if (pb->users[i].s == u) return pb->users[i].idx;
  return UINT32_MAX;
}

/* Whether pb and q have the same holders, all of them live table entries. */
static bool same_users(const ckv_pblock *pb, const ckv_pblock *q) {
  if (pb->n_users != q->n_users || q->holders != q->n_users) return false;
  for (uint32_t i = 0; i < pb->n_users; i++)
    if (user_idx(q, pb->users[i].s) == UINT32_MAX) return false;
  return true;
}

/* Whether every holder of pb has every token of it in a state at least
 * `min` (staged: not draft; committed: committed or demoted), none moving,
 * each where pb says.  *ret_format (commit hop): the rotated format of the
 * most bits any holder asks for any token (CKV_FORMAT_COUNT_: a holder
 * commits in KIVI). */
static bool holders_agree(const ckv_pblock *pb, int min, const ckv_shared_moves_ops *ops, uint32_t *ret_format) {
  if (pb->swapping || pb->holders < 2 || pb->holders != pb->n_users) return false;
  const uint32_t *positions = ckv_block_positions_const(pb->meta);
  uint32_t best = CKV_FORMAT_COUNT_;
  bool first = true;
  for (uint32_t i = 0; i < pb->n_users; i++) {
    const ckv_srv_session *u = pb->users[i].s;
    const uint32_t idx = pb->users[i].idx;
    if (u->quarantined || u->doomed || u->warm_unresumed) return false;
    const ckv_tokens *t = &u->tokens;
    for (uint32_t slot = 0; slot < pb->capacity; slot++) {
      if (!ckv_block_slot_valid(pb->meta, slot)) continue;
      uint32_t p = positions[slot];
      if (p >= t->n || t->block[p] != idx || t->slot[p] != slot || (t->flags[p] & CKV_TOKEN_PENDING)) return false;
      uint8_t st = t->state[p];
      if (st == CKV_STATE_DRAFT || (min == CKV_STATE_COMMITTED && st == CKV_STATE_STAGED)) return false;
      if (min == CKV_STATE_COMMITTED) {
        uint32_t f = ops->rot_format(u, p);
        if (f == CKV_FORMAT_COUNT_) return false;
        if (first || f < best) best = f; /* ROT4 < ROT3 < ROT2 < ROT1: the lower, the more bits */
        first = false;
      }
    }
  }
  if (ret_format) *ret_format = best;
  return true;
}

/* The run to compress, starting at the leading shared block of s that
 * holders_agree allows: src[] (at most max), the format, how many. */
static uint32_t find_run(ckv_srv_session *s, ckv_pblock **src, uint32_t max, const ckv_shared_moves_ops *ops,
                         uint32_t *ret_format) {
  const ckv_tokens *t = &s->tokens;
  uint32_t n = 0;
  size_t p = 0;
  s->shared_waiting = false;
  while (p < t->n) {
    uint32_t idx = t->block[p];
    if (idx == CKV_NO_BLOCK || idx >= s->n_blocks) break;
    ckv_pblock *pb = s->blocks[idx].shared;
    if (!pb || pb->holders < 2) break; /* shared blocks lead every table they are in */
    /* not yet in a committed format: a later round may compress it (each
     * round plans while any is left, see ckv_moves_round) */
    if (!ckv_format_is_committed_state(pb->format)) s->shared_waiting = true;
    size_t next = p + s->blocks[idx].refs; /* this session's tokens in it are consecutive */
    if (s->blocks[idx].refs == 0) break;
    if (pb->format == CKV_FORMAT_DRAFT) {
      uint32_t f;
      if (pb->capacity == s->draft_tokens && s->blocks[idx].refs == pb->capacity &&
          holders_agree(pb, CKV_STATE_STAGED, ops, &f) && (n == 0 || same_users(src[0], pb))) {
        src[n++] = pb;
        *ret_format = CKV_FORMAT_STAGED;
        if (n == max) return n;
      } else if (n) {
        return n;
      }
    } else if (pb->format == CKV_FORMAT_STAGED && n == 0 && pb->capacity == s->commit_tokens) {
      uint32_t f;
      if (holders_agree(pb, CKV_STATE_COMMITTED, ops, &f) && f != CKV_FORMAT_COUNT_) {
        src[0] = pb;
        *ret_format = f;
        return 1;
      }
    } else if (n) {
      return n;
    }
    p = next;
  }
  return n;
}

int ckv_shared_moves_plan(ckv_srv_session *s, ckv_compressor *c, const ckv_shared_moves_ops *ops) {
  if (s->swap || s->quarantined || s->doomed || !s->tenant->prefix || ckv_compressor_room(c) == 0) return CKV_OK;
  const uint32_t d = s->draft_tokens;
  uint32_t group = s->staged_tokens / d;
  if (group == 0) return CKV_OK;
  if (group > SWAP_MAX_SRC) group = SWAP_MAX_SRC;
  ckv_pblock *src[SWAP_MAX_SRC];
  uint32_t format = CKV_FORMAT_COUNT_;
  uint32_t n_src = find_run(s, src, group, ops, &format);
  if (!n_src) return CKV_OK;
  ckv_shared_swap *sw = calloc(1, sizeof(*sw));
  uint32_t slots = n_src * src[0]->capacity;
  if (!sw || !(sw->pos = malloc(slots * sizeof(*sw->pos))) || !(sw->dst_slot = malloc(slots * sizeof(*sw->dst_slot)))) {
    swap_free(sw);
    return -ENOMEM;
  }
  /* the tokens, in slot order of the sources; a staged destination takes
   * them in that order, a committed one slot for slot */
  for (uint32_t j = 0; j < n_src; j++) {
    const ckv_pblock *pb = src[j];
    const uint32_t *positions = ckv_block_positions_const(pb->meta);
    for (uint32_t slot = 0; slot < pb->capacity; slot++) {
      if (!ckv_block_slot_valid(pb->meta, slot)) continue;
      sw->pos[sw->n] = positions[slot];
      sw->dst_slot[sw->n] = (uint16_t)(format == CKV_FORMAT_STAGED ? j * pb->capacity + slot : slot);
      sw->n++;
    }
  }
  uint32_t dst;
  int r = ckv_srv_session_new_block(s, format, &dst);
  if (r < 0) { /* no room now: the next plan tries again */
    swap_free(sw);
    return r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE ? CKV_OK : r;
  }
  ckv_sblock *b = &s->blocks[dst];
  b->used = b->capacity; /* sealed: nothing else goes in */
  b->refs = (uint16_t)sw->n;
  sw->dst = dst;
  sw->format = format;
  sw->n_src = n_src;
  memcpy(sw->src, src, n_src * sizeof(*src));
  r = ops->submit(s, c, sw->pos, sw->dst_slot, sw->n, dst, &sw->job);
  if (r < 0) { /* dst went back with its slots */
    swap_free(sw);
    return r;
  }
  for (uint32_t j = 0; j < n_src; j++) src[j]->swapping = true;
  s->swap = sw;
  s->swap_abandon = ckv_shared_moves_abandon;
  return CKV_OK;
}

bool ckv_shared_moves_owns(const ckv_srv_session *s, const ckv_job *j) { return s->swap && s->swap->job == j; }

void ckv_shared_moves_abandon(ckv_srv_session *s) {
  if (!s->swap) return;
  unmark(s->swap);
  swap_free(s->swap);
  s->swap = NULL;
}

/* Whether the sources still are what the plan saw: the same holders (all
 * live), each still agreeing, the tokens where they were. */
static bool still_agree(const ckv_shared_swap *sw, const ckv_shared_moves_ops *ops) {
  for (uint32_t j = 0; j < sw->n_src; j++) {
    ckv_pblock *pb = sw->src[j];
    pb->swapping = false; /* holders_agree refuses a block in flight */
    bool ok = holders_agree(pb, sw->format == CKV_FORMAT_STAGED ? CKV_STATE_STAGED : CKV_STATE_COMMITTED, ops, NULL) &&
              same_users(sw->src[0], pb);
    pb->swapping = true;
    if (!ok) return false;
  }
  return true;
}

/* The leader's new block as a shared record (one holder: the leader),
 * indexed under the sources' keys.  NULL on -ENOMEM. */
static ckv_pblock *share_dst(ckv_srv_session *s, const ckv_shared_swap *sw) {
  ckv_prefix *p = ckv_shared_registry(s->tenant);
  ckv_pblock *pb = p ? ckv_prefix_share_entry(s, sw->dst, NULL) : NULL;
  if (!pb) return NULL;
  /* the sources' keys, in slot order; an unkeyed source ends the indexing */
  ckv_pkey keys[SWAP_MAX_SRC * 4];
  uint32_t nk = 0;
  uint16_t sub = 0;
  bool keyed = true;
  for (uint32_t j = 0; j < sw->n_src && keyed; j++) {
    const ckv_pblock *q = sw->src[j];
    if (q->n_subkeys) { /* a compressed block: its own sub-blocks */
      for (uint32_t k = 0; k < q->n_subkeys && nk < sizeof(keys) / sizeof(keys[0]); k++) keys[nk++] = q->subkeys[k];
      sub = q->sub_tokens;
    } else if (q->keyed) {
      keys[nk++] = q->key;
      sub = q->capacity;
    } else {
      keyed = false;
    }
  }
  for (uint32_t j = 0; j < sw->n_src; j++) ckv_shared_unindex(p, sw->src[j]);
  if (keyed && nk) (void)ckv_shared_index_group(p, pb, keys, nk, sub); /* unindexed: still shared, not found */
  return pb;
}

/* Every holder u other than the leader: its table points at the new block
 * for the moved tokens, and lets go of the sources (retired, in u's own
 * epochs).  A holder that cannot link it (no memory) stays on the sources. */
static void relink(ckv_srv_session *s, const ckv_shared_swap *sw, ckv_pblock *npb) {
  const ckv_pblock *first = sw->src[0];
  uint32_t n_users = first->n_users;
  ckv_srv_session **users = malloc((n_users ? n_users : 1) * sizeof(*users));
  if (!users) return;
  for (uint32_t i = 0; i < n_users; i++) users[i] = first->users[i].s;
  for (uint32_t i = 0; i < n_users; i++) {
    ckv_srv_session *u = users[i];
    if (u == s) continue;
    uint32_t nidx;
    if (ckv_srv_session_link_block(u, npb, CKV_NO_BLOCK, &nidx) < 0) continue;
    u->blocks[nidx].refs = (uint16_t)sw->n;
    for (uint32_t k = 0; k < sw->n; k++) {
      u->tokens.block[sw->pos[k]] = nidx;
      u->tokens.slot[sw->pos[k]] = sw->dst_slot[k];
    }
    for (uint32_t j = 0; j < sw->n_src; j++) {
      uint32_t old = user_idx(sw->src[j], u);
      if (old == UINT32_MAX) continue;
      u->blocks[old].refs = 0;
      ckv_srv_session_retire_block(u, old);
    }
    u->plan_from = 0; /* its tokens there no longer lag: counted again by the next plan */
  }
  free(users);
}

void ckv_shared_moves_publish(ckv_srv_session *s, ckv_job *j, const ckv_shared_moves_ops *ops) {
  ckv_shared_swap *sw = s->swap;
  s->swap = NULL;
  for (uint32_t k = 0; k < sw->n; k++) s->tokens.flags[sw->pos[k]] &= (uint8_t)~CKV_TOKEN_PENDING;
  bool ok = j->status >= 0 && still_agree(sw, ops);
  unmark(sw);
  ckv_job_free(j);
  s->plan_from = 0;
  if (ok) { /* the new block's header reaches the arena before any other holder can name it */
    uint8_t *meta = ckv_srv_session_block_meta(s, sw->dst);
    for (uint32_t k = 0; k < sw->n; k++) {
      ckv_block_positions(meta)[sw->dst_slot[k]] = sw->pos[k];
      ckv_block_set_valid(meta, sw->dst_slot[k], true);
    }
    ok = ckv_srv_session_flush_meta(s) == CKV_OK;
  }
  ckv_pblock *npb = ok ? share_dst(s, sw) : NULL;
  if (!npb) { /* undone: the tokens stay in the sources, the new block goes */
    s->blocks[sw->dst].refs = 0;
    ckv_srv_session_retire_block(s, sw->dst);
    swap_free(sw);
    return;
  }
  for (uint32_t k = 0; k < sw->n; k++) {
    s->tokens.block[sw->pos[k]] = sw->dst;
    s->tokens.slot[sw->pos[k]] = sw->dst_slot[k];
  }
  relink(s, sw, npb);
  for (uint32_t k = 0; k < sw->n_src; k++) {
    uint32_t old = user_idx(sw->src[k], s);
    if (old == UINT32_MAX) continue;
    s->blocks[old].refs = 0;
    ckv_srv_session_retire_block(s, old);
  }
  s->epoch++;
  swap_free(sw);
}
