/* test_kernels.c - the CPU kernels on the default (auto-detected) path:
 * golden bytes for each format, quantization round trips within their error
 * bounds, key-channel pruning, fused attention against the FP32 oracle, and
 * the errors the daemon relies on.  test_kernels_simd.c repeats the checks
 * per forced path. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels_fixture.h"

static const ckv_geometry tiny = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .dtype = CKV_DTYPE_FP16};

static const uint8_t *at(const void *b, size_t off) { return (const uint8_t *)b + off; }

Test(kernels, golden_staged) {
  void *d = kf_block(CKV_FORMAT_DRAFT, &tiny, 16, 0), *s = kf_block(CKV_FORMAT_STAGED, &tiny, 64, 0);
  float k[32] = {127, -127, 63.5f, 0.4f, 2.5f, 3.5f, -2.5f, 0}, v[32] = {0.5f, -0.25f};
  kf_put(&tiny, d, 0, 0, 3, k);
  kf_put(&tiny, d, 0, 1, 3, v);
  ckv_block_positions(d)[3] = 77;
  ckv_block_set_valid(d, 3, true);
  ckv_move m = {.src = d, .src_slot = 3, .dst = s, .dst_slot = 5};
  cr_assert_eq(ckv_kernels_move(&tiny, &m, 1, CKV_MOVE_SET_VALID), CKV_OK);
  const int8_t *kc = (const int8_t *)at(s, ckv_staged_codes_offset(&tiny, 64, 0, 0) + 5 * 32);
  const int8_t want[8] = {127, -127, 64, 0, 2, 4, -2, 0};
  cr_expect_arr_eq(kc, want, 8);
  const uint16_t *ks = (const uint16_t *)at(s, ckv_staged_scales_offset(&tiny, 64, 0, 0));
  cr_expect_eq(ks[5], 0x3c00); /* 127/127 = 1.0 */
  /* V: absmax 0.5 -> 0.5/127 = 0.0039370; nearest FP16 0x1C08 = 0.0039368 is below, so rounded up: 0x1C09 =
   * 0.0039406; codes 0.5/s = 126.9 -> 127, -0.25/s = -63.44 -> -63 */
  const uint16_t *vs = (const uint16_t *)at(s, ckv_staged_scales_offset(&tiny, 64, 0, 1));
  cr_expect_eq(vs[5], 0x1c09);
  const int8_t *vc = (const int8_t *)at(s, ckv_staged_codes_offset(&tiny, 64, 0, 1) + 5 * 32);
  cr_expect_eq(vc[0], 127);
  cr_expect_eq(vc[1], -63);
  cr_expect_eq(ckv_block_positions(s)[5], 77);
  cr_expect(ckv_block_slot_valid(s, 5));
  cr_expect(!ckv_block_slot_valid(s, 4));
  cr_expect(ckv_block_slot_valid(d, 3)); /* moves never touch sources */
  free(d);
  free(s);
}

static void golden_commit(uint32_t fmt) {
  void *d = kf_block(CKV_FORMAT_DRAFT, &tiny, 16, 0), *c = kf_block(fmt, &tiny, 64, 0);
  uint32_t bits = ckv_format_code_bits(fmt), top = (1u << bits) - 1u;
  /* keys: even channels take 0, top, top/2 (+0.5 tie -> even), odd ones -8 + 2x that */
  for (uint32_t t = 0; t < 3; t++) {
    float k[32], v[32];
    float base = t == 0 ? 0.0f : t == 1 ? (float)top : (float)top / 2.0f;
    for (int ch = 0; ch < 32; ch++) k[ch] = ch % 2 ? -8.0f + 2.0f * base : base;
    for (int e = 0; e < 32; e++) v[e] = (float)(e % (top + 1));
    kf_put(&tiny, d, 0, 0, t, k);
    kf_put(&tiny, d, 0, 1, t, v);
  }
  ckv_move m[3];
  for (uint32_t t = 0; t < 3; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = c, .dst_slot = 32 + t};
  cr_assert_eq(ckv_kernels_move(&tiny, m, 3, CKV_MOVE_SET_VALID), CKV_OK);
  cr_expect_eq(ckv_block_sealed_chunks(c), 2u);
  const uint16_t *p = (const uint16_t *)at(c, ckv_commit_key_chunk_offset(fmt, &tiny, 64, 32, 0, 0, 1));
  cr_expect_eq(p[0], 0x3c00); /* even channel scale 1 */
  cr_expect_eq(p[1], 0x4000); /* odd channel scale 2 */
  cr_expect_eq(p[32], 0x0000);
  cr_expect_eq(p[33], 0xc800); /* zero -8 */
  const uint8_t *rows = (const uint8_t *)(p + 64);
  size_t rb = ckv_commit_key_row_bytes(fmt, 32);
  uint8_t all_top = bits == 4 ? 0xff : 0xff, mid = bits == 4 ? 0x88 : 0xaa; /* 7.5 -> 8; 1.5 -> 2 */
  for (size_t i = 0; i < rb; i++) {
    cr_expect_eq(rows[i], 0x00);
    cr_expect_eq(rows[rb + i], all_top);
    cr_expect_eq(rows[2 * rb + i], mid, "fmt %u byte %zu: %02x", fmt, i, rows[2 * rb + i]);
    cr_expect_eq(rows[3 * rb + i], 0x00); /* unfilled slot of the sealed chunk */
  }
  const uint16_t *vp = (const uint16_t *)at(c, ckv_commit_value_params_offset(fmt, &tiny, 64, 32, 0));
  cr_expect_eq(vp[2 * 32], 0x3c00);
  cr_expect_eq(vp[2 * 32 + 1], 0x0000);
  const uint8_t *vc = at(c, ckv_commit_value_codes_offset(fmt, &tiny, 64, 32, 0) + 32 * ckv_commit_value_row_bytes(fmt, &tiny));
  if (bits == 4) {
    const uint8_t want[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
    cr_expect_arr_eq(vc, want, 16);
  } else {
    for (int i = 0; i < 8; i++) cr_expect_eq(vc[i], 0xe4);
  }
  /* a sealed chunk refuses more tokens; the next chunk is still open */
  ckv_move again = {.src = d, .src_slot = 5, .dst = c, .dst_slot = 40};
  cr_expect_eq(ckv_kernels_move(&tiny, &again, 1, 0), CKV_ERR_STATE);
  again.dst_slot = 1;
  cr_expect_eq(ckv_kernels_move(&tiny, &again, 1, 0), CKV_OK);
  cr_expect_eq(ckv_block_sealed_chunks(c), 3u);
  free(d);
  free(c);
}
Test(kernels, golden_commit4) { golden_commit(CKV_FORMAT_COMMIT4); }
Test(kernels, golden_commit2) { golden_commit(CKV_FORMAT_COMMIT2); }

/* Round trips on random data: every element within half a quantization step. */
static void round_trip(const ckv_geometry *g, uint32_t fmt, uint32_t kept, uint64_t seed) {
  kf_rng r = {seed};
  uint32_t dcap = 16, ccap = fmt == CKV_FORMAT_STAGED ? 48 : 64;
  void *d[4];
  for (int i = 0; i < 4; i++) {
    d[i] = kf_block(CKV_FORMAT_DRAFT, g, dcap, 0);
    kf_fill_draft(g, d[i], &r, NULL, NULL, 100u * i);
  }
  void *c = kf_block(fmt, g, ccap, kept);
  cr_assert(c);
  ckv_move m[64];
  uint32_t n = fmt == CKV_FORMAT_STAGED ? 48 : 64;
  for (uint32_t i = 0; i < n; i++) m[i] = (ckv_move){.src = d[i / 16], .src_slot = i % 16, .dst = c, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(g, m, n, CKV_MOVE_SET_VALID), CKV_OK);
  size_t te = ckv_draft_token_elems(g);
  float *x = malloc(te * 4), *y = malloc(te * 4);
  uint32_t bits = ckv_format_code_bits(fmt), kp = ((ckv_block_header *)c)->kept_channels;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t l = 0; l < g->n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        cr_assert_eq(ckv_kernels_dequantize(g, m[i].src, l, kv, m[i].src_slot, x), CKV_OK);
        cr_assert_eq(ckv_kernels_dequantize(g, c, l, kv, i, y), CKV_OK);
        cr_expect_eq(ckv_block_positions(c)[i], ckv_block_positions_const(m[i].src)[m[i].src_slot]);
        for (size_t e = 0; e < te; e++) {
          double step;
          if (fmt == CKV_FORMAT_STAGED) {
            uint32_t grp = (uint32_t)(e / ((size_t)ckv_staged_group_heads(g) * g->head_dim));
            const uint16_t *sc = (const uint16_t *)at(c, ckv_staged_scales_offset(g, ccap, l, kv));
            step = ckv_f16_to_f32(sc[(size_t)i * ckv_staged_groups(g) + grp]);
          } else if (kv == 0) {
            if (y[e] == 0.0f && kp < g->head_dim) continue; /* maybe pruned: checked in the pruning test */
            /* key step: its channel's chunk scale; bound by the token-chunk range */
            double mn = INFINITY, mx = -INFINITY;
            float *z = malloc(te * 4);
            for (uint32_t t = (i / 32) * 32; t < (i / 32) * 32 + 32; t++) {
              ckv_kernels_dequantize(g, m[t].src, l, 0, m[t].src_slot, z);
              mn = fmin(mn, z[e]);
              mx = fmax(mx, z[e]);
            }
            free(z);
            step = (mx - mn) / ((1u << bits) - 1) * 1.002 + fabs(mn) * 1e-3; /* FP16 rounding of scale and zero */
          } else {
            size_t lo = e / 32 * 32, hi = lo + 32 < te ? lo + 32 : te;
            double mn = INFINITY, mx = -INFINITY;
            for (size_t k = lo; k < hi; k++) mn = fmin(mn, x[k]), mx = fmax(mx, x[k]);
            step = (mx - mn) / ((1u << bits) - 1) * 1.002 + fabs(mn) * 1e-3;
          }
          cr_assert_leq(fabs((double)x[e] - y[e]), step / 2 * (1 + 1e-6) + 1e-7, "fmt %u l %u kv %u tok %u e %zu: %f vs %f step %g",
                        fmt, l, kv, i, e, x[e], y[e], step);
        }
      }
  free(x);
  free(y);
  for (int i = 0; i < 4; i++) free(d[i]);
  free(c);
}

static const ckv_geometry g2 = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .dtype = CKV_DTYPE_FP16};
static const ckv_geometry gsmall = {.n_layers = 1, .n_kv_heads = 5, .head_dim = 8, .dtype = CKV_DTYPE_BF16};
static const ckv_geometry godd = {.n_layers = 1, .n_kv_heads = 3, .head_dim = 40, .dtype = CKV_DTYPE_FP16};

Test(kernels, round_trip_int8) {
  round_trip(&g2, CKV_FORMAT_STAGED, 0, 1);
  round_trip(&gsmall, CKV_FORMAT_STAGED, 0, 2);
  round_trip(&godd, CKV_FORMAT_STAGED, 0, 3);
}
Test(kernels, round_trip_int4) {
  round_trip(&g2, CKV_FORMAT_COMMIT4, 0, 4);
  round_trip(&gsmall, CKV_FORMAT_COMMIT4, 0, 5);
  round_trip(&godd, CKV_FORMAT_COMMIT4, 0, 6);
}
Test(kernels, round_trip_int2) {
  round_trip(&g2, CKV_FORMAT_COMMIT2, 0, 7);
  round_trip(&godd, CKV_FORMAT_COMMIT2, 0, 8);
}
Test(kernels, round_trip_pruned) {
  round_trip(&g2, CKV_FORMAT_COMMIT4, 24, 9);
  round_trip(&godd, CKV_FORMAT_COMMIT2, 13, 10);
}

Test(kernels, staged_to_commit) {
  kf_rng r = {11};
  void *d = kf_block(CKV_FORMAT_DRAFT, &g2, 32, 0), *s = kf_block(CKV_FORMAT_STAGED, &g2, 32, 0);
  void *c = kf_block(CKV_FORMAT_COMMIT4, &g2, 32, 0);
  kf_fill_draft(&g2, d, &r, NULL, NULL, 0);
  ckv_move m[32];
  for (uint32_t i = 0; i < 32; i++) m[i] = (ckv_move){.src = d, .src_slot = i, .dst = s, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(&g2, m, 32, CKV_MOVE_SET_VALID), CKV_OK);
  for (uint32_t i = 0; i < 32; i++) m[i] = (ckv_move){.src = s, .src_slot = 31 - i, .dst = c, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(&g2, m, 32, CKV_MOVE_SET_VALID), CKV_OK);
  cr_expect_eq(ckv_block_positions(c)[0], 31);
  float x[128], y[128];
  ckv_kernels_dequantize(&g2, d, 1, 1, 31, x);
  ckv_kernels_dequantize(&g2, c, 1, 1, 0, y);
  cr_expect_gt(kf_cosine(x, y, 128), 0.99);
  free(d), free(s), free(c);
}

Test(kernels, prune_top_r) {
  /* selection itself: ties go to the lower channel */
  float mag[70];
  for (int i = 0; i < 70; i++) mag[i] = (float)(i % 7);
  uint64_t mask[2];
  ckv_kernels_select_channels(mag, 70, 10, mask);
  int n = 0;
  for (int i = 0; i < 70; i++)
    if ((mask[i / 64] >> (i % 64)) & 1) {
      n++;
      cr_expect(i % 7 == 6 || (i % 7 == 5 && i < 21), "channel %d", i);
    }
  cr_expect_eq(n, 10);
  /* in a block: per (layer, head) exactly the top-r by sum |k| over the block's tokens */
  kf_rng r = {12};
  void *d = kf_block(CKV_FORMAT_DRAFT, &g2, 32, 0), *c = kf_block(CKV_FORMAT_COMMIT2, &g2, 64, 20);
  kf_fill_draft(&g2, d, &r, NULL, NULL, 0);
  ckv_move m[32];
  for (uint32_t i = 0; i < 32; i++) m[i] = (ckv_move){.src = d, .src_slot = i, .dst = c, .dst_slot = i};
  cr_assert_eq(ckv_kernels_prune_keys(&g2, m, 32), CKV_OK);
  cr_assert_eq(ckv_block_sealed_chunks(c), 0u);
  float row[128];
  for (uint32_t l = 0; l < 2; l++)
    for (uint32_t h = 0; h < 2; h++) {
      double sum[64] = {0};
      for (uint32_t i = 0; i < 32; i++) {
        ckv_kernels_dequantize(&g2, d, l, 0, i, row);
        for (int ch = 0; ch < 64; ch++) sum[ch] += fabs(row[h * 64 + ch]);
      }
      const uint64_t *mk = (const uint64_t *)at(c, ckv_commit_mask_offset(CKV_FORMAT_COMMIT2, &g2, 64, 20, l, h));
      cr_expect_eq(__builtin_popcountll(mk[0]), 20);
      for (int a = 0; a < 64; a++)
        for (int b = 0; b < 64; b++)
          if (((mk[0] >> a) & 1) && !((mk[0] >> b) & 1)) cr_expect_geq(sum[a], sum[b] - 1e-3);
    }
  cr_assert_eq(ckv_kernels_move(&g2, m, 32, CKV_MOVE_SET_VALID), CKV_OK);
  ckv_kernels_dequantize(&g2, c, 0, 0, 3, row);
  int zeros = 0;
  for (int ch = 0; ch < 64; ch++) zeros += row[ch] == 0.0f;
  cr_expect_geq(zeros, 44);
  free(d), free(c);
}

Test(kernels, errors) {
  void *d = kf_block(CKV_FORMAT_DRAFT, &tiny, 16, 0), *s = kf_block(CKV_FORMAT_STAGED, &tiny, 16, 0);
  ckv_move m = {.src = d, .src_slot = 0, .dst = s, .dst_slot = 16};
  cr_expect_eq(ckv_kernels_move(&tiny, &m, 1, 0), CKV_ERR_RANGE);
  m.dst_slot = 0;
  ckv_move two[2] = {m, m};
  cr_expect_eq(ckv_kernels_move(&tiny, two, 2, 0), CKV_ERR_INVALID);
  ckv_move back = {.src = s, .src_slot = 0, .dst = d, .dst_slot = 0};
  cr_expect_eq(ckv_kernels_move(&tiny, &back, 1, 0), CKV_ERR_UNSUPPORTED);
  ckv_geometry other = tiny; /* headers carry format, dtype and capacity, not the geometry */
  other.dtype = CKV_DTYPE_BF16;
  cr_expect_eq(ckv_kernels_move(&other, &m, 1, 0), CKV_ERR_FORMAT);
  ((ckv_block_header *)s)->magic = 0;
  cr_expect_eq(ckv_kernels_move(&tiny, &m, 1, 0), CKV_ERR_CORRUPT);
  cr_expect_eq(ckv_kernels_move(&tiny, NULL, 0, 0), CKV_OK);
  float out[32];
  cr_expect_eq(ckv_kernels_dequantize(&tiny, d, 1, 0, 0, out), CKV_ERR_RANGE);
  free(d), free(s);
}

/* Fused attention vs the oracle on a mix of formats with vacated slots. */
void kernels_attention_mixed(const ckv_geometry *g, uint32_t n_rows, uint32_t n_q_heads, uint64_t seed);
void kernels_attention_mixed(const ckv_geometry *g, uint32_t n_rows, uint32_t n_q_heads, uint64_t seed) {
  kf_rng r = {seed};
  void *d[5];
  for (int i = 0; i < 5; i++) {
    d[i] = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
    kf_fill_draft(g, d[i], &r, NULL, NULL, 16u * i);
  }
  void *s = kf_block(CKV_FORMAT_STAGED, g, 64, 0), *c4 = kf_block(CKV_FORMAT_COMMIT4, g, 64, 0);
  void *c2 = kf_block(CKV_FORMAT_COMMIT2, g, 64, g->head_dim / 2);
  ckv_move m[32];
  for (uint32_t i = 0; i < 16; i++) m[i] = (ckv_move){.src = d[0], .src_slot = i, .dst = s, .dst_slot = 2 * i};
  cr_assert_eq(ckv_kernels_move(g, m, 16, CKV_MOVE_SET_VALID), CKV_OK);
  for (uint32_t i = 0; i < 32; i++) m[i] = (ckv_move){.src = d[1 + i / 16], .src_slot = i % 16, .dst = c4, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(g, m, 32, CKV_MOVE_SET_VALID), CKV_OK);
  for (uint32_t i = 0; i < 20; i++) m[i] = (ckv_move){.src = d[3 + i / 16], .src_slot = i % 16, .dst = c2, .dst_slot = 32 + i};
  cr_assert_eq(ckv_kernels_move(g, m, 20, CKV_MOVE_SET_VALID), CKV_OK);
  /* vacate some slots everywhere (a draft block keeps its bytes: must still be skipped) */
  ckv_block_set_valid(d[4], 3, false);
  ckv_block_set_valid(s, 4, false);
  ckv_block_set_valid(c4, 7, false);
  ckv_block_set_valid(c2, 33, false);
  for (uint32_t i = 0; i < 16; i++) ckv_block_set_valid(d[0], i, false);
  const void *blocks[] = {d[4], c2, s, d[0], c4};
  size_t qn = (size_t)n_rows * n_q_heads * g->head_dim, slots = ckv_attention_mass_len(blocks, 5);
  float *q = malloc(qn * 4), *o = malloc(qn * 4), *o_ref = malloc(qn * 4);
  float *mass = malloc(slots * 4), *mass_ref = malloc(slots * 4);
  for (size_t i = 0; i < qn; i++) q[i] = kf_normal(&r) * 2.0f;
  ckv_attn_args a = {.geom = g, .layer = g->n_layers - 1, .n_rows = n_rows, .n_q_heads = n_q_heads, .q = q,
                     .blocks = blocks, .n_blocks = 5, .out = o, .mass = mass};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  a.out = o_ref;
  a.mass = mass_ref;
  cr_assert_eq(ckv_kernels_attention_reference(&a), CKV_OK);
  double rms = 0;
  for (size_t i = 0; i < qn; i++) rms += (double)o_ref[i] * o_ref[i];
  rms = sqrt(rms / qn);
  /* relative error per output, against max(|ref|, 5% of the rms) so near-zero outputs do not blow up */
  double err = kf_max_rel(o, o_ref, qn, 0.05 * rms);
  cr_expect_leq(err, 1e-3, "path %s: rel err %g", ckv_kernels_path_name(ckv_kernels_path()), err);
  double total = 0;
  for (size_t i = 0; i < slots; i++) {
    total += mass[i];
    cr_expect_leq(fabs(mass[i] - mass_ref[i]), 1e-4 * n_rows * n_q_heads + 1e-6, "mass %zu", i);
  }
  cr_expect_leq(fabs(total - (double)n_rows * n_q_heads), 1e-3 * n_rows * n_q_heads, "mass total %f", total);
  /* vacated: slot 3 of d[4] (block 0), slot 33 of c2 (block 1), unfilled c2 chunk 0, all of d[0] (block 3) */
  cr_expect_eq(mass[3], 0.0f);
  cr_expect_eq(mass[16 + 33], 0.0f);
  cr_expect_eq(mass[16 + 5], 0.0f);
  cr_expect_eq(mass[16 + 60], 0.0f);
  for (int i = 0; i < 16; i++) cr_expect_eq(mass[16 + 64 + 64 + i], 0.0f);
  cr_expect_gt(mass[16 + 32], 0.0f);
  free(q), free(o), free(o_ref), free(mass), free(mass_ref);
  for (int i = 0; i < 5; i++) free(d[i]);
  free(s), free(c4), free(c2);
}

Test(kernels, attention_mixed) {
  static const ckv_cpu_path paths[] = {CKV_PATH_AUTO, CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  for (size_t p = 0; p < 4; p++) { /* every path this CPU runs, the fused SIMD loops included */
    if (ckv_kernels_force(paths[p]) != CKV_OK) continue;
    kernels_attention_mixed(&g2, 1, 8, 21);
    kernels_attention_mixed(&g2, 3, 2, 22);
    kernels_attention_mixed(&gsmall, 2, 5, 23);
    kernels_attention_mixed(&godd, 1, 6, 24);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
}

Test(kernels, attention_empty) {
  void *d = kf_block(CKV_FORMAT_DRAFT, &tiny, 16, 0);
  const void *blocks[] = {d};
  float q[96] = {1}, o[96], mass[16];
  ckv_attn_args a = {.geom = &tiny, .n_rows = 1, .n_q_heads = 1, .q = q, .blocks = blocks, .n_blocks = 1, .out = o, .mass = mass};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  for (int i = 0; i < 32; i++) cr_expect_eq(o[i], 0.0f);
  for (int i = 0; i < 16; i++) cr_expect_eq(mass[i], 0.0f);
  a.n_q_heads = 3;
  cr_expect_eq(ckv_kernels_attention(&a), CKV_OK); /* 3 % 1 == 0 */
  ckv_geometry g = tiny;
  g.n_kv_heads = 2;
  a.geom = &g;
  cr_expect_eq(ckv_kernels_attention(&a), CKV_ERR_INVALID);
  free(d);
}

/* Attention over many blocks (several partitions) with 1..5 threads: the same
 * bits every time (partials are combined in partition order), and the
 * oracle's result within tolerance. */
Test(kernels, attention_threads_same_bits) {
  enum { NB = 100 };
  kf_rng r = {31};
  void *d[NB];
  const void *blocks[NB];
  for (int i = 0; i < NB; i++) {
    d[i] = kf_block(CKV_FORMAT_DRAFT, &g2, 16, 0);
    kf_fill_draft(&g2, d[i], &r, NULL, NULL, 16u * i);
    blocks[i] = d[i];
  }
  for (int i = 0; i < NB; i += 7) ckv_block_set_valid(d[i], (uint32_t)i % 16, false);
  const uint32_t QH = 8, rows = 2;
  size_t qn = (size_t)rows * QH * g2.head_dim, slots = ckv_attention_mass_len(blocks, NB);
  float *q = malloc(qn * 4), *o1 = malloc(qn * 4), *on = malloc(qn * 4), *oref = malloc(qn * 4);
  float *m1 = malloc(slots * 4), *mn = malloc(slots * 4), *mref = malloc(slots * 4);
  cr_assert(q && o1 && on && oref && m1 && mn && mref);
  for (size_t i = 0; i < qn; i++) q[i] = kf_normal(&r) * 2.0f;
  ckv_attn_args a = {.geom = &g2, .layer = 1, .n_rows = rows, .n_q_heads = QH, .q = q, .blocks = blocks,
                     .n_blocks = NB, .out = o1, .mass = m1, .n_threads = 1};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  for (uint32_t t = 2; t <= 5; t++) {
    a.out = on;
    a.mass = mn;
    a.n_threads = t;
    cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
    cr_assert_eq(memcmp(o1, on, qn * 4), 0, "%u threads: outputs differ from one thread", t);
    cr_assert_eq(memcmp(m1, mn, slots * 4), 0, "%u threads: attention mass differs from one thread", t);
  }
  /* A caller's workspace sized for these arguments serves too. */
  a.n_threads = 2;
  a.workspace_bytes = ckv_attention_workspace_bytes(&a);
  a.workspace = malloc(a.workspace_bytes);
  cr_assert_not_null(a.workspace);
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  cr_assert_eq(memcmp(o1, on, qn * 4), 0);
  free(a.workspace);
  a.workspace = NULL;
  a.out = oref;
  a.mass = mref;
  cr_assert_eq(ckv_kernels_attention_reference(&a), CKV_OK);
  double rms = 0;
  for (size_t i = 0; i < qn; i++) rms += (double)oref[i] * oref[i];
  rms = sqrt(rms / qn);
  cr_expect_leq(kf_max_rel(o1, oref, qn, 0.05 * rms), 1e-3);
  for (size_t i = 0; i < slots; i++) cr_expect_leq(fabs(m1[i] - mref[i]), 1e-4 * rows * QH + 1e-6, "mass %zu", i);
  free(q), free(o1), free(on), free(oref), free(m1), free(mn), free(mref);
  for (int i = 0; i < NB; i++) free(d[i]);
}

/* The fused loops of every CPU path (forced one after the other) against the
 * oracle: every format in one call (draft, staged, committed INT4 / INT2 with
 * pruned channels and an unsealed chunk, the rotated formats where head_dim
 * allows), blocks partly filled with odd token counts and vacated slots, and
 * shapes that reach each tile of the loops: 1 to 9 query rows per KV head,
 * head_dim 8 (one masked AVX-512 step), 12 (not a multiple of 8: AVX2 leaves
 * it to the portable loops), 16, 64, 96 (a part value tile) and 128; FP16
 * and BF16 drafts; float and integer scores.  The block list is repeated so
 * the call has two partitions, and 1 and 3 threads give the same bits. */
typedef struct attn_shape {
  ckv_geometry g;
  uint32_t rows, q_heads;
} attn_shape;

static void *filled_draft(const ckv_geometry *g, kf_rng *r, uint32_t n, uint32_t pos0) {
  void *d = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
  kf_fill_draft(g, d, r, NULL, NULL, pos0);
  for (uint32_t t = n; t < 16; t++) ckv_block_set_valid(d, t, false); /* a partly filled block */
  return d;
}

/* A block of fmt (capacity 64) holding the first n tokens of the drafts src[0..], moved to slots 0..n-1. */
static void *moved_block(const ckv_geometry *g, void *const *src, uint32_t fmt, uint32_t kept, uint32_t n) {
  void *b = kf_block(fmt, g, 64, kept);
  cr_assert_not_null(b);
  ckv_move m[64];
  for (uint32_t t = 0; t < n; t++) m[t] = (ckv_move){.src = src[t / 16], .src_slot = t % 16, .dst = b, .dst_slot = t};
  cr_assert_eq(ckv_kernels_move(g, m, n, CKV_MOVE_SET_VALID), CKV_OK);
  return b;
}

Test(kernels, attention_every_path_format_and_shape) {
  static const attn_shape shapes[] = {
      {{1, 2, 128, CKV_DTYPE_FP16}, 1, 8}, {{1, 2, 64, CKV_DTYPE_BF16}, 3, 6}, {{2, 3, 16, CKV_DTYPE_FP16}, 2, 3},
      {{1, 1, 8, CKV_DTYPE_FP16}, 1, 3},   {{1, 2, 96, CKV_DTYPE_FP16}, 1, 2}, {{1, 2, 12, CKV_DTYPE_FP16}, 1, 4},
  };
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  enum { REP = 4, MAXB = 12 * REP };
  double worst[2] = {0, 0};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const ckv_geometry *g = &shapes[si].g;
    kf_rng r = {700 + si};
    void *src[4], *own[MAXB];
    uint32_t n_own = 0;
    for (int i = 0; i < 4; i++) src[i] = filled_draft(g, &r, 16, 16u * i);
    uint32_t D = g->head_dim, pruned = D > 8 ? D - 3 : D; /* an odd number of kept channels */
    own[n_own++] = filled_draft(g, &r, 11, 64); /* 11 of 16 */
    own[n_own++] = moved_block(g, src, CKV_FORMAT_STAGED, 0, 37);
    own[n_own++] = moved_block(g, src, CKV_FORMAT_COMMIT4, pruned, 45); /* chunk 1 sealed with 13 tokens */
    own[n_own++] = moved_block(g, src, CKV_FORMAT_COMMIT2, D / 2, 32);  /* chunk 1 never sealed */
    own[n_own++] = moved_block(g, src, CKV_FORMAT_COMMIT4, 0, 64);
    if (ckv_rot_head_dim_ok(D)) {
      own[n_own++] = moved_block(g, src, CKV_FORMAT_ROT4, 0, 63);
      own[n_own++] = moved_block(g, src, CKV_FORMAT_ROT3, 0, 50);
      own[n_own++] = moved_block(g, src, CKV_FORMAT_ROT2, 0, 64);
      own[n_own++] = moved_block(g, src, CKV_FORMAT_ROT1, 0, 21);
    }
    ckv_block_set_valid(own[1], 5, false);
    ckv_block_set_valid(own[2], 40, false);
    ckv_block_set_valid(own[4], 0, false);
    if (n_own > 5) ckv_block_set_valid(own[5], 62, false);
    const void *blocks[MAXB];
    uint32_t nb = 0;
    for (int k = 0; k < REP; k++)
      for (uint32_t i = 0; i < n_own; i++) blocks[nb++] = own[i];
    uint32_t QH = shapes[si].q_heads, R = shapes[si].rows;
    size_t qn = (size_t)R * QH * D, slots = ckv_attention_mass_len(blocks, nb);
    float *q = malloc(qn * 4), *ref = malloc(qn * 4), *o = malloc(qn * 4), *o3 = malloc(qn * 4);
    float *mref = malloc(slots * 4), *m = malloc(slots * 4), *m3 = malloc(slots * 4);
    for (size_t i = 0; i < qn; i++) q[i] = kf_normal(&r) * 1.5f;
    ckv_attn_args a = {.geom = g, .layer = g->n_layers - 1, .n_rows = R, .n_q_heads = QH, .q = q,
                       .blocks = blocks, .n_blocks = nb, .out = ref, .mass = mref};
    cr_assert_eq(ckv_kernels_attention_reference(&a), CKV_OK);
    double rms = 0;
    for (size_t i = 0; i < qn; i++) rms += (double)ref[i] * ref[i];
    rms = sqrt(rms / qn);
    for (size_t p = 0; p < 3; p++) {
      if (ckv_kernels_force(paths[p]) != CKV_OK) continue;
      for (int sc = 0; sc < 2; sc++) {
        a.scores = sc ? CKV_ATTN_SCORES_INT8 : CKV_ATTN_SCORES_FLOAT;
        a.values = CKV_ATTN_VALUES_FLOAT; /* FP32 values: the 1e-4 bound (BF16 values: test_kernels_bf16) */
        a.out = o, a.mass = m, a.n_threads = 1;
        cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
        a.out = o3, a.mass = m3, a.n_threads = 3;
        cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
        cr_expect_eq(memcmp(o, o3, qn * 4), 0, "shape %zu %s: 3 threads differ from 1", si, ckv_kernels_path_name(paths[p]));
        cr_expect_eq(memcmp(m, m3, slots * 4), 0, "shape %zu %s: mass differs with 3 threads", si,
                     ckv_kernels_path_name(paths[p]));
        double err = kf_max_rel(o, ref, qn, 0.05 * rms), merr = 0, total = 0;
        for (size_t i = 0; i < slots; i++) {
          merr = fmax(merr, fabs((double)m[i] - mref[i]));
          total += m[i];
        }
        worst[sc] = fmax(worst[sc], err);
        printf("attention: D %u, %u x %u query heads, %s, %s scores: max rel err %.2e, mass err %.2e\n", D, R, QH,
               ckv_kernels_path_name(paths[p]), sc ? "int8" : "float", err, merr);
        /* measured: float scores at most 1.3e-5 on the SIMD loops, 4.7e-5 on the portable ones, mass
         * 5e-8; integer scores (the same bits on every path: the query's INT8 rounding, up to 1/254
         * of a row's largest element) 0.22 against a 5%-of-rms floor, mass 6.5e-4 */
        cr_expect_leq(err, sc ? 0.3 : 1e-4, "shape %zu %s %s: rel err %g", si, ckv_kernels_path_name(paths[p]),
                      sc ? "int8" : "float", err);
        cr_expect_leq(merr, sc ? 1e-3 : 1e-6, "mass err %g", merr);
        cr_expect_leq(fabs(total - (double)R * QH), 1e-3 * R * QH, "mass total %f", total);
        /* slots that do not count get nothing: vacated, never filled, an unsealed chunk */
        static const uint32_t empty[] = {11, 16 + 5, 16 + 40, 80 + 40, 80 + 50, 144 + 33, 208 + 0, 272 + 62, 272 + 63};
        for (size_t e = 0; e < sizeof empty / sizeof empty[0] - (n_own > 5 ? 0 : 2); e++)
          cr_expect_eq(m[empty[e]], 0.0f, "slot %u", empty[e]);
        cr_expect_gt(m[80 + 44], 0.0f); /* the last token of a partly filled sealed chunk */
      }
    }
    ckv_kernels_force(CKV_PATH_AUTO);
    free(q), free(ref), free(o), free(o3), free(mref), free(m), free(m3);
    for (uint32_t i = 0; i < n_own; i++) free(own[i]);
    for (int i = 0; i < 4; i++) free(src[i]);
  }
  printf("attention: worst max rel err, float scores %.2e, int8 scores %.2e\n", worst[0], worst[1]);
}

/* The channel selection against a full sort by (magnitude descending, NaN as
 * -1, channel ascending), the order it is defined by: every head_dim to 512
 * and many r, on magnitudes with heavy ties, -0 next to +0, NaN, +-Inf and
 * negative values (a worker's rows may hold anything). */
typedef struct sel_rank {
  float mag;
  uint32_t ch;
} sel_rank;
static int sel_by_magnitude(const void *a, const void *b) {
  const sel_rank *x = a, *y = b;
  if (x->mag != y->mag) return x->mag > y->mag ? -1 : 1;
  return x->ch < y->ch ? -1 : x->ch > y->ch;
}
Test(kernels, select_channels_equals_a_full_sort) {
  kf_rng r = {77};
  float mag[CKV_MAX_HEAD_DIM];
  sel_rank rk[CKV_MAX_HEAD_DIM];
  int checked = 0;
  for (uint32_t d = 1; d <= CKV_MAX_HEAD_DIM; d += d < 70 ? 1 : 37) {
    for (uint32_t i = 0; i < d; i++) {
      uint64_t k = kf_next(&r) % 16;
      mag[i] = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -0.0f : k == 3 ? 0.0f : k == 4 ? -INFINITY
               : k == 5 ? -2.0f : k < 10 ? (float)(kf_next(&r) % 3) : fabsf(kf_normal(&r));
      rk[i] = (sel_rank){isnan(mag[i]) ? -1.0f : mag[i], i};
    }
    qsort(rk, d, sizeof rk[0], sel_by_magnitude);
    for (uint32_t want = 0; want <= d; want += 1 + d / 9) {
      uint64_t mask[CKV_MAX_HEAD_DIM / 64], ref[CKV_MAX_HEAD_DIM / 64] = {0};
      ckv_kernels_select_channels(mag, d, want, mask);
      for (uint32_t i = 0; i < want; i++) ref[rk[i].ch / 64] |= 1ull << (rk[i].ch % 64);
      cr_expect_arr_eq(mask, ref, (d + 63) / 64 * sizeof(uint64_t), "head_dim %u, %u kept", d, want);
      checked++;
    }
  }
  cr_expect_gt(checked, 500);
}

/* A committed block's key channel mask is bytes a worker can write: dequantize checks it against the
 * block's kept channels (every channel kept: every bit of the head's mask set; pruned: as many bits as
 * kept) and refuses a mask that does not match with CKV_ERR_CORRUPT, on every head, never reading past it. */
Test(kernels, dequantize_refuses_a_mask_that_does_not_match_kept_channels) {
  const ckv_geometry g = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 128, .dtype = CKV_DTYPE_FP16};
  kf_rng r = {0xdec0de};
  void *d = kf_block(CKV_FORMAT_DRAFT, &g, 64, 0);
  kf_fill_draft(&g, d, &r, NULL, NULL, 0);
  float *out = malloc(ckv_draft_token_elems(&g) * sizeof(float));
  for (uint32_t kept = 128; kept >= 64; kept -= 64) {
    void *c = kf_block(CKV_FORMAT_COMMIT4, &g, 64, kept);
    ckv_move m[32];
    for (uint32_t t = 0; t < 32; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = c, .dst_slot = t};
    cr_assert_eq(ckv_kernels_move(&g, m, 32, CKV_MOVE_SET_VALID), CKV_OK);
    const ckv_block_header *h = c;
    for (uint32_t hd = 0; hd < g.n_kv_heads; hd++) {
      cr_expect_eq(ckv_kernels_dequantize(&g, c, 1, 0, 5, out), CKV_OK);
      uint64_t *mask = (uint64_t *)((uint8_t *)c + ckv_commit_mask_offset(h->format, &g, 64, kept, 1, hd));
      uint64_t was = mask[1];
      mask[1] ^= 1ull << 7; /* one channel more or one fewer */
      cr_expect_eq(ckv_kernels_dequantize(&g, c, 1, 0, 5, out), CKV_ERR_CORRUPT, "kept %u head %u", kept, hd);
      cr_expect_eq(ckv_kernels_dequantize(&g, c, 0, 0, 5, out), CKV_OK, "another layer's masks are intact");
      mask[1] = was;
    }
    free(c);
  }
  free(out);
  free(d);
}
