/* rot.h - private: the CPU side of the rotated committed formats (rot.c). */
#ifndef CKV_ROT_H
#define CKV_ROT_H

#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/rowops.h"

/* Index of the first sign of (layer, kv, head) in a table of ckv_rot_signs_new. */
static inline size_t ckv_rot_signs_index(const ckv_geometry *g, uint32_t layer, uint32_t kv, uint32_t head) {
  return (((size_t)layer * 2u + kv) * g->n_kv_heads + head) * g->head_dim;
}
/* Every sign of the geometry, [layer][kv][head][dim] (malloc'ed; NULL when out of memory). */
float *ckv_rot_signs_new(const ckv_geometry *g);
/* ckv_rot_sign(layer, kv, head, i) for i < n into dst[n], key0 = ((layer * 2 + kv) * CKV_MAX_KV_HEADS + head) *
 * CKV_MAX_HEAD_DIM (rot_avx512.c): n a multiple of 16, the AVX-512 path only. */
void ckv_rot_signs_avx512(uint32_t key0, uint32_t n, float *dst);
/* mean[i] = ckv_rot_mean_f16(sum[i], n) and ret_widened[i] = ckv_rot_finite(ckv_f16_to_f32(mean[i])) for
 * i < count (rot_avx512.c): count a multiple of 16, the AVX-512 path only. */
void ckv_rot_means_avx512(const float *sum, uint32_t n, uint32_t count, uint16_t *mean, float *ret_widened);
/* The AVX2 versions of ckv_rot_forward_with and ckv_rot_quant_head (rot_avx2.c):
 * the same bytes; n a multiple of 8; only on CPUs with AVX2, FMA and F16C. */
void ckv_rot_forward_avx2(float *x, uint32_t n, const float *signs);
void ckv_rot_quant_head_avx2(const float *y, uint32_t n, uint32_t bits, uint8_t *ret_scale, uint8_t *row);
/* Its parts, shared with rot_avx512.c: the sum of squares (in the rules' 16 lanes) and absmax of a head, and the
 * packed codes of a head for inverse scale inv (every byte of the row written). */
void ckv_rot_stats_avx2(const float *y, uint32_t n, float *ret_ss, float *ret_am);
void ckv_rot_pack_avx2(const float *y, uint32_t n, uint32_t bits, float inv, uint8_t *row);
/* ckv_rot_quant_head of the nh heads of a row, y[nh][n], into ret_scales[nh] and rows[nh][n*bits/8] (rot_avx512.c):
 * n a multiple of 16, nh <= CKV_MAX_KV_HEADS, only on CPUs of the AVX-512 path. */
void ckv_rot_quant_heads_avx512(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales,
                                uint8_t *rows);
/* The fused steps of the AVX-512 path (rot_avx512.c), the bytes of ckv_rot_forward_with then
 * ckv_rot_quant_heads: each FP16 head of h[nh][n] rotated with its signs (signs[nh][n]) and quantized in
 * registers; and each head of y[nh][n] less mean[nh][n] (one rounding, as an axpy of -1) quantized.  n 16, 32, 64
 * or 128. */
void ckv_rot_quant_f16_heads_avx512(const uint16_t *h, const float *signs, uint32_t nh, uint32_t n, uint32_t bits,
                                    uint8_t *ret_scales, uint8_t *rows);
/* The keys of a token for a fresh block's means (rot_avx512.c): each FP16 head of h[nh][n] rotated as if it were
 * finite into y[nh][n] and added to sum[nh][n] (one rounding each, as an axpy of 1); a NaN or Inf in h makes
 * its head's sums non-finite, which the caller checks (then rotates those keys again with ckv_rot_finite).
 * n 16, 32, 64 or 128. */
void ckv_rot_forward_f16_sum_avx512(const uint16_t *h, const float *signs, uint32_t nh, uint32_t n, float *y,
                                    float *sum);
void ckv_rot_quant_less_heads_avx512(const float *y, const float *mean, uint32_t nh, uint32_t n, uint32_t bits,
                                     uint8_t *ret_scales, uint8_t *rows);
/* The same with ckv_rot_quant_head_avx2 per head, and with the scalar rule (rot.c). */
void ckv_rot_quant_heads_avx2(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales, uint8_t *rows);
void ckv_rot_quant_heads(const float *y, uint32_t nh, uint32_t n, uint32_t bits, uint8_t *ret_scales, uint8_t *rows);
/* ckv_kernels_dequantize of a rotated block's row (un-rotated, every head) with AVX2 (rot_avx2.c); head_dim a
 * multiple of 8, the block and slot checked by the caller. */
void ckv_rot_dequant_row_avx2(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer,
                              uint32_t kv, uint32_t slot, float *dst);
/* ckv_rot_forward_avx512 of FP16 input h[n] (a draft row's head, widened exactly) into x[n]: n 16, 32, 64 or
 * 128, the AVX-512 path only (one pass instead of widening the row first). */
void ckv_rot_forward_f16_avx512(const uint16_t *h, float *x, uint32_t n, const float *signs);
/* The same 16 lanes at a time (rot_avx512.c): head_dim a multiple of 16, the AVX-512 path only; and the
 * forward rotation likewise. */
void ckv_rot_forward_avx512(float *x, uint32_t n, const float *signs);
void ckv_rot_dequant_row_avx512(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer,
                                uint32_t kv, uint32_t slot, float *dst);
/* ckv_rot_forward / ckv_rot_inverse of quant.h with the head's signs from the table. */
void ckv_rot_forward_with(float *x, uint32_t n, const float *signs);
void ckv_rot_inverse_with(float *x, uint32_t n, const float *signs);
/* The rotated key mean of (layer, head) of a rotated block, widened (finite), into dst[head_dim]. */
void ckv_rot_key_mean(const ckv_geometry *g, const void *blk, const ckv_block_header *h, uint32_t layer, uint32_t head,
                      float *dst);
/* One head of one slot of a rotated block, dequantized but still rotated (keys with their mean), into dst[head_dim]. */
void ckv_rot_read_rotated(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, const ckv_block_header *h,
                          uint32_t layer, uint32_t kv, uint32_t slot, uint32_t head, float *dst);
/* Fills the rotated destinations of moves order[0..n) (draft, staged or rotated
 * sources; checked by the caller; sorted by destination); a block whose key
 * means are not set yet gets them from these moves' tokens bound for it.
 * row: scratch of n_kv_heads*head_dim floats.  Returns 0 or -ENOMEM. */
int ckv_rot_to(const ckv_rowops *ops, const ckv_geometry *g, const float *signs, const ckv_move *moves,
                const size_t *order, size_t n, float *row);

#endif
