/* tests/fuzz/fuzz_trace.c - the training-trace reader: the input is a trace
 * file (daemon/trace.h's CSV) read by ckv-train-mlp, then labelled.
 *
 * The daemon only writes traces; the bytes enter again through the trainer,
 * whose reader and labeller are static functions of tools/ckv-train-mlp.c.
 * The file is compiled in here whole (its main renamed), so the fuzzer runs
 * exactly that code: read_trace (headers, rows, a torn last line) and
 * build_dataset (sorting, horizons, labels) with the trainer's defaults and
 * a row cap that keeps an input fast. */
#define main ckv_train_mlp_main
#include "tools/ckv-train-mlp.c"
#undef main

#include "fuzz.h"
#include "fuzz_file.h"

static ckv_fuzz_file g_file;
static int g_ready;

int ckv_fuzz_trace_init(void) {
  if (g_ready) return 0;
  ckv_fuzz_file_open(&g_file, "fuzz-trace");
  g_ready = 1;
  return 0;
}

int ckv_fuzz_trace(const uint8_t *data, size_t size) {
  ckv_fuzz_trace_init();
  ckv_fuzz_file_set(&g_file, data, size);
  train_opts o = train_defaults();
  o.max_rows = 4096;
  trows rows = {0};
  char err[512];
  int r = read_trace(g_file.path, &rows, o.max_rows, err, sizeof(err));
  CKV_FUZZ_CHECK(r != -ENOMEM, "reading %zu bytes ran out of memory", size);
  CKV_FUZZ_CHECK(rows.n <= o.max_rows, "%zu rows read past the cap of %zu", rows.n, o.max_rows);
  if (r == CKV_OK) {
    dataset d = {0};
    r = build_dataset(&rows, &o, &d);
    /* at most 4096 rows: needing more memory than there is means a size
     * came from the file unchecked */
    CKV_FUZZ_CHECK(r != -ENOMEM, "labelling %zu rows ran out of memory", rows.n);
    if (r == CKV_OK) {
      CKV_FUZZ_CHECK(d.n <= rows.n, "%zu labelled rows from %zu rows", d.n, rows.n);
      CKV_FUZZ_CHECK(d.n_val <= d.n, "%zu validation rows of %zu", d.n_val, d.n);
    }
    dataset_done(&d);
  }
  free(rows.v);
  return 0;
}
