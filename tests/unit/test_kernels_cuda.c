/* test_kernels_cuda.c - the CUDA kernels against the CPU ones: the same
 * transitions must write the same bytes on both (DESIGN.md §4 inv. 7), the
 * same dequantized values, and attention within FP32 rounding.  Without a
 * GPU (or without the CUDA build) every test reports itself skipped, never
 * passed.  CUDA is initialised inside each test (Criterion forks workers).
 * CUDA's attention is FP32 throughout, so the CPU side of each comparison
 * asks for FP32 scores and values (the CPU's defaults for ROT4 and ROT2 are
 * integer scores and BF16 values, bounded against the oracle elsewhere). */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels_fixture.h"

#ifdef CKV_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>

#include "store/compact.h"
#include "kernels/cuda/kernels_cuda.h"

static void need_gpu(void) {
  if (ckv_cuda_available() != CKV_OK) cr_skip_test("no CUDA device: %s", ckv_cuda_unavailable_reason());
}

/* Device copy of a host block. */
static void *to_dev(const void *host, size_t n) {
  void *d = NULL;
  cr_assert_eq(cudaMalloc(&d, n), cudaSuccess);
  cr_assert_eq(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

static const ckv_geometry geoms[] = {{2, 2, 64, CKV_DTYPE_FP16}, {1, 3, 40, CKV_DTYPE_BF16}, {1, 6, 8, CKV_DTYPE_FP16}};

static float gen_wild(kf_rng *r, uint32_t l, uint32_t kv, uint32_t e, void *ctx) {
  float v = kf_normal(r);
  if (e % 13 == 5) v *= 30.0f;
  if (kf_next(r) % 89 == 0) v = 0.0f;
  return v;
}

Test(cuda, transitions_same_bytes) {
  need_gpu();
  for (size_t gi = 0; gi < 3; gi++) {
    const ckv_geometry *g = &geoms[gi];
    kf_rng r = {61 + gi};
    void *d[4], *dd[4];
    size_t db = ckv_format_block_bytes(CKV_FORMAT_DRAFT, g, 16, 0);
    for (int i = 0; i < 4; i++) {
      d[i] = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
      kf_fill_draft(g, d[i], &r, gen_wild, NULL, 16u * i);
      dd[i] = to_dev(d[i], db);
    }
    for (uint32_t fmt = CKV_FORMAT_COMMIT4; fmt <= CKV_FORMAT_COMMIT2; fmt++) {
      uint32_t kept = fmt == CKV_FORMAT_COMMIT2 ? g->head_dim / 2 : 0;
      size_t sb = ckv_format_block_bytes(CKV_FORMAT_STAGED, g, 64, 0), cb = ckv_format_block_bytes(fmt, g, 64, kept);
      void *s = kf_block(CKV_FORMAT_STAGED, g, 64, 0), *c = kf_block(fmt, g, 64, kept);
      void *ds = to_dev(s, sb), *dc = to_dev(c, cb);
      ckv_move m[64], dm[64];
      for (uint32_t i = 0; i < 64; i++) {
        m[i] = (ckv_move){.src = d[i / 16], .src_slot = i % 16, .dst = s, .dst_slot = i};
        dm[i] = (ckv_move){.src = dd[i / 16], .src_slot = i % 16, .dst = ds, .dst_slot = i};
      }
      cr_assert_eq(ckv_kernels_move(g, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
      cr_assert_eq(ckv_cuda_move(g, dm, 64, CKV_MOVE_SET_VALID, NULL), CKV_OK);
      for (uint32_t i = 0; i < 40; i++) {
        m[i] = (ckv_move){.src = i % 2 ? s : d[i / 16], .src_slot = i % 16, .dst = c, .dst_slot = i};
        dm[i] = (ckv_move){.src = i % 2 ? ds : dd[i / 16], .src_slot = i % 16, .dst = dc, .dst_slot = i};
      }
      cr_assert_eq(ckv_kernels_move(g, m, 40, CKV_MOVE_SET_VALID), CKV_OK);
      cr_assert_eq(ckv_cuda_move(g, dm, 40, CKV_MOVE_SET_VALID, NULL), CKV_OK);
      uint8_t *back = malloc(sb > cb ? sb : cb);
      cudaMemcpy(back, ds, sb, cudaMemcpyDeviceToHost);
      cr_expect_eq(memcmp(back, s, sb), 0, "staged bytes differ (geometry %zu)", gi);
      cudaMemcpy(back, dc, cb, cudaMemcpyDeviceToHost);
      cr_expect_eq(memcmp(back, c, cb), 0, "committed bytes differ (geometry %zu, fmt %u)", gi, fmt);
      /* dequantize on the GPU: same floats */
      size_t te = ckv_draft_token_elems(g);
      float *x = malloc(te * 4), *y = malloc(te * 4), *dy;
      cudaMalloc((void **)&dy, te * 4);
      for (uint32_t kv = 0; kv < 2; kv++) {
        cr_assert_eq(ckv_kernels_dequantize(g, c, 0, kv, 7, x), CKV_OK);
        cr_assert_eq(ckv_cuda_dequantize(g, dc, 0, kv, 7, dy, NULL), CKV_OK);
        cudaMemcpy(y, dy, te * 4, cudaMemcpyDeviceToHost);
        cr_expect_eq(memcmp(x, y, te * 4), 0, "dequantized values differ (kv %u)", kv);
      }
      /* attention over the mix */
      const void *hb[] = {d[3], s, c}, *dbk[] = {dd[3], ds, dc};
      uint32_t QH = g->n_kv_heads * 2;
      size_t qn = (size_t)2 * QH * g->head_dim, slots = 16 + 64 + 64;
      float *q = malloc(qn * 4), *o = malloc(qn * 4), *o2 = malloc(qn * 4), mass[144], mass2[144], *dq, *dout, *dmass;
      for (size_t i = 0; i < qn; i++) q[i] = kf_normal(&r);
      cudaMalloc((void **)&dq, qn * 4);
      cudaMalloc((void **)&dout, qn * 4);
      cudaMalloc((void **)&dmass, slots * 4);
      cudaMemcpy(dq, q, qn * 4, cudaMemcpyHostToDevice);
      ckv_attn_args a = {.geom = g, .n_rows = 2, .n_q_heads = QH, .q = q, .blocks = hb, .n_blocks = 3, .out = o, .mass = mass,
                         .scores = CKV_ATTN_SCORES_FLOAT, .values = CKV_ATTN_VALUES_FLOAT};
      cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
      a.q = dq, a.blocks = dbk, a.out = dout, a.mass = dmass;
      cr_assert_eq(ckv_cuda_attention(&a, NULL), CKV_OK);
      cudaMemcpy(o2, dout, qn * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(mass2, dmass, slots * 4, cudaMemcpyDeviceToHost);
      cr_expect_leq(kf_max_rel(o2, o, qn, 0.05), 1e-3);
      cr_expect_leq(kf_max_rel(mass2, mass, slots, 1e-3), 1e-3);
      cudaFree(dq), cudaFree(dout), cudaFree(dmass), cudaFree(dy), cudaFree(ds), cudaFree(dc);
      free(q), free(o), free(o2), free(x), free(y), free(back), free(s), free(c);
    }
    for (int i = 0; i < 4; i++) free(d[i]), cudaFree(dd[i]);
  }
}

/* The rotated formats (formats v2): draft, staged and rotated sources into
 * ROT4..ROT1 give the CPU's bytes; dequantized values equal; attention over
 * a mix of rotated and plain blocks within FP32 rounding of the CPU's.
 * Geometries with a power-of-two head_dim only (64 and 8). */
Test(cuda, rotated_formats_same_bytes) {
  need_gpu();
  const ckv_geometry rg[] = {geoms[0], geoms[2], {4, 2, 64, CKV_DTYPE_BF16}};
  for (size_t gi = 0; gi < 3; gi++) {
    const ckv_geometry *g = &rg[gi];
    kf_rng r = {171 + gi};
    size_t db = ckv_format_block_bytes(CKV_FORMAT_DRAFT, g, 64, 0), sb = ckv_format_block_bytes(CKV_FORMAT_STAGED, g, 64, 0);
    void *d = kf_block(CKV_FORMAT_DRAFT, g, 64, 0), *s = kf_block(CKV_FORMAT_STAGED, g, 64, 0);
    kf_fill_draft(g, d, &r, gen_wild, NULL, 0);
    void *dd = to_dev(d, db), *ds = to_dev(s, sb);
    ckv_move m[64], dm[64];
    for (uint32_t i = 0; i < 64; i++) {
      m[i] = (ckv_move){.src = d, .src_slot = i, .dst = s, .dst_slot = i};
      dm[i] = (ckv_move){.src = dd, .src_slot = i, .dst = ds, .dst_slot = i};
    }
    cr_assert_eq(ckv_kernels_move(g, m, 64, CKV_MOVE_SET_VALID), CKV_OK);
    cr_assert_eq(ckv_cuda_move(g, dm, 64, CKV_MOVE_SET_VALID, NULL), CKV_OK);
    void *hr4 = NULL, *dr4 = NULL;
    for (uint32_t fmt = CKV_FORMAT_ROT4; fmt <= CKV_FORMAT_ROT1; fmt++) {
      size_t cb = ckv_format_block_bytes(fmt, g, 64, 0);
      void *c = kf_block(fmt, g, 64, 0), *dc = to_dev(c, cb);
      /* even slots from the draft, odd ones from the staged block; ROT1 from ROT4 */
      for (uint32_t i = 0; i < 48; i++) {
        const void *hs = fmt == CKV_FORMAT_ROT1 ? hr4 : i % 2 ? s : d;
        const void *dsrc = fmt == CKV_FORMAT_ROT1 ? dr4 : i % 2 ? ds : dd;
        m[i] = (ckv_move){.src = hs, .src_slot = i, .dst = c, .dst_slot = 63 - i};
        dm[i] = (ckv_move){.src = dsrc, .src_slot = i, .dst = dc, .dst_slot = 63 - i};
      }
      cr_assert_eq(ckv_kernels_move(g, m, 48, CKV_MOVE_SET_VALID), CKV_OK);
      cr_assert_eq(ckv_cuda_move(g, dm, 48, CKV_MOVE_SET_VALID, NULL), CKV_OK);
      uint8_t *back = malloc(cb);
      cudaMemcpy(back, dc, cb, cudaMemcpyDeviceToHost);
      cr_expect_eq(memcmp(back, c, cb), 0, "rotated bytes differ (geometry %zu, fmt %u)", gi, fmt);
      size_t te = ckv_draft_token_elems(g);
      float *x = malloc(te * 4), *y = malloc(te * 4), *dy;
      cudaMalloc((void **)&dy, te * 4);
      for (uint32_t kv = 0; kv < 2; kv++) {
        cr_assert_eq(ckv_kernels_dequantize(g, c, g->n_layers - 1, kv, 60, x), CKV_OK);
        cr_assert_eq(ckv_cuda_dequantize(g, dc, g->n_layers - 1, kv, 60, dy, NULL), CKV_OK);
        cudaMemcpy(y, dy, te * 4, cudaMemcpyDeviceToHost);
        cr_expect_eq(memcmp(x, y, te * 4), 0, "dequantized rotated values differ (fmt %u kv %u)", fmt, kv);
      }
      const void *hb[] = {c, d, s}, *dbk[] = {dc, dd, ds};
      uint32_t QH = g->n_kv_heads * 2;
      size_t qn = (size_t)2 * QH * g->head_dim, slots = 192;
      float *q = malloc(qn * 4), *o = malloc(qn * 4), *o2 = malloc(qn * 4), mass[192], mass2[192], *dq, *dout, *dmass;
      for (size_t i = 0; i < qn; i++) q[i] = 0.3f * kf_normal(&r);
      cudaMalloc((void **)&dq, qn * 4), cudaMalloc((void **)&dout, qn * 4), cudaMalloc((void **)&dmass, slots * 4);
      cudaMemcpy(dq, q, qn * 4, cudaMemcpyHostToDevice);
      ckv_attn_args a = {.geom = g, .layer = g->n_layers - 1, .n_rows = 2, .n_q_heads = QH, .q = q, .blocks = hb,
                         .n_blocks = 3, .out = o, .mass = mass, .scores = CKV_ATTN_SCORES_FLOAT,
                         .values = CKV_ATTN_VALUES_FLOAT};
      cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
      a.q = dq, a.blocks = dbk, a.out = dout, a.mass = dmass;
      cr_assert_eq(ckv_cuda_attention(&a, NULL), CKV_OK);
      cudaMemcpy(o2, dout, qn * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(mass2, dmass, slots * 4, cudaMemcpyDeviceToHost);
      cr_expect_leq(kf_max_rel(o2, o, qn, 0.05), 1e-3, "fmt %u: outputs differ from the CPU's", fmt);
      cr_expect_leq(kf_max_rel(mass2, mass, slots, 1e-3), 1e-3, "fmt %u: mass differs from the CPU's", fmt);
      cudaFree(dq), cudaFree(dout), cudaFree(dmass), cudaFree(dy);
      free(q), free(o), free(o2), free(x), free(y), free(back);
      if (fmt == CKV_FORMAT_ROT4) {
        hr4 = c, dr4 = dc;
      } else {
        free(c), cudaFree(dc);
      }
    }
    free(hr4), cudaFree(dr4), free(d), free(s), cudaFree(dd), cudaFree(ds);
  }
}

Test(cuda, errors) {
  need_gpu();
  const ckv_geometry *g = &geoms[0];
  void *s = kf_block(CKV_FORMAT_STAGED, g, 64, 0), *d = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
  void *ds = to_dev(s, ckv_format_block_bytes(CKV_FORMAT_STAGED, g, 64, 0)),
       *dd = to_dev(d, ckv_format_block_bytes(CKV_FORMAT_DRAFT, g, 16, 0));
  ckv_move back = {.src = ds, .src_slot = 0, .dst = dd, .dst_slot = 0};
  cr_expect_eq(ckv_cuda_move(g, &back, 1, 0, NULL), CKV_ERR_UNSUPPORTED);
  ckv_move out = {.src = dd, .src_slot = 16, .dst = ds, .dst_slot = 0};
  cr_expect_eq(ckv_cuda_move(g, &out, 1, 0, NULL), CKV_ERR_RANGE);
  cudaFree(ds), cudaFree(dd), free(s), free(d);
}

/* Long views and wide heads on a non-blocking stream: more slots than one
 * output split (several splits reduced), head_dim 512 (512-thread blocks),
 * some slots empty, and the caller's own stream, which does not wait for
 * the legacy default stream. */
Test(cuda, attention_splits_wide_heads_own_stream) {
  need_gpu();
  const ckv_geometry g = {1, 2, 512, CKV_DTYPE_FP16};
  enum { NB = 40 }; /* 640 slots */
  kf_rng r = {91};
  void *hb[NB], *db[NB];
  size_t bb = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &g, 16, 0);
  for (int i = 0; i < NB; i++) {
    hb[i] = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0);
    kf_fill_draft(&g, hb[i], &r, NULL, NULL, 16u * i);
    if (i % 7 == 3) ckv_block_set_valid(hb[i], 5, false);
    db[i] = to_dev(hb[i], bb);
  }
  cudaStream_t st;
  cr_assert_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  uint32_t QH = 4, rows = 3;
  size_t qn = (size_t)rows * QH * g.head_dim, slots = 16u * NB;
  float *q = malloc(qn * 4), *o = malloc(qn * 4), *o2 = malloc(qn * 4), *m = malloc(slots * 4), *m2 = malloc(slots * 4);
  for (size_t i = 0; i < qn; i++) q[i] = kf_normal(&r) * 0.05f;
  float *dq, *dout, *dmass;
  cudaMalloc((void **)&dq, qn * 4), cudaMalloc((void **)&dout, qn * 4), cudaMalloc((void **)&dmass, slots * 4);
  cudaMemcpy(dq, q, qn * 4, cudaMemcpyHostToDevice);
  ckv_attn_args a = {.geom = &g, .n_rows = rows, .n_q_heads = QH, .q = q, .blocks = (const void *const *)hb,
                     .n_blocks = NB, .out = o, .mass = m, .scores = CKV_ATTN_SCORES_FLOAT,
                     .values = CKV_ATTN_VALUES_FLOAT};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  a.q = dq, a.blocks = (const void *const *)db, a.out = dout, a.mass = dmass;
  cr_assert_eq(ckv_cuda_attention(&a, st), CKV_OK);
  cudaMemcpy(o2, dout, qn * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(m2, dmass, slots * 4, cudaMemcpyDeviceToHost);
  cr_expect_leq(kf_max_rel(o2, o, qn, 0.05), 1e-3, "outputs differ from the CPU's");
  cr_expect_leq(kf_max_rel(m2, m, slots, 1e-3), 1e-3, "mass differs from the CPU's");
  const void *nul[] = {db[0], NULL};
  a.blocks = nul, a.n_blocks = 2;
  cr_expect_eq(ckv_cuda_attention(&a, st), CKV_ERR_INVALID, "a NULL block is refused, not dereferenced");
  cudaStreamDestroy(st);
  cudaFree(dq), cudaFree(dout), cudaFree(dmass);
  for (int i = 0; i < NB; i++) free(hb[i]), cudaFree(db[i]);
  free(q), free(o), free(o2), free(m), free(m2);
}

/* Prefill-sized query tiles (rows x group heads x head_dim beyond what the
 * warp-per-slot kernel keeps in shared memory) take the thread-per-slot
 * scores kernel: same results. */
Test(cuda, attention_large_query_tile) {
  need_gpu();
  const ckv_geometry g = {1, 2, 64, CKV_DTYPE_FP16};
  kf_rng r = {5};
  void *hb[3], *db[3];
  size_t bb = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &g, 16, 0);
  for (int i = 0; i < 3; i++) {
    hb[i] = kf_block(CKV_FORMAT_DRAFT, &g, 16, 0);
    kf_fill_draft(&g, hb[i], &r, gen_wild, NULL, 16u * i);
    db[i] = to_dev(hb[i], bb);
  }
  uint32_t QH = 8, rows = 40; /* 40 rows x 4 heads x 64 = 10240 floats */
  size_t qn = (size_t)rows * QH * g.head_dim;
  float *q = malloc(qn * 4), *o = malloc(qn * 4), *o2 = malloc(qn * 4), *dq, *dout;
  for (size_t i = 0; i < qn; i++) q[i] = kf_normal(&r) * 0.1f;
  cudaMalloc((void **)&dq, qn * 4), cudaMalloc((void **)&dout, qn * 4);
  cudaMemcpy(dq, q, qn * 4, cudaMemcpyHostToDevice);
  ckv_attn_args a = {.geom = &g, .n_rows = rows, .n_q_heads = QH, .q = q, .blocks = (const void *const *)hb,
                     .n_blocks = 3, .out = o, .scores = CKV_ATTN_SCORES_FLOAT, .values = CKV_ATTN_VALUES_FLOAT};
  cr_assert_eq(ckv_kernels_attention(&a), CKV_OK);
  a.q = dq, a.blocks = (const void *const *)db, a.out = dout;
  cr_assert_eq(ckv_cuda_attention(&a, NULL), CKV_OK);
  cudaMemcpy(o2, dout, qn * 4, cudaMemcpyDeviceToHost);
  cr_expect_leq(kf_max_rel(o2, o, qn, 0.05), 1e-3, "outputs differ from the CPU's");
  cudaFree(dq), cudaFree(dout);
  for (int i = 0; i < 3; i++) free(hb[i]), cudaFree(db[i]);
  free(q), free(o), free(o2);
}

/* Compaction on the GPU: same-format copies give the CPU's bytes. */
Test(cuda, copy_slots_same_bytes) {
  need_gpu();
  const ckv_geometry *g = &geoms[0];
  kf_rng r = {7};
  void *d0 = kf_block(CKV_FORMAT_DRAFT, g, 16, 0), *d1 = kf_block(CKV_FORMAT_DRAFT, g, 16, 0);
  kf_fill_draft(g, d0, &r, gen_wild, NULL, 0);
  size_t db = ckv_format_block_bytes(CKV_FORMAT_DRAFT, g, 16, 0), sb = ckv_format_block_bytes(CKV_FORMAT_STAGED, g, 64, 0);
  void *s0 = kf_block(CKV_FORMAT_STAGED, g, 64, 0), *s1 = kf_block(CKV_FORMAT_STAGED, g, 64, 0);
  ckv_move q[16];
  for (uint32_t i = 0; i < 16; i++) q[i] = (ckv_move){.src = d0, .src_slot = i, .dst = s0, .dst_slot = i};
  cr_assert_eq(ckv_kernels_move(g, q, 16, CKV_MOVE_SET_VALID), CKV_OK);
  void *dd0 = to_dev(d0, db), *dd1 = to_dev(d1, db), *ds0 = to_dev(s0, sb), *ds1 = to_dev(s1, sb);
  ckv_move m[5], dm[5];
  for (uint32_t i = 0; i < 5; i++) {
    m[i] = (ckv_move){.src = d0, .src_slot = 3 * i, .dst = d1, .dst_slot = i};
    dm[i] = (ckv_move){.src = dd0, .src_slot = 3 * i, .dst = dd1, .dst_slot = i};
  }
  cr_assert_eq(ckv_copy_slots(g, m, 5), CKV_OK);
  cr_assert_eq(ckv_cuda_copy_slots(g, dm, 5, NULL), CKV_OK);
  for (uint32_t i = 0; i < 5; i++) {
    m[i] = (ckv_move){.src = s0, .src_slot = 15 - i, .dst = s1, .dst_slot = 40 + i};
    dm[i] = (ckv_move){.src = ds0, .src_slot = 15 - i, .dst = ds1, .dst_slot = 40 + i};
  }
  cr_assert_eq(ckv_copy_slots(g, m, 5), CKV_OK);
  cr_assert_eq(ckv_cuda_copy_slots(g, dm, 5, NULL), CKV_OK);
  uint8_t *back = malloc(sb > db ? sb : db);
  cudaMemcpy(back, dd1, db, cudaMemcpyDeviceToHost);
  cr_expect_eq(memcmp(back, d1, db), 0, "draft copies differ from the CPU's");
  cudaMemcpy(back, ds1, sb, cudaMemcpyDeviceToHost);
  cr_expect_eq(memcmp(back, s1, sb), 0, "staged copies differ from the CPU's");
  /* formats must match; committed blocks are never copied */
  dm[0] = (ckv_move){.src = dd0, .src_slot = 0, .dst = ds1, .dst_slot = 0};
  cr_expect_eq(ckv_cuda_copy_slots(g, dm, 1, NULL), CKV_ERR_FORMAT);
  cudaFree(dd0), cudaFree(dd1), cudaFree(ds0), cudaFree(ds1);
  free(back), free(d0), free(d1), free(s0), free(s1);
}

/* Header patches: bytes land where asked, the tail is zeroed, the rest of
 * the buffer is untouched. */
Test(cuda, patch_apply) {
  need_gpu();
  enum { N = 1 << 16 };
  uint8_t *host = malloc(N), *back = malloc(N), a[200], b[24];
  for (size_t i = 0; i < N; i++) host[i] = (uint8_t)(i * 7 + 1);
  for (size_t i = 0; i < sizeof a; i++) a[i] = (uint8_t)(0xA0 + i);
  for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(0x10 + i);
  uint8_t *dev = to_dev(host, N);
  ckv_cuda_patch p[] = {{dev + 4096, a, sizeof a, 4000}, {dev + 64, b, sizeof b, 0}, {dev + 30001, b, 13, 7}};
  cr_assert_eq(ckv_cuda_patch_apply(p, 3, NULL), CKV_OK);
  memcpy(host + 4096, a, sizeof a), memset(host + 4096 + sizeof a, 0, 4000);
  memcpy(host + 64, b, sizeof b);
  memcpy(host + 30001, b, 13), memset(host + 30014, 0, 7);
  cudaMemcpy(back, dev, N, cudaMemcpyDeviceToHost);
  cr_expect_eq(memcmp(back, host, N), 0, "patched buffer differs");
  ckv_cuda_patch bad = {dev, NULL, 8, 0};
  cr_expect_eq(ckv_cuda_patch_apply(&bad, 1, NULL), CKV_ERR_INVALID);
  cudaFree(dev), free(host), free(back);
}

#else
Test(cuda, transitions_same_bytes) { cr_skip_test("no CUDA device: built without the CUDA kernels (nvcc not found)"); }
Test(cuda, rotated_formats_same_bytes) { cr_skip_test("no CUDA device: built without the CUDA kernels (nvcc not found)"); }
#endif

Test(cuda, unavailable_is_reported) {
#ifdef CKV_HAVE_CUDA_KERNELS
  ckv_status st = ckv_cuda_available();
  printf("cuda: %s\n", st == CKV_OK ? "device available" : ckv_cuda_unavailable_reason());
  if (st != CKV_OK) {
    /* every entry point refuses cleanly instead of crashing */
    const ckv_geometry g = {1, 1, 32, 0};
    cr_expect_eq(ckv_cuda_move(&g, NULL, 0, 0, NULL), CKV_ERR_DEVICE);
    cr_skip_test("no CUDA device: %s", ckv_cuda_unavailable_reason());
  }
#else
  cr_skip_test("no CUDA device: built without the CUDA kernels");
#endif
}
