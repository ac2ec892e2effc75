/* snapio.h - snapshot file I/O off the server loop: one I/O thread.
 *
 * The server loop never waits for a disk.  A SaveSession captures the
 * session on the loop (ckv_session_snap_capture_pinned: its columns and
 * header regions; the full blocks are read in place by this thread, the
 * tenant pinned) and hands the capture to this thread, which creates the tenant's snapshot
 * directory and writes the file (temporary file, fsync, rename, directory
 * fsync: ckv_snap_write).  A RestoreSession (or an OpenSession with resume
 * of a snapshot-only id) has the thread read and validate the file
 * (ckv_snap_read); the loop applies it to the arena afterwards.  Finished
 * jobs come back through an eventfd the loop polls, in submission order
 * (one thread: two saves of one name land in the order they were asked for).
 *
 * A job is owned by the thread from submit until collect; the thread touches
 * nothing but the job.  The queue is bounded: submit refuses with
 * CKV_ERR_BUSY when `depth` jobs wait or run. */
#ifndef CKV_PERSIST_SNAPIO_H
#define CKV_PERSIST_SNAPIO_H

#include <stddef.h>
#include <stdint.h>

#include "persist/diskuse.h"
#include "persist/snapshot.h"

typedef struct ckv_snapio ckv_snapio;

/* Saves and reads waiting for the I/O thread, all tenants (the daemon's queue). */
#define CKV_SNAPIO_DEPTH 64u

typedef enum ckv_snapio_kind {
  CKV_SNAPIO_SAVE, /* write `snap` as state_dir/snapshots/tenant/name.ckvsnap */
  CKV_SNAPIO_LOAD, /* read and validate that file into `snap` */
  CKV_SNAPIO_REMOVE, /* unlink that file (the disk tier's files, once their session is back or gone) */
  CKV_SNAPIO_PUSH,   /* the remote tier: store the tier file's bytes under the session's tier key (the file stays) */
  CKV_SNAPIO_FENCE,  /* the remote tier: write the id's store fence (fence.h), and with fence_incarnation 0 delete
                        the session's tier key in the same transaction (fencejob.h) */
} ckv_snapio_kind;

/* ckv_snapio_job.area: which file of the name the job means. */
typedef enum ckv_snapio_area {
  CKV_SNAPIO_SNAPSHOT,   /* state_dir/snapshots/tenant/name.ckvsnap (and the remote store) */
  CKV_SNAPIO_TIER,       /* state_dir/tier/tenant/name.ckvsnap only (the disk tier, tier.h) */
  CKV_SNAPIO_TIER_FIRST, /* LOAD: the tier file when there is one, else the remote tier's copy, else the
                            snapshot (a resume) */
  CKV_SNAPIO_TIER_REMOTE, /* LOAD / REMOVE: the remote tier's copy of the session (remote_snap.h), not a file */
  CKV_SNAPIO_AUTOSAVE,    /* SAVE / REMOVE: state_dir/autosave/tenant/name.ckvsnap (autosave.h); a resume
                             (TIER_FIRST) reads it too and takes it when it is newer than the snapshot */
} ckv_snapio_area;

typedef struct ckv_snapio_job {
  struct ckv_snapio_job *next; /* queue link (the module's while queued) */
  ckv_snapio_kind kind;
  ckv_snapio_area area;
  /* what to do (the caller's, filled before submit) */
  char state_dir[4096];
  char tenant[CKV_SNAP_TENANT_MAX + 1];
  char name[CKV_SNAP_ID_MAX + 1];
  ckv_snap snap; /* SAVE: the captured session (owned); LOAD: what was read (owned when status is CKV_OK) */
  /* the remote store (NULL: none; remote_snap.h): a SAVE pushes the file it
   * wrote, a LOAD reads both copies and takes the newer; used only by the
   * I/O thread while the job is queued */
  struct ckv_remote *remote;
  char model_id[CKV_SNAP_MODEL_MAX + 1], model_revision[CKV_SNAP_MODEL_MAX + 1]; /* the store's key */
  uint64_t max_bytes; /* LOAD: the most the store may send */
  int look_remote_tier; /* LOAD TIER_FIRST: the remote tier is on, look there after the tier file */
  /* LOAD TIER_FIRST (a resume), when fence_crash_copies: the only
   * conversation a crash copy (the disk or remote tier's, the autosave) may
   * hold (incarnations.h; 0: none, the id was ended); one of another is
   * passed over as if it were not there (counted in fenced).  Save games
   * (the snapshot named after the session) are the user's and never fenced. */
  int fence_crash_copies;
  uint64_t want_incarnation;
  unsigned fenced;
  /* FENCE: the record to write (fence.h); fence_delete: delete the tier key
   * with it; fence_superseded: the store held a newer decision */
  uint64_t fence_incarnation, fence_decided_ms;
  int fence_delete, fence_superseded;
  /* what came of it (the thread's until collected) */
  int status;     /* CKV_OK, a ckv_status or -errno (ckv_snap_write / ckv_snap_read / ckv_snapdir_dir) */
  char err[320];  /* why, when status < 0 */
  uint64_t bytes; /* SAVE: the file's size; PUSH: the bytes stored */
  uint64_t io_us; /* time the I/O took on the thread */
  int remote_status;     /* SAVE: CKV_OK, or why the push failed (the local file is written) */
  char remote_err[320];  /* why, when remote_status < 0 */
  int origin;            /* LOAD: ckv_snap_origin, the copy read */
  int from_tier;         /* LOAD: the copy read was the disk tier's (1) or the remote tier's (2) */
  int from_autosave;     /* LOAD TIER_FIRST: the copy read was the session's autosave (newer than its snapshot) */
  int autosave_status;   /* LOAD TIER_FIRST: why its autosave was not taken when it is there but refused */
  char autosave_err[320];
  /* SAVE: what diskuse.h reserved for the file against its tenant's
   * quota_disk / max_snapshots; given back when the job lands
   * (ckv_persist_job_landed), the loop's alone. */
  ckv_diskuse_claim disk_claim;
  /* Called on the loop instead of the request handlers' completion when set
   * (the disk tier's jobs); it owns the job from then on. */
  void (*finish)(void *server, struct ckv_snapio_job *j);
  /* Frees the whole job (it may be embedded in a larger struct of the
   * server's); called by ckv_snapio_free for jobs never collected. */
  void (*destroy)(struct ckv_snapio_job *j);
} ckv_snapio_job;

/* Starts the I/O thread with room for `depth` jobs.  CKV_OK, -ENOMEM or
 * pthread/eventfd's -errno. */
int ckv_snapio_new(unsigned depth, ckv_snapio **ret);
/* Finishes the job running now, then stops the thread; jobs still queued
 * and finished jobs not collected are destroyed unrun / unanswered.
 * Accepts NULL, returns NULL. */
ckv_snapio *ckv_snapio_free(ckv_snapio *io);

/* Queues j (ownership passes to the module until collected).  CKV_OK or
 * CKV_ERR_BUSY (the queue is full: j is not taken). */
int ckv_snapio_submit(ckv_snapio *io, ckv_snapio_job *j);
/* Runs j on the calling thread (callers with no loop to keep free: the
 * request fuzzer, tools). */
void ckv_snapio_run(ckv_snapio_job *j);
/* The eventfd that becomes readable when finished jobs wait. */
int ckv_snapio_fd(const ckv_snapio *io);
/* Takes every finished job in completion order, linked through ->next
 * (NULL when there is none). */
ckv_snapio_job *ckv_snapio_collect(ckv_snapio *io);
/* Blocks until no job waits or runs (the daemon's drain at shutdown). */
void ckv_snapio_wait_idle(ckv_snapio *io);
/* Jobs waiting or running now. */
unsigned ckv_snapio_busy(ckv_snapio *io);

#endif
