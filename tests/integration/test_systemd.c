/* test_systemd.c - commitkvd as systemd runs it, without systemd.
 *
 * sd_notify: the test plays the service manager.  It binds a real AF_UNIX
 * datagram socket, puts NOTIFY_SOCKET and WATCHDOG_USEC in the daemon's
 * environment, starts commitkvd and reads READY=1, STATUS=, WATCHDOG=1 at
 * least every WATCHDOG_USEC, then STOPPING=1 after SIGTERM.
 * Units: `systemd-analyze verify` on the units in packaging/systemd (ExecStart pointed
 * at the built binary, the man pages of Documentation= served from the build)
 * must print nothing; skipped, visibly, where systemd-analyze is missing.
 * --check-config: the shipped default file and a file with tenants pass and
 * print the effective configuration; each bad file fails and its error names
 * the file and the line. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "testutil.h"

/* ---- helpers ----------------------------------------------------------- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

static const char *source_dir(void) {
  const char *s = getenv("CKV_SOURCE_DIR");
  return s && *s ? s : ".";
}

/* Runs a shell command line; returns its exit status (-1 when it did not run). */
static int sh(const char *cmd) {
  int r = system(cmd);
  if (r == -1 || !WIFEXITED(r)) return -1;
  return WEXITSTATUS(r);
}

/* ---- sd_notify ---------------------------------------------------------- */

typedef struct notify_log {
  int ready, status, watchdog, stopping;
  long long first_watchdog_ms, last_watchdog_ms, max_gap_ms;
  char last_status[256];
} notify_log;

/* Reads datagrams until `until_ms`, or until STOPPING=1 when stop_on_stopping. */
static void read_notifications(int fd, notify_log *log, long long until_ms, bool stop_on_stopping) {
  while (ckv_test_now_ms() < until_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int wait = (int)(until_ms - ckv_test_now_ms());
    if (poll(&p, 1, wait > 0 ? wait : 0) <= 0) continue;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0) continue;
    buf[n] = 0;
    long long now = ckv_test_now_ms();
    /* One datagram holds newline-separated assignments. */
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (strcmp(line, "READY=1") == 0) log->ready++;
      if (strncmp(line, "STATUS=", 7) == 0) {
        log->status++;
        snprintf(log->last_status, sizeof(log->last_status), "%s", line + 7);
      }
      if (strcmp(line, "WATCHDOG=1") == 0) {
        /* Gaps count only once the daemon is ready (start-up may be slow). */
        if (log->watchdog && now - log->last_watchdog_ms > log->max_gap_ms)
          log->max_gap_ms = now - log->last_watchdog_ms;
        if (!log->watchdog) log->first_watchdog_ms = now;
        log->watchdog++;
        log->last_watchdog_ms = now;
      }
      if (strcmp(line, "STOPPING=1") == 0) log->stopping++;
    }
    if (stop_on_stopping && log->stopping) return;
  }
}

Test(systemd, sd_notify_ready_status_watchdog_stopping, .timeout = 60) {
  char *dir = ckv_test_tmpdir("ckv-notify");
  char path[200];
  snprintf(path, sizeof(path), "%s/notify", dir);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(path), sizeof(sa.sun_path), "temporary path too long for a unix socket: %s", path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "bind %s: %s", path, strerror(errno));

  /* 200 ms watchdog: the daemon must ping at least every 100 ms (half), and
   * a gap of a whole period would get it killed by systemd. */
  const long long wd_usec = 200000;
  char wd[32];
  snprintf(wd, sizeof(wd), "%lld", wd_usec);
  setenv("NOTIFY_SOCKET", path, 1);
  setenv("WATCHDOG_USEC", wd, 1);
  unsetenv("WATCHDOG_PID"); /* unset = meant for whoever reads it */
  ckv_test_daemon d;
  int started = ckv_test_daemon_start(&d, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  cr_assert_eq(started, 0, "commitkvd did not start");

  notify_log log = {0};
  long long t0 = ckv_test_now_ms();
  /* READY=1 first (the attach socket already exists: it came right before). */
  while (!log.ready && ckv_test_now_ms() - t0 < 5000) read_notifications(fd, &log, ckv_test_now_ms() + 100, false);
  cr_assert_eq(log.ready, 1, "no READY=1 within 5 s");
  /* Then 1.5 s of watchdog pings and status lines. */
  read_notifications(fd, &log, ckv_test_now_ms() + 1500, false);
  cr_expect_geq(log.watchdog, 1500 / (wd_usec / 1000), "only %d WATCHDOG=1 in 1.5 s with WATCHDOG_USEC=%lld",
                log.watchdog, wd_usec);
  cr_expect_lt(log.max_gap_ms, wd_usec / 1000, "a %lld ms gap between WATCHDOG=1 would trip a %lld ms watchdog",
               log.max_gap_ms, wd_usec / 1000);
  cr_expect_gt(log.status, 0, "no STATUS=");
  cr_expect(strstr(log.last_status, "sessions") != NULL, "STATUS= says nothing about sessions: '%s'",
            log.last_status);
  cr_expect_eq(log.stopping, 0, "STOPPING=1 before any SIGTERM");

  /* SIGTERM: STOPPING=1, then a clean exit. */
  cr_assert_eq(kill(d.pid, SIGTERM), 0);
  read_notifications(fd, &log, ckv_test_now_ms() + 5000, true);
  cr_expect_eq(log.stopping, 1, "no STOPPING=1 after SIGTERM");
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit 0 after SIGTERM");
  close(fd);
  unlink(path);
  ckv_test_rmdir(dir);
}

Test(systemd, no_notify_socket_no_notifications, .timeout = 30) {
  /* Without NOTIFY_SOCKET the daemon runs as a plain foreground process. */
  unsetenv("NOTIFY_SOCKET");
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, NULL), 0, "commitkvd did not start");
  usleep(300000);
  cr_expect(ckv_test_daemon_alive(&d));
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

/* ---- systemd-analyze verify ------------------------------------------- */

/* Copies src to dst replacing every `from` by `to`. */
static void copy_subst(const char *src, const char *dst, const char *from, const char *to) {
  char *text = ckv_test_read_file(src);
  cr_assert_not_null(text, "cannot read %s", src);
  FILE *f = fopen(dst, "w");
  cr_assert_not_null(f);
  size_t fl = strlen(from);
  for (const char *p = text; *p;) {
    const char *hit = fl ? strstr(p, from) : NULL;
    if (!hit) {
      fputs(p, f);
      break;
    }
    fwrite(p, 1, (size_t)(hit - p), f);
    fputs(to, f);
    p = hit + fl;
  }
  fclose(f);
  free(text);
}

Test(systemd, units_pass_systemd_analyze_verify, .timeout = 60) {
  if (sh("command -v systemd-analyze >/dev/null 2>&1") != 0) {
    cr_skip_test("systemd-analyze not installed (apt-get install systemd): units NOT verified");
  }
  char *dir = ckv_test_tmpdir("ckv-units");
  char bin[600], src[600], dst[600], cmd[4096];
  snprintf(bin, sizeof(bin), "%s/commitkvd", ckv_test_bin_dir());
  cr_assert_eq(access(bin, X_OK), 0, "no %s", bin);
  static const char *const units[] = {"commitkvd.service", "commitkvd-attach.socket"};
  for (size_t i = 0; i < 2; i++) {
    snprintf(src, sizeof(src), "%s/packaging/systemd/%s", source_dir(), units[i]);
    snprintf(dst, sizeof(dst), "%s/%s", dir, units[i]);
    copy_subst(src, dst, "/usr/bin/commitkvd", bin);
  }
  /* Documentation=man:... must resolve: serve the pages built under
   * packaging/man in the build tree when they are there. */
  char mandir[700];
  snprintf(mandir, sizeof(mandir), "%s/../packaging/man", ckv_test_bin_dir());
  char probe[800];
  snprintf(probe, sizeof(probe), "%s/commitkvd.8.gz", mandir);
  bool have_man = access(probe, R_OK) == 0;
  if (have_man) {
    snprintf(cmd, sizeof(cmd),
             "mkdir -p %s/man/man1 %s/man/man5 %s/man/man8 && cp %s/commitkvctl.1.gz %s/man/man1/ && "
             "cp %s/commitkvd.conf.5.gz %s/man/man5/ && cp %s/commitkvd.8.gz %s/man/man8/",
             dir, dir, dir, mandir, dir, mandir, dir, mandir, dir);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
  } else {
    cr_log_warn("man pages not built (%s): verifying with --man=no", probe);
  }
  snprintf(cmd, sizeof(cmd),
           "cd %s && MANPATH=%s/man: SYSTEMD_LOG_LEVEL=notice systemd-analyze verify %s ./commitkvd.service "
           "./commitkvd-attach.socket >%s/verify.out 2>&1",
           dir, dir, have_man ? "" : "--man=no", dir);
  int rc = sh(cmd);
  snprintf(dst, sizeof(dst), "%s/verify.out", dir);
  char *out = ckv_test_read_file(dst);
  cr_expect_eq(rc, 0, "systemd-analyze verify failed:\n%s", out ? out : "");
  cr_expect(out && out[0] == 0, "systemd-analyze verify printed warnings:\n%s", out ? out : "");
  free(out);

  /* The check is real: a unit with a typo and a missing binary fails. */
  snprintf(dst, sizeof(dst), "%s/broken.service", dir);
  write_file(dst, "[Unit]\nDescription=broken\n[Service]\nType=notify\nExecStart=/nonexistent/commitkvd\n");
  snprintf(cmd, sizeof(cmd), "cd %s && systemd-analyze verify --man=no ./broken.service >/dev/null 2>&1", dir);
  cr_expect_neq(sh(cmd), 0, "systemd-analyze verify accepted a unit whose binary does not exist");
  ckv_test_rmdir(dir);
}

Test(systemd, unit_files_have_the_required_settings) {
  char path[600];
  snprintf(path, sizeof(path), "%s/packaging/systemd/commitkvd.service", source_dir());
  char *u = ckv_test_read_file(path);
  cr_assert_not_null(u, "no %s", path);
  static const char *const want[] = {
      "\nType=notify\n", "\nNotifyAccess=main\n", "\nWatchdogSec=", "\nRuntimeDirectory=commitkv\n",
      "\nStateDirectory=commitkv\n", "\nUser=commitkv\n", "\nProtectSystem=strict\n", "\nProtectHome=yes\n",
      "\nPrivateTmp=yes\n", "\nNoNewPrivileges=yes\n", "\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\n",
      "\nSystemCallFilter=@system-service\n", "\nDevicePolicy=closed\n", "\nDeviceAllow=/dev/nvidiactl rw\n",
      "\nDeviceAllow=/dev/nvidia-uvm rw\n", "\nDeviceAllow=char-nvidia* rw\n", "\nLimitMEMLOCK=infinity\n",
      "\nRestart=on-failure\n", "\nExecReload=/bin/kill -HUP $MAINPID\n",
      "\nExecStart=/usr/bin/commitkvd --config /etc/commitkv/commitkvd.conf\n"};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    cr_expect(strstr(u, want[i]) != NULL, "commitkvd.service lacks %s", want[i] + 1);
  free(u);
  snprintf(path, sizeof(path), "%s/packaging/sysusers.d/commitkv.conf", source_dir());
  u = ckv_test_read_file(path);
  cr_assert_not_null(u);
  cr_expect(strstr(u, "\nu     commitkv ") != NULL || strstr(u, "\nu commitkv ") != NULL, "no system user: %s", u);
  free(u);
}

/* ---- --check-config ---------------------------------------------------- */

/* Runs commitkvd --check-config FILE; returns its exit status, output in *out. */
static int check_config(const char *dir, const char *file, char **out) {
  char log[400];
  snprintf(log, sizeof(log), "%s/check.out", dir);
  const char *argv[] = {"commitkvd", "--check-config", file, NULL};
  int rc = ckv_test_wait(ckv_test_spawn(argv, log), 10000);
  *out = ckv_test_read_file(log);
  cr_assert_not_null(*out);
  return rc;
}

Test(systemd, check_config_good_files, .timeout = 30) {
  char *dir = ckv_test_tmpdir("ckv-checkcfg");
  char path[600], *out;
  /* The shipped default: every key commented out, so all defaults. */
  snprintf(path, sizeof(path), "%s/packaging/commitkvd.conf", source_dir());
  cr_assert_eq(check_config(dir, path, &out), 0, "the shipped config fails --check-config:\n%s", out);
  cr_expect(strstr(out, "[daemon]") && strstr(out, "[policy]"), "no effective configuration printed:\n%s", out);
  cr_expect(strstr(out, "metrics = ") != NULL, "metrics key missing from:\n%s", out);
  cr_expect(strstr(out, "127.0.0.1:9464") != NULL, "default metrics address missing from:\n%s", out);
  free(out);

  snprintf(path, sizeof(path), "%s/good.conf", dir);
  write_file(path, "# a node with two tenants\n"
                   "[daemon]\n"
                   "memory = 2G\n"
                   "metrics = \"127.0.0.1:19464\"\n"
                   "log_level = notice\n"
                   "\n"
                   "[policy]\n"
                   "commit_bits = 2\n"
                   "\n"
                   "[tenant.alice]\n"
                   "uids = 1001\n"
                   "quota = 1G\n"
                   "\n"
                   "[tenant.bob]\n"
                   "gids = 2002\n");
  cr_assert_eq(check_config(dir, path, &out), 0, "good.conf fails:\n%s", out);
  cr_expect(strstr(out, "memory = 2G") != NULL, "effective memory missing:\n%s", out);
  cr_expect(strstr(out, "127.0.0.1:19464") != NULL, "effective metrics missing:\n%s", out);
  cr_expect(strstr(out, "[tenant.alice]") && strstr(out, "[tenant.bob]"), "tenants missing:\n%s", out);
  free(out);
  ckv_test_rmdir(dir);
}

Test(systemd, check_config_bad_files_name_their_line, .timeout = 60) {
  char *dir = ckv_test_tmpdir("ckv-checkcfg");
  static const struct {
    const char *text;
    int line;
    const char *says;
  } bad[] = {
      {"[daemon]\nmemory = 4G\nno_such_key = 1\n", 3, "no_such_key"},
      {"[daemon]\n\n\n\nmemory = lots\n", 5, "memory"},
      {"# comment\n[nowhere]\nx = 1\n", 2, "nowhere"},
      {"[daemon]\nlease = 10s\nlease = 20s\n", 3, "lease"},
      {"[policy]\ncommit_bits = 3\n", 2, "commit_bits"},
      {"[daemon]\nbackend = quantum\n", 2, "backend"},
      {"[tenant.a]\nuids = 1001\n[tenant.b]\nuids = 1001\n", 4, "1001"},
      {"[daemon]\nmemory 4G\n", 2, ""},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char path[600], *out, want[700];
    snprintf(path, sizeof(path), "%s/bad%zu.conf", dir, i);
    write_file(path, bad[i].text);
    int rc = check_config(dir, path, &out);
    cr_expect_eq(rc, 1, "bad%zu.conf: exit %d, want 1:\n%s", i, rc, out);
    snprintf(want, sizeof(want), "%s:%d:", path, bad[i].line);
    cr_expect(strstr(out, want) != NULL, "bad%zu.conf: the error does not name %s:\n%s", i, want, out);
    cr_expect(strstr(out, bad[i].says) != NULL, "bad%zu.conf: the error does not mention '%s':\n%s", i, bad[i].says,
              out);
    free(out);
  }
  /* A missing file is an error too, naming the file. */
  char *out, path[600];
  snprintf(path, sizeof(path), "%s/missing.conf", dir);
  cr_expect_eq(check_config(dir, path, &out), 1);
  cr_expect(strstr(out, path) != NULL, "%s", out);
  free(out);
  ckv_test_rmdir(dir);
}
