/* tests/fuzz/fuzz_attach_frame.c - the attach socket: framing, partial
 * frames, descriptors passed with SCM_RIGHTS, and the AttachRequest decode.
 *
 * An in-process ckv_server (fuzz_server.h).  Each connection is a
 * socketpair: the daemon's end goes to ckv_attach_accept exactly as
 * accept4 hands it over (non-blocking; SO_PEERCRED works on a socketpair),
 * the other end is the fuzzer's client.  The input is a program: connect,
 * send a piece of bytes (any split of a frame), send bytes with 1..20
 * descriptors attached (more than the daemon's control buffer holds), send
 * a well-formed AttachRequest built from input fields (version, want_arenas,
 * refresh, name), half-close, close, let the daemon read (what its loop does
 * when poll says readable: pending attaches, refused ones, attached clients'
 * refresh frames), let time pass (deadlines, lingering refusals), change
 * whether peers map to a tenant (a SIGHUP).  Every reply the daemon sends
 * must be a whole frame holding an AttachReply; descriptors it passes are
 * closed by the client.  At the end every client closes and the daemon
 * sees EOF: nothing may stay pending, refused or attached, the tenant counts
 * no client, and the process has exactly the descriptors it had before
 * (descriptors a peer passed are closed, none leak). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "commitkv.pb-c.h"
#include "commitkv/status.h"
#include "daemon/attach.h"
#include "daemon/server.h"
#include "common/strmap.h"
#include "store/shared.h"
#include "store/tenant.h"
#include "fuzz.h"
#include "fuzz_server.h"

#define MAX_CLIENTS 12
#define MAX_OPS 128
#define INBOX 65536

typedef struct client {
  int fd; /* -1: none */
  uint8_t inbox[INBOX];
  size_t n_inbox;
} client;

static ckv_fuzz_server g_fs;
static ckv_server *g_server;
static bool g_mapped = true;
static int g_devnull = -1;
static client g_clients[MAX_CLIENTS];

static bool resolve(void *ctx, uint32_t uid, uint32_t gid, ckv_tenant_spec *ret) {
  (void)ctx;
  (void)uid;
  (void)gid;
  if (!g_mapped) return false;
  *ret = (ckv_tenant_spec){.name = "fuzz", .max_clients = 3, .default_policy = -1};
  return true;
}

int ckv_fuzz_attach_frame_init(void) {
  if (g_server) return 0;
  ckv_fuzz_server_start(&g_fs, "fuzz_attach", resolve, NULL);
  g_server = g_fs.server;
  g_devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CKV_FUZZ_CHECK(g_devnull >= 0, "open /dev/null");
  for (int i = 0; i < MAX_CLIENTS; i++) g_clients[i].fd = -1;
  /* The tenant's arena exists from the first attach on, and its published
   * prefix index (two descriptors: the daemon's and the workers' read-only
   * one) from the first attach that asks for it: make both now, so an
   * input's descriptor count does not see their memfds appear. */
  ckv_tenant_spec spec;
  resolve(NULL, 0, 0, &spec);
  int r = 0;
  ckv_tenant *t = ckv_attach_tenant(g_server, &spec, &r);
  CKV_FUZZ_CHECK(t, "tenant: %s", ckv_strerror(r));
  uint64_t index_bytes = 0;
  CKV_FUZZ_CHECK(ckv_prefix_index_fd(t, &index_bytes) >= 0, "the tenant's prefix index");
  return 0;
}

/* Reads what the daemon sent to client c; every complete frame must hold an
 * AttachReply, and descriptors that came with it are closed. */
static void client_drain(client *c) {
  for (;;) {
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int) * 16)];
    } ctl;
    struct iovec iov = {.iov_base = c->inbox + c->n_inbox, .iov_len = INBOX - c->n_inbox};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    if (iov.iov_len == 0) c->n_inbox = 0; /* a reply larger than the inbox cannot be: ATTACH_MAX_FRAME */
    ssize_t r = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); r >= 0 && h; h = CMSG_NXTHDR(&m, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(fd));
        close(fd);
      }
    }
    if (r <= 0) return;
    c->n_inbox += (size_t)r;
    while (c->n_inbox >= 4) {
      uint32_t len = (uint32_t)c->inbox[0] | (uint32_t)c->inbox[1] << 8 | (uint32_t)c->inbox[2] << 16 |
                     (uint32_t)c->inbox[3] << 24;
      CKV_FUZZ_CHECK(len <= 4096, "a reply frame announces %u bytes", len);
      if (c->n_inbox < 4 + (size_t)len) break;
      Commitkv__V1__AttachReply *rep = commitkv__v1__attach_reply__unpack(NULL, len, c->inbox + 4);
      CKV_FUZZ_CHECK(rep, "a %u-byte reply frame is not an AttachReply", len);
      commitkv__v1__attach_reply__free_unpacked(rep, NULL);
      memmove(c->inbox, c->inbox + 4 + len, c->n_inbox - 4 - len);
      c->n_inbox -= 4 + (size_t)len;
    }
  }
}

static void client_close(client *c) {
  if (c->fd < 0) return;
  client_drain(c);
  close(c->fd);
  c->fd = -1;
  c->n_inbox = 0;
}

/* What the loop does when its poll set says readable (it also calls these
 * when nothing is there: a read that would block is a no-op). */
static void daemon_reads(void) {
  ckv_server *s = g_server;
  for (size_t i = s->n_refused; i-- > 0;) ckv_attach_refused_input(s, i);
  for (size_t i = s->n_pending; i-- > 0;) ckv_attach_pending_input(s, i);
  size_t cur = 0;
  ckv_conn *c;
  while ((c = ckv_strmap_next(s->conns, &cur, NULL)))
    if (!ckv_attach_conn_input(s, c)) ckv_attach_drop_conn(s, c, 6, "attach socket closed (process exited)");
}

/* The loop's housekeeping at `now`: deadlines of pending and half-sent frames. */
static void daemon_expire(uint64_t now) {
  ckv_server *s = g_server;
  ckv_attach_expire(s, now);
  size_t cur = 0;
  ckv_conn *c;
  while ((c = ckv_strmap_next(s->conns, &cur, NULL)))
    if (ckv_attach_conn_late(c, now)) ckv_attach_drop_conn(s, c, 4, "half a frame, not completed in time");
}

static void send_bytes(client *c, const uint8_t *p, size_t n, size_t n_fds) {
  if (c->fd < 0) return;
  int fds[20];
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(fds))];
  } ctl;
  static const uint8_t zero = 0;
  struct iovec iov = {.iov_base = (void *)(n ? p : &zero), .iov_len = n ? n : 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n_fds) {
    for (size_t i = 0; i < n_fds; i++) fds[i] = g_devnull;
    memset(&ctl, 0, sizeof(ctl));
    m.msg_control = ctl.buf;
    m.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
    memcpy(CMSG_DATA(h), fds, n_fds * sizeof(int));
  } else if (!n) {
    return;
  }
  (void)sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL); /* a full or closed socket: the peer's problem */
}

static void send_request(client *c, ckv_fuzz_in *in) {
  uint8_t flags = ckv_fuzz_u8(in);
  const uint8_t *name;
  size_t name_len = ckv_fuzz_bytes(in, ckv_fuzz_u8(in) % 80, &name);
  char buf[96];
  memcpy(buf, name, name_len);
  buf[name_len] = 0;
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = flags & 3;
  req.want_arenas = (flags & 4) != 0;
  req.refresh = (flags & 8) != 0;
  req.client_name = buf;
  uint8_t frame[4 + 256];
  size_t len = commitkv__v1__attach_request__get_packed_size(&req);
  CKV_FUZZ_CHECK(len <= 256, "request of %zu bytes", len);
  commitkv__v1__attach_request__pack(&req, frame + 4);
  for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(len >> (8 * i));
  /* whole, or cut in two pieces with the daemon reading in between */
  size_t cut = flags & 16 ? (size_t)(flags >> 5) % (len + 4) : len + 4;
  send_bytes(c, frame, cut, 0);
  if (cut < len + 4) {
    daemon_reads();
    send_bytes(c, frame + cut, len + 4 - cut, 0);
  }
}

static client *pick(ckv_fuzz_in *in) { return &g_clients[ckv_fuzz_u8(in) % MAX_CLIENTS]; }

int ckv_fuzz_attach_frame(const uint8_t *data, size_t size) {
  ckv_fuzz_attach_frame_init();
  ckv_server *s = g_server;
  ckv_fuzz_in in = {data, size};
  g_mapped = true;
  /* Counted per input: libFuzzer itself opens pipes between inputs (its
   * symbolizer), never during one. */
  const int base_fds = ckv_fuzz_open_fds();
  uint64_t clock = ckv_now_ms();
  for (int op = 0; op < MAX_OPS && in.n; op++) {
    uint8_t code = ckv_fuzz_u8(&in);
    client *c = pick(&in);
    switch (code % 9) {
      case 0: {
        if (c->fd >= 0) break;
        int sv[2];
        CKV_FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0, "socketpair");
        c->fd = sv[0];
        ckv_attach_accept(s, sv[1]);
        break;
      }
      case 1: {
        const uint8_t *p;
        size_t n = ckv_fuzz_frame(&in, &p);
        send_bytes(c, p, n, 0);
        break;
      }
      case 2: {
        size_t n_fds = 1 + ckv_fuzz_u8(&in) % 20;
        const uint8_t *p;
        size_t n = ckv_fuzz_bytes(&in, ckv_fuzz_u8(&in) % 16, &p);
        send_bytes(c, p, n, n_fds);
        break;
      }
      case 3: send_request(c, &in); break;
      case 4:
        if (c->fd >= 0) shutdown(c->fd, SHUT_WR);
        break;
      case 5: client_close(c); break;
      case 6: daemon_reads(); break;
      case 7:
        clock += (uint64_t)ckv_fuzz_u8(&in) * 10u;
        daemon_expire(clock);
        break;
      default: g_mapped = !g_mapped; break;
    }
    for (int i = 0; i < MAX_CLIENTS; i++)
      if (g_clients[i].fd >= 0) client_drain(&g_clients[i]);
  }
  /* Every client goes; the daemon sees each EOF, then every deadline passes. */
  g_mapped = true;
  for (int i = 0; i < MAX_CLIENTS; i++) client_close(&g_clients[i]);
  /* The loop reads one frame per readable event: as many turns as frames
   * are queued (an input holds fewer than 4096), then each EOF. */
  for (int turn = 0; turn < 4096 && (s->n_pending || s->n_refused || ckv_strmap_size(s->conns)); turn++)
    daemon_reads();
  daemon_expire(ckv_now_ms() + 60000);
  CKV_FUZZ_CHECK(s->n_pending == 0, "%zu attaches still pending", s->n_pending);
  CKV_FUZZ_CHECK(s->n_refused == 0, "%zu refused connections still open", s->n_refused);
  CKV_FUZZ_CHECK(ckv_strmap_size(s->conns) == 0, "%zu clients still attached", ckv_strmap_size(s->conns));
  for (size_t i = 0; i < s->store.n_tenants; i++)
    CKV_FUZZ_CHECK(s->store.tenants[i]->n_clients == 0, "tenant '%s' counts %llu clients", s->store.tenants[i]->name,
                   (unsigned long long)s->store.tenants[i]->n_clients);
  int fds = ckv_fuzz_open_fds();
  if (fds != base_fds) ckv_fuzz_print_fds();
  CKV_FUZZ_CHECK(fds == base_fds, "%d descriptors open after the input, %d before", fds, base_fds);
  return 0;
}
