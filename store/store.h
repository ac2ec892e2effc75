/* store.h - the KV in memory as one object: the tenants (each with its arena
 * and quota), the live sessions by tenant and id, the compressor that moves
 * their tokens, and the sessions dropped while a compressor job still writes
 * their blocks ("doomed": freed when the job is back).  The daemon embeds one
 * (ckv_server.store); persist/ and the request handlers work on sessions
 * through it.  Single-threaded: the server loop owns it (the compressor's
 * threads only run jobs it hands them).
 *
 * What the rooms above must learn of a store event (the disk tier forgets a
 * dropped session, the metrics time a finished job) reaches them through
 * ckv_store_hooks, so the store includes nothing of theirs. */
#ifndef CKV_STORE_STORE_H
#define CKV_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_compressor ckv_compressor;
typedef struct ckv_job ckv_job;
typedef struct ckv_strmap ckv_strmap;
typedef struct ckv_arena_backend ckv_arena_backend;
typedef struct ckv_blockmem ckv_blockmem;

/* What the daemon knows of a tenant before it exists at run time. */
typedef struct ckv_tenant_spec {
  const char *name;
  uint64_t quota_bytes;   /* 0 = what its arena holds */
  uint64_t arena_bytes;   /* its share of memory_bytes; 0 = all that is left (the store cuts it to that) */
  uint32_t max_sessions;  /* 0 = the daemon-wide limit */
  uint32_t max_clients;   /* attached clients of this tenant; 0 = only the daemon's max_clients */
  uint64_t quota_disk;    /* bytes of its files in the state directory; 0 = no cap */
  uint32_t max_snapshots; /* snapshot files it may keep; 0 = no limit */
  uint32_t policies;      /* bit per allowed ckv_policy_id; 0 = all */
  int default_policy;     /* ckv_policy_id, or -1 = the daemon default */
  double high_water;      /* fraction of quota_bytes above which the coldest sessions move down early; 0 = off */
} ckv_tenant_spec;

/* Every slot may be NULL. */
typedef struct ckv_store_hooks {
  /* A session leaves the store (dropped, expired, replaced): before its key
   * is removed, while it is still whole. */
  void (*session_gone)(void *ctx, ckv_srv_session *sess);
  /* A compressor job came back (before it is published). */
  void (*job_done)(void *ctx, ckv_srv_session *sess, const ckv_job *job);
  /* A tenant joined the store (created or adopted): its arena may go to
   * systemd's fd store. */
  void (*tenant_up)(void *ctx, ckv_tenant *t);
} ckv_store_hooks;

/* What bounds the store, set by its owner before the first tenant. */
typedef struct ckv_store_limits {
  uint64_t memory_bytes;         /* all tenants' arenas together */
  uint32_t max_sessions;         /* per tenant, unless its spec says otherwise */
  const ckv_arena_backend *backend; /* where new arenas come from */
  const ckv_blockmem *mem;       /* how arena memory is written (NULL: host, in place) */
} ckv_store_limits;

typedef struct ckv_store {
  ckv_tenant **tenants; /* in creation order; tenant i has arena id i + 1 */
  size_t n_tenants;
  ckv_strmap *sessions; /* "tenant/id" (ckv_store_session_key) -> ckv_srv_session */
  ckv_compressor *compressor;
  ckv_srv_session **doomed; /* dropped while compressor jobs were in flight */
  size_t n_doomed, cap_doomed;
  ckv_srv_session *dirty_head; /* sessions whose header shadows wait for a flush */
  uint64_t next_block_id;      /* block ids handed to new sessions' tables */
  uint64_t next_lane;          /* compressor lanes handed to new sessions */
  ckv_store_limits limits;
  const ckv_store_hooks *hooks;
  void *hooks_ctx;
} ckv_store;

/* An empty store, no compressor yet.  Returns CKV_OK or -ENOMEM. */
int ckv_store_init(ckv_store *st, const ckv_store_hooks *hooks, void *hooks_ctx);
/* Starts the compressor: `threads` threads, `depth` queued jobs at most
 * (ckv_compressor_new; the threads inherit the caller's signal mask). */
int ckv_store_start_compressor(ckv_store *st, unsigned threads, unsigned depth);
/* Stops the compressor: no thread writes a block after it returns. */
void ckv_store_stop_compressor(ckv_store *st);
/* Drops every session (hooks->session_gone for each), jobs in flight or not:
 * call after ckv_store_stop_compressor. */
void ckv_store_drop_all(ckv_store *st);
/* Frees what is left: doomed sessions, every tenant with its arena, the map. */
void ckv_store_done(ckv_store *st);

/* "tenant/id" into buf: the key of st->sessions. */
void ckv_store_session_key(const ckv_tenant *t, const char *id, char *buf, size_t len);
/* The session `id` of tenant t, or NULL. */
ckv_srv_session *ckv_store_session(const ckv_store *st, const ckv_tenant *t, const char *id);
/* The tenant named `name`, or NULL. */
ckv_tenant *ckv_store_find_tenant(const ckv_store *st, const char *name);
/* Bytes the tenants' arenas hold now. */
uint64_t ckv_store_arenas_bytes(const ckv_store *st);

/* The run-time tenant for spec->name, created on first use with an arena cut
 * from what is left of limits.memory_bytes: spec->arena_bytes (or, without
 * it, all that is left), never more than is left; its quota is
 * spec->quota_bytes cut to what the arena holds.  NULL with *ret_status =
 * CKV_ERR_NOSPACE when less than CKV_TENANT_ARENA_MIN is left, -ENOMEM, or
 * the arena's error. */
ckv_tenant *ckv_store_tenant(ckv_store *st, const ckv_tenant_spec *spec, int *ret_status);
/* Room in st->tenants for one more (a tenant adopted from elsewhere, warm
 * restart): CKV_OK or -ENOMEM.  Its arena id is then st->n_tenants + 1. */
int ckv_store_reserve_tenant(ckv_store *st);
/* Tenant t (made with arena id st->n_tenants + 1, after
 * ckv_store_reserve_tenant) joins the store with the limits of spec (its
 * name, quota and arena are t's already); hooks->tenant_up. */
void ckv_store_add_tenant(ckv_store *st, ckv_tenant *t, const ckv_tenant_spec *spec);

/* Session sess (of sess->tenant, not in the store) joins it under its key,
 * read by client `owner` (0: detached), in a compressor lane of its own.
 * CKV_OK, or -ENOMEM with sess freed. */
int ckv_store_add_session(ckv_store *st, ckv_srv_session *sess, uint64_t owner);
/* Session ns (rebuilt from a copy of old, not in the store) takes old's
 * place: its key, reader, lane, detach time and failure count; old (which
 * holds no compressor job) is freed.  CKV_OK, or -ENOMEM with ns freed and
 * old left in place. */
int ckv_store_replace_session(ckv_store *st, ckv_srv_session *old, ckv_srv_session *ns);

/* Drops sess from the store: hooks->session_gone, its key, its tenant's
 * count, its totals into the store's; freed now, or once its compressor jobs
 * are back (doomed). */
void ckv_store_drop_session(ckv_store *st, ckv_srv_session *sess);
/* Publishes every finished compressor job, then frees the doomed sessions
 * whose jobs are all back. */
void ckv_store_collect_jobs(ckv_store *st);
/* Waits for sess's jobs and publishes them. */
void ckv_store_settle_session(ckv_store *st, ckv_srv_session *sess);

#endif
