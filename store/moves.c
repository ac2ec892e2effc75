/* moves.c - plan, execute (via the compressor) and publish token moves
 * (see moves.h). */
#include "store/moves.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "store/compressor.h"
#include "store/prefix.h"
#include "store/shared_moves.h"
#include "common/log.h"
#include "store/session.h"
#include "store/tenant.h"
#include "kernels/kernels.h"
#include "lifecycle/policy.h"

/* What publish needs to know about one move. */
typedef struct move_rec {
  uint32_t pos;
  uint32_t src_block, dst_block;
  uint16_t src_slot, dst_slot;
} move_rec;

typedef struct plan_buf {
  ckv_move *moves;
  move_rec *recs;
  size_t n, cap;
} plan_buf;

static int plan_push(plan_buf *b, ckv_srv_session *s, uint32_t pos, uint32_t dst_block, uint16_t dst_slot) {
  if (b->n == b->cap) {
    size_t ncap = b->cap ? b->cap * 2 : 64;
    ckv_move *nm = realloc(b->moves, ncap * sizeof(*nm));
    if (!nm) return -ENOMEM;
    b->moves = nm;
    move_rec *nr = realloc(b->recs, ncap * sizeof(*nr));
    if (!nr) return -ENOMEM;
    b->recs = nr;
    b->cap = ncap;
  }
  uint32_t src_block = s->tokens.block[pos];
  uint16_t src_slot = s->tokens.slot[pos];
  b->moves[b->n] = (ckv_move){.src = ckv_srv_session_block_ptr(s, src_block), .src_slot = src_slot,
                              .dst_slot = dst_slot, .dst = ckv_srv_session_block_ptr(s, dst_block)};
  b->recs[b->n] = (move_rec){pos, src_block, dst_block, src_slot, dst_slot};
  b->n++;
  return CKV_OK;
}

/* Where the rotated formats pay: a power-of-two head_dim of at least 32
 * (their one-byte scale per head costs 8/head_dim bits per element; KIVI's
 * scale and zero per 32 cost about 1). */
#define ROT_MIN_HEAD_DIM 32u

static uint32_t commit_format(const ckv_srv_session *s) {
  if (s->params.rotate && s->geom.head_dim >= ROT_MIN_HEAD_DIM && ckv_rot_head_dim_ok(s->geom.head_dim))
    return ckv_format_rot_of_bits(s->params.commit_bits);
  return s->params.commit_bits == 2 ? CKV_FORMAT_COMMIT2 : CKV_FORMAT_COMMIT4;
}

/* KIVI sessions (ckv_moves_round): staged tokens wait this many times
 * persistence_rounds before they commit, and no attention makes a token a
 * fact that commits (the threshold is never reached). */
#define KIVI_PERSISTENCE_FACTOR 3u
#define KIVI_HOT_NEVER_COMMITS 3.0e38f

/* Bits by value: a rotated session stores its lasting facts (demoted ones
 * too: a fact that went cold keeps its bits) in the commit format and every
 * other committed token in the cold_bits one. */
static uint32_t token_commit_format(const ckv_srv_session *s, uint32_t cf, size_t pos) {
  if (!ckv_format_is_rot(cf) || ckv_judge_fact_format(&s->tokens, pos, &s->params)) return cf;
  uint32_t bits = (s->tokens.flags[pos] & CKV_TOKEN_WARM) ? s->params.warm_bits : s->params.cold_bits;
  return bits ? ckv_format_rot_of_bits(bits) : cf;
}

/* The fill block index (session.h) of `format`, for demoted tokens or live ones. */
static uint32_t fill_index(uint32_t format, bool cold) { return cold ? CKV_FILL_COLD + format : format; }
static uint32_t fill_format(uint32_t fi) { return fi % CKV_FILL_COLD; }

/* Reserves `count` consecutive slots of fill block fi (fill_index: a new
 * block of its format when the current one lacks room).  `align`: the run
 * must start at a multiple of it (committed chunks). */
static int reserve(ckv_srv_session *s, uint32_t fi, uint32_t count, uint32_t align, uint32_t *ret_block,
                   uint16_t *ret_first) {
  uint32_t format = fill_format(fi);
  uint32_t cur = s->fill[fi];
  if (cur != CKV_NO_BLOCK) {
    ckv_sblock *b = &s->blocks[cur];
    uint32_t start = (b->used + align - 1) / align * align;
    if (start + count <= b->capacity) {
      b->used = (uint16_t)(start + count);
      b->refs = (uint16_t)(b->refs + count);
      *ret_block = cur;
      *ret_first = (uint16_t)start;
      return CKV_OK;
    }
  }
  uint32_t idx;
  int r = ckv_srv_session_new_block(s, format, &idx);
  if (r < 0) return r;
  s->fill[fi] = idx;
  if (cur != CKV_NO_BLOCK && s->blocks[cur].refs == 0) ckv_srv_session_retire_block(s, cur);
  ckv_sblock *b = &s->blocks[idx];
  b->used = (uint16_t)count;
  b->refs = (uint16_t)count;
  *ret_block = idx;
  *ret_first = 0;
  return CKV_OK;
}

/* Whether this session's recycled tokens are demoted (keep their bytes in a
 * committed format) rather than freed: the demote parameter, never for the
 * eviction baselines (h2o and streaming measure what dropping costs).  A
 * rotated session moves its demoted tokens into blocks of their own
 * (separate_cold); a KIVI session (head_dim below 32, or rotate off) seals
 * 32-token chunks, so its demoted tokens commit into the chunks live tokens
 * use and a block is cold only once every token in it is demoted.  Dropping
 * them instead saved no bytes there (a sealed chunk keeps its memory until
 * all of it goes) and cost stories260K's next-token KL 0.44-0.53 against
 * 0.06-0.07 kept (commitkv-llm --shadow, 20 rounds, seeds 1-4). */
static bool demotes(const ckv_srv_session *s) {
  return s->params.demote && s->params.policy != CKV_POLICY_H2O && s->params.policy != CKV_POLICY_STREAMING;
}

/* A recycled token that still has its bytes: demoted, in the cold tier. */
static bool is_cold(const ckv_srv_session *s, size_t p) {
  return s->tokens.state[p] == CKV_STATE_RECYCLED && s->tokens.block[p] != CKV_NO_BLOCK;
}

/* Frees a token's slot for good: a drop, counted (only a quota rule or a
 * session without demotion drops). */
static void recycle_now(ckv_srv_session *s, size_t pos) {
  uint32_t blk = s->tokens.block[pos];
  s->tokens_dropped++;
  ckv_block_set_valid(ckv_srv_session_block_meta(s, blk), s->tokens.slot[pos], false);
  s->tokens.block[pos] = CKV_NO_BLOCK;
  ckv_srv_session_release_slot(s, blk);
}

static uint32_t physical_format(const ckv_srv_session *s, size_t pos) {
  uint32_t blk = s->tokens.block[pos];
  return blk == CKV_NO_BLOCK ? CKV_BLOCK_UNUSED : s->blocks[blk].format;
}

static uint64_t count_pending(const ckv_srv_session *s);
static int submit(ckv_srv_session *s, ckv_compressor *c, plan_buf *b, int copy, ckv_job **ret_job);

static int plan(ckv_srv_session *s, ckv_compressor *c, bool flush, bool *ret_deferred);

static int compact(ckv_srv_session *s, ckv_compressor *c);
static const ckv_shared_moves_ops k_shared_ops;
static int separate_cold(ckv_srv_session *s, ckv_compressor *c);

/* Tokens that wait because no destination block could be had are said once
 * per stall (with what is missing), never per round. */
static void note_stall(ckv_srv_session *s) {
  if (!s->stalled_on) {
    s->stall_logged = false;
    return;
  }
  if (s->stall_logged || !s->pending) return;
  s->stall_logged = true;
  const ckv_tenant *t = s->tenant;
  if (s->stalled_on == CKV_ERR_QUOTA)
    ckv_log(CKV_LOG_WARNING, "moves-stalled", t->name, s->id,
            "%llu tokens wait for their moves: the tenant's quota is full (%llu of %llu bytes in use) and a "
            "destination block needs more; they move once memory is freed (drop sessions or raise the quota)",
            (unsigned long long)s->pending, (unsigned long long)t->bytes_used, (unsigned long long)t->quota_bytes);
  else
    ckv_log(CKV_LOG_WARNING, "moves-stalled", t->name, s->id,
            "%llu tokens wait for their moves: the arena has no free range for a destination block (%s); they "
            "move once memory is freed",
            (unsigned long long)s->pending, ckv_strerror(s->stalled_on));
}

/* Fill blocks whose every used slot's token moved on (no ref, slots used)
 * hold bytes and no token: a later move would only use what room is left
 * before opening a new block anyway, so they go now (a session whose staged
 * tokens all committed kept an empty staged block to its end). */
static void retire_spent_fills(ckv_srv_session *s) {
  for (int f = 0; f < CKV_FILL_COUNT; f++) {
    uint32_t b = s->fill[f];
    if (b != CKV_NO_BLOCK && s->blocks[b].refs == 0 && s->blocks[b].used > 0 && !s->blocks[b].shared)
      ckv_srv_session_retire_block(s, b);
  }
}

int ckv_moves_plan(ckv_srv_session *s, ckv_compressor *c, bool flush) {
  if (s->quarantined) return CKV_OK; /* its blocks are not trusted: nothing moves any more */
  s->stalled_on = 0;
  bool deferred = false;
  flush = flush || s->plan_flush;
  int r = ckv_shared_moves_plan(s, c, &k_shared_ops);
  if (r == CKV_OK) r = plan(s, c, flush, &deferred);
  /* A flush made in parts closes the partial chunks in its last part, as one
   * plan would have. */
  if (!s->plan_dirty || deferred) s->plan_flush = flush && deferred; /* a full queue keeps it for later */
  /* While a plan made in parts goes on, most blocks are in flux: compaction
   * waits for its last part (each part would rescan every token). */
  if (r == CKV_OK && !deferred) r = compact(s, c);
  if (r == CKV_OK && !deferred && s->cold_dirty) r = separate_cold(s, c);
  if (r == CKV_OK && !deferred) retire_spent_fills(s);
  if (r < 0) s->pending = count_pending(s); /* plan's own count may be short */
  note_stall(s);
  return r;
}

/* One plan call's bound (ckv_srv_session.plan_max_moves): past `budget`
 * moves a format takes tokens only into a block this call opened, until that
 * block is full, and opens no new one.  A block's first job decides what all
 * its tokens share (a rotated block's key mean, a committed block's kept
 * channels), so a job never leaves a block it opened half-filled for a later
 * job: the tokens, blocks and bytes are those of one unbounded plan whenever
 * nothing is judged between the calls (publishing plans the rest at once). */
typedef struct plan_bound {
  size_t budget;
  uint32_t opened[CKV_FILL_COUNT]; /* the block this call opened per format, CKV_NO_BLOCK: none */
  bool deferred;                   /* tokens were left for a later call */
} plan_bound;

static void plan_bound_init(plan_bound *x, const ckv_srv_session *s) {
  x->budget = s->plan_max_moves ? s->plan_max_moves : CKV_MOVES_PLAN_MAX_MOVES;
  for (int f = 0; f < CKV_FILL_COUNT; f++) x->opened[f] = CKV_NO_BLOCK;
  x->deferred = false;
}

/* Free slots of fill block fi from its next `align`ed slot on (0 without a
 * fill block). */
static uint32_t fill_room(const ckv_srv_session *s, uint32_t fi, uint32_t align) {
  uint32_t cur = s->fill[fi];
  if (cur == CKV_NO_BLOCK) return 0;
  const ckv_sblock *b = &s->blocks[cur];
  uint32_t start = (b->used + align - 1) / align * align;
  return start < b->capacity ? b->capacity - start : 0;
}

/* Past the budget: room (0 = none) that fill block fi may still use in a
 * block this call opened. */
static uint32_t bound_room(const ckv_srv_session *s, const plan_bound *x, uint32_t fi, uint32_t align) {
  uint32_t cur = s->fill[fi];
  return cur != CKV_NO_BLOCK && cur == x->opened[fi] ? fill_room(s, fi, align) : 0;
}

/* Whether any committed format may still fill a block this call opened. */
static bool bound_open(const ckv_srv_session *s, const plan_bound *x) {
  for (uint32_t f = 0; f < CKV_FILL_COUNT; f++)
    if (ckv_format_is_committed_state(fill_format(f)) && x->opened[f] != CKV_NO_BLOCK && bound_room(s, x, f, 1))
      return true;
  return false;
}

/* reserve(), noting the blocks this call opens (a new block starts at slot 0;
 * a fill block already has a slot in use). */
static int take(ckv_srv_session *s, plan_bound *x, uint32_t fi, uint32_t count, uint32_t align,
                uint32_t *ret_block, uint16_t *ret_first) {
  int r = reserve(s, fi, count, align, ret_block, ret_first);
  if (r == CKV_OK && *ret_first == 0) x->opened[fi] = *ret_block;
  return r;
}

/* A demoted token that is not in a committed format yet goes the committing
 * path (staged, then committed in cold_bits) like a committed one. */
static bool commits(const ckv_srv_session *s, size_t p) {
  uint8_t st = s->tokens.state[p];
  return st == CKV_STATE_COMMITTED || (st == CKV_STATE_RECYCLED && demotes(s) && s->tokens.block[p] != CKV_NO_BLOCK);
}

static bool wants_staged(const ckv_srv_session *s, size_t p) {
  const ckv_tokens *t = &s->tokens;
  return !(t->flags[p] & CKV_TOKEN_PENDING) && t->state[p] != CKV_STATE_DRAFT &&
         (t->state[p] != CKV_STATE_RECYCLED || commits(s, p)) && physical_format(s, p) == CKV_FORMAT_DRAFT &&
         !ckv_prefix_is_frozen(s, t->block[p]);
}

static bool wants_commit(const ckv_srv_session *s, size_t p) {
  const ckv_tokens *t = &s->tokens;
  return commits(s, p) && !(t->flags[p] & CKV_TOKEN_PENDING) && physical_format(s, p) == CKV_FORMAT_STAGED &&
         !ckv_prefix_is_frozen(s, t->block[p]);
}

/* Room for `n` moves, so planning never reallocates. */
static int plan_reserve(plan_buf *b, size_t n) {
  if (n <= b->cap) return CKV_OK;
  ckv_move *nm = realloc(b->moves, n * sizeof(*nm));
  if (!nm) return -ENOMEM;
  b->moves = nm;
  move_rec *nr = realloc(b->recs, n * sizeof(*nr));
  if (!nr) return -ENOMEM;
  b->recs = nr;
  b->cap = n;
  return CKV_OK;
}

/* Whether token p's bytes lag its state (count_pending's test, less the moves in flight). */
static bool lags(const ckv_srv_session *s, size_t p) {
  uint8_t st = s->tokens.state[p];
  uint32_t f = physical_format(s, p);
  return (st == CKV_STATE_STAGED && f != CKV_FORMAT_STAGED) || (commits(s, p) && !ckv_format_is_committed_state(f));
}

static int plan(ckv_srv_session *s, ckv_compressor *c, bool flush, bool *ret_deferred) {
  ckv_tokens *t = &s->tokens;
  s->plan_dirty = false;
  const size_t from = s->plan_from < t->n ? s->plan_from : t->n;
  /* One pass from the cursor: recycle what the judge recycled, count what
   * wants to move and what lags its state. */
  size_t to_staged = 0, ready = 0;
  uint64_t lagging = 0;
  for (size_t p = from; p < t->n; p++) {
    if (t->state[p] == CKV_STATE_RECYCLED && !demotes(s)) {
      if (t->block[p] != CKV_NO_BLOCK && !(t->flags[p] & CKV_TOKEN_PENDING) && !ckv_prefix_frozen(s, t->block[p]))
        recycle_now(s, p);
      continue;
    }
    if (t->state[p] == CKV_STATE_DRAFT || (t->flags[p] & CKV_TOKEN_PENDING) || t->block[p] == CKV_NO_BLOCK) continue;
    /* staged, committed or demoted, not moving: wants_staged, wants_commit and the lag at one look */
    uint32_t f = physical_format(s, p);
    if (ckv_prefix_frozen(s, t->block[p])) { /* in a shared block: its bytes stay as they are (prefix.h) */
      lagging++;
      continue;
    }
    bool committed = t->state[p] != CKV_STATE_STAGED;
    to_staged += f == CKV_FORMAT_DRAFT;
    ready += committed && f == CKV_FORMAT_STAGED;
    lagging += committed ? !ckv_format_is_committed_state(f) : f != CKV_FORMAT_STAGED;
  }
  s->pending = s->moving + lagging;
  if (ckv_compressor_room(c) == 0) { /* backpressure: planned on a later call */
    s->plan_dirty = true;
    s->plan_from = from;
    return CKV_OK;
  }

  plan_bound x;
  plan_bound_init(&x, s);
  uint32_t cf = commit_format(s);
  size_t take_n = ckv_format_is_rot(cf) ? ready
                  : flush               ? ready
                                        : ready / CKV_COMMIT_CHUNK_TOKENS * CKV_COMMIT_CHUNK_TOKENS;
  /* Each phase (draft -> staged, staged -> committed) has its own budget, so
   * a long run of the one never starves the other, and past it at most one
   * block per format more. */
  size_t most = to_staged + take_n, cap = 2 * x.budget + (size_t)CKV_FILL_COUNT * CKV_MAX_BLOCK_TOKENS;
  plan_buf b = {0};
  int r = plan_reserve(&b, most < cap ? most : cap);
  if (r < 0) return r;
  /* The new cursor: the first position left with something to plan. */
  size_t rest = t->n;
  /* draft -> staged, in position order, a run of slots per staged block */
  size_t p = from;
  for (; to_staged && r == CKV_OK;) {
    uint32_t room = fill_room(s, CKV_FILL_STAGED, 1);
    if (b.n >= x.budget) room = bound_room(s, &x, CKV_FILL_STAGED, 1);
    if (b.n >= x.budget && !room) {
      x.deferred = true;
      break;
    }
    uint32_t k = room ? room : s->staged_tokens;
    if (k > to_staged) k = (uint32_t)to_staged;
    uint32_t blk;
    uint16_t first;
    r = take(s, &x, CKV_FILL_STAGED, k, 1, &blk, &first);
    for (uint32_t i = 0; r == CKV_OK && i < k; p++) {
      if (!wants_staged(s, p)) continue;
      r = plan_push(&b, s, (uint32_t)p, blk, (uint16_t)(first + i));
      i++;
    }
    if (r == CKV_OK) to_staged -= k;
  }
  if (to_staged) rest = p;
  const size_t staged_n = b.n; /* the committing phase's budget counts from here */
  /* staged -> committed, one key chunk at a time */
  if (ckv_format_is_rot(cf)) { /* every token on its own: no chunk to wait for */
    for (p = from; p < t->n && r == CKV_OK && ready; p++) {
      if (!wants_commit(s, p)) continue;
      /* a demoted token goes to a block of demoted tokens only (cold) */
      uint32_t fi = fill_index(token_commit_format(s, cf, p), is_cold(s, p));
      if (b.n - staged_n >= x.budget && !bound_room(s, &x, fi, 1)) {
        x.deferred = true;
        if (p < rest) rest = p;
        if (!bound_open(s, &x)) break; /* no block of this call has room left: the rest waits */
        ready--;
        continue;
      }
      uint32_t blk;
      uint16_t slot;
      r = take(s, &x, fi, 1, 1, &blk, &slot);
      if (r == CKV_OK) r = plan_push(&b, s, (uint32_t)p, blk, slot);
      if (r == CKV_OK) ready--;
    }
    if (ready && p < rest) rest = p;
    take_n = 0;
  }
  p = from;
  for (size_t done = 0; p < t->n && done < take_n && r == CKV_OK;) {
    uint32_t chunk_n = take_n - done < CKV_COMMIT_CHUNK_TOKENS ? (uint32_t)(take_n - done) : CKV_COMMIT_CHUNK_TOKENS;
    if (b.n - staged_n >= x.budget &&
        bound_room(s, &x, fill_index(cf, false), CKV_COMMIT_CHUNK_TOKENS) < CKV_COMMIT_CHUNK_TOKENS) {
      x.deferred = true;
      break;
    }
    uint32_t blk;
    uint16_t first;
    r = take(s, &x, fill_index(cf, false), chunk_n, CKV_COMMIT_CHUNK_TOKENS, &blk, &first);
    if (r < 0) break;
    /* a partial chunk is sealed by its move: the rest of it stays empty */
    s->blocks[blk].used = (uint16_t)(first + CKV_COMMIT_CHUNK_TOKENS);
    for (uint32_t k = 0; k < chunk_n && p < t->n; p++) {
      if (!wants_commit(s, p)) continue;
      r = plan_push(&b, s, (uint32_t)p, blk, (uint16_t)(first + k));
      if (r < 0) break;
      k++;
      done++;
    }
    ready -= chunk_n;
  }
  if (!ckv_format_is_rot(cf) && ready && p < rest) rest = p; /* tokens waiting for a chunk, or deferred */
  s->plan_from = rest;
  s->pending -= b.n; /* counted as lagging, now moving (submit adds them) */
  *ret_deferred = x.deferred;
  if (x.deferred) s->plan_dirty = true; /* the rest: on the next call (publishing this job makes one) */
  if (r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE) {
    s->plan_dirty = true;
    s->stalled_on = r;
  }
  if (r < 0) s->plan_from = from; /* where it stopped is not known exactly: rescan */
  if (b.n == 0) {
    free(b.moves);
    free(b.recs);
    return r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE ? CKV_OK : r;
  }
  int sr = submit(s, c, &b, 0, NULL);
  if (sr < 0) {
    s->plan_from = from;
    return sr;
  }
  return r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE ? CKV_OK : r;
}

/* Points every move's src_hdr/dst_hdr at a copy of the daemon's own record
 * of the block (one copy per block, owned by the job): the kernels compute
 * offsets from these, never from the headers in the arena, which workers can
 * write.  Returns the array (NULL on -ENOMEM). */
static ckv_block_header *trusted_headers(const ckv_srv_session *s, plan_buf *b) {
  size_t nb = s->n_blocks ? s->n_blocks : 1, nu = b->n ? 2 * b->n : 1;
  uint32_t *copy_of = malloc(nb * sizeof(*copy_of));
  uint32_t *used = malloc(nu * sizeof(*used)); /* the blocks in order of first use: two per move at most */
  ckv_block_header *h = NULL;
  if (copy_of && used) {
    memset(copy_of, 0xff, nb * sizeof(*copy_of));
    size_t n = 0;
    for (size_t i = 0; i < b->n; i++) {
      uint32_t ends[2] = {b->recs[i].src_block, b->recs[i].dst_block};
      for (int e = 0; e < 2; e++)
        if (copy_of[ends[e]] == UINT32_MAX) {
          copy_of[ends[e]] = (uint32_t)n;
          used[n++] = ends[e];
        }
    }
    h = malloc((n ? n : 1) * sizeof(*h));
    if (h) {
      for (size_t k = 0; k < n; k++) h[k] = *ckv_srv_session_block_header(s, used[k]);
      for (size_t i = 0; i < b->n; i++) {
        b->moves[i].src_hdr = &h[copy_of[b->recs[i].src_block]];
        b->moves[i].dst_hdr = &h[copy_of[b->recs[i].dst_block]];
      }
    }
  }
  free(copy_of);
  free(used);
  return h;
}

static int submit(ckv_srv_session *s, ckv_compressor *c, plan_buf *b, int copy, ckv_job **ret_job) {
  ckv_tokens *t = &s->tokens;
  ckv_job *j = calloc(1, sizeof(*j));
  ckv_block_header *headers = j ? trusted_headers(s, b) : NULL;
  if (!headers) {
    free(j);
    for (size_t i = 0; i < b->n; i++) ckv_srv_session_release_slot(s, b->recs[i].dst_block);
    free(b->moves);
    free(b->recs);
    return -ENOMEM;
  }
  *j = (ckv_job){.lane = s->lane, .geom = s->geom, .moves = b->moves, .n_moves = b->n, .headers = headers,
                 .owner = s, .user = b->recs, .copy = copy, .mem = s->tenant->mem};
  /* The kernels read the blocks' headers: shadows reach the arena first. */
  int fr = ckv_srv_session_flush_meta(s);
  if (fr < 0) {
    for (size_t i = 0; i < b->n; i++) ckv_srv_session_release_slot(s, b->recs[i].dst_block);
    ckv_job_free(j); /* frees b->moves and b->recs */
    return fr;
  }
  for (size_t i = 0; i < b->n; i++) t->flags[b->recs[i].pos] |= CKV_TOKEN_PENDING;
  s->jobs_inflight++;
  if (ckv_compressor_submit(c, j) < 0) { /* cannot happen: room was checked and we are the only submitter */
    s->jobs_inflight--;
    for (size_t i = 0; i < b->n; i++) {
      t->flags[b->recs[i].pos] &= (uint8_t)~CKV_TOKEN_PENDING;
      ckv_srv_session_release_slot(s, b->recs[i].dst_block);
    }
    ckv_job_free(j);
    return CKV_ERR_BUSY;
  }
  s->moving += b->n;
  s->pending += b->n;
  if (ret_job) *ret_job = j;
  return CKV_OK;
}

/* What store/shared_moves.c borrows (ckv_shared_moves_ops). */
static int submit_group(ckv_srv_session *s, ckv_compressor *c, const uint32_t *pos, const uint16_t *dst_slot, size_t n,
                        uint32_t dst, ckv_job **ret_job) {
  plan_buf b = {0};
  int r = plan_reserve(&b, n);
  for (size_t i = 0; i < n && r == CKV_OK; i++) r = plan_push(&b, s, pos[i], dst, dst_slot[i]);
  if (r < 0) {
    for (size_t i = 0; i < n; i++) ckv_srv_session_release_slot(s, dst);
    free(b.moves);
    free(b.recs);
    return r;
  }
  return submit(s, c, &b, 0, ret_job);
}

static uint32_t rot_format(const ckv_srv_session *s, size_t pos) {
  uint32_t cf = commit_format(s);
  return ckv_format_is_rot(cf) ? token_commit_format(s, cf, pos) : CKV_FORMAT_COUNT_;
}

static const ckv_shared_moves_ops k_shared_ops = {.submit = submit_group, .rot_format = rot_format};

static int by_pos(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Blocks at most seven eighths full, not being filled, with no token in flight, move
 * their survivors to the fill block of their format (draft, staged).  At three
 * quarters, agent-synthetic ended with 124 staged tokens in three 64-slot blocks
 * (0.334 of FP16); at seven eighths in two (0.297), the copies being byte-exact
 * and INT8 blocks cheap to copy. */
static int compact(ckv_srv_session *s, ckv_compressor *c) {
  if (ckv_compressor_room(c) == 0) return CKV_OK;
  ckv_tokens *t = &s->tokens;
  /* sparse[b] = 1 for blocks worth emptying */
  const size_t n_known = s->n_blocks; /* reserve() may append blocks: they are never sparse */
  uint8_t *sparse = calloc(n_known ? n_known : 1, 1);
  if (!sparse) return -ENOMEM;
  size_t n_sparse = 0;
  for (size_t i = 0; i < s->n_blocks; i++) {
    const ckv_sblock *b = &s->blocks[i];
    if (b->format != CKV_FORMAT_DRAFT && b->format != CKV_FORMAT_STAGED) continue;
    if (ckv_prefix_frozen(s, (uint32_t)i)) continue; /* a shared block moves only as a whole (shared_moves.h) */
    bool filling = false;
    for (int f = 0; f < CKV_FILL_COUNT; f++) filling |= s->fill[f] == i;
    if (filling || b->used < b->capacity || b->refs == 0 || b->refs * 8u > b->capacity * 7u) continue;
    sparse[i] = 1;
    n_sparse++;
  }
  if (!n_sparse) {
    free(sparse);
    return CKV_OK;
  }
  /* A block waits when a move of one of its tokens is in flight, or when it
   * holds a draft token appended since the last report: the worker may still
   * be writing that token's K/V into the slot it was given.  A block's tokens
   * are its valid slots (the daemon's shadow of its header: positions and
   * valid bits), so only the sparse blocks are read, never every token. */
  const uint32_t reported = (uint32_t)s->last_round;
  uint32_t *cand = NULL;
  size_t n_cand = 0, cap_cand = 0;
  int r = CKV_OK;
  /* Whole blocks up to the plan's bound per call: the rest on the next one
   * (the copies are byte for byte, so where the cut falls changes no bytes). */
  const size_t budget = s->plan_max_moves ? s->plan_max_moves : CKV_MOVES_PLAN_MAX_MOVES;
  for (size_t i = 0; i < n_known && r == CKV_OK; i++) {
    if (!sparse[i]) continue;
    if (n_cand >= budget) {
      s->plan_dirty = true;
      break;
    }
    const uint8_t *meta = s->blocks[i].meta;
    const uint32_t *positions = ckv_block_positions_const(meta);
    size_t mark = n_cand;
    for (uint32_t slot = 0; slot < s->blocks[i].capacity && sparse[i]; slot++) {
      if (!ckv_block_slot_valid(meta, slot)) continue;
      uint32_t p = positions[slot];
      bool unreported = p < t->n && t->state[p] == CKV_STATE_DRAFT && t->last_transition[p] >= reported;
      /* a slot that is not its token's place would be a broken record: leave the block alone */
      if (p >= t->n || t->block[p] != i || t->slot[p] != slot || (t->flags[p] & CKV_TOKEN_PENDING) || unreported) {
        sparse[i] = 0;
        break;
      }
      if (n_cand == cap_cand) {
        size_t ncap = cap_cand ? cap_cand * 2 : 256;
        uint32_t *nc = realloc(cand, ncap * sizeof(*nc));
        if (!nc) {
          r = -ENOMEM;
          break;
        }
        cand = nc;
        cap_cand = ncap;
      }
      if (t->state[p] != CKV_STATE_RECYCLED || demotes(s)) cand[n_cand++] = p;
    }
    if (!sparse[i]) n_cand = mark;
  }
  if (r < 0) {
    free(cand);
    free(sparse);
    return r;
  }
  /* in position order, as a scan of the tokens would find them */
  if (n_cand > 1) qsort(cand, n_cand, sizeof(*cand), by_pos);
  plan_buf b = {0};
  r = plan_reserve(&b, n_cand);
  for (size_t i = 0; i < n_cand && r == CKV_OK; i++) {
    uint32_t p = cand[i], blk = t->block[p];
    uint32_t dst;
    uint16_t slot;
    r = reserve(s, fill_index(s->blocks[blk].format, false), 1, 1, &dst, &slot);
    if (r == CKV_OK && dst < n_known && sparse[dst]) r = CKV_ERR_STATE; /* cannot happen: fill blocks are never sparse */
    if (r == CKV_OK) r = plan_push(&b, s, p, dst, slot);
  }
  free(cand);
  free(sparse);
  if (b.n == 0) {
    free(b.moves);
    free(b.recs);
  } else {
    int sr = submit(s, c, &b, 1, NULL);
    if (sr < 0) return sr;
  }
  return r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE ? CKV_OK : r;
}

/* A rotated block that holds live and demoted tokens costs primary memory
 * for both: a block counts as cold (store/cold.h, View.cold, ByteCounts.cold)
 * only when every token in it is demoted.  Demoted tokens that reach a
 * committed format go to blocks of their own (fill_index(.., cold)); a
 * token demoted after it was committed, or recalled out of a cold block,
 * leaves such a mixed block here: whichever side of the block is smaller
 * moves (a rotated-to-rotated move: its rows are read back and quantized
 * again against the destination block's key means, in the format its state
 * asks for), so the block ends up all live or all cold.  Runs when the
 * last round demoted or recalled something (s->cold_dirty), bounded like a
 * plan; a block with a token in flight waits for a later call.
 * And a full cold block at most half of whose slots still hold a token (the
 * rest were recalled, or left as the smaller side) moves them all to the cold
 * fill block of their format, and retires.  Moving requantizes each token
 * against its new block's key mean: on the agent model (tune seed 9103, 24
 * dialogues) total bytes 0.280 -> 0.253 of FP16 with recall and KL as before.
 * Primary blocks are left alone: compacting them too (half full or less)
 * saved 0.002 of primary bytes and cost agent-synthetic's cosine 0.9912 ->
 * 0.9900; at three quarters 0.006, KL 0.0088 -> 0.0095 and one public answer. */
#define CKV_ROT_SPARSE_NUM 1
#define CKV_ROT_SPARSE_DEN 2

static int separate_cold(ckv_srv_session *s, ckv_compressor *c) {
  if (!demotes(s) || ckv_compressor_room(c) == 0) return CKV_OK;
  uint32_t cf = commit_format(s);
  if (!ckv_format_is_rot(cf)) {
    s->cold_dirty = false; /* KIVI blocks are chunk-sealed: their tokens do not move one by one */
    return CKV_OK;
  }
  ckv_tokens *t = &s->tokens;
  const size_t n_known = s->n_blocks, budget = s->plan_max_moves ? s->plan_max_moves : CKV_MOVES_PLAN_MAX_MOVES;
  plan_buf b = {0};
  bool all_seen = true;
  int r = CKV_OK;
  for (size_t i = 0; i < n_known && r == CKV_OK; i++) {
    const ckv_sblock *k = &s->blocks[i];
    if (!ckv_format_is_rot(k->format) || k->refs == 0 || ckv_prefix_frozen(s, (uint32_t)i)) continue; /* shared: never demoted */
    bool filling = false;
    for (int f = 0; f < CKV_FILL_COUNT; f++) filling |= s->fill[f] == i;
    if (filling) continue;
    /* reserve() below may grow the block table: k is not used after it, the shadow (meta) stays */
    const uint8_t *meta = k->meta;
    const uint32_t *positions = ckv_block_positions_const(meta);
    const uint32_t capacity = k->capacity;
    uint32_t live = 0, cold = 0;
    bool settled = true;
    for (uint32_t slot = 0; slot < capacity && settled; slot++) {
      if (!ckv_block_slot_valid(meta, slot)) continue;
      uint32_t p = positions[slot];
      /* a slot that is not its token's place would be a broken record: leave the block alone */
      settled = p < t->n && t->block[p] == i && t->slot[p] == slot && !(t->flags[p] & CKV_TOKEN_PENDING);
      if (settled) *(is_cold(s, p) ? &cold : &live) += 1;
    }
    if (!settled) {
      all_seen = false;
      continue;
    }
    /* sparse: at most CKV_ROT_SPARSE_NUM / CKV_ROT_SPARSE_DEN of its slots hold a token: all of them move */
    bool move_cold = cold <= live;
    /* a cold block (or one left cold once its live side moves out) at most half full: all of it moves */
    bool sparse = (!live || !move_cold) && k->used == capacity && cold * CKV_ROT_SPARSE_DEN <= capacity * CKV_ROT_SPARSE_NUM;
    if ((!live || !cold) && !sparse) continue;
    uint32_t n_move = sparse ? live + cold : move_cold ? cold : live;
    if (b.n + n_move > budget) {
      all_seen = false;
      break;
    }
    if ((r = plan_reserve(&b, b.n + n_move)) < 0) break;
    for (uint32_t slot = 0; slot < capacity && r == CKV_OK; slot++) {
      if (!ckv_block_slot_valid(meta, slot)) continue;
      uint32_t p = positions[slot];
      if (!sparse && is_cold(s, p) != move_cold) continue;
      move_cold = is_cold(s, p);
      uint32_t dst;
      uint16_t dst_slot;
      r = reserve(s, fill_index(token_commit_format(s, cf, p), move_cold), 1, 1, &dst, &dst_slot);
      if (r == CKV_OK) r = plan_push(&b, s, p, dst, dst_slot);
    }
  }
  if (r == CKV_OK && all_seen) s->cold_dirty = false;
  if (r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE) { /* no destination block: the tokens stay, mixed, for now */
    s->stalled_on = r;
    r = CKV_OK;
  }
  if (b.n == 0) {
    free(b.moves);
    free(b.recs);
    return r;
  }
  int sr = submit(s, c, &b, 0, NULL);
  return sr < 0 ? sr : r;
}

/* Failures that say a block's bytes are not what the daemon wrote there (a
 * worker wrote outside its K/V payload): retrying would fail the same way. */
static bool corrupt_status(int st) {
  return st == CKV_ERR_CORRUPT || st == CKV_ERR_FORMAT || st == CKV_ERR_STATE || st == CKV_ERR_RANGE ||
         st == CKV_ERR_INVALID || st == CKV_ERR_UNSUPPORTED;
}

bool ckv_moves_job_failed(ckv_srv_session *s, int status) {
  if (s->quarantined) return false;
  s->job_failures++;
  if (!corrupt_status(status) && s->job_failures < CKV_LIFECYCLE_MAX_JOB_FAILURES) return false;
  s->quarantined = true;
  snprintf(s->quarantine_reason, sizeof(s->quarantine_reason), "moving its tokens failed%s: %s",
           corrupt_status(status) ? " on bytes the daemon did not write" : " repeatedly", ckv_strerror(status));
  return true;
}

void ckv_moves_publish(ckv_srv_session *s, ckv_compressor *c, ckv_job *j) {
  move_rec *recs = j->user;
  ckv_tokens *t = &s->tokens;
  s->jobs_inflight--;
  s->moving -= j->n_moves;
  const bool shared = ckv_shared_moves_owns(s, j);
  if (s->doomed) {
    if (shared) ckv_shared_moves_abandon(s);
    ckv_job_free(j);
    return;
  }
  if (shared) { /* a shared run compressed once (shared_moves.h) */
    if (j->status >= 0) s->job_failures = 0;
    ckv_shared_moves_publish(s, j, &k_shared_ops);
    (void)ckv_moves_plan(s, c, false);
    return;
  }
  if (j->status >= 0) s->job_failures = 0;
  else s->plan_from = 0; /* its tokens stay where they were: plan them again */
  for (size_t i = 0; i < j->n_moves; i++) {
    move_rec *m = &recs[i];
    t->flags[m->pos] &= (uint8_t)~CKV_TOKEN_PENDING;
    if (j->status < 0) { /* the kernel refused: keep the token where it is */
      ckv_srv_session_release_slot(s, m->dst_block);
      continue;
    }
    void *dst = ckv_srv_session_block_meta(s, m->dst_block), *src = ckv_srv_session_block_meta(s, m->src_block);
    bool live = t->state[m->pos] != CKV_STATE_RECYCLED || demotes(s);
    /* The kernel wrote the position too; a shadow needs it, or its next flush would undo it. */
    ckv_block_positions(dst)[m->dst_slot] = (uint32_t)m->pos;
    if (live) ckv_block_set_valid(dst, m->dst_slot, true); /* publish the copy before hiding the original */
    ckv_block_set_valid(src, m->src_slot, false);
    t->block[m->pos] = live ? m->dst_block : CKV_NO_BLOCK;
    t->slot[m->pos] = m->dst_slot;
    /* A token that moved on meanwhile (or is logically committed and went
     * to staged first) still lags: the next plan must look at it again. */
    if (live && m->pos < s->plan_from && lags(s, m->pos)) s->plan_from = m->pos;
    ckv_srv_session_release_slot(s, m->src_block);
    if (!live) { /* recycled while it moved, without demotion: its bytes go, counted as recycle_now does */
      ckv_srv_session_release_slot(s, m->dst_block);
      s->tokens_dropped++;
    }
  }
  s->epoch++;
  ckv_job_free(j);
  (void)ckv_moves_plan(s, c, false);
}

/* Demoted tokens the last report found attended (ckv_srv_session_report_round
 * noted them): back to committed, their blocks primary again. */
static int recall(ckv_srv_session *s, uint32_t round, ckv_transition_list *out) {
  ckv_tokens *t = &s->tokens;
  int r = CKV_OK;
  for (size_t i = 0; i < s->n_recall && r == CKV_OK; i++) {
    uint32_t p = s->recall[i];
    if (p >= t->n || !is_cold(s, p)) continue;
    if ((r = ckv_transition_list_add(out, p, CKV_STATE_RECYCLED, CKV_STATE_COMMITTED)) < 0) break;
    t->state[p] = CKV_STATE_COMMITTED;
    t->last_transition[p] = round;
    t->last_attended[p] = round;
    s->tokens_recalled++;
  }
  s->n_recall = 0;
  return r;
}

int ckv_moves_round(ckv_srv_session *s, ckv_compressor *c, uint32_t round, ckv_transition_list *out) {
  size_t before = out->n;
  /* A KIVI session has one committed format, and a lossy one (KIVI4 on
   * every token past the window: stories260K KL 0.16-0.19 against INT8's
   * 0.003), so only tokens that went cold commit, and only after
   * KIVI_PERSISTENCE_FACTOR x persistence_rounds staged: warm tokens and
   * attention-hot facts stay INT8 (the rotated formats' bits by value keep
   * them at more bits instead).  stories260K, seeds 1-6, 2 sessions each:
   * KL per session at most 0.014 at 0.545 of FP16 after 20 rounds, 0.045 at
   * 0.478 after 30 (int8 0.004 at 0.589 / 0.573); committing warm and hot
   * tokens after persistence_rounds gave 0.44-0.53 with drops, 0.074 at
   * 0.459 and 0.123 at 0.413 without. */
  const ckv_judge_params *jp = &s->params;
  ckv_judge_params kivi;
  if (!ckv_format_is_rot(commit_format(s))) {
    kivi = s->params;
    kivi.warm_commit = 0;
    kivi.high_attn_threshold = KIVI_HOT_NEVER_COMMITS;
    kivi.persistence_rounds = kivi.persistence_rounds < UINT32_MAX / KIVI_PERSISTENCE_FACTOR
                                  ? kivi.persistence_rounds * KIVI_PERSISTENCE_FACTOR
                                  : UINT32_MAX;
    jp = &kivi;
  }
  int r = recall(s, round, out);
  if (r == CKV_OK) r = ckv_judge_run(&s->tokens, round, jp, out);
  bool cold_changed = false;
  for (size_t i = before; i < out->n; i++) {
    const ckv_transition_range *tr = &out->v[i];
    s->count_by_state[tr->from] -= tr->count;
    s->count_by_state[tr->to] += tr->count;
    s->transitions[tr->from][tr->to] += tr->count;
    if (tr->first < s->plan_from) s->plan_from = (size_t)tr->first;
    cold_changed |= tr->from == CKV_STATE_RECYCLED || tr->to == CKV_STATE_RECYCLED;
  }
  /* A block that went cold (or warm again) moves between the view's lists:
   * a new epoch makes the worker fetch it. */
  if (cold_changed && demotes(s)) {
    s->epoch++;
    s->cold_dirty = true; /* blocks may now hold live and demoted tokens: separate_cold */
  }
  if (r < 0) return r;
  /* Nothing decided and nothing left over: the bytes already match. */
  if (out->n == before && !s->plan_dirty && !s->shared_waiting) return CKV_OK;
  return ckv_moves_plan(s, c, false);
}

uint64_t ckv_moves_pending(const ckv_srv_session *s) { return s->pending; }

static uint64_t count_pending(const ckv_srv_session *s) {
  const ckv_tokens *t = &s->tokens;
  uint64_t n = 0;
  for (size_t p = 0; p < t->n; p++) {
    if (t->flags[p] & CKV_TOKEN_PENDING) {
      n++;
      continue;
    }
    if (lags(s, p)) n++;
  }
  return n;
}

long ckv_moves_escalate(ckv_srv_session *s, ckv_compressor *c, int from, ckv_transition_list *out) {
  ckv_tokens *t = &s->tokens;
  const uint8_t to = from == CKV_STATE_DRAFT ? CKV_STATE_STAGED : CKV_STATE_COMMITTED;
  const uint32_t round = (uint32_t)s->last_round;
  size_t end = t->n > s->params.recent_window ? t->n - s->params.recent_window : 0;
  long n = 0;
  for (size_t p = s->params.sink_tokens; p < end; p++) {
    if (t->state[p] != from || (t->flags[p] & CKV_TOKEN_PENDING) || ckv_judge_protected(t, p, &s->params)) continue;
    if (from == CKV_STATE_DRAFT && t->last_transition[p] >= round) continue; /* not reported yet */
    if (ckv_transition_list_add(out, p, (uint8_t)from, to) < 0) return -ENOMEM;
    t->state[p] = to;
    t->last_transition[p] = round;
    s->count_by_state[from]--;
    s->count_by_state[to]++;
    s->transitions[from][to]++;
    n++;
  }
  if (n) {
    s->plan_from = 0; /* states changed all over */
    (void)ckv_moves_plan(s, c, /* flush= */ true);
  }
  return n;
}

typedef struct valued {
  float value;
  uint32_t pos;
} valued;

/* Bytes that recycling every candidate would give back: the blocks all of
 * whose slots are candidates and that are not being filled. */
static uint64_t reclaimable_bytes(const ckv_srv_session *s, const valued *cand, size_t nc) {
  uint32_t *left = calloc(s->n_blocks ? s->n_blocks : 1, sizeof(*left));
  if (!left) return UINT64_MAX; /* unknown: let the loop try */
  for (size_t b = 0; b < s->n_blocks; b++) left[b] = s->blocks[b].refs;
  for (size_t i = 0; i < nc; i++) {
    uint32_t b = s->tokens.block[cand[i].pos];
    if (b != CKV_NO_BLOCK && left[b]) left[b]--;
  }
  uint64_t bytes = 0;
  for (size_t b = 0; b < s->n_blocks; b++) {
    const ckv_sblock *k = &s->blocks[b];
    if (k->format == CKV_BLOCK_UNUSED || left[b]) continue;
    bool filling = false;
    for (int f = 0; f < CKV_FILL_COUNT; f++) filling |= s->fill[f] == b && k->used < k->capacity;
    if (!filling) bytes += k->bytes;
  }
  free(left);
  return bytes;
}

static int by_value(const void *a, const void *b) {
  const valued *x = a, *y = b;
  if (x->value != y->value) return x->value < y->value ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

int ckv_moves_reclaim(ckv_srv_session *s, ckv_compressor *c, uint64_t need, ckv_transition_list *out,
                          uint64_t *ret_recycled) {
  ckv_tokens *t = &s->tokens;
  uint64_t recycled = 0;
  (void)c;
  if (ckv_tenant_would_fit(s->tenant, need)) goto done;
  /* The requester will re-read its view from the reply's epoch: what it
   * retired so far can go now. */
  ckv_srv_session_release_retired(s);
  if (ckv_tenant_would_fit(s->tenant, need)) goto done;
  /* Fill blocks left without a token (their tokens moved on or were compacted
   * away) cost bytes and hold nothing: they go before any token does. */
  bool dropped = false;
  for (int f = 0; f < CKV_FILL_COUNT; f++) {
    uint32_t b = s->fill[f];
    if (b != CKV_NO_BLOCK && s->blocks[b].refs == 0) {
      ckv_srv_session_retire_block(s, b);
      dropped = true;
    }
  }
  if (dropped) ckv_srv_session_release_retired(s);
  if (ckv_tenant_would_fit(s->tenant, need)) goto done;
  /* Lowest value first: mean attention over the history plus semantic score. */
  size_t end = t->n > s->params.recent_window ? t->n - s->params.recent_window : 0;
  valued *cand = malloc((end ? end : 1) * sizeof(*cand));
  if (!cand) return -ENOMEM;
  size_t nc = 0;
  uint32_t round = (uint32_t)s->last_round;
  for (size_t p = 0; p < end; p++) {
    if ((t->flags[p] & CKV_TOKEN_PENDING) || ckv_prefix_frozen(s, t->block[p])) continue; /* shared: not ours to drop */
    if (is_cold(s, p)) { /* demoted tokens go first, oldest first: the quota rule drops them */
      cand[nc++] = (valued){-1.f, (uint32_t)p};
      continue;
    }
    if (t->state[p] == CKV_STATE_RECYCLED || ckv_judge_protected(t, p, &s->params)) continue;
    float v = ckv_tokens_attn_mean(t, p, round, s->params.history_rounds) + ckv_q16_to_unit(t->semantic[p]);
    cand[nc++] = (valued){v, (uint32_t)p};
  }
  qsort(cand, nc, sizeof(*cand), by_value);
  /* Refuse before recycling anything when even recycling every candidate
   * could not make the room: a refused append must lose nothing. */
  if (reclaimable_bytes(s, cand, nc) < s->tenant->bytes_used - s->tenant->held_bytes + need - s->tenant->quota_bytes) nc = 0;
  for (size_t i = 0; i < nc && !ckv_tenant_would_fit(s->tenant, need); i++) {
    uint32_t p = cand[i].pos;
    uint8_t from = t->state[p];
    if (from == CKV_STATE_RECYCLED) { /* demoted: its bytes go for good (recycle_now counts the drop) */
      recycle_now(s, p);
      recycled++;
      ckv_srv_session_release_retired(s);
      continue;
    }
    if (ckv_transition_list_add(out, p, from, CKV_STATE_RECYCLED) < 0) break;
    t->state[p] = CKV_STATE_RECYCLED;
    t->last_transition[p] = round;
    s->count_by_state[from]--;
    s->count_by_state[CKV_STATE_RECYCLED]++;
    s->transitions[from][CKV_STATE_RECYCLED]++;
    recycle_now(s, p);
    recycled++;
    ckv_srv_session_release_retired(s);
  }
  free(cand);
done:
  s->pending = count_pending(s);
  if (ret_recycled) *ret_recycled = recycled;
  return ckv_tenant_would_fit(s->tenant, need) ? CKV_OK : CKV_ERR_QUOTA;
}
