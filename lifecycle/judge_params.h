/* judge_params.h - what the transition judge is given (types and
 * constants only): one session's effective parameters, the size of the
 * feature vector both judges see.  judge.h runs the judge; policy.h lists
 * the parameters' defaults, bounds and docs; mlp.h scores the features. */
#ifndef CKV_LIFECYCLE_JUDGE_PARAMS_H
#define CKV_LIFECYCLE_JUDGE_PARAMS_H

#include <stdint.h>

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
  int demote;                /* recycled tokens keep their bytes in cold blocks (dropped only by quota) */
  int filler_demote_staged;  /* with demote: unattended worker-scored filler goes cold from staged */
  uint32_t fact_cold_rounds; /* with demote: rounds a lasting fact goes unattended before it goes cold; 0 = never */
  float recall_attn;         /* relative attention that recalls a demoted token */
  uint32_t share_grace_rounds; /* reuse_prefix sessions: rounds a published block waits for a second holder */
  int semantic_estimate_enabled; /* estimate semantic scores when the worker sends none */
  const ckv_mlp *mlp;        /* non-NULL: the mlp judge replaces the rules (commitkv policy) */
} ckv_judge_params;

/* The length of the feature vector both judges see for one token
 * (ckv_judge_features, judge.h). */
#define CKV_JUDGE_FEATURES 12

#endif
