/* service.c - see service.h. */
#include "persist/service.h"

#include <stdio.h>

#include "commitkv/status.h"
#include "persist/autosave.h"
#include "persist/diskuse.h"
#include "persist/fencejob.h"
#include "persist/incarnations.h"
#include "persist/snapio.h"
#include "persist/statefile.h"
#include "persist/tier.h"
#include "persist/warm.h"
#include "persist/warmjournal.h"
#include "store/session.h"
#include "store/tenant.h"

int ckv_persist_init(ckv_persist *p, ckv_store *st, const ckv_persist_options *opt, const ckv_persist_hooks *hooks,
                     char *err, size_t errlen) {
  *p = (ckv_persist){.opt = *opt, .store = st};
  if (hooks) p->hooks = *hooks;
  /* a state directory others can write is refused: they could plant a session for any tenant to resume */
  int r = ckv_statefile_check_root(opt->state_dir, err, errlen);
  if (r < 0) return r;
  if ((r = ckv_incarnations_open(opt->state_dir, &p->incarnations, err, errlen)) < 0) return r;
  if ((r = ckv_diskuse_new(&p->diskuse)) < 0 || (r = ckv_fences_new(&p->fences)) < 0) {
    snprintf(err, errlen, "out of memory");
    return r;
  }
  r = ckv_snapio_new(CKV_SNAPIO_DEPTH, &p->snapio);
  if (r < 0) {
    snprintf(err, errlen, "cannot start the snapshot I/O thread: %s", ckv_strerror(r));
    return r;
  }
  if ((r = ckv_tier_new(opt->disk_idle_ms, opt->disk_memory, opt->disk_pressure, opt->state_dir, &p->tier)) < 0) {
    snprintf(err, errlen, "out of memory");
    return r;
  }
  ckv_tier_set_remote(p->tier, opt->remote, opt->remote_idle_ms);
  if ((r = ckv_warm_journal_new(p)) < 0) {
    snprintf(err, errlen, "cannot start the warm journal's writer thread: %s", ckv_strerror(r));
    return r;
  }
  return CKV_OK;
}

void ckv_persist_startup(ckv_persist *p) {
  ckv_tier_startup(p);     /* sessions on disk a previous run left */
  ckv_autosave_startup(p); /* and crash copies */
  ckv_diskuse_scan(p->diskuse, p->opt.state_dir); /* what each tenant holds there: its quota starts from it */
}

void ckv_persist_warm_start(ckv_persist *p) {
  ckv_warm_start(p);
  if (p->journal && !ckv_warm_journal_first(p)) ckv_warm_discard(p);
}

size_t ckv_persist_warm_stop(ckv_persist *p) {
  ckv_warm_journal_stop(p);
  return ckv_warm_stop(p);
}

void ckv_persist_scan(ckv_persist *p, uint64_t now_ms) {
  ckv_tier_scan(p, now_ms);     /* idle sessions move to disk */
  ckv_autosave_scan(p, now_ms); /* and changed ones get a crash copy */
  ckv_fence_scan(p, now_ms);    /* store fences not written yet are tried again */
  ckv_warm_journal_scan(p, now_ms); /* and the warm journal follows what changed */
}

void ckv_persist_job_done(ckv_persist *p, ckv_snapio_job *j) { j->finish(p, j); }

void ckv_persist_stop_io(ckv_persist *p) { p->snapio = ckv_snapio_free(p->snapio); }

void ckv_persist_done(ckv_persist *p) {
  ckv_warm_journal_free(p);
  ckv_persist_stop_io(p);
  p->fences = ckv_fences_free(p->fences); /* after the I/O thread: its jobs' waiters are in it */
  p->tier = ckv_tier_free(p->tier);
  p->incarnations = ckv_incarnations_free(p->incarnations);
  p->diskuse = ckv_diskuse_free(p->diskuse);
  ckv_warm_forget(p);
}

int ckv_persist_begin_conversation(ckv_persist *p, ckv_srv_session *sess, char *err, size_t errlen) {
  uint64_t inc = ckv_incarnations_new_id();
  int r = ckv_incarnations_set(p->incarnations, sess->tenant->name, sess->id, inc, err, errlen);
  if (r < 0) return r;
  sess->incarnation = inc;
  ckv_fence_publish(p, sess->tenant, sess->id, sess->model_id, sess->model_revision, inc, /* done= */ NULL, NULL);
  return CKV_OK;
}

int ckv_persist_end_conversation(ckv_persist *p, const ckv_srv_session *sess, ckv_fence_done_fn done, void *ctx,
                                 char *err, size_t errlen) {
  int r = ckv_incarnations_set(p->incarnations, sess->tenant->name, sess->id, 0, err, errlen);
  if (r < 0) return r;
  return ckv_fence_publish(p, sess->tenant, sess->id, sess->model_id, sess->model_revision, 0, done, ctx);
}

int ckv_persist_current_conversation(const ckv_persist *p, const ckv_tenant *t, const char *id, uint64_t *ret) {
  return ckv_incarnations_get(p->incarnations, t->name, id, ret);
}
