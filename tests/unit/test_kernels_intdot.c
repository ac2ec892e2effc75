/* test_kernels_intdot.c - the integer score path of fused attention
 * (kernels/idot*.c, kernels/attention_int.c): every path's integer dot
 * products equal the plain C ones on random and extreme bytes (no int16
 * saturation, INT8 codes of -128, 4-bit codes of 15 against the largest
 * query codes, row tails of every length); a block's scores have the same
 * bits whichever tables compute them; and the error the INT8 query adds, on
 * scores and on attention outputs, stays within the measured bounds.  Paths
 * the CPU lacks are reported and skipped. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/attention_int.h"
#include "kernels/idot.h"
#include "kernels/rowops.h"
#include "kernels_fixture.h"

/* The integer tables and the row tables they run beside, the CPU permitting. */
typedef struct path {
  const char *name;
  const ckv_idotops *io;
  const ckv_rowops *ops;
  bool ok;
} path;
enum { NPATH = 5 };
static int paths(path out[NPATH]) {
  bool a2 = ckv_kernels_path_supported(CKV_PATH_AVX2), a5 = ckv_kernels_path_supported(CKV_PATH_AVX512);
  out[0] = (path){"scalar", &ckv_idot_scalar, &ckv_rowops_scalar, true};
  out[1] = (path){"avx2", &ckv_idot_avx2, &ckv_rowops_avx2, a2};
  out[2] = (path){"avx2 idot, avx512 rows (AVX-512 without VNNI)", &ckv_idot_avx2, &ckv_rowops_avx512, a5};
  out[3] = (path){"avx512vnni", &ckv_idot_avx512vnni, &ckv_rowops_avx512, ckv_idot_vnni_supported()};
  out[4] = (path){"avxvnni", &ckv_idot_avxvnni, &ckv_rowops_avx2, ckv_idot_avxvnni_supported()};
  int n = 0;
  for (int i = 0; i < NPATH; i++) {
    if (!out[i].ok) printf("intdot: %s not supported by this CPU: skipped\n", out[i].name);
    n += out[i].ok;
  }
  return n;
}

static int8_t q_code(kf_rng *r) { return (int8_t)((int)(kf_next(r) % 255u) - 127); } /* [-127, 127] */

/* One table against plain sums in 64-bit, for nq queries and nt rows of n channels. */
static void check_table(const ckv_idotops *io, const int8_t *p, size_t nq, size_t ldp, const uint8_t *rows,
                        size_t stride, size_t nt, size_t n, const char *what) {
  int32_t *o8 = malloc(nq * nt * 4), *o4 = malloc(nq * nt * 4), *o2 = malloc(nq * nt * 4);
  cr_assert(o8 && o4 && o2);
  io->i8(p, nq, ldp, (const int8_t *)rows, stride, nt, n, o8, nt);
  io->u4(p, nq, ldp, rows, stride, nt, n, o4, nt);
  io->u2(p, nq, ldp, rows, stride, nt, n, o2, nt);
  for (size_t i = 0; i < nq; i++)
    for (size_t t = 0; t < nt; t++) {
      int64_t e8 = 0, e4 = 0, e2 = 0;
      for (size_t j = 0; j < n; j++) {
        e8 += (int64_t)p[i * ldp + j] * (int8_t)rows[t * stride + j];
        e4 += (int64_t)p[i * ldp + ckv_idot_u4_index(j)] * ((rows[t * stride + j / 2] >> (4 * (j % 2))) & 15);
        e2 += (int64_t)p[i * ldp + ckv_idot_u2_index(j)] * ((rows[t * stride + j / 4] >> (2 * (j % 4))) & 3);
      }
      if (o8[i * nt + t] != e8 || o4[i * nt + t] != e4 || o2[i * nt + t] != e2) {
        cr_expect_eq(o8[i * nt + t], e8, "%s i8: n %zu nq %zu nt %zu query %zu row %zu", what, n, nq, nt, i, t);
        cr_expect_eq(o4[i * nt + t], e4, "%s u4: n %zu nq %zu nt %zu query %zu row %zu", what, n, nq, nt, i, t);
        cr_expect_eq(o2[i * nt + t], e2, "%s u2: n %zu nq %zu nt %zu query %zu row %zu", what, n, nq, nt, i, t);
        free(o8), free(o4), free(o2);
        return;
      }
    }
  free(o8), free(o4), free(o2);
}

Test(intdot, tables_equal_exact_sums) {
  path P[NPATH];
  paths(P);
  kf_rng r = {77};
  enum { LD = 512, NT = 37, NQ = 17 };
  int8_t *p = malloc(NQ * LD);
  uint8_t *rows = malloc(NT * LD);
  cr_assert(p && rows);
  static const size_t ns[] = {1, 2, 7, 31, 32, 33, 40, 63, 64, 65, 95, 96, 97, 100, 127, 128, 130, 200, 256, 511, 512};
  for (int pass = 0; pass < 4; pass++) {
    /* pass 0: random bytes; 1: INT8 codes -128 / 4-bit codes 15 against +127; 2: against -127;
     * 3: rows of 0x7f (INT8 127, nibbles 15 and 7) against alternating +-127 */
    for (size_t i = 0; i < NQ * LD; i++)
      p[i] = pass == 0 ? q_code(&r) : pass == 1 ? 127 : pass == 2 ? -127 : (i % 2 ? 127 : -127);
    for (size_t i = 0; i < NT * LD; i++) rows[i] = pass == 0 ? (uint8_t)kf_next(&r) : pass == 3 ? 0x7f : (i % 3 ? 0x80 : 0xff);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
      for (size_t nq = 1; nq <= NQ; nq += (nq < 5 ? 1 : 4))
        for (int i = 0; i < NPATH; i++) /* token counts: below one 16-token group of the VNNI lanes, one and a part, more */
          for (size_t nt = 5; nt <= NT; nt += 16)
            if (P[i].ok) check_table(P[i].io, p, nq, LD, rows, LD, nt, ns[k], P[i].io->name);
  }
  /* the largest magnitude, all exact: 512 x (-128) x 127 */
  int32_t o[1];
  memset(rows, 0x80, LD), memset(p, 127, LD);
  for (int i = 0; i < NPATH; i++)
    if (P[i].ok) {
      P[i].io->i8(p, 1, LD, (const int8_t *)rows, LD, 1, LD, o, 1);
      cr_expect_eq(o[0], -128 * 127 * LD, "%s", P[i].io->name);
    }
  free(p), free(rows);
}

/* Keys with a few outlier channels 10-50x the rest plus an offset (test_kernels_fidelity's data). */
typedef struct keygen {
  float gain[1024];
} keygen;
static float gen_keys(kf_rng *r, uint32_t l, uint32_t kv, uint32_t e, void *ctx) {
  const keygen *o = ctx;
  float v = kf_normal(r);
  return kv == 0 ? v * o->gain[e] + 0.3f * o->gain[e] : v;
}
static void keygen_init(keygen *o, kf_rng *r, size_t elems, uint32_t head_dim) {
  for (size_t e = 0; e < elems; e++) o->gain[e] = 1.0f;
  for (size_t h = 0; h < elems / head_dim; h++)
    for (int k = 0; k < 4; k++) o->gain[h * head_dim + kf_next(r) % head_dim] = 10.0f + 40.0f * (float)(kf_next(r) % 1000) / 1000.0f;
}

/* One block of fmt filled from drafts with `fill` tokens (slot i <- token i), some vacated. */
static void *make_block(const ckv_geometry *g, void *const *drafts, uint32_t fmt, uint32_t kept, uint32_t fill) {
  void *b = kf_block(fmt, g, 64, kept);
  ckv_move m[64];
  for (uint32_t i = 0; i < fill; i++) m[i] = (ckv_move){.src = drafts[i / 16], .src_slot = i % 16, .dst = b, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(g, m, fill, CKV_MOVE_SET_VALID), CKV_OK);
  ckv_block_set_valid(b, 5, false);
  return b;
}

typedef struct scorer {
  uint8_t *mem;
  ckv_iscratch w;
  ckv_iscore_query q;
  float *qs, *qr, *S;
  float *qsn; /* qs in nibble order, as fused attention hands committed blocks with every channel kept */
  int use_qsn;
} scorer;
static void scorer_init(scorer *s, const ckv_geometry *g, size_t nq) {
  uint32_t D = g->head_dim;
  ckv_iquery dummy;
  size_t a = ckv_iscratch_carve(&s->w, nq, D, NULL), b = ckv_iquery_carve(&dummy, nq, D, NULL);
  s->mem = aligned_alloc(64, a + 3 * b);
  s->qs = malloc(nq * D * 4), s->qr = malloc(nq * D * 4), s->S = malloc(nq * 64 * 4);
  s->qsn = malloc(nq * ckv_idot_ld(D) * 4), s->use_qsn = 0;
  cr_assert(s->mem && s->qs && s->qr && s->S && s->qsn);
  ckv_iscratch_carve(&s->w, nq, D, s->mem);
  ckv_iquery_carve(&s->q.qs8, nq, D, s->mem + a);
  ckv_iquery_carve(&s->q.qr8, nq, D, s->mem + a + b);
  ckv_iquery_carve(&s->q.qr8c, nq, D, s->mem + a + 2 * b);
  s->q.qs = s->qs, s->q.qr = s->qr, s->q.qsn = NULL;
}
static void scorer_done(scorer *s) { free(s->mem), free(s->qs), free(s->qr), free(s->S), free(s->qsn); }
/* Scores of kv head h as attention computes them: the query quantized, then the block scored. */
static void score(scorer *s, const path *p, const ckv_geometry *g, uint32_t layer, const void *blk, uint32_t h, size_t nq) {
  uint32_t D = g->head_dim;
  if (ckv_rot_head_dim_ok(D))
    for (size_t i = 0; i < nq; i++) {
      memcpy(s->qr + i * D, s->qs + i * D, D * 4);
      ckv_rot_forward(s->qr + i * D, D, layer, 0, h);
    }
  ckv_iquery_set(p->ops, s->qs, nq, D, D, CKV_IQ_NATURAL, &s->q.qs8, s->w.tmp);
  ckv_iquery_set(p->ops, s->qr, nq, D, D, CKV_IQ_NIBBLE, &s->q.qr8, s->w.tmp);
  ckv_iquery_set(p->ops, s->qr, nq, D, D, CKV_IQ_CRUMB, &s->q.qr8c, s->w.tmp);
  s->q.qsn = NULL;
  if (s->use_qsn) {
    size_t ld = ckv_idot_ld(D);
    memset(s->qsn, 0, nq * ld * 4);
    for (size_t i = 0; i < nq; i++)
      for (uint32_t j = 0; j < D; j++) s->qsn[i * ld + ckv_idot_u4_index(j)] = s->qs[i * D + j];
    s->q.qsn = s->qsn;
  }
  ckv_iscore_block(p->ops, p->io, g, layer, blk, h, &s->q, nq, &s->w, s->S);
}

/* The worst |int score - exact score of the dequantized key| over a block, and the rms of the exact scores. */
static void score_error(const ckv_geometry *g, uint32_t layer, const void *blk, uint32_t h, const float *qs, size_t nq,
                        const float *S, double *ret_max, double *ret_ss, size_t *ret_n) {
  size_t te = ckv_draft_token_elems(g);
  float *k = malloc(te * 4);
  uint32_t D = g->head_dim;
  for (uint32_t t = 0; t < 64; t++) {
    if (!ckv_block_slot_valid(blk, t) || ckv_kernels_dequantize(g, blk, layer, 0, t, k) != CKV_OK) {
      for (size_t i = 0; i < nq; i++) cr_expect(isinf(S[i * 64 + t]) && S[i * 64 + t] < 0, "slot %u empty", t);
      continue;
    }
    for (size_t i = 0; i < nq; i++) {
      double e = 0;
      for (uint32_t d = 0; d < D; d++) e += (double)qs[i * D + d] * k[h * D + d];
      *ret_max = fmax(*ret_max, fabs(S[i * 64 + t] - e));
      *ret_ss += e * e;
      ++*ret_n;
    }
  }
  free(k);
}

Test(intdot, block_scores_same_bits_on_every_path_and_close_to_exact) {
  const ckv_geometry geoms[] = {{2, 2, 128, CKV_DTYPE_FP16}, {1, 3, 40, CKV_DTYPE_BF16}, {1, 6, 8, CKV_DTYPE_FP16},
                                {1, 2, 256, CKV_DTYPE_FP16}};
  path P[NPATH];
  int tested = paths(P);
  for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++) {
    const ckv_geometry *g = &geoms[gi];
    uint32_t D = g->head_dim, layer = g->n_layers - 1;
    kf_rng r = {900 + gi};
    keygen kg;
    keygen_init(&kg, &r, ckv_draft_token_elems(g), D);
    void *d[4];
    for (int i = 0; i < 4; i++) {
      d[i] = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
      kf_fill_draft(g, d[i], &r, gen_keys, &kg, 16u * i);
    }
    struct {
      uint32_t fmt, kept;
      /* max |error| / rms of the exact scores: the worst measured over these geometries and seeds
       * (staged 0.030, committed 0.133, ROT4 0.028, ROT2 0.031) with a margin.  Committed keys fold their
       * per-channel scales into the query, so an outlier channel's scale sets the INT8 step of all. */
      double bound;
    } fm[] = {{CKV_FORMAT_STAGED, 0, 0.05}, {CKV_FORMAT_COMMIT4, 0, 0.2}, {CKV_FORMAT_COMMIT4, D * 3 / 4 + 1, 0.2},
              {CKV_FORMAT_ROT4, 0, 0.05}, {CKV_FORMAT_ROT2, 0, 0.05}};
    for (size_t f = 0; f < 5; f++) {
      if (ckv_format_is_rot(fm[f].fmt) && !ckv_rot_head_dim_ok(D)) continue;
      if (fm[f].kept > D || (fm[f].kept && fm[f].kept == D)) continue;
      void *blk = make_block(g, d, fm[f].fmt, fm[f].kept, 50); /* 50 of 64: chunk 1 sealed part full */
      for (size_t nq = 1; nq <= 6; nq += 5) {
        scorer s, ref;
        scorer_init(&s, g, nq), scorer_init(&ref, g, nq);
        for (size_t i = 0; i < nq * D; i++) s.qs[i] = ref.qs[i] = kf_normal(&r) / sqrtf((float)D);
        double emax = 0, ss = 0;
        size_t n = 0;
        for (uint32_t h = 0; h < g->n_kv_heads; h++) {
          score(&ref, &P[0], g, layer, blk, h, nq);
          /* every path, with the call's nibble-ordered query and without (the block folds its own): the same bits */
          for (int p = 0; p < 2 * NPATH; p++) {
            if (!P[p % NPATH].ok || p == 0) continue;
            s.use_qsn = p >= NPATH;
            score(&s, &P[p % NPATH], g, layer, blk, h, nq);
            cr_expect_eq(memcmp(s.S, ref.S, nq * 64 * 4), 0,
                         "fmt %u kept %u D %u nq %zu head %u: %s scores (%s query) differ from scalar", fm[f].fmt,
                         fm[f].kept, D, nq, h, P[p % NPATH].name, s.use_qsn ? "nibble-ordered" : "block-folded");
          }
          score_error(g, layer, blk, h, ref.qs, nq, ref.S, &emax, &ss, &n);
        }
        double rms = sqrt(ss / (double)n);
        printf("intdot: fmt %u kept %3u head_dim %3u rows %zu: max |score error| %.3g (%.4f of the score rms %.3g)\n",
               fm[f].fmt, fm[f].kept ? fm[f].kept : D, D, nq, emax, emax / rms, rms);
        cr_expect_leq(emax / rms, fm[f].bound, "fmt %u D %u: max error %g of rms %g", fm[f].fmt, D, emax, rms);
        scorer_done(&s), scorer_done(&ref);
      }
      free(blk);
    }
    for (int i = 0; i < 4; i++) free(d[i]);
  }
  printf("intdot: %d table pairs compared\n", tested);
}

/* Attention outputs with integer scores against float scores and against FP16
 * (draft) keys, per format, on test_kernels_fidelity's data: head_dim 128,
 * keys with outlier channels, 512 tokens, 2 rows x 8 query heads.  Also: the
 * environment variable chooses when the call does not, with the same bits. */
typedef struct cosines {
  double mean, min;
} cosines;
static cosines compare(const float *a, const float *b, size_t n_heads, size_t D) {
  cosines c = {0, 1};
  for (size_t i = 0; i < n_heads; i++) {
    double v = kf_cosine(a + i * D, b + i * D, D);
    c.mean += v / (double)n_heads;
    c.min = fmin(c.min, v);
  }
  return c;
}

static void attention_outputs_close_to_float_scores_on_path(void) {
  enum { D = 128, H = 2, QH = 8, R = 2, TOKENS = 512 };
  const ckv_geometry g = {1, H, D, CKV_DTYPE_FP16};
  kf_rng r = {2024};
  keygen kg;
  keygen_init(&kg, &r, H * D, D);
  void *d[TOKENS / 16];
  for (int i = 0; i < TOKENS / 16; i++) {
    d[i] = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0);
    kf_fill_draft(&g, d[i], &r, gen_keys, &kg, 16u * i);
  }
  float q[R * QH * D], o16[R * QH * D], of[R * QH * D], oi[R * QH * D], oe[R * QH * D];
  for (int i = 0; i < R * QH * D; i++) q[i] = kf_normal(&r) * (kg.gain[(i / (D * (QH / H)) % H) * D + i % D] > 1 ? 0.5f : 1.0f);
  ckv_attn_args a = {.geom = &g, .n_rows = R, .n_q_heads = QH, .q = q, .blocks = (const void *const *)d,
                     .n_blocks = TOKENS / 16, .out = o16, .scores = CKV_ATTN_SCORES_FLOAT};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  struct {
    const char *name;
    uint32_t fmt;
    double floor_mean, floor_min; /* cosine of int vs float scores: the measurement less a margin */
  } fm[] = {/* measured: 0.999883 / 0.999624, 0.999214 / 0.996139, 0.999883 / 0.999698, 0.999899 / 0.999595 */
            {"int8", CKV_FORMAT_STAGED, 0.9995, 0.998},
            {"int4", CKV_FORMAT_COMMIT4, 0.998, 0.99},
            {"rot4", CKV_FORMAT_ROT4, 0.9995, 0.998},
            {"rot2", CKV_FORMAT_ROT2, 0.9995, 0.998}};
  for (size_t f = 0; f < 4; f++) {
    void *blk[TOKENS / 64];
    for (int b = 0; b < TOKENS / 64; b++) blk[b] = make_block(&g, d + 4 * b, fm[f].fmt, 0, 64);
    ckv_attn_args x = a;
    x.blocks = (const void *const *)blk;
    x.n_blocks = TOKENS / 64;
    x.out = of;
    cr_assert_eq(ckv_kernels_attention(&x), CKV_OK);
    x.out = oi;
    x.scores = CKV_ATTN_SCORES_INT8;
    cr_assert_eq(ckv_kernels_attention(&x), CKV_OK);
    setenv("CKV_ATTENTION_SCORES", "int8", 1);
    x.out = oe;
    x.scores = 0;
    cr_assert_eq(ckv_kernels_attention(&x), CKV_OK);
    cr_expect_eq(memcmp(oi, oe, sizeof oi), 0, "%s: CKV_ATTENTION_SCORES=int8 gives the integer path", fm[f].name);
    setenv("CKV_ATTENTION_SCORES", "float", 1);
    cr_assert_eq(ckv_kernels_attention(&x), CKV_OK);
    cr_expect_eq(memcmp(of, oe, sizeof of), 0, "%s: CKV_ATTENTION_SCORES=float gives the float path", fm[f].name);
    unsetenv("CKV_ATTENTION_SCORES");
    /* neither the call nor the environment: the format's default, integer scores for ROT4 and ROT2 only */
    bool int_default = fm[f].fmt == CKV_FORMAT_ROT4 || fm[f].fmt == CKV_FORMAT_ROT2;
    uint32_t sc = 0, vc = 0;
    ckv_attention_choice(&x, fm[f].fmt, &sc, &vc);
    cr_expect_eq(sc, int_default ? CKV_ATTN_SCORES_INT8 : CKV_ATTN_SCORES_FLOAT, "%s: default scores %u", fm[f].name, sc);
    cr_assert_eq(ckv_kernels_attention(&x), CKV_OK);
    cr_expect_eq(memcmp(int_default ? oi : of, oe, sizeof oe), 0, "%s: the default gives the %s path", fm[f].name,
                 int_default ? "integer" : "float");
    cosines ci = compare(oi, of, R * QH, D), c16f = compare(of, o16, R * QH, D), c16i = compare(oi, o16, R * QH, D);
    printf("intdot: %-5s attention cosine int vs float scores: mean %.6f min %.6f; vs fp16 keys: float %.5f (min %.5f), "
           "int %.5f (min %.5f)\n",
           fm[f].name, ci.mean, ci.min, c16f.mean, c16f.min, c16i.mean, c16i.min);
    cr_expect_geq(ci.mean, fm[f].floor_mean, "%s mean %f", fm[f].name, ci.mean);
    cr_expect_geq(ci.min, fm[f].floor_min, "%s min %f", fm[f].name, ci.min);
    for (int b = 0; b < TOKENS / 64; b++) free(blk[b]);
  }
  for (int i = 0; i < TOKENS / 16; i++) free(d[i]);
}

/* On every path this CPU runs (the fused SIMD loops of attention_simd.h included). */
Test(intdot, attention_outputs_close_to_float_scores) {
  static const ckv_cpu_path paths[] = {CKV_PATH_SCALAR, CKV_PATH_AVX2, CKV_PATH_AVX512};
  for (size_t p = 0; p < 3; p++) {
    if (ckv_kernels_force(paths[p]) != CKV_OK) continue;
    printf("intdot: path %s\n", ckv_kernels_path_name(paths[p]));
    attention_outputs_close_to_float_scores_on_path();
  }
  ckv_kernels_force(CKV_PATH_AUTO);
}

/* Extreme codes no valid quantization writes but a worker may: every staged
 * code -128, every 4-bit code 15, with the largest FP16 scales and a query
 * whose every element is the same large value (so its INT8 codes are all
 * 127 and exact): any int16 saturation or bias slip would be far off the
 * exact scores of the dequantized keys. */
Test(intdot, extreme_codes_do_not_saturate) {
  const ckv_geometry g = {1, 2, 256, CKV_DTYPE_FP16};
  path P[NPATH];
  paths(P);
  kf_rng r = {5};
  void *d[4];
  for (int i = 0; i < 4; i++) {
    d[i] = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0);
    kf_fill_draft(&g, d[i], &r, NULL, NULL, 16u * i);
  }
  uint32_t fmts[] = {CKV_FORMAT_STAGED, CKV_FORMAT_COMMIT4, CKV_FORMAT_ROT4};
  for (int f = 0; f < 3; f++) {
    void *blk = make_block(&g, d, fmts[f], 0, 50);
    uint8_t *b = blk;
    if (fmts[f] == CKV_FORMAT_STAGED) { /* codes -128, scales 65504 */
      memset(b + ckv_staged_codes_offset(&g, 64, 0, 0), 0x80, 64 * 512);
      uint16_t *sc = (uint16_t *)(b + ckv_staged_scales_offset(&g, 64, 0, 0));
      for (int i = 0; i < 64 * 2; i++) sc[i] = 0x7bff;
    } else if (fmts[f] == CKV_FORMAT_ROT4) {
      memset(b + ckv_rot_codes_offset(fmts[f], &g, 64, 0, 0), 0xff, 64 * 2 * 128);
      uint8_t *sc = b + ckv_rot_scales_offset(fmts[f], &g, 64, 0, 0);
      for (int i = 0; i < 64 * 2; i++) sc[i] = CKV_ROT_SCALE_CODES; /* the largest scale */
    } else {
      for (uint32_t h = 0; h < 2; h++)
        for (uint32_t c = 0; c < 2; c++) {
          uint8_t *ch = b + ckv_commit_key_chunk_offset(fmts[f], &g, 64, 256, 0, h, c);
          for (int i = 0; i < 256; i++) ((uint16_t *)ch)[i] = 0x7bff, ((uint16_t *)ch)[256 + i] = 0xfbff; /* +-65504 */
          memset(ch + 256 * 4, 0xff, 32 * 128);
        }
    }
    scorer s;
    scorer_init(&s, &g, 3);
    for (int i = 0; i < 3 * 256; i++) s.qs[i] = i < 256 ? 1000.0f : i < 512 ? -1000.0f : 1e-3f;
    for (int p = 0; p < NPATH; p++) {
      if (!P[p].ok) continue;
      for (uint32_t h = 0; h < 2; h++) {
        score(&s, &P[p], &g, 0, blk, h, 3);
        double emax = 0, ss = 0;
        size_t n = 0;
        score_error(&g, 0, blk, h, s.qs, 3, s.S, &emax, &ss, &n);
        double rms = sqrt(ss / (double)n);
        /* measured 4e-14 (staged), 9e-8 (committed); ROT4 rotates the constant query, so its INT8
         * codes are no longer exact: 0.0136 there (all codes 15, nothing cancels) */
        double bound = fmts[f] == CKV_FORMAT_ROT4 ? 0.03 : 1e-5;
        cr_expect_leq(emax / rms, bound, "fmt %u %s head %u: max error %g of rms %g", fmts[f], P[p].name, h, emax, rms);
        if (h == 0) printf("intdot: extreme codes, fmt %u, %s: max |score error| %.3g of rms %.3g\n", fmts[f], P[p].name, emax, rms);
      }
    }
    scorer_done(&s);
    free(blk);
  }
  for (int i = 0; i < 4; i++) free(d[i]);
}
