/* bench_soak.c - commitkv-bench soak: a real commitkvd under load, with kills.
 *
 *   commitkv-bench soak [--workers N] [--sessions M] [--seconds T] [--kill-every-ms K]
 *                       [--restart-every-s R] [--daemon PATH] [--json]
 *                       [--verify-workers V] [--ids P] [--remote] [--store-outage-every-s S]
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
 * and the daemon's error replies.
 *
 * --verify-workers V adds V verifying workers (commitkv-bench soak-worker,
 * bench/soak_worker.c), killed like the others: each works on a pool of P
 * session ids (--ids, default 4), drops conversations and opens new ones on
 * the same ids, detaches and resumes them, and judges every byte the daemon
 * serves against what that conversation wrote (fp16 policy: every byte must
 * be exact).  With them the daemon runs with autosave = 300ms, the disk tier
 * (disk_idle = 1s) and a 3 s lease (a killed worker's sessions free up
 * quickly).  --remote starts a redis-server of its own on a free loopback
 * port (append-only file, fsync always: values survive its kills) and gives
 * the daemon the remote tier (remote_idle = 1s); --store-outage-every-s S
 * kills it with SIGKILL every S seconds and starts it again on the same port
 * S/3 seconds (at most 3 s) later.  The verifying workers' counters
 * (soak_worker.h) join the output: wrong_bytes, stale_served and
 * ended_served must be 0; bytes_verified is then both kinds of workers'
 * bytes, reuse_bytes_verified the verifying workers' part; store_outages,
 * and the remote tier's offloads, restores and errors over the daemon's
 * lives. */
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

#include <hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "bench/bench_systemd.h"
#include "bench/soak_worker.h"
#include "client/rpc.h"
#include "commitkv/commitkv.h"

#define SOAK_MAX_WORKERS 64
#define SOAK_ROUNDS 20            /* rounds of one worker generation */
#define SOAK_PROBE_MS 10
#define SOAK_MAX_ERROR_KINDS 16
#define SOAK_VERIFY_STEPS "150"   /* steps of one verifying worker generation */
#define SOAK_REDIS "/usr/bin/redis-server"
#define SOAK_OUTAGE_MAX_MS 3000
#define SOAK_MAX_DAEMON_KILLS 256 /* --kill-daemon-every-s: per-kill rows kept */
#define SOAK_ANOMALY_LINES 20     /* lines of each verifying worker's log shown at the end */

typedef struct soak_worker {
  pid_t pid;
  int gen;
  bool killed; /* by us: its output does not count */
  bool verify; /* a verifying worker (soak_worker.c) */
  char out[PATH_MAX];
} soak_worker;

typedef struct soak {
  int workers, sessions, verify_workers, ids;
  double seconds, restart_every_s, outage_every_s;
  long kill_every_ms;
  bool json, remote;
  const char *daemon_opt;
  char daemon[PATH_MAX], worker_bin[PATH_MAX], self[PATH_MAX], dir[128], life[PATH_MAX];
  ckv_bench_daemon d;
  soak_worker w[SOAK_MAX_WORKERS]; /* the reference workers, then the verifying ones */
  pid_t store_pid;
  int store_port;
  char store_set[96];
  uint64_t store_outages;
  uint64_t remote_offloads, remote_restores, remote_errors; /* this daemon life's */
  uint64_t remote_before[3];                                 /* the earlier lives' */
  ckv_soak_counters vc;                                      /* the verifying workers' */
  uint64_t kills, restarts, requests, daemon_errors, probes;
  uint64_t bytes_verified, bytes_lost, generations_ok, generations_failed;
  uint64_t *lat;
  size_t n_lat, cap_lat;
  long rss_start_kb, rss_end_kb;
  uint64_t arena_used_end;
  char err_name[SOAK_MAX_ERROR_KINDS][64];
  uint64_t err_count[SOAK_MAX_ERROR_KINDS];
  int n_err;
  /* --kill-daemon-every-s: commitkvd under a private systemd --user (bench_systemd.h), SIGKILLed, restarted by
   * systemd with its arenas from the fd store; per kill what the new daemon's warm restart kept and dropped */
  double kill_daemon_every_s;
  ckv_bench_sd sd;
  int n_dkills;
  struct {
    long kept, dropped;   /* the new daemon's "warm restart: N session(s) kept, M dropped"; -1: it said none */
    double restart_ms;    /* SIGKILL to a new main pid whose attach socket accepts */
  } dk[SOAK_MAX_DAEMON_KILLS];
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

/* The daemon's life (restarts so far) for the verifying workers: written
 * whole (temporary file, rename) after each start. */
static void write_life(const soak *s) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof(tmp), "%s.tmp", s->life);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%llu\n", (unsigned long long)s->restarts);
  if (fclose(f) == 0) rename(tmp, s->life);
}

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

/* Starts the store (again) on s->store_port and waits for its PING; its data
 * (append-only file, fsync always) in DIR/redis survives a SIGKILL. */
static int store_start(soak *s) {
  char port[16], dir[PATH_MAX];
  snprintf(port, sizeof(port), "%d", s->store_port);
  snprintf(dir, sizeof(dir), "%.100s/redis", s->dir);
  mkdir(dir, 0700);
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a killed bench leaves no store behind */
    if (chdir(dir) != 0) _exit(126);
    int fd = open("redis.log", O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl(SOAK_REDIS, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
          "--appendfsync", "always", "--daemonize", "no", (char *)NULL);
    _exit(127);
  }
  s->store_pid = pid;
  for (uint64_t end = now_ms() + 10000; now_ms() < end; usleep(20000)) {
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->store_port, (struct timeval){0, 200000});
    redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    if (ok) return 0;
    if (waitpid(pid, NULL, WNOHANG) == pid) break;
  }
  fprintf(stderr, "commitkv-bench soak: redis-server did not answer on port %d (log %s/redis.log)\n", s->store_port,
          dir);
  return -ETIMEDOUT;
}

static void store_kill(soak *s) {
  if (s->store_pid <= 0) return;
  kill(s->store_pid, SIGKILL);
  waitpid(s->store_pid, NULL, 0);
  s->store_pid = 0;
}

/* The daemon's settings for the verifying workers and the remote tier. */
static void daemon_sets(soak *s) {
  size_t n = 0;
  if (s->verify_workers) {
    s->d.sets[n++] = "daemon.autosave=300ms";
    s->d.sets[n++] = "daemon.lease=3s";
    s->d.sets[n++] = "daemon.heartbeat=1s";
    s->d.sets[n++] = "daemon.disk_memory=256M";
    s->d.sets[n++] = "daemon.disk_idle=1s";
  }
  if (s->remote) {
    snprintf(s->store_set, sizeof(s->store_set), "daemon.remote=redis://127.0.0.1:%d", s->store_port);
    s->d.sets[n++] = s->store_set;
    s->d.sets[n++] = "daemon.remote_idle=1s";
    s->d.sets[n++] = "daemon.remote_timeout=1s";
    s->d.sets[n++] = "daemon.remote_allow_no_auth=yes"; /* a private store on loopback */
  }
  s->d.sets[n] = NULL;
}

/* Sums the verifying workers' state files (soak_worker.h) and shows what
 * their logs say went wrong. */
static void collect_verify(soak *s) {
  for (int i = s->workers; i < s->workers + s->verify_workers; i++) {
    char path[PATH_MAX], line[512];
    snprintf(path, sizeof(path), "%.100s/v%d.state", s->dir, i);
    ckv_soak_state st;
    FILE *f = fopen(path, "rb");
    if (f && fread(&st, sizeof st, 1, f) == 1 && st.magic == CKV_SOAK_MAGIC) {
#define CKV_SOAK_SUM_(name, doc) s->vc.name += st.c.name;
      CKV_SOAK_COUNTERS(CKV_SOAK_SUM_)
#undef CKV_SOAK_SUM_
    }
    if (f) fclose(f);
    snprintf(path, sizeof(path), "%.100s/v%d.log", s->dir, i);
    f = fopen(path, "r");
    for (int n = 0; f && fgets(line, sizeof(line), f); n++)
      if (n < SOAK_ANOMALY_LINES) fprintf(stderr, "commitkv-bench soak: v%d: %s", i, line);
    if (f) fclose(f);
  }
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
  char state[PATH_MAX], log[PATH_MAX], ids[16];
  snprintf(state, sizeof(state), "%.100s/v%d.state", s->dir, i); /* the ids are v<i>-0 .. */
  snprintf(log, sizeof(log), "%.100s/v%d.log", s->dir, i);
  snprintf(ids, sizeof(ids), "%d", s->ids);
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(w->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (w->verify)
      execl(s->self, s->self, "soak-worker", "--socket", s->d.socket, "--attach-socket", s->d.attach, "--state", state,
            "--log", log, "--life", s->life, "--ids", ids, "--steps", SOAK_VERIFY_STEPS, "--seed", seed, (char *)NULL);
    else
      execl(s->worker_bin, s->worker_bin, "--socket", s->d.socket, "--attach-socket", s->d.attach, "--sessions",
            sessions, "--rounds", rounds, "--tokens", "16", "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
            "--seed", seed, "--prefix", prefix, "--reconnect-timeout-ms", "15000", "--quiet", (char *)NULL);
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
    if (s->generations_failed <= 5) /* say how, once in a while: the directory goes at the end */
      fprintf(stderr, "commitkv-bench soak: %s failed (%s %d): %s", w->out, WIFEXITED(status) ? "exit" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), last[0] ? last : "(no output)\n");
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
    for (size_t t = 0; t < rep->stats->n_tiers; t++)
      if (!strcmp(rep->stats->tiers[t]->tier, "remote")) {
        s->remote_offloads = rep->stats->tiers[t]->offloads;
        s->remote_restores = rep->stats->tiers[t]->restores;
      }
    if (rep->stats->remote) s->remote_errors = rep->stats->remote->errors;
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
                                     {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
                                     {"verify-workers", required_argument, 0, 'v'}, {"ids", required_argument, 0, 'i'},
                                     {"remote", no_argument, 0, 'R'},
                                     {"store-outage-every-s", required_argument, 0, 'o'},
                                     {"kill-daemon-every-s", required_argument, 0, 'K'},
                                     {0, 0, 0, 0}};
  s->workers = 4, s->sessions = 2, s->seconds = 10, s->kill_every_ms = 700, s->restart_every_s = 4, s->ids = 4;
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
      case 'v': s->verify_workers = atoi(optarg); break;
      case 'i': s->ids = atoi(optarg); break;
      case 'R': s->remote = true; break;
      case 'o': s->outage_every_s = atof(optarg); break;
      case 'K': s->kill_daemon_every_s = atof(optarg); break;
      default:
        fprintf(ch == 'h' ? stdout : stderr,
                "usage: commitkv-bench soak [--workers N] [--sessions M] [--seconds T] [--kill-every-ms K]\n"
                "                           [--restart-every-s R] [--daemon PATH] [--json]\n"
                "                           [--verify-workers V] [--ids P] [--remote] [--store-outage-every-s S]\n"
                "                           [--kill-daemon-every-s N]\n"
                "  K = 0: no worker kills; R = 0: no daemon restarts; V verifying workers on P ids each;\n"
                "  --remote: a redis-server of its own as the remote tier, killed every S seconds;\n"
                "  N: commitkvd under a private systemd --user (fd store, Restart=on-failure), SIGKILLed every N\n"
                "     seconds instead of R (sessions kept / dropped per kill; skipped without systemd --user)\n");
        return ch == 'h' ? 1 : -1;
    }
  }
  if (s->workers < 0 || s->verify_workers < 0 || s->workers + s->verify_workers < 1 ||
      s->workers + s->verify_workers > SOAK_MAX_WORKERS || s->sessions < 1 || s->sessions > 64 ||
      s->ids < 1 || s->ids > CKV_SOAK_MAX_IDS || !(s->seconds > 0) || s->kill_every_ms < 0 ||
      s->restart_every_s < 0 || s->outage_every_s < 0 || (s->outage_every_s > 0 && !s->remote) ||
      s->kill_daemon_every_s < 0) {
    fprintf(stderr,
            "commitkv-bench soak: --workers + --verify-workers 1..%d, --sessions 1..64, --ids 1..%d, --seconds > 0, "
            "--store-outage-every-s with --remote\n",
            SOAK_MAX_WORKERS, CKV_SOAK_MAX_IDS);
    return -1;
  }
  if (s->kill_daemon_every_s > 0) s->restart_every_s = 0; /* systemd restarts it, not the bench */
  return 0;
}

/* Occurrences of the warm restart's outcome line in the daemon's log so far;
 * the last one's counts go to *kept / *dropped. */
static int warm_lines(const char *log, long *kept, long *dropped) {
  FILE *f = fopen(log, "r");
  if (!f) return 0;
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "warm restart: ");
    long k, d;
    if (p && sscanf(p, "warm restart: %ld session(s) kept, %ld dropped", &k, &d) == 2) n++, *kept = k, *dropped = d;
  }
  fclose(f);
  return n;
}

/* SIGKILL of the unit's daemon; systemd restarts it from its fd store.  0, or -1 when it did not come back. */
static int kill_daemon_sd(soak *s) {
  long k = -1, d = -1;
  int before = warm_lines(s->sd.log, &k, &d);
  pid_t old = ckv_bench_sd_main_pid(&s->sd);
  if (old <= 0) return -1;
  uint64_t t0 = now_us();
  kill(old, SIGKILL);
  pid_t pid = ckv_bench_sd_wait_restart(&s->sd, old, 30000);
  if (pid <= 0) {
    fprintf(stderr, "commitkv-bench soak: systemd did not restart commitkvd after kill -9 (log %s)\n", s->sd.log);
    return -1;
  }
  double ms = (double)(now_us() - t0) / 1000.0;
  s->d.pid = pid;
  /* the outcome is logged while the daemon starts; give the log a moment (the journal's outcome line is absent when
   * the new daemon found no journal: then the row says -1) */
  k = d = -1;
  int after;
  uint64_t until = now_ms() + 3000;
  while ((after = warm_lines(s->sd.log, &k, &d)) <= before && now_ms() < until) usleep(20000);
  if (after <= before)
    fprintf(stderr, "commitkv-bench soak: the daemon restarted after kill %d logged no warm-restart outcome (log %s)\n",
            s->n_dkills + 1, s->sd.log);
  if (s->n_dkills < SOAK_MAX_DAEMON_KILLS) {
    s->dk[s->n_dkills].kept = after > before ? k : -1;
    s->dk[s->n_dkills].dropped = after > before ? d : -1;
    s->dk[s->n_dkills].restart_ms = ms;
  }
  s->n_dkills++;
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
           (unsigned long long)(s->bytes_verified + s->vc.bytes_verified), (unsigned long long)s->bytes_lost,
           s->rss_start_kb, s->rss_end_kb, (unsigned long long)s->arena_used_end, (unsigned long long)s->daemon_errors);
    for (int i = 0; i < s->n_err; i++) {
      printf(", \"");
      for (const char *c = s->err_name[i]; *c; c++) putchar(*c == '"' || *c == '\\' ? '\'' : *c);
      printf("\": %llu", (unsigned long long)s->err_count[i]);
    }
    printf("}, \"verify_workers\": %d, \"ids\": %d, \"reuse_bytes_verified\": %llu", s->verify_workers,
           s->verify_workers * s->ids, (unsigned long long)s->vc.bytes_verified);
#define CKV_SOAK_JSON_(name, doc) \
  if (strcmp(#name, "bytes_verified")) printf(", \"%s\": %llu", #name, (unsigned long long)s->vc.name);
    CKV_SOAK_COUNTERS(CKV_SOAK_JSON_)
#undef CKV_SOAK_JSON_
    printf(", \"store_outages\": %llu, \"remote_offloads\": %llu, \"remote_restores\": %llu, "
           "\"remote_errors\": %llu",
           (unsigned long long)s->store_outages, (unsigned long long)s->remote_offloads,
           (unsigned long long)s->remote_restores, (unsigned long long)s->remote_errors);
    if (s->kill_daemon_every_s > 0) {
      long kept = 0, dropped = 0, unknown = 0;
      int rows = s->n_dkills < SOAK_MAX_DAEMON_KILLS ? s->n_dkills : SOAK_MAX_DAEMON_KILLS;
      for (int i = 0; i < rows; i++)
        if (s->dk[i].kept < 0) unknown++;
        else kept += s->dk[i].kept, dropped += s->dk[i].dropped;
      printf(", \"kill_daemon_every_s\": %.1f, \"daemon_kills\": %d, \"sessions_kept\": %ld, "
             "\"sessions_dropped\": %ld, \"kills_without_outcome\": %ld, \"per_daemon_kill\": [",
             s->kill_daemon_every_s, s->n_dkills, kept, dropped, unknown);
      for (int i = 0; i < rows; i++)
        printf("%s{\"sessions_kept\": %ld, \"sessions_dropped\": %ld, \"restart_ms\": %.1f}", i ? ", " : "",
               s->dk[i].kept, s->dk[i].dropped, s->dk[i].restart_ms);
      printf("]");
    }
    printf("}\n");
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
  if (s->verify_workers) {
    printf("%d verifying workers x %d ids, the store killed every %.1f s (%llu outages); remote tier: %llu offloads, "
           "%llu restores, %llu errors\n",
           s->verify_workers, s->ids, s->outage_every_s, (unsigned long long)s->store_outages,
           (unsigned long long)s->remote_offloads, (unsigned long long)s->remote_restores,
           (unsigned long long)s->remote_errors);
#define CKV_SOAK_ROW_(name, doc) printf("  %-22s %14llu  %s\n", #name, (unsigned long long)s->vc.name, doc);
    CKV_SOAK_COUNTERS(CKV_SOAK_ROW_)
#undef CKV_SOAK_ROW_
  }
  if (s->kill_daemon_every_s > 0) {
    printf("commitkvd under systemd --user, SIGKILLed every %.1f s: %d kills; per kill, the new daemon's warm "
           "restart kept / dropped sessions (restart ms):",
           s->kill_daemon_every_s, s->n_dkills);
    for (int i = 0; i < s->n_dkills && i < SOAK_MAX_DAEMON_KILLS; i++)
      if (s->dk[i].kept < 0)
        printf(" ?/? (%.0f)", s->dk[i].restart_ms);
      else
        printf(" %ld/%ld (%.0f)", s->dk[i].kept, s->dk[i].dropped, s->dk[i].restart_ms);
    printf("\n");
  }
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
      access(s.worker_bin, X_OK) != 0 || ckv_bench_beside_self("commitkv-bench", s.self, sizeof(s.self)) < 0) {
    fprintf(stderr, "commitkv-bench soak: commitkvd and commitkv-worker must be beside this binary\n");
    return 1;
  }
  if (s.remote && access(SOAK_REDIS, X_OK) != 0) {
    fprintf(stderr, "commitkv-bench soak: --remote needs %s (make deps installs it)\n", SOAK_REDIS);
    return 1;
  }
  const int n_workers = s.workers + s.verify_workers;
  for (int i = s.workers; i < n_workers; i++) s.w[i].verify = true;
  const char *tmp = getenv("TMPDIR");
  snprintf(s.dir, sizeof(s.dir), "%.60s/ckv-soak-XXXXXX", tmp && *tmp && strlen(tmp) < 60 ? tmp : "/tmp");
  if (!mkdtemp(s.dir)) return 1;
  snprintf(s.life, sizeof(s.life), "%s/daemon.life", s.dir);
  signal(SIGPIPE, SIG_IGN);
  if (s.remote && ((s.store_port = free_port()) < 0 || store_start(&s) < 0)) {
    ckv_bench_rm_tree(s.dir);
    return 1;
  }
  daemon_sets(&s);
  if (s.kill_daemon_every_s > 0) { /* the same daemon arguments, as a unit of a private systemd --user */
    snprintf(s.sd.dir, sizeof s.sd.dir, "%.100s/sd", s.dir);
    mkdir(s.sd.dir, 0755);
    snprintf(s.sd.daemon, sizeof s.sd.daemon, "%s", s.daemon);
    size_t at = (size_t)snprintf(s.sd.extra, sizeof s.sd.extra, "--memory 2G");
    for (int i = 0; s.d.sets[i] && at < sizeof s.sd.extra; i++)
      at += (size_t)snprintf(s.sd.extra + at, sizeof s.sd.extra - at, " --set %s", s.d.sets[i]);
    char why[1024];
    int st = ckv_bench_sd_start(&s.sd, "ckvsoak", why, sizeof why);
    if (st != 0) {
      for (char *c = why; *c; c++)
        if (*c == '"' || *c == '\\') *c = ' ';
      if (s.json)
        printf("{\"skipped\": %s, \"reason\": \"%s\"}\n", st > 0 ? "true" : "false", why);
      else
        printf("soak --kill-daemon-every-s: %s: %s\n", st > 0 ? "SKIPPED" : "FAILED", why);
      store_kill(&s);
      ckv_bench_rm_tree(s.dir);
      return st > 0 ? 0 : 1;
    }
    snprintf(s.d.socket, sizeof s.d.socket, "%s", s.sd.socket);
    snprintf(s.d.attach, sizeof s.d.attach, "%s", s.sd.attach);
    snprintf(s.d.log, sizeof s.d.log, "%s", s.sd.log);
    s.d.pid = ckv_bench_sd_main_pid(&s.sd);
  } else if (ckv_bench_daemon_start(&s.d, s.daemon, s.dir, "2G") < 0) {
    store_kill(&s);
    ckv_bench_rm_tree(s.dir);
    return 1;
  }
  write_life(&s);
  usleep(100000);
  s.rss_start_kb = rss_kb(s.d.pid);
  for (int i = 0; i < n_workers; i++) spawn_worker(&s, i);
  ckv_client *pc = NULL;
  uint64_t start = now_ms(), end = start + (uint64_t)(s.seconds * 1000), next_kill = start + (uint64_t)s.kill_every_ms,
           next_restart = start + (uint64_t)(s.restart_every_s * 1000),
           next_outage = start + (uint64_t)(s.outage_every_s * 1000), store_back = 0,
           next_dkill = start + (uint64_t)(s.kill_daemon_every_s * 1000);
  uint64_t outage_ms = (uint64_t)(s.outage_every_s * 1000 / 3);
  if (outage_ms > SOAK_OUTAGE_MAX_MS) outage_ms = SOAK_OUTAGE_MAX_MS;
  uint64_t requests_before = 0, errors_before = 0;
  unsigned seed = 12345;
  int rc = 0;
  while (now_ms() < end) {
    probe(&s, &pc);
    for (int i = 0; i < n_workers; i++) { /* finished generations are counted and replaced */
      int st;
      if (waitpid(s.w[i].pid, &st, WNOHANG) == s.w[i].pid) {
        if (!s.w[i].killed) account(&s, &s.w[i], st);
        spawn_worker(&s, i);
      }
    }
    uint64_t t = now_ms();
    if (s.kill_every_ms > 0 && t >= next_kill) {
      int i = (int)(rand_r(&seed) % (unsigned)n_workers);
      s.w[i].killed = true;
      kill(s.w[i].pid, SIGKILL);
      s.kills++;
      next_kill = t + (uint64_t)s.kill_every_ms;
    }
    if (s.restart_every_s > 0 && t >= next_restart) {
      requests_before += s.requests, errors_before += s.daemon_errors;
      s.requests = s.daemon_errors = 0;
      s.remote_before[0] += s.remote_offloads, s.remote_before[1] += s.remote_restores,
          s.remote_before[2] += s.remote_errors;
      s.remote_offloads = s.remote_restores = s.remote_errors = 0;
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
      write_life(&s);
      next_restart = now_ms() + (uint64_t)(s.restart_every_s * 1000);
    }
    if (s.kill_daemon_every_s > 0 && t >= next_dkill) {
      requests_before += s.requests, errors_before += s.daemon_errors;
      s.requests = s.daemon_errors = 0;
      s.remote_before[0] += s.remote_offloads, s.remote_before[1] += s.remote_restores,
          s.remote_before[2] += s.remote_errors;
      s.remote_offloads = s.remote_restores = s.remote_errors = 0;
      if (pc) ckv_client_free(pc), pc = NULL;
      if (kill_daemon_sd(&s) < 0) {
        rc = 1;
        break;
      }
      s.restarts++;
      write_life(&s);
      next_dkill = now_ms() + (uint64_t)(s.kill_daemon_every_s * 1000);
    }
    if (s.outage_every_s > 0 && t >= next_outage && !store_back) { /* the store goes away, its data kept */
      store_kill(&s);
      s.store_outages++;
      store_back = t + outage_ms;
    }
    if (store_back && now_ms() >= store_back) {
      if (store_start(&s) < 0) {
        rc = 1;
        break;
      }
      store_back = 0;
      next_outage = now_ms() + (uint64_t)(s.outage_every_s * 1000);
    }
    usleep(SOAK_PROBE_MS * 1000);
  }
  /* let the live generations finish (or give up) */
  uint64_t drain_end = now_ms() + 30000;
  if (store_back && store_start(&s) < 0) rc = 1; /* the workers finish with the store there */
  for (int i = 0; i < n_workers; i++) {
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
  if (s.kill_daemon_every_s > 0 ? ckv_bench_sd_stop(&s.sd) < 0 : ckv_bench_daemon_stop(&s.d) < 0) rc = 1;
  if (s.kill_daemon_every_s > 0 && ckv_bench_sd_sanitizer_reports(&s.sd) > 0) {
    fprintf(stderr, "commitkv-bench soak: sanitizer reports in the daemon log:\n%s\n", ckv_bench_file_tail(s.sd.log, 1000));
    rc = 1;
  }
  store_kill(&s);
  s.remote_offloads += s.remote_before[0], s.remote_restores += s.remote_before[1],
      s.remote_errors += s.remote_before[2];
  collect_verify(&s);
  double p99 = 0;
  if (s.n_lat) {
    qsort(s.lat, s.n_lat, sizeof(*s.lat), cmp_u64);
    p99 = (double)s.lat[(s.n_lat * 99) / 100];
  }
  report(&s, p99);
  free(s.lat);
  ckv_bench_rm_tree(s.dir);
  if (s.bytes_lost || s.vc.wrong_bytes || s.vc.stale_served || s.vc.ended_served) rc = 1;
  return rc;
}
