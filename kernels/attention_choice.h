/* attention_choice.h - private: how one call of fused attention computes its
 * scores and values (attention_choice.c), from its arguments, else the
 * environment, else the built-in defaults of kernels.h. */
#ifndef CKV_ATTENTION_CHOICE_H
#define CKV_ATTENTION_CHOICE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* The formats (bit 1 << format) whose keys the call scores with integer dot products, among INT8 staged,
 * 4-bit committed, ROT4 and ROT2: all four if a->scores or $CKV_ATTENTION_SCORES says int8, none if it
 * says float, else CKV_ATTN_SCORES_DEFAULT_INT_FORMATS. */
uint32_t ckv_attn_int_score_formats(const ckv_attn_args *a);
/* Whether the call sums ROT4 and ROT2 values with BF16 dot products where the CPU can: a->values, else
 * $CKV_ATTENTION_VALUES ("bf16" or "float"), else CKV_ATTN_VALUES_DEFAULT_BF16. */
bool ckv_attn_values_bf16(const ckv_attn_args *a);
/* Whether the call sums INT8 staged values with integer dot products where the CPU can: a->values
 * (CKV_ATTN_VALUES_INT8: yes; FLOAT or BF16: no), else $CKV_ATTENTION_VALUES ("int8": yes; "bf16",
 * "float": no), else CKV_ATTN_VALUES_DEFAULT_INT8. */
bool ckv_attn_values_i8(const ckv_attn_args *a);

#endif
