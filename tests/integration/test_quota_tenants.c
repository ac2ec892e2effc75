/* test_quota_tenants.c - quota exhaustion under concurrent appends by several
 * tenants with real uids (issue 16, fault injection).
 *
 * Three tenants (uids 65531..65533, quotas of 384, 512 and 768 KiB) each run
 * in a child process that switched to its uid before it opened anything, so
 * the daemon knows them by SO_PEERCRED.  For a few seconds every child
 * appends and writes K/V as fast as it can into two sessions: one whose
 * tokens are all system tokens (never recycled, so it fills the quota and is
 * refused), one of user tokens with rounds reported and acknowledged (quota
 * pressure compresses and recycles them).  A refused append drops the full
 * session and opens a fresh one, so every tenant hits its quota again and
 * again for the whole run.  Meanwhile this process (root: admin) polls the
 * Stats RPC as fast as it answers.
 *
 * What must hold:
 * - no tenant's arena ever holds more bytes than its quota, at any poll,
 *   and the daemon's accounting agrees with itself at the end (the bytes of
 *   the tenant's arena in use are the bytes its sessions hold; all come
 *   back once the sessions expire);
 * - every refusal is CKV_ERR_QUOTA, naming the tenant and its quota; no other
 *   error;
 * - no tenant starves: each one's answered requests are at least a fraction
 *   of the busiest one's (a generous fairness bound from measurement, not a
 *   speed: unloaded, the three are within 1.5x of each other);
 * - the daemon keeps serving and exits 0 on SIGTERM. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#define RAW_CLIENT_NAME "quota-poller"
#include "rawcheck.h"
#include "testcheck.h"
#include "testutil.h"

TestSuite(quota_tenants, .fini = ckv_test_leak_check);

#define N_TENANTS 3
#define RUN_MS 4000 /* how long the tenants hammer the daemon */
#define CHILD_MS                                                             \
  60000 /* a child's whole life, far beyond RUN_MS on a loaded sanitizer run \
         */
#define APPEND_TOKENS 16
/* Fairness: the least served tenant gets at least 1/STARVE_FACTOR of the
 * requests the busiest one got.  Measured unloaded: within 1.5x; on the
 * loaded 2-core machine under ASan, within 3x.  A tenant that is locked out
 * (a loop that serves one peer while another waits) falls far below. */
#define STARVE_FACTOR 8

static const unsigned k_uids[N_TENANTS] = {65531, 65532, 65533};
static const unsigned k_quota_kib[N_TENANTS] = {384, 512, 768};
static const ckv_geometry k_tgeom = {2, 2, 64, 0}; /* 1 KiB of K/V per token */

typedef struct tenant_ctx {
  const ckv_test_daemon *d;
  long long start_ms, end_ms; /* the common window, on the monotonic clock */
} tenant_ctx;

typedef struct tenant_report {
  char tenant[64];
  int connect_code;
  char connect_msg[200];
  unsigned long long appends_ok, quota_refusals, answered, reopened, rounds;
  int other_code; /* first error that is not CKV_ERR_QUOTA */
  char other_msg[200];
  char quota_msg[200]; /* the text of one quota refusal */
} tenant_report;

static int fresh_session(ckv_client *c, const char *prefix, unsigned *seq, ckv_session **ret) {
  char id[64];
  snprintf(id, sizeof id, "%s-%u", prefix, (*seq)++);
  return ckv_session_open(c, id, &k_tgeom, NULL, ret);
}

/* Appends one batch to s and writes its K/V; counts the answer.  Returns the
 * append's status. */
static int append_batch(ckv_session *s, uint8_t role, tenant_report *rep) {
  uint8_t roles[APPEND_TOKENS];
  memset(roles, role, sizeof roles);
  uint64_t first = 0;
  int r = ckv_session_append(s, APPEND_TOKENS, roles, NULL, NULL, NULL, &first);
  rep->answered++;
  if (r != CKV_OK) return r;
  rep->appends_ok++;
  uint16_t kv[2 * 64];
  for (size_t e = 0; e < 2 * 64; e++) kv[e] = (uint16_t)(0x3c00 + (first + e) % 512);
  for (uint64_t p = first; p < first + APPEND_TOKENS; p++)
    for (uint32_t l = 0; l < k_tgeom.n_layers; l++) {
      int w = ckv_session_write_kv(s, p, l, kv, kv);
      if (w != CKV_OK) return w;
    }
  return CKV_OK;
}

/* One refusal: a quota refusal is noted and the session replaced; anything
 * else ends the run.  Returns false to stop. */
static bool judge(ckv_client *c, ckv_session **s, const char *prefix, unsigned *seq, int r, tenant_report *rep) {
  if (r == CKV_OK) return true;
  if (r == CKV_ERR_QUOTA) {
    rep->quota_refusals++;
    if (!rep->quota_msg[0]) snprintf(rep->quota_msg, sizeof rep->quota_msg, "%s", ckv_client_last_error(c));
    ckv_session_drop(*s);
    *s = NULL;
    rep->reopened++;
    r = fresh_session(c, prefix, seq, s);
    if (r == CKV_OK) return true;
  }
  rep->other_code = r;
  snprintf(rep->other_msg, sizeof rep->other_msg, "%s", ckv_client_last_error(c));
  return false;
}

static void tenant_body(const void *ctx, void *report) {
  const tenant_ctx *t = ctx;
  tenant_report *rep = report;
  ckv_client_options co = {
      .socket = t->d->socket, .attach_socket = t->d->attach, .name = "quota-tenant", .timeout_ms = 20000};
  ckv_client *c = NULL;
  if ((rep->connect_code = ckv_client_connect(&co, &c)) != CKV_OK) {
    snprintf(rep->connect_msg, sizeof rep->connect_msg, "%s", ckv_client_connect_error());
    return;
  }
  snprintf(rep->tenant, sizeof rep->tenant, "%s", ckv_client_tenant(c));
  unsigned seq_sys = 0, seq_user = 0;
  ckv_session *sys = NULL, *user = NULL;
  int r = fresh_session(c, "sys", &seq_sys, &sys);
  if (r == CKV_OK) r = fresh_session(c, "user", &seq_user, &user);
  if (r != CKV_OK) {
    rep->other_code = r;
    snprintf(rep->other_msg, sizeof rep->other_msg, "open: %s", ckv_client_last_error(c));
    ckv_client_free(c);
    return;
  }
  while (ckv_test_now_ms() < t->start_ms) usleep(1000);
  uint64_t round = 0;
  float attn[4096];
  while (ckv_test_now_ms() < t->end_ms) {
    if (!judge(c, &sys, "sys", &seq_sys, append_batch(sys, CKV_ROLE_SYSTEM, rep), rep)) break;
    unsigned was = seq_user;
    if (!judge(c, &user, "user", &seq_user, append_batch(user, CKV_ROLE_USER, rep), rep)) break;
    if (seq_user != was) round = 0; /* a fresh session counts its rounds from 1 */
    if (rep->appends_ok % 4 == 0 && ckv_session_tokens(user) > 0) {
      /* A round on the user session: old tokens get no attention, so the
       * lifecycle moves and recycles them; its epoch is acknowledged. */
      uint64_t n = ckv_session_tokens(user);
      size_t m = n < 4096 ? (size_t)n : 4096;
      for (size_t i = 0; i < m; i++) attn[i] = i + 32 >= m ? 1.0f / 32 : 0.0f;
      ckv_round_result rr;
      r = ckv_session_report(user, ++round, n - m, attn, m, &rr);
      rep->answered++;
      if (r == CKV_OK) {
        rep->rounds++;
        r = ckv_session_ack(user, rr.epoch, NULL);
        rep->answered++;
      }
      if (r != CKV_OK) {
        rep->other_code = r;
        snprintf(rep->other_msg, sizeof rep->other_msg, "round %llu: %s", (unsigned long long)round,
                 ckv_client_last_error(c));
        break;
      }
    }
  }
  /* The sessions stay for the daemon's accounting at the end: closing the
   * client detaches them (kept for detach_keep, then freed). */
  if (sys) ckv_session_close(sys);
  if (user) ckv_session_close(user);
  ckv_client_free(c);
}

/* One Stats answer: per tenant, the bytes its arena holds, its quota and
 * the bytes its sessions hold. */
typedef struct figures {
  unsigned long long used[N_TENANTS], quota[N_TENANTS], sessions_total[N_TENANTS];
  bool seen[N_TENANTS];
} figures;

static int tenant_index(const char *name) {
  for (int i = 0; i < N_TENANTS; i++) {
    char want[16];
    snprintf(want, sizeof want, "q%d", i);
    if (strcmp(name, want) == 0) return i;
  }
  return -1;
}

static figures poll_stats(raw *r) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest st = COMMITKV__V1__STATS_REQUEST__INIT;
  q.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  q.stats = &st;
  Commitkv__V1__Response *rep = NULL;
  expect_code(raw_call(r, &q, &rep), CKV_OK);
  cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_STATS);
  figures f = {0};
  for (size_t i = 0; i < rep->stats->n_arenas; i++) {
    int k = tenant_index(rep->stats->arenas[i]->tenant);
    if (k < 0) continue;
    f.used[k] = rep->stats->arenas[i]->bytes_used;
    f.seen[k] = true;
  }
  for (size_t i = 0; i < rep->stats->n_tenants; i++) {
    int k = tenant_index(rep->stats->tenants[i]->name);
    if (k < 0) continue;
    f.quota[k] = rep->stats->tenants[i]->quota_bytes;
    f.sessions_total[k] = rep->stats->tenants[i]->bytes ? rep->stats->tenants[i]->bytes->total : 0;
  }
  commitkv__v1__response__free_unpacked(rep, NULL);
  return f;
}

Test(quota_tenants, concurrent_appends_never_exceed_quota_and_nobody_starves, .timeout = 180) {
  char text[1024], cfg[400];
  size_t n = (size_t)snprintf(text, sizeof text, "[daemon]\ndetach_keep = 1s\n");
  for (int i = 0; i < N_TENANTS; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, "[tenant.q%d]\nuids = %u\nquota = %uK\n", i, k_uids[i],
                          k_quota_kib[i]);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof cfg);
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", (const char *const[]){"--config", cfg, NULL});
  cr_assert_eq(chmod(d.dir, 0755), 0); /* the tenants' uids must reach the sockets */
  tenant_ctx tc = {.d = &d, .start_ms = ckv_test_now_ms() + 1500};
  tc.end_ms = tc.start_ms + RUN_MS;
  pid_t pid[N_TENANTS];
  int fd[N_TENANTS];
  for (int i = 0; i < N_TENANTS; i++)
    pid[i] = ckv_test_begin_as(k_uids[i], k_uids[i], tenant_body, &tc, sizeof(tenant_report), &fd[i]);
  /* The poller's ZeroMQ context only after the forks: a child forked while
   * its I/O thread held the allocator's lock (ASan's) waited on it forever
   * (1 run in 3 under ASan hung in calloc). */
  raw poller;
  raw_connect(&poller, &d);

  /* Every answer of the run: no arena above its quota, ever. */
  unsigned long long polls = 0, peak[N_TENANTS] = {0}, quota[N_TENANTS] = {0};
  while (ckv_test_now_ms() < tc.end_ms + 200) {
    figures f = poll_stats(&poller);
    polls++;
    for (int i = 0; i < N_TENANTS; i++) {
      if (!f.seen[i]) continue; /* a tenant's arena exists from its first attach */
      quota[i] = f.quota[i];
      if (f.used[i] > peak[i]) peak[i] = f.used[i];
      cr_assert_leq(f.used[i], f.quota[i], "poll %llu: tenant q%d holds %llu bytes, over its quota of %llu", polls, i,
                    f.used[i], f.quota[i]);
      cr_assert_leq(f.sessions_total[i], f.quota[i], "poll %llu: tenant q%d's sessions hold %llu bytes, quota %llu",
                    polls, i, f.sessions_total[i], f.quota[i]);
    }
    usleep(2000);
  }

  tenant_report rep[N_TENANTS];
  for (int i = 0; i < N_TENANTS; i++) ckv_test_end_as(pid[i], fd[i], &rep[i], sizeof rep[i], CHILD_MS);
  unsigned long long most = 0, least = ~0ull;
  for (int i = 0; i < N_TENANTS; i++) {
    tenant_report *t = &rep[i];
    cr_assert_eq(t->connect_code, CKV_OK, "tenant uid %u could not connect: %s (%s)", k_uids[i],
                 ckv_strerror(t->connect_code), t->connect_msg);
    char want[16];
    snprintf(want, sizeof want, "q%d", i);
    cr_assert_str_eq(t->tenant, want, "uid %u is tenant '%s'", k_uids[i], t->tenant);
    cr_assert_eq(t->other_code, 0, "tenant %s got %s, not a quota refusal: %s", want, ckv_status_name(t->other_code),
                 t->other_msg);
    cr_assert_gt(t->quota_refusals, 0, "tenant %s was never refused: the run did not reach its quota", want);
    cr_assert(strstr(t->quota_msg, "quota") && strstr(t->quota_msg, want),
              "tenant %s's quota refusal does not say whose quota: '%s'", want, t->quota_msg);
    char quota_text[64];
    snprintf(quota_text, sizeof quota_text, "quota of %u bytes", k_quota_kib[i] * 1024);
    cr_assert(strstr(t->quota_msg, quota_text), "tenant %s's refusal does not name its quota (%s): '%s'", want,
              quota_text, t->quota_msg);
    cr_assert_eq(quota[i], k_quota_kib[i] * 1024ull, "tenant %s's quota is %llu bytes", want, quota[i]);
    fprintf(stderr,
            "test_quota_tenants: tenant %s (uid %u, quota %u KiB): %llu "
            "requests answered, %llu appends, %llu "
            "refused (quota), %llu rounds, %llu sessions replaced, peak %llu "
            "bytes (%.0f%% of its quota)\n",
            want, k_uids[i], k_quota_kib[i], t->answered, t->appends_ok, t->quota_refusals, t->rounds, t->reopened,
            peak[i], 100.0 * (double)peak[i] / (double)quota[i]);
    if (t->answered > most) most = t->answered;
    if (t->answered < least) least = t->answered;
  }
  fprintf(stderr,
          "test_quota_tenants: %llu stats polls; least served tenant got %.2f "
          "of the busiest one's requests\n",
          polls, (double)least / (double)most);
  cr_assert_geq(least * STARVE_FACTOR, most,
                "a tenant starved: %llu requests answered against the busiest "
                "tenant's %llu (bound 1/%d)",
                least, most, STARVE_FACTOR);

  /* The daemon's own accounting: once the clients left, the bytes in use in
   * each arena are the bytes its (detached) sessions hold, and all of them
   * come back when the sessions expire. */
  figures f = poll_stats(&poller);
  for (int i = 0; i < N_TENANTS; i++)
    cr_assert_eq(f.used[i], f.sessions_total[i], "tenant q%d: the arena has %llu bytes in use, its sessions %llu", i,
                 f.used[i], f.sessions_total[i]);
  long long end = ckv_test_now_ms() + 20000;
  bool empty = false;
  while (!empty && ckv_test_now_ms() < end) {
    f = poll_stats(&poller);
    empty = true;
    for (int i = 0; i < N_TENANTS; i++) empty = empty && f.used[i] == 0;
    if (!empty) usleep(50000);
  }
  for (int i = 0; i < N_TENANTS; i++)
    cr_assert_eq(f.used[i], 0, "tenant q%d still holds %llu bytes after its sessions expired", i, f.used[i]);
  raw_done(&poller);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}
