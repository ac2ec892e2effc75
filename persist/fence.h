/* fence.h - the store fence: which conversation of a session id is the
 * current one, kept in the remote store for every daemon of a fleet.
 *
 * incarnations.h fences a daemon's own copies with its local record; a
 * daemon that never recorded the id (another node, another state dir,
 * sharing the store and the remote key file) would take whatever remote
 * tier value the store holds.  So when a conversation ends (DropSession,
 * expiry: incarnation 0) or is replaced (OpenSession of an id without
 * resume, RestoreSession: the new incarnation), the daemon also writes a
 * fence record under ckv_remote_fence_key(tenant, id): "CKVF" · u32 version
 * (1) · u64 incarnation (0: ended) · u64 decided_at (wall-clock ms), sealed
 * (seal.h) for the tenant and that key, so another tenant's record moved
 * there, or one forged or rewritten without the fleet's key, does not open.
 * An ended conversation's record is written in one transaction with the
 * DEL of its remote tier value.
 *
 * The rule (a resume that reads a remote tier value, snapio.c): the value
 * is served only when its incarnation agrees with every fence there is,
 *   - the local record (incarnations.h), when there is one, and
 *   - the store's record, when there is one;
 * neither record is taken over the other: which of two daemons decided
 * last cannot be told without a shared clock, and taking the wrong one
 * would serve an ended conversation, where refusing costs a resume
 * (NOT_FOUND or the snapshot).  A store record of 0 fences every value; a
 * record that does not open (foreign, forged, damaged) fences the value too
 * (logged): it is never ignored, since ignoring it would let a forger clear
 * a fence by overwriting it.  No store record: the local rule alone, as
 * before.
 *
 * Writes never move a fence backwards: a record replaces the store's only
 * when that one is older (decided_at), does not open, or is missing
 * (WATCH / GET / MULTI / SET / EXEC), so a retry that comes late does not
 * undo a newer open or drop of another daemon.  A write that fails (the
 * store down) is retried by fencejob.h until it lands; meanwhile the local
 * record holds for this daemon.
 *
 * Limits (without AUTH any local user can write the store): deleting the
 * record, or putting back an older sealed record of the same id, undoes
 * the store fence for daemons without a local record; the values stay
 * sealed and bound to their key either way (seal.h). */
#ifndef CKV_PERSIST_FENCE_H
#define CKV_PERSIST_FENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_remote ckv_remote;

/* What the store says of an id. */
typedef enum ckv_fence_state {
  CKV_FENCE_NONE = 0, /* no record: the local rule alone */
  CKV_FENCE_SET, /* a record that opened: incarnation (0: ended) */
  CKV_FENCE_REFUSED, /* a record that does not open: fences every value (why
                        says so) */
} ckv_fence_state;

typedef struct ckv_store_fence {
  ckv_fence_state state;
  uint64_t incarnation; /* SET: the current conversation (0: ended) */
  uint64_t decided_ms; /* SET: when it was decided (wall clock) */
  char why[160]; /* REFUSED: why it did not open */
} ckv_store_fence;

/* The most bytes a sealed record takes (a longer value is REFUSED). */
#define CKV_FENCE_RECORD_MAX 128u

/* Opens the record read under key for tenant into *ret (always written:
 * NONE when rec is NULL, REFUSED when it does not open). */
void ckv_fence_open(const ckv_remote *r, const char *tenant, const char *key, const uint8_t *rec, size_t len,
                    ckv_store_fence *ret);

/* Whether a value of incarnation `copy` may be served under fence f (the
 * rule above, store half).  False with *ret_why a static text otherwise. */
bool ckv_fence_admits(const ckv_store_fence *f, uint64_t copy, const char **ret_why);

/* Writes tenant/id's record (incarnation, decided_ms) to the store, from
 * the I/O thread, and with it, when del_key is not NULL, deletes that key
 * (an ended conversation's remote tier value).  CKV_OK (written, or the
 * store's record is newer: nothing to do, *ret_superseded true), -EIO, -EAGAIN
 * (written meanwhile: try again), CKV_ERR_INVALID (no key for these names
 * or no seal); err says why. */
int ckv_fence_write(ckv_remote *r, const char *tenant, const char *id, uint64_t incarnation, uint64_t decided_ms,
                    const char *del_key, bool *ret_superseded, char *err, size_t errlen);

/* Wall-clock milliseconds, for decided_ms. */
uint64_t ckv_fence_now_ms(void);

#endif
