/* test_kernels_simd.c - every CPU path (scalar, AVX2, AVX-512) forced in turn:
 * quantizing row primitives and whole transitions must write the scalar
 * path's bytes exactly (edge values included: ties, -0, NaN, Inf, huge and
 * tiny magnitudes); attention must agree with the scalar path within 1e-4
 * relative.  Paths the CPU lacks are reported as skipped. */
#include <criterion/criterion.h>
#include <float.h>
#include <stdio.h>

#include "kernels/rowops.h"
#include "kernels_fixture.h"

static const ckv_cpu_path simd_paths[] = {CKV_PATH_AVX2, CKV_PATH_AVX512};

static void fill_edges(float *x, size_t n, kf_rng *r) {
  static const float edge[] = {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, -0.0f, 0.0f, NAN, INFINITY, -INFINITY,
                               1e30f, -1e30f, 1e-30f, 126.5f, 127.49f, -127.5f, 7.5f, 15.5f, 3.5f, 65504.0f};
  for (size_t i = 0; i < n; i++) x[i] = i < sizeof edge / sizeof edge[0] ? edge[i] : kf_normal(r) * 10.0f;
}

static const ckv_rowops *table(ckv_cpu_path p) {
  return p == CKV_PATH_AVX512 ? &ckv_rowops_avx512 : p == CKV_PATH_AVX2 ? &ckv_rowops_avx2 : &ckv_rowops_scalar;
}

Test(simd, row_primitives_bit_equal) {
  kf_rng r = {31};
  enum { N = 203 }; /* not a multiple of any vector width: tails too */
  float x[N], zero[N], inv[N], a[N], b[N], mn[N], mx[N], mn2[N], mx2[N];
  uint16_t h[N];
  int8_t q1[N], q2[N];
  uint8_t c1[N], c2[N], packed[N];
  fill_edges(x, N, &r);
  for (int i = 0; i < N; i++) {
    zero[i] = kf_normal(&r);
    inv[i] = i % 5 == 0 ? 0.0f : fabsf(kf_normal(&r)) + 0.01f;
    h[i] = (uint16_t)kf_next(&r);
    mn[i] = mn2[i] = INFINITY;
    mx[i] = mx2[i] = -INFINITY;
  }
  int tested = 0;
  for (size_t p = 0; p < 2; p++) {
    if (!ckv_kernels_path_supported(simd_paths[p])) {
      printf("simd: %s not supported by this CPU: skipped\n", ckv_kernels_path_name(simd_paths[p]));
      continue;
    }
    tested++;
    const ckv_rowops *S = &ckv_rowops_scalar, *V = table(simd_paths[p]);
    S->quant_i8(x, 0.37f, q1, N);
    V->quant_i8(x, 0.37f, q2, N);
    cr_expect_arr_eq(q1, q2, N, "quant_i8 %s", V->name);
    for (uint32_t bits = 2; bits <= 4; bits += 2) {
      S->quant_u(x, zero, inv, bits, c1, N);
      V->quant_u(x, zero, inv, bits, c2, N);
      cr_expect_arr_eq(c1, c2, N, "quant_u%u %s", bits, V->name);
      ckv_pack_codes(c1, N, bits, packed);
      S->cvt_codes(packed, bits, a, N);
      V->cvt_codes(packed, bits, b, N);
      cr_expect_arr_eq(a, b, N * sizeof(float), "cvt_codes%u %s", bits, V->name);
      for (int i = 0; i < N; i++) cr_expect_eq(a[i], (float)c1[i]);
    }
    S->cvt_f16(h, a, N);
    V->cvt_f16(h, b, N);
    for (int i = 0; i < N; i++)
      cr_expect(ckv_f32_bits(a[i]) == ckv_f32_bits(b[i]) || (isnan(a[i]) && isnan(b[i])), "cvt_f16 %04x", h[i]);
    S->cvt_bf16(h, a, N);
    V->cvt_bf16(h, b, N);
    cr_expect_arr_eq(a, b, N * sizeof(float));
    S->cvt_i8(q1, 0.37f, a, N);
    V->cvt_i8(q1, 0.37f, b, N);
    cr_expect_arr_eq(a, b, N * sizeof(float));
    memcpy(a, zero, sizeof a);
    memcpy(b, zero, sizeof b);
    S->affine(a, 0.3f, -1.25f, N);
    V->affine(b, 0.3f, -1.25f, N);
    cr_expect_arr_eq(a, b, N * sizeof(float));
    cr_expect_eq(S->absmax(x, N), V->absmax(x, N));
    S->minmax(x, mn, mx, N);
    V->minmax(x, mn2, mx2, N);
    for (int i = 0; i < N; i++) cr_expect(mn[i] == mn2[i] && mx[i] == mx2[i], "minmax %d", i);
    {
      float pmn[N], pmx[N], zf1[N], zf2[N], iv1[N], iv2[N];
      uint16_t s1[N], s2[N], z1[N], z2[N];
      for (int i = 0; i < N; i++) {
        pmn[i] = i % 7 == 0 ? x[i] : fminf(x[i], zero[i]);
        pmx[i] = i % 11 == 0 ? x[(i + 3) % N] : fmaxf(x[i], zero[i]) * (i % 3 ? 1.0f : 1e-6f);
      }
      pmn[N - 1] = INFINITY, pmx[N - 1] = -INFINITY; /* empty group */
      pmn[N - 2] = -0.0f, pmx[N - 2] = 0.0f;
      pmn[N - 3] = -1e-7f, pmx[N - 3] = 1e-7f; /* subnormal FP16 */
      for (uint32_t bits = 2; bits <= 4; bits += 2) {
        S->qa_params(pmn, pmx, N, bits, s1, z1, zf1, iv1);
        V->qa_params(pmn, pmx, N, bits, s2, z2, zf2, iv2);
        cr_expect_arr_eq(s1, s2, sizeof s1, "qa_params scale %s", V->name);
        cr_expect_arr_eq(z1, z2, sizeof z1, "qa_params zero %s", V->name);
        cr_expect_arr_eq(iv1, iv2, sizeof iv1, "qa_params inv %s", V->name);
      }
    }
    /* reductions: close, not bit-equal */
    float d1 = S->dot(zero, inv, N), d2 = V->dot(zero, inv, N);
    cr_expect_leq(fabsf(d1 - d2), 1e-4f * (1 + fabsf(d1)));
    for (int i = 0; i < N; i++) a[i] = b[i] = i % 9 == 0 ? -INFINITY : -fabsf(zero[i]) * 20.0f;
    float e1 = S->exp_sub(a, 1.0f, N), e2 = V->exp_sub(b, 1.0f, N);
    cr_expect_leq(fabsf(e1 - e2), 1e-5f * e1);
    for (int i = 0; i < N; i++) cr_expect_leq(fabsf(a[i] - b[i]), 1e-6f * a[i] + 1e-30f, "exp %d: %g %g", i, a[i], b[i]);
    for (int i = 0; i < N; i += 9) cr_expect_eq(b[i], 0.0f);
  }
  if (!tested) cr_skip_test("no SIMD path on this CPU");
}

/* The whole-row quantizers (one call per row: vectorised group absmax / range,
 * F16C scale rounding) against the scalar table and against the per-group
 * composition of the older primitives they replace, on ragged groups, edge
 * groups (all NaN, all zero, -0, tiny, huge), and with one-element groups over
 * a sweep of float bit patterns, so every scale and zero point rounding
 * (quant.h: up for scales, down for zero points) is compared lane by lane. */
static void check_groups(const ckv_rowops *V, const float *x, size_t n, size_t gl) {
  const ckv_rowops *S = &ckv_rowops_scalar;
  size_t ng = (n + gl - 1) / gl;
  int8_t *q1 = malloc(n), *q2 = malloc(n), *q3 = malloc(n);
  uint16_t *s1 = malloc(ng * 4), *s2 = malloc(ng * 4), *s3 = malloc(ng * 4);
  uint8_t *c1 = malloc(n), *c2 = malloc(n), *c3 = malloc(n);
  float *zero = malloc(n * sizeof(float)), *inv = malloc(n * sizeof(float));
  cr_assert(q1 && q2 && q3 && s1 && s2 && s3 && c1 && c2 && c3 && zero && inv);
  /* the composition move.c used before the whole-row primitives */
  for (size_t lo = 0, q = 0; lo < n; lo += gl, q++) {
    size_t cnt = n - lo < gl ? n - lo : gl;
    s3[q] = ckv_q8_scale(S->absmax(x + lo, cnt));
    S->quant_i8(x + lo, ckv_inv_scale(s3[q]), q3 + lo, cnt);
  }
  S->quant_i8_groups(x, n, gl, q1, s1);
  V->quant_i8_groups(x, n, gl, q2, s2);
  cr_expect_arr_eq(s1, s3, ng * 2, "quant_i8_groups scales scalar vs composition, gl %zu", gl);
  cr_expect_arr_eq(q1, q3, n, "quant_i8_groups codes scalar vs composition, gl %zu", gl);
  cr_expect_arr_eq(s1, s2, ng * 2, "quant_i8_groups scales %s gl %zu", V->name, gl);
  cr_expect_arr_eq(q1, q2, n, "quant_i8_groups codes %s gl %zu", V->name, gl);
  for (uint32_t bits = 2; bits <= 4; bits += 2) {
    for (size_t lo = 0, q = 0; lo < n; lo += gl, q++) {
      size_t cnt = n - lo < gl ? n - lo : gl;
      float mn, mx;
      S->range(x + lo, cnt, &mn, &mx);
      ckv_qa_params(mn, mx, bits, &s3[2 * q], &s3[2 * q + 1]);
      for (size_t k = lo; k < lo + cnt; k++) {
        zero[k] = ckv_f16_to_f32(s3[2 * q + 1]);
        inv[k] = ckv_inv_scale(s3[2 * q]);
      }
    }
    S->quant_u(x, zero, inv, bits, c1, n);
    ckv_pack_codes(c1, n, bits, c3);
    memset(c1, 0, n), memset(c2, 0, n);
    S->quant_u_groups(x, n, gl, bits, s1, c1);
    V->quant_u_groups(x, n, gl, bits, s2, c2);
    cr_expect_arr_eq(s1, s3, ng * 4, "quant_u_groups params scalar vs composition, bits %u gl %zu", bits, gl);
    cr_expect_arr_eq(c1, c3, (n * bits + 7) / 8, "quant_u_groups codes scalar vs composition, bits %u gl %zu", bits, gl);
    for (size_t q = 0; q < ng * 2; q++)
      if (s1[q] != s2[q]) {
        cr_expect_eq(s2[q], s1[q], "quant_u_groups %s bits %u gl %zu: param %zu (group x[%zu] = %a): %04x, scalar %04x",
                     V->name, bits, gl, q, q / 2 * gl, (double)x[q / 2 * gl], s2[q], s1[q]);
        break;
      }
    cr_expect_arr_eq(c1, c2, n, "quant_u_groups packed codes %s bits %u gl %zu", V->name, bits, gl);
  }
  /* straight from FP16 / BF16 halves (draft rows): against the scalar widening then the scalar groups */
  if (V->quant_i8_groups_h) {
    uint16_t *hv = malloc(n * 2);
    cr_assert(hv);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      for (size_t i = 0; i < n; i++) hv[i] = bf16 ? (uint16_t)(ckv_f32_bits(x[i]) >> 16) : ckv_f32_to_f16(x[i]);
      (bf16 ? S->cvt_bf16 : S->cvt_f16)(hv, zero, n);
      S->quant_i8_groups(zero, n, gl, q1, s1);
      V->quant_i8_groups_h(hv, bf16, n, gl, q2, s2);
      cr_expect_arr_eq(s1, s2, ng * 2, "quant_i8_groups_h scales %s bf16 %d gl %zu", V->name, bf16, gl);
      cr_expect_arr_eq(q1, q2, n, "quant_i8_groups_h codes %s bf16 %d gl %zu", V->name, bf16, gl);
    }
    free(hv);
  }
  /* committed rows straight from halves (move.c's fused path): groups of 32, per-channel min / max, codes */
  if (V->quant_u32_groups_h && V->minmax_h && V->quant_u_h && gl == 32) {
    size_t m = n / 32 * 32;
    uint16_t *hv = malloc(m * 2), *p1 = malloc(m / 8 + 8), *p2 = malloc(m / 8 + 8);
    float *w = malloc(m * sizeof(float)), *mn1 = malloc(m * sizeof(float)), *mx1 = malloc(m * sizeof(float));
    float *mn2 = malloc(m * sizeof(float)), *mx2 = malloc(m * sizeof(float));
    cr_assert(hv && p1 && p2 && w && mn1 && mx1 && mn2 && mx2);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      for (size_t i = 0; i < m; i++) hv[i] = bf16 ? (uint16_t)(ckv_f32_bits(x[i]) >> 16) : ckv_f32_to_f16(x[i]);
      (bf16 ? S->cvt_bf16 : S->cvt_f16)(hv, w, m);
      for (uint32_t bits = 2; bits <= 4; bits += 2) {
        memset(c1, 0, n), memset(c2, 0xa5, n); /* every byte written: no zeroing first */
        S->quant_u_groups(w, m, 32, bits, p1, c1);
        V->quant_u32_groups_h(hv, bf16, m, bits, p2, c2);
        cr_expect_arr_eq(p1, p2, m / 32 * 4, "quant_u32_groups_h params %s bf16 %d bits %u", V->name, bf16, bits);
        cr_expect_arr_eq(c1, c2, m * bits / 8, "quant_u32_groups_h codes %s bf16 %d bits %u", V->name, bf16, bits);
        /* per-element params of those groups, then the codes of quant_u_h against quant_u + ckv_pack_codes */
        for (size_t k = 0; k < m; k++) {
          zero[k] = ckv_f16_to_f32(p1[2 * (k / 32) + 1]);
          inv[k] = ckv_inv_scale(p1[2 * (k / 32)]);
        }
        S->quant_u(w, zero, inv, bits, c1, m);
        ckv_pack_codes(c1, m, bits, c3);
        memset(c2, 0x5a, n);
        V->quant_u_h(hv, bf16, zero, inv, bits, c2, m);
        cr_expect_arr_eq(c3, c2, m * bits / 8, "quant_u_h codes %s bf16 %d bits %u", V->name, bf16, bits);
      }
      for (size_t i = 0; i < m; i++) { /* accumulators with a history, NaN-free as move.c's are */
        mn1[i] = mn2[i] = (i % 3) ? INFINITY : 0.5f;
        mx1[i] = mx2[i] = (i % 5) ? -INFINITY : -0.5f;
      }
      S->minmax(w, mn1, mx1, m);
      V->minmax_h(hv, bf16, mn2, mx2, m);
      cr_expect_eq(memcmp(mn1, mn2, m * sizeof(float)), 0, "minmax_h min %s bf16 %d", V->name, bf16);
      cr_expect_eq(memcmp(mx1, mx2, m * sizeof(float)), 0, "minmax_h max %s bf16 %d", V->name, bf16);
      if (V->minmax_rows_h && m > 128) { /* five rows at once against minmax_h row by row: widths that are a
                                            * multiple of 64, of 32 only, and odd (every tail) */
        const uint16_t *rows[5];
        for (int k = 0; k < 5; k++) rows[k] = hv + 8 * k; /* overlapping windows: each element seen in several */
        const size_t widths[] = {m - 64, m - 96, m - 71};
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
          size_t wn = widths[wi];
          for (size_t i = 0; i < wn; i++) {
            mn1[i] = mn2[i] = (i % 3) ? INFINITY : 0.5f;
            mx1[i] = mx2[i] = (i % 5) ? -INFINITY : -0.5f;
          }
          for (int k = 0; k < 5; k++) V->minmax_h(rows[k], bf16, mn1, mx1, wn);
          V->minmax_rows_h(rows, 5, bf16, mn2, mx2, wn);
          cr_expect_eq(memcmp(mn1, mn2, wn * sizeof(float)), 0, "minmax_rows_h min %s bf16 %d n %zu", V->name, bf16, wn);
          cr_expect_eq(memcmp(mx1, mx2, wn * sizeof(float)), 0, "minmax_rows_h max %s bf16 %d n %zu", V->name, bf16, wn);
        }
      }
    }
    free(hv), free(p1), free(p2), free(w), free(mn1), free(mx1), free(mn2), free(mx2);
  }
  free(q1), free(q2), free(q3), free(s1), free(s2), free(s3), free(c1), free(c2), free(c3), free(zero), free(inv);
}

Test(simd, group_quantizers_bit_equal) {
  kf_rng r = {53};
  enum { N = 1031, SWEEP = 65536 };
  float *x = malloc(SWEEP * sizeof(float));
  cr_assert(x);
  fill_edges(x, N, &r);
  /* whole edge groups: all NaN, all +0, all -0, FP16-subnormal scales, huge */
  for (int i = 256; i < 288; i++) x[i] = NAN;
  for (int i = 288; i < 320; i++) x[i] = 0.0f;
  for (int i = 320; i < 352; i++) x[i] = -0.0f;
  for (int i = 352; i < 384; i++) x[i] = kf_normal(&r) * 1e-6f;
  for (int i = 384; i < 416; i++) x[i] = kf_normal(&r) * 1e6f;
  for (int i = 416; i < 448; i++) x[i] = 3.0f + kf_normal(&r) * 1e-3f; /* far from 0: the zero point matters */
  /* beyond FP16's range (BF16 keeps them): the largest magnitudes below infinity's bits, and NaNs among them */
  for (int i = 448; i < 480; i++) x[i] = kf_normal(&r) * 1e37f;
  x[450] = FLT_MAX, x[455] = -FLT_MAX, x[460] = NAN, x[461] = -NAN, x[470] = 3e38f;
  for (int i = 480; i < 512; i++) x[i] = kf_normal(&r); /* an infinity among finite values, and a NaN */
  x[490] = INFINITY, x[491] = NAN, x[500] = -INFINITY;
  static const size_t gls[] = {1, 7, 8, 16, 32, 40, 48, 128, 1024, N};
  int tested = 0;
  for (size_t p = 0; p < 2; p++) {
    if (!ckv_kernels_path_supported(simd_paths[p])) continue;
    tested++;
    const ckv_rowops *V = table(simd_paths[p]);
    for (size_t k = 0; k < sizeof gls / sizeof gls[0]; k++) check_groups(V, x, N, gls[k]);
  }
  /* every 65537th float bit pattern, one per group: each lane's own scale and zero point */
  float *y = malloc(SWEEP * sizeof(float));
  cr_assert(y);
  for (uint32_t i = 0; i < SWEEP; i++) y[i] = ckv_bits_f32(i * 65537u + (i >> 3));
  for (size_t p = 0; p < 2; p++)
    if (ckv_kernels_path_supported(simd_paths[p])) check_groups(table(simd_paths[p]), y, SWEEP, 1);
  check_groups(&ckv_rowops_scalar, y, SWEEP, 1); /* the scalar table against the old composition */
  free(x), free(y);
  if (!tested) cr_skip_test("no SIMD path on this CPU");
}

/* Whole transitions: the same blocks, byte for byte, on every path. */
static void *convert_all(const ckv_geometry *g, void *const *drafts, uint32_t fmt, uint32_t kept, void **ret_staged) {
  void *s = kf_block(CKV_FORMAT_STAGED, g, 64, 0), *c = kf_block(fmt, g, 64, kept);
  ckv_move m[64];
  for (uint32_t i = 0; i < 64; i++) m[i] = (ckv_move){.src = drafts[i / 16], .src_slot = i % 16, .dst = s, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(g, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
  for (uint32_t i = 0; i < 40; i++) m[i] = (ckv_move){.src = i % 2 ? s : drafts[i / 16], .src_slot = i % 16, .dst = c, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(g, m, 40, CKV_MOVE_SET_VALID), CKV_OK);
  *ret_staged = s;
  return c;
}

static float gen_wild(kf_rng *r, uint32_t l, uint32_t kv, uint32_t e, void *ctx) {
  float v = kf_normal(r);
  if (e % 17 == 3) v *= 40.0f; /* outlier channels */
  if (kf_next(r) % 97 == 0) v = 0.0f;
  return v;
}

Test(simd, transitions_bit_equal) {
  const ckv_geometry geoms[] = {{2, 2, 64, CKV_DTYPE_FP16}, {1, 3, 40, CKV_DTYPE_BF16}, {1, 6, 8, CKV_DTYPE_FP16}};
  int tested = 0;
  for (size_t gi = 0; gi < 3; gi++) {
    const ckv_geometry *g = &geoms[gi];
    kf_rng r = {41 + gi};
    void *d[4];
    for (int i = 0; i < 4; i++) {
      d[i] = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
      kf_fill_draft(g, d[i], &r, gen_wild, NULL, 16u * i);
    }
    for (uint32_t fmt = CKV_FORMAT_COMMIT4; fmt <= CKV_FORMAT_COMMIT2; fmt++) {
      uint32_t kept = fmt == CKV_FORMAT_COMMIT2 ? g->head_dim / 2 : 0;
      cr_assert_eq(ckv_kernels_force(CKV_PATH_SCALAR), CKV_OK);
      void *s_ref, *c_ref = convert_all(g, d, fmt, kept, &s_ref);
      for (size_t p = 0; p < 2; p++) {
        if (ckv_kernels_force(simd_paths[p]) != CKV_OK) continue;
        tested++;
        void *s, *c = convert_all(g, d, fmt, kept, &s);
        cr_expect_eq(memcmp(s, s_ref, ckv_format_block_bytes(CKV_FORMAT_STAGED, g, 64, 0)), 0, "staged bytes, %s",
                     ckv_kernels_path_name(simd_paths[p]));
        cr_expect_eq(memcmp(c, c_ref, ckv_format_block_bytes(fmt, g, 64, kept)), 0, "commit bytes fmt %u, %s", fmt,
                     ckv_kernels_path_name(simd_paths[p]));
        /* and read back: this path's floats of the scalar blocks are the scalar path's (pruned keys too) */
        size_t te = ckv_draft_token_elems(g);
        float *x = malloc(te * sizeof(float)), *y = malloc(te * sizeof(float));
        for (int which = 0; which < 2; which++)
          for (uint32_t slot = 0; slot < 64; slot++)
            for (uint32_t l = 0; l < g->n_layers; l++)
              for (uint32_t kv = 0; kv < 2; kv++) {
                const void *blk = which ? c_ref : s_ref;
                cr_assert_eq(ckv_kernels_dequantize(g, blk, l, kv, slot, y), CKV_OK);
                ckv_kernels_force(CKV_PATH_SCALAR);
                cr_assert_eq(ckv_kernels_dequantize(g, blk, l, kv, slot, x), CKV_OK);
                ckv_kernels_force(simd_paths[p]);
                cr_expect_eq(memcmp(x, y, te * sizeof(float)), 0, "dequantized %s fmt %u slot %u layer %u kv %u, %s",
                             which ? "commit" : "staged", fmt, slot, l, kv, ckv_kernels_path_name(simd_paths[p]));
              }
        free(x), free(y);
        free(s), free(c);
      }
      free(s_ref), free(c_ref);
    }
    for (int i = 0; i < 4; i++) free(d[i]);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  if (!tested) cr_skip_test("no SIMD path on this CPU");
}

static float gen_edges(kf_rng *r, uint32_t l, uint32_t kv, uint32_t e, void *ctx) {
  float v = gen_wild(r, l, kv, e, ctx);
  uint64_t u = kf_next(r) % 401;
  return u == 0 ? NAN : u == 1 ? INFINITY : u == 2 ? -INFINITY : u == 3 ? 70000.0f : v;
}

/* Drafts straight into committed blocks, nothing pruned (move.c's fused path where the geometry
 * allows it: head_dim and rows in groups of 32) and half the key channels pruned (magnitudes summed
 * from the halves), a full chunk and a partial one, with NaN, +-Inf and values past FP16's range in
 * the drafts: the same bytes on every path as on the scalar one. */
Test(simd, draft_to_committed_bit_equal) {
  const ckv_geometry geoms[] = {{2, 2, 64, CKV_DTYPE_FP16}, {1, 4, 32, CKV_DTYPE_BF16}, {1, 8, 128, CKV_DTYPE_FP16},
                                {1, 6, 8, CKV_DTYPE_FP16}};
  int tested = 0;
  for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++) {
    const ckv_geometry *g = &geoms[gi];
    kf_rng r = {71 + gi};
    void *d[4];
    for (int i = 0; i < 4; i++) {
      d[i] = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
      kf_fill_draft(g, d[i], &r, gen_edges, NULL, 16u * i);
    }
    for (uint32_t fk = 0; fk < 4; fk++) { /* INT4, INT2; every channel, then half pruned (magnitudes from halves) */
      uint32_t fmt = fk % 2 ? CKV_FORMAT_COMMIT2 : CKV_FORMAT_COMMIT4, kept = fk >= 2 ? g->head_dim / 2 : 0;
      void *ref = NULL;
      for (int p = -1; p < 2; p++) {
        if (ckv_kernels_force(p < 0 ? CKV_PATH_SCALAR : simd_paths[p]) != CKV_OK) continue;
        void *c = kf_block(fmt, g, 64, kept);
        ckv_move m[44];
        for (uint32_t i = 0; i < 44; i++) /* slots 0..31 (a full chunk) and 32..43, in a scrambled order */
          m[i] = (ckv_move){.src = d[(i * 7) % 44 / 16], .src_slot = (i * 7) % 44 % 16, .dst = c, .dst_slot = (i * 7) % 44};
        cr_assert_eq(ckv_kernels_move(g, m, 44, CKV_MOVE_SET_VALID), CKV_OK);
        if (p < 0) {
          ref = c;
          continue;
        }
        tested++;
        cr_expect_eq(memcmp(c, ref, ckv_format_block_bytes(fmt, g, 64, kept)), 0,
                     "draft -> commit fmt %u kept %u geometry %zu, %s", fmt, kept, gi, ckv_kernels_path_name(simd_paths[p]));
        free(c);
      }
      free(ref);
    }
    for (int i = 0; i < 4; i++) free(d[i]);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  if (!tested) cr_skip_test("no SIMD path on this CPU");
}

Test(simd, attention_close_to_scalar) {
  const ckv_geometry g = {1, 2, 128, CKV_DTYPE_FP16};
  kf_rng r = {51};
  void *d[4];
  for (int i = 0; i < 4; i++) {
    d[i] = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0);
    kf_fill_draft(&g, d[i], &r, gen_wild, NULL, 16u * i);
  }
  void *s, *c = convert_all(&g, d, CKV_FORMAT_COMMIT4, 96, &s);
  ckv_block_set_valid(d[0], 2, false);
  const void *blocks[] = {d[0], s, c, d[3]};
  enum { QH = 8, D = 128, R = 2 };
  float q[R * QH * D], o_ref[R * QH * D], o[R * QH * D], m_ref[16 + 64 + 64 + 16], m[16 + 64 + 64 + 16];
  for (int i = 0; i < R * QH * D; i++) q[i] = kf_normal(&r);
  ckv_attn_args a = {.geom = &g, .n_rows = R, .n_q_heads = QH, .q = q, .blocks = blocks, .n_blocks = 4, .out = o_ref, .mass = m_ref};
  ckv_kernels_force(CKV_PATH_SCALAR);
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  int tested = 0;
  for (size_t p = 0; p < 2; p++) {
    if (ckv_kernels_force(simd_paths[p]) != CKV_OK) continue;
    tested++;
    a.out = o;
    a.mass = m;
    cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
    double err = kf_max_rel(o, o_ref, R * QH * D, 0.05);
    cr_expect_leq(err, 1e-4, "%s: %g", ckv_kernels_path_name(simd_paths[p]), err);
    cr_expect_leq(kf_max_rel(m, m_ref, 160, 1e-3), 1e-4);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  for (int i = 0; i < 4; i++) free(d[i]);
  free(s), free(c);
  if (!tested) cr_skip_test("no SIMD path on this CPU");
}

Test(simd, force_and_env) {
  cr_expect_eq(ckv_kernels_force(CKV_PATH_SCALAR), CKV_OK);
  cr_expect_eq(ckv_kernels_path(), CKV_PATH_SCALAR);
  cr_expect_eq(ckv_kernels_force((ckv_cpu_path)9), CKV_ERR_INVALID);
  cr_expect_eq(ckv_kernels_force(CKV_PATH_AUTO), CKV_OK);
  cr_expect_neq(ckv_kernels_path(), CKV_PATH_AUTO);
  printf("simd: auto path on this CPU: %s\n", ckv_kernels_path_name(ckv_kernels_path()));
}
