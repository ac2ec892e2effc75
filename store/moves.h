/* moves.h - from decisions to bytes: after the judge changes tokens'
 * logical states, the lifecycle plans the moves (allocating destination
 * slots), hands them to the compressor, and publishes the results.
 *
 * Copy, then publish, then free (DESIGN.md §4 invariant 1):
 * - plan (server thread): destination slots are reserved in staged/committed
 *   blocks, the tokens are marked pending, a job is queued;
 * - the compressor writes the destination payloads (never the sources);
 * - publish (server thread, on completion): destination valid bits set,
 *   source valid bits cleared, the token's location updated, the view epoch
 *   bumped; emptied source blocks are retired and freed only after the reader
 *   acknowledged that epoch (session.c).
 * Recycling a token clears its valid bit at once (its memory is still only
 * freed through retire + ack).
 *
 * Committed destinations are filled one 32-token key chunk at a time; tokens
 * wait (logically committed, physically staged) until a chunk is full, or
 * until a flush (pressure, save, close) closes a partial chunk. */
#ifndef CKV_STORE_MOVES_H
#define CKV_STORE_MOVES_H

#include <stdbool.h>
#include <stdint.h>

#include "lifecycle/judge.h"

typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_compressor ckv_compressor;
typedef struct ckv_job ckv_job;

/* Runs the judge for `round` and plans what it decided.  Transitions are
 * appended to `out`.  Returns CKV_OK or -ENOMEM. */
int ckv_moves_round(ckv_srv_session *s, ckv_compressor *c, uint32_t round, ckv_transition_list *out);

/* Plans the physical moves the logical states call for (recycles at once).
 * flush: close partial committed chunks too.  Quota or queue limits stop the
 * planning early; the rest is planned on a later call.  Returns CKV_OK or a
 * negative status on allocation failure. */
int ckv_moves_plan(ckv_srv_session *s, ckv_compressor *c, bool flush);

/* Moves one plan call makes at most in each of its two phases (draft ->
 * staged, staged -> committed; a session may set its own,
 * ckv_srv_session.plan_max_moves): a round in which most of a long session
 * changes state plans its moves over several calls, one job each, instead of
 * spending 100-200 ms of the server thread on one.  Publishing a job plans
 * the next part at once, so the compressor keeps working and the last tokens
 * are published when the compressor is through, as without the bound.  Past
 * the bound a call still fills the blocks it opened (see moves.c), by at
 * most one block per format. */
#define CKV_MOVES_PLAN_MAX_MOVES 32768u

/* Consecutive failed jobs after which a session is quarantined even when the
 * failure itself looked transient (no memory, device busy). */
#define CKV_LIFECYCLE_MAX_JOB_FAILURES 3

/* Call when a job of s failed with `status`, before publishing it.  A failure
 * on bytes the daemon did not write (a worker scribbled over a header, mask or
 * seal word: CKV_ERR_CORRUPT, _FORMAT, _STATE, ...), or the
 * CKV_LIFECYCLE_MAX_JOB_FAILURES-th failure in a row, quarantines the
 * session: no more moves are planned (never an endless retry), and
 * s->quarantine_reason says why.  Returns true when this call quarantined it
 * (the caller logs that once). */
bool ckv_moves_job_failed(ckv_srv_session *s, int status);

/* Publishes a finished job of session s (see above) and plans what waited
 * for it.  Frees the job. */
void ckv_moves_publish(ckv_srv_session *s, ckv_compressor *c, ckv_job *j);

/* Tokens whose bytes do not yet match their logical state (moves in flight or
 * waiting for a full committed chunk). */
uint64_t ckv_moves_pending(const ckv_srv_session *s);

/* Quota pressure, step 1 and 2: escalates every unprotected token of state
 * `from` (draft or staged; draft tokens only once reported, so a worker never
 * loses a slot it may still be writing) one state up and plans the moves with
 * partial committed chunks closed.  The caller then waits for the moves
 * (ckv_server_settle_session) and frees what they release.  Appends the
 * transitions to `out`; returns the number of tokens escalated or -ENOMEM. */
long ckv_moves_escalate(ckv_srv_session *s, ckv_compressor *c, int from, ckv_transition_list *out);

/* Quota pressure, last step: makes at least `need` bytes of room in s's tenant by
 * escalating s's lowest-value unprotected tokens (draft -> staged ->
 * committed, then recycling), executing the moves synchronously and freeing
 * what they release at once.  Only call for a session whose reader is the
 * requester (the reply tells it about the new epoch) or that is detached.
 * Returns CKV_OK when the room exists, CKV_ERR_QUOTA when nothing more can
 * be reclaimed.  *ret_recycled receives the number of tokens recycled. */
int ckv_moves_reclaim(ckv_srv_session *s, ckv_compressor *c, uint64_t need, ckv_transition_list *out,
                          uint64_t *ret_recycled);

#endif
