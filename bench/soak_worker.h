/* soak_worker.h - the state file of a verifying soak worker
 * (`commitkv-bench soak-worker`, bench/soak_worker.c), which
 * `commitkv-bench soak --verify-workers N` reads at the end.
 *
 * One file per worker slot, written whole with one pwrite at offset 0 before
 * every step whose effect a SIGKILL could leave unknown (an open of a new
 * conversation, an append, a drop) and after every step that changed what
 * the worker knows.  A single small pwrite is never torn by a kill, so the
 * next generation of the slot knows, for each session id of its pool, which
 * conversation (seed) is current, how many of its tokens were written, and
 * which conversations are known ended; the counters add up over all
 * generations of the slot, the killed ones included. */
#ifndef CKV_BENCH_SOAK_WORKER_H
#define CKV_BENCH_SOAK_WORKER_H

#include <stdint.h>

#define CKV_SOAK_MAGIC 0x314b4f53564b43ull /* "CKVSOK1" */
#define CKV_SOAK_MAX_IDS 16
#define CKV_SOAK_KEEP_ENDED 4 /* ended conversations remembered per id */

/* X(name, doc): one line adds a counter to the file, the sum and the output. */
#define CKV_SOAK_COUNTERS(X)                                                                  \
  X(bytes_verified, "K/V bytes read back that were exactly what their conversation wrote")    \
  X(wrong_bytes, "bytes read back that differ from what the current conversation wrote")      \
  X(stale_served, "bytes of an ended or replaced conversation served (must be 0)")            \
  X(ended_served, "resumes of an id known ended (dropped) that did not answer NOT_FOUND")     \
  X(tokens_unjudged, "tokens appended by a killed try whose K/V write was not recorded")      \
  X(nondraft_blocks, "blocks in a format other than FP16 draft (the fp16 policy has none)")   \
  X(tokens_lost, "written tokens a resume no longer had (a kill -9 before the autosave)")     \
  X(ids_reused, "new conversations opened on an id that had one before")                     \
  X(drops, "sessions dropped (DropSession answered 0)")                                       \
  X(replaces, "detached conversations replaced by a new open without a resume")              \
  X(closes, "sessions detached, to be resumed later")                                         \
  X(resumes_ok, "resumes that served the current conversation, verified")                    \
  X(resumes_after_restart, "of those, with tokens, after a daemon kill -9 since they were written") \
  X(resumes_not_found, "resumes answered NOT_FOUND")                                          \
  X(rounds, "rounds: append, write K/V, report, acknowledge, read back")                     \
  X(retries, "requests answered BUSY, EXISTS or a store error: tried again later")            \
  X(daemon_gone, "times the daemon went away under the worker (it reconnected)")              \
  X(errors, "other failed requests (logged)")

typedef struct ckv_soak_counters {
#define CKV_SOAK_FIELD_(name, doc) uint64_t name;
  CKV_SOAK_COUNTERS(CKV_SOAK_FIELD_)
#undef CKV_SOAK_FIELD_
} ckv_soak_counters;

/* One conversation of an id: its K/V is sw_pattern(seed, position, ...). */
typedef struct ckv_soak_conv {
  uint64_t seed;     /* 0: none */
  uint64_t written;  /* tokens [0, written) have their K/V written */
  uint64_t appended; /* tokens [written, appended) were being appended when a kill may have come */
} ckv_soak_conv;

enum {
  CKV_SOAK_NONE,     /* never opened */
  CKV_SOAK_LIVE,     /* cur is the id's conversation */
  CKV_SOAK_OPENING,  /* cur (empty) is being opened; old, if any, may still be the daemon's */
  CKV_SOAK_DROPPING, /* cur is being dropped: it may or may not still exist */
  CKV_SOAK_ENDED,    /* dropped (the daemon said 0): a resume must answer NOT_FOUND */
};

typedef struct ckv_soak_id {
  uint32_t phase;
  uint32_t incarnations; /* conversations this id has had */
  ckv_soak_conv cur, old;
  uint64_t ended[CKV_SOAK_KEEP_ENDED]; /* seeds of conversations known ended */
  uint64_t round;                 /* last round reported on the id: rounds only grow */
  uint64_t life;                  /* the daemon's life (soak restarts) when cur was last written */
} ckv_soak_id;

typedef struct ckv_soak_state {
  uint64_t magic;
  ckv_soak_counters c;
  ckv_soak_id ids[CKV_SOAK_MAX_IDS];
} ckv_soak_state;

_Static_assert(sizeof(ckv_soak_state) <= 4096, "one pwrite of at most a page");

#endif
