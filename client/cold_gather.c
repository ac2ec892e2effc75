/* cold_gather.c - the cold tokens a query needs most, in one FP16 block
 * (see cold_gather.h). */
#include "client/cold_gather.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/cold_sketch.h"
#include "commitkv/status.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

/* A cold token: slot `slot` of view->cold[blk], at position pos. */
typedef struct cand {
  uint32_t blk, slot, pos;
} cand;

struct ckv_cold_gather_scratch {
  cand *c;       /* the cold tokens */
  float *score;  /* [n][n_q_heads]: estimated, then exact for the shortlist */
  float *rank;   /* [n]: the largest share of a head's mass */
  uint32_t *ord; /* token indexes, best first */
  size_t n_cap;
  float *tables, *total, *lse, *row, *row2, *rot;
  uint16_t *h16;
  size_t tables_len;
  uint32_t heads_cap, row_cap, rot_cap;
  /* code-scored blocks (ckv_cold_code_scored): the query rotated as their keys are, times the softmax scale,
   * [n_q_heads][head_dim]; per code width b (1, 2, 4) the tables of code_tables, [n_q_heads][d*b/8][256]
   * (built in a call when a block of that width comes up); per query head its dot with a block's key mean */
  float *rq, *code_tab[5], *mean_dot, *mean;
  size_t rq_len, code_tab_len[5];
  bool code_built[5];
  uint8_t *exact; /* [n]: the token's first score is exact (code-scored or read one by one) */
};

void ckv_cold_gather_scratch_free(ckv_cold_gather_scratch *s) {
  if (!s) return;
  free(s->c);
  free(s->score);
  free(s->rank);
  free(s->ord);
  free(s->tables);
  free(s->total);
  free(s->lse);
  free(s->row);
  free(s->row2);
  free(s->rot);
  free(s->h16);
  free(s->rq);
  for (int b = 0; b < 5; b++) free(s->code_tab[b]);
  free(s->mean_dot);
  free(s->mean);
  free(s->exact);
  free(s);
}

/* Grows *p to hold n elements of size sz (n >= 1). */
static int grow(void **p, size_t n, size_t sz) {
  void *np = realloc(*p, n * sz);
  if (!np) return -ENOMEM;
  *p = np;
  return CKV_OK;
}

static int scratch_ready(ckv_cold_gather_scratch **sp, const ckv_geometry *g, uint32_t n_q_heads, size_t n) {
  if (!*sp && !(*sp = calloc(1, sizeof(**sp)))) return -ENOMEM;
  ckv_cold_gather_scratch *s = *sp;
  const uint32_t d = g->head_dim, row = g->n_kv_heads * d;
  if (n > s->n_cap || n_q_heads > s->heads_cap) {
    size_t nn = n > s->n_cap ? n + n / 2 + 64 : s->n_cap;
    uint32_t nh = n_q_heads > s->heads_cap ? n_q_heads : s->heads_cap;
    if (grow((void **)&s->c, nn, sizeof(cand)) || grow((void **)&s->score, nn * nh, sizeof(float)) ||
        grow((void **)&s->rank, nn, sizeof(float)) || grow((void **)&s->ord, nn, sizeof(uint32_t)) ||
        grow((void **)&s->exact, nn, sizeof(uint8_t)))
      return -ENOMEM;
    s->n_cap = nn;
  }
  if (n_q_heads > s->heads_cap) {
    if (grow((void **)&s->total, n_q_heads, sizeof(float)) || grow((void **)&s->lse, n_q_heads, sizeof(float)) ||
        grow((void **)&s->mean_dot, n_q_heads, sizeof(float)))
      return -ENOMEM;
    s->heads_cap = n_q_heads;
  }
  size_t tl = ckv_cold_sketch_words(d) ? ckv_cold_sketch_table_len(n_q_heads, d) : 0;
  if (tl > s->tables_len) {
    if (grow((void **)&s->tables, tl, sizeof(float))) return -ENOMEM;
    s->tables_len = tl;
  }
  if (row > s->row_cap) {
    if (grow((void **)&s->row, row, sizeof(float)) || grow((void **)&s->row2, row, sizeof(float)) ||
        grow((void **)&s->h16, row, sizeof(uint16_t)))
      return -ENOMEM;
    s->row_cap = row;
  }
  if (d > s->rot_cap) {
    if (grow((void **)&s->rot, d, sizeof(float)) || grow((void **)&s->mean, d, sizeof(float))) return -ENOMEM;
    s->rot_cap = d;
  }
  if ((size_t)n_q_heads * d > s->rq_len) {
    if (grow((void **)&s->rq, (size_t)n_q_heads * d, sizeof(float))) return -ENOMEM;
    s->rq_len = (size_t)n_q_heads * d;
  }
  for (uint32_t b = 1; b <= 4; b++) s->code_built[b] = false;
  return CKV_OK;
}

/* ---- scores from a rotated block's codes -------------------------------------------------------------- */
/* A rotated key of (layer, kv head) is mean + scale (code - offset) in the basis of R, its rotation
 * (kernels/quant.h), which is orthogonal: q.k = (R q).mean + scale sum_c (R q)_c (code_c - offset).  Per query
 * head, a table per byte of a code row gives the sum over that byte's codes for each of its 256 values, so a
 * key's exact score takes d*b/8 lookups (b = 1: as many as a sketch's) and no memory beyond the block. */
static int code_tables(ckv_cold_gather_scratch *s, uint32_t n_q_heads, uint32_t d, uint32_t b) {
  const uint32_t per = 8u / b, mask = (1u << b) - 1u, nbytes = d * b / 8u;
  const size_t len = (size_t)n_q_heads * nbytes * 256u;
  if (len > s->code_tab_len[b]) {
    if (grow((void **)&s->code_tab[b], len, sizeof(float))) return -ENOMEM;
    s->code_tab_len[b] = len;
  }
  const float off = ckv_rot_offset(b);
  float val[16];
  for (uint32_t c = 0; c <= mask; c++) val[c] = (float)c - off;
  for (uint32_t h = 0; h < n_q_heads; h++)
    for (uint32_t j = 0; j < nbytes; j++) {
      const float *x = s->rq + (size_t)h * d + (size_t)j * per;
      float *t = s->code_tab[b] + ((size_t)h * nbytes + j) * 256u;
      for (uint32_t byte = 0; byte < 256u; byte++) {
        float acc = 0.f;
        for (uint32_t m = 0; m < per; m++) acc += x[m] * val[(byte >> (m * b)) & mask];
        t[byte] = acc;
      }
    }
  s->code_built[b] = true;
  return CKV_OK;
}

/* Every valid slot of code-scored cold block i (of the slots both its header and the view hold), as candidates
 * from s->c[*k] on (at most n in all), each query head's score exact; s->rq holds the rotated query. */
static int code_scores(ckv_cold_gather_scratch *s, const ckv_geometry *g, const ckv_view *v, size_t i,
                       uint32_t layer, uint32_t n_q_heads, size_t *k, size_t n) {
  const ckv_block_view *bv = &v->cold[i];
  const uint32_t fmt = bv->format, b = ckv_format_code_bits(fmt), d = g->head_dim, H = g->n_kv_heads;
  const uint32_t group = n_q_heads / H, nbytes = d * b / 8u, cap = bv->capacity;
  if (!s->code_built[b]) {
    int e = code_tables(s, n_q_heads, d, b);
    if (e < 0) return e;
  }
  const uint8_t *sc = (const uint8_t *)bv->data + ckv_rot_scales_offset(fmt, g, cap, layer, 0);
  const uint8_t *codes = (const uint8_t *)bv->data + ckv_rot_codes_offset(fmt, g, cap, layer, 0);
  for (uint32_t h = 0; h < n_q_heads; h++) {
    if (h % group == 0) { /* the key mean of kv head h / group, as the kernels read it */
      const uint16_t *m = (const uint16_t *)(const void *)((const uint8_t *)bv->data + ckv_rot_mean_offset(g, cap, layer, h / group));
      for (uint32_t x = 0; x < d; x++) s->mean[x] = ckv_rot_finite(ckv_f16_to_f32(m[x]));
    }
    float dot = 0.f;
    for (uint32_t x = 0; x < d; x++) dot += s->rq[(size_t)h * d + x] * s->mean[x];
    s->mean_dot[h] = dot;
  }
  const uint32_t *positions = ckv_block_positions_const(bv->data);
  const uint32_t slots = ckv_cold_block_slots(bv);
  for (uint32_t slot = 0; slot < slots && *k < n; slot++) {
    if (!ckv_block_slot_valid(bv->data, slot)) continue;
    s->c[*k] = (cand){(uint32_t)i, slot, positions[slot]};
    s->ord[*k] = (uint32_t)*k;
    s->exact[*k] = 1;
    float *out = s->score + *k * n_q_heads;
    for (uint32_t h = 0; h < n_q_heads; h++) {
      const uint32_t kv = h / group;
      const uint8_t *row = codes + ((size_t)slot * H + kv) * nbytes;
      const float *t = s->code_tab[b] + (size_t)h * nbytes * 256u;
      float acc = 0.f;
      for (uint32_t j = 0; j < nbytes; j++) acc += t[(size_t)j * 256u + row[j]];
      float score = s->mean_dot[h] + ckv_rot_scale_value(sc[(size_t)slot * H + kv]) * acc;
      out[h] = isfinite(score) ? score : -INFINITY;
    }
    (*k)++;
  }
  return CKV_OK;
}

/* Exact scale * q_h . k for every query head of token t's key (layer), into
 * s->score; non-finite ones (bytes that do not read back) as -inf. */
static void exact_scores(ckv_cold_gather_scratch *s, const ckv_geometry *g, const ckv_view *v, uint32_t layer,
                         const float *q, uint32_t n_q_heads, float scale, uint32_t t) {
  const cand *c = &s->c[t];
  float *out = s->score + (size_t)t * n_q_heads;
  const uint32_t d = g->head_dim, group = n_q_heads / g->n_kv_heads;
  if (ckv_kernels_dequantize(g, v->cold[c->blk].data, layer, 0, c->slot, s->row) != CKV_OK) {
    for (uint32_t h = 0; h < n_q_heads; h++) out[h] = -INFINITY;
    return;
  }
  for (uint32_t h = 0; h < n_q_heads; h++) {
    float dot = ckv_cold_head_score(q + (size_t)h * d, s->row + (size_t)(h / group) * d, d, scale);
    out[h] = isfinite(dot) ? dot : -INFINITY;
  }
}

/* For the tokens ord[0..m): per query head the log of its softmax sum over
 * them, then each token's rank, its largest share of a head's mass (log). */
static void rank_by_share(ckv_cold_gather_scratch *s, uint32_t n_q_heads, size_t m) {
  for (uint32_t h = 0; h < n_q_heads; h++) {
    float top = -INFINITY, acc = 0.f;
    for (size_t k = 0; k < m; k++) {
      float e = s->score[(size_t)s->ord[k] * n_q_heads + h];
      if (!isfinite(e)) continue;
      if (e > top) {
        acc = acc * expf(top - e) + 1.f;
        top = e;
      } else {
        acc += expf(e - top);
      }
    }
    s->lse[h] = isfinite(top) ? top + logf(acc) : 0.f;
  }
  for (size_t k = 0; k < m; k++) {
    const float *sc = s->score + (size_t)s->ord[k] * n_q_heads;
    float best = -INFINITY;
    for (uint32_t h = 0; h < n_q_heads; h++)
      if (isfinite(sc[h]) && sc[h] - s->lse[h] > best) best = sc[h] - s->lse[h];
    s->rank[s->ord[k]] = best;
  }
}

/* qsort's context: the ranks of the calling thread's gather */
static _Thread_local const float *tl_rank;

static int by_rank_desc(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  float rx = tl_rank[x], ry = tl_rank[y];
  if (rx != ry) return rx > ry ? -1 : 1;
  return x < y ? -1 : x > y;
}

int ckv_cold_gather(ckv_cold_cache **cache, ckv_cold_gather_scratch **scratch, const ckv_geometry *g,
                    const ckv_view *v, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                    uint32_t max_tokens, void *block, uint32_t capacity, uint32_t *ret_src, size_t *ret_n) {
  if (!cache || !scratch || !g || !v || !q || !block || !ret_n || layer >= g->n_layers || !g->n_kv_heads ||
      !n_q_heads || n_q_heads % g->n_kv_heads || !max_tokens || capacity < max_tokens)
    return CKV_ERR_INVALID;
  *ret_n = 0;
  int e = ckv_block_init_header(block, CKV_FORMAT_DRAFT, g, capacity, 0, 0);
  if (e != CKV_OK) return e;
  if (!v->n_cold) return CKV_OK;
  if (!(scale > 0.f)) scale = 1.f / sqrtf((float)g->head_dim);
  size_t n = 0; /* at most this many cold tokens */
  for (size_t i = 0; i < v->n_cold; i++) n += ckv_cold_block_slots(&v->cold[i]);
  if ((e = scratch_ready(scratch, g, n_q_heads, n ? n : 1)) < 0) return e;
  ckv_cold_gather_scratch *s = *scratch;
  const uint32_t d = g->head_dim, words = ckv_cold_sketch_words(d), group = n_q_heads / g->n_kv_heads;
  bool any_sketched = false, rotated = false; /* any_sketched: the sketch tables are built */
  const size_t table_stride = (size_t)(d / 8) * 256;
  if ((e = ckv_cold_cache_forget(cache, g, v)) < 0) return e;
  size_t k = 0;
  for (size_t i = 0; i < v->n_cold; i++) {
    if (ckv_cold_code_scored(g, &v->cold[i])) { /* (so head_dim is one the rotation takes) */
      for (uint32_t h = 0; h < n_q_heads && !rotated; h++) { /* the query as these blocks' keys are rotated */
        float *x = s->rq + (size_t)h * d;
        for (uint32_t c = 0; c < d; c++) x[c] = q[(size_t)h * d + c] * scale;
        ckv_rot_forward(x, d, layer, 0, h / group);
      }
      rotated = true;
      if ((e = code_scores(s, g, v, i, layer, n_q_heads, &k, n)) < 0) return e;
      continue;
    }
    ckv_cold_summary sm;
    if ((e = ckv_cold_cache_summary(cache, g, v, i, &sm)) < 0) return e;
    /* a summary without sketches (a block whose bytes did not all read back, or no sketch at this head_dim):
     * its tokens are scored exactly, one by one, and those that do not read back are never chosen */
    const bool sketched = !sm.unknown && sm.sign;
    const uint32_t *positions = ckv_block_positions_const(v->cold[i].data);
    const uint32_t cap = ckv_cold_block_slots(&v->cold[i]);
    uint32_t j = 0; /* the sketch of slot `slot` is the j-th of the summary's (its slots ascend) */
    for (uint32_t slot = 0; slot < cap && k < n; slot++) {
      if (!ckv_block_slot_valid(v->cold[i].data, slot)) continue;
      if (sketched) {
        while (j < sm.n_valid && sm.slot[j] < slot) j++;
        if (j == sm.n_valid || sm.slot[j] != slot) continue; /* summaries are made anew when slots change */
      }
      s->c[k] = (cand){(uint32_t)i, slot, positions[slot]};
      s->ord[k] = (uint32_t)k;
      s->exact[k] = !sketched;
      float *sc = s->score + k * n_q_heads;
      if (sketched) {
        if (!any_sketched) ckv_cold_sketch_tables(q, n_q_heads, d, scale, s->rot, s->tables, s->total);
        any_sketched = true;
        for (uint32_t h = 0; h < n_q_heads; h++) {
          size_t hk = ((size_t)j * g->n_layers + layer) * g->n_kv_heads + h / group;
          sc[h] = ckv_cold_sketch_score(s->tables + h * table_stride, s->total[h], sm.sign + hk * words, sm.alpha[hk], d);
        }
      } else {
        exact_scores(s, g, v, layer, q, n_q_heads, scale, (uint32_t)k);
      }
      k++;
    }
  }
  n = k;
  if (!n) return CKV_OK;
  tl_rank = s->rank;
  rank_by_share(s, n_q_heads, n);
  qsort(s->ord, n, sizeof(*s->ord), by_rank_desc);
  size_t m = n;
  if (any_sketched) { /* the shortlist, its sketched tokens scored exactly */
    m = (size_t)CKV_COLD_GATHER_SHORTLIST * max_tokens < n ? (size_t)CKV_COLD_GATHER_SHORTLIST * max_tokens : n;
    for (size_t t = 0; t < m; t++)
      if (!s->exact[s->ord[t]]) exact_scores(s, g, v, layer, q, n_q_heads, scale, s->ord[t]);
    rank_by_share(s, n_q_heads, m);
    qsort(s->ord, m, sizeof(*s->ord), by_rank_desc);
  }
  size_t use = m < max_tokens ? m : max_tokens;
  /* the chosen into slots 0..use in position order (insertion sort: use is at most max_tokens) */
  for (size_t a = 1; a < use; a++) {
    uint32_t x = s->ord[a];
    size_t b = a;
    while (b > 0 && s->c[s->ord[b - 1]].pos > s->c[x].pos) {
      s->ord[b] = s->ord[b - 1];
      b--;
    }
    s->ord[b] = x;
  }
  const uint32_t row = g->n_kv_heads * d;
  uint32_t *out_pos = ckv_block_positions(block);
  size_t w = 0;
  for (size_t t = 0; t < use; t++) {
    const cand *c = &s->c[s->ord[t]];
    const void *src = v->cold[c->blk].data;
    if (!ckv_block_slot_valid(src, c->slot) || ckv_kernels_dequantize(g, src, layer, 0, c->slot, s->row) != CKV_OK ||
        ckv_kernels_dequantize(g, src, layer, 1, c->slot, s->row2) != CKV_OK)
      continue;
    for (int kv = 0; kv < 2; kv++) {
      const float *x = kv ? s->row2 : s->row;
      for (uint32_t i = 0; i < row; i++) s->h16[i] = ckv_f32_to_f16(x[i]);
      memcpy((uint8_t *)block + ckv_draft_kv_offset(g, capacity, layer, (uint32_t)kv, (uint32_t)w), s->h16,
             row * sizeof(uint16_t));
    }
    out_pos[w] = c->pos;
    ckv_block_set_valid(block, (uint32_t)w, true);
    if (ret_src) ret_src[w] = c->blk;
    w++;
  }
  *ret_n = w;
  return CKV_OK;
}
