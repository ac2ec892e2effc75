/* judge_scan.h - the rule judge's vector pre-scan (judge.c): which tokens
 * of a span can change state this round.
 *
 * Most tokens of a long session change nothing in a round: recycled ones
 * never do; a committed one only when it goes idle without being a lasting
 * fact (or, with fact_cold_rounds, a fact committed that long ago), or when it is worker-scored filler past filler_recycle_rounds; a
 * staged one only when it goes idle or has been staged for its persistence
 * rounds.  The scan tests exactly those conditions for 8 tokens at a time
 * and lists the rest (every draft token, and the staged and committed ones
 * that may change) for the judge's per-token rules, which decide as
 * before: a token left out is one the rules would leave as it is.
 *
 * Private to lifecycle/. */
#ifndef CKV_LIFECYCLE_JUDGE_SCAN_H
#define CKV_LIFECYCLE_JUDGE_SCAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_judge_scan {
  const uint8_t *state, *role, *tags, *flags;
  const uint16_t *semantic;
  const uint32_t *last_attended, *last_transition;
  uint32_t round;
  uint32_t idle_rounds;
  uint32_t filler_recycle_rounds; /* 0: off */
  uint32_t fact_cold_rounds;      /* a lasting fact committed this long ago may go cold (0: never) */
  uint32_t fact_q;                /* semantic q >= this: a worker-scored lasting fact (65536: none) */
  uint32_t empty_q;               /* semantic q < this: below semantic_threshold */
  uint32_t staged_age;            /* a staged token younger than this (rounds) cannot commit */
} ckv_judge_scan;

/* Scans whole groups of 8 positions from p while p + 8 <= end and at most
 * `max` positions fit in out[] (max >= 8); appends the candidates' positions
 * to out[] in order, sets *n_out to their count and returns where it stopped. */
size_t ckv_judge_scan_avx2(const ckv_judge_scan *s, size_t p, size_t end, uint32_t *out, size_t max, size_t *n_out);

#endif
