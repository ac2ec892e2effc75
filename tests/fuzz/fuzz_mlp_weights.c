/* tests/fuzz/fuzz_mlp_weights.c - the mlp judge's weight file reader: the
 * input is the file ([policy] mlp_weights), read by ckv_mlp_load as the
 * daemon does at start and on SIGHUP.  A file that loads is evaluated on a
 * few feature vectors (finite, zero, NaN, huge: never a crash, the class
 * always in range, -1 for a non-finite feature) and must survive a save:
 * ckv_mlp_save then ckv_mlp_load gives the same logits, bit for bit (mlp.h
 * promises it). */
#include <math.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "lifecycle/judge.h"
#include "lifecycle/mlp.h"
#include "fuzz.h"
#include "fuzz_file.h"

static ckv_fuzz_file g_file;
static char g_saved[128];
static bool g_ready;

int ckv_fuzz_mlp_weights_init(void) {
  if (g_ready) return 0;
  ckv_fuzz_file_open(&g_file, "fuzz-mlp");
  const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"; /* save fsyncs: keep it in memory */
  snprintf(g_saved, sizeof(g_saved), "%s/ckv-fuzz-mlp-%d.weights", dir, (int)getpid());
  g_ready = true;
  return 0;
}

static void features_for(int k, float f[CKV_JUDGE_FEATURES]) {
  for (int i = 0; i < CKV_JUDGE_FEATURES; i++) {
    switch (k) {
      case 0: f[i] = 0.f; break;
      case 1: f[i] = (float)i * 0.25f - 1.f; break;
      case 2: f[i] = i == 3 ? NAN : 0.5f; break;
      default: f[i] = i % 2 ? 3.0e38f : -3.0e38f; break;
    }
  }
}

int ckv_fuzz_mlp_weights(const uint8_t *data, size_t size) {
  ckv_fuzz_mlp_weights_init();
  ckv_fuzz_file_set(&g_file, data, size);
  ckv_mlp *m = NULL;
  char err[512];
  int r = ckv_mlp_load(g_file.path, &m, err, sizeof(err));
  if (r < 0) {
    CKV_FUZZ_CHECK(!m, "a failed load (%d) returned weights", r);
    CKV_FUZZ_CHECK(r == CKV_ERR_CORRUPT || r == CKV_ERR_FORMAT || r == -ENOMEM, "unexpected status %d: %s", r, err);
    CKV_FUZZ_CHECK(err[0], "status %d without a message", r);
    return 0;
  }
  uint32_t hidden = ckv_mlp_hidden(m);
  CKV_FUZZ_CHECK(hidden >= 1 && hidden <= CKV_MLP_MAX_HIDDEN, "hidden %u", hidden);
  CKV_FUZZ_CHECK(ckv_mlp_save(m, g_saved, "fuzz") == CKV_OK, "save");
  ckv_mlp *back = NULL;
  r = ckv_mlp_load(g_saved, &back, err, sizeof(err));
  CKV_FUZZ_CHECK(r == CKV_OK, "weights saved by ckv_mlp_save do not load: %s", err);
  for (int k = 0; k < 4; k++) {
    float f[CKV_JUDGE_FEATURES], a[CKV_MLP_CLASSES], b[CKV_MLP_CLASSES];
    features_for(k, f);
    int d = ckv_mlp_decide(m, f);
    CKV_FUZZ_CHECK(d >= -1 && d <= CKV_MLP_CLASSES - 1, "decision %d", d);
    if (k == 2) CKV_FUZZ_CHECK(d == -1, "a NaN feature decided %d", d);
    int cl = ckv_mlp_class(m, f);
    CKV_FUZZ_CHECK(cl >= 0 && cl < CKV_MLP_CLASSES, "class %d", cl);
    ckv_mlp_logits(m, f, a);
    ckv_mlp_logits(back, f, b);
    CKV_FUZZ_CHECK(memcmp(a, b, sizeof(a)) == 0, "logits changed by save + load (vector %d)", k);
  }
  ckv_mlp_free(back);
  ckv_mlp_free(m);
  unlink(g_saved);
  return 0;
}
