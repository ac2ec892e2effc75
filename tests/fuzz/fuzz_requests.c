/* tests/fuzz/fuzz_requests.c - the ZeroMQ request path with a live session
 * context: stateful sequences of requests, not single messages.
 *
 * One in-process ckv_server (real sockets bound in a temporary directory,
 * never polled; the host backend; a synchronous compressor, so every move
 * runs inside the request that planned it) with one attached connection of
 * one tenant, built once per process.  An input is a sequence of frames
 * (fuzz.h: 2-byte length, payload); each payload goes through
 * ckv_server_answer and ckv_server_finish_reply - the size cap, the capped
 * decoder over the per-request arena, the handler, the header flush, the
 * UTF-8 repair - exactly as serve_one hands it a ZeroMQ payload, and the
 * reply is packed and must unpack again.  So OpenSession / AppendTokens /
 * ReportRound / AckEpoch / GetView / Close / resume / Drop sequences reach
 * deep session state.  After each input every session is dropped (runs are
 * independent) and the tenant must hold no bytes and no sessions: a block
 * the daemon lost track of would show there. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "lifecycle/judge.h"
#include "common/log.h"
#include "daemon/attach.h"
#include "daemon/handlers.h"
#include "daemon/reply.h"
#include "daemon/server.h"
#include "store/session.h"
#include "common/strmap.h"
#include "store/tenant.h"
#include "fuzz.h"
#include "fuzz_server.h"

#define MAX_FRAMES 64

static ckv_fuzz_server g_fs;
static ckv_server *g_server;
static ckv_conn *g_conn;
static ckv_tenant *g_tenant;
static bool g_verbose; /* CKV_FUZZ_VERBOSE: one line per reply */

static bool resolve(void *ctx, uint32_t uid, uint32_t gid, ckv_tenant_spec *ret) {
  (void)ctx;
  (void)uid;
  (void)gid;
  *ret = (ckv_tenant_spec){.name = "fuzz", .default_policy = -1};
  return true;
}

int ckv_fuzz_requests_init(void) {
  if (g_server) return 0;
  ckv_fuzz_server_start(&g_fs, "fuzz_requests", resolve, NULL);
  g_server = g_fs.server;
  ckv_tenant_spec spec;
  resolve(NULL, 0, 0, &spec);
  int r = 0;
  g_tenant = ckv_attach_tenant(g_server, &spec, &r);
  CKV_FUZZ_CHECK(g_tenant, "tenant: %s", ckv_strerror(r));
  g_conn = ckv_fuzz_server_conn(&g_fs, g_tenant, false);
  g_verbose = getenv("CKV_FUZZ_VERBOSE") != NULL;
  return 0;
}

/* Drops every session (each settled first), then checks nothing is left. */
static void reset_sessions(void) {
  ckv_server *s = g_server;
  ckv_store_collect_jobs(&s->store);
  while (ckv_strmap_size(s->store.sessions)) {
    size_t cur = 0;
    ckv_srv_session *sess = ckv_strmap_next(s->store.sessions, &cur, NULL);
    ckv_store_settle_session(&s->store, sess);
    ckv_store_drop_session(&s->store, sess);
  }
  ckv_store_collect_jobs(&s->store);
  CKV_FUZZ_CHECK(s->store.n_doomed == 0, "%zu doomed sessions left", s->store.n_doomed);
  CKV_FUZZ_CHECK(g_tenant->n_sessions == 0, "tenant counts %llu sessions", (unsigned long long)g_tenant->n_sessions);
  CKV_FUZZ_CHECK(g_tenant->bytes_used == 0, "all sessions dropped but the tenant holds %llu bytes",
                 (unsigned long long)g_tenant->bytes_used);
  CKV_FUZZ_CHECK(s->store.dirty_head == NULL, "a freed session is still on the dirty list");
  g_conn->hello = false;
  g_conn->version = 0;
}

static void serve(const uint8_t *payload, size_t len) {
  ckv_server *s = g_server;
  Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
  ckv_wire_reset(&s->out);
  ckv_handle_payload(s, g_conn, payload, len, &rep);
  ckv_reply_finish(s, g_conn, &rep);
  /* The reply goes on the wire: it must pack, and a client must read it back. */
  size_t n = commitkv__v1__response__get_packed_size(&rep);
  uint8_t *buf = malloc(n ? n : 1);
  CKV_FUZZ_CHECK(buf, "malloc %zu", n);
  CKV_FUZZ_CHECK(commitkv__v1__response__pack(&rep, buf) == n, "packed size mismatch");
  Commitkv__V1__Response *back = commitkv__v1__response__unpack(NULL, n, buf);
  CKV_FUZZ_CHECK(back, "a %zu-byte reply (code %d) does not unpack", n, rep.code);
  if (g_verbose)
    fprintf(stderr, "fuzz_requests: %zu-byte request -> code %d body %d: %s\n", len, rep.code, (int)rep.body_case,
            rep.message ? rep.message : "");
  CKV_FUZZ_CHECK(back->code == rep.code, "reply code %d read back as %d", rep.code, back->code);
  commitkv__v1__response__free_unpacked(back, NULL);
  free(buf);
}

int ckv_fuzz_requests(const uint8_t *data, size_t size) {
  ckv_fuzz_requests_init();
  ckv_fuzz_in in = {data, size};
  for (int i = 0; i < MAX_FRAMES && in.n; i++) {
    const uint8_t *p;
    size_t len = ckv_fuzz_frame(&in, &p);
    serve(p, len);
  }
  reset_sessions();
  return 0;
}
