/* llm.c - commitkv-llm: a worker that runs a real model (a llama2.c-format
 * checkpoint, stories260K by default) with its KV cache in commitkvd.
 *
 * Each session is a multi-turn conversation driven by token ids (the model
 * ships without a tokenizer): BOS (role system), then --rounds turns that
 * alternate a "user" turn of --user-tokens tokens sampled from the model
 * (temperature 1, seeded PRNG) and an "assistant" turn of --assistant-tokens
 * tokens generated greedily.  One turn is one round of the lifecycle.  Every
 * token is appended on its own (its id is not known before the previous
 * token's logits, and appending ahead would put not-yet-written slots into
 * the attention), then per layer: q/k/v from the model, K/V rounded to FP16
 * (round to nearest even) and written into the token's draft slot, fused
 * attention (ckv_kernels_attention) over every block of the session's view
 * (draft, staged, committed; the token's own slot included), the output fed
 * back into the model.  The attention mass per (block, slot) is mapped to
 * positions through the block headers and summed over layers and steps; at
 * the end of the turn it is reported (ckv_session_report) and the newest view
 * epoch acknowledged.
 *
 * With --shadow the same token stream also runs through the model's reference
 * attention over a private cache of FP16-rounded K/V held as FP32 (the
 * uncompressed FP16 baseline; --shadow-fp32 keeps unrounded FP32 instead), and
 * every step compares the next-token distributions: KL(p_shadow || p_commitkv)
 * and top-1 agreement, counted only where the shadow's top token leads the
 * second by more than 0.05 in probability.  The shadow's logits then choose
 * the tokens (teacher forcing), so both runs see the same stream.
 *
 * Memory figures come from the daemon (ListSessions, after the session's
 * pending transitions settled): bytes_total is every byte of its blocks
 * (headers, scales, partly filled blocks, blocks retired but not yet
 * reclaimed); bytes_fp16 is what FP16 K/V of every appended token takes
 * (tokens x 2 x layers x kv_heads x head_dim x 2), so eviction policies are
 * compared against the cache they replace.  The daemon's own fp16_equivalent
 * (live tokens only) is printed as bytes_fp16_live.
 *
 *   commitkv-llm [--socket EP] [--attach-socket PATH] [--model PATH]
 *                [--sessions N] [--rounds R] [--user-tokens U]
 *                [--assistant-tokens A] [--seed S] [--policy NAME]
 *                [--param key=value ...] [--shadow] [--shadow-fp32] [--json]
 *                [--prefix ID] [--quiet] [--keep] [--sync]
 *
 * Transitions are compressed asynchronously by the daemon, so which format a
 * token is read in at a given step depends on timing, and so do the figures
 * of lossy policies (a few tens of percent of KL between runs).  --sync waits
 * after each report until the daemon's moves for that round are published
 * (polling ListSessions), which makes a run repeatable: use it to compare
 * policies or tune the judge; leave it off to measure the real, overlapped
 * behaviour.
 *
 * It rides through a daemon restart (examples/common/reconnect.h): when a
 * call fails because the daemon went away it re-attaches with backoff for up
 * to --reconnect-timeout-ms (0: fail at once), reopens the session it was on
 * (resumed when the daemon still holds every token, else opened afresh),
 * re-prefills a new session by running the token stream so far through the
 * model again (each token's K/V into its new slot, attention over the new
 * view; the round's attention mass so far is kept, the shadow's private
 * cache needs nothing), says so in one line on stderr, and goes on with the
 * token or the report it was on.  Sessions it finished before the restart
 * (kept with --keep) are not rebuilt.
 *
 * Exit 0 on success, 1 on a runtime failure (model or daemon missing, a
 * refused request, a daemon that did not come back), 2 on bad arguments. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv/commitkv.h"
#include "examples/common/reconnect.h"
#include "examples/llm/model.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#define LLM_BOS 1
#define LLM_MAX_SESSIONS 64
#define LLM_MAX_PARAMS 32
#define LLM_TOP1_MARGIN 0.05f /* near-ties (FP16 rounding flips them) do not count */
#define LLM_SETTLE_MS 5000    /* at most this long waiting for pending compressions at the end */
#define LLM_SETTLE_POLL_MS 10
#define LLM_SYNC_POLL_MS 1     /* --sync: poll period while a round's moves finish */
#define LLM_SETTLE_QUIET 5    /* polls without change: the rest waits for more tokens */
#define LLM_FALLBACK_MODEL "../shared/models/" CKV_MODEL_DEFAULT_FILE

typedef struct opts {
  const char *socket, *attach, *model, *policy, *prefix;
  int sessions, rounds, user_tokens, assistant_tokens, reconnect_ms;
  uint64_t seed;
  bool shadow, shadow_fp32, json, quiet, keep, sync;
  const char *param_names[LLM_MAX_PARAMS];
  double param_values[LLM_MAX_PARAMS];
  size_t n_params;
} opts;

/* What one session measured. */
typedef struct result {
  char id[160];
  char policy[32]; /* as the daemon applied it */
  uint64_t tokens, rounds, steps;
  uint64_t top1_counted, top1_agree;
  double kl_sum, kl_max;
  uint64_t bytes_total, bytes_fp16, bytes_fp16_live;
  uint64_t bytes_state[3]; /* daemon's block bytes: draft, staged, committed */
  uint64_t states[4]; /* tokens per CKV_TOKEN_* at the end */
  double seconds;
  int reconnects;
} result;

/* One session's working set. */
typedef struct run {
  const opts *o;
  const ckv_model *m;
  const ckv_model_config *mc;
  ckv_client *c;
  ckv_session *s;
  ckv_model_state *st, *sh; /* commitkv path; shadow (NULL without --shadow) */
  float *logits, *sh_logits, *probs;
  float *sh_k, *sh_v;       /* shadow cache: [layer][seq_len][kv_dim] */
  uint16_t *k16, *v16;      /* one token's K/V of one layer, FP16 */
  float *mass;              /* this round's attention mass per position */
  float *slot_mass;         /* kernel output: per (block, slot) */
  size_t cap_slot_mass;
  const void **blocks;      /* the view's blocks, all formats */
  size_t cap_blocks;
  uint32_t n_blocks;
  void *ws;
  size_t ws_bytes;
  uint64_t acked;           /* newest epoch acknowledged */
  ckv_model_rng rng;
  result *res;
  /* The token stream so far (positions 0..n_done-1, each one's K/V written):
   * what a session reopened empty after a daemon restart is rebuilt from. */
  uint32_t *ids;
  uint8_t *roles, *tags;
  uint64_t n_done;
  uint64_t reported;        /* the last round this daemon's session took (0: none) */
  uint32_t pending;         /* tokens that report left being moved */
  bool report_lost;         /* a report went out and its answer never came */
  float *saved_mass;        /* the round's mass while a re-prefill adds its own */
  ckv_geometry geom;        /* what the session is opened with, again after a restart */
  ckv_session_options sopts;
} run;

static int g_quiet;

static void note(const char *fmt, ...) {
  if (g_quiet) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

/* ---- arguments ------------------------------------------------------------ */

static void usage(void) {
  fprintf(stderr,
          "usage: commitkv-llm [--socket EP] [--attach-socket PATH] [--model PATH] [--sessions N]\n"
          "                    [--rounds R] [--user-tokens U] [--assistant-tokens A] [--seed S]\n"
          "                    [--policy NAME] [--param key=value ...] [--shadow] [--shadow-fp32]\n"
          "                    [--json] [--prefix ID] [--quiet] [--keep] [--sync]\n"
          "                    [--reconnect-timeout-ms MS]\n");
}

static int parse_int(const char *s, int lo, int hi, int *ret) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return -1;
  *ret = (int)v;
  return 0;
}

static int parse_param(opts *o, char *kv) {
  char *eq = strchr(kv, '=');
  if (!eq || eq == kv || o->n_params == LLM_MAX_PARAMS) return -1;
  *eq = '\0';
  char *end;
  double v = strtod(eq + 1, &end);
  if (!eq[1] || *end) return -1;
  o->param_names[o->n_params] = kv;
  o->param_values[o->n_params++] = v;
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  static const struct option lo[] = {
      {"socket", required_argument, 0, 's'},     {"attach-socket", required_argument, 0, 'a'},
      {"model", required_argument, 0, 'm'},      {"sessions", required_argument, 0, 'n'},
      {"rounds", required_argument, 0, 'r'},     {"user-tokens", required_argument, 0, 'u'},
      {"assistant-tokens", required_argument, 0, 'A'}, {"seed", required_argument, 0, 'S'},
      {"policy", required_argument, 0, 'P'},     {"param", required_argument, 0, 'K'},
      {"shadow", no_argument, 0, 'w'},           {"shadow-fp32", no_argument, 0, 'W'},
      {"json", no_argument, 0, 'j'},             {"prefix", required_argument, 0, 'p'},
      {"quiet", no_argument, 0, 'q'},            {"keep", no_argument, 0, 'k'},
      {"sync", no_argument, 0, 'y'},             {"help", no_argument, 0, 'h'},
      {"reconnect-timeout-ms", required_argument, 0, 'R'}, {0, 0, 0, 0}};
  int ch, bad = 0;
  while (!bad && (ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 's': o->socket = optarg; break;
      case 'a': o->attach = optarg; break;
      case 'm': o->model = optarg; break;
      case 'n': bad = parse_int(optarg, 1, LLM_MAX_SESSIONS, &o->sessions); break;
      case 'r': bad = parse_int(optarg, 1, 1 << 20, &o->rounds); break;
      case 'u': bad = parse_int(optarg, 1, 1 << 20, &o->user_tokens); break;
      case 'A': bad = parse_int(optarg, 1, 1 << 20, &o->assistant_tokens); break;
      case 'S': o->seed = strtoull(optarg, NULL, 0); break;
      case 'P': o->policy = optarg; break;
      case 'K': bad = parse_param(o, optarg); break;
      case 'w': o->shadow = true; break;
      case 'W': o->shadow = o->shadow_fp32 = true; break;
      case 'j': o->json = true; break;
      case 'p': o->prefix = optarg; break;
      case 'q': o->quiet = true; break;
      case 'k': o->keep = true; break;
      case 'y': o->sync = true; break;
      case 'R': bad = parse_int(optarg, 0, 24 * 3600 * 1000, &o->reconnect_ms); break;
      case 'h': usage(); exit(0);
      default: bad = -1; break;
    }
    if (bad) fprintf(stderr, "commitkv-llm: bad value for an option\n");
  }
  if (bad || optind != argc) {
    usage();
    return -1;
  }
  return 0;
}

/* Tokens one session holds: BOS plus every turn. */
static uint64_t session_tokens(const opts *o) {
  uint64_t user_turns = ((uint64_t)o->rounds + 1) / 2, asst_turns = (uint64_t)o->rounds / 2;
  return 1 + user_turns * (uint64_t)o->user_tokens + asst_turns * (uint64_t)o->assistant_tokens;
}

/* --model, else $CKV_MODEL / $CKV_MODEL_DIR, else the shared checkout. */
static const char *model_path(const opts *o, char *buf, size_t size) {
  if (o->model) return o->model;
  if (ckv_model_path_from_env(buf, size) == CKV_OK) return buf;
  return LLM_FALLBACK_MODEL;
}

/* ---- the session's view ----------------------------------------------------- */

/* Collects the blocks of the current view (fetching it when the epoch moved)
 * and acknowledges its epoch: nothing older is read after this. */
static int refresh_view(run *r) {
  const ckv_view *v;
  int e = ckv_session_view(r->s, &v);
  if (e < 0) return e;
  size_t n = v->n_draft + v->n_staged + v->n_committed;
  if (n > r->cap_blocks) {
    const void **nb = realloc(r->blocks, n * sizeof(*nb));
    if (!nb) return -ENOMEM;
    r->blocks = nb;
    r->cap_blocks = n;
  }
  size_t k = 0;
  for (size_t i = 0; i < v->n_draft; i++) r->blocks[k++] = v->draft[i].data;
  for (size_t i = 0; i < v->n_staged; i++) r->blocks[k++] = v->staged[i].data;
  for (size_t i = 0; i < v->n_committed; i++) r->blocks[k++] = v->committed[i].data;
  r->n_blocks = (uint32_t)n;
  if (v->epoch > r->acked) {
    e = ckv_session_ack(r->s, v->epoch, NULL);
    if (e < 0) return e;
    r->acked = v->epoch;
  }
  return CKV_OK;
}

/* Adds the kernel's per-(block, slot) mass to the per-position mass. */
static void add_mass(run *r, uint64_t n_pos) {
  size_t base = 0;
  for (uint32_t b = 0; b < r->n_blocks; b++) {
    const void *blk = r->blocks[b];
    const uint32_t *positions = ckv_block_positions_const(blk);
    uint32_t cap = ((const ckv_block_header *)blk)->capacity;
    for (uint32_t sl = 0; sl < cap; sl++) {
      float a = r->slot_mass[base + sl];
      if (a > 0.f && ckv_block_slot_valid(blk, sl) && positions[sl] < n_pos) r->mass[positions[sl]] += a;
    }
    base += cap;
  }
}

/* Fused attention of the current layer's query over every block of the view. */
static int attend_view(run *r, uint32_t layer, uint64_t n_pos) {
  ckv_attn_args a = {.geom = ckv_session_geometry(r->s), .layer = layer, .n_rows = 1,
                     .n_q_heads = (uint32_t)r->mc->n_heads, .q = ckv_model_state_q(r->st),
                     .blocks = r->blocks, .n_blocks = r->n_blocks, .out = ckv_model_state_attn_buf(r->st)};
  size_t need = ckv_attention_mass_len(r->blocks, r->n_blocks);
  if (need > r->cap_slot_mass) {
    float *nm = realloc(r->slot_mass, need * sizeof(*nm));
    if (!nm) return -ENOMEM;
    r->slot_mass = nm;
    r->cap_slot_mass = need;
  }
  a.mass = r->slot_mass;
  size_t ws = ckv_attention_workspace_bytes(&a);
  if (ws > r->ws_bytes) {
    free(r->ws);
    r->ws = malloc(ws);
    r->ws_bytes = r->ws ? ws : 0;
    if (!r->ws) return -ENOMEM;
  }
  a.workspace = r->ws;
  a.workspace_bytes = r->ws_bytes;
  int e = ckv_kernels_attention(&a);
  if (e < 0) return e;
  add_mass(r, n_pos);
  return CKV_OK;
}

/* ---- one token ------------------------------------------------------------ */

static void to_fp16(const float *x, uint16_t *h, int n) {
  for (int i = 0; i < n; i++) h[i] = ckv_f32_to_f16(x[i]);
}

/* The commitkv path: K/V into the daemon's slot, attention over the view. */
static int step_commitkv(run *r, int token, uint64_t pos) {
  int e = ckv_model_embed(r->m, r->st, token);
  for (int l = 0; e == CKV_OK && l < r->mc->n_layers; l++) {
    if ((e = ckv_model_qkv(r->m, r->st, l, (int)pos)) < 0) break;
    to_fp16(ckv_model_state_k(r->st), r->k16, r->mc->kv_dim);
    to_fp16(ckv_model_state_v(r->st), r->v16, r->mc->kv_dim);
    if ((e = ckv_session_write_kv(r->s, pos, (uint32_t)l, r->k16, r->v16)) < 0) break;
    if ((e = attend_view(r, (uint32_t)l, pos + 1)) < 0) break;
    e = ckv_model_finish_layer(r->m, r->st, l, ckv_model_state_attn_buf(r->st));
  }
  return e < 0 ? e : ckv_model_logits(r->m, r->st, r->logits);
}

/* Rounds a row through FP16 (the shadow's FP16 baseline) or keeps it. */
static void shadow_store(const run *r, const float *x, float *dst) {
  int n = r->mc->kv_dim;
  for (int i = 0; i < n; i++) dst[i] = r->o->shadow_fp32 ? x[i] : ckv_f16_to_f32(ckv_f32_to_f16(x[i]));
}

/* The shadow path: the model's reference attention over a private cache. */
static int step_shadow(run *r, int token, uint64_t pos) {
  const ckv_model_config *c = r->mc;
  size_t layer_floats = (size_t)c->seq_len * (size_t)c->kv_dim;
  int e = ckv_model_embed(r->m, r->sh, token);
  for (int l = 0; e == CKV_OK && l < c->n_layers; l++) {
    if ((e = ckv_model_qkv(r->m, r->sh, l, (int)pos)) < 0) break;
    float *kc = r->sh_k + (size_t)l * layer_floats, *vc = r->sh_v + (size_t)l * layer_floats;
    shadow_store(r, ckv_model_state_k(r->sh), kc + pos * (size_t)c->kv_dim);
    shadow_store(r, ckv_model_state_v(r->sh), vc + pos * (size_t)c->kv_dim);
    float *out = ckv_model_state_attn_buf(r->sh);
    e = ckv_model_attend_fp32(c, ckv_model_state_q(r->sh), kc, vc, (size_t)c->kv_dim, (int)pos + 1, out, NULL);
    if (e == CKV_OK) e = ckv_model_finish_layer(r->m, r->sh, l, out);
  }
  return e < 0 ? e : ckv_model_logits(r->m, r->sh, r->sh_logits);
}

/* KL and top-1 agreement of this step's two distributions. */
static void compare(run *r) {
  int n = r->mc->vocab_size;
  double kl = ckv_model_kl(r->sh_logits, r->logits, n);
  r->res->kl_sum += kl;
  if (kl > r->res->kl_max || isnan(kl)) r->res->kl_max = kl;
  memcpy(r->probs, r->sh_logits, (size_t)n * sizeof(float));
  ckv_model_softmax(r->probs, n);
  int top = ckv_model_argmax(r->probs, n);
  float second = 0.f;
  for (int i = 0; i < n; i++)
    if (i != top && r->probs[i] > second) second = r->probs[i];
  if (r->probs[top] - second > LLM_TOP1_MARGIN) {
    r->res->top1_counted++;
    if (ckv_model_argmax(r->logits, n) == top) r->res->top1_agree++;
  }
}

/* Appends one token, runs it through both paths, compares.  The token joins
 * the stream a rebuilt session is re-prefilled from once its K/V is in the
 * daemon's slots. */
static int step(run *r, int token, uint8_t role, uint8_t tag) {
  uint32_t id = (uint32_t)token;
  uint64_t pos;
  int e = ckv_session_append(r->s, 1, &role, &tag, NULL, &id, &pos);
  if (e < 0) return e;
  if (pos != r->n_done) return CKV_ERR_PROTO; /* the daemon's stream is not ours */
  if ((e = refresh_view(r)) < 0) return e;
  if ((e = step_commitkv(r, token, pos)) < 0) return e;
  r->ids[pos] = id;
  r->roles[pos] = role;
  r->tags[pos] = tag;
  r->n_done = pos + 1;
  if (r->sh) {
    if ((e = step_shadow(r, token, pos)) < 0) return e;
    compare(r);
  }
  r->res->steps++;
  r->res->tokens = pos + 1;
  return CKV_OK;
}

/* The next token: sampled for a user turn, greedy for an assistant turn,
 * from the shadow's logits when there is a shadow (teacher forcing). */
static int next_token(run *r, uint8_t role) {
  const float *lg = r->sh ? r->sh_logits : r->logits;
  float temperature = role == CKV_ROLE_USER ? 1.0f : 0.0f;
  return ckv_model_sample(lg, r->mc->vocab_size, temperature, &r->rng);
}

/* ---- riding through a daemon restart ---------------------------------------- */

/* A new, empty session takes the stream again: every token appended on its
 * own and run through the model, as the first time, so each one's K/V comes
 * from attention over what the new session holds.  The round's attention
 * mass and the shadow are left as they were; the last token's logits are
 * the ones the next token is chosen from. */
static int reprefill(run *r) {
  uint64_t n = r->n_done;
  memcpy(r->saved_mass, r->mass, (size_t)r->mc->seq_len * sizeof(float));
  r->n_done = 0;
  int e = CKV_OK;
  for (uint64_t p = 0; e == CKV_OK && p < n; p++) {
    uint64_t pos;
    e = ckv_session_append(r->s, 1, &r->roles[p], &r->tags[p], NULL, &r->ids[p], &pos);
    if (e == CKV_OK && pos != p) e = CKV_ERR_PROTO;
    if (e == CKV_OK) e = refresh_view(r);
    if (e == CKV_OK) e = step_commitkv(r, (int)r->ids[p], p);
  }
  memcpy(r->mass, r->saved_mass, (size_t)r->mc->seq_len * sizeof(float));
  r->n_done = n; /* a failed re-prefill is started over on a new session */
  return e;
}

/* After `what` failed with `status` because the daemon went away: re-attach
 * with backoff, reopen the session, re-prefill it when it came back empty.
 * t0: when the failed step began, so the line printed says how long the
 * worker was held up.  Says why when it gives up. */
static int recover(run *r, int status, const char *what, long long t0) {
  const opts *o = r->o;
  long long deadline = reconnect_now_ms() + o->reconnect_ms;
  bool restarted = false, fresh = false;
  int e;
  const char *step_what = "reopen";
  for (;;) {
    if ((e = reconnect_client(r->c, deadline)) < 0) {
      fprintf(stderr, "commitkv-llm: %s: %s failed (%s) and the daemon did not come back within %d ms: %s: %s\n",
              r->res->id, what, ckv_strerror(status), o->reconnect_ms, ckv_strerror(e), ckv_client_last_error(r->c));
      return e;
    }
    if (strcmp(ckv_client_memory_kind(r->c), "host") != 0) {
      fprintf(stderr, "commitkv-llm: the daemon came back with '%s' KV memory, which the CPU cannot address\n",
              ckv_client_memory_kind(r->c));
      return CKV_ERR_UNSUPPORTED;
    }
    bool was_stale = false;
    step_what = "reopen";
    e = reconnect_session(r->c, &r->s, r->res->id, &r->geom, &r->sopts, r->n_done, !r->report_lost, &fresh,
                          &was_stale);
    restarted |= was_stale;
    if (e == CKV_OK) {
      r->report_lost = false;
      r->acked = 0; /* a resumed session's acknowledgements start over too */
      if (fresh) {
        r->reported = 0;
        step_what = "re-prefill";
        e = reprefill(r);
      }
    }
    if (e == CKV_OK) break;
    if (!reconnect_daemon_gone(r->c, r->s, e) || reconnect_now_ms() >= deadline) {
      fprintf(stderr, "commitkv-llm: %s: after the daemon came back: %s: %s: %s\n", r->res->id, step_what,
              ckv_strerror(e), ckv_client_last_error(r->c));
      return e;
    }
  }
  r->res->reconnects++;
  fprintf(stderr,
          "commitkv-llm: %s: %s: reconnected after %lld ms, reopened 1 sessions, re-prefilled %" PRIu64
          " tokens (%s: %s)\n",
          r->res->id, restarted ? "daemon restarted" : "daemon answered again", reconnect_now_ms() - t0,
          fresh ? r->n_done : 0, what, ckv_strerror(status));
  return CKV_OK;
}

/* Whether a failure of `what` is one to recover from; recovers if so.
 * Returns CKV_OK to try `what` again, else the status to fail with. */
static int recover_or_fail(run *r, int status, const char *what, long long t0) {
  if (!r->o->reconnect_ms || !reconnect_daemon_gone(r->c, r->s, status)) return status;
  return recover(r, status, what, t0);
}

/* One token, as often as a daemon restart makes it necessary. */
static int step_retry(run *r, int token, uint8_t role, uint8_t tag) {
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = step(r, token, role, tag);
    if (e == CKV_OK) return CKV_OK;
    if ((e = recover_or_fail(r, e, "token", t0)) < 0) return e;
  }
}

/* ---- the daemon's figures -------------------------------------------------- */

/* Finds this session in ListSessions.  *ret_pending: tokens still being moved. */
static int session_info(run *r, uint64_t *ret_epoch, uint64_t *ret_pending) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  Commitkv__V1__Response *rep;
  int e = ckv_rpc(r->c, &req, &rep);
  if (e < 0) return e;
  e = CKV_ERR_NOT_FOUND;
  const Commitkv__V1__SessionList *l = rep->body_case == COMMITKV__V1__RESPONSE__BODY_SESSION_LIST ? rep->session_list : NULL;
  for (size_t i = 0; l && i < l->n_sessions; i++) {
    const Commitkv__V1__SessionInfo *si = l->sessions[i];
    if (strcmp(si->session_id, ckv_session_id(r->s)) || !si->bytes || !si->tokens) continue;
    snprintf(r->res->policy, sizeof(r->res->policy), "%s", si->policy ? si->policy : "");
    r->res->bytes_total = si->bytes->total;
    r->res->bytes_fp16_live = si->bytes->fp16_equivalent;
    uint64_t by[3] = {si->bytes->draft, si->bytes->staged, si->bytes->committed};
    memcpy(r->res->bytes_state, by, sizeof(by));
    uint64_t st[4] = {si->tokens->draft, si->tokens->staged, si->tokens->committed, si->tokens->recycled};
    memcpy(r->res->states, st, sizeof(st));
    *ret_epoch = si->epoch;
    *ret_pending = si->pending_tokens;
    e = CKV_OK;
  }
  ckv_rpc_free(rep);
  return e;
}

/* Waits until the session's pending transitions are published.  Tokens
 * waiting for a committed chunk to fill stay pending for good, so it stops
 * once neither the epoch nor the pending count moved for LLM_SETTLE_QUIET
 * polls.  With final (no view is read any more) it also acknowledges each
 * epoch it sees, so the bytes read last are the settled footprint; during a
 * session the next refresh_view() acknowledges instead, once it holds the
 * view of that epoch (the library only refetches after a reply told it of a
 * newer epoch, which the next append does). */
static int settle(run *r, int poll_ms, bool final) {
  struct timespec nap = {0, poll_ms * 1000L * 1000L};
  uint64_t last_pending = UINT64_MAX, last_epoch = 0;
  int quiet = 0;
  for (int waited = 0;; waited += poll_ms) {
    uint64_t epoch = 0, pending = 0;
    int e = session_info(r, &epoch, &pending);
    if (e < 0) return e;
    if (final && epoch > r->acked) {
      if ((e = ckv_session_ack(r->s, epoch, NULL)) < 0) return e;
      r->acked = epoch;
      quiet = 0;
      continue; /* re-read: the ack may have reclaimed retired blocks */
    }
    quiet = pending == last_pending && epoch == last_epoch ? quiet + 1 : 0;
    last_pending = pending;
    last_epoch = epoch;
    if (!pending || quiet >= LLM_SETTLE_QUIET || waited >= LLM_SETTLE_MS) return CKV_OK;
    nanosleep(&nap, NULL);
  }
}

/* ---- rounds --------------------------------------------------------------- */

/* The end of a turn: the report (once), then a fresh view. */
static int finish_turn(run *r, int round) {
  int e;
  if (r->reported < (uint64_t)round) {
    ckv_round_result rr;
    e = ckv_session_report(r->s, (uint64_t)round, 0, r->mass, ckv_session_tokens(r->s), &rr);
    if (e < 0) {
      r->report_lost = e == CKV_ERR_TIMEOUT; /* sent; whether the daemon took it is unknown */
      return e;
    }
    r->reported = (uint64_t)round;
    r->pending = rr.pending;
  }
  r->res->rounds = (uint64_t)round;
  if (r->o->sync && r->pending && (e = settle(r, LLM_SYNC_POLL_MS, /* final= */ false)) < 0) return e;
  return refresh_view(r);
}

/* One turn = one round: its tokens, then the report and a fresh view.  Each
 * token is chosen once: a daemon restart repeats the step, not the choice. */
static int turn(run *r, int round) {
  uint8_t role = (round % 2) ? CKV_ROLE_USER : CKV_ROLE_ASSISTANT;
  int n = role == CKV_ROLE_USER ? r->o->user_tokens : r->o->assistant_tokens, e;
  memset(r->mass, 0, (size_t)r->mc->seq_len * sizeof(float));
  if (round == 1 && (e = step_retry(r, LLM_BOS, CKV_ROLE_SYSTEM, CKV_TAG_TURN_START)) < 0) return e;
  for (int i = 0; i < n; i++)
    if ((e = step_retry(r, next_token(r, role), role, i == 0 ? CKV_TAG_TURN_START : 0)) < 0) return e;
  for (;;) {
    long long t0 = reconnect_now_ms();
    if ((e = finish_turn(r, round)) == CKV_OK) return CKV_OK;
    if ((e = recover_or_fail(r, e, "report", t0)) < 0) return e;
  }
}

/* ---- setup and teardown ----------------------------------------------------- */

static int run_init(run *r, const opts *o, const ckv_model *m, ckv_client *c, result *res) {
  *r = (run){.o = o, .m = m, .mc = ckv_model_config_get(m), .c = c, .res = res};
  const ckv_model_config *mc = r->mc;
  size_t cache = (size_t)mc->n_layers * (size_t)mc->seq_len * (size_t)mc->kv_dim;
  r->geom = (ckv_geometry){.n_layers = (uint32_t)mc->n_layers, .n_kv_heads = (uint32_t)mc->n_kv_heads,
                           .head_dim = (uint32_t)mc->head_dim, .dtype = CKV_DTYPE_FP16};
  r->sopts = (ckv_session_options){.policy = o->policy, .param_names = o->param_names,
                                   .param_values = o->param_values, .n_params = o->n_params};
  int e = ckv_model_state_new(m, /* private_cache= */ false, &r->st);
  if (e == CKV_OK && o->shadow) e = ckv_model_state_new(m, /* private_cache= */ false, &r->sh);
  if (e < 0) return e;
  r->logits = malloc((size_t)mc->vocab_size * sizeof(float));
  r->sh_logits = malloc((size_t)mc->vocab_size * sizeof(float));
  r->probs = malloc((size_t)mc->vocab_size * sizeof(float));
  r->k16 = malloc((size_t)mc->kv_dim * sizeof(uint16_t));
  r->v16 = malloc((size_t)mc->kv_dim * sizeof(uint16_t));
  r->mass = calloc((size_t)mc->seq_len, sizeof(float));
  r->saved_mass = calloc((size_t)mc->seq_len, sizeof(float));
  r->ids = calloc((size_t)mc->seq_len, sizeof(uint32_t));
  r->roles = calloc((size_t)mc->seq_len, 1);
  r->tags = calloc((size_t)mc->seq_len, 1);
  if (o->shadow) {
    r->sh_k = calloc(cache, sizeof(float));
    r->sh_v = calloc(cache, sizeof(float));
  }
  if (!r->logits || !r->sh_logits || !r->probs || !r->k16 || !r->v16 || !r->mass || !r->saved_mass || !r->ids ||
      !r->roles || !r->tags || (o->shadow && (!r->sh_k || !r->sh_v)))
    return -ENOMEM;
  return CKV_OK;
}

static void run_done(run *r) {
  ckv_model_state_free(r->st);
  ckv_model_state_free(r->sh);
  free(r->logits);
  free(r->sh_logits);
  free(r->probs);
  free(r->sh_k);
  free(r->sh_v);
  free(r->k16);
  free(r->v16);
  free(r->mass);
  free(r->saved_mass);
  free(r->ids);
  free(r->roles);
  free(r->tags);
  free(r->slot_mass);
  free((void *)r->blocks);
  free(r->ws);
}

/* Opens the session; a daemon that went away meanwhile is waited for. */
static int open_session(run *r, int idx) {
  snprintf(r->res->id, sizeof(r->res->id), "%s-%d", r->o->prefix, idx);
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = ckv_session_open(r->c, r->res->id, &r->geom, &r->sopts, &r->s);
    if (e == CKV_OK) return CKV_OK;
    r->s = NULL;
    if ((e = recover_or_fail(r, e, "open", t0)) < 0) return e;
    if (r->s) return CKV_OK; /* the recovery opened it */
  }
}

/* Closes (--keep) or drops the session at the end.  A kept session lost
 * with the daemon is rebuilt first; a dropped one is gone with it anyway. */
static int end_session(run *r) {
  const char *what = r->o->keep ? "close" : "drop";
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = r->o->keep ? ckv_session_close(r->s) : ckv_session_drop(r->s);
    r->s = NULL; /* freed in every case */
    if (e == CKV_OK || (!r->o->keep && e == CKV_ERR_DAEMON_RESTARTED)) return CKV_OK;
    if ((e = recover_or_fail(r, e, what, t0)) < 0) return e;
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs one whole session; prints why it failed. */
static int run_session(const opts *o, const ckv_model *m, ckv_client *c, int idx, result *res) {
  run r;
  double t0 = now_s();
  int e = run_init(&r, o, m, c, res);
  const char *what = "setup";
  if (e == CKV_OK && (e = open_session(&r, idx)) < 0) what = "open session";
  ckv_model_rng_seed(&r.rng, o->seed + (uint64_t)idx);
  for (int round = 1; e == CKV_OK && round <= o->rounds; round++) {
    if ((e = turn(&r, round)) < 0) what = "round";
    note("%s: round %d/%d, %" PRIu64 " tokens\n", res->id, round, o->rounds, res->tokens);
  }
  while (e == CKV_OK) {
    long long t1 = reconnect_now_ms();
    if ((e = settle(&r, LLM_SETTLE_POLL_MS, /* final= */ true)) == CKV_OK) break;
    what = "list sessions";
    if ((e = recover_or_fail(&r, e, what, t1)) < 0) break;
  }
  if (e < 0)
    fprintf(stderr, "commitkv-llm: %s: %s: %s%s%s\n", res->id, what, ckv_strerror(e), *ckv_client_last_error(c) ? ": " : "",
            ckv_client_last_error(c));
  if (e == CKV_OK && r.s) {
    if ((e = end_session(&r)) < 0)
      fprintf(stderr, "commitkv-llm: %s: %s: %s\n", res->id, o->keep ? "close" : "drop", ckv_strerror(e));
  } else if (r.s) {
    (void)(o->keep ? ckv_session_close(r.s) : ckv_session_drop(r.s));
  }
  res->bytes_fp16 = res->tokens * 2u * (uint64_t)r.mc->n_layers * (uint64_t)r.mc->kv_dim * 2u;
  res->seconds = now_s() - t0;
  run_done(&r);
  return e;
}

/* ---- output --------------------------------------------------------------- */

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

/* A number, or null when there is nothing to measure (no shadow). */
static void json_num(const char *key, double v, bool have) {
  if (have && isfinite(v))
    printf("\"%s\": %.9g", key, v);
  else
    printf("\"%s\": null", key);
}

static void print_json(const opts *o, const char *path, const result *res, int n) {
  uint64_t counted = 0, agree = 0, steps = 0, bt = 0, bf = 0;
  double kl = 0;
  printf("{\"model\": ");
  json_string(path);
  printf(", \"policy\": ");
  json_string(n > 0 && res[0].policy[0] ? res[0].policy : o->policy ? o->policy : "default");
  printf(", \"shadow\": %s, \"sessions\": [", !o->shadow ? "null" : o->shadow_fp32 ? "\"fp32\"" : "\"fp16\"");
  for (int i = 0; i < n; i++) {
    const result *x = &res[i];
    printf("%s{\"id\": ", i ? ", " : "");
    json_string(x->id);
    printf(", \"tokens\": %" PRIu64 ", \"rounds\": %" PRIu64 ", ", x->tokens, x->rounds);
    json_num("top1_agreement", ratio((double)x->top1_agree, (double)x->top1_counted), o->shadow && x->top1_counted);
    printf(", \"top1_counted\": %" PRIu64 ", ", x->top1_counted);
    json_num("kl_mean", ratio(x->kl_sum, (double)x->steps), o->shadow && x->steps);
    printf(", ");
    json_num("kl_max", x->kl_max, o->shadow && x->steps);
    printf(", \"steps\": %" PRIu64 ", \"bytes_total\": %" PRIu64 ", \"bytes_fp16\": %" PRIu64
           ", \"bytes_fp16_live\": %" PRIu64 ", ",
           x->steps, x->bytes_total, x->bytes_fp16, x->bytes_fp16_live);
    json_num("bytes_ratio_fp16", ratio((double)x->bytes_total, (double)x->bytes_fp16), true);
    printf(", \"bytes_by_state\": {\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64 "}",
           x->bytes_state[0], x->bytes_state[1], x->bytes_state[2]);
    printf(", \"token_states\": {\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64
           ", \"recycled\": %" PRIu64 "}, \"seconds\": %.3f, \"reconnects\": %d}",
           x->states[0], x->states[1], x->states[2], x->states[3], x->seconds, x->reconnects);
    counted += x->top1_counted, agree += x->top1_agree, steps += x->steps, kl += x->kl_sum;
    bt += x->bytes_total, bf += x->bytes_fp16;
  }
  printf("], ");
  json_num("top1_agreement", ratio((double)agree, (double)counted), o->shadow && counted);
  printf(", ");
  json_num("kl_mean", ratio(kl, (double)steps), o->shadow && steps);
  printf(", ");
  json_num("bytes_ratio_fp16", ratio((double)bt, (double)bf), true);
  printf("}\n");
}

static void print_line(const opts *o, const result *x) {
  printf("%s: %" PRIu64 " tokens, %" PRIu64 " rounds, ", x->id, x->tokens, x->rounds);
  if (o->shadow)
    printf("top1 %.4f (%" PRIu64 "/%" PRIu64 "), KL mean %.3g max %.3g, ",
           ratio((double)x->top1_agree, (double)x->top1_counted), x->top1_agree, x->top1_counted,
           ratio(x->kl_sum, (double)x->steps), x->kl_max);
  printf("bytes %" PRIu64 " (d/s/c %" PRIu64 "/%" PRIu64 "/%" PRIu64 ") / FP16 %" PRIu64 " = %.3f, states d/s/c/r %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64
         ", %.2fs\n",
         x->bytes_total, x->bytes_state[0], x->bytes_state[1], x->bytes_state[2], x->bytes_fp16,
         ratio((double)x->bytes_total, (double)x->bytes_fp16), x->states[0],
         x->states[1], x->states[2], x->states[3], x->seconds);
  if (x->reconnects) printf("%s: reconnected to the daemon %d times\n", x->id, x->reconnects);
}

/* ---- main ----------------------------------------------------------------- */

static int load_model(const char *path, ckv_model **ret) {
  int e = ckv_model_load(path, ret);
  if (e < 0)
    fprintf(stderr, "commitkv-llm: cannot load model %s: %s (set --model, CKV_MODEL or CKV_MODEL_DIR)\n", path,
            ckv_strerror(e));
  return e;
}

int main(int argc, char **argv) {
  char default_prefix[64], env_path[4096];
  snprintf(default_prefix, sizeof(default_prefix), "llm-%ld", (long)getpid());
  opts o = {.prefix = default_prefix, .sessions = 2, .rounds = 20, .user_tokens = 16, .assistant_tokens = 16,
            .seed = 1, .reconnect_ms = RECONNECT_DEFAULT_GIVE_UP_MS};
  if (parse_args(argc, argv, &o) < 0) return 2;
  g_quiet = o.quiet;
  const char *path = model_path(&o, env_path, sizeof(env_path));
  ckv_model *m = NULL;
  if (load_model(path, &m) < 0) return 1;
  const ckv_model_config *mc = ckv_model_config_get(m);
  if (session_tokens(&o) > (uint64_t)mc->seq_len) {
    fprintf(stderr, "commitkv-llm: %" PRIu64 " tokens per session exceed the model's %d positions\n",
            session_tokens(&o), mc->seq_len);
    ckv_model_free(m);
    return 2;
  }
  ckv_client_options co = {.socket = o.socket, .attach_socket = o.attach, .name = "commitkv-llm", .heartbeat = true};
  ckv_client *c = NULL;
  int e = ckv_client_connect(&co, &c);
  if (e < 0) {
    fprintf(stderr, "commitkv-llm: cannot reach commitkvd (%s): %s\n", o.socket ? o.socket : "default socket",
            ckv_strerror(e));
    ckv_model_free(m);
    return 1;
  }
  if (strcmp(ckv_client_memory_kind(c), "host") != 0) { /* the model runs on the CPU, reading K/V in place */
    fprintf(stderr, "commitkv-llm: the daemon's KV memory is '%s', which the CPU cannot address: run commitkvd "
                    "--backend host\n", ckv_client_memory_kind(c));
    ckv_client_free(c);
    ckv_model_free(m);
    return 1;
  }
  result res[LLM_MAX_SESSIONS] = {0};
  for (int i = 0; e == CKV_OK && i < o.sessions; i++) {
    e = run_session(&o, m, c, i, &res[i]);
    if (e == CKV_OK && !o.json) print_line(&o, &res[i]);
  }
  if (e == CKV_OK && o.json) print_json(&o, path, res, o.sessions);
  ckv_client_free(c);
  ckv_model_free(m);
  return e == CKV_OK ? 0 : 1;
}
