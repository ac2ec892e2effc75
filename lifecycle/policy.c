/* lifecycle/policy.c - the policy table (see policy.h). */
#include "lifecycle/policy.h"

#include <stddef.h>
#include <string.h>

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
