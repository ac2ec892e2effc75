/* tiercheck.c - see tiercheck.h. */
#include "tiercheck.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/status.h"
#include "kernels/quant.h"
#include "testcheck.h"

/* Tokens each round of ckv_test_session_with_rounds appends. */
#define PER_ROUND 24u

void ckv_test_write_tokens(ckv_session *s, const ckv_geometry *g, size_t from, size_t n) {
  size_t elems = (size_t)g->n_kv_heads * g->head_dim;
  uint16_t *k = malloc(elems * 2), *v = malloc(elems * 2);
  cr_assert(k && v);
  for (size_t pos = from; pos < from + n; pos++)
    for (uint32_t layer = 0; layer < g->n_layers; layer++) {
      for (size_t e = 0; e < elems; e++) {
        k[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 0, (uint32_t)e));
        v[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 1, (uint32_t)e));
      }
      cr_assert_eq(ckv_session_write_kv(s, pos, layer, k, v), CKV_OK);
    }
  free(k);
  free(v);
}

ckv_session *ckv_test_session_with_rounds(ckv_client *c, const char *id, const ckv_geometry *g,
                                          const ckv_session_options *base, uint32_t rounds) {
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds", "prune_keep"};
  const double values[] = {4, 16, 2, 6, 1};
  ckv_session_options so = *base;
  if (so.policy && strcmp(so.policy, "commitkv") == 0) {
    so.param_names = names;
    so.param_values = values;
    so.n_params = 5;
  }
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, g, &so, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  size_t n = 0;
  float *attn = malloc(PER_ROUND * (rounds + 1) * sizeof(float));
  cr_assert_not_null(attn);
  for (uint32_t round = 1; round <= rounds; round++) {
    float sem[PER_ROUND];
    for (uint32_t i = 0; i < PER_ROUND; i++) sem[i] = (n + i) % 8 == 1 ? 0.9f : (n + i) % 3 == 0 ? 0.2f : 0.5f;
    uint64_t first = 0;
    r = ckv_session_append(s, PER_ROUND, NULL, NULL, sem, NULL, &first);
    cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    ckv_test_write_tokens(s, g, n, PER_ROUND);
    n += PER_ROUND;
    for (size_t pos = 0; pos < n; pos++)
      attn[pos] = pos % 8 == 1 ? 4.f : pos + PER_ROUND >= n ? 1.f : (pos % 3 == 0 && round > 6) ? 0.f : 0.3f;
    ckv_round_result rr;
    r = ckv_session_report(s, round, 0, attn, n, &rr);
    cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_eq(ckv_session_ack(s, rr.epoch, NULL), CKV_OK);
  }
  free(attn);
  return s;
}

ckv_session *ckv_test_written_session(ckv_client *c, const char *id, const ckv_geometry *g, uint32_t n, int *ret_code,
                                      char *msg, size_t len) {
  ckv_session_options so = {.policy = "fp16"};
  ckv_session *s = NULL;
  uint64_t first;
  int r = ckv_session_open(c, id, g, &so, &s);
  if (r == CKV_OK) r = ckv_session_append(s, n, NULL, NULL, NULL, NULL, &first);
  if (r == CKV_OK) {
    ckv_test_write_tokens(s, g, 0, n);
    float *attn = calloc(n, sizeof(float));
    ckv_round_result rr;
    r = attn ? ckv_session_report(s, 1, 0, attn, n, &rr) : -ENOMEM;
    free(attn);
    if (r == CKV_OK) r = ckv_session_ack(s, rr.epoch, NULL);
  }
  *ret_code = r;
  if (r != CKV_OK) {
    snprintf(msg, len, "%s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
    if (s) ckv_session_close(s);
    return NULL;
  }
  return s;
}

unsigned long long ckv_test_arena_used(ckv_client *c, const char *name) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest g = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &g;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
  unsigned long long used = ~0ull;
  for (size_t i = 0; i < rep->stats->n_arenas; i++)
    if (strcmp(rep->stats->arenas[i]->tenant, name) == 0) used = rep->stats->arenas[i]->bytes_used;
  ckv_rpc_free(rep);
  cr_assert_neq(used, ~0ull, "no arena of tenant %s", name);
  return used;
}

Commitkv__V1__Response *ckv_test_list_sessions(ckv_client *c) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions l = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &l;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
  cr_assert_not_null(rep->session_list, "ListSessions answered without a session list");
  return rep;
}

char *ckv_test_session_tier(ckv_client *c, const char *sid, char *buf, size_t len) {
  Commitkv__V1__Response *rep = ckv_test_list_sessions(c);
  snprintf(buf, len, "?");
  for (size_t i = 0; i < rep->session_list->n_sessions; i++)
    if (strcmp(rep->session_list->sessions[i]->session_id, sid) == 0)
      snprintf(buf, len, "%s", rep->session_list->sessions[i]->tier);
  ckv_rpc_free(rep);
  return buf;
}

bool ckv_test_tier_file_exists(const ckv_test_daemon *d, const char *id) {
  char top[512];
  snprintf(top, sizeof top, "%s/tier", d->dir);
  DIR *dir = opendir(top);
  if (!dir) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(dir))) {
    if (e->d_name[0] == '.') continue;
    char path[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/%s.ckvsnap", top, e->d_name, id);
    found = stat(path, &st) == 0;
  }
  closedir(dir);
  return found;
}

unsigned long long ckv_test_wait_stat_at_least(const ckv_test_daemon *d, const char *path, unsigned long long want) {
  long long end = ckv_test_now_ms() + CKV_TEST_TIER_DEADLINE_MS;
  unsigned long long v;
  while ((v = ckv_test_stat(d, path)) < want) {
    cr_assert_lt(ckv_test_now_ms(), end, "stats %s stayed at %llu (want >= %llu); log: %s", path, v, want,
                 ckv_test_file_tail(d->log, 2000));
    usleep(20000);
  }
  return v;
}

void ckv_test_wait_tier(const ckv_test_daemon *d, ckv_client *c, const char *id, const char *want) {
  long long end = ckv_test_now_ms() + CKV_TEST_TIER_DEADLINE_MS;
  char tier[32];
  while (strcmp(ckv_test_session_tier(c, id, tier, sizeof tier), want) != 0) {
    cr_assert_lt(ckv_test_now_ms(), end, "session %s stayed '%s' (want '%s'); log: %s", id, tier, want,
                 ckv_test_file_tail(d->log, 2000));
    usleep(10000);
  }
}

void ckv_test_wait_settled(ckv_client *c) {
  long long end = ckv_test_now_ms() + CKV_TEST_TIER_DEADLINE_MS;
  for (;;) {
    Commitkv__V1__Response *rep = ckv_test_list_sessions(c);
    uint64_t pending = 0;
    for (size_t i = 0; i < rep->session_list->n_sessions; i++)
      pending += rep->session_list->sessions[i]->pending_tokens;
    ckv_rpc_free(rep);
    if (!pending) return;
    cr_assert_lt(ckv_test_now_ms(), end, "moves never finished");
    usleep(10000);
  }
}
