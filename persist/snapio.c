/* snapio.c - the snapshot I/O thread (see snapio.h): a FIFO of jobs under
 * one mutex, a condition variable that wakes the thread, and an eventfd
 * that wakes the server loop when a job is done. */
#include "persist/snapio.h"


#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "persist/fence.h"
#include "persist/remote.h"
#include "persist/remote_snap.h"
#include "persist/snapdir.h"

struct ckv_snapio {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake; /* a job arrived, or stop */
  pthread_cond_t idle; /* a job finished */
  ckv_snapio_job *head, *tail; /* waiting */
  ckv_snapio_job *done_head, *done_tail;
  unsigned depth, busy; /* busy: waiting + running */
  bool stop;
  int efd;
};

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A resume's copy of another conversation of the id (an ended or replaced
 * one whose removal a crash or an unreachable store cut short): passed over,
 * as if it were not there.  True when snap was such a copy (then freed). */
static bool fenced(ckv_snapio_job *j, ckv_snap *snap) {
  if (!j->fence_crash_copies || (j->want_incarnation && snap->incarnation == j->want_incarnation)) return false;
  ckv_log(CKV_LOG_WARNING, "copy-fenced", j->tenant, j->name,
          "a crash copy of session '%s' holds incarnation %016llx, %s (a conversation whose copies' removal was "
          "cut short): never served",
          j->name, (unsigned long long)snap->incarnation,
          j->want_incarnation ? "not the current one" : "and the id's conversation was ended");
  ckv_snap_done(snap);
  j->fenced++;
  return true;
}

/* FENCE: the id's store fence, and an ended conversation's tier key with it. */
static void run_fence(ckv_snapio_job *j) {
  char key[CKV_REMOTE_KEY_MAX];
  bool superseded = false;
  j->status = CKV_OK;
  if (j->fence_delete && ckv_remote_tier_key(CKV_SNAP_VERSION, j->tenant, j->model_id, j->model_revision, j->name, key,
                                             sizeof key) < 0)
    j->fence_delete = 0; /* names no key holds: nothing to delete */
  j->status = ckv_fence_write(j->remote, j->tenant, j->name, j->fence_incarnation, j->fence_decided_ms,
                              j->fence_delete ? key : NULL, &superseded, j->err, sizeof j->err);
  j->fence_superseded = superseded;
}

/* The store's half of the rule (fence.h): a remote tier value the id's
 * store fence does not admit is passed over like one the local record
 * fences.  True when snap was such a copy (then freed). */
static bool store_fenced(ckv_snapio_job *j, const ckv_store_fence *sf, ckv_snap *snap) {
  const char *why = NULL;
  if (ckv_fence_admits(sf, snap->incarnation, &why)) return false;
  ckv_log(CKV_LOG_WARNING, "copy-fenced", j->tenant, j->name,
          "the remote tier's copy of session '%s' holds incarnation %016llx and %s%s%s (store fence %016llx): never "
          "served",
          j->name, (unsigned long long)snap->incarnation, why, sf->state == CKV_FENCE_REFUSED ? ": " : "",
          sf->state == CKV_FENCE_REFUSED ? sf->why : "", (unsigned long long)sf->incarnation);
  ckv_snap_done(snap);
  j->fenced++;
  return true;
}

/* PUSH, and LOAD / REMOVE of the remote tier's copy (remote_snap.h). */
static void run_remote_tier(ckv_snapio_job *j) {
  if (!j->remote) {
    j->status = CKV_ERR_INVALID;
    snprintf(j->err, sizeof j->err, "the daemon has no remote store");
    return;
  }
  switch (j->kind) {
    case CKV_SNAPIO_PUSH:
      j->status = ckv_remote_tier_push(j->remote, j->state_dir, j->tenant, j->model_id, j->model_revision, j->name,
                                       &j->bytes, j->err, sizeof j->err);
      return;
    case CKV_SNAPIO_LOAD:
      j->origin = CKV_SNAP_FROM_REMOTE;
      j->from_tier = 2;
      j->status = ckv_remote_tier_load(j->remote, j->tenant, j->model_id, j->model_revision, j->name, j->max_bytes,
                                       &j->snap, /* ret_fence= */ NULL, j->err, sizeof j->err);
      return;
    case CKV_SNAPIO_FENCE: run_fence(j); return;
    case CKV_SNAPIO_REMOVE:
      j->status = ckv_remote_tier_drop(j->remote, j->tenant, j->model_id, j->model_revision, j->name, j->err,
                                       sizeof j->err);
      return;
    case CKV_SNAPIO_SAVE: break;
  }
  j->status = CKV_ERR_INVALID;
  snprintf(j->err, sizeof j->err, "no such remote tier job");
}

/* A resume with no tier file here: the session may sit in the remote tier
 * (this daemon, or another of the fleet, moved it there).  Whether that
 * decided the job (found, or refused: never an older snapshot in its
 * place); false: not there, or the store does not answer (logged), and the
 * snapshot is read as for any resume. */
static bool resume_from_remote_tier(ckv_snapio_job *j) {
  char err[sizeof j->err];
  ckv_store_fence sf;
  int r = ckv_remote_tier_load(j->remote, j->tenant, j->model_id, j->model_revision, j->name, j->max_bytes, &j->snap,
                               &sf, err, sizeof err);
  if (r == -ENOENT) return false;
  if (r == CKV_OK && (fenced(j, &j->snap) || store_fenced(j, &sf, &j->snap))) return false;
  if (r == -EIO) {
    ckv_log(CKV_LOG_WARNING, "remote-unavailable", j->tenant, j->name,
            "%s; a resume cannot see the remote tier, so the session's snapshot is read instead, if there is one",
            err);
    return false;
  }
  j->status = r;
  snprintf(j->err, sizeof j->err, "%s", r < 0 ? err : "");
  j->origin = CKV_SNAP_FROM_REMOTE;
  j->from_tier = 2;
  return true;
}

/* A resume that found no tier copy read the snapshot (or found none): the
 * session's autosave replaces it when that is newer.  An autosave that is
 * there but refused (damaged, cut) is said: the snapshot stands when there
 * is one, else the resume fails with the autosave's error. */
static void prefer_autosave(ckv_snapio_job *j) {
  char path[4096 + 512];
  if (ckv_snapdir_area_file(j->state_dir, CKV_SNAPDIR_AUTOSAVE, j->tenant, j->name, path, sizeof path) != CKV_OK) return;
  ckv_snap a;
  char err[sizeof j->err];
  int r = ckv_snapdir_read(path, &a, err, sizeof err);
  if (r == -ENOENT || (r == CKV_OK && fenced(j, &a))) return;
  if (r < 0) {
    j->autosave_status = r;
    snprintf(j->autosave_err, sizeof j->autosave_err, "%s", err);
    if (j->status == -ENOENT) {
      j->status = r;
      snprintf(j->err, sizeof j->err, "its autosave is refused: %.280s", err);
    }
    return;
  }
  if (j->status == CKV_OK && a.saved_at_ms <= j->snap.saved_at_ms) { /* the snapshot is the newer copy */
    ckv_snap_done(&a);
    return;
  }
  if (j->status == CKV_OK) ckv_snap_done(&j->snap);
  j->snap = a;
  j->status = CKV_OK;
  j->err[0] = 0;
  j->origin = CKV_SNAP_FROM_LOCAL;
  j->from_autosave = 1;
}

void ckv_snapio_run(ckv_snapio_job *j) {
  uint64_t t0 = now_us();
  j->err[0] = 0;
  j->bytes = 0;
  j->from_tier = 0;
  const char *area = j->area == CKV_SNAPIO_SNAPSHOT   ? CKV_SNAPDIR_SNAPSHOTS
                     : j->area == CKV_SNAPIO_AUTOSAVE ? CKV_SNAPDIR_AUTOSAVE
                                                      : CKV_SNAPDIR_TIER;
  j->from_autosave = 0;
  j->fenced = 0;
  j->autosave_status = CKV_OK;
  j->autosave_err[0] = 0;
  if (j->kind == CKV_SNAPIO_PUSH || j->area == CKV_SNAPIO_TIER_REMOTE) {
    run_remote_tier(j);
    j->io_us = now_us() - t0;
    return;
  }
  if (j->kind == CKV_SNAPIO_REMOVE) {
    char path[4096 + 512];
    j->status = ckv_snapdir_area_file(j->state_dir, area, j->tenant, j->name, path, sizeof path);
    if (j->status == CKV_OK && unlink(path) < 0 && errno != ENOENT) {
      j->status = -errno;
      snprintf(j->err, sizeof j->err, "cannot remove %.200s: %s", path, strerror(errno));
    }
    j->io_us = now_us() - t0;
    return;
  }
  if (j->kind == CKV_SNAPIO_LOAD && j->area != CKV_SNAPIO_SNAPSHOT && j->area != CKV_SNAPIO_AUTOSAVE) {
    /* the disk tier's copy is the newest of the session when there is one:
     * a request on the session brings it back and removes the file */
    char path[4096 + 512];
    j->origin = CKV_SNAP_FROM_LOCAL;
    j->status = ckv_snapdir_area_file(j->state_dir, CKV_SNAPDIR_TIER, j->tenant, j->name, path, sizeof path);
    if (j->status < 0)
      snprintf(j->err, sizeof j->err, "the daemon has no state directory for the disk tier");
    else
      j->status = ckv_snapdir_read(path, &j->snap, j->err, sizeof j->err);
    if (j->status == CKV_OK && j->area == CKV_SNAPIO_TIER_FIRST && fenced(j, &j->snap)) j->status = -ENOENT;
    j->from_tier = j->status != -ENOENT;
    if (j->area == CKV_SNAPIO_TIER_FIRST && j->status == -ENOENT && j->remote && j->look_remote_tier &&
        resume_from_remote_tier(j)) {
      j->io_us = now_us() - t0;
      return;
    }
    if (j->area == CKV_SNAPIO_TIER || j->status != -ENOENT) {
      j->io_us = now_us() - t0;
      return;
    }
    j->err[0] = 0; /* no tier file: the snapshot, as for any resume */
  }
  if (j->kind == CKV_SNAPIO_SAVE) {
    char dir[4096 + 256];
    j->status = ckv_snapdir_area_dir(j->state_dir, area, j->tenant, /* create= */ 1, dir, sizeof dir, j->err,
                                     sizeof j->err);
    if (j->status == CKV_OK) j->status = ckv_snap_write(dir, j->name, &j->snap, &j->bytes, j->err, sizeof j->err);
    j->remote_status = CKV_OK;
    j->remote_err[0] = 0;
    if (j->status == CKV_OK && j->remote && j->area == CKV_SNAPIO_SNAPSHOT)
      j->remote_status = ckv_remote_snap_push(j->remote, j->state_dir, j->tenant, j->model_id, j->model_revision,
                                              j->name, j->remote_err, sizeof j->remote_err);
  } else if (j->remote) {
    ckv_snap_origin origin = CKV_SNAP_FROM_LOCAL;
    j->status = ckv_remote_snap_load(j->remote, j->state_dir, j->tenant, j->model_id, j->model_revision, j->name,
                                     j->max_bytes, &j->snap, &origin, j->err, sizeof j->err);
    j->origin = (int)origin;
  } else {
    char path[4096 + 512];
    j->origin = CKV_SNAP_FROM_LOCAL;
    j->status = ckv_snapdir_file(j->state_dir, j->tenant, j->name, path, sizeof path);
    if (j->status < 0)
      snprintf(j->err, sizeof j->err, "the daemon has no state directory for snapshots");
    else
      j->status = ckv_snapdir_read(path, &j->snap, j->err, sizeof j->err);
  }
  if (j->kind == CKV_SNAPIO_LOAD && j->area == CKV_SNAPIO_TIER_FIRST) {
    prefer_autosave(j);
  }
  j->io_us = now_us() - t0;
}

static void *io_main(void *arg) {
  ckv_snapio *io = arg;
  pthread_mutex_lock(&io->lock);
  for (;;) {
    while (!io->head && !io->stop) pthread_cond_wait(&io->wake, &io->lock);
    if (io->stop) break; /* what still waits is destroyed unrun by free */
    ckv_snapio_job *j = io->head;
    io->head = j->next;
    if (!io->head) io->tail = NULL;
    pthread_mutex_unlock(&io->lock);
    ckv_snapio_run(j); /* the disk: no lock held */
    pthread_mutex_lock(&io->lock);
    j->next = NULL;
    if (io->done_tail)
      io->done_tail->next = j;
    else
      io->done_head = j;
    io->done_tail = j;
    io->busy--;
    pthread_cond_broadcast(&io->idle);
    uint64_t one = 1;
    (void)!write(io->efd, &one, sizeof one);
  }
  pthread_mutex_unlock(&io->lock);
  return NULL;
}

int ckv_snapio_new(unsigned depth, ckv_snapio **ret) {
  ckv_snapio *io = calloc(1, sizeof(*io));
  if (!io) return -ENOMEM;
  io->depth = depth ? depth : 1;
  io->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (io->efd < 0) {
    int e = errno;
    free(io);
    return -e;
  }
  pthread_mutex_init(&io->lock, NULL);
  pthread_cond_init(&io->wake, NULL);
  pthread_cond_init(&io->idle, NULL);
  int e = pthread_create(&io->thread, NULL, io_main, io);
  if (e) {
    close(io->efd);
    pthread_mutex_destroy(&io->lock);
    pthread_cond_destroy(&io->wake);
    pthread_cond_destroy(&io->idle);
    free(io);
    return -e;
  }
  *ret = io;
  return CKV_OK;
}

static void destroy_list(ckv_snapio_job *j) {
  while (j) {
    ckv_snapio_job *next = j->next;
    j->destroy(j);
    j = next;
  }
}

ckv_snapio *ckv_snapio_free(ckv_snapio *io) {
  if (!io) return NULL;
  pthread_mutex_lock(&io->lock);
  io->stop = true;
  pthread_cond_broadcast(&io->wake);
  pthread_mutex_unlock(&io->lock);
  pthread_join(io->thread, NULL);
  destroy_list(io->head);
  destroy_list(io->done_head);
  close(io->efd);
  pthread_mutex_destroy(&io->lock);
  pthread_cond_destroy(&io->wake);
  pthread_cond_destroy(&io->idle);
  free(io);
  return NULL;
}

int ckv_snapio_submit(ckv_snapio *io, ckv_snapio_job *j) {
  pthread_mutex_lock(&io->lock);
  if (io->busy >= io->depth) {
    pthread_mutex_unlock(&io->lock);
    return CKV_ERR_BUSY;
  }
  j->next = NULL;
  if (io->tail)
    io->tail->next = j;
  else
    io->head = j;
  io->tail = j;
  io->busy++;
  pthread_cond_signal(&io->wake);
  pthread_mutex_unlock(&io->lock);
  return CKV_OK;
}

int ckv_snapio_fd(const ckv_snapio *io) { return io->efd; }

ckv_snapio_job *ckv_snapio_collect(ckv_snapio *io) {
  uint64_t v;
  (void)!read(io->efd, &v, sizeof v); /* reset the wakeup; the list below is what counts */
  pthread_mutex_lock(&io->lock);
  ckv_snapio_job *j = io->done_head;
  io->done_head = io->done_tail = NULL;
  pthread_mutex_unlock(&io->lock);
  return j;
}

void ckv_snapio_wait_idle(ckv_snapio *io) {
  pthread_mutex_lock(&io->lock);
  while (io->busy) pthread_cond_wait(&io->idle, &io->lock);
  pthread_mutex_unlock(&io->lock);
}

unsigned ckv_snapio_busy(ckv_snapio *io) {
  pthread_mutex_lock(&io->lock);
  unsigned n = io->busy;
  pthread_mutex_unlock(&io->lock);
  return n;
}
