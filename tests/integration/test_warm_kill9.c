/* test_warm_kill9.c - commitkvd killed (kill -9) under a real systemd fd
 * store, restarted by systemd (Restart=on-failure), and what its workers get
 * back (issue 15, warm restart; issue 43, the continuous journal;
 * docs/warm-restart.md): the journal only at a clean stop, the journal log
 * kept between kills, torn or damaged log tails and entries.  Clean restarts
 * are test_warm_restart.c's.
 *
 * Each test starts commitkvd as a unit of a private `systemd --user`
 * (tests/support/warmcheck.h); the worker is libcommitkv in this process,
 * with a private copy of every K/V element it wrote
 * (tests/support/warmworker.h).
 *
 * - kill9_says_what_was_dropped: with [daemon] warm_journal = 0 (the journal
 *   only at a clean stop): SIGKILL, systemd restarts the unit: the new
 *   daemon says the arenas in the store have no journal and drops them; the
 *   worker's old mapping still holds its own bytes (nobody else's), it gets
 *   a fresh arena, the saved session comes back from its snapshot, the other
 *   answers NOT_FOUND.
 * - kill9_loop_keeps_journaled_sessions (issue 43, the continuous journal):
 *   8 x SIGKILL in the middle of a worker's rounds, systemd restarts the
 *   unit (Restart=on-failure); two fp16 sessions and one whose moves free and
 *   reallocate blocks.  Every session comes back on the mapping the worker
 *   kept, with at least what the journal had time to hold (600 ms of quiet
 *   before the kill: all of it) and never more than was written; every draft
 *   slot reads exactly the bytes the worker wrote there (its private copy;
 *   a write salt per round, so an older write or another session's bytes
 *   fail), the moving session's whole view is the same byte for byte after a
 *   quiet kill.  A session dropped just before a kill never comes back
 *   (NOT_FOUND, saying why); one opened just before comes back exactly or
 *   answers NOT_FOUND saying the daemon was killed.  Prints the time from
 *   the kill to the first round served again.
 * - kill9_random_points_keep_every_answered_change (issue 43, durable
 *   before acknowledged): 50 x SIGKILL from a second thread at a random
 *   20-350 ms into the worker's rounds (so in the middle of any request:
 *   open, append, K/V writes, report, ack, drop), three fp16 sessions and
 *   one whose moves free and reallocate blocks, each dropped and opened
 *   anew under a new id when full, the log compacted every 256 KiB (so
 *   kills land in compactions too); Restart=on-failure.  After each restart
 *   the worker gets its mapping back and every session whose open was
 *   answered resumes with at least every token whose append was answered
 *   (at most those plus an unanswered append), at an epoch past every
 *   report answered, and every position the worker wrote reads exactly its
 *   private copy; a session whose open or drop was cut short either comes
 *   back or answers NOT_FOUND saying why.  The next round of every session
 *   runs and reads the same.  Fails when a reply goes before its change is
 *   durable (an append's reply not held: "came back with 432 tokens, the
 *   daemon had answered appends of 456").
 * - kill9_log_cut_at_last_good_record: the journal log torn 5 bytes into
 *   its last record (b's append) before the next start: the cut is logged,
 *   b comes back as of its record before, a whole; then a byte of a's record
 *   in the middle flipped, b's record after it intact: both come back as of
 *   their records before the damaged one (nothing after the cut applied).
 * - kill9_reconnect_retries_keep_mapping: the worker retries
 *   ckv_client_reconnect from the moment of the kill (failing attempts while
 *   systemd restarts the unit): the attempt that succeeds still gets the
 *   mapping it kept.
 * - kill9_damaged_entry_drops_only_it: after a kill, one entry damaged (a
 *   flipped byte; cut short) before the next start: that session answers
 *   NOT_FOUND saying the entry was refused, the other comes back whole.
 * - kill9_keeps_forked_prefix_shared: a fork sharing three draft blocks with
 *   its parent; after kills both come back, still on one copy of the blocks.
 *
 * Where no systemd can run (not root, no systemd or systemctl binary, no
 * mount namespace), every test here prints "SKIPPED: <reason>" and skips
 * (test_warm_restart.snapshot_path_without_systemd runs everywhere).  Every
 * test stops the unit and the manager, and checks that no daemon is left. */

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
#include "kernels/quant.h"
#include "shm/arena.h"
#include "testcheck.h"
#include "testutil.h"
#include "viewcapture.h"
#include "warmcheck.h"
#include "warmworker.h"

/* One per test worker, in static storage: a failed assertion leaves the
 * test function, and the suite's fini must still find what to stop. */
static ckv_warm_env g_sd;

TestSuite(warm, .fini = ckv_warm_suite_fini);

Test(warm, kill9_says_what_was_dropped, .timeout = 180) {
  ckv_warm_env *e = &g_sd;
  /* the journal only at a clean stop: a kill -9 leaves none (kill9_loop_keeps_journaled_sessions: with it) */
  SKIP_WITHOUT_SYSTEMD_CONF(e, "[daemon]\nwarm_journal = 0\n");
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_session *a = ckv_warm_session_with_rounds(c, "a", 8), *b = ckv_warm_session_with_rounds(c, "b", 8);
  cr_assert_eq(ckv_session_save(b, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_b = ckv_test_capture_view(c, "b", &ckv_warm_geom);
  ckv_warm_mapped ma;
  ckv_warm_map_blocks(c, a, &ma);
  uint64_t gen = ckv_arena_generation(c->arena);
  long old_pid = e->d.pid;

  cr_assert_eq(kill((pid_t)old_pid, SIGKILL), 0);
  ckv_warm_wait_restarted(e, old_pid);
  /* the new daemon says what it did with the arenas of the killed one */
  cr_assert(ckv_warm_log_has(e->d.log, "warm-journal-missing"),
            "the new daemon did not say why nothing was kept (log %s)", e->d.log);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-arena-dropped"), "the arena in the store was not dropped (log %s)",
            e->d.log);
  ckv_warm_expect_mapping_intact(&ma, "a, after the kill");

  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_arena_kept(c), "a dropped arena cannot be kept");
  cr_assert_neq(ckv_arena_generation(c->arena), gen, "the new daemon handed out the dropped arena");
  ckv_session_close(a);
  ckv_session_close(b);
  char msg[512];
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume of a session nobody kept: %s (%s)", ckv_strerror(r), msg);
  cr_assert(strstr(msg, "did not stop cleanly"), "NOT_FOUND does not say why: %s", msg);
  b = ckv_warm_resume(c, "b", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume of a saved session from its snapshot: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after_b = ckv_test_capture_view(c, "b", &ckv_warm_geom);
  ckv_test_expect_same_view(&before_b, &after_b, "b from its snapshot after a kill -9");
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_b);
  ckv_warm_mapped_free(&ma);
  ckv_session_close(b);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

#define KW_KILLS 8

static int cmp_ll(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return x < y ? -1 : x > y;
}

Test(warm, kill9_loop_keeps_journaled_sessions, .timeout = 300) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_warm_worker f0, f1, m0, d;
  ckv_warm_worker_open(c, &f0, "f0", "fp16");
  ckv_warm_worker_open(c, &f1, "f1", "fp16");
  ckv_warm_worker_open(c, &m0, "m0", "commitkv");
  ckv_warm_worker *all[] = {&f0, &f1, &m0};
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 3; k++) ckv_warm_worker_round(c, all[k], false);
  const ckv_arena *mapping = c->arena;
  long long served_ms[KW_KILLS];
  size_t came_back_partial = 0, new_kept = 0, new_not_found = 0;
  char msg[512];
  for (int cycle = 0; cycle < KW_KILLS; cycle++) {
    int kind = cycle % 4;
    char when[64];
    snprintf(when, sizeof when, "kill %d (kind %d)", cycle + 1, kind);
    for (int k = 0; k < 3; k++) ckv_warm_worker_round(c, all[k], false);
    if (kind == 3) { /* a session that will be dropped just before the kill */
      char id[32];
      snprintf(id, sizeof id, "d%d", cycle);
      ckv_warm_worker_open(c, &d, id, "fp16");
      ckv_warm_worker_round(c, &d, false);
    }
    usleep(CKV_WARM_SETTLE_US); /* the journal catches up: everything so far must come back */
    for (int k = 0; k < 3; k++) all[k]->settled = all[k]->n;
    ckv_capture before_m0 = ckv_test_capture_view(c, "m0", &ckv_warm_geom);
    ckv_warm_worker x = {0};
    bool have_x = false;
    if (kind == 1) /* three rounds more, killed right after their replies: the moves of the first free blocks the
                      journal names (at the second's ack), the third's appends would take them (without the hold) */
      for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3; k++) ckv_warm_worker_round(c, all[k], false);
    if (kind == 2) { /* half a round (appended and written, not reported), and a session opened just now */
      ckv_warm_worker_round(c, &f0, /* half= */ true);
      char id[32];
      snprintf(id, sizeof id, "x%d", cycle);
      ckv_warm_worker_open(c, &x, id, "fp16");
      ckv_warm_worker_round(c, &x, false);
      have_x = true;
    }
    if (kind == 3) {
      int r = ckv_session_drop(d.s);
      cr_assert_eq(r, CKV_OK, "drop %s: %s (%s)", d.id, ckv_strerror(r), ckv_client_last_error(c));
      d.s = NULL;
    }
    long long t0 = ckv_test_now_ms();
    ckv_warm_kill_and_reconnect(e, c, mapping);
    for (int k = 0; k < 3; k++) {
      ckv_warm_worker *w = all[k];
      size_t t = 0, wrote = w->n;
      int r = ckv_warm_worker_resume(c, w, msg, sizeof msg, &t, when);
      cr_assert_eq(r, CKV_OK, "%s: resume %s (journaled with %zu tokens): %s (%s); daemon log %s", when, w->id,
                   w->settled, ckv_strerror(r), msg, e->d.log);
      cr_assert_geq(t, w->settled, "%s: %s came back with %zu tokens, the journal had time to hold %zu (log %s)",
                    when, w->id, t, w->settled, e->d.log);
      if (kind == 0 || kind == 3)
        cr_assert_eq(t, wrote, "%s: %s came back with %zu tokens of %zu, nothing changed after the journal (log %s)",
                     when, w->id, t, wrote, e->d.log);
      came_back_partial += t < wrote;
    }
    if (kind == 0 || kind == 3) { /* m0 exactly as the worker last saw it: every block, every byte, every format */
      ckv_capture after_m0 = ckv_test_capture_view(c, "m0", &ckv_warm_geom);
      ckv_test_expect_same_view(&before_m0, &after_m0, when);
      ckv_test_capture_free(&after_m0);
    }
    ckv_test_capture_free(&before_m0);
    if (have_x) {
      size_t t = 0;
      int r = ckv_warm_worker_resume(c, &x, msg, sizeof msg, &t, when);
      if (r == CKV_OK) {
        new_kept++;
      } else {
        cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of %s, opened just before the kill: %s (%s)", when, x.id,
                     ckv_strerror(r), msg);
        cr_assert(strstr(msg, "killed or crashed"), "%s: NOT_FOUND for %s does not say why: %s", when, x.id, msg);
        new_not_found++;
      }
      ckv_warm_worker_free(&x);
    }
    if (kind == 3) { /* dropped before the kill: never back, whatever the journal held */
      int r;
      ckv_session *s = ckv_warm_resume(c, d.id, &r, msg, sizeof msg);
      cr_assert_null(s, "%s: %s was dropped before the kill and came back", when, d.id);
      cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of dropped %s: %s (%s)", when, d.id, ckv_strerror(r), msg);
      cr_assert(strstr(msg, "ended") || strstr(msg, "killed or crashed"),
                "%s: NOT_FOUND for dropped %s does not say why: %s", when, d.id, msg);
      free(d.copy);
      memset(&d, 0, sizeof d);
    }
    /* the next round is served on the kept blocks: the time from the kill to it */
    for (int k = 0; k < 3; k++) ckv_warm_worker_round(c, all[k], false);
    served_ms[cycle] = ckv_test_now_ms() - t0;
    for (int k = 0; k < 2; k++) ckv_warm_worker_verify(c, all[k], true, "the round after the kill");
  }
  cr_assert(ckv_warm_log_has(e->d.log, "warm-journal-killed"),
            "no start said the journal was a killed daemon's (log %s)", e->d.log);
  cr_assert_not(ckv_warm_log_has(e->d.log, "warm-session-dropped tenant=default session=f"),
                "a kept session was dropped");
  qsort(served_ms, KW_KILLS, sizeof served_ms[0], cmp_ll);
  printf("kill9_loop: %d kills; kill -9 to the first round served again on the kept blocks: min %lld ms, median "
         "%lld ms, max %lld ms; sessions back short of their last round (changed after the last checkpoint): %zu; "
         "sessions opened just before a kill: %zu kept, %zu NOT_FOUND\n",
         KW_KILLS, served_ms[0], served_ms[KW_KILLS / 2], served_ms[KW_KILLS - 1], came_back_partial, new_kept,
         new_not_found);
  fflush(stdout);
  for (int k = 0; k < 3; k++) ckv_warm_worker_free(all[k]);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

Test(warm, kill9_damaged_entry_drops_only_it, .timeout = 240) {
  ckv_warm_env *e = &g_sd;
  /* every batch a checkpoint (the log compacted at once): b's entry file is
   * its last state, not a record of the log */
  ckv_warm_set_unit_env("CKV_TEST_WARM_COMPACT_BYTES=1");
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_warm_worker a, b;
  ckv_warm_worker_open(c, &a, "a", "fp16");
  ckv_warm_worker_open(c, &b, "b", "fp16");
  for (int i = 0; i < 3; i++) {
    ckv_warm_worker_round(c, &a, false);
    ckv_warm_worker_round(c, &b, false);
  }
  const ckv_arena *mapping = c->arena;
  const char *kinds[] = {"entry", "entrytrunc"};
  char msg[512];
  for (int k = 0; k < 2; k++) {
    ckv_warm_worker_round(c, &a, false);
    ckv_warm_worker_round(c, &b, false);
    usleep(CKV_WARM_SETTLE_US);
    ckv_warm_request_damage(e, kinds[k]); /* between the kill and the next start */
    ckv_warm_kill_and_reconnect(e, c, mapping);
    size_t t = 0;
    int r = ckv_warm_worker_resume(c, &b, msg, sizeof msg, &t, kinds[k]);
    cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of the damaged one: %s (%s)", kinds[k], ckv_strerror(r), msg);
    cr_assert(strstr(msg, "warm restart dropped it") && strstr(msg, "journal entry was refused"),
              "%s: NOT_FOUND does not say why: %s", kinds[k], msg);
    size_t wrote = a.n;
    r = ckv_warm_worker_resume(c, &a, msg, sizeof msg, &t, kinds[k]);
    cr_assert_eq(r, CKV_OK, "%s: resume of the other: %s (%s)", kinds[k], ckv_strerror(r), msg);
    cr_assert_eq(t, wrote, "%s: a came back with %zu tokens of %zu", kinds[k], t, wrote);
    cr_assert(ckv_warm_log_has(e->d.log, "warm-session-dropped"), "%s: the drop is not in the log", kinds[k]);
    /* b begins again: a new conversation of the id, from nothing */
    free(b.copy);
    ckv_warm_worker_open(c, &b, "b", "fp16");
    ckv_warm_worker_round(c, &b, false);
    ckv_warm_worker_verify(c, &b, true, "b anew");
  }
  ckv_warm_worker_free(&a);
  ckv_warm_worker_free(&b);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

/* A worker that retries ckv_client_reconnect while systemd restarts the
 * daemon (as commitkv-bench failover and the heartbeat thread do) gets the
 * mapping it kept at the attempt that succeeds.  Before the fix, a failed
 * attempt freed the kept mapping: the next success mapped the arena anew
 * (ckv_client_arena_kept false, every pointer into the old mapping stale). */
Test(warm, kill9_reconnect_retries_keep_mapping, .timeout = 120) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_warm_worker a;
  ckv_warm_worker_open(c, &a, "a", "fp16");
  for (int i = 0; i < 3; i++) ckv_warm_worker_round(c, &a, false);
  usleep(CKV_WARM_SETTLE_US);
  const ckv_arena *mapping = c->arena;
  long old = e->d.pid;
  cr_assert_eq(kill((pid_t)old, SIGKILL), 0);
  int failed = 0, r;
  long long end = ckv_test_now_ms() + CKV_WARM_DEADLINE_MS;
  while ((r = ckv_client_reconnect(c)) != CKV_OK) { /* no wait for the restart: the attempts fail until it is up */
    failed++;
    cr_assert_lt(ckv_test_now_ms(), end, "no reconnect: %s (daemon log %s)", ckv_strerror(r), e->d.log);
    usleep(2000);
  }
  cr_assert_gt(failed, 1, "the reconnect never failed: the test did not retry through the restart");
  cr_assert(ckv_client_arena_kept(c), "after %d failed attempts the mapping was not kept (daemon log %s)", failed,
            e->d.log);
  cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
  e->d.pid = (pid_t)ckv_warm_main_pid(e);
  char msg[512];
  size_t t = 0;
  r = ckv_warm_worker_resume(c, &a, msg, sizeof msg, &t, "retried reconnect");
  cr_assert_eq(r, CKV_OK, "resume: %s (%s)", ckv_strerror(r), msg);
  cr_assert_eq(t, a.n);
  ckv_warm_worker_round(c, &a, false);
  ckv_warm_worker_free(&a);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

/* ---- kill -9 at random points in the middle of rounds (issue 43) ---- */

/* A session of the random-kill worker: what the daemon acknowledged, what
 * it may have taken without a reply reaching the worker, and which
 * positions hold bytes the worker wrote (its private copy). */
typedef struct rworker {
  ckv_warm_worker w;         /* w.n: tokens whose append was answered (or that came back) */
  uint8_t *valid;    /* [pos]: the worker wrote this position's K/V */
  size_t pending;    /* tokens of an append sent whose reply did not come */
  uint64_t acked_epoch; /* the epoch of the last report answered */
  enum { RW_NONE, RW_OPEN, RW_DROP } op; /* an open or drop sent whose reply did not come */
  unsigned gen;
  char base[8];
} rworker;

/* The killer: every time it is armed, it waits a random 20-350 ms and
 * sends SIGKILL to the daemon, while the worker is somewhere in its rounds. */
typedef struct rkiller {
  pthread_mutex_t m;
  pthread_cond_t cv;
  pid_t target; /* armed when > 0 */
  pid_t killed; /* the pid it killed, until the worker has recovered */
  unsigned seed;
  bool stop;
} rkiller;

static void *rkiller_main(void *arg) {
  rkiller *k = arg;
  pthread_mutex_lock(&k->m);
  for (;;) {
    while (!k->target && !k->stop) pthread_cond_wait(&k->cv, &k->m);
    if (k->stop) break;
    pid_t pid = k->target;
    k->target = 0;
    unsigned wait_us = 20000u + (unsigned)(rand_r(&k->seed) % 330000u);
    pthread_mutex_unlock(&k->m);
    usleep(wait_us);
    kill(pid, SIGKILL);
    pthread_mutex_lock(&k->m);
    k->killed = pid;
    pthread_cond_broadcast(&k->cv);
  }
  pthread_mutex_unlock(&k->m);
  return NULL;
}

#define RK_KILLS 50
#define RK_WORKERS 4

static void rw_open(ckv_client *c, rworker *rw) {
  char id[32];
  snprintf(id, sizeof id, "%s-%u", rw->base, rw->gen);
  const char *policy = rw->w.policy;
  uint16_t *copy = rw->w.copy;
  ckv_session *s = NULL;
  bool moves = strcmp(policy, "commitkv") == 0;
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  const double values[] = {4, 16, 2, 6};
  ckv_session_options so = {.policy = policy,
                            .param_names = moves ? names : NULL,
                            .param_values = moves ? values : NULL,
                            .n_params = moves ? 4 : 0,
                            .model_id = "stories260K",
                            .model_revision = "r1"};
  rw->op = RW_OPEN;
  snprintf(rw->w.id, sizeof rw->w.id, "%s", id);
  rw->w.s = NULL;
  int r = ckv_session_open(c, id, &ckv_warm_geom, &so, &s);
  if (r != CKV_OK) return; /* the kill: recovered by rw_recover */
  rw->op = RW_NONE;
  rw->w.s = s;
  rw->w.n = 0;
  rw->w.round = 0;
  rw->pending = 0;
  rw->acked_epoch = 0;
  memset(rw->valid, 0, CKV_WARM_MAX_TOKENS);
  (void)copy;
}

/* One round of rw (a new session in its place when it is full); CKV_OK or
 * the code of the call the kill cut short. */
static int rw_round(ckv_client *c, rworker *rw) {
  ckv_warm_worker *w = &rw->w;
  if (rw->op == RW_OPEN) return CKV_ERR_STATE;
  if (w->n + CKV_WARM_PER_ROUND > CKV_WARM_MAX_TOKENS) { /* full: a new conversation under a new id */
    rw->op = RW_DROP;
    int r = ckv_session_drop(w->s);
    w->s = NULL;
    if (r != CKV_OK) return r;
    rw->op = RW_NONE;
    rw->gen++;
    rw_open(c, rw);
    return rw->op == RW_NONE ? CKV_OK : CKV_ERR_STATE;
  }
  float sem[CKV_WARM_PER_ROUND];
  for (uint32_t i = 0; i < CKV_WARM_PER_ROUND; i++) sem[i] = (w->n + i) % 8 == 1 ? 0.9f : 0.5f;
  uint64_t first = 0;
  rw->pending = CKV_WARM_PER_ROUND;
  int r = ckv_session_append(w->s, CKV_WARM_PER_ROUND, NULL, NULL, sem, NULL, &first);
  if (r != CKV_OK) return r;
  cr_assert_eq(first, w->n, "append %s: first position %llu, the worker has %zu", w->id, (unsigned long long)first,
               w->n);
  w->n += CKV_WARM_PER_ROUND;
  rw->pending = 0;
  w->salt++;
  for (size_t pos = w->n - CKV_WARM_PER_ROUND; pos < w->n; pos++) {
    for (uint32_t layer = 0; layer < CKV_WARM_LAYERS; layer++) {
      uint16_t *k = ckv_warm_worker_at(w, pos, layer, 0), *v = ckv_warm_worker_at(w, pos, layer, 1);
      for (uint32_t e = 0; e < CKV_WARM_ELEMS; e++) {
        size_t tag = pos + 1000u * (uint32_t)w->id[0] + 7919u * (uint32_t)w->id[1] + 104729u * w->salt;
        k[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 0, e));
        v[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 1, e));
      }
      if ((r = ckv_session_write_kv(w->s, pos, layer, k, v)) != CKV_OK) return r;
    }
    rw->valid[pos] = 1;
  }
  float attn[CKV_WARM_MAX_TOKENS];
  for (size_t pos = 0; pos < w->n; pos++)
    attn[pos] = pos % 8 == 1 ? 4.f : pos + CKV_WARM_PER_ROUND >= w->n ? 1.f : 0.3f;
  ckv_round_result rr;
  if ((r = ckv_session_report(w->s, ++w->round, 0, attn, w->n, &rr)) != CKV_OK) return r;
  rw->acked_epoch = rr.epoch;
  return ckv_session_ack(w->s, rr.epoch, NULL);
}

/* rw's view after a resume: every draft slot holds a position below the
 * count, at most once, and every position the worker wrote reads exactly
 * its bytes; with draft_only every position is in a slot. */
static void rw_verify(ckv_client *c, rworker *rw, bool draft_only, const char *when) {
  ckv_warm_worker *w = &rw->w;
  const ckv_view *v = NULL;
  int r = ckv_session_view(w->s, &v);
  cr_assert_eq(r, CKV_OK, "%s: view of %s: %s (%s)", when, w->id, ckv_strerror(r), ckv_client_last_error(c));
  size_t t = ckv_session_tokens(w->s);
  ckv_warm_worker_compare(v, w, t, rw->valid, draft_only, when);
}

/* After the restart: rw comes back as the daemon acknowledged it, or (an
 * open or drop cut short) either way, saying why when it does not. */
static void rw_recover(ckv_client *c, ckv_warm_env *e, rworker *rw, const char *when, size_t *ret_kept_tokens) {
  ckv_warm_worker *w = &rw->w;
  char msg[512];
  int r;
  if (w->s) ckv_session_close(w->s);
  w->s = ckv_warm_resume(c, w->id, &r, msg, sizeof msg);
  if (rw->op == RW_OPEN || rw->op == RW_DROP) { /* its reply never came: either outcome is right */
    if (r != CKV_OK) {
      cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of %s (%s cut short): %s (%s)", when, w->id,
                   rw->op == RW_OPEN ? "open" : "drop", ckv_strerror(r), msg);
      cr_assert(strstr(msg, "killed or crashed") || strstr(msg, "ended"), "%s: NOT_FOUND for %s does not say why: %s",
                when, w->id, msg);
    } else if (rw->op == RW_DROP) {
      cr_assert_eq(ckv_session_drop(w->s), CKV_OK, "%s: drop %s again", when, w->id);
      w->s = NULL;
    } else {
      cr_assert_eq(ckv_session_tokens(w->s), 0, "%s: %s, opened just before the kill, has tokens", when, w->id);
    }
    if (rw->op == RW_DROP || r != CKV_OK) {
      if (w->s) { /* an open that came back after all: dropped, a new one below */
        cr_assert_eq(ckv_session_drop(w->s), CKV_OK);
        w->s = NULL;
      }
      rw->gen++;
      rw->op = RW_NONE;
      rw_open(c, rw);
      cr_assert_eq(rw->op, RW_NONE, "%s: open of %s after the restart: %s", when, w->id, ckv_client_last_error(c));
    } else {
      rw->op = RW_NONE;
      w->n = 0;
      w->round = 0;
      memset(rw->valid, 0, CKV_WARM_MAX_TOKENS);
    }
    return;
  }
  /* its open was answered: it must come back, with every change answered */
  cr_assert_eq(r, CKV_OK, "%s: resume of %s (%zu tokens answered): %s (%s); daemon log %s", when, w->id, w->n,
               ckv_strerror(r), msg, e->d.log);
  size_t t = ckv_session_tokens(w->s);
  cr_assert_geq(t, w->n, "%s: %s came back with %zu tokens, the daemon had answered appends of %zu (log %s)", when,
                w->id, t, w->n, e->d.log);
  cr_assert_leq(t, w->n + rw->pending, "%s: %s came back with %zu tokens, the worker sent appends of %zu", when,
                w->id, t, w->n + rw->pending);
  if (rw->acked_epoch)
    cr_assert_gt(ckv_session_epoch(w->s), rw->acked_epoch,
                 "%s: %s came back at epoch %llu, its report answered epoch %llu (log %s)", when, w->id,
                 (unsigned long long)ckv_session_epoch(w->s), (unsigned long long)rw->acked_epoch, e->d.log);
  rw_verify(c, rw, strcmp(w->policy, "fp16") == 0, when);
  *ret_kept_tokens += t;
  w->n = t; /* an unanswered append it kept: its positions stay unwritten (valid 0) */
  rw->pending = 0;
}

Test(warm, kill9_random_points_keep_every_answered_change, .timeout = 600) {
  ckv_warm_env *e = &g_sd;
  /* the log compacted into a checkpoint every 256 KiB: kills land in
   * compactions too */
  ckv_warm_set_unit_env("CKV_TEST_WARM_COMPACT_BYTES=262144");
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client_options o = {.socket = e->d.socket, .attach_socket = e->d.attach, .name = "test_warm_restart",
                          .timeout_ms = 1500};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  const ckv_arena *mapping = c->arena;
  rworker rws[RK_WORKERS];
  const char *policies[RK_WORKERS] = {"fp16", "fp16", "fp16", "commitkv"};
  for (int i = 0; i < RK_WORKERS; i++) {
    memset(&rws[i], 0, sizeof rws[i]);
    snprintf(rws[i].base, sizeof rws[i].base, "r%d", i);
    rws[i].w.policy = policies[i];
    rws[i].w.copy = calloc((size_t)CKV_WARM_MAX_TOKENS * CKV_WARM_LAYERS * 2u * CKV_WARM_ELEMS, sizeof(uint16_t));
    rws[i].valid = calloc(CKV_WARM_MAX_TOKENS, 1);
    cr_assert(rws[i].w.copy && rws[i].valid);
    rw_open(c, &rws[i]);
    cr_assert_eq(rws[i].op, RW_NONE, "open: %s", ckv_client_last_error(c));
  }
  rkiller k = {.seed = 4242};
  pthread_mutex_init(&k.m, NULL);
  pthread_cond_init(&k.cv, NULL);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, rkiller_main, &k), 0);
  size_t rounds = 0, answered_tokens = 0, kept_tokens = 0, cut_short = 0;
  long long worst_ms = 0;
  for (int kill_no = 0; kill_no < RK_KILLS; kill_no++) {
    pthread_mutex_lock(&k.m);
    k.target = e->d.pid;
    pthread_cond_signal(&k.cv);
    pthread_mutex_unlock(&k.m);
    /* rounds until the kill cuts one short */
    int code = CKV_OK;
    for (int i = 0; code == CKV_OK; i = (i + 1) % RK_WORKERS) {
      code = rw_round(c, &rws[i]);
      rounds += code == CKV_OK;
      if (code != CKV_OK)
        cr_assert(code == CKV_ERR_DAEMON_RESTARTED || code == CKV_ERR_TIMEOUT || code == CKV_ERR_DISCONNECTED ||
                      code == CKV_ERR_STATE,
                  "kill %d: %s: %s (%s)", kill_no + 1, rws[i].w.id, ckv_strerror(code), ckv_client_last_error(c));
    }
    pthread_mutex_lock(&k.m);
    while (!k.killed) pthread_cond_wait(&k.cv, &k.m); /* an error before the kill: it comes all the same */
    pid_t old = k.killed;
    k.killed = 0;
    pthread_mutex_unlock(&k.m);
    long long t0 = ckv_test_now_ms();
    ckv_warm_wait_restarted(e, old);
    long long end = ckv_test_now_ms() + CKV_WARM_DEADLINE_MS;
    while ((r = ckv_client_reconnect(c)) != CKV_OK) {
      cr_assert_lt(ckv_test_now_ms(), end, "kill %d: no reconnect: %s (log %s)", kill_no + 1, ckv_strerror(r),
                   e->d.log);
      usleep(5000);
    }
    cr_assert(ckv_client_arena_kept(c), "kill %d: the arena was mapped anew (log %s)", kill_no + 1, e->d.log);
    cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
    char when[48];
    snprintf(when, sizeof when, "kill %d", kill_no + 1);
    for (int i = 0; i < RK_WORKERS; i++) {
      answered_tokens += rws[i].op == RW_NONE ? rws[i].w.n : 0;
      cut_short += rws[i].pending || rws[i].op != RW_NONE;
      rw_recover(c, e, &rws[i], when, &kept_tokens);
    }
    /* the next round reads identical K/V on the kept blocks */
    for (int i = 0; i < RK_WORKERS; i++) {
      r = rw_round(c, &rws[i]);
      cr_assert_eq(r, CKV_OK, "%s: the round after the restart of %s: %s (%s)", when, rws[i].w.id, ckv_strerror(r),
                   ckv_client_last_error(c));
      rw_verify(c, &rws[i], strcmp(rws[i].w.policy, "fp16") == 0, "the round after the restart");
    }
    long long ms = ckv_test_now_ms() - t0;
    if (ms > worst_ms) worst_ms = ms;
  }
  pthread_mutex_lock(&k.m);
  k.stop = true;
  pthread_cond_signal(&k.cv);
  pthread_mutex_unlock(&k.m);
  pthread_join(th, NULL);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-journal-killed"), "no start said the journal was a killed daemon's");
  cr_assert(ckv_warm_log_has(e->d.log, "from log record"), "no session came back from the log (log %s)", e->d.log);
  printf("kill9_random: %d kills at random points, %zu rounds answered; tokens answered before the kills %zu, came "
         "back %zu; requests cut short by a kill %zu; restart to the next round of every session at most %lld ms\n",
         RK_KILLS, rounds, answered_tokens, kept_tokens, cut_short, worst_ms);
  fflush(stdout);
  for (int i = 0; i < RK_WORKERS; i++) {
    if (rws[i].w.s) ckv_session_close(rws[i].w.s);
    free(rws[i].w.copy);
    free(rws[i].valid);
  }
  ckv_client_free(c);
  ckv_warm_stop(e);
}

/* ---- a torn or damaged journal log is cut at its last good record ---- */

typedef struct lrec {
  size_t off, len;
  uint32_t type;
  char id[130];
} lrec;

/* The records of STATE/warm/journal.log (persist/warmlog.h's format), read
 * by the test itself: at most max, their count returned. */
static size_t read_log_records(const ckv_warm_env *e, lrec *out, size_t max) {
  char path[400];
  snprintf(path, sizeof path, "%s/warm/journal.log", e->sd.state);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "no journal log at %s", path);
  static uint8_t buf[8u << 20];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  size_t at = 32, n = 0;
  while (at + 40 <= len && n < max) {
    uint32_t type;
    uint16_t tl, il;
    uint64_t el;
    memcpy(&type, buf + at + 4, 4);
    memcpy(&tl, buf + at + 16, 2);
    memcpy(&il, buf + at + 18, 2);
    memcpy(&el, buf + at + 24, 8);
    size_t total = 40u + tl + il + (size_t)el;
    cr_assert_leq(at + total, len, "a record of the live log runs past its end");
    lrec *r = &out[n++];
    r->off = at;
    r->len = total;
    r->type = type;
    snprintf(r->id, sizeof r->id, "%.*s", (int)il, (const char *)buf + at + 40 + tl);
    at += total;
  }
  cr_assert_eq(at, len, "the live log does not end on a record");
  return n;
}

/* The last record of session `id` (its index), asserting there is one. */
static size_t last_record_of(const lrec *r, size_t n, const char *id) {
  for (size_t i = n; i-- > 0;)
    if (strcmp(r[i].id, id) == 0) return i;
  cr_assert_fail("no record of %s in the log", id);
  return 0;
}

Test(warm, kill9_log_cut_at_last_good_record, .timeout = 240) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_warm_worker a, b;
  ckv_warm_worker_open(c, &a, "a", "fp16");
  ckv_warm_worker_open(c, &b, "b", "fp16");
  for (int i = 0; i < 3; i++) {
    ckv_warm_worker_round(c, &a, false);
    ckv_warm_worker_round(c, &b, false);
  }
  const ckv_arena *mapping = c->arena;
  char msg[512], req[64];
  static lrec recs[4096];
  size_t t = 0;

  /* 1: a torn tail.  b's half round (appended and written, its reply came)
   * is the log's last record; the kill tears it 5 bytes into its entry. */
  size_t b_before = b.n;
  ckv_warm_worker_round(c, &b, /* half= */ true);
  size_t n = read_log_records(e, recs, 4096);
  size_t lb = last_record_of(recs, n, "b");
  cr_assert_eq(lb, n - 1, "b's append is not the log's last record");
  snprintf(req, sizeof req, "logtrunc %zu", recs[lb].off + 45);
  ckv_warm_request_damage(e, req);
  ckv_warm_kill_and_reconnect(e, c, mapping);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-log-cut"), "the torn tail was not cut (log %s)", e->d.log);
  size_t a_had = a.n;
  cr_assert_eq(ckv_warm_worker_resume(c, &a, msg, sizeof msg, &t, "torn tail"), CKV_OK, "resume a: %s", msg);
  cr_assert_eq(t, a_had, "torn tail: a came back with %zu tokens of %zu", t, a_had);
  cr_assert_eq(ckv_warm_worker_resume(c, &b, msg, sizeof msg, &t, "torn tail"), CKV_OK, "resume b: %s", msg);
  cr_assert_eq(t, b_before, "torn tail: b came back with %zu tokens, its last good record holds %zu", t, b_before);
  ckv_warm_worker_round(c, &a, false);
  ckv_warm_worker_round(c, &b, false);
  ckv_warm_worker_verify(c, &a, true, "after the torn tail");
  ckv_warm_worker_verify(c, &b, true, "after the torn tail");

  /* 2: a damaged record in the middle.  a's half round, then b's: a
   * byte of a's record flipped.  Both come back as of their records
   * before it: b's later record is intact but after the cut. */
  size_t a_mid = a.n, b_mid = b.n;
  ckv_warm_worker_round(c, &a, true);
  ckv_warm_worker_round(c, &b, true);
  n = read_log_records(e, recs, 4096);
  size_t la = last_record_of(recs, n, "a");
  lb = last_record_of(recs, n, "b");
  cr_assert_lt(la, lb, "a's record is not before b's");
  snprintf(req, sizeof req, "logflip %zu", recs[la].off + recs[la].len - 100);
  ckv_warm_request_damage(e, req);
  ckv_warm_kill_and_reconnect(e, c, mapping);
  cr_assert(ckv_warm_log_has(e->d.log, "checksum mismatch"), "the damaged record was not cut (log %s)", e->d.log);
  cr_assert_eq(ckv_warm_worker_resume(c, &a, msg, sizeof msg, &t, "damaged record"), CKV_OK, "resume a: %s", msg);
  cr_assert_eq(t, a_mid, "damaged record: a came back with %zu tokens, its last good record holds %zu", t, a_mid);
  cr_assert_eq(ckv_warm_worker_resume(c, &b, msg, sizeof msg, &t, "damaged record"), CKV_OK, "resume b: %s", msg);
  cr_assert_eq(t, b_mid, "damaged record: b came back with %zu tokens: a record after the cut was applied (%zu)", t,
               b_mid);
  ckv_warm_worker_round(c, &a, false);
  ckv_warm_worker_round(c, &b, false);
  ckv_warm_worker_verify(c, &a, true, "after the damaged record");
  ckv_warm_worker_verify(c, &b, true, "after the damaged record");
  ckv_warm_worker_free(&a);
  ckv_warm_worker_free(&b);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

/* The block of w's view that holds position `pos` (NULL: none). */
static const void *worker_block_of(ckv_warm_worker *w, uint32_t pos) {
  const ckv_view *v = NULL;
  cr_assert_eq(ckv_session_view(w->s, &v), CKV_OK);
  for (size_t i = 0; i < v->n_draft; i++) {
    const uint32_t *at = ckv_block_positions_const(v->draft[i].data);
    for (uint32_t slot = 0; slot < v->draft[i].capacity; slot++)
      if (ckv_block_slot_valid(v->draft[i].data, slot) && at[slot] == pos) return v->draft[i].data;
  }
  return NULL;
}

Test(warm, kill9_keeps_forked_prefix_shared, .timeout = 180) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_warm_worker p, f;
  ckv_warm_worker_open(c, &p, "p", "fp16");
  for (int i = 0; i < 3; i++) ckv_warm_worker_round(c, &p, false);
  /* the child shares the parent's first 48 tokens (three whole draft blocks) */
  memset(&f, 0, sizeof f);
  snprintf(f.id, sizeof f.id, "pf");
  f.policy = "fp16";
  f.copy = calloc((size_t)CKV_WARM_MAX_TOKENS * CKV_WARM_LAYERS * 2u * CKV_WARM_ELEMS, sizeof(uint16_t));
  cr_assert_not_null(f.copy);
  int r = ckv_session_fork(p.s, f.id, 48, &f.s);
  cr_assert_eq(r, CKV_OK, "fork: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_matched_tokens(f.s), 48, "the fork shares %llu tokens",
               (unsigned long long)ckv_session_matched_tokens(f.s));
  memcpy(f.copy, p.copy, (size_t)48 * CKV_WARM_LAYERS * 2u * CKV_WARM_ELEMS * sizeof(uint16_t));
  f.n = 48;
  f.round = p.round;
  ckv_warm_worker_round(c, &f, false);
  ckv_warm_worker_round(c, &p, false);
  const ckv_arena *mapping = c->arena;
  for (int k = 0; k < 2; k++) {
    usleep(CKV_WARM_SETTLE_US);
    size_t want_p = p.n, want_f = f.n, t = 0;
    char msg[512];
    ckv_warm_kill_and_reconnect(e, c, mapping);
    r = ckv_warm_worker_resume(c, &p, msg, sizeof msg, &t, "parent after a kill");
    cr_assert_eq(r, CKV_OK, "resume of the parent: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
    cr_assert_eq(t, want_p);
    r = ckv_warm_worker_resume(c, &f, msg, sizeof msg, &t, "fork after a kill");
    cr_assert_eq(r, CKV_OK, "resume of the fork: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
    cr_assert_eq(t, want_f);
    /* still one copy: the fork's first blocks are the parent's, in place */
    for (uint32_t pos = 0; pos < 48; pos += 16) {
      const void *bp = worker_block_of(&p, pos), *bf = worker_block_of(&f, pos);
      cr_assert(bp && bp == bf, "position %u: the parent's block %p, the fork's %p", pos, bp, bf);
    }
    ckv_warm_worker_round(c, &p, false);
    ckv_warm_worker_round(c, &f, false);
  }
  ckv_warm_worker_free(&p);
  ckv_warm_worker_free(&f);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

