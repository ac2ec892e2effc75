/* daemon/config_types.h - the configuration as plain data (types only):
 * ckv_config, its [policy] and [tenant.NAME] parts, the string sizes.  The
 * key table (config_table.c) points into these structs; config.h says how
 * they are filled, checked, reloaded and written. */
#ifndef CKV_DAEMON_CONFIG_TYPES_H
#define CKV_DAEMON_CONFIG_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/policy.h"

/* Sizes of the string fields (including the NUL). */
#define CKV_CONFIG_ENDPOINT_MAX 256 /* ZeroMQ endpoints, URLs, host:port */
#define CKV_CONFIG_PATH_MAX 512     /* file system paths */
#define CKV_CONFIG_KEY_MAX 48       /* Z85 CURVE keys are 40 characters */
#define CKV_TENANT_NAME_MAX 64      /* [a-z0-9_-]{1,63} + NUL */
#define CKV_TENANT_MAX_IDS 64       /* uids (or gids) per tenant */
#define CKV_CONFIG_MAX_TENANTS 1024 /* tenant sections per file */

/* Policies (ckv_policy_id, ckv_policy_names, ckv_policy_from_name) are the
 * lifecycle library's: lifecycle/policy.h. */

typedef enum ckv_backend_kind {
  CKV_BACKEND_AUTO = 0, /* CUDA when a device answers, host otherwise */
  CKV_BACKEND_HOST = 1, /* memfd arenas, CPU kernels */
  CKV_BACKEND_CUDA = 2, /* cudaMalloc arenas, CUDA kernels; fails without a GPU */
} ckv_backend_kind;

typedef enum ckv_judge_kind {
  CKV_JUDGE_RULES = 0, /* thresholds below */
  CKV_JUDGE_MLP = 1,   /* two-layer perceptron, weights from mlp_weights */
} ckv_judge_kind;

/* Parameters of the transition judge and of the baseline policies
 * ([policy] section; live-reloadable; OpenSession may override per session).
 * The judge's fields (attn_threshold .. semantic_estimate) are the rows of
 * CKV_JUDGE_PARAM_LIST (lifecycle/policy.h), which holds their defaults,
 * bounds and docs; ckv_config_judge_params maps them to ckv_judge_params.
 * Attention values are *relative* mass: a token's attention mass divided by
 * the mass it would get under uniform attention over the session, so 1.0 is
 * "an average token" whatever the head count, query count or length. */
typedef struct ckv_policy_params {
  int default_policy;          /* ckv_policy_id for sessions that name none */
  int judge;                   /* ckv_judge_kind */
  char mlp_weights[CKV_CONFIG_PATH_MAX]; /* MLP weight file; "" = none */
  char trace[CKV_CONFIG_PATH_MAX]; /* training-trace file for the mlp judge; "" = off */
  uint32_t trace_every;        /* record every Nth round */
  uint64_t trace_max_bytes;    /* stop recording after this many bytes; 0 = no limit */
  double attn_threshold;       /* draft->staged: mean relative attention over R rounds */
  double semantic_threshold;   /* draft->staged and filler filter: semantic score in [0,1] */
  double high_attn_threshold;  /* staged->committed: relative attention to sustain */
  uint32_t history_rounds;     /* R: rounds of attention history kept per token */
  uint32_t sink_tokens;        /* S: first positions never recycled, kept FP16 */
  uint32_t recent_window;      /* W: last tokens always draft */
  uint32_t persistence_rounds; /* staged->committed after this many rounds above high_attn */
  uint32_t idle_rounds;        /* recycled after this many rounds without attention */
  double budget;               /* h2o/streaming: kept bytes as a fraction of FP16 */
  uint32_t commit_bits;        /* committed format: 4 or 2 */
  bool rotate;                 /* rotated committed formats (v2) where head_dim allows */
  uint32_t cold_bits;          /* rotated: bits of committed non-facts; 0 = commit_bits */
  bool filler_cold;            /* filler goes the cold path instead of staying draft */
  bool warm_commit;            /* attended staged tokens commit (warm_bits) after persistence_rounds */
  uint32_t warm_bits;          /* rotated: bits of those warm tokens; 0 = commit_bits */
  uint32_t judge_every;        /* the rules run every this many rounds */
  double far_sample;           /* share of far tokens judged per round */
  double prune_keep;           /* committed key channels kept (fraction); 1.0 = no pruning */
  uint32_t filler_recycle_rounds; /* worker-scored empty tokens recycled after commit; 0 = off */
  uint32_t scored_persistence_rounds; /* staged rounds before worker-scored facts and filler commit */
  bool demote;                 /* recycled tokens keep their bytes in cold blocks (dropped only by quota) */
  bool filler_demote_staged;   /* with demote: unattended worker-scored filler goes cold from staged */
  uint32_t fact_cold_rounds;   /* with demote: rounds a lasting fact goes unattended before it goes cold; 0 = never */
  double recall_attn;          /* relative attention that recalls a demoted token */
  uint32_t share_grace_rounds; /* reuse_prefix sessions: rounds a published block waits for a second holder */
  bool semantic_estimate;      /* estimate a semantic score when the worker sends none */
} ckv_policy_params;

/* One [tenant.NAME] section.  Quotas of 0 mean "no cap of its own": the
 * tier's size is the only bound. */
typedef struct ckv_tenant_config {
  char name[CKV_TENANT_NAME_MAX];
  uint32_t uids[CKV_TENANT_MAX_IDS];
  size_t n_uids;
  uint32_t gids[CKV_TENANT_MAX_IDS];
  size_t n_gids;
  uint64_t quota;      /* bytes across all tiers */
  uint64_t quota_host; /* bytes in host memory (offload tier) */
  uint64_t quota_disk; /* bytes of its files in the state dir: snapshots, autosaves, disk-tier files; 0 = no cap */
  uint32_t max_snapshots; /* snapshot files; 0 = no limit */
  uint32_t policies;   /* bit (1u << ckv_policy_id) per allowed policy */
  int default_policy;  /* ckv_policy_id, or -1 = inherit [policy] default */
  uint32_t max_sessions; /* 0 = the [daemon] max_sessions */
  uint32_t max_clients;  /* 0 = an equal share of the [daemon] max_clients */
  double high_water;     /* fraction of quota at which the coldest sessions start moving to disk; 0 = off */
} ckv_tenant_config;

typedef struct ckv_config {
  /* [daemon] */
  char socket[CKV_CONFIG_ENDPOINT_MAX];        /* ZeroMQ control endpoint ("" until finalize) */
  char attach_socket[CKV_CONFIG_PATH_MAX];     /* unix socket path for attach/fd passing */
  int backend;                                 /* ckv_backend_kind */
  uint32_t device;                             /* CUDA device ordinal */
  bool shadow_headers;                         /* deprecated, ignored: headers are always shadowed */
  uint64_t memory;                             /* bytes of the primary KV tier (GPU or host) */
  uint64_t host_memory;                        /* bytes of the host offload tier; 0 = off */
  uint64_t disk_memory;                        /* bytes of the disk offload tier; 0 = off */
  uint64_t disk_idle_ms;                       /* a session idle this long moves to the disk tier; 0 = never */
  uint64_t remote_idle_ms;                     /* ... and this long more on disk, to the remote store; 0 = never */
  bool disk_pressure;                          /* a tenant short of quota moves its coldest sessions down first */
  char state_dir[CKV_CONFIG_PATH_MAX];         /* snapshots and disk tier */
  uint64_t lease_ms;                           /* a client silent this long is dead */
  uint64_t heartbeat_ms;                       /* client heartbeat period (told in Welcome) */
  uint64_t detach_keep_ms;                     /* detached sessions kept this long for resume */
  uint64_t autosave_ms;                        /* live sessions saved to state_dir/autosave this often; 0 = off */
  uint64_t warm_journal_ms;                    /* changed sessions journaled for a warm restart this often; 0 = at stop */
  uint64_t warm_journal_delay_ms;              /* a batch a held reply waits for starts at most this late */
  uint32_t max_clients;                        /* connected clients, all tenants (the ceiling) */
  uint32_t max_sessions;                       /* open sessions per tenant */
  uint64_t max_message;                        /* bytes; ZMQ_MAXMSGSIZE */
  uint32_t max_tokens_per_session;
  uint32_t draft_block_tokens;                 /* token slots per draft block */
  uint32_t commit_block_tokens;                /* token slots per staged/committed block */
  uint32_t compress_threads;
  uint32_t compress_queue;                     /* bounded compressor queue depth (jobs) */
  int log_level;                               /* ckv_log_level (syslog priority) */
  char metrics[CKV_CONFIG_ENDPOINT_MAX];       /* Prometheus "host:port"; "" = off */
  char remote[CKV_CONFIG_ENDPOINT_MAX];        /* remote store URL; "" = off */
  char remote_password_file[CKV_CONFIG_PATH_MAX]; /* AUTH password of the store, in a file; "" = none */
  uint64_t remote_timeout_ms;                  /* per connect and per command to the store */
  char remote_key_file[CKV_CONFIG_PATH_MAX];   /* the secret values are sealed with (persist/seal.h); "" = STATE_DIR/remote.key */
  bool remote_allow_no_auth;                   /* run on a store without AUTH (anyone local may delete or roll back values) */
  char remote_tcp[CKV_CONFIG_ENDPOINT_MAX];    /* CURVE tcp:// control endpoint; "" = off */
  char curve_secret_key[CKV_CONFIG_KEY_MAX];   /* Z85 */
  char curve_public_key[CKV_CONFIG_KEY_MAX];   /* Z85 */

  /* [policy] */
  ckv_policy_params policy;

  /* [tenant.NAME], in file order; owned (ckv_config_done frees). */
  ckv_tenant_config *tenants;
  size_t n_tenants;
} ckv_config;

#endif
