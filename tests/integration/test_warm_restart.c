/* test_warm_restart.c - commitkvd restarts under a real systemd fd store and
 * its workers' memory stays (issue 15, warm restart; docs/warm-restart.md):
 * clean restarts (`systemctl --user restart`), the fd store, the journal
 * written at a clean stop.  Kill -9 and the continuous journal are
 * test_warm_kill9.c's.
 *
 * Each systemd test starts commitkvd as a unit of a private `systemd --user`
 * (tests/support/warmcheck.h: the manager in a mount namespace of its own,
 * Type=notify, FileDescriptorStoreMax=, Restart=on-failure, driven with
 * `systemctl --user`).  The worker is libcommitkv in this process.
 *
 * - restart_keeps_mapping_and_kv: sessions with draft, staged and committed
 *   blocks; `systemctl --user restart`; before the worker reconnects, its old
 *   mapping still shows every block's bytes; it reconnects onto the same
 *   mapping (ckv_client_arena_kept), resumes its sessions, and the view reads
 *   identical K/V (every block's payload, every token in the same format) on
 *   the very same blocks, state counts equal, and the next round runs.
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
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
#include "warmcheck.h"

/* One per test worker, in static storage: a failed assertion leaves the
 * test function, and the suite's fini must still find what to stop. */
static ckv_warm_env g_sd;

TestSuite(warm, .fini = ckv_warm_suite_fini);

Test(warm, restart_keeps_mapping_and_kv, .timeout = 180) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_session *a = ckv_warm_session_with_rounds(c, "a", 12), *b = ckv_warm_session_with_rounds(c, "b", 5);
  /* Moves run off the critical path: the stop settles them before it writes
   * the journal, so settle them here too (a save does) before capturing. */
  cr_assert_eq(ckv_session_save(a, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  cr_assert_eq(ckv_session_save(b, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_a = ckv_test_capture_view(c, "a", &ckv_warm_geom),
              before_b = ckv_test_capture_view(c, "b", &ckv_warm_geom);
  cr_assert_gt(before_a.per_format[CKV_FORMAT_DRAFT], 0, "no draft block");
  cr_assert_gt(before_a.per_format[CKV_FORMAT_STAGED], 0, "no staged block");
  cr_assert_gt(before_a.per_format[CKV_FORMAT_COMMIT4] + before_a.per_format[CKV_FORMAT_ROT4], 0, "no committed block");
  unsigned long long tok[4];
  ckv_warm_tokens_by_state(&e->d, tok);
  cr_assert_gt(tok[3], 0, "nothing recycled: the workload did not exercise the lifecycle");
  ckv_warm_mapped ma, mb;
  ckv_warm_map_blocks(c, a, &ma);
  ckv_warm_map_blocks(c, b, &mb);
  ckv_arena *mapping = c->arena;
  long old_pid = e->d.pid;

  cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  ckv_warm_wait_restarted(e, old_pid);
  /* before the worker reconnects: its mapping is whole and live */
  ckv_warm_expect_mapping_intact(&ma, "a, after the restart");
  ckv_warm_expect_mapping_intact(&mb, "b, after the restart");
  cr_assert(ckv_arena_is_live(mapping), "the old daemon retired the arena it handed on");

  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c), "the worker had to map the arena anew (daemon log %s)", e->d.log);
  cr_assert_eq(c->arena, mapping, "the client swapped its mapping");
  ckv_session_close(a);
  ckv_session_close(b);
  char msg[512];
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
  b = ckv_warm_resume(c, "b", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume b: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after_a = ckv_test_capture_view(c, "a", &ckv_warm_geom),
              after_b = ckv_test_capture_view(c, "b", &ckv_warm_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "a after a warm restart");
  ckv_test_expect_same_view(&before_b, &after_b, "b after a warm restart");
  cr_assert_gt(after_a.epoch, before_a.epoch, "epochs go on from the kept one");
  /* on the very same blocks: zero copy */
  ckv_warm_mapped na;
  ckv_warm_map_blocks(c, a, &na);
  cr_assert_eq(na.n, ma.n);
  for (size_t i = 0; i < na.n; i++)
    cr_assert(ckv_warm_mapped_at(&ma, na.at[i]), "block %zu of a moved in the arena", i);
  ckv_warm_mapped_free(&na);
  unsigned long long tok2[4];
  ckv_warm_tokens_by_state(&e->d, tok2);
  for (int i = 0; i < 4; i++) cr_assert_eq(tok2[i], tok[i], "state %d: %llu tokens, had %llu", i, tok2[i], tok[i]);
  /* the next round: round 12 again is refused, 13 runs */
  float *attn = calloc(after_a.n_tokens, sizeof(float));
  ckv_round_result rr;
  cr_assert_eq(ckv_session_report(a, 12, 0, attn, after_a.n_tokens, &rr), CKV_ERR_INVALID);
  cr_assert_eq(ckv_session_report(a, 13, 0, attn, after_a.n_tokens, &rr), CKV_OK, "%s", ckv_client_last_error(c));
  free(attn);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-journal"), "the old daemon wrote no journal (log %s)", e->d.log);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-session-kept"), "the new daemon kept no session (log %s)", e->d.log);
  ckv_test_capture_free(&before_a);
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_a);
  ckv_test_capture_free(&after_b);
  ckv_warm_mapped_free(&ma);
  ckv_warm_mapped_free(&mb);
  ckv_session_close(a);
  ckv_session_close(b);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

Test(warm, corrupt_journal_refused, .timeout = 240) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_session *a = ckv_warm_session_with_rounds(c, "a", 6), *b = ckv_warm_session_with_rounds(c, "b", 6);
  cr_assert_eq(ckv_session_save(a, "a-settled", false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_a = ckv_test_capture_view(c, "a", &ckv_warm_geom);

  /* 1: b's journal entry damaged: b is dropped and says so, a is kept */
  ckv_warm_request_damage(e, "entry");
  long old_pid = e->d.pid;
  cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  ckv_warm_wait_restarted(e, old_pid);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-session-dropped"), "the damaged entry was not refused (log %s)", e->d.log);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c));
  ckv_session_close(a);
  ckv_session_close(b);
  char msg[512];
  b = ckv_warm_resume(c, "b", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume of the damaged one: %s (%s)", ckv_strerror(r), msg);
  cr_assert(strstr(msg, "warm restart dropped it"), "NOT_FOUND does not say why: %s", msg);
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after_a = ckv_test_capture_view(c, "a", &ckv_warm_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "a beside a damaged entry");
  ckv_test_capture_free(&after_a);
  /* b's blocks were scrubbed: a new session there reads only what it writes (viewcapture checks headers) */
  b = ckv_warm_session_with_rounds(c, "b", 2);

  /* 2: the manifest damaged: refused with a log line, nothing kept, serving */
  ckv_warm_request_damage(e, "manifest");
  old_pid = e->d.pid;
  cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  ckv_warm_wait_restarted(e, old_pid);
  cr_assert(ckv_warm_log_has(e->d.log, "warm-journal-refused"), "the damaged manifest was not refused (log %s)",
            e->d.log);
  r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_not(ckv_client_arena_kept(c), "an arena of a refused journal was handed out");
  ckv_test_expect_serving(c);
  ckv_session_close(a);
  ckv_session_close(b);
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume after a refused journal: %s (%s)", ckv_strerror(r), msg);
  a = ckv_warm_session_with_rounds(c, "a", 2); /* and it serves new sessions */
  ckv_session_close(a);

  /* 3, 4: a manifest cut short, one of another version: refused, serving */
  const char *kinds[] = {"truncate", "version"};
  const char *says[] = {"no journal magic (10 bytes)", "journal version 2, this build reads 1"};
  for (int k = 0; k < 2; k++) {
    ckv_warm_request_damage(e, kinds[k]);
    old_pid = e->d.pid;
    cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
    ckv_warm_wait_restarted(e, old_pid);
    cr_assert(ckv_warm_log_has(e->d.log, says[k]), "a %s journal was not refused with '%s' (log %s)", kinds[k], says[k],
              e->d.log);
    r = ckv_client_reconnect(c);
    cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_not(ckv_client_arena_kept(c));
    ckv_test_expect_serving(c);
  }
  ckv_test_capture_free(&before_a);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

Test(warm, snapshot_path_without_systemd, .timeout = 120) {
  unsetenv("NOTIFY_SOCKET");
  ckv_test_daemon d;
  const char *args[] = {"--set", "daemon.detach_keep=60s", NULL};
  cr_assert_eq(ckv_test_daemon_start(&d, args), 0, "commitkvd did not start");
  ckv_client *c = ckv_warm_connect(&d);
  ckv_session *a = ckv_warm_session_with_rounds(c, "a", 8);
  cr_assert_eq(ckv_session_save(a, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before = ckv_test_capture_view(c, "a", &ckv_warm_geom);
  cr_assert_eq(kill(d.pid, SIGTERM), 0);
  cr_assert_eq(ckv_test_wait(d.pid, CKV_WARM_DEADLINE_MS), 0, "commitkvd did not stop cleanly");
  char warm[400];
  snprintf(warm, sizeof warm, "%s/warm", d.dir);
  cr_assert_neq(access(warm, F_OK), 0, "a journal without a service manager: %s", warm);
  const char *argv[] = {"commitkvd", "--socket", d.socket, "--attach-socket", d.attach, "--state-dir", d.dir,
                        "--set", "daemon.metrics=", "--backend", "host", "--set", "daemon.detach_keep=60s", NULL};
  d.pid = ckv_test_spawn(argv, d.log);
  long long end = ckv_test_now_ms() + CKV_WARM_DEADLINE_MS;
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
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume from the snapshot: %s (%s)", ckv_strerror(r), msg);
  ckv_capture after = ckv_test_capture_view(c, "a", &ckv_warm_geom);
  ckv_test_expect_same_view(&before, &after, "a from its snapshot");
  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(a);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}

Test(warm, stale_journal_never_applied, .timeout = 180) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD(e);
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_session *a = ckv_warm_session_with_rounds(c, "a", 3);
  /* a clean restart whose journal is copied aside before the new daemon consumes it */
  ckv_warm_request_damage(e, "stash");
  long old_pid = e->d.pid;
  cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  ckv_warm_wait_restarted(e, old_pid);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c));
  ckv_session_close(a);
  char msg[512];
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s)", ckv_strerror(r), msg);
  /* the session moves on in the kept arena: more tokens than the stale journal knows */
  uint64_t first = 0;
  cr_assert_eq(ckv_session_append(a, 8, NULL, NULL, NULL, NULL, &first), CKV_OK, "%s", ckv_client_last_error(c));
  uint64_t now = ckv_session_tokens(a);
  /* killed, and the stale copy put back before the next start */
  ckv_warm_request_damage(e, "unstash");
  old_pid = e->d.pid;
  cr_assert_eq(kill((pid_t)old_pid, SIGKILL), 0);
  ckv_warm_wait_restarted(e, old_pid);
  r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  ckv_session_close(a);
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "resume after a stale journal: %s (%s; %llu tokens, the session had %llu)",
               ckv_strerror(r), msg, a ? (unsigned long long)ckv_session_tokens(a) : 0ull, (unsigned long long)now);
  cr_assert_not(ckv_client_arena_kept(c), "an arena of a stale journal was handed out");
  cr_assert(ckv_warm_log_has(e->d.log, "the journal is stale"), "the stale journal was not refused (log %s)", e->d.log);
  cr_assert(strstr(msg, "journal is stale"), "NOT_FOUND does not say why: %s", msg);
  ckv_test_expect_serving(c);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

/* ---- two tenants ---- */

#define TENANT_TOKENS 40u

typedef struct tenant_ctx {
  const ckv_warm_env *e;
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
  CHILD_STEP(rep, "open", ckv_session_open(c, "same-id", &ckv_warm_geom, NULL, &s));
  uint64_t first = 0;
  CHILD_STEP(rep, "append", ckv_session_append(s, TENANT_TOKENS, NULL, NULL, NULL, NULL, &first));
  for (uint64_t pos = first; pos < first + TENANT_TOKENS; pos++)
    for (uint32_t layer = 0; layer < CKV_WARM_LAYERS; layer++) {
      uint16_t k[CKV_WARM_HEADS * CKV_WARM_DIM], v[CKV_WARM_HEADS * CKV_WARM_DIM];
      for (uint32_t el = 0; el < CKV_WARM_HEADS * CKV_WARM_DIM; el++) {
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
  ckv_warm_env *e = &g_sd;
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
    if (!wait_file(ready, CKV_WARM_DEADLINE_MS)) break; /* the report says why */
  }
  long old_pid = e->d.pid;
  cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  ckv_warm_wait_restarted(e, old_pid);
  char restarted[460];
  snprintf(restarted, sizeof restarted, "%s/restarted", flags);
  ckv_warm_write_file(restarted, "");
  tenant_report rep[2];
  for (int i = 0; i < 2; i++) {
    ckv_test_end_as(pid[i], fd[i], &rep[i], sizeof rep[i], CKV_WARM_DEADLINE_MS * 2);
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
  ckv_warm_stop(e);
}

/* A session the warm restart kept and its worker has not resumed yet is read
 * through the mapping the worker kept: memory pressure from the tenant's
 * other sessions must not move it to disk (its blocks would be freed,
 * cleared and handed to others under the worker's pointers). */
Test(warm, pressure_spares_sessions_not_resumed, .timeout = 180) {
  ckv_warm_env *e = &g_sd;
  SKIP_WITHOUT_SYSTEMD_CONF(e, "[daemon]\ndisk_memory = 64M\ndisk_pressure = yes\n[tenant.p]\nuids = 0\n"
                               "quota = 256K\n");
  ckv_client *c = ckv_warm_connect(&e->d);
  ckv_session *a = ckv_warm_session_with_rounds(c, "a", 12);
  cr_assert_eq(ckv_session_save(a, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_capture before_a = ckv_test_capture_view(c, "a", &ckv_warm_geom);
  ckv_warm_mapped ma;
  ckv_warm_map_blocks(c, a, &ma);
  long old_pid = e->d.pid;
  cr_assert_eq(ckv_warm_ctl_unit(e, "restart"), 0, "systemctl --user restart failed; daemon log %s", e->d.log);
  ckv_warm_wait_restarted(e, old_pid);
  int r = ckv_client_reconnect(c);
  cr_assert_eq(r, CKV_OK, "reconnect: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(ckv_client_arena_kept(c), "the worker had to map the arena anew (daemon log %s)", e->d.log);
  ckv_session_close(a);
  /* a new session grows with system tokens (never recycled) until the quota refuses it */
  ckv_session_options so = {.policy = "commitkv", .model_id = "stories260K", .model_revision = "r1"};
  ckv_session *b = NULL;
  r = ckv_session_open(c, "b", &ckv_warm_geom, &so, &b);
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
  ckv_warm_expect_mapping_intact(&ma, "a, not resumed, after b filled the quota");
  char msg[512];
  a = ckv_warm_resume(c, "a", &r, msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "resume a: %s (%s); daemon log %s", ckv_strerror(r), msg, e->d.log);
  ckv_capture after_a = ckv_test_capture_view(c, "a", &ckv_warm_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "a resumed after b filled the quota");
  ckv_test_capture_free(&before_a);
  ckv_test_capture_free(&after_a);
  ckv_warm_mapped_free(&ma);
  ckv_session_close(a);
  ckv_session_close(b);
  ckv_client_free(c);
  ckv_warm_stop(e);
}

