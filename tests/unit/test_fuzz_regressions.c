/* tests/unit/test_fuzz_regressions.c - every fuzz target's seeds and every
 * reproducer of a finding, replayed through the target's entry point
 * (tests/fuzz/fuzz_<name>.c, built here with gcc and this build's flags, ASan
 * in build-asan), so `make test` fails when a fixed finding comes back.
 *
 * Files: tests/fuzz/corpus/<name>/ (the seeds `make fuzz` starts from) and
 * tests/fuzz/regressions/<name>/ (one file per finding; its name says what
 * it found).  A target abort()s on a failed check of its own and ASan/UBSan
 * abort on memory errors, either of which fails the test; the file being
 * replayed is logged first. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

typedef int (*entry_fn)(const uint8_t *, size_t);

static uint8_t *read_all(const char *path, size_t *ret_n) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  size_t cap = 4096, n = 0;
  uint8_t *b = malloc(cap);
  cr_assert_not_null(b);
  size_t got;
  while ((got = fread(b + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      cap *= 2;
      b = realloc(b, cap);
      cr_assert_not_null(b);
    }
  }
  fclose(f);
  *ret_n = n;
  return b;
}

/* Replays every file of tests/fuzz/<kind>/<name>/; returns how many. */
static size_t replay_dir(const char *kind, const char *name, entry_fn fn) {
  const char *src = getenv("CKV_SOURCE_DIR");
  cr_assert_not_null(src, "CKV_SOURCE_DIR is not set (ctest sets it)");
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/tests/fuzz/%s/%s", src, kind, name);
  DIR *d = opendir(dir);
  if (!d) return 0;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[2048];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    size_t len = 0;
    uint8_t *data = read_all(path, &len);
    cr_log_info("fuzz_%s: %s/%s (%zu bytes)", name, kind, e->d_name, len);
    fflush(stderr);
    cr_assert_eq(fn(data, len), 0, "%s", path);
    free(data);
    n++;
  }
  closedir(d);
  return n;
}

static void replay(const char *name, entry_fn fn) {
  size_t seeds = replay_dir("corpus", name, fn);
  replay_dir("regressions", name, fn);
  cr_expect_gt(seeds, 0, "no seeds in tests/fuzz/corpus/%s", name);
}

Test(fuzz_regressions, requests) { replay("requests", ckv_fuzz_requests); }
Test(fuzz_regressions, arena) { replay("arena", ckv_fuzz_arena); }
Test(fuzz_regressions, attach_frame) { replay("attach_frame", ckv_fuzz_attach_frame); }
Test(fuzz_regressions, config) { replay("config", ckv_fuzz_config); }
Test(fuzz_regressions, mlp_weights) { replay("mlp_weights", ckv_fuzz_mlp_weights); }
Test(fuzz_regressions, trace) { replay("trace", ckv_fuzz_trace); }
Test(fuzz_regressions, snapshot) { replay("snapshot", ckv_fuzz_snapshot); }
