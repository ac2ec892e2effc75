/* diskuse.h - what each tenant holds in the state directory: an index in
 * memory of its files (snapshots, autosaves, disk-tier files) with their
 * sizes, and for snapshots what ListSnapshots shows of them, so that the
 * disk quota (`[tenant] quota_disk`), the snapshot count limit
 * (`max_snapshots`) and the listing never read the disk on the server loop.
 *
 * Built at start-up from one walk of the state directory (the only time
 * snapshot headers are read for it), then kept current on the loop as the
 * I/O thread's jobs land (ckv_persist_job_landed: a file written replaces
 * its entry, so a copy that replaces an older one counts its net growth; a
 * file removed leaves the index).  A write is admitted before any byte of
 * it is written: ckv_diskuse_admit reserves what it may add until its job
 * lands, so saves queued together cannot pass the quota either.
 *
 * Loop-only, like the rest of persist/'s bookkeeping (not thread-safe). */
#ifndef CKV_PERSIST_DISKUSE_H
#define CKV_PERSIST_DISKUSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"

typedef struct ckv_diskuse ckv_diskuse;
typedef struct ckv_snap ckv_snap;

/* The areas of the state directory a tenant's files live in (snapdir.h). */
typedef enum ckv_diskuse_area {
  CKV_DISKUSE_SNAPSHOT, /* state_dir/snapshots: save games, listed, counted by max_snapshots */
  CKV_DISKUSE_AUTOSAVE, /* state_dir/autosave: crash copies */
  CKV_DISKUSE_TIER,     /* state_dir/tier: sessions moved out of memory */
  CKV_DISKUSE_AREAS_
} ckv_diskuse_area;

/* What ListSnapshots shows of a snapshot: its header's identity, filled
 * when the file was written or scanned.  error not NULL: the header could
 * not be read at start-up (why); the rest is unset. */
typedef struct ckv_diskuse_snapinfo {
  const char *session_id, *model_id, *model_revision;
  uint64_t tokens, saved_at_ms;
  bool committed_only;
  ckv_geometry geom;
  uint32_t draft_tokens, commit_tokens;
  const char *error;
} ckv_diskuse_snapinfo;

/* One tenant's figures. */
typedef struct ckv_diskuse_usage {
  uint64_t bytes;                        /* all its files */
  uint64_t reserved;                     /* admitted writes not landed yet (their growth) */
  uint64_t files[CKV_DISKUSE_AREAS_];    /* per area */
  uint64_t area_bytes[CKV_DISKUSE_AREAS_];
  uint64_t reserved_snapshots;           /* admitted saves of new snapshot names not landed yet */
} ckv_diskuse_usage;

/* What a tenant may hold; 0 = no limit. */
typedef struct ckv_diskuse_limits {
  uint64_t quota_disk;    /* bytes of all its files */
  uint32_t max_snapshots; /* snapshot files */
} ckv_diskuse_limits;

/* An admitted write's reservation, carried by its job until it lands. */
typedef struct ckv_diskuse_claim {
  uint64_t bytes;   /* growth reserved */
  uint32_t files;   /* new snapshot names reserved (0 or 1) */
} ckv_diskuse_claim;

/* CKV_OK or -ENOMEM. */
int ckv_diskuse_new(ckv_diskuse **ret);
ckv_diskuse *ckv_diskuse_free(ckv_diskuse *du);

/* File `name` of tenant in area is now `bytes` long (written, replaced or
 * found); info (SNAPSHOT only, may be NULL) is its header, copied; error
 * (SNAPSHOT, NULL: none) says why its header cannot be read.  CKV_OK or
 * -ENOMEM (the index then misses the file: the quota errs on the side of
 * the tenant, never a crash). */
int ckv_diskuse_put(ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name, uint64_t bytes,
                    const ckv_snap *info, const char *error);
/* The file is gone (removed, or never written). */
void ckv_diskuse_del(ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name);
/* Whether the file is indexed; its size into *ret_bytes (may be NULL). */
bool ckv_diskuse_has(const ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name,
                     uint64_t *ret_bytes);
/* The tenant's figures (zero for a tenant with no file). */
void ckv_diskuse_usage_of(const ckv_diskuse *du, const char *tenant, ckv_diskuse_usage *ret);

/* May `bytes` be written as file `name` of tenant in area, within lim?
 * The growth is bytes less the size of the file it replaces; a write that
 * does not grow the tenant is always admitted, as is one with no limit.
 * CKV_OK with *ret the reservation (give it back with
 * ckv_diskuse_release when the write lands or is abandoned), or
 * CKV_ERR_QUOTA with err naming the numbers (used, being written, this
 * file's size, the limit). */
int ckv_diskuse_admit(ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name, uint64_t bytes,
                      const ckv_diskuse_limits *lim, ckv_diskuse_claim *ret, char *err, size_t errlen);
void ckv_diskuse_release(ckv_diskuse *du, const char *tenant, ckv_diskuse_claim *claim);

/* Calls fn for every snapshot of tenant (every tenant's when NULL), tenants
 * then names in byte order. CKV_OK or -ENOMEM (nothing called). */
typedef void (*ckv_diskuse_snap_fn)(void *ctx, const char *tenant, const char *name, uint64_t bytes,
                                    const ckv_diskuse_snapinfo *info);
int ckv_diskuse_each_snapshot(const ckv_diskuse *du, const char *tenant, ckv_diskuse_snap_fn fn, void *ctx);

/* Start-up: indexes every file of the three areas of state_dir (reading
 * each snapshot's header once, checked as statefile.h says), logs one
 * line per tenant and area with its count and bytes, and at most a few
 * lines for snapshots that cannot be read (then how many more).  Returns
 * the number of readable snapshots. */
size_t ckv_diskuse_scan(ckv_diskuse *du, const char *state_dir);

#endif
