/* warmcheck.c - commitkvd as a unit of a private `systemd --user` (the
 * manager and the unit are bench/bench_systemd.c's; here the ExecStartPre
 * that damages the journal on a test's request, and failures as the
 * test's), and the worker's side of a warm restart: connect, rounds,
 * resume, what its mapping shows (warmcheck.h). */
#include "warmcheck.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "shm/arena.h"
#include "testcheck.h"

const ckv_geometry ckv_warm_geom = {CKV_WARM_LAYERS, CKV_WARM_HEADS, CKV_WARM_DIM, 0};

/* ---- a private systemd user manager (bench/bench_systemd.h) ---------- */

/* The env whose manager may run (set by ckv_warm_start, cleared by
 * ckv_warm_stop): the suite's fini stops it after a failed assertion. */
static ckv_warm_env *g_env;

int ckv_warm_ctl_unit(const ckv_warm_env *e, const char *verb) { return ckv_bench_sd_ctl_unit(&e->sd, verb); }

long ckv_warm_main_pid(const ckv_warm_env *e) { return (long)ckv_bench_sd_main_pid(&e->sd); }

void ckv_warm_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

/* More environment for the unit's daemon (ckv_warm_set_unit_env); "" for none. */
static char g_unit_env[256];

void ckv_warm_set_unit_env(const char *env) { snprintf(g_unit_env, sizeof g_unit_env, "%s", env); }

/* Writes DIR/damage.sh, the unit's ExecStartPre: it damages the journal in
 * STATE/warm when the test left a request for it in DIR/damage ("manifest",
 * "entry", "truncate", "version"; "stash" keeps a copy of the journal the
 * next daemon consumes, "unstash" puts that copy back), between the old
 * daemon's stop and the new one's start. */
static void write_damage_script(const ckv_warm_env *e, const char *state) {
  char path[400];
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
           e->dir, state);
  ckv_warm_write_file(path, script);
  chmod(path, 0755);
}

bool ckv_warm_start(ckv_warm_env *e, const char *config, char *why, size_t whylen) {
  memset(e, 0, sizeof *e);
  e->dir = ckv_test_tmpdir("ckv-warm");
  snprintf(e->sd.dir, sizeof e->sd.dir, "%s", e->dir);
  snprintf(e->sd.daemon, sizeof e->sd.daemon, "%s/commitkvd", ckv_test_bin_dir());
  char p[400], state[400];
  snprintf(state, sizeof state, "%s/state", e->dir); /* where ckv_bench_sd_start puts it */
  if (config) {
    snprintf(p, sizeof p, "%s/commitkvd.conf", e->dir);
    ckv_warm_write_file(p, config);
    snprintf(e->sd.extra, sizeof e->sd.extra, "--config %.400s", p);
    cr_assert_eq(chmod(e->dir, 0755), 0); /* other uids reach the sockets */
  }
  write_damage_script(e, state);
  snprintf(e->damage_script, sizeof e->damage_script, "%s/damage.sh", e->dir);
  e->sd.exec_start_pre = e->damage_script;
  e->sd.environment = g_unit_env[0] ? g_unit_env : NULL;
  g_env = e;
  /* The unit's name carries this process's pid (ckvwarm-<pid>.service):
   * private managers of the same uid started from one cgroup put their units'
   * cgroups side by side, so two test runs at once (another worktree's, say)
   * that both named it ckvwarm.service stopped and killed each other's
   * daemons. */
  int st = ckv_bench_sd_start(&e->sd, "ckvwarm", why, whylen);
  if (st == 1) { /* no private systemd can run here: the test skips */
    ckv_warm_stop(e);
    return false;
  }
  cr_assert_eq(st, 0, "%s (daemon log %s)", why, e->sd.log);
  snprintf(e->d.socket, sizeof e->d.socket, "%s", e->sd.socket);
  snprintf(e->d.attach, sizeof e->d.attach, "%s", e->sd.attach);
  snprintf(e->d.log, sizeof e->d.log, "%s", e->sd.log);
  e->d.dir = e->sd.state;
  e->d.pid = (pid_t)ckv_warm_main_pid(e);
  cr_assert_gt(e->d.pid, 0, "the unit has no main pid");
  return true;
}

void ckv_warm_stop(ckv_warm_env *e) {
  if (g_env == e) g_env = NULL;
  if (ckv_bench_sd_stop(&e->sd) == -2) cr_expect_fail("a commitkvd outlived its unit and manager (killed)");
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
