/* kernels_fixture.h - helpers for the kernels test suites (test_kernels*.c):
 * a deterministic random source, allocating and initialising blocks, writing
 * FP32 test data into draft slots, and comparing vectors.  Header-only so
 * every suite stays a single .c file. */
#ifndef CKV_KERNELS_FIXTURE_H
#define CKV_KERNELS_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"

typedef struct kf_rng {
  uint64_t s;
} kf_rng;

static inline uint64_t kf_next(kf_rng *r) {
  r->s ^= r->s << 13;
  r->s ^= r->s >> 7;
  r->s ^= r->s << 17;
  return r->s;
}
/* Uniform in [-1, 1). */
static inline float kf_uniform(kf_rng *r) { return (float)((kf_next(r) >> 40) * (1.0 / 8388608.0)) - 1.0f; }
/* Roughly normal (sum of 4 uniforms, unit variance). */
static inline float kf_normal(kf_rng *r) {
  return (kf_uniform(r) + kf_uniform(r) + kf_uniform(r) + kf_uniform(r)) * 0.8660254f;
}

static inline uint16_t kf_to_bf16(float f) { return (uint16_t)(ckv_f32_bits(f) >> 16); /* truncation is fine for tests */ }

/* A zeroed, initialised block; free with free(). */
static inline void *kf_block(uint32_t fmt, const ckv_geometry *g, uint32_t cap, uint32_t kept) {
  size_t n = ckv_format_block_bytes(fmt, g, cap, kept);
  if (!n) return NULL;
  void *b = aligned_alloc(64, n);
  if (!b) return NULL;
  memset(b, 0, n);
  if (ckv_block_init(b, fmt, g, cap, kept, 1) != CKV_OK) {
    free(b);
    return NULL;
  }
  return b;
}

/* Writes K (kv=0) or V of one layer and slot of a draft block from FP32. */
static inline void kf_put(const ckv_geometry *g, void *blk, uint32_t layer, uint32_t kv, uint32_t slot, const float *x) {
  uint32_t cap = ((ckv_block_header *)blk)->capacity;
  uint16_t *d = (uint16_t *)((uint8_t *)blk + ckv_draft_kv_offset(g, cap, layer, kv, slot));
  for (size_t i = 0; i < ckv_draft_token_elems(g); i++)
    d[i] = g->dtype == CKV_DTYPE_BF16 ? kf_to_bf16(x[i]) : ckv_f32_to_f16(x[i]);
}

/* Fills every slot of a draft block with generator values (all layers, K and V),
 * positions pos0.., and marks them valid. gen(rng, layer, kv, elem) */
typedef float (*kf_gen)(kf_rng *r, uint32_t layer, uint32_t kv, uint32_t elem, void *ctx);
static inline void kf_fill_draft(const ckv_geometry *g, void *blk, kf_rng *r, kf_gen gen, void *ctx, uint32_t pos0) {
  uint32_t cap = ((ckv_block_header *)blk)->capacity;
  size_t te = ckv_draft_token_elems(g);
  float *x = malloc(te * sizeof(float));
  for (uint32_t s = 0; s < cap; s++) {
    for (uint32_t l = 0; l < g->n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        for (size_t e = 0; e < te; e++) x[e] = gen ? gen(r, l, kv, (uint32_t)e, ctx) : kf_normal(r);
        kf_put(g, blk, l, kv, s, x);
      }
    ckv_block_positions(blk)[s] = pos0 + s;
    ckv_block_set_valid(blk, s, true);
  }
  free(x);
}

static inline double kf_cosine(const float *a, const float *b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; i++) {
    ab += (double)a[i] * b[i];
    aa += (double)a[i] * a[i];
    bb += (double)b[i] * b[i];
  }
  return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

/* max |a-b| / max(|b|, floor) over all elements. */
static inline double kf_max_rel(const float *a, const float *b, size_t n, double floor) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor);
    if (d > m) m = d;
  }
  return m;
}

/* |a - b| / |b| over all elements (L2 norms; |a - b| alone when b is all zero). */
static inline double kf_rel_l2(const float *a, const float *b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    s += (double)b[i] * b[i];
  }
  return s > 0 ? sqrt(d / s) : sqrt(d);
}

#endif
