/* daemon/metrics.c - Prometheus text for commitkvd and the HTTP thread that
 * serves it (see metrics.h for the threading contract).
 *
 * The formatter writes through open_memstream, family by family (Prometheus
 * wants every sample of a family together, after its HELP and TYPE lines).
 * The endpoint binds its own listening socket (so port 0 works and errors
 * name the address) and hands it to libmicrohttpd, whose internal polling
 * thread answers GET /metrics with a copy of the published text. */
#include "daemon/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"

#if MHD_VERSION < 0x00097002
typedef int ckv_mhd_result;
#else
typedef enum MHD_Result ckv_mhd_result;
#endif

#define METRICS_MAX_TENANTS 4096
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- error codes ------------------------------------------------------- */

#define ERR_VALUE_(name, value, text) value,
#define ERR_NAME_(name, value, text) #name,
static const int k_error_values[CKV_METRICS_ERRORS] = {CKV_STATUS_LIST(ERR_VALUE_)};
static const char *const k_error_names[CKV_METRICS_ERRORS] = {CKV_STATUS_LIST(ERR_NAME_)};
#undef ERR_VALUE_
#undef ERR_NAME_

int ckv_metrics_error_index(int status) {
  for (int i = 1; i < CKV_METRICS_ERRORS; i++)
    if (k_error_values[i] == status) return i;
  return 0;
}

const char *ckv_metrics_error_name(int index) {
  if (index < 0 || index >= CKV_METRICS_ERRORS) return NULL;
  return index == 0 ? "errno" : k_error_names[index];
}

/* ---- histograms -------------------------------------------------------- */

/* ReportRound is a hot-path request: the daemon should answer in tens of
 * microseconds to a few milliseconds; 1 s means something is badly wrong. */
static const double k_round_bounds[] = {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
                                        5e-3,  10e-3, 25e-3,  50e-3,  0.1,    0.25, 0.5, 1.0};
/* A compressor job quantizes a block or a run of tokens off the critical
 * path: sub-millisecond on a GPU, up to seconds on a busy host. */
static const double k_compress_bounds[] = {100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                                           50e-3,  0.1,    0.25,   0.5,  1.0,    2.5,  5.0,  10.0};
_Static_assert(sizeof(k_round_bounds) / sizeof(double) < CKV_METRICS_HIST_MAX_BUCKETS, "round buckets");
_Static_assert(sizeof(k_compress_bounds) / sizeof(double) < CKV_METRICS_HIST_MAX_BUCKETS, "compress buckets");

const double *ckv_metrics_hist_bounds(ckv_metrics_hist_kind kind, size_t *ret_n) {
  if (kind == CKV_METRICS_HIST_COMPRESS) {
    *ret_n = sizeof(k_compress_bounds) / sizeof(double);
    return k_compress_bounds;
  }
  *ret_n = sizeof(k_round_bounds) / sizeof(double);
  return k_round_bounds;
}

void ckv_metrics_histogram_add(ckv_metrics_histogram *h, ckv_metrics_hist_kind kind, double seconds) {
  if (!(seconds >= 0)) seconds = 0; /* NaN and negative clock steps */
  size_t n;
  const double *b = ckv_metrics_hist_bounds(kind, &n);
  size_t i = 0;
  while (i < n && seconds > b[i]) i++; /* le: a value equal to a bound falls in that bucket */
  h->buckets[i]++;
  h->count++;
  h->sum += seconds;
}

/* ---- the endpoint object ----------------------------------------------- */

typedef struct tenant_hist {
  char *name;
  ckv_metrics_histogram h[CKV_METRICS_HIST_KINDS];
} tenant_hist;

struct ckv_metrics {
  struct MHD_Daemon *httpd;
  unsigned port;
  /* Published text: front is what scrapes copy (under text_lock), back is
   * the publisher's scratch, swapped in under the lock. */
  pthread_mutex_t text_lock;
  char *front, *back;
  size_t front_len, back_len, front_cap, back_cap;
  /* Histograms (hist_lock). */
  pthread_mutex_t hist_lock;
  tenant_hist *tenants;
  size_t n_tenants, cap_tenants;
  ckv_metrics_histogram untenanted[CKV_METRICS_HIST_KINDS];
};

static void observe(ckv_metrics *m, ckv_metrics_hist_kind kind, const char *tenant, double seconds) {
  if (!m) return;
  pthread_mutex_lock(&m->hist_lock);
  ckv_metrics_histogram *h = &m->untenanted[kind];
  if (tenant) {
    size_t i = 0;
    while (i < m->n_tenants && strcmp(m->tenants[i].name, tenant) != 0) i++;
    if (i == m->n_tenants && m->n_tenants < METRICS_MAX_TENANTS) {
      if (m->n_tenants == m->cap_tenants) {
        size_t ncap = m->cap_tenants ? 2 * m->cap_tenants : 8;
        tenant_hist *nt = realloc(m->tenants, ncap * sizeof(*nt));
        if (nt) {
          m->tenants = nt;
          m->cap_tenants = ncap;
        }
      }
      char *name = m->n_tenants < m->cap_tenants ? strdup(tenant) : NULL;
      if (name) m->tenants[m->n_tenants++] = (tenant_hist){.name = name};
    }
    if (i < m->n_tenants) h = &m->tenants[i].h[kind];
  }
  ckv_metrics_histogram_add(h, kind, seconds);
  pthread_mutex_unlock(&m->hist_lock);
}

void ckv_metrics_observe_round(ckv_metrics *m, double seconds) {
  observe(m, CKV_METRICS_HIST_ROUND, NULL, seconds);
}
void ckv_metrics_observe_round_tenant(ckv_metrics *m, const char *tenant, double seconds) {
  observe(m, CKV_METRICS_HIST_ROUND, tenant, seconds);
}
void ckv_metrics_observe_compress(ckv_metrics *m, double seconds) {
  observe(m, CKV_METRICS_HIST_COMPRESS, NULL, seconds);
}
void ckv_metrics_observe_compress_tenant(ckv_metrics *m, const char *tenant, double seconds) {
  observe(m, CKV_METRICS_HIST_COMPRESS, tenant, seconds);
}

void ckv_metrics_fill_histograms(ckv_metrics *m, ckv_metrics_snapshot *snap) {
  if (!m || !snap) return;
  pthread_mutex_lock(&m->hist_lock);
  for (size_t i = 0; i < snap->n_tenants; i++) {
    ckv_metrics_tenant *t = &snap->tenants[i];
    memset(&t->round_latency, 0, sizeof(t->round_latency));
    memset(&t->compress_latency, 0, sizeof(t->compress_latency));
    for (size_t j = 0; t->name && j < m->n_tenants; j++) {
      if (strcmp(m->tenants[j].name, t->name) != 0) continue;
      t->round_latency = m->tenants[j].h[CKV_METRICS_HIST_ROUND];
      t->compress_latency = m->tenants[j].h[CKV_METRICS_HIST_COMPRESS];
      break;
    }
  }
  snap->round_latency_untenanted = m->untenanted[CKV_METRICS_HIST_ROUND];
  snap->compress_latency_untenanted = m->untenanted[CKV_METRICS_HIST_COMPRESS];
  pthread_mutex_unlock(&m->hist_lock);
}

/* ---- formatting -------------------------------------------------------- */

static const char *const k_state_names[CKV_METRICS_STATES] = {"draft", "staged", "committed", "recycled"};
static const char *const k_tier_names[CKV_METRICS_TIERS] = {"primary", "disk", "remote"};
static const char *const k_transition_names[CKV_METRICS_TRANSITIONS] = {"draft_staged", "staged_committed",
                                                                        "any_recycled"};

/* Label value escaping of the text format: backslash, double quote, newline. */
static void put_label(FILE *f, const char *v) {
  for (; v && *v; v++) {
    if (*v == '\\')
      fputs("\\\\", f);
    else if (*v == '"')
      fputs("\\\"", f);
    else if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

/* Doubles as Prometheus reads them: shortest round-trippable-enough text,
 * +Inf/-Inf/NaN spelled its way. */
static void put_double(FILE *f, double v) {
  if (isnan(v))
    fputs("NaN", f);
  else if (isinf(v))
    fputs(v > 0 ? "+Inf" : "-Inf", f);
  else
    fprintf(f, "%.15g", v);
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{tenant="T"[,k="v"]...} value: labels given as NULL-terminated pairs. */
static void sample_u64(FILE *f, const char *name, const char *const *labels, uint64_t v) {
  fputs(name, f);
  if (labels && labels[0]) {
    fputc('{', f);
    for (size_t i = 0; labels[i]; i += 2) {
      fprintf(f, "%s%s=\"", i ? "," : "", labels[i]);
      put_label(f, labels[i + 1]);
      fputc('"', f);
    }
    fputc('}', f);
  }
  fprintf(f, " %" PRIu64 "\n", v);
}

static void histogram(FILE *f, const char *name, ckv_metrics_hist_kind kind, const char *tenant,
                      const ckv_metrics_histogram *h) {
  size_t n;
  const double *b = ckv_metrics_hist_bounds(kind, &n);
  uint64_t cum = 0;
  for (size_t i = 0; i <= n; i++) {
    cum += h->buckets[i];
    fprintf(f, "%s_bucket{tenant=\"", name);
    put_label(f, tenant);
    fputs("\",le=\"", f);
    put_double(f, i < n ? b[i] : INFINITY);
    fprintf(f, "\"} %" PRIu64 "\n", cum);
  }
  fprintf(f, "%s_sum{tenant=\"", name);
  put_label(f, tenant);
  fputs("\"} ", f);
  put_double(f, h->sum);
  fprintf(f, "\n%s_count{tenant=\"", name);
  put_label(f, tenant);
  fprintf(f, "\"} %" PRIu64 "\n", h->count);
}

/* One gauge or counter per tenant, read from the tenant struct at `offset`. */
typedef struct tenant_family {
  const char *name, *type, *help;
  size_t offset;
} tenant_family;

#define TF_(field) offsetof(ckv_metrics_tenant, field)
static const tenant_family k_tenant_scalars[] = {
    {"commitkv_sessions", "gauge", "Open sessions of the tenant (attached or detached).", TF_(sessions)},
    {"commitkv_detached_sessions", "gauge", "Sessions whose worker is gone, kept for resume.",
     TF_(detached_sessions)},
    {"commitkv_clients", "gauge", "Attached clients (workers) of the tenant.", TF_(clients)},
    {"commitkv_fp16_equivalent_bytes", "gauge", "Bytes the tenant's live tokens would take as FP16.",
     TF_(fp16_equivalent_bytes)},
    {"commitkv_quota_bytes", "gauge", "Tenant quota across all tiers; 0 = bounded by the tiers only.",
     TF_(quota_bytes)},
    {"commitkv_disk_bytes", "gauge",
     "Bytes of the tenant's files in the state directory (snapshots, autosaves, disk-tier files).",
     TF_(disk_bytes)},
    {"commitkv_disk_snapshots", "gauge", "Snapshot files of the tenant in the state directory.",
     TF_(disk_snapshots)},
    {"commitkv_quota_disk_bytes", "gauge", "The tenant's quota_disk; 0 = no cap.", TF_(quota_disk_bytes)},
    {"commitkv_recycles_total", "counter", "Recycle decisions (a run of tokens recycled in one round counts once).",
     TF_(recycles_total)},
    {"commitkv_compress_pending_tokens", "gauge", "Tokens whose transition is decided but not yet compressed.",
     TF_(compress_pending_tokens)},
};
#undef TF_

int ckv_metrics_format(const ckv_metrics_snapshot *snap, char **ret_text, size_t *ret_len) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return -ENOMEM;
  const ckv_metrics_tenant *ts = snap->tenants;
  const size_t nt = snap->tenants ? snap->n_tenants : 0;

  /* Build and boot. */
  char token[2 * 64 + 1] = "";
  for (size_t i = 0; snap->boot_token && i < snap->boot_token_len && i < 64; i++)
    snprintf(token + 2 * i, 3, "%02x", snap->boot_token[i]);
  family(f, "commitkv_build_info", "gauge",
         "Always 1; labels: daemon version, backend, per-boot token (workers drop mappings when it changes).");
  sample_u64(f, "commitkv_build_info",
             (const char *const[]){"version", snap->version ? snap->version : "", "backend",
                                   snap->backend ? snap->backend : "", "boot_token", token, NULL},
             1);
  family(f, "commitkv_uptime_seconds", "gauge", "Seconds since the daemon started.");
  fputs("commitkv_uptime_seconds ", f);
  put_double(f, snap->uptime_seconds);
  fputc('\n', f);
  family(f, "commitkv_autosave_lag_seconds", "gauge",
         "Age of the oldest change of a live session that no autosave copy holds yet ([daemon] autosave; 0 when "
         "off or caught up): what a kill -9 now would lose at most.");
  fputs("commitkv_autosave_lag_seconds ", f);
  put_double(f, snap->autosave_lag_seconds);
  fputc('\n', f);

  /* Daemon-wide. */
  static const struct {
    const char *name, *type, *help;
    size_t offset;
  } k_daemon[] = {
#define DF_(field) offsetof(ckv_metrics_snapshot, field)
      {"commitkv_connected_clients", "gauge", "Connected clients, all tenants and admin tools.", DF_(clients)},
      {"commitkv_open_sessions", "gauge", "Open sessions, all tenants.", DF_(sessions)},
      {"commitkv_requests_total", "counter", "Requests answered.", DF_(requests_total)},
      {"commitkv_request_errors_total", "counter", "Requests answered with an error, all tenants and codes.",
       DF_(errors_total)},
      {"commitkv_rounds_total", "counter", "ReportRound requests handled.", DF_(rounds_total)},
      {"commitkv_leases_expired_total", "counter", "Clients dropped because their lease expired.",
       DF_(leases_expired_total)},
      {"commitkv_sessions_detached_total", "counter", "Sessions detached: their client went away or closed them.",
       DF_(sessions_detached_total)},
      {"commitkv_sessions_resumed_total", "counter", "Detached sessions a client opened again with resume.",
       DF_(sessions_resumed_total)},
      {"commitkv_sessions_expired_total", "counter",
       "Detached sessions freed after detach_keep without a resume (their KV is gone).",
       DF_(sessions_expired_total)},
      {"commitkv_warm_restart_sessions_kept", "gauge",
       "Sessions the warm restart at start kept on their blocks in the arenas systemd's fd store handed back.",
       DF_(warm_sessions_kept)},
      {"commitkv_warm_restart_sessions_dropped", "gauge",
       "Sessions the warm-restart journal named that could not be kept (the log says why).",
       DF_(warm_sessions_dropped)},
      {"commitkv_warm_journal_checkpoints_total", "counter",
       "Warm-journal batches made durable while serving, log appends and checkpoints ([daemon] warm_journal).",
       DF_(warm_checkpoints_total)},
      {"commitkv_warm_journal_entries_total", "counter", "Session records and entries those batches wrote.",
       DF_(warm_entries_total)},
      {"commitkv_warm_journal_errors_total", "counter",
       "Warm-journal batches not written (the log says why; the next one is a checkpoint).",
       DF_(warm_journal_errors_total)},
      {"commitkv_warm_journal_held_bytes", "gauge",
       "Bytes of freed blocks held until no durable warm-journal record names them (all tenants).",
       DF_(warm_held_bytes)},
      {"commitkv_autosaves_total", "counter", "Crash copies of live sessions written ([daemon] autosave).",
       DF_(autosaves_total)},
      {"commitkv_autosave_bytes_total", "counter", "Bytes of the autosaves written.", DF_(autosave_bytes_total)},
      {"commitkv_autosave_errors_total", "counter", "Autosaves not written (the log says why; the previous stays).",
       DF_(autosave_errors_total)},
      {"commitkv_disk_refused_saves_total", "counter",
       "SaveSessions refused by their tenant's quota_disk or max_snapshots (nothing written).",
       DF_(disk_refused_saves_total)},
      {"commitkv_disk_refused_autosaves_total", "counter",
       "Autosaves not written because of their tenant's quota_disk (the session stays in memory).",
       DF_(disk_refused_autosaves_total)},
      {"commitkv_disk_refused_offloads_total", "counter",
       "Moves to the disk tier not made because of their tenant's quota_disk (the session stays in memory).",
       DF_(disk_refused_offloads_total)},
      {"commitkv_autosave_resumes_total", "counter",
       "Sessions a resume brought back from their autosave (after a crash or kill of the daemon before).",
       DF_(autosave_resumes_total)},
      {"commitkv_attaches_total", "counter", "Accepted attaches on the attach socket.", DF_(attaches_total)},
      {"commitkv_attach_refused_total", "counter", "Attaches refused (unknown uid/gid, limits).",
       DF_(attach_refused_total)},
      {"commitkv_compress_queue_depth", "gauge", "Compressor jobs queued now.", DF_(compress_queue_depth)},
      {"commitkv_compress_jobs_total", "counter", "Compressor jobs completed.", DF_(compress_jobs_total)},
      {"commitkv_compress_refused_total", "counter", "Compressor jobs refused because the queue was full.",
       DF_(compress_refused_total)},
      {"commitkv_remote_saves_total", "counter", "Snapshots stored in the remote store (Redis/Valkey).",
       DF_(remote_saves_total)},
      {"commitkv_remote_save_bytes_total", "counter", "Bytes of snapshots stored in the remote store.",
       DF_(remote_save_bytes_total)},
      {"commitkv_remote_loads_total", "counter", "Snapshots read back from the remote store.", DF_(remote_loads_total)},
      {"commitkv_remote_load_bytes_total", "counter", "Bytes of snapshots read back from the remote store.",
       DF_(remote_load_bytes_total)},
      {"commitkv_remote_misses_total", "counter", "Lookups of a snapshot the remote store does not hold.",
       DF_(remote_misses_total)},
      {"commitkv_remote_errors_total", "counter",
       "Remote store calls that failed (unreachable, timed out, error reply).", DF_(remote_errors_total)},
#undef DF_
  };
  for (size_t i = 0; i < sizeof(k_daemon) / sizeof(k_daemon[0]); i++) {
    family(f, k_daemon[i].name, k_daemon[i].type, k_daemon[i].help);
    uint64_t v;
    memcpy(&v, (const char *)snap + k_daemon[i].offset, sizeof(v));
    sample_u64(f, k_daemon[i].name, NULL, v);
  }

  /* Per tenant, one family at a time. */
  for (size_t k = 0; k < sizeof(k_tenant_scalars) / sizeof(k_tenant_scalars[0]); k++) {
    family(f, k_tenant_scalars[k].name, k_tenant_scalars[k].type, k_tenant_scalars[k].help);
    for (size_t i = 0; i < nt; i++) {
      uint64_t v;
      memcpy(&v, (const char *)&ts[i] + k_tenant_scalars[k].offset, sizeof(v));
      sample_u64(f, k_tenant_scalars[k].name, (const char *const[]){"tenant", ts[i].name, NULL}, v);
    }
  }
  family(f, "commitkv_tokens", "gauge", "Tokens of live sessions by lifecycle state.");
  for (size_t i = 0; i < nt; i++)
    for (int s = 0; s < CKV_METRICS_STATES; s++)
      sample_u64(f, "commitkv_tokens", (const char *const[]){"tenant", ts[i].name, "state", k_state_names[s], NULL},
                 ts[i].tokens[s]);
  family(f, "commitkv_kv_bytes", "gauge", "Bytes of KV blocks by state and tier (scales and headers included).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      for (int s = 0; s < CKV_METRICS_BYTE_STATES; s++)
        sample_u64(f, "commitkv_kv_bytes",
                   (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], "state", k_state_names[s],
                                         NULL},
                   ts[i].bytes[t][s]);
  family(f, "commitkv_tier_bytes", "gauge", "Bytes the tenant's sessions take in a tier, all states.");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_bytes", (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL},
                 ts[i].tier_bytes[t]);
  family(f, "commitkv_arena_size_bytes", "gauge", "Size of the tenant's arena in a tier.");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_arena_size_bytes",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].arena_size_bytes[t]);
  family(f, "commitkv_arena_used_bytes", "gauge", "Bytes allocated in the tenant's arena in a tier.");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_arena_used_bytes",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].arena_used_bytes[t]);
  family(f, "commitkv_transitions_total", "counter", "Tokens moved between lifecycle states, by kind.");
  for (size_t i = 0; i < nt; i++)
    for (int k = 0; k < CKV_METRICS_TRANSITIONS; k++)
      sample_u64(f, "commitkv_transitions_total",
                 (const char *const[]){"tenant", ts[i].name, "kind", k_transition_names[k], NULL},
                 ts[i].transitions_total[k]);
  family(f, "commitkv_tier_hits_total", "counter",
         "Requests served from a tier (primary: Acquire/GetView of a resident session; disk: a session brought "
         "back).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_hits_total", (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL},
                 ts[i].hits_total[t]);
  family(f, "commitkv_tier_misses_total", "counter",
         "Requests that had to bring their session back into a tier (primary: from disk).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_misses_total",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].misses_total[t]);
  family(f, "commitkv_tier_hit_tokens_total", "counter",
         "Tokens served from a tier (primary: the tokens of each hit; disk: the tokens of each session brought back).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_hit_tokens_total",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].hit_tokens_total[t]);
  family(f, "commitkv_tier_miss_tokens_total", "counter",
         "Tokens a request found in a lower tier and had brought back (primary: from disk).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 0; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_miss_tokens_total",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].miss_tokens_total[t]);
  family(f, "commitkv_prefix_lookup_tokens_total", "counter",
         "Tokens whose shared prefix was looked up (LookupPrefix, OpenSession with reuse_prefix).");
  for (size_t i = 0; i < nt; i++)
    sample_u64(f, "commitkv_prefix_lookup_tokens_total", (const char *const[]){"tenant", ts[i].name, NULL},
               ts[i].prefix_lookup_tokens_total);
  family(f, "commitkv_prefix_hit_tokens_total", "counter",
         "Of the tokens looked up, those matched by shared blocks (no prefill needed).");
  for (size_t i = 0; i < nt; i++)
    sample_u64(f, "commitkv_prefix_hit_tokens_total", (const char *const[]){"tenant", ts[i].name, NULL},
               ts[i].prefix_hit_tokens_total);
  family(f, "commitkv_shared_bytes", "gauge", "Bytes of blocks shared by more than one session, each counted once.");
  for (size_t i = 0; i < nt; i++)
    sample_u64(f, "commitkv_shared_bytes", (const char *const[]){"tenant", ts[i].name, NULL}, ts[i].shared_bytes);
  family(f, "commitkv_tier_offloads_total", "counter", "Sessions moved down into a tier (idle past disk_idle).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 1; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_offloads_total",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].offloads_total[t]);
  family(f, "commitkv_tier_pressure_moves_total", "counter",
         "Sessions moved down into a tier because their tenant's quota was short (part of offloads).");
  for (size_t i = 0; i < nt; i++)
    for (int t = 1; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_pressure_moves_total",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL},
                 ts[i].pressure_moves_total[t]);
  family(f, "commitkv_tier_restores_total", "counter", "Sessions brought back out of a tier by a request.");
  for (size_t i = 0; i < nt; i++)
    for (int t = 1; t < CKV_METRICS_TIERS; t++)
      sample_u64(f, "commitkv_tier_restores_total",
                 (const char *const[]){"tenant", ts[i].name, "tier", k_tier_names[t], NULL}, ts[i].restores_total[t]);
  family(f, "commitkv_errors_total", "counter", "Error replies by status code (errno: a folded -errno).");
  for (size_t i = 0; i < nt; i++)
    for (int e = 0; e < CKV_METRICS_ERRORS; e++)
      sample_u64(f, "commitkv_errors_total",
                 (const char *const[]){"tenant", ts[i].name, "code", ckv_metrics_error_name(e), NULL},
                 ts[i].errors_total[e]);

  family(f, "commitkv_report_round_duration_seconds", "histogram",
         "Time the daemon took to handle one ReportRound (decode to reply).");
  for (size_t i = 0; i < nt; i++)
    histogram(f, "commitkv_report_round_duration_seconds", CKV_METRICS_HIST_ROUND, ts[i].name, &ts[i].round_latency);
  if (snap->round_latency_untenanted.count)
    histogram(f, "commitkv_report_round_duration_seconds", CKV_METRICS_HIST_ROUND, "",
              &snap->round_latency_untenanted);
  family(f, "commitkv_compress_job_duration_seconds", "histogram", "Time one compressor job took.");
  for (size_t i = 0; i < nt; i++)
    histogram(f, "commitkv_compress_job_duration_seconds", CKV_METRICS_HIST_COMPRESS, ts[i].name,
              &ts[i].compress_latency);
  if (snap->compress_latency_untenanted.count)
    histogram(f, "commitkv_compress_job_duration_seconds", CKV_METRICS_HIST_COMPRESS, "",
              &snap->compress_latency_untenanted);

  bool bad = ferror(f) != 0;
  if (fclose(f) != 0 || bad) {
    free(text);
    return -ENOMEM;
  }
  *ret_text = text;
  *ret_len = len;
  return CKV_OK;
}

/* ---- HTTP -------------------------------------------------------------- */

static ckv_mhd_result reply(struct MHD_Connection *conn, unsigned code, const char *type, const char *body,
                            size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  if (code == MHD_HTTP_SERVICE_UNAVAILABLE) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  ckv_mhd_result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

static ckv_mhd_result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
  ckv_metrics *m = cls;
  static const char k_text[] = "text/plain; charset=utf-8";
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    static const char msg[] = "only GET and HEAD\n";
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, k_text, msg, sizeof(msg) - 1);
  }
  if (strcmp(url, "/metrics") == 0) {
    /* Copy under the lock: MHD_RESPMEM_MUST_COPY duplicates the buffer
     * before the lock is released, so a publish can swap right after. */
    pthread_mutex_lock(&m->text_lock);
    ckv_mhd_result r;
    if (m->front && m->front_len) {
      r = reply(conn, MHD_HTTP_OK, CONTENT_TYPE, m->front, m->front_len);
    } else {
      /* Nothing published yet (the daemon is still starting): a 200 with an
       * empty body would record a target with no series. */
      static const char msg[] = "commitkvd is starting: no metrics published yet, retry in a second\n";
      r = reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, k_text, msg, sizeof(msg) - 1);
    }
    pthread_mutex_unlock(&m->text_lock);
    return r;
  }
  if (strcmp(url, "/") == 0) {
    static const char msg[] = "commitkvd: metrics at /metrics\n";
    return reply(conn, MHD_HTTP_OK, k_text, msg, sizeof(msg) - 1);
  }
  static const char msg[] = "not found: try /metrics\n";
  return reply(conn, MHD_HTTP_NOT_FOUND, k_text, msg, sizeof(msg) - 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  /* libmicrohttpd's messages end with a newline of their own. */
  char buf[512];
  vsnprintf(buf, sizeof(buf), fmt, ap);
  size_t n = strlen(buf);
  while (n && buf[n - 1] == '\n') buf[--n] = 0;
  ckv_log(CKV_LOG_WARNING, "metrics.http", NULL, NULL, "%s", buf);
}

/* "host:port", "[v6]:port" -> a listening TCP socket. */
static int listen_on(const char *spec, int *ret_fd, unsigned *ret_port, char *err, size_t errlen) {
  char host[256];
  const char *colon = strrchr(spec, ':');
  if (!colon || !colon[1]) {
    snprintf(err, errlen, "metrics address '%s': expected HOST:PORT", spec);
    return CKV_ERR_INVALID;
  }
  const char *h = spec;
  size_t hl = (size_t)(colon - spec);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl == 0 || hl >= sizeof(host)) {
    snprintf(err, errlen, "metrics address '%s': bad host", spec);
    return CKV_ERR_INVALID;
  }
  memcpy(host, h, hl);
  host[hl] = 0;
  char *end;
  unsigned long port = strtoul(colon + 1, &end, 10);
  if (*end || port > 65535) {
    snprintf(err, errlen, "metrics address '%s': bad port", spec);
    return CKV_ERR_INVALID;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
  int g = getaddrinfo(host, colon + 1, &hints, &res);
  if (g != 0) {
    snprintf(err, errlen, "metrics address '%s': %s", spec, gai_strerror(g));
    return CKV_ERR_INVALID;
  }
  int r = -EADDRNOTAVAIL;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      r = -errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof(ss);
      unsigned p = (unsigned)port;
      if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        if (ss.ss_family == AF_INET6) p = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
      }
      freeaddrinfo(res);
      *ret_fd = fd;
      *ret_port = p;
      return CKV_OK;
    }
    r = -errno;
    close(fd);
  }
  freeaddrinfo(res);
  snprintf(err, errlen, "metrics address '%s': cannot listen: %s", spec, strerror(-r));
  return r;
}

int ckv_metrics_new(const char *listen_spec, ckv_metrics **ret, char *err, size_t errlen) {
  char dummy[8];
  if (!err) {
    err = dummy;
    errlen = sizeof(dummy);
  }
  ckv_metrics *m = calloc(1, sizeof(*m));
  if (!m) return -ENOMEM;
  pthread_mutex_init(&m->text_lock, NULL);
  pthread_mutex_init(&m->hist_lock, NULL);
  if (listen_spec && *listen_spec) {
    int fd = -1;
    int r = listen_on(listen_spec, &fd, &m->port, err, errlen);
    if (r < 0) {
      ckv_metrics_free(m);
      return r;
    }
    /* epoll (MHD_USE_AUTO on Linux), not select: the daemon may hold more
     * than FD_SETSIZE descriptors.  Few connections, short timeouts: a
     * scraper or a person, never a crowd. */
    m->httpd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                                on_request, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET,
                                fd, MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                MHD_OPTION_END);
    if (!m->httpd) {
      close(fd);
      snprintf(err, errlen, "metrics endpoint %s: libmicrohttpd did not start", listen_spec);
      ckv_metrics_free(m);
      return CKV_ERR_INTERNAL;
    }
  }
  *ret = m;
  return CKV_OK;
}

ckv_metrics *ckv_metrics_free(ckv_metrics *m) {
  if (!m) return NULL;
  if (m->httpd) MHD_stop_daemon(m->httpd); /* joins the thread, closes the listening socket */
  free(m->front);
  free(m->back);
  for (size_t i = 0; i < m->n_tenants; i++) free(m->tenants[i].name);
  free(m->tenants);
  pthread_mutex_destroy(&m->text_lock);
  pthread_mutex_destroy(&m->hist_lock);
  free(m);
  return NULL;
}

bool ckv_metrics_enabled(const ckv_metrics *m) { return m && m->httpd; }

unsigned ckv_metrics_port(const ckv_metrics *m) { return m && m->httpd ? m->port : 0; }

int ckv_metrics_publish(ckv_metrics *m, const char *text, size_t len) {
  if (!m || !m->httpd) return CKV_OK;
  /* The back buffer belongs to the publisher: fill it without the lock. */
  if (len + 1 > m->back_cap) {
    size_t cap = len + 1 + len / 4;
    char *b = realloc(m->back, cap);
    if (!b) return -ENOMEM;
    m->back = b;
    m->back_cap = cap;
  }
  memcpy(m->back, text, len);
  m->back[len] = 0;
  m->back_len = len;
  pthread_mutex_lock(&m->text_lock);
  char *tb = m->front;
  size_t tl = m->front_len, tc = m->front_cap;
  m->front = m->back;
  m->front_len = m->back_len;
  m->front_cap = m->back_cap;
  m->back = tb;
  m->back_len = tl;
  m->back_cap = tc;
  pthread_mutex_unlock(&m->text_lock);
  return CKV_OK;
}
