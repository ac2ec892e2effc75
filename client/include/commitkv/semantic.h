/* commitkv/semantic.h - semantic scores from a worker's own embeddings.
 *
 * The transition judge's second filter (after attention) is a per-token
 * semantic score in [0,1]: filler ("ok", "got it") scores low and is never
 * promoted; a worker-given score of at least 0.8 marks a committed token as
 * a lasting fact.  A worker that has an embedding of each turn (for a
 * transformer: the mean of its final hidden state over the turn's tokens)
 * computes the scores here and sends them with ckv_session_append or
 * ckv_session_set_semantic; without them the daemon estimates a score from
 * token-id rarity (its `semantic_estimate` fallback).
 *
 * Per turn t, with u_t its embedding scaled to unit length:
 *   - centring: when at least CKV_SEMANTIC_CENTER_MIN turns are usable, the
 *     mean of the u_t is subtracted from each (hidden states of one model
 *     share a large common direction, which would put every cosine near 1);
 *   - the topic: the turns from the last turn flagged
 *     CKV_SEMANTIC_TOPIC_SHIFT on (all turns without one);
 *   - the task: the sum of the centred vectors of the topic's turns flagged
 *     CKV_SEMANTIC_TASK (the turns that state it: a system prompt, the
 *     user's request), or of its first usable turn when none is flagged.
 *     Not the whole topic: centred on the session's mean, every turn of a
 *     session without a shift would sum to nothing;
 *   - relevance = max(0, cos(turn, task)): similarity to the current task;
 *   - novelty = 1 - max(0, max cos(turn, earlier turn)) (1 for the first
 *     usable turn): a repeated question or filler adds nothing new;
 *   - score = task * relevance + novelty * novelty_weight, times `abandoned`
 *     for a turn before the last topic shift, clamped to [0,1].
 * A turn whose embedding has a NaN or infinite value, or is all zeros, is
 * unusable: it scores `invalid` and takes part in nothing else.  Every
 * token gets its turn's score.  Deterministic: the same input gives the
 * same scores, bit for bit, on the same build.
 *
 * Nothing here talks to the daemon, prints or keeps global state.  Plain
 * ISO C11. */
#ifndef COMMITKV_SEMANTIC_H
#define COMMITKV_SEMANTIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKV_SEMANTIC_TOPIC_SHIFT 1u /* turn flag: this turn abandons the topic before it */
#define CKV_SEMANTIC_TASK 2u        /* turn flag: this turn states the topic's task */
#define CKV_SEMANTIC_CENTER_MIN 3   /* usable turns needed before embeddings are centred */
#define CKV_SEMANTIC_MAX_DIM 65536  /* embedding width accepted at most */

/* How the parts combine.  task + novelty <= 1, every field in [0,1]. */
typedef struct ckv_semantic_weights {
  float task;      /* weight of relevance to the current topic (default 0.6) */
  float novelty;   /* weight of novelty against earlier turns (default 0.4) */
  float abandoned; /* factor on turns before the last topic shift (default 0.5) */
  float invalid;   /* score of a turn without a usable embedding (default 0.5: neutral) */
} ckv_semantic_weights;

/* The defaults above. */
ckv_semantic_weights ckv_semantic_weights_default(void);

/* Scores n_tokens tokens: embeddings holds n_turns rows of dim floats (turn
 * order); turn_flags (n_turns bytes, NULL: none) the CKV_SEMANTIC_* flags of
 * each turn; token_turn[i] the turn of token i; weights NULL for the
 * defaults.  Writes ret_scores[0..n_tokens-1], each in [0,1], only on
 * success.  Nothing is kept.
 * Returns CKV_OK; CKV_ERR_INVALID (a NULL array that is needed, n_turns 0,
 * dim 0 or above CKV_SEMANTIC_MAX_DIM, weights out of range); CKV_ERR_RANGE
 * (a token_turn beyond n_turns); CKV_ERR_TOO_LARGE (n_turns x dim does not
 * fit in memory sizes); -ENOMEM. */
int ckv_semantic_from_embeddings(const float *embeddings, size_t n_turns, size_t dim, const uint8_t *turn_flags,
                                 const uint32_t *token_turn, size_t n_tokens, const ckv_semantic_weights *weights,
                                 float *ret_scores);

/* The same, fed token by token: a worker adds each token's embedding as it
 * runs it, marks topic shifts, and asks for every token's scores when it
 * reports a round.  A turn's embedding is the sum of its tokens' (cosines
 * do not see the scale, so this is their mean).  Not thread-safe. */
typedef struct ckv_semantic_turns ckv_semantic_turns;

/* A collector of dim-float embeddings.  Returns CKV_OK, CKV_ERR_INVALID
 * (dim 0 or above CKV_SEMANTIC_MAX_DIM, ret NULL), -ENOMEM. */
int ckv_semantic_turns_new(size_t dim, ckv_semantic_turns **ret);
/* Frees t; NULL is fine.  Returns NULL. */
ckv_semantic_turns *ckv_semantic_turns_free(ckv_semantic_turns *t);
/* Adds the next token: embedding (dim floats, copied); new_turn non-zero
 * starts a turn with it (the first token always does).  Returns CKV_OK,
 * CKV_ERR_INVALID (NULL), CKV_ERR_LIMIT (UINT32_MAX tokens), -ENOMEM. */
int ckv_semantic_turns_add(ckv_semantic_turns *t, const float *embedding, int new_turn);
/* ORs CKV_SEMANTIC_* flags into the current (last) turn.  Returns CKV_OK,
 * CKV_ERR_INVALID (NULL), CKV_ERR_STATE (no token yet). */
int ckv_semantic_turns_mark(ckv_semantic_turns *t, uint8_t flags);
/* Tokens added so far (0 for NULL). */
size_t ckv_semantic_turns_tokens(const ckv_semantic_turns *t);
/* Scores of every token added so far into ret_scores (that many floats),
 * as ckv_semantic_from_embeddings gives them.  Returns its codes, and
 * CKV_ERR_STATE when no token was added. */
int ckv_semantic_turns_scores(const ckv_semantic_turns *t, const ckv_semantic_weights *weights, float *ret_scores);

#ifdef __cplusplus
}
#endif
#endif
