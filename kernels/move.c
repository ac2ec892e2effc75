/* move.c - transitions: copies tokens between blocks of different formats,
 * quantizing on the way (draft -> staged INT8, draft/staged -> committed
 * INT4/INT2), as one call over a list of moves.  Committed destinations are
 * written a 32-token chunk at a time (keys share per-channel scales across
 * the chunk), then the chunk is sealed; see ckv_kernels_move in kernels.h. */
#include <stdlib.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

#define ENOMEM_ (-12)

static _Thread_local const ckv_move *t_sort_moves;

/* The destination slot takes the source's position, unless the caller gave
 * trusted headers: then it keeps the positions itself (the daemon writes them
 * into its private header shadow when it publishes the move, and flushes the
 * shadow from its own thread; a second writer here would race that flush). */
static void copy_position(const ckv_move *m) {
  if (m->dst_hdr) return;
  ckv_block_positions(m->dst)[m->dst_slot] = ckv_block_positions_const(m->src)[m->src_slot];
}

static int by_dst(const void *a, const void *b) {
  const ckv_move *x = &t_sort_moves[*(const size_t *)a], *y = &t_sort_moves[*(const size_t *)b];
  if (x->dst != y->dst) return (uintptr_t)x->dst < (uintptr_t)y->dst ? -1 : 1;
  return x->dst_slot < y->dst_slot ? -1 : x->dst_slot > y->dst_slot;
}

/* Checks one move against the headers it is computed from (trusted copies or
 * the blocks' own, ckv_move_*_hdr): every later offset stays inside blocks of
 * those headers' sizes. */
static int check_move(const ckv_geometry *g, const ckv_move *m) {
  if (!m->src || !m->dst) return CKV_ERR_INVALID;
  const ckv_block_header *s = ckv_move_src_hdr(m), *d = ckv_move_dst_hdr(m);
  int st = ckv_block_check(s, g);
  if (st == CKV_OK) st = ckv_block_check(d, g);
  if (st != CKV_OK) return st;
  if (m->src_slot >= s->capacity || m->dst_slot >= d->capacity) return CKV_ERR_RANGE;
  bool ok = (s->format == CKV_FORMAT_DRAFT && d->format != CKV_FORMAT_DRAFT) ||
            (s->format == CKV_FORMAT_STAGED && ckv_format_is_committed_state(d->format)) ||
            (ckv_format_is_rot(s->format) && ckv_format_is_rot(d->format));
  return ok ? CKV_OK : CKV_ERR_UNSUPPORTED;
}

int ckv_moves_sorted(const ckv_geometry *g, const ckv_move *moves, size_t n, size_t **ret_order) {
  if (!g || (!moves && n)) return CKV_ERR_INVALID;
  for (size_t i = 0; i < n; i++) {
    int st = check_move(g, &moves[i]);
    if (st != CKV_OK) return st;
  }
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  if (!order) return ENOMEM_;
  for (size_t i = 0; i < n; i++) order[i] = i;
  t_sort_moves = moves;
  qsort(order, n, sizeof *order, by_dst);
  t_sort_moves = NULL;
  for (size_t i = 1; i < n; i++)
    if (moves[order[i]].dst == moves[order[i - 1]].dst && moves[order[i]].dst_slot == moves[order[i - 1]].dst_slot) {
      free(order);
      return CKV_ERR_INVALID;
    }
  *ret_order = order;
  return CKV_OK;
}

/* Scratch for one call: a row, per-element zero/inv and one chunk of rows. */
typedef struct scratch {
  float *row, *zero, *inv, *mn, *mx, *chunk, *gz, *ginv;
  uint16_t *s16, *z16;
  uint8_t *codes;
} scratch;

/* The FP16 / BF16 row of K (kv 0) or V of layer l of a move's draft source. */
static const uint16_t *src_row(const ckv_geometry *g, const ckv_move *m, uint32_t l, uint32_t kv) {
  return (const uint16_t *)ckv_cb(m->src, ckv_draft_kv_offset(g, ckv_move_src_hdr(m)->capacity, l, kv, m->src_slot));
}
/* Asks for a source row a pass ahead of its first read (into L2: the pass in between reads L1). */
static void prefetch_row(const void *p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* Converts moves order[0..n) (all into staged blocks), layer by layer so that
 * consecutive slots are read and written front to back. */
static void to_staged(const ckv_rowops *ops, const ckv_geometry *g, const ckv_move *moves, const size_t *order,
                      size_t n, scratch *s) {
  uint32_t ng = ckv_staged_groups(g), gl = ckv_staged_group_heads(g) * g->head_dim;
  size_t te = ckv_draft_token_elems(g);
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t i = 0; i < n; i++) {
        const ckv_move *m = &moves[order[i]];
        uint32_t cap = ckv_move_dst_hdr(m)->capacity;
        const ckv_block_header *sh = ckv_move_src_hdr(m);
        int8_t *codes = (int8_t *)ckv_b(m->dst, ckv_staged_codes_offset(g, cap, l, kv)) + (size_t)m->dst_slot * te;
        uint16_t *sc = (uint16_t *)ckv_b(m->dst, ckv_staged_scales_offset(g, cap, l, kv)) + (size_t)m->dst_slot * ng;
        if (sh->format == CKV_FORMAT_DRAFT && ops->quant_i8_groups_h) { /* one call per row, scales included */
          const uint16_t *h = src_row(g, m, l, kv);
          if (i + 1 < n && ckv_move_src_hdr(&moves[order[i + 1]])->format == CKV_FORMAT_DRAFT)
            prefetch_row(src_row(g, &moves[order[i + 1]], l, kv), te * 2u); /* the next row, while this one is coded */
          ops->quant_i8_groups_h(h, g->dtype == CKV_DTYPE_BF16, te, gl, codes, sc);
        } else {
          ckv_read_row(ops, g, m->src, sh, l, kv, m->src_slot, s->row);
          ops->quant_i8_groups(s->row, te, gl, codes, sc);
        }
      }
}

/* The kept channels of one head's row (the row itself when nothing is pruned). */
static const float *gather(scratch *s, const uint32_t *idx, uint32_t kept, uint32_t D, const float *r) {
  if (kept == D) return r;
  for (uint32_t j = 0; j < kept; j++) s->row[j] = r[idx[j]];
  return s->row;
}

/* Whether a chunk takes the fused path (rowops' minmax_rows_h, quant_u_h, quant_u32_groups_h): every source
 * a draft, no channel pruned, rows in whole groups of 32, 4 or 2 bits, and the path has both. */
static int fused_commit(const ckv_rowops *ops, const ckv_geometry *g, const ckv_move *moves, const size_t *order,
                        size_t n, const ckv_block_header *h) {
  uint32_t bits = ckv_format_code_bits(h->format);
  if (!ops->minmax_rows_h || !ops->quant_u_h || !ops->quant_u32_groups_h || (bits != 4 && bits != 2) || h->kept_channels != g->head_dim ||
      g->head_dim % 32u || ckv_draft_token_elems(g) % 32u || CKV_COMMIT_VALUE_GROUP != 32)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (ckv_move_src_hdr(&moves[order[i]])->format != CKV_FORMAT_DRAFT) return 0;
  return 1;
}

/* Quantizes the moves order[0..n) (one chunk of one committed block).
 * CKV_ERR_CORRUPT when a channel mask does not hold the block's kept
 * channels (the mask lives in memory a worker can write). */
static int to_commit_chunk(const ckv_rowops *ops, const ckv_geometry *g, const ckv_move *moves, const size_t *order,
                           size_t n, uint32_t chunk, scratch *s) {
  void *dst = moves[order[0]].dst;
  const ckv_block_header *h = ckv_move_dst_hdr(&moves[order[0]]);
  uint32_t fmt = h->format, cap = h->capacity, kept = h->kept_channels, bits = ckv_format_code_bits(fmt);
  uint32_t D = g->head_dim, H = g->n_kv_heads, T = CKV_COMMIT_CHUNK_TOKENS, ng = ckv_commit_value_groups(g);
  size_t te = ckv_draft_token_elems(g), krow = ckv_commit_key_row_bytes(fmt, kept);
  size_t vrow = ckv_commit_value_row_bytes(fmt, g);
  uint32_t idx[CKV_MAX_HEAD_DIM];
  int bf16 = g->dtype == CKV_DTYPE_BF16, fused = fused_commit(ops, g, moves, order, n, h);
  for (uint32_t l = 0; l < g->n_layers && fused; l++) {
    if (n < T) { /* a partial chunk: the slots not written stay zero */
      for (uint32_t hd = 0; hd < H; hd++)
        memset(ckv_b(dst, ckv_commit_key_chunk_offset(fmt, g, cap, kept, l, hd, chunk)), 0,
               ckv_commit_key_chunk_bytes(fmt, kept));
      memset((uint16_t *)ckv_b(dst, ckv_commit_value_params_offset(fmt, g, cap, kept, l)) + (size_t)chunk * T * ng * 2u,
             0, (size_t)T * ng * 4u);
      memset(ckv_b(dst, ckv_commit_value_codes_offset(fmt, g, cap, kept, l)) + (size_t)chunk * T * vrow, 0, T * vrow);
    }
    /* keys: per channel min / max over the chunk's rows, read front to back, then each row's codes */
    const uint16_t *src[CKV_COMMIT_CHUNK_TOKENS];
    for (size_t e = 0; e < te; e++) s->mn[e] = INFINITY, s->mx[e] = -INFINITY;
    for (size_t i = 0; i < n; i++) src[i] = src_row(g, &moves[order[i]], l, 0);
    ops->minmax_rows_h(src, n, bf16, s->mn, s->mx, te);
    uint8_t *c[CKV_MAX_KV_HEADS];
    for (uint32_t hd = 0; hd < H; hd++) {
      if (ckv_mask_channels(ckv_commit_mask(g, h, dst, l, hd), D, idx) != kept) return CKV_ERR_CORRUPT;
      c[hd] = ckv_b(dst, ckv_commit_key_chunk_offset(fmt, g, cap, kept, l, hd, chunk));
      size_t o = (size_t)hd * D;
      ops->qa_params(s->mn + o, s->mx + o, D, bits, (uint16_t *)c[hd], (uint16_t *)c[hd] + kept, s->zero + o, s->inv + o);
    }
    for (size_t i = 0; i < n; i++) {
      size_t r = (size_t)kept * 4u + (moves[order[i]].dst_slot % T) * krow;
      prefetch_row(src_row(g, &moves[order[i]], l, 1), te * 2u); /* the values, read next */
      for (uint32_t hd = 0; hd < H; hd++)
        ops->quant_u_h(src[i] + (size_t)hd * D, bf16, s->zero + (size_t)hd * D, s->inv + (size_t)hd * D, bits, c[hd] + r, D);
    }
    uint16_t *par = (uint16_t *)ckv_b(dst, ckv_commit_value_params_offset(fmt, g, cap, kept, l));
    uint8_t *vcodes = ckv_b(dst, ckv_commit_value_codes_offset(fmt, g, cap, kept, l));
    for (size_t i = 0; i < n; i++) {
      const ckv_move *m = &moves[order[i]];
      const uint16_t *v = src_row(g, m, l, 1);
      if (l + 1 < g->n_layers) prefetch_row(src_row(g, m, l + 1, 0), te * 2u); /* the next layer's keys */
      ops->quant_u32_groups_h(v, bf16, te, bits, par + (size_t)m->dst_slot * ng * 2u, vcodes + (size_t)m->dst_slot * vrow);
    }
  }
  for (uint32_t l = 0; l < g->n_layers && !fused; l++) {
    /* keys: gather the chunk's rows, then per head per kept channel min/max over tokens */
    for (size_t i = 0; i < n; i++) {
      const ckv_move *m = &moves[order[i]];
      ckv_read_row(ops, g, m->src, ckv_move_src_hdr(m), l, 0, m->src_slot, s->chunk + i * te);
    }
    for (uint32_t hd = 0; hd < H; hd++) {
      /* Read once into idx and counted: idx[0..kept) is then fully set and in range. */
      if (ckv_mask_channels(ckv_commit_mask(g, h, dst, l, hd), D, idx) != kept) return CKV_ERR_CORRUPT;
      uint8_t *c = ckv_b(dst, ckv_commit_key_chunk_offset(fmt, g, cap, kept, l, hd, chunk));
      memset(c, 0, ckv_commit_key_chunk_bytes(fmt, kept));
      uint16_t *sc = (uint16_t *)c, *zp = sc + kept;
      for (uint32_t j = 0; j < kept; j++) {
        s->mn[j] = INFINITY;
        s->mx[j] = -INFINITY;
      }
      for (size_t i = 0; i < n; i++) ops->minmax(gather(s, idx, kept, D, s->chunk + i * te + (size_t)hd * D), s->mn, s->mx, kept);
      ops->qa_params(s->mn, s->mx, kept, bits, sc, zp, s->zero, s->inv);
      for (size_t i = 0; i < n; i++) {
        ops->quant_u(gather(s, idx, kept, D, s->chunk + i * te + (size_t)hd * D), s->zero, s->inv, bits, s->codes, kept);
        ckv_pack_codes(s->codes, kept, bits, c + (size_t)kept * 4u + (moves[order[i]].dst_slot % T) * krow);
      }
    }
    /* values: per token, per 32-element group */
    uint16_t *par = (uint16_t *)ckv_b(dst, ckv_commit_value_params_offset(fmt, g, cap, kept, l));
    uint8_t *vcodes = ckv_b(dst, ckv_commit_value_codes_offset(fmt, g, cap, kept, l));
    memset(par + (size_t)chunk * T * ng * 2u, 0, (size_t)T * ng * 4u);
    memset(vcodes + (size_t)chunk * T * vrow, 0, T * vrow);
    for (size_t i = 0; i < n; i++) {
      const ckv_move *m = &moves[order[i]];
      ckv_read_row(ops, g, m->src, ckv_move_src_hdr(m), l, 1, m->src_slot, s->row);
      uint16_t *p = par + (size_t)m->dst_slot * ng * 2u;
      /* one call per row, packed in place (the chunk's rows were zeroed above) */
      ops->quant_u_groups(s->row, te, CKV_COMMIT_VALUE_GROUP, bits, p, vcodes + (size_t)m->dst_slot * vrow);
    }
  }
  return CKV_OK;
}

static void seal(void *dst, const ckv_block_header *h, uint32_t chunk) {
  uint32_t *meta = (uint32_t *)ckv_b(dst, ckv_commit_meta_offset(h->capacity));
  __atomic_fetch_or(meta, 1u << chunk, __ATOMIC_RELEASE);
}

ckv_status ckv_kernels_move(const ckv_geometry *g, const ckv_move *moves, size_t n_moves, unsigned flags) {
  size_t *order = NULL;
  int st = ckv_moves_sorted(g, moves, n_moves, &order);
  if (st != CKV_OK) return (ckv_status)st;
  const ckv_rowops *ops = ckv_rowops_get();
  size_t te = ckv_draft_token_elems(g);
  scratch s = {0};
  s.row = malloc(te * sizeof(float));
  s.zero = malloc(te * sizeof(float));
  s.inv = malloc(te * sizeof(float));
  size_t nmm = te; /* per element of a row: the fused keys' min / max (head_dim and value groups fit too) */
  s.mn = malloc(nmm * sizeof(float));
  s.mx = malloc(nmm * sizeof(float));
  s.gz = malloc(nmm * sizeof(float));
  s.ginv = malloc(nmm * sizeof(float));
  s.s16 = malloc(nmm * sizeof(uint16_t));
  s.z16 = malloc(nmm * sizeof(uint16_t));
  s.chunk = malloc(te * CKV_COMMIT_CHUNK_TOKENS * sizeof(float));
  s.codes = malloc(te);
  if (!s.row || !s.zero || !s.inv || !s.mn || !s.mx || !s.chunk || !s.codes || !s.gz || !s.ginv || !s.s16 || !s.z16)
    st = ENOMEM_;
  /* Check every committed chunk before writing anything. */
  for (size_t i = 0; i < n_moves && st == CKV_OK; i++) {
    const ckv_move *m = &moves[order[i]];
    const ckv_block_header *dh = ckv_move_dst_hdr(m);
    if (ckv_format_is_commit(dh->format) &&
        ((ckv_sealed_chunks_of(dh, m->dst) >> (m->dst_slot / CKV_COMMIT_CHUNK_TOKENS)) & 1u))
      st = CKV_ERR_STATE;
  }
  float *signs = NULL; /* the rotation's signs, made when a rotated destination comes */
  for (size_t i = 0; i < n_moves && st == CKV_OK;) {
    const ckv_move *m = &moves[order[i]];
    size_t j = i + 1;
    const ckv_block_header *dh = ckv_move_dst_hdr(m);
    if (ckv_format_is_rot(dh->format)) {
      while (j < n_moves && ckv_format_is_rot(ckv_move_dst_hdr(&moves[order[j]])->format)) j++;
      if (!signs && !(signs = ckv_rot_signs_new(g))) {
        st = ENOMEM_;
        break;
      }
      if ((st = ckv_rot_to(ops, g, signs, moves, order + i, j - i, s.row)) != CKV_OK) break;
      for (size_t k = i; k < j; k++) copy_position(&moves[order[k]]);
    } else if (!ckv_format_is_commit(dh->format)) {
      while (j < n_moves && !ckv_format_is_committed_state(ckv_move_dst_hdr(&moves[order[j]])->format)) j++;
      to_staged(ops, g, moves, order + i, j - i, &s);
      for (size_t k = i; k < j; k++) copy_position(&moves[order[k]]);
    } else {
      size_t blk_end = i;
      while (blk_end < n_moves && moves[order[blk_end]].dst == m->dst) blk_end++;
      st = ckv_prune_block(ops, g, m->dst, dh, moves, order + i, blk_end - i);
      for (size_t k = i; k < blk_end && st == CKV_OK;) {
        uint32_t chunk = moves[order[k]].dst_slot / CKV_COMMIT_CHUNK_TOKENS;
        size_t e = k;
        while (e < blk_end && moves[order[e]].dst_slot / CKV_COMMIT_CHUNK_TOKENS == chunk) e++;
        st = to_commit_chunk(ops, g, moves, order + k, e - k, chunk, &s);
        if (st != CKV_OK) break;
        for (size_t q = k; q < e; q++) copy_position(&moves[order[q]]);
        seal(m->dst, dh, chunk);
        k = e;
      }
      j = blk_end;
    }
    i = j;
  }
  if (st == CKV_OK && (flags & CKV_MOVE_SET_VALID))
    for (size_t i = 0; i < n_moves; i++)
      ckv_set_valid_at(moves[i].dst, ckv_move_dst_hdr(&moves[i])->capacity, moves[i].dst_slot, true);
  free(s.row);
  free(s.zero);
  free(s.inv);
  free(s.mn);
  free(s.mx);
  free(s.chunk);
  free(s.codes);
  free(s.gz);
  free(s.ginv);
  free(s.s16);
  free(s.z16);
  free(signs);
  free(order);
  return (ckv_status)st;
}
