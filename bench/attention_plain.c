/* attention_plain.c - the baseline the attention figures are measured
 * against: FP16 decode attention over draft blocks as a user would write it
 * in plain C (two passes per KV head: scores with a running max, then
 * softmax weights and the value sum; one thread; each K/V row widened once
 * with F16C, the loops vectorised by the compiler).  Built with -O3 -mavx2
 * -mfma -mf16c -ffast-math (see bench/CMakeLists.txt), as a user tuning it
 * would: call it only where ckv_bench_plain_supported(). */
#include "bench/attention_plain.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/format.h"

bool ckv_bench_plain_supported(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* One row of halves to floats, 8 at a time (head_dim is a multiple of 8 here). */
static void widen(const uint16_t *h, float *f, uint32_t n) {
  for (uint32_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}

static bool slot_valid(const uint8_t *blk, uint32_t cap, uint32_t t) {
  const uint64_t *bits = (const uint64_t *)(blk + ckv_block_bitmap_offset(cap));
  return (bits[t / 64] >> (t % 64)) & 1u;
}

int ckv_bench_plain_attention(const ckv_geometry *g, const void *const *blocks, uint32_t n_blocks, uint32_t n_q_heads,
                              const float *q, float *out) {
  uint32_t H = g->n_kv_heads, D = g->head_dim, G = n_q_heads / H;
  size_t slots = 0;
  for (uint32_t b = 0; b < n_blocks; b++) slots += ((const ckv_block_header *)blocks[b])->capacity;
  float *s = malloc(slots * G * sizeof(float));
  if (!s) return -1;
  const float scale = 1.0f / sqrtf((float)D);
  float row[CKV_MAX_HEAD_DIM];
  for (uint32_t h = 0; h < H; h++) {
    float m[64], l[64];
    for (uint32_t k = 0; k < G; k++) m[k] = -INFINITY, l[k] = 0.0f;
    size_t n = 0;
    for (uint32_t b = 0; b < n_blocks; b++) { /* pass 1: scores */
      const uint8_t *blk = blocks[b];
      uint32_t cap = ((const ckv_block_header *)blk)->capacity;
      for (uint32_t t = 0; t < cap; t++, n++) {
        if (!slot_valid(blk, cap, t)) {
          for (uint32_t k = 0; k < G; k++) s[n * G + k] = -INFINITY;
          continue;
        }
        widen((const uint16_t *)(blk + ckv_draft_kv_offset(g, cap, 0, 0, t)) + (size_t)h * D, row, D);
        for (uint32_t k = 0; k < G; k++) {
          const float *qh = q + ((size_t)h * G + k) * D;
          float dot = 0.0f;
          for (uint32_t d = 0; d < D; d++) dot += qh[d] * row[d];
          s[n * G + k] = dot * scale;
          if (s[n * G + k] > m[k]) m[k] = s[n * G + k];
        }
      }
    }
    for (uint32_t k = 0; k < G; k++)
      for (uint32_t d = 0; d < D; d++) out[((size_t)h * G + k) * D + d] = 0.0f;
    n = 0;
    for (uint32_t b = 0; b < n_blocks; b++) { /* pass 2: weights and values */
      const uint8_t *blk = blocks[b];
      uint32_t cap = ((const ckv_block_header *)blk)->capacity;
      for (uint32_t t = 0; t < cap; t++, n++) {
        if (s[n * G] == -INFINITY) continue;
        widen((const uint16_t *)(blk + ckv_draft_kv_offset(g, cap, 0, 1, t)) + (size_t)h * D, row, D);
        for (uint32_t k = 0; k < G; k++) {
          float p = expf(s[n * G + k] - m[k]);
          l[k] += p;
          float *o = out + ((size_t)h * G + k) * D;
          for (uint32_t d = 0; d < D; d++) o[d] += p * row[d];
        }
      }
    }
    for (uint32_t k = 0; k < G; k++) {
      float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
      for (uint32_t d = 0; d < D; d++) out[((size_t)h * G + k) * D + d] *= inv;
    }
  }
  free(s);
  return 0;
}
