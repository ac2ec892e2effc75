/* format.h - the one truth about KV block bytes (DESIGN.md §5).
 *
 * Compiles as C11 and as CUDA.  Every process that touches a block (daemon,
 * worker, CPU or GPU kernel) computes offsets with these functions only.
 *
 * A block = header | positions[capacity] | valid bitmap | payload, each part
 * aligned to CKV_BLOCK_ALIGN.  The payload layout depends on the format:
 *   draft (FP16/BF16): [layer][K|V][slot][head][dim] elements of 2 bytes, so
 *   one token's K (or V) for one layer is n_kv_heads*head_dim contiguous
 *   elements, the unit a worker writes after computing a layer.
 *   staged (INT8): [layer][K|V] { codes int8 [slot][head*dim] | scales fp16
 *   [slot][group] }, symmetric, one scale per (token, head group).
 *   committed (INT4/INT2, KIVI-style): meta word, then per layer a K part
 *   (per head: channel mask, then per 32-token chunk: per-channel scale and
 *   zero, codes [token][kept channel]) and a V part (per token: scale and zero
 *   per 32-element group, codes [token][head*dim]).  Exact offsets below.
 * The quantization rules (rounding, how scales are chosen) are in
 * kernels/quant.h, shared by the CPU and CUDA code so both give the same bytes. */
#ifndef CKV_FORMAT_H
#define CKV_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CKV_HD __host__ __device__ static inline
#else
#define CKV_HD static inline
#endif
/* _Static_assert is C11; CUDA sources are C++. */
#ifdef __cplusplus
#define CKV_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define CKV_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define CKV_BLOCK_MAGIC 0x424b5643u /* "CVKB" little-endian */
#define CKV_BLOCK_ALIGN 64u

/* Geometry limits: every request is validated against these. */
#define CKV_MAX_LAYERS 256u
#define CKV_MAX_KV_HEADS 256u
#define CKV_MAX_HEAD_DIM 512u
#define CKV_MAX_BLOCK_TOKENS 1024u

typedef enum ckv_dtype {
  CKV_DTYPE_FP16 = 0,
  CKV_DTYPE_BF16 = 1,
} ckv_dtype;

/* Storage formats, one per lifecycle state (recycled has no storage). */
typedef enum ckv_format {
  CKV_FORMAT_DRAFT = 0,     /* FP16/BF16 as written */
  CKV_FORMAT_STAGED = 1,    /* INT8 symmetric */
  CKV_FORMAT_COMMIT4 = 2,   /* KIVI-style INT4 (+ optional key-channel pruning) */
  CKV_FORMAT_COMMIT2 = 3,   /* KIVI-style INT2 (+ optional key-channel pruning) */
  /* Formats v2, committed: per token and head, a randomized Walsh-Hadamard
   * rotation, then a one-byte scale and symmetric b-bit codes (see "rotated"
   * below).  head_dim must be a power of two, 8..CKV_MAX_HEAD_DIM. */
  CKV_FORMAT_ROT4 = 4,
  CKV_FORMAT_ROT3 = 5,
  CKV_FORMAT_ROT2 = 6,
  CKV_FORMAT_ROT1 = 7, /* sign + scale: the cheapest format for cold tokens the judge still keeps */
  CKV_FORMAT_COUNT_ = 8
} ckv_format;

/* A session's model geometry.  Also declared, identically, by the public
 * client header commitkv/commitkv.h; the guard lets both be included. */
#ifndef CKV_GEOMETRY_DEFINED
#define CKV_GEOMETRY_DEFINED
typedef struct ckv_geometry {
  uint32_t n_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t dtype; /* ckv_dtype */
} ckv_geometry;
#endif

/* Shared-memory header at offset 0 of every block.  The daemon writes it when
 * it allocates or fills a block; workers only read it. */
typedef struct ckv_block_header {
  uint32_t magic;     /* CKV_BLOCK_MAGIC: catches stale or foreign offsets */
  uint8_t format;     /* ckv_format of the payload */
  uint8_t dtype;      /* ckv_dtype of the session (draft element type) */
  uint16_t capacity;  /* token slots in this block */
  uint32_t n_valid;   /* number of set bits in the valid bitmap (advisory) */
  uint32_t kept_channels; /* committed: key channels kept per head (== head_dim if unpruned) */
  uint64_t generation; /* bumped each time the block is (re)allocated: detects reuse */
} ckv_block_header;
CKV_STATIC_ASSERT(sizeof(ckv_block_header) == 24, "ckv_block_header size is part of the format");
CKV_STATIC_ASSERT(offsetof(ckv_block_header, format) == 4 && offsetof(ckv_block_header, capacity) == 6 &&
                   offsetof(ckv_block_header, n_valid) == 8 && offsetof(ckv_block_header, kept_channels) == 12 &&
                   offsetof(ckv_block_header, generation) == 16,
               "ckv_block_header offsets are part of the format");

CKV_HD size_t ckv_align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Offsets of the header parts; the same for every format. */
CKV_HD size_t ckv_block_positions_offset(void) { return ckv_align_up(sizeof(ckv_block_header), 8); }
CKV_HD size_t ckv_block_bitmap_offset(uint32_t capacity) {
  return ckv_block_positions_offset() + ckv_align_up((size_t)capacity * sizeof(uint32_t), 8);
}
/* The valid bitmap is an array of uint64 words, bit (slot % 64) of word slot/64. */
CKV_HD size_t ckv_block_bitmap_words(uint32_t capacity) { return (capacity + 63u) / 64u; }
CKV_HD size_t ckv_block_payload_offset(uint32_t capacity) {
  return ckv_align_up(ckv_block_bitmap_offset(capacity) + ckv_block_bitmap_words(capacity) * 8u,
                      CKV_BLOCK_ALIGN);
}

/* Draft payload. */
CKV_HD size_t ckv_draft_token_elems(const ckv_geometry *g) {
  return (size_t)g->n_kv_heads * g->head_dim;
}
/* Byte offset, from the block start, of K (kv=0) or V (kv=1) of one slot of one layer. */
CKV_HD size_t ckv_draft_kv_offset(const ckv_geometry *g, uint32_t capacity, uint32_t layer, uint32_t kv,
                                  uint32_t slot) {
  size_t tok = ckv_draft_token_elems(g) * 2u;
  return ckv_block_payload_offset(capacity) + (((size_t)layer * 2u + kv) * capacity + slot) * tok;
}
CKV_HD size_t ckv_draft_block_bytes(const ckv_geometry *g, uint32_t capacity) {
  return ckv_align_up(ckv_draft_kv_offset(g, capacity, g->n_layers, 0, 0), CKV_BLOCK_ALIGN);
}

/* ------------------------------------------------------------------------ */
/* Capacities.  Draft blocks are small (cheap appends); committed blocks hold a
 * whole number of 32-token key chunks so per-channel key scales amortise. */
#define CKV_DEFAULT_CAPACITY_DRAFT 16u
#define CKV_DEFAULT_CAPACITY_STAGED 64u
#define CKV_DEFAULT_CAPACITY_COMMIT 64u

/* Staged: a scale group holds at least this many elements; with head_dim < 32
 * a group spans ceil(32 / head_dim) consecutive heads (the last may be short). */
#define CKV_STAGED_MIN_GROUP 32u
/* Committed keys: one (scale, zero) per kept channel per chunk of this many
 * consecutive slots.  A chunk is quantized in one call and then sealed. */
#define CKV_COMMIT_CHUNK_TOKENS 32u
/* Committed values: one (scale, zero) per this many consecutive elements of a
 * token's [head][dim] vector (groups span heads when head_dim < 32). */
#define CKV_COMMIT_VALUE_GROUP 32u
/* Alignment of the per-(layer, K|V) sections inside a payload. */
#define CKV_SECTION_ALIGN 16u

/* Bits per code of a format: 16 draft (FP16/BF16), 8, 4, 2; rotated 4, 3, 2, 1. */
CKV_HD uint32_t ckv_format_code_bits(uint32_t fmt) {
  switch (fmt) {
  case CKV_FORMAT_DRAFT: return 16u;
  case CKV_FORMAT_STAGED: return 8u;
  case CKV_FORMAT_COMMIT4: case CKV_FORMAT_ROT4: return 4u;
  case CKV_FORMAT_ROT3: return 3u;
  case CKV_FORMAT_ROT1: return 1u;
  default: return 2u;
  }
}
/* KIVI-style committed formats: 32-token key chunks, sealed one at a time. */
CKV_HD int ckv_format_is_commit(uint32_t fmt) {
  return fmt == CKV_FORMAT_COMMIT4 || fmt == CKV_FORMAT_COMMIT2;
}
/* Rotated (formats v2) committed formats: every token on its own. */
CKV_HD int ckv_format_is_rot(uint32_t fmt) { return fmt >= CKV_FORMAT_ROT4 && fmt <= CKV_FORMAT_ROT1; }
/* Formats a committed token may be stored in. */
CKV_HD int ckv_format_is_committed_state(uint32_t fmt) { return ckv_format_is_commit(fmt) || ckv_format_is_rot(fmt); }
/* The rotated format of b bits (1..4), CKV_FORMAT_COUNT_ for other b. */
CKV_HD uint32_t ckv_format_rot_of_bits(uint32_t bits) {
  return bits == 4u ? CKV_FORMAT_ROT4 : bits == 3u ? CKV_FORMAT_ROT3 : bits == 2u ? CKV_FORMAT_ROT2
         : bits == 1u ? CKV_FORMAT_ROT1 : CKV_FORMAT_COUNT_;
}
/* Whether head_dim allows the rotated formats (a power of two, 8..512). */
CKV_HD int ckv_rot_head_dim_ok(uint32_t head_dim) {
  return head_dim >= 8u && head_dim <= CKV_MAX_HEAD_DIM && (head_dim & (head_dim - 1u)) == 0;
}

/* Whether (fmt, geometry, capacity, kept_channels) describes a valid block.
 * kept_channels is used by committed formats only (1..head_dim; 0 means
 * head_dim); committed capacities are multiples of CKV_COMMIT_CHUNK_TOKENS. */
CKV_HD int ckv_format_valid(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept_channels) {
  if (!g || fmt >= CKV_FORMAT_COUNT_) return 0;
  if (g->n_layers == 0 || g->n_layers > CKV_MAX_LAYERS || g->n_kv_heads == 0 || g->n_kv_heads > CKV_MAX_KV_HEADS ||
      g->head_dim == 0 || g->head_dim > CKV_MAX_HEAD_DIM || g->dtype > CKV_DTYPE_BF16)
    return 0;
  if (capacity == 0 || capacity > CKV_MAX_BLOCK_TOKENS) return 0;
  if (ckv_format_is_commit(fmt)) {
    if (capacity % CKV_COMMIT_CHUNK_TOKENS != 0) return 0;
    if (kept_channels > g->head_dim) return 0;
  }
  if (ckv_format_is_rot(fmt)) {
    if (!ckv_rot_head_dim_ok(g->head_dim)) return 0;
    if (kept_channels != 0 && kept_channels != g->head_dim) return 0; /* nothing is pruned */
  }
  return 1;
}

/* --- staged (INT8) -------------------------------------------------------- */
/* Heads per scale group, and scale groups per token (K or V, one layer). */
CKV_HD uint32_t ckv_staged_group_heads(const ckv_geometry *g) {
  uint32_t hg = g->head_dim >= CKV_STAGED_MIN_GROUP ? 1u : (CKV_STAGED_MIN_GROUP + g->head_dim - 1) / g->head_dim;
  return hg < g->n_kv_heads ? hg : g->n_kv_heads;
}
CKV_HD uint32_t ckv_staged_groups(const ckv_geometry *g) {
  uint32_t hg = ckv_staged_group_heads(g);
  return (g->n_kv_heads + hg - 1) / hg;
}
CKV_HD size_t ckv_staged_section_bytes(const ckv_geometry *g, uint32_t capacity) {
  return ckv_align_up((size_t)capacity * ckv_draft_token_elems(g), CKV_SECTION_ALIGN) +
         ckv_align_up((size_t)capacity * ckv_staged_groups(g) * 2u, CKV_SECTION_ALIGN);
}
/* Offset of the int8 codes [slot][head*dim] of (layer, kv); add slot*H*D. */
CKV_HD size_t ckv_staged_codes_offset(const ckv_geometry *g, uint32_t capacity, uint32_t layer, uint32_t kv) {
  return ckv_block_payload_offset(capacity) + ((size_t)layer * 2u + kv) * ckv_staged_section_bytes(g, capacity);
}
/* Offset of the fp16 scales [slot][group] of (layer, kv). */
CKV_HD size_t ckv_staged_scales_offset(const ckv_geometry *g, uint32_t capacity, uint32_t layer, uint32_t kv) {
  return ckv_staged_codes_offset(g, capacity, layer, kv) +
         ckv_align_up((size_t)capacity * ckv_draft_token_elems(g), CKV_SECTION_ALIGN);
}
CKV_HD size_t ckv_staged_block_bytes(const ckv_geometry *g, uint32_t capacity) {
  return ckv_align_up(ckv_staged_codes_offset(g, capacity, g->n_layers, 0), CKV_BLOCK_ALIGN);
}

/* --- committed (INT4 / INT2) ---------------------------------------------- */
/* Payload = meta (uint32 sealed-chunk mask, bit c = chunk c quantized; uint32
 * reserved) | per layer: K part | V part.
 * K part, per head h: mask uint64[ceil(head_dim/64)] (bit c = channel c kept;
 * all zero until the first chunk is written), then per chunk:
 *   scale fp16[kept] | zero fp16[kept] | codes [32 slots][row bytes], aligned 8,
 * where a row holds the kept channels in increasing channel order, code j at
 * bits (j*b) % 8 of byte j*b/8 (low bits first), b = 4 or 2.
 * V part: scale/zero fp16 [slot][group][2] (aligned 8) | codes [slot][row]
 * (aligned 8) with a row = ceil(H*D*b/8) bytes, element e at bits (e*b)%8 of
 * byte e*b/8.  Pruned key channels are not stored and dequantize to 0. */
#define CKV_COMMIT_META_BYTES 16u
CKV_HD uint32_t ckv_commit_kept(const ckv_geometry *g, uint32_t kept_channels) {
  return kept_channels == 0 ? g->head_dim : kept_channels;
}
CKV_HD uint32_t ckv_commit_chunks(uint32_t capacity) { return capacity / CKV_COMMIT_CHUNK_TOKENS; }
CKV_HD uint32_t ckv_commit_mask_words(const ckv_geometry *g) { return (g->head_dim + 63u) / 64u; }
CKV_HD size_t ckv_commit_key_row_bytes(uint32_t fmt, uint32_t kept) {
  return ((size_t)kept * ckv_format_code_bits(fmt) + 7u) / 8u;
}
CKV_HD size_t ckv_commit_key_chunk_bytes(uint32_t fmt, uint32_t kept) {
  return ckv_align_up((size_t)kept * 4u + CKV_COMMIT_CHUNK_TOKENS * ckv_commit_key_row_bytes(fmt, kept), 8);
}
CKV_HD size_t ckv_commit_key_head_bytes(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept) {
  return (size_t)ckv_commit_mask_words(g) * 8u + ckv_commit_chunks(capacity) * ckv_commit_key_chunk_bytes(fmt, kept);
}
CKV_HD uint32_t ckv_commit_value_groups(const ckv_geometry *g) {
  return (uint32_t)((ckv_draft_token_elems(g) + CKV_COMMIT_VALUE_GROUP - 1) / CKV_COMMIT_VALUE_GROUP);
}
CKV_HD size_t ckv_commit_value_row_bytes(uint32_t fmt, const ckv_geometry *g) {
  return (ckv_draft_token_elems(g) * ckv_format_code_bits(fmt) + 7u) / 8u;
}
CKV_HD size_t ckv_commit_value_params_bytes(const ckv_geometry *g, uint32_t capacity) {
  return ckv_align_up((size_t)capacity * ckv_commit_value_groups(g) * 4u, 8);
}
CKV_HD size_t ckv_commit_layer_bytes(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept) {
  size_t k = (size_t)g->n_kv_heads * ckv_commit_key_head_bytes(fmt, g, capacity, kept);
  size_t v = ckv_commit_value_params_bytes(g, capacity) +
             ckv_align_up((size_t)capacity * ckv_commit_value_row_bytes(fmt, g), 8);
  return ckv_align_up(k + v, CKV_SECTION_ALIGN);
}
CKV_HD size_t ckv_commit_meta_offset(uint32_t capacity) { return ckv_block_payload_offset(capacity); }
CKV_HD size_t ckv_commit_layer_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept,
                                      uint32_t layer) {
  return ckv_block_payload_offset(capacity) + CKV_COMMIT_META_BYTES +
         (size_t)layer * ckv_commit_layer_bytes(fmt, g, capacity, kept);
}
/* Channel mask (uint64 words) of (layer, head). */
CKV_HD size_t ckv_commit_mask_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept,
                                     uint32_t layer, uint32_t head) {
  return ckv_commit_layer_offset(fmt, g, capacity, kept, layer) +
         (size_t)head * ckv_commit_key_head_bytes(fmt, g, capacity, kept);
}
/* Key chunk of (layer, head, chunk): scale fp16[kept], zero fp16[kept], codes. */
CKV_HD size_t ckv_commit_key_chunk_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept,
                                          uint32_t layer, uint32_t head, uint32_t chunk) {
  return ckv_commit_mask_offset(fmt, g, capacity, kept, layer, head) + (size_t)ckv_commit_mask_words(g) * 8u +
         (size_t)chunk * ckv_commit_key_chunk_bytes(fmt, kept);
}
/* Value scale/zero pairs [slot][group][2] of a layer; add slot*groups*4. */
CKV_HD size_t ckv_commit_value_params_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept,
                                             uint32_t layer) {
  return ckv_commit_layer_offset(fmt, g, capacity, kept, layer) +
         (size_t)g->n_kv_heads * ckv_commit_key_head_bytes(fmt, g, capacity, kept);
}
/* Value codes [slot][row] of a layer; add slot*ckv_commit_value_row_bytes. */
CKV_HD size_t ckv_commit_value_codes_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept,
                                            uint32_t layer) {
  return ckv_commit_value_params_offset(fmt, g, capacity, kept, layer) + ckv_commit_value_params_bytes(g, capacity);
}
CKV_HD size_t ckv_commit_block_bytes(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept) {
  return ckv_align_up(ckv_commit_layer_offset(fmt, g, capacity, kept, g->n_layers), CKV_BLOCK_ALIGN);
}

/* --- rotated (formats v2: ROT4 / ROT3 / ROT2 / ROT1) ----------------------- */
/* Payload = meta (uint32 flags, bit 0: key means set; 12 bytes reserved)
 * | key means fp16 [layer][head][head_dim] (aligned 16) | per (layer, K|V) a section:
 *   scale codes uint8 [slot][head] (aligned 16) | codes [slot][head][head_dim*b/8] (aligned 16),
 * code i of a head at bits (i*b) % 8 of byte i*b/8 of its row, low bits first
 * (a 3-bit code may straddle two bytes).  Codes are of the head's vector
 * after the rotation of kernels/quant.h (ckv_rot_forward), keys less their
 * block's key mean (taken, rotated, from the tokens of the first move into
 * the block: a constant outlier channel costs nothing, and q.mean is one dot
 * product per block); the value of code c is (c - (2^b - 1) / 2) * scale
 * (+ the mean for keys), the scale decoded from its byte by kernels/quant.h's
 * ckv_rot_scale_value (a power of 2^(1/8)).  Every token stands alone
 * otherwise: no chunks, no seals, no masks; 8 scale bits per head_dim
 * elements (0.125 bit at 64; the key means add 16 bits per channel per block,
 * 0.125 bit over K and V at 64 slots: 0.25 in all). */
#define CKV_ROT_META_BYTES 16u
#define CKV_ROT_MEANS_SET 1u
CKV_HD size_t ckv_rot_meta_offset(uint32_t capacity) { return ckv_block_payload_offset(capacity); }
/* Rotated key mean of (layer, head): head_dim FP16 values. */
CKV_HD size_t ckv_rot_mean_offset(const ckv_geometry *g, uint32_t capacity, uint32_t layer, uint32_t head) {
  return ckv_rot_meta_offset(capacity) + CKV_ROT_META_BYTES +
         (((size_t)layer * g->n_kv_heads + head) * g->head_dim) * 2u;
}
CKV_HD size_t ckv_rot_sections_offset(const ckv_geometry *g, uint32_t capacity) {
  return ckv_rot_meta_offset(capacity) + CKV_ROT_META_BYTES +
         ckv_align_up((size_t)g->n_layers * g->n_kv_heads * g->head_dim * 2u, CKV_SECTION_ALIGN);
}
CKV_HD size_t ckv_rot_row_bytes(uint32_t fmt, const ckv_geometry *g) {
  return (size_t)g->head_dim * ckv_format_code_bits(fmt) / 8u;
}
CKV_HD size_t ckv_rot_scales_bytes(const ckv_geometry *g, uint32_t capacity) {
  return ckv_align_up((size_t)capacity * g->n_kv_heads, CKV_SECTION_ALIGN);
}
CKV_HD size_t ckv_rot_section_bytes(uint32_t fmt, const ckv_geometry *g, uint32_t capacity) {
  return ckv_rot_scales_bytes(g, capacity) +
         ckv_align_up((size_t)capacity * g->n_kv_heads * ckv_rot_row_bytes(fmt, g), CKV_SECTION_ALIGN);
}
/* Scale codes (one byte each) [slot][head] of (layer, kv). */
CKV_HD size_t ckv_rot_scales_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t layer,
                                    uint32_t kv) {
  return ckv_rot_sections_offset(g, capacity) + ((size_t)layer * 2u + kv) * ckv_rot_section_bytes(fmt, g, capacity);
}
/* Codes [slot][head][row] of (layer, kv); add (slot*n_kv_heads + head) * ckv_rot_row_bytes. */
CKV_HD size_t ckv_rot_codes_offset(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t layer,
                                   uint32_t kv) {
  return ckv_rot_scales_offset(fmt, g, capacity, layer, kv) + ckv_rot_scales_bytes(g, capacity);
}
CKV_HD size_t ckv_rot_block_bytes(uint32_t fmt, const ckv_geometry *g, uint32_t capacity) {
  return ckv_align_up(ckv_rot_scales_offset(fmt, g, capacity, g->n_layers, 0), CKV_BLOCK_ALIGN);
}

/* --- accounting: what the daemon charges ---------------------------------- */
/* Bytes of one block of format fmt, everything included (header, positions,
 * bitmap, scales, zero points, masks, padding).  kept_channels: committed
 * formats only, 0 = unpruned.  Returns 0 when !ckv_format_valid(...). */
CKV_HD size_t ckv_format_block_bytes(uint32_t fmt, const ckv_geometry *g, uint32_t capacity, uint32_t kept_channels) {
  if (!ckv_format_valid(fmt, g, capacity, kept_channels)) return 0;
  switch (fmt) {
  case CKV_FORMAT_DRAFT: return ckv_draft_block_bytes(g, capacity);
  case CKV_FORMAT_STAGED: return ckv_staged_block_bytes(g, capacity);
  case CKV_FORMAT_ROT4: case CKV_FORMAT_ROT3: case CKV_FORMAT_ROT2: case CKV_FORMAT_ROT1:
    return ckv_rot_block_bytes(fmt, g, capacity);
  default: return ckv_commit_block_bytes(fmt, g, capacity, ckv_commit_kept(g, kept_channels));
  }
}
/* Elements (K and V, all layers) one token holds in the model: the FP16 baseline. */
CKV_HD size_t ckv_token_elems(const ckv_geometry *g) { return (size_t)g->n_layers * 2u * ckv_draft_token_elems(g); }
/* Bytes per token slot of a full block (block bytes / capacity). */
CKV_HD double ckv_format_bytes_per_token(uint32_t fmt, const ckv_geometry *g, uint32_t capacity,
                                         uint32_t kept_channels) {
  return (double)ckv_format_block_bytes(fmt, g, capacity, kept_channels) / (double)capacity;
}
/* Stored bits per model element (of a full block), every overhead included:
 * compare with 16 for FP16.  Pruned channels count as elements of the model. */
CKV_HD double ckv_format_bits_per_element(uint32_t fmt, const ckv_geometry *g, uint32_t capacity,
                                          uint32_t kept_channels) {
  return ckv_format_bytes_per_token(fmt, g, capacity, kept_channels) * 8.0 / (double)ckv_token_elems(g);
}

/* Pinned layout numbers (the sizes test repeats them at run time). */
CKV_STATIC_ASSERT(CKV_COMMIT_META_BYTES % 8 == 0, "commit meta keeps 8-byte alignment");
CKV_STATIC_ASSERT(CKV_MAX_BLOCK_TOKENS / CKV_COMMIT_CHUNK_TOKENS <= 32, "sealed-chunk mask is one uint32");
CKV_STATIC_ASSERT(CKV_BLOCK_ALIGN % CKV_SECTION_ALIGN == 0, "sections nest in blocks");

#endif
