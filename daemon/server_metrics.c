/* server_metrics.c - the server's figures as a Prometheus snapshot.
 *
 * Called from the loop about once a second: the same numbers `commitkvctl
 * stats --json` reports (ckv_srv_session_figures), per tenant, formatted by
 * metrics.c and handed to its HTTP thread, which never touches daemon state. */
#include "daemon/server_metrics.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/strmap.h"
#include "daemon/metrics.h"
#include "persist/diskuse.h"
#include "persist/remote.h"
#include "persist/tier.h"
#include "shm/arena.h"
#include "store/compressor.h"
#include "store/moves.h"
#include "store/session.h"
#include "store/shared.h"
#include "store/tenant.h"

void ckv_server_publish_metrics(ckv_server *s) {
  if (!ckv_metrics_enabled(s->metrics)) return;
  ckv_metrics_tenant *mt = calloc(s->store.n_tenants ? s->store.n_tenants : 1, sizeof(*mt));
  if (!mt) return;
  ckv_metrics_snapshot snap = {
      .version = CKV_VERSION_STRING,
      .backend = s->opt.backend,
      .boot_token = s->boot_token,
      .boot_token_len = sizeof(s->boot_token),
      .uptime_seconds = (double)(ckv_now_ms() - s->start_ms) / 1000.0,
      .clients = ckv_strmap_size(s->conns),
      .sessions = ckv_strmap_size(s->store.sessions),
      .requests_total = s->counters.requests,
      .errors_total = s->counters.errors,
      .rounds_total = s->counters.rounds,
      .leases_expired_total = s->counters.leases_expired,
      .sessions_detached_total = s->counters.sessions_detached,
      .sessions_resumed_total = s->counters.sessions_resumed,
      .sessions_expired_total = s->counters.sessions_expired,
      .warm_sessions_kept = s->persist.counters.warm_kept,
      .warm_sessions_dropped = s->persist.counters.warm_dropped,
      .warm_checkpoints_total = s->persist.counters.warm_checkpoints,
      .warm_entries_total = s->persist.counters.warm_entries,
      .warm_journal_errors_total = s->persist.counters.warm_journal_errors,
      .autosaves_total = s->persist.counters.autosaves,
      .autosave_bytes_total = s->persist.counters.autosave_bytes,
      .autosave_errors_total = s->persist.counters.autosave_errors,
      .disk_refused_saves_total = s->persist.counters.disk_refused_saves,
      .disk_refused_autosaves_total = s->persist.counters.disk_refused_autosaves,
      .disk_refused_offloads_total = s->persist.counters.disk_refused_offloads,
      .autosave_resumes_total = s->persist.counters.autosave_resumes,
      .autosave_lag_seconds = (double)s->persist.counters.autosave_lag_ms / 1e3,
      .attaches_total = s->counters.attaches,
      .attach_refused_total = s->counters.attach_refused,
      .tenants = mt,
      .n_tenants = s->store.n_tenants,
  };
  for (size_t i = 0; i < s->store.n_tenants; i++) snap.warm_held_bytes += s->store.tenants[i]->held_bytes;
  ckv_compressor_stats cs;
  ckv_compressor_get_stats(s->store.compressor, &cs);
  snap.compress_queue_depth = cs.queued;
  snap.compress_jobs_total = cs.completed;
  snap.compress_refused_total = cs.refused_busy;
  if (s->opt.remote) {
    ckv_remote_stats rs;
    ckv_remote_get_stats(s->opt.remote, &rs);
    snap.remote_saves_total = rs.saves;
    snap.remote_save_bytes_total = rs.save_bytes;
    snap.remote_loads_total = rs.loads;
    snap.remote_load_bytes_total = rs.load_bytes;
    snap.remote_misses_total = rs.misses;
    snap.remote_errors_total = rs.errors;
  }
  for (size_t i = 0; i < s->store.n_tenants; i++) {
    const ckv_tenant *t = s->store.tenants[i];
    ckv_metrics_tenant *m = &mt[i];
    m->name = t->name;
    m->sessions = t->n_sessions;
    m->clients = t->n_clients;
    m->quota_bytes = t->quota_bytes;
    ckv_diskuse_usage du;
    ckv_diskuse_usage_of(s->persist.diskuse, t->name, &du);
    m->disk_bytes = du.bytes;
    m->disk_snapshots = du.files[CKV_DISKUSE_SNAPSHOT];
    m->quota_disk_bytes = t->quota_disk;
    m->arena_size_bytes[0] = ckv_arena_size(t->arena);
    m->arena_used_bytes[0] = t->bytes_used;
    m->hits_total[0] = t->hits;
    m->hit_tokens_total[0] = t->hit_tokens;
    ckv_tier_stats d;
    ckv_tier_get_stats(&s->persist, t, &d);
    m->tier_bytes[CKV_METRICS_TIER_DISK] = d.disk_bytes;
    for (int k = 0; k < 3; k++) m->bytes[CKV_METRICS_TIER_DISK][k] = d.resident_bytes5[k];
    m->arena_size_bytes[CKV_METRICS_TIER_DISK] = d.capacity; /* disk_memory, shared by the tenants */
    m->arena_used_bytes[CKV_METRICS_TIER_DISK] = d.disk_bytes;
    m->misses_total[CKV_METRICS_TIER_PRIMARY] = d.restores + d.remote_restores;
    m->hits_total[CKV_METRICS_TIER_DISK] = d.restores;
    m->miss_tokens_total[CKV_METRICS_TIER_PRIMARY] = d.restore_tokens + d.remote_restore_tokens;
    m->hit_tokens_total[CKV_METRICS_TIER_DISK] = d.restore_tokens;
    m->offloads_total[CKV_METRICS_TIER_DISK] = d.offloads;
    m->restores_total[CKV_METRICS_TIER_DISK] = d.restores;
    m->tier_bytes[CKV_METRICS_TIER_REMOTE] = d.remote_bytes;
    for (int k = 0; k < 3; k++) m->bytes[CKV_METRICS_TIER_REMOTE][k] = d.remote_resident_bytes5[k];
    m->arena_used_bytes[CKV_METRICS_TIER_REMOTE] = d.remote_bytes;
    m->hits_total[CKV_METRICS_TIER_REMOTE] = d.remote_restores;
    m->hit_tokens_total[CKV_METRICS_TIER_REMOTE] = d.remote_restore_tokens;
    m->offloads_total[CKV_METRICS_TIER_REMOTE] = d.pushes;
    m->restores_total[CKV_METRICS_TIER_REMOTE] = d.remote_restores;
    m->pressure_moves_total[CKV_METRICS_TIER_DISK] = d.pressure_moves;
    m->recycles_total = t->recycle_runs;
    ckv_prefix_figures pf;
    ckv_prefix_tenant_figures(t, &pf);
    m->prefix_lookup_tokens_total = pf.lookup_tokens;
    m->prefix_hit_tokens_total = pf.hit_tokens;
    m->shared_bytes = pf.shared_bytes;
    memcpy(m->errors_total, t->errors, sizeof(m->errors_total));
    uint64_t gone[4][4];
    memcpy(gone, t->transitions_gone, sizeof(gone));
    m->transitions_total[CKV_METRICS_TR_DRAFT_STAGED] = gone[0][1];
    m->transitions_total[CKV_METRICS_TR_STAGED_COMMITTED] = gone[1][2];
    m->transitions_total[CKV_METRICS_TR_ANY_RECYCLED] = gone[0][3] + gone[1][3] + gone[2][3];
  }
  size_t cur = 0;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL))) {
    size_t i = 0;
    while (i < s->store.n_tenants && s->store.tenants[i] != sess->tenant) i++;
    if (i == s->store.n_tenants) continue;
    ckv_metrics_tenant *m = &mt[i];
    uint64_t tok[4] = {0}, bytes[5] = {0};
    ckv_srv_session_figures(sess, tok, bytes);
    for (int k = 0; k < 4; k++) m->tokens[k] += tok[k];
    for (int k = 0; k < 3; k++) m->bytes[0][k] += bytes[k];
    m->tier_bytes[0] += bytes[3];
    m->fp16_equivalent_bytes += bytes[4];
    m->detached_sessions += sess->owner == 0;
    m->compress_pending_tokens += ckv_moves_pending(sess);
    m->transitions_total[CKV_METRICS_TR_DRAFT_STAGED] += sess->transitions[0][1];
    m->transitions_total[CKV_METRICS_TR_STAGED_COMMITTED] += sess->transitions[1][2];
    m->transitions_total[CKV_METRICS_TR_ANY_RECYCLED] +=
        sess->transitions[0][3] + sess->transitions[1][3] + sess->transitions[2][3];
  }
  ckv_metrics_fill_histograms(s->metrics, &snap);
  char *text = NULL;
  size_t len = 0;
  if (ckv_metrics_format(&snap, &text, &len) == 0) ckv_metrics_publish(s->metrics, text, len);
  free(text);
  free(mt);
}
