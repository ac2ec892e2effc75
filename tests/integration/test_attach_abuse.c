/* test_attach_abuse.c - hostile local clients on the attach socket (issue 11,
 * items 2 and 3).  The attach socket is 0666: any local user may connect, and
 * the daemon's loop is one thread, so nothing a peer does there may stall it.
 *
 * Each test starts a real commitkvd and real peers: forked children that
 * switch to another uid (setresuid) before they connect, so SO_PEERCRED sees
 * a non-admin user, and trickle bytes, hold half-sent frames or hundreds of
 * idle connections.  Meanwhile the test measures what attached clients get:
 * libcommitkv heartbeats, `commitkvctl status`, fresh attaches by other uids.
 * The bounds are freeze detectors, not benchmarks: on the old code every one
 * of these calls waited seconds (the loop read a trickled frame byte by byte,
 * 50 ms per recvmsg), or attaches failed at once.  Last, the tenant's
 * prefix index a worker receives at attach (and on refresh) must be
 * read-only and sealed: a worker never writes what other workers read. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "shm/fdpass.h"
#include "rawclient.h"
#include "testcheck.h"
#include "testutil.h"

#define NOBODY_UID 65534u   /* tenant b: a mapped, non-admin user (the abuser) */
#define OTHER_UID 65533u    /* tenant c where mapped: a bystander; unmapped otherwise */
#define LORIS_LEN 4000u     /* the length a slow-loris announces */
#define LORIS_STEP_MS 40    /* one byte every this long: under the old 50 ms per-recv timeout */
/* Worst acceptable latency of one call while the abuse runs: freeze
 * detectors with a wide margin.  Measured on a 2-core machine shared with
 * other builds: the fixed daemon answers heartbeats in 1-5 ms, commitkvctl
 * status (fork, exec, attach, two requests) in about 11 ms and a bystander's
 * attach in 3-4 ms; the old one took 1.5-4.8 s per heartbeat and 3.1-3.5 s
 * per attach while the abuse lasted (a sanitizer build on a loaded runner
 * stays well under a second). */
#define MAX_HEARTBEAT_MS 1000
#define MAX_CTL_MS 2500
#define MAX_ATTACH_MS 1000

/* ---- the daemon -------------------------------------------------------- */

/* Starts commitkvd with `tenants` as its configuration (NULL: none) and
 * opens its directory to the other uids the children switch to. */
static void start(ckv_test_daemon *d, char **cfgdir, const char *tenants) {
  char cfg[400];
  *cfgdir = tenants ? ckv_test_write_config(tenants, cfg, sizeof(cfg)) : NULL;
  ckv_test_start_host(d, "256M", tenants ? (const char *const[]){"--config", cfg, NULL} : NULL);
  /* mkdtemp made the directory 0700; the children's uids must reach the
   * attach socket (0666) inside it. */
  cr_assert_eq(chmod(d->dir, 0755), 0);
}

static void stop(ckv_test_daemon *d, char *cfgdir) {
  ckv_test_stop_clean(d);
  ckv_test_rmdir(cfgdir);
}

static ckv_client *worker(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "victim"};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "the worker cannot attach: %s", ckv_strerror(r));
  return c;
}

/* ---- peers in other processes ------------------------------------------ */

/* What a child reports through its pipe. */
typedef struct report {
  int n;            /* attempts / connections made */
  int ok, limit, auth, timeout, other; /* answers by code */
  int first_code[4];                   /* codes of the first answers, in order */
  long long ms[4];                     /* how long each of those took */
  long long worst_ms;
  char text[200]; /* the message of the first refusal seen */
} report;

/* What a peer child (ckv_test_begin_as) is given: the daemon and a number. */
typedef struct peer {
  const ckv_test_daemon *d;
  int arg;
} peer;

#define CHILD_TIMEOUT_MS 30000

/* Bytes on a fresh attach connection, which the caller owns (-1: no connection). */
static int connect_and_send(const char *path, const void *bytes, size_t len) {
  int fd = -1;
  if (ckv_unix_connect(path, &fd) < 0) return -1;
  ckv_sock_set_timeout(fd, 5000);
  if (len) (void)send(fd, bytes, len, MSG_NOSIGNAL);
  return fd;
}

static void le32(uint8_t out[4], uint32_t v) {
  out[0] = (uint8_t)v, out[1] = (uint8_t)(v >> 8), out[2] = (uint8_t)(v >> 16), out[3] = (uint8_t)(v >> 24);
}

static size_t attach_request(uint8_t *buf, bool refresh) {
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = 1;
  req.client_name = "abuse-test";
  req.want_arenas = true;
  req.refresh = refresh;
  uint8_t body[256];
  size_t len = commitkv__v1__attach_request__pack(&req, body);
  le32(buf, (uint32_t)len);
  memcpy(buf + 4, body, len);
  return len + 4;
}

static void count(report *out, int code, long long ms, const char *text) {
  if (out->n < 4) out->first_code[out->n] = code, out->ms[out->n] = ms;
  out->n++;
  if (ms > out->worst_ms) out->worst_ms = ms;
  if (code == CKV_OK) out->ok++;
  else if (code == CKV_ERR_LIMIT) out->limit++;
  else if (code == CKV_ERR_AUTH) out->auth++;
  else if (code == CKV_ERR_TIMEOUT) out->timeout++;
  else out->other++;
  if (code != CKV_OK && !out->text[0] && text) snprintf(out->text, sizeof(out->text), "%s", text);
}

/* The slow-loris: announce a LORIS_LEN frame, then one byte every
 * LORIS_STEP_MS, for `ms`; a connection the daemon closes is replaced. */
static void loris(const void *ctx, void *out_buf) {
  const ckv_test_daemon *d = ((const peer *)ctx)->d;
  int ms = ((const peer *)ctx)->arg;
  report *out = out_buf;
  long long end = ckv_test_now_ms() + ms;
  while (ckv_test_now_ms() < end) {
    uint8_t hdr[4];
    le32(hdr, LORIS_LEN);
    int fd = connect_and_send(d->attach, hdr, 4);
    if (fd < 0) {
      usleep(10 * 1000);
      continue;
    }
    out->n++;
    while (ckv_test_now_ms() < end) {
      usleep(LORIS_STEP_MS * 1000);
      if (send(fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) break; /* the daemon hung up */
      out->ok++;                                                   /* bytes trickled */
    }
    close(fd);
  }
}

/* Times one `commitkvctl status`; fails the test when it fails. */
static long long timed_status(const ckv_test_daemon *d) {
  long long t0 = ckv_test_now_ms();
  char *out = ckv_test_ctl(d, (const char *const[]){"status", NULL});
  long long took = ckv_test_now_ms() - t0;
  cr_assert_not_null(out, "commitkvctl status failed after %lld ms", took);
  free(out);
  return took;
}

static long long timed_heartbeat(ckv_client *c) {
  long long t0 = ckv_test_now_ms();
  int r = ckv_client_heartbeat(c);
  long long took = ckv_test_now_ms() - t0;
  cr_assert_eq(r, CKV_OK, "an attached client's heartbeat failed after %lld ms: %s", took, ckv_strerror(r));
  return took;
}

/* Item 2: a peer trickling one byte every 40 ms into a 4000-byte frame.  The
 * old loop read that frame on its own thread (50 ms per recvmsg, reset by
 * each byte) and froze for as long as the trickle lasted. */
Test(attach_abuse, slow_loris_does_not_freeze_the_loop, .timeout = 120) {
  ckv_test_daemon d;
  char *cfgdir;
  start(&d, &cfgdir, "[tenant.a]\nuids = 0\n\n[tenant.b]\nuids = 65534\n");
  ckv_client *w = worker(&d);
  (void)timed_heartbeat(w);

  const int loris_ms = 5000;
  int fd;
  pid_t pid = ckv_test_begin_as(NOBODY_UID, NOBODY_UID, loris, &(peer){&d, loris_ms}, sizeof(report), &fd);
  usleep(200 * 1000); /* the trickle is under way */
  long long worst_hb = 0, worst_ctl = 0, t0 = ckv_test_now_ms();
  int rounds = 0;
  while (ckv_test_now_ms() - t0 < loris_ms - 700) {
    long long hb = timed_heartbeat(w), ctl = timed_status(&d);
    if (hb > worst_hb) worst_hb = hb;
    if (ctl > worst_ctl) worst_ctl = ctl;
    rounds++;
    usleep(100 * 1000);
  }
  report rep;
  ckv_test_end_as(pid, fd, &rep, sizeof(rep), CHILD_TIMEOUT_MS);
  cr_log_info("slow-loris: %d connections, %d bytes trickled; %d rounds, worst heartbeat %lld ms, worst "
              "commitkvctl status %lld ms",
              rep.n, rep.ok, rounds, worst_hb, worst_ctl);
  cr_assert_gt(rep.ok, 20, "the slow-loris hardly sent anything (%d bytes): the test did not test", rep.ok);
  cr_assert_lt(worst_hb, MAX_HEARTBEAT_MS, "a slow-loris on the attach socket delayed a heartbeat by %lld ms",
               worst_hb);
  cr_assert_lt(worst_ctl, MAX_CTL_MS, "a slow-loris on the attach socket delayed commitkvctl status by %lld ms",
               worst_ctl);
  ckv_client_free(w);
  stop(&d, cfgdir);
}

/* The same trickle on an attached connection (AttachRequest{refresh} is read
 * there): the old code read it blocking too.  The daemon drops that client
 * once its frame is late; everyone else is served throughout. */
Test(attach_abuse, slow_refresh_frame_does_not_freeze_the_loop, .timeout = 120) {
  ckv_test_daemon d;
  char *cfgdir;
  start(&d, &cfgdir, NULL);
  ckv_client *w = worker(&d);
  uint8_t req[300];
  size_t len = attach_request(req, /* refresh= */ false);
  int fd = connect_and_send(d.attach, req, len);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ckv_raw_attach_answer(fd, NULL, 0), CKV_OK);

  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    uint8_t hdr[4];
    le32(hdr, LORIS_LEN);
    if (send(fd, hdr, 4, MSG_NOSIGNAL) != 4) _exit(1);
    long long end = ckv_test_now_ms() + 4000;
    int sent = 0;
    while (ckv_test_now_ms() < end) {
      usleep(LORIS_STEP_MS * 1000);
      if (send(fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) break;
      sent++;
    }
    _exit(sent > 0 ? 0 : 2);
  }
  usleep(200 * 1000);
  long long worst_hb = 0, t0 = ckv_test_now_ms();
  while (ckv_test_now_ms() - t0 < 3000) {
    long long hb = timed_heartbeat(w);
    if (hb > worst_hb) worst_hb = hb;
    usleep(50 * 1000);
  }
  cr_assert_eq(ckv_test_wait(pid, 10000), 0, "the trickling child failed");
  cr_log_info("slow refresh frame: worst heartbeat %lld ms", worst_hb);
  cr_assert_lt(worst_hb, MAX_HEARTBEAT_MS, "a trickled refresh frame delayed a heartbeat by %lld ms", worst_hb);
  /* The trickling client was hung up on (its frame missed the deadline). */
  uint8_t b;
  struct timeval tv = {.tv_sec = 0, .tv_usec = 100 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  cr_assert_eq(recv(fd, &b, 1, 0), 0, "the daemon kept a client whose refresh frame never completed");
  close(fd);
  ckv_client_free(w);
  stop(&d, cfgdir);
}

/* Item 3's abuser: keeps `arg` connections open for 4 s, even ones idle, odd
 * ones with half a frame; whatever the daemon answers or closes is counted
 * and replaced at once. */
#define HOG_MS 4000
static int hog_open(const char *path, int i) {
  uint8_t half[14];
  le32(half, 100);
  memset(half + 4, 0x0a, 10);
  return connect_and_send(path, half, i % 2 ? sizeof(half) : 0);
}

static void hog(const void *ctx, void *out_buf) {
  const ckv_test_daemon *d = ((const peer *)ctx)->d;
  int n = ((const peer *)ctx)->arg;
  report *out = out_buf;
  int fds[256];
  struct pollfd pf[256];
  if (n > 256) n = 256;
  for (int i = 0; i < n; i++) fds[i] = hog_open(d->attach, i);
  long long end = ckv_test_now_ms() + HOG_MS;
  while (ckv_test_now_ms() < end) {
    for (int i = 0; i < n; i++) pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    if (poll(pf, (nfds_t)n, 20) <= 0) continue;
    for (int i = 0; i < n; i++) {
      if (!pf[i].revents) continue;
      char text[200] = "";
      ckv_sock_set_timeout(fds[i], 100);
      int code = ckv_raw_attach_answer(fds[i], text, sizeof(text));
      count(out, code, 0, text);
      close(fds[i]);
      fds[i] = hog_open(d->attach, i);
    }
  }
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* A bystander: attaches (full handshake, arenas included) every 100 ms for
 * `ms`, timing each. */
static void prober(const void *ctx, void *out_buf) {
  const ckv_test_daemon *d = ((const peer *)ctx)->d;
  int ms = ((const peer *)ctx)->arg;
  report *out = out_buf;
  long long end = ckv_test_now_ms() + ms;
  while (ckv_test_now_ms() < end) {
    uint8_t req[300];
    size_t len = attach_request(req, /* refresh= */ false);
    long long t0 = ckv_test_now_ms();
    int fd = connect_and_send(d->attach, req, len);
    char text[200] = "";
    int code = fd < 0 ? CKV_ERR_DISCONNECTED : ckv_raw_attach_answer(fd, text, sizeof(text));
    count(out, code, ckv_test_now_ms() - t0, text);
    if (fd >= 0) close(fd);
    usleep(100 * 1000);
  }
}

/* Item 3: one uid holds 200 idle or half-sent attach connections.  Its
 * newest are refused (CKV_ERR_LIMIT, pending per uid); another uid attaches,
 * an attached worker's heartbeats stay fast. */
Test(attach_abuse, pending_attaches_are_bounded_per_uid, .timeout = 120) {
  ckv_test_daemon d;
  char *cfgdir;
  start(&d, &cfgdir, "[tenant.a]\nuids = 0\n\n[tenant.b]\nuids = 65534\n\n[tenant.c]\nuids = 65533\n");
  ckv_client *w = worker(&d);
  (void)timed_heartbeat(w);

  int hog_fd;
  pid_t hog_pid = ckv_test_begin_as(NOBODY_UID, NOBODY_UID, hog, &(peer){&d, 200}, sizeof(report), &hog_fd);
  usleep(300 * 1000); /* the 200 connections are open */
  int probe_fd;
  pid_t probe_pid = ckv_test_begin_as(OTHER_UID, OTHER_UID, prober, &(peer){&d, HOG_MS - 1000}, sizeof(report),
                                      &probe_fd);
  long long worst_hb = 0, t0 = ckv_test_now_ms();
  int root_ok = 0, root_n = 0;
  char root_err[256] = "";
  while (ckv_test_now_ms() - t0 < HOG_MS - 1000) {
    long long hb = timed_heartbeat(w);
    if (hb > worst_hb) worst_hb = hb;
    /* Root (admin, tenant a) attaches through the real library too. */
    ckv_client_options o = {.socket = d.socket, .attach_socket = d.attach, .name = "late"};
    ckv_client *late = NULL;
    int r = ckv_client_connect(&o, &late);
    root_n++;
    if (r == CKV_OK) root_ok++;
    else if (!root_err[0]) snprintf(root_err, sizeof(root_err), "%s", ckv_strerror(r));
    ckv_client_free(late);
    usleep(100 * 1000);
  }
  report probe, abuse;
  ckv_test_end_as(probe_pid, probe_fd, &probe, sizeof(probe), CHILD_TIMEOUT_MS);
  ckv_test_end_as(hog_pid, hog_fd, &abuse, sizeof(abuse), CHILD_TIMEOUT_MS);
  cr_log_info("hog: %d answers (%d LIMIT, %d TIMEOUT, %d other) first refusal '%s'", abuse.n, abuse.limit,
              abuse.timeout, abuse.other, abuse.text);
  cr_log_info("uid %u: %d/%d attaches ok, worst %lld ms (first codes %d %d %d, '%s'); root %d/%d ok; worst "
              "heartbeat %lld ms",
              OTHER_UID, probe.ok, probe.n, probe.worst_ms, probe.first_code[0], probe.first_code[1],
              probe.first_code[2], probe.text, root_ok, root_n, worst_hb);
  cr_assert_eq(probe.ok, probe.n, "uid %u: only %d of %d attaches succeeded while uid %u held 200 connections "
               "(first refusal: %s)", OTHER_UID, probe.ok, probe.n, NOBODY_UID, probe.text);
  cr_assert_lt(probe.worst_ms, MAX_ATTACH_MS, "uid %u waited %lld ms for an attach", OTHER_UID, probe.worst_ms);
  cr_assert_gt(probe.n, 5, "the bystander hardly tried (%d attaches)", probe.n);
  cr_assert_eq(root_ok, root_n, "root: only %d of %d attaches succeeded (%s)", root_ok, root_n, root_err);
  cr_assert_lt(worst_hb, MAX_HEARTBEAT_MS, "200 idle or half-sent attach connections delayed a heartbeat by %lld "
               "ms", worst_hb);
  /* The abuser's surplus was refused at once, and said why. */
  cr_assert_gt(abuse.limit, 100, "only %d of uid %u's connections were refused with CKV_ERR_LIMIT", abuse.limit,
               NOBODY_UID);
  cr_assert(strstr(abuse.text, "pending"), "refusal text: '%s'", abuse.text);
  ckv_client_free(w);
  stop(&d, cfgdir);
}

/* A half-sent request frame is closed at its deadline (1 s from accept), with
 * CKV_ERR_TIMEOUT, not read on the loop with a per-read timeout. */
Test(attach_abuse, half_sent_frame_expires_at_its_deadline, .timeout = 60) {
  ckv_test_daemon d;
  char *cfgdir;
  start(&d, &cfgdir, NULL);
  uint8_t half[14];
  le32(half, 100);
  memset(half + 4, 0x0a, 10);
  long long t0 = ckv_test_now_ms();
  int fd = connect_and_send(d.attach, half, sizeof(half));
  cr_assert_geq(fd, 0);
  usleep(300 * 1000);
  (void)send(fd, "abc", 3, MSG_NOSIGNAL); /* more bytes do not extend the deadline */
  char text[200] = "";
  int code = ckv_raw_attach_answer(fd, text, sizeof(text));
  long long took = ckv_test_now_ms() - t0;
  close(fd);
  cr_log_info("half frame: %s after %lld ms (%s)", ckv_status_name(code), took, text);
  cr_assert_eq(code, CKV_ERR_TIMEOUT, "a half-sent frame was answered %s (%s)", ckv_status_name(code), text);
  cr_assert(took >= 800 && took < 3000, "a half-sent frame was answered after %lld ms (deadline 1000 ms)", took);
  stop(&d, cfgdir);
}

/* Item 2's second half: a uid that maps to no tenant (and is not admin) is
 * refused at accept, before the daemon reads anything from it.  The old code
 * waited for its frame first: silence cost the deadline, a trickle froze it. */
static void unmapped_peer(const void *ctx, void *out_buf) {
  const ckv_test_daemon *d = ((const peer *)ctx)->d;
  report *out = out_buf;
  uint8_t hdr[5];
  le32(hdr, LORIS_LEN);
  hdr[4] = 'x';
  /* 0: says nothing; 1: announces a big frame and sends one byte of it. */
  for (int i = 0; i < 2; i++) {
    long long t0 = ckv_test_now_ms();
    int fd = connect_and_send(d->attach, hdr, i ? sizeof(hdr) : 0);
    char text[200] = "";
    int code = fd < 0 ? CKV_ERR_DISCONNECTED : ckv_raw_attach_answer(fd, text, sizeof(text));
    count(out, code, ckv_test_now_ms() - t0, text);
    if (fd >= 0) close(fd);
  }
  /* 2: sends a whole request only after the daemon has refused it, as a
   * client may that loses the CPU after connect: the send must still go
   * through (not EPIPE) and the reply say why. */
  int fd = connect_and_send(d->attach, NULL, 0);
  usleep(200 * 1000);
  uint8_t req[300];
  size_t len = attach_request(req, /* refresh= */ false);
  int code = CKV_ERR_DISCONNECTED;
  char text[200] = "";
  if (fd >= 0 && send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len)
    code = ckv_raw_attach_answer(fd, text, sizeof(text));
  count(out, code, 0, text);
  if (fd >= 0) close(fd);
}

Test(attach_abuse, unmapped_uid_is_refused_before_its_frame_is_read, .timeout = 60) {
  ckv_test_daemon d;
  char *cfgdir;
  start(&d, &cfgdir, "[tenant.a]\nuids = 0\n\n[tenant.b]\nuids = 65534\n");
  int fd;
  pid_t pid = ckv_test_begin_as(OTHER_UID, OTHER_UID, unmapped_peer, &(peer){&d, 0}, sizeof(report), &fd);
  report rep;
  ckv_test_end_as(pid, fd, &rep, sizeof(rep), CHILD_TIMEOUT_MS);
  cr_log_info("unmapped: silent peer %s after %lld ms, trickling peer %s after %lld ms, late request %s ('%s')",
              ckv_status_name(rep.first_code[0]), rep.ms[0], ckv_status_name(rep.first_code[1]), rep.ms[1],
              ckv_status_name(rep.first_code[2]), rep.text);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(rep.first_code[i], CKV_ERR_AUTH, "%s unmapped peer answered %s", i ? "a trickling" : "a silent",
                 ckv_status_name(rep.first_code[i]));
    cr_assert_lt(rep.ms[i], MAX_ATTACH_MS, "an unmapped peer was refused only after %lld ms", rep.ms[i]);
  }
  cr_assert_eq(rep.first_code[2], CKV_ERR_AUTH, "an unmapped peer that sent its request late got %s",
               ckv_status_name(rep.first_code[2]));
  cr_assert(strstr(rep.text, "not mapped"), "refusal text: '%s'", rep.text);
  stop(&d, cfgdir);
}

/* ---- the prefix index a worker maps --------------------------------------- */

/* Sends AttachRequest{want_arenas, want_prefix_index[, refresh]} on fd and
 * returns the reply; fds[0..*n) are the descriptors that came with it. */
static Commitkv__V1__AttachReply *attach_with_index(int fd, bool refresh, int fds[CKV_FRAME_MAX_FDS], size_t *n) {
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = 1;
  req.client_name = "index-probe";
  req.want_arenas = true;
  req.want_prefix_index = true;
  req.refresh = refresh;
  uint8_t buf[CKV_RAW_FRAME_MAX];
  size_t len = commitkv__v1__attach_request__pack(&req, buf);
  cr_assert_eq(ckv_frame_send(fd, buf, len, NULL, 0), CKV_OK);
  *n = 0;
  cr_assert_eq(ckv_frame_recv(fd, buf, sizeof(buf), &len, fds, CKV_FRAME_MAX_FDS, n), CKV_OK);
  Commitkv__V1__AttachReply *rep = commitkv__v1__attach_reply__unpack(NULL, len, buf);
  cr_assert_not_null(rep);
  cr_assert_eq(rep->code, CKV_OK, "%s", rep->message);
  return rep;
}

/* What the worker got as the index: read-only (no writable shared mapping,
 * no write, no truncation) and sealed against resizing; the arena's fd
 * beside it is still the writable arena. */
static void expect_read_only_index(const Commitkv__V1__AttachReply *rep, const int *fds, size_t n) {
  cr_assert_not_null(rep->prefix_index, "no prefix index in the reply");
  cr_assert_lt(rep->prefix_index->fd_index, n);
  int ix = fds[rep->prefix_index->fd_index];
  cr_assert_eq(fcntl(ix, F_GETFL) & O_ACCMODE, O_RDONLY, "the index's fd is not read-only");
  cr_assert_eq(mmap(NULL, rep->prefix_index->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ix, 0), MAP_FAILED,
               "the worker could map the index writable");
  cr_assert_lt(pwrite(ix, "x", 1, 0), 0, "the worker could write the index");
  cr_assert_lt(ftruncate(ix, 0), 0, "the worker could truncate the index");
  int seals = fcntl(ix, F_GET_SEALS);
  cr_assert(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW), "seals %#x", seals);
  void *ro = mmap(NULL, rep->prefix_index->bytes, PROT_READ, MAP_SHARED, ix, 0);
  cr_assert_neq(ro, MAP_FAILED);
  cr_assert_eq(memcmp(ro, "CKVPIDX1", 8), 0, "the index's magic"); /* little-endian "CKVPIDX1" */
  munmap(ro, rep->prefix_index->bytes);
  cr_assert_eq(rep->n_arenas, 1);
  cr_assert_neq(rep->arenas[0]->fd_index, rep->prefix_index->fd_index);
  int arena = fds[rep->arenas[0]->fd_index];
  void *rw = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, arena, 0);
  cr_assert_neq(rw, MAP_FAILED, "the arena's fd is not the writable arena");
  munmap(rw, 4096);
}

Test(attach_abuse, the_prefix_index_a_worker_maps_is_read_only, .timeout = 60) {
  ckv_test_daemon d;
  char *cfgdir;
  start(&d, &cfgdir, NULL);
  int fd = -1;
  cr_assert_eq(ckv_unix_connect(d.attach, &fd), 0);
  ckv_sock_set_timeout(fd, 5000);
  int fds[CKV_FRAME_MAX_FDS];
  size_t n = 0;
  Commitkv__V1__AttachReply *rep = attach_with_index(fd, false, fds, &n);
  expect_read_only_index(rep, fds, n);
  for (size_t i = 0; i < n; i++) close(fds[i]);
  commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  /* and so it is when fetched again (the daemon grew it: AttachRequest{refresh}) */
  rep = attach_with_index(fd, true, fds, &n);
  expect_read_only_index(rep, fds, n);
  for (size_t i = 0; i < n; i++) close(fds[i]);
  commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  close(fd);
  stop(&d, cfgdir);
}
