/* test_format.c - kernels/format.h and kernels/quant.h: the byte layout of
 * every format pinned with hand-computed numbers (a layout change breaks these
 * on purpose), the accounting functions, and the FP16 rounding rules that
 * make CPU and GPU bytes identical. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/format.h"
#include "kernels/quant.h"

static const ckv_geometry tiny = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .dtype = CKV_DTYPE_FP16};
static const ckv_geometry llama8b = {.n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .dtype = CKV_DTYPE_FP16};

Test(format, header_parts) {
  cr_expect_eq(sizeof(ckv_block_header), 24);
  cr_expect_eq(ckv_block_positions_offset(), 24);
  cr_expect_eq(ckv_block_bitmap_offset(64), 24 + 256);
  cr_expect_eq(ckv_block_bitmap_words(64), 1);
  cr_expect_eq(ckv_block_bitmap_words(65), 2);
  cr_expect_eq(ckv_block_payload_offset(64), 320);
  cr_expect_eq(ckv_block_payload_offset(16), 128);
}

Test(format, draft_layout) {
  /* 16 slots x 32 halves = 64 bytes a token; K and V of one layer */
  cr_expect_eq(ckv_draft_kv_offset(&tiny, 16, 0, 0, 1), 128 + 64);
  cr_expect_eq(ckv_draft_kv_offset(&tiny, 16, 0, 1, 0), 128 + 16 * 64);
  cr_expect_eq(ckv_format_block_bytes(CKV_FORMAT_DRAFT, &tiny, 16, 0), 2176);
}

Test(format, staged_layout) {
  cr_expect_eq(ckv_staged_group_heads(&tiny), 1);
  cr_expect_eq(ckv_staged_groups(&tiny), 1);
  cr_expect_eq(ckv_staged_codes_offset(&tiny, 64, 0, 0), 320);
  cr_expect_eq(ckv_staged_scales_offset(&tiny, 64, 0, 0), 320 + 2048);
  cr_expect_eq(ckv_staged_codes_offset(&tiny, 64, 0, 1), 320 + 2048 + 128);
  cr_expect_eq(ckv_format_block_bytes(CKV_FORMAT_STAGED, &tiny, 64, 0), 4672);
  /* head_dim 8: a scale group spans 4 heads (32 elements) */
  ckv_geometry small = {.n_layers = 1, .n_kv_heads = 6, .head_dim = 8};
  cr_expect_eq(ckv_staged_group_heads(&small), 4);
  cr_expect_eq(ckv_staged_groups(&small), 2);
}

Test(format, commit_layout) {
  const uint32_t f = CKV_FORMAT_COMMIT4;
  cr_expect_eq(ckv_commit_meta_offset(64), 320);
  cr_expect_eq(ckv_commit_mask_offset(f, &tiny, 64, 32, 0, 0), 336);
  cr_expect_eq(ckv_commit_key_chunk_bytes(f, 32), 640);
  cr_expect_eq(ckv_commit_key_chunk_offset(f, &tiny, 64, 32, 0, 0, 1), 336 + 8 + 640);
  cr_expect_eq(ckv_commit_value_params_offset(f, &tiny, 64, 32, 0), 336 + 1288);
  cr_expect_eq(ckv_commit_value_codes_offset(f, &tiny, 64, 32, 0), 336 + 1288 + 256);
  cr_expect_eq(ckv_commit_layer_bytes(f, &tiny, 64, 32), 2576);
  cr_expect_eq(ckv_format_block_bytes(f, &tiny, 64, 0), 2944);
  cr_expect_eq(ckv_commit_key_row_bytes(CKV_FORMAT_COMMIT2, 30), 8);
  /* committed capacities are whole chunks */
  cr_expect_eq(ckv_format_block_bytes(f, &tiny, 48, 0), 0);
  cr_expect_eq(ckv_format_block_bytes(f, &tiny, 64, 33), 0);
}

Test(format, accounting_realistic) {
  struct {
    uint32_t fmt, cap, kept;
    double lo, hi;
  } rows[] = {
      {CKV_FORMAT_DRAFT, 16, 0, 16.0, 16.01},    {CKV_FORMAT_STAGED, 64, 0, 8.12, 8.14},
      {CKV_FORMAT_COMMIT4, 64, 0, 5.0, 5.02},    {CKV_FORMAT_COMMIT2, 64, 0, 3.0, 3.02},
      {CKV_FORMAT_COMMIT4, 64, 64, 3.75, 3.77},  {CKV_FORMAT_COMMIT2, 64, 64, 2.25, 2.27},
      {CKV_FORMAT_COMMIT2, 128, 32, 1.87, 1.89},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    double b = ckv_format_bits_per_element(rows[i].fmt, &llama8b, rows[i].cap, rows[i].kept);
    printf("format %u cap %u kept %u: %.4f bits/element, %.1f bytes/token\n", rows[i].fmt, rows[i].cap, rows[i].kept,
           b, ckv_format_bytes_per_token(rows[i].fmt, &llama8b, rows[i].cap, rows[i].kept));
    cr_expect(b >= rows[i].lo && b <= rows[i].hi, "format %u kept %u: %f bits", rows[i].fmt, rows[i].kept, b);
  }
}

Test(format, validity) {
  cr_expect(ckv_format_valid(CKV_FORMAT_DRAFT, &tiny, 16, 0));
  cr_expect(!ckv_format_valid(CKV_FORMAT_DRAFT, &tiny, 0, 0));
  cr_expect(!ckv_format_valid(CKV_FORMAT_DRAFT, &tiny, CKV_MAX_BLOCK_TOKENS + 1, 0));
  cr_expect(!ckv_format_valid(CKV_FORMAT_COUNT_, &tiny, 16, 0));
  ckv_geometry bad = tiny;
  bad.head_dim = 0;
  cr_expect(!ckv_format_valid(CKV_FORMAT_DRAFT, &bad, 16, 0));
  bad = tiny;
  bad.dtype = 7;
  cr_expect(!ckv_format_valid(CKV_FORMAT_DRAFT, &bad, 16, 0));
}

Test(quant, fp16_rounding) {
  cr_expect_eq(ckv_f32_to_f16(1.0f), 0x3c00);
  cr_expect_eq(ckv_f32_to_f16(-2.0f), 0xc000);
  cr_expect_eq(ckv_f32_to_f16(65504.0f), 0x7bff);
  cr_expect_eq(ckv_f32_to_f16(65520.0f), 0x7c00);           /* ties to even: overflow */
  cr_expect_eq(ckv_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00); /* tie -> even */
  cr_expect_eq(ckv_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02); /* tie -> even (up) */
  cr_expect_eq(ckv_f32_to_f16(5.9604645e-8f), 0x0001);         /* smallest subnormal */
  cr_expect_eq(ckv_f32_to_f16(2.98023224e-8f), 0x0000);        /* 2^-25 ties to 0 */
  cr_expect_eq(ckv_f32_to_f16(0.1f), 0x2e66);
  cr_expect_eq(ckv_f16_round_up(0.1f), 0x2e67);
  cr_expect_eq(ckv_f16_round_down(-0.1f), 0xae67);
  cr_expect_eq(ckv_f16_round_down(-0.0f), 0x0000);
  cr_expect_eq(ckv_f16_round_up(1e9f), 0x7bff);
  /* every half round-trips */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN */
    cr_assert_eq(ckv_f32_to_f16(ckv_f16_to_f32((uint16_t)h)), h, "half %04x", h);
  }
}

Test(quant, codes) {
  cr_expect_eq(ckv_q8_code(63.5f, 1.0f), 64); /* half to even */
  cr_expect_eq(ckv_q8_code(2.5f, 1.0f), 2);
  cr_expect_eq(ckv_q8_code(-2.5f, 1.0f), -2);
  cr_expect_eq(ckv_q8_code(1000.0f, 1.0f), 127);
  cr_expect_eq(ckv_q8_code(NAN, 1.0f), -127);
  uint16_t s, z;
  ckv_qa_params(-8.0f, 22.0f, 4, &s, &z);
  cr_expect_eq(s, 0x4000);
  cr_expect_eq(z, 0xc800);
  cr_expect_eq(ckv_qa_code(7.0f, -8.0f, 0.5f, 4), 8);
  cr_expect_eq(ckv_qa_code(99.0f, -8.0f, 0.5f, 4), 15);
  cr_expect_eq(ckv_qa_code(-99.0f, -8.0f, 0.5f, 2), 0);
  ckv_qa_params(INFINITY, -INFINITY, 2, &s, &z); /* empty group */
  cr_expect_eq(s, 0);
  cr_expect_eq(z, 0);
}
