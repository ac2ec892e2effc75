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

#include "lifecycle/judge_params.h"
#include "lifecycle/tokens.h"

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
 * recycled for silence (unless fact_cold_rounds sends it cold), and stored
 * in the best-protected committed format. */
int ckv_judge_lasting_fact(const ckv_tokens *t, size_t pos, const ckv_judge_params *p);
/* A lasting fact, or one demoted to the cold tier (committed or recycled, a
 * fact by the same marks): the tokens stored in the facts' format. */
int ckv_judge_fact_format(const ckv_tokens *t, size_t pos, const ckv_judge_params *p);

/* Runs the judge for `round` over every token: updates t->state and
 * t->last_transition and appends each change to `out`.  Returns CKV_OK or
 * -ENOMEM (states may then be partly updated; `out` lists exactly what was). */
int ckv_judge_run(ckv_tokens *t, uint32_t round, const ckv_judge_params *p, ckv_transition_list *out);

/* The feature vector both judges see for one token (documented in judge.c);
 * exposed for the mlp judge, its trainer and trace recording. */
void ckv_judge_features(const ckv_tokens *t, size_t pos, uint32_t round, const ckv_judge_params *p,
                        float ret[CKV_JUDGE_FEATURES]);

#endif
