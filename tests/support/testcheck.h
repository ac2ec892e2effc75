/* testcheck.h - Criterion-side helpers shared by the suites (testutil.h is
 * plain C; these assert with Criterion). */
#ifndef CKV_TESTCHECK_H
#define CKV_TESTCHECK_H

#include <criterion/criterion.h>
#include <stdlib.h>
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
