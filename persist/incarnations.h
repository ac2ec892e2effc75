/* incarnations.h - which conversation of each session id is the current one,
 * durable across crashes: the fence that keeps an ended conversation from
 * coming back.
 *
 * A session gets a random incarnation at each new open (OpenSession without
 * resume, RestoreSession) and every copy of it carries that number (snapshot
 * header, docs/snapshot.md).  This registry records, per tenant and id, the
 * incarnation that is current, or that the id was ended (DropSession, the
 * expiry of a detached session): appended to STATE_DIR/incarnations.log and
 * fdatasync'd before the reply to the open or drop goes out.  A resume then
 * takes only a copy of the recorded incarnation: a copy of an ended or
 * replaced conversation (an autosave or tier file whose removal a kill -9
 * cut short, a remote value the store kept because it did not answer the
 * delete) is fenced, never served.  An id never recorded here (copies older
 * than the registry, or another daemon's in a shared store) is judged by the
 * store fence when the copy is a remote tier value (fence.h: the rule that
 * combines the two), and taken as before otherwise.
 *
 * The log: records of `u32 magic "CKVI"` · `u32 length` of what follows up
 * to the checksum · `u64 incarnation` (0: ended) · `str tenant` · `str id` ·
 * `u64 XXH64` (seed 0) of the record before it (str = u16 length + bytes).
 * A torn record at the end (a crash mid-append) is ignored and cut off;
 * damage before the end stops the reading there, logged.  The log is
 * compacted (temporary file, fsync, rename) when it holds far more records
 * than ids.  Without a state directory the registry lives in memory only. */
#ifndef CKV_PERSIST_INCARNATIONS_H
#define CKV_PERSIST_INCARNATIONS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_incarnations ckv_incarnations;

/* Loads STATE_DIR/incarnations.log (state_dir NULL or "": memory only).
 * CKV_OK, or a status with err (the daemon refuses to start: it could not
 * tell current conversations from ended ones). */
int ckv_incarnations_open(const char *state_dir, ckv_incarnations **ret, char *err, size_t errlen);
/* Accepts NULL, returns NULL. */
ckv_incarnations *ckv_incarnations_free(ckv_incarnations *reg);

/* Records that tenant/id's current conversation is `incarnation` (0: the
 * id was ended), durably before it returns.  CKV_OK or -errno with err. */
int ckv_incarnations_set(ckv_incarnations *reg, const char *tenant, const char *id, uint64_t incarnation, char *err,
                         size_t errlen);
/* The incarnation recorded for tenant/id: CKV_OK with *ret (0: ended), or
 * -ENOENT when the id was never recorded. */
int ckv_incarnations_get(const ckv_incarnations *reg, const char *tenant, const char *id, uint64_t *ret);

/* A new incarnation: random, never 0. */
uint64_t ckv_incarnations_new_id(void);

#endif
