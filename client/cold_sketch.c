/* cold_sketch.c - the one-bit key sketch (see cold_sketch.h). */
#include "client/cold_sketch.h"

#include <math.h>
#include <string.h>

uint32_t ckv_cold_sketch_words(uint32_t d) {
  if (d < 8 || d > CKV_COLD_SKETCH_MAX_DIM || (d & (d - 1))) return 0;
  return (d + 63) / 64;
}

/* In-place orthonormal Walsh-Hadamard transform of x[0..n), n a power of two. */
static void wht(float *x, uint32_t n) {
  for (uint32_t h = 1; h < n; h *= 2)
    for (uint32_t i = 0; i < n; i += 2 * h)
      for (uint32_t j = i; j < i + h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = 1.f / sqrtf((float)n);
  for (uint32_t i = 0; i < n; i++) x[i] *= s;
}

void ckv_cold_sketch_key(const float *k, uint32_t d, float *scratch, uint64_t *ret_sign, float *ret_alpha) {
  memcpy(scratch, k, d * sizeof(float));
  wht(scratch, d);
  memset(ret_sign, 0, ckv_cold_sketch_words(d) * sizeof(uint64_t));
  float sum = 0.f;
  for (uint32_t c = 0; c < d; c++) {
    sum += fabsf(scratch[c]);
    if (scratch[c] >= 0.f) ret_sign[c / 64] |= 1ull << (c % 64);
  }
  *ret_alpha = sum / (float)d;
}

size_t ckv_cold_sketch_table_len(uint32_t n_q_heads, uint32_t d) { return (size_t)n_q_heads * (d / 8) * 256; }

void ckv_cold_sketch_tables(const float *q, uint32_t n_q_heads, uint32_t d, float scale, float *scratch,
                            float *ret_tables, float *ret_total) {
  const uint32_t bytes = d / 8;
  for (uint32_t h = 0; h < n_q_heads; h++) {
    memcpy(scratch, q + (size_t)h * d, d * sizeof(float));
    wht(scratch, d);
    float *t = ret_tables + (size_t)h * bytes * 256, sum = 0.f;
    for (uint32_t j = 0; j < bytes; j++) {
      float *tj = t + (size_t)j * 256;
      tj[0] = 0.f;
      for (uint32_t v = 1; v < 256; v++) /* v less its lowest set bit, plus that bit's element */
        tj[v] = tj[v & (v - 1)] + scratch[8 * j + (uint32_t)__builtin_ctz(v)] * scale;
      for (uint32_t c = 0; c < 8; c++) sum += scratch[8 * j + c] * scale;
    }
    ret_total[h] = sum;
  }
}

float ckv_cold_sketch_score(const float *table, float total, const uint64_t *sign, float alpha, uint32_t d) {
  const uint32_t bytes = d / 8;
  float pos = 0.f; /* the sum over the positive signs; the negative ones sum to total - pos */
  for (uint32_t j = 0; j < bytes; j++) pos += table[(size_t)j * 256 + ((sign[j / 8] >> (8 * (j % 8))) & 0xffu)];
  return alpha * (2.f * pos - total);
}
