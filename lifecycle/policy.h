/* lifecycle/policy.h - the policy table: which lifecycle or baseline policy a
 * session runs, by number and by name.
 *
 * One list, CKV_POLICY_LIST, makes the enum, the names and every other
 * table that names policies (the daemon's config enum, for one), so a policy
 * is added in one line.  The numbers are stable: they index
 * ckv_policy_names[], are the bits of a tenant's allowed-policy set and may be
 * written to files; new policies go at the end. */
#ifndef CKV_LIFECYCLE_POLICY_H
#define CKV_LIFECYCLE_POLICY_H

#include <stdint.h>

/* X(ID, "name"): CKV_POLICY_<ID> is the row's index, "name" how the config
 * file and OpenSession spell it (DESIGN.md section 9). */
#define CKV_POLICY_LIST(X)                                                                  \
  X(FP16, "fp16")           /* never compress */                                           \
  X(INT8, "int8")           /* everything past the recent window staged */                 \
  X(KIVI4, "kivi4")         /* everything past the window committed, INT4 */               \
  X(KIVI2, "kivi2")         /* everything past the window committed, INT2 */               \
  X(H2O, "h2o")             /* heavy hitters + recent window within a budget */            \
  X(STREAMING, "streaming") /* attention sinks + recent window */                          \
  X(COMMITKV, "commitkv")   /* the lifecycle (judge + states) */

#define CKV_POLICY_ENUM_(id, name) CKV_POLICY_##id,
typedef enum ckv_policy_id { CKV_POLICY_LIST(CKV_POLICY_ENUM_) CKV_POLICY_COUNT } ckv_policy_id;
#undef CKV_POLICY_ENUM_

/* Every policy allowed: the default of a tenant's `policies`. */
#define CKV_POLICY_ALL_MASK ((UINT32_C(1) << CKV_POLICY_COUNT) - 1)

/* Names, indexed by ckv_policy_id. */
extern const char *const ckv_policy_names[CKV_POLICY_COUNT];

/* Name -> ckv_policy_id, or -1 for an unknown name or NULL (case-sensitive). */
int ckv_policy_from_name(const char *name);

#endif
