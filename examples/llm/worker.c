/* worker.c - the per-token machinery of a worker whose KV cache lives in
 * commitkvd (worker.h says what it does): steps through the model with K/V
 * in the session's draft slots and fused attention over its view, the FP16
 * shadow, the turns' embeddings and semantic scores, the round's report and
 * acknowledgement, the daemon's figures, greedy decoding aside, and riding
 * through a daemon restart. */
#include "examples/llm/worker.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/rpc.h"
#include "examples/common/reconnect.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#define LLM_SETTLE_MS 5000    /* at most this long waiting for pending compressions at the end */
#define LLM_SETTLE_POLL_MS 10
#define LLM_SYNC_POLL_MS 1    /* options.sync: poll period while a round's moves finish */
#define LLM_SETTLE_QUIET 5    /* polls without change: the rest waits for more tokens */

/* What FP16 K/V of n tokens take: the baseline every policy is compared to. */
static uint64_t llm_fp16_bytes(const llm_worker *r, uint64_t n) {
  return n * 2u * (uint64_t)r->mc->n_layers * (uint64_t)r->mc->kv_dim * 2u;
}

/* ---- the session's view ----------------------------------------------------- */

/* Collects the blocks of the current view (fetching it when the epoch moved)
 * and acknowledges its epoch: nothing older is read after this. */
static int refresh_view(llm_worker *r) {
  const ckv_view *v;
  int e = ckv_session_view(r->s, &v);
  if (e < 0) return e;
  size_t n = v->n_draft + v->n_staged + v->n_committed;
  if (n + v->n_cold + 1 > r->cap_blocks) { /* the chosen cold blocks, then the aside block, go after the view's */
    const void **nb = realloc(r->blocks, (n + v->n_cold + 1) * sizeof(*nb));
    if (!nb) return -ENOMEM;
    r->blocks = nb;
    r->cap_blocks = n + v->n_cold + 1;
  }
  if (v->n_cold > r->cap_cold) {
    uint8_t *nr = realloc(r->cold_read, v->n_cold);
    if (!nr) return -ENOMEM;
    r->cold_read = nr;
    r->cap_cold = v->n_cold;
  }
  if (v->n_cold && v->epoch != r->acked) memset(r->cold_read, 0, v->n_cold); /* a new view: its own count */
  r->view = v;
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

/* Adds the kernel's per-(block, slot) mass of the first n_blocks blocks to
 * the per-position mass. */
static void add_mass(llm_worker *r, uint32_t n_blocks, uint64_t n_pos) {
  size_t base = 0;
  for (uint32_t b = 0; b < n_blocks; b++) {
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

/* Counts view->cold[k] as read this round (once per view). */
static void note_cold_read(llm_worker *r, uint32_t k) {
  r->cold_read_round += !r->cold_read[k];
  r->cold_read[k] = 1;
}

/* What this layer's query reads of the cold tier, after the view's blocks in
 * r->blocks: the block of the cold tokens it needs most
 * (ckv_session_cold_gather), or on device memory, which keeps no summaries
 * here, every cold block.  *ret_n: how many blocks went there. */
static int choose_cold(llm_worker *r, uint32_t layer, uint32_t *ret_n) {
  *ret_n = 0;
  const ckv_view *v = r->view;
  if (!v || !v->n_cold) return CKV_OK;
  if (!r->gather) {
    size_t bytes = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &r->geom, LLM_GATHER_TOKENS, 0);
    bytes = (bytes + CKV_BLOCK_ALIGN - 1) / CKV_BLOCK_ALIGN * CKV_BLOCK_ALIGN;
    r->gather = aligned_alloc(CKV_BLOCK_ALIGN, bytes);
    if (!r->gather) return -ENOMEM;
    memset(r->gather, 0, bytes); /* the rows of slots a call leaves invalid are never garbage */
  }
  size_t n = 0;
  int e = ckv_session_cold_gather(r->s, layer, ckv_model_state_q(r->st), (uint32_t)r->mc->n_heads, 0.f,
                                  LLM_GATHER_TOKENS, r->gather, LLM_GATHER_TOKENS, r->gather_src, &n);
  if (e == CKV_OK) {
    for (size_t i = 0; i < n; i++) note_cold_read(r, r->gather_src[i]);
    if (n) r->blocks[r->n_blocks] = r->gather;
    *ret_n = n ? 1u : 0u;
    return CKV_OK;
  }
  if (e != CKV_ERR_UNSUPPORTED) return e;
  for (uint32_t k = 0; k < v->n_cold; k++) {
    r->blocks[r->n_blocks + k] = v->cold[k].data;
    note_cold_read(r, k);
  }
  *ret_n = (uint32_t)v->n_cold;
  return CKV_OK;
}

/* Fused attention of the current layer's query over every block of the view,
 * the cold blocks it could need and, with aside, the aside block after them
 * (whose mass is not counted: its tokens are not the session's). */
static int attend_view(llm_worker *r, uint32_t layer, uint64_t n_pos, bool aside) {
  uint32_t n_cold;
  int e = choose_cold(r, layer, &n_cold);
  if (e < 0) return e;
  uint32_t n_session = r->n_blocks + n_cold, n_blocks = n_session + (aside ? 1u : 0u);
  if (aside) r->blocks[n_session] = r->aside;
  ckv_attn_args a = {.geom = &r->geom, .layer = layer, .n_rows = 1,
                     .n_q_heads = (uint32_t)r->mc->n_heads, .q = ckv_model_state_q(r->st),
                     .blocks = r->blocks, .n_blocks = n_blocks, .out = ckv_model_state_attn_buf(r->st)};
  size_t need = ckv_attention_mass_len(r->blocks, n_blocks);
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
  e = ckv_kernels_attention(&a);
  if (e < 0) return e;
  add_mass(r, n_session, n_pos); /* the session's blocks only */
  return CKV_OK;
}

/* ---- one token ------------------------------------------------------------ */

static void to_fp16(const float *x, uint16_t *h, int n) {
  for (int i = 0; i < n; i++) h[i] = ckv_f32_to_f16(x[i]);
}

/* One layer's FP16 K/V into slot `slot` of the aside block (valid from
 * layer 0 on: the attention of layer l reads layer l only). */
static void write_aside(llm_worker *r, uint32_t slot, uint64_t pos, uint32_t layer) {
  size_t bytes = ckv_draft_token_elems(&r->geom) * 2u;
  uint8_t *blk = r->aside;
  memcpy(blk + ckv_draft_kv_offset(&r->geom, r->aside_cap, layer, 0, slot), r->k16, bytes);
  memcpy(blk + ckv_draft_kv_offset(&r->geom, r->aside_cap, layer, 1, slot), r->v16, bytes);
  if (layer == 0) {
    ckv_block_positions(blk)[slot] = (uint32_t)pos;
    ckv_block_set_valid(blk, slot, true);
  }
}

/* The commitkv path: K/V into the daemon's slot, attention over the view;
 * with aside_slot >= 0, K/V into that slot of the aside block instead and
 * attention over the view and the aside block. */
static int step_commitkv(llm_worker *r, int token, uint64_t pos, int aside_slot) {
  int e = ckv_model_embed(r->m, r->st, token);
  for (int l = 0; e == CKV_OK && l < r->mc->n_layers; l++) {
    if ((e = ckv_model_qkv(r->m, r->st, l, (int)pos)) < 0) break;
    to_fp16(ckv_model_state_k(r->st), r->k16, r->mc->kv_dim);
    to_fp16(ckv_model_state_v(r->st), r->v16, r->mc->kv_dim);
    if (aside_slot >= 0)
      write_aside(r, (uint32_t)aside_slot, pos, (uint32_t)l);
    else if ((e = ckv_session_write_kv(r->s, pos, (uint32_t)l, r->k16, r->v16)) < 0)
      break;
    if ((e = attend_view(r, (uint32_t)l, pos + 1, aside_slot >= 0)) < 0) break;
    e = ckv_model_finish_layer(r->m, r->st, l, ckv_model_state_attn_buf(r->st));
  }
  return e < 0 ? e : ckv_model_logits(r->m, r->st, r->logits);
}

/* Rounds a row through FP16 (the shadow's FP16 baseline) or keeps it. */
static void shadow_store(const llm_worker *r, const float *x, float *dst) {
  int n = r->mc->kv_dim;
  for (int i = 0; i < n; i++) dst[i] = r->o->shadow_fp32 ? x[i] : ckv_f16_to_f32(ckv_f32_to_f16(x[i]));
}

/* The shadow path: the model's reference attention over a private cache. */
static int step_shadow(llm_worker *r, int token, uint64_t pos) {
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
static void compare(llm_worker *r) {
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
  if (r->probs[top] - second > LLM_WORKER_TOP1_MARGIN) {
    r->res->top1_counted++;
    if (ckv_model_argmax(r->logits, n) == top) r->res->top1_agree++;
  }
}

/* Adds the token just run (the commitkv path's final hidden state) to its
 * turn's embedding; a new turn states the task when it is a system turn or
 * the topic's first user turn, unless it is the one that shifts the topic. */
static int embed_token(llm_worker *r, const float *hidden, uint8_t role, uint8_t tag) {
  bool new_turn = (tag & CKV_TAG_TURN_START) || !ckv_semantic_turns_tokens(r->sem);
  int e = ckv_semantic_turns_add(r->sem, hidden, new_turn);
  if (e < 0 || !new_turn) return e;
  uint8_t flags = 0;
  if (r->shift_next) {
    flags = CKV_SEMANTIC_TOPIC_SHIFT;
    r->shift_next = r->topic_has_task = false;
  } else if (role == CKV_ROLE_SYSTEM || (role == CKV_ROLE_USER && !r->topic_has_task)) {
    flags = CKV_SEMANTIC_TASK;
    r->topic_has_task |= role == CKV_ROLE_USER;
  }
  return flags ? ckv_semantic_turns_mark(r->sem, flags) : CKV_OK;
}

/* -ln p(token) under logits: how much the model did not expect it. */
static float surprisal(const float *logits, int n, int token) {
  float mx = logits[0];
  for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
  return (float)((double)mx + log(sum) - (double)logits[token]);
}

/* llm_worker_record: keeps token `pos` (just run) and, at the prefix's end,
 * the logits, the round's mass and the shadow's rows. */
static void record_token(llm_worker *r, uint64_t pos, float surprise) {
  llm_worker_prefix *p = r->rec;
  if (!p || p->n || pos >= p->cap) return;
  const ckv_model_config *c = r->mc;
  p->ids[pos] = r->ids[pos];
  p->roles[pos] = r->roles[pos];
  p->tags[pos] = r->tags[pos];
  p->surprise[pos] = surprise;
  if (p->hidden) memcpy(p->hidden + pos * (size_t)c->dim, ckv_model_state_hidden(r->st), (size_t)c->dim * sizeof(float));
  if (pos + 1 < p->cap) return;
  memcpy(p->logits, r->logits, (size_t)c->vocab_size * sizeof(float));
  memcpy(p->mass, r->mass, (size_t)c->seq_len * sizeof(float));
  size_t row = (size_t)c->kv_dim, layer_floats = (size_t)c->seq_len * row;
  for (int l = 0; p->sh_k && l < c->n_layers; l++) {
    memcpy(p->sh_k + (size_t)l * p->cap * row, r->sh_k + (size_t)l * layer_floats, p->cap * row * sizeof(float));
    memcpy(p->sh_v + (size_t)l * p->cap * row, r->sh_v + (size_t)l * layer_floats, p->cap * row * sizeof(float));
  }
  p->n = p->cap;
}

/* Appends one token, runs it through both paths, compares.  The token joins
 * the stream a rebuilt session is re-prefilled from once its K/V is in the
 * daemon's slots. */
static int step(llm_worker *r, int token, uint8_t role, uint8_t tag) {
  uint32_t id = (uint32_t)token;
  uint64_t pos;
  int e = ckv_session_append(r->s, 1, &role, &tag, NULL, &id, &pos);
  if (e < 0) return e;
  if (pos != r->n_done) return CKV_ERR_PROTO; /* the daemon's stream is not ours */
  if ((e = refresh_view(r)) < 0) return e;
  float surprise = r->have_logits && token < r->mc->vocab_size ? surprisal(r->logits, r->mc->vocab_size, token) : 0.f;
  if ((e = step_commitkv(r, token, pos, -1)) < 0) return e;
  r->have_logits = true;
  r->res->stream_nats += surprise;
  if (r->copy) r->res->surprise_turns += llm_copy_signal_add(r->copy, pos, id, surprise, tag & CKV_TAG_TURN_START, r->surprise_off);
  r->ids[pos] = id;
  r->roles[pos] = role;
  r->tags[pos] = tag;
  r->n_done = pos + 1;
  if (r->sem && (e = embed_token(r, ckv_model_state_hidden(r->st), role, tag)) < 0) return e;
  if (r->sem) r->sem_fixed[pos] = r->fixed_score;
  if (r->sh) {
    if ((e = step_shadow(r, token, pos)) < 0) return e;
    compare(r);
  }
  record_token(r, pos, surprise);
  r->res->steps++;
  r->res->tokens = pos + 1;
  return CKV_OK;
}

/* ---- riding through a daemon restart ---------------------------------------- */

/* A new, empty session takes the stream again: every token appended on its
 * own and run through the model, as the first time, so each one's K/V comes
 * from attention over what the new session holds.  The round's attention
 * mass and the shadow are left as they were; the last token's logits are
 * the ones the next token is chosen from. */
static int reprefill(llm_worker *r) {
  uint64_t n = r->n_done;
  memcpy(r->saved_mass, r->mass, (size_t)r->mc->seq_len * sizeof(float));
  r->n_done = 0;
  int e = CKV_OK;
  for (uint64_t p = 0; e == CKV_OK && p < n; p++) {
    uint64_t pos;
    e = ckv_session_append(r->s, 1, &r->roles[p], &r->tags[p], NULL, &r->ids[p], &pos);
    if (e == CKV_OK && pos != p) e = CKV_ERR_PROTO;
    if (e == CKV_OK) e = refresh_view(r);
    if (e == CKV_OK) e = step_commitkv(r, (int)r->ids[p], p, -1);
  }
  memcpy(r->mass, r->saved_mass, (size_t)r->mc->seq_len * sizeof(float));
  r->n_done = n; /* a failed re-prefill is started over on a new session */
  return e;
}

/* After `what` failed with `status` because the daemon went away: re-attach
 * with backoff, reopen the session, re-prefill it when it came back empty.
 * t0: when the failed step began, so the line printed says how long the
 * worker was held up.  Says why when it gives up. */
static int recover(llm_worker *r, int status, const char *what, long long t0) {
  r->view = NULL; /* the session's view goes with it */
  const llm_worker_options *o = r->o;
  long long deadline = reconnect_now_ms() + o->reconnect_ms;
  bool restarted = false, fresh = false;
  int e;
  const char *step_what = "reopen";
  for (;;) {
    if ((e = reconnect_client(r->c, deadline)) < 0) {
      fprintf(stderr, "%s: %s: %s failed (%s) and the daemon did not come back within %d ms: %s: %s\n",
              o->prog, r->res->id, what, ckv_strerror(status), o->reconnect_ms, ckv_strerror(e), ckv_client_last_error(r->c));
      return e;
    }
    if (strcmp(ckv_client_memory_kind(r->c), "host") != 0) {
      fprintf(stderr, "%s: the daemon came back with '%s' KV memory, which the CPU cannot address\n", o->prog,
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
    bool transient = reconnect_transient(e);
    if (!(transient || reconnect_daemon_gone(r->c, r->s, e)) || reconnect_now_ms() >= deadline) {
      fprintf(stderr, "%s: %s: after the daemon came back: %s: %s: %s\n", o->prog, r->res->id, step_what,
              ckv_strerror(e), ckv_client_last_error(r->c));
      return e;
    }
    if (transient) reconnect_pause(deadline);
  }
  r->res->reconnects++;
  fprintf(stderr,
          "%s: %s: %s: reconnected after %lld ms, reopened 1 sessions, re-prefilled %" PRIu64
          " tokens (%s: %s)\n",
          o->prog, r->res->id, restarted ? "daemon restarted" : "daemon answered again", reconnect_now_ms() - t0,
          fresh ? r->n_done : 0, what, ckv_strerror(status));
  return CKV_OK;
}

/* Whether a failure of `what` is one to recover from; recovers if so.
 * Returns CKV_OK to try `what` again, else the status to fail with. */
static int recover_or_fail(llm_worker *r, int status, const char *what, long long t0) {
  if (!r->o->reconnect_ms || !reconnect_daemon_gone(r->c, r->s, status)) return status;
  return recover(r, status, what, t0);
}

/* One token, as often as a daemon restart makes it necessary. */
static int step_retry(llm_worker *r, int token, uint8_t role, uint8_t tag) {
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = step(r, token, role, tag);
    if (e == CKV_OK) return CKV_OK;
    if ((e = recover_or_fail(r, e, "token", t0)) < 0) return e;
  }
}

/* ---- the daemon's figures -------------------------------------------------- */

/* Finds this session in ListSessions.  *ret_pending: tokens still being moved. */
static int session_info(llm_worker *r, uint64_t *ret_epoch, uint64_t *ret_pending) {
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
    r->res->bytes_cold = si->bytes->cold;
    r->res->bytes_summary = ckv_session_cold_summary_bytes(r->s);
    r->res->dropped_tokens = si->tokens->dropped;
    r->res->bytes_fp16_live = si->bytes->fp16_equivalent;
    uint64_t by[3] = {si->bytes->draft, si->bytes->staged, si->bytes->committed};
    memcpy(r->res->bytes_state, by, sizeof(by));
    uint64_t st[4] = {si->tokens->draft, si->tokens->staged, si->tokens->committed, si->tokens->recycled};
    memcpy(r->res->states, st, sizeof(st));
    r->res->bytes_fp16 = llm_fp16_bytes(r, r->n_done);
    *ret_epoch = si->epoch;
    *ret_pending = si->pending_tokens;
    e = CKV_OK;
  }
  ckv_rpc_free(rep);
  return e;
}

/* Jobs the daemon's compressor has waiting or running (all sessions). */
static int compress_queue(llm_worker *r, uint64_t *ret) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep;
  int e = ckv_rpc(r->c, &req, &rep);
  if (e < 0) return e;
  *ret = rep->body_case == COMMITKV__V1__RESPONSE__BODY_STATS && rep->stats ? rep->stats->compress_queue : 0;
  ckv_rpc_free(rep);
  return CKV_OK;
}

/* Waits until the session's pending transitions are published.  Tokens
 * waiting for a committed chunk to fill stay pending for good, so it stops
 * once neither the epoch nor the pending count moved for LLM_SETTLE_QUIET
 * polls while the compressor had no job waiting or running (a job still
 * running on a loaded machine keeps it waiting: a fixed quiet time alone
 * ended some --sync rounds before their moves were published).  With final (no view is read any more) it also acknowledges each
 * epoch it sees, so the bytes read last are the settled footprint; during a
 * session the next refresh_view() acknowledges instead, once it holds the
 * view of that epoch (the library only refetches after a reply told it of a
 * newer epoch, which the next append does). */
static int settle(llm_worker *r, int poll_ms, bool final) {
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
    uint64_t queue = 0;
    if (pending && (e = compress_queue(r, &queue)) < 0) return e;
    quiet = pending == last_pending && epoch == last_epoch && queue == 0 ? quiet + 1 : 0;
    last_pending = pending;
    last_epoch = epoch;
    if (!pending || quiet >= LLM_SETTLE_QUIET || waited >= LLM_SETTLE_MS) return CKV_OK;
    nanosleep(&nap, NULL);
  }
}

/* ---- rounds --------------------------------------------------------------- */

/* Every token's semantic score so far, to travel with the next report:
 * all of them, as a new turn moves the centring and a shift the topic. */
static int queue_semantic(llm_worker *r) {
  size_t n = ckv_semantic_turns_tokens(r->sem);
  int e = n ? ckv_semantic_turns_scores(r->sem, /* weights= */ NULL, r->sem_scores) : CKV_OK;
  for (size_t i = 0; e == CKV_OK && i < n; i++)
    if (!isnan(r->sem_fixed[i])) r->sem_scores[i] = r->sem_fixed[i];
  const uint8_t *raised = r->copy ? llm_copy_signal_raised(r->copy) : NULL;
  for (size_t i = 0; e == CKV_OK && raised && i < n; i++)
    if (raised[i] && !(r->sem_scores[i] >= LLM_SURPRISE_SCORE)) r->sem_scores[i] = LLM_SURPRISE_SCORE;
  return e < 0 || !n ? e : ckv_session_set_semantic(r->s, r->sem_pos, r->sem_scores, n);
}

/* The end of a turn: the report (once), then a fresh view. */
static int finish_turn(llm_worker *r, int round) {
  int e;
  if (r->reported < (uint64_t)round) {
    ckv_round_result rr;
    if (r->sem && (e = queue_semantic(r)) < 0) return e;
    if ((e = ckv_session_note_recalled(r->s, r->cold_read_round)) < 0) return e;
    r->res->recalled_blocks += r->cold_read_round;
    r->cold_read_round = 0;
    if (r->view && r->view->n_cold) memset(r->cold_read, 0, r->view->n_cold);
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


/* ---- the interface ------------------------------------------------------------ */

int llm_worker_parse_long(const char *s, long lo, long hi, long *ret) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) return -1;
  *ret = v;
  return 0;
}

int llm_worker_params_add(llm_worker_params *p, char *kv) {
  char *eq = strchr(kv, '=');
  if (!eq || eq == kv || p->n == LLM_WORKER_MAX_PARAMS) return -1;
  char *end;
  double v = strtod(eq + 1, &end);
  if (!eq[1] || *end) return -1;
  *eq = '\0';
  p->names[p->n] = kv;
  p->values[p->n++] = v;
  return 0;
}

int llm_worker_parse_semantic(const char *s, llm_worker_options *o) {
  if (strcmp(s, "embed") && strcmp(s, "none")) return -1;
  o->semantic_off = !strcmp(s, "none");
  return 0;
}

int llm_worker_init(llm_worker *r, const llm_worker_options *o, const ckv_model *m, ckv_client *c,
                    llm_worker_stats *res) {
  *r = (llm_worker){.o = o, .m = m, .mc = ckv_model_config_get(m), .c = c, .res = res, .fixed_score = NAN};
  const ckv_model_config *mc = r->mc;
  size_t cache = (size_t)mc->n_layers * (size_t)mc->seq_len * (size_t)mc->kv_dim;
  r->geom = (ckv_geometry){.n_layers = (uint32_t)mc->n_layers, .n_kv_heads = (uint32_t)mc->n_kv_heads,
                           .head_dim = (uint32_t)mc->head_dim, .dtype = CKV_DTYPE_FP16};
  r->sopts = (ckv_session_options){.policy = o->policy, .param_names = o->param_names,
                                   .param_values = o->param_values, .n_params = o->n_params};
  int e = ckv_model_state_new(m, /* private_cache= */ false, &r->st);
  if (e == CKV_OK && o->shadow) e = ckv_model_state_new(m, /* private_cache= */ false, &r->sh);
  if (e == CKV_OK && !o->semantic_off) e = ckv_semantic_turns_new((size_t)mc->dim, &r->sem);
  if (e < 0) return e;
  if (r->sem) {
    r->sem_scores = malloc((size_t)mc->seq_len * sizeof(float));
    r->sem_pos = malloc((size_t)mc->seq_len * sizeof(uint32_t));
    r->sem_fixed = malloc((size_t)mc->seq_len * sizeof(float));
    if (!r->sem_scores || !r->sem_pos || !r->sem_fixed) return -ENOMEM;
    if (o->surprise_nats > 0.f &&
        (e = llm_copy_signal_new((size_t)mc->seq_len, o->surprise_nats, LLM_COPY_NATS, &r->copy)) < 0)
      return e;
    for (int i = 0; i < mc->seq_len; i++) {
      r->sem_pos[i] = (uint32_t)i;
      r->sem_fixed[i] = NAN;
    }
  }
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

static void prefix_free(llm_worker_prefix *p) {
  if (!p) return;
  free(p->ids);
  free(p->roles);
  free(p->tags);
  free(p->surprise);
  free(p->hidden);
  free(p->sh_k);
  free(p->sh_v);
  free(p->logits);
  free(p->mass);
  free(p);
}

void llm_worker_done(llm_worker *r) {
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
  free(r->gather);
  free(r->cold_read);
  free(r->ws);
  free(r->aside);
  ckv_semantic_turns_free(r->sem);
  free(r->sem_scores);
  free(r->sem_pos);
  free(r->sem_fixed);
  llm_copy_signal_free(r->copy);
  prefix_free(r->rec);
  *r = (llm_worker){0};
}

int llm_worker_open(llm_worker *r, const char *id) {
  snprintf(r->res->id, sizeof(r->res->id), "%s", id);
  r->view = NULL;
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = ckv_session_open(r->c, r->res->id, &r->geom, &r->sopts, &r->s);
    if (e == CKV_OK) return CKV_OK;
    r->s = NULL;
    if ((e = recover_or_fail(r, e, "open", t0)) < 0) return e;
    if (r->s) return CKV_OK; /* the recovery opened it */
  }
}

int llm_worker_token(llm_worker *r, int token, uint8_t role, uint8_t tag) { return step_retry(r, token, role, tag); }

/* ---- shared prefixes -------------------------------------------------------- */

int llm_worker_record(llm_worker *r, uint64_t n) {
  const ckv_model_config *c = r->mc;
  if (r->rec || r->n_done || !n || n > (uint64_t)c->seq_len) return CKV_ERR_INVALID;
  llm_worker_prefix *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  r->rec = p;
  p->cap = n;
  size_t rows = (size_t)c->n_layers * n * (size_t)c->kv_dim;
  p->ids = calloc(n, sizeof(*p->ids));
  p->roles = calloc(n, 1);
  p->tags = calloc(n, 1);
  p->surprise = calloc(n, sizeof(float));
  p->logits = calloc((size_t)c->vocab_size, sizeof(float));
  p->mass = calloc((size_t)c->seq_len, sizeof(float));
  if (r->sem) p->hidden = calloc(n * (size_t)c->dim, sizeof(float));
  if (r->sh) {
    p->sh_k = calloc(rows, sizeof(float));
    p->sh_v = calloc(rows, sizeof(float));
  }
  if (!p->ids || !p->roles || !p->tags || !p->surprise || !p->logits || !p->mass || (r->sem && !p->hidden) ||
      (r->sh && (!p->sh_k || !p->sh_v)))
    return -ENOMEM; /* freed by llm_worker_done */
  return CKV_OK;
}

const llm_worker_prefix *llm_worker_recorded(const llm_worker *r) { return r->rec && r->rec->n ? r->rec : NULL; }

int llm_worker_open_shared(llm_worker *r, const char *id, const uint32_t *ids, size_t n, uint64_t want,
                           uint64_t *ret_matched) {
  r->sopts.token_ids = ids;
  r->sopts.n_token_ids = n;
  r->sopts.reuse_prefix = true;
  int e = llm_worker_open(r, id);
  r->sopts.token_ids = NULL; /* a session reopened after a restart is re-prefilled from position 0 */
  r->sopts.n_token_ids = 0;
  r->sopts.reuse_prefix = false;
  if (e < 0) return e;
  uint64_t matched = ckv_session_matched_tokens(r->s);
  if (matched && matched != want) { /* not what the recorded prefix covers: start over without it */
    fprintf(stderr, "%s: %s: matched %" PRIu64 " tokens of a %" PRIu64 "-token prefix: reopened without reuse\n",
            r->o->prog, id, matched, want);
    e = ckv_session_drop(r->s);
    r->s = NULL;
    if (e < 0 || (e = llm_worker_open(r, id)) < 0) return e;
    matched = 0;
  }
  *ret_matched = matched;
  return CKV_OK;
}

int llm_worker_adopt(llm_worker *r, const llm_worker_prefix *p) {
  const ckv_model_config *c = r->mc;
  if (r->n_done || !p->n || (r->sem && !p->hidden) || (r->sh && !p->sh_k) || !r->s ||
      ckv_session_tokens(r->s) != p->n)
    return CKV_ERR_INVALID;
  size_t row = (size_t)c->kv_dim, layer_floats = (size_t)c->seq_len * row;
  for (uint64_t pos = 0; pos < p->n; pos++) {
    r->ids[pos] = p->ids[pos];
    r->roles[pos] = p->roles[pos];
    r->tags[pos] = p->tags[pos];
    r->res->stream_nats += p->surprise[pos];
    if (r->copy)
      r->res->surprise_turns += llm_copy_signal_add(r->copy, pos, p->ids[pos], p->surprise[pos],
                                                    p->tags[pos] & CKV_TAG_TURN_START, r->surprise_off);
    if (r->sem) {
      int e = embed_token(r, p->hidden + pos * (size_t)c->dim, p->roles[pos], p->tags[pos]);
      if (e < 0) return e;
      r->sem_fixed[pos] = r->fixed_score;
    }
  }
  for (int l = 0; r->sh && l < c->n_layers; l++) {
    memcpy(r->sh_k + (size_t)l * layer_floats, p->sh_k + (size_t)l * p->n * row, p->n * row * sizeof(float));
    memcpy(r->sh_v + (size_t)l * layer_floats, p->sh_v + (size_t)l * p->n * row, p->n * row * sizeof(float));
  }
  memcpy(r->logits, p->logits, (size_t)c->vocab_size * sizeof(float));
  memcpy(r->mass, p->mass, (size_t)c->seq_len * sizeof(float));
  r->have_logits = true;
  r->n_done = p->n;
  r->res->tokens = p->n;
  return CKV_OK;
}

void llm_worker_topic_shift(llm_worker *r) { r->shift_next = true; }

void llm_worker_fix_score(llm_worker *r, float score) { r->fixed_score = score; }

void llm_worker_surprise_turn(llm_worker *r, bool on) { r->surprise_off = !on; }

void llm_worker_fix_scores(llm_worker *r, uint64_t from, uint64_t to, float score) {
  for (uint64_t p = from; r->sem && p < to && p < r->n_done; p++) r->sem_fixed[p] = score;
}

int llm_worker_end_round(llm_worker *r, int round) {
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = finish_turn(r, round);
    if (e == CKV_OK) {
      memset(r->mass, 0, (size_t)r->mc->seq_len * sizeof(float));
      return CKV_OK;
    }
    if ((e = recover_or_fail(r, e, "report", t0)) < 0) return e;
  }
}

int llm_worker_read_bytes(llm_worker *r) {
  for (;;) {
    long long t0 = reconnect_now_ms();
    uint64_t epoch, pending;
    int e = session_info(r, &epoch, &pending);
    if (e == CKV_OK) return CKV_OK;
    if ((e = recover_or_fail(r, e, "list sessions", t0)) < 0) return e;
  }
}

int llm_worker_settle(llm_worker *r) {
  for (;;) {
    long long t0 = reconnect_now_ms();
    int e = settle(r, LLM_SETTLE_POLL_MS, /* final= */ true);
    if (e == CKV_OK) return CKV_OK;
    if ((e = recover_or_fail(r, e, "list sessions", t0)) < 0) return e;
  }
}

/* A kept session lost with the daemon is rebuilt first; a dropped one is
 * gone with it anyway. */
int llm_worker_end(llm_worker *r, bool recover) {
  const char *what = r->o->keep ? "close" : "drop";
  for (;;) {
    if (!r->s) return CKV_OK;
    long long t0 = reconnect_now_ms();
    int e = r->o->keep ? ckv_session_close(r->s) : ckv_session_drop(r->s);
    r->s = NULL; /* freed in every case */
    r->view = NULL;
    if (!recover || e == CKV_OK || (!r->o->keep && e == CKV_ERR_DAEMON_RESTARTED)) return recover ? CKV_OK : e;
    if ((e = recover_or_fail(r, e, what, t0)) < 0) return e;
  }
}

/* ---- decoding aside ----------------------------------------------------------- */

/* A fresh, empty aside block of at least cap slots. */
static int aside_reset(llm_worker *r, uint32_t cap) {
  if (cap > r->aside_cap) {
    size_t bytes = ckv_align_up(ckv_format_block_bytes(CKV_FORMAT_DRAFT, &r->geom, cap, 0), CKV_BLOCK_ALIGN);
    void *nb = bytes ? aligned_alloc(CKV_BLOCK_ALIGN, bytes) : NULL;
    if (!nb) return -ENOMEM;
    free(r->aside);
    r->aside = nb;
    r->aside_cap = cap;
  }
  return ckv_block_init(r->aside, CKV_FORMAT_DRAFT, &r->geom, r->aside_cap, 0, 0);
}

int llm_worker_decode_aside(llm_worker *r, bool shadow, int max_tokens, int stop, int end, int *ret_tokens,
                            int *ret_n, char *ret_why) {
  if (max_tokens < 1 || max_tokens > (int)CKV_MAX_BLOCK_TOKENS || (shadow && !r->sh) || !r->n_done)
    return CKV_ERR_INVALID;
  int e = shadow ? CKV_OK : aside_reset(r, (uint32_t)max_tokens);
  if (e < 0) return e;
  const float *lg = shadow ? r->sh_logits : r->logits;
  int n = 0;
  char why = 'l';
  while (n < max_tokens) {
    int t = ckv_model_argmax(lg, r->mc->vocab_size);
    if (t == end) {
      why = 'e';
      break;
    }
    ret_tokens[n++] = t;
    uint64_t pos = r->n_done + (uint64_t)n - 1; /* where t's own K/V would go */
    if (t == stop) {
      why = 's';
      break;
    }
    if (n == max_tokens) break;
    if (pos >= (uint64_t)r->mc->seq_len) {
      why = 'c';
      break;
    }
    /* The shadow's later positions are overwritten by what is appended next. */
    e = shadow ? step_shadow(r, t, pos) : step_commitkv(r, t, pos, n - 1);
    if (e < 0) return e;
  }
  *ret_n = n;
  *ret_why = why;
  return CKV_OK;
}
