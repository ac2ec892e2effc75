/* worker.c - commitkv-worker: the minimal reference worker.
 *
 * Connects to commitkvd, opens --sessions sessions, and round after round
 * appends tokens, writes their K/V (a deterministic pattern of the seed,
 * session, position, layer and element) straight into the slots the daemon
 * handed out, reads every token back through the session's view and checks
 * every byte, reports a round of attention and acknowledges the epoch.
 * Exit status 0 means every byte read back was the byte written.
 *
 *   commitkv-worker [--socket EP] [--sessions N] [--rounds R] [--tokens T]
 *                   [--layers L] [--kv-heads H] [--head-dim D] [--seed S]
 *                   [--prefix NAME] [--pause-ms MS] [--keep] [--quiet] */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "kernels/format.h"

typedef struct opts {
  const char *socket, *attach, *prefix;
  int sessions, rounds, tokens, pause_ms;
  uint32_t layers, heads, dim;
  uint64_t seed;
  int keep, quiet;
} opts;

static uint16_t pattern(uint64_t seed, uint64_t sess, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t i) {
  uint64_t x = seed ^ (sess * 0x9e3779b97f4a7c15ull) ^ (pos << 20) ^ ((uint64_t)layer << 8) ^ ((uint64_t)kv << 7) ^
               ((uint64_t)i << 40);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint16_t)x;
}

/* Checks every valid slot of every draft block against the pattern. */
static long verify(ckv_session *s, const opts *o, uint64_t sess_idx, uint64_t *ret_checked) {
  const ckv_view *v;
  int r = ckv_session_view(s, &v);
  if (r < 0) return -1;
  const ckv_geometry *g = ckv_session_geometry(s);
  size_t elems = ckv_draft_token_elems(g);
  long bad = 0;
  uint64_t checked = 0;
  for (size_t b = 0; b < v->n_draft; b++) {
    const uint8_t *base = v->draft[b].data;
    const ckv_block_header *h = (const ckv_block_header *)base;
    if (h->magic != CKV_BLOCK_MAGIC || h->format != CKV_FORMAT_DRAFT) return -1;
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
  *ret_checked = checked;
  return bad;
}

int main(int argc, char **argv) {
  opts o = {.prefix = "worker", .sessions = 2, .rounds = 20, .tokens = 32, .layers = 4, .heads = 4, .dim = 64,
            .seed = 1};
  static const struct option lo[] = {
      {"socket", required_argument, 0, 's'}, {"attach-socket", required_argument, 0, 'a'},
      {"sessions", required_argument, 0, 'n'}, {"rounds", required_argument, 0, 'r'},
      {"tokens", required_argument, 0, 't'}, {"layers", required_argument, 0, 'L'},
      {"kv-heads", required_argument, 0, 'H'}, {"head-dim", required_argument, 0, 'D'},
      {"seed", required_argument, 0, 'S'}, {"prefix", required_argument, 0, 'p'},
      {"pause-ms", required_argument, 0, 'P'}, {"keep", no_argument, 0, 'k'},
      {"quiet", no_argument, 0, 'q'}, {0, 0, 0, 0}};
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
      case 'k': o.keep = 1; break;
      case 'q': o.quiet = 1; break;
      default: fprintf(stderr, "commitkv-worker: see the comment at the top of examples/worker.c\n"); return 2;
    }
  }
  if (o.sessions < 1 || o.sessions > 64 || o.rounds < 1 || o.tokens < 1) {
    fprintf(stderr, "commitkv-worker: bad --sessions/--rounds/--tokens\n");
    return 2;
  }
  ckv_client_options co = {.socket = o.socket, .attach_socket = o.attach, .name = o.prefix, .heartbeat = true};
  ckv_client *c;
  int r = ckv_client_connect(&co, &c);
  if (r < 0) {
    fprintf(stderr, "commitkv-worker: connect: %s: %s\n", ckv_strerror(r), ckv_client_connect_error());
    return 1;
  }
  if (strcmp(ckv_client_memory_kind(c), "host") != 0) {
    /* This worker reads and writes K/V with the CPU; commitkv-gpu-worker is the GPU one. */
    fprintf(stderr, "commitkv-worker: the daemon's KV memory is '%s', which the CPU cannot address: run "
                    "commitkvd --backend host, or use commitkv-gpu-worker\n", ckv_client_memory_kind(c));
    ckv_client_free(c);
    return 1;
  }
  ckv_geometry g = {o.layers, o.heads, o.dim, CKV_DTYPE_FP16};
  ckv_session *s[64];
  for (int i = 0; i < o.sessions; i++) {
    char id[160];
    snprintf(id, sizeof(id), "%s-%d", o.prefix, i);
    r = ckv_session_open(c, id, &g, NULL, &s[i]);
    if (r < 0) {
      fprintf(stderr, "commitkv-worker: open %s: %s: %s\n", id, ckv_strerror(r), ckv_client_last_error(c));
      return 1;
    }
  }
  size_t elems = (size_t)o.heads * o.dim;
  uint16_t *k = malloc(elems * 2), *v = malloc(elems * 2);
  float *attn = NULL;
  long bad_total = 0;
  uint64_t checked_total = 0;
  for (int round = 1; round <= o.rounds; round++) {
    for (int i = 0; i < o.sessions; i++) {
      uint64_t first;
      r = ckv_session_append(s[i], (uint32_t)o.tokens, NULL, NULL, NULL, NULL, &first);
      if (r < 0) {
        fprintf(stderr, "commitkv-worker: append: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
        return 1;
      }
      for (uint64_t p = first; p < first + (uint64_t)o.tokens; p++)
        for (uint32_t l = 0; l < o.layers; l++) {
          for (uint32_t e = 0; e < elems; e++) {
            k[e] = pattern(o.seed, (uint64_t)i, p, l, 0, e);
            v[e] = pattern(o.seed, (uint64_t)i, p, l, 1, e);
          }
          if (ckv_session_write_kv(s[i], p, l, k, v) < 0) {
            fprintf(stderr, "commitkv-worker: no slot for position %" PRIu64 "\n", p);
            return 1;
          }
        }
      if (o.pause_ms && round == o.rounds / 2 && i == 0) usleep((useconds_t)o.pause_ms * 1000u);
      uint64_t checked = 0;
      long bad = verify(s[i], &o, (uint64_t)i, &checked);
      if (bad < 0) {
        fprintf(stderr, "commitkv-worker: view: %s\n", ckv_client_last_error(c));
        return 1;
      }
      bad_total += bad;
      checked_total += checked;
      uint64_t n = ckv_session_tokens(s[i]);
      float *na = realloc(attn, n * sizeof(float));
      if (!na) return 1;
      attn = na;
      for (uint64_t p = 0; p < n; p++) attn[p] = 1.0f / (float)n;
      ckv_round_result rr;
      r = ckv_session_report(s[i], (uint64_t)round, 0, attn, n, &rr);
      if (r == 0) r = ckv_session_ack(s[i], rr.epoch, NULL);
      if (r < 0) {
        fprintf(stderr, "commitkv-worker: report: %s: %s\n", ckv_strerror(r), ckv_client_last_error(c));
        return 1;
      }
    }
    if (!o.quiet) {
      printf("%s: round %d/%d, %" PRIu64 " tokens per session, %" PRIu64 " token reads verified, %ld bad bytes\n",
             o.prefix, round, o.rounds, ckv_session_tokens(s[0]), checked_total, bad_total);
      fflush(stdout);
    }
  }
  for (int i = 0; i < o.sessions; i++) {
    if (o.keep)
      ckv_session_close(s[i]);
    else
      ckv_session_drop(s[i]);
  }
  free(k);
  free(v);
  free(attn);
  ckv_client_free(c);
  printf("%s: %s: %" PRIu64 " token reads verified, %ld mismatching elements\n", o.prefix,
         bad_total ? "FAILED" : "OK", checked_total, bad_total);
  return bad_total ? 1 : 0;
}
