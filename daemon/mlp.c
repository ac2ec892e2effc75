/* mlp.c - placeholder loader for the mlp judge: refuses every file until the
 * learned judge lands (the rule judge is the default). */
#include "daemon/mlp.h"

#include <stdio.h>

#include "commitkv/status.h"

int ckv_mlp_load(const char *path, ckv_mlp **ret, char *err, size_t errlen) {
  (void)ret;
  snprintf(err, errlen, "%s: the mlp judge is not built yet; use judge = rules", path);
  return CKV_ERR_UNSUPPORTED;
}

ckv_mlp *ckv_mlp_free(ckv_mlp *m) {
  (void)m;
  return NULL;
}

int ckv_mlp_decide(const ckv_mlp *m, const float *features) {
  (void)m;
  (void)features;
  return -1;
}
