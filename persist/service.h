/* service.h - persist/ as a service of the server loop: set up over the
 * store, start-up (what a crash left), housekeeping (tiers, autosave), the
 * I/O thread's completions of its own jobs, the stop.  The state is
 * persist.h's ckv_persist. */
#ifndef CKV_PERSIST_SERVICE_H
#define CKV_PERSIST_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "persist/persist.h"

/* Starts the I/O thread and sets up the tiers over store st.  CKV_OK, or a
 * status with its text in err. */
int ckv_persist_init(ckv_persist *p, ckv_store *st, const ckv_persist_options *opt, const ckv_persist_hooks *hooks,
                     char *err, size_t errlen);
/* Start-up, before serving: leftovers of a crash (the tiers' files, the
 * autosaves) counted and logged; they stay resumable. */
void ckv_persist_startup(ckv_persist *p);
/* At start, before serving: the warm restart (warm.h ckv_warm_start), then
 * the continuous journal's first checkpoint (warmjournal.h), which replaces
 * the journal just read. */
void ckv_persist_warm_start(ckv_persist *p);
/* At a clean stop, after the drain: the continuous journal's writer
 * stopped (its batch in flight landed), then the journal written for the
 * next daemon (ckv_warm_stop).  Returns the sessions kept. */
size_t ckv_persist_warm_stop(ckv_persist *p);
/* The loop's housekeeping: idle sessions move down, changed ones are autosaved. */
void ckv_persist_scan(ckv_persist *p, uint64_t now_ms);
/* Finished job j of the I/O thread that persist/ made (j->finish set): its
 * completion runs here, on the loop. */
void ckv_persist_job_done(ckv_persist *p, ckv_snapio_job *j);
/* Stops the I/O thread: the job it is on finishes, jobs never collected are
 * destroyed unanswered (what is asked after this runs on the calling thread
 * or not at all). */
void ckv_persist_stop_io(ckv_persist *p);
/* A new conversation of sess's id begins (OpenSession without resume,
 * RestoreSession; a resumed copy that carried none): sess gets a new
 * incarnation, recorded durably before this returns, so no copy of an
 * earlier conversation of the id is ever served for it (and, with the
 * remote tier on, written to the store fence in the background).  CKV_OK, or the
 * error with err (the caller must not answer the open as done). */
typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_tenant ckv_tenant;
int ckv_persist_begin_conversation(ckv_persist *p, ckv_srv_session *sess, char *err, size_t errlen);
/* The conversation of sess ends (DropSession, expiry; before the store
 * drops sess): recorded durably before this returns; its copies are fenced
 * from then on, whether or not their removal succeeds.  With the remote
 * tier on, the store fence is written too (fencejob.h): with done, the
 * caller may wait for it, CKV_FENCE_WAIT (done comes later, once), else
 * CKV_OK.  < 0: not recorded, the error with err (done never called). */
typedef void (*ckv_fence_done_fn)(void *ctx, int status, const char *text);
int ckv_persist_end_conversation(ckv_persist *p, const ckv_srv_session *sess, ckv_fence_done_fn done, void *ctx,
                                 char *err, size_t errlen);
/* What a resume of `id` may take: CKV_OK with *ret the incarnation its copy
 * must hold (0: the conversation was ended: nothing to resume), or -ENOENT
 * when the id was never recorded (any copy, as before the registry). */
int ckv_persist_current_conversation(const ckv_persist *p, const ckv_tenant *t, const char *id, uint64_t *ret);

/* Frees the rest (call after the store dropped every session). */
void ckv_persist_done(ckv_persist *p);

#endif
