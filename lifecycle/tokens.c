/* tokens.c - the per-token column store (see tokens.h).
 *
 * The attention code of a round is written for every token every round, so
 * its encoder is table-driven: the float's exponent and top 6 mantissa bits
 * select a bin, each bin holds at most one code boundary (a bin spans at most
 * 1/64 relative, codes are at least 2.1% apart), and one integer compare
 * against that boundary gives the code.  The boundaries are found once, by
 * bisection on the defining formula round(32 * log2(1 + rel)) itself, so the
 * codes are the formula's for every float (test_tokens checks every float
 * bit pattern of the coded range against it). */
#include "lifecycle/tokens.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "lifecycle/record_simd.h"

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

/* The defining formula; used only to build the table below. */
static uint8_t encode_formula(float rel) {
  if (!(rel > 0.f)) return 0;
  float c = 32.f * log2f(1.f + rel) + 0.5f;
  return c >= 255.f ? 255 : (uint8_t)c;
}

/* Coded range [2^-7, 2^8): below it the formula gives 0 (0.86 before
 * truncation at 2^-7), from 2^8 on 255 (the last boundary is 246.8). */
#define ENC_LO CKV_ENC_LO
#define ENC_HI CKV_ENC_HI
#define ENC_SHIFT CKV_ENC_SHIFT
#define ENC_BINS CKV_ENC_BINS
#define ENC_NONE CKV_ENC_NONE

/* Entry = code at the bin's start << 24 | offset (low bits) of the first float
 * in the bin with the next code.  Entry 0 is "below the range", the last one
 * "at or above it". */
static uint32_t g_enc[ENC_BINS + 2];
static pthread_once_t g_enc_once = PTHREAD_ONCE_INIT;

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static void encode_init(void) {
  g_enc[0] = ENC_NONE;
  g_enc[ENC_BINS + 1] = 255u << 24 | ENC_NONE;
  for (uint32_t b = 0; b < ENC_BINS; b++) {
    uint32_t lo = ENC_LO + (b << ENC_SHIFT), hi = lo + ENC_NONE - 1;
    uint32_t base = encode_formula(float_of(lo)), off = ENC_NONE;
    if (encode_formula(float_of(hi)) > base) { /* bisect for the first float with a higher code */
      uint32_t a = lo, z = hi;                 /* code(a) == base, code(z) > base */
      while (z - a > 1) {
        uint32_t m = a + (z - a) / 2;
        if (encode_formula(float_of(m)) > base) z = m;
        else a = m;
      }
      off = z - lo;
    }
    g_enc[b + 1] = base << 24 | off;
  }
}

/* u: the bits of a float.  Negative values and NaN (bits above +inf's) code
 * 0, as in the formula; a round whose scale overflowed (inv = inf) gives
 * rel = 0 * inf = NaN for an unattended token. */
static inline uint8_t encode_bits(uint32_t u) {
  uint32_t i = u < ENC_LO || u > 0x7F800000u ? 0 : u >= ENC_HI ? ENC_BINS + 1 : ((u - ENC_LO) >> ENC_SHIFT) + 1;
  uint32_t e = g_enc[i];
  return (uint8_t)((e >> 24) + ((u & (ENC_NONE - 1)) >= (e & 0xFFFFFFu)));
}

uint8_t ckv_attn_encode(float rel) {
  if (!(rel > 0.f)) return 0; /* zero, negative, NaN */
  pthread_once(&g_enc_once, encode_init);
  uint32_t u;
  memcpy(&u, &rel, sizeof(u));
  return encode_bits(u);
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

int ckv_tokens_append_rows(ckv_tokens *dst, const ckv_tokens *src) {
  size_t n = src->n, d = dst->n;
  if (!n) return CKV_OK;
  int r = ckv_tokens_reserve(dst, n);
  if (r < 0) return r;
  memcpy(dst->state + d, src->state, n);
  memcpy(dst->role + d, src->role, n);
  memcpy(dst->tags + d, src->tags, n);
  memcpy(dst->flags + d, src->flags, n);
  memcpy(dst->block + d, src->block, n * sizeof(*src->block));
  memcpy(dst->slot + d, src->slot, n * sizeof(*src->slot));
  memcpy(dst->semantic + d, src->semantic, n * sizeof(*src->semantic));
  memcpy(dst->attn + d * CKV_ATTN_HISTORY, src->attn, n * CKV_ATTN_HISTORY);
  memcpy(dst->last_attended + d, src->last_attended, n * sizeof(*src->last_attended));
  memcpy(dst->last_transition + d, src->last_transition, n * sizeof(*src->last_transition));
  memcpy(dst->cum_attn + d, src->cum_attn, n * sizeof(*src->cum_attn));
  dst->n = d + n;
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

/* ---- which record pass runs (the CPU's best unless a test forces one) ---- */

static int g_record_path = -1; /* ckv_tokens_path; -1: not chosen yet */

static bool record_path_supported(ckv_tokens_path p) {
#if defined(__x86_64__)
  switch (p) {
    case CKV_TOKENS_PATH_SCALAR: return true;
    case CKV_TOKENS_PATH_AVX2: return __builtin_cpu_supports("avx2");
    case CKV_TOKENS_PATH_AVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return p == CKV_TOKENS_PATH_SCALAR;
#endif
}

static ckv_tokens_path record_path(void) {
  int p = __atomic_load_n(&g_record_path, __ATOMIC_RELAXED);
  if (p >= 0) return (ckv_tokens_path)p;
  p = record_path_supported(CKV_TOKENS_PATH_AVX512) ? CKV_TOKENS_PATH_AVX512
      : record_path_supported(CKV_TOKENS_PATH_AVX2) ? CKV_TOKENS_PATH_AVX2
                                                     : CKV_TOKENS_PATH_SCALAR;
  __atomic_store_n(&g_record_path, p, __ATOMIC_RELAXED); /* racing threads choose the same */
  return (ckv_tokens_path)p;
}

ckv_tokens_path ckv_tokens_vector_path(void) { return record_path(); }

int ckv_tokens_force_path(ckv_tokens_path p) {
  if ((int)p == -1) {
    __atomic_store_n(&g_record_path, -1, __ATOMIC_RELAXED);
    return CKV_OK;
  }
  if (!record_path_supported(p)) return CKV_ERR_UNSUPPORTED;
  __atomic_store_n(&g_record_path, (int)p, __ATOMIC_RELAXED);
  return CKV_OK;
}

/* The round's total mass, in a fixed order: lane k adds the masses of
 * positions first + k, first + k + 8, ... (each masked to +0.0 when not in
 * (0, FLT_MAX] or recycled: adding +0.0 leaves a lane's bits as they are),
 * then the eight lanes are added as a fixed tree.  Eight chains instead of
 * one (a 32K-token round was ~60% of the record pass waiting on one chain of
 * double adds); the vector path fills the same lanes with the same adds.
 * The order reaches the stored bytes only through (float)(live / sum): a
 * double sum of n floats in another order differs by at most ~n ulps of a
 * double, far below a float's, so the codes almost never change from the
 * one-chain sum this replaced; the fixed order keeps them a function of the
 * report alone. */
static double round_mass(const float *attn, const uint8_t *state, size_t first, size_t end, ckv_tokens_path path) {
  double lane[8] = {0};
  size_t p = first;
  if (path != CKV_TOKENS_PATH_SCALAR && end > first) p = ckv_record_mass_avx2(attn, state, first, end, lane);
  for (; p < end; p++) {
    float a = attn[p - first];
    lane[(p - first) & 7] += (a > 0.f && a <= FLT_MAX && state[p] != CKV_STATE_RECYCLED) ? (double)a : 0.0;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void ckv_tokens_record_round(ckv_tokens *t, uint32_t round, size_t first, const float *attn, size_t n, size_t live) {
  if (t->n == 0) return; /* nothing to record (and no columns yet: t->attn may be NULL) */
  const size_t ring = round % CKV_ATTN_HISTORY;
  const size_t end = first + n < t->n ? first + n : t->n;
  const uint8_t *restrict state = t->state;
  float *restrict cum = t->cum_attn;
  uint32_t *restrict last = t->last_attended;
  uint8_t *restrict ring_col = t->attn + ring;
  ckv_tokens_path path = record_path();
  double sum = round_mass(attn, state, first, end, path); /* attn[0] is position first (any first a worker sends) */
  /* mean mass per live token -> relative scale; no mass at all records zeros */
  const float inv = sum > 0.0 && live ? (float)((double)live / sum) : 0.f;
  pthread_once(&g_enc_once, encode_init);
  /* Tokens outside the report draw nothing this round: code 0, no change to
   * cum_attn or last_attended; the loop then touches only the reported span. */
  for (size_t p = 0; p < first && p < t->n; p++) ring_col[p * CKV_ATTN_HISTORY] = 0;
  for (size_t p = end > first ? end : first; p < t->n; p++) ring_col[p * CKV_ATTN_HISTORY] = 0;
  if (isinf(inv)) { /* masses so small that live / sum overflowed: by the definition rel = 0 * inf = NaN
                     * for every unattended token (code 0, cum_attn NaN); kept bit for bit, slowly */
    for (size_t p = 0; p < first && p < t->n; p++) cum[p] += 0.f * inv;
    for (size_t p = end > first ? end : first; p < t->n; p++) cum[p] += 0.f * inv;
    for (size_t p = first; p < end; p++) {
      float a = attn[p - first];
      a = (a > 0.f && a <= FLT_MAX && state[p] != CKV_STATE_RECYCLED) ? a : 0.f;
      float rel = a * inv;
      ring_col[p * CKV_ATTN_HISTORY] = ckv_attn_encode(rel);
      cum[p] += rel;
      if (rel >= CKV_ATTENDED_FLOOR) last[p] = round;
    }
    return;
  }
  /* rel is finite and >= 0 here (a <= sum, so rel <= live): the bin index is
   * clamped without a branch (an arithmetic shift of the signed distance),
   * below the range to entry 0, above it to the last; last_attended is
   * updated by a mask, not a branch (whether a token reaches the floor is a
   * coin toss for the predictor).  The vector paths do the same, lane by
   * lane (record_simd.c); this loop takes the tail. */
  size_t p = first;
  if (path != CKV_TOKENS_PATH_SCALAR && end > first) {
    ckv_record_span span = {.attn = attn, .first = first, .state = state, .ring_col = ring_col, .ring = (unsigned)ring,
                            .cum = cum, .last = last, .inv = inv, .round = round, .enc = g_enc};
    p = path == CKV_TOKENS_PATH_AVX512 ? ckv_record_span_avx512(&span, first, end) : ckv_record_span_avx2(&span, first, end);
  }
  for (; p < end; p++) {
    float a = attn[p - first];
    a = (a > 0.f && a <= FLT_MAX && state[p] != CKV_STATE_RECYCLED) ? a : 0.f;
    float rel = a * inv;
    uint32_t u;
    memcpy(&u, &rel, sizeof(u));
    int32_t b = (int32_t)(u - ENC_LO) >> ENC_SHIFT;
    b = b < -1 ? -1 : b;
    b = b > (int32_t)ENC_BINS ? (int32_t)ENC_BINS : b;
    uint32_t e = g_enc[b + 1];
    ring_col[p * CKV_ATTN_HISTORY] = (uint8_t)((e >> 24) + ((u & (ENC_NONE - 1)) >= (e & 0xFFFFFFu)));
    cum[p] += rel;
    uint32_t hit = 0u - (uint32_t)(rel >= CKV_ATTENDED_FLOOR);
    last[p] += (round - last[p]) & hit;
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
