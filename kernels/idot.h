/* idot.h - private: integer dot products of an INT8-quantized query against
 * rows of key codes (INT8 staged codes, 4-bit committed and rotated codes),
 * as a table with one implementation per CPU path: plain C, AVX2 (maddubs)
 * and AVX-512 VNNI (dpbusd), chosen at run time by dispatch.c.
 *
 * Every sum is an exact int32 (no saturation on any path, whatever bytes the
 * rows hold), so all paths return the same integers and the scores built
 * from them (attention_int.c) have the same bits on every path. */
#ifndef CKV_IDOT_H
#define CKV_IDOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Query codes for 4-bit rows are stored in nibble order: within each block of
 * 64 channels, the even channels first (the low nibbles of 32 code bytes),
 * then the odd ones (the high nibbles), so a SIMD path multiplies unpacked
 * nibbles by contiguous query bytes.  Index of channel j in that order. */
static inline size_t ckv_idot_u4_index(size_t j) {
  return (j & ~(size_t)63) + ((j & 1u) ? 32u : 0u) + ((j & 63u) >> 1);
}
/* Query codes for 2-bit rows are stored in crumb order: within each block of
 * 128 channels (32 code bytes), code p of byte k (channel 4k + p) at 32p + k,
 * so the codes p of any run of code bytes meet contiguous query bytes (a
 * SIMD path multiplies one plane of unpacked codes by contiguous query
 * bytes).  Index of channel j in that order. */
static inline size_t ckv_idot_u2_index(size_t j) {
  return (j & ~(size_t)127) + 32u * (j & 3u) + ((j & 127u) >> 2);
}
/* Query row length (bytes) for n channels: whole 128-channel blocks (the crumb order's), zero padded. */
static inline size_t ckv_idot_ld(size_t n) { return (n + 127u) & ~(size_t)127u; }

/* Tails, shared by every path: the sums over channels [j0, n) of one query and one row. */
static inline int32_t ckv_idot_i8_tail(const int8_t *q, const int8_t *k, size_t j0, size_t n) {
  int32_t s = 0;
  for (size_t j = j0; j < n; j++) s += (int32_t)q[j] * k[j];
  return s;
}
static inline int32_t ckv_idot_u4_tail(const int8_t *q, const uint8_t *k, size_t j0, size_t n) {
  int32_t s = 0;
  for (size_t j = j0; j < n; j++) s += (int32_t)q[ckv_idot_u4_index(j)] * ((k[j >> 1] >> ((j & 1u) * 4u)) & 15);
  return s;
}
static inline int32_t ckv_idot_u2_tail(const int8_t *q, const uint8_t *k, size_t j0, size_t n) {
  int32_t s = 0;
  for (size_t j = j0; j < n; j++) s += (int32_t)q[ckv_idot_u2_index(j)] * ((k[j >> 2] >> ((j & 3u) * 2u)) & 3);
  return s;
}

typedef struct ckv_idotops {
  const char *name;
  /* out[i*ldo + t] = sum_{j<n} p[i*ldp + j] * rows[t*stride + j] for i < nq, t < nt.
   * p: query codes in [-127, 127] (never -128); rows: any bytes. */
  void (*i8)(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
             int32_t *out, size_t ldo);
  /* The same with rows of n 4-bit codes (code j at bits 4*(j%2) of byte j/2, values 0..15) and
   * p in nibble order (ckv_idot_u4_index), rows of ldp >= ckv_idot_ld(n) bytes zero padded. */
  void (*u4)(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
             int32_t *out, size_t ldo);
  /* The same with rows of n 2-bit codes (code j at bits 2*(j%4) of byte j/4, values 0..3) and
   * p in crumb order (ckv_idot_u2_index), rows of ldp >= ckv_idot_ld(n) bytes zero padded. */
  void (*u2)(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
             int32_t *out, size_t ldo);
  /* The float steps around the sums, the same bits from every table (each operation rounded on its
   * own, never fused, in the same order):
   * o[i] = (float)(m * acc[i] - ps) * k * st[i], plus b where add_b, for i < n. */
  void (*finish)(const int32_t *acc, int32_t m, int32_t ps, float k, const float *st, float b, bool add_b, float *o,
                 size_t n);
  /* sum x[i] * y[i]: 16 partial sums (element i into lane i % 16: a product, then a sum), then
   * lanes l += l + w for w = 8, 4, 2, 1; lane 0. */
  float (*dot16)(const float *x, const float *y, size_t n);
} ckv_idotops;

extern const ckv_idotops ckv_idot_scalar;
/* The plain C epilogue and float dot (idot_scalar.c), shared by the tables without their own; the 2-bit dots. */
void ckv_idot_scalar_finish(const int32_t *acc, int32_t m, int32_t ps, float k, const float *st, float b, bool add_b,
                            float *o, size_t n);
float ckv_idot_scalar_dot16(const float *x, const float *y, size_t n);
void ckv_idot_scalar_u2(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                        int32_t *out, size_t ldo);
extern const ckv_idotops ckv_idot_avx2;
extern const ckv_idotops ckv_idot_avx512vnni;
extern const ckv_idotops ckv_idot_avxvnni;
/* The AVX2 INT8 dots (idot_avx2.c), also the AVX-VNNI table's. */
void ckv_idot_avx2_i8(const int8_t *p, size_t nq, size_t ldp, const int8_t *rows, size_t stride, size_t nt, size_t n,
                      int32_t *out, size_t ldo);

/* Whether this CPU runs ckv_idot_avx512vnni (AVX-512 F/BW/VL and VNNI). */
bool ckv_idot_vnni_supported(void);
/* Whether this CPU runs ckv_idot_avxvnni (AVX2 and AVX-VNNI, the 256-bit VEX vpdpbusd). */
bool ckv_idot_avxvnni_supported(void);
/* The table for the current CPU path (dispatch.c): scalar; on the AVX2 path AVX-VNNI where the CPU
 * has it, else AVX2; on the AVX-512 path AVX-512 VNNI where the CPU has it, else as AVX2's. */
const ckv_idotops *ckv_idotops_get(void);

#endif
