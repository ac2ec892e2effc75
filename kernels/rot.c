/* rot.c - the rotated committed formats (formats v2, kernels/format.h
 * "rotated") on the CPU: filling them from draft, staged or other rotated
 * blocks, and reading a head back (rotated, or un-rotated to the model's
 * basis).  The rules are kernels/quant.h's (ckv_rot_*), applied here with the
 * per-(layer, kv, head) signs looked up once per call instead of hashed per
 * element: the products are exact either way, so the bytes are those of the
 * CUDA kernels, which call the rules as they are. */
#include <stdlib.h>
#include <string.h>

#include "kernels/access.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/rot.h"

float *ckv_rot_signs_new(const ckv_geometry *g) {
  size_t D = g->head_dim, H = g->n_kv_heads;
  float *s = malloc((size_t)g->n_layers * 2u * H * D * sizeof(float));
  if (!s) return NULL;
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t h = 0; h < H; h++)
        for (uint32_t i = 0; i < D; i++) s[ckv_rot_signs_index(g, l, kv, h) + i] = ckv_rot_sign(l, kv, h, i);
  return s;
}

void ckv_rot_forward_with(float *x, uint32_t n, const float *signs) {
  for (uint32_t i = 0; i < n; i++) x[i] = ckv_rot_finite(x[i]) * signs[i];
  ckv_fwht(x, n);
  float r = ckv_rot_norm(n);
  for (uint32_t i = 0; i < n; i++) x[i] = x[i] * r;
}

void ckv_rot_inverse_with(float *x, uint32_t n, const float *signs) {
  ckv_fwht(x, n);
  float r = ckv_rot_norm(n);
  for (uint32_t i = 0; i < n; i++) x[i] = x[i] * r * signs[i];
}

void ckv_rot_read_rotated(const ckv_rowops *ops, const ckv_geometry *g, const void *blk, const ckv_block_header *h,
                          uint32_t layer, uint32_t kv, uint32_t slot, uint32_t head, float *dst) {
  uint32_t fmt = h->format, bits = ckv_format_code_bits(fmt), D = g->head_dim, H = g->n_kv_heads;
  size_t rb = ckv_rot_row_bytes(fmt, g);
  const uint16_t *sc = (const uint16_t *)ckv_cb(blk, ckv_rot_scales_offset(fmt, g, h->capacity, layer, kv));
  const uint8_t *row = ckv_cb(blk, ckv_rot_codes_offset(fmt, g, h->capacity, layer, kv)) +
                       ((size_t)slot * H + head) * rb;
  float s = ckv_f16_to_f32(sc[(size_t)slot * H + head]);
  ops->cvt_codes(row, bits, dst, D);
  /* value = (code - offset) * scale: one subtraction (exact) and one product */
  float off = ckv_rot_offset(bits);
  for (uint32_t i = 0; i < D; i++) dst[i] = (dst[i] - off) * s;
}

void ckv_rot_to(const ckv_rowops *ops, const ckv_geometry *g, const float *signs, const ckv_move *moves,
                const size_t *order, size_t n, float *row) {
  uint32_t D = g->head_dim, H = g->n_kv_heads;
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t i = 0; i < n; i++) {
        const ckv_move *m = &moves[order[i]];
        const ckv_block_header *sh = ckv_move_src_hdr(m), *dh = ckv_move_dst_hdr(m);
        uint32_t fmt = dh->format, bits = ckv_format_code_bits(fmt), cap = dh->capacity;
        if (ckv_format_is_rot(sh->format)) { /* already rotated: re-quantize in place of the rotation */
          for (uint32_t hd = 0; hd < H; hd++)
            ckv_rot_read_rotated(ops, g, m->src, sh, l, kv, m->src_slot, hd, row + (size_t)hd * D);
        } else {
          ckv_read_row(ops, g, m->src, sh, l, kv, m->src_slot, row);
          for (uint32_t hd = 0; hd < H; hd++)
            ckv_rot_forward_with(row + (size_t)hd * D, D, signs + ckv_rot_signs_index(g, l, kv, hd));
        }
        uint16_t *sc = (uint16_t *)ckv_b(m->dst, ckv_rot_scales_offset(fmt, g, cap, l, kv));
        uint8_t *codes = ckv_b(m->dst, ckv_rot_codes_offset(fmt, g, cap, l, kv));
        size_t rb = ckv_rot_row_bytes(fmt, g);
        for (uint32_t hd = 0; hd < H; hd++) {
          size_t k = (size_t)m->dst_slot * H + hd;
          ckv_rot_quant_head(row + (size_t)hd * D, D, bits, &sc[k], codes + k * rb);
        }
      }
}
