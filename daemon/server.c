/* server.c - the server loop: sockets, signals, leases, detach expiry.
 *
 * One thread.  zmq_poll watches the ROUTER, the attach listener, a signalfd,
 * the attach connections whose request is still arriving, and every attached
 * client's unix socket (EOF there means the client died: its lease ends at
 * once instead of after lease_ms).  Replies are sent with
 * ZMQ_DONTWAIT and ZMQ_ROUTER_MANDATORY, so a slow or vanished peer costs a
 * dropped reply (counted), never a stalled loop. */
#include "common/clock.h"
#include "daemon/server.h"
#include "daemon/snapdir.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "commitkv/status.h"
#include "daemon/autosave.h"
#include "store/compressor.h"
#include "store/moves.h"
#include "daemon/activation.h"
#include "daemon/instance.h"
#include "common/log.h"
#include "daemon/metrics.h"
#include "store/session.h"
#include "daemon/snapio.h"
#include "common/strmap.h"
#include "store/tenant.h"
#include "daemon/warm.h"
#include "daemon/tier.h"
#include "shm/arena.h"
#include "shm/fdpass.h"

#define HOUSEKEEPING_MS 100u
#define MAX_BATCH 512
#define ACCEPT_BATCH 64 /* attach connections accepted per loop turn (the listen backlog) */

/* Requests over max_message are answered CKV_ERR_TOO_LARGE and dropped
 * undecoded, which needs ZeroMQ to deliver them: its own limit
 * (ZMQ_MAXMSGSIZE, which silently drops the peer's connection) sits at this
 * hard cap instead, so no frame above it is ever buffered. */
static int64_t transport_cap(uint64_t max_message) { return (int64_t)(2 * max_message + (64u << 10)); }

/* Store hooks (store.h): what the rooms above learn of store events. */
static void on_session_gone(void *ctx, ckv_srv_session *sess) {
  ckv_server *s = ctx;
  ckv_tier_forget(s, sess); /* its tier file, requests waiting for it */
  s->counters.semantic_given += sess->semantic_given;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) s->counters.transitions[i][j] += sess->transitions[i][j];
}

static void on_job_done(void *ctx, ckv_srv_session *sess, const ckv_job *j) {
  ckv_server *s = ctx;
  ckv_metrics_observe_compress_tenant(s->metrics, sess->tenant->name, (double)(j->done_ns - j->submitted_ns) * 1e-9);
}

static const ckv_store_hooks k_store_hooks = {.session_gone = on_session_gone, .job_done = on_job_done};

static int set_sockopt_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof(v)); }

/* Make the directory of an ipc:// endpoint or unix path exist. */
static void ensure_parent_dir(const char *path) {
  char dir[512];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return;
  *slash = 0;
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(dir, 0755);
      *p = '/';
    }
  mkdir(dir, 0755);
}

int ckv_server_new(const ckv_server_options *opt, ckv_server **ret, char *err, size_t errlen) {
  ckv_server *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->opt = *opt;
  s->attach_fd = -1;
  s->signal_fd = -1;
  s->lock_fd = -1;
  s->start_ms = ckv_now_ms();
  int r;
  if (getrandom(s->boot_token, sizeof(s->boot_token), 0) != sizeof(s->boot_token)) {
    snprintf(err, errlen, "getrandom: %s", strerror(errno));
    r = -errno;
    goto fail;
  }
  s->backend = ckv_arena_backend_find(opt->backend ? opt->backend : "host");
  if (!s->backend) {
    snprintf(err, errlen, "unknown or unavailable backend '%s'", opt->backend);
    r = CKV_ERR_UNSUPPORTED;
    goto fail;
  }
  if ((r = ckv_strmap_new(&s->conns)) < 0 || (r = ckv_store_init(&s->store, &k_store_hooks, s)) < 0) goto fail_nomem;
  /* The decode cap: a request may expand when unpacked (repeated fields, maps);
   * twice its wire size plus slack bounds what protobuf-c may allocate. */
  if ((r = ckv_wire_arena_init(&s->in, (size_t)opt->max_message * 2 + 65536)) < 0) goto fail_nomem;
  if ((r = ckv_wire_arena_init(&s->out, 8u << 20)) < 0) goto fail_nomem;

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, NULL);
  signal(SIGPIPE, SIG_IGN);
  /* A file-size limit (RLIMIT_FSIZE, ulimit -f) must make a snapshot write
   * fail with EFBIG, answered as an error, not kill the daemon. */
  signal(SIGXFSZ, SIG_IGN);
  s->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (s->signal_fd < 0) {
    snprintf(err, errlen, "signalfd: %s", strerror(errno));
    r = -errno;
    goto fail;
  }

  /* Threads start after the signal mask is set, so they inherit it and only
   * the signalfd ever sees SIGTERM/SIGINT/SIGHUP. */
  r = ckv_store_start_compressor(&s->store, opt->compress_threads, opt->compress_queue ? opt->compress_queue : 64);
  if (r < 0) {
    snprintf(err, errlen, "cannot start the compressor: %s", ckv_strerror(r));
    goto fail;
  }
  if ((r = ckv_snapio_new(CKV_SNAPIO_DEPTH, &s->snapio)) < 0) {
    snprintf(err, errlen, "cannot start the snapshot I/O thread: %s", ckv_strerror(r));
    goto fail;
  }
  if ((r = ckv_tier_new(opt->disk_idle_ms, opt->disk_memory, opt->disk_pressure, opt->state_dir, &s->tier)) < 0)
    goto fail_nomem;
  ckv_tier_set_remote(s->tier, opt->remote, opt->remote_idle_ms);

  s->zctx = zmq_ctx_new();
  if (!s->zctx) goto fail_nomem;
  zmq_ctx_set(s->zctx, ZMQ_BLOCKY, 0); /* a context option: zmq_setsockopt on the context read it as a socket */
  s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
  if (!s->router) goto fail_nomem;
  int64_t maxmsg = transport_cap(opt->max_message);
  zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
  set_sockopt_int(s->router, ZMQ_ROUTER_MANDATORY, 1);
  set_sockopt_int(s->router, ZMQ_LINGER, 0);
  set_sockopt_int(s->router, ZMQ_SNDHWM, 10000);
  set_sockopt_int(s->router, ZMQ_RCVHWM, 10000);
  if (strncmp(opt->socket, "ipc://", 6) == 0) ensure_parent_dir(opt->socket + 6);
  ensure_parent_dir(opt->attach_socket);
  /* Before anything is bound: binding would take a running daemon's sockets. */
  if ((r = ckv_instance_claim(opt->socket, opt->attach_socket, &s->lock_fd, err, errlen)) < 0) goto fail;
  if (zmq_bind(s->router, opt->socket) != 0) {
    snprintf(err, errlen, "cannot bind %s: %s", opt->socket, zmq_strerror(zmq_errno()));
    r = -zmq_errno();
    goto fail;
  }
  /* ZeroMQ creates the ipc file with the umask; every local user must reach
   * it (authentication is the attach key, granted over the attach socket). */
  if (strncmp(opt->socket, "ipc://", 6) == 0) chmod(opt->socket + 6, 0666);
  r = ckv_metrics_new(opt->metrics, &s->metrics, err, errlen);
  if (r < 0) {
    /* A busy or bad metrics address must not take KV serving down: run
     * without the endpoint and say so loudly. */
    ckv_log(CKV_LOG_ERROR, "metrics-off", NULL, NULL, "metrics endpoint %s unavailable: %s", opt->metrics, err);
    r = ckv_metrics_new("", &s->metrics, err, errlen);
    if (r < 0) goto fail;
  }
  int inherited = ckv_activation_attach_fd(opt->attach_socket);
  if (inherited >= 0) {
    s->attach_fd = inherited; /* socket activation: systemd owns the path */
    s->attach_inherited = true;
    r = 0;
  } else {
    r = ckv_unix_listen(opt->attach_socket, 0666, 64, &s->attach_fd);
  }
  if (r < 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", opt->attach_socket, ckv_strerror(r));
    goto fail;
  }
  int lfl = fcntl(s->attach_fd, F_GETFL); /* accept until EAGAIN, never block the loop */
  if (lfl < 0 || fcntl(s->attach_fd, F_SETFL, lfl | O_NONBLOCK) < 0) {
    r = -errno;
    snprintf(err, errlen, "fcntl on %s: %s", opt->attach_socket, strerror(errno));
    goto fail;
  }
  *ret = s;
  return CKV_OK;
fail_nomem:
  r = -ENOMEM;
  snprintf(err, errlen, "out of memory");
fail:
  ckv_server_free(s);
  return r;
}

void ckv_server_detach_session(ckv_server *s, ckv_srv_session *sess) {
  sess->owner = 0;
  sess->detached_at_ms = ckv_now_ms();
  ckv_srv_session_release_retired(sess); /* no reader is left to protect */
  s->counters.sessions_detached++;
}

void ckv_server_drop_conn(ckv_server *s, ckv_conn *c, int level, const char *why) {
  size_t cur = 0, detached = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL)))
    if (sess->owner == c->id) {
      ckv_server_detach_session(s, sess);
      detached++;
    }
  char kept[96] = "";
  if (detached)
    snprintf(kept, sizeof(kept), "; %zu sessions detached, kept %llu ms for resume", detached,
             (unsigned long long)s->opt.detach_keep_ms);
  ckv_log(level, "client-gone", c->tenant ? c->tenant->name : NULL, NULL, "client %llu (pid %u, %s): %s%s",
          (unsigned long long)c->id, c->pid, c->name, why, kept);
  if (c->tenant) c->tenant->n_clients--;
  if (c->attach_fd >= 0) close(c->attach_fd);
  ckv_attach_frame_done(&c->frame);
  ckv_strmap_del(s->conns, c->keyhex);
  free(c);
}

ckv_server *ckv_server_free(ckv_server *s) {
  if (!s) return NULL;
  if (s->conns) {
    size_t cur = 0;
    ckv_conn *c;
    while ((c = ckv_strmap_next(s->conns, &cur, NULL))) ckv_server_drop_conn(s, c, CKV_LOG_INFO, "daemon stopping");
  }
  /* Stop the compressor first: its threads may still write blocks. */
  ckv_store_stop_compressor(&s->store);
  /* Unanswered snapshot jobs go before the tenants they are charged to. */
  s->snapio = ckv_snapio_free(s->snapio);
  ckv_store_drop_all(&s->store);
  s->tier = ckv_tier_free(s->tier);
  ckv_store_done(&s->store);
  s->conns = ckv_strmap_free(s->conns);
  if (s->router) zmq_close(s->router);
  if (s->zctx) zmq_ctx_term(s->zctx);
  ckv_attach_pending_free(s);
  if (s->attach_fd >= 0) {
    close(s->attach_fd);
    if (!s->attach_inherited) unlink(s->opt.attach_socket);
  }
  s->metrics = ckv_metrics_free(s->metrics);
  if (s->signal_fd >= 0) close(s->signal_fd);
  if (s->lock_fd >= 0) close(s->lock_fd); /* last: a successor may claim the sockets from here on */
  ckv_wire_arena_done(&s->in);
  ckv_wire_arena_done(&s->out);
  free(s);
  return NULL;
}

ckv_tenant *ckv_server_tenant(ckv_server *s, const ckv_tenant_spec *spec, int *ret_status) {
  ckv_tenant *t = ckv_store_find_tenant(&s->store, spec->name);
  if (t) return t;
  /* The budget: every arena comes out of memory_bytes, in whole chunks, so
   * that their sizes (what a GPU must really hold) never add up to more. */
  const uint64_t align = CKV_TENANT_ARENA_ALIGN;
  uint64_t used = ckv_store_arenas_bytes(&s->store);
  uint64_t left = s->opt.memory_bytes > used ? (s->opt.memory_bytes - used) / align * align : 0;
  uint64_t want = spec->quota_bytes ? ckv_tenant_arena_for_quota(spec->quota_bytes)
                                    : spec->arena_bytes ? spec->arena_bytes / align * align : left;
  uint64_t arena = want < left ? want : left;
  if (arena < CKV_TENANT_ARENA_MIN) {
    ckv_log(CKV_LOG_ERROR, "tenant-refused", spec->name, NULL,
            "no memory left for an arena: the %zu tenants' arenas hold %llu of the daemon's %llu bytes "
            "([daemon] memory), %llu left, an arena needs at least %llu",
            s->store.n_tenants, (unsigned long long)used, (unsigned long long)s->opt.memory_bytes,
            (unsigned long long)left, (unsigned long long)CKV_TENANT_ARENA_MIN);
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
            (unsigned long long)s->opt.memory_bytes);
  ckv_tenant **nt = realloc(s->store.tenants, (s->store.n_tenants + 1) * sizeof(*nt));
  if (!nt) {
    *ret_status = -ENOMEM;
    return NULL;
  }
  s->store.tenants = nt;
  int r = ckv_tenant_new(spec->name, quota, arena, (uint32_t)s->store.n_tenants + 1, s->backend, &t);
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
  t->max_sessions = spec->max_sessions ? spec->max_sessions : s->opt.max_sessions;
  t->max_clients = spec->max_clients;
  t->policies = spec->policies;
  t->default_policy = spec->default_policy;
  if (s->opt.mem) t->mem = s->opt.mem;
  s->store.tenants[s->store.n_tenants++] = t;
  ckv_warm_tenant_up(s, t); /* its arena to systemd's fd store: a restart keeps it */
  ckv_log(CKV_LOG_INFO, "tenant-up", t->name, NULL,
          "arena %u of %llu bytes (%s), quota %llu bytes; %llu of %llu bytes of memory left", t->arena_id,
          (unsigned long long)ckv_arena_size(t->arena), ckv_arena_kind(t->arena), (unsigned long long)quota,
          (unsigned long long)(left - ckv_arena_size(t->arena)), (unsigned long long)s->opt.memory_bytes);
  return t;
}

void ckv_server_retune_tenant(ckv_server *s, ckv_tenant *t, const ckv_tenant_spec *spec) {
  uint64_t holds = ckv_tenant_quota_for_arena(ckv_arena_size(t->arena));
  uint64_t quota = spec->quota_bytes && spec->quota_bytes < holds ? spec->quota_bytes : holds;
  if (spec->quota_bytes > holds)
    ckv_log(CKV_LOG_WARNING, "quota-cut", t->name, NULL,
            "tenant.%s.quota of %llu bytes is more than its arena of %llu bytes holds: cut to %llu (a "
            "bigger arena needs a restart)",
            t->name, (unsigned long long)spec->quota_bytes, (unsigned long long)ckv_arena_size(t->arena),
            (unsigned long long)quota);
  uint32_t max_sessions = spec->max_sessions ? spec->max_sessions : s->opt.max_sessions;
  if (quota != t->quota_bytes || max_sessions != t->max_sessions || spec->max_clients != t->max_clients ||
      spec->policies != t->policies || spec->default_policy != t->default_policy)
    ckv_log(CKV_LOG_NOTICE, "tenant-reload", t->name, NULL,
            "quota %llu -> %llu bytes (%llu in use), max_sessions %u -> %u, max_clients %u -> %u",
            (unsigned long long)t->quota_bytes, (unsigned long long)quota, (unsigned long long)t->bytes_used,
            t->max_sessions, max_sessions, t->max_clients, spec->max_clients);
  /* A quota below what is in use refuses new blocks until enough is freed:
   * nothing held is taken away by a reload. */
  t->quota_bytes = quota;
  t->max_sessions = max_sessions;
  t->max_clients = spec->max_clients;
  t->policies = spec->policies;
  t->default_policy = spec->default_policy;
}

const char *ckv_server_client_limit(const ckv_server *s, const ckv_tenant_spec *spec, char *buf, size_t len) {
  if (spec && spec->name && spec->max_clients) {
    const ckv_tenant *t = ckv_store_find_tenant(&s->store, spec->name);
    uint64_t n = t ? t->n_clients : 0;
    if (n >= spec->max_clients) {
      snprintf(buf, len, "attach: tenant '%s' has %llu clients attached, its limit (tenant max_clients %u)",
               spec->name, (unsigned long long)n, spec->max_clients);
      return buf;
    }
  }
  if (ckv_strmap_size(s->conns) >= s->opt.max_clients) {
    snprintf(buf, len, "attach: too many clients: %zu attached, the daemon's limit for all tenants (daemon "
             "max_clients %u)", ckv_strmap_size(s->conns), s->opt.max_clients);
    return buf;
  }
  return NULL;
}

static void hex_of(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = 0;
}

/* The payload of one request from client c, answered into rep: the
 * max_message cap, the capped decode into the per-request arena, the
 * handler.  serve_one calls it once the routing id named c; the request
 * fuzzer (tests/fuzz) calls it the same way. */
void ckv_server_answer(ckv_server *s, ckv_conn *c, const void *data, size_t len, Commitkv__V1__Response *rep) {
  static char msg[256];
  c->last_seen_ms = ckv_now_ms();
  if (len > s->opt.max_message) {
    rep->code = CKV_ERR_TOO_LARGE;
    rep->request_id = ckv_wire_peek_request_id(data, len);
    snprintf(msg, sizeof(msg),
             "request of %zu bytes is over max_message (%llu bytes); it was dropped undecoded (above %lld bytes "
             "the connection is closed instead)",
             len, (unsigned long long)s->opt.max_message, (long long)transport_cap(s->opt.max_message));
    rep->message = msg;
    return;
  }
  Commitkv__V1__Request *req = NULL;
  int r = ckv_wire_decode_request(&s->in, data, len, &req);
  if (r < 0) {
    rep->code = r;
    snprintf(msg, sizeof(msg), "could not decode a commitkv.v1.Request from %zu bytes", len);
    rep->message = msg;
    return;
  }
  rep->request_id = req->request_id;
  ckv_handle_request(s, c, req, rep);
}

void ckv_server_finish_reply(ckv_server *s, ckv_conn *c, Commitkv__V1__Response *rep) {
  rep->boot_token.data = s->boot_token;
  rep->boot_token.len = sizeof(s->boot_token);
  s->counters.requests++;
  /* Header shadows reach the arena before any reply can send a reader to them. */
  if (s->store.dirty_head) {
    int fr = ckv_srv_session_flush_all_meta(&s->store.dirty_head);
    if (fr < 0) {
      ckv_log(CKV_LOG_ERROR, "flush-failed", c && c->tenant ? c->tenant->name : NULL, NULL,
              "writing block headers to the arena failed: %s", ckv_strerror(fr));
      if (rep->code == 0) {
        rep->code = fr;
        rep->message = "the daemon could not write block headers to KV memory (device error); retry";
      }
    }
  }
  if (rep->code != 0) {
    s->counters.errors++;
    if (c && c->tenant) c->tenant->errors[ckv_metrics_error_index(rep->code)]++;
  }
  /* Every text a reply carries is valid UTF-8, whichever handler wrote it:
   * standard protobuf clients refuse the whole reply otherwise. */
  ckv_wire_fix_strings(&s->out, &rep->base);
}

/* Packs rep and sends [id][empty, when delim][reply] without waiting. */
static void send_reply(ckv_server *s, const void *id, size_t id_len, bool delim, const ckv_conn *c,
                       Commitkv__V1__Response *rep) {
  size_t len = commitkv__v1__response__get_packed_size(rep);
  zmq_msg_t out;
  if (zmq_msg_init_size(&out, len) != 0) return;
  commitkv__v1__response__pack(rep, zmq_msg_data(&out));
  int rc = zmq_send(s->router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (rc >= 0 && delim) rc = zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (rc >= 0) rc = zmq_msg_send(&out, s->router, ZMQ_DONTWAIT);
  if (rc < 0) {
    /* EHOSTUNREACH: the peer went away; EAGAIN: its queue is full. Either
     * way the reply is dropped, never the loop stalled. */
    ckv_log(CKV_LOG_DEBUG, "reply-dropped", c && c->tenant ? c->tenant->name : NULL, NULL, "%s",
            zmq_strerror(zmq_errno()));
    zmq_msg_close(&out);
  }
}

void ckv_server_send_reply(ckv_server *s, const ckv_reply_to *to, ckv_conn *c, Commitkv__V1__Response *rep) {
  send_reply(s, c->key, CKV_KEY_BYTES, to->delim, c, rep);
}

/* Every finished snapshot job: answered (ckv_handle_io_done). */
static void collect_io(ckv_server *s) {
  ckv_snapio_job *j = ckv_snapio_collect(s->snapio);
  while (j) {
    ckv_snapio_job *next = j->next;
    if (j->finish)
      j->finish(s, j); /* the disk tier's (tier.c) */
    else
      ckv_handle_io_done(s, j);
    j = next;
  }
}

/* Receive one multipart message: [identity][optional empty][payload].
 * Returns 1 when a message was read, 0 when none is queued. */
static int serve_one(ckv_server *s) {
  zmq_msg_t frames[3];
  int n = 0, more = 1;
  bool overflow = false;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->router, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(&m);
      if (n == 0) return 0;
      break;
    }
    more = zmq_msg_more(&m);
    if (n < 3)
      frames[n++] = m;
    else {
      overflow = true; /* garbage: drain and answer with an error */
      zmq_msg_close(&m);
    }
  }
  zmq_msg_t *id = &frames[0];
  bool delim = n == 3 && zmq_msg_size(&frames[1]) == 0;
  zmq_msg_t *payload = n >= 2 ? &frames[n - 1] : NULL;

  Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
  ckv_wire_reset(&s->out);
  char key[2 * CKV_KEY_BYTES + 1] = "";
  if (zmq_msg_size(id) == CKV_KEY_BYTES) hex_of(zmq_msg_data(id), CKV_KEY_BYTES, key);
  ckv_conn *c = key[0] ? ckv_strmap_get(s->conns, key) : NULL;
  static char msg[256];
  bool deferred = false;
  if (!c) {
    rep.code = CKV_ERR_AUTH;
    /* The refusal names the request it answers, as every reply does: a
     * client that pipelines (or a replayed request) must tell which one was
     * refused.  Peeked, not decoded: nothing of an unknown peer is unpacked. */
    if (payload) rep.request_id = ckv_wire_peek_request_id(zmq_msg_data(payload), zmq_msg_size(payload));
    snprintf(msg, sizeof(msg), "unknown client: attach over %s first and use the attach key as routing id",
             s->opt.attach_socket);
    rep.message = msg;
  } else if (overflow || !payload || (n == 3 && !delim)) {
    rep.code = CKV_ERR_PROTO;
    rep.message = "bad framing: expected [payload] or [empty][payload]";
  } else {
    /* A handler may hand the request to the snapshot I/O thread: it answers
     * later, to this routing id (ckv_server_send_reply). */
    s->reply_to = (ckv_reply_to){.conn_id = c->id, .delim = delim};
    memcpy(s->reply_to.keyhex, key, sizeof key);
    s->reply_armed = true;
    ckv_server_answer(s, c, zmq_msg_data(payload), zmq_msg_size(payload), &rep);
    deferred = s->reply_deferred;
  }
  s->reply_armed = s->reply_deferred = false;
  if (!deferred) {
    ckv_server_finish_reply(s, c, &rep);
    send_reply(s, zmq_msg_data(id), zmq_msg_size(id), delim, c, &rep);
  }
  for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
  return 1;
}

/* A bounded batch per loop turn: peers that connect as fast as they are
 * refused must not keep the loop from everyone else's requests. */
static void accept_attach(ckv_server *s) {
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(s->attach_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    ckv_attach_accept(s, fd);
  }
}

static void housekeeping(ckv_server *s) {
  uint64_t now = ckv_now_ms();
  ckv_attach_expire(s, now); /* silent or half-sent attaches */
  size_t cur = 0;
  ckv_conn *c;
  while ((c = ckv_strmap_next(s->conns, &cur, NULL)))
    if (ckv_attach_conn_late(c, now)) {
      ckv_server_drop_conn(s, c, CKV_LOG_WARNING, "half a frame on its attach socket, not completed in time");
    } else if (c->io_inflight == 0 && now - c->last_seen_ms > s->opt.lease_ms) {
      char why[96];
      snprintf(why, sizeof(why), "lease expired (silent for %llu ms, lease %u ms)",
               (unsigned long long)(now - c->last_seen_ms), s->opt.lease_ms);
      s->counters.leases_expired++;
      ckv_server_drop_conn(s, c, CKV_LOG_WARNING, why); /* alive but silent, or hung: worth a look */
    }
  cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL)))
    if (sess->owner == 0 && now - sess->detached_at_ms >= s->opt.detach_keep_ms) {
      ckv_log(CKV_LOG_INFO, "session-expired", sess->tenant->name, sess->id, "detached session freed after %llu ms",
              (unsigned long long)s->opt.detach_keep_ms);
      s->counters.sessions_expired++;
      ckv_autosave_forget(s, sess->tenant, sess->id); /* ended on purpose: never back from a crash copy */
      ckv_store_drop_session(&s->store, sess);
    }
  ckv_tier_scan(s, now); /* idle sessions move to disk */
  ckv_autosave_scan(s, now); /* and changed ones get a crash copy */
}

static void read_signals(ckv_server *s) {
  struct signalfd_siginfo si;
  while (read(s->signal_fd, &si, sizeof(si)) == sizeof(si)) {
    if (si.ssi_signo == SIGHUP)
      s->reload_requested = true;
    else
      s->stopping = true;
  }
}

bool ckv_server_take_reload(ckv_server *s) {
  bool r = s->reload_requested;
  s->reload_requested = false;
  return r;
}

static void status_line(ckv_server *s, char *buf, size_t len) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < s->store.n_tenants; i++) bytes += s->store.tenants[i]->bytes_used;
  snprintf(buf, len, "%zu sessions, %zu clients, %llu bytes of KV", ckv_strmap_size(s->store.sessions),
           ckv_strmap_size(s->conns), (unsigned long long)bytes);
}

int ckv_server_run(ckv_server *s) {
  ckv_server_publish_metrics(s); /* a scrape never sees an empty page */
  s->last_metrics_ms = ckv_now_ms();
  if (s->opt.on_ready) s->opt.on_ready(s->opt.notify_ctx);
  ckv_log(CKV_LOG_NOTICE, "ready", NULL, NULL, "serving %s (attach %s), backend %s", s->opt.socket,
          s->opt.attach_socket, s->opt.backend);
  ckv_snapdir_startup(s->opt.state_dir); /* sessions that can come back from their snapshots */
  ckv_tier_startup(s);                    /* and from the disk tier, after a crash */
  ckv_autosave_startup(s);                /* and from their autosaves */
  uint64_t last_house = 0, last_tick = 0;
  size_t cap = 0;
  zmq_pollitem_t *items = NULL;
  ckv_conn **owners = NULL;
  while (!s->stopping) {
    size_t want = 5 + s->n_pending + s->n_refused + ckv_strmap_size(s->conns);
    if (want > cap) {
      size_t ncap = want * 2;
      zmq_pollitem_t *ni = realloc(items, ncap * sizeof(*ni));
      if (ni) items = ni;
      ckv_conn **no = realloc(owners, ncap * sizeof(*no));
      if (no) owners = no;
      if (!ni || !no) {
        ckv_log(CKV_LOG_ERROR, "oom", NULL, NULL, "out of memory in the server loop");
        break;
      }
      cap = ncap;
    }
    size_t n = 0;
    items[n++] = (zmq_pollitem_t){.socket = s->router, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = s->attach_fd, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = s->signal_fd, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = ckv_compressor_fd(s->store.compressor), .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = ckv_snapio_fd(s->snapio), .events = ZMQ_POLLIN};
    const size_t first_pending = n;
    for (size_t i = 0; i < s->n_pending; i++)
      items[n++] = (zmq_pollitem_t){.fd = s->pending[i].fd, .events = ZMQ_POLLIN};
    const size_t first_refused = n;
    for (size_t i = 0; i < s->n_refused; i++)
      items[n++] = (zmq_pollitem_t){.fd = s->refused[i].fd, .events = ZMQ_POLLIN};
    const size_t first_conn = n;
    size_t cur = 0;
    ckv_conn *c;
    while ((c = ckv_strmap_next(s->conns, &cur, NULL))) {
      owners[n] = c;
      items[n++] = (zmq_pollitem_t){.fd = c->attach_fd, .events = ZMQ_POLLIN};
    }
    int rc = zmq_poll(items, (int)n, HOUSEKEEPING_MS);
    if (rc < 0 && zmq_errno() != EINTR) {
      ckv_log(CKV_LOG_ERROR, "poll", NULL, NULL, "zmq_poll: %s", zmq_strerror(zmq_errno()));
      break;
    }
    if (rc > 0) {
      if (items[2].revents) read_signals(s);
      if (items[3].revents) ckv_store_collect_jobs(&s->store);
      if (items[4].revents) collect_io(s);
      if (items[0].revents & ZMQ_POLLIN)
        for (int i = 0; i < MAX_BATCH && serve_one(s); i++) {
        }
      /* Refused connections draining, then attach requests arriving (which
       * may add refused ones).  From the end: an entry that is done is
       * replaced by the last one, which was already looked at. */
      for (size_t i = first_conn - first_refused; i-- > 0;)
        if (items[first_refused + i].revents) ckv_attach_refused_input(s, i);
      for (size_t i = first_refused - first_pending; i-- > 0;)
        if (items[first_pending + i].revents) ckv_attach_pending_input(s, i);
      if (items[1].revents & ZMQ_POLLIN) accept_attach(s);
      for (size_t i = first_conn; i < n; i++) {
        if (!items[i].revents) continue;
        if (!ckv_attach_conn_input(s, owners[i]))
          ckv_server_drop_conn(s, owners[i], CKV_LOG_INFO, "attach socket closed (process exited)");
      }
    }
    uint64_t now = ckv_now_ms();
    if (now - s->last_metrics_ms >= 1000) {
      ckv_server_publish_metrics(s);
      s->last_metrics_ms = now;
    }
    if (now - last_house >= HOUSEKEEPING_MS) {
      housekeeping(s);
      last_house = now;
    }
    if (s->opt.on_tick && s->opt.tick_ms && now - last_tick >= s->opt.tick_ms) {
      char line[160];
      status_line(s, line, sizeof(line));
      s->opt.on_tick(s->opt.notify_ctx, line);
      last_tick = now;
    }
  }
  /* Drain: answer what is already queued, let the snapshot saves and reads
   * in flight finish and answer them, then detach everyone. */
  for (int i = 0; i < MAX_BATCH && serve_one(s); i++) {
  }
  ckv_snapio_wait_idle(s->snapio);
  collect_io(s);
  free(items);
  free(owners);
  ckv_log(CKV_LOG_NOTICE, "stopping", NULL, NULL, "drained; %zu sessions released", ckv_strmap_size(s->store.sessions));
  return 0;
}
