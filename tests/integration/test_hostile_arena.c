/* test_hostile_arena.c - a worker that writes where it should not, in the
 * arena it maps read-write (DESIGN.md §4 inv. 8: nothing a worker can write is
 * trusted).  A real commitkvd, a real attacking client (libcommitkv, then raw
 * writes over the block headers, bitmaps, masks and seals it was handed) and
 * a real bystander client.  Each test checks that the daemon stays up, the
 * bystander is served, and the attacker's own session gets either its moves
 * done from the daemon's private records or one clear quarantine. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/commitkv.h"
#include "kernels/format.h"
#include "testcheck.h"
#include "testutil.h"

TestSuite(hostile_arena, .fini = ckv_test_leak_check);

typedef struct peer {
  ckv_client *c;
  ckv_session *s;
  ckv_geometry g;
  uint64_t round;
} peer;

/* memory: --memory; small enough that offsets from a forged capacity leave
 * the arena's mapping (which is how the old daemon crashed). */
static void start(ckv_test_daemon *d, const char *memory) { ckv_test_start_host(d, memory, NULL); }

static void peer_open(peer *p, const ckv_test_daemon *d, const char *id, ckv_geometry g, const char *policy,
                      const char *const *names, const double *values, size_t n_params) {
  memset(p, 0, sizeof(*p));
  p->g = g;
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = id, .heartbeat = true};
  cr_assert_eq(ckv_client_connect(&o, &p->c), CKV_OK, "%s: connect", id);
  /* 64-token committed blocks: the mask test below needs two chunks in one block */
  ckv_session_options so = {.policy = policy, .commit_block_tokens = 64, .param_names = names, .param_values = values,
                            .n_params = n_params};
  cr_assert_eq(ckv_session_open(p->c, id, &g, &so, &p->s), CKV_OK, "%s: open", id);
}

static void peer_done(peer *p) {
  if (p->s) (void)ckv_session_drop(p->s);
  ckv_client_free(p->c);
}

/* Appends n tokens and writes K/V for every layer (values from the position). */
static void append_tokens(peer *p, uint32_t n) {
  uint64_t first = 0;
  cr_assert_eq(ckv_session_append(p->s, n, NULL, NULL, NULL, NULL, &first), CKV_OK);
  size_t te = (size_t)p->g.n_kv_heads * p->g.head_dim;
  uint16_t *k = malloc(te * 2), *v = malloc(te * 2);
  cr_assert(k && v);
  for (uint64_t pos = first; pos < first + n; pos++)
    for (uint32_t l = 0; l < p->g.n_layers; l++) {
      for (size_t e = 0; e < te; e++) {
        k[e] = (uint16_t)(0x3000 + ((pos * 131 + l * 7 + e) % 0x800)); /* small positive halves */
        v[e] = (uint16_t)(0xb000 + ((pos * 17 + l * 3 + e) % 0x800));
      }
      cr_assert_eq(ckv_session_write_kv(p->s, pos, l, k, v), CKV_OK);
    }
  free(k);
  free(v);
}

/* One round with uniform attention over every token: the daemon's status. */
static int report_round(peer *p, ckv_round_result *ret) {
  uint64_t n = ckv_session_tokens(p->s);
  float *attn = malloc(n * sizeof(float));
  cr_assert_not_null(attn);
  for (uint64_t i = 0; i < n; i++) attn[i] = 1.0f / (float)n;
  ckv_round_result r = {0};
  int st = ckv_session_report(p->s, ++p->round, 0, attn, n, &r);
  free(attn);
  if (st == CKV_OK) (void)ckv_session_ack(p->s, r.epoch, NULL);
  if (ret) *ret = r;
  return st;
}

/* The bystander keeps being served: a round and an append answer OK. */
static void assert_bystander_served(peer *b, const ckv_test_daemon *d) {
  cr_assert(ckv_test_daemon_alive(d), "commitkvd died; its log:\n%s", ckv_test_file_tail(d->log, 3000));
  append_tokens(b, 4);
  cr_assert_eq(report_round(b, NULL), CKV_OK, "the bystander's round failed");
  const char *args[] = {"status", NULL};
  char *out = ckv_test_ctl(d, args);
  cr_assert_not_null(out, "commitkvctl status failed");
  free(out);
}

/* Counts the lines of the daemon's log that contain `needle`. */
static int log_count(const ckv_test_daemon *d, const char *needle) {
  char *text = ckv_test_read_file(d->log);
  int n = 0;
  for (const char *q = text; q && (q = strstr(q, needle)); q += strlen(needle)) n++;
  free(text);
  return n;
}

static const ckv_view *view_of(peer *p) {
  const ckv_view *v = NULL;
  cr_assert_eq(ckv_session_view(p->s, &v), CKV_OK);
  return v;
}

static const ckv_geometry big = {128, 8, 128, CKV_DTYPE_FP16};
static const ckv_geometry small = {4, 2, 64, CKV_DTYPE_FP16};

/* Issue 11 item 1, as found: 128 x 8 x 128, int8, 48 tokens, every draft
 * block's capacity set from 16 to 1024, then rounds.  Before: SIGSEGV in the
 * compressor (ckv_read_row reading capacity from the arena). */
Test(hostile_arena, capacity_overwrite_does_not_crash_the_daemon, .timeout = 120) {
  ckv_test_daemon d;
  start(&d, "256M");
  peer a, b;
  peer_open(&b, &d, "bystander", small, "int8", NULL, NULL, 0);
  peer_open(&a, &d, "attacker", big, "int8", NULL, NULL, 0);
  append_tokens(&a, 48);
  const ckv_view *v = view_of(&a);
  cr_assert_geq(v->n_draft, 3);
  for (size_t i = 0; i < v->n_draft; i++) {
    uint16_t bad = 1024;
    memcpy((uint8_t *)v->draft[i].data + 6, &bad, 2); /* ckv_block_header.capacity */
  }
  for (int r = 0; r < 6; r++) {
    cr_assert_eq(report_round(&a, NULL), CKV_OK, "round %d", r + 1);
    usleep(100000);
    cr_assert(ckv_test_daemon_alive(&d), "commitkvd died after round %d; its log:\n%s", r + 1,
              ckv_test_file_tail(d.log, 3000));
  }
  /* The moves ran from the daemon's own records: tokens past the window
   * (48 - 32 - 4 sinks at most) are staged, nothing quarantined. */
  const ckv_view *after = view_of(&a);
  cr_assert_geq(after->n_staged, 1, "no token was staged: the moves failed (log:\n%s)", ckv_test_file_tail(d.log, 2000));
  cr_assert_eq(log_count(&d, "quarantined"), 0, "%s", ckv_test_file_tail(d.log, 2000));
  assert_bystander_served(&b, &d);
  peer_done(&a);
  peer_done(&b);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

/* Random bytes over every header region (header, positions, bitmap) of the
 * attacker's blocks, several times, with rounds in between. */
/* The bystander's draft K/V as it wrote them (append_tokens' values). */
static void assert_bystander_intact(peer *b) {
  const ckv_view *v = view_of(b);
  size_t te = (size_t)b->g.n_kv_heads * b->g.head_dim;
  size_t checked = 0;
  for (size_t i = 0; i < v->n_draft; i++) {
    const uint8_t *blk = v->draft[i].data;
    const uint32_t *pos = (const uint32_t *)(blk + ckv_block_positions_offset());
    for (uint32_t slot = 0; slot < v->draft[i].capacity; slot++) {
      const uint64_t *bits = (const uint64_t *)(blk + ckv_block_bitmap_offset(v->draft[i].capacity));
      if (!((bits[slot / 64] >> (slot % 64)) & 1u)) continue;
      for (uint32_t l = 0; l < b->g.n_layers; l++) {
        const uint16_t *k = (const uint16_t *)(blk + ckv_draft_kv_offset(&b->g, v->draft[i].capacity, l, 0, slot));
        for (size_t e = 0; e < te; e++)
          cr_assert_eq(k[e], (uint16_t)(0x3000 + ((pos[slot] * 131ull + l * 7 + e) % 0x800)),
                       "the bystander's K of position %u layer %u changed", pos[slot], l);
      }
      checked++;
    }
  }
  cr_assert_gt(checked, 0, "no bystander token to check");
}

Test(hostile_arena, random_header_and_bitmap_bytes, .timeout = 120) {
  ckv_test_daemon d;
  start(&d, "160M");
  peer a, b;
  const ckv_geometry mid = {32, 8, 128, CKV_DTYPE_FP16}; /* 2 MiB draft blocks */
  peer_open(&b, &d, "bystander", small, "fp16", NULL, NULL, 0);
  append_tokens(&b, 40);
  peer_open(&a, &d, "attacker", mid, "kivi4", (const char *const[]){"recent_window", "sink_tokens"},
            (const double[]){8, 0}, 2);
  srand(11);
  for (int iter = 0; iter < 8; iter++) {
    append_tokens(&a, 40);
    const ckv_view *v = view_of(&a);
    const ckv_block_view *lists[3] = {v->draft, v->staged, v->committed};
    size_t counts[3] = {v->n_draft, v->n_staged, v->n_committed};
    /* Keep the magic and format (what a naive check looks at), forge the
     * rest: capacity, kept channels, positions, valid bits. */
    for (int k = 0; k < 3; k++)
      for (size_t i = 0; i < counts[k]; i++) {
        uint8_t *blk = (uint8_t *)lists[k][i].data;
        size_t head = ckv_block_payload_offset(lists[k][i].capacity);
        for (size_t j = 8; j < head; j++) blk[j] = (uint8_t)rand();
        uint16_t cap = (uint16_t)(1024 - 32 * (rand() % 4));
        memcpy(blk + 6, &cap, 2);
      }
    int st = report_round(&a, NULL);
    cr_assert(st == CKV_OK || st == CKV_ERR_CORRUPT, "round %d: %s", iter, ckv_strerror(st));
    usleep(50000);
    cr_assert(ckv_test_daemon_alive(&d), "commitkvd died after iteration %d; its log:\n%s", iter,
              ckv_test_file_tail(d.log, 3000));
    if (st == CKV_ERR_CORRUPT) break;
  }
  assert_bystander_intact(&b);
  assert_bystander_served(&b, &d);
  peer_done(&a);
  peer_done(&b);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

/* Issue 11 item 8: a corrupted magic made the move fail and the daemon retry
 * it forever (12 567 error lines in 10 idle seconds).  The daemon now never
 * looks at the arena's magic: the move succeeds, and nothing floods. */
Test(hostile_arena, corrupt_magic_neither_fails_nor_floods, .timeout = 120) {
  ckv_test_daemon d;
  start(&d, "256M");
  peer a;
  peer_open(&a, &d, "attacker", small, "int8", NULL, NULL, 0);
  append_tokens(&a, 64);
  const ckv_view *v = view_of(&a);
  for (size_t i = 0; i < v->n_draft; i++) memset((uint8_t *)v->draft[i].data, 0xee, 4);
  cr_assert_eq(report_round(&a, NULL), CKV_OK);
  sleep(3); /* idle: a retry loop would log thousands of lines by now */
  int failed = log_count(&d, "failed");
  cr_assert_leq(failed, 2, "%d 'failed' lines in 3 idle seconds:\n%s", failed, ckv_test_file_tail(d.log, 2000));
  cr_assert_geq(view_of(&a)->n_staged, 1, "nothing was staged");
  cr_assert(ckv_test_daemon_alive(&d));
  peer_done(&a);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}

/* A committed block's channel mask (payload bytes the worker can reach)
 * emptied for one head between two chunks: the next chunk's move fails on
 * it, the session is quarantined with one log line, its appends and reports
 * are refused with CKV_ERR_CORRUPT, the bystander is served, the drop works. */
Test(hostile_arena, corrupt_mask_quarantines_only_that_session, .timeout = 120) {
  ckv_test_daemon d;
  start(&d, "256M");
  peer a, b;
  peer_open(&b, &d, "bystander", small, "int8", NULL, NULL, 0);
  peer_open(&a, &d, "attacker", small, "kivi4", (const char *const[]){"recent_window", "sink_tokens"},
            (const double[]){0, 0}, 2);
  append_tokens(&a, 32);
  const ckv_view *v = NULL;
  for (int r = 0; r < 20; r++) {
    ckv_round_result rr;
    cr_assert_eq(report_round(&a, &rr), CKV_OK);
    v = view_of(&a);
    if (v->n_committed == 1 && rr.pending == 0) break;
    usleep(100000);
  }
  cr_assert_eq(v->n_committed, 1, "the first chunk was never committed");
  const ckv_block_view *cb = &v->committed[0];
  uint32_t fmt = cb->format, cap = cb->capacity;
  cr_assert_eq(cap, 64, "committed capacity %u", cap);
  uint64_t *mask = (uint64_t *)((uint8_t *)cb->data + ckv_commit_mask_offset(fmt, &small, cap, small.head_dim, 0, 0));
  cr_assert_neq(mask[0], 0, "the mask was never written");
  mask[0] = 0;
  append_tokens(&a, 32); /* the second chunk of the same committed block */
  int st = CKV_OK;
  for (int r = 0; r < 20 && st == CKV_OK; r++) {
    st = report_round(&a, NULL);
    usleep(100000);
  }
  cr_assert_eq(st, CKV_ERR_CORRUPT, "the session was never quarantined (last status %s); log:\n%s",
               ckv_strerror(st), ckv_test_file_tail(d.log, 2000));
  cr_assert(strstr(ckv_client_last_error(a.c), "quarantined"), "refusal text: %s", ckv_client_last_error(a.c));
  uint64_t first;
  cr_assert_eq(ckv_session_append(a.s, 1, NULL, NULL, NULL, NULL, &first), CKV_ERR_CORRUPT);
  cr_assert_eq(log_count(&d, "session-quarantined"), 1, "%s", ckv_test_file_tail(d.log, 2000));
  assert_bystander_served(&b, &d);
  cr_assert_eq(ckv_session_drop(a.s), CKV_OK);
  a.s = NULL;
  peer_done(&a);
  peer_done(&b);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0);
}
