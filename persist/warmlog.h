/* warmlog.h - the warm journal's append-only log (issue 43;
 * docs/warm-restart.md).
 *
 * Between two checkpoints (the manifest and one entry file per session,
 * warm.h) the continuous journal (warmjournal.h) does not rewrite files: it
 * appends records to WARM_DIR/journal.log (WARM_DIR: STATE_DIR/warm), one batch at a time and one
 * fdatasync per batch.  A record says "session T/ID is now this entry" (PUT,
 * the entry's snapshot bytes, CKV_SNAP_BLOCK_REFS) or "session T/ID is in
 * no entry any more" (DEL).  The log names the checkpoint it follows (the
 * manifest's checksum): a log of another checkpoint is stale and ignored.
 *
 * Format (integers little-endian):
 *   file header (32 bytes): "CKVWLOG\0" · u32 version · u32 ~version ·
 *     u64 the manifest's XXH64 · u64 XXH64 (seed 0) of the 24 bytes before;
 *   then records, each: u32 magic "CKVR" · u32 type (1 PUT, 2 DEL) ·
 *     u64 seq (1, 2, ... in the file) · u16 tenant length · u16 id length ·
 *     u32 0 · u64 entry length (0 for DEL) · u64 XXH64 (seed 0) of the 32
 *     bytes before it, the tenant, the id and the entry · tenant · id · entry.
 *
 * Reading stops at the first record that does not check (short, bad magic,
 * type, lengths, checksum, sequence): the log is cut at the last good record
 * and nothing after it is applied, so a torn tail (a kill in the middle of
 * an append) or a damaged record is never half-applied.  Nothing here
 * trusts the file: every length is bounded by what is left of it. */
#ifndef CKV_PERSIST_WARMLOG_H
#define CKV_PERSIST_WARMLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKV_WARM_LOG "journal.log"
#define CKV_WARMLOG_HEADER_BYTES 32u
#define CKV_WARMLOG_RECORD_BYTES 40u
#define CKV_WARMLOG_TENANT_MAX 63u
#define CKV_WARMLOG_ID_MAX 128u

enum { CKV_WARMLOG_PUT = 1, CKV_WARMLOG_DEL = 2 };

/* A growable byte buffer: records are encoded into one, then appended. */
typedef struct ckv_warmlog_buf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} ckv_warmlog_buf;

/* Appends one record (seq, type, tenant, id, entry of n bytes; NULL/0 for
 * DEL) to b; b->oom says when memory ran out. */
void ckv_warmlog_encode(ckv_warmlog_buf *b, uint64_t seq, uint32_t type, const char *tenant, const char *id,
                        const uint8_t *entry, size_t n);
void ckv_warmlog_buf_done(ckv_warmlog_buf *b);

/* WARM_DIR/journal.log replaced by an empty log following the
 * manifest of checksum manifest_sum (temporary file, fsync, rename,
 * directory fsync), and opened for appending: CKV_OK with *ret_fd, or
 * -errno with err. */
int ckv_warmlog_create(const char *warm_dir, uint64_t manifest_sum, int *ret_fd, char *err, size_t errlen);
/* Appends len bytes of records to fd and makes them durable (fdatasync):
 * CKV_OK or -errno with err.  On failure part of them may be in the file. */
int ckv_warmlog_append(int fd, const void *buf, size_t len, char *err, size_t errlen);
/* Removes WARM_DIR/journal.log (a clean stop's journal has none). */
void ckv_warmlog_remove(const char *warm_dir);

/* One good record of a log read back (pointing into the log's buffer). */
typedef struct ckv_warmlog_rec {
  uint32_t type;
  uint64_t seq;
  uint64_t offset; /* in the file */
  char tenant[CKV_WARMLOG_TENANT_MAX + 1];
  char id[CKV_WARMLOG_ID_MAX + 1];
  const uint8_t *entry;
  size_t entry_len;
} ckv_warmlog_rec;

typedef struct ckv_warmlog {
  uint8_t *buf_;
  ckv_warmlog_rec *recs; /* the good records, in order */
  size_t n;
  uint64_t good_bytes; /* the file up to the end of the last good record */
  uint64_t file_bytes;
  char cut[300]; /* why reading stopped before the end of the file; "" when it
                    did not */
} ckv_warmlog;

/* Reads WARM_DIR/journal.log.  CKV_OK with *ret (its good records;
 * ret->cut says what was cut), -ENOENT when there is none, -ESTALE
 * when it follows another checkpoint than manifest_sum's, else a code
 * (CKV_ERR_CORRUPT: its header does not check) with err.  Free with
 * ckv_warmlog_done. */
int ckv_warmlog_read(const char *warm_dir, uint64_t manifest_sum, ckv_warmlog *ret, char *err, size_t errlen);
void ckv_warmlog_done(ckv_warmlog *l);

#endif
