/* dialogue_run.c - commitkv-dialogue (and commitkv-llm --dialogues): agent
 * dialogues (tools/agentlm's schema) through a real model whose KV cache
 * lives in commitkvd; recall by exact match of the model's greedy answers.
 *
 *   commitkv-dialogue --dialogues FILE.jsonl [--model PATH] [--policy NAME]
 *                     [--param key=value ...] [--shadow] [--shadow-fp32]
 *                     [--json] [--limit N] [--bos ID] [--socket EP]
 *                     [--attach-socket PATH] [--prefix ID] [--sync] [--keep]
 *                     [--quiet] [--reconnect-timeout-ms MS] [--semantic entities|embed|none|oracle]
 *                     [--surprise NATS] [--share-prefix] [--keep-copies]
 *
 * A byte-level model (ids 0..255 are bytes; BOS --bos, by default 256 when
 * the vocabulary is 257, else 1).  Each dialogue is one session, each turn
 * one round: BOS (round 1, role system), then the bytes of "R: text\n" with
 * the turn's role (S system, U user, A assistant, T tool; the first byte
 * tagged turn start, as commitkv-llm tags its turns), one token at a time
 * through examples/llm/worker.c (K/V into the daemon's draft slots, fused
 * attention over the session's view), then the round's attention mass
 * reported and the view acknowledged.  At an answer turn listed in
 * "recall", "A: " is fed, then the model decodes greedily (argmax of the
 * commitkv path's logits) until a newline or 200 bytes, aside (the decoded
 * bytes never enter the session: llm_worker_decode_aside), and the answer is
 * right when it equals answer + "\n" byte for byte.  The dialogue then goes
 * on with the reference text of that turn, so later turns see the true
 * context.
 *
 * With --shadow every token also runs through the FP16 shadow (worker.h):
 * KL(p_shadow || p_commitkv) and top-1 agreement at every appended token,
 * and at each answer turn the shadow decodes too (from its own logits over
 * its own cache), which gives the FP16 baseline's recall on the same run
 * ("shadow_recall").  The policy's recall always comes from its own greedy
 * answers: a policy that loses the fact gets the question wrong even where
 * the shadow answers it.
 *
 * Reported per policy run: recall overall, per fact kind (from the answer
 * sentence, examples/llm/dialogues.c) and per distance in bytes (from where
 * the fact was stated to the answer, the buckets of tools/agentlm/eval.py);
 * KL and top-1 against the shadow; the session's bytes against FP16 K/V of
 * the tokens appended (ListSessions, as commitkv-llm reads them) after every
 * round and at the end (after the pending transitions settled).  A table for
 * people, --json for machines (one object; "params" the session overrides
 * sent; "said_hex" holds each answer's bytes exactly, "said" the same bytes
 * read as Latin-1).
 *
 * Semantic scores (--semantic entities is the default, below): with
 * --semantic embed (worker.h) each turn is embedded from the model's final
 * hidden states; system turns and the first
 * user turn of a topic state the task; a user turn that shifts the topic in
 * the dialogues' words ("Forget that, ...": dialogue_turn_is_topic_shift)
 * abandons it, which lowers the scores of the turns before it.  --semantic
 * none sends no scores (the daemon estimates them from token rarity).
 * --semantic entities scores each turn from its text: a turn that names an
 * entity (a number, date, id or name: dialogue_turn_names_entity) scores
 * DLG_ORACLE_FACT, every other one DLG_ORACLE_OTHER; a turn whose entities a
 * later assistant turn all restates (a confirmation, an answer) drops to
 * DLG_ORACLE_OTHER, and a turn that only repeats some of what a turn still
 * held as a fact says (an answer, a read-back: a *copy*,
 * dialogue_entity_label) scores DLG_ORACLE_OTHER from the start: its bytes
 * go to the cold tier, the turn it repeats stays (--keep-copies: copies are
 * facts, as before; the JSON counts them, "copy_turns").  With turn labels
 * (entities, oracle) a commitkv session is opened with
 * scored_persistence_rounds = DLG_TURN_LABEL_ROUNDS and fact_cold_rounds =
 * DLG_FACT_COLD_ROUNDS (the worker gathers the cold tokens each query needs).
 * --surprise NATS (default DLG_SURPRISE_NATS; 0 = off) adds the model's
 * own signal to the text's: both turns of a copy (copy_signal.h: an n-gram
 * the model predicted that had cost it NATS when an earlier turn said it)
 * are lasting facts, unless the entity rule judged the turn; a raise is
 * never taken back, by a later restatement or otherwise.  The JSON says how
 * many turns it raised ("surprise_turns").
 * --semantic oracle is a diagnostic, not a worker: turns that hold a value
 * of a recalled fact (dialogue_turn_holds_fact, read off the answers) score
 * DLG_ORACLE_FACT, a lasting fact's score, every other turn
 * DLG_ORACLE_OTHER, below the semantic filter: what bits by value keeps
 * when exactly the turns that hold an asked value are known.
 *
 * --share-prefix (issue 41's shared prefixes; docs/prefix-sharing.md): before
 * the dialogues, a keeper session (policy fp16, none of the --param
 * overrides: its blocks stay draft, hence published, where the lifecycle
 * would compress a lone holder's and take them out of the index) runs BOS
 * and the first dialogue's first turn through the model as usual and reports
 * round 1, which publishes its whole 16-token draft blocks; the worker keeps
 * what those tokens left behind (worker.h, llm_worker_prefix: ids, roles,
 * tags, hidden states, surprisals, shadow rows, the last logits, the round's
 * attention mass).  Each dialogue whose stream starts with those tokens (the
 * dialogue files' common system turn) opens its session with them as
 * token_ids + reuse_prefix; the session starts on the keeper's blocks
 * (matched_tokens), the worker adopts the kept bookkeeping for those
 * positions (turn embeddings, copy signal and semantic scores fed as if run,
 * with this dialogue's own labels; no K/V written: the model reads theirs
 * from the shared blocks through the view) and runs only the tokens past
 * them.  A session that matched another count is dropped and reopened
 * without reuse (said on stderr).  The keeper is dropped after the last
 * dialogue.  The JSON gains "share_prefix", "matched_tokens" (all sessions),
 * "keeper_tokens" (run once by the keeper) and "prefill_tokens_saved"
 * (matched_tokens - keeper_tokens), and per session "matched_tokens"; every
 * session reports "stream_nats", the -ln p of its tokens summed (a fingerprint
 * of what the model read, equal with and without sharing under fp16).  On the
 * first 12 public dialogues (test_agentlm_model): fp16 answers and stream_nats
 * identical, 80 tokens matched per session; the defaults 37/42 shared against
 * 35/42 private, since shared blocks stay FP16 (--param sink_tokens=80 without
 * sharing gives the shared answers byte for byte).
 *
 * A dialogue longer than the model's positions is cut after its last
 * answer turn; one whose answers do not fit is skipped (and counted).
 * Exit 0 on success, 1 on a runtime failure, 2 on bad arguments or a
 * malformed dialogue file. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
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
#include "examples/llm/dialogues.h"
#include "examples/llm/model.h"
#include "examples/llm/worker.h"

#define DLG_MAX_ANSWER 200 /* bytes decoded at most per answer */
#define DLG_BOS_BYTE_MODEL 256
#define DLG_BOS_DEFAULT 1
/* The daemon's default draft block (docs/prefix-sharing.md): only whole ones
 * are shared, so --share-prefix records and matches that many tokens of the
 * first turn, rounded down.  A daemon configured otherwise matches another
 * count, and the dialogues run unshared (said on stderr). */
#define DLG_DRAFT_BLOCK_TOKENS 16
#define DLG_FALLBACK_MODEL "../shared/models/" CKV_MODEL_DEFAULT_FILE
#define DLG_ORACLE_FACT 0.9f  /* --semantic oracle: >= CKV_FACT_SEMANTIC, a lasting fact */
#define DLG_ORACLE_OTHER 0.1f /* below the semantic filter (semantic_threshold 0.3) */
/* Turn labels (entities, oracle) mark whole turns fact or filler: the worker
 * asks the daemon to act on its word a round after staging instead of waiting
 * persistence_rounds for attention to agree (lifecycle/policy.h,
 * scored_persistence_rounds; --param scored_persistence_rounds=0 turns it off). */
#define DLG_TURN_LABEL_ROUNDS 1.0
/* ...and, since this worker gathers the cold tokens each query needs
 * (ckv_session_cold_gather), to send lasting facts to the cold tier this
 * many rounds after they commit (lifecycle/policy.h, fact_cold_rounds;
 * --param fact_cold_rounds=0 keeps them in primary memory): commitkvd's own
 * default is 0, for workers that read whole cold blocks. */
#define DLG_FACT_COLD_ROUNDS 2.0
/* The model's own signal beside the text's (llm_worker_options.surprise_nats,
 * examples/llm/copy_signal.h): both turns of a copy -- 5 bytes the model
 * predicted within 1 nat in all that had cost it at least 10 nats in an
 * earlier turn -- are lasting facts, for every turn the entity rule did not
 * judge.  Tune seed 9101 (12 dialogues each): variant A recall 0.083 -> 0.417
 * (FP16 0.375); base unchanged (0.875 at 0.197); the first 12 public
 * dialogues 0.881 at 0.178 -> 0.857 at 0.192.  Surprise alone (a turn with 2
 * bytes over 5 nats) found A's facts too (0.542) but also the public file's
 * small talk, which the model never saw either (0.237 of FP16). */
#define DLG_SURPRISE_NATS 10.0f

typedef struct opts {
  const char *socket, *attach, *model, *data, *prefix;
  size_t limit;
  int bos; /* -1: from the vocabulary */
  bool json, quiet;
  bool oracle;   /* --semantic oracle */
  bool entities; /* --semantic entities */
  bool share;    /* --share-prefix */
  bool keep_copies; /* --keep-copies: the entity scorer labels copies facts */
  llm_worker_options w;
  llm_worker_params params; /* --param overrides */
} opts;

/* One recall question, as answered. */
typedef struct item {
  size_t dialogue;
  const dialogue_recall *r;
  const char *kind;
  long distance;
  bool ok, shadow_ok;
  uint8_t said[DLG_MAX_ANSWER], shadow_said[DLG_MAX_ANSWER];
  int n_said, n_shadow_said;
  char why, shadow_why; /* llm_worker_decode_aside's */
} item;

/* One dialogue's session. */
typedef struct dlg_result {
  llm_worker_stats st;
  uint64_t matched; /* tokens the session started with from shared blocks (--share-prefix) */
  size_t dialogue;
  size_t turns_run;
  uint64_t *bytes_by_round, *tokens_by_round; /* after each round's report */
  size_t rounds;
  uint64_t copy_turns; /* turns the entity scorer labelled copies (dialogue_entity_label) */
} dlg_result;

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
          "usage: commitkv-dialogue --dialogues FILE.jsonl [--model PATH] [--policy NAME] [--param key=value ...]\n"
          "                         [--shadow] [--shadow-fp32] [--json] [--limit N] [--bos ID] [--socket EP]\n"
          "                         [--attach-socket PATH] [--prefix ID] [--sync] [--keep] [--quiet]\n"
          "                         [--reconnect-timeout-ms MS] [--semantic entities|embed|none|oracle]\n"
          "                         [--surprise NATS] [--share-prefix] [--keep-copies]\n");
}

static int parse_args(int argc, char **argv, opts *o) {
  static const struct option lo[] = {
      {"dialogues", required_argument, 0, 'd'}, {"model", required_argument, 0, 'm'},
      {"policy", required_argument, 0, 'P'},    {"param", required_argument, 0, 'K'},
      {"shadow", no_argument, 0, 'w'},          {"shadow-fp32", no_argument, 0, 'W'},
      {"json", no_argument, 0, 'j'},            {"limit", required_argument, 0, 'l'},
      {"bos", required_argument, 0, 'b'},       {"socket", required_argument, 0, 's'},
      {"attach-socket", required_argument, 0, 'a'}, {"prefix", required_argument, 0, 'p'},
      {"sync", no_argument, 0, 'y'},            {"keep", no_argument, 0, 'k'},
      {"quiet", no_argument, 0, 'q'},           {"help", no_argument, 0, 'h'},
      {"reconnect-timeout-ms", required_argument, 0, 'R'}, {"semantic", required_argument, 0, 'E'},
      {"surprise", required_argument, 0, 'S'}, {"share-prefix", no_argument, 0, 'X'},
      {"keep-copies", no_argument, 0, 'C'},
      {0, 0, 0, 0}};
  int ch, bad = 0;
  long v = 0;
  while (!bad && (ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 'd': o->data = optarg; break;
      case 'm': o->model = optarg; break;
      case 'P': o->w.policy = optarg; break;
      case 'K': bad = llm_worker_params_add(&o->params, optarg); break;
      case 'w': o->w.shadow = true; break;
      case 'W': o->w.shadow = o->w.shadow_fp32 = true; break;
      case 'j': o->json = true; break;
      case 'l':
        if (!(bad = llm_worker_parse_long(optarg, 1, 1L << 30, &v))) o->limit = (size_t)v;
        break;
      case 'b':
        if (!(bad = llm_worker_parse_long(optarg, 0, 1L << 30, &v))) o->bos = (int)v;
        break;
      case 's': o->socket = optarg; break;
      case 'a': o->attach = optarg; break;
      case 'p': o->prefix = optarg; break;
      case 'y': o->w.sync = true; break;
      case 'k': o->w.keep = true; break;
      case 'q': o->quiet = true; break;
      case 'X': o->share = true; break;
      case 'C': o->keep_copies = true; break;
      case 'R':
        if (!(bad = llm_worker_parse_long(optarg, 0, 24L * 3600 * 1000, &v))) o->w.reconnect_ms = (int)v;
        break;
      case 'E':
        o->oracle = !strcmp(optarg, "oracle");
        o->entities = !strcmp(optarg, "entities");
        bad = llm_worker_parse_semantic(o->oracle || o->entities ? "embed" : optarg, &o->w);
        break;
      case 'S': {
        char *end;
        double nats = strtod(optarg, &end);
        bad = end == optarg || *end || !(nats >= 0 && nats <= 1000) ? -1 : 0;
        if (!bad) o->w.surprise_nats = (float)nats;
        break;
      }
      case 'h': usage(); exit(0);
      default: bad = -1; break;
    }
    if (bad) fprintf(stderr, "commitkv-dialogue: bad value for an option\n");
  }
  if (!bad && !o->data) {
    fprintf(stderr, "commitkv-dialogue: --dialogues FILE.jsonl is required\n");
    bad = -1;
  }
  if (bad || optind != argc) {
    usage();
    return -1;
  }
  return 0;
}

/* ---- one dialogue ------------------------------------------------------------ */

static uint8_t role_of(char r) {
  switch (r) {
    case 'S': return CKV_ROLE_SYSTEM;
    case 'U': return CKV_ROLE_USER;
    case 'A': return CKV_ROLE_ASSISTANT;
    default: return CKV_ROLE_TOOL;
  }
}

/* Turns of d that are run: all when they fit in seq_len positions, else up
 * to its last answer turn; 0 when even that does not fit. */
static size_t turns_that_fit(const dialogue *d, int seq_len) {
  size_t last = 0;
  for (size_t i = 0; i < d->n_recall; i++)
    if (d->recall[i].turn + 1 > last) last = d->recall[i].turn + 1;
  if (dialogue_turn_position(d, d->n_turns) <= (size_t)seq_len) return d->n_turns;
  if (last && dialogue_turn_position(d, last) <= (size_t)seq_len) return last;
  return 0;
}

/* Byte i of turn t's rendering "R: text\n". */
static int turn_byte(const dialogue_turn *t, size_t i) {
  return i == 0 ? t->role : i == 1 ? ':' : i == 2 ? ' ' : i < 3 + t->len ? (uint8_t)t->text[i - 3] : '\n';
}

/* Bytes [from, to) of turn t's rendering, one token each. */
static int feed(llm_worker *w, const dialogue_turn *t, size_t from, size_t to) {
  uint8_t role = role_of(t->role);
  for (size_t i = from; i < to; i++) {
    int e = llm_worker_token(w, turn_byte(t, i), role, i == 0 ? CKV_TAG_TURN_START : 0);
    if (e < 0) return e;
  }
  return CKV_OK;
}

/* The greedy answer of one path, and whether it is answer + "\n" exactly. */
static int answer(llm_worker *w, bool shadow, int bos, const dialogue_recall *r, uint8_t *said, int *n_said, char *why,
                  bool *ok) {
  int toks[DLG_MAX_ANSWER], n = 0;
  int e = llm_worker_decode_aside(w, shadow, DLG_MAX_ANSWER, '\n', bos, toks, &n, why);
  if (e < 0) return e;
  bool match = (size_t)n == r->len + 1 && toks[n - 1] == '\n';
  for (int i = 0; i < n; i++) {
    said[i] = (uint8_t)(toks[i] & 0xff); /* ids above 255 other than BOS: not bytes, and never right */
    if (toks[i] > 255 || (match && i < n - 1 && toks[i] != (uint8_t)r->answer[i])) match = false; /* match: n - 1 == len */
  }
  *n_said = n;
  *ok = match;
  return CKV_OK;
}

/* Token i of d's stream from its start: BOS, then turn 0's bytes. */
static void stream_token(const dialogue *d, int bos, size_t i, uint32_t *id, uint8_t *role, uint8_t *tag) {
  const dialogue_turn *t0 = &d->turns[0];
  *id = i == 0 ? (uint32_t)bos : (uint32_t)turn_byte(t0, i - 1);
  *role = i == 0 ? CKV_ROLE_SYSTEM : role_of(t0->role);
  *tag = i <= 1 ? CKV_TAG_TURN_START : 0;
}

/* Whether d's stream starts with the recorded prefix p (ids, roles, tags)
 * inside its first turn, which asks nothing (a recall turn starts with the
 * decode's "A: ", which the adoption would skip). */
static bool starts_with_prefix(const dialogue *d, int bos, const llm_worker_prefix *p) {
  if (!d->n_turns || dialogue_recall_at(d, 0) || 1 + dialogue_turn_bytes(&d->turns[0]) < p->n) return false;
  for (size_t i = 0; i < p->n; i++) {
    uint32_t id;
    uint8_t role, tag;
    stream_token(d, bos, i, &id, &role, &tag);
    if (id != p->ids[i] || role != p->roles[i] || tag != p->tags[i]) return false;
  }
  return true;
}

/* --share-prefix: runs BOS and d's first turn in keeper session `id` (policy
 * fp16: its blocks stay draft, hence published, whatever the lifecycle does
 * to the dialogues' sessions), recording its first whole draft blocks'
 * worth of bookkeeping, and reports the round that publishes those blocks.
 * The keeper stays open (k initialised) until the caller ends it. */
static int run_keeper(const llm_worker_options *ko, const ckv_model *m, ckv_client *c, const dialogue *d, int bos,
                      const char *id, llm_worker *k, llm_worker_stats *st) {
  const dialogue_turn *t0 = &d->turns[0];
  uint64_t n = (1 + dialogue_turn_bytes(t0)) / DLG_DRAFT_BLOCK_TOKENS * DLG_DRAFT_BLOCK_TOKENS;
  int e = llm_worker_init(k, ko, m, c, st);
  if (e == CKV_OK && !n) return CKV_ERR_RANGE; /* shorter than one block: nothing to share */
  if (e == CKV_OK) e = llm_worker_record(k, n);
  if (e == CKV_OK) e = llm_worker_open(k, id);
  if (e == CKV_OK) e = llm_worker_token(k, bos, CKV_ROLE_SYSTEM, CKV_TAG_TURN_START);
  if (e == CKV_OK) e = feed(k, t0, 0, dialogue_turn_bytes(t0));
  if (e == CKV_OK) e = llm_worker_end_round(k, /* round= */ 1);
  if (e == CKV_OK && !llm_worker_recorded(k)) e = CKV_ERR_STATE;
  return e;
}

static int run_dialogue(const opts *o, const ckv_model *m, ckv_client *c, const dialogue *d, size_t idx, int bos,
                        const llm_worker_prefix *pre, dlg_result *res, item *items, size_t *n_items) {
  llm_worker w;
  char id[160];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  res->dialogue = idx;
  res->turns_run = turns_that_fit(d, ckv_model_config_get(m)->seq_len);
  res->bytes_by_round = calloc(res->turns_run + 1, sizeof(uint64_t));
  res->tokens_by_round = calloc(res->turns_run + 1, sizeof(uint64_t));
  if (!res->bytes_by_round || !res->tokens_by_round) return -ENOMEM;
  int e = llm_worker_init(&w, &o->w, m, c, &res->st);
  const char *what = "setup";
  snprintf(id, sizeof(id), "%s-%zu", o->prefix, idx);
  if (e == CKV_OK && pre && starts_with_prefix(d, bos, pre))
    e = llm_worker_open_shared(&w, id, pre->ids, pre->n, /* want= */ pre->n, &res->matched);
  else if (e == CKV_OK)
    e = llm_worker_open(&w, id);
  if (e < 0) what = "open session";
  bool *held = calloc(res->turns_run + 1, sizeof(bool)), *superseded = calloc(res->turns_run + 1, sizeof(bool));
  if (e == CKV_OK && (!held || !superseded)) e = -ENOMEM;
  for (size_t t = 0; e == CKV_OK && t < res->turns_run; t++) {
    const dialogue_turn *turn = &d->turns[t];
    const dialogue_recall *r = dialogue_recall_at(d, t);
    what = "round";
    if (dialogue_turn_is_topic_shift(turn)) llm_worker_topic_shift(&w);
    /* superseded: a later assistant turn says it all again (a confirmation, an answer: what answers copy from);
     * a user reading a booking back only checks it (variant E, tune seed 9103: recall 0.661 -> 0.847, FP16 0.847) */
    if (o->entities) {
      dialogue_label label = dialogue_entity_label(d, t, held, superseded, !o->keep_copies);
      for (size_t k = 0; k < t; k++)
        if (superseded[k])
          llm_worker_fix_scores(&w, dialogue_turn_position(d, k), dialogue_turn_position(d, k + 1), DLG_ORACLE_OTHER);
      res->copy_turns += label == DIALOGUE_COPY;
      llm_worker_fix_score(&w, label == DIALOGUE_FACT ? DLG_ORACLE_FACT : DLG_ORACLE_OTHER);
    } else if (o->oracle) {
      llm_worker_fix_score(&w, dialogue_turn_holds_fact(d, t) ? DLG_ORACLE_FACT : DLG_ORACLE_OTHER);
    }
    /* the model's signal judges what the text scorer could not: a turn naming an entity is the entity rule's
     * (restated or not), the oracle's labels are exact */
    llm_worker_surprise_turn(&w, !o->oracle && !(o->entities && dialogue_turn_names_entity(turn)));
    /* with a shared prefix, the session holds the stream's first res->matched tokens (BOS and the first turn's
     * bytes before res->matched - 1): their bookkeeping is adopted, the rest of the turn fed */
    size_t from = t == 0 && res->matched ? res->matched - 1 : 0;
    if (t == 0 && res->matched && (e = llm_worker_adopt(&w, pre)) < 0) what = "adopt the shared prefix";
    else if (t == 0 && !res->matched) e = llm_worker_token(&w, bos, CKV_ROLE_SYSTEM, CKV_TAG_TURN_START);
    if (e == CKV_OK && r) {
      item *it = &items[(*n_items)];
      *it = (item){.dialogue = idx, .r = r, .kind = dialogue_fact_kind(r->answer)};
      long fact = dialogue_fact_position(d, r);
      it->distance = fact < 0 ? -1 : (long)(dialogue_turn_position(d, t) + 3) - fact;
      if ((e = feed(&w, turn, 0, 3)) < 0) break; /* "A: " */
      what = "decode";
      e = answer(&w, false, bos, r, it->said, &it->n_said, &it->why, &it->ok);
      if (e == CKV_OK && w.sh)
        e = answer(&w, true, bos, r, it->shadow_said, &it->n_shadow_said, &it->shadow_why, &it->shadow_ok);
      if (e < 0) break;
      (*n_items)++;
      what = "round";
      e = feed(&w, turn, 3, dialogue_turn_bytes(turn)); /* the reference answer */
    } else if (e == CKV_OK) {
      e = feed(&w, turn, from, dialogue_turn_bytes(turn));
    }
    if (e == CKV_OK) e = llm_worker_end_round(&w, (int)t + 1);
    if (e == CKV_OK && (e = llm_worker_read_bytes(&w)) < 0) what = "list sessions";
    if (e == CKV_OK) {
      res->bytes_by_round[t] = res->st.bytes_total - res->st.bytes_cold; /* primary */
      res->tokens_by_round[t] = res->st.tokens;
      res->rounds = t + 1;
    }
  }
  if (e == CKV_OK && (e = llm_worker_settle(&w)) < 0) what = "list sessions";
  if (e < 0)
    fprintf(stderr, "commitkv-dialogue: %s (dialogue %s): %s: %s%s%s\n", id, d->id, what, ckv_strerror(e),
            *ckv_client_last_error(c) ? ": " : "", ckv_client_last_error(c));
  if (e == CKV_OK) {
    if ((e = llm_worker_end(&w, /* recover= */ true)) < 0)
      fprintf(stderr, "commitkv-dialogue: %s: %s: %s\n", id, o->w.keep ? "close" : "drop", ckv_strerror(e));
  } else {
    (void)llm_worker_end(&w, /* recover= */ false);
  }
  free(held);
  free(superseded);
  llm_worker_done(&w);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  res->st.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return e;
}

/* ---- what the runs add up to ------------------------------------------------- */

/* Correct answers and questions of one group (a fact kind, a distance bucket). */
typedef struct tally {
  const char *name;
  size_t n, ok, shadow_ok;
} tally;

typedef struct summary {
  size_t questions, ok, shadow_ok;
  tally kinds[32];
  size_t n_kinds;
  tally buckets[DIALOGUE_N_BUCKETS];
  uint64_t steps, counted, agree, bytes_total, bytes_cold, bytes_summary, bytes_fp16, recalled_blocks, dropped_tokens, surprise_turns, copy_turns;
  uint64_t matched_tokens; /* --share-prefix: tokens the sessions started with from shared blocks */
  uint64_t keeper_tokens;  /* --share-prefix: tokens the keeper session ran (once) */
  double kl_sum, kl_max;
  size_t max_rounds;
  double *ratio_by_round; /* mean over the dialogues that have the round */
  size_t *n_by_round;
} summary;

static void count(tally *t, const item *it) {
  t->n++;
  t->ok += it->ok;
  t->shadow_ok += it->shadow_ok;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

static int summarise(const dlg_result *res, size_t n_res, const item *items, size_t n_items, uint64_t fp16_per_token,
                     summary *s) {
  *s = (summary){0};
  for (int b = 0; b < DIALOGUE_N_BUCKETS; b++) s->buckets[b].name = dialogue_bucket_name(b);
  for (size_t i = 0; i < n_items; i++) {
    const item *it = &items[i];
    s->questions++;
    s->ok += it->ok;
    s->shadow_ok += it->shadow_ok;
    count(&s->buckets[dialogue_distance_bucket(it->distance)], it);
    size_t k = 0;
    while (k < s->n_kinds && strcmp(s->kinds[k].name, it->kind)) k++;
    if (k == s->n_kinds && k < sizeof(s->kinds) / sizeof(s->kinds[0])) s->kinds[s->n_kinds++].name = it->kind;
    if (k < s->n_kinds) count(&s->kinds[k], it);
  }
  for (size_t i = 0; i < n_res; i++) {
    const llm_worker_stats *x = &res[i].st;
    s->steps += x->steps, s->counted += x->top1_counted, s->agree += x->top1_agree, s->kl_sum += x->kl_sum;
    if (x->kl_max > s->kl_max || isnan(x->kl_max)) s->kl_max = x->kl_max;
    s->bytes_total += x->bytes_total, s->bytes_fp16 += x->bytes_fp16, s->bytes_cold += x->bytes_cold;
    s->bytes_summary += x->bytes_summary;
    s->recalled_blocks += x->recalled_blocks, s->dropped_tokens += x->dropped_tokens;
    s->surprise_turns += x->surprise_turns;
    s->copy_turns += res[i].copy_turns;
    s->matched_tokens += res[i].matched;
    if (res[i].rounds > s->max_rounds) s->max_rounds = res[i].rounds;
  }
  s->ratio_by_round = calloc(s->max_rounds + 1, sizeof(double));
  s->n_by_round = calloc(s->max_rounds + 1, sizeof(size_t));
  if (!s->ratio_by_round || !s->n_by_round) return -ENOMEM;
  for (size_t i = 0; i < n_res; i++)
    for (size_t r = 0; r < res[i].rounds; r++) {
      s->ratio_by_round[r] += ratio((double)res[i].bytes_by_round[r], (double)(res[i].tokens_by_round[r] * fp16_per_token));
      s->n_by_round[r]++;
    }
  for (size_t r = 0; r < s->max_rounds; r++) s->ratio_by_round[r] = ratio(s->ratio_by_round[r], (double)s->n_by_round[r]);
  return CKV_OK;
}

/* ---- output ------------------------------------------------------------------- */

/* A number, or null where there is nothing to measure. */
static json_t *num_or_null(double v, bool have) { return have && isfinite(v) ? json_real(v) : json_null(); }

/* Bytes as a JSON string, each byte read as Latin-1 (U+0000..U+00FF), so the
 * exact bytes come back from any decoder; and the same bytes in hex. */
static json_t *latin1(const uint8_t *b, int n) {
  char buf[2 * DLG_MAX_ANSWER + 1];
  size_t k = 0;
  if (n > DLG_MAX_ANSWER) n = DLG_MAX_ANSWER; /* longer texts (questions) are cut, never overflow */
  for (int i = 0; i < n; i++) {
    if (b[i] < 0x80) {
      buf[k++] = (char)b[i];
    } else {
      buf[k++] = (char)(0xc0 | (b[i] >> 6));
      buf[k++] = (char)(0x80 | (b[i] & 0x3f));
    }
  }
  return json_stringn(buf, k);
}

static json_t *hex(const uint8_t *b, int n) {
  char buf[2 * DLG_MAX_ANSWER + 1];
  for (int i = 0; i < n; i++) snprintf(buf + 2 * i, 3, "%02x", b[i]);
  buf[2 * n] = '\0';
  return json_string(buf);
}

static const char *why_name(char why) {
  return why == 's' ? "newline" : why == 'e' ? "bos" : why == 'c' ? "context" : "length";
}

static json_t *tally_json(const tally *t, bool shadow) {
  return json_pack("{s:I, s:I, s:f, s:o}", "n", (json_int_t)t->n, "correct", (json_int_t)t->ok, "recall",
                   ratio((double)t->ok, (double)t->n),
                   "shadow_recall", num_or_null(ratio((double)t->shadow_ok, (double)t->n), shadow && t->n));
}

static int print_json(const opts *o, const char *path, const dialogue_set *ds, int bos, size_t skipped,
                      const dlg_result *res, size_t n_res, const item *items, size_t n_items, const summary *s) {
  bool sh = o->w.shadow;
  json_t *root = json_object(), *kinds = json_object(), *dists = json_object(), *rounds = json_array(),
         *jitems = json_array(), *sessions = json_array();
  if (!root || !kinds || !dists || !rounds || !jitems || !sessions) return -ENOMEM;
  const char *policy = n_res && res[0].st.policy[0] ? res[0].st.policy : o->w.policy ? o->w.policy : "default";
  json_object_set_new(root, "model", json_string(path));
  json_object_set_new(root, "data", json_string(o->data));
  json_object_set_new(root, "policy", json_string(policy));
  json_object_set_new(root, "shadow", !sh ? json_null() : json_string(o->w.shadow_fp32 ? "fp32" : "fp16"));
  json_object_set_new(root, "bos", json_integer(bos));
  json_object_set_new(root, "semantic", json_string(o->oracle ? "oracle" : o->entities ? "entities" : o->w.semantic_off ? "none" : "embed"));
  json_t *params = json_object(); /* the session overrides sent, --param and the worker's own */
  for (size_t i = 0; params && i < o->params.n; i++)
    json_object_set_new(params, o->params.names[i], json_real(o->params.values[i]));
  json_object_set_new(root, "params", params ? params : json_null());
  json_object_set_new(root, "surprise_nats", json_real(o->w.surprise_nats));
  json_object_set_new(root, "surprise_turns", json_integer((json_int_t)s->surprise_turns));
  json_object_set_new(root, "copy_turns", json_integer((json_int_t)s->copy_turns));
  json_object_set_new(root, "share_prefix", json_boolean(o->share));
  if (o->share) { /* saved: what the dialogues did not run through the model, less what the keeper ran once */
    json_object_set_new(root, "matched_tokens", json_integer((json_int_t)s->matched_tokens));
    json_object_set_new(root, "keeper_tokens", json_integer((json_int_t)s->keeper_tokens));
    json_object_set_new(root, "prefill_tokens_saved",
                        json_integer((json_int_t)s->matched_tokens - (json_int_t)s->keeper_tokens));
  }
  json_object_set_new(root, "dialogues", json_integer((json_int_t)n_res));
  json_object_set_new(root, "skipped", json_integer((json_int_t)skipped));
  json_object_set_new(root, "questions", json_integer((json_int_t)s->questions));
  json_object_set_new(root, "correct", json_integer((json_int_t)s->ok));
  json_object_set_new(root, "recall", json_real(ratio((double)s->ok, (double)s->questions)));
  json_object_set_new(root, "shadow_correct", sh ? json_integer((json_int_t)s->shadow_ok) : json_null());
  json_object_set_new(root, "shadow_recall", num_or_null(ratio((double)s->shadow_ok, (double)s->questions), sh));
  for (size_t k = 0; k < s->n_kinds; k++) json_object_set_new(kinds, s->kinds[k].name, tally_json(&s->kinds[k], sh));
  for (int b = 0; b < DIALOGUE_N_BUCKETS; b++)
    if (s->buckets[b].n) json_object_set_new(dists, s->buckets[b].name, tally_json(&s->buckets[b], sh));
  json_object_set_new(root, "per_kind", kinds);
  json_object_set_new(root, "per_distance", dists);
  json_object_set_new(root, "steps", json_integer((json_int_t)s->steps));
  json_object_set_new(root, "kl_mean", num_or_null(ratio(s->kl_sum, (double)s->steps), sh && s->steps));
  json_object_set_new(root, "kl_max", num_or_null(s->kl_max, sh && s->steps));
  json_object_set_new(root, "top1_agreement", num_or_null(ratio((double)s->agree, (double)s->counted), sh && s->counted));
  json_object_set_new(root, "top1_counted", json_integer((json_int_t)s->counted));
  json_object_set_new(root, "bytes_total", json_integer((json_int_t)s->bytes_total));
  json_object_set_new(root, "bytes_fp16", json_integer((json_int_t)s->bytes_fp16));
  /* primary: what attention reads every round (cold blocks left out); total: every tier, and the worker's
   * summaries of its cold blocks (bytes_summary) */
  json_object_set_new(root, "bytes_primary", json_integer((json_int_t)(s->bytes_total - s->bytes_cold)));
  json_object_set_new(root, "bytes_cold", json_integer((json_int_t)s->bytes_cold));
  json_object_set_new(root, "bytes_ratio_fp16",
                      json_real(ratio((double)(s->bytes_total - s->bytes_cold), (double)s->bytes_fp16)));
  json_object_set_new(root, "total_bytes_ratio_fp16",
                      json_real(ratio((double)(s->bytes_total + s->bytes_summary), (double)s->bytes_fp16)));
  json_object_set_new(root, "bytes_summary", json_integer((json_int_t)s->bytes_summary));
  json_object_set_new(root, "summary_bytes_ratio_fp16", json_real(ratio((double)s->bytes_summary, (double)s->bytes_fp16)));
  json_object_set_new(root, "recalled_blocks", json_integer((json_int_t)s->recalled_blocks));
  json_object_set_new(root, "dropped_tokens", json_integer((json_int_t)s->dropped_tokens));
  for (size_t r = 0; r < s->max_rounds; r++) json_array_append_new(rounds, json_real(s->ratio_by_round[r]));
  json_object_set_new(root, "bytes_ratio_fp16_by_round", rounds);
  for (size_t i = 0; i < n_items; i++) {
    const item *it = &items[i];
    json_t *j = json_pack("{s:I, s:s, s:I, s:I, s:s, s:I, s:b, s:o, s:o, s:s}", "dialogue", (json_int_t)it->dialogue,
                          "id", ds->d[it->dialogue].id, "turn", (json_int_t)it->r->turn, "question_turn",
                          (json_int_t)it->r->question_turn, "kind", it->kind, "distance", (json_int_t)it->distance,
                          "ok", it->ok, "said", latin1(it->said, it->n_said), "said_hex", hex(it->said, it->n_said),
                          "stop", why_name(it->why));
    if (j) { /* what was asked and what the reference answer is, for people reading the items */
      const dialogue *dd = &ds->d[it->dialogue];
      const dialogue_turn *qt = it->r->question_turn < dd->n_turns ? &dd->turns[it->r->question_turn] : NULL;
      json_object_set_new(j, "question", qt ? latin1((const uint8_t *)qt->text, (int)qt->len) : json_null());
      json_object_set_new(j, "expected", latin1((const uint8_t *)it->r->answer, (int)it->r->len));
    }
    if (j && sh) {
      json_object_set_new(j, "shadow_ok", json_boolean(it->shadow_ok));
      json_object_set_new(j, "shadow_said", latin1(it->shadow_said, it->n_shadow_said));
      json_object_set_new(j, "shadow_said_hex", hex(it->shadow_said, it->n_shadow_said));
      json_object_set_new(j, "shadow_stop", json_string(why_name(it->shadow_why)));
    }
    json_array_append_new(jitems, j);
  }
  json_object_set_new(root, "items", jitems);
  for (size_t i = 0; i < n_res; i++) {
    const dlg_result *x = &res[i];
    const llm_worker_stats *st = &x->st;
    json_t *by = json_array(), *tok = json_array();
    for (size_t r = 0; r < x->rounds; r++) {
      json_array_append_new(by, json_integer((json_int_t)x->bytes_by_round[r]));
      json_array_append_new(tok, json_integer((json_int_t)x->tokens_by_round[r]));
    }
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:I, s:I, s:I, s:f, s:o, s:o, s:f, s:i}",
                          "session", st->id, "id", ds->d[x->dialogue].id, "dialogue", (json_int_t)x->dialogue,
                          "tokens", (json_int_t)st->tokens, "rounds", (json_int_t)st->rounds, "steps",
                          (json_int_t)st->steps,
                          "kl_mean", num_or_null(ratio(st->kl_sum, (double)st->steps), sh && st->steps),
                          "kl_max", num_or_null(st->kl_max, sh && st->steps),
                          "top1_agreement",
                          num_or_null(ratio((double)st->top1_agree, (double)st->top1_counted), sh && st->top1_counted),
                          "bytes_total", (json_int_t)st->bytes_total, "bytes_fp16", (json_int_t)st->bytes_fp16,
                          "bytes_fp16_live", (json_int_t)st->bytes_fp16_live, "bytes_ratio_fp16",
                          ratio((double)(st->bytes_total - st->bytes_cold), (double)st->bytes_fp16), "bytes_by_round", by,
                          "tokens_by_round", tok, "seconds", st->seconds, "reconnects", st->reconnects);
    if (j) {
      json_object_set_new(j, "bytes_cold", json_integer((json_int_t)st->bytes_cold));
      json_object_set_new(j, "total_bytes_ratio_fp16",
                          json_real(ratio((double)(st->bytes_total + st->bytes_summary), (double)st->bytes_fp16)));
      json_object_set_new(j, "bytes_summary", json_integer((json_int_t)st->bytes_summary));
      json_object_set_new(j, "recalled_blocks", json_integer((json_int_t)st->recalled_blocks));
      json_object_set_new(j, "dropped_tokens", json_integer((json_int_t)st->dropped_tokens));
      json_object_set_new(j, "matched_tokens", json_integer((json_int_t)x->matched));
      json_object_set_new(j, "stream_nats", json_real(st->stream_nats));
    }
    json_array_append_new(sessions, j);
  }
  json_object_set_new(root, "sessions", sessions);
  int e = json_dumpf(root, stdout, JSON_COMPACT | JSON_ENSURE_ASCII) == 0 ? CKV_OK : -EIO;
  putchar('\n');
  json_decref(root);
  return e;
}

static void print_tally(const char *title, const tally *t, size_t n, bool shadow) {
  printf("%s:%*s recall    n%s\n", title, (int)(22 - strlen(title)), "", shadow ? "   shadow (FP16)" : "");
  for (size_t i = 0; i < n; i++) {
    if (!t[i].n) continue;
    printf("  %-20s %.4f %4zu", t[i].name, ratio((double)t[i].ok, (double)t[i].n), t[i].n);
    if (shadow) printf("   %.4f", ratio((double)t[i].shadow_ok, (double)t[i].n));
    printf("\n");
  }
}

static void print_table(const opts *o, const char *path, size_t skipped, const dlg_result *res, size_t n_res,
                        const summary *s) {
  bool sh = o->w.shadow;
  const char *policy = n_res && res[0].st.policy[0] ? res[0].st.policy : o->w.policy ? o->w.policy : "default";
  printf("%zu dialogues of %s (%zu skipped), model %s, policy %s%s\n", n_res, o->data, skipped, path, policy,
         sh ? (o->w.shadow_fp32 ? ", shadow FP32" : ", shadow FP16") : "");
  printf("recall %.4f (%zu/%zu)", ratio((double)s->ok, (double)s->questions), s->ok, s->questions);
  if (sh) printf(", shadow (FP16) %.4f (%zu/%zu)", ratio((double)s->shadow_ok, (double)s->questions), s->shadow_ok, s->questions);
  printf("\n");
  print_tally("per fact kind", s->kinds, s->n_kinds, sh);
  print_tally("per distance (bytes)", s->buckets, DIALOGUE_N_BUCKETS, sh);
  if (sh)
    printf("vs shadow: KL mean %.3g max %.3g, top1 %.4f (%" PRIu64 "/%" PRIu64 ") over %" PRIu64 " steps\n",
           ratio(s->kl_sum, (double)s->steps), s->kl_max, ratio((double)s->agree, (double)s->counted), s->agree,
           s->counted, s->steps);
  printf("bytes / FP16 at the end: primary %.3f, total %.3f (%" PRIu64 " / %" PRIu64 " / %" PRIu64
         "; the total counts %" PRIu64 " bytes of cold-block summaries in the worker); cold blocks read %" PRIu64
         ", tokens dropped %" PRIu64 "\n",
         ratio((double)(s->bytes_total - s->bytes_cold), (double)s->bytes_fp16),
         ratio((double)(s->bytes_total + s->bytes_summary), (double)s->bytes_fp16), s->bytes_total - s->bytes_cold,
         s->bytes_total + s->bytes_summary, s->bytes_fp16, s->bytes_summary, s->recalled_blocks, s->dropped_tokens);
  if (o->share)
    printf("shared prefix: %" PRIu64 " tokens matched, %" PRIu64 " run once by the keeper: %" PRId64
           " prefill tokens saved\n", s->matched_tokens, s->keeper_tokens,
           (int64_t)s->matched_tokens - (int64_t)s->keeper_tokens);
  printf("primary bytes / FP16 per round (mean over dialogues):");
  for (size_t r = 0; r < s->max_rounds; r++) printf("%s %zu:%.3f", r % 8 ? "" : "\n ", r + 1, s->ratio_by_round[r]);
  printf("\n");
}

/* ---- main ----------------------------------------------------------------- */

/* Sends name = value to a commitkv session (a named one, or the daemon's
 * default policy) unless --param set it. */
static void default_param(opts *o, const char *name, double value) {
  if (o->w.policy && strcmp(o->w.policy, "commitkv")) return;
  for (size_t i = 0; i < o->params.n; i++)
    if (!strcmp(o->params.names[i], name)) return;
  if (o->params.n == LLM_WORKER_MAX_PARAMS) return;
  o->params.names[o->params.n] = name;
  o->params.values[o->params.n++] = value;
}

/* Turn labels: the daemon acts on them a round after staging, and sends the
 * facts they mark cold once they committed. */
static void trust_turn_labels(opts *o) {
  default_param(o, "scored_persistence_rounds", DLG_TURN_LABEL_ROUNDS);
  default_param(o, "fact_cold_rounds", DLG_FACT_COLD_ROUNDS);
}

static const char *model_path(const opts *o, char *buf, size_t size) {
  if (o->model) return o->model;
  if (ckv_model_path_from_env(buf, size) == CKV_OK) return buf;
  return DLG_FALLBACK_MODEL;
}

int ckv_dialogue_main(int argc, char **argv) {
  char default_prefix[64], env_path[4096], err[512];
  snprintf(default_prefix, sizeof(default_prefix), "dlg-%ld", (long)getpid());
  opts o = {.prefix = default_prefix, .bos = -1,
            .entities = true, .w = {.prog = "commitkv-dialogue", .reconnect_ms = RECONNECT_DEFAULT_GIVE_UP_MS,
                                    .surprise_nats = DLG_SURPRISE_NATS}};
  if (parse_args(argc, argv, &o) < 0) return 2;
  if (o.entities || o.oracle) trust_turn_labels(&o);
  o.w.param_names = o.params.names;
  o.w.param_values = o.params.values;
  o.w.n_params = o.params.n;
  g_quiet = o.quiet;
  dialogue_set ds;
  int e = dialogue_set_load(o.data, o.limit, &ds, err, sizeof(err));
  if (e < 0) {
    fprintf(stderr, "commitkv-dialogue: %s\n", err);
    return e == CKV_ERR_INVALID ? 2 : 1;
  }
  const char *path = model_path(&o, env_path, sizeof(env_path));
  ckv_model *m = NULL;
  if ((e = ckv_model_load(path, &m)) < 0) {
    fprintf(stderr, "commitkv-dialogue: cannot load model %s: %s (set --model, CKV_MODEL or CKV_MODEL_DIR)\n", path,
            ckv_strerror(e));
    dialogue_set_free(&ds);
    return 1;
  }
  const ckv_model_config *mc = ckv_model_config_get(m);
  int bos = o.bos >= 0 ? o.bos : mc->vocab_size == DLG_BOS_BYTE_MODEL + 1 ? DLG_BOS_BYTE_MODEL : DLG_BOS_DEFAULT;
  int rc = 1;
  ckv_client *c = NULL;
  dlg_result *res = calloc(ds.n ? ds.n : 1, sizeof(*res));
  size_t n_questions = 0, n_res = 0, n_items = 0, skipped = 0;
  for (size_t i = 0; i < ds.n; i++) n_questions += ds.d[i].n_recall;
  item *items = calloc(n_questions ? n_questions : 1, sizeof(*items));
  summary s = {0};
  llm_worker keeper;
  llm_worker_options keeper_opts;
  llm_worker_stats keeper_st = {0};
  const llm_worker_prefix *prefix = NULL;
  char keeper_id[160];
  bool have_keeper = false;
  if (!res || !items) {
    fprintf(stderr, "commitkv-dialogue: out of memory\n");
    goto done;
  }
  if (mc->vocab_size < 256 || bos >= mc->vocab_size) {
    fprintf(stderr, "commitkv-dialogue: %s is not a byte-level model: vocabulary %d, BOS %d\n", path, mc->vocab_size, bos);
    rc = 2;
    goto done;
  }
  ckv_client_options co = {.socket = o.socket, .attach_socket = o.attach, .name = "commitkv-dialogue", .heartbeat = true};
  if ((e = ckv_client_connect(&co, &c)) < 0) {
    fprintf(stderr, "commitkv-dialogue: cannot reach commitkvd (%s): %s\n", o.socket ? o.socket : "default socket",
            ckv_strerror(e));
    goto done;
  }
  if (strcmp(ckv_client_memory_kind(c), "host") != 0) { /* the model runs on the CPU, reading K/V in place */
    fprintf(stderr, "commitkv-dialogue: the daemon's KV memory is '%s', which the CPU cannot address: run commitkvd "
                    "--backend host\n", ckv_client_memory_kind(c));
    goto done;
  }
  e = CKV_OK;
  if (o.share && ds.n) {
    /* the keeper takes the daemon's own [policy] section's fp16, none of the dialogues' overrides */
    keeper_opts = o.w;
    keeper_opts.policy = "fp16";
    keeper_opts.param_names = NULL;
    keeper_opts.param_values = NULL;
    keeper_opts.n_params = 0;
    keeper_opts.keep = keeper_opts.sync = false;
    snprintf(keeper_id, sizeof(keeper_id), "%s-keeper", o.prefix);
    have_keeper = true;
    if ((e = run_keeper(&keeper_opts, m, c, &ds.d[0], bos, keeper_id, &keeper, &keeper_st)) < 0) {
      fprintf(stderr, "commitkv-dialogue: %s: the shared prefix (dialogue %s's first turn): %s%s%s\n", keeper_id,
              ds.d[0].id, ckv_strerror(e), *ckv_client_last_error(c) ? ": " : "", ckv_client_last_error(c));
      goto done;
    }
    prefix = llm_worker_recorded(&keeper);
    note("%s: %" PRIu64 " tokens, the first %" PRIu64 " shared\n", keeper_id, keeper_st.tokens, prefix->n);
  }
  for (size_t i = 0; e == CKV_OK && i < ds.n; i++) {
    if (!turns_that_fit(&ds.d[i], mc->seq_len)) {
      note("commitkv-dialogue: %s: its answers do not fit in %d positions: skipped\n", ds.d[i].id, mc->seq_len);
      skipped++;
      continue;
    }
    e = run_dialogue(&o, m, c, &ds.d[i], i, bos, prefix, &res[n_res], items, &n_items);
    n_res++;
    note("%s: %" PRIu64 " tokens, %" PRIu64 " rounds, %.2fs\n", ds.d[i].id, res[n_res - 1].st.tokens,
         res[n_res - 1].st.rounds, res[n_res - 1].st.seconds);
  }
  if (have_keeper) { /* dropped before the figures: every dialogue's settled bytes were read with it held */
    have_keeper = false;
    e = llm_worker_end(&keeper, /* recover= */ true);
    llm_worker_done(&keeper);
    if (e < 0) fprintf(stderr, "commitkv-dialogue: %s: drop: %s\n", keeper_id, ckv_strerror(e));
  }
  if (e < 0) goto done;
  uint64_t fp16_per_token = 2u * (uint64_t)mc->n_layers * (uint64_t)mc->kv_dim * 2u;
  if ((e = summarise(res, n_res, items, n_items, fp16_per_token, &s)) < 0) goto done;
  s.keeper_tokens = keeper_st.tokens;
  if (o.json)
    e = print_json(&o, path, &ds, bos, skipped, res, n_res, items, n_items, &s);
  else
    print_table(&o, path, skipped, res, n_res, &s);
  rc = e == CKV_OK ? 0 : 1;
done:
  if (have_keeper) {
    (void)llm_worker_end(&keeper, /* recover= */ false);
    llm_worker_done(&keeper);
  }
  for (size_t i = 0; res && i < n_res; i++) {
    free(res[i].bytes_by_round);
    free(res[i].tokens_by_round);
  }
  free(res);
  free(items);
  free(s.ratio_by_round);
  free(s.n_by_round);
  ckv_client_free(c);
  ckv_model_free(m);
  dialogue_set_free(&ds);
  return rc;
}
