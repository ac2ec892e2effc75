/* judge.h - the transition judge: after each ReportRound, one pass over a
 * session's tokens decides their next lifecycle state.
 *
 * Policies share this entry point so every comparison runs in one engine:
 * commitkv (the rule judge, or the mlp judge when configured) and the
 * baselines fp16, int8, kivi4, kivi2, h2o and streaming.  Decisions change
 * the *logical* state column at once; the lifecycle module then moves the
 * bytes asynchronously.  Only these transitions ever happen:
 * draft->staged, staged->committed, and draft|staged|committed->recycled.
 * The judge is a pure function of the token columns, the round and the
 * parameters: the same stream gives the same states, bit for bit. */
#ifndef CKV_LIFECYCLE_JUDGE_H
#define CKV_LIFECYCLE_JUDGE_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/tokens.h"

typedef struct ckv_mlp ckv_mlp;

/* far_sample applies to tokens older than the newest this many. */
#define CKV_JUDGE_NEAR_TOKENS 4096u

/* A committed token the worker scored at least this (semantic score) is a
 * lasting fact: never recycled for silence (task goal, constraint, order id). */
#define CKV_FACT_SEMANTIC 0.8f

/* Effective parameters of one session: the [policy] section plus the
 * session's overrides.  Defaults, bounds and docs of every field but policy
 * and mlp: CKV_JUDGE_PARAM_LIST (lifecycle/policy.h); ckv_judge_params_init
 * fills the defaults. */
typedef struct ckv_judge_params {
  int policy;                /* ckv_policy_id (lifecycle/policy.h) */
  float attn_threshold;      /* draft->staged: mean relative attention */
  float semantic_threshold;  /* promotion needs at least this semantic score */
  float high_attn_threshold; /* staged->committed: sustained relative attention */
  uint32_t history_rounds;   /* R (<= CKV_ATTN_HISTORY) */
  uint32_t sink_tokens;      /* S */
  uint32_t recent_window;    /* W */
  uint32_t persistence_rounds;
  uint32_t idle_rounds;
  float budget;              /* h2o/streaming: kept tokens as a fraction of all */
  uint32_t commit_bits;      /* 4 or 2 */
  int rotate;                /* committed blocks in the rotated formats where head_dim allows */
  uint32_t cold_bits;        /* rotated: bits of committed tokens that are not lasting facts (0 = commit_bits) */
  int filler_cold;           /* filler takes the cold path (staged, then cold_bits) instead of staying draft */
  int warm_commit;           /* staged tokens still attended commit after persistence_rounds (warm_bits) */
  uint32_t warm_bits;        /* rotated: bits of those warm tokens (0 = commit_bits) */
  uint32_t judge_every;      /* the rules run every this many rounds (attention is recorded every round) */
  float far_sample;          /* share of the tokens older than CKV_JUDGE_NEAR_TOKENS judged per round */
  float prune_keep;          /* committed key channels kept (fraction) */
  uint32_t filler_recycle_rounds; /* worker-scored empty tokens recycled this many rounds after commit; 0 = off */
  uint32_t scored_persistence_rounds; /* staged rounds before a worker-scored fact or filler commits; 0 = persistence_rounds */
  int semantic_estimate_enabled; /* estimate semantic scores when the worker sends none */
  const ckv_mlp *mlp;        /* non-NULL: the mlp judge replaces the rules (commitkv policy) */
} ckv_judge_params;

/* A run of consecutive positions that made the same transition. */
typedef struct ckv_transition_range {
  uint64_t first;
  uint32_t count;
  uint8_t from, to;
} ckv_transition_range;

typedef struct ckv_transition_list {
  ckv_transition_range *v;
  size_t n, cap;
} ckv_transition_list;

void ckv_transition_list_done(ckv_transition_list *l);
/* Append one position's transition, merging with the previous run. -ENOMEM on failure. */
int ckv_transition_list_add(ckv_transition_list *l, uint64_t pos, uint8_t from, uint8_t to);

/* Whether a token may never be recycled by the judge (sinks, system role).
 * The recent window is protected separately (it depends on n). */
int ckv_judge_protected(const ckv_tokens *t, size_t pos, const ckv_judge_params *p);
/* A committed token that is a lasting fact (committed for sustained attention
 * while meaningful, confirmed, or scored a fact by the worker): never
 * recycled for silence, and stored in the best-protected committed format. */
int ckv_judge_lasting_fact(const ckv_tokens *t, size_t pos, const ckv_judge_params *p);

/* Runs the judge for `round` over every token: updates t->state and
 * t->last_transition and appends each change to `out`.  Returns CKV_OK or
 * -ENOMEM (states may then be partly updated; `out` lists exactly what was). */
int ckv_judge_run(ckv_tokens *t, uint32_t round, const ckv_judge_params *p, ckv_transition_list *out);

/* The feature vector both judges see for one token (documented in judge.c);
 * exposed for the mlp judge, its trainer and trace recording. */
#define CKV_JUDGE_FEATURES 12
void ckv_judge_features(const ckv_tokens *t, size_t pos, uint32_t round, const ckv_judge_params *p,
                        float ret[CKV_JUDGE_FEATURES]);

#endif
