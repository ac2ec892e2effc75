/* rows_scalar.c - the plain C row primitives: the readable reference every
 * SIMD path is tested against (see rowops.h for each contract), plus the
 * code packer all paths share. */
#include <math.h>

#include "kernels/quant.h"
#include "kernels/rowops.h"

static void s_cvt_f16(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ckv_f16_to_f32(src[i]);
}
static void s_cvt_bf16(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ckv_bf16_to_f32(src[i]);
}
static void s_cvt_i8(const int8_t *src, float s, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = (float)src[i] * s;
}
static void s_cvt_codes(const uint8_t *row, uint32_t bits, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = (float)ckv_unpack_code(row, i, bits);
}
static void s_affine(float *x, float s, float z, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = ckv_mul_add(x[i], s, z);
}
static void s_mul(const float *a, const float *b, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}
static float s_dot(const float *a, const float *b, size_t n) {
  float acc = 0.0f;
  for (size_t i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}
static void s_dotn(const float *q, size_t nq, size_t ldq, const float *k, size_t n, float *out, size_t ldo) {
  for (size_t i = 0; i < nq; i++) out[i * ldo] = s_dot(q + i * ldq, k, n);
}
static void s_axpyn(const float *a, size_t na, size_t lda, const float *x, float *y, size_t ldy, size_t n) {
  for (size_t i = 0; i < na; i++)
    for (size_t j = 0; j < n; j++) y[i * ldy + j] += a[i * lda] * x[j];
}
static void s_axpy(float a, const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}
static float s_exp_sub(float *x, float m, size_t n) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; i++) {
    x[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - m);
    sum += x[i];
  }
  return sum;
}
static float s_absmax(const float *x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
  return m;
}
static void s_range(const float *x, size_t n, float *ret_mn, float *ret_mx) {
  float mn = INFINITY, mx = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    mn = x[i] < mn ? x[i] : mn; /* NaN compares false: ignored, as fminf */
    mx = x[i] > mx ? x[i] : mx;
  }
  *ret_mn = mn;
  *ret_mx = mx;
}
static void s_minmax(const float *x, float *mn, float *mx, size_t n) {
  for (size_t i = 0; i < n; i++) {
    mn[i] = fminf(mn[i], x[i]);
    mx[i] = fmaxf(mx[i], x[i]);
  }
}
static void s_qa_params(const float *mn, const float *mx, size_t n, uint32_t bits, uint16_t *ret_scale,
                        uint16_t *ret_zero, float *ret_zf, float *ret_inv) {
  for (size_t i = 0; i < n; i++) {
    ckv_qa_params(mn[i], mx[i], bits, &ret_scale[i], &ret_zero[i]);
    ret_zf[i] = ckv_f16_to_f32(ret_zero[i]);
    ret_inv[i] = ckv_inv_scale(ret_scale[i]);
  }
}
static void s_quant_i8(const float *x, float inv, int8_t *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ckv_q8_code(x[i], inv);
}
static void s_quant_u(const float *x, const float *zero, const float *inv, uint32_t bits, uint8_t *codes, size_t n) {
  for (size_t i = 0; i < n; i++) codes[i] = ckv_qa_code(x[i], zero[i], inv[i], bits);
}
static void s_quant_i8_groups(const float *x, size_t n, size_t gl, int8_t *codes, uint16_t *scales) {
  for (size_t lo = 0, q = 0; lo < n; lo += gl, q++) {
    size_t cnt = n - lo < gl ? n - lo : gl;
    uint16_t s16 = ckv_q8_scale(s_absmax(x + lo, cnt));
    scales[q] = s16;
    s_quant_i8(x + lo, ckv_inv_scale(s16), codes + lo, cnt);
  }
}
static void s_quant_u_groups(const float *x, size_t n, size_t gl, uint32_t bits, uint16_t *params, uint8_t *row) {
  for (size_t lo = 0, q = 0; lo < n; lo += gl, q++) {
    size_t cnt = n - lo < gl ? n - lo : gl;
    float mn, mx;
    s_range(x + lo, cnt, &mn, &mx);
    ckv_qa_params(mn, mx, bits, &params[2 * q], &params[2 * q + 1]);
    float zf = ckv_f16_to_f32(params[2 * q + 1]), inv = ckv_inv_scale(params[2 * q]);
    for (size_t i = lo; i < lo + cnt; i++) ckv_pack_code(row, i, bits, ckv_qa_code(x[i], zf, inv, bits));
  }
}

void ckv_pack_codes(const uint8_t *codes, size_t n, uint32_t bits, uint8_t *row) {
  size_t per = 8u / bits, i = 0, o = 0;
  if (bits == 4) {
    for (; i + 8 <= n; i += 8, o += 4) { /* 8 nibbles -> 4 bytes, branch free */
      uint64_t x;
      memcpy(&x, codes + i, 8);
      x = (x | (x >> 4)) & 0x00ff00ff00ff00ffull;
      x = (x | (x >> 8)) & 0x0000ffff0000ffffull;
      x = (x | (x >> 16)) & 0xffffffffull;
      uint32_t w = (uint32_t)x;
      memcpy(row + o, &w, 4);
    }
  } else if (bits == 2) {
    for (; i + 8 <= n; i += 8, o += 2) { /* 8 crumbs -> 2 bytes */
      uint64_t x;
      memcpy(&x, codes + i, 8);
      x = (x | (x >> 6)) & 0x000f000f000f000full;
      x = (x | (x >> 12)) & 0x000000ff000000ffull;
      x = (x | (x >> 24)) & 0xffffull;
      uint16_t w = (uint16_t)x;
      memcpy(row + o, &w, 2);
    }
  }
  for (; i < n; i += per, o++) {
    uint32_t b = 0;
    for (size_t k = 0; k < per && i + k < n; k++) b |= (uint32_t)codes[i + k] << (k * bits);
    row[o] = (uint8_t)b;
  }
}

const ckv_rowops ckv_rowops_scalar = {
    .name = "scalar",
    .cvt_f16 = s_cvt_f16,
    .cvt_bf16 = s_cvt_bf16,
    .cvt_i8 = s_cvt_i8,
    .cvt_codes = s_cvt_codes,
    .affine = s_affine,
    .mul = s_mul,
    .dot = s_dot,
    .dotn = s_dotn,
    .axpyn = s_axpyn,
    .axpy = s_axpy,
    .exp_sub = s_exp_sub,
    .absmax = s_absmax,
    .range = s_range,
    .minmax = s_minmax,
    .qa_params = s_qa_params,
    .quant_i8 = s_quant_i8,
    .quant_u = s_quant_u,
    .quant_i8_groups = s_quant_i8_groups,
    .quant_u_groups = s_quant_u_groups,
    .quant_i8_groups_h = NULL, /* move.c widens with cvt_f16 / cvt_bf16 first */
};
