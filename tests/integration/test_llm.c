/* test_llm.c - commitkv-llm, the worker that runs a real model
 * (stories260K) with its KV cache in a real commitkvd.
 *
 * With the fp16 policy the daemon's cache holds exactly the FP16 K/V that the
 * worker's shadow holds, so the two next-token distributions must agree at
 * every step (top-1 agreement 1, KL at rounding level).  With the commitkv
 * policy a 20-round session runs to the end with KL to FP16 within a bound
 * taken from measurement (issue 39's aim: 0.05), at fewer bytes than int8, its recycled tokens
 * demoted rather than dropped, and what the daemon reports is consistent with
 * DESIGN.md §4: every appended token is accounted for in exactly one state, the sessions' bytes fit in what the arena has handed
 * out, no request was refused, and the daemon still exits 0 on SIGTERM.
 * Without the model file the model tests skip, naming the path they looked
 * at; the error paths (no model, no daemon) run everywhere. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "examples/llm/model.h"
#include "testcheck.h"
#include "testutil.h"

#define LLM_TIMEOUT_MS 120000
#define ROUNDS "20"
#define TOKENS_PER_TURN "16"
#define TOKENS_PER_SESSION (1ull + 20ull * 16ull) /* BOS + 20 turns of 16 */

static const char *const k_daemon_args[] = {"--backend", "host", "--memory", "256M", NULL};

/* The model path the worker will be given, or skip the test visibly. */
static void model_or_skip(char *buf, size_t size) {
  if (ckv_model_path_from_env(buf, size) != 0) {
    const char *src = getenv("CKV_SOURCE_DIR");
    snprintf(buf, size, "%s/../shared/models/%s", src && *src ? src : ".", CKV_MODEL_DEFAULT_FILE);
  }
  struct stat st;
  if (stat(buf, &st) != 0) cr_skip_test("model file not found at %s (set CKV_MODEL or CKV_MODEL_DIR)", buf);
}

/* The number after the last "key": in json (the top-level summary follows
 * the per-session objects).  Returns 0, or -1 when absent or null. */
static int json_last_double(const char *json, const char *key, double *ret) {
  char pat[128];
  snprintf(pat, sizeof(pat), "\"%s\": ", key);
  const char *last = NULL;
  for (const char *p = strstr(json, pat); p; p = strstr(p + 1, pat)) last = p;
  if (!last) return -1;
  char *end;
  double v = strtod(last + strlen(pat), &end);
  if (end == last + strlen(pat)) return -1;
  *ret = v;
  return 0;
}

/* Runs commitkv-llm against d with the given policy and extra flags; returns
 * its exit status and, in *ret_out, everything it printed (malloc'd). */
static int run_llm(const ckv_test_daemon *d, const char *model, const char *policy, const char *const *extra,
                   char **ret_out) {
  char out[400];
  snprintf(out, sizeof(out), "%s/llm-%s.out", d->dir, policy);
  const char *argv[40] = {"commitkv-llm", "--socket", d->socket, "--attach-socket", d->attach, "--model", model,
                          "--policy", policy, "--sessions", "2", "--rounds", ROUNDS, "--user-tokens",
                          TOKENS_PER_TURN, "--assistant-tokens", TOKENS_PER_TURN, "--prefix", policy, "--json",
                          "--quiet"};
  int n = 21;
  for (int i = 0; extra && extra[i] && n < 39; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  int rc = ckv_test_wait(ckv_test_spawn(argv, out), LLM_TIMEOUT_MS);
  *ret_out = ckv_test_read_file(out);
  return rc;
}

/* A field of `commitkvctl stats --json`; a failed expectation (and a value
 * no check accepts) when it cannot be read, so the daemon is still stopped. */
static void start_daemon(ckv_test_daemon *d) {
  if (ckv_test_daemon_start(d, k_daemon_args) == 0) return;
  if (d->pid > 0) ckv_test_daemon_stop(d); /* started but never listened: leave nothing behind */
  cr_assert_fail("commitkvd did not start");
}

/* Stops the daemon first, so a failing run leaves no process behind. */
static void fail_run(ckv_test_daemon *d, int rc, char *out) {
  ckv_test_daemon_stop(d);
  cr_assert_fail("commitkv-llm failed (%d): %s", rc, out ? out : "(no output)");
}

Test(llm, fp16_policy_agrees_with_its_shadow, .timeout = 180) {
  char model[4096];
  model_or_skip(model, sizeof(model));
  ckv_test_daemon d;
  start_daemon(&d);
  const char *extra[] = {"--shadow", NULL};
  char *out = NULL;
  int rc = run_llm(&d, model, "fp16", extra, &out);
  if (rc != 0 || !out) fail_run(&d, rc, out);
  double top1 = -1, kl = -1, ratio = -1;
  cr_expect_eq(json_last_double(out, "top1_agreement", &top1), 0, "no top1_agreement in %s", out);
  cr_expect_eq(json_last_double(out, "kl_mean", &kl), 0, "no kl_mean in %s", out);
  cr_expect_eq(json_last_double(out, "bytes_ratio_fp16", &ratio), 0, "no bytes_ratio_fp16 in %s", out);
  cr_expect_eq(top1, 1.0, "fp16 in the daemon must pick the shadow's top token every time (got %g)", top1);
  cr_expect(kl >= 0 && kl < 1e-3, "fp16 KL against the FP16 shadow should be rounding noise, got %g", kl);
  cr_expect(ratio >= 1.0, "fp16 cannot take fewer bytes than FP16 (got %g)", ratio);
  cr_expect(strstr(out, "\"steps\": 321") != NULL, "every token is a step: %s", out);
  cr_expect_eq(ckv_test_stat(&d, "errors"), 0, "the daemon refused a request");
  free(out);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}

/* The largest value of "key": anywhere in json (every session's and the
 * summary's); -1 when absent. */
static double json_max_double(const char *json, const char *key) {
  char pat[128];
  snprintf(pat, sizeof(pat), "\"%s\": ", key);
  double best = -1;
  for (const char *p = strstr(json, pat); p; p = strstr(p + 1, pat)) {
    char *end;
    double v = strtod(p + strlen(pat), &end);
    if (end != p + strlen(pat) && v > best) best = v;
  }
  return best;
}

/* stories260K (head_dim 8: KIVI committed formats) with the commitkv
 * defaults: recycled tokens are demoted, never dropped, and only tokens
 * that went cold commit, after three times persistence_rounds (store/moves.c
 * ckv_moves_round).  Measured (commitkv-llm --shadow, 20 rounds of 16 + 16
 * tokens, seeds 1-4 and held-out 11-16, 20 sessions): KL at most 0.013 per
 * session at 0.545 of FP16, int8 0.589; committing warm tokens after
 * persistence_rounds gave 0.057-0.074 at 0.46, dropping the recycled tokens
 * (the rule before) 0.44-0.53 at 0.44: KL_BOUND fails both. */
#define KL_BOUND 0.03

Test(llm, commitkv_policy_twenty_rounds_keep_the_invariants, .timeout = 180) {
  char model[4096];
  model_or_skip(model, sizeof(model));
  ckv_test_daemon d;
  start_daemon(&d);
  const char *extra[] = {"--shadow", "--keep", NULL}; /* kept: the daemon still accounts for every token */
  char *out = NULL;
  int rc = run_llm(&d, model, "commitkv", extra, &out);
  if (rc != 0 || !out) fail_run(&d, rc, out);
  cr_expect(strstr(out, "\"rounds\": 20") != NULL, "a session stopped early: %s", out);
  double top1 = -1, ratio = -1;
  cr_expect_eq(json_last_double(out, "top1_agreement", &top1), 0, "no top1_agreement in %s", out);
  cr_expect_eq(json_last_double(out, "bytes_ratio_fp16", &ratio), 0, "no bytes_ratio_fp16 in %s", out);
  double kl = json_max_double(out, "kl_mean");
  cr_expect(kl >= 0 && kl <= KL_BOUND, "a session's KL to FP16 is %g, above %g: %s", kl, KL_BOUND, out);
  cr_expect(top1 >= 0.9 && top1 <= 1, "top-1 agreement %g: %s", top1, out);
  unsigned long long total = ckv_test_stat(&d, "tokens.draft") + ckv_test_stat(&d, "tokens.staged") +
                             ckv_test_stat(&d, "tokens.committed") + ckv_test_stat(&d, "tokens.recycled");
  cr_expect_eq(total, 2 * TOKENS_PER_SESSION, "state counts (%llu) must add up to the tokens appended", total);
  /* recycled, yet nothing dropped: no quota rule asked for it */
  cr_expect_gt(ckv_test_stat(&d, "tokens.recycled"), 0, "nothing was recycled: the demotion path did not run");
  cr_expect_eq(ckv_test_stat(&d, "tokens.dropped"), 0, "tokens were dropped without a quota rule");
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 2);
  cr_expect_gt(ckv_test_stat(&d, "bytes.total"), 0);
  cr_expect_leq(ckv_test_stat(&d, "bytes.total"), ckv_test_stat(&d, "arenas.0.bytes_used"),
                "sessions hold more bytes than the arena handed out");
  cr_expect_eq(ckv_test_stat(&d, "errors"), 0, "the daemon refused a request");
  free(out);
  /* fewer bytes than the int8 baseline on the same turns */
  const char *plain[] = {NULL};
  rc = run_llm(&d, model, "int8", plain, &out);
  if (rc != 0 || !out) fail_run(&d, rc, out);
  double int8_ratio = -1;
  cr_expect_eq(json_last_double(out, "bytes_ratio_fp16", &int8_ratio), 0, "no bytes_ratio_fp16 in %s", out);
  cr_expect(ratio > 0 && ratio < int8_ratio, "commitkv holds %g of FP16, int8 %g", ratio, int8_ratio);
  free(out);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}

Test(llm, missing_model_is_a_clear_error) {
  char dir[] = "/tmp/ckv-llm-nomodel.XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char out[128], model[160];
  snprintf(out, sizeof(out), "%s/out", dir);
  snprintf(model, sizeof(model), "%s/no-such-model.bin", dir);
  const char *argv[] = {"commitkv-llm", "--model", model, "--socket", "ipc:///nonexistent/commitkvd.sock", NULL};
  cr_expect_eq(ckv_test_wait(ckv_test_spawn(argv, out), 30000), 1);
  char *text = ckv_test_read_file(out);
  cr_expect(text && strstr(text, model), "the error should name the model path: %s", text ? text : "");
  free(text);
  unlink(out);
  rmdir(dir);
}

Test(llm, missing_daemon_is_a_clear_error) {
  char model[4096];
  model_or_skip(model, sizeof(model));
  char *dir = ckv_test_tmpdir("ckv-llm-nodaemon");
  char out[400], sock[400], attach[400];
  snprintf(out, sizeof(out), "%s/out", dir);
  snprintf(sock, sizeof(sock), "ipc://%s/commitkvd.sock", dir);
  snprintf(attach, sizeof(attach), "%s/commitkvd.attach", dir);
  const char *argv[] = {"commitkv-llm", "--model", model, "--socket", sock, "--attach-socket", attach, NULL};
  cr_expect_eq(ckv_test_wait(ckv_test_spawn(argv, out), 30000), 1);
  char *text = ckv_test_read_file(out);
  cr_expect(text && strstr(text, "commitkvd"), "the error should say the daemon is missing: %s", text ? text : "");
  free(text);
  ckv_test_rmdir(dir);
}
