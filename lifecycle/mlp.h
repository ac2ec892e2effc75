/* mlp.h - the learned transition judge: a two-layer perceptron over the
 * judge's feature vector (judge.h, CKV_JUDGE_FEATURES), weights from a file.
 *
 * It proposes a target state per token; judge.c keeps the lifecycle's hard
 * rules (legal transitions only, protected tokens never recycled, filler
 * never promoted).  The weight file format and the trainer are documented in
 * lifecycle/mlp.c and tools/ckv-train-mlp (and docs/mlp-judge.md). */
#ifndef CKV_LIFECYCLE_MLP_H
#define CKV_LIFECYCLE_MLP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_mlp ckv_mlp;

/* Weight file: magic word and the one format version this build reads. */
#define CKV_MLP_MAGIC "commitkv-mlp"
#define CKV_MLP_VERSION 1
/* Output classes, in this order: 0 no change, then target states
 * CKV_STATE_STAGED (1), CKV_STATE_COMMITTED (2), CKV_STATE_RECYCLED (3), so a
 * class index other than 0 *is* the CKV_STATE_* it proposes. */
#define CKV_MLP_CLASSES 4
/* Hidden units a file may declare (bounds what a file can make us allocate
 * and what the per-token cost can become). */
#define CKV_MLP_MAX_HIDDEN 256

/* Loads weights.  CKV_OK; CKV_ERR_CORRUPT / CKV_ERR_FORMAT with err filled for
 * a bad file; -errno when it cannot be read.
 * CKV_ERR_FORMAT: not a weight file (magic), another version, another feature
 * count, a hidden size out of [1, CKV_MLP_MAX_HIDDEN], a file too large.
 * CKV_ERR_CORRUPT: empty or truncated file, a missing or misplaced section, a
 * token that is not a number, NaN or infinity, a std <= 0, trailing data.
 * err always names the file and, where it applies, the line. */
int ckv_mlp_load(const char *path, ckv_mlp **ret, char *err, size_t errlen);
ckv_mlp *ckv_mlp_free(ckv_mlp *m);
/* Target state for one token (CKV_STATE_*), or -1 for "no change".
 * A non-finite feature always gives -1 (the safe answer). */
int ckv_mlp_decide(const ckv_mlp *m, const float *features);

/* Weights in memory, as the trainer produces them (row-major):
 * mean, std [n_features]; w1 [hidden][n_features]; b1 [hidden];
 * w2 [CKV_MLP_CLASSES][hidden]; b2 [CKV_MLP_CLASSES].
 * The feature count is always CKV_JUDGE_FEATURES. */
typedef struct ckv_mlp_spec {
  uint32_t hidden;
  const float *mean, *std, *w1, *b1, *w2, *b2;
} ckv_mlp_spec;

/* Builds a judge from weights (copied).  CKV_OK; CKV_ERR_FORMAT for a hidden
 * size out of range; CKV_ERR_CORRUPT for a non-finite weight or std <= 0
 * (err filled when not NULL); -ENOMEM. */
int ckv_mlp_new(const ckv_mlp_spec *spec, ckv_mlp **ret, char *err, size_t errlen);
/* Writes m to path in the version-1 text format, atomically (temporary file,
 * fsync, rename): readers see the old file or the new one, never half of it.
 * `comment` (may be NULL; newlines are allowed) is written as '#' lines after
 * the header.  Floats are written with 9 significant digits, so load(save(m))
 * gives the same bits.  CKV_OK or -errno. */
int ckv_mlp_save(const ckv_mlp *m, const char *path, const char *comment);
uint32_t ckv_mlp_hidden(const ckv_mlp *m);
/* The 4 logits for one feature vector (no change, staged, committed, recycled). */
void ckv_mlp_logits(const ckv_mlp *m, const float *features, float ret[CKV_MLP_CLASSES]);
/* The winning class index 0..3: the largest logit, ties to the lowest index
 * (so "no change" wins a tie); 0 when a feature or a logit is not finite. */
int ckv_mlp_class(const ckv_mlp *m, const float *features);

#endif
