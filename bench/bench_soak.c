/* bench_soak.c - commitkv-bench soak: a real commitkvd under load, with kills.
 *
 *   commitkv-bench soak [--workers N] [--sessions M] [--seconds T] [--kill-every-ms K]
 *                       [--restart-every-s R] [--daemon PATH] [--json]
 *
 * N commitkv-worker processes (each M sessions; every byte of K/V a worker
 * writes it reads back through the session's view and checks against its
 * pattern, and after a daemon restart it writes what the new session lost
 * again) run in generations of 20 rounds; each one that ends is replaced.
 * Every K ms a random live worker is killed with SIGKILL (and replaced);
 * every R seconds commitkvd itself is killed with SIGKILL and started again
 * on the same sockets, the workers riding through on their own (reconnect
 * with backoff).  A probe client in this process sends a Stats request every
 * 10 ms: its latencies give p99_us (a request's round trip while everything
 * else runs), the daemon's request and error counters come from it too
 * (summed over the daemon's lives).  bytes_verified counts the K/V bytes the
 * workers that finished read back and checked; bytes_lost the mismatching
 * ones (2 bytes per FP16 element): it must be 0.  RSS of the daemon at the
 * start and at the end (of its last life), and the arena bytes in use.
 * errors: workers that failed on their own, by the status text they printed,
 * and the daemon's error replies. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "client/rpc.h"
#include "commitkv/commitkv.h"

#define SOAK_MAX_WORKERS 64
#define SOAK_ROUNDS 20            /* rounds of one worker generation */
#define SOAK_PROBE_MS 10
#define SOAK_MAX_ERROR_KINDS 16

typedef struct soak_worker {
  pid_t pid;
  int gen;
  bool killed; /* by us: its output does not count */
  char out[PATH_MAX];
} soak_worker;

typedef struct soak {
  int workers, sessions;
  double seconds, restart_every_s;
  long kill_every_ms;
  bool json;
  const char *daemon_opt;
  char daemon[PATH_MAX], worker_bin[PATH_MAX], dir[128];
  ckv_bench_daemon d;
  soak_worker w[SOAK_MAX_WORKERS];
  uint64_t kills, restarts, requests, daemon_errors, probes;
  uint64_t bytes_verified, bytes_lost, generations_ok, generations_failed;
  uint64_t *lat;
  size_t n_lat, cap_lat;
  long rss_start_kb, rss_end_kb;
  uint64_t arena_used_end;
  char err_name[SOAK_MAX_ERROR_KINDS][64];
  uint64_t err_count[SOAK_MAX_ERROR_KINDS];
  int n_err;
} soak;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static long rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof(line), f))
    if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return kb;
}

static void count_error(soak *s, const char *name) {
  for (int i = 0; i < s->n_err; i++)
    if (!strcmp(s->err_name[i], name)) {
      s->err_count[i]++;
      return;
    }
  if (s->n_err == SOAK_MAX_ERROR_KINDS) name = "other";
  int i = s->n_err < SOAK_MAX_ERROR_KINDS ? s->n_err++ : SOAK_MAX_ERROR_KINDS - 1;
  snprintf(s->err_name[i], sizeof(s->err_name[i]), "%s", name);
  s->err_count[i]++;
}

static int spawn_worker(soak *s, int i) {
  soak_worker *w = &s->w[i];
  w->gen++;
  w->killed = false;
  snprintf(w->out, sizeof(w->out), "%s/worker%d-%d.out", s->dir, i, w->gen);
  char prefix[64], seed[32], sessions[16], rounds[16];
  snprintf(prefix, sizeof(prefix), "soak%d-%d", i, w->gen);
  snprintf(seed, sizeof(seed), "%d", 1 + i * 1000 + w->gen);
  snprintf(sessions, sizeof(sessions), "%d", s->sessions);
  snprintf(rounds, sizeof(rounds), "%d", SOAK_ROUNDS);
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(w->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl(s->worker_bin, s->worker_bin, "--socket", s->d.socket, "--attach-socket", s->d.attach, "--sessions", sessions,
          "--rounds", rounds, "--tokens", "16", "--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--seed", seed,
          "--prefix", prefix, "--reconnect-timeout-ms", "15000", "--quiet", (char *)NULL);
    _exit(127);
  }
  w->pid = pid;
  return 0;
}

/* A worker generation ended: its last line says how many token reads it
 * verified and how many elements mismatched; a failure names its status. */
static void account(soak *s, soak_worker *w, int status) {
  FILE *f = fopen(w->out, "r");
  char line[1024], last[1024] = "", fail[256] = "";
  while (f && fgets(line, sizeof(line), f)) {
    snprintf(last, sizeof(last), "%s", line);
    /* "commitkv-worker: connect: STATUS: text" or "commitkv-worker: ID: what: STATUS: text" */
    const char *p = strstr(line, "commitkv-worker: ");
    if (p && !fail[0]) {
      const char *c = p + strlen("commitkv-worker: ");
      int skip = !strncmp(c, "connect: ", 9) ? 1 : 2;
      for (int k = 0; k < skip && c; k++) {
        c = strstr(c, ": ");
        if (c) c += 2;
      }
      if (c) {
        snprintf(fail, sizeof(fail), "%s", c);
        char *e = strstr(fail, ": ");
        if (!e) e = strchr(fail, '\n');
        if (e) *e = 0;
      }
    }
  }
  if (f) fclose(f);
  unsigned long long reads = 0;
  long bad = 0;
  const char *v = strstr(last, "rounds, ");
  if (v && sscanf(v, "rounds, %llu token reads verified, %ld mismatching", &reads, &bad) == 2) {
    size_t tok = 2u * 2u * 2u * 64u * 2u; /* layers x K|V x heads x dims x FP16 bytes */
    s->bytes_verified += reads * tok;
    s->bytes_lost += (uint64_t)bad * 2u;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    s->generations_ok++;
  } else {
    s->generations_failed++;
    count_error(s, fail[0] ? fail : "worker failed without a status");
  }
}

static void probe(soak *s, ckv_client **c) {
  if (!*c) {
    ckv_client_options co = {.socket = s->d.socket, .attach_socket = s->d.attach, .name = "commitkv-bench-soak",
                             .heartbeat = false, .timeout_ms = 2000};
    if (ckv_client_connect(&co, c) < 0) {
      *c = NULL;
      return;
    }
  }
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep = NULL;
  uint64_t t0 = now_us();
  int r = ckv_rpc(*c, &req, &rep);
  uint64_t dt = now_us() - t0;
  if (r < 0) {
    ckv_client_free(*c);
    *c = NULL;
    return;
  }
  if (rep && rep->stats) {
    s->requests = rep->stats->requests;
    s->daemon_errors = rep->stats->errors;
    s->arena_used_end = rep->stats->bytes ? rep->stats->bytes->total : 0;
  }
  ckv_rpc_free(rep);
  if (s->n_lat == s->cap_lat) {
    size_t nc = s->cap_lat ? s->cap_lat * 2 : 4096;
    uint64_t *nl = realloc(s->lat, nc * sizeof(*nl));
    if (!nl) return;
    s->lat = nl;
    s->cap_lat = nc;
  }
  s->lat[s->n_lat++] = dt;
  s->probes++;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int parse(int argc, char **argv, soak *s) {
  static const struct option lo[] = {{"workers", required_argument, 0, 'w'}, {"sessions", required_argument, 0, 's'},
                                     {"seconds", required_argument, 0, 't'}, {"kill-every-ms", required_argument, 0, 'k'},
                                     {"restart-every-s", required_argument, 0, 'r'}, {"daemon", required_argument, 0, 'd'},
                                     {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  s->workers = 4, s->sessions = 2, s->seconds = 10, s->kill_every_ms = 700, s->restart_every_s = 4;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 'w': s->workers = atoi(optarg); break;
      case 's': s->sessions = atoi(optarg); break;
      case 't': s->seconds = atof(optarg); break;
      case 'k': s->kill_every_ms = atol(optarg); break;
      case 'r': s->restart_every_s = atof(optarg); break;
      case 'd': s->daemon_opt = optarg; break;
      case 'j': s->json = true; break;
      default:
        fprintf(ch == 'h' ? stdout : stderr,
                "usage: commitkv-bench soak [--workers N] [--sessions M] [--seconds T] [--kill-every-ms K]\n"
                "                           [--restart-every-s R] [--daemon PATH] [--json]\n"
                "  K = 0: no worker kills; R = 0: no daemon restarts\n");
        return ch == 'h' ? 1 : -1;
    }
  }
  if (s->workers < 1 || s->workers > SOAK_MAX_WORKERS || s->sessions < 1 || s->sessions > 64 || !(s->seconds > 0) ||
      s->kill_every_ms < 0 || s->restart_every_s < 0) {
    fprintf(stderr, "commitkv-bench soak: --workers 1..%d, --sessions 1..64, --seconds > 0\n", SOAK_MAX_WORKERS);
    return -1;
  }
  return 0;
}

static void report(const soak *s, double p99) {
  double rps = s->requests / s->seconds;
  if (s->json) {
    printf("{\"workers\": %d, \"sessions\": %d, \"seconds\": %.1f, \"requests\": %llu, \"rps\": %.1f, \"p99_us\": %.1f, "
           "\"probes\": %llu, \"kills\": %llu, \"daemon_restarts\": %llu, \"generations_ok\": %llu, "
           "\"generations_failed\": %llu, \"bytes_verified\": %llu, \"bytes_lost\": %llu, \"rss_start_kb\": %ld, "
           "\"rss_end_kb\": %ld, \"arena_used_end\": %llu, \"errors\": {\"daemon_error_replies\": %llu",
           s->workers, s->workers * s->sessions, s->seconds, (unsigned long long)s->requests, rps, p99,
           (unsigned long long)s->probes, (unsigned long long)s->kills, (unsigned long long)s->restarts,
           (unsigned long long)s->generations_ok, (unsigned long long)s->generations_failed,
           (unsigned long long)s->bytes_verified, (unsigned long long)s->bytes_lost, s->rss_start_kb, s->rss_end_kb,
           (unsigned long long)s->arena_used_end, (unsigned long long)s->daemon_errors);
    for (int i = 0; i < s->n_err; i++) {
      printf(", \"");
      for (const char *c = s->err_name[i]; *c; c++) putchar(*c == '"' || *c == '\\' ? '\'' : *c);
      printf("\": %llu", (unsigned long long)s->err_count[i]);
    }
    printf("}}\n");
    return;
  }
  printf("soak: %d workers x %d sessions for %.1f s, a worker killed every %ld ms, commitkvd killed every %.1f s\n",
         s->workers, s->sessions, s->seconds, s->kill_every_ms, s->restart_every_s);
  printf("requests %llu (%.0f/s, every daemon life), probe p99 %.0f us over %llu probes\n", (unsigned long long)s->requests,
         rps, p99, (unsigned long long)s->probes);
  printf("kills %llu, daemon restarts %llu, worker generations %llu ok / %llu failed\n", (unsigned long long)s->kills,
         (unsigned long long)s->restarts, (unsigned long long)s->generations_ok, (unsigned long long)s->generations_failed);
  printf("bytes verified %llu, bytes lost %llu\n", (unsigned long long)s->bytes_verified,
         (unsigned long long)s->bytes_lost);
  printf("daemon RSS %ld kB at start, %ld kB at the end; arena bytes in use at the end %llu\n", s->rss_start_kb,
         s->rss_end_kb, (unsigned long long)s->arena_used_end);
  printf("errors: %llu daemon error replies", (unsigned long long)s->daemon_errors);
  for (int i = 0; i < s->n_err; i++) printf("; %s: %llu", s->err_name[i], (unsigned long long)s->err_count[i]);
  printf("\n");
}

int ckv_bench_soak(int argc, char **argv) {
  soak s;
  memset(&s, 0, sizeof s);
  int r = parse(argc, argv, &s);
  if (r) return r > 0 ? 0 : 2;
  if (ckv_bench_find_daemon(s.daemon_opt, s.daemon, sizeof(s.daemon)) < 0 ||
      ckv_bench_beside_self("commitkv-worker", s.worker_bin, sizeof(s.worker_bin)) < 0 ||
      access(s.worker_bin, X_OK) != 0) {
    fprintf(stderr, "commitkv-bench soak: commitkvd and commitkv-worker must be beside this binary\n");
    return 1;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(s.dir, sizeof(s.dir), "%.60s/ckv-soak-XXXXXX", tmp && *tmp && strlen(tmp) < 60 ? tmp : "/tmp");
  if (!mkdtemp(s.dir)) return 1;
  signal(SIGPIPE, SIG_IGN);
  if (ckv_bench_daemon_start(&s.d, s.daemon, s.dir, "2G") < 0) {
    ckv_bench_rm_tree(s.dir);
    return 1;
  }
  usleep(100000);
  s.rss_start_kb = rss_kb(s.d.pid);
  for (int i = 0; i < s.workers; i++) spawn_worker(&s, i);
  ckv_client *pc = NULL;
  uint64_t start = now_ms(), end = start + (uint64_t)(s.seconds * 1000), next_kill = start + (uint64_t)s.kill_every_ms,
           next_restart = start + (uint64_t)(s.restart_every_s * 1000);
  uint64_t requests_before = 0, errors_before = 0;
  unsigned seed = 12345;
  int rc = 0;
  while (now_ms() < end) {
    probe(&s, &pc);
    for (int i = 0; i < s.workers; i++) { /* finished generations are counted and replaced */
      int st;
      if (waitpid(s.w[i].pid, &st, WNOHANG) == s.w[i].pid) {
        if (!s.w[i].killed) account(&s, &s.w[i], st);
        spawn_worker(&s, i);
      }
    }
    uint64_t t = now_ms();
    if (s.kill_every_ms > 0 && t >= next_kill) {
      int i = (int)(rand_r(&seed) % (unsigned)s.workers);
      s.w[i].killed = true;
      kill(s.w[i].pid, SIGKILL);
      s.kills++;
      next_kill = t + (uint64_t)s.kill_every_ms;
    }
    if (s.restart_every_s > 0 && t >= next_restart) {
      requests_before += s.requests, errors_before += s.daemon_errors;
      s.requests = s.daemon_errors = 0;
      kill(s.d.pid, SIGKILL);
      waitpid(s.d.pid, NULL, 0);
      /* a killed daemon leaves its socket files: the next start must be waited for, not them */
      char ipc[PATH_MAX];
      snprintf(ipc, sizeof(ipc), "%s/commitkvd.sock", s.dir);
      unlink(ipc);
      unlink(s.d.attach);
      if (pc) ckv_client_free(pc), pc = NULL;
      if (ckv_bench_daemon_start(&s.d, s.daemon, s.dir, "2G") < 0) {
        rc = 1;
        break;
      }
      s.restarts++;
      next_restart = now_ms() + (uint64_t)(s.restart_every_s * 1000);
    }
    usleep(SOAK_PROBE_MS * 1000);
  }
  /* let the live generations finish (or give up) */
  uint64_t drain_end = now_ms() + 30000;
  for (int i = 0; i < s.workers; i++) {
    int st;
    pid_t w;
    while ((w = waitpid(s.w[i].pid, &st, WNOHANG)) == 0 && now_ms() < drain_end) {
      probe(&s, &pc);
      usleep(SOAK_PROBE_MS * 1000);
    }
    if (w == 0) {
      kill(s.w[i].pid, SIGKILL);
      waitpid(s.w[i].pid, &st, 0);
      count_error(&s, "worker did not finish within 30 s of the end");
    } else if (!s.w[i].killed) {
      account(&s, &s.w[i], st);
    }
  }
  probe(&s, &pc);
  s.rss_end_kb = rss_kb(s.d.pid);
  s.requests += requests_before, s.daemon_errors += errors_before;
  if (pc) ckv_client_free(pc);
  if (ckv_bench_daemon_stop(&s.d) < 0) rc = 1;
  double p99 = 0;
  if (s.n_lat) {
    qsort(s.lat, s.n_lat, sizeof(*s.lat), cmp_u64);
    p99 = (double)s.lat[(s.n_lat * 99) / 100];
  }
  report(&s, p99);
  free(s.lat);
  ckv_bench_rm_tree(s.dir);
  if (s.bytes_lost) rc = 1;
  return rc;
}
