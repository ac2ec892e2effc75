/* attention_ref.c - the attention oracle: every valid slot is dequantized to
 * FP32 with ckv_kernels_dequantize, then a plain two-pass softmax in double
 * precision gives the output and the per-slot mass.  Deliberately simple and
 * slow; the fused kernels (CPU paths and CUDA) are tested against it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

ckv_status ckv_kernels_attention_reference(const ckv_attn_args *a) {
  if (!a || !a->geom || !a->q || !a->out || (!a->blocks && a->n_blocks)) return CKV_ERR_INVALID;
  const ckv_geometry *g = a->geom;
  if (a->layer >= g->n_layers) return CKV_ERR_RANGE;
  if (a->n_rows == 0 || a->n_q_heads == 0 || a->n_q_heads % g->n_kv_heads) return CKV_ERR_INVALID;
  size_t te = (size_t)g->n_kv_heads * g->head_dim, slots = 0, D = g->head_dim;
  for (uint32_t b = 0; b < a->n_blocks; b++) {
    ckv_status st = ckv_block_check(a->blocks[b], g);
    if (st != CKV_OK) return st;
    slots += ((const ckv_block_header *)a->blocks[b])->capacity;
  }
  float *K = calloc(slots * te + 1, sizeof(float)), *V = calloc(slots * te + 1, sizeof(float));
  unsigned char *valid = calloc(slots + 1, 1);
  double *p = calloc(slots + 1, sizeof(double));
  if (!K || !V || !valid || !p) {
    free(K), free(V), free(valid), free(p);
    return (ckv_status)-12;
  }
  size_t base = 0;
  for (uint32_t b = 0; b < a->n_blocks; b++) {
    const void *blk = a->blocks[b];
    uint32_t cap = ((const ckv_block_header *)blk)->capacity;
    for (uint32_t t = 0; t < cap; t++) {
      if (!ckv_block_slot_valid(blk, t)) continue;
      if (ckv_kernels_dequantize(g, blk, a->layer, 0, t, K + (base + t) * te) != CKV_OK) continue; /* unsealed */
      ckv_kernels_dequantize(g, blk, a->layer, 1, t, V + (base + t) * te);
      valid[base + t] = 1;
    }
    base += cap;
  }
  double scale = a->scale != 0.0f ? a->scale : 1.0 / sqrt((double)D);
  uint32_t G = a->n_q_heads / g->n_kv_heads;
  if (a->mass) memset(a->mass, 0, slots * sizeof(float));
  for (uint32_t r = 0; r < a->n_rows; r++)
    for (uint32_t qh = 0; qh < a->n_q_heads; qh++) {
      const float *q = a->q + ((size_t)r * a->n_q_heads + qh) * D;
      float *o = a->out + ((size_t)r * a->n_q_heads + qh) * D;
      size_t h = qh / G;
      double m = -INFINITY, l = 0.0;
      for (size_t t = 0; t < slots; t++) {
        if (!valid[t]) continue;
        double s = 0.0;
        for (size_t d = 0; d < D; d++) s += (double)q[d] * K[t * te + h * D + d];
        p[t] = s * scale;
        m = fmax(m, p[t]);
      }
      for (size_t t = 0; t < slots; t++)
        if (valid[t]) {
          p[t] = exp(p[t] - m);
          l += p[t];
        }
      for (size_t d = 0; d < D; d++) {
        double acc = 0.0;
        for (size_t t = 0; t < slots; t++)
          if (valid[t]) acc += p[t] * V[t * te + h * D + d];
        o[d] = l > 0.0 ? (float)(acc / l) : 0.0f;
      }
      if (a->mass && l > 0.0)
        for (size_t t = 0; t < slots; t++)
          if (valid[t]) a->mass[t] += (float)(p[t] / l);
    }
  free(K), free(V), free(valid), free(p);
  return CKV_OK;
}
