/* test_backend.c - daemon/backend.c: which arena backend commitkvd runs on.
 *
 * Runs everywhere.  Without a GPU (here and in CI): auto resolves to host with
 * a reason naming the missing driver or device, cuda fails cleanly
 * (CKV_ERR_DEVICE, or CKV_ERR_UNSUPPORTED in a build without CUDA), the CUDA
 * arena refuses to create or import with an error instead of a crash, and the
 * real daemon refuses `--backend cuda` at start and serves on host with
 * `--backend auto`.  With a GPU the same tests check the other side (auto and
 * cuda pick CUDA); tests that only make sense on one side report themselves
 * skipped.  CUDA is touched only inside tests (Criterion forks workers). */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commitkv/status.h"
#include "daemon/backend.h"
#include "daemon/config.h"
#include "shm/arena.h"
#include "testutil.h"
#ifdef CKV_HAVE_CUDA_ARENA
#include "shm/arena_cuda.h"
#endif

/* Case-insensitive strstr. */
static int has(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; hay && *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return 1;
  }
  return 0;
}

/* 1 when a usable CUDA device 0 exists in this build; reason says why not. */
static int gpu_present(char *reason, size_t len) {
#ifdef CKV_HAVE_CUDA_ARENA
  return ckv_cuda_probe(0, NULL, reason, len) == CKV_OK;
#else
  snprintf(reason, len, "built without CUDA");
  return 0;
#endif
}

Test(backend, host_is_host) {
  const ckv_arena_backend *be = NULL;
  char name[16], why[512];
  cr_assert_eq(ckv_backend_select(CKV_BACKEND_HOST, 0, &be, name, sizeof name, why, sizeof why), CKV_OK);
  cr_assert_eq(be, &ckv_arena_host_backend);
  cr_assert_str_eq(name, "host");
  cr_assert(why[0]);
}

Test(backend, bad_arguments) {
  const ckv_arena_backend *be = NULL;
  char why[512];
  cr_assert_eq(ckv_backend_select(CKV_BACKEND_HOST, 0, NULL, NULL, 0, NULL, 0), CKV_ERR_INVALID);
  cr_assert_eq(ckv_backend_select(42, 0, &be, NULL, 0, why, sizeof why), CKV_ERR_INVALID);
  cr_assert_null(be);
  /* NULL name and reason buffers are allowed. */
  cr_assert_eq(ckv_backend_select(CKV_BACKEND_HOST, 0, &be, NULL, 0, NULL, 0), CKV_OK);
}

Test(backend, auto_resolves) {
  char probe[512];
  int gpu = gpu_present(probe, sizeof probe);
  const ckv_arena_backend *be = NULL;
  char name[16] = "", why[1024] = "";
  cr_assert_eq(ckv_backend_select(CKV_BACKEND_AUTO, 0, &be, name, sizeof name, why, sizeof why), CKV_OK, "%s", why);
  cr_log_info("auto -> %s: %s", name, why);
  if (gpu) {
    cr_assert_str_eq(name, "cuda", "a GPU is present (%s) but auto chose %s: %s", probe, name, why);
    cr_assert_eq(ckv_arena_backend_find("cuda"), be, "the cuda backend must be registered when selected");
    return;
  }
  cr_assert_str_eq(name, "host");
  cr_assert_eq(be, &ckv_arena_host_backend);
  cr_assert(has(why, "auto"), "reason: %s", why);
  cr_assert(has(why, "driver") || has(why, "device") || has(why, "without CUDA"), "reason names no cause: %s", why);
}

Test(backend, cuda_fails_cleanly_without_gpu) {
  char probe[512];
  if (gpu_present(probe, sizeof probe)) cr_skip_test("a CUDA device is present: %s", probe);
  const ckv_arena_backend *be = NULL;
  char name[16] = "unchanged", why[1024] = "";
  int r = ckv_backend_select(CKV_BACKEND_CUDA, 0, &be, name, sizeof name, why, sizeof why);
  cr_log_info("cuda -> %s: %s", ckv_status_name(r), why);
#ifdef CKV_HAVE_CUDA_ARENA
  cr_assert_eq(r, CKV_ERR_DEVICE, "got %s: %s", ckv_status_name(r), why);
  cr_assert(has(why, "driver") || has(why, "device"), "reason: %s", why);
  cr_assert_null(ckv_arena_backend_find("cuda"), "nothing registered on failure");
#else
  cr_assert_eq(r, CKV_ERR_UNSUPPORTED, "got %s: %s", ckv_status_name(r), why);
  cr_assert(has(why, "without CUDA"), "reason: %s", why);
#endif
  cr_assert_null(be);
  cr_assert_str_eq(name, "unchanged");
  cr_assert(has(why, "cuda"), "reason: %s", why);
}

Test(backend, cuda_on_gpu) {
  char probe[512];
  if (!gpu_present(probe, sizeof probe)) cr_skip_test("no CUDA device: %s", probe);
#ifdef CKV_HAVE_CUDA_ARENA
  const ckv_arena_backend *be = NULL;
  char name[16], why[1024];
  cr_assert_eq(ckv_backend_select(CKV_BACKEND_CUDA, 0, &be, name, sizeof name, why, sizeof why), CKV_OK, "%s", why);
  cr_assert_str_eq(name, "cuda");
  cr_assert(has(why, "vmm") || has(why, "legacy-ipc"), "the reason names the sharing path: %s", why);
  cr_log_info("cuda: %s", why);
  /* A device that does not exist fails with a reason, whatever the machine. */
  cr_assert_eq(ckv_backend_select(CKV_BACKEND_CUDA, 1023, &be, name, sizeof name, why, sizeof why), CKV_ERR_DEVICE);
  cr_assert(has(why, "1023"), "%s", why);
#endif
}

Test(cuda_arena, refuses_without_driver) {
#ifndef CKV_HAVE_CUDA_ARENA
  cr_skip_test("built without CUDA: no CUDA arena to check");
#else
  char probe[512];
  if (ckv_cuda_probe(0, NULL, probe, sizeof probe) == CKV_OK) cr_skip_test("a CUDA device is present: %s", probe);
  cr_assert(has(probe, "cudaGetDeviceCount") || has(probe, "device"), "probe reason: %s", probe);
  char uuid[CKV_CUDA_UUID_STR] = "untouched";
  cr_assert_eq(ckv_cuda_probe(0, uuid, NULL, 0), CKV_ERR_DEVICE);
  cr_assert_str_eq(uuid, "untouched");

  char why[512];
  cr_assert_eq(ckv_arena_cuda_init(0, why, sizeof why), CKV_ERR_DEVICE);
  cr_assert(why[0]);
  cr_assert_eq(ckv_arena_cuda_path(), CKV_CUDA_PATH_NONE);

  /* Create goes through the generic code and fails with a code, not a crash. */
  ckv_arena *a = NULL;
  int r = ckv_arena_new(&ckv_arena_cuda_backend, 1u << 20, "t", &a);
  cr_assert_eq(r, CKV_ERR_DEVICE, "create: %s (%s)", ckv_status_name(r), ckv_arena_cuda_last_error());
  cr_assert_null(a);
  cr_assert(ckv_arena_cuda_last_error()[0], "a reason for the failure");

  /* An import of something that claims to be a CUDA arena is refused too. */
  r = ckv_arena_backend_register(&ckv_arena_cuda_backend);
  cr_assert(r == CKV_OK || r == CKV_ERR_EXISTS);
  ckv_arena_desc d;
  memset(&d, 0, sizeof d);
  snprintf(d.kind, sizeof d.kind, "cuda");
  d.bytes = CKV_CUDA_ARENA_GRANULARITY;
  d.committed = CKV_CUDA_ARENA_GRANULARITY;
  d.generation = 1;
  d.handle_len = 96;
  memset(d.handle, 0xab, d.handle_len);
  r = ckv_arena_import(&d, &a);
  cr_assert(r == CKV_ERR_FORMAT || r == CKV_ERR_DEVICE, "import: %s", ckv_status_name(r));
  cr_assert_null(a);
  d.handle_len = 7; /* wrong size */
  cr_assert_eq(ckv_arena_import(&d, &a), CKV_ERR_FORMAT);
  char u[CKV_CUDA_UUID_STR];
  cr_assert_eq(ckv_arena_cuda_desc_uuid(&d, u), CKV_ERR_FORMAT);
  /* Sizes that are not granularity multiples never reach the backend. */
  d.bytes = CKV_CUDA_ARENA_GRANULARITY + 4096;
  cr_assert_eq(ckv_arena_import(&d, &a), CKV_ERR_FORMAT);
#endif
}

/* ---- the real daemon ---- */

Test(daemon_backend, cuda_refused_at_start_without_gpu, .timeout = 30) {
  char probe[512];
  if (gpu_present(probe, sizeof probe)) cr_skip_test("a CUDA device is present: %s", probe);
  char *dir = ckv_test_tmpdir("ckv-backend");
  char sock[300], attach[300], log[300];
  snprintf(sock, sizeof sock, "ipc://%s/commitkvd.sock", dir);
  snprintf(attach, sizeof attach, "%s/commitkvd.attach", dir);
  snprintf(log, sizeof log, "%s/commitkvd.log", dir);
  const char *argv[] = {"commitkvd", "--socket", sock, "--attach-socket", attach, "--state-dir", dir,
                        "--backend", "cuda", "--memory", "64M", NULL};
  pid_t pid = ckv_test_spawn(argv, log);
  cr_assert_gt(pid, 0);
  int rc = ckv_test_wait(pid, 15000);
  char *out = ckv_test_read_file(log);
  cr_log_info("commitkvd --backend cuda: exit %d: %s", rc, out ? out : "(no output)");
  cr_assert_neq(rc, -1, "commitkvd --backend cuda did not exit (it must fail at start without a GPU)");
  cr_assert_neq(rc, 0, "commitkvd --backend cuda must fail without a GPU");
  cr_assert_lt(rc, 128, "commitkvd --backend cuda crashed (signal %d) instead of failing cleanly", rc - 128);
  cr_assert(out && has(out, "cuda"), "stderr must say why: %s", out ? out : "");
  free(out);
  struct stat st;
  cr_assert_neq(stat(attach, &st), 0, "no attach socket: it never served");
  ckv_test_rmdir(dir);
}

Test(daemon_backend, auto_serves, .timeout = 30) {
  char probe[512];
  int gpu = gpu_present(probe, sizeof probe);
  ckv_test_daemon d;
  const char *extra[] = {"--backend", "auto", "--memory", "64M", NULL};
  int r = ckv_test_daemon_start(&d, extra);
  char *out = ckv_test_read_file(d.log);
  cr_assert_eq(r, 0, "commitkvd --backend auto did not start: %s", out ? out : "");
  free(out);
  cr_assert(ckv_test_daemon_alive(&d));
  const char *args[] = {"status", NULL};
  char *st = ckv_test_ctl(&d, args);
  cr_assert_not_null(st, "commitkvctl status failed");
  cr_log_info("%s", st);
  const char *line = strstr(st, "backend");
  cr_assert_not_null(line, "status has no backend line: %s", st);
  if (gpu)
    cr_assert(strncmp(line, "backend   cuda:", 15) == 0, "GPU present (%s) but: %s", probe, line);
  else
    cr_assert(strncmp(line, "backend   host:", 15) == 0, "expected host: %s", line);
  free(st);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}
