/* attach_frame.c - a non-blocking reader for one attach frame (see attach_frame.h). */
#include "daemon/attach_frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commitkv/status.h"

void ckv_attach_frame_init(ckv_attach_frame *f) { memset(f, 0, sizeof(*f)); }

void ckv_attach_frame_done(ckv_attach_frame *f) {
  free(f->body);
  ckv_attach_frame_init(f);
}

bool ckv_attach_frame_started(const ckv_attach_frame *f) { return f->hdr_got > 0; }

/* Closes every descriptor in the control data; true when there was one. */
static bool close_passed_fds(struct msghdr *m) {
  bool any = (m->msg_flags & MSG_CTRUNC) != 0; /* the kernel dropped some: still a frame with fds */
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
      close(fd);
      any = true;
    }
  }
  return any;
}

/* One non-blocking read of up to n bytes into p.  Returns CKV_OK with the
 * count (> 0) in *ret_n, CKV_ATTACH_FRAME_MORE when nothing is there, or the
 * error ckv_attach_frame_read reports (EOF included). */
static int read_some(int sock, void *p, size_t n, bool started, ssize_t *ret_n) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * 16)];
  } ctl;
  for (;;) {
    struct iovec iov = {.iov_base = p, .iov_len = n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    ssize_t r = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return CKV_ATTACH_FRAME_MORE;
      if (errno == ECONNRESET || errno == EPIPE) return CKV_ERR_DISCONNECTED;
      return -errno;
    }
    if (close_passed_fds(&m)) return CKV_ERR_PROTO;
    if (r == 0) return started ? CKV_ERR_PROTO : CKV_ERR_DISCONNECTED;
    *ret_n = r;
    return CKV_OK;
  }
}

int ckv_attach_frame_read(ckv_attach_frame *f, int sock, uint32_t max_len) {
  while (f->hdr_got < sizeof(f->hdr)) {
    ssize_t n = 0;
    int r = read_some(sock, f->hdr + f->hdr_got, sizeof(f->hdr) - f->hdr_got, f->hdr_got > 0, &n);
    if (r != CKV_OK) return r;
    f->hdr_got += (uint32_t)n;
    if (f->hdr_got < sizeof(f->hdr)) continue;
    f->len = (uint32_t)f->hdr[0] | (uint32_t)f->hdr[1] << 8 | (uint32_t)f->hdr[2] << 16 | (uint32_t)f->hdr[3] << 24;
    if (f->len > max_len) return CKV_ERR_TOO_LARGE;
    if (f->len && !(f->body = malloc(f->len))) return -ENOMEM;
  }
  while (f->got < f->len) {
    ssize_t n = 0;
    int r = read_some(sock, f->body + f->got, f->len - f->got, /* started= */ true, &n);
    if (r != CKV_OK) return r;
    f->got += (uint32_t)n;
  }
  return CKV_OK;
}
