/* attention_simd.h - private: the fused inner loops of decode attention
 * (attention.c), one table per SIMD path (attention_avx2.c,
 * attention_avx512.c), chosen at run time with the row primitives.
 *
 * Both loops read one KV head's rows of one block straight from their codes
 * and decode each element once, in registers, for every query row of the
 * head's group (all query heads of the GQA group, all query rows): the
 * scores hold a tile of up to four query rows against one decoded key row;
 * the values hold a tile of four rows by 64 elements of accumulators in
 * registers across all tokens of the block.  A code is decoded into a float
 * through a 16-entry table (ckv_arows.lut), which carries each format's
 * offset or affine, so no format needs a second pass over its decoded row.
 * Per-token scales are not here: attention.c folds them into the scores
 * after the dot and into the weights before the sum (one product per query
 * row, not one per element).  Sums run in a fixed order, the same whatever
 * the number of threads; they are not the scalar path's order (the tests
 * bound both against the oracle). */
#ifndef CKV_ATTENTION_SIMD_H
#define CKV_ATTENTION_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a row's elements are stored. */
enum ckv_aenc {
  CKV_AENC_F16 = 0,    /* FP16 halves */
  CKV_AENC_BF16 = 1,   /* BF16 halves */
  CKV_AENC_I8 = 2,     /* signed bytes, as floats (scale folded in by the caller) */
  CKV_AENC_PACK = 3,   /* b-bit codes, low bits first (b = 1..4): value lut[code] */
  CKV_AENC_AFFINE = 4, /* b-bit codes (b = 2 or 4) with (scale, zero) per 32 elements per token:
                          value code * scale + zero (two roundings, as dequantization) */
  CKV_AENC_PACKP = 5,  /* as PACK for b = 4 (n % 32 == 0) or 2 (n % 64 == 0), the elements read in a
                          permuted order (attention_blocks.h ckv_ablock_perm) that needs no byte
                          shuffle: the query and the accumulators are in that order too */
  CKV_AENC_AFFINEP = 6, /* AFFINE for b = 4 in PACKP's order (n % 32 == 0: a 32-element group stays one) */
};

/* One KV head's K or V rows in one block. */
typedef struct ckv_arows {
  const uint8_t *base; /* row of slot t at base + t * stride */
  size_t stride;
  uint32_t enc;        /* ckv_aenc */
  uint32_t bits;       /* CKV_AENC_PACK / AFFINE */
  const float *lut;    /* CKV_AENC_PACK: 16 floats, entry i the value of code (i mod 2^bits);
                          CKV_AENC_AFFINE: entry i = i mod 2^bits (the codes themselves) */
  const float *par;    /* CKV_AENC_AFFINE: slot t's pairs at par + t * ldpar: (scale, zero) of each
                          32-element group of the row, in order */
  size_t ldpar;
  /* Optional (tables with spread_prefetch): pf_lines cache lines from pf (the next block's bytes) asked
   * for in the caches a few at a time along the call's rows, so memory works while the core computes
   * (a burst of requests before the work stalls on the core's few miss buffers, then leaves memory idle). */
  const uint8_t *pf;
  uint32_t pf_lines;
} ckv_arows;

typedef struct ckv_attnops {
  const char *name;
  uint32_t n_multiple; /* the row lengths n this table takes are multiples of this */
  bool packp;          /* takes CKV_AENC_PACKP */
  bool spread_prefetch; /* scores and values ask for ckv_arows.pf along their rows */
  /* out[r*ldo + idx[i]] = sum_{d<n} q[r*ldq + d] * row(idx[i])[d] for r < nq, i < ni
   * (CKV_AENC_AFFINE is not accepted here). */
  void (*scores)(const float *q, size_t nq, size_t ldq, const ckv_arows *k, const uint16_t *idx, size_t ni,
                 uint32_t n, float *out, size_t ldo);
  /* acc[r*lda + d] += sum_i w[r*ldw + idx[i]] * row(idx[i])[d] for r < nq, d < n, the
   * tokens in the order of idx. */
  void (*values)(const float *w, size_t nq, size_t ldw, const ckv_arows *v, const uint16_t *idx, size_t ni,
                 uint32_t n, float *acc, size_t lda);
  /* Lists in out the slots t < n with E[r*lde + t] != 0 (or NaN) for any r < nq, in increasing
   * order; returns how many.  out: room for n + 16 entries. */
  uint32_t (*nonzero)(const float *E, size_t nq, size_t lde, uint32_t n, uint16_t *out);
  /* x[i] = x[i] * s[i] + b (two roundings). */
  void (*scale_add)(float *x, const float *s, float b, size_t n);
  /* CKV_AENC_PACKP's order of 4-bit rows: y[g + i] = x[g + perm[i]] for each 32-element group g of n
   * (n % 32 == 0), perm the 32-entry permutation; NULL where packp is false. */
  void (*permute32)(const float *x, const uint8_t *perm, float *y, size_t n);
  /* max(m, x[0..n)), NaN elements ignored. */
  float (*maxf)(const float *x, size_t n, float m);
} ckv_attnops;

extern const ckv_attnops ckv_attnops_avx2;
extern const ckv_attnops ckv_attnops_avx512;

/* The table for the current CPU path, NULL on the scalar path (attention.c
 * then runs its portable loops). */
const ckv_attnops *ckv_attnops_get(void);

#endif
