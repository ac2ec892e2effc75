/* tests/fuzz/fuzz_arena.c - bytes a worker can write into its session's
 * mapped memory (DESIGN.md §4 inv. 8: nothing a worker can write is trusted).
 *
 * In process, as tests/unit/test_lifecycle.c builds it: one tenant (a real
 * host memfd arena), a synchronous compressor (compress_threads 0), and per
 * input a fresh session "victim".  The input is a program of operations:
 * append tokens (and write their K/V as a worker does), overwrite any bytes
 * of the victim's blocks - live or retired but not yet freed: headers,
 * positions, valid bitmaps, committed seals and channel masks, payload -
 * with bytes from the input, report a round with attention from the input
 * (the judge, the lifecycle's plan, the compressor's moves, publishing, each
 * failed job handed to ckv_moves_job_failed as the server does), ack,
 * escalate or reclaim under pressure.  After every operation the header
 * shadows are flushed, as after every request.
 *
 * The daemon must never crash (ASan/UBSan), never loop (libFuzzer's
 * -timeout), and never touch memory outside the victim's blocks.  ASan sees
 * the arena as one mapping, so a second session "canary" of the same tenant,
 * made once with a known pattern in its K/V, is compared byte for byte
 * after each input; the victim's blocks must stay inside the arena and
 * apart from the canary's; and once the victim is freed the tenant holds
 * exactly the canary's bytes again. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "store/compressor.h"
#include "daemon/config.h"
#include "lifecycle/judge.h"
#include "store/moves.h"
#include "common/log.h"
#include "store/session.h"
#include "store/tenant.h"
#include "kernels/format.h"
#include "kernels/quant.h"
#include "shm/arena.h"
#include "fuzz.h"

#define MAX_OPS 96
#define QUOTA (6u << 20)

static ckv_tenant *g_tenant;
static ckv_compressor *g_comp;
static ckv_srv_session *g_canary;
static uint8_t *g_canary_bytes; /* the canary's blocks, concatenated, as made */
static size_t g_canary_len;
static uint64_t g_canary_tenant_bytes;
static uint64_t g_next_block_id;
static ckv_judge_params g_defaults;

/* FP16 K/V for every new token, from the position, as a worker writes it. */
static void write_kv(ckv_srv_session *s, uint64_t first, uint32_t count, uint16_t salt) {
  const ckv_geometry *g = &s->geom;
  size_t elems = (size_t)g->n_kv_heads * g->head_dim;
  for (uint64_t pos = first; pos < first + count; pos++) {
    uint32_t blk = s->tokens.block[pos];
    uint8_t *base = ckv_srv_session_block_ptr(s, blk);
    uint32_t cap = s->blocks[blk].capacity;
    for (uint32_t layer = 0; layer < g->n_layers; layer++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        uint16_t *dst = (uint16_t *)(base + ckv_draft_kv_offset(g, cap, layer, kv, s->tokens.slot[pos]));
        for (size_t e = 0; e < elems; e++) {
          uint32_t z = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(e * 40503u) ^ (layer << 8) ^ kv ^ salt;
          dst[e] = ckv_f32_to_f16(((float)(z % 2001u) - 1000.f) / 1000.f);
        }
      }
  }
}

static int append(ckv_srv_session *s, uint32_t count, const uint8_t *roles, uint16_t salt) {
  size_t n_runs = 0;
  ckv_slot_run *runs = calloc(ckv_srv_session_max_runs(s, count), sizeof(*runs));
  CKV_FUZZ_CHECK(runs, "calloc");
  uint64_t first = 0;
  int r = ckv_srv_session_append(s, count, roles, NULL, NULL, NULL, runs, &n_runs, &first);
  if (r == CKV_OK) write_kv(s, first, count, salt);
  free(runs);
  return r;
}

/* Collects and publishes until the session has no job in flight, exactly as
 * ckv_store_collect_jobs does (failed jobs first go to
 * ckv_moves_job_failed). */
static void settle(ckv_srv_session *s) {
  for (;;) {
    ckv_compressor_drain_lane(g_comp, s->lane);
    ckv_job *j = ckv_compressor_collect(g_comp);
    if (!j) {
      if (!s->jobs_inflight) break;
      continue;
    }
    while (j) {
      ckv_job *next = j->next;
      CKV_FUZZ_CHECK(j->owner == s, "a job of another session");
      if (j->status < 0) (void)ckv_moves_job_failed(s, j->status);
      ckv_moves_publish(s, g_comp, j);
      j = next;
    }
  }
}

static void block_bytes_of(const ckv_srv_session *s, uint8_t *out) {
  for (size_t i = 0; i < s->n_blocks; i++) {
    const ckv_sblock *b = &s->blocks[i];
    if (b->format == CKV_BLOCK_UNUSED) continue;
    memcpy(out, ckv_srv_session_block_ptr(s, (uint32_t)i), b->bytes);
    out += b->bytes;
  }
}

int ckv_fuzz_arena_init(void) {
  if (g_tenant) return 0;
  ckv_log_init("fuzz_arena", CKV_LOG_TARGET_STDERR);
  ckv_log_set_level(getenv("CKV_FUZZ_VERBOSE") ? CKV_LOG_DEBUG : CKV_LOG_ERROR);
  ckv_config cfg;
  ckv_config_init_defaults(&cfg);
  char err[256];
  CKV_FUZZ_CHECK(ckv_config_finalize(&cfg, err, sizeof(err)) == 0, "config: %s", err);
  ckv_config_judge_params(&cfg.policy, &g_defaults);
  ckv_config_done(&cfg);
  CKV_FUZZ_CHECK(ckv_tenant_new("fuzz", QUOTA, ckv_tenant_arena_for_quota(QUOTA), 1, &ckv_arena_host_backend,
                                &g_tenant) == CKV_OK,
                 "tenant");
  CKV_FUZZ_CHECK(ckv_compressor_new(0, 64, &g_comp) == CKV_OK, "compressor");
  ckv_geometry g = {2, 2, 32, CKV_DTYPE_FP16};
  uint32_t dt = 16, ct = 64;
  CKV_FUZZ_CHECK(ckv_srv_session_check_geometry(&g, &dt, &ct) == CKV_OK, "geometry");
  CKV_FUZZ_CHECK(ckv_srv_session_new("canary", g_tenant, &g, dt, ct, "commitkv", &g_defaults, &g_next_block_id,
                                     &g_canary) == CKV_OK,
                 "canary session");
  g_canary->owner = 2;
  g_canary->lane = 2;
  CKV_FUZZ_CHECK(append(g_canary, 40, NULL, 0x5a5a) == CKV_OK, "canary append");
  CKV_FUZZ_CHECK(ckv_srv_session_flush_meta(g_canary) == CKV_OK, "canary flush");
  g_canary_len = ckv_srv_session_bytes(g_canary);
  g_canary_bytes = malloc(g_canary_len);
  CKV_FUZZ_CHECK(g_canary_bytes, "malloc");
  block_bytes_of(g_canary, g_canary_bytes);
  g_canary_tenant_bytes = g_tenant->bytes_used;
  return 0;
}

/* Every live or retired block of the victim lies inside the arena and apart
 * from every canary block. */
static void check_layout(const ckv_srv_session *s) {
  uint64_t arena = ckv_arena_size(g_tenant->arena);
  for (size_t i = 0; i < s->n_blocks + s->n_retired; i++) {
    uint64_t off, bytes;
    if (i < s->n_blocks) {
      if (s->blocks[i].format == CKV_BLOCK_UNUSED) continue;
      off = s->blocks[i].offset;
      bytes = s->blocks[i].bytes;
    } else {
      off = s->retired[i - s->n_blocks].offset;
      bytes = s->retired[i - s->n_blocks].bytes;
    }
    CKV_FUZZ_CHECK(off < arena && bytes <= arena - off, "block at %llu+%llu outside the %llu-byte arena",
                   (unsigned long long)off, (unsigned long long)bytes, (unsigned long long)arena);
    for (size_t k = 0; k < g_canary->n_blocks; k++) {
      const ckv_sblock *c = &g_canary->blocks[k];
      if (c->format == CKV_BLOCK_UNUSED) continue;
      CKV_FUZZ_CHECK(off + bytes <= c->offset || c->offset + c->bytes <= off,
                     "victim block %llu+%llu overlaps canary block %llu+%llu", (unsigned long long)off,
                     (unsigned long long)bytes, (unsigned long long)c->offset, (unsigned long long)c->bytes);
    }
  }
}

/* Where a scribble lands: block `pick` of the live and retired ones. */
static uint8_t *scribble_target(ckv_srv_session *s, uint8_t pick, uint64_t *ret_bytes, uint32_t *ret_capacity) {
  size_t n = 0;
  for (size_t i = 0; i < s->n_blocks; i++) n += s->blocks[i].format != CKV_BLOCK_UNUSED;
  n += s->n_retired;
  if (!n) return NULL;
  size_t want = pick % n;
  for (size_t i = 0; i < s->n_blocks; i++) {
    if (s->blocks[i].format == CKV_BLOCK_UNUSED) continue;
    if (want-- == 0) {
      *ret_bytes = s->blocks[i].bytes;
      *ret_capacity = s->blocks[i].capacity;
      return ckv_srv_session_block_ptr(s, (uint32_t)i);
    }
  }
  const ckv_retired *rt = &s->retired[want];
  *ret_bytes = rt->bytes;
  *ret_capacity = rt->format == CKV_FORMAT_DRAFT ? s->draft_tokens
                  : rt->format == CKV_FORMAT_STAGED ? s->staged_tokens : s->commit_tokens;
  return ckv_tenant_ptr(g_tenant, rt->offset);
}

static void scribble(ckv_srv_session *s, ckv_fuzz_in *in) {
  uint8_t pick = ckv_fuzz_u8(in), mode = ckv_fuzz_u8(in);
  uint32_t at = ckv_fuzz_u16(in);
  uint8_t len = ckv_fuzz_u8(in) % 65;
  const uint8_t *src;
  size_t n = ckv_fuzz_bytes(in, len, &src);
  uint64_t bytes = 0;
  uint32_t cap = 0;
  uint8_t *base = scribble_target(s, pick, &bytes, &cap);
  if (!base || !n) return;
  uint64_t head = ckv_block_payload_offset(cap), off;
  switch (mode % 3) {
    case 0: off = at % head; break;                                     /* header, positions, bitmap */
    case 1: off = head + at % (bytes - head < 512 ? bytes - head : 512); break; /* seal word, masks, scales */
    default: off = ((uint64_t)at * 131u) % bytes; break;                /* anywhere */
  }
  if (n > bytes - off) n = (size_t)(bytes - off);
  memcpy(base + off, src, n);
}

static void round_op(ckv_srv_session *s, ckv_fuzz_in *in, uint64_t *round, bool ack) {
  size_t n = s->tokens.n;
  float *attn = calloc(n ? n : 1, sizeof(float));
  CKV_FUZZ_CHECK(attn, "calloc");
  const uint8_t *a;
  size_t got = ckv_fuzz_bytes(in, n, &a);
  for (size_t i = 0; i < got; i++) attn[i] = (float)a[i] / 32.f;
  int r = ckv_srv_session_report_round(s, ++*round, 0, attn, n, NULL, NULL, 0);
  free(attn);
  CKV_FUZZ_CHECK(r == CKV_OK, "report_round %d", r);
  ckv_transition_list out = {0};
  r = ckv_moves_round(s, g_comp, (uint32_t)*round, &out);
  CKV_FUZZ_CHECK(r == CKV_OK || r == -ENOMEM || r == CKV_ERR_QUOTA || r == CKV_ERR_NOSPACE || r == CKV_ERR_BUSY,
                 "lifecycle_round %d", r);
  for (size_t i = 0; i < out.n; i++)
    CKV_FUZZ_CHECK(out.v[i].first + out.v[i].count <= s->tokens.n, "transition beyond the tokens");
  ckv_transition_list_done(&out);
  settle(s);
  if (ack) CKV_FUZZ_CHECK(ckv_srv_session_ack(s, s->epoch, NULL) == CKV_OK, "ack");
}

int ckv_fuzz_arena(const uint8_t *data, size_t size) {
  ckv_fuzz_arena_init();
  ckv_fuzz_in in = {data, size};
  static const int policies[] = {CKV_POLICY_COMMITKV, CKV_POLICY_INT8, CKV_POLICY_KIVI4, CKV_POLICY_KIVI2,
                                 CKV_POLICY_H2O, CKV_POLICY_STREAMING, CKV_POLICY_FP16};
  uint8_t b0 = ckv_fuzz_u8(&in), b1 = ckv_fuzz_u8(&in);
  ckv_judge_params p = g_defaults;
  p.policy = policies[b0 % 7];
  p.commit_bits = p.policy == CKV_POLICY_KIVI2 || (b0 & 0x80) ? 2 : 4;
  p.sink_tokens = b1 & 3;
  p.recent_window = (b1 >> 2) & 7; /* small: tokens reach the judge after a few appends */
  p.persistence_rounds = 1 + ((b1 >> 5) & 1);
  p.idle_rounds = 1 + ((b1 >> 6) & 3);
  p.prune_keep = (b0 & 0x40) ? 0.5f : 1.0f;
  ckv_geometry g = {1 + (b0 >> 3 & 1), 2, (b0 & 0x20) ? 64 : 32, (b0 & 0x10) ? CKV_DTYPE_BF16 : CKV_DTYPE_FP16};
  uint32_t dt = 16, ct = 64;
  CKV_FUZZ_CHECK(ckv_srv_session_check_geometry(&g, &dt, &ct) == CKV_OK, "geometry");
  ckv_srv_session *s = NULL;
  CKV_FUZZ_CHECK(ckv_srv_session_new("victim", g_tenant, &g, dt, ct, ckv_policy_names[p.policy], &p,
                                     &g_next_block_id, &s) == CKV_OK,
                 "session");
  s->owner = 1; /* an attached reader: retired blocks wait for its ack */
  s->lane = 1;
  uint64_t round = 0;
  for (int op = 0; op < MAX_OPS && in.n; op++) {
    uint8_t code = ckv_fuzz_u8(&in);
    bool refused = s->quarantined; /* appends, reports and pressure moves are refused then */
    switch (code % 7) {
      case 0:
        if (!refused) {
          uint32_t count = 1 + ckv_fuzz_u8(&in) % 48;
          uint8_t roles[48];
          for (uint32_t i = 0; i < count; i++) roles[i] = (uint8_t)((code >> 3) + i) % 5;
          (void)append(s, count, roles, code);
        }
        break;
      case 1:
      case 2: scribble(s, &in); break;
      case 3:
        if (!refused && s->tokens.n) round_op(s, &in, &round, code & 0x80);
        break;
      case 4: CKV_FUZZ_CHECK(ckv_srv_session_ack(s, code & 0x80 ? s->epoch : s->epoch - 1, NULL) == CKV_OK, "ack");
        break;
      case 5:
        if (!refused) {
          ckv_transition_list out = {0};
          (void)ckv_moves_escalate(s, g_comp, code & 0x80 ? CKV_STATE_STAGED : CKV_STATE_DRAFT, &out);
          ckv_transition_list_done(&out);
          settle(s);
        }
        break;
      default:
        if (!refused) {
          ckv_transition_list out = {0};
          uint64_t recycled = 0;
          (void)ckv_moves_reclaim(s, g_comp, (uint64_t)ckv_fuzz_u16(&in) << 6, &out, &recycled);
          ckv_transition_list_done(&out);
          settle(s);
        }
        break;
    }
    (void)ckv_srv_session_flush_meta(s);
    check_layout(s);
  }
  settle(s);
  s->owner = 0;
  (void)ckv_srv_session_release_retired(s);
  ckv_srv_session_free(s);
  CKV_FUZZ_CHECK(g_tenant->bytes_used == g_canary_tenant_bytes, "victim freed but the tenant holds %llu bytes, not %llu",
                 (unsigned long long)g_tenant->bytes_used, (unsigned long long)g_canary_tenant_bytes);
  uint8_t *now = malloc(g_canary_len);
  CKV_FUZZ_CHECK(now, "malloc");
  block_bytes_of(g_canary, now);
  CKV_FUZZ_CHECK(memcmp(now, g_canary_bytes, g_canary_len) == 0, "the canary session's blocks changed");
  free(now);
  return 0;
}
