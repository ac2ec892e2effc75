/* rows_avx512.c - the row primitives with AVX-512 F/BW/VL (16 floats a step).
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c and called only
 * after dispatch.c checked the CPU.  Quantizing primitives do exactly the
 * scalar operations lane by lane (same bytes); tails use the AVX2 table,
 * called only when there is one (a call per short group adds up). */
#include <immintrin.h>
#include <math.h>

#include "kernels/quant.h"
#include "kernels/rowops.h"

#define A2 ckv_rowops_avx2

static void z_cvt_f16(const uint16_t *src, float *dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
  if (i < n) A2.cvt_f16(src + i, dst + i, n - i);
}
static void z_cvt_bf16(const uint16_t *src, float *dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
  if (i < n) A2.cvt_bf16(src + i, dst + i, n - i);
}
static void z_cvt_i8(const int8_t *src, float s, float *dst, size_t n) {
  size_t i = 0;
  __m512 vs = _mm512_set1_ps(s);
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(w), vs));
  }
  if (i < n) A2.cvt_i8(src + i, s, dst + i, n - i);
}
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
static void z_cvt_codes(const uint8_t *row, uint32_t bits, float *dst, size_t n) {
  size_t i = 0;
  if (bits != 4 && bits != 2) { /* 3- and 1-bit rows: the scalar unpacker */
    A2.cvt_codes(row, bits, dst, n);
    return;
  }
  for (; i + 32 <= n; i += 32) {
    __m128i lo, hi;
    unpack32(row + i * bits / 8, bits, &lo, &hi);
    _mm512_storeu_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)));
    _mm512_storeu_ps(dst + i + 16, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)));
  }
  if (i < n) A2.cvt_codes(row + i * bits / 8, bits, dst + i, n - i);
}
static void z_affine(float *x, float s, float z, size_t n) {
  size_t i = 0;
  __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(z);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), vz));
  if (i < n) A2.affine(x + i, s, z, n - i);
}
static void z_mul(const float *a, const float *b, float *y, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) A2.mul(a + i, b + i, y + i, n - i);
}
static float z_dot(const float *a, const float *b, size_t n) {
  size_t i = 0;
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) + A2.dot(a + i, b + i, n - i);
}
static void z_dotn(const float *q, size_t nq, size_t ldq, const float *k, size_t n, float *out, size_t ldo) {
  size_t i = 0;
  __mmask16 tail = (__mmask16)((1u << (n % 16)) - 1u);
  size_t full = n / 16 * 16;
  for (; i + 4 <= nq; i += 4) {
    const float *q0 = q + i * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t d = 0; d < full; d += 16) {
      __m512 kv = _mm512_loadu_ps(k + d);
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d), kv, s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + d), kv, s1);
      s2 = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + d), kv, s2);
      s3 = _mm512_fmadd_ps(_mm512_loadu_ps(q3 + d), kv, s3);
    }
    if (tail) {
      __m512 kv = _mm512_maskz_loadu_ps(tail, k + full);
      s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q0 + full), kv, s0);
      s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q1 + full), kv, s1);
      s2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q2 + full), kv, s2);
      s3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q3 + full), kv, s3);
    }
    out[i * ldo] = _mm512_reduce_add_ps(s0);
    out[(i + 1) * ldo] = _mm512_reduce_add_ps(s1);
    out[(i + 2) * ldo] = _mm512_reduce_add_ps(s2);
    out[(i + 3) * ldo] = _mm512_reduce_add_ps(s3);
  }
  for (; i < nq; i++) out[i * ldo] = z_dot(q + i * ldq, k, n);
}
static void z_axpyn(const float *a, size_t na, size_t lda, const float *x, float *y, size_t ldy, size_t n) {
  size_t d = 0;
  for (; d + 16 <= n; d += 16) {
    __m512 xv = _mm512_loadu_ps(x + d);
    for (size_t i = 0; i < na; i++) {
      float *yi = y + i * ldy + d;
      _mm512_storeu_ps(yi, _mm512_fmadd_ps(_mm512_set1_ps(a[i * lda]), xv, _mm512_loadu_ps(yi)));
    }
  }
  if (d < n) A2.axpyn(a, na, lda, x + d, y + d, ldy, n - d);
}
static void z_axpy(float a, const float *x, float *y, size_t n) {
  size_t i = 0;
  __m512 va = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) A2.axpy(a, x + i, y + i, n - i);
}
static inline __m512 exp16(__m512 x) {
  __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  p = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  return _mm512_maskz_mov_ps((__mmask16)~zero, p);
}
static float z_exp_sub(float *x, float m, size_t n) {
  size_t i = 0;
  __m512 vm = _mm512_set1_ps(m), s = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m512 v = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(x + i, v);
    s = _mm512_add_ps(s, v);
  }
  return _mm512_reduce_add_ps(s) + A2.exp_sub(x + i, m, n - i);
}
static float z_absmax(const float *x, size_t n) {
  size_t i = 0;
  __m512 m = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m);
  return fmaxf(_mm512_reduce_max_ps(m), A2.absmax(x + i, n - i));
}
static void z_range(const float *x, size_t n, float *ret_mn, float *ret_mx) {
  size_t i = 0;
  __m512 mn = _mm512_set1_ps(INFINITY), mx = _mm512_set1_ps(-INFINITY);
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    mn = _mm512_min_ps(v, mn);
    mx = _mm512_max_ps(v, mx);
  }
  float tmn, tmx;
  A2.range(x + i, n - i, &tmn, &tmx);
  float vmn = _mm512_reduce_min_ps(mn), vmx = _mm512_reduce_max_ps(mx);
  *ret_mn = vmn < tmn ? vmn : tmn;
  *ret_mx = vmx > tmx ? vmx : tmx;
}
static void z_minmax(const float *x, float *mn, float *mx, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(mn + i, _mm512_min_ps(v, _mm512_loadu_ps(mn + i)));
    _mm512_storeu_ps(mx + i, _mm512_max_ps(v, _mm512_loadu_ps(mx + i)));
  }
  if (i < n) A2.minmax(x + i, mn + i, mx + i, n - i);
}
/* kernels/quant.h's rules, 16 groups at a time: F16C conversion is IEEE round-to-nearest-even,
 * like ckv_f32_to_f16, so the FP16 bits are the scalar ones. */
/* an immediate operand: a macro, not a variable, so -O0 builds compile */
#define CKV_F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* ckv_qa_params of 16 groups (kernels/quant.h's rules lane by lane). */
static inline void qa_params16(__m512 a, __m512 b, uint32_t bits, __m256i *ret_s16, __m256i *ret_z16, __m512 *ret_zf,
                               __m512 *ret_inv) {
  const __m512 zero = _mm512_setzero_ps(), big = _mm512_set1_ps(CKV_F16_MAX), nbig = _mm512_set1_ps(-CKV_F16_MAX);
  const __m512 lv = _mm512_set1_ps((float)ckv_qa_levels(bits)), one = _mm512_set1_ps(1.0f);
  __mmask16 ok = _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ);
  a = _mm512_maskz_mov_ps(ok, a);
  b = _mm512_maskz_mov_ps(ok, b);
  /* zero point: largest FP16 <= mn */
  __m512 v = _mm512_add_ps(_mm512_min_ps(_mm512_max_ps(a, nbig), big), zero);
  __m256i h = _mm512_cvtps_ph(v, CKV_F16_RNE);
  __mmask16 over = _mm512_cmp_ps_mask(_mm512_cvtph_ps(h), v, _CMP_GT_OQ);
  __m256i neg = _mm256_and_si256(h, _mm256_set1_epi16((short)0x8000));
  __mmask16 isneg = _mm256_cmpneq_epi16_mask(neg, _mm256_setzero_si256());
  __mmask16 iszero = _mm256_cmpeq_epi16_mask(h, _mm256_setzero_si256());
  __m256i down = _mm256_mask_add_epi16(_mm256_sub_epi16(h, _mm256_set1_epi16(1)), isneg, h, _mm256_set1_epi16(1));
  down = _mm256_mask_mov_epi16(down, iszero, _mm256_set1_epi16((short)0x8001));
  __m256i z16 = _mm256_mask_mov_epi16(h, over, down);
  __m512 zf = _mm512_cvtph_ps(z16);
  /* scale: smallest FP16 >= (min(mx, 65504) - zero) / levels */
  __m512 sc = _mm512_div_ps(_mm512_sub_ps(_mm512_min_ps(b, big), zf), lv);
  sc = _mm512_add_ps(_mm512_min_ps(_mm512_max_ps(sc, zero), big), zero);
  __m256i s16 = _mm512_cvtps_ph(sc, CKV_F16_RNE);
  __mmask16 under = _mm512_cmp_ps_mask(_mm512_cvtph_ps(s16), sc, _CMP_LT_OQ);
  s16 = _mm256_mask_add_epi16(s16, under, s16, _mm256_set1_epi16(1));
  __m512 sf = _mm512_cvtph_ps(s16);
  __mmask16 pos = _mm512_cmp_ps_mask(sf, zero, _CMP_GT_OQ);
  *ret_s16 = s16;
  *ret_z16 = z16;
  *ret_zf = zf;
  *ret_inv = _mm512_maskz_div_ps(pos, one, sf);
}
static void z_qa_params(const float *mn, const float *mx, size_t n, uint32_t bits, uint16_t *ret_scale,
                        uint16_t *ret_zero, float *ret_zf, float *ret_inv) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i s16, z16;
    __m512 zf, inv;
    qa_params16(_mm512_loadu_ps(mn + i), _mm512_loadu_ps(mx + i), bits, &s16, &z16, &zf, &inv);
    _mm256_storeu_si256((__m256i *)(ret_scale + i), s16);
    _mm256_storeu_si256((__m256i *)(ret_zero + i), z16);
    _mm512_storeu_ps(ret_zf + i, zf);
    _mm512_storeu_ps(ret_inv + i, inv);
  }
  ckv_rowops_scalar.qa_params(mn + i, mx + i, n - i, bits, ret_scale + i, ret_zero + i, ret_zf + i, ret_inv + i);
}
static void z_quant_i8(const float *x, float inv, int8_t *dst, size_t n) {
  size_t i = 0;
  __m512 vi = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (; i + 16 <= n; i += 16) {
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  if (i < n) A2.quant_i8(x + i, inv, dst + i, n - i);
}
static void z_quant_u(const float *x, const float *zero, const float *inv, uint32_t bits, uint8_t *codes, size_t n) {
  size_t i = 0;
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_set1_ps((float)ckv_qa_levels(bits));
  for (; i + 16 <= n; i += 16) {
    __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(zero + i));
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(d, _mm512_loadu_ps(inv + i)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  if (i < n) A2.quant_u(x + i, zero + i, inv + i, bits, codes + i, n - i);
}

/* ckv_f16_round_up of 8 lanes (quant.h's steps: clamp, F16C round-to-nearest-even, one step up where that
 * fell below), as rows_avx2.c's f16_up8. */
static inline __m128i z_f16_up8(__m256 v) {
  const __m256 zero = _mm256_setzero_ps(), big = _mm256_set1_ps(CKV_F16_MAX);
  v = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(v, zero), big), zero);
  __m128i h = _mm256_cvtps_ph(v, CKV_F16_RNE);
  __mmask8 under = _mm256_cmp_ps_mask(_mm256_cvtph_ps(h), v, _CMP_LT_OQ);
  return _mm_mask_add_epi16(h, under, h, _mm_set1_epi16(1));
}
/* 16 halves widened exactly (FP16 by F16C, BF16 by a shift). */
static inline __m512 widen16(const uint16_t *h, int bf16) {
  __m256i w = _mm256_loadu_si256((const __m256i *)h);
  return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16)) : _mm512_cvtph_ps(w);
}
/* The bits of the largest magnitude among cnt FP16 / BF16 halves, NaN ignored.  Sign-magnitude halves
 * order as their magnitudes do, so this is the integer max of (bits & 0x7fff) over the halves at or below
 * infinity's bits: widened, exactly the absmax that max_ps finds over the floats, 32 halves a step. */
static inline __attribute__((always_inline)) uint16_t z_absmax_bits(const uint16_t *h, size_t cnt, const int bf16) {
  const __m512i mag = _mm512_set1_epi16(0x7fff), inf = _mm512_set1_epi16(bf16 ? 0x7f80 : 0x7c00);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0; /* two chains */
  size_t i = 0;
  for (; i + 64 <= cnt; i += 64) {
    __m512i a = _mm512_and_si512(_mm512_loadu_si512(h + i), mag), b = _mm512_and_si512(_mm512_loadu_si512(h + i + 32), mag);
    m0 = _mm512_mask_max_epu16(m0, _mm512_cmple_epu16_mask(a, inf), m0, a);
    m1 = _mm512_mask_max_epu16(m1, _mm512_cmple_epu16_mask(b, inf), m1, b);
  }
  for (; i < cnt; i += 32) { /* the rest, a masked load (0 where past the group) */
    __mmask32 l = cnt - i >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (cnt - i)) - 1u);
    __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi16(l, h + i), mag);
    m0 = _mm512_mask_max_epu16(m0, _mm512_cmple_epu16_mask(a, inf), m0, a);
  }
  m0 = _mm512_max_epu16(m0, m1);
  __m256i y = _mm256_max_epu16(_mm512_castsi512_si256(m0), _mm512_extracti64x4_epi64(m0, 1));
  __m128i x = _mm_max_epu16(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  x = _mm_minpos_epu16(_mm_xor_si128(x, _mm_set1_epi32(-1))); /* the max, as the min of the complements */
  return (uint16_t)~(uint32_t)_mm_cvtsi128_si32(x);
}
/* rows_avx2.c's q8_groups_h 16 lanes at a time, for groups of a multiple of 16 elements (the others take the
 * AVX2 version): per 8 groups their absmax (z_absmax_bits, NaN ignored), their 8 scales in one F16C step, then
 * the codes (rint, clamp to [-127, 127]: NaN gives -127, as fmaxf(NaN, -127) does). */
static inline __attribute__((always_inline)) void z_q8_groups_h(const uint16_t *h, const int bf16, size_t n, size_t gl,
                                                                 int8_t *codes, uint16_t *scales) {
  size_t ng = (n + gl - 1) / gl;
  const __m512 hi = _mm512_set1_ps(127.0f);
  const __m512i lo = _mm512_set1_epi32(-127);
  for (size_t q0 = 0; q0 < ng; q0 += 8) {
    size_t nb = ng - q0 < 8 ? ng - q0 : 8;
    float am[8] = {0}, inv[8];
    uint16_t s16[8];
    for (size_t k = 0; k < nb; k++) {
      size_t l0 = (q0 + k) * gl, cnt = n - l0 < gl ? n - l0 : gl;
      uint16_t a = z_absmax_bits(h + l0, cnt, bf16);
      am[k] = bf16 ? ckv_bf16_to_f32(a) : _cvtsh_ss(a);
    }
    __m128i hs = z_f16_up8(_mm256_div_ps(_mm256_loadu_ps(am), _mm256_set1_ps(127.0f)));
    _mm_storeu_si128((__m128i *)s16, hs);
    __m256 sf = _mm256_cvtph_ps(hs);
    __mmask8 pos = _mm256_cmp_ps_mask(sf, _mm256_setzero_ps(), _CMP_GT_OQ);
    _mm256_storeu_ps(inv, _mm256_maskz_div_ps(pos, _mm256_set1_ps(1.0f), sf)); /* ckv_inv_scale */
    for (size_t k = 0; k < nb; k++) {
      size_t l0 = (q0 + k) * gl, cnt = n - l0 < gl ? n - l0 : gl, i = 0;
      scales[q0 + k] = s16[k];
      __m512 vi = _mm512_set1_ps(inv[k]);
      for (; i + 16 <= cnt; i += 16) { /* min_ps(hi, NaN) is NaN, which converts to INT_MIN, as do values below it */
        __m512 p = _mm512_min_ps(hi, _mm512_mul_ps(widen16(h + l0 + i, bf16), vi));
        __m512i r = _mm512_max_epi32(_mm512_cvt_roundps_epi32(p, CKV_F16_RNE), lo);
        _mm_storeu_si128((__m128i *)(codes + l0 + i), _mm512_cvtsepi32_epi8(r));
      }
      for (; i < cnt; i++) {
        float v = bf16 ? ckv_bf16_to_f32(h[l0 + i]) : _cvtsh_ss(h[l0 + i]);
        codes[l0 + i] = ckv_q8_code(v, inv[k]);
      }
    }
  }
}
static void z_quant_i8_groups_h(const uint16_t *h, int bf16, size_t n, size_t gl, int8_t *codes, uint16_t *scales) {
  if (gl % 16u) { /* groups straddling vectors: the AVX2 version */
    ckv_avx2_quant_i8_groups_h(h, bf16, n, gl, codes, scales);
    return;
  }
  if (bf16) /* specialised per input type, so the inner loops carry no branch */
    z_q8_groups_h(h, 1, n, gl, codes, scales);
  else
    z_q8_groups_h(h, 0, n, gl, codes, scales);
}

/* ---- committed rows straight from FP16 / BF16 halves (move.c's fused path) ---- */
/* min / max of a widened row into accumulators (the accumulator second: NaN ignored). */
static inline __attribute__((always_inline)) void minmax_h(const uint16_t *h, const int bf16, float *mn, float *mx,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = widen16(h + i, bf16);
    _mm512_storeu_ps(mn + i, _mm512_min_ps(x, _mm512_loadu_ps(mn + i)));
    _mm512_storeu_ps(mx + i, _mm512_max_ps(x, _mm512_loadu_ps(mx + i)));
  }
  if (i < n) ckv_avx2_minmax_h(h + i, bf16, mn + i, mx + i, n - i);
}
static void z_minmax_h(const uint16_t *h, int bf16, float *mn, float *mx, size_t n) {
  if (bf16)
    minmax_h(h, 1, mn, mx, n);
  else
    minmax_h(h, 0, mn, mx, n);
}
/* minmax_h over rows, 64 columns at a time in four accumulator pairs (the rest: minmax_h per row). */
static inline __attribute__((always_inline)) void minmax_rows_h(const uint16_t *const *rows, size_t nrows,
                                                                const int bf16, float *mn, float *mx, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 lo[4], hi[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) lo[j] = _mm512_loadu_ps(mn + i + 16 * j), hi[j] = _mm512_loadu_ps(mx + i + 16 * j);
    for (size_t r = 0; r < nrows; r++)
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        __m512 x = widen16(rows[r] + i + 16 * j, bf16);
        lo[j] = _mm512_min_ps(x, lo[j]);
        hi[j] = _mm512_max_ps(x, hi[j]);
      }
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) _mm512_storeu_ps(mn + i + 16 * j, lo[j]), _mm512_storeu_ps(mx + i + 16 * j, hi[j]);
  }
  if (i < n)
    for (size_t r = 0; r < nrows; r++) minmax_h(rows[r] + i, bf16, mn + i, mx + i, n - i);
}
static void z_minmax_rows_h(const uint16_t *const *rows, size_t nrows, int bf16, float *mn, float *mx, size_t n) {
  if (bf16)
    minmax_rows_h(rows, nrows, 1, mn, mx, n);
  else
    minmax_rows_h(rows, nrows, 0, mn, mx, n);
}
/* rint((x - z) * inv) clamped to [0, hi] as int32: min_ps(hi, NaN) is NaN, which converts to
 * INT32_MIN like -Inf and every negative code, and max_epi32 makes those 0, as ckv_qa_code's clamp. */
static inline __m512i qa_code16(__m512 x, __m512 z, __m512 v, __m512 hi) {
  return _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_mul_ps(_mm512_sub_ps(x, z), v))),
                          _mm512_setzero_si512());
}
/* 32 codes (elements 0..15 in w0, 16..31 in w1, each 0..2^bits-1) packed into row as ckv_pack_codes. */
static inline void pack32z(__m512i w0, __m512i w1, uint32_t bits, uint8_t *row) {
  if (bits == 4) { /* per 64-bit lane c_even | c_odd << 32 -> c_even | c_odd << 4 in its low byte */
    __m512i x0 = _mm512_or_si512(w0, _mm512_srli_epi64(w0, 28)), x1 = _mm512_or_si512(w1, _mm512_srli_epi64(w1, 28));
    _mm_storeu_si128((__m128i *)row, _mm_unpacklo_epi64(_mm512_cvtepi64_epi8(x0), _mm512_cvtepi64_epi8(x1)));
  } else { /* per 32-bit lane of bytes c0 | c1 << 8 | c2 << 16 | c3 << 24 -> c0 | c1 << 2 | c2 << 4 | c3 << 6 */
    __m256i b = _mm256_setr_m128i(_mm512_cvtepi32_epi8(w0), _mm512_cvtepi32_epi8(w1));
    b = _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi32(b, 6)), _mm256_set1_epi32(0x000f000f));
    b = _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi32(b, 12)), _mm256_set1_epi32(0xff));
    _mm_storel_epi64((__m128i *)row, _mm256_cvtepi32_epi8(b));
  }
}
static inline __attribute__((always_inline)) void quant_u_h(const uint16_t *h, const int bf16, const float *zero,
                                                            const float *inv, uint32_t bits, uint8_t *row, size_t n) {
  const __m512 hi = _mm512_set1_ps((float)ckv_qa_levels(bits));
  for (size_t i = 0; i + 32 <= n; i += 32)
    pack32z(qa_code16(widen16(h + i, bf16), _mm512_loadu_ps(zero + i), _mm512_loadu_ps(inv + i), hi),
            qa_code16(widen16(h + i + 16, bf16), _mm512_loadu_ps(zero + i + 16), _mm512_loadu_ps(inv + i + 16), hi), bits,
            row + i * bits / 8);
}
static void z_quant_u_h(const uint16_t *h, int bf16, const float *zero, const float *inv, uint32_t bits, uint8_t *row,
                        size_t n) {
  if (bf16)
    quant_u_h(h, 1, zero, inv, bits, row, n);
  else
    quant_u_h(h, 0, zero, inv, bits, row, n);
}
/* Lane k of the result (k < 16) = min (max) over the 16 lanes of v[k]: four levels of pairwise
 * folds (within 128-bit lanes by unpack, then across them by shuffle_f32x4). */
static inline __m512 reduce16(const __m512 *v, int is_max) {
#define CKV_RED(a, b) (is_max ? _mm512_max_ps((a), (b)) : _mm512_min_ps((a), (b)))
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; i++) /* per 128-bit lane: v[2i] at 0, 2; v[2i+1] at 1, 3 */
    a[i] = CKV_RED(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int j = 0; j < 4; j++) { /* per 128-bit lane L: groups 4j..4j+3, each over lane L */
    __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);
    b[j] = CKV_RED(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int k = 0; k < 2; k++) /* lanes: b[2k] over L0+L1, over L2+L3, b[2k+1] the same */
    c[k] = CKV_RED(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88), _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xdd));
  /* lane L: b[L] over all four lanes, i.e. groups 4L..4L+3 */
  __m512 d = CKV_RED(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
#undef CKV_RED
  return d;
}
/* quant_u_groups of a widened row in groups of 32, 16 groups at a time: per group one chained
 * min / max (the accumulator second: NaN ignored), the 16 ranges reduced together, their params in
 * one step, then the codes. */
static inline __attribute__((always_inline)) void qu32_groups_h(const uint16_t *h, const int bf16, size_t n,
                                                                uint32_t bits, uint16_t *params, uint8_t *row) {
  const __m512 hi = _mm512_set1_ps((float)ckv_qa_levels(bits));
  const __m512 pinf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY);
  for (size_t e0 = 0; e0 < n; e0 += 512) {
    size_t nb = (n - e0) / 32 < 16 ? (n - e0) / 32 : 16;
    __m512 vmn[16], vmx[16];
    for (size_t k = 0; k < 16; k++) {
      vmn[k] = pinf, vmx[k] = ninf;
      if (k >= nb) continue;
      __m512 a = widen16(h + e0 + 32 * k, bf16), b = widen16(h + e0 + 32 * k + 16, bf16);
      vmn[k] = _mm512_min_ps(b, _mm512_min_ps(a, pinf));
      vmx[k] = _mm512_max_ps(b, _mm512_max_ps(a, ninf));
    }
    __m256i hs, hz;
    __m512 vz, vi;
    qa_params16(reduce16(vmn, 0), reduce16(vmx, 1), bits, &hs, &hz, &vz, &vi);
    uint16_t sz[32];
    float zf[16], inv[16];
    _mm256_storeu_si256((__m256i *)sz, _mm256_permute2x128_si256(_mm256_unpacklo_epi16(hs, hz), _mm256_unpackhi_epi16(hs, hz), 0x20));
    _mm256_storeu_si256((__m256i *)(sz + 16), _mm256_permute2x128_si256(_mm256_unpacklo_epi16(hs, hz), _mm256_unpackhi_epi16(hs, hz), 0x31));
    memcpy(params + 2 * (e0 / 32), sz, nb * 2 * sizeof(uint16_t));
    _mm512_storeu_ps(zf, vz);
    _mm512_storeu_ps(inv, vi);
    for (size_t k = 0; k < nb; k++) {
      const uint16_t *x = h + e0 + 32 * k;
      __m512 z = _mm512_set1_ps(zf[k]), v = _mm512_set1_ps(inv[k]);
      pack32z(qa_code16(widen16(x, bf16), z, v, hi), qa_code16(widen16(x + 16, bf16), z, v, hi), bits,
              row + (e0 + 32 * k) * bits / 8);
    }
  }
}
static void z_quant_u32_groups_h(const uint16_t *h, int bf16, size_t n, uint32_t bits, uint16_t *params, uint8_t *row) {
  if (bf16)
    qu32_groups_h(h, 1, n, bits, params, row);
  else
    qu32_groups_h(h, 0, n, bits, params, row);
}

/* acc[i] += |widened h[i]| (pruning's channel magnitudes), element by element: the scalar sums. */
static inline __attribute__((always_inline)) void absadd_h(const uint16_t *h, const int bf16, float *acc, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), _mm512_abs_ps(widen16(h + i, bf16))));
  if (i < n) ckv_avx2_absadd_h(h + i, bf16, acc + i, n - i);
}
static void z_absadd_h(const uint16_t *h, int bf16, float *acc, size_t n) {
  if (bf16)
    absadd_h(h, 1, acc, n);
  else
    absadd_h(h, 0, acc, n);
}

/* ---- committed rows back to FP32 in one pass (dequant.c), 32 codes a step ---- */
static inline void codes32z(const uint8_t *row, uint32_t bits, __m512 *c0, __m512 *c1) {
  __m128i lo, hi;
  unpack32(row, bits, &lo, &hi);
  *c0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo));
  *c1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
}
static void z_dequant_u_cols(const uint8_t *row, uint32_t bits, const uint16_t *scale, const uint16_t *zero, float *dst,
                             size_t n) {
  for (size_t i = 0; i + 32 <= n; i += 32) {
    __m512 c0, c1;
    codes32z(row + i * bits / 8, bits, &c0, &c1);
    __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + i)));
    __m512 s1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + i + 16)));
    __m512 z0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(zero + i)));
    __m512 z1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(zero + i + 16)));
    _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_mul_ps(c0, s0), z0));
    _mm512_storeu_ps(dst + i + 16, _mm512_add_ps(_mm512_mul_ps(c1, s1), z1));
  }
}
static void z_dequant_u32_groups(const uint8_t *row, uint32_t bits, const uint16_t *params, float *dst, size_t n) {
  for (size_t i = 0; i + 32 <= n; i += 32) {
    __m512 c0, c1;
    codes32z(row + i * bits / 8, bits, &c0, &c1);
    __m128 sz = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)params[i / 16] | (uint32_t)params[i / 16 + 1] << 16)));
    __m512 s = _mm512_broadcastss_ps(sz), z = _mm512_broadcastss_ps(_mm_movehdup_ps(sz));
    _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_mul_ps(c0, s), z));
    _mm512_storeu_ps(dst + i + 16, _mm512_add_ps(_mm512_mul_ps(c1, s), z));
  }
}

const ckv_rowops ckv_rowops_avx512 = {
    .name = "avx512",
    .cvt_f16 = z_cvt_f16,
    .cvt_bf16 = z_cvt_bf16,
    .cvt_i8 = z_cvt_i8,
    .cvt_codes = z_cvt_codes,
    .affine = z_affine,
    .mul = z_mul,
    .dot = z_dot,
    .dotn = z_dotn,
    .axpyn = z_axpyn,
    .axpy = z_axpy,
    .exp_sub = z_exp_sub,
    .absmax = z_absmax,
    .range = z_range,
    .minmax = z_minmax,
    .qa_params = z_qa_params,
    .quant_i8 = z_quant_i8,
    .quant_u = z_quant_u,
    /* whole rows: the AVX2 versions (8 groups per F16C step; groups are short), but for FP16 / BF16 input
     * rows, whose groups of a multiple of 16 elements take 16 lanes */
    .quant_i8_groups = ckv_avx2_quant_i8_groups,
    .quant_u_groups = ckv_avx2_quant_u_groups,
    .quant_i8_groups_h = z_quant_i8_groups_h,
    .quant_u32_groups_h = z_quant_u32_groups_h,
    .minmax_h = z_minmax_h,
    .minmax_rows_h = z_minmax_rows_h,
    .quant_u_h = z_quant_u_h,
    .dequant_u_cols = z_dequant_u_cols,
    .absadd_h = z_absadd_h,
    .dequant_u32_groups = z_dequant_u32_groups,
};
