/* tests/unit/test_tokens.c - lifecycle/tokens.c's attention recording, in
 * process, against the definitions it replaced: the table-driven encoder
 * gives the code of round(32 * log2(1 + rel)) (the formula, kept here as the
 * oracle) for every float bit pattern of the coded range and its edges, and
 * ckv_tokens_record_round stores the same bytes, cum_attn and last_attended
 * as the one-pass-per-token definition (oracle_record below) for random
 * reports with NaN, inf, negative values, partial spans and a scale that
 * overflows. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lifecycle/tokens.h"

/* The encoder as it was: one log2f per token per round. */
static uint8_t oracle_encode(float rel) {
  if (!(rel > 0.f)) return 0;
  float c = 32.f * log2f(1.f + rel) + 0.5f;
  return c >= 255.f ? 255 : (uint8_t)c;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

/* Every float from +0 through 2^9 (all subnormals, the code 0 tail below
 * 0.011, every boundary up to 246.8, the 255 plateau). */
Test(tokens, encode_equals_formula_for_every_float_up_to_512, .timeout = 120) {
  uint64_t bad = 0;
  uint32_t first_bad = 0;
  for (uint32_t u = 0; u <= bits_of(512.f); u++) {
    float f = float_of(u);
    if (ckv_attn_encode(f) != oracle_encode(f) && bad++ == 0) first_bad = u;
  }
  cr_assert_eq(bad, 0, "%llu floats differ, first 0x%08x (%g): %u, formula %u", (unsigned long long)bad, first_bad,
               (double)float_of(first_bad), ckv_attn_encode(float_of(first_bad)), oracle_encode(float_of(first_bad)));
}

/* The rest of the 2^32 patterns (negatives, huge, inf, NaNs) by a stride
 * that is prime to every power of two, plus the named edge cases. */
Test(tokens, encode_equals_formula_on_edges_and_a_stride_over_all_patterns) {
  const float edges[] = {0.f,      -0.f,       float_of(1),  float_of(0x007FFFFFu), FLT_MIN,    -FLT_MIN,
                         1e-3f,    0.0109f,    0.011f,       0.5f,                  1.f,        2.f,
                         246.f,    246.8f,     247.f,        255.f,                 256.f,      1e6f,
                         FLT_MAX,  -FLT_MAX,   INFINITY,     -INFINITY,             NAN,        -NAN,
                         float_of(0x7F800001u), float_of(0xFFFFFFFFu), -1.f, -1e-30f};
  for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
    cr_assert_eq(ckv_attn_encode(edges[i]), oracle_encode(edges[i]), "edge %zu (0x%08x): %u, formula %u", i,
                 bits_of(edges[i]), ckv_attn_encode(edges[i]), oracle_encode(edges[i]));
  for (uint64_t u = 0; u <= UINT32_MAX; u += 4099) {
    float f = float_of((uint32_t)u);
    cr_assert_eq(ckv_attn_encode(f), oracle_encode(f), "0x%08x: %u, formula %u", (uint32_t)u, ckv_attn_encode(f),
                 oracle_encode(f));
  }
}

/* ckv_tokens_record_round as it was defined: every token, every round. */
static void oracle_record(ckv_tokens *t, uint32_t round, size_t first, const float *attn, size_t n, size_t live) {
  const size_t ring = round % CKV_ATTN_HISTORY;
  const size_t end = first + n < t->n ? first + n : t->n;
  double lane[8] = {0}; /* the round's mass: eight lanes by position, added as a fixed tree */
  for (size_t p = first; p < end; p++) {
    float a = attn[p - first];
    if (a > 0.f && !isinf(a) && t->state[p] != CKV_STATE_RECYCLED) lane[(p - first) % 8] += a;
  }
  double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  const float inv = sum > 0.0 && live ? (float)((double)live / sum) : 0.f;
  for (size_t p = 0; p < t->n; p++) {
    float a = (p >= first && p < end) ? attn[p - first] : 0.f;
    if (!(a > 0.f) || isinf(a) || t->state[p] == CKV_STATE_RECYCLED) a = 0.f;
    float rel = a * inv;
    t->attn[p * CKV_ATTN_HISTORY + ring] = oracle_encode(rel);
    t->cum_attn[p] += rel;
    if (rel >= CKV_ATTENDED_FLOOR) t->last_attended[p] = round;
  }
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static float random_attention(uint64_t *rng) {
  uint64_t r = rng_next(rng);
  switch (r % 16) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -(float)(r >> 40) * 1e-6f;
    case 3: return 0.f;
    case 4: return float_of((uint32_t)(r >> 32)); /* any pattern at all */
    case 5: return (float)(r >> 44) * 0.1f;        /* hot */
    default: return (float)((r >> 32) % 100000) * 1e-8f;
  }
}

static void check_same(const ckv_tokens *a, const ckv_tokens *b, uint32_t round) {
  cr_assert_eq(memcmp(a->attn, b->attn, a->n * CKV_ATTN_HISTORY), 0, "round %u: attention codes differ", round);
  cr_assert_eq(memcmp(a->last_attended, b->last_attended, a->n * sizeof(uint32_t)), 0,
               "round %u: last_attended differs", round);
  for (size_t p = 0; p < a->n; p++) /* bit for bit, NaN included */
    cr_assert_eq(bits_of(a->cum_attn[p]), bits_of(b->cum_attn[p]), "round %u token %zu: cum_attn %g vs %g", round, p,
                 (double)a->cum_attn[p], (double)b->cum_attn[p]);
}

static void record_matches_formula(ckv_tokens_path path, const char *name) {
  int fr = ckv_tokens_force_path(path);
  if (fr != 0) {
    fprintf(stderr, "SKIPPED: this CPU has no %s: that record path is not tested here\n", name);
    cr_skip_test("this CPU has no %s", name);
  }
  enum { N = 3000 };
  ckv_tokens t, o;
  ckv_tokens_init(&t);
  ckv_tokens_init(&o);
  cr_assert_eq(ckv_tokens_reserve(&t, N), 0);
  cr_assert_eq(ckv_tokens_reserve(&o, N), 0);
  for (size_t i = 0; i < N; i++) {
    ckv_tokens_push(&t, 2, 0, 0.5f, 0, 0, 0);
    ckv_tokens_push(&o, 2, 0, 0.5f, 0, 0, 0);
  }
  float *attn = malloc((N + 100) * sizeof(float));
  cr_assert_not_null(attn);
  uint64_t rng = 1234;
  for (uint32_t round = 1; round <= 200; round++) {
    /* some tokens recycled, a span that may start late and run past the end */
    for (int k = 0; k < 20; k++) {
      size_t p = rng_next(&rng) % N;
      t.state[p] = o.state[p] = CKV_STATE_RECYCLED;
    }
    size_t first = round % 3 == 0 ? 0 : rng_next(&rng) % N, n = rng_next(&rng) % (N + 100);
    if (first + n > N + 50) n = N + 50 - first; /* may run past the last token: record clips it */
    for (size_t i = 0; i < n; i++) attn[i] = random_attention(&rng);
    if (round % 17 == 0) /* a round of minute masses: live / sum overflows float */
      for (size_t i = 0; i < n; i++) attn[i] = i % 2 ? float_of(1) : 0.f;
    size_t live = round % 29 == 0 ? 0 : N - (size_t)(round / 4);
    ckv_tokens_record_round(&t, round, first, attn, n, live);
    oracle_record(&o, round, first, attn, n, live);
    check_same(&t, &o, round);
  }
  free(attn);
  ckv_tokens_done(&t);
  ckv_tokens_done(&o);
  ckv_tokens_force_path((ckv_tokens_path)-1);
}

/* Every record path the CPU can run stores the definition's bytes (the
 * vector ones: whole vectors, then the scalar tail). */
Test(tokens, record_round_stores_what_the_formula_stores, .timeout = 60) {
  record_matches_formula(CKV_TOKENS_PATH_SCALAR, "scalar path");
}
Test(tokens, record_round_avx2_stores_what_the_formula_stores, .timeout = 60) {
  record_matches_formula(CKV_TOKENS_PATH_AVX2, "AVX2");
}
Test(tokens, record_round_avx512_stores_what_the_formula_stores, .timeout = 60) {
  record_matches_formula(CKV_TOKENS_PATH_AVX512, "AVX-512 (F, BW, VL)");
}

/* At every code boundary (the float where the code steps up, and its
 * neighbours), with a round whose scale is exactly 1 (the report's masses,
 * exact in a double, topped up to an integer sum = live), every record path
 * stores the encoder's code for the mass itself. */
static void record_codes_at_boundaries(ckv_tokens_path path, const char *name) {
  if (ckv_tokens_force_path(path) != 0) {
    fprintf(stderr, "SKIPPED: this CPU has no %s: that record path is not tested here\n", name);
    cr_skip_test("this CPU has no %s", name);
  }
  enum { MAX = 1024 };
  float *m = malloc(MAX * sizeof(float));
  cr_assert_not_null(m);
  size_t n = 0;
  uint8_t prev = 0;
  for (uint32_t u = bits_of(0.004f); u <= bits_of(300.f) && n + 3 < MAX - 4; u++) {
    uint8_t c = ckv_attn_encode(float_of(u));
    if (c != prev) {
      m[n++] = float_of(u - 1);
      m[n++] = float_of(u);
      m[n++] = float_of(u + 1);
    }
    prev = c;
  }
  cr_assert_gt(n, 3 * 200, "only %zu boundary floats", n);
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += m[i];
  size_t real = n;
  double live = ceil(sum) + 1.0, rest = live - sum; /* exact: the masses span fewer than 53 bits */
  while (rest > 0.0) { /* top up with floats no larger than what is missing */
    float f = (float)rest;
    if ((double)f > rest) f = nextafterf(f, 0.f);
    cr_assert(n < MAX && f > 0.f);
    m[n++] = f;
    rest -= f;
  }
  ckv_tokens t;
  ckv_tokens_init(&t);
  cr_assert_eq(ckv_tokens_reserve(&t, n), 0);
  for (size_t i = 0; i < n; i++) ckv_tokens_push(&t, 2, 0, 0.5f, 0, 0, 0);
  ckv_tokens_record_round(&t, 5, 0, m, n, (size_t)live);
  for (size_t i = 0; i < real; i++)
    cr_assert_eq(t.attn[i * CKV_ATTN_HISTORY + 5], ckv_attn_encode(m[i]), "%s: token %zu (0x%08x): code %u, want %u",
                 name, i, bits_of(m[i]), t.attn[i * CKV_ATTN_HISTORY + 5], ckv_attn_encode(m[i]));
  for (size_t i = 0; i < real; i++) cr_assert_eq(bits_of(t.cum_attn[i]), bits_of(m[i]), "%s: cum_attn %zu", name, i);
  ckv_tokens_done(&t);
  free(m);
  ckv_tokens_force_path((ckv_tokens_path)-1);
}

Test(tokens, record_codes_at_boundaries_scalar) { record_codes_at_boundaries(CKV_TOKENS_PATH_SCALAR, "scalar path"); }
Test(tokens, record_codes_at_boundaries_avx2) { record_codes_at_boundaries(CKV_TOKENS_PATH_AVX2, "AVX2"); }
Test(tokens, record_codes_at_boundaries_avx512) {
  record_codes_at_boundaries(CKV_TOKENS_PATH_AVX512, "AVX-512 (F, BW, VL)");
}
