/* test_tier_pressure.c - moves to the disk tier under memory pressure (issue
 * 15, tiers: "under memory pressure the coldest move before anything is
 * recycled"): real commitkvd processes with a small tenant quota, disk_idle
 * 0 (no idle moves: whatever goes down goes for the quota), libcommitkv in
 * this process and, for a second tenant, in a child under another uid.
 *
 * The scenario (run_scenario): tenant "o" (uid 65531, a child) writes a
 * session and leaves it detached: the coldest session of the daemon.  This
 * process (tenant "p", quota QUOTA) writes session A (fp16, A_TOKENS) and
 * reports it, then grows session B with system tokens (never recycled, so
 * the old way refuses) BATCH at a time.
 *
 * - coldest_session_moves_before_quota_refusal: B's append that does not fit
 *   beside A succeeds: A went to disk (ListSessions tier "disk", tenant p's
 *   arena holds only B, tiers.1.pressure_moves 1), and B keeps growing until
 *   the quota is full without A (then the old refusal, CKV_ERR_QUOTA, with
 *   nothing more moved).  Tenant o's session, older than A, never moves.  B
 *   dropped, A comes back on GetView byte for byte; the counters add up.
 * - way_back_moves_the_coldest_first: with A on disk and B filling the
 *   quota, B reported and quiet for over a second: a GetView of A moves B
 *   down first and A comes back identical; A dropped, B comes back
 *   identical; the counters add up (2 moves, 2 restores).
 * - pressure_off_keeps_old_refusal / no_disk_tier_keeps_old_refusal /
 *   full_disk_tier_keeps_old_refusal: disk_pressure = no, disk_memory = 0,
 *   or a disk tier too small for A: the append that does not fit beside A is
 *   refused with CKV_ERR_QUOTA as before, A stays in memory (the full tier
 *   says so in the log and counts a refusal).
 * - recently_used_attached_session_stays: A attached and named by a request
 *   less than a second before (its worker may be reading it): A stays, and
 *   the append is refused the old way.
 * - stalled_compression_moves_the_coldest_session /
 *   stalled_compression_waits_with_pressure_off: B's staged moves find no
 *   room (see "compression stalled on the quota" below).
 * - compression_stalled_on_the_arena_moves_the_coldest_session: the same
 *   when the destination finds no free range in the arena (NOSPACE) while
 *   the quota has room (see "compression stalled on the arena"). */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "testcheck.h"
#include "testutil.h"
#include "tiercheck.h"
#include "viewcapture.h"

TestSuite(tier_pressure, .fini = ckv_test_leak_check);

#define DEADLINE_MS 20000
#define OTHER_UID 65531u
#define QUOTA_KIB 256u
#define A_TOKENS 128u
#define O_TOKENS 96u
#define BATCH 32u
#define MAX_BATCHES 64

static const ckv_geometry k_geom = {2, 2, 32, 0}; /* 512 bytes of K/V per token */

static void write_tokens(ckv_session *s, size_t from, size_t n) { ckv_test_write_tokens(s, &k_geom, from, n); }

/* An fp16 session of n tokens on k_geom, one round reported and acked (ckv_test_written_session: no assertion, the
 * child reports a failure). */
static ckv_session *written_session(ckv_client *c, const char *id, uint32_t n, int *ret_code, char *msg, size_t len) {
  return ckv_test_written_session(c, id, &k_geom, n, ret_code, msg, len);
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_tier_pressure",
                          .timeout_ms = 15000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* ---- the other tenant: a child under OTHER_UID ---- */

typedef struct other_report {
  int code;
  char tenant[64], msg[512];
} other_report;

static void other_body(const void *ctx, void *report) {
  const ckv_test_daemon *d = ctx;
  other_report *rep = report;
  ckv_client_options co = {.socket = d->socket, .attach_socket = d->attach, .name = "pressure-other",
                           .timeout_ms = 15000};
  ckv_client *c = NULL;
  if ((rep->code = ckv_client_connect(&co, &c)) != CKV_OK) {
    snprintf(rep->msg, sizeof rep->msg, "connect: %s", ckv_client_connect_error());
    return;
  }
  snprintf(rep->tenant, sizeof rep->tenant, "%s", ckv_client_tenant(c));
  ckv_session *s = written_session(c, "o-keep", O_TOKENS, &rep->code, rep->msg, sizeof rep->msg);
  /* leaves it detached (kept for detach_keep): the daemon's coldest session */
  if (s) ckv_session_close(s);
  ckv_client_free(c);
}

/* ---- the scenario ---- */

typedef struct scenario {
  ckv_test_daemon d;
  char *cfgdir;
  ckv_client *c;
  ckv_session *a, *b;
  ckv_capture before_a;
  unsigned long long a_bytes, o_bytes;
  long long a_quiet_since_ms; /* A's last request */
  uint32_t b_tokens_beside_a; /* B's tokens when its first append did not fit beside A */
  uint32_t b_tokens;          /* after fill_b */
  int first_refusal;          /* of B's appends: the first failure (CKV_OK: none) */
  char first_msg[512];
} scenario;

static int grow_b(scenario *sc, uint32_t *tokens) {
  uint8_t roles[BATCH];
  memset(roles, CKV_ROLE_SYSTEM, sizeof roles);
  uint64_t first;
  int r = ckv_session_append(sc->b, BATCH, roles, NULL, NULL, NULL, &first);
  if (r == CKV_OK) {
    write_tokens(sc->b, first, BATCH);
    *tokens += BATCH;
  }
  return r;
}

/* Starts the daemon (extra --set options), the other tenant's session, A,
 * then grows B until its next batch would not fit beside A, and appends it. */
static void run_scenario(scenario *sc, const char *const *sets, bool a_rests) {
  memset(sc, 0, sizeof(*sc));
  char text[256], cfg[400];
  snprintf(text, sizeof text, "[daemon]\ndetach_keep = 60s\nlease = 30s\n[tenant.p]\nuids = 0\nquota = %uK\n"
                              "[tenant.o]\nuids = %u\nquota = 1M\n",
           QUOTA_KIB, OTHER_UID);
  sc->cfgdir = ckv_test_write_config(text, cfg, sizeof cfg);
  const char *args[16] = {"--config", cfg};
  int n = 2;
  for (int i = 0; sets[i] && n < 14; i++) {
    args[n++] = "--set";
    args[n++] = sets[i];
  }
  args[n] = NULL;
  ckv_test_start_host(&sc->d, "64M", args);
  cr_assert_eq(chmod(sc->d.dir, 0755), 0); /* the other uid must reach the sockets */
  /* the child before this process has a ZeroMQ thread (fork safety) */
  other_report orep;
  memset(&orep, 0, sizeof orep);
  ckv_test_run_as(OTHER_UID, OTHER_UID, other_body, &sc->d, &orep, sizeof orep, DEADLINE_MS);
  cr_assert_eq(orep.code, CKV_OK, "tenant o: %s", orep.msg);
  cr_assert_str_eq(orep.tenant, "o");

  sc->c = connect_to(&sc->d);
  cr_assert_str_eq(ckv_client_tenant(sc->c), "p");
  sc->o_bytes = ckv_test_arena_used(sc->c, "o");
  cr_assert_gt(sc->o_bytes, 0);
  int code;
  char msg[512];
  sc->a = written_session(sc->c, "cold-a", A_TOKENS, &code, msg, sizeof msg);
  cr_assert_not_null(sc->a, "%s", msg);
  sc->before_a = ckv_test_capture_view(sc->c, "cold-a", &k_geom);
  sc->a_quiet_since_ms = ckv_test_now_ms();
  sc->a_bytes = ckv_test_arena_used(sc->c, "p");
  cr_assert_gt(sc->a_bytes, 0);

  ckv_session_options so = {.policy = "fp16"};
  cr_assert_eq(ckv_session_open(sc->c, "hot-b", &k_geom, &so, &sc->b), CKV_OK, "%s", ckv_client_last_error(sc->c));
  /* B grows while it fits beside A: the first batch that does not is the one under test */
  uint32_t tokens = 0;
  unsigned long long per_batch = 0, quota = QUOTA_KIB * 1024ull;
  for (int i = 0; i < MAX_BATCHES; i++) {
    unsigned long long used = ckv_test_arena_used(sc->c, "p");
    if (i == 2) per_batch = (used - sc->a_bytes) / 2; /* measured: whole blocks per batch */
    if (per_batch && used + per_batch > quota) break;
    cr_assert_eq(grow_b(sc, &tokens), CKV_OK, "B's batch %d failed beside A before the quota: %s", i,
                 ckv_client_last_error(sc->c));
  }
  cr_assert_gt(per_batch, 0);
  sc->b_tokens_beside_a = tokens;
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(sc->c, "cold-a", tier, sizeof tier), "primary", "A moved before the quota was short");
  /* A, attached, quiet for longer than an attached session must be to move
   * (CKV_TIER_PRESSURE_QUIET_MS, 1 s) */
  long long quiet_since = sc->a_quiet_since_ms;
  while (a_rests && ckv_test_now_ms() < quiet_since + 1300) usleep(20000);
  if (!a_rests) { /* A named by a request just now: its worker may be reading it */
    ckv_capture now_a = ckv_test_capture_view(sc->c, "cold-a", &k_geom);
    ckv_test_capture_free(&now_a);
  }
  sc->first_refusal = grow_b(sc, &tokens);
  snprintf(sc->first_msg, sizeof sc->first_msg, "%s", ckv_client_last_error(sc->c));
  fprintf(stderr,
          "test_tier_pressure: quota %u KiB, A %llu bytes, B %u tokens beside A (%llu bytes a batch); the next "
          "batch: %s%s%s\n",
          QUOTA_KIB, sc->a_bytes, sc->b_tokens_beside_a, per_batch, ckv_status_name(sc->first_refusal),
          sc->first_refusal ? ": " : "", sc->first_refusal ? sc->first_msg : "");
}

/* After A went down: B grows until the quota is full without A, then is
 * refused the old way (A on disk, nobody else of tenant p to move). */
static void fill_b(scenario *sc) {
  uint32_t tokens = sc->b_tokens_beside_a + BATCH;
  int r = CKV_OK;
  for (int i = 0; i < MAX_BATCHES && r == CKV_OK; i++) r = grow_b(sc, &tokens);
  cr_assert_eq(r, CKV_ERR_QUOTA, "B's growth ended with %s (%s)", ckv_status_name(r), ckv_client_last_error(sc->c));
  fprintf(stderr, "test_tier_pressure: B holds %u tokens once A is on disk (%u beside A)\n", tokens,
          sc->b_tokens_beside_a);
  cr_assert_gt(tokens, sc->b_tokens_beside_a + BATCH, "B did not grow into A's room");
  cr_assert_leq(ckv_test_arena_used(sc->c, "p"), QUOTA_KIB * 1024ull);
  sc->b_tokens = tokens;
}

static void end_scenario(scenario *sc) {
  ckv_test_capture_free(&sc->before_a);
  if (sc->b) ckv_session_close(sc->b);
  if (sc->a) ckv_session_close(sc->a);
  ckv_client_free(sc->c);
  ckv_test_stop_clean(&sc->d);
  ckv_test_rmdir(sc->cfgdir);
}

/* The old behaviour: refused with the quota error, A still in memory. */
static void expect_old_refusal(scenario *sc) {
  cr_assert_eq(sc->first_refusal, CKV_ERR_QUOTA, "B's append beside A: %s (%s), not the quota refusal",
               ckv_status_name(sc->first_refusal), sc->first_msg);
  cr_assert(strstr(sc->first_msg, "quota"), "%s", sc->first_msg);
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(sc->c, "cold-a", tier, sizeof tier), "primary");
  cr_assert_eq(ckv_test_stat(&sc->d, "tiers.1.offloads"), 0);
  cr_assert_eq(ckv_test_stat(&sc->d, "tiers.1.pressure_moves"), 0);
  cr_assert_eq(ckv_test_arena_used(sc->c, "o"), sc->o_bytes);
}

/* ---- tests ---- */

Test(tier_pressure, coldest_session_moves_before_quota_refusal, .timeout = 120) {
  scenario sc;
  run_scenario(&sc, (const char *const[]){"daemon.disk_memory=64M", NULL}, true);
  cr_assert_eq(sc.first_refusal, CKV_OK,
               "B's append that did not fit beside A was refused (%s: %s): A was not moved to disk first; log: %s",
               ckv_status_name(sc.first_refusal), sc.first_msg, ckv_test_file_tail(sc.d.log, 1500));
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(sc.c, "cold-a", tier, sizeof tier), "disk");
  cr_assert(ckv_test_tier_file_exists(&sc.d, "cold-a"));
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.offloads"), 1);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.pressure_moves"), 1);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.sessions"), 1);
  unsigned long long on_disk = ckv_test_stat(&sc.d, "tiers.1.bytes");
  cr_assert_gt(on_disk, 0);
  cr_assert_eq(on_disk, ckv_test_stat(&sc.d, "tiers.1.offload_bytes"));
  char *log = ckv_test_read_file(sc.d.log);
  cr_assert(log && strstr(log, "tier-pressure"), "the move was not logged");
  free(log);

  /* B keeps growing into the room A gave back, until the quota is full
   * without A: then the old refusal, and nothing else moves */
  fill_b(&sc);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.pressure_moves"), 1);

  /* the other tenant's session, the coldest of all, never moved */
  cr_assert_eq(ckv_test_arena_used(sc.c, "o"), sc.o_bytes, "tenant o's arena changed under tenant p's pressure");
  cr_assert_not(ckv_test_tier_file_exists(&sc.d, "o-keep"), "tenant o's session went to disk");

  /* room again (B dropped): A comes back on GetView, byte for byte */
  cr_assert_eq(ckv_session_drop(sc.b), CKV_OK);
  sc.b = NULL;
  ckv_capture after_a = ckv_test_capture_view(sc.c, "cold-a", &k_geom);
  cr_assert_gt(after_a.epoch, sc.before_a.epoch);
  ckv_test_expect_same_view(&sc.before_a, &after_a, "cold-a after its pressure move");
  ckv_test_capture_free(&after_a);
  cr_assert_str_eq(ckv_test_session_tier(sc.c, "cold-a", tier, sizeof tier), "primary");

  /* the counters add up */
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.restores"), 1);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.hits"), 1);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.0.misses"), 1);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.restore_bytes"), on_disk);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.sessions"), 0);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.bytes"), 0);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.errors"), 0);
  cr_assert_leq(ckv_test_arena_used(sc.c, "p"), sc.a_bytes);
  end_scenario(&sc);
}

Test(tier_pressure, way_back_moves_the_coldest_first, .timeout = 120) {
  scenario sc;
  run_scenario(&sc, (const char *const[]){"daemon.disk_memory=64M", NULL}, true);
  cr_assert_eq(sc.first_refusal, CKV_OK, "%s", sc.first_msg);
  fill_b(&sc);
  /* B's worker is done with it (a round reported), and B goes quiet */
  float *attn = calloc(sc.b_tokens, sizeof(float));
  ckv_round_result rr;
  cr_assert_eq(ckv_session_report(sc.b, 1, 0, attn, sc.b_tokens, &rr), CKV_OK, "%s", ckv_client_last_error(sc.c));
  free(attn);
  cr_assert_eq(ckv_session_ack(sc.b, rr.epoch, NULL), CKV_OK);
  ckv_capture before_b = ckv_test_capture_view(sc.c, "hot-b", &k_geom);
  long long quiet_since = ckv_test_now_ms();
  while (ckv_test_now_ms() < quiet_since + 1300) usleep(20000);

  /* A does not fit beside B: touching A moves B down first, and A comes back identical */
  ckv_capture after_a = ckv_test_capture_view(sc.c, "cold-a", &k_geom);
  ckv_test_expect_same_view(&sc.before_a, &after_a, "cold-a brought back under pressure");
  ckv_test_capture_free(&after_a);
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(sc.c, "hot-b", tier, sizeof tier), "disk");
  cr_assert_str_eq(ckv_test_session_tier(sc.c, "cold-a", tier, sizeof tier), "primary");
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.pressure_moves"), 2);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.offloads"), 2);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.restores"), 1);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.sessions"), 1);
  cr_assert_eq(ckv_test_arena_used(sc.c, "o"), sc.o_bytes, "tenant o's arena changed under tenant p's pressure");

  /* A dropped: B comes back identical too; every figure adds up */
  cr_assert_eq(ckv_session_drop(sc.a), CKV_OK);
  sc.a = NULL;
  ckv_capture after_b = ckv_test_capture_view(sc.c, "hot-b", &k_geom);
  ckv_test_expect_same_view(&before_b, &after_b, "hot-b after its pressure move");
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_b);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.restores"), 2);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.hits"), 2);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.0.misses"), 2);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.restore_bytes"), ckv_test_stat(&sc.d, "tiers.1.offload_bytes"));
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.sessions"), 0);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.bytes"), 0);
  cr_assert_eq(ckv_test_stat(&sc.d, "tiers.1.errors"), 0);
  cr_assert_not(ckv_test_tier_file_exists(&sc.d, "o-keep"));
  end_scenario(&sc);
}

Test(tier_pressure, recently_used_attached_session_stays, .timeout = 120) {
  scenario sc;
  run_scenario(&sc, (const char *const[]){"daemon.disk_memory=64M", NULL}, /* a_rests= */ false);
  expect_old_refusal(&sc);
  end_scenario(&sc);
}

Test(tier_pressure, pressure_off_keeps_old_refusal, .timeout = 120) {
  scenario sc;
  run_scenario(&sc, (const char *const[]){"daemon.disk_memory=64M", "daemon.disk_pressure=no", NULL}, true);
  expect_old_refusal(&sc);
  end_scenario(&sc);
}

Test(tier_pressure, no_disk_tier_keeps_old_refusal, .timeout = 120) {
  scenario sc;
  run_scenario(&sc, (const char *const[]){"daemon.disk_memory=0", NULL}, true);
  expect_old_refusal(&sc);
  end_scenario(&sc);
}

Test(tier_pressure, full_disk_tier_keeps_old_refusal, .timeout = 120) {
  scenario sc;
  run_scenario(&sc, (const char *const[]){"daemon.disk_memory=4K", NULL}, true); /* smaller than A's file */
  expect_old_refusal(&sc);
  cr_assert_geq(ckv_test_stat(&sc.d, "tiers.1.refused"), 1);
  char *log = ckv_test_read_file(sc.d.log);
  cr_assert(log && strstr(log, "tier-full"), "the full tier was not logged");
  free(log);
  end_scenario(&sc);
}

/* ---- compression stalled on the quota ----
 * Tenant p holds A (fp16, reported, quiet) and B (policy int8), whose drafts
 * fill the quota until not even one staged block fits.  B's round stages its
 * tokens, and their moves find no room for a destination block
 * (moves-stalled).  With the disk tier's pressure on, the daemon moves A
 * (the coldest other session) to disk by itself, with no request of ours
 * asking, and B's moves then complete; with pressure off they wait, and A
 * stays. */

#define STALL_BATCH 16u /* one draft block: the quota ends with less free than a staged block */

typedef struct stall_run {
  ckv_test_daemon d;
  char *cfgdir;
  ckv_client *c;
  ckv_session *a, *b;
  uint32_t b_tokens;
  uint64_t round;
  uint32_t pending; /* after B's first round */
} stall_run;

static uint32_t report_b(stall_run *st) {
  float *attn = calloc(st->b_tokens, sizeof(float));
  cr_assert_not_null(attn);
  ckv_round_result rr;
  int r = ckv_session_report(st->b, ++st->round, 0, attn, st->b_tokens, &rr);
  free(attn);
  cr_assert_eq(r, CKV_OK, "B's round %llu: %s (%s)", (unsigned long long)st->round, ckv_strerror(r),
               ckv_client_last_error(st->c));
  cr_assert_eq(ckv_session_ack(st->b, rr.epoch, NULL), CKV_OK); /* B's worker reads the new view */
  return rr.pending;
}

static void stall_setup(stall_run *st, const char *pressure) {
  memset(st, 0, sizeof(*st));
  char text[256], cfg[400];
  snprintf(text, sizeof text, "[daemon]\ndetach_keep = 60s\nlease = 30s\n[tenant.p]\nuids = 0\nquota = %uK\n",
           QUOTA_KIB);
  st->cfgdir = ckv_test_write_config(text, cfg, sizeof cfg);
  const char *args[] = {"--config", cfg, "--set", "daemon.disk_memory=64M", "--set", pressure, NULL};
  ckv_test_start_host(&st->d, "64M", args);
  st->c = connect_to(&st->d);
  int code;
  char msg[512];
  st->a = written_session(st->c, "cold-a", A_TOKENS, &code, msg, sizeof msg);
  cr_assert_not_null(st->a, "%s", msg);
  long long a_quiet_since = ckv_test_now_ms();

  ckv_session_options so = {.policy = "int8"};
  cr_assert_eq(ckv_session_open(st->c, "stalled-b", &k_geom, &so, &st->b), CKV_OK, "%s", ckv_client_last_error(st->c));
  unsigned long long quota = QUOTA_KIB * 1024ull;
  unsigned long long draft = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &k_geom, STALL_BATCH, 0);
  unsigned long long staged = ckv_format_block_bytes(CKV_FORMAT_STAGED, &k_geom, CKV_DEFAULT_CAPACITY_STAGED, 0);
  cr_assert_lt(draft, staged, "the premise: a draft block (%llu bytes) is smaller than a staged one (%llu)", draft,
               staged);
  for (int i = 0; i < 4 * MAX_BATCHES && ckv_test_arena_used(st->c, "p") + draft <= quota; i++) {
    uint64_t first;
    cr_assert_eq(ckv_session_append(st->b, STALL_BATCH, NULL, NULL, NULL, NULL, &first), CKV_OK,
                 "B's append %d: %s", i, ckv_client_last_error(st->c));
    write_tokens(st->b, first, STALL_BATCH);
    st->b_tokens += STALL_BATCH;
  }
  unsigned long long left = quota - ckv_test_arena_used(st->c, "p");
  fprintf(stderr, "test_tier_pressure: B %u tokens beside A, %llu bytes of the quota left (a staged block: %llu)\n",
          st->b_tokens, left, staged);
  cr_assert_lt(left, staged, "the quota still holds a staged block: nothing would stall");
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(st->c, "cold-a", tier, sizeof tier), "primary");
  while (ckv_test_now_ms() < a_quiet_since + 1300) usleep(20000); /* A quiet past CKV_TIER_PRESSURE_QUIET_MS */
  st->pending = report_b(st);
  cr_assert_gt(st->pending, 0, "B's round decided no moves");
}

static void stall_end(stall_run *st) {
  if (st->b) ckv_session_close(st->b);
  if (st->a) ckv_session_close(st->a);
  ckv_client_free(st->c);
  ckv_test_stop_clean(&st->d);
  ckv_test_rmdir(st->cfgdir);
}

Test(tier_pressure, stalled_compression_moves_the_coldest_session, .timeout = 120) {
  stall_run st;
  stall_setup(&st, "daemon.disk_pressure=yes");
  /* no request names A or B from here: the daemon moves A by itself */
  char tier[32];
  long long deadline = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_test_now_ms() < deadline && strcmp(ckv_test_session_tier(st.c, "cold-a", tier, sizeof tier), "disk"))
    usleep(50000);
  cr_assert_str_eq(tier, "disk", "A did not move for B's stalled compression; log: %s",
                   ckv_test_file_tail(st.d.log, 2000));
  cr_assert_eq(ckv_test_stat(&st.d, "tiers.1.pressure_moves"), 1);
  char *log = ckv_test_read_file(st.d.log);
  cr_assert(log && strstr(log, "compression stalled on the tenant quota"), "the move was not logged as the stall's");
  free(log);
  /* B's moves start once A's blocks are free, before B asks again */
  deadline = ckv_test_now_ms() + DEADLINE_MS;
  unsigned long long waiting = st.pending;
  while (ckv_test_now_ms() < deadline && (waiting = ckv_test_stat(&st.d, "pending_tokens")) >= st.pending)
    usleep(50000);
  cr_assert_lt(waiting, st.pending, "B's moves did not start when A's memory was freed (%llu pending)", waiting);
  /* and find room to the end: its rounds (acked, so retired drafts are freed) run them all */
  uint32_t pending = st.pending;
  deadline = ckv_test_now_ms() + DEADLINE_MS;
  while (pending && ckv_test_now_ms() < deadline) {
    usleep(50000);
    pending = report_b(&st);
  }
  cr_assert_eq(pending, 0, "B still has %u moves pending (%u after its first round); log: %s", pending, st.pending,
               ckv_test_file_tail(st.d.log, 2000));
  cr_assert_eq(ckv_test_stat(&st.d, "tiers.1.pressure_moves"), 1, "more than A moved");
  cr_assert_leq(ckv_test_arena_used(st.c, "p"), QUOTA_KIB * 1024ull);
  stall_end(&st);
}

Test(tier_pressure, stalled_compression_waits_with_pressure_off, .timeout = 120) {
  stall_run st;
  stall_setup(&st, "daemon.disk_pressure=no");
  uint32_t pending = st.pending;
  for (int i = 0; i < 30; i++) { /* 3 s of rounds: the moves wait for memory nobody frees */
    usleep(100000);
    pending = report_b(&st);
  }
  cr_assert_eq(pending, st.pending, "B's moves went ahead without memory (%u pending, %u at first)", pending,
               st.pending);
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(st.c, "cold-a", tier, sizeof tier), "primary");
  cr_assert_eq(ckv_test_stat(&st.d, "tiers.1.pressure_moves"), 0);
  char *log = ckv_test_read_file(st.d.log);
  cr_assert(log && strstr(log, "moves-stalled"), "the stall was not logged");
  free(log);
  stall_end(&st);
}

/* ---- compression stalled on the arena ----
 * The slab allocator (shm/slab.h) gives each block size a class and each
 * class whole 2 MiB chunks of the arena.  B (int8) writes 64 tokens; then
 * fp16 sessions of other geometries (a draft class each) take the rest of
 * the chunks, until one is refused for lack of a free range.  B's first
 * staged block then finds no free range either (CKV_ERR_NOSPACE) while the
 * quota is nearly empty.  With pressure on, the daemon moves the coldest
 * other session to disk by itself, its chunk goes back, and B's moves run. */
Test(tier_pressure, compression_stalled_on_the_arena_moves_the_coldest_session, .timeout = 120) {
  char cfg[400];
  char *cfgdir = ckv_test_write_config("[daemon]\ndetach_keep = 60s\nlease = 30s\n[tenant.p]\nuids = 0\nquota = 3M\n",
                                       cfg, sizeof cfg);
  const char *args[] = {"--config", cfg, "--set", "daemon.disk_memory=256M", "--set", "daemon.disk_pressure=yes", NULL};
  ckv_test_daemon d;
  ckv_test_start_host(&d, "64M", args);
  ckv_client *c = connect_to(&d);
  static const ckv_geometry gb = {1, 1, 8, 0};
  ckv_session *b = NULL;
  ckv_session_options so = {.policy = "int8"};
  cr_assert_eq(ckv_session_open(c, "stalled-b", &gb, &so, &b), CKV_OK, "%s", ckv_client_last_error(c));
  const uint32_t n = 64;
  uint64_t first;
  cr_assert_eq(ckv_session_append(b, n, NULL, NULL, NULL, NULL, &first), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_test_write_tokens(b, &gb, first, n);
  /* every other chunk to a class of its own: layers x head_dim products that no other session has */
  static const uint32_t dims[] = {16, 32, 64, 128}, layers[] = {1, 3, 5, 7};
  ckv_session *cold[16];
  int n_cold = 0, code = CKV_OK;
  char msg[512] = "";
  for (int i = 0; i < 16 && code == CKV_OK; i++) {
    const ckv_geometry g = {layers[i % 4], 1, dims[i / 4], 0};
    char id[32];
    snprintf(id, sizeof id, "cold-%d", i);
    ckv_session *x = ckv_test_written_session(c, id, &g, 16, &code, msg, sizeof msg);
    if (x) cold[n_cold++] = x;
  }
  cr_assert_eq(code, CKV_ERR_NOSPACE, "the premise: the arena's chunks run out (%d sessions): %s", n_cold, msg);
  cr_assert_geq(n_cold, 2);
  long long quiet_since = ckv_test_now_ms();
  unsigned long long used = ckv_test_arena_used(c, "p");
  cr_assert_lt(used, 2 * 1024 * 1024, "the premise: the quota is far from full (%llu bytes used)", used);
  while (ckv_test_now_ms() < quiet_since + 1300) usleep(20000); /* quiet past CKV_TIER_PRESSURE_QUIET_MS */
  float attn[64] = {0};
  ckv_round_result rr;
  uint64_t round = 1;
  cr_assert_eq(ckv_session_report(b, round, 0, attn, n, &rr), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert_eq(ckv_session_ack(b, rr.epoch, NULL), CKV_OK);
  cr_assert_gt(rr.pending, 0, "B's round decided no moves");
  /* no request names the cold sessions: the daemon moves one of them for B's stalled moves */
  long long deadline = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_test_now_ms() < deadline && ckv_test_stat(&d, "tiers.1.pressure_moves") == 0) usleep(50000);
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "compression stalled on the tenant arena"), "no session moved for the arena stall; log: %s",
            ckv_test_file_tail(d.log, 3000));
  free(log);
  /* B's moves run to the end once a chunk is back */
  uint32_t pending = rr.pending;
  deadline = ckv_test_now_ms() + DEADLINE_MS;
  while (pending && ckv_test_now_ms() < deadline) {
    usleep(50000);
    cr_assert_eq(ckv_session_report(b, ++round, 0, attn, n, &rr), CKV_OK, "%s", ckv_client_last_error(c));
    cr_assert_eq(ckv_session_ack(b, rr.epoch, NULL), CKV_OK);
    pending = rr.pending;
  }
  cr_assert_eq(pending, 0, "B still has %u moves pending; log: %s", pending, ckv_test_file_tail(d.log, 2000));
  cr_log_info("arena stall: %d sessions of other geometries took the chunks; %llu pressure move(s)", n_cold,
              ckv_test_stat(&d, "tiers.1.pressure_moves"));
  ckv_session_close(b);
  for (int i = 0; i < n_cold; i++) ckv_session_close(cold[i]);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}
