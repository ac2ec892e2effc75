/* test_disk_quota.c - a tenant's disk is bounded (issue 40 N6): real
 * commitkvd processes, real files in the state directory, libcommitkv in
 * this process (root: tenant 'small') and in a child of another uid
 * (tenant 'other').  Before, `[tenant] quota_disk` was parsed and never
 * used: a tenant with quota_disk = 1M wrote 5,513 snapshots in 20 s.
 *
 * - quota_disk_refused_with_the_numbers: saves under new names until one is
 *   refused: CKV_ERR_QUOTA, its text naming the quota, the bytes used (the
 *   sum of the files on disk) and this snapshot's size; the tenant's files
 *   on disk never pass quota_disk; saving over an existing name still
 *   works (a copy counts its growth only); another tenant still saves;
 *   replacing a snapshot with a smaller one gives the room back; a daemon
 *   restarted (kill -9) on the same state directory refuses at the same
 *   point, with the same numbers.
 * - max_snapshots_refused_with_the_numbers: the (N+1)th name refused with
 *   the numbers, saving over one of the N is not; the same after a restart.
 * - autosave_within_quota_disk: autosaves that would pass the quota are not
 *   written (counted, the session stays in memory and keeps working); a
 *   dropped session's autosave gives its room back to the others.
 * - tier_moves_within_quota_disk: an idle session whose disk-tier file would
 *   pass the quota stays in memory (counted, logged), no file is written.
 * - listing_and_startup_with_thousands_of_snapshots: 3,000 valid snapshot
 *   files planted while the daemon is down: start-up says one line per
 *   tenant, not one per file; ListSnapshots lists them all from memory; a
 *   client's heartbeats while another client lists in a loop stay quick
 *   (p99 bound from measurement, printed). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#define RAW_CLIENT_NAME "disk-quota-lister"
#include "rawcheck.h"
#include "testcheck.h"
#include "testutil.h"
#include "tiercheck.h"

TestSuite(disk_quota, .fini = ckv_test_leak_check);

#define DEADLINE_MS 20000
#define OTHER_UID 65534u /* nobody: tenant 'other' */
static const ckv_geometry k_geometry = {2, 2, 16, 0};
#define TOKENS 64u /* about 22 KB of snapshot at this geometry */

/* ---- a daemon with a config file, restartable on its state directory ---- */

typedef struct node {
  ckv_test_daemon d;
  char cfg[400];
  char *cfgdir;
  const char *extra[8];
} node;

static void node_start(node *n, const char *config, const char *const *more) {
  memset(n, 0, sizeof *n);
  n->cfgdir = ckv_test_write_config(config, n->cfg, sizeof n->cfg);
  int k = 0;
  n->extra[k++] = "--config";
  n->extra[k++] = n->cfg;
  for (int i = 0; more && more[i] && k < 7; i++) n->extra[k++] = more[i];
  cr_assert_eq(ckv_test_daemon_start(&n->d, n->extra), 0, "commitkvd did not start: %s",
               ckv_test_file_tail(n->d.log, 2000));
  cr_assert_eq(chmod(n->d.dir, 0755), 0); /* tenant 'other' (another uid) must reach the sockets */
}

/* kill -9 (hard: the index must come back from the files alone), then a new
 * commitkvd on the same sockets, state directory and config, its log in `log`. */
static void node_restart(node *n, const char *logname) {
  if (n->d.pid > 0) { /* 0: already down */
    cr_assert_eq(kill(n->d.pid, SIGKILL), 0);
    cr_assert_eq(ckv_test_wait(n->d.pid, DEADLINE_MS), 128 + SIGKILL);
  }
  const char *argv[32] = {"commitkvd", "--socket", n->d.socket, "--attach-socket", n->d.attach, "--state-dir",
                          n->d.dir,    "--set",    "daemon.metrics=", "--backend", "host"};
  int k = 11;
  for (int i = 0; n->extra[i]; i++) argv[k++] = n->extra[i];
  argv[k] = NULL;
  snprintf(n->d.log, sizeof n->d.log, "%s/%s", n->d.dir, logname);
  n->d.pid = ckv_test_spawn(argv, n->d.log);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (!ckv_test_attach_accepts(n->d.attach)) {
    cr_assert(ckv_test_daemon_alive(&n->d), "the new commitkvd died: %s", ckv_test_file_tail(n->d.log, 2000));
    cr_assert_lt(ckv_test_now_ms(), end);
    usleep(10000);
  }
}

static void node_stop(node *n) {
  ckv_test_stop_clean(&n->d);
  ckv_test_rmdir(n->cfgdir);
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_disk_quota",
                          .timeout_ms = 10000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* Session `id` with `tokens` draft tokens (fp16: no move changes its size). */
static ckv_session *filled(ckv_client *c, const char *id, uint32_t tokens) {
  ckv_session_options so = {.policy = "fp16"};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geometry, &so, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  r = ckv_session_append(s, tokens, NULL, NULL, NULL, NULL, NULL);
  cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  /* one round reported: the K/V is written (autosave copies only such sessions) */
  float *attn = calloc(tokens, sizeof(float));
  ckv_round_result rr;
  r = ckv_session_report(s, 1, 0, attn, tokens, &rr);
  free(attn);
  cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  return s;
}

/* Bytes of every file the tenant has in the state directory (all areas, temporary files too). */
static unsigned long long tenant_bytes(const ckv_test_daemon *d, const char *tenant, unsigned *ret_files) {
  static const char *const areas[] = {"snapshots", "autosave", "tier"};
  unsigned long long sum = 0;
  unsigned files = 0;
  for (size_t a = 0; a < 3; a++) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s/%s", d->dir, areas[a], tenant);
    DIR *dd = opendir(dir);
    if (!dd) continue;
    struct dirent *e;
    while ((e = readdir(dd))) {
      char path[900];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      struct stat st;
      if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        sum += (unsigned long long)st.st_size;
        files++;
      }
    }
    closedir(dd);
  }
  if (ret_files) *ret_files = files;
  return sum;
}

/* A field of tenant `name` in `commitkvctl stats --json` (tenants are listed in attach order). */
static unsigned long long tenant_stat(const ckv_test_daemon *d, const char *name, const char *field) {
  char *json = ckv_test_ctl(d, (const char *const[]){"stats", "--json", NULL});
  cr_assert_not_null(json);
  const char *list = strstr(json, "\"tenants\": [");
  cr_assert_not_null(list, "%s", json);
  char key[160];
  snprintf(key, sizeof key, "{\"name\": \"%s\"", name);
  const char *hit = strstr(list, key);
  cr_assert_not_null(hit, "no tenant %s in %s", name, json);
  int idx = 0;
  for (const char *q = strstr(list, "{\"name\": "); q && q < hit; q = strstr(q + 1, "{\"name\": ")) idx++;
  char path[128];
  snprintf(path, sizeof path, "tenants.%d.%s", idx, field);
  unsigned long long v = 0;
  cr_assert_eq(ckv_test_json_u64(json, path, &v), 0, "no %s in %s", path, json);
  free(json);
  return v;
}

/* ---- tenant 'other', in a child of its own uid ---- */

typedef struct other_ctx {
  char socket[300], attach[300];
} other_ctx;

typedef struct other_report {
  int code;
  uint64_t bytes;
  char msg[400];
} other_report;

static void other_saves(const void *ctx, void *report) {
  const other_ctx *o = ctx;
  other_report *rep = report;
  ckv_client_options co = {.socket = o->socket, .attach_socket = o->attach, .name = "other", .timeout_ms = 10000};
  ckv_client *c = NULL;
  rep->code = ckv_client_connect(&co, &c);
  if (rep->code != CKV_OK) {
    snprintf(rep->msg, sizeof rep->msg, "connect: %s", ckv_client_connect_error());
    return;
  }
  ckv_session_options so = {.policy = "fp16"};
  ckv_session *s = NULL;
  rep->code = ckv_session_open(c, "theirs", &k_geometry, &so, &s);
  if (rep->code == CKV_OK) rep->code = ckv_session_append(s, TOKENS, NULL, NULL, NULL, NULL, NULL);
  if (rep->code == CKV_OK) rep->code = ckv_session_save(s, "theirs", false, &rep->bytes);
  snprintf(rep->msg, sizeof rep->msg, "%s", ckv_client_last_error(c));
  if (s) ckv_session_drop(s);
  ckv_client_free(c);
}

static other_report other_tenant_save(const node *n) {
  other_ctx o;
  snprintf(o.socket, sizeof o.socket, "%s", n->d.socket);
  snprintf(o.attach, sizeof o.attach, "%s", n->d.attach);
  other_report rep;
  memset(&rep, 0, sizeof rep);
  ckv_test_run_as(OTHER_UID, OTHER_UID, other_saves, &o, &rep, sizeof rep, 30000);
  return rep;
}

/* ---- the tests ---- */

#define QUOTA (128u * 1024u)

static unsigned long long number_before(const char *text, const char *word) {
  const char *p = strstr(text, word);
  cr_assert_not_null(p, "no '%s' in '%s'", word, text);
  while (p > text && p[-1] == ' ') p--;
  while (p > text && p[-1] >= '0' && p[-1] <= '9') p--;
  return strtoull(p, NULL, 10);
}

Test(disk_quota, quota_disk_refused_with_the_numbers, .timeout = 120) {
  char config[400];
  snprintf(config, sizeof config,
           "[daemon]\ndetach_keep = 60s\n[tenant.small]\nuids = 0\nquota_disk = %u\n[tenant.other]\nuids = %u\n"
           "quota_disk = %u\n",
           QUOTA, OTHER_UID, QUOTA);
  node n;
  node_start(&n, config, NULL);
  ckv_client *c = connect_to(&n.d);
  ckv_session *s = filled(c, "s", TOKENS);
  uint64_t one = 0, sum = 0;
  unsigned saved = 0;
  int r = CKV_OK;
  char name[32];
  for (; saved < 1000; saved++) {
    snprintf(name, sizeof name, "n%u", saved);
    uint64_t b = 0;
    r = ckv_session_save(s, name, false, &b);
    if (r != CKV_OK) break;
    one = b;
    sum += b;
  }
  char refused[600];
  snprintf(refused, sizeof refused, "%s", ckv_client_last_error(c));
  fprintf(stderr, "test_disk_quota: %u snapshots of %llu bytes saved under quota_disk %u; then: %s\n", saved,
          (unsigned long long)one, QUOTA, refused);
  cr_assert_eq(r, CKV_ERR_QUOTA, "save %u: %s (%s), not CKV_ERR_QUOTA (before issue 40 N6: never refused)", saved,
               ckv_strerror(r), refused);
  cr_assert_geq(saved, 2u, "the quota should hold a few snapshots of %llu bytes", (unsigned long long)one);
  cr_assert_lt(saved, 10u);
  /* the numbers: the quota, what is used (exactly the files on disk), this snapshot's size */
  char quota_text[64];
  snprintf(quota_text, sizeof quota_text, "quota_disk: %u bytes", QUOTA);
  cr_assert(strstr(refused, quota_text), "the refusal does not name the quota: %s", refused);
  unsigned files = 0;
  unsigned long long on_disk = tenant_bytes(&n.d, "small", &files);
  cr_assert_eq(files, saved);
  cr_assert_eq(on_disk, sum, "on disk %llu, the saves said %llu", on_disk, (unsigned long long)sum);
  cr_assert_leq(on_disk, QUOTA, "the tenant's files (%llu bytes) passed its quota_disk", on_disk);
  cr_assert_eq(number_before(refused, "used"), on_disk, "the refusal's 'used' is not the bytes on disk: %s", refused);
  cr_assert_eq(number_before(refused, "for this snapshot"), one, "the refusal's size is not the snapshot's: %s", refused);
  cr_assert_gt(on_disk + one, QUOTA);
  cr_assert_eq(tenant_stat(&n.d, "small", "disk_bytes"), on_disk);
  cr_assert_eq(tenant_stat(&n.d, "small", "snapshots"), saved);
  cr_assert_eq(ckv_test_stat(&n.d, "disk_refused_saves"), 1);

  /* a copy over an existing name counts its growth only */
  cr_assert_eq(ckv_session_save(s, "n0", false, NULL), CKV_OK, "saving over n0: %s", ckv_client_last_error(c));
  cr_assert_eq(tenant_bytes(&n.d, "small", NULL), on_disk);

  /* another tenant has its own quota */
  other_report o = other_tenant_save(&n);
  cr_assert_eq(o.code, CKV_OK, "tenant 'other' could not save: %s (%s)", ckv_strerror(o.code), o.msg);
  cr_assert_eq(tenant_bytes(&n.d, "other", NULL), o.bytes);

  /* room comes back: n0 replaced by a committed-only copy (no committed token: a few KB) */
  uint64_t small_copy = 0;
  cr_assert_eq(ckv_session_save(s, "n0", true, &small_copy), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert_lt(small_copy + one, 2 * one);
  snprintf(name, sizeof name, "n%u", saved);
  cr_assert_eq(ckv_session_save(s, name, false, NULL), CKV_OK, "the room n0 gave back was not given: %s",
               ckv_client_last_error(c));
  on_disk = tenant_bytes(&n.d, "small", &files);
  cr_assert_leq(on_disk, QUOTA);
  snprintf(name, sizeof name, "n%u", saved + 1);
  cr_assert_eq(ckv_session_save(s, name, false, NULL), CKV_ERR_QUOTA);
  snprintf(refused, sizeof refused, "%s", ckv_client_last_error(c));

  /* a restart on the same state directory refuses at the same point, with the same numbers */
  node_restart(&n, "commitkvd-2.log");
  cr_assert_eq(ckv_client_reconnect(c), CKV_OK, "reconnect: %s", ckv_client_last_error(c));
  ckv_session_close(s);
  s = filled(c, "s2", TOKENS);
  cr_assert_eq(ckv_session_save(s, name, false, NULL), CKV_ERR_QUOTA, "after a restart the quota is forgotten");
  const char *again = ckv_client_last_error(c);
  cr_assert_eq(number_before(again, "used"), on_disk, "after the restart: %s (before: %s)", again, refused);
  cr_assert_eq(tenant_stat(&n.d, "small", "disk_bytes"), on_disk);
  cr_assert_eq(tenant_bytes(&n.d, "small", NULL), on_disk);
  ckv_session_drop(s);
  ckv_client_free(c);
  node_stop(&n);
}

Test(disk_quota, max_snapshots_refused_with_the_numbers, .timeout = 120) {
  node n;
  node_start(&n, "[daemon]\ndetach_keep = 60s\n[tenant.small]\nuids = 0\nmax_snapshots = 3\n", NULL);
  ckv_client *c = connect_to(&n.d);
  ckv_session *s = filled(c, "s", 8);
  const char *names[] = {"a", "b", "c"};
  for (int i = 0; i < 3; i++)
    cr_assert_eq(ckv_session_save(s, names[i], false, NULL), CKV_OK, "%s: %s", names[i], ckv_client_last_error(c));
  int r = ckv_session_save(s, "d", false, NULL);
  cr_assert_eq(r, CKV_ERR_QUOTA, "the 4th snapshot: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  const char *why = ckv_client_last_error(c);
  cr_assert(strstr(why, "max_snapshots: 3 snapshots; 3 saved") && strstr(why, "'d'"), "%s", why);
  unsigned files = 0;
  tenant_bytes(&n.d, "small", &files);
  cr_assert_eq(files, 3u);
  cr_assert_eq(ckv_session_save(s, "b", false, NULL), CKV_OK, "saving over 'b': %s", ckv_client_last_error(c));
  cr_assert_eq(tenant_stat(&n.d, "small", "max_snapshots"), 3);

  node_restart(&n, "commitkvd-2.log");
  cr_assert_eq(ckv_client_reconnect(c), CKV_OK, "reconnect: %s", ckv_client_last_error(c));
  ckv_session_close(s);
  s = filled(c, "s2", 8);
  cr_assert_eq(ckv_session_save(s, "d", false, NULL), CKV_ERR_QUOTA, "after a restart the count is forgotten");
  cr_assert(strstr(ckv_client_last_error(c), "3 saved"), "%s", ckv_client_last_error(c));
  cr_assert_eq(ckv_session_save(s, "a", false, NULL), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_session_drop(s);
  ckv_client_free(c);
  node_stop(&n);
}

/* Polls until `cond(d)` or the deadline. */
static bool autosave_exists(const ckv_test_daemon *d, const char *id) {
  char path[600];
  snprintf(path, sizeof path, "%s/autosave/small/%s.ckvsnap", d->dir, id);
  return access(path, F_OK) == 0;
}

Test(disk_quota, autosave_within_quota_disk, .timeout = 120) {
  /* room for one session's autosave (about 22 KB), not two */
  node n;
  node_start(&n, "[daemon]\ndetach_keep = 60s\nautosave = 200ms\n[tenant.small]\nuids = 0\nquota_disk = 32K\n",
             NULL);
  ckv_client *c = connect_to(&n.d);
  ckv_session *a = filled(c, "a", TOKENS);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (!autosave_exists(&n.d, "a")) {
    cr_assert_lt(ckv_test_now_ms(), end, "session a was never autosaved");
    usleep(50000);
  }
  ckv_session *b = filled(c, "b", TOKENS);
  end = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_test_stat(&n.d, "disk_refused_autosaves") < 2) {
    cr_assert_lt(ckv_test_now_ms(), end, "b's autosave was never refused");
    usleep(100000);
  }
  cr_assert(!autosave_exists(&n.d, "b"), "b's autosave was written past the quota");
  cr_assert_leq(tenant_bytes(&n.d, "small", NULL), 32u * 1024u);
  /* b lives on in memory: it takes tokens and still saves nothing past the quota */
  cr_assert_eq(ckv_session_append(b, 4, NULL, NULL, NULL, NULL, NULL), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert_eq(ckv_session_tokens(b), TOKENS + 4);
  char *log = ckv_test_read_file(n.d.log);
  cr_assert(log && strstr(log, "autosave-quota"), "the refused autosave is not logged");
  free(log);
  /* a dropped session's autosave gives its room back: b's lands */
  cr_assert_eq(ckv_session_drop(a), CKV_OK);
  end = ckv_test_now_ms() + DEADLINE_MS;
  while (!autosave_exists(&n.d, "b")) {
    cr_assert_lt(ckv_test_now_ms(), end, "b was never autosaved after a's autosave went");
    usleep(50000);
  }
  cr_assert(!autosave_exists(&n.d, "a"));
  cr_assert_leq(tenant_bytes(&n.d, "small", NULL), 32u * 1024u);
  ckv_session_drop(b);
  ckv_client_free(c);
  node_stop(&n);
}

/* A move to the disk tier that would pass quota_disk is not made: the
 * session stays in memory, counted and logged; with room it goes. */
Test(disk_quota, tier_moves_within_quota_disk, .timeout = 120) {
  node n;
  node_start(&n,
             "[daemon]\ndetach_keep = 60s\ndisk_idle = 1s\ndisk_memory = 64M\n[tenant.small]\nuids = 0\n"
             "quota_disk = 8K\n",
             NULL);
  ckv_client *c = connect_to(&n.d);
  ckv_session *s = filled(c, "idle", TOKENS); /* its tier file would be about 22 KB */
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_test_stat(&n.d, "disk_refused_offloads") < 1) {
    cr_assert_lt(ckv_test_now_ms(), end, "the idle session's move to disk was never refused");
    usleep(200000);
    cr_assert_eq(ckv_client_heartbeat(c), CKV_OK);
  }
  char tier[32];
  cr_assert_str_eq(ckv_test_session_tier(c, "idle", tier, sizeof tier), "primary");
  cr_assert_eq(tenant_bytes(&n.d, "small", NULL), 0);
  cr_assert_eq(ckv_test_stat(&n.d, "tiers.1.sessions"), 0);
  char *log = ckv_test_read_file(n.d.log);
  cr_assert(log && strstr(log, "tier-quota"), "the refused move is not logged");
  free(log);
  cr_assert_eq(ckv_session_tokens(s), TOKENS);
  ckv_session_drop(s);
  ckv_client_free(c);
  node_stop(&n);
}

/* ---- thousands of snapshots ---- */

#define PLANTED 3000
#define BEATS 300

typedef struct lister {
  raw r;
  atomic_bool stop;
  atomic_ulong lists;
  atomic_ulong listed;
  atomic_int failed;
} lister;

static void *list_loop(void *arg) {
  lister *l = arg;
  while (!atomic_load(&l->stop)) {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__ListSnapshots ls = COMMITKV__V1__LIST_SNAPSHOTS__INIT;
    q.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SNAPSHOTS;
    q.list_snapshots = &ls;
    if (ckv_raw_send_request(&l->r, &q) != 0) {
      atomic_store(&l->failed, 1);
      break;
    }
    Commitkv__V1__Response *rep = NULL;
    int code = ckv_raw_recv(&l->r, 30000, &rep);
    if (code != 0 || !rep || !rep->snapshot_list) {
      atomic_store(&l->failed, code ? code : 1);
      if (rep) commitkv__v1__response__free_unpacked(rep, NULL);
      break;
    }
    atomic_fetch_add(&l->listed, rep->snapshot_list->n_snapshots);
    atomic_fetch_add(&l->lists, 1);
    commitkv__v1__response__free_unpacked(rep, NULL);
  }
  return NULL;
}

static long long now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* BEATS heartbeats of c: their median and p99 in ms. */
static void beats(ckv_client *c, double *ret_p50, double *ret_p99) {
  static double ms[BEATS];
  for (int i = 0; i < BEATS; i++) {
    long long t0 = now_us();
    cr_assert_eq(ckv_client_heartbeat(c), CKV_OK, "%s", ckv_client_last_error(c));
    ms[i] = (double)(now_us() - t0) / 1e3;
    usleep(2000);
  }
  qsort(ms, BEATS, sizeof ms[0], by_value);
  *ret_p50 = ms[BEATS / 2];
  *ret_p99 = ms[BEATS * 99 / 100];
}

/* The bounds on a heartbeat's median and p99 while another client lists
 * 3,001 snapshots in a loop, from measurement here (2 shared cores, 300
 * heartbeats, 5 runs each, the suite alone): alone p50 0.06-0.10 ms, p99
 * 0.3-1.8 ms; with the lister, before issue 40 N6 (every listing read 3,001
 * headers on the loop) p50 24 ms, p99 51-52 ms; after (each listing packs
 * 3,001 entries from the index) p50 0.4-0.7 ms, p99 5.6-6.6 ms, and p50 3.2
 * ms, p99 15 ms once under `make test` beside other suites.  The bounds are
 * a tripwire at half of what was measured before (the figures themselves
 * are printed: the benchmark); x4 under a sanitizer. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLOWER 4.0
#else
#define SLOWER 1.0
#endif
#define BEAT_P50_BOUND_MS (12.0 * SLOWER)
#define BEAT_P99_BOUND_MS (40.0 * SLOWER)

Test(disk_quota, listing_and_startup_with_thousands_of_snapshots, .timeout = 240) {
  node n;
  node_start(&n, "[daemon]\ndetach_keep = 60s\n[tenant.small]\nuids = 0\n", NULL);
  ckv_client *c = connect_to(&n.d);
  ckv_session *s = filled(c, "seed", TOKENS);
  uint64_t bytes = 0;
  cr_assert_eq(ckv_session_save(s, "seed", false, &bytes), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_session_drop(s);
  /* 3,000 copies of a valid snapshot, planted while the daemon is down */
  cr_assert_eq(kill(n.d.pid, SIGKILL), 0);
  cr_assert_eq(ckv_test_wait(n.d.pid, DEADLINE_MS), 128 + SIGKILL);
  char seed[600];
  snprintf(seed, sizeof seed, "%s/snapshots/small/seed.ckvsnap", n.d.dir);
  FILE *sf = fopen(seed, "rb");
  cr_assert_not_null(sf, "%s: %s", seed, strerror(errno));
  static char buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf, sf);
  fclose(sf);
  cr_assert_eq(len, bytes);
  for (int i = 0; i < PLANTED; i++) {
    char path[700];
    snprintf(path, sizeof path, "%s/snapshots/small/p%04d.ckvsnap", n.d.dir, i);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
    cr_assert_eq(chmod(path, 0600), 0);
  }
  n.d.pid = 0;
  long long t0 = ckv_test_now_ms();
  node_restart(&n, "commitkvd-2.log");
  long long up_ms = ckv_test_now_ms() - t0;
  /* start-up: one line for the tenant's snapshots, not one per file */
  char count[64];
  snprintf(count, sizeof count, "%d snapshots, %llu bytes", PLANTED + 1, (unsigned long long)bytes * (PLANTED + 1));
  char *log = NULL;
  for (long long end = ckv_test_now_ms() + DEADLINE_MS;; usleep(20000)) {
    log = ckv_test_read_file(n.d.log);
    if (log && strstr(log, count)) break;
    cr_assert_lt(ckv_test_now_ms(), end, "no summary '%s' in the log:\n%s", count, log ? log : "");
    free(log);
  }
  long long scanned_ms = ckv_test_now_ms() - t0;
  unsigned lines = 0, found = 0;
  for (const char *p = log; *p; p++)
    if (*p == '\n') lines++;
  for (const char *p = strstr(log, "snapshot-found"); p; p = strstr(p + 1, "snapshot-found")) found++;
  free(log);
  cr_assert_leq(found, 2u, "%u snapshot-found lines for %d snapshots (before issue 40 N6: one per file)", found,
                PLANTED + 1);
  cr_assert_lt(lines, 100u, "the start-up logged %u lines for %d snapshots", lines, PLANTED + 1);

  cr_assert_eq(ckv_client_reconnect(c), CKV_OK, "reconnect: %s", ckv_client_last_error(c));
  double p50_idle, p99_idle, p50_busy, p99_busy;
  beats(c, &p50_idle, &p99_idle);
  lister l;
  memset(&l, 0, sizeof l);
  raw_connect(&l.r, &n.d);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, list_loop, &l), 0);
  while (atomic_load(&l.lists) < 1 && !atomic_load(&l.failed)) usleep(1000);
  beats(c, &p50_busy, &p99_busy);
  atomic_store(&l.stop, true);
  pthread_join(th, NULL);
  unsigned long lists = atomic_load(&l.lists), listed = atomic_load(&l.listed);
  raw_done(&l.r);
  fprintf(stderr,
          "test_disk_quota: %d snapshots: listening after %lld ms, indexed after %lld ms (%u log lines); heartbeat p50/p99 %.2f/%.2f ms alone, "
          "%.2f/%.2f ms while another client listed them %lu times\n",
          PLANTED + 1, up_ms, scanned_ms, lines, p50_idle, p99_idle, p50_busy, p99_busy, lists);
  cr_assert_eq(atomic_load(&l.failed), 0, "ListSnapshots failed: %d", atomic_load(&l.failed));
  cr_assert_gt(lists, 0);
  cr_assert_eq(listed, lists * (PLANTED + 1), "a listing did not hold every snapshot");
  cr_assert_lt(p50_busy, BEAT_P50_BOUND_MS,
               "heartbeats wait for listings of %d snapshots: p50 %.2f ms (alone %.2f ms)", PLANTED + 1, p50_busy,
               p50_idle);
  cr_assert_lt(p99_busy, BEAT_P99_BOUND_MS,
               "heartbeats stall while another client lists %d snapshots: p99 %.2f ms (alone %.2f ms)", PLANTED + 1,
               p99_busy, p99_idle);
  ckv_client_free(c);
  node_stop(&n);
}
