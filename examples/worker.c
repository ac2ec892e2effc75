/* worker.c - commitkv-worker: the minimal reference worker.
 *
 * Connects to commitkvd, opens --sessions sessions, and round after round
 * appends tokens, writes their K/V (a deterministic pattern of the seed,
 * session, position, layer and element) straight into the slots the daemon
 * handed out, reads every token back through the session's view and checks
 * every byte, reports a round of attention and acknowledges the epoch.
 * Exit status 0 means every round ran and every byte read back was the byte
 * written.
 *
 * It rides through a daemon restart (examples/common/reconnect.h): when a
 * call fails because the daemon went away it re-attaches with backoff for up
 * to --reconnect-timeout-ms (0: fail at once, as before), reopens every
 * session, writes the K/V of every token a new session lost again (the
 * pattern is a function of the position, so the worker knows them all), says
 * so in one line on stderr, and goes on with the round it was on.  A daemon
 * not there yet when the worker starts is waited for the same way.  Each step
 * of a round is recorded once it took effect, so a round is never appended or
 * reported twice.
 *
 *   commitkv-worker [--socket EP] [--sessions N] [--rounds R] [--tokens T]
 *                   [--layers L] [--kv-heads H] [--head-dim D] [--seed S]
 *                   [--prefix NAME] [--pause-ms MS] [--reconnect-timeout-ms MS]
 *                   [--keep] [--quiet] */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "examples/common/reconnect.h"
#include "kernels/format.h"

#define WORKER_MAX_SESSIONS 64
#define WORKER_REPREFILL_CHUNK 4096u /* tokens per AppendTokens when a new session takes back its K/V */

typedef struct opts {
  const char *socket, *attach, *prefix;
  int sessions, rounds, tokens, pause_ms, reconnect_ms;
  uint32_t layers, heads, dim;
  uint64_t seed;
  int keep, quiet;
} opts;

/* One session and what the worker knows of it: the daemon's copy must hold
 * exactly `tokens` tokens, so a session reopened empty is rebuilt from it. */
typedef struct wsession {
  ckv_session *s;
  char id[160];
  uint64_t tokens;   /* appended, K/V written */
  uint64_t reported; /* the last round this daemon's session took (0: none) */
  uint64_t epoch;    /* the view epoch that report published, to acknowledge */
} wsession;

typedef struct worker {
  opts o;
  ckv_client *c;
  ckv_geometry g;
  wsession ss[WORKER_MAX_SESSIONS];
  uint16_t *k, *v;
  float *attn;
  long bad_total;
  uint64_t checked_total;
  int reconnects;
  bool paused; /* --pause-ms happens once, not again when a reconnect repeats the round */
} worker;

static uint16_t pattern(uint64_t seed, uint64_t sess, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t i) {
  uint64_t x = seed ^ (sess * 0x9e3779b97f4a7c15ull) ^ (pos << 20) ^ ((uint64_t)layer << 8) ^ ((uint64_t)kv << 7) ^
               ((uint64_t)i << 40);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint16_t)x;
}

/* Checks every valid slot of every draft block against the pattern.
 * Returns the view's status (CKV_ERR_FORMAT for a block that is no draft
 * block) and, on CKV_OK, the mismatching elements and the tokens read. */
static int verify(ckv_session *s, const opts *o, uint64_t sess_idx, long *ret_bad, uint64_t *ret_checked) {
  const ckv_view *v;
  int r = ckv_session_view(s, &v);
  if (r < 0) return r;
  const ckv_geometry *g = ckv_session_geometry(s);
  size_t elems = ckv_draft_token_elems(g);
  long bad = 0;
  uint64_t checked = 0;
  for (size_t b = 0; b < v->n_draft; b++) {
    const uint8_t *base = v->draft[b].data;
    const ckv_block_header *h = (const ckv_block_header *)base;
    if (h->magic != CKV_BLOCK_MAGIC || h->format != CKV_FORMAT_DRAFT) return CKV_ERR_FORMAT;
    const uint32_t *positions = (const uint32_t *)(base + ckv_block_positions_offset());
    const uint64_t *bits = (const uint64_t *)(base + ckv_block_bitmap_offset(h->capacity));
    for (uint32_t sl = 0; sl < h->capacity; sl++) {
      if (!((bits[sl / 64] >> (sl % 64)) & 1u)) continue;
      for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint16_t *p = (const uint16_t *)(base + ckv_draft_kv_offset(g, h->capacity, l, kv, sl));
          for (uint32_t i = 0; i < elems; i++)
            if (p[i] != pattern(o->seed, sess_idx, positions[sl], l, kv, i)) bad++;
        }
      checked++;
    }
  }
  *ret_bad = bad;
  *ret_checked = checked;
  return CKV_OK;
}

/* Appends `count` tokens to session i and writes their K/V. */
static int append_and_write(worker *w, int i, uint32_t count, const char **ret_what) {
  wsession *S = &w->ss[i];
  size_t elems = (size_t)w->o.heads * w->o.dim;
  uint64_t first;
  *ret_what = "append";
  int r = ckv_session_append(S->s, count, NULL, NULL, NULL, NULL, &first);
  if (r < 0) return r;
  *ret_what = "write K/V";
  for (uint64_t p = first; p < first + count; p++)
    for (uint32_t l = 0; l < w->o.layers; l++) {
      for (uint32_t e = 0; e < elems; e++) {
        w->k[e] = pattern(w->o.seed, (uint64_t)i, p, l, 0, e);
        w->v[e] = pattern(w->o.seed, (uint64_t)i, p, l, 1, e);
      }
      if ((r = ckv_session_write_kv(S->s, p, l, w->k, w->v)) < 0) return r;
    }
  S->tokens = first + count;
  return CKV_OK;
}

/* Round `round` of session i, from wherever an earlier try of it stopped.
 * *ret_report_lost is set when the report was sent but its answer never came
 * (the daemon may or may not have taken it). */
static int session_round(worker *w, int i, int round, const char **ret_what, bool *ret_report_lost) {
  wsession *S = &w->ss[i];
  const opts *o = &w->o;
  int r;
  *ret_report_lost = false;
  if (S->tokens < (uint64_t)round * (uint64_t)o->tokens &&
      (r = append_and_write(w, i, (uint32_t)o->tokens, ret_what)) < 0)
    return r;
  if (o->pause_ms && round == o->rounds / 2 && i == 0 && !w->paused) {
    w->paused = true;
    usleep((useconds_t)o->pause_ms * 1000u);
  }
  long bad = 0;
  uint64_t checked = 0;
  *ret_what = "view";
  if ((r = verify(S->s, o, (uint64_t)i, &bad, &checked)) < 0) return r;
  w->bad_total += bad;
  w->checked_total += checked;
  if (S->reported < (uint64_t)round) {
    uint64_t n = ckv_session_tokens(S->s);
    float *na = realloc(w->attn, (n ? n : 1) * sizeof(float));
    if (!na) return -ENOMEM;
    w->attn = na;
    for (uint64_t p = 0; p < n; p++) w->attn[p] = 1.0f / (float)n;
    ckv_round_result rr;
    *ret_what = "report";
    r = ckv_session_report(S->s, (uint64_t)round, 0, w->attn, n, &rr);
    if (r < 0) {
      *ret_report_lost = r == CKV_ERR_TIMEOUT;
      return r;
    }
    S->reported = (uint64_t)round;
    S->epoch = rr.epoch;
  }
  *ret_what = "ack";
  return ckv_session_ack(S->s, S->epoch, NULL);
}

/* After call `what` on session `failed` found the daemon gone: re-attach,
 * reopen every session and give each new one back the K/V of its tokens.
 * t0 is when the failed try of the round began: the line printed on success
 * says how long the worker was held up in all (a request lost with the old
 * daemon waits for the client's timeout first).  Says why when it gives up. */
static int recover(worker *w, int failed, bool report_lost, int status, const char *what, long long t0) {
  const opts *o = &w->o;
  long long deadline = reconnect_now_ms() + o->reconnect_ms;
  bool restarted = false;
  uint64_t reprefilled = 0;
  int r;
  for (;;) {
    if ((r = reconnect_client(w->c, deadline)) < 0) {
      fprintf(stderr, "%s: %s failed (%s) and the daemon did not come back within %d ms: %s: %s\n", o->prefix, what,
              ckv_strerror(status), o->reconnect_ms, ckv_strerror(r), ckv_client_last_error(w->c));
      return r;
    }
    if (strcmp(ckv_client_memory_kind(w->c), "host") != 0) {
      fprintf(stderr, "%s: the daemon came back with '%s' KV memory, which the CPU cannot address\n", o->prefix,
              ckv_client_memory_kind(w->c));
      return CKV_ERR_UNSUPPORTED;
    }
    reprefilled = 0;
    const char *step = "reopen";
    for (int i = 0; r == CKV_OK && i < o->sessions; i++) {
      wsession *S = &w->ss[i];
      bool fresh = false, was_stale = false;
      step = "reopen";
      r = reconnect_session(w->c, &S->s, S->id, &w->g, NULL, S->tokens, !(i == failed && report_lost), &fresh,
                            &was_stale);
      restarted |= was_stale;
      if (r < 0 || !fresh) continue;
      /* A new session: no report yet, and every token's K/V to write again. */
      uint64_t want = S->tokens;
      S->tokens = 0;
      S->reported = 0;
      while (r == CKV_OK && S->tokens < want) {
        uint64_t left = want - S->tokens;
        r = append_and_write(w, i, left < WORKER_REPREFILL_CHUNK ? (uint32_t)left : WORKER_REPREFILL_CHUNK, &step);
      }
      if (r == CKV_OK) reprefilled += want;
      else if (S->tokens < want) S->tokens = want; /* the next try starts this session over */
    }
    if (r == CKV_OK) break;
    ckv_session *probe = NULL;
    for (int i = 0; i < o->sessions && !probe; i++) probe = w->ss[i].s;
    bool transient = reconnect_transient(r);
    if (!(transient || reconnect_daemon_gone(w->c, probe, r)) || reconnect_now_ms() >= deadline) {
      fprintf(stderr, "%s: after the daemon came back: %s: %s: %s\n", o->prefix, step, ckv_strerror(r),
              ckv_client_last_error(w->c));
      return r;
    }
    if (transient) reconnect_pause(deadline);
  }
  w->reconnects++;
  fprintf(stderr,
          "%s: %s: reconnected after %lld ms, reopened %d sessions, re-prefilled %" PRIu64 " tokens (%s: %s)\n",
          o->prefix, restarted ? "daemon restarted" : "daemon answered again", reconnect_now_ms() - t0, o->sessions,
          reprefilled, what, ckv_strerror(status));
  return CKV_OK;
}

int main(int argc, char **argv) {
  static worker w;
  opts o = {.prefix = "worker", .sessions = 2, .rounds = 20, .tokens = 32, .layers = 4, .heads = 4, .dim = 64,
            .seed = 1, .reconnect_ms = RECONNECT_DEFAULT_GIVE_UP_MS};
  static const struct option lo[] = {
      {"socket", required_argument, 0, 's'}, {"attach-socket", required_argument, 0, 'a'},
      {"sessions", required_argument, 0, 'n'}, {"rounds", required_argument, 0, 'r'},
      {"tokens", required_argument, 0, 't'}, {"layers", required_argument, 0, 'L'},
      {"kv-heads", required_argument, 0, 'H'}, {"head-dim", required_argument, 0, 'D'},
      {"seed", required_argument, 0, 'S'}, {"prefix", required_argument, 0, 'p'},
      {"pause-ms", required_argument, 0, 'P'}, {"reconnect-timeout-ms", required_argument, 0, 'R'},
      {"keep", no_argument, 0, 'k'}, {"quiet", no_argument, 0, 'q'}, {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 's': o.socket = optarg; break;
      case 'a': o.attach = optarg; break;
      case 'n': o.sessions = atoi(optarg); break;
      case 'r': o.rounds = atoi(optarg); break;
      case 't': o.tokens = atoi(optarg); break;
      case 'L': o.layers = (uint32_t)atoi(optarg); break;
      case 'H': o.heads = (uint32_t)atoi(optarg); break;
      case 'D': o.dim = (uint32_t)atoi(optarg); break;
      case 'S': o.seed = strtoull(optarg, NULL, 0); break;
      case 'p': o.prefix = optarg; break;
      case 'P': o.pause_ms = atoi(optarg); break;
      case 'R': o.reconnect_ms = atoi(optarg); break;
      case 'k': o.keep = 1; break;
      case 'q': o.quiet = 1; break;
      default: fprintf(stderr, "commitkv-worker: see the comment at the top of examples/worker.c\n"); return 2;
    }
  }
  if (o.sessions < 1 || o.sessions > WORKER_MAX_SESSIONS || o.rounds < 1 || o.tokens < 1 || o.reconnect_ms < 0) {
    fprintf(stderr, "commitkv-worker: bad --sessions/--rounds/--tokens/--reconnect-timeout-ms\n");
    return 2;
  }
  w.o = o;
  ckv_client_options co = {.socket = o.socket, .attach_socket = o.attach, .name = o.prefix, .heartbeat = true};
  /* a daemon starting (or restarting) as the worker starts is waited for, as on a reconnect */
  int r = reconnect_first_connect(&co, &w.c, reconnect_now_ms() + o.reconnect_ms);
  if (r < 0) {
    fprintf(stderr, "commitkv-worker: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
    return 1;
  }
  if (strcmp(ckv_client_memory_kind(w.c), "host") != 0) {
    /* This worker reads and writes K/V with the CPU; commitkv-gpu-worker is the GPU one. */
    fprintf(stderr, "commitkv-worker: the daemon's KV memory is '%s', which the CPU cannot address: run "
                    "commitkvd --backend host, or use commitkv-gpu-worker\n", ckv_client_memory_kind(w.c));
    ckv_client_free(w.c);
    return 1;
  }
  w.g = (ckv_geometry){o.layers, o.heads, o.dim, CKV_DTYPE_FP16};
  /* A daemon that restarts (or refuses for a while) between the connect and
   * these opens is waited for as on any later request (issue 40 N11). */
  long long open_deadline = reconnect_now_ms() + o.reconnect_ms;
  for (int i = 0; i < o.sessions; i++) {
    snprintf(w.ss[i].id, sizeof(w.ss[i].id), "%s-%d", o.prefix, i);
    r = ckv_session_open(w.c, w.ss[i].id, &w.g, NULL, &w.ss[i].s);
    while (r < 0) {
      w.ss[i].s = NULL;
      bool transient = reconnect_transient(r);
      if (!(transient || reconnect_daemon_gone(w.c, NULL, r)) || reconnect_now_ms() >= open_deadline) {
        fprintf(stderr, "commitkv-worker: open %s: %s: %s\n", w.ss[i].id, ckv_strerror(r), ckv_client_last_error(w.c));
        return 1;
      }
      if (transient) reconnect_pause(open_deadline);
      else if ((r = reconnect_client(w.c, open_deadline)) < 0)
        continue; /* the deadline passed: said above on the next turn */
      /* the open may have taken effect before the daemon went: resumed when empty, else opened afresh */
      bool fresh = false, stale = false;
      r = reconnect_session(w.c, &w.ss[i].s, w.ss[i].id, &w.g, NULL, 0, true, &fresh, &stale);
    }
  }
  size_t elems = (size_t)o.heads * o.dim;
  w.k = malloc(elems * 2);
  w.v = malloc(elems * 2);
  if (!w.k || !w.v) return 1;
  int rounds_done = 0;
  for (int round = 1; round <= o.rounds; round++) {
    for (int i = 0; i < o.sessions; i++) {
      for (;;) {
        const char *what = "";
        bool report_lost = false;
        long long t0 = reconnect_now_ms();
        r = session_round(&w, i, round, &what, &report_lost);
        if (r == CKV_OK) break;
        if (!o.reconnect_ms || !reconnect_daemon_gone(w.c, w.ss[i].s, r)) {
          fprintf(stderr, "commitkv-worker: %s: %s: %s: %s\n", w.ss[i].id, what, ckv_strerror(r),
                  ckv_client_last_error(w.c));
          return 1;
        }
        if (recover(&w, i, report_lost, r, what, t0) < 0) return 1;
      }
    }
    rounds_done = round;
    if (!o.quiet) {
      printf("%s: round %d/%d, %" PRIu64 " tokens per session, %" PRIu64 " token reads verified, %ld bad bytes\n",
             o.prefix, round, o.rounds, w.ss[0].tokens, w.checked_total, w.bad_total);
      fflush(stdout);
    }
  }
  for (int i = 0; i < o.sessions; i++) {
    if (o.keep)
      ckv_session_close(w.ss[i].s);
    else
      ckv_session_drop(w.ss[i].s);
  }
  free(w.k);
  free(w.v);
  free(w.attn);
  ckv_client_free(w.c);
  printf("%s: %s: %d/%d rounds, %" PRIu64 " token reads verified, %ld mismatching elements, %d reconnects\n",
         o.prefix, w.bad_total ? "FAILED" : "OK", rounds_done, o.rounds, w.checked_total, w.bad_total, w.reconnects);
  return w.bad_total ? 1 : 0;
}
