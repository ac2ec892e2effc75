/* rowops.h - private: the row primitives every kernel is built from, as a
 * table of functions with one implementation per CPU path (scalar, AVX2,
 * AVX-512), chosen at run time by dispatch.c.  The format-walking code
 * (move.c, attention.c, ...) is written once over this table.
 *
 * Contract shared by all paths: quantizing primitives (quant_i8, quant_u,
 * cvt_*, affine) give bit-identical results on every path (they follow
 * kernels/quant.h element by element); reductions and accumulations (dot,
 * axpy, exp_sub) may differ in the last bits (summation order, FMA). */
#ifndef CKV_ROWOPS_H
#define CKV_ROWOPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_rowops {
  const char *name;
  /* dst[i] = widen(src[i]) for FP16 / BF16 inputs. */
  void (*cvt_f16)(const uint16_t *src, float *dst, size_t n);
  void (*cvt_bf16)(const uint16_t *src, float *dst, size_t n);
  /* dst[i] = src[i] * s (staged dequantization, one rounding). */
  void (*cvt_i8)(const int8_t *src, float s, float *dst, size_t n);
  /* dst[i] = code i of a packed row of bits-bit codes (4 or 2), as a float. */
  void (*cvt_codes)(const uint8_t *row, uint32_t bits, float *dst, size_t n);
  /* x[i] = x[i] * s + z, two roundings. */
  void (*affine)(float *x, float s, float z, size_t n);
  /* y[i] = a[i] * b[i]. */
  void (*mul)(const float *a, const float *b, float *y, size_t n);
  /* sum a[i]*b[i]. */
  float (*dot)(const float *a, const float *b, size_t n);
  /* out[i*ldo] = dot(q + i*ldq, k) for i < nq: several queries against one row, k read once. */
  void (*dotn)(const float *q, size_t nq, size_t ldq, const float *k, size_t n, float *out, size_t ldo);
  /* y + i*ldy += a[i*lda] * x for i < na: one row into several accumulators. */
  void (*axpyn)(const float *a, size_t na, size_t lda, const float *x, float *y, size_t ldy, size_t n);
  /* y[i] += a * x[i]. */
  void (*axpy)(float a, const float *x, float *y, size_t n);
  /* x[i] = exp(x[i] - m) (0 for x[i] = -inf); returns the sum. */
  float (*exp_sub)(float *x, float m, size_t n);
  /* max |x[i]|, NaN ignored. */
  float (*absmax)(const float *x, size_t n);
  /* *ret_mn = min x[i], *ret_mx = max x[i], NaN ignored (+inf / -inf when n == 0 or all NaN). */
  void (*range)(const float *x, size_t n, float *ret_mn, float *ret_mx);
  /* mn[i] = fminf(mn[i], x[i]); mx[i] = fmaxf(mx[i], x[i]). */
  void (*minmax)(const float *x, float *mn, float *mx, size_t n);
  /* ckv_qa_params(mn[i], mx[i], bits) for i < n: FP16 scale and zero, and the widened zero and
   * inverse scale quantization uses. */
  void (*qa_params)(const float *mn, const float *mx, size_t n, uint32_t bits, uint16_t *ret_scale,
                    uint16_t *ret_zero, float *ret_zf, float *ret_inv);
  /* dst[i] = ckv_q8_code(x[i], inv). */
  void (*quant_i8)(const float *x, float inv, int8_t *dst, size_t n);
  /* codes[i] = ckv_qa_code(x[i], zero[i], inv[i], bits), one byte each. */
  void (*quant_u)(const float *x, const float *zero, const float *inv, uint32_t bits, uint8_t *codes, size_t n);
  /* A whole staged row in one call: for each group q of gl elements (the last may be shorter),
   * scales[q] = ckv_q8_scale(absmax of the group) and codes = ckv_q8_code(x, ckv_inv_scale(scales[q])). */
  void (*quant_i8_groups)(const float *x, size_t n, size_t gl, int8_t *codes, uint16_t *scales);
  /* A whole committed value row in one call: for each group q of gl elements (the last may be
   * shorter), (params[2q], params[2q+1]) = ckv_qa_params(range of the group)
   * and code i = ckv_qa_code(x[i], widened zero, ckv_inv_scale(scale), bits), packed into row
   * as ckv_pack_codes does; row (ceil(n*bits/8) bytes) must be zeroed first. */
  void (*quant_u_groups)(const float *x, size_t n, size_t gl, uint32_t bits, uint16_t *params, uint8_t *row);
  /* quant_i8_groups of the widened FP16 (bf16 = 0) or BF16 (bf16 = 1) row h, widening in registers
   * instead of through an FP32 row.  NULL where a path has none (move.c then widens first). */
  void (*quant_i8_groups_h)(const uint16_t *h, int bf16, size_t n, size_t gl, int8_t *codes, uint16_t *scales);
  /* quant_u_groups of the widened FP16 / BF16 row h in groups of 32 (n a multiple of 32, bits 4 or
   * 2), every byte of row and params written (nothing to zero first).  NULL where a path has none. */
  void (*quant_u32_groups_h)(const uint16_t *h, int bf16, size_t n, uint32_t bits, uint16_t *params, uint8_t *row);
  /* minmax of the widened FP16 / BF16 row h.  NULL where a path has none. */
  void (*minmax_h)(const uint16_t *h, int bf16, float *mn, float *mx, size_t n);
  /* minmax_h of rows[0], rows[1], ... rows[nrows-1] in that order (the same floats), a block of
   * columns at a time across every row, the accumulators in registers: mn and mx are read and
   * written once instead of once per row.  NULL where a path has none. */
  void (*minmax_rows_h)(const uint16_t *const *rows, size_t nrows, int bf16, float *mn, float *mx, size_t n);
  /* code i = ckv_qa_code(widened h[i], zero[i], inv[i], bits), packed into row as ckv_pack_codes
   * does, every byte of row written (n a multiple of 32, bits 4 or 2).  NULL where a path has none. */
  void (*quant_u_h)(const uint16_t *h, int bf16, const float *zero, const float *inv, uint32_t bits, uint8_t *row,
                    size_t n);
  /* dst[i] = ckv_mul_add(code i of row, widened scale[i], widened zero[i]): committed keys' per-channel
   * params (n a multiple of 32, bits 4 or 2).  NULL where a path has none (dequant.c composes). */
  void (*dequant_u_cols)(const uint8_t *row, uint32_t bits, const uint16_t *scale, const uint16_t *zero, float *dst,
                         size_t n);
  /* dst[i] = ckv_mul_add(code i, scale, zero) with (scale, zero) = params[2q], params[2q+1] of its
   * group q of 32: committed values (n a multiple of 32, bits 4 or 2).  NULL where a path has none. */
  void (*dequant_u32_groups)(const uint8_t *row, uint32_t bits, const uint16_t *params, float *dst, size_t n);
  /* acc[i] += fabsf(widened FP16 / BF16 h[i]), element by element.  NULL where a path has none. */
  void (*absadd_h)(const uint16_t *h, int bf16, float *acc, size_t n);
} ckv_rowops;

extern const ckv_rowops ckv_rowops_scalar;
extern const ckv_rowops ckv_rowops_avx2;
extern const ckv_rowops ckv_rowops_avx512;
/* The AVX2 whole-row quantizers, which the AVX-512 table shares (rows_avx2.c). */
void ckv_avx2_quant_i8_groups(const float *x, size_t n, size_t gl, int8_t *codes, uint16_t *scales);
void ckv_avx2_quant_i8_groups_h(const uint16_t *h, int bf16, size_t n, size_t gl, int8_t *codes, uint16_t *scales);
void ckv_avx2_quant_u_groups(const float *x, size_t n, size_t gl, uint32_t bits, uint16_t *params, uint8_t *row);
void ckv_avx2_quant_u32_groups_h(const uint16_t *h, int bf16, size_t n, uint32_t bits, uint16_t *params, uint8_t *row);
void ckv_avx2_absadd_h(const uint16_t *h, int bf16, float *acc, size_t n);
void ckv_avx2_minmax_h(const uint16_t *h, int bf16, float *mn, float *mx, size_t n);
void ckv_avx2_minmax_rows_h(const uint16_t *const *rows, size_t nrows, int bf16, float *mn, float *mx, size_t n);
void ckv_avx2_quant_u_h(const uint16_t *h, int bf16, const float *zero, const float *inv, uint32_t bits, uint8_t *row,
                        size_t n);

/* The table for the current path (dispatch.c). */
const ckv_rowops *ckv_rowops_get(void);

/* Packs n one-byte codes of bits bits into a row (low bits first); writes
 * ceil(n*bits/8) bytes.  Portable, shared by every path. */
void ckv_pack_codes(const uint8_t *codes, size_t n, uint32_t bits, uint8_t *row);

#endif
