/* daemon/blockmem.h - how the daemon writes into a tenant's arena.
 *
 * Workers map their tenant's arena read-write, so nothing the daemon acts on
 * may be read back from it (DESIGN.md §4 inv. 8).  On every memory, host or
 * device, the daemon keeps a private shadow of each block's header region
 * (header, positions, valid bitmap: the first ckv_block_payload_offset()
 * bytes), edits only the shadow, and writes the dirty shadows into the arena
 * with one `write` before anyone can depend on them: before a compressor job
 * is queued and before a reply leaves (session.h ckv_srv_session_flush_meta).
 * Compressor jobs carry copies of the shadows' headers (kernels.h ckv_move
 * src_hdr/dst_hdr), so a header a worker overwrote is never followed.  Device
 * arenas (CUDA) cannot be touched by the CPU anyway: there the write is one
 * patch launch (ckv_cuda_patch_apply), the compressor runs the CUDA kernels
 * on a stream of its own thread, and a job is complete (so its epoch may be
 * published) only after an event recorded behind its kernels has fired.
 *
 * A blockmem is a static const table, chosen once per tenant at start-up. */
#ifndef CKV_STORE_BLOCKMEM_H
#define CKV_STORE_BLOCKMEM_H

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
  const char *name;   /* "host", "cuda": for logs and stats */
  /* Applies n writes (disjoint ranges) to the arena mapped at base and
   * returns once every process mapping the arena can see them.  Required. */
  int (*write)(void *base, const ckv_meta_write *w, size_t n);
  /* Runs a compressor job over blocks of this memory: kernel moves
   * (copy 0, ckv_kernels_move semantics, flags 0) or same-format copies
   * (copy 1, ckv_copy_slots), and returns once the work is complete.
   * Called on compressor threads.  Required. */
  int (*run)(const ckv_geometry *g, const ckv_move *moves, size_t n, int copy);
} ckv_blockmem;

/* Host memory: shadows written by memcpy, CPU kernels.  The same shadow and
 * flush paths the CUDA backend uses, so the CPU tests cover them. */
extern const ckv_blockmem ckv_blockmem_host;

/* The CUDA blockmem for runtime device ordinal `device` (compressor threads
 * make it current on first use), or NULL in a build without the CUDA kernels. */
const ckv_blockmem *ckv_blockmem_cuda(uint32_t device);

#endif
