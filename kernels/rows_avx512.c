/* rows_avx512.c - the row primitives with AVX-512 F/BW/VL (16 floats a step).
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c and called only
 * after dispatch.c checked the CPU.  Quantizing primitives do exactly the
 * scalar operations lane by lane (same bytes); tails use the AVX2 table. */
#include <immintrin.h>
#include <math.h>

#include "kernels/quant.h"
#include "kernels/rowops.h"

#define A2 ckv_rowops_avx2

static void z_cvt_f16(const uint16_t *src, float *dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
  A2.cvt_f16(src + i, dst + i, n - i);
}
static void z_cvt_bf16(const uint16_t *src, float *dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
  A2.cvt_bf16(src + i, dst + i, n - i);
}
static void z_cvt_i8(const int8_t *src, float s, float *dst, size_t n) {
  size_t i = 0;
  __m512 vs = _mm512_set1_ps(s);
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(w), vs));
  }
  A2.cvt_i8(src + i, s, dst + i, n - i);
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
  for (; i + 32 <= n; i += 32) {
    __m128i lo, hi;
    unpack32(row + i * bits / 8, bits, &lo, &hi);
    _mm512_storeu_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)));
    _mm512_storeu_ps(dst + i + 16, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)));
  }
  A2.cvt_codes(row + i * bits / 8, bits, dst + i, n - i);
}
static void z_affine(float *x, float s, float z, size_t n) {
  size_t i = 0;
  __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(z);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), vz));
  A2.affine(x + i, s, z, n - i);
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
static void z_axpy(float a, const float *x, float *y, size_t n) {
  size_t i = 0;
  __m512 va = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  A2.axpy(a, x + i, y + i, n - i);
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
  A2.minmax(x + i, mn + i, mx + i, n - i);
}
static void z_quant_i8(const float *x, float inv, int8_t *dst, size_t n) {
  size_t i = 0;
  __m512 vi = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (; i + 16 <= n; i += 16) {
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  A2.quant_i8(x + i, inv, dst + i, n - i);
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
  A2.quant_u(x + i, zero + i, inv + i, bits, codes + i, n - i);
}

const ckv_rowops ckv_rowops_avx512 = {
    .name = "avx512",
    .cvt_f16 = z_cvt_f16,
    .cvt_bf16 = z_cvt_bf16,
    .cvt_i8 = z_cvt_i8,
    .cvt_codes = z_cvt_codes,
    .affine = z_affine,
    .dot = z_dot,
    .axpy = z_axpy,
    .exp_sub = z_exp_sub,
    .absmax = z_absmax,
    .range = z_range,
    .minmax = z_minmax,
    .quant_i8 = z_quant_i8,
    .quant_u = z_quant_u,
};
