/* tests/unit/test_policy.c - lifecycle/policy.c: policy names and numbers,
 * and the judge's parameter table: every default within its bounds, the
 * shipped defaults pinned, the checked setter refusing what is out of range,
 * not an integer, not a bit width or NaN, with the text OpenSession replies. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "lifecycle/judge.h"
#include "lifecycle/policy.h"

Test(policy, names) {
  static const char *const names[] = {"fp16", "int8", "kivi4", "kivi2", "h2o", "streaming",
                                      "commitkv"};
  cr_assert_eq(sizeof names / sizeof names[0], CKV_POLICY_COUNT);
  for (int i = 0; i < CKV_POLICY_COUNT; i++) {
    cr_expect_str_eq(ckv_policy_names[i], names[i]);
    cr_expect_eq(ckv_policy_from_name(names[i]), i);
  }
  cr_expect_eq(CKV_POLICY_COMMITKV, 6);
  cr_expect_eq(CKV_POLICY_ALL_MASK, 0x7fu);
  cr_expect_eq(ckv_policy_from_name("lru"), -1);
  cr_expect_eq(ckv_policy_from_name("FP16"), -1);
  cr_expect_eq(ckv_policy_from_name(""), -1);
  cr_expect_eq(ckv_policy_from_name(NULL), -1);
  cr_expect_eq(ckv_policy_from_name("all"), -1);
}

Test(policy, every_row_is_sane) {
  cr_assert_eq(ckv_judge_param_count, 26); /* + fact_cold_rounds (issue 39) */
  for (size_t i = 0; i < ckv_judge_param_count; i++) {
    const ckv_judge_param *d = &ckv_judge_param_table[i];
    cr_expect(d->min <= d->def && d->def <= d->max, "%s: default %g outside [%g, %g]", d->name, d->def, d->min,
              d->max);
    cr_expect(d->doc && strlen(d->doc) > 20, "%s has a doc line", d->name);
    cr_expect_eq(ckv_judge_param_find(d->name), d);
    cr_expect(d->offset + sizeof(float) <= sizeof(ckv_judge_params));
    for (size_t j = 0; j < i; j++)
      cr_expect_neq(ckv_judge_param_table[j].offset, d->offset, "%s and %s share a field", d->name,
                    ckv_judge_param_table[j].name);
    /* only the estimate switch is daemon-wide; every threshold is per session */
    cr_expect_eq(d->per_session, strcmp(d->name, "semantic_estimate") != 0, "%s", d->name);
  }
  cr_expect_null(ckv_judge_param_find("policy"));
  cr_expect_null(ckv_judge_param_find("semantic_estimate_enabled")); /* the field, not the key */
  cr_expect_null(ckv_judge_param_find(""));
  cr_expect_null(ckv_judge_param_find(NULL));
}

/* The shipped defaults: a change here is a change of packaging/commitkvd.conf
 * (test_config compares that file with the table) and of every benchmark. */
Test(policy, defaults) {
  ckv_judge_params p;
  memset(&p, 0xa5, sizeof p);
  ckv_judge_params_init(&p);
  cr_expect_eq(p.policy, CKV_POLICY_COMMITKV);
  cr_expect_null(p.mlp);
  cr_expect_eq(p.attn_threshold, 1.f);
  cr_expect_eq(p.semantic_threshold, 0.3f);
  cr_expect_eq(p.high_attn_threshold, 2.f);
  cr_expect_eq(p.history_rounds, 8);
  cr_expect_eq(p.sink_tokens, 4);
  cr_expect_eq(p.recent_window, 12);
  cr_expect_eq(p.persistence_rounds, 4);
  cr_expect_eq(p.idle_rounds, 16);
  cr_expect_eq(p.budget, 0.25f);
  cr_expect_eq(p.commit_bits, 4);
  cr_expect_eq(p.prune_keep, 1.f);
  cr_expect_eq(p.semantic_estimate_enabled, 1);
  cr_expect_leq(p.history_rounds, CKV_ATTN_HISTORY);
}

static int set(ckv_judge_params *p, const char *name, double v, char *err, size_t errlen) {
  const ckv_judge_param *d = ckv_judge_param_find(name);
  cr_assert_not_null(d, "%s", name);
  return ckv_judge_param_set(p, d, v, err, errlen);
}

Test(policy, set_checks_bounds_and_kind) {
  ckv_judge_params p, before;
  ckv_judge_params_init(&p);
  char err[160];
  for (size_t i = 0; i < ckv_judge_param_count; i++) {
    const ckv_judge_param *d = &ckv_judge_param_table[i];
    cr_expect_eq(ckv_judge_param_set(&p, d, d->min, err, sizeof err), CKV_OK, "%s=min: %s", d->name, err);
    cr_expect_eq(ckv_judge_param_get(&p, d), (float)d->min, "%s", d->name);
    cr_expect_eq(ckv_judge_param_set(&p, d, d->max, err, sizeof err), CKV_OK, "%s=max: %s", d->name, err);
    cr_expect_eq(ckv_judge_param_get(&p, d), (float)d->max, "%s", d->name);
    before = p;
    cr_expect_eq(ckv_judge_param_set(&p, d, d->max * 2 + 1, err, sizeof err), CKV_ERR_INVALID, "%s", d->name);
    cr_expect_eq(ckv_judge_param_set(&p, d, -1, err, sizeof err), CKV_ERR_INVALID, "%s", d->name);
    cr_expect_eq(ckv_judge_param_set(&p, d, NAN, NULL, 0), CKV_ERR_INVALID, "%s", d->name);
    cr_expect_eq(ckv_judge_param_set(&p, d, INFINITY, err, sizeof err), CKV_ERR_INVALID, "%s", d->name);
    cr_expect_eq(memcmp(&p, &before, sizeof p), 0, "%s: a refused value changed nothing", d->name);
  }
  /* the texts OpenSession answers with */
  cr_expect_eq(set(&p, "attn_threshold", 2e6, err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(err, "policy parameter attn_threshold=2e+06 outside [0, 1e+06]");
  cr_expect_eq(set(&p, "sink_tokens", 2.5, err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(err, "policy parameter sink_tokens=2.5 outside [0, 4096] or not an integer");
  cr_expect_eq(set(&p, "commit_bits", 3, err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(err, "policy parameter commit_bits=3 outside [2, 4] (2 or 4)");
  cr_expect_eq(set(&p, "history_rounds", 9, err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(err, "policy parameter history_rounds=9 outside [1, 8] or not an integer");
  /* accepted values land in their field */
  cr_expect_eq(set(&p, "semantic_threshold", 0.5, err, sizeof err), CKV_OK);
  cr_expect_eq(p.semantic_threshold, 0.5f);
  cr_expect_eq(set(&p, "recent_window", 1 << 20, err, sizeof err), CKV_OK);
  cr_expect_eq(p.recent_window, 1u << 20);
  cr_expect_eq(set(&p, "commit_bits", 2, err, sizeof err), CKV_OK);
  cr_expect_eq(p.commit_bits, 2);
  cr_expect_eq(set(&p, "semantic_estimate", 0, err, sizeof err), CKV_OK);
  cr_expect_eq(p.semantic_estimate_enabled, 0);
  cr_expect_eq(set(&p, "semantic_estimate", 0.5, err, sizeof err), CKV_ERR_INVALID);
}
