/* trace.h - recording what the judge saw and what was needed afterwards, to
 * train the mlp judge (lifecycle/mlp.h, tools/ckv-train-mlp.c).
 *
 * Every sampled round of every session appends one line per live token: its
 * feature vector (ckv_judge_features, exactly what the judge scores in that
 * round) and its attention ring (the relative attention of this round and the
 * seven before it), from which "was this token needed at round q" can be
 * derived offline for any threshold.  Because the ring spans
 * CKV_ATTN_HISTORY rounds, sampling every N <= CKV_ATTN_HISTORY rounds still
 * gives every round's attention: only the feature rows are sampled.
 * No token ids, no text, no K/V: a trace holds statistics only.
 *
 * Format (CSV, version 1), appended to the file:
 *   # commitkv-trace 1 features=12 history=8 every=N pid=P
 *   session,round,pos,state,role,judged,f0,...,f11,ring
 *   <rows>
 * A header pair is written at each open (daemon start, SIGHUP reopen): it
 * starts a new *segment*; session ids are unique within a segment only.
 *   session  the daemon's session id
 *   round    the ReportRound round (features as the judge sees them this round)
 *   pos      session position
 *   state    CKV_STATE_* before this round's judge (the daemon never writes
 *            recycled tokens; see ckv_trace_round_rings for 3)
 *   role     proto Role (0 none, 1 system, 2 user, 3 assistant, 4 tool)
 *   judged   1 if the judge decides this token this round (past the sinks and
 *            the recent window), 0 for protected positions
 *   f0..f11  ckv_judge_features (%.6g); f2 is this round's relative attention
 *   ring     16 hex digits: the 8 one-byte log codes (tokens.h) of rounds
 *            round-7 .. round, oldest first; relative attention =
 *            exp2(code / 32) - 1; rounds before 1 are 00.
 * Cost: one line (~110 bytes) per live token per sampled round; bounded by
 * `every` and by max_bytes (recording stops at the first sampled round past it). */
#ifndef CKV_LIFECYCLE_TRACE_H
#define CKV_LIFECYCLE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/judge.h"
#include "lifecycle/tokens.h"

#define CKV_TRACE_VERSION 1

typedef struct ckv_trace ckv_trace;

/* Opens (creates, mode 0640, or appends to) the trace file at `path` and
 * writes a segment header.  every: record rounds with round % every == 0,
 * 1..CKV_ATTN_HISTORY (beyond that the rings no longer cover the rounds in
 * between).  max_bytes: stop recording once the file grew by this much in
 * this segment (0 = no limit).  CKV_OK; CKV_ERR_INVALID (err filled) for
 * a bad `every`; -errno when the file cannot be opened or written. */
int ckv_trace_open(const char *path, uint32_t every, uint64_t max_bytes, ckv_trace **ret, char *err,
                   size_t errlen);

/* Records round `round` of session `session_id` if the round is sampled:
 * one line per non-recycled token of t, features computed with p.  Call it
 * after the round's attention is recorded (ckv_srv_session_report_round) and
 * before the judge runs, so the features are those the judge decides on.
 * Thread-safe (one lock per trace).  Returns CKV_OK (also when the round is
 * not sampled, or recording has stopped at max_bytes); CKV_ERR_LIMIT exactly
 * once, on the round at which max_bytes was reached (log it; later calls are
 * silent no-ops); -errno on a write error (the trace then stops too). */
int ckv_trace_round(ckv_trace *tr, uint64_t session_id, uint32_t round, const ckv_tokens *t,
                    const ckv_judge_params *p);

/* For simulators that know what a recycled token *would* have drawn (the
 * trainer's synthetic stream): like ckv_trace_round, but the ring column comes
 * from `rings` (CKV_ATTN_HISTORY codes per position, indexed like t->attn)
 * and recycled tokens are written too, with state 3 and judged 0, so the
 * trainer sees the future of a token that a recording judge recycled.  A real
 * daemon never has that information and never writes state 3. */
int ckv_trace_round_rings(ckv_trace *tr, uint64_t session_id, uint32_t round, const ckv_tokens *t,
                          const ckv_judge_params *p, const uint8_t *rings);

/* Bytes written in this segment so far. */
uint64_t ckv_trace_bytes(const ckv_trace *tr);

/* Flushes and closes; accepts NULL; returns NULL. */
ckv_trace *ckv_trace_close(ckv_trace *tr);

#endif
