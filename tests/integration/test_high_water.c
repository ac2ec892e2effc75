/* test_high_water.c - the high-water mark of a tenant ([tenant.NAME]
 * high_water, issue 43: "over the high-water mark, appends do not wait for
 * moves"): a real commitkvd on host memory with the disk tier, every tier
 * write slowed to WRITE_DELAY_MS (CKV_TEST_SNAP_WRITE_DELAY_MS), tenant "p"
 * (this process) with a quota of QUOTA_KIB and high_water 0.5.
 *
 * Session A (fp16) is written, reported and left detached: the coldest.
 * Session B grows BATCH tokens at a time until the tenant holds more than
 * half its quota (still far from the quota itself).
 * - over_mark_moves_in_background: within a few housekeeping periods the
 *   daemon starts moving A to disk by itself ("tier-high-water" in the
 *   log, A listed "offloading"); B's next append, made while that move is
 *   being written, is answered in less than WRITE_DELAY_MS and A is still
 *   not on disk when it returns (the append did not wait for the move; the
 *   test fails if it did); then A lands on disk (pressure_moves 1) and the
 *   tenant holds less than the mark.
 * - off_by_default_no_early_move: the same without high_water: A stays in
 *   memory ("primary") 1.5 s after B passed half the quota, no
 *   "tier-high-water" in the log. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "testcheck.h"
#include "testutil.h"
#include "tiercheck.h"

TestSuite(high_water, .fini = ckv_test_leak_check);

#define QUOTA_KIB 512u
#define A_TOKENS 128u
#define BATCH 32u
#define WRITE_DELAY_MS 2000
#define DEADLINE_MS 20000

static const ckv_geometry k_geom = {2, 2, 32, 0}; /* 512 bytes of K/V per token */

static void write_tokens(ckv_session *s, size_t from, size_t n) { ckv_test_write_tokens(s, &k_geom, from, n); }

typedef struct hw {
  ckv_test_daemon d;
  char *cfgdir;
  ckv_client *c;
  ckv_session *b;
  uint32_t b_tokens;
} hw;

static int grow_b(hw *h) {
  uint64_t first;
  int r = ckv_session_append(h->b, BATCH, NULL, NULL, NULL, NULL, &first);
  if (r == CKV_OK) {
    write_tokens(h->b, first, BATCH);
    h->b_tokens += BATCH;
  }
  return r;
}

static bool log_has(const ckv_test_daemon *d, const char *needle) {
  char *log = ckv_test_read_file(d->log);
  bool r = log && strstr(log, needle);
  free(log);
  return r;
}

/* Daemon, A written and detached, B grown past half the quota. */
static void setup(hw *h, const char *high_water) {
  memset(h, 0, sizeof *h);
  char text[256], cfg[400];
  snprintf(text, sizeof text, "[daemon]\ndetach_keep = 60s\nlease = 30s\n[tenant.p]\nuids = 0\nquota = %uK\n%s",
           QUOTA_KIB, high_water);
  h->cfgdir = ckv_test_write_config(text, cfg, sizeof cfg);
  char delay[16];
  snprintf(delay, sizeof delay, "%d", WRITE_DELAY_MS);
  setenv("CKV_TEST_SNAP_WRITE_DELAY_MS", delay, 1); /* the daemon inherits it */
  ckv_test_start_host(&h->d, "64M",
                      (const char *const[]){"--config", cfg, "--set", "daemon.disk_memory=64M", "--set",
                                            "daemon.warm_journal=0", NULL});
  unsetenv("CKV_TEST_SNAP_WRITE_DELAY_MS");
  ckv_client_options o = {.socket = h->d.socket, .attach_socket = h->d.attach, .name = "test_high_water",
                          .timeout_ms = 15000};
  int r = ckv_client_connect(&o, &h->c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  cr_assert_str_eq(ckv_client_tenant(h->c), "p");

  int code;
  char msg[512];
  ckv_session *a = ckv_test_written_session(h->c, "cold-a", &k_geom, A_TOKENS, &code, msg, sizeof msg);
  cr_assert_eq(code, CKV_OK, "%s", msg);
  ckv_session_close(a); /* detached: the coldest session */

  ckv_session_options so = {.policy = "fp16"};
  cr_assert_eq(ckv_session_open(h->c, "hot-b", &k_geom, &so, &h->b), CKV_OK);
  const unsigned long long quota = QUOTA_KIB * 1024ull;
  for (int i = 0; ckv_test_arena_used(h->c, "p") <= quota / 2; i++) {
    cr_assert_lt(i, 64, "B never took the tenant past half its quota");
    r = grow_b(h);
    cr_assert_eq(r, CKV_OK, "B's batch %d under the quota: %s (%s)", i, ckv_strerror(r), ckv_client_last_error(h->c));
  }
  cr_assert_lt(ckv_test_arena_used(h->c, "p") + 4 * BATCH * 512ull, quota,
               "the test's geometry leaves no room under the quota");
}

static void teardown(hw *h) {
  ckv_session_close(h->b);
  ckv_client_free(h->c);
  ckv_test_stop_clean(&h->d);
  ckv_test_rmdir(h->cfgdir);
}

Test(high_water, over_mark_moves_in_background, .timeout = 120) {
  hw h;
  setup(&h, "high_water = 0.5\n");
  char tier[32];
  long long end = ckv_test_now_ms() + 3000;
  while (strcmp(ckv_test_session_tier(h.c, "cold-a", tier, sizeof tier), "offloading") != 0) {
    cr_assert_str_neq(tier, "disk", "A reached the disk before the test saw its move in flight");
    cr_assert_lt(ckv_test_now_ms(), end, "A did not start moving within 3 s of the tenant passing its mark (%s); log %s",
                 tier, ckv_test_file_tail(h.d.log, 1500));
    usleep(20000);
  }
  cr_assert(log_has(&h.d, "tier-high-water"), "the early move was not logged");
  /* the append while A's file is being written (WRITE_DELAY_MS) */
  long long t0 = ckv_test_now_ms();
  int r = grow_b(&h);
  long long took = ckv_test_now_ms() - t0;
  cr_assert_eq(r, CKV_OK, "B's append over the mark: %s (%s)", ckv_strerror(r), ckv_client_last_error(h.c));
  cr_assert_str_eq(ckv_test_session_tier(h.c, "cold-a", tier, sizeof tier), "offloading",
                   "A's move completed before B's append was answered (%lld ms)", took);
  cr_assert_lt(took, WRITE_DELAY_MS / 2, "B's append took %lld ms: it waited for the move", took);
  cr_log_info("append over the high-water mark answered in %lld ms while the move was being written", took);
  printf("high_water: append answered in %lld ms while A's move (writes slowed to %d ms) was in flight\n", took,
         WRITE_DELAY_MS);
  fflush(stdout);
  /* then A lands, and the tenant is back under its mark */
  end = ckv_test_now_ms() + DEADLINE_MS;
  while (strcmp(ckv_test_session_tier(h.c, "cold-a", tier, sizeof tier), "disk") != 0) {
    cr_assert_lt(ckv_test_now_ms(), end, "A never reached the disk (%s)", tier);
    usleep(50000);
  }
  cr_assert_eq(ckv_test_stat(&h.d, "tiers.1.pressure_moves"), 1);
  cr_assert_lt(ckv_test_arena_used(h.c, "p"), QUOTA_KIB * 1024ull / 2, "still over the mark after A went down");
  teardown(&h);
}

Test(high_water, off_by_default_no_early_move, .timeout = 120) {
  hw h;
  setup(&h, "");
  usleep(1500000);
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(h.c, "cold-a", tier, sizeof tier), "primary",
                   "A moved without a high-water mark and without quota pressure");
  cr_assert_not(log_has(&h.d, "tier-high-water"));
  cr_assert_eq(ckv_test_stat(&h.d, "tiers.1.pressure_moves"), 0);
  teardown(&h);
}
