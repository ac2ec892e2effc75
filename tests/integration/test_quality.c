/* test_quality.c - commitkv-bench quality in its CI size, end to end.
 *
 * Runs `commitkv-bench quality --quick --json` (which starts its own
 * commitkvd and runs every policy on the synthetic agent workload and, when
 * commitkv-llm and the model are there, on stories260K) and checks the JSON
 * it prints: every workload lists every policy, every policy has every field
 * (a number, or null where the field does not apply to the workload), and on
 * the synthetic workload the commitkv policy keeps every planted fact that a
 * later query needs (fact_recall == 1).  A second test feeds the real-model
 * path a stand-in commitkv-llm (a shell script printing a hand-written sample
 * of its JSON) to check the bench's parser and null handling, and a third
 * that the bench names its whole-file bounds (measured only at full size).
 * Behaviour only: speed is never asserted.
 *
 * The JSON is read with a small DOM parser below (objects, arrays, strings
 * without escapes beyond \" and \\, numbers, true/false/null). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* ---- a minimal JSON DOM ---- */
typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype t;
  double num;
  char *str;           /* J_STR */
  struct jval **items; /* J_ARR / J_OBJ values */
  char **keys;         /* J_OBJ */
  size_t n;
} jval;

static void jfree(jval *v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) {
    jfree(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

static void skip_ws(const char **p) {
  while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r') (*p)++;
}

static char *parse_string(const char **p) {
  if (**p != '"') return NULL;
  (*p)++;
  size_t cap = 16, n = 0;
  char *s = malloc(cap);
  while (**p && **p != '"') {
    char c = *(*p)++;
    if (c == '\\' && **p) c = *(*p)++;
    if (n + 2 > cap) s = realloc(s, cap *= 2);
    s[n++] = c;
  }
  if (**p != '"') {
    free(s);
    return NULL;
  }
  (*p)++;
  s[n] = 0;
  return s;
}

static jval *parse_value(const char **p);

static int push(jval *v, jval *item, char *key) {
  v->items = realloc(v->items, (v->n + 1) * sizeof(*v->items));
  if (v->t == J_OBJ) {
    v->keys = realloc(v->keys, (v->n + 1) * sizeof(*v->keys));
    v->keys[v->n] = key;
  }
  v->items[v->n++] = item;
  return 0;
}

static jval *parse_value(const char **p) {
  skip_ws(p);
  jval *v = calloc(1, sizeof(*v));
  if (**p == '{' || **p == '[') {
    char close = **p == '{' ? '}' : ']';
    v->t = **p == '{' ? J_OBJ : J_ARR;
    (*p)++;
    skip_ws(p);
    if (**p == close) {
      (*p)++;
      return v;
    }
    for (;;) {
      char *key = NULL;
      if (v->t == J_OBJ) {
        skip_ws(p);
        if (!(key = parse_string(p))) goto bad;
        skip_ws(p);
        if (**p != ':') {
          free(key);
          goto bad;
        }
        (*p)++;
      }
      jval *item = parse_value(p);
      if (!item) {
        free(key);
        goto bad;
      }
      push(v, item, key);
      skip_ws(p);
      if (**p == ',') {
        (*p)++;
        continue;
      }
      if (**p == close) {
        (*p)++;
        return v;
      }
      goto bad;
    }
  }
  if (**p == '"') {
    v->t = J_STR;
    if (!(v->str = parse_string(p))) goto bad;
    return v;
  }
  if (!strncmp(*p, "null", 4)) {
    *p += 4;
    v->t = J_NULL;
    return v;
  }
  if (!strncmp(*p, "true", 4) || !strncmp(*p, "false", 5)) {
    v->t = J_BOOL;
    v->num = **p == 't';
    *p += **p == 't' ? 4 : 5;
    return v;
  }
  char *end;
  v->num = strtod(*p, &end);
  if (end == *p) goto bad;
  v->t = J_NUM;
  *p = end;
  return v;
bad:
  jfree(v);
  return NULL;
}

static jval *json_parse(const char *s) {
  const char *p = s;
  jval *v = parse_value(&p);
  skip_ws(&p);
  if (v && *p) {
    jfree(v);
    return NULL;
  }
  return v;
}

static const jval *jget(const jval *o, const char *key) {
  if (!o || o->t != J_OBJ) return NULL;
  for (size_t i = 0; i < o->n; i++)
    if (!strcmp(o->keys[i], key)) return o->items[i];
  return NULL;
}

/* ---- running the bench ---- */
/* Runs commitkv-bench with args; returns its exit status and its stdout in *ret_out. */
static int run_bench(const char *const *args, const char *dir, char **ret_out) {
  char *e = NULL;
  int st = ckv_test_run_bench(args, dir, 300000, ret_out, &e);
  if (st != 0) fprintf(stderr, "commitkv-bench exited %d; stderr:\n%s\n", st, e ? e : "");
  free(e);
  return st;
}

static const char *const k_policies[] = {"commitkv", "fp16", "int8", "kivi4", "kivi2", "h2o", "streaming"};
static const char *const k_fields[] = {"bytes_ratio_fp16", "attn_cosine", "fact_recall", "top1_agreement", "kl_mean",
                                       "transitions_per_round", "recall", "shadow_recall"};
#define N_POL (sizeof(k_policies) / sizeof(k_policies[0]))
#define N_FIELDS (sizeof(k_fields) / sizeof(k_fields[0]))

/* Every workload has every policy, every policy every field (number or null);
 * returns the workload named `name` (or NULL). */
static const jval *check_shape(const jval *root, const char *name) {
  const jval *wls = jget(root, "workloads"), *found = NULL;
  cr_assert(wls && wls->t == J_ARR && wls->n >= 1, "no \"workloads\" array");
  for (size_t w = 0; w < wls->n; w++) {
    const jval *wl = wls->items[w], *nm = jget(wl, "name"), *pols = jget(wl, "policies");
    cr_assert(nm && nm->t == J_STR, "a workload without a name");
    cr_assert(!strcmp(nm->str, "agent-synthetic") || !strcmp(nm->str, "stories260K") || !strcmp(nm->str, "agentlm") ||
                  !strcmp(nm->str, "agent-synthetic-attention"),
              "unknown workload %s", nm->str);
    cr_assert(pols && pols->t == J_ARR, "%s: no policies", nm->str);
    const jval *sk = jget(wl, "skipped");
    bool skipped = sk && sk->t == J_STR;
    for (size_t p = 0; p < N_POL; p++) {
      const jval *pol = NULL;
      for (size_t i = 0; i < pols->n; i++) {
        const jval *pn = jget(pols->items[i], "policy");
        if (pn && pn->t == J_STR && !strcmp(pn->str, k_policies[p])) pol = pols->items[i];
      }
      cr_assert_not_null(pol, "%s: policy %s missing", nm->str, k_policies[p]);
      for (size_t f = 0; f < N_FIELDS; f++) {
        const jval *v = jget(pol, k_fields[f]);
        cr_assert_not_null(v, "%s/%s: field %s missing", nm->str, k_policies[p], k_fields[f]);
        cr_assert(v->t == J_NUM || v->t == J_NULL, "%s/%s: %s is neither a number nor null", nm->str, k_policies[p],
                  k_fields[f]);
      }
      bool synthetic = !strncmp(nm->str, "agent-synthetic", 15), agentlm = !strcmp(nm->str, "agentlm");
      const char *must[] = {"bytes_ratio_fp16", synthetic ? "attn_cosine" : agentlm ? "recall" : "top1_agreement",
                            synthetic ? "fact_recall" : "kl_mean"};
      for (size_t f = 0; f < 3 && !skipped; f++)
        cr_assert(jget(pol, must[f])->t == J_NUM, "%s/%s: %s is null", nm->str, k_policies[p], must[f]);
      if (skipped)
        cr_assert(jget(pol, "kl_mean")->t == J_NULL, "%s skipped but %s has figures", nm->str, k_policies[p]);
      if (synthetic) {
        cr_assert(jget(pol, "top1_agreement")->t == J_NULL, "synthetic: top1_agreement must be null");
        cr_assert(jget(pol, "kl_mean")->t == J_NULL, "synthetic: kl_mean must be null");
      }
    }
    if (!strcmp(nm->str, name)) found = wl;
  }
  return found;
}

/* The workload named `name` (NULL if absent), no shape checks (--policies leaves policies null). */
static const jval *find_workload(const jval *root, const char *name) {
  const jval *wls = jget(root, "workloads");
  for (size_t w = 0; wls && wls->t == J_ARR && w < wls->n; w++) {
    const jval *nm = jget(wls->items[w], "name");
    if (nm && nm->t == J_STR && !strcmp(nm->str, name)) return wls->items[w];
  }
  return NULL;
}

static double policy_field(const jval *wl, const char *policy, const char *field) {
  const jval *pols = jget(wl, "policies");
  for (size_t i = 0; i < pols->n; i++) {
    const jval *pn = jget(pols->items[i], "policy");
    if (pn && !strcmp(pn->str, policy)) {
      const jval *v = jget(pols->items[i], field);
      return v && v->t == J_NUM ? v->num : NAN;
    }
  }
  return NAN;
}

Test(quality, quick_json_has_every_field_and_commitkv_keeps_the_facts, .timeout = 600) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* The agent model's dialogues (8 per policy, about 3 minutes here) take 10x that under a sanitizer: the
   * bench reports agentlm skipped (the path names why); test_agentlm_model runs the model under it. */
  fprintf(stderr, "SKIPPED: the agentlm workload of the quick run under a sanitizer\n");
  setenv("CKV_AGENTLM_MODEL", "/agentlm-not-run-under-a-sanitizer", 1);
#endif
  char *dir = ckv_test_tmpdir("ckv-quality-test");
  char *out = NULL;
  const char *args[] = {"quality", "--quick", "--json", NULL};
  cr_assert_eq(run_bench(args, dir, &out), 0, "commitkv-bench quality --quick --json failed");
  cr_assert_not_null(out);
  jval *root = json_parse(out);
  cr_assert_not_null(root, "not one JSON object: %s", out);
  const jval *syn = check_shape(root, "agent-synthetic");
  cr_assert_not_null(syn, "no agent-synthetic workload");
  cr_assert(jget(root, "workloads")->n == 4, "every workload is reported (stories260K and agentlm possibly skipped)");
  /* fp16 is the reference itself */
  cr_assert_float_eq(policy_field(syn, "fp16", "attn_cosine"), 1.0, 1e-4);
  cr_assert_float_eq(policy_field(syn, "fp16", "fact_recall"), 1.0, 1e-9);
  /* the claim: commitkv keeps every planted fact a later query needs */
  cr_assert_float_eq(policy_field(syn, "commitkv", "fact_recall"), 1.0, 1e-9,
                     "commitkv lost a planted fact (fact_recall %.3f)", policy_field(syn, "commitkv", "fact_recall"));
  /* formats v2 with bits by value (facts ROT4, warm tokens and attended filler ROT2, cold tokens
   * ROT1), a 12-token window, 32-token blocks: measured at this (quick) geometry 0.209 of FP16 at
   * cosine 0.9912 (warm ROT3, cold ROT2, window 32, 64-token blocks: 0.277 at 0.9932; KIVI formats
   * and the seed's rules: 0.487 at 0.9979; kivi4 0.353 at 0.9952). The bound (0.20) is on
   * the full geometry: agent_synthetic_full_geometry below. */
  double ratio = policy_field(syn, "commitkv", "bytes_ratio_fp16"), cos = policy_field(syn, "commitkv", "attn_cosine");
  fprintf(stderr, "agent-synthetic quick: commitkv %.3f of fp16, cosine %.5f\n", ratio, cos);
  cr_expect_leq(ratio, 0.22, "commitkv keeps %.3f of FP16 bytes", ratio);
  cr_expect_geq(cos, 0.990, "commitkv cosine %.5f", cos);
  /* every format on the workload's K/V: bits and errors within floors taken from measurement */
  const jval *fl = jget(syn, "formats");
  cr_assert(fl && fl->t == J_ARR && fl->n == 9, "formats: 9 rows expected");
  static const struct {
    const char *name;
    double bits_max, key_max, value_max; /* measured: bits, key, value error */
  } want[] = {{"int8", 8.30, 0.014, 0.007},  /* 8.289 0.0121 0.0059 */
              {"kivi4", 5.06, 0.013, 0.086}, /* 5.055 0.0112 0.0783 */
              {"kivi4-keys75", 4.43, 0.070, 0.086}, /* 4.430 0.0632 0.0783 */
              {"kivi4-keys50", 3.81, 0.106, 0.086}, /* 3.805 0.0962 0.0783 */
              {"kivi2", 3.06, 0.062, 0.43},  /* 3.055 0.0563 0.3936 */
              {"rot4", 4.30, 0.016, 0.107},  /* 4.297 0.0140 0.0959 */
              {"rot3", 3.30, 0.030, 0.206},  /* 3.297 0.0269 0.1847 */
              {"rot2", 2.30, 0.055, 0.375},  /* 2.297 0.0493 0.3383 */
              {"rot1", 1.30, 0.096, 0.66}};  /* 1.297 0.0872 0.5982 */
  for (size_t i = 0; i < fl->n; i++) {
    const jval *row = fl->items[i], *nm = jget(row, "format");
    cr_assert(nm && nm->t == J_STR);
    cr_assert_str_eq(nm->str, want[i].name);
    double bits = jget(row, "bits_per_element")->num, ke = jget(row, "key_rel_error")->num,
           ve = jget(row, "value_rel_error")->num;
    cr_expect(bits <= want[i].bits_max && ke <= want[i].key_max && ve <= want[i].value_max,
              "%s: %.3f bits, key error %.4f, value error %.4f (bounds %.2f %.3f %.3f)", nm->str, bits, ke, ve,
              want[i].bits_max, want[i].key_max, want[i].value_max);
    cr_expect(ke > 0 && ve > 0, "%s: an error of 0 is not measured", nm->str);
  }
  /* Key-channel pruning does not pay against rotation: at about the same bits (4.43 / 4.30) the pruned
   * KIVI keys lose 4x more than ROT4's (0.063 vs 0.014 here; on the run-2 agent model, head_dim 64:
   * 0.262 vs 0.075), which is why it stays off by default. */
  cr_expect_lt(jget(fl->items[5], "key_rel_error")->num, jget(fl->items[2], "key_rel_error")->num,
               "rot4 keys should beat kivi4 with a quarter of the key channels pruned");
  /* by attention alone (no CONFIRMATION tags, no semantic scores): not worse than kivi2's fidelity.
   * Measured: commitkv 0.199 of FP16 at cosine 0.9602 (facts 0.67), kivi2 0.235 at 0.9447 (facts 1.0) */
  const jval *att = check_shape(root, "agent-synthetic-attention");
  cr_assert_not_null(att, "no agent-synthetic-attention workload");
  double ca = policy_field(att, "commitkv", "attn_cosine"), k2 = policy_field(att, "kivi2", "attn_cosine");
  fprintf(stderr, "attention only: commitkv %.3f of fp16, cosine %.5f, facts %.2f; kivi2 cosine %.5f\n",
          policy_field(att, "commitkv", "bytes_ratio_fp16"), ca, policy_field(att, "commitkv", "fact_recall"), k2);
  cr_expect_geq(ca, k2, "by attention alone commitkv's cosine %.5f is below kivi2's %.5f", ca, k2);
  /* the agent model, every policy on the same 8 dialogues: no baseline with fewer bytes than commitkv has both
   * a higher recall and a lower KL, and h2o and streaming at commitkv's bytes answer less.  Measured: commitkv
   * 0.163 of FP16, recall 0.793 (FP16 0.862), KL 0.0669; h2o 0.175 / 0.034 / 0.410; streaming 0.172 / 0.138 /
   * 0.361; kivi2 0.241 / 0.655 / 0.0804 (the whole file: test_agentlm_model). */
  const jval *lm = find_workload(root, "agentlm");
  cr_assert_not_null(lm, "no agentlm workload");
  if (jget(lm, "skipped")->t != J_NULL) {
    const jval *why = jget(lm, "skipped");
    fprintf(stderr, "SKIPPED: the agentlm policy comparison (%s)\n", why->t == J_STR ? why->str : "skipped");
  } else {
    double cb = policy_field(lm, "commitkv", "bytes_ratio_fp16"), cr = policy_field(lm, "commitkv", "recall"),
           ck = policy_field(lm, "commitkv", "kl_mean");
    fprintf(stderr, "agentlm quick: commitkv %.3f of fp16, recall %.3f, KL %.4f\n", cb, cr, ck);
    for (size_t p = 1; p < N_POL; p++) {
      double b = policy_field(lm, k_policies[p], "bytes_ratio_fp16"), r = policy_field(lm, k_policies[p], "recall"),
             k = policy_field(lm, k_policies[p], "kl_mean");
      fprintf(stderr, "  %s: %.3f of fp16, recall %.3f, KL %.4f\n", k_policies[p], b, r, k);
      cr_expect(!(b < cb && r > cr && k < ck), "%s beats commitkv at fewer bytes: %.3f / %.3f / %.4f against %.3f / "
                "%.3f / %.4f", k_policies[p], b, r, k, cb, cr, ck);
      if (!strcmp(k_policies[p], "h2o") || !strcmp(k_policies[p], "streaming")) {
        cr_expect(b >= 0.8 * cb && b <= 1.2 * cb, "%s ran at %.3f of FP16, not commitkv's %.3f", k_policies[p], b, cb);
        cr_expect_lt(r, cr, "%s answers %.3f at commitkv's bytes, commitkv %.3f", k_policies[p], r, cr);
      }
    }
  }
  jfree(root);
  free(out);
  ckv_test_rmdir(dir);
}

/* The claim at the full geometry (32 layers x 8 KV heads x 128, 32 rounds, 1575 tokens: commitkv at most 0.20
 * of FP16 with cosine >= 0.99 and every planted fact; h2o and streaming at the same bytes lose facts; by attention
 * alone not worse than kivi2) is a measurement, not a test: commitkv-bench quality --json reports it as bounds
 * synthetic_commitkv_bytes, synthetic_commitkv_cosine, synthetic_commitkv_facts, synthetic_h2o_loses_facts,
 * synthetic_streaming_loses_facts and attention_commitkv_cosine_vs_kivi2 (about 2 minutes here).  The quick test
 * above runs the same code at its size; the bench's bounds themselves are checked below. */
Test(quality, bounds_are_reported_and_not_measured_under_quick, .timeout = 300) {
  setenv("CKV_AGENTLM_MODEL", "/agentlm-not-needed-here", 1);
  char *dir = ckv_test_tmpdir("ckv-quality-bounds");
  char *out = NULL;
  const char *args[] = {"quality", "--quick", "--synthetic", "--policies", "commitkv,kivi2", "--json", NULL};
  cr_assert_eq(run_bench(args, dir, &out), 0, "commitkv-bench quality --quick --synthetic failed");
  jval *root = json_parse(out);
  cr_assert_not_null(root, "not one JSON object: %s", out);
  const jval *bounds = jget(root, "bounds");
  cr_assert(bounds && bounds->t == J_ARR && bounds->n == 9, "9 bounds expected");
  static const char *const names[] = {"agentlm_fp16_recall", "agentlm_commitkv_recall", "agentlm_commitkv_bytes",
                                      "synthetic_commitkv_bytes", "synthetic_commitkv_cosine",
                                      "synthetic_commitkv_facts", "synthetic_h2o_loses_facts",
                                      "synthetic_streaming_loses_facts", "attention_commitkv_cosine_vs_kivi2"};
  for (size_t i = 0; i < bounds->n; i++) {
    const jval *b = bounds->items[i], *nm = jget(b, "name"), *holds = jget(b, "holds"), *why = jget(b, "not_measured");
    cr_assert(nm && nm->t == J_STR);
    cr_expect_str_eq(nm->str, names[i]);
    cr_expect(holds && holds->t == J_NULL, "%s: --quick does not judge whole-file bounds", nm->str);
    cr_expect(why && why->t == J_STR && strstr(why->str, "--quick"), "%s: says why it is not measured", nm->str);
    cr_expect(jget(b, "source") && jget(b, "source")->t == J_STR, "%s has a source", nm->str);
  }
  jfree(root);
  free(out);
  ckv_test_rmdir(dir);
}

/* The real-model path with a stand-in commitkv-llm: the bench must take the
 * three figures from its JSON and give h2o/streaming commitkv's bytes as budget. */
Test(quality, real_model_json_is_parsed, .timeout = 300) {
  setenv("CKV_AGENTLM_MODEL", "/agentlm-not-needed-here", 1); /* the stand-in is the subject, not the agent model */
  char *dir = ckv_test_tmpdir("ckv-quality-llm");
  char script[600], model[600], log[600];
  snprintf(script, sizeof(script), "%s/fake-llm.sh", dir);
  snprintf(model, sizeof(model), "%s/model.bin", dir);
  snprintf(log, sizeof(log), "%s/args.log", dir);
  FILE *f = fopen(script, "w");
  cr_assert_not_null(f);
  fprintf(f,
          "#!/bin/sh\necho \"$@\" >> '%s'\n"
          "echo '{\"policy\": \"x\", \"sessions\": 2, \"rounds\": 8, \"top1_agreement\": 0.9375, "
          "\"kl_mean\": 0.0123, \"kl_max\": 0.5, \"bytes_ratio_fp16\": 0.4321}'\n",
          log);
  fclose(f);
  chmod(script, 0755);
  f = fopen(model, "w");
  fputs("not a model", f);
  fclose(f);
  char *out = NULL;
  const char *args[] = {"quality", "--quick", "--json", "--llm", script, "--model", model, NULL};
  cr_assert_eq(run_bench(args, dir, &out), 0, "commitkv-bench quality with a stand-in commitkv-llm failed");
  jval *root = json_parse(out);
  cr_assert_not_null(root, "not one JSON object: %s", out);
  const jval *real = check_shape(root, "stories260K");
  cr_assert_not_null(real, "no stories260K workload");
  cr_assert(jget(real, "skipped")->t == J_NULL, "stories260K skipped with a stand-in present");
  for (size_t p = 0; p < N_POL; p++) {
    cr_assert_float_eq(policy_field(real, k_policies[p], "top1_agreement"), 0.9375, 1e-9);
    cr_assert_float_eq(policy_field(real, k_policies[p], "kl_mean"), 0.0123, 1e-9);
    cr_assert_float_eq(policy_field(real, k_policies[p], "bytes_ratio_fp16"), 0.4321, 1e-9);
  }
  char *args_log = ckv_test_read_file(log);
  cr_assert_not_null(args_log);
  cr_assert_not_null(strstr(args_log, "--policy h2o --param budget=0.4321"), "h2o not run at commitkv's memory: %s",
                     args_log);
  cr_assert_not_null(strstr(args_log, "--shadow --json --sessions 2"), "commitkv-llm flags: %s", args_log);
  free(args_log);
  jfree(root);
  free(out);
  ckv_test_rmdir(dir);
}
