/* gpu_worker.c - commitkv-gpu-worker: the reference worker for a daemon that
 * keeps KV in GPU memory (commitkvd --backend cuda).  Built in CUDA builds only.
 *
 * Attaches (mapping the tenant's arena on this process's GPU), opens one
 * session and, round after round: appends --tokens tokens, makes their K/V on
 * the GPU (random FP16 copied to a device buffer, as a model's projection
 * would leave them) and writes them into their draft slots with
 * ckv_session_write_kv_async on a CUDA stream, reports the round (a fixed
 * attention pattern with a few hot "facts", so that the daemon's judge stages
 * and commits tokens within a few rounds), fetches the view and runs the
 * fused attention kernel (ckv_cuda_attention) over every draft, staged and
 * committed block of it, straight from the arena.  Each result is checked
 * against the CPU kernel (ckv_kernels_attention) on host copies of the same
 * blocks.  The daemon may publish moved tokens (flip valid bits) while the
 * GPU reads, so the blocks are copied before and after the GPU run and the
 * comparison is retried until both copies agree.  The view's epoch is then
 * acknowledged with ckv_session_ack_after_stream once the stream is done.
 *
 * Prints one JSON line: rounds, comparisons, max_err (max |gpu - cpu| over max
 * |cpu| of the attention outputs), formats seen, attach_ms (ckv_client_connect:
 * attach and arena import), report_to_epoch_us (report until a view of the
 * report's epoch is fetched).  Exit 0 only if every comparison matched; 1 on a
 * mismatch or an error; 2 on bad usage; 77 (printing "commitkv-gpu-worker:
 * skipped: <reason>") when no GPU is usable.
 *
 *   commitkv-gpu-worker [--socket EP] [--attach-socket PATH] [--session ID]
 *                       [--rounds R] [--tokens N] [--seed S] [--device D]
 *                       [--pause-ms MS] [--keep] [--expect-formats] [--quiet] */
#include <cuda_runtime_api.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#define LAYERS 2u
#define KV_HEADS 2u
#define HEAD_DIM 64u
#define Q_PER_KV 2u     /* grouped-query attention: two query heads per KV head */
#define TOLERANCE 2e-3  /* max |gpu - cpu| relative to max |cpu| */
#define MAX_TRIES 20    /* GPU runs per comparison while the daemon keeps moving tokens */

typedef struct opts {
  const char *socket, *attach, *session;
  int rounds, tokens, pause_ms, device;
  uint64_t seed;
  bool keep, expect_formats, quiet;
} opts;

enum { SEEN_DRAFT, SEEN_STAGED, SEEN_COMMITTED, SEEN_N };

typedef struct stats {
  uint64_t comparisons, retries, epoch_waits;
  double max_err, max_mass_err, epoch_us_sum, epoch_us_max;
  uint64_t seen[SEEN_N]; /* comparisons in which a format held tokens the kernel read */
} stats;

/* ---- helpers ---- */

static uint64_t rng_next(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Roughly normal, heavy enough in a few channels to look like real keys. */
static float rng_value(uint64_t *x, uint32_t channel) {
  float u = 0;
  for (int i = 0; i < 4; i++) u += (float)(rng_next(x) >> 40) / (float)(1u << 24);
  u = (u - 2.0f) * 1.7f;
  return channel % 17 == 3 ? 4.0f * u : u;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cuda_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 1;
  fprintf(stderr, "commitkv-gpu-worker: %s: %s\n", what, cudaGetErrorString(e));
  return 0;
}

/* One view block: where it is on the device and its host copies. */
typedef struct blk {
  const void *dev;
  uint64_t bytes, alloc;
  uint8_t *before, *after; /* 64-byte aligned host copies of alloc bytes */
} blk;

typedef struct snap {
  blk *b;
  size_t n, cap;
  const void **dev_ptrs, **host_ptrs;
} snap;

static void snap_free(snap *s) {
  for (size_t i = 0; i < s->cap; i++) {
    free(s->b[i].before);
    free(s->b[i].after);
  }
  free(s->b);
  free(s->dev_ptrs);
  free(s->host_ptrs);
}

/* Takes the view's blocks (draft, staged, committed, in that order). */
static int snap_set(snap *s, const ckv_view *v) {
  size_t n = v->n_draft + v->n_staged + v->n_committed;
  if (n > s->cap) {
    blk *nb = realloc(s->b, n * sizeof(*nb));
    if (!nb) return -1;
    s->b = nb;
    memset(s->b + s->cap, 0, (n - s->cap) * sizeof(*nb));
    const void **d = realloc(s->dev_ptrs, n * sizeof(*d)), **h = d ? realloc(s->host_ptrs, n * sizeof(*h)) : NULL;
    if (d) s->dev_ptrs = d;
    if (!d || !h) return -1;
    s->host_ptrs = h;
    s->cap = n;
  }
  const ckv_block_view *lists[3] = {v->draft, v->staged, v->committed};
  size_t counts[3] = {v->n_draft, v->n_staged, v->n_committed}, k = 0;
  for (int l = 0; l < 3; l++)
    for (size_t i = 0; i < counts[l]; i++, k++) {
      blk *b = &s->b[k];
      if (b->alloc < lists[l][i].bytes) {
        size_t alloc = (size_t)(lists[l][i].bytes + 63) / 64 * 64;
        free(b->before);
        free(b->after);
        b->before = aligned_alloc(64, alloc);
        b->after = aligned_alloc(64, alloc);
        b->alloc = b->before && b->after ? alloc : 0;
        if (!b->alloc) return -1;
      }
      b->dev = lists[l][i].data;
      b->bytes = lists[l][i].bytes;
      s->dev_ptrs[k] = b->dev;
      s->host_ptrs[k] = b->before;
    }
  s->n = n;
  return 0;
}

static int snap_copy(snap *s, bool after) {
  for (size_t i = 0; i < s->n; i++)
    if (!cuda_ok(cudaMemcpy(after ? s->b[i].after : s->b[i].before, s->b[i].dev, s->b[i].bytes,
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy of a view block"))
      return -1;
  return 0;
}

/* Whether the daemon published anything in these blocks between the two
 * copies: what attention reads is decided by each block's header region
 * (valid bitmap, positions) and, committed, its seal word; bytes of slots
 * that stay unpublished may change (the compressor writes them) and do not
 * matter, and published slots never change. */
static bool snap_stable(const snap *s) {
  for (size_t i = 0; i < s->n; i++) {
    const ckv_block_header *h = (const ckv_block_header *)s->b[i].before;
    size_t head = ckv_block_payload_offset(h->capacity);
    if (head > s->b[i].bytes || memcmp(s->b[i].before, s->b[i].after, head) != 0) return false;
    if (ckv_format_is_commit(h->format)) {
      size_t m = ckv_commit_meta_offset(h->capacity);
      if (m + 4 > s->b[i].bytes || memcmp(s->b[i].before + m, s->b[i].after + m, 4) != 0) return false;
    }
  }
  return true;
}

/* Which formats hold tokens the attention reads (valid slots; committed ones
 * only in sealed chunks), from the host copies. */
static void snap_formats(const snap *s, bool seen[SEEN_N]) {
  for (size_t i = 0; i < s->n; i++) {
    const ckv_block_header *h = (const ckv_block_header *)s->b[i].before;
    bool commit = ckv_format_is_commit(h->format);
    uint32_t sealed = commit ? ckv_block_sealed_chunks(h) : 0;
    for (uint32_t sl = 0; sl < h->capacity; sl++) {
      if (!ckv_block_slot_valid(h, sl) || (commit && !((sealed >> (sl / CKV_COMMIT_CHUNK_TOKENS)) & 1u))) continue;
      seen[h->format == CKV_FORMAT_DRAFT ? SEEN_DRAFT : h->format == CKV_FORMAT_STAGED ? SEEN_STAGED : SEEN_COMMITTED] =
          true;
      break;
    }
  }
}

/* max |a - b| / max |b| over n values. */
static double rel_err(const float *a, const float *b, size_t n) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) return INFINITY; /* NaN is a mismatch */
    if (d > diff) diff = d;
    if (fabs((double)b[i]) > mag) mag = fabs((double)b[i]);
  }
  return diff / (mag > 1e-6 ? mag : 1e-6);
}

/* Device buffers of one comparison. */
typedef struct gpu_bufs {
  float *q, *out, *mass;
  size_t mass_cap;
} gpu_bufs;

/* GPU attention over the view against the CPU on the same bytes, every layer.
 * Returns 1 matched, 0 mismatched, -1 error. */
static int compare_view(ckv_session *s, const ckv_geometry *g, cudaStream_t stream, snap *sn, gpu_bufs *gb,
                        uint64_t *rng, stats *st, uint64_t *ret_epoch, bool quiet) {
  const uint32_t qh = KV_HEADS * Q_PER_KV;
  const size_t qn = (size_t)qh * HEAD_DIM;
  enum { QN = KV_HEADS * Q_PER_KV * HEAD_DIM };
  float q[QN], gpu_out[QN], cpu_out[QN];
  float *gpu_mass = NULL, *cpu_mass = NULL;
  int result = -1;
  for (int attempt = 0; attempt < MAX_TRIES; attempt++) {
    if (attempt) {
      st->retries++;
      usleep(2000u * (unsigned)attempt);
    }
    const ckv_view *v;
    int r = ckv_session_view(s, &v);
    if (r < 0) {
      fprintf(stderr, "commitkv-gpu-worker: view: %s\n", ckv_strerror(r));
      goto out;
    }
    if (snap_set(sn, v) < 0 || snap_copy(sn, false) < 0) goto out;
    /* Mass has one entry per slot of every block, as the headers say. */
    size_t slots = 0;
    for (size_t i = 0; i < sn->n; i++) {
      const ckv_block_header *h = (const ckv_block_header *)sn->b[i].before;
      if (sn->b[i].bytes < sizeof(*h) || h->magic != CKV_BLOCK_MAGIC || h->capacity > CKV_MAX_BLOCK_TOKENS) {
        fprintf(stderr, "commitkv-gpu-worker: view block %zu of epoch %" PRIu64 " has no valid header\n", i, v->epoch);
        goto out;
      }
      slots += h->capacity;
    }
    if (slots > gb->mass_cap) {
      cudaFree(gb->mass);
      gb->mass = NULL;
      if (!cuda_ok(cudaMalloc((void **)&gb->mass, slots * sizeof(float)), "cudaMalloc")) goto out;
      gb->mass_cap = slots;
    }
    free(gpu_mass);
    free(cpu_mass);
    gpu_mass = malloc((slots + 1) * sizeof(float));
    cpu_mass = malloc((slots + 1) * sizeof(float));
    if (!gpu_mass || !cpu_mass) goto out;
    double err = 0, mass_err = 0;
    bool bad = false;
    for (uint32_t layer = 0; layer < g->n_layers && !bad; layer++) {
      for (size_t i = 0; i < qn; i++) q[i] = rng_value(rng, (uint32_t)(i % HEAD_DIM));
      /* q goes on the stream: a pageable cudaMemcpy may still be landing when it returns. */
      if (!cuda_ok(cudaMemcpyAsync(gb->q, q, sizeof(q), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync q")) goto out;
      ckv_attn_args a = {.geom = g, .layer = layer, .n_rows = 1, .n_q_heads = qh, .q = gb->q,
                         .blocks = sn->dev_ptrs, .n_blocks = (uint32_t)sn->n, .out = gb->out, .mass = gb->mass};
      ckv_status cs = ckv_cuda_attention(&a, stream);
      if (cs != CKV_OK) {
        fprintf(stderr, "commitkv-gpu-worker: ckv_cuda_attention: %s\n", ckv_strerror(cs));
        goto out;
      }
      if (!cuda_ok(cudaMemcpyAsync(gpu_out, gb->out, sizeof(gpu_out), cudaMemcpyDeviceToHost, stream), "D2H out") ||
          !cuda_ok(cudaMemcpyAsync(gpu_mass, gb->mass, slots * sizeof(float), cudaMemcpyDeviceToHost, stream),
                   "D2H mass") ||
          !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"))
        goto out;
      a.q = q, a.blocks = sn->host_ptrs, a.out = cpu_out, a.mass = cpu_mass;
      cs = ckv_kernels_attention(&a);
      if (cs != CKV_OK) {
        fprintf(stderr, "commitkv-gpu-worker: ckv_kernels_attention: %s\n", ckv_strerror(cs));
        goto out;
      }
      double e = rel_err(gpu_out, cpu_out, qn), me = slots ? rel_err(gpu_mass, cpu_mass, slots) : 0;
      if (e > err) err = e;
      if (me > mass_err) mass_err = me;
      if (!(e <= TOLERANCE && me <= TOLERANCE)) bad = true;
    }
    /* The daemon may have changed a block while the GPU read it: then the CPU
     * ran on other bytes than the GPU, and the comparison says nothing. */
    if (snap_copy(sn, true) < 0) goto out;
    if (!snap_stable(sn)) continue;
    st->comparisons++;
    if (err > st->max_err) st->max_err = err;
    if (mass_err > st->max_mass_err) st->max_mass_err = mass_err;
    bool seen[SEEN_N] = {false};
    snap_formats(sn, seen);
    for (int f = 0; f < SEEN_N; f++) st->seen[f] += seen[f];
    *ret_epoch = v->epoch;
    if (bad) {
      fprintf(stderr,
              "commitkv-gpu-worker: GPU and CPU attention differ: output error %.3g, mass error %.3g (tolerance %.1g), "
              "view epoch %" PRIu64 ", %zu blocks\n",
              err, mass_err, TOLERANCE, v->epoch, sn->n);
      result = 0;
    } else {
      result = 1;
    }
    if (!quiet && attempt)
      fprintf(stderr, "commitkv-gpu-worker: blocks changed under the GPU %d time(s); compared on try %d\n", attempt,
              attempt + 1);
    goto out;
  }
  fprintf(stderr, "commitkv-gpu-worker: the view's blocks changed during each of %d GPU runs\n", MAX_TRIES);
out:
  free(gpu_mass);
  free(cpu_mass);
  return result;
}

int main(int argc, char **argv) {
  opts o = {.session = "gpu-worker", .rounds = 20, .tokens = 32, .seed = 1};
  static const struct option lo[] = {
      {"socket", required_argument, 0, 's'},   {"attach-socket", required_argument, 0, 'a'},
      {"session", required_argument, 0, 'i'},  {"rounds", required_argument, 0, 'r'},
      {"tokens", required_argument, 0, 't'},   {"seed", required_argument, 0, 'S'},
      {"device", required_argument, 0, 'd'},   {"pause-ms", required_argument, 0, 'P'},
      {"keep", no_argument, 0, 'k'},           {"expect-formats", no_argument, 0, 'e'},
      {"quiet", no_argument, 0, 'q'},          {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 's': o.socket = optarg; break;
      case 'a': o.attach = optarg; break;
      case 'i': o.session = optarg; break;
      case 'r': o.rounds = atoi(optarg); break;
      case 't': o.tokens = atoi(optarg); break;
      case 'S': o.seed = strtoull(optarg, NULL, 0); break;
      case 'd': o.device = atoi(optarg); break;
      case 'P': o.pause_ms = atoi(optarg); break;
      case 'k': o.keep = true; break;
      case 'e': o.expect_formats = true; break;
      case 'q': o.quiet = true; break;
      default: fprintf(stderr, "commitkv-gpu-worker: see the comment at the top of examples/gpu_worker.c\n"); return 2;
    }
  }
  if (o.rounds < 1 || o.tokens < 1 || o.tokens > 4096 || o.device < 0) {
    fprintf(stderr, "commitkv-gpu-worker: bad --rounds/--tokens/--device\n");
    return 2;
  }
  if (ckv_cuda_available() != CKV_OK) {
    printf("commitkv-gpu-worker: skipped: no usable CUDA device: %s\n", ckv_cuda_unavailable_reason());
    return 77;
  }
  cudaError_t ce = cudaSetDevice(o.device);
  if (ce != cudaSuccess) {
    printf("commitkv-gpu-worker: skipped: CUDA device %d: %s\n", o.device, cudaGetErrorString(ce));
    return 77;
  }
  cudaStream_t stream;
  if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) return 1;

  ckv_client_options co = {.socket = o.socket, .attach_socket = o.attach, .name = o.session, .heartbeat = true};
  ckv_client *c;
  double t0 = now_us();
  int r = ckv_client_connect(&co, &c);
  double attach_ms = (now_us() - t0) / 1e3;
  if (r < 0) {
    fprintf(stderr, "commitkv-gpu-worker: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
    return 1;
  }
  if (strcmp(ckv_client_memory_kind(c), "cuda") != 0) {
    fprintf(stderr,
            "commitkv-gpu-worker: the daemon serves %s memory, not GPU memory (start commitkvd --backend cuda)\n",
            ckv_client_memory_kind(c));
    ckv_client_free(c);
    return 1;
  }
  /* Quick lifecycle: a short recent window and persistence, so staged and
   * committed blocks appear within a few rounds. */
  static const char *const names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  static const double values[] = {4, 16, 2, 6};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 4};
  ckv_geometry g = {LAYERS, KV_HEADS, HEAD_DIM, CKV_DTYPE_FP16};
  ckv_session *s = NULL;
  r = ckv_session_open(c, o.session, &g, &so, &s);
  if (r < 0) {
    fprintf(stderr, "commitkv-gpu-worker: open %s: %s: %s\n", o.session, ckv_strerror(r), ckv_client_last_error(c));
    ckv_client_free(c);
    return 1;
  }

  const size_t elems = (size_t)KV_HEADS * HEAD_DIM, per_token = (size_t)LAYERS * 2 * elems;
  const size_t kv_bytes = (size_t)o.tokens * per_token * sizeof(uint16_t);
  uint16_t *host_kv = malloc(kv_bytes), *dev_kv = NULL;
  uint8_t *roles = malloc((size_t)o.tokens);
  float *sem = malloc((size_t)o.tokens * sizeof(float)), *attn = NULL;
  gpu_bufs gb = {0};
  snap sn = {0};
  stats st = {0};
  uint64_t rng = o.seed * 0x2545f4914f6cdd1dull + 1;
  int rc = 1;
  if (!host_kv || !roles || !sem) goto done;
  if (!cuda_ok(cudaMalloc((void **)&dev_kv, kv_bytes), "cudaMalloc") ||
      !cuda_ok(cudaMalloc((void **)&gb.q, (size_t)KV_HEADS * Q_PER_KV * HEAD_DIM * sizeof(float)), "cudaMalloc") ||
      !cuda_ok(cudaMalloc((void **)&gb.out, (size_t)KV_HEADS * Q_PER_KV * HEAD_DIM * sizeof(float)), "cudaMalloc"))
    goto done;

  bool mismatch = false;
  for (int round = 1; round <= o.rounds; round++) {
    uint64_t first = 0, n = ckv_session_tokens(s);
    for (int i = 0; i < o.tokens; i++) {
      uint64_t pos = n + (uint64_t)i;
      /* planted facts (pos % 8 == 1) mean a lot; every third token little */
      sem[i] = pos % 8 == 1 ? 0.9f : pos % 3 == 0 ? 0.2f : 0.5f;
      roles[i] = round == 1 && i < 4 ? CKV_ROLE_SYSTEM : CKV_ROLE_USER;
    }
    r = ckv_session_append(s, (uint32_t)o.tokens, roles, NULL, sem, NULL, &first);
    if (r < 0) {
      fprintf(stderr, "commitkv-gpu-worker: append: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
      goto done;
    }
    /* This round's K/V, made on the GPU: [token][layer][K|V][head][dim]. */
    for (size_t i = 0; i < (size_t)o.tokens * per_token; i++)
      host_kv[i] = ckv_f32_to_f16(0.5f * rng_value(&rng, (uint32_t)(i % HEAD_DIM)));
    if (!cuda_ok(cudaMemcpyAsync(dev_kv, host_kv, kv_bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync K/V"))
      goto done;
    for (int i = 0; i < o.tokens; i++)
      for (uint32_t l = 0; l < LAYERS; l++) {
        const uint16_t *k = dev_kv + (size_t)i * per_token + (size_t)l * 2 * elems;
        r = ckv_session_write_kv_async(s, first + (uint64_t)i, l, k, k + elems, stream);
        if (r < 0) {
          fprintf(stderr, "commitkv-gpu-worker: write_kv_async position %" PRIu64 ": %s: %s\n", first + (uint64_t)i,
                  ckv_strerror(r), ckv_client_last_error(c));
          goto done;
        }
      }
    if (o.pause_ms && round == (o.rounds + 1) / 2) {
      /* Tests kill us here: memory held, K/V queued, the round not reported. */
      fprintf(stderr, "%s: pausing for %d ms in round %d\n", o.session, o.pause_ms, round);
      usleep((useconds_t)o.pause_ms * 1000u);
    }
    /* facts hot, the new turn warm, older text cold, a third of it forgotten */
    n = ckv_session_tokens(s);
    float *na = realloc(attn, n * sizeof(float));
    if (!na) goto done;
    attn = na;
    for (uint64_t p = 0; p < n; p++)
      attn[p] = p % 8 == 1 ? 4.f : p + (uint64_t)o.tokens >= n ? 1.f : (p % 3 == 0 && round > 6) ? 0.f : 0.3f;
    ckv_round_result rr;
    double t_report = now_us();
    r = ckv_session_report(s, (uint64_t)round, 0, attn, n, &rr);
    if (r < 0) {
      fprintf(stderr, "commitkv-gpu-worker: report: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
      goto done;
    }
    /* Until a view of the report's epoch is out (moves are published async). */
    const ckv_view *v = NULL;
    do {
      r = ckv_session_view(s, &v);
      if (r < 0) {
        fprintf(stderr, "commitkv-gpu-worker: view: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
        goto done;
      }
      if (v->epoch < rr.epoch) usleep(500);
    } while (v->epoch < rr.epoch && now_us() - t_report < 5e6);
    double us = now_us() - t_report;
    st.epoch_us_sum += us;
    st.epoch_waits++;
    if (us > st.epoch_us_max) st.epoch_us_max = us;

    uint64_t epoch = 0;
    int m = compare_view(s, &g, stream, &sn, &gb, &rng, &st, &epoch, o.quiet);
    if (m < 0) goto done;
    if (m == 0) mismatch = true;
    uint64_t reclaimed = 0;
    r = ckv_session_ack_after_stream(s, epoch, stream, &reclaimed);
    if (r < 0) {
      fprintf(stderr, "commitkv-gpu-worker: ack: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
      goto done;
    }
    if (!o.quiet)
      fprintf(stderr, "%s: round %d/%d, %" PRIu64 " tokens, epoch %" PRIu64 ", %zu blocks, max_err %.3g%s\n",
              o.session, round, o.rounds, n, epoch, sn.n, st.max_err, m == 0 ? " MISMATCH" : "");
  }
  bool all_formats = st.seen[SEEN_DRAFT] && st.seen[SEEN_STAGED] && st.seen[SEEN_COMMITTED];
  if (o.expect_formats && !all_formats)
    fprintf(stderr, "commitkv-gpu-worker: --expect-formats: views held draft %" PRIu64 ", staged %" PRIu64
                    ", committed %" PRIu64 " times in %" PRIu64 " comparisons\n",
            st.seen[SEEN_DRAFT], st.seen[SEEN_STAGED], st.seen[SEEN_COMMITTED], st.comparisons);
  bool ok = !mismatch && st.comparisons > 0 && (!o.expect_formats || all_formats);
  printf("{\"worker\": \"commitkv-gpu-worker\", \"session\": \"%s\", \"ok\": %s, \"memory_kind\": \"%s\", "
         "\"rounds\": %d, \"tokens\": %" PRIu64 ", \"comparisons\": %" PRIu64 ", \"retries\": %" PRIu64
         ", \"max_err\": %.6g, \"max_mass_err\": %.6g, \"tolerance\": %g, "
         "\"formats_seen\": {\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64 "}, "
         "\"attach_ms\": %.3f, \"report_to_epoch_us\": {\"mean\": %.1f, \"max\": %.1f}}\n",
         o.session, ok ? "true" : "false", ckv_client_memory_kind(c), o.rounds, ckv_session_tokens(s),
         st.comparisons, st.retries, st.max_err, st.max_mass_err, TOLERANCE, st.seen[SEEN_DRAFT],
         st.seen[SEEN_STAGED], st.seen[SEEN_COMMITTED], attach_ms,
         st.epoch_waits ? st.epoch_us_sum / (double)st.epoch_waits : 0.0, st.epoch_us_max);
  fflush(stdout);
  rc = ok ? 0 : 1;
done:
  if (s) {
    r = o.keep ? ckv_session_close(s) : ckv_session_drop(s);
    if (r < 0 && rc == 0) {
      fprintf(stderr, "commitkv-gpu-worker: %s: %s\n", o.keep ? "close" : "drop", ckv_strerror(r));
      rc = 1;
    }
  }
  ckv_client_free(c);
  snap_free(&sn);
  cudaFree(gb.mass);
  cudaFree(gb.q);
  cudaFree(gb.out);
  cudaFree(dev_kv);
  cudaStreamDestroy(stream);
  free(host_kv);
  free(roles);
  free(sem);
  free(attn);
  return rc;
}
