/* attach.c - the attach handshake on the unix socket.
 *
 * The kernel tells us who the peer is (SO_PEERCRED); the configured mapping
 * turns uid/gid into a tenant; the reply carries that tenant's arena fds
 * (SCM_RIGHTS) and a fresh random attach key, which the client then uses as
 * its ZeroMQ routing id.  A peer that maps to no tenant is refused with
 * CKV_ERR_AUTH.  The connection stays open for the client's life: its EOF is
 * the fastest possible lease expiry.
 *
 * Accepted connections wait in the server's poll set (with a deadline) until
 * their request is readable, so a silent peer never stalls the loop. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/strmap.h"
#include "daemon/tenant.h"
#include "shm/arena.h"
#include "shm/fdpass.h"

#define ATTACH_IO_TIMEOUT_MS 50
#define ATTACH_MAX_FRAME 4096

static void send_reply(int fd, const Commitkv__V1__AttachReply *rep, const int *fds, size_t n_fds) {
  uint8_t buf[ATTACH_MAX_FRAME];
  Commitkv__V1__AttachReply fixed = *rep; /* every text valid UTF-8 (wire.h); the caller's copy stays */
  ckv_wire_fix_strings(NULL, &fixed.base);
  size_t len = commitkv__v1__attach_reply__get_packed_size(&fixed);
  if (len > sizeof(buf)) return;
  commitkv__v1__attach_reply__pack(&fixed, buf);
  (void)ckv_frame_send(fd, buf, len, fds, n_fds);
}

static void refuse(int fd, int code, const char *msg) {
  Commitkv__V1__AttachReply rep = COMMITKV__V1__ATTACH_REPLY__INIT;
  rep.code = code;
  rep.message = (char *)msg;
  rep.version = CKV_PROTOCOL_VERSION;
  send_reply(fd, &rep, NULL, 0);
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

void ckv_attach_serve(ckv_server *s, int fd) {
  /* The request is already readable (the loop polled for it); a peer that
   * sends half a frame and stalls costs at most this much of the loop. */
  if (ckv_sock_set_timeout(fd, ATTACH_IO_TIMEOUT_MS) < 0) {
    close(fd);
    return;
  }

  ckv_peer peer;
  int r = ckv_peercred(fd, &peer);
  if (r < 0) {
    close(fd);
    return;
  }
  uint8_t buf[ATTACH_MAX_FRAME];
  size_t len = 0;
  r = ckv_frame_recv(fd, buf, sizeof(buf), &len, NULL, 0, NULL);
  char msg[256];
  if (r < 0) {
    snprintf(msg, sizeof(msg), "attach: bad request frame: %s", ckv_strerror(r));
    refuse(fd, r == CKV_ERR_TOO_LARGE ? CKV_ERR_TOO_LARGE : CKV_ERR_PROTO, msg);
    close(fd);
    return;
  }
  ckv_wire_reset(&s->in);
  Commitkv__V1__AttachRequest *req = commitkv__v1__attach_request__unpack(&s->in.allocator, len, buf);
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
  bool admin = peer.uid == 0 || peer.uid == (uint32_t)geteuid();
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
  if (ckv_strmap_size(s->conns) >= s->opt.max_clients) {
    refuse(fd, CKV_ERR_LIMIT, "attach: too many clients (max_clients)");
    close(fd);
    return;
  }
  ckv_tenant *t = NULL;
  if (mapped) {
    t = ckv_server_tenant(s, &spec, &r);
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
  snprintf(c->name, sizeof(c->name), "%s", req->client_name && *req->client_name ? req->client_name : "client");
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
      ckv_server_drop_conn(s, c, CKV_LOG_WARNING, "arena export failed");
      return;
    }
    exported = true;
    c->wants_arenas = true;
    rep.n_arenas = 1;
    rep.arenas = infos;
  }
  send_reply(fd, &rep, exported ? ex.fds : NULL, exported ? ex.n_fds : 0);
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  ckv_log(CKV_LOG_INFO, "attach", t ? t->name : NULL, NULL, "client %llu '%s' pid %u uid %u%s",
          (unsigned long long)c->id, c->name, c->pid, c->uid, admin ? " (admin)" : "");
}

bool ckv_attach_conn_input(ckv_server *s, ckv_conn *c) {
  int fd = c->attach_fd;
  /* The frame is tiny and was sent in one piece: read it with the attach
   * timeout, blocking, then put the socket back as the loop wants it. */
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) return false;
  uint8_t buf[ATTACH_MAX_FRAME];
  size_t len = 0;
  int r = ckv_frame_recv(fd, buf, sizeof(buf), &len, NULL, 0, NULL);
  (void)fcntl(fd, F_SETFL, fl);
  if (r < 0) return false; /* EOF (the process exited) or garbage: either way the client is gone */
  ckv_wire_reset(&s->in);
  Commitkv__V1__AttachRequest *req = commitkv__v1__attach_request__unpack(&s->in.allocator, len, buf);
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
  send_reply(fd, &rep, rep.n_arenas ? ex.fds : NULL, rep.n_arenas ? ex.n_fds : 0);
  c->last_seen_ms = ckv_now_ms();
  return true;
}
