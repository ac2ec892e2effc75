/* snapshot.h - the session snapshot file: a writer and a validating reader
 * (docs/snapshot.md describes the format byte by byte).
 *
 * No server inside: a snapshot is a plain description (ckv_snap) of one
 * session's identity, geometry, policy state, token columns and blocks, and
 * this module turns it into a file and back.  The file is untrusted input
 * (anyone with write access to the state directory, a torn disk, a kill
 * during a write): the reader checks every checksum, every length and every
 * cross reference (tokens -> block slots -> positions -> tokens) before it
 * hands anything out, and answers a failure with a code and a sentence:
 *   CKV_ERR_CORRUPT  truncated, a checksum or magic mismatch, an inconsistent
 *                    table (never half-loaded);
 *   CKV_ERR_FORMAT   another format version, block layout or rotation seed
 *                    than this build's; a geometry beyond the limits;
 *   -errno           the file cannot be read.
 * Identity checks against what a caller expects (tenant, model id and
 * revision, geometry) are ckv_snap_check_identity's.
 *
 * Writes are atomic: a temporary file in the same directory, fsync, rename,
 * fsync of the directory; a crash at any point leaves the previous snapshot
 * of that name intact. */
#ifndef CKV_PERSIST_SNAPSHOT_H
#define CKV_PERSIST_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"
#include "lifecycle/judge.h"
#include "lifecycle/tokens.h"

/* 3: the header ends with the session's incarnation (which conversation of
 * its id the copy holds); version 2 files are read with incarnation 0
 * (unknown).  2: the rotated formats' scales are one byte
 * (kernels/format.h); 1 had FP16 scales. */
#define CKV_SNAP_VERSION 3u
#define CKV_SNAP_VERSION_MIN 2u
#define CKV_SNAP_SUFFIX ".ckvsnap"
/* A file being written is NAME.ckvsnap~tmp~PID~N until it is renamed into
 * place: '~' is in no legal id or snapshot name, so the sweep at start
 * (snapdir.h) can never take a session's file for a temporary one. */
#define CKV_SNAP_TEMP_MARK "~tmp~"
#define CKV_SNAP_TENANT_MAX 63u
#define CKV_SNAP_ID_MAX 128u
#define CKV_SNAP_MODEL_MAX 128u
#define CKV_SNAP_POLICY_MAX 15u

/* ckv_snap.flags */
enum {
  CKV_SNAP_COMMITTED_ONLY = 1u,
  /* A warm-restart journal entry (warm.h): each BLOCK holds its header
   * region and the block's place in the arena kept across the restart
   * (arena_offset, slab_offset) instead of its payload.  Never a snapshot:
   * only the journal reads it (session_snap.c refuses it elsewhere). */
  CKV_SNAP_BLOCK_REFS = 2u,
};

/* One block of the session.  meta: the daemon's private header region
 * (ckv_block_payload_offset(capacity) bytes: header, positions, valid
 * bitmap); payload: the rest of the block (bytes - payload offset).  The
 * writer copies payload before it hashes it (a worker may be writing draft
 * slots); after ckv_snap_read both point into the reader's buffer. */
typedef struct ckv_snap_block {
  uint32_t index; /* in the session's block table */
  uint8_t format;
  uint16_t capacity;
  uint16_t used;
  uint32_t kept; /* key channels kept (committed formats), 0 otherwise */
  uint64_t bytes;
  const uint8_t *meta;
  const uint8_t *payload;  /* NULL with CKV_SNAP_BLOCK_REFS */
  uint64_t arena_offset;   /* CKV_SNAP_BLOCK_REFS: the block's offset in its arena */
  uint64_t slab_offset;    /* CKV_SNAP_BLOCK_REFS: block 0 of its slab (shm/slab.h ckv_slab_claim) */
} ckv_snap_block;

typedef struct ckv_snap {
  /* identity */
  char tenant[CKV_SNAP_TENANT_MAX + 1];
  char session_id[CKV_SNAP_ID_MAX + 1];
  char model_id[CKV_SNAP_MODEL_MAX + 1];
  char model_revision[CKV_SNAP_MODEL_MAX + 1];
  uint64_t saved_at_ms; /* CLOCK_REALTIME */
  uint64_t incarnation; /* the session's (store/session.h); 0: unknown (a version 2 file) */
  uint32_t flags;       /* CKV_SNAP_* */
  uint64_t dropped_tokens; /* committed_only: draft/staged tokens not kept (recycled in the snapshot) */
  /* geometry and block capacities */
  ckv_geometry geom;
  uint32_t draft_tokens, staged_tokens, commit_tokens;
  /* policy state */
  char policy[CKV_SNAP_POLICY_MAX + 1];
  ckv_judge_params params; /* mlp: not a pointer in the file; params_mlp says it was on */
  bool params_mlp;
  uint64_t epoch, rounds, last_round, semantic_given;
  uint64_t count_by_state[4];
  uint64_t transitions[4][4];
  uint32_t fill[CKV_FORMAT_COUNT_]; /* block index being filled per format, CKV_NO_BLOCK */
  uint32_t n_table;                 /* block-table size: every index is below it */
  /* token columns (the writer's are borrowed; the reader's are owned) */
  ckv_tokens tokens;
  uint32_t *ids;           /* n_ids pairs (token id, occurrences): the semantic estimate's counts */
  size_t n_ids;
  ckv_snap_block *blocks; /* in increasing index order */
  size_t n_blocks;
  /* the bytes blocks point into (owned): the file's (ckv_snap_read) or the
   * session's copied blocks (ckv_session_snap_capture); NULL when borrowed */
  uint8_t *buf_;
  size_t buf_len_;
} ckv_snap;

/* Writes `snap` to dir/name.ckvsnap atomically (see above).  name is a
 * session-id-like string (checked by the caller).  *ret_bytes: file size.
 * Returns CKV_OK or -errno / -ENOMEM with err saying what failed. */
int ckv_snap_write(const char *dir, const char *name, const ckv_snap *snap, uint64_t *ret_bytes, char *err,
                   size_t errlen);

/* The bytes ckv_snap_write would write for `snap`, in memory (*ret
 * malloc'd; ckv_snap_parse reads them): CKV_OK or -ENOMEM. */
int ckv_snap_encode(const ckv_snap *snap, uint8_t **ret, size_t *ret_len);

/* The size in bytes of the file ckv_snap_write would write for `snap`
 * (exactly: the disk quota charges a save before it is written). */
uint64_t ckv_snap_file_size(const ckv_snap *snap);

/* Reads and validates a whole snapshot from memory (buf is copied).  On
 * success *ret is filled (free with ckv_snap_done); on failure nothing is
 * allocated and err says what is wrong (codes above). */
int ckv_snap_parse(const void *buf, size_t len, ckv_snap *ret, char *err, size_t errlen);
/* ckv_snap_parse of the file at path. */
int ckv_snap_read(const char *path, ckv_snap *ret, char *err, size_t errlen);
/* Only the header section (identity, geometry, counts): for listings.  The
 * token columns and blocks of *ret stay empty; nothing to free. */
int ckv_snap_read_header(const char *path, ckv_snap *ret, char *err, size_t errlen);
void ckv_snap_done(ckv_snap *s);

/* What a restore expects; NULL strings / a zero geometry are not checked. */
typedef struct ckv_snap_expect {
  const char *tenant;
  const char *session_id; /* a resume: the copy must be this session's (never one stored under its name by mistake or forgery) */
  const char *model_id, *model_revision;
  const ckv_geometry *geom;
} ckv_snap_expect;

/* CKV_ERR_AUTH (another tenant's), CKV_ERR_FORMAT (another model id,
 * revision or geometry) with err naming both sides, else CKV_OK. */
int ckv_snap_check_identity(const ckv_snap *s, const ckv_snap_expect *e, char *err, size_t errlen);

/* Section types (docs/snapshot.md). */
enum {
  CKV_SNAP_SEC_HEADER = 1,
  CKV_SNAP_SEC_TOKENS = 2,
  CKV_SNAP_SEC_IDS = 3,
  CKV_SNAP_SEC_BLOCK = 4,
  CKV_SNAP_SEC_END = 0x454e44u, /* "END" */
};
#define CKV_SNAP_PREAMBLE_BYTES 16u
#define CKV_SNAP_SECTION_HEADER_BYTES 24u

#endif
