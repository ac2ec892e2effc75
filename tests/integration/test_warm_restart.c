/* test_warm_restart.c - commitkvd restarts under a real systemd fd store and
 * its workers' memory stays (issue 15, warm restart; docs/warm-restart.md).
 *
 * Each systemd test starts a private user manager (`systemd --user`) in a
 * mount namespace of its own, where /run/systemd/system exists (systemd 252
 * refuses --user without it, and PID 1 of a container is no systemd), with
 * XDG_RUNTIME_DIR and XDG_CONFIG_HOME in a temporary directory, and runs
 * commitkvd as a unit there (Type=notify, FileDescriptorStoreMax=,
 * Restart=on-failure), driven with `systemctl --user` over the manager's
 * private socket (systemd-run needs a D-Bus session bus).  The worker is
 * libcommitkv in this process.
 *
 * - restart_keeps_mapping_and_kv: sessions with draft, staged and committed
 *   blocks; `systemctl --user restart`; before the worker reconnects, its old
 *   mapping still shows every block's bytes; it reconnects onto the same
 *   mapping (ckv_client_arena_kept), resumes its sessions, and the view reads
 *   identical K/V (every block's payload, every token in the same format) on
 *   the very same blocks, state counts equal, and the next round runs.
 * - kill9_says_what_was_dropped: with [daemon] warm_journal = 0 (the journal
 *   only at a clean stop): SIGKILL, systemd restarts the unit: the new
 *   daemon says the arenas in the store have no journal and drops them; the
 *   worker's old mapping still holds its own bytes (nobody else's), it gets
 *   a fresh arena, the saved session comes back from its snapshot, the other
 *   answers NOT_FOUND.
 * - corrupt_journal_refused: a journal entry with a flipped byte drops that
 *   session (NOT_FOUND saying the warm restart dropped it) and keeps the
 *   other; a manifest with a flipped byte, cut short, or of another version
 *   is refused with a log line and nothing is kept; the daemon serves after
 *   each.
 * - stale_journal_never_applied: a copy of a consumed journal put back
 *   after the daemon that consumed it changed the session and was killed:
 *   the new daemon finds the arena stored under the later daemon's tag,
 *   refuses the stale journal for it, and the session answers NOT_FOUND
 *   saying why, instead of coming back with metadata that no longer fits
 *   its bytes.
 * - two_tenants_keep_their_own_arenas: two tenants (real uids, children
 *   that switched to them) hold a session of the same id; after a restart
 *   each one's worker is handed back its own arena (its mapping kept, its
 *   generation, not the other's) and reads exactly its own K/V.
 * - kill9_loop_keeps_journaled_sessions (issue 43, the continuous journal):
 *   8 x SIGKILL in the middle of a worker's rounds, systemd restarts the
 *   unit (Restart=on-failure); two fp16 sessions and one whose moves free and
 *   reallocate blocks.  Every session comes back on the mapping the worker
 *   kept, with at least what the journal had time to hold (600 ms of quiet
 *   before the kill: all of it) and never more than was written; every draft
 *   slot reads exactly the bytes the worker wrote there (its private copy;
 *   a write salt per round, so an older write or another session's bytes
 *   fail), the moving session's whole view is the same byte for byte after a
 *   quiet kill.  A session dropped just before a kill never comes back
 *   (NOT_FOUND, saying why); one opened just before comes back exactly or
 *   answers NOT_FOUND saying the daemon was killed.  Prints the time from
 *   the kill to the first round served again.
 * - kill9_random_points_keep_every_answered_change (issue 43, durable
 *   before acknowledged): 50 x SIGKILL from a second thread at a random
 *   20-350 ms into the worker's rounds (so in the middle of any request:
 *   open, append, K/V writes, report, ack, drop), three fp16 sessions and
 *   one whose moves free and reallocate blocks, each dropped and opened
 *   anew under a new id when full, the log compacted every 256 KiB (so
 *   kills land in compactions too); Restart=on-failure.  After each restart
 *   the worker gets its mapping back and every session whose open was
 *   answered resumes with at least every token whose append was answered
 *   (at most those plus an unanswered append), at an epoch past every
 *   report answered, and every position the worker wrote reads exactly its
 *   private copy; a session whose open or drop was cut short either comes
 *   back or answers NOT_FOUND saying why.  The next round of every session
 *   runs and reads the same.  Fails when a reply goes before its change is
 *   durable (an append's reply not held: "came back with 432 tokens, the
 *   daemon had answered appends of 456").
 * - kill9_log_cut_at_last_good_record: the journal log torn 5 bytes into
 *   its last record (b's append) before the next start: the cut is logged,
 *   b comes back as of its record before, a whole; then a byte of a's record
 *   in the middle flipped, b's record after it intact: both come back as of
 *   their records before the damaged one (nothing after the cut applied).
 * - kill9_reconnect_retries_keep_mapping: the worker retries
 *   ckv_client_reconnect from the moment of the kill (failing attempts while
 *   systemd restarts the unit): the attempt that succeeds still gets the
 *   mapping it kept.
 * - kill9_damaged_entry_drops_only_it: after a kill, one entry damaged (a
 *   flipped byte; cut short) before the next start: that session answers
 *   NOT_FOUND saying the entry was refused, the other comes back whole.
 * - kill9_keeps_forked_prefix_shared: a fork sharing three draft blocks with
 *   its parent; after kills both come back, still on one copy of the blocks.
 * - snapshot_path_without_systemd: no service manager: no journal, no fd
 *   store; a saved session comes back from its snapshot after a restart.
 * - pressure_spares_sessions_not_resumed: disk tier with memory pressure, a
 *   small quota; after a restart the worker reconnects and grows a new
 *   session until the quota refuses it, before it resumes its kept session
 *   (whose blocks it may still read through the mapping it kept): the kept
 *   session is not moved to disk (no pressure move), its old mapping shows
 *   every byte, and it resumes with the same view.
 *
 * Where no systemd can run (not root, no systemd or systemctl binary, no
 * mount namespace), the systemd tests print "SKIPPED: <reason>" and skip;
 * the snapshot path runs everywhere.  Every test stops the unit and the
 * manager, and checks that no daemon is left. */

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "client/rpc.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "shm/arena.h"
#include "testcheck.h"
#include "testutil.h"
#include "viewcapture.h"

#define DEADLINE_MS 30000
/* The unit's name, one per test process: private managers of the same uid
 * started from one cgroup put their units' cgroups side by side, so two
 * test runs at once (another worktree's, say) that both named it
 * ckvwarm.service stopped and killed each other's daemons. */
static const char *unit_name(void) {
  static char name[64];
  snprintf(name, sizeof name, "ckvwarm-%ld.service", (long)getpid());
  return name;
}
#define LAYERS 2u
#define HEADS 2u
#define DIM 32u
#define PER_ROUND 24u

static const ckv_geometry k_geom = {LAYERS, HEADS, DIM, 0};

/* ---- a private systemd user manager ---------------------------------- */

typedef struct sdenv {
  char *dir;
  char xdg[300], cfg[300], state[300];
  char extra[480]; /* more commitkvd arguments (--config ...) */
  pid_t manager;
  ckv_test_daemon d; /* socket, attach, log of the unit's daemon; dir = the state dir */
} sdenv;

/* One per test worker, in static storage: a failed assertion leaves the
 * test function, and the suite's fini must still find what to stop. */
static sdenv g_sd;
static sdenv *g_env; /* set while a manager may run */

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
static int ctl(const sdenv *e, const char *args) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "XDG_RUNTIME_DIR=%s %s --user %s >>%s/systemctl.log 2>&1", e->xdg, systemctl_bin(), args,
           e->dir);
  int r = system(cmd);
  return r == -1 || !WIFEXITED(r) ? -1 : WEXITSTATUS(r);
}

/* `systemctl --user VERB <this test's unit>`; its exit status. */
static int ctl_unit(const sdenv *e, const char *verb) {
  char args[200];
  snprintf(args, sizeof args, "%s %s", verb, unit_name());
  return ctl(e, args);
}

static long main_pid(const sdenv *e) {
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
static void manager_child(const sdenv *e) {
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

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

/* More environment for the unit's daemon (a test sets it before it starts
 * the manager), e.g. "CKV_TEST_WARM_COMPACT_BYTES=1"; "" for none. */
static char g_unit_env[256];

/* Writes the unit: commitkvd on sockets and a state directory of this test.
 * ExecStartPre damages the journal when the test left a request for it in
 * DIR/damage ("manifest", "entry", "truncate", "version"; "stash" keeps a
 * copy of the journal the next daemon consumes, "unstash" puts that copy
 * back), between the old daemon's stop and the new one's start. */
static void write_unit(const sdenv *e) {
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
  write_file(path, script);
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
  write_file(path, unit);
}

static void sd_stop(sdenv *e);
static bool sd_start_with(sdenv *e, const char *config, char *why, size_t whylen);

/* Starts the manager and the unit; false (with why) when no manager runs.
 * `config`: text of a commitkvd.conf for the unit, or NULL. */
static bool sd_start_with(sdenv *e, const char *config, char *why, size_t whylen) {
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
    write_file(p, config);
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
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (access(sock, F_OK) != 0) {
    int st;
    if (waitpid(e->manager, &st, WNOHANG) == e->manager) {
      e->manager = 0;
      snprintf(p, sizeof p, "%s/manager.log", e->dir);
      char *tail = ckv_test_file_tail(p, 300);
      snprintf(why, whylen, "the private systemd --user did not start: %s", tail ? tail : "(no log)");
      free(tail);
      sd_stop(e);
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
  cr_assert_eq(ctl_unit(e, "start"), 0, "systemctl --user start failed; daemon log %s", e->d.log);
  e->d.pid = (pid_t)main_pid(e);
  cr_assert_gt(e->d.pid, 0, "the unit has no main pid");
  return true;
}

/* Stops the unit and the manager; no commitkvd of this test is left. */
static void sd_stop(sdenv *e) {
  if (g_env == e) g_env = NULL;
  pid_t daemon = e->manager ? (pid_t)main_pid(e) : 0;
  if (e->manager) {
    ctl_unit(e, "stop");
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

static void suite_fini(void) {
  if (g_env) sd_stop(g_env);
  ckv_test_leak_check();
}

TestSuite(warm, .fini = suite_fini);

#define SKIP_WITHOUT_SYSTEMD(e) SKIP_WITHOUT_SYSTEMD_CONF(e, NULL)
#define SKIP_WITHOUT_SYSTEMD_CONF(e, conf)                                                                    \
  do {                                                                                                        \
    char why_[512];                                                                                           \
    if (!sd_start_with(e, conf, why_, sizeof why_)) {                                                         \
      printf("SKIPPED: %s (test_warm_restart.snapshot_path_without_systemd covers the snapshot path)\n", why_); \
      fflush(stdout);                                                                                         \
      cr_skip("%s", why_);                                                                                    \
    }                                                                                                         \
  } while (0)

/* Waits until systemd restarted the unit (a new main pid that accepts attaches). */
static void wait_restarted(sdenv *e, long old_pid) {
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  for (;;) {
    long pid = main_pid(e);
    if (pid > 0 && pid != old_pid && ctl_unit(e, "is-active --quiet") == 0 && ckv_test_attach_accepts(e->d.attach)) {
      e->d.pid = (pid_t)pid;
      return;
    }
    cr_assert_lt(ckv_test_now_ms(), end, "systemd did not restart the unit (daemon log %s)", e->d.log);
    usleep(50000);
  }
}

/* ---- the worker ------------------------------------------------------- */

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_warm_restart",
                          .timeout_ms = 10000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* Opens `id` and runs `rounds` rounds (facts hot, older text cold, some
 * forgotten): draft, staged and committed blocks, acking every view. */
static ckv_session *session_with_rounds(ckv_client *c, const char *id, uint32_t rounds) {
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  const double values[] = {4, 16, 2, 6};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 4,
                            .model_id = "stories260K", .model_revision = "r1"};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geom, &so, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  size_t n = 0, elems = HEADS * DIM;
  float *attn = malloc(PER_ROUND * (rounds + 1) * sizeof(float));
  cr_assert_not_null(attn);
  for (uint32_t round = 1; round <= rounds; round++) {
    float sem[PER_ROUND];
    for (uint32_t i = 0; i < PER_ROUND; i++) sem[i] = (n + i) % 8 == 1 ? 0.9f : (n + i) % 3 == 0 ? 0.2f : 0.5f;
    uint64_t first = 0;
    r = ckv_session_append(s, PER_ROUND, NULL, NULL, sem, NULL, &first);
    cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    for (size_t pos = n; pos < n + PER_ROUND; pos++)
      for (uint32_t layer = 0; layer < LAYERS; layer++) {
        uint16_t k[HEADS * DIM], v[HEADS * DIM];
        for (uint32_t e = 0; e < elems; e++) {
          k[e] = ckv_f32_to_f16(ckv_test_kv_value(pos + 1000u * (uint32_t)id[0], layer, 0, e));
          v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos + 1000u * (uint32_t)id[0], layer, 1, e));
        }
        cr_assert_eq(ckv_session_write_kv(s, pos, layer, k, v), CKV_OK);
      }
    n += PER_ROUND;
    for (size_t pos = 0; pos < n; pos++)
      attn[pos] = pos % 8 == 1 ? 4.f : pos + PER_ROUND >= n ? 1.f : (pos % 3 == 0 && round > 6) ? 0.f : 0.3f;
    ckv_round_result rr;
    r = ckv_session_report(s, round, 0, attn, n, &rr);
    cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_eq(ckv_session_ack(s, rr.epoch, NULL), CKV_OK);
  }
  free(attn);
  return s;
}

/* What the worker's mapping shows of a session's blocks: where and what. */
typedef struct mapped {
  size_t n;
  const uint8_t *at[512];
  uint64_t bytes[512];
  uint8_t *copy[512];
} mapped;

static void map_blocks(ckv_client *c, ckv_session *s, mapped *m) {
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
static void expect_mapping_intact(const mapped *m, const char *what) {
  for (size_t i = 0; i < m->n; i++)
    cr_assert_eq(memcmp(m->at[i], m->copy[i], m->bytes[i]), 0, "%s: block %zu of the worker's old mapping changed",
                 what, i);
}

static bool mapped_at(const mapped *m, const void *p) {
  for (size_t i = 0; i < m->n; i++)
    if (m->at[i] == p) return true;
  return false;
}

static void mapped_free(mapped *m) {
  for (size_t i = 0; i < m->n; i++) free(m->copy[i]);
  memset(m, 0, sizeof *m);
}

static ckv_session *resume(ckv_client *c, const char *id, int *ret_code, char *msg, size_t msglen) {
  ckv_session_options ro = {.resume = true, .model_id = "stories260K", .model_revision = "r1"};
  ckv_session *s = NULL;
  *ret_code = ckv_session_open(c, id, NULL, &ro, &s);
  snprintf(msg, msglen, "%s", ckv_client_last_error(c));
  return *ret_code == CKV_OK ? s : NULL;
}

static void tokens_by_state(const ckv_test_daemon *d, unsigned long long tok[4]) {
  tok[0] = ckv_test_stat(d, "tokens.draft");
  tok[1] = ckv_test_stat(d, "tokens.staged");
  tok[2] = ckv_test_stat(d, "tokens.committed");
  tok[3] = ckv_test_stat(d, "tokens.recycled");
}

static bool log_has(const char *path, const char *needle) {
  char *log = ckv_test_read_file(path);
  bool r = log && strstr(log, needle);
  free(log);
  return r;
}

/* ---- tests ------------------------------------------------------------- */

Test(warm, restart_keeps_mapping_and_kv, .timeout = 180) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  ckv_session *a = session_with_rounds(c, "a", 12), *b = session_with_rounds(c, "b", 5);
  /* Moves run off the critical path: the stop settles them before it writes
   * the journal, so settle them here too (a save does) before capturing. */
  cr_assert_eq(ckv_session_save(a, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  cr_assert_eq(ckv_session_save(b, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_a = ckv_test_capture_view(c, "a", &k_geom), before_b = ckv_test_capture_view(c, "b", &k_geom);
  cr_assert_gt(before_a.per_format[CKV_FORMAT_DRAFT], 0, "no draft block");
  cr_assert_gt(before_a.per_format[CKV_FORMAT_STAGED], 0, "no staged block");
  cr_assert_gt(before_a.per_format[CKV_FORMAT_COMMIT4] + before_a.per_format[CKV_FORMAT_ROT4], 0, "no committed block");
  unsigned long long tok[4];
  tokens_by_state(&e->d, tok);
  cr_assert_gt(tok[3], 0, "nothing recycled: the workload did not exercise the lifecycle");
  mapped ma, mb;
  map_blocks(c, a, &ma);
  map_blocks(c, b, &mb);
  ckv_arena *mapping = c->arena;
  long old_pid = e->d.pid;

  cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  wait_restarted(e, old_pid);
  /* before the worker reconnects: its mapping is whole and live */
  expect_mapping_intact(&ma, "a, after the restart");
  expect_mapping_intact(&mb, "b, after the restart");
  cr_assert(ckv_arena_is_live(mapping), "the old daemon retired the arena it handed on");

  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c), "the worker had to map the arena anew (daemon log %s)", e->d.log);
  cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
  ckv_session_close(a);
  ckv_session_close(b);
  char msg[512];
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
  b = resume(c, "b", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume b: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after_a = ckv_test_capture_view(c, "a", &k_geom), after_b = ckv_test_capture_view(c, "b", &k_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "a after a warm restart");
  ckv_test_expect_same_view(&before_b, &after_b, "b after a warm restart");
  cr_assert_gt(after_a.epoch, before_a.epoch, "epochs go on from the kept one");
  /* on the very same blocks: zero copy */
  mapped na;
  map_blocks(c, a, &na);
  cr_assert_eq(na.n, ma.n);
  for (size_t i = 0; i < na.n; i++) cr_assert(mapped_at(&ma, na.at[i]), "block %zu of a moved in the arena", i);
  mapped_free(&na);
  unsigned long long tok2[4];
  tokens_by_state(&e->d, tok2);
  for (int i = 0; i < 4; i++) cr_assert_eq(tok2[i], tok[i], "state %d: %llu tokens, had %llu", i, tok2[i], tok[i]);
  /* the next round: round 12 again is refused, 13 runs */
  float *attn = calloc(after_a.n_tokens, sizeof(float));
  ckv_round_result rr;
  cr_assert_eq(ckv_session_report(a, 12, 0, attn, after_a.n_tokens, &rr), CKV_ERR_INVALID);
  cr_assert_eq(ckv_session_report(a, 13, 0, attn, after_a.n_tokens, &rr), CKV_OK, "%s", ckv_client_last_error(c));
  free(attn);
  cr_assert(log_has(e->d.log, "warm-journal"), "the old daemon wrote no journal (log %s)", e->d.log);
  cr_assert(log_has(e->d.log, "warm-session-kept"), "the new daemon kept no session (log %s)", e->d.log);
  ckv_test_capture_free(&before_a);
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_a);
  ckv_test_capture_free(&after_b);
  mapped_free(&ma);
  mapped_free(&mb);
  ckv_session_close(a);
  ckv_session_close(b);
  ckv_client_free(c);
  sd_stop(e);
}

Test(warm, kill9_says_what_was_dropped, .timeout = 180) {
  sdenv *e = &g_sd;
  /* the journal only at a clean stop: a kill -9 leaves none (kill9_loop_keeps_journaled_sessions: with it) */
  SKIP_WITHOUT_SYSTEMD_CONF(e, "[daemon]\nwarm_journal = 0\n");
  ckv_client *c = connect_to(&e->d);
  ckv_session *a = session_with_rounds(c, "a", 8), *b = session_with_rounds(c, "b", 8);
  cr_assert_eq(ckv_session_save(b, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_b = ckv_test_capture_view(c, "b", &k_geom);
  mapped ma;
  map_blocks(c, a, &ma);
  uint64_t gen = ckv_arena_generation(c->arena);
  long old_pid = e->d.pid;

  cr_assert_eq(kill((pid_t)old_pid, SIGKILL), 0);
  wait_restarted(e, old_pid);
  /* the new daemon says what it did with the arenas of the killed one */
  cr_assert(log_has(e->d.log, "warm-journal-missing"), "the new daemon did not say why nothing was kept (log %s)",
            e->d.log);
  cr_assert(log_has(e->d.log, "warm-arena-dropped"), "the arena in the store was not dropped (log %s)", e->d.log);
  expect_mapping_intact(&ma, "a, after the kill");

  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_arena_kept(c), "a dropped arena cannot be kept");
  cr_assert_neq(ckv_arena_generation(c->arena), gen, "the new daemon handed out the dropped arena");
  ckv_session_close(a);
  ckv_session_close(b);
  char msg[512];
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume of a session nobody kept: %s (%s)", ckv_strerror(r), msg);
  cr_assert(strstr(msg, "did not stop cleanly"), "NOT_FOUND does not say why: %s", msg);
  b = resume(c, "b", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume of a saved session from its snapshot: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after_b = ckv_test_capture_view(c, "b", &k_geom);
  ckv_test_expect_same_view(&before_b, &after_b, "b from its snapshot after a kill -9");
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_b);
  mapped_free(&ma);
  ckv_session_close(b);
  ckv_client_free(c);
  sd_stop(e);
}

static void request_damage(const sdenv *e, const char *what) {
  char p[400];
  snprintf(p, sizeof p, "%s/damage", e->dir);
  write_file(p, what);
}

Test(warm, corrupt_journal_refused, .timeout = 240) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  ckv_session *a = session_with_rounds(c, "a", 6), *b = session_with_rounds(c, "b", 6);
  cr_assert_eq(ckv_session_save(a, "a-settled", false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_a = ckv_test_capture_view(c, "a", &k_geom);

  /* 1: b's journal entry damaged: b is dropped and says so, a is kept */
  request_damage(e, "entry");
  long old_pid = e->d.pid;
  cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  wait_restarted(e, old_pid);
  cr_assert(log_has(e->d.log, "warm-session-dropped"), "the damaged entry was not refused (log %s)", e->d.log);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c));
  ckv_session_close(a);
  ckv_session_close(b);
  char msg[512];
  b = resume(c, "b", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume of the damaged one: %s (%s)", ckv_strerror(r), msg);
  cr_assert(strstr(msg, "warm restart dropped it"), "NOT_FOUND does not say why: %s", msg);
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after_a = ckv_test_capture_view(c, "a", &k_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "a beside a damaged entry");
  ckv_test_capture_free(&after_a);
  /* b's blocks were scrubbed: a new session there reads only what it writes (viewcapture checks headers) */
  b = session_with_rounds(c, "b", 2);

  /* 2: the manifest damaged: refused with a log line, nothing kept, serving */
  request_damage(e, "manifest");
  old_pid = e->d.pid;
  cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  wait_restarted(e, old_pid);
  cr_assert(log_has(e->d.log, "warm-journal-refused"), "the damaged manifest was not refused (log %s)", e->d.log);
  r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_arena_kept(c), "an arena of a refused journal was handed out");
  ckv_test_expect_serving(c);
  ckv_session_close(a);
  ckv_session_close(b);
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume after a refused journal: %s (%s)", ckv_strerror(r), msg);
  a = session_with_rounds(c, "a", 2); /* and it serves new sessions */
  ckv_session_close(a);

  /* 3, 4: a manifest cut short, one of another version: refused, serving */
  const char *kinds[] = {"truncate", "version"};
  const char *says[] = {"no journal magic (10 bytes)", "journal version 2, this build reads 1"};
  for (int k = 0; k < 2; k++) {
    request_damage(e, kinds[k]);
    old_pid = e->d.pid;
    cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
    wait_restarted(e, old_pid);
    cr_assert(log_has(e->d.log, says[k]), "a %s journal was not refused with '%s' (log %s)", kinds[k], says[k],
              e->d.log);
    r = ckv_client_reconnect(c);
    cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_not(ckv_client_arena_kept(c));
    ckv_test_expect_serving(c);
  }
  ckv_test_capture_free(&before_a);
  ckv_client_free(c);
  sd_stop(e);
}

/* ---- kill -9 with the continuous journal (issue 43) ---- */

#define KW_MAX_TOKENS 1024u
#define KW_ELEMS (HEADS * DIM)

/* A worker's session and its private copy of every K/V element it wrote. */
typedef struct kworker {
  char id[32];
  const char *policy;
  ckv_session *s;
  size_t n;          /* tokens the worker believes the session holds */
  uint32_t round;    /* the last round number it reported (strictly increasing, gaps allowed) */
  uint32_t salt;     /* bumped at every write: a token rewritten after a kill gets new bytes */
  uint16_t *copy;    /* [pos][layer][kv][KW_ELEMS] */
  size_t settled;    /* tokens at the last point the journal had time to catch up */
  bool ended;        /* dropped on purpose */
} kworker;

static uint16_t *kw_at(kworker *w, size_t pos, uint32_t layer, uint32_t kv) {
  return w->copy + (((pos * LAYERS + layer) * 2u + kv) * KW_ELEMS);
}

static void kw_open(ckv_client *c, kworker *w, const char *id, const char *policy) {
  memset(w, 0, sizeof *w);
  snprintf(w->id, sizeof w->id, "%s", id);
  w->policy = policy;
  w->copy = calloc((size_t)KW_MAX_TOKENS * LAYERS * 2u * KW_ELEMS, sizeof(uint16_t));
  cr_assert_not_null(w->copy);
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  const double values[] = {4, 16, 2, 6};
  bool moves = strcmp(policy, "commitkv") == 0;
  ckv_session_options so = {.policy = policy, .param_names = moves ? names : NULL, .param_values = moves ? values : NULL,
                            .n_params = moves ? 4 : 0, .model_id = "stories260K", .model_revision = "r1"};
  int r = ckv_session_open(c, id, &k_geom, &so, &w->s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
}

/* One round: PER_ROUND tokens appended and written (the private copy
 * keeps them); unless half, reported and acked. */
static void kw_round(ckv_client *c, kworker *w, bool half) {
  cr_assert_leq(w->n + PER_ROUND, KW_MAX_TOKENS);
  float sem[PER_ROUND];
  for (uint32_t i = 0; i < PER_ROUND; i++) sem[i] = (w->n + i) % 8 == 1 ? 0.9f : (w->n + i) % 3 == 0 ? 0.2f : 0.5f;
  uint64_t first = 0;
  int r = ckv_session_append(w->s, PER_ROUND, NULL, NULL, sem, NULL, &first);
  cr_assert_eq(r, CKV_OK, "append %s: %s (%s)", w->id, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(first, w->n, "append %s: first position %llu, the worker has %zu", w->id, (unsigned long long)first,
               w->n);
  w->salt++;
  for (size_t pos = w->n; pos < w->n + PER_ROUND; pos++)
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
      uint16_t *k = kw_at(w, pos, layer, 0), *v = kw_at(w, pos, layer, 1);
      for (uint32_t e = 0; e < KW_ELEMS; e++) {
        size_t tag = pos + 1000u * (uint32_t)w->id[0] + 7919u * (uint32_t)w->id[1] + 104729u * w->salt;
        k[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 0, e));
        v[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 1, e));
      }
      cr_assert_eq(ckv_session_write_kv(w->s, pos, layer, k, v), CKV_OK);
    }
  w->n += PER_ROUND;
  if (half) return;
  float *attn = malloc(w->n * sizeof(float));
  cr_assert_not_null(attn);
  for (size_t pos = 0; pos < w->n; pos++)
    attn[pos] = pos % 8 == 1 ? 4.f : pos + PER_ROUND >= w->n ? 1.f : (pos % 3 == 0 && w->round > 6) ? 0.f : 0.3f;
  ckv_round_result rr;
  r = ckv_session_report(w->s, ++w->round, 0, attn, w->n, &rr);
  free(attn);
  cr_assert_eq(r, CKV_OK, "report %s round %u: %s (%s)", w->id, w->round, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_ack(w->s, rr.epoch, NULL), CKV_OK);
}

/* The session's view after a resume: every draft slot holds a position
 * below its token count, at most once, with exactly the bytes the worker
 * wrote there (so no other session's or no older write's); with draft_only,
 * every position below the count is in a draft slot.  Returns the count. */
static size_t kw_verify(ckv_client *c, kworker *w, bool draft_only, const char *when) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(w->s, &v);
  cr_assert_eq(r, CKV_OK, "%s: view of %s: %s (%s)", when, w->id, ckv_strerror(r), ckv_client_last_error(c));
  size_t t = ckv_session_tokens(w->s);
  cr_assert_eq(v->n_tokens, t, "%s: %s: the view has %llu tokens, the session %zu", when, w->id,
               (unsigned long long)v->n_tokens, t);
  cr_assert_leq(t, w->n, "%s: %s came back with %zu tokens, the worker wrote %zu", when, w->id, t, w->n);
  cr_assert_eq(t % PER_ROUND, 0, "%s: %s came back with %zu tokens: not a whole append", when, w->id, t);
  if (draft_only)
    cr_assert_eq(v->n_staged + v->n_committed + v->n_cold, 0, "%s: %s (%s) has compressed blocks", when, w->id,
                 w->policy);
  uint8_t *seen = calloc(t ? t : 1, 1);
  cr_assert_not_null(seen);
  size_t elems = KW_ELEMS;
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *b = &v->draft[i];
    const uint32_t *pos = ckv_block_positions_const(b->data);
    for (uint32_t slot = 0; slot < b->capacity; slot++) {
      if (!ckv_block_slot_valid(b->data, slot)) continue;
      uint32_t p = pos[slot];
      cr_assert_lt(p, t, "%s: %s: a draft slot holds position %u of %zu", when, w->id, p, t);
      cr_assert_not(seen[p], "%s: %s: position %u in two slots", when, w->id, p);
      seen[p] = 1;
      for (uint32_t layer = 0; layer < LAYERS; layer++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint8_t *at = (const uint8_t *)b->data + ckv_draft_kv_offset(&k_geom, b->capacity, layer, kv, slot);
          cr_assert_eq(memcmp(at, kw_at(w, p, layer, kv), elems * sizeof(uint16_t)), 0,
                       "%s: %s: position %u layer %u %s differs from what the worker wrote", when, w->id, p, layer,
                       kv ? "V" : "K");
        }
    }
  }
  if (draft_only)
    for (size_t p = 0; p < t; p++) cr_assert(seen[p], "%s: %s: position %zu is in no slot", when, w->id, p);
  free(seen);
  return t;
}

/* After a restart: the worker resumes w; CKV_OK with the session's count
 * checked (kw_verify) and the worker's books set to it, else the code and
 * the daemon's text in msg. */
static int kw_resume(ckv_client *c, kworker *w, char *msg, size_t msglen, size_t *ret_tokens, const char *when) {
  int r;
  ckv_session_close(w->s);
  w->s = resume(c, w->id, &r, msg, msglen);
  if (r != CKV_OK) return r;
  size_t t = kw_verify(c, w, strcmp(w->policy, "fp16") == 0, when);
  w->n = t;
  *ret_tokens = t;
  return CKV_OK;
}

static void kw_free(kworker *w) {
  ckv_session_close(w->s);
  free(w->copy);
  memset(w, 0, sizeof *w);
}

/* kill -9 and the wait for systemd's restart; the worker reconnects onto the same mapping. */
static void kill_and_reconnect(sdenv *e, ckv_client *c, const ckv_arena *mapping) {
  long old_pid = e->d.pid;
  cr_assert_eq(kill((pid_t)old_pid, SIGKILL), 0);
  wait_restarted(e, old_pid);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c), "the worker had to map the arena anew after a kill (daemon log %s)", e->d.log);
  cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
}

/* Long enough for the moves of the last round to land and the journal (100 ms period, housekeeping 100 ms, the
 * write) to hold every change, with room for a loaded machine (2 shared cores at a load of 3-4 here).
 * The premise is time-based: the journal promises a period plus the write, not a bound under any load. */
#define KW_SETTLE_US 1500000u
#define KW_KILLS 8

static int cmp_ll(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return x < y ? -1 : x > y;
}

Test(warm, kill9_loop_keeps_journaled_sessions, .timeout = 300) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  kworker f0, f1, m0, d;
  kw_open(c, &f0, "f0", "fp16");
  kw_open(c, &f1, "f1", "fp16");
  kw_open(c, &m0, "m0", "commitkv");
  kworker *all[] = {&f0, &f1, &m0};
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 3; k++) kw_round(c, all[k], false);
  const ckv_arena *mapping = c->arena;
  long long served_ms[KW_KILLS];
  size_t came_back_partial = 0, new_kept = 0, new_not_found = 0;
  char msg[512];
  for (int cycle = 0; cycle < KW_KILLS; cycle++) {
    int kind = cycle % 4;
    char when[64];
    snprintf(when, sizeof when, "kill %d (kind %d)", cycle + 1, kind);
    for (int k = 0; k < 3; k++) kw_round(c, all[k], false);
    if (kind == 3) { /* a session that will be dropped just before the kill */
      char id[32];
      snprintf(id, sizeof id, "d%d", cycle);
      kw_open(c, &d, id, "fp16");
      kw_round(c, &d, false);
    }
    usleep(KW_SETTLE_US); /* the journal catches up: everything so far must come back */
    for (int k = 0; k < 3; k++) all[k]->settled = all[k]->n;
    ckv_capture before_m0 = ckv_test_capture_view(c, "m0", &k_geom);
    kworker x = {0};
    bool have_x = false;
    if (kind == 1) /* three rounds more, killed right after their replies: the moves of the first free blocks the
                      journal names (at the second's ack), the third's appends would take them (without the hold) */
      for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3; k++) kw_round(c, all[k], false);
    if (kind == 2) { /* half a round (appended and written, not reported), and a session opened just now */
      kw_round(c, &f0, /* half= */ true);
      char id[32];
      snprintf(id, sizeof id, "x%d", cycle);
      kw_open(c, &x, id, "fp16");
      kw_round(c, &x, false);
      have_x = true;
    }
    if (kind == 3) {
      int r = ckv_session_drop(d.s);
      cr_assert_eq(r, CKV_OK, "drop %s: %s (%s)", d.id, ckv_strerror(r), ckv_client_last_error(c));
      d.s = NULL;
    }
    long long t0 = ckv_test_now_ms();
    kill_and_reconnect(e, c, mapping);
    for (int k = 0; k < 3; k++) {
      kworker *w = all[k];
      size_t t = 0, wrote = w->n;
      int r = kw_resume(c, w, msg, sizeof msg, &t, when);
      cr_assert_eq(r, CKV_OK, "%s: resume %s (journaled with %zu tokens): %s (%s); daemon log %s", when, w->id,
                   w->settled, ckv_strerror(r), msg, e->d.log);
      cr_assert_geq(t, w->settled, "%s: %s came back with %zu tokens, the journal had time to hold %zu (log %s)",
                    when, w->id, t, w->settled, e->d.log);
      if (kind == 0 || kind == 3)
        cr_assert_eq(t, wrote, "%s: %s came back with %zu tokens of %zu, nothing changed after the journal (log %s)",
                     when, w->id, t, wrote, e->d.log);
      came_back_partial += t < wrote;
    }
    if (kind == 0 || kind == 3) { /* m0 exactly as the worker last saw it: every block, every byte, every format */
      ckv_capture after_m0 = ckv_test_capture_view(c, "m0", &k_geom);
      ckv_test_expect_same_view(&before_m0, &after_m0, when);
      ckv_test_capture_free(&after_m0);
    }
    ckv_test_capture_free(&before_m0);
    if (have_x) {
      size_t t = 0;
      int r = kw_resume(c, &x, msg, sizeof msg, &t, when);
      if (r == CKV_OK) {
        new_kept++;
      } else {
        cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of %s, opened just before the kill: %s (%s)", when, x.id,
                     ckv_strerror(r), msg);
        cr_assert(strstr(msg, "killed or crashed"), "%s: NOT_FOUND for %s does not say why: %s", when, x.id, msg);
        new_not_found++;
      }
      kw_free(&x);
    }
    if (kind == 3) { /* dropped before the kill: never back, whatever the journal held */
      int r;
      ckv_session *s = resume(c, d.id, &r, msg, sizeof msg);
      cr_assert_null(s, "%s: %s was dropped before the kill and came back", when, d.id);
      cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of dropped %s: %s (%s)", when, d.id, ckv_strerror(r), msg);
      cr_assert(strstr(msg, "ended") || strstr(msg, "killed or crashed"),
                "%s: NOT_FOUND for dropped %s does not say why: %s", when, d.id, msg);
      free(d.copy);
      memset(&d, 0, sizeof d);
    }
    /* the next round is served on the kept blocks: the time from the kill to it */
    for (int k = 0; k < 3; k++) kw_round(c, all[k], false);
    served_ms[cycle] = ckv_test_now_ms() - t0;
    for (int k = 0; k < 2; k++) kw_verify(c, all[k], true, "the round after the kill");
  }
  cr_assert(log_has(e->d.log, "warm-journal-killed"), "no start said the journal was a killed daemon's (log %s)",
            e->d.log);
  cr_assert_not(log_has(e->d.log, "warm-session-dropped tenant=default session=f"), "a kept session was dropped");
  qsort(served_ms, KW_KILLS, sizeof served_ms[0], cmp_ll);
  printf("kill9_loop: %d kills; kill -9 to the first round served again on the kept blocks: min %lld ms, median "
         "%lld ms, max %lld ms; sessions back short of their last round (changed after the last checkpoint): %zu; "
         "sessions opened just before a kill: %zu kept, %zu NOT_FOUND\n",
         KW_KILLS, served_ms[0], served_ms[KW_KILLS / 2], served_ms[KW_KILLS - 1], came_back_partial, new_kept,
         new_not_found);
  fflush(stdout);
  for (int k = 0; k < 3; k++) kw_free(all[k]);
  ckv_client_free(c);
  sd_stop(e);
}

Test(warm, kill9_damaged_entry_drops_only_it, .timeout = 240) {
  sdenv *e = &g_sd;
  /* every batch a checkpoint (the log compacted at once): b's entry file is
   * its last state, not a record of the log */
  snprintf(g_unit_env, sizeof g_unit_env, "CKV_TEST_WARM_COMPACT_BYTES=1");
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  kworker a, b;
  kw_open(c, &a, "a", "fp16");
  kw_open(c, &b, "b", "fp16");
  for (int i = 0; i < 3; i++) {
    kw_round(c, &a, false);
    kw_round(c, &b, false);
  }
  const ckv_arena *mapping = c->arena;
  const char *kinds[] = {"entry", "entrytrunc"};
  char msg[512];
  for (int k = 0; k < 2; k++) {
    kw_round(c, &a, false);
    kw_round(c, &b, false);
    usleep(KW_SETTLE_US);
    request_damage(e, kinds[k]); /* between the kill and the next start */
    kill_and_reconnect(e, c, mapping);
    size_t t = 0;
    int r = kw_resume(c, &b, msg, sizeof msg, &t, kinds[k]);
    cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of the damaged one: %s (%s)", kinds[k], ckv_strerror(r), msg);
    cr_assert(strstr(msg, "warm restart dropped it") && strstr(msg, "journal entry was refused"),
              "%s: NOT_FOUND does not say why: %s", kinds[k], msg);
    size_t wrote = a.n;
    r = kw_resume(c, &a, msg, sizeof msg, &t, kinds[k]);
    cr_assert_eq(r, CKV_OK, "%s: resume of the other: %s (%s)", kinds[k], ckv_strerror(r), msg);
    cr_assert_eq(t, wrote, "%s: a came back with %zu tokens of %zu", kinds[k], t, wrote);
    cr_assert(log_has(e->d.log, "warm-session-dropped"), "%s: the drop is not in the log", kinds[k]);
    /* b begins again: a new conversation of the id, from nothing */
    free(b.copy);
    kw_open(c, &b, "b", "fp16");
    kw_round(c, &b, false);
    kw_verify(c, &b, true, "b anew");
  }
  kw_free(&a);
  kw_free(&b);
  ckv_client_free(c);
  sd_stop(e);
}

/* A worker that retries ckv_client_reconnect while systemd restarts the
 * daemon (as commitkv-bench failover and the heartbeat thread do) gets the
 * mapping it kept at the attempt that succeeds.  Before the fix, a failed
 * attempt freed the kept mapping: the next success mapped the arena anew
 * (ckv_client_arena_kept false, every pointer into the old mapping stale). */
Test(warm, kill9_reconnect_retries_keep_mapping, .timeout = 120) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  kworker a;
  kw_open(c, &a, "a", "fp16");
  for (int i = 0; i < 3; i++) kw_round(c, &a, false);
  usleep(KW_SETTLE_US);
  const ckv_arena *mapping = c->arena;
  long old = e->d.pid;
  cr_assert_eq(kill((pid_t)old, SIGKILL), 0);
  int failed = 0, r;
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while ((r = ckv_client_reconnect(c)) != CKV_OK) { /* no wait for the restart: the attempts fail until it is up */
    failed++;
    cr_assert_lt(ckv_test_now_ms(), end, "no reconnect: %s (daemon log %s)", ckv_strerror(r), e->d.log);
    usleep(2000);
  }
  cr_assert_gt(failed, 1, "the reconnect never failed: the test did not retry through the restart");
  cr_assert(ckv_client_arena_kept(c), "after %d failed attempts the mapping was not kept (daemon log %s)", failed,
            e->d.log);
  cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
  e->d.pid = (pid_t)main_pid(e);
  char msg[512];
  size_t t = 0;
  r = kw_resume(c, &a, msg, sizeof msg, &t, "retried reconnect");
  cr_assert_eq(r, CKV_OK, "resume: %s (%s)", ckv_strerror(r), msg);
  cr_assert_eq(t, a.n);
  kw_round(c, &a, false);
  kw_free(&a);
  ckv_client_free(c);
  sd_stop(e);
}

/* ---- kill -9 at random points in the middle of rounds (issue 43) ---- */

/* A session of the random-kill worker: what the daemon acknowledged, what
 * it may have taken without a reply reaching the worker, and which
 * positions hold bytes the worker wrote (its private copy). */
typedef struct rworker {
  kworker w;         /* w.n: tokens whose append was answered (or that came back) */
  uint8_t *valid;    /* [pos]: the worker wrote this position's K/V */
  size_t pending;    /* tokens of an append sent whose reply did not come */
  uint64_t acked_epoch; /* the epoch of the last report answered */
  enum { RW_NONE, RW_OPEN, RW_DROP } op; /* an open or drop sent whose reply did not come */
  unsigned gen;
  char base[8];
} rworker;

/* The killer: every time it is armed, it waits a random 20-350 ms and
 * sends SIGKILL to the daemon, while the worker is somewhere in its rounds. */
typedef struct rkiller {
  pthread_mutex_t m;
  pthread_cond_t cv;
  pid_t target; /* armed when > 0 */
  pid_t killed; /* the pid it killed, until the worker has recovered */
  unsigned seed;
  bool stop;
} rkiller;

static void *rkiller_main(void *arg) {
  rkiller *k = arg;
  pthread_mutex_lock(&k->m);
  for (;;) {
    while (!k->target && !k->stop) pthread_cond_wait(&k->cv, &k->m);
    if (k->stop) break;
    pid_t pid = k->target;
    k->target = 0;
    unsigned wait_us = 20000u + (unsigned)(rand_r(&k->seed) % 330000u);
    pthread_mutex_unlock(&k->m);
    usleep(wait_us);
    kill(pid, SIGKILL);
    pthread_mutex_lock(&k->m);
    k->killed = pid;
    pthread_cond_broadcast(&k->cv);
  }
  pthread_mutex_unlock(&k->m);
  return NULL;
}

#define RK_KILLS 50
#define RK_WORKERS 4

static void rw_open(ckv_client *c, rworker *rw) {
  char id[32];
  snprintf(id, sizeof id, "%s-%u", rw->base, rw->gen);
  const char *policy = rw->w.policy;
  uint16_t *copy = rw->w.copy;
  ckv_session *s = NULL;
  bool moves = strcmp(policy, "commitkv") == 0;
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  const double values[] = {4, 16, 2, 6};
  ckv_session_options so = {.policy = policy, .param_names = moves ? names : NULL, .param_values = moves ? values : NULL,
                            .n_params = moves ? 4 : 0, .model_id = "stories260K", .model_revision = "r1"};
  rw->op = RW_OPEN;
  snprintf(rw->w.id, sizeof rw->w.id, "%s", id);
  rw->w.s = NULL;
  int r = ckv_session_open(c, id, &k_geom, &so, &s);
  if (r != CKV_OK) return; /* the kill: recovered by rw_recover */
  rw->op = RW_NONE;
  rw->w.s = s;
  rw->w.n = 0;
  rw->w.round = 0;
  rw->pending = 0;
  rw->acked_epoch = 0;
  memset(rw->valid, 0, KW_MAX_TOKENS);
  (void)copy;
}

/* One round of rw (a new session in its place when it is full); CKV_OK or
 * the code of the call the kill cut short. */
static int rw_round(ckv_client *c, rworker *rw) {
  kworker *w = &rw->w;
  if (rw->op == RW_OPEN) return CKV_ERR_STATE;
  if (w->n + PER_ROUND > KW_MAX_TOKENS) { /* full: a new conversation under a new id */
    rw->op = RW_DROP;
    int r = ckv_session_drop(w->s);
    w->s = NULL;
    if (r != CKV_OK) return r;
    rw->op = RW_NONE;
    rw->gen++;
    rw_open(c, rw);
    return rw->op == RW_NONE ? CKV_OK : CKV_ERR_STATE;
  }
  float sem[PER_ROUND];
  for (uint32_t i = 0; i < PER_ROUND; i++) sem[i] = (w->n + i) % 8 == 1 ? 0.9f : 0.5f;
  uint64_t first = 0;
  rw->pending = PER_ROUND;
  int r = ckv_session_append(w->s, PER_ROUND, NULL, NULL, sem, NULL, &first);
  if (r != CKV_OK) return r;
  cr_assert_eq(first, w->n, "append %s: first position %llu, the worker has %zu", w->id, (unsigned long long)first,
               w->n);
  w->n += PER_ROUND;
  rw->pending = 0;
  w->salt++;
  for (size_t pos = w->n - PER_ROUND; pos < w->n; pos++) {
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
      uint16_t *k = kw_at(w, pos, layer, 0), *v = kw_at(w, pos, layer, 1);
      for (uint32_t e = 0; e < KW_ELEMS; e++) {
        size_t tag = pos + 1000u * (uint32_t)w->id[0] + 7919u * (uint32_t)w->id[1] + 104729u * w->salt;
        k[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 0, e));
        v[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 1, e));
      }
      if ((r = ckv_session_write_kv(w->s, pos, layer, k, v)) != CKV_OK) return r;
    }
    rw->valid[pos] = 1;
  }
  float attn[KW_MAX_TOKENS];
  for (size_t pos = 0; pos < w->n; pos++) attn[pos] = pos % 8 == 1 ? 4.f : pos + PER_ROUND >= w->n ? 1.f : 0.3f;
  ckv_round_result rr;
  if ((r = ckv_session_report(w->s, ++w->round, 0, attn, w->n, &rr)) != CKV_OK) return r;
  rw->acked_epoch = rr.epoch;
  return ckv_session_ack(w->s, rr.epoch, NULL);
}

/* rw's view after a resume: every draft slot holds a position below the
 * count, at most once, and every position the worker wrote reads exactly
 * its bytes; with draft_only every position is in a slot. */
static void rw_verify(ckv_client *c, rworker *rw, bool draft_only, const char *when) {
  kworker *w = &rw->w;
  const ckv_view *v = NULL;
  int r = ckv_session_view(w->s, &v);
  cr_assert_eq(r, CKV_OK, "%s: view of %s: %s (%s)", when, w->id, ckv_strerror(r), ckv_client_last_error(c));
  size_t t = ckv_session_tokens(w->s);
  uint8_t *seen = calloc(t ? t : 1, 1);
  cr_assert_not_null(seen);
  size_t compared = 0;
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *b = &v->draft[i];
    const uint32_t *pos = ckv_block_positions_const(b->data);
    for (uint32_t slot = 0; slot < b->capacity; slot++) {
      if (!ckv_block_slot_valid(b->data, slot)) continue;
      uint32_t p = pos[slot];
      cr_assert_lt(p, t, "%s: %s: a draft slot holds position %u of %zu", when, w->id, p, t);
      cr_assert_not(seen[p], "%s: %s: position %u in two slots", when, w->id, p);
      seen[p] = 1;
      if (!rw->valid[p]) continue; /* appended without the reply reaching the worker: never written */
      for (uint32_t layer = 0; layer < LAYERS; layer++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint8_t *at = (const uint8_t *)b->data + ckv_draft_kv_offset(&k_geom, b->capacity, layer, kv, slot);
          cr_assert_eq(memcmp(at, kw_at(w, p, layer, kv), KW_ELEMS * sizeof(uint16_t)), 0,
                       "%s: %s: position %u layer %u %s differs from the worker's copy", when, w->id, p, layer,
                       kv ? "V" : "K");
        }
      compared++;
    }
  }
  if (draft_only)
    for (size_t p = 0; p < t; p++) cr_assert(seen[p], "%s: %s: position %zu is in no slot", when, w->id, p);
  free(seen);
  (void)compared;
}

/* After the restart: rw comes back as the daemon acknowledged it, or (an
 * open or drop cut short) either way, saying why when it does not. */
static void rw_recover(ckv_client *c, sdenv *e, rworker *rw, const char *when, size_t *ret_kept_tokens) {
  kworker *w = &rw->w;
  char msg[512];
  int r;
  if (w->s) ckv_session_close(w->s);
  w->s = resume(c, w->id, &r, msg, sizeof msg);
  if (rw->op == RW_OPEN || rw->op == RW_DROP) { /* its reply never came: either outcome is right */
    if (r != CKV_OK) {
      cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: resume of %s (%s cut short): %s (%s)", when, w->id,
                   rw->op == RW_OPEN ? "open" : "drop", ckv_strerror(r), msg);
      cr_assert(strstr(msg, "killed or crashed") || strstr(msg, "ended"), "%s: NOT_FOUND for %s does not say why: %s",
                when, w->id, msg);
    } else if (rw->op == RW_DROP) {
      cr_assert_eq(ckv_session_drop(w->s), CKV_OK, "%s: drop %s again", when, w->id);
      w->s = NULL;
    } else {
      cr_assert_eq(ckv_session_tokens(w->s), 0, "%s: %s, opened just before the kill, has tokens", when, w->id);
    }
    if (rw->op == RW_DROP || r != CKV_OK) {
      if (w->s) { /* an open that came back after all: dropped, a new one below */
        cr_assert_eq(ckv_session_drop(w->s), CKV_OK);
        w->s = NULL;
      }
      rw->gen++;
      rw->op = RW_NONE;
      rw_open(c, rw);
      cr_assert_eq(rw->op, RW_NONE, "%s: open of %s after the restart: %s", when, w->id, ckv_client_last_error(c));
    } else {
      rw->op = RW_NONE;
      w->n = 0;
      w->round = 0;
      memset(rw->valid, 0, KW_MAX_TOKENS);
    }
    return;
  }
  /* its open was answered: it must come back, with every change answered */
  cr_assert_eq(r, CKV_OK, "%s: resume of %s (%zu tokens answered): %s (%s); daemon log %s", when, w->id, w->n,
               ckv_strerror(r), msg, e->d.log);
  size_t t = ckv_session_tokens(w->s);
  cr_assert_geq(t, w->n, "%s: %s came back with %zu tokens, the daemon had answered appends of %zu (log %s)", when,
                w->id, t, w->n, e->d.log);
  cr_assert_leq(t, w->n + rw->pending, "%s: %s came back with %zu tokens, the worker sent appends of %zu", when,
                w->id, t, w->n + rw->pending);
  if (rw->acked_epoch)
    cr_assert_gt(ckv_session_epoch(w->s), rw->acked_epoch,
                 "%s: %s came back at epoch %llu, its report answered epoch %llu (log %s)", when, w->id,
                 (unsigned long long)ckv_session_epoch(w->s), (unsigned long long)rw->acked_epoch, e->d.log);
  rw_verify(c, rw, strcmp(w->policy, "fp16") == 0, when);
  *ret_kept_tokens += t;
  w->n = t; /* an unanswered append it kept: its positions stay unwritten (valid 0) */
  rw->pending = 0;
}

Test(warm, kill9_random_points_keep_every_answered_change, .timeout = 600) {
  sdenv *e = &g_sd;
  /* the log compacted into a checkpoint every 256 KiB: kills land in
   * compactions too */
  snprintf(g_unit_env, sizeof g_unit_env, "CKV_TEST_WARM_COMPACT_BYTES=262144");
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client_options o = {.socket = e->d.socket, .attach_socket = e->d.attach, .name = "test_warm_restart",
                          .timeout_ms = 1500};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  const ckv_arena *mapping = c->arena;
  rworker rws[RK_WORKERS];
  const char *policies[RK_WORKERS] = {"fp16", "fp16", "fp16", "commitkv"};
  for (int i = 0; i < RK_WORKERS; i++) {
    memset(&rws[i], 0, sizeof rws[i]);
    snprintf(rws[i].base, sizeof rws[i].base, "r%d", i);
    rws[i].w.policy = policies[i];
    rws[i].w.copy = calloc((size_t)KW_MAX_TOKENS * LAYERS * 2u * KW_ELEMS, sizeof(uint16_t));
    rws[i].valid = calloc(KW_MAX_TOKENS, 1);
    cr_assert(rws[i].w.copy && rws[i].valid);
    rw_open(c, &rws[i]);
    cr_assert_eq(rws[i].op, RW_NONE, "open: %s", ckv_client_last_error(c));
  }
  rkiller k = {.seed = 4242};
  pthread_mutex_init(&k.m, NULL);
  pthread_cond_init(&k.cv, NULL);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, rkiller_main, &k), 0);
  size_t rounds = 0, answered_tokens = 0, kept_tokens = 0, cut_short = 0;
  long long worst_ms = 0;
  for (int kill_no = 0; kill_no < RK_KILLS; kill_no++) {
    pthread_mutex_lock(&k.m);
    k.target = e->d.pid;
    pthread_cond_signal(&k.cv);
    pthread_mutex_unlock(&k.m);
    /* rounds until the kill cuts one short */
    int code = CKV_OK;
    for (int i = 0; code == CKV_OK; i = (i + 1) % RK_WORKERS) {
      code = rw_round(c, &rws[i]);
      rounds += code == CKV_OK;
      if (code != CKV_OK)
        cr_assert(code == CKV_ERR_DAEMON_RESTARTED || code == CKV_ERR_TIMEOUT || code == CKV_ERR_DISCONNECTED ||
                      code == CKV_ERR_STATE,
                  "kill %d: %s: %s (%s)", kill_no + 1, rws[i].w.id, ckv_strerror(code), ckv_client_last_error(c));
    }
    pthread_mutex_lock(&k.m);
    while (!k.killed) pthread_cond_wait(&k.cv, &k.m); /* an error before the kill: it comes all the same */
    pid_t old = k.killed;
    k.killed = 0;
    pthread_mutex_unlock(&k.m);
    long long t0 = ckv_test_now_ms();
    wait_restarted(e, old);
    long long end = ckv_test_now_ms() + DEADLINE_MS;
    while ((r = ckv_client_reconnect(c)) != CKV_OK) {
      cr_assert_lt(ckv_test_now_ms(), end, "kill %d: no reconnect: %s (log %s)", kill_no + 1, ckv_strerror(r),
                   e->d.log);
      usleep(5000);
    }
    cr_assert(ckv_client_arena_kept(c), "kill %d: the arena was mapped anew (log %s)", kill_no + 1, e->d.log);
    cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
    char when[48];
    snprintf(when, sizeof when, "kill %d", kill_no + 1);
    for (int i = 0; i < RK_WORKERS; i++) {
      answered_tokens += rws[i].op == RW_NONE ? rws[i].w.n : 0;
      cut_short += rws[i].pending || rws[i].op != RW_NONE;
      rw_recover(c, e, &rws[i], when, &kept_tokens);
    }
    /* the next round reads identical K/V on the kept blocks */
    for (int i = 0; i < RK_WORKERS; i++) {
      r = rw_round(c, &rws[i]);
      cr_assert_eq(r, CKV_OK, "%s: the round after the restart of %s: %s (%s)", when, rws[i].w.id, ckv_strerror(r),
                   ckv_client_last_error(c));
      rw_verify(c, &rws[i], strcmp(rws[i].w.policy, "fp16") == 0, "the round after the restart");
    }
    long long ms = ckv_test_now_ms() - t0;
    if (ms > worst_ms) worst_ms = ms;
  }
  pthread_mutex_lock(&k.m);
  k.stop = true;
  pthread_cond_signal(&k.cv);
  pthread_mutex_unlock(&k.m);
  pthread_join(th, NULL);
  cr_assert(log_has(e->d.log, "warm-journal-killed"), "no start said the journal was a killed daemon's");
  cr_assert(log_has(e->d.log, "from log record"), "no session came back from the log (log %s)", e->d.log);
  printf("kill9_random: %d kills at random points, %zu rounds answered; tokens answered before the kills %zu, came "
         "back %zu; requests cut short by a kill %zu; restart to the next round of every session at most %lld ms\n",
         RK_KILLS, rounds, answered_tokens, kept_tokens, cut_short, worst_ms);
  fflush(stdout);
  for (int i = 0; i < RK_WORKERS; i++) {
    if (rws[i].w.s) ckv_session_close(rws[i].w.s);
    free(rws[i].w.copy);
    free(rws[i].valid);
  }
  ckv_client_free(c);
  sd_stop(e);
}

/* ---- a torn or damaged journal log is cut at its last good record ---- */

typedef struct lrec {
  size_t off, len;
  uint32_t type;
  char id[130];
} lrec;

/* The records of STATE/warm/journal.log (persist/warmlog.h's format), read
 * by the test itself: at most max, their count returned. */
static size_t read_log_records(const sdenv *e, lrec *out, size_t max) {
  char path[400];
  snprintf(path, sizeof path, "%s/warm/journal.log", e->state);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "no journal log at %s", path);
  static uint8_t buf[8u << 20];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  size_t at = 32, n = 0;
  while (at + 40 <= len && n < max) {
    uint32_t type;
    uint16_t tl, il;
    uint64_t el;
    memcpy(&type, buf + at + 4, 4);
    memcpy(&tl, buf + at + 16, 2);
    memcpy(&il, buf + at + 18, 2);
    memcpy(&el, buf + at + 24, 8);
    size_t total = 40u + tl + il + (size_t)el;
    cr_assert_leq(at + total, len, "a record of the live log runs past its end");
    lrec *r = &out[n++];
    r->off = at;
    r->len = total;
    r->type = type;
    snprintf(r->id, sizeof r->id, "%.*s", (int)il, (const char *)buf + at + 40 + tl);
    at += total;
  }
  cr_assert_eq(at, len, "the live log does not end on a record");
  return n;
}

/* The last record of session `id` (its index), asserting there is one. */
static size_t last_record_of(const lrec *r, size_t n, const char *id) {
  for (size_t i = n; i-- > 0;)
    if (strcmp(r[i].id, id) == 0) return i;
  cr_assert_fail("no record of %s in the log", id);
  return 0;
}

Test(warm, kill9_log_cut_at_last_good_record, .timeout = 240) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  kworker a, b;
  kw_open(c, &a, "a", "fp16");
  kw_open(c, &b, "b", "fp16");
  for (int i = 0; i < 3; i++) {
    kw_round(c, &a, false);
    kw_round(c, &b, false);
  }
  const ckv_arena *mapping = c->arena;
  char msg[512], req[64];
  static lrec recs[4096];
  size_t t = 0;

  /* 1: a torn tail.  b's half round (appended and written, its reply came)
   * is the log's last record; the kill tears it 5 bytes into its entry. */
  size_t b_before = b.n;
  kw_round(c, &b, /* half= */ true);
  size_t n = read_log_records(e, recs, 4096);
  size_t lb = last_record_of(recs, n, "b");
  cr_assert_eq(lb, n - 1, "b's append is not the log's last record");
  snprintf(req, sizeof req, "logtrunc %zu", recs[lb].off + 45);
  request_damage(e, req);
  kill_and_reconnect(e, c, mapping);
  cr_assert(log_has(e->d.log, "warm-log-cut"), "the torn tail was not cut (log %s)", e->d.log);
  size_t a_had = a.n;
  cr_assert_eq(kw_resume(c, &a, msg, sizeof msg, &t, "torn tail"), CKV_OK, "resume a: %s", msg);
  cr_assert_eq(t, a_had, "torn tail: a came back with %zu tokens of %zu", t, a_had);
  cr_assert_eq(kw_resume(c, &b, msg, sizeof msg, &t, "torn tail"), CKV_OK, "resume b: %s", msg);
  cr_assert_eq(t, b_before, "torn tail: b came back with %zu tokens, its last good record holds %zu", t, b_before);
  kw_round(c, &a, false);
  kw_round(c, &b, false);
  kw_verify(c, &a, true, "after the torn tail");
  kw_verify(c, &b, true, "after the torn tail");

  /* 2: a damaged record in the middle.  a's half round, then b's: a
   * byte of a's record flipped.  Both come back as of their records
   * before it: b's later record is intact but after the cut. */
  size_t a_mid = a.n, b_mid = b.n;
  kw_round(c, &a, true);
  kw_round(c, &b, true);
  n = read_log_records(e, recs, 4096);
  size_t la = last_record_of(recs, n, "a");
  lb = last_record_of(recs, n, "b");
  cr_assert_lt(la, lb, "a's record is not before b's");
  snprintf(req, sizeof req, "logflip %zu", recs[la].off + recs[la].len - 100);
  request_damage(e, req);
  kill_and_reconnect(e, c, mapping);
  cr_assert(log_has(e->d.log, "checksum mismatch"), "the damaged record was not cut (log %s)", e->d.log);
  cr_assert_eq(kw_resume(c, &a, msg, sizeof msg, &t, "damaged record"), CKV_OK, "resume a: %s", msg);
  cr_assert_eq(t, a_mid, "damaged record: a came back with %zu tokens, its last good record holds %zu", t, a_mid);
  cr_assert_eq(kw_resume(c, &b, msg, sizeof msg, &t, "damaged record"), CKV_OK, "resume b: %s", msg);
  cr_assert_eq(t, b_mid, "damaged record: b came back with %zu tokens: a record after the cut was applied (%zu)", t,
               b_mid);
  kw_round(c, &a, false);
  kw_round(c, &b, false);
  kw_verify(c, &a, true, "after the damaged record");
  kw_verify(c, &b, true, "after the damaged record");
  kw_free(&a);
  kw_free(&b);
  ckv_client_free(c);
  sd_stop(e);
}

/* The block of w's view that holds position `pos` (NULL: none). */
static const void *kw_block_of(kworker *w, uint32_t pos) {
  const ckv_view *v = NULL;
  cr_assert_eq(ckv_session_view(w->s, &v), CKV_OK);
  for (size_t i = 0; i < v->n_draft; i++) {
    const uint32_t *at = ckv_block_positions_const(v->draft[i].data);
    for (uint32_t slot = 0; slot < v->draft[i].capacity; slot++)
      if (ckv_block_slot_valid(v->draft[i].data, slot) && at[slot] == pos) return v->draft[i].data;
  }
  return NULL;
}

Test(warm, kill9_keeps_forked_prefix_shared, .timeout = 180) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  kworker p, f;
  kw_open(c, &p, "p", "fp16");
  for (int i = 0; i < 3; i++) kw_round(c, &p, false);
  /* the child shares the parent's first 48 tokens (three whole draft blocks) */
  memset(&f, 0, sizeof f);
  snprintf(f.id, sizeof f.id, "pf");
  f.policy = "fp16";
  f.copy = calloc((size_t)KW_MAX_TOKENS * LAYERS * 2u * KW_ELEMS, sizeof(uint16_t));
  cr_assert_not_null(f.copy);
  int r = ckv_session_fork(p.s, f.id, 48, &f.s);
  cr_assert_eq(r, CKV_OK, "fork: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_matched_tokens(f.s), 48, "the fork shares %llu tokens",
               (unsigned long long)ckv_session_matched_tokens(f.s));
  memcpy(f.copy, p.copy, (size_t)48 * LAYERS * 2u * KW_ELEMS * sizeof(uint16_t));
  f.n = 48;
  f.round = p.round;
  kw_round(c, &f, false);
  kw_round(c, &p, false);
  const ckv_arena *mapping = c->arena;
  for (int k = 0; k < 2; k++) {
    usleep(KW_SETTLE_US);
    size_t want_p = p.n, want_f = f.n, t = 0;
    char msg[512];
    kill_and_reconnect(e, c, mapping);
    r = kw_resume(c, &p, msg, sizeof msg, &t, "parent after a kill");
    cr_assert_eq(r, CKV_OK, "resume of the parent: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
    cr_assert_eq(t, want_p);
    r = kw_resume(c, &f, msg, sizeof msg, &t, "fork after a kill");
    cr_assert_eq(r, CKV_OK, "resume of the fork: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
    cr_assert_eq(t, want_f);
    /* still one copy: the fork's first blocks are the parent's, in place */
    for (uint32_t pos = 0; pos < 48; pos += 16) {
      const void *bp = kw_block_of(&p, pos), *bf = kw_block_of(&f, pos);
      cr_assert(bp && bp == bf, "position %u: the parent's block %p, the fork's %p", pos, bp, bf);
    }
    kw_round(c, &p, false);
    kw_round(c, &f, false);
  }
  kw_free(&p);
  kw_free(&f);
  ckv_client_free(c);
  sd_stop(e);
}

Test(warm, snapshot_path_without_systemd, .timeout = 120) {
  unsetenv("NOTIFY_SOCKET");
  ckv_test_daemon d;
  const char *args[] = {"--set", "daemon.detach_keep=60s", NULL};
  cr_assert_eq(ckv_test_daemon_start(&d, args), 0, "commitkvd did not start");
  ckv_client *c = connect_to(&d);
  ckv_session *a = session_with_rounds(c, "a", 8);
  cr_assert_eq(ckv_session_save(a, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before = ckv_test_capture_view(c, "a", &k_geom);
  cr_assert_eq(kill(d.pid, SIGTERM), 0);
  cr_assert_eq(ckv_test_wait(d.pid, DEADLINE_MS), 0, "commitkvd did not stop cleanly");
  char warm[400];
  snprintf(warm, sizeof warm, "%s/warm", d.dir);
  cr_assert_neq(access(warm, F_OK), 0, "a journal without a service manager: %s", warm);
  const char *argv[] = {"commitkvd", "--socket", d.socket, "--attach-socket", d.attach, "--state-dir", d.dir,
                        "--set", "daemon.metrics=", "--backend", "host", "--set", "daemon.detach_keep=60s", NULL};
  d.pid = ckv_test_spawn(argv, d.log);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (!ckv_test_attach_accepts(d.attach)) {
    cr_assert(ckv_test_daemon_alive(&d), "the new commitkvd died (log %s)", d.log);
    cr_assert_lt(ckv_test_now_ms(), end);
    usleep(10000);
  }
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_arena_kept(c));
  ckv_session_close(a);
  char msg[512];
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume from the snapshot: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after = ckv_test_capture_view(c, "a", &k_geom);
  ckv_test_expect_same_view(&before, &after, "a from its snapshot");
  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(a);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

Test(warm, stale_journal_never_applied, .timeout = 180) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = connect_to(&e->d);
  ckv_session *a = session_with_rounds(c, "a", 3);
  /* a clean restart whose journal is copied aside before the new daemon consumes it */
  request_damage(e, "stash");
  long old_pid = e->d.pid;
  cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  wait_restarted(e, old_pid);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c));
  ckv_session_close(a);
  char msg[512];
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s)", ckv_strerror(r), msg);
  /* the session moves on in the kept arena: more tokens than the stale journal knows */
  uint64_t first = 0;
  cr_assert_eq(ckv_session_append(a, 8, NULL, NULL, NULL, NULL, &first), CKV_OK, "%s", ckv_client_last_error(c));
  uint64_t now = ckv_session_tokens(a);
  /* killed, and the stale copy put back before the next start */
  request_damage(e, "unstash");
  old_pid = e->d.pid;
  cr_assert_eq(kill((pid_t)old_pid, SIGKILL), 0);
  wait_restarted(e, old_pid);
  r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  ckv_session_close(a);
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume after a stale journal: %s (%s; %llu tokens, the session had %llu)",
               ckv_strerror(r), msg, a ? (unsigned long long)ckv_session_tokens(a) : 0ull, (unsigned long long)now);
  cr_assert_not(ckv_client_arena_kept(c), "an arena of a stale journal was handed out");
  cr_assert(log_has(e->d.log, "the journal is stale"), "the stale journal was not refused (log %s)", e->d.log);
  cr_assert(strstr(msg, "journal is stale"), "NOT_FOUND does not say why: %s", msg);
  ckv_test_expect_serving(c);
  ckv_client_free(c);
  sd_stop(e);
}

/* ---- two tenants ---- */

#define TENANT_TOKENS 40u

typedef struct tenant_ctx {
  const sdenv *e;
  unsigned tag;
} tenant_ctx;

typedef struct tenant_report {
  char step[64]; /* the step that failed, "" when all went well */
  int code;
  char msg[200];
  char tenant[64];
  uint64_t gen_before, gen_after, sum_before, sum_after, tokens_after;
  int kept, same_base;
} tenant_report;

/* A commutative digest of what a view shows: per block its valid (slot,
 * position) pairs and payload; blocks may come back in another order. */
static uint64_t view_digest(ckv_session *s, int *ret_code) {
  const ckv_view *v = NULL;
  *ret_code = ckv_session_view(s, &v);
  if (*ret_code != CKV_OK) return 0;
  uint64_t sum = 0;
  const ckv_block_view *lists[3] = {v->draft, v->staged, v->committed};
  size_t counts[3] = {v->n_draft, v->n_staged, v->n_committed};
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; i < counts[k]; i++) {
      const ckv_block_view *b = &lists[k][i];
      const uint8_t *base = b->data;
      size_t head = ckv_block_payload_offset(b->capacity);
      uint64_t h = XXH64(base + head, b->bytes - head, b->format);
      const uint32_t *pos = ckv_block_positions_const(base);
      for (uint32_t slot = 0; slot < b->capacity; slot++)
        if (ckv_block_slot_valid(base, slot)) h ^= XXH64(&pos[slot], 4, slot + 1);
      sum += h;
    }
  return sum;
}

static bool wait_file(const char *path, int timeout_ms) {
  long long end = ckv_test_now_ms() + timeout_ms;
  while (access(path, F_OK) != 0) {
    if (ckv_test_now_ms() > end) return false;
    usleep(20000);
  }
  return true;
}

#define CHILD_STEP(rep, what, expr)                                                            \
  do {                                                                                         \
    int r_ = (expr);                                                                           \
    if (r_ != CKV_OK) {                                                                        \
      snprintf((rep)->step, sizeof (rep)->step, "%s", what);                                   \
      (rep)->code = r_;                                                                        \
      snprintf((rep)->msg, sizeof (rep)->msg, "%s", c ? ckv_client_last_error(c) : ckv_client_connect_error()); \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)

/* In a child as the tenant's uid: write K/V, wait for the restart, reconnect, resume, read. */
static void tenant_body(const void *vctx, void *vrep) {
  const tenant_ctx *t = vctx;
  tenant_report *rep = vrep;
  ckv_client *c = NULL;
  ckv_session *s = NULL;
  char flag[400];
  ckv_client_options o = {.socket = t->e->d.socket, .attach_socket = t->e->d.attach, .name = "warm-tenant",
                          .timeout_ms = 10000};
  CHILD_STEP(rep, "connect", ckv_client_connect(&o, &c));
  snprintf(rep->tenant, sizeof rep->tenant, "%s", ckv_client_tenant(c));
  CHILD_STEP(rep, "open", ckv_session_open(c, "same-id", &k_geom, NULL, &s));
  uint64_t first = 0;
  CHILD_STEP(rep, "append", ckv_session_append(s, TENANT_TOKENS, NULL, NULL, NULL, NULL, &first));
  for (uint64_t pos = first; pos < first + TENANT_TOKENS; pos++)
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
      uint16_t k[HEADS * DIM], v[HEADS * DIM];
      for (uint32_t el = 0; el < HEADS * DIM; el++) {
        k[el] = ckv_f32_to_f16(ckv_test_kv_value(pos + 7919u * t->tag, layer, 0, el));
        v[el] = ckv_f32_to_f16(ckv_test_kv_value(pos + 7919u * t->tag, layer, 1, el));
      }
      CHILD_STEP(rep, "write_kv", ckv_session_write_kv(s, pos, layer, k, v));
    }
  int vr;
  rep->sum_before = view_digest(s, &vr);
  CHILD_STEP(rep, "view before", vr);
  rep->gen_before = ckv_arena_generation(c->arena);
  const void *base = ckv_arena_base(c->arena);
  snprintf(flag, sizeof flag, "%s/flags/ready-%u", t->e->dir, t->tag);
  FILE *f = fopen(flag, "w");
  if (f) fclose(f);
  snprintf(flag, sizeof flag, "%s/flags/restarted", t->e->dir);
  CHILD_STEP(rep, "wait for the restart", wait_file(flag, 60000) ? CKV_OK : CKV_ERR_TIMEOUT);
  CHILD_STEP(rep, "reconnect", ckv_client_reconnect(c));
  rep->kept = ckv_client_arena_kept(c);
  rep->gen_after = ckv_arena_generation(c->arena);
  rep->same_base = ckv_arena_base(c->arena) == base;
  ckv_session_close(s);
  s = NULL;
  ckv_session_options ro = {.resume = true};
  CHILD_STEP(rep, "resume", ckv_session_open(c, "same-id", NULL, &ro, &s));
  rep->tokens_after = ckv_session_tokens(s);
  rep->sum_after = view_digest(s, &vr);
  CHILD_STEP(rep, "view after", vr);
out:
  if (s) ckv_session_close(s);
  ckv_client_free(c);
}

Test(warm, two_tenants_keep_their_own_arenas, .timeout = 180) {
  static const unsigned uids[2] = {65531, 65532};
  char conf[400];
  snprintf(conf, sizeof conf, "[tenant.w1]\nuids = %u\nquota = 64M\n[tenant.w2]\nuids = %u\nquota = 64M\n",
           uids[0], uids[1]);
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD_CONF(e, conf);
  char flags[400];
  snprintf(flags, sizeof flags, "%s/flags", e->dir);
  cr_assert_eq(mkdir(flags, 0777), 0);
  cr_assert_eq(chmod(flags, 0777), 0); /* under the umask */
  /* the children first: this process has no ZeroMQ thread yet (fork safety) */
  tenant_ctx ctx[2] = {{.e = e, .tag = 1}, {.e = e, .tag = 2}};
  pid_t pid[2];
  int fd[2];
  for (int i = 0; i < 2; i++)
    pid[i] = ckv_test_begin_as(uids[i], uids[i], tenant_body, &ctx[i], sizeof(tenant_report), &fd[i]);
  for (int i = 0; i < 2; i++) {
    char ready[460];
    snprintf(ready, sizeof ready, "%s/ready-%u", flags, ctx[i].tag);
    if (!wait_file(ready, DEADLINE_MS)) break; /* the report says why */
  }
  long old_pid = e->d.pid;
  cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  wait_restarted(e, old_pid);
  char restarted[460];
  snprintf(restarted, sizeof restarted, "%s/restarted", flags);
  write_file(restarted, "");
  tenant_report rep[2];
  for (int i = 0; i < 2; i++) {
    ckv_test_end_as(pid[i], fd[i], &rep[i], sizeof rep[i], DEADLINE_MS * 2);
    cr_assert_str_empty(rep[i].step, "tenant uid %u: %s failed: %s (%s); daemon log %s", uids[i], rep[i].step,
                        ckv_strerror(rep[i].code), rep[i].msg, e->d.log);
    cr_assert_str_eq(rep[i].tenant, i ? "w2" : "w1");
    cr_assert(rep[i].kept, "tenant %s: its mapping was not kept", rep[i].tenant);
    cr_assert(rep[i].same_base, "tenant %s: the client swapped its mapping", rep[i].tenant);
    cr_assert_eq(rep[i].gen_after, rep[i].gen_before, "tenant %s was handed another arena", rep[i].tenant);
    cr_assert_eq(rep[i].tokens_after, TENANT_TOKENS);
    cr_assert_eq(rep[i].sum_after, rep[i].sum_before, "tenant %s reads other K/V after the restart", rep[i].tenant);
  }
  cr_assert_neq(rep[0].gen_before, rep[1].gen_before, "two tenants shared an arena");
  cr_assert_neq(rep[0].sum_before, rep[1].sum_before, "the tenants wrote the same K/V: the check proves nothing");
  sd_stop(e);
}

/* A session the warm restart kept and its worker has not resumed yet is read
 * through the mapping the worker kept: memory pressure from the tenant's
 * other sessions must not move it to disk (its blocks would be freed,
 * cleared and handed to others under the worker's pointers). */
Test(warm, pressure_spares_sessions_not_resumed, .timeout = 180) {
  sdenv *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD_CONF(e, "[daemon]\ndisk_memory = 64M\ndisk_pressure = yes\n[tenant.p]\nuids = 0\n"
                               "quota = 256K\n");
  ckv_client *c = connect_to(&e->d);
  ckv_session *a = session_with_rounds(c, "a", 12);
  cr_assert_eq(ckv_session_save(a, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_a = ckv_test_capture_view(c, "a", &k_geom);
  mapped ma;
  map_blocks(c, a, &ma);
  long old_pid = e->d.pid;
  cr_assert_eq(ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  wait_restarted(e, old_pid);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c), "the worker had to map the arena anew (daemon log %s)", e->d.log);
  ckv_session_close(a);
  /* a new session grows with system tokens (never recycled) until the quota refuses it */
  ckv_session_options so = {.policy = "commitkv", .model_id = "stories260K", .model_revision = "r1"};
  ckv_session *b = NULL;
  r = ckv_session_open(c, "b", &k_geom, &so, &b);
  cr_assert_eq(r, CKV_OK, "open b: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  uint8_t roles[32];
  memset(roles, CKV_ROLE_SYSTEM, sizeof roles);
  int batches = 0;
  for (r = CKV_OK; r == CKV_OK && batches < 64; batches++) {
    uint64_t first;
    r = ckv_session_append(b, 32, roles, NULL, NULL, NULL, &first);
  }
  cr_assert_eq(r, CKV_ERR_QUOTA, "b's growth ended with %s after %d batches (%s)", ckv_status_name(r), batches,
               ckv_client_last_error(c));
  unsigned long long moves = ckv_test_stat(&e->d, "tiers.1.pressure_moves");
  cr_assert_eq(moves, 0,
               "%llu pressure move(s): the kept session 'a', not resumed yet, went to disk under its worker's "
               "mapping (daemon log %s)",
               moves, e->d.log);
  expect_mapping_intact(&ma, "a, not resumed, after b filled the quota");
  char msg[512];
  a = resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
  ckv_capture after_a = ckv_test_capture_view(c, "a", &k_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "a resumed after b filled the quota");
  ckv_test_capture_free(&before_a);
  ckv_test_capture_free(&after_a);
  mapped_free(&ma);
  ckv_session_close(a);
  ckv_session_close(b);
  ckv_client_free(c);
  sd_stop(e);
}
