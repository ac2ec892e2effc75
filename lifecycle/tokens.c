/* tokens.c - the per-token column store (see tokens.h). */
#include "lifecycle/tokens.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"

_Static_assert(CKV_TOKENS_BYTES_PER_TOKEN <= 32, "per-token metadata must stay within 32 bytes");

static float g_decode[256];
static int g_decode_ready;

static void decode_init(void) {
  for (int i = 0; i < 256; i++) g_decode[i] = exp2f((float)i / 32.f) - 1.f;
  g_decode_ready = 1;
}

float ckv_attn_decode(uint8_t code) {
  if (!g_decode_ready) decode_init(); /* idempotent: racing threads write the same values */
  return g_decode[code];
}

uint8_t ckv_attn_encode(float rel) {
  if (!(rel > 0.f)) return 0;
  float c = 32.f * log2f(1.f + rel) + 0.5f;
  return c >= 255.f ? 255 : (uint8_t)c;
}

void ckv_tokens_init(ckv_tokens *t) { memset(t, 0, sizeof(*t)); }

void ckv_tokens_done(ckv_tokens *t) {
  free(t->state);
  free(t->role);
  free(t->tags);
  free(t->flags);
  free(t->block);
  free(t->slot);
  free(t->semantic);
  free(t->attn);
  free(t->last_attended);
  free(t->last_transition);
  free(t->cum_attn);
  memset(t, 0, sizeof(*t));
}

static int grow_col(void **col, size_t elem, size_t old_cap, size_t new_cap) {
  void *p = realloc(*col, elem * new_cap);
  if (!p) return -ENOMEM;
  memset((char *)p + elem * old_cap, 0, elem * (new_cap - old_cap));
  *col = p;
  return CKV_OK;
}

int ckv_tokens_reserve(ckv_tokens *t, size_t extra) {
  if (t->n + extra <= t->cap) return CKV_OK;
  size_t ncap = t->cap ? t->cap : 256;
  while (ncap < t->n + extra) ncap *= 2;
  /* A failure part-way leaves some columns larger but cap unchanged: still consistent. */
  if (grow_col((void **)&t->state, 1, t->cap, ncap) || grow_col((void **)&t->role, 1, t->cap, ncap) ||
      grow_col((void **)&t->tags, 1, t->cap, ncap) || grow_col((void **)&t->flags, 1, t->cap, ncap) ||
      grow_col((void **)&t->block, 4, t->cap, ncap) || grow_col((void **)&t->slot, 2, t->cap, ncap) ||
      grow_col((void **)&t->semantic, 2, t->cap, ncap) ||
      grow_col((void **)&t->attn, CKV_ATTN_HISTORY, t->cap, ncap) ||
      grow_col((void **)&t->last_attended, 4, t->cap, ncap) ||
      grow_col((void **)&t->last_transition, 4, t->cap, ncap) || grow_col((void **)&t->cum_attn, 4, t->cap, ncap))
    return -ENOMEM;
  t->cap = ncap;
  return CKV_OK;
}

size_t ckv_tokens_push(ckv_tokens *t, uint8_t role, uint8_t tags, float semantic, uint32_t round, uint32_t block,
                       uint16_t slot) {
  size_t p = t->n++;
  t->state[p] = CKV_STATE_DRAFT;
  t->role[p] = role;
  t->tags[p] = tags;
  t->flags[p] = semantic >= 0.f ? CKV_TOKEN_SEM_GIVEN : 0;
  t->block[p] = block;
  t->slot[p] = slot;
  t->semantic[p] = ckv_q16_from_unit(semantic);
  memset(&t->attn[p * CKV_ATTN_HISTORY], 0, CKV_ATTN_HISTORY);
  t->last_attended[p] = round;
  t->last_transition[p] = round;
  t->cum_attn[p] = 0.f;
  return p;
}

void ckv_tokens_record_round(ckv_tokens *t, uint32_t round, size_t first, const float *attn, size_t n, size_t live) {
  const size_t ring = round % CKV_ATTN_HISTORY;
  const size_t end = first + n < t->n ? first + n : t->n;
  double sum = 0.0;
  for (size_t p = first; p < end; p++) {
    float a = attn[p - first];
    if (a > 0.f && !isinf(a) && t->state[p] != CKV_STATE_RECYCLED) sum += a;
  }
  /* mean mass per live token -> relative scale; no mass at all records zeros */
  const float inv = sum > 0.0 && live ? (float)((double)live / sum) : 0.f;
  for (size_t p = 0; p < t->n; p++) {
    float a = (p >= first && p < end) ? attn[p - first] : 0.f;
    if (!(a > 0.f) || isinf(a) || t->state[p] == CKV_STATE_RECYCLED) a = 0.f; /* NaN/negative/inf count as nothing */
    float rel = a * inv;
    t->attn[p * CKV_ATTN_HISTORY + ring] = ckv_attn_encode(rel);
    t->cum_attn[p] += rel;
    if (rel >= CKV_ATTENDED_FLOOR) t->last_attended[p] = round;
  }
}

float ckv_tokens_attn_mean(const ckv_tokens *t, size_t pos, uint32_t round, uint32_t rounds) {
  if (rounds > CKV_ATTN_HISTORY) rounds = CKV_ATTN_HISTORY;
  if (rounds > round) rounds = round;
  if (!rounds) return 0.f;
  float s = 0.f;
  for (uint32_t i = 0; i < rounds; i++) s += ckv_attn_decode(t->attn[pos * CKV_ATTN_HISTORY + (round - i) % CKV_ATTN_HISTORY]);
  return s / (float)rounds;
}

float ckv_tokens_attn_min(const ckv_tokens *t, size_t pos, uint32_t round, uint32_t rounds) {
  if (rounds > CKV_ATTN_HISTORY) rounds = CKV_ATTN_HISTORY;
  if (rounds > round) rounds = round;
  if (!rounds) return 0.f;
  float m = INFINITY;
  for (uint32_t i = 0; i < rounds; i++) {
    float v = ckv_attn_decode(t->attn[pos * CKV_ATTN_HISTORY + (round - i) % CKV_ATTN_HISTORY]);
    if (v < m) m = v;
  }
  return m;
}

float ckv_tokens_attn_max(const ckv_tokens *t, size_t pos, uint32_t round, uint32_t rounds) {
  if (rounds > CKV_ATTN_HISTORY) rounds = CKV_ATTN_HISTORY;
  if (rounds > round) rounds = round;
  uint8_t m = 0;
  for (uint32_t i = 0; i < rounds; i++) {
    uint8_t v = t->attn[pos * CKV_ATTN_HISTORY + (round - i) % CKV_ATTN_HISTORY];
    if (v > m) m = v;
  }
  return ckv_attn_decode(m);
}
