/* bench_epoch.c - `commitkv-bench epoch`: how long a worker waits on the
 * daemon's memory work, on the backend the daemon runs (auto: the GPU when
 * one answers).
 *
 *  - attach: ckv_client_connect (attach socket, arena import/map, Hello),
 *    repeated, median and max;
 *  - for a session of --tokens tokens (32K by default), each round: the
 *    ReportRound round trip, then the time from sending it until the daemon
 *    has published every transition it decided (compressor queue empty and
 *    its pending_tokens down to what waits by design: staged tokens fill
 *    committed blocks a whole 32-token key chunk at a time, so fewer than a
 *    chunk per committed format wait for more; polled with Stats requests
 *    every 200 us, so
 *    figures carry up to that much polling slack), with the transitions that
 *    round moved, and the compressor threads' own time on that round's jobs
 *    (Stats compress_busy_us before and after: the kernels), so "x kernel"
 *    reads as what publishing costs on top of moving the bytes.
 *
 * The bench writes every token's K/V into its draft slot, as a worker does
 * (so the daemon's reads meet pages a worker touched, not holes), and times
 * a memcpy of each round's source bytes (the moved tokens in the format they
 * left) in this process: "GB/s" is those bytes over the kernel time, "x
 * memcpy" that against the memcpy of the same count.  A table for people;
 * --json prints one object. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "commitkv/commitkv.h"
#include "kernels/format.h"

#define MAX_ROUNDS 64
/* Pending tokens that wait for more by design: a partial key chunk per
 * committed format (INT4, INT2). */
#define WAITING_BY_DESIGN (2u * (CKV_COMMIT_CHUNK_TOKENS - 1u))

typedef struct round_fig {
  double report_us, publish_us;
  double kernel_us; /* the compressor threads' time on this round's jobs (Stats compress_busy_us) */
  uint64_t moved, epoch;
  uint64_t src_bytes; /* the moved tokens' bytes in the format they left */
  double memcpy_us;   /* a memcpy of src_bytes in this process */
} round_fig;

/* Bytes one token takes in the format of state `from` (CKV_TOKEN_*: draft
 * FP16, staged INT8 with its scales); 0 for states that hold no bytes. */
static uint64_t token_bytes(const ckv_geometry *g, uint8_t from) {
  if (from == CKV_TOKEN_DRAFT) return (uint64_t)g->n_layers * g->n_kv_heads * g->head_dim * 4u;
  if (from == CKV_TOKEN_STAGED) return ckv_format_block_bytes(CKV_FORMAT_STAGED, g, 64, g->head_dim) / 64u;
  return 0;
}

/* Microseconds of one memcpy of `bytes` between two buffers touched before
 * (the best of three, so a page fault or a preemption does not count). */
static double memcpy_us(uint64_t bytes) {
  if (!bytes) return 0;
  uint8_t *a = malloc(bytes), *b = malloc(bytes);
  double best = 0;
  if (a && b) {
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int i = 0; i < 3; i++) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      memcpy(b, a, bytes);
      __asm__ volatile("" : : "r"(b) : "memory");
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double us = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
      if (i == 0 || us < best) best = us;
    }
  }
  free(a);
  free(b);
  return best;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double gbps(uint64_t bytes, double us) { return us > 0 ? (double)bytes / us / 1e3 : 0.0; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void usage(void) {
  fprintf(stderr, "usage: commitkv-bench epoch [--backend auto|host|cuda] [--tokens N] [--rounds N]\n"
                  "       [--layers N] [--kv-heads N] [--head-dim N] [--attach-reps N] [--daemon PATH] [--json]\n");
}

int ckv_bench_epoch(int argc, char **argv) {
  const char *backend = "auto", *daemon_arg = NULL;
  unsigned tokens = 32768, rounds = 6, reps = 10;
  ckv_geometry g = {.n_layers = 4, .n_kv_heads = 8, .head_dim = 128, .dtype = 0};
  bool json = false;
  static const struct option opts[] = {{"backend", required_argument, 0, 'b'}, {"tokens", required_argument, 0, 't'},
                                       {"rounds", required_argument, 0, 'r'},  {"layers", required_argument, 0, 'l'},
                                       {"kv-heads", required_argument, 0, 'k'}, {"head-dim", required_argument, 0, 'd'},
                                       {"attach-reps", required_argument, 0, 'a'}, {"daemon", required_argument, 0, 'D'},
                                       {"json", no_argument, 0, 'j'},           {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  optind = 1;
  for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    switch (o) {
      case 'b': backend = optarg; break;
      case 't': tokens = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'r': rounds = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'l': g.n_layers = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'k': g.n_kv_heads = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'd': g.head_dim = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'a': reps = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'D': daemon_arg = optarg; break;
      case 'j': json = true; break;
      case 'h': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (!tokens || !rounds || rounds > MAX_ROUNDS || !reps || reps > 1000) {
    fprintf(stderr, "commitkv-bench epoch: --tokens >= 1, --rounds 1..%d, --attach-reps 1..1000\n", MAX_ROUNDS);
    return 2;
  }
  char daemon_path[4096], dir[] = "/tmp/ckv-bench-epoch-XXXXXX";
  if (ckv_bench_find_daemon(daemon_arg, daemon_path, sizeof(daemon_path)) < 0 || !mkdtemp(dir)) {
    fprintf(stderr, "commitkv-bench epoch: no commitkvd or no temporary directory\n");
    return 1;
  }
  /* Room for every token in FP16 with slack for staged/committed copies. */
  uint64_t fp16 = (uint64_t)tokens * g.n_layers * g.n_kv_heads * g.head_dim * 4u;
  char memory[32];
  snprintf(memory, sizeof(memory), "%lluM", (unsigned long long)(fp16 * 2 / (1u << 20) + 256));
  ckv_bench_daemon d = {0};
  d.backend = backend;
  int rc = 0;
  ckv_client *c = NULL;
  ckv_session *s = NULL;
  const char *memory_kind = "none";
  float *attn = NULL;
  double attach[1000];
  round_fig fig[MAX_ROUNDS] = {{0}};
  if (ckv_bench_daemon_start(&d, daemon_path, dir, memory) < 0) {
    rc = 1;
    goto out;
  }
  ckv_client_options co = {.socket = d.socket, .attach_socket = d.attach, .name = "bench-epoch", .timeout_ms = 60000};
  for (unsigned i = 0; i < reps; i++) {
    double t0 = now_us();
    int r = ckv_client_connect(&co, &c);
    attach[i] = now_us() - t0;
    if (r < 0) {
      fprintf(stderr, "commitkv-bench epoch: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
      rc = 1;
      goto out;
    }
    if (i + 1 < reps) c = ckv_client_free(c);
  }
  memory_kind = ckv_client_memory_kind(c); /* what auto resolved to: a static string */
  int r = ckv_session_open(c, "bench-epoch", &g, NULL, &s);
  for (unsigned done = 0; r == 0 && done < tokens;) {
    uint32_t n = tokens - done < 4096 ? tokens - done : 4096;
    uint64_t first = 0;
    r = ckv_session_append(s, n, NULL, NULL, NULL, NULL, &first);
    /* The worker's writes: FP16 1.0 and -1.0 by token (values do not change
     * the kernels' work; the daemon then reads pages a worker touched). */
    size_t row = (size_t)g.n_kv_heads * g.head_dim * sizeof(uint16_t);
    for (uint32_t i = 0; r == 0 && i < n; i++)
      for (uint32_t l = 0; l < g.n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
          uint16_t *p = ckv_session_kv_ptr(s, first + i, l, kv);
          if (!p) {
            r = CKV_ERR_RANGE;
            break;
          }
          for (size_t e = 0; e < row / sizeof(uint16_t); e++) p[e] = (i + e) % 2 ? 0x3c00 : 0xbc00;
        }
    done += n;
  }
  attn = malloc((size_t)tokens * sizeof(*attn));
  if (r < 0 || !attn) {
    fprintf(stderr, "commitkv-bench epoch: session of %u tokens: %s: %s\n", tokens, ckv_strerror(r < 0 ? r : -12),
            ckv_client_last_error(c));
    rc = 1;
    goto out;
  }
  for (unsigned k = 0; k < rounds && rc == 0; k++) {
    /* Half the tokens draw 1.9x the mean attention, half 0.1x, shifting by
     * round: staging, then commits and recycling as the history builds. */
    for (unsigned i = 0; i < tokens; i++) attn[i] = ((i / 64 + k) % 2 ? 1.9f : 0.1f) / (float)tokens;
    ckv_round_result res;
    uint64_t busy0 = 0, busy = 0;
    if ((r = ckv_bench_compress_stats(c, NULL, NULL, &busy0)) < 0) {
      fprintf(stderr, "commitkv-bench epoch: stats: %s\n", ckv_strerror(r));
      rc = 1;
      break;
    }
    double t0 = now_us();
    r = ckv_session_report(s, k + 1, 0, attn, tokens, &res);
    fig[k].report_us = now_us() - t0;
    if (r < 0) {
      fprintf(stderr, "commitkv-bench epoch: report round %u: %s: %s\n", k + 1, ckv_strerror(r), ckv_client_last_error(c));
      rc = 1;
      break;
    }
    for (size_t i = 0; i < res.n_transitions; i++) {
      fig[k].moved += res.transitions[i].count;
      fig[k].src_bytes += res.transitions[i].count * token_bytes(&g, res.transitions[i].from);
    }
    uint64_t pend = res.pending, queue = res.pending ? 1 : 0; /* unknown until asked */
    while (pend > WAITING_BY_DESIGN || queue) {
      usleep(200);
      if ((r = ckv_bench_compress_stats(c, &pend, &queue, &busy)) < 0) {
        fprintf(stderr, "commitkv-bench epoch: stats: %s\n", ckv_strerror(r));
        rc = 1;
        break;
      }
      if (now_us() - t0 > 60e6) {
        fprintf(stderr, "commitkv-bench epoch: round %u: %llu tokens still pending after 60 s\n", k + 1,
                (unsigned long long)pend);
        rc = 1;
        break;
      }
    }
    fig[k].publish_us = now_us() - t0;
    if (busy == 0 && ckv_bench_compress_stats(c, NULL, NULL, &busy) < 0) busy = busy0;
    fig[k].kernel_us = busy > busy0 ? (double)(busy - busy0) : 0;
    const ckv_view *v;
    if (ckv_session_view(s, &v) == 0) {
      fig[k].epoch = v->epoch;
      (void)ckv_session_ack(s, v->epoch, NULL);
    }
  }
out:
  if (s) ckv_session_drop(s);
  for (unsigned k = 0; rc == 0 && k < rounds; k++) fig[k].memcpy_us = memcpy_us(fig[k].src_bytes);
  ckv_client_free(c);
  free(attn);
  if (d.pid > 0 && ckv_bench_daemon_stop(&d) != 0) rc = 1;
  ckv_bench_rm_tree(dir);
  if (rc) return rc;
  double sorted[1000];
  memcpy(sorted, attach, reps * sizeof(double));
  qsort(sorted, reps, sizeof(double), cmp_double);
  if (json) {
    printf("{\"bench\":\"epoch\",\"backend\":\"%s\",\"memory\":\"%s\",\"tokens\":%u,\"geometry\":[%u,%u,%u],\"attach_us\":{\"median\":%.1f,"
           "\"max\":%.1f,\"reps\":%u},\"rounds\":[",
           backend, memory_kind, tokens, g.n_layers, g.n_kv_heads, g.head_dim, sorted[reps / 2], sorted[reps - 1], reps);
    for (unsigned k = 0; k < rounds; k++)
      printf("%s{\"round\":%u,\"report_us\":%.1f,\"report_to_published_us\":%.1f,\"kernel_us\":%.1f,"
             "\"published_to_kernel\":%.2f,\"ratio_to_kernel\":%.2f,\"moved\":%llu,\"epoch\":%llu,"
             "\"src_bytes\":%llu,\"kernel_gbps\":%.2f,\"memcpy_us\":%.1f,\"memcpy_gbps\":%.2f,"
             "\"kernel_to_memcpy\":%.3f}",
             k ? "," : "", k + 1, fig[k].report_us, fig[k].publish_us, fig[k].kernel_us,
             fig[k].kernel_us > 0 ? fig[k].publish_us / fig[k].kernel_us : 0.0,
             fig[k].kernel_us > 0 ? fig[k].publish_us / fig[k].kernel_us : 0.0, (unsigned long long)fig[k].moved,
             (unsigned long long)fig[k].epoch, (unsigned long long)fig[k].src_bytes, gbps(fig[k].src_bytes, fig[k].kernel_us),
             fig[k].memcpy_us, gbps(fig[k].src_bytes, fig[k].memcpy_us),
             fig[k].kernel_us > 0 ? fig[k].memcpy_us / fig[k].kernel_us : 0.0);
    printf("]}\n");
  } else {
    printf("commitkv-bench epoch: backend %s (KV in %s memory), %u tokens, geometry %ux%ux%u FP16\n", backend,
           memory_kind, tokens, g.n_layers, g.n_kv_heads, g.head_dim);
    printf("attach (connect + arena import): median %.0f us, max %.0f us over %u\n", sorted[reps / 2],
           sorted[reps - 1], reps);
    printf("%-6s %10s %21s %10s %9s %9s %8s %8s %9s %8s %6s\n", "round", "report us", "report->published us",
           "kernel us", "x kernel", "moved", "src MB", "GB/s", "memcpy us", "x memcpy", "epoch");
    for (unsigned k = 0; k < rounds; k++)
      printf("%-6u %10.0f %21.0f %10.0f %9.2f %9llu %8.1f %8.2f %9.0f %8.3f %6llu\n", k + 1, fig[k].report_us,
             fig[k].publish_us, fig[k].kernel_us, fig[k].kernel_us > 0 ? fig[k].publish_us / fig[k].kernel_us : 0.0,
             (unsigned long long)fig[k].moved, (double)fig[k].src_bytes / 1e6, gbps(fig[k].src_bytes, fig[k].kernel_us),
             fig[k].memcpy_us, fig[k].kernel_us > 0 ? fig[k].memcpy_us / fig[k].kernel_us : 0.0,
             (unsigned long long)fig[k].epoch);
  }
  return 0;
}
