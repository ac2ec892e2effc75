/* modelkv.c - K/V and queries of the real model (see modelkv.h). */
#include "modelkv.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"

bool ckv_test_model_kv_decode(int n, ckv_test_model_kv *x, char *why, size_t whylen) {
  memset(x, 0, sizeof(*x));
  char path[1024];
  if (ckv_model_path_from_env(path, sizeof(path)) < 0 || access(path, R_OK) != 0) {
    snprintf(why, whylen, "model not found (CKV_MODEL / CKV_MODEL_DIR): %s", path);
    return false;
  }
  ckv_model_state *st = NULL;
  cr_assert_eq(ckv_model_load(path, &x->m), CKV_OK, "cannot load %s", path);
  const ckv_model_config *c = x->c = ckv_model_config_get(x->m);
  cr_assert_eq(ckv_model_state_new(x->m, false, &st), CKV_OK);
  const int L = c->n_layers, kvd = c->kv_dim, qd = c->n_heads * c->head_dim;
  x->n = n;
  x->k = calloc((size_t)L * n * kvd, sizeof(float));
  x->v = calloc((size_t)L * n * kvd, sizeof(float));
  x->q = calloc((size_t)L * n * qd, sizeof(float));
  float *logits = calloc((size_t)c->vocab_size, sizeof(float));
  cr_assert(x->k && x->v && x->q && logits);
  int tok = 1; /* BOS */
  for (int pos = 0; pos < n; pos++) {
    cr_assert_eq(ckv_model_embed(x->m, st, tok), CKV_OK);
    for (int l = 0; l < L; l++) {
      cr_assert_eq(ckv_model_qkv(x->m, st, l, pos), CKV_OK);
      memcpy(x->q + ((size_t)l * n + pos) * qd, ckv_model_state_q(st), (size_t)qd * sizeof(float));
      memcpy(x->k + ((size_t)l * n + pos) * kvd, ckv_model_state_k(st), (size_t)kvd * sizeof(float));
      memcpy(x->v + ((size_t)l * n + pos) * kvd, ckv_model_state_v(st), (size_t)kvd * sizeof(float));
      float *out = ckv_model_state_attn_buf(st);
      cr_assert_eq(ckv_model_attend_fp32(c, ckv_model_state_q(st), x->k + (size_t)l * n * kvd,
                                         x->v + (size_t)l * n * kvd, (size_t)kvd, pos + 1, out, NULL),
                   CKV_OK);
      cr_assert_eq(ckv_model_finish_layer(x->m, st, l, out), CKV_OK);
    }
    cr_assert_eq(ckv_model_logits(x->m, st, logits), CKV_OK);
    tok = ckv_model_argmax(logits, c->vocab_size);
  }
  free(logits);
  ckv_model_state_free(st);
  return true;
}

void ckv_test_model_kv_free(ckv_test_model_kv *x) {
  free(x->k);
  free(x->v);
  free(x->q);
  ckv_model_free(x->m);
  memset(x, 0, sizeof(*x));
}
