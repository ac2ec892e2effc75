/* test_bench_kernels_peer.c - `commitkv-bench kernels --peer PATH` (issue 42):
 * where the peer program is missing, every row with a peer format says
 * "skipped" and its ratio_peer is null; with a peer (here a script standing
 * in for bench/peer/ggml_peer.c, printing fixed rows in its format), the
 * matching rows carry the peer's format, bits and times and ratio_peer = peer
 * time / ours.  Speed is never asserted: only that the fields are there and
 * consistent. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

/* The number after `"key": ` at or after `from` (before `end` when given); NAN when absent. */
static double num_in(const char *from, const char *end, const char *key) {
  char pat[96];
  snprintf(pat, sizeof(pat), "\"%s\": ", key);
  const char *p = from ? strstr(from, pat) : NULL;
  if (!p || (end && p > end)) return NAN;
  return strtod(p + strlen(pat), NULL);
}

/* The attention row of `format` at `tokens`, and its end. */
static const char *attn_row(const char *json, const char *format, unsigned tokens, const char **ret_end) {
  char pat[128];
  snprintf(pat, sizeof(pat), "{\"tokens\": %u, \"format\": \"%s\"", tokens, format);
  const char *row = strstr(json, pat);
  cr_assert_not_null(row, "no attention row %s", pat);
  *ret_end = strchr(row, '}');
  return row;
}

static const char *ops_row(const char *json, const char *name, int threads, const char **ret_end) {
  char pat[128];
  snprintf(pat, sizeof(pat), "{\"name\": \"%s\", ", name);
  for (const char *row = strstr(json, pat); row; row = strstr(row + 1, pat)) {
    const char *end = strchr(row, '}');
    if ((int)num_in(row, end, "threads") == threads) {
      *ret_end = end;
      return row;
    }
  }
  cr_assert_fail("no ops row %s on %d threads", name, threads);
  return NULL;
}

static char *run_kernels(const char *dir, const char *peer) {
  char *json = NULL, *e = NULL;
  const char *const args[] = {"kernels", "--quick", "--json", "--tokens", "512", "--peer", peer, NULL};
  int st = ckv_test_run_bench(args, dir, 280000, &json, &e);
  cr_assert_eq(st, 0, "commitkv-bench kernels exited %d: %s", st, e ? e : "");
  cr_assert_not_null(json);
  free(e);
  return json;
}

Test(bench_kernels_peer, missing_peer_says_skipped, .timeout = 300) {
  char *dir = ckv_test_tmpdir("ckv-bench-peer-missing");
  char peer[512];
  snprintf(peer, sizeof(peer), "%s/no-such-peer", dir);
  char *json = run_kernels(dir, peer);
  cr_expect_not_null(strstr(json, "\"peer_skipped\": \"skipped: no peer program at"), "%s", json);
  const char *end, *row = attn_row(json, "int8", 512, &end);
  const char *sk = strstr(row, "\"peer\": \"skipped: ");
  cr_expect(sk && sk < end, "int8 attention row without skipped: %.*s", (int)(end - row), row);
  const char *rp = strstr(row, "\"ratio_peer\": null");
  cr_expect(rp && rp < end, "int8 attention row without ratio_peer null");
  row = attn_row(json, "mix", 512, &end); /* no peer format for a mix of formats */
  const char *none = strstr(row, "\"peer\": \"none: ");
  cr_expect(none && none < end, "mix row: %.*s", (int)(end - row), row);
  row = ops_row(json, "quantize_rot4", 1, &end);
  sk = strstr(row, "\"peer\": \"skipped: ");
  cr_expect(sk && sk < end, "quantize_rot4 row without skipped");
  free(json);
  free(dir);
}

/* A stand-in peer: fixed rows in ggml_peer.c's format for the threads it is asked for. */
static const char peer_script[] =
    "#!/bin/sh\n"
    "T=1\n"
    "while [ $# -gt 0 ]; do [ \"$1\" = --threads ] && T=$2; shift; done\n"
    "for t in 1 $T; do\n"
    "  echo \"{\\\"peer\\\": \\\"ggml\\\", \\\"op\\\": \\\"quantize\\\", \\\"format\\\": \\\"q4_0\\\", \\\"bits\\\": 4.5000, "
    "\\\"threads\\\": $t, \\\"elems\\\": 1024, \\\"ns_per_elem\\\": 2.00000, \\\"gbps\\\": 1.000}\"\n"
    "done\n"
    "for l in contiguous llama; do for f in f16 q8_0 q5_0 q4_0; do\n"
    "  echo \"{\\\"peer\\\": \\\"ggml\\\", \\\"op\\\": \\\"attention\\\", \\\"format\\\": \\\"$f\\\", \\\"layout\\\": \\\"$l\\\", "
    "\\\"bits\\\": 8.5000, \\\"tokens\\\": 512, \\\"threads\\\": $T, \\\"ms\\\": 50.0000, \\\"ms_median\\\": 60.0000}\"\n"
    "done; done\n";

Test(bench_kernels_peer, peer_rows_give_ratio_peer, .timeout = 300) {
  char *dir = ckv_test_tmpdir("ckv-bench-peer-fake");
  char peer[512];
  snprintf(peer, sizeof(peer), "%s/fake-peer.sh", dir);
  FILE *f = fopen(peer, "w");
  cr_assert_not_null(f);
  fputs(peer_script, f);
  fclose(f);
  chmod(peer, 0755);
  char *json = run_kernels(dir, peer);
  cr_expect_null(strstr(json, "\"peer_skipped\": \"skipped"), "the peer was skipped: %s", json);
  const char *end, *row = attn_row(json, "int8", 512, &end);
  cr_expect_not_null(strstr(row, "\"peer_format\": \"q8_0\""));
  double ms = num_in(row, end, "ms"), pm = num_in(row, end, "peer_ms"), r = num_in(row, end, "ratio_peer");
  cr_expect_eq(pm, 50.0);
  cr_expect(isfinite(r) && fabs(r - pm / ms) <= 0.01 * r, "ratio_peer %g, peer %g ms, ours %g ms", r, pm, ms);
  cr_expect_eq(num_in(row, end, "peer_llama_ms"), 50.0);
  row = attn_row(json, "rot4", 512, &end); /* rot4 against q4_0 */
  const char *pf = strstr(row, "\"peer_format\": \"q4_0\"");
  cr_expect(pf && pf < end, "rot4 row: %.*s", (int)(end - row), row);
  row = attn_row(json, "fp16", 512, &end);
  pf = strstr(row, "\"peer_format\": \"f16\"");
  cr_expect(pf && pf < end, "fp16 row: %.*s", (int)(end - row), row);
  row = ops_row(json, "quantize_rot4", 1, &end);
  double ours = num_in(row, end, "ns_per_elem"), rq = num_in(row, end, "ratio_peer");
  cr_expect_eq(num_in(row, end, "peer_ns_per_elem"), 2.0);
  cr_expect(ours > 0 && fabs(rq - 2.0 / ours) <= 0.01 * rq, "quantize ratio_peer %g, ours %g ns", rq, ours);
  row = ops_row(json, "quantize_int8", 1, &end); /* q8_0: the stand-in has no such row */
  const char *sk = strstr(row, "\"peer\": \"skipped: the peer printed no such row\"");
  cr_expect(sk && sk < end, "quantize_int8 row: %.*s", (int)(end - row), row);
  free(json);
  free(dir);
}
