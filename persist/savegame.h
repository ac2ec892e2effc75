/* savegame.h - a session saved to a snapshot and one restored from it
 * (SaveSession, RestoreSession, OpenSession with resume), the halves that
 * touch the store: the capture of a session on the loop, charged to its
 * tenant's quota while it waits for the disk, and a snapshot read back
 * rebuilt into a live session with everything that follows (its moves
 * planned, its tier copy and its autosave told).  The I/O between the
 * halves is the snapshot I/O thread's (snapio.h); the request and its reply
 * are the daemon's, which embeds a ckv_savegame at the start of its own job
 * record.  docs/snapshot.md says what a snapshot holds. */
#ifndef CKV_PERSIST_SAVEGAME_H
#define CKV_PERSIST_SAVEGAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"
#include "persist/persist.h"
#include "persist/snapio.h"

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_srv_session ckv_srv_session;

typedef struct ckv_savegame {
  ckv_snapio_job job; /* first: snapio hands back the job */
  ckv_tenant *tenant;
  ckv_persist *persist;            /* whose disk index holds the job's reservation (job.disk_claim) */
  uint64_t charged;                /* bytes of tenant->io_bytes (a save's copy) */
  bool pinned;                     /* a save reading its blocks in place: the tenant's pin is ours */
  char id[CKV_SNAP_ID_MAX + 1];    /* save: the session saved; restore: the session to create */
  /* save */
  bool committed_only;
  uint64_t tokens, copy_us;
  /* restore: what the snapshot must match (empty strings / a zero geometry: not checked) */
  bool resume, check_id, check_rev;
  char model_id[CKV_SNAP_MODEL_MAX + 1], model_revision[CKV_SNAP_MODEL_MAX + 1];
  ckv_geometry geom;
} ckv_savegame;

/* Gives back what g holds (its copy, its quota charge, a disk reservation
 * of a job that never landed); the caller frees the record around it. */
void ckv_savegame_done(ckv_savegame *g);

/* The save's half on the loop: session sess (settled: no move in flight) is
 * captured into g as snapshot `name` (committed_only: its committed tokens
 * only): its columns, header regions and the blocks still being filled are
 * copied, every other block is read in place by the I/O thread while the
 * tenant stays pinned (session_snap.h), so a save of any size costs the
 * loop about the same; the copy is charged to its tenant's quota while it
 * waits for the disk.  CKV_OK; CKV_ERR_BUSY when the tenant's copies waiting for the
 * disk would pass its quota; CKV_ERR_QUOTA when the file would take the
 * tenant past its quota_disk or max_snapshots (diskuse.h: err names the
 * numbers; nothing is written); or the capture's error; err says why.  g (zeroed
 * by the caller) is ready for ckv_savegame_submit. */
int ckv_savegame_capture(ckv_persist *p, ckv_srv_session *sess, const char *name, bool committed_only,
                         ckv_savegame *g, char *err, size_t errlen);

/* The restore's request: snapshot `name` of tenant t as session `id`;
 * model_id / model_revision (NULL: not checked) and geom (NULL: not checked)
 * must match it.  resume: an OpenSession with resume (the disk tier's file,
 * the remote tier's copy and the autosave are looked at too), which takes
 * only a crash copy of the conversation recorded as current
 * (incarnations.h): none at all when it was ended; its save game stays
 * resumable, as a new conversation. */
void ckv_savegame_want_restore(ckv_persist *p, ckv_tenant *t, const char *id, const char *name, const char *model_id,
                               const char *model_revision, const ckv_geometry *geom, bool resume, ckv_savegame *g);

/* What every job sends along: the state directory, the tenant, the remote
 * store, the most the store may send (max_bytes). */
void ckv_savegame_address(ckv_persist *p, ckv_tenant *t, uint64_t max_bytes, ckv_savegame *g);

/* The restore's half on the loop, once g's file was read and validated:
 * checks it is the snapshot asked for (tenant, model, geometry; a resume:
 * this session and its current conversation), rebuilds the session in
 * fresh blocks as session g->id read by client `owner` (a restore of a
 * named snapshot begins a new conversation, recorded durably first),
 * plans the moves it waited for when it was saved, and tells the disk tier
 * (its copy goes) and autosave.  CKV_OK with *ret; or the failure, err
 * saying why (nothing joined the store). */
int ckv_savegame_apply_restore(ckv_persist *p, ckv_savegame *g, uint64_t owner, ckv_srv_session **ret, char *err,
                               size_t errlen);

#endif
