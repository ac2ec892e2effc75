/* semantic.c - semantic scores from embeddings (commitkv/semantic.h says
 * what they are): unit vectors, centring, the current topic's task,
 * relevance and novelty per turn, then each token takes its turn's score;
 * and the token-by-token collector a worker feeds as it runs its model.
 *
 * Sums and dot products run in double, so the result does not depend on
 * how a compiler reassociates float arithmetic within a build. */
#include "commitkv/semantic.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"

ckv_semantic_weights ckv_semantic_weights_default(void) {
  return (ckv_semantic_weights){.task = 0.6f, .novelty = 0.4f, .abandoned = 0.5f, .invalid = 0.5f};
}

static int unit_range(float x) { return x >= 0.f && x <= 1.f; } /* false for NaN too */

static double dot(const double *a, const double *b, size_t dim) {
  double s = 0;
  for (size_t i = 0; i < dim; i++) s += a[i] * b[i];
  return s;
}

/* v scaled to unit length in place; 0 (and v all zeros) when it has
 * (numerically) no length. */
static int normalise(double *v, size_t dim) {
  double n = sqrt(dot(v, v, dim));
  if (!(n > 1e-12)) {
    memset(v, 0, dim * sizeof(*v));
    return 0;
  }
  for (size_t i = 0; i < dim; i++) v[i] /= n;
  return 1;
}

/* Row t of e as a unit vector into u; 0 when it has a non-finite value or
 * no length (an unusable turn). */
static int unit_row(const float *e, size_t dim, double *u) {
  for (size_t i = 0; i < dim; i++) {
    if (!isfinite(e[i])) return 0;
    u[i] = e[i];
  }
  return normalise(u, dim);
}

/* Cosine of two rows that are unit length or zero (a zero row: 0). */
static double cosine(const double *a, const double *b, size_t dim) { return dot(a, b, dim); }

/* One score per turn into score[]; u holds n_turns x dim doubles and
 * work dim more. */
static void score_turns(const float *emb, size_t n_turns, size_t dim, const uint8_t *flags,
                        const ckv_semantic_weights *w, double *u, unsigned char *ok, double *work, float *score) {
  size_t usable = 0, topic = 0;
  for (size_t t = 0; t < n_turns; t++) {
    usable += ok[t] = (unsigned char)unit_row(emb + t * dim, dim, u + t * dim);
    if (flags && (flags[t] & CKV_SEMANTIC_TOPIC_SHIFT)) topic = t;
  }
  double *mean = work;
  memset(mean, 0, dim * sizeof(*mean));
  if (usable >= CKV_SEMANTIC_CENTER_MIN) {
    for (size_t t = 0; t < n_turns; t++)
      for (size_t i = 0; ok[t] && i < dim; i++) mean[i] += u[t * dim + i] / (double)usable;
    for (size_t t = 0; t < n_turns; t++) {
      if (!ok[t]) continue;
      for (size_t i = 0; i < dim; i++) u[t * dim + i] -= mean[i];
      normalise(u + t * dim, dim); /* a turn equal to the mean stays zero: no similarity to anything */
    }
  }
  double *task = work; /* the mean is no longer needed */
  memset(task, 0, dim * sizeof(*task));
  int flagged = 0;
  for (size_t t = topic; flags && t < n_turns; t++)
    if (ok[t] && (flags[t] & CKV_SEMANTIC_TASK)) {
      flagged = 1;
      for (size_t i = 0; i < dim; i++) task[i] += u[t * dim + i];
    }
  for (size_t t = topic; !flagged && t < n_turns; t++)
    if (ok[t]) {
      memcpy(task, u + t * dim, dim * sizeof(*task));
      break;
    }
  normalise(task, dim);
  for (size_t t = 0; t < n_turns; t++) {
    if (!ok[t]) {
      score[t] = w->invalid;
      continue;
    }
    double rel = fmax(0.0, cosine(u + t * dim, task, dim)), seen = 0.0;
    for (size_t s = 0; s < t; s++)
      if (ok[s]) seen = fmax(seen, cosine(u + t * dim, u + s * dim, dim));
    double v = (double)w->task * rel + (double)w->novelty * (1.0 - seen);
    if (t < topic) v *= (double)w->abandoned;
    score[t] = (float)fmin(1.0, fmax(0.0, v));
  }
}

int ckv_semantic_from_embeddings(const float *embeddings, size_t n_turns, size_t dim, const uint8_t *turn_flags,
                                 const uint32_t *token_turn, size_t n_tokens, const ckv_semantic_weights *weights,
                                 float *ret_scores) {
  ckv_semantic_weights w = weights ? *weights : ckv_semantic_weights_default();
  if (!embeddings || !n_turns || !dim || dim > CKV_SEMANTIC_MAX_DIM || (n_tokens && (!token_turn || !ret_scores)))
    return CKV_ERR_INVALID;
  if (!unit_range(w.task) || !unit_range(w.novelty) || !unit_range(w.abandoned) || !unit_range(w.invalid) ||
      w.task + w.novelty > 1.f + 1e-6f)
    return CKV_ERR_INVALID;
  for (size_t i = 0; i < n_tokens; i++)
    if (token_turn[i] >= n_turns) return CKV_ERR_RANGE;
  if (n_turns >= SIZE_MAX / sizeof(double) / dim) return CKV_ERR_TOO_LARGE; /* n_turns + 1 rows below */
  double *u = malloc((n_turns + 1) * dim * sizeof(double));
  unsigned char *ok = malloc(n_turns);
  float *score = malloc(n_turns * sizeof(float));
  int r = u && ok && score ? CKV_OK : -ENOMEM;
  if (r == CKV_OK) {
    score_turns(embeddings, n_turns, dim, turn_flags, &w, u, ok, u + n_turns * dim, score);
    for (size_t i = 0; i < n_tokens; i++) ret_scores[i] = score[token_turn[i]];
  }
  free(u);
  free(ok);
  free(score);
  return r;
}

/* ---- token by token --------------------------------------------------------- */

struct ckv_semantic_turns {
  size_t dim;
  float *sums;          /* per turn: the sum of its tokens' embeddings */
  uint8_t *flags;       /* per turn */
  size_t n_turns, cap_sums, cap_flags;
  uint32_t *token_turn; /* per token */
  size_t n_tokens, cap_tokens;
};

int ckv_semantic_turns_new(size_t dim, ckv_semantic_turns **ret) {
  if (!dim || dim > CKV_SEMANTIC_MAX_DIM || !ret) return CKV_ERR_INVALID;
  ckv_semantic_turns *t = calloc(1, sizeof(*t));
  if (!t) return -ENOMEM;
  t->dim = dim;
  *ret = t;
  return CKV_OK;
}

ckv_semantic_turns *ckv_semantic_turns_free(ckv_semantic_turns *t) {
  if (t) {
    free(t->sums);
    free(t->flags);
    free(t->token_turn);
    free(t);
  }
  return NULL;
}

/* Room for one more element of `size` bytes in *v (capacity *cap). */
static int grow(void **v, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return CKV_OK;
  size_t nc = *cap ? 2 * *cap : 64;
  if (nc > SIZE_MAX / size) return -ENOMEM;
  void *nv = realloc(*v, nc * size);
  if (!nv) return -ENOMEM;
  *v = nv;
  *cap = nc;
  return CKV_OK;
}

int ckv_semantic_turns_add(ckv_semantic_turns *t, const float *embedding, int new_turn) {
  if (!t || !embedding) return CKV_ERR_INVALID;
  if (t->n_tokens >= UINT32_MAX) return CKV_ERR_LIMIT;
  if (new_turn || !t->n_turns) {
    int r = grow((void **)&t->flags, &t->cap_flags, t->n_turns, 1);
    if (r == CKV_OK) r = grow((void **)&t->sums, &t->cap_sums, t->n_turns, t->dim * sizeof(float));
    if (r < 0) return r;
    memset(t->sums + t->n_turns * t->dim, 0, t->dim * sizeof(float));
    t->flags[t->n_turns++] = 0;
  }
  int r = grow((void **)&t->token_turn, &t->cap_tokens, t->n_tokens, sizeof(uint32_t));
  if (r < 0) return r;
  float *sum = t->sums + (t->n_turns - 1) * t->dim;
  for (size_t i = 0; i < t->dim; i++) sum[i] += embedding[i];
  t->token_turn[t->n_tokens++] = (uint32_t)(t->n_turns - 1);
  return CKV_OK;
}

int ckv_semantic_turns_mark(ckv_semantic_turns *t, uint8_t flags) {
  if (!t) return CKV_ERR_INVALID;
  if (!t->n_turns) return CKV_ERR_STATE;
  t->flags[t->n_turns - 1] |= flags;
  return CKV_OK;
}

size_t ckv_semantic_turns_tokens(const ckv_semantic_turns *t) { return t ? t->n_tokens : 0; }

int ckv_semantic_turns_scores(const ckv_semantic_turns *t, const ckv_semantic_weights *weights, float *ret_scores) {
  if (!t || !ret_scores) return CKV_ERR_INVALID;
  if (!t->n_tokens) return CKV_ERR_STATE;
  return ckv_semantic_from_embeddings(t->sums, t->n_turns, t->dim, t->flags, t->token_turn, t->n_tokens, weights,
                                      ret_scores);
}
