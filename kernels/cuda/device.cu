/* device.cu - is there a usable GPU, and small host helpers shared by the
 * CUDA kernels.  Links against the static runtime only: without a driver,
 * cudaGetDeviceCount fails and we report CKV_ERR_DEVICE with its reason. */
#include "kernels/cuda/cuda_internal.h"

static const char *g_reason = "not probed yet";

extern "C" ckv_status ckv_cuda_available(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    g_reason = cudaGetErrorString(e);
    (void)cudaGetLastError(); /* clear the sticky error for later calls */
    return CKV_ERR_DEVICE;
  }
  if (n == 0) {
    g_reason = "no CUDA device";
    return CKV_ERR_DEVICE;
  }
  g_reason = "available";
  return CKV_OK;
}

extern "C" const char *ckv_cuda_unavailable_reason(void) { return g_reason; }

ckv_status ckv_cuda_fetch_header(const void *blk, ckv_block_header *ret) {
  if (!blk) return CKV_ERR_INVALID;
  CKV_CUDA_TRY(cudaMemcpy(ret, blk, sizeof *ret, cudaMemcpyDeviceToHost));
  return CKV_OK;
}
