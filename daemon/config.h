/* daemon/config.h - commitkvd's configuration: one INI file, one table.
 *
 * Every knob of the daemon is one row of a static table in config_table.c
 * (section, key, type, offset into the structs below, bounds, default,
 * one-line doc),
 * the way Redis drives its config from static_configs[].  That single table
 * parses the file, validates values and ranges, fills the defaults, prints the
 * effective configuration (`commitkvd --check-config`), writes the reference
 * documentation (`commitkvd --help-config`, commitkvd.conf(5)) and the
 * commented default file shipped in packaging/commitkvd.conf.  A key that is
 * not in the table does not exist.  The files: config_table.c (the table,
 * the docs and the template), config_value.c (one value, text to field and
 * back), config.c (files through libinih, flags, cross-key checks, reload),
 * config_tenant.c (tenant sections and lookup).
 *
 * The order the daemon applies things in:
 *   ckv_config_init_defaults -> ckv_config_load_file (optional)
 *   -> ckv_config_set for each command-line flag -> ckv_config_finalize
 *   -> ckv_config_ensure_default_tenant.
 * On SIGHUP: init_defaults + load_file + finalize + ensure_default_tenant
 * into a fresh struct, ckv_config_reload_changes(live, fresh) to warn about
 * what needs a restart, then ckv_config_apply_reload(live, fresh) and
 * ckv_config_done(fresh).
 *
 * The struct is plain data: readers use its fields directly.  Nothing here
 * locks; the thread that owns the live config applies reloads, and other
 * threads read the fields they need through their own synchronisation. */
#ifndef CKV_DAEMON_CONFIG_H
#define CKV_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
  uint64_t quota_disk; /* bytes on disk (offload tier) */
  uint32_t policies;   /* bit (1u << ckv_policy_id) per allowed policy */
  int default_policy;  /* ckv_policy_id, or -1 = inherit [policy] default */
  uint32_t max_sessions; /* 0 = the [daemon] max_sessions */
  uint32_t max_clients;  /* 0 = an equal share of the [daemon] max_clients */
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
  char remote_tcp[CKV_CONFIG_ENDPOINT_MAX];    /* CURVE tcp:// control endpoint; "" = off */
  char curve_secret_key[CKV_CONFIG_KEY_MAX];   /* Z85 */
  char curve_public_key[CKV_CONFIG_KEY_MAX];   /* Z85 */

  /* [policy] */
  ckv_policy_params policy;

  /* [tenant.NAME], in file order; owned (ckv_config_done frees). */
  ckv_tenant_config *tenants;
  size_t n_tenants;
} ckv_config;

/* Fills every field with the table's defaults and no tenants.  Never fails.
 * Does not free: call ckv_config_done first when reusing a loaded struct. */
void ckv_config_init_defaults(ckv_config *c);

/* The judge's parameters for a [policy] section (history_rounds clamped to
 * what the attention ring keeps; mlp left NULL: loading weights is the
 * caller's).  With the defaults it equals ckv_judge_params_init's. */
struct ckv_judge_params;
void ckv_config_judge_params(const ckv_policy_params *p, struct ckv_judge_params *ret);

/* Frees the tenants and leaves *c empty (safe to call twice, or on a
 * zero-filled struct). */
void ckv_config_done(ckv_config *c);

/* Reads an INI file over *c (which holds defaults or an earlier config).
 * Syntax: `[section]`, `key = value`, comments on their own line or after
 * whitespace with '#' or ';', string values optionally in double quotes
 * (\" and \\ escapes).  Every error names the file and line, e.g.
 * "/etc/commitkv/commitkvd.conf:12: unknown key 'foo' in [daemon]": unknown
 * section or key, bad value, out of range, key given twice, duplicate tenant,
 * a uid or gid claimed by two tenants, inconsistent values (heartbeat not
 * shorter than lease...).  Only a regular file is read: the path is opened
 * without blocking and anything else (a FIFO, a directory, a device) is
 * refused before a byte is read ("PATH: is a FIFO, not a regular file"), so
 * neither --check-config nor a SIGHUP reload can hang on it.  Returns CKV_OK;
 * CKV_ERR_INVALID with err filled on a bad or non-regular file (*c is then
 * partially updated: discard it); -errno when the file cannot be opened or
 * read; -ENOMEM.  err may be NULL. */
int ckv_config_load_file(ckv_config *c, const char *path, char *err, size_t errlen);

/* Same as ckv_config_load_file, over text in memory; `name` is used in
 * messages in place of the file name. */
int ckv_config_load_string(ckv_config *c, const char *text, const char *name, char *err,
                           size_t errlen);

/* Sets one key from text, as a file line would (the daemon's command-line
 * flags go through here).  section is "daemon", "policy" or "tenant.NAME"
 * (created when missing).  Returns CKV_OK, CKV_ERR_INVALID (unknown key, bad
 * value, out of range; err says which) or -ENOMEM.  Cross-key checks run in
 * ckv_config_finalize. */
int ckv_config_set(ckv_config *c, const char *section, const char *key, const char *value,
                   char *err, size_t errlen);

/* Cross-key checks and derived defaults, once all sources are applied:
 * socket "" -> ipc://$RUNTIME_DIRECTORY/commitkvd.sock (else
 * ipc:///run/commitkv/commitkvd.sock), attach_socket "" -> the same directory's
 * commitkvd.attach, state_dir "" -> $STATE_DIRECTORY (first entry) or
 * /var/lib/commitkv.  Returns CKV_OK or CKV_ERR_INVALID with err filled. */
int ckv_config_finalize(ckv_config *c, char *err, size_t errlen);

/* Cross-key checks only (what finalize and load_file run). */
int ckv_config_check(const ckv_config *c, char *err, size_t errlen);

/* Adds tenant "default" for own_uid and root (uid 0), all policies, no quota
 * of its own, when the config has no tenant at all.  Returns 1 when added,
 * 0 when tenants exist, -ENOMEM. */
int ckv_config_ensure_default_tenant(ckv_config *c, uint32_t own_uid);

/* The tenant a peer with these credentials belongs to: a tenant listing the
 * uid wins; otherwise one listing the gid; NULL = refuse the peer.  The
 * pointer lives until the tenants change (reload, done). */
const ckv_tenant_config *ckv_config_tenant_for(const ckv_config *c, uint32_t uid, uint32_t gid);

/* The clients tenant t may have attached at once: its max_clients, else an
 * equal share of [daemon] max_clients among the tenants (at least 1); never
 * above [daemon] max_clients. */
uint32_t ckv_tenant_max_clients(const ckv_config *c, const ckv_tenant_config *t);

/* Bytes of [daemon] memory meant for tenant t's arena: for a tenant with a
 * quota, the arena its quota needs; for one without, an equal share of what
 * the tenants with quotas leave (a multiple of 2 MiB; 0 when they leave
 * nothing).  The server still cuts every arena to what is left of memory. */
uint64_t ckv_tenant_memory_share(const ckv_config *c, const ckv_tenant_config *t);

/* Tenant by name, or NULL. */
const ckv_tenant_config *ckv_config_tenant_by_name(const ckv_config *c, const char *name);

/* Whether the tenant may use the policy (ckv_policy_id). */
bool ckv_tenant_allows_policy(const ckv_tenant_config *t, int policy);

/* The policy a tenant's session gets when OpenSession names none. */
int ckv_tenant_default_policy(const ckv_config *c, const ckv_tenant_config *t);

/* Writes the configuration as INI that ckv_config_load_file reads back to an
 * equal struct (every key of every section, tenants in order).  Returns
 * CKV_OK or -EIO when writing fails. */
int ckv_config_write(const ckv_config *c, FILE *out);

/* Writes the commented default configuration (every key as "#key = default"
 * under its doc line, and a commented tenant example): the content of
 * packaging/commitkvd.conf.  Returns CKV_OK or -EIO. */
int ckv_config_write_template(FILE *out);

typedef enum ckv_config_doc_format {
  CKV_CONFIG_DOC_MARKDOWN = 0, /* one table per section: key, type, default, range, doc */
  CKV_CONFIG_DOC_MAN = 1,      /* troff .TP entries for commitkvd.conf(5) */
} ckv_config_doc_format;

/* Writes the reference of every key (default, range, doc) for --help-config
 * and the man page.  Returns CKV_OK or -EIO. */
int ckv_config_write_docs(FILE *out, ckv_config_doc_format format);

/* Applies the live-reloadable fields of `fresh` to `live`: log level, the
 * [policy] section, and for each tenant present in both (matched by name)
 * its quotas, allowed policies, default policy, session and client limits.  Tenants
 * added or removed, uid/gid changes and every other [daemon] key need a
 * restart (see ckv_config_reload_changes). */
void ckv_config_apply_reload(ckv_config *live, const ckv_config *fresh);

/* Calls fn once for each change between live and fresh that
 * ckv_config_apply_reload ignores (it needs a restart): section is "daemon",
 * "policy" or "tenant.NAME"; key is the key, or NULL for a tenant section
 * that was "added" or "removed" (note).  Returns how many there are (0 = the
 * reload took everything).  fn may be NULL. */
typedef void (*ckv_config_change_fn)(void *ctx, const char *section, const char *key,
                                     const char *note);
int ckv_config_reload_changes(const ckv_config *live, const ckv_config *fresh,
                              ckv_config_change_fn fn, void *ctx);

/* The same changes as text in buf ("memory, tenant.alice.uids, tenant.bob
 * (removed)"); returns how many there are.  buf may be NULL. */
int ckv_config_reload_diff(const ckv_config *live, const ckv_config *fresh, char *buf,
                           size_t buflen);

/* "4G", "512M", "1024", "16KiB", "2T": binary multiples (K = 1024), an
 * optional B or iB, case-insensitive; no sign, no fraction, no spaces inside.
 * Returns CKV_OK, CKV_ERR_INVALID (junk) or CKV_ERR_RANGE (> UINT64_MAX). */
int ckv_parse_size(const char *text, uint64_t *ret_bytes);

/* "250ms", "10s", "5m", "2h", "1d" -> milliseconds; "0" alone is allowed,
 * any other number needs its unit.  Same return codes as ckv_parse_size. */
int ckv_parse_duration_ms(const char *text, uint64_t *ret_ms);

/* Shortest exact text for a size ("4G", "1536K", "1000") and a duration
 * ("5m", "250ms", "0"), loadable by the parsers above. */
void ckv_format_size(uint64_t bytes, char *buf, size_t len);
void ckv_format_duration_ms(uint64_t ms, char *buf, size_t len);

#endif
