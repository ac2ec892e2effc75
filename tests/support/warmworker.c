/* warmworker.c - a kill -9 test's worker: its session and its private copy
 * of every K/V element it wrote (warmworker.h). */
#include "warmworker.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "client/rpc.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "shm/arena.h"

uint16_t *ckv_warm_worker_at(ckv_warm_worker *w, size_t pos, uint32_t layer, uint32_t kv) {
  return w->copy + (((pos * CKV_WARM_LAYERS + layer) * 2u + kv) * CKV_WARM_ELEMS);
}

void ckv_warm_worker_open(ckv_client *c, ckv_warm_worker *w, const char *id, const char *policy) {
  memset(w, 0, sizeof *w);
  snprintf(w->id, sizeof w->id, "%s", id);
  w->policy = policy;
  w->copy = calloc((size_t)CKV_WARM_MAX_TOKENS * CKV_WARM_LAYERS * 2u * CKV_WARM_ELEMS, sizeof(uint16_t));
  cr_assert_not_null(w->copy);
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds"};
  const double values[] = {4, 16, 2, 6};
  bool moves = strcmp(policy, "commitkv") == 0;
  ckv_session_options so = {.policy = policy,
                            .param_names = moves ? names : NULL,
                            .param_values = moves ? values : NULL,
                            .n_params = moves ? 4 : 0,
                            .model_id = "stories260K",
                            .model_revision = "r1"};
  int r = ckv_session_open(c, id, &ckv_warm_geom, &so, &w->s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
}

/* One round: CKV_WARM_PER_ROUND tokens appended and written (the private copy
 * keeps them); unless half, reported and acked. */
void ckv_warm_worker_round(ckv_client *c, ckv_warm_worker *w, bool half) {
  cr_assert_leq(w->n + CKV_WARM_PER_ROUND, CKV_WARM_MAX_TOKENS);
  float sem[CKV_WARM_PER_ROUND];
  for (uint32_t i = 0; i < CKV_WARM_PER_ROUND; i++)
    sem[i] = (w->n + i) % 8 == 1 ? 0.9f : (w->n + i) % 3 == 0 ? 0.2f : 0.5f;
  uint64_t first = 0;
  int r = ckv_session_append(w->s, CKV_WARM_PER_ROUND, NULL, NULL, sem, NULL, &first);
  cr_assert_eq(r, CKV_OK, "append %s: %s (%s)", w->id, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(first, w->n, "append %s: first position %llu, the worker has %zu", w->id, (unsigned long long)first,
               w->n);
  w->salt++;
  for (size_t pos = w->n; pos < w->n + CKV_WARM_PER_ROUND; pos++)
    for (uint32_t layer = 0; layer < CKV_WARM_LAYERS; layer++) {
      uint16_t *k = ckv_warm_worker_at(w, pos, layer, 0), *v = ckv_warm_worker_at(w, pos, layer, 1);
      for (uint32_t e = 0; e < CKV_WARM_ELEMS; e++) {
        size_t tag = pos + 1000u * (uint32_t)w->id[0] + 7919u * (uint32_t)w->id[1] + 104729u * w->salt;
        k[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 0, e));
        v[e] = ckv_f32_to_f16(ckv_test_kv_value(tag, layer, 1, e));
      }
      cr_assert_eq(ckv_session_write_kv(w->s, pos, layer, k, v), CKV_OK);
    }
  w->n += CKV_WARM_PER_ROUND;
  if (half) return;
  float *attn = malloc(w->n * sizeof(float));
  cr_assert_not_null(attn);
  for (size_t pos = 0; pos < w->n; pos++)
    attn[pos] = pos % 8 == 1                       ? 4.f
                : pos + CKV_WARM_PER_ROUND >= w->n ? 1.f
                : (pos % 3 == 0 && w->round > 6)   ? 0.f
                                                   : 0.3f;
  ckv_round_result rr;
  r = ckv_session_report(w->s, ++w->round, 0, attn, w->n, &rr);
  free(attn);
  cr_assert_eq(r, CKV_OK, "report %s round %u: %s (%s)", w->id, w->round, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_session_ack(w->s, rr.epoch, NULL), CKV_OK);
}

void ckv_warm_worker_compare(const ckv_view *v, ckv_warm_worker *w, size_t t, const uint8_t *written,
                             bool draft_only, const char *when) {
  uint8_t *seen = calloc(t ? t : 1, 1);
  cr_assert_not_null(seen);
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *b = &v->draft[i];
    const uint32_t *pos = ckv_block_positions_const(b->data);
    for (uint32_t slot = 0; slot < b->capacity; slot++) {
      if (!ckv_block_slot_valid(b->data, slot)) continue;
      uint32_t p = pos[slot];
      cr_assert_lt(p, t, "%s: %s: a draft slot holds position %u of %zu", when, w->id, p, t);
      cr_assert_not(seen[p], "%s: %s: position %u in two slots", when, w->id, p);
      seen[p] = 1;
      if (written && !written[p]) continue; /* appended without the reply reaching the worker: never written */
      for (uint32_t layer = 0; layer < CKV_WARM_LAYERS; layer++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          const uint8_t *at =
              (const uint8_t *)b->data + ckv_draft_kv_offset(&ckv_warm_geom, b->capacity, layer, kv, slot);
          cr_assert_eq(memcmp(at, ckv_warm_worker_at(w, p, layer, kv), CKV_WARM_ELEMS * sizeof(uint16_t)), 0,
                       "%s: %s: position %u layer %u %s differs from what the worker wrote", when, w->id, p, layer,
                       kv ? "V" : "K");
        }
    }
  }
  if (draft_only)
    for (size_t p = 0; p < t; p++) cr_assert(seen[p], "%s: %s: position %zu is in no slot", when, w->id, p);
  free(seen);
}

/* The session's view after a resume: every draft slot holds a position
 * below its token count, at most once, with exactly the bytes the worker
 * wrote there (so no other session's or no older write's); with draft_only,
 * every position below the count is in a draft slot.  Returns the count. */
size_t ckv_warm_worker_verify(ckv_client *c, ckv_warm_worker *w, bool draft_only, const char *when) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(w->s, &v);
  cr_assert_eq(r, CKV_OK, "%s: view of %s: %s (%s)", when, w->id, ckv_strerror(r), ckv_client_last_error(c));
  size_t t = ckv_session_tokens(w->s);
  cr_assert_eq(v->n_tokens, t, "%s: %s: the view has %llu tokens, the session %zu", when, w->id,
               (unsigned long long)v->n_tokens, t);
  cr_assert_leq(t, w->n, "%s: %s came back with %zu tokens, the worker wrote %zu", when, w->id, t, w->n);
  cr_assert_eq(t % CKV_WARM_PER_ROUND, 0, "%s: %s came back with %zu tokens: not a whole append", when, w->id, t);
  if (draft_only)
    cr_assert_eq(v->n_staged + v->n_committed + v->n_cold, 0, "%s: %s (%s) has compressed blocks", when, w->id,
                 w->policy);
  ckv_warm_worker_compare(v, w, t, NULL, draft_only, when);
  return t;
}

/* After a restart: the worker resumes w; CKV_OK with the session's count
 * checked (kw_verify) and the worker's books set to it, else the code and
 * the daemon's text in msg. */
int ckv_warm_worker_resume(ckv_client *c, ckv_warm_worker *w, char *msg, size_t msglen, size_t *ret_tokens,
                           const char *when) {
  int r;
  ckv_session_close(w->s);
  w->s = ckv_warm_resume(c, w->id, &r, msg, msglen);
  if (r != CKV_OK) return r;
  size_t t = ckv_warm_worker_verify(c, w, strcmp(w->policy, "fp16") == 0, when);
  w->n = t;
  *ret_tokens = t;
  return CKV_OK;
}

void ckv_warm_worker_free(ckv_warm_worker *w) {
  ckv_session_close(w->s);
  free(w->copy);
  memset(w, 0, sizeof *w);
}
