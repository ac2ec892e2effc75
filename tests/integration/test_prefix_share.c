/* test_prefix_share.c - shared prefix blocks (issue 41): a real commitkvd
 * and real worker processes.
 *
 * - two_processes_share_prefix_once: process A writes a 2048-token prefix and
 *   40 tokens of its own; process B opens on the same token ids with
 *   reuse_prefix and matches all 2048, writes 40 other tokens.  The prefix's
 *   bytes are held once (tenant bytes.shared, arena bytes_used exact), each
 *   one's own tokens read back as its own (not the other's), kill -9 of A
 *   leaves B's reads identical byte for byte (against the values B computed
 *   privately), and after A is gone the blocks are B's alone.  A process of
 *   another tenant sending the same ids matches 0 (LookupPrefix and
 *   OpenSession).
 * - fork_reads_parent_prefix_then_diverges: a fork at 37 (two whole blocks
 *   shared, a 5-token tail copied) reads the parent's first 37 tokens
 *   exactly, then its own; the parent's later tokens stay its own.
 * - forked_snapshot_restores_alone: a fork saved, then fork and parent
 *   dropped (the arena then holds nothing), restores alone bit for bit.
 * - a_shared_prefix_is_compressed_once: two commitkv sessions on one
 *   prefix get it compressed once for both (same block ids, shared bytes a
 *   fraction of FP16), a session opened later links the compressed
 *   blocks, and a holder's snapshot restores alone, bit for bit.
 * - no_protocol_write_into_shared_block: appends after a reuse get slots in
 *   new private blocks only, no draft slot of a shared token is writable,
 *   and a session whose policy compresses at once (int8) leaves the shared
 *   blocks in draft, untouched, while its other tokens move; LookupPrefix
 *   refuses malformed input with a code.
 * - worker_lookup_reads_the_published_index: the worker's LookupPrefix is
 *   answered in its own process from the tenant's index (no request), and
 *   equals the daemon's answer for whole, partial, changed, other-revision
 *   and empty inputs; it follows the blocks (gone when they are); its
 *   lookups reach the tenant's figures with the heartbeat; a heartbeat with
 *   more hits than lookups is refused.  The compressed-once test also
 *   compares both answers on a compressed prefix. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
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

TestSuite(prefix_share, .fini = ckv_test_leak_check);

#define PREFIX 2048u
#define OWN 40u
#define DEADLINE_MS 20000
#define OTHER_UID 5141u
static const ckv_geometry k_geom = {2, 2, 32, CKV_DTYPE_FP16};

/* Worker processes forked by the test must not use Criterion's asserts (a
 * child's failed assert waits for a runner that is not its own): NEED
 * fails them with exit status 3 and the reason on stderr. */
static bool g_child;
#define NEED(cond, ...)                                                        \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (g_child) {                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                        \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
        _exit(3);                                                              \
      }                                                                        \
      cr_assert_fail(__VA_ARGS__);                                             \
    }                                                                          \
  } while (0)

/* The value a writer of `variant` puts at (pos, layer, kv, e): the prefix
 * is variant 0 for everyone, each writer's own tokens its own variant. */
static uint16_t kv_at(size_t pos, uint32_t layer, uint32_t kv, uint32_t e,
                      unsigned variant) {
  return ckv_f32_to_f16(
      ckv_test_kv_value(pos + (size_t)variant * 100003u, layer, kv, e));
}

static uint32_t token_id(size_t pos, unsigned variant) {
  return (uint32_t)(1000u + pos * 7u + variant * 1000000u);
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket,
                          .attach_socket = d->attach,
                          .name = "test_prefix_share",
                          .timeout_ms = DEADLINE_MS};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  NEED(r == CKV_OK, "connect: %s (%s)", ckv_strerror(r),
       ckv_client_connect_error());
  return c;
}

static ckv_session *open_s(ckv_client *c, const char *id, const char *policy,
                           const uint32_t *ids, size_t n) {
  ckv_session_options o = {.policy = policy,
                           .model_id = "m",
                           .model_revision = "r1",
                           .token_ids = ids,
                           .n_token_ids = n,
                           .reuse_prefix = ids != NULL};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geom, &o, &s);
  NEED(r == CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r),
       ckv_client_last_error(c));
  return s;
}

/* Appends positions [from, to) with ids and K/V of `variant` (positions
 * below PREFIX are variant 0), then reports a round over them. */
static void write_tokens(ckv_session *s, size_t from, size_t to,
                         unsigned variant, uint64_t round) {
  uint32_t n = (uint32_t)(to - from);
  uint32_t *ids = malloc(n * sizeof(*ids));
  for (size_t p = from; p < to; p++)
    ids[p - from] = token_id(p, p < PREFIX ? 0 : variant);
  uint64_t first;
  int r = ckv_session_append(s, n, NULL, NULL, NULL, ids, &first);
  NEED(r == CKV_OK && first == from, "append: %s", ckv_strerror(r));
  free(ids);
  const uint32_t te = k_geom.n_kv_heads * k_geom.head_dim;
  uint16_t k[256], v[256];
  for (size_t p = from; p < to; p++)
    for (uint32_t l = 0; l < k_geom.n_layers; l++) {
      unsigned var = p < PREFIX ? 0 : variant;
      for (uint32_t e = 0; e < te; e++) {
        k[e] = kv_at(p, l, 0, e, var);
        v[e] = kv_at(p, l, 1, e, var);
      }
      NEED(ckv_session_write_kv(s, p, l, k, v) == CKV_OK, "write_kv %zu", p);
    }
  float *attn = calloc(to, sizeof(float));
  for (size_t p = 0; p < to; p++)
    attn[p] = 1.f / (float)to;
  r = ckv_session_report(s, round, 0, attn, to, NULL);
  NEED(r == CKV_OK, "report: %s", ckv_strerror(r));
  free(attn);
}

/* Reads every position of s's view (draft blocks) and compares it with
 * what `want(pos)` wrote: returns the positions that differ or are missing;
 * *ret_seen: positions found. */
typedef unsigned (*variant_fn)(size_t pos, const void *ctx);
static size_t check_view(ckv_session *s, size_t n, variant_fn want,
                         const void *ctx, size_t *ret_seen) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(s, &v);
  NEED(r == CKV_OK, "view: %s", ckv_strerror(r));
  uint8_t *seen = calloc(n ? n : 1, 1);
  size_t bad = 0, found = 0;
  const uint32_t te = k_geom.n_kv_heads * k_geom.head_dim;
  for (size_t i = 0; i < v->n_draft; i++) {
    const uint8_t *base = v->draft[i].data;
    uint32_t cap = v->draft[i].capacity;
    const uint32_t *positions = ckv_block_positions_const(base);
    for (uint32_t slot = 0; slot < cap; slot++) {
      if (!ckv_block_slot_valid(base, slot))
        continue;
      uint32_t pos = positions[slot];
      if (pos >= n || seen[pos]) {
        bad++;
        continue;
      }
      seen[pos] = 1;
      found++;
      unsigned var = want(pos, ctx);
      for (uint32_t l = 0; l < k_geom.n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint16_t *x =
              (const uint16_t *)(base + ckv_draft_kv_offset(&k_geom, cap, l, kv,
                                                            slot));
          for (uint32_t e = 0; e < te; e++)
            if (x[e] != kv_at(pos, l, kv, e, var)) {
              bad++;
              goto next_slot;
            }
        }
    next_slot:;
    }
  }
  free(seen);
  *ret_seen = found;
  return bad + (n - found);
}

static unsigned own_after_prefix(size_t pos, const void *ctx) {
  return pos < PREFIX ? 0 : *(const unsigned *)ctx;
}

static void wait_file(const char *dir, const char *name) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (access(path, F_OK) != 0) {
    NEED(ckv_test_now_ms() <= end, "%s never appeared", path);
    usleep(5000);
  }
}

static void touch(const char *dir, const char *name) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f)
    fclose(f);
}

typedef struct share_ctx {
  const ckv_test_daemon *d;
} share_ctx;

typedef struct share_report {
  uint64_t matched, n_tokens;
  size_t bad_own,
      seen_own; /* the writer's check of its own view after the other wrote */
  size_t bad_before, bad_after,
      seen_after;                       /* B: before and after A's kill -9 */
  uint64_t lookup_other, matched_other; /* the other tenant */
  int write_shared; /* B: ckv_session_write_kv into a shared position */
} share_report;

static uint32_t *prefix_ids(void) {
  uint32_t *ids = malloc((PREFIX + 8) * sizeof(*ids));
  for (size_t p = 0; p < PREFIX + 8; p++)
    ids[p] = token_id(p, 0);
  return ids;
}

/* Process A: the prefix and 40 of its own (variant 1); waits for B, checks
 * its view, then lives until killed. */
static void proc_a(const void *vctx, void *vrep) {
  g_child = true;
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
  const share_ctx *x = vctx;
  share_report *rep = vrep;
  ckv_client *c = connect_to(x->d);
  ckv_session *s = open_s(c, "agent-a", "fp16", NULL, 0);
  write_tokens(s, 0, PREFIX, 1, 1);
  write_tokens(s, PREFIX, PREFIX + OWN, 1, 2);
  touch(x->d->dir, "a.ready");
  wait_file(x->d->dir, "b.ready");
  unsigned var = 1;
  rep->bad_own =
      check_view(s, PREFIX + OWN, own_after_prefix, &var, &rep->seen_own);
  FILE *f = fopen(strcat(strcpy((char[400]){0}, x->d->dir), "/a.result"), "w");
  if (f) {
    fprintf(f, "%zu %zu\n", rep->bad_own, rep->seen_own);
    fclose(f);
  }
  for (int i = 0; i < 60; i++)
    sleep(1); /* until kill -9 (or the test gives up) */
  _exit(4);
}

/* Process B: reuses A's prefix (sending 8 ids more than the prefix: a
 * partial block is never matched), writes 40 of its own (variant 2). */
static void proc_b(const void *vctx, void *vrep) {
  g_child = true;
  const share_ctx *x = vctx;
  share_report *rep = vrep;
  wait_file(x->d->dir, "a.ready");
  ckv_client *c = connect_to(x->d);
  uint32_t *ids = prefix_ids();
  ckv_session *s = open_s(c, "agent-b", "fp16", ids, PREFIX + 8);
  free(ids);
  rep->matched = ckv_session_matched_tokens(s);
  rep->n_tokens = ckv_session_tokens(s);
  uint16_t k[256] = {0};
  rep->write_shared = ckv_session_write_kv(s, 5, 0, k, k);
  write_tokens(s, PREFIX, PREFIX + OWN, 2, 1);
  unsigned var = 2;
  size_t seen;
  rep->bad_before = check_view(s, PREFIX + OWN, own_after_prefix, &var, &seen);
  touch(x->d->dir, "b.ready");
  wait_file(x->d->dir, "a.killed");
  rep->bad_after =
      check_view(s, PREFIX + OWN, own_after_prefix, &var, &rep->seen_after);
  /* one more round after A is gone: the daemon still serves B's blocks */
  float attn[PREFIX + OWN];
  for (size_t p = 0; p < PREFIX + OWN; p++)
    attn[p] = 1.f;
  if (ckv_session_report(s, 2, 0, attn, PREFIX + OWN, NULL) != CKV_OK)
    rep->bad_after += 1000000;
  ckv_session_close(s);
  ckv_client_free(c);
}

/* Another tenant, the same ids. */
static void proc_other(const void *vctx, void *vrep) {
  g_child = true;
  const share_ctx *x = vctx;
  share_report *rep = vrep;
  ckv_client *c = connect_to(x->d);
  uint32_t *ids = prefix_ids();
  uint64_t m = 99;
  if (ckv_client_lookup_prefix(c, ids, PREFIX, "m", "r1", &m) != CKV_OK)
    m = 98;
  rep->lookup_other = m;
  ckv_session *s = open_s(c, "agent-b", "fp16", ids, PREFIX);
  rep->matched_other = ckv_session_matched_tokens(s);
  free(ids);
  ckv_session_drop(s);
  ckv_client_free(c);
}

static unsigned long long draft_block_bytes(void) {
  return ckv_draft_block_bytes(&k_geom, 16);
}
static unsigned long long blocks_of(unsigned long long tokens) {
  return (tokens + 15) / 16;
}

Test(prefix_share, two_processes_share_prefix_once, .timeout = 60) {
  char text[256], cfg[400];
  /* with tenants configured, root needs one of its own */
  snprintf(text, sizeof text,
           "[tenant.main]\nuids = 0\n[tenant.other]\nuids = %u\n", OTHER_UID);
  char *cfgdir = ckv_test_write_config(text, cfg, sizeof cfg);
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", (const char *const[]){"--config", cfg, NULL});
  cr_assert_eq(
      chmod(d.dir, 0777),
      0); /* the other tenant's uid must reach the sockets and the files */
  share_ctx x = {.d = &d};
  int fa, fb;
  share_report ra = {0}, rb = {0}, ro = {0};
  pid_t pa = ckv_test_begin_as(0, 0, proc_a, &x, sizeof ra, &fa);
  pid_t pb = ckv_test_begin_as(0, 0, proc_b, &x, sizeof rb, &fb);
  wait_file(d.dir, "b.ready");
  wait_file(d.dir, "a.result");

  /* the prefix's bytes are held once */
  const unsigned long long db = draft_block_bytes(),
                           shared_blocks = PREFIX / 16;
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.bytes.shared"), shared_blocks * db,
               "bytes.shared");
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.tokens.shared"), 2ull * PREFIX,
               "tokens.shared (each session's)");
  unsigned long long held = (shared_blocks + 2 * blocks_of(OWN)) * db;
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), held,
               "the arena holds the prefix once");
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.bytes.total"), held);
  char *json = ckv_test_ctl(&d, (const char *const[]){"stats", "--json", NULL});
  cr_assert_not_null(strstr(json, "\"dedup_ratio\": "), "%s", json);
  double ratio = atof(strstr(json, "\"dedup_ratio\": ") + 15);
  double fp16 = 2.0 * (PREFIX + OWN) * k_geom.n_layers * k_geom.n_kv_heads *
                k_geom.head_dim * 2 * 2;
  cr_assert_float_eq(ratio, fp16 / (double)held, 1e-3, "dedup_ratio %f", ratio);
  free(json);

  /* A's own check, made after B wrote its tokens */
  char *res =
      ckv_test_read_file(strcat(strcpy((char[400]){0}, d.dir), "/a.result"));
  size_t a_bad = 99, a_seen = 0;
  cr_assert_eq(sscanf(res, "%zu %zu", &a_bad, &a_seen), 2);
  free(res);
  cr_assert_eq(a_bad, 0, "A reads %zu positions that are not its own values",
               a_bad);
  cr_assert_eq(a_seen, PREFIX + OWN);

  /* another tenant, the same tokens: nothing */
  ckv_test_run_as(OTHER_UID, OTHER_UID, proc_other, &x, &ro, sizeof ro,
                  DEADLINE_MS);
  cr_assert_eq(ro.lookup_other, 0, "another tenant's lookup matched %llu",
               (unsigned long long)ro.lookup_other);
  cr_assert_eq(ro.matched_other, 0);

  /* this tenant's lookup finds the whole blocks only */
  ckv_client *c = connect_to(&d);
  uint32_t *ids = prefix_ids();
  uint64_t m = 0;
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, PREFIX + 8, "m", "r1", &m),
               CKV_OK);
  cr_assert_eq(m, PREFIX);
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, PREFIX, "m", "r2", &m), CKV_OK);
  cr_assert_eq(m, 0, "another revision matched %llu", (unsigned long long)m);
  ids[100] ^= 1; /* a different token in block 6: blocks 0..5 match */
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, PREFIX, "m", "r1", &m), CKV_OK);
  cr_assert_eq(m, 96);
  free(ids);

  /* kill -9 of A: B reads the same bytes; A's session goes, the blocks stay */
  cr_assert_eq(kill(pa, SIGKILL), 0);
  ckv_test_child ca = ckv_test_collect(pa, fa, &ra, sizeof ra, DEADLINE_MS);
  cr_assert_eq(ca.status, 128 + SIGKILL);
  const char *drop[] = {"drop", "agent-a", NULL};
  free(ckv_test_ctl(&d, drop)); /* what the lease expiry would do, now */
  touch(d.dir, "a.killed");
  ckv_test_end_as(pb, fb, &rb, sizeof rb, DEADLINE_MS);
  cr_assert_eq(rb.matched, PREFIX, "B matched %llu",
               (unsigned long long)rb.matched);
  cr_assert_eq(rb.n_tokens, PREFIX);
  cr_assert_eq(rb.write_shared, CKV_ERR_RANGE,
               "a shared token's slot was writable (%d)", rb.write_shared);
  cr_assert_eq(rb.bad_before, 0, "B read %zu wrong positions before the kill",
               rb.bad_before);
  cr_assert_eq(rb.bad_after, 0, "B read %zu wrong positions after A's kill -9",
               rb.bad_after);
  cr_assert_eq(rb.seen_after, PREFIX + OWN);
  /* B closed (detached, kept): its blocks alone now, nothing shared */
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.bytes.shared"), 0);
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"),
               (shared_blocks + blocks_of(OWN)) * db);
  unsigned long long hits = 0, looked = 0;
  cr_assert_eq(ckv_test_stat(&d, "sessions"), 1);
  (void)hits;
  (void)looked;
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* ---- the index in the worker's process ---- */

/* The daemon's own answer (a LookupPrefix request, not the client's index). */
static uint64_t daemon_lookup(ckv_client *c, const uint32_t *ids, size_t n, const char *rev) {
  Commitkv__V1__LookupPrefix lp = COMMITKV__V1__LOOKUP_PREFIX__INIT;
  lp.token_ids.data = (uint8_t *)ids;
  lp.token_ids.len = n * 4;
  lp.model_id = "m";
  lp.model_revision = (char *)rev;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LOOKUP_PREFIX;
  req.lookup_prefix = &lp;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK, "%s", ckv_client_last_error(c));
  uint64_t m = rep->prefix_match->matched_tokens;
  ckv_rpc_free(rep);
  return m;
}

/* The client's lookup, which must be answered from its mapped index:
 * returns the match and adds n to *asked. */
static uint64_t local_lookup(ckv_client *c, const uint32_t *ids, size_t n, const char *rev, uint64_t *asked) {
  uint64_t before = __atomic_load_n(&c->local_lookup_tokens, __ATOMIC_RELAXED), m = 99999;
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, n, "m", rev, &m), CKV_OK, "%s", ckv_client_last_error(c));
  cr_assert_eq(__atomic_load_n(&c->local_lookup_tokens, __ATOMIC_RELAXED), before + n, "the lookup of %zu ids was not answered in this process", n);
  *asked += n;
  return m;
}

Test(prefix_share, worker_lookup_reads_the_published_index, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  cr_assert_not_null(c->pindex, "the client mapped no prefix index");
  uint32_t *ids = prefix_ids();
  uint64_t asked = 0, hit = 0;
  cr_assert_eq(local_lookup(c, ids, PREFIX, "r1", &asked), 0, "an empty tenant matched");
  ckv_session *a = open_s(c, "a", "fp16", NULL, 0);
  write_tokens(a, 0, PREFIX, 0, 1); /* reported: every whole block published */
  struct {
    size_t n, changed; /* changed: a position whose id differs (or PREFIX: none) */
    const char *rev;
    uint64_t want;
  } cases[] = {{PREFIX + 8, PREFIX, "r1", PREFIX}, {PREFIX, PREFIX, "r1", PREFIX}, {100, PREFIX, "r1", 96},
               {15, PREFIX, "r1", 0},          {0, PREFIX, "r1", 0},          {PREFIX, 100, "r1", 96},
               {PREFIX, 0, "r1", 0},            {PREFIX, PREFIX, "r2", 0},     {PREFIX, PREFIX, "", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].changed < PREFIX) ids[cases[i].changed] ^= 1;
    uint64_t here = local_lookup(c, ids, cases[i].n, cases[i].rev, &asked);
    uint64_t there = daemon_lookup(c, ids, cases[i].n, cases[i].rev);
    cr_assert_eq(here, there, "case %zu: the worker's index says %llu, the daemon %llu", i, (unsigned long long)here,
                 (unsigned long long)there);
    cr_assert_eq(here, cases[i].want, "case %zu matched %llu", i, (unsigned long long)here);
    hit += here;
    if (cases[i].changed < PREFIX) ids[cases[i].changed] ^= 1;
  }
  /* the worker's lookups are the tenant's once the heartbeat brings them (the
   * daemon's own lookups above counted at once) */
  unsigned long long rpc_asked = ckv_test_stat(&d, "tenants.0.prefix.lookup_tokens");
  unsigned long long rpc_hit = ckv_test_stat(&d, "tenants.0.prefix.hit_tokens");
  cr_assert_eq(ckv_client_heartbeat(c), CKV_OK);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.lookup_tokens"), rpc_asked + asked);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.hit_tokens"), rpc_hit + hit);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.index_keys"), PREFIX / 16);
  /* a heartbeat with more hits than lookups is refused, and counts nothing */
  Commitkv__V1__Heartbeat hb = COMMITKV__V1__HEARTBEAT__INIT;
  hb.prefix_lookup_tokens = 5;
  hb.prefix_hit_tokens = 6;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_HEARTBEAT;
  req.heartbeat = &hb;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_ERR_INVALID);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.lookup_tokens"), rpc_asked + asked);
  /* the index follows the blocks: dropped, they are matched no more */
  cr_assert_eq(ckv_session_drop(a), CKV_OK);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0);
  cr_assert_eq(local_lookup(c, ids, PREFIX, "r1", &asked), 0, "the worker's index still names freed blocks");
  cr_assert_eq(daemon_lookup(c, ids, PREFIX, "r1"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.index_keys"), 0);
  free(ids);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

/* A lookup of more ids than a session may hold is the daemon's to refuse
 * (CKV_ERR_LIMIT, as before the index was in the worker); within the
 * limit the worker answers it. */
Test(prefix_share, a_lookup_past_the_session_limit_is_refused, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", (const char *const[]){"--set", "daemon.max_tokens_per_session=1024", NULL});
  ckv_client *c = connect_to(&d);
  uint32_t *ids = prefix_ids();
  ckv_session *s = open_s(c, "a", "fp16", NULL, 0);
  write_tokens(s, 0, 512, 0, 1);
  uint64_t asked = 0, m = 0;
  cr_assert_eq(local_lookup(c, ids, 512, "r1", &asked), 512);
  cr_assert_eq(local_lookup(c, ids, 1024, "r1", &asked), 512);
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, 1025, "m", "r1", &m), CKV_ERR_LIMIT,
               "a lookup of 1025 ids past a limit of 1024 was answered (%llu)", (unsigned long long)m);
  cr_assert(strstr(ckv_client_last_error(c), "max_tokens_per_session"), "%s", ckv_client_last_error(c));
  free(ids);
  ckv_session_drop(s);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

/* More blocks than the first index holds (4096 slots, 3/4 of them used at
 * most): the daemon replaces it by one twice its size, the worker's next
 * lookup finds the old one superseded, fetches the new one on the attach
 * socket and answers in its own process, as the daemon would. */
Test(prefix_share, a_full_index_grows_and_workers_fetch_it, .timeout = 60) {
  enum { BLOCKS = 3500, N = BLOCKS * 16 };
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.index_slots"), 4096, "the first index (made at attach)");
  uint32_t *ids = malloc(N * sizeof(*ids));
  for (size_t p = 0; p < N; p++) ids[p] = token_id(p, p < PREFIX ? 0 : 3);
  uint64_t asked = 0;
  cr_assert_eq(local_lookup(c, ids, N, "r1", &asked), 0);
  ckv_session *s = open_s(c, "big", "fp16", NULL, 0);
  write_tokens(s, 0, N, 3, 1);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.index_keys"), BLOCKS);
  cr_assert_eq(ckv_test_stat(&d, "tenants.0.prefix.index_slots"), 8192, "the full index was not replaced");
  char *json = ckv_test_ctl(&d, (const char *const[]){"stats", "--json", NULL});
  cr_assert_not_null(strstr(json, "\"index_complete\": true"), "the grown index is not complete: %s", json);
  free(json);
  cr_assert_eq(local_lookup(c, ids, N, "r1", &asked), N, "the worker did not fetch the grown index");
  cr_assert_eq(daemon_lookup(c, ids, N, "r1"), N);
  ids[N / 2] ^= 1;
  cr_assert_eq(local_lookup(c, ids, N, "r1", &asked), N / 2);
  cr_assert_eq(daemon_lookup(c, ids, N, "r1"), N / 2);
  free(ids);
  ckv_session_drop(s);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

/* ---- forks ---- */

typedef struct fork_want {
  size_t at;
  unsigned tail;
} fork_want;
static unsigned fork_variant(size_t pos, const void *ctx) {
  const fork_want *w = ctx;
  return pos < w->at ? 0 : w->tail;
}

Test(prefix_share, fork_reads_parent_prefix_then_diverges, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  ckv_session *p = open_s(c, "parent", "fp16", NULL, 0);
  /* the parent: 100 tokens of variant 0 (below PREFIX) */
  write_tokens(p, 0, 100, 0, 1);
  ckv_session *f = NULL;
  int r = ckv_session_fork(p, "child", 37, &f);
  cr_assert_eq(r, CKV_OK, "fork: %s (%s)", ckv_strerror(r),
               ckv_client_last_error(c));
  cr_assert_eq(ckv_session_matched_tokens(f), 32, "whole blocks shared");
  cr_assert_eq(ckv_session_tokens(f), 37);
  /* both go on, differently: positions >= PREFIX are each writer's variant */
  ckv_session_close(f);
  f = NULL;
  ckv_session_options ro = {
      .resume = true, .model_id = "m", .model_revision = "r1"};
  cr_assert_eq(ckv_session_open(c, "child", NULL, &ro, &f), CKV_OK);
  /* the child's own tokens: ids and K/V of variant 5 at 37.. (write_tokens
   * keys variants by PREFIX; use the real positions here) */
  uint32_t n = 20;
  uint64_t first;
  cr_assert_eq(ckv_session_append(f, n, NULL, NULL, NULL, NULL, &first),
               CKV_OK);
  cr_assert_eq(first, 37);
  const uint32_t te = k_geom.n_kv_heads * k_geom.head_dim;
  uint16_t k[256], v[256];
  for (size_t pos = 37; pos < 57; pos++)
    for (uint32_t l = 0; l < k_geom.n_layers; l++) {
      for (uint32_t e = 0; e < te; e++) {
        k[e] = kv_at(pos, l, 0, e, 5);
        v[e] = kv_at(pos, l, 1, e, 5);
      }
      cr_assert_eq(ckv_session_write_kv(f, pos, l, k, v), CKV_OK);
    }
  write_tokens(
      p, 100, 120, 0,
      2); /* the parent's later tokens (variant 0 too, positions its own) */
  size_t seen;
  fork_want wc = {.at = 37, .tail = 5};
  cr_assert_eq(check_view(f, 57, fork_variant, &wc, &seen), 0,
               "the fork does not read parent[0,37) + its own");
  cr_assert_eq(seen, 57);
  fork_want wp = {.at = 1000, .tail = 0};
  cr_assert_eq(check_view(p, 120, fork_variant, &wp, &seen), 0,
               "the parent's bytes changed");
  cr_assert_eq(seen, 120);
  /* shared: the two whole blocks, in both sessions' counts */
  const unsigned long long db = draft_block_bytes();
  cr_assert_eq(ckv_test_stat(&d, "tokens.shared"), 64);
  cr_assert_eq(ckv_test_stat(&d, "bytes.shared"), 2 * db);
  /* the fork's tail block is its own: parent 8 blocks (120 tokens), child 2
   * shared + 2 own */
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), (8ull + 2) * db);
  /* refusals: an existing id, a position past what the parent reported, no
   * parent */
  ckv_session *g = NULL;
  cr_assert_eq(ckv_session_fork(p, "child", 10, &g), CKV_ERR_EXISTS);
  cr_assert_eq(ckv_session_fork(p, "child2", 121, &g), CKV_ERR_RANGE);
  cr_assert_eq(ckv_session_fork(f, "child3", 57, &g), CKV_ERR_STATE,
               "unreported tokens forked");
  ckv_session_drop(f);
  ckv_session_drop(p);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0,
               "blocks left after both drops");
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

Test(prefix_share, forked_snapshot_restores_alone, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  ckv_session *p = open_s(c, "parent", "fp16", NULL, 0);
  write_tokens(p, 0, 64, 0, 1);
  ckv_session *f = NULL;
  cr_assert_eq(ckv_session_fork(p, "child", 40, &f), CKV_OK, "%s",
               ckv_client_last_error(c));
  cr_assert_eq(ckv_session_matched_tokens(f), 32);
  /* the fork's bytes as they are */
  const ckv_view *v = NULL;
  cr_assert_eq(ckv_session_view(f, &v), CKV_OK);
  size_t seen;
  fork_want w = {.at = 40, .tail = 0};
  cr_assert_eq(check_view(f, 40, fork_variant, &w, &seen), 0);
  uint64_t bytes = 0;
  cr_assert_eq(ckv_session_save(f, "forked", false, &bytes), CKV_OK, "save: %s",
               ckv_client_last_error(c));
  cr_assert_gt(bytes, 0);
  ckv_session_drop(f);
  ckv_session_drop(p);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0,
               "shared blocks outlived every holder");
  ckv_session *back = NULL;
  int r = ckv_session_restore(c, "back", "forked", NULL, &back);
  cr_assert_eq(r, CKV_OK, "restore: %s (%s)", ckv_strerror(r),
               ckv_client_last_error(c));
  cr_assert_eq(ckv_session_tokens(back), 40);
  cr_assert_eq(check_view(back, 40, fork_variant, &w, &seen), 0,
               "the restored fork differs from what was saved");
  cr_assert_eq(seen, 40);
  cr_assert_eq(ckv_test_stat(&d, "bytes.shared"), 0,
               "a restored session shares nothing");
  ckv_session_drop(back);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

/* ---- compressed once ---- */

#define CPREFIX 512u /* 32 draft blocks */

/* The payload bytes of s's view blocks that hold positions below n, as one
 * string per block keyed by the block's first position and format, sorted
 * (what a bit-for-bit comparison of two sessions' prefixes needs; block ids
 * and headers differ between copies).  Returns a malloc'd buffer. */
typedef struct block_bytes {
  uint32_t first, format;
  uint64_t id;
  size_t held; /* positions below n it holds */
  size_t len;
  uint8_t *data;
} block_bytes;

static int by_first(const void *x, const void *y) {
  const block_bytes *a = x, *b = y;
  return a->first < b->first ? -1 : a->first > b->first;
}

static block_bytes *prefix_payloads(ckv_session *s, size_t n, size_t *ret_n) {
  const ckv_view *v = NULL;
  NEED(ckv_session_view(s, &v) == CKV_OK, "view");
  const ckv_block_view *lists[4] = {v->draft, v->staged, v->committed, v->cold};
  const size_t counts[4] = {v->n_draft, v->n_staged, v->n_committed, v->n_cold};
  block_bytes *out = calloc(v->n_draft + v->n_staged + v->n_committed + v->n_cold + 1, sizeof(*out));
  size_t k = 0;
  for (int l = 0; l < 4; l++)
    for (size_t i = 0; i < counts[l]; i++) {
      const ckv_block_view *b = &lists[l][i];
      const uint32_t *positions = ckv_block_positions_const(b->data);
      uint32_t first = UINT32_MAX;
      size_t held = 0;
      for (uint32_t slot = 0; slot < b->capacity; slot++)
        if (ckv_block_slot_valid(b->data, slot) && positions[slot] < n) {
          held++;
          if (positions[slot] < first) first = positions[slot];
        }
      if (!held) continue;
      size_t head = ckv_block_payload_offset(b->capacity);
      out[k] = (block_bytes){first, b->format, b->id, held, b->bytes - head, malloc(b->bytes - head)};
      memcpy(out[k].data, (const uint8_t *)b->data + head, b->bytes - head);
      k++;
    }
  qsort(out, k, sizeof(*out), by_first);
  *ret_n = k;
  return out;
}

static void payloads_free(block_bytes *b, size_t n) {
  for (size_t i = 0; i < n; i++) free(b[i].data);
  free(b);
}

/* The ids of the blocks that hold positions [0, n) in s's view, in
 * position order, into ids[] (room for n); returns how many positions they
 * hold. */
static size_t prefix_block_ids(ckv_session *s, size_t n, uint64_t *ids, size_t *ret_n_ids) {
  size_t nb, found = 0;
  block_bytes *b = prefix_payloads(s, n, &nb);
  for (size_t i = 0; i < nb; i++) {
    ids[i] = b[i].id;
    found += b[i].held;
  }
  payloads_free(b, nb);
  *ret_n_ids = nb;
  return found;
}

/* Reports a round over s's n tokens, attention spread evenly. */
static void report_even(ckv_session *s, size_t n, uint64_t round) {
  float *attn = malloc(n * sizeof(float));
  for (size_t p = 0; p < n; p++)
    attn[p] = 1.f / (float)n;
  int r = ckv_session_report(s, round, 0, attn, n, NULL);
  NEED(r == CKV_OK, "report: %s", ckv_strerror(r));
  free(attn);
}

/* The compressor settles and a's and b's readers acknowledge (so the draft
 * blocks go): returns the tenant's shared bytes once they are at most a
 * third of fp16 and every held byte is counted, or as they are after 10 s. */
static unsigned long long wait_compressed_once(const ckv_test_daemon *d, ckv_session *a, ckv_session *b,
                                               unsigned long long fp16) {
  cr_assert_eq(ckv_test_wait_stat(d, "compress_queue", 0, 5000), 0);
  unsigned long long shared = 0;
  for (long long end = ckv_test_now_ms() + 10000; ckv_test_now_ms() < end; usleep(20000)) {
    const ckv_view *v;
    NEED(ckv_session_view(a, &v) == CKV_OK && ckv_session_ack(a, v->epoch, NULL) == CKV_OK, "a: view/ack");
    NEED(ckv_session_view(b, &v) == CKV_OK && ckv_session_ack(b, v->epoch, NULL) == CKV_OK, "b: view/ack");
    shared = ckv_test_stat(d, "bytes.shared");
    if (shared && shared <= fp16 / 3 && ckv_test_stat(d, "bytes.total") == ckv_test_stat(d, "arenas.0.bytes_used"))
      break;
  }
  return shared;
}

/* Two commitkv sessions on a 512-token prefix (an fp16 keeper wrote it and
 * goes once both hold it): as their judges stage and commit the prefix, its
 * blocks are compressed once, for both (the same block ids in both views,
 * the tenant's shared bytes a fraction of the FP16 ones), and a session
 * opened afterwards links the compressed blocks: it matches the whole
 * prefix and starts with those tokens past draft.  Under the old freeze
 * rule the shared bytes stay the FP16 bytes: the bound fails it. */
Test(prefix_share, a_shared_prefix_is_compressed_once, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  uint32_t *ids = prefix_ids();
  ckv_session *keeper = open_s(c, "keeper", "fp16", NULL, 0);
  write_tokens(keeper, 0, CPREFIX, 0, 1);
  ckv_session *a = open_s(c, "a", "commitkv", ids, CPREFIX);
  ckv_session *b = open_s(c, "b", "commitkv", ids, CPREFIX);
  cr_assert_eq(ckv_session_matched_tokens(a), CPREFIX);
  cr_assert_eq(ckv_session_matched_tokens(b), CPREFIX);
  cr_assert_eq(ckv_session_drop(keeper), CKV_OK);
  const unsigned long long db = draft_block_bytes(), prefix_fp16 = CPREFIX / 16 * db;
  for (uint64_t round = 1; round <= 12; round++) {
    report_even(a, CPREFIX, round);
    report_even(b, CPREFIX, round);
  }
  unsigned long long shared = wait_compressed_once(&d, a, b, prefix_fp16);
  cr_log_info("compressed once: shared %llu bytes of the prefix's FP16 %llu (%.3f)", shared, prefix_fp16,
              (double)shared / (double)prefix_fp16);
  /* measured 0.22 (the sink block FP16, the rest ROT2 at the warm tokens' bits) */
  cr_assert(shared > 0 && shared <= prefix_fp16 / 3, "shared bytes %llu, prefix FP16 %llu: not compressed", shared,
            prefix_fp16);
  cr_assert_eq(ckv_test_stat(&d, "tokens.shared"), 2ull * CPREFIX, "every prefix token is still shared by both");
  cr_assert_eq(ckv_test_stat(&d, "bytes.total"), ckv_test_stat(&d, "arenas.0.bytes_used"),
               "bytes held but not counted (old draft blocks left over?)");
  /* the same blocks in both views: one copy */
  uint64_t ia[64], ib[64];
  size_t na, nb;
  cr_assert_eq(prefix_block_ids(a, CPREFIX, ia, &na), CPREFIX);
  cr_assert_eq(prefix_block_ids(b, CPREFIX, ib, &nb), CPREFIX);
  cr_assert_eq(na, nb);
  cr_assert_arr_eq(ia, ib, na * sizeof(*ia), "a and b read the prefix from different blocks");
  cr_assert_lt(na, CPREFIX / 16, "the prefix is still in its %u draft blocks", CPREFIX / 16);
  /* the worker's index names the compressed blocks as the daemon does */
  uint64_t here = 0;
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, CPREFIX, "m", "r1", &here), CKV_OK);
  cr_assert_eq(here, CPREFIX, "the worker's index matched %llu of the compressed prefix", (unsigned long long)here);
  cr_assert_eq(daemon_lookup(c, ids, CPREFIX, "r1"), CPREFIX);
  /* a session opened now links the compressed blocks */
  ckv_session *late = open_s(c, "late", "commitkv", ids, CPREFIX);
  cr_assert_eq(ckv_session_matched_tokens(late), CPREFIX, "the compressed prefix is not found");
  uint64_t il[64];
  size_t nl;
  cr_assert_eq(prefix_block_ids(late, CPREFIX, il, &nl), CPREFIX);
  cr_assert_eq(nl, na);
  cr_assert_arr_eq(il, ia, na * sizeof(*ia), "the late session reads other blocks");
  cr_assert_eq(ckv_test_stat(&d, "bytes.shared"), shared, "linking copied bytes");
  /* a snapshot of a holder restores alone, its compressed prefix bit for bit */
  size_t n_before;
  block_bytes *before = prefix_payloads(a, CPREFIX, &n_before);
  uint64_t saved = 0;
  cr_assert_eq(ckv_session_save(a, "compressed", false, &saved), CKV_OK, "save: %s", ckv_client_last_error(c));
  ckv_session_drop(late);
  ckv_session_drop(a);
  ckv_session_drop(b);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0, "blocks left after every drop");
  ckv_session *back = NULL;
  int r = ckv_session_restore(c, "back", "compressed", NULL, &back);
  cr_assert_eq(r, CKV_OK, "restore: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  size_t n_after;
  block_bytes *after = prefix_payloads(back, CPREFIX, &n_after);
  /* every compressed block comes back with its bytes (the restored session is private: it moves the
   * tokens the shared draft blocks held for it, the sinks' block and the last one, on its own) */
  size_t compressed = 0;
  for (size_t i = 0; i < n_before; i++) {
    if (before[i].format == CKV_FORMAT_DRAFT) continue;
    compressed++;
    const block_bytes *m = NULL;
    for (size_t j = 0; j < n_after && !m; j++)
      if (after[j].first == before[i].first) m = &after[j];
    cr_assert_not_null(m, "the block from position %u did not come back", before[i].first);
    cr_assert_eq(m->format, before[i].format);
    cr_assert(m->len == before[i].len && memcmp(m->data, before[i].data, before[i].len) == 0,
              "the block from position %u restored other bytes", before[i].first);
  }
  cr_assert_gt(compressed, 0);
  cr_assert_eq(ckv_session_tokens(back), CPREFIX);
  cr_assert_eq(ckv_test_stat(&d, "bytes.shared"), 0, "a restored session shares nothing");
  payloads_free(before, n_before);
  payloads_free(after, n_after);
  ckv_session_drop(back);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0, "blocks left after the restore's drop");
  free(ids);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

/* ---- nothing writes a shared block ---- */

static unsigned zero_variant(size_t pos, const void *ctx) {
  (void)pos;
  (void)ctx;
  return 0;
}

/* A commitkv writer opened with reuse_prefix (given CPREFIX ids, it
 * matches nothing: the tenant holds no prefix yet) and its judge's share
 * grace: share_grace_rounds (`grace`; < 0: the default). */
static ckv_session *open_writer(ckv_client *c, const char *id, const uint32_t *ids, double grace) {
  const char *names[] = {"share_grace_rounds"};
  ckv_session_options o = {.policy = "commitkv", .model_id = "m", .model_revision = "r1", .token_ids = ids,
                           .n_token_ids = CPREFIX, .reuse_prefix = true, .param_names = names,
                           .param_values = &grace, .n_params = grace < 0 ? 0 : 1};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geom, &o, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_matched_tokens(s), 0);
  return s;
}

/* What the tenant's index matches of ids now: the worker's answer, checked
 * against the daemon's. */
static uint64_t matched_now(ckv_client *c, const uint32_t *ids) {
  uint64_t m = 0;
  cr_assert_eq(ckv_client_lookup_prefix(c, ids, CPREFIX, "m", "r1", &m), CKV_OK);
  cr_assert_eq(m, daemon_lookup(c, ids, CPREFIX, "r1"));
  return m;
}

/* The first writer of a prefix is a commitkv session (no fp16 keeper): its
 * published blocks wait share_grace_rounds (default 4) of its rounds in
 * draft while no other session holds them, so a session opened within them
 * links the whole prefix, and once two hold it it is compressed once; past
 * the grace with no second holder they are the writer's again (its judge
 * moves them, the index forgets them).  Without the grace (0, the old
 * behaviour) the writer's first judged round stages the prefix it just
 * published and almost nothing matches: the check that the grace is what
 * makes the match. */
Test(prefix_share, a_commitkv_writer_prefix_waits_for_a_second_holder, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  uint32_t *ids = prefix_ids();
  /* no grace: the writer's judge takes its blocks back at once */
  ckv_session *w0 = open_writer(c, "w0", ids, 0);
  write_tokens(w0, 0, CPREFIX, 0, 1);
  report_even(w0, CPREFIX, 2);
  uint64_t m0 = matched_now(c, ids);
  cr_log_info("without the grace a commitkv writer's prefix matches %llu of %u", (unsigned long long)m0, CPREFIX);
  cr_assert_lt(m0, CPREFIX / 4, "without the grace %llu tokens matched", (unsigned long long)m0);
  cr_assert_eq(ckv_session_drop(w0), CKV_OK);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0);
  /* the default grace, nobody comes: whole for 4 rounds, then the writer's */
  ckv_session *w1 = open_writer(c, "w1", ids, -1);
  write_tokens(w1, 0, CPREFIX, 0, 1);
  for (uint64_t round = 2; round <= 4; round++) {
    report_even(w1, CPREFIX, round);
    cr_assert_eq(matched_now(c, ids), CPREFIX, "round %llu: the prefix is not matched within the grace",
                 (unsigned long long)round);
  }
  for (uint64_t round = 5; round <= 6; round++) report_even(w1, CPREFIX, round);
  uint64_t m1 = matched_now(c, ids);
  cr_assert_lt(m1, CPREFIX / 4, "past the grace %llu tokens still matched", (unsigned long long)m1);
  cr_assert_eq(ckv_session_drop(w1), CKV_OK);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0);
  /* a second session within the grace: one copy, compressed once for both */
  ckv_session *w = open_writer(c, "w", ids, -1);
  write_tokens(w, 0, CPREFIX, 0, 1);
  report_even(w, CPREFIX, 2);
  ckv_session *b = open_s(c, "b", "commitkv", ids, CPREFIX);
  cr_assert_eq(ckv_session_matched_tokens(b), CPREFIX, "the second session matched %llu",
               (unsigned long long)ckv_session_matched_tokens(b));
  for (uint64_t round = 3; round <= 14; round++) {
    report_even(w, CPREFIX, round);
    report_even(b, CPREFIX, round - 2);
  }
  const unsigned long long prefix_fp16 = CPREFIX / 16 * draft_block_bytes();
  unsigned long long shared = wait_compressed_once(&d, w, b, prefix_fp16);
  cr_assert(shared > 0 && shared <= prefix_fp16 / 3, "shared bytes %llu, prefix FP16 %llu: not compressed once",
            shared, prefix_fp16);
  cr_assert_eq(ckv_test_stat(&d, "tokens.shared"), 2ull * CPREFIX, "the prefix is no longer shared by both");
  cr_assert_eq(matched_now(c, ids), CPREFIX, "the compressed prefix is not matched");
  ckv_session_drop(b);
  ckv_session_drop(w);
  free(ids);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}

Test(prefix_share, no_protocol_write_into_shared_block, .timeout = 60) {
  ckv_test_daemon d;
  ckv_test_start_host(&d, "256M", NULL);
  ckv_client *c = connect_to(&d);
  ckv_session *a = open_s(c, "a", "fp16", NULL, 0);
  write_tokens(a, 0, 64, 0, 1);
  uint32_t ids[64];
  for (size_t p = 0; p < 64; p++)
    ids[p] = token_id(p, 0);
  /* int8: the judge stages every token it may */
  ckv_session *b = open_s(c, "b", "int8", ids, 64);
  cr_assert_eq(ckv_session_matched_tokens(b), 64);
  /* the shared blocks' ids, from b's first view */
  const ckv_view *v = NULL;
  cr_assert_eq(ckv_session_view(b, &v), CKV_OK);
  cr_assert_eq(v->n_draft, 4);
  uint64_t shared_ids[4];
  for (int i = 0; i < 4; i++)
    shared_ids[i] = v->draft[i].id;
  /* b's appends land in a new block of its own */
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens at = COMMITKV__V1__APPEND_TOKENS__INIT;
  at.session_id = "b";
  at.count = 20;
  req.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  req.append_tokens = &at;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
  cr_assert_eq(rep->tokens_appended->first_position, 64);
  for (size_t i = 0; i < rep->tokens_appended->n_slots; i++)
    for (int j = 0; j < 4; j++)
      cr_assert_neq(rep->tokens_appended->slots[i]->block_id, shared_ids[j],
                    "an append got a slot in a shared block");
  ckv_rpc_free(rep);
  /* rounds: b's judge wants every token staged; the shared ones stay */
  float attn[84];
  for (int i = 0; i < 84; i++)
    attn[i] = 0.f;
  for (uint64_t round = 1; round <= 6; round++)
    cr_assert_eq(ckv_session_report(b, round, 0, attn, 84, NULL), CKV_OK);
  cr_assert_eq(ckv_session_view(b, &v), CKV_OK);
  int still = 0;
  for (size_t i = 0; i < v->n_draft; i++)
    for (int j = 0; j < 4; j++)
      still += v->draft[i].id == shared_ids[j];
  cr_assert_eq(still, 4, "a shared block left b's view (moved or written)");
  size_t seen;
  cr_assert_eq(check_view(a, 64, zero_variant, NULL, &seen), 0,
               "a's bytes changed under b's lifecycle");
  cr_assert_eq(seen, 64);
  cr_assert_eq(ckv_test_stat(&d, "tokens.shared"), 128);
  /* malformed lookups are refused with a code */
  Commitkv__V1__LookupPrefix lp = COMMITKV__V1__LOOKUP_PREFIX__INIT;
  uint8_t three[3] = {1, 2, 3};
  lp.token_ids.data = three;
  lp.token_ids.len = 3;
  Commitkv__V1__Request lreq = COMMITKV__V1__REQUEST__INIT;
  lreq.body_case = COMMITKV__V1__REQUEST__BODY_LOOKUP_PREFIX;
  lreq.lookup_prefix = &lp;
  cr_assert_eq(ckv_rpc(c, &lreq, &rep), CKV_ERR_INVALID);
  cr_assert_not_null(strstr(ckv_client_last_error(c), "uint32"), "%s",
                     ckv_client_last_error(c));
  ckv_session_drop(b);
  ckv_session_drop(a);
  cr_assert_eq(ckv_test_wait_stat(&d, "arenas.0.bytes_used", 0, 5000), 0);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
}
