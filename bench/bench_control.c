/* bench_control.c - commitkv-bench control: control-plane requests/s and
 * latency of a real commitkvd, against a bare ZeroMQ echo in the same run.
 *
 * The bench starts commitkvd (beside this binary, or --daemon PATH) on the
 * host backend in a temporary directory, forks N worker processes that each
 * connect with libcommitkv, and has them send requests back to back for S
 * seconds per kind: heartbeats (the smallest request there is) and ReportRound
 * for a 4096-token session (16 KiB of attention per request).  Every request
 * is timed with CLOCK_MONOTONIC into a per-worker array; each worker sends its
 * samples to the parent through a pipe, and the parent sums requests/s over
 * the workers and takes p50/p99 over all samples of a kind.  The ceiling is a
 * bare ZeroMQ ROUTER echo (one single-threaded process) over ipc:// driven by
 * the same number of DEALER workers with payloads the size of a packed
 * Heartbeat request, so "ratio_to_echo" reads as the share of the transport's
 * own limit the daemon reaches.  ZeroMQ contexts are only ever created after
 * fork (they are not fork-safe): the parent never touches ZeroMQ.
 *
 * A benchmark never asserts speed: it exits 1 only when something broke (no
 * daemon, a worker that could not connect, a failed request, a daemon that did
 * not exit 0 on SIGTERM).  Figures go to stdout (a table, or one JSON object
 * with --json); progress and diagnostics go to stderr.  The report is built
 * from sections, one function pair each (measure_* and print_*); the judge
 * section of a later issue ("judge": [...]) is one more pair. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/futex.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "bench/bench_judge.h"
#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"

#define DEFAULT_WORKERS 8
#define MAX_WORKERS 1024
#define DEFAULT_SECONDS 2.0
#define REPORT_TOKENS 4096u
#define ECHO_TIMEOUT_MS 5000
#define ECHO_BATCH 512 /* as the daemon's MAX_BATCH */
#define ERR_LEN 240

/* The kinds of request measured; the order is the order of the phases. */
typedef enum kind { KIND_ECHO, KIND_HEARTBEAT, KIND_REPORT_4K, N_KINDS } kind;
static const char *const k_kind_name[N_KINDS] = {"echo", "heartbeat", "report_round_4k"};

typedef struct options {
  int workers;
  double seconds;
  bool json;
  const char *daemon; /* NULL: commitkvd beside this binary */
} options;

typedef struct kind_stats {
  bool measured;
  uint64_t requests, errors;
  double seconds; /* from the phase's start to the last worker's last reply */
  double rps, p50_us, p99_us;
} kind_stats;

typedef struct report {
  int workers;
  long cpus;
  double seconds;
  size_t echo_payload; /* bytes of a packed Heartbeat request */
  double echo_run_rps[2]; /* before and after the daemon's phases */
  size_t n_echo_runs;
  kind_stats kinds[N_KINDS];
} report;

/* ------------------------------------------------------------------------ */
/* Time, samples, percentiles                                                 */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct samples {
  uint64_t *v; /* latency of each successful request, ns */
  size_t n, cap;
} samples;

static int samples_push(samples *s, uint64_t ns) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 65536;
    uint64_t *v = realloc(s->v, cap * sizeof(*v));
    if (!v) return -ENOMEM;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = ns;
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v, in microseconds. */
static double percentile_us(const uint64_t *v, size_t n, double q) {
  if (n == 0) return 0.0;
  size_t rank = (size_t)ceil(q * (double)n);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return (double)v[rank - 1] / 1000.0;
}

/* ------------------------------------------------------------------------ */
/* Worker groups: fork, start barrier, results over a pipe                    */

#define MAX_PHASES 4

/* One per group, shared with its workers (MAP_SHARED). */
typedef struct shared {
  _Atomic int go;                /* phase p is released when go > p; -1: abort */
  int64_t start_ns[MAX_PHASES]; /* written before `go` moves (seq_cst store) */
} shared;

/* One record on a worker's pipe: a setup report (phase = -1) or a phase
 * result, followed by n_samples uint64 latencies in ns. */
typedef struct wire_result {
  int32_t status; /* ckv_status of the first failure; 0 when none */
  int32_t phase;
  uint64_t requests, errors;
  int64_t end_ns;
  uint64_t n_samples;
  char err[ERR_LEN];
} wire_result;

typedef struct worker {
  int index;
  int fd; /* write end of its pipe */
  shared *sh;
  double seconds;
} worker;

static int write_full(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -errno;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int read_full(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return -EPIPE; /* the worker died */
    if (r < 0) return -errno;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

/* Idle workers sleep in the kernel (a process-shared futex), so a group that
 * waits for its turn takes no CPU from the group being measured. */
static void futex_wait(_Atomic int *word, int val, long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  syscall(SYS_futex, (int *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic int *word) { syscall(SYS_futex, (int *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static void worker_setup_done(worker *w, int status, const char *err) {
  wire_result m = {.status = status, .phase = -1};
  snprintf(m.err, sizeof(m.err), "%s", err ? err : "");
  (void)write_full(w->fd, &m, sizeof(m));
}

/* Blocks until the parent releases `phase`; false when it aborted. */
static bool worker_wait_go(worker *w, int phase) {
  for (;;) {
    int go = atomic_load(&w->sh->go);
    if (go < 0) return false;
    if (go > phase) return true;
    futex_wait(&w->sh->go, go, 100);
  }
}

/* One request of a phase; returns a ckv_status, and on failure writes its
 * explanation into err. */
typedef int (*request_fn)(void *ctx, char *err, size_t errlen);

/* Runs one phase: requests back to back until start + seconds, then the
 * result record.  The first failure ends the phase for this worker (a dead
 * daemon would otherwise cost a timeout per request). */
static int worker_run_phase(worker *w, int phase, request_fn fn, void *ctx) {
  if (!worker_wait_go(w, phase)) return -ECANCELED;
  const int64_t deadline = w->sh->start_ns[phase] + (int64_t)(w->seconds * 1e9);
  samples s = {0};
  wire_result m = {.phase = phase};
  int64_t t0;
  while ((t0 = now_ns()) < deadline) {
    int r = fn(ctx, m.err, sizeof(m.err));
    int64_t t1 = now_ns();
    m.requests++;
    if (r < 0) {
      m.errors++;
      m.status = r;
      break;
    }
    if (samples_push(&s, (uint64_t)(t1 - t0)) < 0) {
      m.status = -ENOMEM;
      snprintf(m.err, sizeof(m.err), "out of memory for latency samples");
      break;
    }
  }
  m.end_ns = now_ns();
  m.n_samples = s.n;
  int r = write_full(w->fd, &m, sizeof(m));
  if (r == 0 && s.n) r = write_full(w->fd, s.v, s.n * sizeof(*s.v));
  free(s.v);
  return r < 0 ? r : m.status;
}

typedef int (*worker_main_fn)(worker *w, void *arg);

typedef struct group {
  const char *what; /* for messages */
  int n;
  pid_t *pids;
  int *fds; /* read ends */
  shared *sh;
} group;

/* Lets waiting workers go (abort), closes the pipes, reaps every worker. */
static void group_done(group *g) {
  if (g->sh) {
    atomic_store(&g->sh->go, -1);
    futex_wake_all(&g->sh->go);
  }
  for (int i = 0; g->pids && i < g->n; i++) {
    if (g->fds[i] >= 0) close(g->fds[i]);
    if (g->pids[i] > 0) {
      int st;
      while (waitpid(g->pids[i], &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  free(g->pids);
  free(g->fds);
  if (g->sh) munmap(g->sh, sizeof(*g->sh));
  memset(g, 0, sizeof(*g));
}

/* Forks n workers running fn(worker, arg).  Each has a pipe of its own; the
 * parent holds only the read ends, so a dead worker reads as EOF. */
static int group_start(group *g, const char *what, int n, double seconds, worker_main_fn fn, void *arg) {
  memset(g, 0, sizeof(*g));
  g->what = what;
  g->n = n;
  g->pids = calloc((size_t)n, sizeof(*g->pids));
  g->fds = malloc((size_t)n * sizeof(*g->fds));
  int *wfds = malloc((size_t)n * sizeof(*wfds));
  g->sh = mmap(NULL, sizeof(*g->sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g->sh == MAP_FAILED) g->sh = NULL;
  if (!g->pids || !g->fds || !wfds || !g->sh) {
    free(wfds);
    g->n = 0;
    group_done(g);
    return -ENOMEM;
  }
  memset(g->sh, 0, sizeof(*g->sh));
  for (int i = 0; i < n; i++) g->fds[i] = wfds[i] = -1;
  int r = 0;
  for (int i = 0; i < n && r == 0; i++) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
      r = -errno;
      break;
    }
    g->fds[i] = p[0];
    wfds[i] = p[1];
  }
  pid_t parent = getpid();
  for (int i = 0; i < n && r == 0; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      r = -errno;
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      for (int j = 0; j < n; j++) {
        if (g->fds[j] >= 0) close(g->fds[j]);
        if (j != i && wfds[j] >= 0) close(wfds[j]);
      }
      worker w = {.index = i, .fd = wfds[i], .sh = g->sh, .seconds = seconds};
      free(wfds); /* the parent's bookkeeping, not the worker's */
      free(g->pids);
      free(g->fds);
      int rc = fn(&w, arg);
      close(w.fd);
      _exit(rc < 0 ? 1 : 0);
    }
    g->pids[i] = pid;
  }
  for (int i = 0; i < n; i++)
    if (wfds[i] >= 0) close(wfds[i]);
  free(wfds);
  if (r < 0) {
    fprintf(stderr, "commitkv-bench: cannot start %s workers: %s\n", what, strerror(-r));
    group_done(g);
  }
  return r;
}

/* Waits for every worker's setup report.  On a failure, says why on stderr. */
static int group_wait_ready(group *g) {
  for (int i = 0; i < g->n; i++) {
    wire_result m;
    int r = read_full(g->fds[i], &m, sizeof(m));
    if (r < 0) {
      fprintf(stderr, "commitkv-bench: %s worker %d died during setup\n", g->what, i);
      return r;
    }
    m.err[ERR_LEN - 1] = 0;
    if (m.status < 0) {
      fprintf(stderr, "commitkv-bench: %s worker %d: %s (%s)\n", g->what, i, m.err, ckv_strerror(m.status));
      return m.status;
    }
  }
  return 0;
}

/* What one phase of one group measured. */
typedef struct phase_result {
  samples lat;
  uint64_t requests, errors;
  double seconds; /* from the release to the last worker's last reply */
} phase_result;

/* Releases `phase` to every worker of g and gathers the results into *ret
 * (which the caller frees with free(ret->lat.v), also on failure). */
static int group_phase(group *g, int phase, phase_result *ret) {
  memset(ret, 0, sizeof(*ret));
  const int64_t start = now_ns();
  g->sh->start_ns[phase] = start;
  atomic_store(&g->sh->go, phase + 1); /* seq_cst: start_ns is visible first */
  futex_wake_all(&g->sh->go);
  int64_t end = start;
  int status = 0;
  for (int i = 0; i < g->n; i++) {
    wire_result m;
    int r = read_full(g->fds[i], &m, sizeof(m));
    if (r < 0 || m.phase != phase) {
      fprintf(stderr, "commitkv-bench: %s worker %d died\n", g->what, i);
      status = r < 0 ? r : -EPROTO;
      break;
    }
    m.err[ERR_LEN - 1] = 0;
    samples *all = &ret->lat;
    if (m.n_samples) {
      if (all->n + m.n_samples > all->cap) {
        uint64_t *v = realloc(all->v, (all->n + m.n_samples) * sizeof(*v));
        if (!v) {
          status = -ENOMEM;
          break;
        }
        all->v = v;
        all->cap = all->n + m.n_samples;
      }
      if ((r = read_full(g->fds[i], all->v + all->n, m.n_samples * sizeof(*all->v))) < 0) {
        fprintf(stderr, "commitkv-bench: %s worker %d died\n", g->what, i);
        status = r;
        break;
      }
      all->n += m.n_samples;
    }
    ret->requests += m.n_samples;
    ret->errors += m.errors;
    if (m.end_ns > end) end = m.end_ns;
    if (m.status < 0) {
      fprintf(stderr, "commitkv-bench: %s worker %d: %s (%s)\n", g->what, i, m.err, ckv_strerror(m.status));
      status = m.status;
    }
  }
  ret->seconds = (double)(end - start) / 1e9;
  return status;
}

/* Pools phases of the same kind into requests/s and percentiles. */
static void stats_from(phase_result *runs, size_t n, kind_stats *ret) {
  kind_stats st = {.measured = true};
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += runs[i].lat.n;
  uint64_t *all = malloc((total ? total : 1) * sizeof(*all));
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    st.requests += runs[i].requests;
    st.errors += runs[i].errors;
    st.seconds += runs[i].seconds;
    if (all && runs[i].lat.n) memcpy(all + at, runs[i].lat.v, runs[i].lat.n * sizeof(*all));
    at += runs[i].lat.n;
  }
  st.rps = st.seconds > 0 ? (double)st.requests / st.seconds : 0.0;
  if (all) {
    qsort(all, total, sizeof(*all), cmp_u64);
    st.p50_us = percentile_us(all, total, 0.50);
    st.p99_us = percentile_us(all, total, 0.99);
  }
  free(all);
  *ret = st;
}

static double phase_rps(const phase_result *p) { return p->seconds > 0 ? (double)p->requests / p->seconds : 0.0; }

/* ------------------------------------------------------------------------ */
/* The temporary directory and the daemon                                     */

/* ------------------------------------------------------------------------ */
/* Section: the ceiling, a bare ZeroMQ ROUTER/DEALER echo over ipc://         */

/* Size of a packed Heartbeat request as libcommitkv sends it (version 1 and a
 * two-byte request id, as after the first 127 requests). */
static size_t heartbeat_request_size(void) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Heartbeat hb = COMMITKV__V1__HEARTBEAT__INIT;
  req.version = CKV_CLIENT_VERSION;
  req.request_id = 1000;
  req.body_case = COMMITKV__V1__REQUEST__BODY_HEARTBEAT;
  req.heartbeat = &hb;
  return commitkv__v1__request__get_packed_size(&req);
}

/* The echo server: one thread, one ROUTER, the daemon's loop shape (poll, then
 * drain a batch without waiting) with no work per message.  It leaves when
 * the parent sends SIGTERM. */
static int echo_server(const char *endpoint, int ready_fd) {
  void *ctx = zmq_ctx_new();
  void *router = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
  int zero = 0, ok = 0;
  if (router) {
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
    ok = zmq_bind(router, endpoint) == 0;
  }
  wire_result m = {.status = ok ? 0 : -zmq_errno(), .phase = -1};
  if (!ok) snprintf(m.err, sizeof(m.err), "echo: cannot bind %.120s: %s", endpoint, zmq_strerror(zmq_errno()));
  (void)write_full(ready_fd, &m, sizeof(m));
  close(ready_fd);
  while (ok) {
    zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, -1) < 0 && zmq_errno() != EINTR) break;
    for (int i = 0; i < ECHO_BATCH; i++) {
      zmq_msg_t id, body;
      zmq_msg_init(&id);
      if (zmq_msg_recv(&id, router, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&id);
        break;
      }
      zmq_msg_init(&body);
      if (!zmq_msg_more(&id) || zmq_msg_recv(&body, router, 0) < 0) {
        zmq_msg_close(&id);
        zmq_msg_close(&body);
        continue;
      }
      if (zmq_msg_send(&id, router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) zmq_msg_close(&id);
      if (zmq_msg_send(&body, router, ZMQ_DONTWAIT) < 0) zmq_msg_close(&body);
    }
  }
  if (router) zmq_close(router);
  if (ctx) zmq_ctx_term(ctx);
  return ok ? 0 : -1;
}

/* Forks the echo server and waits until it is bound. */
static int echo_server_start(const char *endpoint, pid_t *ret_pid) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return -errno;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int r = -errno;
    close(p[0]);
    close(p[1]);
    return r;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    close(p[0]);
    _exit(echo_server(endpoint, p[1]) < 0 ? 1 : 0);
  }
  close(p[1]);
  wire_result m;
  int r = read_full(p[0], &m, sizeof(m));
  close(p[0]);
  if (r == 0 && m.status < 0) {
    m.err[ERR_LEN - 1] = 0;
    fprintf(stderr, "commitkv-bench: %s\n", m.err);
    r = m.status;
  }
  if (r < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return r;
  }
  *ret_pid = pid;
  return 0;
}

static void echo_server_stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

typedef struct echo_client {
  void *dealer;
  uint8_t payload[64];
  size_t len;
} echo_client;

/* One round trip, waited for as libcommitkv waits (poll, then recv). */
static int echo_request(void *arg, char *err, size_t errlen) {
  echo_client *e = arg;
  uint8_t buf[64];
  if (zmq_send(e->dealer, e->payload, e->len, 0) < 0) {
    snprintf(err, errlen, "echo send: %s", zmq_strerror(zmq_errno()));
    return CKV_ERR_DISCONNECTED;
  }
  zmq_pollitem_t it = {.socket = e->dealer, .events = ZMQ_POLLIN};
  int rc = zmq_poll(&it, 1, ECHO_TIMEOUT_MS);
  if (rc <= 0 || zmq_recv(e->dealer, buf, sizeof(buf), ZMQ_DONTWAIT) < 0) {
    snprintf(err, errlen, "no echo within %d ms", ECHO_TIMEOUT_MS);
    return CKV_ERR_TIMEOUT;
  }
  return 0;
}

typedef struct echo_args {
  const char *endpoint;
  size_t payload;
} echo_args;

/* Phases: ECHO_RUN_BEFORE, then ECHO_RUN_AFTER (around the daemon's). */
enum { ECHO_RUN_BEFORE, ECHO_RUN_AFTER, N_ECHO_RUNS };

static int echo_worker(worker *w, void *arg) {
  const echo_args *a = arg;
  echo_client e = {.len = a->payload < sizeof(e.payload) ? a->payload : sizeof(e.payload)};
  memset(e.payload, 0x5a, e.len);
  void *ctx = zmq_ctx_new();
  e.dealer = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
  int zero = 0, r = -ENOMEM;
  char err[ERR_LEN] = "cannot create a ZeroMQ socket";
  if (e.dealer) {
    zmq_setsockopt(e.dealer, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_connect(e.dealer, a->endpoint) != 0) {
      r = -zmq_errno();
      snprintf(err, sizeof(err), "cannot connect %.120s: %s", a->endpoint, zmq_strerror(zmq_errno()));
    } else {
      r = echo_request(&e, err, sizeof(err)); /* the connection is up before the clock starts */
    }
  }
  worker_setup_done(w, r, err);
  for (int run = 0; r == 0 && run < N_ECHO_RUNS; run++) r = worker_run_phase(w, run, echo_request, &e);
  if (e.dealer) zmq_close(e.dealer);
  if (ctx) zmq_ctx_term(ctx);
  return r;
}

/* The echo server and its workers, set up and idle until echo_run(). */
typedef struct echo_bench {
  pid_t server;
  group g;
  echo_args args;
  char endpoint[160];
  phase_result runs[N_ECHO_RUNS];
} echo_bench;

static int echo_setup(echo_bench *e, const options *o, const char *dir, size_t payload) {
  snprintf(e->endpoint, sizeof(e->endpoint), "ipc://%.100s/echo.sock", dir);
  e->args = (echo_args){.endpoint = e->endpoint, .payload = payload};
  int r = echo_server_start(e->endpoint, &e->server);
  if (r == 0) r = group_start(&e->g, "echo", o->workers, o->seconds, echo_worker, &e->args);
  if (r == 0) r = group_wait_ready(&e->g);
  return r;
}

static int echo_run(echo_bench *e, int run, const options *o) {
  fprintf(stderr, "commitkv-bench: echo ceiling (%s the daemon): %d DEALERs, %zu-byte payloads, %.1f s\n",
          run == ECHO_RUN_BEFORE ? "before" : "after", o->workers, e->args.payload, o->seconds);
  return group_phase(&e->g, run, &e->runs[run]);
}

/* Both runs pooled: the ceiling brackets the daemon's phases in time, so a
 * machine whose load drifts during the bench biases neither side. */
static void echo_finish(echo_bench *e, report *rep) {
  group_done(&e->g);
  echo_server_stop(e->server);
  e->server = 0;
  size_t n = 0;
  for (int i = 0; i < N_ECHO_RUNS; i++) {
    if (!e->runs[i].seconds) { /* never run */
      free(e->runs[i].lat.v);
      continue;
    }
    rep->echo_run_rps[n] = phase_rps(&e->runs[i]);
    e->runs[n++] = e->runs[i];
  }
  rep->n_echo_runs = n;
  if (n) stats_from(e->runs, n, &rep->kinds[KIND_ECHO]);
  for (size_t i = 0; i < n; i++) free(e->runs[i].lat.v);
}

/* ------------------------------------------------------------------------ */
/* Section: the daemon, heartbeats and 4K-token ReportRound                   */

/* The daemon group's phases, in order. */
enum { DAEMON_PHASE_HEARTBEAT, DAEMON_PHASE_REPORT };

typedef struct session_client {
  ckv_client *c;
  ckv_session *s;
  uint64_t round;
  float *attn;
} session_client;

static int heartbeat_request(void *arg, char *err, size_t errlen) {
  session_client *sc = arg;
  int r = ckv_client_heartbeat(sc->c);
  if (r < 0) snprintf(err, errlen, "heartbeat: %s", ckv_client_last_error(sc->c));
  return r;
}

static int report_request(void *arg, char *err, size_t errlen) {
  session_client *sc = arg;
  int r = ckv_session_report(sc->s, ++sc->round, /* first_position= */ 0, sc->attn, REPORT_TOKENS, NULL);
  if (r < 0) snprintf(err, errlen, "report round %llu: %s", (unsigned long long)sc->round, ckv_client_last_error(sc->c));
  return r;
}

/* A small geometry: the control plane's cost does not depend on it, and
 * eight 4096-token sessions stay far below --memory 2G. */
static const ckv_geometry k_geometry = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .dtype = 0};

static int daemon_worker(worker *w, void *arg) {
  const ckv_bench_daemon *d = arg;
  session_client sc = {0};
  char err[ERR_LEN] = "";
  /* No background heartbeat: every request on the socket is one we time. */
  ckv_client_options co = {.socket = d->socket, .attach_socket = d->attach, .name = "commitkv-bench"};
  int r = ckv_client_connect(&co, &sc.c);
  if (r < 0) {
    snprintf(err, sizeof(err), "cannot connect to commitkvd at %.120s", d->socket);
    worker_setup_done(w, r, err);
    return r;
  }
  char id[64];
  snprintf(id, sizeof(id), "bench-%d-%d", (int)getppid(), w->index);
  r = ckv_session_open(sc.c, id, &k_geometry, NULL, &sc.s);
  if (r < 0) snprintf(err, sizeof(err), "open session %s: %s", id, ckv_client_last_error(sc.c));
  uint64_t first = 0;
  if (r == 0) {
    r = ckv_session_append(sc.s, REPORT_TOKENS, NULL, NULL, NULL, NULL, &first);
    if (r < 0) snprintf(err, sizeof(err), "append %u tokens: %s", REPORT_TOKENS, ckv_client_last_error(sc.c));
  }
  if (r == 0 && !(sc.attn = malloc(REPORT_TOKENS * sizeof(float)))) {
    r = -ENOMEM;
    snprintf(err, sizeof(err), "out of memory");
  }
  if (r == 0) {
    /* Attention mass that looks like a round's: a few heavy tokens, a long tail. */
    uint32_t x = 2463534242u ^ (uint32_t)w->index;
    for (uint32_t i = 0; i < REPORT_TOKENS; i++) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      float u = (float)(x >> 8) / 16777216.0f;
      sc.attn[i] = u * u * u;
    }
  }
  worker_setup_done(w, r, err);
  if (r == 0) r = worker_run_phase(w, DAEMON_PHASE_HEARTBEAT, heartbeat_request, &sc);
  if (r == 0) r = worker_run_phase(w, DAEMON_PHASE_REPORT, report_request, &sc);
  if (sc.s) (void)ckv_session_drop(sc.s);
  ckv_client_free(sc.c);
  free(sc.attn);
  return r;
}

static int measure_daemon(const options *o, const ckv_bench_daemon *d, report *rep) {
  group g;
  int r = group_start(&g, "commitkvd", o->workers, o->seconds, daemon_worker, (void *)d);
  if (r < 0) return r;
  r = group_wait_ready(&g);
  static const struct {
    int phase;
    kind k;
  } phases[] = {{DAEMON_PHASE_HEARTBEAT, KIND_HEARTBEAT}, {DAEMON_PHASE_REPORT, KIND_REPORT_4K}};
  for (size_t i = 0; r == 0 && i < sizeof(phases) / sizeof(phases[0]); i++) {
    fprintf(stderr, "commitkv-bench: commitkvd %s: %d workers, %.1f s\n", k_kind_name[phases[i].k], o->workers,
            o->seconds);
    phase_result pr;
    r = group_phase(&g, phases[i].phase, &pr);
    if (r == 0) stats_from(&pr, 1, &rep->kinds[phases[i].k]);
    free(pr.lat.v);
  }
  group_done(&g);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                     */

static double ratio_to_echo(const report *rep, kind k) {
  double echo = rep->kinds[KIND_ECHO].rps;
  return echo > 0 ? rep->kinds[k].rps / echo : 0.0;
}

static void print_table(const report *rep) {
  printf("commitkv-bench control: %d workers on %ld CPUs%s, %.1f s per kind, echo payload %zu bytes\n\n",
         rep->workers, rep->cpus, rep->workers > rep->cpus ? " (oversubscribed)" : "", rep->seconds,
         rep->echo_payload);
  printf("%-18s %10s %12s %10s %10s %9s\n", "kind", "requests", "req/s", "p50 us", "p99 us", "vs echo");
  for (int k = 0; k < N_KINDS; k++) {
    const kind_stats *s = &rep->kinds[k];
    if (!s->measured) continue;
    char ratio[16];
    snprintf(ratio, sizeof(ratio), "%.1f%%", 100.0 * ratio_to_echo(rep, (kind)k));
    printf("%-18s %10llu %12.0f %10.1f %10.1f %9s\n", k == KIND_ECHO ? "zmq echo (ceiling)" : k_kind_name[k],
           (unsigned long long)s->requests, s->rps, s->p50_us, s->p99_us, ratio);
  }
  if (rep->n_echo_runs == 2)
    printf("\necho ceiling before / after the daemon: %.0f / %.0f req/s (pooled above)\n", rep->echo_run_rps[0],
           rep->echo_run_rps[1]);
}

/* The "results" member: one object per daemon kind. */
static void print_json_results(const report *rep) {
  printf("\"results\": [");
  const char *sep = "";
  for (int k = KIND_HEARTBEAT; k < N_KINDS; k++) {
    const kind_stats *s = &rep->kinds[k];
    if (!s->measured) continue;
    printf("%s{\"kind\": \"%s\", \"rps\": %.1f, \"p50_us\": %.2f, \"p99_us\": %.2f, \"ratio_to_echo\": %.4f, "
           "\"requests\": %llu, \"errors\": %llu}",
           sep, k_kind_name[k], s->rps, s->p50_us, s->p99_us, ratio_to_echo(rep, (kind)k),
           (unsigned long long)s->requests, (unsigned long long)s->errors);
    sep = ", ";
  }
  printf("]");
}

/* The judge section: in-process, one core (bench_judge.c). */
/* Every size with the defaults, then the large ones with the judge every 4
 * rounds and a quarter of the far tokens per round (judge_every, far_sample). */
static const struct {
  uint64_t tokens;
  uint32_t judge_every;
  float far_sample;
} k_judge_rows[] = {{4096, 1, 1.f},   {32768, 1, 1.f},     {131072, 1, 1.f},      {524288, 1, 1.f},
                    {1048576, 1, 1.f}, {524288, 4, 0.25f}, {1048576, 4, 0.25f}};
#define N_JUDGE (sizeof(k_judge_rows) / sizeof(k_judge_rows[0]))

static int measure_judge(const options *o, ckv_judge_bench *ret) {
  for (size_t i = 0; i < N_JUDGE; i++) {
    int r = ckv_bench_judge_run_sampled(k_judge_rows[i].tokens, o->seconds / 2 > 0.2 ? o->seconds / 2 : 0.2,
                                        k_judge_rows[i].judge_every, k_judge_rows[i].far_sample, &ret[i]);
    if (r < 0) return r;
  }
  return 0;
}

static void print_judge_table(const ckv_judge_bench *j) {
  printf("\njudge (one core, in-process; ReportRound = record + judge + plan, compression excluded)\n");
  printf("%-10s %6s %6s %16s %14s %14s %12s %12s %12s %12s %8s\n", "tokens", "every", "far", "tokens judged/s",
         "round p50 us", "round p99 us", "record p50", "judge p50", "cpu p50 us", "cpu p99 us", "rounds");
  for (size_t i = 0; i < N_JUDGE; i++)
    printf("%-10llu %6u %6.2f %16.3g %14.1f %14.1f %12.1f %12.1f %12.1f %12.1f %8llu\n", (unsigned long long)j[i].tokens,
           j[i].judge_every, j[i].far_sample, j[i].tokens_per_s, j[i].round_p50_us, j[i].round_p99_us,
           j[i].record_p50_us, j[i].judge_p50_us, j[i].cpu_p50_us, j[i].cpu_p99_us, (unsigned long long)j[i].rounds);
}

static void print_json_judge(const ckv_judge_bench *j) {
  printf(", \"judge\": [");
  for (size_t i = 0; i < N_JUDGE; i++)
    printf("%s{\"tokens\": %llu, \"judge_every\": %u, \"far_sample\": %.2f, \"tokens_per_s\": %.1f, \"round_p50_us\": %.2f, \"round_p99_us\": %.2f, "
           "\"record_p50_us\": %.2f, \"record_p99_us\": %.2f, \"judge_p50_us\": %.2f, \"judge_p99_us\": %.2f, "
           "\"cpu_p50_us\": %.2f, \"cpu_p99_us\": %.2f, \"rounds\": %llu}",
           i ? ", " : "", (unsigned long long)j[i].tokens, j[i].judge_every, j[i].far_sample, j[i].tokens_per_s, j[i].round_p50_us, j[i].round_p99_us,
           j[i].record_p50_us, j[i].record_p99_us, j[i].judge_p50_us, j[i].judge_p99_us, j[i].cpu_p50_us,
           j[i].cpu_p99_us, (unsigned long long)j[i].rounds);
  printf("]");
}

static ckv_judge_bench g_judge[N_JUDGE];
static bool g_judge_ok;

static void print_json(const report *rep) {
  const kind_stats *e = &rep->kinds[KIND_ECHO];
  printf("{\"workers\": %d, \"cpus\": %ld, \"seconds\": %.2f, \"echo_payload_bytes\": %zu, "
         "\"echo_rps\": %.1f, \"echo_p50_us\": %.2f, \"echo_p99_us\": %.2f, ",
         rep->workers, rep->cpus, rep->seconds, rep->echo_payload, e->rps, e->p50_us, e->p99_us);
  printf("\"echo_runs_rps\": [");
  for (size_t i = 0; i < rep->n_echo_runs; i++) printf("%s%.1f", i ? ", " : "", rep->echo_run_rps[i]);
  printf("], ");
  print_json_results(rep);
  if (g_judge_ok) print_json_judge(g_judge);
  printf("}\n");
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                                */

static void usage(FILE *f) {
  fprintf(f,
          "usage: commitkv-bench control [--workers N] [--seconds S] [--json] [--daemon PATH]\n"
          "  --workers N    worker processes (default %d)\n"
          "  --seconds S    seconds per kind of request (default %.0f)\n"
          "  --json         one JSON object on stdout instead of the table\n"
          "  --daemon PATH  commitkvd to start (default: beside this binary)\n",
          DEFAULT_WORKERS, DEFAULT_SECONDS);
}

static int parse_options(int argc, char **argv, options *o) {
  *o = (options){.workers = DEFAULT_WORKERS, .seconds = DEFAULT_SECONDS};
  static const struct option longopts[] = {
      {"workers", required_argument, 0, 'w'}, {"seconds", required_argument, 0, 's'},
      {"json", no_argument, 0, 'j'},          {"daemon", required_argument, 0, 'd'},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
  };
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "w:s:jd:h", longopts, NULL)) != -1) {
    char *end;
    switch (c) {
      case 'w': {
        long v = strtol(optarg, &end, 10);
        if (*end || v < 1 || v > MAX_WORKERS) {
          fprintf(stderr, "commitkv-bench control: --workers wants 1..%d, not '%s'\n", MAX_WORKERS, optarg);
          return -1;
        }
        o->workers = (int)v;
        break;
      }
      case 's':
        o->seconds = strtod(optarg, &end);
        if (*end || !(o->seconds > 0.0 && o->seconds <= 3600.0)) {
          fprintf(stderr, "commitkv-bench control: --seconds wants a number in (0, 3600], not '%s'\n", optarg);
          return -1;
        }
        break;
      case 'j': o->json = true; break;
      case 'd': o->daemon = optarg; break;
      case 'h': usage(stdout); return 1;
      default: usage(stderr); return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "commitkv-bench control: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return -1;
  }
  return 0;
}

int ckv_bench_control(int argc, char **argv) {
  options o;
  int r = parse_options(argc, argv, &o);
  if (r != 0) return r > 0 ? 0 : 2;
  char daemon_path[PATH_MAX];
  if (ckv_bench_find_daemon(o.daemon, daemon_path, sizeof(daemon_path)) < 0) return 1;

  report rep = {.workers = o.workers, .cpus = sysconf(_SC_NPROCESSORS_ONLN), .seconds = o.seconds};
  rep.echo_payload = heartbeat_request_size();
  if (rep.cpus > 0 && o.workers > rep.cpus)
    fprintf(stderr, "commitkv-bench: %d workers on %ld CPUs: oversubscribed, latencies include run-queue waits\n",
            o.workers, rep.cpus);

  const char *tmp = getenv("TMPDIR");
  char dir[128];
  /* ipc:// paths must fit sockaddr_un (108 bytes): fall back to /tmp. */
  snprintf(dir, sizeof(dir), "%.60s/ckv-bench-XXXXXX", tmp && *tmp && strlen(tmp) < 60 ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "commitkv-bench: mkdtemp %s: %s\n", dir, strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  /* Order: echo, the daemon's kinds, echo again (see echo_finish). */
  int rc = 0;
  echo_bench echo = {0};
  ckv_bench_daemon d = {0};
  if ((r = echo_setup(&echo, &o, dir, rep.echo_payload)) < 0 || (r = echo_run(&echo, ECHO_RUN_BEFORE, &o)) < 0) {
    fprintf(stderr, "commitkv-bench: the echo ceiling failed: %s\n", ckv_strerror(r));
    rc = 1;
  }
  if (rc == 0) {
    fprintf(stderr, "commitkv-bench: starting %s in %s\n", daemon_path, dir);
    if (ckv_bench_daemon_start(&d, daemon_path, dir, "2G") < 0) rc = 1;
  }
  if (rc == 0 && (r = measure_daemon(&o, &d, &rep)) < 0) {
    fprintf(stderr, "commitkv-bench: measuring commitkvd failed: %s\n", ckv_strerror(r));
    ckv_bench_daemon_log_tail(&d);
    rc = 1;
  }
  if (rc == 0 && (r = echo_run(&echo, ECHO_RUN_AFTER, &o)) < 0) {
    fprintf(stderr, "commitkv-bench: the echo ceiling failed: %s\n", ckv_strerror(r));
    rc = 1;
  }
  echo_finish(&echo, &rep);
  if (d.pid > 0 && ckv_bench_daemon_stop(&d) < 0) rc = 1;
  if (rc == 0) {
    fprintf(stderr, "commitkv-bench: judging sessions of 4K, 32K, 128K, 512K, 1M tokens\n");
    if ((r = measure_judge(&o, g_judge)) < 0) {
      fprintf(stderr, "commitkv-bench: the judge benchmark failed: %s\n", ckv_strerror(r));
      rc = 1;
    } else {
      g_judge_ok = true;
    }
  }

  if (rep.kinds[KIND_ECHO].measured && rep.kinds[KIND_REPORT_4K].measured) {
    if (o.json) {
      print_json(&rep);
    } else {
      print_table(&rep);
      if (g_judge_ok) print_judge_table(g_judge);
    }
    fflush(stdout);
  }
  ckv_bench_rm_tree(dir);
  return rc;
}
