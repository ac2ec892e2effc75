/* cold_sketch.h - a one-bit sketch of cold keys, to rank cold tokens by the
 * score a query would give them without reading their bytes (internal to
 * libcommitkv: cold_select.c keeps a sketch per cold block, cold_gather.c
 * ranks with it).
 *
 * A key k of head_dim d (a power of two, 8..CKV_COLD_SKETCH_MAX_DIM) is
 * rotated by the orthonormal Walsh-Hadamard transform H (which spreads an
 * outlier channel over all of them, as the rotated formats do) and kept as
 * the d signs of Hk and alpha, the mean of |Hk|: k' = alpha sign(Hk) is its
 * one-bit estimate, and q.k = (Hq).(Hk) is estimated by
 * alpha (sum of Hq over the positive signs - sum over the negative ones).
 * Per query head, a table of the sums of Hq over each byte's set bits makes
 * that d/8 lookups per key.  d/8 + 4 bytes per key and head: about 5% of
 * FP16's K and V at d = 64.  An estimate only (one bit per channel keeps about
 * 0.84 of a key's direction): cold_gather.c shortlists with it and scores the
 * shortlist exactly. */
#ifndef CKV_CLIENT_COLD_SKETCH_H
#define CKV_CLIENT_COLD_SKETCH_H

#include <stddef.h>
#include <stdint.h>

#define CKV_COLD_SKETCH_MAX_DIM 512u

/* 64-bit words of one key's signs at head_dim d; 0 when d takes no sketch
 * (not a power of two, or outside 8..CKV_COLD_SKETCH_MAX_DIM). */
uint32_t ckv_cold_sketch_words(uint32_t d);

/* The sketch of key k[0..d): ret_sign[0..words) (bit c set: (Hk)_c >= 0) and
 * *ret_alpha; scratch holds d floats.  d must take a sketch. */
void ckv_cold_sketch_key(const float *k, uint32_t d, float *scratch, uint64_t *ret_sign, float *ret_alpha);

/* Floats of the tables of n_q_heads query heads at head_dim d. */
size_t ckv_cold_sketch_table_len(uint32_t n_q_heads, uint32_t d);

/* Per query head h of q ([n_q_heads][d]): ret_tables + h * (d / 8) * 256, the
 * sums of scale * (Hq_h) over the set bits of each byte value, and
 * ret_total[h], scale * the sum of Hq_h; scratch holds d floats. */
void ckv_cold_sketch_tables(const float *q, uint32_t n_q_heads, uint32_t d, float scale, float *scratch,
                            float *ret_tables, float *ret_total);

/* The estimate of scale * q_h.k from query head h's table and total and the
 * key's sketch. */
float ckv_cold_sketch_score(const float *table, float total, const uint64_t *sign, float alpha, uint32_t d);

#endif
