/* shared_moves.h - the lifecycle on shared blocks: a shared prefix is
 * compressed once, for every session that holds it (issue 41).
 *
 * A shared block (store/prefix.h) never moves token by token: each holder's
 * judge decides its own states for the block's tokens, and the block's bytes
 * follow the most protective of them.  When every holder has judged every
 * token of a run of shared draft blocks at least staged, one holder (the
 * session whose plan finds the run: the leader) moves the run as one job
 * into a new block of the staged format (staged_tokens slots: consecutive
 * draft blocks with the same holders, in position order), and at publish
 * every holder's table points at that block instead, in the same epoch
 * rules as any move (each holder lets go of the old blocks once its own
 * reader acknowledged the epoch that dropped them).  Likewise a shared staged
 * block whose tokens every holder has committed (or demoted) moves once into
 * the rotated format of the most bits any holder asks for any of its tokens
 * (KIVI sessions keep shared blocks staged: their 32-token chunks do not map
 * onto whole shared blocks).  A shared token is never demoted, recycled or
 * dropped: that waits until one session alone holds the block, which is then
 * private again and follows its session's states.
 *
 * The compressed block takes the draft blocks' places in the tenant's
 * index: a session opened later with reuse_prefix links it and starts with
 * those tokens staged (or committed).  A compression whose holders changed
 * while it ran (a new holder that still wants the tokens draft, a holder
 * whose tokens moved) is dropped at publish, and tried again later. */
#ifndef CKV_STORE_SHARED_MOVES_H
#define CKV_STORE_SHARED_MOVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_compressor ckv_compressor;
typedef struct ckv_job ckv_job;

/* What the moves module lends this one (it calls in here, so it passes
 * them rather than being included back): see store/moves.c. */
typedef struct ckv_shared_moves_ops {
  /* one compressor job moving the tokens at pos[0..n) of s to slots
   * dst_slot[] of block dst (its refs already count them); CKV_OK, or a
   * negative status with nothing submitted and dst's slots released */
  int (*submit)(ckv_srv_session *s, ckv_compressor *c, const uint32_t *pos, const uint16_t *dst_slot, size_t n,
                uint32_t dst, ckv_job **ret_job);
  /* the rotated format committed token pos of s takes, CKV_FORMAT_COUNT_ in a KIVI session */
  uint32_t (*rot_format)(const ckv_srv_session *s, size_t pos);
} ckv_shared_moves_ops;

/* From ckv_moves_plan: when s has no compression in flight, looks for the
 * first run of its shared blocks that every holder's states allow
 * compressing, and submits it (s becomes its leader).  CKV_OK (also when
 * there was nothing to do, or no room: tried again at the next plan), or a
 * negative status. */
int ckv_shared_moves_plan(ckv_srv_session *s, ckv_compressor *c, const ckv_shared_moves_ops *ops);
/* Whether job j is s's compression of shared blocks. */
bool ckv_shared_moves_owns(const ckv_srv_session *s, const ckv_job *j);
/* Publishes s's compression job j (above); undoes it when the job failed or
 * its holders changed.  Frees j. */
void ckv_shared_moves_publish(ckv_srv_session *s, ckv_job *j, const ckv_shared_moves_ops *ops);
/* s goes away with its compression in flight: the blocks are free to be
 * compressed by another holder. */
void ckv_shared_moves_abandon(ckv_srv_session *s);

#endif
