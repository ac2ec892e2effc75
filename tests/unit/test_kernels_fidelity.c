/* test_kernels_fidelity.c - how much each committed/staged format changes the
 * attention output on realistic data: synthetic K/V at head_dim 128 whose keys
 * have a few outlier channels 10-50x larger than the rest (as reported for
 * real LLMs), queries that also weigh those channels.  For each format the
 * attention-output cosine similarity against the FP16 (draft) run is printed
 * and guarded by a floor set from the measurement.  The same measurement on
 * K/V from the real model (shared/models/stories260K) is the last test. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/llm/model.h"

#include "kernels_fixture.h"
#include "modelkv.h"

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

static void synthetic_outliers_on_path(void) {
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

/* On every path this CPU runs (the fused SIMD loops of attention_simd.h included). */
Test(fidelity, synthetic_outliers) {
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  for (size_t p = 0; p < 3; p++) {
    if (ckv_kernels_force(paths[p]) != CKV_OK) continue;
    printf("fidelity: path %s\n", ckv_kernels_path_name(paths[p]));
    synthetic_outliers_on_path();
  }
  ckv_kernels_force(CKV_PATH_AUTO);
}

/* The same measurement on K/V of the real model (shared/models/stories260K,
 * head_dim 8: small heads punish quantization far more than 128-wide ones).
 * A reference forward pass (the model library's split API, FP32 cache)
 * decodes 256 tokens greedily from BOS; per layer, the keys and values of
 * those tokens fill draft blocks, and the model's own queries of positions
 * 192..255 attend over all of them in each format. */
enum { MT = 256, MQ = 64 };

Test(fidelity, real_model_kv) {
  ckv_test_model_kv mkv;
  char why[1200];
  if (!ckv_test_model_kv_decode(MT, &mkv, why, sizeof(why))) cr_skip_test("%s", why);
  const ckv_model_config *c = mkv.c;
  const int L = c->n_layers, kvd = c->kv_dim, qd = c->n_heads * c->head_dim;
  const float *kc = mkv.k, *vc = mkv.v, *qs = mkv.q;
  ckv_geometry g = {.n_layers = 1, .n_kv_heads = (uint32_t)c->n_kv_heads, .head_dim = (uint32_t)c->head_dim,
                    .dtype = CKV_DTYPE_FP16};
  struct {
    const char *name;
    uint32_t fmt;
    double floor_mean;
  } rows[] = {
      /* floors: the measured means (5 layers x 64 queries x 8 heads: 0.99994, 0.99100,
       * 0.84264; worst heads 0.998, 0.237, -0.661) less a margin */
      {"int8", CKV_FORMAT_STAGED, 0.999},
      {"int4", CKV_FORMAT_COMMIT4, 0.98},
      {"int2", CKV_FORMAT_COMMIT2, 0.80},
  };
  double sum[3] = {0}, mn[3] = {1, 1, 1};
  size_t count = 0;
  float *ref = calloc((size_t)MQ * qd, sizeof(float)), *out = calloc((size_t)MQ * qd, sizeof(float));
  for (int l = 0; l < L; l++) {
    void *drafts[MT / 16];
    const void *cd[MT / 16];
    for (int b = 0; b < MT / 16; b++) {
      drafts[b] = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0);
      for (int sl = 0; sl < 16; sl++) {
        size_t row = (size_t)l * MT + (size_t)b * 16 + sl;
        kf_put(&g, drafts[b], 0, 0, (uint32_t)sl, kc + row * kvd);
        kf_put(&g, drafts[b], 0, 1, (uint32_t)sl, vc + row * kvd);
        ckv_block_positions(drafts[b])[sl] = (uint32_t)(b * 16 + sl);
        ckv_block_set_valid(drafts[b], (uint32_t)sl, true);
      }
      cd[b] = drafts[b];
    }
    const float *q = qs + ((size_t)l * MT + (MT - MQ)) * qd;
    ckv_attn_args a = {.geom = &g, .n_rows = MQ, .n_q_heads = (uint32_t)c->n_heads, .q = q, .blocks = cd,
                       .n_blocks = MT / 16, .out = ref};
    cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
    for (int f = 0; f < 3; f++) {
      void *blk[MT / 64];
      const void *cb[MT / 64];
      for (int b = 0; b < MT / 64; b++) {
        blk[b] = kf_block(rows[f].fmt, &g, 64, 0);
        ckv_move mv[64];
        for (int i = 0; i < 64; i++)
          mv[i] = (ckv_move){.src = drafts[b * 4 + i / 16], .src_slot = (uint32_t)(i % 16), .dst = blk[b],
                             .dst_slot = (uint32_t)i};
        cr_assert_eq(ckv_kernels_move(&g, mv, 64, CKV_MOVE_SET_VALID), CKV_OK);
        cb[b] = blk[b];
      }
      ckv_attn_args af = a;
      af.blocks = cb;
      af.n_blocks = MT / 64;
      af.out = out;
      cr_assert_eq(ckv_kernels_attention(&af), CKV_OK);
      for (int i = 0; i < MQ * c->n_heads; i++) {
        double cs = kf_cosine(out + (size_t)i * c->head_dim, ref + (size_t)i * c->head_dim, (size_t)c->head_dim);
        sum[f] += cs;
        mn[f] = fmin(mn[f], cs);
      }
      for (int b = 0; b < MT / 64; b++) free(blk[b]);
    }
    count += (size_t)MQ * c->n_heads;
    for (int b = 0; b < MT / 16; b++) free(drafts[b]);
  }
  for (int f = 0; f < 3; f++) {
    double mean = sum[f] / (double)count;
    printf("fidelity (stories260K K/V, head_dim %d): %-5s %.2f bits/elem  cosine vs fp16: mean %.5f min %.5f\n",
           c->head_dim, rows[f].name, ckv_format_bits_per_element(rows[f].fmt, &g, 64, 0), mean, mn[f]);
    cr_expect_geq(mean, rows[f].floor_mean, "%s mean cosine %f", rows[f].name, mean);
  }
  free(ref);
  free(out);
  ckv_test_model_kv_free(&mkv);
}
