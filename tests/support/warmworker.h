/* warmworker.h - a worker of the kill -9 tests (test_warm_kill9): a session
 * and the worker's private copy of every K/V element it wrote, so that what
 * comes back after a kill is compared byte for byte with what was written
 * (a write salt per round: an older write or another session's bytes fail). */
#ifndef CKV_TEST_WARMWORKER_H
#define CKV_TEST_WARMWORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv/commitkv.h"
#include "warmcheck.h"

/* The tokens a worker's session holds at most (its private copy's size). */
#define CKV_WARM_MAX_TOKENS 1024u
/* K (or V) elements of one token in one layer. */
#define CKV_WARM_ELEMS (CKV_WARM_HEADS * CKV_WARM_DIM)

/* Long enough for the moves of the last round to land and the journal (100 ms period, housekeeping 100 ms, the
 * write) to hold every change, with room for a loaded machine (2 shared cores at a load of 3-4 here).
 * The premise is time-based: the journal promises a period plus the write, not a bound under any load. */
#define CKV_WARM_SETTLE_US 1500000u

/* A worker's session and its private copy of every K/V element it wrote. */
typedef struct ckv_warm_worker {
  char id[32];
  const char *policy;
  ckv_session *s;
  size_t n;          /* tokens the worker believes the session holds */
  uint32_t round;    /* the last round number it reported (strictly increasing, gaps allowed) */
  uint32_t salt;     /* bumped at every write: a token rewritten after a kill gets new bytes */
  uint16_t *copy;    /* [pos][layer][kv][CKV_WARM_ELEMS] */
  size_t settled;    /* tokens at the last point the journal had time to catch up */
  bool ended;        /* dropped on purpose */
} ckv_warm_worker;

/* The worker's copy of K (kv 0) or V (kv 1) of `pos` in `layer`. */
uint16_t *ckv_warm_worker_at(ckv_warm_worker *w, size_t pos, uint32_t layer, uint32_t kv);
/* Opens session `id` with `policy` ("fp16", or "commitkv": moves that free
 * and reallocate blocks) and allocates the private copy. */
void ckv_warm_worker_open(ckv_client *c, ckv_warm_worker *w, const char *id, const char *policy);
/* One round: CKV_WARM_PER_ROUND tokens appended and written (the private
 * copy keeps them); unless half, reported and acked. */
void ckv_warm_worker_round(ckv_client *c, ckv_warm_worker *w, bool half);
/* The session's view after a resume: every draft slot holds a position
 * below its token count, at most once, with exactly the bytes the worker
 * wrote there; with draft_only, every position below the count is in a
 * draft slot.  Returns the count. */
/* Every draft slot of view v holds a position below t, at most once, and
 * every written position (all when written is NULL, else those with
 * written[pos] set) reads exactly the worker's bytes; with draft_only,
 * every position below t is in a slot. */
void ckv_warm_worker_compare(const ckv_view *v, ckv_warm_worker *w, size_t t, const uint8_t *written,
                             bool draft_only, const char *when);
size_t ckv_warm_worker_verify(ckv_client *c, ckv_warm_worker *w, bool draft_only, const char *when);
/* After a restart: the worker resumes w; CKV_OK with the session's count
 * checked (ckv_warm_worker_verify) and the worker's books set to it, else
 * the code and the daemon's text in msg. */
int ckv_warm_worker_resume(ckv_client *c, ckv_warm_worker *w, char *msg, size_t msglen, size_t *ret_tokens,
                           const char *when);
/* Closes the session and frees the copy. */
void ckv_warm_worker_free(ckv_warm_worker *w);

#endif
