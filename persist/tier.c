/* tier.c - the disk tier (see tier.h): which sessions go, their jobs on the
 * snapshot I/O thread, the requests that wait for a session coming back, and
 * the figures.  Everything here runs on the server loop; the I/O thread only
 * ever sees a job. */
#include "persist/tier.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "lifecycle/policy.h"
#include "persist/persist.h"
#include "persist/diskjob.h"
#include "persist/diskuse.h"
#include "persist/remote.h"
#include "persist/session_snap.h"
#include "persist/snapdir.h"
#include "persist/snapio.h"
#include "persist/snapshot.h"
#include "store/blockmem.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

struct ckv_tier_slot {
  ckv_tier_state state;
  uint64_t seq;       /* the job in flight for this session */
  bool cancel;        /* a request named the session while its offload was written */
  bool writes_open;   /* tokens appended since the last report: the worker may still write their K/V */
  bool full_logged;   /* "the tier is full" was said since the last request */
  bool remote_copy;   /* its copy is the remote tier's (ON_REMOTE, or RESTORING from there) */
  uint64_t disk_since_ms; /* when it went to disk (the remote tier's idle clock starts there) */
  uint64_t file_bytes; /* the tier file's size (ON_DISK, PUSHING, RESTORING; ON_REMOTE: the store's copy) */
  uint64_t bytes5[5];  /* what the session held in memory when it went (stats bytes layout) */
};

/* One tenant's counters (since start; they never go down). */
typedef struct tenant_counts {
  const ckv_tenant *tenant;
  uint64_t offloads, offload_bytes, restores, restore_bytes, restore_tokens, cancelled, refused, errors, pressure_moves;
  uint64_t pushes, push_bytes, remote_restores, remote_restore_bytes, remote_restore_tokens, remote_errors;
} tenant_counts;

struct ckv_tier {
  bool on;
  uint64_t idle_ms, cap;
  bool pressure;              /* memory pressure moves the coldest sessions down (ckv_tier_make_room) */
  unsigned pressure_inflight; /* offloads being written for memory pressure */
  bool replaying;             /* the daemon serves the requests parked for room again: no second round of moves */
  uint64_t disk_bytes; /* tier files of sessions on disk or coming back, and leftovers */
  uint64_t reserved;   /* estimated size of the offloads being written */
  unsigned inflight;   /* offloads being written */
  struct ckv_remote *remote; /* the remote tier's store (NULL: no remote tier) */
  uint64_t remote_idle_ms;
  unsigned pushing;          /* pushes in flight */
  uint64_t seq;
  ckv_strmap *leftovers; /* "tenant/id" -> uint64_t bytes: files an earlier run left */
  tenant_counts *tc;
  size_t n_tc, cap_tc;
};

/* A tier job: the I/O thread's part first (snapio hands it back). */
typedef struct tier_job {
  ckv_snapio_job job;
  ckv_persist *persist;       /* whose disk index holds job.disk_claim (NULL: none) */
  uint64_t seq;
  uint64_t reserved;          /* SAVE: counted in tier->reserved */
  uint64_t epoch, n_tokens;   /* SAVE: the session as captured */
  uint64_t idle_ms;           /* SAVE: how long it had been idle */
  uint64_t bytes5[5];         /* SAVE: what it held in memory */
  bool pressure;              /* SAVE: made to give room to a waiting request (counted in pressure_inflight) */
  uint64_t since_ms;          /* PUSH: when the session was last used (or went to disk) */
} tier_job;

static void job_destroy(ckv_snapio_job *j) {
  tier_job *q = (tier_job *)j;
  if (q->persist) ckv_diskuse_release(q->persist->diskuse, j->tenant, &j->disk_claim); /* never landed */
  ckv_snap_done(&j->snap);
  free(j);
}

int ckv_tier_new(uint64_t idle_ms, uint64_t cap_bytes, bool pressure, const char *state_dir, ckv_tier **ret) {
  ckv_tier *t = calloc(1, sizeof(*t));
  if (!t) return -ENOMEM;
  if (ckv_strmap_new(&t->leftovers) < 0) {
    free(t);
    return -ENOMEM;
  }
  t->idle_ms = idle_ms;
  t->cap = cap_bytes;
  t->on = (idle_ms || pressure) && cap_bytes && state_dir && *state_dir;
  t->pressure = t->on && pressure;
  *ret = t;
  return CKV_OK;
}

ckv_tier *ckv_tier_free(ckv_tier *t) {
  if (!t) return NULL;
  size_t cur = 0;
  void *v;
  while ((v = ckv_strmap_next(t->leftovers, &cur, NULL))) free(v);
  ckv_strmap_free(t->leftovers);
  free(t->tc);
  free(t);
  return NULL;
}

bool ckv_tier_enabled(const ckv_tier *t) { return t && t->on; }

bool ckv_tier_remote_on(const ckv_tier *t) { return t && t->remote; }

void ckv_tier_set_remote(ckv_tier *t, struct ckv_remote *r, uint64_t idle_ms) {
  if (!t || !t->on || !r || !idle_ms) return;
  t->remote = r;
  t->remote_idle_ms = idle_ms;
}

const char *ckv_tier_state_name(ckv_tier_state st) {
  static const char *const names[] = {"primary", "offloading", "disk", "restoring", "pushing", "remote"};
  return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "?";
}

static tenant_counts *counts_of(ckv_tier *t, const ckv_tenant *tenant) {
  static tenant_counts spare; /* out of memory: counted nowhere rather than failing a move */
  for (size_t i = 0; i < t->n_tc; i++)
    if (t->tc[i].tenant == tenant) return &t->tc[i];
  if (t->n_tc == t->cap_tc) {
    size_t ncap = t->cap_tc ? t->cap_tc * 2 : 4;
    tenant_counts *n = realloc(t->tc, ncap * sizeof(*n));
    if (!n) return &spare;
    t->tc = n;
    t->cap_tc = ncap;
  }
  t->tc[t->n_tc] = (tenant_counts){.tenant = tenant};
  return &t->tc[t->n_tc++];
}

static ckv_tier_slot *slot_of(ckv_srv_session *sess) {
  if (!sess->tier) sess->tier = calloc(1, sizeof(*sess->tier));
  return sess->tier;
}

ckv_tier_state ckv_tier_state_of(const ckv_srv_session *sess) {
  return sess->tier ? sess->tier->state : CKV_TIER_RESIDENT;
}

static tier_job *new_job(ckv_persist *p, ckv_snapio_kind kind, const ckv_tenant *tenant, const char *id) {
  tier_job *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  q->job.kind = kind;
  q->job.area = CKV_SNAPIO_TIER;
  q->job.destroy = job_destroy;
  q->persist = p;
  snprintf(q->job.state_dir, sizeof q->job.state_dir, "%s", p->opt.state_dir ? p->opt.state_dir : "");
  snprintf(q->job.tenant, sizeof q->job.tenant, "%s", tenant->name);
  snprintf(q->job.name, sizeof q->job.name, "%s", id);
  q->job.remote = p->tier ? p->tier->remote : NULL;
  return q;
}

/* A job on the remote tier's copy of sess (its key names the model). */
static tier_job *new_remote_job(ckv_persist *p, ckv_snapio_kind kind, const ckv_srv_session *sess) {
  tier_job *q = new_job(p, kind, sess->tenant, sess->id);
  if (!q) return NULL;
  q->job.area = CKV_SNAPIO_TIER_REMOTE;
  snprintf(q->job.model_id, sizeof q->job.model_id, "%s", sess->model_id);
  snprintf(q->job.model_revision, sizeof q->job.model_revision, "%s", sess->model_revision);
  return q;
}

static void remove_finished(void *ctx, ckv_snapio_job *j) {
  (void)ctx;
  if (j->status < 0)
    ckv_log(CKV_LOG_WARNING, "tier-remove-failed", j->tenant, j->name, "tier file not removed: %s", j->err);
  job_destroy(j);
}

/* Removes the tier file of tenant/id on the I/O thread (behind every job
 * queued before it: a write of the same file lands first). */
static void remove_file(ckv_persist *p, const ckv_tenant *tenant, const char *id) {
  if (!p->snapio) return; /* stopping: the file stays, resumable after a restart */
  tier_job *q = new_job(p, CKV_SNAPIO_REMOVE, tenant, id);
  if (!q) return;
  q->job.finish = remove_finished;
  if (ckv_snapio_submit(p->snapio, &q->job) < 0) { /* the queue is full: an unlink, here, once */
    ckv_snapio_run(&q->job);
    ckv_persist_job_landed(p, &q->job);
    remove_finished(p, &q->job);
  }
}

static void remote_removed(void *ctx, ckv_snapio_job *j) {
  (void)ctx;
  if (j->status < 0)
    ckv_log(CKV_LOG_WARNING, "tier-remove-failed", j->tenant, j->name,
            "the remote tier's copy was not deleted (the store keeps it until it is resumed or replaced): %s", j->err);
  job_destroy(j);
}

/* Deletes the remote tier's copy of the session job j names (the job's
 * tenant, id and model), on the I/O thread behind every job before it. */
static void remove_remote_of(ckv_persist *p, const ckv_snapio_job *j) {
  if (!p->snapio || !p->tier || !p->tier->remote) return; /* stopping: the copy stays, resumable */
  tier_job *q = calloc(1, sizeof(*q));
  if (!q) return;
  q->job.kind = CKV_SNAPIO_REMOVE;
  q->job.area = CKV_SNAPIO_TIER_REMOTE;
  q->job.destroy = job_destroy;
  q->job.finish = remote_removed;
  q->job.remote = p->tier->remote;
  memcpy(q->job.state_dir, j->state_dir, sizeof q->job.state_dir);
  memcpy(q->job.tenant, j->tenant, sizeof q->job.tenant);
  memcpy(q->job.name, j->name, sizeof q->job.name);
  memcpy(q->job.model_id, j->model_id, sizeof q->job.model_id);
  memcpy(q->job.model_revision, j->model_revision, sizeof q->job.model_revision);
  if (ckv_snapio_submit(p->snapio, &q->job) < 0) { /* the queue is full: a DEL, here, once */
    ckv_snapio_run(&q->job);
    remote_removed(p, &q->job);
  }
}

static void remove_remote(ckv_persist *p, const ckv_srv_session *sess) {
  if (!p->snapio || !p->tier || !p->tier->remote) return;
  tier_job *q = new_remote_job(p, CKV_SNAPIO_REMOVE, sess);
  if (!q) return;
  remove_remote_of(p, &q->job);
  job_destroy(&q->job);
}

/* A file an earlier run left for tenant/id is gone or replaced. */
static void forget_leftover(ckv_tier *t, const char *key) {
  uint64_t *b = ckv_strmap_del(t->leftovers, key);
  if (!b) return;
  t->disk_bytes -= *b < t->disk_bytes ? *b : t->disk_bytes;
  free(b);
}

/* ---- start-up ------------------------------------------------------------ */

static void count_leftover(void *ctx, const char *tenant, const char *name, const char *path, uint64_t bytes) {
  ckv_tier *t = ctx;
  (void)path;
  char key[256];
  snprintf(key, sizeof key, "%s/%s", tenant, name);
  uint64_t *b = malloc(sizeof(*b));
  if (!b) return;
  *b = bytes;
  if (ckv_strmap_put(t->leftovers, key, b) < 0) {
    free(b);
    return;
  }
  t->disk_bytes += bytes; /* said per tenant by the disk index's start-up (diskuse.h), not per file */
}

void ckv_tier_startup(ckv_persist *p) {
  ckv_tier *t = p->tier;
  if (!t || !p->opt.state_dir || !*p->opt.state_dir) return;
  ckv_snapdir_clean_temps(p->opt.state_dir, CKV_SNAPDIR_TIER);
  ckv_snapdir_area_each(p->opt.state_dir, CKV_SNAPDIR_TIER, NULL, count_leftover, t);
  if (ckv_strmap_size(t->leftovers) || t->on)
    ckv_log(CKV_LOG_NOTICE, "tier", NULL, NULL, "disk tier %s: %zu session files (%llu bytes) in %s/%s%s",
            t->on ? "on" : "off", ckv_strmap_size(t->leftovers), (unsigned long long)t->disk_bytes,
            p->opt.state_dir, CKV_SNAPDIR_TIER,
            t->on && t->disk_bytes > t->cap ? ", more than disk_memory: no session moves down until they go" : "");
}

/* ---- offload ------------------------------------------------------------- */

static void offload_landed(ckv_persist *p, ckv_snapio_job *j) {
  ckv_tier *t = p->tier;
  tier_job *q = (tier_job *)j;
  t->reserved -= q->reserved;
  t->inflight--;
  char key[256];
  snprintf(key, sizeof key, "%s/%s", j->tenant, j->name);
  ckv_srv_session *sess = ckv_strmap_get(p->store->sessions, key);
  if (!sess || !sess->tier || sess->tier->seq != q->seq || sess->tier->state != CKV_TIER_OFFLOADING) {
    /* dropped (or expired) while its copy was written: the copy goes too */
    if (j->status == CKV_OK && sess == NULL) {
      ckv_tenant *tn = NULL;
      for (size_t i = 0; i < p->store->n_tenants; i++)
        if (strcmp(p->store->tenants[i]->name, j->tenant) == 0) tn = p->store->tenants[i];
      if (tn) remove_file(p, tn, j->name);
    }
    job_destroy(j);
    return;
  }
  ckv_tier_slot *slot = sess->tier;
  tenant_counts *tc = counts_of(t, sess->tenant);
  uint64_t now = ckv_now_ms();
  if (j->status < 0) {
    slot->state = CKV_TIER_RESIDENT;
    tc->errors++;
    sess->touched_ms = now; /* tried again after another idle spell */
    ckv_log(CKV_LOG_ERROR, "tier-offload-failed", j->tenant, j->name, "the session stays in memory: %s (%s)", j->err,
            ckv_status_name(j->status));
    job_destroy(j);
    return;
  }
  /* Only a session nothing touched since its copy may lose its blocks: any
   * change would be missing from the file. */
  if (slot->cancel || sess->epoch != q->epoch || sess->tokens.n != q->n_tokens || sess->jobs_inflight) {
    slot->state = CKV_TIER_RESIDENT;
    tc->cancelled++;
    ckv_log(CKV_LOG_INFO, "tier-offload-cancelled", j->tenant, j->name,
            "a request arrived while the session was written to disk: it stays in memory, the file is removed");
    remove_file(p, sess->tenant, sess->id);
    job_destroy(j);
    return;
  }
  forget_leftover(t, key); /* an earlier run's file of this id was just replaced */
  uint64_t freed = ckv_srv_session_evict_blocks(sess);
  slot->state = CKV_TIER_ON_DISK;
  slot->remote_copy = false;
  slot->disk_since_ms = now;
  slot->file_bytes = j->bytes;
  memcpy(slot->bytes5, q->bytes5, sizeof slot->bytes5);
  t->disk_bytes += j->bytes;
  tc->offloads++;
  tc->offload_bytes += j->bytes;
  if (q->pressure) tc->pressure_moves++;
  ckv_log(CKV_LOG_INFO, "tier-offload", j->tenant, j->name,
          "%s %.1f s: %llu bytes of KV memory given back, the session is on disk (%llu bytes, written and synced "
          "in %.3f ms by the I/O thread); disk tier %llu of %llu bytes",
          q->pressure ? "memory pressure, coldest session, idle" : "idle", (double)q->idle_ms / 1e3,
          (unsigned long long)freed, (unsigned long long)j->bytes, (double)j->io_us / 1e3,
          (unsigned long long)t->disk_bytes, (unsigned long long)t->cap);
  job_destroy(j);
}

/* Requests that waited for the pressure offloads are served again, in
 * order, now that those landed (or failed): with no second round of moves,
 * so what room they made is what the handler finds (else the old way:
 * compression, recycling, the quota error). */
static void replay_waiting(ckv_persist *p);

static void replan_stalled(ckv_persist *p);

static void offload_finished(void *ctx, ckv_snapio_job *j) {
  ckv_persist *p = ctx;
  bool pressure = ((tier_job *)j)->pressure;
  offload_landed(p, j); /* destroys j */
  if (pressure && --p->tier->pressure_inflight == 0) {
    replay_waiting(p);
    replan_stalled(p);
  }
}

/* Upper bound of a tier file's size for the cap: block bytes plus the token
 * columns, id counts and headers (docs/snapshot.md; within 64 bytes a token). */
static uint64_t file_estimate(const ckv_snap *snap) {
  return snap->buf_len_ + (uint64_t)snap->tokens.n * 64u + (uint64_t)snap->n_ids * 8u + (64u << 10);
}

/* Starts writing sess to its tier file; whether it did (else it stays in
 * memory, and the log said why when that was news). */
static bool start_offload(ckv_persist *p, ckv_srv_session *sess, uint64_t now, bool pressure) {
  ckv_tier *t = p->tier;
  ckv_tier_slot *slot = slot_of(sess);
  if (!slot) return false;
  tier_job *q = new_job(p, CKV_SNAPIO_SAVE, sess->tenant, sess->id);
  if (!q) return false;
  char err[320];
  uint64_t tokens = 0;
  int r = ckv_session_snap_capture(sess, /* committed_only= */ false, &q->job.snap, &tokens, err, sizeof err);
  if (r < 0) {
    free(q);
    if (r != CKV_ERR_BUSY) /* busy: moves in flight, tried again at the next scan */
      ckv_log(CKV_LOG_WARNING, "tier-offload-failed", sess->tenant->name, sess->id, "the session stays in memory: %s",
              err);
    sess->touched_ms = now;
    return false;
  }
  uint64_t need = file_estimate(&q->job.snap);
  if (t->disk_bytes + t->reserved + need > t->cap) {
    counts_of(t, sess->tenant)->refused++;
    if (!slot->full_logged)
      ckv_log(CKV_LOG_NOTICE, "tier-full", sess->tenant->name, sess->id,
              "idle, but the disk tier is full: it holds %llu of disk_memory %llu bytes (%llu being written) and this "
              "session needs up to %llu; it stays in memory",
              (unsigned long long)t->disk_bytes, (unsigned long long)t->cap, (unsigned long long)t->reserved,
              (unsigned long long)need);
    slot->full_logged = true;
    sess->touched_ms = now; /* asked again after another idle spell */
    job_destroy(&q->job);
    return false;
  }
  /* The tenant's disk: the file within its quota_disk, or the session stays in memory. */
  char qerr[400];
  if (ckv_persist_disk_admit(p, sess->tenant, CKV_DISKUSE_TIER, sess->id, ckv_snap_file_size(&q->job.snap), &q->job,
                             qerr, sizeof qerr) < 0) {
    counts_of(t, sess->tenant)->refused++;
    p->counters.disk_refused_offloads++;
    if (!slot->full_logged) /* and one text per tenant: the log's limiter holds back the repeats */
      ckv_log(CKV_LOG_NOTICE, "tier-quota", sess->tenant->name, NULL,
              "idle sessions stay in memory: the tenant's quota_disk of %llu bytes has no room for their disk-tier "
              "files (commitkv_disk_refused_offloads_total counts them)",
              (unsigned long long)sess->tenant->quota_disk);
    ckv_log(CKV_LOG_DEBUG, "tier-quota", sess->tenant->name, sess->id, "%s", qerr);
    slot->full_logged = true;
    sess->touched_ms = now; /* asked again after another idle spell */
    job_destroy(&q->job);
    return false;
  }
  q->seq = ++t->seq;
  q->reserved = need;
  q->epoch = sess->epoch;
  q->n_tokens = sess->tokens.n;
  q->idle_ms = now - sess->touched_ms;
  uint64_t tok4[4] = {0};
  ckv_srv_session_figures(sess, tok4, q->bytes5);
  q->pressure = pressure;
  q->job.finish = offload_finished;
  if (ckv_snapio_submit(p->snapio, &q->job) < 0) { /* the queue is full of saves: next scan */
    job_destroy(&q->job);
    return false;
  }
  t->reserved += need;
  t->inflight++;
  if (pressure) t->pressure_inflight++;
  slot->state = CKV_TIER_OFFLOADING;
  slot->seq = q->seq;
  slot->cancel = false;
  return true;
}

/* Whether resident session sess may be written to disk now. */
static bool may_go_down(const ckv_srv_session *sess) {
  if (ckv_tier_state_of(sess) != CKV_TIER_RESIDENT) return false;
  if (sess->quarantined || sess->doomed || sess->jobs_inflight || sess->tenant->mem != &ckv_blockmem_host) return false;
  if (sess->owner && sess->tier && sess->tier->writes_open) return false; /* its worker may be writing K/V */
  if (ckv_moves_pending(sess)) return false; /* moves decided and not done: the file gets them done */
  return ckv_srv_session_bytes(sess) > 0; /* else nothing to give back */
}

/* ---- the remote tier: disk -> store -------------------------------------- */

static void push_finished(void *ctx, ckv_snapio_job *j) {
  ckv_persist *p = ctx;
  ckv_tier *t = p->tier;
  tier_job *q = (tier_job *)j;
  t->pushing--;
  char key[256];
  snprintf(key, sizeof key, "%s/%s", j->tenant, j->name);
  ckv_srv_session *sess = ckv_strmap_get(p->store->sessions, key);
  if (!sess || !sess->tier || sess->tier->seq != q->seq || sess->tier->state != CKV_TIER_PUSHING) {
    /* dropped, or a request brought it back from its tier file meanwhile:
     * the store's copy is nobody's */
    if (j->status == CKV_OK) remove_remote_of(p, j);
    job_destroy(j);
    return;
  }
  ckv_tier_slot *slot = sess->tier;
  tenant_counts *tc = counts_of(t, sess->tenant);
  uint64_t now = ckv_now_ms();
  if (j->status < 0) {
    slot->state = CKV_TIER_ON_DISK;
    slot->disk_since_ms = now; /* tried again after another remote_idle */
    tc->remote_errors++;
    ckv_log(CKV_LOG_WARNING, "tier-push-failed", j->tenant, j->name,
            "the session stays on disk (its tier file is intact): %s (%s)", j->err, ckv_status_name(j->status));
    job_destroy(j);
    return;
  }
  slot->state = CKV_TIER_ON_REMOTE;
  slot->remote_copy = true;
  t->disk_bytes -= slot->file_bytes < t->disk_bytes ? slot->file_bytes : t->disk_bytes;
  slot->file_bytes = j->bytes;
  tc->pushes++;
  tc->push_bytes += j->bytes;
  ckv_log(CKV_LOG_INFO, "tier-push", j->tenant, j->name,
          "on disk and unused for %.1f s: moved to the remote store %s (%llu bytes, in %.3f ms by the I/O thread); "
          "its tier file is removed",
          (double)(now - q->since_ms) / 1e3, ckv_remote_url_text(t->remote), (unsigned long long)j->bytes,
          (double)j->io_us / 1e3);
  remove_file(p, sess->tenant, sess->id);
  job_destroy(j);
}

/* Starts pushing the tier file of sess (on disk) to the store. */
static void start_push(ckv_persist *p, ckv_srv_session *sess, uint64_t since) {
  ckv_tier *t = p->tier;
  tier_job *q = new_remote_job(p, CKV_SNAPIO_PUSH, sess);
  if (!q) return;
  q->job.area = CKV_SNAPIO_TIER;
  q->seq = ++t->seq;
  q->since_ms = since;
  q->job.finish = push_finished;
  if (ckv_snapio_submit(p->snapio, &q->job) < 0) { /* the queue is full: next scan */
    job_destroy(&q->job);
    return;
  }
  t->pushing++;
  sess->tier->state = CKV_TIER_PUSHING;
  sess->tier->seq = q->seq;
}

static void relieve_stalls(ckv_persist *p);

static void high_water_moves(ckv_persist *p);

void ckv_tier_scan(ckv_persist *p, uint64_t now) {
  ckv_tier *t = p->tier;
  if (t && t->on && p->snapio) {
    relieve_stalls(p);
    high_water_moves(p);
  }
  if (!t || !t->on || !(t->idle_ms || t->remote) || !p->snapio) return;
  size_t cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(p->store->sessions, &cur, NULL))) {
    if (!sess->touched_ms) { /* new to the tier: idle from now on */
      sess->touched_ms = now;
      continue;
    }
    ckv_tier_state st = ckv_tier_state_of(sess);
    if (st == CKV_TIER_ON_DISK && t->remote && !sess->doomed) {
      uint64_t since = sess->touched_ms > sess->tier->disk_since_ms ? sess->touched_ms : sess->tier->disk_since_ms;
      if (now - since >= t->remote_idle_ms && t->pushing < CKV_TIER_INFLIGHT) start_push(p, sess, since);
      continue;
    }
    if (!t->idle_ms || now - sess->touched_ms < t->idle_ms || st != CKV_TIER_RESIDENT) continue;
    if (!may_go_down(sess)) continue;
    if (t->inflight >= CKV_TIER_INFLIGHT) continue;
    start_offload(p, sess, now, /* pressure= */ false);
  }
}

/* ---- the way back -------------------------------------------------------- */

/* Rebuilds session sess from the tier file job j read: a new session in
 * fresh blocks takes its place (same key, owner, lane), sess is freed.
 * CKV_OK, or the failure with its text in msg (the session stays on disk). */
static int apply_restore(ckv_persist *p, ckv_srv_session *sess, ckv_snapio_job *j, char *msg, size_t msglen) {
  ckv_tier *t = p->tier;
  ckv_tier_slot *slot = sess->tier;
  tenant_counts *tc = counts_of(t, sess->tenant);
  char err[320];
  bool remote = slot->remote_copy;
  slot->state = remote ? CKV_TIER_ON_REMOTE : CKV_TIER_ON_DISK; /* unless it comes back below */
  const char *where = remote ? "in the remote store" : "on disk";
  int r = j->status;
  if (r < 0) {
    snprintf(err, sizeof err, "%.280s (%s)", j->err, ckv_status_name(r));
    if (r == -ENOENT) r = CKV_ERR_CORRUPT; /* its only copy is gone */
  } else {
    ckv_snap_expect e = {.tenant = sess->tenant->name,
                         .model_id = sess->model_id,
                         .model_revision = sess->model_revision,
                         .geom = &sess->geom};
    r = ckv_snap_check_identity(&j->snap, &e, err, sizeof err);
    if (r == CKV_OK && strcmp(j->snap.session_id, sess->id) != 0)
      r = CKV_ERR_CORRUPT, snprintf(err, sizeof err, "the tier file holds session '%s'", j->snap.session_id);
    if (r == CKV_OK && sess->incarnation && j->snap.incarnation != sess->incarnation)
      r = CKV_ERR_CORRUPT, snprintf(err, sizeof err, "the tier copy holds incarnation %016llx, not the session's %016llx",
                                    (unsigned long long)j->snap.incarnation, (unsigned long long)sess->incarnation);
  }
  ckv_srv_session *ns = NULL;
  if (r == CKV_OK)
    r = ckv_session_snap_restore(&j->snap, sess->id, sess->tenant, p->opt.policy ? p->opt.policy->mlp : NULL,
                                 &p->store->next_block_id, &ns, err, sizeof err);
  if (r == CKV_OK && (r = ckv_srv_session_flush_meta(ns)) < 0)
    snprintf(err, sizeof err, "cannot write the restored headers: %s", ckv_strerror(r));
  if (r == CKV_OK) { /* ns takes the place of sess, which stood for the session while away (no blocks) */
    ns->tier = slot;
    sess->tier = NULL;
    if ((r = ckv_store_replace_session(p->store, sess, ns)) < 0) { /* ns freed, sess kept */
      sess->tier = slot;
      ns = NULL;
      snprintf(err, sizeof err, "out of memory");
    }
  }
  if (r < 0) {
    if (ns) {
      ns->dirty_head = NULL;
      ckv_srv_session_free(ns);
    }
    if (remote)
      tc->remote_errors++;
    else
      tc->errors++;
    const char *kept = remote ? "the store's copy is kept" : "its file is kept";
    ckv_log(CKV_LOG_WARNING, "tier-restore-failed", sess->tenant->name, sess->id,
            "cannot bring the session back from %s: %s; %s", remote ? "the remote store" : "disk", err, kept);
    if (r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE)
      snprintf(msg, msglen,
               "session '%s' is %s and its tenant's memory cannot take it back: %s; %s: free "
               "memory (drop or close other sessions) and retry",
               sess->id, where, err, kept);
    else if (r == -EIO)
      snprintf(msg, msglen, "session '%s' is %s, which does not answer: %s; %s: retry when the store is back",
               sess->id, where, err, kept);
    else
      snprintf(msg, msglen, "session '%s' is %s and cannot be read back: %s; %s", sess->id, where, err, kept);
    return r;
  }
  ns->touched_ms = ckv_now_ms();
  slot->state = CKV_TIER_RESIDENT;
  slot->remote_copy = false;
  slot->full_logged = false;
  slot->writes_open = false;
  memset(slot->bytes5, 0, sizeof slot->bytes5);
  ckv_moves_plan(ns, p->store->compressor, /* flush= */ false);
  if (remote) {
    tc->remote_restores++;
    tc->remote_restore_bytes += slot->file_bytes;
    tc->remote_restore_tokens += ns->tokens.n;
  } else {
    t->disk_bytes -= slot->file_bytes < t->disk_bytes ? slot->file_bytes : t->disk_bytes;
    tc->restores++;
    tc->restore_bytes += slot->file_bytes;
    tc->restore_tokens += ns->tokens.n;
  }
  ckv_log(CKV_LOG_INFO, "tier-restore", ns->tenant->name, ns->id,
          "brought back from %s: %zu tokens, %llu bytes of KV memory, epoch %llu (read in %.3f ms by the I/O "
          "thread)",
          remote ? "the remote store" : "disk", ns->tokens.n, (unsigned long long)ckv_srv_session_bytes(ns),
          (unsigned long long)ns->epoch, (double)j->io_us / 1e3);
  slot->file_bytes = 0;
  if (remote)
    remove_remote(p, ns);
  else
    remove_file(p, ns->tenant, ns->id);
  return CKV_OK;
}

/* The requests parked for session tenant/id go on: r CKV_OK, the session is
 * resident; else the error to answer them with (msg). */
static void session_ready(ckv_persist *p, const ckv_tenant *tenant, const char *id, int r, const char *msg) {
  if (!p->hooks.session_ready) return;
  char key[256];
  ckv_store_session_key(tenant, id, key, sizeof key);
  p->hooks.session_ready(p->hooks.ctx, key, r, msg);
}

static void restore_finished(void *ctx, ckv_snapio_job *j) {
  ckv_persist *p = ctx;
  tier_job *q = (tier_job *)j;
  char key[256];
  snprintf(key, sizeof key, "%s/%s", j->tenant, j->name);
  ckv_srv_session *sess = ckv_strmap_get(p->store->sessions, key);
  if (!sess || !sess->tier || sess->tier->seq != q->seq || sess->tier->state != CKV_TIER_RESTORING) {
    job_destroy(j); /* dropped meanwhile: its waiting requests were answered then */
    return;
  }
  const ckv_tenant *tenant = sess->tenant;
  char msg[768];
  int r = apply_restore(p, sess, j, msg, sizeof msg); /* frees sess on success */
  session_ready(p, tenant, j->name, r, msg);
  job_destroy(j);
}

static unsigned pressure_moves(ckv_persist *p, const ckv_tenant *tn, const ckv_srv_session *except, uint64_t short_by,
                               uint64_t *ret_freeing);

/* Starts reading sess back (CKV_OK; without a loop it is back when this
 * returns) or fails with msg; the caller parks its request, or (a prefetch)
 * answers at once.  *ret_sync: the read ran here and r is its outcome. */
static int start_restore(ckv_persist *p, ckv_srv_session *sess, bool can_wait, char *msg, size_t msglen,
                         bool *ret_sync);

static int start_restore(ckv_persist *p, ckv_srv_session *sess, bool can_wait, char *msg, size_t msglen,
                         bool *ret_sync) {
  ckv_tier *t = p->tier;
  ckv_tier_slot *slot = sess->tier;
  bool remote = slot->state == CKV_TIER_ON_REMOTE; /* PUSHING: the tier file is still there */
  tier_job *q = remote ? new_remote_job(p, CKV_SNAPIO_LOAD, sess) : new_job(p, CKV_SNAPIO_LOAD, sess->tenant, sess->id);
  if (!q) return -ENOMEM;
  q->job.max_bytes = slot->file_bytes; /* what the push stored: the store may send no more */
  q->seq = ++t->seq;
  slot->remote_copy = remote;
  slot->state = CKV_TIER_RESTORING;
  slot->seq = q->seq;
  if (!can_wait) { /* no loop to come back to: read it here */
    ckv_snapio_run(&q->job);
    int r = apply_restore(p, sess, &q->job, msg, msglen);
    job_destroy(&q->job);
    *ret_sync = true;
    return r;
  }
  q->job.finish = restore_finished;
  /* Memory pressure on the way back: the tenant's coldest sessions go down
   * first, their offloads queued ahead of this read (the I/O thread keeps
   * the order), so their blocks are free when the file is applied. */
  uint64_t need = slot->bytes5[3], freeing;
  if (t->pressure && !ckv_tenant_would_fit(sess->tenant, need)) {
    const ckv_tenant *tn = sess->tenant;
    uint64_t short_by = tn->bytes_used - tn->held_bytes + need - tn->quota_bytes;
    unsigned started = pressure_moves(p, tn, sess, short_by, &freeing);
    if (started)
      ckv_log(CKV_LOG_NOTICE, "tier-pressure", tn->name, sess->id,
              "coming back from disk needs %llu bytes and the tenant quota is short by %llu: moving its %u coldest "
              "other session%s (%llu bytes) to disk first",
              (unsigned long long)need, (unsigned long long)short_by, started, started == 1 ? "" : "s",
              (unsigned long long)freeing);
  }
  if (ckv_snapio_submit(p->snapio, &q->job) < 0) {
    slot->state = remote ? CKV_TIER_ON_REMOTE : CKV_TIER_ON_DISK;
    job_destroy(&q->job);
    snprintf(msg, msglen, "session '%s' is %s and the I/O queue is full (%u jobs); retry", sess->id,
             remote ? "in the remote store" : "on disk", CKV_SNAPIO_DEPTH);
    return CKV_ERR_BUSY;
  }
  return CKV_OK;
}

/* A new session of this id (OpenSession without resume, no session of the
 * id here): a remote tier copy an earlier run (or another daemon) left of
 * it must never come back in its place, so it is deleted.  Names the key
 * cannot hold are left to the handler to refuse. */
static void remove_stale_remote(ckv_persist *p, const ckv_tier_request *r) {
  if ((r->model_id && strlen(r->model_id) > CKV_SNAP_MODEL_MAX) ||
      (r->model_revision && strlen(r->model_revision) > CKV_SNAP_MODEL_MAX))
    return;
  tier_job *q = new_job(p, CKV_SNAPIO_REMOVE, r->tenant, r->id);
  if (!q) return;
  q->job.area = CKV_SNAPIO_TIER_REMOTE;
  snprintf(q->job.model_id, sizeof q->job.model_id, "%s", r->model_id ? r->model_id : "");
  snprintf(q->job.model_revision, sizeof q->job.model_revision, "%s", r->model_revision ? r->model_revision : "");
  remove_remote_of(p, &q->job);
  job_destroy(&q->job);
}

int ckv_tier_gate(ckv_persist *p, const ckv_tier_request *r, char *msg, size_t msglen) {
  ckv_tier *t = p->tier;
  if (!t || !r->tenant || !r->id) return CKV_OK;
  char key[256];
  ckv_store_session_key(r->tenant, r->id, key, sizeof key);
  ckv_srv_session *sess = ckv_strmap_get(p->store->sessions, key);
  if (!sess) {
    if (r->open_new && ckv_strmap_get(t->leftovers, key)) {
      /* a new session of this id: an earlier run's file of it must never
       * come back in its place */
      forget_leftover(t, key);
      remove_file(p, r->tenant, r->id);
    }
    if (r->open_new && t->remote) remove_stale_remote(p, r);
    return CKV_OK;
  }
  if (r->open_new) return CKV_OK; /* EXISTS */
  if (r->owner_only ? sess->owner != r->client : (r->resume && sess->owner && sess->owner != r->client))
    return CKV_OK; /* the handler refuses it */
  sess->touched_ms = ckv_now_ms();
  ckv_tier_slot *slot = sess->tier;
  if (!slot && t->on && r->appends) slot = slot_of(sess);
  if (!slot) return CKV_OK;
  slot->full_logged = false;
  if (r->appends) slot->writes_open = true;
  if (r->reports) slot->writes_open = false;
  bool sync = false;
  int rc;
  switch (slot->state) {
    case CKV_TIER_RESIDENT: return CKV_OK;
    case CKV_TIER_OFFLOADING: slot->cancel = true; return CKV_OK;
    case CKV_TIER_ON_DISK:
    case CKV_TIER_PUSHING: /* read back from its tier file, still there; the pushed copy goes */
    case CKV_TIER_ON_REMOTE:
      if (!r->kv) return CKV_OK;
      /* a prefetch: the read starts, the handler answers now */
      rc = start_restore(p, sess, r->can_wait, msg, msglen, &sync);
      return sync || rc < 0 || r->prefetch ? rc : CKV_TIER_PARK;
    case CKV_TIER_RESTORING:
      return r->prefetch ? CKV_OK : CKV_TIER_PARK; /* behind the request that asked first */
  }
  return CKV_OK;
}

/* ---- memory pressure ----------------------------------------------------- */

static void replay_waiting(ckv_persist *p) {
  ckv_tier *t = p->tier;
  t->replaying = true;
  if (p->hooks.room_made) p->hooks.room_made(p->hooks.ctx);
  t->replaying = false;
}

static int colder_first(const void *a, const void *b) {
  const ckv_srv_session *x = *(ckv_srv_session *const *)a, *y = *(ckv_srv_session *const *)b;
  return x->touched_ms < y->touched_ms ? -1 : x->touched_ms > y->touched_ms;
}

/* Starts the offload of tenant tn's coldest sessions that may go (never
 * `except`), until they hold short_by bytes or CKV_TIER_INFLIGHT offloads
 * are written; how many started (their bytes in *ret_freeing). */
static unsigned pressure_moves(ckv_persist *p, const ckv_tenant *tn, const ckv_srv_session *except, uint64_t short_by,
                               uint64_t *ret_freeing) {
  ckv_tier *t = p->tier;
  *ret_freeing = 0;
  size_t n = 0, cap = ckv_strmap_size(p->store->sessions);
  ckv_srv_session **cand = malloc((cap ? cap : 1) * sizeof(*cand));
  if (!cand) return 0;
  size_t cur = 0;
  ckv_srv_session *o;
  uint64_t now = ckv_now_ms(), freeing = 0;
  while ((o = ckv_strmap_next(p->store->sessions, &cur, NULL)) && n < cap) {
    if (o == except || o->tenant != tn || !may_go_down(o)) continue;
    /* An attached session's blocks are freed as soon as its file is
     * durable: its worker, between its view and its next request, may be
     * reading them.  Only one quiet for a while goes (a detached one has no
     * reader, except one a warm restart kept: its worker still maps the
     * blocks it read before the restart, until it resumes the session). */
    if (o->owner && now - o->touched_ms < CKV_TIER_PRESSURE_QUIET_MS) continue;
    if (o->warm_unresumed) continue;
    cand[n++] = o;
  }
  qsort(cand, n, sizeof(*cand), colder_first);
  unsigned started = 0;
  for (size_t i = 0; i < n && freeing < short_by && t->inflight < CKV_TIER_INFLIGHT; i++) {
    uint64_t held = ckv_srv_session_bytes(cand[i]);
    if (start_offload(p, cand[i], now, /* pressure= */ true)) {
      freeing += held;
      started++;
    }
  }
  free(cand);
  *ret_freeing = freeing;
  return started;
}

/* The high-water mark ([tenant.NAME] high_water, issue 43): a tenant
 * holding more than high_water x its quota, not counting blocks already on
 * their way down (sessions offloading), has its coldest sessions written to
 * disk now, in the background, by the rules of memory pressure (who may go,
 * coldest first, CKV_TIER_INFLIGHT at once), as many as bring it back under
 * the mark.  Nothing is parked: appends go on being served from the room
 * left between the mark and the quota while the moves are written, so one
 * rarely waits for a move (ckv_tier_make_room parks only when the quota
 * itself is short). */
static void high_water_moves(ckv_persist *p) {
  ckv_tier *t = p->tier;
  if (t->replaying) return;
  enum { MAX_TENANTS = 64 };
  const ckv_tenant *tns[MAX_TENANTS];
  uint64_t going[MAX_TENANTS];
  size_t n = 0, cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(p->store->sessions, &cur, NULL))) {
    const ckv_tenant *tn = sess->tenant;
    if (!tn || !(tn->high_water > 0) || !tn->quota_bytes) continue;
    size_t i = 0;
    while (i < n && tns[i] != tn) i++;
    if (i == n) {
      if (n == MAX_TENANTS) continue;
      tns[n] = tn;
      going[n++] = 0;
    }
    if (ckv_tier_state_of(sess) == CKV_TIER_OFFLOADING) going[i] += ckv_srv_session_bytes(sess);
  }
  for (size_t i = 0; i < n && t->inflight < CKV_TIER_INFLIGHT; i++) {
    const ckv_tenant *tn = tns[i];
    uint64_t used = tn->bytes_used > tn->held_bytes ? tn->bytes_used - tn->held_bytes : 0;
    uint64_t mark = (uint64_t)(tn->high_water * (double)tn->quota_bytes);
    if (used <= mark + going[i]) continue;
    uint64_t over = used - going[i] - mark, freeing;
    unsigned started = pressure_moves(p, tn, NULL, over, &freeing);
    if (started)
      ckv_log(CKV_LOG_NOTICE, "tier-high-water", tn->name, NULL,
              "%llu of %llu quota bytes used, over the high-water mark (%.2f) by %llu: moving its %u coldest "
              "session%s (%llu bytes) to disk in the background",
              (unsigned long long)used, (unsigned long long)tn->quota_bytes, tn->high_water,
              (unsigned long long)over, started, started == 1 ? "" : "s", (unsigned long long)freeing);
  }
}

/* Compression stalled on the quota or on the arena (moves-stalled: a
 * session's decided moves found no room for a destination block, the
 * tenant's quota full, or CKV_ERR_NOSPACE: no free range in the arena for
 * the destination's block size while the quota still has room) moves the
 * tenant's coldest other session to disk, as an append short of quota does,
 * instead of leaving the moves to wait for a drop: its blocks' memory goes
 * back to the arena's free ranges.  One move at a time for the whole
 * daemon: once it has landed, every stalled session plans again, and a
 * session still stalled asks for the next at the next scan. */
static void relieve_stalls(ckv_persist *p) {
  ckv_tier *t = p->tier;
  if (!t->pressure || t->pressure_inflight || t->replaying) return;
  size_t cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(p->store->sessions, &cur, NULL))) {
    uint64_t waiting = ckv_moves_pending(sess);
    if ((sess->stalled_on != CKV_ERR_QUOTA && sess->stalled_on != CKV_ERR_NOSPACE) || !waiting || sess->doomed ||
        sess->quarantined || ckv_tier_state_of(sess) != CKV_TIER_RESIDENT)
      continue;
    const ckv_tenant *tn = sess->tenant;
    uint64_t freeing;
    unsigned started = pressure_moves(p, tn, sess, /* short_by= */ 1, &freeing); /* the coldest one */
    if (!started) continue;
    ckv_log(CKV_LOG_NOTICE, "tier-pressure", tn->name, sess->id,
            "compression stalled on the tenant %s (%llu tokens wait for their moves; %llu of %llu bytes used): "
            "moving its coldest other session (%llu bytes) to disk before anything is recycled",
            sess->stalled_on == CKV_ERR_QUOTA ? "quota" : "arena (no free range for a destination block)",
            (unsigned long long)waiting, (unsigned long long)tn->bytes_used, (unsigned long long)tn->quota_bytes,
            (unsigned long long)freeing);
    return;
  }
}

/* After pressure moves landed: sessions whose moves waited for memory try again. */
static void replan_stalled(ckv_persist *p) {
  size_t cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(p->store->sessions, &cur, NULL)))
    if (sess->stalled_on && !sess->doomed && ckv_tier_state_of(sess) == CKV_TIER_RESIDENT)
      ckv_moves_plan(sess, p->store->compressor, /* flush= */ false);
}

int ckv_tier_make_room(ckv_persist *p, ckv_srv_session *sess, uint64_t need, bool can_wait) {
  ckv_tier *t = p->tier;
  ckv_tenant *tn = sess->tenant;
  if (!t || !t->pressure || t->replaying || !p->snapio || !can_wait || ckv_tenant_would_fit(tn, need)) return CKV_OK;
  uint64_t short_by = tn->bytes_used - tn->held_bytes + need - tn->quota_bytes, freeing;
  unsigned started = pressure_moves(p, tn, sess, short_by, &freeing);
  if (!started && !t->pressure_inflight) return CKV_OK; /* nothing can go: the old way */
  if (started)
    ckv_log(CKV_LOG_NOTICE, "tier-pressure", tn->name, sess->id,
            "tenant quota short by %llu bytes (%llu of %llu used, %llu asked): moving its %u coldest other "
            "session%s (%llu bytes) to disk before anything is recycled; the request waits for them",
            (unsigned long long)short_by, (unsigned long long)tn->bytes_used, (unsigned long long)tn->quota_bytes,
            (unsigned long long)need, started, started == 1 ? "" : "s", (unsigned long long)freeing);
  return CKV_TIER_PARK;
}

void ckv_tier_forget(ckv_persist *p, ckv_srv_session *sess) {
  ckv_tier_slot *slot = sess->tier;
  if (!slot) return;
  sess->tier = NULL;
  char msg[256];
  snprintf(msg, sizeof msg, "session '%s' was dropped while it was brought back from disk", sess->id);
  session_ready(p, sess->tenant, sess->id, CKV_ERR_NOT_FOUND, msg);
  ckv_tier *t = p->tier;
  bool on_disk = slot->state == CKV_TIER_ON_DISK || slot->state == CKV_TIER_PUSHING ||
                 (slot->state == CKV_TIER_RESTORING && !slot->remote_copy);
  if (t && on_disk) {
    t->disk_bytes -= slot->file_bytes < t->disk_bytes ? slot->file_bytes : t->disk_bytes;
    remove_file(p, sess->tenant, sess->id); /* behind a read in flight: that one finds no session */
  } else if (t && slot->remote_copy) {
    remove_remote(p, sess); /* a push in flight deletes its own copy when it finds no session */
  }
  free(slot);
}

void ckv_tier_resumed(ckv_persist *p, const ckv_srv_session *sess, bool from_remote) {
  ckv_tier *t = p->tier;
  if (!t) return;
  char key[256];
  ckv_store_session_key(sess->tenant, sess->id, key, sizeof key);
  forget_leftover(t, key);
  tenant_counts *tc = counts_of(t, sess->tenant);
  if (from_remote) {
    tc->remote_restores++;
    tc->remote_restore_tokens += sess->tokens.n;
  } else {
    tc->restores++;
    tc->restore_tokens += sess->tokens.n;
  }
  remove_file(p, sess->tenant, sess->id);
  remove_remote(p, sess); /* also a copy a push cut short by a stop left in the store */
}

/* ---- figures ------------------------------------------------------------- */

void ckv_tier_get_stats(const ckv_persist *p, const ckv_tenant *tenant, ckv_tier_stats *ret) {
  memset(ret, 0, sizeof(*ret));
  const ckv_tier *t = p->tier;
  if (!t) return;
  ret->capacity = t->on ? t->cap : 0;
  ret->remote_on = t->remote != NULL;
  for (size_t i = 0; i < t->n_tc; i++) {
    const tenant_counts *c = &t->tc[i];
    if (tenant && c->tenant != tenant) continue;
    ret->offloads += c->offloads;
    ret->offload_bytes += c->offload_bytes;
    ret->restores += c->restores;
    ret->restore_bytes += c->restore_bytes;
    ret->restore_tokens += c->restore_tokens;
    ret->cancelled += c->cancelled;
    ret->refused += c->refused;
    ret->errors += c->errors;
    ret->pressure_moves += c->pressure_moves;
    ret->pushes += c->pushes;
    ret->push_bytes += c->push_bytes;
    ret->remote_restores += c->remote_restores;
    ret->remote_restore_bytes += c->remote_restore_bytes;
    ret->remote_restore_tokens += c->remote_restore_tokens;
    ret->remote_errors += c->remote_errors;
  }
  size_t cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(p->store->sessions, &cur, NULL))) {
    if ((tenant && sess->tenant != tenant) || !sess->tier) continue;
    ckv_tier_state st = sess->tier->state;
    if (st == CKV_TIER_RESIDENT || st == CKV_TIER_OFFLOADING) continue;
    bool remote = sess->tier->remote_copy;
    if (remote) {
      ret->remote_sessions++;
      ret->remote_bytes += sess->tier->file_bytes;
    } else {
      ret->disk_sessions++;
      ret->disk_bytes += sess->tier->file_bytes;
    }
    uint64_t *b5 = remote ? ret->remote_resident_bytes5 : ret->resident_bytes5;
    for (int k = 0; k < 5; k++) b5[k] += sess->tier->bytes5[k];
  }
  const char *key;
  const uint64_t *b;
  cur = 0;
  size_t tl = tenant ? strlen(tenant->name) : 0;
  while ((b = ckv_strmap_next(t->leftovers, &cur, &key))) {
    if (tenant && (strncmp(key, tenant->name, tl) != 0 || key[tl] != '/')) continue;
    ret->disk_bytes += *b;
  }
}
