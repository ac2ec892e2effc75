/* attention_choice.c - how one call of fused attention computes its scores
 * and values: the call's arguments choose, else the environment (for runs
 * that cannot change their callers: benchmarks, A/B comparisons), else the
 * built-in defaults of kernels.h (integer scores per format, BF16 values for
 * the rotated formats, FP32 or integer values for INT8 staged). */
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#include "kernels/attention_i8v.h"
#include "kernels/attention_int.h"

/* A call's choice: 1 yes, 0 no, -1 neither the argument nor the environment variable's two words say. */
static int choose(uint32_t arg, uint32_t yes, uint32_t no, const char *env, const char *yes_word, const char *no_word) {
  if (arg == yes) return 1;
  if (arg == no) return 0;
  const char *e = getenv(env);
  if (e && !strcmp(e, yes_word)) return 1;
  if (e && !strcmp(e, no_word)) return 0;
  return -1;
}

/* Every format an integer score path exists for. */
static const uint32_t all_int_formats = (1u << CKV_FORMAT_STAGED) | (1u << CKV_FORMAT_COMMIT4) |
                                        (1u << CKV_FORMAT_ROT4) | (1u << CKV_FORMAT_ROT2);

uint32_t ckv_attn_int_score_formats(const ckv_attn_args *a) {
  int c = choose(a->scores, CKV_ATTN_SCORES_INT8, CKV_ATTN_SCORES_FLOAT, "CKV_ATTENTION_SCORES", "int8", "float");
  return c < 0 ? CKV_ATTN_SCORES_DEFAULT_INT_FORMATS & all_int_formats : c ? all_int_formats : 0u;
}

/* The values the call asks for: CKV_ATTN_VALUES_FLOAT, _BF16 or _INT8 from a->values, else from
 * $CKV_ATTENTION_VALUES ("float", "bf16", "int8"), else 0 (the defaults). */
static uint32_t values_asked(const ckv_attn_args *a) {
  if (a->values == CKV_ATTN_VALUES_FLOAT || a->values == CKV_ATTN_VALUES_BF16 || a->values == CKV_ATTN_VALUES_INT8)
    return a->values;
  const char *e = getenv("CKV_ATTENTION_VALUES");
  if (!e) return 0;
  return !strcmp(e, "float") ? CKV_ATTN_VALUES_FLOAT
         : !strcmp(e, "bf16") ? CKV_ATTN_VALUES_BF16
         : !strcmp(e, "int8") ? CKV_ATTN_VALUES_INT8
                              : 0u;
}

bool ckv_attn_values_bf16(const ckv_attn_args *a) { /* INT8 asks for BF16 rotated values too */
  uint32_t v = values_asked(a);
  return v ? v != CKV_ATTN_VALUES_FLOAT : CKV_ATTN_VALUES_DEFAULT_BF16 != 0;
}

bool ckv_attn_values_i8(const ckv_attn_args *a) {
  uint32_t v = values_asked(a);
  return v ? v == CKV_ATTN_VALUES_INT8 : CKV_ATTN_VALUES_DEFAULT_INT8 != 0;
}

void ckv_attention_choice(const ckv_attn_args *a, uint32_t fmt, uint32_t *ret_scores, uint32_t *ret_values) {
  bool in = fmt < 32u && ((ckv_attn_int_score_formats(a) >> fmt) & 1u);
  bool bf = (fmt == CKV_FORMAT_ROT4 || fmt == CKV_FORMAT_ROT2) && ckv_attn_values_bf16(a) &&
            ckv_kernels_values_bf16_supported();
  bool i8 = fmt == CKV_FORMAT_STAGED && ckv_attn_values_i8(a) && ckv_kernels_path() == CKV_PATH_AVX512 &&
            ckv_avalues_i8_supported();
  *ret_scores = in ? CKV_ATTN_SCORES_INT8 : CKV_ATTN_SCORES_FLOAT;
  *ret_values = bf ? CKV_ATTN_VALUES_BF16 : i8 ? CKV_ATTN_VALUES_INT8 : CKV_ATTN_VALUES_FLOAT;
}
