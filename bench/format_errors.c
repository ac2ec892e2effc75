/* format_errors.c - see format_errors.h. */
#include "bench/format_errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "examples/llm/dialogues.h"
#include "examples/llm/model.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

/* kept_quarters: key channels kept per head, in quarters of head_dim (0: no
 * pruning): the committed KIVI formats with ThinK-style key-channel pruning
 * (kernels/prune.c), to see whether dropping channels pays at real head_dims. */
static const struct {
  const char *name;
  uint32_t format, kept_quarters;
} k_formats[CKV_FORMAT_ERRORS_MAX] = {
    {"int8", CKV_FORMAT_STAGED, 0},   {"kivi4", CKV_FORMAT_COMMIT4, 0},     {"kivi4-keys75", CKV_FORMAT_COMMIT4, 3},
    {"kivi4-keys50", CKV_FORMAT_COMMIT4, 2}, {"kivi2", CKV_FORMAT_COMMIT2, 0}, {"rot4", CKV_FORMAT_ROT4, 0},
    {"rot3", CKV_FORMAT_ROT3, 0},     {"rot2", CKV_FORMAT_ROT2, 0},         {"rot1", CKV_FORMAT_ROT1, 0},
};

static void *new_block(uint32_t fmt, const ckv_geometry *g, uint32_t cap, uint32_t kept) {
  size_t n = ckv_format_block_bytes(fmt, g, cap, kept);
  void *b = n ? aligned_alloc(64, (n + 63u) / 64u * 64u) : NULL;
  if (b && ckv_block_init(b, fmt, g, cap, kept, 1) != CKV_OK) {
    free(b);
    b = NULL;
  }
  return b;
}

int ckv_format_errors_measure(const ckv_geometry *g, const uint16_t *kv, size_t n, ckv_format_errors *out) {
  const uint32_t cap = CKV_DEFAULT_CAPACITY_COMMIT;
  const size_t te = ckv_draft_token_elems(g), tok = (size_t)g->n_layers * 2u * te;
  size_t n_blocks = (n + cap - 1) / cap;
  if (!n || !ckv_format_valid(CKV_FORMAT_DRAFT, g, cap, 0)) return CKV_ERR_INVALID;
  void **draft = calloc(n_blocks, sizeof(void *));
  float *x = malloc(te * sizeof(float)), *y = malloc(te * sizeof(float));
  ckv_move *moves = malloc(cap * sizeof(ckv_move));
  int rows = draft && x && y && moves ? 0 : -12;
  /* the tokens in draft blocks of cap slots */
  for (size_t b = 0; b < n_blocks && rows == 0; b++) {
    if (!(draft[b] = new_block(CKV_FORMAT_DRAFT, g, cap, 0))) {
      rows = -12;
      break;
    }
    for (uint32_t s = 0; s < cap && b * cap + s < n; s++) {
      const uint16_t *t = kv + (b * cap + s) * tok;
      for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
          memcpy((uint8_t *)draft[b] + ckv_draft_kv_offset(g, cap, l, k, s), t + ((size_t)l * 2u + k) * te, te * 2u);
      ckv_block_positions(draft[b])[s] = (uint32_t)(b * cap + s);
      ckv_block_set_valid(draft[b], s, true);
    }
  }
  for (int f = 0; f < CKV_FORMAT_ERRORS_MAX && rows >= 0; f++) {
    uint32_t fmt = k_formats[f].format, kept = g->head_dim * k_formats[f].kept_quarters / 4u;
    if (!ckv_format_valid(fmt, g, cap, kept)) continue;
    double e2[2] = {0, 0}, x2[2] = {0, 0};
    for (size_t b = 0; b < n_blocks && rows >= 0; b++) {
      void *dst = new_block(fmt, g, cap, kept);
      uint32_t m = 0;
      for (uint32_t s = 0; s < cap && b * cap + s < n; s++)
        moves[m++] = (ckv_move){.src = draft[b], .src_slot = s, .dst = dst, .dst_slot = s};
      if (!dst || (kept && ckv_kernels_prune_keys(g, moves, m) != CKV_OK) ||
          ckv_kernels_move(g, moves, m, CKV_MOVE_SET_VALID) != CKV_OK)
        rows = dst ? CKV_ERR_INTERNAL : -12;
      for (uint32_t s = 0; s < m && rows >= 0; s++)
        for (uint32_t l = 0; l < g->n_layers; l++)
          for (uint32_t k = 0; k < 2; k++) {
            if (ckv_kernels_dequantize(g, draft[b], l, k, s, x) != CKV_OK ||
                ckv_kernels_dequantize(g, dst, l, k, s, y) != CKV_OK) {
              rows = CKV_ERR_INTERNAL;
              break;
            }
            for (size_t e = 0; e < te; e++) {
              e2[k] += ((double)x[e] - y[e]) * ((double)x[e] - y[e]);
              x2[k] += (double)x[e] * x[e];
            }
          }
      free(dst);
    }
    if (rows < 0) break;
    out[rows++] = (ckv_format_errors){.name = k_formats[f].name, .format = fmt,
                                      .bits_per_element = ckv_format_bits_per_element(fmt, g, cap, kept),
                                      .key_rel_error = x2[0] > 0 ? sqrt(e2[0] / x2[0]) : 0,
                                      .value_rel_error = x2[1] > 0 ? sqrt(e2[1] / x2[1]) : 0};
  }
  for (size_t b = 0; draft && b < n_blocks; b++) free(draft[b]);
  free(draft);
  free(x);
  free(y);
  free(moves);
  return rows;
}

/* Feeds one token at position pos of its sequence; stores its K/V of every layer (FP16) as token n of kv. */
static int feed(const ckv_model *m, ckv_model_state *st, const ckv_model_config *c, int token, size_t pos, size_t n,
                uint16_t *kv, float *logits) {
  int r = ckv_model_forward(m, st, token, (int)pos, logits);
  if (r < 0) return r;
  size_t te = (size_t)c->n_kv_heads * c->head_dim, tok = (size_t)c->n_layers * 2u * te;
  for (int l = 0; l < c->n_layers; l++) {
    const float *k, *v;
    if ((r = ckv_model_cache_kv(st, l, (int)pos, &k, &v)) < 0) return r;
    for (size_t e = 0; e < te; e++) {
      kv[n * tok + ((size_t)l * 2u) * te + e] = ckv_f32_to_f16(k[e]);
      kv[n * tok + ((size_t)l * 2u + 1u) * te + e] = ckv_f32_to_f16(v[e]);
    }
  }
  return 0;
}

int ckv_format_errors_model_kv(const char *model_path, const char *data_path, size_t max_tokens, int bos,
                               uint16_t **ret_kv, size_t *ret_n, ckv_geometry *ret_g) {
  ckv_model *m = NULL;
  ckv_model_state *st = NULL;
  dialogue_set ds = {0};
  char err[256];
  int r = ckv_model_load(model_path, &m);
  if (r < 0) return r;
  const ckv_model_config *c = ckv_model_config_get(m);
  *ret_g = (ckv_geometry){(uint32_t)c->n_layers, (uint32_t)c->n_kv_heads, (uint32_t)c->head_dim, CKV_DTYPE_FP16};
  size_t tok = (size_t)c->n_layers * 2u * c->n_kv_heads * c->head_dim, n = 0;
  uint16_t *kv = malloc(max_tokens * tok * sizeof(uint16_t));
  float *logits = malloc((size_t)c->vocab_size * sizeof(float));
  if (!kv || !logits) r = -12;
  if (r == 0) r = dialogue_set_load(data_path, 0, &ds, err, sizeof err);
  if (r == 0) r = ckv_model_state_new(m, true, &st);
  for (size_t d = 0; r == 0 && d < ds.n && n < max_tokens; d++) {
    ckv_model_state_reset(st);
    size_t pos = 0, base = n;
    r = feed(m, st, c, bos, pos, base + pos, kv, logits);
    pos++;
    for (size_t t = 0; r == 0 && t < ds.d[d].n_turns && base + pos < max_tokens && (int)pos < c->seq_len; t++) {
      const dialogue_turn *tu = &ds.d[d].turns[t];
      char head[3] = {tu->role, ':', ' '};
      for (size_t i = 0; r == 0 && i < 3 + tu->len + 1 && base + pos < max_tokens && (int)pos < c->seq_len; i++) {
        unsigned char b = i < 3 ? (unsigned char)head[i] : i < 3 + tu->len ? (unsigned char)tu->text[i - 3] : '\n';
        r = feed(m, st, c, b, pos, base + pos, kv, logits);
        pos++;
      }
    }
    n = base + pos;
  }
  ckv_model_state_free(st);
  dialogue_set_free(&ds);
  ckv_model_free(m);
  free(logits);
  if (r < 0) {
    free(kv);
    return r;
  }
  *ret_kv = kv;
  *ret_n = n;
  return 0;
}
