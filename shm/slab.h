/* shm/slab.h - the block allocator: carves an arena's byte range into blocks.
 *
 * The range is cut into fixed-size chunks (2 MiB by default).  Each block size
 * in use gets a class (the daemon makes one per block format and geometry,
 * keyed by the block's byte size plus an opaque tag, so two formats of equal
 * size never share a class and bytes are never reused across formats by
 * accident).  A class takes slabs: runs of contiguous chunks long enough to
 * hold at least `min_blocks` blocks (real blocks are ~2 MiB, so a slab may
 * span several chunks).  When a slab's last block is freed its chunks go back
 * to the free pool at once (coalesced with free neighbours) and the discard
 * callback is called so the arena gives their pages back to the OS, unless
 * the allocator keeps them "warm": up to `warm_bytes` of freed chunks stay
 * backed (no hole punched, so no page fault and no kernel zeroing when a new
 * slab takes them, which it does before touching cold chunks).  Warm chunks
 * hold the bytes of the blocks that were there: ckv_slab_take() says when a
 * block may hold old bytes, so the owner can clear it.
 *
 * The allocator hands out offsets, never pointers, and keeps all of its
 * metadata in this process's heap: nothing in the shared arena can corrupt it.
 * Block alloc and free are O(1); taking or returning a slab's chunks is O(1)
 * in the usual case (segregated free lists by span length, boundary tags for
 * coalescing).  Freeing an offset that is not a live block (double free,
 * foreign or misaligned offset) is refused with CKV_ERR_INVALID and changes
 * nothing.
 *
 * Not thread-safe: one ckv_slab must be used by one thread at a time (the
 * daemon holds the owning tenant's lock around every call). */
#ifndef CKV_SHM_SLAB_H
#define CKV_SHM_SLAB_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ckv_slab ckv_slab;

#define CKV_SLAB_CHUNK_DEFAULT (UINT64_C(2) << 20) /* 2 MiB */
#define CKV_SLAB_ALIGN_DEFAULT 256u  /* block strides and offsets: GPU-friendly */
#define CKV_SLAB_MIN_BLOCKS_DEFAULT 4u
#define CKV_SLAB_MIN_BLOCKS_MAX 65536u
#define CKV_SLAB_MAX_CLASSES 64u

/* Called with the arena range [off, off+len) of chunks that just became free.
 * Its result is only counted (ckv_slab_stats.discard_errors): a failed discard
 * leaves pages committed but loses nothing.  ckv_arena_discard_cb() (in
 * shm/arena.h) adapts an arena. */
typedef int (*ckv_slab_discard_fn)(void *opaque, uint64_t off, uint64_t len);

typedef struct ckv_slab_config {
  uint64_t offset;      /* first byte managed, an arena offset (usually
                         * ckv_arena_data_offset()); a multiple of block_align */
  uint64_t bytes;       /* bytes managed from offset; rounded down to whole chunks */
  uint64_t chunk_bytes; /* 0: CKV_SLAB_CHUNK_DEFAULT.  A multiple of block_align
                         * (and of the page size if discarding is wanted) */
  uint32_t block_align; /* 0: CKV_SLAB_ALIGN_DEFAULT.  Power of two >= 8; every
                         * block's stride (and so its offset) is a multiple */
  uint32_t min_blocks;  /* 0: CKV_SLAB_MIN_BLOCKS_DEFAULT.  A slab holds at least
                         * this many blocks (fewer only if the range is smaller) */
  uint32_t keep_empty;  /* empty slabs a class keeps instead of returning them
                         * (avoids churn at the cost of reserved memory); 0 = none */
  uint64_t warm_bytes;  /* freed chunks kept backed (not discarded), any class's
                         * next slab taking them first; rounded down to chunks;
                         * 0 = discard every freed chunk at once */
  ckv_slab_discard_fn discard; /* optional; see above */
  void *discard_opaque;        /* first argument of discard */
} ckv_slab_config;

typedef struct ckv_slab_stats {
  uint64_t bytes_total;    /* bytes in chunks: chunks_total * chunk_bytes */
  uint64_t bytes_used;     /* bytes of allocated blocks, counted at their stride */
  uint64_t bytes_reserved; /* bytes of chunks held by classes (used + slack + empty) */
  uint64_t chunks_total;   /* chunks in the range */
  uint64_t chunks_free;    /* chunks in the free pool */
  uint64_t bytes_warm;     /* bytes of free chunks kept backed (<= warm_bytes, plus any
                            * whose discard failed) */
  uint64_t blocks_used;    /* allocated blocks, all classes */
  uint64_t slabs;          /* slabs held, all classes */
  uint64_t classes;        /* classes defined */
  uint64_t discard_errors; /* discard callbacks that failed */
} ckv_slab_stats;

typedef struct ckv_slab_class_stats {
  uint64_t block_bytes;     /* as given to ckv_slab_class() */
  uint64_t tag;             /* as given to ckv_slab_class() */
  uint64_t stride;          /* block_bytes rounded up to block_align */
  uint32_t chunks_per_slab; /* chunks one slab spans */
  uint32_t blocks_per_slab; /* blocks one slab holds */
  uint64_t blocks_used;     /* allocated blocks of this class */
  uint64_t slabs;           /* slabs this class holds */
} ckv_slab_class_stats;

/* Creates an allocator for cfg->bytes bytes starting at arena offset
 * cfg->offset.  The configuration is copied.  The caller owns *ret (release
 * with ckv_slab_free(); the arena itself is not touched by the allocator
 * except through the discard callback).
 * Returns CKV_OK; CKV_ERR_INVALID (NULL, range smaller than one chunk, bad
 * alignment or chunk size); CKV_ERR_LIMIT (more than 2^32-2 chunks, chunk
 * holding over 2^24 aligned units, min_blocks above CKV_SLAB_MIN_BLOCKS_MAX);
 * -ENOMEM. */
int ckv_slab_new(const ckv_slab_config *cfg, ckv_slab **ret);

/* Releases the allocator and its metadata (not the arena; no discard calls).
 * Blocks still allocated are simply forgotten.  Accepts NULL; returns NULL. */
ckv_slab *ckv_slab_free(ckv_slab *s);

/* Finds or creates the class of blocks of `block_bytes` bytes with `tag`
 * (e.g. a hash of format + geometry) and writes its id (small, stable for the
 * allocator's life) to *ret_class.  Creating a class reserves no memory.
 * Returns CKV_OK; CKV_ERR_INVALID (NULL, block_bytes 0); CKV_ERR_LIMIT (a block
 * larger than the whole range, or CKV_SLAB_MAX_CLASSES classes exist). */
int ckv_slab_class(ckv_slab *s, uint64_t block_bytes, uint64_t tag, uint32_t *ret_class);

/* Allocates one block of class `cls` and writes its arena offset to
 * *ret_offset.  The block's contents are whatever was there (zero for pages
 * that were discarded or never touched).
 * Returns CKV_OK; CKV_ERR_INVALID (NULL, unknown class); CKV_ERR_NOSPACE (no
 * free block and no free run of chunks long enough for a new slab); -ENOMEM
 * (metadata). */
int ckv_slab_alloc(ckv_slab *s, uint32_t cls, uint64_t *ret_offset);

/* ckv_slab_alloc(), and *ret_reused (may be NULL) says whether the block's
 * memory may hold bytes of an earlier block (a freed block of its slab, or a
 * warm chunk, or one whose discard failed): false only for memory that reads
 * zero since the range was made or discarded (the arena's guarantee). */
int ckv_slab_take(ckv_slab *s, uint32_t cls, uint64_t *ret_offset, bool *ret_reused);

/* Frees the block at `offset` (as returned by ckv_slab_alloc).  When its slab
 * becomes empty (and the class keeps no more empty slabs) the slab's chunks
 * return to the free pool and are discarded.
 * Returns CKV_OK or CKV_ERR_INVALID (not the start of a live block: double
 * free, foreign or misaligned offset, NULL s); on error nothing changes. */
int ckv_slab_dealloc(ckv_slab *s, uint64_t offset);

/* Checks that `offset` is the start of a live block and writes its class to
 * *ret_class (ret_class may be NULL).  Returns CKV_OK or CKV_ERR_INVALID. */
int ckv_slab_lookup(const ckv_slab *s, uint64_t offset, uint32_t *ret_class);

/* Writes to *ret_slab_offset the arena offset of block 0 of the slab that
 * holds the live block at `offset`: with the class, what ckv_slab_claim()
 * needs to put the block back in the same place in a new allocator.
 * Returns CKV_OK or CKV_ERR_INVALID (not a live block). */
int ckv_slab_block_slab(const ckv_slab *s, uint64_t offset, uint64_t *ret_slab_offset);
/* Marks the block at `offset` of class `cls` allocated, in the slab whose
 * block 0 is at `slab_offset`: rebuilds an allocator over memory whose
 * blocks outlived the previous one (a daemon restart that kept its arena).
 * The slab is made if its chunks are all free, or must already be a slab of
 * that class at that offset.  The slab counts as warm (its other blocks may
 * hold old bytes: ckv_slab_take says reused).  Call ckv_slab_scrub() once
 * every block is claimed.
 * Returns CKV_OK; CKV_ERR_INVALID (unknown class, offsets outside the range
 * or not on the slab's block grid); CKV_ERR_EXISTS (the block is live
 * already, or its chunks belong to another slab); -ENOMEM. */
int ckv_slab_claim(ckv_slab *s, uint32_t cls, uint64_t slab_offset, uint64_t offset);
/* Discards every free chunk (the discard callback), so that memory no live
 * block claimed reads zero: after ckv_slab_claim(), before anything is
 * allocated.  Returns the number of discards that failed (their chunks stay
 * warm: the next block there is cleared by its owner, ckv_slab_take). */
uint64_t ckv_slab_scrub(ckv_slab *s);
/* Totals over all classes.  Never fails. */
void ckv_slab_get_stats(const ckv_slab *s, ckv_slab_stats *ret);

/* One class's figures.  Returns CKV_OK or CKV_ERR_INVALID (unknown class). */
int ckv_slab_get_class_stats(const ckv_slab *s, uint32_t cls, ckv_slab_class_stats *ret);

#endif
