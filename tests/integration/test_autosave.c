/* test_autosave.c - autosave keeps up with many changing sessions (issue 40
 * N8).  A real commitkvd with [daemon] autosave = 1s and 300 sessions of one
 * client, every one of them appending, writing K/V and reporting a round
 * again and again for about 8 s.  Before, the housekeeping copied one
 * session per 100 ms scan, so with 300 changing sessions the crash copies
 * were 15-30 s old and a kill -9 lost over half the tokens, and nothing said
 * so.  Now:
 *
 * - at a kill -9 in the middle of the traffic, every session's autosave on
 *   disk was written less than 3 s before the kill (its header's
 *   saved_at_ms), and
 * - the daemon's own figure of the lag (Stats: the largest age of a change
 *   no copy holds yet, commitkv_autosave_lag_seconds) stayed under 3 s at
 *   every sample. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "persist/snapshot.h"
#include "testcheck.h"
#include "testutil.h"

TestSuite(autosave, .fini = ckv_test_leak_check);

#define SESSIONS 300
#define TOKENS 4u /* per round */
#define RUN_MS 8000
#define MAX_AGE_MS 3000 /* twice the period and a half: the bound */
#define DEADLINE_MS 30000

static const ckv_geometry k_geom = {1, 1, 32, CKV_DTYPE_FP16};

static long long wall_ms(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* One round of session s: TOKENS tokens appended, their K/V written, the round reported. */
static void one_round(ckv_client *c, ckv_session *s, uint32_t round) {
  uint64_t at = 0;
  int r = ckv_session_append(s, TOKENS, NULL, NULL, NULL, NULL, &at);
  cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  uint16_t k[32], v[32];
  for (uint64_t pos = at; pos < at + TOKENS; pos++) {
    for (uint32_t e = 0; e < 32; e++) {
      k[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, 0, 0, e));
      v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, 0, 1, e));
    }
    cr_assert_eq(ckv_session_write_kv(s, pos, 0, k, v), CKV_OK);
  }
  float attn[TOKENS * 64];
  size_t n = (size_t)(at + TOKENS);
  cr_assert_leq(n, sizeof attn / sizeof attn[0], "the run outgrew the attention buffer");
  for (size_t i = 0; i < n; i++) attn[i] = 1.0f / (float)n;
  ckv_round_result rr;
  r = ckv_session_report(s, round, 0, attn, n, &rr);
  cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_ack(s, rr.epoch, NULL), CKV_OK, "ack: %s", ckv_client_last_error(c));
}

Test(autosave, copies_keep_up_with_300_changing_sessions, .timeout = 180) {
  ckv_test_daemon d;
  const char *const args[] = {"--memory", "1G", "--set", "daemon.autosave=1s", "--set", "daemon.max_sessions=1000",
                              NULL};
  cr_assert_eq(ckv_test_daemon_start(&d, args), 0, "commitkvd did not start (log %s)", d.log);
  ckv_client_options o = {.socket = d.socket, .attach_socket = d.attach, .name = "test_autosave",
                          .timeout_ms = DEADLINE_MS};
  ckv_client *c = NULL;
  cr_assert_eq(ckv_client_connect(&o, &c), CKV_OK, "connect: %s", ckv_client_connect_error());
  ckv_session **s = calloc(SESSIONS, sizeof(*s));
  cr_assert_not_null(s);
  for (int i = 0; i < SESSIONS; i++) {
    char id[32];
    snprintf(id, sizeof id, "as-%03d", i);
    int r = ckv_session_open(c, id, &k_geom, NULL, &s[i]);
    cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  }
  long long end = ckv_test_now_ms() + RUN_MS, worst_lag_ms = 0;
  uint32_t round = 0;
  while (ckv_test_now_ms() < end && round < 60) {
    round++;
    for (int i = 0; i < SESSIONS; i++) one_round(c, s[i], round);
    if (round > 2) {
      long long lag = (long long)(ckv_test_stat(&d, "autosave_lag_ms"));
      if (lag > worst_lag_ms) worst_lag_ms = lag;
    }
  }
  cr_assert_geq(round, 4u, "only %u rounds of the 300 sessions in %d ms: too slow to measure", round, RUN_MS);
  long long killed_at = wall_ms();
  cr_assert_eq(kill(d.pid, SIGKILL), 0);
  cr_assert_eq(ckv_test_wait(d.pid, DEADLINE_MS), 128 + SIGKILL);
  d.pid = 0;
  /* every session's autosave, its age at the kill */
  char top[600];
  snprintf(top, sizeof top, "%s/autosave/default", d.dir);
  long long oldest = 0;
  int found = 0;
  for (int i = 0; i < SESSIONS; i++) {
    char path[800], err[256];
    snprintf(path, sizeof path, "%s/as-%03d.ckvsnap", top, i);
    ckv_snap h;
    int r = ckv_snap_read_header(path, &h, err, sizeof err);
    cr_assert_eq(r, CKV_OK, "session %d has no readable autosave: %s", i, err);
    found++;
    long long age = killed_at - (long long)h.saved_at_ms;
    if (age > oldest) oldest = age;
    ckv_snap_done(&h);
  }
  cr_log_info("300 sessions, %u rounds each in %d ms: the oldest autosave was %lld ms old at the kill; the daemon's "
              "lag figure peaked at %lld ms",
              round, RUN_MS, oldest, worst_lag_ms);
  cr_assert_eq(found, SESSIONS);
  cr_assert_lt(oldest, MAX_AGE_MS, "an autosave was %lld ms old at the kill (autosave = 1s)", oldest);
  cr_assert_lt(worst_lag_ms, MAX_AGE_MS, "the daemon reported an autosave lag of %lld ms", worst_lag_ms);
  for (int i = 0; i < SESSIONS; i++) ckv_session_close(s[i]);
  free(s);
  ckv_client_free(c);
  ckv_test_daemon_stop(&d);
}
