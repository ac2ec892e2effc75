/* tokens.h - per-token metadata of one session, kept as columns.
 *
 * The index into every column is the token's session position (positions are
 * dense: 0, 1, 2, ... in append order).  Columns, not an array of structs, so
 * the judge's pass over a round streams only what it reads and vectorises.
 * 32 bytes per token in all (see CKV_TOKENS_BYTES_PER_TOKEN).
 *
 * Attention history is a ring of the last CKV_ATTN_HISTORY rounds' attention
 * mass per token, stored as IEEE half floats (mass summed over heads and query
 * rows can exceed 1, so a fixed-point byte would clip). */
#ifndef CKV_DAEMON_TOKENS_H
#define CKV_DAEMON_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define CKV_ATTN_HISTORY 4u
#define CKV_NO_BLOCK UINT32_MAX

/* Lifecycle states; the numbers match commitkv.proto TokenState. */
enum { CKV_STATE_DRAFT = 0, CKV_STATE_STAGED = 1, CKV_STATE_COMMITTED = 2, CKV_STATE_RECYCLED = 3 };

typedef struct ckv_tokens {
  size_t n;   /* tokens appended so far */
  size_t cap; /* allocated rows */
  uint8_t *state;        /* CKV_STATE_* */
  uint8_t *role;         /* proto Role */
  uint8_t *tags;         /* OR of proto Tag */
  uint8_t *flags;        /* judge-private bits (protected, pending move, ...) */
  uint32_t *block;       /* index in the session's block table, CKV_NO_BLOCK when recycled */
  uint16_t *slot;        /* slot in that block */
  uint16_t *semantic;    /* semantic score in [0,1] as Q0.16 (65535 = 1.0) */
  uint16_t *attn;        /* CKV_ATTN_HISTORY half floats per token, ring indexed by round % R */
  uint32_t *last_attended;   /* round in which the token last drew attention (0 = never) */
  uint32_t *last_transition; /* round of the token's last state change */
  uint32_t *token_id;        /* vocabulary id when the worker sent it, else UINT32_MAX */
} ckv_tokens;

#define CKV_TOKENS_BYTES_PER_TOKEN (4u * 1u + 4u + 2u + 2u + 2u * CKV_ATTN_HISTORY + 4u + 4u + 4u)

void ckv_tokens_init(ckv_tokens *t);
void ckv_tokens_done(ckv_tokens *t);
/* Make room for `extra` more rows.  CKV_OK or -ENOMEM (nothing changed). */
int ckv_tokens_reserve(ckv_tokens *t, size_t extra);
/* Append one row (room must have been reserved). Returns its position. */
size_t ckv_tokens_push(ckv_tokens *t, uint8_t role, uint8_t tags, float semantic, uint32_t token_id,
                       uint32_t block, uint16_t slot);

/* Record round `round`: token p gets attn[p - first] when first <= p < first + n,
 * 0 otherwise, in ring slot round % R; tokens whose mass exceeds `floor` get
 * last_attended = round.  One pass over all tokens. */
void ckv_tokens_record_round(ckv_tokens *t, uint32_t round, size_t first, const float *attn, size_t n,
                             float floor);

/* Mean attention over the ring for one token. */
float ckv_tokens_attn_mean(const ckv_tokens *t, size_t pos);

uint16_t ckv_half_from_float(float f);
float ckv_half_to_float(uint16_t h);
static inline uint16_t ckv_q16_from_unit(float f) {
  if (!(f > 0.f)) return 0; /* also maps NaN to 0 */
  if (f >= 1.f) return 65535;
  return (uint16_t)(f * 65535.f + 0.5f);
}
static inline float ckv_q16_to_unit(uint16_t q) { return (float)q / 65535.f; }

#endif
