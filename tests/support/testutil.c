/* testutil.c - see testutil.h. */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "shm/fdpass.h"

const char *ckv_test_bin_dir(void) {
  const char *d = getenv("CKV_BIN_DIR");
  return d && *d ? d : "build/bin";
}

char *ckv_test_tmpdir(const char *prefix) {
  char *p = NULL;
  if (asprintf(&p, "/tmp/%s.XXXXXX", prefix ? prefix : "ckv") < 0) abort();
  if (!mkdtemp(p)) abort();
  return p;
}

void ckv_test_rmdir(char *dir) {
  if (!dir) return;
  if (getenv("CKV_TEST_KEEP")) { /* debugging: leave logs and sockets behind */
    fprintf(stderr, "CKV_TEST_KEEP: kept %s\n", dir);
    free(dir);
    return;
  }
  char *cmd = NULL;
  if (asprintf(&cmd, "rm -rf '%s'", dir) >= 0) {
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    free(cmd);
  }
  free(dir);
}

long long ckv_test_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

float ckv_test_kv_value(size_t pos, uint32_t layer, uint32_t kv, uint32_t e) {
  uint64_t z = ((uint64_t)pos << 20) ^ ((uint64_t)layer << 12) ^ ((uint64_t)kv << 10) ^ e;
  z = (z + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  z ^= z >> 29;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 32;
  float u = (float)(z & 0xffffff) / (float)0xffffff; /* [0,1] */
  float amp = e % 7 == 0 ? 1.0f : 0.5f;
  return amp * (2.f * u - 1.f);
}

static pid_t spawn_path(const char *path, const char *const *argv, const char *out_path) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* A test that fails an assertion ends without stopping what it started:
     * its daemons and workers follow it instead of outliving it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    if (out_path) {
      int fd = open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    execv(path, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  return pid;
}

pid_t ckv_test_spawn(const char *const *argv, const char *out_path) {
  char path[1024];
  if (argv[0][0] == '/') /* a system tool by its absolute path */
    snprintf(path, sizeof(path), "%s", argv[0]);
  else
    snprintf(path, sizeof(path), "%s/%s", ckv_test_bin_dir(), argv[0]);
  return spawn_path(path, argv, out_path);
}

/* CKV_TEST_DAEMON_WRAP=PATH: every daemon a suite starts runs through PATH
 * (e.g. tests/valgrind/commitkvd.sh, memcheck), which gets the daemon binary
 * in $CKV_DAEMON; start and stop then wait up to a minute. */
static const char *daemon_wrapper(void) {
  const char *w = getenv("CKV_TEST_DAEMON_WRAP");
  return w && *w ? w : NULL;
}

int ckv_test_wait(pid_t pid, int timeout_ms) {
  long long end = ckv_test_now_ms() + timeout_ms;
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0) return -1;
    if (ckv_test_now_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(5000);
  }
}

pid_t ckv_test_fork_as(uid_t uid, gid_t gid, ckv_test_child_fn fn, const void *ctx, size_t report_len, int *ret_fd) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    close(p[0]);
    /* A peer writing to a socket the daemon closed gets EPIPE, not death. */
    signal(SIGPIPE, SIG_IGN);
    /* The pipe carries the errno of the uid switch, then the report. */
    int switch_errno = 0;
    void *report = calloc(1, report_len ? report_len : 1);
    if (!report) _exit(3);
    if (uid && (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0))
      switch_errno = errno;
    else
      fn(ctx, report);
    int ok = write(p[1], &switch_errno, sizeof(switch_errno)) == (ssize_t)sizeof(switch_errno) &&
             write(p[1], report, report_len) == (ssize_t)report_len;
    free(report);
    _exit(ok ? 0 : 1);
  }
  close(p[1]);
  *ret_fd = p[0];
  return pid;
}

/* Reads up to len bytes (fewer only at end of file or on an error). */
static size_t read_full(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char *)buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  return got;
}

ckv_test_child ckv_test_collect(pid_t pid, int fd, void *report, size_t report_len, int timeout_ms) {
  ckv_test_child c = {0};
  memset(report, 0, report_len);
  if (read_full(fd, &c.switch_errno, sizeof(c.switch_errno)) == sizeof(c.switch_errno))
    c.got = read_full(fd, report, report_len);
  close(fd);
  c.status = ckv_test_wait(pid, timeout_ms);
  return c;
}

int ckv_test_attach_accepts(const char *path) {
  int fd = -1;
  if (ckv_unix_connect(path, &fd) != CKV_OK) return 0;
  close(fd);
  return 1;
}

int ckv_test_daemon_start(ckv_test_daemon *d, const char *const *extra) {
  memset(d, 0, sizeof(*d));
  d->dir = ckv_test_tmpdir("ckv-test");
  snprintf(d->socket, sizeof(d->socket), "ipc://%s/commitkvd.sock", d->dir);
  snprintf(d->attach, sizeof(d->attach), "%s/commitkvd.attach", d->dir);
  snprintf(d->log, sizeof(d->log), "%s/commitkvd.log", d->dir);
  /* metrics off unless a test asks (later --set wins): tests must not fight over a port */
  /* Host memory unless a test asks for another backend (a later --backend
   * wins): the CPU-side workers read blocks directly, which GPU memory forbids. */
  const char *argv[64] = {"commitkvd", "--socket", d->socket, "--attach-socket", d->attach, "--state-dir", d->dir,
                          "--set", "daemon.metrics=", "--backend", "host"};
  int n = 11;
  for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
  /* CKV_TEST_DAEMON_SET="section.key=value ...": --set options for every daemon
   * a suite starts (CTest runs some suites a second time with them). */
  static char env_set[512];
  const char *e = getenv("CKV_TEST_DAEMON_SET");
  snprintf(env_set, sizeof(env_set), "%s", e ? e : "");
  char *save = NULL;
  for (char *tok = strtok_r(env_set, " ", &save); tok && n < 61; tok = strtok_r(NULL, " ", &save)) {
    argv[n++] = "--set";
    argv[n++] = tok;
  }
  argv[n] = NULL;
  const char *wrap = daemon_wrapper();
  if (wrap) {
    char daemon[1024];
    snprintf(daemon, sizeof(daemon), "%s/commitkvd", ckv_test_bin_dir());
    setenv("CKV_DAEMON", daemon, 1);
    d->pid = spawn_path(wrap, argv, d->log);
  } else {
    d->pid = ckv_test_spawn(argv, d->log);
  }
  long long end = ckv_test_now_ms() + (wrap ? 60000 : 5000);
  struct stat st;
  while (ckv_test_now_ms() < end) {
    if (stat(d->attach, &st) == 0) return 0;
    if (!ckv_test_daemon_alive(d)) return -1;
    usleep(10000);
  }
  return -1;
}

int ckv_test_daemon_alive(const ckv_test_daemon *d) {
  if (d->pid <= 0) return 0;
  int st;
  pid_t r = waitpid(d->pid, &st, WNOHANG);
  return r == 0;
}

int ckv_test_daemon_stop(ckv_test_daemon *d) {
  int rc = -1;
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    rc = ckv_test_wait(d->pid, daemon_wrapper() ? 60000 : 5000);
    d->pid = 0;
  }
  ckv_test_rmdir(d->dir);
  d->dir = NULL;
  return rc;
}

char *ckv_test_read_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&buf, &len);
  if (!mem) {
    fclose(f);
    return NULL;
  }
  char chunk[4096];
  size_t got;
  while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0) fwrite(chunk, 1, got, mem);
  fclose(f);
  fclose(mem);
  return buf;
}

char *ckv_test_file_tail(const char *path, size_t max) {
  char *text = ckv_test_read_file(path);
  if (!text) {
    if (asprintf(&text, "(cannot read %s)\n", path) < 0) abort();
    return text;
  }
  size_t len = strlen(text);
  if (len > max) memmove(text, text + len - max, max + 1);
  return text;
}

char *ckv_test_ctl(const ckv_test_daemon *d, const char *const *args) {
  char out[400];
  snprintf(out, sizeof(out), "%s/ctl.%d.out", d->dir, (int)getpid());
  unlink(out);
  const char *argv[32] = {"commitkvctl", "--socket", d->socket, "--attach-socket", d->attach};
  int n = 5;
  for (int i = 0; args && args[i] && n < 30; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = ckv_test_spawn(argv, out);
  if (ckv_test_wait(pid, 10000) != 0) return NULL;
  return ckv_test_read_file(out);
}

/* A tiny path walker over commitkvctl's JSON: enough for tests, not a parser. */
static const char *skip_value(const char *p);

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  return p;
}

static const char *skip_string(const char *p) {
  p++;
  while (*p && *p != '"') p += (*p == '\\' && p[1]) ? 2 : 1;
  return *p ? p + 1 : p;
}

static const char *skip_value(const char *p) {
  p = skip_ws(p);
  if (*p == '"') return skip_string(p);
  if (*p == '{' || *p == '[') {
    char open = *p, close = open == '{' ? '}' : ']';
    p++;
    for (;;) {
      p = skip_ws(p);
      if (*p == close) return p + 1;
      if (!*p) return p;
      if (open == '{') {
        p = skip_string(skip_ws(p));
        p = skip_ws(p);
        if (*p == ':') p++;
      }
      p = skip_value(p);
      p = skip_ws(p);
      if (*p == ',') p++;
    }
  }
  while (*p && *p != ',' && *p != '}' && *p != ']') p++;
  return p;
}

int ckv_test_json_u64(const char *json, const char *path, unsigned long long *ret) {
  const char *p = skip_ws(json);
  char part[128];
  while (*path) {
    size_t n = strcspn(path, ".");
    if (n >= sizeof(part)) return -1;
    memcpy(part, path, n);
    part[n] = 0;
    path += n + (path[n] == '.');
    p = skip_ws(p);
    if (*p == '{') {
      p++;
      for (;;) {
        p = skip_ws(p);
        if (*p != '"') return -1;
        const char *k = p + 1, *e = skip_string(p);
        size_t klen = (size_t)(e - 1 - k);
        p = skip_ws(e);
        if (*p++ != ':') return -1;
        if (klen == strlen(part) && memcmp(k, part, klen) == 0) break;
        p = skip_ws(skip_value(p));
        if (*p == ',') p++;
        else return -1;
      }
    } else if (*p == '[') {
      long idx = strtol(part, NULL, 10);
      p++;
      for (long i = 0; i < idx; i++) {
        p = skip_ws(skip_value(p));
        if (*p == ',') p++;
        else return -1;
      }
    } else {
      return -1;
    }
  }
  p = skip_ws(p);
  char *end;
  unsigned long long v = strtoull(p, &end, 10);
  if (end == p) return -1;
  *ret = v;
  return 0;
}

int ckv_test_run_bench(const char *const *args, const char *dir, int timeout_ms, char **ret_out, char **ret_err) {
  char bin[1024], out[600], err[600];
  snprintf(bin, sizeof(bin), "%s/commitkv-bench", ckv_test_bin_dir());
  snprintf(out, sizeof(out), "%s/bench.out", dir);
  snprintf(err, sizeof(err), "%s/bench.err", dir);
  const char *argv[32];
  int n = 0;
  argv[n++] = bin;
  for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    setenv("TMPDIR", dir, 1);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  int st = ckv_test_wait(pid, timeout_ms);
  if (ret_out) *ret_out = ckv_test_read_file(out);
  if (ret_err) *ret_err = ckv_test_read_file(err);
  return st;
}
