/* worker.h - one model sequence whose KV cache is a commitkvd session: the
 * per-token machinery the real-model workers share (commitkv-llm drives it
 * with token ids it samples, commitkv-dialogue with the bytes of dialogues).
 *
 * Each token is appended on its own (its id is not known before the
 * previous token's logits, and appending ahead would put not-yet-written
 * slots into the attention), then per layer: q/k/v from the model, K/V
 * rounded to FP16 (round to nearest even) and written into the token's draft
 * slot, fused attention (ckv_kernels_attention) over every block of the
 * session's view (draft, staged, committed; the token's own slot included),
 * the output fed back into the model.  The attention mass per (block, slot)
 * is mapped to positions through the block headers and summed over layers
 * and steps; llm_worker_end_round() reports it (ckv_session_report) and
 * acknowledges the newest view epoch.
 *
 * With options.shadow the same tokens also run through the model's reference
 * attention over a private cache of FP16-rounded K/V held as FP32 (the
 * uncompressed FP16 baseline; shadow_fp32 keeps unrounded FP32), and every
 * step compares the two next-token distributions: KL(p_shadow || p_commitkv)
 * and top-1 agreement, counted only where the shadow's top token leads the
 * second by more than LLM_WORKER_TOP1_MARGIN in probability.
 *
 * Semantic scores (commitkv/semantic.h): each turn (from a token tagged
 * CKV_TAG_TURN_START to the next) is embedded as the mean of the model's
 * final hidden state over its tokens; system turns and the first user turn
 * of a topic state the task, and llm_worker_topic_shift() makes the next
 * turn abandon the topic.  Every report carries the score of every token so
 * far (a later turn or a shift changes earlier ones).  options.semantic_off
 * sends none: the daemon then estimates them (token rarity).
 *
 * llm_worker_decode_aside() decodes greedily without appending anything: the
 * decoded tokens' FP16 K/V go to a private draft block that the attention
 * reads after the view's blocks, so the daemon's session (and the shadow's
 * cache, whose later positions are simply overwritten) stay the stream the
 * caller appended.  That is how a dialogue is probed at an answer turn and
 * then continued with the reference text.
 *
 * Riding through a daemon restart (examples/common/reconnect.h): when a call
 * fails because the daemon went away, the worker re-attaches with backoff for
 * up to reconnect_ms (0: fail at once), reopens the session (resumed when the
 * daemon still holds every token, else opened afresh), re-prefills a new
 * session by running the token stream so far through the model again (each
 * token's K/V into its new slot, attention over the new view; the round's
 * attention mass so far is kept, the shadow's private cache needs nothing),
 * says so in one line on stderr, and goes on with the token or the report it
 * was on.
 *
 * The struct is embedded and caller-owned (llm_worker_init / _done); its
 * fields are read by the front ends (logits, shadow logits, config, stats),
 * written only here.  Functions return a ckv_status; the ones that give up
 * on a daemon print why, prefixed by options.prog. */
#ifndef CKV_EXAMPLES_LLM_WORKER_H
#define CKV_EXAMPLES_LLM_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv/commitkv.h"
#include "commitkv/semantic.h"
#include "examples/llm/copy_signal.h"
#include "examples/llm/model.h"

#define LLM_WORKER_TOP1_MARGIN 0.05f /* near-ties (FP16 rounding flips them) do not count */
#define LLM_SURPRISE_SCORE 0.9f /* a turn raised by the copy signal: >= CKV_FACT_SEMANTIC, a lasting fact */
#define LLM_COPY_NATS 1.0f      /* a token predicted this well may be a copy (copy_signal.h) */
/* Cold tokens each layer's query reads (ckv_session_cold_gather): on the
 * agent model with every lasting fact cold, 64 tokens chosen per query
 * answered as well as reading every cold block. */
#define LLM_GATHER_TOKENS 64u

typedef struct llm_worker_options {
  const char *prog;               /* program name for messages */
  const char *policy;             /* NULL: the daemon's default */
  const char *const *param_names; /* per-session policy overrides */
  const double *param_values;
  size_t n_params;
  bool shadow, shadow_fp32;
  bool sync; /* after each report, wait until the round's moves are published */
  bool keep; /* llm_worker_end() closes (the daemon keeps it) instead of dropping */
  bool semantic_off; /* --semantic none: no scores from embeddings, the daemon estimates them */
  /* The model's own signal (with scores, not semantic_off): both turns of a
   * copy (copy_signal.h: a token the worker's logits predicted, under
   * LLM_COPY_NATS, whose n-gram was surprising, at least surprise_nats, in
   * an earlier turn) are raised to a lasting fact's score
   * (LLM_SURPRISE_SCORE), whatever their other score says; a raise is never
   * taken back.  0: off. */
  float surprise_nats;
  int reconnect_ms;
} llm_worker_options;

/* `--param key=value` overrides, as both front ends take them. */
#define LLM_WORKER_MAX_PARAMS 32
typedef struct llm_worker_params {
  const char *names[LLM_WORKER_MAX_PARAMS];
  double values[LLM_WORKER_MAX_PARAMS];
  size_t n;
} llm_worker_params;
/* A decimal integer in [lo, hi] (the whole string): 0, or -1. */
int llm_worker_parse_long(const char *s, long lo, long hi, long *ret);
/* Adds one `key=value` (kv is cut at the '=' and must outlive p).  0, or -1
 * for a malformed pair or a full table. */
int llm_worker_params_add(llm_worker_params *p, char *kv);
/* `--semantic embed|none` into o->semantic_off.  0, or -1 for another word. */
int llm_worker_parse_semantic(const char *s, llm_worker_options *o);

/* What a worker keeps of a prefix it ran (llm_worker_record), so that a
 * worker whose session starts on the same tokens in shared blocks (opened
 * with reuse_prefix: llm_worker_open_shared) takes it (llm_worker_adopt)
 * instead of running them through the model again: per position the token,
 * its role and tag, the model's final hidden state (the turn embeddings of
 * the semantic scores) and its surprisal (the copy signal), with the shadow
 * the FP16 shadow's K/V rows; at its end the next-token logits and the
 * round's attention mass so far.  The K/V of the commitkv path are not kept
 * here: they are the shared blocks, read through the view. */
typedef struct llm_worker_prefix {
  uint64_t n;          /* positions kept: 0 until the recording worker ran cap tokens */
  uint64_t cap;        /* positions to keep */
  uint32_t *ids;
  uint8_t *roles, *tags;
  float *surprise;     /* -ln p of each token under the logits before it (0 at position 0) */
  float *hidden;       /* [cap][dim]; NULL without semantic scores */
  float *sh_k, *sh_v;  /* [layer][cap][kv_dim]; NULL without the shadow */
  float *logits;       /* [vocab] after position cap - 1 */
  float *mass;         /* [seq_len]: the round's mass after cap tokens */
} llm_worker_prefix;

/* What one session measured. */
typedef struct llm_worker_stats {
  char id[160];
  char policy[32]; /* as the daemon applied it */
  uint64_t tokens, rounds, steps;
  uint64_t top1_counted, top1_agree;
  double kl_sum, kl_max;
  uint64_t bytes_total, bytes_fp16, bytes_fp16_live; /* bytes_fp16: every appended token in FP16 */
  uint64_t bytes_state[3]; /* daemon's block bytes: draft, staged, committed */
  uint64_t bytes_cold;     /* of those, in cold blocks (ByteCounts.cold): bytes_total - bytes_cold is primary */
  uint64_t bytes_summary;  /* the worker's own: its cold blocks' summaries (ckv_session_cold_summary_bytes) */
  uint64_t recalled_blocks; /* cold blocks attention read, per round (each counted once a round) */
  uint64_t dropped_tokens;  /* tokens the daemon dropped for good (TokenCounts.dropped) */
  uint64_t surprise_turns;  /* turns raised by the copy signal (options.surprise_nats) */
  double stream_nats;       /* sum of -ln p of every appended token under the logits before it (position 0: none);
                             * an adopted prefix counts its recorded ones: a fingerprint of what the model read */
  uint64_t states[4];      /* tokens per CKV_TOKEN_* */
  double seconds;
  int reconnects;
} llm_worker_stats;

typedef struct llm_worker {
  const llm_worker_options *o;
  const ckv_model *m;
  const ckv_model_config *mc;
  ckv_client *c;
  ckv_session *s;
  llm_worker_stats *res;
  ckv_model_state *st, *sh; /* commitkv path; shadow (NULL without options.shadow) */
  float *logits, *sh_logits; /* the last step's next-token logits, per path */
  float *probs;
  float *sh_k, *sh_v;       /* shadow cache: [layer][seq_len][kv_dim] */
  uint16_t *k16, *v16;      /* one token's K/V of one layer, FP16 */
  float *mass;              /* this round's attention mass per position */
  float *slot_mass;         /* kernel output: per (block, slot) */
  size_t cap_slot_mass;
  const void **blocks;      /* the view's blocks, all formats, then the cold tokens' gather block (or, on device
                             * memory, every cold block), then the aside block */
  size_t cap_blocks;
  uint32_t n_blocks;
  void *ws;
  size_t ws_bytes;
  void *aside;              /* private draft block of llm_worker_decode_aside */
  uint32_t aside_cap;
  uint64_t acked;           /* newest epoch acknowledged */
  const ckv_view *view;     /* the current view (its cold blocks are chosen per query) */
  void *gather;             /* FP16 block of the cold tokens a query needs (ckv_session_cold_gather) */
  uint32_t gather_src[LLM_GATHER_TOKENS]; /* each gathered token's cold block */
  uint8_t *cold_read;       /* per cold block of the view: read this round */
  size_t cap_cold;
  uint64_t cold_read_round; /* cold blocks read this round (distinct per view) */
  /* The token stream so far (positions 0..n_done-1, each one's K/V written):
   * what a session reopened empty after a daemon restart is rebuilt from. */
  uint32_t *ids;
  uint8_t *roles, *tags;
  uint64_t n_done;
  uint64_t reported;        /* the last round this daemon's session took (0: none) */
  uint32_t pending;         /* tokens that report left being moved */
  bool report_lost;         /* a report went out and its answer never came */
  float *saved_mass;        /* the round's mass while a re-prefill adds its own */
  ckv_semantic_turns *sem;  /* turn embeddings of the stream (NULL with options.semantic_off) */
  float *sem_scores;        /* per position, for the report */
  uint32_t *sem_pos;        /* 0, 1, 2, ...: every position is scored */
  float *sem_fixed;         /* per position: a score set by llm_worker_fix_score (NaN: none) */
  float fixed_score;        /* what the next tokens get (NaN: their embedding's) */
  llm_copy_signal *copy;    /* the turns the model copies from (options.surprise_nats; NULL: off) */
  bool have_logits;         /* logits hold a prediction of the next token */
  bool surprise_off;        /* llm_worker_surprise_turn(false): the current turn is not raised */
  bool shift_next;          /* llm_worker_topic_shift(): the next turn abandons the topic */
  bool topic_has_task;      /* the current topic's user request was seen */
  llm_worker_prefix *rec;   /* llm_worker_record's (owned; NULL: none) */
  ckv_geometry geom;        /* what the session is opened with, again after a restart */
  ckv_session_options sopts;
} llm_worker;

/* Sets up w for model m on client c; figures go to *res (zeroed by the
 * caller).  o, m, c and res must outlive w.  Returns CKV_OK or -ENOMEM. */
int llm_worker_init(llm_worker *w, const llm_worker_options *o, const ckv_model *m, ckv_client *c,
                    llm_worker_stats *res);
void llm_worker_done(llm_worker *w);

/* Opens session `id` (copied into res->id); a daemon that went away
 * meanwhile is waited for. */
int llm_worker_open(llm_worker *w, const char *id);

/* Keeps what the first n tokens leave behind (llm_worker_prefix) as they
 * are run; call before the first token.  Returns CKV_OK, CKV_ERR_INVALID (a
 * token already run, n 0 or past the model's positions, called twice),
 * -ENOMEM. */
int llm_worker_record(llm_worker *w, uint64_t n);
/* The prefix kept by llm_worker_record once its n tokens ran, else NULL.
 * Owned by w, valid until llm_worker_done(w). */
const llm_worker_prefix *llm_worker_recorded(const llm_worker *w);

/* Opens session `id` as llm_worker_open does, asking the daemon to start it
 * on the tenant's shared blocks that hold ids[0..n) (reuse_prefix; only whole
 * draft blocks match).  *ret_matched: the tokens the session holds already,
 * either `want` or 0: a session that matched some other count is dropped and
 * opened afresh without reuse (its bookkeeping could not be adopted).  With
 * *ret_matched > 0 call llm_worker_adopt before the next token.  A reopen
 * after a daemon restart never asks for reuse. */
int llm_worker_open_shared(llm_worker *w, const char *id, const uint32_t *ids, size_t n, uint64_t want,
                           uint64_t *ret_matched);

/* Takes p's n positions (p->n; the session opened by llm_worker_open_shared
 * holds them in shared blocks) as if they had been run: the stream's ids,
 * roles and tags, the turn embeddings and the copy signal fed from p's hidden
 * states and surprisals (with this worker's current fixed score and surprise
 * switch, as llm_worker_token would use them), the shadow's K/V rows, the
 * logits of the last one and the round's attention mass.  No K/V is
 * written and no model step is run.  Returns CKV_OK, or CKV_ERR_INVALID (a
 * token already run, p not complete or recorded without what this worker
 * needs: the semantic scores, the shadow). */
int llm_worker_adopt(llm_worker *w, const llm_worker_prefix *p);

/* Appends one token with its role and tag and runs it through both paths
 * (then w->logits, w->sh_logits predict the next one), as often as a daemon
 * restart makes it necessary. */
int llm_worker_token(llm_worker *w, int token, uint8_t role, uint8_t tag);

/* The next turn (the next token tagged CKV_TAG_TURN_START) abandons the
 * topic before it: its turns' semantic scores drop, and the next user turn
 * states the new task. */
void llm_worker_topic_shift(llm_worker *w);

/* The tokens appended from now on carry semantic score `score` (0..1)
 * instead of their turn embedding's; NaN: their embedding's again.  For
 * diagnostics that label turns themselves (commitkv-dialogue --semantic
 * oracle); without embeddings (options.semantic_off) nothing is sent. */
void llm_worker_fix_score(llm_worker *w, float score);

/* Whether the tokens appended from now on may be raised by surprisal
 * (options.surprise_nats): a front end whose own scorer already judged the
 * turn (the text named an entity) turns it off for that turn.  On by default. */
void llm_worker_surprise_turn(llm_worker *w, bool on);

/* Positions [from, to) already appended carry `score` from the next report
 * on (a later turn superseded them); NaN: their embedding's again. */
void llm_worker_fix_scores(llm_worker *w, uint64_t from, uint64_t to, float score);

/* The end of round `round` (from 1, increasing): the report of its mass
 * (once), with options.sync the wait for its moves, a fresh view; the mass
 * starts over for the next round. */
int llm_worker_end_round(llm_worker *w, int round);

/* Reads the session's figures from the daemon (ListSessions) into res:
 * policy, bytes_total, bytes_fp16 (of the tokens appended so far), the live
 * FP16 equivalent, bytes and tokens per state. */
int llm_worker_read_bytes(llm_worker *w);

/* The end of the stream: waits until the session's pending transitions are
 * published (acknowledging each epoch, so retired blocks are reclaimed), then
 * reads the figures as llm_worker_read_bytes() does. */
int llm_worker_settle(llm_worker *w);

/* Closes (options.keep) or drops the session.  With recover false (after a
 * failure) it tries once and says nothing. */
int llm_worker_end(llm_worker *w, bool recover);

/* Greedy decoding that appends nothing: from the last step's logits of the
 * commitkv path (or, with shadow, of the shadow path over its own cache),
 * up to max_tokens tokens, stopping after `stop` (kept), before `end` (not
 * kept; -1 for none), or when the model's positions run out.  The tokens go
 * to ret_tokens (max_tokens ints); *ret_n says how many; *ret_why is 's'
 * (stop), 'e' (end), 'l' (max_tokens), 'c' (no positions left).  Makes no
 * call to the daemon: the view of the last step is read, the decoded tokens'
 * K/V live in a private block.  Leaves w->logits (or w->sh_logits) as the
 * decode left them: append a token before reading them again. */
int llm_worker_decode_aside(llm_worker *w, bool shadow, int max_tokens, int stop, int end, int *ret_tokens,
                            int *ret_n, char *ret_why);

#endif
