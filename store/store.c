/* store.c - see store.h. */
#include "store/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "common/strmap.h"
#include "shm/arena.h"
#include "store/compressor.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/tenant.h"

int ckv_store_init(ckv_store *st, const ckv_store_hooks *hooks, void *hooks_ctx) {
  *st = (ckv_store){.hooks = hooks, .hooks_ctx = hooks_ctx};
  return ckv_strmap_new(&st->sessions) < 0 ? -ENOMEM : CKV_OK;
}

int ckv_store_start_compressor(ckv_store *st, unsigned threads, unsigned depth) {
  return ckv_compressor_new(threads, depth, &st->compressor);
}

void ckv_store_stop_compressor(ckv_store *st) { st->compressor = ckv_compressor_free(st->compressor); }

void ckv_store_drop_all(ckv_store *st) {
  if (!st->sessions) return;
  size_t cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(st->sessions, &cur, NULL))) {
    sess->jobs_inflight = 0; /* the compressor is stopped: nothing writes its blocks */
    ckv_store_drop_session(st, sess);
  }
}

void ckv_store_done(ckv_store *st) {
  for (size_t i = 0; i < st->n_doomed; i++) ckv_srv_session_free(st->doomed[i]);
  free(st->doomed);
  for (size_t i = 0; i < st->n_tenants; i++) ckv_tenant_free(st->tenants[i]);
  free(st->tenants);
  st->sessions = ckv_strmap_free(st->sessions);
  *st = (ckv_store){0};
}

void ckv_store_session_key(const ckv_tenant *t, const char *id, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", t->name, id);
}

ckv_srv_session *ckv_store_session(const ckv_store *st, const ckv_tenant *t, const char *id) {
  char key[256];
  ckv_store_session_key(t, id, key, sizeof(key));
  return ckv_strmap_get(st->sessions, key);
}

ckv_tenant *ckv_store_find_tenant(const ckv_store *st, const char *name) {
  for (size_t i = 0; i < st->n_tenants; i++)
    if (strcmp(st->tenants[i]->name, name) == 0) return st->tenants[i];
  return NULL;
}

uint64_t ckv_store_arenas_bytes(const ckv_store *st) {
  uint64_t sum = 0;
  for (size_t i = 0; i < st->n_tenants; i++) sum += ckv_arena_size(st->tenants[i]->arena);
  return sum;
}

void ckv_store_drop_session(ckv_store *st, ckv_srv_session *sess) {
  if (st->hooks && st->hooks->session_gone) st->hooks->session_gone(st->hooks_ctx, sess);
  char key[256];
  ckv_store_session_key(sess->tenant, sess->id, key, sizeof(key));
  if (ckv_strmap_get(st->sessions, key) == sess) ckv_strmap_del(st->sessions, key);
  sess->tenant->n_sessions--;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) sess->tenant->transitions_gone[i][j] += sess->transitions[i][j];
  if (sess->jobs_inflight) {
    /* a compressor thread may be writing its blocks: free when its jobs are back */
    if (st->n_doomed == st->cap_doomed) {
      size_t ncap = st->cap_doomed ? st->cap_doomed * 2 : 8;
      ckv_srv_session **nd = realloc(st->doomed, ncap * sizeof(*nd));
      if (!nd) {
        ckv_compressor_drain_lane(st->compressor, sess->lane);
        ckv_store_collect_jobs(st);
        ckv_srv_session_free(sess);
        return;
      }
      st->doomed = nd;
      st->cap_doomed = ncap;
    }
    sess->doomed = true;
    st->doomed[st->n_doomed++] = sess;
    return;
  }
  ckv_srv_session_free(sess);
}

void ckv_store_collect_jobs(ckv_store *st) {
  ckv_job *j = ckv_compressor_collect(st->compressor);
  while (j) {
    ckv_job *next = j->next;
    ckv_srv_session *sess = j->owner;
    if (st->hooks && st->hooks->job_done) st->hooks->job_done(st->hooks_ctx, sess, j);
    if (j->status < 0 && !sess->doomed && ckv_moves_job_failed(sess, j->status))
      ckv_log(CKV_LOG_ERROR, "session-quarantined", sess->tenant->name, sess->id,
              "quarantined: %s (%zu tokens); its tokens stay where they are, appends and reports are refused "
              "until it is dropped",
              sess->quarantine_reason, j->n_moves);
    else if (j->status < 0 && !sess->doomed)
      ckv_log(CKV_LOG_WARNING, "compress-failed", sess->tenant->name, sess->id,
              "moving %zu tokens failed (%u in a row): %s; retried", j->n_moves, sess->job_failures,
              ckv_strerror(j->status));
    ckv_moves_publish(sess, st->compressor, j);
    j = next;
  }
  for (size_t i = 0; i < st->n_doomed;) {
    if (st->doomed[i]->jobs_inflight == 0) {
      ckv_srv_session_free(st->doomed[i]);
      st->doomed[i] = st->doomed[--st->n_doomed];
    } else {
      i++;
    }
  }
}

void ckv_store_settle_session(ckv_store *st, ckv_srv_session *sess) {
  while (sess->jobs_inflight) {
    ckv_compressor_drain_lane(st->compressor, sess->lane);
    ckv_store_collect_jobs(st);
  }
}
