/* kernels_peer.h - the outside peer of `commitkv-bench kernels --peer PATH` (issue 42):
 * runs the peer program (bench/peer/ggml_peer.c, built by `make bench-peer`) as a
 * separate process and keeps the JSON rows it prints, so each of our rows can carry
 * ratio_peer = peer time / our time, the peer at equal or more bits per element. */
#ifndef CKV_BENCH_KERNELS_PEER_H
#define CKV_BENCH_KERNELS_PEER_H

#include <stddef.h>

typedef struct ckv_peer_row {
  char op[16], format[16], layout[16]; /* layout: attention only ("contiguous", "llama") */
  double bits;
  int threads;
  size_t tokens;      /* attention */
  double ns_per_elem; /* quantize / dequantize */
  double ms, ms_median; /* attention */
} ckv_peer_row;

typedef struct ckv_peer {
  ckv_peer_row *rows;
  size_t n, cap;
  int runs; /* how many runs of the peer printed rows */
  char skipped[256]; /* non-empty: why there are no rows */
} ckv_peer;

/* Runs `path --mib MIB --tokens T1,T2.. --threads THREADS [--quick]` and keeps its rows
 * (p zeroed before the first call).  A second call merges: a row already there keeps the
 * better (lower) of its two times, so a peer run before ours and one after it leave no
 * advantage to either side from the load changing in between.  Never fails: a missing
 * program, a failed run or no rows leave p->n as it was and, with no rows at all, say why
 * in p->skipped. */
void ckv_peer_run(ckv_peer *p, const char *path, size_t mib, const size_t *tokens, size_t n_tokens, int threads,
                  int quick);
void ckv_peer_free(ckv_peer *p);

/* The peer's format for one of ours in an op ("quantize", "dequantize") or attention: the
 * fewest bits at or above ours among those the peer runs; NULL when there is none. */
const char *ckv_peer_format_for(const char *op, const char *ours);
/* A row of the peer: op, format, threads (and tokens and layout for attention); NULL if none. */
const ckv_peer_row *ckv_peer_find(const ckv_peer *p, const char *op, const char *format, int threads, size_t tokens,
                                  const char *layout);

#endif
