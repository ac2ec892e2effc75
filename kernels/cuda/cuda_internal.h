/* cuda_internal.h - private helpers of the CUDA kernels: error mapping, the
 * block-header mirror the host builds before launching, and reading one
 * element of a draft or staged row on the device. */
#ifndef CKV_CUDA_INTERNAL_H
#define CKV_CUDA_INTERNAL_H

#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant.h"

/* On failure the runtime's last-error slot is cleared, so the next call
 * (ours or the application's) does not report this failure as its own. */
#define CKV_CUDA_TRY(call)          \
  do {                              \
    if ((call) != cudaSuccess) {    \
      (void)cudaGetLastError();     \
      return CKV_ERR_DEVICE;        \
    }                               \
  } while (0)

/* Copies the header of a device block to the host (synchronous). */
ckv_status ckv_cuda_fetch_header(const void *blk, ckv_block_header *ret);

/* Element e of the K/V row (layer, kv, slot) of a draft or staged block, as FP32. */
__device__ static inline float ckv_dev_read(const ckv_geometry g, const uint8_t *blk, uint32_t fmt, uint32_t cap,
                                            uint32_t layer, uint32_t kv, uint32_t slot, size_t e) {
  if (fmt == CKV_FORMAT_DRAFT) {
    uint16_t h = ((const uint16_t *)(blk + ckv_draft_kv_offset(&g, cap, layer, kv, slot)))[e];
    return g.dtype == CKV_DTYPE_BF16 ? ckv_bf16_to_f32(h) : ckv_f16_to_f32(h);
  }
  size_t te = ckv_draft_token_elems(&g), gl = (size_t)ckv_staged_group_heads(&g) * g.head_dim;
  int8_t c = ((const int8_t *)(blk + ckv_staged_codes_offset(&g, cap, layer, kv)))[slot * te + e];
  uint16_t s = ((const uint16_t *)(blk + ckv_staged_scales_offset(&g, cap, layer, kv)))[(size_t)slot * ckv_staged_groups(&g) + e / gl];
  return __fmul_rn((float)c, ckv_f16_to_f32(s));
}

#endif
