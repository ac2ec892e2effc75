/* bench_tiers.c - `commitkv-bench tiers`: what moving a session out of memory
 * and back costs, per tier, against plain I/O of the same bytes to the same
 * place in the same run, and what resuming a session costs against
 * recomputing its prefill (issue 15, "What to measure").
 *
 * One session of --tokens tokens (32K by default; geometry 4 layers x 8 KV
 * heads x 128 dims FP16 as in `epoch`), every token's K/V written through
 * ckv_session_kv_ptr as a worker does, in a real commitkvd whose state
 * directory lies in the bench's temporary directory.
 *
 *  - disk: offload = a SaveSession of the session, timed by the client (the
 *    loop's copy, the I/O thread's encode, temp file, fsync, rename,
 *    directory fsync); restore = a RestoreSession of it after a drop (read,
 *    validate, rebuild in the arena).  GB/s of the snapshot file's bytes.
 *    Baseline: the same number of bytes written with write() + fsync() into a
 *    file in the same directory, and read back with read().
 *  - remote: a second daemon with `remote` pointing at a real redis-server on
 *    a free loopback port (proto-max-bulk-len raised to 4gb: Redis's default
 *    512mb caps a value, and a 32K-token session of the default geometry
 *    snapshots to 538 MB, which the store then refuses).  Offload = a SaveSession (local file as above,
 *    then the push to the store); restore = a RestoreSession after the drop
 *    and after removing the local file (so the store's copy is read).
 *    Baseline: the plain file write + fsync above plus a SET (and APPENDs of
 *    64 MiB pieces) of the same bytes through hiredis in this process; the
 *    restore baseline a GET of them.
 *  - resume from disk: the restored session is closed and left idle until
 *    the disk tier (disk_idle 1 s) moves it to state_dir/tier; OpenSession
 *    with resume then brings it back (timed).  Resume from remote: the
 *    remote daemon's session dropped, the local file removed, OpenSession
 *    with resume (timed).
 *  - prefill_ms_estimate: the project's C forward pass (examples/llm/model.c)
 *    on the model at $CKV_MODEL / $CKV_MODEL_DIR is timed over a few hundred
 *    tokens; its FLOP rate (FLOPs counted for its own geometry) then prices
 *    the prefill of --tokens tokens for a Llama with the session's KV
 *    geometry: dim = 4 x n_kv_heads x head_dim (4 query heads per KV head),
 *    FFN 8/3 dim rounded up to 256, the session's layers, vocab 32000, causal
 *    attention.  prefill_ms_at_stated_rate prices the same FLOPs at --flops
 *    (default 4e14 FLOP/s, about 40% of an H200's dense BF16 peak), the
 *    comparison that matters on a GPU node.  Without a model file, only the
 *    stated rate is used (said in the output).
 *
 * The page cache may serve the reads of ours and of the baseline alike (both
 * files were just written): the same conditions for both.  Nothing here
 * asserts speed.  A table for people; --json prints one object. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <hiredis.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "client/rpc.h"
#include "commitkv/commitkv.h"
#include "examples/llm/model.h"

#define SESSION_ID "bench-tiers"
#define PLAIN_CHUNK (4u << 20)
#define REDIS_PIECE (64u << 20)
#define TIER_WAIT_MS 30000

typedef struct tier_fig {
  bool done;
  uint64_t bytes;
  double offload_us, restore_us;          /* ours */
  double plain_write_us, plain_read_us;   /* the baseline (remote: file + SET; GET) */
} tier_fig;

typedef struct resume_fig {
  bool done;
  double us;
} resume_fig;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double gbps(uint64_t bytes, double us) { return us > 0 ? (double)bytes / us / 1e3 : 0.0; }

static void usage(void) {
  fprintf(stderr, "usage: commitkv-bench tiers [--tokens N] [--layers N] [--kv-heads N] [--head-dim N]\n"
                  "       [--flops F] [--prefill-tokens N] [--redis-server PATH] [--daemon PATH] [--json]\n");
}

/* ---- the session ---------------------------------------------------------- */

/* Opens SESSION_ID with `tokens` tokens and writes every token's K/V (FP16
 * +-1.0 by position, as `epoch` does). */
static int fill_session(ckv_client *c, const ckv_geometry *g, unsigned tokens, ckv_session **ret) {
  ckv_session *s = NULL;
  int r = ckv_session_open(c, SESSION_ID, g, NULL, &s);
  size_t row = (size_t)g->n_kv_heads * g->head_dim;
  for (unsigned done = 0; r == 0 && done < tokens;) {
    uint32_t n = tokens - done < 4096 ? tokens - done : 4096;
    uint64_t first = 0;
    r = ckv_session_append(s, n, NULL, NULL, NULL, NULL, &first);
    for (uint32_t i = 0; r == 0 && i < n; i++)
      for (uint32_t l = 0; r == 0 && l < g->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
          uint16_t *p = ckv_session_kv_ptr(s, first + i, l, kv);
          if (!p) {
            r = CKV_ERR_RANGE;
            break;
          }
          for (size_t e = 0; e < row; e++) p[e] = (i + e + (unsigned)kv) % 2 ? 0x3c00 : 0xbc00;
        }
    done += n;
  }
  if (r < 0) {
    fprintf(stderr, "commitkv-bench tiers: session of %u tokens: %s: %s\n", tokens, ckv_strerror(r),
            ckv_client_last_error(c));
    if (s) ckv_session_drop(s);
    return r;
  }
  *ret = s;
  return 0;
}

/* Stats: the sessions on the disk tier now and the remote store's loads (either may be NULL). */
static int tier_stats(ckv_client *c, uint64_t *ret_disk_sessions, uint64_t *ret_remote_loads) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  if (r < 0) return r;
  if (ret_disk_sessions) {
    *ret_disk_sessions = 0;
    for (size_t i = 0; rep->stats && i < rep->stats->n_tiers; i++)
      if (strcmp(rep->stats->tiers[i]->tier, "disk") == 0) *ret_disk_sessions = rep->stats->tiers[i]->sessions;
  }
  if (ret_remote_loads) *ret_remote_loads = rep->stats && rep->stats->remote ? rep->stats->remote->loads : 0;
  ckv_rpc_free(rep);
  return 0;
}

/* ---- the plain-I/O baseline ----------------------------------------------- */

/* write() + fsync() of `bytes` from buf into path, then read() back; times in us. */
static int plain_file_io(const char *path, const uint8_t *buf, uint64_t bytes, double *ret_write_us,
                         double *ret_read_us) {
  double t0 = now_us();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  for (uint64_t off = 0; off < bytes;) {
    size_t n = bytes - off < PLAIN_CHUNK ? (size_t)(bytes - off) : PLAIN_CHUNK;
    ssize_t w = write(fd, buf + off, n);
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      return -e;
    }
    off += (uint64_t)w;
  }
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  close(fd);
  *ret_write_us = now_us() - t0;
  uint8_t *in = malloc(PLAIN_CHUNK);
  if (!in) return -ENOMEM;
  t0 = now_us();
  fd = open(path, O_RDONLY | O_CLOEXEC);
  uint64_t got = 0;
  for (ssize_t n; fd >= 0 && (n = read(fd, in, PLAIN_CHUNK)) > 0;) got += (uint64_t)n;
  if (fd >= 0) close(fd);
  *ret_read_us = now_us() - t0;
  free(in);
  unlink(path);
  return got == bytes ? 0 : -EIO;
}

/* ---- redis-server -------------------------------------------------------- */

typedef struct redis_proc {
  pid_t pid;
  int port;
} redis_proc;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static int redis_start(redis_proc *rp, const char *server, const char *dir) {
  rp->port = free_port();
  if (rp->port <= 0) return -EADDRNOTAVAIL;
  char port[16], log[PATH_MAX];
  snprintf(port, sizeof port, "%d", rp->port);
  snprintf(log, sizeof log, "%.200s/redis.log", dir);
  pid_t parent = getpid();
  rp->pid = fork();
  if (rp->pid < 0) return -errno;
  if (rp->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (chdir(dir) != 0) _exit(127);
    execl(server, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
          "--proto-max-bulk-len", "4gb", "--daemonize", "no", (char *)NULL);
    _exit(127);
  }
  double end = now_us() + 10e6;
  while (now_us() < end) {
    redisContext *c = redisConnectWithTimeout("127.0.0.1", rp->port, (struct timeval){0, 200000});
    bool ok = false;
    if (c && !c->err) {
      redisReply *r = redisCommand(c, "PING");
      ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    if (ok) return 0;
    if (waitpid(rp->pid, NULL, WNOHANG) == rp->pid) {
      rp->pid = 0;
      fprintf(stderr, "commitkv-bench tiers: redis-server exited at start (log %s)\n", log);
      return -ECHILD;
    }
    usleep(20000);
  }
  fprintf(stderr, "commitkv-bench tiers: redis-server never answered on port %d\n", rp->port);
  return -ETIMEDOUT;
}

static void redis_stop(redis_proc *rp) {
  if (rp->pid <= 0) return;
  kill(rp->pid, SIGTERM);
  waitpid(rp->pid, NULL, 0);
  rp->pid = 0;
}

/* SET (first 64 MiB piece) + APPEND (the rest) of buf, then GET; times in us. */
static int plain_redis_io(int port, const uint8_t *buf, uint64_t bytes, double *ret_set_us, double *ret_get_us) {
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, (struct timeval){10, 0});
  if (!c || c->err) {
    if (c) redisFree(c);
    return -ECONNREFUSED;
  }
  int rc = 0;
  double t0 = now_us();
  for (uint64_t off = 0; rc == 0 && (off < bytes || off == 0);) {
    size_t n = bytes - off < REDIS_PIECE ? (size_t)(bytes - off) : REDIS_PIECE;
    redisReply *r = redisCommand(c, off ? "APPEND %s %b" : "SET %s %b", "bench-tiers-plain", buf + off, n);
    if (!r || r->type == REDIS_REPLY_ERROR) rc = -EIO;
    if (r) freeReplyObject(r);
    off += n;
    if (!n) break;
  }
  *ret_set_us = now_us() - t0;
  if (rc == 0) {
    t0 = now_us();
    redisReply *r = redisCommand(c, "GET %s", "bench-tiers-plain");
    *ret_get_us = now_us() - t0;
    if (!r || r->type != REDIS_REPLY_STRING || (uint64_t)r->len != bytes) rc = -EIO;
    if (r) freeReplyObject(r);
    r = redisCommand(c, "DEL %s", "bench-tiers-plain");
    if (r) freeReplyObject(r);
  }
  redisFree(c);
  return rc;
}

/* ---- prefill ------------------------------------------------------------- */

typedef struct prefill_model {
  bool measured;        /* a real model was timed */
  char path[PATH_MAX];
  int tokens;           /* tokens timed */
  double tokens_per_s, flops_per_s;
  /* the model assumed for the session's geometry */
  uint64_t dim, hidden, n_heads, n_layers, kv_dim, vocab;
  double flops;         /* of a prefill of the session's tokens */
} prefill_model;

/* FLOPs of one token's forward pass at position pos (multiply-add = 2):
 * the projections, the FFN (three matrices) and causal attention over pos+1
 * keys; logits only when `logits`. */
static double token_flops(double dim, double hidden, double kv_dim, double layers, double vocab, double pos,
                          bool logits) {
  double per_layer = 2.0 * (dim * dim * 2.0 + dim * kv_dim * 2.0 + 3.0 * dim * hidden) + 4.0 * dim * (pos + 1.0);
  return layers * per_layer + (logits ? 2.0 * dim * vocab : 0.0);
}

/* Times ckv_model_forward over up to `want` tokens of the model at
 * $CKV_MODEL / $CKV_MODEL_DIR; false (and why, on stderr) without one. */
static bool measure_model(prefill_model *pm, int want) {
  if (ckv_model_path_from_env(pm->path, sizeof pm->path) != 0) {
    fprintf(stderr, "commitkv-bench tiers: no CKV_MODEL / CKV_MODEL_DIR: prefill priced at --flops only\n");
    return false;
  }
  ckv_model *m = NULL;
  ckv_model_state *st = NULL;
  int r = ckv_model_load(pm->path, &m);
  if (r == 0) r = ckv_model_state_new(m, true, &st);
  if (r < 0) {
    fprintf(stderr, "commitkv-bench tiers: model %s: %s: prefill priced at --flops only\n", pm->path, ckv_strerror(r));
    ckv_model_free(m);
    return false;
  }
  const ckv_model_config *mc = ckv_model_config_get(m);
  float *logits = malloc((size_t)mc->vocab_size * sizeof(float));
  int n = want < mc->seq_len ? want : mc->seq_len;
  double flops = 0;
  for (int p = 0; p < n; p++)
    flops += token_flops(mc->dim, mc->hidden_dim, mc->kv_dim, mc->n_layers, mc->vocab_size, p, true);
  /* Best of three passes: a preemption on a shared machine does not count. */
  double best = 0;
  for (int rep = 0; logits && rep < 3; rep++) {
    ckv_model_state_reset(st);
    double t0 = now_us();
    for (int p = 0; p < n && r == 0; p++) r = ckv_model_forward(m, st, (p * 7 + 1) % mc->vocab_size, p, logits);
    double us = now_us() - t0;
    if (rep == 0 || us < best) best = us;
  }
  free(logits);
  ckv_model_state_free(st);
  ckv_model_free(m);
  if (r < 0 || best <= 0) return false;
  pm->tokens = n;
  pm->tokens_per_s = n / (best / 1e6);
  pm->flops_per_s = flops / (best / 1e6);
  return true;
}

static void assume_model(prefill_model *pm, const ckv_geometry *g, unsigned tokens) {
  pm->kv_dim = (uint64_t)g->n_kv_heads * g->head_dim;
  pm->dim = 4 * pm->kv_dim;
  pm->n_heads = 4 * (uint64_t)g->n_kv_heads;
  pm->hidden = ((pm->dim * 8 / 3) + 255) / 256 * 256;
  pm->n_layers = g->n_layers;
  pm->vocab = 32000;
  /* Sum over positions in closed form: the attention term is linear in pos. */
  double t = tokens;
  double base = token_flops((double)pm->dim, (double)pm->hidden, (double)pm->kv_dim, (double)pm->n_layers, 0, -1.0,
                            false);
  pm->flops = base * t + (double)pm->n_layers * 4.0 * (double)pm->dim * t * (t + 1.0) / 2.0 +
              2.0 * (double)pm->dim * (double)pm->vocab; /* logits of the last token only */
}

/* ---- the runs ------------------------------------------------------------ */

static int connect_to(ckv_bench_daemon *d, ckv_client **ret) {
  ckv_client_options co = {.socket = d->socket, .attach_socket = d->attach, .name = "bench-tiers",
                           .timeout_ms = 120000};
  int r = ckv_client_connect(&co, ret);
  if (r < 0) fprintf(stderr, "commitkv-bench tiers: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
  return r;
}

static void snapshot_path(char *buf, size_t len, const char *dir, ckv_client *c, const char *name) {
  snprintf(buf, len, "%.200s/state/snapshots/%.63s/%.128s.ckvsnap", dir, ckv_client_tenant(c), name);
}

/* OpenSession with resume of SESSION_ID, timed into rf (done when it holds
 * `tokens`); *ret the session, or NULL.  -1 after saying why on stderr. */
static int timed_resume(ckv_client *c, unsigned tokens, const char *from, resume_fig *rf, ckv_session **ret) {
  ckv_session_options so = {.resume = true};
  double t0 = now_us();
  int r = ckv_session_open(c, SESSION_ID, NULL, &so, ret);
  rf->us = now_us() - t0;
  if (r < 0) {
    fprintf(stderr, "commitkv-bench tiers: resume from %s: %s: %s\n", from, ckv_strerror(r), ckv_client_last_error(c));
    *ret = NULL;
    return -1;
  }
  if (ckv_session_tokens(*ret) != tokens) {
    fprintf(stderr, "commitkv-bench tiers: resumed %llu tokens from %s, not %u\n",
            (unsigned long long)ckv_session_tokens(*ret), from, tokens);
    return -1;
  }
  rf->done = true;
  return 0;
}

#define FAIL(...)                                        \
  do {                                                   \
    fprintf(stderr, "commitkv-bench tiers: " __VA_ARGS__); \
    rc = 1;                                              \
    goto out;                                            \
  } while (0)

/* The disk tier: save / restore against plain file I/O; then the restored
 * session left idle until the tier takes it, and resumed. */
static int run_disk(const char *daemon_path, const char *dir, const char *memory, const ckv_geometry *g,
                    unsigned tokens, tier_fig *tf, resume_fig *rf) {
  ckv_bench_daemon d = {.sets = {"daemon.disk_idle=1s", "daemon.disk_memory=64G"}};
  ckv_client *c = NULL;
  ckv_session *s = NULL;
  uint8_t *buf = NULL;
  int rc = 0, r;
  if (ckv_bench_daemon_start(&d, daemon_path, dir, memory) < 0 || connect_to(&d, &c) < 0) FAIL("disk daemon\n");
  if (fill_session(c, g, tokens, &s) < 0) FAIL("disk: no session\n");
  double t0 = now_us();
  r = ckv_session_save(s, SESSION_ID, false, &tf->bytes);
  tf->offload_us = now_us() - t0;
  if (r < 0) FAIL("save: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
  r = ckv_session_drop(s);
  s = NULL; /* freed whatever the answer (commitkv.h) */
  if (r < 0) FAIL("drop: %s\n", ckv_strerror(r));
  t0 = now_us();
  r = ckv_session_restore(c, SESSION_ID, SESSION_ID, NULL, &s);
  tf->restore_us = now_us() - t0;
  if (r < 0) FAIL("restore: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
  /* The baseline: the same bytes, same directory (the state directory's
   * filesystem), same run. */
  buf = malloc(tf->bytes ? tf->bytes : 1);
  if (!buf) FAIL("no memory for %llu bytes\n", (unsigned long long)tf->bytes);
  for (uint64_t i = 0; i < tf->bytes; i++) buf[i] = (uint8_t)(i * 131u >> 3);
  char plain[PATH_MAX];
  snprintf(plain, sizeof plain, "%.200s/state/plain-io.bin", dir);
  if ((r = plain_file_io(plain, buf, tf->bytes, &tf->plain_write_us, &tf->plain_read_us)) < 0)
    FAIL("plain I/O on %s: %s\n", plain, strerror(-r));
  tf->done = true;
  /* Resume from the disk tier: close, wait until the idle session is on
   * disk (the tier may have taken it during the baseline already: an
   * attached session that stays quiet counts as idle), resume. */
  uint64_t on_disk = 0;
  r = ckv_session_close(s);
  s = NULL; /* freed whatever the answer (commitkv.h) */
  if (r < 0) FAIL("close: %s\n", ckv_strerror(r));
  for (double end = now_us() + TIER_WAIT_MS * 1e3; on_disk < 1; usleep(20000)) {
    if (tier_stats(c, &on_disk, NULL) < 0) FAIL("stats\n");
    if (now_us() > end) FAIL("the disk tier did not take the idle session within %d ms\n", TIER_WAIT_MS);
  }
  if (timed_resume(c, tokens, "the disk tier", rf, &s) < 0) FAIL("resume from the disk tier failed\n");
out:
  free(buf);
  if (s) ckv_session_drop(s);
  ckv_client_free(c);
  if (rc) ckv_bench_daemon_log_tail(&d);
  if (d.pid > 0 && ckv_bench_daemon_stop(&d) != 0) rc = 1;
  return rc;
}

/* The remote store: save (local file + push) / restore from the store
 * against plain file I/O + SET / GET; then a resume from the store. */
static int run_remote(const char *daemon_path, const char *redis_server, const char *dir, const char *memory,
                      const ckv_geometry *g, unsigned tokens, tier_fig *tf, resume_fig *rf) {
  redis_proc rp = {0};
  char url[128], remote_set[160];
  ckv_bench_daemon d = {0};
  ckv_client *c = NULL;
  ckv_session *s = NULL;
  uint8_t *buf = NULL;
  int rc = 0, r;
  if (redis_start(&rp, redis_server, dir) < 0) FAIL("no redis-server\n");
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", rp.port);
  snprintf(remote_set, sizeof remote_set, "daemon.remote=%s", url);
  d.sets[0] = remote_set;
  d.sets[1] = "daemon.remote_timeout=60s"; /* a 256 MiB value on a loaded machine */
  d.sets[2] = "daemon.remote_allow_no_auth=yes"; /* the bench's store is a private one on loopback */
  if (ckv_bench_daemon_start(&d, daemon_path, dir, memory) < 0 || connect_to(&d, &c) < 0) FAIL("remote daemon\n");
  if (fill_session(c, g, tokens, &s) < 0) FAIL("remote: no session\n");
  double t0 = now_us();
  r = ckv_session_save(s, SESSION_ID, false, &tf->bytes);
  tf->offload_us = now_us() - t0;
  if (r < 0) FAIL("save with remote: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
  r = ckv_session_drop(s);
  s = NULL; /* freed whatever the answer (commitkv.h) */
  if (r < 0) FAIL("drop: %s\n", ckv_strerror(r));
  char snap[PATH_MAX];
  snapshot_path(snap, sizeof snap, dir, c, SESSION_ID);
  if (unlink(snap) != 0) FAIL("cannot remove the local snapshot %s: %s\n", snap, strerror(errno));
  uint64_t loads0 = 0, loads = 0;
  if (tier_stats(c, NULL, &loads0) < 0) FAIL("stats\n");
  t0 = now_us();
  r = ckv_session_restore(c, SESSION_ID, SESSION_ID, NULL, &s);
  tf->restore_us = now_us() - t0;
  if (r < 0) FAIL("restore from the store: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
  if (tier_stats(c, NULL, &loads) < 0 || loads != loads0 + 1) FAIL("the restore did not read the store\n");
  /* The baseline: the same bytes to the same places (the state directory,
   * then the same redis-server), same run. */
  buf = malloc(tf->bytes ? tf->bytes : 1);
  if (!buf) FAIL("no memory for %llu bytes\n", (unsigned long long)tf->bytes);
  for (uint64_t i = 0; i < tf->bytes; i++) buf[i] = (uint8_t)(i * 131u >> 3);
  char plain[PATH_MAX];
  snprintf(plain, sizeof plain, "%.200s/state/plain-io.bin", dir);
  double file_w = 0, file_r = 0, set_us = 0, get_us = 0;
  if ((r = plain_file_io(plain, buf, tf->bytes, &file_w, &file_r)) < 0) FAIL("plain I/O: %s\n", strerror(-r));
  if ((r = plain_redis_io(rp.port, buf, tf->bytes, &set_us, &get_us)) < 0) FAIL("plain SET/GET: %s\n", strerror(-r));
  tf->plain_write_us = file_w + set_us;
  tf->plain_read_us = get_us;
  tf->done = true;
  /* Resume from the store: drop, the local file gone (a restore from the
   * store does not write one), OpenSession with resume. */
  r = ckv_session_drop(s);
  s = NULL; /* freed whatever the answer (commitkv.h) */
  if (r < 0) FAIL("drop: %s\n", ckv_strerror(r));
  unlink(snap);
  if (timed_resume(c, tokens, "the store", rf, &s) < 0) FAIL("resume from the store failed\n");
out:
  free(buf);
  if (s) ckv_session_drop(s);
  ckv_client_free(c);
  if (rc) ckv_bench_daemon_log_tail(&d);
  if (d.pid > 0 && ckv_bench_daemon_stop(&d) != 0) rc = 1;
  redis_stop(&rp);
  return rc;
}

/* ---- output -------------------------------------------------------------- */

static double ratio(double plain_us, double ours_us) { return ours_us > 0 ? plain_us / ours_us : 0.0; }

int ckv_bench_tiers(int argc, char **argv) {
  const char *daemon_arg = NULL, *redis_server = "/usr/bin/redis-server";
  unsigned tokens = 32768;
  int prefill_tokens = 256;
  double stated_flops = 4e14;
  ckv_geometry g = {.n_layers = 4, .n_kv_heads = 8, .head_dim = 128, .dtype = 0};
  bool json = false;
  static const struct option opts[] = {
      {"tokens", required_argument, 0, 't'},        {"layers", required_argument, 0, 'l'},
      {"kv-heads", required_argument, 0, 'k'},      {"head-dim", required_argument, 0, 'd'},
      {"flops", required_argument, 0, 'f'},         {"prefill-tokens", required_argument, 0, 'p'},
      {"redis-server", required_argument, 0, 'R'},  {"daemon", required_argument, 0, 'D'},
      {"json", no_argument, 0, 'j'},                {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  optind = 1;
  for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    switch (o) {
      case 't': tokens = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'l': g.n_layers = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'k': g.n_kv_heads = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'd': g.head_dim = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'f': stated_flops = strtod(optarg, NULL); break;
      case 'p': prefill_tokens = (int)strtol(optarg, NULL, 0); break;
      case 'R': redis_server = optarg; break;
      case 'D': daemon_arg = optarg; break;
      case 'j': json = true; break;
      case 'h': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (!tokens || tokens > (1u << 22) || !(stated_flops > 0) || prefill_tokens < 1 || prefill_tokens > 100000) {
    fprintf(stderr, "commitkv-bench tiers: --tokens 1..4194304, --flops > 0, --prefill-tokens 1..100000\n");
    return 2;
  }
  /* Under $TMPDIR (default /tmp): the state directory and the baseline's file
   * lie on that filesystem. */
  const char *tmp = getenv("TMPDIR");
  char daemon_path[4096], dir[256];
  snprintf(dir, sizeof dir, "%.200s/ckv-bench-tiers-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (ckv_bench_find_daemon(daemon_arg, daemon_path, sizeof(daemon_path)) < 0 || !mkdtemp(dir)) {
    fprintf(stderr, "commitkv-bench tiers: no commitkvd or no temporary directory\n");
    return 1;
  }
  uint64_t fp16 = (uint64_t)tokens * g.n_layers * g.n_kv_heads * g.head_dim * 4u;
  char memory[32];
  snprintf(memory, sizeof(memory), "%lluM", (unsigned long long)(fp16 * 2 / (1u << 20) + 256));
  tier_fig disk = {0}, remote = {0};
  resume_fig rdisk = {0}, rremote = {0};
  const char *remote_skip = NULL;
  int rc = run_disk(daemon_path, dir, memory, &g, tokens, &disk, &rdisk);
  if (rc == 0) {
    if (access(redis_server, X_OK) != 0) {
      remote_skip = "redis-server not found (make deps installs it): the remote tier is NOT measured";
      fprintf(stderr, "commitkv-bench tiers: %s at %s\n", remote_skip, redis_server);
    } else {
      char rdir[PATH_MAX];
      snprintf(rdir, sizeof rdir, "%s/remote", dir);
      if (mkdir(rdir, 0700) != 0) rc = 1;
      else rc = run_remote(daemon_path, redis_server, rdir, memory, &g, tokens, &remote, &rremote);
    }
  }
  ckv_bench_rm_tree(dir);
  if (rc) return rc;
  prefill_model pm = {0};
  pm.measured = measure_model(&pm, prefill_tokens);
  assume_model(&pm, &g, tokens);
  double prefill_ms = pm.measured ? pm.flops / pm.flops_per_s * 1e3 : pm.flops / stated_flops * 1e3;
  double prefill_stated_ms = pm.flops / stated_flops * 1e3;
  const tier_fig *tfs[2] = {&disk, &remote};
  const char *tnames[2] = {"disk", "remote"};
  const char *baselines[2] = {"write()+fsync() of the same bytes to a file in the state directory; read() back",
                              "that file write+fsync plus SET/APPEND (64 MiB pieces) through hiredis to the same "
                              "redis-server; GET back"};
  const resume_fig *rfs[2] = {&rdisk, &rremote};
  char model_text[512];
  snprintf(model_text, sizeof model_text,
           "Llama with the session's KV geometry: dim %llu (4 x %u KV heads x %u), %llu query heads, FFN %llu, %llu "
           "layers, vocab 32000, causal attention: %.3g FLOPs for %u tokens",
           (unsigned long long)pm.dim, g.n_kv_heads, g.head_dim, (unsigned long long)pm.n_heads,
           (unsigned long long)pm.hidden, (unsigned long long)pm.n_layers, pm.flops, tokens);
  const char *cache_note = "the page cache may serve the reads of ours and of the baseline alike (both files were "
                           "just written): the same conditions for both";
  if (json) {
    printf("{\"bench\":\"tiers\",\"tokens\":%u,\"geometry\":[%u,%u,%u],\"kv_fp16_bytes\":%llu,\"note\":\"%s\","
           "\"tiers\":[",
           tokens, g.n_layers, g.n_kv_heads, g.head_dim, (unsigned long long)fp16, cache_note);
    bool first = true;
    for (int i = 0; i < 2; i++) {
      const tier_fig *t = tfs[i];
      if (!t->done) continue;
      printf("%s{\"tier\":\"%s\",\"bytes\":%llu,\"offload_gbps\":%.3f,\"restore_gbps\":%.3f,"
             "\"ratio_to_plain_io\":%.3f,\"offload_ratio_to_plain\":%.3f,\"restore_ratio_to_plain\":%.3f,"
             "\"offload_ms\":%.2f,\"restore_ms\":%.2f,\"plain_write_gbps\":%.3f,\"plain_read_gbps\":%.3f,"
             "\"baseline\":\"%s\"}",
             first ? "" : ",", tnames[i], (unsigned long long)t->bytes, gbps(t->bytes, t->offload_us),
             gbps(t->bytes, t->restore_us), ratio(t->plain_write_us + t->plain_read_us, t->offload_us + t->restore_us),
             ratio(t->plain_write_us, t->offload_us), ratio(t->plain_read_us, t->restore_us), t->offload_us / 1e3,
             t->restore_us / 1e3, gbps(t->bytes, t->plain_write_us), gbps(t->bytes, t->plain_read_us), baselines[i]);
      first = false;
    }
    printf("],\"resume\":[");
    first = true;
    for (int i = 0; i < 2; i++) {
      if (!rfs[i]->done) continue;
      double ms = rfs[i]->us / 1e3;
      printf("%s{\"from\":\"%s\",\"tokens\":%u,\"ms\":%.2f,\"prefill_ms_estimate\":%.1f,"
             "\"prefill_ms_at_stated_rate\":%.1f,\"speedup\":%.1f,\"speedup_at_stated_rate\":%.2f}",
             first ? "" : ",", tnames[i], tokens, ms, prefill_ms, prefill_stated_ms, ms > 0 ? prefill_ms / ms : 0.0,
             ms > 0 ? prefill_stated_ms / ms : 0.0);
      first = false;
    }
    printf("],\"prefill\":{\"measured\":%s,\"model_file\":\"%s\",\"timed_tokens\":%d,\"tokens_per_s\":%.1f,"
           "\"measured_flops_per_s\":%.4g,\"stated_flops_per_s\":%.4g,\"assumed_model\":\"%s\"}",
           pm.measured ? "true" : "false", pm.measured ? pm.path : "", pm.tokens, pm.tokens_per_s, pm.flops_per_s,
           stated_flops, model_text);
    if (remote_skip) printf(",\"remote_skipped\":\"%s\"", remote_skip);
    printf("}\n");
  } else {
    printf("commitkv-bench tiers: %u tokens, geometry %ux%ux%u FP16 (%.1f MB of K/V written)\n", tokens, g.n_layers,
           g.n_kv_heads, g.head_dim, (double)fp16 / 1e6);
    printf("note: %s\n", cache_note);
    printf("%-7s %9s %11s %11s %11s %11s %9s %9s %9s\n", "tier", "MB", "offload ms", "offload GB/s", "restore ms",
           "restore GB/s", "plain W", "plain R", "x plain");
    for (int i = 0; i < 2; i++) {
      const tier_fig *t = tfs[i];
      if (!t->done) {
        printf("%-7s skipped: %s\n", tnames[i], remote_skip ? remote_skip : "not run");
        continue;
      }
      printf("%-7s %9.1f %11.1f %11.2f %11.1f %11.2f %9.2f %9.2f %9.3f\n", tnames[i], (double)t->bytes / 1e6,
             t->offload_us / 1e3, gbps(t->bytes, t->offload_us), t->restore_us / 1e3, gbps(t->bytes, t->restore_us),
             gbps(t->bytes, t->plain_write_us), gbps(t->bytes, t->plain_read_us),
             ratio(t->plain_write_us + t->plain_read_us, t->offload_us + t->restore_us));
    }
    printf("baselines (GB/s): disk: %s; remote: %s\n", baselines[0], baselines[1]);
    if (pm.measured)
      printf("prefill: %s at %d tokens: %.1f tokens/s, %.3g FLOP/s (one CPU thread, FP32) -> %s\n", pm.path, pm.tokens,
             pm.tokens_per_s, pm.flops_per_s, model_text);
    else
      printf("prefill: no model measured; %s\n", model_text);
    printf("%-7s %8s %10s %20s %8s %22s %8s\n", "resume", "tokens", "ms", "prefill ms (measured)", "x faster",
           "prefill ms at stated", "x faster");
    for (int i = 0; i < 2; i++) {
      if (!rfs[i]->done) continue;
      double ms = rfs[i]->us / 1e3;
      printf("%-7s %8u %10.1f %20.0f %8.1f %22.1f %8.2f\n", tnames[i], tokens, ms, prefill_ms,
             ms > 0 ? prefill_ms / ms : 0.0, prefill_stated_ms, ms > 0 ? prefill_stated_ms / ms : 0.0);
    }
    printf("stated rate: %.3g FLOP/s (--flops; default about 40%% of an H200's dense BF16 peak)\n", stated_flops);
  }
  return 0;
}
