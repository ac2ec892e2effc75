/* attention_int.h - private: the integer score path of fused attention
 * (attention_int.c), for INT8 staged, 4-bit committed (KIVI), ROT4 and ROT2 keys. */
#ifndef CKV_ATTENTION_INT_H
#define CKV_ATTENTION_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"
#include "kernels/idot.h"
#include "kernels/rowops.h"

/* Tokens scored per integer batch (acc holds nq x this many sums). */
#define CKV_ISCORE_BATCH 32u
CKV_STATIC_ASSERT(CKV_ISCORE_BATCH >= CKV_COMMIT_CHUNK_TOKENS, "a committed chunk is one batch");

/* Rows of a query quantized to INT8, one scale per row: row i ~ a[i] * p[i*ld ..]. */
typedef struct ckv_iquery {
  int8_t *p;     /* [nq][ld] codes in [-127, 127], zero padded past n */
  float *a;      /* [nq] */
  int32_t *psum; /* [nq] sum of the row's codes */
  size_t ld;     /* ckv_idot_ld(n) */
} ckv_iquery;

/* One thread's scratch (committed blocks refold and requantize the query per chunk). */
typedef struct ckv_iscratch {
  ckv_iquery q;
  float *qk, *qg;   /* [nq][n]: the query times the chunk's channel scales; the query on the kept channels */
  float *bias;      /* [nq] */
  float *par;       /* [3][n]: a chunk's scales and zero points, or a rotated block's key mean */
  uint32_t *idx;    /* [n] kept channels */
  int8_t *tmp;      /* [ld] */
  int32_t *acc;     /* [nq][CKV_ISCORE_BATCH] */
  /* Optional, set by the caller before each ckv_iscore_block: pf_lines cache lines from pf (the next
   * block's bytes) asked for a few per batch along the block's work, not in one burst. */
  const uint8_t *pf;
  uint32_t pf_lines;
  const float *rot_scale; /* optional: [256] ckv_rot_scale_value(c), looked up instead of computed */
} ckv_iscratch;

/* The query rows of one KV head, as ckv_iscore_block reads them. */
typedef struct ckv_iscore_query {
  const float *qs; /* [nq][head_dim]: the scaled query (committed blocks fold their scales into it) */
  const float *qr; /* [nq][head_dim]: the same rotated (ckv_rot_forward for the head's keys); rotated blocks */
  ckv_iquery qs8;  /* qs quantized in natural order (staged blocks) */
  ckv_iquery qr8;  /* qr quantized in nibble order (ROT4 blocks) */
  ckv_iquery qr8c; /* qr quantized in crumb order (ROT2 blocks): qr8's codes, permuted */
  const float *qsn; /* [nq][ckv_idot_ld(head_dim)]: qs in nibble order, zero padded (committed blocks with
                       every channel kept use it as is), or NULL */
} ckv_iscore_query;

/* Carves an iquery / iscratch for nq rows of n elements from *mem (NULL: only
 * counts); returns the bytes used (64-byte aligned pieces). */
size_t ckv_iquery_carve(ckv_iquery *q, size_t nq, uint32_t n, uint8_t *mem);
size_t ckv_iscratch_carve(ckv_iscratch *s, size_t nq, uint32_t n, uint8_t *mem);

/* The orders a quantized query's codes are stored in (idot.h). */
enum ckv_iq_order {
  CKV_IQ_NATURAL = 0, /* INT8 rows */
  CKV_IQ_NIBBLE = 1,  /* 4-bit rows: ckv_idot_u4_index */
  CKV_IQ_CRUMB = 2,   /* 2-bit rows: ckv_idot_u2_index */
};
/* Quantizes rows x[i*ldx .. +n) (i < nq): a = absmax / 127, p = ckv_q8_code(x, 1/a)
 * (0 for an all-zero row), in the given order (enum ckv_iq_order).  The same
 * bytes on every path.  tmp: ld bytes. */
void ckv_iquery_set(const ckv_rowops *ops, const float *x, size_t nq, size_t ldx, uint32_t n, int order,
                    ckv_iquery *q, int8_t *tmp);

/* Scores S[rg*cap + t] (rg < nq) of kv head h against every slot t of one
 * block of a format ckv_iscore_format accepts, -inf for empty slots and
 * unsealed chunks (and for a committed head whose mask does not hold
 * kept_channels channels, as the float path):
 *  staged:    S = dot(qs8, k) * a * s_t
 *  ROT4:      S = (2 dot(qr8, c) - 15 sum qr8) * a/2 * s_t + qr . mean
 *  ROT2:      S = (2 dot(qr8c, c) - 3 sum qr8c) * a/2 * s_t + qr . mean
 *  committed: per chunk, qk = qs_kept * scale requantized; S = (2 dot(qk8, u)
 *             - 15 sum qk8) * a/2 + qs_kept . zero + 7.5 sum qk, the codes
 *             centred on 7.5 so the query's rounding meets codes of at most 7.5.
 * ops: the row primitives used (absmax, quant_i8, mul, cvt_f16: the same
 * bits on every path); io: the integer dots.  The result has the same bits
 * for every pair of tables. */
void ckv_iscore_block(const ckv_rowops *ops, const ckv_idotops *io, const ckv_geometry *g, uint32_t layer,
                      const void *blk, uint32_t h, const ckv_iscore_query *q, size_t nq, ckv_iscratch *w, float *S);

/* Whether the integer path scores blocks of format fmt. */
static inline int ckv_iscore_format(uint32_t fmt) {
  return fmt == CKV_FORMAT_STAGED || fmt == CKV_FORMAT_COMMIT4 || fmt == CKV_FORMAT_ROT4 || fmt == CKV_FORMAT_ROT2;
}

#endif
