/* model.h - a llama2.c-format transformer (FP32) whose KV cache can live
 * outside the model.
 *
 * The model (ckv_model) is the immutable, memory-mapped checkpoint: load it
 * once and share it between any number of sequences (and threads).  A
 * sequence's mutable activations live in a ckv_model_state.  One token's
 * forward pass is split so that the caller owns the attention step:
 *
 *   ckv_model_embed(m, s, token);
 *   for (layer = 0; layer < n_layers; layer++) {
 *     ckv_model_qkv(m, s, layer, pos);            // rmsnorm, q/k/v, RoPE
 *     ...append ckv_model_state_k(s), _v(s) to the caller's cache...
 *     ...attention per query head, e.g. ckv_model_attend_fp32()...
 *     ckv_model_finish_layer(m, s, layer, attn_out); // wo, residual, FFN
 *   }
 *   ckv_model_logits(m, s, logits);
 *
 * ckv_model_forward() runs exactly that sequence over a private FP32 cache
 * held by the state (the reference path), and ckv_model_cache_kv() reads that
 * cache back so other tests can take real K/V from the model.  The helpers at
 * the end (argmax, softmax, KL divergence, seeded sampling) are deterministic
 * and shared by the workers and the fidelity judge.
 *
 * Functions returning int return a ckv_status (commitkv/status.h): CKV_OK, or
 * a negative code.  Nothing here prints, aborts or exits. */
#ifndef CKV_EXAMPLES_LLM_MODEL_H
#define CKV_EXAMPLES_LLM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* File name of the reference model inside CKV_MODEL_DIR. */
#define CKV_MODEL_DEFAULT_FILE "stories260K.bin"

typedef struct ckv_model ckv_model;
typedef struct ckv_model_state ckv_model_state;

/* Geometry read from the checkpoint header; valid as long as the model is. */
typedef struct ckv_model_config {
  int dim;               /* residual stream width */
  int hidden_dim;        /* FFN hidden width */
  int n_layers;
  int n_heads;           /* query heads */
  int n_kv_heads;        /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
  int vocab_size;        /* always positive here (the file's sign is shared_classifier) */
  int seq_len;           /* maximum positions */
  int head_dim;          /* dim / n_heads; even (RoPE rotates pairs) */
  int kv_dim;            /* n_kv_heads * head_dim: floats of K (or V) per token per layer */
  bool shared_classifier; /* logits use the token embedding table */
} ckv_model_config;

/* Resolve the model path from the environment: $CKV_MODEL if set and
 * non-empty, else $CKV_MODEL_DIR/stories260K.bin.  Writes a NUL-terminated
 * path into buf (size bytes).  Does not check that the file exists.
 * Returns CKV_OK, CKV_ERR_NOT_FOUND when neither variable is set,
 * -ENAMETOOLONG when the path does not fit, CKV_ERR_INVALID on NULL/0 buf. */
int ckv_model_path_from_env(char *buf, size_t size);

/* Map a llama2.c legacy checkpoint read-only and validate it: a header of 7
 * little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len; negative vocab_size = separate classifier), all
 * positive, dim % n_heads == 0, n_heads % n_kv_heads == 0, and a file size
 * exactly equal to the header plus the float arrays it implies; every weight
 * must be finite.  On success *ret owns the mapping (free with
 * ckv_model_free); *ret is untouched on failure.
 * Returns CKV_OK; CKV_ERR_INVALID (NULL argument); -errno from open/fstat/mmap
 * (-ENOENT for a missing file, -EISDIR for a directory); CKV_ERR_INVALID
 * (another non-regular file); CKV_ERR_CORRUPT
 * (truncated or oversized file, impossible header, non-finite weight);
 * CKV_ERR_FORMAT (a llama2.c version-1+ export with the "ak42" magic, or an
 * odd head_dim that RoPE cannot rotate); CKV_ERR_UNSUPPORTED (big-endian host);
 * -ENOMEM. */
int ckv_model_load(const char *path, ckv_model **ret);

/* Unmap and free.  NULL is fine.  All states made from m must be freed first
 * (they are not used by this call, but are useless afterwards).  Returns NULL. */
ckv_model *ckv_model_free(ckv_model *m);

/* The model's geometry (owned by m).  m must not be NULL. */
const ckv_model_config *ckv_model_config_get(const ckv_model *m);

/* ---- per-sequence state ------------------------------------------------- */

/* Allocate the activations for one sequence of model m (which must outlive
 * the state).  With private_cache, also allocate an FP32 KV cache of
 * n_layers x seq_len x kv_dim floats for K and for V, used by
 * ckv_model_forward(); without it (the caller keeps the cache elsewhere)
 * ckv_model_forward() returns CKV_ERR_STATE.
 * Returns CKV_OK, CKV_ERR_INVALID, -ENOMEM. */
int ckv_model_state_new(const ckv_model *m, bool private_cache, ckv_model_state **ret);

/* Free a state; NULL is fine.  Returns NULL. */
ckv_model_state *ckv_model_state_free(ckv_model_state *s);

/* Forget the private cache (length 0); the next forward must use pos 0. */
void ckv_model_state_reset(ckv_model_state *s);

/* Step 1 of a token: x = token_embedding[token].
 * Returns CKV_OK, CKV_ERR_INVALID (NULL, foreign state), CKV_ERR_RANGE
 * (token outside [0, vocab_size)). */
int ckv_model_embed(const ckv_model *m, ckv_model_state *s, int token);

/* Step 2, per layer: xb = rmsnorm(x); q, k, v = wq, wk, wv @ xb; q and k
 * rotated by RoPE (theta 10000) at position pos.  Afterwards
 * ckv_model_state_q/k/v() hold the results until the next call on s.
 * Layers must come in order 0..n_layers-1, each after ckv_model_embed() or
 * the previous layer's ckv_model_finish_layer().
 * Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_RANGE (layer or pos outside the
 * model), CKV_ERR_STATE (called out of order). */
int ckv_model_qkv(const ckv_model *m, ckv_model_state *s, int layer, int pos);

/* The current layer's q (n_heads*head_dim floats, head-major), k and v
 * (kv_dim floats each, kv-head-major), owned by s. */
const float *ckv_model_state_q(const ckv_model_state *s);
const float *ckv_model_state_k(const ckv_model_state *s);
const float *ckv_model_state_v(const ckv_model_state *s);

/* A dim-float scratch buffer owned by s, free for the caller to receive the
 * attention output (ckv_model_finish_layer accepts it as attn_out). */
float *ckv_model_state_attn_buf(ckv_model_state *s);

/* Step 3, per layer, after ckv_model_qkv(m, s, layer, ...): x += wo @ attn_out
 * (attn_out: dim floats, query heads concatenated); then
 * x += w2 @ (silu(w1 @ rmsnorm(x)) * (w3 @ rmsnorm(x))).  attn_out is only read.
 * Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_RANGE, CKV_ERR_STATE. */
int ckv_model_finish_layer(const ckv_model *m, ckv_model_state *s, int layer, const float *attn_out);

/* Step 4, after the last layer: ret_logits[vocab_size] = classifier @
 * rmsnorm(x).  Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_STATE. */
int ckv_model_logits(const ckv_model *m, ckv_model_state *s, float *ret_logits);

/* The token's final hidden state, rmsnorm(x) with the final norm's weights
 * (dim floats, owned by s): what the classifier read.  Valid after
 * ckv_model_logits() until the next call on s. */
const float *ckv_model_state_hidden(const ckv_model_state *s);

/* Reference attention over a plain FP32 cache of one layer.  Row t (t <
 * n_pos) of the cache is k_cache + t*row_stride (and likewise v_cache): kv_dim
 * floats, KV heads concatenated.  For each query head h, with kv head
 * g = h / (n_heads / n_kv_heads):
 *   ret_out[h*head_dim..] = sum_t softmax_t(q_h . k_{t,g} / sqrt(head_dim)) v_{t,g}.
 * If ret_probs is not NULL it receives n_pos floats: each position's
 * attention probability summed over the query heads (they add up to n_heads).
 * ret_out (dim floats) must not alias q or the cache.
 * Returns CKV_OK or CKV_ERR_INVALID (NULL pointer, n_pos < 1,
 * row_stride < kv_dim, inconsistent config). */
int ckv_model_attend_fp32(const ckv_model_config *c, const float *q, const float *k_cache,
                          const float *v_cache, size_t row_stride, int n_pos, float *ret_out,
                          float *ret_probs);

/* Full forward of one token at position pos over the state's private cache:
 * embed, then per layer qkv, store k/v at (layer, pos), ckv_model_attend_fp32
 * over positions 0..pos, finish_layer; then logits into ret_logits
 * (vocab_size floats).  pos may equal the cache length (append) or be smaller
 * (rewind: the cache is truncated to pos+1).
 * Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_STATE (no private cache),
 * CKV_ERR_RANGE (token out of range, pos > cache length or pos >= seq_len). */
int ckv_model_forward(const ckv_model *m, ckv_model_state *s, int token, int pos, float *ret_logits);

/* Number of positions held by the private cache (0 without one). */
int ckv_model_cache_len(const ckv_model_state *s);

/* Read the private cache: *ret_k and *ret_v point at kv_dim floats each,
 * owned by s and valid until the next forward/reset.
 * Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_STATE (no private cache),
 * CKV_ERR_RANGE (layer out of range or pos >= cache length). */
int ckv_model_cache_kv(const ckv_model_state *s, int layer, int pos, const float **ret_k,
                       const float **ret_v);

/* ---- deterministic utilities -------------------------------------------- */

/* Index of the largest of x[0..n-1] (the first one on ties); -1 if n < 1. */
int ckv_model_argmax(const float *x, int n);

/* In-place softmax of x[0..n-1] (max-subtracted; n >= 1). */
void ckv_model_softmax(float *x, int n);

/* KL(p_ref || p_test) in nats, where p = softmax(logits), computed in double
 * through log-sum-exp so large logits do not overflow.  Always >= 0 (tiny
 * negative rounding is clamped to 0).  Returns NAN if n < 1 or an input
 * is not finite. */
double ckv_model_kl(const float *ref_logits, const float *test_logits, int n);

/* A seeded PRNG (splitmix64): same seed, same stream, on every platform. */
typedef struct ckv_model_rng {
  uint64_t state;
} ckv_model_rng;

void ckv_model_rng_seed(ckv_model_rng *r, uint64_t seed);
uint64_t ckv_model_rng_next(ckv_model_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float ckv_model_rng_uniform(ckv_model_rng *r);

/* Sample an index from softmax(logits / temperature) with one draw of r.
 * temperature <= 0 (or not finite) means greedy (argmax, r untouched).
 * Returns the index, or -1 if n < 1. */
int ckv_model_sample(const float *logits, int n, float temperature, ckv_model_rng *r);

#ifdef __cplusplus
}
#endif
#endif
