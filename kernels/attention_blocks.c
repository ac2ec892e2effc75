/* attention_blocks.c - one block of fused attention through the SIMD loops
 * (attention_simd.h): which slots count, the format's rows as the loops read
 * them, and the per-token scales folded in outside the loops.
 *
 * A block's slots that count (valid, and for committed blocks in a sealed
 * chunk) are listed once per block from its bitmap (one acquire load per 64
 * slots, not one call per slot and head).  Scores: each KV head's rows are
 * dotted with the scaled query rows of its whole group; then the token's
 * scale multiplies the dot (staged: s * (q . c); rotated: s * (qr . (c -
 * off)) + qr . mean, the offset carried by the decode table, so no sum of
 * the query is subtracted afterwards).  Values: the weights of the slots
 * with any non-zero weight are multiplied by the token's scale (staged,
 * rotated) and the rows summed from their codes; committed (KIVI) values
 * decode code * scale + zero per 32-element group in registers, as
 * dequantization does.  What the loops cannot take (committed values whose
 * groups straddle heads, rows the AVX2 table cannot step through) is left to
 * attention.c's portable loops: ckv_ablock_* return false. */
#include <math.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/attention_bf16.h"
#include "kernels/attention_i8v.h"
#include "kernels/attention_blocks.h"
#include "kernels/quant.h"

void ckv_ablock_tables(ckv_ablock_luts *t) {
  for (uint32_t c = 0; c < 256; c++) t->rot_scale[c] = ckv_rot_scale_value(c);
  for (uint32_t i = 0; i < 32; i++) t->perm4[i] = (uint8_t)ckv_ablock_perm(4u, i);
  for (uint32_t bits = 1; bits <= 4; bits++) {
    uint32_t mask = ckv_qa_levels(bits);
    float off = ckv_rot_offset(bits);
    for (uint32_t i = 0; i < 16; i++) {
      t->codes[bits][i] = (float)(i & mask);
      t->rot[bits][i] = (float)(i & mask) - off; /* exact: small integers less a half-integer */
    }
  }
}

uint32_t ckv_ablock_live(const void *blk, uint16_t *idx) {
  const ckv_block_header *h = ckv_hdr(blk);
  uint32_t cap = h->capacity, n = 0;
  const uint64_t *w = (const uint64_t *)ckv_cb(blk, ckv_block_bitmap_offset(cap));
  uint32_t sealed = ckv_format_is_commit(h->format) ? ckv_sealed_chunks_of(h, blk) : ~0u;
  for (uint32_t k = 0; k < ckv_block_bitmap_words(cap); k++) {
    uint64_t bits = __atomic_load_n(&w[k], __ATOMIC_ACQUIRE);
    if (ckv_format_is_commit(h->format)) { /* 64 slots = chunks 2k and 2k + 1 */
      uint64_t keep = 0;
      if ((sealed >> (2u * k)) & 1u) keep |= 0xffffffffull;
      if (2u * k + 1u < 32u && ((sealed >> (2u * k + 1u)) & 1u)) keep |= 0xffffffffull << 32;
      bits &= keep;
    }
    while (bits) {
      uint32_t t = 64u * k + (uint32_t)__builtin_ctzll(bits);
      bits &= bits - 1u;
      if (t < cap) idx[n++] = (uint16_t)t;
    }
  }
  return n;
}

void ckv_ablock_prefetch(const ckv_geometry *g, uint32_t L, const void *blk, uint32_t part, uint32_t n_parts) {
  const uint8_t *p;
  uint32_t n;
  ckv_ablock_prefetch_range(g, L, blk, part, n_parts, &p, &n);
  for (uint32_t l = 0; l < n; l++) __builtin_prefetch(p + (size_t)l * 64u, 0, 2);
}

void ckv_ablock_prefetch_range(const ckv_geometry *g, uint32_t L, const void *blk, uint32_t part, uint32_t n_parts,
                               const uint8_t **ret_p, uint32_t *ret_lines) {
  const ckv_block_header *h = ckv_hdr(blk);
  uint32_t cap = h->capacity, fmt = h->format;
  size_t lo, hi; /* the bytes of layer L's K and V (and their scales) */
  if (fmt == CKV_FORMAT_DRAFT) {
    lo = ckv_draft_kv_offset(g, cap, L, 0, 0), hi = ckv_draft_kv_offset(g, cap, L, 2, 0);
  } else if (fmt == CKV_FORMAT_STAGED) {
    lo = ckv_staged_codes_offset(g, cap, L, 0), hi = lo + 2u * ckv_staged_section_bytes(g, cap);
  } else if (ckv_format_is_rot(fmt)) {
    lo = ckv_rot_scales_offset(fmt, g, cap, L, 0), hi = lo + 2u * ckv_rot_section_bytes(fmt, g, cap);
  } else {
    lo = ckv_commit_layer_offset(fmt, g, cap, h->kept_channels, L);
    hi = lo + ckv_commit_layer_bytes(fmt, g, cap, h->kept_channels);
  }
  size_t lines = (hi - lo + 63u) / 64u, l0 = lines * part / n_parts, l1 = lines * (part + 1u) / n_parts;
  *ret_p = ckv_cb(blk, lo + l0 * 64u);
  *ret_lines = (uint32_t)(l1 - l0);
}

bool ckv_ablock_takes(const ckv_attnops *A, const ckv_geometry *g, const void *blk) {
  const ckv_block_header *h = ckv_hdr(blk);
  uint32_t m = A->n_multiple, D = g->head_dim;
  if (D % m) return false;
  if (ckv_format_is_commit(h->format))
    return h->kept_channels % m == 0 && D % CKV_COMMIT_VALUE_GROUP == 0;
  return true;
}

void ckv_ablock_prepare(const ckv_rowops *ops, const ckv_ablock_luts *luts, const ckv_geometry *g, uint32_t L,
                        const void *blk, ckv_ablock_ws *w) {
  const ckv_block_header *h = ckv_hdr(blk);
  uint32_t cap = h->capacity, fmt = h->format;
  w->n_live = ckv_ablock_live(blk, w->live);
  if (fmt == CKV_FORMAT_STAGED) { /* both scale arrays, [slot][group] widened once, into [group][slot] */
    size_t ng = ckv_staged_groups(g);
    for (uint32_t kv = 0; kv < 2; kv++) {
      float *dst = kv ? w->vsc : w->ksc;
      ops->cvt_f16((const uint16_t *)ckv_cb(blk, ckv_staged_scales_offset(g, cap, L, kv)), w->vpar, cap * ng);
      for (size_t k = 0; k < ng; k++)
        for (size_t t = 0; t < cap; t++) dst[k * cap + t] = w->vpar[t * ng + k];
    }
  } else if (ckv_format_is_rot(fmt)) { /* scale codes [slot][head] into [head][slot] floats */
    size_t H = g->n_kv_heads;
    const uint8_t *ks = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, cap, L, 0));
    const uint8_t *vs = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, cap, L, 1));
    for (size_t t = 0; t < cap; t++)
      for (size_t k = 0; k < H; k++) {
        w->ksc[k * cap + t] = luts->rot_scale[ks[t * H + k]];
        w->vsc[k * cap + t] = luts->rot_scale[vs[t * H + k]];
      }
  } else if (ckv_format_is_commit(fmt)) { /* value (scale, zero) pairs [slot][group][2] */
    ops->cvt_f16((const uint16_t *)ckv_cb(blk, ckv_commit_value_params_offset(fmt, g, cap, h->kept_channels, L)),
                 w->vpar, (size_t)cap * ckv_commit_value_groups(g) * 2u);
  }
}

static void pf_burst(const uint8_t *p, uint32_t lines) {
  for (uint32_t l = 0; l < lines; l++) __builtin_prefetch(p + (size_t)l * 64u, 0, 2);
}

/* ckv_mask_channels (access.h) a word at a time: the set bits of mask[0..head_dim) into idx, in order. */
static uint32_t mask_channels(const uint64_t *mask, uint32_t head_dim, uint32_t *idx) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < (head_dim + 63u) / 64u; k++) {
    uint64_t bits = mask[k];
    if (head_dim - 64u * k < 64u) bits &= (1ull << (head_dim - 64u * k)) - 1u;
    while (bits) {
      idx[n++] = 64u * k + (uint32_t)__builtin_ctzll(bits);
      bits &= bits - 1u;
    }
  }
  return n;
}

/* The next block's lines of x (ckv_ablock_args.pf) for the loops to ask for along their rows, or at once
 * here where the loops do not (a table without spread_prefetch, or no loop call). */
static void pf_give(const ckv_ablock_args *x, ckv_arows *r) {
  if (x->A->spread_prefetch) {
    r->pf = x->pf, r->pf_lines = x->pf ? x->pf_lines : 0;
    return;
  }
  pf_burst(x->pf, x->pf ? x->pf_lines : 0);
}

/* S[rg*cap + t] = S[rg*cap + t] * sc[t] (+ bias[rg]) for the listed slots. */
static void scale_scores(const ckv_attnops *A, float *S, size_t RG, uint32_t cap, const uint16_t *idx, uint32_t n,
                         const float *sc, const float *bias) {
  for (size_t rg = 0; rg < RG; rg++) {
    float *s = S + rg * cap, b = bias ? bias[rg] : 0.0f;
    if (n == cap) /* every slot */
      A->scale_add(s, sc, b, cap);
    else
      for (uint32_t i = 0; i < n; i++) s[idx[i]] = s[idx[i]] * sc[idx[i]] + b;
  }
}

void ckv_ablock_scores(const ckv_ablock_args *x, uint32_t h, const float *qs, const float *qsp, const float *qr,
                       const float *qrp, size_t ldp, ckv_ablock_ws *w, float *S) {
  const ckv_geometry *g = x->g;
  const void *blk = x->blk;
  const ckv_block_header *hd = ckv_hdr(blk);
  uint32_t cap = hd->capacity, D = g->head_dim, fmt = hd->format, L = x->layer, H = g->n_kv_heads;
  size_t RG = x->RG, te = ckv_draft_token_elems(g);
  if (w->n_live != cap) /* the loops write only the listed slots */
    for (size_t i = 0; i < RG * cap; i++) S[i] = -INFINITY;
  ckv_arows k = {0};
  if (fmt == CKV_FORMAT_DRAFT) {
    k = (ckv_arows){.base = ckv_cb(blk, ckv_draft_kv_offset(g, cap, L, 0, 0)) + (size_t)h * D * 2u, .stride = te * 2u,
                    .enc = g->dtype == CKV_DTYPE_BF16 ? CKV_AENC_BF16 : CKV_AENC_F16};
    pf_give(x, &k);
    x->A->scores(qs, RG, D, &k, w->live, w->n_live, D, S, cap);
    return;
  }
  if (fmt == CKV_FORMAT_STAGED) {
    k = (ckv_arows){.base = ckv_cb(blk, ckv_staged_codes_offset(g, cap, L, 0)) + (size_t)h * D, .stride = te,
                    .enc = CKV_AENC_I8};
    pf_give(x, &k);
    x->A->scores(qs, RG, D, &k, w->live, w->n_live, D, S, cap);
    scale_scores(x->A, S, RG, cap, w->live, w->n_live, w->ksc + (size_t)(h / ckv_staged_group_heads(g)) * cap, NULL);
    return;
  }
  if (ckv_format_is_rot(fmt)) {
    uint32_t bits = ckv_format_code_bits(fmt);
    size_t rb = ckv_rot_row_bytes(fmt, g);
    k = (ckv_arows){.base = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, cap, L, 0)) + (size_t)h * rb, .stride = H * rb,
                    .enc = CKV_AENC_PACK, .bits = bits, .lut = x->luts->rot[bits]};
    const float *qk = qr; /* the query in the order the rows are read in */
    if (x->A->packp && ckv_ablock_permuted(bits, D)) k.enc = CKV_AENC_PACKP, qk = qrp + (bits == 2u ? ldp : 0u);
    /* the block's bias per query row, qr . mean: the mean widened with F16C, and made finite (as
     * ckv_rot_key_mean) only when it is not: then some bias is not finite either */
    x->ops->cvt_f16((const uint16_t *)ckv_cb(blk, ckv_rot_mean_offset(g, cap, L, h)), w->row, D);
    x->ops->dotn(qr, RG, D, w->row, D, w->bias, 1);
    bool finite = true;
    for (size_t rg = 0; rg < RG; rg++) finite &= isfinite(w->bias[rg]) != 0;
    if (!finite) {
      for (uint32_t i = 0; i < D; i++) w->row[i] = ckv_rot_finite(w->row[i]);
      x->ops->dotn(qr, RG, D, w->row, D, w->bias, 1);
    }
    pf_give(x, &k);
    x->A->scores(qk, RG, D, &k, w->live, w->n_live, D, S, cap);
    scale_scores(x->A, S, RG, cap, w->live, w->n_live, w->ksc + (size_t)h * cap, w->bias);
    return;
  }
  /* committed (KIVI) keys: per chunk, q.k = sum_j (q_j s_j) u_j + sum_j q_j z_j */
  uint32_t kept = hd->kept_channels, bits = ckv_format_code_bits(fmt);
  size_t krow = ckv_commit_key_row_bytes(fmt, kept);
  if (mask_channels(ckv_commit_mask(g, hd, blk, L, h), D, w->chan) != kept) { /* as the portable loops */
    for (size_t i = 0; i < RG * cap; i++) S[i] = -INFINITY;
    pf_burst(x->pf, x->pf ? x->pf_lines : 0);
    return;
  }
  const uint8_t *pf = x->pf; /* the next block's lines: all along the first chunk's rows */
  uint32_t pf_lines = pf ? x->pf_lines : 0;
  /* INT4 rows of whole 32-channel groups are read in PACKP's order: the query on the kept channels
   * in that order (the call's permuted query when nothing is pruned), each chunk's scales and zero
   * points as they are widened */
  bool perm = x->A->packp && x->A->permute32 && fmt == CKV_FORMAT_COMMIT4 && kept % 32u == 0 && qsp;
  const float *qg = perm ? qsp : qs;
  if (kept != D) { /* the query on the kept channels, [rg][kept] with stride D */
    if (perm)
      for (uint32_t j = 0; j < kept; j++) w->pch[j] = w->chan[ckv_ablock_perm(4u, j)];
    const uint32_t *ch = perm ? w->pch : w->chan;
    for (size_t rg = 0; rg < RG; rg++)
      for (uint32_t j = 0; j < kept; j++) w->qg[rg * D + j] = qs[rg * D + ch[j]];
    qg = w->qg;
  }
  for (uint32_t i = 0, c = ~0u, n = 0; i <= w->n_live; i++) {
    uint32_t tc = i < w->n_live ? w->live[i] / CKV_COMMIT_CHUNK_TOKENS : ~0u;
    if (i < w->n_live && tc == c) { /* the chunk's slots, relative to the chunk */
      w->sub[n++] = (uint16_t)(w->live[i] % CKV_COMMIT_CHUNK_TOKENS);
      continue;
    }
    if (n) { /* chunk c is listed: fold its channel scales into the query, score, add the zero-point term */
      const uint8_t *ch = ckv_cb(blk, ckv_commit_key_chunk_offset(fmt, g, cap, kept, L, h, c));
      const float *csc = w->tmp, *czp = w->row;
      x->ops->cvt_f16((const uint16_t *)ch, w->tmp, kept);
      x->ops->cvt_f16((const uint16_t *)ch + kept, w->row, kept);
      if (perm) { /* within each 32-channel group */
        x->A->permute32(w->tmp, x->luts->perm4, w->psc, kept);
        x->A->permute32(w->row, x->luts->perm4, w->pzp, kept);
        csc = w->psc, czp = w->pzp;
      }
      x->ops->dotn(qg, RG, D, czp, kept, w->bias, 1);
      for (size_t rg = 0; rg < RG; rg++) x->ops->mul(qg + rg * D, csc, w->qk + rg * D, kept);
      k = (ckv_arows){.base = ch + (size_t)kept * 4u, .stride = krow, .enc = perm ? CKV_AENC_PACKP : CKV_AENC_PACK,
                      .bits = bits, .lut = x->luts->codes[bits]};
      float *Sc = S + (size_t)c * CKV_COMMIT_CHUNK_TOKENS;
      if (x->A->spread_prefetch)
        k.pf = pf, k.pf_lines = pf_lines;
      else
        pf_burst(pf, pf_lines);
      pf_lines = 0;
      x->A->scores(w->qk, RG, D, &k, w->sub, n, kept, Sc, cap);
      for (size_t rg = 0; rg < RG; rg++)
        if (n == CKV_COMMIT_CHUNK_TOKENS) /* a whole chunk: x * 1 + bias, exact as the sum */
          x->ops->affine(Sc + rg * cap, 1.0f, w->bias[rg], n);
        else
          for (uint32_t j = 0; j < n; j++) Sc[rg * cap + w->sub[j]] += w->bias[rg];
    }
    c = tc;
    n = 0;
    if (i < w->n_live) w->sub[n++] = (uint16_t)(w->live[i] % CKV_COMMIT_CHUNK_TOKENS);
  }
  pf_burst(pf, pf_lines); /* no chunk listed */
}

void ckv_ablock_values(const ckv_ablock_args *x, uint32_t h, const float *E, ckv_ablock_ws *w, float *acc,
                       float *racc, size_t ldr) {
  const ckv_geometry *g = x->g;
  const void *blk = x->blk;
  const ckv_block_header *hd = ckv_hdr(blk);
  uint32_t cap = hd->capacity, D = g->head_dim, fmt = hd->format, L = x->layer, H = g->n_kv_heads;
  size_t RG = x->RG, te = ckv_draft_token_elems(g);
  /* the listed slots with any weight: underflow (or a zero row of weights) contributes nothing */
  uint32_t n = 0;
  bool dense = w->n_live == cap;
  if (dense) {
    n = x->A->nonzero(E, RG, cap, cap, w->sub);
  } else {
    for (uint32_t i = 0; i < w->n_live; i++) {
      uint32_t t = w->live[i];
      bool any = false;
      for (size_t rg = 0; rg < RG && !any; rg++) any = E[rg * cap + t] != 0.0f;
      if (any) w->sub[n++] = (uint16_t)t;
    }
  }
  if (!n) {
    pf_burst(x->pf, x->pf ? x->pf_lines : 0);
    return;
  }
  ckv_arows v = {0};
  const float *wt = E;
  const float *sc = NULL; /* the token's scale, sc[t] */
  float *out = acc;
  if (fmt == CKV_FORMAT_DRAFT) {
    v = (ckv_arows){.base = ckv_cb(blk, ckv_draft_kv_offset(g, cap, L, 1, 0)) + (size_t)h * D * 2u, .stride = te * 2u,
                    .enc = g->dtype == CKV_DTYPE_BF16 ? CKV_AENC_BF16 : CKV_AENC_F16};
  } else if (fmt == CKV_FORMAT_STAGED) {
    v = (ckv_arows){.base = ckv_cb(blk, ckv_staged_codes_offset(g, cap, L, 1)) + (size_t)h * D, .stride = te,
                    .enc = CKV_AENC_I8};
    sc = w->vsc + (size_t)(h / ckv_staged_group_heads(g)) * cap;
  } else if (ckv_format_is_rot(fmt)) {
    uint32_t bits = ckv_format_code_bits(fmt);
    size_t rb = ckv_rot_row_bytes(fmt, g);
    v = (ckv_arows){.base = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, cap, L, 1)) + (size_t)h * rb, .stride = H * rb,
                    .enc = CKV_AENC_PACK, .bits = bits, .lut = x->luts->rot[bits]};
    sc = w->vsc + (size_t)h * cap;
    out = racc;
    if (x->A->packp && ckv_ablock_permuted(bits, D)) v.enc = CKV_AENC_PACKP, out = racc + (bits == 2u ? 2u : 1u) * ldr;
  } else { /* committed values, D % 32 == 0 (ckv_ablock_takes): the head's groups are its own */
    uint32_t bits = ckv_format_code_bits(fmt), ng = ckv_commit_value_groups(g);
    v = (ckv_arows){.base = ckv_cb(blk, ckv_commit_value_codes_offset(fmt, g, cap, hd->kept_channels, L)) +
                            (size_t)h * D * bits / 8u,
                    .stride = ckv_commit_value_row_bytes(fmt, g), .enc = CKV_AENC_AFFINE, .bits = bits,
                    .lut = x->luts->codes[bits],
                    .par = w->vpar + (size_t)h * (D / CKV_COMMIT_VALUE_GROUP) * 2u, .ldpar = (size_t)ng * 2u};
    if (x->A->packp && bits == 4u) v.enc = CKV_AENC_AFFINEP, out = acc + ldr; /* INT4: PACKP's order */
  }
  if (sc) { /* the scale rides on the weights: one product per query row and token */
    for (size_t rg = 0; rg < RG; rg++) {
      float *o = w->wt + rg * cap;
      const float *e = E + rg * cap;
      if (dense)
        x->ops->mul(e, sc, o, cap);
      else
        for (uint32_t i = 0; i < n; i++) o[w->sub[i]] = e[w->sub[i]] * sc[w->sub[i]];
    }
    wt = w->wt;
  }
  if (x->i8v && fmt == CKV_FORMAT_STAGED && dense && sc) {
    uint8_t *wq = (uint8_t *)w->wb; /* RG * cap bytes, then RG * cap / CKV_I8V_GROUP floats: within wb */
    float *dq = (float *)(void *)(wq + ((RG * cap + 3u) & ~(size_t)3u));
    if (ckv_avalues_i8_staged(wt, RG, cap, (const int8_t *)v.base, v.stride, cap, D, wq, dq, out + (size_t)h * RG * D, D,
                              x->pf, x->pf ? x->pf_lines : 0))
      return;
  }
  if (x->bf16 && (fmt == CKV_FORMAT_ROT4 || fmt == CKV_FORMAT_ROT2) && dense && cap % 2u == 0 && D % 128u == 0) {
    uint32_t bits = ckv_format_code_bits(fmt);
    ckv_avalues_bf16_rot(bits, wt, RG, cap, v.base, v.stride, cap, D, x->luts->rot[bits], w->wb,
                         racc + (bits == 4u ? 3u : 4u) * ldr + (size_t)h * RG * D, D, x->pf, x->pf ? x->pf_lines : 0);
    return;
  }
  pf_give(x, &v);
  x->A->values(wt, RG, cap, &v, w->sub, n, D, out + (size_t)h * RG * D, D);
}
