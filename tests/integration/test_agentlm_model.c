/* test_agentlm_model.c - the committed agent LM (tools/agentlm/agentlm.bin)
 * is the file its sha256 names, has the geometry issue 12 asks for, and
 * answers public recall questions through a real commitkvd.
 *
 *  - sha256sum of the committed file equals tools/agentlm/agentlm.bin.sha256;
 *  - its llama2.c header: dim 256, 4 query heads of 64 on 2 KV heads (GQA),
 *    4 layers, vocabulary 257 (bytes and BOS 256) with the shared classifier,
 *    1024 positions, and the file is exactly as long as that geometry;
 *  - commitkv-dialogue --policy fp16 over the first public dialogues
 *    (../shared/models/agent-dialogues.jsonl, or $CKV_MODEL_DIR) answers three
 *    named public questions exactly (facts 234-550 bytes back), its FP16
 *    shadow says the same bytes, and its recall over those dialogues holds;
 *  - with every token older than the last 32 held as INT2 (kivi2, no sinks)
 *    recall over the same dialogues falls and KL rises: the model reads its
 *    distant context (bounds from the measurement in tools/agentlm/README.md);
 *  - bits by value on real K/V: with the fact turns labelled
 *    (commitkv-dialogue --semantic oracle, read off the answers: exactly the
 *    turns that hold an asked value) lasting facts keep ROT4 and every other token
 *    past the last round commits to ROT1; recall stays near FP16's at about
 *    0.20 of its bytes, while the same rules without labels (everything
 *    ROT1) lose most answers;
 *  - the default configuration (docs/formats-v2.md): commitkvd's shipped
 *    [policy] and commitkv-dialogue with no options but --sync, whose turns
 *    are scored from their text (--semantic entities: a turn naming an
 *    entity is a lasting fact until a later turn restates it, the rest
 *    filler, acted on a round after staging: scored_persistence_rounds);
 *    filler that draws attention commits to ROT2 and is recycled two
 *    rounds later (filler_recycle_rounds), filler that draws none goes
 *    cold from staged (filler_demote_staged), and a turn that only repeats
 *    a held fact turn is a copy, scored filler; lasting facts go to the
 *    cold tier two rounds after they commit (fact_cold_rounds, which the
 *    worker sends) and each query gathers the cold tokens it needs: on the
 *    sample, recall within four answers of its FP16 shadow's at under 0.13
 *    of FP16's bytes in primary memory, reported per fact kind and per
 *    distance.
 *  - facts the text heuristic cannot see (issue 39's variant A: names and
 *    cities lowercased, numbers spelled, codes in letters; generated here by
 *    tools/agentlm/robustness.py from a seed no tuning used): the defaults,
 *    whose worker raises both turns of a copy the model made (an n-gram it
 *    predicted that had surprised it in an earlier turn: commitkv-dialogue
 *    --surprise) to lasting facts, answer what their FP16
 *    shadow answers, while the text heuristic alone (--surprise 0, the
 *    defaults before) commits those facts to ROT1 and loses most answers.
 *  - a shared prefix (issue 41, commitkv-dialogue --share-prefix: a keeper
 *    session holds BOS + the common system turn, each dialogue's session
 *    starts on its whole draft blocks and the worker prefills the rest):
 *    under fp16 the answers are the same bytes as without sharing (its own
 *    and its FP16 shadow's) and each stream's summed -ln p is the same
 *    number, every session matched the system turn rounded
 *    down to 16-token blocks (none without the flag); under the defaults the
 *    shared blocks stay FP16 (frozen while two sessions hold them:
 *    docs/prefix-sharing.md), so the answers are those of the same run
 *    without sharing but with the prefix pinned in FP16 (sink_tokens), byte
 *    for byte, and recall loses at most one answer to the run without.
 * The sample is the first 12 public dialogues (42 questions; 2 under a
 * sanitizer, without the recall bounds).  The bounds over the whole file
 * (issue 12's fp16 >= 0.90, issue 13's defaults >= FP16 - 0.02 at <= 0.20)
 * are measured by `commitkv-bench quality --json` (its "bounds").
 * Without the public file the recall tests skip and say so. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dialoguerun.h"
#include "testcheck.h"
#include "testutil.h"

#define AGENT_TIMEOUT_MS 600000
/* Public dialogues the recall tests run (the first ones of the file); under a sanitizer (10x slower) only the
 * first two, which hold the named questions, and the recall bounds are skipped (said on stderr). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RECALL_DIALOGUES "2"
#define UNDER_SANITIZER 1
#else
#define RECALL_DIALOGUES "12"
#define UNDER_SANITIZER 0
#endif
/* Measured on the committed model (run 7) over the first 12 public dialogues: fp16 recall 0.905 (38/42), INT2
 * past the last 32 recall 0.667, KL 0.0699 (over all 200: 0.905, 0.697, 0.0703; README.md).  The 12-dialogue
 * fp16 bound leaves one answer of room for rounding differences between machines (run 5's model, 0.833, fails
 * it); the INT2 ones are the issue's own (a drop of 0.2, KL above 0.05).  The whole file's 0.90 is
 * commitkv-bench quality's bound agentlm_fp16_recall. */
#define MIN_FP16_RECALL 0.88
#define MIN_RECALL_DROP 0.2
#define MIN_INT2_KL 0.05
/* Bits by value with oracle labels, first 12 dialogues: 37/42 = 0.881 at 0.2045 of FP16 (KL 0.0733); without
 * labels 6/42 = 0.143 at 0.142 (KL 0.194); over all 200: 481/547 = 0.879 at 0.2004 (docs/formats-v2.md).  The
 * bounds leave one answer of room and 0.005 of bytes. */
#define MIN_ORACLE_RECALL 0.85
#define MAX_ORACLE_BYTES 0.21
#define MAX_UNLABELLED_RECALL 0.40
/* commitkvd's shipped [policy] and commitkv-dialogue's own defaults (--semantic entities, which opens commitkv
 * sessions with scored_persistence_rounds=1), --sync, over the first 12 public dialogues: 35/42 = 0.833 at 0.1759
 * of FP16 (KL 0.0601), the FP16 shadow 38/42 = 0.905 (over all 200: 0.905 at 0.1906, FP16 0.905: commitkv-bench
 * quality).  The bounds leave one answer of room (34/42) and 0.01 of bytes; the loss against FP16 at most four
 * answers.  Without the entity scores (--semantic none) the same sample answers far less. */
#define SAMPLE_QUESTIONS 42
#define MIN_DEFAULT_RECALL (34.0 / 42.0 - 1e-9)
#define MAX_DEFAULT_RECALL_LOSS (4.0 / 42.0 + 1e-9)
/* The worker's copy signal (commitkv-dialogue --surprise, issue 39) raises a few more turns on this sample (0.1759 ->
 * 0.1919 of FP16, 36/42); copies scored filler and unattended filler demoted from staged (filler_demote_staged) take
 * it to 0.1711 (36/42, KL 0.0542; 16:58 UTC 2026-12-07): the bound leaves 0.009 (it failed the defaults before). */
/* Lasting facts to the cold tier two rounds after they commit (fact_cold_rounds=2, which commitkv-dialogue sends),
 * the worker gathering the 64 cold tokens each query needs (ckv_session_cold_gather): 35/42 at 0.1167 of FP16 in
 * primary memory (KL 0.0577; 19:40 UTC 2026-12-07).  The bound leaves 0.013; the cold tier holds at least 0.08 of
 * FP16 more than primary memory (the facts). */
#define MAX_DEFAULT_BYTES 0.13
#define MIN_DEFAULT_COLD 0.08
/* Issue 39's variant A from seed 7301 (10 dialogues, 32 questions), --sync, measured: the defaults 14/32 = 0.438 at
 * 0.222 of FP16 in primary memory (0.273 in all tiers), the FP16 shadow 13/32 = 0.406 (the model is off its
 * training text: lowercase names, spelled numbers), the text heuristic alone (--surprise 0) 1/32 = 0.031 at 0.087.
 * With facts gathered from the cold tier (fact_cold_rounds=2): the defaults 15/32 = 0.469 at 0.121 (0.287 in all
 * tiers), the heuristic alone 2/32 at 0.077 (19:40 UTC 2026-12-07).
 * The bounds: the defaults within two answers of FP16, the heuristic alone at least 0.2 below it. */
#define VARIANT_A_SEED 7301
#define VARIANT_A_DIALOGUES 10
#define VARIANT_A_LIMIT "10"
#define VARIANT_A_QUESTIONS 32
#define MAX_VARIANT_A_LOSS (2.0 / 32.0 + 1e-9)
#define MIN_TEXT_ONLY_LOSS 0.2
/* Bits by value alone: every token past the last round staged, then committed the round after: lasting facts in
 * commit_bits (ROT4), the rest in cold_bits (ROT1); no attention rule, no recycling (for silence or as filler), and
 * facts kept in primary memory (fact_cold_rounds=0, which commitkv-dialogue would set to 2). */
#define BITS_BY_VALUE_PARAMS                                                                                 \
  "--param", "persistence_rounds=1", "--param", "attn_threshold=1000000", "--param",                      \
      "high_attn_threshold=1000000", "--param", "idle_rounds=1000000", "--param", "cold_bits=1", "--param", \
      "filler_recycle_rounds=0", "--param", "fact_cold_rounds=0", "--sync"

/* --share-prefix on the first 12 public dialogues, measured (08:40 UTC, 2026-12-07, the shared 2-core machine): the
 * common system turn is 81 tokens with BOS, 80 of them in whole blocks, matched by each of the 12 sessions (960 in
 * all; 879 prefill tokens saved after the keeper's 81).  fp16: 38/42 with and without, the same bytes for every
 * answer.  The defaults (--sync): 35/42 at 0.196 of FP16 without sharing, 37/42 at 0.276 with it: the 80 shared
 * tokens stay FP16 (the freeze rule), and the run without sharing with --param sink_tokens=80 answers the same 42
 * byte strings at the same 0.276.  The bound below is one-sided: sharing may keep more, never lose more than one. */
#define SHARE_DIALOGUES 12
#define SHARE_BLOCK_TOKENS 16 /* commitkvd's default draft block: only whole ones are shared */
#define MAX_SHARE_RECALL_LOSS (1.0 / 42.0 + 1e-9)

/* Three public questions the committed model answers, each from a fact stated hundreds of bytes before. */
static const struct {
  const char *id;
  int turn;
  const char *answer;
} k_questions[] = {{"d001", 10, "The reservation is for Carla Okafor."},
                   {"d001", 18, "Your reservation code is TQ9301."},
                   {"d001", 20, "The hotel is in Seoul."}};

enum { DIM = 256, HIDDEN = 768, LAYERS = 4, HEADS = 4, KV_HEADS = 2, VOCAB = 257, SEQ = 1024 };

static const char *const k_daemon_args[] = {"--backend", "host", "--memory", "512M", NULL};

static void source_path(char *buf, size_t size, const char *rel) {
  const char *src = getenv("CKV_SOURCE_DIR");
  snprintf(buf, size, "%s/%s", src && *src ? src : ".", rel);
}

/* The public dialogues, or skip the test visibly. */
static void public_or_skip(char *buf, size_t size) {
  const char *dir = getenv("CKV_MODEL_DIR");
  if (dir && *dir) {
    snprintf(buf, size, "%s/agent-dialogues.jsonl", dir);
  } else {
    char rel[64];
    snprintf(rel, sizeof(rel), "../shared/models/agent-dialogues.jsonl");
    source_path(buf, size, rel);
  }
  struct stat st;
  if (stat(buf, &st) != 0) {
    fprintf(stderr, "test_agentlm_model: SKIPPED: public dialogues not found at %s (set CKV_MODEL_DIR)\n", buf);
    cr_skip_test("public dialogues not found at %s (set CKV_MODEL_DIR)", buf);
  }
}

Test(agentlm_model, committed_file_matches_its_sha256_and_geometry) {
  char model[512], sum_file[512], out[512];
  source_path(model, sizeof(model), "tools/agentlm/agentlm.bin");
  source_path(sum_file, sizeof(sum_file), "tools/agentlm/agentlm.bin.sha256");
  char *want = ckv_test_read_file(sum_file);
  cr_assert_not_null(want, "%s missing", sum_file);
  cr_assert_geq(strlen(want), 64, "%s holds no sha256", sum_file);

  char *dir = ckv_test_tmpdir("agentlm-sha");
  snprintf(out, sizeof(out), "%s/sha256.out", dir);
  const char *argv[] = {"/usr/bin/sha256sum", model, NULL};
  cr_assert_eq(ckv_test_wait(ckv_test_spawn(argv, out), 60000), 0, "sha256sum %s failed", model);
  char *got = ckv_test_read_file(out);
  cr_assert_not_null(got);
  cr_expect_eq(strncmp(got, want, 64), 0, "sha256 of %s is %.64s, %s says %.64s", model, got, sum_file, want);
  free(got);
  free(want);
  ckv_test_rmdir(dir);

  FILE *f = fopen(model, "rb");
  cr_assert_not_null(f, "cannot open %s", model);
  int32_t h[7];
  cr_assert_eq(fread(h, sizeof(h), 1, f), 1);
  cr_assert_eq(fseek(f, 0, SEEK_END), 0);
  long size = ftell(f);
  fclose(f);
  cr_expect_eq(h[0], DIM);
  cr_expect_eq(h[1], HIDDEN);
  cr_expect_eq(h[2], LAYERS);
  cr_expect_eq(h[3], HEADS);
  cr_expect_eq(h[4], KV_HEADS);
  cr_expect_eq(h[5], VOCAB, "vocabulary %d: 257 with the classifier shared (a positive size)", h[5]);
  cr_expect_eq(h[6], SEQ);
  cr_expect_eq(DIM / HEADS, 64, "head_dim");
  cr_expect_geq(HEADS / KV_HEADS, 2, "query heads per KV head");
  const long kv = (long)KV_HEADS * (DIM / HEADS);
  const long floats = (long)VOCAB * DIM +
                      (long)LAYERS * (DIM + (long)DIM * DIM + 2L * DIM * kv + (long)DIM * DIM + DIM +
                                      3L * DIM * HIDDEN) +
                      DIM + 2L * SEQ * (DIM / HEADS / 2);
  cr_expect_eq(size, 28 + 4 * floats, "%ld bytes, the geometry needs %ld", size, 28 + 4 * floats);
}

/* commitkv-dialogue on the committed model, its JSON report parsed (dialoguerun.c): the first `limit` public
 * dialogues with the FP16 shadow, or every one without it (limit NULL: fp16 is its own shadow). */
static json_t *run_dialogue(ckv_test_daemon *d, const char *model, const char *data, const char *policy,
                            const char *limit, const char *const *extra) {
  const char *argv[48] = {"commitkv-dialogue", "--socket", d->socket, "--attach-socket", d->attach, "--model", model,
                          "--dialogues", data, "--policy", policy, "--prefix", policy, "--json", "--quiet"};
  size_t n = 15;
  if (limit) {
    argv[n++] = "--limit";
    argv[n++] = limit;
    argv[n++] = "--shadow";
  }
  for (size_t i = 0; extra && extra[i]; i++) {
    cr_assert_lt(n, sizeof(argv) / sizeof(argv[0]) - 1, "too many commitkv-dialogue arguments");
    argv[n++] = extra[i];
  }
  argv[n] = NULL;
  return ckv_test_dialogue_report(d, argv, policy, AGENT_TIMEOUT_MS);
}

static double num(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  cr_assert(json_is_number(v), "no number \"%s\"", key);
  return json_number_value(v);
}

/* Under a sanitizer (10x slower) the long runs are skipped, and say so. */
static void skip_under_sanitizer(const char *what) {
  if (!UNDER_SANITIZER) return;
  fprintf(stderr, "test_agentlm_model: SKIPPED %s under a sanitizer (10x slower)\n", what);
  cr_skip_test("%s under a sanitizer", what);
}

/* The committed model's and the public file's paths (skips without the file), and a commitkvd to run them on. */
static void start_with_model(ckv_test_daemon *d, char *model, char *data, size_t size) {
  source_path(model, size, "tools/agentlm/agentlm.bin");
  public_or_skip(data, size);
  if (ckv_test_daemon_start(d, k_daemon_args) != 0) {
    if (d->pid > 0) ckv_test_daemon_stop(d);
    cr_assert_fail("commitkvd did not start");
  }
}

Test(agentlm_model, answers_public_questions_and_needs_its_distant_context, .timeout = 1200) {
  char model[512], data[512];
  ckv_test_daemon d;
  start_with_model(&d, model, data, sizeof(model));
  json_t *fp16 = run_dialogue(&d, model, data, "fp16", RECALL_DIALOGUES, NULL);
  json_t *items = json_object_get(fp16, "items");
  for (size_t q = 0; q < sizeof(k_questions) / sizeof(k_questions[0]); q++) {
    const json_t *it = NULL;
    for (size_t i = 0; i < json_array_size(items) && !it; i++) {
      const json_t *c = json_array_get(items, i);
      if (!strcmp(json_string_value(json_object_get(c, "id")), k_questions[q].id) &&
          (int)num(c, "turn") == k_questions[q].turn)
        it = c;
    }
    cr_assert_not_null(it, "no answer to %s turn %d in the report", k_questions[q].id, k_questions[q].turn);
    cr_expect_str_eq(json_string_value(json_object_get(it, "expected")), k_questions[q].answer,
                     "the public file's answer to %s turn %d changed", k_questions[q].id, k_questions[q].turn);
    cr_expect(json_is_true(json_object_get(it, "ok")), "%s turn %d \"%s\" (%d bytes back): said \"%s\", expected \"%s\"",
              k_questions[q].id, k_questions[q].turn, json_string_value(json_object_get(it, "question")),
              (int)num(it, "distance"), json_string_value(json_object_get(it, "said")), k_questions[q].answer);
    cr_expect_str_eq(json_string_value(json_object_get(it, "said_hex")),
                     json_string_value(json_object_get(it, "shadow_said_hex")), "%s turn %d: daemon and shadow",
                     k_questions[q].id, k_questions[q].turn);
  }
  if (UNDER_SANITIZER) {
    fprintf(stderr, "test_agentlm_model: SKIPPED the recall and INT2 bounds under a sanitizer (2 dialogues run)\n");
    json_decref(fp16);
    cr_expect_eq(ckv_test_daemon_stop(&d), 0);
    return;
  }
  const double r16 = num(fp16, "recall");
  cr_expect_geq(r16, MIN_FP16_RECALL, "fp16 recall %.3f over the first %s public dialogues", r16, RECALL_DIALOGUES);

  /* INT2 past the last 32 tokens (recent_window 32 without sinks), compressed
   * before each next round (--sync) so the run repeats itself. */
  const char *const int2[] = {"--param", "sink_tokens=0", "--param", "recent_window=32", "--sync", NULL};
  json_t *kivi2 = run_dialogue(&d, model, data, "kivi2", RECALL_DIALOGUES, int2);
  const double r2 = num(kivi2, "recall"), kl = num(kivi2, "kl_mean");
  fprintf(stderr, "test_agentlm_model: first %s public dialogues: fp16 recall %.3f, INT2-past-32 recall %.3f, "
          "KL %.4f\n", RECALL_DIALOGUES, r16, r2, kl);
  cr_expect_geq(r16 - r2, MIN_RECALL_DROP, "recall %.3f under INT2 past the last 32, %.3f at fp16", r2, r16);
  cr_expect_gt(kl, MIN_INT2_KL, "KL %.4f under INT2 past the last 32", kl);
  cr_expect_lt(num(kivi2, "bytes_ratio_fp16"), 0.5, "kivi2 kept more than half of FP16's bytes");
  json_decref(fp16);
  json_decref(kivi2);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

Test(agentlm_model, bits_by_value_keep_labelled_facts, .timeout = 900) {
  skip_under_sanitizer("bits by value");
  char model[512], data[512];
  ckv_test_daemon d;
  start_with_model(&d, model, data, sizeof(model));
  const char *const labelled[] = {BITS_BY_VALUE_PARAMS, "--semantic", "oracle", NULL};
  const char *const unlabelled[] = {BITS_BY_VALUE_PARAMS, "--semantic", "none", NULL};
  json_t *with = run_dialogue(&d, model, data, "commitkv", RECALL_DIALOGUES, labelled);
  json_t *without = run_dialogue(&d, model, data, "commitkv", RECALL_DIALOGUES, unlabelled);
  const double rw = num(with, "recall"), bw = num(with, "bytes_ratio_fp16");
  const double rn = num(without, "recall"), bn = num(without, "bytes_ratio_fp16");
  fprintf(stderr, "test_agentlm_model: bits by value, first %s dialogues: labelled facts recall %.3f at %.4f of FP16 "
          "(KL %.4f), unlabelled %.3f at %.4f (KL %.4f)\n", RECALL_DIALOGUES, rw, bw, num(with, "kl_mean"), rn, bn,
          num(without, "kl_mean"));
  cr_expect_str_eq(json_string_value(json_object_get(with, "semantic")), "oracle");
  cr_expect_geq(rw, MIN_ORACLE_RECALL, "recall %.3f with the facts labelled", rw);
  cr_expect_leq(bw, MAX_ORACLE_BYTES, "%.4f of FP16's bytes with the facts labelled", bw);
  cr_expect_leq(rn, MAX_UNLABELLED_RECALL, "recall %.3f with every committed token in ROT1", rn);
  cr_expect_lt(bn, bw, "the labelled facts' ROT4 costs bytes: %.4f unlabelled, %.4f labelled", bn, bw);
  json_decref(with);
  json_decref(without);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

/* The defaults and FP16 side by side on the sample (the FP16 shadow of the same run answers every question too):
 * recall near FP16's at a fifth of its bytes, reported per fact kind and per distance.  The whole file's bounds
 * (issue 12: fp16 >= 0.90; issue 13: the defaults >= FP16's - 0.02 at <= 0.20) are commitkv-bench quality's
 * (bounds agentlm_fp16_recall, agentlm_commitkv_recall, agentlm_commitkv_bytes). */
Test(agentlm_model, default_configuration_keeps_fp16_recall_in_a_fifth_of_the_bytes, .timeout = 580) {
  char model[512], data[512];
  ckv_test_daemon d;
  start_with_model(&d, model, data, sizeof(model));
  const char *const defaults[] = {"--sync", NULL}; /* --sync: the same transitions on every machine */
  json_t *r = run_dialogue(&d, model, data, "commitkv", RECALL_DIALOGUES, defaults);
  const double rec = num(r, "recall"), r16 = num(r, "shadow_recall"), bytes = num(r, "bytes_ratio_fp16");
  fprintf(stderr, "test_agentlm_model: first %s public dialogues: commitkv defaults recall %.3f (%d/%d) at %.4f of "
          "FP16, KL %.4f; FP16 shadow %.3f\n", RECALL_DIALOGUES, rec, (int)num(r, "correct"), (int)num(r, "questions"),
          bytes, num(r, "kl_mean"), r16);
  cr_expect_str_eq(json_string_value(json_object_get(r, "semantic")), "entities", "the worker's default scorer");
  const json_t *sent = json_object_get(r, "params");
  cr_expect_eq(json_object_size(sent), 2, "the worker sends two overrides of its own");
  cr_expect_eq(json_number_value(json_object_get(sent, "scored_persistence_rounds")), 1.0,
               "turn labels open the session with scored_persistence_rounds=1");
  cr_expect_eq(json_number_value(json_object_get(sent, "fact_cold_rounds")), 2.0,
               "a worker that gathers cold tokens opens the session with fact_cold_rounds=2");
  /* the facts went cold, and queries read tokens back from there */
  const double total = num(r, "total_bytes_ratio_fp16");
  fprintf(stderr, "test_agentlm_model: defaults: %.4f of FP16 in all tiers, %d cold blocks read\n", total,
          (int)num(r, "recalled_blocks"));
  cr_expect_geq(total, bytes + MIN_DEFAULT_COLD, "%.4f of FP16 in all tiers, %.4f primary: the facts stayed", total,
                bytes);
  cr_expect_gt(num(r, "recalled_blocks"), 0, "no query read the cold tier");
  cr_expect_eq((int)num(r, "skipped"), 0, "dialogues skipped");
  /* reported per fact kind and per distance: every question in one distance bucket, every kind counted */
  const int questions = (int)num(r, "questions");
  const json_t *kinds = json_object_get(r, "per_kind"), *dist = json_object_get(r, "per_distance");
  int in_buckets = 0, in_kinds = 0;
  const char *key;
  json_t *b;
  json_object_foreach((json_t *)dist, key, b) in_buckets += (int)num(b, "n");
  json_object_foreach((json_t *)kinds, key, b) in_kinds += (int)num(b, "n");
  cr_expect_eq(in_buckets, questions, "questions over the distance buckets: %d of %d", in_buckets, questions);
  cr_expect_eq(in_kinds, questions, "questions over the fact kinds: %d of %d", in_kinds, questions);
  if (UNDER_SANITIZER) {
    fprintf(stderr, "test_agentlm_model: SKIPPED the recall and bytes bounds under a sanitizer (%s dialogues run)\n",
            RECALL_DIALOGUES);
  } else {
    cr_expect_eq(questions, SAMPLE_QUESTIONS, "the sample's questions changed");
    cr_expect_geq(r16, MIN_FP16_RECALL, "FP16 shadow recall %.3f over the sample", r16);
    cr_expect_geq(rec, MIN_DEFAULT_RECALL, "recall %.3f with the defaults (FP16 %.3f)", rec, r16);
    cr_expect_geq(rec, r16 - MAX_DEFAULT_RECALL_LOSS, "recall %.3f with the defaults, FP16 %.3f", rec, r16);
    cr_expect_leq(bytes, MAX_DEFAULT_BYTES, "%.4f of FP16's bytes with the defaults", bytes);
  }
  json_decref(r);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

/* Issue 39's variant A, generated from seed VARIANT_A_SEED (never tuned on): VARIANT_A_DIALOGUES dialogues into a
 * fresh directory; its path in buf.  Skips visibly without /usr/bin/python3. */
static void make_variant_a(char *dir, size_t dsize, char *buf, size_t size) {
  if (access("/usr/bin/python3", X_OK) != 0) cr_skip_test("/usr/bin/python3 not found: variant A NOT generated");
  snprintf(dir, dsize, "/tmp/ckv-variant-a-XXXXXX");
  cr_assert_not_null(mkdtemp(dir), "mkdtemp");
  char script[512], cmd[2048];
  source_path(script, sizeof(script), "tools/agentlm/robustness.py");
  snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %s --count %d --seed %d --sets A >/dev/null 2>&1", script, dir,
           VARIANT_A_DIALOGUES, VARIANT_A_SEED);
  cr_assert_eq(system(cmd), 0, "%s failed", cmd);
  snprintf(buf, size, "%s/A.jsonl", dir);
}

Test(agentlm_model, facts_the_text_heuristic_cannot_see_keep_fp16_answers, .timeout = 600) {
  skip_under_sanitizer("variant A");
  char model[512], data[512], dir[64], pub[512];
  ckv_test_daemon d;
  start_with_model(&d, model, pub, sizeof(model));
  make_variant_a(dir, sizeof(dir), data, sizeof(data));
  const char *const defaults[] = {"--sync", NULL};
  const char *const text_only[] = {"--sync", "--surprise", "0", NULL};
  json_t *r = run_dialogue(&d, model, data, "commitkv", VARIANT_A_LIMIT, defaults);
  json_t *t = run_dialogue(&d, model, data, "commitkv", VARIANT_A_LIMIT, text_only);
  const double rec = num(r, "recall"), r16 = num(r, "shadow_recall"), rt = num(t, "recall");
  const int questions = (int)num(r, "questions");
  fprintf(stderr, "test_agentlm_model: variant A, %s dialogues of seed %d (%d questions): defaults recall %.3f at %.4f "
          "of FP16 (total %.4f, %d turns raised by surprisal), FP16 shadow %.3f; text heuristic alone %.3f at %.4f\n",
          VARIANT_A_LIMIT, VARIANT_A_SEED, questions, rec, num(r, "bytes_ratio_fp16"),
          num(r, "total_bytes_ratio_fp16"), (int)num(r, "surprise_turns"), r16, rt, num(t, "bytes_ratio_fp16"));
  cr_expect_eq(questions, VARIANT_A_QUESTIONS, "the generated set's questions changed");
  cr_expect_gt(num(r, "surprise_turns"), 0, "no turn was raised by surprisal");
  cr_expect_eq(num(t, "surprise_turns"), 0, "--surprise 0 still raised turns");
  cr_expect_geq(rec, r16 - MAX_VARIANT_A_LOSS, "recall %.3f with the defaults, FP16 %.3f", rec, r16);
  cr_expect_leq(rt, r16 - MIN_TEXT_ONLY_LOSS, "the text heuristic alone answered %.3f, FP16 %.3f: the set no longer "
                "hides its facts", rt, r16);
  json_decref(r);
  json_decref(t);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  cr_expect_eq(system(cmd), 0);
}

/* The tokens of the first dialogue's first turn as commitkv-dialogue runs them: BOS, then "S: text\n". */
static size_t first_turn_tokens(const char *data) {
  FILE *f = fopen(data, "r");
  cr_assert_not_null(f, "cannot open %s", data);
  char *line = NULL;
  size_t cap = 0;
  cr_assert_gt(getline(&line, &cap, f), 0, "%s is empty", data);
  fclose(f);
  json_t *d = json_loads(line, 0, NULL);
  free(line);
  cr_assert_not_null(d, "the first line of %s is not JSON", data);
  const char *text = json_string_value(json_object_get(json_array_get(json_object_get(d, "turns"), 0), "text"));
  cr_assert_not_null(text, "the first dialogue has no first turn");
  size_t n = 1 + 3 + strlen(text) + 1;
  json_decref(d);
  return n;
}

/* commitkv-dialogue over the first SHARE_DIALOGUES public dialogues, session ids and output tagged `tag`. */
static json_t *run_shared(ckv_test_daemon *d, const char *model, const char *data, const char *policy, const char *tag,
                          bool share, const char *const *extra) {
  const char *argv[32] = {"commitkv-dialogue", "--socket", d->socket, "--attach-socket", d->attach, "--model", model,
                          "--dialogues", data, "--policy", policy, "--prefix", tag, "--json", "--quiet", "--limit",
                          "12"};
  size_t n = 17;
  if (share) argv[n++] = "--share-prefix";
  for (size_t i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  return ckv_test_dialogue_report(d, argv, tag, AGENT_TIMEOUT_MS);
}

/* Every answer's bytes (and, with shadow, the shadow's) equal in a and b, item by item, and every session's stream
 * the same length with the same -ln p summed over its tokens (stream_nats, exactly: a model that read other K/V, or
 * one token more or less, moves it; the answers alone did not move when a mutated worker fed 40 prefix tokens
 * twice). */
static void expect_same_answers(const json_t *a, const json_t *b, bool shadow, const char *what) {
  const json_t *sa = json_object_get(a, "sessions"), *sb = json_object_get(b, "sessions");
  cr_assert_eq(json_array_size(sa), json_array_size(sb), "%s: sessions", what);
  for (size_t i = 0; i < json_array_size(sa); i++) {
    const json_t *x = json_array_get(sa, i), *y = json_array_get(sb, i);
    cr_expect_eq(num(x, "tokens"), num(y, "tokens"), "%s: %s: %.0f and %.0f tokens", what,
                 json_string_value(json_object_get(x, "id")), num(x, "tokens"), num(y, "tokens"));
    cr_expect_eq(num(x, "stream_nats"), num(y, "stream_nats"), "%s: %s: -ln p summed %.17g and %.17g", what,
                 json_string_value(json_object_get(x, "id")), num(x, "stream_nats"), num(y, "stream_nats"));
  }
  const json_t *ia = json_object_get(a, "items"), *ib = json_object_get(b, "items");
  cr_assert_eq(json_array_size(ia), json_array_size(ib), "%s: %zu and %zu answers", what, json_array_size(ia),
               json_array_size(ib));
  cr_assert_gt(json_array_size(ia), 0, "%s: no answers", what);
  for (size_t i = 0; i < json_array_size(ia); i++) {
    const json_t *x = json_array_get(ia, i), *y = json_array_get(ib, i);
    cr_expect_str_eq(json_string_value(json_object_get(x, "id")), json_string_value(json_object_get(y, "id")));
    cr_expect_eq((int)num(x, "turn"), (int)num(y, "turn"));
    cr_expect_str_eq(json_string_value(json_object_get(x, "said_hex")), json_string_value(json_object_get(y, "said_hex")),
                     "%s: %s turn %d: \"%s\" against \"%s\"", what, json_string_value(json_object_get(x, "id")),
                     (int)num(x, "turn"), json_string_value(json_object_get(x, "said")),
                     json_string_value(json_object_get(y, "said")));
    if (shadow)
      cr_expect_str_eq(json_string_value(json_object_get(x, "shadow_said_hex")),
                       json_string_value(json_object_get(y, "shadow_said_hex")), "%s: %s turn %d: the shadow's", what,
                       json_string_value(json_object_get(x, "id")), (int)num(x, "turn"));
  }
}

/* Each session's matched_tokens is `each`; with sharing the totals say so too. */
static void expect_matched(const json_t *r, uint64_t each, uint64_t keeper, const char *what) {
  const json_t *sessions = json_object_get(r, "sessions");
  cr_assert_eq(json_array_size(sessions), SHARE_DIALOGUES, "%s: %zu sessions", what, json_array_size(sessions));
  for (size_t i = 0; i < json_array_size(sessions); i++) {
    const json_t *x = json_array_get(sessions, i);
    cr_expect_eq((uint64_t)num(x, "matched_tokens"), each, "%s: %s matched %.0f tokens, expected %llu", what,
                 json_string_value(json_object_get(x, "id")), num(x, "matched_tokens"), (unsigned long long)each);
  }
  cr_expect_eq(json_is_true(json_object_get(r, "share_prefix")), each > 0, "%s: share_prefix", what);
  if (!each) return;
  cr_expect_eq((uint64_t)num(r, "matched_tokens"), each * SHARE_DIALOGUES, "%s: %.0f matched in all", what,
               num(r, "matched_tokens"));
  cr_expect_eq((uint64_t)num(r, "keeper_tokens"), keeper, "%s: the keeper ran %.0f tokens", what,
               num(r, "keeper_tokens"));
  cr_expect_eq(num(r, "prefill_tokens_saved"), (double)(each * SHARE_DIALOGUES) - (double)keeper, "%s: saved", what);
}

Test(agentlm_model, a_shared_system_prompt_gives_the_answers_of_a_private_one, .timeout = 600) {
  skip_under_sanitizer("the shared prefix");
  char model[512], data[512];
  ckv_test_daemon d;
  start_with_model(&d, model, data, sizeof(model));
  const size_t prefix = first_turn_tokens(data), blocks = prefix / SHARE_BLOCK_TOKENS * SHARE_BLOCK_TOKENS;
  cr_assert_gt(blocks, 0, "the system turn (%zu tokens) fills no block", prefix);

  /* fp16: no lifecycle, so sharing may change nothing at all (the FP16 shadow adopts the keeper's rows too) */
  const char *const shadow[] = {"--shadow", NULL};
  json_t *f = run_shared(&d, model, data, "fp16", "fp16-private", false, shadow);
  json_t *fs = run_shared(&d, model, data, "fp16", "fp16-shared", true, shadow);
  expect_matched(f, 0, 0, "fp16 without sharing");
  expect_matched(fs, blocks, prefix, "fp16 shared");
  expect_same_answers(f, fs, /* shadow= */ true, "fp16, private against shared");
  cr_expect_eq(num(f, "correct"), num(fs, "correct"));
  cr_expect_eq(num(f, "shadow_correct"), num(fs, "shadow_correct"));

  /* the defaults: with sharing, the prefix's blocks stay FP16 while the keeper holds them (the freeze rule); the
   * same run without sharing but with that many tokens pinned in FP16 says the same bytes */
  char sink[64];
  snprintf(sink, sizeof(sink), "sink_tokens=%zu", blocks);
  const char *const sync[] = {"--sync", NULL}, *const pinned[] = {"--sync", "--param", sink, NULL};
  json_t *c = run_shared(&d, model, data, "commitkv", "commitkv-private", false, sync);
  json_t *cs = run_shared(&d, model, data, "commitkv", "commitkv-shared", true, sync);
  json_t *cp = run_shared(&d, model, data, "commitkv", "commitkv-pinned", false, pinned);
  expect_matched(cs, blocks, prefix, "commitkv shared");
  expect_matched(cp, 0, 0, "commitkv pinned, without sharing");
  expect_same_answers(cp, cs, /* shadow= */ false, "commitkv, pinned prefix against shared");
  const double rc = num(c, "recall"), rs = num(cs, "recall");
  fprintf(stderr, "test_agentlm_model: shared prefix, first %d public dialogues, %zu of %zu system-turn tokens matched "
          "per session: fp16 recall %.3f private, %.3f shared; commitkv defaults %.3f (%d/%d) at %.4f of FP16 "
          "private, %.3f (%d/%d) at %.4f shared, %.3f at %.4f private with %s\n",
          SHARE_DIALOGUES, blocks, prefix, num(f, "recall"), num(fs, "recall"), rc, (int)num(c, "correct"),
          (int)num(c, "questions"), num(c, "bytes_ratio_fp16"), rs, (int)num(cs, "correct"),
          (int)num(cs, "questions"), num(cs, "bytes_ratio_fp16"), num(cp, "recall"), num(cp, "bytes_ratio_fp16"), sink);
  cr_expect_geq(rs, rc - MAX_SHARE_RECALL_LOSS, "commitkv recall %.3f shared, %.3f private", rs, rc);
  json_decref(f);
  json_decref(fs);
  json_decref(c);
  json_decref(cs);
  json_decref(cp);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}
