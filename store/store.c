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

ckv_tenant *ckv_store_tenant(ckv_store *st, const ckv_tenant_spec *spec, int *ret_status) {
  ckv_tenant *t = ckv_store_find_tenant(st, spec->name);
  if (t) return t;
  /* The budget: every arena comes out of memory_bytes, in whole chunks, so
   * that their sizes (what a GPU must really hold) never add up to more. */
  const uint64_t align = CKV_TENANT_ARENA_ALIGN, memory = st->limits.memory_bytes;
  uint64_t used = ckv_store_arenas_bytes(st);
  uint64_t left = memory > used ? (memory - used) / align * align : 0;
  uint64_t want = spec->quota_bytes ? ckv_tenant_arena_for_quota(spec->quota_bytes)
                                    : spec->arena_bytes ? spec->arena_bytes / align * align : left;
  uint64_t arena = want < left ? want : left;
  if (arena < CKV_TENANT_ARENA_MIN) {
    ckv_log(CKV_LOG_ERROR, "tenant-refused", spec->name, NULL,
            "no memory left for an arena: the %zu tenants' arenas hold %llu of the daemon's %llu bytes "
            "([daemon] memory), %llu left, an arena needs at least %llu",
            st->n_tenants, (unsigned long long)used, (unsigned long long)memory, (unsigned long long)left,
            (unsigned long long)CKV_TENANT_ARENA_MIN);
    *ret_status = CKV_ERR_NOSPACE;
    return NULL;
  }
  uint64_t holds = ckv_tenant_quota_for_arena(arena);
  uint64_t quota = spec->quota_bytes && spec->quota_bytes < holds ? spec->quota_bytes : holds;
  if (spec->quota_bytes && quota < spec->quota_bytes)
    ckv_log(CKV_LOG_WARNING, "quota-cut", spec->name, NULL,
            "quota of %llu bytes cut to %llu: only %llu bytes of the daemon's memory ([daemon] memory, %llu) "
            "are left for its arena",
            (unsigned long long)spec->quota_bytes, (unsigned long long)quota, (unsigned long long)left,
            (unsigned long long)memory);
  int r = ckv_store_reserve_tenant(st);
  if (r == CKV_OK) r = ckv_tenant_new(spec->name, quota, arena, (uint32_t)st->n_tenants + 1, st->limits.backend, &t);
  if (r < 0) {
    *ret_status = r;
    return NULL;
  }
  if (ckv_arena_size(t->arena) > left) { /* a backend granularity above the chunk size */
    ckv_log(CKV_LOG_ERROR, "tenant-refused", spec->name, NULL,
            "the backend made an arena of %llu bytes where %llu were left of the daemon's memory",
            (unsigned long long)ckv_arena_size(t->arena), (unsigned long long)left);
    ckv_tenant_free(t);
    *ret_status = CKV_ERR_NOSPACE;
    return NULL;
  }
  ckv_store_add_tenant(st, t, spec); /* its arena to systemd's fd store: a restart keeps it */
  ckv_log(CKV_LOG_INFO, "tenant-up", t->name, NULL,
          "arena %u of %llu bytes (%s), quota %llu bytes; %llu of %llu bytes of memory left", t->arena_id,
          (unsigned long long)ckv_arena_size(t->arena), ckv_arena_kind(t->arena), (unsigned long long)quota,
          (unsigned long long)(left - ckv_arena_size(t->arena)), (unsigned long long)memory);
  return t;
}

int ckv_store_reserve_tenant(ckv_store *st) {
  ckv_tenant **nt = realloc(st->tenants, (st->n_tenants + 1) * sizeof(*nt));
  if (!nt) return -ENOMEM;
  st->tenants = nt;
  return CKV_OK;
}

void ckv_store_add_tenant(ckv_store *st, ckv_tenant *t, const ckv_tenant_spec *spec) {
  t->max_sessions = spec->max_sessions ? spec->max_sessions : st->limits.max_sessions;
  t->max_clients = spec->max_clients;
  t->quota_disk = spec->quota_disk;
  t->high_water = spec->high_water;
  t->max_snapshots = spec->max_snapshots;
  t->policies = spec->policies;
  t->default_policy = spec->default_policy;
  if (st->limits.mem) t->mem = st->limits.mem;
  st->tenants[st->n_tenants++] = t;
  if (st->hooks && st->hooks->tenant_up) st->hooks->tenant_up(st->hooks_ctx, t);
}

int ckv_store_add_session(ckv_store *st, ckv_srv_session *sess, uint64_t owner) {
  char key[256];
  ckv_store_session_key(sess->tenant, sess->id, key, sizeof(key));
  sess->dirty_head = &st->dirty_head;
  if (ckv_strmap_put(st->sessions, key, sess) < 0) {
    sess->dirty_head = NULL;
    ckv_srv_session_free(sess);
    return -ENOMEM;
  }
  sess->owner = owner;
  sess->lane = ++st->next_lane;
  sess->tenant->n_sessions++;
  return CKV_OK;
}

int ckv_store_replace_session(ckv_store *st, ckv_srv_session *old, ckv_srv_session *ns) {
  char key[256];
  ckv_store_session_key(old->tenant, old->id, key, sizeof(key));
  if (ckv_strmap_put(st->sessions, key, ns) < 0) {
    ns->dirty_head = NULL;
    ckv_srv_session_free(ns);
    return -ENOMEM;
  }
  ns->owner = old->owner;
  ns->detached_at_ms = old->detached_at_ms;
  ns->lane = old->lane;
  ns->job_failures = old->job_failures;
  ns->dirty_head = &st->dirty_head;
  ckv_srv_session_free(old);
  return CKV_OK;
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
