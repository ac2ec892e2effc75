/* bench_judge.c - see bench_judge.h.
 *
 * A session of N tokens lives in a real tenant arena; each measured round
 * reports a fresh attention vector (a few hot tokens, a topic band, a long
 * cold tail, as in a multi-turn agent), then runs the lifecycle round (judge
 * + planning).  Moves run on a compressor thread, as in the daemon, and are
 * published between rounds outside the timing: what is timed is exactly the
 * server thread's work per ReportRound, compression excluded. */
#include "bench/bench_judge.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commitkv/status.h"
/* The judge and its parameters are the lifecycle library's; what is timed is
 * the daemon's ReportRound path around it (session columns, planning moves
 * into blocks, the compressor), so those come from daemon/. */
#include "store/compressor.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/tenant.h"
#include "lifecycle/judge.h"
#include "lifecycle/policy.h"
#include "shm/arena.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void) { /* this thread's CPU time: the machine is shared */
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v and returns its p50 and p99 (nearest rank) in microseconds. */
static void pcts(uint64_t *v, size_t n, double *p50, double *p99) {
  qsort(v, n, sizeof(*v), cmp_u64);
  size_t i99 = (n * 99) / 100 < n ? (n * 99) / 100 : n - 1;
  *p50 = (double)v[n / 2] / 1e3;
  *p99 = (double)v[i99] / 1e3;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill_attention(float *a, size_t n, uint32_t round, uint64_t *rng) {
  size_t band = n / 16, start = (size_t)(round * 97u) % (n - band);
  for (size_t i = 0; i < n; i++) a[i] = (float)(rng_next(rng) % 1000) * 1e-6f;
  for (size_t i = start; i < start + band; i++) a[i] += 0.01f;
  for (size_t i = 0; i < 64; i++) a[rng_next(rng) % n] += 0.5f;
}

int ckv_bench_judge_run(uint64_t tokens, double seconds, ckv_judge_bench *ret) {
  return ckv_bench_judge_run_sampled(tokens, seconds, 1, 1.0f, ret);
}

int ckv_bench_judge_run_sampled(uint64_t tokens, double seconds, uint32_t judge_every, float far_sample,
                                ckv_judge_bench *ret) {
  /* A tiny geometry keeps the arena small: the judge's cost does not depend on it. */
  ckv_geometry g = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .dtype = 0};
  uint32_t dt = 16, ct = 64;
  ckv_tenant *t = NULL;
  ckv_srv_session *s = NULL;
  ckv_compressor *c = NULL;
  float *attn = malloc(tokens * sizeof(float));
  uint64_t *lat = NULL, next_block = 0;
  int r = attn ? ckv_tenant_new("bench", 1ull << 32, (1ull << 32) + (64u << 20), 1, &ckv_arena_host_backend, &t)
               : CKV_ERR_INVALID;
  ckv_judge_params p; /* the shipped [policy] defaults, commitkv policy */
  ckv_judge_params_init(&p);
  p.judge_every = judge_every;
  p.far_sample = far_sample;
  if (r == 0) r = ckv_srv_session_new("bench", t, &g, dt, ct, "commitkv", &p, &next_block, &s);
  if (r == 0) r = ckv_compressor_new(1, 64, &c); /* moves run on their own thread, as in the daemon */
  if (r == 0) {
    s->owner = 1;
    /* append in chunks, with a semantic score so the filler rule sees a signal */
    float *sem = malloc(4096 * sizeof(float));
    ckv_slot_run *runs = malloc(ckv_srv_session_max_runs(s, 4096) * sizeof(*runs));
    uint64_t rng = 42;
    for (uint64_t done = 0; r == 0 && done < tokens && sem && runs;) {
      uint32_t n = tokens - done < 4096 ? (uint32_t)(tokens - done) : 4096;
      for (uint32_t i = 0; i < n; i++) sem[i] = (float)(rng_next(&rng) % 100) / 100.f;
      size_t nr;
      uint64_t first;
      r = ckv_srv_session_append(s, n, NULL, NULL, sem, NULL, runs, &nr, &first);
      done += n;
    }
    if (!sem || !runs) r = CKV_ERR_INVALID;
    free(sem);
    free(runs);
    /* The daemon writes the new blocks' headers into the arena before it
     * answers each append; here that is done once, outside the timing. */
    if (r == 0) r = ckv_srv_session_flush_meta(s);
  }
  /* per round: wall time of the whole round, of recording, of judge + plan,
   * and the thread's CPU time for the whole round */
  size_t cap = 1024, n_lat = 0;
  lat = malloc(cap * 4 * sizeof(*lat));
  uint64_t judge_ns = 0, judged = 0, transitions = 0, rng = 7;
  uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
  for (uint32_t round = 1; r == 0 && lat && (now_ns() < end || n_lat < 5); round++) {
    fill_attention(attn, tokens, round, &rng);
    uint64_t c0 = cpu_ns(), t0 = now_ns();
    r = ckv_srv_session_report_round(s, round, 0, attn, tokens, NULL, NULL, 0);
    ckv_transition_list out = {0};
    uint64_t t1 = now_ns();
    if (r == 0) r = ckv_moves_round(s, c, round, &out);
    uint64_t t2 = now_ns(), c2 = cpu_ns();
    for (size_t i = 0; i < out.n; i++) transitions += out.v[i].count;
    ckv_transition_list_done(&out);
    judge_ns += t2 - t1;
    judged += tokens;
    if (n_lat == cap) {
      uint64_t *nl = malloc(cap * 2 * 4 * sizeof(*nl));
      if (!nl) break;
      for (int k = 0; k < 4; k++) memcpy(nl + k * cap * 2, lat + k * cap, n_lat * sizeof(*nl));
      free(lat);
      lat = nl;
      cap *= 2;
    }
    lat[n_lat] = t2 - t0;
    lat[cap + n_lat] = t1 - t0;
    lat[2 * cap + n_lat] = t2 - t1;
    lat[3 * cap + n_lat] = c2 - c0;
    n_lat++;
    /* Publish what the synchronous compressor finished, outside the timing,
     * so later rounds see the moved tokens as a live daemon would. */
    for (ckv_job *j = ckv_compressor_collect(c), *nx; j; j = nx) {
      nx = j->next;
      ckv_moves_publish(s, c, j);
    }
  }
  if (r == 0 && n_lat) {
    *ret = (ckv_judge_bench){.tokens = tokens, .judge_every = judge_every, .far_sample = far_sample,
                             .tokens_per_s = judge_ns ? (double)judged / ((double)judge_ns * 1e-9) : 0,
                             .rounds = n_lat,
                             .transitions = transitions};
    pcts(lat, n_lat, &ret->round_p50_us, &ret->round_p99_us);
    pcts(lat + cap, n_lat, &ret->record_p50_us, &ret->record_p99_us);
    pcts(lat + 2 * cap, n_lat, &ret->judge_p50_us, &ret->judge_p99_us);
    pcts(lat + 3 * cap, n_lat, &ret->cpu_p50_us, &ret->cpu_p99_us);
  }
  if (c) {
    ckv_job *j = ckv_compressor_collect(c);
    while (j) {
      ckv_job *nx = j->next;
      ckv_moves_publish(s, c, j);
      j = nx;
    }
  }
  ckv_compressor_free(c);
  ckv_srv_session_free(s);
  ckv_tenant_free(t);
  free(attn);
  free(lat);
  return r;
}
