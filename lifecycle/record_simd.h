/* record_simd.h - the vector bodies of ckv_tokens_record_round's main pass
 * (tokens.c keeps the scalar one, the definition they must match byte for
 * byte: test_tokens compares every path the CPU can run against it).
 *
 * Private to lifecycle/: tokens.c chooses the path at run time. */
#ifndef CKV_LIFECYCLE_RECORD_SIMD_H
#define CKV_LIFECYCLE_RECORD_SIMD_H

#include <stddef.h>
#include <stdint.h>

/* The attention code's table (tokens.c): coded range [2^-7, 2^8), bins of
 * the float's exponent and top 6 mantissa bits. */
#define CKV_ENC_LO 0x3C000000u /* bits of 2^-7 */
#define CKV_ENC_HI 0x43800000u /* bits of 2^8 */
#define CKV_ENC_SHIFT 17u      /* 23 mantissa bits - 6 kept */
#define CKV_ENC_BINS ((CKV_ENC_HI - CKV_ENC_LO) >> CKV_ENC_SHIFT)
#define CKV_ENC_NONE (1u << CKV_ENC_SHIFT) /* no boundary in the bin: never reached by the low bits */

/* One round's main pass over positions [p, end): token p's reported mass is
 * attn[p - first] (first: the report's first position), masked to 0 when
 * not in (0, FLT_MAX] or the token is recycled; rel = mass * inv (finite);
 * the ring byte ring_col[p * 8] gets rel's code, cum[p] += rel, and
 * last[p] = round when rel >= CKV_ATTENDED_FLOOR. */
typedef struct ckv_record_span {
  const float *attn; /* attn[0]: position first */
  size_t first;
  const uint8_t *state;
  uint8_t *ring_col; /* t->attn + round % CKV_ATTN_HISTORY */
  unsigned ring;     /* round % CKV_ATTN_HISTORY */
  float *cum;
  uint32_t *last;
  float inv;
  uint32_t round;
  const uint32_t *enc; /* CKV_ENC_BINS + 2 entries */
} ckv_record_span;

/* Each records whole vectors from p on and returns where it stopped (the
 * caller records the rest one token at a time). */
size_t ckv_record_span_avx2(const ckv_record_span *a, size_t p, size_t end);
size_t ckv_record_span_avx512(const ckv_record_span *a, size_t p, size_t end);

/* The round's mass lanes (tokens.c round_mass): from p = first on, whole
 * groups of 8 positions, lane k += the masked mass of position p + k, which
 * is attn[p + k - first]; returns where it stopped.  AVX2 (the AVX-512 path uses it too: one 8-lane chain of
 * adds either way). */
size_t ckv_record_mass_avx2(const float *attn, const uint8_t *state, size_t first, size_t end, double lane[8]);

#endif
