/* test_semantic.c - client/semantic.c: semantic scores from embeddings.
 *
 * Hand-built embeddings of dimension 8 share a large common direction
 * (axis 0, as hidden states of one model do) and add a topic direction:
 * axis 1 a booking task, axis 2 chit-chat, axis 3 a second task, axis 4
 * filler; axes 5-7 small per-turn differences.  The checks: the task's
 * turns outscore chit-chat; a repeat scores below its first occurrence
 * (novelty); after a topic shift the abandoned task's turns score below the
 * new task's and below what they scored before the shift; a NaN, infinite
 * or zero embedding gets the `invalid` score and changes nothing else; bad
 * arguments are refused without writing; the token-by-token collector gives
 * the same scores as the one-shot call. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "commitkv/semantic.h"
#include "commitkv/status.h"

#define DIM 8
#define MAX_TURNS 16

enum { BASE = 0, TASK_A = 1, CHAT = 2, TASK_B = 3, FILLER = 4 };

/* A turn: 3 on the common axis, 1 on its topic axis, `d` on axis 5 + k % 3. */
static void turn(float *e, int topic, int k, float d) {
  memset(e, 0, DIM * sizeof(float));
  e[BASE] = 3.f;
  e[topic] = 1.f;
  e[5 + k % 3] += d;
}

/* One token per turn: token i is turn i. */
static void score(const float *emb, size_t n, const uint8_t *flags, const ckv_semantic_weights *w, float *out) {
  uint32_t tt[MAX_TURNS];
  for (size_t i = 0; i < n; i++) tt[i] = (uint32_t)i;
  int r = ckv_semantic_from_embeddings(emb, n, DIM, flags, tt, n, w, out);
  cr_assert_eq(r, CKV_OK, "%s", ckv_strerror(r));
  for (size_t i = 0; i < n; i++) cr_assert(out[i] >= 0.f && out[i] <= 1.f, "turn %zu: score %g", i, out[i]);
}

Test(semantic, task_turns_outscore_chitchat) {
  /* request, question, chit-chat, confirmation, chit-chat */
  static const int topic[] = {TASK_A, TASK_A, CHAT, TASK_A, CHAT};
  float emb[5 * DIM], s[5], again[5];
  for (int t = 0; t < 5; t++) turn(emb + t * DIM, topic[t], t, 0.4f);
  uint8_t flags[5] = {CKV_SEMANTIC_TASK};
  score(emb, 5, flags, NULL, s);
  cr_log_info("task %.3f %.3f %.3f, chit-chat %.3f %.3f", s[0], s[1], s[3], s[2], s[4]);
  for (int t = 0; t < 5; t++)
    for (int c = 0; c < 5; c++)
      if (topic[t] == TASK_A && topic[c] == CHAT) cr_expect_gt(s[t], s[c], "task turn %d vs chit-chat %d", t, c);
  /* Without a TASK flag the first turn states the task: the same order. */
  score(emb, 5, NULL, NULL, again);
  cr_expect_gt(fminf(again[1], again[3]), fmaxf(again[2], again[4]), "no flags: %g %g vs %g %g", again[1],
               again[3], again[2], again[4]);
  /* The common axis does not hide the topics (the embeddings are centred):
   * by relevance alone chit-chat is far from the task (raw cosine 0.89). */
  ckv_semantic_weights rel = ckv_semantic_weights_default();
  rel.task = 1.f, rel.novelty = 0.f;
  score(emb, 5, flags, &rel, again);
  cr_log_info("relevance: task %.3f %.3f %.3f, chit-chat %.3f %.3f", again[0], again[1], again[3], again[2], again[4]);
  cr_expect_gt(fminf(again[1], again[3]), 0.5f);
  cr_expect_lt(fmaxf(again[2], again[4]), 0.3f);
  /* Deterministic, bit for bit. */
  score(emb, 5, flags, NULL, again);
  cr_expect_eq(memcmp(s, again, sizeof(s)), 0);
}

Test(semantic, a_repeat_scores_below_its_first_occurrence) {
  /* request, a fact, "ok", the same "ok", the same fact again */
  float emb[5 * DIM], s[5], flat[5];
  turn(emb + 0 * DIM, TASK_A, 0, 0.4f);
  turn(emb + 1 * DIM, TASK_A, 1, 0.4f);
  turn(emb + 2 * DIM, FILLER, 2, 0.4f);
  memcpy(emb + 3 * DIM, emb + 2 * DIM, DIM * sizeof(float));
  memcpy(emb + 4 * DIM, emb + 1 * DIM, DIM * sizeof(float));
  score(emb, 5, NULL, NULL, s);
  cr_log_info("fact %.3f then %.3f, ok %.3f then %.3f", s[1], s[4], s[2], s[3]);
  cr_expect_lt(s[3], s[2], "a repeated 'ok' is no news");
  cr_expect_lt(s[4], s[1], "a repeated fact is no news");
  /* It is the novelty part: with relevance only, a repeat scores the same. */
  ckv_semantic_weights w = ckv_semantic_weights_default();
  w.task = 1.f, w.novelty = 0.f;
  score(emb, 5, NULL, &w, flat);
  cr_expect_eq(flat[3], flat[2]);
  cr_expect_eq(flat[4], flat[1]);
}

Test(semantic, a_topic_shift_lowers_the_abandoned_topic) {
  /* Task A (request, fact, fact), the shift ("forget that"), task B (request, fact, fact). */
  static const int topic[] = {TASK_A, TASK_A, TASK_A, FILLER, TASK_B, TASK_B, TASK_B};
  float emb[7 * DIM], s[7], before[7];
  for (int t = 0; t < 7; t++) turn(emb + t * DIM, topic[t], t, 0.4f);
  uint8_t flags[7] = {CKV_SEMANTIC_TASK, 0, 0, CKV_SEMANTIC_TOPIC_SHIFT, CKV_SEMANTIC_TASK, 0, 0};
  score(emb, 7, flags, NULL, s);
  uint8_t no_shift[7] = {CKV_SEMANTIC_TASK, 0, 0, 0, 0, 0, 0};
  score(emb, 7, no_shift, NULL, before);
  cr_log_info("old %.3f %.3f %.3f (without the shift %.3f %.3f %.3f), new %.3f %.3f %.3f", s[0], s[1], s[2],
              before[0], before[1], before[2], s[4], s[5], s[6]);
  for (int t = 0; t < 3; t++) {
    for (int n = 4; n < 7; n++) cr_expect_lt(s[t], s[n], "abandoned turn %d vs new task turn %d", t, n);
    cr_expect_lt(s[t], before[t], "turn %d: the shift should lower it", t);
  }
}

Test(semantic, an_unusable_embedding_scores_invalid_and_changes_nothing_else) {
  static const int topic[] = {TASK_A, TASK_A, CHAT, TASK_A};
  float emb[5 * DIM], clean[4 * DIM], s[5], ref[4];
  for (int t = 0; t < 4; t++) turn(clean + t * DIM, topic[t], t, 0.4f);
  const float bad[] = {NAN, INFINITY, -INFINITY, 0.f};
  score(clean, 4, NULL, NULL, ref);
  for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
    /* the bad turn goes in second place */
    memcpy(emb, clean, DIM * sizeof(float));
    for (int i = 0; i < DIM; i++) emb[DIM + i] = bad[b] == 0.f ? 0.f : (i == 3 ? bad[b] : 1.f);
    memcpy(emb + 2 * DIM, clean + DIM, 3 * DIM * sizeof(float));
    score(emb, 5, NULL, NULL, s);
    cr_expect_eq(s[1], ckv_semantic_weights_default().invalid, "bad value %g: score %g", bad[b], s[1]);
    cr_expect_eq(s[0], ref[0]);
    for (int t = 2; t < 5; t++) cr_expect_eq(s[t], ref[t - 1], "bad value %g, turn %d: %g vs %g", bad[b], t, s[t], ref[t - 1]);
  }
  for (int i = 0; i < 4 * DIM; i++) clean[i] = NAN;
  score(clean, 4, NULL, NULL, ref);
  for (int t = 0; t < 4; t++) cr_expect_eq(ref[t], 0.5f, "all NaN: turn %d scores %g", t, ref[t]);
}

Test(semantic, bad_arguments_are_refused_without_writing) {
  float emb[2 * DIM], out[2] = {-7.f, -7.f};
  turn(emb, TASK_A, 0, 0.f);
  turn(emb + DIM, CHAT, 1, 0.f);
  uint32_t tt[2] = {0, 1}, beyond[2] = {0, 2};
  cr_expect_eq(ckv_semantic_from_embeddings(NULL, 2, DIM, NULL, tt, 2, NULL, out), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 0, DIM, NULL, tt, 2, NULL, out), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, 0, NULL, tt, 2, NULL, out), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, CKV_SEMANTIC_MAX_DIM + 1, NULL, tt, 2, NULL, out),
               CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, DIM, NULL, NULL, 2, NULL, out), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, DIM, NULL, tt, 2, NULL, NULL), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, DIM, NULL, beyond, 2, NULL, out), CKV_ERR_RANGE);
  cr_expect_eq(ckv_semantic_from_embeddings(emb, SIZE_MAX / 4, DIM, NULL, tt, 2, NULL, out), CKV_ERR_TOO_LARGE);
  const ckv_semantic_weights d = ckv_semantic_weights_default();
  ckv_semantic_weights w[] = {d, d, d, d, d};
  w[0].task = NAN;
  w[1].novelty = -0.1f;
  w[2].task = 0.7f; /* task + novelty = 1.1 */
  w[3].abandoned = 1.5f;
  w[4].invalid = INFINITY;
  for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
    cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, DIM, NULL, tt, 2, &w[i], out), CKV_ERR_INVALID, "weights %zu", i);
  cr_expect(out[0] == -7.f && out[1] == -7.f, "written on failure");
  /* No tokens: nothing to write, nothing needed. */
  cr_expect_eq(ckv_semantic_from_embeddings(emb, 2, DIM, NULL, NULL, 0, NULL, NULL), CKV_OK);

  ckv_semantic_turns *t = NULL;
  cr_expect_eq(ckv_semantic_turns_new(0, &t), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_turns_new(DIM, NULL), CKV_ERR_INVALID);
  cr_assert_eq(ckv_semantic_turns_new(DIM, &t), CKV_OK);
  cr_expect_eq(ckv_semantic_turns_mark(t, CKV_SEMANTIC_TOPIC_SHIFT), CKV_ERR_STATE, "no turn to mark yet");
  cr_expect_eq(ckv_semantic_turns_scores(t, NULL, out), CKV_ERR_STATE);
  cr_expect_eq(ckv_semantic_turns_add(t, NULL, 1), CKV_ERR_INVALID);
  cr_expect_eq(ckv_semantic_turns_tokens(t), 0);
  t = ckv_semantic_turns_free(t);
  cr_expect_null(t);
}

Test(semantic, the_collector_scores_as_the_one_shot_call) {
  /* 6 turns of 1..6 tokens each, turn 3 a shift, turn 4 the new task */
  static const int topic[] = {TASK_A, TASK_A, CHAT, FILLER, TASK_B, TASK_B};
  float sums[6 * DIM] = {0}, tok[DIM];
  uint8_t flags[6] = {0, 0, 0, CKV_SEMANTIC_TOPIC_SHIFT, CKV_SEMANTIC_TASK, 0};
  uint32_t tt[21];
  ckv_semantic_turns *t = NULL;
  cr_assert_eq(ckv_semantic_turns_new(DIM, &t), CKV_OK);
  size_t n = 0;
  for (int k = 0; k < 6; k++) {
    for (int j = 0; j <= k; j++) {
      turn(tok, topic[k], k + j, 0.1f * (float)j);
      cr_assert_eq(ckv_semantic_turns_add(t, tok, j == 0), CKV_OK);
      for (int i = 0; i < DIM; i++) sums[k * DIM + i] += tok[i];
      tt[n++] = (uint32_t)k;
    }
    if (flags[k]) cr_assert_eq(ckv_semantic_turns_mark(t, flags[k]), CKV_OK);
  }
  cr_assert_eq(ckv_semantic_turns_tokens(t), n);
  float a[21], b[21];
  cr_assert_eq(ckv_semantic_turns_scores(t, NULL, a), CKV_OK);
  cr_assert_eq(ckv_semantic_from_embeddings(sums, 6, DIM, flags, tt, n, NULL, b), CKV_OK);
  for (size_t i = 0; i < n; i++) cr_expect_eq(a[i], b[i], "token %zu: %g vs %g", i, a[i], b[i]);
  cr_expect_gt(a[n - 1], a[0], "the new task's turn over the abandoned one");
  ckv_semantic_turns_free(t);
}
