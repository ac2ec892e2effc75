/* bench_failover.c - commitkv-bench failover: kill -9 of commitkvd under a
 * real systemd (Restart=on-failure, the fd store) while workers write rounds
 * (issue 43, docs/warm-restart.md).
 *
 *   commitkv-bench failover [--workers W] [--kills K] [--min-ms A] [--max-ms B]
 *                           [--round-ms R] [--seed S] [--journal PERIOD] [--daemon PATH]
 *                           [--quick] [--json]
 *
 * A private `systemd --user` (in a mount namespace of its own, where
 * /run/systemd/system exists, as tests/support/warmcheck.c
 * starts one) runs commitkvd as the unit ckvfail-<pid>.service: Type=notify,
 * FileDescriptorStoreMax=, Restart=on-failure, RestartSec=100ms, the warm
 * journal at its default period (--journal sets [daemon] warm_journal).  W worker sessions (fp16, one client in this
 * process, driven in turn) write rounds: append PER_ROUND tokens, write
 * their K/V (a pattern per session, position and write, kept in a private
 * copy), report, ack; R ms between cycles.  K times, after a random A..B ms
 * of rounds, commitkvd is killed with SIGKILL at a random point of a random
 * worker's round: between rounds, after the append and the writes (before
 * the report), or after the report (before the ack).  Then the worker
 * reconnects (retrying until the new daemon answers) onto the mapping it
 * kept, resumes every session, compares every token the session came back
 * with, byte for byte, with its private copy, and runs one more round of
 * every session.
 *
 * Per kill: acked tokens (the tokens whose append the daemon had answered:
 * what the worker was told the session holds), kept tokens (what the resume
 * came back with), sessions kept / lost (NOT_FOUND: reopened under a new id),
 * restart_ms (kill to the reconnect) and first_round_ms (kill to the first
 * round of every session served again).  bytes_verified: the K/V bytes of
 * the kept tokens found identical; wrong_bytes: those that differ, plus a
 * whole token's bytes for a kept position that no draft slot holds.  Exact:
 * wrong_bytes = 0 and kept <= acked per session (more would be tokens the
 * daemon never answered).  Aims (printed, not enforced): kept_ratio >= 0.99,
 * first_round_ms_max <= 1000.
 *
 * Without a private systemd (not root, no systemd or systemctl, no mount
 * namespace) it prints the reason and, with --json,
 * {"skipped": true, "reason": "..."}, and exits 0. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "bench/bench_systemd.h"
#include "commitkv/commitkv.h"
#include "kernels/format.h"
#include "kernels/kernels.h"

#define FO_LAYERS 2u
#define FO_HEADS 2u
#define FO_DIM 32u
#define FO_ELEMS (FO_HEADS * FO_DIM)
#define FO_PER_ROUND 16u
#define FO_MAX_TOKENS 2048u /* a session this full is dropped and a new one opened */
#define FO_MAX_WORKERS 64
#define FO_MAX_KILLS 1000
#define FO_DEADLINE_MS 30000
#define FO_TOKEN_BYTES ((uint64_t)FO_LAYERS * 2u * FO_ELEMS * sizeof(uint16_t))

static const ckv_geometry fo_geom = {FO_LAYERS, FO_HEADS, FO_DIM, 0};


static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double now_msf(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- workers ------------------------------------------------------------ */

typedef struct fo_worker {
  char id[48];
  int gen;           /* bumped when the session is replaced (full, or lost) */
  ckv_session *s;
  uint64_t n;        /* tokens whose append the daemon answered */
  uint64_t round;    /* the last round reported */
  uint32_t salt;     /* bumped at every write: a rewritten position gets new bytes */
  uint16_t *copy;    /* [pos][layer][kv][FO_ELEMS] */
} fo_worker;

typedef struct fo_kill {
  int worker, point;  /* whose round, and where in it (0 between rounds, 1 after the writes, 2 after the report) */
  uint64_t acked, kept;
  int sessions_kept, sessions_lost;
  double restart_ms, first_round_ms;
  uint64_t bytes_verified, wrong_bytes;
} fo_kill;

#define FO_LAT_MAX 65536

typedef struct fo_run {
  int workers, kills, min_ms, max_ms, round_ms;
  unsigned seed;
  bool json, quick;
  ckv_bench_sd sd;
  ckv_client *c;
  fo_worker w[FO_MAX_WORKERS];
  fo_kill k[FO_MAX_KILLS];
  uint64_t rounds, arena_remapped, errors;
  /* How long a whole round (append, writes, report, ack) took, kills left
   * out: what holding replies until their change is durable costs. */
  double round_lat[FO_LAT_MAX];
  size_t n_lat;
  int sanitizer_reports; /* lines of the daemon's log a sanitizer wrote: must be 0 */
  char error[512];
} fo_run;

static uint64_t fo_rand(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint16_t *w_at(fo_worker *w, uint64_t pos, uint32_t layer, uint32_t kv) {
  return w->copy + (((pos * FO_LAYERS + layer) * 2u + kv) * FO_ELEMS);
}

static int fail(fo_run *r, const char *what, int code) {
  snprintf(r->error, sizeof r->error, "%s: %s (%s)", what, ckv_strerror(code), r->c ? ckv_client_last_error(r->c) : "");
  return code ? code : -1;
}

static int w_open(fo_run *r, fo_worker *w, int index) {
  if (w->s) ckv_session_close(w->s);
  w->s = NULL;
  snprintf(w->id, sizeof w->id, "fo%d-%d", index, w->gen++);
  w->n = 0;
  w->round = 0;
  ckv_session_options so = {.policy = "fp16", .model_id = "stories260K", .model_revision = "r1"};
  int rc = ckv_session_open(r->c, w->id, &fo_geom, &so, &w->s);
  return rc == CKV_OK ? 0 : fail(r, "open", rc);
}

/* One round of worker w, stopping before `stop_at` (1: after the append and
 * the writes, 2: after the report; 0 or 3: the whole round). */
static int w_round(fo_run *r, fo_worker *w, int index, int stop_at) {
  if (w->n + FO_PER_ROUND > FO_MAX_TOKENS) {
    int rc = ckv_session_drop(w->s);
    w->s = NULL;
    if (rc != CKV_OK) return fail(r, "drop of a full session", rc);
    if ((rc = w_open(r, w, index)) != 0) return rc;
  }
  uint64_t first = 0;
  double t0 = now_msf();
  int rc = ckv_session_append(w->s, FO_PER_ROUND, NULL, NULL, NULL, NULL, &first);
  if (rc != CKV_OK) return fail(r, "append", rc);
  if (first != w->n) {
    snprintf(r->error, sizeof r->error, "append of %s: first position %llu, the worker has %llu", w->id,
             (unsigned long long)first, (unsigned long long)w->n);
    return -1;
  }
  w->n += FO_PER_ROUND;
  w->salt++;
  uint64_t x = ((uint64_t)index << 40) ^ ((uint64_t)w->gen << 32) ^ w->salt;
  for (uint64_t pos = first; pos < w->n; pos++)
    for (uint32_t l = 0; l < FO_LAYERS; l++) {
      uint16_t *k = w_at(w, pos, l, 0), *v = w_at(w, pos, l, 1);
      for (uint32_t e = 0; e < FO_ELEMS; e++) {
        uint64_t z = fo_rand(&x);
        k[e] = (uint16_t)(z & 0x3bffu); /* finite halves, |x| < 1 */
        v[e] = (uint16_t)((z >> 16) & 0x3bffu);
      }
      if ((rc = ckv_session_write_kv(w->s, pos, l, k, v)) != CKV_OK) return fail(r, "write_kv", rc);
    }
  if (stop_at == 1) return 0;
  float attn[FO_MAX_TOKENS];
  for (uint64_t i = 0; i < w->n; i++) attn[i] = 1.f;
  ckv_round_result rr;
  if ((rc = ckv_session_report(w->s, ++w->round, 0, attn, (size_t)w->n, &rr)) != CKV_OK) return fail(r, "report", rc);
  if (stop_at == 2) return 0;
  if ((rc = ckv_session_ack(w->s, rr.epoch, NULL)) != CKV_OK) return fail(r, "ack", rc);
  r->rounds++;
  if (r->n_lat < FO_LAT_MAX) r->round_lat[r->n_lat++] = now_msf() - t0;
  return 0;
}

/* Compares the kept tokens of w's resumed session with its private copy. */
static int w_verify(fo_run *r, fo_worker *w, uint64_t kept, fo_kill *k) {
  const ckv_view *v = NULL;
  int rc = ckv_session_view(w->s, &v);
  if (rc != CKV_OK) return fail(r, "view after the resume", rc);
  uint8_t *seen = calloc(kept ? kept : 1, 1);
  if (!seen) return -ENOMEM;
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *b = &v->draft[i];
    const uint32_t *pos = ckv_block_positions_const(b->data);
    for (uint32_t slot = 0; slot < b->capacity; slot++) {
      if (!ckv_block_slot_valid(b->data, slot)) continue;
      uint32_t p = pos[slot];
      if (p >= kept || seen[p]) { /* a position the session does not hold, or twice */
        k->wrong_bytes += FO_TOKEN_BYTES;
        continue;
      }
      seen[p] = 1;
      for (uint32_t l = 0; l < FO_LAYERS; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint8_t *at = (const uint8_t *)b->data + ckv_draft_kv_offset(&fo_geom, b->capacity, l, kv, slot);
          const uint8_t *want = (const uint8_t *)w_at(w, p, l, kv);
          for (size_t j = 0; j < FO_ELEMS * sizeof(uint16_t); j++)
            if (at[j] == want[j])
              k->bytes_verified++;
            else
              k->wrong_bytes++;
        }
    }
  }
  for (uint64_t p = 0; p < kept; p++)
    if (!seen[p]) k->wrong_bytes += FO_TOKEN_BYTES; /* kept, but in no draft slot (fp16 keeps all in draft) */
  free(seen);
  return 0;
}

/* After the kill: reconnect until the new daemon answers. */
static int reconnect(fo_run *r, pid_t old) {
  long long end = now_ms() + FO_DEADLINE_MS;
  while (kill(old, 0) == 0 && now_ms() < end) usleep(1000); /* systemd reaps it */
  int rc;
  while ((rc = ckv_client_reconnect(r->c)) != CKV_OK) {
    if (now_ms() > end) return fail(r, "reconnect to the restarted daemon", rc);
    usleep(2000);
  }
  if (!ckv_client_arena_kept(r->c)) r->arena_remapped++;
  return 0;
}

static int one_kill(fo_run *r, int ki, uint64_t *rng) {
  fo_kill *k = &r->k[ki];
  int span = r->max_ms > r->min_ms ? r->max_ms - r->min_ms : 0;
  long long until = now_ms() + r->min_ms + (span ? (long long)(fo_rand(rng) % (uint64_t)(span + 1)) : 0);
  int rc;
  while (now_ms() < until) {
    for (int i = 0; i < r->workers; i++)
      if ((rc = w_round(r, &r->w[i], i, 0)) != 0) return rc;
    if (r->round_ms) usleep((useconds_t)r->round_ms * 1000u);
  }
  k->worker = (int)(fo_rand(rng) % (uint64_t)r->workers);
  k->point = (int)(fo_rand(rng) % 3);
  /* the workers before k->worker finish this cycle's round; k->worker stops at the point */
  for (int i = 0; i < k->worker; i++)
    if ((rc = w_round(r, &r->w[i], i, 0)) != 0) return rc;
  if (k->point && (rc = w_round(r, &r->w[k->worker], k->worker, k->point)) != 0) return rc;
  pid_t pid = ckv_bench_sd_main_pid(&r->sd);
  if (pid <= 0) {
    snprintf(r->error, sizeof r->error, "the unit has no main pid before kill %d", ki + 1);
    return -1;
  }
  for (int i = 0; i < r->workers; i++) k->acked += r->w[i].n;
  double t0 = now_msf();
  if (kill(pid, SIGKILL) != 0) {
    snprintf(r->error, sizeof r->error, "kill %d: %s", (int)pid, strerror(errno));
    return -1;
  }
  if ((rc = reconnect(r, pid)) != 0) return rc;
  k->restart_ms = now_msf() - t0;
  for (int i = 0; i < r->workers; i++) {
    fo_worker *w = &r->w[i];
    ckv_session_close(w->s);
    w->s = NULL;
    ckv_session_options ro = {.resume = true, .model_id = "stories260K", .model_revision = "r1"};
    rc = ckv_session_open(r->c, w->id, NULL, &ro, &w->s);
    if (rc == CKV_ERR_NOT_FOUND) {
      k->sessions_lost++;
      fprintf(stderr, "commitkv-bench failover: kill %d: %s lost (%llu tokens acked): %s\n", ki + 1, w->id,
              (unsigned long long)w->n, ckv_client_last_error(r->c));
      if ((rc = w_open(r, w, i)) != 0) return rc;
      continue;
    }
    if (rc != CKV_OK) return fail(r, "resume", rc);
    uint64_t t = ckv_session_tokens(w->s);
    if (t > w->n) { /* the daemon holds tokens it never answered: never */
      snprintf(r->error, sizeof r->error, "kill %d: %s came back with %llu tokens, only %llu were acked", ki + 1,
               w->id, (unsigned long long)t, (unsigned long long)w->n);
      return -1;
    }
    if ((rc = w_verify(r, w, t, k)) != 0) return rc;
    k->sessions_kept++;
    k->kept += t;
    w->n = t;
    /* rounds go on from the count the resume says; the round number must only grow */
  }
  for (int i = 0; i < r->workers; i++)
    if ((rc = w_round(r, &r->w[i], i, 0)) != 0) return rc;
  k->first_round_ms = now_msf() - t0;
  return 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report(fo_run *r, int done) {
  uint64_t acked = 0, kept = 0, verified = 0, wrong = 0, skept = 0, slost = 0;
  double fr[FO_MAX_KILLS], rs[FO_MAX_KILLS];
  for (int i = 0; i < done; i++) {
    acked += r->k[i].acked;
    kept += r->k[i].kept;
    verified += r->k[i].bytes_verified;
    wrong += r->k[i].wrong_bytes;
    skept += (uint64_t)r->k[i].sessions_kept;
    slost += (uint64_t)r->k[i].sessions_lost;
    fr[i] = r->k[i].first_round_ms;
    rs[i] = r->k[i].restart_ms;
  }
  qsort(fr, (size_t)done, sizeof fr[0], cmp_d);
  qsort(rs, (size_t)done, sizeof rs[0], cmp_d);
  double p50 = done ? fr[done / 2] : 0, mx = done ? fr[done - 1] : 0, rp50 = done ? rs[done / 2] : 0;
  double ratio = acked ? (double)kept / (double)acked : 0;
  qsort(r->round_lat, r->n_lat, sizeof r->round_lat[0], cmp_d);
  double lat50 = r->n_lat ? r->round_lat[r->n_lat / 2] : 0, lat99 = r->n_lat ? r->round_lat[r->n_lat * 99 / 100] : 0;
  static const char *const points[] = {"between rounds", "before report", "before ack"};
  if (r->json) {
    printf("{\"skipped\": false, \"workers\": %d, \"kills\": %d, \"per_round_tokens\": %u, \"token_bytes\": %u, \"round_ms\": %d, "
           "\"seed\": %u, \"first_round_ms_p50\": %.1f, \"first_round_ms_max\": %.1f, \"restart_ms_p50\": %.1f, "
           "\"acked_tokens\": %llu, \"kept_tokens\": %llu, \"lost_tokens\": %llu, \"kept_ratio\": %.6f, "
           "\"warm_journal\": \"%s\", \"sessions_kept\": %llu, "
           "\"sessions_lost\": %llu, \"bytes_verified\": %llu, \"wrong_bytes\": %llu, \"rounds\": %llu, "
           "\"round_latency_ms_p50\": %.2f, \"round_latency_ms_p99\": %.2f, "
           "\"arena_remapped\": %llu, \"sanitizer_reports\": %d, \"aim_kept_ratio\": 0.99, \"aim_first_round_ms\": 1000, \"per_kill\": [",
           r->workers, done, FO_PER_ROUND, (unsigned)FO_TOKEN_BYTES, r->round_ms, r->seed, p50, mx, rp50, (unsigned long long)acked,
           (unsigned long long)kept, (unsigned long long)(acked - kept), ratio,
           r->sd.journal ? r->sd.journal : "default", (unsigned long long)skept, (unsigned long long)slost,
           (unsigned long long)verified, (unsigned long long)wrong, (unsigned long long)r->rounds, lat50, lat99,
           (unsigned long long)r->arena_remapped, r->sanitizer_reports);
    for (int i = 0; i < done; i++) {
      const fo_kill *k = &r->k[i];
      printf("%s{\"worker\": %d, \"point\": \"%s\", \"acked_tokens\": %llu, \"kept_tokens\": %llu, "
             "\"sessions_kept\": %d, \"sessions_lost\": %d, \"restart_ms\": %.1f, \"first_round_ms\": %.1f, "
             "\"bytes_verified\": %llu, \"wrong_bytes\": %llu}",
             i ? ", " : "", k->worker, points[k->point], (unsigned long long)k->acked, (unsigned long long)k->kept,
             k->sessions_kept, k->sessions_lost, k->restart_ms, k->first_round_ms,
             (unsigned long long)k->bytes_verified, (unsigned long long)k->wrong_bytes);
    }
    printf("]}\n");
    return;
  }
  printf("failover: %d workers (fp16, %u tokens a round), commitkvd killed -9 %d times under systemd --user "
         "(Restart=on-failure, RestartSec=100ms, fd store)\n",
         r->workers, FO_PER_ROUND, done);
  printf("%4s %6s %-15s %9s %9s %6s %6s %10s %14s %12s %6s\n", "kill", "worker", "point", "acked", "kept", "s.kept",
         "s.lost", "restart ms", "first round ms", "bytes ok", "wrong");
  for (int i = 0; i < done; i++) {
    const fo_kill *k = &r->k[i];
    printf("%4d %6d %-15s %9llu %9llu %6d %6d %10.1f %14.1f %12llu %6llu\n", i + 1, k->worker, points[k->point],
           (unsigned long long)k->acked, (unsigned long long)k->kept, k->sessions_kept, k->sessions_lost,
           k->restart_ms, k->first_round_ms, (unsigned long long)k->bytes_verified,
           (unsigned long long)k->wrong_bytes);
  }
  printf("kept %llu of %llu acked tokens (%.4f; aim >= 0.99), first round again p50 %.1f ms, max %.1f ms (aim <= "
         "1000), bytes verified %llu, wrong %llu; a round (append, writes, report, ack) p50 %.2f ms, p99 %.2f ms\n",
         (unsigned long long)kept, (unsigned long long)acked, ratio, p50, mx, (unsigned long long)verified,
         (unsigned long long)wrong, lat50, lat99);
}

int ckv_bench_failover(int argc, char **argv) {
  static fo_run run; /* the private copies' pointers and the per-kill rows: not on the stack */
  fo_run *r = &run;
  memset(r, 0, sizeof *r);
  r->workers = 4;
  r->kills = 5;
  r->min_ms = 200;
  r->max_ms = 800;
  r->round_ms = 10;
  r->seed = (unsigned)time(NULL);
  const char *daemon = NULL;
  static const struct option opts[] = {{"workers", required_argument, 0, 'w'}, {"kills", required_argument, 0, 'k'},
                                       {"min-ms", required_argument, 0, 'a'},  {"max-ms", required_argument, 0, 'b'},
                                       {"round-ms", required_argument, 0, 'r'}, {"seed", required_argument, 0, 's'},
                                       {"daemon", required_argument, 0, 'd'},  {"journal", required_argument, 0, 'J'},
                                       {"journal-delay", required_argument, 0, 'D'},
                                       {"quick", no_argument, 0, 'q'},
                                       {"json", no_argument, 0, 'j'},          {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  bool kills_set = false;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (ch) {
      case 'w': r->workers = atoi(optarg); break;
      case 'k': r->kills = atoi(optarg); kills_set = true; break;
      case 'a': r->min_ms = atoi(optarg); break;
      case 'b': r->max_ms = atoi(optarg); break;
      case 'r': r->round_ms = atoi(optarg); break;
      case 's': r->seed = (unsigned)strtoul(optarg, NULL, 10); break;
      case 'd': daemon = optarg; break;
      case 'J': r->sd.journal = optarg; break;
      case 'D': /* [daemon] warm_journal_delay: how long a batch waits for more changes */
        snprintf(r->sd.extra, sizeof r->sd.extra, "--set daemon.warm_journal_delay=%.60s", optarg);
        break;
      case 'q': r->quick = true; break;
      case 'j': r->json = true; break;
      default:
        fprintf(ch == 'h' ? stdout : stderr,
                "usage: commitkv-bench failover [--workers W] [--kills K] [--min-ms A] [--max-ms B] [--round-ms R]\n"
                "                               [--seed S] [--journal PERIOD] [--journal-delay D] [--daemon PATH]\n"
                "                               [--quick] [--json]\n");
        return ch == 'h' ? 0 : 2;
    }
  }
  if (r->quick) {
    if (!kills_set) r->kills = 3;
    r->workers = r->workers > 2 ? 2 : r->workers;
    r->min_ms = 100;
    r->max_ms = 300;
  }
  if (r->workers < 1 || r->workers > FO_MAX_WORKERS || r->kills < 1 || r->kills > FO_MAX_KILLS || r->min_ms < 0 ||
      r->max_ms < 0 || r->round_ms < 0) {
    fprintf(stderr, "commitkv-bench failover: --workers 1..%d, --kills 1..%d, times >= 0\n", FO_MAX_WORKERS,
            FO_MAX_KILLS);
    return 2;
  }
  if (ckv_bench_find_daemon(daemon, r->sd.daemon, sizeof r->sd.daemon) < 0) {
    fprintf(stderr, "commitkv-bench failover: no commitkvd (beside this binary, or --daemon)\n");
    return 2;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(r->sd.dir, sizeof r->sd.dir, "%.60s/ckv-failover-XXXXXX", tmp && *tmp && strlen(tmp) < 60 ? tmp : "/tmp");
  if (!mkdtemp(r->sd.dir)) {
    fprintf(stderr, "commitkv-bench failover: mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  chmod(r->sd.dir, 0755);
  char why[1024];
  int st = ckv_bench_sd_start(&r->sd, "ckvfail", why, sizeof why);
  if (st != 0) {
    if (r->json) {
      for (char *p = why; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = ' ';
      printf("{\"skipped\": %s, \"reason\": \"%s\"}\n", st > 0 ? "true" : "false", why);
    } else {
      printf("failover: %s: %s\n", st > 0 ? "SKIPPED" : "FAILED", why);
    }
    fprintf(stderr, "commitkv-bench failover: %s: %s\n", st > 0 ? "SKIPPED" : "failed", why);
    ckv_bench_rm_tree(r->sd.dir);
    return st > 0 ? 0 : 1;
  }
  int rc = 0, done = 0;
  uint64_t rng = r->seed;
  ckv_client_options o = {.socket = r->sd.socket, .attach_socket = r->sd.attach, .name = "commitkv-bench-failover",
                          .timeout_ms = 10000};
  long long end = now_ms() + FO_DEADLINE_MS;
  while ((rc = ckv_client_connect(&o, &r->c)) != CKV_OK && now_ms() < end) usleep(20000);
  if (rc != CKV_OK) {
    snprintf(r->error, sizeof r->error, "connect: %s (%s)", ckv_strerror(rc), ckv_client_connect_error());
    goto out;
  }
  for (int i = 0; i < r->workers; i++) {
    r->w[i].copy = calloc((size_t)FO_MAX_TOKENS * FO_LAYERS * 2u * FO_ELEMS, sizeof(uint16_t));
    if (!r->w[i].copy) {
      rc = -ENOMEM;
      snprintf(r->error, sizeof r->error, "out of memory");
      goto out;
    }
    if ((rc = w_open(r, &r->w[i], i)) != 0) goto out;
  }
  for (; done < r->kills; done++)
    if ((rc = one_kill(r, done, &rng)) != 0) break;
out:
  for (int i = 0; i < r->workers; i++) {
    if (r->w[i].s) ckv_session_close(r->w[i].s);
    free(r->w[i].copy);
    r->w[i].copy = NULL;
  }
  r->c = ckv_client_free(r->c);
  if (rc != 0) {
    fprintf(stderr, "commitkv-bench failover: %s; daemon log %s:\n%s\n", r->error, r->sd.log,
            ckv_bench_file_tail(r->sd.log, 800));
  }
  if (ckv_bench_sd_stop(&r->sd) < 0 && rc == 0) {
    snprintf(r->error, sizeof r->error, "the clean stop of the unit failed or left a daemon");
    rc = -1;
  }
  r->sanitizer_reports = ckv_bench_sd_sanitizer_reports(&r->sd);
  if (r->sanitizer_reports && rc == 0) {
    fprintf(stderr, "commitkv-bench failover: %d sanitizer report(s) in the daemon log %s:\n%s\n",
            r->sanitizer_reports, r->sd.log, ckv_bench_file_tail(r->sd.log, 1000));
    rc = -1;
  }
  report(r, done);
  if (rc == 0 || !getenv("CKV_BENCH_KEEP")) ckv_bench_rm_tree(r->sd.dir);
  return rc == 0 ? 0 : 1;
}
