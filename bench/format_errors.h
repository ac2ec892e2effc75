/* format_errors.h - what each block format costs and loses on a set of real
 * K/V: bits per element (every scale, mean, header and position counted, at
 * the daemon's block capacity) and the relative L2 error of keys and values
 * after a round trip through the format (commitkv-bench quality, "formats"). */
#ifndef CKV_BENCH_FORMAT_ERRORS_H
#define CKV_BENCH_FORMAT_ERRORS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/format.h"

typedef struct ckv_format_errors {
  const char *name; /* "int8", "kivi4", "kivi4-keys75", "kivi4-keys50", "kivi2", "rot4", "rot3", "rot2", "rot1" */
  uint32_t format;
  double bits_per_element;
  double key_rel_error, value_rel_error; /* ||x - x'|| / ||x|| over every token, layer and head */
} ckv_format_errors;

#define CKV_FORMAT_ERRORS_MAX 9

/* Measures every format valid for g on n tokens of FP16 K/V laid out
 * [token][layer][K|V][n_kv_heads*head_dim] (ckv_workload_round.kv).
 * Tokens go draft -> format directly (committed formats as the daemon fills
 * them: blocks of CKV_DEFAULT_CAPACITY_COMMIT tokens, one move call per
 * block).  Returns how many rows it wrote to out, or a negative ckv_status. */
int ckv_format_errors_measure(const ckv_geometry *g, const uint16_t *kv, size_t n, ckv_format_errors *out);

/* K/V of a real model reading real text: runs the llama2.c model at
 * model_path over dialogues of data_path (BOS, then "R: text\n" per turn),
 * one private FP32 forward pass each, until max_tokens tokens, and returns
 * them as FP16 in the layout above (*ret_kv malloc'ed, *ret_n tokens, *ret_g
 * the model's KV geometry).  Returns 0 or a negative ckv_status / -errno. */
int ckv_format_errors_model_kv(const char *model_path, const char *data_path, size_t max_tokens, int bos,
                               uint16_t **ret_kv, size_t *ret_n, ckv_geometry *ret_g);

#endif
