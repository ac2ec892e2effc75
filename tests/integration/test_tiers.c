/* test_tiers.c - the disk tier (issue 15, tiers): real commitkvd processes
 * with disk_idle = 1s, libcommitkv in this process, the reference worker.
 *
 * - idle_session_goes_to_disk_and_back: two sessions with history (draft,
 *   staged and committed blocks; and an fp16 one) go quiet: both move to
 *   disk (the tenant's arena bytes drop to 0, the tier files exist under
 *   state_dir/tier and ListSnapshots does not show them, the counters say
 *   2 offloads); a GetView brings one back and a ReportRound the other,
 *   each under a new epoch with every block's payload byte for byte and
 *   every token in the same format; the counters add up (2 restores, 2
 *   primary misses, no bytes left on disk, the files removed).
 * - prefetch_starts_the_way_back_and_answers_at_once: ckv_session_prefetch
 *   (Acquire with prefetch) answers a session on disk at once, not
 *   resident, and the session comes back with no other request, identical.
 * - request_during_offload_keeps_session: a request on a large session
 *   while its tier file is being written cancels the move: the blocks stay
 *   (arena bytes unchanged), the file is removed, cancelled counts it.
 * - disk_memory_too_small_stays_resident: a tier smaller than the session:
 *   it stays in memory, refused counts it, the log says why.
 * - kill9_with_session_on_disk_resumes: a detached session on disk, the
 *   daemon killed with SIGKILL, a new one on the same state directory counts
 *   the file and brings the session back on OpenSession with resume,
 *   identical, and removes the file.
 * - reference_worker_rides_through_offload: commitkv-worker with two
 *   sessions and a pause longer than disk_idle: the quiet session goes to
 *   disk and comes back, and the worker still reads every byte it wrote. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "testcheck.h"
#include "testutil.h"
#include "tiercheck.h"
#include "viewcapture.h"

TestSuite(tiers, .fini = ckv_test_leak_check);

#define DEADLINE_MS 20000

static void daemon_start(ckv_test_daemon *d, const char *disk_memory) {
  char mem[64];
  snprintf(mem, sizeof mem, "daemon.disk_memory=%s", disk_memory);
  const char *args[] = {"--set", "daemon.disk_idle=1s", "--set", mem, "--set", "daemon.detach_keep=60s",
                        "--set", "daemon.lease=30s", NULL};
  cr_assert_eq(ckv_test_daemon_start(d, args), 0, "commitkvd did not start");
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_tiers", .timeout_ms = 15000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* daemon_start and a client of it: how most tests begin. */
static ckv_client *start_with_client(ckv_test_daemon *d, const char *disk_memory) {
  daemon_start(d, disk_memory);
  return connect_to(d);
}

/* How they end: c freed, d stopped (it must exit 0). */
static void stop_with_client(ckv_client *c, ckv_test_daemon *d) {
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(d), 0);
}

static void wait_tier_file_gone(const ckv_test_daemon *d, const char *id) {
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_test_tier_file_exists(d, id)) {
    cr_assert_lt(ckv_test_now_ms(), end, "the tier file of %s was never removed", id);
    usleep(20000);
  }
}

/* ---- sessions with K/V ---- */

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u

static const ckv_geometry k_geom = {LAYERS, HEADS, DIM, 0};

/* `id` with `policy` and `rounds` rounds of history (ckv_test_session_with_rounds). */
static ckv_session *session_with_rounds(ckv_client *c, const char *id, const char *policy, uint32_t rounds) {
  ckv_session_options so = {.policy = policy};
  return ckv_test_session_with_rounds(c, id, &k_geom, &so, rounds);
}

/* A commitkv session `id` of `rounds` rounds, its moves done, and its view then (*ret_before): what it must read as
 * once it went down and came back. */
static ckv_session *settled_session(ckv_client *c, const char *id, uint32_t rounds, ckv_capture *ret_before) {
  ckv_session *s = session_with_rounds(c, id, "commitkv", rounds);
  ckv_test_wait_settled(c);
  *ret_before = ckv_test_capture_view(c, id, &k_geom);
  return s;
}

/* ---- tests ---- */

Test(tiers, idle_session_goes_to_disk_and_back, .timeout = 120) {
  ckv_test_daemon d;
  ckv_client *c = start_with_client(&d, "64M");
  ckv_session *a = session_with_rounds(c, "tier-a", "commitkv", 12);
  ckv_session *b = session_with_rounds(c, "tier-b", "fp16", 3);
  ckv_test_wait_settled(c);
  ckv_capture before_a = ckv_test_capture_view(c, "tier-a", &k_geom), before_b = ckv_test_capture_view(c, "tier-b", &k_geom);
  cr_assert_gt(before_a.per_format[CKV_FORMAT_DRAFT], 0);
  size_t compressed = 0;
  for (int f = CKV_FORMAT_STAGED; f < CKV_FORMAT_COUNT_; f++) compressed += before_a.per_format[f];
  cr_assert_gt(compressed, 0, "the history made no compressed blocks");
  unsigned long long used = ckv_test_stat(&d, "arenas.0.bytes_used");
  cr_assert_gt(used, 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.offloads"), 0);

  /* quiet for disk_idle: both go down, and give their memory back */
  ckv_test_wait_stat_at_least(&d, "tiers.1.offloads", 2);
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), 0, "the offloaded sessions still hold arena bytes");
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.bytes.total"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.sessions"), 2);
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.sessions"), 0);
  unsigned long long on_disk = ckv_test_stat(&d, "tiers.1.bytes");
  cr_assert_gt(on_disk, 0);
  cr_assert_eq(on_disk, ckv_test_stat(&d, "tiers.1.offload_bytes"));
  cr_assert(ckv_test_tier_file_exists(&d, "tier-a") && ckv_test_tier_file_exists(&d, "tier-b"));
  const char *snaps[] = {"snapshots", NULL};
  char *listed = ckv_test_ctl(&d, snaps);
  cr_assert_not_null(listed);
  cr_assert_null(strstr(listed, "tier-a"), "ListSnapshots shows a tier file: %s", listed);
  free(listed);
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(c, "tier-a", tier, sizeof tier), "disk");

  /* GetView brings tier-a back: a new epoch, the same bytes and states */
  ckv_capture after_a = ckv_test_capture_view(c, "tier-a", &k_geom);
  cr_assert_gt(after_a.epoch, before_a.epoch, "the epoch did not change (%llu)", (unsigned long long)after_a.epoch);
  ckv_test_expect_same_view(&before_a, &after_a, "tier-a after GetView");
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.restores"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.sessions"), 1);

  /* ReportRound brings tier-b back (fp16: the round moves nothing) */
  size_t n = ckv_session_tokens(b);
  float *attn = calloc(n, sizeof(float));
  ckv_round_result rr;
  int r = ckv_session_report(b, 4, 0, attn, n, &rr);
  free(attn);
  cr_assert_eq(r, CKV_OK, "report on an offloaded session: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_gt(rr.epoch, before_b.epoch, "the report's epoch did not change");
  ckv_capture after_b = ckv_test_capture_view(c, "tier-b", &k_geom);
  ckv_test_expect_same_view(&before_b, &after_b, "tier-b after ReportRound");

  /* the counters add up */
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.restores"), 2);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.hits"), 2);
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.misses"), 2);
  /* in tokens: both sessions' tokens came from disk; the primary served every view since */
  unsigned long long both = ckv_session_tokens(a) + ckv_session_tokens(b);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.hit_tokens"), both);
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.miss_tokens"), both);
  unsigned long long served = ckv_test_stat(&d, "tiers.0.hit_tokens");
  cr_assert_geq(served, both + ckv_session_tokens(a), "primary hit tokens %llu: not every view counted", served);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.restore_bytes"), on_disk);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.sessions"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.bytes"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.sessions"), 2);
  /* the blocks came back (empty fill blocks are not rebuilt: at most as many bytes) */
  unsigned long long back = ckv_test_stat(&d, "arenas.0.bytes_used");
  cr_assert(back > 0 && back <= used, "the restored sessions hold %llu bytes, had %llu", back, used);
  wait_tier_file_gone(&d, "tier-a");
  wait_tier_file_gone(&d, "tier-b");
  ckv_test_capture_free(&before_a);
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_a);
  ckv_test_capture_free(&after_b);
  ckv_session_close(a);
  ckv_session_close(b);
  stop_with_client(c, &d);
}

/* Acquire with prefetch (ckv_session_prefetch): on a resident session it says so; on a session on
 * disk it answers at once (not resident: the read is on the I/O thread and the loop applies it
 * later), and the session then comes back with no other request, identical, restored once. */
Test(tiers, prefetch_starts_the_way_back_and_answers_at_once, .timeout = 120) {
  ckv_test_daemon d;
  ckv_client *c = start_with_client(&d, "64M");
  ckv_capture before;
  ckv_session *a = settled_session(c, "tier-p", 12, &before);
  bool resident = false;
  cr_assert_eq(ckv_session_prefetch(a, &resident), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert(resident, "a session in memory answered not resident");

  ckv_test_wait_stat_at_least(&d, "tiers.1.offloads", 1);
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(c, "tier-p", tier, sizeof tier), "disk");
  resident = true;
  cr_assert_eq(ckv_session_prefetch(a, &resident), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert(!resident, "a session on disk answered resident before its file was read");
  ckv_test_wait_tier(&d, c, "tier-p", "primary"); /* nothing else asks for it: it comes back by itself */
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.restores"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.sessions"), 0);
  cr_assert_eq(ckv_session_prefetch(a, &resident), CKV_OK);
  cr_assert(resident, "the session is back but the prefetch says it is not");
  ckv_capture after = ckv_test_capture_view(c, "tier-p", &k_geom);
  cr_assert_gt(after.epoch, before.epoch, "the epoch did not change (%llu)", (unsigned long long)after.epoch);
  ckv_test_expect_same_view(&before, &after, "tier-p after a prefetch");
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.restores"), 1, "the view read it back a second time");
  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(a);
  stop_with_client(c, &d);
}

Test(tiers, request_during_offload_keeps_session, .timeout = 180) {
  ckv_test_daemon d;
  ckv_client *c = start_with_client(&d, "1G");
  /* large enough that its write takes a while: 32 layers x 8 heads x 128 dims, 256 tokens (32 MiB) */
  const ckv_geometry g = {32, 8, 128, 0};
  ckv_session_options so = {.policy = "fp16"};
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "tier-big", &g, &so, &s), CKV_OK, "%s", ckv_client_last_error(c));
  uint64_t first;
  cr_assert_eq(ckv_session_append(s, 256, NULL, NULL, NULL, NULL, &first), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_test_write_tokens(s, &g, 0, 256);
  float attn[256] = {0};
  ckv_round_result rr;
  cr_assert_eq(ckv_session_report(s, 1, 0, attn, 256, &rr), CKV_OK);
  unsigned long long used = ckv_test_stat(&d, "arenas.0.bytes_used");
  /* Watch for the write and answer it with a request at once; a try that
   * came too late is a restore (the session goes quiet and is tried again). */
  bool cancelled = false;
  char tier[32];
  const ckv_view *v0;
  for (int attempt = 0; attempt < 5 && !cancelled; attempt++) {
    long long end = ckv_test_now_ms() + DEADLINE_MS;
    while (strcmp(ckv_test_session_tier(c, "tier-big", tier, sizeof tier), "offloading") != 0) {
      cr_assert_lt(ckv_test_now_ms(), end, "the session never went to disk (log: %s)", ckv_test_file_tail(d.log, 2000));
    }
    const ckv_view *v;
    cr_assert_eq(ckv_session_view(s, &v), CKV_OK, "%s", ckv_client_last_error(c));
    cancelled = ckv_test_stat(&d, "tiers.1.cancelled") > 0 ||
                strcmp(ckv_test_session_tier(c, "tier-big", tier, sizeof tier), "offloading") == 0;
    if (cancelled) ckv_test_wait_stat_at_least(&d, "tiers.1.cancelled", 1);
  }
  cr_assert(cancelled, "no request ever arrived during the write (5 tries)");
  /* The cancel takes effect when the write comes back (the loop then keeps the blocks).  That may
   * be close to disk_idle after the request: name the session again at once so that no second
   * offload starts under the checks below (one that does is cancelled the same way). */
  cr_assert_eq(ckv_session_view(s, &v0), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_test_wait_tier(&d, c, "tier-big", "primary");
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), used, "a cancelled offload freed blocks");
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.bytes"), 0);
  wait_tier_file_gone(&d, "tier-big");
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "tier-offload-cancelled"), "the log does not say the offload was cancelled");
  free(log);
  /* every byte still reads back */
  const ckv_view *v;
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  size_t elems = (size_t)g.n_kv_heads * g.head_dim;
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *bv = &v->draft[i];
    const uint8_t *base = bv->data;
    const uint32_t *pos = ckv_block_positions_const(base);
    for (uint32_t slot = 0; slot < bv->capacity; slot++) {
      if (!ckv_block_slot_valid(base, slot)) continue;
      const uint16_t *k = (const uint16_t *)(base + ckv_draft_kv_offset(&g, bv->capacity, 5, 0, slot));
      for (size_t e = 0; e < elems; e++)
        cr_assert_eq(k[e], ckv_f32_to_f16(ckv_test_kv_value(pos[slot], 5, 0, (uint32_t)e)));
    }
  }
  ckv_session_close(s);
  stop_with_client(c, &d);
}

Test(tiers, disk_memory_too_small_stays_resident, .timeout = 60) {
  ckv_test_daemon d;
  ckv_client *c = start_with_client(&d, "4K");
  ckv_session *s = session_with_rounds(c, "tier-small", "commitkv", 4);
  ckv_test_wait_settled(c); /* the last round's moves change the arena's bytes (slowly under valgrind) */
  unsigned long long used = ckv_test_stat(&d, "arenas.0.bytes_used");
  ckv_test_wait_stat_at_least(&d, "tiers.1.refused", 1);
  usleep(500000);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.offloads"), 0);
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), used);
  cr_assert(!ckv_test_tier_file_exists(&d, "tier-small"));
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "disk tier is full") && strstr(log, "it stays in memory"),
            "the log does not say why: %s", ckv_test_file_tail(d.log, 2000));
  free(log);
  ckv_capture v = ckv_test_capture_view(c, "tier-small", &k_geom); /* still served at once */
  ckv_test_capture_free(&v);
  ckv_session_close(s);
  stop_with_client(c, &d);
}

Test(tiers, kill9_with_session_on_disk_resumes, .timeout = 120) {
  ckv_test_daemon d;
  ckv_client *c = start_with_client(&d, "64M");
  ckv_capture before;
  ckv_session *s = settled_session(c, "tier-k", 10, &before);
  ckv_session_close(s); /* detached: it goes down all the same */
  ckv_test_wait_stat_at_least(&d, "tiers.1.offloads", 1);
  cr_assert(ckv_test_tier_file_exists(&d, "tier-k"));
  ckv_client_free(c);
  cr_assert_eq(kill(d.pid, SIGKILL), 0);
  cr_assert_eq(ckv_test_wait(d.pid, DEADLINE_MS), 128 + SIGKILL);
  /* a new daemon on the same state directory */
  char log2[280];
  snprintf(log2, sizeof log2, "%s/commitkvd-2.log", d.dir);
  const char *argv[] = {"commitkvd", "--socket", d.socket, "--attach-socket", d.attach, "--state-dir", d.dir,
                        "--set", "daemon.metrics=", "--backend", "host", "--set", "daemon.disk_idle=1s",
                        "--set", "daemon.disk_memory=64M", NULL};
  snprintf(d.log, sizeof d.log, "%.280s", log2);
  d.pid = ckv_test_spawn(argv, d.log);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (!ckv_test_attach_accepts(d.attach)) {
    cr_assert(ckv_test_daemon_alive(&d), "the new commitkvd died (log %s)", d.log);
    cr_assert_lt(ckv_test_now_ms(), end);
    usleep(10000);
  }
  c = connect_to(&d);
  cr_assert_gt(ckv_test_stat(&d, "tiers.1.bytes"), 0, "the new daemon does not count the tier file");
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "tier-found"), "the new daemon does not say it found the tier file");
  free(log);
  ckv_session_options so = {.policy = "commitkv", .resume = true};
  ckv_session *s2 = NULL;
  int r = ckv_session_open(c, "tier-k", &k_geom, &so, &s2);
  cr_assert_eq(r, CKV_OK, "resume after kill -9: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  ckv_capture after = ckv_test_capture_view(c, "tier-k", &k_geom);
  ckv_test_expect_same_view(&before, &after, "tier-k resumed after kill -9");
  wait_tier_file_gone(&d, "tier-k");
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.bytes"), 0);
  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(s2);
  stop_with_client(c, &d);
}

Test(tiers, reference_worker_rides_through_offload, .timeout = 120) {
  ckv_test_daemon d;
  daemon_start(&d, "64M");
  char out[400];
  snprintf(out, sizeof out, "%s/worker.out", d.dir);
  const char *argv[] = {"commitkv-worker", "--socket", d.socket, "--attach-socket", d.attach, "--sessions", "2", "--rounds", "6", "--tokens", "16",
                        "--pause-ms", "3000", "--quiet", NULL};
  pid_t w = ckv_test_spawn(argv, out);
  int st = ckv_test_wait(w, 60000);
  cr_assert_eq(st, 0, "the worker failed (%d): %s", st, ckv_test_file_tail(out, 2000));
  cr_assert_geq(ckv_test_stat(&d, "tiers.1.offloads"), 1, "nothing went to disk during the pause");
  cr_assert_geq(ckv_test_stat(&d, "tiers.1.restores"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.errors"), 0);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}
