/* test_cold_sketch.c - the one-bit key sketch cold_gather.c ranks cold tokens
 * with (client/cold_sketch.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cold_sketch.h"

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;
static float gauss(void) {
  float u = 0.f;
  for (int i = 0; i < 12; i++) {
    rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
    u += (float)(rnd_state >> 40) / (float)(1ull << 24);
  }
  return u - 6.f;
}

/* The orthonormal Walsh-Hadamard transform, written out (its own inverse). */
static void wht_ref(float *x, uint32_t n) {
  float *y = malloc(n * sizeof(float));
  for (uint32_t i = 0; i < n; i++) {
    double s = 0;
    for (uint32_t j = 0; j < n; j++) s += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * x[j];
    y[i] = (float)(s / sqrt((double)n));
  }
  memcpy(x, y, n * sizeof(float));
  free(y);
}

static float estimate(const float *q, const float *k, uint32_t d, float scale) {
  float scratch[CKV_COLD_SKETCH_MAX_DIM], alpha, total;
  uint64_t sign[CKV_COLD_SKETCH_MAX_DIM / 64];
  float *tables = malloc(ckv_cold_sketch_table_len(1, d) * sizeof(float));
  cr_assert_not_null(tables);
  ckv_cold_sketch_key(k, d, scratch, sign, &alpha);
  ckv_cold_sketch_tables(q, 1, d, scale, scratch, tables, &total);
  float e = ckv_cold_sketch_score(tables, total, sign, alpha, d);
  free(tables);
  return e;
}

static float dot(const float *a, const float *b, uint32_t d) {
  float s = 0.f;
  for (uint32_t i = 0; i < d; i++) s += a[i] * b[i];
  return s;
}

Test(cold_sketch, head_dims_that_take_a_sketch) {
  cr_expect_eq(ckv_cold_sketch_words(8), 1);
  cr_expect_eq(ckv_cold_sketch_words(64), 1);
  cr_expect_eq(ckv_cold_sketch_words(128), 2);
  cr_expect_eq(ckv_cold_sketch_words(512), 8);
  cr_expect_eq(ckv_cold_sketch_words(4), 0);
  cr_expect_eq(ckv_cold_sketch_words(48), 0);
  cr_expect_eq(ckv_cold_sketch_words(1024), 0);
}

/* A key whose rotation has equal magnitudes is what the sketch keeps exactly: the estimate is the score. */
Test(cold_sketch, exact_for_keys_the_sketch_holds_whole) {
  static const uint32_t dims[] = {8, 64, 128};
  for (size_t t = 0; t < sizeof(dims) / sizeof(dims[0]); t++) {
    uint32_t d = dims[t];
    float k[CKV_COLD_SKETCH_MAX_DIM], q[CKV_COLD_SKETCH_MAX_DIM];
    for (uint32_t c = 0; c < d; c++) k[c] = gauss() > 0.f ? 0.7f : -0.7f; /* H k, equal magnitudes */
    wht_ref(k, d);
    for (uint32_t c = 0; c < d; c++) q[c] = gauss();
    float want = dot(q, k, d) * 0.125f, got = estimate(q, k, d, 0.125f);
    cr_expect(fabsf(got - want) <= 1e-4f * (1.f + fabsf(want)), "d %u: estimate %g, score %g", d, got, want);
  }
}

/* Gaussian keys, and keys with an outlier channel (which the rotation spreads over all the bits): the estimates
 * follow the scores.  Measured correlation 0.79-0.80 on Gaussian keys (d 64, 128; one bit keeps about sqrt(2/pi)
 * of a Gaussian's direction), 0.97-0.98 with the outlier (which dominates the scores). */
Test(cold_sketch, estimates_follow_the_scores) {
  static const uint32_t dims[] = {64, 128};
  for (size_t t = 0; t < sizeof(dims) / sizeof(dims[0]); t++)
    for (int outlier = 0; outlier < 2; outlier++) {
      uint32_t d = dims[t];
      enum { N = 1500 };
      double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
      for (int i = 0; i < N; i++) {
        float k[CKV_COLD_SKETCH_MAX_DIM], q[CKV_COLD_SKETCH_MAX_DIM];
        for (uint32_t c = 0; c < d; c++) {
          k[c] = gauss();
          q[c] = gauss();
        }
        if (outlier) k[3] *= 12.f, q[3] *= 3.f;
        double x = estimate(q, k, d, 1.f), y = dot(q, k, d);
        sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
      }
      double r = (sxy - sx * sy / N) / sqrt((sxx - sx * sx / N) * (syy - sy * sy / N));
      fprintf(stderr, "test_cold_sketch: d %u%s: correlation %.3f\n", d, outlier ? ", outlier channel" : "", r);
      cr_expect_geq(r, 0.72, "d %u%s: estimates correlate %.3f with the scores", d, outlier ? " (outlier)" : "", r);
    }
}
