/* test_hostile_local.c - limits that keep one local tenant from harming the
 * others, and a configuration that cannot hang the daemon (issue 11, items
 * 4, 5, 6 and 9), each against a real commitkvd:
 *  - a tenant holding its share of client slots cannot lock the others out;
 *    the daemon's max_clients stays the ceiling of all;
 *  - --memory is the budget of all tenants' arenas together;
 *  - SIGHUP gives live tenants their new quota and warns, key by key, about
 *    what needs a restart;
 *  - a config path that is a FIFO or a directory is refused at once, by
 *    --check-config and by a SIGHUP reload (the daemon keeps serving).
 * A second tenant's clients run in a forked child with the credentials of
 * `nobody`, dropped before any socket is opened, so SO_PEERCRED sees them. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "testcheck.h"
#include "testutil.h"

#define NOBODY_UID 65534u
#define MIB (1ull << 20)

TestSuite(hostile_local, .fini = ckv_test_leak_check);

/* ---- helpers ------------------------------------------------------------ */

static void start(ckv_test_daemon *d, const char *memory, const char *config) {
  ckv_test_start_host(d, memory,
                      (const char *const[]){"--config", config, "--set",
                                            "daemon.metrics=", NULL});
  /* mkdtemp made the directory 0700: the other uid must reach the sockets. */
  cr_assert_eq(chmod(d->dir, 0755), 0);
}

static ckv_client *connect_client(const ckv_test_daemon *d, int *ret_code,
                                  char *msg, size_t cap) {
  ckv_client *c = NULL;
  *ret_code = ckv_client_connect(
      &(ckv_client_options){.socket = d->socket, .attach_socket = d->attach},
      &c);
  snprintf(msg, cap, "%s",
           *ret_code == CKV_OK ? ckv_client_tenant(c)
                               : ckv_client_connect_error());
  return *ret_code == CKV_OK ? c : NULL;
}

/* What a child running as another uid reports back. */
typedef struct child_report {
  int code;
  char msg[200];
  int appends_ok;
} child_report;

#define CHILD_TIMEOUT_MS 60000

/* Polls the daemon's log for `needle` (up to timeout_ms); true when found. */
static bool log_has(const ckv_test_daemon *d, const char *needle,
                    int timeout_ms) {
  long long end = ckv_test_now_ms() + timeout_ms;
  do {
    char *text = ckv_test_read_file(d->log);
    bool found = text && strstr(text, needle);
    free(text);
    if (found)
      return true;
    usleep(100000);
  } while (ckv_test_now_ms() < end);
  return false;
}

/* ---- item 4: client slots per tenant ------------------------------------ */

/* In a child (ckv_test_run_as): attach, report the answer, detach. */
static void attach_once(const void *ctx, void *report) {
  const ckv_test_daemon *d = ctx;
  child_report *out = report;
  ckv_client *c = connect_client(d, &out->code, out->msg, sizeof(out->msg));
  ckv_client_free(c);
}

Test(hostile_local, one_tenant_cannot_take_every_client_slot, .timeout = 90) {
  char cfg[400], text[200];
  snprintf(text, sizeof(text),
           "[daemon]\nmax_clients = 4\n[tenant.a]\nuids = 0\n[tenant.b]\nuids "
           "= %u\n",
           NOBODY_UID);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof(cfg));
  ckv_test_daemon d;
  start(&d, "256M", cfg);
  /* Tenant a tries to hold every one of the daemon's 4 slots. */
  ckv_client *a[4] = {NULL};
  int code[4];
  char msg[4][200];
  for (int i = 0; i < 4; i++)
    a[i] = connect_client(&d, &code[i], msg[i], sizeof(msg[i]));
  child_report b;
  ckv_test_run_as(NOBODY_UID, NOBODY_UID, attach_once, &d, &b, sizeof(b),
                  CHILD_TIMEOUT_MS);
  cr_expect_eq(b.code, CKV_OK,
               "tenant b was locked out by tenant a's clients: %d (%s) %s",
               b.code, ckv_status_name(b.code), b.msg);
  cr_expect_str_eq(b.msg, "b");
  /* a got its share (4 slots / 2 tenants), and was told which limit it met. */
  cr_expect_eq(code[0], CKV_OK, "%s", msg[0]);
  cr_expect_eq(code[1], CKV_OK, "%s", msg[1]);
  for (int i = 2; i < 4; i++) {
    cr_expect_eq(code[i], CKV_ERR_LIMIT, "tenant a's client %d: %d %s", i,
                 code[i], msg[i]);
    cr_expect(strstr(msg[i], "tenant 'a'") && strstr(msg[i], "max_clients"),
              "refusal text: %s", msg[i]);
  }
  for (int i = 0; i < 4; i++)
    a[i] = ckv_client_free(a[i]);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

Test(hostile_local, daemon_max_clients_is_the_ceiling, .timeout = 90) {
  char cfg[400], text[300];
  snprintf(text, sizeof(text),
           "[daemon]\nmax_clients = 3\n[tenant.a]\nuids = 0\nmax_clients = 3\n"
           "[tenant.b]\nuids = %u\nmax_clients = 3\n",
           NOBODY_UID);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof(cfg));
  ckv_test_daemon d;
  start(&d, "256M", cfg);
  ckv_client *a[3] = {NULL};
  for (int i = 0; i < 3; i++) {
    int code;
    char msg[200];
    a[i] = connect_client(&d, &code, msg, sizeof(msg));
    cr_assert_eq(code, CKV_OK, "tenant a's client %d (its own limit is 3): %s",
                 i, msg);
  }
  child_report b;
  ckv_test_run_as(NOBODY_UID, NOBODY_UID, attach_once, &d, &b, sizeof(b),
                  CHILD_TIMEOUT_MS);
  cr_expect_eq(b.code, CKV_ERR_LIMIT, "%d %s", b.code, b.msg);
  cr_expect(strstr(b.msg, "daemon") && strstr(b.msg, "max_clients"),
            "refusal text: %s", b.msg);
  for (int i = 0; i < 3; i++)
    a[i] = ckv_client_free(a[i]);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* ---- item 5: --memory is a total ---------------------------------------- */

/* 8 KiB per token (4 layers x 4 heads x 128 x K,V x FP16): 40 appends of
 * 256 tokens ask for 80 MiB, more than the whole --memory of the test. */
static void fill_memory(const void *ctx, void *report) {
  const ckv_test_daemon *d = ctx;
  child_report *out = report;
  ckv_client *c = connect_client(d, &out->code, out->msg, sizeof(out->msg));
  if (!c)
    return;
  ckv_session *s = NULL;
  const ckv_geometry g = {
      .n_layers = 4, .n_kv_heads = 4, .head_dim = 128, .dtype = 0};
  out->code = ckv_session_open(c, "fill", &g,
                               &(ckv_session_options){.policy = "fp16"}, &s);
  if (out->code == CKV_OK) {
    for (int i = 0; i < 40; i++) {
      uint64_t first;
      int r = ckv_session_append(s, 256, NULL, NULL, NULL, NULL, &first);
      if (r != CKV_OK) {
        snprintf(out->msg, sizeof(out->msg), "append %d: %s", i,
                 ckv_client_last_error(c));
        break;
      }
      out->appends_ok++;
    }
    ckv_session_close(s);
  } else {
    snprintf(out->msg, sizeof(out->msg), "open: %s", ckv_client_last_error(c));
  }
  ckv_client_free(c);
}

Test(hostile_local, memory_is_the_budget_of_all_tenants, .timeout = 120) {
  char cfg[400], text[200];
  snprintf(text, sizeof(text), "[tenant.a]\nuids = 0\n[tenant.b]\nuids = %u\n",
           NOBODY_UID);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof(cfg));
  ckv_test_daemon d;
  start(&d, "64M", cfg);
  child_report b, a;
  ckv_test_run_as(NOBODY_UID, NOBODY_UID, fill_memory, &d, &b, sizeof(b),
                  CHILD_TIMEOUT_MS);
  cr_assert_eq(b.code, CKV_OK, "tenant b: %s", b.msg);
  memset(&a, 0, sizeof(a));
  fill_memory(&d, &a);
  cr_assert_eq(a.code, CKV_OK, "tenant a: %s", a.msg);
  cr_assert_eq(ckv_test_stat(&d, "arenas.1.arena_id"), 2,
               "two tenants, two arenas");
  unsigned long long total = ckv_test_stat(&d, "arenas.0.bytes_total") +
                             ckv_test_stat(&d, "arenas.1.bytes_total");
  unsigned long long used0 = ckv_test_stat(&d, "arenas.0.bytes_used"),
                     used1 = ckv_test_stat(&d, "arenas.1.bytes_used");
  cr_expect_leq(total, 64 * MIB,
                "the two arenas hold %llu bytes, more than --memory 64M",
                total);
  cr_expect_leq(used0 + used1, 64 * MIB,
                "the two tenants use %llu + %llu bytes, more than --memory 64M",
                used0, used1);
  /* Both got a fair part: neither was starved by the other. */
  cr_expect_geq(used0, 8 * MIB, "tenant b: %d appends, %s", b.appends_ok,
                b.msg);
  cr_expect_geq(used1, 8 * MIB, "tenant a: %d appends, %s", a.appends_ok,
                a.msg);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* ---- item 6: SIGHUP applies quotas to live tenants ---------------------- */

Test(hostile_local, sighup_applies_quota_and_warns_about_uids, .timeout = 90) {
  char cfg[400];
  char *cfgdir =
      ckv_test_write_config("[tenant.a]\nuids = 0\nquota = 4M\n", cfg, sizeof(cfg));
  ckv_test_daemon d;
  start(&d, "256M", cfg);
  /* commitkvctl runs as root: tenant a, created by its attach. */
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.quota_bytes"), 4 * MIB);
  FILE *f = fopen(cfg, "w");
  cr_assert_not_null(f);
  fputs("[tenant.a]\nuids = 0, 4242\nquota = 8M\n", f);
  fclose(f);
  cr_assert_eq(kill(d.pid, SIGHUP), 0);
  cr_assert(log_has(&d, "configuration reloaded", 5000), "no reload:\n%s",
            ckv_test_file_tail(d.log, 2000));
  unsigned long long q = ckv_test_stat(&d, "tenants.0.quota_bytes");
  cr_expect_eq(q, 8 * MIB, "after SIGHUP tenant a's quota is still %llu bytes",
               q);
  cr_expect(log_has(&d,
                    "tenant.a.uids changed, but it needs a restart; keeping "
                    "the old value",
                    2000),
            "no warning about tenant.a.uids:\n%s",
            ckv_test_file_tail(d.log, 2000));
  /* The command line's keys are applied over the file again: no warning. */
  char *log = ckv_test_read_file(d.log);
  cr_assert_not_null(log);
  cr_expect_null(strstr(log, "daemon.memory"),
                 "a flag was taken for a file change:\n%s", log);
  cr_expect_null(strstr(log, "daemon.socket"),
                 "a flag was taken for a file change:\n%s", log);
  free(log);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* ---- item 9: a config path that is not a regular file ------------------- */

static void check_config_refuses(const char *path, const char *want) {
  char *dir = ckv_test_tmpdir("ckv-hostile-out");
  char out[400];
  snprintf(out, sizeof(out), "%s/out", dir);
  pid_t pid = ckv_test_spawn(
      (const char *const[]){"commitkvd", "--check-config", path, NULL}, out);
  int st = ckv_test_wait(pid, 5000);
  char *text = ckv_test_read_file(out);
  cr_expect_eq(st, 1,
               "commitkvd --check-config %s: status %d (-1: it hung and was "
               "killed), output: %s",
               path, st, text ? text : "(none)");
  cr_expect(text && strstr(text, want), "expected '%s' in: %s", want,
            text ? text : "(none)");
  free(text);
  ckv_test_rmdir(dir);
}

Test(hostile_local, check_config_refuses_a_fifo_and_a_directory,
     .timeout = 60) {
  char *dir = ckv_test_tmpdir("ckv-hostile-fifo");
  char fifo[400], sub[400];
  snprintf(fifo, sizeof(fifo), "%s/fifo.conf", dir);
  snprintf(sub, sizeof(sub), "%s/dir.conf", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(mkdir(sub, 0700), 0);
  check_config_refuses(fifo, "is a FIFO, not a regular file");
  check_config_refuses(sub, "is a directory, not a regular file");
  ckv_test_rmdir(dir);
}

Test(hostile_local, sighup_with_a_fifo_config_keeps_serving, .timeout = 90) {
  char cfg[400];
  char *cfgdir = ckv_test_write_config("[tenant.a]\nuids = 0\n", cfg, sizeof(cfg));
  ckv_test_daemon d;
  start(&d, "256M", cfg);
  cr_assert_eq(unlink(cfg), 0);
  cr_assert_eq(mkfifo(cfg, 0600), 0);
  cr_assert_eq(kill(d.pid, SIGHUP), 0);
  cr_expect(log_has(&d, "is a FIFO, not a regular file", 5000),
            "no refusal in the log:\n%s", ckv_test_file_tail(d.log, 2000));
  /* The loop goes on: a client is served after the reload. */
  char *json = ckv_test_ctl(&d, (const char *const[]){"stats", "--json", NULL});
  bool served = json != NULL;
  free(json);
  cr_expect(served,
            "commitkvctl got no answer after the SIGHUP: the daemon hangs");
  if (served)
    ckv_test_stop_clean(&d);
  else
    ckv_test_daemon_stop(&d); /* a hung daemon ignores SIGTERM: killed */
  ckv_test_rmdir(cfgdir);
}
