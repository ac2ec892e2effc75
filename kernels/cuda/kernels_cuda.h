/* kernels_cuda.h - the kernels API on an NVIDIA GPU (static library
 * ckv_kernels_cuda, linked only to the static CUDA runtime, never to libcuda,
 * so a binary starts on machines without the driver).
 *
 * Same operations and the same bytes as kernels/kernels.h (quantization
 * follows kernels/quant.h, shared with the CPU code: DESIGN.md §4 inv. 7), on
 * blocks in device memory.  Block pointers and q/out/mass are device
 * pointers; the move and block-pointer lists themselves are host arrays.
 * Calls run on the given stream (NULL: the legacy default stream; any
 * stream, non-blocking ones included: every copy they depend on is ordered on
 * it).  Moves, copies, patches and attention read block headers back first
 * and return with the stream synchronised; dequantize returns once its work
 * is queued.  Scratch is stream-ordered (cudaMallocAsync), so no call
 * synchronises the device behind the caller's other streams.  A failed call
 * clears the runtime's last error.  Every function returns CKV_ERR_DEVICE
 * when no usable GPU exists (see ckv_cuda_available). */
#ifndef CKV_KERNELS_CUDA_H
#define CKV_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "commitkv/status.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CKV_OK when at least one CUDA device is usable; CKV_ERR_DEVICE otherwise
 * (no driver, no device, ...).  Never aborts; cheap after the first call. */
ckv_status ckv_cuda_available(void);
/* Why the last ckv_cuda_available() failed (static text, never NULL). */
const char *ckv_cuda_unavailable_reason(void);

/* ckv_kernels_move on device blocks: moves[] is a host array of device block
 * pointers.  Same formats, chunk rules, pruning and flags as the CPU call;
 * bytes written are identical.  Synchronises the stream before returning. */
ckv_status ckv_cuda_move(const ckv_geometry *g, const ckv_move *moves, size_t n_moves, unsigned flags, void *stream);

/* ckv_kernels_dequantize on a device block into ret (device, n_kv_heads *
 * head_dim floats). */
ckv_status ckv_cuda_dequantize(const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t kv, uint32_t slot,
                               float *ret, void *stream);

/* ckv_kernels_attention on device data: a->blocks is a host array of device
 * block pointers; a->q, a->out and a->mass (optional) are device pointers;
 * a->workspace is ignored (scratch is allocated per call).  Results agree
 * with the CPU within FP32 rounding (summation order differs). */
ckv_status ckv_cuda_attention(const ckv_attn_args *a, void *stream);

/* A write of host bytes into device memory: `bytes` bytes from src to dst,
 * then `zero_bytes` zero bytes right after them. */
typedef struct ckv_cuda_patch {
  void *dst;           /* device address */
  const void *src;     /* host bytes (read during the call); NULL when bytes is 0 */
  uint64_t bytes;
  uint64_t zero_bytes;
} ckv_cuda_patch;

/* Applies n patches with one upload and one launch on `stream`, and returns
 * once they are complete (the stream is synchronised).  Patches must cover
 * disjoint ranges: they are applied in no particular order.  How the daemon
 * writes block headers it keeps in host shadows. */
ckv_status ckv_cuda_patch_apply(const ckv_cuda_patch *patches, size_t n, void *stream);

/* daemon/compact.h ckv_copy_slots on device blocks: byte-exact copies of
 * draft or staged slots between blocks of the same format (K/V rows, staged
 * scales, positions; valid bits untouched).  Synchronises the stream.
 * CKV_ERR_FORMAT (formats differ), CKV_ERR_UNSUPPORTED (committed),
 * CKV_ERR_INVALID (slot out of range). */
ckv_status ckv_cuda_copy_slots(const ckv_geometry *g, const ckv_move *moves, size_t n_moves, void *stream);

#ifdef __cplusplus
}
#endif
#endif
