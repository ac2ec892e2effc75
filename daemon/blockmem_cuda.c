/* daemon/blockmem_cuda.c - the CUDA blockmem (see blockmem.h): header
 * patches on a stream of the server thread, compressor jobs on a stream of
 * each compressor thread, completion by event.  Built only when the CUDA
 * kernels are (CKV_HAVE_CUDA_KERNELS); links the static CUDA runtime only. */
#ifdef CKV_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "commitkv/status.h"
#include "daemon/blockmem.h"
#include "kernels/cuda/kernels_cuda.h"

static int g_device;

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
  if (cudaEventCreateWithFlags(&ts->done, cudaEventDisableTiming) != cudaSuccess) {
    cudaStreamDestroy(ts->stream);
    free(ts);
    return NULL;
  }
  (void)pthread_setspecific(g_key, ts);
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
  return r;
}

static int cuda_run(const ckv_geometry *g, const ckv_move *moves, size_t n, int copy) {
  thread_stream *ts = stream_of_thread();
  if (!ts) return CKV_ERR_DEVICE;
  int r = copy ? ckv_cuda_copy_slots(g, moves, n, ts->stream) : ckv_cuda_move(g, moves, n, 0, ts->stream);
  /* The epoch of this job is published only once the stream's work for it
   * has completed: an event behind the kernels, waited for here. */
  if (cudaEventRecord(ts->done, ts->stream) != cudaSuccess || cudaEventSynchronize(ts->done) != cudaSuccess)
    return r < 0 ? r : CKV_ERR_DEVICE;
  return r;
}

static const ckv_blockmem cuda_blockmem = {.name = "cuda", .shadow = true, .write = cuda_write, .run = cuda_run};

const ckv_blockmem *ckv_blockmem_cuda(uint32_t device) {
  g_device = (int)device;
  return &cuda_blockmem;
}
#endif
