/* bench_systemd.c - a private `systemd --user` for the benchmarks that kill
 * commitkvd and need systemd's restart and fd store (issue 43: failover,
 * soak --kill-daemon-every-s).  The manager runs in a mount namespace of its
 * own where /run/systemd/system exists (systemd 252 refuses --user
 * otherwise), with XDG_RUNTIME_DIR and XDG_CONFIG_HOME in the bench's
 * directory; it is driven with `systemctl --user` over its private socket,
 * as tests/support/warmcheck.c does.  Diagnostics go to stderr. */
#include "bench/bench_systemd.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *find_exe(const char *const *candidates) {
  for (int i = 0; candidates[i]; i++)
    if (access(candidates[i], X_OK) == 0) return candidates[i];
  return NULL;
}

static const char *systemd_bin(void) {
  return find_exe((const char *const[]){"/lib/systemd/systemd", "/usr/lib/systemd/systemd", NULL});
}

static const char *systemctl_bin(void) {
  return find_exe((const char *const[]){"/usr/bin/systemctl", "/bin/systemctl", NULL});
}

/* `systemctl --user ARGS` against the private manager; its exit status (-1: did not run). */
static int ctl(const ckv_bench_sd *e, const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "XDG_RUNTIME_DIR=%s %s --user %s >>%s/systemctl.log 2>&1", e->xdg, systemctl_bin(), args,
           e->dir);
  int r = system(cmd);
  return r == -1 || !WIFEXITED(r) ? -1 : WEXITSTATUS(r);
}

int ckv_bench_sd_ctl_unit(const ckv_bench_sd *e, const char *verb) {
  char args[200];
  snprintf(args, sizeof args, "%s %s", verb, e->unit);
  return ctl(e, args);
}

pid_t ckv_bench_sd_main_pid(const ckv_bench_sd *e) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "XDG_RUNTIME_DIR=%s %s --user show -p MainPID --value %s 2>/dev/null", e->xdg,
           systemctl_bin(), e->unit);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  long pid = 0;
  if (fscanf(p, "%ld", &pid) != 1) pid = 0;
  pclose(p);
  return (pid_t)pid;
}

/* The manager's child: a mount namespace where /run/systemd/system exists
 * (our own directory bound over /run/systemd), then systemd --user. */
static void manager_child(const ckv_bench_sd *e) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char fakerun[PATH_MAX + 16], log[PATH_MAX + 16];
  snprintf(fakerun, sizeof fakerun, "%s/fakerun", e->dir);
  snprintf(log, sizeof log, "%s/manager.log", e->dir);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
  }
  if (unshare(CLONE_NEWNS) < 0) {
    fprintf(stderr, "unshare(CLONE_NEWNS): %s\n", strerror(errno));
    _exit(97);
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
    fprintf(stderr, "mount --make-rprivate /: %s\n", strerror(errno));
    _exit(97);
  }
  mkdir("/run/systemd", 0755);
  if (mount(fakerun, "/run/systemd", NULL, MS_BIND, NULL) < 0) {
    fprintf(stderr, "mount --bind %s /run/systemd: %s\n", fakerun, strerror(errno));
    _exit(97);
  }
  mkdir("/run/systemd/system", 0755);
  setenv("XDG_RUNTIME_DIR", e->xdg, 1);
  setenv("XDG_CONFIG_HOME", e->cfg, 1);
  execl(systemd_bin(), "systemd", "--user", (char *)NULL);
  fprintf(stderr, "exec %s: %s\n", systemd_bin(), strerror(errno));
  _exit(97);
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  fputs(text, f);
  return fclose(f) == 0 ? 0 : -errno;
}

/* The last `max` bytes of a file, for a reason (static buffer). */
const char *ckv_bench_file_tail(const char *path, size_t max) {
  static char buf[1024];
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return "(no log)";
  if (max >= sizeof buf) max = sizeof buf - 1;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, len > (long)max ? len - (long)max : 0, SEEK_SET);
  size_t n = fread(buf, 1, max, f);
  buf[n] = 0;
  fclose(f);
  for (char *p = buf; *p; p++)
    if (*p == '\n' || *p == '"' || *p == '\\') *p = ' ';
  return buf;
}

int ckv_bench_sd_stop(ckv_bench_sd *e) {
  pid_t daemon = e->manager ? ckv_bench_sd_main_pid(e) : 0;
  int rc = 0;
  if (e->manager) {
    if (ckv_bench_sd_ctl_unit(e, "stop") != 0) rc = -1;
    ctl(e, "exit");
    long long end = now_ms() + 10000;
    int st;
    while (waitpid(e->manager, &st, WNOHANG) != e->manager) {
      if (now_ms() > end) {
        kill(e->manager, SIGKILL);
        waitpid(e->manager, &st, 0);
        break;
      }
      usleep(20000);
    }
    e->manager = 0;
  }
  if (daemon > 0 && kill(daemon, 0) == 0) {
    fprintf(stderr, "commitkv-bench: commitkvd %d outlived its unit; killed\n", (int)daemon);
    kill(daemon, SIGKILL);
    rc = -2;
  }
  return rc;
}

/* Starts the manager and the unit.  0; 1 with `why` when no private systemd
 * can run here (a skip); -1 with `why` on a failure of a manager that did run. */
int ckv_bench_sd_start(ckv_bench_sd *e, const char *unit_prefix, char *why, size_t whylen) {
  if (geteuid() != 0) {
    snprintf(why, whylen, "not root: a private systemd --user needs a mount namespace of its own");
    return 1;
  }
  if (!systemd_bin() || !systemctl_bin()) {
    snprintf(why, whylen, "no systemd or systemctl binary");
    return 1;
  }
  char p[PATH_MAX + 64];
  snprintf(e->xdg, sizeof e->xdg, "%s/xdg", e->dir);
  snprintf(e->cfg, sizeof e->cfg, "%s/cfg", e->dir);
  snprintf(e->state, sizeof e->state, "%s/state", e->dir);
  snprintf(e->socket, sizeof e->socket, "ipc://%s/commitkvd.sock", e->dir);
  snprintf(e->attach, sizeof e->attach, "%s/commitkvd.attach", e->dir);
  snprintf(e->log, sizeof e->log, "%s/commitkvd.log", e->dir);
  snprintf(e->unit, sizeof e->unit, "%.30s-%ld.service", unit_prefix, (long)getpid());
  mkdir(e->xdg, 0700);
  mkdir(e->cfg, 0700);
  mkdir(e->state, 0700);
  snprintf(p, sizeof p, "%s/systemd", e->cfg);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/systemd/user", e->cfg);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/fakerun", e->dir);
  mkdir(p, 0755);
  char asan[600] = "", env[600] = "", pre[PATH_MAX + 32] = "", unit[14336], journal[96] = "";
  if (e->journal) snprintf(journal, sizeof journal, " --set daemon.warm_journal=%.60s", e->journal);
  const char *ao = getenv("ASAN_OPTIONS");
  if (ao && *ao && strlen(ao) < 500) snprintf(asan, sizeof asan, "Environment=\"ASAN_OPTIONS=%s\"\n", ao);
  if (e->environment && *e->environment) snprintf(env, sizeof env, "Environment=\"%.500s\"\n", e->environment);
  if (e->exec_start_pre) snprintf(pre, sizeof pre, "ExecStartPre=%.*s\n", PATH_MAX, e->exec_start_pre);
  snprintf(unit, sizeof unit,
           "[Unit]\n"
           "StartLimitIntervalSec=0\n" /* the kills restart it more often than the default burst allows */
           "[Service]\n"
           "Type=notify\n"
           "NotifyAccess=main\n"
           "FileDescriptorStoreMax=64\n"
           "Restart=on-failure\n"
           "RestartSec=100ms\n"
           "TimeoutStartSec=60s\n"
           "TimeoutStopSec=60s\n"
           "%s%s%s"
           "ExecStart=%s --socket %s --attach-socket %s --state-dir %s --backend host --set daemon.metrics= "
           "--set daemon.detach_keep=120s%s%s%.1000s\n"
           "StandardOutput=append:%s\n"
           "StandardError=append:%s\n",
           asan, env, pre, e->daemon, e->socket, e->attach, e->state, journal, e->extra[0] ? " " : "", e->extra, e->log,
           e->log);
  snprintf(p, sizeof p, "%s/systemd/user/%s", e->cfg, e->unit);
  if (write_text(p, unit) < 0) {
    snprintf(why, whylen, "cannot write the unit %.200s: %s", p, strerror(errno));
    return -1;
  }
  e->manager = fork();
  if (e->manager < 0) {
    snprintf(why, whylen, "fork: %s", strerror(errno));
    e->manager = 0;
    return -1;
  }
  if (e->manager == 0) manager_child(e);
  snprintf(p, sizeof p, "%s/systemd/private", e->xdg);
  long long end = now_ms() + 30000; /* the manager and the first start */
  while (access(p, F_OK) != 0) {
    int st;
    if (waitpid(e->manager, &st, WNOHANG) == e->manager) {
      e->manager = 0;
      snprintf(p, sizeof p, "%s/manager.log", e->dir);
      snprintf(why, whylen, "the private systemd --user did not start: %s", ckv_bench_file_tail(p, 300));
      return 1;
    }
    if (now_ms() > end) {
      snprintf(why, whylen, "the private systemd --user never made its socket %.200s", p);
      ckv_bench_sd_stop(e);
      return -1;
    }
    usleep(20000);
  }
  /* the socket exists before the manager answers on it */
  int reload;
  while ((reload = ctl(e, "daemon-reload")) != 0 && now_ms() < end) usleep(100000);
  if (reload != 0) {
    snprintf(p, sizeof p, "%s/systemctl.log", e->dir);
    snprintf(why, whylen, "systemctl --user daemon-reload failed: %s", ckv_bench_file_tail(p, 300));
    ckv_bench_sd_stop(e);
    return -1;
  }
  if (ckv_bench_sd_ctl_unit(e, "start") != 0) {
    snprintf(why, whylen, "systemctl --user start %s failed: %s", e->unit, ckv_bench_file_tail(e->log, 300));
    ckv_bench_sd_stop(e);
    return -1;
  }
  return 0;
}

/* Whether a unix socket at `path` accepts a connection now. */
static bool accepts(const char *path) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  if (n >= sizeof a.sun_path) return false;
  memcpy(a.sun_path, path, n + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

pid_t ckv_bench_sd_wait_restart(const ckv_bench_sd *e, pid_t old, int timeout_ms) {
  long long end = now_ms() + timeout_ms;
  for (;;) {
    pid_t pid = ckv_bench_sd_main_pid(e);
    if (pid > 0 && pid != old && accepts(e->attach)) return pid;
    if (now_ms() > end) return -ETIMEDOUT;
    usleep(10000);
  }
}

int ckv_bench_sd_sanitizer_reports(const ckv_bench_sd *e) {
  FILE *f = fopen(e->log, "r");
  if (!f) return 0;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, "ERROR: AddressSanitizer") || strstr(line, "ERROR: LeakSanitizer") ||
         strstr(line, "runtime error:");
  fclose(f);
  return n;
}
