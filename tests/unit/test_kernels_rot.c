/* test_kernels_rot.c - the rotated committed formats (formats v2: ROT4, ROT3,
 * ROT2, ROT1; kernels/format.h "rotated", rules in kernels/quant.h): the
 * rotation is orthogonal, the bytes per element (every scale, header and
 * position counted), round-trip error on keys with outlier channels and on
 * values (bounds taken from measurement, with the measured figure in the
 * message), the same bytes on every SIMD path, staged and rotated sources,
 * non-finite inputs, and fused attention over a mix of formats against the
 * FP32 oracle. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels_fixture.h"

static const uint32_t rot_formats[] = {CKV_FORMAT_ROT4, CKV_FORMAT_ROT3, CKV_FORMAT_ROT2, CKV_FORMAT_ROT1};
/* The agent model's KV geometry (tools/agentlm): 4 layers, 2 KV heads of 64. */
static const ckv_geometry agent = {.n_layers = 4, .n_kv_heads = 2, .head_dim = 64, .dtype = CKV_DTYPE_FP16};

/* Keys like a real model's after RoPE: unit normal, with channels 5 and 40 of
 * every head 12x larger and offset (the outlier channels that make per-token
 * key quantization fail without a rotation); values unit normal. */
static float kv_gen(kf_rng *r, uint32_t layer, uint32_t kv, uint32_t e, void *ctx) {
  (void)layer;
  (void)ctx;
  float x = kf_normal(r);
  uint32_t ch = e % agent.head_dim;
  if (kv == 0 && (ch == 5 || ch == 40)) x = 12.0f * x + 20.0f;
  return x;
}

Test(rot, rotation_is_orthogonal) {
  kf_rng r = {0x1234};
  for (uint32_t n = 8; n <= CKV_MAX_HEAD_DIM; n *= 2) {
    float x[CKV_MAX_HEAD_DIM], y[CKV_MAX_HEAD_DIM];
    double nx = 0, ny = 0;
    for (uint32_t i = 0; i < n; i++) {
      x[i] = y[i] = kf_normal(&r);
      nx += (double)x[i] * x[i];
    }
    ckv_rot_forward(y, n, 3, 1, 7);
    for (uint32_t i = 0; i < n; i++) ny += (double)y[i] * y[i];
    cr_expect(fabs(sqrt(ny) / sqrt(nx) - 1.0) < 1e-5, "n %u: norm ratio %.8f", n, sqrt(ny / nx));
    ckv_rot_inverse(y, n, 3, 1, 7);
    cr_expect(kf_max_rel(y, x, n, 1.0) < 1e-5, "n %u: round trip %.3g", n, kf_max_rel(y, x, n, 1.0));
  }
  /* the signs differ between heads, layers and K|V: a rotation per head */
  int same = 0;
  for (uint32_t i = 0; i < 64; i++) same += ckv_rot_sign(0, 0, 0, i) == ckv_rot_sign(0, 0, 1, i);
  cr_expect(same > 16 && same < 48, "%d of 64 signs shared by two heads", same);
}

Test(rot, bits_per_element_within_a_quarter_bit) {
  for (size_t f = 0; f < 4; f++) {
    uint32_t fmt = rot_formats[f], b = ckv_format_code_bits(fmt);
    double bits = ckv_format_bits_per_element(fmt, &agent, CKV_DEFAULT_CAPACITY_COMMIT, 0);
    /* 16 scale bits per 64 elements (0.25), the block's FP16 key means (16 bits per key channel
     * per 64 tokens: 0.125 averaged over K and V), header, positions and bitmap: b + 0.4219 */
    cr_expect(bits > b + 0.25 && bits <= b + 0.43, "%s: %.4f bits per element", fmt == CKV_FORMAT_ROT1 ? "rot1" : "rot", bits);
    ckv_geometry g128 = agent;
    g128.head_dim = 128;
    double b128 = ckv_format_bits_per_element(fmt, &g128, CKV_DEFAULT_CAPACITY_COMMIT, 0);
    cr_expect(b128 <= b + 0.28, "head_dim 128: %.4f bits", b128); /* measured b + 0.2734 */
  }
  /* what the KIVI formats cost at the same geometry, for the record */
  double k4 = ckv_format_bits_per_element(CKV_FORMAT_COMMIT4, &agent, CKV_DEFAULT_CAPACITY_COMMIT, 0);
  double k2 = ckv_format_bits_per_element(CKV_FORMAT_COMMIT2, &agent, CKV_DEFAULT_CAPACITY_COMMIT, 0);
  cr_expect(k4 > 4.9 && k2 > 2.9, "kivi4 %.3f, kivi2 %.3f", k4, k2);
}

Test(rot, head_dim_must_be_a_power_of_two) {
  ckv_geometry g = agent;
  for (uint32_t d = 1; d <= CKV_MAX_HEAD_DIM; d++) {
    g.head_dim = d;
    bool ok = ckv_format_block_bytes(CKV_FORMAT_ROT2, &g, 64, 0) != 0;
    bool pow2 = d >= 8 && (d & (d - 1)) == 0;
    cr_expect_eq(ok, pow2, "head_dim %u", d);
  }
  g.head_dim = 64;
  cr_expect(!ckv_format_valid(CKV_FORMAT_ROT4, &g, 64, 32), "rotated formats prune nothing");
  void *b = aligned_alloc(64, 1 << 20);
  g.head_dim = 96;
  cr_expect_eq(ckv_block_init(b, CKV_FORMAT_ROT4, &g, 64, 0, 1), CKV_ERR_INVALID);
  free(b);
}

/* Relative L2 error of K and V over every slot, layer and head after draft -> fmt. */
static void round_trip(uint32_t fmt, uint32_t src_fmt, double *ret_k, double *ret_v) {
  kf_rng r = {0xfeed};
  void *d = kf_block(CKV_FORMAT_DRAFT, &agent, 64, 0);
  kf_fill_draft(&agent, d, &r, kv_gen, NULL, 100);
  void *mid = NULL, *src = d;
  if (src_fmt != CKV_FORMAT_DRAFT) { /* through an intermediate format first */
    mid = kf_block(src_fmt, &agent, 64, 0);
    ckv_move m[64];
    for (uint32_t t = 0; t < 64; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = mid, .dst_slot = t};
    cr_assert_eq(ckv_kernels_move(&agent, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
    src = mid;
  }
  void *c = kf_block(fmt, &agent, 64, 0);
  ckv_move m[64];
  for (uint32_t t = 0; t < 64; t++) m[t] = (ckv_move){.src = src, .src_slot = t, .dst = c, .dst_slot = t};
  cr_assert_eq(ckv_kernels_move(&agent, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
  size_t te = ckv_draft_token_elems(&agent);
  float x[128], y[128];
  double e2[2] = {0, 0}, n2[2] = {0, 0};
  for (uint32_t t = 0; t < 64; t++) {
    cr_expect_eq(ckv_block_positions(c)[t], 100 + t);
    cr_expect(ckv_block_slot_valid(c, t));
    for (uint32_t l = 0; l < agent.n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        cr_assert_eq(ckv_kernels_dequantize(&agent, d, l, kv, t, x), CKV_OK);
        cr_assert_eq(ckv_kernels_dequantize(&agent, c, l, kv, t, y), CKV_OK);
        for (size_t i = 0; i < te; i++) {
          e2[kv] += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
          n2[kv] += (double)x[i] * x[i];
        }
      }
  }
  *ret_k = sqrt(e2[0] / n2[0]);
  *ret_v = sqrt(e2[1] / n2[1]);
  free(d);
  free(mid);
  free(c);
}

Test(rot, round_trip_error_within_measured_floors) {
  /* measured here (relative L2, keys with outlier channels / unit-normal values), with the
   * closed-form scale and its one refinement (issue 42): rot4 0.0412/0.0980, rot3 0.0856/0.1889,
   * rot2 0.1594/0.3417, rot1 0.2813/0.6008; with the six-code search before it 0.0412/0.0974,
   * 0.0852/0.1872, 0.1594/0.3415, 0.2813/0.6008 (the values sit near the uniform quantizer's
   * Gaussian floor: 0.107, 0.193, 0.345, 0.603; a scale search took rot4 from 0.0965/0.107
   * and the block key means keys from 0.0676 to 0.0427); bounds about 10% above */
  static const double kmax[4] = {0.047, 0.098, 0.182, 0.312}, vmax[4] = {0.109, 0.209, 0.378, 0.661};
  for (size_t f = 0; f < 4; f++) {
    double ke, ve;
    round_trip(rot_formats[f], CKV_FORMAT_DRAFT, &ke, &ve);
    fprintf(stderr, "rot%u: key rel error %.4f, value rel error %.4f\n", ckv_format_code_bits(rot_formats[f]), ke, ve);
    cr_expect(ke < kmax[f], "rot%u keys: %.4f", ckv_format_code_bits(rot_formats[f]), ke);
    cr_expect(ve < vmax[f], "rot%u values: %.4f", ckv_format_code_bits(rot_formats[f]), ve);
  }
  /* against KIVI at about the same bits: rot3 (3.27 bits per element) against kivi2 (3.0) */
  double kk, kv_, rk, rv;
  round_trip(CKV_FORMAT_COMMIT2, CKV_FORMAT_DRAFT, &kk, &kv_);
  round_trip(CKV_FORMAT_ROT3, CKV_FORMAT_DRAFT, &rk, &rv);
  fprintf(stderr, "kivi2: key %.4f value %.4f; rot3: key %.4f value %.4f\n", kk, kv_, rk, rv);
  cr_expect(rk < kk && rv < kv_, "rot3 %.4f/%.4f vs kivi2 %.4f/%.4f", rk, rv, kk, kv_);
  /* and rot4 keys against kivi4's (5.03 bits): within 10% at 0.6 fewer bits */
  double k4, v4, r4k, r4v;
  round_trip(CKV_FORMAT_COMMIT4, CKV_FORMAT_DRAFT, &k4, &v4);
  round_trip(CKV_FORMAT_ROT4, CKV_FORMAT_DRAFT, &r4k, &r4v);
  fprintf(stderr, "kivi4: key %.4f value %.4f; rot4: key %.4f value %.4f\n", k4, v4, r4k, r4v);
  cr_expect(r4k < 1.1 * k4, "rot4 keys %.4f vs kivi4 %.4f", r4k, k4);
}

Test(rot, staged_and_rotated_sources) {
  double ke, ve, k0, v0;
  round_trip(CKV_FORMAT_ROT2, CKV_FORMAT_DRAFT, &k0, &v0);
  round_trip(CKV_FORMAT_ROT2, CKV_FORMAT_STAGED, &ke, &ve);
  cr_expect(ke < k0 * 1.05 && ve < v0 * 1.05, "staged -> rot2 %.4f/%.4f vs draft -> rot2 %.4f/%.4f", ke, ve, k0, v0);
  /* a committed token cooling down: rot4 -> rot1 re-quantizes in the rotated basis */
  double k1, v1;
  round_trip(CKV_FORMAT_ROT1, CKV_FORMAT_DRAFT, &k0, &v0);
  round_trip(CKV_FORMAT_ROT1, CKV_FORMAT_ROT4, &k1, &v1);
  cr_expect(k1 < k0 * 1.05 && v1 < v0 * 1.05, "rot4 -> rot1 %.4f/%.4f vs draft -> rot1 %.4f/%.4f", k1, v1, k0, v0);
  /* and the other way is refused: a rotated block is never a draft or staged one's source of truth */
  void *a = kf_block(CKV_FORMAT_ROT4, &agent, 64, 0), *s = kf_block(CKV_FORMAT_STAGED, &agent, 64, 0);
  ckv_block_set_valid(a, 0, true);
  ckv_move m = {.src = a, .src_slot = 0, .dst = s, .dst_slot = 0};
  cr_expect_eq(ckv_kernels_move(&agent, &m, 1, 0), CKV_ERR_UNSUPPORTED);
  free(a);
  free(s);
}

Test(rot, same_bytes_on_every_path) {
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  kf_rng r = {0xabc};
  void *d = kf_block(CKV_FORMAT_DRAFT, &agent, 64, 0);
  kf_fill_draft(&agent, d, &r, kv_gen, NULL, 0);
  int compared = 0;
  for (size_t f = 0; f < 4; f++) {
    uint32_t fmt = rot_formats[f];
    size_t n = ckv_format_block_bytes(fmt, &agent, 64, 0);
    void *ref = NULL;
    for (size_t p = 0; p < 3; p++) {
      if (ckv_kernels_force(paths[p]) != CKV_OK) {
        if (f == 0) fprintf(stderr, "rot same_bytes: path %s not on this CPU: SKIPPED\n", ckv_kernels_path_name(paths[p]));
        continue;
      }
      void *c = kf_block(fmt, &agent, 64, 0);
      ckv_move m[64];
      for (uint32_t t = 0; t < 64; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = c, .dst_slot = 63 - t};
      cr_assert_eq(ckv_kernels_move(&agent, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
      if (!ref) {
        ref = c;
        continue;
      }
      cr_expect_eq(memcmp(ref, c, n), 0, "fmt %u: path %s differs from scalar", fmt, ckv_kernels_path_name(paths[p]));
      compared++;
      free(c);
    }
    free(ref);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  cr_expect(compared >= 4, "at least one SIMD path compared (%d)", compared);
  free(d);
}

Test(rot, nonfinite_inputs_stay_in_their_head) {
  ckv_geometry g = agent;
  g.n_layers = 1;
  void *d = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0), *c = kf_block(CKV_FORMAT_ROT4, &g, 64, 0);
  kf_rng r = {7};
  float k[128], v[128], y[128];
  for (int i = 0; i < 128; i++) k[i] = v[i] = kf_normal(&r);
  k[3] = NAN;
  k[9] = INFINITY;
  v[1] = -INFINITY;
  kf_put(&g, d, 0, 0, 0, k);
  kf_put(&g, d, 0, 1, 0, v);
  ckv_block_set_valid(d, 0, true);
  ckv_move m = {.src = d, .src_slot = 0, .dst = c, .dst_slot = 0};
  cr_assert_eq(ckv_kernels_move(&g, &m, 1, CKV_MOVE_SET_VALID), CKV_OK);
  for (uint32_t kv = 0; kv < 2; kv++) {
    cr_assert_eq(ckv_kernels_dequantize(&g, c, 0, kv, 0, y), CKV_OK);
    for (int i = 0; i < 128; i++) cr_assert(isfinite(y[i]), "kv %u element %d: %f", kv, i, y[i]);
    const float *x = kv ? v : k;
    double e = 0, nn = 0; /* head 1 had only finite inputs: its usual error */
    for (int i = 64; i < 128; i++) {
      e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
      nn += (double)x[i] * x[i];
    }
    cr_expect(sqrt(e / nn) < 0.12, "kv %u head 1 rel error %.4f", kv, sqrt(e / nn));
  }
  free(d);
  free(c);
}

Test(rot, attention_over_mixed_formats_matches_the_oracle) {
  kf_rng r = {0x5151};
  static const uint32_t fmts[] = {CKV_FORMAT_ROT1, CKV_FORMAT_DRAFT, CKV_FORMAT_ROT4, CKV_FORMAT_STAGED,
                                  CKV_FORMAT_COMMIT4, CKV_FORMAT_ROT3, CKV_FORMAT_ROT2};
  enum { NB = 7 };
  void *blocks[NB];
  for (int b = 0; b < NB; b++) {
    void *d = kf_block(CKV_FORMAT_DRAFT, &agent, 64, 0);
    kf_fill_draft(&agent, d, &r, kv_gen, NULL, 64u * b);
    if (fmts[b] == CKV_FORMAT_DRAFT) {
      ckv_block_set_valid(d, 7, false); /* an empty slot too */
      blocks[b] = d;
      continue;
    }
    blocks[b] = kf_block(fmts[b], &agent, 64, 0);
    ckv_move m[64];
    for (uint32_t t = 0; t < 64; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = blocks[b], .dst_slot = t};
    cr_assert_eq(ckv_kernels_move(&agent, m, fmts[b] == CKV_FORMAT_ROT2 ? 40 : 64, CKV_MOVE_SET_VALID), CKV_OK);
    free(d);
  }
  enum { ROWS = 2, QH = 4 };
  float q[ROWS * QH * 64], out[ROWS * QH * 64], ref[ROWS * QH * 64];
  for (int i = 0; i < ROWS * QH * 64; i++) q[i] = 0.3f * kf_normal(&r);
  size_t nm = ckv_attention_mass_len((const void *const *)blocks, NB);
  float *mass = calloc(nm, sizeof(float)), *rmass = calloc(nm, sizeof(float));
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  for (size_t p = 0; p < 3; p++) /* every path this CPU runs, the fused SIMD loops included */
  for (uint32_t layer = 0; layer < agent.n_layers && ckv_kernels_force(paths[p]) == CKV_OK; layer++) {
    ckv_attn_args a = {.geom = &agent, .layer = layer, .n_rows = ROWS, .n_q_heads = QH, .q = q,
                       .blocks = (const void *const *)blocks, .n_blocks = NB, .out = out, .mass = mass,
                       /* the float path against the oracle at 1e-4; the defaults (integer scores, BF16
                        * values for ROT4 and ROT2) are bounded by test_kernels_intscore_error and
                        * test_kernels_bf16 */
                       .scores = CKV_ATTN_SCORES_FLOAT, .values = CKV_ATTN_VALUES_FLOAT};
    cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
    a.out = ref;
    a.mass = rmass;
    cr_assert_eq(ckv_kernels_attention_reference(&a), CKV_OK);
    double rel = kf_max_rel(out, ref, ROWS * QH * 64, 0.05);
    cr_expect(rel < 1e-4, "%s, layer %u: output max rel diff %.3g", ckv_kernels_path_name(paths[p]), layer, rel);
    double msum = 0, mdiff = 0;
    for (size_t i = 0; i < nm; i++) {
      msum += mass[i];
      mdiff = fmax(mdiff, fabs((double)mass[i] - rmass[i]));
    }
    cr_expect(fabs(msum - ROWS * QH) < 1e-3, "mass sums to %.5f", msum);
    cr_expect(mdiff < 1e-5, "mass max diff %.3g", mdiff);
    /* the empty slot and the 24 never-filled rot2 slots get nothing */
    cr_expect_eq(mass[64 + 7], 0.0f);
    cr_expect_eq(mass[6 * 64 + 50], 0.0f);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  free(mass);
  free(rmass);
  for (int b = 0; b < NB; b++) free(blocks[b]);
}

/* Adversarial tokens for the SIMD comparison: slot s of the draft by kind. */
static float adversarial(kf_rng *r, uint32_t layer, uint32_t kv, uint32_t e, void *ctx) {
  const uint32_t *D = ctx;
  uint32_t slot = layer >> 8, ch = e % *D; /* the slot rides in the layer's high bits (see fill_adversarial) */
  static const float edge[] = {NAN, INFINITY, -INFINITY, 65504.0f, -65504.0f, 6e-8f, -6e-8f, 1e-5f, 0.0f, -0.0f, 1e30f};
  switch (slot % 8) {
    case 1: return edge[e % (sizeof edge / sizeof edge[0])];
    case 2: return 0.0f; /* a head of zeros: scale 0 */
    case 3: return kv ? -3.0f : 7.25f; /* constant */
    case 4: return ch == 3 ? 60000.0f : kf_normal(r) * 1e-3f; /* one outlier */
    case 5: return (float)(e % 5) * 6e-8f; /* FP16 subnormals only */
    case 6: return kf_normal(r) * 3000.0f;
    default: return kf_normal(r) + (ch == 5 ? 20.0f : 0.0f);
  }
}
static void fill_adversarial(const ckv_geometry *g, void *d, kf_rng *r) {
  uint32_t D = g->head_dim;
  size_t te = ckv_draft_token_elems(g);
  float *x = malloc(te * sizeof(float));
  for (uint32_t s = 0; s < 64; s++) {
    for (uint32_t l = 0; l < g->n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        for (size_t e = 0; e < te; e++) x[e] = adversarial(r, s << 8 | l, kv, (uint32_t)e, &D);
        kf_put(g, d, l, kv, s, x);
      }
    ckv_block_positions(d)[s] = s;
    ckv_block_set_valid(d, s, true);
  }
  free(x);
}

/* Every SIMD path against the scalar one, byte for byte and float for float:
 * quantizing (draft, staged and rotated sources; an odd number of tokens into
 * a block, in scrambled slots) and dequantizing every token back, at every
 * head_dim from 8 to 512, 3 KV heads, on adversarial tokens (NaN, +-Inf,
 * +-65504, FP16 subnormals, zero and constant heads, outliers). */
Test(rot, simd_paths_equal_scalar_on_adversarial_tokens) {
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  static const uint32_t dims[] = {8, 16, 32, 64, 128, 256, 512};
  enum { NT = 37 };
  int compared = 0;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    ckv_geometry g = {.n_layers = 2, .n_kv_heads = 3, .head_dim = dims[di], .dtype = CKV_DTYPE_FP16};
    size_t te = ckv_draft_token_elems(&g);
    kf_rng r = {0x5eed + di};
    void *d = kf_block(CKV_FORMAT_DRAFT, &g, 64, 0);
    fill_adversarial(&g, d, &r);
    for (size_t f = 0; f < 4; f++)
      for (uint32_t via = 0; via < 3; via++) { /* from the draft, from a staged copy, from a rot4 copy */
        uint32_t fmt = rot_formats[f], src_fmt = via == 0 ? CKV_FORMAT_DRAFT : via == 1 ? CKV_FORMAT_STAGED : CKV_FORMAT_ROT4;
        size_t n = ckv_format_block_bytes(fmt, &g, 64, 0);
        void *ref = NULL;
        float *x = malloc(te * sizeof(float)), *y = malloc(te * sizeof(float));
        for (size_t p = 0; p < 3; p++) {
          if (ckv_kernels_force(paths[p]) != CKV_OK) continue;
          void *src = d, *mid = NULL, *c = kf_block(fmt, &g, 64, 0);
          ckv_move m[64];
          if (via) { /* the intermediate block on the scalar path, the same for every path */
            ckv_kernels_force(CKV_PATH_SCALAR);
            mid = src = kf_block(src_fmt, &g, 64, 0);
            for (uint32_t t = 0; t < 64; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = mid, .dst_slot = t};
            cr_assert_eq(ckv_kernels_move(&g, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
            ckv_kernels_force(paths[p]);
          }
          for (uint32_t t = 0; t < NT; t++)
            m[t] = (ckv_move){.src = src, .src_slot = (t * 7) % 64, .dst = c, .dst_slot = (t * 13 + 5) % 64};
          cr_assert_eq(ckv_kernels_move(&g, m, NT, CKV_MOVE_SET_VALID), CKV_OK);
          free(mid);
          if (!ref) {
            ref = c;
            continue;
          }
          cr_expect_eq(memcmp(ref, c, n), 0, "D %u rot%u from format %u: path %s writes other bytes than scalar", g.head_dim,
                       ckv_format_code_bits(fmt), src_fmt, ckv_kernels_path_name(paths[p]));
          /* dequantized: this path's reading of the scalar block against the scalar path's */
          for (uint32_t t = 0; t < NT; t++)
            for (uint32_t l = 0; l < g.n_layers; l++)
              for (uint32_t kv = 0; kv < 2; kv++) {
                uint32_t slot = (t * 13 + 5) % 64;
                cr_assert_eq(ckv_kernels_dequantize(&g, ref, l, kv, slot, y), CKV_OK);
                ckv_kernels_force(CKV_PATH_SCALAR);
                cr_assert_eq(ckv_kernels_dequantize(&g, ref, l, kv, slot, x), CKV_OK);
                ckv_kernels_force(paths[p]);
                if (memcmp(x, y, te * sizeof(float))) {
                  size_t e = 0;
                  while (ckv_f32_bits(x[e]) == ckv_f32_bits(y[e])) e++;
                  cr_expect(0, "D %u rot%u slot %u layer %u kv %u: path %s dequantizes element %zu to %a, scalar to %a",
                            g.head_dim, ckv_format_code_bits(fmt), slot, l, kv, ckv_kernels_path_name(paths[p]), e, y[e], x[e]);
                }
                for (size_t e = 0; e < te; e++) cr_assert(isfinite(y[e]));
              }
          compared++;
          free(c);
        }
        free(ref);
        free(x);
        free(y);
      }
    free(d);
  }
  ckv_kernels_force(CKV_PATH_AUTO);
  if (!compared) cr_skip_test("no SIMD path on this CPU");
  fprintf(stderr, "rot simd: %d path x head_dim x format x source comparisons\n", compared);
}

/* Heads of a row quantized together (the AVX-512 path takes them 4 at a time): 9 KV heads (two full groups and
 * a remainder), FP16 and BF16, head_dim 16..256, keys with outliers and a few heads scaled by 1e-3 or 1e3 (other
 * scale codes side by side in one row): every SIMD path writes the scalar path's bytes. */
static float many_heads_gen(kf_rng *r, uint32_t layer, uint32_t kv, uint32_t e, void *ctx) {
  uint32_t D = *(const uint32_t *)ctx, head = e / D, ch = e % D;
  float x = kf_normal(r) * (head == 2 ? 1e-3f : head == 7 ? 1e3f : 1.0f);
  if (kv == 0 && (ch == 3 || ch == D / 2)) x = 12.0f * x + 20.0f;
  if (head == 4 && layer == 1) x = 0.0f; /* a head of zeros: scale code 0 */
  return x;
}

Test(rot, quant_heads_in_groups_same_bytes_on_every_path) {
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  static const uint32_t dims[] = {16, 64, 128, 256};
  int compared = 0;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
    for (uint32_t dt = 0; dt < 2; dt++) {
      uint32_t D = dims[di];
      ckv_geometry g = {.n_layers = 2, .n_kv_heads = 9, .head_dim = D, .dtype = dt ? CKV_DTYPE_BF16 : CKV_DTYPE_FP16};
      kf_rng r = {0x9e3779b9u + di * 2 + dt};
      void *d = kf_block(CKV_FORMAT_DRAFT, &g, 64, 0);
      kf_fill_draft(&g, d, &r, many_heads_gen, &D, 0);
      for (size_t f = 0; f < 4; f++) {
        size_t n = ckv_format_block_bytes(rot_formats[f], &g, 64, 0);
        void *ref = NULL;
        for (size_t p = 0; p < 3; p++) {
          if (ckv_kernels_force(paths[p]) != CKV_OK) continue;
          void *c = kf_block(rot_formats[f], &g, 64, 0);
          ckv_move m[64];
          for (uint32_t t = 0; t < 64; t++) m[t] = (ckv_move){.src = d, .src_slot = t, .dst = c, .dst_slot = t};
          cr_assert_eq(ckv_kernels_move(&g, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
          if (!ref) {
            ref = c;
            continue;
          }
          cr_expect_eq(memcmp(ref, c, n), 0, "D %u %s rot%u: path %s writes other bytes than scalar", D, dt ? "bf16" : "fp16",
                       ckv_format_code_bits(rot_formats[f]), ckv_kernels_path_name(paths[p]));
          compared++;
          free(c);
        }
        free(ref);
      }
      free(d);
    }
  ckv_kernels_force(CKV_PATH_AUTO);
  if (!compared) cr_skip_test("no SIMD path on this CPU");
  fprintf(stderr, "rot quant_heads: %d path x head_dim x dtype x format comparisons\n", compared);
}

/* The rule itself: the scale is one of the two codes either side of the closed-form estimate, the one whose
 * squared error (recomputed here in double) is not larger, up to the float sums' rounding. */
Test(rot, scale_is_the_better_of_the_two_codes_around_the_estimate) {
  kf_rng r = {77};
  float y[128];
  uint8_t row[64], cand[CKV_ROT_CANDIDATES];
  for (int it = 0; it < 400; it++) {
    uint32_t bits = 1u + (uint32_t)it % 4u, n = it % 3 ? 128u : 64u;
    double ss = 0;
    float am = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
      y[i] = kf_normal(&r) * (it % 5 == 0 && i == 7 ? 9.0f : 1.0f) * (it % 7 == 0 ? 0.6f * (float)(i % 3) : 1.0f);
      ss += (double)y[i] * y[i];
      am = fabsf(y[i]) > am ? fabsf(y[i]) : am;
    }
    uint8_t sc;
    ckv_rot_quant_head(y, n, bits, &sc, row);
    float l[16] = {0};
    for (uint32_t i = 0; i < n; i++) l[i & 15u] = y[i] * y[i] + l[i & 15u];
    ckv_rot_candidates(ckv_lanes16_total(l), am, n, bits, cand);
    cr_assert(sc == cand[0] || sc == cand[1], "bits %u: code %u is neither candidate %u nor %u", bits, sc, cand[0], cand[1]);
    double e[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
      float s = ckv_rot_scale_value(cand[k]), inv = ckv_rot_scale_inv(cand[k]);
      for (uint32_t i = 0; i < n; i++) {
        double d = (double)y[i] - (double)ckv_rot_mid(y[i] * inv, (float)(1u << (bits - 1u))) * s;
        e[k] += d * d;
      }
    }
    double mine = sc == cand[0] ? e[0] : e[1], other = sc == cand[0] ? e[1] : e[0];
    cr_expect(mine <= other * (1.0 + 1e-5), "bits %u: chose the code with error %g over %g", bits, mine, other);
    /* the estimate lies between the two codes' scales (the floor code and the next) */
    float est = ckv_rot_scale_estimate((float)ss, am, n, bits);
    cr_expect(ckv_rot_scale_value(cand[0]) <= est * 1.0001f && (cand[1] == cand[0] || est <= ckv_rot_scale_value(cand[1])),
              "bits %u: estimate %g outside [%g, %g]", bits, est, ckv_rot_scale_value(cand[0]), ckv_rot_scale_value(cand[1]));
  }
}
