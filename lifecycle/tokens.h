/* tokens.h - per-token metadata of one session, kept as columns.
 *
 * The index into every column is the token's session position (positions are
 * dense: 0, 1, 2, ... in append order).  Columns, not an array of structs, so
 * the judge's pass over a round streams only what it reads and vectorises.
 * 32 bytes per token in all (CKV_TOKENS_BYTES_PER_TOKEN, checked at compile time).
 *
 * Attention is stored *relative*: a token's mass divided by the mean mass per
 * live token of that round (1.0 = an average token), so thresholds mean the
 * same whatever the number of heads, query rows or tokens.  The history is a
 * ring of the last CKV_ATTN_HISTORY rounds, one byte per round on a log scale:
 * code = round(32 * log2(1 + rel)), i.e. about 2% resolution from 0.02 to 250
 * (recorded from a table of the code boundaries, no libm call per token).
 *
 * `block`/`slot` is where the token's data is *published* (readable); a move
 * in flight is marked by CKV_TOKEN_PENDING and lives in its compressor job
 * until the publish step. */
#ifndef CKV_LIFECYCLE_TOKENS_H
#define CKV_LIFECYCLE_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/token_states.h"

#define CKV_NO_BLOCK UINT32_MAX

/* flags column */
enum {
  CKV_TOKEN_PENDING = 1u,   /* a physical move of this token is in flight */
  CKV_TOKEN_SEM_GIVEN = 2u, /* the worker sent a semantic score (else estimated) */
  CKV_TOKEN_FACT = 4u,      /* committed as a lasting fact (sustained attention, meaningful) */
  CKV_TOKEN_WARM = 8u,      /* committed while still attended (warm_commit): the fact format, not lasting */
};

typedef struct ckv_tokens {
  size_t n;   /* tokens appended so far */
  size_t cap; /* allocated rows */
  uint8_t *state;        /* logical CKV_STATE_* (the judge's decision) */
  uint8_t *role;         /* proto Role */
  uint8_t *tags;         /* OR of proto Tag */
  uint8_t *flags;        /* CKV_TOKEN_* */
  uint32_t *block;       /* published location: index in the block table, CKV_NO_BLOCK if none */
  uint16_t *slot;        /* slot in that block */
  uint16_t *semantic;    /* semantic score in [0,1] as Q0.16 (65535 = 1.0) */
  uint8_t *attn;         /* CKV_ATTN_HISTORY log-coded relative attention per token, ring by round % R */
  uint32_t *last_attended;   /* round in which the token last drew attention (append round until then) */
  uint32_t *last_transition; /* round of the token's last state change (append round until then) */
  float *cum_attn;           /* accumulated relative attention over the session (H2O's heavy-hitter score) */
} ckv_tokens;

#define CKV_TOKENS_BYTES_PER_TOKEN (4u * 1u + 4u + 2u + 2u + CKV_ATTN_HISTORY + 4u + 4u + 4u)

void ckv_tokens_init(ckv_tokens *t);
void ckv_tokens_done(ckv_tokens *t);
/* Make room for `extra` more rows.  CKV_OK or -ENOMEM (nothing changed). */
int ckv_tokens_reserve(ckv_tokens *t, size_t extra);
/* Appends src's rows, every column, to dst (which is reserved for them);
 * returns CKV_OK or -ENOMEM.  The one place that lists the columns to copy. */
int ckv_tokens_append_rows(ckv_tokens *dst, const ckv_tokens *src);
/* Append one row (room must have been reserved) born in round `round`.
 * semantic < 0 means "not given". Returns its position. */
size_t ckv_tokens_push(ckv_tokens *t, uint8_t role, uint8_t tags, float semantic, uint32_t round, uint32_t block,
                       uint16_t slot);

/* Record round `round`: token p gets attn[p - first] when first <= p < first + n,
 * 0 otherwise, normalised by the mean over live (non-recycled) tokens, into ring
 * slot round % R (`live` = tokens not recycled); tokens at or above CKV_ATTENDED_FLOOR get last_attended = round.
 * One pass over all tokens (two over the report). */
void ckv_tokens_record_round(ckv_tokens *t, uint32_t round, size_t first, const float *attn, size_t n, size_t live);

/* The lifecycle's code path: the record pass and the rule judge's pre-scan
 * (judge.c; its one vector path is AVX2, which every AVX-512 CPU here has).
 * Chosen from the CPU at first use; every path stores the same bytes and
 * makes the same decisions.  Tests force each one the CPU can run; -1 goes
 * back to the CPU's choice.  CKV_OK or CKV_ERR_UNSUPPORTED. */
typedef enum ckv_tokens_path {
  CKV_TOKENS_PATH_SCALAR = 0,
  CKV_TOKENS_PATH_AVX2 = 1,
  CKV_TOKENS_PATH_AVX512 = 2,
} ckv_tokens_path;
int ckv_tokens_force_path(ckv_tokens_path p);
ckv_tokens_path ckv_tokens_vector_path(void);

/* Relative attention of ring entry `code`. */
float ckv_attn_decode(uint8_t code);
uint8_t ckv_attn_encode(float rel);
/* Mean and minimum relative attention over the last `rounds` (<= R) rounds ending at `round`. */
float ckv_tokens_attn_mean(const ckv_tokens *t, size_t pos, uint32_t round, uint32_t rounds);
float ckv_tokens_attn_min(const ckv_tokens *t, size_t pos, uint32_t round, uint32_t rounds);
float ckv_tokens_attn_max(const ckv_tokens *t, size_t pos, uint32_t round, uint32_t rounds);

static inline uint16_t ckv_q16_from_unit(float f) {
  if (!(f > 0.f)) return 0; /* also maps NaN to 0 */
  if (f >= 1.f) return 65535;
  return (uint16_t)(f * 65535.f + 0.5f);
}
static inline float ckv_q16_to_unit(uint16_t q) { return (float)q / 65535.f; }

#endif
