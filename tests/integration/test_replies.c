/* test_replies.c - what the daemon answers a hostile local client (issue 11,
 * items 7 and 10): replies a standard client can parse, and small errors
 * that say exactly what was wrong.
 *
 * - Every string in every reply is valid UTF-8 (proto3 `string`; Python's
 *   protobuf refuses the whole reply otherwise), whatever bytes the request
 *   carried and wherever a text is cut.
 * - NaN, infinite or negative attention (and semantic scores outside [0,1])
 *   are refused with CKV_ERR_INVALID naming the index; nothing of the round
 *   is applied.
 * - Positions near 2^64 are refused with a text that does not wrap around.
 * - A request over max_message is answered CKV_ERR_TOO_LARGE (naming the
 *   limit) and dropped; the connection keeps working.
 *
 * Each test starts a real commitkvd and talks to it with the raw client of
 * tests/support/rawclient.c (attach by hand, a DEALER with the attach key as
 * routing id, Requests packed with protobuf-c), whose every reply this suite
 * also checks for UTF-8, or with libcommitkv, and ends with a SIGTERM that
 * must exit 0. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "daemon/utf8.h"
#define RAW_CLIENT_NAME "replies"
#include "rawcheck.h"
#include "testcheck.h"

static void start(ckv_test_daemon *d, const char *const *more) { ckv_test_start_host(d, "256M", more); }

/* ---- valid UTF-8, checked in every string of a decoded message --------- */

/* The first string field of `m` (or below it) that is not valid UTF-8, or
 * NULL.  *ret_name gets the field's name. */
static const char *bad_string(const ProtobufCMessage *m, const char **ret_name) {
  if (!m) return NULL;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(const uint32_t *)(base + f->quantifier_offset) != f->id)
      continue;
    size_t n = f->label == PROTOBUF_C_LABEL_REPEATED ? *(const size_t *)(base + f->quantifier_offset) : 1;
    void *const *v = f->label == PROTOBUF_C_LABEL_REPEATED ? *(void *const *const *)(base + f->offset)
                                                           : (void *const *)(base + f->offset);
    for (size_t k = 0; k < n; k++) {
      if (f->type == PROTOBUF_C_TYPE_STRING) {
        const char *s = v[k];
        if (s && !ckv_utf8_valid(s, strlen(s))) {
          *ret_name = f->name;
          return s;
        }
      } else {
        const char *s = bad_string(v[k], ret_name);
        if (s) return s;
      }
    }
  }
  return NULL;
}

/* "\xHH" for bytes outside printable ASCII, for failure texts. */
static const char *escaped(const char *s) {
  static char out[1024];
  size_t o = 0;
  for (; *s && o + 5 < sizeof(out); s++) {
    unsigned char c = (unsigned char)*s;
    o += (size_t)(c >= 0x20 && c < 0x7f ? snprintf(out + o, sizeof(out) - o, "%c", c)
                                        : snprintf(out + o, sizeof(out) - o, "\\x%02x", c));
  }
  out[o] = 0;
  return out;
}

/* ---- every reply of the raw client checked for UTF-8 --------------------- */

/* Replies with a string that is not valid UTF-8: how many, and the first
 * (field and escaped text).  A bad AttachReply fails the test at once. */
static struct {
  size_t n;
  char first[1100];
} bad_replies;

static void check_utf8(const raw *r, const ProtobufCMessage *m, void *ctx) {
  const char *field = "", *bad = bad_string(m, &field);
  if (m->descriptor == &commitkv__v1__attach_reply__descriptor) {
    cr_assert_null(bad, "AttachReply.%s is not UTF-8: %s", field, bad ? escaped(bad) : "");
    return;
  }
  cr_assert_eq(r->frames, 1, "a reply of more than one frame");
  if (bad && bad_replies.n++ == 0)
    snprintf(bad_replies.first, sizeof(bad_replies.first), "%s = \"%s\"", field, escaped(bad));
}

/* Attach as `name`, every reply checked by check_utf8. */
static void raw_connect_checked(raw *r, const ckv_test_daemon *d, const char *name) {
  raw_connect_inspected(r, d, name, check_utf8, NULL);
}

/* A deterministic generator, so a failure can be replayed. */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)((rng >> 16) % n);
}

/* ---- 7: replies a standard client can parse ------------------------------ */

/* Strings that are not UTF-8, or become invalid when cut: the text of `i`
 * in buf (NUL-terminated, < 512 bytes). */
static const char *hostile_string(int i, char *buf) {
  static const char *fixed[] = {
      "\xff",
      "\xc3",                  /* a lone lead byte */
      "a\xe2\x82",             /* a cut euro sign */
      "\xed\xa0\x80",          /* a surrogate */
      "\xc0\xaf",              /* an overlong '/' */
      "\xf4\x90\x80\x80",      /* above U+10FFFF */
      "ok-1",                  /* a valid id, so later fields are reached */
      "",
  };
  const size_t n_fixed = sizeof(fixed) / sizeof(fixed[0]);
  buf[0] = 0;
  if ((size_t)i < n_fixed) return strcpy(buf, fixed[i]);
  switch (i - (int)n_fixed) {
  case 0: /* 200 x "é": a 64-byte cut falls between characters, a 128-byte check fails */
    for (int k = 0; k < 200; k++) strcat(buf, "\xc3\xa9");
    return buf;
  case 1: /* 100 x "€": a 64-byte cut splits the 22nd sign */
    for (int k = 0; k < 100; k++) strcat(buf, "\xe2\x82\xac");
    return buf;
  case 2: /* 63 x 'a' then "é": the 64th byte is a lead byte */
    memset(buf, 'a', 63);
    strcpy(buf + 63, "\xc3\xa9");
    return buf;
  default: { /* random bytes (no NUL), 1..300 of them */
    size_t len = 1 + rnd(300);
    for (size_t k = 0; k < len; k++) buf[k] = (char)(1 + rnd(255));
    buf[len] = 0;
    return buf;
  }
  }
}
#define N_HOSTILE 12 /* 8 fixed, 3 built, then random */

Test(replies, every_reply_text_is_valid_utf8, .timeout = 120) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  /* A client name that is not UTF-8 (it goes to logs and the attach reply). */
  raw_connect_checked(&r, &d, "w\xff\xc3");
  expect_code(rq_open(&r, "ok-1"), CKV_OK);
  expect_code(rq_append(&r, "ok-1", 8), CKV_OK);
  /* The texts that echo a client's string, one by one. */
  char a[512], b[512];
  for (int i = 0; i < N_HOSTILE + 2; i++) {
    hostile_string(i, a);
    int code = rq_open_policy(&r, "pol", a, NULL);
    cr_assert(code == CKV_ERR_INVALID || (code == CKV_OK && !*a), "policy #%d: %d (%s)", i, code, r.msg);
    if (code == CKV_OK) expect_code(rq_drop(&r, "pol", NULL), CKV_OK);
    if (*a) {
      expect_code(rq_open_policy(&r, "pol", NULL, a), CKV_ERR_INVALID);
      int open_code = rq_open(&r, a);
      cr_assert_neq(open_code, NO_REPLY);
    }
  }
  cr_assert_eq(bad_replies.n, 0, "%zu replies carry text that is not UTF-8; the first: %s", bad_replies.n,
               bad_replies.first);
  /* Every request type, every string field hostile, 1500 times. */
  for (int round = 0; round < 1500; round++) {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__Hello h = COMMITKV__V1__HELLO__INIT;
    Commitkv__V1__OpenSession o = COMMITKV__V1__OPEN_SESSION__INIT;
    Commitkv__V1__Geometry gm = COMMITKV__V1__GEOMETRY__INIT;
    Commitkv__V1__OpenSession__ParamsEntry e = COMMITKV__V1__OPEN_SESSION__PARAMS_ENTRY__INIT, *ep = &e;
    Commitkv__V1__AppendTokens ap = COMMITKV__V1__APPEND_TOKENS__INIT;
    Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
    Commitkv__V1__GetView gv = COMMITKV__V1__GET_VIEW__INIT;
    Commitkv__V1__SaveSession sv = COMMITKV__V1__SAVE_SESSION__INIT;
    Commitkv__V1__RestoreSession rs = COMMITKV__V1__RESTORE_SESSION__INIT;
    Commitkv__V1__DropSession dr = COMMITKV__V1__DROP_SESSION__INIT;
    Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
    Commitkv__V1__StatusRequest st = COMMITKV__V1__STATUS_REQUEST__INIT;
    hostile_string((int)rnd(N_HOSTILE + 6), a);
    hostile_string((int)rnd(N_HOSTILE + 6), b);
    gm.n_layers = 2, gm.n_kv_heads = 2, gm.head_dim = 64;
    switch (rnd(9)) {
    case 0:
      h.client_name = a;
      q.body_case = COMMITKV__V1__REQUEST__BODY_HELLO, q.hello = &h;
      break;
    case 1:
      o.session_id = a, o.policy = b, o.geometry = &gm, o.resume = rnd(2);
      q.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION, q.open_session = &o;
      break;
    case 2:
      o.session_id = "ok-1", o.policy = a, o.geometry = &gm;
      e.key = b, e.value = 1.0, o.n_params = 1, o.params = &ep;
      q.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION, q.open_session = &o;
      break;
    case 3:
      ap.session_id = a, ap.count = 1;
      q.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS, q.append_tokens = &ap;
      break;
    case 4:
      rr.session_id = a, rr.round = 1000000 + (uint64_t)round;
      q.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND, q.report_round = &rr;
      break;
    case 5:
      gv.session_id = a;
      q.body_case = COMMITKV__V1__REQUEST__BODY_GET_VIEW, q.get_view = &gv;
      break;
    case 6:
      sv.session_id = a, sv.name = b;
      rs.session_id = b, rs.name = a;
      if (rnd(2))
        q.body_case = COMMITKV__V1__REQUEST__BODY_SAVE_SESSION, q.save_session = &sv;
      else
        q.body_case = COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION, q.restore_session = &rs;
      break;
    case 7:
      dr.session_id = strcmp(a, "ok-1") ? a : "x", dr.tenant = b; /* never drops ok-1 */
      q.body_case = COMMITKV__V1__REQUEST__BODY_DROP_SESSION, q.drop_session = &dr;
      break;
    default:
      if (rnd(2))
        q.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS, q.list_sessions = &ls;
      else
        q.body_case = COMMITKV__V1__REQUEST__BODY_STATUS, q.status = &st;
      break;
    }
    cr_assert_neq(raw_call(&r, &q, NULL), NO_REPLY, "round %d: no reply", round);
  }
  cr_assert_eq(bad_replies.n, 0, "%zu of 1500 replies carry text that is not UTF-8; the first: %s",
               bad_replies.n, bad_replies.first);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

/* ---- 10: small unclear errors -------------------------------------------- */

Test(replies, nonfinite_or_negative_values_are_refused_by_index, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect_checked(&r, &d, RAW_CLIENT_NAME);
  expect_code(rq_open(&r, "att"), CKV_OK);
  expect_code(rq_append(&r, "att", 48), CKV_OK);
  float attn[48];
  for (int i = 0; i < 48; i++) attn[i] = 1.0f / 48;
  const struct {
    float v;
    const char *text;
  } bad[] = {{NAN, "attention[17] is NaN"},
             {INFINITY, "attention[17] is inf"},
             {-INFINITY, "attention[17] is -inf"},
             {-0.5f, "attention[17] is negative (-0.5)"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    attn[17] = bad[i].v;
    expect_code(rq_report_attn(&r, "att", 1, 0, attn, 48, NULL, NULL, 0), CKV_ERR_INVALID);
    expect_text(bad[i].text);
  }
  attn[17] = 1.0f / 48;
  /* Semantic scores in a report and in an append: named the same way. */
  uint32_t pos[3] = {0, 1, 2};
  float scores[3] = {0.5f, NAN, 0.5f};
  expect_code(rq_report_attn(&r, "att", 1, 0, attn, 48, pos, scores, 3), CKV_ERR_INVALID);
  expect_text("semantic_scores[1] is NaN");
  scores[1] = 1.5f;
  expect_code(rq_report_attn(&r, "att", 1, 0, attn, 48, pos, scores, 3), CKV_ERR_INVALID);
  expect_text("semantic_scores[1] is 1.5, above 1");
  float sem[4] = {0.5f, 0.5f, INFINITY, 0.5f};
  expect_code(rq_append_ex(&r, "att", 4, (cols){.sem = sem, .sem_len = sizeof(sem)}, NULL), CKV_ERR_INVALID);
  expect_text("semantic[2] is inf");
  /* Nothing of those rounds was applied: none counted, round 1 still next. */
  cr_assert_eq(rq_rounds(&r), 0, "a refused round was applied");
  scores[1] = 0.25f;
  expect_code(rq_report_attn(&r, "att", 1, 0, attn, 48, pos, scores, 3), CKV_OK);
  cr_assert_eq(rq_rounds(&r), 1);
  /* -0.0 is zero mass, not a negative value. */
  attn[3] = -0.0f;
  expect_code(rq_report_attn(&r, "att", 2, 0, attn, 48, NULL, NULL, 0), CKV_OK);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(replies, overflowing_positions_are_named_without_wraparound, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect_checked(&r, &d, RAW_CLIENT_NAME);
  expect_code(rq_open(&r, "pos"), CKV_OK);
  expect_code(rq_append(&r, "pos", 48), CKV_OK);
  const float attn[10] = {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
  expect_code(rq_report_attn(&r, "pos", 1, UINT64_MAX, attn, 4, NULL, NULL, 0), CKV_ERR_RANGE);
  expect_text("first_position 18446744073709551615 + 4 tokens overflows");
  expect_code(rq_report_attn(&r, "pos", 1, UINT64_MAX - 2, attn, 4, NULL, NULL, 0), CKV_ERR_RANGE);
  expect_text("first_position 18446744073709551613 + 4 tokens overflows");
  expect_code(rq_report_attn(&r, "pos", 1, UINT64_MAX, attn, 0, NULL, NULL, 0), CKV_ERR_RANGE);
  expect_text("positions 18446744073709551615.. are beyond the session's 48 tokens");
  expect_code(rq_report_attn(&r, "pos", 1, UINT64_MAX - 4, attn, 4, NULL, NULL, 0), CKV_ERR_RANGE);
  expect_text("positions 18446744073709551611.. are beyond the session's 48 tokens");
  expect_code(rq_report_attn(&r, "pos", 1, 40, attn, 10, NULL, NULL, 0), CKV_ERR_RANGE);
  expect_text("attention covers positions 40..49 but the session has 48 tokens");
  uint32_t sp = UINT32_MAX;
  float ss = 0.5f;
  expect_code(rq_report_attn(&r, "pos", 1, 0, attn, 10, &sp, &ss, 1), CKV_ERR_RANGE);
  expect_text("semantic_positions[0] = 4294967295 is beyond the session's 48 tokens");
  /* The edge itself is fine: the last 10 tokens. */
  expect_code(rq_report_attn(&r, "pos", 1, 38, attn, 10, NULL, NULL, 0), CKV_OK);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(replies, oversized_request_is_answered_too_large, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, (const char *const[]){"--set", "daemon.max_message=64K", NULL});
  raw r;
  raw_connect_checked(&r, &d, RAW_CLIENT_NAME);
  expect_code(rq_open(&r, "big"), CKV_OK);
  /* A well-formed AppendTokens of 80 KB: over the limit, answered with the
   * limit's size and this request's id, not decoded. */
  static uint32_t ids[20000];
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
  a.session_id = "big";
  a.count = 20000;
  a.token_ids = (ProtobufCBinaryData){sizeof(ids), (uint8_t *)ids};
  q.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  q.append_tokens = &a;
  expect_code(raw_call(&r, &q, NULL), CKV_ERR_TOO_LARGE);
  expect_text("over max_message (65536 bytes)");
  /* The connection lives on, and nothing was appended. */
  expect_code(rq_heartbeat(&r), CKV_OK);
  expect_code(rq_append(&r, "big", 4), CKV_OK);
  /* Garbage of 150 KB (below the transport's hard cap): the same answer. */
  size_t big = 150u << 10;
  uint8_t *buf = malloc(big);
  cr_assert_not_null(buf);
  for (size_t i = 0; i < big; i++) buf[i] = (uint8_t)rnd(256);
  raw_send1(&r, buf, big);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_TOO_LARGE);
  expect_code(rq_heartbeat(&r), CKV_OK);
  free(buf);
  /* Above the hard cap (2 x max_message + 64K), ZeroMQ closes the connection
   * before the daemon sees the frame (documented in commitkv.proto). */
  big = 1u << 20;
  buf = calloc(1, big);
  cr_assert_not_null(buf);
  raw_send1(&r, buf, big);
  expect_code(raw_recv(&r, 1500, NULL), NO_REPLY);
  free(buf);
  raw_done(&r);
  /* libcommitkv gets the code and the daemon's text, and goes on. */
  ckv_client_options o = {.socket = d.socket, .attach_socket = d.attach, .name = "too-large"};
  ckv_client *c = NULL;
  cr_assert_eq(ckv_client_connect(&o, &c), CKV_OK);
  ckv_geometry g = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64};
  ckv_session *s = NULL;
  cr_assert_eq(ckv_session_open(c, "lib-big", &g, NULL, &s), CKV_OK);
  int rc = ckv_session_append(s, 20000, NULL, NULL, NULL, ids, NULL);
  cr_assert_eq(rc, CKV_ERR_TOO_LARGE, "got %s (%s)", ckv_status_name(rc), ckv_client_last_error(c));
  cr_assert_not_null(strstr(ckv_client_last_error(c), "65536"), "%s", ckv_client_last_error(c));
  uint64_t first = 99;
  cr_assert_eq(ckv_session_append(s, 4, NULL, NULL, NULL, NULL, &first), CKV_OK);
  cr_assert_eq(first, 0);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}
