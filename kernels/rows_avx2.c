/* rows_avx2.c - the row primitives with AVX2 + FMA + F16C (8 floats a step).
 * Compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt) and called only
 * after dispatch.c checked the CPU.  Quantizing primitives do exactly the
 * scalar operations, lane by lane, so their output bytes are the scalar ones;
 * tails fall back to the scalar table, called only when there is one. */
#include <immintrin.h>
#include <math.h>

#include "kernels/quant.h"
#include "kernels/rowops.h"

#define SC ckv_rowops_scalar

static void a_cvt_f16(const uint16_t *src, float *dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  if (i < n) SC.cvt_f16(src + i, dst + i, n - i);
}
static void a_cvt_bf16(const uint16_t *src, float *dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  if (i < n) SC.cvt_bf16(src + i, dst + i, n - i);
}
static void a_cvt_i8(const int8_t *src, float s, float *dst, size_t n) {
  size_t i = 0;
  __m256 vs = _mm256_set1_ps(s);
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), vs));
  }
  if (i < n) SC.cvt_i8(src + i, s, dst + i, n - i);
}
/* 32 codes from a packed row, as 32 bytes in natural order. */
static inline void unpack32(const uint8_t *row, uint32_t bits, __m128i *lo16, __m128i *hi16) {
  if (bits == 4) {
    __m128i b = _mm_loadu_si128((const __m128i *)row), m = _mm_set1_epi8(0x0f);
    __m128i l = _mm_and_si128(b, m), h = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *lo16 = _mm_unpacklo_epi8(l, h);
    *hi16 = _mm_unpackhi_epi8(l, h);
  } else {
    __m128i b = _mm_loadl_epi64((const __m128i *)row), m = _mm_set1_epi8(0x03);
    __m128i c0 = _mm_and_si128(b, m), c1 = _mm_and_si128(_mm_srli_epi16(b, 2), m);
    __m128i c2 = _mm_and_si128(_mm_srli_epi16(b, 4), m), c3 = _mm_and_si128(_mm_srli_epi16(b, 6), m);
    __m128i a = _mm_unpacklo_epi8(c0, c1), c = _mm_unpacklo_epi8(c2, c3);
    *lo16 = _mm_unpacklo_epi16(a, c);
    *hi16 = _mm_unpackhi_epi16(a, c);
  }
}
static void a_cvt_codes(const uint8_t *row, uint32_t bits, float *dst, size_t n) {
  size_t i = 0;
  if (bits != 4 && bits != 2) { /* 3- and 1-bit rows: the scalar unpacker */
    SC.cvt_codes(row, bits, dst, n);
    return;
  }
  for (; i + 32 <= n; i += 32) {
    __m128i lo, hi;
    unpack32(row + i * bits / 8, bits, &lo, &hi);
    _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))));
    _mm256_storeu_ps(dst + i + 16, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)));
    _mm256_storeu_ps(dst + i + 24, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
  }
  if (i < n) SC.cvt_codes(row + i * bits / 8, bits, dst + i, n - i);
}
static void a_affine(float *x, float s, float z, size_t n) {
  size_t i = 0;
  __m256 vs = _mm256_set1_ps(s), vz = _mm256_set1_ps(z);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), vz));
  if (i < n) SC.affine(x + i, s, z, n - i);
}
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static void a_mul(const float *a, const float *b, float *y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) SC.mul(a + i, b + i, y + i, n - i);
}
static float a_dot(const float *a, const float *b, size_t n) {
  size_t i = 0;
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  return hsum(_mm256_add_ps(s0, s1)) + SC.dot(a + i, b + i, n - i);
}
static void a_dotn(const float *q, size_t nq, size_t ldq, const float *k, size_t n, float *out, size_t ldo) {
  size_t i = 0;
  for (; i + 4 <= nq; i += 4) {
    const float *q0 = q + i * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t d = 0;
    for (; d + 8 <= n; d += 8) {
      __m256 kv = _mm256_loadu_ps(k + d);
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), kv, s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), kv, s1);
      s2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), kv, s2);
      s3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), kv, s3);
    }
    out[i * ldo] = hsum(s0) + SC.dot(q0 + d, k + d, n - d);
    out[(i + 1) * ldo] = hsum(s1) + SC.dot(q1 + d, k + d, n - d);
    out[(i + 2) * ldo] = hsum(s2) + SC.dot(q2 + d, k + d, n - d);
    out[(i + 3) * ldo] = hsum(s3) + SC.dot(q3 + d, k + d, n - d);
  }
  for (; i < nq; i++) out[i * ldo] = a_dot(q + i * ldq, k, n);
}
static void a_axpyn(const float *a, size_t na, size_t lda, const float *x, float *y, size_t ldy, size_t n) {
  size_t d = 0;
  for (; d + 8 <= n; d += 8) {
    __m256 xv = _mm256_loadu_ps(x + d);
    for (size_t i = 0; i < na; i++) {
      float *yi = y + i * ldy + d;
      _mm256_storeu_ps(yi, _mm256_fmadd_ps(_mm256_set1_ps(a[i * lda]), xv, _mm256_loadu_ps(yi)));
    }
  }
  if (d < n) SC.axpyn(a, na, lda, x + d, y + d, ldy, n - d);
}
static void a_axpy(float a, const float *x, float *y, size_t n) {
  size_t i = 0;
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) SC.axpy(a, x + i, y + i, n - i);
}
/* exp(x) for x <= 0 ... 88: Cody-Waite reduction, degree-6 polynomial, about 2 ulp. */
static inline __m256 exp8(__m256 x) {
  __m256 zero_mask = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(zero_mask, p);
}
static float a_exp_sub(float *x, float m, size_t n) {
  size_t i = 0;
  __m256 vm = _mm256_set1_ps(m), s = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, v);
    s = _mm256_add_ps(s, v);
  }
  return hsum(s) + SC.exp_sub(x + i, m, n - i);
}
static float a_absmax(const float *x, size_t n) {
  size_t i = 0;
  __m256 m = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float r = SC.absmax(x + i, n - i);
  for (int k = 0; k < 8; k++) r = fmaxf(r, lanes[k]);
  return r;
}
static void a_range(const float *x, size_t n, float *ret_mn, float *ret_mx) {
  size_t i = 0;
  __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    mn = _mm256_min_ps(v, mn); /* NaN in v: keeps mn */
    mx = _mm256_max_ps(v, mx);
  }
  float a[8], b[8], tmn, tmx;
  _mm256_storeu_ps(a, mn);
  _mm256_storeu_ps(b, mx);
  SC.range(x + i, n - i, &tmn, &tmx);
  for (int k = 0; k < 8; k++) {
    tmn = a[k] < tmn ? a[k] : tmn;
    tmx = b[k] > tmx ? b[k] : tmx;
  }
  *ret_mn = tmn;
  *ret_mx = tmx;
}
static void a_minmax(const float *x, float *mn, float *mx, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    /* min_ps(a, b) returns b when a is NaN: NaN inputs leave mn/mx as they were. */
    _mm256_storeu_ps(mn + i, _mm256_min_ps(v, _mm256_loadu_ps(mn + i)));
    _mm256_storeu_ps(mx + i, _mm256_max_ps(v, _mm256_loadu_ps(mx + i)));
  }
  if (i < n) SC.minmax(x + i, mn + i, mx + i, n - i);
}
/* An immediate operand: a macro, not a variable, so -O0 builds compile. */
#define CKV_F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* 32-bit lane masks (0 / -1) of a compare, as 16-bit lanes. */
static inline __m128i mask16(__m256 m) {
  __m256i w = _mm256_castps_si256(m);
  return _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}
/* ckv_f16_round_up of 8 lanes, by quant.h's own steps: clamp (max_ps(NaN, 0) = 0, as fmaxf),
 * F16C round-to-nearest-even (= ckv_f32_to_f16), then one step up where that fell below v. */
static inline __m128i f16_up8(__m256 v) {
  const __m256 zero = _mm256_setzero_ps(), big = _mm256_set1_ps(CKV_F16_MAX);
  v = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(v, zero), big), zero);
  __m128i h = _mm256_cvtps_ph(v, CKV_F16_RNE);
  return _mm_sub_epi16(h, mask16(_mm256_cmp_ps(_mm256_cvtph_ps(h), v, _CMP_LT_OQ)));
}
/* ckv_f16_round_down of 8 lanes (v not NaN), the same way: one step towards -inf where RNE went above v. */
static inline __m128i f16_down8(__m256 v) {
  const __m256 zero = _mm256_setzero_ps(), big = _mm256_set1_ps(CKV_F16_MAX), nbig = _mm256_set1_ps(-CKV_F16_MAX);
  v = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(v, nbig), big), zero);
  __m128i h = _mm256_cvtps_ph(v, CKV_F16_RNE);
  __m128i over = mask16(_mm256_cmp_ps(_mm256_cvtph_ps(h), v, _CMP_GT_OQ));
  __m128i neg = _mm_srai_epi16(h, 15); /* -1 where the sign bit is set */
  __m128i down = _mm_add_epi16(h, _mm_sub_epi16(_mm_set1_epi16(-1), _mm_add_epi16(neg, neg))); /* neg ? h+1 : h-1 */
  down = _mm_blendv_epi8(down, _mm_set1_epi16((short)0x8001), _mm_cmpeq_epi16(h, _mm_setzero_si128()));
  return _mm_blendv_epi8(h, down, over);
}
/* ckv_inv_scale of 8 widened scales. */
static inline __m256 inv8(__m256 sf) {
  __m256 pos = _mm256_cmp_ps(sf, _mm256_setzero_ps(), _CMP_GT_OQ);
  return _mm256_and_ps(pos, _mm256_div_ps(_mm256_set1_ps(1.0f), sf));
}
/* ckv_qa_params of 8 groups. */
static inline void qa_params8(__m256 mn, __m256 mx, __m256 lv, __m128i *s16, __m128i *z16, __m256 *zf, __m256 *inv) {
  __m256 ok = _mm256_cmp_ps(mn, mx, _CMP_LE_OQ); /* !(mn <= mx): both 0 */
  mn = _mm256_and_ps(mn, ok);
  mx = _mm256_and_ps(mx, ok);
  *z16 = f16_down8(mn);
  *zf = _mm256_cvtph_ps(*z16);
  __m256 top = _mm256_min_ps(mx, _mm256_set1_ps(CKV_F16_MAX));
  *s16 = f16_up8(_mm256_div_ps(_mm256_sub_ps(top, *zf), lv));
  *inv = inv8(_mm256_cvtph_ps(*s16));
}
static void a_qa_params(const float *mn, const float *mx, size_t n, uint32_t bits, uint16_t *ret_scale,
                        uint16_t *ret_zero, float *ret_zf, float *ret_inv) {
  size_t i = 0;
  __m256 lv = _mm256_set1_ps((float)ckv_qa_levels(bits));
  for (; i + 8 <= n; i += 8) {
    __m128i s16, z16;
    __m256 zf, inv;
    qa_params8(_mm256_loadu_ps(mn + i), _mm256_loadu_ps(mx + i), lv, &s16, &z16, &zf, &inv);
    _mm_storeu_si128((__m128i *)(ret_scale + i), s16);
    _mm_storeu_si128((__m128i *)(ret_zero + i), z16);
    _mm256_storeu_ps(ret_zf + i, zf);
    _mm256_storeu_ps(ret_inv + i, inv);
  }
  SC.qa_params(mn + i, mx + i, n - i, bits, ret_scale + i, ret_zero + i, ret_zf + i, ret_inv + i);
}
static void a_quant_i8(const float *x, float inv, int8_t *dst, size_t n) {
  size_t i = 0;
  __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi); /* max_ps(NaN, lo) = lo, as fmaxf */
    __m256i w = _mm256_cvtps_epi32(r);
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64((__m128i *)(dst + i), _mm_packs_epi16(p, p));
  }
  if (i < n) SC.quant_i8(x + i, inv, dst + i, n - i);
}
static void a_quant_u(const float *x, const float *zero, const float *inv, uint32_t bits, uint8_t *codes, size_t n) {
  size_t i = 0;
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_set1_ps((float)ckv_qa_levels(bits));
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(zero + i));
    __m256 r = _mm256_round_ps(_mm256_mul_ps(d, _mm256_loadu_ps(inv + i)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
    __m256i w = _mm256_cvtps_epi32(r);
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64((__m128i *)(codes + i), _mm_packus_epi16(p, p));
  }
  if (i < n) SC.quant_u(x + i, zero + i, inv + i, bits, codes + i, n - i);
}
/* Horizontal max of 8 lanes that hold no NaN. */
static inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
/* max |x[i]|, NaN ignored (max_ps(NaN, m) = m), no libm. */
static inline float group_absmax(const float *x, size_t n) {
  size_t i = 0;
  __m256 m = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
  float r = hmax8(m);
  for (; i < n; i++) {
    float a = fabsf(x[i]);
    r = a > r ? a : r;
  }
  return r;
}
/* Up to 8 groups at a time: their absmax, then their 8 scales in one F16C step, then the codes. */
void ckv_avx2_quant_i8_groups(const float *x, size_t n, size_t gl, int8_t *codes, uint16_t *scales) {
  size_t ng = (n + gl - 1) / gl;
  for (size_t q0 = 0; q0 < ng; q0 += 8) {
    size_t nb = ng - q0 < 8 ? ng - q0 : 8;
    float am[8] = {0}, inv[8];
    uint16_t s16[8];
    for (size_t k = 0; k < nb; k++) {
      size_t lo = (q0 + k) * gl;
      am[k] = group_absmax(x + lo, n - lo < gl ? n - lo : gl);
    }
    __m128i h = f16_up8(_mm256_div_ps(_mm256_loadu_ps(am), _mm256_set1_ps(127.0f)));
    _mm_storeu_si128((__m128i *)s16, h);
    _mm256_storeu_ps(inv, inv8(_mm256_cvtph_ps(h)));
    for (size_t k = 0; k < nb; k++) {
      size_t lo = (q0 + k) * gl;
      scales[q0 + k] = s16[k];
      a_quant_i8(x + lo, inv[k], codes + lo, n - lo < gl ? n - lo : gl);
    }
  }
}
/* 8 halves widened exactly (FP16 by F16C, BF16 by a shift). */
static inline __m256 widen8(const uint16_t *h, int bf16) {
  __m128i w = _mm_loadu_si128((const __m128i *)h);
  return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16)) : _mm256_cvtph_ps(w);
}
/* The bits of the largest magnitude among cnt FP16 / BF16 halves, NaN ignored.  Sign-magnitude halves
 * order as their magnitudes do, so this is the integer max of (bits & 0x7fff) over the halves at or below
 * infinity's bits: widened, exactly the absmax that max_ps finds over the floats, 16 halves a step. */
static inline __attribute__((always_inline)) uint16_t absmax_bits(const uint16_t *h, size_t cnt, const int bf16) {
  const uint16_t inf = bf16 ? 0x7f80u : 0x7c00u;
  const __m256i mag = _mm256_set1_epi16(0x7fff), vinf = _mm256_set1_epi16((short)inf);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0; /* two chains */
  size_t i = 0;
  for (; i + 32 <= cnt; i += 32) { /* after the mask every half is a non-negative int16: a signed compare */
    __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i)), mag);
    __m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i + 16)), mag);
    m0 = _mm256_max_epu16(m0, _mm256_andnot_si256(_mm256_cmpgt_epi16(a, vinf), a));
    m1 = _mm256_max_epu16(m1, _mm256_andnot_si256(_mm256_cmpgt_epi16(b, vinf), b));
  }
  for (; i + 16 <= cnt; i += 16) {
    __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i)), mag);
    m0 = _mm256_max_epu16(m0, _mm256_andnot_si256(_mm256_cmpgt_epi16(a, vinf), a));
  }
  m0 = _mm256_max_epu16(m0, m1);
  __m128i x = _mm_max_epu16(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
  x = _mm_minpos_epu16(_mm_xor_si128(x, _mm_set1_epi32(-1))); /* the max, as the min of the complements */
  uint16_t r = (uint16_t)~(uint32_t)_mm_cvtsi128_si32(x);
  for (; i < cnt; i++) { /* the group's tail */
    uint16_t a = h[i] & 0x7fffu;
    r = a <= inf && a > r ? a : r;
  }
  return r;
}
/* Two passes over each group of halves (L1-resident): absmax, then codes; groups whose length is not a
 * multiple of 8 widen through a small FP32 buffer and take the FP32 route. */
static inline __attribute__((always_inline)) void q8_groups_h(const uint16_t *h, const int bf16, size_t n, size_t gl,
                                                               int8_t *codes, uint16_t *scales) {
  size_t ng = (n + gl - 1) / gl;
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (size_t q0 = 0; q0 < ng; q0 += 8) {
    size_t nb = ng - q0 < 8 ? ng - q0 : 8;
    float am[8] = {0}, inv[8];
    uint16_t s16[8];
    for (size_t k = 0; k < nb; k++) {
      size_t l0 = (q0 + k) * gl, cnt = n - l0 < gl ? n - l0 : gl;
      uint16_t a = absmax_bits(h + l0, cnt, bf16);
      am[k] = bf16 ? ckv_bf16_to_f32(a) : _cvtsh_ss(a);
    }
    __m128i hs = f16_up8(_mm256_div_ps(_mm256_loadu_ps(am), _mm256_set1_ps(127.0f)));
    _mm_storeu_si128((__m128i *)s16, hs);
    _mm256_storeu_ps(inv, inv8(_mm256_cvtph_ps(hs)));
    for (size_t k = 0; k < nb; k++) {
      size_t l0 = (q0 + k) * gl, cnt = n - l0 < gl ? n - l0 : gl, i = 0;
      scales[q0 + k] = s16[k];
      __m256 vi = _mm256_set1_ps(inv[k]);
      for (; i + 16 <= cnt; i += 16) {
        __m256 r0 = _mm256_round_ps(_mm256_mul_ps(widen8(h + l0 + i, bf16), vi), CKV_F16_RNE);
        __m256 r1 = _mm256_round_ps(_mm256_mul_ps(widen8(h + l0 + i + 8, bf16), vi), CKV_F16_RNE);
        r0 = _mm256_min_ps(_mm256_max_ps(r0, lo), hi); /* max_ps(NaN, lo) = lo, as fmaxf */
        r1 = _mm256_min_ps(_mm256_max_ps(r1, lo), hi);
        __m256i w0 = _mm256_cvtps_epi32(r0), w1 = _mm256_cvtps_epi32(r1);
        __m128i p0 = _mm_packs_epi32(_mm256_castsi256_si128(w0), _mm256_extracti128_si256(w0, 1));
        __m128i p1 = _mm_packs_epi32(_mm256_castsi256_si128(w1), _mm256_extracti128_si256(w1, 1));
        _mm_storeu_si128((__m128i *)(codes + l0 + i), _mm_packs_epi16(p0, p1));
      }
      for (; i < cnt; i++) {
        float v = bf16 ? ckv_bf16_to_f32(h[l0 + i]) : _cvtsh_ss(h[l0 + i]);
        codes[l0 + i] = ckv_q8_code(v, inv[k]);
      }
    }
  }
}
/* Specialised per input type, so the inner loops carry no branch. */
void ckv_avx2_quant_i8_groups_h(const uint16_t *h, int bf16, size_t n, size_t gl, int8_t *codes, uint16_t *scales) {
  if (bf16)
    q8_groups_h(h, 1, n, gl, codes, scales);
  else
    q8_groups_h(h, 0, n, gl, codes, scales);
}
/* Lane k of the result = min (max) over the 8 lanes of v[k]: 8 reductions at once. */
static inline __m256 reduce8(const __m256 *v, int is_max) {
#define CKV_RED(a, b) (is_max ? _mm256_max_ps((a), (b)) : _mm256_min_ps((a), (b)))
  /* pairwise: lanes from v[2i] and v[2i+1] interleaved, then halves, then 128-bit lanes */
  __m256 a0 = CKV_RED(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));
  __m256 a1 = CKV_RED(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));
  __m256 a2 = CKV_RED(_mm256_unpacklo_ps(v[4], v[5]), _mm256_unpackhi_ps(v[4], v[5]));
  __m256 a3 = CKV_RED(_mm256_unpacklo_ps(v[6], v[7]), _mm256_unpackhi_ps(v[6], v[7]));
  /* a0 lanes: [v0 x2, v1 x2 | v0 x2, v1 x2] (per 128-bit lane: v0 l0l1/l2l3 pairs) */
  __m256 b0 = CKV_RED(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a0), _mm256_castps_pd(a1))),
                      _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a0), _mm256_castps_pd(a1))));
  __m256 b1 = CKV_RED(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a2), _mm256_castps_pd(a3))),
                      _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a2), _mm256_castps_pd(a3))));
  /* b0 per 128-bit lane: [v0 v1 v2 v3] partials; the two 128-bit lanes hold the two halves */
  __m256 c = CKV_RED(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
#undef CKV_RED
  return c;
}
/* 32 codes (four vectors of 8 int32, elements 0..7, 8..15, ...) packed into row: 16 bytes (4 bits)
 * or 8 (2 bits).  The packs saturate: a code below 0 (NaN and -Inf convert to INT32_MIN) becomes 0,
 * so callers clamp only from above.  256-bit packs keep runs of 4 elements together: per 128-bit
 * lane L the bytes are w0[4L..4L+3], w1[4L..], w2[4L..], w3[4L..]; the last steps interleave the lanes. */
static inline void pack32(__m256i w0, __m256i w1, __m256i w2, __m256i w3, uint32_t bits, uint8_t *row) {
  __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(w0, w1), _mm256_packs_epi32(w2, w3));
  if (bits == 4) { /* per 16-bit lane c0 | c1 << 8 -> c0 | c1 << 4 */
    __m256i x = _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi16(b, 4)), _mm256_set1_epi16(0x00ff));
    __m128i l0 = _mm256_castsi256_si128(x), l1 = _mm256_extracti128_si256(x, 1); /* 32-bit units: w_j's lo / hi pairs */
    _mm_storeu_si128((__m128i *)row, _mm_packus_epi16(_mm_unpacklo_epi32(l0, l1), _mm_unpackhi_epi32(l0, l1)));
  } else { /* per 32-bit lane c0 | c1 << 8 | c2 << 16 | c3 << 24 -> c0 | c1 << 2 | c2 << 4 | c3 << 6 */
    __m256i x = _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi32(b, 6)), _mm256_set1_epi32(0x000f000f));
    x = _mm256_and_si256(_mm256_or_si256(x, _mm256_srli_epi32(x, 12)), _mm256_set1_epi32(0xff));
    x = _mm256_packus_epi16(_mm256_packus_epi32(x, x), x); /* per lane: its 4 bytes first */
    __m128i l = _mm_unpacklo_epi8(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64((__m128i *)row, l);
  }
}
/* clamp(rint((x - z) * inv), 0, hi) of 8 elements as int32. */
static inline __m256i qa_code8(const float *x, __m256 z, __m256 v, __m256 hi) {
  __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), z), v), CKV_F16_RNE);
  return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), hi)); /* max_ps(NaN, 0) = 0, as fmaxf */
}
/* Batches of 8 groups: 8 ranges reduced together, their params in one F16C step; groups of exactly
 * 32 are coded and packed in registers, other groups code by code. */
void ckv_avx2_quant_u_groups(const float *x, size_t n, size_t gl, uint32_t bits, uint16_t *params, uint8_t *row) {
  size_t ng = (n + gl - 1) / gl;
  const __m256 hi = _mm256_set1_ps((float)ckv_qa_levels(bits));
  for (size_t q0 = 0; q0 < ng; q0 += 8) {
    size_t nb = ng - q0 < 8 ? ng - q0 : 8;
    __m256 vmn[8], vmx[8];
    float tmn[8], tmx[8]; /* the scalar tails of each group */
    for (size_t k = 0; k < 8; k++) {
      vmn[k] = _mm256_set1_ps(INFINITY), vmx[k] = _mm256_set1_ps(-INFINITY);
      tmn[k] = INFINITY, tmx[k] = -INFINITY;
    }
    for (size_t k = 0; k < nb; k++) {
      size_t lo = (q0 + k) * gl, e = n - lo < gl ? n : lo + gl, i = lo;
      for (; i + 8 <= e; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        vmn[k] = _mm256_min_ps(v, vmn[k]); /* NaN in v: ignored */
        vmx[k] = _mm256_max_ps(v, vmx[k]);
      }
      for (; i < e; i++) {
        tmn[k] = x[i] < tmn[k] ? x[i] : tmn[k];
        tmx[k] = x[i] > tmx[k] ? x[i] : tmx[k];
      }
    }
    __m256 mn = _mm256_min_ps(reduce8(vmn, 0), _mm256_loadu_ps(tmn)), mx = _mm256_max_ps(reduce8(vmx, 1), _mm256_loadu_ps(tmx));
    __m128i hs, hz;
    __m256 vz, vi;
    qa_params8(mn, mx, hi, &hs, &hz, &vz, &vi);
    float zf[8], inv[8];
    uint16_t s16[8], z16[8];
    _mm_storeu_si128((__m128i *)s16, hs);
    _mm_storeu_si128((__m128i *)z16, hz);
    _mm256_storeu_ps(zf, vz);
    _mm256_storeu_ps(inv, vi);
    for (size_t k = 0; k < nb; k++) {
      size_t lo = (q0 + k) * gl, e = n - lo < gl ? n : lo + gl;
      params[2 * (q0 + k)] = s16[k];
      params[2 * (q0 + k) + 1] = z16[k];
      __m256 z = _mm256_set1_ps(zf[k]), v = _mm256_set1_ps(inv[k]);
      if (e - lo == 32 && (lo * bits) % 8 == 0) {
        pack32(qa_code8(x + lo, z, v, hi), qa_code8(x + lo + 8, z, v, hi), qa_code8(x + lo + 16, z, v, hi),
               qa_code8(x + lo + 24, z, v, hi), bits, row + lo * bits / 8);
        continue;
      }
      for (size_t i = lo; i < e; i++) ckv_pack_code(row, i, bits, ckv_qa_code(x[i], zf[k], inv[k], bits));
    }
  }
}

/* rint((x - z) * inv) of 8 widened elements as int32, clamped from above only (min_ps(hi, NaN) is
 * NaN, which converts to INT32_MIN like -Inf and any negative code): for pack32, whose saturating
 * packs make every code below 0 a 0, as ckv_qa_code's clamp does. */
static inline __m256i qa_code8v(__m256 x, __m256 z, __m256 v, __m256 hi) {
  return _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_mul_ps(_mm256_sub_ps(x, z), v)));
}
/* ckv_avx2_quant_u_groups of a FP16 / BF16 row in groups of 32, widened in registers: per 8
 * groups one chained min / max per group (the accumulator second: NaN ignored), the 8 ranges
 * reduced together, one F16C step for their params, then the codes packed 32 at a time. */
static inline __attribute__((always_inline)) void qu32_groups_h(const uint16_t *h, const int bf16, size_t n,
                                                                uint32_t bits, uint16_t *params, uint8_t *row) {
  const __m256 hi = _mm256_set1_ps((float)ckv_qa_levels(bits));
  const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
  for (size_t e0 = 0; e0 < n; e0 += 256) {
    size_t nb = (n - e0) / 32 < 8 ? (n - e0) / 32 : 8;
    __m256 vmn[8], vmx[8];
    for (size_t k = 0; k < 8; k++) {
      vmn[k] = pinf, vmx[k] = ninf;
      if (k >= nb) continue;
      const uint16_t *x = h + e0 + 32 * k;
      __m256 a = widen8(x, bf16), b = widen8(x + 8, bf16), c = widen8(x + 16, bf16), d = widen8(x + 24, bf16);
      vmn[k] = _mm256_min_ps(d, _mm256_min_ps(c, _mm256_min_ps(b, _mm256_min_ps(a, pinf))));
      vmx[k] = _mm256_max_ps(d, _mm256_max_ps(c, _mm256_max_ps(b, _mm256_max_ps(a, ninf))));
    }
    __m128i hs, hz;
    __m256 vz, vi;
    qa_params8(reduce8(vmn, 0), reduce8(vmx, 1), hi, &hs, &hz, &vz, &vi);
    uint16_t sz[16];
    float zf[8], inv[8];
    _mm_storeu_si128((__m128i *)sz, _mm_unpacklo_epi16(hs, hz)); /* scale, zero per group */
    _mm_storeu_si128((__m128i *)(sz + 8), _mm_unpackhi_epi16(hs, hz));
    memcpy(params + 2 * (e0 / 32), sz, nb * 2 * sizeof(uint16_t));
    _mm256_storeu_ps(zf, vz);
    _mm256_storeu_ps(inv, vi);
    for (size_t k = 0; k < nb; k++) {
      const uint16_t *x = h + e0 + 32 * k;
      __m256 z = _mm256_set1_ps(zf[k]), v = _mm256_set1_ps(inv[k]);
      pack32(qa_code8v(widen8(x, bf16), z, v, hi), qa_code8v(widen8(x + 8, bf16), z, v, hi),
             qa_code8v(widen8(x + 16, bf16), z, v, hi), qa_code8v(widen8(x + 24, bf16), z, v, hi), bits,
             row + (e0 + 32 * k) * bits / 8);
    }
  }
}
void ckv_avx2_quant_u32_groups_h(const uint16_t *h, int bf16, size_t n, uint32_t bits, uint16_t *params, uint8_t *row) {
  if (bf16)
    qu32_groups_h(h, 1, n, bits, params, row);
  else
    qu32_groups_h(h, 0, n, bits, params, row);
}

/* mn[i] = min(mn[i], h[i]), mx[i] = max(...) of a widened FP16 / BF16 row (NaN ignored: the
 * accumulator is the second operand, as fminf / fmaxf). */
static inline __attribute__((always_inline)) void minmax_h(const uint16_t *h, const int bf16, float *mn, float *mx,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = widen8(h + i, bf16);
    _mm256_storeu_ps(mn + i, _mm256_min_ps(x, _mm256_loadu_ps(mn + i)));
    _mm256_storeu_ps(mx + i, _mm256_max_ps(x, _mm256_loadu_ps(mx + i)));
  }
  for (; i < n; i++) {
    float x = bf16 ? ckv_bf16_to_f32(h[i]) : _cvtsh_ss(h[i]);
    mn[i] = x < mn[i] ? x : mn[i];
    mx[i] = x > mx[i] ? x : mx[i];
  }
}
void ckv_avx2_minmax_h(const uint16_t *h, int bf16, float *mn, float *mx, size_t n) {
  if (bf16)
    minmax_h(h, 1, mn, mx, n);
  else
    minmax_h(h, 0, mn, mx, n);
}
/* minmax_h over rows, 32 columns at a time in four accumulator pairs (the rest: minmax_h per row). */
static inline __attribute__((always_inline)) void minmax_rows_h(const uint16_t *const *rows, size_t nrows,
                                                                const int bf16, float *mn, float *mx, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 lo[4], hi[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) lo[j] = _mm256_loadu_ps(mn + i + 8 * j), hi[j] = _mm256_loadu_ps(mx + i + 8 * j);
    for (size_t r = 0; r < nrows; r++)
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        __m256 x = widen8(rows[r] + i + 8 * j, bf16);
        lo[j] = _mm256_min_ps(x, lo[j]);
        hi[j] = _mm256_max_ps(x, hi[j]);
      }
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) _mm256_storeu_ps(mn + i + 8 * j, lo[j]), _mm256_storeu_ps(mx + i + 8 * j, hi[j]);
  }
  if (i < n)
    for (size_t r = 0; r < nrows; r++) minmax_h(rows[r] + i, bf16, mn + i, mx + i, n - i);
}
void ckv_avx2_minmax_rows_h(const uint16_t *const *rows, size_t nrows, int bf16, float *mn, float *mx, size_t n) {
  if (bf16)
    minmax_rows_h(rows, nrows, 1, mn, mx, n);
  else
    minmax_rows_h(rows, nrows, 0, mn, mx, n);
}
/* Codes of a widened FP16 / BF16 row with per-element zero / inverse scale, packed 32 at a time. */
static inline __attribute__((always_inline)) void quant_u_h(const uint16_t *h, const int bf16, const float *zero,
                                                            const float *inv, uint32_t bits, uint8_t *row, size_t n) {
  const __m256 hi = _mm256_set1_ps((float)ckv_qa_levels(bits));
  for (size_t i = 0; i + 32 <= n; i += 32) {
    __m256i w[4];
    for (int j = 0; j < 4; j++)
      w[j] = qa_code8v(widen8(h + i + 8 * j, bf16), _mm256_loadu_ps(zero + i + 8 * j), _mm256_loadu_ps(inv + i + 8 * j), hi);
    pack32(w[0], w[1], w[2], w[3], bits, row + i * bits / 8);
  }
}
void ckv_avx2_quant_u_h(const uint16_t *h, int bf16, const float *zero, const float *inv, uint32_t bits, uint8_t *row,
                        size_t n) {
  if (bf16)
    quant_u_h(h, 1, zero, inv, bits, row, n);
  else
    quant_u_h(h, 0, zero, inv, bits, row, n);
}

/* acc[i] += |widened h[i]| (pruning's channel magnitudes), element by element: the scalar sums. */
static inline __attribute__((always_inline)) void absadd_h(const uint16_t *h, const int bf16, float *acc, size_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_andnot_ps(sign, widen8(h + i, bf16))));
  for (; i < n; i++) acc[i] += fabsf(bf16 ? ckv_bf16_to_f32(h[i]) : _cvtsh_ss(h[i]));
}
void ckv_avx2_absadd_h(const uint16_t *h, int bf16, float *acc, size_t n) {
  if (bf16)
    absadd_h(h, 1, acc, n);
  else
    absadd_h(h, 0, acc, n);
}

/* ---- committed rows back to FP32 in one pass (dequant.c), 32 codes a step ---- */
/* The 32 codes of row (4 or 2 bits) as four vectors of 8 floats. */
static inline void codes32(const uint8_t *row, uint32_t bits, __m256 c[4]) {
  __m128i lo, hi;
  unpack32(row, bits, &lo, &hi);
  c[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  c[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  c[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  c[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}
/* dst[i] = ckv_mul_add(code i, widened scale[i], widened zero[i]) (keys: per-channel params). */
void ckv_avx2_dequant_u_cols(const uint8_t *row, uint32_t bits, const uint16_t *scale, const uint16_t *zero, float *dst,
                             size_t n) {
  for (size_t i = 0; i + 32 <= n; i += 32) {
    __m256 c[4];
    codes32(row + i * bits / 8, bits, c);
    for (int j = 0; j < 4; j++) {
      __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scale + i + 8 * j)));
      __m256 z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(zero + i + 8 * j)));
      _mm256_storeu_ps(dst + i + 8 * j, _mm256_add_ps(_mm256_mul_ps(c[j], s), z));
    }
  }
}
/* dst[i] = ckv_mul_add(code i, scale, zero) of its group of 32 ((scale, zero) pairs in params: values). */
void ckv_avx2_dequant_u32_groups(const uint8_t *row, uint32_t bits, const uint16_t *params, float *dst, size_t n) {
  for (size_t i = 0; i + 32 <= n; i += 32) {
    __m256 c[4];
    codes32(row + i * bits / 8, bits, c);
    __m128 sz = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)params[i / 16] | (uint32_t)params[i / 16 + 1] << 16)));
    __m256 s = _mm256_broadcastss_ps(sz), z = _mm256_broadcastss_ps(_mm_movehdup_ps(sz));
    for (int j = 0; j < 4; j++) _mm256_storeu_ps(dst + i + 8 * j, _mm256_add_ps(_mm256_mul_ps(c[j], s), z));
  }
}

const ckv_rowops ckv_rowops_avx2 = {
    .name = "avx2",
    .cvt_f16 = a_cvt_f16,
    .cvt_bf16 = a_cvt_bf16,
    .cvt_i8 = a_cvt_i8,
    .cvt_codes = a_cvt_codes,
    .affine = a_affine,
    .mul = a_mul,
    .dot = a_dot,
    .dotn = a_dotn,
    .axpyn = a_axpyn,
    .axpy = a_axpy,
    .exp_sub = a_exp_sub,
    .absmax = a_absmax,
    .range = a_range,
    .minmax = a_minmax,
    .qa_params = a_qa_params,
    .quant_i8 = a_quant_i8,
    .quant_u = a_quant_u,
    .quant_i8_groups = ckv_avx2_quant_i8_groups,
    .quant_u_groups = ckv_avx2_quant_u_groups,
    .quant_i8_groups_h = ckv_avx2_quant_i8_groups_h,
    .quant_u32_groups_h = ckv_avx2_quant_u32_groups_h,
    .minmax_h = ckv_avx2_minmax_h,
    .minmax_rows_h = ckv_avx2_minmax_rows_h,
    .quant_u_h = ckv_avx2_quant_u_h,
    .dequant_u_cols = ckv_avx2_dequant_u_cols,
    .absadd_h = ckv_avx2_absadd_h,
    .dequant_u32_groups = ckv_avx2_dequant_u32_groups,
};
