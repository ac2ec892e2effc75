/* session.h - one KV-cache session: geometry, block table, per-token
 * metadata, view epochs and the blocks waiting for readers to let go.
 *
 * Memory rules (DESIGN.md §4):
 * - every block of a session lives in its tenant's arena;
 * - a block leaves the view by being *retired* with the epoch that dropped it;
 *   it returns to the allocator only once the reader acknowledged that epoch
 *   (or no reader is attached any more);
 * - a block's `refs` counts its slots that hold or will hold a token (valid
 *   or reserved for a move in flight); a block with no refs that is no longer
 *   being filled is retired;
 * - appends fill the current draft block, then allocate a new one; moves fill
 *   the current staged / committed block in transition order. */
#ifndef CKV_STORE_SESSION_H
#define CKV_STORE_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"
#include "lifecycle/judge.h"
#include "lifecycle/tokens.h"

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_pblock ckv_pblock;
typedef struct ckv_prefix_chain ckv_prefix_chain;

#define CKV_SESSION_ID_MAX 128
#define CKV_SESSION_MODEL_MAX 128 /* model id and revision (OpenSession.model_id / model_revision) */
#define CKV_BLOCK_UNUSED 0xffu

typedef struct ckv_sblock {
  uint64_t id;      /* unique per daemon run: clients key caches on it */
  uint64_t offset;  /* in the tenant's arena */
  uint64_t bytes;
  uint8_t format;   /* ckv_format, or CKV_BLOCK_UNUSED for a free table entry */
  uint16_t capacity;
  uint16_t used;    /* slots handed out so far (filled in order) */
  uint16_t refs;    /* slots valid or reserved */
  uint8_t meta_state; /* CKV_META_*: state of the private shadow of the header region */
  uint8_t *meta;    /* private shadow of the header region: the daemon never reads the arena's */
  /* Not NULL: the arena block is a shared one (store/prefix.h) that other
   * sessions' tables may point at too; it goes back to the allocator only
   * when its last holder lets go.  The daemon never writes it while shared. */
  ckv_pblock *shared;
} ckv_sblock;

/* ckv_sblock.meta_state: the shadow matches the arena, differs from it, or
 * belongs to a block the arena has not seen initialised yet (its payload is
 * zeroed by the flush too). */
enum { CKV_META_CLEAN = 0, CKV_META_DIRTY = 1, CKV_META_FRESH = 2 };

typedef struct ckv_retired {
  uint64_t offset, bytes;
  uint8_t format;
  uint64_t epoch; /* freed once the reader acked this epoch */
  ckv_pblock *shared; /* a shared block: one holder fewer then (prefix.h), not a free */
} ckv_retired;

/* A run of consecutive slots handed out by ckv_srv_session_append. */
typedef struct ckv_slot_run {
  uint32_t block;  /* index in the block table */
  uint32_t first_slot;
  uint32_t count;
  uint64_t first_position;
} ckv_slot_run;

/* Fill blocks, two per format: fill[f] takes the tokens of format f,
 * fill[CKV_FILL_COLD + f] only demoted ones (rotated formats: moves.c keeps
 * demoted tokens out of the blocks live tokens use, so a block is either
 * primary or cold, store/cold.h).  Snapshots keep the first CKV_FORMAT_COUNT_. */
enum {
  CKV_FILL_DRAFT = CKV_FORMAT_DRAFT,
  CKV_FILL_STAGED = CKV_FORMAT_STAGED,
  CKV_FILL_COLD = CKV_FORMAT_COUNT_,
  CKV_FILL_COUNT = 2 * CKV_FORMAT_COUNT_
};

typedef struct ckv_srv_session {
  char id[CKV_SESSION_ID_MAX + 1];
  ckv_tenant *tenant;
  ckv_geometry geom;
  uint32_t draft_tokens;  /* capacity of draft blocks */
  uint32_t staged_tokens; /* capacity of staged blocks */
  uint32_t commit_tokens; /* capacity of committed blocks */
  char policy[16];
  /* What the K/V was computed by: part of the session's identity (a resume
   * or restore by another model or revision is refused; snapshots carry it). */
  char model_id[CKV_SESSION_MODEL_MAX + 1];
  char model_revision[CKV_SESSION_MODEL_MAX + 1];
  ckv_judge_params params;
  ckv_tokens tokens;
  ckv_sblock *blocks;
  size_t n_blocks, cap_blocks;
  uint32_t *free_idx;       /* unused block-table entries (a stack) */
  size_t n_free_idx;
  uint32_t fill[CKV_FILL_COUNT]; /* block being filled per format, CKV_NO_BLOCK when none */
  /* Which conversation of this id it is: random and never 0, new at each
   * OpenSession without resume and each RestoreSession, carried by every
   * copy (snapshot, autosave, tier file, remote value, warm journal); a
   * resume takes only a copy of the incarnation persist/ last recorded for
   * the id (persist/incarnations.h). */
  uint64_t incarnation;
  uint64_t epoch;       /* current view epoch */
  uint64_t acked_epoch; /* highest epoch the reader acknowledged */
  ckv_retired *retired;
  size_t n_retired, cap_retired;
  uint64_t owner;           /* client id of the attached reader/writer, 0 = detached */
  uint64_t detached_at_ms;  /* when owner became 0 */
  /* Rebuilt by a warm restart and not resumed yet: its worker may still read
   * its blocks through the mapping it kept (no memory-pressure move). */
  bool warm_unresumed;
  uint64_t rounds;          /* ReportRounds received */
  uint64_t last_round;      /* round number of the last ReportRound */
  uint64_t count_by_state[4]; /* logical states */
  uint64_t transitions[4][4]; /* counts by (from, to) */
  uint64_t semantic_given;   /* tokens whose semantic score came from the worker (else estimated) */
  /* The cold tier (cold.h): drops, recalls, the cold blocks the worker read,
   * and the demoted positions the last report found attended. */
  uint64_t tokens_dropped, tokens_recalled, recalled_blocks;
  uint32_t *recall;
  size_t n_recall, cap_recall;
  uint64_t lane;            /* compressor lane: this session's moves run in order */
  uint32_t jobs_inflight;   /* compressor jobs not yet published */
  bool doomed;              /* dropped while jobs were in flight: freed when they finish */
  bool plan_dirty;          /* the last plan stopped early (quota, full queue, bound): plan again */
  bool shared_waiting;      /* it holds shared blocks not yet compressed as far as they may go (shared_moves.h) */
  bool cold_dirty;          /* tokens were demoted or recalled: blocks may mix live and demoted ones (moves.c) */
  /* Moves one plan call makes at most (moves.c; 0: CKV_MOVES_PLAN_MAX_MOVES, UINT32_MAX: no bound). */
  uint32_t plan_max_moves;
  /* Positions below plan_from have nothing to plan (moves.c lowers it
   * when a state changes there), so a plan made in parts does not rescan
   * them; `moving`: tokens in compressor jobs not yet published. */
  size_t plan_from;
  uint64_t moving;
  bool plan_flush; /* a flushing plan was made in parts: its later parts flush too */
  /* A compressor job on this session failed: how many in a row, and whether
   * the session is quarantined (its blocks hold bytes the daemon did not
   * write: no more moves, appends and reports refused; drop it) and why. */
  uint32_t job_failures;
  /* The last plan could not reserve destination blocks (CKV_ERR_QUOTA or
   * CKV_ERR_NOSPACE, 0 = it could); stall_logged: that was said once. */
  int stalled_on;
  bool stall_logged;
  bool quarantined;
  char quarantine_reason[160];
  /* The token ids OpenSession gave with reuse_prefix (the prefix the worker
   * means to share): the blocks it publishes below this wait
   * share_grace_rounds for a second holder (store/prefix.h). */
  uint64_t declared_prefix_tokens;
  uint64_t pending;         /* tokens whose bytes do not match their state (as of the last plan) */
  uint64_t *next_block_id;  /* daemon-wide counter */
  struct idcount *ids;      /* token id -> occurrences, for the semantic estimate */
  /* Header shadows: block-table indices
   * whose shadow is not CLEAN, each once (room for cap_blocks), and this
   * session's link in the daemon's list of sessions with dirty shadows. */
  uint32_t *dirty;
  size_t n_dirty;
  struct ckv_srv_session *dirty_prev, *dirty_next;
  bool dirty_listed;
  struct ckv_srv_session **dirty_head; /* daemon-wide list head; NULL: not tracked */
  /* The disk tier (tier.h): when a request last named the session (0: not
   * yet seen by the tier), and its tier state (NULL: resident, never moved). */
  uint64_t touched_ms;
  struct ckv_tier_slot *tier;
  /* Autosave (autosave.h): tokens when the last ReportRound came (more now: the
   * worker may still be writing their K/V), what the last autosave captured
   * (rounds + tokens + epoch; 0: none yet) and when. */
  size_t reported_tokens;
  uint64_t autosave_mark, autosave_ms;
  uint64_t autosave_dirty_ms; /* when it first differed from its last autosave copy (0: it does not) */
  /* The continuous warm journal (persist/warmjournal.h): what its last
   * journal entry captured (a hash of rounds, tokens, epoch and the block
   * table; 0: no entry yet, or it must be written again). */
  uint64_t warm_mark;
  /* Content keys of its draft blocks (store/prefix.h); NULL until first needed. */
  ckv_prefix_chain *chain;
  /* Its compression of shared blocks in flight, as their leader
   * (store/shared_moves.h), and how ckv_srv_session_free lets go of it. */
  struct ckv_shared_swap *swap;
  void (*swap_abandon)(struct ckv_srv_session *s);
} ckv_srv_session;

/* Validate a geometry against the format limits; fills default block sizes.
 * CKV_ERR_LIMIT (beyond limits) or CKV_ERR_INVALID (zero/unknown dtype). */
int ckv_srv_session_check_geometry(ckv_geometry *g, uint32_t *draft_tokens, uint32_t *commit_tokens);

int ckv_srv_session_new(const char *id, ckv_tenant *tenant, const ckv_geometry *g, uint32_t draft_tokens,
                        uint32_t commit_tokens, const char *policy, const ckv_judge_params *params,
                        uint64_t *next_block_id, ckv_srv_session **ret);
/* Frees every block (the caller guarantees no reader and no job remains) and the session. */
ckv_srv_session *ckv_srv_session_free(ckv_srv_session *s);

/* Hand out `count` draft slots for new tokens.  roles/tags/semantic/token_ids
 * may be NULL.  Fills runs[0..*ret_n_runs) (room for ckv_srv_session_max_runs)
 * and the first position.  Nothing changes on failure (CKV_ERR_QUOTA,
 * CKV_ERR_NOSPACE, -ENOMEM). */
size_t ckv_srv_session_max_runs(const ckv_srv_session *s, uint32_t count);
/* Bytes of the new draft blocks an append of `count` tokens would allocate. */
uint64_t ckv_srv_session_append_bytes(const ckv_srv_session *s, uint32_t count);
int ckv_srv_session_append(ckv_srv_session *s, uint32_t count, const uint8_t *roles, const uint8_t *tags,
                           const float *semantic, const uint32_t *token_ids, ckv_slot_run *runs, size_t *ret_n_runs,
                           uint64_t *ret_first_position);

/* Record a round's attention (ckv_tokens_record_round) and semantic updates.
 * CKV_ERR_INVALID when the round does not increase, CKV_ERR_RANGE when the
 * range lies beyond the tokens. Does not run the judge (moves.c does). */
int ckv_srv_session_report_round(ckv_srv_session *s, uint64_t round, uint64_t first, const float *attn, size_t n,
                                 const uint32_t *sem_pos, const float *sem_scores, size_t n_sem);

/* Allocate and initialise a block of `format` (capacity by format) and return
 * its table index.  CKV_ERR_QUOTA / CKV_ERR_NOSPACE / -ENOMEM. */
int ckv_srv_session_new_block(ckv_srv_session *s, uint32_t format, uint32_t *ret_index);
/* One fewer slot of `block` in use; retires the block when nothing is left in
 * it and it is no longer being filled. */
void ckv_srv_session_release_slot(ckv_srv_session *s, uint32_t block);
/* Take a block out of the view (bumps the epoch; freed after the ack). */
void ckv_srv_session_retire_block(ckv_srv_session *s, uint32_t block);
/* The reader acknowledged `epoch`: free what it no longer can read.  Returns
 * bytes reclaimed.  An epoch beyond the current one is CKV_ERR_RANGE. */
int ckv_srv_session_ack(ckv_srv_session *s, uint64_t epoch, uint64_t *ret_reclaimed);
/* No reader any more (detached or lease expired): free everything retired. */
uint64_t ckv_srv_session_release_retired(ckv_srv_session *s);

uint64_t ckv_srv_session_bytes(const ckv_srv_session *s);
/* FP16 bytes of every token appended (recycled ones included). */
uint64_t ckv_srv_session_fp16_bytes(const ckv_srv_session *s);
/* Adds the session's token counts (draft, staged, committed, recycled) to
 * tok4 and its bytes (draft, staged, committed, total, fp16 equivalent) to
 * bytes5: the one definition stats, listings and metrics share. */
void ckv_srv_session_figures(const ckv_srv_session *s, uint64_t tok4[4], uint64_t bytes5[5]);
/* Daemon-side address of block `index` (a device pointer on device arenas:
 * for kernels only). */
void *ckv_srv_session_block_ptr(const ckv_srv_session *s, uint32_t index);
/* Where the daemon writes block `index`'s header region (header, positions,
 * valid bitmap): its private shadow, which is then marked dirty and written
 * to the arena by the next ckv_srv_session_flush_meta().  Never NULL for a
 * live block. */
void *ckv_srv_session_block_meta(ckv_srv_session *s, uint32_t index);
/* The daemon's own record of block `index`'s header (in the shadow; the
 * arena's copy is worker-writable and never read).  Never NULL for a live
 * block. */
const ckv_block_header *ckv_srv_session_block_header(const ckv_srv_session *s, uint32_t index);
/* Writes every dirty shadow of the session into the arena (one blockmem
 * write) and returns once readers can see it; nothing to do without
 * shadows.  On failure the shadows stay dirty (a later flush retries).
 * Returns CKV_OK or the blockmem's error (CKV_ERR_DEVICE, -ENOMEM). */
int ckv_srv_session_flush_meta(ckv_srv_session *s);
/* Restore from a snapshot (session_snap.c): allocates a block of `format`
 * at table index `index` (the table grows to hold it; entries it skips stay
 * unused until ckv_srv_session_restore_free_list), with a fresh header
 * shadow marked dirty (not fresh: its payload is the caller's to write).
 * The entry must be unused.  CKV_ERR_QUOTA / CKV_ERR_NOSPACE / -ENOMEM /
 * CKV_ERR_INVALID. */
int ckv_srv_session_restore_block(ckv_srv_session *s, uint32_t index, uint32_t format);
/* Points table entry `index` (CKV_NO_BLOCK: any free one) at shared block
 * pb: one more holder, the same offset and id, a clean copy of pb's header
 * shadow, every slot in use.  The caller adds the tokens.  CKV_OK, -ENOMEM
 * or CKV_ERR_INVALID (the entry is in use). */
int ckv_srv_session_link_block(ckv_srv_session *s, ckv_pblock *pb, uint32_t index, uint32_t *ret_index);
/* After the restored blocks are placed: every unused table entry becomes free. */
void ckv_srv_session_restore_free_list(ckv_srv_session *s);
/* The token-id counts of the semantic estimate as n (id, count) pairs
 * (malloc'd; NULL with n 0 when empty).  CKV_OK or -ENOMEM. */
int ckv_srv_session_id_counts(const ckv_srv_session *s, uint32_t **ret_pairs, size_t *ret_n);
/* Sets the count of token id `id` (restore).  CKV_OK or -ENOMEM. */
int ckv_srv_session_set_id_count(ckv_srv_session *s, uint32_t id, uint32_t count);

/* The disk tier took the session's bytes (tier.c): every block, live and
 * retired, goes back to the tenant's allocator and the block table is
 * emptied; token columns and policy state stay (stats still count them, the
 * tier file holds the same).  Until its blocks come back (a new session
 * built from the tier file takes this one's place) nothing may read or move
 * its tokens.  Returns the bytes freed. */
uint64_t ckv_srv_session_evict_blocks(ckv_srv_session *s);

/* Flushes every session on the daemon-wide dirty list `head` (see
 * ckv_srv_session.dirty_head).  Returns CKV_OK or the first error. */
int ckv_srv_session_flush_all_meta(ckv_srv_session **head);

#endif
