/* autosave.c - crash copies of live sessions (see autosave.h).  Runs on the
 * server loop; the I/O thread only ever sees the job. */
#include "persist/autosave.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "persist/diskjob.h"
#include "persist/diskuse.h"
#include "persist/persist.h"
#include "persist/session_snap.h"
#include "persist/snapdir.h"
#include "persist/snapio.h"
#include "persist/tier.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

typedef struct autosave_job {
  ckv_snapio_job job; /* first: snapio hands back the job */
  ckv_tenant *tenant;
  ckv_persist *persist; /* whose disk index holds job.disk_claim */
  uint64_t charged; /* bytes of tenant->io_bytes (the copy) */
  uint64_t tokens, copy_us;
} autosave_job;

static void job_destroy(ckv_snapio_job *j) {
  autosave_job *q = (autosave_job *)j;
  if (q->tenant) q->tenant->io_bytes -= q->charged;
  if (q->persist) ckv_diskuse_release(q->persist->diskuse, q->job.tenant, &q->job.disk_claim); /* never landed */
  ckv_snap_done(&q->job.snap);
  free(q);
}

static autosave_job *new_job(ckv_persist *p, ckv_snapio_kind kind, const ckv_tenant *tenant, const char *id) {
  autosave_job *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  q->job.kind = kind;
  q->job.area = CKV_SNAPIO_AUTOSAVE;
  q->job.destroy = job_destroy;
  q->persist = p;
  snprintf(q->job.state_dir, sizeof q->job.state_dir, "%s", p->opt.state_dir ? p->opt.state_dir : "");
  snprintf(q->job.tenant, sizeof q->job.tenant, "%s", tenant->name);
  snprintf(q->job.name, sizeof q->job.name, "%s", id);
  return q; /* job.remote stays NULL: an autosave is this node's */
}

/* What a session's autosave captures: its rounds, tokens and epoch (never 0 for a session with tokens). */
static uint64_t mark_of(const ckv_srv_session *sess) {
  return sess->rounds * 0x9E3779B97F4A7C15ull + (uint64_t)sess->tokens.n * 0xC2B2AE3D27D4EB4Full + sess->epoch + 1u;
}

/* Whether sess may be autosaved now: changed, due, and quiet (autosave.h). */
static bool due(const ckv_persist *p, const ckv_srv_session *sess, uint64_t now) {
  if (!sess->tokens.n || sess->quarantined || sess->doomed || sess->jobs_inflight) return false;
  if (ckv_tier_state_of(sess) != CKV_TIER_RESIDENT) return false;
  if (sess->owner && sess->tokens.n != sess->reported_tokens) return false; /* K/V may be on its way */
  if (sess->autosave_mark == mark_of(sess)) return false;
  return !sess->autosave_ms || now - sess->autosave_ms >= p->opt.autosave_ms;
}

static void save_finished(void *ctx, ckv_snapio_job *j) {
  ckv_persist *p = ctx;
  autosave_job *q = (autosave_job *)j;
  p->autosave_inflight--;
  if (j->status < 0) {
    p->counters.autosave_errors++;
    ckv_log(CKV_LOG_ERROR, "autosave-failed", j->tenant, j->name, "autosave not written: %s (%s); the previous one stays",
            j->err, ckv_status_name(j->status));
    /* written again at the next scan that finds it due */
    char key[256];
    ckv_store_session_key(q->tenant, j->name, key, sizeof key);
    ckv_srv_session *sess = ckv_strmap_get(p->store->sessions, key);
    if (sess) sess->autosave_mark = 0;
  } else {
    p->counters.autosaves++;
    p->counters.autosave_bytes += j->bytes;
    ckv_log(CKV_LOG_DEBUG, "autosave", j->tenant, j->name,
            "autosaved: %llu tokens, %llu bytes; copied in %.3f ms on the loop, written in %.3f ms",
            (unsigned long long)q->tokens, (unsigned long long)j->bytes, (double)q->copy_us / 1e3,
            (double)j->io_us / 1e3);
  }
  job_destroy(j);
}

/* Copies `pick` and hands the copy to the I/O thread; false when that could not be done now. */
static bool start_one(ckv_persist *p, ckv_srv_session *pick, uint64_t now) {
  autosave_job *q = new_job(p, CKV_SNAPIO_SAVE, pick->tenant, pick->id);
  if (!q) return false;
  snprintf(q->job.model_id, sizeof q->job.model_id, "%s", pick->model_id);
  snprintf(q->job.model_revision, sizeof q->job.model_revision, "%s", pick->model_revision);
  uint64_t t0 = ckv_now_us();
  char err[320];
  int r = ckv_session_snap_capture(pick, /* committed_only= */ false, &q->job.snap, &q->tokens, err, sizeof err);
  q->copy_us = ckv_now_us() - t0;
  pick->autosave_ms = now; /* tried now, whatever comes of it: the next try waits a period */
  if (r < 0) {
    p->counters.autosave_errors++;
    ckv_log(CKV_LOG_ERROR, "autosave-failed", pick->tenant->name, pick->id, "cannot copy the session: %s", err);
    job_destroy(&q->job);
    return false;
  }
  /* The copy counts against the tenant's quota while it waits for the disk, as a save's does. */
  uint64_t bytes = q->job.snap.buf_len_;
  if (pick->tenant->io_bytes && pick->tenant->io_bytes + bytes > pick->tenant->quota_bytes) {
    job_destroy(&q->job); /* saves of the tenant are waiting: later */
    return false;
  }
  /* Its file within the tenant's quota_disk (net of the autosave it
   * replaces), or not written at all: the session stays in memory, its
   * previous autosave stays, and the next period tries again. */
  char qerr[400];
  if (ckv_persist_disk_admit(p, pick->tenant, CKV_DISKUSE_AUTOSAVE, pick->id, ckv_snap_file_size(&q->job.snap),
                             &q->job, qerr, sizeof qerr) < 0) {
    p->counters.disk_refused_autosaves++;
    /* one text per tenant: the log's limiter holds back the repeats */
    ckv_log(CKV_LOG_WARNING, "autosave-quota", pick->tenant->name, NULL,
            "autosaves refused by the tenant's quota_disk of %llu bytes: its sessions stay in memory and their "
            "previous autosaves stay (commitkv_disk_refused_autosaves_total counts them)",
            (unsigned long long)pick->tenant->quota_disk);
    ckv_log(CKV_LOG_DEBUG, "autosave-quota", pick->tenant->name, pick->id, "%s", qerr);
    job_destroy(&q->job);
    return false;
  }
  pick->tenant->io_bytes += bytes;
  q->charged = bytes;
  q->tenant = pick->tenant;
  q->job.finish = save_finished;
  if (ckv_snapio_submit(p->snapio, &q->job) < 0) { /* the queue is full: later */
    job_destroy(&q->job);
    return false;
  }
  pick->autosave_mark = mark_of(pick);
  pick->autosave_dirty_ms = 0; /* the copy holds every change so far */
  p->autosave_inflight++;
  return true;
}

static int waited_longest(const void *a, const void *b) {
  const ckv_srv_session *x = *(ckv_srv_session *const *)a, *y = *(ckv_srv_session *const *)b;
  return x->autosave_ms < y->autosave_ms ? -1 : x->autosave_ms > y->autosave_ms;
}

void ckv_autosave_scan(ckv_persist *p, uint64_t now) {
  if (!p->opt.autosave_ms || !p->snapio || !p->opt.state_dir || !*p->opt.state_dir) return;
  /* The lag: the oldest change a copy does not hold yet, quiet sessions or not. */
  size_t n = 0, cap = ckv_strmap_size(p->store->sessions);
  ckv_srv_session **due_now = malloc((cap ? cap : 1) * sizeof(*due_now));
  ckv_srv_session *sess;
  size_t cur = 0;
  uint64_t lag = 0;
  while ((sess = ckv_strmap_next(p->store->sessions, &cur, NULL))) {
    if (sess->tokens.n && !sess->doomed && sess->autosave_mark != mark_of(sess)) {
      if (!sess->autosave_dirty_ms) sess->autosave_dirty_ms = now;
      if (now - sess->autosave_dirty_ms > lag) lag = now - sess->autosave_dirty_ms;
    }
    if (due_now && n < cap && due(p, sess, now)) due_now[n++] = sess;
  }
  p->counters.autosave_lag_ms = lag;
  if (!due_now) return;
  /* Several at once, the one waiting longest first: with hundreds of
   * changing sessions one copy per scan fell 15-30 s behind. */
  qsort(due_now, n, sizeof(*due_now), waited_longest);
  for (size_t i = 0; i < n && p->autosave_inflight < CKV_AUTOSAVE_INFLIGHT; i++) start_one(p, due_now[i], now);
  free(due_now);
}

static void remove_finished(void *ctx, ckv_snapio_job *j) {
  (void)ctx;
  if (j->status < 0)
    ckv_log(CKV_LOG_WARNING, "autosave-remove-failed", j->tenant, j->name, "autosave not removed: %s", j->err);
  job_destroy(j);
}

void ckv_autosave_forget(ckv_persist *p, const ckv_tenant *tenant, const char *id) {
  if (!p->opt.autosave_ms && !p->autosave_found) return; /* none written, none left from before */
  if (!p->opt.state_dir || !*p->opt.state_dir) return;
  autosave_job *q = new_job(p, CKV_SNAPIO_REMOVE, tenant, id);
  if (!q) return;
  q->job.finish = remove_finished;
  if (!p->snapio || ckv_snapio_submit(p->snapio, &q->job) < 0) { /* stopping, or the queue is full: here, once */
    ckv_snapio_run(&q->job);
    ckv_persist_job_landed(p, &q->job);
    remove_finished(p, &q->job);
  }
}

void ckv_autosave_session_new(ckv_persist *p, ckv_srv_session *sess, bool from_autosave) {
  if (!from_autosave) {
    ckv_autosave_forget(p, sess->tenant, sess->id);
    return;
  }
  p->counters.autosave_resumes++;
  sess->autosave_mark = mark_of(sess); /* its file holds exactly this */
  sess->autosave_ms = ckv_now_ms();
}

static void count_one(void *ctx, const char *tenant, const char *name, const char *path, uint64_t bytes) {
  (void)tenant, (void)name, (void)path;
  uint64_t *c = ctx;
  c[0]++;
  c[1] += bytes;
}

void ckv_autosave_startup(ckv_persist *p) {
  if (!p->opt.state_dir || !*p->opt.state_dir) return;
  ckv_snapdir_clean_temps(p->opt.state_dir, CKV_SNAPDIR_AUTOSAVE);
  uint64_t c[2] = {0, 0};
  ckv_snapdir_area_each(p->opt.state_dir, CKV_SNAPDIR_AUTOSAVE, NULL, count_one, c);
  p->autosave_found = c[0] > 0;
  if (c[0])
    ckv_log(CKV_LOG_NOTICE, "autosave-found", NULL, NULL,
            "%llu autosaved session(s), %llu bytes: OpenSession with resume brings each back (when newer than its "
            "snapshot)",
            (unsigned long long)c[0], (unsigned long long)c[1]);
}
