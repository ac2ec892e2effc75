/* idot_scalar.c - the plain C integer dot products (idot.h): the reference
 * the SIMD paths must equal integer for integer, and the tails they leave. */
#include "kernels/idot.h"

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

const ckv_idotops ckv_idot_scalar = {.name = "scalar", .i8 = s_i8, .u4 = s_u4};
