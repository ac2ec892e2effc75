/* tests/unit/test_metrics.c - daemon/metrics.c: the exposition text of a
 * known snapshot line by line (HELP/TYPE, labels and their escaping,
 * cumulative histogram buckets, errors by code), the error-code slots, the
 * thread-safe histograms, and the HTTP endpoint scraped over a raw TCP
 * socket: 200 with the published text, 404, 405, a second publish, the
 * disabled endpoint and a bad address. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "daemon/metrics.h"
#include "httpget.h"
#include "testutil.h"

/* True when `line` is one whole line of text. */
static bool has_line(const char *text, const char *line) {
  size_t n = strlen(line);
  for (const char *p = text; (p = strstr(p, line)); p++)
    if ((p == text || p[-1] == '\n') && p[n] == '\n') return true;
  return false;
}

#define assert_line(text, line) cr_assert(has_line(text, line), "missing line: %s\n--- text ---\n%s", line, text)

static ckv_metrics_tenant make_tenant(const char *name) {
  ckv_metrics_tenant t = {.name = name};
  t.sessions = 3;
  t.detached_sessions = 1;
  t.clients = 2;
  t.tokens[CKV_METRICS_DRAFT] = 100;
  t.tokens[CKV_METRICS_STAGED] = 200;
  t.tokens[CKV_METRICS_COMMITTED] = 300;
  t.tokens[CKV_METRICS_RECYCLED] = 40;
  t.bytes[CKV_METRICS_TIER_PRIMARY][CKV_METRICS_DRAFT] = 1000;
  t.bytes[CKV_METRICS_TIER_PRIMARY][CKV_METRICS_STAGED] = 2000;
  t.bytes[CKV_METRICS_TIER_PRIMARY][CKV_METRICS_COMMITTED] = 3000;
  t.tier_bytes[CKV_METRICS_TIER_PRIMARY] = 6500;
  t.fp16_equivalent_bytes = 24000;
  t.arena_size_bytes[0] = 1u << 20;
  t.arena_used_bytes[0] = 8192;
  t.quota_bytes = 1u << 30;
  t.transitions_total[CKV_METRICS_TR_DRAFT_STAGED] = 7;
  t.transitions_total[CKV_METRICS_TR_STAGED_COMMITTED] = 5;
  t.transitions_total[CKV_METRICS_TR_ANY_RECYCLED] = 40;
  t.recycles_total = 4;
  t.hits_total[0] = 11;
  t.hit_tokens_total[0] = 1100;
  t.miss_tokens_total[0] = 70;
  t.hit_tokens_total[1] = 70;
  t.compress_pending_tokens = 9;
  t.errors_total[ckv_metrics_error_index(CKV_ERR_QUOTA)] = 2;
  t.errors_total[ckv_metrics_error_index(-ENOMEM)] = 1;
  return t;
}

Test(metrics, format_known_snapshot) {
  static const uint8_t token[4] = {0xde, 0xad, 0x00, 0x7f};
  ckv_metrics_tenant t[2] = {make_tenant("alice"), make_tenant("bob")};
  t[1].sessions = 0;
  ckv_metrics_histogram_add(&t[0].round_latency, CKV_METRICS_HIST_ROUND, 0.0001);  /* == a bound: le="0.0001" */
  ckv_metrics_histogram_add(&t[0].round_latency, CKV_METRICS_HIST_ROUND, 0.003);   /* le="0.005" */
  ckv_metrics_histogram_add(&t[0].round_latency, CKV_METRICS_HIST_ROUND, 2.0);     /* +Inf only */
  ckv_metrics_histogram_add(&t[0].compress_latency, CKV_METRICS_HIST_COMPRESS, 0.5);
  ckv_metrics_snapshot s = {
      .version = "0.1.0",
      .backend = "host",
      .boot_token = token,
      .boot_token_len = sizeof(token),
      .uptime_seconds = 12.5,
      .clients = 4,
      .sessions = 3,
      .requests_total = 1000,
      .errors_total = 3,
      .rounds_total = 50,
      .sessions_detached_total = 9,
      .sessions_resumed_total = 2,
      .sessions_expired_total = 7,
      .compress_queue_depth = 6,
      .tenants = t,
      .n_tenants = 2,
  };
  char *text;
  size_t len;
  cr_assert_eq(ckv_metrics_format(&s, &text, &len), CKV_OK);
  cr_assert_eq(strlen(text), len);
  assert_line(text, "# HELP commitkv_build_info Always 1; labels: daemon version, backend, per-boot token "
                    "(workers drop mappings when it changes).");
  assert_line(text, "# TYPE commitkv_build_info gauge");
  assert_line(text, "commitkv_build_info{version=\"0.1.0\",backend=\"host\",boot_token=\"dead007f\"} 1");
  assert_line(text, "commitkv_uptime_seconds 12.5");
  assert_line(text, "# TYPE commitkv_requests_total counter");
  assert_line(text, "commitkv_requests_total 1000");
  assert_line(text, "commitkv_request_errors_total 3");
  assert_line(text, "commitkv_connected_clients 4");
  assert_line(text, "commitkv_compress_queue_depth 6");
  assert_line(text, "# TYPE commitkv_sessions_detached_total counter");
  assert_line(text, "commitkv_sessions_detached_total 9");
  assert_line(text, "commitkv_sessions_resumed_total 2");
  assert_line(text, "commitkv_sessions_expired_total 7");
  assert_line(text, "commitkv_sessions{tenant=\"alice\"} 3");
  assert_line(text, "commitkv_sessions{tenant=\"bob\"} 0");
  assert_line(text, "commitkv_detached_sessions{tenant=\"alice\"} 1");
  assert_line(text, "commitkv_clients{tenant=\"alice\"} 2");
  assert_line(text, "# TYPE commitkv_tokens gauge");
  assert_line(text, "commitkv_tokens{tenant=\"alice\",state=\"draft\"} 100");
  assert_line(text, "commitkv_tokens{tenant=\"alice\",state=\"staged\"} 200");
  assert_line(text, "commitkv_tokens{tenant=\"alice\",state=\"committed\"} 300");
  assert_line(text, "commitkv_tokens{tenant=\"alice\",state=\"recycled\"} 40");
  assert_line(text, "commitkv_kv_bytes{tenant=\"alice\",tier=\"primary\",state=\"draft\"} 1000");
  assert_line(text, "commitkv_kv_bytes{tenant=\"alice\",tier=\"primary\",state=\"staged\"} 2000");
  assert_line(text, "commitkv_kv_bytes{tenant=\"alice\",tier=\"primary\",state=\"committed\"} 3000");
  cr_assert_null(strstr(text, "commitkv_kv_bytes{tenant=\"alice\",tier=\"primary\",state=\"recycled\"}"));
  assert_line(text, "commitkv_tier_bytes{tenant=\"alice\",tier=\"primary\"} 6500");
  assert_line(text, "commitkv_fp16_equivalent_bytes{tenant=\"alice\"} 24000");
  assert_line(text, "commitkv_arena_size_bytes{tenant=\"alice\",tier=\"primary\"} 1048576");
  assert_line(text, "commitkv_arena_used_bytes{tenant=\"alice\",tier=\"primary\"} 8192");
  assert_line(text, "commitkv_quota_bytes{tenant=\"alice\"} 1073741824");
  assert_line(text, "# TYPE commitkv_transitions_total counter");
  assert_line(text, "commitkv_transitions_total{tenant=\"alice\",kind=\"draft_staged\"} 7");
  assert_line(text, "commitkv_transitions_total{tenant=\"alice\",kind=\"staged_committed\"} 5");
  assert_line(text, "commitkv_transitions_total{tenant=\"alice\",kind=\"any_recycled\"} 40");
  assert_line(text, "commitkv_recycles_total{tenant=\"alice\"} 4");
  assert_line(text, "commitkv_tier_hits_total{tenant=\"alice\",tier=\"primary\"} 11");
  assert_line(text, "commitkv_tier_misses_total{tenant=\"alice\",tier=\"primary\"} 0");
  assert_line(text, "# TYPE commitkv_tier_hit_tokens_total counter");
  assert_line(text, "commitkv_tier_hit_tokens_total{tenant=\"alice\",tier=\"primary\"} 1100");
  assert_line(text, "commitkv_tier_hit_tokens_total{tenant=\"alice\",tier=\"disk\"} 70");
  assert_line(text, "commitkv_tier_miss_tokens_total{tenant=\"alice\",tier=\"primary\"} 70");
  assert_line(text, "commitkv_compress_pending_tokens{tenant=\"alice\"} 9");
  assert_line(text, "commitkv_errors_total{tenant=\"alice\",code=\"CKV_ERR_QUOTA\"} 2");
  assert_line(text, "commitkv_errors_total{tenant=\"alice\",code=\"errno\"} 1");
  assert_line(text, "commitkv_errors_total{tenant=\"alice\",code=\"CKV_ERR_NOT_FOUND\"} 0");
  cr_assert_null(strstr(text, "code=\"CKV_OK\""));
  /* Histogram: cumulative buckets, +Inf == count, sum. */
  assert_line(text, "# TYPE commitkv_report_round_duration_seconds histogram");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"alice\",le=\"2.5e-05\"} 0");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"alice\",le=\"0.0001\"} 1");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"alice\",le=\"0.0025\"} 1");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"alice\",le=\"0.005\"} 2");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"alice\",le=\"1\"} 2");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"alice\",le=\"+Inf\"} 3");
  assert_line(text, "commitkv_report_round_duration_seconds_sum{tenant=\"alice\"} 2.0031");
  assert_line(text, "commitkv_report_round_duration_seconds_count{tenant=\"alice\"} 3");
  assert_line(text, "commitkv_report_round_duration_seconds_count{tenant=\"bob\"} 0");
  assert_line(text, "commitkv_compress_job_duration_seconds_bucket{tenant=\"alice\",le=\"0.25\"} 0");
  assert_line(text, "commitkv_compress_job_duration_seconds_bucket{tenant=\"alice\",le=\"0.5\"} 1");
  assert_line(text, "commitkv_compress_job_duration_seconds_count{tenant=\"alice\"} 1");
  /* No untenanted series when nothing was observed without a tenant. */
  cr_assert_null(strstr(text, "tenant=\"\""));
  /* Every family has exactly one TYPE line, and each sample's family was
   * announced before it (Prometheus rejects interleaved families). */
  char *copy = strdup(text), *save = NULL, last_family[128] = "";
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "# TYPE ", 7) == 0) {
      sscanf(line + 7, "%127s", last_family);
      continue;
    }
    if (line[0] == '#') continue;
    cr_assert(strncmp(line, last_family, strlen(last_family)) == 0, "sample outside its family: %s (family %s)", line,
              last_family);
  }
  free(copy);
  free(text);
}

Test(metrics, label_escaping_and_untenanted) {
  ckv_metrics_tenant t = {.name = "we\"ird\\na\nme"};
  ckv_metrics_snapshot s = {.version = "1\"2", .tenants = &t, .n_tenants = 1};
  ckv_metrics_histogram_add(&s.round_latency_untenanted, CKV_METRICS_HIST_ROUND, 0.001);
  char *text;
  size_t len;
  cr_assert_eq(ckv_metrics_format(&s, &text, &len), CKV_OK);
  assert_line(text, "commitkv_sessions{tenant=\"we\\\"ird\\\\na\\nme\"} 0");
  assert_line(text, "commitkv_build_info{version=\"1\\\"2\",backend=\"\",boot_token=\"\"} 1");
  assert_line(text, "commitkv_report_round_duration_seconds_count{tenant=\"\"} 1");
  assert_line(text, "commitkv_report_round_duration_seconds_bucket{tenant=\"\",le=\"0.001\"} 1");
  cr_assert_null(strstr(text, "commitkv_compress_job_duration_seconds_count{tenant=\"\"}"));
  free(text);
}

Test(metrics, error_slots) {
  cr_assert_eq(CKV_METRICS_ERRORS, 22);
  cr_assert_str_eq(ckv_metrics_error_name(0), "errno");
  cr_assert_eq(ckv_metrics_error_index(-ENOENT), 0);
  cr_assert_eq(ckv_metrics_error_index(CKV_OK), 0);
  cr_assert_eq(ckv_metrics_error_index(-1500), 0);
  int qi = ckv_metrics_error_index(CKV_ERR_QUOTA);
  cr_assert_gt(qi, 0);
  cr_assert_str_eq(ckv_metrics_error_name(qi), "CKV_ERR_QUOTA");
  cr_assert_str_eq(ckv_metrics_error_name(ckv_metrics_error_index(CKV_ERR_INTERNAL)), "CKV_ERR_INTERNAL");
  cr_assert_null(ckv_metrics_error_name(CKV_METRICS_ERRORS));
  cr_assert_null(ckv_metrics_error_name(-1));
  /* Every code of ours has its own slot, named after it. */
  for (int code = -1001; code >= -1999; code--) {
    if (code == -1021) code = CKV_ERR_INTERNAL;
    int i = ckv_metrics_error_index(code);
    cr_assert_gt(i, 0, "code %d", code);
    cr_assert_str_eq(ckv_metrics_error_name(i), ckv_status_name(code));
  }
}

typedef struct observer_arg {
  ckv_metrics *m;
  const char *tenant;
} observer_arg;

static void *observer(void *p) {
  observer_arg *a = p;
  for (int i = 0; i < 10000; i++) {
    ckv_metrics_observe_round_tenant(a->m, a->tenant, 1e-6 * (i % 2000));
    if (i % 10 == 0) ckv_metrics_observe_compress(a->m, 0.01);
  }
  return NULL;
}

Test(metrics, histograms_thread_safe) {
  ckv_metrics *m;
  cr_assert_eq(ckv_metrics_new("", &m, NULL, 0), CKV_OK);
  cr_assert_not(ckv_metrics_enabled(m));
  cr_assert_eq(ckv_metrics_port(m), 0);
  cr_assert_eq(ckv_metrics_publish(m, "x 1\n", 4), CKV_OK);
  pthread_t th[4];
  observer_arg args[4] = {{m, "alice"}, {m, "bob"}, {m, "alice"}, {m, "carol"}};
  for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, observer, &args[i]), 0);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  ckv_metrics_tenant t[3] = {{.name = "alice"}, {.name = "bob"}, {.name = "dave"}};
  ckv_metrics_snapshot s = {.tenants = t, .n_tenants = 3};
  ckv_metrics_fill_histograms(m, &s);
  cr_assert_eq(t[0].round_latency.count, 20000);
  cr_assert_eq(t[1].round_latency.count, 10000);
  cr_assert_eq(t[2].round_latency.count, 0);
  uint64_t sum = 0;
  for (int i = 0; i < CKV_METRICS_HIST_MAX_BUCKETS; i++) sum += t[0].round_latency.buckets[i];
  cr_assert_eq(sum, 20000);
  cr_assert_eq(s.compress_latency_untenanted.count, 4000);
  cr_assert_eq(s.round_latency_untenanted.count, 0);
  m = ckv_metrics_free(m);
  cr_assert_null(m);
  cr_assert_null(ckv_metrics_free(NULL));
}

Test(metrics, endpoint_serves_published_text) {
  ckv_metrics *m;
  char err[256] = "";
  int r = ckv_metrics_new("127.0.0.1:0", &m, err, sizeof(err));
  cr_assert_eq(r, CKV_OK, "%s", err);
  cr_assert(ckv_metrics_enabled(m));
  unsigned port = ckv_metrics_port(m);
  cr_assert_gt(port, 0);

  /* Before any publish: never an empty 200 (a scraper would record a target
   * with no series), but 503 with a reason and Retry-After. */
  char *a = ckv_test_http(port, "GET", "/metrics", 5000);
  cr_assert_not_null(a);
  cr_assert(strncmp(a, "HTTP/1.", 7) == 0 && strstr(a, " 503 "), "%s", a);
  cr_assert(strstr(a, "Retry-After: 1\r\n"), "%s", a);
  cr_assert_not_null(strstr(ckv_test_http_body(a), "starting"), "%s", a);
  free(a);
  /* An empty publish is no figures either. */
  cr_assert_eq(ckv_metrics_publish(m, "", 0), CKV_OK);
  a = ckv_test_http(port, "GET", "/metrics", 5000);
  cr_assert(a && strstr(a, " 503 "), "%s", a ? a : "(no answer)");
  free(a);

  ckv_metrics_tenant t = make_tenant("alice");
  ckv_metrics_snapshot s = {.version = "0.1.0", .backend = "host", .tenants = &t, .n_tenants = 1};
  char *text;
  size_t len;
  cr_assert_eq(ckv_metrics_format(&s, &text, &len), CKV_OK);
  cr_assert_eq(ckv_metrics_publish(m, text, len), CKV_OK);
  a = ckv_test_http(port, "GET", "/metrics", 5000);
  cr_assert_not_null(a);
  cr_assert(strstr(a, " 200 "), "%s", a);
  cr_assert(strstr(a, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "%s", a);
  cr_assert_str_eq(ckv_test_http_body(a), text);
  free(a);
  free(text);

  /* A second publish replaces the text (the buffers swap). */
  for (int i = 0; i < 3; i++) {
    char line[64];
    int n = snprintf(line, sizeof(line), "commitkv_test_gauge %d\n", i);
    cr_assert_eq(ckv_metrics_publish(m, line, (size_t)n), CKV_OK);
    a = ckv_test_http(port, "GET", "/metrics", 5000);
    cr_assert_not_null(a);
    cr_assert_str_eq(ckv_test_http_body(a), line);
    free(a);
  }
  a = ckv_test_http(port, "HEAD", "/metrics", 5000);
  cr_assert_not_null(a);
  cr_assert(strstr(a, " 200 "), "%s", a);
  free(a);
  a = ckv_test_http(port, "GET", "/nope", 5000);
  cr_assert_not_null(a);
  cr_assert(strstr(a, " 404 "), "%s", a);
  free(a);
  a = ckv_test_http(port, "POST", "/metrics", 5000);
  cr_assert_not_null(a);
  cr_assert(strstr(a, " 405 "), "%s", a);
  free(a);
  ckv_metrics_free(m);
  /* The listening socket is closed with the endpoint. */
  cr_assert_null(ckv_test_http(port, "GET", "/metrics", 1000));
}

Test(metrics, bad_addresses) {
  ckv_metrics *m = NULL;
  char err[256];
  cr_assert_eq(ckv_metrics_new("127.0.0.1", &m, err, sizeof(err)), CKV_ERR_INVALID);
  cr_assert(strstr(err, "HOST:PORT"), "%s", err);
  cr_assert_eq(ckv_metrics_new("127.0.0.1:99999", &m, err, sizeof(err)), CKV_ERR_INVALID);
  cr_assert_eq(ckv_metrics_new(":9464", &m, err, sizeof(err)), CKV_ERR_INVALID);
  cr_assert_eq(ckv_metrics_new("no.such.host.invalid:9464", &m, err, sizeof(err)), CKV_ERR_INVALID);
  cr_assert_null(m);
  /* A port in use: the error names the address. */
  ckv_metrics *a;
  cr_assert_eq(ckv_metrics_new("127.0.0.1:0", &a, err, sizeof(err)), CKV_OK);
  char spec[64];
  snprintf(spec, sizeof(spec), "127.0.0.1:%u", ckv_metrics_port(a));
  cr_assert_eq(ckv_metrics_new(spec, &m, err, sizeof(err)), -EADDRINUSE);
  cr_assert(strstr(err, spec), "%s", err);
  ckv_metrics_free(a);
  /* IPv6 loopback in brackets. */
  if (ckv_metrics_new("[::1]:0", &m, err, sizeof(err)) == CKV_OK) {
    cr_assert_gt(ckv_metrics_port(m), 0);
    ckv_metrics_free(m);
  } else {
    cr_log_warn("no IPv6 loopback here: %s", err);
  }
}

/* Runs commitkvctl with argv, its output into a new file `out`; checks its exit
 * status and returns everything it printed (malloc'd). */
static char *run_ctl(const char *const *argv, const char *out, int want_status) {
  unlink(out); /* the spawn appends */
  int st = ckv_test_wait(ckv_test_spawn(argv, out), 10000);
  char *text = ckv_test_read_file(out);
  cr_assert_not_null(text, "commitkvctl wrote no %s", out);
  cr_assert_eq(st, want_status, "commitkvctl exited %d:\n%s", st, text);
  return text;
}

/* commitkvctl metrics: the same figures for a person, fetched over HTTP. */
Test(metrics, commitkvctl_metrics_prints_per_tenant, .timeout = 30) {
  ckv_metrics *m;
  char err[256] = "";
  cr_assert_eq(ckv_metrics_new("127.0.0.1:0", &m, err, sizeof(err)), CKV_OK, "%s", err);
  static const uint8_t token[2] = {0xab, 0xcd};
  ckv_metrics_tenant t[2] = {make_tenant("alice"), make_tenant("bob")};
  t[1].tokens[CKV_METRICS_DRAFT] = 77;
  t[1].errors_total[ckv_metrics_error_index(CKV_ERR_QUOTA)] = 0;
  t[1].errors_total[0] = 0;
  ckv_metrics_histogram_add(&t[0].round_latency, CKV_METRICS_HIST_ROUND, 0.0004);
  ckv_metrics_histogram_add(&t[0].round_latency, CKV_METRICS_HIST_ROUND, 0.0004);
  ckv_metrics_snapshot s = {.version = "0.1.0", .backend = "host", .boot_token = token, .boot_token_len = 2,
                            .clients = 4, .sessions = 3, .requests_total = 1000, .tenants = t, .n_tenants = 2};
  char *text;
  size_t len;
  cr_assert_eq(ckv_metrics_format(&s, &text, &len), CKV_OK);
  cr_assert_eq(ckv_metrics_publish(m, text, len), CKV_OK);
  free(text);

  char *dir = ckv_test_tmpdir("ckv-ctlmetrics");
  char out[400], addr[64];
  snprintf(out, sizeof(out), "%s/out", dir);
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", ckv_metrics_port(m));
  const char *argv[] = {"commitkvctl", "--metrics", addr, "metrics", NULL};
  char *buf = run_ctl(argv, out, 0);
  cr_expect(strstr(buf, "commitkvd 0.1.0, backend host, boot token abcd"), "%s", buf);
  cr_expect(strstr(buf, "clients 4, sessions 3; requests 1000"), "%s", buf);
  cr_expect(strstr(buf, "\ntenant alice: 3 sessions (1 detached), 2 clients, quota 1073741824 bytes\n"), "%s", buf);
  cr_expect(strstr(buf, "\ntenant bob: "), "%s", buf);
  char row[128];
  snprintf(row, sizeof(row), "\n  %-10s %14s %20s %20s %20s\n", "draft", "77", "1000", "0", "0"); /* primary, disk, remote */
  cr_expect(strstr(buf, row), "no row '%s' in:\n%s", row, buf);
  snprintf(row, sizeof(row), "\n  %-10s %14s %20s %20s %20s\n", "committed", "300", "3000", "0", "0");
  cr_expect(strstr(buf, row), "no row '%s' in:\n%s", row, buf);
  cr_expect(strstr(buf, "(FP16 equivalent 24000, ratio 0.271)"), "%s", buf);
  cr_expect(strstr(buf, "transitions: draft->staged 7, staged->committed 5, ->recycled 40; recycles 4"), "%s", buf);
  cr_expect(strstr(buf, "ReportRound: 2 rounds, mean 0.400 ms, p50 <= 0.5 ms, p99 <= 0.5 ms\n"), "%s", buf);
  cr_expect(strstr(buf, "errors: errno 1, CKV_ERR_QUOTA 2\n"), "%s", buf);
  cr_expect(strstr(buf, "compression: 0 jobs; 9 tokens pending\n"), "%s", buf);
  cr_expect(strstr(buf, "errors: none\n"), "%s", buf);

  /* --raw: the exposition text unchanged; --metrics after the command. */
  const char *argv2[] = {"commitkvctl", "metrics", "--raw", "--metrics", addr, NULL};
  free(buf);
  buf = run_ctl(argv2, out, 0);
  cr_expect(strstr(buf, "commitkv_tokens{tenant=\"bob\",state=\"draft\"} 77\n"), "%s", buf);
  ckv_metrics_free(m);

  /* Nothing listening: a clear error and exit 1. */
  const char *argv3[] = {"commitkvctl", "metrics", "--metrics", addr, NULL};
  free(buf);
  buf = run_ctl(argv3, out, 1);
  cr_expect(strstr(buf, "cannot connect to") && strstr(buf, addr), "%s", buf);
  free(buf);
  ckv_test_rmdir(dir);
}
