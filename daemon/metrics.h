/* daemon/metrics.h - commitkvd's Prometheus endpoint and its exposition text.
 *
 * Two halves that never share daemon state:
 *
 *  - ckv_metrics_format() turns a plain snapshot (structs of numbers the
 *    server copies out of its tenants, sessions and counters, the same figures
 *    `commitkvctl stats` shows) into Prometheus text exposition format 0.0.4:
 *    `commitkv_*` families with HELP and TYPE lines, label values escaped.
 *    Pure function: unit tests feed it known numbers and check exact lines.
 *
 *  - ckv_metrics (ckv_metrics_new) owns a libmicrohttpd daemon with its own
 *    polling thread that serves GET /metrics from the last published text.
 *    The server thread formats a snapshot once per tick and hands the text to
 *    ckv_metrics_publish(), which copies it into a back buffer and swaps it
 *    with the front one under a mutex; the HTTP thread only ever copies the
 *    front buffer under that mutex.  A scrape therefore sees figures at most
 *    one tick old and never touches a session, a tenant or a lock of the loop.
 *
 * ckv_metrics also keeps the latency histograms (ReportRound handling time,
 * compression job time), because those are observed from more than one
 * thread (the loop and the compressor workers): ckv_metrics_observe_*() are
 * thread-safe, and ckv_metrics_fill_histograms() copies them into a snapshot
 * before it is formatted.
 *
 * Typical wiring in the server (see the report of issue 6):
 *     ckv_metrics_new(cfg.metrics, &s->metrics, err, errlen);      // start-up
 *     ckv_metrics_observe_round_tenant(s->metrics, t->name, sec);  // per round
 *     every tick: fill a ckv_metrics_snapshot, ckv_metrics_fill_histograms,
 *                 ckv_metrics_format, ckv_metrics_publish, free(text)
 *     s->metrics = ckv_metrics_free(s->metrics);                  // shutdown */
#ifndef CKV_DAEMON_METRICS_H
#define CKV_DAEMON_METRICS_H

#include "common/status_slots.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv/status.h"

typedef struct ckv_metrics ckv_metrics;

/* Token states, as in session.count_by_state[] (label state=). */
enum {
  CKV_METRICS_DRAFT = 0,
  CKV_METRICS_STAGED = 1,
  CKV_METRICS_COMMITTED = 2,
  CKV_METRICS_RECYCLED = 3, /* tokens only: recycled tokens hold no bytes */
  CKV_METRICS_STATES = 4,
  CKV_METRICS_BYTE_STATES = 3 /* draft, staged, committed */
};

/* Memory tiers (label tier=).  Only the primary tier (GPU memory, or host
 * memory on the host backend) exists today; host and disk offload tiers get
 * their own index when they land, and every per-tier array grows with them. */
enum { CKV_METRICS_TIER_PRIMARY = 0, CKV_METRICS_TIER_DISK = 1, CKV_METRICS_TIER_REMOTE = 2, CKV_METRICS_TIERS = 3 };

/* Transition kinds (label kind=): draft->staged, staged->committed, and
 * any state -> recycled. */
enum {
  CKV_METRICS_TR_DRAFT_STAGED = 0,
  CKV_METRICS_TR_STAGED_COMMITTED = 1,
  CKV_METRICS_TR_ANY_RECYCLED = 2,
  CKV_METRICS_TRANSITIONS = 3
};

/* Errors by code: one slot per ckv_status of commitkv/status.h in list
 * order.  CKV_OK is never an error, so its slot 0 counts every folded -errno
 * instead (label code="errno").  Index with ckv_metrics_error_index(). */
#define CKV_METRICS_ERRORS CKV_STATUS_SLOTS

/* The slot of a reply code in ckv_metrics_tenant.errors[]: our codes map to
 * their own slot, anything else (a folded -errno, an unknown code) to slot 0. */
int ckv_metrics_error_index(int status);
/* Label value of a slot: "CKV_ERR_QUOTA"..., "errno" for slot 0, NULL when
 * out of range. */
const char *ckv_metrics_error_name(int index);

/* Latency histograms: fixed bucket bounds per kind (seconds, see metrics.c),
 * counts per bucket NOT cumulative (the formatter accumulates), the last slot
 * counting observations above the largest bound (+Inf). */
typedef enum ckv_metrics_hist_kind {
  CKV_METRICS_HIST_ROUND = 0,    /* ReportRound: 25 us .. 1 s */
  CKV_METRICS_HIST_COMPRESS = 1, /* one compressor job: 100 us .. 10 s */
  CKV_METRICS_HIST_KINDS = 2
} ckv_metrics_hist_kind;
#define CKV_METRICS_HIST_MAX_BUCKETS 20

typedef struct ckv_metrics_histogram {
  uint64_t buckets[CKV_METRICS_HIST_MAX_BUCKETS]; /* per bucket, last used slot = +Inf */
  uint64_t count;
  double sum; /* seconds */
} ckv_metrics_histogram;

/* Bounds of a kind's buckets (without +Inf); *ret_n receives their number. */
const double *ckv_metrics_hist_bounds(ckv_metrics_hist_kind kind, size_t *ret_n);
/* Adds one observation to a plain histogram (not thread-safe: callers lock). */
void ckv_metrics_histogram_add(ckv_metrics_histogram *h, ckv_metrics_hist_kind kind, double seconds);

/* One tenant's figures.  Gauges are "now" (live sessions); *_total fields are
 * counters since the daemon started and must never go down (include sessions
 * that are gone, as ckv_counters.transitions does). */
typedef struct ckv_metrics_tenant {
  const char *name; /* label tenant=; escaped by the formatter */
  uint64_t sessions, detached_sessions, clients;
  uint64_t tokens[CKV_METRICS_STATES];                           /* stats tokens.{draft,...,recycled} */
  uint64_t bytes[CKV_METRICS_TIERS][CKV_METRICS_BYTE_STATES];    /* stats bytes.{draft,staged,committed} */
  uint64_t tier_bytes[CKV_METRICS_TIERS];                        /* stats bytes.total (headers included) */
  uint64_t fp16_equivalent_bytes;                                /* stats bytes.fp16_equivalent */
  uint64_t arena_size_bytes[CKV_METRICS_TIERS];                  /* stats arenas[].bytes_total */
  uint64_t arena_used_bytes[CKV_METRICS_TIERS];                  /* stats arenas[].bytes_used */
  uint64_t quota_bytes;                                          /* 0 = none of its own */
  uint64_t disk_bytes, disk_snapshots, quota_disk_bytes; /* its files in the state dir (persist/diskuse.h) */
  uint64_t transitions_total[CKV_METRICS_TRANSITIONS];           /* tokens moved, by kind */
  uint64_t recycles_total; /* recycle decisions: runs of tokens recycled in one round count once */
  /* Tier hits and misses.  The primary tier counts one hit for every
   * Acquire or GetView of a session that is resident, and one miss for every
   * session a request had to bring back from disk first (which is the disk
   * tier's hit). */
  uint64_t hits_total[CKV_METRICS_TIERS], misses_total[CKV_METRICS_TIERS];
  /* The same in tokens: the tokens each hit served, the tokens each miss brought back. */
  uint64_t hit_tokens_total[CKV_METRICS_TIERS], miss_tokens_total[CKV_METRICS_TIERS];
  /* Sessions moved down into a tier and brought back out of it (tier.h). */
  uint64_t offloads_total[CKV_METRICS_TIERS], restores_total[CKV_METRICS_TIERS];
  uint64_t pressure_moves_total[CKV_METRICS_TIERS]; /* of the offloads, those for a short quota */
  /* Shared prefixes (store/prefix.h): tokens asked for by LookupPrefix and
   * OpenSession reuse_prefix, the tokens of them matched, and the bytes of
   * blocks shared by more than one session now (each once). */
  uint64_t prefix_lookup_tokens_total, prefix_hit_tokens_total;
  uint64_t shared_bytes;
  uint64_t compress_pending_tokens;          /* transitions decided but not yet compressed */
  uint64_t errors_total[CKV_METRICS_ERRORS]; /* error replies by code (ckv_metrics_error_index) */
  ckv_metrics_histogram round_latency;       /* filled by ckv_metrics_fill_histograms */
  ckv_metrics_histogram compress_latency;    /* filled by ckv_metrics_fill_histograms */
} ckv_metrics_tenant;

/* Everything one scrape shows.  Strings are borrowed for the call. */
typedef struct ckv_metrics_snapshot {
  const char *version;       /* CKV_VERSION_STRING */
  const char *backend;       /* "host", "cuda" */
  const uint8_t *boot_token; /* per-boot token, shown in hex; may be NULL */
  size_t boot_token_len;
  double uptime_seconds;
  /* Daemon-wide (every tenant together, admin clients included). */
  uint64_t clients, sessions;
  uint64_t requests_total, errors_total, rounds_total, leases_expired_total;
  uint64_t sessions_detached_total, sessions_resumed_total, sessions_expired_total;
  uint64_t warm_sessions_kept, warm_sessions_dropped; /* by the warm restart at start (warm.h) */
  /* the continuous warm journal (persist/warmjournal.h) */
  uint64_t warm_checkpoints_total, warm_entries_total, warm_journal_errors_total, warm_held_bytes;
  uint64_t autosaves_total, autosave_bytes_total, autosave_errors_total, autosave_resumes_total; /* autosave.h */
  /* writes refused by a tenant's quota_disk / max_snapshots (persist/diskuse.h) */
  uint64_t disk_refused_saves_total, disk_refused_autosaves_total, disk_refused_offloads_total;
  double autosave_lag_seconds; /* the oldest change of a live session no autosave copy holds yet */
  uint64_t attaches_total, attach_refused_total;
  uint64_t compress_queue_depth; /* jobs queued now (stats compress_queue) */
  uint64_t compress_jobs_total, compress_refused_total;
  /* The remote store (remote.h); all 0 when none is configured. */
  uint64_t remote_saves_total, remote_save_bytes_total, remote_loads_total, remote_load_bytes_total;
  uint64_t remote_misses_total, remote_errors_total;
  ckv_metrics_tenant *tenants;
  size_t n_tenants;
  /* Observations made without a tenant (ckv_metrics_observe_round(),
   * ckv_metrics_observe_compress()); shown with tenant="" when any. */
  ckv_metrics_histogram round_latency_untenanted;
  ckv_metrics_histogram compress_latency_untenanted;
} ckv_metrics_snapshot;

/* Formats the exposition text of `snap` (every family, HELP and TYPE lines,
 * samples in tenant order).  On success *ret_text is a malloc'd,
 * NUL-terminated string the caller frees, *ret_len its length.  Returns
 * CKV_OK or -ENOMEM. */
int ckv_metrics_format(const ckv_metrics_snapshot *snap, char **ret_text, size_t *ret_len);

/* Starts the endpoint on `listen` ("HOST:PORT", "[V6ADDR]:PORT"; port 0
 * picks a free one, see ckv_metrics_port).  listen "" or NULL disables the
 * HTTP side: *ret is still a valid ckv_metrics (histograms work, publish is
 * a cheap no-op), so callers need no special case.  Returns CKV_OK,
 * CKV_ERR_INVALID (unparsable address; err says why), -errno from
 * socket/bind/listen (err names the address), -ENOMEM, or CKV_ERR_INTERNAL
 * when libmicrohttpd refuses to start.  err may be NULL. */
int ckv_metrics_new(const char *listen, ckv_metrics **ret, char *err, size_t errlen);

/* Stops the HTTP thread (waits for it) and frees everything.  Accepts NULL,
 * returns NULL. */
ckv_metrics *ckv_metrics_free(ckv_metrics *m);

/* Whether an HTTP endpoint runs (callers may skip formatting otherwise). */
bool ckv_metrics_enabled(const ckv_metrics *m);

/* The TCP port actually bound (useful with port 0); 0 when disabled. */
unsigned ckv_metrics_port(const ckv_metrics *m);

/* Makes `text` (len bytes, copied) what the next scrapes return.  Call from
 * one thread (the server loop).  Returns CKV_OK or -ENOMEM (the previous
 * text stays published). */
int ckv_metrics_publish(ckv_metrics *m, const char *text, size_t len);

/* Latency observations, thread-safe, any thread.  tenant NULL (or the calls
 * without _tenant) records under the untenanted histogram.  Tenant names are
 * copied; at most 4096 distinct tenants are tracked, later ones are counted
 * as untenanted. */
void ckv_metrics_observe_round(ckv_metrics *m, double seconds);
void ckv_metrics_observe_round_tenant(ckv_metrics *m, const char *tenant, double seconds);
void ckv_metrics_observe_compress(ckv_metrics *m, double seconds);
void ckv_metrics_observe_compress_tenant(ckv_metrics *m, const char *tenant, double seconds);

/* Copies the histograms into `snap`: each tenant's by name (zero when none
 * observed yet) and the untenanted ones. */
void ckv_metrics_fill_histograms(ckv_metrics *m, ckv_metrics_snapshot *snap);

#endif
