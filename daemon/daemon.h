/* daemon.h - the daemon's state, types only: its options, the server (the
 * loop's sockets, the store and persist/ it owns, the clients), a client
 * connection, a deferred reply's address, the counters.
 *
 * The modules of the process work on these: server.c (the loop), attach.c
 * (clients come and go), handlers.c (one request), parked.c (requests
 * waiting for their session), reply.c (a reply finished and sent),
 * server_metrics.c (the metrics page).  One thread, the loop, owns all of it. */
#ifndef CKV_DAEMON_DAEMON_H
#define CKV_DAEMON_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/attach_frame.h"
#include "daemon/wire.h"
#include "persist/persist.h"
#include "store/store.h"

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_strmap ckv_strmap;
typedef struct ckv_arena_backend ckv_arena_backend;
typedef struct ckv_compressor ckv_compressor;
typedef struct ckv_judge_params ckv_judge_params;
typedef struct ckv_blockmem ckv_blockmem;
typedef struct ckv_srv_session ckv_srv_session;

#define CKV_PROTOCOL_VERSION 1u

/* Requests over max_message are answered CKV_ERR_TOO_LARGE and dropped
 * undecoded, which needs ZeroMQ to deliver them: its own limit
 * (ZMQ_MAXMSGSIZE, which silently drops the peer's connection) sits at this
 * hard cap instead, so no frame above it is ever buffered. */
static inline int64_t ckv_transport_cap(uint64_t max_message) { return (int64_t)(2 * max_message + (64u << 10)); }
#define CKV_KEY_BYTES 16u
/* Attach connections whose request has not arrived yet, per uid and in all.
 * One uid's idle or half-sent connections beyond its share are refused at
 * accept (CKV_ERR_LIMIT), so they cannot crowd out other users' attaches.
 * Admin peers (root, the daemon's own uid) count only against the total: they
 * can stop the daemon anyway, and a burst of their workers must not be
 * refused. */
#define CKV_PENDING_ATTACH_PER_UID 8u
#define CKV_PENDING_ATTACH_MAX 256u
/* Connections refused before their request was read linger this many at
 * most (the oldest goes first), so the request a client sends after the
 * refusal is accepted by the kernel and the client reads why it was refused
 * instead of EPIPE. */
#define CKV_REFUSED_ATTACH_MAX 256u

/* Maps a peer's credentials to a tenant; false = refuse the attach. */
typedef bool (*ckv_tenant_resolver)(void *ctx, uint32_t uid, uint32_t gid, ckv_tenant_spec *ret);

typedef struct ckv_server_options {
  const char *socket;         /* ZeroMQ endpoint, e.g. ipc:///run/commitkv/commitkvd.sock */
  const char *attach_socket;  /* unix socket path */
  const char *backend;        /* "host" (auto resolves before this) */
  const char *backend_reason; /* why this backend: shown by `commitkvctl status` */
  const ckv_blockmem *mem;    /* how the daemon writes arena memory (blockmem.h); NULL: host, in place */
  uint64_t memory_bytes;      /* all tenants' arenas together: their sizes never add up to more */
  const char *state_dir;
  /* The disk tier (tier.h): sessions no request named for disk_idle_ms move
   * to files under state_dir, at most disk_memory bytes of them; either 0 = off. */
  uint64_t disk_idle_ms, disk_memory;
  /* The remote tier: a session on disk no request named for remote_idle_ms
   * more moves on to `remote` (0 or no store: never). */
  uint64_t remote_idle_ms;
  bool disk_pressure; /* under quota pressure the coldest sessions move down first (needs disk_memory) */
  uint32_t lease_ms, heartbeat_ms;
  uint64_t detach_keep_ms;
  /* Autosave (autosave.h): each live session that changed is saved to
   * state_dir/autosave at most every autosave_ms (0 = off). */
  uint64_t autosave_ms;
  /* The continuous warm journal (persist/warmjournal.h): changed sessions
   * journaled this often; 0 = only at a clean stop. */
  uint64_t warm_journal_ms;
  uint64_t warm_journal_delay_ms; /* a held reply's batch waits this long for more changes */
  uint32_t max_clients;  /* attached clients, all tenants together */
  uint32_t max_sessions; /* per tenant */
  uint64_t max_message;  /* larger requests are answered CKV_ERR_TOO_LARGE; ZMQ_MAXMSGSIZE is 2x + 64K */
  uint64_t max_tokens_per_session;
  uint32_t max_append;   /* tokens per AppendTokens */
  uint32_t draft_block_tokens, commit_block_tokens;
  unsigned compress_threads, compress_queue;
  const char *metrics; /* Prometheus endpoint "HOST:PORT"; "" = off */
  /* The remote store snapshots also go to (remote.h), owned by the
   * caller and outliving the server; NULL = none. */
  struct ckv_remote *remote;
  /* Policy parameters new sessions start from (owned by the caller, who may
   * change them between loop iterations, e.g. on SIGHUP). */
  const ckv_judge_params *policy;
  ckv_tenant_resolver resolve_tenant;
  void *resolve_ctx;
  /* Called once after sockets and arenas are up (sd_notify READY=1), then
   * about every `tick_ms` from the loop (watchdog, status). May be NULL. */
  void (*on_ready)(void *ctx);
  void (*on_tick)(void *ctx, const char *status_line);
  void *notify_ctx;
  uint32_t tick_ms;
} ckv_server_options;

/* A connected client: attached over the unix socket, talking over ZeroMQ. */
typedef struct ckv_conn {
  uint64_t id;
  uint8_t key[CKV_KEY_BYTES]; /* attach key == ZeroMQ routing id */
  char keyhex[2 * CKV_KEY_BYTES + 1];
  ckv_tenant *tenant;
  uint32_t uid, gid, pid;
  char name[64];
  int attach_fd;          /* kept open: EOF means the process is gone */
  uint64_t last_seen_ms;
  bool admin;
  bool wants_arenas; /* attached with want_arenas: refreshes send the fds again */
  bool hello;
  uint32_t version;
  uint32_t io_inflight; /* requests waiting for the snapshot I/O thread: the client waits, it is not silent */
  ckv_attach_frame frame;     /* an AttachRequest{refresh} arriving on attach_fd */
  uint64_t frame_deadline_ms; /* when that frame must be complete (set at its first byte) */
} ckv_conn;

/* An accepted attach connection whose AttachRequest is still arriving. */
typedef struct ckv_pending_attach {
  int fd;                 /* non-blocking */
  uint32_t uid, gid, pid; /* SO_PEERCRED, read at accept */
  bool admin;
  uint64_t deadline_ms; /* the whole frame must be in by then */
  ckv_attach_frame frame;
} ckv_pending_attach;

/* Where a reply goes that is sent after the request was served (deferred:
 * it waits for the snapshot I/O thread, snapio.h).  The client is looked up
 * again by key and id when the reply is ready: it may be gone by then. */
typedef struct ckv_reply_to {
  char keyhex[2 * CKV_KEY_BYTES + 1]; /* the routing id, as s->conns keys it */
  uint64_t conn_id;
  uint64_t request_id;
  bool delim; /* the request came as [identity][empty][payload] (REQ sockets) */
} ckv_reply_to;

/* "tenant/id" of a session a held reply waits for (held.h). */
#define CKV_HELD_KEY_MAX 400

/* A handler's answer meaning "the reply comes later" (not an error). */
#define CKV_REPLY_DEFERRED 1

typedef struct ckv_counters {
  uint64_t requests, errors, rounds, leases_expired, attaches, attach_refused;
  /* Session lifetimes: detached (client gone or CloseSession), resumed by a
   * client, freed after detach_keep without one. */
  uint64_t sessions_detached, sessions_resumed, sessions_expired;
  uint64_t transitions[4][4]; /* of sessions already gone; live ones keep their own */
  uint64_t semantic_given;    /* likewise: tokens with a worker's semantic score */
} ckv_counters;

typedef struct ckv_server {
  ckv_server_options opt;
  const ckv_arena_backend *backend;
  void *zctx, *router;
  int attach_fd, signal_fd;
  int lock_fd; /* instance lock (instance.h), held for the daemon's life */
  uint8_t boot_token[16];
  uint64_t start_ms;
  uint64_t next_conn_id;
  ckv_store store;   /* the KV in memory: tenants, sessions, compressor (store/store.h) */
  ckv_strmap *conns; /* keyhex -> ckv_conn */
  ckv_persist persist; /* the KV beyond memory: the I/O thread, tiers, autosave, warm restart (persist/persist.h) */
  struct ckv_parked *parked; /* requests waiting for their session or for room (parked.h) */
  /* The request being served by serve_one: handlers that hand work to the
   * I/O thread copy it and answer CKV_REPLY_DEFERRED, which sets
   * reply_deferred.  reply_armed is false outside serve_one (the request
   * fuzzer): then handlers do the I/O on the calling thread. */
  ckv_reply_to reply_to;
  bool reply_armed, reply_deferred;
  /* Replies held until the warm journal holds their change (held.h), in
   * the order they were held, and the note of the request being served
   * (hold_need 0: its reply goes at once). */
  struct ckv_held_reply *held_head, **held_tail;
  size_t n_held;
  char hold_key[CKV_HELD_KEY_MAX];
  uint64_t hold_need;
  struct ckv_metrics *metrics;
  struct ckv_trace *trace; /* mlp-judge training traces, or NULL (owned by the caller) */
  bool attach_inherited; /* the attach socket came from systemd (socket activation) */
  uint64_t last_metrics_ms;
  ckv_pending_attach *pending; /* accepted attach connections whose request has not arrived */
  size_t n_pending, cap_pending;
  struct ckv_refused_attach {
    int fd;
    uint64_t close_ms;
  } refused[CKV_REFUSED_ATTACH_MAX]; /* answered; what they still send is dropped unread */
  size_t n_refused;
  uint64_t refusal_logged_ms; /* attach refusals are logged at most once a second ... */
  uint64_t refusals_unlogged; /* ... and counted in between */
  ckv_wire_arena in;    /* decode arena (capped) */
  ckv_wire_arena out;   /* reply scratch */
  ckv_counters counters;
  bool stopping;
  bool reload_requested;
} ckv_server;

#endif
