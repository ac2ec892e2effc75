/* server.c - the server loop: sockets, signals, leases, detach expiry.
 *
 * One thread.  zmq_poll watches the ROUTER, the attach listener, a signalfd,
 * the attach connections whose request is still arriving, and every attached
 * client's unix socket (EOF there means the client died: its lease ends at
 * once instead of after lease_ms).  Replies are sent with
 * ZMQ_DONTWAIT and ZMQ_ROUTER_MANDATORY, so a slow or vanished peer costs a
 * dropped reply (counted), never a stalled loop. */
#include "daemon/server.h"

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
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "daemon/activation.h"
#include "daemon/attach.h"
#include "daemon/handlers.h"
#include "daemon/held.h"
#include "daemon/instance.h"
#include "daemon/metrics.h"
#include "daemon/parked.h"
#include "daemon/reply.h"
#include "daemon/server_metrics.h"
#include "persist/autosave.h"
#include "persist/diskjob.h"
#include "persist/persist.h"
#include "persist/service.h"
#include "persist/snapdir.h"
#include "persist/snapio.h"
#include "persist/tier.h"
#include "persist/warm.h"
#include "persist/warmjournal.h"
#include "shm/arena.h"
#include "shm/fdpass.h"
#include "store/compressor.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/tenant.h"

#define HOUSEKEEPING_MS 100u
#define MAX_BATCH 512
#define ACCEPT_BATCH 64 /* attach connections accepted per loop turn (the listen backlog) */

/* Store hooks (store.h): what the rooms above learn of store events. */
static void on_session_gone(void *ctx, ckv_srv_session *sess) {
  ckv_server *s = ctx;
  ckv_tier_forget(&s->persist, sess); /* its tier file, requests waiting for it */
  s->counters.semantic_given += sess->semantic_given;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) s->counters.transitions[i][j] += sess->transitions[i][j];
}

static void on_job_done(void *ctx, ckv_srv_session *sess, const ckv_job *j) {
  ckv_server *s = ctx;
  ckv_metrics_observe_compress_tenant(s->metrics, sess->tenant->name, (double)(j->done_ns - j->submitted_ns) * 1e-9);
}

static void on_tenant_up(void *ctx, ckv_tenant *t) {
  ckv_server *s = ctx;
  ckv_warm_tenant_up(&s->persist, t); /* its arena to systemd's fd store: a restart keeps it */
}

static const ckv_store_hooks k_store_hooks = {
    .session_gone = on_session_gone, .job_done = on_job_done, .tenant_up = on_tenant_up};

/* A request that waited (parked.h): the error r (msg) or, when r is CKV_OK,
 * the request served now, as serve_one serves it (it may be deferred again). */
static void serve_parked(ckv_server *s, const ckv_parked_req *p, int r, const char *msg) {
  ckv_conn *c = ckv_strmap_get(s->conns, p->to.keyhex);
  if (!c || c->id != p->to.conn_id) return; /* gone meanwhile */
  c->io_inflight--;
  c->last_seen_ms = ckv_now_ms();
  ckv_wire_reset(&s->out);
  Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
  rep.request_id = p->to.request_id;
  bool deferred = false;
  if (r < 0) {
    rep.code = r;
    rep.message = (char *)msg;
  } else {
    s->reply_to = p->to;
    s->reply_armed = true;
    s->reply_deferred = false;
    ckv_handle_payload(s, c, p->data, p->len, &rep);
    deferred = s->reply_deferred;
    s->reply_armed = s->reply_deferred = false;
  }
  if (!deferred) {
    ckv_reply_finish(s, c, &rep);
    if (!ckv_held_take(s, &p->to, c, &rep)) ckv_reply_send(s, &p->to, c, &rep);
  }
  ckv_held_clear(s);
}

/* Serves (or answers) every request of list p, taken out before: serving
 * one may park new ones. */
static void serve_parked_list(ckv_server *s, ckv_parked_req *p, int r, const char *msg) {
  while (p) {
    ckv_parked_req *next = p->next;
    if (s->conns) serve_parked(s, p, r, msg);
    free(p);
    p = next;
  }
}

/* Persist hooks (persist.h): requests that waited for their session or for room go on. */
static void on_session_ready(void *ctx, const char *key, int status, const char *msg) {
  ckv_server *s = ctx;
  serve_parked_list(s, ckv_parked_take(s, key), status, msg);
}

static void on_room_made(void *ctx) {
  ckv_server *s = ctx;
  serve_parked_list(s, ckv_parked_take(s, NULL), CKV_OK, NULL);
}

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
  s->held_tail = &s->held_head;
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
  s->store.limits = (ckv_store_limits){
      .memory_bytes = opt->memory_bytes, .max_sessions = opt->max_sessions, .backend = s->backend, .mem = opt->mem};
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
  uint64_t owner_tag;
  memcpy(&owner_tag, s->boot_token, sizeof owner_tag);
  const ckv_persist_options po = {.state_dir = opt->state_dir,
                                  .disk_idle_ms = opt->disk_idle_ms,
                                  .disk_memory = opt->disk_memory,
                                  .disk_pressure = opt->disk_pressure,
                                  .remote_idle_ms = opt->remote_idle_ms,
                                  .remote = opt->remote,
                                  .autosave_ms = opt->autosave_ms,
                                  .warm_journal_ms = opt->warm_journal_ms,
                                  .warm_journal_delay_ms = opt->warm_journal_delay_ms,
                                  .policy = opt->policy,
                                  .backend = s->backend,
                                  .owner_tag = owner_tag};
  const ckv_persist_hooks ph = {.session_ready = on_session_ready, .room_made = on_room_made, .ctx = s};
  if ((r = ckv_persist_init(&s->persist, &s->store, &po, &ph, err, errlen)) < 0) goto fail;

  s->zctx = zmq_ctx_new();
  if (!s->zctx) goto fail_nomem;
  zmq_ctx_set(s->zctx, ZMQ_BLOCKY, 0); /* a context option: zmq_setsockopt on the context read it as a socket */
  s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
  if (!s->router) goto fail_nomem;
  int64_t maxmsg = ckv_transport_cap(opt->max_message);
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

ckv_server *ckv_server_free(ckv_server *s) {
  if (!s) return NULL;
  if (s->conns) {
    size_t cur = 0;
    ckv_conn *c;
    while ((c = ckv_strmap_next(s->conns, &cur, NULL))) ckv_attach_drop_conn(s, c, CKV_LOG_INFO, "daemon stopping");
  }
  /* Stop the compressor first: its threads may still write blocks. */
  ckv_store_stop_compressor(&s->store);
  /* Unanswered snapshot jobs go before the tenants they are charged to. */
  ckv_persist_stop_io(&s->persist);
  ckv_store_drop_all(&s->store);
  ckv_persist_done(&s->persist);
  ckv_store_done(&s->store);
  ckv_parked_free(s);
  ckv_held_free(s);
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

static void hex_of(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = 0;
}

/* Every finished snapshot job: answered (ckv_handle_io_done). */
static void collect_io(ckv_server *s) {
  ckv_snapio_job *j = ckv_snapio_collect(s->persist.snapio);
  while (j) {
    ckv_snapio_job *next = j->next;
    ckv_persist_job_landed(&s->persist, j); /* the disk index first: what the job wrote or removed */
    if (j->finish)
      ckv_persist_job_done(&s->persist, j); /* persist/'s own (tiers, autosave) */
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
     * later, to this routing id (ckv_reply_send). */
    s->reply_to = (ckv_reply_to){.conn_id = c->id, .delim = delim};
    memcpy(s->reply_to.keyhex, key, sizeof key);
    s->reply_armed = true;
    ckv_handle_payload(s, c, zmq_msg_data(payload), zmq_msg_size(payload), &rep);
    deferred = s->reply_deferred;
  }
  s->reply_armed = s->reply_deferred = false;
  if (!deferred) {
    ckv_reply_finish(s, c, &rep);
    /* a change the warm journal must hold first: the reply waits (held.h) */
    if (!ckv_held_take(s, &s->reply_to, c, &rep))
      ckv_reply_send_raw(s, zmq_msg_data(id), zmq_msg_size(id), delim, c, &rep);
  }
  ckv_held_clear(s);
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
      ckv_attach_drop_conn(s, c, CKV_LOG_WARNING, "half a frame on its attach socket, not completed in time");
    } else if (c->io_inflight == 0 && now - c->last_seen_ms > s->opt.lease_ms) {
      char why[96];
      snprintf(why, sizeof(why), "lease expired (silent for %llu ms, lease %u ms)",
               (unsigned long long)(now - c->last_seen_ms), s->opt.lease_ms);
      s->counters.leases_expired++;
      ckv_attach_drop_conn(s, c, CKV_LOG_WARNING, why); /* alive but silent, or hung: worth a look */
    }
  cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL)))
    if (sess->owner == 0 && now - sess->detached_at_ms >= s->opt.detach_keep_ms) {
      ckv_log(CKV_LOG_INFO, "session-expired", sess->tenant->name, sess->id, "detached session freed after %llu ms",
              (unsigned long long)s->opt.detach_keep_ms);
      s->counters.sessions_expired++;
      char err[320];
      if (ckv_persist_end_conversation(&s->persist, sess, /* done= */ NULL, NULL, err, sizeof err) < 0)
        ckv_log(CKV_LOG_ERROR, "session-expired", sess->tenant->name, sess->id,
                "the end of the conversation could not be recorded: %s; a copy of it left on disk could come back on "
                "a resume",
                err);
      ckv_autosave_forget(&s->persist, sess->tenant, sess->id); /* ended on purpose: never back from a crash copy */
      ckv_store_drop_session(&s->store, sess);
    }
  ckv_persist_scan(&s->persist, now); /* idle sessions move to disk, changed ones get a crash copy */
}

/* Group commit (held.h): a batch the journal's writer finished lands, the
 * replies it covers go, and while any still waits the next batch starts at
 * once (none in flight). */
static void journal_turn(ckv_server *s, uint64_t now) {
  ckv_warm_journal_pump(&s->persist, /* wanted= */ false, now);
  if (!ckv_held_count(s)) return;
  ckv_held_release(s);
  if (ckv_held_count(s)) ckv_warm_journal_pump(&s->persist, /* wanted= */ true, now);
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
  ckv_snapdir_startup(s->opt.state_dir); /* saves a crash cut short */
  ckv_persist_startup(&s->persist);       /* the disk tier's and autosave's, then every tenant's files indexed */
  uint64_t last_house = 0, last_tick = 0;
  size_t cap = 0;
  zmq_pollitem_t *items = NULL;
  ckv_conn **owners = NULL;
  while (!s->stopping) {
    size_t want = 6 + s->n_pending + s->n_refused + ckv_strmap_size(s->conns);
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
    items[n++] = (zmq_pollitem_t){.fd = ckv_snapio_fd(s->persist.snapio), .events = ZMQ_POLLIN};
    int journal_fd = ckv_warm_journal_fd(&s->persist); /* a batch written: held replies may go */
    if (journal_fd >= 0) items[n++] = (zmq_pollitem_t){.fd = journal_fd, .events = ZMQ_POLLIN};
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
    long timeout = HOUSEKEEPING_MS;
    if (ckv_held_count(s)) { /* a batch held replies wait for starts after warm_journal_delay */
      uint64_t w = ckv_warm_journal_wait_ms(&s->persist, ckv_now_ms());
      if (w < (uint64_t)timeout) timeout = (long)w;
    }
    int rc = zmq_poll(items, (int)n, timeout);
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
          ckv_attach_drop_conn(s, owners[i], CKV_LOG_INFO, "attach socket closed (process exited)");
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
    journal_turn(s, now);
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
  ckv_snapio_wait_idle(s->persist.snapio);
  collect_io(s);
  if (ckv_held_count(s)) { /* their changes written now, on this thread: they go before the stop */
    ckv_warm_journal_flush(&s->persist);
    ckv_held_release(s);
    ckv_held_free(s);
  }
  free(items);
  free(owners);
  ckv_log(CKV_LOG_NOTICE, "stopping", NULL, NULL, "drained; %zu sessions released", ckv_strmap_size(s->store.sessions));
  return 0;
}
