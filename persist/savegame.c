/* savegame.c - a session saved to and restored from a snapshot, the halves
 * on the loop (see savegame.h). */
#include "persist/savegame.h"

#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "lifecycle/judge.h"
#include "persist/autosave.h"
#include "persist/diskjob.h"
#include "persist/diskuse.h"
#include "persist/incarnations.h"
#include "persist/session_snap.h"
#include "persist/snapshot.h"
#include "persist/tier.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

void ckv_savegame_done(ckv_savegame *g) {
  if (g->persist) ckv_diskuse_release(g->persist->diskuse, g->job.tenant, &g->job.disk_claim); /* never landed */
  if (g->tenant) g->tenant->io_bytes -= g->charged;
  g->charged = 0;
  if (g->pinned) ckv_tenant_unpin(g->tenant);
  g->pinned = false;
  ckv_snap_done(&g->job.snap);
}

void ckv_savegame_address(ckv_persist *p, ckv_tenant *t, uint64_t max_bytes, ckv_savegame *g) {
  snprintf(g->job.state_dir, sizeof g->job.state_dir, "%s", p->opt.state_dir ? p->opt.state_dir : "");
  snprintf(g->job.tenant, sizeof g->job.tenant, "%s", t->name);
  g->job.remote = p->opt.remote;
  g->job.max_bytes = max_bytes;
  g->tenant = t;
  g->persist = p;
}

int ckv_savegame_capture(ckv_persist *p, ckv_srv_session *sess, const char *name, bool committed_only,
                         ckv_savegame *g, char *err, size_t errlen) {
  g->job.kind = CKV_SNAPIO_SAVE;
  g->persist = p;
  snprintf(g->job.tenant, sizeof g->job.tenant, "%s", sess->tenant->name); /* the reservation's (address() sets it again) */
  snprintf(g->job.name, sizeof g->job.name, "%s", name);
  snprintf(g->job.model_id, sizeof g->job.model_id, "%s", sess->model_id);
  snprintf(g->job.model_revision, sizeof g->job.model_revision, "%s", sess->model_revision);
  snprintf(g->id, sizeof g->id, "%s", sess->id);
  g->committed_only = committed_only;
  uint64_t t0 = ckv_now_us();
  int r = ckv_session_snap_capture_pinned(sess, committed_only, &g->job.snap, &g->tokens, err, errlen);
  g->copy_us = ckv_now_us() - t0;
  if (r < 0) return r;
  g->tenant = sess->tenant;
  g->pinned = true; /* from here on, ckv_savegame_done unpins */
  /* Copies waiting for the disk count against the tenant's quota: a client
   * asking for save after save cannot make the daemon hold more than one
   * quota's worth of copies of its tenant. */
  ckv_tenant *t = sess->tenant;
  uint64_t bytes = g->job.snap.buf_len_;
  if (t->io_bytes && t->io_bytes + bytes > t->quota_bytes) {
    snprintf(err, errlen,
             "saves of tenant '%s' holding %llu bytes are waiting for the disk; this one needs %llu more (the quota "
             "is %llu): retry when they are done",
             t->name, (unsigned long long)t->io_bytes, (unsigned long long)bytes, (unsigned long long)t->quota_bytes);
    ckv_savegame_done(g);
    return CKV_ERR_BUSY;
  }
  /* The tenant's disk: the file's exact size, net of the snapshot of that
   * name it replaces, within quota_disk and max_snapshots, refused before
   * any byte is written. */
  int q = ckv_persist_disk_admit(p, t, CKV_DISKUSE_SNAPSHOT, name, ckv_snap_file_size(&g->job.snap), &g->job, err,
                                 errlen);
  if (q < 0) {
    p->counters.disk_refused_saves++;
    ckv_savegame_done(g);
    return q;
  }
  t->io_bytes += bytes;
  g->charged = bytes;
  g->tenant = t;
  return CKV_OK;
}

void ckv_savegame_want_restore(ckv_persist *p, ckv_tenant *t, const char *id, const char *name, const char *model_id,
                               const char *model_revision, const ckv_geometry *geom, bool resume, ckv_savegame *g) {
  g->job.kind = CKV_SNAPIO_LOAD;
  /* a resume finds a session the disk tier held when the daemon stopped */
  g->job.area = resume ? CKV_SNAPIO_TIER_FIRST : CKV_SNAPIO_SNAPSHOT;
  g->job.look_remote_tier = resume && ckv_tier_remote_on(p->tier);
  snprintf(g->job.name, sizeof g->job.name, "%s", name);
  snprintf(g->id, sizeof g->id, "%s", id);
  g->tenant = t;
  g->resume = resume;
  g->check_id = model_id != NULL;
  g->check_rev = model_revision != NULL;
  snprintf(g->model_id, sizeof g->model_id, "%s", model_id ? model_id : "");
  snprintf(g->model_revision, sizeof g->model_revision, "%s", model_revision ? model_revision : "");
  snprintf(g->job.model_id, sizeof g->job.model_id, "%s", g->model_id); /* the store's key */
  snprintf(g->job.model_revision, sizeof g->job.model_revision, "%s", g->model_revision);
  if (geom) g->geom = *geom;
  /* a resume takes only a crash copy of the conversation recorded as current (none when it was ended) */
  uint64_t want = 0;
  if (resume && ckv_incarnations_get(p->incarnations, t->name, id, &want) == CKV_OK) {
    g->job.fence_crash_copies = 1;
    g->job.want_incarnation = want;
  }
}

int ckv_savegame_apply_restore(ckv_persist *p, ckv_savegame *g, uint64_t owner, ckv_srv_session **ret, char *err,
                               size_t errlen) {
  ckv_snapio_job *j = &g->job;
  /* A resume brings back session g->id, whichever copy holds it (the disk or
   * remote tier's, its autosave, its snapshot): a copy of another session
   * stored under its name is refused, never served as this conversation.
   * RestoreSession restores a named snapshot as any id it is asked to. */
  ckv_snap_expect e = {.tenant = g->tenant->name,
                       .session_id = g->resume ? g->id : NULL,
                       .model_id = g->check_id ? g->model_id : NULL,
                       .model_revision = g->check_rev ? g->model_revision : NULL,
                       .geom = g->geom.n_layers ? &g->geom : NULL};
  ckv_srv_session *sess = NULL;
  int r = ckv_snap_check_identity(&j->snap, &e, err, errlen);
  if (r == CKV_OK)
    r = ckv_session_snap_restore(&j->snap, g->id, g->tenant, p->opt.policy ? p->opt.policy->mlp : NULL,
                                 &p->store->next_block_id, &sess, err, errlen);
  bool crash_copy = j->from_tier || j->from_autosave;
  if (r == CKV_OK && crash_copy && j->fence_crash_copies &&
      (!j->want_incarnation || sess->incarnation != j->want_incarnation)) { /* snapio passes these over */
    snprintf(err, errlen, "the crash copy holds incarnation %016llx of session '%s', not its current conversation: "
             "fenced", (unsigned long long)sess->incarnation, g->id);
    ckv_srv_session_free(sess);
    return CKV_ERR_NOT_FOUND;
  }
  if (r < 0) return r;
  if ((r = ckv_srv_session_flush_meta(sess)) < 0) { /* the rebuilt headers, before anyone reads the blocks */
    ckv_srv_session_free(sess);
    snprintf(err, errlen, "cannot write the restored headers: %s", ckv_strerror(r));
    return r;
  }
  /* A restore of a named snapshot is a new conversation of the id; so is a
   * resume from a save game of an earlier (ended or replaced) conversation,
   * or from a copy that carried no incarnation (written before they
   * existed).  Recorded before anything is answered: no copy of another
   * conversation comes back for it.  A resume of the current conversation,
   * or of one never recorded (then recorded as it is), keeps its own. */
  uint64_t current = 0;
  bool recorded = ckv_incarnations_get(p->incarnations, g->tenant->name, g->id, &current) == CKV_OK;
  if (g->resume && sess->incarnation && !recorded &&
      (r = ckv_incarnations_set(p->incarnations, g->tenant->name, g->id, sess->incarnation, err, errlen)) < 0) {
    ckv_srv_session_free(sess);
    return r;
  }
  if (!g->resume || !sess->incarnation || (recorded && current != sess->incarnation)) {
    uint64_t inc = ckv_incarnations_new_id();
    if ((r = ckv_incarnations_set(p->incarnations, g->tenant->name, g->id, inc, err, errlen)) < 0) {
      ckv_srv_session_free(sess);
      return r;
    }
    sess->incarnation = inc;
  }
  if ((r = ckv_store_add_session(p->store, sess, owner)) < 0) {
    snprintf(err, errlen, "out of memory");
    return r;
  }
  ckv_moves_plan(sess, p->store->compressor, /* flush= */ false); /* what waited for a move when it was saved */
  if (j->from_tier) ckv_tier_resumed(p, sess, j->from_tier == 2); /* back in memory: its tier copy goes */
  ckv_autosave_session_new(p, sess, j->from_autosave);
  *ret = sess;
  return CKV_OK;
}
