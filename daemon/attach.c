/* attach.c - the attach handshake on the unix socket.
 *
 * The kernel tells us who the peer is (SO_PEERCRED); the configured mapping
 * turns uid/gid into a tenant; the reply carries that tenant's arena fds
 * (SCM_RIGHTS) and a fresh random attach key, which the client then uses as
 * its ZeroMQ routing id.  A peer that maps to no tenant is refused with
 * CKV_ERR_AUTH.  The connection stays open for the client's life: its EOF is
 * the fastest possible lease expiry.
 *
 * The socket is open to every local user and the loop is one thread, so no
 * peer may make it wait.  Credentials are read at accept, and a peer that
 * maps to no tenant (and is not admin) is refused there, before a byte of its
 * request is read.  Everyone else's request is read without blocking, a piece
 * whenever poll says there is one (attach_frame.h), against a deadline for the
 * whole frame; meanwhile the connection waits in the server's pending set,
 * which bounds how many one uid may hold.  Later AttachRequest{refresh}
 * frames on attached connections are read the same way. */
#include "daemon/attach.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "daemon/utf8.h"
#include "persist/persist.h"
#include "shm/arena.h"
#include "shm/fdpass.h"
#include "store/session.h"
#include "store/shared.h"
#include "store/tenant.h"

#define ATTACH_MAX_FRAME 4096
#define ATTACH_DEADLINE_MS 1000u /* a whole attach frame must arrive within this */

/* Sockets here are non-blocking: a reply that does not fit the peer's
 * buffer (it never read the last ones) fails instead of waiting. */
static int send_reply(int fd, const Commitkv__V1__AttachReply *rep, const int *fds, size_t n_fds) {
  uint8_t buf[ATTACH_MAX_FRAME];
  Commitkv__V1__AttachReply fixed = *rep; /* every text valid UTF-8 (wire.h); the caller's copy stays */
  ckv_wire_fix_strings(NULL, &fixed.base);
  size_t len = commitkv__v1__attach_reply__get_packed_size(&fixed);
  if (len > sizeof(buf)) return CKV_ERR_TOO_LARGE;
  commitkv__v1__attach_reply__pack(&fixed, buf);
  return ckv_frame_send(fd, buf, len, fds, n_fds);
}

static void refuse(int fd, int code, const char *msg) {
  Commitkv__V1__AttachReply rep = COMMITKV__V1__ATTACH_REPLY__INIT;
  rep.code = code;
  rep.message = (char *)msg;
  rep.version = CKV_PROTOCOL_VERSION;
  (void)send_reply(fd, &rep, NULL, 0);
}

/* Refuses a connection whose request was not read (or not all of it): the
 * peer may still be sending, and a unix socket closed under it would fail its
 * send with EPIPE before it reads our reply.  So the connection lingers, its
 * input dropped unread, until the peer closes it or ATTACH_DEADLINE_MS. */
static void refuse_unread(ckv_server *s, int fd, int code, const char *msg) {
  refuse(fd, code, msg);
  if (s->n_refused == CKV_REFUSED_ATTACH_MAX) {
    size_t oldest = 0;
    for (size_t i = 1; i < s->n_refused; i++)
      if (s->refused[i].close_ms < s->refused[oldest].close_ms) oldest = i;
    close(s->refused[oldest].fd);
    s->refused[oldest] = s->refused[--s->n_refused];
  }
  s->refused[s->n_refused++] = (struct ckv_refused_attach){fd, ckv_now_ms() + ATTACH_DEADLINE_MS};
}

/* Attach refusals at accept are logged at most once a second: a hostile
 * peer may connect in a loop, and the journal is not its to fill. */
static void log_refusal(ckv_server *s, const char *event, const char *fmt, ...) {
  uint64_t now = ckv_now_ms();
  if (s->refusal_logged_ms && now - s->refusal_logged_ms < 1000) {
    s->refusals_unlogged++;
    return;
  }
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (s->refusals_unlogged)
    ckv_log(CKV_LOG_WARNING, event, NULL, NULL, "%s (and %llu more attach refusals not logged)", line,
            (unsigned long long)s->refusals_unlogged);
  else
    ckv_log(CKV_LOG_WARNING, event, NULL, NULL, "%s", line);
  s->refusal_logged_ms = now;
  s->refusals_unlogged = 0;
}

static bool is_admin(uint32_t uid) { return uid == 0 || uid == (uint32_t)geteuid(); }

static bool maps_to_tenant(const ckv_server *s, uint32_t uid, uint32_t gid) {
  ckv_tenant_spec spec = {.default_policy = -1};
  return s->opt.resolve_tenant && s->opt.resolve_tenant(s->opt.resolve_ctx, uid, gid, &spec);
}

/* Fills `info` and `ex` with the tenant's arena as it is now (committed
 * prefix included).  Returns CKV_OK or the export's error. */
static int arena_info(ckv_tenant *t, Commitkv__V1__ArenaInfo *info, ckv_arena_desc *ex) {
  int r = ckv_arena_export(t->arena, ex);
  if (r < 0) return r;
  info->arena_id = t->arena_id;
  info->kind = (char *)ckv_arena_kind(t->arena);
  info->bytes = ckv_arena_size(t->arena);
  info->fd_index = 0;
  info->device_uuid = t->device_uuid;
  info->generation = ex->generation;
  info->committed = ex->committed;
  info->handle.data = ex->handle;
  info->handle.len = ex->handle_len;
  return CKV_OK;
}

/* The descriptors an AttachReply to a client of tenant t carries: the
 * arena's (ex; NULL: none exported), then, when asked for and the arena
 * went too, the tenant's prefix index (filled into *pix, named by rep; a
 * worker without it asks the daemon: LookupPrefix).  Returns how many. */
static size_t reply_fds(ckv_tenant *t, const ckv_arena_desc *ex, bool want_index, int fds[CKV_ARENA_MAX_FDS + 1],
                        Commitkv__V1__PrefixIndexInfo *pix, Commitkv__V1__AttachReply *rep) {
  size_t n = 0;
  if (!ex) return 0;
  memcpy(fds, ex->fds, ex->n_fds * sizeof(*fds));
  n = ex->n_fds;
  uint64_t bytes = 0;
  int fd = want_index ? ckv_prefix_index_fd(t, &bytes) : -1;
  if (fd >= 0) {
    pix->fd_index = (uint32_t)n;
    pix->bytes = bytes;
    fds[n++] = fd;
    rep->prefix_index = pix;
  }
  return n;
}

/* What every successful AttachReply to client `c` says about it. */
static void reply_for(const ckv_server *s, const ckv_conn *c, Commitkv__V1__AttachReply *rep) {
  rep->code = CKV_OK;
  rep->attach_key.data = (uint8_t *)c->key;
  rep->attach_key.len = CKV_KEY_BYTES;
  rep->tenant = c->tenant ? c->tenant->name : "";
  rep->boot_token.data = (uint8_t *)s->boot_token;
  rep->boot_token.len = sizeof(s->boot_token);
  rep->version = CKV_PROTOCOL_VERSION;
  rep->admin = c->admin;
}

/* Serves the complete AttachRequest `frame` (len bytes) that peer `who` sent
 * on fd; takes ownership of fd. */
static void ckv_attach_serve(ckv_server *s, int fd, const ckv_peer *who, const uint8_t *frame, size_t len) {
  static const uint8_t empty[1];
  ckv_peer peer = *who;
  int r;
  char msg[256];
  ckv_wire_reset(&s->in);
  Commitkv__V1__AttachRequest *req =
      commitkv__v1__attach_request__unpack(&s->in.allocator, len, frame ? frame : empty);
  if (!req) {
    refuse(fd, CKV_ERR_PROTO, "attach: could not decode a commitkv.v1.AttachRequest");
    close(fd);
    return;
  }
  if (req->version != 0 && req->version < CKV_PROTOCOL_VERSION) {
    refuse(fd, CKV_ERR_VERSION, "attach: protocol version not supported (this daemon speaks 1)");
    close(fd);
    return;
  }
  /* Checked again, for its spec: a SIGHUP may have changed the mapping since
   * ckv_attach_accept. */
  bool admin = is_admin(peer.uid);
  ckv_tenant_spec spec = {.default_policy = -1};
  bool mapped = s->opt.resolve_tenant && s->opt.resolve_tenant(s->opt.resolve_ctx, peer.uid, peer.gid, &spec);
  if (!mapped && !admin) {
    s->counters.attach_refused++;
    snprintf(msg, sizeof(msg), "uid %u / gid %u is not mapped to any tenant", peer.uid, peer.gid);
    ckv_log(CKV_LOG_WARNING, "attach-refused", NULL, NULL, "pid %u: %s", peer.pid, msg);
    refuse(fd, CKV_ERR_AUTH, msg);
    close(fd);
    return;
  }
  if (ckv_attach_client_limit(s, mapped ? &spec : NULL, msg, sizeof(msg))) {
    refuse(fd, CKV_ERR_LIMIT, msg);
    close(fd);
    return;
  }
  ckv_tenant *t = NULL;
  if (mapped) {
    t = ckv_attach_tenant(s, &spec, &r);
    if (!t) {
      snprintf(msg, sizeof(msg), "attach: cannot set up tenant '%s': %s", spec.name, ckv_strerror(r));
      ckv_log(CKV_LOG_ERROR, "tenant-failed", spec.name, NULL, "%s", msg);
      refuse(fd, r, msg);
      close(fd);
      return;
    }
  }
  ckv_conn *c = calloc(1, sizeof(*c));
  if (!c) {
    refuse(fd, -ENOMEM, "attach: out of memory");
    close(fd);
    return;
  }
  do {
    if (getrandom(c->key, sizeof(c->key), 0) != sizeof(c->key)) {
      free(c);
      close(fd);
      return;
    }
    c->key[0] |= 1; /* ZeroMQ reserves routing ids that start with a zero byte */
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < CKV_KEY_BYTES; i++) {
      c->keyhex[2 * i] = digits[c->key[i] >> 4];
      c->keyhex[2 * i + 1] = digits[c->key[i] & 15];
    }
    c->keyhex[2 * CKV_KEY_BYTES] = 0;
  } while (ckv_strmap_get(s->conns, c->keyhex));
  c->id = ++s->next_conn_id;
  c->tenant = t;
  c->uid = peer.uid;
  c->gid = peer.gid;
  c->pid = peer.pid;
  c->admin = admin;
  c->attach_fd = fd;
  c->last_seen_ms = ckv_now_ms();
  /* A client-chosen name reaches logs and listings: valid UTF-8, cut on a character boundary. */
  const char *name = req->client_name && *req->client_name ? req->client_name : "client";
  ckv_utf8_copy(c->name, sizeof(c->name), name, strlen(name));
  if (ckv_strmap_put(s->conns, c->keyhex, c) < 0) {
    free(c);
    refuse(fd, -ENOMEM, "attach: out of memory");
    close(fd);
    return;
  }
  if (t) t->n_clients++;
  s->counters.attaches++;

  Commitkv__V1__AttachReply rep = COMMITKV__V1__ATTACH_REPLY__INIT;
  reply_for(s, c, &rep);
  rep.message = "attached";
  Commitkv__V1__ArenaInfo info = COMMITKV__V1__ARENA_INFO__INIT, *infos[1] = {&info};
  ckv_arena_desc ex;
  bool exported = false;
  if (t && req->want_arenas) {
    r = arena_info(t, &info, &ex);
    if (r < 0) {
      snprintf(msg, sizeof(msg), "attach: cannot export the arena: %s", ckv_strerror(r));
      refuse(fd, r, msg);
      ckv_attach_drop_conn(s, c, CKV_LOG_WARNING, "arena export failed");
      return;
    }
    exported = true;
    c->wants_arenas = true;
    rep.n_arenas = 1;
    rep.arenas = infos;
  }
  int fds[CKV_ARENA_MAX_FDS + 1];
  Commitkv__V1__PrefixIndexInfo pix = COMMITKV__V1__PREFIX_INDEX_INFO__INIT;
  size_t n_fds = reply_fds(t, exported ? &ex : NULL, req->want_prefix_index, fds, &pix, &rep);
  /* A fresh connection's buffer always holds the reply; a peer already gone
   * shows as EOF in the poll set. */
  (void)send_reply(fd, &rep, n_fds ? fds : NULL, n_fds);
  ckv_log(CKV_LOG_INFO, "attach", t ? t->name : NULL, NULL, "client %llu '%s' pid %u uid %u%s",
          (unsigned long long)c->id, c->name, c->pid, c->uid, admin ? " (admin)" : "");
}

/* ---- pending attaches ---------------------------------------------------- */

/* Why `p` may not wait for its request (into msg), or NULL when it may. */
static const char *pending_full(const ckv_server *s, const ckv_pending_attach *p, char *msg, size_t cap) {
  if (s->n_pending >= CKV_PENDING_ATTACH_MAX) {
    snprintf(msg, cap, "attach: too many attach connections pending (%u, all users); try again",
             CKV_PENDING_ATTACH_MAX);
    return msg;
  }
  if (p->admin) return NULL;
  uint32_t mine = 0;
  for (size_t i = 0; i < s->n_pending; i++) mine += s->pending[i].uid == p->uid;
  if (mine < CKV_PENDING_ATTACH_PER_UID) return NULL;
  snprintf(msg, cap,
           "attach: uid %u already has %u attach connections pending (the limit per uid); send the "
           "AttachRequest right after connecting",
           p->uid, mine);
  return msg;
}

/* The frame of `p` is complete (r == CKV_OK) or broken: serve or refuse it.
 * Takes ownership of p->fd; frees the frame. */
static void pending_finish(ckv_server *s, ckv_pending_attach *p, int r) {
  if (r == CKV_OK) {
    ckv_peer peer = {.uid = p->uid, .gid = p->gid, .pid = p->pid};
    ckv_attach_serve(s, p->fd, &peer, p->frame.body, p->frame.len);
  } else {
    char msg[160];
    snprintf(msg, sizeof(msg), "attach: bad request frame: %s", ckv_strerror(r));
    refuse_unread(s, p->fd, r == CKV_ERR_TOO_LARGE || r == -ENOMEM ? r : CKV_ERR_PROTO, msg);
  }
  ckv_attach_frame_done(&p->frame);
}

void ckv_attach_accept(ckv_server *s, int fd) {
  ckv_peer peer;
  if (ckv_peercred(fd, &peer) < 0) {
    close(fd);
    return;
  }
  ckv_pending_attach p = {.fd = fd,
                          .uid = peer.uid,
                          .gid = peer.gid,
                          .pid = peer.pid,
                          .admin = is_admin(peer.uid),
                          .deadline_ms = ckv_now_ms() + ATTACH_DEADLINE_MS};
  ckv_attach_frame_init(&p.frame);
  char msg[256];
  /* Nothing of a stranger's request is read: whatever it sends, or does not
   * send, costs the loop one reply. */
  if (!p.admin && !maps_to_tenant(s, p.uid, p.gid)) {
    s->counters.attach_refused++;
    snprintf(msg, sizeof(msg), "uid %u / gid %u is not mapped to any tenant", p.uid, p.gid);
    log_refusal(s, "attach-refused", "pid %u: %s", p.pid, msg);
    refuse_unread(s, fd, CKV_ERR_AUTH, msg);
    return;
  }
  /* Most clients send their request with the connect: serve it now, before it
   * takes a pending slot. */
  int r = ckv_attach_frame_read(&p.frame, fd, ATTACH_MAX_FRAME);
  if (r != CKV_ATTACH_FRAME_MORE) {
    pending_finish(s, &p, r);
    return;
  }
  if (pending_full(s, &p, msg, sizeof(msg))) {
    s->counters.attach_refused++;
    log_refusal(s, "attach-limit", "pid %u uid %u: %s", p.pid, p.uid, msg);
    refuse_unread(s, fd, CKV_ERR_LIMIT, msg);
    ckv_attach_frame_done(&p.frame);
    return;
  }
  if (s->n_pending == s->cap_pending) {
    size_t ncap = s->cap_pending ? s->cap_pending * 2 : 16;
    ckv_pending_attach *np = realloc(s->pending, ncap * sizeof(*np));
    if (!np) {
      refuse_unread(s, fd, -ENOMEM, "attach: out of memory");
      ckv_attach_frame_done(&p.frame);
      return;
    }
    s->pending = np;
    s->cap_pending = ncap;
  }
  s->pending[s->n_pending++] = p;
}

void ckv_attach_pending_input(ckv_server *s, size_t i) {
  if (i >= s->n_pending) return;
  int r = ckv_attach_frame_read(&s->pending[i].frame, s->pending[i].fd, ATTACH_MAX_FRAME);
  if (r == CKV_ATTACH_FRAME_MORE) return;
  ckv_pending_attach p = s->pending[i];
  s->pending[i] = s->pending[--s->n_pending];
  pending_finish(s, &p, r);
}

void ckv_attach_expire(ckv_server *s, uint64_t now_ms) {
  for (size_t i = s->n_pending; i-- > 0;) {
    if (now_ms < s->pending[i].deadline_ms) continue;
    ckv_pending_attach p = s->pending[i];
    s->pending[i] = s->pending[--s->n_pending];
    char msg[160];
    snprintf(msg, sizeof(msg), "attach: no complete AttachRequest within %u ms of connecting", ATTACH_DEADLINE_MS);
    refuse_unread(s, p.fd, CKV_ERR_TIMEOUT, msg);
    ckv_attach_frame_done(&p.frame);
  }
  for (size_t i = s->n_refused; i-- > 0;)
    if (now_ms >= s->refused[i].close_ms) {
      close(s->refused[i].fd);
      s->refused[i] = s->refused[--s->n_refused];
    }
}

void ckv_attach_refused_input(ckv_server *s, size_t i) {
  if (i >= s->n_refused) return;
  /* No control buffer: descriptors a peer attaches are released by the kernel. */
  uint8_t sink[4096];
  ssize_t r = recv(s->refused[i].fd, sink, sizeof(sink), MSG_DONTWAIT);
  if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) return;
  close(s->refused[i].fd);
  s->refused[i] = s->refused[--s->n_refused];
}

void ckv_attach_pending_free(ckv_server *s) {
  for (size_t i = 0; i < s->n_pending; i++) {
    close(s->pending[i].fd);
    ckv_attach_frame_done(&s->pending[i].frame);
  }
  free(s->pending);
  s->pending = NULL;
  s->n_pending = s->cap_pending = 0;
  for (size_t i = 0; i < s->n_refused; i++) close(s->refused[i].fd);
  s->n_refused = 0;
}

/* ---- attached connections ------------------------------------------------ */

bool ckv_attach_conn_late(const ckv_conn *c, uint64_t now_ms) {
  return c->frame_deadline_ms && now_ms >= c->frame_deadline_ms;
}

bool ckv_attach_conn_input(ckv_server *s, ckv_conn *c) {
  int fd = c->attach_fd;
  int r = ckv_attach_frame_read(&c->frame, fd, ATTACH_MAX_FRAME);
  if (r == CKV_ATTACH_FRAME_MORE) {
    if (!c->frame_deadline_ms && ckv_attach_frame_started(&c->frame))
      c->frame_deadline_ms = ckv_now_ms() + ATTACH_DEADLINE_MS;
    return true;
  }
  if (r < 0) return false; /* EOF (the process exited) or garbage: either way the client is gone */
  static const uint8_t empty[1];
  ckv_wire_reset(&s->in);
  Commitkv__V1__AttachRequest *req =
      commitkv__v1__attach_request__unpack(&s->in.allocator, c->frame.len, c->frame.body ? c->frame.body : empty);
  ckv_attach_frame_done(&c->frame); /* the unpacked request owns copies */
  c->frame_deadline_ms = 0;
  if (!req || !req->refresh) {
    refuse(fd, CKV_ERR_PROTO, "attach socket: only AttachRequest{refresh} is expected after attaching");
    return true;
  }
  Commitkv__V1__AttachReply rep = COMMITKV__V1__ATTACH_REPLY__INIT;
  reply_for(s, c, &rep);
  rep.message = "arenas";
  Commitkv__V1__ArenaInfo info = COMMITKV__V1__ARENA_INFO__INIT, *infos[1] = {&info};
  ckv_arena_desc ex;
  if (c->tenant && c->wants_arenas) {
    r = arena_info(c->tenant, &info, &ex);
    if (r < 0) {
      char msg[160];
      snprintf(msg, sizeof(msg), "refresh: cannot export the arena: %s", ckv_strerror(r));
      refuse(fd, r, msg);
      return true;
    }
    rep.n_arenas = 1;
    rep.arenas = infos;
  }
  /* the tenant's prefix index as it is now (a full one was replaced by a
   * bigger one: the worker's lookups said so) */
  int fds[CKV_ARENA_MAX_FDS + 1];
  Commitkv__V1__PrefixIndexInfo pix = COMMITKV__V1__PREFIX_INDEX_INFO__INIT;
  size_t n_fds = reply_fds(c->tenant, rep.n_arenas ? &ex : NULL, req->want_prefix_index, fds, &pix, &rep);
  /* A client that does not read its replies cannot be sent the next one
   * whole: its stream would be cut mid-frame, so it goes. */
  if (send_reply(fd, &rep, n_fds ? fds : NULL, n_fds) < 0) return false;
  c->last_seen_ms = ckv_now_ms();
  return true;
}

/* ---- tenants, limits, a client's end ---- */

ckv_tenant *ckv_attach_tenant(ckv_server *s, const ckv_tenant_spec *spec, int *ret_status) {
  return ckv_store_tenant(&s->store, spec, ret_status);
}

void ckv_attach_retune_tenant(ckv_server *s, ckv_tenant *t, const ckv_tenant_spec *spec) {
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
      spec->policies != t->policies || spec->default_policy != t->default_policy ||
      spec->quota_disk != t->quota_disk || spec->max_snapshots != t->max_snapshots)
    ckv_log(CKV_LOG_NOTICE, "tenant-reload", t->name, NULL,
            "quota %llu -> %llu bytes (%llu in use), max_sessions %u -> %u, max_clients %u -> %u, quota_disk %llu -> "
            "%llu bytes, max_snapshots %u -> %u",
            (unsigned long long)t->quota_bytes, (unsigned long long)quota, (unsigned long long)t->bytes_used,
            t->max_sessions, max_sessions, t->max_clients, spec->max_clients, (unsigned long long)t->quota_disk,
            (unsigned long long)spec->quota_disk, t->max_snapshots, spec->max_snapshots);
  /* A quota below what is in use refuses new blocks until enough is freed:
   * nothing held is taken away by a reload. */
  t->quota_bytes = quota;
  t->max_sessions = max_sessions;
  t->max_clients = spec->max_clients;
  t->quota_disk = spec->quota_disk; /* files over a lowered quota stay; new writes wait until they go */
  t->high_water = spec->high_water;
  t->max_snapshots = spec->max_snapshots;
  t->policies = spec->policies;
  t->default_policy = spec->default_policy;
}

const char *ckv_attach_client_limit(const ckv_server *s, const ckv_tenant_spec *spec, char *buf, size_t len) {
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

void ckv_attach_detach_session(ckv_server *s, ckv_srv_session *sess) {
  sess->owner = 0;
  sess->detached_at_ms = ckv_now_ms();
  ckv_srv_session_release_retired(sess); /* no reader is left to protect */
  s->counters.sessions_detached++;
}

void ckv_attach_drop_conn(ckv_server *s, ckv_conn *c, int level, const char *why) {
  size_t cur = 0, detached = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL)))
    if (sess->owner == c->id) {
      ckv_attach_detach_session(s, sess);
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
