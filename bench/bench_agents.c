/* bench_agents.c - `commitkv-bench agents`: N agents of one tenant on a
 * common system prompt plus tool definitions, what each way of holding their
 * KV cache costs (issue 41, "What to measure").
 *
 * Workload: --agents N (64) agents, each with the same --prefix-tokens P
 * (8192) tokens of prefix (the same pseudo-random token ids and the same K/V
 * for every agent: ids and values are functions of the position only) and
 * --private-tokens Q (2048) tokens of its own (ids and values seeded by the
 * agent), appended in turns of --turn-tokens (256), one ReportRound per turn
 * with a deterministic attention pattern (one token in 16 drawn to, the rest
 * not), then --settle-rounds (6) rounds without new tokens so the lifecycle
 * (staged -> committed after persistence_rounds) runs its course.  A share
 * --fork-share F (0.25) of the agents are sub-agents.  Geometry --layers x
 * --kv-heads x --head-dim (8 x 8 x 128, FP16).  Every policy runs in its own
 * real commitkvd (beside this binary, or --daemon), one tenant, one client.
 *
 *  - fp16-private: computed, never allocated: agents x (P + Q) x layers x
 *    kv_heads x head_dim x 2 (K, V) x 2 bytes.
 *  - commitkv-private: every agent opens its own session with the commitkv
 *    policy and no sharing, appends P + Q tokens (with ids), writes their K/V
 *    (ckv_session_write_kv) and reports its rounds.
 *  - commitkv-shared: a prefix session (the fp16 policy) writes the prefix's
 *    whole draft blocks once (m = P rounded down to 16-token blocks; a
 *    partial block is never shared) and reports a round past them, so they
 *    publish.  Each top-level agent (agents less sub-agents) calls
 *    ckv_client_lookup_prefix (timed), opens with token_ids + reuse_prefix,
 *    appends only the unmatched rest of the prefix (P - m) and reports it;
 *    right then its sub-agents (sub-agent top + j belongs to agent j % top)
 *    are ckv_session_fork of it at P (whole blocks shared, the partial tail
 *    copied: it is still draft, inside the parent's recent window; were it
 *    not, the fork is made at m and the child prefills the rest, counted in
 *    forks_at_block).  Then the parent's turns, then each child's.  The
 *    prefix session is dropped once two agents hold the prefix (an fp16
 *    holder would keep the shared blocks FP16 for good): from then on the
 *    agents' own states decide its format, and agents opened later link
 *    the compressed blocks.  Why a prefix session and not agent 0 itself:
 *    the bench's agents run all their turns before the next agent opens, far
 *    past share_grace_rounds (the rounds a commitkv writer opened with
 *    reuse_prefix keeps a freshly published block for a second holder;
 *    without it the writer's first judged round stages its prefix and
 *    nothing is ever matched).  The bench measures the grace each run
 *    (first_writer_commitkv_matched: a lookup after a commitkv session
 *    opened with reuse_prefix reported the prefix: the whole blocks).
 *
 * After the last agent the daemon's compressor is left to settle (queue
 * empty, pending tokens unchanged for SETTLE_QUIET_MS), every session
 * acknowledges its newest view epoch (retired blocks are freed only then;
 * every agent also acknowledges each round's epoch as it goes), and the
 * tenant's figures are read from Stats: bytes = bytes.total (every byte its
 * blocks hold, shared blocks once, cold blocks of demoted tokens too).
 * The prefix counts once, compressed once as the agents' states allow
 * (store/shared_moves.h; the first block, with the sink tokens, stays
 * draft).  Then
 * --lookups L (1000) more lookups of the prefix with every agent's session
 * live: lookup_us_p99 is over every lookup (the top-level agents' and
 * these), client-side round trips.
 *
 * prefill_tokens_saved (commitkv-shared) = tokens the agents hold at open
 * (ckv_session_matched_tokens after a reuse; ckv_session_tokens after a
 * fork) less the prefix session's m: tokens no agent had to prefill.  With
 * S sub-agents it is (agents - 1) x m + S x (P - m).  tokens_written + saved
 * = agents x (P + Q).
 *
 * --quick: 16 agents, P 488 (a 8-token tail past 30 whole blocks), Q 128 in
 * turns of 64, 200 lookups, geometry 2 x 2 x 64: about a second (the
 * integration test's sizes).  --memory caps the daemon's arena (default: a
 * quarter of the FP16 figure plus two agents in draft; it is backed only as
 * sessions take memory).  --verbose lists every session's figures.
 *
 * Nothing here asserts speed or a ratio: the aims (commitkv-shared <= 0.06 of
 * fp16-private, lookup p99 <= 100 us) are printed beside the figures.  A
 * table for people; --json prints one object. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_daemon.h"
#include "client/rpc.h"
#include "commitkv/commitkv.h"
#include "kernels/quant.h"

#define VALUE_ROWS 61u         /* distinct K/V rows; a token's row is a hash of its id, layer and K/V */
#define SETTLE_QUIET_MS 400    /* compressor idle and pending tokens unchanged this long: settled */
#define SETTLE_MAX_MS 180000   /* give up waiting (the figures are read anyway, and the wait is reported) */
#define DRAFT_BLOCK_TOKENS 16u  /* the daemon's default draft block (docs/prefix-sharing.md: D) */
#define AIM_RATIO 0.06
#define AIM_LOOKUP_US 100.0
#define MODEL_ID "bench-agents"
#define MODEL_REV "1"

typedef struct agents_opts {
  unsigned agents, prefix, priv, turn, settle_rounds, lookups;
  double fork_share;
  ckv_geometry g;
  const char *daemon, *memory;
  bool json, quick;
} agents_opts;

/* One policy's row. */
typedef struct policy_fig {
  const char *name;
  bool measured;                 /* false: computed (fp16-private) */
  uint64_t bytes, shared_bytes;  /* tenant bytes.total, bytes.shared */
  uint64_t prefill_saved;
  uint64_t tokens_written;       /* K/V the bench wrote (prefill done) */
  double lookup_p50, lookup_p99, lookup_max; /* us; < 0: no lookup */
  size_t n_lookups;
  double settle_ms, run_s;
  bool settled;
} policy_fig;

typedef struct shared_extra {
  uint64_t matched;       /* what a reuse open matched (each agent: the same) */
  uint64_t first_writer_matched;
  unsigned forks, reuses; /* sub-agents forked / agents opened with reuse_prefix */
  unsigned forks_at_block; /* forks made at the last whole block (the tail was no longer draft) */
} shared_extra;

static bool g_verbose;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Token id at `pos` of `agent` (the prefix's ids are everyone's). */
static uint32_t token_id(const agents_opts *o, unsigned agent, uint64_t pos) {
  uint64_t who = pos < o->prefix ? 0 : agent + 1u;
  return (uint32_t)(mix64(who << 40 ^ pos) % 32000u);
}

/* The attention a round gives position p of n: one token in 16 (by its
 * position, stable over rounds) draws 8x, the rest 0.5x; sums to about 1. */
static float attn_at(uint64_t p, size_t n) {
  return (float)((mix64(p * 31u + 7u) % 16u == 0 ? 8.0 : 0.5) / (double)n);
}

/* ---- the K/V values -------------------------------------------------------- */

typedef struct kv_table {
  size_t row;     /* elements per token-layer row: kv_heads x head_dim */
  uint16_t *rows; /* [VALUE_ROWS][row], FP16 in [-1, 1] */
} kv_table;

static int kv_table_init(kv_table *t, const ckv_geometry *g) {
  t->row = (size_t)g->n_kv_heads * g->head_dim;
  t->rows = malloc(VALUE_ROWS * t->row * sizeof(uint16_t));
  if (!t->rows) return -ENOMEM;
  uint64_t x = 4101;
  for (size_t i = 0; i < VALUE_ROWS * t->row; i++) {
    x = mix64(x);
    t->rows[i] = ckv_f32_to_f16((float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0));
  }
  return 0;
}

static const uint16_t *kv_row(const kv_table *t, uint32_t id, uint32_t layer, int kv) {
  return t->rows + (mix64((uint64_t)id * 131u + layer * 2u + (unsigned)kv) % VALUE_ROWS) * t->row;
}

/* ---- sessions --------------------------------------------------------------- */

typedef struct agent_run {
  const agents_opts *o;
  const kv_table *kv;
  ckv_client *c;
  float *attn; /* [prefix + priv] */
  uint64_t written;
} agent_run;

/* Appends positions [from, to) of `agent` (roles: system for the prefix,
 * user / assistant by turn; a turn-start tag on each turn's first token) with
 * their ids and writes their K/V. */
static int append_tokens(agent_run *ar, ckv_session *s, unsigned agent, uint64_t from, uint64_t to) {
  const agents_opts *o = ar->o;
  uint32_t n = (uint32_t)(to - from);
  if (!n) return 0;
  uint32_t *ids = malloc(n * sizeof(*ids));
  uint8_t *roles = malloc(n), *tags = malloc(n);
  int r = ids && roles && tags ? 0 : -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < n; i++) {
    uint64_t p = from + i;
    ids[i] = token_id(o, agent, p);
    uint64_t turn = p < o->prefix ? 0 : (p - o->prefix) / o->turn;
    roles[i] = p < o->prefix ? CKV_ROLE_SYSTEM : turn % 2 ? CKV_ROLE_ASSISTANT : CKV_ROLE_USER;
    tags[i] = p == 0 || (p >= o->prefix && (p - o->prefix) % o->turn == 0) ? CKV_TAG_TURN_START : 0;
  }
  uint64_t first = 0;
  if (r == 0) r = ckv_session_append(s, n, roles, tags, NULL, ids, &first);
  if (r == 0 && first != from) r = CKV_ERR_STATE;
  for (uint32_t i = 0; r == 0 && i < n; i++)
    for (uint32_t l = 0; r == 0 && l < o->g.n_layers; l++)
      r = ckv_session_write_kv(s, from + i, l, kv_row(ar->kv, ids[i], l, 0), kv_row(ar->kv, ids[i], l, 1));
  if (r == 0) ar->written += n;
  if (r < 0)
    fprintf(stderr, "commitkv-bench agents: %s: append [%llu, %llu): %s: %s\n", ckv_session_id(s),
            (unsigned long long)from, (unsigned long long)to, ckv_strerror(r), ckv_client_last_error(ar->c));
  free(ids);
  free(roles);
  free(tags);
  return r;
}

static int report(agent_run *ar, ckv_session *s, uint64_t round) {
  size_t n = (size_t)ckv_session_tokens(s);
  for (size_t p = 0; p < n; p++) ar->attn[p] = attn_at(p, n);
  ckv_round_result rr;
  int r = ckv_session_report(s, round, 0, ar->attn, n, &rr);
  /* what the round retired is freed once this reader acknowledges it */
  if (r == 0) r = ckv_session_ack(s, rr.epoch, NULL);
  if (r < 0)
    fprintf(stderr, "commitkv-bench agents: %s: report/ack round %llu: %s: %s\n", ckv_session_id(s),
            (unsigned long long)round, ckv_strerror(r), ckv_client_last_error(ar->c));
  return r;
}

/* The daemon's compressor: waits until no job is queued; with `quiet`, also
 * until pending tokens stay unchanged for SETTLE_QUIET_MS (decisions on
 * frozen shared blocks stay pending for good).  *ret_ms: the wait; returns
 * 1 when it settled, 0 when it gave up at SETTLE_MAX_MS, or the RPC's error. */
static int settle(ckv_client *c, bool quiet, double *ret_ms) {
  double t0 = now_us(), changed = t0;
  uint64_t last = UINT64_MAX;
  for (;;) {
    uint64_t pending = 0, queue = 0;
    int r = ckv_bench_compress_stats(c, &pending, &queue, NULL);
    if (r < 0) return r;
    double t = now_us();
    if (queue || pending != last) {
      last = pending;
      changed = t;
    }
    if (!queue && (!quiet || t - changed >= SETTLE_QUIET_MS * 1e3)) {
      if (ret_ms) *ret_ms = (t - t0) / 1e3;
      return 1;
    }
    if (t - t0 > SETTLE_MAX_MS * 1e3) {
      if (ret_ms) *ret_ms = (t - t0) / 1e3;
      return 0;
    }
    usleep(quiet ? 20000 : 2000);
  }
}

/* Acknowledges s's newest view epoch (moves the compressor published since
 * the last report retired blocks that are freed only then). */
static int ack_newest(ckv_client *c, ckv_session *s) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(s, &v);
  if (r == 0) r = ckv_session_ack(s, v->epoch, NULL);
  if (r < 0)
    fprintf(stderr, "commitkv-bench agents: %s: view/ack: %s: %s\n", ckv_session_id(s), ckv_strerror(r),
            ckv_client_last_error(c));
  return r;
}

/* The turns and the settling rounds of one agent whose session holds the
 * prefix already; with prefix_round, a round over the prefix first.  Round
 * numbers from *round. */
static int run_turns(agent_run *ar, ckv_session *s, unsigned agent, bool prefix_round, uint64_t *round) {
  const agents_opts *o = ar->o;
  int r = prefix_round ? report(ar, s, (*round)++) : 0;
  for (uint64_t at = o->prefix; r == 0 && at < (uint64_t)o->prefix + o->priv;) {
    uint64_t end = at + o->turn < (uint64_t)o->prefix + o->priv ? at + o->turn : (uint64_t)o->prefix + o->priv;
    r = append_tokens(ar, s, agent, at, end);
    if (r == 0) r = report(ar, s, (*round)++);
    at = end;
  }
  for (unsigned i = 0; r == 0 && i < o->settle_rounds; i++) r = report(ar, s, (*round)++);
  /* the compressor catches up before the next agent and the blocks its moves
   * retired are given back (acknowledged): memory stays near what the agents
   * hold, not every agent's draft at once */
  if (r == 0 && (r = settle(ar->c, /* quiet= */ false, NULL)) > 0) r = 0;
  if (r == 0) r = ack_newest(ar->c, s);
  return r;
}

/* The tenant's bytes.total / bytes.shared from Stats. */
static int tenant_bytes(ckv_client *c, uint64_t *ret_total, uint64_t *ret_shared) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  if (r < 0) return r;
  r = -ENOENT;
  for (size_t i = 0; rep->stats && i < rep->stats->n_tenants; i++) {
    const Commitkv__V1__TenantStats *t = rep->stats->tenants[i];
    if (strcmp(t->name, ckv_client_tenant(c)) == 0 && t->bytes) {
      *ret_total = t->bytes->total;
      *ret_shared = t->bytes->shared;
      r = 0;
    }
  }
  ckv_rpc_free(rep);
  return r;
}

/* --verbose: every session's figures (ListSessions) to stderr. */
static void list_sessions(ckv_client *c, const char *label) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  Commitkv__V1__Response *rep;
  if (ckv_rpc(c, &req, &rep) < 0) return;
  for (size_t i = 0; rep->session_list && i < rep->session_list->n_sessions; i++) {
    const Commitkv__V1__SessionInfo *s = rep->session_list->sessions[i];
    if (!s->bytes || !s->tokens) continue;
    fprintf(stderr,
            "commitkv-bench agents: %s %-10s tokens d/s/c/r %llu/%llu/%llu/%llu pending %llu; bytes d/s/c %llu/%llu/%llu "
            "total %llu shared %llu cold %llu\n",
            label, s->session_id, (unsigned long long)s->tokens->draft, (unsigned long long)s->tokens->staged,
            (unsigned long long)s->tokens->committed, (unsigned long long)s->tokens->recycled,
            (unsigned long long)s->pending_tokens, (unsigned long long)s->bytes->draft,
            (unsigned long long)s->bytes->staged, (unsigned long long)s->bytes->committed,
            (unsigned long long)s->bytes->total, (unsigned long long)s->bytes->shared,
            (unsigned long long)s->bytes->cold);
  }
  ckv_rpc_free(rep);
}

/* Settles, acknowledges every session's newest epoch (retired blocks are
 * freed only then), settles again and reads the tenant's bytes. */
static int final_figures(ckv_client *c, ckv_session **ss, size_t n, policy_fig *pf) {
  int r = settle(c, /* quiet= */ true, &pf->settle_ms);
  if (r < 0) return r;
  pf->settled = r > 0;
  for (size_t i = 0; i < n; i++)
    if (ss[i] && (r = ack_newest(c, ss[i])) < 0) return r;
  double more = 0;
  if ((r = settle(c, /* quiet= */ false, &more)) < 0) return r;
  pf->settle_ms += more;
  if (g_verbose) list_sessions(c, pf->name);
  return tenant_bytes(c, &pf->bytes, &pf->shared_bytes);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of v[0..n) (sorted here). */
static double percentile(double *v, size_t n, double q) {
  if (!n) return -1;
  qsort(v, n, sizeof *v, cmp_double);
  size_t k = (size_t)ceil(q * (double)n);
  return v[k ? k - 1 : 0];
}

/* ---- the runs ------------------------------------------------------------- */

typedef struct run_ctx {
  const agents_opts *o;
  const char *daemon_path, *dir, *memory;
  ckv_bench_daemon d;
  ckv_client *c;
  ckv_session **ss; /* [agents] */
  agent_run ar;
  char max_sessions[64];
} run_ctx;

static int run_begin(run_ctx *x, const agents_opts *o, const kv_table *kv, const char *daemon_path, const char *dir,
                     const char *memory) {
  *x = (run_ctx){.o = o, .daemon_path = daemon_path, .dir = dir, .memory = memory};
  x->ss = calloc(o->agents, sizeof(*x->ss));
  x->ar = (agent_run){.o = o, .kv = kv, .attn = malloc(((size_t)o->prefix + o->priv) * sizeof(float))};
  if (!x->ss || !x->ar.attn) return -ENOMEM;
  /* every agent, the prefix session and the probe open at once */
  snprintf(x->max_sessions, sizeof x->max_sessions, "daemon.max_sessions=%u", o->agents + 2);
  x->d.sets[0] = x->max_sessions;
  if (ckv_bench_daemon_start(&x->d, daemon_path, dir, memory) < 0) return -ECHILD;
  ckv_client_options co = {.socket = x->d.socket, .attach_socket = x->d.attach, .name = "bench-agents",
                           .timeout_ms = 120000};
  int r = ckv_client_connect(&co, &x->c);
  if (r < 0) {
    fprintf(stderr, "commitkv-bench agents: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
    return r;
  }
  x->ar.c = x->c;
  return 0;
}

static int run_end(run_ctx *x, int rc) {
  for (unsigned i = 0; x->ss && i < x->o->agents; i++)
    if (x->ss[i]) ckv_session_drop(x->ss[i]);
  free(x->ss);
  free(x->ar.attn);
  ckv_client_free(x->c);
  if (rc) ckv_bench_daemon_log_tail(&x->d);
  if (x->d.pid > 0 && ckv_bench_daemon_stop(&x->d) != 0 && rc == 0) rc = -ECHILD;
  return rc;
}

static ckv_session *open_session(run_ctx *x, const char *id, const char *policy, const uint32_t *ids, size_t n) {
  ckv_session_options so = {.policy = policy, .draft_block_tokens = DRAFT_BLOCK_TOKENS, .model_id = MODEL_ID,
                            .model_revision = MODEL_REV,
                            .token_ids = ids, .n_token_ids = n, .reuse_prefix = ids != NULL};
  ckv_session *s = NULL;
  int r = ckv_session_open(x->c, id, &x->o->g, &so, &s);
  if (r < 0) {
    fprintf(stderr, "commitkv-bench agents: open %s: %s: %s\n", id, ckv_strerror(r), ckv_client_last_error(x->c));
    return NULL;
  }
  return s;
}

/* commitkv-private: every agent its own commitkv session, prefix and all. */
static int run_private(const agents_opts *o, const kv_table *kv, const char *daemon_path, const char *dir,
                       const char *memory, policy_fig *pf) {
  run_ctx x;
  double t0 = now_us();
  int r = run_begin(&x, o, kv, daemon_path, dir, memory);
  for (unsigned a = 0; r == 0 && a < o->agents; a++) {
    char id[32];
    snprintf(id, sizeof id, "agent-%u", a);
    if (!(x.ss[a] = open_session(&x, id, "commitkv", NULL, 0))) r = -1;
    uint64_t round = 2; /* as in the shared run, where round 1 is the prefix session's */
    if (r == 0) r = append_tokens(&x.ar, x.ss[a], a, 0, o->prefix);
    if (r == 0) r = run_turns(&x.ar, x.ss[a], a, /* prefix_round= */ true, &round);
  }
  if (r == 0) r = final_figures(x.c, x.ss, o->agents, pf);
  pf->tokens_written = x.ar.written;
  pf->lookup_p50 = pf->lookup_p99 = pf->lookup_max = -1;
  pf->run_s = (now_us() - t0) / 1e6;
  pf->measured = r == 0;
  return run_end(&x, r);
}

/* What a lookup finds after a commitkv-policy session, opened with
 * reuse_prefix on an empty tenant, wrote the prefix and reported a round
 * past it: its blocks wait share_grace_rounds for a second holder. */
static int probe_first_writer(run_ctx *x, const uint32_t *ids, uint64_t *ret_matched) {
  ckv_session *s = open_session(x, "probe-first-writer", "commitkv", ids, x->o->prefix);
  if (!s) return -1;
  int r = append_tokens(&x->ar, s, 0, 0, x->o->prefix);
  if (r == 0) r = report(&x->ar, s, 1);
  if (r == 0) r = ckv_client_lookup_prefix(x->c, ids, x->o->prefix, MODEL_ID, MODEL_REV, ret_matched);
  x->ar.written -= x->o->prefix; /* not the workload's */
  int d = ckv_session_drop(s);
  return r < 0 ? r : d;
}

/* commitkv-shared: the prefix once, forks and reuse opens (file comment). */
static int run_shared(const agents_opts *o, const kv_table *kv, const char *daemon_path, const char *dir,
                      const char *memory, unsigned subagents, policy_fig *pf, shared_extra *sx) {
  const uint64_t d_tokens = DRAFT_BLOCK_TOKENS;
  run_ctx x;
  double t0 = now_us();
  ckv_session *writer = NULL;
  uint32_t *ids = malloc(((size_t)o->prefix + 1) * sizeof(*ids));
  double *lk = malloc(((size_t)o->agents + o->lookups) * sizeof(double));
  size_t n_lk = 0;
  uint64_t start_tokens = 0;
  int r = run_begin(&x, o, kv, daemon_path, dir, memory);
  if (!ids || !lk) r = -ENOMEM;
  for (unsigned p = 0; r == 0 && p < o->prefix; p++) ids[p] = token_id(o, 0, p);
  if (r == 0) r = probe_first_writer(&x, ids, &sx->first_writer_matched);
  /* The prefix session: the prefix's whole draft blocks (m tokens; a partial
   * block is never shared), written once and reported past, so they publish. */
  const uint64_t m = o->prefix / d_tokens * d_tokens;
  if (r == 0 && m && !(writer = open_session(&x, "prefix", "fp16", NULL, 0))) r = -1;
  if (r == 0 && m) r = append_tokens(&x.ar, writer, 0, 0, m);
  if (r == 0 && m) r = report(&x.ar, writer, 1);
  /* Agents 0..top-1 look the prefix up and open on it; sub-agent top + j is
   * a fork of agent j % top at the prefix end, made right after its parent
   * reported the prefix (the tail past the last whole block must still be in
   * draft: within the parent's recent window). */
  const unsigned top = o->agents - subagents;
  for (unsigned a = 0; r == 0 && a < top; a++) {
    char id[32];
    snprintf(id, sizeof id, "agent-%u", a);
    uint64_t round = 2, found = 0;
    double t = now_us();
    r = ckv_client_lookup_prefix(x.c, ids, o->prefix, MODEL_ID, MODEL_REV, &found);
    lk[n_lk++] = now_us() - t;
    if (r < 0) {
      fprintf(stderr, "commitkv-bench agents: lookup: %s: %s\n", ckv_strerror(r), ckv_client_last_error(x.c));
      break;
    }
    if (!(x.ss[a] = open_session(&x, id, "commitkv", ids, o->prefix))) {
      r = -1;
      break;
    }
    uint64_t have = ckv_session_matched_tokens(x.ss[a]);
    if (have != found || have != m || ckv_session_tokens(x.ss[a]) != have) {
      fprintf(stderr, "commitkv-bench agents: %s: lookup said %llu, the open matched %llu (holds %llu), %llu expected\n",
              id, (unsigned long long)found, (unsigned long long)have,
              (unsigned long long)ckv_session_tokens(x.ss[a]), (unsigned long long)m);
      r = -1;
      break;
    }
    sx->matched = have;
    sx->reuses++;
    /* Two agents hold the prefix: the prefix session goes, so the agents'
     * own states decide its format (a shared block follows the most
     * protective holder: an fp16 session would keep it FP16 for good). */
    if (a == 1 && writer) {
      r = ckv_session_drop(writer);
      writer = NULL;
      if (r < 0) break;
    }
    start_tokens += have;
    r = append_tokens(&x.ar, x.ss[a], a, have, o->prefix); /* the unmatched rest of the prefix */
    if (r == 0) r = report(&x.ar, x.ss[a], round++);
    uint64_t child_round = round;
    for (unsigned c = top + a; r == 0 && c < o->agents; c += top) {
      snprintf(id, sizeof id, "agent-%u", c);
      uint64_t at = o->prefix;
      r = ckv_session_fork(x.ss[a], id, at, &x.ss[c]);
      if (r == CKV_ERR_STATE && m) { /* the tail left draft: fork at the last whole block, prefill the rest */
        sx->forks_at_block++;
        at = m;
        r = ckv_session_fork(x.ss[a], id, at, &x.ss[c]);
      }
      if (r < 0) {
        fprintf(stderr, "commitkv-bench agents: fork %s at %llu: %s: %s\n", id, (unsigned long long)at,
                ckv_strerror(r), ckv_client_last_error(x.c));
        break;
      }
      sx->forks++;
      start_tokens += ckv_session_tokens(x.ss[c]);
      r = append_tokens(&x.ar, x.ss[c], c, at, o->prefix);
    }
    if (r == 0) r = run_turns(&x.ar, x.ss[a], a, /* prefix_round= */ false, &round);
    for (unsigned c = top + a; r == 0 && c < o->agents; c += top) {
      uint64_t cr = child_round;
      r = run_turns(&x.ar, x.ss[c], c, /* prefix_round= */ false, &cr);
    }
  }
  /* The prefix session goes: what is left is the agents' own. */
  if (writer) {
    int d = ckv_session_drop(writer);
    if (r == 0 && d < 0) r = d;
  }
  if (r == 0) r = final_figures(x.c, x.ss, o->agents, pf);
  /* p99 at N live sessions: more lookups with every agent's session open,
   * the compressor settled (so they time the lookup, not its jobs). */
  for (unsigned i = 0; r == 0 && i < o->lookups; i++) {
    uint64_t found = 0;
    double t = now_us();
    r = ckv_client_lookup_prefix(x.c, ids, o->prefix, MODEL_ID, MODEL_REV, &found);
    lk[n_lk++] = now_us() - t;
    if (r == 0 && found != m) {
      fprintf(stderr, "commitkv-bench agents: a lookup at %u sessions matched %llu, not %llu\n", o->agents,
              (unsigned long long)found, (unsigned long long)m);
      r = -1;
    }
  }
  pf->n_lookups = n_lk;
  pf->lookup_p99 = percentile(lk, n_lk, 0.99);
  pf->lookup_p50 = percentile(lk, n_lk, 0.50);
  pf->lookup_max = percentile(lk, n_lk, 1.0);
  pf->tokens_written = x.ar.written;
  pf->prefill_saved = start_tokens - m; /* the prefix session's m tokens were written for them */
  pf->run_s = (now_us() - t0) / 1e6;
  pf->measured = r == 0;
  free(ids);
  free(lk);
  return run_end(&x, r);
}

/* ---- the command ----------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr, "usage: commitkv-bench agents [--agents N] [--prefix-tokens N] [--private-tokens N]\n"
                  "       [--fork-share F] [--turn-tokens N] [--settle-rounds N] [--lookups N]\n"
                  "       [--layers N] [--kv-heads N] [--head-dim N] [--memory SIZE] [--daemon PATH] [--quick] [--json] [--verbose]\n");
}

static void json_num(double v, const char *fmt) {
  if (v < 0) printf("null");
  else printf(fmt, v);
}

int ckv_bench_agents(int argc, char **argv) {
  agents_opts o = {.agents = 64, .prefix = 8192, .priv = 2048, .turn = 256, .settle_rounds = 6, .lookups = 1000,
                   .fork_share = 0.25, .g = {.n_layers = 8, .n_kv_heads = 8, .head_dim = 128, .dtype = 0}};
  static const struct option opts[] = {
      {"agents", required_argument, 0, 'a'},        {"prefix-tokens", required_argument, 0, 'p'},
      {"private-tokens", required_argument, 0, 'q'}, {"fork-share", required_argument, 0, 'f'},
      {"turn-tokens", required_argument, 0, 't'},   {"settle-rounds", required_argument, 0, 's'},
      {"lookups", required_argument, 0, 'L'},       {"layers", required_argument, 0, 'l'},
      {"kv-heads", required_argument, 0, 'k'},      {"head-dim", required_argument, 0, 'd'},
      {"memory", required_argument, 0, 'M'},        {"daemon", required_argument, 0, 'D'},
      {"quick", no_argument, 0, 'Q'},               {"json", no_argument, 0, 'j'},
      {"verbose", no_argument, 0, 'v'},             {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  /* --quick first: the sizes a test runs in seconds; flags after it still apply. */
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--quick") == 0) {
      o = (agents_opts){.agents = 16, .prefix = 488, .priv = 128, .turn = 64, .settle_rounds = 6, .lookups = 200,
                        .fork_share = 0.25, .g = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .dtype = 0},
                        .quick = true};
    }
  optind = 1;
  for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    switch (c) {
      case 'a': o.agents = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'p': o.prefix = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'q': o.priv = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'f': o.fork_share = strtod(optarg, NULL); break;
      case 't': o.turn = (unsigned)strtoul(optarg, NULL, 0); break;
      case 's': o.settle_rounds = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'L': o.lookups = (unsigned)strtoul(optarg, NULL, 0); break;
      case 'l': o.g.n_layers = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'k': o.g.n_kv_heads = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'd': o.g.head_dim = (uint32_t)strtoul(optarg, NULL, 0); break;
      case 'M': o.memory = optarg; break;
      case 'D': o.daemon = optarg; break;
      case 'Q': break;
      case 'j': o.json = true; break;
      case 'v': g_verbose = true; break;
      case 'h': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (o.agents < 1 || o.agents > 4096 || o.prefix < 1 || o.prefix > (1u << 20) || o.priv > (1u << 20) ||
      o.turn < 1 || o.settle_rounds > 1000 || o.lookups > 1000000 || !(o.fork_share >= 0 && o.fork_share < 1) ||
      !o.g.n_layers || !o.g.n_kv_heads || !o.g.head_dim) {
    fprintf(stderr, "commitkv-bench agents: --agents 1..4096, --prefix-tokens 1..1048576, --private-tokens "
                    "0..1048576, --turn-tokens >= 1, --fork-share in [0, 1), a geometry\n");
    return 2;
  }
  unsigned subagents = (unsigned)floor(o.fork_share * o.agents + 0.5);
  if (subagents > o.agents - 1) subagents = o.agents - 1;
  const uint64_t per_token = (uint64_t)o.g.n_layers * o.g.n_kv_heads * o.g.head_dim * 2u * 2u;
  const uint64_t fp16_bytes = (uint64_t)o.agents * ((uint64_t)o.prefix + o.priv) * per_token;
  /* The arena is a cap (it is backed as sessions take memory): a quarter of
   * the FP16 figure (commitkv-private holds about 0.16 of it) plus room for
   * two agents in draft. */
  char memory[32];
  if (o.memory) snprintf(memory, sizeof memory, "%s", o.memory);
  else
    snprintf(memory, sizeof memory, "%lluM",
             (unsigned long long)((fp16_bytes / 4 + 2 * ((uint64_t)o.prefix + o.priv) * per_token) / (1u << 20) + 256));
  const char *tmp = getenv("TMPDIR");
  char daemon_path[4096], dir[256], sub[2][300];
  snprintf(dir, sizeof dir, "%.200s/ckv-bench-agents-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (ckv_bench_find_daemon(o.daemon, daemon_path, sizeof daemon_path) < 0 || !mkdtemp(dir)) {
    fprintf(stderr, "commitkv-bench agents: no commitkvd or no temporary directory\n");
    return 1;
  }
  kv_table kv;
  if (kv_table_init(&kv, &o.g) < 0) return 1;
  policy_fig rows[3] = {{.name = "fp16-private", .bytes = fp16_bytes, .lookup_p50 = -1, .lookup_p99 = -1, .lookup_max = -1},
                        {.name = "commitkv-private"},
                        {.name = "commitkv-shared"}};
  rows[0].tokens_written = (uint64_t)o.agents * ((uint64_t)o.prefix + o.priv);
  shared_extra sx = {0};
  int rc = 0;
  for (int i = 0; i < 2; i++) {
    snprintf(sub[i], sizeof sub[i], "%s/%s", dir, i ? "shared" : "private");
    if (mkdir(sub[i], 0700) != 0) rc = 1;
  }
  if (!o.json)
    fprintf(stderr, "commitkv-bench agents: %u agents (%u sub-agents), %u + %u tokens, %ux%ux%u, memory %s\n",
            o.agents, subagents, o.prefix, o.priv, o.g.n_layers, o.g.n_kv_heads, o.g.head_dim, memory);
  if (rc == 0 && run_private(&o, &kv, daemon_path, sub[0], memory, &rows[1]) != 0) rc = 1;
  if (rc == 0 && run_shared(&o, &kv, daemon_path, sub[1], memory, subagents, &rows[2], &sx) != 0) rc = 1;
  ckv_bench_rm_tree(dir);
  free(kv.rows);
  if (rc) return rc;
  if (o.json) {
    printf("{\"bench\":\"agents\",\"agents\":%u,\"subagents\":%u,\"prefix_tokens\":%u,\"private_tokens\":%u,"
           "\"turn_tokens\":%u,\"settle_rounds\":%u,\"fork_share\":%.4g,\"geometry\":[%u,%u,%u],\"memory\":\"%s\","
           "\"matched_prefix_tokens\":%llu,\"forks\":%u,\"reuse_opens\":%u,\"forks_at_block\":%u,"
           "\"first_writer_commitkv_matched\":%llu,"
           "\"policies\":[",
           o.agents, subagents, o.prefix, o.priv, o.turn, o.settle_rounds, o.fork_share, o.g.n_layers, o.g.n_kv_heads,
           o.g.head_dim, memory, (unsigned long long)sx.matched, sx.forks, sx.reuses,
           sx.forks_at_block, (unsigned long long)sx.first_writer_matched);
    for (int i = 0; i < 3; i++) {
      const policy_fig *p = &rows[i];
      printf("%s{\"policy\":\"%s\",\"measured\":%s,\"bytes\":%llu,\"bytes_ratio_fp16_private\":%.6f,"
             "\"shared_bytes\":%llu,\"prefill_tokens_saved\":%llu,\"tokens_written\":%llu,\"lookup_us_p99\":",
             i ? "," : "", p->name, p->measured ? "true" : "false", (unsigned long long)p->bytes,
             (double)p->bytes / (double)fp16_bytes, (unsigned long long)p->shared_bytes,
             (unsigned long long)p->prefill_saved, (unsigned long long)p->tokens_written);
      json_num(p->lookup_p99, "%.2f");
      printf(",\"lookup_us_p50\":");
      json_num(p->lookup_p50, "%.2f");
      printf(",\"lookup_us_max\":");
      json_num(p->lookup_max, "%.2f");
      printf(",\"lookups\":%zu,\"settled\":%s,\"settle_ms\":%.0f,\"run_s\":%.1f}", p->n_lookups,
             i == 0 || p->settled ? "true" : "false", p->settle_ms, p->run_s);
    }
    printf("],\"aims\":{\"shared_bytes_ratio_max\":%.2f,\"lookup_us_p99_max\":%.0f}}\n", AIM_RATIO, AIM_LOOKUP_US);
  } else {
    printf("commitkv-bench agents: %u agents of one tenant (%u of them sub-agents forked at the prefix end), "
           "%u prefix tokens + %u each, geometry %ux%ux%u FP16\n",
           o.agents, subagents, o.prefix, o.priv, o.g.n_layers, o.g.n_kv_heads, o.g.head_dim);
    printf("%-17s %12s %9s %14s %12s %12s %10s\n", "policy", "MiB", "x fp16", "prefill saved", "lookup p50",
           "lookup p99", "run s");
    for (int i = 0; i < 3; i++) {
      const policy_fig *p = &rows[i];
      char p50[32] = "-", p99[32] = "-";
      if (p->lookup_p99 >= 0) {
        snprintf(p50, sizeof p50, "%.1f us", p->lookup_p50);
        snprintf(p99, sizeof p99, "%.1f us", p->lookup_p99);
      }
      printf("%-17s %12.1f %9.4f %14llu %12s %12s %10.1f%s\n", p->name, (double)p->bytes / 1048576.0,
             (double)p->bytes / (double)fp16_bytes, (unsigned long long)p->prefill_saved, p50, p99, p->run_s,
             i == 0 ? "  (computed)" : p->settled ? "" : "  (compressor not settled)");
    }
    printf("shared: %llu tokens matched per reuse open (%u opens), %u forks, %.2f MiB in shared blocks; a "
           "commitkv-policy first writer's prefix matched %llu tokens\n",
           (unsigned long long)sx.matched, sx.reuses, sx.forks, (double)rows[2].shared_bytes / 1048576.0,
           (unsigned long long)sx.first_writer_matched);
    printf("aims (issue 41): commitkv-shared <= %.2f of fp16-private, lookup p99 <= %.0f us at %u sessions\n",
           AIM_RATIO, AIM_LOOKUP_US, o.agents);
  }
  return 0;
}
