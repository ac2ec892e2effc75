/* modelkv.h - K/V and queries of the real model (shared/models/stories260K,
 * head_dim 8) for the kernels' fidelity tests: the model decodes n tokens
 * greedily from BOS with an FP32 cache (the model library's split API),
 * and every layer's keys, values and queries are kept. */
#ifndef CKV_TESTS_MODELKV_H
#define CKV_TESTS_MODELKV_H

#include <stdbool.h>
#include <stddef.h>

#include "examples/llm/model.h"

typedef struct ckv_test_model_kv {
  const ckv_model_config *c; /* the model's (valid until ckv_test_model_kv_free) */
  int n;                     /* tokens decoded */
  float *k, *v;              /* [layer][pos][kv_dim] */
  float *q;                  /* [layer][pos][n_heads * head_dim] */
  ckv_model *m;
} ckv_test_model_kv;

/* Loads the model named by CKV_MODEL / CKV_MODEL_DIR and decodes n tokens.
 * false when the model is not there (*why says where it looked: skip the
 * test); a failure on the way fails the calling test. */
bool ckv_test_model_kv_decode(int n, ckv_test_model_kv *ret, char *why, size_t whylen);
void ckv_test_model_kv_free(ckv_test_model_kv *x);

#endif
