/* test_workers.c - commitkvd with real worker processes over real sockets.
 *
 * Four commitkv-worker processes with two sessions each write K/V into the
 * slots the daemon hands out, round after round, and read every byte back
 * through the views: all must be equal (the worker exits non-zero on any
 * mismatch).  Then the fault cases: a worker killed with SIGKILL in the middle
 * of a round, and a worker that hangs (SIGSTOP) until its lease expires; the
 * others finish unharmed and the dead worker's bytes return to the arena.
 * The waits poll cumulative counters (sessions detached, expired), so a
 * slow poll on a loaded sanitizer machine cannot miss a passing state; a
 * failure prints the daemon's log. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
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
  /* Both figures from one stats snapshot: moves of the detached sessions may
   * still finish between two commitkvctl runs. */
  char *snap = ckv_test_ctl(&d, (const char *const[]){"stats", "--json", NULL});
  cr_assert_not_null(snap);
  unsigned long long bytes_total = 0, bytes_used = 0;
  cr_assert_eq(ckv_test_json_u64(snap, "bytes.total", &bytes_total), 0, "%s", snap);
  cr_assert_eq(ckv_test_json_u64(snap, "arenas.0.bytes_used", &bytes_used), 0, "%s", snap);
  free(snap);
  cr_expect_gt(bytes_total, 0);
  cr_expect_eq(bytes_total, bytes_used, "the sessions' bytes and the arena's use differ in one snapshot");
  /* The arena grew to hold them (the workers mapped each step: every byte
   * above was read back), and backs no more than it may. */
  unsigned long long committed = ckv_test_stat(&d, "arenas.0.bytes_committed");
  unsigned long long size = ckv_test_stat(&d, "arenas.0.bytes_total");
  cr_expect_geq(committed, ckv_test_stat(&d, "arenas.0.bytes_used"));
  cr_expect_gt(committed, size / 64, "the arena never grew past its first prefix (%llu of %llu)", committed, size);
  cr_expect_lt(committed, size, "the arena backed all of itself for a small load");
  /* Kept means resumable: another client picks one up where its worker left it. */
  cr_expect_eq(ckv_test_stat(&d, "sessions_detached"), 8, "every kept session is detached, waiting for a resume");
  ckv_client *c;
  cr_assert_eq(ckv_client_connect(&(ckv_client_options){.socket = d.socket, .attach_socket = d.attach}, &c), CKV_OK,
               "%s", ckv_client_connect_error());
  ckv_session *s;
  int r = ckv_session_open(c, "w2-1", NULL, &(ckv_session_options){.resume = true}, &s);
  cr_assert_eq(r, CKV_OK, "resume w2-1: %s: %s", ckv_strerror(r), ckv_client_last_error(c));
  cr_expect_eq(ckv_session_tokens(s), 30u * 24u, "the resumed session lost tokens");
  cr_expect_eq(ckv_session_geometry(s)->n_layers, 4u);
  cr_expect_eq(ckv_session_close(s), CKV_OK);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_stat(&d, "sessions_resumed"), 1);
  cr_expect_eq(ckv_test_stat(&d, "sessions_detached"), 9, "closing the resumed session detaches it again");
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 8);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}

/* What a failure needs to be understood: the counters and the daemon's log,
 * less the attach and exit of every commitkvctl the polls ran. */
static char *lifetimes(const ckv_test_daemon *d) {
  char *log = ckv_test_read_file(d->log), *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  cr_assert_not_null(f);
  fprintf(f, "leases expired %llu, sessions detached %llu, expired %llu; the daemon's log, polls left out:\n",
          ckv_test_stat(d, "leases_expired"), ckv_test_stat(d, "sessions_detached"),
          ckv_test_stat(d, "sessions_expired"));
  for (char *line = log ? strtok(log, "\n") : NULL; line; line = strtok(NULL, "\n"))
    if (!strstr(line, "'commitkvctl'") && !strstr(line, ", commitkvctl): attach socket closed"))
      fprintf(f, "%s\n", line);
  fclose(f);
  free(log);
  return text;
}

/* Waits for a stats field to reach `want`; fails the test with `what`, the
 * counters and the daemon's log when it does not within timeout_ms. */
static void expect_stat_reaches(const ckv_test_daemon *d, const char *path, unsigned long long want, int timeout_ms,
                                const char *what) {
  if (ckv_test_wait_stat(d, path, want, timeout_ms) == 0) return;
  char *why = lifetimes(d);
  cr_expect_fail("%s (%s never reached %llu): %s", what, path, want, why);
  free(why);
}

/* True when one line of the daemon's log about the process `pid` ("(pid N, ")
 * says both `what` and `also`. */
static bool logged_for_pid(const ckv_test_daemon *d, pid_t pid, const char *what, const char *also) {
  char *log = ckv_test_read_file(d->log);
  char who[32];
  snprintf(who, sizeof(who), "(pid %d, ", (int)pid);
  bool found = false;
  for (char *line = log ? strtok(log, "\n") : NULL; line && !found; line = strtok(NULL, "\n"))
    found = strstr(line, who) && strstr(line, what) && strstr(line, also);
  free(log);
  return found;
}

/* Waits for the spawned worker to hold its two sessions; fails the test,
 * with the worker's output, when it never does. */
static void wait_for_sessions(const ckv_test_daemon *d, const char *prefix, pid_t pid) {
  long long end = ckv_test_now_ms() + 20000;
  while (ckv_test_stat(d, "sessions") < 2) {
    if (ckv_test_now_ms() > end) {
      char path[400];
      snprintf(path, sizeof(path), "%s/%s.out", d->dir, prefix);
      char *out = ckv_test_file_tail(path, 2000);
      cr_assert_fail("worker %s (pid %d) never opened its sessions; its output:\n%s", prefix, (int)pid, out);
    }
    usleep(50000);
  }
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
  wait_for_sessions(&d, "victim", victim);
  usleep(1500000);
  cr_assert_eq(kill(victim, SIGKILL), 0);
  cr_expect_eq(ckv_test_wait(victim, 5000), 128 + SIGKILL);
  /* Its two sessions are detached at once (its attach socket closed), not
   * after a lease: kept for resume until detach_keep passes.  The counters
   * are cumulative, so a slow poll cannot miss the moment. */
  expect_stat_reaches(&d, "sessions_detached", 2, 10000, "the dead worker's sessions were never detached");
  cr_expect(logged_for_pid(&d, victim, "attach socket closed (process exited)", "; 2 sessions detached"),
            "the victim's exit was not what detached its sessions");
  for (int i = 0; i < 3; i++) cr_expect_eq(ckv_test_wait(w[i], 90000), 0, "surviving worker %d failed", i);
  /* ...then everything returns to the arena (the survivors dropped theirs). */
  expect_stat_reaches(&d, "arenas.0.bytes_used", 0, 30000, "dead worker's bytes never returned to the arena");
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 0);
  cr_expect_eq(ckv_test_stat(&d, "sessions_expired"), 2, "the victim's two sessions expire; the others were dropped");
  cr_expect_eq(ckv_test_stat(&d, "sessions_detached"), 2);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

Test(workers, hung_worker_loses_its_lease, .timeout = 120) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_fast_lease), 0, "commitkvd did not start");
  pid_t hung = spawn_worker(&d, "hung", "20", "30000", NULL);
  wait_for_sessions(&d, "hung", hung);
  cr_assert_eq(kill(hung, SIGSTOP), 0); /* alive, socket open, but silent: only the lease can tell */
  /* Its lease runs out, its two sessions are detached, and detach_keep
   * later they are freed.  Counted, so the test waits for the end state
   * instead of catching the detached one in passing. */
  expect_stat_reaches(&d, "sessions_expired", 2, 30000, "a silent client's sessions were never detached and freed");
  cr_expect(logged_for_pid(&d, hung, "lease expired", "; 2 sessions detached"),
            "the hung worker's own lease expiry did not detach both its sessions");
  cr_expect_geq(ckv_test_stat(&d, "leases_expired"), 1);
  cr_expect_eq(ckv_test_stat(&d, "sessions_detached"), 2);
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 0);
  cr_expect_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), 0, "hung worker's bytes never returned");
  kill(hung, SIGKILL);
  kill(hung, SIGCONT);
  ckv_test_wait(hung, 5000);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}
