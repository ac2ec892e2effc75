/* bench_formats.c - commitkv-bench formats: every block format's bits per
 * element and round-trip error on a real model's K/V reading real text.
 *
 *   commitkv-bench formats --model PATH --dialogues FILE.jsonl [--tokens N] [--bos ID] [--json]
 *
 * The K/V come from the project's C forward pass (examples/llm/model.c) over
 * the dialogues (BOS, then "R: text\n" per turn), FP16 as a worker writes
 * them; each format gets them straight from draft blocks, as the daemon
 * fills its blocks.  This is how formats are chosen: measured here first. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "bench/format_errors.h"
#include "commitkv/status.h"

int ckv_bench_formats(int argc, char **argv) {
  const char *model = NULL, *data = NULL;
  long tokens = 2048, bos = 256;
  int json = 0, ch;
  static const struct option lo[] = {{"model", required_argument, 0, 'm'}, {"dialogues", required_argument, 0, 'd'},
                                     {"tokens", required_argument, 0, 'n'}, {"bos", required_argument, 0, 'b'},
                                     {"json", no_argument, 0, 'j'},         {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  optind = 1;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    char *end = NULL;
    switch (ch) {
      case 'm': model = optarg; break;
      case 'd': data = optarg; break;
      case 'n': tokens = strtol(optarg, &end, 10); if (*end || tokens < 64 || tokens > 1 << 20) tokens = -1; break;
      case 'b': bos = strtol(optarg, &end, 10); if (*end || bos < 0) bos = -1; break;
      case 'j': json = 1; break;
      default:
        fprintf(ch == 'h' ? stdout : stderr,
                "usage: commitkv-bench formats --model PATH --dialogues FILE.jsonl [--tokens N] [--bos ID] [--json]\n");
        return ch == 'h' ? 0 : 2;
    }
  }
  if (!model || !data || tokens < 0 || bos < 0) {
    fprintf(stderr, "commitkv-bench formats: --model and --dialogues are required (--tokens 64..1048576)\n");
    return 2;
  }
  uint16_t *kv = NULL;
  size_t n = 0;
  ckv_geometry g;
  int r = ckv_format_errors_model_kv(model, data, (size_t)tokens, (int)bos, &kv, &n, &g);
  ckv_format_errors rows[CKV_FORMAT_ERRORS_MAX];
  if (r == 0) r = ckv_format_errors_measure(&g, kv, n, rows);
  free(kv);
  if (r < 0) {
    fprintf(stderr, "commitkv-bench formats: %s (%d)\n", r > -1000 ? "cannot read the model or dialogues" : ckv_strerror(r), r);
    return 1;
  }
  if (json) {
    printf("{\"model\": \"%s\", \"tokens\": %zu, \"geometry\": {\"n_layers\": %u, \"n_kv_heads\": %u, \"head_dim\": %u}, "
           "\"formats\": [",
           model, n, g.n_layers, g.n_kv_heads, g.head_dim);
    for (int i = 0; i < r; i++)
      printf("%s{\"format\": \"%s\", \"bits_per_element\": %.4f, \"key_rel_error\": %.5f, \"value_rel_error\": %.5f}",
             i ? ", " : "", rows[i].name, rows[i].bits_per_element, rows[i].key_rel_error, rows[i].value_rel_error);
    printf("]}\n");
  } else {
    printf("%s: %zu tokens, %u layers x %u KV heads x %u\n%-13s %10s %10s %10s\n", model, n, g.n_layers, g.n_kv_heads,
           g.head_dim, "format", "bits/elem", "key err", "value err");
    for (int i = 0; i < r; i++)
      printf("%-13s %10.3f %10.4f %10.4f\n", rows[i].name, rows[i].bits_per_element, rows[i].key_rel_error,
             rows[i].value_rel_error);
  }
  return 0;
}
