/* test_bad_input.c - invariant 4 (DESIGN.md §4): bad input never crashes or
 * corrupts the daemon; every message is answered with the matching error code
 * and the daemon keeps serving everyone else.
 *
 * Each test starts a real commitkvd in its own temporary directory and talks
 * to it over the real sockets: well-formed but wrong requests go through the
 * "raw" client of tests/support/rawclient.c (attach handshake by hand, a
 * DEALER whose routing id is the attach key, Requests packed with the
 * generated protobuf-c code; rawcheck.h checks every reply), and
 * malformed traffic is written byte by byte.  After each abuse a fresh client
 * of the real library (libcommitkv) connects, opens a session, appends tokens
 * and writes K/V: the daemon is not only alive but serving.  Every test ends
 * with a SIGTERM that must exit 0, so a daemon that crashed or wedged fails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "shm/fdpass.h"
#define RAW_CLIENT_NAME "bad-input"
#include "rawcheck.h"
#include "testcheck.h"
#include "testutil.h"

/* ---- the daemon -------------------------------------------------------- */

static void start(ckv_test_daemon *d, const char *const *more) { ckv_test_start_host(d, "256M", more); }

/* The daemon is alive and serves a brand-new client of the real library:
 * attach with arenas, Hello, open a session, append, write K/V, drop. */
static void assert_serving(const ckv_test_daemon *d) {
  static int seq;
  cr_assert(ckv_test_daemon_alive(d), "commitkvd died");
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "witness"};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "a fresh client cannot connect: %s", ckv_strerror(r));
  char id[64];
  snprintf(id, sizeof(id), "witness-%d-%d", (int)getpid(), seq++);
  ckv_geometry g = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .dtype = 0};
  ckv_session *s = NULL;
  r = ckv_session_open(c, id, &g, NULL, &s);
  cr_assert_eq(r, CKV_OK, "a fresh client cannot open a session: %s (%s)", ckv_strerror(r),
               ckv_client_last_error(c));
  uint64_t first = 99;
  r = ckv_session_append(s, 20, NULL, NULL, NULL, NULL, &first);
  cr_assert_eq(r, CKV_OK, "a fresh client cannot append: %s", ckv_strerror(r));
  cr_assert_eq(first, 0);
  uint16_t k[2 * 64], v[2 * 64];
  for (size_t i = 0; i < 2 * 64; i++) k[i] = (uint16_t)i, v[i] = (uint16_t)(i ^ 0x5555);
  cr_assert_eq(ckv_session_write_kv(s, 19, 1, k, v), CKV_OK);
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  ckv_client_free(c);
}

/* A deterministic byte generator (xorshift), so a failure can be replayed. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint8_t rng_byte(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint8_t)(rng_state >> 24);
}

/* ---- malformed control-socket traffic ------------------------------------ */

/* A Heartbeat Request (version 1, request_id 0) packed into buf (64 bytes). */
static size_t packed_heartbeat(uint8_t *buf) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Heartbeat h = COMMITKV__V1__HEARTBEAT__INIT;
  q.version = 1;
  q.body_case = COMMITKV__V1__REQUEST__BODY_HEARTBEAT;
  q.heartbeat = &h;
  return commitkv__v1__request__pack(&q, buf);
}

Test(bad_input, garbage_frames_answer_proto, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  expect_code(rq_hello(&r, 1, 1), CKV_OK);
  /* 50 random payloads of 1..300 bytes that are not a Request (checked
   * here first with protobuf-c itself, so the expectation is exact). */
  int sent = 0;
  for (int i = 0; sent < 50 && i < 1000; i++) {
    uint8_t buf[300];
    size_t len = 1 + rng_byte() % sizeof(buf);
    for (size_t j = 0; j < len; j++) buf[j] = rng_byte();
    Commitkv__V1__Request *ok = commitkv__v1__request__unpack(NULL, len, buf);
    if (ok) {
      commitkv__v1__request__free_unpacked(ok, NULL);
      continue;
    }
    raw_send1(&r, buf, len);
    expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
    sent++;
  }
  cr_assert_eq(sent, 50);
  /* Classic poison: a varint that never ends, a length beyond the buffer, wire type 7. */
  static const uint8_t endless[] = {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  static const uint8_t overlong[] = {0x5a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x01, 'x'};
  static const uint8_t wiretype7[] = {0x0f, 0x01};
  raw_send1(&r, endless, sizeof(endless));
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  raw_send1(&r, overlong, sizeof(overlong));
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  raw_send1(&r, wiretype7, sizeof(wiretype7));
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  /* The same connection lives on. */
  expect_code(rq_heartbeat(&r), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, bad_framing_answer_proto, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  uint8_t hb[64];
  size_t hb_len = packed_heartbeat(hb);
  /* Three frames, then five: never a Request. */
  raw_send(&r, (const void *const[]){hb, hb, hb}, (const size_t[]){hb_len, hb_len, hb_len}, 3);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  raw_send(&r, (const void *const[]){"", "", hb, hb, hb}, (const size_t[]){0, 0, hb_len, hb_len, hb_len}, 5);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  /* Two frames whose first is not the empty delimiter. */
  raw_send(&r, (const void *const[]){"x", hb}, (const size_t[]){1, hb_len}, 2);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  /* The documented REQ framing, [empty][payload], is accepted. */
  raw_send(&r, (const void *const[]){"", hb}, (const size_t[]){0, hb_len}, 2);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_OK);
  expect_code(rq_heartbeat(&r), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, unknown_routing_id_answers_auth, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  uint8_t hb[64];
  size_t hb_len = packed_heartbeat(hb);

  /* A 16-byte id that was never handed out. */
  raw r;
  raw_init(&r);
  uint8_t fake[16];
  for (size_t i = 0; i < sizeof(fake); i++) fake[i] = rng_byte();
  fake[0] |= 1;
  raw_dealer(&r, d.socket, fake, sizeof(fake));
  raw_send1(&r, hb, hb_len);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_AUTH);
  /* Garbage from an unknown peer is refused as AUTH too: nothing is decoded
   * for someone who has not attached. */
  raw_send1(&r, "\xff\xff\xff", 3);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_AUTH);
  raw_done(&r);

  /* ZeroMQ's own generated routing id (5 bytes). */
  raw_init(&r);
  raw_dealer(&r, d.socket, NULL, 0);
  raw_send1(&r, hb, hb_len);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_AUTH);
  raw_done(&r);

  /* A key that was valid, after its client detached: the lease is gone. */
  raw a;
  raw_connect(&a, &d);
  expect_code(rq_heartbeat(&a), CKV_OK);
  uint8_t old[16];
  memcpy(old, a.key, sizeof(old));
  close(a.attach_fd); /* the daemon sees EOF and drops the client at once */
  a.attach_fd = -1;
  raw_done(&a);
  usleep(300 * 1000);
  raw_init(&r);
  raw_dealer(&r, d.socket, old, sizeof(old));
  raw_send1(&r, hb, hb_len);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_AUTH);
  raw_done(&r);

  assert_serving(&d);
  ckv_test_stop_clean(&d);
}

Test(bad_input, truncated_protobuf_answers_proto, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  expect_code(rq_open(&r, "trunc"), CKV_OK);
  /* A valid AppendTokens with 100 semantic scores, cut at every length that
   * protobuf-c itself refuses (most cuts fall inside a length-delimited field). */
  float sem[100];
  for (int i = 0; i < 100; i++) sem[i] = 0.5f;
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
  a.session_id = "trunc";
  a.count = 100;
  a.semantic = (ProtobufCBinaryData){sizeof(sem), (uint8_t *)sem};
  q.version = 1;
  q.request_id = 7;
  q.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  q.append_tokens = &a;
  uint8_t buf[1024];
  size_t len = commitkv__v1__request__get_packed_size(&q);
  cr_assert_leq(len, sizeof(buf));
  commitkv__v1__request__pack(&q, buf);
  size_t half = len / 2;
  Commitkv__V1__Request *check = commitkv__v1__request__unpack(NULL, half, buf);
  cr_assert_null(check, "the half message must be undecodable for this test to mean anything");
  raw_send1(&r, buf, half);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  int refused = 0;
  for (size_t cut = 1; cut < len; cut += 7) {
    check = commitkv__v1__request__unpack(NULL, cut, buf);
    if (check) {
      commitkv__v1__request__free_unpacked(check, NULL);
      continue;
    }
    raw_send1(&r, buf, cut);
    expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
    refused++;
  }
  cr_assert_gt(refused, 40);
  /* None of the cut requests appended anything. */
  uint64_t n_tokens = 99;
  expect_code(rq_view(&r, "trunc", &n_tokens, NULL), CKV_OK);
  cr_assert_eq(n_tokens, 0, "a truncated request changed the session (%llu tokens)", (unsigned long long)n_tokens);
  /* The whole message is fine. */
  raw_send1(&r, buf, len);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, oversized_message_drops_only_that_connection, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, (const char *const[]){"--set", "daemon.max_message=64K", NULL});
  raw r;
  raw_connect(&r, &d);
  expect_code(rq_open(&r, "big"), CKV_OK);
  /* Just under the limit: served (a 60 KB token_ids column is a fine request). */
  {
    static uint32_t ids[15000];
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
    a.session_id = "big";
    a.count = 15000;
    a.token_ids = (ProtobufCBinaryData){sizeof(ids), (uint8_t *)ids};
    q.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
    q.append_tokens = &a;
    cr_assert_lt(commitkv__v1__request__get_packed_size(&q), 64u * 1024u);
    expect_code(raw_call(&r, &q, NULL), CKV_OK);
  }
  /* 1 MiB: ZeroMQ (ZMQ_MAXMSGSIZE) drops the connection; no reply comes. */
  size_t big = 1u << 20;
  uint8_t *buf = malloc(big);
  cr_assert_not_null(buf);
  for (size_t i = 0; i < big; i++) buf[i] = rng_byte();
  raw_send1(&r, buf, big);
  int code = raw_recv(&r, 1500, NULL);
  cr_assert_eq(code, NO_REPLY, "a 1 MiB message above max_message=64K was decoded and answered (%d %s)", code,
               ckv_status_name(code));
  free(buf);
  raw_done(&r);
  /* Several times over, to be sure nothing accumulates. */
  for (int i = 0; i < 3; i++) {
    raw_connect(&r, &d);
    uint8_t *b2 = calloc(1, 256u << 10);
    cr_assert_not_null(b2);
    raw_send1(&r, b2, 256u << 10);
    free(b2);
    cr_assert_eq(raw_recv(&r, 500, NULL), NO_REPLY);
    raw_done(&r);
  }
  assert_serving(&d);
  ckv_test_stop_clean(&d);
}

/* Appends a varint to buf at *at. */
static void put_varint(uint8_t *buf, size_t *at, uint64_t v) {
  while (v >= 0x80) {
    buf[(*at)++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  buf[(*at)++] = (uint8_t)v;
}

/* Builds Request{version=1, open_session = {session_id="amp", <filler>}} where
 * the filler is `n` copies of `unit` (bytes inside OpenSession). */
static size_t amplified_open(uint8_t *buf, size_t cap, const uint8_t *unit, size_t unit_len, size_t n) {
  size_t body = 2 + 3 + n * unit_len; /* field 1 "amp" */
  size_t at = 0;
  cr_assert_lt(body + 16, cap);
  buf[at++] = 0x08; /* version = 1 */
  buf[at++] = 0x01;
  buf[at++] = 0x5a; /* field 11 (open_session), length-delimited */
  put_varint(buf, &at, body);
  buf[at++] = 0x0a; /* session_id */
  buf[at++] = 3;
  memcpy(buf + at, "amp", 3);
  at += 3;
  for (size_t i = 0; i < n; i++, at += unit_len) memcpy(buf + at, unit, unit_len);
  return at;
}

Test(bad_input, decode_amplification_is_refused, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, (const char *const[]){"--set", "daemon.max_message=64K", NULL});
  raw r;
  raw_connect(&r, &d);
  size_t cap = 64u * 1024u;
  uint8_t *buf = malloc(cap);
  cr_assert_not_null(buf);
  /* 1. 31000 empty map entries (OpenSession.params, field 4): 2 bytes each on
   * the wire, a pointer plus a ParamsEntry struct each once unpacked: about
   * 30x amplification.  The daemon's capped decoder must refuse it. */
  static const uint8_t empty_entry[] = {0x22, 0x00};
  size_t len = amplified_open(buf, cap, empty_entry, sizeof(empty_entry), 31000);
  raw_send1(&r, buf, len);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  /* 2. 20000 unknown fields (field 99 varint 0, 3 bytes each): protobuf-c keeps
   * every unknown field in its own allocation. */
  static const uint8_t unknown[] = {0x98, 0x06, 0x00};
  len = amplified_open(buf, cap, unknown, sizeof(unknown), 20000);
  raw_send1(&r, buf, len);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_PROTO);
  /* 3. The same shapes, small, are fine: a few unknown fields are ignored
   * (proto3 rules) and a few parameters are accepted. */
  len = amplified_open(buf, cap, unknown, sizeof(unknown), 10);
  raw_send1(&r, buf, len);
  /* "amp" has no geometry: the request decodes and is judged on its content. */
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_INVALID);
  free(buf);
  /* Nothing was created by the refused requests. */
  expect_code(rq_view(&r, "amp", NULL, NULL), CKV_ERR_NOT_FOUND);
  expect_code(rq_heartbeat(&r), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, decode_amplification_default_limit, .timeout = 120) {
  /* The same attack at the default max_message (16M): 8M empty map entries
   * would need 64 MB of pointers alone. */
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  size_t n = (16u << 20) / 2 - 64, cap = (16u << 20);
  uint8_t *buf = malloc(cap);
  cr_assert_not_null(buf);
  static const uint8_t empty_entry[] = {0x22, 0x00};
  size_t len = amplified_open(buf, cap, empty_entry, sizeof(empty_entry), n);
  raw_send1(&r, buf, len);
  free(buf);
  expect_code(raw_recv(&r, 20000, NULL), CKV_ERR_PROTO);
  expect_code(rq_heartbeat(&r), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

/* ---- well-formed requests with bad content ------------------------------- */

Test(bad_input, unknown_session_ids_answer_not_found, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  expect_code(rq_hello(&r, 1, 1), CKV_OK);
  expect_code(rq_open(&r, "exists"), CKV_OK);
  const char *ghost = "no-such-session";
  expect_code(rq_append(&r, ghost, 4), CKV_ERR_NOT_FOUND);
  expect_code(rq_report(&r, ghost, 1, 0, 0), CKV_ERR_NOT_FOUND);
  expect_code(rq_view(&r, ghost, NULL, NULL), CKV_ERR_NOT_FOUND);
  expect_code(rq_ack(&r, ghost, 1), CKV_ERR_NOT_FOUND);
  expect_code(rq_acquire(&r, ghost), CKV_ERR_NOT_FOUND);
  expect_code(rq_close(&r, ghost), CKV_ERR_NOT_FOUND);
  expect_code(rq_drop(&r, ghost, NULL), CKV_ERR_NOT_FOUND);
  expect_code(rq_open_ex(&r, ghost, k_geom, /* resume= */ true), CKV_ERR_NOT_FOUND);
  /* A dropped session is unknown afterwards. */
  expect_code(rq_append(&r, "exists", 4), CKV_OK);
  expect_code(rq_drop(&r, "exists", NULL), CKV_OK);
  expect_code(rq_append(&r, "exists", 4), CKV_ERR_NOT_FOUND);
  expect_code(rq_view(&r, "exists", NULL, NULL), CKV_ERR_NOT_FOUND);
  expect_code(rq_drop(&r, "exists", NULL), CKV_ERR_NOT_FOUND);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, bad_session_ids_answer_invalid, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  char long_id[130];
  memset(long_id, 'a', 129);
  long_id[129] = 0;
  const char *bad[] = {"", "a/b", "a b", "../etc", "s\n1", "caf\xc3\xa9", "x;y", long_id};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    expect_code(rq_open(&r, bad[i]), CKV_ERR_INVALID);
    expect_code(rq_append(&r, bad[i], 1), CKV_ERR_INVALID);
    expect_code(rq_view(&r, bad[i], NULL, NULL), CKV_ERR_INVALID);
    expect_code(rq_drop(&r, bad[i], NULL), CKV_ERR_INVALID);
  }
  /* 128 characters of every allowed kind is the largest valid id. */
  char ok_id[129];
  static const char allowed[] = "AZaz09._:-";
  for (size_t i = 0; i < 128; i++) ok_id[i] = allowed[i % (sizeof(allowed) - 1)];
  ok_id[128] = 0;
  expect_code(rq_open(&r, ok_id), CKV_OK);
  expect_code(rq_append(&r, ok_id, 1), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, geometry_beyond_limits, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  struct {
    geom g;
    int want;
  } cases[] = {
      {{.layers = 100000, .heads = 2, .dim = 64}, CKV_ERR_LIMIT},
      {{.layers = 257, .heads = 2, .dim = 64}, CKV_ERR_LIMIT},
      {{.layers = 2, .heads = 257, .dim = 64}, CKV_ERR_LIMIT},
      {{.layers = 2, .heads = 2, .dim = 4096}, CKV_ERR_LIMIT},
      {{.layers = 2, .heads = 2, .dim = 514}, CKV_ERR_LIMIT},
      {{.layers = 2, .heads = 2, .dim = 64, .commit = 8}, CKV_ERR_LIMIT},
      {{.layers = 2, .heads = 2, .dim = 64, .commit = 2048}, CKV_ERR_LIMIT},
      {{.layers = 2, .heads = 2, .dim = 64, .draft = 1025}, CKV_ERR_LIMIT},
      {{.layers = UINT32_MAX, .heads = UINT32_MAX, .dim = UINT32_MAX - 1}, CKV_ERR_LIMIT},
      {{.layers = 0, .heads = 2, .dim = 64}, CKV_ERR_INVALID},
      {{.layers = 2, .heads = 0, .dim = 64}, CKV_ERR_INVALID},
      {{.layers = 2, .heads = 2, .dim = 0}, CKV_ERR_INVALID},
      {{.layers = 2, .heads = 2, .dim = 63}, CKV_ERR_INVALID},
      {{.layers = 2, .heads = 2, .dim = 127}, CKV_ERR_INVALID},
      {{.layers = 2, .heads = 2, .dim = 64, .dtype = 7}, CKV_ERR_INVALID},
      {{.none = true}, CKV_ERR_INVALID},
      /* Within every limit but one draft block is larger than the tenant's
       * whole memory (256 MB here): 256*256*512*2*2*1024 bytes. */
      {{.layers = 256, .heads = 256, .dim = 512, .draft = 1024}, CKV_ERR_QUOTA},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char id[32];
    snprintf(id, sizeof(id), "geom-%zu", i);
    int code = rq_open_ex(&r, id, cases[i].g, false);
    cr_assert_eq(code, cases[i].want, "case %zu (%u layers, %u heads, %u dims, dtype %u, %u/%u tokens): got %d %s, want %s",
                 i, cases[i].g.layers, cases[i].g.heads, cases[i].g.dim, cases[i].g.dtype, cases[i].g.draft,
                 cases[i].g.commit, code, ckv_status_name(code), ckv_status_name(cases[i].want));
    /* Nothing half-created: the id is free. */
    expect_code(rq_view(&r, id, NULL, NULL), CKV_ERR_NOT_FOUND);
  }
  /* The edges that are allowed. */
  expect_code(rq_open_ex(&r, "edge", (geom){.layers = 256, .heads = 1, .dim = 512, .draft = 16, .commit = 32}, false),
              CKV_OK);
  expect_code(rq_append(&r, "edge", 3), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, positions_and_epochs_out_of_range, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  expect_code(rq_open(&r, "rng"), CKV_OK);
  uint64_t first = 99;
  expect_code(rq_append_ex(&r, "rng", 10, (cols){0}, &first), CKV_OK);
  cr_assert_eq(first, 0);
  /* Attention beyond the 10 tokens. */
  expect_code(rq_report(&r, "rng", 1, 5, 6), CKV_ERR_RANGE);
  expect_code(rq_report(&r, "rng", 1, 0, 11), CKV_ERR_RANGE);
  expect_code(rq_report(&r, "rng", 1, 11, 0), CKV_ERR_RANGE);
  expect_code(rq_report(&r, "rng", 1, UINT64_MAX, 1), CKV_ERR_RANGE); /* first + n wraps */
  expect_code(rq_report(&r, "rng", 1, UINT64_MAX - 2, 4), CKV_ERR_RANGE);
  /* A semantic update of a position that does not exist. */
  uint32_t pos = 10;
  float score = 0.5f;
  expect_code(rq_report_ex(&r, "rng", 1, 0, 10, &pos, &score, 1), CKV_ERR_RANGE);
  pos = UINT32_MAX;
  expect_code(rq_report_ex(&r, "rng", 1, 0, 10, &pos, &score, 1), CKV_ERR_RANGE);
  /* None of those counted as a round: round 1 is still next. */
  expect_code(rq_report(&r, "rng", 1, 5, 5), CKV_OK);
  /* Acknowledging an epoch the daemon never published. */
  uint64_t epoch = 0;
  expect_code(rq_view(&r, "rng", NULL, &epoch), CKV_OK);
  cr_assert_gt(epoch, 0);
  expect_code(rq_ack(&r, "rng", epoch + 1), CKV_ERR_RANGE);
  expect_code(rq_ack(&r, "rng", UINT64_MAX), CKV_ERR_RANGE);
  expect_code(rq_ack(&r, "rng", epoch), CKV_OK);
  /* The client library refuses a slot it was never given. */
  ckv_client_options o = {.socket = d.socket, .attach_socket = d.attach, .name = "range"};
  ckv_client *c = NULL;
  expect_code(ckv_client_connect(&o, &c), CKV_OK);
  ckv_geometry g = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64};
  ckv_session *s = NULL;
  expect_code(ckv_session_open(c, "lib-rng", &g, NULL, &s), CKV_OK);
  expect_code(ckv_session_append(s, 4, NULL, NULL, NULL, NULL, NULL), CKV_OK);
  uint16_t kv[2 * 64] = {0};
  expect_code(ckv_session_write_kv(s, 4, 0, kv, kv), CKV_ERR_RANGE);
  expect_code(ckv_session_write_kv(s, 0, 2, kv, kv), CKV_ERR_RANGE);
  expect_code(ckv_session_write_kv(s, 3, 1, kv, kv), CKV_OK);
  cr_assert_null(ckv_session_kv_ptr(s, UINT64_MAX, 0, 0));
  expect_code(ckv_session_report(s, 1, 2, (const float[]){0.5f, 0.5f, 0.5f}, 3, NULL), CKV_ERR_RANGE);
  ckv_session_drop(s);
  ckv_client_free(c);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, bad_columns_and_rounds_answer_invalid, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  expect_code(rq_open(&r, "cols"), CKV_OK);
  uint8_t roles[8] = {1, 2, 3, 4, 1, 2, 3, 4};
  float sem[8] = {0, 0.25f, 0.5f, 1, 0, 0, 0, 0};
  /* roles / semantic with the wrong length */
  expect_code(rq_append_ex(&r, "cols", 4, (cols){.roles = roles, .roles_len = 3}, NULL), CKV_ERR_INVALID);
  expect_code(rq_append_ex(&r, "cols", 4, (cols){.roles = roles, .roles_len = 8}, NULL), CKV_ERR_INVALID);
  expect_code(rq_append_ex(&r, "cols", 4, (cols){.sem = sem, .sem_len = 15}, NULL), CKV_ERR_INVALID);
  expect_code(rq_append_ex(&r, "cols", 4, (cols){.sem = sem, .sem_len = 32}, NULL), CKV_ERR_INVALID);
  /* an unknown role */
  uint8_t bad_roles[4] = {1, 2, 9, 1};
  expect_code(rq_append_ex(&r, "cols", 4, (cols){.roles = bad_roles, .roles_len = 4}, NULL), CKV_ERR_INVALID);
  /* semantic scores outside [0,1], NaN, infinities */
  const float bad_scores[] = {1.5f, -0.01f, NAN, INFINITY, -INFINITY, 1e30f};
  for (size_t i = 0; i < sizeof(bad_scores) / sizeof(bad_scores[0]); i++) {
    float s4[4] = {0.5f, 0.5f, bad_scores[i], 0.5f};
    expect_code(rq_append_ex(&r, "cols", 4, (cols){.sem = s4, .sem_len = sizeof(s4)}, NULL), CKV_ERR_INVALID);
  }
  /* count 0; count above max_append */
  expect_code(rq_append(&r, "cols", 0), CKV_ERR_INVALID);
  expect_code(rq_append(&r, "cols", UINT32_MAX), CKV_ERR_LIMIT);
  /* None of the refusals appended a token. */
  uint64_t first = 99;
  expect_code(rq_append_ex(&r, "cols", 4, (cols){roles, 4, sem, 16}, &first), CKV_OK);
  cr_assert_eq(first, 0, "a refused AppendTokens appended tokens (next position %llu)", (unsigned long long)first);
  /* ReportRound: bad attention column, bad semantic pairs, rounds that do not increase */
  {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
    rr.session_id = "cols";
    rr.round = 1;
    rr.attention = (ProtobufCBinaryData){7, (uint8_t *)sem};
    q.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND;
    q.report_round = &rr;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_INVALID);
  }
  uint32_t pos[2] = {0, 1};
  float good[2] = {0.1f, 0.2f}, nan2[2] = {0.1f, NAN};
  expect_code(rq_report_ex(&r, "cols", 1, 0, 4, pos, nan2, 2), CKV_ERR_INVALID);
  {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
    rr.session_id = "cols";
    rr.round = 1;
    rr.semantic_positions = (ProtobufCBinaryData){8, (uint8_t *)pos};
    rr.semantic_scores = (ProtobufCBinaryData){4, (uint8_t *)good};
    q.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND;
    q.report_round = &rr;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_INVALID);
  }
  expect_code(rq_report(&r, "cols", 0, 0, 4), CKV_ERR_INVALID);
  expect_code(rq_report_ex(&r, "cols", 2, 0, 4, pos, good, 2), CKV_OK);
  expect_code(rq_report(&r, "cols", 2, 0, 4), CKV_ERR_INVALID);
  expect_code(rq_report(&r, "cols", 1, 0, 4), CKV_ERR_INVALID);
  expect_code(rq_report(&r, "cols", 3, 0, 4), CKV_OK);
  /* An unknown policy and a non-finite policy parameter. */
  {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__OpenSession o = COMMITKV__V1__OPEN_SESSION__INIT;
    Commitkv__V1__Geometry gm = COMMITKV__V1__GEOMETRY__INIT;
    gm.n_layers = 2, gm.n_kv_heads = 2, gm.head_dim = 64;
    o.session_id = "pol";
    o.geometry = &gm;
    o.policy = "no-such-policy";
    q.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION;
    q.open_session = &o;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_INVALID);
    Commitkv__V1__OpenSession__ParamsEntry e = COMMITKV__V1__OPEN_SESSION__PARAMS_ENTRY__INIT, *ep = &e;
    e.key = "window";
    e.value = NAN;
    o.policy = "";
    o.n_params = 1;
    o.params = &ep;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_INVALID);
    expect_code(rq_view(&r, "pol", NULL, NULL), CKV_ERR_NOT_FOUND);
  }
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, versions_and_empty_requests, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw r;
  raw_connect(&r, &d);
  /* Hello that cannot be satisfied. */
  expect_code(rq_hello(&r, 9, 5), CKV_ERR_VERSION);
  expect_code(rq_hello(&r, 0, 2), CKV_ERR_VERSION);
  expect_code(rq_hello(&r, 1, 1), CKV_OK);
  /* A request from the future. */
  {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__Heartbeat h = COMMITKV__V1__HEARTBEAT__INIT;
    q.version = 99;
    q.body_case = COMMITKV__V1__REQUEST__BODY_HEARTBEAT;
    q.heartbeat = &h;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_VERSION);
    q.version = 99;
    Commitkv__V1__OpenSession o = COMMITKV__V1__OPEN_SESSION__INIT;
    Commitkv__V1__Geometry gm = COMMITKV__V1__GEOMETRY__INIT;
    gm.n_layers = 2, gm.n_kv_heads = 2, gm.head_dim = 64;
    o.session_id = "future";
    o.geometry = &gm;
    q.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION;
    q.open_session = &o;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_VERSION);
    expect_code(rq_view(&r, "future", NULL, NULL), CKV_ERR_NOT_FOUND);
  }
  /* No body at all: a zero-byte frame, and a Request with only a version. */
  raw_send1(&r, "", 0);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_INVALID);
  {
    Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
    expect_code(raw_call(&r, &q, NULL), CKV_ERR_INVALID);
  }
  /* A body case this daemon does not know (field 60, an empty message): the
   * field is skipped as unknown, so the request has no body. */
  raw_send1(&r, "\x08\x01\xe2\x03\x00", 5);
  expect_code(raw_recv(&r, REPLY_TIMEOUT_MS, NULL), CKV_ERR_INVALID);
  expect_code(rq_heartbeat(&r), CKV_OK);
  assert_serving(&d);
  raw_done(&r);
  ckv_test_stop_clean(&d);
}

Test(bad_input, session_of_another_client_in_the_same_tenant, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw a, b;
  raw_connect(&a, &d);
  raw_connect(&b, &d);
  expect_code(rq_open(&a, "mine"), CKV_OK);
  expect_code(rq_append(&a, "mine", 5), CKV_OK);
  expect_code(rq_append(&b, "mine", 5), CKV_ERR_BUSY);
  expect_code(rq_report(&b, "mine", 1, 0, 5), CKV_ERR_BUSY);
  expect_code(rq_open(&b, "mine"), CKV_ERR_EXISTS);
  expect_code(rq_open_ex(&b, "mine", k_geom, /* resume= */ true), CKV_ERR_BUSY);
  uint64_t n = 0;
  expect_code(rq_view(&a, "mine", &n, NULL), CKV_OK);
  cr_assert_eq(n, 5);
  raw_done(&a);
  raw_done(&b);
  assert_serving(&d);
  ckv_test_stop_clean(&d);
}

/* ---- tenants ------------------------------------------------------------- */

#define NOBODY_UID 65534u
#define UNMAPPED_UID 65533u
#define MAX_STEPS 32

typedef struct child_report {
  int n;
  int attach_code;
  char tenant[64];
  int code[MAX_STEPS];
  char msg[MAX_STEPS][160];
  size_t listed, listed_named;
  int failed_line; /* where the child gave up, 0 when it ran to the end */
} child_report;

#define CHILD_TIMEOUT_MS 30000

#define STEP(out, expr)                                                                                         \
  do {                                                                                                          \
    if ((out)->n < MAX_STEPS) {                                                                                 \
      (out)->code[(out)->n] = (expr);                                                                           \
      snprintf((out)->msg[(out)->n], sizeof((out)->msg[0]), "%.150s", r.msg);                                       \
      (out)->n++;                                                                                               \
    }                                                                                                           \
  } while (0)

/* Tenant b probes tenant a's session "a-secret" every way it can (in a
 * child running as tenant b's uid: ckv_test_run_as). */
static void tenant_b_probe(const void *ctx, void *report) {
  const ckv_test_daemon *d = ctx;
  child_report *out = report;
  raw r;
  raw_init(&r);
  out->attach_code = raw_attach(&r, d->attach);
  snprintf(out->tenant, sizeof(out->tenant), "%s", r.tenant);
  if (out->attach_code != 0) return;
  /* A DEALER created after the credentials changed. */
  if (ckv_raw_dealer(&r, d->socket, r.key, sizeof(r.key)) != 0) {
    out->failed_line = __LINE__;
    return;
  }
  STEP(out, rq_hello(&r, 1, 1));                                      /* 0 */
  STEP(out, rq_append(&r, "a-secret", 4));                            /* 1 */
  STEP(out, rq_report(&r, "a-secret", 1, 0, 1));                      /* 2 */
  STEP(out, rq_view(&r, "a-secret", NULL, NULL));                     /* 3 */
  STEP(out, rq_ack(&r, "a-secret", 1));                               /* 4 */
  STEP(out, rq_acquire(&r, "a-secret"));                              /* 5 */
  STEP(out, rq_close(&r, "a-secret"));                                /* 6 */
  STEP(out, rq_drop(&r, "a-secret", NULL));                           /* 7 */
  STEP(out, rq_open_ex(&r, "a-secret", k_geom, /* resume= */ true));  /* 8 */
  STEP(out, rq_drop(&r, "a-secret", "a"));                            /* 9: naming the tenant needs admin */
  STEP(out, rq_drop(&r, "never-was", "a"));                           /* 10: same answer when it does not exist */
  STEP(out, rq_append(&r, "never-was", 4));                           /* 11: the unknown-id answer, to compare */
  STEP(out, rq_open(&r, "a-secret"));                                 /* 12: ids are per tenant: a new session */
  STEP(out, rq_append(&r, "a-secret", 3));                            /* 13 */
  STEP(out, rq_list(&r, "a-secret", &out->listed, &out->listed_named)); /* 14 */
  STEP(out, rq_drop(&r, "a-secret", NULL));                           /* 15: drops b's own */
  raw_done(&r);
}

static void unmapped_probe(const void *ctx, void *report) {
  const ckv_test_daemon *d = ctx;
  child_report *out = report;
  raw r;
  raw_init(&r);
  out->attach_code = raw_attach(&r, d->attach);
  snprintf(out->msg[0], sizeof(out->msg[0]), "%.150s", r.msg);
  raw_done(&r);
}

/* The same text with every occurrence of `id` replaced by "ID". */
static void normalise(const char *in, const char *id, char *out, size_t cap) {
  size_t n = 0, idl = strlen(id);
  while (*in && n + 3 < cap) {
    if (strncmp(in, id, idl) == 0) {
      memcpy(out + n, "ID", 2);
      n += 2;
      in += idl;
    } else {
      out[n++] = *in++;
    }
  }
  out[n] = 0;
}

Test(bad_input, another_tenants_session_is_not_found, .timeout = 90) {
  char cfg[400], text[100];
  snprintf(text, sizeof(text), "[tenant.a]\nuids = 0\n\n[tenant.b]\nuids = %u\n", NOBODY_UID);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof(cfg));
  ckv_test_daemon d;
  start(&d, (const char *const[]){"--config", cfg, NULL});
  /* The test's temporary directory is 0700 (mkdtemp); the other uids must
   * reach both sockets in it. */
  cr_assert_eq(chmod(d.dir, 0755), 0);
  char sock_path[300];
  snprintf(sock_path, sizeof(sock_path), "%.290s", d.socket + strlen("ipc://"));
  struct stat st;
  cr_assert_eq(stat(sock_path, &st), 0);
  /* ZeroMQ creates the ipc socket with the process umask; the daemon must
   * open it to every local user (the attach key is the authentication). */
  cr_assert_eq(st.st_mode & 0777, 0666, "control socket mode %o", st.st_mode & 0777);

  raw a;
  raw_connect(&a, &d);
  cr_assert_str_eq(a.tenant, "a");
  expect_code(rq_open(&a, "a-secret"), CKV_OK);
  expect_code(rq_append(&a, "a-secret", 10), CKV_OK);

  child_report b;
  ckv_test_run_as(NOBODY_UID, NOBODY_UID, tenant_b_probe, &d, &b, sizeof(b), CHILD_TIMEOUT_MS);
  expect_code(b.attach_code, CKV_OK);
  cr_assert_str_eq(b.tenant, "b");
  cr_assert_eq(b.failed_line, 0, "tenant b's child gave up at line %d", b.failed_line);
  cr_assert_eq(b.n, 16);
  expect_code(b.code[0], CKV_OK);
  for (int i = 1; i <= 8; i++) {
    cr_assert_eq(b.code[i], CKV_ERR_NOT_FOUND, "tenant b step %d on tenant a's session: got %d %s (%s)", i, b.code[i],
                 ckv_status_name(b.code[i]), b.msg[i]);
    cr_assert_null(strstr(b.msg[i], "tenant"), "step %d names a tenant: %s", i, b.msg[i]);
    cr_assert_null(strstr(b.msg[i], "another"), "step %d hints at an owner: %s", i, b.msg[i]);
  }
  /* The refusal reads exactly like the one for an id that never existed. */
  char m_exists[200], m_never[200];
  normalise(b.msg[1], "a-secret", m_exists, sizeof(m_exists));
  normalise(b.msg[11], "never-was", m_never, sizeof(m_never));
  expect_code(b.code[11], CKV_ERR_NOT_FOUND);
  cr_assert_str_eq(m_exists, m_never, "the error reveals that the session exists");
  expect_code(b.code[9], CKV_ERR_AUTH);
  expect_code(b.code[10], CKV_ERR_AUTH);
  cr_assert_str_eq(b.msg[9], b.msg[10]);
  expect_code(b.code[12], CKV_OK);
  expect_code(b.code[13], CKV_OK);
  expect_code(b.code[14], CKV_OK);
  cr_assert_eq(b.listed, 1, "tenant b lists %zu sessions (only its own 'a-secret' is allowed)", b.listed);
  cr_assert_eq(b.listed_named, 1);
  expect_code(b.code[15], CKV_OK);

  /* Tenant a's session is untouched: still attached to a, still 10 tokens. */
  uint64_t n = 0, first = 0;
  expect_code(rq_view(&a, "a-secret", &n, NULL), CKV_OK);
  cr_assert_eq(n, 10);
  expect_code(rq_append_ex(&a, "a-secret", 1, (cols){0}, &first), CKV_OK);
  cr_assert_eq(first, 10);

  /* A uid that no tenant lists is refused at attach. */
  child_report u;
  ckv_test_run_as(UNMAPPED_UID, UNMAPPED_UID, unmapped_probe, &d, &u, sizeof(u), CHILD_TIMEOUT_MS);
  expect_code(u.attach_code, CKV_ERR_AUTH);
  cr_assert(strstr(u.msg[0], "not mapped"), "refusal text: %s", u.msg[0]);

  assert_serving(&d);
  raw_done(&a);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* ---- the attach socket --------------------------------------------------- */

/* A frame by hand: the 4-byte little-endian length, then `len` bytes. */
static int attach_raw(const ckv_test_daemon *d, uint32_t announced, const void *payload, size_t len) {
  int fd = -1;
  cr_assert_eq(ckv_unix_connect(d->attach, &fd), CKV_OK);
  ckv_sock_set_timeout(fd, REPLY_TIMEOUT_MS);
  uint8_t hdr[4] = {(uint8_t)announced, (uint8_t)(announced >> 8), (uint8_t)(announced >> 16),
                    (uint8_t)(announced >> 24)};
  cr_assert_eq(send(fd, hdr, 4, MSG_NOSIGNAL), 4);
  if (len) (void)send(fd, payload, len, MSG_NOSIGNAL);
  return fd;
}

Test(bad_input, attach_socket_abuse, .timeout = 90) {
  ckv_test_daemon d;
  start(&d, NULL);
  /* A client that was attached before the abuse keeps working through it. */
  raw w;
  raw_connect(&w, &d);
  expect_code(rq_open(&w, "survivor"), CKV_OK);

  /* Garbage inside a well-formed frame. */
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = 0xff;
  int fd = attach_raw(&d, sizeof(junk), junk, sizeof(junk));
  expect_code(ckv_raw_attach_answer(fd, NULL, 0), CKV_ERR_PROTO);
  close(fd);
  /* Raw garbage: the first 4 bytes read as a huge length. */
  fd = -1;
  cr_assert_eq(ckv_unix_connect(d.attach, &fd), CKV_OK);
  ckv_sock_set_timeout(fd, REPLY_TIMEOUT_MS);
  (void)send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, MSG_NOSIGNAL);
  expect_code(ckv_raw_attach_answer(fd, NULL, 0), CKV_ERR_TOO_LARGE);
  close(fd);
  /* A frame announcing 1 GiB: refused without reading (or buffering) it. */
  fd = attach_raw(&d, 1u << 30, junk, sizeof(junk));
  expect_code(ckv_raw_attach_answer(fd, NULL, 0), CKV_ERR_TOO_LARGE);
  close(fd);
  /* A frame announcing 100 bytes, then 10 bytes and a hang-up. */
  fd = attach_raw(&d, 100, junk, 10);
  shutdown(fd, SHUT_WR);
  expect_code(ckv_raw_attach_answer(fd, NULL, 0), CKV_ERR_PROTO);
  close(fd);
  /* An AttachRequest from an older protocol. */
  {
    Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
    req.version = 0; /* unset: accepted as 1 */
    uint8_t buf[64];
    req.client_name = "x";
    size_t len = commitkv__v1__attach_request__pack(&req, buf);
    fd = attach_raw(&d, (uint32_t)len, buf, len);
    expect_code(ckv_raw_attach_answer(fd, NULL, 0), CKV_OK);
    close(fd);
  }
  /* Connect and hang up at once, many times. */
  for (int i = 0; i < 50; i++) {
    cr_assert_eq(ckv_unix_connect(d.attach, &fd), CKV_OK);
    close(fd);
  }
  /* Connect and say nothing: the daemon gives up after its 1 s attach
   * timeout and answers the next client. */
  int silent = -1;
  cr_assert_eq(ckv_unix_connect(d.attach, &silent), CKV_OK);
  ckv_sock_set_timeout(silent, REPLY_TIMEOUT_MS);
  long long t0 = ckv_test_now_ms();
  int code = ckv_raw_attach_answer(silent, NULL, 0);
  long long waited = ckv_test_now_ms() - t0;
  cr_assert(code == CKV_ERR_PROTO || code == CKV_ERR_TIMEOUT || code == CKV_ERR_DISCONNECTED,
            "silent attach answered %d %s", code, ckv_status_name(code));
  cr_assert_lt(waited, 4000, "the daemon held a silent attach connection for %lld ms", waited);
  close(silent);

  expect_code(rq_append(&w, "survivor", 3), CKV_OK);
  assert_serving(&d);
  raw_done(&w);
  ckv_test_stop_clean(&d);
}

/* After attaching, the attach socket takes only AttachRequest{refresh}
 * (the arenas again, grown prefix and new fds included); anything else is
 * answered with PROTO or, when it is not even a frame, ends that client. */
static int attached_request(int fd, bool refresh, bool want_arenas, uint64_t *ret_committed) {
  cr_assert_eq(ckv_raw_attach_send(fd, "attached", want_arenas, refresh), CKV_OK);
  Commitkv__V1__AttachReply *rep = NULL;
  int code = ckv_raw_attach_recv(fd, &rep);
  if (rep && ret_committed) *ret_committed = rep->n_arenas ? rep->arenas[0]->committed : 0;
  if (rep) commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  return code;
}

/* Welcome describes the tenant's arena as far as it can without fds:
 * kind, size, generation, committed prefix (and, for legacy CUDA IPC, the
 * handle: empty on host memory). */
Test(bad_input, welcome_describes_the_arena, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw w;
  raw_connect(&w, &d);
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Hello h = COMMITKV__V1__HELLO__INIT;
  h.max_version = 1;
  h.min_version = 1;
  q.body_case = COMMITKV__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  Commitkv__V1__Response *rep = NULL;
  expect_code(raw_call(&w, &q, &rep), CKV_OK);
  cr_assert_not_null(rep);
  cr_assert_eq(rep->body_case, COMMITKV__V1__RESPONSE__BODY_WELCOME);
  cr_assert_eq(rep->welcome->n_arenas, 1u);
  const Commitkv__V1__ArenaInfo *a = rep->welcome->arenas[0];
  cr_assert_str_eq(a->kind, "host");
  cr_assert_neq(a->generation, 0u, "Welcome carries the arena's generation");
  cr_assert_geq(a->committed, 4096u, "Welcome carries the committed prefix");
  cr_assert_leq(a->committed, a->bytes);
  cr_assert_eq(a->handle.len, 0u, "host memory has no handle: its memfd travels only over the attach socket");
  ckv_rpc_free(rep);
  raw_done(&w);
  ckv_test_stop_clean(&d);
}

Test(bad_input, attached_socket_takes_only_refresh, .timeout = 60) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw w;
  raw_connect(&w, &d);
  expect_code(rq_open(&w, "survivor"), CKV_OK);
  int fd = -1;
  cr_assert_eq(ckv_unix_connect(d.attach, &fd), CKV_OK);
  ckv_sock_set_timeout(fd, REPLY_TIMEOUT_MS);
  uint64_t committed = 0;
  expect_code(attached_request(fd, false, true, &committed), CKV_OK);
  cr_assert_gt(committed, 0, "the attach reply announces the arena's committed prefix");
  uint64_t again = 0;
  expect_code(attached_request(fd, true, true, &again), CKV_OK);
  cr_assert_geq(again, committed, "a refresh never shrinks the prefix");
  expect_code(attached_request(fd, false, true, NULL), CKV_ERR_PROTO);
  expect_code(attached_request(fd, true, true, NULL), CKV_OK); /* still attached */
  /* Not a frame at all: that client is gone (EOF), nobody else notices. */
  (void)send(fd, "\xff\xff\xff\x7fjunk", 8, MSG_NOSIGNAL);
  uint8_t b;
  ssize_t got = recv(fd, &b, 1, 0);
  cr_assert_leq(got, 0, "the daemon answered garbage on an attached socket instead of hanging up");
  close(fd);
  expect_code(rq_append(&w, "survivor", 3), CKV_OK);
  assert_serving(&d);
  raw_done(&w);
  ckv_test_stop_clean(&d);
}

/* A peer that connects to the attach socket and says nothing must not stall
 * the clients that are already attached: the loop is single-threaded, and
 * the socket is 0666, so any local user could otherwise hold every tenant up.
 * The daemon polls accepted connections until their request is readable
 * (with a deadline) instead of blocking on the read. */
Test(bad_input, silent_attach_does_not_stall_others, .timeout = 90) {
  ckv_test_daemon d;
  start(&d, NULL);
  raw w;
  raw_connect(&w, &d);
  expect_code(rq_heartbeat(&w), CKV_OK);
  int fds[5];
  for (int i = 0; i < 5; i++) cr_assert_eq(ckv_unix_connect(d.attach, &fds[i]), CKV_OK);
  usleep(50 * 1000);
  uint8_t hb[64];
  size_t hb_len = packed_heartbeat(hb);
  long long t0 = ckv_test_now_ms();
  raw_send1(&w, hb, hb_len);
  expect_code(raw_recv(&w, 20000, NULL), CKV_OK);
  long long took = ckv_test_now_ms() - t0;
  for (int i = 0; i < 5; i++) close(fds[i]);
  cr_assert_lt(took, 500, "five silent attach connections delayed an attached client's heartbeat by %lld ms",
               took);
  assert_serving(&d);
  raw_done(&w);
  ckv_test_stop_clean(&d);
}
