/* mlp.h - the learned transition judge: a two-layer perceptron over the
 * judge's feature vector (judge.h, CKV_JUDGE_FEATURES), weights from a file.
 *
 * It proposes a target state per token; judge.c keeps the lifecycle's hard
 * rules (legal transitions only, protected tokens never recycled, filler
 * never promoted).  The weight file format and the trainer are documented in
 * daemon/mlp.c and tools/ckv-train-mlp. */
#ifndef CKV_DAEMON_MLP_H
#define CKV_DAEMON_MLP_H

#include <stddef.h>

typedef struct ckv_mlp ckv_mlp;

/* Loads weights.  CKV_OK; CKV_ERR_CORRUPT / CKV_ERR_FORMAT with err filled for
 * a bad file; -errno when it cannot be read. */
int ckv_mlp_load(const char *path, ckv_mlp **ret, char *err, size_t errlen);
ckv_mlp *ckv_mlp_free(ckv_mlp *m);
/* Target state for one token (CKV_STATE_*), or -1 for "no change". */
int ckv_mlp_decide(const ckv_mlp *m, const float *features);

#endif
