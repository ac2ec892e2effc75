/* fencejob.h - the store fence (fence.h) from the server loop: each
 * decision (a conversation begun, replaced or ended) written by the I/O
 * thread, written again until it lands, and a drop's reply held until its
 * write is done or its wait runs out.
 *
 * Only with the remote tier on (tier.h ckv_tier_remote_on): without one no
 * value of a session is ever in the store and nothing is written.
 *
 * A write that fails (the store down or slow) is retried from the loop's
 * housekeeping after 1 s, then 2, 4, ... up to 32 s between tries, until it
 * lands or a newer decision of the same id replaces it; one decision per
 * id waits (a newer one takes its place).  The retries live in memory: a
 * daemon stopped meanwhile forgets them, and its local record
 * (incarnations.h) still fences the copy for itself.  A retry of an ended
 * conversation deletes its tier key again with the record; a retry of a
 * begun one writes the record only (its own value may be in the store by
 * then). */
#ifndef CKV_PERSIST_FENCEJOB_H
#define CKV_PERSIST_FENCEJOB_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_persist ckv_persist;
typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_fences ckv_fences;

/* What ckv_fence_publish returns when `done` will be called. */
#define CKV_FENCE_WAIT 1

/* The end of a waited-for write, on the loop, once: status CKV_OK (written,
 * and an ended conversation's remote copy deleted; text ""), -EIO / another
 * status (not written: text says why, and that it is retried), -ETIMEDOUT
 * (still queued or running when the wait ran out: text says so), or
 * -ECANCELED (the daemon stops: free ctx, answer nobody). */
typedef void (*ckv_fence_done_fn)(void *ctx, int status, const char *text);

/* CKV_OK or -ENOMEM. */
int ckv_fences_new(ckv_fences **ret);
/* Accepts NULL, returns NULL (after the I/O thread stopped). */
ckv_fences *ckv_fences_free(ckv_fences *f);

/* tenant t's id now holds conversation `incarnation` (0: ended), decided
 * now: the write is queued (an ended one deletes the tier key of model_id /
 * model_revision with it).  With done, the caller waits: CKV_FENCE_WAIT,
 * and done comes within twice the store's timeout and half a second, and
 * never later than 4 s (a client's default timeout is 5 s).  CKV_OK: nothing
 * to wait for (no remote tier, or done NULL); done is never called then.
 * A queue that is full counts as a failed try (retried). */
int ckv_fence_publish(ckv_persist *p, const ckv_tenant *t, const char *id, const char *model_id,
                      const char *model_revision, uint64_t incarnation, ckv_fence_done_fn done, void *ctx);

/* Housekeeping: retries that are due, waits that ran out. */
void ckv_fence_scan(ckv_persist *p, uint64_t now_ms);

/* Decisions whose write has not landed yet. */
size_t ckv_fence_pending(const ckv_persist *p);

#endif
