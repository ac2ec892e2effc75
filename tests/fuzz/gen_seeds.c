/* tests/fuzz/gen_seeds.c - writes the seed corpora of the fuzz targets from
 * real messages and files (tests/fuzz/corpus/<target>/, committed):
 *
 *   fuzz_seeds OUT_DIR CONFIG_FILE
 *
 * requests: packed commitkv.v1.Request sequences a real worker sends (Hello,
 *   OpenSession, AppendTokens with roles and scores, ReportRound rounds,
 *   AckEpoch, GetView, Acquire, Stats, List, Close, resume, Drop ...), framed
 *   as fuzz.h says;
 * attach_frame: programs for fuzz_attach_frame.c that connect and send real
 *   AttachRequest frames (whole, split, with descriptors, refreshes);
 * arena: programs for fuzz_arena.c (appends, rounds, scribbles);
 * config: the shipped packaging/commitkvd.conf and a config with tenants;
 * mlp_weights: a weight file written by ckv_mlp_save (what ckv-train-mlp
 *   writes);
 * trace: a trace written by ckv_trace_round over a real session's rounds;
 * snapshot: a snapshot written by ckv_snap_write (a draft and a rotated block).
 * The op codes below must match the switch statements of the targets. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commitkv.pb-c.h"
#include "commitkv/status.h"
#include "daemon/config.h"
#include "lifecycle/judge.h"
#include "lifecycle/mlp.h"
#include "lifecycle/tokens.h"
#include "lifecycle/trace.h"
#include "persist/snapshot.h"
#include "kernels/kernels.h"

static const char *g_out;

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 256;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
}
static void put8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put16(buf *b, uint16_t v) {
  put8(b, (uint8_t)v);
  put8(b, (uint8_t)(v >> 8));
}

static void save(const char *target, const char *name, const buf *b) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", g_out, target);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/%s/%s", g_out, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f) != 0) {
    fprintf(stderr, "fuzz_seeds: cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

/* ---- requests ------------------------------------------------------------- */

static uint64_t g_request_id;

static void frame_request(buf *b, Commitkv__V1__Request *req) {
  req->version = 1;
  req->request_id = ++g_request_id;
  size_t n = commitkv__v1__request__get_packed_size(req);
  uint8_t *tmp = malloc(n ? n : 1);
  commitkv__v1__request__pack(req, tmp);
  put16(b, (uint16_t)n);
  put(b, tmp, n);
  free(tmp);
}

static void hello(buf *b) {
  Commitkv__V1__Hello h = COMMITKV__V1__HELLO__INIT;
  h.min_version = 1;
  h.max_version = 1;
  h.client_name = "seed-worker";
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  r.body_case = COMMITKV__V1__REQUEST__BODY_HELLO;
  r.hello = &h;
  frame_request(b, &r);
}

static void open_session(buf *b, const char *id, const char *policy, int dtype, int resume, const char *param,
                         double value) {
  Commitkv__V1__Geometry g = COMMITKV__V1__GEOMETRY__INIT;
  g.n_layers = 2;
  g.n_kv_heads = 2;
  g.head_dim = 32;
  g.dtype = dtype;
  Commitkv__V1__OpenSession o = COMMITKV__V1__OPEN_SESSION__INIT;
  Commitkv__V1__OpenSession__ParamsEntry e = COMMITKV__V1__OPEN_SESSION__PARAMS_ENTRY__INIT, *ep[1] = {&e};
  o.session_id = (char *)id;
  o.geometry = &g;
  o.policy = (char *)policy;
  o.resume = resume;
  if (param) {
    e.key = (char *)param;
    e.value = value;
    o.params = ep;
    o.n_params = 1;
  }
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  r.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION;
  r.open_session = &o;
  frame_request(b, &r);
}

static void append(buf *b, const char *id, uint32_t n, int with_columns) {
  uint8_t roles[256], tags[256];
  float sem[256];
  uint32_t ids[256];
  for (uint32_t i = 0; i < n && i < 256; i++) {
    roles[i] = (uint8_t)(1 + i % 4);
    tags[i] = (uint8_t)(i % 3);
    sem[i] = (float)(i % 10) / 10.f;
    ids[i] = 1000 + i % 17;
  }
  Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
  a.session_id = (char *)id;
  a.count = n;
  if (with_columns && n <= 256) {
    a.roles = (ProtobufCBinaryData){n, roles};
    a.tags = (ProtobufCBinaryData){n, tags};
    a.semantic = (ProtobufCBinaryData){4 * n, (uint8_t *)sem};
    a.token_ids = (ProtobufCBinaryData){4 * n, (uint8_t *)ids};
  }
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  r.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  r.append_tokens = &a;
  frame_request(b, &r);
}

static void report(buf *b, const char *id, uint64_t round, uint32_t n, uint32_t hot_every) {
  float attn[512];
  for (uint32_t i = 0; i < n && i < 512; i++) attn[i] = hot_every && i % hot_every == 0 ? 3.0f : 0.05f * (i % 3);
  uint32_t pos[2] = {0, 1};
  float scores[2] = {0.9f, 0.8f};
  Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
  rr.session_id = (char *)id;
  rr.round = round;
  rr.attention = (ProtobufCBinaryData){4 * (n < 512 ? n : 512), (uint8_t *)attn};
  if (round % 2) {
    rr.semantic_positions = (ProtobufCBinaryData){sizeof(pos), (uint8_t *)pos};
    rr.semantic_scores = (ProtobufCBinaryData){sizeof(scores), (uint8_t *)scores};
  }
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  r.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND;
  r.report_round = &rr;
  frame_request(b, &r);
}

static void ack(buf *b, const char *id, uint64_t epoch) {
  Commitkv__V1__AckEpoch a = COMMITKV__V1__ACK_EPOCH__INIT;
  a.session_id = (char *)id;
  a.epoch = epoch;
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  r.body_case = COMMITKV__V1__REQUEST__BODY_ACK_EPOCH;
  r.ack_epoch = &a;
  frame_request(b, &r);
}

/* The requests that name only a session (or nothing). */
static void simple(buf *b, Commitkv__V1__Request__BodyCase kind, const char *id) {
  Commitkv__V1__Request r = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__GetView v = COMMITKV__V1__GET_VIEW__INIT;
  Commitkv__V1__Acquire aq = COMMITKV__V1__ACQUIRE__INIT;
  Commitkv__V1__CloseSession cl = COMMITKV__V1__CLOSE_SESSION__INIT;
  Commitkv__V1__DropSession dr = COMMITKV__V1__DROP_SESSION__INIT;
  Commitkv__V1__SaveSession sv = COMMITKV__V1__SAVE_SESSION__INIT;
  Commitkv__V1__RestoreSession rs = COMMITKV__V1__RESTORE_SESSION__INIT;
  Commitkv__V1__StatsRequest st = COMMITKV__V1__STATS_REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  Commitkv__V1__Heartbeat hb = COMMITKV__V1__HEARTBEAT__INIT;
  Commitkv__V1__StatusRequest su = COMMITKV__V1__STATUS_REQUEST__INIT;
  v.session_id = aq.session_id = cl.session_id = dr.session_id = sv.session_id = rs.session_id = (char *)id;
  r.body_case = kind;
  switch (kind) {
    case COMMITKV__V1__REQUEST__BODY_GET_VIEW: r.get_view = &v; break;
    case COMMITKV__V1__REQUEST__BODY_ACQUIRE: r.acquire = &aq; break;
    case COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION: r.close_session = &cl; break;
    case COMMITKV__V1__REQUEST__BODY_DROP_SESSION: r.drop_session = &dr; break;
    case COMMITKV__V1__REQUEST__BODY_SAVE_SESSION: r.save_session = &sv; break;
    case COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION: r.restore_session = &rs; break;
    case COMMITKV__V1__REQUEST__BODY_STATS: r.stats = &st; break;
    case COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS: r.list_sessions = &ls; break;
    case COMMITKV__V1__REQUEST__BODY_HEARTBEAT: r.heartbeat = &hb; break;
    default: r.status = &su; break;
  }
  frame_request(b, &r);
}

static void seeds_requests(void) {
  buf b = {0};
  /* a worker's whole life: hello, open, rounds, views, acks, close, resume, drop */
  hello(&b);
  open_session(&b, "conv-1", "", 0, 0, NULL, 0);
  append(&b, "conv-1", 24, 1);
  report(&b, "conv-1", 1, 24, 4);
  simple(&b, COMMITKV__V1__REQUEST__BODY_GET_VIEW, "conv-1");
  ack(&b, "conv-1", 3);
  append(&b, "conv-1", 24, 1);
  report(&b, "conv-1", 2, 48, 4);
  report(&b, "conv-1", 3, 48, 8);
  ack(&b, "conv-1", 8);
  report(&b, "conv-1", 4, 48, 0);
  simple(&b, COMMITKV__V1__REQUEST__BODY_ACQUIRE, "conv-1");
  simple(&b, COMMITKV__V1__REQUEST__BODY_STATS, NULL);
  simple(&b, COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS, NULL);
  simple(&b, COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION, "conv-1");
  open_session(&b, "conv-1", "", 0, 1, NULL, 0);
  simple(&b, COMMITKV__V1__REQUEST__BODY_DROP_SESSION, "conv-1");
  save("requests", "worker-life", &b);

  /* many rounds with a small recent window: tokens go staged, committed, recycled */
  b.n = 0;
  hello(&b);
  open_session(&b, "agent.7", "commitkv", 1, 0, "recent_window", 4);
  append(&b, "agent.7", 80, 1);
  for (uint64_t r = 1; r <= 10; r++) {
    report(&b, "agent.7", r, 80, r < 5 ? 3 : 0);
    ack(&b, "agent.7", 2 * r + 2);
  }
  append(&b, "agent.7", 40, 0);
  simple(&b, COMMITKV__V1__REQUEST__BODY_GET_VIEW, "agent.7");
  simple(&b, COMMITKV__V1__REQUEST__BODY_HEARTBEAT, NULL);
  save("requests", "rounds-recent-window", &b);

  /* every policy, each its own session */
  static const char *policies[] = {"fp16", "int8", "kivi4", "kivi2", "h2o", "streaming"};
  b.n = 0;
  hello(&b);
  for (int i = 0; i < 6; i++) {
    char id[16];
    snprintf(id, sizeof(id), "p%d", i);
    open_session(&b, id, policies[i], i % 2, 0, "budget", 0.5);
    append(&b, id, 40, 1);
    report(&b, id, 1, 40, 5);
    report(&b, id, 2, 40, 0);
  }
  simple(&b, COMMITKV__V1__REQUEST__BODY_STATS, NULL);
  save("requests", "policies", &b);

  /* what a confused or hostile client sends */
  b.n = 0;
  open_session(&b, "bad id!", "", 0, 0, NULL, 0);
  open_session(&b, "x", "nope", 0, 0, NULL, 0);
  open_session(&b, "x", "", 0, 0, "prune_keep", 7);
  append(&b, "missing", 3, 0);
  report(&b, "missing", 0, 0, 0);
  simple(&b, COMMITKV__V1__REQUEST__BODY_SAVE_SESSION, "x");
  simple(&b, COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION, "x");
  simple(&b, COMMITKV__V1__REQUEST__BODY_STATUS, NULL);
  put16(&b, 3);
  put(&b, "\x08\x02\x10", 3); /* a version-2 request with a cut field */
  save("requests", "misuse", &b);
  free(b.p);
}

/* ---- attach frames (fuzz_attach_frame.c's program) ------------------------ */

enum { A_CONNECT = 0, A_BYTES = 1, A_FDS = 2, A_REQUEST = 3, A_SHUT = 4, A_CLOSE = 5, A_READ = 6, A_TIME = 7,
       A_MAP = 8 };

static void a_request(buf *b, uint8_t client, uint8_t flags, const char *name) {
  put8(b, A_REQUEST);
  put8(b, client);
  put8(b, flags);
  put8(b, (uint8_t)strlen(name));
  put(b, name, strlen(name));
}

static void seeds_attach(void) {
  buf b = {0};
  /* attach with arenas, then a refresh on the same socket */
  put8(&b, A_CONNECT), put8(&b, 0);
  a_request(&b, 0, 1 | 4, "worker");
  put8(&b, A_READ), put8(&b, 0);
  a_request(&b, 0, 1 | 8, "worker");
  put8(&b, A_READ), put8(&b, 0);
  save("attach_frame", "attach-refresh", &b);

  /* a request split in two, the daemon reading in between */
  b.n = 0;
  put8(&b, A_CONNECT), put8(&b, 1);
  a_request(&b, 1, 1 | 4 | 16 | (3 << 5), "split");
  put8(&b, A_READ), put8(&b, 1);
  save("attach_frame", "split-request", &b);

  /* a raw frame: length prefix then an AttachRequest, in three writes */
  b.n = 0;
  uint8_t frame[64];
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = 1;
  req.client_name = "raw";
  req.want_arenas = 1;
  size_t len = commitkv__v1__attach_request__get_packed_size(&req);
  commitkv__v1__attach_request__pack(&req, frame + 4);
  frame[0] = (uint8_t)len, frame[1] = frame[2] = frame[3] = 0;
  put8(&b, A_CONNECT), put8(&b, 2);
  put8(&b, A_BYTES), put8(&b, 2), put16(&b, 2), put(&b, frame, 2);
  put8(&b, A_READ), put8(&b, 0);
  put8(&b, A_BYTES), put8(&b, 2), put16(&b, 3), put(&b, frame + 2, 3);
  put8(&b, A_READ), put8(&b, 0);
  put8(&b, A_BYTES), put8(&b, 2), put16(&b, (uint16_t)(len + 4 - 5)), put(&b, frame + 5, len + 4 - 5);
  put8(&b, A_READ), put8(&b, 0);
  save("attach_frame", "raw-pieces", &b);

  /* descriptors with the frame, a half-sent frame that times out, a stranger */
  b.n = 0;
  put8(&b, A_CONNECT), put8(&b, 3);
  put8(&b, A_FDS), put8(&b, 3), put8(&b, 2), put8(&b, 4), put(&b, frame, 4);
  put8(&b, A_READ), put8(&b, 0);
  put8(&b, A_CONNECT), put8(&b, 4);
  put8(&b, A_BYTES), put8(&b, 4), put16(&b, 3), put(&b, frame, 3);
  put8(&b, A_TIME), put8(&b, 0), put8(&b, 200);
  put8(&b, A_MAP), put8(&b, 0);
  put8(&b, A_CONNECT), put8(&b, 5);
  a_request(&b, 5, 1, "stranger");
  put8(&b, A_READ), put8(&b, 0);
  put8(&b, A_SHUT), put8(&b, 5);
  put8(&b, A_READ), put8(&b, 0);
  save("attach_frame", "fds-timeout-stranger", &b);

  /* more clients than the tenant's max_clients (3) */
  b.n = 0;
  for (uint8_t i = 0; i < 5; i++) {
    put8(&b, A_CONNECT), put8(&b, i);
    a_request(&b, i, 1 | 4, "many");
  }
  put8(&b, A_READ), put8(&b, 0);
  put8(&b, A_CLOSE), put8(&b, 1);
  put8(&b, A_READ), put8(&b, 0);
  save("attach_frame", "client-limit", &b);
  free(b.p);
}

/* ---- arena (fuzz_arena.c's program) ----------------------------------------- */

enum { R_APPEND = 0, R_SCRIBBLE = 1, R_ROUND = 3, R_ACK = 4, R_ESCALATE = 5, R_RECLAIM = 6 };

static void r_round(buf *b, uint8_t flags, uint32_t n, uint8_t hot) {
  put8(b, (uint8_t)(R_ROUND | flags));
  for (uint32_t i = 0; i < n; i++) put8(b, i % 5 == 0 ? hot : 1);
}

static void seeds_arena(void) {
  buf b = {0};
  /* policy commitkv, recent window 1: appends, rounds that stage and commit */
  put8(&b, 0), put8(&b, 1 << 2);
  uint32_t n = 0;
  for (int i = 0; i < 3; i++) put8(&b, R_APPEND), put8(&b, 39), n += 40;
  for (int r = 0; r < 6; r++) r_round(&b, 0x80, n, 100);
  save("arena", "rounds", &b);

  /* the same with scribbles over headers, seals and payload between rounds */
  b.n = 0;
  put8(&b, 2), put8(&b, 1 << 2); /* kivi4 */
  n = 0;
  for (int i = 0; i < 3; i++) put8(&b, R_APPEND), put8(&b, 39), n += 40;
  r_round(&b, 0, n, 100);
  for (uint8_t mode = 0; mode < 3; mode++) {
    put8(&b, R_SCRIBBLE), put8(&b, mode), put8(&b, mode), put16(&b, 8 + 16 * mode), put8(&b, 8);
    put(&b, "\xff\xff\xff\xff\x00\x00\x00\x80", 8);
  }
  r_round(&b, 0x80, n, 100);
  put8(&b, R_ACK | 0x80);
  r_round(&b, 0x80, n, 0);
  save("arena", "scribbles", &b);

  /* pressure: escalate, reclaim */
  b.n = 0;
  put8(&b, 3), put8(&b, 2 << 2); /* kivi2 */
  for (int i = 0; i < 4; i++) put8(&b, R_APPEND), put8(&b, 47);
  r_round(&b, 0, 192, 50);
  put8(&b, R_ESCALATE);
  put8(&b, R_ESCALATE | 0x80);
  put8(&b, R_RECLAIM), put8(&b, 0), put16(&b, 4096);
  put8(&b, R_ACK);
  save("arena", "pressure", &b);
  free(b.p);
}

/* ---- config, weights, trace ------------------------------------------------- */

static void seeds_config(const char *shipped) {
  buf b = {0};
  FILE *f = fopen(shipped, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_seeds: %s: %s\n", shipped, strerror(errno));
    exit(1);
  }
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) put(&b, chunk, n);
  fclose(f);
  save("config", "commitkvd.conf", &b);
  b.n = 0;
  static const char tenants[] =
      "# two tenants, quotas and policies\n"
      "[daemon]\n"
      "memory = 1G\n"
      "lease = 5s\n"
      "max_message = 4M\n"
      "[policy]\n"
      "default = commitkv\n"
      "attn_threshold = 1.5\n"
      "recent_window = 32\n"
      "[tenant.alice]\n"
      "uids = 1000, 1001\n"
      "quota = 256M\n"
      "policies = commitkv, int8\n"
      "[tenant.bob]\n"
      "gids = 2000\n"
      "quota = 128M\n"
      "max_sessions = 4\n";
  put(&b, tenants, sizeof(tenants) - 1);
  save("config", "tenants.conf", &b);
  free(b.p);
}

static void seeds_weights(void) {
  enum { H = 4, F = CKV_JUDGE_FEATURES };
  float mean[F], std[F], w1[H * F], b1[H], w2[CKV_MLP_CLASSES * H], b2[CKV_MLP_CLASSES];
  for (int i = 0; i < F; i++) mean[i] = 0.1f * (float)i, std[i] = 1.f + 0.05f * (float)i;
  for (int i = 0; i < H * F; i++) w1[i] = sinf((float)i);
  for (int i = 0; i < H; i++) b1[i] = 0.01f * (float)i;
  for (int i = 0; i < CKV_MLP_CLASSES * H; i++) w2[i] = cosf((float)i);
  for (int i = 0; i < CKV_MLP_CLASSES; i++) b2[i] = -0.1f * (float)i;
  ckv_mlp_spec spec = {.hidden = H, .mean = mean, .std = std, .w1 = w1, .b1 = b1, .w2 = w2, .b2 = b2};
  ckv_mlp *m = NULL;
  char err[256];
  if (ckv_mlp_new(&spec, &m, err, sizeof(err)) != CKV_OK) {
    fprintf(stderr, "fuzz_seeds: mlp: %s\n", err);
    exit(1);
  }
  char path[512];
  snprintf(path, sizeof(path), "%s/mlp_weights", g_out);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/mlp_weights/hidden4.weights", g_out);
  if (ckv_mlp_save(m, path, "seed: hidden 4, written by ckv_mlp_save as ckv-train-mlp does") != CKV_OK) exit(1);
  ckv_mlp_free(m);
}

static void seeds_trace(void) {
  char path[512];
  snprintf(path, sizeof(path), "%s/trace", g_out);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/trace/two-sessions.trace", g_out);
  remove(path);
  ckv_trace *tr = NULL;
  char err[256];
  if (ckv_trace_open(path, 1, 0, &tr, err, sizeof(err)) != CKV_OK) {
    fprintf(stderr, "fuzz_seeds: trace: %s\n", err);
    exit(1);
  }
  ckv_config cfg;
  ckv_config_init_defaults(&cfg);
  ckv_config_finalize(&cfg, err, sizeof(err));
  ckv_judge_params p;
  ckv_config_judge_params(&cfg.policy, &p);
  ckv_config_done(&cfg);
  p.sink_tokens = 1;
  p.recent_window = 1;
  for (uint64_t sess = 1; sess <= 2; sess++) {
    ckv_tokens t;
    ckv_tokens_init(&t);
    static const uint8_t roles[3] = {1, 2, 3};
    static const float sem[3] = {0.9f, 0.2f, 0.5f};
    if (ckv_tokens_reserve(&t, 3) < 0) exit(1);
    for (int i = 0; i < 3; i++) ckv_tokens_push(&t, roles[i], 0, sem[i], 0, CKV_NO_BLOCK, 0);
    for (uint32_t round = 1; round <= 18; round++) {
      float attn[3] = {2.f, round < 4 ? 1.5f : 0.f, (float)(round % 3)};
      ckv_tokens_record_round(&t, round, 0, attn, 3, 3);
      if (ckv_trace_round(tr, sess, round, &t, &p) < 0) exit(1);
    }
    ckv_tokens_done(&t);
  }
  ckv_trace_close(tr);
}

/* A session of 3 tokens: two in a draft block, one in a ROT4 block. */
static void seeds_snapshot(void) {
  static const ckv_geometry g = {1, 2, 32, 0};
  ckv_snap s;
  memset(&s, 0, sizeof(s));
  snprintf(s.tenant, sizeof s.tenant, "default");
  snprintf(s.session_id, sizeof s.session_id, "seed");
  snprintf(s.model_id, sizeof s.model_id, "agentlm");
  snprintf(s.model_revision, sizeof s.model_revision, "1");
  s.geom = g;
  s.draft_tokens = 16;
  s.staged_tokens = s.commit_tokens = 64;
  ckv_judge_params_init(&s.params);
  s.epoch = 2;
  s.rounds = s.last_round = 1;
  s.count_by_state[CKV_STATE_DRAFT] = 2;
  s.count_by_state[CKV_STATE_COMMITTED] = 1;
  for (int i = 0; i < CKV_FORMAT_COUNT_; i++) s.fill[i] = CKV_NO_BLOCK;
  s.fill[CKV_FORMAT_DRAFT] = 0;
  s.fill[CKV_FORMAT_ROT4] = 1;
  s.n_table = 2;
  ckv_tokens_init(&s.tokens);
  if (ckv_tokens_reserve(&s.tokens, 3) < 0) exit(1);
  ckv_tokens_push(&s.tokens, 1, 0, 0.5f, 1, 0, 0);
  ckv_tokens_push(&s.tokens, 2, 0, 0.9f, 1, 0, 1);
  ckv_tokens_push(&s.tokens, 3, 0, 0.7f, 1, 1, 0);
  s.tokens.state[2] = CKV_STATE_COMMITTED;
  uint8_t *blk[2];
  ckv_snap_block b[2];
  static const uint32_t fmt[2] = {CKV_FORMAT_DRAFT, CKV_FORMAT_ROT4}, cap[2] = {16, 64};
  for (int i = 0; i < 2; i++) {
    size_t bytes = ckv_format_block_bytes(fmt[i], &g, cap[i], 0);
    blk[i] = calloc(1, bytes);
    if (!blk[i] || ckv_block_init(blk[i], fmt[i], &g, cap[i], 0, 5 + i) != CKV_OK) exit(1);
    size_t head = ckv_block_payload_offset(cap[i]);
    for (size_t k = ckv_format_is_rot(fmt[i]) ? ckv_rot_sections_offset(&g, cap[i]) : head; k < bytes; k++)
      blk[i][k] = (uint8_t)(k * 13);
    b[i] = (ckv_snap_block){.index = (uint32_t)i, .format = (uint8_t)fmt[i], .capacity = (uint16_t)cap[i],
                            .used = (uint16_t)(i ? 1 : 2), .bytes = bytes, .meta = blk[i], .payload = blk[i] + head};
  }
  ckv_block_positions(blk[0])[0] = 0;
  ckv_block_positions(blk[0])[1] = 1;
  ckv_block_set_valid(blk[0], 0, true);
  ckv_block_set_valid(blk[0], 1, true);
  ckv_block_positions(blk[1])[0] = 2;
  ckv_block_set_valid(blk[1], 0, true);
  s.blocks = b;
  s.n_blocks = 2;
  char dir[512], err[256];
  snprintf(dir, sizeof(dir), "%s/snapshot", g_out);
  mkdir(dir, 0755);
  uint64_t n = 0;
  if (ckv_snap_write(dir, "draft-and-rot4", &s, &n, err, sizeof(err)) != CKV_OK) {
    fprintf(stderr, "fuzz_seeds: snapshot: %s\n", err);
    exit(1);
  }
  /* fuzz_snapshot's inputs start with a mode byte (odd: checksums recomputed) */
  char path[600], seed[600];
  snprintf(path, sizeof(path), "%s/draft-and-rot4%s", dir, CKV_SNAP_SUFFIX);
  snprintf(seed, sizeof(seed), "%s/draft-and-rot4.seed", dir);
  FILE *in = fopen(path, "rb"), *out = fopen(seed, "wb");
  if (!in || !out) exit(1);
  fputc(1, out);
  for (int c; (c = fgetc(in)) != EOF;) fputc(c, out);
  fclose(in);
  fclose(out);
  remove(path);
  ckv_tokens_done(&s.tokens);
  free(blk[0]);
  free(blk[1]);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fuzz_seeds OUT_DIR CONFIG_FILE\n");
    return 2;
  }
  g_out = argv[1];
  mkdir(g_out, 0755);
  seeds_requests();
  seeds_attach();
  seeds_arena();
  seeds_config(argv[2]);
  seeds_weights();
  seeds_trace();
  seeds_snapshot();
  return 0;
}
