/* rawcheck.h - the Criterion side of the raw client (rawclient.h): calls
 * that fail the test when the transport fails or a reply breaks what every
 * reply must hold, request builders for each message, and expect_code /
 * expect_text.
 *
 * Every decoded Response is checked here: it is a commitkv.v1.Response, it
 * carries the 16-byte boot token, and an error reply has no body and
 * explains itself in its message; raw_call's reply answers that request.
 * A suite that checks more of each reply sets raw.inspect (rawclient.h)
 * through raw_connect_inspected.  Define RAW_CLIENT_NAME before including
 * to name the suite's clients (attach and Hello). */
#ifndef CKV_TEST_RAWCHECK_H
#define CKV_TEST_RAWCHECK_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "commitkv.pb-c.h"
#include "commitkv/status.h"
#include "rawclient.h"
#include "testutil.h"

#ifndef RAW_CLIENT_NAME
#define RAW_CLIENT_NAME "raw-client"
#endif

#define REPLY_TIMEOUT_MS CKV_RAW_TIMEOUT_MS
#define NO_REPLY CKV_RAW_NO_REPLY
#define BAD_REPLY CKV_RAW_BAD_REPLY

typedef ckv_raw raw;

static inline void raw_init(raw *r) { ckv_raw_init(r); }
static inline void raw_done(raw *r) { ckv_raw_done(r); }

/* The attach handshake as RAW_CLIENT_NAME: the AttachReply's code or a transport error. */
static inline int raw_attach(raw *r, const char *path) { return ckv_raw_attach(r, path, RAW_CLIENT_NAME); }

static inline void raw_dealer(raw *r, const char *endpoint, const void *id, size_t id_len) {
  cr_assert_eq(ckv_raw_dealer(r, endpoint, id, id_len), 0, "DEALER on %s: %s", endpoint, zmq_strerror(zmq_errno()));
}

/* Attach as `name` (every reply shown to `inspect`, which may be NULL),
 * then connect the DEALER with the attach key, as the contract says. */
static inline void raw_connect_inspected(raw *r, const ckv_test_daemon *d, const char *name, ckv_raw_inspect_fn inspect,
                                         void *ctx) {
  ckv_raw_init(r);
  r->inspect = inspect;
  r->inspect_ctx = ctx;
  int rc = ckv_raw_attach(r, d->attach, name);
  cr_assert_eq(rc, CKV_OK, "raw attach failed: %s (%s)", ckv_strerror(rc), r->msg);
  raw_dealer(r, d->socket, r->key, sizeof(r->key));
}

static inline void raw_connect(raw *r, const ckv_test_daemon *d) {
  raw_connect_inspected(r, d, RAW_CLIENT_NAME, NULL, NULL);
}

/* Sends one multipart message. */
static inline void raw_send(raw *r, const void *const *frames, const size_t *lens, int n) {
  int rc = ckv_raw_send(r, frames, lens, n);
  cr_assert_eq(rc, 0, "zmq_send: %s", zmq_strerror(-rc));
}

static inline void raw_send1(raw *r, const void *buf, size_t len) { raw_send(r, (const void *const[]){buf}, &len, 1); }

/* Waits for one reply.  Returns its code or NO_REPLY; *ret (may be NULL)
 * gets the Response, to free with commitkv__v1__response__free_unpacked. */
static inline int raw_recv(raw *r, int timeout_ms, Commitkv__V1__Response **ret) {
  Commitkv__V1__Response *rep = NULL;
  int code = ckv_raw_recv(r, timeout_ms, &rep);
  if (code == NO_REPLY) return code;
  cr_assert_not_null(rep, "the reply is not a commitkv.v1.Response");
  if (code != 0) {
    cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY__NOT_SET, "an error reply has a body");
    cr_assert(rep->message && *rep->message, "error %d without an explanation", code);
  }
  cr_assert_eq(rep->boot_token.len, 16u, "every reply carries the boot token");
  if (ret)
    *ret = rep;
  else
    commitkv__v1__response__free_unpacked(rep, NULL);
  return code;
}

/* Sends a packed Request (version 1 unless the caller set one) and returns
 * the reply's code, or NO_REPLY. */
static inline int raw_call(raw *r, Commitkv__V1__Request *req, Commitkv__V1__Response **ret) {
  int rc = ckv_raw_send_request(r, req);
  cr_assert_eq(rc, 0, "sending request: %s", zmq_strerror(-rc));
  Commitkv__V1__Response *rep = NULL;
  int code = raw_recv(r, REPLY_TIMEOUT_MS, &rep);
  if (rep) cr_assert_eq(rep->request_id, req->request_id, "reply to another request");
  if (ret)
    *ret = rep;
  else if (rep)
    commitkv__v1__response__free_unpacked(rep, NULL);
  return code;
}

/* Asserts a status code with both names (and the last reply's text) in the
 * failure message. */
#define expect_code(got, want)                                                                                   \
  do {                                                                                                           \
    int got_ = (got), want_ = (want);                                                                            \
    cr_assert_eq(got_, want_, "%s: got %d %s, want %d %s (last reply: \"%s\")", #got, got_,                     \
                 got_ == NO_REPLY ? "(no reply)" : got_ == BAD_REPLY ? "(bad reply)" : ckv_status_name(got_),   \
                 want_, ckv_status_name(want_), ckv_raw_last_text());                                            \
  } while (0)

/* Asserts that the last reply's text contains `part`. */
#define expect_text(part)                                                                                        \
  cr_assert_not_null(strstr(ckv_raw_last_text(), (part)), "the reply says \"%s\", not \"%s\"",                  \
                     ckv_raw_last_text(), (part))

/* ---- request builders ---------------------------------------------------- */

static inline int rq_hello(raw *r, uint32_t max_v, uint32_t min_v) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Hello h = COMMITKV__V1__HELLO__INIT;
  h.max_version = max_v;
  h.min_version = min_v;
  h.client_name = (char *)(r->name ? r->name : RAW_CLIENT_NAME);
  q.body_case = COMMITKV__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  return raw_call(r, &q, NULL);
}

typedef struct geom {
  uint32_t layers, heads, dim, dtype, draft, commit;
  bool none; /* no geometry message at all */
} geom;

static const geom k_geom = {.layers = 2, .heads = 2, .dim = 64};

/* OpenSession with geometry `g`; `policy` and one parameter `param_key`
 * (= 0.5) when not NULL. */
static inline int rq_open_with(raw *r, const char *sid, geom g, bool resume, const char *policy,
                               const char *param_key) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__OpenSession o = COMMITKV__V1__OPEN_SESSION__INIT;
  Commitkv__V1__Geometry gm = COMMITKV__V1__GEOMETRY__INIT;
  Commitkv__V1__OpenSession__ParamsEntry e = COMMITKV__V1__OPEN_SESSION__PARAMS_ENTRY__INIT, *ep = &e;
  gm.n_layers = g.layers;
  gm.n_kv_heads = g.heads;
  gm.head_dim = g.dim;
  gm.dtype = (Commitkv__V1__Dtype)g.dtype;
  gm.draft_block_tokens = g.draft;
  gm.commit_block_tokens = g.commit;
  o.session_id = (char *)sid;
  o.geometry = g.none ? NULL : &gm;
  o.resume = resume;
  if (policy) o.policy = (char *)policy;
  if (param_key) {
    e.key = (char *)param_key;
    e.value = 0.5;
    o.n_params = 1;
    o.params = &ep;
  }
  q.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION;
  q.open_session = &o;
  return raw_call(r, &q, NULL);
}

static inline int rq_open_ex(raw *r, const char *sid, geom g, bool resume) {
  return rq_open_with(r, sid, g, resume, NULL, NULL);
}

static inline int rq_open_policy(raw *r, const char *sid, const char *policy, const char *param_key) {
  return rq_open_with(r, sid, k_geom, false, policy, param_key);
}

static inline int rq_open(raw *r, const char *sid) { return rq_open_ex(r, sid, k_geom, false); }

/* The optional columns of AppendTokens, as bytes. */
typedef struct cols {
  const void *roles;
  size_t roles_len;
  const void *sem;
  size_t sem_len;
} cols;

/* AppendTokens; *ret_first (may be NULL) gets the first new position. */
static inline int rq_append_ex(raw *r, const char *sid, uint32_t count, cols c, uint64_t *ret_first) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
  a.session_id = (char *)sid;
  a.count = count;
  a.roles = (ProtobufCBinaryData){c.roles_len, (uint8_t *)c.roles};
  a.semantic = (ProtobufCBinaryData){c.sem_len, (uint8_t *)c.sem};
  q.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  q.append_tokens = &a;
  Commitkv__V1__Response *rep = NULL;
  int code = raw_call(r, &q, &rep);
  if (code == 0 && ret_first) {
    cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_TOKENS_APPENDED);
    *ret_first = rep->tokens_appended->first_position;
  }
  if (rep) commitkv__v1__response__free_unpacked(rep, NULL);
  return code;
}

static inline int rq_append(raw *r, const char *sid, uint32_t count) {
  return rq_append_ex(r, sid, count, (cols){0}, NULL);
}

/* ReportRound with `n` attention values and `m` semantic updates. */
static inline int rq_report_attn(raw *r, const char *sid, uint64_t round, uint64_t first, const float *attn, size_t n,
                                 const uint32_t *sem_pos, const float *sem_scores, size_t m) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
  rr.session_id = (char *)sid;
  rr.round = round;
  rr.first_position = first;
  rr.attention = (ProtobufCBinaryData){n * sizeof(float), (uint8_t *)attn};
  rr.semantic_positions = (ProtobufCBinaryData){m * sizeof(uint32_t), (uint8_t *)sem_pos};
  rr.semantic_scores = (ProtobufCBinaryData){m * sizeof(float), (uint8_t *)sem_scores};
  q.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND;
  q.report_round = &rr;
  return raw_call(r, &q, NULL);
}

/* ReportRound with `n` attention values, all 1/n, and optional semantic updates. */
static inline int rq_report_ex(raw *r, const char *sid, uint64_t round, uint64_t first, size_t n,
                               const uint32_t *sem_pos, const float *sem_scores, size_t m) {
  float *attn = calloc(n ? n : 1, sizeof(float));
  cr_assert_not_null(attn);
  for (size_t i = 0; i < n; i++) attn[i] = 1.0f / (float)n;
  int code = rq_report_attn(r, sid, round, first, attn, n, sem_pos, sem_scores, m);
  free(attn);
  return code;
}

static inline int rq_report(raw *r, const char *sid, uint64_t round, uint64_t first, size_t n) {
  return rq_report_ex(r, sid, round, first, n, NULL, NULL, 0);
}

static inline int rq_ack(raw *r, const char *sid, uint64_t epoch) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AckEpoch a = COMMITKV__V1__ACK_EPOCH__INIT;
  a.session_id = (char *)sid;
  a.epoch = epoch;
  q.body_case = COMMITKV__V1__REQUEST__BODY_ACK_EPOCH;
  q.ack_epoch = &a;
  return raw_call(r, &q, NULL);
}

/* GetView; *ret_n_tokens / *ret_epoch (may be NULL) on success. */
static inline int rq_view(raw *r, const char *sid, uint64_t *ret_n_tokens, uint64_t *ret_epoch) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__GetView g = COMMITKV__V1__GET_VIEW__INIT;
  g.session_id = (char *)sid;
  q.body_case = COMMITKV__V1__REQUEST__BODY_GET_VIEW;
  q.get_view = &g;
  Commitkv__V1__Response *rep = NULL;
  int code = raw_call(r, &q, &rep);
  if (code == 0) {
    cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_VIEW);
    if (ret_n_tokens) *ret_n_tokens = rep->view->n_tokens;
    if (ret_epoch) *ret_epoch = rep->view->epoch;
  }
  if (rep) commitkv__v1__response__free_unpacked(rep, NULL);
  return code;
}

static inline int rq_acquire(raw *r, const char *sid) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Acquire a = COMMITKV__V1__ACQUIRE__INIT;
  a.session_id = (char *)sid;
  q.body_case = COMMITKV__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  return raw_call(r, &q, NULL);
}

static inline int rq_close(raw *r, const char *sid) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__CloseSession c = COMMITKV__V1__CLOSE_SESSION__INIT;
  c.session_id = (char *)sid;
  q.body_case = COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION;
  q.close_session = &c;
  return raw_call(r, &q, NULL);
}

/* DropSession; `tenant` (may be NULL) names another tenant's session. */
static inline int rq_drop(raw *r, const char *sid, const char *tenant) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__DropSession dr = COMMITKV__V1__DROP_SESSION__INIT;
  dr.session_id = (char *)sid;
  if (tenant) dr.tenant = (char *)tenant;
  q.body_case = COMMITKV__V1__REQUEST__BODY_DROP_SESSION;
  q.drop_session = &dr;
  return raw_call(r, &q, NULL);
}

/* ListSessions: how many sessions are listed, and how many named `sid`. */
static inline int rq_list(raw *r, const char *sid, size_t *ret_n, size_t *ret_named) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions l = COMMITKV__V1__LIST_SESSIONS__INIT;
  q.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  q.list_sessions = &l;
  Commitkv__V1__Response *rep = NULL;
  int code = raw_call(r, &q, &rep);
  if (code == 0) {
    cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_SESSION_LIST);
    size_t named = 0;
    for (size_t i = 0; i < rep->session_list->n_sessions; i++)
      named += strcmp(rep->session_list->sessions[i]->session_id, sid) == 0;
    *ret_n = rep->session_list->n_sessions;
    *ret_named = named;
  }
  if (rep) commitkv__v1__response__free_unpacked(rep, NULL);
  return code;
}

static inline int rq_heartbeat(raw *r) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Heartbeat h = COMMITKV__V1__HEARTBEAT__INIT;
  q.body_case = COMMITKV__V1__REQUEST__BODY_HEARTBEAT;
  q.heartbeat = &h;
  return raw_call(r, &q, NULL);
}

/* Stats.rounds: the rounds the daemon applied, all sessions. */
static inline uint64_t rq_rounds(raw *r) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest st = COMMITKV__V1__STATS_REQUEST__INIT;
  q.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  q.stats = &st;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(raw_call(r, &q, &rep), CKV_OK);
  cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_STATS);
  uint64_t n = rep->stats->rounds;
  commitkv__v1__response__free_unpacked(rep, NULL);
  return n;
}

#endif
