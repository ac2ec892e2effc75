/* idot_scalar.c - the plain C integer dot products (idot.h): the reference
 * the SIMD paths must equal integer for integer, and the tails they leave;
 * and the float epilogue and float dot the AVX-512 table must equal bit for bit. */
#include <string.h>

#include "kernels/idot.h"

void ckv_idot_scalar_finish(const int32_t *acc, int32_t m, int32_t ps, float k, const float *st, float b, bool add_b,
                            float *o, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = (float)(m * acc[i] - ps) * k;
    v = v * st[i];
    o[i] = add_b ? v + b : v;
  }
}

/* The 16 partial sums are four GCC vectors (lanes: a product, then a sum, never fused: this file
 * has no FMA flag), the same bits as 16 scalar accumulators. */
typedef float ckv_f32x4 __attribute__((vector_size(16)));
float ckv_idot_scalar_dot16(const float *x, const float *y, size_t n) {
  ckv_f32x4 v[4] = {{0}}; /* lanes 0-3, 4-7, 8-11, 12-15: four SSE registers on any x86-64 */
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; k++) {
      ckv_f32x4 a, b;
      memcpy(&a, x + i + 4 * k, sizeof a);
      memcpy(&b, y + i + 4 * k, sizeof b);
      v[k] += a * b;
    }
  float acc[16];
  memcpy(acc, v, sizeof acc);
  for (size_t l = 0; i < n; i++, l++) acc[l] += x[i] * y[i];
  for (size_t w = 8; w; w >>= 1)
    for (size_t l = 0; l < w; l++) acc[l] += acc[l + w];
  return acc[0];
}

static void s_i8(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  for (size_t t = 0; t < nt; t++) {
    const int8_t *k = rows + t * stride;
    for (size_t i = 0; i < nq; i++) out[i * ldo + t] = ckv_idot_i8_tail(p + i * ldp, k, 0, n);
  }
}

static void s_u4(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  for (size_t t = 0; t < nt; t++) {
    const uint8_t *k = rows + t * stride;
    for (size_t i = 0; i < nq; i++) out[i * ldo + t] = ckv_idot_u4_tail(p + i * ldp, k, 0, n);
  }
}

void ckv_idot_scalar_u2(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                        int32_t *out, size_t ldo) {
  for (size_t t = 0; t < nt; t++) {
    const uint8_t *k = rows + t * stride;
    for (size_t i = 0; i < nq; i++) out[i * ldo + t] = ckv_idot_u2_tail(p + i * ldp, k, 0, n);
  }
}

const ckv_idotops ckv_idot_scalar = {.name = "scalar", .i8 = s_i8, .u4 = s_u4, .u2 = ckv_idot_scalar_u2,
                                     .finish = ckv_idot_scalar_finish, .dot16 = ckv_idot_scalar_dot16};
