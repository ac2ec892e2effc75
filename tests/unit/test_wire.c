/* test_wire.c - the reply side of daemon/wire.c: every string field of a
 * reply is made valid UTF-8 before packing (ckv_wire_fix_strings), wherever
 * it sits (top level, sub-message, repeated message, oneof member), without
 * touching the text it pointed at or reading a oneof member that is not set;
 * and the request_id of bytes too large to decode is found without decoding
 * them (ckv_wire_peek_request_id). */
#include "daemon/wire.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/utf8.h"
#include "testcheck.h"

TestSuite(wire, .fini = ckv_test_leak_check);

static bool ok(const char *s) { return s && ckv_utf8_valid(s, strlen(s)); }

Test(wire, fix_strings_reaches_every_string_field) {
  ckv_wire_arena a;
  cr_assert_eq(ckv_wire_arena_init(&a, 1u << 16), 0);
  static const char bad_msg[] = "no policy 'x\xE2\x82'";
  static const char bad_tenant[] = "t\xFF";
  static const char bad_kind[] = "\xC0\xAF";
  Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
  Commitkv__V1__Stats st = COMMITKV__V1__STATS__INIT;
  Commitkv__V1__TenantStats t0 = COMMITKV__V1__TENANT_STATS__INIT, t1 = COMMITKV__V1__TENANT_STATS__INIT;
  Commitkv__V1__TenantStats *tenants[2] = {&t0, &t1};
  Commitkv__V1__ArenaStats as = COMMITKV__V1__ARENA_STATS__INIT, *arenas[1] = {&as};
  rep.message = (char *)bad_msg;
  rep.body_case = COMMITKV__V1__RESPONSE__BODY_STATS;
  rep.stats = &st;
  st.backend = "host";
  st.n_tenants = 2, st.tenants = tenants;
  st.n_arenas = 1, st.arenas = arenas;
  t0.name = "fine";
  t1.name = (char *)bad_tenant;
  as.kind = (char *)bad_kind;
  as.tenant = NULL; /* NULL strings are left alone */
  cr_assert_eq(ckv_wire_fix_strings(&a, &rep.base), 3);
  cr_assert(ok(rep.message) && ok(t1.name) && ok(as.kind));
  cr_assert_str_eq(rep.message, "no policy 'x\xEF\xBF\xBD\xEF\xBF\xBD'");
  cr_assert_str_eq(t1.name, "t\xEF\xBF\xBD");
  cr_assert_str_eq(t0.name, "fine");
  cr_assert_str_eq(st.backend, "host");
  cr_assert_null(as.tenant);
  /* The originals are untouched (they may be daemon state or literals). */
  cr_assert_eq(memcmp(bad_tenant, "t\xFF", 3), 0);
  /* Valid text is left as it was: the same pointer. */
  const char *before = t0.name;
  cr_assert_eq(ckv_wire_fix_strings(&a, &rep.base), 0);
  cr_assert_eq(t0.name, before);
  /* It packs and unpacks, and the unpacked strings are valid too. */
  size_t len = commitkv__v1__response__get_packed_size(&rep);
  uint8_t *buf = malloc(len);
  commitkv__v1__response__pack(&rep, buf);
  Commitkv__V1__Response *back = commitkv__v1__response__unpack(NULL, len, buf);
  cr_assert_not_null(back);
  cr_assert(ok(back->message) && ok(back->stats->tenants[1]->name) && ok(back->stats->arenas[0]->kind));
  commitkv__v1__response__free_unpacked(back, NULL);
  free(buf);
  ckv_wire_arena_done(&a);
}

Test(wire, fix_strings_without_room_uses_a_fixed_text) {
  Commitkv__V1__AttachReply rep = COMMITKV__V1__ATTACH_REPLY__INIT;
  rep.message = "tenant '\xFF' failed";
  rep.tenant = "ok";
  cr_assert_eq(ckv_wire_fix_strings(NULL, &rep.base), 1);
  cr_assert(ok(rep.message));
  cr_assert_str_eq(rep.tenant, "ok");
  /* A full arena gives the same fixed text instead of failing. */
  ckv_wire_arena a;
  cr_assert_eq(ckv_wire_arena_init(&a, 16), 0);
  cr_assert_not_null(ckv_wire_alloc(&a, 16));
  Commitkv__V1__Response r2 = COMMITKV__V1__RESPONSE__INIT;
  r2.message = "\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF";
  cr_assert_eq(ckv_wire_fix_strings(&a, &r2.base), 1);
  cr_assert(ok(r2.message));
  ckv_wire_arena_done(&a);
}

Test(wire, fix_strings_reads_only_the_oneof_member_set) {
  /* View and Welcome share the body's storage: with body_case = VIEW, the
   * View must not be walked as a Welcome (its first words are not strings). */
  ckv_wire_arena a;
  cr_assert_eq(ckv_wire_arena_init(&a, 1u << 12), 0);
  Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
  Commitkv__V1__View v = COMMITKV__V1__VIEW__INIT;
  v.epoch = 0x4141414141414141ull; /* a "pointer" if misread */
  rep.body_case = COMMITKV__V1__RESPONSE__BODY_VIEW;
  rep.view = &v;
  cr_assert_eq(ckv_wire_fix_strings(&a, &rep.base), 0);
  Commitkv__V1__SessionOpened so = COMMITKV__V1__SESSION_OPENED__INIT;
  so.session_id = "s\xFF";
  so.policy = "commitkv";
  rep.body_case = COMMITKV__V1__RESPONSE__BODY_SESSION_OPENED;
  rep.session_opened = &so;
  cr_assert_eq(ckv_wire_fix_strings(&a, &rep.base), 1);
  cr_assert(ok(so.session_id));
  ckv_wire_arena_done(&a);
}

Test(wire, peek_request_id) {
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens at = COMMITKV__V1__APPEND_TOKENS__INIT;
  static uint32_t ids[4096];
  at.session_id = "s";
  at.count = 4096;
  at.token_ids = (ProtobufCBinaryData){sizeof(ids), (uint8_t *)ids};
  q.version = 1;
  q.request_id = 0x123456789abcull;
  q.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  q.append_tokens = &at;
  size_t len = commitkv__v1__request__get_packed_size(&q);
  uint8_t *buf = malloc(len);
  commitkv__v1__request__pack(&q, buf);
  cr_assert_eq(ckv_wire_peek_request_id(buf, len), 0x123456789abcull);
  /* Cut anywhere before the id ends, or garbage: 0, never a read past the end. */
  for (size_t cut = 0; cut < 4; cut++) cr_assert_eq(ckv_wire_peek_request_id(buf, cut), 0);
  cr_assert_eq(ckv_wire_peek_request_id("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11), 0);
  /* The id after the body (another encoder's order) is found too. */
  uint8_t tail[] = {0x62, 0x00, 0x10, 0x07}; /* append_tokens = {}, request_id = 7 */
  cr_assert_eq(ckv_wire_peek_request_id(tail, sizeof(tail)), 7);
  free(buf);
}
