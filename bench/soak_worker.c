/* soak_worker.c - commitkv-bench soak-worker: a worker that ends
 * conversations and reuses their ids, and checks every byte it reads against
 * what that conversation wrote (issue 40: nothing ended comes back).
 *
 *   commitkv-bench soak-worker --socket EP --attach-socket PATH --state FILE
 *                              [--log FILE] [--life FILE] [--ids N] [--steps S] [--seed X]
 *
 * It works on the ids PREFIX-0 .. PREFIX-(N-1) (PREFIX = the state file's
 * name), picking one at random each step.  An id without a handle is resumed
 * first; what the daemon serves is read back and judged, token by token:
 *   - its position is below what the id's current conversation wrote and its
 *     K/V is that conversation's pattern: verified;
 *   - it lies where a killed try was appending (appended, the write not yet
 *     recorded): not judged, and the conversation is dropped;
 *   - it is the pattern of a conversation known ended (dropped, or replaced
 *     by a new open): stale_served;
 *   - anything else: wrong_bytes (the bytes that differ), logged with the id
 *     and the position.
 * A resume of an id known ended must answer NOT_FOUND (ended_served counts
 * the others); NOT_FOUND of a current one is a legitimate loss (a kill -9
 * before its first autosave, tokens_lost).  Then a new conversation is opened
 * with a new random seed (the K/V of position p is a function of seed and p).
 * A detached id is sometimes replaced instead, without a look (OpenSession
 * without resume): the conversation it had is ended, wherever its copies are.
 * An id with a handle takes a round: append, write K/V, report, acknowledge,
 * read everything back; then now and then it is dropped (ended: its next
 * resume must find nothing) or detached for a few seconds (long enough for
 * the disk and remote tiers to take it).  Sessions run the fp16 policy, so
 * every token stays FP16 draft and every byte must be exact.
 *
 * The worker is killed with SIGKILL at any point, and so is the daemon: what
 * it knows lives in the state file (soak_worker.h), written before each step
 * whose effect a kill could leave unknown, so the next generation judges
 * with the right expectation.  The daemon's life (the soak's restart count,
 * --life) tells a resume from a crash copy from one from memory.
 * Anomalies go to --log (appended) and stderr.  Exit 0 after --steps steps
 * (its sessions detached), 1 when the daemon stays away. */
#include "bench/soak_worker.h"

#include "bench/bench.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "examples/common/reconnect.h"
#include "kernels/format.h"

#define SW_LAYERS 2u
#define SW_HEADS 2u
#define SW_DIM 64u
#define SW_ELEMS (SW_HEADS * SW_DIM)
#define SW_TOKEN_BYTES (SW_LAYERS * 2u * SW_ELEMS * 2u) /* layers x K|V x elements x FP16 */
#define SW_ROUND_TOKENS 16u
#define SW_MAX_TOKENS 256u        /* a conversation that long is ended */
#define SW_DETACH_MIN_MS 1500     /* a detached id rests this long at least: the tiers take it */
#define SW_RETRY_MS 300           /* an id answered BUSY or a store error waits this long */
#define SW_RECONNECT_MS 30000

typedef struct sw {
  const char *socket, *attach, *state_path, *life_path;
  char prefix[64];
  int n_ids, steps, fd, log_fd;
  uint64_t rng;
  ckv_client *c;
  ckv_geometry g;
  ckv_session *h[CKV_SOAK_MAX_IDS];
  long long not_before[CKV_SOAK_MAX_IDS];
  ckv_soak_state st;
  uint16_t k[SW_ELEMS], v[SW_ELEMS];
  float attn[SW_MAX_TOKENS + SW_ROUND_TOKENS];
} sw;

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t next_rand(sw *w) { return mix(w->rng += 0x9e3779b97f4a7c15ull); }

/* Element i of K (kv 0) or V (kv 1) of `layer` at `pos` in conversation `seed`. */
static uint16_t sw_pattern(uint64_t seed, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t i) {
  return (uint16_t)mix(seed ^ mix(pos * 0x100000001b3ull + (layer * 2u + kv) * 0x10000u + i));
}

static void logf_(sw *w, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = sizeof line - 1;
  if (w->log_fd >= 0 && write(w->log_fd, line, (size_t)n) < 0) { /* stderr has it too */
  }
  fputs(line, stderr);
}

static void save(sw *w) {
  if (pwrite(w->fd, &w->st, sizeof w->st, 0) != (ssize_t)sizeof w->st)
    logf_(w, "%s: state file: %s\n", w->prefix, strerror(errno));
}

/* The soak's count of daemon restarts (0 when there is no file). */
static uint64_t daemon_life(const sw *w) {
  char buf[32] = "";
  int fd = w->life_path ? open(w->life_path, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  return strtoull(buf, NULL, 10);
}

static void id_name(const sw *w, int k, char *buf, size_t len) { snprintf(buf, len, "%s-%d", w->prefix, k); }

static uint64_t new_seed(sw *w) {
  uint64_t s;
  while (!(s = next_rand(w))) {
  }
  return s;
}

static void push_ended(ckv_soak_id *I, uint64_t seed) {
  if (!seed) return;
  memmove(&I->ended[1], &I->ended[0], sizeof I->ended - sizeof I->ended[0]);
  I->ended[0] = seed;
}

/* Bytes of one token (slot sl of a draft block) that differ from conversation seed's. */
static uint64_t token_diff(const uint8_t *base, uint32_t cap, uint32_t sl, const ckv_geometry *g, uint64_t seed,
                           uint32_t pos) {
  uint64_t d = 0;
  for (uint32_t l = 0; l < SW_LAYERS; l++)
    for (uint32_t kv = 0; kv < 2; kv++) {
      const uint16_t *p = (const uint16_t *)(base + ckv_draft_kv_offset(g, cap, l, kv, sl));
      for (uint32_t i = 0; i < SW_ELEMS; i++) {
        uint16_t x = p[i] ^ sw_pattern(seed, pos, l, kv, i);
        d += (x & 0xffu) != 0;
        d += (x >> 8) != 0;
      }
    }
  return d;
}

/* Judges one token served at `pos` (see the top of the file).  False when
 * it was not verified. */
static bool judge(sw *w, int k, const uint8_t *base, uint32_t cap, uint32_t sl, uint32_t pos,
                  const ckv_soak_conv *cands, int nc) {
  ckv_soak_counters *C = &w->st.c;
  const ckv_soak_id *I = &w->st.ids[k];
  const ckv_geometry *g = &w->g;
  const ckv_soak_conv *expect = NULL;
  for (int j = 0; j < nc; j++) {
    if (!cands[j].seed || pos >= cands[j].written) continue;
    if (!expect) expect = &cands[j];
    if (token_diff(base, cap, sl, g, cands[j].seed, pos) == 0) {
      C->bytes_verified += SW_TOKEN_BYTES;
      return true;
    }
  }
  for (int j = 0; j < nc && !expect; j++)
    if (cands[j].seed && pos < cands[j].appended) {
      C->tokens_unjudged++;
      return false;
    }
  for (int e = 0; e < CKV_SOAK_KEEP_ENDED; e++)
    if (I->ended[e] && token_diff(base, cap, sl, g, I->ended[e], pos) == 0) {
      C->stale_served += SW_TOKEN_BYTES;
      logf_(w, "%s-%d: STALE: position %u is conversation %016" PRIx64 "'s, ended (phase %u, current %016" PRIx64
               ")\n", w->prefix, k, pos, I->ended[e], I->phase, I->cur.seed);
      return false;
    }
  uint64_t d = expect ? token_diff(base, cap, sl, g, expect->seed, pos) : SW_TOKEN_BYTES;
  C->wrong_bytes += d;
  logf_(w, "%s-%d: WRONG: position %u: %" PRIu64 " of %u bytes differ from conversation %016" PRIx64
           " (written %" PRIu64 ", phase %u)\n", w->prefix, k, pos, d, SW_TOKEN_BYTES, expect ? expect->seed : 0,
        expect ? expect->written : 0, I->phase);
  return false;
}

/* Reads back every token the daemon serves for id k and judges it against
 * the candidates.  *ret_clean: every token verified. */
static int check(sw *w, int k, const ckv_soak_conv *cands, int nc, bool *ret_clean) {
  const ckv_view *v;
  int r = ckv_session_view(w->h[k], &v);
  if (r < 0) return r;
  bool clean = true;
  size_t other = v->n_staged + v->n_committed + v->n_cold;
  for (size_t b = 0; b < v->n_draft; b++) {
    const uint8_t *base = v->draft[b].data;
    const ckv_block_header *hd = (const ckv_block_header *)base;
    if (hd->magic != CKV_BLOCK_MAGIC || hd->format != CKV_FORMAT_DRAFT) {
      other++;
      continue;
    }
    const uint32_t *pos = (const uint32_t *)(base + ckv_block_positions_offset());
    const uint64_t *bits = (const uint64_t *)(base + ckv_block_bitmap_offset(hd->capacity));
    for (uint32_t sl = 0; sl < hd->capacity; sl++)
      if ((bits[sl / 64] >> (sl % 64)) & 1u) clean &= judge(w, k, base, hd->capacity, sl, pos[sl], cands, nc);
  }
  if (other) {
    w->st.c.nondraft_blocks += other;
    logf_(w, "%s-%d: %zu blocks not in the FP16 draft format: not verified\n", w->prefix, k, other);
    clean = false;
  }
  *ret_clean = clean;
  return CKV_OK;
}

/* Drops id k's session (the handle is freed whatever the answer). */
static int drop_id(sw *w, int k) {
  ckv_soak_id *I = &w->st.ids[k];
  if (I->phase == CKV_SOAK_OPENING) { /* the session served held tokens: the old conversation */
    I->cur = I->old;
    I->old = (ckv_soak_conv){0};
  }
  if (I->phase != CKV_SOAK_ENDED && I->phase != CKV_SOAK_NONE) I->phase = CKV_SOAK_DROPPING;
  save(w);
  int r = ckv_session_drop(w->h[k]);
  w->h[k] = NULL;
  if (r < 0) return r;
  w->st.c.drops++;
  if (I->phase == CKV_SOAK_DROPPING) {
    push_ended(I, I->cur.seed);
    I->cur = (ckv_soak_conv){0};
    I->phase = CKV_SOAK_ENDED;
  }
  save(w);
  return CKV_OK;
}

/* Opens id k as a new conversation (phase OPENING, cur its seed). */
static int open_new(sw *w, int k) {
  ckv_soak_id *I = &w->st.ids[k];
  char id[96];
  id_name(w, k, id, sizeof id);
  int r = ckv_session_open(w->c, id, &w->g, &(ckv_session_options){.policy = "fp16"}, &w->h[k]);
  if (r < 0) {
    w->h[k] = NULL;
    return r;
  }
  push_ended(I, I->old.seed); /* replaced: it must never be served again */
  I->old = (ckv_soak_conv){0};
  I->cur.written = I->cur.appended = 0;
  I->phase = CKV_SOAK_LIVE;
  I->life = daemon_life(w);
  if (I->incarnations++) w->st.c.ids_reused++;
  save(w);
  return CKV_OK;
}

/* An id without a handle: resume it, judge what is served, and go on with it,
 * drop it, or open a new conversation. */
static int resume_id(sw *w, int k) {
  ckv_soak_id *I = &w->st.ids[k];
  ckv_soak_counters *C = &w->st.c;
  char id[96];
  id_name(w, k, id, sizeof id);
  int r = ckv_session_open(w->c, id, NULL, &(ckv_session_options){.resume = true}, &w->h[k]);
  if (r == CKV_ERR_NOT_FOUND) {
    w->h[k] = NULL;
    C->resumes_not_found++;
    if (I->phase == CKV_SOAK_LIVE || I->phase == CKV_SOAK_DROPPING) {
      C->tokens_lost += I->cur.written;
      I->old = I->cur; /* may still come back (a store that was away): not ended until replaced */
    }
    if (I->phase != CKV_SOAK_OPENING) {
      if (I->phase != CKV_SOAK_LIVE && I->phase != CKV_SOAK_DROPPING) I->old = (ckv_soak_conv){0};
      I->cur = (ckv_soak_conv){.seed = new_seed(w)};
      I->phase = CKV_SOAK_OPENING;
      save(w);
    }
    return open_new(w, k);
  }
  if (r < 0) {
    w->h[k] = NULL;
    return r;
  }
  uint64_t n = ckv_session_tokens(w->h[k]);
  ckv_soak_conv cands[2];
  int nc = 0;
  if (I->phase == CKV_SOAK_LIVE || I->phase == CKV_SOAK_DROPPING) cands[nc++] = I->cur;
  if (I->phase == CKV_SOAK_OPENING) cands[nc++] = I->old, cands[nc++] = I->cur;
  if (I->phase == CKV_SOAK_ENDED || I->phase == CKV_SOAK_NONE) {
    C->ended_served++;
    logf_(w, "%s: ENDED SERVED: a resume of an id %s answered 0 with %" PRIu64 " tokens\n", id,
          I->phase == CKV_SOAK_ENDED ? "that was dropped" : "never opened", n);
  }
  bool clean;
  if ((r = check(w, k, cands, nc, &clean)) < 0) return r;
  if (clean && I->phase == CKV_SOAK_LIVE && n <= I->cur.written) {
    C->resumes_ok++;
    uint64_t life = daemon_life(w);
    if (n && life != I->life) C->resumes_after_restart++;
    C->tokens_lost += I->cur.written - n;
    I->cur.written = I->cur.appended = n;
    I->life = life;
    save(w);
    return CKV_OK;
  }
  if (clean && I->phase == CKV_SOAK_OPENING && n == 0) { /* the new (empty) conversation */
    C->resumes_ok++;
    push_ended(I, I->old.seed);
    I->old = (ckv_soak_conv){0};
    I->phase = CKV_SOAK_LIVE;
    if (I->incarnations++) C->ids_reused++;
    save(w);
    return CKV_OK;
  }
  return drop_id(w, k); /* ended, being dropped, or holding bytes nobody can vouch for */
}

/* A detached id replaced without a look at it: OpenSession without resume,
 * which must fence every copy of the conversation it replaces (issue 40 N1,
 * N2).  EXISTS while the daemon still holds it live: the next step resumes. */
static int replace_id(sw *w, int k) {
  ckv_soak_id *I = &w->st.ids[k];
  I->old = I->cur;
  I->cur = (ckv_soak_conv){.seed = new_seed(w)};
  I->phase = CKV_SOAK_OPENING;
  save(w);
  int r = open_new(w, k);
  if (r == CKV_OK) w->st.c.replaces++;
  return r;
}

/* One round of id k (it has a handle), then maybe a drop or a detach. */
static int round_id(sw *w, int k) {
  ckv_soak_id *I = &w->st.ids[k];
  ckv_session *s = w->h[k];
  I->cur.appended = I->cur.written + SW_ROUND_TOKENS;
  save(w);
  uint64_t first;
  int r = ckv_session_append(s, SW_ROUND_TOKENS, NULL, NULL, NULL, NULL, &first);
  if (r < 0) return r;
  if (first != I->cur.written) {
    logf_(w, "%s-%d: the daemon appended at %" PRIu64 ", the conversation has %" PRIu64 " tokens\n", w->prefix, k,
          first, I->cur.written);
    w->st.c.errors++;
    return drop_id(w, k);
  }
  for (uint64_t p = first; p < first + SW_ROUND_TOKENS; p++)
    for (uint32_t l = 0; l < SW_LAYERS; l++) {
      for (uint32_t e = 0; e < SW_ELEMS; e++) {
        w->k[e] = sw_pattern(I->cur.seed, p, l, 0, e);
        w->v[e] = sw_pattern(I->cur.seed, p, l, 1, e);
      }
      if ((r = ckv_session_write_kv(s, p, l, w->k, w->v)) < 0) return r;
    }
  uint64_t n = first + SW_ROUND_TOKENS;
  I->cur.written = n;
  I->life = daemon_life(w);
  I->round++;
  save(w);
  for (uint64_t p = 0; p < n; p++) w->attn[p] = 1.0f / (float)n;
  ckv_round_result rr;
  if ((r = ckv_session_report(s, I->round, 0, w->attn, n, &rr)) < 0) return r;
  if ((r = ckv_session_ack(s, rr.epoch, NULL)) < 0) return r;
  w->st.c.rounds++;
  bool clean;
  if ((r = check(w, k, &I->cur, 1, &clean)) < 0) return r;
  uint64_t dice = next_rand(w) % 8;
  if (!clean || n >= SW_MAX_TOKENS || dice == 0) return drop_id(w, k);
  if (dice == 1) {
    w->h[k] = NULL;
    w->st.c.closes++;
    w->not_before[k] = reconnect_now_ms() + SW_DETACH_MIN_MS + (long long)(next_rand(w) % 2500);
    save(w);
    r = ckv_session_close(s);
    return r == CKV_ERR_NOT_FOUND ? CKV_OK : r;
  }
  save(w);
  return CKV_OK;
}

/* The daemon went away: re-attach; every handle is of the old daemon. */
static int recover(sw *w) {
  w->st.c.daemon_gone++;
  for (int k = 0; k < w->n_ids; k++)
    if (w->h[k]) {
      ckv_session_close(w->h[k]);
      w->h[k] = NULL;
    }
  save(w);
  int r = reconnect_client(w->c, reconnect_now_ms() + SW_RECONNECT_MS);
  if (r < 0)
    fprintf(stderr, "commitkv-worker: connect: %s: the daemon did not come back within %d ms: %s\n", ckv_strerror(r),
            SW_RECONNECT_MS, ckv_client_last_error(w->c));
  return r;
}

static int step(sw *w) {
  long long now = reconnect_now_ms();
  int start = (int)(next_rand(w) % (uint64_t)w->n_ids), k = -1;
  for (int j = 0; j < w->n_ids && k < 0; j++)
    if (w->not_before[(start + j) % w->n_ids] <= now) k = (start + j) % w->n_ids;
  if (k < 0) {
    usleep(20000);
    return CKV_OK;
  }
  bool held = w->h[k] != NULL;
  bool replace = !held && w->st.ids[k].phase == CKV_SOAK_LIVE && next_rand(w) % 4 == 0;
  int r = held ? round_id(w, k) : replace ? replace_id(w, k) : resume_id(w, k);
  if (r == CKV_OK) return CKV_OK;
  if (reconnect_daemon_gone(w->c, w->h[k], r)) return recover(w); /* a dropped or closed handle is NULL */
  /* A session still attached to a killed worker, a store that is away: later. */
  if (r == CKV_ERR_BUSY || r == CKV_ERR_EXISTS || r == -EIO || r == -ETIMEDOUT || r == -ECONNREFUSED) {
    w->st.c.retries++;
  } else {
    w->st.c.errors++;
    logf_(w, "%s-%d: %s: %s: %s\n", w->prefix, k, held ? "round" : "resume", ckv_strerror(r),
          ckv_client_last_error(w->c));
  }
  if (w->h[k]) {
    ckv_session_close(w->h[k]);
    w->h[k] = NULL;
  }
  w->not_before[k] = reconnect_now_ms() + SW_RETRY_MS;
  save(w);
  return CKV_OK;
}

int ckv_bench_soak_worker(int argc, char **argv) {
  static sw w;
  const char *log = NULL;
  uint64_t seed = 1;
  w.n_ids = 4, w.steps = 200, w.log_fd = -1;
  static const struct option lo[] = {
      {"socket", required_argument, 0, 's'}, {"attach-socket", required_argument, 0, 'a'},
      {"state", required_argument, 0, 'f'},  {"log", required_argument, 0, 'l'},
      {"life", required_argument, 0, 'L'},   {"ids", required_argument, 0, 'n'},
      {"steps", required_argument, 0, 'S'},  {"seed", required_argument, 0, 'x'},
      {0, 0, 0, 0}};
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 's': w.socket = optarg; break;
      case 'a': w.attach = optarg; break;
      case 'f': w.state_path = optarg; break;
      case 'l': log = optarg; break;
      case 'L': w.life_path = optarg; break;
      case 'n': w.n_ids = atoi(optarg); break;
      case 'S': w.steps = atoi(optarg); break;
      case 'x': seed = strtoull(optarg, NULL, 0); break;
      default:
        fprintf(stderr, "commitkv-bench soak-worker: see the comment at the top of bench/soak_worker.c\n");
        return 2;
    }
  }
  if (!w.state_path || w.n_ids < 1 || w.n_ids > CKV_SOAK_MAX_IDS || w.steps < 1) {
    fprintf(stderr, "commitkv-bench soak-worker: --state FILE, --ids 1..%d, --steps >= 1\n", CKV_SOAK_MAX_IDS);
    return 2;
  }
  const char *base = strrchr(w.state_path, '/');
  snprintf(w.prefix, sizeof w.prefix, "%.40s", base ? base + 1 : w.state_path);
  char *dot = strchr(w.prefix, '.');
  if (dot) *dot = 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  w.rng = mix(seed ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec);
  w.fd = open(w.state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (w.fd < 0) {
    fprintf(stderr, "commitkv-bench soak-worker: %s: %s\n", w.state_path, strerror(errno));
    return 1;
  }
  if (pread(w.fd, &w.st, sizeof w.st, 0) != (ssize_t)sizeof w.st || w.st.magic != CKV_SOAK_MAGIC) {
    memset(&w.st, 0, sizeof w.st);
    w.st.magic = CKV_SOAK_MAGIC;
    save(&w);
  }
  if (log) w.log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  w.g = (ckv_geometry){SW_LAYERS, SW_HEADS, SW_DIM, CKV_DTYPE_FP16};
  ckv_client_options co = {.socket = w.socket, .attach_socket = w.attach, .name = w.prefix, .heartbeat = true};
  int r = reconnect_first_connect(&co, &w.c, reconnect_now_ms() + SW_RECONNECT_MS);
  if (r < 0) {
    fprintf(stderr, "commitkv-worker: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
    return 1;
  }
  if (strcmp(ckv_client_memory_kind(w.c), "host") != 0) {
    fprintf(stderr, "commitkv-worker: connect: %s: the daemon's KV memory is not host memory\n",
            ckv_strerror(CKV_ERR_UNSUPPORTED));
    ckv_client_free(w.c);
    return 1;
  }
  for (int i = 0; i < w.steps && r == CKV_OK; i++) r = step(&w);
  for (int k = 0; k < w.n_ids; k++)
    if (w.h[k]) ckv_session_close(w.h[k]);
  ckv_client_free(w.c);
  save(&w);
  printf("%s: %s: %d steps, %" PRIu64 " bytes verified, %" PRIu64 " wrong, %" PRIu64 " stale\n", w.prefix,
         r == CKV_OK ? "OK" : "FAILED", w.steps, w.st.c.bytes_verified, w.st.c.wrong_bytes, w.st.c.stale_served);
  if (w.log_fd >= 0) close(w.log_fd);
  close(w.fd);
  return r == CKV_OK ? 0 : 1;
}
