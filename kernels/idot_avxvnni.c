/* idot_avxvnni.c - the integer dot products (idot.h) for AVX2 CPUs with
 * AVX-VNNI (the VEX-encoded 256-bit vpdpbusd: Alder Lake and later, and
 * AVX-512 CPUs that also have it): compiled with -mavx2 -mavxvnni
 * (kernels/CMakeLists.txt), used on the AVX2 path after dispatch.c checked
 * the CPU (CPUID leaf 7.1 EAX bit 4).
 *
 * 4-bit and 2-bit rows as idot_avx512.c does them, eight tokens a tile:
 * eight rows are loaded 32 bytes at a time and transposed as an 8 x 8
 * matrix of dwords (24 shuffles), so lane i of vector j holds dword j of
 * token i, and each vpdpbusd adds four codes of eight tokens times one
 * broadcast query dword into the tokens' own lanes (no horizontal sum per
 * token and query row).  INT8 rows keep the AVX2 table's maddubs loop (the
 * 32 dwords of a 128-channel row would need four transposes a tile).
 * Channels past the last whole dword are summed by the scalar tails; tokens
 * past nt in the last tile read the last row again and are not stored. */
#include <immintrin.h>
#include <string.h>

#include "kernels/idot.h"

#include "kernels/force_inline.h" /* AI */
#define UNROLL _Pragma("GCC unroll 8")

/* In place: r[j] lane i = dword j of r[i]. */
AI void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  UNROLL
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  UNROLL
  for (int g = 0; g < 2; g++) { /* u[4g + k] lane L (128-bit): dword 4L + k of rows 4g..4g+3 */
    u[4 * g + 0] = _mm256_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm256_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm256_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm256_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  UNROLL
  for (int k = 0; k < 4; k++) {
    r[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
    r[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
  }
}

/* The query's four bytes that meet plane p of dword J (idot.h's nibble and crumb orders). */
AI size_t qoff(const int bits, size_t J, int p) {
  if (bits == 4) return 64u * (J / 8u) + 32u * (size_t)p + 4u * (J % 8u);
  return 128u * (J / 8u) + 32u * (size_t)p + 4u * (J % 8u);
}
AI __m256i qdword(const int8_t *q, size_t off) {
  int32_t v;
  memcpy(&v, q + off, sizeof v);
  return _mm256_set1_epi32(v);
}

/* Lanes of the dwords [c, c + 8) a row has (nd whole dwords): all-ones for those below nd. */
AI __m256i dword_mask(size_t left) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left >= 8u ? 8u : left)), iota);
}

/* NR query rows (rows past nq repeat the last; not stored) against tokens [t0, t0 + 8) of nd whole dwords. */
AI void tile(const int8_t *p, size_t nq, size_t ldp, size_t i0, const uint8_t *rows, size_t stride, size_t nt,
             size_t t0, size_t nd, int32_t *out, size_t ldo, const int NR, const int bits) {
  const int8_t *q[4];
  UNROLL
  for (int r = 0; r < NR; r++) q[r] = p + (i0 + (size_t)r < nq ? i0 + (size_t)r : nq - 1) * ldp;
  const uint8_t *row[8];
  UNROLL
  for (int i = 0; i < 8; i++) row[i] = rows + (t0 + (size_t)i < nt ? t0 + (size_t)i : nt - 1) * stride;
  __m256i acc[4];
  UNROLL
  for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_si256();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
  for (size_t c = 0; c < nd; c += 8) {
    size_t left = nd - c;
    __m256i x[8];
    if (left >= 8u) {
      UNROLL
      for (int i = 0; i < 8; i++) x[i] = _mm256_loadu_si256((const __m256i *)(const void *)(row[i] + 4u * c));
    } else { /* only the row's whole dwords */
      __m256i m = dword_mask(left);
      UNROLL
      for (int i = 0; i < 8; i++) x[i] = _mm256_maskload_epi32((const int *)(const void *)(row[i] + 4u * c), m);
    }
    transpose8(x);
    UNROLL
    for (int j = 0; j < 8; j++) {
      if ((size_t)j >= left) break;
      size_t J = c + (size_t)j;
      if (bits == 4) {
        __m256i lo = _mm256_and_si256(x[j], m4), hi = _mm256_and_si256(_mm256_srli_epi16(x[j], 4), m4);
        UNROLL
        for (int r = 0; r < NR; r++) {
          acc[r] = _mm256_dpbusd_avx_epi32(acc[r], lo, qdword(q[r], qoff(4, J, 0)));
          acc[r] = _mm256_dpbusd_avx_epi32(acc[r], hi, qdword(q[r], qoff(4, J, 1)));
        }
      } else {
        __m256i c0 = _mm256_and_si256(x[j], m2), c1 = _mm256_and_si256(_mm256_srli_epi16(x[j], 2), m2);
        __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(x[j], 4), m2), c3 = _mm256_and_si256(_mm256_srli_epi16(x[j], 6), m2);
        UNROLL
        for (int r = 0; r < NR; r++) {
          acc[r] = _mm256_dpbusd_avx_epi32(acc[r], c0, qdword(q[r], qoff(2, J, 0)));
          acc[r] = _mm256_dpbusd_avx_epi32(acc[r], c1, qdword(q[r], qoff(2, J, 1)));
          acc[r] = _mm256_dpbusd_avx_epi32(acc[r], c2, qdword(q[r], qoff(2, J, 2)));
          acc[r] = _mm256_dpbusd_avx_epi32(acc[r], c3, qdword(q[r], qoff(2, J, 3)));
        }
      }
    }
  }
  size_t ns = nt - t0 >= 8u ? 8u : nt - t0;
  UNROLL
  for (int r = 0; r < NR; r++) {
    if (i0 + (size_t)r >= nq) continue;
    int32_t *o = out + (i0 + (size_t)r) * ldo + t0;
    if (ns == 8u) {
      _mm256_storeu_si256((__m256i *)(void *)o, acc[r]);
    } else {
      int32_t s[8];
      _mm256_storeu_si256((__m256i *)(void *)s, acc[r]);
      memcpy(o, s, ns * sizeof(int32_t));
    }
  }
}

/* 4-bit and 2-bit rows: whole dwords through the tiles (four query rows a tile), the rest by the scalar tail. */
static void x_un(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo, const int bits) {
  size_t per = 32u / (size_t)bits, nd = n / per;
  for (size_t i0 = 0; nd && i0 < nq; i0 += 4)
    for (size_t t0 = 0; t0 < nt; t0 += 8) {
      if (bits == 4)
        tile(p, nq, ldp, i0, rows, stride, nt, t0, nd, out, ldo, 4, 4);
      else
        tile(p, nq, ldp, i0, rows, stride, nt, t0, nd, out, ldo, 4, 2);
    }
  for (size_t t = 0; per * nd < n && t < nt; t++)
    for (size_t r = 0; r < nq; r++) {
      const int8_t *q = p + r * ldp;
      const uint8_t *k = rows + t * stride;
      int32_t s = bits == 4 ? ckv_idot_u4_tail(q, k, per * nd, n) : ckv_idot_u2_tail(q, k, per * nd, n);
      out[r * ldo + t] = nd ? out[r * ldo + t] + s : s;
    }
}

static void x_u4(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  x_un(p, nq, ldp, rows, stride, nt, n, out, ldo, 4);
}
static void x_u2(const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows, size_t stride, size_t nt, size_t n,
                 int32_t *out, size_t ldo) {
  x_un(p, nq, ldp, rows, stride, nt, n, out, ldo, 2);
}

const ckv_idotops ckv_idot_avxvnni = {.name = "avxvnni", .i8 = ckv_idot_avx2_i8, .u4 = x_u4, .u2 = x_u2,
                                      .finish = ckv_idot_scalar_finish, .dot16 = ckv_idot_scalar_dot16};
