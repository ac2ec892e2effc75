/* daemon/blockmem.h - how the daemon writes into a tenant's arena.
 *
 * Host arenas are plain memory: the daemon writes block headers, positions
 * and valid bits in place, and the compressor runs the CPU kernels on them.
 * Device arenas (CUDA) cannot be touched by the CPU: the daemon keeps a host
 * shadow of each block's header region (header, positions, valid bitmap:
 * the first ckv_block_payload_offset() bytes), edits the shadow exactly as
 * it would edit host memory, and flushes the dirty shadows with one patch
 * (ckv_cuda_patch_apply) before anyone can depend on them: before a
 * compressor job is queued and before a reply leaves (session.h
 * ckv_srv_session_flush_meta).  The compressor runs the CUDA kernels on a
 * stream of its own thread and a job is complete (so its epoch may be
 * published) only after an event recorded behind its kernels has fired.
 *
 * A blockmem is a static const table, chosen once per tenant at start-up. */
#ifndef CKV_DAEMON_BLOCKMEM_H
#define CKV_DAEMON_BLOCKMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* One write of host bytes into the arena: `bytes` from src at arena offset
 * `offset`, then `zero_bytes` zero bytes after them. */
typedef struct ckv_meta_write {
  uint64_t offset;
  const void *src;
  uint64_t bytes;
  uint64_t zero_bytes;
} ckv_meta_write;

typedef struct ckv_blockmem {
  const char *name;   /* "host", "host-shadow", "cuda": for logs and stats */
  bool shadow;        /* headers are edited in host shadows and flushed with write() */
  /* Applies n writes (disjoint ranges) to the arena mapped at base and
   * returns once every process mapping the arena can see them.  Required
   * when shadow is set. */
  int (*write)(void *base, const ckv_meta_write *w, size_t n);
  /* Runs a compressor job over blocks of this memory: kernel moves
   * (copy 0, ckv_kernels_move semantics, flags 0) or same-format copies
   * (copy 1, ckv_copy_slots), and returns once the work is complete.
   * Called on compressor threads.  Required. */
  int (*run)(const ckv_geometry *g, const ckv_move *moves, size_t n, int copy);
} ckv_blockmem;

/* Host memory, edited in place. */
extern const ckv_blockmem ckv_blockmem_host;
/* Host memory with the device discipline (shadows flushed by memcpy): lets
 * the CPU tests exercise every shadow and flush path the CUDA backend uses
 * ([daemon] shadow_headers = yes). */
extern const ckv_blockmem ckv_blockmem_host_shadow;

/* The CUDA blockmem for runtime device ordinal `device` (compressor threads
 * make it current on first use), or NULL in a build without the CUDA kernels. */
const ckv_blockmem *ckv_blockmem_cuda(uint32_t device);

#endif
