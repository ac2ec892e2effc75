/* daemon/blockmem_cuda.c - the CUDA blockmem (see blockmem.h): header
 * patches on a stream of the server thread, compressor jobs on a stream of
 * each compressor thread, completion by event.  Built only when the CUDA
 * kernels are (CKV_HAVE_CUDA_KERNELS); links the static CUDA runtime only. */
#ifdef CKV_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "store/blockmem.h"
#include "common/log.h"
#include "kernels/cuda/kernels_cuda.h"

static int g_device;

/* Errors after which the CUDA context is unusable for good: every later call
 * fails the same way.  The daemon cannot recover its sessions (their memory
 * is that context's), so it exits and lets systemd restart it; clients see
 * the restart and re-attach. */
static void exit_if_context_lost(const char *what) {
  cudaError_t e = cudaPeekAtLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize(); /* an error path only: a sticky error shows here */
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorHardwareStackError:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
      ckv_log(CKV_LOG_ERROR, "cuda-context-lost", NULL, NULL, "%s: %s (%d): the GPU context is gone; exiting",
              what, cudaGetErrorString(e), (int)e);
      _exit(EXIT_FAILURE);
    default: (void)cudaGetLastError(); /* a recoverable error: clear it */
  }
}

/* A thread's stream and completion event, made on the thread's first job. */
typedef struct thread_stream {
  cudaStream_t stream;
  cudaEvent_t done;
} thread_stream;

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

static void thread_stream_free(void *p) {
  thread_stream *ts = p;
  cudaEventDestroy(ts->done);
  cudaStreamDestroy(ts->stream);
  free(ts);
}

static void make_key(void) { (void)pthread_key_create(&g_key, thread_stream_free); }

static thread_stream *stream_of_thread(void) {
  pthread_once(&g_key_once, make_key);
  thread_stream *ts = pthread_getspecific(g_key);
  if (ts) return ts;
  if (cudaSetDevice(g_device) != cudaSuccess) return NULL;
  ts = calloc(1, sizeof(*ts));
  if (!ts) return NULL;
  if (cudaStreamCreateWithFlags(&ts->stream, cudaStreamNonBlocking) != cudaSuccess) {
    free(ts);
    return NULL;
  }
  /* Blocking sync: a waiting thread sleeps instead of spinning a core. */
  if (cudaEventCreateWithFlags(&ts->done, cudaEventDisableTiming | cudaEventBlockingSync) != cudaSuccess) {
    cudaStreamDestroy(ts->stream);
    free(ts);
    return NULL;
  }
  (void)pthread_setspecific(g_key, ts);
  /* Keep freed scratch in the pool: by default every synchronisation trims
   * it and the next header patch takes physical memory again. */
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, g_device) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  return ts;
}

static int cuda_write(void *base, const ckv_meta_write *w, size_t n) {
  thread_stream *ts = stream_of_thread();
  if (!ts) return CKV_ERR_DEVICE;
  ckv_cuda_patch stack[64], *p = n <= 64 ? stack : malloc(n * sizeof(*p));
  if (!p) return -ENOMEM;
  for (size_t i = 0; i < n; i++)
    p[i] = (ckv_cuda_patch){.dst = (uint8_t *)base + w[i].offset, .src = w[i].src, .bytes = w[i].bytes,
                            .zero_bytes = w[i].zero_bytes};
  int r = ckv_cuda_patch_apply(p, n, ts->stream);
  if (p != stack) free(p);
  if (r < 0) exit_if_context_lost("writing block headers");
  return r;
}

static int cuda_run(const ckv_geometry *g, const ckv_move *moves, size_t n, int copy) {
  thread_stream *ts = stream_of_thread();
  if (!ts) return CKV_ERR_DEVICE;
  int r = copy ? ckv_cuda_copy_slots(g, moves, n, ts->stream) : ckv_cuda_move(g, moves, n, 0, ts->stream);
  /* The epoch of this job is published only once the stream's work for it
   * has completed: an event behind the kernels, waited for here. */
  if (cudaEventRecord(ts->done, ts->stream) != cudaSuccess || cudaEventSynchronize(ts->done) != cudaSuccess) {
    exit_if_context_lost("compressing");
    return r < 0 ? r : CKV_ERR_DEVICE;
  }
  if (r < 0) exit_if_context_lost("compressing");
  return r;
}

static const ckv_blockmem cuda_blockmem = {.name = "cuda", .write = cuda_write, .run = cuda_run};

const ckv_blockmem *ckv_blockmem_cuda(uint32_t device) {
  g_device = (int)device;
  return &cuda_blockmem;
}
#endif
