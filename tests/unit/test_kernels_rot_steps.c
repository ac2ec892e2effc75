/* test_kernels_rot_steps.c - the rotated formats' hot steps (kernels/rot.h)
 * called directly, each SIMD version this CPU can run against the scalar rule
 * byte for byte: the heads of one row rotated (ckv_rot_forward_with) and
 * quantized (ckv_rot_quant_heads) by the AVX2 and AVX-512 steps, and by the
 * AVX-512 fused steps (FP16 heads rotated and quantized in registers; keys
 * less their block's means).  Rows of 1 to 17 heads (whole groups and
 * remainders), head_dim 16 to 128, every bit width, heads of Gaussians, with
 * outliers, of zeros, constant, tiny (subnormal scales) and huge, and FP16
 * rows holding NaN and +-Inf.  A path this CPU lacks is reported skipped. */
#include <criterion/criterion.h>
#include <float.h>
#include <stdio.h>

#include "kernels/rot.h"
#include "kernels_fixture.h"

/* Element i of head hd in row kind `kind`. */
static float head_elem(kf_rng *r, uint32_t kind, uint32_t hd, uint32_t i) {
  switch ((kind + hd) % 7) {
    case 0: return kf_normal(r);
    case 1: return i == 3 ? 400.0f : kf_normal(r) * 0.5f; /* one outlier */
    case 2: return 0.0f;                               /* a head of zeros: scale code 0 */
    case 3: return 7.25f;                              /* constant */
    case 4: return kf_normal(r) * 3e-6f;               /* tiny: FP16 subnormals */
    case 5: return kf_normal(r) * 20000.0f;            /* huge */
    default: return kf_normal(r) + (i % 16 == 5 ? 30.0f : 0.0f);
  }
}

/* The scalar rule's bytes for FP32 heads y[nh][n]: scales then rows. */
static void scalar_quant(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *sc, uint8_t *rows) {
  ckv_rot_quant_heads(y, nh, n, bits, sc, rows);
}

Test(rot_steps, simd_quant_heads_equal_scalar) {
  static const uint32_t dims[] = {16, 32, 64, 128}, heads[] = {1, 3, 4, 8, 9, 17};
  bool avx2 = ckv_kernels_path_supported(CKV_PATH_AVX2), avx512 = ckv_kernels_path_supported(CKV_PATH_AVX512);
  if (!avx2) fprintf(stderr, "rot_steps: AVX2 not on this CPU: SKIPPED\n");
  if (!avx512) fprintf(stderr, "rot_steps: AVX-512 not on this CPU: SKIPPED\n");
  if (!avx2 && !avx512) cr_skip_test("no SIMD path on this CPU");
  int compared = 0;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
      for (uint32_t bits = 1; bits <= 4; bits++)
        for (uint32_t kind = 0; kind < 3; kind++) {
          uint32_t n = dims[di], nh = heads[hi];
          size_t te = (size_t)nh * n, rb = (size_t)n * bits / 8u;
          kf_rng r = {0x1234 + di * 131 + hi * 17 + bits * 5 + kind};
          float *y = malloc(te * sizeof(float)), *mean = malloc(te * sizeof(float)), *less = malloc(te * sizeof(float));
          float *signs = malloc(te * sizeof(float));
          uint16_t *h = malloc(te * sizeof(uint16_t));
          uint8_t *ref_rows = malloc(te), *rows = malloc(te), ref_sc[32], sc[32];
          for (uint32_t hd = 0; hd < nh; hd++)
            for (uint32_t i = 0; i < n; i++) {
              size_t e = (size_t)hd * n + i;
              y[e] = head_elem(&r, kind, hd, i);
              mean[e] = kind == 1 ? kf_normal(&r) * 4.0f : 0.0f;
              signs[e] = ckv_rot_sign(1, 0, hd, i);
              h[e] = ckv_f32_to_f16(y[e]);
            }
          if (kind == 2) { /* non-finite FP16 in a few heads: NaN -> 0, +-Inf -> +-65504 */
            h[1] = 0x7e00u;
            if (nh > 1) h[n + 2] = 0x7c00u;
            if (nh > 2) h[2 * n + 5] = 0xfc00u;
          }
          /* FP32 heads: as they are, and less the means */
          for (size_t e = 0; e < te; e++) less[e] = y[e] - mean[e];
          scalar_quant(y, nh, n, bits, ref_sc, ref_rows);
          if (avx2) {
            ckv_rot_quant_heads_avx2(y, nh, n, bits, sc, rows);
            cr_expect(!memcmp(sc, ref_sc, nh) && !memcmp(rows, ref_rows, nh * rb), "avx2 quant n %u nh %u bits %u kind %u",
                      n, nh, bits, kind);
            compared++;
          }
          if (avx512) {
            ckv_rot_quant_heads_avx512(y, nh, n, bits, sc, rows);
            cr_expect(!memcmp(sc, ref_sc, nh) && !memcmp(rows, ref_rows, nh * rb),
                      "avx512 quant n %u nh %u bits %u kind %u", n, nh, bits, kind);
            memset(rows, 0xa5, nh * rb);
            ckv_rot_quant_less_heads_avx512(y, mean, nh, n, bits, sc, rows);
            scalar_quant(less, nh, n, bits, ref_sc, ref_rows);
            cr_expect(!memcmp(sc, ref_sc, nh) && !memcmp(rows, ref_rows, nh * rb),
                      "avx512 fused less-mean n %u nh %u bits %u kind %u", n, nh, bits, kind);
            compared += 2;
          }
          /* FP16 heads rotated, then quantized: the scalar rule against the fused step */
          for (size_t e = 0; e < te; e++) y[e] = ckv_f16_to_f32(h[e]);
          for (uint32_t hd = 0; hd < nh; hd++) ckv_rot_forward_with(y + (size_t)hd * n, n, signs + (size_t)hd * n);
          scalar_quant(y, nh, n, bits, ref_sc, ref_rows);
          if (avx512) {
            memset(rows, 0x5a, nh * rb);
            ckv_rot_quant_f16_heads_avx512(h, signs, nh, n, bits, sc, rows);
            cr_expect(!memcmp(sc, ref_sc, nh) && !memcmp(rows, ref_rows, nh * rb),
                      "avx512 fused f16 n %u nh %u bits %u kind %u", n, nh, bits, kind);
            compared++;
          }
          free(y);
          free(mean);
          free(less);
          free(signs);
          free(h);
          free(ref_rows);
          free(rows);
        }
  fprintf(stderr, "rot_steps: %d comparisons against the scalar rule\n", compared);
}

/* The table of signs the quantizers read (ckv_rot_signs_new, 16 at a time on the AVX-512 path) holds
 * ckv_rot_sign of every (layer, K|V, head, element) on every path this CPU runs. */
Test(rot_steps, signs_table_equals_the_rule) {
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  static const uint32_t dims[] = {8, 16, 64, 128, 512};
  int compared = 0;
  for (size_t p = 0; p < 3; p++) {
    if (ckv_kernels_force(paths[p]) != CKV_OK) {
      fprintf(stderr, "rot_steps signs: path %s not on this CPU: SKIPPED\n", ckv_kernels_path_name(paths[p]));
      continue;
    }
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
      ckv_geometry g = {.n_layers = 3, .n_kv_heads = 5, .head_dim = dims[di], .dtype = CKV_DTYPE_FP16};
      float *s = ckv_rot_signs_new(&g);
      cr_assert(s);
      for (uint32_t l = 0; l < g.n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
          for (uint32_t h = 0; h < g.n_kv_heads; h++)
            for (uint32_t i = 0; i < g.head_dim; i++) {
              float want = ckv_rot_sign(l, kv, h, i), got = s[ckv_rot_signs_index(&g, l, kv, h) + i];
              if (ckv_f32_bits(got) != ckv_f32_bits(want))
                cr_assert(0, "path %s D %u: sign of (%u, %u, %u, %u) is %g, the rule's %g", ckv_kernels_path_name(paths[p]),
                          g.head_dim, l, kv, h, i, got, want);
            }
      free(s);
      compared++;
    }
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  cr_expect(compared > 0);
}

/* A block's key means (ckv_rot_mean_f16, then read back finite) 16 at a time on the AVX-512 path, against the
 * rule element by element: sums of 1 to 64 tokens, normal, huge (past FP16's range), tiny (FP16 subnormal
 * means, ties of the rounding), NaN and +-Inf. */
Test(rot_steps, means_equal_the_rule) {
  if (!ckv_kernels_path_supported(CKV_PATH_AVX512)) cr_skip_test("AVX-512 not on this CPU");
  enum { N = 256 };
  kf_rng r = {0x3ea5};
  float sum[N], wide[N];
  uint16_t mean[N];
  int compared = 0;
  for (uint32_t tokens = 1; tokens <= 64; tokens = tokens * 3 + 1) {
    for (uint32_t i = 0; i < N; i++) {
      switch (i % 8) {
        case 0: sum[i] = kf_normal(&r) * (float)tokens; break;
        case 1: sum[i] = kf_normal(&r) * 1e6f * (float)tokens; break;
        case 2: sum[i] = kf_normal(&r) * 3e-6f * (float)tokens; break;
        case 3: sum[i] = ckv_f16_to_f32((uint16_t)(kf_next(&r) & 0x03ffu)) * (float)tokens; break; /* subnormal means */
        case 4: sum[i] = (float)(kf_next(&r) % 2048) * 0x1p-25f * (float)tokens; break;           /* rounding ties */
        case 5: sum[i] = i % 16 == 5 ? NAN : kf_normal(&r); break;
        case 6: sum[i] = i % 32 == 6 ? INFINITY : -INFINITY; break;
        default: sum[i] = 65504.0f * (float)tokens + (float)(i % 3) * 16.0f * (float)tokens; break;
      }
    }
    ckv_rot_means_avx512(sum, tokens, N, mean, wide);
    for (uint32_t i = 0; i < N; i++) {
      uint16_t want = ckv_rot_mean_f16(sum[i], tokens);
      float want_wide = ckv_rot_finite(ckv_f16_to_f32(want));
      cr_assert_eq(mean[i], want, "tokens %u, sum %a: mean %#x, the rule's %#x", tokens, sum[i], mean[i], want);
      cr_assert_eq(ckv_f32_bits(wide[i]), ckv_f32_bits(want_wide), "tokens %u, element %u read back", tokens, i);
      compared++;
    }
  }
  fprintf(stderr, "rot_steps means: %d elements against the rule\n", compared);
}

/* A fresh block's keys on the AVX-512 path: each FP16 head rotated as if finite and added to the means' sums
 * gives the scalar rotation's floats and sums (finite heads), and a head holding NaN or +-Inf leaves its sums
 * non-finite (rot.c then rotates the layer again with ckv_rot_finite). */
Test(rot_steps, keys_rotated_and_summed_equal_the_rule) {
  if (!ckv_kernels_path_supported(CKV_PATH_AVX512)) cr_skip_test("AVX-512 not on this CPU");
  static const uint32_t dims[] = {16, 32, 64, 128};
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    enum { NH = 5 };
    uint32_t n = dims[di];
    size_t te = (size_t)NH * n;
    kf_rng r = {0x5u + di};
    float *signs = malloc(te * sizeof(float)), *y = malloc(te * sizeof(float)), *sum = malloc(te * sizeof(float));
    float *ref = malloc(te * sizeof(float)), *ref_sum = malloc(te * sizeof(float));
    uint16_t *h = malloc(te * sizeof(uint16_t));
    for (size_t e = 0; e < te; e++) {
      signs[e] = ckv_rot_sign(2, 0, (uint32_t)(e / n), (uint32_t)(e % n));
      ref_sum[e] = sum[e] = kf_normal(&r) * 10.0f;
    }
    for (int token = 0; token < 3; token++) {
      for (size_t e = 0; e < te; e++) {
        h[e] = ckv_f32_to_f16(head_elem(&r, (uint32_t)token, (uint32_t)(e / n), (uint32_t)(e % n)));
        ref[e] = ckv_f16_to_f32(h[e]);
      }
      if (token == 2) h[3 * n + 1] = 0x7c00u, h[4 * n] = 0xfe00u; /* +Inf in head 3, NaN in head 4 */
      for (uint32_t hd = 0; hd < NH; hd++) ckv_rot_forward_with(ref + (size_t)hd * n, n, signs + (size_t)hd * n);
      ckv_rot_forward_f16_sum_avx512(h, signs, NH, n, y, sum);
      for (size_t e = 0; e < te; e++) {
        ref_sum[e] = ref_sum[e] + ref[e];
        if (token == 2 && e >= 3 * n) { /* the non-finite heads: every sum non-finite */
          cr_assert(!(fabsf(sum[e]) <= FLT_MAX), "n %u element %zu: sum %g stays finite after a NaN or Inf", n, e, sum[e]);
          continue;
        }
        cr_assert_eq(ckv_f32_bits(y[e]), ckv_f32_bits(ref[e]), "n %u token %d element %zu: %a, the rule's %a", n, token, e, y[e], ref[e]);
        cr_assert_eq(ckv_f32_bits(sum[e]), ckv_f32_bits(ref_sum[e]), "n %u token %d element %zu: sum", n, token, e);
      }
    }
    free(signs), free(y), free(sum), free(ref), free(ref_sum), free(h);
  }
}
