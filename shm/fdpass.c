/* shm/fdpass.c - frames with file descriptors over unix sockets (see shm/fdpass.h).
 *
 * The descriptors ride on the first sendmsg() of a frame, whose data starts
 * with the length prefix, so they reach the receiver with the prefix's first
 * byte.  The receiver still parses control data on every read (a hostile
 * peer may attach descriptors anywhere) and owns, then closes, whatever it
 * did not ask for. */
#include "shm/fdpass.h"

#include "commitkv/status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

typedef union {
  struct cmsghdr align;
  char buf[CMSG_SPACE(sizeof(int) * CKV_FRAME_MAX_FDS)];
} fd_control;

/* Descriptors gathered while receiving one frame. */
typedef struct fd_bag {
  int fds[CKV_FRAME_MAX_FDS];
  size_t n;
  size_t max;    /* what the caller accepts */
  bool overflow; /* more arrived than max (they were closed) */
} fd_bag;

static void bag_close(fd_bag *b) {
  for (size_t i = 0; i < b->n; i++) close(b->fds[i]);
  b->n = 0;
}

static void bag_take(fd_bag *b, struct msghdr *m) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char *data = CMSG_DATA(c);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, data + i * sizeof(int), sizeof fd);
      if (b->n < b->max) {
        b->fds[b->n++] = fd;
      } else {
        close(fd);
        b->overflow = true;
      }
    }
  }
  /* The kernel dropped descriptors that did not fit: the frame is incomplete. */
  if (m->msg_flags & MSG_CTRUNC) b->overflow = true;
}

static int errno_status(int e) {
  if (e == EAGAIN || e == EWOULDBLOCK) return CKV_ERR_TIMEOUT;
  if (e == EPIPE || e == ECONNRESET) return CKV_ERR_DISCONNECTED;
  return -e;
}

/* Reads exactly n bytes (frame_pos: bytes of this frame read before). */
static int read_full(int sock, void *p, size_t n, size_t frame_pos, fd_bag *bag) {
  size_t got = 0;
  while (got < n) {
    fd_control ctl;
    struct iovec iov = {.iov_base = (char *)p + got, .iov_len = n - got};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno);
    }
    bag_take(bag, &m);
    if (r == 0) return frame_pos + got == 0 ? CKV_ERR_DISCONNECTED : CKV_ERR_PROTO;
    got += (size_t)r;
  }
  return CKV_OK;
}

int ckv_frame_recv(int sock, void *buf, size_t max_len, size_t *ret_len, int *ret_fds, size_t max_fds,
                   size_t *ret_n_fds) {
  if (!ret_len || (max_len && !buf) || max_fds > CKV_FRAME_MAX_FDS || (max_fds && (!ret_fds || !ret_n_fds)))
    return CKV_ERR_INVALID;
  fd_bag bag = {.n = 0, .max = max_fds, .overflow = false};
  unsigned char hdr[CKV_FRAME_HEADER_BYTES];
  int r = read_full(sock, hdr, sizeof hdr, 0, &bag);
  if (r < 0) goto fail;
  uint32_t len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  if (len > max_len) {
    r = CKV_ERR_TOO_LARGE;
    goto fail;
  }
  if (len) {
    r = read_full(sock, buf, len, sizeof hdr, &bag);
    if (r < 0) goto fail;
  }
  if (bag.overflow) {
    r = CKV_ERR_PROTO;
    goto fail;
  }
  if (max_fds) memcpy(ret_fds, bag.fds, bag.n * sizeof(int));
  if (ret_n_fds) *ret_n_fds = bag.n;
  *ret_len = len;
  return CKV_OK;
fail:
  bag_close(&bag);
  return r;
}

int ckv_frame_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds) {
  if ((len && !buf) || (n_fds && !fds) || n_fds > CKV_FRAME_MAX_FDS) return CKV_ERR_INVALID;
  if (len > UINT32_MAX) return CKV_ERR_TOO_LARGE;
  for (size_t i = 0; i < n_fds; i++)
    if (fds[i] < 0) return CKV_ERR_INVALID;
  unsigned char hdr[CKV_FRAME_HEADER_BYTES] = {(unsigned char)len, (unsigned char)(len >> 8),
                                               (unsigned char)(len >> 16), (unsigned char)(len >> 24)};
  struct iovec iov[2] = {{.iov_base = hdr, .iov_len = sizeof hdr}, {.iov_base = (void *)buf, .iov_len = len}};
  fd_control ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
  if (n_fds) {
    m.msg_control = ctl.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
  }
  size_t left = sizeof hdr + len;
  while (left > 0) {
    ssize_t r = sendmsg(sock, &m, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno);
    }
    /* The descriptors went with the first bytes; never send them twice. */
    m.msg_control = NULL;
    m.msg_controllen = 0;
    left -= (size_t)r;
    size_t adv = (size_t)r;
    while (adv > 0 && m.msg_iovlen > 0) {
      if (adv >= m.msg_iov[0].iov_len) {
        adv -= m.msg_iov[0].iov_len;
        m.msg_iov++;
        m.msg_iovlen--;
      } else {
        m.msg_iov[0].iov_base = (char *)m.msg_iov[0].iov_base + adv;
        m.msg_iov[0].iov_len -= adv;
        adv = 0;
      }
    }
  }
  return CKV_OK;
}

int ckv_peercred(int sock, ckv_peer *ret) {
  if (!ret) return CKV_ERR_INVALID;
  struct ucred uc;
  socklen_t l = sizeof uc;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &l) < 0) return -errno;
  if (l != sizeof uc) return -EINVAL;
  ret->uid = uc.uid;
  ret->gid = uc.gid;
  ret->pid = uc.pid;
  return CKV_OK;
}

static int fill_addr(const char *path, struct sockaddr_un *sa) {
  if (!path || !path[0]) return CKV_ERR_INVALID;
  size_t n = strlen(path);
  if (n >= sizeof sa->sun_path) return -ENAMETOOLONG;
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path, path, n + 1);
  return CKV_OK;
}

static int connect_addr(const struct sockaddr_un *sa, int *ret_fd) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  /* An interrupted AF_UNIX connect has not connected: just try again. */
  while (connect(fd, (const struct sockaddr *)sa, sizeof *sa) < 0) {
    if (errno == EINTR) continue;
    int r = -errno;
    close(fd);
    return r;
  }
  *ret_fd = fd;
  return CKV_OK;
}

int ckv_unix_connect(const char *path, int *ret_fd) {
  struct sockaddr_un sa;
  if (!ret_fd) return CKV_ERR_INVALID;
  int r = fill_addr(path, &sa);
  if (r < 0) return r;
  return connect_addr(&sa, ret_fd);
}

int ckv_unix_listen(const char *path, unsigned mode, int backlog, int *ret_fd) {
  struct sockaddr_un sa;
  if (!ret_fd) return CKV_ERR_INVALID;
  int r = fill_addr(path, &sa);
  if (r < 0) return r;

  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return -EEXIST;
    int probe = -1;
    r = connect_addr(&sa, &probe);
    if (r == CKV_OK) {
      close(probe);
      return -EADDRINUSE;
    }
    if (r != -ECONNREFUSED) return r;
    if (unlink(path) < 0 && errno != ENOENT) return -errno;
  } else if (errno != ENOENT) {
    return -errno;
  }

  /* Bind under a temporary name and rename once listening: whoever sees the
   * path can connect at once (no ECONNREFUSED window between bind and listen). */
  char tmp[sizeof sa.sun_path];
  struct sockaddr_un ta = sa;
  bool staged = snprintf(tmp, sizeof tmp, "%s.%d~", path, (int)getpid()) < (int)sizeof tmp;
  if (staged) {
    unlink(tmp);
    memcpy(ta.sun_path, tmp, strlen(tmp) + 1);
  }
  const char *bound = staged ? tmp : path;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (bind(fd, (struct sockaddr *)&ta, sizeof ta) < 0) {
    r = -errno;
    close(fd);
    return r;
  }
  if (chmod(bound, (mode_t)mode) < 0 || listen(fd, backlog > 0 ? backlog : 64) < 0 ||
      (staged && rename(tmp, path) < 0)) {
    r = -errno;
    unlink(bound);
    close(fd);
    return r;
  }
  *ret_fd = fd;
  return CKV_OK;
}

int ckv_unix_accept(int listen_sock, int *ret_fd) {
  if (!ret_fd) return CKV_ERR_INVALID;
  for (;;) {
    int fd = accept4(listen_sock, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      *ret_fd = fd;
      return CKV_OK;
    }
    /* A client that gave up before we accepted it is not our error. */
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? CKV_ERR_TIMEOUT : -errno;
  }
}

int ckv_sock_set_timeout(int sock, unsigned timeout_ms) {
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
  if (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) return -errno;
  if (setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0) return -errno;
  return CKV_OK;
}
