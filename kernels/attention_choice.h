/* attention_choice.h - private: how one call of fused attention computes its
 * scores and values (attention_choice.c), from its arguments, else the
 * environment, else the built-in defaults of kernels.h. */
#ifndef CKV_ATTENTION_CHOICE_H
#define CKV_ATTENTION_CHOICE_H

#include <stdbool.h>

#include "kernels/kernels.h"

/* Whether the call scores INT8 staged, 4-bit committed, ROT4 and ROT2 keys with integer dot products:
 * a->scores, else $CKV_ATTENTION_SCORES ("int8" or "float"), else CKV_ATTN_SCORES_DEFAULT_INT. */
bool ckv_attn_int_scores(const ckv_attn_args *a);
/* Whether the call sums ROT4 and ROT2 values with BF16 dot products where the CPU can: a->values, else
 * $CKV_ATTENTION_VALUES ("bf16" or "float"), else CKV_ATTN_VALUES_DEFAULT_BF16. */
bool ckv_attn_values_bf16(const ckv_attn_args *a);

#endif
