/* quant.h - the quantization rules of every format, as inline functions that
 * compile both as C11 and as CUDA device code, so a CPU and a GPU quantizing
 * the same input write the same bytes (DESIGN.md §4 invariant 7).
 *
 * Rules (all arithmetic in IEEE FP32, no fused multiply-add, no fast-math):
 *  - FP16 conversion is round-to-nearest-even (ckv_f32_to_f16); BF16 and FP16
 *    inputs widen exactly to FP32.
 *  - A scale is computed in FP32 and stored as FP16 rounded *up* (the smallest
 *    FP16 >= the FP32 value, capped at 65504), so the largest element never
 *    exceeds the code range; a zero point (the group minimum) is stored as FP16
 *    rounded *down*, so x - zero >= 0.  The stored FP16 values, widened, are
 *    what quantization then uses: inv = 1.0f / scale (0 when scale is 0).
 *  - Staged INT8, symmetric: scale = absmax / 127; code = clamp(rint(x * inv),
 *    -127, 127).  Dequantized value: code * scale.
 *  - Committed INT4/INT2, asymmetric: zero = round_down(min); scale =
 *    (max - zero) / (2^b - 1); code = clamp(rint((x - zero) * inv), 0, 2^b - 1).
 *    Dequantized value: code * scale + zero.
 *  - rint is round-half-to-even (rintf in C under the default rounding mode,
 *    rintf / __float2int_rn on the GPU).  Clamping uses fminf/fmaxf, which
 *    map NaN to the bound; absmax/min/max ignore NaN; +-Inf saturate.
 *  - Staged -> committed converts from the dequantized INT8 values. */
#ifndef CKV_QUANT_H
#define CKV_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/format.h"

#define CKV_F16_MAX 65504.0f

CKV_HD uint32_t ckv_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
CKV_HD float ckv_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* FP16 (IEEE binary16 bits) -> FP32, exact. */
CKV_HD float ckv_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    return sign ? -v : v;
  }
  if (e == 31) return ckv_bits_f32(sign | 0x7f800000u | (m << 13));
  return ckv_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* FP32 -> FP16, round to nearest, ties to even; overflow gives Inf, NaN stays NaN. */
CKV_HD uint16_t ckv_f32_to_f16(float f) {
  uint32_t x = ckv_f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 */
  if (ax < 0x38800000u) {                                     /* below 2^-14: subnormal */
    if (ax < 0x33000000u) return (uint16_t)sign;              /* <= 2^-25 rounds to 0 */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

CKV_HD float ckv_bf16_to_f32(uint16_t h) { return ckv_bits_f32((uint32_t)h << 16); }

/* Smallest FP16 >= v for v in [0, 65504] (v is clamped to that range first). */
CKV_HD uint16_t ckv_f16_round_up(float v) {
  v = fminf(fmaxf(v, 0.0f), CKV_F16_MAX) + 0.0f; /* + 0: -0 becomes +0 on every path */
  uint16_t h = ckv_f32_to_f16(v);
  if (ckv_f16_to_f32(h) < v) h++;
  return h;
}
/* Largest FP16 <= v for v in [-65504, 65504] (clamped first). */
CKV_HD uint16_t ckv_f16_round_down(float v) {
  v = fminf(fmaxf(v, -CKV_F16_MAX), CKV_F16_MAX) + 0.0f; /* -0 -> +0 */
  uint16_t h = ckv_f32_to_f16(v);
  if (ckv_f16_to_f32(h) > v) {
    if (h == 0) return 0x8001u; /* +0 > v: v is a tiny negative */
    h = (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
  }
  return h;
}

/* a*b + c with two roundings, never contracted into an FMA (CPU and GPU agree). */
CKV_HD float ckv_mul_add(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c; /* C11 without -ffp-contract=fast: two roundings */
#endif
}

/* ---- staged INT8 ---- */
CKV_HD uint16_t ckv_q8_scale(float absmax) { return ckv_f16_round_up(absmax / 127.0f); }
CKV_HD float ckv_inv_scale(uint16_t scale16) {
  float s = ckv_f16_to_f32(scale16);
  return s > 0.0f ? 1.0f / s : 0.0f;
}
CKV_HD int8_t ckv_q8_code(float x, float inv) {
  float r = rintf(x * inv);
  return (int8_t)fminf(fmaxf(r, -127.0f), 127.0f);
}

/* ---- committed INT4 / INT2 ---- */
CKV_HD uint32_t ckv_qa_levels(uint32_t bits) { return (1u << bits) - 1u; }
/* Scale and zero of an asymmetric group with minimum mn and maximum mx
 * (mn > mx, an empty or all-NaN group, is treated as mn = mx = 0). */
CKV_HD void ckv_qa_params(float mn, float mx, uint32_t bits, uint16_t *ret_scale, uint16_t *ret_zero) {
  if (!(mn <= mx)) mn = mx = 0.0f;
  uint16_t z = ckv_f16_round_down(mn);
  float zf = ckv_f16_to_f32(z);
  float top = fminf(mx, CKV_F16_MAX);
  *ret_scale = ckv_f16_round_up((top - zf) / (float)ckv_qa_levels(bits));
  *ret_zero = z;
}
CKV_HD uint8_t ckv_qa_code(float x, float zero, float inv, uint32_t bits) {
  float r = rintf((x - zero) * inv);
  return (uint8_t)fminf(fmaxf(r, 0.0f), (float)ckv_qa_levels(bits));
}
/* Code e of a packed row (b bits per code, low bits first; a 3-bit code may
 * straddle two bytes, and only then is the second byte read). */
CKV_HD uint32_t ckv_unpack_code(const uint8_t *row, size_t e, uint32_t bits) {
  size_t bit = e * bits;
  uint32_t sh = (uint32_t)(bit & 7u), v = (uint32_t)row[bit >> 3] >> sh;
  if (sh + bits > 8u) v |= (uint32_t)row[(bit >> 3) + 1u] << (8u - sh);
  return v & ckv_qa_levels(bits);
}
/* OR code e into a packed row that was zeroed first. */
CKV_HD void ckv_pack_code(uint8_t *row, size_t e, uint32_t bits, uint32_t code) {
  size_t bit = e * bits;
  uint32_t sh = (uint32_t)(bit & 7u);
  row[bit >> 3] = (uint8_t)(row[bit >> 3] | (code << sh));
  if (sh + bits > 8u) row[(bit >> 3) + 1u] = (uint8_t)(row[(bit >> 3) + 1u] | (code >> (8u - sh)));
}

/* ---- rotated (formats v2) ----
 * Rotation of one head's vector x (K after RoPE, or V) of (layer, kv, head):
 * y = H (s . x) / sqrt(head_dim), H the Walsh-Hadamard matrix (butterflies in
 * the order of ckv_fwht), s a fixed pseudo-random sign per element
 * (ckv_rot_sign: a hash of CKV_ROT_SEED, layer, kv, head and the element, so
 * no state is kept and every process agrees).  Non-finite inputs are first
 * made finite (NaN -> 0, +-Inf -> +-65504) so one bad element cannot spread
 * over the head.  The rotation is orthogonal: q.k = (R q).(R k), and
 * sum p v = R^T sum p (R v), which is how attention reads these formats
 * without un-rotating a single key.
 * Quantization of y (b bits, symmetric, mid-rise): rms = sqrt(sum y^2 / D)
 * (summed in 16 lanes, see ckv_lanes16_total); the scale is one byte, a power
 * of 2^(1/8) (ckv_rot_scale_value), the better of two codes: the two either
 * side of a closed-form estimate from the head's rms and absmax
 * (ckv_rot_scale_estimate, ckv_rot_quant_head); code =
 * clamp(floor(y * inv) + 2^(b-1), 0, 2^b - 1) with inv = 1 / scale (0 for a
 * zero scale); value = (code - (2^b - 1) / 2) * scale.  The steps are the MSE-optimal uniform
 * quantizer steps of a unit Gaussian (what a rotated head looks like), in
 * units of its standard deviation. */
#define CKV_ROT_SEED 0x5eed2026u
CKV_HD uint32_t ckv_rot_mix(uint32_t h) { /* murmur3's finaliser */
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
/* +1.0f or -1.0f for element i of (layer, kv, head). */
CKV_HD float ckv_rot_sign(uint32_t layer, uint32_t kv, uint32_t head, uint32_t i) {
  uint32_t key = ((layer * 2u + kv) * CKV_MAX_KV_HEADS + head) * CKV_MAX_HEAD_DIM + i;
  return (ckv_rot_mix(key ^ CKV_ROT_SEED) >> 31) ? -1.0f : 1.0f;
}
/* lo <= v <= hi by comparisons: fminf(fmaxf(v, lo), hi) for every v that is
 * not NaN, without the libm calls those are on x86-64 below SSE4.1 (the rules
 * only clamp values already made finite). */
CKV_HD float ckv_clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }
CKV_HD float ckv_rot_finite(float v) {
  if (v != v) return 0.0f;
  return ckv_clampf(v, -CKV_F16_MAX, CKV_F16_MAX);
}
/* In-place unnormalised Walsh-Hadamard transform of x[0..n), n a power of two. */
CKV_HD void ckv_fwht(float *x, uint32_t n) {
  for (uint32_t len = 1; len < n; len <<= 1)
    for (uint32_t i = 0; i < n; i += len << 1)
      for (uint32_t j = i; j < i + len; j++) {
        float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}
CKV_HD float ckv_rot_norm(uint32_t n) { return 1.0f / sqrtf((float)n); }
/* x <- R x for (layer, kv, head); x[0..n), n = head_dim. */
CKV_HD void ckv_rot_forward(float *x, uint32_t n, uint32_t layer, uint32_t kv, uint32_t head) {
  for (uint32_t i = 0; i < n; i++) x[i] = ckv_rot_finite(x[i]) * ckv_rot_sign(layer, kv, head, i);
  ckv_fwht(x, n);
  float r = ckv_rot_norm(n);
  for (uint32_t i = 0; i < n; i++) x[i] = x[i] * r;
}
/* x <- R^T x (the inverse). */
CKV_HD void ckv_rot_inverse(float *x, uint32_t n, uint32_t layer, uint32_t kv, uint32_t head) {
  ckv_fwht(x, n);
  float r = ckv_rot_norm(n);
  for (uint32_t i = 0; i < n; i++) x[i] = x[i] * r * ckv_rot_sign(layer, kv, head, i);
}
CKV_HD float ckv_rot_step(uint32_t bits) {
  return bits >= 4u ? 0.3352f : bits == 3u ? 0.5860f : bits == 2u ? 0.9957f : 1.5958f;
}
/* (2^b - 1) / 2: the code value offset. */
CKV_HD float ckv_rot_offset(uint32_t bits) { return (float)ckv_qa_levels(bits) * 0.5f; }
/* The code of rotated element y with inverse scale inv: clamp(floor(y * inv) + 2^(b-1), 0, 2^b - 1). */
CKV_HD float ckv_rot_code(float y, float inv, float half, float top) {
  return ckv_clampf(floorf(y * inv) + half, 0.0f, top);
}
/* The sums of the rotated rules (sum of squares, squared errors) run in 16
 * lanes: lane j takes the terms i = j mod 16 in index order (a * b then + ,
 * two roundings); the total adds lane j + 8 to lane j (j < 8), then
 * ((m0 + m1) + (m2 + m3)) + ((m4 + m5) + (m6 + m7)).  That is the order of a
 * 16-wide SIMD accumulation (one AVX-512 register, two AVX2 ones), so the
 * scalar rule, the AVX2 and AVX-512 paths (rot_avx2.c, rot_avx512.c) and CUDA
 * choose the same scale bit for bit (a scale chosen by a sum in another order
 * may differ in its last bit, and the codes with it).  16 lanes, not 8: the
 * chain of dependent additions per head is half as long. */
CKV_HD float ckv_lanes16_total(const float l[16]) {
  float m[8];
  for (int j = 0; j < 8; j++) m[j] = l[j] + l[j + 8];
  return ((m[0] + m[1]) + (m[2] + m[3])) + ((m[4] + m[5]) + (m[6] + m[7]));
}
/* The rotated formats' scale, one byte per token and head (0.125 bit per
 * element at head_dim 64, against 0.25 for FP16): code c = 1..255 is
 * 2^((c - 128) / 8), from 1.09 * 2^-16 to 60097 in steps of 9%, and 0 is a
 * zero scale.  Computed exactly (a power of two times one of eight FP32
 * constants), so every path decodes the same float. */
#define CKV_ROT_SCALE_CODES 255u
CKV_HD float ckv_rot_scale_value(uint32_t c) {
  const float m[8] = {1.0f,         1.09050773f, 1.18920712f, 1.29683955f,
                      1.41421356f,  1.54221083f, 1.68179283f, 1.83400809f};
  if (c == 0u || c > CKV_ROT_SCALE_CODES) return 0.0f;
  return m[c & 7u] * ckv_bits_f32((uint32_t)((int32_t)(c >> 3) - 16 + 127) << 23);
}
/* The largest code whose scale is <= s (1 for any s below the smallest, 255
 * above the largest; s finite and > 0), from s's exponent and mantissa:
 * exact, no logarithm. */
CKV_HD uint32_t ckv_rot_scale_floor(float s) {
  uint32_t u = ckv_f32_bits(s), e = (u >> 23) & 0xffu;
  if (e == 0u) return 1u; /* subnormal: far below 2^-16 */
  int32_t k = (int32_t)e - 127 + 16;
  if (k < 0) return 1u;
  if (k > 31) return CKV_ROT_SCALE_CODES;
  float mant = ckv_bits_f32((u & 0x7fffffu) | (127u << 23)); /* s / 2^exponent, in [1, 2) */
  /* the largest j with scale value 128 + j (= the constant m[j] of ckv_rot_scale_value) <= mant: the values
   * increase with j, so it is the count of those <= mant (no loop, no branch) */
  uint32_t f = (uint32_t)(1.09050773f <= mant) + (uint32_t)(1.18920712f <= mant) + (uint32_t)(1.29683955f <= mant) +
               (uint32_t)(1.41421356f <= mant) + (uint32_t)(1.54221083f <= mant) + (uint32_t)(1.68179283f <= mant) +
               (uint32_t)(1.83400809f <= mant);
  uint32_t c = (uint32_t)k * 8u + f;
  return c < 1u ? 1u : c > CKV_ROT_SCALE_CODES ? CKV_ROT_SCALE_CODES : c;
}
CKV_HD float ckv_rot_scale_inv(uint32_t c) {
  float s = ckv_rot_scale_value(c);
  return s > 0.0f ? 1.0f / s : 0.0f;
}
#define CKV_ROT_CANDIDATES 2
/* (code - offset) of element y for inverse scale inv, from t = y * inv:
 * clamp(floor(t) + 1/2, 1/2 - 2^(b-1), 2^(b-1) - 1/2), which is ckv_rot_code
 * less the offset, exactly (a symmetric clamp: one instruction on AVX-512). */
CKV_HD float ckv_rot_mid(float t, float half) { return ckv_clampf(floorf(t) + 0.5f, 0.5f - half, half - 0.5f); }
/* Squared error of quantizing y[0..n) with each candidate scale code in one
 * pass, measured in units of the scale: err[k] = (s * s) * sum (t - m)^2
 * with t = y * inv, m = ckv_rot_mid(t) (the sum in 16 lanes as above; the
 * same quantity as sum (y - m s)^2, with one multiplication less per
 * element). */
CKV_HD void ckv_rot_sq_errors(const float *y, uint32_t n, uint32_t bits, const uint8_t cand[CKV_ROT_CANDIDATES],
                              float err[CKV_ROT_CANDIDATES]) {
  float half = (float)(1u << (bits - 1u));
  float inv[CKV_ROT_CANDIDATES], e[CKV_ROT_CANDIDATES][16];
  for (int k = 0; k < CKV_ROT_CANDIDATES; k++) {
    inv[k] = ckv_rot_scale_inv(cand[k]);
    for (int j = 0; j < 16; j++) e[k][j] = 0.0f;
  }
  for (uint32_t i = 0; i < n; i++)
    for (int k = 0; k < CKV_ROT_CANDIDATES; k++) {
      float t = y[i] * inv[k], d = t - ckv_rot_mid(t, half);
      e[k][i & 15u] = ckv_mul_add(d, d, e[k][i & 15u]);
    }
  for (int k = 0; k < CKV_ROT_CANDIDATES; k++) {
    float sc = ckv_rot_scale_value(cand[k]);
    err[k] = (sc * sc) * ckv_lanes16_total(e[k]);
  }
}
/* The closed-form scale of a rotated head from its sum of squares ss and
 * absmax am: g = step * rms is the MSE-optimal step of a Gaussian, a = am /
 * (2^(b-1) - 1/2) the step that clips nothing.  A head lighter-tailed than a
 * Gaussian (a <= g) takes a; a heavier-tailed one a point between, nearer g
 * the fewer the bits: sqrt(g a) at 4 bits, g (a/g)^(1/4) at 3, g at 2 and 1
 * (at 1 bit g = 2 E|y| of a Gaussian).  Fitted on the agent model's K/V
 * against the best of many codes (docs/formats-v2.md); sqrtf and the four
 * basic operations only, correctly rounded on every path. */
CKV_HD float ckv_rot_scale_estimate(float ss, float am, uint32_t n, uint32_t bits) {
  float rms = sqrtf(ss / (float)n), half = (float)(1u << (bits - 1u));
  float g = ckv_rot_step(bits) * rms, a = am / (half - 0.5f);
  if (a <= g || !(g > 0.0f)) return a;
  if (bits <= 2u) return g;
  return bits >= 4u ? sqrtf(g * a) : g * sqrtf(sqrtf(a / g));
}
/* The two scale codes worth trying for a rotated head: either side of
 * ckv_rot_scale_estimate (the one refinement: the pass that measures both).
 * A head of zeros gets code 0 twice (scale 0: every value decodes to 0
 * exactly). */
CKV_HD void ckv_rot_candidates(float ss, float am, uint32_t n, uint32_t bits, uint8_t cand[CKV_ROT_CANDIDATES]) {
  if (!(am > 0.0f)) {
    cand[0] = cand[1] = 0;
    return;
  }
  uint32_t c = ckv_rot_scale_floor(ckv_rot_scale_estimate(ss, am, n, bits));
  cand[0] = (uint8_t)c;
  cand[1] = (uint8_t)(c < CKV_ROT_SCALE_CODES ? c + 1u : c);
}
/* The candidate with the least squared error (ties: the earlier). */
CKV_HD uint8_t ckv_rot_best(const uint8_t cand[CKV_ROT_CANDIDATES], const float err[CKV_ROT_CANDIDATES]) {
  uint8_t c = cand[0];
  float best = err[0];
  for (int k = 1; k < CKV_ROT_CANDIDATES; k++)
    if (err[k] < best) {
      best = err[k];
      c = cand[k];
    }
  return c;
}
/* Quantizes a rotated head y[0..n) (finite values) into *ret_scale (a scale
 * code) and the packed row (n*bits/8 bytes, written whole): the better of the
 * two candidates. */
CKV_HD void ckv_rot_quant_head(const float *y, uint32_t n, uint32_t bits, uint8_t *ret_scale, uint8_t *row) {
  float ss[16], am = 0.0f;
  for (int j = 0; j < 16; j++) ss[j] = 0.0f;
  for (uint32_t i = 0; i < n; i++) {
    float a = fabsf(y[i]);
    ss[i & 15u] = ckv_mul_add(y[i], y[i], ss[i & 15u]);
    am = a > am ? a : am;
  }
  uint8_t cand[CKV_ROT_CANDIDATES];
  float err[CKV_ROT_CANDIDATES];
  ckv_rot_candidates(ckv_lanes16_total(ss), am, n, bits, cand);
  ckv_rot_sq_errors(y, n, bits, cand, err);
  uint8_t sc = ckv_rot_best(cand, err);
  float inv = ckv_rot_scale_inv(sc), half = (float)(1u << (bits - 1u)), top = (float)ckv_qa_levels(bits);
  for (size_t b = 0; b < (size_t)n * bits / 8u; b++) row[b] = 0;
  for (uint32_t i = 0; i < n; i++) ckv_pack_code(row, i, bits, (uint32_t)ckv_rot_code(y[i], inv, half, top));
  *ret_scale = sc;
}
/* A block's rotated key mean element from the sum of n tokens' rotated keys
 * (summed in destination-slot order), as FP16 nearest; non-finite -> finite.
 * Any n >= 1: with the first move's few tokens the mean carries their noise
 * (a key without offset then has a residual up to sqrt(2) larger), yet no
 * centering at all lets a constant outlier channel rule every key of the
 * block (measured on agent-synthetic: cosine 0.996 with any n, 0.883 with
 * centering only from 8 tokens). */
CKV_HD uint16_t ckv_rot_mean_f16(float sum, uint32_t n) { return ckv_f32_to_f16(ckv_rot_finite(sum / (float)n)); }
/* Dequantized (still rotated, mean not added) element of code c. */
CKV_HD float ckv_rot_value(uint32_t code, float scale, uint32_t bits) {
  return ((float)code - ckv_rot_offset(bits)) * scale;
}

#endif
