/* cold_select.c - which cold blocks of a view a query could need (see
 * cold_select.h). */
#include "client/cold_select.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/cold_sketch.h"
#include "commitkv/status.h"
#include "kernels/kernels.h"

typedef struct summary {
  uint64_t id;
  uint32_t n_valid;
  bool unknown; /* the block could not be read back: always selected */
  uint64_t seen; /* the last prune() that found it in the view */
  float *lo, *hi; /* [n_layers][n_kv_heads][head_dim] */
  uint32_t cap;      /* the block's slots when summarised */
  uint32_t *slot_pos; /* [cap]: each slot's position then, UINT32_MAX if it was not valid */
  /* per valid slot, in slot order (where head_dim takes a sketch, cold_sketch.h): */
  uint32_t *slot;  /* [n_valid] */
  uint64_t *sign;  /* [n_valid][n_layers][n_kv_heads][words] */
  float *alpha;    /* [n_valid][n_layers][n_kv_heads] */
} summary;

struct ckv_cold_cache {
  summary *v; /* sorted by id */
  size_t n, cap;
  uint64_t prunes; /* prune() calls that looked at the view */
  float *row; /* scratch: one slot's keys, all heads */
  size_t row_len;
  float *rot; /* scratch: one head, rotated */
  uint32_t rot_len;
};

static void summary_free(summary *s) {
  free(s->slot_pos);
  free(s->lo);
  free(s->hi);
  free(s->slot);
  free(s->sign);
  free(s->alpha);
}

void ckv_cold_cache_free(ckv_cold_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n; i++) summary_free(&c->v[i]);
  free(c->v);
  free(c->row);
  free(c->rot);
  free(c);
}

/* The bytes one summary holds at geometry g (what summarise allocates). */
static size_t summary_bytes(const summary *s, const ckv_geometry *g) {
  const size_t heads = (size_t)g->n_layers * g->n_kv_heads, valid = s->n_valid ? s->n_valid : 1;
  const uint32_t words = s->sign ? ckv_cold_sketch_words(g->head_dim) : 0;
  size_t n = sizeof(summary) + (s->cap ? s->cap : 1) * sizeof(uint32_t);
  if (s->lo) n += 2u * heads * g->head_dim * sizeof(float);
  if (words) n += valid * (sizeof(uint32_t) + heads * (words * sizeof(uint64_t) + sizeof(float)));
  return n;
}

size_t ckv_cold_cache_bytes(const ckv_cold_cache *c, const ckv_geometry *g) {
  if (!c || !g) return 0;
  size_t n = sizeof(*c) + c->cap * sizeof(summary);
  for (size_t i = 0; i < c->n; i++) n += summary_bytes(&c->v[i], g) - sizeof(summary);
  return n;
}

static size_t find(const ckv_cold_cache *c, uint64_t id) {
  size_t lo = 0, hi = c->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c->v[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Reads block b's keys once: its slots and, where head_dim takes one, every
 * valid slot's sketch (arrays sized by the valid slots).  The key bounds are
 * left to bounds(): only ckv_cold_select reads them. */
static int summarise(ckv_cold_cache *c, const ckv_geometry *g, const ckv_block_view *b, summary *s) {
  const size_t per_layer = (size_t)g->n_kv_heads * g->head_dim;
  const uint32_t cap = ckv_cold_block_slots(b), d = g->head_dim;
  const uint32_t words = ckv_cold_code_scored(g, b) ? 0 : ckv_cold_sketch_words(d);
  const size_t heads = (size_t)g->n_layers * g->n_kv_heads;
  *s = (summary){.id = b->id, .cap = cap};
  s->slot_pos = malloc((cap ? cap : 1) * sizeof(uint32_t));
  if (!s->slot_pos) return -ENOMEM;
  const uint32_t *positions = ckv_block_positions_const(b->data);
  uint32_t valid = 0;
  for (uint32_t slot = 0; slot < cap; slot++) {
    s->slot_pos[slot] = ckv_block_slot_valid(b->data, slot) ? positions[slot] : UINT32_MAX;
    valid += s->slot_pos[slot] != UINT32_MAX;
  }
  if (words) {
    s->slot = malloc((valid ? valid : 1) * sizeof(uint32_t));
    s->sign = malloc((valid ? valid : 1) * heads * words * sizeof(uint64_t));
    s->alpha = malloc((valid ? valid : 1) * heads * sizeof(float));
    if (!s->slot || !s->sign || !s->alpha) {
      summary_free(s);
      return -ENOMEM;
    }
  }
  for (uint32_t slot = 0; slot < cap && !s->unknown; slot++) {
    if (s->slot_pos[slot] == UINT32_MAX) continue;
    const size_t at = s->n_valid++;
    if (words) s->slot[at] = slot;
    for (uint32_t l = 0; l < g->n_layers && !s->unknown; l++) {
      if (ckv_kernels_dequantize(g, b->data, l, 0, slot, c->row) != CKV_OK) {
        s->unknown = true; /* a header the worker's bytes broke, or an unsealed chunk: read it */
        break;
      }
      for (size_t i = 0; i < per_layer; i++)
        if (!isfinite(c->row[i])) {
          s->unknown = true;
          break;
        }
      for (uint32_t kv = 0; words && !s->unknown && kv < g->n_kv_heads; kv++) {
        size_t hk = (at * g->n_layers + l) * g->n_kv_heads + kv;
        ckv_cold_sketch_key(c->row + (size_t)kv * d, d, c->rot, s->sign + hk * words, &s->alpha[hk]);
      }
    }
  }
  return CKV_OK;
}

/* Quest's bound of a summarised block that is not unknown: per (layer, kv
 * head, channel) the minimum and maximum of its valid slots' keys. */
static int bounds(ckv_cold_cache *c, const ckv_geometry *g, const ckv_block_view *b, summary *s) {
  const size_t per_layer = (size_t)g->n_kv_heads * g->head_dim, all = per_layer * g->n_layers;
  s->lo = malloc(all * sizeof(float));
  s->hi = malloc(all * sizeof(float));
  if (!s->lo || !s->hi) {
    free(s->lo), free(s->hi);
    s->lo = s->hi = NULL;
    return -ENOMEM;
  }
  for (size_t i = 0; i < all; i++) {
    s->lo[i] = FLT_MAX;
    s->hi[i] = -FLT_MAX;
  }
  for (uint32_t slot = 0; slot < s->cap; slot++) {
    if (s->slot_pos[slot] == UINT32_MAX) continue;
    for (uint32_t l = 0; l < g->n_layers; l++) {
      if (ckv_kernels_dequantize(g, b->data, l, 0, slot, c->row) != CKV_OK) {
        s->unknown = true; /* read fine when summarised: the worker's bytes changed since */
        return CKV_OK;
      }
      float *lo = s->lo + l * per_layer, *hi = s->hi + l * per_layer;
      for (size_t i = 0; i < per_layer; i++) {
        float x = c->row[i];
        if (!isfinite(x)) {
          s->unknown = true;
          return CKV_OK;
        }
        lo[i] = x < lo[i] ? x : lo[i];
        hi[i] = x > hi[i] ? x : hi[i];
      }
    }
  }
  return CKV_OK;
}

/* Whether block b still holds the tokens it held when s was made: a token
 * recalled out of a cold block leaves its slot, and a slot may be filled
 * again; then the summary (bounds, sketches, slots) is made anew. */
static bool fresh(const summary *s, const ckv_block_view *b) {
  const uint32_t cap = ckv_cold_block_slots(b);
  if (cap != s->cap) return false;
  const uint32_t *positions = ckv_block_positions_const(b->data);
  for (uint32_t slot = 0; slot < cap; slot++)
    if ((ckv_block_slot_valid(b->data, slot) ? positions[slot] : UINT32_MAX) != s->slot_pos[slot]) return false;
  return true;
}

static int lookup(ckv_cold_cache *c, const ckv_geometry *g, const ckv_block_view *b, summary **ret) {
  size_t at = find(c, b->id);
  if (at < c->n && c->v[at].id == b->id) {
    if (!fresh(&c->v[at], b)) {
      summary s;
      int r = summarise(c, g, b, &s);
      if (r < 0) return r;
      summary_free(&c->v[at]);
      c->v[at] = s;
    }
    *ret = &c->v[at];
    return CKV_OK;
  }
  if (c->n == c->cap) {
    size_t ncap = c->cap ? 2 * c->cap : 64;
    summary *nv = realloc(c->v, ncap * sizeof(*nv));
    if (!nv) return -ENOMEM;
    c->v = nv;
    c->cap = ncap;
  }
  summary s;
  int r = summarise(c, g, b, &s);
  if (r < 0) return r;
  memmove(c->v + at + 1, c->v + at, (c->n - at) * sizeof(*c->v));
  c->v[at] = s;
  c->n++;
  *ret = &c->v[at];
  return CKV_OK;
}

/* Forgets the summaries of blocks no longer cold in v (recalled or freed). */
static void prune(ckv_cold_cache *c, const ckv_view *v) {
  if (c->n <= 2 * v->n_cold + 64) return;
  c->prunes++; /* each cold block of the view marks its summary: n_cold binary searches */
  for (size_t k = 0; k < v->n_cold; k++) {
    size_t at = find(c, v->cold[k].id);
    if (at < c->n && c->v[at].id == v->cold[k].id) c->v[at].seen = c->prunes;
  }
  size_t keep = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (c->v[i].seen == c->prunes) c->v[keep++] = c->v[i];
    else summary_free(&c->v[i]);
  }
  c->n = keep;
}

/* Creates the cache on first use and sizes its scratch for g. */
static int cache_ready(ckv_cold_cache **cache, const ckv_geometry *g) {
  if (!*cache && !(*cache = calloc(1, sizeof(**cache)))) return -ENOMEM;
  ckv_cold_cache *c = *cache;
  const size_t per_layer = (size_t)g->n_kv_heads * g->head_dim;
  if (c->row_len < per_layer) {
    float *nr = realloc(c->row, per_layer * sizeof(float));
    if (!nr) return -ENOMEM;
    c->row = nr;
    c->row_len = per_layer;
  }
  if (c->rot_len < g->head_dim) {
    float *nr = realloc(c->rot, g->head_dim * sizeof(float));
    if (!nr) return -ENOMEM;
    c->rot = nr;
    c->rot_len = g->head_dim;
  }
  return CKV_OK;
}

int ckv_cold_cache_forget(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v) {
  if (!cache || !g || !v) return CKV_ERR_INVALID;
  int e = cache_ready(cache, g);
  if (e < 0) return e;
  prune(*cache, v);
  return CKV_OK;
}

int ckv_cold_cache_summary(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v, size_t i,
                           ckv_cold_summary *ret) {
  if (!cache || !g || !v || i >= v->n_cold || !ret) return CKV_ERR_INVALID;
  int e = cache_ready(cache, g);
  if (e < 0) return e;
  ckv_cold_cache *c = *cache;
  if (i == 0) prune(c, v);
  summary *s;
  if ((e = lookup(c, g, &v->cold[i], &s)) < 0) return e;
  *ret = (ckv_cold_summary){.n_valid = s->n_valid, .unknown = s->unknown, .slot = s->slot, .sign = s->sign,
                            .alpha = s->alpha};
  return CKV_OK;
}

float ckv_cold_head_score(const float *qh, const float *k, uint32_t d, float scale) {
  float dot = 0.f;
  for (uint32_t x = 0; x < d; x++) dot += qh[x] * k[x];
  return dot * scale;
}

/* The best exact score per query head over the view's draft blocks (FP16:
 * the sinks and the recent window, which attention always reads). */
static void draft_scores(ckv_cold_cache *c, const ckv_geometry *g, const ckv_view *v, uint32_t layer, const float *q,
                         uint32_t n_q_heads, float scale, float *best) {
  const uint32_t group = n_q_heads / g->n_kv_heads, d = g->head_dim;
  for (uint32_t h = 0; h < n_q_heads; h++) best[h] = -INFINITY;
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *b = &v->draft[i];
    const uint32_t cap = ckv_cold_block_slots(b);
    for (uint32_t slot = 0; slot < cap; slot++) {
      if (!ckv_block_slot_valid(b->data, slot) || ckv_kernels_dequantize(g, b->data, layer, 0, slot, c->row) != CKV_OK)
        continue;
      for (uint32_t h = 0; h < n_q_heads; h++) {
        float dot = ckv_cold_head_score(q + (size_t)h * d, c->row + (size_t)(h / group) * d, d, scale);
        if (isfinite(dot) && dot > best[h]) best[h] = dot;
      }
    }
  }
}

typedef struct ranked {
  float margin; /* how far the block's bound passes the bar, the most over the query heads */
  uint32_t idx;
} ranked;

static int by_margin_desc(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->margin != y->margin) return x->margin > y->margin ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int by_idx(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

int ckv_cold_select(ckv_cold_cache **cache, const ckv_geometry *g, const ckv_view *v, uint32_t layer, const float *q,
                    uint32_t n_q_heads, float scale, float min_weight, size_t max_blocks, uint32_t *ret_idx,
                    size_t *ret_n) {
  if (!cache || !g || !v || !q || !ret_n || (v->n_cold && !ret_idx) || layer >= g->n_layers || !g->n_kv_heads ||
      !n_q_heads || n_q_heads % g->n_kv_heads || !(min_weight > 0.f))
    return CKV_ERR_INVALID;
  *ret_n = 0;
  if (!v->n_cold) return CKV_OK;
  int e = cache_ready(cache, g);
  if (e < 0) return e;
  ckv_cold_cache *c = *cache;
  const size_t per_layer = (size_t)g->n_kv_heads * g->head_dim;
  if (!(scale > 0.f)) scale = 1.f / sqrtf((float)g->head_dim);
  float *best = malloc(n_q_heads * sizeof(float));
  ranked *rank = max_blocks ? malloc(v->n_cold * sizeof(*rank)) : NULL;
  if (!best || (max_blocks && !rank)) {
    free(best);
    free(rank);
    return -ENOMEM;
  }
  draft_scores(c, g, v, layer, q, n_q_heads, scale, best);
  prune(c, v);
  const uint32_t group = n_q_heads / g->n_kv_heads, d = g->head_dim;
  const float log_w = logf(min_weight);
  int r = CKV_OK;
  for (size_t i = 0; i < v->n_cold && r == CKV_OK; i++) {
    summary *s;
    if ((r = lookup(c, g, &v->cold[i], &s)) < 0) break;
    if (!s->n_valid) continue;
    if (!s->unknown && !s->lo && (r = bounds(c, g, &v->cold[i], s)) < 0) break;
    bool need = s->unknown;
    float margin = need ? INFINITY : -INFINITY;
    for (uint32_t h = 0; h < n_q_heads && (!need || rank); h++) {
      const float *lo = s->lo + layer * per_layer + (size_t)(h / group) * d,
                  *hi = s->hi + layer * per_layer + (size_t)(h / group) * d, *qh = q + (size_t)h * d;
      float ub = 0.f;
      for (uint32_t x = 0; x < d; x++) ub += qh[x] >= 0.f ? qh[x] * hi[x] : qh[x] * lo[x];
      ub = ub * scale + logf((float)s->n_valid);
      /* no exact score to compare with (no draft block): read it */
      bool head_needs = !isfinite(best[h]) || !isfinite(ub) || ub >= best[h] + log_w;
      need |= head_needs;
      if (head_needs) {
        float m = isfinite(best[h]) && isfinite(ub) ? ub - best[h] : isfinite(ub) ? ub : INFINITY;
        if (m > margin) margin = m;
      }
    }
    if (!need) continue;
    if (rank) rank[*ret_n] = (ranked){margin, (uint32_t)i};
    ret_idx[(*ret_n)++] = (uint32_t)i;
  }
  if (r == CKV_OK && rank && *ret_n > max_blocks) { /* the blocks whose bounds pass the bar the most */
    qsort(rank, *ret_n, sizeof(*rank), by_margin_desc);
    *ret_n = max_blocks;
    for (size_t k = 0; k < max_blocks; k++) ret_idx[k] = rank[k].idx;
    qsort(ret_idx, max_blocks, sizeof(*ret_idx), by_idx);
  }
  free(rank);
  free(best);
  return r;
}
