/* warmcheck.c - the private `systemd --user` manager, the unit that runs
 * commitkvd under it (with an ExecStartPre that damages the journal on a
 * test's request), and the worker's side of a warm restart: connect, rounds,
 * resume, what its mapping shows (warmcheck.h). */
#include "warmcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "shm/arena.h"
#include "testcheck.h"

const ckv_geometry ckv_warm_geom = {CKV_WARM_LAYERS, CKV_WARM_HEADS, CKV_WARM_DIM, 0};

/* The unit's name, one per test process: private managers of the same uid
 * started from one cgroup put their units' cgroups side by side, so two
 * test runs at once (another worktree's, say) that both named it
 * ckvwarm.service stopped and killed each other's daemons. */
static const char *unit_name(void) {
  static char name[64];
  snprintf(name, sizeof name, "ckvwarm-%ld.service", (long)getpid());
  return name;
}

/* ---- a private systemd user manager ---------------------------------- */

/* The env whose manager may run (set by ckv_warm_start, cleared by
 * ckv_warm_stop): the suite's fini stops it after a failed assertion. */
static ckv_warm_env *g_env;

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

/* Runs `systemctl --user ARGS` against the private manager; its exit status. */
static int ctl(const ckv_warm_env *e, const char *args) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "XDG_RUNTIME_DIR=%s %s --user %s >>%s/systemctl.log 2>&1", e->xdg, systemctl_bin(), args,
           e->dir);
  int r = system(cmd);
  return r == -1 || !WIFEXITED(r) ? -1 : WEXITSTATUS(r);
}

/* `systemctl --user VERB <this test's unit>`; its exit status. */
int ckv_warm_ctl_unit(const ckv_warm_env *e, const char *verb) {
  char args[200];
  snprintf(args, sizeof args, "%s %s", verb, unit_name());
  return ctl(e, args);
}

long ckv_warm_main_pid(const ckv_warm_env *e) {
  char cmd[900];
  snprintf(cmd, sizeof cmd, "XDG_RUNTIME_DIR=%s %s --user show -p MainPID --value %s", e->xdg, systemctl_bin(),
           unit_name());
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  long pid = 0;
  if (fscanf(p, "%ld", &pid) != 1) pid = 0;
  pclose(p);
  return pid;
}

/* The child: a mount namespace where /run/systemd/system exists (a bind of
 * our own directory over /run/systemd), then the user manager. */
static void manager_child(const ckv_warm_env *e) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char fakerun[400], log[400];
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

/* Why no private manager can run here, or NULL. */
static const char *cannot_run(void) {
  if (geteuid() != 0) return "not root: a private systemd --user needs a mount namespace of its own";
  if (!systemd_bin()) return "no systemd binary (/lib/systemd/systemd)";
  if (!systemctl_bin()) return "no systemctl";
  return NULL;
}

void ckv_warm_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

/* More environment for the unit's daemon (ckv_warm_set_unit_env); "" for none. */
static char g_unit_env[256];

void ckv_warm_set_unit_env(const char *env) { snprintf(g_unit_env, sizeof g_unit_env, "%s", env); }

/* Writes the unit: commitkvd on sockets and a state directory of this test.
 * ExecStartPre damages the journal when the test left a request for it in
 * DIR/damage ("manifest", "entry", "truncate", "version"; "stash" keeps a
 * copy of the journal the next daemon consumes, "unstash" puts that copy
 * back), between the old daemon's stop and the new one's start. */
static void write_unit(const ckv_warm_env *e) {
  char path[400], unit[4096], asan[600] = "";
  const char *ao = getenv("ASAN_OPTIONS");
  if (ao && *ao) snprintf(asan, sizeof asan, "Environment=\"ASAN_OPTIONS=%s\"\n", ao);
  if (g_unit_env[0]) {
    size_t at = strlen(asan);
    snprintf(asan + at, sizeof asan - at, "Environment=\"%s\"\n", g_unit_env);
  }
  snprintf(path, sizeof path, "%s/damage.sh", e->dir);
  char script[6144];
  snprintf(script, sizeof script,
           "#!/bin/sh\n"
           "# damages the warm-restart journal once, when the test asks\n"
           "[ -f %1$s/damage ] || exit 0\n"
           "what=$(cat %1$s/damage); rm -f %1$s/damage\n"
           "if [ \"$what\" = stash ]; then cp -a %2$s/warm %1$s/warm.stash; echo stashed >&2; exit 0; fi\n"
           "if [ \"$what\" = unstash ]; then rm -rf %2$s/warm; cp -a %1$s/warm.stash %2$s/warm; echo unstashed >&2; exit 0; fi\n"
           "if [ \"$what\" = truncate ]; then truncate -s 10 %2$s/warm/journal; echo truncated >&2; exit 0; fi\n"
           "if [ \"$what\" = entrytrunc ]; then f=$(ls %2$s/warm/*/b.ckvsnap); truncate -s 100 \"$f\"; "
           "echo \"truncated $f\" >&2; exit 0; fi\n"
           "if [ \"$what\" = version ]; then printf '\\002\\000\\000\\000\\375\\377\\377\\377' | "
           "dd of=%2$s/warm/journal bs=1 seek=8 conv=notrunc 2>/dev/null; echo version 2 >&2; exit 0; fi\n"
           "if [ \"${what%%%% *}\" = logtrunc ]; then truncate -s ${what#* } %2$s/warm/journal.log; "
           "echo \"log cut to ${what#* } bytes\" >&2; exit 0; fi\n"
           "if [ \"$what\" = manifest ]; then f=%2$s/warm/journal; off=30\n"
           "elif [ \"${what%%%% *}\" = logflip ]; then f=%2$s/warm/journal.log; off=${what#* }\n"
           "else f=$(ls %2$s/warm/*/b.ckvsnap); off=200; fi\n"
           "[ -f \"$f\" ] || { echo \"no journal file to damage\" >&2; exit 0; }\n"
           "b=$(dd if=\"$f\" bs=1 skip=$off count=1 2>/dev/null | od -An -tu1 | tr -d ' ')\n"
           "printf \"$(printf '\\\\%%03o' $(( (b ^ 255) & 255 )))\" | dd of=\"$f\" bs=1 seek=$off conv=notrunc 2>/dev/null\n"
           "echo \"damaged $f at $off\" >&2\n",
           e->dir, e->state);
  ckv_warm_write_file(path, script);
  chmod(path, 0755);
  snprintf(unit, sizeof unit,
           "[Unit]\n"
           "StartLimitIntervalSec=0\n" /* the kill loop restarts it more often than the default burst allows */
           "[Service]\n"
           "Type=notify\n"
           "NotifyAccess=main\n"
           "FileDescriptorStoreMax=64\n"
           "Restart=on-failure\n"
           "RestartSec=100ms\n"
           "TimeoutStartSec=60s\n"
           "TimeoutStopSec=60s\n"
           "%s"
           "ExecStartPre=%s/damage.sh\n"
           "ExecStart=%s/commitkvd --socket %s --attach-socket %s --state-dir %s --backend host --set daemon.metrics= "
           "--set daemon.detach_keep=120s %s\n"
           "StandardOutput=append:%s\n"
           "StandardError=append:%s\n",
           asan, e->dir, ckv_test_bin_dir(), e->d.socket, e->d.attach, e->state, e->extra, e->d.log, e->d.log);
  snprintf(path, sizeof path, "%s/systemd/user/%s", e->cfg, unit_name());
  ckv_warm_write_file(path, unit);
}

/* Starts the manager and the unit; false (with why) when no manager runs.
 * `config`: text of a commitkvd.conf for the unit, or NULL. */
bool ckv_warm_start(ckv_warm_env *e, const char *config, char *why, size_t whylen) {
  memset(e, 0, sizeof *e);
  const char *no = cannot_run();
  if (no) {
    snprintf(why, whylen, "%s", no);
    return false;
  }
  e->dir = ckv_test_tmpdir("ckv-warm");
  snprintf(e->xdg, sizeof e->xdg, "%s/xdg", e->dir);
  snprintf(e->cfg, sizeof e->cfg, "%s/cfg", e->dir);
  snprintf(e->state, sizeof e->state, "%s/state", e->dir);
  char p[400];
  mkdir(e->xdg, 0700);
  mkdir(e->cfg, 0700);
  mkdir(e->state, 0700);
  snprintf(p, sizeof p, "%s/systemd", e->cfg);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/systemd/user", e->cfg);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/fakerun", e->dir);
  mkdir(p, 0755);
  snprintf(e->d.socket, sizeof e->d.socket, "ipc://%s/commitkvd.sock", e->dir);
  snprintf(e->d.attach, sizeof e->d.attach, "%s/commitkvd.attach", e->dir);
  snprintf(e->d.log, sizeof e->d.log, "%s/commitkvd.log", e->dir);
  e->d.dir = e->state;
  if (config) {
    snprintf(p, sizeof p, "%s/commitkvd.conf", e->dir);
    ckv_warm_write_file(p, config);
    snprintf(e->extra, sizeof e->extra, "--config %.400s", p);
    cr_assert_eq(chmod(e->dir, 0755), 0); /* other uids reach the sockets */
  }
  write_unit(e);
  g_env = e;
  e->manager = fork();
  cr_assert_geq(e->manager, 0);
  if (e->manager == 0) manager_child(e);
  char sock[400];
  snprintf(sock, sizeof sock, "%s/systemd/private", e->xdg);
  long long end = ckv_test_now_ms() + CKV_WARM_DEADLINE_MS;
  while (access(sock, F_OK) != 0) {
    int st;
    if (waitpid(e->manager, &st, WNOHANG) == e->manager) {
      e->manager = 0;
      snprintf(p, sizeof p, "%s/manager.log", e->dir);
      char *tail = ckv_test_file_tail(p, 300);
      snprintf(why, whylen, "the private systemd --user did not start: %s", tail ? tail : "(no log)");
      free(tail);
      ckv_warm_stop(e);
      return false;
    }
    cr_assert_lt(ckv_test_now_ms(), end, "the private systemd --user never made %s", sock);
    usleep(20000);
  }
  /* the manager's socket exists before the manager answers on it: retried, as a unit's
   * ExecStartPre would be (make test-asan at 4c7786b failed one daemon-reload here) */
  int reload = -1;
  while ((reload = ctl(e, "daemon-reload")) != 0 && ckv_test_now_ms() < end) usleep(100000);
  if (reload != 0) {
    snprintf(p, sizeof p, "%s/systemctl.log", e->dir);
    char *tail = ckv_test_file_tail(p, 600);
    cr_assert_fail("systemctl --user daemon-reload failed until the deadline: %s", tail ? tail : "(no log)");
  }
  cr_assert_eq(ckv_warm_ctl_unit(e, "start"), 0, "systemctl --user start failed; daemon log %s", e->d.log);
  e->d.pid = (pid_t)ckv_warm_main_pid(e);
  cr_assert_gt(e->d.pid, 0, "the unit has no main pid");
  return true;
}

/* Stops the unit and the manager; no commitkvd of this test is left. */
void ckv_warm_stop(ckv_warm_env *e) {
  if (g_env == e) g_env = NULL;
  pid_t daemon = e->manager ? (pid_t)ckv_warm_main_pid(e) : 0;
  if (e->manager) {
    ckv_warm_ctl_unit(e, "stop");
    ctl(e, "exit");
    long long end = ckv_test_now_ms() + 10000;
    int st;
    while (waitpid(e->manager, &st, WNOHANG) != e->manager) {
      if (ckv_test_now_ms() > end) {
        kill(e->manager, SIGKILL);
        waitpid(e->manager, &st, 0);
        break;
      }
      usleep(20000);
    }
    e->manager = 0;
  }
  if (daemon > 0 && kill(daemon, 0) == 0) {
    kill(daemon, SIGKILL);
    cr_expect_fail("commitkvd %d outlived its unit and manager", (int)daemon);
  }
  if (e->dir && getenv("CKV_TEST_VERBOSE")) { /* the daemons' story, for whoever debugs */
    char *log = ckv_test_read_file(e->d.log);
    fprintf(stderr, "---- %s ----\n%s\n", e->d.log, log ? log : "(none)");
    free(log);
    char p[400];
    snprintf(p, sizeof p, "%s/systemctl.log", e->dir);
    log = ckv_test_read_file(p);
    fprintf(stderr, "---- %s ----\n%s\n", p, log ? log : "(none)");
    free(log);
  }
  if (e->dir) {
    char p[400];
    snprintf(p, sizeof p, "%s/fakerun", e->dir);
    rmdir(p);
    ckv_test_rmdir(e->dir);
    e->dir = NULL;
  }
}

void ckv_warm_suite_fini(void) {
  if (g_env) ckv_warm_stop(g_env);
  ckv_test_leak_check();
}

/* Waits until systemd restarted the unit (a new main pid that accepts attaches). */
void ckv_warm_wait_restarted(ckv_warm_env *e, long old_pid) {
  long long end = ckv_test_now_ms() + CKV_WARM_DEADLINE_MS;
  for (;;) {
    long pid = ckv_warm_main_pid(e);
    if (pid > 0 && pid != old_pid && ckv_warm_ctl_unit(e, "is-active --quiet") == 0 &&
        ckv_test_attach_accepts(e->d.attach)) {
      e->d.pid = (pid_t)pid;
      return;
    }
    cr_assert_lt(ckv_test_now_ms(), end, "systemd did not restart the unit (daemon log %s)", e->d.log);
    usleep(50000);
  }
}

/* ---- the worker ------------------------------------------------------- */

ckv_client *ckv_warm_connect(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_warm_restart",
                          .timeout_ms = 10000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* Opens `id` and runs `rounds` rounds (facts hot, older text cold, some
 * forgotten): draft, staged and committed blocks, acking every view. */
ckv_session *ckv_warm_session_with_rounds(ckv_client *c, const char *id, uint32_t rounds) {
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  const double values[] = {4, 16, 2, 6};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 4,
                            .model_id = "stories260K", .model_revision = "r1"};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &ckv_warm_geom, &so, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  size_t n = 0, elems = CKV_WARM_HEADS * CKV_WARM_DIM;
  float *attn = malloc(CKV_WARM_PER_ROUND * (rounds + 1) * sizeof(float));
  cr_assert_not_null(attn);
  for (uint32_t round = 1; round <= rounds; round++) {
    float sem[CKV_WARM_PER_ROUND];
    for (uint32_t i = 0; i < CKV_WARM_PER_ROUND; i++) sem[i] = (n + i) % 8 == 1 ? 0.9f : (n + i) % 3 == 0 ? 0.2f : 0.5f;
    uint64_t first = 0;
    r = ckv_session_append(s, CKV_WARM_PER_ROUND, NULL, NULL, sem, NULL, &first);
    cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    for (size_t pos = n; pos < n + CKV_WARM_PER_ROUND; pos++)
      for (uint32_t layer = 0; layer < CKV_WARM_LAYERS; layer++) {
        uint16_t k[CKV_WARM_HEADS * CKV_WARM_DIM], v[CKV_WARM_HEADS * CKV_WARM_DIM];
        for (uint32_t e = 0; e < elems; e++) {
          k[e] = ckv_f32_to_f16(ckv_test_kv_value(pos + 1000u * (uint32_t)id[0], layer, 0, e));
          v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos + 1000u * (uint32_t)id[0], layer, 1, e));
        }
        cr_assert_eq(ckv_session_write_kv(s, pos, layer, k, v), CKV_OK);
      }
    n += CKV_WARM_PER_ROUND;
    for (size_t pos = 0; pos < n; pos++)
      attn[pos] = pos % 8 == 1 ? 4.f : pos + CKV_WARM_PER_ROUND >= n ? 1.f : (pos % 3 == 0 && round > 6) ? 0.f : 0.3f;
    ckv_round_result rr;
    r = ckv_session_report(s, round, 0, attn, n, &rr);
    cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_eq(ckv_session_ack(s, rr.epoch, NULL), CKV_OK);
  }
  free(attn);
  return s;
}

void ckv_warm_map_blocks(ckv_client *c, ckv_session *s, ckv_warm_mapped *m) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(s, &v);
  cr_assert_eq(r, CKV_OK, "view: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  memset(m, 0, sizeof *m);
  /* cold blocks too: a block of demoted tokens is listed cold once it is no longer being filled */
  const ckv_block_view *lists[4] = {v->draft, v->staged, v->committed, v->cold};
  size_t counts[4] = {v->n_draft, v->n_staged, v->n_committed, v->n_cold};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; i < counts[k]; i++) {
      cr_assert_lt(m->n, 512);
      size_t head = ckv_block_payload_offset(lists[k][i].capacity);
      m->at[m->n] = (const uint8_t *)lists[k][i].data + head;
      m->bytes[m->n] = lists[k][i].bytes - head;
      m->copy[m->n] = malloc(m->bytes[m->n]);
      cr_assert_not_null(m->copy[m->n]);
      memcpy(m->copy[m->n], m->at[m->n], m->bytes[m->n]);
      m->n++;
    }
}

/* The old mapping still shows every byte it showed. */
void ckv_warm_expect_mapping_intact(const ckv_warm_mapped *m, const char *what) {
  for (size_t i = 0; i < m->n; i++)
    cr_assert_eq(memcmp(m->at[i], m->copy[i], m->bytes[i]), 0, "%s: block %zu of the worker's old mapping changed",
                 what, i);
}

bool ckv_warm_mapped_at(const ckv_warm_mapped *m, const void *p) {
  for (size_t i = 0; i < m->n; i++)
    if (m->at[i] == p) return true;
  return false;
}

void ckv_warm_mapped_free(ckv_warm_mapped *m) {
  for (size_t i = 0; i < m->n; i++) free(m->copy[i]);
  memset(m, 0, sizeof *m);
}

ckv_session *ckv_warm_resume(ckv_client *c, const char *id, int *ret_code, char *msg, size_t msglen) {
  ckv_session_options ro = {.resume = true, .model_id = "stories260K", .model_revision = "r1"};
  ckv_session *s = NULL;
  *ret_code = ckv_session_open(c, id, NULL, &ro, &s);
  snprintf(msg, msglen, "%s", ckv_client_last_error(c));
  return *ret_code == CKV_OK ? s : NULL;
}

void ckv_warm_tokens_by_state(const ckv_test_daemon *d, unsigned long long tok[4]) {
  tok[0] = ckv_test_stat(d, "tokens.draft");
  tok[1] = ckv_test_stat(d, "tokens.staged");
  tok[2] = ckv_test_stat(d, "tokens.committed");
  tok[3] = ckv_test_stat(d, "tokens.recycled");
}

bool ckv_warm_log_has(const char *path, const char *needle) {
  char *log = ckv_test_read_file(path);
  bool r = log && strstr(log, needle);
  free(log);
  return r;
}

void ckv_warm_request_damage(const ckv_warm_env *e, const char *what) {
  char p[400];
  snprintf(p, sizeof p, "%s/damage", e->dir);
  ckv_warm_write_file(p, what);
}

/* kill -9 and the wait for systemd's restart; the worker reconnects onto the same mapping. */
void ckv_warm_kill_and_reconnect(ckv_warm_env *e, ckv_client *c, const ckv_arena *mapping) {
  long old_pid = e->d.pid;
  cr_assert_eq(kill((pid_t)old_pid, SIGKILL), 0);
  ckv_warm_wait_restarted(e, old_pid);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c), "the worker had to map the arena anew after a kill (daemon log %s)", e->d.log);
  cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
}
