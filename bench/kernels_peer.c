/* kernels_peer.c - runs the outside peer of the kernels bench and reads its rows
 * (kernels_peer.h).  The peer prints one flat JSON object per line; only the keys
 * below are read, with strstr and strtod (no nesting, no escapes: the peer's own
 * output, not user input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/kernels_peer.h"

/* Our format -> the peer's (ggml) format: the fewest bits per element at or above ours among
 * those the peer times.  Ours at head_dim 128: int8 8.29, int4 (KIVI) 5.06, int2 3.06,
 * rot4 4.30, rot3 3.30, rot2 2.30, rot1 1.30 (docs/formats-v2.md); ggml's q8_0 8.5, q5_0 5.5,
 * q4_0 4.5, q3_K 3.44, q2_K 2.63, tq1_0 1.69.  ggml's flash attention takes 128-element rows
 * only in the 32-element block types, so attention compares int2 and rot2 with q4_0. */
static const struct {
  const char *ours, *ops, *attention;
} peer_map[] = {
    {"fp16", NULL, "f16"},   {"int8", "q8_0", "q8_0"}, {"int4", "q5_0", "q5_0"}, {"int2", "q3_K", "q4_0"},
    {"rot4", "q4_0", "q4_0"}, {"rot3", "q3_K", NULL},   {"rot2", "q2_K", "q4_0"}, {"rot1", "tq1_0", NULL},
};

const char *ckv_peer_format_for(const char *op, const char *ours) {
  for (size_t i = 0; i < sizeof peer_map / sizeof peer_map[0]; i++)
    if (!strcmp(peer_map[i].ours, ours)) return strcmp(op, "attention") ? peer_map[i].ops : peer_map[i].attention;
  return NULL;
}

static void get_str(const char *line, const char *key, char *out, size_t len) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": \"", key);
  const char *s = strstr(line, pat);
  out[0] = 0;
  if (!s) return;
  s += strlen(pat);
  size_t n = 0;
  while (s[n] && s[n] != '"' && n + 1 < len) n++;
  memcpy(out, s, n);
  out[n] = 0;
}
static double get_num(const char *line, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *s = strstr(line, pat);
  return s ? strtod(s + strlen(pat), NULL) : 0.0;
}

void ckv_peer_run(ckv_peer *p, const char *path, size_t mib, const size_t *tokens, size_t n_tokens, int threads,
                  int quick) {
  p->skipped[0] = 0;
  if (access(path, X_OK) != 0) {
    snprintf(p->skipped, sizeof p->skipped, "skipped: no peer program at %s (make bench-peer builds it)", path);
    return;
  }
  char cmd[4600], list[128] = "";
  for (size_t i = 0, o = 0; i < n_tokens && o < sizeof list - 16; i++)
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%zu", i ? "," : "", tokens[i]);
  snprintf(cmd, sizeof cmd, "'%s' --mib %zu --tokens %s --threads %d%s", path, mib, list, threads, quick ? " --quick" : "");
  fflush(stdout);
  FILE *f = popen(cmd, "r");
  if (!f) {
    snprintf(p->skipped, sizeof p->skipped, "skipped: could not start %s", path);
    return;
  }
  char line[1024];
  int got = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"peer\"")) continue;
    ckv_peer_row x = {0};
    get_str(line, "op", x.op, sizeof x.op);
    get_str(line, "format", x.format, sizeof x.format);
    get_str(line, "layout", x.layout, sizeof x.layout);
    x.bits = get_num(line, "bits");
    x.threads = (int)get_num(line, "threads");
    x.tokens = (size_t)get_num(line, "tokens");
    x.ns_per_elem = get_num(line, "ns_per_elem");
    x.ms = get_num(line, "ms");
    x.ms_median = get_num(line, "ms_median");
    ckv_peer_row *old = (ckv_peer_row *)ckv_peer_find(p, x.op, x.format, x.threads, x.tokens, x.layout);
    if (old) { /* the same row from an earlier run: the better of the two */
      if (x.ns_per_elem > 0 && x.ns_per_elem < old->ns_per_elem) old->ns_per_elem = x.ns_per_elem;
      if (x.ms > 0 && x.ms < old->ms) old->ms = x.ms;
      if (x.ms_median > 0 && x.ms_median < old->ms_median) old->ms_median = x.ms_median;
      got = 1;
      continue;
    }
    if (p->n == p->cap) {
      size_t cap = p->cap ? 2 * p->cap : 64;
      ckv_peer_row *r = realloc(p->rows, cap * sizeof *r);
      if (!r) break;
      p->rows = r, p->cap = cap;
    }
    p->rows[p->n++] = x;
    got = 1;
  }
  p->runs += got;
  int rc = pclose(f);
  if (!p->n) snprintf(p->skipped, sizeof p->skipped, "skipped: %s printed no rows (exit status %d)", path, rc);
}

void ckv_peer_free(ckv_peer *p) {
  free(p->rows);
  memset(p, 0, sizeof *p);
}

const ckv_peer_row *ckv_peer_find(const ckv_peer *p, const char *op, const char *format, int threads, size_t tokens,
                                  const char *layout) {
  if (!format) return NULL;
  for (size_t i = 0; i < p->n; i++) {
    const ckv_peer_row *r = &p->rows[i];
    if (strcmp(r->op, op) || strcmp(r->format, format) || r->threads != threads) continue;
    if (!strcmp(op, "attention") && (r->tokens != tokens || strcmp(r->layout, layout))) continue;
    return r;
  }
  return NULL;
}
