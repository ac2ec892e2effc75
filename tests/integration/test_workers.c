/* test_workers.c - commitkvd with real worker processes over real sockets.
 *
 * Four commitkv-worker processes with two sessions each write K/V into the
 * slots the daemon hands out, round after round, and read every byte back
 * through the views: all must be equal (the worker exits non-zero on any
 * mismatch).  Then the fault cases: a worker killed with SIGKILL in the middle
 * of a round, and a worker that hangs (SIGSTOP) until its lease expires; the
 * others finish unharmed and the dead worker's bytes return to the arena. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testcheck.h"
#include "testutil.h"

/* Short enough to watch expire, long enough that a loaded machine (sanitizer
 * builds on 2 cores) never starves a live worker past its lease. */
static const char *const k_fast_lease[] = {"--set", "daemon.lease=3s", "--set", "daemon.heartbeat=500ms",
                                           "--set", "daemon.detach_keep=6s", NULL};

static pid_t spawn_worker(const ckv_test_daemon *d, const char *prefix, const char *rounds, const char *pause_ms,
                          const char *keep) {
  char out[400];
  snprintf(out, sizeof(out), "%s/%s.out", d->dir, prefix);
  const char *argv[24] = {"commitkv-worker", "--socket", d->socket, "--attach-socket", d->attach, "--prefix", prefix,
                          "--sessions", "2", "--rounds", rounds, "--tokens", "24", "--quiet"};
  int n = 14;
  if (pause_ms) {
    argv[n++] = "--pause-ms";
    argv[n++] = pause_ms;
  }
  if (keep) argv[n++] = keep;
  argv[n] = NULL;
  return ckv_test_spawn(argv, out);
}

Test(workers, four_workers_two_sessions_every_byte_reads_back, .timeout = 120) {
  ckv_test_daemon d;
  /* 128M: the arena starts with about 1 MiB backed and must grow (and the
   * workers map each step) to hold what they write. */
  static const char *const mem[] = {"--memory", "128M", NULL};
  cr_assert_eq(ckv_test_daemon_start(&d, mem), 0, "commitkvd did not start");
  pid_t w[4];
  char name[4][16];
  for (int i = 0; i < 4; i++) {
    snprintf(name[i], sizeof(name[i]), "w%d", i);
    w[i] = spawn_worker(&d, name[i], "30", NULL, "--keep");
  }
  for (int i = 0; i < 4; i++) cr_expect_eq(ckv_test_wait(w[i], 90000), 0, "worker %d failed (see its output)", i);
  /* 4 workers x 2 sessions x 30 rounds x 24 tokens, all kept for resume */
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 8);
  unsigned long long total = ckv_test_stat(&d, "tokens.draft") + ckv_test_stat(&d, "tokens.staged") +
                             ckv_test_stat(&d, "tokens.committed") + ckv_test_stat(&d, "tokens.recycled");
  cr_expect_eq(total, 4ull * 2 * 30 * 24, "state counts must add up to the tokens appended");
  cr_expect_eq(ckv_test_stat(&d, "tokens.recycled"), 0, "every token drew attention: none may be recycled");
  cr_expect_gt(ckv_test_stat(&d, "bytes.total"), 0);
  cr_expect_eq(ckv_test_stat(&d, "bytes.total"), ckv_test_stat(&d, "arenas.0.bytes_used"));
  /* The arena grew to hold them (the workers mapped each step: every byte
   * above was read back), and backs no more than it may. */
  unsigned long long committed = ckv_test_stat(&d, "arenas.0.bytes_committed");
  unsigned long long size = ckv_test_stat(&d, "arenas.0.bytes_total");
  cr_expect_geq(committed, ckv_test_stat(&d, "arenas.0.bytes_used"));
  cr_expect_gt(committed, size / 64, "the arena never grew past its first prefix (%llu of %llu)", committed, size);
  cr_expect_lt(committed, size, "the arena backed all of itself for a small load");
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}

Test(workers, killed_worker_leaks_nothing, .timeout = 120) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_fast_lease), 0, "commitkvd did not start");
  /* The victim pauses for 30 s in the middle of its rounds (after appending
   * and writing a round's K/V, before reporting it): we kill it there. */
  pid_t victim = spawn_worker(&d, "victim", "20", "30000", NULL);
  pid_t w[3];
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof(name), "ok%d", i);
    w[i] = spawn_worker(&d, name, "40", NULL, NULL);
  }
  /* wait until the victim holds memory */
  long long end = ckv_test_now_ms() + 20000;
  while (ckv_test_now_ms() < end && ckv_test_stat(&d, "sessions") < 2) usleep(50000);
  usleep(1500000);
  cr_assert_eq(kill(victim, SIGKILL), 0);
  cr_expect_eq(ckv_test_wait(victim, 5000), 128 + SIGKILL);
  /* The victim's two sessions are detached at once (its attach socket closed)
   * and still hold their bytes until detach_keep passes... */
  cr_expect_eq(ckv_test_wait_stat(&d, "detached_sessions", 2, 5000), 0,
               "the dead worker's sessions should be detached, kept for resume");
  cr_expect_gt(ckv_test_stat(&d, "arenas.0.bytes_used"), 0);
  for (int i = 0; i < 3; i++) cr_expect_eq(ckv_test_wait(w[i], 90000), 0, "surviving worker %d failed", i);
  /* ...then everything returns to the arena (the survivors dropped theirs). */
  cr_expect_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 30000), 0, "dead worker's bytes never returned to the arena");
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 0);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

Test(workers, hung_worker_loses_its_lease, .timeout = 120) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_fast_lease), 0, "commitkvd did not start");
  pid_t hung = spawn_worker(&d, "hung", "20", "30000", NULL);
  long long end = ckv_test_now_ms() + 20000;
  while (ckv_test_now_ms() < end && ckv_test_stat(&d, "sessions") < 2) usleep(50000);
  cr_assert_eq(kill(hung, SIGSTOP), 0); /* alive, socket open, but silent: only the lease can tell */
  /* Its two sessions are detached once its lease runs out (polled: a
   * commitkvctl run of the polling itself may be what expired first on a
   * loaded sanitizer machine). */
  cr_expect_eq(ckv_test_wait_stat(&d, "detached_sessions", 2, 15000), 0,
               "a silent client's sessions were never detached (leases expired: %llu)",
               ckv_test_stat(&d, "leases_expired"));
  cr_expect_geq(ckv_test_stat(&d, "leases_expired"), 1, "a silent client's lease never expired");
  cr_expect_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 30000), 0, "hung worker's bytes never returned");
  kill(hung, SIGKILL);
  kill(hung, SIGCONT);
  ckv_test_wait(hung, 5000);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}
