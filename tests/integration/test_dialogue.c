/* test_dialogue.c - commitkv-dialogue: agent dialogues through a byte-level
 * model whose KV cache lives in a real commitkvd.
 *
 * The model is written here: a llama2.c file with random weights and the
 * geometry issue 12 asks of the agent LM's KV (vocabulary 257 with BOS 256,
 * head_dim 64, 4 query heads on 2 KV heads), 2 layers, 1024 positions.  It
 * answers nothing right (its greedy output is noise), so the checks are on
 * the machinery, not on recall: five dialogues the test writes in the schema
 * of ../shared/models/agent-dialogues.jsonl (shorter than the public ones:
 * every answer decodes up to 200 bytes on two paths, and under ASan that is
 * what the test's time goes to) under policy fp16 with the FP16 shadow.
 *  - every dialogue runs, every recall question gets an answer (a count);
 *  - fp16 in the daemon is the shadow: KL at rounding level, top-1 agreement
 *    1, and the shadow's greedy answers are the same bytes;
 *  - the answers are the plain C forward pass's: for each one, the model run
 *    by tools/agentlm/logits.c (examples/llm/model.c over its own FP32 cache,
 *    no daemon) over the dialogue up to "A: " plus the answer's bytes picks,
 *    at every position, the byte the dialogue mode decoded next (greedy
 *    decoding is a fixed point of the forward pass);
 *  - the bytes against FP16 are those of an uncompressed cache;
 *  - under kivi2 (with --sync, so it is repeatable; two of the dialogues)
 *    the KL is well above 0 and the cache smaller than FP16;
 *  - semantic scores come from the worker: by default (--semantic entities,
 *    turns scored from their text) every token the fp16 run appended got a
 *    score (the daemon's semantic_given_tokens counts them), with
 *    --semantic none not one.
 *  - commitkv-llm --dialogues runs the same dialogues to the same answers
 *    and bytes (kivi2, --sync);
 * A malformed dialogue file is refused with the line named, exit 2. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dialoguerun.h"
#include "testcheck.h"
#include "testutil.h"

#define DLG_TIMEOUT_MS 300000
#define DLG_COUNT 5
#define VOCAB 257
#define BOS 256
/* Logit gap of a near-tie: measured 1.7e-4 at logits of 7.55, once in 3,166 positions (public dialogues). */
#define TIE_LOGITS 1e-2f

/* The test model's geometry. */
enum { DIM = 256, HIDDEN = 64, LAYERS = 2, HEADS = 4, KV_HEADS = 2, SEQ = 1024, HEAD_DIM = DIM / HEADS };

static const char *const k_daemon_args[] = {"--backend", "host", "--memory", "256M", NULL};

/* ---- the model ------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* n floats uniform in [-a, a] (variance a^2/3), or all `fill` when a is 0. */
static void put_floats(FILE *f, uint64_t *rng, size_t n, float a, float fill) {
  for (size_t i = 0; i < n; i++) {
    float x = a == 0.f ? fill : a * (2.f * (float)(splitmix(rng) >> 40) / (float)(1ull << 24) - 1.f);
    cr_assert_eq(fwrite(&x, sizeof(x), 1, f), 1);
  }
}

/* Random weights, scaled so activations stay of order 1 and the logits
 * spread over a few nats (a separate classifier, vocab_size negative). */
static void write_model(const char *path) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "cannot write %s", path);
  int32_t hdr[7] = {DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, -VOCAB, SEQ};
  cr_assert_eq(fwrite(hdr, sizeof(hdr), 1, f), 1);
  uint64_t rng = 12;
  size_t kv_dim = KV_HEADS * HEAD_DIM, L = LAYERS;
  float s_dim = sqrtf(3.f / DIM);
  put_floats(f, &rng, (size_t)VOCAB * DIM, sqrtf(3.f), 0);   /* token embedding */
  put_floats(f, &rng, L * DIM, 0, 1.f);                      /* rms_att */
  put_floats(f, &rng, L * DIM * DIM, s_dim, 0);              /* wq */
  put_floats(f, &rng, L * kv_dim * DIM, 2.f * s_dim, 0);     /* wk: sharper attention */
  put_floats(f, &rng, L * kv_dim * DIM, s_dim, 0);           /* wv */
  put_floats(f, &rng, L * DIM * DIM, s_dim, 0);              /* wo */
  put_floats(f, &rng, L * DIM, 0, 1.f);                      /* rms_ffn */
  put_floats(f, &rng, L * HIDDEN * DIM, s_dim, 0);           /* w1 */
  put_floats(f, &rng, L * DIM * HIDDEN, sqrtf(3.f / HIDDEN), 0); /* w2 */
  put_floats(f, &rng, L * HIDDEN * DIM, s_dim, 0);           /* w3 */
  put_floats(f, &rng, DIM, 0, 1.f);                          /* rms_final */
  for (int part = 0; part < 2; part++) /* legacy RoPE tables (the loader recomputes them) */
    for (int p = 0; p < SEQ; p++)
      for (int j = 0; j < HEAD_DIM / 2; j++) {
        double a = p / pow(10000.0, 2.0 * j / HEAD_DIM);
        float x = (float)(part ? sin(a) : cos(a));
        cr_assert_eq(fwrite(&x, sizeof(x), 1, f), 1);
      }
  put_floats(f, &rng, (size_t)VOCAB * DIM, 3.f * s_dim, 0); /* classifier */
  cr_assert_eq(fclose(f), 0);
}

/* ---- the dialogues ------------------------------------------------------------ */

/* Five dialogues in the public file's schema: a table booking confirmed,
 * then questions about it with filler between. */
static void write_dialogues(const char *path) {
  static const char *const names[] = {"Ada Novak", "Ravi Kim", "Sofia Lee", "Theo Santos", "Noor Arslan"};
  static const char *const days[] = {"Friday", "Monday", "Sunday", "Tuesday", "Saturday"};
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  for (int i = 0; i < DLG_COUNT; i++) {
    char code[16];
    snprintf(code, sizeof(code), "K%c%04d", 'A' + i, 4821 + 37 * i);
    int people = 2 + i;
    fprintf(f,
            "{\"id\": \"t%03d\", \"turns\": ["
            "{\"role\": \"S\", \"text\": \"You are a helpful booking assistant. Answer questions from the "
            "conversation.\"}, "
            "{\"role\": \"U\", \"text\": \"Book a table for %d people on %s.\"}, "
            "{\"role\": \"A\", \"text\": \"Under which name?\"}, "
            "{\"role\": \"U\", \"text\": \"%s.\"}, "
            "{\"role\": \"T\", \"text\": \"table_search: %s %d people ok\"}, "
            "{\"role\": \"A\", \"text\": \"Confirmed. The table is on %s. The booking is under %s. Your booking "
            "code is %s. The table is for %d people.\"}, "
            "{\"role\": \"U\", \"text\": \"What is my booking code?\"}, "
            "{\"role\": \"A\", \"text\": \"Your booking code is %s.\"}, "
            "{\"role\": \"U\", \"text\": \"ok\"}, {\"role\": \"A\", \"text\": \"Happy to help.\"}, "
            "{\"role\": \"U\", \"text\": \"Which day is the table?\"}, "
            "{\"role\": \"A\", \"text\": \"The table is on %s.\"}, "
            "{\"role\": \"U\", \"text\": \"What name is the booking under?\"}, "
            "{\"role\": \"A\", \"text\": \"The booking is under %s.\"}], "
            "\"recall\": [{\"turn\": 7, \"question_turn\": 6, \"answer\": \"Your booking code is %s.\"}, "
            "{\"turn\": 11, \"question_turn\": 10, \"answer\": \"The table is on %s.\"}, "
            "{\"turn\": 13, \"question_turn\": 12, \"answer\": \"The booking is under %s.\"}]}\n",
            i, people, days[i], names[i], days[i], people, days[i], names[i], code, people, code, days[i], names[i],
            code, days[i], names[i]);
  }
  cr_assert_eq(fclose(f), 0);
}

/* The first n dialogues of path, parsed (an array). */
static json_t *read_dialogues(const char *path, int n) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  json_t *all = json_array();
  char *line = NULL;
  size_t cap = 0;
  while ((int)json_array_size(all) < n && getline(&line, &cap, f) > 0) {
    json_error_t je;
    json_t *d = json_loads(line, 0, &je);
    cr_assert_not_null(d, "%s: %s", path, je.text);
    json_array_append_new(all, d);
  }
  free(line);
  fclose(f);
  cr_assert_eq((int)json_array_size(all), n, "%s holds fewer than %d dialogues", path, n);
  return all;
}

/* ---- running it ----------------------------------------------------------------- */

static void start_daemon(ckv_test_daemon *d) {
  if (ckv_test_daemon_start(d, k_daemon_args) == 0) return;
  if (d->pid > 0) ckv_test_daemon_stop(d);
  cr_assert_fail("commitkvd did not start");
}

/* commitkv-dialogue with its JSON report parsed (dialoguerun.c). */
static json_t *run_dialogue(ckv_test_daemon *d, const char *model, const char *data, const char *policy,
                            const char *limit, const char *extra) {
  const char *argv[] = {"commitkv-dialogue", "--socket", d->socket, "--attach-socket", d->attach, "--model", model,
                        "--dialogues", data, "--limit", limit, "--policy", policy, "--prefix", policy, "--shadow",
                        "--json", "--quiet", extra, NULL};
  return ckv_test_dialogue_report(d, argv, policy, DLG_TIMEOUT_MS);
}

static double num(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  cr_assert(json_is_number(v), "no number \"%s\"", key);
  return json_number_value(v);
}

/* Bytes of a hex string into buf; returns how many. */
static size_t unhex(const char *s, uint8_t *buf, size_t cap) {
  size_t n = 0;
  for (; s[0] && s[1] && n < cap; s += 2) {
    unsigned v;
    cr_assert_eq(sscanf(s, "%2x", &v), 1);
    buf[n++] = (uint8_t)v;
  }
  return n;
}

/* The rendering of turns [0, turn) of dialogue d, then "A: ". */
static size_t context(const json_t *d, size_t turn, uint8_t *buf, size_t cap) {
  size_t n = 0;
  json_t *turns = json_object_get(d, "turns");
  for (size_t i = 0; i < turn; i++) {
    json_t *t = json_array_get(turns, i);
    n += (size_t)snprintf((char *)buf + n, cap - n, "%s: %s\n", json_string_value(json_object_get(t, "role")),
                          json_string_value(json_object_get(t, "text")));
    cr_assert_lt(n, cap);
  }
  memcpy(buf + n, "A: ", 3);
  return n + 3;
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

/* Every answer of the report is what the plain C forward pass decodes
 * greedily on the same bytes.  The daemon's cache holds K/V rounded to FP16,
 * the plain pass's cache FP32, so a near-tie may fall the other way: a
 * position where the two bytes' logits are within TIE_LOGITS is counted in
 * *ties instead.  Returns the positions checked. */
static size_t check_against_forward(const char *dir, const char *model, const json_t *dialogues, const json_t *items,
                                    size_t *ties) {
  char prompt[400], logits[400];
  snprintf(prompt, sizeof(prompt), "%s/prompt.bin", dir);
  snprintf(logits, sizeof(logits), "%s/logits.bin", dir);
  static uint8_t buf[SEQ + 256];
  size_t checked = 0;
  for (size_t i = 0; i < json_array_size(items); i++) {
    const json_t *it = json_array_get(items, i);
    const json_t *d = json_array_get(dialogues, (size_t)num(it, "dialogue"));
    size_t n_ctx = context(d, (size_t)num(it, "turn"), buf, sizeof(buf));
    uint8_t said[256];
    size_t n_said = unhex(json_string_value(json_object_get(it, "said_hex")), said, sizeof(said));
    const char *stop = json_string_value(json_object_get(it, "stop"));
    cr_assert(n_said >= 1 || !strcmp(stop, "bos"), "item %zu: no answer", i);
    /* The prompt holds the answer's bytes but the last (its logits are not
     * needed), within the model's positions (BOS is the tool's). */
    size_t n_prompt = n_ctx + (n_said ? n_said - 1 : 0);
    cr_assert_lt(n_prompt + 1, (size_t)SEQ + 1);
    memcpy(buf + n_ctx, said, n_prompt - n_ctx);
    FILE *f = fopen(prompt, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, n_prompt, f), n_prompt);
    fclose(f);
    char out[400];
    snprintf(out, sizeof(out), "%s/logits.out", dir);
    const char *argv[] = {"ckv-agentlm-logits", model, prompt, logits, NULL};
    cr_assert_eq(ckv_test_wait(ckv_test_spawn(argv, out), DLG_TIMEOUT_MS), 0, "ckv-agentlm-logits failed");
    unlink(out);
    f = fopen(logits, "rb");
    cr_assert_not_null(f);
    static float lg[(SEQ + 1) * VOCAB];
    size_t rows = fread(lg, sizeof(float) * VOCAB, SEQ + 1, f);
    fclose(f);
    cr_assert_eq(rows, n_prompt + 1, "logits of %zu positions, expected %zu", rows, n_prompt + 1);
    /* Position p's logits predict token p + 1; BOS is position 0. */
    for (size_t k = 0; k < n_said; k++) {
      const float *row = lg + (n_ctx + k) * VOCAB;
      int top = argmax(row, VOCAB);
      float gap = row[top] - row[said[k]];
      if (top != said[k] && gap < TIE_LOGITS) {
        (*ties)++;
      } else {
        cr_expect_eq(top, said[k], "item %zu (dialogue %d turn %d), byte %zu: the forward pass picks %d, the "
                     "dialogue mode said %d (logits %g vs %g)", i, (int)num(it, "dialogue"), (int)num(it, "turn"), k,
                     top, said[k], row[top], row[said[k]]);
      }
      checked++;
    }
    if (!strcmp(stop, "bos") && n_said == 0) cr_expect_eq(argmax(lg + n_ctx * VOCAB, VOCAB), BOS);
  }
  unlink(prompt);
  unlink(logits);
  return checked;
}

Test(dialogue, fp16_is_the_plain_forward_pass_and_kivi2_is_not, .timeout = 900) {
  ckv_test_daemon d;
  start_daemon(&d);
  char model[400], data[400];
  snprintf(model, sizeof(model), "%s/byte-model.bin", d.dir);
  write_model(model);
  snprintf(data, sizeof(data), "%s/dialogues.jsonl", d.dir);
  write_dialogues(data);
  json_t *dialogues = read_dialogues(data, DLG_COUNT);
  size_t questions = 0;
  for (size_t i = 0; i < DLG_COUNT; i++)
    questions += json_array_size(json_object_get(json_array_get(dialogues, i), "recall"));

  unsigned long long given0 = ckv_test_stat(&d, "semantic_given_tokens");
  json_t *fp16 = run_dialogue(&d, model, data, "fp16", "5", NULL);
  cr_expect_eq(num(fp16, "dialogues"), DLG_COUNT, "every dialogue runs");
  cr_expect_eq(num(fp16, "skipped"), 0);
  cr_expect_eq(num(fp16, "bos"), BOS, "BOS 256 for a vocabulary of 257");
  cr_expect_eq(num(fp16, "questions"), (double)questions, "every recall question is answered");
  double appended = 0;
  json_t *sessions = json_object_get(fp16, "sessions");
  for (size_t i = 0; i < json_array_size(sessions); i++) appended += num(json_array_get(sessions, i), "tokens");
  unsigned long long given = ckv_test_stat(&d, "semantic_given_tokens") - given0;
  cr_log_info("fp16: %llu of %.0f tokens got a semantic score from the worker", given, appended);
  cr_expect_gt(appended, 1000);
  cr_expect_eq((double)given, appended, "every appended token should carry the worker's semantic score");
  json_t *none = run_dialogue(&d, model, data, "fp16", "1", "--semantic=none");
  cr_expect_str_eq(json_string_value(json_object_get(none, "semantic")), "none");
  cr_expect_eq(ckv_test_stat(&d, "semantic_given_tokens") - given0, given, "--semantic none sends no scores");
  json_decref(none);
  json_t *items = json_object_get(fp16, "items");
  cr_expect_eq(json_array_size(items), questions);
  double kl = num(fp16, "kl_mean"), kl_max = num(fp16, "kl_max"), top1 = num(fp16, "top1_agreement");
  double ratio = num(fp16, "bytes_ratio_fp16");
  cr_log_info("fp16: KL mean %g max %g, top1 %g, bytes/FP16 %g, recall %g", kl, kl_max, top1, ratio,
              num(fp16, "recall"));
  cr_expect(kl >= 0 && kl < 1e-4, "fp16 KL against the FP16 shadow should be rounding noise, got %g", kl);
  cr_expect_eq(top1, 1.0, "fp16 in the daemon must pick the shadow's top token every time (got %g)", top1);
  cr_expect_gt(num(fp16, "top1_counted"), 1000, "too few steps counted for top-1");
  /* Measured 1.016 (partly filled draft blocks); a compressed token would push it below 1. */
  cr_expect(ratio >= 1.0 && ratio < 1.1, "fp16 bytes against FP16: %g", ratio);
  json_t *by_round = json_object_get(fp16, "bytes_ratio_fp16_by_round");
  cr_expect_geq(json_array_size(by_round), 14, "a ratio per round");
  for (size_t i = 0; i < json_array_size(by_round); i++)
    cr_expect_geq(json_real_value(json_array_get(by_round, i)), 1.0, "round %zu under FP16", i + 1);
  for (size_t i = 0; i < json_array_size(items); i++) {
    const json_t *it = json_array_get(items, i);
    cr_expect_str_eq(json_string_value(json_object_get(it, "said_hex")),
                     json_string_value(json_object_get(it, "shadow_said_hex")),
                     "item %zu: fp16 and its shadow decode different answers", i);
  }
  size_t ties = 0, checked = check_against_forward(d.dir, model, dialogues, items, &ties);
  cr_log_info("greedy answers equal the plain forward pass's at %zu positions, %zu near-ties", checked, ties);
  cr_expect_gt(checked, questions, "answers of at least one byte each");
  cr_expect_leq(ties * 100, checked, "%zu near-ties in %zu positions: more than FP16 rounding makes", ties, checked);

  json_t *kivi2 = run_dialogue(&d, model, data, "kivi2", "2", "--sync");
  double kl2 = num(kivi2, "kl_mean"), ratio2 = num(kivi2, "bytes_ratio_fp16");
  cr_log_info("kivi2: KL mean %g, top1 %g, bytes/FP16 %g", kl2, num(kivi2, "top1_agreement"), ratio2);
  cr_expect_eq(num(kivi2, "dialogues"), 2);
  /* Measured 0.126 here (0.16-0.18 on public dialogues): INT2 keys and values move this model. */
  cr_expect_gt(kl2, 1e-2, "kivi2 should move the distribution away from FP16, KL %g", kl2);
  cr_expect_lt(ratio2, 0.6, "kivi2 should hold fewer bytes than FP16: %g", ratio2);
  /* commitkv-llm --dialogues is the same run: the same answers, byte for byte, and the same bytes */
  const char *llm_argv[] = {"commitkv-llm", "--socket", d.socket, "--attach-socket", d.attach, "--model", model,
                            "--dialogues", data, "--limit", "2", "--policy", "kivi2", "--prefix", "llm-kivi2",
                            "--shadow", "--json", "--quiet", "--sync", NULL};
  json_t *via_llm = ckv_test_dialogue_report(&d, llm_argv, "llm-kivi2", DLG_TIMEOUT_MS);
  const json_t *li = json_object_get(via_llm, "items"), *ki = json_object_get(kivi2, "items");
  cr_expect_eq(json_array_size(li), json_array_size(ki), "commitkv-llm --dialogues asked other questions");
  for (size_t i = 0; i < json_array_size(li) && i < json_array_size(ki); i++)
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(li, i), "said_hex")),
                     json_string_value(json_object_get(json_array_get(ki, i), "said_hex")),
                     "item %zu: commitkv-llm --dialogues answered otherwise", i);
  cr_expect_eq(num(via_llm, "bytes_total"), num(kivi2, "bytes_total"), "commitkv-llm --dialogues kept other bytes");
  json_decref(via_llm);
  cr_expect_eq(ckv_test_stat(&d, "errors"), 0, "the daemon refused a request");
  json_decref(fp16);
  json_decref(kivi2);
  json_decref(dialogues);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly on SIGTERM");
}

Test(dialogue, malformed_file_is_refused_naming_the_line) {
  char *dir = ckv_test_tmpdir("ckv-dialogue-bad");
  char data[400], out[400];
  snprintf(data, sizeof(data), "%s/bad.jsonl", dir);
  snprintf(out, sizeof(out), "%s/out", dir);
  FILE *f = fopen(data, "w");
  cr_assert_not_null(f);
  fprintf(f, "{\"id\": \"a\", \"turns\": [{\"role\": \"U\", \"text\": \"hi\"}], \"recall\": []}\n\n");
  fprintf(f, "{\"id\": \"b\", \"turns\": [{\"role\": \"U\", \"text\": \"hi\"}], \"recall\": [{\"turn\": 0, "
             "\"question_turn\": 0, \"answer\": \"x\"}]}\n");
  fclose(f);
  const char *argv[] = {"commitkv-dialogue", "--dialogues", data, "--socket", "ipc:///nonexistent/commitkvd.sock", NULL};
  cr_expect_eq(ckv_test_wait(ckv_test_spawn(argv, out), 30000), 2);
  char *text = ckv_test_read_file(out);
  cr_expect(text && strstr(text, "bad.jsonl:3:") && strstr(text, "not an assistant turn"),
            "the error should name line 3 and why: %s", text ? text : "");
  free(text);
  const char *no_file[] = {"commitkv-dialogue", "--policy", "fp16", NULL};
  unlink(out);
  cr_expect_eq(ckv_test_wait(ckv_test_spawn(no_file, out), 30000), 2, "--dialogues is required");
  unlink(out);
  unlink(data);
  ckv_test_rmdir(dir);
}
