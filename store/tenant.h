/* tenant.h - a tenant at run time: its arena, its block allocator, its quota
 * and its usage.  Each tenant's KV lives in arenas of its own (DESIGN.md §4
 * invariant 5): the only handles a client ever receives are its tenant's. */
#ifndef CKV_STORE_TENANT_H
#define CKV_STORE_TENANT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/format.h"

#include "common/status_slots.h"

typedef struct ckv_arena ckv_arena;
typedef struct ckv_slab ckv_slab;
typedef struct ckv_arena_backend ckv_arena_backend;
typedef struct ckv_blockmem ckv_blockmem;
typedef struct ckv_prefix ckv_prefix;

typedef struct ckv_tenant {
  char name[64];
  uint32_t arena_id;
  uint64_t quota_bytes;  /* bytes of blocks this tenant may hold (all formats) */
  uint32_t max_sessions;
  uint64_t quota_disk;    /* bytes of its files in the state directory (persist/diskuse.h); 0 = no cap */
  /* Fraction of quota_bytes above which the disk tier starts moving the
   * coldest sessions down in the background (persist/tier.c,
   * ckv_tier_scan), so an append rarely waits for a move; 0 = off. */
  double high_water;
  uint32_t max_snapshots; /* snapshot files it may keep; 0 = no limit */
  uint32_t max_clients; /* attached clients of this tenant; 0 = only the daemon's ceiling */
  uint32_t policies;    /* bit per allowed ckv_policy_id; 0 = all */
  int default_policy;   /* ckv_policy_id or -1 */
  ckv_arena *arena;
  ckv_slab *slab;
  const ckv_blockmem *mem;    /* how the daemon writes the arena (blockmem.h); host by default */
  char device_uuid[40];       /* CUDA arenas: the device's UUID, sent with the arena; "" on host */
  uint64_t bytes_used;        /* bytes of allocated blocks */
  uint64_t bytes_by_format[CKV_FORMAT_COUNT_];
  uint64_t n_sessions;
  uint64_t n_clients;
  uint64_t io_bytes;   /* session copies waiting for the snapshot I/O thread (bounded by quota_bytes) */
  /* Saves whose I/O thread reads blocks straight from the arena
   * (ckv_tenant_pin): while any is running, freed blocks wait here, still
   * charged, so no block a save reads is handed out again underneath it. */
  uint32_t pins;
  struct ckv_deferred_free *deferred;
  size_t n_deferred, cap_deferred;
  /* The continuous warm journal (persist/warmjournal.h): while journal_hold
   * is set, every freed block waits in `held`, still charged, until no
   * journal entry that may be on disk names it (ckv_tenant_release_held):
   * after a kill -9 the next daemon claims what the journal names, so a
   * named block must keep its bytes. */
  bool journal_hold;
  struct ckv_deferred_free *held;
  size_t n_held, cap_held;
  uint64_t held_bytes;
  /* counters for the metrics endpoint */
  uint64_t transitions_gone[4][4]; /* transitions of sessions already freed */
  uint64_t hits;                   /* Acquire/GetView of resident sessions */
  uint64_t hit_tokens;             /* the tokens those sessions held */
  uint64_t recycle_runs;           /* runs of recycled tokens reported */
  uint64_t errors[CKV_STATUS_SLOTS]; /* error replies by code (status_slots.h) */
  /* Shared prefix blocks (store/prefix.h): the index of content keys and
   * the shared blocks' records; NULL until first used. */
  ckv_prefix *prefix;
  void (*prefix_free)(ckv_prefix *); /* set with it: tenant.c knows nothing of it */
  /* Warm restart (warm.h): while claim.pending, the next block_alloc takes
   * exactly this block of the kept arena instead of a free one, bytes as
   * they are. */
  struct {
    bool pending;
    uint64_t offset, slab_offset;
  } claim;
} ckv_tenant;

/* Arena sizing.  A tenant's arena holds its quota plus headroom: the arena
 * header and slab rounding (each block class keeps partly used slabs of
 * whole 2 MiB chunks), so the quota, not the arena, is what runs out first
 * and quota pressure compresses and recycles before anything is refused.
 * Arenas are whole chunks: their sizes add up exactly against the daemon's
 * memory budget ([daemon] memory), which the sum of all arenas never exceeds. */
#define CKV_TENANT_ARENA_ALIGN (UINT64_C(2) << 20)
#define CKV_TENANT_ARENA_MIN (UINT64_C(4) << 20) /* the smallest arena worth making */

/* Bytes of arena (header included, a multiple of CKV_TENANT_ARENA_ALIGN) that
 * a quota of `quota` bytes needs. */
uint64_t ckv_tenant_arena_for_quota(uint64_t quota);
/* The largest quota an arena of `arena_bytes` holds with its headroom (the
 * inverse of ckv_tenant_arena_for_quota, rounded down). */
uint64_t ckv_tenant_quota_for_arena(uint64_t arena_bytes);

/* Create a tenant with an arena of `arena_bytes` on backend `be`, header
 * included (ckv_arena_size() is then arena_bytes when that is a multiple of
 * the backend's granularity).  Returns CKV_OK, -errno from the arena, or
 * -ENOMEM. */
int ckv_tenant_new(const char *name, uint64_t quota_bytes, uint64_t arena_bytes, uint32_t arena_id,
                   const ckv_arena_backend *be, ckv_tenant **ret);
ckv_tenant *ckv_tenant_free(ckv_tenant *t);
/* ckv_tenant_new over an arena that already exists (adopted across a
 * restart, warm.h); takes `arena` over, also on failure. */
int ckv_tenant_adopt(const char *name, uint64_t quota_bytes, ckv_arena *arena, uint32_t arena_id, ckv_tenant **ret);
/* At a stop that hands the arena on (warm.h): the allocator goes first, so
 * the sessions freed after it give no block back (no hole is punched in
 * memory the next daemon adopts), and the arena's header stays live. */
void ckv_tenant_keep(ckv_tenant *t);

/* Allocate one block of `bytes` for a block of format `format`.  Refuses with
 * CKV_ERR_QUOTA when the quota would be exceeded and CKV_ERR_NOSPACE when the
 * arena is full.  *ret_offset is the block's byte offset in the arena. */
int ckv_tenant_block_alloc(ckv_tenant *t, uint64_t bytes, uint32_t format, uint64_t *ret_offset);
/* Return a block allocated by ckv_tenant_block_alloc. */
void ckv_tenant_block_free(ckv_tenant *t, uint64_t offset, uint64_t bytes, uint32_t format);
/* Pinning: between ckv_tenant_pin and the matching ckv_tenant_unpin, blocks
 * given to ckv_tenant_block_free are not reused: they stay allocated and
 * charged to the quota until the last pin goes, so another thread may read
 * any block allocated at pin time without a lock (the snapshot I/O thread
 * writing a save straight from the arena, savegame.h).  Blocks are never
 * freed in place of one another: the order of frees is kept. */
void ckv_tenant_pin(ckv_tenant *t);
void ckv_tenant_unpin(ckv_tenant *t);
/* The journal hold (see journal_hold): gives back every held block for
 * which named(ctx, offset) is false (through the pins' deferral when the
 * tenant is pinned); the others stay held.  named NULL: all of them (the
 * hold was turned off).  Returns the number of blocks given back. */
size_t ckv_tenant_release_held(ckv_tenant *t, bool (*named)(void *ctx, uint64_t offset), void *ctx);
/* Daemon-side address of an arena offset. */
void *ckv_tenant_ptr(const ckv_tenant *t, uint64_t offset);
/* Whether `bytes` more would fit within quota and arena. */
bool ckv_tenant_would_fit(const ckv_tenant *t, uint64_t bytes);

#endif
