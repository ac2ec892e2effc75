/* logits.c - ckv-agentlm-logits: the project's C forward pass (examples/llm/model.c)
 * over a byte prompt, so an exported agent LM can be checked against PyTorch.
 *
 *   ckv-agentlm-logits MODEL PROMPT_FILE OUT_FILE
 *
 * Loads MODEL (llama2.c legacy format, through ckv_model_load exactly as the
 * workers do), feeds BOS (id 256) and then every byte of PROMPT_FILE as a
 * token through ckv_model_forward (FP32, private cache), and writes the logits
 * of every position, (1 + bytes) x vocab_size little-endian float32, to
 * OUT_FILE.  Prints the geometry on stdout.  The model's vocabulary must hold
 * 257 ids (bytes and BOS).  Exit 0 on success, 1 on a failure, 2 on bad
 * arguments. */
#include <stdio.h>
#include <stdlib.h>

#include "commitkv/status.h"
#include "examples/llm/model.h"

#define AGENTLM_BOS 256

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s MODEL PROMPT_FILE OUT_FILE\n", argv[0]);
    return 2;
  }
  ckv_model *m = NULL;
  int r = ckv_model_load(argv[1], &m);
  if (r < 0) {
    fprintf(stderr, "ckv-agentlm-logits: cannot load %s: %s\n", argv[1], ckv_strerror(r));
    return 1;
  }
  const ckv_model_config *c = ckv_model_config_get(m);
  printf("dim %d hidden %d layers %d heads %d kv_heads %d head_dim %d vocab %d seq_len %d shared %d\n",
         c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
         c->seq_len, (int)c->shared_classifier);
  int rc = 1;
  ckv_model_state *s = NULL;
  float *logits = NULL;
  unsigned char *prompt = NULL;
  FILE *in = NULL, *out = NULL;
  if (c->vocab_size <= AGENTLM_BOS) {
    fprintf(stderr, "ckv-agentlm-logits: vocabulary %d has no BOS id %d\n", c->vocab_size, AGENTLM_BOS);
    goto done;
  }
  in = fopen(argv[2], "rb");
  if (!in) {
    perror(argv[2]);
    goto done;
  }
  prompt = malloc((size_t)c->seq_len);
  if (!prompt) goto done;
  size_t n = fread(prompt, 1, (size_t)c->seq_len, in);
  if (n + 1 > (size_t)c->seq_len) {
    fprintf(stderr, "ckv-agentlm-logits: prompt longer than seq_len - 1 (%d)\n", c->seq_len - 1);
    goto done;
  }
  logits = malloc((size_t)c->vocab_size * sizeof(float));
  out = fopen(argv[3], "wb");
  if (!logits || !out || ckv_model_state_new(m, true, &s) < 0) {
    fprintf(stderr, "ckv-agentlm-logits: cannot set up (out of memory or %s unwritable)\n", argv[3]);
    goto done;
  }
  for (size_t pos = 0; pos <= n; pos++) {
    int tok = pos == 0 ? AGENTLM_BOS : prompt[pos - 1];
    r = ckv_model_forward(m, s, tok, (int)pos, logits);
    if (r < 0) {
      fprintf(stderr, "ckv-agentlm-logits: forward at %zu: %s\n", pos, ckv_strerror(r));
      goto done;
    }
    if (fwrite(logits, sizeof(float), (size_t)c->vocab_size, out) != (size_t)c->vocab_size) {
      perror(argv[3]);
      goto done;
    }
  }
  rc = 0;
done:
  if (out && fclose(out) != 0 && rc == 0) {
    perror(argv[3]);
    rc = 1;
  }
  if (in) fclose(in);
  free(prompt);
  free(logits);
  ckv_model_state_free(s);
  ckv_model_free(m);
  return rc;
}
