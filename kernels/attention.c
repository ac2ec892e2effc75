/* attention.c - fused decode attention over blocks of mixed formats.
 *
 * For one layer, block by block (a block's K rows, then its V rows, read
 * front to back in place): every KV head's query group (all query rows) is
 * scored against each valid slot, dequantizing one row at a time into a small
 * buffer that stays in L1 (nothing is expanded back into memory; committed
 * keys fold their per-channel scale into the query once per chunk).  Softmax
 * is online across blocks (running max and sum per query head, accumulator
 * rescaled when the max grows), so any mix and order of draft, staged and
 * committed blocks gives the same result.  Each block's exp(score - running
 * max) values are kept in the workspace with the running max they were taken
 * against; after the last block they are rescaled to probabilities and summed
 * into the per-(block, slot) attention mass.
 *
 * Threads: the block list is cut into partitions of ATTN_PART_BLOCKS blocks,
 * each with its own running max, sum and accumulator; each thread takes
 * the next partition nobody has taken (an atomic counter, so on a shared
 * machine a thread the scheduler holds back takes fewer, instead of the
 * others waiting for its fixed share), and the partials are combined in
 * partition order afterwards.  Partitions depend on the block list only, so the result has
 * the same bits whatever the number of threads.
 *
 * Rotated blocks (formats v2) are read in their rotated basis: the query is
 * rotated once per call with each KV head's key rotation, their values are
 * summed into a second accumulator, and that sum is rotated back once at the
 * end (the rotation is orthogonal and linear), so no key or value is ever
 * un-rotated.
 *
 * On the AVX2 and AVX-512 paths a block goes through the fused SIMD loops of
 * attention_blocks.c / attention_simd.h where they take it: each K/V code is
 * decoded once, in registers, for every query row of its KV head's group,
 * per-token scales ride on the scores and weights, and the next block's
 * layer bytes are prefetched.  The loops below (score_block, value_row,
 * rot_values) are the scalar path and take the shapes the SIMD loops leave.
 *
 * Integer scores (ckv_attn_args.scores, attention_int.c): INT8 staged,
 * 4-bit committed, ROT4 and ROT2 keys can be scored with integer dot products of
 * an INT8-quantized query (once per call; per chunk for committed keys),
 * bit-identical on every CPU path; other formats keep the float path.  Which
 * formats a call scores so is per format (attention_choice.c): by default ROT4
 * and ROT2, the formats it does not make less accurate. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/access.h"
#include "kernels/attention_bf16.h"
#include "kernels/attention_blocks.h"
#include "kernels/attention_choice.h"
#include "kernels/attention_i8v.h"
#include "kernels/attention_int.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

/* Blocks per partition (see the top of the file).  32 draft blocks of 16
 * tokens are 512 tokens: enough work per partition to hide the thread
 * start, few enough partials to combine. */
#define ATTN_PART_BLOCKS 32u
#define ATTN_MAX_THREADS 64u
/* Unless the caller asks for threads, one per this much FP16-equivalent K/V
 * of the layer: starting a thread costs tens of microseconds, about what a
 * thread reads of this much. */
#define ATTN_AUTO_BYTES_PER_THREAD (1u << 20)

/* One thread's scratch (score_block, value_row) and one partition's state. */
typedef struct attn_ws {
  float *qk, *kc, *tmp, *row, *acc_gather;
  uint32_t *idx;
  ckv_iscratch is; /* integer scores of committed chunks */
  ckv_ablock_ws ab; /* the SIMD loops (attention_blocks.c) */
} attn_ws;
typedef struct attn_part {
  float *m, *l, *acc; /* running max and sum per (kv head, row, query head), accumulators [2][hr][D]:
                         the natural order, then committed INT4 values in PACKP's order */
  float *racc;        /* accumulators of rotated blocks' values, in the rotated basis: [5][hr][D], the
                         natural order, then ROT4's and ROT2's permuted orders (ckv_ablock_perm), then
                         ROT4's and ROT2's BF16 pair orders (ckv_avalues_bf16_channel) */
} attn_part;

/* The whole workspace: shared inputs and outputs, then partitions, then threads. */
typedef struct attn_layout {
  float *qs, *S, *mblk;
  float *qr, *qsum; /* rotated scaled query [hr][D] and the sum of its elements [hr] */
  float *qrp;       /* qr in ROT4's and ROT2's permuted orders, [2][hr][D] */
  float *qsp;       /* qs in INT4's permuted order [hr][D] when head_dim % 32 == 0, else NULL */
  float *qsn;       /* integer scores of committed keys: qs in nibble order [hr][ld], zero padded, or NULL */
  size_t *slot_base; /* n_blocks + 1 prefix sums of the capacities */
  attn_part *parts;  /* (the array itself lives in the workspace too) */
  attn_ws *ws;
  ckv_iquery qs8, qr8, qr8c; /* integer scores: qs and qr quantized, [hr][ld] (qr8c: qr8 in crumb order) */
  const ckv_idotops *io; /* integer scores: the path's table; NULL: float scores for every format */
  uint32_t ifmt;         /* the formats (bit 1 << format) scored with io (ckv_attn_int_score_formats) */
  const ckv_attnops *A;  /* the SIMD loops of the path; NULL: the portable loops only */
  bool bf16;             /* ROT4 and ROT2 values by BF16 dot products (ckv_attn_args.values) */
  bool i8v;              /* INT8 staged values by integer dot products (ckv_attn_args.values) */
  ckv_ablock_luts luts;
  uint32_t n_parts, n_threads;
  uint32_t n_acc, n_racc; /* accumulators the call's blocks use: acc[0..n_acc), racc[0..n_racc) */
} attn_layout;

static size_t up64(size_t n) { return (n + 63u) & ~(size_t)63u; }

/* Whether keys of format fmt are scored with integer dot products in this call. */
static bool int_scored(const attn_layout *L, uint32_t fmt) {
  return L->io && fmt < 32u && ((L->ifmt >> fmt) & 1u) && ckv_iscore_format(fmt);
}

static int check_args(const ckv_attn_args *a, size_t *ret_slots) {
  if (!a || !a->geom || !a->q || !a->out || (!a->blocks && a->n_blocks)) return CKV_ERR_INVALID;
  const ckv_geometry *g = a->geom;
  if (!ckv_format_valid(CKV_FORMAT_DRAFT, g, 1, 0)) return CKV_ERR_INVALID;
  if (a->layer >= g->n_layers) return CKV_ERR_RANGE;
  if (a->n_rows == 0 || a->n_q_heads == 0 || a->n_q_heads % g->n_kv_heads) return CKV_ERR_INVALID;
  size_t slots = 0;
  for (uint32_t b = 0; b < a->n_blocks; b++) {
    int st = ckv_block_check(a->blocks[b], g);
    if (st != CKV_OK) return st;
    slots += ckv_hdr(a->blocks[b])->capacity;
  }
  *ret_slots = slots;
  return CKV_OK;
}

static uint32_t n_parts_of(const ckv_attn_args *a) {
  uint32_t p = (a->n_blocks + ATTN_PART_BLOCKS - 1) / ATTN_PART_BLOCKS;
  return p ? p : 1;
}

/* Threads for this call: a->n_threads, else $CKV_ATTENTION_THREADS, else the
 * online CPUs but at most one per ATTN_AUTO_BYTES_PER_THREAD of K/V (a short
 * context is not worth a thread); never more than there are partitions. */
static uint32_t n_threads_of(const ckv_attn_args *a, size_t slots) {
  long t = a->n_threads;
  if (t == 0) {
    const char *e = getenv("CKV_ATTENTION_THREADS");
    t = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    size_t kv_bytes = slots * ckv_draft_token_elems(a->geom) * 4u; /* K and V in FP16 */
    long by_size = (long)(kv_bytes / ATTN_AUTO_BYTES_PER_THREAD);
    if (!(e && *e) && t > by_size) t = by_size;
  }
  if (t < 1) t = 1;
  if (t > (long)ATTN_MAX_THREADS) t = ATTN_MAX_THREADS;
  uint32_t p = n_parts_of(a);
  return (uint32_t)t < p ? (uint32_t)t : p;
}

/* Carves the workspace (base NULL: only measures it).  Returns its bytes. */
static size_t ws_layout(const ckv_attn_args *a, size_t slots, attn_layout *L, uint8_t *base) {
  const ckv_geometry *g = a->geom;
  size_t cap_max = 1;
  for (uint32_t b = 0; b < a->n_blocks; b++)
    if (ckv_hdr(a->blocks[b])->capacity > cap_max) cap_max = ckv_hdr(a->blocks[b])->capacity;
  size_t per_slot = ckv_staged_groups(g) > g->n_kv_heads ? ckv_staged_groups(g) : g->n_kv_heads;
  size_t RG = (size_t)a->n_rows * (a->n_q_heads / g->n_kv_heads), D = g->head_dim, te = ckv_draft_token_elems(g);
  size_t HR = RG * g->n_kv_heads;
  uint32_t P = n_parts_of(a), T = n_threads_of(a, slots);
  size_t off = 0;
#define CARVE(ptr, type, count)                                   \
  do {                                                            \
    if (base) (ptr) = (type *)(void *)(base + off);               \
    off += up64((size_t)(count) * sizeof(type));                  \
  } while (0)
  CARVE(L->qs, float, HR * D);
  CARVE(L->qr, float, HR * D);
  CARVE(L->qsum, float, HR);
  CARVE(L->qrp, float, 2u * HR * D);
  CARVE(L->qsp, float, HR * D);
  CARVE(L->qsn, float, HR * ckv_idot_ld(D));
  CARVE(L->S, float, slots * HR);
  CARVE(L->mblk, float, (size_t)a->n_blocks * HR);
  CARVE(L->slot_base, size_t, (size_t)a->n_blocks + 1);
  off += ckv_iquery_carve(&L->qs8, HR, (uint32_t)D, base ? base + off : NULL);
  off += ckv_iquery_carve(&L->qr8, HR, (uint32_t)D, base ? base + off : NULL);
  off += ckv_iquery_carve(&L->qr8c, HR, (uint32_t)D, base ? base + off : NULL);
  CARVE(L->parts, attn_part, P);
  CARVE(L->ws, attn_ws, T);
  for (uint32_t p = 0; p < P; p++) {
    attn_part dummy, *q = base ? &L->parts[p] : &dummy;
    CARVE(q->m, float, HR);
    CARVE(q->l, float, HR);
    CARVE(q->acc, float, 2u * HR * D);
    CARVE(q->racc, float, 5u * HR * D);
  }
  for (uint32_t t = 0; t < T; t++) {
    attn_ws dummy, *w = base ? &L->ws[t] : &dummy;
    CARVE(w->qk, float, RG * D);
    CARVE(w->kc, float, RG);
    CARVE(w->tmp, float, te);
    CARVE(w->row, float, te);
    CARVE(w->acc_gather, float, RG * D);
    CARVE(w->idx, uint32_t, D);
    off += ckv_iscratch_carve(&w->is, RG, (uint32_t)D, base ? base + off : NULL);
    ckv_ablock_ws *ab = &w->ab;
    CARVE(ab->live, uint16_t, cap_max);
    CARVE(ab->sub, uint16_t, cap_max + 16u);
    CARVE(ab->ksc, float, cap_max * per_slot);
    CARVE(ab->vsc, float, cap_max * per_slot);
    CARVE(ab->vpar, float, cap_max * (2u * ckv_commit_value_groups(g) > per_slot ? 2u * ckv_commit_value_groups(g) : per_slot));
    CARVE(ab->wt, float, RG * cap_max);
    CARVE(ab->qk, float, RG * D);
    CARVE(ab->qg, float, RG * D);
    CARVE(ab->row, float, D);
    CARVE(ab->tmp, float, D);
    CARVE(ab->bias, float, RG);
    CARVE(ab->chan, uint32_t, D);
    CARVE(ab->pch, uint32_t, D);
    CARVE(ab->psc, float, D);
    CARVE(ab->pzp, float, D);
    CARVE(ab->wb, uint32_t, RG * (cap_max / 2u + 1u));
  }
#undef CARVE
  L->n_parts = P;
  L->n_threads = T;
  return off + 64u; /* room to align the base */
}

size_t ckv_attention_workspace_bytes(const ckv_attn_args *a) {
  size_t slots;
  if (check_args(a, &slots) != CKV_OK) return 0;
  attn_layout L;
  return ws_layout(a, slots, &L, NULL);
}

size_t ckv_attention_mass_len(const void *const *blocks, uint32_t n_blocks) {
  size_t n = 0;
  for (uint32_t b = 0; b < n_blocks; b++) n += ckv_hdr(blocks[b])->capacity;
  return n;
}

/* Scores of kv head h against every slot of one block: S[rg][slot], -inf for slots that are empty. */
/* Rows r0.. of a quantized query. */
static ckv_iquery iq_rows(const ckv_iquery *q, size_t r0) {
  return (ckv_iquery){q->p + r0 * q->ld, q->a + r0, q->psum + r0, q->ld};
}

static void score_block(const ckv_rowops *ops, const ckv_attn_args *a, const void *blk, uint32_t h, size_t RG,
                        attn_ws *w, const attn_layout *LY, float *S) {
  const ckv_geometry *g = a->geom;
  const ckv_block_header *hd = ckv_hdr(blk);
  uint32_t cap = hd->capacity, D = g->head_dim, fmt = hd->format, L = a->layer;
  size_t te = ckv_draft_token_elems(g);
  const float *qs = LY->qs + (size_t)h * RG * D;
  if (int_scored(LY, fmt)) { /* integer scores (attention_int.c) */
    ckv_iscore_query q = {.qs = qs, .qr = LY->qr + (size_t)h * RG * D, .qs8 = iq_rows(&LY->qs8, (size_t)h * RG),
                          .qr8 = iq_rows(&LY->qr8, (size_t)h * RG), .qr8c = iq_rows(&LY->qr8c, (size_t)h * RG),
                          .qsn = LY->qsn ? LY->qsn + (size_t)h * RG * ckv_idot_ld(D) : NULL};
    ckv_iscore_block(ops, LY->io, g, L, blk, h, &q, RG, &w->is, S);
    return;
  }
  for (size_t i = 0; i < RG * cap; i++) S[i] = -INFINITY;
  if (ckv_format_is_rot(fmt)) {
    /* q.k = s * (sum_i qr_i c_i - offset * sum_i qr_i) + qr.mean, qr the rotated query */
    uint32_t bits = ckv_format_code_bits(fmt);
    float off = ckv_rot_offset(bits);
    const float *qr = LY->qr + (size_t)h * RG * D, *qsum = LY->qsum + (size_t)h * RG;
    const uint8_t *sc = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, cap, L, 0));
    const uint8_t *codes = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, cap, L, 0));
    size_t rb = ckv_rot_row_bytes(fmt, g);
    ckv_rot_key_mean(g, blk, hd, L, h, w->row);
    ops->dotn(qr, RG, D, w->row, D, w->kc, 1); /* the block's bias per query */
    for (uint32_t t = 0; t < cap; t++) {
      if (!ckv_block_slot_valid(blk, t)) continue;
      size_t k = (size_t)t * g->n_kv_heads + h;
      ops->cvt_codes(codes + k * rb, bits, w->tmp, D);
      ops->dotn(qr, RG, D, w->tmp, D, S + t, cap);
      float st = ckv_rot_scale_value(sc[k]);
      for (size_t rg = 0; rg < RG; rg++) S[rg * cap + t] = (S[rg * cap + t] - off * qsum[rg]) * st + w->kc[rg];
    }
    return;
  }
  if (fmt == CKV_FORMAT_DRAFT || fmt == CKV_FORMAT_STAGED) {
    uint32_t ng = ckv_staged_groups(g), hg = ckv_staged_group_heads(g);
    for (uint32_t t = 0; t < cap; t++) {
      if (!ckv_block_slot_valid(blk, t)) continue;
      if (fmt == CKV_FORMAT_DRAFT) {
        const uint16_t *k = (const uint16_t *)ckv_cb(blk, ckv_draft_kv_offset(g, cap, L, 0, t)) + (size_t)h * D;
        if (g->dtype == CKV_DTYPE_BF16)
          ops->cvt_bf16(k, w->tmp, D);
        else
          ops->cvt_f16(k, w->tmp, D);
      } else {
        const int8_t *k = (const int8_t *)ckv_cb(blk, ckv_staged_codes_offset(g, cap, L, 0)) + t * te + (size_t)h * D;
        const uint16_t *sc = (const uint16_t *)ckv_cb(blk, ckv_staged_scales_offset(g, cap, L, 0));
        ops->cvt_i8(k, ckv_f16_to_f32(sc[(size_t)t * ng + h / hg]), w->tmp, D);
      }
      ops->dotn(qs, RG, D, w->tmp, D, S + t, cap);
    }
    return;
  }
  uint32_t kept = hd->kept_channels, bits = ckv_format_code_bits(fmt), sealed = ckv_block_sealed_chunks(blk);
  size_t krow = ckv_commit_key_row_bytes(fmt, kept);
  /* A mask that does not hold `kept` channels is not ours to follow: the
   * block contributes nothing rather than reading with unset indices. */
  if (ckv_mask_channels(ckv_commit_mask(g, hd, blk, L, h), D, w->idx) != kept) return;
  for (uint32_t c = 0; c < ckv_commit_chunks(cap); c++) {
    if (!((sealed >> c) & 1u)) continue;
    const uint8_t *ch = ckv_cb(blk, ckv_commit_key_chunk_offset(fmt, g, cap, kept, L, h, c));
    const uint16_t *sc = (const uint16_t *)ch, *zp = sc + kept;
    /* q.k = sum_j (q_j s_j) u_j + sum_j q_j z_j: fold the channel scales into the query once per chunk */
    ops->cvt_f16(sc, w->tmp, kept);
    ops->cvt_f16(zp, w->row, kept);
    const float *qg = qs; /* the query restricted to the kept channels, [rg][kept] with stride D */
    if (kept != D) {
      for (size_t rg = 0; rg < RG; rg++)
        for (uint32_t j = 0; j < kept; j++) w->acc_gather[rg * D + j] = qs[rg * D + w->idx[j]];
      qg = w->acc_gather;
    }
    ops->dotn(qg, RG, D, w->row, kept, w->kc, 1);
    for (size_t rg = 0; rg < RG; rg++) ops->mul(qg + rg * D, w->tmp, w->qk + rg * D, kept);
    for (uint32_t i = 0; i < CKV_COMMIT_CHUNK_TOKENS; i++) {
      uint32_t t = c * CKV_COMMIT_CHUNK_TOKENS + i;
      if (!ckv_block_slot_valid(blk, t)) continue;
      ops->cvt_codes(ch + (size_t)kept * 4u + i * krow, bits, w->tmp, kept);
      ops->dotn(w->qk, RG, D, w->tmp, kept, S + t, cap);
      for (size_t rg = 0; rg < RG; rg++) S[rg * cap + t] += w->kc[rg];
    }
  }
}

/* Dequantized V of kv head h at one slot into w->tmp[0..D) (returns w->tmp or a row inside w->row). */
static const float *value_row(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, uint32_t L, uint32_t h,
                              uint32_t t, attn_ws *w) {
  const ckv_block_header *hd = ckv_hdr(blk);
  uint32_t cap = hd->capacity, D = g->head_dim, fmt = hd->format;
  size_t te = ckv_draft_token_elems(g);
  if (fmt == CKV_FORMAT_DRAFT) { /* (rotated blocks: rot_values) */
    const uint16_t *v = (const uint16_t *)ckv_cb(blk, ckv_draft_kv_offset(g, cap, L, 1, t)) + (size_t)h * D;
    if (g->dtype == CKV_DTYPE_BF16)
      ops->cvt_bf16(v, w->tmp, D);
    else
      ops->cvt_f16(v, w->tmp, D);
    return w->tmp;
  }
  if (fmt == CKV_FORMAT_STAGED) {
    const int8_t *v = (const int8_t *)ckv_cb(blk, ckv_staged_codes_offset(g, cap, L, 1)) + t * te + (size_t)h * D;
    const uint16_t *sc = (const uint16_t *)ckv_cb(blk, ckv_staged_scales_offset(g, cap, L, 1));
    ops->cvt_i8(v, ckv_f16_to_f32(sc[(size_t)t * ckv_staged_groups(g) + h / ckv_staged_group_heads(g)]), w->tmp, D);
    return w->tmp;
  }
  uint32_t kept = hd->kept_channels, bits = ckv_format_code_bits(fmt), ng = ckv_commit_value_groups(g);
  const uint16_t *par = (const uint16_t *)ckv_cb(blk, ckv_commit_value_params_offset(fmt, g, cap, kept, L)) +
                        (size_t)t * ng * 2u;
  const uint8_t *row = ckv_cb(blk, ckv_commit_value_codes_offset(fmt, g, cap, kept, L)) +
                       (size_t)t * ckv_commit_value_row_bytes(fmt, g);
  const size_t G = CKV_COMMIT_VALUE_GROUP;
  if (D % G == 0) { /* the head's groups are its own: decode just them */
    ops->cvt_codes(row + (size_t)h * D * bits / 8u, bits, w->tmp, D);
    for (uint32_t q = 0; q < D / G; q++) {
      size_t gi = (size_t)h * D / G + q;
      ops->affine(w->tmp + q * G, ckv_f16_to_f32(par[2u * gi]), ckv_f16_to_f32(par[2u * gi + 1u]), G);
    }
    return w->tmp;
  }
  ops->cvt_codes(row, bits, w->row, te); /* groups straddle heads: decode the token's row */
  for (uint32_t q = 0; q < ng; q++) {
    size_t lo = (size_t)q * G, n = lo + G <= te ? G : te - lo;
    ops->affine(w->row + lo, ckv_f16_to_f32(par[2u * q]), ckv_f16_to_f32(par[2u * q + 1u]), n);
  }
  return w->row + (size_t)h * D;
}

/* What the threads of one call share. */
typedef struct attn_job {
  const ckv_attn_args *a;
  const ckv_rowops *ops;
  attn_layout *L;
  size_t RG, HR;
  atomic_uint next_part; /* the first partition no thread has taken */
} attn_job;

/* The values of a rotated block into P->racc: sum_t (p_t s_t) (c_t - off),
 * the token's scale carried by its weights (one product per query row, not
 * one per element) and the codes centred by the vector affine (exact: small
 * integers less a half-integer).  Summing p s c and subtracting p s off once
 * at the end would save the affine but cancels (codes of 0..15 around 7.5):
 * measured 1.1e-4 relative error against the oracle, above the test's 1e-4.
 * SB: the block's exp scores [h][rg][slot]. */
static void rot_values(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, uint32_t L, size_t RG,
                       const float *SB, attn_ws *w, attn_part *P) {
  const ckv_block_header *bh = ckv_hdr(blk);
  uint32_t cap = bh->capacity, H = g->n_kv_heads, D = g->head_dim, fmt = bh->format, bits = ckv_format_code_bits(fmt);
  float off = ckv_rot_offset(bits);
  const uint8_t *sc = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, cap, L, 1));
  const uint8_t *codes = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, cap, L, 1));
  size_t rb = ckv_rot_row_bytes(fmt, g);
  float *wt = w->kc; /* RG weights */
  for (uint32_t t = 0; t < cap; t++) {
    if (!ckv_block_slot_valid(blk, t)) continue;
    for (uint32_t h = 0; h < H; h++) {
      const float *e = SB + (size_t)h * RG * cap + t;
      float s = ckv_rot_scale_value(sc[(size_t)t * H + h]);
      bool any = false;
      for (size_t rg = 0; rg < RG; rg++) {
        wt[rg] = e[rg * cap] * s;
        any |= wt[rg] != 0.0f;
      }
      if (!any) continue; /* underflow or a zero scale: contributes nothing */
      ops->cvt_codes(codes + ((size_t)t * H + h) * rb, bits, w->tmp, D);
      ops->affine(w->tmp, 1.0f, -off, D);
      ops->axpyn(wt, RG, 1, w->tmp, P->racc + (size_t)h * RG * D, D, D);
    }
  }
}

/* Online softmax over blocks [b0, b1) into partition state P. */
static void run_blocks(const attn_job *j, attn_ws *w, attn_part *P, uint32_t b0, uint32_t b1) {
  const ckv_attn_args *a = j->a;
  const ckv_geometry *g = a->geom;
  const ckv_rowops *ops = j->ops;
  uint32_t H = g->n_kv_heads, D = g->head_dim;
  size_t RG = j->RG, HR = j->HR;
  for (size_t hr = 0; hr < HR; hr++) {
    P->m[hr] = -INFINITY;
    P->l[hr] = 0.0f;
  }
  memset(P->acc, 0, j->L->n_acc * HR * D * sizeof(float)); /* only the accumulators the call reads */
  memset(P->racc, 0, j->L->n_racc * HR * D * sizeof(float));
  for (uint32_t b = b0; b < b1; b++) {
    const void *blk = a->blocks[b];
    uint32_t cap = ckv_hdr(blk)->capacity;
    float *SB = j->L->S + j->L->slot_base[b] * HR; /* [hr][slot] for this block */
    uint32_t fmt = ckv_hdr(blk)->format;
    const ckv_attnops *A = j->L->A;
    bool fast = A && ckv_ablock_takes(A, g, blk); /* the SIMD loops (attention_blocks.c) */
    ckv_ablock_args x = {.A = A, .ops = ops, .luts = &j->L->luts, .g = g, .blk = blk, .layer = a->layer, .RG = RG,
                         .bf16 = j->L->bf16, .i8v = j->L->i8v};
    if (fast) ckv_ablock_prepare(ops, &j->L->luts, g, a->layer, blk, &w->ab);
    const void *next = A && b + 1 < b1 ? a->blocks[b + 1] : NULL; /* prefetched over this block's heads */
    for (uint32_t h = 0; h < H; h++) {
      float *S = SB + (size_t)h * RG * cap;
      bool simd = fast && !int_scored(j->L, fmt);
      x.pf = NULL;
      if (next && simd) /* the loops ask for it along their rows */
        ckv_ablock_prefetch_range(g, a->layer, next, h, 2u * H, &x.pf, &x.pf_lines);
      else if (next && int_scored(j->L, fmt)) /* so do the integer scores, batch by batch */
        ckv_ablock_prefetch_range(g, a->layer, next, h, 2u * H, &w->is.pf, &w->is.pf_lines);
      else if (next)
        ckv_ablock_prefetch(g, a->layer, next, h, 2u * H);
      if (simd)
        ckv_ablock_scores(&x, h, j->L->qs + (size_t)h * RG * D, j->L->qsp ? j->L->qsp + (size_t)h * RG * D : NULL,
                          j->L->qr + (size_t)h * RG * D, j->L->qrp + (size_t)h * RG * D, HR * D, &w->ab, S);
      else
        score_block(ops, a, blk, h, RG, w, j->L, S);
    }
    for (size_t hr = 0; hr < HR; hr++) {
      float bm = -INFINITY, *s = SB + hr * cap;
      if (A)
        bm = A->maxf(s, cap, bm);
      else
        for (uint32_t t = 0; t < cap; t++) bm = s[t] > bm ? s[t] : bm;
      float nm = bm > P->m[hr] ? bm : P->m[hr];
      j->L->mblk[(size_t)b * HR + hr] = nm;
      if (nm == -INFINITY) { /* nothing valid yet: exp values are all 0 */
        memset(s, 0, cap * sizeof(float));
        continue;
      }
      if (nm > P->m[hr]) { /* only the accumulators this call's formats use (the rest stay 0) */
        if (P->m[hr] != -INFINITY) { /* else every accumulator is still 0 */
          float alpha = expf(P->m[hr] - nm);
          for (uint32_t k = 0; k < j->L->n_acc; k++) ops->affine(P->acc + k * HR * D + hr * D, alpha, 0.0f, D);
          for (uint32_t k = 0; k < j->L->n_racc; k++) ops->affine(P->racc + k * HR * D + hr * D, alpha, 0.0f, D);
          P->l[hr] *= alpha;
        }
        P->m[hr] = nm;
      }
      P->l[hr] += ops->exp_sub(s, nm, cap);
    }
    if (fast) {
      for (uint32_t h = 0; h < H; h++) {
        x.pf = NULL;
        if (next) ckv_ablock_prefetch_range(g, a->layer, next, H + h, 2u * H, &x.pf, &x.pf_lines);
        ckv_ablock_values(&x, h, SB + (size_t)h * RG * cap, &w->ab, P->acc, P->racc, HR * D);
      }
      continue;
    }
    if (ckv_format_is_rot(fmt)) {
      rot_values(ops, g, blk, a->layer, RG, SB, w, P);
      continue;
    }
    float *acc = P->acc;
    for (uint32_t t = 0; t < cap; t++) {
      if (!ckv_block_slot_valid(blk, t)) continue;
      for (uint32_t h = 0; h < H; h++) {
        const float *e = SB + (size_t)h * RG * cap + t;
        bool any = false;
        for (size_t rg = 0; rg < RG && !any; rg++) any = e[rg * cap] != 0.0f;
        if (!any) continue; /* unsealed chunk or underflow: contributes nothing */
        const float *v = value_row(ops, g, blk, a->layer, h, t, w);
        ops->axpyn(e, RG, cap, v, acc + (size_t)h * RG * D, D, D);
      }
    }
  }
}

typedef struct attn_thread {
  attn_job *j;
  uint32_t index;
  pthread_t tid;
} attn_thread;

/* Thread `index` takes the next untaken partition until none is left (its scratch: ws[index]). */
static void *attn_thread_main(void *arg) {
  attn_thread *t = arg;
  const attn_layout *L = t->j->L;
  for (uint32_t p; (p = atomic_fetch_add_explicit(&t->j->next_part, 1u, memory_order_relaxed)) < L->n_parts;) {
    uint32_t b0 = p * ATTN_PART_BLOCKS, b1 = b0 + ATTN_PART_BLOCKS;
    if (b1 > t->j->a->n_blocks) b1 = t->j->a->n_blocks;
    run_blocks(t->j, &L->ws[t->index], &L->parts[p], b0, b1);
  }
  return NULL;
}

/* p = p * ap + q * aq over n floats, with the path's vector loops (the serial part of a call: it
 * runs once per partition after the threads, 16 partitions and up to 7 arrays of [hr][D] at 32K). */
static void fold(const ckv_rowops *ops, float *p, const float *q, float ap, float aq, uint32_t n) {
  if (ap != 1.0f) ops->affine(p, ap, 0.0f, n);
  if (aq != 0.0f) ops->axpy(aq, q, p, n);
}

/* Folds partition q into p (p's blocks come first): n_acc and n_racc accumulators of each. */
static void combine(const ckv_rowops *ops, attn_part *p, const attn_part *q, size_t HR, uint32_t D, uint32_t n_acc,
                    uint32_t n_racc) {
  for (size_t hr = 0; hr < HR; hr++) {
    float M = q->m[hr] > p->m[hr] ? q->m[hr] : p->m[hr];
    if (M == -INFINITY) continue;
    float ap = p->m[hr] == -INFINITY ? 0.0f : expf(p->m[hr] - M);
    float aq = q->m[hr] == -INFINITY ? 0.0f : expf(q->m[hr] - M);
    for (uint32_t k = 0; k < n_acc; k++) fold(ops, p->acc + k * HR * D + hr * D, q->acc + k * HR * D + hr * D, ap, aq, D);
    for (uint32_t k = 0; k < n_racc; k++)
      fold(ops, p->racc + k * HR * D + hr * D, q->racc + k * HR * D + hr * D, ap, aq, D);
    p->l[hr] = p->l[hr] * ap + q->l[hr] * aq;
    p->m[hr] = M;
  }
}

ckv_status ckv_kernels_attention(const ckv_attn_args *a) {
  size_t slots;
  int st = check_args(a, &slots);
  if (st != CKV_OK) return (ckv_status)st;
  const ckv_geometry *g = a->geom;
  uint32_t H = g->n_kv_heads, D = g->head_dim, G = a->n_q_heads / H;
  size_t RG = (size_t)a->n_rows * G;
  attn_layout L;
  size_t need = ws_layout(a, slots, &L, NULL);
  void *mem = NULL;
  uint8_t *base = a->workspace;
  if (!base || a->workspace_bytes < need) {
    base = mem = malloc(need);
    if (!mem) return (ckv_status)-12;
  }
  base = (uint8_t *)(((uintptr_t)base + 63u) & ~(uintptr_t)63u);
  ws_layout(a, slots, &L, base);
  float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
  size_t HR = RG * H;
  if (a->mass) memset(a->mass, 0, slots * sizeof(float));
  /* state per (kv head, row, query head of the group): index hr = h * RG + rg */
  for (size_t hr = 0; hr < HR; hr++) {
    size_t h = hr / RG, rg = hr % RG;
    const float *q = a->q + ((rg / G) * a->n_q_heads + h * G + rg % G) * D;
    for (uint32_t d = 0; d < D; d++) L.qs[hr * D + d] = q[d] * scale;
  }
  bool has_rot = false, has_staged = false, has_rot4 = false, has_rot2 = false, has_c4 = false;
  for (uint32_t b = 0; b < a->n_blocks; b++) {
    uint32_t fmt = ckv_hdr(a->blocks[b])->format;
    has_rot |= ckv_format_is_rot(fmt);
    has_c4 |= fmt == CKV_FORMAT_COMMIT4;
    has_staged |= fmt == CKV_FORMAT_STAGED;
    has_rot4 |= fmt == CKV_FORMAT_ROT4;
    has_rot2 |= fmt == CKV_FORMAT_ROT2;
  }
  const ckv_rowops *ops = ckv_rowops_get();
  L.n_acc = has_c4 && D % 32u == 0 ? 2u : 1u; /* acc[1]: committed INT4 values in PACKP's order */
  L.bf16 = (has_rot4 || has_rot2) && D % 128u == 0 && ckv_attn_values_bf16(a) &&
           ckv_kernels_path() == CKV_PATH_AVX512 && ckv_avalues_bf16_supported();
  L.i8v = has_staged && D % 64u == 0 && ckv_attn_values_i8(a) && ckv_kernels_path() == CKV_PATH_AVX512 &&
          ckv_avalues_i8_supported();
  L.n_racc = has_rot ? (L.bf16 ? 5u : 3u) : 0u;
  if (has_rot) { /* the query in each KV head's key basis */
    for (size_t hr = 0; hr < HR; hr++) {
      float *qr = L.qr + hr * D, sum = 0.0f;
      memcpy(qr, L.qs + hr * D, D * sizeof(float));
      ckv_rot_forward(qr, D, a->layer, 0, (uint32_t)(hr / RG));
      for (uint32_t d = 0; d < D; d++) sum += qr[d];
      L.qsum[hr] = sum;
      for (uint32_t k = 0; k < 2; k++) /* the orders the SIMD loops read ROT4 and ROT2 rows in */
        if (ckv_ablock_permuted(k ? 2u : 4u, D))
          for (uint32_t i = 0; i < D; i++) L.qrp[k * HR * D + hr * D + i] = qr[ckv_ablock_perm(k ? 2u : 4u, i)];
    }
  }
  if (has_c4 && D % 32u == 0) /* the order the SIMD loops read committed INT4 keys in */
    for (size_t hr = 0; hr < HR; hr++)
      for (uint32_t i = 0; i < D; i++) L.qsp[hr * D + i] = L.qs[hr * D + ckv_ablock_perm(4u, i)];
  else
    L.qsp = NULL;
  L.ifmt = ckv_attn_int_score_formats(a);
  L.io = L.ifmt ? ckv_idotops_get() : NULL;
  L.A = ckv_attnops_get();
  if (L.A) ckv_ablock_tables(&L.luts);
  for (uint32_t t = 0; L.A && t < L.n_threads; t++) L.ws[t].is.rot_scale = L.luts.rot_scale; /* the same values */
  if (has_staged && int_scored(&L, CKV_FORMAT_STAGED)) ckv_iquery_set(ops, L.qs, HR, D, D, CKV_IQ_NATURAL, &L.qs8, L.ws[0].is.tmp);
  if (has_c4 && int_scored(&L, CKV_FORMAT_COMMIT4)) { /* what every committed block with all channels kept folds its scales into */
    size_t ld = ckv_idot_ld(D);
    memset(L.qsn, 0, HR * ld * sizeof(float));
    for (size_t hr = 0; hr < HR; hr++)
      for (uint32_t j = 0; j < D; j++) L.qsn[hr * ld + ckv_idot_u4_index(j)] = L.qs[hr * D + j];
  } else {
    L.qsn = NULL;
  }
  if (has_rot4 && int_scored(&L, CKV_FORMAT_ROT4)) ckv_iquery_set(ops, L.qr, HR, D, D, CKV_IQ_NIBBLE, &L.qr8, L.ws[0].is.tmp);
  if (has_rot2 && int_scored(&L, CKV_FORMAT_ROT2)) ckv_iquery_set(ops, L.qr, HR, D, D, CKV_IQ_CRUMB, &L.qr8c, L.ws[0].is.tmp);
  L.slot_base[0] = 0;
  for (uint32_t b = 0; b < a->n_blocks; b++) L.slot_base[b + 1] = L.slot_base[b] + ckv_hdr(a->blocks[b])->capacity;
  attn_job job = {.a = a, .ops = ops, .L = &L, .RG = RG, .HR = HR};
  atomic_init(&job.next_part, 0u);
  attn_thread th[ATTN_MAX_THREADS];
  uint32_t started = 1;
  for (uint32_t t = 0; t < L.n_threads; t++) th[t] = (attn_thread){.j = &job, .index = t};
  for (uint32_t t = 1; t < L.n_threads; t++, started++)
    if (pthread_create(&th[t].tid, NULL, attn_thread_main, &th[t]) != 0) break;
  if (started < L.n_threads) { /* no more threads: this one does the rest, same partitions */
    for (uint32_t t = started; t < L.n_threads; t++) attn_thread_main(&th[t]);
  }
  attn_thread_main(&th[0]);
  for (uint32_t t = 1; t < started; t++) pthread_join(th[t].tid, NULL);
  attn_part *R = &L.parts[0];
  for (uint32_t p = 1; p < L.n_parts; p++) combine(ops, R, &L.parts[p], HR, D, L.n_acc, L.n_racc);
  for (size_t hr = 0; hr < HR; hr++) {
    size_t h = hr / RG, rg = hr % RG;
    float *o = a->out + ((rg / G) * a->n_q_heads + h * G + rg % G) * D;
    float inv = R->l[hr] > 0.0f ? 1.0f / R->l[hr] : 0.0f;
    if (has_rot) { /* back from the value basis of KV head h */
      float *r = R->racc + hr * D;
      for (uint32_t k = 0; k < 2; k++) /* the permuted sums back into the natural order */
        if ((k ? has_rot2 : has_rot4) && ckv_ablock_permuted(k ? 2u : 4u, D))
          for (uint32_t i = 0; i < D; i++) r[ckv_ablock_perm(k ? 2u : 4u, i)] += R->racc[(k + 1u) * HR * D + hr * D + i];
      for (uint32_t k = 0; L.bf16 && k < 2; k++) /* and the BF16 pair orders' */
        for (uint32_t i = 0; (k ? has_rot2 : has_rot4) && i < D; i++)
          r[ckv_avalues_bf16_channel(k ? 2u : 4u, i)] += R->racc[(3u + k) * HR * D + hr * D + i];
      ckv_rot_inverse(r, D, a->layer, 1, (uint32_t)h);
      for (uint32_t d = 0; d < D; d++) R->acc[hr * D + d] += r[d];
    }
    if (L.n_acc > 1u) /* committed INT4 values, summed in PACKP's order */
      for (uint32_t i = 0; i < D; i++) R->acc[hr * D + ckv_ablock_perm(4u, i)] += R->acc[HR * D + hr * D + i];
    for (uint32_t d = 0; d < D; d++) o[d] = R->acc[hr * D + d] * inv;
  }
  if (a->mass) {
    for (uint32_t b = 0; b < a->n_blocks; b++) {
      uint32_t cap = ckv_hdr(a->blocks[b])->capacity;
      for (size_t hr = 0; hr < HR; hr++) {
        float mb = L.mblk[(size_t)b * HR + hr];
        if (mb == -INFINITY || R->l[hr] <= 0.0f) continue;
        job.ops->axpy(expf(mb - R->m[hr]) / R->l[hr], L.S + L.slot_base[b] * HR + hr * cap,
                      a->mass + L.slot_base[b], cap);
      }
    }
  }
  free(mem);
  return CKV_OK;
}
