/* test_soak.c - the short soak of CI: commitkv-bench soak with 3 workers x 2
 * sessions for 6 s, a worker SIGKILLed every 800 ms and commitkvd SIGKILLed
 * and restarted every 2.5 s (real processes throughout).  Every byte the
 * workers read back must be the byte they wrote (bytes_lost 0), work must
 * have been done across the kills and restarts, and the daemon's RSS must
 * not run away.  Bounds from measurement (8 s, 3 workers: 1.19e9 bytes
 * verified, 492 generations, RSS 10268 -> 11568 kB).
 *
 * ended_conversations_never_come_back (issue 40): the soak's verifying
 * workers (bench/soak_worker.c) on 4 ids each drop conversations, open new
 * ones on the same ids (also over detached ones, without a resume), detach
 * and resume them, while workers and commitkvd are SIGKILLed and the remote
 * tier's redis-server is SIGKILLed and started again on its port; every byte
 * served must be what the current conversation wrote (wrong_bytes 0), none
 * of an ended one (stale_served 0, ended_served 0), and the checks must have
 * happened. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

/* Under AddressSanitizer the daemon's freed memory waits in ASan's quarantine (256 MB by
 * default) before it is reused, so its RSS grows with the traffic, not with leaks: a CI run at
 * -O1 verified 278 MB and grew 52 MB.  Leaks there are LeakSanitizer's to find (at the
 * daemon's exit); the uninstrumented build keeps the 50 MB bound on its own. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_QUARANTINE_KB 262144.0
#else
#define RSS_QUARANTINE_KB 0.0
#endif

/* The number after "key": in json; NAN when absent. */
static double num(const char *json, const char *key) {
  char pat[96];
  snprintf(pat, sizeof(pat), "\"%s\": ", key);
  const char *p = json ? strstr(json, pat) : NULL;
  return p ? strtod(p + strlen(pat), NULL) : NAN;
}

Test(soak, kills_and_restarts_lose_no_byte, .timeout = 120) {
  char *dir = ckv_test_tmpdir("ckv-soak-test");
  char *json = NULL, *e = NULL;
  const char *const args[] = {"soak", "--workers", "3", "--sessions", "2", "--seconds", "6", "--kill-every-ms", "800",
                              "--restart-every-s", "2.5", "--json", NULL};
  int st = ckv_test_run_bench(args, dir, 100000, &json, &e);
  fprintf(stderr, "soak: %s", json ? json : "(no output)\n");
  cr_assert_eq(st, 0, "commitkv-bench soak exited %d: %s", st, e ? e : "");
  cr_assert_not_null(json);
  cr_expect_eq(num(json, "bytes_lost"), 0, "bytes lost");
  /* a floor on what was checked, not a speed: under AddressSanitizer on 2 shared cores a run
   * verified 86 MB in 59 generations (1.5 MB each); uninstrumented runs check more */
  cr_expect_gt(num(json, "bytes_verified"), 3e7, "too little verified: %.0f bytes", num(json, "bytes_verified"));
  cr_expect_geq(num(json, "kills"), 3);
  cr_expect_geq(num(json, "daemon_restarts"), 1);
  cr_expect_geq(num(json, "generations_ok"), 10);
  cr_expect_gt(num(json, "requests"), 1000);
  double drift = num(json, "rss_end_kb") - num(json, "rss_start_kb");
  cr_expect_lt(drift, 50000 + RSS_QUARANTINE_KB, "daemon RSS grew by %.0f kB", drift);
  free(json);
  free(e);
  ckv_test_rmdir(dir);
}

Test(soak, ended_conversations_never_come_back, .timeout = 240) {
  if (access("/usr/bin/redis-server", X_OK) != 0)
    cr_skip_test("/usr/bin/redis-server not found (make deps installs it): drops and id reuse across store "
                 "outages are NOT tested");
  char *dir = ckv_test_tmpdir("ckv-soak-reuse");
  char *json = NULL, *e = NULL;
  const char *const args[] = {"soak", "--workers", "1", "--sessions", "1", "--verify-workers", "3", "--ids", "4",
                              "--seconds", "45", "--kill-every-ms", "1500", "--restart-every-s", "6", "--remote",
                              "--store-outage-every-s", "8", "--json", NULL};
  int st = ckv_test_run_bench(args, dir, 200000, &json, &e);
  fprintf(stderr, "soak: %s", json ? json : "(no output)\n");
  cr_assert_not_null(json, "no output: %s", e ? e : "");
  /* what went wrong, id and position, is in the bench's stderr */
  cr_expect_eq(num(json, "wrong_bytes"), 0, "wrong bytes served: %s", e ? e : "");
  cr_expect_eq(num(json, "stale_served"), 0, "an ended conversation's bytes served: %s", e ? e : "");
  cr_expect_eq(num(json, "ended_served"), 0, "a dropped id resumed: %s", e ? e : "");
  cr_expect_eq(num(json, "nondraft_blocks"), 0, "fp16 sessions with blocks that cannot be checked byte for byte");
  cr_assert_eq(st, 0, "commitkv-bench soak exited %d: %s", st, e ? e : "");
  /* the checks happened: floors at about a tenth of what 45 s gave here (2 shared cores, RelWithDebInfo: 2.6e8
   * bytes, 316-445 ids reused, 21 replaced, 225-309 resumes of which 48-75 after a kill -9, 328-436 NOT_FOUND,
   * 4 outages, 31-52 remote restores) */
  cr_expect_gt(num(json, "reuse_bytes_verified"), 2e7, "too little verified: %.0f", num(json, "reuse_bytes_verified"));
  cr_expect_geq(num(json, "ids_reused"), 20);
  cr_expect_geq(num(json, "drops"), 20);
  cr_expect_geq(num(json, "replaces"), 3, "no detached conversation replaced without a resume");
  cr_expect_geq(num(json, "resumes_ok"), 20);
  cr_expect_geq(num(json, "resumes_after_restart"), 3, "no resume from a crash copy after a daemon kill -9");
  cr_expect_geq(num(json, "resumes_not_found"), 10);
  cr_expect_geq(num(json, "daemon_restarts"), 5);
  cr_expect_geq(num(json, "store_outages"), 3);
  cr_expect_geq(num(json, "remote_restores"), 2, "the remote tier was not in play");
  free(json);
  free(e);
  ckv_test_rmdir(dir);
}
