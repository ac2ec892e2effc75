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
/* The loop's housekeeping: idle sessions move down, changed ones are autosaved. */
void ckv_persist_scan(ckv_persist *p, uint64_t now_ms);
/* Finished job j of the I/O thread that persist/ made (j->finish set): its
 * completion runs here, on the loop. */
void ckv_persist_job_done(ckv_persist *p, ckv_snapio_job *j);
/* Stops the I/O thread: the job it is on finishes, jobs never collected are
 * destroyed unanswered (what is asked after this runs on the calling thread
 * or not at all). */
void ckv_persist_stop_io(ckv_persist *p);
/* Frees the rest (call after the store dropped every session). */
void ckv_persist_done(ckv_persist *p);

#endif
