/* attention_blocks.h - private: one block of fused attention through the
 * SIMD loops of attention_simd.h (attention_blocks.c), for attention.c. */
#ifndef CKV_ATTENTION_BLOCKS_H
#define CKV_ATTENTION_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/attention_simd.h"
#include "kernels/format.h"
#include "kernels/rot.h"
#include "kernels/rowops.h"

/* Decode tables: codes[b][i] = i mod 2^b; rot[b][i] = (i mod 2^b) - (2^b - 1) / 2; rot_scale[c] =
 * ckv_rot_scale_value(c); perm4: the permutation of a 32-element group (ckv_ablock_perm). */
typedef struct ckv_ablock_luts {
  float codes[5][16], rot[5][16], rot_scale[256];
  uint8_t perm4[32]; /* ckv_ablock_perm(4, i) */
} ckv_ablock_luts;
void ckv_ablock_tables(ckv_ablock_luts *t);

/* ROT4 and ROT2 rows of n elements are read in a permuted order (CKV_AENC_PACKP, attention_simd.h)
 * when n is a multiple of 32 (ROT4) or 64 (ROT2); the query is permuted to match and the values
 * summed in that order, put back once per call. */
static inline bool ckv_ablock_permuted(uint32_t bits, uint32_t n) {
  return (bits == 4u && n % 32u == 0) || (bits == 2u && n % 64u == 0);
}
/* The element at position pos of the permuted order of b-bit rows (b = 4 or 2): in each group of
 * 16 * (8 / b) elements (16 code bytes), vector m lane i holds code m of byte 4 * (i % 4) + i / 4. */
static inline uint32_t ckv_ablock_perm(uint32_t bits, uint32_t pos) {
  uint32_t V = 8u / bits, G = 16u * V, r = pos % G, m = r / 16u, i = r % 16u;
  return pos / G * G + V * (4u * (i % 4u) + i / 4u) + m;
}

/* One thread's scratch, sized for the largest block of the call (cap slots):
 * live: cap, sub: cap + 16; ksc, vsc: cap * max(staged groups, n_kv_heads), as [group or head][slot];
 * vpar: cap * max(2 * committed value groups, staged groups);
 * wt: RG * cap; qk, qg: RG * head_dim; row, tmp: head_dim; bias: RG; chan: head_dim. */
typedef struct ckv_ablock_ws {
  uint16_t *live, *sub;
  uint32_t n_live;
  float *ksc, *vsc, *vpar, *wt, *qk, *qg, *row, *tmp, *bias, *psc, *pzp; /* psc, pzp: head_dim */
  uint32_t *chan, *pch; /* head_dim: kept channels; the same in PACKP's order */
  uint32_t *wb;         /* RG * (cap / 2 + 1): BF16 weight pairs (ckv_ablock_args.bf16), or the
                           8-bit weights and their steps (ckv_ablock_args.i8v) */
} ckv_ablock_ws;

/* What the calls on one block share. */
typedef struct ckv_ablock_args {
  const ckv_attnops *A;
  const ckv_rowops *ops;
  const ckv_ablock_luts *luts;
  const ckv_geometry *g;
  const void *blk;
  uint32_t layer;
  size_t RG; /* query rows per KV head */
  bool i8v;          /* INT8 staged values of blocks with every slot valid by integer dot products into acc
                        (attention_i8v.h; head_dim % 64 == 0, capacity % CKV_I8V_GROUP == 0) */
  bool bf16;         /* ROT4 and ROT2 values of blocks with every slot valid (head_dim % 128 == 0) by
                        BF16 dot products into racc + 3 ldr and racc + 4 ldr (attention_bf16.h's orders) */
  const uint8_t *pf; /* lines the loops of the next call ask for along their work (ckv_arows.pf), or NULL */
  uint32_t pf_lines;
} ckv_ablock_args;

/* Lists the slots of blk that count (valid; committed: in a sealed chunk) in increasing order; returns how many. */
uint32_t ckv_ablock_live(const void *blk, uint16_t *idx);
/* Asks for part `part` of n_parts of layer L's K and V bytes of blk in the caches ahead of their
 * use (a KV head's rows are a stride apart, one line or less each, too far apart for the hardware
 * prefetchers to follow); in parts, so the requests spread over the work of the block before. */
void ckv_ablock_prefetch(const ckv_geometry *g, uint32_t L, const void *blk, uint32_t part, uint32_t n_parts);
/* The cache lines ckv_ablock_prefetch(g, L, blk, part, n_parts) asks for: *ret_lines lines from *ret_p, for
 * loops that spread the requests over their own work (ckv_arows.pf) instead of asking for them at once. */
void ckv_ablock_prefetch_range(const ckv_geometry *g, uint32_t L, const void *blk, uint32_t part, uint32_t n_parts,
                               const uint8_t **ret_p, uint32_t *ret_lines);
/* Whether the SIMD loops of A take this block (else the portable loops do). */
bool ckv_ablock_takes(const ckv_attnops *A, const ckv_geometry *g, const void *blk);
/* Per block, before its heads: the live list and the widened scales of layer L. */
void ckv_ablock_prepare(const ckv_rowops *ops, const ckv_ablock_luts *luts, const ckv_geometry *g, uint32_t L,
                        const void *blk, ckv_ablock_ws *w);
/* Scores S[rg*cap + t] of KV head h (-inf for slots that do not count); qs the scaled query rows of
 * the head's group [RG][head_dim], qsp the same in INT4's permuted order (NULL: none), qr the same
 * rotated (rotated blocks), qrp qr in ROT4's permuted order and qrp + ldp in ROT2's. */
void ckv_ablock_scores(const ckv_ablock_args *x, uint32_t h, const float *qs, const float *qsp, const float *qr,
                       const float *qrp, size_t ldp, ckv_ablock_ws *w, float *S);
/* acc (or racc for rotated blocks, in the rotated basis) [h*RG + rg][head_dim] += sum_t E[rg*cap + t] v_t;
 * racc + ldr: ROT4's permuted order, racc + 2 ldr: ROT2's, racc + 3 ldr and 4 ldr: ROT4's and ROT2's
 * BF16 pair orders (x->bf16); acc + ldr: INT4 (committed) values in PACKP's order. */
void ckv_ablock_values(const ckv_ablock_args *x, uint32_t h, const float *E, ckv_ablock_ws *w, float *acc,
                       float *racc, size_t ldr);

#endif
