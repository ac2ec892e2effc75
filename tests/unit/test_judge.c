/* tests/unit/test_judge.c - lifecycle/judge.c over lifecycle/tokens.c, in process:
 * only the lifecycle's transitions ever happen and each is reported, state
 * counts add up, protected tokens (sinks, recent window, system role) are
 * never recycled, the same stream gives the same states bit for bit, filler
 * never earns bits while planted facts are committed and kept, and every
 * baseline policy does what its name says on a small stream. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* qsort_r */
#endif
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "lifecycle/judge.h"
#include "lifecycle/policy.h"
#include "lifecycle/tokens.h"

enum { ROLE_NONE = 0, ROLE_SYSTEM = 1, ROLE_USER = 2, ROLE_ASSISTANT = 3, ROLE_TOOL = 4 };
enum { D = CKV_STATE_DRAFT, S = CKV_STATE_STAGED, C = CKV_STATE_COMMITTED, X = CKV_STATE_RECYCLED };

static const int k_all_policies[] = {CKV_POLICY_FP16,  CKV_POLICY_INT8,      CKV_POLICY_KIVI4,   CKV_POLICY_KIVI2,
                                     CKV_POLICY_H2O,   CKV_POLICY_STREAMING, CKV_POLICY_COMMITKV};
#define N_POLICIES (sizeof(k_all_policies) / sizeof(k_all_policies[0]))

/* The shipped [policy] defaults (the lifecycle's parameter table, which
 * commitkvd's [policy] section is made from), for `policy`. */
static ckv_judge_params params_for(int policy) {
  ckv_judge_params p;
  ckv_judge_params_init(&p);
  p.policy = policy;
  if (policy == CKV_POLICY_KIVI2) p.commit_bits = 2;
  return p;
}

/* ---- a deterministic generator (splitmix64) ---- */
typedef struct rng {
  uint64_t s;
} rng;
static uint64_t rnd(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float rndf(rng *r) { return (float)(rnd(r) >> 40) / (float)(1ull << 24); }

static size_t live_count(const ckv_tokens *t) {
  size_t n = 0;
  for (size_t p = 0; p < t->n; p++) n += t->state[p] != X;
  return n;
}

static void push(ckv_tokens *t, uint8_t role, float semantic, uint32_t round) {
  cr_assert_eq(ckv_tokens_reserve(t, 1), CKV_OK);
  ckv_tokens_push(t, role, 0, semantic, round, CKV_NO_BLOCK, 0);
}

/* Records round `round` with attn[0..t->n) (as the session does). */
static void record(ckv_tokens *t, uint32_t round, const float *attn) {
  ckv_tokens_record_round(t, round, 0, attn, t->n, live_count(t));
}

/* Records round `round` with attention v on every token. */
static void uniform_round(ckv_tokens *t, uint32_t round, float v) {
  float *a = malloc((t->n + 1) * sizeof(float));
  cr_assert_not_null(a);
  for (size_t i = 0; i < t->n; i++) a[i] = v;
  record(t, round, a);
  free(a);
}

static int legal(uint8_t from, uint8_t to) {
  return (from == D && to == S) || (from == S && to == C) || (from != X && to == X);
}

/* Runs the judge and checks what it did against what it reported:
 * every change is legal and listed once with the right `from`, nothing
 * unchanged is listed, last_transition follows, counts[] (kept from the
 * transition lists alone) match the state column.  Returns the list. */
static void judge_checked(ckv_tokens *t, uint32_t round, const ckv_judge_params *p, uint64_t counts[4],
                          ckv_transition_list *out) {
  uint8_t *old = malloc(t->n + 1), *listed = malloc(t->n + 1);
  cr_assert(old && listed);
  if (t->n) memcpy(old, t->state, t->n);
  memset(listed, 0xff, t->n);
  out->n = 0;
  cr_assert_eq(ckv_judge_run(t, round, p, out), CKV_OK);
  for (size_t i = 0; i < out->n; i++) {
    const ckv_transition_range *r = &out->v[i];
    cr_assert_gt(r->count, 0u);
    cr_assert_leq(r->first + r->count, t->n, "transition beyond the tokens");
    for (uint32_t k = 0; k < r->count; k++) {
      size_t pos = r->first + k;
      cr_assert_eq(listed[pos], 0xff, "policy %d round %u: position %zu listed twice", p->policy, round, pos);
      cr_assert_eq(r->from, old[pos], "policy %d round %u: position %zu listed from %u but was %u", p->policy, round,
                   pos, r->from, old[pos]);
      listed[pos] = r->to;
    }
    counts[r->from] -= r->count;
    counts[r->to] += r->count;
  }
  uint64_t col[4] = {0};
  for (size_t pos = 0; pos < t->n; pos++) {
    uint8_t now = t->state[pos];
    cr_assert_lt(now, 4);
    col[now]++;
    if (listed[pos] != 0xff) {
      cr_assert_eq(now, listed[pos], "position %zu: listed to %u but is %u", pos, listed[pos], now);
      cr_assert(legal(old[pos], now), "policy %d round %u: illegal transition %u -> %u at %zu", p->policy, round,
                old[pos], now, pos);
      cr_assert_eq(t->last_transition[pos], round);
    } else {
      cr_assert_eq(now, old[pos], "policy %d round %u: position %zu changed %u -> %u unreported", p->policy, round,
                   pos, old[pos], now);
    }
  }
  for (int s = 0; s < 4; s++)
    cr_assert_eq(col[s], counts[s], "policy %d round %u: state %d counted %llu, column has %llu", p->policy, round, s,
                 (unsigned long long)counts[s], (unsigned long long)col[s]);
  cr_assert_eq(col[0] + col[1] + col[2] + col[3], t->n, "state counts must add up to the tokens appended");
  free(old);
  free(listed);
}

/* Invariants that hold after every round, whatever the attention. */
static void check_protected(const ckv_tokens *t, const ckv_judge_params *p, int system_protected) {
  for (size_t pos = 0; pos < t->n && pos < p->sink_tokens; pos++)
    cr_assert_neq(t->state[pos], X, "policy %d: attention sink %zu recycled", p->policy, pos);
  size_t win = t->n > p->recent_window ? t->n - p->recent_window : 0;
  for (size_t pos = win; pos < t->n; pos++)
    cr_assert_eq(t->state[pos], D, "policy %d: token %zu of the recent window is not draft (%u)", p->policy, pos,
                 t->state[pos]);
  if (system_protected)
    for (size_t pos = 0; pos < t->n; pos++)
      if (t->role[pos] == ROLE_SYSTEM)
        cr_assert_neq(t->state[pos], X, "policy %d: system-role token %zu recycled", p->policy, pos);
}

/* h2o and streaming reproduce the published baselines, which keep only the
 * sinks and the window (and, for h2o, heavy hitters): the system-role rule is
 * the lifecycle's, checked for the other policies. */
static int system_protected_by(int policy) { return policy != CKV_POLICY_H2O && policy != CKV_POLICY_STREAMING; }

/* One random stream: appends, attention (sparse, with a few hot tokens and
 * some garbage values), semantic scores given or not.  Fills `trace` with
 * every round's transitions when not NULL.  Returns transition totals. */
typedef struct trace {
  ckv_transition_range *v;
  size_t n, cap;
} trace;

static void trace_add(trace *tr, const ckv_transition_list *l) {
  if (tr->n + l->n > tr->cap) {
    tr->cap = (tr->n + l->n) * 2 + 64;
    tr->v = realloc(tr->v, tr->cap * sizeof(*tr->v));
    cr_assert_not_null(tr->v);
  }
  if (l->n) memcpy(tr->v + tr->n, l->v, l->n * sizeof(*l->v));
  tr->n += l->n;
}

static void random_stream(ckv_tokens *t, const ckv_judge_params *p, uint64_t seed, uint32_t rounds, trace *tr,
                          uint64_t moves[4][4]) {
  rng g = {seed};
  uint64_t counts[4] = {0};
  ckv_transition_list out = {0};
  float *attn = NULL;
  size_t attn_cap = 0;
  for (uint32_t round = 1; round <= rounds; round++) {
    uint32_t add = (uint32_t)(rnd(&g) % 24);
    for (uint32_t i = 0; i < add; i++) {
      uint64_t x = rnd(&g);
      uint8_t role = x % 20 == 0 ? ROLE_SYSTEM : (uint8_t)(x % 5);
      float sem = (x >> 8) % 4 == 0 ? -1.f : rndf(&g);
      push(t, role, sem, round - 1);
    }
    counts[D] += add;
    if (t->n > attn_cap) {
      attn_cap = t->n * 2;
      attn = realloc(attn, attn_cap * sizeof(*attn));
      cr_assert_not_null(attn);
    }
    /* a topic: a window of positions drawing attention, moving over time */
    size_t topic = t->n ? (size_t)(rnd(&g) % t->n) : 0, span = 1 + rnd(&g) % 64;
    for (size_t pos = 0; pos < t->n; pos++) {
      uint64_t x = rnd(&g);
      float a = 0.f;
      if (pos >= topic && pos < topic + span) a = 5.f * rndf(&g);
      else if (x % 3 == 0) a = 0.3f * rndf(&g);
      if (x % 997 == 0) a = NAN;
      if (x % 991 == 0) a = -1.f;
      if (x % 983 == 0) a = INFINITY;
      attn[pos] = a;
    }
    if (rnd(&g) % 10 == 0) { /* sometimes nothing attended at all */
      for (size_t pos = 0; pos < t->n; pos++) attn[pos] = 0.f;
    }
    record(t, round, attn);
    if (rnd(&g) % 8 == 0) { /* semantic updates from the worker */
      for (int k = 0; k < 4 && t->n; k++) {
        size_t pos = (size_t)(rnd(&g) % t->n);
        t->semantic[pos] = ckv_q16_from_unit(rndf(&g));
        t->flags[pos] |= CKV_TOKEN_SEM_GIVEN;
      }
    }
    judge_checked(t, round, p, counts, &out);
    check_protected(t, p, system_protected_by(p->policy));
    if (tr) trace_add(tr, &out);
    for (size_t i = 0; i < out.n; i++) moves[out.v[i].from][out.v[i].to] += out.v[i].count;
  }
  free(attn);
  ckv_transition_list_done(&out);
}

/* ---- only legal transitions; counts add up ---- */

Test(judge, random_streams_only_legal_transitions_and_counts_add_up, .timeout = 60) {
  for (size_t k = 0; k < N_POLICIES; k++) {
    for (uint64_t seed = 1; seed <= 3; seed++) {
      ckv_judge_params p = params_for(k_all_policies[k]);
      if (seed == 3) { /* other parameters: no sinks, short window, quick idling */
        p.sink_tokens = 0;
        p.recent_window = 3;
        p.idle_rounds = 2;
        p.persistence_rounds = 1;
        p.history_rounds = 3;
        p.budget = 0.6f;
      }
      ckv_tokens t;
      ckv_tokens_init(&t);
      uint64_t moves[4][4] = {{0}};
      random_stream(&t, &p, seed * 7919 + k, 300, NULL, moves);
      /* the stream is rich enough to exercise the policy */
      int pol = p.policy;
      if (pol == CKV_POLICY_COMMITKV) {
        cr_expect_gt(moves[D][S], 0, "commitkv stream made no draft->staged");
        cr_expect_gt(moves[S][C], 0, "commitkv stream made no staged->committed");
        cr_expect_gt(moves[D][X] + moves[S][X] + moves[C][X], 0, "commitkv stream recycled nothing");
      }
      if (pol == CKV_POLICY_INT8 || pol == CKV_POLICY_KIVI4 || pol == CKV_POLICY_KIVI2)
        cr_expect_gt(moves[D][S], 0);
      if (pol == CKV_POLICY_H2O || pol == CKV_POLICY_STREAMING) cr_expect_gt(moves[D][X], 0);
      ckv_tokens_done(&t);
    }
  }
}

/* ---- protected tokens ---- */

Test(judge, protected_tokens_survive_1000_rounds_without_attention, .timeout = 60) {
  for (size_t k = 0; k < N_POLICIES; k++) {
    ckv_judge_params p = params_for(k_all_policies[k]);
    ckv_tokens t;
    ckv_tokens_init(&t);
    uint64_t counts[4] = {0};
    ckv_transition_list out = {0};
    /* a system prompt, then a conversation; system-role tokens also later */
    for (int i = 0; i < 40; i++) push(&t, ROLE_SYSTEM, 0.f, 0);
    for (int i = 0; i < 60; i++) push(&t, i % 7 == 0 ? ROLE_SYSTEM : ROLE_USER, 0.f, 0);
    counts[D] = t.n;
    float *zeros = calloc(2 * 1000 + 200, sizeof(float));
    cr_assert_not_null(zeros);
    for (uint32_t round = 1; round <= 1000; round++) {
      push(&t, ROLE_ASSISTANT, 0.f, round - 1);
      push(&t, round % 50 == 0 ? ROLE_SYSTEM : ROLE_TOOL, 0.f, round - 1);
      counts[D] += 2;
      if (round % 2)
        record(&t, round, zeros); /* zero attention everywhere */
      else
        ckv_tokens_record_round(&t, round, 0, NULL, 0, live_count(&t)); /* no report at all */
      judge_checked(&t, round, &p, counts, &out);
      check_protected(&t, &p, system_protected_by(p.policy));
    }
    if (p.policy == CKV_POLICY_COMMITKV) {
      /* not vacuous: everything unprotected, old enough, went */
      size_t end = t.n - p.recent_window - 2 * p.idle_rounds;
      for (size_t pos = p.sink_tokens; pos < end; pos++)
        if (t.role[pos] != ROLE_SYSTEM) cr_assert_eq(t.state[pos], X, "idle token %zu kept", pos);
    }
    free(zeros);
    ckv_transition_list_done(&out);
    ckv_tokens_done(&t);
  }
}

Test(judge, protected_helper_names_sinks_and_system_role) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  ckv_tokens t;
  ckv_tokens_init(&t);
  for (int i = 0; i < 10; i++) push(&t, i == 7 ? ROLE_SYSTEM : ROLE_USER, 0.5f, 0);
  for (size_t pos = 0; pos < 10; pos++)
    cr_expect_eq(!!ckv_judge_protected(&t, pos, &p), pos < 4 || pos == 7, "position %zu", pos);
  ckv_tokens_done(&t);
}

/* ---- determinism ---- */

static void cmp_tokens(const ckv_tokens *a, const ckv_tokens *b, int policy) {
  cr_assert_eq(a->n, b->n);
  size_t n = a->n;
  cr_assert(memcmp(a->state, b->state, n) == 0, "policy %d: states differ", policy);
  cr_assert(memcmp(a->last_transition, b->last_transition, n * 4) == 0, "policy %d: last_transition differs", policy);
  cr_assert(memcmp(a->last_attended, b->last_attended, n * 4) == 0, "policy %d", policy);
  cr_assert(memcmp(a->attn, b->attn, n * CKV_ATTN_HISTORY) == 0, "policy %d", policy);
  cr_assert(memcmp(a->cum_attn, b->cum_attn, n * 4) == 0, "policy %d", policy);
  cr_assert(memcmp(a->flags, b->flags, n) == 0, "policy %d: flags differ", policy);
}

Test(judge, same_stream_same_states_bit_for_bit, .timeout = 60) {
  for (size_t k = 0; k < N_POLICIES; k++) {
    ckv_judge_params p = params_for(k_all_policies[k]);
    ckv_tokens a, b;
    ckv_tokens_init(&a);
    ckv_tokens_init(&b);
    trace ta = {0}, tb = {0};
    uint64_t ma[4][4] = {{0}}, mb[4][4] = {{0}};
    random_stream(&a, &p, 4242, 200, &ta, ma);
    random_stream(&b, &p, 4242, 200, &tb, mb);
    cmp_tokens(&a, &b, p.policy);
    cr_assert_eq(ta.n, tb.n);
    for (size_t i = 0; i < ta.n; i++) /* field by field: the struct has padding */
      cr_assert(ta.v[i].first == tb.v[i].first && ta.v[i].count == tb.v[i].count && ta.v[i].from == tb.v[i].from &&
                    ta.v[i].to == tb.v[i].to,
                "policy %d: transition %zu differs", p.policy, i);
    if (p.policy != CKV_POLICY_FP16) cr_assert_gt(ta.n, 0, "policy %d: the stream made no transition", p.policy);
    free(ta.v);
    free(tb.v);
    ckv_tokens_done(&a);
    ckv_tokens_done(&b);
  }
}

/* ---- filler against facts ---- */

typedef enum { KIND_OTHER, KIND_FILLER, KIND_FACT } kind;

/* Each round appends a turn of 16 tokens: `n_fill` filler (templated, low
 * semantic score), 2 planted facts (high semantic score), the rest ordinary
 * text.  Filler draws the highest attention every round, facts high and
 * sustained attention, ordinary text a little (this turn's more).  Returns
 * the number of tokens of each kind that ended committed / recycled. */
static void filler_stream(const ckv_judge_params *p, uint32_t rounds, float filler_mass, int n_fill,
                          int check_each_round) {
  ckv_tokens t;
  ckv_tokens_init(&t);
  kind *kinds = calloc(16 * (rounds + 1), sizeof(*kinds));
  float *attn = calloc(16 * (rounds + 1), sizeof(*attn));
  cr_assert(kinds && attn);
  uint64_t counts[4] = {0};
  ckv_transition_list out = {0};
  for (uint32_t round = 1; round <= rounds; round++) {
    for (int i = 0; i < 16; i++) {
      kind k = i < n_fill ? KIND_FILLER : i < n_fill + 2 ? KIND_FACT : KIND_OTHER;
      kinds[t.n] = k;
      push(&t, ROLE_USER, k == KIND_FILLER ? 0.05f : k == KIND_FACT ? 0.95f : 0.5f, round - 1);
    }
    counts[D] += 16;
    for (size_t pos = 0; pos < t.n; pos++) {
      bool this_turn = pos + 16 >= t.n;
      attn[pos] = kinds[pos] == KIND_FILLER ? filler_mass
                  : kinds[pos] == KIND_FACT ? 0.9f * filler_mass
                                            : (this_turn ? 0.2f : 0.02f) * filler_mass;
    }
    record(&t, round, attn);
    judge_checked(&t, round, p, counts, &out);
    check_protected(&t, p, 1);
    if (!check_each_round && round != rounds) continue;
    for (size_t pos = 0; pos < t.n; pos++) {
      if (kinds[pos] == KIND_FILLER && !p->filler_cold)
        cr_assert(t.state[pos] == D || t.state[pos] == X,
                  "round %u: filler token %zu left draft (state %u, mean attention %.2f, semantic 0.05)", round, pos,
                  t.state[pos], ckv_tokens_attn_mean(&t, pos, round, p->history_rounds));
      if (kinds[pos] == KIND_FILLER && p->filler_cold) {
        /* the cold path: out of FP16 a round after the window, never a fact or warm, so never
         * in the facts' format nor kept for good */
        if (pos >= p->sink_tokens && pos + p->recent_window + 16 * 2 < t.n)
          cr_assert_neq(t.state[pos], D, "round %u: filler token %zu still draft", round, pos);
        cr_assert(!(t.flags[pos] & CKV_TOKEN_FACT), "round %u: filler token %zu became a fact (flags %x)", round, pos,
                  t.flags[pos]);
        /* filler drawing attention commits in the warm tokens' bits, not the cold ones */
        if (t.state[pos] == C && ckv_tokens_attn_mean(&t, pos, t.last_transition[pos], p->history_rounds) >= p->attn_threshold)
          cr_assert(t.flags[pos] & CKV_TOKEN_WARM, "round %u: filler token %zu committed while attended, not warm", round,
                    pos);
        cr_assert(!ckv_judge_lasting_fact(&t, pos, p), "round %u: filler token %zu is a lasting fact", round, pos);
      }
      if (kinds[pos] == KIND_FACT)
        cr_assert_neq(t.state[pos], X, "round %u: planted fact %zu recycled", round, pos);
    }
  }
  /* facts old enough (past the window for persistence + 2 rounds) are committed */
  size_t facts = 0;
  for (size_t pos = p->sink_tokens; pos + p->recent_window + 16 * (p->persistence_rounds + 2) < t.n; pos++) {
    if (kinds[pos] != KIND_FACT) continue;
    facts++;
    cr_assert_eq(t.state[pos], C, "planted fact %zu is %u, not committed (min attention %.2f)", pos, t.state[pos],
                 ckv_tokens_attn_min(&t, pos, rounds, p->persistence_rounds));
  }
  cr_assert_gt(facts, 10, "the stream planted too few facts to judge");
  /* and filler drew the highest attention of all */
  for (size_t pos = 0; pos < t.n; pos++)
    if (kinds[pos] != KIND_FILLER) cr_assert_leq(attn[pos], filler_mass);
  free(kinds);
  free(attn);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

/* The seed's rules (filler_cold = warm_commit = 0): filler stays draft until
 * recycled, never promoted. */
static ckv_judge_params seed_rules(void) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.filler_cold = 0;
  p.warm_commit = 0;
  return p;
}

Test(judge, filler_never_promoted_facts_committed_and_kept) {
  ckv_judge_params p = seed_rules();
  filler_stream(&p, 40, 1.0f, 2, 1);
}

/* The same stream with a one-turn recent window: filler (about 4x an average
 * token's attention) is judged the round after its append.
 * BUG (judge.c, see below): its mean over history_rounds counts the R-1
 * rounds before it existed as zero attention, reads as "not hot", so the
 * filler rule misses it and draft->staged rule (b) promotes it. */
Test(judge, filler_never_promoted_with_a_one_turn_window) {
  ckv_judge_params p = seed_rules();
  p.recent_window = 16;
  filler_stream(&p, 40, 1.0f, 2, 1);
}

/* Filler that is a larger share of the turn: its relative attention is
 * still the highest of all tokens, but below 2x an average token.
 * BUG (judge.c judge_rules): the ring entries of the rounds before a token
 * was appended read as zero attention, so a young token's mean over
 * history_rounds (R = 8) is diluted: judged a few rounds after its append, a
 * filler token averaging under R/age times the mean reads as "not hot",
 * hence not filler, and draft->staged rule (b) promotes it. */
Test(judge, filler_never_promoted_when_it_is_a_large_share_of_the_turn) {
  ckv_judge_params p = seed_rules();
  p.high_attn_threshold = 1.2f; /* so facts (0.9x the filler mass) still qualify as lasting */
  filler_stream(&p, 40, 1.0f, 6, 1);
}

/* The defaults (filler_cold, warm_commit): the same stream; filler leaves
 * FP16 for the cold path but never earns the facts' bits; facts are still
 * committed and kept. */
Test(judge, filler_goes_cold_and_facts_stay) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  cr_assert(p.filler_cold && p.warm_commit, "the defaults changed");
  filler_stream(&p, 40, 1.0f, 2, 1);
  p.recent_window = 16;
  filler_stream(&p, 40, 1.0f, 2, 1);
}

/* ---- judge_every and far_sample ---- */

/* Tokens judged changed state this round (draft tokens a round old move on). */
static size_t moved(const ckv_transition_list *out) {
  size_t n = 0;
  for (size_t i = 0; i < out->n; i++) n += out->v[i].count;
  return n;
}

Test(judge, judge_every_skips_rounds_but_records_them) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.judge_every = 3;
  ckv_tokens t;
  ckv_tokens_init(&t);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  for (uint32_t round = 1; round <= 7; round++) {
    for (int i = 0; i < 16; i++) push(&t, ROLE_USER, 0.5f, round - 1);
    counts[D] += 16;
    uniform_round(&t, round, 1.0f);
    judge_checked(&t, round, &p, counts, &out);
    size_t n = moved(&out);
    if (round % 3)
      cr_assert_eq(n, 0, "round %u is not a judging round, yet %zu tokens moved", round, n);
    else
      cr_assert_gt(n, 0, "round %u judges: the tokens past the window move on", round);
  }
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(judge, far_sample_judges_a_rotating_quarter_of_far_tokens) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.far_sample = 0.25f;
  p.recent_window = 0;
  const size_t far = 8192, n = far + CKV_JUDGE_NEAR_TOKENS;
  ckv_tokens t;
  ckv_tokens_init(&t);
  for (size_t i = 0; i < n; i++) push(&t, ROLE_USER, 0.5f, 0);
  float *attn = calloc(n, sizeof(float));
  cr_assert_not_null(attn);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  counts[D] = n;
  for (size_t i = 0; i < n; i++) attn[i] = 1.0f;
  record(&t, 1, attn);
  judge_checked(&t, 1, &p, counts, &out);
  /* round 1: every near token (aged one round) moves, a quarter of the far ones */
  size_t far_moved = 0, near_moved = 0;
  for (size_t i = p.sink_tokens; i < n; i++)
    if (t.state[i] != D) *(i < far ? &far_moved : &near_moved) += 1;
  cr_assert_eq(near_moved, CKV_JUDGE_NEAR_TOKENS, "near tokens judged every round");
  cr_assert(far_moved > far / 4 - 8 && far_moved < far / 4 + 8, "far tokens moved in round 1: %zu of %zu", far_moved, far);
  /* four rounds judge every far token once */
  for (uint32_t round = 2; round <= 4; round++) {
    record(&t, round, attn);
    judge_checked(&t, round, &p, counts, &out);
  }
  size_t still = 0;
  for (size_t i = p.sink_tokens; i < far; i++) still += t.state[i] == D;
  cr_assert_eq(still, 0, "%zu far tokens never judged in 4 rounds", still);
  free(attn);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

/* ---- baselines ---- */

/* n tokens appended before round 1, all user role. */
static void fill(ckv_tokens *t, size_t n, uint8_t role, float sem) {
  for (size_t i = 0; i < n; i++) push(t, role, sem, 0);
}

Test(baseline, fp16_never_changes_anything) {
  ckv_judge_params p = params_for(CKV_POLICY_FP16);
  ckv_tokens t;
  ckv_tokens_init(&t);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  for (uint32_t round = 1; round <= 50; round++) {
    fill(&t, 10, round % 5 ? ROLE_USER : ROLE_SYSTEM, round % 2 ? 0.9f : 0.f);
    counts[D] += 10;
    uniform_round(&t, round, round < 10 ? 1.f : 0.f); /* then 40 idle rounds */
    judge_checked(&t, round, &p, counts, &out);
    cr_assert_eq(out.n, 0, "fp16 made a transition in round %u", round);
  }
  for (size_t pos = 0; pos < t.n; pos++) cr_assert_eq(t.state[pos], D);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(baseline, int8_stages_everything_past_the_window_and_nothing_else) {
  ckv_judge_params p = params_for(CKV_POLICY_INT8);
  ckv_tokens t;
  ckv_tokens_init(&t);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  for (uint32_t round = 1; round <= 30; round++) {
    fill(&t, 7, round % 3 ? ROLE_USER : ROLE_SYSTEM, (float)(round % 4) / 4.f);
    counts[D] += 7;
    uniform_round(&t, round, round % 2 ? 3.f : 0.f);
    judge_checked(&t, round, &p, counts, &out);
    size_t end = t.n > p.recent_window ? t.n - p.recent_window : 0;
    for (size_t pos = 0; pos < t.n; pos++) {
      uint8_t want = pos >= p.sink_tokens && pos < end ? S : D; /* sinks and window stay FP16 */
      cr_assert_eq(t.state[pos], want, "int8 round %u: token %zu is %u, want %u", round, pos, t.state[pos], want);
    }
  }
  cr_assert_eq(counts[C] + counts[X], 0);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

static void kivi(int policy) {
  ckv_judge_params p = params_for(policy);
  p.recent_window = 32; /* the positions below */
  ckv_tokens t;
  ckv_tokens_init(&t);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  fill(&t, 100, ROLE_USER, 0.1f);
  counts[D] = 100;
  uniform_round(&t, 1, 1.f);
  judge_checked(&t, 1, &p, counts, &out);
  for (size_t pos = 0; pos < t.n; pos++)
    cr_assert_eq(t.state[pos], pos >= 4 && pos < 68 ? S : D, "round 1, token %zu", pos);
  uniform_round(&t, 2, 0.f);
  judge_checked(&t, 2, &p, counts, &out);
  for (size_t pos = 0; pos < t.n; pos++)
    cr_assert_eq(t.state[pos], pos >= 4 && pos < 68 ? C : D, "round 2, token %zu", pos);
  /* more tokens: the ones leaving the window follow the same two steps */
  fill(&t, 20, ROLE_SYSTEM, 0.9f);
  counts[D] += 20;
  for (uint32_t round = 3; round <= 4; round++) {
    uniform_round(&t, round, 5.f);
    judge_checked(&t, round, &p, counts, &out);
  }
  for (size_t pos = 0; pos < t.n; pos++)
    cr_assert_eq(t.state[pos], pos >= 4 && pos < 88 ? C : D, "round 4, token %zu", pos);
  cr_assert_eq(counts[X], 0, "kivi never recycles");
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(baseline, kivi4_commits_everything_past_the_window) { kivi(CKV_POLICY_KIVI4); }
Test(baseline, kivi2_commits_everything_past_the_window) { kivi(CKV_POLICY_KIVI2); }

static size_t budget_keep(const ckv_judge_params *p, size_t n) {
  size_t keep = (size_t)floor((double)p->budget * (double)n + 0.5);
  if (keep < p->sink_tokens + p->recent_window) keep = p->sink_tokens + p->recent_window;
  return keep < n ? keep : n;
}

Test(baseline, streaming_keeps_sinks_and_recent_within_the_budget) {
  ckv_judge_params p = params_for(CKV_POLICY_STREAMING);
  ckv_tokens t;
  ckv_tokens_init(&t);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  rng g = {99};
  for (uint32_t round = 1; round <= 40; round++) {
    fill(&t, 13, ROLE_USER, 0.9f);
    counts[D] += 13;
    float *a = malloc(t.n * sizeof(float));
    for (size_t i = 0; i < t.n; i++) a[i] = 10.f * rndf(&g); /* attention does not matter */
    record(&t, round, a);
    free(a);
    judge_checked(&t, round, &p, counts, &out);
    size_t keep = budget_keep(&p, t.n), recent = keep - p.sink_tokens;
    for (size_t pos = 0; pos < t.n; pos++) {
      bool kept = pos < p.sink_tokens || pos >= t.n - recent;
      cr_assert_eq(t.state[pos], kept ? D : X, "streaming round %u (n %zu, keep %zu): token %zu is %u", round, t.n,
                   keep, pos, t.state[pos]);
    }
    cr_assert_eq(live_count(&t), keep);
  }
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

static int by_cum_desc(const void *a, const void *b, void *ctx) {
  const float *cum = ctx;
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  if (cum[x] != cum[y]) return cum[x] < cum[y] ? 1 : -1;
  return x < y ? -1 : 1;
}

Test(baseline, h2o_keeps_sinks_recent_and_heaviest_within_the_budget) {
  ckv_judge_params p = params_for(CKV_POLICY_H2O);
  ckv_tokens t;
  ckv_tokens_init(&t);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {0};
  rng g = {7};
  size_t heavy_seen = 0;
  for (uint32_t round = 1; round <= 40; round++) {
    fill(&t, 17, ROLE_USER, 0.5f);
    counts[D] += 17;
    float *a = malloc(t.n * sizeof(float));
    for (size_t i = 0; i < t.n; i++) a[i] = i % 11 == 0 ? 5.f + rndf(&g) : 0.2f * rndf(&g); /* heavy hitters */
    uint8_t *before = malloc(t.n);
    record(&t, round, a);
    memcpy(before, t.state, t.n);
    judge_checked(&t, round, &p, counts, &out);
    size_t keep = budget_keep(&p, t.n);
    if (keep >= t.n) {
      cr_assert_eq(out.n, 0);
    } else {
      size_t body = keep - p.sink_tokens, recent = body / 2;
      if (recent < p.recent_window) recent = p.recent_window;
      if (recent > body) recent = body;
      size_t start_recent = t.n - recent, heavy_n = body - recent;
      /* reference: of the middle tokens live before this round, the heavy_n
       * heaviest by accumulated attention stay, the rest go */
      size_t *cand = malloc(t.n * sizeof(size_t)), nc = 0;
      for (size_t pos = p.sink_tokens; pos < start_recent; pos++)
        if (before[pos] != X) cand[nc++] = pos;
      qsort_r(cand, nc, sizeof(size_t), by_cum_desc, t.cum_attn);
      for (size_t i = 0; i < nc; i++)
        cr_assert_eq(t.state[cand[i]], i < heavy_n ? before[cand[i]] : X,
                     "h2o round %u: middle token %zu (rank %zu of %zu, keep %zu heavy) is %u", round, cand[i], i, nc,
                     heavy_n, t.state[cand[i]]);
      for (size_t pos = 0; pos < t.n; pos++)
        if (pos < p.sink_tokens || pos >= start_recent) cr_assert_eq(t.state[pos], D, "h2o: token %zu", pos);
      cr_assert_leq(live_count(&t), keep, "h2o round %u keeps more than the budget", round);
      for (size_t i = 0; i < nc && i < heavy_n; i++) heavy_seen += cand[i] % 11 == 0;
      free(cand);
    }
    free(before);
    free(a);
  }
  cr_assert_gt(heavy_seen, 0, "no heavy hitter was kept outside the window");
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

/* ---- filler_recycle_rounds ---- */

/* Tokens the worker scored empty are recycled filler_recycle_rounds after
 * they committed however much attention they draw; meaningful tokens,
 * system-role tokens and tokens with no score from the worker stay; off (0)
 * nothing is recycled. */
static void filler_recycle_run(uint32_t rounds_after_commit) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.persistence_rounds = 1;
  p.attn_threshold = p.high_attn_threshold = 1e6f; /* everything takes the cold path */
  p.idle_rounds = 1000000;
  p.sink_tokens = 0;
  p.recent_window = 0;
  p.filler_recycle_rounds = rounds_after_commit;
  enum { EMPTY, FACT, SYSTEM, UNSCORED, KINDS, PER = 8 };
  ckv_tokens t;
  ckv_tokens_init(&t);
  for (int k = 0; k < KINDS; k++)
    for (int i = 0; i < PER; i++)
      push(&t, k == SYSTEM ? ROLE_SYSTEM : ROLE_USER, k == EMPTY || k == SYSTEM ? 0.1f : k == FACT ? 0.9f : -1.f, 0);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {KINDS * PER, 0, 0, 0};
  uint32_t committed_at = 0, recycled_at = 0;
  for (uint32_t round = 1; round <= 12; round++) {
    uniform_round(&t, round, 5.f); /* every token heavily attended, every round */
    judge_checked(&t, round, &p, counts, &out);
    if (!committed_at && t.state[EMPTY * PER] == C) committed_at = round;
    if (!recycled_at && t.state[EMPTY * PER] == X) recycled_at = round;
  }
  cr_assert_gt(committed_at, 0, "the empty tokens never committed");
  for (int k = 0; k < KINDS; k++)
    for (int i = 0; i < PER; i++) {
      uint8_t st = t.state[k * PER + i];
      if (k == EMPTY && rounds_after_commit)
        cr_expect_eq(st, X, "empty token %d not recycled", i);
      else
        cr_expect_eq(st, C, "kind %d token %d: state %u, want committed", k, i, st);
    }
  if (rounds_after_commit)
    cr_expect_eq(recycled_at, committed_at + rounds_after_commit, "committed at round %u, recycled at %u", committed_at,
                 recycled_at);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(judge, filler_recycle_rounds_recycles_worker_scored_filler_however_attended) {
  filler_recycle_run(2);
  filler_recycle_run(1);
}

Test(judge, filler_recycle_rounds_off_recycles_nothing) { filler_recycle_run(0); }

/* ---- scored_persistence_rounds ---- */

/* Every token heavily attended every round, shipped thresholds (persistence_rounds 4): a token the
 * worker scored a fact (0.9) or filler (0.1) commits `spr` rounds after it was staged (0: after
 * persistence_rounds like the rest); tokens scored in between (0.5) and unscored ones always wait
 * persistence_rounds.  The fact commits as a lasting fact (the facts' format). */
static void scored_persistence_run(uint32_t spr) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  cr_assert_eq(p.persistence_rounds, 4, "the shipped persistence_rounds changed: re-derive this test");
  p.sink_tokens = 0;
  p.recent_window = 0;
  p.idle_rounds = 1000000;
  p.filler_recycle_rounds = 0; /* watch the commit, not the recycling after it */
  p.scored_persistence_rounds = spr;
  enum { FACT, EMPTY, MIDDLE, UNSCORED, KINDS, PER = 8 };
  static const float sem[KINDS] = {0.9f, 0.1f, 0.5f, -1.f};
  ckv_tokens t;
  ckv_tokens_init(&t);
  for (int k = 0; k < KINDS; k++)
    for (int i = 0; i < PER; i++) push(&t, ROLE_USER, sem[k], 0);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {KINDS * PER, 0, 0, 0};
  uint32_t staged_at[KINDS] = {0}, committed_at[KINDS] = {0};
  for (uint32_t round = 1; round <= 12; round++) {
    uniform_round(&t, round, 5.f);
    judge_checked(&t, round, &p, counts, &out);
    for (int k = 0; k < KINDS; k++) {
      uint8_t st = t.state[k * PER];
      for (int i = 1; i < PER; i++) cr_assert_eq(t.state[k * PER + i], st, "kind %d: tokens of one kind disagree", k);
      if (!staged_at[k] && st == S) staged_at[k] = round;
      if (!committed_at[k] && st == C) committed_at[k] = round, staged_at[k] = staged_at[k] ? staged_at[k] : round;
    }
  }
  for (int k = 0; k < KINDS; k++) {
    uint32_t want = spr && (k == FACT || k == EMPTY) ? spr : p.persistence_rounds;
    cr_assert_gt(committed_at[k], 0, "kind %d never committed (spr %u)", k, spr);
    cr_expect_eq(committed_at[k] - staged_at[k], want, "kind %d: staged at round %u, committed at %u; want %u later",
                 k, staged_at[k], committed_at[k], want);
  }
  cr_expect(ckv_judge_lasting_fact(&t, FACT * PER, &p), "the worker's fact is not a lasting fact");
  cr_expect(!ckv_judge_lasting_fact(&t, EMPTY * PER, &p), "the worker's filler is a lasting fact");
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(judge, scored_persistence_rounds_commits_the_workers_facts_and_filler_early) {
  scored_persistence_run(1);
  scored_persistence_run(2);
}

Test(judge, scored_persistence_rounds_off_waits_persistence_rounds) { scored_persistence_run(0); }

/* ---- the score tests at the exact Q0.16 boundary ----
 * The judge compares scores as Q0.16 integers against thresholds turned
 * into integers once per run; these tokens sit at the two scores either side
 * of where ckv_q16_to_unit(q) crosses the threshold, so an off-by-one in the
 * conversion turns one of them the wrong way. */

/* The first q whose score is >= x (65536 if none), by the definition. */
static uint32_t first_q_at_least(float x) {
  uint32_t q = 0;
  while (q <= 65535 && !(ckv_q16_to_unit((uint16_t)q) >= x)) q++;
  return q;
}

/* n tokens with scores q0, q0 + 1, q0 + 2, q0 + 3, q0, ... (clamped to
 * 65535), given by the worker: n >= 16 puts them in the vector scan's whole
 * groups of 8 as well as in its scalar tail. */
static void push_scored(ckv_tokens *t, uint32_t q0, size_t n, uint8_t state, uint32_t round) {
  for (size_t i = 0; i < n; i++) {
    push(t, ROLE_USER, 0.5f, round);
    size_t pos = t->n - 1;
    uint32_t q = q0 + (uint32_t)(i % 4) > 65535 ? 65535 : q0 + (uint32_t)(i % 4);
    t->semantic[pos] = (uint16_t)q;
    t->flags[pos] |= CKV_TOKEN_SEM_GIVEN;
    t->state[pos] = state;
  }
}

Test(judge, score_thresholds_turn_at_the_exact_q16_boundary) {
  static const float thresholds[] = {0.3f, 0.f, 0.5f, 0.77777f, 0.999999f, 1.f};
  for (size_t i = 0; i < sizeof(thresholds) / sizeof(thresholds[0]); i++) {
    float thr = thresholds[i];
    uint32_t b = first_q_at_least(thr), q0 = b >= 2 ? b - 2 : 0;
    ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
    p.semantic_threshold = thr;
    p.sink_tokens = 0;
    p.recent_window = 0;
    p.attn_threshold = 0.5f;
    p.filler_cold = 0;
    p.scored_persistence_rounds = 0;

    /* committed filler: recycled filler_recycle_rounds after its commit iff below the threshold */
    ckv_tokens t;
    ckv_tokens_init(&t);
    push_scored(&t, q0, 21, C, 1);
    p.idle_rounds = 1000000;
    p.filler_recycle_rounds = 3;
    ckv_transition_list out = {0};
    cr_assert_eq(ckv_judge_run(&t, 10, &p, &out), CKV_OK);
    for (size_t pos = 0; pos < t.n; pos++) {
      int below = ckv_q16_to_unit(t.semantic[pos]) < thr;
      cr_expect_eq(t.state[pos] == X, below, "threshold %g, q %u (boundary %u): recycled %d, below %d", (double)thr,
                   t.semantic[pos], b, t.state[pos] == X, below);
    }
    ckv_transition_list_done(&out);
    ckv_tokens_done(&t);

    /* a fresh draft drawing attention: staged at once iff meaningful (else it is filler and stays draft) */
    ckv_tokens_init(&t);
    push_scored(&t, q0, 21, D, 1);
    float attn[21];
    for (size_t pos = 0; pos < 21; pos++) attn[pos] = 1.f;
    record(&t, 1, attn);
    cr_assert_eq(ckv_judge_run(&t, 1, &p, &out), CKV_OK);
    for (size_t pos = 0; pos < t.n; pos++) {
      int meaningful = ckv_q16_to_unit(t.semantic[pos]) >= thr;
      cr_expect_eq(t.state[pos] == S, meaningful, "threshold %g, q %u (boundary %u): staged %d, meaningful %d",
                   (double)thr, t.semantic[pos], b, t.state[pos] == S, meaningful);
    }
    ckv_transition_list_done(&out);
    ckv_tokens_done(&t);
  }

  /* idle committed tokens: kept iff the worker scored them a lasting fact (>= CKV_FACT_SEMANTIC) */
  uint32_t b = first_q_at_least(CKV_FACT_SEMANTIC);
  cr_assert(b > 2 && b < 65535, "fact boundary %u", b);
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.sink_tokens = 0;
  p.recent_window = 0;
  p.idle_rounds = 5;
  p.filler_recycle_rounds = 0;
  ckv_tokens t;
  ckv_tokens_init(&t);
  push_scored(&t, b - 2, 21, C, 1);
  int fact_before[21];
  for (size_t pos = 0; pos < t.n; pos++) {
    fact_before[pos] = ckv_judge_lasting_fact(&t, pos, &p);
    cr_expect_eq(fact_before[pos], ckv_q16_to_unit(t.semantic[pos]) >= CKV_FACT_SEMANTIC,
                 "q %u (boundary %u): ckv_judge_lasting_fact %d", t.semantic[pos], b, fact_before[pos]);
  }
  ckv_transition_list out = {0};
  cr_assert_eq(ckv_judge_run(&t, 20, &p, &out), CKV_OK);
  for (size_t pos = 0; pos < t.n; pos++)
    cr_expect_eq(t.state[pos] != X, fact_before[pos], "q %u (fact boundary %u): kept %d", t.semantic[pos], b,
                 t.state[pos] != X);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

/* ---- the judge's vector pre-scan decides what the per-token rules decide ----
 * The same random stream (every role, confirmation tags, worker-scored and
 * estimated scores, idle spells, recycled tokens, a far-token sample) judged
 * with the scalar path and with the vector one: the same states, flags,
 * last_transition and transition lists, round by round. */

typedef struct judged_stream {
  ckv_tokens t;
  ckv_transition_range *v; /* every round's transitions, concatenated */
  size_t n, cap;
} judged_stream;

static void run_random_stream(ckv_tokens_path path, const ckv_judge_params *p, judged_stream *js) {
  cr_assert_eq(ckv_tokens_force_path(path), CKV_OK);
  rng r = {2024};
  ckv_tokens_init(&js->t);
  js->v = NULL;
  js->n = js->cap = 0;
  enum { ROUNDS = 60, MAX = 3000 };
  float *attn = malloc(MAX * sizeof(float));
  cr_assert_not_null(attn);
  for (uint32_t round = 1; round <= ROUNDS; round++) {
    size_t add = 20 + rnd(&r) % 61; /* sizes that are not multiples of 8 */
    for (size_t i = 0; i < add && js->t.n < MAX; i++) {
      uint8_t role = (uint8_t)(rnd(&r) % 5);
      float sem = rnd(&r) % 4 == 0 ? -1.f : rndf(&r); /* a quarter estimated */
      cr_assert_eq(ckv_tokens_reserve(&js->t, 1), CKV_OK);
      ckv_tokens_push(&js->t, role, rnd(&r) % 7 == 0 ? 4 : 0, sem, round, CKV_NO_BLOCK, 0);
    }
    for (size_t i = 0; i < js->t.n; i++) {
      uint64_t x = rnd(&r) % 10;
      attn[i] = x < 4 ? 0.f : x < 8 ? rndf(&r) * 0.5f : 2.f + rndf(&r) * 8.f; /* idle, lukewarm, hot */
    }
    ckv_tokens_record_round(&js->t, round, 0, attn, js->t.n, live_count(&js->t));
    ckv_transition_list out = {0};
    cr_assert_eq(ckv_judge_run(&js->t, round, p, &out), CKV_OK);
    if (js->n + out.n + 1 > js->cap) {
      js->cap = (js->n + out.n + 1) * 2;
      js->v = realloc(js->v, js->cap * sizeof(*js->v));
      cr_assert_not_null(js->v);
    }
    memcpy(js->v + js->n, out.v, out.n * sizeof(*out.v));
    js->n += out.n;
    js->v[js->n++] = (ckv_transition_range){round, 0, 0xff, 0xff}; /* round separator */
    ckv_transition_list_done(&out);
  }
  free(attn);
  ckv_tokens_force_path((ckv_tokens_path)-1);
}

static void judge_paths_alike(const ckv_judge_params *p, const char *what) {
  if (ckv_tokens_force_path(CKV_TOKENS_PATH_AVX2) != CKV_OK) {
    fprintf(stderr, "SKIPPED: this CPU has no AVX2: the judge's vector scan is not tested here\n");
    cr_skip_test("no AVX2");
  }
  ckv_tokens_force_path((ckv_tokens_path)-1);
  judged_stream a, b;
  run_random_stream(CKV_TOKENS_PATH_SCALAR, p, &a);
  run_random_stream(CKV_TOKENS_PATH_AVX2, p, &b);
  size_t n = a.t.n, changes = 0, recycled = 0;
  cr_assert_eq(b.t.n, n);
  cr_expect_eq(memcmp(a.t.state, b.t.state, n), 0, "%s: states differ", what);
  cr_expect_eq(memcmp(a.t.flags, b.t.flags, n), 0, "%s: flags differ", what);
  cr_expect_eq(memcmp(a.t.last_transition, b.t.last_transition, n * sizeof(uint32_t)), 0,
               "%s: last_transition differs", what);
  cr_assert_eq(a.n, b.n, "%s: %zu transition runs, vector path %zu", what, a.n, b.n);
  for (size_t i = 0; i < a.n; i++) {
    cr_assert(a.v[i].first == b.v[i].first && a.v[i].count == b.v[i].count && a.v[i].from == b.v[i].from &&
                  a.v[i].to == b.v[i].to,
              "%s: transition run %zu differs", what, i);
    if (a.v[i].from != 0xff) changes += a.v[i].count, recycled += a.v[i].to == X ? a.v[i].count : 0;
  }
  /* the stream must exercise the rules, or agreeing proves nothing */
  cr_assert_gt(changes, n, "%s: only %zu transitions for %zu tokens", what, changes, n);
  cr_assert_gt(recycled, n / 10, "%s: only %zu recycled of %zu", what, recycled, n);
  free(a.v);
  free(b.v);
  ckv_tokens_done(&a.t);
  ckv_tokens_done(&b.t);
}

Test(judge, vector_scan_decides_what_the_rules_decide, .timeout = 60) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.sink_tokens = 5; /* the scan starts unaligned */
  p.recent_window = 13;
  p.idle_rounds = 3;
  judge_paths_alike(&p, "defaults, idle_rounds 3");
  p.filler_recycle_rounds = 2;
  p.scored_persistence_rounds = 1;
  judge_paths_alike(&p, "filler_recycle_rounds 2");
  p.far_sample = 0.25f;
  judge_paths_alike(&p, "far_sample 0.25");
  p.fact_cold_rounds = 4;
  judge_paths_alike(&p, "fact_cold_rounds 4");
}

/* ---- filler_demote_staged ---- */

/* Turn labels (scored_persistence_rounds 1), demotion on: a token the worker scored empty that draws no
 * attention goes from staged straight to recycled (demoted, DESIGN.md's colder tier), never committed in primary
 * memory first; filler that draws attention still commits (the warm bits), and so does the worker's fact.  With
 * the key off, or without demotion, the unattended filler commits and is recycled filler_recycle_rounds later.
 * System-role tokens are never recycled, filler or not. */
static void filler_demote_run(int demote_staged, int demote) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.sink_tokens = 0;
  p.recent_window = 0;
  p.idle_rounds = 1000000;
  p.scored_persistence_rounds = 1;
  p.filler_demote_staged = demote_staged;
  p.demote = demote;
  cr_assert_eq(p.filler_recycle_rounds, 2, "the shipped filler_recycle_rounds changed: re-derive this test");
  enum { QUIET, HOT, FACT, SYSTEM, KINDS, PER = 8 };
  static const float sem[KINDS] = {0.1f, 0.1f, 0.9f, 0.1f};
  ckv_tokens t;
  ckv_tokens_init(&t);
  for (int k = 0; k < KINDS; k++)
    for (int i = 0; i < PER; i++) push(&t, k == SYSTEM ? ROLE_SYSTEM : ROLE_USER, sem[k], 0);
  ckv_transition_list out = {0};
  uint64_t counts[4] = {KINDS * PER, 0, 0, 0};
  bool was_committed[KINDS] = {false};
  uint32_t recycled_at[KINDS] = {0};
  float *a = malloc(t.n * sizeof(float));
  cr_assert_not_null(a);
  for (uint32_t round = 1; round <= 8; round++) {
    for (size_t i = 0; i < t.n; i++) a[i] = i / PER == HOT ? 5.f : 0.f; /* only HOT draws attention */
    record(&t, round, a);
    judge_checked(&t, round, &p, counts, &out);
    for (int k = 0; k < KINDS; k++) {
      for (int i = 1; i < PER; i++) cr_assert_eq(t.state[k * PER + i], t.state[k * PER], "kind %d disagrees", k);
      was_committed[k] |= t.state[k * PER] == C;
      if (!recycled_at[k] && t.state[k * PER] == X) recycled_at[k] = round;
    }
  }
  free(a);
  bool skip_primary = demote_staged && demote;
  cr_expect_eq(was_committed[QUIET], !skip_primary, "unattended filler %s committed (key %d, demote %d)",
               was_committed[QUIET] ? "was" : "was never", demote_staged, demote);
  cr_expect_eq(recycled_at[QUIET], skip_primary ? 2u : 4u, "unattended filler recycled at round %u (key %d, demote %d)",
               recycled_at[QUIET], demote_staged, demote);
  cr_expect(was_committed[HOT], "attended filler never committed");
  cr_expect(was_committed[FACT] && t.state[FACT * PER] == C, "the worker's fact is not kept committed");
  cr_expect_eq(t.state[SYSTEM * PER], C, "system-role filler in state %u: never recycled", t.state[SYSTEM * PER]);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(judge, filler_demote_staged_sends_unattended_filler_cold_from_staged) { filler_demote_run(1, 1); }

Test(judge, filler_demote_staged_off_or_without_demotion_commits_filler_first) {
  filler_demote_run(0, 1);
  filler_demote_run(1, 0);
}

/* ---- fact_cold_rounds ---- */

/* Turn labels (scored_persistence_rounds 1), demotion on: the worker's facts commit at round 2 and go cold
 * (recycled: demoted, DESIGN.md's colder tier) fact_cold_rounds later, whatever their attention (the worker's
 * query gathers what it needs from the cold tier, and the store recalls what that attention reaches); a fact
 * recalled at some round (committed again) goes cold fact_cold_rounds after that; system-role facts never go.
 * With the key at 0, or without demotion, no lasting fact is ever recycled, even with idle_rounds passed.  On the
 * rule's own loop and the vector scan. */
static void fact_cold_run(ckv_tokens_path path, uint32_t fact_cold_rounds, int demote) {
  ckv_judge_params p = params_for(CKV_POLICY_COMMITKV);
  p.sink_tokens = 0;
  p.recent_window = 0;
  p.idle_rounds = 3; /* commits first (round 2); from then only the fact rule may recycle a fact */
  p.scored_persistence_rounds = 1;
  p.fact_cold_rounds = fact_cold_rounds;
  p.demote = demote;
  cr_assert_eq(ckv_tokens_force_path(path), CKV_OK);
  enum { QUIET, READ, RECALLED, SYSTEM, KINDS, PER = 16 };
  const uint32_t recall_round = 2 + fact_cold_rounds + 1;
  ckv_tokens t;
  ckv_tokens_init(&t);
  for (int k = 0; k < KINDS; k++)
    for (int i = 0; i < PER; i++) push(&t, k == SYSTEM ? ROLE_SYSTEM : ROLE_USER, 0.9f, 0);
  for (size_t i = 0; i < t.n; i++) t.flags[i] |= CKV_TOKEN_SEM_GIVEN;
  ckv_transition_list out = {0};
  uint64_t counts[4] = {KINDS * PER, 0, 0, 0};
  uint32_t committed_at = 0, recycled_at[KINDS] = {0}, again_at = 0;
  float *a = malloc(t.n * sizeof(float));
  cr_assert_not_null(a);
  for (uint32_t round = 1; round <= 20; round++) {
    for (size_t i = 0; i < t.n; i++) a[i] = i / PER == READ || i / PER == RECALLED ? 5.f : 0.f;
    record(&t, round, a);
    if (round == recall_round && t.state[RECALLED * PER] == X) /* what the store does on a recall */
      for (int i = 0; i < PER; i++) {
        t.state[RECALLED * PER + i] = C;
        t.last_transition[RECALLED * PER + i] = round;
        counts[X]--, counts[C]++;
      }
    uint8_t before = t.state[RECALLED * PER];
    judge_checked(&t, round, &p, counts, &out);
    for (int k = 0; k < KINDS; k++) {
      for (int i = 1; i < PER; i++) cr_assert_eq(t.state[k * PER + i], t.state[k * PER], "kind %d disagrees", k);
      if (!recycled_at[k] && t.state[k * PER] == X) recycled_at[k] = round;
    }
    if (round > recall_round && before == C && t.state[RECALLED * PER] == X) again_at = round;
    if (!committed_at && t.state[QUIET * PER] == C) committed_at = round;
  }
  free(a);
  ckv_tokens_force_path((ckv_tokens_path)-1);
  cr_expect_eq(committed_at, 2u, "the facts committed at round %u", committed_at);
  bool cold = fact_cold_rounds && demote;
  uint32_t want = cold ? 2 + fact_cold_rounds : 0u;
  cr_expect_eq(recycled_at[QUIET], want, "an unread fact went cold at round %u (key %u, demote %d)", recycled_at[QUIET],
               fact_cold_rounds, demote);
  cr_expect_eq(recycled_at[READ], want, "a fact read every round went cold at round %u (key %u, demote %d)",
               recycled_at[READ], fact_cold_rounds, demote);
  cr_expect_eq(again_at, cold ? recall_round + fact_cold_rounds : 0u, "a recalled fact went cold again at round %u",
               again_at);
  if (cold) cr_expect(ckv_judge_fact_format(&t, QUIET * PER, &p), "a fact that went cold lost the facts' format");
  cr_expect_eq(recycled_at[SYSTEM], 0u, "a system-role fact recycled at round %u", recycled_at[SYSTEM]);
  ckv_transition_list_done(&out);
  ckv_tokens_done(&t);
}

Test(judge, fact_cold_rounds_sends_facts_cold) {
  fact_cold_run(CKV_TOKENS_PATH_SCALAR, 2, 1);
  fact_cold_run(CKV_TOKENS_PATH_SCALAR, 5, 1);
  if (ckv_tokens_force_path(CKV_TOKENS_PATH_AVX2) != CKV_OK) {
    ckv_tokens_force_path((ckv_tokens_path)-1);
    fprintf(stderr, "SKIPPED (part): this CPU has no AVX2: the vector scan's fact rule is not tested here\n");
    return;
  }
  fact_cold_run(CKV_TOKENS_PATH_AVX2, 2, 1);
  fact_cold_run(CKV_TOKENS_PATH_AVX2, 5, 1);
}

Test(judge, facts_never_go_cold_without_the_key_or_demotion) {
  fact_cold_run(CKV_TOKENS_PATH_SCALAR, 0, 1);
  fact_cold_run(CKV_TOKENS_PATH_SCALAR, 3, 0);
}
