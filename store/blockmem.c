/* daemon/blockmem.c - host blockmems (see blockmem.h).  The CUDA one lives in
 * blockmem_cuda.c, compiled only with the CUDA kernels.
 *
 * Before a host job writes its destination blocks, their pages are made
 * present in the daemon's mapping with one MADV_POPULATE_WRITE per block
 * (Linux 5.14): a block in fresh arena memory then costs one batched call
 * instead of a page fault per 4 KiB inside the kernels (measured on shmem:
 * 256 MiB in 115-147 ms instead of 178-231 ms), and a block in warm memory
 * (tenant.c) costs a page-table walk.  Contents are not touched.  Without
 * the call (older kernels) the kernels fault the pages in as before. */
#include "store/blockmem.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#include "commitkv/status.h"
#include "store/compact.h"

static int host_write(void *base, const ckv_meta_write *w, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint8_t *dst = (uint8_t *)base + w[i].offset;
    if (w[i].bytes) memcpy(dst, w[i].src, w[i].bytes);
    if (w[i].zero_bytes) memset(dst + w[i].bytes, 0, w[i].zero_bytes);
  }
  __atomic_thread_fence(__ATOMIC_RELEASE);
  return CKV_OK;
}

static atomic_bool populate_unsupported;

/* Makes the pages of the blocks `moves` write present (see the top).  Moves
 * to one block are planned together, so remembering the last few blocks
 * finds nearly every repeat.  Advisory: a failure costs only the faults. */
static void populate_destinations(const ckv_geometry *g, const ckv_move *moves, size_t n) {
  if (atomic_load_explicit(&populate_unsupported, memory_order_relaxed)) return;
  enum { RECENT = 8 };
  const void *recent[RECENT] = {0};
  unsigned next = 0;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < n; i++) {
    const ckv_block_header *h = moves[i].dst_hdr;
    if (!h) continue; /* only the daemon's trusted records say how big a block is */
    bool seen = false;
    for (unsigned k = 0; k < RECENT && !seen; k++) seen = recent[k] == moves[i].dst;
    if (seen) continue;
    recent[next++ % RECENT] = moves[i].dst;
    size_t bytes = ckv_format_block_bytes(h->format, g, h->capacity, h->kept_channels);
    uintptr_t from = (uintptr_t)moves[i].dst / page * page, to = ((uintptr_t)moves[i].dst + bytes + page - 1) / page * page;
    if (bytes && madvise((void *)from, to - from, MADV_POPULATE_WRITE) < 0 && errno == EINVAL) {
      atomic_store_explicit(&populate_unsupported, true, memory_order_relaxed);
      return;
    }
  }
}

static int host_run(const ckv_geometry *g, const ckv_move *moves, size_t n, int copy) {
  populate_destinations(g, moves, n);
  return copy ? ckv_copy_slots(g, moves, n) : ckv_kernels_move(g, moves, n, 0);
}

const ckv_blockmem ckv_blockmem_host = {.name = "host", .write = host_write, .run = host_run};

#ifndef CKV_HAVE_CUDA_KERNELS
const ckv_blockmem *ckv_blockmem_cuda(uint32_t device) {
  (void)device;
  return NULL;
}
#endif
