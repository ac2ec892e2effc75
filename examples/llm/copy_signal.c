/* copy_signal.c - which turns the model copies from (see copy_signal.h). */
#include "examples/llm/copy_signal.h"

#include <errno.h>
#include <stdlib.h>

#include "commitkv/status.h"

struct llm_copy_signal {
  float nats, copy_nats; /* of an n-gram: surprising at or above, predicted below */
  size_t cap, n, n_turns;
  uint32_t *id;
  float *s;
  uint32_t *turn_of;     /* per position: its turn */
  uint8_t *raised;       /* per position: its turn is raised */
  uint64_t *turn_first;  /* per turn: its first position */
  uint8_t *turn_raised, *turn_judged;
  uint32_t *table;       /* open addressing: position + 1 of a surprising n-gram's last token, 0 empty */
  size_t mask;
};

void llm_copy_signal_free(llm_copy_signal *c) {
  if (!c) return;
  free(c->id);
  free(c->s);
  free(c->turn_of);
  free(c->raised);
  free(c->turn_first);
  free(c->turn_raised);
  free(c->turn_judged);
  free(c->table);
  free(c);
}

int llm_copy_signal_new(size_t cap, float nats, float copy_nats, llm_copy_signal **ret) {
  *ret = NULL;
  if (!cap || cap > UINT32_MAX / 2) return CKV_ERR_INVALID;
  llm_copy_signal *c = calloc(1, sizeof(*c));
  if (!c) return -ENOMEM;
  size_t slots = 16;
  while (slots < 2 * cap) slots *= 2;
  *c = (llm_copy_signal){.nats = nats, .copy_nats = copy_nats, .cap = cap, .mask = slots - 1};
  c->id = malloc(cap * sizeof(*c->id));
  c->s = malloc(cap * sizeof(*c->s));
  c->turn_of = malloc(cap * sizeof(*c->turn_of));
  c->raised = calloc(cap, 1);
  c->turn_first = malloc(cap * sizeof(*c->turn_first));
  c->turn_raised = calloc(cap, 1);
  c->turn_judged = calloc(cap, 1);
  c->table = calloc(slots, sizeof(*c->table));
  if (!c->id || !c->s || !c->turn_of || !c->raised || !c->turn_first || !c->turn_raised || !c->turn_judged ||
      !c->table) {
    llm_copy_signal_free(c);
    return -ENOMEM;
  }
  *ret = c;
  return CKV_OK;
}

/* The n-gram ending at pos (pos >= LLM_COPY_NGRAM - 1). */
static size_t ngram_hash(const llm_copy_signal *c, size_t pos) {
  uint64_t h = 1469598103934665603ull;
  for (size_t k = 0; k < LLM_COPY_NGRAM; k++) h = (h ^ c->id[pos - k]) * 1099511628211ull;
  return (size_t)(h ^ (h >> 29)) & c->mask;
}

static bool ngram_equal(const llm_copy_signal *c, size_t a, size_t b) {
  for (size_t k = 0; k < LLM_COPY_NGRAM; k++)
    if (c->id[a - k] != c->id[b - k]) return false;
  return true;
}

/* Raises turn t (every position it holds so far): 1, or 0 when it is judged or already raised. */
static unsigned raise_turn(llm_copy_signal *c, size_t t) {
  if (c->turn_judged[t] || c->turn_raised[t]) return 0;
  c->turn_raised[t] = 1;
  size_t end = t + 1 < c->n_turns ? (size_t)c->turn_first[t + 1] : c->n;
  for (size_t p = (size_t)c->turn_first[t]; p < end; p++) c->raised[p] = 1;
  return 1;
}

unsigned llm_copy_signal_add(llm_copy_signal *c, uint64_t pos, uint32_t id, float s, bool turn_start, bool judged) {
  if (pos != c->n || pos >= c->cap) return 0; /* seen already (a re-prefill), or beyond the stream */
  if (turn_start || !c->n_turns) {
    c->turn_first[c->n_turns] = pos;
    c->turn_judged[c->n_turns] = judged;
    c->turn_raised[c->n_turns] = 0;
    c->n_turns++;
  }
  size_t t = c->n_turns - 1, p = (size_t)pos;
  c->id[p] = id;
  c->s[p] = s;
  c->turn_of[p] = (uint32_t)t;
  c->raised[p] = c->turn_raised[t];
  c->n++;
  /* n-grams within a turn's body: the turn's first token (a role marker) and
   * the turns around it are the dialogue's frame, said again every turn */
  if (p < (size_t)c->turn_first[t] + LLM_COPY_NGRAM) return 0;
  size_t h = ngram_hash(c, p);
  unsigned r = 0;
  float sum = 0.f; /* the n-gram's surprisal */
  for (size_t k = 0; k < LLM_COPY_NGRAM; k++) sum += c->s[p - k];
  if (sum < c->copy_nats) { /* predicted: from the context? */
    for (size_t i = h; c->table[i]; i = (i + 1) & c->mask) {
      size_t j = c->table[i] - 1;
      if (c->turn_of[j] != t && ngram_equal(c, j, p)) {
        r = raise_turn(c, c->turn_of[j]) + raise_turn(c, t);
        break;
      }
    }
  } else if (sum >= c->nats) { /* surprising: a later copy may find it */
    size_t i = h;
    while (c->table[i]) i = (i + 1) & c->mask;
    c->table[i] = (uint32_t)p + 1;
  }
  return r;
}

const uint8_t *llm_copy_signal_raised(const llm_copy_signal *c) { return c->raised; }
