/* quant_plain.c - the baseline quantize_int8 is measured against: draft FP16
 * rows to INT8 with an FP16 scale per group, as a user would write it in
 * plain C (widen with F16C, absmax, scale, round; the loops vectorised by the
 * compiler).  Built with -O3 -mavx2 -mfma -mf16c -ffast-math (bench/CMakeLists.txt):
 * call it only where ckv_bench_quant_plain_supported().  Its scale rounding
 * is plain round-to-nearest, not quant.h's round-up: it is a speed
 * reference, not a format writer. */
#include "bench/quant_plain.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

bool ckv_bench_quant_plain_supported(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

int ckv_bench_plain_quantize_int8(const ckv_geometry *g, void *const *blocks, size_t n_blocks, int8_t *codes,
                                  uint16_t *scales) {
  size_t te = ckv_draft_token_elems(g), gl = (size_t)ckv_staged_group_heads(g) * g->head_dim;
  float *x = malloc(te * sizeof(float));
  if (!x) return -1;
  for (size_t b = 0; b < n_blocks; b++) {
    uint32_t cap = ((const ckv_block_header *)blocks[b])->capacity;
    for (uint32_t l = 0; l < g->n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t t = 0; t < cap; t++, codes += te) {
          const uint16_t *h = (const uint16_t *)((const uint8_t *)blocks[b] + ckv_draft_kv_offset(g, cap, l, kv, t));
          for (size_t i = 0; i < te; i += 8) _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
          for (size_t lo = 0; lo < te; lo += gl) {
            size_t n = te - lo < gl ? te - lo : gl;
            float amax = 0.0f;
            for (size_t i = 0; i < n; i++) amax = fabsf(x[lo + i]) > amax ? fabsf(x[lo + i]) : amax;
            float scale = amax / 127.0f, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
            *scales++ = _cvtss_sh(scale, 0);
            for (size_t i = 0; i < n; i++) codes[lo + i] = (int8_t)rintf(x[lo + i] * inv);
          }
        }
  }
  free(x);
  return 0;
}
