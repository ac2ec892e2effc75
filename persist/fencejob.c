/* fencejob.c - store fence writes from the loop: jobs, retries, waits (see
 * fencejob.h). */
#include "persist/fencejob.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "persist/fence.h"
#include "persist/persist.h"
#include "persist/remote.h"
#include "persist/snapio.h"
#include "persist/tier.h"
#include "store/tenant.h"

#define RETRY_FIRST_MS 1000u
#define RETRY_MAX_MS 32000u
/* The longest a drop waits for its write: within a client's default timeout (5 s), whatever remote_timeout is. */
#define WAIT_MAX_MS 4000u

/* One decision of an id whose write has not landed. */
typedef struct pending {
  char tenant[CKV_SNAP_TENANT_MAX + 1], id[CKV_SNAP_ID_MAX + 1];
  char model_id[CKV_SNAP_MODEL_MAX + 1], model_revision[CKV_SNAP_MODEL_MAX + 1];
  uint64_t incarnation, decided_ms;
  uint64_t gen; /* which decision: a job of an older one does not settle it */
  uint64_t next_ms; /* the next try, when none is in flight */
  uint32_t backoff_ms; /* the wait after the next failure */
  bool inflight;
} pending;

typedef struct fence_job fence_job;

/* A caller waiting for one write (a drop's reply). */
typedef struct waiter {
  struct waiter *prev, *next;
  ckv_fence_done_fn done;
  void *ctx;
  uint64_t deadline_ms;
  fence_job *job; /* NULL once answered by the deadline */
} waiter;

struct fence_job {
  ckv_snapio_job job; /* first: snapio hands it back */
  ckv_persist *p;
  uint64_t gen;
  waiter *w;
};

struct ckv_fences {
  ckv_strmap *pending; /* "tenant/id" -> pending */
  waiter *waiters;
  uint64_t gen;
};

int ckv_fences_new(ckv_fences **ret) {
  ckv_fences *f = calloc(1, sizeof(*f));
  if (!f) return -ENOMEM;
  if (ckv_strmap_new(&f->pending) < 0) {
    free(f);
    return -ENOMEM;
  }
  *ret = f;
  return CKV_OK;
}

static void unlink_waiter(ckv_fences *f, waiter *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    f->waiters = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
}

ckv_fences *ckv_fences_free(ckv_fences *f) {
  if (!f) return NULL;
  size_t cur = 0;
  void *v;
  while ((v = ckv_strmap_next(f->pending, &cur, NULL))) free(v);
  ckv_strmap_free(f->pending);
  while (f->waiters) { /* answered by their deadline, their jobs already gone */
    waiter *w = f->waiters;
    unlink_waiter(f, w);
    free(w);
  }
  free(f);
  return NULL;
}

size_t ckv_fence_pending(const ckv_persist *p) { return p->fences ? ckv_strmap_size(p->fences->pending) : 0; }

static void job_destroy(ckv_snapio_job *j) {
  fence_job *q = (fence_job *)j;
  if (q->w) { /* never collected: the daemon stops */
    waiter *w = q->w;
    unlink_waiter(q->p->fences, w);
    w->done(w->ctx, -ECANCELED, "the daemon stops");
    free(w);
  }
  free(q);
}

static void schedule_retry(pending *e, uint64_t now) {
  e->inflight = false;
  e->next_ms = now + e->backoff_ms;
  e->backoff_ms = e->backoff_ms * 2 < RETRY_MAX_MS ? e->backoff_ms * 2 : RETRY_MAX_MS;
}

static void answer(ckv_fences *f, fence_job *q, int status, const char *text) {
  waiter *w = q->w;
  if (!w) return;
  q->w = NULL;
  unlink_waiter(f, w);
  w->done(w->ctx, status, text);
  free(w);
}

/* The write landed (or not), on the loop. */
static void job_finished(void *ctx, ckv_snapio_job *j) {
  (void)ctx;
  fence_job *q = (fence_job *)j;
  ckv_fences *f = q->p->fences;
  char key[CKV_SNAP_TENANT_MAX + CKV_SNAP_ID_MAX + 2];
  snprintf(key, sizeof key, "%s/%s", j->tenant, j->name);
  pending *e = ckv_strmap_get(f->pending, key);
  bool current = e && e->gen == q->gen;
  char text[480] = "";
  if (j->status == CKV_OK) {
    if (current) free(ckv_strmap_del(f->pending, key));
    if (j->fence_superseded)
      ckv_log(CKV_LOG_INFO, "fence-superseded", j->tenant, j->name,
              "the store's fence holds a newer decision than incarnation "
              "%016llx: left as it is",
              (unsigned long long)j->fence_incarnation);
  } else {
    uint64_t now = ckv_now_ms();
    if (current) schedule_retry(e, now);
    snprintf(text, sizeof text,
             "%s: %.300s; it is fenced (this daemon's record, and the store's "
             "fence once a retry lands) and never "
             "served",
             j->fence_incarnation ? "the store's fence could not be written" : "the remote copy could not be deleted",
             j->err);
    if (current)
      ckv_log(CKV_LOG_WARNING, "fence-write-failed", j->tenant, j->name, "%s; retried in %llu ms", text,
              (unsigned long long)(e->next_ms - now));
  }
  answer(f, q, j->status, text);
  free(q);
}

/* Queues the write of e; false: the queue is full (counted as a failed try). */
static bool submit(ckv_persist *p, pending *e, waiter *w) {
  fence_job *q = calloc(1, sizeof(*q));
  if (!q) return false;
  ckv_snapio_job *j = &q->job;
  j->kind = CKV_SNAPIO_FENCE;
  j->area = CKV_SNAPIO_TIER_REMOTE;
  j->remote = p->opt.remote;
  snprintf(j->tenant, sizeof j->tenant, "%s", e->tenant);
  snprintf(j->name, sizeof j->name, "%s", e->id);
  snprintf(j->model_id, sizeof j->model_id, "%s", e->model_id);
  snprintf(j->model_revision, sizeof j->model_revision, "%s", e->model_revision);
  j->fence_incarnation = e->incarnation;
  j->fence_decided_ms = e->decided_ms;
  j->fence_delete = e->incarnation == 0;
  j->finish = job_finished;
  j->destroy = job_destroy;
  q->p = p;
  q->gen = e->gen;
  q->w = w;
  if (ckv_snapio_submit(p->snapio, j) < 0) {
    free(q);
    return false;
  }
  if (w) w->job = q;
  e->inflight = true;
  return true;
}

int ckv_fence_publish(ckv_persist *p, const ckv_tenant *t, const char *id, const char *model_id,
                      const char *model_revision, uint64_t incarnation, ckv_fence_done_fn done, void *ctx) {
  ckv_fences *f = p->fences;
  if (!f || !p->snapio || !p->opt.remote || !ckv_tier_remote_on(p->tier)) return CKV_OK;
  char key[CKV_SNAP_TENANT_MAX + CKV_SNAP_ID_MAX + 2];
  snprintf(key, sizeof key, "%s/%s", t->name, id);
  pending *e = ckv_strmap_get(f->pending, key);
  if (!e) {
    if (!(e = calloc(1, sizeof(*e))) || ckv_strmap_put(f->pending, key, e) < 0) {
      free(e);
      ckv_log(CKV_LOG_ERROR, "fence-write-failed", t->name, id, "out of memory: the store's fence is not written");
      return CKV_OK;
    }
  }
  snprintf(e->tenant, sizeof e->tenant, "%s", t->name);
  snprintf(e->id, sizeof e->id, "%s", id);
  snprintf(e->model_id, sizeof e->model_id, "%s", model_id ? model_id : "");
  snprintf(e->model_revision, sizeof e->model_revision, "%s", model_revision ? model_revision : "");
  e->incarnation = incarnation;
  e->decided_ms = ckv_fence_now_ms();
  e->gen = ++f->gen;
  e->backoff_ms = RETRY_FIRST_MS;
  waiter *w = NULL;
  uint64_t now = ckv_now_ms();
  if (done && (w = calloc(1, sizeof(*w)))) {
    uint64_t wait = 2ull * ckv_remote_timeout_ms(p->opt.remote) + 500u;
    *w = (waiter){
        .done = done, .ctx = ctx, .deadline_ms = now + (wait < WAIT_MAX_MS ? wait : WAIT_MAX_MS), .next = f->waiters};
    if (f->waiters) f->waiters->prev = w;
    f->waiters = w;
  }
  if (submit(p, e, w)) return w ? CKV_FENCE_WAIT : CKV_OK;
  schedule_retry(e, now);
  ckv_log(CKV_LOG_WARNING, "fence-write-failed", t->name, id,
          "the I/O queue is full: the store's fence (incarnation %016llx) is "
          "written by a retry",
          (unsigned long long)incarnation);
  if (!w) return CKV_OK;
  unlink_waiter(f, w);
  free(w);
  done(ctx, CKV_ERR_BUSY,
       incarnation ? "the store's fence is not written yet (the I/O queue is "
                     "full): it is retried"
                   : "the remote copy is not deleted yet (the I/O queue is "
                     "full): it is fenced, and the delete is "
                     "retried");
  return CKV_FENCE_WAIT;
}

void ckv_fence_scan(ckv_persist *p, uint64_t now_ms) {
  ckv_fences *f = p->fences;
  if (!f || !p->snapio) return;
  for (waiter *w = f->waiters, *next; w; w = next) {
    next = w->next;
    if (now_ms < w->deadline_ms || !w->job) continue;
    fence_job *q = w->job;
    answer(f, q, -ETIMEDOUT,
           q->job.fence_incarnation ? "the store's fence is not written yet (the remote store is "
                                      "slow or the I/O queue busy): it goes on "
                                      "in the background"
                                    : "the remote copy's delete has not finished (the remote store "
                                      "is slow or the I/O queue busy): the "
                                      "copy is fenced, and the delete goes on in the background");
  }
  size_t cur = 0;
  pending *e;
  while ((e = ckv_strmap_next(f->pending, &cur, NULL)))
    if (!e->inflight && now_ms >= e->next_ms && !submit(p, e, NULL)) schedule_retry(e, now_ms);
}
