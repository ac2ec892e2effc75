/* test_metrics_scrape.c - commitkvd's Prometheus endpoint during a real
 * multi-worker run.
 *
 * commitkvd starts with `metrics` on a free loopback port; three
 * commitkv-worker processes run rounds while the test scrapes /metrics over a
 * raw TCP socket (every scrape is a 200 with build info, and counters never
 * go down).  Once the workers are done (their sessions kept for resume), the
 * per-tenant figures of the scrape must equal `commitkvctl stats --json`:
 * sessions, tokens per state, bytes per state, total and FP16-equivalent
 * bytes, arena size and use, rounds, and one ReportRound observation per
 * round.  The endpoint publishes once per loop tick, so the comparison polls
 * for a few seconds until both agree.  A second test scrapes from before the
 * daemon starts, as fast as it can: the first answers are 503 with a reason or
 * 200 with series, never an empty 200. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "httpget.h"
#include "testutil.h"


static unsigned free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
            getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
  close(fd);
  return ntohs(sa.sin_port);
}

/* The value of the sample whose name and labels are exactly `series`. */
static bool metric(const char *text, const char *series, double *ret) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, series, n) == 0 && p[n] == ' ') {
      *ret = strtod(p + n + 1, NULL);
      return true;
    }
  }
  return false;
}

static char *scrape(unsigned port) {
  char *a = ckv_test_http(port, "GET", "/metrics", 5000);
  if (!a) return NULL;
  if (!strstr(a, " 200 ")) {
    free(a);
    return NULL;
  }
  const char *body = ckv_test_http_body(a);
  char *copy = body ? strdup(body) : NULL;
  free(a);
  return copy;
}

static pid_t spawn_worker(const ckv_test_daemon *d, const char *prefix) {
  char out[400];
  snprintf(out, sizeof(out), "%s/%s.out", d->dir, prefix);
  const char *argv[] = {"commitkv-worker", "--socket", d->socket, "--attach-socket", d->attach, "--prefix", prefix,
                        "--sessions", "2", "--rounds", "40", "--tokens", "24", "--keep", "--quiet", NULL};
  return ckv_test_spawn(argv, out);
}

/* One comparison: metric series vs a stats JSON path. */
typedef struct pair {
  const char *series, *json;
} pair;

static const pair k_pairs[] = {
    {"commitkv_open_sessions", "sessions"},
    {"commitkv_rounds_total", "rounds"},
    {"commitkv_sessions{tenant=\"default\"}", "tenants.0.sessions"},
    {"commitkv_tokens{tenant=\"default\",state=\"draft\"}", "tenants.0.tokens.draft"},
    {"commitkv_tokens{tenant=\"default\",state=\"staged\"}", "tenants.0.tokens.staged"},
    {"commitkv_tokens{tenant=\"default\",state=\"committed\"}", "tenants.0.tokens.committed"},
    {"commitkv_tokens{tenant=\"default\",state=\"recycled\"}", "tenants.0.tokens.recycled"},
    {"commitkv_kv_bytes{tenant=\"default\",tier=\"primary\",state=\"draft\"}", "tenants.0.bytes.draft"},
    {"commitkv_kv_bytes{tenant=\"default\",tier=\"primary\",state=\"staged\"}", "tenants.0.bytes.staged"},
    {"commitkv_kv_bytes{tenant=\"default\",tier=\"primary\",state=\"committed\"}", "tenants.0.bytes.committed"},
    {"commitkv_tier_bytes{tenant=\"default\",tier=\"primary\"}", "tenants.0.bytes.total"},
    {"commitkv_fp16_equivalent_bytes{tenant=\"default\"}", "tenants.0.bytes.fp16_equivalent"},
    {"commitkv_arena_size_bytes{tenant=\"default\",tier=\"primary\"}", "arenas.0.bytes_total"},
    {"commitkv_arena_used_bytes{tenant=\"default\",tier=\"primary\"}", "arenas.0.bytes_used"},
    {"commitkv_report_round_duration_seconds_count{tenant=\"default\"}", "rounds"},
};

/* Compares every pair once; on mismatch says which in why. */
static bool all_match(const char *text, const char *json, char *why, size_t whylen) {
  for (size_t i = 0; i < sizeof(k_pairs) / sizeof(k_pairs[0]); i++) {
    double m;
    unsigned long long s;
    if (!metric(text, k_pairs[i].series, &m)) {
      snprintf(why, whylen, "no series %s", k_pairs[i].series);
      return false;
    }
    if (ckv_test_json_u64(json, k_pairs[i].json, &s) != 0) {
      snprintf(why, whylen, "no stats field %s", k_pairs[i].json);
      return false;
    }
    if ((unsigned long long)m != s) {
      snprintf(why, whylen, "%s = %.0f but stats %s = %llu", k_pairs[i].series, m, k_pairs[i].json, s);
      return false;
    }
  }
  return true;
}

Test(metrics_scrape, figures_match_stats_during_multi_worker_run, .timeout = 120) {
  unsigned port = free_port();
  char set[64];
  snprintf(set, sizeof(set), "daemon.metrics=127.0.0.1:%u", port);
  const char *extra[] = {"--set", set, NULL};
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, extra), 0, "commitkvd did not start");

  char *text = NULL;
  for (int i = 0; i < 50 && !(text = scrape(port)); i++) usleep(100000);
  cr_assert_not_null(text, "no 200 from http://127.0.0.1:%u/metrics", port);
  cr_expect(strstr(text, "\ncommitkv_build_info{version=\"") || strncmp(text, "# HELP", 6) == 0, "%s", text);
  cr_expect(strstr(text, "boot_token=\"") != NULL, "no per-boot token in build info:\n%s", text);
  free(text);

  pid_t w[3];
  char name[3][16];
  for (int i = 0; i < 3; i++) {
    snprintf(name[i], sizeof(name[i]), "m%d", i);
    w[i] = spawn_worker(&d, name[i]);
  }
  /* Scrape while they run: counters only grow. */
  double last_requests = 0, last_rounds = 0;
  for (int i = 0; i < 10; i++) {
    text = scrape(port);
    cr_assert_not_null(text, "scrape %d failed during the run", i);
    double req = 0, rounds = 0;
    cr_expect(metric(text, "commitkv_requests_total", &req));
    cr_expect(metric(text, "commitkv_rounds_total", &rounds));
    cr_expect_geq(req, last_requests, "commitkv_requests_total went down");
    cr_expect_geq(rounds, last_rounds, "commitkv_rounds_total went down");
    last_requests = req;
    last_rounds = rounds;
    free(text);
    usleep(150000);
  }
  for (int i = 0; i < 3; i++) {
    int rc = ckv_test_wait(w[i], 90000);
    if (rc != 0) {
      char path[400], buf[2048] = "";
      snprintf(path, sizeof(path), "%s/%s.out", d.dir, name[i]);
      FILE *f = fopen(path, "r");
      if (f) {
        buf[fread(buf, 1, sizeof(buf) - 1, f)] = 0;
        fclose(f);
      }
      cr_expect_eq(rc, 0, "worker %d exited %d:\n%s", i, rc, buf);
    }
  }

  /* Quiescent now: the next published snapshot must agree with stats. */
  char why[512] = "";
  bool ok = false;
  const char *args[] = {"stats", "--json", NULL};
  for (long long end = ckv_test_now_ms() + 8000; !ok && ckv_test_now_ms() < end;) {
    char *json = ckv_test_ctl(&d, args);
    text = scrape(port);
    cr_assert(json && text);
    ok = all_match(text, json, why, sizeof(why));
    free(json);
    free(text);
    if (!ok) usleep(250000);
  }
  cr_expect(ok, "metrics never matched commitkvctl stats --json: %s", why);

  /* commitkvctl metrics prints the same tenant. */
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
  const char *margs[] = {"--metrics", addr, "metrics", NULL};
  char *human = ckv_test_ctl(&d, margs);
  cr_expect(human && strstr(human, "\ntenant default: 6 sessions"), "commitkvctl metrics:\n%s", human ? human : "");
  free(human);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

/* A scraper racing the daemon's start: connects in a loop from before the
 * spawn until it gets a 200, and tallies what it got. */
typedef struct race {
  unsigned port;
  atomic_bool stop;
  int answers, starting_503, empty_200, bad;
  long long first_answer_ms, first_200_ms;
  char first_bad[512];
} race;

static void *race_scrape(void *arg) {
  race *r = arg;
  while (!atomic_load(&r->stop)) {
    char *a = ckv_test_http(r->port, "GET", "/metrics", 2000);
    if (!a) continue; /* not listening yet: try again at once */
    if (!r->answers++) r->first_answer_ms = ckv_test_now_ms();
    const char *body = ckv_test_http_body(a);
    if (strstr(a, " 200 ") && (!body || !*body)) {
      r->empty_200++;
    } else if (strstr(a, " 503 ") && body && strstr(body, "starting")) {
      r->starting_503++;
    } else if (strstr(a, " 200 ") && strstr(body, "commitkv_build_info{")) {
      r->first_200_ms = ckv_test_now_ms();
      free(a);
      break;
    } else if (!r->bad++) {
      snprintf(r->first_bad, sizeof r->first_bad, "%s", a);
    }
    free(a);
  }
  return NULL;
}

Test(metrics_scrape, first_scrape_after_start_is_never_an_empty_200, .timeout = 60) {
  for (int attempt = 0; attempt < 5; attempt++) {
    race r = {.port = free_port()};
    char set[64];
    snprintf(set, sizeof(set), "daemon.metrics=127.0.0.1:%u", r.port);
    const char *extra[] = {"--set", set, NULL};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, race_scrape, &r), 0);
    ckv_test_daemon d;
    long long t0 = ckv_test_now_ms();
    int started = ckv_test_daemon_start(&d, extra);
    for (long long end = ckv_test_now_ms() + 10000; ckv_test_now_ms() < end && !r.first_200_ms;) usleep(1000);
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    cr_assert_eq(started, 0, "commitkvd did not start");
    fprintf(stderr, "metrics race %d: %d answers (%d x 503 starting, %d empty 200), first answer %lld ms after the "
            "spawn, first 200 %lld ms\n", attempt, r.answers, r.starting_503, r.empty_200, r.first_answer_ms - t0,
            r.first_200_ms - t0);
    cr_expect_eq(r.empty_200, 0, "%d scrapes got 200 with an empty body", r.empty_200);
    cr_expect_eq(r.bad, 0, "%d unexpected answers, the first:\n%s", r.bad, r.first_bad);
    cr_expect_gt(r.first_200_ms, 0, "no 200 with series within 10 s of the start");
    cr_expect_eq(ckv_test_daemon_stop(&d), 0);
  }
}
