/* dequant.c - reading blocks back as FP32: the row reader the converters use
 * for draft and staged sources, and ckv_kernels_dequantize for every format
 * (rotated formats come back in the model's basis, un-rotated)
 * (tests, the attention oracle, fidelity measurements). */
#include <string.h>

#include "kernels/access.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

void ckv_read_row(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, const ckv_block_header *h,
                  uint32_t layer, uint32_t kv, uint32_t slot, float *dst) {
  size_t te = ckv_draft_token_elems(g);
  if (h->format == CKV_FORMAT_DRAFT) {
    const uint16_t *src = (const uint16_t *)ckv_cb(blk, ckv_draft_kv_offset(g, h->capacity, layer, kv, slot));
    if (g->dtype == CKV_DTYPE_BF16)
      ops->cvt_bf16(src, dst, te);
    else
      ops->cvt_f16(src, dst, te);
    return;
  }
  /* staged */
  const int8_t *codes = (const int8_t *)ckv_cb(blk, ckv_staged_codes_offset(g, h->capacity, layer, kv)) + slot * te;
  uint32_t ng = ckv_staged_groups(g), gl = ckv_staged_group_heads(g) * g->head_dim;
  const uint16_t *sc = (const uint16_t *)ckv_cb(blk, ckv_staged_scales_offset(g, h->capacity, layer, kv)) +
                       (size_t)slot * ng;
  float s[CKV_MAX_KV_HEADS];
  ops->cvt_f16(sc, s, ng); /* every scale of the row widened at once (exact on every path) */
  for (uint32_t q = 0; q < ng; q++) {
    size_t lo = (size_t)q * gl, n = lo + gl <= te ? gl : te - lo;
    ops->cvt_i8(codes + lo, s[q], dst + lo, n);
  }
}

ckv_status ckv_kernels_dequantize(const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t kv,
                                  uint32_t slot, float *ret) {
  if (!ret || kv > 1) return CKV_ERR_INVALID;
  ckv_status st = ckv_block_check(blk, g);
  if (st != CKV_OK) return st;
  const ckv_block_header *h = ckv_hdr(blk);
  if (layer >= g->n_layers || slot >= h->capacity) return CKV_ERR_RANGE;
  const ckv_rowops *ops = ckv_rowops_get();
  if (ckv_format_is_rot(h->format)) { /* dequantize rotated, then rotate back head by head */
    ckv_cpu_path p = ckv_kernels_path();
    if (p == CKV_PATH_AVX512 && g->head_dim % 16u == 0) { /* the same floats, in registers */
      ckv_rot_dequant_row_avx512(g, blk, h, layer, kv, slot, ret);
      return CKV_OK;
    }
    if ((p == CKV_PATH_AVX2 || p == CKV_PATH_AVX512) && g->head_dim % 8u == 0) {
      ckv_rot_dequant_row_avx2(g, blk, h, layer, kv, slot, ret);
      return CKV_OK;
    }
    for (uint32_t hd = 0; hd < g->n_kv_heads; hd++) {
      float *x = ret + (size_t)hd * g->head_dim;
      ckv_rot_read_rotated(ops, g, blk, h, layer, kv, slot, hd, x);
      ckv_rot_inverse(x, g->head_dim, layer, kv, hd);
    }
    return CKV_OK;
  }
  if (!ckv_format_is_commit(h->format)) {
    ckv_read_row(ops, g, blk, h, layer, kv, slot, ret);
    return CKV_OK;
  }
  uint32_t chunk = slot / CKV_COMMIT_CHUNK_TOKENS, fmt = h->format, bits = ckv_format_code_bits(fmt);
  if (!((ckv_block_sealed_chunks(blk) >> chunk) & 1u)) return CKV_ERR_STATE;
  uint32_t cap = h->capacity, kept = h->kept_channels, D = g->head_dim;
  if (kv == 0) {
    uint32_t idx[CKV_MAX_HEAD_DIM];
    float v[CKV_MAX_HEAD_DIM], sf[CKV_MAX_HEAD_DIM], zf[CKV_MAX_HEAD_DIM];
    if (kept < D) memset(ret, 0, ckv_draft_token_elems(g) * sizeof(float));
    /* the offsets of (layer, head 0), then a head's bytes apart (ckv_commit_mask_offset and
     * ckv_commit_key_chunk_offset, computed once per call instead of per head) */
    uint32_t mw = ckv_commit_mask_words(g);
    size_t head_bytes = ckv_commit_key_head_bytes(fmt, g, cap, kept), mask0 = ckv_commit_mask_offset(fmt, g, cap, kept, layer, 0);
    size_t chunk_at = (size_t)mw * 8u + (size_t)chunk * ckv_commit_key_chunk_bytes(fmt, kept);
    size_t row_at = (size_t)kept * 4u + (slot % CKV_COMMIT_CHUNK_TOKENS) * ckv_commit_key_row_bytes(fmt, kept);
    /* each head's row of this slot lies in its own chunk: ask for them all before the first is needed */
    for (uint32_t hd = 0; hd < g->n_kv_heads; hd++)
      __builtin_prefetch(ckv_cb(blk, mask0 + hd * head_bytes + chunk_at + row_at));
    for (uint32_t hd = 0; hd < g->n_kv_heads; hd++) {
      const uint64_t *mask = (const uint64_t *)ckv_cb(blk, mask0 + hd * head_bytes);
      /* every channel kept (the usual case): every bit of the mask set, and channel j is kept channel j;
       * otherwise the count of its bits must be kept, and the kept channels' indices */
      if (kept == D) {
        for (uint32_t w = 0; w < mw; w++) {
          uint64_t want = D - 64u * w >= 64u ? ~0ull : (1ull << (D - 64u * w)) - 1u;
          if ((mask[w] & want) != want) return CKV_ERR_CORRUPT;
        }
      } else {
        uint32_t set = 0;
        for (uint32_t w = 0; w < mw; w++)
          set += (uint32_t)__builtin_popcountll(D - 64u * w >= 64u ? mask[w] : mask[w] & ((1ull << (D - 64u * w)) - 1u));
        if (set != kept || ckv_mask_channels(mask, D, idx) != kept) return CKV_ERR_CORRUPT;
      }
      const uint8_t *c = ckv_cb(blk, mask0 + hd * head_bytes + chunk_at);
      const uint16_t *sc = (const uint16_t *)c, *zp = sc + kept;
      const uint8_t *row = c + row_at;
      /* ckv_mul_add(code, scale, zero): the product, then + 1 * zero (exact: one rounding, as the sum) */
      float *x = kept == D ? ret + (size_t)hd * D : v;
      if (ops->dequant_u_cols && (bits == 4 || bits == 2) && kept % 32u == 0) { /* one pass */
        ops->dequant_u_cols(row, bits, sc, zp, x, kept);
        if (kept < D)
          for (uint32_t j = 0; j < kept; j++) ret[(size_t)hd * D + idx[j]] = v[j];
        continue;
      }
      ops->cvt_codes(row, bits, x, kept);
      ops->cvt_f16(sc, sf, kept);
      ops->cvt_f16(zp, zf, kept);
      ops->mul(x, sf, x, kept);
      ops->axpy(1.0f, zf, x, kept);
      if (kept < D)
        for (uint32_t j = 0; j < kept; j++) ret[(size_t)hd * D + idx[j]] = v[j];
    }
    return CKV_OK;
  }
  size_t te = ckv_draft_token_elems(g);
  uint32_t ng = ckv_commit_value_groups(g);
  const uint16_t *par = (const uint16_t *)ckv_cb(blk, ckv_commit_value_params_offset(fmt, g, cap, kept, layer)) +
                        (size_t)slot * ng * 2u;
  const uint8_t *row = ckv_cb(blk, ckv_commit_value_codes_offset(fmt, g, cap, kept, layer)) +
                       (size_t)slot * ckv_commit_value_row_bytes(fmt, g);
  if (ops->dequant_u32_groups && (bits == 4 || bits == 2) && te % CKV_COMMIT_VALUE_GROUP == 0 &&
      CKV_COMMIT_VALUE_GROUP == 32) { /* one pass */
    ops->dequant_u32_groups(row, bits, par, ret, te);
    return CKV_OK;
  }
  ops->cvt_codes(row, bits, ret, te);
  for (uint32_t q = 0; q < ng; q++) {
    size_t lo = (size_t)q * CKV_COMMIT_VALUE_GROUP, n = lo + CKV_COMMIT_VALUE_GROUP <= te ? CKV_COMMIT_VALUE_GROUP : te - lo;
    ops->affine(ret + lo, ckv_f16_to_f32(par[2u * q]), ckv_f16_to_f32(par[2u * q + 1u]), n);
  }
  return CKV_OK;
}
