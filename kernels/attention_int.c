/* attention_int.c - integer scores (q . k) for fused attention over INT8
 * staged, 4-bit committed (KIVI), ROT4 and ROT2 key blocks.
 *
 * The query is quantized to INT8 with one scale per row (per query head and
 * row, over head_dim): once per call for staged and rotated blocks, once per
 * 32-token chunk for committed ones (their channel scales are folded into
 * the query first).  Each score is then an exact integer dot product from
 * the path's table (idot.h: AVX2 maddubs, AVX-512 VNNI, plain C) and a
 * float epilogue in a fixed order (the table's finish and dot16: every
 * operation rounded on its own, so plain C and AVX-512 agree), so a score has
 * the same bits on every path.  Scales and zero points are applied exactly
 * as the float path does; 4-bit codes are centred on 7.5 (2 dot - 15 sum q
 * is an integer) so the query's rounding error meets codes of at most 7.5.
 *
 * What it costs in fidelity (measured by test_kernels_intdot and the kernels
 * bench) is the INT8 rounding of the query: at most a/2 per element, a =
 * absmax/127 of the row. */
#include <math.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/attention_int.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

static size_t up64(size_t n) { return (n + 63u) & ~(size_t)63u; }

size_t ckv_iquery_carve(ckv_iquery *q, size_t nq, uint32_t n, uint8_t *mem) {
  size_t ld = ckv_idot_ld(n), off = 0;
  if (mem) {
    q->ld = ld;
    q->p = (int8_t *)mem;
    q->a = (float *)(void *)(mem + up64(nq * ld));
    q->psum = (int32_t *)(void *)(mem + up64(nq * ld) + up64(nq * sizeof(float)));
  }
  off = up64(nq * ld) + up64(nq * sizeof(float)) + up64(nq * sizeof(int32_t));
  return off;
}

size_t ckv_iscratch_carve(ckv_iscratch *s, size_t nq, uint32_t n, uint8_t *mem) {
  size_t ld = ckv_idot_ld(n), off = ckv_iquery_carve(&s->q, nq, n, mem);
#define PIECE(ptr, type, count)                                   \
  do {                                                            \
    if (mem) (ptr) = (type *)(void *)(mem + off);                 \
    off += up64((size_t)(count) * sizeof(type));                  \
  } while (0)
  PIECE(s->qk, float, nq * ld);
  PIECE(s->qg, float, nq * ld);
  PIECE(s->bias, float, nq);
  PIECE(s->par, float, 4u * ld);
  PIECE(s->idx, uint32_t, n);
  PIECE(s->tmp, int8_t, ld);
  PIECE(s->acc, int32_t, nq * CKV_ISCORE_BATCH);
#undef PIECE
  if (mem) s->pf = NULL, s->pf_lines = 0, s->rot_scale = NULL;
  return off;
}

typedef float ckv_f32x4 __attribute__((vector_size(16)));

/* even[m] = x[2m], odd[m] = x[2m + 1] for m < 32 (GCC vector shuffles: SSE2's shufps, or any target's). */
static void deinterleave32(const float *x, float *even, float *odd) {
#ifndef __clang__
  typedef int32_t i32x4 __attribute__((vector_size(16)));
  const i32x4 ev = {0, 2, 4, 6}, od = {1, 3, 5, 7};
#endif
  for (uint32_t m = 0; m < 32; m += 4) {
    ckv_f32x4 a, b;
    memcpy(&a, x + 2 * m, sizeof a);
    memcpy(&b, x + 2 * m + 4, sizeof b);
#ifdef __clang__ /* clang spells GCC's __builtin_shuffle this way (the fuzz build) */
    ckv_f32x4 e = __builtin_shufflevector(a, b, 0, 2, 4, 6), o = __builtin_shufflevector(a, b, 1, 3, 5, 7);
#else
    ckv_f32x4 e = __builtin_shuffle(a, b, ev), o = __builtin_shuffle(a, b, od);
#endif
    memcpy(even + m, &e, sizeof e);
    memcpy(odd + m, &o, sizeof o);
  }
}

/* S[0..n) = -inf, four lanes a store. */
static void fill_neg_inf(float *S, size_t n) {
  const ckv_f32x4 v = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) memcpy(S + i, &v, sizeof v);
  for (; i < n; i++) S[i] = -INFINITY;
}

/* sum of p[0..n), n a multiple of 32 (32 int16 partial sums, widened at the end: exact). */
static int32_t sum_i8(const int8_t *p, size_t n) {
  int16_t acc[32] = {0};
  for (size_t j = 0; j < n; j += 32) /* at most 127 * (n / 32) per lane: no overflow below n = 8K */
    for (int l = 0; l < 32; l++) acc[l] = (int16_t)(acc[l] + p[j + l]); /* fixed trip count: vectorised */
  int32_t s = 0;
  for (int l = 0; l < 32; l++) s += acc[l];
  return s;
}

void ckv_iquery_set(const ckv_rowops *ops, const float *x, size_t nq, size_t ldx, uint32_t n, int order,
                    ckv_iquery *q, int8_t *tmp) {
  for (size_t i = 0; i < nq; i++) {
    const float *xi = x + i * ldx;
    int8_t *p = q->p + i * q->ld;
    float a = ops->absmax(xi, n) / 127.0f, inv = a > 0.0f ? 1.0f / a : 0.0f;
    memset(p, 0, q->ld);
    ops->quant_i8(xi, inv, order != CKV_IQ_NATURAL ? tmp : p, n);
    if (order == CKV_IQ_NIBBLE)
      for (uint32_t j = 0; j < n; j++) p[ckv_idot_u4_index(j)] = tmp[j];
    else if (order == CKV_IQ_CRUMB)
      for (uint32_t j = 0; j < n; j++) p[ckv_idot_u2_index(j)] = tmp[j];
    int32_t s = q->ld <= 8192u ? sum_i8(p, q->ld) : 0;
    for (size_t j = 0; q->ld > 8192u && j < q->ld; j++) s += p[j];
    q->a[i] = a;
    q->psum[i] = s;
  }
}

/* The valid bits of slots [t0, t0 + 32) of blk (one acquire load, not one call per slot and head). */
static uint32_t valid32(const void *blk, uint32_t cap, uint32_t t0) {
  const uint64_t *w = (const uint64_t *)ckv_cb(blk, ckv_block_bitmap_offset(cap));
  uint64_t bits = __atomic_load_n(&w[t0 / 64u], __ATOMIC_ACQUIRE) >> (t0 % 64u);
  uint32_t n = cap - t0 < 32u ? cap - t0 : 32u;
  return (uint32_t)bits & (n == 32u ? ~0u : (1u << n) - 1u);
}

/* o[i] = -inf for the empty slots of a batch of nt <= 32 (valid: valid32's bits). */
static void empty_slots(float *o, uint32_t valid, uint32_t nt) {
  if (valid == (nt == 32u ? ~0u : (1u << nt) - 1u)) return;
  for (uint32_t i = 0; i < nt; i++)
    if (!((valid >> i) & 1u)) o[i] = -INFINITY;
}

/* The scratch's next-block lines (ckv_iscratch.pf): a share of them per batch, nb batches in all. */
static void pf_batch(ckv_iscratch *w, uint32_t nb) {
  uint32_t per = nb ? (w->pf_lines + nb - 1u) / nb : w->pf_lines;
  for (uint32_t z = 0; z < per && w->pf_lines; z++, w->pf_lines--, w->pf += 64) __builtin_prefetch(w->pf, 0, 2);
}

static void score_staged(const ckv_idotops *io, const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t h,
                         const ckv_iquery *q, size_t nq, ckv_iscratch *w, float *S) {
  uint32_t cap = ckv_hdr(blk)->capacity, D = g->head_dim, ng = ckv_staged_groups(g), hg = ckv_staged_group_heads(g);
  size_t te = ckv_draft_token_elems(g);
  const int8_t *codes = (const int8_t *)ckv_cb(blk, ckv_staged_codes_offset(g, cap, layer, 0)) + (size_t)h * D;
  const uint16_t *sc = (const uint16_t *)ckv_cb(blk, ckv_staged_scales_offset(g, cap, layer, 0));
  uint32_t nb = (cap + CKV_ISCORE_BATCH - 1u) / CKV_ISCORE_BATCH;
  for (uint32_t t0 = 0; t0 < cap; t0 += CKV_ISCORE_BATCH, nb--) {
    uint32_t nt = cap - t0 < CKV_ISCORE_BATCH ? cap - t0 : CKV_ISCORE_BATCH;
    pf_batch(w, nb);
    io->i8(q->p, nq, q->ld, codes + (size_t)t0 * te, te, nt, D, w->acc, CKV_ISCORE_BATCH);
    uint32_t valid = valid32(blk, cap, t0);
    float st[CKV_ISCORE_BATCH];
    for (uint32_t i = 0; i < nt; i++) st[i] = ckv_f16_to_f32(sc[(size_t)(t0 + i) * ng + h / hg]);
    for (size_t rg = 0; rg < nq; rg++) { /* every slot of the batch, then the empty ones */
      float *o = S + rg * cap + t0;
      io->finish(w->acc + rg * CKV_ISCORE_BATCH, 1, 0, q->a[rg], st, 0.0f, /* add_b= */ false, o, nt);
      empty_slots(o, valid, nt);
    }
  }
}

/* Rotated keys of b = 4 or 2 bits: q . k = s (qr . (c - off)) + qr . mean, off = (2^b - 1) / 2, with
 * qr ~ a p: s a/2 (2 p . c - (2^b - 1) sum p) + qr . mean, the bracket an exact integer. */
static void score_rot(const ckv_rowops *ops, const ckv_idotops *io, const ckv_geometry *g, const void *blk,
                      uint32_t layer, uint32_t h, const ckv_iscore_query *q, size_t nq, ckv_iscratch *w, float *S) {
  uint32_t cap = ckv_hdr(blk)->capacity, D = g->head_dim, H = g->n_kv_heads, fmt = ckv_hdr(blk)->format;
  uint32_t bits = ckv_format_code_bits(fmt);
  int32_t levels = (int32_t)ckv_qa_levels(bits); /* 2^b - 1 */
  const ckv_iquery *q8 = bits == 4u ? &q->qr8 : &q->qr8c;
  size_t rb = ckv_rot_row_bytes(fmt, g);
  const uint8_t *sc = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, cap, layer, 0));
  const uint8_t *codes = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, cap, layer, 0)) + (size_t)h * rb;
  float *mean = w->par; /* the key mean widened (exact on every path) and made finite, as ckv_rot_key_mean */
  ops->cvt_f16((const uint16_t *)ckv_cb(blk, ckv_rot_mean_offset(g, cap, layer, h)), mean, D);
  bool finite = true; /* the block's bias qr . mean; only a mean with a non-finite element (then some */
  for (size_t rg = 0; rg < nq; rg++) { /* bias is not finite either) needs ckv_rot_finite first */
    w->bias[rg] = io->dot16(q->qr + rg * D, mean, D);
    finite &= isfinite(w->bias[rg]) != 0;
  }
  if (!finite) {
    for (uint32_t i = 0; i < D; i++) mean[i] = ckv_rot_finite(mean[i]);
    for (size_t rg = 0; rg < nq; rg++) w->bias[rg] = io->dot16(q->qr + rg * D, mean, D);
  }
  uint32_t nb = (cap + 15u) / 16u; /* the next block's lines: a share before every 16 tokens */
  for (uint32_t t0 = 0; t0 < cap; t0 += CKV_ISCORE_BATCH) {
    uint32_t nt = cap - t0 < CKV_ISCORE_BATCH ? cap - t0 : CKV_ISCORE_BATCH;
    for (uint32_t s = 0; s < nt; s += 16u, nb--) {
      uint32_t ns = nt - s < 16u ? nt - s : 16u;
      const uint8_t *rows = codes + (size_t)(t0 + s) * H * rb;
      pf_batch(w, nb);
      if (bits == 4u)
        io->u4(q8->p, nq, q8->ld, rows, H * rb, ns, D, w->acc + s, CKV_ISCORE_BATCH);
      else
        io->u2(q8->p, nq, q8->ld, rows, H * rb, ns, D, w->acc + s, CKV_ISCORE_BATCH);
    }
    uint32_t valid = valid32(blk, cap, t0);
    float st[CKV_ISCORE_BATCH];
    if (w->rot_scale)
      for (uint32_t i = 0; i < nt; i++) st[i] = w->rot_scale[sc[(size_t)(t0 + i) * H + h]];
    else
      for (uint32_t i = 0; i < nt; i++) st[i] = ckv_rot_scale_value(sc[(size_t)(t0 + i) * H + h]);
    for (size_t rg = 0; rg < nq; rg++) { /* every slot of the batch, then the empty ones */
      float *o = S + rg * cap + t0;
      io->finish(w->acc + rg * CKV_ISCORE_BATCH, 2, levels * q8->psum[rg], 0.5f * q8->a[rg], st, w->bias[rg],
                 /* add_b= */ true, o, nt);
      empty_slots(o, valid, nt);
    }
  }
}

/* Committed keys: q.k = sum qg_j (s_j u_j + z_j) = sum qk_j (u_j - 7.5) + sum qg_j (z_j + 7.5 s_j),
 * qk = qg * s requantized per chunk.  Everything per chunk is laid out in
 * nibble order (ckv_idot_u4_index) up front: the query once per block, the
 * chunk's parameters once per chunk, so qk quantizes straight into the codes. */
static void score_commit4(const ckv_rowops *ops, const ckv_idotops *io, const ckv_geometry *g, uint32_t layer,
                          const void *blk, uint32_t h, const ckv_iscore_query *q, size_t nq, ckv_iscratch *w,
                          float *S) {
  const ckv_block_header *hd = ckv_hdr(blk);
  uint32_t cap = hd->capacity, D = g->head_dim, fmt = hd->format, kept = hd->kept_channels;
  uint32_t sealed = ckv_block_sealed_chunks(blk);
  size_t krow = ckv_commit_key_row_bytes(fmt, kept), ld = ckv_idot_ld(kept);
  const uint64_t *mask = ckv_commit_mask(g, hd, blk, layer, h);
  const float *qg = w->qg;
  if (kept == D && q->qsn) { /* every channel kept: the call's nibble-ordered query; the mask only counted */
    uint32_t set = 0;
    for (uint32_t k = 0; k < ckv_commit_mask_words(g); k++)
      set += (uint32_t)__builtin_popcountll(D - 64u * k >= 64u ? mask[k] : mask[k] & ((1ull << (D - 64u * k)) - 1u));
    if (set != kept) return; /* as the float path */
    qg = q->qsn;
  } else {
    if (ckv_mask_channels(mask, D, w->idx) != kept) return; /* as the float path */
    memset(w->qg, 0, nq * ld * sizeof(float));
    for (size_t rg = 0; rg < nq; rg++)
      for (uint32_t j = 0; j < kept; j++) w->qg[rg * ld + ckv_idot_u4_index(j)] = q->qs[rg * D + w->idx[j]];
  }
  float *scale = w->par, *zero = w->par + ld, *sp = w->par + 2 * ld, *wp = w->par + 3 * ld;
  memset(sp, 0, 2 * ld * sizeof(float)); /* padding stays 0 */
  for (uint32_t c = 0; c < ckv_commit_chunks(cap); c++) {
    if (!((sealed >> c) & 1u)) continue;
    const uint8_t *ch = ckv_cb(blk, ckv_commit_key_chunk_offset(fmt, g, cap, kept, layer, h, c));
    ops->cvt_f16((const uint16_t *)ch, scale, kept);
    ops->cvt_f16((const uint16_t *)ch + kept, zero, kept);
    uint32_t j = 0;
    for (; j + 64 <= kept; j += 64) { /* nibble order of whole 64-channel blocks: evens, then odds */
      deinterleave32(scale + j, sp + j, sp + j + 32);
      deinterleave32(zero + j, wp + j, wp + j + 32);
      for (uint32_t m = 0; m < 64; m += 4) { /* wp = zero + 7.5 scale: a product, then a sum */
        ckv_f32x4 z, sv;
        memcpy(&z, wp + j + m, sizeof z);
        memcpy(&sv, sp + j + m, sizeof sv);
        z = z + 7.5f * sv;
        memcpy(wp + j + m, &z, sizeof z);
      }
    }
    for (; j < kept; j++) {
      size_t k = ckv_idot_u4_index(j);
      sp[k] = scale[j];
      wp[k] = zero[j] + 7.5f * scale[j];
    }
    for (size_t rg = 0; rg < nq; rg++) {
      ops->mul(qg + rg * ld, sp, w->qk + rg * ld, ld); /* one rounding per element: the same on every path */
      w->bias[rg] = io->dot16(qg + rg * ld, wp, ld);
    }
    ckv_iquery_set(ops, w->qk, nq, ld, (uint32_t)ld, 0, &w->q, w->tmp);
    io->u4(w->q.p, nq, w->q.ld, ch + (size_t)kept * 4u, krow, CKV_COMMIT_CHUNK_TOKENS, kept, w->acc,
           CKV_ISCORE_BATCH);
    uint32_t valid = valid32(blk, cap, c * CKV_COMMIT_CHUNK_TOKENS);
    for (size_t rg = 0; rg < nq; rg++) { /* every slot of the chunk (a loop a compiler vectorises), then the empty ones */
      const int32_t *ac = w->acc + rg * CKV_ISCORE_BATCH;
      int32_t ps = 15 * w->q.psum[rg];
      float k = 0.5f * w->q.a[rg], b = w->bias[rg], *o = S + rg * cap + c * CKV_COMMIT_CHUNK_TOKENS;
      for (uint32_t i = 0; i < CKV_COMMIT_CHUNK_TOKENS; i++) o[i] = (float)(2 * ac[i] - ps) * k + b;
      empty_slots(o, valid, CKV_COMMIT_CHUNK_TOKENS);
    }
  }
}

void ckv_iscore_block(const ckv_rowops *ops, const ckv_idotops *io, const ckv_geometry *g, uint32_t layer,
                      const void *blk, uint32_t h, const ckv_iscore_query *q, size_t nq, ckv_iscratch *w, float *S) {
  uint32_t cap = ckv_hdr(blk)->capacity, fmt = ckv_hdr(blk)->format;
  /* staged and ROT4 blocks write every slot; committed ones skip unsealed chunks and refused masks */
  if (fmt == CKV_FORMAT_STAGED) {
    score_staged(io, g, blk, layer, h, &q->qs8, nq, w, S);
  } else if (fmt == CKV_FORMAT_ROT4 || fmt == CKV_FORMAT_ROT2) {
    score_rot(ops, io, g, blk, layer, h, q, nq, w, S);
  } else {
    fill_neg_inf(S, nq * cap);
    if (fmt == CKV_FORMAT_COMMIT4) score_commit4(ops, io, g, layer, blk, h, q, nq, w, S);
  }
  for (; w->pf_lines; w->pf_lines--, w->pf += 64) __builtin_prefetch(w->pf, 0, 2); /* what the batches left */
}
