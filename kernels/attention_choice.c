/* attention_choice.c - how one call of fused attention computes its scores
 * and values: the call's arguments choose, else the environment (for runs
 * that cannot change their callers: benchmarks, A/B comparisons), else the
 * built-in defaults of kernels.h. */
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"

/* a call's choice (0: none), the environment variable's two words, and the default */
static bool choose(uint32_t arg, uint32_t yes, uint32_t no, const char *env, const char *yes_word, const char *no_word,
                   bool dflt) {
  if (arg == yes) return true;
  if (arg == no) return false;
  const char *e = getenv(env);
  if (e && !strcmp(e, yes_word)) return true;
  if (e && !strcmp(e, no_word)) return false;
  return dflt;
}

bool ckv_attn_int_scores(const ckv_attn_args *a) {
  return choose(a->scores, CKV_ATTN_SCORES_INT8, CKV_ATTN_SCORES_FLOAT, "CKV_ATTENTION_SCORES", "int8", "float",
                CKV_ATTN_SCORES_DEFAULT_INT);
}

bool ckv_attn_values_bf16(const ckv_attn_args *a) {
  return choose(a->values, CKV_ATTN_VALUES_BF16, CKV_ATTN_VALUES_FLOAT, "CKV_ATTENTION_VALUES", "bf16", "float",
                CKV_ATTN_VALUES_DEFAULT_BF16);
}
