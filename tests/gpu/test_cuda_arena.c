/* test_cuda_arena.c - the CUDA arena across processes, on a real GPU.
 *
 * For each sharing path (vmm, legacy-ipc, forced with CKV_CUDA_ARENA_PATH):
 *  - share: the parent creates an arena and exports it; a child imports it
 *    (fds over SCM_RIGHTS, the handle blob in the frame), writes on the GPU;
 *    the parent reads the bytes back.  The child also checks that a desc
 *    with another arena's generation, another device's UUID or a forged
 *    handle is refused (a tenant cannot map another tenant's arena).
 *  - killed importer: the child imports and is killed -9; the memory stays
 *    the exporter's (its bytes intact) and returns to the device when the
 *    arena is freed.
 *  - own import: importing in the creating process works (legacy IPC forbids
 *    opening one's own handle: the backend must share the owner's mapping).
 *
 * CUDA is not fork-safe: every fork happens before this process touches CUDA
 * (the GPU check itself runs in a throwaway child), and the child creates its
 * context only after the fork.  Without a GPU every test is skipped, visibly. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "shm/arena.h"
#include "shm/fdpass.h"

#ifndef CKV_HAVE_CUDA_ARENA
Test(cuda_arena, all) { cr_skip_test("no CUDA device: this build has no CUDA arena (CKV_WITH_CUDA=OFF or no nvcc)"); }
#else
#include <cuda_runtime_api.h>

#include "shm/arena_cuda.h"

#define MIB (UINT64_C(1) << 20)
#define PATTERN_BYTES (1u << 20)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Probes the GPU in a throwaway child so that this process stays CUDA-free
 * (and may still fork children that use CUDA). */
static void need_gpu(void) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    char why[512];
    int r = ckv_cuda_probe(0, NULL, why, sizeof why);
    char msg[520];
    int n = snprintf(msg, sizeof msg, "%c%s", r == CKV_OK ? '1' : '0', why);
    if (write(p[1], msg, (size_t)n) < 0) _exit(2);
    _exit(0);
  }
  close(p[1]);
  char msg[520] = "";
  ssize_t n = read(p[0], msg, sizeof msg - 1);
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  if (n <= 0) cr_skip_test("no CUDA device: the probe process died (status %d)", st);
  msg[n] = 0;
  if (msg[0] != '1') cr_skip_test("no CUDA device: %s", msg + 1);
}

/* ---- the child (importer) ---- */

typedef struct reply {
  int code;        /* 0 = all checks passed */
  double import_ms; /* first import: CUDA context creation included */
  double warm_ms;   /* a second import of the same arena in the same process */
  char text[400];
} reply;

/* Wire form of a desc: everything but the fds, which travel as SCM_RIGHTS. */
typedef struct msg_desc {
  ckv_arena_desc d;
  ckv_arena_desc other; /* a second arena (another tenant's) */
  int hold;             /* 1: the parent will kill us instead of saying go */
} msg_desc;

static uint8_t pattern_at(size_t i) { return (uint8_t)(i * 7u + 3u); }

#define CHILD_CHECK(cond, ...)                            \
  do {                                                    \
    if (!(cond)) {                                        \
      rep.code = 1;                                       \
      snprintf(rep.text, sizeof rep.text, __VA_ARGS__);   \
      goto out;                                           \
    }                                                     \
  } while (0)

static int child_importer(int sock) {
  reply rep;
  memset(&rep, 0, sizeof rep);
  msg_desc m;
  size_t len = 0, n_fds = 0;
  int fds[2 * CKV_ARENA_MAX_FDS];
  ckv_arena *a = NULL, *x = NULL;
  uint8_t *host = NULL;
  int r = ckv_frame_recv(sock, &m, sizeof m, &len, fds, 2 * CKV_ARENA_MAX_FDS, &n_fds);
  if (r < 0 || len != sizeof m) return 3;
  /* fds: first the arena's, then the other arena's. */
  for (uint32_t i = 0; i < m.d.n_fds; i++) m.d.fds[i] = fds[i];
  for (uint32_t i = 0; i < m.other.n_fds; i++) m.other.fds[i] = fds[m.d.n_fds + i];
  if (m.d.n_fds + m.other.n_fds != n_fds) return 4;

  /* CUDA starts here, after the fork. */
  r = ckv_arena_backend_register(&ckv_arena_cuda_backend);
  CHILD_CHECK(r == CKV_OK || r == CKV_ERR_EXISTS, "register: %s", ckv_status_name(r));
  double t0 = now_ms();
  r = ckv_arena_import(&m.d, &a);
  rep.import_ms = now_ms() - t0;
  CHILD_CHECK(r == CKV_OK, "import: %s: %s", ckv_status_name(r), ckv_arena_cuda_last_error());
  CHILD_CHECK(!ckv_arena_is_owner(a), "imported arena claims ownership");
  CHILD_CHECK(ckv_arena_generation(a) == m.d.generation, "generation");
  CHILD_CHECK(ckv_arena_size(a) == m.d.bytes, "size");
  t0 = now_ms();
  r = ckv_arena_import(&m.d, &x);
  rep.warm_ms = now_ms() - t0;
  CHILD_CHECK(r == CKV_OK, "second import: %s: %s", ckv_status_name(r), ckv_arena_cuda_last_error());
  x = ckv_arena_free(x);

  /* Write on the GPU: a pattern copied in, then a device-side memset. */
  host = malloc(PATTERN_BYTES);
  CHILD_CHECK(host != NULL, "malloc");
  for (size_t i = 0; i < PATTERN_BYTES; i++) host[i] = pattern_at(i);
  uint8_t *base = ckv_arena_base(a);
  uint64_t off = ckv_arena_data_offset(a);
  cudaError_t ce = cudaMemcpy(base + off, host, PATTERN_BYTES, cudaMemcpyHostToDevice);
  if (ce == cudaSuccess) ce = cudaMemset(base + off + PATTERN_BYTES, 0x5a, PATTERN_BYTES);
  if (ce == cudaSuccess) ce = cudaDeviceSynchronize();
  CHILD_CHECK(ce == cudaSuccess, "GPU write: %s", cudaGetErrorString(ce));
  /* The last byte of the arena is addressable too. */
  uint8_t last = 0xee;
  ce = cudaMemcpy(base + ckv_arena_size(a) - 1, &last, 1, cudaMemcpyHostToDevice);
  if (ce == cudaSuccess) ce = cudaDeviceSynchronize(); /* landed before the parent reads it */
  CHILD_CHECK(ce == cudaSuccess, "GPU write at the end: %s", cudaGetErrorString(ce));

  /* Isolation: nothing but the exact export maps. */
  ckv_arena_desc bad = m.d;
  bad.generation ^= 1;
  r = ckv_arena_import(&bad, &x);
  CHILD_CHECK(r == CKV_ERR_FORMAT, "import with a wrong generation: %s", ckv_status_name(r));
  if (m.other.n_fds || m.other.handle_len) {
    bad = m.other;
    bad.generation = m.d.generation; /* the other tenant's memory under our arena's name */
    r = ckv_arena_import(&bad, &x);
    CHILD_CHECK(r == CKV_ERR_FORMAT, "other arena with our generation: %s", ckv_status_name(r));
  }
  bad = m.d;
  bad.handle[8] ^= 0xff; /* the device UUID */
  r = ckv_arena_import(&bad, &x);
  CHILD_CHECK(r == CKV_ERR_DEVICE, "import for another device: %s", ckv_status_name(r));
  bad = m.d;
  bad.handle_len = 64; /* truncated blob */
  r = ckv_arena_import(&bad, &x);
  CHILD_CHECK(r == CKV_ERR_FORMAT, "truncated handle: %s", ckv_status_name(r));
  if (m.d.n_fds) {
    /* A memfd is not CUDA memory. */
    int mfd = memfd_create("not-cuda", MFD_CLOEXEC);
    CHILD_CHECK(mfd >= 0 && ftruncate(mfd, (off_t)m.d.bytes) == 0, "memfd");
    bad = m.d;
    bad.fds[0] = mfd;
    r = ckv_arena_import(&bad, &x);
    close(mfd);
    CHILD_CHECK(r < 0, "import of a memfd as CUDA memory succeeded");
  } else {
    bad = m.d;
    for (int i = 32; i < 96; i++) bad.handle[i] ^= 0x5c; /* forged IPC handle */
    r = ckv_arena_import(&bad, &x);
    CHILD_CHECK(r < 0, "import of a forged IPC handle succeeded");
  }
  CHILD_CHECK(x == NULL, "a refused import returned an arena");
out:
  free(host);
  if (ckv_frame_send(sock, &rep, sizeof rep, NULL, 0) < 0) return 5;
  /* Wait for the parent's go before unmapping, so it reads while we map.
   * With hold set the parent never says go: it kills us while we wait here
   * (and if the parent dies first, the read returns 0 and we leave). */
  char go;
  (void)!read(sock, &go, 1);
  a = ckv_arena_free(a);
  return rep.code;
}

/* ---- the parent (exporter) ---- */

static void set_path(const char *path) { cr_assert_eq(setenv("CKV_CUDA_ARENA_PATH", path, 1), 0); }

static void init_cuda(const char *path) {
  char why[512];
  int r = ckv_arena_cuda_init(0, why, sizeof why);
  if (r != CKV_OK && strcmp(path, "vmm") == 0 && strstr(why, "VMM is unavailable"))
    cr_skip_test("no CUDA VMM on this device: %s", why);
  cr_assert_eq(r, CKV_OK, "ckv_arena_cuda_init: %s", why);
  cr_log_info("arena path: %s", why);
  int want = strcmp(path, "vmm") == 0 ? CKV_CUDA_PATH_VMM : CKV_CUDA_PATH_LEGACY_IPC;
  cr_assert_eq(ckv_arena_cuda_path(), want, "%s", why);
  r = ckv_arena_backend_register(&ckv_arena_cuda_backend);
  cr_assert(r == CKV_OK || r == CKV_ERR_EXISTS);
}

static pid_t spawn_child(int *ret_sock) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    _exit(child_importer(sv[1]));
  }
  close(sv[1]);
  *ret_sock = sv[0];
  return pid;
}

static void send_descs(int sock, ckv_arena *a, ckv_arena *other, int hold) {
  msg_desc m;
  memset(&m, 0, sizeof m);
  m.hold = hold;
  cr_assert_eq(ckv_arena_export(a, &m.d), CKV_OK);
  if (other) cr_assert_eq(ckv_arena_export(other, &m.other), CKV_OK);
  int fds[2 * CKV_ARENA_MAX_FDS];
  size_t n = 0;
  for (uint32_t i = 0; i < m.d.n_fds; i++) fds[n++] = m.d.fds[i];
  for (uint32_t i = 0; i < m.other.n_fds; i++) fds[n++] = m.other.fds[i];
  cr_assert_eq(ckv_frame_send(sock, &m, sizeof m, fds, n), CKV_OK);
}

static reply recv_reply(int sock) {
  reply rep;
  size_t len = 0, nf = 0;
  memset(&rep, 0, sizeof rep);
  int r = ckv_frame_recv(sock, &rep, sizeof rep, &len, NULL, 0, &nf);
  cr_assert_eq(r, CKV_OK, "no reply from the importer: %s", ckv_status_name(r));
  cr_assert_eq(len, sizeof rep);
  return rep;
}

static void check_written(ckv_arena *a) {
  uint8_t *host = malloc(2 * PATTERN_BYTES);
  cr_assert_not_null(host);
  uint8_t *base = ckv_arena_base(a);
  uint64_t off = ckv_arena_data_offset(a);
  cr_assert_eq(cudaMemcpy(host, base + off, 2 * PATTERN_BYTES, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < PATTERN_BYTES; i++)
    if (host[i] != pattern_at(i)) cr_assert_fail("byte %zu: %u, the importer wrote %u", i, host[i], pattern_at(i));
  for (size_t i = 0; i < PATTERN_BYTES; i++)
    if (host[PATTERN_BYTES + i] != 0x5a) cr_assert_fail("memset byte %zu: %u", i, host[PATTERN_BYTES + i]);
  uint8_t last = 0;
  cr_assert_eq(cudaMemcpy(&last, base + ckv_arena_size(a) - 1, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(last, 0xee);
  free(host);
}

static void share(const char *path) {
  need_gpu();
  set_path(path);
  int sock;
  pid_t pid = spawn_child(&sock); /* before any CUDA call here */
  init_cuda(path);
  ckv_arena *a = NULL, *b = NULL;
  cr_assert_eq(ckv_arena_new(&ckv_arena_cuda_backend, 64 * MIB, "tenant-a", &a), CKV_OK, "%s",
               ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_new(&ckv_arena_cuda_backend, 32 * MIB, "tenant-b", &b), CKV_OK, "%s",
               ckv_arena_cuda_last_error());
  /* The importer writes everywhere up to the last byte: back all of it. */
  cr_assert_eq(ckv_arena_grow(a, ckv_arena_size(a)), CKV_OK, "grow: %s", ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_grow(b, ckv_arena_size(b)), CKV_OK, "grow: %s", ckv_arena_cuda_last_error());
  /* Fresh memory reads as zero. */
  uint8_t z[4096];
  cr_assert_eq(cudaMemcpy(z, (uint8_t *)ckv_arena_base(a) + CKV_ARENA_HEADER_BYTES, sizeof z, cudaMemcpyDeviceToHost),
               cudaSuccess);
  for (size_t i = 0; i < sizeof z; i++) cr_assert_eq(z[i], 0, "fresh arena byte %zu is %u", i, z[i]);
  char uuid[CKV_CUDA_UUID_STR];
  ckv_arena_desc d;
  cr_assert_eq(ckv_arena_export(a, &d), CKV_OK);
  cr_assert_eq(ckv_arena_cuda_desc_uuid(&d, uuid), CKV_OK);
  cr_log_info("device uuid %s, arena %" PRIu64 " bytes, %u fds, handle %u bytes", uuid, d.bytes, d.n_fds, d.handle_len);
  uint64_t res = 0;
  cr_assert_eq(ckv_arena_resident(a, &res), CKV_OK);
  cr_assert_geq(res, ckv_arena_size(a));

  send_descs(sock, a, b, /* hold= */ 0);
  reply rep = recv_reply(sock);
  cr_assert_eq(rep.code, 0, "importer: %s", rep.text);
  printf("[metric] cuda arena import (%s, 64 MiB): first %.2f ms (CUDA context creation included), again %.3f ms\n",
         path, rep.import_ms, rep.warm_ms);
  fflush(stdout);
  check_written(a); /* while the child still maps it */
  cr_assert_eq(write(sock, "g", 1), 1);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "importer status %d", st);
  check_written(a); /* and after it unmapped */
  close(sock);
  b = ckv_arena_free(b);
  a = ckv_arena_free(a);
}

static size_t free_mem(void) {
  size_t f = 0, t = 0;
  cr_assert_eq(cudaMemGetInfo(&f, &t), cudaSuccess);
  return f;
}

static void killed_importer(const char *path) {
  need_gpu();
  set_path(path);
  int sock;
  pid_t pid = spawn_child(&sock);
  init_cuda(path);
  const uint64_t size = 512 * MIB, slack = 64 * MIB;
  size_t free0 = free_mem();
  ckv_arena *a = NULL;
  cr_assert_eq(ckv_arena_new(&ckv_arena_cuda_backend, size, "tenant-k", &a), CKV_OK, "%s",
               ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_grow(a, ckv_arena_size(a)), CKV_OK, "grow: %s", ckv_arena_cuda_last_error());
  size_t free1 = free_mem();
  cr_assert_geq((uint64_t)free0, (uint64_t)free1 + size - slack, "creating %" PRIu64 " MiB took only %zu MiB",
                size / MIB, (free0 - free1) >> 20);
  send_descs(sock, a, NULL, /* hold= */ 1);
  reply rep = recv_reply(sock);
  cr_assert_eq(rep.code, 0, "importer: %s", rep.text);
  cr_assert_eq(kill(pid, SIGKILL), 0);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  close(sock);
  /* Still the exporter's memory, bytes intact. */
  check_written(a);
  a = ckv_arena_free(a);
  /* The dead importer's context and the arena both go back to the device. */
  size_t free2 = 0;
  for (int i = 0; i < 100; i++) {
    free2 = free_mem();
    if ((uint64_t)free2 + slack >= (uint64_t)free0) break;
    usleep(50000);
  }
  cr_log_info("free: before %zu MiB, with arena %zu MiB, after free %zu MiB", free0 >> 20, free1 >> 20, free2 >> 20);
  cr_assert_geq((uint64_t)free2 + slack, (uint64_t)free0, "the arena's memory did not come back: %zu -> %zu MiB",
                free0 >> 20, free2 >> 20);
}

static void own_import(const char *path) {
  need_gpu();
  set_path(path);
  init_cuda(path);
  ckv_arena *a = NULL, *b = NULL, *c = NULL;
  cr_assert_eq(ckv_arena_new(&ckv_arena_cuda_backend, 8 * MIB, "own", &a), CKV_OK, "%s", ckv_arena_cuda_last_error());
  ckv_arena_desc d;
  cr_assert_eq(ckv_arena_export(a, &d), CKV_OK);
  cr_assert_eq(ckv_arena_import(&d, &b), CKV_OK, "own import: %s", ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_import(&d, &c), CKV_OK, "second own import: %s", ckv_arena_cuda_last_error());
  uint32_t v = 0xfeedbeef, w = 0;
  cr_assert_eq(cudaMemcpy((uint8_t *)ckv_arena_base(b) + 8192, &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(&w, (uint8_t *)ckv_arena_base(a) + 8192, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(w, v);
  /* The owner goes first: the importers' mappings stay valid. */
  a = ckv_arena_free(a);
  w = 0;
  cr_assert_eq(cudaMemcpy(&w, (uint8_t *)ckv_arena_base(c) + 8192, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(w, v);
  b = ckv_arena_free(b);
  c = ckv_arena_free(c);
}

/* Growth: only a prefix is backed at create (device memory taken as needed,
 * VMM); each grow maps one more chunk without moving the mapping, and an
 * importer maps the new chunks from a newer export. */
static void grow_and_refresh(const char *path) {
  need_gpu();
  set_path(path);
  init_cuda(path);
  const uint64_t size = 256 * MIB;
  size_t free0 = free_mem();
  ckv_arena *a = NULL, *b = NULL;
  cr_assert_eq(ckv_arena_new(&ckv_arena_cuda_backend, size, "grow", &a), CKV_OK, "%s", ckv_arena_cuda_last_error());
  uint64_t c0 = ckv_arena_committed(a);
  cr_assert_lt(c0, ckv_arena_size(a));
  if (strcmp(path, "vmm") == 0)
    cr_assert_lt((uint64_t)(free0 - free_mem()), size / 2, "VMM takes device memory as the arena grows");
  ckv_arena_desc d;
  cr_assert_eq(ckv_arena_export(a, &d), CKV_OK);
  cr_assert_eq(ckv_arena_import(&d, &b), CKV_OK, "import: %s", ckv_arena_cuda_last_error());
  void *base = ckv_arena_base(a);
  cr_assert_eq(ckv_arena_grow(a, 100 * MIB), CKV_OK, "grow: %s", ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_base(a), base, "growing moved the mapping");
  uint64_t c1 = ckv_arena_committed(a);
  cr_assert_geq(c1, 100 * MIB);
  uint32_t v = 0xc0ffee11, w = 0;
  cr_assert_eq(cudaMemcpy((uint8_t *)base + c1 - 4, &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  cr_assert_eq(ckv_arena_export(a, &d), CKV_OK);
  cr_assert_eq(d.committed, c1);
  cr_assert_eq(ckv_arena_refresh(b, &d), CKV_OK, "refresh: %s", ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_committed(b), c1);
  cr_assert_eq(cudaMemcpy(&w, (uint8_t *)ckv_arena_base(b) + c1 - 4, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(w, v, "the grown range is not shared");
  cr_assert_eq(ckv_arena_grow(a, ckv_arena_size(a)), CKV_OK, "grow to the end: %s", ckv_arena_cuda_last_error());
  cr_assert_eq(ckv_arena_export(a, &d), CKV_OK);
  cr_assert_leq(d.n_fds, CKV_ARENA_MAX_FDS);
  cr_assert_eq(ckv_arena_refresh(b, &d), CKV_OK, "refresh to the end: %s", ckv_arena_cuda_last_error());
  printf("[metric] cuda arena growth (%s): first prefix %" PRIu64 " MiB of %" PRIu64 " MiB, %u chunk fds at full size\n",
         path, c0 / MIB, size / MIB, d.n_fds);
  b = ckv_arena_free(b);
  a = ckv_arena_free(a);
}

Test(cuda_arena, grow_and_refresh_vmm, .timeout = 60) { grow_and_refresh("vmm"); }
Test(cuda_arena, grow_and_refresh_legacy_ipc, .timeout = 60) { grow_and_refresh("legacy"); }
Test(cuda_arena, share_vmm, .timeout = 120) { share("vmm"); }
Test(cuda_arena, share_legacy_ipc, .timeout = 120) { share("legacy"); }
Test(cuda_arena, killed_importer_vmm, .timeout = 120) { killed_importer("vmm"); }
Test(cuda_arena, killed_importer_legacy_ipc, .timeout = 120) { killed_importer("legacy"); }
Test(cuda_arena, own_import_vmm, .timeout = 60) { own_import("vmm"); }
Test(cuda_arena, own_import_legacy_ipc, .timeout = 60) { own_import("legacy"); }
#endif
