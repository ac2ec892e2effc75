/* test_kernels_fidelity.c - how much each committed/staged format changes the
 * attention output on realistic data: synthetic K/V at head_dim 128 whose keys
 * have a few outlier channels 10-50x larger than the rest (as reported for
 * real LLMs), queries that also weigh those channels.  For each format the
 * attention-output cosine similarity against the FP16 (draft) run is printed
 * and guarded by a floor set from the measurement.  The same measurement on
 * K/V from the real model (shared/models/stories260K) needs the model library
 * (another module): see the TODO test at the end. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels_fixture.h"

enum { D = 128, H = 2, QH = 8, TOKENS = 512, R = 2 };
static const ckv_geometry geom = {.n_layers = 1, .n_kv_heads = H, .head_dim = D, .dtype = CKV_DTYPE_FP16};

typedef struct outliers {
  float gain[H * D];
} outliers;

static float gen_kv(kf_rng *r, uint32_t l, uint32_t kv, uint32_t e, void *ctx) {
  const outliers *o = ctx;
  float v = kf_normal(r);
  return kv == 0 ? v * o->gain[e] + 0.3f * o->gain[e] : v; /* keys: per-channel scale and offset */
}

typedef struct result {
  double mean, min;
} result;

static result measure(uint32_t fmt, uint32_t kept, void *const *drafts, const float *q, const float *o_ref) {
  uint32_t nblk = TOKENS / 64;
  void *blk[TOKENS / 16];
  const void *cblk[TOKENS / 16];
  ckv_move m[64];
  for (uint32_t b = 0; b < nblk; b++) {
    blk[b] = kf_block(fmt, &geom, 64, kept);
    for (uint32_t i = 0; i < 64; i++) m[i] = (ckv_move){.src = drafts[b * 4 + i / 16], .src_slot = i % 16, .dst = blk[b], .dst_slot = i};
    cr_assert_eq(ckv_kernels_move(&geom, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
    cblk[b] = blk[b];
  }
  float out[R * QH * D];
  ckv_attn_args a = {.geom = &geom, .n_rows = R, .n_q_heads = QH, .q = q, .blocks = cblk, .n_blocks = nblk, .out = out};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  result res = {0, 1};
  for (int i = 0; i < R * QH; i++) {
    double c = kf_cosine(out + i * D, o_ref + i * D, D);
    res.mean += c / (R * QH);
    res.min = fmin(res.min, c);
  }
  for (uint32_t b = 0; b < nblk; b++) free(blk[b]);
  return res;
}

Test(fidelity, synthetic_outliers) {
  kf_rng r = {2024};
  outliers o;
  for (int e = 0; e < H * D; e++) o.gain[e] = 1.0f;
  for (int h = 0; h < H; h++)
    for (int k = 0; k < 4; k++) o.gain[h * D + (kf_next(&r) % D)] = 10.0f + 40.0f * (float)(kf_next(&r) % 1000) / 1000.0f;
  void *drafts[TOKENS / 16];
  const void *cd[TOKENS / 16];
  for (int i = 0; i < TOKENS / 16; i++) {
    drafts[i] = kf_block(CKV_FORMAT_DRAFT, &geom, 16, 0);
    kf_fill_draft(&geom, drafts[i], &r, gen_kv, &o, 16u * i);
    cd[i] = drafts[i];
  }
  float q[R * QH * D], o_ref[R * QH * D];
  for (int i = 0; i < R * QH * D; i++) q[i] = kf_normal(&r) * (o.gain[(i / (D * (QH / H)) % H) * D + i % D] > 1 ? 0.5f : 1.0f);
  ckv_attn_args a = {.geom = &geom, .n_rows = R, .n_q_heads = QH, .q = q, .blocks = cd, .n_blocks = TOKENS / 16, .out = o_ref};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  struct {
    const char *name;
    uint32_t fmt, kept;
    double floor_mean, floor_min;
  } rows[] = {
      /* floors: the measured values (seed 2024: 0.9944/0.9770, 0.9865/0.9087, 0.8759/0.5207,
       * 0.8139/0.5719, 0.6985/0.1968) less a margin.  INT8 keys are per (token, head), so outlier
       * channels inflate the scale for the other 124 channels: that costs more than INT4's
       * per-channel key groups. */
      {"int8", CKV_FORMAT_STAGED, 0, 0.99, 0.96},
      {"int4", CKV_FORMAT_COMMIT4, 0, 0.98, 0.88},
      {"int4 kept 64/128", CKV_FORMAT_COMMIT4, 64, 0.85, 0.45},
      {"int2", CKV_FORMAT_COMMIT2, 0, 0.78, 0.50},
      {"int2 kept 64/128", CKV_FORMAT_COMMIT2, 64, 0.65, 0.15},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    result res = measure(rows[i].fmt, rows[i].kept, drafts, q, o_ref);
    double bits = ckv_format_bits_per_element(rows[i].fmt, &geom, 64, rows[i].kept);
    printf("fidelity: %-18s %.2f bits/elem  cosine vs fp16: mean %.5f min %.5f\n", rows[i].name, bits, res.mean, res.min);
    cr_expect_geq(res.mean, rows[i].floor_mean, "%s mean cosine %f", rows[i].name, res.mean);
    cr_expect_geq(res.min, rows[i].floor_min, "%s min cosine %f", rows[i].name, res.min);
  }
  for (int i = 0; i < TOKENS / 16; i++) free(drafts[i]);
}

/* TODO(model library): run the same measurement on K/V produced by the real
 * model in shared/models (stories260K) once the model library (ckv_model,
 * owned by another engineer) can hand out per-layer K/V.  Until then this test
 * reports itself skipped; it never fakes the data. */
Test(fidelity, real_model_kv) { cr_skip_test("TODO: K/V from shared/models/stories260K needs the model library (ckv_model), not available yet"); }
