/* session_snap.h - a live session to a snapshot (snapshot.h) and back.
 *
 * The bridge between session.c's structures and the file format, so the
 * request handlers stay thin and snapshot.c stays free of the server.
 * Snapshots read block bytes through the daemon's own mapping of the
 * tenant's arena: host arenas only (a CUDA arena would need device copies;
 * CKV_ERR_UNSUPPORTED there). */
#ifndef CKV_PERSIST_SESSION_SNAP_H
#define CKV_PERSIST_SESSION_SNAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_snap ckv_snap;
typedef struct ckv_mlp ckv_mlp;

/* Everything a snapshot of session s holds, copied into *ret (free with
 * ckv_snap_done): identity, policy state, token columns and every kept
 * block's header region and payload (in ret->buf_), so the file can be
 * written later, by another thread, while the session goes on changing.  No
 * compressor job may be in flight (settle it first).  committed_only: only
 * committed tokens and the blocks holding them (draft and staged tokens are
 * recycled in the copy; ret->dropped_tokens says how many).  *ret_tokens:
 * tokens kept (not recycled).  Returns CKV_OK, CKV_ERR_UNSUPPORTED (not a
 * host arena), CKV_ERR_BUSY (moves in flight), -ENOMEM; err says why;
 * nothing is allocated on failure. */
int ckv_session_snap_capture(const ckv_srv_session *s, bool committed_only, ckv_snap *ret, uint64_t *ret_tokens,
                             char *err, size_t errlen);

/* ckv_session_snap_capture without copying the payload of blocks that no
 * longer change: each full block's payload pointer is its place in the
 * tenant's arena (blocks still being filled are copied), and the tenant is
 * pinned (tenant.h) so none of them is freed and reused while another
 * thread writes the snapshot.  A save of a large session costs the loop a
 * copy of its header regions and token columns, not of its K/V.  On
 * CKV_OK the caller owes one ckv_tenant_unpin(s->tenant), after the last
 * read of ret's payloads. */
int ckv_session_snap_capture_pinned(const ckv_srv_session *s, bool committed_only, ckv_snap *ret,
                                    uint64_t *ret_tokens, char *err, size_t errlen);

/* ckv_session_snap_capture and ckv_snap_write in one call, on the calling
 * thread (the server loop hands the write to snapio.h instead): writes
 * session s (no compressor job may be in flight: settle it first) to
 * dir/name.ckvsnap.  committed_only: only committed tokens and the blocks
 * holding them (draft and staged tokens are recycled in the snapshot;
 * *ret_dropped says how many).  Returns CKV_OK, CKV_ERR_UNSUPPORTED (not a
 * host arena), CKV_ERR_BUSY (moves in flight), -errno / -ENOMEM; err says why. */
int ckv_session_snap_save(const ckv_srv_session *s, const char *dir, const char *name, bool committed_only,
                          uint64_t *ret_bytes, uint64_t *ret_tokens, uint64_t *ret_dropped, char *err, size_t errlen);

/* A new session `id` of tenant t holding what snap (validated by
 * ckv_snap_read, identity checked by the caller) holds: fresh blocks of the
 * same formats and capacities in t's arena with the saved bytes, header
 * shadows rebuilt from the daemon's own rules (only positions and valid bits
 * come from the file, and those were cross-checked), token columns and
 * policy state as saved.  mlp: the mlp judge to use when the snapshot's
 * session used one (NULL: the rule judge; the caller says so).  Returns
 * CKV_OK, CKV_ERR_QUOTA / CKV_ERR_NOSPACE (err says how many bytes),
 * CKV_ERR_UNSUPPORTED (not a host arena), CKV_ERR_CORRUPT, -ENOMEM. */
int ckv_session_snap_restore(const ckv_snap *snap, const char *id, ckv_tenant *t, const ckv_mlp *mlp,
                             uint64_t *next_block_id, ckv_srv_session **ret, char *err, size_t errlen);

/* Warm restart (warm.h).  capture_refs: ckv_session_snap_capture of the
 * whole session with CKV_SNAP_BLOCK_REFS (each block's header region, arena
 * and slab offset; no payload byte is copied: the arena is kept).  restore_kept: the
 * restore of such an entry into the adopted arena of t, each block claimed
 * at its old offset (tenant.h claim), payload untouched; the offsets are
 * checked against the arena and the allocator (a block outside the arena,
 * on another block or off its slab's grid is CKV_ERR_CORRUPT /
 * CKV_ERR_INVALID / CKV_ERR_EXISTS).  A plain snapshot is refused by
 * restore_kept and a journal entry by ckv_session_snap_restore (FORMAT). */
int ckv_session_snap_capture_refs(const ckv_srv_session *s, ckv_snap *ret, char *err, size_t errlen);
int ckv_session_snap_restore_kept(const ckv_snap *snap, const char *id, ckv_tenant *t, const ckv_mlp *mlp,
                                  uint64_t *next_block_id, ckv_srv_session **ret, char *err, size_t errlen);

#endif
