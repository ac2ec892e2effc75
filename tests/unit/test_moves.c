/* tests/unit/test_lifecycle.c - daemon/lifecycle.c with a real tenant (host
 * memfd arena), session and compressor (synchronous and with 2 threads), in
 * process: FP16 K/V written into the draft slots reads back through each
 * live token's block (ckv_kernels_dequantize) within its format's
 * quantization step after any number of rounds; state counts and bytes add
 * up; a reader holding a stale view keeps its blocks until it acks; quota
 * pressure recycles (and reports) before it refuses, and usage never exceeds
 * the quota. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "store/compressor.h"
#include "daemon/config.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/tenant.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "shm/arena.h"
#include "testutil.h"

enum { D = CKV_STATE_DRAFT, S = CKV_STATE_STAGED, C = CKV_STATE_COMMITTED, X = CKV_STATE_RECYCLED };
enum { ROLE_SYSTEM = 1, ROLE_USER = 2 };

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u
#define ELEMS (HEADS * DIM) /* one token's K (or V) of one layer */
#define TOKEN_FLOATS (LAYERS * 2u * ELEMS)

typedef struct fx {
  ckv_geometry g;
  ckv_tenant *tenant;
  ckv_compressor *comp;
  ckv_srv_session *s;
  uint64_t next_id;
  unsigned threads;
  float *expect; /* [pos][layer][kv][ELEMS], the FP16 values written */
  size_t expect_cap;
  uint64_t recycled_reported; /* tokens listed as recycled, in every transition list */
  uint8_t *reported_state;    /* per position: the state the transition lists brought it to */
  uint64_t peak_bytes;
  bool lax_formats; /* under quota pressure a move may wait for room */
} fx;

static ckv_judge_params params_for(int policy) {
  return (ckv_judge_params){.policy = policy,
                            .attn_threshold = 1.0f,
                            .semantic_threshold = 0.3f,
                            .high_attn_threshold = 2.0f,
                            .history_rounds = 8,
                            .sink_tokens = 4,
                            .recent_window = 16,
                            .persistence_rounds = 2,
                            .idle_rounds = 6,
                            .budget = 0.25f,
                            .commit_bits = policy == CKV_POLICY_KIVI2 ? 2 : 4,
                            .prune_keep = 1.0f,
                            .semantic_estimate_enabled = 1};
}

static void fx_init(fx *f, const ckv_judge_params *p, uint64_t quota, unsigned threads) {
  memset(f, 0, sizeof(*f));
  f->g = (ckv_geometry){LAYERS, HEADS, DIM, CKV_DTYPE_FP16};
  f->threads = threads;
  cr_assert_eq(ckv_tenant_new("t", quota, quota + quota / 8 + (16u << 20), 1, &ckv_arena_host_backend, &f->tenant),
               CKV_OK);
  cr_assert_eq(ckv_compressor_new(threads, 64, &f->comp), CKV_OK);
  uint32_t dt = 16, ct = 64;
  cr_assert_eq(ckv_srv_session_check_geometry(&f->g, &dt, &ct), CKV_OK);
  cr_assert_eq(ckv_srv_session_new("s1", f->tenant, &f->g, dt, ct, ckv_policy_names[p->policy], p, &f->next_id,
                                   &f->s),
               CKV_OK);
  f->s->owner = 1; /* an attached reader: retired blocks wait for its ack */
  f->s->lane = 1;
}

/* Publishes every job of the session, including those planned by publishing. */
static void settle(fx *f) {
  for (;;) {
    ckv_compressor_drain_lane(f->comp, f->s->lane);
    ckv_job *j = ckv_compressor_collect(f->comp);
    if (!j) {
      if (!f->s->jobs_inflight) break;
      continue;
    }
    while (j) {
      ckv_job *next = j->next;
      cr_assert_eq(j->status, CKV_OK, "a compressor move failed: %d", j->status);
      ckv_moves_publish(f->s, f->comp, j);
      j = next;
    }
  }
}

static void fx_done(fx *f) {
  settle(f);
  f->comp = ckv_compressor_free(f->comp);
  f->s = ckv_srv_session_free(f->s);
  cr_expect_eq(f->tenant->bytes_used, 0, "session freed but %llu bytes still allocated",
               (unsigned long long)f->tenant->bytes_used);
  f->tenant = ckv_tenant_free(f->tenant);
  free(f->expect);
  free(f->reported_state);
}

static void track_transitions(fx *f, const ckv_transition_list *l, size_t from_index) {
  for (size_t i = from_index; i < l->n; i++) {
    const ckv_transition_range *r = &l->v[i];
    for (uint32_t k = 0; k < r->count; k++) {
      size_t pos = r->first + k;
      cr_assert_lt(pos, f->s->tokens.n);
      cr_assert_eq(f->reported_state[pos], r->from, "token %zu reported from %u but was reported %u", pos, r->from,
                   f->reported_state[pos]);
      f->reported_state[pos] = r->to;
    }
    if (r->to == X) f->recycled_reported += r->count;
  }
}

/* Appends `count` tokens and writes their K/V into the draft slots. */
static int append(fx *f, uint32_t count, uint8_t role, const float *semantic) {
  ckv_srv_session *s = f->s;
  size_t max_runs = ckv_srv_session_max_runs(s, count), n_runs = 0;
  ckv_slot_run *runs = calloc(max_runs, sizeof(*runs));
  uint8_t *roles = malloc(count);
  cr_assert(runs && roles);
  memset(roles, role, count);
  uint64_t first = 0;
  int r = ckv_srv_session_append(s, count, roles, NULL, semantic, NULL, runs, &n_runs, &first);
  free(roles);
  if (r != CKV_OK) {
    free(runs);
    return r;
  }
  if (s->tokens.n > f->expect_cap) {
    f->expect_cap = s->tokens.n * 2;
    f->expect = realloc(f->expect, f->expect_cap * TOKEN_FLOATS * sizeof(float));
    f->reported_state = realloc(f->reported_state, f->expect_cap);
    cr_assert(f->expect && f->reported_state);
  }
  uint32_t seen = 0;
  for (size_t i = 0; i < n_runs; i++) {
    for (uint32_t k = 0; k < runs[i].count; k++, seen++) {
      size_t pos = runs[i].first_position + k;
      cr_assert_eq(s->tokens.block[pos], runs[i].block);
      cr_assert_eq(s->tokens.slot[pos], runs[i].first_slot + k);
    }
  }
  cr_assert_eq(seen, count, "slot runs do not cover the append");
  for (size_t pos = first; pos < first + count; pos++) {
    f->reported_state[pos] = D;
    uint32_t blk = s->tokens.block[pos];
    uint8_t *base = ckv_srv_session_block_ptr(s, blk);
    uint32_t cap = s->blocks[blk].capacity;
    for (uint32_t layer = 0; layer < LAYERS; layer++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        uint16_t *dst = (uint16_t *)(base + ckv_draft_kv_offset(&f->g, cap, layer, kv, s->tokens.slot[pos]));
        float *ex = &f->expect[pos * TOKEN_FLOATS + (layer * 2 + kv) * ELEMS];
        for (uint32_t e = 0; e < ELEMS; e++) {
          dst[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, kv, e));
          ex[e] = ckv_f16_to_f32(dst[e]);
        }
      }
  }
  free(runs);
  return CKV_OK;
}

/* Round `round` with attention attn[0..n), then the judge and every move. */
static void round_run(fx *f, uint32_t round, const float *attn, bool ack) {
  ckv_srv_session *s = f->s;
  cr_assert_eq(ckv_srv_session_report_round(s, round, 0, attn, s->tokens.n, NULL, NULL, 0), CKV_OK);
  ckv_transition_list out = {0};
  cr_assert_eq(ckv_moves_round(s, f->comp, round, &out), CKV_OK);
  track_transitions(f, &out, 0);
  ckv_transition_list_done(&out);
  settle(f);
  if (f->tenant->bytes_used > f->peak_bytes) f->peak_bytes = f->tenant->bytes_used;
  if (ack) cr_assert_eq(ckv_srv_session_ack(s, s->epoch, NULL), CKV_OK);
}

/* Largest error a format may add to values in [-1, 1] (kernels/quant.h):
 * INT8 symmetric, half a step of absmax/127 (scale rounded up to FP16);
 * committed: half a step of (max - min)/(2^b - 1) over a group, computed from
 * the INT8 values (staged -> committed), plus the INT8 error. */
static float tolerance(uint32_t format) {
  const float int8 = 0.5f * (1.f / 127.f) * 1.002f + 1e-6f;
  switch (format) {
    case CKV_FORMAT_DRAFT: return 0.f; /* exactly as written */
    case CKV_FORMAT_STAGED: return int8;
    case CKV_FORMAT_COMMIT4: return 0.5f * (2.f + 2 * int8) / 15.f * 1.002f + int8 + 1e-5f;
    default: return 0.5f * (2.f + 2 * int8) / 3.f * 1.002f + int8 + 1e-5f;
  }
}

/* Every invariant of a settled session: each live token reads back from its
 * published block within its format's step; recycled tokens have no block;
 * each block's valid slots are exactly the tokens placed in it; counts add
 * up; the tenant's bytes are the session's. */
static void verify(fx *f) {
  ckv_srv_session *s = f->s;
  const ckv_tokens *t = &s->tokens;
  /* What a reader sees: the daemon's header shadows written into the arena. */
  cr_assert_eq(ckv_srv_session_flush_meta(s), CKV_OK);
  uint64_t col[4] = {0};
  uint32_t *placed = calloc(s->n_blocks + 1, sizeof(uint32_t));
  float out[ELEMS];
  cr_assert_not_null(placed);
  for (size_t pos = 0; pos < t->n; pos++) {
    uint8_t st = t->state[pos];
    col[st]++;
    cr_assert_eq(f->reported_state[pos], st, "token %zu is %u but the transition lists say %u", pos, st,
                 f->reported_state[pos]);
    cr_assert_eq(t->flags[pos] & CKV_TOKEN_PENDING, 0, "token %zu still pending after settle", pos);
    if (st == X) {
      cr_assert_eq(t->block[pos], CKV_NO_BLOCK, "recycled token %zu still holds a slot", pos);
      continue;
    }
    uint32_t blk = t->block[pos], slot = t->slot[pos];
    cr_assert_neq(blk, CKV_NO_BLOCK, "live token %zu (state %u) has no block: lost", pos, st);
    cr_assert_lt(blk, s->n_blocks);
    uint32_t fmt = s->blocks[blk].format;
    cr_assert_neq(fmt, CKV_BLOCK_UNUSED, "token %zu points at a freed block", pos);
    /* the bytes follow the state (committed tokens may wait, staged, for a full chunk) */
    if (st == D) cr_assert_eq(fmt, CKV_FORMAT_DRAFT, "draft token %zu in format %u", pos, fmt);
    if (st == S && !f->lax_formats) cr_assert_eq(fmt, CKV_FORMAT_STAGED, "staged token %zu in format %u", pos, fmt);
    if (st == C && !f->lax_formats)
      cr_assert(fmt == CKV_FORMAT_STAGED || ckv_format_is_commit(fmt), "committed token %zu in %u", pos, fmt);
    if (st == S) cr_assert(fmt == CKV_FORMAT_DRAFT || fmt == CKV_FORMAT_STAGED, "staged token %zu in %u", pos, fmt);
    placed[blk]++;
    const void *base = ckv_srv_session_block_ptr(s, blk);
    cr_assert(ckv_block_slot_valid(base, slot), "token %zu: slot %u of block %u not valid", pos, slot, blk);
    cr_assert_eq(ckv_block_positions_const(base)[slot], pos, "block %u slot %u holds another position", blk, slot);
    float tol = tolerance(fmt);
    for (uint32_t layer = 0; layer < LAYERS; layer++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        cr_assert_eq(ckv_kernels_dequantize(&f->g, base, layer, kv, slot, out), CKV_OK, "token %zu", pos);
        const float *ex = &f->expect[pos * TOKEN_FLOATS + (layer * 2 + kv) * ELEMS];
        for (uint32_t e = 0; e < ELEMS; e++)
          cr_assert(fabsf(out[e] - ex[e]) <= tol,
                    "token %zu (state %u, format %u) layer %u %s[%u]: read %f, wrote %f (tolerance %f)", pos, st, fmt,
                    layer, kv ? "V" : "K", e, out[e], ex[e], tol);
      }
  }
  for (size_t b = 0; b < s->n_blocks; b++) {
    if (s->blocks[b].format == CKV_BLOCK_UNUSED) continue;
    const void *base = ckv_srv_session_block_ptr(s, (uint32_t)b);
    uint32_t valid = 0;
    for (uint32_t slot = 0; slot < s->blocks[b].capacity; slot++) valid += ckv_block_slot_valid(base, slot);
    cr_assert_eq(valid, placed[b], "block %zu: %u valid slots for %u tokens placed there", b, valid, placed[b]);
  }
  for (int k = 0; k < 4; k++)
    cr_assert_eq(s->count_by_state[k], col[k], "count_by_state[%d] = %llu, column %llu", k,
                 (unsigned long long)s->count_by_state[k], (unsigned long long)col[k]);
  cr_assert_eq(col[0] + col[1] + col[2] + col[3], t->n, "state counts must add up to the tokens appended");
  cr_assert_eq(f->tenant->bytes_used, ckv_srv_session_bytes(s));
  cr_assert_leq(f->tenant->bytes_used, f->tenant->quota_bytes);
  free(placed);
}

/* ---- round trip: every live token reads back ---- */

/* Attention for round `round`: planted facts (every 8th position) hot; the
 * current turn warm; older ordinary tokens cold, and every third of those
 * forgotten after a while (so they go idle and are recycled). */
static float *attention(const fx *f, uint32_t round) {
  size_t n = f->s->tokens.n;
  float *a = calloc(n + 1, sizeof(float));
  cr_assert_not_null(a);
  for (size_t pos = 0; pos < n; pos++) {
    if (pos % 8 == 1) a[pos] = 4.f;
    else if (pos + 24 >= n) a[pos] = 1.f;
    else if (pos % 3 == 0 && round > 6) a[pos] = 0.f;
    else a[pos] = 0.3f;
  }
  return a;
}

static void round_trip(int policy, unsigned threads, uint32_t rounds) {
  ckv_judge_params p = params_for(policy);
  fx f;
  fx_init(&f, &p, 64u << 20, threads);
  float sem[24];
  /* facts meaningful; the text forgotten later (pos % 3 == 0) of little
   * meaning, so once cold it is not a lasting fact and may go */
  for (int i = 0; i < 24; i++) sem[i] = i % 8 == 1 ? 0.9f : i % 3 == 0 ? 0.2f : 0.5f;
  uint64_t physical[4] = {0};
  for (uint32_t round = 1; round <= rounds; round++) {
    cr_assert_eq(append(&f, 24, round == 1 ? ROLE_SYSTEM : ROLE_USER, sem), CKV_OK);
    float *a = attention(&f, round);
    round_run(&f, round, a, true);
    free(a);
    verify(&f);
  }
  for (size_t b = 0; b < f.s->n_blocks; b++)
    if (f.s->blocks[b].format != CKV_BLOCK_UNUSED) physical[f.s->blocks[b].format]++;
  uint64_t *cnt = f.s->count_by_state;
  switch (policy) {
    case CKV_POLICY_COMMITKV:
      cr_expect_gt(cnt[S], 0);
      cr_expect_gt(cnt[C], 0);
      cr_expect_gt(cnt[X], 0);
      cr_expect_gt(physical[CKV_FORMAT_STAGED], 0);
      cr_expect_gt(physical[CKV_FORMAT_COMMIT4], 0, "no committed block after %u rounds", rounds);
      break;
    case CKV_POLICY_INT8: cr_expect_gt(physical[CKV_FORMAT_STAGED], 0); break;
    case CKV_POLICY_KIVI4: cr_expect_gt(physical[CKV_FORMAT_COMMIT4], 0); break;
    case CKV_POLICY_KIVI2: cr_expect_gt(physical[CKV_FORMAT_COMMIT2], 0); break;
    case CKV_POLICY_H2O:
    case CKV_POLICY_STREAMING: cr_expect_gt(cnt[X], 0); break;
    default: break;
  }
  cr_expect_eq(f.recycled_reported, cnt[X]);
  /* committed/staged storage is smaller than FP16 for what it holds */
  if (policy != CKV_POLICY_FP16 && policy != CKV_POLICY_H2O && policy != CKV_POLICY_STREAMING)
    cr_expect_lt(ckv_srv_session_bytes(f.s), ckv_srv_session_fp16_bytes(f.s) + 2 * ckv_draft_block_bytes(&f.g, 16));
  fx_done(&f);
}

Test(lifecycle, commitkv_round_trip_sync) { round_trip(CKV_POLICY_COMMITKV, 0, 24); }

/* After every round's moves, no block holds bytes without a token: a block
 * with no ref is at most a fresh fill block (no slot used yet).  A staged
 * fill block whose tokens had all committed stayed to the session's end
 * (commitkv-bench agents: 0.0016 of FP16 per settled session).  The defaults
 * (rotated formats, demotion), which verify() does not read: the integration
 * suites read their bytes back. */
Test(lifecycle, no_block_left_without_a_token) {
  ckv_judge_params p; /* the defaults: every staged token ends committed */
  ckv_judge_params_init(&p);
  p.policy = CKV_POLICY_COMMITKV;
  fx f;
  fx_init(&f, &p, 64u << 20, 0);
  float sem[24];
  for (int i = 0; i < 24; i++) sem[i] = i % 8 == 1 ? 0.9f : i % 3 == 0 ? 0.2f : 0.5f;
  for (uint32_t round = 1; round <= 40; round++) {
    if (round <= 16) cr_assert_eq(append(&f, 24, ROLE_USER, sem), CKV_OK);
    float *a = attention(&f, round);
    round_run(&f, round, a, true);
    free(a);
    for (uint32_t b = 0; b < f.s->n_blocks; b++) {
      const ckv_sblock *k = &f.s->blocks[b];
      if (k->format == CKV_BLOCK_UNUSED || k->refs) continue;
      cr_assert_eq(k->used, 0, "round %u: block %u (format %u) holds %u used slots and no token", round, b,
                   k->format, k->used);
    }
  }
  fx_done(&f);
}
Test(lifecycle, commitkv_round_trip_two_threads) { round_trip(CKV_POLICY_COMMITKV, 2, 24); }
Test(lifecycle, int8_round_trip) { round_trip(CKV_POLICY_INT8, 2, 8); }
Test(lifecycle, kivi4_round_trip) { round_trip(CKV_POLICY_KIVI4, 0, 10); }
Test(lifecycle, kivi2_round_trip) { round_trip(CKV_POLICY_KIVI2, 2, 10); }
Test(lifecycle, h2o_round_trip) { round_trip(CKV_POLICY_H2O, 0, 12); }
Test(lifecycle, streaming_round_trip) { round_trip(CKV_POLICY_STREAMING, 2, 12); }

/* ---- a stale view stays valid until the ack ---- */

typedef struct held {
  uint32_t index;
  uint64_t offset, bytes;
  uint32_t capacity;
  uint32_t used; /* slots handed out at epoch E: a block still being filled takes new slots */
  const uint8_t *ptr;
  uint8_t *copy;
} held;

static void stale_view(unsigned threads) {
  ckv_judge_params p = params_for(CKV_POLICY_KIVI4); /* moves everything past the window, quickly */
  fx f;
  fx_init(&f, &p, 64u << 20, threads);
  ckv_srv_session *s = f.s;
  cr_assert_eq(append(&f, 96, ROLE_USER, NULL), CKV_OK); /* 6 draft blocks */
  float *a = attention(&f, 1);
  round_run(&f, 1, a, true); /* stages 4..80, retires draft blocks 1..4; acked */
  free(a);
  /* The reader's view of epoch E: every block, its bytes copied. */
  cr_assert_eq(ckv_srv_session_flush_meta(s), CKV_OK); /* as before any reply */
  uint64_t E = s->epoch;
  held h[64];
  size_t nh = 0;
  for (size_t b = 0; b < s->n_blocks; b++) {
    if (s->blocks[b].format == CKV_BLOCK_UNUSED) continue;
    cr_assert_lt(nh, 64);
    held *x = &h[nh++];
    *x = (held){(uint32_t)b,         s->blocks[b].offset,
                s->blocks[b].bytes,  s->blocks[b].capacity,
                s->blocks[b].used,   ckv_srv_session_block_ptr(s, (uint32_t)b),
                malloc(s->blocks[b].bytes)};
    memcpy(x->copy, x->ptr, x->bytes);
  }
  cr_assert_gt(nh, 1);
  /* Transitions that retire those blocks (staged -> committed, drafts out of
   * the window), plus appends that allocate: no ack. */
  for (uint32_t round = 2; round <= 5; round++) {
    cr_assert_eq(append(&f, 40, ROLE_USER, NULL), CKV_OK);
    a = attention(&f, round);
    round_run(&f, round, a, false);
    free(a);
  }
  cr_assert_gt(s->n_retired, 0, "the transitions retired nothing: the test proves nothing");
  uint64_t retired_bytes = 0;
  size_t stale_retired = 0, full_retired = 0;
  for (size_t i = 0; i < s->n_retired; i++) retired_bytes += s->retired[i].bytes;
  float out[ELEMS];
  for (size_t i = 0; i < nh; i++) {
    bool live = s->blocks[h[i].index].format != CKV_BLOCK_UNUSED && s->blocks[h[i].index].offset == h[i].offset;
    bool retired = false;
    for (size_t k = 0; k < s->n_retired; k++) retired |= s->retired[k].offset == h[i].offset;
    cr_assert(live || retired, "block at offset %llu of epoch %llu was freed before the reader acked it",
              (unsigned long long)h[i].offset, (unsigned long long)E);
    stale_retired += retired;
    cr_assert(memcmp(h[i].ptr, h[i].copy, 8) == 0, "header of held block %zu rewritten", i);
    /* A retired block is never written again (only the valid bits and
     * n_valid of a vacated slot change in place, by design): its payload is
     * the one the reader saw. */
    size_t pay = ckv_block_payload_offset(h[i].capacity);
    if (retired && h[i].used == h[i].capacity)
      cr_assert(memcmp(h[i].ptr + pay, h[i].copy + pay, h[i].bytes - pay) == 0,
                "payload of retired block %zu (format %u) changed under a reader", i, h[i].copy[4]);
    full_retired += retired && h[i].used == h[i].capacity;
    /* The reader reads its stale view: every token valid at epoch E, read
     * through the memory it holds, is still what was written. */
    const uint32_t *pos_then = (const uint32_t *)(h[i].copy + ckv_block_positions_offset());
    const uint32_t *pos_now = ckv_block_positions_const(h[i].ptr);
    uint32_t fmt = h[i].copy[4];
    for (uint32_t slot = 0; slot < h[i].capacity; slot++) {
      if (!ckv_block_slot_valid(h[i].copy, slot)) continue;
      cr_assert_eq(pos_now[slot], pos_then[slot], "held block %zu slot %u now holds another token", i, slot);
      size_t pos = pos_then[slot];
      for (uint32_t layer = 0; layer < LAYERS; layer++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          cr_assert_eq(ckv_kernels_dequantize(&f.g, h[i].ptr, layer, kv, slot, out), CKV_OK);
          const float *ex = &f.expect[pos * TOKEN_FLOATS + (layer * 2 + kv) * ELEMS];
          for (uint32_t e = 0; e < ELEMS; e++)
            cr_assert(fabsf(out[e] - ex[e]) <= tolerance(fmt), "stale view: token %zu reads %f, wrote %f", pos,
                      out[e], ex[e]);
        }
    }
  }
  cr_assert_gt(stale_retired, 0, "no block of the held view was retired");
  cr_assert_gt(full_retired, 0, "no full block of the held view was retired");
  /* no new block overlaps a held one */
  for (size_t b = 0; b < s->n_blocks; b++) {
    if (s->blocks[b].format == CKV_BLOCK_UNUSED) continue;
    for (size_t i = 0; i < nh; i++) {
      bool same = b == h[i].index && s->blocks[b].offset == h[i].offset; /* still the held block itself */
      bool overlap = s->blocks[b].offset < h[i].offset + h[i].bytes &&
                     h[i].offset < s->blocks[b].offset + s->blocks[b].bytes;
      cr_assert(!overlap || same, "a new block overlaps memory the stale view still reads");
    }
  }
  cr_assert_eq(f.tenant->bytes_used, ckv_srv_session_bytes(s), "retired blocks are still counted");
  cr_assert_geq(f.tenant->bytes_used, retired_bytes + 1);
  /* an ack of the old epoch frees nothing newer */
  uint64_t reclaimed = 1;
  cr_assert_eq(ckv_srv_session_ack(s, E, &reclaimed), CKV_OK);
  cr_assert_eq(reclaimed, 0, "ack of epoch %llu freed blocks retired after it", (unsigned long long)E);
  cr_assert_eq(ckv_srv_session_ack(s, s->epoch + 1, NULL), CKV_ERR_RANGE);
  /* the ack of the current epoch frees exactly the retired bytes */
  uint64_t before = f.tenant->bytes_used;
  cr_assert_eq(ckv_srv_session_ack(s, s->epoch, &reclaimed), CKV_OK);
  cr_assert_eq(reclaimed, retired_bytes);
  cr_assert_eq(f.tenant->bytes_used, before - retired_bytes, "the ack did not give the bytes back");
  cr_assert_eq(s->n_retired, 0);
  verify(&f);
  for (size_t i = 0; i < nh; i++) free(h[i].copy);
  fx_done(&f);
}

Test(lifecycle, stale_view_valid_until_ack_sync) { stale_view(0); }
Test(lifecycle, stale_view_valid_until_ack_two_threads) { stale_view(2); }

Test(lifecycle, lease_end_frees_retired_blocks) {
  ckv_judge_params p = params_for(CKV_POLICY_INT8);
  fx f;
  fx_init(&f, &p, 64u << 20, 0);
  cr_assert_eq(append(&f, 80, ROLE_USER, NULL), CKV_OK);
  float *a = attention(&f, 1);
  round_run(&f, 1, a, false);
  free(a);
  cr_assert_gt(f.s->n_retired, 0);
  uint64_t before = f.tenant->bytes_used, retired = 0;
  for (size_t i = 0; i < f.s->n_retired; i++) retired += f.s->retired[i].bytes;
  f.s->owner = 0; /* the reader's lease ended */
  cr_assert_eq(ckv_srv_session_release_retired(f.s), retired);
  cr_assert_eq(f.tenant->bytes_used, before - retired);
  verify(&f);
  fx_done(&f);
}

/* ---- quota ---- */

/* What the daemon does on AppendTokens (handlers.c h_append): reclaim when the
 * new draft blocks would not fit, then append.  Checks that every token the
 * reclaim recycled is in its transition list. */
static int append_under_quota(fx *f, uint32_t count, uint8_t role, const float *sem, uint64_t *ret_recycled) {
  ckv_srv_session *s = f->s;
  uint64_t need = ckv_srv_session_append_bytes(s, count), recycled = 0;
  if (need && !ckv_tenant_would_fit(f->tenant, need)) {
    settle(f);
    ckv_transition_list out = {0};
    uint8_t *before = malloc(s->tokens.n + 1);
    memcpy(before, s->tokens.state, s->tokens.n);
    int r = ckv_moves_reclaim(s, f->comp, need, &out, &recycled);
    cr_assert(r == CKV_OK || r == CKV_ERR_QUOTA, "reclaim: %d", r);
    track_transitions(f, &out, 0);
    uint64_t listed = 0, changed = 0;
    for (size_t i = 0; i < out.n; i++) {
      cr_assert_eq(out.v[i].to, X, "reclaim listed a %u -> %u", out.v[i].from, out.v[i].to);
      listed += out.v[i].count;
    }
    for (size_t pos = 0; pos < s->tokens.n; pos++) {
      if (before[pos] == s->tokens.state[pos]) continue;
      changed++;
      cr_assert_eq(s->tokens.state[pos], X, "reclaim moved token %zu to %u", pos, s->tokens.state[pos]);
      cr_assert(!ckv_judge_protected(&s->tokens, pos, &s->params), "reclaim recycled protected token %zu", pos);
      cr_assert_lt(pos + s->params.recent_window, s->tokens.n, "reclaim recycled token %zu of the window", pos);
    }
    cr_assert_eq(listed, recycled, "reclaim recycled %llu but listed %llu", (unsigned long long)recycled,
                 (unsigned long long)listed);
    cr_assert_eq(changed, recycled, "reclaim changed %llu tokens but reported %llu", (unsigned long long)changed,
                 (unsigned long long)recycled);
    free(before);
    ckv_transition_list_done(&out);
  }
  cr_assert_leq(f->tenant->bytes_used, f->tenant->quota_bytes);
  int r = append(f, count, role, sem);
  cr_assert_leq(f->tenant->bytes_used, f->tenant->quota_bytes, "usage above the quota");
  if (ret_recycled) *ret_recycled = recycled;
  return r;
}

Test(quota, appends_past_the_quota_reclaim_then_refuse) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  fx f;
  uint64_t blk = ckv_draft_block_bytes(&(ckv_geometry){LAYERS, HEADS, DIM, 0}, 16);
  fx_init(&f, &p, 8 * blk + blk / 2, 0); /* room for 8 draft blocks */
  f.lax_formats = true;
  float sem[16];
  for (int i = 0; i < 16; i++) sem[i] = (float)((i * 7) % 16) / 16.f;
  uint64_t total_recycled = 0, appended = 0;
  uint32_t round = 0;
  /* ordinary tokens: the quota holds 128 of them, we append 400 */
  for (int i = 0; i < 25; i++) {
    uint64_t rec = 0;
    int r = append_under_quota(&f, 16, ROLE_USER, sem, &rec);
    cr_assert_eq(r, CKV_OK, "append %d refused (%d) although older tokens could be recycled", i, r);
    appended += 16;
    total_recycled += rec;
    float *a = attention(&f, ++round);
    round_run(&f, round, a, true);
    free(a);
    verify(&f);
  }
  cr_assert_gt(appended * ckv_draft_block_bytes(&f.g, 16) / 16, f.tenant->quota_bytes, "never went past the quota");
  cr_assert_gt(total_recycled, 0);
  /* then only system-role tokens (protected): reclaim runs dry and the
   * daemon must refuse with QUOTA */
  int r = CKV_OK;
  int guard = 0;
  while (r == CKV_OK && guard++ < 100) {
    r = append_under_quota(&f, 16, ROLE_SYSTEM, sem, NULL);
    if (r == CKV_OK) {
      float *a = attention(&f, ++round);
      round_run(&f, round, a, true);
      free(a);
    }
    verify(&f);
  }
  cr_assert_eq(r, CKV_ERR_QUOTA, "append never refused under a full quota");
  /* refused only when recycling every token still allowed to go (not
   * protected, not in the window) could not free the room */
  ckv_srv_session *s = f.s;
  size_t end = s->tokens.n - p.recent_window;
  uint32_t *left = calloc(s->n_blocks, sizeof(uint32_t));
  for (size_t b = 0; b < s->n_blocks; b++) left[b] = s->blocks[b].refs;
  for (size_t pos = 0; pos < end; pos++)
    if (s->tokens.state[pos] != X && !ckv_judge_protected(&s->tokens, pos, &s->params)) left[s->tokens.block[pos]]--;
  uint64_t freeable = 0;
  for (size_t b = 0; b < s->n_blocks; b++)
    if (s->blocks[b].format != CKV_BLOCK_UNUSED && left[b] == 0) freeable += s->blocks[b].bytes;
  free(left);
  cr_assert_lt(f.tenant->quota_bytes - f.tenant->bytes_used + freeable, ckv_srv_session_append_bytes(s, 16),
               "refused although recycling could free %llu bytes", (unsigned long long)freeable);
  cr_assert_eq(f.recycled_reported, f.s->count_by_state[X], "a recycle was not reported");
  cr_assert_leq(f.peak_bytes, f.tenant->quota_bytes);
  fx_done(&f);
}

/* BUG (lifecycle.c ckv_moves_reclaim): when recycling every candidate
 * still cannot make room (each block is pinned by a protected token), the
 * reclaim recycles them all anyway and the append is refused: tokens are
 * lost without the quota rule gaining anything.  The refusal must leave the
 * tokens where they were. */
Test(quota, refusal_loses_nothing_when_no_room_can_be_made) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  fx f;
  uint64_t blk = ckv_draft_block_bytes(&(ckv_geometry){LAYERS, HEADS, DIM, 0}, 16);
  fx_init(&f, &p, 4 * blk, 0);
  f.lax_formats = true;
  for (int b = 0; b < 4; b++) { /* every draft block holds one system-role token */
    cr_assert_eq(append(&f, 7, ROLE_USER, NULL), CKV_OK);
    cr_assert_eq(append(&f, 1, ROLE_SYSTEM, NULL), CKV_OK);
    cr_assert_eq(append(&f, 8, ROLE_USER, NULL), CKV_OK);
  }
  uint64_t rec = 99;
  int r = append_under_quota(&f, 16, ROLE_USER, NULL, &rec);
  cr_assert_eq(r, CKV_ERR_QUOTA);
  cr_expect_eq(rec, 0, "the refused append recycled %llu tokens that could not make room", (unsigned long long)rec);
  cr_expect_eq(f.s->count_by_state[X], 0);
  verify(&f);
  fx_done(&f);
}

/* ---- a mass transition planned in parts ends as one plan would end it ----
 *
 * When most of a long session changes state in one round, planning every
 * move at once takes the server thread 100-200 ms at 1M tokens; a plan call
 * makes at most plan_max_moves moves per phase and the publishing of each job
 * plans the next part.  The parts must add up to the one plan: the same
 * tokens in the same states, formats and slots, with the same K/V bit for bit
 * (a rotated block's key mean and a committed block's channels come from the
 * first job into the block, so a part never leaves a block it opened
 * half-filled). Three sessions get the same stream: no bound, the default
 * bound, a bound of 1000 (hundreds of parts). */

#define MASS_TOKENS (256u * 1024u)
#define MASS_DIM 32u
#define MASS_SMALL_BOUND 1000u

typedef struct mass {
  ckv_geometry g;
  ckv_tenant *tenant;
  ckv_compressor *comp;
  ckv_srv_session *s;
  uint64_t next_id;
  uint64_t jobs, max_job; /* jobs published; most moves in one */
} mass;

static void mass_init(mass *m, const ckv_judge_params *p, uint32_t plan_max_moves) {
  memset(m, 0, sizeof(*m));
  m->g = (ckv_geometry){1, 1, MASS_DIM, CKV_DTYPE_FP16};
  uint64_t quota = 1ull << 30;
  cr_assert_eq(ckv_tenant_new("t", quota, quota + (64u << 20), 1, &ckv_arena_host_backend, &m->tenant), CKV_OK);
  cr_assert_eq(ckv_compressor_new(1, 64, &m->comp), CKV_OK);
  uint32_t dt = 16, ct = 64;
  cr_assert_eq(ckv_srv_session_check_geometry(&m->g, &dt, &ct), CKV_OK);
  cr_assert_eq(ckv_srv_session_new("mass", m->tenant, &m->g, dt, ct, ckv_policy_names[p->policy], p, &m->next_id,
                                   &m->s),
               CKV_OK);
  m->s->owner = 1;
  m->s->lane = 1;
  m->s->plan_max_moves = plan_max_moves;
}

/* Publishes every job, the parts that publishing plans included. */
static void mass_settle(mass *m) {
  for (;;) {
    ckv_compressor_drain_lane(m->comp, m->s->lane);
    ckv_job *j = ckv_compressor_collect(m->comp);
    if (!j) {
      if (!m->s->jobs_inflight) break;
      continue;
    }
    while (j) {
      ckv_job *next = j->next;
      cr_assert_eq(j->status, CKV_OK, "a compressor move failed: %d", j->status);
      m->jobs++;
      if (j->n_moves > m->max_job) m->max_job = j->n_moves;
      ckv_moves_publish(m->s, m->comp, j);
      j = next;
    }
  }
  cr_assert_eq(ckv_srv_session_ack(m->s, m->s->epoch, NULL), CKV_OK);
}

static void mass_done(mass *m) {
  mass_settle(m);
  m->comp = ckv_compressor_free(m->comp);
  m->s = ckv_srv_session_free(m->s);
  cr_expect_eq(m->tenant->bytes_used, 0);
  m->tenant = ckv_tenant_free(m->tenant);
}

static void mass_append(mass *m) {
  enum { CHUNK = 4096 };
  static float sem[CHUNK];
  ckv_srv_session *s = m->s;
  ckv_slot_run *runs = calloc(ckv_srv_session_max_runs(s, CHUNK), sizeof(*runs));
  cr_assert_not_null(runs);
  for (uint32_t done = 0; done < MASS_TOKENS; done += CHUNK) {
    /* every fifth token a fact (the best-protected format), a third of little meaning */
    for (uint32_t i = 0; i < CHUNK; i++)
      sem[i] = (done + i) % 5 == 0 ? 0.9f : (done + i) % 3 == 0 ? 0.2f : 0.5f;
    size_t n_runs;
    uint64_t first;
    cr_assert_eq(ckv_srv_session_append(s, CHUNK, NULL, NULL, sem, NULL, runs, &n_runs, &first), CKV_OK);
    for (size_t pos = first; pos < first + CHUNK; pos++) {
      uint32_t blk = s->tokens.block[pos], cap = s->blocks[blk].capacity;
      uint8_t *base = ckv_srv_session_block_ptr(s, blk);
      for (uint32_t kv = 0; kv < 2; kv++) {
        uint16_t *dst = (uint16_t *)(base + ckv_draft_kv_offset(&m->g, cap, 0, kv, s->tokens.slot[pos]));
        for (uint32_t e = 0; e < MASS_DIM; e++) dst[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, 0, kv, e));
      }
    }
  }
  free(runs);
  cr_assert_eq(ckv_srv_session_flush_meta(s), CKV_OK);
}

static void mass_round(mass *m, uint32_t round) {
  ckv_srv_session *s = m->s;
  float *a = malloc(s->tokens.n * sizeof(float));
  cr_assert_not_null(a);
  for (size_t pos = 0; pos < s->tokens.n; pos++) /* facts hot, the last turn warm, the rest cold */
    a[pos] = pos % 5 == 0 ? 3.f : pos + 64 >= s->tokens.n ? 1.f : pos % 7 == 0 ? 0.6f : 0.05f;
  cr_assert_eq(ckv_srv_session_report_round(s, round, 0, a, s->tokens.n, NULL, NULL, 0), CKV_OK);
  free(a);
  ckv_transition_list out = {0};
  cr_assert_eq(ckv_moves_round(s, m->comp, round, &out), CKV_OK);
  ckv_transition_list_done(&out);
  mass_settle(m);
}

static void mass_escalate(mass *m, int from) {
  ckv_transition_list out = {0};
  cr_assert_geq(ckv_moves_escalate(m->s, m->comp, from, &out), 0);
  ckv_transition_list_done(&out);
  mass_settle(m);
}

/* The stream: a report, every draft token staged at once, every staged one
 * committed at once, then two more rounds of the judge. */
static void mass_run(mass *m) {
  mass_append(m);
  mass_round(m, 1);
  mass_escalate(m, D);
  mass_escalate(m, S);
  mass_round(m, 2);
  mass_round(m, 3);
}

/* Nothing in flight; the lagging count the plans keep is the one a scan gives. */
static void mass_expect_settled(const mass *m, const char *what) {
  const ckv_srv_session *s = m->s;
  uint64_t lag = 0;
  for (size_t p = 0; p < s->tokens.n; p++) {
    cr_assert_eq(s->tokens.flags[p] & CKV_TOKEN_PENDING, 0, "%s: token %zu still moving", what, p);
    uint8_t st = s->tokens.state[p];
    uint32_t blk = s->tokens.block[p];
    uint32_t f = blk == CKV_NO_BLOCK ? CKV_BLOCK_UNUSED : s->blocks[blk].format;
    lag += (st == S && f != CKV_FORMAT_STAGED) || (st == C && !ckv_format_is_committed_state(f));
  }
  cr_expect_eq(ckv_moves_pending(s), lag, "%s: %llu tokens pending by the plans' count, %llu by a scan", what,
               (unsigned long long)ckv_moves_pending(s), (unsigned long long)lag);
  cr_expect(!s->plan_dirty, "%s: a part of the plan was left unplanned", what);
}

/* b ends as a did: same states, formats, slots and K/V bit for bit. */
static void mass_expect_same(const mass *a, const mass *b, const char *what) {
  const ckv_tokens *ta = &a->s->tokens, *tb = &b->s->tokens;
  cr_assert_eq(ta->n, tb->n);
  float va[MASS_DIM], vb[MASS_DIM];
  uint64_t moved = 0;
  for (size_t p = 0; p < ta->n; p++) {
    cr_assert_eq(tb->state[p], ta->state[p], "%s: token %zu is %u, %u without the bound", what, p, tb->state[p],
                 ta->state[p]);
    if (ta->state[p] == X) continue;
    uint32_t fa = a->s->blocks[ta->block[p]].format, fb = b->s->blocks[tb->block[p]].format;
    cr_assert_eq(fb, fa, "%s: token %zu in format %u, %u without the bound", what, p, fb, fa);
    cr_assert_eq(tb->slot[p], ta->slot[p], "%s: token %zu in slot %u, %u without the bound", what, p, tb->slot[p],
                 ta->slot[p]);
    moved += fa != CKV_FORMAT_DRAFT;
    const void *ba = ckv_srv_session_block_ptr(a->s, ta->block[p]), *bb = ckv_srv_session_block_ptr(b->s, tb->block[p]);
    for (uint32_t kv = 0; kv < 2; kv++) {
      cr_assert_eq(ckv_kernels_dequantize(&a->g, ba, 0, kv, ta->slot[p], va), CKV_OK);
      cr_assert_eq(ckv_kernels_dequantize(&b->g, bb, 0, kv, tb->slot[p], vb), CKV_OK);
      cr_assert(memcmp(va, vb, sizeof(va)) == 0, "%s: token %zu (format %u) %s reads %f..., %f... without the bound",
                what, p, fa, kv ? "V" : "K", vb[0], va[0]);
    }
  }
  cr_assert_gt(moved, MASS_TOKENS / 2, "%s: only %llu tokens left FP16: no mass transition", what,
               (unsigned long long)moved);
  for (int k = 0; k < 4; k++) cr_expect_eq(b->s->count_by_state[k], a->s->count_by_state[k]);
  cr_expect_eq(ckv_moves_pending(b->s), ckv_moves_pending(a->s));
}

static void mass_transition(const ckv_judge_params *p) {
  static mass whole, parts, small; /* large: off the stack */
  mass_init(&whole, p, UINT32_MAX);
  mass_init(&parts, p, 0); /* the default bound */
  mass_init(&small, p, MASS_SMALL_BOUND);
  mass_run(&whole);
  mass_run(&parts);
  mass_run(&small);
  mass_expect_settled(&whole, "no bound");
  mass_expect_settled(&parts, "default bound");
  mass_expect_settled(&small, "bound 1000");
  mass_expect_same(&whole, &parts, "default bound");
  mass_expect_same(&whole, &small, "bound 1000");
  /* the bound held: two phases of at most the bound each, and at most one
   * block (64 slots) per format past it */
  cr_expect_gt(small.jobs, whole.jobs + 100, "bound 1000: %llu jobs, %llu without the bound",
               (unsigned long long)small.jobs, (unsigned long long)whole.jobs);
  cr_expect_leq(small.max_job, 2 * MASS_SMALL_BOUND + CKV_FILL_COUNT * 64u, "bound 1000: a job of %llu moves",
                (unsigned long long)small.max_job);
  cr_expect_leq(parts.max_job, 2 * CKV_MOVES_PLAN_MAX_MOVES + CKV_FILL_COUNT * 64u);
  cr_expect_gt(whole.max_job, 2 * CKV_MOVES_PLAN_MAX_MOVES, "the unbounded plan made no large job");
  mass_done(&whole);
  mass_done(&parts);
  mass_done(&small);
}

/* Rotated formats, three of them interleaved (facts ROT4, warm ROT3, cold ROT2). */
Test(lifecycle, mass_transition_in_parts_rotated, .timeout = 300) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.rotate = 1;
  p.warm_commit = 1;
  p.warm_bits = 3;
  p.cold_bits = 2;
  mass_transition(&p);
}

/* KIVI committed chunks (the flush closes the last partial chunk in the last part). */
Test(lifecycle, mass_transition_in_parts_kivi, .timeout = 300) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  mass_transition(&p);
}
