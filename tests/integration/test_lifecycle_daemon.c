/* tests/integration/test_lifecycle_daemon.c - the lifecycle through a real
 * commitkvd and a real client (libcommitkv in process): a 20-round session
 * with a chosen attention pattern gets transitions in its ReportRound
 * replies, its view comes to hold staged and committed blocks, every token
 * still cached reads back (decoded with kernels/format.h through the mapped
 * arena) within its format's quantization step, the stats add up and cost
 * less than FP16; and a tenant quota configured in a file: appends past it
 * succeed while recycling makes room (the replies list every recycle), then
 * fail with QUOTA, and the arena's usage never exceeds the quota. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "testcheck.h"
#include "testutil.h"

enum { D = CKV_TOKEN_DRAFT, S = CKV_TOKEN_STAGED, C = CKV_TOKEN_COMMITTED, X = CKV_TOKEN_RECYCLED };

/* ---- helpers ---- */

/* Host memory (the test reads blocks through the mapped arena) and no
 * metrics listener (its fixed port may be taken by another daemon). */
static const char *const k_daemon_args[] = {"--set", "daemon.backend=host", "--set", "daemon.metrics=", NULL};

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_lifecycle_daemon"};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s", ckv_strerror(r));
  return c;
}

static int legal(uint8_t from, uint8_t to) {
  return (from == D && to == S) || (from == S && to == C) || (from != X && to == X);
}

/* Applies a reply's transitions to the states the client knows. */
static void apply(uint8_t *state, size_t n, uint64_t first, uint32_t count, uint8_t from, uint8_t to,
                  uint64_t moves[4][4]) {
  cr_assert(legal(from, to), "illegal transition %u -> %u reported", from, to);
  cr_assert_leq(first + count, n, "transition beyond the tokens");
  for (uint64_t p = first; p < first + count; p++) {
    cr_assert_eq(state[p], from, "position %llu reported from %u but is %u", (unsigned long long)p, from, state[p]);
    state[p] = to;
  }
  moves[from][to] += count;
}

/* Largest error a format adds to values in [-1, 1] (kernels/quant.h): half a
 * step of INT8 (absmax/127), of INT4 ((max-min)/15) or INT2 ((max-min)/3),
 * committed values being quantized from the INT8 ones. */
static float tolerance(uint32_t format) {
  /* rotated formats: an error per vector, checked by rot_tolerance() instead */
  const float int8 = 0.5f * (1.f / 127.f) * 1.002f + 1e-6f;
  switch (format) {
    case CKV_FORMAT_DRAFT: return 0.f;
    case CKV_FORMAT_STAGED: return int8;
    case CKV_FORMAT_COMMIT4: return 0.5f * (2.f + 2 * int8) / 15.f * 1.002f + int8 + 1e-5f;
    default: return 0.5f * (2.f + 2 * int8) / 3.f * 1.002f + int8 + 1e-5f;
  }
}

/* Rotated formats (v2) spread a head's error over its elements: the bounds
 * are on the relative L2 error of each head vector (a gross error: a wrong
 * scale, mean or rotation reads >= 1) and on the RMS of those errors over
 * every head checked (g_rot_e2 / g_rot_n).  Measured on this workload
 * (32-element heads, INT8 first): worst ROT4 head 0.161, worst ROT2 0.659
 * (2 bits on 32 elements: one vector's error varies a lot); RMS 0.11 / 0.36.
 * ROT1 (the cold tokens' default): RMS 0.62 (sign codes: sqrt(1 - 2/pi) = 0.60),
 * worst 1.146 over ~24K heads alone, but 1.556 under ctest -j2 (the tokens a
 * block commits together follow the compressor's timing, and with them the
 * block's key mean and scale): a single ROT1 vector says little, so its bound
 * is 2.0 and the RMS bound (0.66) is the one that catches a gross error. */
static double rot_tolerance(uint32_t format) {
  return format == CKV_FORMAT_ROT4 ? 0.25 : format == CKV_FORMAT_ROT1 ? 2.0 : 0.80;
}
static double rot_rms_bound(uint32_t format) {
  return format == CKV_FORMAT_ROT4 ? 0.13 : format == CKV_FORMAT_ROT1 ? 0.66 : 0.40;
}
static double g_rot_e2[CKV_FORMAT_COUNT_];
static size_t g_rot_n[CKV_FORMAT_COUNT_];
static double g_rot_max[CKV_FORMAT_COUNT_]; /* worst head, printed */

/* Raw GetView: the libcommitkv view is refreshed only when a reply says the
 * epoch moved, and publishing is asynchronous; the test wants the newest. */
static Commitkv__V1__Response *get_view(ckv_client *c, const char *sid) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__GetView g = COMMITKV__V1__GET_VIEW__INIT;
  g.session_id = (char *)sid;
  req.body_case = COMMITKV__V1__REQUEST__BODY_GET_VIEW;
  req.get_view = &g;
  Commitkv__V1__Response *rep = NULL;
  int r = ckv_rpc(c, &req, &rep);
  cr_assert_eq(r, CKV_OK, "GetView: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_VIEW);
  return rep;
}

/* Reads every valid slot of the view: its data must match what was written
 * (always: a fault here is never a race), and each live token must appear
 * exactly once, no recycled one at all (returns false when not yet: a move
 * may be being published).  *ret_epoch: the view's epoch. */
static bool check_view(ckv_client *c, const char *sid, const ckv_geometry *g, const float *expect,
                       const uint8_t *state, size_t n, uint64_t *ret_epoch, size_t per_format[CKV_FORMAT_COUNT_],
                       uint8_t *format_of) {
  Commitkv__V1__Response *rep = get_view(c, sid);
  const Commitkv__V1__View *v = rep->view;
  size_t elems = (size_t)g->n_kv_heads * g->head_dim, tok = g->n_layers * 2u * elems;
  uint16_t *seen = calloc(n + 1, sizeof(uint16_t));
  float *out = malloc(elems * sizeof(float));
  cr_assert(seen && out);
  Commitkv__V1__BlockRef **lists[3] = {v->draft, v->staged, v->committed};
  size_t counts[3] = {v->n_draft, v->n_staged, v->n_committed};
  for (int k = 0; k < CKV_FORMAT_COUNT_; k++) per_format[k] = 0;
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; i < counts[k]; i++) {
      const Commitkv__V1__BlockRef *b = lists[k][i];
      const uint8_t *base = ckv_rpc_arena_ptr(c, b->arena_id, b->offset, b->bytes);
      cr_assert_not_null(base, "view block outside the mapped arena");
      cr_assert_eq(ckv_block_check(base, g), CKV_OK, "view block %llu fails its header check",
                   (unsigned long long)b->block_id);
      cr_assert_eq(base[4], (uint8_t)b->format, "block header format differs from the view");
      cr_assert_lt(b->format, CKV_FORMAT_COUNT_);
      per_format[b->format]++;
      const uint32_t *positions = ckv_block_positions_const(base);
      for (uint32_t slot = 0; slot < b->capacity; slot++) {
        if (!ckv_block_slot_valid(base, slot)) continue;
        uint32_t pos = positions[slot];
        cr_assert_lt(pos, n, "a valid slot names position %u of %zu", pos, n);
        seen[pos]++;
        format_of[pos] = (uint8_t)b->format;
        for (uint32_t layer = 0; layer < g->n_layers; layer++)
          for (uint32_t kv = 0; kv < 2; kv++) {
            cr_assert_eq(ckv_kernels_dequantize(g, base, layer, kv, slot, out), CKV_OK);
            const float *ex = &expect[pos * tok + (layer * 2 + kv) * elems];
            if (ckv_format_is_rot(b->format)) {
              for (uint32_t h = 0; h < g->n_kv_heads; h++) {
                double e2 = 0, x2 = 0;
                for (uint32_t di = 0; di < g->head_dim; di++) {
                  size_t e = (size_t)h * g->head_dim + di;
                  e2 += ((double)out[e] - ex[e]) * ((double)out[e] - ex[e]);
                  x2 += (double)ex[e] * ex[e];
                }
                g_rot_e2[b->format] += x2 > 0 ? e2 / x2 : 0;
                g_rot_n[b->format]++;
                if (x2 > 0 && sqrt(e2 / x2) > g_rot_max[b->format]) g_rot_max[b->format] = sqrt(e2 / x2);
                cr_assert(sqrt(e2) <= rot_tolerance(b->format) * sqrt(x2) + 1e-4,
                          "token %u (format %u) layer %u %s head %u: relative error %.4f (bound %.2f)", pos, b->format,
                          layer, kv ? "V" : "K", h, sqrt(e2 / (x2 > 0 ? x2 : 1)), rot_tolerance(b->format));
              }
              continue;
            }
            float tol = tolerance(b->format);
            for (size_t e = 0; e < elems; e++)
              cr_assert(fabsf(out[e] - ex[e]) <= tol,
                        "token %u (format %u) layer %u %s[%zu] reads %f, was written %f (tolerance %f)", pos,
                        b->format, layer, kv ? "V" : "K", e, out[e], ex[e], tol);
          }
      }
    }
  bool ok = true;
  for (size_t p = 0; p < n; p++) ok &= seen[p] == (state[p] == X ? 0 : 1);
  *ret_epoch = v->epoch;
  free(seen);
  free(out);
  ckv_rpc_free(rep);
  return ok;
}

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u
#define PER_ROUND 24u
#define ROUNDS 20u

/* Twenty rounds of a planted workload through a real commitkvd; committed
 * tokens land in `committed_format` (ROT4 with the default rotate = yes at
 * head_dim 32, COMMIT4 with rotate = 0). */
static void twenty_rounds(int rotate, uint32_t committed_format, uint32_t cold_format) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_daemon_args), 0, "commitkvd did not start");
  ckv_client *c = connect_to(&d);
  ckv_geometry g = {LAYERS, HEADS, DIM, 0};
  /* demote = no: recycled tokens leave the view (demotion keeps them, in View.cold: tested below) */
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds",
                         "prune_keep",  "rotate",        "demote"};
  const double values[] = {4, 16, 2, 6, 1, rotate, 0};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 7};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, "life", &g, &so, &s);
  cr_assert_eq(r, CKV_OK, "open: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));

  const size_t elems = HEADS * DIM, tok = LAYERS * 2 * elems, total = PER_ROUND * ROUNDS;
  float *expect = malloc(total * tok * sizeof(float));
  uint8_t *state = calloc(total, 1), *format_of = calloc(total, 1);
  float *attn = malloc(total * sizeof(float));
  cr_assert(expect && state && attn);
  uint64_t moves[4][4] = {{0}};
  size_t max_staged = 0, max_committed = 0, max_cold = 0, n = 0, per_format[CKV_FORMAT_COUNT_];
  uint64_t last_epoch = 0;
  for (uint32_t round = 1; round <= ROUNDS; round++) {
    float sem[PER_ROUND];
    uint8_t roles[PER_ROUND];
    for (uint32_t i = 0; i < PER_ROUND; i++) {
      /* planted facts; text forgotten later (pos % 3 == 0) has little meaning */
      sem[i] = (n + i) % 8 == 1 ? 0.9f : (n + i) % 3 == 0 ? 0.2f : 0.5f;
      roles[i] = round == 1 && i < 6 ? CKV_ROLE_SYSTEM : CKV_ROLE_USER;
    }
    uint64_t first = 0;
    r = ckv_session_append(s, PER_ROUND, roles, NULL, sem, NULL, &first);
    cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_eq(first, n);
    for (size_t pos = n; pos < n + PER_ROUND; pos++)
      for (uint32_t layer = 0; layer < LAYERS; layer++) {
        uint16_t k[HEADS * DIM], v[HEADS * DIM];
        for (uint32_t e = 0; e < elems; e++) {
          k[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 0, e));
          v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 1, e));
          expect[pos * tok + (layer * 2 + 0) * elems + e] = ckv_f16_to_f32(k[e]);
          expect[pos * tok + (layer * 2 + 1) * elems + e] = ckv_f16_to_f32(v[e]);
        }
        cr_assert_eq(ckv_session_write_kv(s, pos, layer, k, v), CKV_OK);
      }
    n += PER_ROUND;
    /* facts hot, the new turn warm, older text cold, a third of it forgotten */
    for (size_t pos = 0; pos < n; pos++) {
      if (pos % 8 == 1) attn[pos] = 4.f;
      else if (pos + PER_ROUND >= n) attn[pos] = 1.f;
      else if (pos % 3 == 0 && round > 6) attn[pos] = 0.f;
      else attn[pos] = 0.3f;
    }
    ckv_round_result rr;
    r = ckv_session_report(s, round, 0, attn, n, &rr);
    cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_geq(rr.epoch, last_epoch, "the epoch went back");
    last_epoch = rr.epoch;
    for (size_t i = 0; i < rr.n_transitions; i++)
      apply(state, n, rr.transitions[i].first_position, rr.transitions[i].count, rr.transitions[i].from,
            rr.transitions[i].to, moves);
    /* the reader's view: every token still cached reads back */
    uint64_t epoch = 0;
    bool ok = false;
    for (int tries = 0; tries < 100 && !ok; tries++) {
      ok = check_view(c, "life", &g, expect, state, n, &epoch, per_format, format_of);
      if (!ok) usleep(20000);
    }
    cr_assert(ok, "round %u: the view does not hold each cached token exactly once", round);
    if (per_format[CKV_FORMAT_STAGED] > max_staged) max_staged = per_format[CKV_FORMAT_STAGED];
    if (per_format[committed_format] > max_committed) max_committed = per_format[committed_format];
    if (per_format[cold_format] > max_cold) max_cold = per_format[cold_format];
    for (uint32_t f = CKV_FORMAT_COMMIT4; f < CKV_FORMAT_COUNT_; f++)
      if (f != committed_format && f != cold_format)
        cr_assert_eq(per_format[f], 0, "a committed block of format %u, expected %u or %u", f, committed_format, cold_format);
    /* bits by value: the planted facts (attention 4, semantic 0.9) in the best format, the rest cold */
    for (size_t pos = 0; pos < n; pos++)
      if (state[pos] != C || format_of[pos] <= CKV_FORMAT_STAGED) /* not moved yet */
        continue;
      else if (format_of[pos] != committed_format && format_of[pos] != cold_format)
        cr_assert_fail("committed token %zu in format %u", pos, format_of[pos]);
      else if (pos % 8 == 1 && pos >= 6)
        cr_assert_eq(format_of[pos], committed_format, "fact %zu committed in format %u, not %u", pos, format_of[pos],
                     committed_format);
    const ckv_view *pv = NULL;
    cr_assert_eq(ckv_session_view(s, &pv), CKV_OK);
    cr_assert_eq(pv->n_tokens, n);
    uint64_t reclaimed = 0;
    cr_assert_eq(ckv_session_ack(s, epoch, &reclaimed), CKV_OK);
  }
  cr_expect_gt(moves[D][S], 0, "no draft->staged in 20 rounds");
  cr_expect_gt(moves[S][C], 0, "no staged->committed in 20 rounds");
  cr_expect_gt(moves[D][X] + moves[S][X] + moves[C][X], 0, "forgotten tokens were never recycled");
  cr_expect_gt(max_staged, 0, "the view never held a staged block");
  cr_expect_gt(max_committed, 0, "the view never held a committed block of format %u", committed_format);
  cr_expect_gt(max_cold, 0, "the view never held a committed block of format %u (tokens gone cold)", cold_format);
  for (uint32_t f = CKV_FORMAT_ROT4; f < CKV_FORMAT_COUNT_; f++)
    if (g_rot_n[f]) {
      double rms = sqrt(g_rot_e2[f] / (double)g_rot_n[f]);
      fprintf(stderr, "format %u: RMS relative head error %.4f over %zu heads, worst %.4f\n", f, rms, g_rot_n[f],
              g_rot_max[f]);
      cr_expect_leq(rms, rot_rms_bound(f), "format %u: RMS relative head error %.4f", f, rms);
    }
  /* facts are never recycled; system-role tokens and sinks neither */
  for (size_t pos = 0; pos < n; pos++)
    if (pos % 8 == 1 || pos < 6) cr_expect_neq(state[pos], X, "token %zu (fact, sink or system) recycled", pos);

  /* stats: counts add up, the reported transitions are the counted ones, and
   * the cache costs less than FP16 */
  unsigned long long dr = ckv_test_stat(&d, "tokens.draft"), st = ckv_test_stat(&d, "tokens.staged"),
                     co = ckv_test_stat(&d, "tokens.committed"), re = ckv_test_stat(&d, "tokens.recycled");
  cr_expect_eq(dr + st + co + re, total, "state counts %llu+%llu+%llu+%llu must add up to %zu appended", dr, st, co,
               re, total);
  uint64_t mine[4] = {0};
  for (size_t pos = 0; pos < n; pos++) mine[state[pos]]++;
  cr_expect_eq(dr, mine[D]);
  cr_expect_eq(st, mine[S]);
  cr_expect_eq(co, mine[C]);
  cr_expect_eq(re, mine[X], "the daemon counts %llu recycled, the replies reported %llu", re,
               (unsigned long long)mine[X]);
  unsigned long long bt = ckv_test_stat(&d, "bytes.total"), fp = ckv_test_stat(&d, "bytes.fp16_equivalent");
  cr_expect_lt(bt, fp, "the cache takes %llu bytes, FP16 would take %llu", bt, fp);
  cr_expect_eq(bt, ckv_test_stat(&d, "arenas.0.bytes_used"));

  cr_expect_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  free(expect);
  free(state);
  free(format_of);
  free(attn);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly");
}

/* Default rotate = yes, cold_bits = 2: facts in ROT4, tokens gone cold in ROT2. */
Test(lifecycle_daemon, twenty_rounds_transitions_views_and_stats, .timeout = 60) {
  twenty_rounds(1, CKV_FORMAT_ROT4, CKV_FORMAT_ROT1);
}
/* rotate = 0: KIVI's INT4 for every committed token (cold_bits needs rotation). */
Test(lifecycle_daemon, twenty_rounds_kivi_committed_blocks, .timeout = 60) {
  twenty_rounds(0, CKV_FORMAT_COMMIT4, CKV_FORMAT_COMMIT4);
}

/* ---- quota through the daemon ---- */

static int raw_append(ckv_client *c, const char *sid, uint32_t count, uint8_t role, Commitkv__V1__Response **ret) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
  uint8_t roles[256];
  float sem[256];
  cr_assert_leq(count, 256);
  for (uint32_t i = 0; i < count; i++) {
    roles[i] = role;
    sem[i] = (float)((i * 7) % 16) / 16.f;
  }
  a.session_id = (char *)sid;
  a.count = count;
  a.roles = (ProtobufCBinaryData){count, roles};
  a.semantic = (ProtobufCBinaryData){count * 4u, (uint8_t *)sem};
  req.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  req.append_tokens = &a;
  *ret = NULL;
  return ckv_rpc(c, &req, ret);
}

static int raw_report(ckv_client *c, const char *sid, uint64_t round, const float *attn, size_t n,
                      Commitkv__V1__Response **ret) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
  rr.session_id = (char *)sid;
  rr.round = round;
  rr.attention = (ProtobufCBinaryData){n * 4u, (uint8_t *)attn};
  req.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND;
  req.report_round = &rr;
  *ret = NULL;
  return ckv_rpc(c, &req, ret);
}

/* A daemon on host memory whose one tenant, t (this uid), has `quota`.
 * Returns the configuration's directory, to remove after the daemon stops. */
static char *start_with_quota(ckv_test_daemon *d, const char *quota) {
  char conf[512], text[200];
  snprintf(text, sizeof(text), "[daemon]\nbackend = host\nmetrics = \"\"\n\n[tenant.t]\nuids = %u\nquota = %s\n",
           (unsigned)getuid(), quota);
  char *dir = ckv_test_write_config(text, conf, sizeof(conf));
  const char *extra[] = {"--config", conf, NULL};
  cr_assert_eq(ckv_test_daemon_start(d, extra), 0, "commitkvd did not start with %s", conf);
  return dir;
}

#define QUOTA (2ull << 20)
#define QLAYERS 4u
#define QHEADS 4u
#define QDIM 64u

Test(lifecycle_daemon, quota_recycles_then_refuses_and_usage_stays_within, .timeout = 60) {
  ckv_test_daemon d;
  char *dir = start_with_quota(&d, "2M");
  ckv_client *c = connect_to(&d);
  cr_assert_str_eq(ckv_client_tenant(c), "t");
  ckv_geometry g = {QLAYERS, QHEADS, QDIM, 0};
  const char *names[] = {"sink_tokens", "recent_window"};
  const double values[] = {4, 16};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 2};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, "q", &g, &so, &s);
  cr_assert_eq(r, CKV_OK, "open: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));

  const uint64_t fp16_per_token = 2ull * QLAYERS * QHEADS * QDIM * 2;
  size_t cap = 8192, n = 0;
  uint8_t *state = calloc(cap, 1);
  float *attn = calloc(cap, sizeof(float));
  cr_assert(state && attn);
  uint64_t moves[4][4] = {{0}}, recycled_by_appends = 0, escalated_by_appends = 0;
  uint32_t round = 0;
  unsigned long long used_max = 0;
  /* 24 appends of 64 ordinary tokens: 3x what the quota holds in FP16 */
  int refused_at = -1;
  for (int i = 0; i < 100 && refused_at < 0; i++) {
    bool system = i >= 24; /* then protected tokens only: reclaim runs dry */
    Commitkv__V1__Response *rep = NULL;
    r = raw_append(c, "q", 64, system ? CKV_ROLE_SYSTEM : CKV_ROLE_USER, &rep);
    unsigned long long used = ckv_test_stat(&d, "arenas.0.bytes_used");
    if (used > used_max) used_max = used;
    cr_assert_leq(used, QUOTA, "append %d: arena usage %llu above the quota", i, used);
    if (r != CKV_OK) {
      cr_assert_eq(r, CKV_ERR_QUOTA, "append %d failed with %s (%s)", i, ckv_strerror(r), ckv_client_last_error(c));
      cr_assert(system, "append %d refused although older ordinary tokens could be recycled", i);
      refused_at = i;
      break;
    }
    const Commitkv__V1__TokensAppended *t = rep->tokens_appended;
    cr_assert_eq(t->first_position, n);
    n += 64;
    cr_assert_lt(n, cap);
    for (size_t k = 0; k < t->n_transitions; k++) {
      const Commitkv__V1__TransitionRange *tr = t->transitions[k];
      /* pressure escalates first (draft -> staged -> committed), then recycles */
      cr_assert((int)tr->to == X || (int)tr->to == (int)tr->from + 1, "an append reply reports %u -> %u", tr->from, tr->to);
      apply(state, n, tr->first_position, tr->count, (uint8_t)tr->from, (uint8_t)tr->to, moves);
      if ((int)tr->to == X)
        recycled_by_appends += tr->count;
      else
        escalated_by_appends += tr->count;
      for (uint64_t p = tr->first_position; p < tr->first_position + tr->count; p++)
        cr_assert(p >= 4 && p + 16 + 64 < n, "quota pressure touched protected position %llu", (unsigned long long)p);
    }
    ckv_rpc_free(rep);
    /* a round: the newest turn attended, the rest a little */
    for (size_t p = 0; p < n; p++) attn[p] = p + 64 >= n ? 1.f : 0.05f;
    r = raw_report(c, "q", ++round, attn, n, &rep);
    cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    for (size_t k = 0; k < rep->round_report->n_transitions; k++) {
      const Commitkv__V1__TransitionRange *tr = rep->round_report->transitions[k];
      apply(state, n, tr->first_position, tr->count, (uint8_t)tr->from, (uint8_t)tr->to, moves);
    }
    ckv_rpc_free(rep);
    used = ckv_test_stat(&d, "arenas.0.bytes_used");
    cr_assert_leq(used, QUOTA, "round %u: arena usage %llu above the quota", round, used);
  }
  cr_assert_gt(24ull * 64 * fp16_per_token, 2 * QUOTA, "the stream did not go past the quota");
  cr_assert_gt(escalated_by_appends, 0, "appends past the quota never compressed to make room");
  cr_assert_gt(recycled_by_appends, 0, "appends past the quota never recycled to make room");
  cr_assert_geq(refused_at, 24, "never refused with QUOTA once only protected tokens came");
  /* Nothing lost silently: every recycle the daemon counts was in a reply.
   * BUG (handlers.c h_append): when the reclaim recycles tokens and the
   * append is still refused with QUOTA, the error reply drops the
   * transitions list, so those recycles reach the worker in no reply. */
  uint64_t mine = 0;
  for (size_t p = 0; p < n; p++) mine += state[p] == X;
  cr_expect_eq(ckv_test_stat(&d, "tokens.recycled"), mine, "the daemon recycled %llu tokens, the replies reported %llu",
               ckv_test_stat(&d, "tokens.recycled"), (unsigned long long)mine);
  unsigned long long dr = ckv_test_stat(&d, "tokens.draft"), st = ckv_test_stat(&d, "tokens.staged"),
                     co = ckv_test_stat(&d, "tokens.committed"), re = ckv_test_stat(&d, "tokens.recycled");
  cr_expect_eq(dr + st + co + re, n, "state counts must add up to the %zu tokens appended", n);
  cr_expect_leq(used_max, QUOTA);
  cr_expect_eq(ckv_test_stat(&d, "tenants.0.quota_bytes"), QUOTA);
  /* demotion is the default: recycled tokens keep their bytes until the quota
   * rule needs them, and every byte it drops for good is counted */
  unsigned long long dropped = ckv_test_stat(&d, "tokens.dropped");
  fprintf(stderr, "test_lifecycle_daemon: under the quota %llu recycled, %llu of them dropped for good\n", re, dropped);
  cr_expect_gt(dropped, 0, "the quota rule dropped nothing (or did not say so)");
  cr_expect_leq(dropped, re, "more tokens dropped (%llu) than recycled (%llu)", dropped, re);

  cr_expect_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  free(state);
  free(attn);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly");
  ckv_test_rmdir(dir);
}

/* Issue 11 item 10: with a small quota and 64 layers, tokens that the judge
 * moved stayed pending for good and nothing said why.  Now one warning
 * (moves-stalled) names the quota, once, however many rounds follow. */
Test(lifecycle_daemon, moves_stalled_on_quota_are_said_once, .timeout = 60) {
  ckv_test_daemon d;
  /* 3 draft blocks of 16 tokens (4 MiB each) fit, a 64-token staged block (8.5 MiB) does not. */
  char *dir = start_with_quota(&d, "16M");
  ckv_client *c = connect_to(&d);
  ckv_geometry g = {64, 8, 128, 0};
  const char *names[] = {"sink_tokens", "recent_window"};
  const double values[] = {0, 0};
  ckv_session_options so = {.policy = "int8", .param_names = names, .param_values = values, .n_params = 2};
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "stall", &g, &so, &s), CKV_OK, "%s", ckv_client_last_error(c));
  uint64_t first;
  cr_assert_eq(ckv_session_append(s, 40, NULL, NULL, NULL, NULL, &first), CKV_OK, "%s", ckv_client_last_error(c));
  float attn[40];
  for (int i = 0; i < 40; i++) attn[i] = 1.0f / 40;
  ckv_round_result rr = {0};
  for (uint64_t round = 1; round <= 6; round++) {
    cr_assert_eq(ckv_session_report(s, round, 0, attn, 40, &rr), CKV_OK, "%s", ckv_client_last_error(c));
    usleep(50000);
  }
  cr_assert_eq(rr.pending, 40, "expected every token to wait, %u do", rr.pending);
  char *log = ckv_test_read_file(d.log);
  cr_assert_not_null(log);
  int n = 0;
  for (const char *q = log; (q = strstr(q, "moves-stalled")); q++) n++;
  cr_assert_eq(n, 1, "moves-stalled said %d times:\n%s", n, log);
  cr_assert(strstr(log, "40 tokens wait for their moves: the tenant's quota is full"), "%s", log);
  free(log);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
  ckv_test_rmdir(dir);
}

/* ---- the cold tier (issue 39: demote, never drop; recall by the query) ---- */

#define COLD_ROUNDS 12u
#define NEEDLE_FIRST 60u /* positions NEEDLE_FIRST..+7 hold keys a query along channel 0 of head 0 reads */

/* Channel 0 of every head's key: -2 for old text, +4 for the needles, +2 for
 * the last round (the recent window); every other element 0. */
static float cold_key(size_t pos, size_t last_round_first, uint32_t e) {
  if (e % DIM != 0) return 0.f;
  if (pos >= NEEDLE_FIRST && pos < NEEDLE_FIRST + 8) return 4.f;
  return pos >= last_round_first ? 2.f : -2.f;
}

/* Demoted tokens of a session opened with demote = yes keep their bytes:
 * none is dropped, blocks of them are listed in View.cold, and
 * ckv_session_cold_select picks exactly the cold blocks a query could need
 * (the one holding keys it scores high), not the others.  With demote = no
 * the same workload drops tokens and counts the drops. */
static uint64_t cold_workload(int demote, ckv_client *c, ckv_session **ret, uint64_t *ret_cold) {
  ckv_geometry g = {LAYERS, HEADS, DIM, 0};
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds", "demote", "rotate"};
  const double values[] = {4, 16, 2, 2, demote, 1};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 6};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, demote ? "cold" : "dropping", &g, &so, &s);
  cr_assert_eq(r, CKV_OK, "open: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  size_t n = 0, last_first = (COLD_ROUNDS - 1) * PER_ROUND;
  float *attn = calloc(COLD_ROUNDS * PER_ROUND, sizeof(float));
  cr_assert(attn);
  for (uint32_t round = 1; round <= COLD_ROUNDS; round++) {
    float sem[PER_ROUND];
    for (uint32_t i = 0; i < PER_ROUND; i++) sem[i] = 0.5f;
    uint64_t first = 0;
    cr_assert_eq(ckv_session_append(s, PER_ROUND, NULL, NULL, sem, NULL, &first), CKV_OK);
    for (size_t pos = n; pos < n + PER_ROUND; pos++)
      for (uint32_t layer = 0; layer < LAYERS; layer++) {
        uint16_t k[HEADS * DIM], v[HEADS * DIM];
        for (uint32_t e = 0; e < HEADS * DIM; e++) {
          k[e] = ckv_f32_to_f16(cold_key(pos, last_first, e));
          v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 1, e));
        }
        cr_assert_eq(ckv_session_write_kv(s, pos, layer, k, v), CKV_OK);
      }
    n += PER_ROUND;
    /* the sinks and the newest turn draw attention; everything else goes idle */
    for (size_t pos = 0; pos < n; pos++) attn[pos] = pos < 4 || pos + PER_ROUND >= n ? 1.f : 0.f;
    cr_assert_eq(ckv_session_report(s, round, 0, attn, n, NULL), CKV_OK, "report: %s", ckv_client_last_error(c));
  }
  free(attn);
  *ret = s;
  /* the session's dropped tokens, from ListSessions */
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  uint64_t dropped = UINT64_MAX;
  for (int tries = 0; tries < 100; tries++) { /* the moves finish on compressor threads */
    Commitkv__V1__Response *rep;
    cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
    const Commitkv__V1__SessionList *l = rep->session_list;
    uint64_t pending = 1;
    for (size_t i = 0; l && i < l->n_sessions; i++)
      if (!strcmp(l->sessions[i]->session_id, ckv_session_id(s))) {
        dropped = l->sessions[i]->tokens->dropped;
        pending = l->sessions[i]->pending_tokens;
        if (demote) cr_expect_gt(l->sessions[i]->tokens->cold, 0, "no token was demoted");
        *ret_cold = l->sessions[i]->tokens->cold;
      }
    ckv_rpc_free(rep);
    if (!pending) break;
    usleep(20000);
  }
  return dropped;
}

/* Filler (every other token, scored 0) is recycled two rounds after it
 * commits, the rest stays committed (idle_rounds far away): with demotion
 * the filler's bytes stay, and they must not stay in the committed blocks
 * the live half uses.  Returns the demoted tokens outside cold blocks
 * (*ret_demoted: all demoted), once the moves settled. */
static uint64_t demoted_outside_cold(ckv_client *c, uint64_t *ret_demoted) {
  ckv_geometry g = {LAYERS, HEADS, DIM, 0};
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds", "demote", "rotate",
                         "filler_recycle_rounds"};
  const double values[] = {4, 16, 2, 1000, 1, 1, 2};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 7};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, "half-filler", &g, &so, &s);
  cr_assert_eq(r, CKV_OK, "open: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  size_t n = 0;
  float *attn = calloc(COLD_ROUNDS * PER_ROUND, sizeof(float));
  cr_assert(attn);
  for (uint32_t round = 1; round <= COLD_ROUNDS; round++) {
    float sem[PER_ROUND];
    for (uint32_t i = 0; i < PER_ROUND; i++) sem[i] = (n + i) % 2 ? 0.5f : 0.f;
    cr_assert_eq(ckv_session_append(s, PER_ROUND, NULL, NULL, sem, NULL, NULL), CKV_OK);
    for (size_t pos = n; pos < n + PER_ROUND; pos++)
      for (uint32_t layer = 0; layer < LAYERS; layer++) {
        uint16_t k[HEADS * DIM], v[HEADS * DIM];
        for (uint32_t e = 0; e < HEADS * DIM; e++) {
          k[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 0, e));
          v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 1, e));
        }
        cr_assert_eq(ckv_session_write_kv(s, pos, layer, k, v), CKV_OK);
      }
    n += PER_ROUND;
    for (size_t pos = 0; pos < n; pos++) attn[pos] = pos < 4 || pos + PER_ROUND >= n ? 1.f : 0.f;
    cr_assert_eq(ckv_session_report(s, round, 0, attn, n, NULL), CKV_OK, "report: %s", ckv_client_last_error(c));
  }
  free(attn);
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  uint64_t pending = 1;
  for (int tries = 0; tries < 100 && pending; tries++) { /* the moves finish on compressor threads */
    Commitkv__V1__Response *rep;
    cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
    const Commitkv__V1__SessionList *l = rep->session_list;
    for (size_t i = 0; l && i < l->n_sessions; i++)
      if (!strcmp(l->sessions[i]->session_id, ckv_session_id(s))) {
        *ret_demoted = l->sessions[i]->tokens->cold;
        pending = l->sessions[i]->pending_tokens;
      }
    ckv_rpc_free(rep);
    if (pending) usleep(20000);
  }
  cr_assert_eq(pending, 0, "the moves never settled");
  const ckv_view *v;
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  uint64_t in_cold = 0;
  for (size_t i = 0; i < v->n_cold; i++)
    for (uint32_t slot = 0; slot < v->cold[i].capacity; slot++) in_cold += ckv_block_slot_valid(v->cold[i].data, slot);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  return *ret_demoted - in_cold;
}

/* Demoted tokens leave the blocks live tokens use (primary memory): once the
 * moves settle, each is in a cold block but for those in the cold fill
 * block of its format (partly filled: not listed cold until full, its key
 * bounds would change).  Measured: 22 of 86 demoted tokens outside cold
 * blocks; before the separation (issue 39), 86 of 86: the filler shared
 * every committed block with the live half. */
Test(lifecycle_daemon, demoted_tokens_leave_the_blocks_of_live_ones, .timeout = 60) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_daemon_args), 0, "commitkvd did not start");
  ckv_client *c = connect_to(&d);
  uint64_t demoted = 0, outside = demoted_outside_cold(c, &demoted);
  fprintf(stderr, "test_lifecycle_daemon: %llu of %llu demoted tokens outside cold blocks\n",
          (unsigned long long)outside, (unsigned long long)demoted);
  cr_expect_geq(demoted, COLD_ROUNDS * PER_ROUND / 6, "only %llu tokens were demoted", (unsigned long long)demoted);
  cr_expect_leq(outside * 2, demoted, "%llu of %llu demoted tokens share blocks with live ones (primary memory)",
                (unsigned long long)outside, (unsigned long long)demoted);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

Test(lifecycle_daemon, demoted_tokens_stay_cold_and_come_back_for_the_query_that_needs_them, .timeout = 60) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_daemon_args), 0, "commitkvd did not start");
  ckv_client *c = connect_to(&d);
  ckv_session *s;
  uint64_t demoted = 0, dropped = cold_workload(1, c, &s, &demoted);
  cr_expect_eq(dropped, 0, "demote = yes dropped %llu tokens without a quota rule", (unsigned long long)dropped);
  const ckv_view *v;
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  cr_assert_geq(v->n_cold, 2, "cold blocks in the view: %zu", v->n_cold);
  /* Every demoted token is in a cold block but for those in the cold fill
   * block of each format (partly filled: not listed cold until full).
   * Measured: 224 of 236 (this workload demotes whole blocks at once: see
   * demoted_tokens_leave_the_blocks_of_live_ones for the mixed case). */
  uint64_t in_cold = 0;
  for (size_t i = 0; i < v->n_cold; i++)
    for (uint32_t slot = 0; slot < v->cold[i].capacity; slot++) in_cold += ckv_block_slot_valid(v->cold[i].data, slot);
  fprintf(stderr, "test_lifecycle_daemon: %llu of %llu demoted tokens in cold blocks\n", (unsigned long long)in_cold,
          (unsigned long long)demoted);
  cr_expect_leq(demoted - in_cold, 2u * 64u, "%llu demoted tokens share blocks with live ones (primary memory)",
                (unsigned long long)(demoted - in_cold));
  /* the needles' block, and only it, for a query along channel 0 of each head */
  float q[HEADS * DIM] = {0};
  for (uint32_t h = 0; h < HEADS; h++) q[h * DIM] = 20.f;
  uint32_t idx[256];
  size_t n_sel = 0;
  cr_assert_leq(v->n_cold, 256);
  cr_assert_eq(ckv_session_cold_select(s, 0, q, HEADS, 0.f, 0.01f, idx, &n_sel), CKV_OK);
  size_t with_needle = 0, selected_with_needle = 0;
  for (size_t i = 0; i < v->n_cold; i++) {
    const ckv_block_view *b = &v->cold[i];
    const uint32_t *pos = ckv_block_positions_const(b->data);
    bool needle = false;
    for (uint32_t slot = 0; slot < b->capacity; slot++)
      needle |= ckv_block_slot_valid(b->data, slot) && pos[slot] >= NEEDLE_FIRST && pos[slot] < NEEDLE_FIRST + 8;
    bool sel = false;
    for (size_t k = 0; k < n_sel; k++) sel |= idx[k] == i;
    with_needle += needle;
    selected_with_needle += needle && sel;
    cr_expect(!sel || needle, "cold block %zu (no needle) selected for the needle query", i);
  }
  fprintf(stderr, "test_lifecycle_daemon: %zu cold blocks, %zu hold needles, %zu selected\n", v->n_cold, with_needle,
          n_sel);
  cr_expect_geq(with_needle, 1, "the needles were not demoted");
  cr_expect_eq(selected_with_needle, with_needle, "a cold block with needles was left out");
  /* a query orthogonal to every key attends uniformly: every cold block could take weight, all are read */
  for (uint32_t h = 0; h < HEADS; h++) q[h * DIM] = 0.f;
  q[1] = 20.f;
  cr_assert_eq(ckv_session_cold_select(s, 0, q, HEADS, 0.f, 0.01f, idx, &n_sel), CKV_OK);
  cr_expect_eq(n_sel, v->n_cold, "a uniform query: every cold block could matter");
  /* capped (Quest's top-k): at most max_blocks of them, in ascending order */
  size_t n_top = 0;
  cr_assert_eq(ckv_session_cold_select_top(s, 0, q, HEADS, 0.f, 0.01f, 2, idx, &n_top), CKV_OK);
  cr_expect_eq(n_top, 2, "a cap of 2 gave %zu blocks", n_top);
  cr_expect(n_top < 2 || idx[0] < idx[1], "the capped selection is not in view order");
  /* the needle query, capped at one block: the needles' block */
  for (uint32_t h = 0; h < HEADS; h++) q[h * DIM] = 20.f;
  q[1] = 0.f;
  cr_assert_eq(ckv_session_cold_select_top(s, 0, q, HEADS, 0.f, 0.01f, 1, idx, &n_top), CKV_OK);
  cr_assert_eq(n_top, 1);
  const ckv_block_view *top = &v->cold[idx[0]];
  bool top_needle = false;
  for (uint32_t slot = 0; slot < top->capacity; slot++) {
    uint32_t p = ckv_block_positions_const(top->data)[slot];
    top_needle |= ckv_block_slot_valid(top->data, slot) && p >= NEEDLE_FIRST && p < NEEDLE_FIRST + 8;
  }
  cr_expect(top_needle, "the one block kept for the needle query holds no needle");
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  /* without demotion the same workload drops, and says so */
  dropped = cold_workload(0, c, &s, &demoted);
  cr_expect_gt(dropped, 0, "demote = no dropped nothing");
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

/* A daemon, a client and the cold workload's session (demote = yes, nothing dropped); its view, with at least
 * min_cold cold blocks. */
static const ckv_view *cold_session(ckv_test_daemon *d, ckv_client **c, ckv_session **s, size_t min_cold) {
  cr_assert_eq(ckv_test_daemon_start(d, k_daemon_args), 0, "commitkvd did not start");
  *c = connect_to(d);
  uint64_t demoted = 0;
  cr_assert_eq(cold_workload(1, *c, s, &demoted), 0, "tokens dropped without a quota rule");
  const ckv_view *v;
  cr_assert_eq(ckv_session_view(*s, &v), CKV_OK);
  cr_assert_geq(v->n_cold, min_cold, "cold blocks in the view: %zu", v->n_cold);
  return v;
}

/* Where position pos is among view->cold: the block's index (its slot in *ret_slot), or -1. */
static int cold_slot_of(const ckv_view *v, uint32_t pos, uint32_t *ret_slot) {
  for (size_t i = 0; i < v->n_cold; i++)
    for (uint32_t slot = 0; slot < v->cold[i].capacity; slot++)
      if (ckv_block_slot_valid(v->cold[i].data, slot) && ckv_block_positions_const(v->cold[i].data)[slot] == pos) {
        *ret_slot = slot;
        return (int)i;
      }
  return -1;
}

/* ckv_session_cold_gather: for a query along channel 0 of each head, the eight needles (the cold tokens it scores
 * highest, first by their one-bit sketches, then exactly) and nothing else when it may take eight; all eight among
 * sixteen; each gathered row is the FP16 of the cold copy's K and V for that layer, at the needle's position; a
 * query that wants nothing in particular still gets max_tokens valid tokens; bad arguments are refused. */
Test(lifecycle_daemon, cold_gather_brings_the_tokens_a_query_needs, .timeout = 60) {
  ckv_test_daemon d;
  ckv_client *c;
  ckv_session *s;
  const ckv_view *v = cold_session(&d, &c, &s, 2);
  const ckv_geometry g = {LAYERS, HEADS, DIM, 0};
  enum { CAP = 16 };
  size_t bytes = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &g, CAP, 0);
  void *blk = aligned_alloc(CKV_BLOCK_ALIGN, (bytes + CKV_BLOCK_ALIGN - 1) / CKV_BLOCK_ALIGN * CKV_BLOCK_ALIGN);
  cr_assert_not_null(blk);
  float q[HEADS * DIM] = {0};
  for (uint32_t h = 0; h < HEADS; h++) q[h * DIM] = 20.f;
  uint32_t src[CAP];
  size_t n = 0;
  for (uint32_t layer = 0; layer < LAYERS; layer++) {
    cr_assert_eq(ckv_session_cold_gather(s, layer, q, HEADS, 0.f, 8, blk, CAP, src, &n), CKV_OK, "%s",
                 ckv_client_last_error(c));
    cr_assert_eq(n, 8, "layer %u: %zu tokens gathered", layer, n);
    const uint32_t *pos = ckv_block_positions_const(blk);
    for (uint32_t slot = 0; slot < CAP; slot++) {
      cr_expect_eq(ckv_block_slot_valid(blk, slot), slot < 8, "layer %u: slot %u valid %d", layer, slot,
                   ckv_block_slot_valid(blk, slot));
      if (slot >= 8) continue;
      cr_expect_eq(pos[slot], NEEDLE_FIRST + slot, "layer %u: slot %u holds position %u, not needle %u", layer, slot,
                   pos[slot], NEEDLE_FIRST + slot);
      uint32_t from_slot;
      int from = cold_slot_of(v, pos[slot], &from_slot);
      cr_assert_geq(from, 0, "position %u is in no cold block", pos[slot]);
      cr_expect_eq(src[slot], (uint32_t)from, "slot %u: source %u, the token is in cold block %d", slot, src[slot], from);
      for (uint32_t kv = 0; kv < 2; kv++) {
        float want[HEADS * DIM];
        cr_assert_eq(ckv_kernels_dequantize(&g, v->cold[from].data, layer, kv, from_slot, want), CKV_OK);
        const uint16_t *got = (const uint16_t *)((const uint8_t *)blk + ckv_draft_kv_offset(&g, CAP, layer, kv, slot));
        for (uint32_t e = 0; e < HEADS * DIM; e++)
          cr_assert_eq(got[e], ckv_f32_to_f16(want[e]), "layer %u slot %u %s[%u]: %04x, the cold copy says %04x", layer,
                       slot, kv ? "V" : "K", e, got[e], ckv_f32_to_f16(want[e]));
      }
    }
  }
  /* sixteen: the eight needles among them */
  cr_assert_eq(ckv_session_cold_gather(s, 0, q, HEADS, 0.f, 16, blk, CAP, src, &n), CKV_OK);
  cr_expect_eq(n, 16);
  uint32_t needles = 0;
  for (uint32_t slot = 0; slot < n; slot++) {
    uint32_t p = ckv_block_positions_const(blk)[slot];
    needles += p >= NEEDLE_FIRST && p < NEEDLE_FIRST + 8;
  }
  cr_expect_eq(needles, 8, "%u of the 8 needles among 16 gathered tokens", needles);
  /* a query orthogonal to every key: max_tokens tokens all the same */
  for (uint32_t h = 0; h < HEADS; h++) q[h * DIM] = 0.f;
  q[1] = 20.f;
  cr_assert_eq(ckv_session_cold_gather(s, 1, q, HEADS, 0.f, 4, blk, CAP, NULL, &n), CKV_OK);
  cr_expect_eq(n, 4);
  /* refused: fewer slots than tokens, no tokens, a layer past the model's, a query head count off the geometry */
  cr_expect_eq(ckv_session_cold_gather(s, 0, q, HEADS, 0.f, CAP + 1, blk, CAP, NULL, &n), CKV_ERR_INVALID);
  cr_expect_eq(ckv_session_cold_gather(s, 0, q, HEADS, 0.f, 0, blk, CAP, NULL, &n), CKV_ERR_INVALID);
  cr_expect_eq(ckv_session_cold_gather(s, LAYERS, q, HEADS, 0.f, 4, blk, CAP, NULL, &n), CKV_ERR_INVALID);
  cr_expect_eq(ckv_session_cold_gather(s, 0, q, HEADS + 1, 0.f, 4, blk, CAP, NULL, &n), CKV_ERR_INVALID);
  cr_expect_eq(ckv_session_cold_gather(s, 0, q, HEADS, 0.f, 4, NULL, CAP, NULL, &n), CKV_ERR_INVALID);
  free(blk);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

/* ckv_session_cold_gather ranks every token of a rotated cold block by its exact score, straight from the
 * block's codes (no sketch, no shortlist): for random queries, the tokens it gathers are the max_tokens whose
 * exact scores (keys dequantized here) take the largest share of a head's softmax mass over all cold tokens,
 * up to float rounding.  The summaries of such blocks hold no sketches: at most a slot list.  With the first
 * pass on one-bit sketches and only the best 16 scored exactly (checked by forcing it), 23 of the 100 picks
 * missed the best token, and the summaries held 17 KB. */
Test(lifecycle_daemon, cold_gather_ranks_rotated_cold_tokens_exactly, .timeout = 60) {
  ckv_test_daemon d;
  ckv_client *c;
  ckv_session *s;
  const ckv_view *v = cold_session(&d, &c, &s, 2);
  const ckv_geometry g = {LAYERS, HEADS, DIM, 0};
  enum { CAP = 16, TAKE = 1, MAXC = 4096 };
  size_t bytes = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &g, CAP, 0);
  void *blk = aligned_alloc(CKV_BLOCK_ALIGN, (bytes + CKV_BLOCK_ALIGN - 1) / CKV_BLOCK_ALIGN * CKV_BLOCK_ALIGN);
  cr_assert_not_null(blk);
  size_t rotated = 0, slots = 0;
  for (size_t i = 0; i < v->n_cold; i++) {
    rotated += ckv_format_is_rot(v->cold[i].format) && ckv_format_code_bits(v->cold[i].format) != 3u;
    slots += v->cold[i].capacity;
  }
  cr_assert_eq(rotated, v->n_cold, "%zu of %zu cold blocks rotated (1, 2 or 4 bits)", rotated, v->n_cold);
  static float score[MAXC][HEADS];
  static uint32_t pos[MAXC];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  size_t picks = 0, off = 0, n_cold = 0;
  for (int trial = 0; trial < 50; trial++)
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
      float q[HEADS * DIM];
      for (uint32_t e = 0; e < HEADS * DIM; e++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        q[e] = ((float)(x >> 40) / (float)(1u << 24) - 0.5f) * 8.f;
      }
      size_t n = 0; /* every cold token's exact scores, and per head the log of the softmax sum over them */
      float lse[HEADS];
      for (size_t i = 0; i < v->n_cold; i++)
        for (uint32_t slot = 0; slot < v->cold[i].capacity; slot++) {
          if (!ckv_block_slot_valid(v->cold[i].data, slot)) continue;
          float k[HEADS * DIM];
          cr_assert_eq(ckv_kernels_dequantize(&g, v->cold[i].data, layer, 0, slot, k), CKV_OK);
          cr_assert_lt(n, MAXC);
          for (uint32_t h = 0; h < HEADS; h++) {
            double dot = 0;
            for (uint32_t e = 0; e < DIM; e++) dot += (double)q[h * DIM + e] * k[h * DIM + e];
            score[n][h] = (float)(dot / sqrt((double)DIM));
          }
          pos[n++] = ckv_block_positions_const(v->cold[i].data)[slot];
        }
      n_cold = n;
      for (uint32_t h = 0; h < HEADS; h++) {
        double top = -INFINITY, acc = 0;
        for (size_t t = 0; t < n; t++) top = score[t][h] > top ? score[t][h] : top;
        for (size_t t = 0; t < n; t++) acc += exp(score[t][h] - top);
        lse[h] = (float)(top + log(acc));
      }
      float rank[MAXC], sorted[MAXC];
      for (size_t t = 0; t < n; t++) {
        rank[t] = -INFINITY;
        for (uint32_t h = 0; h < HEADS; h++) rank[t] = score[t][h] - lse[h] > rank[t] ? score[t][h] - lse[h] : rank[t];
        sorted[t] = rank[t];
      }
      for (size_t a = 0; a < TAKE; a++) /* the TAKE largest ranks, first */
        for (size_t b = a + 1; b < n; b++)
          if (sorted[b] > sorted[a]) {
            float tmp = sorted[a];
            sorted[a] = sorted[b], sorted[b] = tmp;
          }
      size_t got;
      cr_assert_eq(ckv_session_cold_gather(s, layer, q, HEADS, 0.f, TAKE, blk, CAP, NULL, &got), CKV_OK);
      cr_assert_eq(got, TAKE);
      for (uint32_t slot = 0; slot < TAKE; slot++) {
        uint32_t p = ckv_block_positions_const(blk)[slot];
        size_t t = 0;
        while (t < n && pos[t] != p) t++;
        cr_assert_lt(t, n, "gathered position %u is no cold token", p);
        picks++;
        /* rounding: the codes' sum and this dequantized dot differ in the last bits */
        off += rank[t] < sorted[TAKE - 1] - 1e-4f * (1.f + fabsf(sorted[TAKE - 1]));
      }
    }
  cr_log_info("%zu cold tokens in %zu blocks (%zu slots); %zu of %zu picks not among the best %d; summaries %zu bytes",
              n_cold, v->n_cold, slots, off, picks, TAKE, ckv_session_cold_summary_bytes(s));
  cr_expect_eq(off, 0, "%zu of %zu gathered tokens are not among the %d best by exact score", off, picks, TAKE);
  cr_expect_leq(ckv_session_cold_summary_bytes(s), 4096 + 64 * v->n_cold + 4 * slots,
                "summaries of %zu code-scored cold blocks hold %zu bytes: sketches kept", v->n_cold,
                ckv_session_cold_summary_bytes(s));
  free(blk);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

/* Waits until the session has no token waiting for its move. */
static void settle_moves(ckv_client *c, ckv_session *s) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  uint64_t pending = 1;
  for (int tries = 0; tries < 100 && pending; tries++) {
    Commitkv__V1__Response *rep;
    cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
    const Commitkv__V1__SessionList *l = rep->session_list;
    for (size_t i = 0; l && i < l->n_sessions; i++)
      if (!strcmp(l->sessions[i]->session_id, ckv_session_id(s))) pending = l->sessions[i]->pending_tokens;
    ckv_rpc_free(rep);
    if (pending) usleep(20000);
  }
  cr_assert_eq(pending, 0, "the moves never settled");
}

/* Reports a round in which the sinks and the tokens at want[0..n_want) draw attention (a recall). */
static void attend_positions(ckv_client *c, ckv_session *s, uint32_t round, const uint32_t *want, size_t n_want) {
  size_t n = ckv_session_tokens(s);
  float *attn = calloc(n, sizeof(float));
  cr_assert(attn);
  for (size_t p = 0; p < 4; p++) attn[p] = 1.f;
  for (size_t i = 0; i < n_want; i++) attn[want[i]] = 1.f;
  cr_assert_eq(ckv_session_report(s, round, 0, attn, n, NULL), CKV_OK, "report: %s", ckv_client_last_error(c));
  free(attn);
  settle_moves(c, s);
}

/* A cold block that recalls leave at most half full moves its tokens to the
 * cold fill block and retires (store/moves.c): two recalls out of one full
 * cold block (3/8 of it, then down to half) retire it, and no format keeps
 * more than one cold block that sparse (its fill block).  Without the
 * compaction the block stays, half empty (the assertions fail: checked by
 * building commitkvd with CKV_ROT_SPARSE_NUM 0). */
Test(lifecycle_daemon, cold_blocks_that_recalls_empty_are_compacted, .timeout = 60) {
  ckv_test_daemon d;
  ckv_client *c;
  ckv_session *s;
  const ckv_view *v = cold_session(&d, &c, &s, 1);
  /* the fullest cold block, and its tokens */
  size_t best = 0;
  uint32_t best_valid = 0;
  for (size_t i = 0; i < v->n_cold; i++) {
    uint32_t valid = 0;
    for (uint32_t slot = 0; slot < v->cold[i].capacity; slot++) valid += ckv_block_slot_valid(v->cold[i].data, slot);
    if (valid > best_valid) best_valid = valid, best = i;
  }
  const uint32_t cap = v->cold[best].capacity;
  const uint64_t block_id = v->cold[best].id;
  cr_assert_gt(best_valid * 2, cap + 8, "the fullest cold block holds %u of %u", best_valid, cap);
  uint32_t pos[512];
  size_t n_pos = 0;
  for (uint32_t slot = 0; slot < cap && n_pos < 512; slot++)
    if (ckv_block_slot_valid(v->cold[best].data, slot)) pos[n_pos++] = ckv_block_positions_const(v->cold[best].data)[slot];
  const size_t first = n_pos * 3 / 8, second = n_pos - first - cap / 2; /* leaves cap / 2: half full */
  cr_assert_gt(second, 0);
  attend_positions(c, s, COLD_ROUNDS + 1, pos, first);
  attend_positions(c, s, COLD_ROUNDS + 2, pos + first, second);
  cr_assert_eq(ckv_session_view(s, &v), CKV_OK);
  /* at most half full: only the cold fill block of a format (it is being filled, listed cold as all its
   * tokens are demoted), at most one per format */
  size_t sparse = 0, sparse_by_format[16] = {0};
  bool still = false;
  for (size_t i = 0; i < v->n_cold; i++) {
    uint32_t valid = 0;
    for (uint32_t slot = 0; slot < v->cold[i].capacity; slot++) valid += ckv_block_slot_valid(v->cold[i].data, slot);
    if (valid * 2 <= v->cold[i].capacity) {
      sparse++;
      cr_assert_lt(v->cold[i].format, 16);
      cr_expect_leq(++sparse_by_format[v->cold[i].format], 1, "two cold blocks of format %u at most half full",
                    (unsigned)v->cold[i].format);
    }
    still |= v->cold[i].id == block_id;
  }
  fprintf(stderr, "test_lifecycle_daemon: cold block of %u recalled %zu then %zu; %zu cold blocks, %zu at most half full, "
          "the block %s\n", best_valid, first, second, v->n_cold, sparse, still ? "still there" : "retired");
  cr_expect_not(still, "the emptied cold block is still in the view");
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}
