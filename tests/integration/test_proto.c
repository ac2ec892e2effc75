/* test_proto.c - the wire contract, message by message (proto/commitkv.proto).
 *
 * For every Request body the daemon decodes (daemon/wire.c, capped bump
 * arena) and every Response body and attach message a client decodes:
 * - a fully populated message survives pack -> decode -> pack byte for byte
 *   (so no field is lost or renamed on the way);
 * - every prefix of it is refused or accepted exactly as stock protobuf-c
 *   refuses or accepts it, and a refused prefix answers CKV_ERR_PROTO;
 * - the decode cap holds: the same bytes with too small an arena are refused,
 *   never half-decoded, and the arena is reusable afterwards;
 * - unknown fields are skipped (proto3), an empty body still gives handlers
 *   non-NULL strings, and session ids follow [A-Za-z0-9._:-]{1,128}.
 * No daemon process is needed: this exercises the decoding layer directly. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv.pb-c.h"
#include "commitkv/status.h"
#include "daemon/wire.h"

#define ARENA_CAP (1u << 20)

static uint8_t k_bytes[64];
static uint32_t k_u32[8] = {1, 2, 3, 4, 5, 6, 7, 0xffffffffu};
static float k_f32[8] = {0.f, 0.125f, 0.25f, 0.5f, 1.f, 0.75f, 0.0625f, 1e-6f};

/* ---- one populated Request per body type ------------------------------- */

static Commitkv__V1__Geometry g_geom = COMMITKV__V1__GEOMETRY__INIT;
static Commitkv__V1__Hello g_hello = COMMITKV__V1__HELLO__INIT;
static Commitkv__V1__OpenSession g_open = COMMITKV__V1__OPEN_SESSION__INIT;
static Commitkv__V1__OpenSession__ParamsEntry g_param[2] = {COMMITKV__V1__OPEN_SESSION__PARAMS_ENTRY__INIT,
                                                            COMMITKV__V1__OPEN_SESSION__PARAMS_ENTRY__INIT};
static Commitkv__V1__OpenSession__ParamsEntry *g_params[2] = {&g_param[0], &g_param[1]};
static Commitkv__V1__AppendTokens g_append = COMMITKV__V1__APPEND_TOKENS__INIT;
static Commitkv__V1__ReportRound g_report = COMMITKV__V1__REPORT_ROUND__INIT;
static Commitkv__V1__AckEpoch g_ack = COMMITKV__V1__ACK_EPOCH__INIT;
static Commitkv__V1__Acquire g_acquire = COMMITKV__V1__ACQUIRE__INIT;
static Commitkv__V1__GetView g_view = COMMITKV__V1__GET_VIEW__INIT;
static Commitkv__V1__SaveSession g_save = COMMITKV__V1__SAVE_SESSION__INIT;
static Commitkv__V1__RestoreSession g_restore = COMMITKV__V1__RESTORE_SESSION__INIT;
static Commitkv__V1__CloseSession g_close = COMMITKV__V1__CLOSE_SESSION__INIT;
static Commitkv__V1__DropSession g_drop = COMMITKV__V1__DROP_SESSION__INIT;
static Commitkv__V1__StatsRequest g_stats = COMMITKV__V1__STATS_REQUEST__INIT;
static Commitkv__V1__ListSessions g_list = COMMITKV__V1__LIST_SESSIONS__INIT;
static Commitkv__V1__Heartbeat g_hb = COMMITKV__V1__HEARTBEAT__INIT;
static Commitkv__V1__StatusRequest g_status = COMMITKV__V1__STATUS_REQUEST__INIT;

static void fill_requests(void) {
  for (size_t i = 0; i < sizeof(k_bytes); i++) k_bytes[i] = (uint8_t)(i * 37 + 11);
  g_geom.n_layers = 32, g_geom.n_kv_heads = 8, g_geom.head_dim = 128;
  g_geom.dtype = COMMITKV__V1__DTYPE__DTYPE_BF16, g_geom.draft_block_tokens = 16, g_geom.commit_block_tokens = 64;
  g_hello.max_version = 3, g_hello.min_version = 1, g_hello.client_name = "worker-7";
  g_param[0].key = "window", g_param[0].value = 128.0;
  g_param[1].key = "tau", g_param[1].value = -0.5;
  g_open.session_id = "sess.1:a-b_c", g_open.geometry = &g_geom, g_open.policy = "kivi4";
  g_open.n_params = 2, g_open.params = g_params, g_open.resume = true;
  g_append.session_id = "s", g_append.count = 8;
  g_append.roles = (ProtobufCBinaryData){8, k_bytes};
  g_append.tags = (ProtobufCBinaryData){8, k_bytes + 8};
  g_append.semantic = (ProtobufCBinaryData){sizeof(k_f32), (uint8_t *)k_f32};
  g_append.token_ids = (ProtobufCBinaryData){sizeof(k_u32), (uint8_t *)k_u32};
  g_report.session_id = "s", g_report.round = 1ull << 40, g_report.first_position = 123456789012ull;
  g_report.attention = (ProtobufCBinaryData){sizeof(k_f32), (uint8_t *)k_f32};
  g_report.semantic_positions = (ProtobufCBinaryData){sizeof(k_u32), (uint8_t *)k_u32};
  g_report.semantic_scores = (ProtobufCBinaryData){sizeof(k_f32), (uint8_t *)k_f32};
  g_ack.session_id = "s", g_ack.epoch = UINT64_MAX;
  g_acquire.session_id = "acq";
  g_view.session_id = "view";
  g_save.session_id = "s", g_save.name = "snap-1";
  g_restore.session_id = "s", g_restore.name = "snap-1";
  g_close.session_id = "close";
  g_drop.session_id = "drop", g_drop.tenant = "tenant-x";
}

typedef struct req_case {
  const char *name;
  Commitkv__V1__Request__BodyCase kind;
  void *body;
} req_case;

static req_case k_req[] = {
    {"hello", COMMITKV__V1__REQUEST__BODY_HELLO, &g_hello},
    {"open_session", COMMITKV__V1__REQUEST__BODY_OPEN_SESSION, &g_open},
    {"append_tokens", COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS, &g_append},
    {"report_round", COMMITKV__V1__REQUEST__BODY_REPORT_ROUND, &g_report},
    {"ack_epoch", COMMITKV__V1__REQUEST__BODY_ACK_EPOCH, &g_ack},
    {"acquire", COMMITKV__V1__REQUEST__BODY_ACQUIRE, &g_acquire},
    {"get_view", COMMITKV__V1__REQUEST__BODY_GET_VIEW, &g_view},
    {"save_session", COMMITKV__V1__REQUEST__BODY_SAVE_SESSION, &g_save},
    {"restore_session", COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION, &g_restore},
    {"close_session", COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION, &g_close},
    {"drop_session", COMMITKV__V1__REQUEST__BODY_DROP_SESSION, &g_drop},
    {"stats", COMMITKV__V1__REQUEST__BODY_STATS, &g_stats},
    {"list_sessions", COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS, &g_list},
    {"heartbeat", COMMITKV__V1__REQUEST__BODY_HEARTBEAT, &g_hb},
    {"status", COMMITKV__V1__REQUEST__BODY_STATUS, &g_status},
};
#define N_REQ (sizeof(k_req) / sizeof(k_req[0]))

/* The oneof members are a union of pointers: any one of them sets the body. */
static void set_body(Commitkv__V1__Request *r, const req_case *c) {
  r->body_case = c->kind;
  r->hello = c->body;
}

static uint8_t *pack_request(const Commitkv__V1__Request *r, size_t *ret_len) {
  size_t len = commitkv__v1__request__get_packed_size(r);
  uint8_t *buf = malloc(len + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(commitkv__v1__request__pack(r, buf), len);
  *ret_len = len;
  return buf;
}

static ckv_wire_arena g_arena;

static void setup(void) {
  fill_requests();
  cr_assert_eq(ckv_wire_arena_init(&g_arena, ARENA_CAP), CKV_OK);
}

static void teardown(void) { ckv_wire_arena_done(&g_arena); }

TestSuite(proto, .init = setup, .fini = teardown);

Test(proto, every_request_type_round_trips) {
  cr_assert_eq(N_REQ, 15, "a Request body type was added: give it a case here");
  for (size_t i = 0; i < N_REQ; i++) {
    Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
    r.version = 1;
    r.request_id = 0xfedcba9876543210ull + i;
    set_body(&r, &k_req[i]);
    size_t len;
    uint8_t *buf = pack_request(&r, &len);
    Commitkv__V1__Request *got = NULL;
    int rc = ckv_wire_decode_request(&g_arena, buf, len, &got);
    cr_assert_eq(rc, CKV_OK, "%s: %s", k_req[i].name, ckv_strerror(rc));
    cr_assert_eq(got->body_case, k_req[i].kind, "%s: body case %d", k_req[i].name, got->body_case);
    cr_assert_eq(got->request_id, r.request_id);
    cr_assert_eq(got->version, 1u);
    size_t len2;
    uint8_t *buf2 = pack_request(got, &len2);
    cr_assert_eq(len2, len, "%s: %zu bytes repacked as %zu", k_req[i].name, len, len2);
    cr_assert_eq(memcmp(buf, buf2, len), 0, "%s: a field changed on the way", k_req[i].name);
    free(buf2);
    free(buf);
  }
}

/* Every prefix is judged as stock protobuf-c judges it; refusals are PROTO. */
Test(proto, every_request_prefix_is_judged_exactly) {
  for (size_t i = 0; i < N_REQ; i++) {
    Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
    r.version = 1;
    r.request_id = 77;
    set_body(&r, &k_req[i]);
    size_t len;
    uint8_t *buf = pack_request(&r, &len);
    size_t refused = 0;
    for (size_t cut = 0; cut < len; cut++) {
      /* A heap copy of exactly `cut` bytes, so a read past it is an ASan error. */
      uint8_t *part = malloc(cut ? cut : 1);
      cr_assert_not_null(part);
      memcpy(part, buf, cut);
      Commitkv__V1__Request *ref = commitkv__v1__request__unpack(NULL, cut, part);
      Commitkv__V1__Request *got = NULL;
      int rc = ckv_wire_decode_request(&g_arena, part, cut, &got);
      if (ref) {
        cr_assert_eq(rc, CKV_OK, "%s cut at %zu: protobuf-c accepts, the daemon refuses", k_req[i].name, cut);
        cr_assert_eq(got->body_case, ref->body_case);
        commitkv__v1__request__free_unpacked(ref, NULL);
      } else {
        cr_assert_eq(rc, CKV_ERR_PROTO, "%s cut at %zu: got %d", k_req[i].name, cut, rc);
        refused++;
      }
      free(part);
    }
    /* The body is the last field: cutting inside it must be refused. */
    if (len > 6) cr_assert_gt(refused, 0, "%s: no prefix refused", k_req[i].name);
    free(buf);
  }
}

Test(proto, decode_cap_refuses_and_recovers) {
  for (size_t i = 0; i < N_REQ; i++) {
    Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
    r.version = 1;
    set_body(&r, &k_req[i]);
    size_t len;
    uint8_t *buf = pack_request(&r, &len);
    /* Too small for even the Request struct plus its body. */
    ckv_wire_arena tiny;
    cr_assert_eq(ckv_wire_arena_init(&tiny, 64), CKV_OK);
    Commitkv__V1__Request *got = NULL;
    cr_assert_eq(ckv_wire_decode_request(&tiny, buf, len, &got), CKV_ERR_PROTO, "%s decoded in 64 bytes",
                 k_req[i].name);
    cr_assert_null(got, "out-parameter written on failure");
    ckv_wire_arena_done(&tiny);
    free(buf);
  }
  /* The shared arena is reset per decode: a thousand decodes never fill it. */
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  set_body(&r, &k_req[1]);
  size_t len;
  uint8_t *buf = pack_request(&r, &len);
  ckv_wire_arena small;
  cr_assert_eq(ckv_wire_arena_init(&small, 4096), CKV_OK);
  for (int n = 0; n < 1000; n++) {
    Commitkv__V1__Request *got = NULL;
    cr_assert_eq(ckv_wire_decode_request(&small, buf, len, &got), CKV_OK, "decode %d failed: arena not reset", n);
    cr_assert_str_eq(got->open_session->session_id, "sess.1:a-b_c");
    /* A failed decode in between leaves the arena usable. */
    cr_assert_eq(ckv_wire_decode_request(&small, "\xff\xff", 2, &got), CKV_ERR_PROTO);
  }
  ckv_wire_arena_done(&small);
  free(buf);
}

Test(proto, huge_repeated_counts_hit_the_cap) {
  /* OpenSession with 100000 empty map entries: 200 KB on the wire, several
   * MB once unpacked.  A 1 MiB cap refuses it. */
  size_t n = 100000, body = n * 2, at = 0;
  uint8_t *buf = malloc(body + 16);
  cr_assert_not_null(buf);
  buf[at++] = 0x5a; /* field 11, length-delimited */
  for (size_t v = body; ; v >>= 7) {
    buf[at++] = (uint8_t)(v >= 0x80 ? (v | 0x80) : v);
    if (v < 0x80) break;
  }
  for (size_t i = 0; i < n; i++) buf[at++] = 0x22, buf[at++] = 0x00;
  Commitkv__V1__Request *got = NULL;
  cr_assert_eq(ckv_wire_decode_request(&g_arena, buf, at, &got), CKV_ERR_PROTO);
  /* 10 entries are fine. */
  at = 0;
  buf[at++] = 0x5a;
  buf[at++] = 20;
  for (size_t i = 0; i < 10; i++) buf[at++] = 0x22, buf[at++] = 0x00;
  cr_assert_eq(ckv_wire_decode_request(&g_arena, buf, at, &got), CKV_OK);
  cr_assert_eq(got->open_session->n_params, 10u);
  free(buf);
}

Test(proto, unknown_fields_are_skipped) {
  for (size_t i = 0; i < N_REQ; i++) {
    Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
    r.version = 1;
    r.request_id = 5;
    set_body(&r, &k_req[i]);
    size_t len;
    uint8_t *buf = pack_request(&r, &len);
    /* Append field 99 (varint 300), field 100 (bytes "zz"), field 4000 (fixed32). */
    static const uint8_t extra[] = {0x98, 0x06, 0xac, 0x02, 0xa2, 0x06, 0x02, 'z', 'z', 0x85, 0xfa, 0x01, 1, 2, 3, 4};
    uint8_t *more = malloc(len + sizeof(extra));
    cr_assert_not_null(more);
    memcpy(more, buf, len);
    memcpy(more + len, extra, sizeof(extra));
    Commitkv__V1__Request *got = NULL;
    cr_assert_eq(ckv_wire_decode_request(&g_arena, more, len + sizeof(extra), &got), CKV_OK, "%s", k_req[i].name);
    cr_assert_eq(got->body_case, k_req[i].kind);
    cr_assert_eq(got->request_id, 5u);
    free(more);
    free(buf);
  }
}

/* An empty body of each type: strings are "" (never NULL) for the handlers. */
Test(proto, empty_bodies_give_empty_strings) {
  for (size_t i = 0; i < N_REQ; i++) {
    /* [field (10+i), length 0] */
    uint8_t buf[4] = {(uint8_t)(((10 + i) << 3) | 2), 0};
    size_t len = 2;
    if (10 + i >= 16) { /* two-byte tag */
      uint32_t tag = (uint32_t)(((10 + i) << 3) | 2);
      buf[0] = (uint8_t)(tag | 0x80), buf[1] = (uint8_t)(tag >> 7), buf[2] = 0;
      len = 3;
    }
    Commitkv__V1__Request *got = NULL;
    cr_assert_eq(ckv_wire_decode_request(&g_arena, buf, len, &got), CKV_OK, "%s", k_req[i].name);
    cr_assert_eq(got->body_case, k_req[i].kind, "%s: body case %d", k_req[i].name, got->body_case);
    cr_assert_not_null(got->hello, "%s: body pointer NULL", k_req[i].name);
    const char *sid = NULL;
    switch (got->body_case) {
      case COMMITKV__V1__REQUEST__BODY_OPEN_SESSION:
        sid = got->open_session->session_id;
        cr_assert_null(got->open_session->geometry); /* absent sub-message: the handler must check */
        cr_assert_not_null(got->open_session->policy);
        break;
      case COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS: sid = got->append_tokens->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_REPORT_ROUND: sid = got->report_round->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_ACK_EPOCH: sid = got->ack_epoch->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_ACQUIRE: sid = got->acquire->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_GET_VIEW: sid = got->get_view->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_SAVE_SESSION: sid = got->save_session->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION: sid = got->restore_session->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION: sid = got->close_session->session_id; break;
      case COMMITKV__V1__REQUEST__BODY_DROP_SESSION:
        sid = got->drop_session->session_id;
        cr_assert_not_null(got->drop_session->tenant);
        break;
      case COMMITKV__V1__REQUEST__BODY_HELLO: cr_assert_not_null(got->hello->client_name); break;
      default: break;
    }
    if (sid) {
      cr_assert_str_eq(sid, "", "%s", k_req[i].name);
      cr_assert_eq(ckv_wire_check_session_id(sid), CKV_ERR_INVALID);
    }
  }
  /* Zero bytes: a Request with nothing set. */
  Commitkv__V1__Request *got = NULL;
  cr_assert_eq(ckv_wire_decode_request(&g_arena, "", 0, &got), CKV_OK);
  cr_assert_eq(got->body_case, COMMITKV__V1__REQUEST__BODY__NOT_SET);
}

Test(proto, session_id_rules) {
  char max[129], over[130];
  memset(max, 'x', 128), max[128] = 0;
  memset(over, 'x', 129), over[129] = 0;
  const char *ok[] = {"a", "A.z-9_:", "sess.1:a-b_c", max, "0", "-", "..", ":"};
  const char *bad[] = {NULL, "", over, "a b", "a/b", "a\\b", "a\tb", "caf\xc3\xa9", "a\x7f", "a,b", "a@b", "*"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
    cr_assert_eq(ckv_wire_check_session_id(ok[i]), CKV_OK, "'%s' refused", ok[i]);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    cr_assert_eq(ckv_wire_check_session_id(bad[i]), CKV_ERR_INVALID, "bad id %zu accepted", i);
  ProtobufCBinaryData b = {12, k_bytes};
  cr_assert_eq(ckv_wire_column_len(&b, 4), 3);
  b.len = 13;
  cr_assert_eq(ckv_wire_column_len(&b, 4), -1);
  b.len = 0;
  cr_assert_eq(ckv_wire_column_len(&b, 4), 0);
}

/* ---- replies and the attach messages: what a client decodes ------------- */

/* pack -> unpack (stock allocator, as a client does) -> pack: identical bytes;
 * then every prefix must unpack or be refused without reading past it. */
#define ROUND_TRIP(type, lower, msgp)                                                                         \
  do {                                                                                                        \
    size_t len_ = commitkv__v1__##lower##__get_packed_size(msgp);                                           \
    uint8_t *a_ = malloc(len_ + 1), *b_ = malloc(len_ + 1);                                                   \
    cr_assert(a_ && b_);                                                                                      \
    commitkv__v1__##lower##__pack(msgp, a_);                                                                  \
    type *u_ = commitkv__v1__##lower##__unpack(NULL, len_, a_);                                               \
    cr_assert_not_null(u_, #lower ": does not decode");                                                        \
    cr_assert_eq(commitkv__v1__##lower##__get_packed_size(u_), len_);                                         \
    commitkv__v1__##lower##__pack(u_, b_);                                                                    \
    cr_assert_eq(memcmp(a_, b_, len_), 0, #lower ": a field changed on the way");                             \
    commitkv__v1__##lower##__free_unpacked(u_, NULL);                                                         \
    for (size_t cut_ = 0; cut_ < len_; cut_++) {                                                              \
      uint8_t *p_ = malloc(cut_ ? cut_ : 1);                                                                  \
      cr_assert_not_null(p_);                                                                                 \
      memcpy(p_, a_, cut_);                                                                                   \
      type *v_ = commitkv__v1__##lower##__unpack(NULL, cut_, p_);                                             \
      if (v_) commitkv__v1__##lower##__free_unpacked(v_, NULL);                                               \
      free(p_);                                                                                               \
    }                                                                                                         \
    free(a_);                                                                                                 \
    free(b_);                                                                                                 \
  } while (0)

Test(proto, every_reply_type_round_trips) {
  static uint8_t boot[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  Commitkv__V1__ArenaInfo ai = COMMITKV__V1__ARENA_INFO__INIT, *ais[1] = {&ai};
  ai.arena_id = 3, ai.kind = "host", ai.bytes = 1ull << 33, ai.fd_index = 0;
  ai.handle = (ProtobufCBinaryData){64, k_bytes}, ai.device_uuid = "GPU-x", ai.generation = 42;
  Commitkv__V1__Geometry geom = COMMITKV__V1__GEOMETRY__INIT;
  geom.n_layers = 2, geom.n_kv_heads = 2, geom.head_dim = 64, geom.commit_block_tokens = 64;

  Commitkv__V1__Welcome w = COMMITKV__V1__WELCOME__INIT;
  w.version = 1, w.tenant = "a", w.client_id = 9, w.lease_ms = 10000, w.heartbeat_ms = 2000;
  w.n_arenas = 1, w.arenas = ais, w.max_message_bytes = 16u << 20;
  Commitkv__V1__SessionOpened so = COMMITKV__V1__SESSION_OPENED__INIT;
  so.session_id = "s", so.geometry = &geom, so.resumed = true, so.epoch = 7, so.n_tokens = 100, so.policy = "h2o";
  Commitkv__V1__SlotRun sr = COMMITKV__V1__SLOT_RUN__INIT, *srs[2] = {&sr, &sr};
  sr.block_id = 1, sr.arena_id = 3, sr.block_offset = 4096, sr.capacity = 16, sr.first_slot = 2, sr.count = 14;
  sr.first_position = 1000;
  Commitkv__V1__TokensAppended ta = COMMITKV__V1__TOKENS_APPENDED__INIT;
  ta.first_position = 1000, ta.count = 28, ta.n_slots = 2, ta.slots = srs, ta.epoch = 8;
  Commitkv__V1__TransitionRange tr = COMMITKV__V1__TRANSITION_RANGE__INIT, *trs[1] = {&tr};
  tr.first_position = 5, tr.count = 64, tr.from = COMMITKV__V1__TOKEN_STATE__STATE_STAGED;
  tr.to = COMMITKV__V1__TOKEN_STATE__STATE_COMMITTED;
  Commitkv__V1__RoundReport rr = COMMITKV__V1__ROUND_REPORT__INIT;
  rr.round = 4, rr.n_transitions = 1, rr.transitions = trs, rr.epoch = 9, rr.pending = 2;
  Commitkv__V1__EpochAcked ea = COMMITKV__V1__EPOCH_ACKED__INIT;
  ea.epoch = 9, ea.reclaimed_bytes = 65536;
  Commitkv__V1__BlockRef br = COMMITKV__V1__BLOCK_REF__INIT, *brs[1] = {&br};
  br.block_id = 1, br.arena_id = 3, br.offset = 8192, br.bytes = 4096, br.format = COMMITKV__V1__BLOCK_FORMAT__FORMAT_COMMIT2;
  br.capacity = 64;
  Commitkv__V1__View v = COMMITKV__V1__VIEW__INIT;
  v.epoch = 9, v.n_draft = 1, v.draft = brs, v.n_staged = 1, v.staged = brs, v.n_committed = 1, v.committed = brs;
  v.n_tokens = 100;
  Commitkv__V1__SessionSaved ss = COMMITKV__V1__SESSION_SAVED__INIT;
  ss.name = "snap", ss.bytes = 12345;
  Commitkv__V1__TokenCounts tc = COMMITKV__V1__TOKEN_COUNTS__INIT;
  tc.draft = 1, tc.staged = 2, tc.committed = 3, tc.recycled = 4;
  Commitkv__V1__ByteCounts bc = COMMITKV__V1__BYTE_COUNTS__INIT;
  bc.draft = 1, bc.staged = 2, bc.committed = 3, bc.total = 6, bc.fp16_equivalent = 60;
  Commitkv__V1__ArenaStats as = COMMITKV__V1__ARENA_STATS__INIT, *ass[1] = {&as};
  as.kind = "host", as.bytes_total = 1 << 30, as.bytes_used = 1 << 20, as.tenant = "a", as.arena_id = 3;
  Commitkv__V1__TenantStats ts = COMMITKV__V1__TENANT_STATS__INIT, *tss[1] = {&ts};
  ts.name = "a", ts.sessions = 1, ts.clients = 2, ts.tokens = &tc, ts.bytes = &bc, ts.quota_bytes = 1 << 30;
  Commitkv__V1__Stats st = COMMITKV__V1__STATS__INIT;
  st.sessions = 1, st.clients = 2, st.tokens = &tc, st.bytes = &bc, st.n_arenas = 1, st.arenas = ass;
  st.n_tenants = 1, st.tenants = tss, st.requests = 100, st.errors = 3, st.rounds = 7, st.uptime_ms = 5000;
  st.backend = "host", st.detached_sessions = 1, st.leases_expired = 1;
  st.sessions_detached = 4, st.sessions_resumed = 1, st.sessions_expired = 2;
  Commitkv__V1__SessionInfo si = COMMITKV__V1__SESSION_INFO__INIT, *sis[1] = {&si};
  si.session_id = "s", si.tenant = "a", si.policy = "commitkv", si.attached = true, si.epoch = 3, si.rounds = 2;
  si.tokens = &tc, si.bytes = &bc, si.geometry = &geom;
  Commitkv__V1__SessionList sl = COMMITKV__V1__SESSION_LIST__INIT;
  sl.n_sessions = 1, sl.sessions = sis;
  Commitkv__V1__HeartbeatAck ha = COMMITKV__V1__HEARTBEAT_ACK__INIT;
  ha.server_time_ms = 123, ha.lease_ms = 10000;
  Commitkv__V1__DaemonStatus ds = COMMITKV__V1__DAEMON_STATUS__INIT;
  ds.version = "0.1", ds.backend = "host", ds.pid = 42, ds.uptime_ms = 1, ds.socket = "ipc:///x";
  ds.attach_socket = "/x", ds.backend_reason = "no GPU", ds.protocol_version = 1;

  struct {
    Commitkv__V1__Response__BodyCase kind;
    void *body;
  } bodies[] = {
      {COMMITKV__V1__RESPONSE__BODY_WELCOME, &w},         {COMMITKV__V1__RESPONSE__BODY_SESSION_OPENED, &so},
      {COMMITKV__V1__RESPONSE__BODY_TOKENS_APPENDED, &ta}, {COMMITKV__V1__RESPONSE__BODY_ROUND_REPORT, &rr},
      {COMMITKV__V1__RESPONSE__BODY_EPOCH_ACKED, &ea},    {COMMITKV__V1__RESPONSE__BODY_VIEW, &v},
      {COMMITKV__V1__RESPONSE__BODY_SESSION_SAVED, &ss},  {COMMITKV__V1__RESPONSE__BODY_STATS, &st},
      {COMMITKV__V1__RESPONSE__BODY_SESSION_LIST, &sl},   {COMMITKV__V1__RESPONSE__BODY_HEARTBEAT_ACK, &ha},
      {COMMITKV__V1__RESPONSE__BODY_STATUS, &ds},
  };
  cr_assert_eq(sizeof(bodies) / sizeof(bodies[0]), 11, "a Response body type was added: give it a case here");
  for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
    Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
    rep.request_id = 1000 + i;
    rep.boot_token = (ProtobufCBinaryData){16, boot};
    rep.body_case = bodies[i].kind;
    rep.welcome = bodies[i].body;
    ROUND_TRIP(Commitkv__V1__Response, response, &rep);
  }
  /* An error reply: code (zigzag sint32), message, no body. */
  Commitkv__V1__Response err = COMMITKV__V1__RESPONSE__INIT;
  err.code = CKV_ERR_NOT_FOUND;
  err.message = "no session 'x'";
  err.boot_token = (ProtobufCBinaryData){16, boot};
  ROUND_TRIP(Commitkv__V1__Response, response, &err);
  size_t len = commitkv__v1__response__get_packed_size(&err);
  uint8_t buf[128];
  commitkv__v1__response__pack(&err, buf);
  Commitkv__V1__Response *u = commitkv__v1__response__unpack(NULL, len, buf);
  cr_assert_not_null(u);
  cr_assert_eq(u->code, CKV_ERR_NOT_FOUND);
  cr_assert_eq(u->body_case, COMMITKV__V1__RESPONSE__BODY__NOT_SET);
  commitkv__v1__response__free_unpacked(u, NULL);

  /* The attach socket's two messages. */
  Commitkv__V1__AttachRequest aq = COMMITKV__V1__ATTACH_REQUEST__INIT;
  aq.version = 1, aq.client_name = "w", aq.want_arenas = true;
  ROUND_TRIP(Commitkv__V1__AttachRequest, attach_request, &aq);
  Commitkv__V1__AttachReply ar = COMMITKV__V1__ATTACH_REPLY__INIT;
  ar.code = CKV_ERR_AUTH, ar.message = "m", ar.attach_key = (ProtobufCBinaryData){16, boot};
  ar.tenant = "a", ar.n_arenas = 1, ar.arenas = ais, ar.boot_token = (ProtobufCBinaryData){16, boot};
  ar.version = 1, ar.admin = true;
  ROUND_TRIP(Commitkv__V1__AttachReply, attach_reply, &ar);
}

/* Random bytes never crash either side's decoder (run under ASan in CI). */
Test(proto, random_bytes_never_crash_a_decoder) {
  uint64_t x = 0x2545F4914F6CDD1Dull;
  uint8_t buf[512];
  for (int n = 0; n < 20000; n++) {
    size_t len = (size_t)(x % sizeof(buf));
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      buf[i] = (uint8_t)(x >> 32);
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    Commitkv__V1__Request *q = NULL;
    int rc = ckv_wire_decode_request(&g_arena, buf, len, &q);
    cr_assert(rc == CKV_OK || rc == CKV_ERR_PROTO);
    Commitkv__V1__Response *r = commitkv__v1__response__unpack(NULL, len, buf);
    if (r) commitkv__v1__response__free_unpacked(r, NULL);
    Commitkv__V1__AttachReply *a = commitkv__v1__attach_reply__unpack(NULL, len, buf);
    if (a) commitkv__v1__attach_reply__free_unpacked(a, NULL);
  }
}
