/* server.h - commitkvd's server: the ZeroMQ ROUTER loop, the attach socket,
 * clients and their leases, tenants and sessions.
 *
 * One thread runs the loop (ckv_server_run); it never blocks on anything but
 * zmq_poll.  Request handlers live in handlers.c, the attach handshake in
 * attach.c; both work on the structures declared here. */
#ifndef CKV_DAEMON_SERVER_H
#define CKV_DAEMON_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"
#include "daemon/attach_frame.h"
#include "daemon/wire.h"

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_strmap ckv_strmap;
typedef struct ckv_arena_backend ckv_arena_backend;
typedef struct ckv_compressor ckv_compressor;
typedef struct ckv_judge_params ckv_judge_params;
typedef struct ckv_blockmem ckv_blockmem;
typedef struct ckv_srv_session ckv_srv_session;

#define CKV_PROTOCOL_VERSION 1u
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

/* What the daemon knows of a tenant before it exists at run time. */
typedef struct ckv_tenant_spec {
  const char *name;
  uint64_t quota_bytes;   /* 0 = what its arena holds */
  uint64_t arena_bytes;   /* its share of memory_bytes; 0 = all that is left (the server cuts it to that) */
  uint32_t max_sessions;  /* 0 = the daemon-wide limit */
  uint32_t max_clients;   /* attached clients of this tenant; 0 = only the daemon's max_clients */
  uint32_t policies;      /* bit per allowed ckv_policy_id; 0 = all */
  int default_policy;     /* ckv_policy_id, or -1 = the daemon default */
} ckv_tenant_spec;

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
  uint32_t max_clients;  /* attached clients, all tenants together */
  uint32_t max_sessions; /* per tenant */
  uint64_t max_message;  /* larger requests are answered CKV_ERR_TOO_LARGE; ZMQ_MAXMSGSIZE is 2x + 64K */
  uint64_t max_tokens_per_session;
  uint32_t max_append;   /* tokens per AppendTokens */
  uint32_t draft_block_tokens, commit_block_tokens;
  unsigned compress_threads, compress_queue;
  const char *metrics; /* Prometheus endpoint "HOST:PORT"; "" = off */
  /* The remote store snapshots also go to (remote_store.h), owned by the
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

/* A handler's answer meaning "the reply comes later" (not an error). */
#define CKV_REPLY_DEFERRED 1

typedef struct ckv_counters {
  uint64_t requests, errors, rounds, leases_expired, attaches, attach_refused;
  /* Session lifetimes: detached (client gone or CloseSession), resumed by a
   * client, freed after detach_keep without one. */
  uint64_t sessions_detached, sessions_resumed, sessions_expired;
  uint64_t transitions[4][4]; /* of sessions already gone; live ones keep their own */
  uint64_t semantic_given;    /* likewise: tokens with a worker's semantic score */
  uint64_t warm_kept, warm_dropped; /* sessions the warm restart at start kept / dropped (warm.h) */
  uint64_t autosaves, autosave_bytes, autosave_errors; /* autosave.h */
  uint64_t autosave_resumes; /* sessions a resume brought back from their autosave */
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
  struct ckv_snapio *snapio; /* the snapshot I/O thread (snapio.h) */
  bool autosave_inflight;    /* an autosave is being written (one at a time) */
  bool autosave_found;       /* state_dir/autosave held files at start (removed as their sessions end) */
  struct ckv_tier *tier;     /* the disk tier's policy and bookkeeping (tier.h) */
  /* The request being served by serve_one: handlers that hand work to the
   * I/O thread copy it and answer CKV_REPLY_DEFERRED, which sets
   * reply_deferred.  reply_armed is false outside serve_one (the request
   * fuzzer): then handlers do the I/O on the calling thread. */
  ckv_reply_to reply_to;
  bool reply_armed, reply_deferred;
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

/* Sets up sockets (binds; stale ipc/unix files are replaced).  Returns
 * CKV_OK or a status with an explanation in err. */
int ckv_server_new(const ckv_server_options *opt, ckv_server **ret, char *err, size_t errlen);
ckv_server *ckv_server_free(ckv_server *s);
/* Runs until SIGTERM/SIGINT (then drains: answers what is queued, detaches
 * every session, closes sockets).  Returns 0 on a clean stop. */
int ckv_server_run(ckv_server *s);
/* True once a SIGHUP asked for a reload; clears the flag. */
bool ckv_server_take_reload(ckv_server *s);

/* Internal API shared by server.c, attach.c and handlers.c. */
/* Formats and publishes the metrics snapshot (server_metrics.c). */
void ckv_server_publish_metrics(ckv_server *s);
/* The run-time tenant for spec->name, created on first use with an arena cut
 * from what is left of memory_bytes: spec->arena_bytes (or, without it, all
 * that is left), never more than is left; its quota is spec->quota_bytes cut
 * to what the arena holds.  NULL with *ret_status = CKV_ERR_NOSPACE when
 * less than CKV_TENANT_ARENA_MIN is left, -ENOMEM, or the arena's error. */
ckv_tenant *ckv_server_tenant(ckv_server *s, const ckv_tenant_spec *spec, int *ret_status);
/* Applies a reloaded spec to live tenant t: quota (cut to what its arena
 * holds: a bigger arena needs a restart), session and client limits,
 * policies.  Logs what changed. */
void ckv_server_retune_tenant(ckv_server *s, ckv_tenant *t, const ckv_tenant_spec *spec);
/* Why a new client of tenant spec (NULL: an admin of no tenant) must be
 * refused for want of a slot, written into buf, or NULL when it may attach:
 * the tenant's max_clients first, then the daemon's (all tenants). */
const char *ckv_server_client_limit(const ckv_server *s, const ckv_tenant_spec *spec, char *buf, size_t len);
/* The client is gone: its sessions are detached, the connection freed, and
 * `why` logged at `level` (a ckv_log_level). */
void ckv_server_drop_conn(ckv_server *s, ckv_conn *c, int level, const char *why);
/* Nobody reads the session any more: kept for resume until detach_keep. */
void ckv_server_detach_session(ckv_server *s, ckv_srv_session *sess);
/* A connection just accepted on the attach socket (non-blocking, attach.c);
 * takes ownership of fd.  A peer that maps to no tenant and is not admin is
 * refused at once (CKV_ERR_AUTH), before anything is read from it; a request
 * already there is served; otherwise the connection waits in s->pending
 * (within the per-uid and total bounds, else CKV_ERR_LIMIT). */
void ckv_attach_accept(ckv_server *s, int fd);
/* Pending attach `i` is readable: reads what arrived and, once the frame is
 * complete or broken, answers it and removes entry i (the last entry moves
 * into its place, so walk the entries from the end). */
void ckv_attach_pending_input(ckv_server *s, size_t i);
/* Refused connection `i` is readable: drops what arrived, unread, and closes
 * it at EOF (removing entry i as ckv_attach_pending_input does). */
void ckv_attach_refused_input(ckv_server *s, size_t i);
/* Closes, with CKV_ERR_TIMEOUT, pending attaches whose deadline passed, and
 * refused connections whose time is up. */
void ckv_attach_expire(ckv_server *s, uint64_t now_ms);
/* Closes every pending and refused attach connection and frees the set
 * (server shutdown). */
void ckv_attach_pending_free(ckv_server *s);
/* True when attached client c began an attach-socket frame that missed its
 * deadline (the caller drops the client). */
bool ckv_attach_conn_late(const ckv_conn *c, uint64_t now_ms);
/* Input on an attached client's unix socket, read without waiting: once an
 * AttachRequest{refresh} is complete it is answered with the tenant's arenas
 * as they are now (new chunks' fds included); any other complete request is
 * answered with CKV_ERR_PROTO.  Returns false when the socket reached EOF or
 * broke, or the frame was not a frame (the caller drops the client). */
bool ckv_attach_conn_input(ckv_server *s, ckv_conn *c);
/* One request payload of `len` bytes from client c, answered into rep
 * exactly as the loop answers it: over max_message -> CKV_ERR_TOO_LARGE,
 * else decoded with the capped decoder (s->in) and served by
 * ckv_handle_request.  The caller resets s->out first. */
void ckv_server_answer(ckv_server *s, ckv_conn *c, const void *data, size_t len, Commitkv__V1__Response *rep);
/* What every reply gets before it is packed: the boot token, header shadows
 * flushed to the arena, error counters, valid UTF-8 (c may be NULL). */
void ckv_server_finish_reply(ckv_server *s, ckv_conn *c, Commitkv__V1__Response *rep);
/* Packs rep and sends it to `to` when that client is still attached (c, the
 * caller's lookup of it, not NULL); a vanished peer costs a dropped reply. */
void ckv_server_send_reply(ckv_server *s, const ckv_reply_to *to, ckv_conn *c, Commitkv__V1__Response *rep);
/* A snapshot I/O job is done (handlers.c): its request is answered (a
 * restore applied first) to the client that asked, when it is still there,
 * and the job freed. */
struct ckv_snapio_job;
void ckv_handle_io_done(ckv_server *s, struct ckv_snapio_job *j);
/* Serve one decoded request into `rep` (handlers.c). */
void ckv_handle_request(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, Commitkv__V1__Response *rep);

#endif
