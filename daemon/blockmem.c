/* daemon/blockmem.c - host blockmems (see blockmem.h).  The CUDA one lives in
 * blockmem_cuda.c, compiled only with the CUDA kernels. */
#include "daemon/blockmem.h"

#include <string.h>

#include "commitkv/status.h"
#include "daemon/compact.h"

static int host_write(void *base, const ckv_meta_write *w, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint8_t *dst = (uint8_t *)base + w[i].offset;
    if (w[i].bytes) memcpy(dst, w[i].src, w[i].bytes);
    if (w[i].zero_bytes) memset(dst + w[i].bytes, 0, w[i].zero_bytes);
  }
  __atomic_thread_fence(__ATOMIC_RELEASE);
  return CKV_OK;
}

static int host_run(const ckv_geometry *g, const ckv_move *moves, size_t n, int copy) {
  return copy ? ckv_copy_slots(g, moves, n) : ckv_kernels_move(g, moves, n, 0);
}

const ckv_blockmem ckv_blockmem_host = {.name = "host", .write = host_write, .run = host_run};

#ifndef CKV_HAVE_CUDA_KERNELS
const ckv_blockmem *ckv_blockmem_cuda(uint32_t device) {
  (void)device;
  return NULL;
}
#endif
