/* remote_snap.h - session snapshots in the remote store (remote.h):
 * which copy a restore reads, and the push after a save.
 *
 * A save writes the local file first (snapshot.c, unchanged) and then pushes
 * the file's bytes to the store under the snapshot's key; a push that fails
 * leaves the local snapshot as written.  A restore with a store configured
 * reads both copies, validates each exactly as a local file (ckv_snap_parse:
 * every checksum and cross reference) and takes the newer by its saved_at
 * time; equal times take the local one.  Either copy that exists but fails
 * validation refuses the restore (never the older copy in its stead: that
 * would be the silent restore of a stale context).  A store that cannot be
 * reached is logged and the local copy, when there is one, restored. */
#ifndef CKV_PERSIST_REMOTE_SNAP_H
#define CKV_PERSIST_REMOTE_SNAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_remote ckv_remote;
typedef struct ckv_snap ckv_snap;

/* Pushes state_dir's snapshot `name` of tenant (just written) to the store
 * under the key of (tenant, model id, revision, name).  CKV_OK, -EIO (the
 * store), CKV_ERR_INVALID (no key for these names), -errno (the file). */
int ckv_remote_snap_push(ckv_remote *r, const char *state_dir, const char *tenant, const char *model_id,
                         const char *model_revision, const char *name, char *err, size_t errlen);

/* Where a loaded snapshot came from. */
typedef enum ckv_snap_origin { CKV_SNAP_FROM_LOCAL = 0, CKV_SNAP_FROM_REMOTE = 1 } ckv_snap_origin;

/* Reads snapshot `name` of tenant as described above (r NULL: the local
 * file only).  model_id / model_revision name the remote key (NULL = "").
 * max_bytes bounds what is read from the store.  On success *ret is filled
 * (ckv_snap_done) and *ret_origin says which copy.  -ENOENT: neither copy
 * exists; CKV_ERR_CORRUPT / CKV_ERR_FORMAT: a copy was refused (err says
 * which); -EIO: no local copy and the store cannot be reached. */
int ckv_remote_snap_load(ckv_remote *r, const char *state_dir, const char *tenant, const char *model_id,
                         const char *model_revision, const char *name, uint64_t max_bytes, ckv_snap *ret,
                         ckv_snap_origin *ret_origin, char *err, size_t errlen);

/* The remote tier (tier.h): a session's disk tier file, moved on to the
 * store under ckv_remote_tier_key (tenant, model id, revision, session id).
 *
 * ckv_remote_tier_push stores the bytes of state_dir/tier/TENANT/ID.ckvsnap
 * (the file stays: the caller removes it once the session is marked
 * remote); *ret_bytes their length.  CKV_OK, -EIO (the store), -errno (the
 * file), CKV_ERR_INVALID (no key for these names).
 * ckv_remote_tier_load reads that value back and validates it as a local
 * file (ckv_snap_parse) into *ret.  -ENOENT: the store does not hold it;
 * CKV_ERR_CORRUPT / CKV_ERR_FORMAT: refused; -EIO; CKV_ERR_TOO_LARGE.
 * With ret_fence (a resume), the id's store fence (fence.h) is read in the
 * same round trip and opened into *ret_fence (CKV_OK and -ENOENT); the
 * caller applies the rule.
 * ckv_remote_tier_drop deletes it (CKV_OK when it was not there). */
int ckv_remote_tier_push(ckv_remote *r, const char *state_dir, const char *tenant, const char *model_id,
                         const char *model_revision, const char *id, uint64_t *ret_bytes, char *err, size_t errlen);
typedef struct ckv_store_fence ckv_store_fence;
int ckv_remote_tier_load(ckv_remote *r, const char *tenant, const char *model_id, const char *model_revision,
                         const char *id, uint64_t max_bytes, ckv_snap *ret, ckv_store_fence *ret_fence, char *err,
                         size_t errlen);
int ckv_remote_tier_drop(ckv_remote *r, const char *tenant, const char *model_id, const char *model_revision,
                         const char *id, char *err, size_t errlen);

#endif
