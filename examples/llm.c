/* llm.c - commitkv-llm: a worker that runs a real model (a llama2.c-format
 * checkpoint, stories260K by default) with its KV cache in commitkvd.
 *
 * Each session is a multi-turn conversation driven by token ids (the model
 * ships without a tokenizer): BOS (role system), then --rounds turns that
 * alternate a "user" turn of --user-tokens tokens sampled from the model
 * (temperature 1, seeded PRNG) and an "assistant" turn of --assistant-tokens
 * tokens generated greedily.  One turn is one round of the lifecycle.  The
 * per-token machinery is examples/llm/worker.c, shared with commitkv-dialogue
 * (which drives the model with the bytes of dialogues instead).  Every
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
 *                [--semantic embed|none]
 *   commitkv-llm --dialogues FILE.jsonl [commitkv-dialogue's options]
 *
 * With --dialogues it is commitkv-dialogue (examples/llm/dialogue_run.c):
 * the agent model's dialogues as multi-turn sessions, each round one user
 * turn and the model's own answer, recall by exact match of its greedy
 * answers, KL and top-1 against the FP16 shadow, bytes per round.
 *
 * Semantic scores (--semantic embed, the default): each turn is embedded
 * from the model's own final hidden states and every token scored by
 * similarity to the task (BOS and the first user turn) and by novelty
 * (commitkv/semantic.h); the scores travel with each report.  --semantic
 * none sends none, and the daemon estimates them from token-id rarity.
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

#include "commitkv/commitkv.h"
#include "examples/common/reconnect.h"
#include "examples/llm/dialogue_run.h"
#include "examples/llm/model.h"
#include "examples/llm/worker.h"

#define LLM_BOS 1
#define LLM_MAX_SESSIONS 64
#define LLM_FALLBACK_MODEL "../shared/models/" CKV_MODEL_DEFAULT_FILE

typedef struct opts {
  const char *socket, *attach, *model, *prefix;
  int sessions, rounds, user_tokens, assistant_tokens;
  uint64_t seed;
  bool json, quiet;
  llm_worker_options w; /* policy, shadow, sync, keep, reconnect; params point into the arrays below */
  llm_worker_params params; /* --param overrides */
} opts;

typedef llm_worker_stats result;

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
          "                    [--reconnect-timeout-ms MS] [--semantic embed|none]\n"
          "       commitkv-llm --dialogues FILE.jsonl [commitkv-dialogue's options]\n"
          "                    (the agent dialogues, recall by exact match: commitkv-dialogue --help)\n");
}

/* --dialogues (or --dialogues=F) anywhere on the line: the dialogue run. */
static int wants_dialogues(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--dialogues") || !strncmp(argv[i], "--dialogues=", 12)) return 1;
  return 0;
}

static int parse_int(const char *s, int lo, int hi, int *ret) {
  long v;
  if (llm_worker_parse_long(s, lo, hi, &v) < 0) return -1;
  *ret = (int)v;
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
      {"reconnect-timeout-ms", required_argument, 0, 'R'}, {"semantic", required_argument, 0, 'E'},
      {0, 0, 0, 0}};
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
      case 'P': o->w.policy = optarg; break;
      case 'K': bad = llm_worker_params_add(&o->params, optarg); break;
      case 'w': o->w.shadow = true; break;
      case 'W': o->w.shadow = o->w.shadow_fp32 = true; break;
      case 'j': o->json = true; break;
      case 'p': o->prefix = optarg; break;
      case 'q': o->quiet = true; break;
      case 'k': o->w.keep = true; break;
      case 'y': o->w.sync = true; break;
      case 'R': bad = parse_int(optarg, 0, 24 * 3600 * 1000, &o->w.reconnect_ms); break;
      case 'E': bad = llm_worker_parse_semantic(optarg, &o->w); break;
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


/* ---- one session -------------------------------------------------------------- */

/* The next token: sampled for a user turn, greedy for an assistant turn,
 * from the shadow's logits when there is a shadow (teacher forcing). */
static int next_token(llm_worker *w, ckv_model_rng *rng, uint8_t role) {
  const float *lg = w->sh ? w->sh_logits : w->logits;
  float temperature = role == CKV_ROLE_USER ? 1.0f : 0.0f;
  return ckv_model_sample(lg, w->mc->vocab_size, temperature, rng);
}

/* One turn = one round: its tokens, then the report and a fresh view.  Each
 * token is chosen once: a daemon restart repeats the step, not the choice. */
static int turn(const opts *o, llm_worker *w, ckv_model_rng *rng, int round) {
  uint8_t role = (round % 2) ? CKV_ROLE_USER : CKV_ROLE_ASSISTANT;
  int n = role == CKV_ROLE_USER ? o->user_tokens : o->assistant_tokens, e;
  if (round == 1 && (e = llm_worker_token(w, LLM_BOS, CKV_ROLE_SYSTEM, CKV_TAG_TURN_START)) < 0) return e;
  for (int i = 0; i < n; i++)
    if ((e = llm_worker_token(w, next_token(w, rng, role), role, i == 0 ? CKV_TAG_TURN_START : 0)) < 0) return e;
  return llm_worker_end_round(w, round);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs one whole session; prints why it failed. */
static int run_session(const opts *o, const ckv_model *m, ckv_client *c, int idx, result *res) {
  llm_worker w;
  ckv_model_rng rng;
  char id[160];
  double t0 = now_s();
  int e = llm_worker_init(&w, &o->w, m, c, res);
  const char *what = "setup";
  snprintf(id, sizeof(id), "%s-%d", o->prefix, idx);
  if (e == CKV_OK && (e = llm_worker_open(&w, id)) < 0) what = "open session";
  /* session idx of --seed S: a stream of its own (S + idx made worker S's
   * second session repeat worker S+1's first) */
  ckv_model_rng_seed(&rng, o->seed * 0x9e3779b97f4a7c15ull + (uint64_t)idx * 0xbf58476d1ce4e5b9ull + 1u);
  for (int round = 1; e == CKV_OK && round <= o->rounds; round++) {
    if ((e = turn(o, &w, &rng, round)) < 0) what = "round";
    note("%s: round %d/%d, %" PRIu64 " tokens\n", res->id, round, o->rounds, res->tokens);
  }
  if (e == CKV_OK && (e = llm_worker_settle(&w)) < 0) what = "list sessions";
  if (e < 0)
    fprintf(stderr, "commitkv-llm: %s: %s: %s%s%s\n", id, what, ckv_strerror(e), *ckv_client_last_error(c) ? ": " : "",
            ckv_client_last_error(c));
  if (e == CKV_OK) {
    if ((e = llm_worker_end(&w, /* recover= */ true)) < 0)
      fprintf(stderr, "commitkv-llm: %s: %s: %s\n", id, o->w.keep ? "close" : "drop", ckv_strerror(e));
  } else {
    (void)llm_worker_end(&w, /* recover= */ false);
  }
  res->bytes_fp16 = res->tokens * 2u * (uint64_t)w.mc->n_layers * (uint64_t)w.mc->kv_dim * 2u;
  res->seconds = now_s() - t0;
  llm_worker_done(&w);
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
  json_string(n > 0 && res[0].policy[0] ? res[0].policy : o->w.policy ? o->w.policy : "default");
  printf(", \"shadow\": %s, \"sessions\": [", !o->w.shadow ? "null" : o->w.shadow_fp32 ? "\"fp32\"" : "\"fp16\"");
  for (int i = 0; i < n; i++) {
    const result *x = &res[i];
    printf("%s{\"id\": ", i ? ", " : "");
    json_string(x->id);
    printf(", \"tokens\": %" PRIu64 ", \"rounds\": %" PRIu64 ", ", x->tokens, x->rounds);
    json_num("top1_agreement", ratio((double)x->top1_agree, (double)x->top1_counted), o->w.shadow && x->top1_counted);
    printf(", \"top1_counted\": %" PRIu64 ", ", x->top1_counted);
    json_num("kl_mean", ratio(x->kl_sum, (double)x->steps), o->w.shadow && x->steps);
    printf(", ");
    json_num("kl_max", x->kl_max, o->w.shadow && x->steps);
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
  json_num("top1_agreement", ratio((double)agree, (double)counted), o->w.shadow && counted);
  printf(", ");
  json_num("kl_mean", ratio(kl, (double)steps), o->w.shadow && steps);
  printf(", ");
  json_num("bytes_ratio_fp16", ratio((double)bt, (double)bf), true);
  printf("}\n");
}

static void print_line(const opts *o, const result *x) {
  printf("%s: %" PRIu64 " tokens, %" PRIu64 " rounds, ", x->id, x->tokens, x->rounds);
  if (o->w.shadow)
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
            .seed = 1, .w = {.prog = "commitkv-llm", .reconnect_ms = RECONNECT_DEFAULT_GIVE_UP_MS}};
  if (wants_dialogues(argc, argv)) return ckv_dialogue_main(argc, argv);
  if (parse_args(argc, argv, &o) < 0) return 2;
  o.w.param_names = o.params.names;
  o.w.param_values = o.params.values;
  o.w.n_params = o.params.n;
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

