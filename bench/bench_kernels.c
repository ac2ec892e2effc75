/* bench_kernels.c - `commitkv-bench kernels [--json] [--quick] [--mib N] [--tokens N[,N...]]`:
 * throughput of each kernel operation (GB/s of bytes read + written, on
 * buffers larger than the last-level cache) next to memcpy measured in the
 * same run on the same sizes, and fused decode attention for one layer at
 * realistic geometry (8 KV heads, 32 query heads, head_dim 128) over 4K, 32K
 * and 128K tokens stored all-draft (fp16), all-staged (int8), all-committed
 * (int4, int2) and a realistic mix.  One thread, the auto-detected CPU path.
 * --quick: CI-sized (32 MiB, 1K/4K tokens, few iterations); --mib N: op
 * buffer size; --tokens N,...: the attention sizes instead (multiples of 512, e.g. 32768);
 * --cpu-time: time with the thread CPU clock instead of wall.
 * --only ops|attention: that half only (memcpy is measured either way; the rows of the other half are absent).
 * --peer PATH: before ours and again after, runs the outside peer PATH (bench/peer/ggml_peer.c,
 * built by `make bench-peer`: ggml's CPU kernels) on the same sizes and thread count, each peer
 * figure the better of its two runs (a load change between the phases favours neither side, or
 * the peer); each ops and
 * attention row with a peer format at equal or more bits gains ratio_peer (peer time / ours;
 * attention also ratio_peer_llama, the peer reading llama.cpp's cache layout); where the
 * peer is missing or failed the rows say "peer": "skipped: why".
 * Every quantize / dequantize (int8, int4, int2, rot4, rot3, rot2, rot1) and
 * prune_keys runs on one thread and on all, beside a plain-C baseline that
 * writes the same bytes (quant_plain.c, where the CPU has AVX2/F16C; checked,
 * a mismatch printed loudly): GB/s, x memcpy (of as many threads) and x
 * plain C, "ops" in JSON.
 * Every ops and attention row in JSON carries ratio_bound: the time its
 * bytes (ops: read + written; attention: the blocks read) take at the
 * memcpy bandwidth of all threads measured in this run (memcpy_threads_gbps,
 * or memcpy_gbps on one CPU), over its own time; 1 is the memory bound.
 * The attention rows run each format's defaults (kernels.h: integer scores
 * and BF16 values for ROT4 and ROT2 where the CPU has them), named by the
 * row's "scores" and "values", and carry the same call on one thread (ms_1t,
 * speedup_vs_fp16_1t: the figures to read with --cpu-time).
 * The formats with integer scores (int8, int4, rot4, rot2) are also timed with
 * them (ckv_attn_args.scores, the query quantized to INT8) beside the float
 * scores and FP32 values of the same blocks, on all threads and on one: "attention_int" in
 * JSON, with the output cosine of integer against float scores; rot4 and rot2 also
 * with BF16 values (ckv_attn_args.values) where the CPU has AVX512_BF16:
 * values_bf16_us, int_values_bf16_us (integer scores and BF16 values), the
 * same on one thread, and speedup_int_bf16_vs_float (against the float
 * scores and FP32 values of the same blocks); int8 with integer values
 * (ckv_attn_args.values = CKV_ATTN_VALUES_INT8) where the CPU has AVX-512 VNNI:
 * values_int8_us, values_int8_1t_us and their speedups over FP32 values.
 * On a machine with a GPU the CUDA kernels' figures follow (ckv-bench-gpu,
 * run beside this binary: GB/s against the device's peak bandwidth, fused
 * attention at 4K/32K/128K tokens per format), under "gpu" with --json.
 * Reports figures only; it never judges them. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/attention_plain.h"
#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "bench/kernels_peer.h"
#include "bench/quant_plain.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#ifdef CKV_HAVE_CUDA_KERNELS
#include "kernels/cuda/kernels_cuda.h"
#endif

typedef struct attn_result {
  uint32_t tokens;
  const char *format;
  double us, gbps, bits;
  double us_1t;                /* the same call on one thread */
  const char *scores, *values; /* what the defaults chose for the row's (rotated, else main) format */
} attn_result;

/* The fp16 rows' baselines: the plain-C attention (attention_plain.c) and the
 * fused kernel on one thread, timed in the same run on the same blocks. */
/* A format's integer scores against its float scores, same blocks, same run. */
typedef struct attn_int_result {
  uint32_t tokens;
  const char *format;
  double float_us, int_us, float_1t_us, int_1t_us, cosine_min;
  /* ROT4 with BF16 values (CPUs with AVX512_BF16; else 0): float and integer scores, all threads and one */
  double bf16_us, int_bf16_us, bf16_1t_us, int_bf16_1t_us, bf16_cosine_min;
  /* INT8 with integer values (CPUs with AVX-512 VNNI; else 0): float scores, all threads and one */
  double i8v_us, i8v_1t_us, i8v_cosine_min;
} attn_int_result;

typedef struct attn_baseline {
  double plain_us, one_thread_us, max_abs_diff; /* plain_us < 0: not run (CPU without AVX2/F16C) */
} attn_baseline;



/* Wall clock by default; --cpu-time uses the thread's CPU clock, for machines shared with other jobs. */
static clockid_t g_clock = CLOCK_MONOTONIC;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(g_clock, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cosine(const float *a, const float *b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
  return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 1.0;
}

/* Blocks of one format, all allocated in one arena-like buffer. */
typedef struct blockset {
  uint8_t *mem;
  void **blk;
  size_t n, bytes_each;
} blockset;

static int blockset_new(blockset *s, uint32_t fmt, const ckv_geometry *g, uint32_t cap, uint32_t kept, size_t n) {
  s->bytes_each = ckv_format_block_bytes(fmt, g, cap, kept);
  s->n = n;
  s->mem = aligned_alloc(64, s->bytes_each * n);
  s->blk = calloc(n, sizeof(void *));
  if (!s->mem || !s->blk) return -1;
  for (size_t i = 0; i < n; i++) {
    s->blk[i] = s->mem + i * s->bytes_each;
    memset(s->blk[i], 0, s->bytes_each); /* touch every page before timing */
    ckv_block_init(s->blk[i], fmt, g, cap, kept, 1);
  }
  return 0;
}
static void blockset_reinit(blockset *s, uint32_t fmt, const ckv_geometry *g, uint32_t cap, uint32_t kept) {
  for (size_t i = 0; i < s->n; i++) ckv_block_init(s->blk[i], fmt, g, cap, kept, 1);
}
static void blockset_free(blockset *s) {
  free(s->mem);
  free(s->blk);
  memset(s, 0, sizeof *s);
}

/* Draft blocks full of pseudo-random FP16 (a random table tiled with a moving offset). */
static int drafts_new(blockset *s, const ckv_geometry *g, size_t tokens, uint64_t seed) {
  if (blockset_new(s, CKV_FORMAT_DRAFT, g, 16, 0, tokens / 16)) return -1;
  enum { TAB = 1 << 15 };
  static uint16_t tab[TAB + 4096];
  uint64_t x = seed | 1;
  for (size_t i = 0; i < TAB + 4096; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    float f = ((float)((x >> 40) & 0xffff) / 32768.0f - 1.0f) * ((x & 63) == 0 ? 20.0f : 2.0f);
    tab[i] = ckv_f32_to_f16(f);
  }
  size_t te = ckv_draft_token_elems(g), off = 0;
  for (size_t b = 0; b < s->n; b++) {
    for (uint32_t l = 0; l < g->n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t t = 0; t < 16; t++) {
          uint16_t *d = (uint16_t *)((uint8_t *)s->blk[b] + ckv_draft_kv_offset(g, 16, l, kv, t));
          for (size_t e = 0; e < te; e += 4096) {
            size_t n = te - e < 4096 ? te - e : 4096;
            memcpy(d + e, tab + off, n * 2);
            off = (off + 997) % TAB;
          }
        }
    for (uint32_t t = 0; t < 16; t++) {
      ckv_block_positions(s->blk[b])[t] = (uint32_t)(b * 16 + t);
      ckv_block_set_valid(s->blk[b], t, true);
    }
  }
  return 0;
}

/* Moves of every draft token, in order, into dst blocks of capacity dcap. */
static ckv_move *moves_new(const blockset *src, const blockset *dst, uint32_t dcap, size_t tokens) {
  ckv_move *m = malloc(tokens * sizeof *m);
  if (!m) return NULL;
  for (size_t i = 0; i < tokens; i++)
    m[i] = (ckv_move){.src = src->blk[i / 16], .src_slot = (uint32_t)(i % 16), .dst = dst->blk[i / dcap], .dst_slot = (uint32_t)(i % dcap)};
  return m;
}

static double best_of(int reps, double (*fn)(void *), void *ctx) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = fn(ctx);
    if (t < best) best = t;
  }
  return best;
}

typedef struct op_ctx {
  const ckv_geometry *g;
  blockset *src, *dst;
  ckv_move *moves;
  size_t tokens;
  uint32_t fmt, cap, kept;
  float *ring;
  size_t ring_floats;
  uint8_t *a, *b;
  size_t bytes;
} op_ctx;

static double run_memcpy(void *p) {
  op_ctx *c = p;
  double t = now_s();
  memcpy(c->b, c->a, c->bytes);
  return now_s() - t;
}
static size_t llc_bytes(void) {
#ifdef _SC_LEVEL3_CACHE_SIZE
  long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v > 0) return (size_t)v;
#endif
  return 0;
}

/* ---- ops: quantize / dequantize / prune, ours against plain C (quant_plain.c) ----
 * Each op runs on one thread and on all (the blocks split in contiguous
 * ranges, one per thread: the kernels take any subset of moves or blocks),
 * ours and the plain-C baseline on the same drafts, timed the same way; the
 * baseline's output is compared with ours byte for byte (untimed). */
#define MAX_OPS 32
typedef struct op_row {
  const char *op, *format;
  int threads;
  double gbps, plain_gbps; /* plain_gbps < 0: not run (CPU without AVX2/F16C) */
  double ns_per_elem;      /* our time per element of K/V (for the peer's ratio) */
  int same;                /* 1 same bytes, 0 differs (printed loudly), -1 not compared */
} op_row;
static op_row g_ops[MAX_OPS];
static int g_nops;
static double g_memcpy_threads_gbps;
static int g_op_threads;
/* --peer PATH: the outside peer's rows (kernels_peer.c); g_peer_path NULL: no --peer */
static const char *g_peer_path;
static ckv_peer g_peer;

/* One op's work for one thread's share of the blocks. */
typedef struct op_job {
  int kind; /* 0 quantize, 1 dequantize, 2 prune */
  int plain;
  uint32_t fmt;
  const ckv_geometry *g;
  blockset *src, *dst;
  const ckv_move *moves;
  uint32_t cap;
  size_t b0, b1; /* destination blocks */
  float *ring;
  size_t ring_floats;
} op_job;

static void op_job_run(op_job *j) {
  size_t t0 = j->b0 * j->cap, t1 = j->b1 * j->cap;
  if (j->kind == 0) {
    if (j->plain) ckv_bench_plain_quantize(j->fmt, j->g, j->src->blk, j->dst->blk, j->cap, t0, t1);
    else ckv_kernels_move(j->g, j->moves + t0, t1 - t0, 0);
  } else if (j->kind == 1) {
    if (j->plain) {
      ckv_bench_plain_dequantize(j->g, j->dst->blk, j->b0, j->b1, j->ring, j->ring_floats);
      return;
    }
    size_t te = ckv_draft_token_elems(j->g), pos = 0;
    for (size_t b = j->b0; b < j->b1; b++)
      for (uint32_t s = 0; s < j->cap; s++)
        for (uint32_t l = 0; l < j->g->n_layers; l++)
          for (uint32_t kv = 0; kv < 2; kv++) {
            if (pos + te > j->ring_floats) pos = 0;
            ckv_kernels_dequantize(j->g, j->dst->blk[b], l, kv, s, j->ring + pos);
            pos += te;
          }
  } else {
    if (j->plain) ckv_bench_plain_prune(j->g, j->src->blk, j->dst->blk, j->cap, t0, t1);
    else ckv_kernels_prune_keys(j->g, j->moves + t0, t1 - t0);
  }
}
static void *op_thread(void *p) {
  op_job_run(p);
  return NULL;
}

typedef struct op_run {
  op_job job;
  int threads;
  uint32_t fmt, kept;
} op_run;
/* One timed run: blocks re-initialised first (untimed) where the op writes them. */
static double op_once(void *p) {
  op_run *r = p;
  if (r->job.kind != 1) blockset_reinit(r->job.dst, r->fmt, r->job.g, r->job.cap, r->kept);
  op_job jobs[64];
  pthread_t th[64];
  int n = r->threads;
  uint64_t started = 0;
  size_t nb = r->job.dst->n, per = (nb + n - 1) / n;
  double t = now_s();
  for (int k = 0; k < n; k++) {
    jobs[k] = r->job;
    jobs[k].b0 = k * per < nb ? k * per : nb;
    jobs[k].b1 = (k + 1) * per < nb ? (k + 1) * per : nb;
    jobs[k].ring = r->job.ring + (r->job.ring_floats / n) * k;
    jobs[k].ring_floats = r->job.ring_floats / n;
    if (k == n - 1 || pthread_create(&th[k], NULL, op_thread, &jobs[k]) != 0) op_job_run(&jobs[k]);
    else started |= 1ull << k;
  }
  for (int k = 0; k < n; k++)
    if (started & (1ull << k)) pthread_join(th[k], NULL);
  return now_s() - t;
}

/* Byte comparison of ours against the baseline (dequantize: block by block, through two rings). */
static int op_same(const op_run *ours, blockset *plain_dst) {
  const op_job *j = &ours->job;
  if (j->kind != 1) {
    for (size_t b = 0; b < j->dst->n; b++)
      if (memcmp(j->dst->blk[b], plain_dst->blk[b], j->dst->bytes_each)) return 0;
    return 1;
  }
  size_t rows = (size_t)j->cap * j->g->n_layers * 2u, floats = rows * ckv_draft_token_elems(j->g);
  float *a = malloc(floats * sizeof(float)), *p = malloc(floats * sizeof(float));
  int same = a && p ? 1 : -1;
  for (size_t b = 0; b < j->dst->n && same == 1; b++) {
    op_job one = *j;
    one.b0 = b, one.b1 = b + 1, one.ring = a, one.ring_floats = floats;
    op_job_run(&one);
    one.plain = 1, one.ring = p;
    op_job_run(&one);
    if (memcmp(a, p, floats * sizeof(float))) same = 0;
  }
  free(a);
  free(p);
  return same;
}

static void *memcpy_thread(void *p) {
  run_memcpy(p);
  return NULL;
}
static double memcpy_threads(void *p) {
  op_ctx *c = p;
  int n = g_op_threads;
  op_ctx parts[64];
  pthread_t th[64];
  size_t per = c->bytes / n / 64 * 64;
  uint64_t started = 0;
  double t = now_s();
  for (int k = 0; k < n; k++) {
    parts[k] = *c;
    parts[k].a = c->a + per * k, parts[k].b = c->b + per * k, parts[k].bytes = per;
    if (k == n - 1 || pthread_create(&th[k], NULL, memcpy_thread, &parts[k]) != 0) run_memcpy(&parts[k]);
    else started |= 1ull << k;
  }
  for (int k = 0; k < n; k++)
    if (started & (1ull << k)) pthread_join(th[k], NULL);
  return now_s() - t;
}

static const char *const op_formats[] = {"int8", "int4", "int2", "rot4", "rot3", "rot2", "rot1"};
static const uint32_t op_fmt_codes[] = {CKV_FORMAT_STAGED, CKV_FORMAT_COMMIT4, CKV_FORMAT_COMMIT2, CKV_FORMAT_ROT4,
                                        CKV_FORMAT_ROT3, CKV_FORMAT_ROT2, CKV_FORMAT_ROT1};

/* Every op of every format, on one thread and on all; results in g_ops.  0, or -1 when out of memory. */
static int run_ops(const ckv_geometry *g, blockset *dr, size_t tokens, int reps, op_ctx *mc) {
  size_t draft_bytes = dr->n * dr->bytes_each, fp32_bytes = tokens * ckv_token_elems(g) * 4;
  int plain_ok = ckv_bench_quant_plain_supported();
  ckv_move *moves = NULL;
  g_nops = 0;
  for (int f = 0; f <= (int)(sizeof(op_formats) / sizeof(op_formats[0])); f++) {
    int prune = f == (int)(sizeof(op_formats) / sizeof(op_formats[0])); /* the last: prune_keys on int4, 64 of 128 kept */
    uint32_t fmt = prune ? CKV_FORMAT_COMMIT4 : op_fmt_codes[f], kept = prune ? 64 : 0;
    blockset ours = {0}, plain = {0};
    if (blockset_new(&ours, fmt, g, 64, kept, tokens / 64) || blockset_new(&plain, fmt, g, 64, kept, tokens / 64)) return -1;
    free(moves);
    moves = moves_new(dr, &ours, 64, tokens);
    ckv_move *pmoves = moves_new(dr, &plain, 64, tokens);
    if (!moves || !pmoves) return -1;
    size_t dst_bytes = ours.n * ours.bytes_each;
    for (int kind = prune ? 2 : 0; kind <= (prune ? 2 : 1); kind++) {
      size_t bytes = kind == 0 ? draft_bytes + dst_bytes : kind == 1 ? dst_bytes + fp32_bytes : draft_bytes / 2;
      if (kind == 1) { /* ours quantized again, marked valid: the input of both dequantizers */
        blockset_reinit(&ours, fmt, g, 64, kept);
        ckv_kernels_move(g, moves, tokens, CKV_MOVE_SET_VALID);
      }
      int nt = g_op_threads > 1 ? 2 : 1;
      for (int ti = 0; ti < nt && g_nops < MAX_OPS; ti++) {
        int threads = ti ? g_op_threads : 1;
        op_row *row = &g_ops[g_nops++];
        row->op = kind == 0 ? "quantize" : kind == 1 ? "dequantize" : "prune_keys";
        row->format = prune ? "int4" : op_formats[f];
        row->threads = threads;
        op_run r = {.job = {.kind = kind, .fmt = fmt, .g = g, .src = dr, .dst = &ours, .moves = moves, .cap = 64, .ring = mc->ring,
                            .ring_floats = mc->ring_floats},
                    .threads = threads, .fmt = fmt, .kept = kept};
        double secs = best_of(reps, op_once, &r);
        row->gbps = bytes / secs / 1e9;
        row->ns_per_elem = secs * 1e9 / ((double)tokens * ckv_token_elems(g));
        row->plain_gbps = -1;
        row->same = -1;
        if (!plain_ok) continue;
        op_run pr = r;
        pr.job.plain = 1;
        if (kind != 1) pr.job.dst = &plain, pr.job.moves = pmoves;
        row->plain_gbps = bytes / best_of(reps, op_once, &pr) / 1e9;
        if (threads == 1 || kind != 1) { /* each set holds its last timed run's whole output */
          row->same = op_same(&r, &plain);
          if (row->same == 0)
            fprintf(stderr, "kernels: *** MISMATCH: %s %s on %d threads: the plain-C baseline's bytes differ from ours ***\n", row->op,
                    row->format, threads);
        } else { /* dequantized on several threads: the rows each thread reads, compared on one above */
          row->same = g_ops[g_nops - 2].same;
        }
      }
    }
    free(pmoves);
    blockset_free(&ours);
    blockset_free(&plain);
  }
  free(moves);
  return 0;
}

static double op_memcpy(const op_row *o, double memcpy_gbps) {
  return o->threads > 1 && g_memcpy_threads_gbps > 0 ? g_memcpy_threads_gbps : memcpy_gbps;
}
/* The byte bound of a row moving (or reading) bytes at gbps: its time at the memory bandwidth of all threads
 * (memcpy on every thread, bytes read plus written, this run), over its own time. */
static double ratio_bound(double gbps, double memcpy_gbps) {
  double bw = g_memcpy_threads_gbps > 0 ? g_memcpy_threads_gbps : memcpy_gbps;
  return bw > 0 ? gbps / bw : 0.0;
}
/* ---- the peer (--peer PATH, kernels_peer.c): ratio_peer = peer time / ours, peer at >= our bits ---- */
/* Why a row has no ratio_peer, or NULL when it has one (*ret the peer's row). */
static const char *peer_lookup(const char *op, const char *format, int threads, size_t tokens, const char *layout,
                               const char **ret_fmt, const ckv_peer_row **ret) {
  *ret = NULL;
  *ret_fmt = ckv_peer_format_for(op, format);
  if (!strcmp(op, "prune_keys") || !*ret_fmt) return "none: no peer format at or above these bits";
  if (!g_peer.n) return g_peer.skipped;
  *ret = ckv_peer_find(&g_peer, op, *ret_fmt, threads, tokens, layout);
  return *ret ? NULL : "skipped: the peer printed no such row";
}
static void print_peer_op_json(const op_row *o) {
  if (!g_peer_path) return;
  const char *pf;
  const ckv_peer_row *r;
  const char *why = peer_lookup(o->op, o->format, o->threads, 0, "", &pf, &r);
  if (why) {
    printf(", \"peer\": \"%s\", \"ratio_peer\": null", why);
    return;
  }
  printf(", \"peer\": \"ggml\", \"peer_format\": \"%s\", \"peer_bits\": %.4f, \"ns_per_elem\": %.5f, "
         "\"peer_ns_per_elem\": %.5f, \"ratio_peer\": %.3f",
         pf, r->bits, o->ns_per_elem, r->ns_per_elem, r->ns_per_elem / o->ns_per_elem);
}
static void print_peer_attn_json(const char *format, size_t tokens, double us) {
  if (!g_peer_path) return;
  const char *pf;
  const ckv_peer_row *r, *rl;
  const char *why = peer_lookup("attention", format, g_op_threads, tokens, "contiguous", &pf, &r);
  if (why) {
    printf(", \"peer\": \"%s\", \"ratio_peer\": null", why);
    return;
  }
  rl = ckv_peer_find(&g_peer, "attention", pf, g_op_threads, tokens, "llama");
  printf(", \"peer\": \"ggml\", \"peer_format\": \"%s\", \"peer_bits\": %.4f, \"peer_ms\": %.4f, "
         "\"peer_ms_median\": %.4f, \"ratio_peer\": %.3f",
         pf, r->bits, r->ms, r->ms_median, r->ms * 1e3 / us);
  if (rl) printf(", \"peer_llama_ms\": %.4f, \"ratio_peer_llama\": %.3f", rl->ms, rl->ms * 1e3 / us);
}

static void print_peer_text(const attn_result *ar, int nar) {
  printf("\npeer %s: time per element (ops) or per call (attention), ours and the peer's at equal or more bits\n",
         g_peer_path);
  if (!g_peer.n) {
    printf("  %s\n", g_peer.skipped);
    return;
  }
  printf("%-11s %-6s %7s %8s %12s %-7s %6s %12s %9s\n", "op", "format", "threads", "tokens", "ours", "peer", "bits",
         "peer's", "peer/ours");
  for (int i = 0; i < g_nops; i++) {
    const char *pf;
    const ckv_peer_row *r;
    if (peer_lookup(g_ops[i].op, g_ops[i].format, g_ops[i].threads, 0, "", &pf, &r)) continue;
    printf("%-11s %-6s %7d %8s %9.3f ns %-7s %6.2f %9.3f ns %9.2f\n", g_ops[i].op, g_ops[i].format, g_ops[i].threads, "-",
           g_ops[i].ns_per_elem, pf, r->bits, r->ns_per_elem, r->ns_per_elem / g_ops[i].ns_per_elem);
  }
  for (int i = 0; i < nar; i++)
    for (int lay = 0; lay < 2; lay++) {
      const char *pf;
      const ckv_peer_row *r;
      if (peer_lookup("attention", ar[i].format, g_op_threads, ar[i].tokens, lay ? "llama" : "contiguous", &pf, &r)) continue;
      printf("%-11s %-6s %7d %8u %9.3f ms %-7s %6.2f %9.3f ms %9.2f%s\n", "attention", ar[i].format, g_op_threads,
             ar[i].tokens, ar[i].us / 1e3, pf, r->bits, r->ms, r->ms * 1e3 / ar[i].us, lay ? " (llama.cpp's layout)" : "");
    }
}

static void print_ops_json(double memcpy_gbps) {
  printf("\"memcpy_threads_gbps\": %.3f, \"ops_threads\": %d, \"ops\": [", g_memcpy_threads_gbps, g_op_threads);
  for (int i = 0; i < g_nops; i++) {
    const op_row *o = &g_ops[i];
    double mc = op_memcpy(o, memcpy_gbps);
    printf("%s{\"name\": \"%s_%s\", \"op\": \"%s\", \"format\": \"%s\", \"threads\": %d, \"gbps\": %.3f, "
           "\"ratio_to_memcpy\": %.3f, \"ratio_memcpy\": %.3f, \"ratio_bound\": %.3f, \"plain_gbps\": %.3f, "
           "\"ratio_plain\": %.3f, \"same_bytes\": %s",
           i ? ", " : "", o->op, o->format, o->op, o->format, o->threads, o->gbps, o->gbps / mc, o->gbps / mc,
           ratio_bound(o->gbps, memcpy_gbps), o->plain_gbps, o->plain_gbps > 0 ? o->gbps / o->plain_gbps : 0.0,
           o->same < 0 ? "null" : o->same ? "true" : "false");
    print_peer_op_json(o);
    printf("}");
  }
  printf("], \"quant_baselines\": [");
  for (int i = 0, n = 0; i < g_nops; i++) /* the earlier key: the one-thread rows against plain C */
    if (g_ops[i].threads == 1)
      printf("%s{\"op\": \"%s\", \"format\": \"%s\", \"threads\": 1, \"gbps\": %.3f, \"plain_c_gbps\": %.3f, "
             "\"ratio_plain\": %.3f, \"ratio_memcpy\": %.3f, \"plain_ratio_memcpy\": %.3f}",
             n++ ? ", " : "", g_ops[i].op, g_ops[i].format, g_ops[i].gbps, g_ops[i].plain_gbps,
             g_ops[i].plain_gbps > 0 ? g_ops[i].gbps / g_ops[i].plain_gbps : 0.0, g_ops[i].gbps / memcpy_gbps,
             g_ops[i].plain_gbps > 0 ? g_ops[i].plain_gbps / memcpy_gbps : 0.0);
  printf("], ");
}
static void print_ops_text(double memcpy_gbps) {
  printf("\nmemcpy: %.2f GB/s (read + written), %.2f GB/s on %d threads\n"
         "ours against a plain-C baseline of the same bytes (quant_plain.c), same drafts, same bytes counted\n"
         "%-11s %-6s %7s %9s %9s %10s %9s %6s\n",
         memcpy_gbps, g_memcpy_threads_gbps, g_op_threads, "op", "format", "threads", "GB/s", "x memcpy", "plain GB/s",
         "vs plain", "same");
  for (int i = 0; i < g_nops; i++) {
    const op_row *o = &g_ops[i];
    if (o->plain_gbps < 0)
      printf("%-11s %-6s %7d %9.2f %9.2f %10s %9s %6s\n", o->op, o->format, o->threads, o->gbps,
             o->gbps / op_memcpy(o, memcpy_gbps), "-", "(no AVX2)", "-");
    else
      printf("%-11s %-6s %7d %9.2f %9.2f %10.2f %9.2f %6s\n", o->op, o->format, o->threads, o->gbps,
             o->gbps / op_memcpy(o, memcpy_gbps), o->plain_gbps, o->gbps / o->plain_gbps,
             o->same < 0 ? "-" : o->same ? "yes" : "NO!");
  }
}

/* ---- attention ---- */
/* Best of a few timed calls, at least min_iters and about `budget` seconds. */
static double best_call(int (*fn)(void *), void *ctx, int min_iters, double budget) {
  double best = 1e30, spent = 0;
  for (int iters = 0; iters < min_iters || (spent < budget && iters < 50); iters++) {
    double t = now_s();
    fn(ctx);
    t = now_s() - t;
    spent += t;
    if (t < best) best = t;
  }
  return best;
}
typedef struct plain_ctx {
  const ckv_geometry *g;
  const void *const *blocks;
  uint32_t n_blocks, n_q_heads;
  const float *q;
  float *out;
} plain_ctx;
static int run_plain(void *p) {
  plain_ctx *c = p;
  return ckv_bench_plain_attention(c->g, c->blocks, c->n_blocks, c->n_q_heads, c->q, c->out);
}
static int run_fused(void *p) { return ckv_kernels_attention(p); }

/* mix: the KIVI lifecycle (int2, int4, int8, fp16); mix_rot: the same shares with the rotated
 * committed formats (rot2, rot4, int8, fp16), what a session of the rotated lifecycle holds. */
static const char *const attn_formats[] = {"fp16", "int8", "int4", "int2", "mix", "rot4", "rot2", "mix_rot"};
/* The format whose default scores and values a row reports (mix_rot: its ROT4 part). */
static const uint32_t attn_row_format[] = {CKV_FORMAT_DRAFT, CKV_FORMAT_STAGED, CKV_FORMAT_COMMIT4, CKV_FORMAT_COMMIT2,
                                           CKV_FORMAT_COMMIT4, CKV_FORMAT_ROT4, CKV_FORMAT_ROT2, CKV_FORMAT_ROT4};
#define N_ATTN_FORMATS 8

/* Builds the blocks of one attention format from the drafts; returns the block list (caller frees sets). */
static int attn_blocks(const ckv_geometry *g, blockset *drafts, size_t tokens, int f, blockset sets[4],
                       const void ***ret_list, size_t *ret_n) {
  /* mix: oldest 1/4 int2, next 3/8 int4, next 1/4 int8, newest 1/8 draft */
  size_t cut[4];
  uint32_t fmts[4] = {CKV_FORMAT_COMMIT2, CKV_FORMAT_COMMIT4, CKV_FORMAT_STAGED, CKV_FORMAT_DRAFT};
  if (f == 7) {
    fmts[0] = CKV_FORMAT_ROT2, fmts[1] = CKV_FORMAT_ROT4;
    cut[0] = tokens / 4, cut[1] = tokens * 3 / 8, cut[2] = tokens / 4, cut[3] = tokens - cut[0] - cut[1] - cut[2];
  } else if (f >= 5) { /* one rotated format for every token */
    fmts[0] = f == 5 ? CKV_FORMAT_ROT4 : CKV_FORMAT_ROT2;
    cut[0] = tokens, cut[1] = cut[2] = cut[3] = 0;
  } else if (f == 0) cut[0] = cut[1] = cut[2] = 0, cut[3] = tokens;
  else if (f == 1) cut[0] = cut[1] = 0, cut[2] = tokens, cut[3] = 0;
  else if (f == 2) cut[0] = 0, cut[1] = tokens, cut[2] = cut[3] = 0;
  else if (f == 3) cut[0] = tokens, cut[1] = cut[2] = cut[3] = 0;
  else cut[0] = tokens / 4, cut[1] = tokens * 3 / 8, cut[2] = tokens / 4, cut[3] = tokens - cut[0] - cut[1] - cut[2];
  const void **list = calloc(tokens / 16 + 4, sizeof(void *));
  size_t n = 0, start = 0;
  for (int k = 0; k < 4; k++) {
    memset(&sets[k], 0, sizeof sets[k]);
    if (!cut[k]) continue;
    if (fmts[k] == CKV_FORMAT_DRAFT) {
      for (size_t b = start / 16; b < (start + cut[k]) / 16; b++) list[n++] = drafts->blk[b];
    } else {
      if (blockset_new(&sets[k], fmts[k], g, 64, 0, cut[k] / 64)) return -1;
      ckv_move *m = malloc(cut[k] * sizeof *m);
      for (size_t i = 0; i < cut[k]; i++)
        m[i] = (ckv_move){.src = drafts->blk[(start + i) / 16], .src_slot = (uint32_t)((start + i) % 16),
                          .dst = sets[k].blk[i / 64], .dst_slot = (uint32_t)(i % 64)};
      ckv_kernels_move(g, m, cut[k], CKV_MOVE_SET_VALID);
      free(m);
      for (size_t b = 0; b < sets[k].n; b++) list[n++] = sets[k].blk[b];
    }
    start += cut[k];
  }
  *ret_list = list;
  *ret_n = n;
  return 0;
}

/* The GPU half: ckv-bench-gpu beside this binary when a GPU answers.  With
 * `json`, writes its JSON object (or {"skipped": why}) to stdout as the
 * value of "gpu"; otherwise lets its table through. */
static void gpu_section(int json) {
  char path[4096], why[256] = "";
#ifdef CKV_HAVE_CUDA_KERNELS
  if (ckv_cuda_available() != CKV_OK) snprintf(why, sizeof(why), "no CUDA device: %s", ckv_cuda_unavailable_reason());
#else
  snprintf(why, sizeof(why), "built without the CUDA kernels");
#endif
  if (!why[0] && (ckv_bench_beside_self("ckv-bench-gpu", path, sizeof(path)) < 0 || access(path, X_OK) != 0))
    snprintf(why, sizeof(why), "ckv-bench-gpu is not installed beside commitkv-bench");
  if (why[0]) {
    if (json)
      printf("{\"skipped\": \"%s\"}", why);
    else
      printf("\ngpu: skipped: %s\n", why);
    return;
  }
  fflush(stdout);
  char cmd[4200];
  snprintf(cmd, sizeof(cmd), "'%s'%s", path, json ? " --json" : "");
  FILE *p = popen(cmd, "r");
  char buf[65536];
  size_t n = p ? fread(buf, 1, sizeof(buf) - 1, p) : 0;
  int rc = p ? pclose(p) : -1;
  buf[n] = 0;
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
  if (json)
    printf("%s", rc == 0 && n && buf[0] == '{' ? buf : "{\"skipped\": \"ckv-bench-gpu failed\"}");
  else
    printf("\ngpu (ckv-bench-gpu):\n%s\n", n ? buf : "(no output)");
}

int ckv_bench_kernels(int argc, char **argv) {
  int json = 0, quick = 0;
  const char *only = NULL; /* --only ops|attention */
  size_t mib = 1024;
  size_t sizes_arg[3];
  size_t nsizes_arg = 0; /* --tokens */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--cpu-time")) g_clock = CLOCK_THREAD_CPUTIME_ID;
    else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--peer") && i + 1 < argc) g_peer_path = argv[++i];
    else if (!strcmp(argv[i], "--only") && i + 1 < argc && (!strcmp(argv[i + 1], "ops") || !strcmp(argv[i + 1], "attention")))
      only = argv[++i];
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
      for (char *e = argv[++i]; *e && nsizes_arg < 3; e += *e == ',') {
        size_t n = strtoul(e, &e, 10) / 512 * 512; /* the mixes' shares in whole 64-token blocks */
        if (n >= 512) sizes_arg[nsizes_arg++] = n;
        if (*e && *e != ',') break;
      }
      if (!nsizes_arg) {
        fprintf(stderr, "--tokens: at least 512 (rounded down to a multiple of 512)\n");
        return 2;
      }
    }
    else {
      fprintf(stderr, "usage: commitkv-bench kernels [--json] [--quick] [--mib N] [--tokens N[,N...]] [--cpu-time] [--peer PATH] [--only ops|attention]\n");
      return 2;
    }
  }
  if (quick) mib = 32;
  if (mib < 8) mib = 8;
  const ckv_geometry g = {.n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .dtype = CKV_DTYPE_FP16};
  size_t tok_bytes = ckv_token_elems(&g) * 2, tokens = (mib << 20) / tok_bytes / 64 * 64;
  if (tokens < 64) tokens = 64;
  int reps = quick ? 2 : 3;
  FILE *log = json ? stderr : stdout;
  fprintf(log, "kernels: path %s, %zu tokens (%.0f MiB fp16), LLC %.0f MiB\n", ckv_kernels_path_name(ckv_kernels_path()),
          tokens, tokens * tok_bytes / 1048576.0, llc_bytes() / 1048576.0);

  blockset dr = {0};
  if (drafts_new(&dr, &g, tokens, 7)) {
    fprintf(stderr, "kernels: out of memory\n");
    return 1;
  }
  size_t draft_bytes = dr.n * dr.bytes_each;
  op_ctx c = {.g = &g, .tokens = tokens, .cap = 64, .src = &dr};
  c.bytes = draft_bytes;
  c.a = dr.mem;
  c.b = aligned_alloc(64, draft_bytes);
  c.ring_floats = draft_bytes / 4;
  c.ring = (float *)c.b; /* the memcpy target doubles as the FP32 output ring (as large as the source) */
  memset(c.b, 1, draft_bytes);
  double memcpy_gbps = 2.0 * draft_bytes / best_of(reps, run_memcpy, &c) / 1e9;
  long np = sysconf(_SC_NPROCESSORS_ONLN); /* and on every CPU: the bound of the ops' and attention's threaded rows */
  g_op_threads = np < 1 ? 1 : np > 64 ? 64 : (int)np;
  g_memcpy_threads_gbps = g_op_threads > 1 ? 2.0 * c.bytes / best_of(reps, memcpy_threads, &c) / 1e9 : 0;
  /* attention sizes (here: the peer runs before our figures too) */
  size_t sizes_full[] = {4096, 32768, 131072}, sizes_quick[] = {1024, 4096};
  size_t *sizes = nsizes_arg ? sizes_arg : quick ? sizes_quick : sizes_full;
  size_t nsizes = nsizes_arg ? nsizes_arg : quick ? 2 : 3;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int peer_threads = online < 1 ? 1 : online > 64 ? 64 : (int)online; /* as run_ops' g_op_threads */
  if (g_peer_path) { /* before ours, and again after: each peer row keeps the better of its two runs */
    fprintf(log, "kernels: running the peer %s (before)\n", g_peer_path);
    ckv_peer_run(&g_peer, g_peer_path, mib, sizes, nsizes, peer_threads, quick);
  }
  if ((!only || !strcmp(only, "ops")) && run_ops(&g, &dr, tokens, reps, &c)) {
    fprintf(stderr, "kernels: out of memory\n");
    return 1;
  }
  blockset_free(&dr);
  free(c.b);

  /* attention: one layer */
  const ckv_geometry ga = {.n_layers = 1, .n_kv_heads = 8, .head_dim = 128, .dtype = CKV_DTYPE_FP16};
  const uint32_t QH = 32;
  attn_result ar[3 * N_ATTN_FORMATS];
  attn_baseline base[3];
  attn_int_result air[3 * 4];
  int nair = 0;
  int nar = 0;
  uint32_t threads = 0;
  float q[32 * 128], out[32 * 128];
  for (size_t i = 0; i < 32 * 128; i++) q[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  size_t n_attn_sizes = only && !strcmp(only, "ops") ? 0 : nsizes; /* --only ops: no attention rows */
  for (size_t si = 0; si < n_attn_sizes; si++) {
    blockset drafts = {0};
    if (drafts_new(&drafts, &ga, sizes[si], 11 + si)) return 1;
    for (int f = 0; f < N_ATTN_FORMATS; f++) {
      blockset sets[4];
      const void **list;
      size_t nb;
      if (attn_blocks(&ga, &drafts, sizes[si], f, sets, &list, &nb)) return 1;
      size_t bytes = 0;
      for (size_t b = 0; b < nb; b++) {
        const ckv_block_header *h = list[b];
        bytes += ckv_format_block_bytes(h->format, &ga, h->capacity, h->kept_channels);
      }
      /* the rows of the issue: each format's defaults (scores, values: kernels.h); attention_int below pins them */
      ckv_attn_args a = {.geom = &ga, .n_rows = 1, .n_q_heads = QH, .q = q, .blocks = list, .n_blocks = (uint32_t)nb, .out = out};
      float *mass = malloc(ckv_attention_mass_len(list, (uint32_t)nb) * sizeof(float));
      a.mass = mass;
      a.workspace_bytes = ckv_attention_workspace_bytes(&a);
      a.workspace = malloc(a.workspace_bytes);
      int min_iters = nsizes_arg ? 5 : quick ? 2 : 3; /* --tokens: sized runs, more tries on a shared machine */
      double budget = quick && !nsizes_arg ? 0.05 : 0.5;
      double best = best_call(run_fused, &a, min_iters, budget);
      ckv_attn_args a1 = a;
      a1.n_threads = 1;
      double best_1t = best_call(run_fused, &a1, min_iters, budget);
      uint32_t dsc, dvc;
      ckv_attention_choice(&a, attn_row_format[f], &dsc, &dvc);
      if (f == 0) {
        attn_baseline *bl = &base[si];
        float plain_out[32 * 128];
        plain_ctx pc = {&ga, list, (uint32_t)nb, QH, q, plain_out};
        bl->plain_us = -1;
        bl->max_abs_diff = 0;
        if (ckv_bench_plain_supported()) {
          bl->plain_us = best_call(run_plain, &pc, min_iters, budget) * 1e6;
          for (size_t i = 0; i < (size_t)QH * 128; i++)
            bl->max_abs_diff = fmax(bl->max_abs_diff, fabs((double)plain_out[i] - out[i]));
        }
        ckv_attn_args one = a;
        one.n_threads = 1;
        bl->one_thread_us = best_call(run_fused, &one, min_iters, budget) * 1e6;
        threads = a.n_threads ? a.n_threads : 0;
      }
      if (f == 1 || f == 2 || f == 5 || f == 6) { /* int8, int4, rot4, rot2: integer scores too */
        attn_int_result *ir = &air[nair++];
        float iout[32 * 128];
        float fout[32 * 128];
        ckv_attn_args fa = a, ia = a, one = a; /* float scores and FP32 values, whatever the defaults */
        fa.scores = one.scores = CKV_ATTN_SCORES_FLOAT;
        fa.values = ia.values = one.values = CKV_ATTN_VALUES_FLOAT;
        fa.out = one.out = fout;
        ia.scores = CKV_ATTN_SCORES_INT8;
        ia.out = iout;
        one.n_threads = 1;
        ir->tokens = (uint32_t)sizes[si];
        ir->format = attn_formats[f];
        ir->float_us = best_call(run_fused, &fa, min_iters, budget) * 1e6;
        ir->int_us = best_call(run_fused, &ia, min_iters, budget) * 1e6;
        ir->float_1t_us = best_call(run_fused, &one, min_iters, budget) * 1e6;
        one.scores = CKV_ATTN_SCORES_INT8;
        one.out = iout;
        ir->int_1t_us = best_call(run_fused, &one, min_iters, budget) * 1e6;
        ir->bf16_us = ir->int_bf16_us = ir->bf16_1t_us = ir->int_bf16_1t_us = 0, ir->bf16_cosine_min = 1;
        ir->i8v_us = ir->i8v_1t_us = 0, ir->i8v_cosine_min = 1;
        uint32_t vsc, vvc;
        ckv_attn_args vq = a;
        vq.values = CKV_ATTN_VALUES_INT8;
        ckv_attention_choice(&vq, CKV_FORMAT_STAGED, &vsc, &vvc);
        if (f == 1 && vvc == CKV_ATTN_VALUES_INT8) { /* int8: integer values too */
          float vout[32 * 128];
          ckv_attn_args b = vq, b1 = one;
          b.scores = b1.scores = CKV_ATTN_SCORES_FLOAT;
          b1.values = CKV_ATTN_VALUES_INT8;
          b.out = b1.out = vout;
          ir->i8v_us = best_call(run_fused, &b, min_iters, budget) * 1e6;
          ir->i8v_1t_us = best_call(run_fused, &b1, min_iters, budget) * 1e6;
          for (uint32_t h = 0; h < QH; h++) {
            double cs = cosine(vout + h * 128, fout + h * 128, 128);
            ir->i8v_cosine_min = cs < ir->i8v_cosine_min ? cs : ir->i8v_cosine_min;
          }
        }
        if ((f == 5 || f == 6) && ckv_kernels_values_bf16_supported()) { /* rot4, rot2: BF16 values too */
          float bout[32 * 128];
          ckv_attn_args b = a, b1 = one;
          b.values = b1.values = CKV_ATTN_VALUES_BF16;
          b.out = b1.out = bout;
          b.scores = b1.scores = CKV_ATTN_SCORES_FLOAT;
          ir->bf16_us = best_call(run_fused, &b, min_iters, budget) * 1e6;
          ir->bf16_1t_us = best_call(run_fused, &b1, min_iters, budget) * 1e6;
          for (uint32_t h = 0; h < QH; h++) {
            double cs = cosine(bout + h * 128, fout + h * 128, 128);
            ir->bf16_cosine_min = cs < ir->bf16_cosine_min ? cs : ir->bf16_cosine_min;
          }
          b.scores = b1.scores = CKV_ATTN_SCORES_INT8;
          ir->int_bf16_us = best_call(run_fused, &b, min_iters, budget) * 1e6;
          ir->int_bf16_1t_us = best_call(run_fused, &b1, min_iters, budget) * 1e6;
        }
        ir->cosine_min = 1;
        for (uint32_t h = 0; h < QH; h++) {
          double ab = 0, aa = 0, bb = 0;
          for (uint32_t d = 0; d < 128; d++) {
            ab += (double)iout[h * 128 + d] * fout[h * 128 + d];
            aa += (double)iout[h * 128 + d] * iout[h * 128 + d];
            bb += (double)fout[h * 128 + d] * fout[h * 128 + d];
          }
          double cs = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 1.0;
          ir->cosine_min = cs < ir->cosine_min ? cs : ir->cosine_min;
        }
      }
      ar[nar++] = (attn_result){(uint32_t)sizes[si], attn_formats[f], best * 1e6, bytes / best / 1e9,
                                bytes * 8.0 / ((double)sizes[si] * 2 * ckv_draft_token_elems(&ga)), best_1t * 1e6,
                                dsc == CKV_ATTN_SCORES_INT8 ? "int8" : "float", dvc == CKV_ATTN_VALUES_BF16 ? "bf16" : "float"};
      free(a.workspace);
      free(mass);
      free(list);
      for (int k = 0; k < 4; k++) blockset_free(&sets[k]);
    }
    blockset_free(&drafts);
  }

  if (g_peer_path) { /* and after ours: a separate process, nothing shared */
    fprintf(log, "kernels: running the peer %s (after)\n", g_peer_path);
    ckv_peer_run(&g_peer, g_peer_path, mib, sizes, nsizes, peer_threads, quick);
    if (!g_peer.n) fprintf(log, "kernels: peer %s\n", g_peer.skipped);
  }
  if (json) {
    printf("{\"path\": \"%s\", \"clock\": \"%s\", \"tokens_ops\": %zu, \"llc_bytes\": %zu, \"memcpy_gbps\": %.3f, ",
           ckv_kernels_path_name(ckv_kernels_path()), g_clock == CLOCK_MONOTONIC ? "wall" : "thread_cpu", tokens, llc_bytes(),
           memcpy_gbps);
    print_ops_json(memcpy_gbps);
    printf("\"attention\": [");
    for (int i = 0; i < nar; i++) {
      double fp16 = ar[i - i % N_ATTN_FORMATS].us, plain = base[i / N_ATTN_FORMATS].plain_us;
      printf("%s{\"tokens\": %u, \"format\": \"%s\", \"threads\": %ld, \"ms\": %.4f, \"us_per_query\": %.1f, "
             "\"speedup_vs_fp16\": %.3f, \"ratio_plain\": %.3f, \"gbps\": %.3f, \"ratio_bound\": %.3f, "
             "\"bits_per_element\": %.3f, \"scores\": \"%s\", \"values\": \"%s\", \"ms_1t\": %.4f, "
             "\"speedup_vs_fp16_1t\": %.3f",
             i ? ", " : "", ar[i].tokens, ar[i].format, threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN),
             ar[i].us / 1e3, ar[i].us, fp16 / ar[i].us, plain > 0 ? plain / ar[i].us : 0.0, ar[i].gbps,
             ratio_bound(ar[i].gbps, memcpy_gbps), ar[i].bits, ar[i].scores, ar[i].values, ar[i].us_1t / 1e3,
             ar[i - i % N_ATTN_FORMATS].us_1t / ar[i].us_1t);
      print_peer_attn_json(ar[i].format, ar[i].tokens, ar[i].us);
      printf("}");
    }
    printf("], \"attention_baselines\": [");
    for (size_t si = 0; si < n_attn_sizes; si++)
      printf("%s{\"tokens\": %zu, \"fp16_us\": %.1f, \"fp16_one_thread_us\": %.1f, \"plain_c_us\": %.1f, "
             "\"speedup_vs_plain_c\": %.3f, \"max_abs_diff\": %.2e}",
             si ? ", " : "", sizes[si], ar[si * N_ATTN_FORMATS].us, base[si].one_thread_us, base[si].plain_us,
             base[si].plain_us > 0 ? base[si].plain_us / ar[si * N_ATTN_FORMATS].us : 0.0, base[si].max_abs_diff);
    printf("], \"attention_int\": [");
    for (int i = 0; i < nair; i++) {
      double fp16 = 0;
      for (int k = 0; k < nar; k++)
        if (ar[k].tokens == air[i].tokens && !strcmp(ar[k].format, "fp16")) fp16 = ar[k].us;
      printf("%s{\"tokens\": %u, \"format\": \"%s\", \"scores\": \"int8\", \"idot\": \"%s\", \"float_us\": %.1f, "
             "\"int_us\": %.1f, \"speedup_vs_float\": %.3f, \"speedup_vs_fp16\": %.3f, \"float_1t_us\": %.1f, "
             "\"int_1t_us\": %.1f, \"speedup_vs_float_1t\": %.3f, \"cosine_vs_float_min\": %.6f",
             i ? ", " : "", air[i].tokens, air[i].format, ckv_kernels_idot_name(), air[i].float_us, air[i].int_us,
             air[i].float_us / air[i].int_us, fp16 / air[i].int_us, air[i].float_1t_us, air[i].int_1t_us,
             air[i].float_1t_us / air[i].int_1t_us, air[i].cosine_min);
      if (air[i].bf16_us > 0) /* BF16 values (rot4, AVX512_BF16): against the float scores and FP32 values */
        printf(", \"values_bf16_us\": %.1f, \"int_values_bf16_us\": %.1f, \"values_bf16_1t_us\": %.1f, "
               "\"int_values_bf16_1t_us\": %.1f, \"speedup_int_bf16_vs_float\": %.3f, \"speedup_int_bf16_vs_float_1t\": %.3f, "
               "\"speedup_int_bf16_vs_fp16\": %.3f, \"values_bf16_cosine_vs_float_min\": %.6f",
               air[i].bf16_us, air[i].int_bf16_us, air[i].bf16_1t_us, air[i].int_bf16_1t_us,
               air[i].float_us / air[i].int_bf16_us, air[i].float_1t_us / air[i].int_bf16_1t_us, fp16 / air[i].int_bf16_us,
               air[i].bf16_cosine_min);
      if (air[i].i8v_us > 0) /* INT8 with integer values (AVX-512 VNNI): against the FP32 values, float scores */
        printf(", \"values_int8_us\": %.1f, \"values_int8_1t_us\": %.1f, \"speedup_values_int8_vs_float\": %.3f, "
               "\"speedup_values_int8_vs_float_1t\": %.3f, \"values_int8_cosine_vs_float_min\": %.6f",
               air[i].i8v_us, air[i].i8v_1t_us, air[i].float_us / air[i].i8v_us, air[i].float_1t_us / air[i].i8v_1t_us,
               air[i].i8v_cosine_min);
      printf("}");
    }
    printf("], \"attention_threads\": %ld, ", threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN));
    if (g_peer_path)
      printf("\"peer_path\": \"%s\", \"peer_runs\": %d, \"peer_rows\": %zu, \"peer_skipped\": %s%s%s, ", g_peer_path,
             g_peer.runs, g_peer.n,
             g_peer.n ? "" : "\"", g_peer.n ? "null" : g_peer.skipped, g_peer.n ? "" : "\"");
    printf("\"gpu\": ");
    gpu_section(1);
    printf("}\n");
  } else if (!n_attn_sizes) { /* --only ops */
    print_ops_text(memcpy_gbps);
    gpu_section(0);
  } else {
    if (g_nops) print_ops_text(memcpy_gbps);
    else printf("memcpy: %.2f GB/s (read + written), %.2f GB/s on %d threads\n", memcpy_gbps, g_memcpy_threads_gbps, g_op_threads);
    printf("\nattention, one layer, 8 KV heads x 128, 32 query heads, 1 query row, %ld threads\n"
           "%-8s %-8s %12s %10s %10s %8s %6s\n",
           threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN), "tokens", "format", "us/query", "vs fp16",
           "vs plain", "GB/s", "bits");
    for (int i = 0; i < nar; i++) {
      double plain = base[i / N_ATTN_FORMATS].plain_us;
      printf("%-8u %-8s %12.1f %10.2f %10.2f %8.2f %6.2f\n", ar[i].tokens, ar[i].format, ar[i].us,
             ar[i - i % N_ATTN_FORMATS].us / ar[i].us, plain > 0 ? plain / ar[i].us : 0.0, ar[i].gbps, ar[i].bits);
    }
    printf("\nfp16 attention against its baselines (same blocks, same run): the fused kernel on %ld threads "
           "(CKV_ATTENTION_THREADS) and on one, and a plain-C loop (attention_plain.c)\n%-8s %12s %12s %12s %10s %10s\n",
           threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN), "tokens", "fused us", "1 thread us", "plain C us",
           "vs plain", "max diff");
    for (size_t si = 0; si < n_attn_sizes; si++) {
      if (base[si].plain_us < 0)
        printf("%-8zu %12.1f %12.1f %12s %10s %10s\n", sizes[si], ar[si * N_ATTN_FORMATS].us, base[si].one_thread_us, "-", "-",
               "(no AVX2)");
      else
        printf("%-8zu %12.1f %12.1f %12.1f %10.2f %10.1e\n", sizes[si], ar[si * N_ATTN_FORMATS].us, base[si].one_thread_us,
               base[si].plain_us, base[si].plain_us / ar[si * N_ATTN_FORMATS].us, base[si].max_abs_diff);
    }
    printf("\ninteger scores (query quantized to INT8, integer dots: %s) against the float scores of the same blocks\n"
           "%-8s %-6s %10s %10s %9s %9s %12s %12s %9s %10s\n",
           ckv_kernels_idot_name(), "tokens", "format", "float us", "int us", "vs float", "vs fp16", "float 1t us",
           "int 1t us", "vs fl 1t", "cos min");
    for (int i = 0; i < nair; i++) {
      double fp16 = 0;
      for (int k = 0; k < nar; k++)
        if (ar[k].tokens == air[i].tokens && !strcmp(ar[k].format, "fp16")) fp16 = ar[k].us;
      printf("%-8u %-6s %10.1f %10.1f %9.2f %9.2f %12.1f %12.1f %9.2f %10.6f\n", air[i].tokens, air[i].format,
             air[i].float_us, air[i].int_us, air[i].float_us / air[i].int_us, fp16 / air[i].int_us, air[i].float_1t_us,
             air[i].int_1t_us, air[i].float_1t_us / air[i].int_1t_us, air[i].cosine_min);
    }
    for (int i = 0; i < nair; i++)
      if (air[i].bf16_us > 0)
        printf("%-8u %-6s BF16 values: float scores %.1f us (1 thread %.1f), integer scores %.1f us (1 thread %.1f), "
               "cos min %.6f\n",
               air[i].tokens, air[i].format, air[i].bf16_us, air[i].bf16_1t_us, air[i].int_bf16_us, air[i].int_bf16_1t_us,
               air[i].bf16_cosine_min);
    if (g_peer_path) print_peer_text(ar, nar);
    gpu_section(0);
  }
  ckv_peer_free(&g_peer);
  return 0;
}
