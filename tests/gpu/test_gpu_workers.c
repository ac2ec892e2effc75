/* test_gpu_workers.c - commitkvd serving KV from GPU memory (--backend cuda)
 * to real GPU worker processes.
 *
 *  - two commitkv-gpu-worker processes, one session each, write K/V from
 *    device buffers on CUDA streams, run the fused attention kernel on the
 *    views straight from the arena and check it against the CPU kernel on
 *    copies of the same blocks, round after round, until draft, staged and
 *    committed blocks have all been read (--expect-formats);
 *  - a GPU worker killed with SIGKILL while it holds memory: its session is
 *    detached, then every byte returns to the arena;
 *  - libcommitkv in this process: memory kind, synchronous and stream-ordered
 *    K/V writes read back byte for byte through the view (device pointers),
 *    ack after a stream; and on a host daemon a stream is refused.
 *
 * CPU/GPU quantization bytes are tests/unit/test_kernels_cuda.c's job
 * (transitions_same_bytes), not repeated here.  CUDA is initialised inside
 * each test (Criterion forks); without a GPU every test is skipped, visibly. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testcheck.h"
#include "testutil.h"

#ifndef CKV_HAVE_CUDA_KERNELS
Test(gpu_workers, all) {
  cr_skip_test("no CUDA device: this build has no CUDA kernels (CKV_WITH_CUDA=OFF or no nvcc)");
}
#else
#include <cuda_runtime_api.h>

#include "commitkv/commitkv.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/format.h"

static void need_gpu(void) {
  if (ckv_cuda_available() != CKV_OK) cr_skip_test("no CUDA device: %s", ckv_cuda_unavailable_reason());
}

/* GPU memory, a short lease and detach keep (the kill test waits for both),
 * no metrics listener. */
static void start_cuda_daemon(ckv_test_daemon *d) {
  static const char *const args[] = {"--backend", "cuda", "--set", "daemon.memory=512M", "--set", "daemon.lease=3s",
                                     "--set", "daemon.heartbeat=500ms", "--set", "daemon.detach_keep=6s", NULL};
  if (ckv_test_daemon_start(d, args) != 0) {
    char *log = ckv_test_file_tail(d->log, 3000);
    cr_assert_fail("commitkvd --backend cuda did not start; its log:\n%s", log);
  }
}

static void need_worker_binary(void) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/commitkv-gpu-worker", ckv_test_bin_dir());
  cr_assert_eq(access(path, X_OK), 0, "%s is not built (cmake --build ... --target commitkv-gpu-worker)", path);
}

static pid_t spawn_gpu_worker(const ckv_test_daemon *d, const char *session, const char *rounds, const char *seed,
                              const char *pause_ms, char *out, size_t out_len) {
  snprintf(out, out_len, "%s/%s.out", d->dir, session);
  const char *argv[24] = {"commitkv-gpu-worker", "--socket", d->socket, "--attach-socket", d->attach,
                          "--session", session, "--rounds", rounds, "--tokens", "32", "--seed", seed, "--quiet"};
  int n = 14;
  if (pause_ms) {
    argv[n++] = "--pause-ms";
    argv[n++] = pause_ms;
  } else {
    argv[n++] = "--expect-formats";
  }
  argv[n] = NULL;
  return ckv_test_spawn(argv, out);
}

Test(gpu_workers, two_workers_gpu_attention_matches_cpu_on_every_format, .timeout = 200) {
  need_gpu();
  need_worker_binary();
  ckv_test_daemon d;
  start_cuda_daemon(&d);
  const char *args[] = {"stats", "--json", NULL};
  char *json = ckv_test_ctl(&d, args);
  cr_assert_not_null(json);
  cr_expect_not_null(strstr(json, "\"cuda\""), "the daemon's arena is not CUDA memory: %s", json);
  free(json);
  char out[2][400];
  pid_t w[2];
  w[0] = spawn_gpu_worker(&d, "gpu0", "24", "1", NULL, out[0], sizeof(out[0]));
  w[1] = spawn_gpu_worker(&d, "gpu1", "24", "2", NULL, out[1], sizeof(out[1]));
  for (int i = 0; i < 2; i++) {
    int rc = ckv_test_wait(w[i], 150000);
    char *text = ckv_test_file_tail(out[i], 3000);
    cr_expect_eq(rc, 0, "gpu worker %d exited %d:\n%s", i, rc, text);
    cr_expect_not_null(strstr(text, "\"ok\": true"), "gpu worker %d printed no successful summary:\n%s", i, text);
    const char *line = strstr(text, "{\"worker\"");
    if (line) printf("[metric] gpu worker %d: %.*s\n", i, (int)strcspn(line, "\n"), line);
    free(text);
  }
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}

Test(gpu_workers, killed_gpu_worker_memory_returns, .timeout = 180) {
  need_gpu();
  need_worker_binary();
  ckv_test_daemon d;
  start_cuda_daemon(&d);
  char out[400];
  pid_t victim = spawn_gpu_worker(&d, "victim", "8", "3", "60000", out, sizeof(out));
  /* Wait until it pauses in the middle of a round: memory held, K/V written. */
  long long end = ckv_test_now_ms() + 90000;
  bool paused = false;
  while (!paused && ckv_test_now_ms() < end) {
    char *text = ckv_test_read_file(out); /* NULL until the worker has created it */
    paused = text && strstr(text, "pausing") != NULL;
    free(text);
    if (!paused) {
      cr_assert(ckv_test_daemon_alive(&d), "commitkvd died");
      usleep(100000);
    }
  }
  char *text = ckv_test_file_tail(out, 3000);
  cr_assert(paused, "the gpu worker never reached its pause:\n%s", text);
  free(text);
  unsigned long long used = ckv_test_stat(&d, "arenas.0.bytes_used");
  cr_expect_gt(used, 0, "the paused worker holds no memory");
  cr_assert_eq(kill(victim, SIGKILL), 0);
  cr_expect_eq(ckv_test_wait(victim, 10000), 128 + SIGKILL);
  cr_expect_eq(ckv_test_wait_stat(&d, "detached_sessions", 1, 10000), 0,
               "the dead worker's session should be detached, kept for resume");
  cr_expect_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 30000), 0,
               "the dead gpu worker's bytes never returned to the arena (%llu bytes were in use)", used);
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 0);
  cr_expect(ckv_test_daemon_alive(&d), "commitkvd died with its worker");
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

#define CHECK_CUDA(call) cr_assert_eq((call), cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))

static uint16_t pattern(uint64_t pos, uint32_t layer, uint32_t kv, uint32_t i) {
  uint64_t x = (pos << 20) ^ ((uint64_t)layer << 8) ^ ((uint64_t)kv << 7) ^ ((uint64_t)i << 40) ^ 0x5bd1e995u;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint16_t)x;
}

Test(gpu_workers, client_api_on_gpu_memory, .timeout = 120) {
  need_gpu();
  ckv_test_daemon d;
  start_cuda_daemon(&d);
  ckv_client_options o = {.socket = d.socket, .attach_socket = d.attach, .name = "test_gpu_workers"};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s: %s", ckv_strerror(r), ckv_client_connect_error());
  cr_assert_str_eq(ckv_client_memory_kind(c), "cuda");
  const ckv_geometry g = {2, 2, 64, CKV_DTYPE_FP16};
  ckv_session *s = NULL;
  r = ckv_session_open(c, "api", &g, NULL, &s);
  cr_assert_eq(r, CKV_OK, "open: %s: %s", ckv_strerror(r), ckv_client_last_error(c));
  enum { N = 20 };
  uint64_t first = 0;
  cr_assert_eq(ckv_session_append(s, N, NULL, NULL, NULL, NULL, &first), CKV_OK);
  const size_t elems = ckv_draft_token_elems(&g), per_pos = (size_t)g.n_layers * 2 * elems;
  uint16_t *host = malloc(N * per_pos * 2), *dev = NULL;
  cr_assert_not_null(host);
  for (uint64_t p = 0; p < N; p++)
    for (uint32_t l = 0; l < g.n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t i = 0; i < elems; i++)
          host[p * per_pos + ((size_t)l * 2 + kv) * elems + i] = pattern(first + p, l, kv, i);
  CHECK_CUDA(cudaMalloc((void **)&dev, N * per_pos * 2));
  CHECK_CUDA(cudaMemcpy(dev, host, N * per_pos * 2, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  /* position 0: synchronous from host memory; 1: synchronous from device
   * memory; the rest on a stream from device memory (and one from host). */
  for (uint64_t p = 0; p < N; p++)
    for (uint32_t l = 0; l < g.n_layers; l++) {
      size_t at = p * per_pos + (size_t)l * 2 * elems;
      if (p == 0)
        r = ckv_session_write_kv(s, first + p, l, host + at, host + at + elems);
      else if (p == 1)
        r = ckv_session_write_kv(s, first + p, l, dev + at, dev + at + elems);
      else if (p == 2)
        r = ckv_session_write_kv_async(s, first + p, l, host + at, host + at + elems, st);
      else
        r = ckv_session_write_kv_async(s, first + p, l, dev + at, dev + at + elems, p % 2 ? st : NULL);
      cr_assert_eq(r, CKV_OK, "write position %llu layer %u: %s: %s", (unsigned long long)p, l, ckv_strerror(r),
                   ckv_client_last_error(c));
    }
  cr_expect_eq(ckv_session_write_kv_async(s, first + N, 0, dev, dev, st), CKV_ERR_RANGE, "no slot past the tokens");
  float attn[N];
  for (int i = 0; i < N; i++) attn[i] = 1.0f / N;
  ckv_round_result rr;
  r = ckv_session_report(s, 1, first, attn, N, &rr); /* waits for st and the default stream */
  cr_assert_eq(r, CKV_OK, "report: %s: %s", ckv_strerror(r), ckv_client_last_error(c));
  /* Every position reads back through the view's device pointers. */
  const ckv_view *v = NULL;
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  bool seen[N] = {false};
  for (size_t b = 0; b < v->n_draft; b++) {
    uint8_t *blk = malloc(v->draft[b].bytes);
    cr_assert_not_null(blk);
    CHECK_CUDA(cudaMemcpy(blk, v->draft[b].data, v->draft[b].bytes, cudaMemcpyDeviceToHost));
    const ckv_block_header *h = (const ckv_block_header *)blk;
    cr_assert_eq(h->magic, CKV_BLOCK_MAGIC);
    const uint32_t *positions = (const uint32_t *)(blk + ckv_block_positions_offset());
    const uint64_t *bits = (const uint64_t *)(blk + ckv_block_bitmap_offset(h->capacity));
    for (uint32_t sl = 0; sl < h->capacity; sl++) {
      if (!((bits[sl / 64] >> (sl % 64)) & 1u)) continue;
      uint64_t p = positions[sl] - first;
      if (p >= N) continue;
      seen[p] = true;
      for (uint32_t l = 0; l < g.n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
          cr_expect_eq(memcmp(blk + ckv_draft_kv_offset(&g, h->capacity, l, kv, sl),
                              host + p * per_pos + ((size_t)l * 2 + kv) * elems, elems * 2),
                       0, "position %llu layer %u kv %u reads back other bytes", (unsigned long long)p, l, kv);
    }
    free(blk);
  }
  for (int p = 0; p < N; p++) cr_expect(seen[p], "position %d is in no draft block of the view", p);
  uint64_t reclaimed = 0;
  cr_expect_eq(ckv_session_ack_after_stream(s, v->epoch, st, &reclaimed), CKV_OK);
  cr_expect_eq(ckv_session_ack_after_stream(s, v->epoch, NULL, NULL), CKV_OK);
  cr_expect_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);

  /* A host daemon: host pointers, no streams. */
  static const char *const host_args[] = {"--backend", "host", NULL};
  cr_assert_eq(ckv_test_daemon_start(&d, host_args), 0, "commitkvd --backend host did not start");
  o.socket = d.socket, o.attach_socket = d.attach;
  cr_assert_eq(ckv_client_connect(&o, &c), CKV_OK);
  cr_expect_str_eq(ckv_client_memory_kind(c), "host");
  cr_assert_eq(ckv_session_open(c, "api-host", &g, NULL, &s), CKV_OK);
  cr_assert_eq(ckv_session_append(s, 1, NULL, NULL, NULL, NULL, &first), CKV_OK);
  cr_expect_eq(ckv_session_write_kv_async(s, first, 0, host, host + elems, st), CKV_ERR_UNSUPPORTED);
  cr_expect_eq(ckv_session_write_kv_async(s, first, 0, host, host + elems, NULL), CKV_OK);
  cr_expect_eq(memcmp(ckv_session_kv_ptr(s, first, 0, 0), host, elems * 2), 0);
  cr_expect_eq(ckv_session_ack_after_stream(s, ckv_session_epoch(s), st, NULL), CKV_OK);
  cr_expect_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
  cudaStreamDestroy(st);
  cudaFree(dev);
  free(host);
}
#endif
