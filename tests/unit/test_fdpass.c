/* test_fdpass.c - frames with descriptors over unix sockets (shm/fdpass.c):
 * descriptors and payload cross to another process, SO_PEERCRED names the
 * real peer, oversized / short / garbage frames are refused cleanly, surplus
 * descriptors are closed (never leaked), timeouts, partial writes, the
 * listening socket's mode and stale-socket handling. */
#include "commitkv/status.h"
#include "shm/fdpass.h"
#include "testcheck.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(fdpass, .fini = ckv_test_leak_check);

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static void pair(int sv[2]) { cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0); }

static int make_memfd(const char *text) {
  int fd = memfd_create("t", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  return fd;
}

static void expect_content(int fd, const char *text) {
  char buf[64] = {0};
  cr_assert_eq(pread(fd, buf, sizeof buf - 1, 0), (ssize_t)strlen(text));
  cr_assert_str_eq(buf, text);
}

static void wait_ok(pid_t pid) {
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %d", st);
}

/* Raw bytes, bypassing the framing (garbage and short frames). */
static void raw(int fd, const void *p, size_t n) { cr_assert_eq(write(fd, p, n), (ssize_t)n); }

/* ---- descriptors and payload to another process ---- */

Test(fdpass, fds_and_payload_cross_processes) {
  int sv[2];
  pair(sv);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    int a = memfd_create("a", MFD_CLOEXEC), b = memfd_create("b", MFD_CLOEXEC);
    if (a < 0 || b < 0 || write(a, "alpha", 5) != 5 || write(b, "beta", 4) != 4) _exit(2);
    int fds[2] = {a, b};
    _exit(ckv_frame_send(sv[1], "payload!", 8, fds, 2) == CKV_OK ? 0 : 3);
  }
  close(sv[1]);
  char buf[64];
  size_t len = 0, n = 0;
  int fds[4] = {-1, -1, -1, -1};
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 4, &n), CKV_OK);
  wait_ok(pid);
  cr_assert_eq(len, 8);
  cr_assert_eq(memcmp(buf, "payload!", 8), 0);
  cr_assert_eq(n, 2);
  for (int i = 0; i < 2; i++) cr_assert(fcntl(fds[i], F_GETFD) & FD_CLOEXEC, "received fd without CLOEXEC");
  expect_content(fds[0], "alpha");
  expect_content(fds[1], "beta");
  close(fds[0]);
  close(fds[1]);
  /* The child is gone: next read is an orderly end of stream. */
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 4, &n), CKV_ERR_DISCONNECTED);
  close(sv[0]);
}

Test(fdpass, frames_stay_in_sync) {
  int sv[2];
  pair(sv);
  int m1 = make_memfd("one"), m2 = make_memfd("two");
  cr_assert_eq(ckv_frame_send(sv[1], NULL, 0, &m1, 1), CKV_OK); /* empty payload, one fd */
  cr_assert_eq(ckv_frame_send(sv[1], "xy", 2, &m2, 1), CKV_OK);
  cr_assert_eq(ckv_frame_send(sv[1], "z", 1, NULL, 0), CKV_OK);
  char buf[8];
  size_t len, n;
  int fd;
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, &fd, 1, &n), CKV_OK);
  cr_assert_eq(len, 0);
  cr_assert_eq(n, 1);
  expect_content(fd, "one");
  close(fd);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, &fd, 1, &n), CKV_OK);
  cr_assert_eq(len, 2);
  cr_assert_eq(n, 1);
  expect_content(fd, "two");
  close(fd);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, &fd, 1, &n), CKV_OK);
  cr_assert_eq(len, 1);
  cr_assert_eq(n, 0);
  cr_assert_eq(buf[0], 'z');
  close(m1);
  close(m2);
  close(sv[0]);
  close(sv[1]);
}

/* ---- a real listening socket: mode, accept, peer credentials ---- */

Test(fdpass, listen_accept_peercred) {
  char *dir = ckv_test_tmpdir("ckv-fdpass");
  char path[256];
  snprintf(path, sizeof path, "%s/sock", dir);
  int l;
  cr_assert_eq(ckv_unix_listen(path, 0600, 0, &l), CKV_OK);
  cr_assert(fcntl(l, F_GETFD) & FD_CLOEXEC);
  struct stat st;
  cr_assert_eq(lstat(path, &st), 0);
  cr_assert(S_ISSOCK(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);

  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(l);
    int c;
    if (ckv_unix_connect(path, &c) != CKV_OK) _exit(2);
    if (!(fcntl(c, F_GETFD) & FD_CLOEXEC)) _exit(3);
    int m = memfd_create("m", MFD_CLOEXEC);
    if (m < 0 || write(m, "from child", 10) != 10) _exit(4);
    if (ckv_frame_send(c, "hello", 5, &m, 1) != CKV_OK) _exit(5);
    char b;
    size_t len;
    /* Stay connected until the parent has checked our credentials. */
    if (ckv_frame_recv(c, &b, 1, &len, NULL, 0, NULL) != CKV_OK) _exit(6);
    _exit(0);
  }
  int c;
  ckv_sock_set_timeout(l, 20000);
  cr_assert_eq(ckv_unix_accept(l, &c), CKV_OK);
  cr_assert(fcntl(c, F_GETFD) & FD_CLOEXEC);
  ckv_peer peer;
  cr_assert_eq(ckv_peercred(c, &peer), CKV_OK);
  cr_assert_eq(peer.pid, pid, "peer pid %d, child %d", (int)peer.pid, (int)pid);
  cr_assert_eq(peer.uid, getuid());
  cr_assert_eq(peer.gid, getgid());
  char buf[16];
  size_t len, n;
  int fd;
  cr_assert_eq(ckv_frame_recv(c, buf, sizeof buf, &len, &fd, 1, &n), CKV_OK);
  cr_assert_eq(len, 5);
  cr_assert_eq(n, 1);
  expect_content(fd, "from child");
  close(fd);
  cr_assert_eq(ckv_frame_send(c, "k", 1, NULL, 0), CKV_OK);
  wait_ok(pid);
  close(c);
  close(l);
  unlink(path);
  ckv_test_rmdir(dir);
}

Test(fdpass, stale_socket_replaced_live_one_and_files_kept) {
  char *dir = ckv_test_tmpdir("ckv-fdpass");
  char path[256];
  snprintf(path, sizeof path, "%s/sock", dir);
  /* A stale socket: bound, then its owner went away. */
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, path);
  cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
  close(s);
  int l, l2;
  cr_assert_eq(ckv_unix_listen(path, 0660, 4, &l), CKV_OK, "stale socket not replaced");
  /* A live one is not stolen. */
  cr_assert_eq(ckv_unix_listen(path, 0660, 4, &l2), -EADDRINUSE);
  int c;
  cr_assert_eq(ckv_unix_connect(path, &c), CKV_OK, "live socket was disturbed");
  close(c);
  close(l);
  unlink(path);
  /* A regular file is never removed. */
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fclose(f);
  cr_assert_eq(ckv_unix_listen(path, 0660, 4, &l), -EEXIST);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert(S_ISREG(st.st_mode));
  unlink(path);
  cr_assert_eq(ckv_unix_connect(path, &c), -ENOENT);
  char longp[200];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  cr_assert_eq(ckv_unix_listen(longp, 0600, 1, &l), -ENAMETOOLONG);
  cr_assert_eq(ckv_unix_connect(longp, &c), -ENAMETOOLONG);
  cr_assert_eq(ckv_unix_listen("", 0600, 1, &l), CKV_ERR_INVALID);
  ckv_test_rmdir(dir);
}

/* ---- oversized, short and garbage frames ---- */

Test(fdpass, oversize_frame_refused_without_reading_it) {
  char buf[1024];
  size_t len, n;
  int fds[2];
  int sv[2];
  /* Announce 1 MiB and send nothing more: a receiver that tried to read the
   * payload would block into the timeout instead of refusing at once. */
  pair(sv);
  ckv_sock_set_timeout(sv[0], 2000);
  uint8_t hdr[4] = {0x00, 0x00, 0x10, 0x00};
  raw(sv[1], hdr, sizeof hdr);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 2, &n), CKV_ERR_TOO_LARGE);
  close(sv[0]);
  close(sv[1]);
  /* One byte over the limit, with a descriptor attached: refused, and the
   * descriptor closed, not leaked. */
  pair(sv);
  int m = make_memfd("x");
  memset(buf, 'q', sizeof buf);
  cr_assert_eq(ckv_frame_send(sv[1], buf, 101, &m, 1), CKV_OK);
  int base = open_fds();
  cr_assert_eq(ckv_frame_recv(sv[0], buf, 100, &len, fds, 2, &n), CKV_ERR_TOO_LARGE);
  cr_assert_eq(open_fds(), base, "descriptor of a refused frame leaked");
  close(m);
  close(sv[0]);
  close(sv[1]);
  /* Garbage: a length of 0xffffffff. */
  pair(sv);
  uint8_t junk[8] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4};
  raw(sv[1], junk, sizeof junk);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 2, &n), CKV_ERR_TOO_LARGE);
  /* The sender refuses what the prefix cannot express. */
  cr_assert_eq(ckv_frame_send(sv[1], buf, (size_t)UINT32_MAX + 1, NULL, 0), CKV_ERR_TOO_LARGE);
  close(sv[0]);
  close(sv[1]);
}

Test(fdpass, short_frames_refused) {
  char buf[64];
  size_t len, n;
  int fds[2];
  int sv[2];
  /* Half a length prefix, then the peer closes. */
  pair(sv);
  raw(sv[1], "\x05\x00", 2);
  close(sv[1]);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 2, &n), CKV_ERR_PROTO);
  close(sv[0]);
  /* A full prefix announcing 10 bytes, 5 bytes, close. */
  pair(sv);
  raw(sv[1], "\x0a\x00\x00\x00hello", 9);
  close(sv[1]);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 2, &n), CKV_ERR_PROTO);
  close(sv[0]);
  /* Close at a frame boundary: disconnected, not malformed. */
  pair(sv);
  close(sv[1]);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 2, &n), CKV_ERR_DISCONNECTED);
  close(sv[0]);
  /* A short frame carrying a descriptor: refused and the descriptor closed. */
  pair(sv);
  int m = make_memfd("x");
  uint8_t hdr[4] = {20, 0, 0, 0};
  char cbuf[CMSG_SPACE(sizeof(int))];
  memset(cbuf, 0, sizeof cbuf);
  struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &m, sizeof m);
  cr_assert_eq(sendmsg(sv[1], &msg, 0), (ssize_t)sizeof hdr);
  close(m);
  close(sv[1]);
  int base = open_fds();
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 2, &n), CKV_ERR_PROTO);
  cr_assert_eq(open_fds(), base, "descriptor of a short frame leaked");
  close(sv[0]);
}

/* ---- surplus and unexpected descriptors are closed ---- */

Test(fdpass, surplus_fds_closed_and_frame_refused) {
  int sv[2];
  pair(sv);
  int m[3] = {make_memfd("a"), make_memfd("b"), make_memfd("c")};
  int base = open_fds();
  char buf[16];
  size_t len, n = 99;
  int fds[CKV_FRAME_MAX_FDS];
  /* Three where one is allowed. */
  cr_assert_eq(ckv_frame_send(sv[1], "abc", 3, m, 3), CKV_OK);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 1, &n), CKV_ERR_PROTO);
  cr_assert_eq(n, 99, "ret_n_fds written on failure");
  cr_assert_eq(open_fds(), base, "surplus descriptors leaked");
  /* Any where none is expected. */
  cr_assert_eq(ckv_frame_send(sv[1], "d", 1, m, 2), CKV_OK);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, NULL, 0, NULL), CKV_ERR_PROTO);
  cr_assert_eq(open_fds(), base, "unexpected descriptors leaked");
  /* More than the control buffer holds (truncated control data). */
  int many[20];
  for (int i = 0; i < 20; i++) many[i] = m[i % 3];
  char cbuf[CMSG_SPACE(sizeof many)];
  memset(cbuf, 0, sizeof cbuf);
  uint8_t hdr[5] = {1, 0, 0, 0, 'e'};
  struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof many);
  memcpy(CMSG_DATA(c), many, sizeof many);
  cr_assert_eq(sendmsg(sv[1], &msg, 0), (ssize_t)sizeof hdr);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, CKV_FRAME_MAX_FDS, &n), CKV_ERR_PROTO);
  cr_assert_eq(open_fds(), base, "descriptors of a truncated control message leaked");
  /* The stream is still in step after all of that. */
  cr_assert_eq(ckv_frame_send(sv[1], "ok", 2, m, 1), CKV_OK);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, 1, &n), CKV_OK);
  cr_assert_eq(len, 2);
  cr_assert_eq(n, 1);
  expect_content(fds[0], "a");
  close(fds[0]);
  for (int i = 0; i < 3; i++) close(m[i]);
  close(sv[0]);
  close(sv[1]);
}

/* ---- timeouts, big frames (partial writes), closed peers, bad arguments ---- */

Test(fdpass, timeout) {
  int sv[2];
  pair(sv);
  cr_assert_eq(ckv_sock_set_timeout(sv[0], 100), CKV_OK);
  char buf[4];
  size_t len;
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, NULL, 0, NULL), CKV_ERR_TIMEOUT);
  /* A timeout before the first byte leaves the stream usable. */
  cr_assert_eq(ckv_frame_send(sv[1], "abc", 3, NULL, 0), CKV_OK);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, NULL, 0, NULL), CKV_OK);
  cr_assert_eq(len, 3);
  close(sv[0]);
  close(sv[1]);
}

static void on_alarm(int sig) { (void)sig; }

/* SIGALRM every 500 us without SA_RESTART: blocking sendmsg/recvmsg calls
 * come back early with EINTR or with a partial count. */
static void interrupt_often(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {.it_interval = {0, 500}, .it_value = {0, 500}};
  setitimer(ITIMER_REAL, &it, NULL);
}

static void interrupt_stop(void) {
  struct itimerval it = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &it, NULL);
}

static uint8_t big_byte(size_t i) { return (uint8_t)(i * 7 + (i >> 13)); }

Test(fdpass, big_frame_partial_writes) {
  const size_t big = 32u << 20; /* far beyond the socket buffer */
  int sv[2];
  pair(sv);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[1]);
    uint8_t *p = malloc(big);
    if (!p) _exit(2);
    usleep(100 * 1000); /* let the sender block on a full socket */
    interrupt_often();
    size_t len, n;
    int fd;
    int r = ckv_frame_recv(sv[0], p, big, &len, &fd, 1, &n);
    interrupt_stop();
    if (r != CKV_OK || len != big || n != 1) _exit(3);
    for (size_t i = 0; i < big; i++)
      if (p[i] != big_byte(i)) _exit(4);
    close(fd);
    free(p);
    _exit(0);
  }
  close(sv[0]);
  uint8_t *p = malloc(big);
  cr_assert_not_null(p);
  for (size_t i = 0; i < big; i++) p[i] = big_byte(i);
  int m = make_memfd("m");
  interrupt_often();
  int r = ckv_frame_send(sv[1], p, big, &m, 1);
  interrupt_stop();
  cr_assert_eq(r, CKV_OK, "send: %s", ckv_status_name(r));
  free(p);
  close(m);
  wait_ok(pid);
  close(sv[1]);
}

Test(fdpass, send_to_closed_peer_is_an_error_not_sigpipe) {
  int sv[2];
  pair(sv);
  close(sv[0]);
  /* Default SIGPIPE disposition: without MSG_NOSIGNAL this test dies. */
  signal(SIGPIPE, SIG_DFL);
  cr_assert_eq(ckv_frame_send(sv[1], "x", 1, NULL, 0), CKV_ERR_DISCONNECTED);
  close(sv[1]);
}

Test(fdpass, bad_arguments) {
  int sv[2];
  pair(sv);
  char buf[4];
  size_t len, n;
  int fds[CKV_FRAME_MAX_FDS + 1];
  int bad = -1;
  cr_assert_eq(ckv_frame_send(sv[1], NULL, 3, NULL, 0), CKV_ERR_INVALID);
  cr_assert_eq(ckv_frame_send(sv[1], "x", 1, &bad, 1), CKV_ERR_INVALID);
  cr_assert_eq(ckv_frame_send(sv[1], "x", 1, fds, CKV_FRAME_MAX_FDS + 1), CKV_ERR_INVALID);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, NULL, NULL, 0, NULL), CKV_ERR_INVALID);
  cr_assert_eq(ckv_frame_recv(sv[0], buf, sizeof buf, &len, fds, CKV_FRAME_MAX_FDS + 1, &n), CKV_ERR_INVALID);
  cr_assert_eq(ckv_frame_recv(sv[0], NULL, 4, &len, NULL, 0, NULL), CKV_ERR_INVALID);
  cr_assert_eq(ckv_peercred(sv[0], NULL), CKV_ERR_INVALID);
  ckv_peer p;
  int fd = make_memfd("x");
  cr_assert_eq(ckv_peercred(fd, &p), -ENOTSOCK);
  cr_assert_eq(ckv_frame_send(fd, "x", 1, NULL, 0), -ENOTSOCK);
  close(fd);
  close(sv[0]);
  close(sv[1]);
}
