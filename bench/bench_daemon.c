/* bench_daemon.c - see bench_daemon.h. */
#include "bench/bench_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/rpc.h"

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

void ckv_bench_rm_tree(const char *dir) {
  if (dir && *dir) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int ckv_bench_beside_self(const char *prog, char *buf, size_t len) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n < 0) return -errno;
  self[n] = 0;
  char *slash = strrchr(self, '/');
  if (slash) *slash = 0;
  if ((size_t)snprintf(buf, len, "%s/%s", self, prog) >= len) return -ENAMETOOLONG;
  return 0;
}

int ckv_bench_find_daemon(const char *given, char *buf, size_t len) {
  if (given) {
    snprintf(buf, len, "%s", given);
  } else {
    int r = ckv_bench_beside_self("commitkvd", buf, len);
    if (r < 0) {
      fprintf(stderr, "commitkv-bench: cannot locate commitkvd beside this binary: %s\n", strerror(-r));
      return r;
    }
  }
  if (access(buf, X_OK) != 0) {
    int e = errno;
    fprintf(stderr, "commitkv-bench: no commitkvd at %s (%s); build it or pass --daemon PATH\n", buf, strerror(e));
    return -ENOENT;
  }
  return 0;
}

void ckv_bench_daemon_log_tail(ckv_bench_daemon *d) {
  if (d->log_shown) return;
  d->log_shown = true;
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  char buf[4096];
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0, SEEK_SET);
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = 0;
  fclose(f);
  if (n) fprintf(stderr, "commitkv-bench: --- end of %s ---\n%s", d->log, buf);
}

int ckv_bench_daemon_start(ckv_bench_daemon *d, const char *path, const char *dir, const char *memory) {
  snprintf(d->socket, sizeof(d->socket), "ipc://%.100s/commitkvd.sock", dir);
  snprintf(d->attach, sizeof(d->attach), "%.100s/commitkvd.attach", dir);
  snprintf(d->log, sizeof(d->log), "%.100s/commitkvd.log", dir);
  char state[PATH_MAX];
  snprintf(state, sizeof(state), "%.100s/state", dir);
  pid_t parent = getpid();
  d->pid = fork();
  if (d->pid < 0) {
    int e = errno;
    fprintf(stderr, "commitkv-bench: fork: %s\n", strerror(e));
    return -e;
  }
  if (d->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* a killed bench leaves no daemon behind */
    if (getppid() != parent) _exit(127);
    int null = open("/dev/null", O_RDONLY);
    int log = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null >= 0) dup2(null, 0);
    if (log >= 0) {
      dup2(log, 1);
      dup2(log, 2);
    }
    unsetenv("JOURNAL_STREAM"); /* log into the file, not the journal */
    char *argv[48] = {(char *)path, "--backend", (char *)(d->backend ? d->backend : "host"),  "--socket",    d->socket,          "--attach-socket",
                    d->attach,    "--memory",  (char *)memory, "--state-dir", state, "--set", "daemon.metrics=",
                    NULL};
    int argc = 13;
    for (size_t i = 0; i < sizeof d->sets / sizeof d->sets[0] && d->sets[i]; i++) {
      argv[argc++] = "--set";
      argv[argc++] = (char *)d->sets[i];
    }
    argv[argc] = NULL;
    execv(path, argv);
    fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  long long end = now_ms() + CKV_BENCH_DAEMON_START_MS;
  while (now_ms() < end) {
    struct stat st;
    if (stat(d->attach, &st) == 0 && S_ISSOCK(st.st_mode)) return 0;
    int status;
    if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
      d->pid = 0;
      fprintf(stderr, "commitkv-bench: commitkvd (%s) exited during start-up (status %d)\n", path,
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
      ckv_bench_daemon_log_tail(d);
      return -ECHILD;
    }
    usleep(5000);
  }
  fprintf(stderr, "commitkv-bench: commitkvd did not create %s within %d ms\n", d->attach,
          CKV_BENCH_DAEMON_START_MS);
  ckv_bench_daemon_log_tail(d);
  return -ETIMEDOUT;
}

int ckv_bench_daemon_stop(ckv_bench_daemon *d) {
  if (d->pid <= 0) return 0;
  kill(d->pid, SIGTERM);
  long long end = now_ms() + CKV_BENCH_DAEMON_STOP_MS;
  int status = 0;
  pid_t r;
  while ((r = waitpid(d->pid, &status, WNOHANG)) == 0 && now_ms() < end) usleep(5000);
  if (r == 0) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &status, 0);
    fprintf(stderr, "commitkv-bench: commitkvd ignored SIGTERM for %d ms; killed\n", CKV_BENCH_DAEMON_STOP_MS);
    d->pid = 0;
    ckv_bench_daemon_log_tail(d);
    return -ETIMEDOUT;
  }
  d->pid = 0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "commitkv-bench: commitkvd exited with %s %d after SIGTERM\n",
            WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    ckv_bench_daemon_log_tail(d);
    return -ECHILD;
  }
  return 0;
}

int ckv_bench_compress_stats(ckv_client *c, uint64_t *ret_pending_tokens, uint64_t *ret_queue, uint64_t *ret_busy_us) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  if (r < 0) return r;
  if (ret_pending_tokens) *ret_pending_tokens = rep->stats ? rep->stats->pending_tokens : 0;
  if (ret_queue) *ret_queue = rep->stats ? rep->stats->compress_queue : 0;
  if (ret_busy_us) *ret_busy_us = rep->stats ? rep->stats->compress_busy_us : 0;
  ckv_rpc_free(rep);
  return 0;
}
