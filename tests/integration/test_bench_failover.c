/* test_bench_failover.c - `commitkv-bench failover --quick --json` (issue 43)
 * kills commitkvd with SIGKILL under a private systemd --user while its
 * workers write rounds; every key the bench promises is present, and the
 * relations that must hold exactly do:
 *   - kills = 3 (--quick) and one per_kill row per kill; every kill
 *     accounts for every worker's session: sessions_kept + sessions_lost =
 *     workers per kill;
 *   - wrong_bytes = 0, in total and per kill: every kept token's K/V is the
 *     bytes its worker wrote (another session's or an older write's fail);
 *   - bytes_verified = kept_tokens x token_bytes (every kept token compared,
 *     none skipped), per kill too;
 *   - kept_tokens <= acked_tokens (the bench itself fails when a session
 *     comes back with tokens the daemon never answered), kept_ratio =
 *     kept / acked, totals = sums of the rows;
 *   - 0 < restart_ms <= first_round_ms per kill, p50 <= max;
 *   - arena_remapped = 0: the worker kept its mapping at every restart.
 * The aims (kept_ratio >= 0.99, first round within 1 s) are printed, not
 * asserted: they depend on the machine's load and the rounds' pace.
 * soak_kill_daemon: `commitkv-bench soak --kill-daemon-every-s 2` for 6 s
 * with verifying workers: daemon_kills >= 2 (and = daemon_restarts), every
 * restart logged its warm-restart outcome (kills_without_outcome = 0), one
 * per_daemon_kill row per kill summing to sessions_kept / _dropped, and the
 * verifying workers' exact counters: wrong_bytes, stale_served,
 * ended_served, bytes_lost all 0.
 * Without a private systemd --user the benches answer {"skipped": true,
 * "reason": ...}: the tests print SKIPPED with it and skip. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The number after `"key":` at or after `from` (NAN when absent). */
static double num_after(const char *from, const char *key) {
  char pat[96];
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  const char *p = from ? strstr(from, pat) : NULL;
  if (!p) return NAN;
  p += strlen(pat);
  while (*p == ' ') p++;
  return strtod(p, NULL);
}

Test(bench_failover, quick_json_invariants, .timeout = 90) {
  char *dir = ckv_test_tmpdir("ckv-bench-failover-test");
  char *json = NULL, *e = NULL;
  const char *const args[] = {"failover", "--quick", "--json", NULL};
  long long t0 = ckv_test_now_ms();
  int st = ckv_test_run_bench(args, dir, 80000, &json, &e);
  fprintf(stderr, "bench failover (%lld ms): %s", ckv_test_now_ms() - t0, json ? json : "(no output)\n");
  cr_assert_not_null(json, "no output; stderr: %s", e ? e : "");
  if (strstr(json, "\"skipped\": true")) {
    printf("SKIPPED: %s", json);
    fflush(stdout);
    free(json);
    free(e);
    ckv_test_rmdir(dir);
    cr_skip("commitkv-bench failover skipped: no private systemd --user here");
  }
  cr_assert_eq(st, 0, "commitkv-bench failover exited %d: %s", st, e ? e : "");
  cr_assert_not_null(strstr(json, "\"skipped\": false"), "%s", json);

  const double kills = num_after(json, "kills"), workers = num_after(json, "workers"),
               token_bytes = num_after(json, "token_bytes");
  cr_assert_eq(kills, 3, "--quick kills 3 times: %g", kills);
  cr_assert(workers >= 1, "workers %g", workers);
  cr_assert_gt(token_bytes, 0);
  const char *keys[] = {"first_round_ms_p50", "first_round_ms_max", "acked_tokens", "kept_tokens", "kept_ratio",
                        "bytes_verified", "wrong_bytes", "sessions_kept", "sessions_lost", "restart_ms_p50",
                        "arena_remapped", "rounds", "sanitizer_reports"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    cr_assert(isfinite(num_after(json, keys[i])), "no number for %s in %s", keys[i], json);

  const double acked = num_after(json, "acked_tokens"), kept = num_after(json, "kept_tokens");
  cr_assert_eq(num_after(json, "wrong_bytes"), 0, "wrong bytes after a kill: %s", json);
  cr_assert_leq(kept, acked);
  cr_assert_gt(acked, 0);
  cr_assert_float_eq(num_after(json, "kept_ratio"), kept / acked, 1e-5);
  cr_assert_eq(num_after(json, "bytes_verified"), kept * token_bytes, "bytes_verified %g, kept %g x %g",
               num_after(json, "bytes_verified"), kept, token_bytes);
  cr_assert_eq(num_after(json, "arena_remapped"), 0, "a restart did not hand back the arena the worker maps");
  cr_assert_eq(num_after(json, "sanitizer_reports"), 0);
  const double p50 = num_after(json, "first_round_ms_p50"), mx = num_after(json, "first_round_ms_max");
  cr_assert(p50 > 0 && p50 <= mx, "first round p50 %g max %g", p50, mx);

  /* the rows: one per kill, summing to the totals */
  const char *row = strstr(json, "\"per_kill\": [");
  cr_assert_not_null(row);
  double sum_acked = 0, sum_kept = 0, sum_verified = 0, sum_sk = 0, sum_sl = 0, row_max = 0;
  int rows = 0;
  while ((row = strstr(row, "{\"worker\":"))) {
    const char *end = strchr(row, '}');
    cr_assert_not_null(end);
    char *r = strndup(row, (size_t)(end - row + 1));
    const double a = num_after(r, "acked_tokens"), k = num_after(r, "kept_tokens"), sk = num_after(r, "sessions_kept"),
                 sl = num_after(r, "sessions_lost"), rs = num_after(r, "restart_ms"),
                 fr = num_after(r, "first_round_ms"), bv = num_after(r, "bytes_verified");
    cr_assert_leq(k, a, "row %d: kept %g > acked %g", rows, k, a);
    cr_assert_eq(sk + sl, workers, "row %d: %g kept + %g lost sessions of %g workers", rows, sk, sl, workers);
    cr_assert_eq(num_after(r, "wrong_bytes"), 0, "row %d: %s", rows, r);
    cr_assert_eq(bv, k * token_bytes, "row %d: %s", rows, r);
    cr_assert(rs > 0 && rs <= fr, "row %d: restart %g ms, first round %g ms", rows, rs, fr);
    cr_assert(strstr(r, "\"point\": \""), "row %d names no kill point: %s", rows, r);
    sum_acked += a;
    sum_kept += k;
    sum_verified += bv;
    sum_sk += sk;
    sum_sl += sl;
    if (fr > row_max) row_max = fr;
    rows++;
    free(r);
    row = end;
  }
  cr_assert_eq(rows, kills, "%d rows for %g kills", rows, kills);
  cr_assert_eq(sum_acked, acked);
  cr_assert_eq(sum_kept, kept);
  cr_assert_eq(sum_verified, num_after(json, "bytes_verified"));
  cr_assert_eq(sum_sk, num_after(json, "sessions_kept"));
  cr_assert_eq(sum_sl, num_after(json, "sessions_lost"));
  cr_assert_float_eq(row_max, mx, 0.051);
  cr_log_info("failover --quick: kept %g of %g acked tokens (%.4f), first round p50 %.1f ms max %.1f ms", kept, acked,
              kept / acked, p50, mx);
  free(json);
  free(e);
  ckv_test_rmdir(dir);
}

Test(bench_failover, soak_kill_daemon, .timeout = 90) {
  char *dir = ckv_test_tmpdir("ckv-bench-soak-kd-test");
  char *json = NULL, *e = NULL;
  const char *const args[] = {"soak", "--workers", "1", "--verify-workers", "2", "--seconds", "6",
                              "--kill-daemon-every-s", "2", "--json", NULL};
  long long t0 = ckv_test_now_ms();
  int st = ckv_test_run_bench(args, dir, 80000, &json, &e);
  fprintf(stderr, "bench soak --kill-daemon-every-s (%lld ms): %s", ckv_test_now_ms() - t0,
          json ? json : "(no output)\n");
  cr_assert_not_null(json, "no output; stderr: %s", e ? e : "");
  if (strstr(json, "\"skipped\": true")) {
    printf("SKIPPED: %s", json);
    fflush(stdout);
    free(json);
    free(e);
    ckv_test_rmdir(dir);
    cr_skip("commitkv-bench soak --kill-daemon-every-s skipped: no private systemd --user here");
  }
  cr_assert_eq(st, 0, "commitkv-bench soak exited %d: %s", st, e ? e : "");
  const double kills = num_after(json, "daemon_kills");
  cr_assert(kills >= 2, "daemon_kills %g in 6 s at one every 2 s", kills);
  cr_assert_eq(num_after(json, "daemon_restarts"), kills);
  cr_assert_eq(num_after(json, "kills_without_outcome"), 0, "a restart logged no warm-restart outcome: %s", e);
  const char *zero[] = {"wrong_bytes", "stale_served", "ended_served", "bytes_lost"};
  for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++)
    cr_assert_eq(num_after(json, zero[i]), 0, "%s: %g", zero[i], num_after(json, zero[i]));
  cr_assert_gt(num_after(json, "reuse_bytes_verified"), 0);
  const char *row = strstr(json, "\"per_daemon_kill\": [");
  cr_assert_not_null(row);
  double kept = 0, dropped = 0;
  int rows = 0;
  while ((row = strstr(row, "{\"sessions_kept\":"))) {
    kept += num_after(row, "sessions_kept");
    dropped += num_after(row, "sessions_dropped");
    cr_assert_gt(num_after(row, "restart_ms"), 0);
    rows++;
    row++;
  }
  cr_assert_eq(rows, kills);
  cr_assert_eq(kept, num_after(json, "sessions_kept"));
  cr_assert_eq(dropped, num_after(json, "sessions_dropped"));
  free(json);
  free(e);
  ckv_test_rmdir(dir);
}

Test(bench_failover, rejects_bad_arguments, .timeout = 30) {
  char *dir = ckv_test_tmpdir("ckv-bench-failover-args");
  const char *const args[] = {"failover", "--workers", "0", "--json", NULL};
  char *out = NULL, *err = NULL;
  int st = ckv_test_run_bench(args, dir, 20000, &out, &err);
  cr_assert_eq(st, 2, "--workers 0 exited %d: %s", st, err ? err : "");
  cr_assert(err && strstr(err, "--workers"), "no usage on stderr: %s", err ? err : "");
  free(out);
  free(err);
  ckv_test_rmdir(dir);
}
