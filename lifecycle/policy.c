/* lifecycle/policy.c - the policy table and the judge's parameter table
 * (see policy.h): names to numbers, defaults, bounds, checked setters. */
#include "lifecycle/policy.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "lifecycle/judge_params.h"

/* The numbers are part of the contract (tenant bit sets, files): pin them. */
_Static_assert(CKV_POLICY_FP16 == 0 && CKV_POLICY_INT8 == 1 && CKV_POLICY_KIVI4 == 2 &&
                   CKV_POLICY_KIVI2 == 3 && CKV_POLICY_H2O == 4 && CKV_POLICY_STREAMING == 5 &&
                   CKV_POLICY_COMMITKV == 6 && CKV_POLICY_COUNT == 7,
               "policy numbers are stable: append new policies at the end of CKV_POLICY_LIST");

#define NAME_(id, name) [CKV_POLICY_##id] = name,
const char *const ckv_policy_names[CKV_POLICY_COUNT] = {CKV_POLICY_LIST(NAME_)};
#undef NAME_

int ckv_policy_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < CKV_POLICY_COUNT; i++)
    if (strcmp(name, ckv_policy_names[i]) == 0) return i;
  return -1;
}

/* ---- the judge's parameters ---- */

#define ROW_(key, field, kind_, def_, min_, max_, per_session_, doc_)                                 \
  {.name = #key, .type = CKV_JUDGE_PARAM_##kind_, .def = (def_), .min = (min_), .max = (max_),        \
   .offset = offsetof(ckv_judge_params, field), .per_session = (per_session_), .doc = (doc_)},
const ckv_judge_param ckv_judge_param_table[] = {CKV_JUDGE_PARAM_LIST(ROW_)};
#undef ROW_
const size_t ckv_judge_param_count = sizeof ckv_judge_param_table / sizeof ckv_judge_param_table[0];

/* Each field has the C type its row's TYPE says (a float field written as a
 * uint32_t would be a silent bug, not a compile error, without this). */
#define FIELD_TYPE_FLOAT float
#define FIELD_TYPE_U32 uint32_t
#define FIELD_TYPE_BITS uint32_t
#define FIELD_TYPE_BOOL int
#define CHECK_TYPE_(key, field, kind_, ...)                                                             \
  _Static_assert(_Generic(((ckv_judge_params *)0)->field, FIELD_TYPE_##kind_: 1, default: 0),          \
                 #field " has the type its row says");
CKV_JUDGE_PARAM_LIST(CHECK_TYPE_)
#undef CHECK_TYPE_

const ckv_judge_param *ckv_judge_param_find(const char *name) {
  for (size_t i = 0; name && i < ckv_judge_param_count; i++)
    if (strcmp(name, ckv_judge_param_table[i].name) == 0) return &ckv_judge_param_table[i];
  return NULL;
}

static void store(ckv_judge_params *p, const ckv_judge_param *d, double v) {
  char *f = (char *)p + d->offset;
  switch (d->type) {
    case CKV_JUDGE_PARAM_FLOAT: *(float *)f = (float)v; break;
    case CKV_JUDGE_PARAM_U32:
    case CKV_JUDGE_PARAM_BITS: *(uint32_t *)f = (uint32_t)v; break;
    case CKV_JUDGE_PARAM_BOOL: *(int *)f = v != 0; break;
  }
}

double ckv_judge_param_get(const ckv_judge_params *p, const ckv_judge_param *d) {
  const char *f = (const char *)p + d->offset;
  switch (d->type) {
    case CKV_JUDGE_PARAM_FLOAT: return *(const float *)f;
    case CKV_JUDGE_PARAM_U32:
    case CKV_JUDGE_PARAM_BITS: return *(const uint32_t *)f;
    case CKV_JUDGE_PARAM_BOOL: return *(const int *)f;
  }
  return 0;
}

void ckv_judge_params_init(ckv_judge_params *ret) {
  *ret = (ckv_judge_params){.policy = CKV_POLICY_COMMITKV, .mlp = NULL};
  for (size_t i = 0; i < ckv_judge_param_count; i++)
    store(ret, &ckv_judge_param_table[i], ckv_judge_param_table[i].def);
}

int ckv_judge_param_set(ckv_judge_params *p, const ckv_judge_param *d, double v, char *err,
                        size_t errlen) {
  bool integral = d->type != CKV_JUDGE_PARAM_FLOAT;
  bool ok = v >= d->min && v <= d->max; /* false for NaN */
  if (ok && integral) ok = v == floor(v);
  if (ok && d->type == CKV_JUDGE_PARAM_BITS) ok = v == d->min || v == d->max;
  if (!ok) {
    if (err && errlen) {
      char extra[64] = "";
      if (d->type == CKV_JUDGE_PARAM_BITS)
        snprintf(extra, sizeof extra, " (%g or %g)", d->min, d->max);
      else if (integral)
        snprintf(extra, sizeof extra, " or not an integer");
      snprintf(err, errlen, "policy parameter %s=%g outside [%g, %g]%s", d->name, v, d->min, d->max,
               extra);
    }
    return CKV_ERR_INVALID;
  }
  store(p, d, v);
  return CKV_OK;
}
