/* rot.c - the rotated committed formats (formats v2, kernels/format.h
 * "rotated") on the CPU: filling them from draft, staged or other rotated
 * blocks, and reading a head back (rotated, or un-rotated to the model's
 * basis).  The rules are kernels/quant.h's (ckv_rot_*), applied here with the
 * per-(layer, kv, head) signs looked up once per call instead of hashed per
 * element: the products are exact either way, so the bytes are those of the
 * CUDA kernels, which call the rules as they are. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

float *ckv_rot_signs_new(const ckv_geometry *g) {
  size_t D = g->head_dim, H = g->n_kv_heads;
  float *s = malloc((size_t)g->n_layers * 2u * H * D * sizeof(float));
  if (!s) return NULL;
  /* a hash per element: on the AVX-512 path 16 at a time (a whole table costs a small move a tenth of its time
   * one at a time) */
  bool wide = ckv_kernels_path() == CKV_PATH_AVX512 && D % 16u == 0;
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t h = 0; h < H; h++) {
        float *d = s + ckv_rot_signs_index(g, l, kv, h);
        if (wide)
          ckv_rot_signs_avx512(((l * 2u + kv) * CKV_MAX_KV_HEADS + h) * CKV_MAX_HEAD_DIM, (uint32_t)D, d);
        else
          for (uint32_t i = 0; i < D; i++) d[i] = ckv_rot_sign(l, kv, h, i);
      }
  return s;
}

/* The two hot steps of filling a rotated block, scalar, AVX2 (rot_avx2.c) or
 * AVX-512 (rot_avx512.c), the same bytes, chosen once per call from the CPU
 * path. */
typedef struct rot_steps {
  void (*forward)(float *x, uint32_t n, const float *signs);
  /* the forward rotation straight from an FP16 head (NULL: widen the row, then forward) */
  void (*forward_f16)(const uint16_t *h, float *x, uint32_t n, const float *signs);
  void (*quant_heads)(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales, uint8_t *rows);
  /* both steps at once from an FP16 row, in registers (NULL: forward_f16 or widen and forward, then quant_heads) */
  void (*quant_f16)(const uint16_t *h, const float *signs, uint32_t nh, uint32_t n, uint32_t bits,
                    uint8_t *ret_scales, uint8_t *rows);
  /* quant_heads of y less the block's key means, in registers (NULL: an axpy of -1, then quant_heads) */
  void (*quant_less)(const float *y, const float *mean, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales,
                     uint8_t *rows);
  /* a token's rotated keys from an FP16 row as if finite, added to the means' sums (NULL: forward, then an axpy) */
  void (*forward_f16_sum)(const uint16_t *h, const float *signs, uint32_t nh, uint32_t n, float *y, float *sum);
  /* a head's key means from their sums, as FP16 and widened back (NULL: one element at a time) */
  void (*means)(const float *sum, uint32_t n, uint32_t count, uint16_t *mean, float *ret_widened);
} rot_steps;

static rot_steps steps_for(uint32_t head_dim) {
  ckv_cpu_path p = ckv_kernels_path();
  bool in_regs = head_dim <= 128u; /* a head fits the AVX-512 path's registers */
  if (p == CKV_PATH_AVX512 && head_dim % 16u == 0)
    return (rot_steps){ckv_rot_forward_avx512, in_regs ? ckv_rot_forward_f16_avx512 : NULL, ckv_rot_quant_heads_avx512,
                       in_regs ? ckv_rot_quant_f16_heads_avx512 : NULL, in_regs ? ckv_rot_quant_less_heads_avx512 : NULL,
                       in_regs ? ckv_rot_forward_f16_sum_avx512 : NULL, ckv_rot_means_avx512};
  if ((p == CKV_PATH_AVX512 || p == CKV_PATH_AVX2) && head_dim % 8u == 0)
    return (rot_steps){ckv_rot_forward_avx2, NULL, ckv_rot_quant_heads_avx2, NULL, NULL, NULL, NULL};
  return (rot_steps){ckv_rot_forward_with, NULL, ckv_rot_quant_heads, NULL, NULL, NULL, NULL};
}

void ckv_rot_quant_heads(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales, uint8_t *rows) {
  size_t rb = (size_t)n * bits / 8u;
  for (uint32_t hd = 0; hd < nh; hd++) ckv_rot_quant_head(y + (size_t)hd * n, n, bits, &ret_scales[hd], rows + hd * rb);
}

void ckv_rot_forward_with(float *x, uint32_t n, const float *signs) {
  for (uint32_t i = 0; i < n; i++) x[i] = ckv_rot_finite(x[i]) * signs[i];
  ckv_fwht(x, n);
  float r = ckv_rot_norm(n);
  for (uint32_t i = 0; i < n; i++) x[i] = x[i] * r;
}

void ckv_rot_inverse_with(float *x, uint32_t n, const float *signs) {
  ckv_fwht(x, n);
  float r = ckv_rot_norm(n);
  for (uint32_t i = 0; i < n; i++) x[i] = x[i] * r * signs[i];
}

/* The block's rotated key mean of (layer, head), widened; finite whatever a worker wrote there. */
static void key_mean(const ckv_geometry *g, const void *blk, uint32_t cap, uint32_t layer, uint32_t head, float *dst) {
  const uint16_t *m = (const uint16_t *)ckv_cb(blk, ckv_rot_mean_offset(g, cap, layer, head));
  for (uint32_t i = 0; i < g->head_dim; i++) dst[i] = ckv_rot_finite(ckv_f16_to_f32(m[i]));
}

void ckv_rot_key_mean(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer, uint32_t head,
                      float *dst) {
  key_mean(g, blk, h->capacity, layer, head, dst);
}

void ckv_rot_read_rotated(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, const ckv_block_header *h,
                          uint32_t layer, uint32_t kv, uint32_t slot, uint32_t head, float *dst) {
  uint32_t fmt = h->format, bits = ckv_format_code_bits(fmt), D = g->head_dim, H = g->n_kv_heads;
  size_t rb = ckv_rot_row_bytes(fmt, g);
  const uint8_t *sc = ckv_cb(blk, ckv_rot_scales_offset(fmt, g, h->capacity, layer, kv));
  const uint8_t *row = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, h->capacity, layer, kv)) +
                       ((size_t)slot * H + head) * rb;
  float s = ckv_rot_scale_value(sc[(size_t)slot * H + head]);
  ops->cvt_codes(row, bits, dst, D);
  /* value = (code - offset) * scale: one subtraction (exact) and one product */
  float off = ckv_rot_offset(bits);
  for (uint32_t i = 0; i < D; i++) dst[i] = (dst[i] - off) * s;
  if (kv == 0) {
    float m[CKV_MAX_HEAD_DIM];
    key_mean(g, blk, h->capacity, layer, head, m);
    for (uint32_t i = 0; i < D; i++) dst[i] = dst[i] + m[i];
  }
}

/* Asks for the draft row of (l, kv) of move m (into L2) while the row before it is rotated and quantized: the
 * rows of one pass are not adjacent in memory (one per token, a block's capacity of rows apart). */
static void prefetch_source(const ckv_geometry *g, const ckv_move *m, uint32_t l, uint32_t kv) {
  const ckv_block_header *sh = ckv_move_src_hdr(m);
  if (sh->format != CKV_FORMAT_DRAFT) return;
  const uint8_t *p = ckv_cb(m->src, ckv_draft_kv_offset(g, sh->capacity, l, kv, m->src_slot));
  for (size_t o = 0; o < ckv_draft_token_elems(g) * 2u; o += 64) __builtin_prefetch(p + o, 0, 3);
}

/* How many moves ahead a source row is prefetched: a row takes about as long to rotate and quantize as one
 * DRAM latency, and the rows of a pass sit in different pages (which the hardware prefetchers do not cross). */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 1
#endif

/* Every head of K or V of one source slot, in the rotated basis, into row[H*D]; next (or NULL): the move read
 * PREFETCH_AHEAD after this one, whose source row is prefetched. */
static void read_rotated_row(const ckv_rowops *ops, const rot_steps *rs, const ckv_geometry *g, const float *signs,
                             const ckv_move *m, const ckv_move *next, uint32_t l, uint32_t kv, float *row) {
  const ckv_block_header *sh = ckv_move_src_hdr(m);
  uint32_t D = g->head_dim, H = g->n_kv_heads;
  if (ckv_format_is_rot(sh->format)) { /* already rotated */
    for (uint32_t hd = 0; hd < H; hd++) ckv_rot_read_rotated(ops, g, m->src, sh, l, kv, m->src_slot, hd, row + (size_t)hd * D);
    return;
  }
  if (sh->format == CKV_FORMAT_DRAFT && g->dtype == CKV_DTYPE_FP16 && rs->forward_f16) {
    const uint16_t *h = (const uint16_t *)ckv_cb(m->src, ckv_draft_kv_offset(g, sh->capacity, l, kv, m->src_slot));
    if (next) prefetch_source(g, next, l, kv);
    for (uint32_t hd = 0; hd < H; hd++)
      rs->forward_f16(h + (size_t)hd * D, row + (size_t)hd * D, D, signs + ckv_rot_signs_index(g, l, kv, hd));
    return;
  }
  ckv_read_row(ops, g, m->src, sh, l, kv, m->src_slot, row);
  if (next) prefetch_source(g, next, l, kv);
  for (uint32_t hd = 0; hd < H; hd++) rs->forward(row + (size_t)hd * D, D, signs + ckv_rot_signs_index(g, l, kv, hd));
}

/* Where destination slot `slot` of (layer, kv) keeps its scales and its packed rows. */
static void slot_dst(const ckv_geometry *g, void *dst, uint32_t fmt, uint32_t cap, uint32_t l, uint32_t kv,
                     uint32_t slot, uint8_t **ret_scales, uint8_t **ret_rows) {
  uint32_t H = g->n_kv_heads;
  *ret_scales = ckv_b(dst, ckv_rot_scales_offset(fmt, g, cap, l, kv)) + (size_t)slot * H;
  *ret_rows = ckv_b(dst, ckv_rot_codes_offset(fmt, g, cap, l, kv)) + (size_t)slot * H * ckv_rot_row_bytes(fmt, g);
}

/* Quantizes row (every head of K or V of one token, keys already less the
 * block's means) into destination slot `slot` of (layer, kv). */
static void quant_row(const rot_steps *rs, const ckv_geometry *g, void *dst, uint32_t fmt, uint32_t cap, uint32_t l,
                      uint32_t kv, uint32_t slot, const float *row) {
  uint8_t *sc, *rows;
  slot_dst(g, dst, fmt, cap, l, kv, slot, &sc, &rows);
  rs->quant_heads(row, g->n_kv_heads, g->head_dim, ckv_format_code_bits(fmt), sc, rows);
}

/* Quantizes the rotated keys row less the block's means (row is scratch: it may be overwritten) into slot
 * `slot` of layer l. */
static void quant_keys_less(const ckv_rowops *ops, const rot_steps *rs, const ckv_geometry *g, void *dst, uint32_t fmt,
                            uint32_t cap, uint32_t l, uint32_t slot, float *row, const float *mean) {
  if (rs->quant_less) {
    uint8_t *sc, *rows;
    slot_dst(g, dst, fmt, cap, l, 0, slot, &sc, &rows);
    rs->quant_less(row, mean, g->n_kv_heads, g->head_dim, ckv_format_code_bits(fmt), sc, rows);
    return;
  }
  ops->axpy(-1.0f, mean, row, (size_t)g->n_kv_heads * g->head_dim); /* row + -1 * mean = row - mean, one rounding */
  quant_row(rs, g, dst, fmt, cap, l, 0, slot, row);
}

/* Rotates and quantizes the values of move m into its destination slot of layer l; next as read_rotated_row's. */
static void quant_values(const ckv_rowops *ops, const rot_steps *rs, const ckv_geometry *g, const float *signs,
                         const ckv_move *m, const ckv_move *next, uint32_t fmt, uint32_t cap, uint32_t l, float *row) {
  const ckv_block_header *sh = ckv_move_src_hdr(m);
  if (sh->format == CKV_FORMAT_DRAFT && g->dtype == CKV_DTYPE_FP16 && rs->quant_f16) {
    const uint16_t *h = (const uint16_t *)ckv_cb(m->src, ckv_draft_kv_offset(g, sh->capacity, l, 1, m->src_slot));
    uint8_t *sc, *rows;
    if (next) prefetch_source(g, next, l, 1);
    slot_dst(g, m->dst, fmt, cap, l, 1, m->dst_slot, &sc, &rows);
    rs->quant_f16(h, signs + ckv_rot_signs_index(g, l, 1, 0), g->n_kv_heads, g->head_dim, ckv_format_code_bits(fmt), sc,
                  rows);
    return;
  }
  read_rotated_row(ops, rs, g, signs, m, next, l, 1, row);
  quant_row(rs, g, m->dst, fmt, cap, l, 1, m->dst_slot, row);
}

/* The keys of layer l of the n moves bound for block dst, whose means are not
 * set yet: every token's rotated keys into keys[n][H*D] (rotated once, kept
 * for the quantization), their sum in destination-slot order, the means of
 * the layer written as FP16 and read back (as every later move reads them). */
static void layer_means(const ckv_rowops *ops, const rot_steps *rs, const ckv_geometry *g, const float *signs,
                        const ckv_move *moves, const size_t *order, size_t n, uint32_t l, float *keys, float *sum) {
  const ckv_block_header *dh = ckv_move_dst_hdr(&moves[order[0]]);
  void *dst = moves[order[0]].dst;
  uint32_t D = g->head_dim, H = g->n_kv_heads;
  size_t te = (size_t)H * D;
  bool as_finite = rs->forward_f16_sum && g->dtype == CKV_DTYPE_FP16; /* FP16 drafts rotated as if finite */
  for (int pass = 0; pass < 2; pass++) {
    memset(sum, 0, te * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      float *row = keys + i * te;
      const ckv_move *m = &moves[order[i]], *next = i + PREFETCH_AHEAD < n ? &moves[order[i + PREFETCH_AHEAD]] : NULL;
      const ckv_block_header *sh = ckv_move_src_hdr(m);
      if (as_finite && sh->format == CKV_FORMAT_DRAFT) {
        if (next) prefetch_source(g, next, l, 0);
        rs->forward_f16_sum((const uint16_t *)ckv_cb(m->src, ckv_draft_kv_offset(g, sh->capacity, l, 0, m->src_slot)),
                            signs + ckv_rot_signs_index(g, l, 0, 0), H, D, row, sum);
        continue;
      }
      read_rotated_row(ops, rs, g, signs, m, next, l, 0, row);
      ops->axpy(1.0f, row, sum, te); /* sum + 1 * row: one rounding, the sum's */
    }
    if (!as_finite) break;
    /* a NaN or Inf read as if finite leaves its head's sums non-finite (finite keys' sums stay far below
     * FLT_MAX): then every key of the layer again, with the rule's ckv_rot_finite */
    size_t e = 0;
    while (e < te && fabsf(sum[e]) <= FLT_MAX) e++;
    if (e == te) break;
    as_finite = false;
  }
  for (uint32_t hd = 0; hd < H; hd++) {
    uint16_t *mean = (uint16_t *)ckv_b(dst, ckv_rot_mean_offset(g, dh->capacity, l, hd));
    if (rs->means) { /* written and read back in one pass */
      rs->means(sum + (size_t)hd * D, (uint32_t)n, D, mean, sum + (size_t)hd * D);
      continue;
    }
    for (uint32_t i = 0; i < D; i++) mean[i] = ckv_rot_mean_f16(sum[(size_t)hd * D + i], (uint32_t)n);
    key_mean(g, dst, dh->capacity, l, hd, sum + (size_t)hd * D);
  }
}

int ckv_rot_to(const ckv_rowops *ops, const ckv_geometry *g, const float *signs, const ckv_move *moves,
               const size_t *order, size_t n, float *row) {
  uint32_t D = g->head_dim, H = g->n_kv_heads;
  size_t te = (size_t)H * D, most = 0;
  rot_steps rs = steps_for(D);
  for (size_t i = 0; i < n;) { /* the largest group of moves into one block */
    size_t j = i + 1;
    while (j < n && moves[order[j]].dst == moves[order[i]].dst) j++;
    most = j - i > most ? j - i : most;
    i = j;
  }
  /* sum: the block's key means of one layer, every head; keys: the rotated keys of one layer of a group
   * (made when a block without means comes) */
  float *sum = malloc(te * sizeof(float)), *keys = NULL;
  if (!sum) return -12;
  for (size_t i = 0; i < n;) { /* the moves of one destination block (sorted by destination) */
    size_t j = i + 1;
    while (j < n && moves[order[j]].dst == moves[order[i]].dst) j++;
    const ckv_block_header *dh = ckv_move_dst_hdr(&moves[order[i]]);
    void *dst = moves[order[i]].dst;
    uint32_t fmt = dh->format, cap = dh->capacity;
    uint32_t *meta = (uint32_t *)ckv_b(dst, ckv_rot_meta_offset(cap));
    bool fresh = !(__atomic_load_n(meta, __ATOMIC_ACQUIRE) & CKV_ROT_MEANS_SET);
    if (fresh && !keys && !(keys = malloc(most * te * sizeof(float)))) {
      free(sum);
      return -12;
    }
    for (uint32_t l = 0; l < g->n_layers; l++) {
      if (fresh) { /* the keys rotated once: for the means, then quantized from the buffer */
        layer_means(ops, &rs, g, signs, moves, order + i, j - i, l, keys, sum);
        for (size_t k = i; k < j; k++)
          quant_keys_less(ops, &rs, g, dst, fmt, cap, l, moves[order[k]].dst_slot, keys + (k - i) * te, sum);
      } else {
        for (uint32_t hd = 0; hd < H; hd++) key_mean(g, dst, cap, l, hd, sum + (size_t)hd * D);
        for (size_t k = i; k < j; k++) {
          read_rotated_row(ops, &rs, g, signs, &moves[order[k]], k + PREFETCH_AHEAD < j ? &moves[order[k + PREFETCH_AHEAD]] : NULL, l, 0, row);
          quant_keys_less(ops, &rs, g, dst, fmt, cap, l, moves[order[k]].dst_slot, row, sum); /* less the block's mean */
        }
      }
      for (size_t k = i; k < j; k++)
        quant_values(ops, &rs, g, signs, &moves[order[k]], k + PREFETCH_AHEAD < j ? &moves[order[k + PREFETCH_AHEAD]] : NULL,
                     fmt, cap, l, row);
    }
    if (fresh) __atomic_fetch_or(meta, CKV_ROT_MEANS_SET, __ATOMIC_RELEASE);
    i = j;
  }
  free(sum);
  free(keys);
  return 0;
}
