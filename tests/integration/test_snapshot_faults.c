/* test_snapshot_faults.c - snapshot I/O under load and under faults (issue 15:
 * disk I/O never runs on the server loop; issue 16: disk full and I/O errors
 * on the state directory).  Real commitkvd processes, libcommitkv here and in
 * a child running as another uid (another tenant).
 *
 * - save_does_not_hold_the_loop: tenant a saves a 32 MiB session while the
 *   daemon sleeps inside the write (CKV_TEST_SNAP_WRITE_DELAY_MS, a test-only
 *   hook in snapshot.c, once the temporary file exists); meanwhile tenant b
 *   (uid 65534) attaches, opens a session, appends, writes K/V and reports a
 *   round: its ReportRound is answered before tenant a's save is.  (A daemon
 *   that writes on its loop answers b only after the file is written.)
 * - disk_full_keeps_previous_snapshot: the tenant's snapshot directory is a
 *   256 KiB tmpfs (mounted here, in a private mount namespace, when root may
 *   mount; else the daemon gets a 128 KiB RLIMIT_FSIZE, and the test says
 *   which ran).  A small session's save fits; grown, its next save does not:
 *   the reply is the errno (ENOSPC, or EFBIG) with a text naming it, the
 *   previous snapshot file is byte-identical, no temporary file is left, the
 *   daemon serves the next request, and the previous snapshot restores with
 *   every K/V byte as written.
 * - file_size_limit_is_an_error_not_a_crash: the RLIMIT_FSIZE case whatever
 *   mounting allows (without SIGXFSZ ignored, the limit kills the daemon).
 * - state_dir_errors_are_answered: the tenant's snapshot directory replaced
 *   by a regular file (ENOTDIR) and, where tmpfs mounts, remounted read-only
 *   (EROFS): clear errors, the daemon serving, the earlier snapshot intact. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "testcheck.h"
#include "testutil.h"

TestSuite(snapshot_faults, .fini = ckv_test_leak_check);

#define NOBODY_UID 65534u
#define DEADLINE_MS 30000
#define DELAY_MS "3000" /* how long the daemon sleeps inside the slow save */

static const ckv_geometry k_small = {2, 2, 64, CKV_DTYPE_FP16}; /* 1 KiB of K/V per token */

static uint16_t value(size_t pos, uint32_t layer, uint32_t kv, uint32_t e) {
  return ckv_f32_to_f16(ckv_test_kv_value(pos, layer, kv, e));
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_snapshot_faults",
                          .timeout_ms = DEADLINE_MS};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* Appends n tokens after `first` and writes their K/V (the deterministic values). */
static void append_kv(ckv_session *s, const ckv_geometry *g, size_t first, uint32_t n) {
  uint64_t got = 0;
  int r = ckv_session_append(s, n, NULL, NULL, NULL, NULL, &got);
  cr_assert_eq(r, CKV_OK, "append: %s", ckv_strerror(r));
  cr_assert_eq(got, first);
  size_t te = (size_t)g->n_kv_heads * g->head_dim;
  uint16_t *k = malloc(te * 2), *v = malloc(te * 2);
  cr_assert(k && v);
  for (size_t pos = first; pos < first + n; pos++)
    for (uint32_t l = 0; l < g->n_layers; l++) {
      for (size_t e = 0; e < te; e++) {
        k[e] = value(pos, l, 0, (uint32_t)e);
        v[e] = value(pos, l, 1, (uint32_t)e);
      }
      cr_assert_eq(ckv_session_write_kv(s, pos, l, k, v), CKV_OK);
    }
  free(k);
  free(v);
}

/* Every one of the n draft tokens reads back as written, byte for byte. */
static void expect_kv(ckv_session *s, const ckv_geometry *g, uint64_t n) {
  const ckv_view *v;
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  cr_assert_eq(v->n_tokens, n, "the view holds %llu tokens, %llu were saved", (unsigned long long)v->n_tokens,
               (unsigned long long)n);
  size_t te = (size_t)g->n_kv_heads * g->head_dim;
  uint64_t seen = 0;
  for (size_t b = 0; b < v->n_draft; b++) {
    const uint8_t *base = v->draft[b].data;
    const ckv_block_header *h = (const ckv_block_header *)base;
    for (uint32_t sl = 0; sl < h->capacity; sl++) {
      if (!ckv_block_slot_valid(base, sl)) continue;
      uint32_t pos = ckv_block_positions_const(base)[sl];
      for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint16_t *p = (const uint16_t *)(base + ckv_draft_kv_offset(g, h->capacity, l, kv, sl));
          for (size_t e = 0; e < te; e++)
            cr_assert_eq(p[e], value(pos, l, kv, (uint32_t)e), "token %u layer %u kv %u element %zu differs", pos, l,
                         kv, e);
        }
      seen++;
    }
  }
  cr_assert_eq(seen, n, "%llu of %llu tokens read back", (unsigned long long)seen, (unsigned long long)n);
}

static bool temp_exists(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  struct dirent *e;
  bool found = false;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".ckvsnap~tmp~")) found = true;
  closedir(d);
  return found;
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
  cr_assert_not_null(b);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* The daemon is alive and answers a further request. */
static void expect_serving(const ckv_test_daemon *d, ckv_client *c) {
  cr_assert(ckv_test_daemon_alive(d), "commitkvd died:\n%s", ckv_test_file_tail(d->log, 2000));
  int r = ckv_client_heartbeat(c);
  cr_assert_eq(r, CKV_OK, "a heartbeat after the failed save: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
}

/* ---- issue 15: the loop keeps serving while a save is written ---- */

static long long monotonic_ms(void) { return ckv_test_now_ms(); }

typedef struct save_job {
  ckv_session *s;
  int status;
  long long done_ms;
} save_job;

static void *save_thread(void *arg) {
  save_job *j = arg;
  j->status = ckv_session_save(j->s, NULL, false, NULL);
  j->done_ms = monotonic_ms();
  return NULL;
}

typedef struct other_ctx {
  const ckv_test_daemon *d;
} other_ctx;

typedef struct other_report {
  int code;
  char step[32];
  char msg[200];
  char tenant[64];
  long long report_ms; /* when its ReportRound was answered */
} other_report;

/* Tenant b: attach, open, append, K/V, ReportRound, each answered. */
static void other_tenant(const void *ctx, void *report) {
  const other_ctx *o = ctx;
  other_report *rep = report;
  ckv_client_options co = {.socket = o->d->socket, .attach_socket = o->d->attach, .name = "tenant-b",
                           .timeout_ms = DEADLINE_MS};
  ckv_client *c = NULL;
  snprintf(rep->step, sizeof rep->step, "connect");
  if ((rep->code = ckv_client_connect(&co, &c)) != CKV_OK) {
    snprintf(rep->msg, sizeof rep->msg, "%s", ckv_client_connect_error());
    return;
  }
  snprintf(rep->tenant, sizeof rep->tenant, "%s", ckv_client_tenant(c));
  ckv_session *s = NULL;
  snprintf(rep->step, sizeof rep->step, "open");
  if ((rep->code = ckv_session_open(c, "b-session", &k_small, NULL, &s)) == CKV_OK) {
    snprintf(rep->step, sizeof rep->step, "append");
    rep->code = ckv_session_append(s, 16, NULL, NULL, NULL, NULL, NULL);
  }
  uint16_t kv[2 * 64] = {0};
  for (uint32_t pos = 0; rep->code == CKV_OK && pos < 16; pos++)
    for (uint32_t l = 0; rep->code == CKV_OK && l < k_small.n_layers; l++)
      rep->code = ckv_session_write_kv(s, pos, l, kv, kv);
  if (rep->code == CKV_OK) {
    float attn[16];
    for (int i = 0; i < 16; i++) attn[i] = 0.5f;
    snprintf(rep->step, sizeof rep->step, "report");
    ckv_round_result rr;
    rep->code = ckv_session_report(s, 1, 0, attn, 16, &rr);
    rep->report_ms = monotonic_ms();
  }
  if (rep->code != CKV_OK) snprintf(rep->msg, sizeof rep->msg, "%s", ckv_client_last_error(c));
  ckv_client_free(c);
}

Test(snapshot_faults, save_does_not_hold_the_loop, .timeout = 120) {
  char cfg[400], text[200];
  snprintf(text, sizeof text, "[tenant.a]\nuids = 0\n[tenant.b]\nuids = %u\n", NOBODY_UID);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof cfg);
  setenv("CKV_TEST_SNAP_WRITE_DELAY_MS", DELAY_MS, 1); /* inherited by the daemon only (a forked test) */
  ckv_test_daemon d;
  ckv_test_start_host(&d, "512M", (const char *const[]){"--config", cfg, NULL});
  unsetenv("CKV_TEST_SNAP_WRITE_DELAY_MS");
  cr_assert_eq(chmod(d.dir, 0755), 0); /* tenant b's uid must reach the sockets */
  ckv_client *c = connect_to(&d);
  cr_assert_str_eq(ckv_client_tenant(c), "a");
  /* 32 MiB of blocks: 8 layers x 8 heads x 128 dims, 32 KiB per token */
  const ckv_geometry big = {8, 8, 128, CKV_DTYPE_FP16};
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "a-big", &big, NULL, &s), CKV_OK, "%s", ckv_client_last_error(c));
  for (int i = 0; i < 4; i++)
    cr_assert_eq(ckv_session_append(s, 256, NULL, NULL, NULL, NULL, NULL), CKV_OK, "%s", ckv_client_last_error(c));
  char dir[400];
  snprintf(dir, sizeof dir, "%s/snapshots/a", d.dir);
  save_job j = {.s = s};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, save_thread, &j), 0);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (!temp_exists(dir) && !j.done_ms) {
    cr_assert_lt(ckv_test_now_ms(), end, "the save never started writing");
    usleep(200);
  }
  /* the file is being written: tenant b goes through a whole round */
  other_ctx oc = {.d = &d};
  other_report rep;
  ckv_test_run_as(NOBODY_UID, NOBODY_UID, other_tenant, &oc, &rep, sizeof rep, DEADLINE_MS);
  pthread_join(th, NULL);
  cr_assert_eq(rep.code, CKV_OK, "tenant b's %s failed during the save: %s (%s)", rep.step, ckv_strerror(rep.code),
               rep.msg);
  cr_assert_str_eq(rep.tenant, "b");
  cr_assert_eq(j.status, CKV_OK, "the save: %s (%s)", ckv_strerror(j.status), ckv_client_last_error(c));
  cr_assert_lt(rep.report_ms, j.done_ms,
               "tenant b's ReportRound was answered at %lld ms, %lld ms after tenant a's save (answered at %lld ms): "
               "the server loop waited for the disk",
               rep.report_ms, rep.report_ms - j.done_ms, j.done_ms);
  cr_log_info("tenant b's round was answered %lld ms before tenant a's save", j.done_ms - rep.report_ms);
  char *log = ckv_test_read_file(d.log);
  const char *line = log ? strstr(log, "copied in") : NULL;
  if (line) {
    const char *eol = strchr(line, '\n');
    cr_log_info("daemon: ...%.*s", eol ? (int)(eol - line) : 120, line);
  }
  free(log);
  ckv_session_drop(s);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* ---- issue 16: disk full, file-size limit, I/O errors ---- */

typedef enum { FULL_TMPFS, FULL_FSIZE } full_kind;

/* This test process (and the daemon it starts next) in a private mount
 * namespace, so a tmpfs mounted here is gone with them even when a test
 * fails half-way; false when this process may not (not root, or no
 * CAP_SYS_ADMIN in a container). */
static bool private_mounts(void) {
  if (getuid() != 0 || unshare(CLONE_NEWNS) < 0) return false;
  return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0;
}

/* A tmpfs of `size` at path (created); false when mounting fails. */
static bool mount_tmpfs(const char *path, const char *size) {
  char opt[64];
  snprintf(opt, sizeof opt, "size=%s,mode=0700", size);
  if (mkdir(path, 0700) < 0 && errno != EEXIST) return false;
  return mount("ckv-test-full", path, "tmpfs", 0, opt) == 0;
}

/* The daemon under RLIMIT_FSIZE: a write past `bytes` fails with EFBIG,
 * provided the daemon ignores SIGXFSZ (whose default action kills it). */
static void limit_file_size(const ckv_test_daemon *d, rlim_t bytes) {
  struct rlimit rl = {bytes, bytes};
  cr_assert_eq(prlimit(d->pid, RLIMIT_FSIZE, &rl, NULL), 0, "prlimit: %s", strerror(errno));
}

/* What a failed save must look like: the errno `want` (by code and by name
 * in the text), the previous file byte-identical, no temporary file. */
static void expect_failed_save(ckv_client *c, ckv_session *s, int want, const char *file, const uint8_t *before,
                               size_t before_len, const char *dir) {
  int r = ckv_session_save(s, NULL, false, NULL);
  const char *msg = ckv_client_last_error(c);
  cr_assert_eq(r, want, "the save that cannot fit answered %d %s (%s), not %s", r, ckv_status_name(r),
               r ? msg : "", ckv_status_name(want));
  cr_assert(strstr(msg, ckv_status_name(want)), "the error text does not name %s: '%s'", ckv_status_name(want), msg);
  cr_assert(strstr(msg, "session 'grow'"), "the error text does not name the session: '%s'", msg);
  size_t len;
  uint8_t *now = slurp(file, &len);
  cr_assert(len == before_len && memcmp(now, before, len) == 0,
            "the previous snapshot changed (%zu bytes, was %zu) after the failed save", len, before_len);
  free(now);
  cr_assert_not(temp_exists(dir), "the failed save left its temporary file in %s", dir);
}

/* After the failures: the previous snapshot restores with its K/V intact. */
static void expect_previous_restores(ckv_client *c, ckv_session *s, uint64_t tokens) {
  cr_assert_eq(ckv_session_drop(s), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_session *back = NULL;
  int r = ckv_session_restore(c, "grow", NULL, NULL, &back);
  cr_assert_eq(r, CKV_OK, "restoring the previous snapshot: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  expect_kv(back, &k_small, tokens);
  ckv_session_drop(back);
}

#define SMALL_TOKENS 16u  /* about 20 KiB of snapshot: fits */
#define GROWN_TOKENS 400u /* about 420 KiB: fits neither the 256 KiB tmpfs nor the 128 KiB file-size limit */

static void disk_full_case(full_kind kind) {
  bool ns = kind == FULL_TMPFS && private_mounts();
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  char snapdir[400], dir[480], file[560];
  snprintf(snapdir, sizeof snapdir, "%s/snapshots", d.dir);
  bool tmpfs = ns && mount_tmpfs(snapdir, "256k");
  if (kind == FULL_TMPFS && !tmpfs)
    cr_log_warn("cannot mount a tmpfs here (uid %u): the disk-full case runs with RLIMIT_FSIZE instead",
                (unsigned)getuid());
  fprintf(stderr, "test_snapshot_faults: disk full by %s\n", tmpfs ? "a 256 KiB tmpfs" : "a 128 KiB RLIMIT_FSIZE");
  ckv_client *c = connect_to(&d);
  /* after the attach: the tenant's arena (a memfd) is as large as it gets
   * by then, and RLIMIT_FSIZE limits memfds too */
  if (!tmpfs) limit_file_size(&d, 128u << 10);
  snprintf(dir, sizeof dir, "%s/%s", snapdir, ckv_client_tenant(c));
  snprintf(file, sizeof file, "%s/grow.ckvsnap", dir);
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "grow", &k_small, NULL, &s), CKV_OK, "%s", ckv_client_last_error(c));
  append_kv(s, &k_small, 0, SMALL_TOKENS);
  uint64_t bytes = 0;
  int r = ckv_session_save(s, NULL, false, &bytes);
  cr_assert_eq(r, CKV_OK, "the small save: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  size_t before_len;
  uint8_t *before = slurp(file, &before_len);
  cr_assert_eq(before_len, bytes);
  append_kv(s, &k_small, SMALL_TOKENS, GROWN_TOKENS - SMALL_TOKENS);
  expect_failed_save(c, s, tmpfs ? -ENOSPC : -EFBIG, file, before, before_len, dir);
  expect_serving(&d, c);
  /* again, and the session itself still takes requests */
  append_kv(s, &k_small, GROWN_TOKENS, 16);
  expect_failed_save(c, s, tmpfs ? -ENOSPC : -EFBIG, file, before, before_len, dir);
  expect_serving(&d, c);
  expect_previous_restores(c, s, SMALL_TOKENS);
  free(before);
  ckv_client_free(c);
  if (tmpfs) umount2(snapdir, MNT_DETACH); /* before the directory is removed */
  ckv_test_stop_clean(&d);
}

Test(snapshot_faults, disk_full_keeps_previous_snapshot, .timeout = 120) { disk_full_case(FULL_TMPFS); }

Test(snapshot_faults, file_size_limit_is_an_error_not_a_crash, .timeout = 120) { disk_full_case(FULL_FSIZE); }

Test(snapshot_faults, state_dir_errors_are_answered, .timeout = 120) {
  bool ns = private_mounts();
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  char snapdir[400], dir[480], file[560];
  snprintf(snapdir, sizeof snapdir, "%s/snapshots", d.dir);
  bool tmpfs = ns && mount_tmpfs(snapdir, "1m");
  ckv_client *c = connect_to(&d);
  snprintf(dir, sizeof dir, "%s/%s", snapdir, ckv_client_tenant(c));
  snprintf(file, sizeof file, "%s/grow.ckvsnap", dir);
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "grow", &k_small, NULL, &s), CKV_OK, "%s", ckv_client_last_error(c));
  append_kv(s, &k_small, 0, SMALL_TOKENS);
  cr_assert_eq(ckv_session_save(s, NULL, false, NULL), CKV_OK, "%s", ckv_client_last_error(c));
  size_t before_len;
  uint8_t *before = slurp(file, &before_len);
  append_kv(s, &k_small, SMALL_TOKENS, 16);
  if (tmpfs) { /* read-only: EROFS */
    cr_assert_eq(mount(NULL, snapdir, NULL, MS_REMOUNT | MS_RDONLY, NULL), 0, "remount ro: %s", strerror(errno));
    expect_failed_save(c, s, -EROFS, file, before, before_len, dir);
    expect_serving(&d, c);
    cr_assert_eq(mount(NULL, snapdir, NULL, MS_REMOUNT, NULL), 0, "remount rw: %s", strerror(errno));
  } else {
    cr_log_warn("cannot mount a tmpfs here: the read-only case is skipped");
  }
  fprintf(stderr, "test_snapshot_faults: state dir errors: %s\n",
          tmpfs ? "read-only tmpfs (EROFS) and a file for the tenant directory (ENOTDIR)"
                : "a file for the tenant directory (ENOTDIR) only");
  /* the tenant's directory replaced by a regular file (the old one kept aside) */
  char aside[520];
  snprintf(aside, sizeof aside, "%s.aside", dir);
  cr_assert_eq(rename(dir, aside), 0, "%s", strerror(errno));
  FILE *f = fopen(dir, "w");
  cr_assert_not_null(f);
  fclose(f);
  int r = ckv_session_save(s, NULL, false, NULL);
  const char *msg = ckv_client_last_error(c);
  cr_assert_eq(r, -ENOTDIR, "a save into a file answered %d %s (%s)", r, ckv_status_name(r), r ? msg : "");
  cr_assert(strstr(msg, "ENOTDIR"), "the error text does not name ENOTDIR: '%s'", msg);
  expect_serving(&d, c);
  /* a restore through it: a clear error too, not a crash */
  ckv_session *none = NULL;
  r = ckv_session_restore(c, "other", "grow", NULL, &none);
  cr_assert_lt(r, 0, "a restore through a file restored something");
  expect_serving(&d, c);
  cr_assert_eq(unlink(dir), 0);
  cr_assert_eq(rename(aside, dir), 0);
  cr_assert_not(temp_exists(dir), "a temporary file was left behind");
  expect_previous_restores(c, s, SMALL_TOKENS);
  free(before);
  ckv_client_free(c);
  if (tmpfs) umount2(snapdir, MNT_DETACH); /* before the directory is removed */
  ckv_test_stop_clean(&d);
}

/* ---- the state directory is the daemon's alone (issue 40 N5, N7) ---- */

/* commitkvd on state dir sd must refuse to start, its log saying `why`. */
static void expect_refused_start(const char *sd, const char *why) {
  ckv_test_daemon d;
  const char *const extra[] = {"--state-dir", sd, NULL};
  cr_assert_eq(ckv_test_daemon_start(&d, extra), -1, "commitkvd started on state dir %s", sd);
  d.pid = 0; /* exited (reaped by the start's check) */
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "state_dir") && strstr(log, why), "the refusal does not say '%s': %s", why,
            log ? log : "(no log)");
  free(log);
  ckv_test_daemon_stop(&d);
}

/* state_dir_not_the_daemons_alone_is_refused: a state directory its group can write, and one of
 * another user: anyone who can write there could plant a session for a tenant to resume, so the
 * daemon refuses to start and says why. */
Test(snapshot_faults, state_dir_not_the_daemons_alone_is_refused, .timeout = 60) {
  char *sd = ckv_test_tmpdir("ckv-statedir");
  cr_assert_eq(chmod(sd, 0770), 0);
  expect_refused_start(sd, "not the daemon's alone");
  cr_assert_eq(chmod(sd, 0700), 0);
  if (geteuid() == 0) {
    cr_assert_eq(chown(sd, NOBODY_UID, NOBODY_UID), 0, "%s", strerror(errno));
    expect_refused_start(sd, "owner uid 65534");
  } else {
    cr_log_warn("not root: the other user's state directory case is skipped (the group-writable one ran)");
  }
  ckv_test_rmdir(sd);
}

static int restore_as(ckv_client *c, const char *id, const char *name) {
  ckv_session *s = NULL;
  int r = ckv_session_restore(c, id, name, NULL, &s);
  if (r == CKV_OK) ckv_session_drop(s);
  return r;
}

/* planted_files_are_refused: in the daemon's own state directory, a snapshot file others may write,
 * one of another user, a tenant directory that is a symlink, and a FIFO at a snapshot's path are each
 * refused with a clear code and text (before: read and served, or the I/O thread blocked on the FIFO
 * for good, every later save waiting and SIGTERM no longer ending the daemon).  After the FIFO the
 * daemon still saves, and SIGTERM ends it within a second. */
Test(snapshot_faults, planted_files_are_refused, .timeout = 120) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  char dir[480], real[500], file[600], fifo[600];
  snprintf(dir, sizeof dir, "%s/snapshots/%s", d.dir, ckv_client_tenant(c));
  snprintf(file, sizeof file, "%s/mine.ckvsnap", dir);
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "mine", &k_small, NULL, &s), CKV_OK, "%s", ckv_client_last_error(c));
  append_kv(s, &k_small, 0, SMALL_TOKENS);
  cr_assert_eq(ckv_session_save(s, NULL, false, NULL), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert_eq(restore_as(c, "copy", "mine"), CKV_OK, "the daemon's own file: %s", ckv_client_last_error(c));
  /* writable by others */
  cr_assert_eq(chmod(file, 0666), 0);
  int r = restore_as(c, "copy", "mine");
  cr_assert_eq(r, CKV_ERR_AUTH, "a 0666 snapshot restored: %d (%s)", r, ckv_client_last_error(c));
  cr_assert(strstr(ckv_client_last_error(c), "mode 0666"), "%s", ckv_client_last_error(c));
  cr_assert_eq(chmod(file, 0600), 0);
  /* another user's */
  if (geteuid() == 0) {
    cr_assert_eq(chown(file, NOBODY_UID, NOBODY_UID), 0);
    r = restore_as(c, "copy", "mine");
    cr_assert_eq(r, CKV_ERR_AUTH, "another user's snapshot restored: %d (%s)", r, ckv_client_last_error(c));
    cr_assert(strstr(ckv_client_last_error(c), "owner uid 65534"), "%s", ckv_client_last_error(c));
    cr_assert_eq(chown(file, 0, 0), 0);
  } else {
    cr_log_warn("not root: the other user's file case is skipped");
  }
  /* the tenant's directory a symlink to a directory of the same files */
  snprintf(real, sizeof real, "%s.real", dir);
  cr_assert_eq(rename(dir, real), 0);
  cr_assert_eq(symlink(real, dir), 0);
  r = restore_as(c, "copy", "mine");
  cr_assert_eq(r, CKV_ERR_AUTH, "a snapshot behind a symlinked tenant directory restored: %d (%s)", r,
               ckv_client_last_error(c));
  cr_assert(strstr(ckv_client_last_error(c), "symlink"), "%s", ckv_client_last_error(c));
  cr_assert_eq(unlink(dir), 0);
  cr_assert_eq(rename(real, dir), 0);
  /* a FIFO where a snapshot would be */
  snprintf(fifo, sizeof fifo, "%s/fifo.ckvsnap", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0, "%s", strerror(errno));
  long long t0 = ckv_test_now_ms();
  r = restore_as(c, "copy", "fifo");
  cr_assert_eq(r, CKV_ERR_CORRUPT, "a FIFO restored: %d (%s)", r, ckv_client_last_error(c));
  cr_assert(strstr(ckv_client_last_error(c), "not a regular file"), "%s", ckv_client_last_error(c));
  cr_assert_lt(ckv_test_now_ms() - t0, 5000, "the FIFO held the restore %lld ms", ckv_test_now_ms() - t0);
  cr_assert_eq(ckv_session_save(s, "after", false, NULL), CKV_OK, "a save after the FIFO: %s", ckv_client_last_error(c));
  ckv_session_drop(s);
  ckv_client_free(c);
  t0 = ckv_test_now_ms();
  cr_assert_eq(kill(d.pid, SIGTERM), 0);
  int st = ckv_test_wait(d.pid, 5000);
  long long took = ckv_test_now_ms() - t0;
  d.pid = 0;
  cr_assert_eq(st, 0, "commitkvd ended with %d after SIGTERM", st);
  cr_assert_lt(took, 1000, "SIGTERM took %lld ms to end the daemon", took);
  ckv_test_daemon_stop(&d);
}
