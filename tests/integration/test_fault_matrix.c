/* test_fault_matrix.c - a worker killed with SIGKILL at every step of a round.
 *
 * The victim is a real process using libcommitkv: it opens a session, runs
 * one whole round (append, K/V, report, ack), then stops at one step of the
 * second round and tells the test, which kills it there:
 *   after_open, after_append (slots handed out, no K/V yet), mid_kv (half the
 *   layers written), stale_view (reported; holds the old view, not acked),
 *   before_ack (reported, view read, ack not sent).
 * For each step: a bystander commitkv-worker (every byte it writes it reads
 * back) runs through all the kills and finishes; the daemon stays up; the
 * victim's session is detached at once (its attach socket closed), and a new
 * process resumes it within detach_keep and reads every token of round 1
 * back byte for byte (they are draft: the recent window), and sees round 2's
 * tokens when they were appended.  One victim is left unresumed: it expires
 * after detach_keep, and at the end every byte is back in the arena. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "testcheck.h"
#include "testutil.h"

static const char *const k_args[] = {"--set", "daemon.lease=3s", "--set", "daemon.heartbeat=500ms",
                                     "--set", "daemon.detach_keep=8s", NULL};
static const ckv_geometry k_geom = {2, 2, 64, CKV_DTYPE_FP16};
enum { TOKENS = 16, STEPS = 5 };
/* A window wider than both rounds: every token stays draft, whose bytes
 * the resumer compares exactly. */
static const char *const k_window_name[] = {"recent_window"};
static const double k_window_value[] = {64};
static const ckv_session_options k_keep_draft = {.param_names = k_window_name, .param_values = k_window_value,
                                                 .n_params = 1};
static const char *const k_steps[STEPS] = {"after_open", "after_append", "mid_kv", "stale_view", "before_ack"};

static uint16_t value(size_t pos, uint32_t layer, uint32_t kv, uint32_t e) {
  return ckv_f32_to_f16(ckv_test_kv_value(pos, layer, kv, e));
}

static int write_token(ckv_session *s, uint64_t pos, uint32_t layers) {
  uint16_t k[128], v[128];
  for (uint32_t l = 0; l < layers; l++) {
    for (uint32_t e = 0; e < 128; e++) k[e] = value(pos, l, 0, e), v[e] = value(pos, l, 1, e);
    int r = ckv_session_write_kv(s, pos, l, k, v);
    if (r < 0) return r;
  }
  return 0;
}

typedef struct victim_ctx {
  const ckv_test_daemon *d;
  int step;
  int ready_fd;
} victim_ctx;

/* The victim's body (a forked child): never returns. */
static void victim(const victim_ctx *vc) {
  char sid[64];
  snprintf(sid, sizeof(sid), "fm-%s", k_steps[vc->step]);
  ckv_client_options co = {.socket = vc->d->socket, .attach_socket = vc->d->attach, .name = "victim", .heartbeat = true};
  ckv_client *c;
  ckv_session *s;
  float attn[2 * TOKENS];
  uint64_t first;
  ckv_round_result rr;
  if (ckv_client_connect(&co, &c) < 0 || ckv_session_open(c, sid, &k_geom, &k_keep_draft, &s) < 0) _exit(10);
  /* round 1, whole */
  if (ckv_session_append(s, TOKENS, NULL, NULL, NULL, NULL, &first) < 0) _exit(11);
  for (uint64_t p = 0; p < TOKENS; p++)
    if (write_token(s, p, k_geom.n_layers) < 0) _exit(12);
  for (int i = 0; i < TOKENS; i++) attn[i] = 1.0f / TOKENS;
  if (ckv_session_report(s, 1, 0, attn, TOKENS, &rr) < 0 || ckv_session_ack(s, rr.epoch, NULL) < 0) _exit(13);
  /* round 2, up to the step */
  int step = vc->step;
  if (step >= 1 && ckv_session_append(s, TOKENS, NULL, NULL, NULL, NULL, &first) < 0) _exit(14);
  if (step >= 2)
    for (uint64_t p = TOKENS; p < 2 * TOKENS; p++)
      if (write_token(s, p, step == 2 ? 1 : k_geom.n_layers) < 0) _exit(15); /* mid_kv: one layer of two */
  const ckv_view *v;
  if (step >= 3) {
    if (ckv_session_view(s, &v) < 0) _exit(16); /* the view it holds */
    for (int i = 0; i < 2 * TOKENS; i++) attn[i] = 1.0f / (2 * TOKENS);
    if (ckv_session_report(s, 2, 0, attn, 2 * TOKENS, &rr) < 0) _exit(17);
  }
  if (step >= 4 && ckv_session_view(s, &v) < 0) _exit(18);
  if (write(vc->ready_fd, "r", 1) != 1) _exit(19);
  for (;;) pause(); /* killed here */
}

/* Resumes `sid` from this process and checks round 1's tokens byte for byte
 * and the token count; drops it.  Returns the tokens it held. */
static uint64_t resume_and_check(const ckv_test_daemon *d, const char *sid) {
  ckv_client_options co = {.socket = d->socket, .attach_socket = d->attach, .name = "resumer"};
  ckv_client *c;
  ckv_session *s;
  cr_assert_eq(ckv_client_connect(&co, &c), CKV_OK);
  ckv_session_options so = {.resume = true};
  int r = ckv_session_open(c, sid, &k_geom, &so, &s);
  cr_assert_eq(r, CKV_OK, "%s: resume: %s (%s)", sid, ckv_strerror(r), ckv_client_last_error(c));
  const ckv_view *v;
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  uint64_t n = v->n_tokens, seen = 0;
  size_t te = ckv_draft_token_elems(&k_geom);
  for (size_t b = 0; b < v->n_draft; b++) {
    const uint8_t *base = v->draft[b].data;
    const ckv_block_header *h = (const ckv_block_header *)base;
    for (uint32_t sl = 0; sl < h->capacity; sl++) {
      if (!ckv_block_slot_valid(base, sl)) continue;
      uint32_t pos = ckv_block_positions_const(base)[sl];
      if (pos >= TOKENS) continue; /* round 2's K/V may be half written: not ours to check */
      for (uint32_t l = 0; l < k_geom.n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint16_t *p = (const uint16_t *)(base + ckv_draft_kv_offset(&k_geom, h->capacity, l, kv, sl));
          for (size_t e = 0; e < te; e++)
            cr_assert_eq(p[e], value(pos, l, kv, (uint32_t)e), "%s: token %u layer %u kv %u element %zu", sid, pos, l, kv,
                         e);
        }
      seen++;
    }
  }
  cr_expect_eq(seen, TOKENS, "%s: %llu of round 1's %d tokens read back", sid, (unsigned long long)seen, TOKENS);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  return n;
}

Test(fault_matrix, worker_killed_at_every_step, .timeout = 180) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_args), 0, "commitkvd did not start");
  char out[400];
  snprintf(out, sizeof(out), "%s/bystander.out", d.dir);
  const char *argv[] = {"commitkv-worker", "--socket", d.socket, "--attach-socket", d.attach, "--prefix", "bystander",
                        "--sessions", "2", "--rounds", "60", "--tokens", "24", "--pause-ms", "50", "--quiet", NULL};
  pid_t by = ckv_test_spawn(argv, out);
  for (int step = 0; step <= STEPS; step++) { /* STEPS: one more victim, never resumed */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    int st = step < STEPS ? step : 4;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      victim_ctx vc = {&d, st, fds[1]};
      victim(&vc);
    }
    close(fds[1]);
    char ch;
    cr_assert_eq(read(fds[0], &ch, 1), 1, "victim %s died before its step", k_steps[st]);
    close(fds[0]);
    unsigned long long detached = ckv_test_stat(&d, "sessions_detached");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_expect_eq(ckv_test_wait(pid, 5000), 128 + SIGKILL);
    cr_expect_eq(ckv_test_wait_stat(&d, "sessions_detached", detached + 1, 10000), 0,
                 "step %s: the dead victim's session was never detached", k_steps[st]);
    cr_assert(ckv_test_daemon_alive(&d), "commitkvd died after a victim was killed at %s", k_steps[st]);
    if (step == STEPS) break; /* left to expire */
    char sid[64];
    snprintf(sid, sizeof(sid), "fm-%s", k_steps[st]);
    uint64_t n = resume_and_check(&d, sid);
    cr_expect_eq(n, st >= 1 ? 2 * TOKENS : TOKENS, "%s: the resumed session holds %llu tokens", sid,
                 (unsigned long long)n);
  }
  /* the unresumed victim's session expires after detach_keep; the bystander finished unharmed */
  cr_expect_eq(ckv_test_wait_stat(&d, "sessions_expired", 1, 20000), 0, "the unresumed session never expired");
  cr_expect_eq(ckv_test_wait(by, 120000), 0, "the bystander failed: %s", ckv_test_read_file(out));
  cr_expect_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 20000), 0, "bytes never returned to the arena");
  cr_expect_eq(ckv_test_stat(&d, "sessions"), 0);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
}
