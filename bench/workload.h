/* workload.h - a synthetic multi-turn agent workload at model geometry, for
 * the quality benchmark (commitkv-bench quality).
 *
 * A session is a sequence of rounds.  Round 1 is the system prompt (its first
 * sink_tokens are attention sinks); every later round is a user turn, then an
 * assistant turn that opens with templated filler ("ok", "got it"), and
 * sometimes a tool output.  Each round belongs to a topic segment of
 * topic_rounds rounds; the round's queries attend mostly to the current
 * topic's tokens, so older topics go cold.  Planted facts (task goal,
 * constraint, order id) are stated in early user turns, confirmed in the
 * next assistant turn (tag CKV_TAG_CONFIRMATION) and queried again many
 * rounds later by a query row whose q aligns with the fact's keys.  Tool
 * outputs are attended by the queries of the round after they appear, then
 * never.  Filler draws high attention and has a low semantic score.
 *
 * Keys and queries are built in "logit units": every kind of token has a
 * random unit direction per (layer, kv head); a key is A*(direction) plus
 * N(0,1) noise plus a few outlier channels (10-50x the typical element,
 * nearly constant per channel as in real models); a query is the sum of the
 * directions it looks for, scaled so that a token on a direction with weight w
 * gets a logit (q.k / sqrt(head_dim)) of about w.  Values are N(0,1).  All
 * randomness comes from one seed: the same parameters give the same bytes.
 *
 * Usage: ckv_workload_params p; ckv_workload_defaults(&p) (or _quick);
 * ckv_workload_new(&p, &w); then ckv_workload_next(w, &round) for each round
 * (the round's arrays are owned by w and valid until the next call);
 * ckv_workload_free(w). */
#ifndef CKV_BENCH_WORKLOAD_H
#define CKV_BENCH_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#define CKV_WL_MAX_FACTS 8u
#define CKV_WL_MAX_FACT_QUERIES 4u

/* Parameters; ckv_workload_defaults documents each default. */
typedef struct ckv_workload_params {
  /* geometry */
  uint32_t n_layers, n_kv_heads, head_dim;
  uint32_t q_per_kv;        /* GQA: query heads per kv head (n_q_heads = q_per_kv * n_kv_heads) */
  uint64_t seed;
  /* shape of a session */
  uint32_t rounds;          /* rounds including the system-prompt round 1 */
  uint32_t system_tokens;   /* round 1: system prompt (role system) */
  uint32_t sink_tokens;     /* the first tokens of the system prompt are attention sinks */
  uint32_t user_tokens;     /* mean tokens of a user turn (+-25%) */
  uint32_t assistant_tokens; /* mean tokens of an assistant turn (+-25%), filler included */
  uint32_t filler_tokens;   /* templated filler at the start of every assistant turn */
  uint32_t tool_every;      /* a tool output every this many rounds (0: none) */
  uint32_t tool_tokens;     /* tokens of a tool output */
  uint32_t topic_rounds;    /* rounds per topic segment */
  uint32_t queries;         /* query rows (decode steps) per round */
  /* planted facts */
  uint32_t n_facts;         /* <= CKV_WL_MAX_FACTS: goal, constraint, order id, ... */
  uint32_t fact_tokens;     /* tokens of a fact statement (the confirmation restates it with as many) */
  uint32_t fact_first_round; /* fact i is stated in round fact_first_round + i, confirmed the round after */
  uint32_t fact_queries;    /* later queries per fact, spread over the second half of the session */
  uint32_t persistent_facts; /* the first this many facts (goal, constraint) keep a small share of every
                              * round's attention (fact_echo_logit); the others are silent until queried */
  /* key/query model */
  uint32_t outlier_channels; /* outlier key channels per (layer, kv head) */
  float outlier_min, outlier_max; /* their magnitude, in units of a typical key element */
  float key_amplitude;      /* |direction component| of a key, relative to its noise norm */
  float sink_logit, system_logit, topic_logit, filler_logit, tool_logit, fact_logit, fact_echo_logit;
  float query_noise;        /* logit noise: N(0, query_noise) per token and row */
  int attention_only;       /* no CONFIRMATION tags and no semantic scores (round.semantic NULL): what the
                             * policy keeps by attention alone */
} ckv_workload_params;

/* The realistic defaults: 32 layers, 8 kv heads, head_dim 128, GQA 4. */
void ckv_workload_defaults(ckv_workload_params *p);
/* The CI preset: same session structure, small geometry and short turns. */
void ckv_workload_quick(ckv_workload_params *p);

/* A planted fact: its statement and confirmation tokens. */
typedef struct ckv_workload_fact {
  const char *name;         /* "goal", "constraint", "order_id", "fact3", ... */
  uint32_t stated_round;
  uint64_t first_stated, first_confirmed; /* positions; fact_tokens each */
  uint32_t n_tokens;        /* per part */
  uint32_t query_rounds[CKV_WL_MAX_FACT_QUERIES];
  uint32_t n_query_rounds;
} ckv_workload_fact;

/* One round.  Arrays are owned by the workload, valid until the next call. */
typedef struct ckv_workload_round {
  uint32_t round;           /* 1-based */
  uint32_t topic;
  uint64_t first_position;
  uint32_t n_tokens;
  const uint8_t *roles;     /* CKV_ROLE_* */
  const uint8_t *tags;      /* CKV_TAG_* */
  const float *semantic;    /* [0,1] */
  const uint32_t *token_ids;
  const uint16_t *kv;       /* FP16 [n_tokens][n_layers][2 (K, V)][n_kv_heads * head_dim] */
  uint32_t n_queries;
  const float *q;           /* [n_layers][n_queries][n_q_heads][head_dim] */
  const int32_t *query_fact; /* [n_queries]: index of the fact the row asks for, or -1 */
} ckv_workload_round;

typedef struct ckv_workload ckv_workload;

/* Validates p and plans the session (fact rounds, positions).  Returns 0,
 * -EINVAL (with a reason in ret_err when not NULL) or -ENOMEM. */
int ckv_workload_new(const ckv_workload_params *p, ckv_workload **ret, const char **ret_err);
ckv_workload *ckv_workload_free(ckv_workload *w);
/* Generates the next round; -ENOENT after the last, -ENOMEM. */
int ckv_workload_next(ckv_workload *w, ckv_workload_round *ret);

const ckv_workload_params *ckv_workload_params_of(const ckv_workload *w);
uint32_t ckv_workload_n_facts(const ckv_workload *w);
/* Fact i (positions are known once its rounds have been generated; the plan
 * fixes them at ckv_workload_new). */
const ckv_workload_fact *ckv_workload_fact_at(const ckv_workload *w, uint32_t i);
/* Tokens of the whole session. */
uint64_t ckv_workload_total_tokens(const ckv_workload *w);
/* Bytes of one token's K/V of one layer (K or V alone): n_kv_heads*head_dim*2. */
size_t ckv_workload_token_layer_bytes(const ckv_workload *w);

#endif
