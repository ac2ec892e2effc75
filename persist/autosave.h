/* autosave.h - crash copies of live sessions ([daemon] autosave).
 *
 * A kill -9 or a crash loses every session that lived only in memory (a warm
 * restart keeps them only across a clean stop, warm.h).  With autosave on,
 * the loop's housekeeping saves, up to CKV_AUTOSAVE_INFLIGHT at a time, each live session
 * that changed since its last autosave (a round, tokens, a published move)
 * and whose last autosave is at least autosave_ms old, as a full snapshot in
 * state_dir/autosave/TENANT/ID.ckvsnap (written by the snapshot I/O thread:
 * temporary file, fsync, rename, directory fsync; never listed, never sent to
 * the remote store).  A session goes only when it is quiet: resident, no
 * compressor job in flight, not quarantined, and no tokens appended since its
 * last ReportRound (their K/V may still be on their way from the worker).
 *
 * After a restart, OpenSession with resume of an id that no live session
 * holds reads the session's autosave together with its snapshot and takes
 * the newer (snapio.h CKV_SNAPIO_AUTOSAVE); the disk tier's copy, when there
 * is one, comes first as before.  What the session did after its autosave is
 * lost: the reply's token count and round counter say where it stands.
 *
 * An autosave belongs to one incarnation of a session: OpenSession without
 * resume (a new session of that id), DropSession and the expiry of a
 * detached session remove it, so a deliberately ended session never comes
 * back from it. */
#ifndef CKV_PERSIST_AUTOSAVE_H
#define CKV_PERSIST_AUTOSAVE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ckv_persist ckv_persist;
typedef struct ckv_tenant ckv_tenant;

/* Autosaves copied and waiting for the I/O thread at most (each copy is
 * charged to its tenant's quota until it is written). */
#define CKV_AUTOSAVE_INFLIGHT 16u

/* From the housekeeping: starts the autosaves that are due, longest waiting
 * first, up to CKV_AUTOSAVE_INFLIGHT in flight, and measures the lag
 * (ckv_persist_counters.autosave_lag_ms). */
void ckv_autosave_scan(ckv_persist *p, uint64_t now_ms);
/* Removes the autosave of tenant/id (on the I/O thread, behind any write of it). */
void ckv_autosave_forget(ckv_persist *p, const ckv_tenant *tenant, const char *id);
/* A session just created (OpenSession without resume, a restore): from its
 * autosave (a resume after a crash), that autosave is its current one;
 * otherwise an autosave of an earlier session of the id is removed. */
typedef struct ckv_srv_session ckv_srv_session;
void ckv_autosave_session_new(ckv_persist *p, ckv_srv_session *sess, bool from_autosave);
/* At start: leftover temporary files removed, the autosaves found logged (`autosave-found`). */
void ckv_autosave_startup(ckv_persist *p);

#endif
