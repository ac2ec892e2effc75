/* compressor.h - executes token moves off the server thread.
 *
 * A job is a list of kernel moves (kernels.h ckv_move: source block/slot ->
 * destination block/slot, any of draft->staged, draft->committed,
 * staged->committed) over memory the server thread allocated and will
 * publish.  Worker threads run ckv_kernels_move and hand the job back; the
 * server thread collects finished jobs with ckv_compressor_collect when the
 * completion fd (an eventfd, polled by the server loop) becomes readable.
 *
 * Ordering: jobs with the same `lane` run one after another in submission
 * order (a session always uses one lane, so a move may read what an earlier
 * move of the same session wrote).  The queue is bounded: submit refuses with
 * CKV_ERR_BUSY when `depth` jobs are waiting, and the caller tries again later
 * (backpressure, visible in the stats as queue depth). */
#ifndef CKV_STORE_COMPRESSOR_H
#define CKV_STORE_COMPRESSOR_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

typedef struct ckv_compressor ckv_compressor;

typedef struct ckv_job {
  struct ckv_job *next; /* queue link (owned by the compressor while queued) */
  uint64_t lane;        /* jobs of one lane run in order */
  ckv_geometry geom;
  ckv_move *moves;
  size_t n_moves;
  ckv_block_header *headers; /* the daemon's records the moves' src_hdr/dst_hdr point into (owned) */
  void *owner;          /* the server's context for publishing (a session) */
  void *user;           /* the server's per-job data (what to publish) */
  int copy;             /* 1: same-format copies (compaction, ckv_copy_slots), 0: kernel moves */
  const struct ckv_blockmem *mem; /* runs the job on the blocks' memory (blockmem.h); NULL: host */
  int status;           /* result of ckv_kernels_move / ckv_copy_slots */
  uint64_t submitted_ns, done_ns;
} ckv_job;

/* Starts `threads` workers (0: execute synchronously inside submit, for
 * tests and single-core machines) with a queue of `depth` jobs. */
int ckv_compressor_new(unsigned threads, unsigned depth, ckv_compressor **ret);
/* Waits for every queued job to finish, then stops the workers. Finished
 * jobs not yet collected are freed with ckv_job_free. */
ckv_compressor *ckv_compressor_free(ckv_compressor *c);

/* Queues a job (ownership passes to the compressor until collected).
 * CKV_OK or CKV_ERR_BUSY (queue full: the job is not taken). */
int ckv_compressor_submit(ckv_compressor *c, ckv_job *job);
/* The eventfd that becomes readable when finished jobs wait to be collected. */
int ckv_compressor_fd(const ckv_compressor *c);
/* Takes every finished job, in completion order (per lane: submission order).
 * Returns a NULL-terminated list linked through ->next (may be NULL). */
ckv_job *ckv_compressor_collect(ckv_compressor *c);
/* Blocks until every job of `lane` submitted so far has finished (finished
 * jobs still need collecting).  For the quota-pressure path only. */
void ckv_compressor_drain_lane(ckv_compressor *c, uint64_t lane);

/* Jobs that may be submitted now without CKV_ERR_BUSY.  Only the submitting
 * thread adds jobs, so the room it sees can only grow until it submits. */
unsigned ckv_compressor_room(ckv_compressor *c);

/* Jobs waiting or running, and figures for the stats. */
typedef struct ckv_compressor_stats {
  uint64_t queued;      /* waiting + running now */
  uint64_t submitted, completed, refused_busy;
  uint64_t moves;
  uint64_t busy_ns;     /* total job execution time */
} ckv_compressor_stats;
void ckv_compressor_get_stats(ckv_compressor *c, ckv_compressor_stats *ret);

ckv_job *ckv_job_free(ckv_job *j);

#endif
