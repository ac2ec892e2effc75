/* ggml_peer.c - ckv-ggml-peer: ggml's CPU kernels (from the llama.cpp source in the npm
 * package node-llama-cpp, built by bench/peer/build.sh: `make bench-peer`) timed on the
 * geometry `commitkv-bench kernels` uses, so that `commitkv-bench kernels --peer PATH`
 * can put an outside figure beside each of ours (issue 42).  Never linked into commitkvd,
 * libcommitkv or commitkv-bench: a separate program, read through a pipe.
 *
 *   ckv-ggml-peer [--mib N] [--tokens N[,N...]] [--threads T] [--quick]
 *
 * Prints one JSON object per line (no other output on stdout):
 *   {"peer": "ggml", "op": "quantize"|"dequantize", "format": "q8_0", "bits": 8.5,
 *    "threads": T, "elems": E, "ns_per_elem": x, "gbps": y}
 *   {"peer": "ggml", "op": "attention", "format": "q8_0", "layout": "contiguous"|"llama",
 *    "bits": 8.5, "tokens": N, "threads": T, "ms": best, "ms_median": median}
 * quantize: FP16 rows of 1024 elements (a token's 8 KV heads x 128) widened to FP32 with
 * ggml_cpu_fp16_to_fp32, then the CPU type traits' from_float (what ggml_cpy into a
 * quantized KV cache runs); dequantize: the type's to_float into an FP32 ring as large as
 * the FP16 source (as the kernels bench's ring).  E = the elements of --mib MiB of FP16
 * (default 1024, as the kernels bench), split in contiguous ranges over T threads.
 * attention: ggml_flash_attn_ext, 32 query heads x 128 (one query row), 8 KV heads
 * (GQA group 4), no mask, scale 1/sqrt(128), over --tokens tokens (default 4096, 32768,
 * 131072), graph computed on T threads (default: the online CPUs); "contiguous" K/V are
 * [head][token][128], ggml's best layout; "llama" are views of llama.cpp's cache layout
 * ([token][head][128], one row per token), as its graph reads them.  Times: wall clock,
 * the best (and median) of at least 5 calls and about half a second.  The data: the
 * kernels bench's generator (a pseudo-random table, 1 in 64 values an outlier). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ggml-cpu.h"
#include "ggml.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The kernels bench's table (bench_kernels.c drafts_new), tiled with a moving offset. */
enum { TAB = 1 << 15 };
static ggml_fp16_t g_tab[TAB + 4096];
static void table_init(uint64_t seed) {
  uint64_t x = seed | 1;
  for (size_t i = 0; i < TAB + 4096; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    float f = ((float)((x >> 40) & 0xffff) / 32768.0f - 1.0f) * ((x & 63) == 0 ? 20.0f : 2.0f);
    g_tab[i] = ggml_fp32_to_fp16(f);
  }
}
static void fill_f16(ggml_fp16_t *d, size_t n) {
  size_t off = 0;
  for (size_t e = 0; e < n; e += 4096) {
    size_t k = n - e < 4096 ? n - e : 4096;
    memcpy(d + e, g_tab + off, k * sizeof *d);
    off = (off + 997) % TAB;
  }
}

static double bits_of(enum ggml_type t) { return 8.0 * (double)ggml_type_size(t) / (double)ggml_blck_size(t); }

/* ---- quantize / dequantize ---- */
#define ROW 1024
typedef struct op_job {
  int kind; /* 0 quantize, 1 dequantize */
  enum ggml_type type;
  const ggml_fp16_t *src;
  uint8_t *dst;
  float *ring;
  size_t ring_floats;
  size_t r0, r1; /* rows */
} op_job;

static void *op_run(void *p) {
  op_job *j = p;
  size_t rb = ggml_row_size(j->type, ROW), pos = 0;
  if (j->kind == 0) {
    ggml_from_float_t from = ggml_get_type_traits_cpu(j->type)->from_float;
    float tmp[ROW];
    for (size_t r = j->r0; r < j->r1; r++) {
      ggml_cpu_fp16_to_fp32(j->src + r * ROW, tmp, ROW);
      from(tmp, j->dst + r * rb, ROW);
    }
  } else {
    ggml_to_float_t to = ggml_get_type_traits(j->type)->to_float;
    for (size_t r = j->r0; r < j->r1; r++) {
      if (pos + ROW > j->ring_floats) pos = 0;
      to(j->dst + r * rb, j->ring + pos, ROW);
      pos += ROW;
    }
  }
  return NULL;
}

static double op_once(int kind, enum ggml_type t, const ggml_fp16_t *src, uint8_t *dst, float *ring, size_t ring_floats,
                      size_t rows, int threads) {
  op_job jobs[64];
  pthread_t th[64];
  size_t per = (rows + threads - 1) / threads;
  double t0 = now_s();
  for (int k = 0; k < threads; k++) {
    jobs[k] = (op_job){kind, t, src, dst, ring + (ring_floats / threads) * k, ring_floats / threads,
                       k * per < rows ? k * per : rows, (k + 1) * per < rows ? (k + 1) * per : rows};
    if (k < threads - 1) pthread_create(&th[k], NULL, op_run, &jobs[k]);
  }
  op_run(&jobs[threads - 1]);
  for (int k = 0; k < threads - 1; k++) pthread_join(th[k], NULL);
  return now_s() - t0;
}

/* ---- attention ---- */
typedef struct attn_case {
  struct ggml_context *ctx;
  struct ggml_cgraph *gf;
  struct ggml_cplan plan;
  uint8_t *work;
} attn_case;

/* Q, K, V and the flash attention graph for one format, layout and size. */
static int attn_build(attn_case *c, enum ggml_type t, int llama_layout, int64_t n_kv, int threads) {
  const int64_t D = 128, H = 8, QH = 32;
  size_t kv_bytes = ggml_row_size(t, D) * n_kv * H;
  struct ggml_init_params ip = {.mem_size = 2 * kv_bytes + QH * D * 8 + 64 * ggml_tensor_overhead() + ggml_graph_overhead() + (1 << 20),
                                .mem_buffer = NULL, .no_alloc = false};
  c->ctx = ggml_init(ip);
  if (!c->ctx) return -1;
  struct ggml_tensor *q = ggml_new_tensor_4d(c->ctx, GGML_TYPE_F32, D, 1, QH, 1);
  struct ggml_tensor *kv[2];
  for (int i = 0; i < 2; i++) {
    struct ggml_tensor *x;
    if (llama_layout) { /* llama.cpp's cache: one row of H * D per token; the graph views it per head */
      struct ggml_tensor *cache = ggml_new_tensor_2d(c->ctx, t, D * H, n_kv);
      x = ggml_view_3d(c->ctx, cache, D, n_kv, H, ggml_row_size(t, D * H), ggml_row_size(t, D), 0);
    } else {
      x = ggml_new_tensor_3d(c->ctx, t, D, n_kv, H);
    }
    kv[i] = x;
  }
  /* data: the table through FP16 (and the type's from_float for quantized types), row by row */
  float *q32 = q->data;
  for (int64_t i = 0; i < QH * D; i++) q32[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  ggml_fp16_t *h16 = malloc(D * sizeof *h16);
  float tmp[128];
  ggml_from_float_t from = t == GGML_TYPE_F16 ? NULL : ggml_get_type_traits_cpu(t)->from_float;
  for (int i = 0; i < 2; i++) {
    struct ggml_tensor *x = kv[i];
    size_t toff = (size_t)i * 4099;
    for (int64_t h = 0; h < H; h++)
      for (int64_t n = 0; n < n_kv; n++) {
        uint8_t *dst = (uint8_t *)x->data + n * x->nb[1] + h * x->nb[2];
        memcpy(h16, g_tab + toff, D * sizeof *h16);
        toff = (toff + 997) % TAB;
        if (!from) {
          memcpy(dst, h16, D * sizeof *h16);
        } else {
          ggml_cpu_fp16_to_fp32(h16, tmp, D);
          from(tmp, dst, D);
        }
      }
  }
  free(h16);
  struct ggml_tensor *out = ggml_flash_attn_ext(c->ctx, q, kv[0], kv[1], NULL, 1.0f / sqrtf((float)D), 0.0f, 0.0f);
  c->gf = ggml_new_graph(c->ctx);
  ggml_build_forward_expand(c->gf, out);
  c->plan = ggml_graph_plan(c->gf, threads, NULL);
  c->work = c->plan.work_size ? malloc(c->plan.work_size) : NULL;
  c->plan.work_data = c->work;
  return 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t mib = 1024, sizes[3] = {4096, 32768, 131072}, nsizes = 3;
  long np = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = np < 1 ? 1 : np > 64 ? 64 : (int)np, quick = 0, ops = 1, attn = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--no-ops")) ops = 0;
    else if (!strcmp(argv[i], "--no-attention")) attn = 0;
    else if (!strcmp(argv[i], "--json")) continue; /* the only output there is */
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
      nsizes = 0;
      for (char *e = argv[++i]; *e && nsizes < 3; e += *e == ',') {
        size_t n = strtoul(e, &e, 10);
        if (n >= 256) sizes[nsizes++] = n / 256 * 256;
        if (*e && *e != ',') break;
      }
    } else {
      fprintf(stderr, "usage: ckv-ggml-peer [--mib N] [--tokens N[,N...]] [--threads T] [--quick] [--no-ops] [--no-attention]\n");
      return 2;
    }
  }
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  if (quick) {
    if (mib > 32) mib = 32;
  }
  ggml_cpu_init();
  table_init(7);
  int reps = quick ? 2 : 3;

  if (ops) {
    size_t elems = (mib << 20) / 2 / ROW * ROW, rows = elems / ROW;
    ggml_fp16_t *src = aligned_alloc(64, elems * 2);
    size_t ring_floats = elems / 2;
    float *ring = aligned_alloc(64, ring_floats * sizeof(float));
    uint8_t *dst = aligned_alloc(64, ggml_row_size(GGML_TYPE_Q8_0, ROW) * rows + 64);
    if (!src || !ring || !dst) {
      fprintf(stderr, "ckv-ggml-peer: out of memory\n");
      return 1;
    }
    fill_f16(src, elems);
    memset(ring, 1, ring_floats * sizeof(float));
    memset(dst, 0, ggml_row_size(GGML_TYPE_Q8_0, ROW) * rows);
    /* the formats ours are compared with: q8_0 (int8), q5_0 (int4), q4_0 (rot4), q3_K (int2, rot3),
     * q2_K (rot2), tq1_0 (rot1): each the fewest bits at or above ours that ggml quantizes without an
     * importance matrix */
    static const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                           GGML_TYPE_Q3_K, GGML_TYPE_Q2_K, GGML_TYPE_TQ1_0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
      enum ggml_type t = types[ti];
      size_t qbytes = ggml_row_size(t, ROW) * rows;
      for (int kind = 0; kind < 2; kind++)
        for (int tc = 0; tc < (threads > 1 ? 2 : 1); tc++) {
          int th = tc ? threads : 1;
          double best = 1e30;
          for (int r = 0; r < reps; r++) {
            double s = op_once(kind, t, src, dst, ring, ring_floats, rows, th);
            best = s < best ? s : best;
          }
          double bytes = kind == 0 ? elems * 2.0 + qbytes : qbytes + elems * 4.0;
          printf("{\"peer\": \"ggml\", \"op\": \"%s\", \"format\": \"%s\", \"bits\": %.4f, \"threads\": %d, "
                 "\"elems\": %zu, \"ns_per_elem\": %.5f, \"gbps\": %.3f}\n",
                 kind ? "dequantize" : "quantize", ggml_type_name(t), bits_of(t), th, elems, best * 1e9 / elems,
                 bytes / best / 1e9);
          fflush(stdout);
        }
    }
    free(src);
    free(ring);
    free(dst);
  }

  if (attn) {
    static const enum ggml_type atypes[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0};
    for (size_t si = 0; si < nsizes; si++)
      for (size_t ti = 0; ti < sizeof atypes / sizeof atypes[0]; ti++)
        for (int layout = 0; layout < 2; layout++) {
          attn_case c = {0};
          if (attn_build(&c, atypes[ti], layout, (int64_t)sizes[si], threads)) {
            fprintf(stderr, "ckv-ggml-peer: out of memory\n");
            return 1;
          }
          double t[64];
          int n = 0;
          double spent = 0;
          int min_iters = quick ? 2 : 5;
          while (n < 64 && (n < min_iters || (spent < 0.5 && n < 50))) {
            double s = now_s();
            ggml_graph_compute(c.gf, &c.plan);
            t[n] = now_s() - s;
            spent += t[n++];
          }
          qsort(t, n, sizeof t[0], cmp_d);
          printf("{\"peer\": \"ggml\", \"op\": \"attention\", \"format\": \"%s\", \"layout\": \"%s\", \"bits\": %.4f, "
                 "\"tokens\": %zu, \"threads\": %d, \"ms\": %.4f, \"ms_median\": %.4f}\n",
                 ggml_type_name(atypes[ti]), layout ? "llama" : "contiguous", bits_of(atypes[ti]), sizes[si], threads,
                 t[0] * 1e3, t[n / 2] * 1e3);
          fflush(stdout);
          free(c.work);
          ggml_free(c.ctx);
        }
  }
  return 0;
}
