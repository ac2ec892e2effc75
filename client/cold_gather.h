/* cold_gather.h - the cold tokens a query needs most, gathered into one
 * FP16 block that attention reads with the view's others (internal to
 * libcommitkv; the API is ckv_session_cold_gather in commitkv.h).
 *
 * Reading whole cold blocks lets a 64-token block stand for the one token a
 * question needs: on the agent model with every lasting fact cold, the
 * four blocks whose key bounds pass the bar the most
 * (ckv_session_cold_select_top) caught 40% of the cold tokens' attention
 * mass (8 dialogues), and recall fell to 0.56 (tune seeds, 397 questions,
 * FP16 0.95; reading every cold block, 0.90 of 196).  So the choice is per
 * token, in two steps:
 *   1. every valid token of every cold block is scored from its block's
 *      summary (the one-bit key sketch, cold_sketch.h: no byte of the block
 *      is read), and ranked by the largest share of any query head's
 *      softmax mass over the cold tokens that its estimate gives it;
 *   2. the best CKV_COLD_GATHER_SHORTLIST x max_tokens are scored exactly
 *      from their keys in the cold copy, ranked the same way over the
 *      shortlist, and the best max_tokens have this layer's K and V written,
 *      as FP16, into the caller's block (ascending positions).
 * The same dialogues with 64 tokens a query, the exact score of every cold
 * token: 0.923.  The sketch is a weak ranker (correlation about 0.8 with the
 * score on Gaussian keys), so the shortlist is wide: on the 3x longer
 * dialogues (seed 9202 D, 66 questions; FP16 0.970) a shortlist of 4, 8 and
 * 16 x 64 answered 0.803, 0.879 and 0.894, the exact score of every cold
 * token 0.894, the sketch alone (seed 9202 base) 0.818 against 0.909.  Head
 * dims without a sketch, and blocks whose bytes did not all read back, are
 * scored exactly token by token. */
#ifndef CKV_CLIENT_COLD_GATHER_H
#define CKV_CLIENT_COLD_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "client/cold_select.h"
#include "commitkv/commitkv.h"
#include "kernels/format.h"

#define CKV_COLD_GATHER_SHORTLIST 16u /* x max_tokens scored exactly */

typedef struct ckv_cold_gather_scratch ckv_cold_gather_scratch;

void ckv_cold_gather_scratch_free(ckv_cold_gather_scratch *s);

/* ckv_session_cold_gather's work on a host-memory view (*cache and *scratch
 * are created on first use).  Returns CKV_OK, CKV_ERR_INVALID, -ENOMEM. */
int ckv_cold_gather(ckv_cold_cache **cache, ckv_cold_gather_scratch **scratch, const ckv_geometry *g,
                    const ckv_view *v, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                    uint32_t max_tokens, void *block, uint32_t capacity, uint32_t *ret_src, size_t *ret_n);

#endif
