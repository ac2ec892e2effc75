/* kernels.h - the CPU kernels API: moving tokens between block formats,
 * dequantizing, pruning key channels, and fused decode attention over blocks
 * of mixed formats (DESIGN.md §5).  Byte layouts are in kernels/format.h and
 * the quantization rules in kernels/quant.h; the CUDA library
 * (kernels/cuda/kernels_cuda.h) implements the same operations on device
 * memory and writes the same bytes.
 *
 * Block pointers are host addresses of whole blocks (header first), e.g. into
 * a mapped arena.  Every call validates headers against the geometry and
 * returns a ckv_status; nothing here prints, aborts or keeps global state
 * other than the chosen SIMD path.  Calls are thread-safe as long as two calls
 * never write the same block. */
#ifndef CKV_KERNELS_H
#define CKV_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv/status.h"
#include "kernels/format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU path selection ------------------------------------------------ */
typedef enum ckv_cpu_path {
  CKV_PATH_AUTO = 0, /* best the CPU supports (the default) */
  CKV_PATH_SCALAR = 1,
  CKV_PATH_AVX2 = 2, /* AVX2 + FMA + F16C */
  CKV_PATH_AVX512 = 3, /* AVX-512 F/BW/VL */
} ckv_cpu_path;

/* Forces a path for every later call (tests, benchmarks).  CKV_PATH_AUTO goes
 * back to detection.  Returns CKV_ERR_UNSUPPORTED if this CPU (or build)
 * cannot run the path, CKV_ERR_INVALID for an unknown value.  The environment
 * variable CKV_KERNELS_PATH=scalar|avx2|avx512 sets the initial choice. */
ckv_status ckv_kernels_force(ckv_cpu_path path);
/* The path calls use now (never CKV_PATH_AUTO). */
ckv_cpu_path ckv_kernels_path(void);
/* Whether this CPU and build can run path. */
bool ckv_kernels_path_supported(ckv_cpu_path path);
/* "scalar", "avx2", "avx512" ("auto" for CKV_PATH_AUTO). */
const char *ckv_kernels_path_name(ckv_cpu_path path);
/* The integer dot products the current path uses for integer attention scores:
 * "scalar", "avx2" (maddubs) or "avx512vnni" (the AVX-512 path on a CPU with VNNI; AVX2's otherwise). */
const char *ckv_kernels_idot_name(void);
/* Whether CKV_ATTN_VALUES_BF16 takes effect here (the AVX-512 path of a CPU with AVX512_BF16). */
bool ckv_kernels_values_bf16_supported(void);

/* ---- blocks ---------------------------------------------------------------- */
/* Writes a fresh header (magic, format, dtype, capacity, kept channels,
 * generation) and zeroes positions, valid bitmap and committed meta/masks.
 * blk must hold ckv_format_block_bytes(fmt, g, capacity, kept_channels) bytes
 * and be 8-byte aligned.  Returns CKV_ERR_INVALID on a bad geometry. */
ckv_status ckv_block_init(void *blk, uint32_t fmt, const ckv_geometry *g, uint32_t capacity,
                          uint32_t kept_channels, uint64_t generation);
/* The header part of ckv_block_init: writes only the first
 * ckv_block_payload_offset(capacity) bytes (header, zeroed positions and
 * valid bitmap), so `hdr` may be a host copy of a block that lives in device
 * memory; the committed meta and masks of the payload are left alone (zero
 * them separately).  Returns CKV_ERR_INVALID on a bad geometry. */
ckv_status ckv_block_init_header(void *hdr, uint32_t fmt, const ckv_geometry *g, uint32_t capacity,
                                 uint32_t kept_channels, uint64_t generation);
/* Validates a block header against the geometry: CKV_ERR_CORRUPT on a bad
 * magic, CKV_ERR_FORMAT on a dtype/format/capacity that does not fit g. */
ckv_status ckv_block_check(const void *blk, const ckv_geometry *g);
/* Valid bit of a slot (acquire load). */
bool ckv_block_slot_valid(const void *blk, uint32_t slot);
/* Sets or clears a slot's valid bit and adjusts n_valid (atomic RMW, release):
 * how the daemon publishes moved tokens and vacates draft slots. */
void ckv_block_set_valid(void *blk, uint32_t slot, bool valid);
/* Positions array (capacity entries). */
uint32_t *ckv_block_positions(void *blk);
const uint32_t *ckv_block_positions_const(const void *blk);
/* Committed blocks: bit c set when chunk c (slots [32c, 32c+32)) is quantized. */
uint32_t ckv_block_sealed_chunks(const void *blk);

/* ---- moves ----------------------------------------------------------------- */
/* One token: source block and slot -> destination block and slot. */
typedef struct ckv_move {
  const void *src;
  uint32_t src_slot;
  uint32_t dst_slot;
  void *dst;
  /* Trusted headers of src and dst, or NULL.  When set, format, dtype,
   * capacity and kept channels come from them and the blocks' own headers
   * are never read: the daemon passes its private records, since a worker
   * can write every byte of the blocks it maps (DESIGN.md §4 inv. 8).  The
   * headers must stay unchanged until the call returns.  NULL: the header at
   * the start of the block is read (tools, tests, benchmarks). */
  const ckv_block_header *src_hdr, *dst_hdr;
} ckv_move;

/* Set the destination valid bits once the payload is written.  Without it
 * the daemon publishes the slots itself (ckv_block_set_valid) when its new
 * view epoch is out; source slots are never modified by a move. */
#define CKV_MOVE_SET_VALID 1u

/* Copies and converts every token of moves (all K and V, all layers) and its
 * position (not when the move carries trusted headers: the caller keeps the
 * positions then, as the daemon does in its header shadows).  Supported: draft -> staged, draft -> committed, staged ->
 * committed (a transition is one call; formats are read from the headers and
 * may differ between moves).  Committed destinations are filled a chunk at a
 * time: every move into chunk c of a block must be in the same call, the
 * chunk must not be sealed yet, and it is sealed by the call (slots of it that
 * no move fills stay empty for good; this is how a partly filled block is
 * closed).  A committed block whose mask is still empty gets its key channels
 * chosen from this call's tokens bound for it (ckv_kernels_prune_keys).
 * Bytes of the blocks other than their headers (payload, committed masks
 * and seals) may hold anything: the call never reads or writes outside the
 * blocks the headers describe.  Returns CKV_ERR_INVALID (bad slot, duplicate
 * destination), CKV_ERR_FORMAT (header does not match g), CKV_ERR_STATE
 * (chunk already sealed), CKV_ERR_CORRUPT (a committed channel mask that does
 * not hold kept_channels channels), CKV_ERR_UNSUPPORTED (other format pairs),
 * -ENOMEM.  On error some destinations may be partly written, never
 * published. */
ckv_status ckv_kernels_move(const ckv_geometry *g, const ckv_move *moves, size_t n_moves, unsigned flags);

/* Chooses the kept key channels of committed destination blocks whose mask is
 * empty: per (layer, head), the kept_channels channels with the largest sum
 * of |k| over the moves' source tokens bound for that block (ties: lower
 * channel index first), and writes the mask.  Blocks whose mask is already set
 * are left as they are.  Same errors as ckv_kernels_move. */
ckv_status ckv_kernels_prune_keys(const ckv_geometry *g, const ckv_move *moves, size_t n_moves);

/* The top-r selection used above, on one head: mag[head_dim] -> mask bits
 * (ckv_commit_mask_words(g) words).  Exposed for tests. */
void ckv_kernels_select_channels(const float *mag, uint32_t head_dim, uint32_t r, uint64_t *ret_mask);

/* Dequantizes one slot's K (kv=0) or V (kv=1) of one layer to FP32,
 * ret[head*head_dim + dim]; pruned key channels read as 0.  Any format.
 * Returns CKV_ERR_RANGE for a bad layer/slot, CKV_ERR_STATE for a committed
 * slot whose chunk is not sealed. */
ckv_status ckv_kernels_dequantize(const ckv_geometry *g, const void *blk, uint32_t layer, uint32_t kv,
                                  uint32_t slot, float *ret);

/* ---- fused decode attention ----------------------------------------------- */
typedef struct ckv_attn_args {
  const ckv_geometry *geom;
  uint32_t layer;
  uint32_t n_rows;    /* query rows (tokens being decoded) */
  uint32_t n_q_heads; /* multiple of n_kv_heads; query head qh uses kv head qh / (n_q_heads/n_kv_heads) */
  float scale;        /* softmax scale; 0 means 1/sqrt(head_dim) */
  const float *q;     /* [n_rows][n_q_heads][head_dim] */
  const void *const *blocks; /* any mix of formats and order */
  uint32_t n_blocks;
  float *out;  /* [n_rows][n_q_heads][head_dim] */
  float *mass; /* optional: per (block, slot): mass[base_i + slot], base_i = sum of capacities of
                  blocks before i; attention probability summed over rows and query heads; 0 for
                  empty slots.  Sums to n_rows * n_q_heads when any slot is valid. */
  void *workspace; /* optional scratch of ckv_attention_workspace_bytes(); NULL: allocated per call */
  size_t workspace_bytes;
  uint32_t n_threads; /* threads of this call (the caller's included); 0: $CKV_ATTENTION_THREADS, else the
                         online CPUs, one per MiB of the layer's K/V at most (short contexts stay on the
                         calling thread).  Callers that run attention from several threads at once set 1.
                         The result has the same bits for any value. */
  uint32_t scores;    /* how q.k is computed for INT8 staged, 4-bit committed, ROT4 and ROT2 keys:
                         CKV_ATTN_SCORES_FLOAT (dequantize, FP32 dot), CKV_ATTN_SCORES_INT8 (the query
                         quantized to INT8, one scale per row; integer dots, the same bits on every CPU
                         path; see attention_int.c for its error); 0: $CKV_ATTENTION_SCORES ("float" or
                         "int8"), else the format's default (CKV_ATTN_SCORES_DEFAULT_INT_FORMATS: ROT4
                         and ROT2).  Other formats are always FP32. */
  uint32_t values;    /* how ROT4 and ROT2 values are summed (head_dim a multiple of 128, blocks with every slot
                         valid): CKV_ATTN_VALUES_FLOAT (FP32 weights, FMA), CKV_ATTN_VALUES_BF16 (the
                         weights rounded to BF16, BF16 pair dot products; CPUs with AVX512_BF16 on the
                         AVX-512 path, else FP32; see attention_bf16.c for its error); and INT8 staged
                         values (head_dim a multiple of 64, capacity of 16, blocks with every slot
                         valid): CKV_ATTN_VALUES_INT8 (the weights rounded to 8 bits per 16 tokens,
                         integer dot products with the codes; CPUs with AVX512_VNNI on the AVX-512
                         path, else FP32; see attention_i8v.c for its error; ROT4 and ROT2 as BF16).
                         Only the output changes, never the mass.  0: $CKV_ATTENTION_VALUES ("float",
                         "bf16" or "int8"), else CKV_ATTN_VALUES_DEFAULT_BF16 and _DEFAULT_INT8. */
} ckv_attn_args;
#define CKV_ATTN_SCORES_FLOAT 1u
#define CKV_ATTN_SCORES_INT8 2u
/* The formats whose keys are scored with integer dots when neither the call nor the environment chooses
 * (bit 1 << format): ROT4 and ROT2, where they cost nothing measurable against the format's own error
 * and are faster with VNNI (docs/formats-v2.md, issue 42 part 4).  INT8 staged and 4-bit committed keys
 * stay FP32 by default: slower with integer scores on every path, and they add 4-14% to INT8's error. */
#define CKV_ATTN_SCORES_DEFAULT_INT_FORMATS ((1u << CKV_FORMAT_ROT4) | (1u << CKV_FORMAT_ROT2))
#define CKV_ATTN_VALUES_FLOAT 1u
#define CKV_ATTN_VALUES_BF16 2u
#define CKV_ATTN_VALUES_INT8 3u
/* The built-in choice (1: BF16 values where the CPU has them) when neither the call nor the environment chooses. */
#define CKV_ATTN_VALUES_DEFAULT_BF16 1
/* The built-in choice for INT8 staged values (1: integer dots where the CPU has them). */
#define CKV_ATTN_VALUES_DEFAULT_INT8 0

/* How a call with these arguments computes the blocks of format fmt: *ret_scores CKV_ATTN_SCORES_FLOAT
 * or CKV_ATTN_SCORES_INT8, *ret_values CKV_ATTN_VALUES_FLOAT, _BF16 or _INT8 (BF16, INT8 only where
 * this CPU's path runs them; head_dim and the blocks' slots decide per call too, see values above).
 * Formats without an integer or BF16 path get FLOAT.  Reads a->scores, a->values and the environment
 * only (a may have no blocks). */
void ckv_attention_choice(const ckv_attn_args *a, uint32_t fmt, uint32_t *ret_scores, uint32_t *ret_values);

/* Scratch bytes ckv_kernels_attention needs for these arguments (0 if invalid). */
size_t ckv_attention_workspace_bytes(const ckv_attn_args *a);
/* Number of floats the mass array needs: the sum of the blocks' capacities. */
size_t ckv_attention_mass_len(const void *const *blocks, uint32_t n_blocks);

/* out = softmax(q K^T * scale) V over every valid slot of every block, read
 * in place (codes dequantized in registers), online softmax across blocks.
 * Skips empty slots and unsealed committed chunks.  With no valid slot at
 * all, out and mass are zero.  Returns CKV_ERR_INVALID / CKV_ERR_FORMAT /
 * CKV_ERR_RANGE on bad arguments, -ENOMEM. */
ckv_status ckv_kernels_attention(const ckv_attn_args *a);

/* The oracle: dequantizes every valid slot to FP32 and computes the same
 * outputs with a plain two-pass softmax in double precision.  Slow; tests. */
ckv_status ckv_kernels_attention_reference(const ckv_attn_args *a);

#ifdef __cplusplus
}
#endif
#endif
