/* test_restart.c - what a worker sees when commitkvd restarts under it.
 *
 * Real commitkvd processes on the same socket paths, one after the other,
 * and libcommitkv in this (the worker's) process, which never restarts.  The
 * contract (commitkv/commitkv.h): the daemon's per-boot token travels in
 * every reply; once the client sees a new one, every call answers
 * CKV_ERR_DAEMON_RESTARTED until ckv_client_reconnect() re-attaches (the
 * heartbeat thread does it by itself); handles of the old daemon's sessions
 * answer CKV_ERR_DAEMON_RESTARTED and ckv_session_close frees them; a new
 * session in the new daemon's arena writes K/V and reads it back through its
 * view.  While no daemon runs, calls fail with a transport status within the
 * client's timeout: they never hang.
 *
 * Waits are polls against generous deadlines (sanitizer builds on a loaded
 * 2-core machine); no sleep is ever an assertion. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "testcheck.h"
#include "testutil.h"

/* Host arena (the test reads blocks through the mapping) and short leases:
 * the heartbeat thread ticks every 500 ms. */
static const char *const k_daemon_args[] = {"--set", "daemon.backend=host",      "--set", "daemon.lease=3s",
                                            "--set", "daemon.heartbeat=500ms", "--set", "daemon.detach_keep=6s",
                                            NULL};

TestSuite(restart, .fini = ckv_test_leak_check);

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u
#define ELEMS (HEADS * DIM)
#define TOKENS 8u
/* Far beyond what a loaded sanitizer run needs for one exchange. */
#define DEADLINE_MS 15000

static const ckv_geometry k_geom = {LAYERS, HEADS, DIM, 0};

/* ---- daemons on fixed paths ---- */

static void daemon_start(ckv_test_daemon *d) {
  cr_assert_eq(ckv_test_daemon_start(d, k_daemon_args), 0, "commitkvd did not start");
}

/* Ends the running daemon with `sig` and checks how it went. */
static void daemon_end(ckv_test_daemon *d, int sig) {
  cr_assert_eq(kill(d->pid, sig), 0);
  int st = ckv_test_wait(d->pid, DEADLINE_MS);
  d->pid = 0;
  if (sig == SIGKILL)
    cr_assert_eq(st, 128 + SIGKILL, "commitkvd ended with %d after SIGKILL", st);
  else
    cr_assert_eq(st, 0, "commitkvd did not exit cleanly on signal %d (status %d; log %s)", sig, st, d->log);
}

/* Starts a commitkvd with the arguments ckv_test_daemon_start uses, on the
 * control socket and directory of `d` and the attach socket `attach`. */
static pid_t spawn_daemon_like(const ckv_test_daemon *d, const char *attach, const char *log) {
  const char *argv[32] = {"commitkvd", "--socket",  d->socket, "--attach-socket", attach,
                          "--state-dir", d->dir, "--set",    "daemon.metrics="};
  int n = 9;
  for (int i = 0; k_daemon_args[i]; i++) argv[n++] = k_daemon_args[i];
  argv[n] = NULL;
  return ckv_test_spawn(argv, log);
}

/* A new commitkvd on the same socket paths and directory as the last one,
 * ready once its attach socket accepts: it binds the request socket before
 * it listens there. */
static void daemon_restart(ckv_test_daemon *d) {
  d->pid = spawn_daemon_like(d, d->attach, d->log);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (!ckv_test_attach_accepts(d->attach)) {
    cr_assert(ckv_test_daemon_alive(d), "the new commitkvd died (log %s)", d->log);
    cr_assert_lt(ckv_test_now_ms(), end, "the new commitkvd never listened on %s", d->attach);
    usleep(10000);
  }
}

/* ---- client side ---- */

static ckv_client *connect_to(const ckv_test_daemon *d, bool heartbeat, int timeout_ms) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_restart",
                          .heartbeat = heartbeat, .timeout_ms = timeout_ms};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* The FP16 bits written for one element: distinct per session tag, position,
 * layer, K|V and element, so a block of another session or daemon never
 * reads back equal. */
static uint16_t kv_bits(uint32_t tag, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t e) {
  uint32_t z = (tag * 2654435761u) ^ ((uint32_t)pos << 10) ^ (layer << 7) ^ (kv << 6) ^ e;
  z ^= z >> 15;
  z *= 0x2c1b3c6du;
  z ^= z >> 12;
  return (uint16_t)(0x3c00u | (z & 0x3ffu)); /* a finite half in [1, 2) */
}

static ckv_session *open_session(ckv_client *c, const char *id) {
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geom, NULL, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_tokens(s), 0, "a new daemon's session %s must start empty", id);
  return s;
}

/* Appends TOKENS tokens to a new session and writes their K/V through the
 * mapped slots; no assertion, so worker threads can call it.  Returns the
 * first failure and says where in *ret_what. */
static int fill(ckv_session *s, uint32_t tag, const char **ret_what) {
  uint64_t first = UINT64_MAX;
  int r = ckv_session_append(s, TOKENS, NULL, NULL, NULL, NULL, &first);
  *ret_what = "append";
  if (r != CKV_OK) return r;
  *ret_what = "append's first position";
  if (first != 0) return CKV_ERR_INTERNAL;
  uint16_t k[ELEMS], v[ELEMS];
  *ret_what = "write_kv";
  for (uint64_t pos = first; pos < first + TOKENS; pos++)
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
      for (uint32_t e = 0; e < ELEMS; e++) {
        k[e] = kv_bits(tag, pos, layer, 0, e);
        v[e] = kv_bits(tag, pos, layer, 1, e);
      }
      if ((r = ckv_session_write_kv(s, pos, layer, k, v)) != CKV_OK) return r;
    }
  return CKV_OK;
}

static void append_and_write(ckv_client *c, ckv_session *s, uint32_t tag) {
  const char *what = "";
  int r = fill(s, tag, &what);
  cr_assert_eq(r, CKV_OK, "%s: %s (%s)", what, ckv_strerror(r), ckv_client_last_error(c));
}

/* Reads the session through its view: every position exactly once, in a
 * draft block, bit for bit what append_and_write wrote. */
static void read_back(ckv_client *c, ckv_session *s, uint32_t tag) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(s, &v);
  cr_assert_eq(r, CKV_OK, "view: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(v->n_tokens, TOKENS);
  cr_assert_eq(v->n_staged + v->n_committed, 0, "nothing was reported: every token is a draft");
  unsigned seen[TOKENS] = {0};
  for (size_t b = 0; b < v->n_draft; b++) {
    const ckv_block_view *bv = &v->draft[b];
    const uint8_t *base = bv->data;
    cr_assert_not_null(base);
    cr_assert_eq(ckv_block_check(base, &k_geom), CKV_OK, "draft block %llu fails its header check",
                 (unsigned long long)bv->id);
    const uint32_t *positions = ckv_block_positions_const(base);
    for (uint32_t slot = 0; slot < bv->capacity; slot++) {
      if (!ckv_block_slot_valid(base, slot)) continue;
      uint32_t pos = positions[slot];
      cr_assert_lt(pos, TOKENS, "a valid slot names position %u", pos);
      seen[pos]++;
      for (uint32_t layer = 0; layer < LAYERS; layer++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint16_t *got = (const uint16_t *)(base + ckv_draft_kv_offset(&k_geom, bv->capacity, layer, kv, slot));
          for (uint32_t e = 0; e < ELEMS; e++)
            cr_assert_eq(got[e], kv_bits(tag, pos, layer, kv, e), "position %u layer %u %s[%u] reads %#x, wrote %#x",
                         pos, layer, kv ? "V" : "K", e, got[e], kv_bits(tag, pos, layer, kv, e));
        }
    }
  }
  for (uint32_t p = 0; p < TOKENS; p++)
    cr_assert_eq(seen[p], 1, "position %u appears %u times in the view", p, seen[p]);
}

/* Every call on the handle of a session of the old daemon answers
 * CKV_ERR_DAEMON_RESTARTED; its draft slots are gone with the old arena. */
static void expect_stale(ckv_session *old) {
  const ckv_view *v = NULL;
  float attn[TOKENS] = {0};
  cr_expect_eq(ckv_session_append(old, 1, NULL, NULL, NULL, NULL, NULL), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_view(old, &v), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_report(old, 1, 0, attn, TOKENS, NULL), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_ack(old, 1, NULL), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_null(ckv_session_kv_ptr(old, 0, 0, 0), "a stale handle must not hand out a slot of the old arena");
  uint16_t kv[LAYERS * ELEMS] = {0};
  cr_expect_eq(ckv_session_write_kv(old, 0, 0, kv, kv), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_write_kv_async(old, 0, 0, kv, kv, NULL), CKV_ERR_DAEMON_RESTARTED);
}

/* The new daemon never had the old session: resuming it finds nothing. */
static void expect_gone(ckv_client *c, const char *id) {
  ckv_session_options ro = {.resume = true};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, NULL, &ro, &s);
  cr_expect_eq(r, CKV_ERR_NOT_FOUND, "resume %s after a restart: %s", id, ckv_strerror(r));
  if (r == CKV_OK) ckv_session_close(s);
}

/* Tests 1 and 2: the daemon ends with `sig`, a new one starts on the same
 * sockets, and the worker re-attaches with ckv_client_reconnect. */
static void explicit_reconnect_after(int sig) {
  ckv_test_daemon d;
  daemon_start(&d);
  ckv_client *c = connect_to(&d, /* heartbeat= */ false, /* timeout_ms= */ 0);
  ckv_session *old = open_session(c, "s1");
  append_and_write(c, old, 1);
  read_back(c, old, 1);
  cr_assert_not(ckv_client_restarted(c));

  daemon_end(&d, sig);
  daemon_restart(&d);

  /* The new daemon answers the old attach key with its own boot token: the
   * very first call says so (the client's timeout is 5 s; the DEALER
   * reconnects within a fraction of that). */
  long long t0 = ckv_test_now_ms();
  int r = ckv_session_append(old, 1, NULL, NULL, NULL, NULL, NULL);
  cr_assert_eq(r, CKV_ERR_DAEMON_RESTARTED, "first call after the restart: %s (%s) after %lld ms", ckv_strerror(r),
               ckv_client_last_error(c), ckv_test_now_ms() - t0);
  cr_assert(ckv_client_restarted(c));
  cr_expect_neq(strstr(ckv_client_last_error(c), "reconnect"), NULL, "last error: %s", ckv_client_last_error(c));
  /* ...and so does everything else until the worker reconnects. */
  ckv_session *s = NULL;
  cr_expect_eq(ckv_client_heartbeat(c), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_open(c, "s2", &k_geom, NULL, &s), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_null(s, "out-parameters are written only on success");
  const ckv_view *v = NULL;
  cr_expect_eq(ckv_session_view(old, &v), CKV_ERR_DAEMON_RESTARTED);
  cr_expect(ckv_client_restarted(c));

  r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_restarted(c));
  cr_expect_eq(ckv_client_heartbeat(c), CKV_OK);
  cr_expect_gt(ckv_client_lease_ms(c), 0);
  expect_stale(old);
  expect_gone(c, "s1");

  /* The same id is free in the new daemon; its arena takes new K/V. */
  s = open_session(c, "s1");
  append_and_write(c, s, 2);
  read_back(c, s, 2);
  /* Another thread that saw the same restart reconnects late: the client is
   * attached to the running daemon already, so nothing changes for the
   * sessions opened since. */
  uint64_t gen = ckv_rpc_generation(c);
  r = ckv_client_reconnect(c);
  cr_expect_eq(r, CKV_OK, "a second reconnect for one restart: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_expect_eq(ckv_rpc_generation(c), gen, "a second reconnect for one restart made the new sessions stale");
  read_back(c, s, 2);
  cr_expect_eq(ckv_session_close(old), CKV_ERR_DAEMON_RESTARTED, "closing a stale handle frees it, and says why");
  cr_expect_eq(ckv_session_close(s), CKV_OK);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "the new commitkvd did not exit cleanly on SIGTERM");
}

Test(restart, sigkill_then_explicit_reconnect, .timeout = 60) { explicit_reconnect_after(SIGKILL); }

Test(restart, sigterm_then_explicit_reconnect, .timeout = 60) { explicit_reconnect_after(SIGTERM); }

/* Test 3: with the heartbeat on, the worker never calls reconnect: the
 * heartbeat thread sees the new boot token and re-attaches by itself. */
/* Issue 11: a worker waited out its whole request timeout (5 s) before it
 * learnt that the daemon had died.  The client watches the attach socket the
 * daemon holds open: its EOF answers the pending call at once. */
Test(restart, a_dead_daemon_is_noticed_before_the_timeout, .timeout = 60) {
  ckv_test_daemon d;
  daemon_start(&d);
  ckv_client *c = connect_to(&d, /* heartbeat= */ false, /* timeout_ms= */ 5000);
  ckv_session *s = open_session(c, "dead");
  append_and_write(c, s, 1);
  daemon_end(&d, SIGKILL);
  long long t0 = ckv_test_now_ms();
  int r = ckv_session_append(s, 1, NULL, NULL, NULL, NULL, NULL);
  long long took = ckv_test_now_ms() - t0;
  cr_expect_eq(r, CKV_ERR_DAEMON_RESTARTED, "append to a dead daemon: %s (%s)", ckv_strerror(r),
               ckv_client_last_error(c));
  cr_expect_lt(took, 2500, "the dead daemon was noticed only after %lld ms (timeout 5000)", took);
  cr_expect(strstr(ckv_client_last_error(c), "attach socket closed"), "%s", ckv_client_last_error(c));
  /* A new daemon on the same sockets takes the worker back. */
  daemon_restart(&d);
  cr_assert_eq(ckv_client_reconnect(c), CKV_OK, "%s", ckv_client_last_error(c));
  cr_expect_eq(ckv_session_close(s), CKV_ERR_DAEMON_RESTARTED);
  ckv_session *s2 = open_session(c, "dead");
  append_and_write(c, s2, 2);
  ckv_session_close(s2);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

Test(restart, heartbeat_thread_reconnects_by_itself, .timeout = 60) {
  ckv_test_daemon d;
  daemon_start(&d);
  ckv_client *c = connect_to(&d, /* heartbeat= */ true, /* timeout_ms= */ 0);
  uint32_t lease_ms = ckv_client_lease_ms(c);
  cr_assert_eq(lease_ms, 3000, "the daemon announced a %u ms lease", lease_ms);
  ckv_session *old = open_session(c, "hb");
  append_and_write(c, old, 3);
  uint64_t gen = ckv_rpc_generation(c);

  daemon_end(&d, SIGKILL);
  daemon_restart(&d);

  /* No call from this thread: only the heartbeat thread can move the
   * generation (each reconnect bumps it) and clear the restarted flag. */
  long long t0 = ckv_test_now_ms(), end = t0 + 5ll * lease_ms;
  while (ckv_rpc_generation(c) == gen || ckv_client_restarted(c)) {
    cr_assert_lt(ckv_test_now_ms(), end, "the heartbeat thread did not re-attach within 5 leases (restarted=%d: %s)",
                 ckv_client_restarted(c), ckv_client_last_error(c));
    usleep(20000);
  }
  cr_expect_eq(ckv_client_heartbeat(c), CKV_OK);
  expect_stale(old);
  expect_gone(c, "hb");
  ckv_session *s = open_session(c, "hb");
  append_and_write(c, s, 4);
  read_back(c, s, 4);
  cr_expect_eq(ckv_session_close(old), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_close(s), CKV_OK);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

/* A call while no daemon runs: CKV_ERR_DAEMON_RESTARTED (the client saw the
 * old daemon's attach socket close) or a transport status, within the
 * timeout (the heartbeat thread may hold the client's lock for one exchange
 * of its own). */
#define GAP_TIMEOUT_MS 300
static void expect_fails_in_time(const char *what, int r, long long t0) {
  long long took = ckv_test_now_ms() - t0;
  cr_expect(r == CKV_ERR_DAEMON_RESTARTED || r == CKV_ERR_TIMEOUT || r == CKV_ERR_DISCONNECTED,
            "%s with no daemon: %s", what, ckv_strerror(r));
  cr_expect_lt(took, 2 * GAP_TIMEOUT_MS + 3000, "%s with no daemon took %lld ms", what, took);
}

static void calls_in_the_gap(ckv_client *c, ckv_session *s) {
  long long t0 = ckv_test_now_ms();
  expect_fails_in_time("heartbeat", ckv_client_heartbeat(c), t0);
  t0 = ckv_test_now_ms();
  expect_fails_in_time("append", ckv_session_append(s, 1, NULL, NULL, NULL, NULL, NULL), t0);
  const ckv_view *v = NULL;
  t0 = ckv_test_now_ms();
  expect_fails_in_time("view", ckv_session_view(s, &v), t0);
  ckv_session *s2 = NULL;
  t0 = ckv_test_now_ms();
  expect_fails_in_time("open", ckv_session_open(c, "gap2", &k_geom, NULL, &s2), t0);
  cr_expect_null(s2);
}

/* Test 4: calls between the old daemon's death and the new one's start. */
Test(restart, calls_in_the_gap_fail_in_time, .timeout = 60) {
  ckv_test_daemon d;
  daemon_start(&d);
  ckv_client *c = connect_to(&d, /* heartbeat= */ false, GAP_TIMEOUT_MS);
  ckv_client *hc = connect_to(&d, /* heartbeat= */ true, GAP_TIMEOUT_MS);
  ckv_session *old = open_session(c, "gap");
  ckv_session *hold = open_session(hc, "gap-hb");
  append_and_write(c, old, 5);
  uint64_t hgen = ckv_rpc_generation(hc);

  daemon_end(&d, SIGKILL);
  calls_in_the_gap(c, old);
  calls_in_the_gap(hc, hold);
  calls_in_the_gap(c, old); /* again: timed-out requests left behind change nothing */

  /* Reconnecting with no daemon fails at once and says why; until a
   * reconnect succeeds, calls answer CKV_ERR_DAEMON_RESTARTED without
   * waiting for anything. */
  long long t0 = ckv_test_now_ms();
  int r = ckv_client_reconnect(c);
  cr_expect_neq(r, CKV_OK, "reconnect with no daemon cannot succeed");
  cr_expect_lt(ckv_test_now_ms() - t0, GAP_TIMEOUT_MS + 3000);
  cr_expect(ckv_client_restarted(c));
  t0 = ckv_test_now_ms();
  cr_expect_eq(ckv_client_heartbeat(c), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_append(old, 1, NULL, NULL, NULL, NULL, NULL), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_lt(ckv_test_now_ms() - t0, 1000, "a client known to be cut off answers at once");

  daemon_restart(&d);
  /* The new daemon is listening: one reconnect suffices. */
  r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_restarted(c));
  expect_stale(old);
  ckv_session *s = open_session(c, "gap");
  append_and_write(c, s, 6);
  read_back(c, s, 6);

  /* The heartbeat client recovers by itself once the new daemon answers. */
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_rpc_generation(hc) == hgen || ckv_client_restarted(hc)) {
    cr_assert_lt(ckv_test_now_ms(), end, "the heartbeat client never re-attached (%s)", ckv_client_last_error(hc));
    usleep(20000);
  }
  expect_stale(hold);
  ckv_session *hs = open_session(hc, "gap-hb");
  append_and_write(hc, hs, 7);
  read_back(hc, hs, 7);

  cr_expect_eq(ckv_session_close(old), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_close(hold), CKV_ERR_DAEMON_RESTARTED);
  cr_expect_eq(ckv_session_close(s), CKV_OK);
  cr_expect_eq(ckv_session_close(hs), CKV_OK);
  ckv_client_free(hc);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}


/* Test 5: several worker threads share one client; each sees the restart on
 * its own session and follows the contract (close the stale handle,
 * reconnect, open anew).  One re-attach serves them all: a thread that
 * reconnects after another must not make that one's new session stale. */
#define THREADS 4

typedef struct worker {
  ckv_client *c;
  ckv_session *s;
  uint32_t tag;
  pthread_barrier_t *reconnected;
  int status;        /* first failure, CKV_OK when none */
  char what[96];     /* which step failed */
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  const char *what = "first call after the restart";
  int r = ckv_session_append(w->s, 1, NULL, NULL, NULL, NULL, NULL);
  if (r == CKV_ERR_DAEMON_RESTARTED) r = CKV_OK;
  else if (r == CKV_OK) r = CKV_ERR_INTERNAL; /* the old daemon's session cannot take tokens */
  if (r == CKV_OK) {
    (void)ckv_session_close(w->s); /* frees the stale handle */
    w->s = NULL;
    what = "reconnect";
    r = ckv_client_reconnect(w->c);
  }
  char id[16];
  snprintf(id, sizeof(id), "t%u", w->tag);
  if (r == CKV_OK) {
    what = "open";
    r = ckv_session_open(w->c, id, &k_geom, NULL, &w->s);
  }
  /* Everybody has reconnected and opened before anybody uses the session. */
  pthread_barrier_wait(w->reconnected);
  if (r == CKV_OK) r = fill(w->s, w->tag, &what);
  w->status = r;
  snprintf(w->what, sizeof(w->what), "%s", what);
  return NULL;
}

Test(restart, threads_share_one_reconnect, .timeout = 60) {
  ckv_test_daemon d;
  daemon_start(&d);
  ckv_client *c = connect_to(&d, /* heartbeat= */ false, /* timeout_ms= */ 0);
  worker w[THREADS];
  pthread_barrier_t reconnected;
  pthread_barrier_init(&reconnected, NULL, THREADS);
  for (uint32_t i = 0; i < THREADS; i++) {
    char id[16];
    snprintf(id, sizeof(id), "t%u", i + 10);
    w[i] = (worker){.c = c, .s = open_session(c, id), .tag = 10 + i, .reconnected = &reconnected};
  }
  daemon_end(&d, SIGKILL);
  daemon_restart(&d);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&reconnected);
  for (int i = 0; i < THREADS; i++)
    cr_expect_eq(w[i].status, CKV_OK, "thread %d: %s: %s", i, w[i].what, ckv_strerror(w[i].status));
  for (int i = 0; i < THREADS; i++)
    if (w[i].status == CKV_OK) read_back(c, w[i].s, w[i].tag);
  for (int i = 0; i < THREADS; i++)
    if (w[i].s) ckv_session_close(w[i].s);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

/* Test 6: a second commitkvd started on a running one's sockets (by hand,
 * beside the systemd unit) exits at once, naming the running one, and
 * binds nothing: ZeroMQ would have replaced the control socket's file and
 * removed it on exit, cutting every client of the running daemon off.  The
 * running daemon's clients go on, and new clients still reach it. */
static void expect_refused(const ckv_test_daemon *d, const char *attach, const char *log, const char *says) {
  pid_t second = spawn_daemon_like(d, attach, log);
  int st = ckv_test_wait(second, DEADLINE_MS);
  char *text = ckv_test_file_tail(log, 2000);
  cr_expect_eq(st, 1, "the second commitkvd ended with %d; its log:\n%s", st, text);
  cr_expect(strstr(text, says), "the second commitkvd did not say '%s'; its log:\n%s", says, text);
  free(text);
}

Test(restart, second_daemon_on_the_same_sockets_is_refused, .timeout = 60) {
  ckv_test_daemon d;
  daemon_start(&d);
  ckv_client *c = connect_to(&d, /* heartbeat= */ false, /* timeout_ms= */ 0);
  ckv_session *s = open_session(c, "first");
  append_and_write(c, s, 6);

  char log[400], says[64], other_attach[400];
  snprintf(log, sizeof(log), "%s/second.log", d.dir);
  snprintf(says, sizeof(says), "another commitkvd (pid %d) serves", (int)d.pid);
  expect_refused(&d, d.attach, log, says);
  /* Another attach path, the same control socket: refused as well. */
  snprintf(other_attach, sizeof(other_attach), "%s/other.attach", d.dir);
  snprintf(log, sizeof(log), "%s/third.log", d.dir);
  expect_refused(&d, other_attach, log, "another process serves ipc://");
  cr_expect_not(ckv_test_attach_accepts(other_attach), "the refused daemon left a listener behind");

  /* The running daemon never noticed: its client reads its K/V back and is
   * answered, and a new client attaches and talks to it. */
  cr_expect_eq(ckv_client_heartbeat(c), CKV_OK, "the running daemon's client was cut off: %s",
               ckv_client_last_error(c));
  read_back(c, s, 6);
  ckv_client *late = connect_to(&d, /* heartbeat= */ false, /* timeout_ms= */ 0);
  cr_expect_eq(ckv_client_heartbeat(late), CKV_OK, "a new client did not reach the running daemon: %s",
               ckv_client_last_error(late));
  ckv_client_free(late);
  cr_expect_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}
