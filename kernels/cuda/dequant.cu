/* dequant.cu - one slot's K or V of one layer back to FP32 on the GPU, any
 * format (a thread per element), for tests and fidelity runs.  Same values as
 * ckv_kernels_dequantize: code * scale + zero with two roundings. */
#include "kernels/cuda/cuda_internal.h"

namespace {

__global__ void k_dequant(ckv_geometry g, const uint8_t *blk, ckv_block_header h, uint32_t l, uint32_t kv, uint32_t slot,
                          float *out) {
  size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, te = ckv_draft_token_elems(&g);
  if (e >= te) return;
  if (!ckv_format_is_commit(h.format)) {
    out[e] = ckv_dev_read(g, blk, h.format, h.capacity, l, kv, slot, e);
    return;
  }
  uint32_t fmt = h.format, cap = h.capacity, kept = h.kept_channels, bits = ckv_format_code_bits(fmt);
  if (kv == 0) {
    uint32_t hd = (uint32_t)(e / g.head_dim), c = (uint32_t)(e % g.head_dim);
    const uint64_t *mask = (const uint64_t *)(blk + ckv_commit_mask_offset(fmt, &g, cap, kept, l, hd));
    if (!((mask[c / 64] >> (c % 64)) & 1u)) {
      out[e] = 0.0f;
      return;
    }
    uint32_t j = 0;
    for (uint32_t w = 0; w < c / 64; w++) j += __popcll(mask[w]);
    j += __popcll(mask[c / 64] & ((1ull << (c % 64)) - 1ull));
    const uint8_t *ch = blk + ckv_commit_key_chunk_offset(fmt, &g, cap, kept, l, hd, slot / CKV_COMMIT_CHUNK_TOKENS);
    const uint16_t *sc = (const uint16_t *)ch, *zp = sc + kept;
    const uint8_t *row = ch + (size_t)kept * 4u + (slot % CKV_COMMIT_CHUNK_TOKENS) * ckv_commit_key_row_bytes(fmt, kept);
    out[e] = ckv_mul_add((float)ckv_unpack_code(row, j, bits), ckv_f16_to_f32(sc[j]), ckv_f16_to_f32(zp[j]));
    return;
  }
  uint32_t ng = ckv_commit_value_groups(&g), q = (uint32_t)(e / CKV_COMMIT_VALUE_GROUP);
  const uint16_t *par = (const uint16_t *)(blk + ckv_commit_value_params_offset(fmt, &g, cap, kept, l)) + (size_t)slot * ng * 2u;
  const uint8_t *row = blk + ckv_commit_value_codes_offset(fmt, &g, cap, kept, l) + (size_t)slot * ckv_commit_value_row_bytes(fmt, &g);
  out[e] = ckv_mul_add((float)ckv_unpack_code(row, e, bits), ckv_f16_to_f32(par[2u * q]), ckv_f16_to_f32(par[2u * q + 1u]));
}

/* Rotated formats: a thread per head (the inverse rotation needs the whole head). */
__global__ void k_dequant_rot(ckv_geometry g, const uint8_t *blk, ckv_block_header h, uint32_t l, uint32_t kv,
                              uint32_t slot, float *out) {
  uint32_t hd = threadIdx.x, D = g.head_dim, bits = ckv_format_code_bits(h.format);
  if (hd >= g.n_kv_heads) return;
  size_t k = (size_t)slot * g.n_kv_heads + hd;
  const uint8_t *row = blk + ckv_rot_codes_offset(h.format, &g, h.capacity, l, kv) + k * ckv_rot_row_bytes(h.format, &g);
  float sc = ckv_rot_scale_value((blk + ckv_rot_scales_offset(h.format, &g, h.capacity, l, kv))[k]);
  float x[CKV_MAX_HEAD_DIM];
  const uint16_t *mean = (const uint16_t *)(blk + ckv_rot_mean_offset(&g, h.capacity, l, hd));
  for (uint32_t i = 0; i < D; i++) {
    x[i] = ckv_rot_value(ckv_unpack_code(row, i, bits), sc, bits);
    if (kv == 0) x[i] = x[i] + ckv_rot_finite(ckv_f16_to_f32(mean[i]));
  }
  ckv_rot_inverse(x, D, l, kv, hd);
  for (uint32_t i = 0; i < D; i++) out[(size_t)hd * D + i] = x[i];
}

} // namespace

extern "C" ckv_status ckv_cuda_dequantize(const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t kv,
                                          uint32_t slot, float *ret, void *stream) {
  if (ckv_cuda_available() != CKV_OK) return CKV_ERR_DEVICE;
  if (!g || !ret || kv > 1 || !ckv_format_valid(CKV_FORMAT_DRAFT, g, 1, 0)) return CKV_ERR_INVALID;
  ckv_block_header h;
  ckv_status st = ckv_cuda_fetch_header(blk, &h);
  if (st != CKV_OK) return st;
  if (h.magic != CKV_BLOCK_MAGIC) return CKV_ERR_CORRUPT;
  if (h.dtype != g->dtype || !ckv_format_valid(h.format, g, h.capacity, h.kept_channels)) return CKV_ERR_FORMAT;
  if (layer >= g->n_layers || slot >= h.capacity) return CKV_ERR_RANGE;
  if (ckv_format_is_commit(h.format)) {
    uint32_t sealed;
    CKV_CUDA_TRY(cudaMemcpy(&sealed, (const uint8_t *)blk + ckv_commit_meta_offset(h.capacity), 4, cudaMemcpyDeviceToHost));
    if (!((sealed >> (slot / CKV_COMMIT_CHUNK_TOKENS)) & 1u)) return CKV_ERR_STATE;
  }
  size_t te = ckv_draft_token_elems(g);
  if (ckv_format_is_rot(h.format)) {
    k_dequant_rot<<<1, ((g->n_kv_heads + 31u) / 32u) * 32u, 0, (cudaStream_t)stream>>>(*g, (const uint8_t *)blk, h, layer,
                                                                                       kv, slot, ret);
    CKV_CUDA_TRY(cudaGetLastError());
    return CKV_OK;
  }
  k_dequant<<<(unsigned)((te + 255) / 256), 256, 0, (cudaStream_t)stream>>>(*g, (const uint8_t *)blk, h, layer, kv, slot, ret);
  CKV_CUDA_TRY(cudaGetLastError());
  return CKV_OK;
}
