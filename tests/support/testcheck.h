/* testcheck.h - Criterion-side helpers shared by the suites (testutil.h is
 * plain C; these assert with Criterion). */
#ifndef CKV_TESTCHECK_H
#define CKV_TESTCHECK_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

/* A field of `commitkvctl stats --json` by dotted path ("arenas.0.bytes_used");
 * fails the test when the command or the field is missing. */
static inline unsigned long long ckv_test_stat(const ckv_test_daemon *d, const char *path) {
  const char *args[] = {"stats", "--json", NULL};
  char *json = ckv_test_ctl(d, args);
  cr_assert_not_null(json, "commitkvctl stats --json failed");
  unsigned long long v = 0;
  cr_assert_eq(ckv_test_json_u64(json, path, &v), 0, "no field %s in %s", path, json);
  free(json);
  return v;
}

/* Polls a stats field every 100 ms until it equals `want`: 0, or -1 when
 * timeout_ms passed first. */
static inline int ckv_test_wait_stat(const ckv_test_daemon *d, const char *path, unsigned long long want,
                                     int timeout_ms) {
  long long end = ckv_test_now_ms() + timeout_ms;
  while (ckv_test_now_ms() < end) {
    if (ckv_test_stat(d, path) == want) return 0;
    usleep(100000);
  }
  return -1;
}

/* `text` as commitkvd.conf in a fresh temporary directory: its path into
 * ret_path, the directory returned (remove it with ckv_test_rmdir). */
static inline char *ckv_test_write_config(const char *text, char *ret_path, size_t cap) {
  char *dir = ckv_test_tmpdir("ckv-test-cfg");
  snprintf(ret_path, cap, "%s/commitkvd.conf", dir);
  FILE *f = fopen(ret_path, "w");
  cr_assert_not_null(f, "cannot write %s", ret_path);
  fputs(text, f);
  fclose(f);
  return dir;
}

/* Starts commitkvd on host memory of `memory` ("256M") with `more`
 * arguments (NULL-terminated, may be NULL); fails the test with the tail of
 * the daemon's log when it does not come up. */
static inline void ckv_test_start_host(ckv_test_daemon *d, const char *memory, const char *const *more) {
  const char *argv[32] = {"--backend", "host", "--memory", memory};
  int n = 4;
  for (int i = 0; more && more[i] && n < 31; i++) argv[n++] = more[i];
  argv[n] = NULL;
  if (ckv_test_daemon_start(d, argv) != 0)
    cr_assert_fail("commitkvd did not start:\n%s", ckv_test_file_tail(d->log, 2000));
}

/* SIGTERM must drain and exit 0: a daemon that crashed or hung fails here. */
static inline void ckv_test_stop_clean(ckv_test_daemon *d) {
  cr_assert(ckv_test_daemon_alive(d), "commitkvd died during the test:\n%s", ckv_test_file_tail(d->log, 2000));
  int rc = ckv_test_daemon_stop(d);
  cr_assert_eq(rc, 0, "commitkvd did not exit cleanly on SIGTERM (status %d)", rc);
}

/* ckv_test_fork_as, failing the test when there is no child. */
static inline pid_t ckv_test_begin_as(uid_t uid, gid_t gid, ckv_test_child_fn fn, const void *ctx, size_t report_len,
                                      int *ret_fd) {
  pid_t pid = ckv_test_fork_as(uid, gid, fn, ctx, report_len, ret_fd);
  cr_assert_geq(pid, 0, "cannot fork a child for uid %u: %s", (unsigned)uid, strerror(errno));
  return pid;
}

/* ckv_test_collect, failing the test unless the child exited 0 within
 * timeout_ms, took its uid and sent its whole report. */
static inline void ckv_test_end_as(pid_t pid, int fd, void *report, size_t report_len, int timeout_ms) {
  ckv_test_child c = ckv_test_collect(pid, fd, report, report_len, timeout_ms);
  cr_assert_eq(c.status, 0, "the child exited with %d", c.status);
  cr_assert_eq(c.got, report_len, "the child's report is truncated (%zu of %zu bytes)", c.got, report_len);
  cr_assert_eq(c.switch_errno, 0, "the child could not switch uid: %s", strerror(c.switch_errno));
}

/* fn(ctx, report) in a child running as uid/gid; its report in `report`. */
static inline void ckv_test_run_as(uid_t uid, gid_t gid, ckv_test_child_fn fn, const void *ctx, void *report,
                                   size_t report_len, int timeout_ms) {
  int fd = -1;
  pid_t pid = ckv_test_begin_as(uid, gid, fn, ctx, report_len, &fd);
  ckv_test_end_as(pid, fd, report, report_len, timeout_ms);
}

/* Under ASan, LeakSanitizer's report at exit does not fail a Criterion test:
 * `TestSuite(name, .fini = ckv_test_leak_check)` checks after every test and
 * crashes the test's worker on a leak, which Criterion counts. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
static inline void ckv_test_leak_check(void) {
  if (__lsan_do_recoverable_leak_check()) abort();
}
#else
static inline void ckv_test_leak_check(void) {}
#endif

#endif
