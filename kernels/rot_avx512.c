/* rot_avx512.c - the rotated formats' forward rotation and quantization of
 * a row's heads, and a row read back, with AVX-512 F (compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c; rot.c and dequant.c
 * call them only on the AVX-512 path, head_dim a multiple of 16).  The
 * rules sum in 16 lanes in index order (ckv_lanes16_total): one register per
 * sum here.  A row's heads go through each step together (statistics of
 * every head, then their candidates, errors, codes), so the dependent chain
 * of one head (sums, square root, division, sums again) overlaps the
 * others' instead of stalling the core.  The bytes are the scalar path's
 * (test_kernels_rot and test_kernels_simd compare them, and the floats read
 * back). */
#include <immintrin.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/rot.h"

/* ckv_lanes16_total of one 16-lane accumulator in registers: the halves added lane by lane, then the rules'
 * tree over the 8 sums, ((m0 + m1) + (m2 + m3)) + ((m4 + m5) + (m6 + m7)), each level one vector addition of
 * partners (a + b = b + a exactly). */
static inline float lanes16_total(__m512 acc) {
  __m256 m = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  m = _mm256_add_ps(m, _mm256_permute_ps(m, 0xB1)); /* lanes 0, 2, 4, 6: m0 + m1, m2 + m3, ... */
  m = _mm256_add_ps(m, _mm256_permute_ps(m, 0x4E)); /* lanes 0, 4: (m0 + m1) + (m2 + m3), (m4 + m5) + (m6 + m7) */
  __m128 t = _mm_add_ss(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  return _mm_cvtss_f32(t);
}

/* (code - offset) of 16 elements from t = y * inv: ckv_rot_mid, the symmetric clamp as one range instruction
 * (the smaller magnitude of the two, with the sign of the first). */
static inline __m512 mid16(__m512 t, __m512 h, __m512 bound) {
  __m512 q = _mm512_add_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC), h);
  return _mm512_range_ps(q, bound, 0x02);
}

/* Packs the codes m + offset of 16 elements (m from mid16, exact small integers) into p (ckv_pack_code's
 * layout, 16 * bits / 8 bytes written), for 1, 2, 3 and 4 bits. */
static inline void pack16(__m512 m, __m512 off, uint32_t bits, uint8_t *p) {
  __m128i c = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_add_ps(m, off)));
  if (bits == 4u) { /* byte pairs c0 | c1 << 4 */
    __m128i w = _mm_maddubs_epi16(c, _mm_set1_epi16(0x1001));
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
  } else if (bits == 2u) { /* c0 + 4 c1 per 16 bits, then + 16 (c2 + 4 c3) per 32 bits: one byte per 4 codes */
    __m128i w = _mm_madd_epi16(_mm_maddubs_epi16(c, _mm_set1_epi16(0x0401)), _mm_set1_epi32(0x00100001));
    w = _mm_packus_epi32(w, w);
    uint32_t v = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(w, w));
    memcpy(p, &v, 4);
  } else if (bits == 3u) { /* c0 + 8 c1 per 16 bits, + 64 (c2 + 8 c3) per 32 (12 bits), two of those side by
                              * side per 64 bits (24 bits: 8 codes), the two 24-bit groups: 6 bytes */
    __m128i w = _mm_madd_epi16(_mm_maddubs_epi16(c, _mm_set1_epi16(0x0801)), _mm_set1_epi32(0x00400001));
    w = _mm_or_si128(w, _mm_srli_epi64(w, 20));
    uint64_t lo = (uint64_t)_mm_cvtsi128_si64(w) & 0xffffffu, hi = (uint64_t)_mm_extract_epi64(w, 1) & 0xffffffu;
    uint64_t v = lo | hi << 24;
    memcpy(p, &v, 6);
  } else { /* 1 bit: code i is bit i of the nonzero mask */
    uint16_t k = (uint16_t)_mm_test_epi8_mask(c, c);
    memcpy(p, &k, 2);
  }
}

/* pack16 of the mids m[0..n) of a head, 16 per step (every byte of row written). */
static void pack16_mids(const float *m, uint32_t n, uint32_t bits, uint8_t *row) {
  const __m512 off = _mm512_set1_ps(ckv_rot_offset(bits));
  for (uint32_t i = 0; i < n; i += 16) pack16(_mm512_loadu_ps(m + i), off, bits, row + (size_t)i * bits / 8u);
}

/* Every scale code's value, inverse and square (ckv_rot_scale_value, ckv_rot_scale_inv, value * value: the same
 * floats, computed once when the library is loaded), so a head's candidates cost no division. */
static float scale_value_tab[256], scale_inv_tab[256], scale_sq_tab[256];
__attribute__((constructor)) static void scale_tabs_init(void) {
  for (uint32_t c = 0; c < 256; c++) {
    scale_value_tab[c] = ckv_rot_scale_value(c);
    scale_inv_tab[c] = ckv_rot_scale_inv(c);
    scale_sq_tab[c] = scale_value_tab[c] * scale_value_tab[c];
  }
}

/* Where the heads of a row come from (quant_row_n, below): FP32 as they are, FP32 less the key means, FP16 to be
 * rotated. */
enum { SRC_F32 = 0, SRC_F32_LESS = 1, SRC_F16 = 2 };

/* The heads of a row are quantized GROUP at a time: each step for every head of the group before the next. */
#define GROUP 4

/* ckv_rot_quant_head for g <= GROUP heads y[g][n] (n a multiple of 16): the sum of squares and each candidate's
 * squared errors in one 16-lane register (the rules' lane order); the candidates' (code - offset) kept from the
 * error pass, so the codes are the better one's, converted and packed. */
static void quant_group(const float *y, uint32_t g, uint32_t n, uint32_t bits, uint8_t *ret_scales, uint8_t *rows) {
  float ss[GROUP], am[GROUP], err[GROUP][CKV_ROT_CANDIDATES];
  uint8_t cand[GROUP][CKV_ROT_CANDIDATES];
  float mids[GROUP][CKV_ROT_CANDIDATES][CKV_MAX_HEAD_DIM] __attribute__((aligned(64)));
  size_t rb = (size_t)n * bits / 8u;
  for (uint32_t hd = 0; hd < g; hd++) {
    const float *x = y + (size_t)hd * n;
    __m512 s2 = _mm512_setzero_ps(), m = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n; i += 16) {
      __m512 v = _mm512_loadu_ps(x + i);
      s2 = _mm512_add_ps(_mm512_mul_ps(v, v), s2);
      m = _mm512_range_ps(m, v, 0x0B); /* the larger magnitude, sign cleared */
    }
    ss[hd] = lanes16_total(s2);
    am[hd] = _mm512_reduce_max_ps(m); /* finite inputs: no NaN in any lane */
  }
  for (uint32_t hd = 0; hd < g; hd++) ckv_rot_candidates(ss[hd], am[hd], n, bits, cand[hd]);
  float half = (float)(1u << (bits - 1u));
  const __m512 h = _mm512_set1_ps(0.5f), bound = _mm512_set1_ps(half - 0.5f);
  for (uint32_t hd = 0; hd < g; hd++) {
    const float *x = y + (size_t)hd * n;
    const __m512 i0 = _mm512_set1_ps(scale_inv_tab[cand[hd][0]]), i1 = _mm512_set1_ps(scale_inv_tab[cand[hd][1]]);
    __m512 e0 = _mm512_setzero_ps(), e1 = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n; i += 16) { /* t - mid(t), squared, summed: two roundings each */
      __m512 v = _mm512_loadu_ps(x + i), t0 = _mm512_mul_ps(v, i0), t1 = _mm512_mul_ps(v, i1);
      __m512 m0 = mid16(t0, h, bound), m1 = mid16(t1, h, bound);
      _mm512_store_ps(&mids[hd][0][i], m0);
      _mm512_store_ps(&mids[hd][1][i], m1);
      __m512 d0 = _mm512_sub_ps(t0, m0), d1 = _mm512_sub_ps(t1, m1);
      e0 = _mm512_add_ps(_mm512_mul_ps(d0, d0), e0);
      e1 = _mm512_add_ps(_mm512_mul_ps(d1, d1), e1);
    }
    err[hd][0] = scale_sq_tab[cand[hd][0]] * lanes16_total(e0);
    err[hd][1] = scale_sq_tab[cand[hd][1]] * lanes16_total(e1);
  }
  for (uint32_t hd = 0; hd < g; hd++) {
    uint8_t s8 = ckv_rot_best(cand[hd], err[hd]);
    pack16_mids(mids[hd][s8 == cand[hd][0] ? 0 : 1], n, bits, rows + hd * rb);
    ret_scales[hd] = s8;
  }
}

static inline __attribute__((always_inline)) void quant_row_n(int SRC, const void *src, const float *aux, uint32_t nh,
                                                              uint32_t n, uint32_t bits, uint8_t *ret_scales,
                                                              uint8_t *rows);

void ckv_rot_quant_heads_avx512(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales,
                                uint8_t *rows) {
  if (n <= 128u) { /* a head fits the registers */
    quant_row_n(SRC_F32, y, NULL, nh, n, bits, ret_scales, rows);
    return;
  }
  size_t rb = (size_t)n * bits / 8u;
  for (uint32_t h0 = 0; h0 < nh; h0 += GROUP)
    quant_group(y + (size_t)h0 * n, nh - h0 < GROUP ? nh - h0 : GROUP, n, bits, ret_scales + h0, rows + h0 * rb);
}

/* ---- a rotated row read back (ckv_kernels_dequantize), 16 lanes: rot_avx2.c's ckv_rot_dequant_row_avx2
 * with twice the width (head_dim a multiple of 16); the same operations in the same order per element. */

/* One butterfly stage inside each 16-float vector: s is v with the partners swapped; the lanes of the second
 * partner take s - v (a - b), the others v + s (a + b), both as fma(v, +-1, s): v * +-1 is exact, so the one
 * rounding is the addition's, the same float as _mm512_add_ps / _mm512_sub_ps, in 2 instructions instead of 4. */
static inline __m512 stage16(__m512 v, __m512 s, __m512 pm) { return _mm512_fmadd_ps(v, pm, s); }

static inline __m512 fwht16(__m512 v) { /* stages 1, 2, 4, 8: inside a vector */
  const __m512 p1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
  const __m512 p2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
  const __m512 p4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
  const __m512 p8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
  v = stage16(v, _mm512_permute_ps(v, 0xB1), p1);
  v = stage16(v, _mm512_permute_ps(v, 0x4E), p2);
  v = stage16(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)), p4);
  return stage16(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)), p8);
}

/* The stages of ckv_fwht from len 16 on (n a multiple of 16), two per pass where they pair up. */
static void fwht_from16(float *x, uint32_t n) {
  uint32_t len = 16;
  for (; len * 4 <= n; len <<= 2)
    for (uint32_t i = 0; i < n; i += len << 2)
      for (uint32_t j = i; j < i + len; j += 16) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + len);
        __m512 c = _mm512_loadu_ps(x + j + 2 * len), d = _mm512_loadu_ps(x + j + 3 * len);
        __m512 ab = _mm512_add_ps(a, b), as = _mm512_sub_ps(a, b), cd = _mm512_add_ps(c, d), cs = _mm512_sub_ps(c, d);
        _mm512_storeu_ps(x + j, _mm512_add_ps(ab, cd));
        _mm512_storeu_ps(x + j + len, _mm512_add_ps(as, cs));
        _mm512_storeu_ps(x + j + 2 * len, _mm512_sub_ps(ab, cd));
        _mm512_storeu_ps(x + j + 3 * len, _mm512_sub_ps(as, cs));
      }
  for (; len < n; len <<= 1)
    for (uint32_t i = 0; i < n; i += len << 1)
      for (uint32_t j = i; j < i + len; j += 16) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + len);
        _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
        _mm512_storeu_ps(x + j + len, _mm512_sub_ps(a, b));
      }
}

/* The 16 sign bits of (layer, kv, head) from element i: ckv_rot_sign's hash, 16 at a time, the same bits in
 * fewer steps.  key0 is a multiple of CKV_MAX_HEAD_DIM and every element e = i + lane is below it (at most
 * 2^16), so key0 + e = key0 ^ e, and the hash's first h ^ (h >> 16) shifts no bit of e: it is k ^ e with
 * k = x ^ (x >> 16), x = key0 ^ seed, one scalar per head.  The last h ^ (h >> 16) leaves bit 31, the
 * sign, as it is, so it is left out. */
_Static_assert(CKV_MAX_HEAD_DIM <= 65536u && (CKV_MAX_HEAD_DIM & (CKV_MAX_HEAD_DIM - 1u)) == 0,
               "signs16: key0 + e must be key0 ^ e with e below 2^16");
static inline __m512i signs16(uint32_t key0, uint32_t i) {
  uint32_t x = key0 ^ CKV_ROT_SEED;
  __m512i e = _mm512_add_epi32(_mm512_set1_epi32((int)i), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i h = _mm512_xor_si512(_mm512_set1_epi32((int)(x ^ (x >> 16))), e);
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85ebca6bu));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xc2b2ae35u));
  return _mm512_and_si512(h, _mm512_set1_epi32((int)0x80000000u));
}

/* 16 codes of a packed row from element i (a multiple of 16; `bits` <= 4, so 8 codes fill at most 32 bits):
 * each half of the vector takes one 32-bit group, shifted apart. */
static inline __m512 unpack16(const uint8_t *row, uint32_t i, uint32_t bits, __m512i sh, __m512i mask) {
  const uint8_t *p = row + (size_t)i * bits / 8u;
  uint64_t u = 0; /* 2 * bits bytes: fixed-size copies, plain loads (a variable size would be a call) */
  uint16_t a;
  uint32_t b;
  switch (bits) {
    case 1: memcpy(&a, p, 2); u = a; break;
    case 2: memcpy(&b, p, 4); u = b; break;
    case 3: memcpy(&b, p, 4); memcpy(&a, p + 4, 2); u = b | (uint64_t)a << 32; break;
    default: memcpy(&u, p, 8); break;
  }
  __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)(uint32_t)u)),
                                 _mm256_set1_epi32((int)(uint32_t)(u >> (8u * bits))), 1);
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, sh), mask));
}

/* One head of a rotated row read back (ckv_rot_read_rotated then ckv_rot_inverse), NV vectors in registers
 * (NV a power of two, 1..8, a constant at each call): codes unpacked, times the scale, plus the key mean
 * (keys: ckv_rot_finite, by magnitude), stages 1..8 per vector, the later stages across them, the norm and the
 * signs (x * r * sign flips the sign bit of x * r where the sign is -1: the same float), one store. */
static inline __attribute__((always_inline)) void dequant_head_regs(int NV, const uint8_t *row, uint32_t bits, __m512 s,
                                                                   const uint16_t *mean, uint32_t key0, float *x) {
  const __m512i sh = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm512_set1_epi32((int)bits));
  const __m512i mask = _mm512_set1_epi32((int)ckv_qa_levels(bits));
  const __m512 off = _mm512_set1_ps(ckv_rot_offset(bits)), r = _mm512_set1_ps(ckv_rot_norm(16u * (uint32_t)NV));
  const __m512 hi = _mm512_set1_ps(CKV_F16_MAX);
  __m512 v[8];
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++) {
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(unpack16(row, 16u * (uint32_t)k, bits, sh, mask), off), s);
    if (mean) {
      __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mean + 16 * k)));
      t = _mm512_add_ps(t, _mm512_maskz_range_ps(_mm512_cmp_ps_mask(mv, mv, _CMP_ORD_Q), mv, hi, 0x02));
    }
    v[k] = fwht16(t);
  }
#pragma GCC unroll 4
  for (int len = 1; len < 8; len <<= 1)
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
      if (len < NV && j < NV && !(j & len) && j + len < 8) {
        __m512 a = v[j], b = v[j + len];
        v[j] = _mm512_add_ps(a, b);
        v[j + len] = _mm512_sub_ps(a, b);
      }
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++)
    _mm512_storeu_ps(x + 16 * k, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(v[k], r)),
                                                                      signs16(key0, 16u * (uint32_t)k))));
}

void ckv_rot_dequant_row_avx512(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer,
                                uint32_t kv, uint32_t slot, float *dst) {
  uint32_t fmt = h->format, bits = ckv_format_code_bits(fmt), D = g->head_dim, H = g->n_kv_heads;
  size_t rb = ckv_rot_row_bytes(fmt, g);
  const uint8_t *sc = (const uint8_t *)blk + ckv_rot_scales_offset(fmt, g, h->capacity, layer, kv) + (size_t)slot * H;
  const uint8_t *codes = (const uint8_t *)blk + ckv_rot_codes_offset(fmt, g, h->capacity, layer, kv) + (size_t)slot * H * rb;
  const __m512i sh = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm512_set1_epi32((int)bits));
  const __m512i mask = _mm512_set1_epi32((int)ckv_qa_levels(bits));
  const __m512 off = _mm512_set1_ps(ckv_rot_offset(bits)), r = _mm512_set1_ps(ckv_rot_norm(D));
  const __m512 lo = _mm512_set1_ps(-CKV_F16_MAX), hi = _mm512_set1_ps(CKV_F16_MAX);
  for (uint32_t hd = 0; hd < H; hd++) {
    float *x = dst + (size_t)hd * D;
    const uint8_t *row = codes + (size_t)hd * rb;
    const __m512 s = _mm512_set1_ps(ckv_rot_scale_value(sc[hd]));
    const uint16_t *m = (const uint16_t *)((const uint8_t *)blk + ckv_rot_mean_offset(g, h->capacity, layer, hd));
    uint32_t key0 = ((layer * 2u + kv) * CKV_MAX_KV_HEADS + hd) * CKV_MAX_HEAD_DIM;
    const uint16_t *mean = kv == 0 ? m : NULL;
    switch (D * 8u + bits) { /* in registers, the unpacking specialised per width at the common head sizes */
      case 16 * 8 + 4: dequant_head_regs(1, row, 4, s, mean, key0, x); continue;
      case 32 * 8 + 4: dequant_head_regs(2, row, 4, s, mean, key0, x); continue;
      case 64 * 8 + 1: dequant_head_regs(4, row, 1, s, mean, key0, x); continue;
      case 64 * 8 + 2: dequant_head_regs(4, row, 2, s, mean, key0, x); continue;
      case 64 * 8 + 3: dequant_head_regs(4, row, 3, s, mean, key0, x); continue;
      case 64 * 8 + 4: dequant_head_regs(4, row, 4, s, mean, key0, x); continue;
      case 128 * 8 + 1: dequant_head_regs(8, row, 1, s, mean, key0, x); continue;
      case 128 * 8 + 2: dequant_head_regs(8, row, 2, s, mean, key0, x); continue;
      case 128 * 8 + 3: dequant_head_regs(8, row, 3, s, mean, key0, x); continue;
      case 128 * 8 + 4: dequant_head_regs(8, row, 4, s, mean, key0, x); continue;
      default: break;
    }
    switch (D) { /* in registers */
      case 16: dequant_head_regs(1, row, bits, s, mean, key0, x); continue;
      case 32: dequant_head_regs(2, row, bits, s, mean, key0, x); continue;
      case 64: dequant_head_regs(4, row, bits, s, mean, key0, x); continue;
      case 128: dequant_head_regs(8, row, bits, s, mean, key0, x); continue;
      default: break;
    }
    for (uint32_t i = 0; i < D; i += 16) {
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(unpack16(row, i, bits, sh, mask), off), s);
      if (kv == 0) { /* + ckv_rot_finite(mean): NaN -> 0, then clamped (F16C widening: exact) */
        __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m + i)));
        mv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mv, mv, _CMP_ORD_Q), mv);
        v = _mm512_add_ps(v, _mm512_min_ps(_mm512_max_ps(mv, lo), hi));
      }
      _mm512_storeu_ps(x + i, fwht16(v));
    }
    fwht_from16(x, D);
    for (uint32_t i = 0; i < D; i += 16) { /* x * r, then the sign bit flipped where the sign is -1 */
      __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), r);
      _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), signs16(key0, i))));
    }
  }
}

/* ckv_rot_forward_with of a head of NV vectors (NV a power of two, 1..8, a constant at each call) into registers
 * v[0..NV), from FP16 (from_f16, widened exactly) or FP32 src: finite (NaN -> 0, clamped) times the sign, the transform (stages 1..8 inside each vector, then
 * across them: each stage the same additions and subtractions as ckv_fwht's), the norm. */
static inline __attribute__((always_inline)) void forward_into_as(int from_f16, int finite, const void *src, int NV,
                                                                  const float *signs, __m512 r, __m512 *v) {
  const uint16_t *h = src;
  const float *x = src;
  const __m512 hi = _mm512_set1_ps(CKV_F16_MAX);
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++) { /* from FP16 (h, widened exactly) or from x */
    __m512 t = from_f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 16 * k))) : _mm512_loadu_ps(x + 16 * k);
    /* ckv_rot_finite: NaN lanes zeroed, the rest clamped by magnitude (the identity on finite FP16) */
    if (!finite) t = _mm512_maskz_range_ps(_mm512_cmp_ps_mask(t, t, _CMP_ORD_Q), t, hi, 0x02);
    v[k] = fwht16(_mm512_mul_ps(t, _mm512_loadu_ps(signs + 16 * k)));
  }
#pragma GCC unroll 4
  for (int len = 1; len < 8; len <<= 1)
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
      if (len < NV && j < NV && !(j & len) && j + len < 8) {
        __m512 a = v[j], b = v[j + len];
        v[j] = _mm512_add_ps(a, b);
        v[j + len] = _mm512_sub_ps(a, b);
      }
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++) v[k] = _mm512_mul_ps(v[k], r);
}

/* forward_into_as for any input (NaN and +-Inf made finite first). */
static inline __attribute__((always_inline)) void forward_into(int from_f16, const void *src, int NV,
                                                               const float *signs, __m512 r, __m512 *v) {
  forward_into_as(from_f16, 0, src, NV, signs, r, v);
}

/* forward_into, then one store. */
static inline __attribute__((always_inline)) void forward_regs(const uint16_t *h, float *x, int NV, const float *signs,
                                                               __m512 r) {
  __m512 v[8];
  if (h)
    forward_into(1, h, NV, signs, r, v);
  else
    forward_into(0, x, NV, signs, r, v);
#pragma GCC unroll 8
  for (int k = 0; k < NV; k++) _mm512_storeu_ps(x + 16 * k, v[k]);
}

void ckv_rot_forward_f16_avx512(const uint16_t *h, float *x, uint32_t n, const float *signs) {
  const __m512 r = _mm512_set1_ps(ckv_rot_norm(n));
  switch (n) {
    case 16: forward_regs(h, x, 1, signs, r); return;
    case 32: forward_regs(h, x, 2, signs, r); return;
    case 64: forward_regs(h, x, 4, signs, r); return;
    default: forward_regs(h, x, 8, signs, r); return;
  }
}

/* ckv_rot_forward_with 16 lanes at a time (n a multiple of 16): in registers up to 128 elements, else
 * finite times the sign, stages 1..8 per vector, the later stages through memory, the norm. */
void ckv_rot_forward_avx512(float *x, uint32_t n, const float *signs) {
  const __m512 r = _mm512_set1_ps(ckv_rot_norm(n));
  switch (n) {
    case 16: forward_regs(NULL, x, 1, signs, r); return;
    case 32: forward_regs(NULL, x, 2, signs, r); return;
    case 64: forward_regs(NULL, x, 4, signs, r); return;
    case 128: forward_regs(NULL, x, 8, signs, r); return;
    default: break;
  }
  const __m512 lo = _mm512_set1_ps(-CKV_F16_MAX), hi = _mm512_set1_ps(CKV_F16_MAX);
  for (uint32_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm512_storeu_ps(x + i, fwht16(_mm512_mul_ps(v, _mm512_loadu_ps(signs + i))));
  }
  fwht_from16(x, n);
  for (uint32_t i = 0; i < n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), r));
}

/* ---- the heads of a row rotated and quantized with no row of rotated floats in between (the fused steps
 * of rot.c), GROUP_REGS heads at a time in three phases: each head's floats (rotated from FP16, or less the key
 * means, or as they are) with their statistics; every head's candidates (independent chains of scalar
 * operations, which the core overlaps); each head's errors and codes.  Head by head instead, the chain of one
 * head (sums, square root, division, sums again) would stall the core. ---- */
#define GROUP_REGS 8

/* [a0 op a1, a2 op a3, b0 op b1, b2 op b3 | the same of lanes 4..7]: adjacent pairs of two vectors. */
static inline __m256 pairs_add(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}
static inline __m256 pairs_max(__m256 a, __m256 b) {
  return _mm256_max_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}
static inline __m256 halves_add(__m512 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
static inline __m256 halves_max(__m512 a) {
  return _mm256_max_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
/* Lane h = lanes16_total(a[h]) for 8 accumulators at once, the rules' tree in each lane: m_j = l_j + l_{j+8},
 * adjacent pairs (m0 + m1, m2 + m3, ...), pairs of those, then ((m0 + m1) + (m2 + m3)) + ((m4 + m5) + (m6 +
 * m7)) as the low 128-bit lane plus the high one. */
static inline __m256 totals8(const __m512 a[8]) {
  __m256 t01 = pairs_add(halves_add(a[0]), halves_add(a[1])), t23 = pairs_add(halves_add(a[2]), halves_add(a[3]));
  __m256 t45 = pairs_add(halves_add(a[4]), halves_add(a[5])), t67 = pairs_add(halves_add(a[6]), halves_add(a[7]));
  __m256 u0 = pairs_add(t01, t23), u1 = pairs_add(t45, t67); /* lane k (k < 4): head k's first half, lane 4 + k its second */
  __m128 h0 = _mm_add_ps(_mm256_castps256_ps128(u0), _mm256_extractf128_ps(u0, 1));
  __m128 h1 = _mm_add_ps(_mm256_castps256_ps128(u1), _mm256_extractf128_ps(u1, 1));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(h0), h1, 1);
}
/* Lanes 0 and 1 = lanes16_total(a), lanes16_total(b): totals8's tree for two accumulators. */
static inline __m128 totals2(__m512 a, __m512 b) {
  __m256 t = pairs_add(halves_add(a), halves_add(b)), u = pairs_add(t, t);
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}
/* Lane h = the largest lane of a[h] (any order: a maximum has no rounding). */
static inline __m256 max8(const __m512 a[8]) {
  __m256 t01 = pairs_max(halves_max(a[0]), halves_max(a[1])), t23 = pairs_max(halves_max(a[2]), halves_max(a[3]));
  __m256 t45 = pairs_max(halves_max(a[4]), halves_max(a[5])), t67 = pairs_max(halves_max(a[6]), halves_max(a[7]));
  __m256 u0 = pairs_max(t01, t23), u1 = pairs_max(t45, t67);
  __m128 h0 = _mm_max_ps(_mm256_castps256_ps128(u0), _mm256_extractf128_ps(u0, 1));
  __m128 h1 = _mm_max_ps(_mm256_castps256_ps128(u1), _mm256_extractf128_ps(u1, 1));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(h0), h1, 1);
}

/* ckv_rot_candidates of 8 heads at once (lane h: sum of squares ss, absmax am) into cand[8][2]: the same
 * divisions, square roots and products (correctly rounded in every lane), ckv_rot_scale_floor from the
 * exponent and mantissa bits, the next code, and 0 twice for a head of zeros. */
static inline void candidates8(__m256 ss, __m256 am, uint32_t n, uint32_t bits, uint8_t cand[8][CKV_ROT_CANDIDATES]) {
  const float half = (float)(1u << (bits - 1u));
  __m256 rms = _mm256_sqrt_ps(_mm256_div_ps(ss, _mm256_set1_ps((float)n)));
  __m256 g = _mm256_mul_ps(_mm256_set1_ps(ckv_rot_step(bits)), rms);
  __m256 a = _mm256_div_ps(am, _mm256_set1_ps(half - 0.5f));
  __m256 est = g; /* 2 and 1 bits */
  if (bits >= 4u)
    est = _mm256_sqrt_ps(_mm256_mul_ps(g, a));
  else if (bits == 3u)
    est = _mm256_mul_ps(g, _mm256_sqrt_ps(_mm256_sqrt_ps(_mm256_div_ps(a, g))));
  /* a <= g, or !(g > 0): a */
  __m256 take_a = _mm256_or_ps(_mm256_cmp_ps(a, g, _CMP_LE_OQ), _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_NGT_UQ));
  est = _mm256_blendv_ps(est, a, take_a);
  /* the largest code whose scale is <= est: 8 (exponent + 16) plus the constants <= the mantissa, in [1, 255] */
  __m256i u = _mm256_castps_si256(est);
  __m256i k = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(0xff)), _mm256_set1_epi32(111));
  __m256 mant = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffff)), _mm256_set1_epi32(127 << 23)));
  static const float steps[7] = {1.09050773f, 1.18920712f, 1.29683955f, 1.41421356f, 1.54221083f, 1.68179283f, 1.83400809f};
  __m256i c = _mm256_slli_epi32(k, 3);
  for (int j = 0; j < 7; j++) /* a true compare is -1 */
    c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(_mm256_set1_ps(steps[j]), mant, _CMP_LE_OQ)));
  c = _mm256_min_epi32(_mm256_max_epi32(c, _mm256_set1_epi32(1)), _mm256_set1_epi32((int)CKV_ROT_SCALE_CODES));
  __m256i c1 = _mm256_min_epi32(_mm256_add_epi32(c, _mm256_set1_epi32(1)), _mm256_set1_epi32((int)CKV_ROT_SCALE_CODES));
  __m256i live = _mm256_castps_si256(_mm256_cmp_ps(am, _mm256_setzero_ps(), _CMP_GT_OQ)); /* !(am > 0): code 0 */
  int32_t c0s[8], c1s[8];
  _mm256_storeu_si256((__m256i *)c0s, _mm256_and_si256(c, live));
  _mm256_storeu_si256((__m256i *)c1s, _mm256_and_si256(c1, live));
  for (int h = 0; h < 8; h++) {
    cand[h][0] = (uint8_t)c0s[h];
    cand[h][1] = (uint8_t)c1s[h];
  }
}

/* The heads hd < g of the source (SRC: FP32 y[g][n]; y less aux[g][n]; FP16 h[g][n] rotated with the signs
 * aux[g][n]), n = 16 * NV, quantized into ret_scales[g] and rows[g][n*bits/8]. */
static inline __attribute__((always_inline)) void quant_group_regs(int SRC, int NV, const void *src, const float *aux,
                                                                   uint32_t g, uint32_t bits, uint8_t *ret_scales,
                                                                   uint8_t *rows) {
  uint32_t n = 16u * (uint32_t)NV;
  size_t rb = (size_t)n * bits / 8u;
  float y[GROUP_REGS][128] __attribute__((aligned(64)));
  uint8_t cand[GROUP_REGS][CKV_ROT_CANDIDATES];
  __m512 s2s[GROUP_REGS], mxs[GROUP_REGS];
  const __m512 r = _mm512_set1_ps(ckv_rot_norm(n));
  for (uint32_t hd = g; hd < GROUP_REGS; hd++) s2s[hd] = mxs[hd] = _mm512_setzero_ps(); /* lanes of no head */
  for (uint32_t hd = 0; hd < g; hd++) {
    __m512 v[8], s2 = _mm512_setzero_ps(), mx = _mm512_setzero_ps();
    const uint16_t *hh = (const uint16_t *)src + (size_t)hd * n;
    if (SRC == SRC_F16) { /* as if every element were finite: see below */
      forward_into_as(1, 1, hh, NV, aux + (size_t)hd * n, r, v);
    } else {
      const float *x = (const float *)src + (size_t)hd * n;
#pragma GCC unroll 8
      for (int k = 0; k < NV; k++)
        v[k] = SRC == SRC_F32_LESS ? _mm512_sub_ps(_mm512_loadu_ps(x + 16 * k), _mm512_loadu_ps(aux + (size_t)hd * n + 16 * k))
                                   : _mm512_loadu_ps(x + 16 * k);
    }
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) s2 = _mm512_add_ps(_mm512_mul_ps(v[k], v[k]), s2);
    /* FP16 holds nothing beyond +-65504 but +-Inf and NaN; one of those makes every rotated element, so every
     * lane's sum of squares, Inf or NaN (finite heads' sums stay below 2^47): then the head is rotated again
     * with the rule's ckv_rot_finite */
    if (SRC == SRC_F16 && _mm512_cmp_ps_mask(s2, _mm512_set1_ps(INFINITY), _CMP_LT_OQ) != (__mmask16)0xffff) {
      forward_into(1, hh, NV, aux + (size_t)hd * n, r, v);
      s2 = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int k = 0; k < NV; k++) s2 = _mm512_add_ps(_mm512_mul_ps(v[k], v[k]), s2);
    }
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) {
      mx = _mm512_range_ps(mx, v[k], 0x0B); /* the larger magnitude, sign cleared */
      _mm512_store_ps(&y[hd][16 * k], v[k]);
    }
    s2s[hd] = s2;
    mxs[hd] = mx;
  }
  candidates8(totals8(s2s), max8(mxs), n, bits, cand);
  const __m512 h = _mm512_set1_ps(0.5f), bound = _mm512_set1_ps((float)(1u << (bits - 1u)) - 0.5f);
  const __m512 off = _mm512_set1_ps(ckv_rot_offset(bits));
  for (uint32_t hd = 0; hd < g; hd++) {
    const __m512 i0 = _mm512_set1_ps(scale_inv_tab[cand[hd][0]]), i1 = _mm512_set1_ps(scale_inv_tab[cand[hd][1]]);
    __m512 m0[8], m1[8], e0 = _mm512_setzero_ps(), e1 = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) { /* t - mid(t), squared, summed: two roundings each */
      __m512 v = _mm512_load_ps(&y[hd][16 * k]), t0 = _mm512_mul_ps(v, i0), t1 = _mm512_mul_ps(v, i1);
      m0[k] = mid16(t0, h, bound);
      m1[k] = mid16(t1, h, bound);
      __m512 d0 = _mm512_sub_ps(t0, m0[k]), d1 = _mm512_sub_ps(t1, m1[k]);
      e0 = _mm512_add_ps(_mm512_mul_ps(d0, d0), e0);
      e1 = _mm512_add_ps(_mm512_mul_ps(d1, d1), e1);
    }
    float tot[4];
    _mm_storeu_ps(tot, totals2(e0, e1));
    float err[CKV_ROT_CANDIDATES] = {scale_sq_tab[cand[hd][0]] * tot[0], scale_sq_tab[cand[hd][1]] * tot[1]};
    uint8_t s8 = ckv_rot_best(cand[hd], err);
    ret_scales[hd] = s8;
    uint8_t *row = rows + hd * rb;
    const __m512 *m = s8 == cand[hd][0] ? m0 : m1;
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) pack16(m[k], off, bits, row + (size_t)k * 2u * bits);
  }
}

/* quant_group_regs of every head of a row, GROUP_REGS at a time, n = 16 * NV. */
static inline __attribute__((always_inline)) void quant_row_regs(int SRC, int NV, const void *src, const float *aux,
                                                                 uint32_t nh, uint32_t bits, uint8_t *ret_scales,
                                                                 uint8_t *rows) {
  uint32_t n = 16u * (uint32_t)NV;
  size_t rb = (size_t)n * bits / 8u, es = SRC == SRC_F16 ? 2u : 4u;
  for (uint32_t h0 = 0; h0 < nh; h0 += GROUP_REGS)
    quant_group_regs(SRC, NV, (const uint8_t *)src + (size_t)h0 * n * es, aux ? aux + (size_t)h0 * n : NULL,
                     nh - h0 < GROUP_REGS ? nh - h0 : GROUP_REGS, bits, ret_scales + h0, rows + h0 * rb);
}

/* quant_row_regs for n 16, 32, 64 or 128 (SRC a constant at each call). */
static inline __attribute__((always_inline)) void quant_row_n(int SRC, const void *src, const float *aux, uint32_t nh,
                                                              uint32_t n, uint32_t bits, uint8_t *ret_scales,
                                                              uint8_t *rows) {
  switch (n) {
    case 16: quant_row_regs(SRC, 1, src, aux, nh, bits, ret_scales, rows); return;
    case 32: quant_row_regs(SRC, 2, src, aux, nh, bits, ret_scales, rows); return;
    case 64: quant_row_regs(SRC, 4, src, aux, nh, bits, ret_scales, rows); return;
    default: quant_row_regs(SRC, 8, src, aux, nh, bits, ret_scales, rows); return;
  }
}

void ckv_rot_quant_f16_heads_avx512(const uint16_t *h, const float *signs, uint32_t nh, uint32_t n, uint32_t bits,
                                    uint8_t *ret_scales, uint8_t *rows) {
  quant_row_n(SRC_F16, h, signs, nh, n, bits, ret_scales, rows);
}

void ckv_rot_quant_less_heads_avx512(const float *y, const float *mean, uint32_t nh, uint32_t n, uint32_t bits,
                                     uint8_t *ret_scales, uint8_t *rows) {
  quant_row_n(SRC_F32_LESS, y, mean, nh, n, bits, ret_scales, rows);
}

/* ckv_rot_sign of elements [0, n) of the head whose first key is key0, 16 at a time (n a multiple of 16): the
 * sign bit from signs16 on 1.0f. */
void ckv_rot_signs_avx512(uint32_t key0, uint32_t n, float *dst) {
  const __m512i one = _mm512_set1_epi32(0x3f800000);
  for (uint32_t i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_or_si512(signs16(key0, i), one)));
}

/* ckv_rot_mean_f16 of sum[i] over n tokens for i < count (a multiple of 16) into mean[i], and the means read
 * back as every later move reads them (ckv_rot_finite of the widened FP16) into ret_widened[i]: the
 * division correctly rounded as the rule's, NaN -> 0 and the clamp to +-65504 before the conversion, which
 * is then IEEE round-to-nearest-even as ckv_f32_to_f16 (finite values, no overflow). */
void ckv_rot_means_avx512(const float *sum, uint32_t n, uint32_t count, uint16_t *mean, float *ret_widened) {
  const __m512 vn = _mm512_set1_ps((float)n), hi = _mm512_set1_ps(CKV_F16_MAX);
  for (uint32_t i = 0; i < count; i += 16) {
    __m512 v = _mm512_div_ps(_mm512_loadu_ps(sum + i), vn);
    v = _mm512_maskz_range_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v, hi, 0x02); /* ckv_rot_finite */
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i *)(mean + i), h);
    _mm512_storeu_ps(ret_widened + i, _mm512_cvtph_ps(h)); /* finite: the widening is the rule's read */
  }
}

/* The keys of one token for a fresh block's means: each FP16 head of h[nh][n] rotated as if finite (see
 * quant_group_regs) into y and added to sum (sum + y: one rounding, as an axpy of 1); n 16, 32, 64 or 128. */
static inline __attribute__((always_inline)) void forward_sum_heads(int NV, const uint16_t *h, const float *signs,
                                                                    uint32_t nh, float *y, float *sum) {
  uint32_t n = 16u * (uint32_t)NV;
  const __m512 r = _mm512_set1_ps(ckv_rot_norm(n));
  for (uint32_t hd = 0; hd < nh; hd++) {
    __m512 v[8];
    forward_into_as(1, 1, h + (size_t)hd * n, NV, signs + (size_t)hd * n, r, v);
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) {
      size_t e = (size_t)hd * n + 16u * (size_t)k;
      _mm512_storeu_ps(y + e, v[k]);
      _mm512_storeu_ps(sum + e, _mm512_add_ps(_mm512_loadu_ps(sum + e), v[k]));
    }
  }
}

void ckv_rot_forward_f16_sum_avx512(const uint16_t *h, const float *signs, uint32_t nh, uint32_t n, float *y,
                                    float *sum) {
  switch (n) {
    case 16: forward_sum_heads(1, h, signs, nh, y, sum); return;
    case 32: forward_sum_heads(2, h, signs, nh, y, sum); return;
    case 64: forward_sum_heads(4, h, signs, nh, y, sum); return;
    default: forward_sum_heads(8, h, signs, nh, y, sum); return;
  }
}
