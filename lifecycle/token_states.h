/* token_states.h - the constants a token's lifecycle is counted in
 * (constants only): its states, the rounds of attention history kept per
 * token, and the floor of "attended".  tokens.h (the columns) and the
 * vector record pass (record_simd.c) both use them. */
#ifndef CKV_LIFECYCLE_TOKEN_STATES_H
#define CKV_LIFECYCLE_TOKEN_STATES_H

/* Rounds of attention history per token (one byte each, a ring). */
#define CKV_ATTN_HISTORY 8u

/* Lifecycle states; the numbers match commitkv.proto TokenState. */
enum { CKV_STATE_DRAFT = 0, CKV_STATE_STAGED = 1, CKV_STATE_COMMITTED = 2, CKV_STATE_RECYCLED = 3 };

/* Relative attention at or above this counts as "attended" (for idle_rounds). */
#define CKV_ATTENDED_FLOOR 0.1f

#endif
