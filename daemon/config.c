/* daemon/config.c - the configuration table and everything it drives.
 *
 * config_keys[] below is the only list of keys.  Each row says where the value
 * lives (section and offset), how to read and print it (type, bounds, enum
 * names, an optional validator), its default as text in the file's own
 * syntax (so defaults go through the same parser as the file and cannot
 * drift from it), whether SIGHUP may change it, and one line of doc saying
 * what it is and why the default is what it is.  Parsing, defaults, range
 * checks, --check-config output, the reload rules, the docs and the shipped
 * default file are loops over this table. */
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "daemon/judge.h"
#include "daemon/log.h"

/* ------------------------------------------------------------------------ */
/* The table                                                                 */

typedef enum key_type {
  T_STRING,   /* char[] field; `size` is its capacity */
  T_BOOL,     /* bool; yes|no|true|false|on|off|1|0 */
  T_U32,      /* uint32_t */
  T_U64,      /* uint64_t */
  T_SIZE,     /* uint64_t bytes; K/M/G/T/P suffixes */
  T_DURATION, /* uint64_t milliseconds; ms/s/m/h/d suffixes */
  T_DOUBLE,   /* double, finite */
  T_ENUM,     /* int; one of `enums` */
  T_UIDS,     /* uint32_t[CKV_TENANT_MAX_IDS] + size_t count at offset2; numbers or user names */
  T_GIDS,     /* same, group names */
  T_POLICIES, /* uint32_t bit set of ckv_policy_id; names or "all" */
} key_type;

typedef enum section_kind { SEC_DAEMON, SEC_POLICY, SEC_TENANT } section_kind;

typedef struct enum_entry {
  const char *name;
  int value;
} enum_entry;

typedef int (*key_check_fn)(const char *value, char *err, size_t errlen);

typedef struct config_key {
  section_kind section;
  const char *key;
  key_type type;
  size_t offset;  /* into ckv_config (daemon, policy) or ckv_tenant_config (tenant) */
  size_t size;    /* bytes of the field (capacity for strings) */
  size_t offset2; /* T_UIDS/T_GIDS: the count field */
  uint64_t imin, imax;
  double dmin, dmax;
  const enum_entry *enums; /* T_ENUM: terminated by a NULL name */
  key_check_fn check;      /* T_STRING: extra validation of a non-empty value */
  bool reload;             /* SIGHUP may change it */
  const char *def;         /* default, as file text */
  const char *doc;
} config_key;

static const enum_entry backend_names[] = {
    {"auto", CKV_BACKEND_AUTO}, {"host", CKV_BACKEND_HOST}, {"cuda", CKV_BACKEND_CUDA}, {NULL, 0}};
static const enum_entry judge_names[] = {
    {"rules", CKV_JUDGE_RULES}, {"mlp", CKV_JUDGE_MLP}, {NULL, 0}};
static const enum_entry level_names[] = {
    {"error", CKV_LOG_ERROR}, {"warning", CKV_LOG_WARNING}, {"notice", CKV_LOG_NOTICE},
    {"info", CKV_LOG_INFO},   {"debug", CKV_LOG_DEBUG},     {NULL, 0}};
static const enum_entry bits_names[] = {{"4", 4}, {"2", 2}, {NULL, 0}};
static const enum_entry policy_enum[] = {
    {"fp16", CKV_POLICY_FP16},   {"int8", CKV_POLICY_INT8}, {"kivi4", CKV_POLICY_KIVI4},
    {"kivi2", CKV_POLICY_KIVI2}, {"h2o", CKV_POLICY_H2O},   {"streaming", CKV_POLICY_STREAMING},
    {"commitkv", CKV_POLICY_COMMITKV}, {NULL, 0}};
static const enum_entry tenant_policy_enum[] = {
    {"inherit", -1},
    {"fp16", CKV_POLICY_FP16},   {"int8", CKV_POLICY_INT8}, {"kivi4", CKV_POLICY_KIVI4},
    {"kivi2", CKV_POLICY_KIVI2}, {"h2o", CKV_POLICY_H2O},   {"streaming", CKV_POLICY_STREAMING},
    {"commitkv", CKV_POLICY_COMMITKV}, {NULL, 0}};

const char *const ckv_policy_names[CKV_POLICY_COUNT] = {
    [CKV_POLICY_FP16] = "fp16",   [CKV_POLICY_INT8] = "int8",
    [CKV_POLICY_KIVI4] = "kivi4", [CKV_POLICY_KIVI2] = "kivi2",
    [CKV_POLICY_H2O] = "h2o",     [CKV_POLICY_STREAMING] = "streaming",
    [CKV_POLICY_COMMITKV] = "commitkv",
};

static int check_endpoint(const char *v, char *err, size_t errlen);
static int check_abs_path(const char *v, char *err, size_t errlen);
static int check_unix_path(const char *v, char *err, size_t errlen);
static int check_host_port(const char *v, char *err, size_t errlen);
static int check_remote_url(const char *v, char *err, size_t errlen);
static int check_tcp_endpoint(const char *v, char *err, size_t errlen);
static int check_z85_key(const char *v, char *err, size_t errlen);

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define TIB (GIB * 1024)
#define PIB (TIB * 1024)
#define SEC UINT64_C(1000)
#define DAY (SEC * 86400)

#define FLD_(base, f) .offset = offsetof(base, f), .size = sizeof(((base *)0)->f)
#define DMN(f) FLD_(ckv_config, f)
#define POL(f) FLD_(ckv_config, policy.f)
#define TEN(f) FLD_(ckv_tenant_config, f)

/* The order of the rows is the order of the docs, the template and
 * --check-config's output. */
static const config_key config_keys[] = {
    /* ---- [daemon] ---- */
    {SEC_DAEMON, "socket", T_STRING, DMN(socket), .check = check_endpoint, .def = "",
     .doc = "ZeroMQ control endpoint. Empty: ipc://$RUNTIME_DIRECTORY/commitkvd.sock under systemd, "
            "else ipc:///run/commitkv/commitkvd.sock (kept out of /tmp, which PrivateTmp hides)."},
    {SEC_DAEMON, "attach_socket", T_STRING, DMN(attach_socket), .check = check_unix_path, .def = "",
     .doc = "Unix socket where workers attach (SO_PEERCRED identifies the tenant, arena fds are passed "
            "over it). Empty: commitkvd.attach next to the control socket."},
    {SEC_DAEMON, "backend", T_ENUM, DMN(backend), .enums = backend_names, .def = "auto",
     .doc = "Where KV memory lives. auto uses a CUDA device when one answers and falls back to host "
            "memory, so one config serves GPU and CPU-only nodes."},
    {SEC_DAEMON, "device", T_U32, DMN(device), .imin = 0, .imax = 1023, .def = "0",
     .doc = "CUDA device ordinal for the GPU arena (one daemon per GPU: run one instance per device)."},
    {SEC_DAEMON, "shadow_headers", T_BOOL, DMN(shadow_headers), .def = "no",
     .doc = "Host backend only, for testing: edit block headers in host shadows and copy them into "
            "the arena at flush points, the way the CUDA backend must (the CPU cannot write GPU "
            "memory). Leave it off in production: it only adds copies."},
    {SEC_DAEMON, "memory", T_SIZE, DMN(memory), .imin = MIB, .imax = PIB, .def = "4G",
     .doc = "Bytes of the primary KV tier (GPU memory, or host memory on the host backend). 4G fits "
            "a small model's sessions without starving the engine's weights; size it to what is "
            "left after the model."},
    {SEC_DAEMON, "host_memory", T_SIZE, DMN(host_memory), .imin = 0, .imax = PIB, .def = "0",
     .doc = "Bytes of the host-memory offload tier for rarely read committed blocks; 0 = off (no "
            "tier unless asked for: it costs pinned RAM)."},
    {SEC_DAEMON, "disk_memory", T_SIZE, DMN(disk_memory), .imin = 0, .imax = PIB, .def = "0",
     .doc = "Bytes of the disk offload tier under state_dir; 0 = off."},
    {SEC_DAEMON, "state_dir", T_STRING, DMN(state_dir), .check = check_abs_path, .def = "",
     .doc = "Directory for snapshots and the disk tier. Empty: $STATE_DIRECTORY (systemd's "
            "StateDirectory=) or /var/lib/commitkv."},
    {SEC_DAEMON, "lease", T_DURATION, DMN(lease_ms), .imin = 100, .imax = 3600 * SEC, .def = "10s",
     .doc = "A client silent this long is dead: its sessions are detached and its slots freed "
            "(invariant 3). 10s rides out a GC pause or a slow step, yet frees a killed worker's "
            "memory quickly."},
    {SEC_DAEMON, "heartbeat", T_DURATION, DMN(heartbeat_ms), .imin = 10, .imax = 600 * SEC,
     .def = "2s",
     .doc = "Heartbeat period the daemon asks clients for; at most half the lease, so one lost "
            "heartbeat never expires a lease."},
    {SEC_DAEMON, "detach_keep", T_DURATION, DMN(detach_keep_ms), .imin = 0, .imax = 30 * DAY,
     .def = "5m",
     .doc = "How long a detached session (its worker died or disconnected) is kept for resume "
            "before it is reclaimed; 5m covers a worker restart, 0 frees at once."},
    {SEC_DAEMON, "max_clients", T_U32, DMN(max_clients), .imin = 1, .imax = 65536, .def = "256",
     .doc = "Connected clients, all tenants together: every resource a peer can claim has a limit."},
    {SEC_DAEMON, "max_sessions", T_U32, DMN(max_sessions), .imin = 1, .imax = 1000000, .def = "64",
     .doc = "Open sessions per tenant unless the tenant sets its own max_sessions."},
    {SEC_DAEMON, "max_message", T_SIZE, DMN(max_message), .imin = 64 * KIB, .imax = GIB,
     .def = "16M",
     .doc = "Largest control message (ZMQ_MAXMSGSIZE): nothing else bounds what a peer sends. 16M "
            "holds a ReportRound for a 1M-token session."},
    {SEC_DAEMON, "max_tokens_per_session", T_U32, DMN(max_tokens_per_session), .imin = 16,
     .imax = 16 * 1024 * 1024, .def = "131072",
     .doc = "Tokens a session may hold (128K, today's long-context models); bounds per-session "
            "metadata and a ReportRound's size."},
    {SEC_DAEMON, "draft_block_tokens", T_U32, DMN(draft_block_tokens), .imin = 1, .imax = 1024,
     .def = "16",
     .doc = "Token slots per draft (FP16) block: small, so an append wastes little."},
    {SEC_DAEMON, "commit_block_tokens", T_U32, DMN(commit_block_tokens), .imin = 32, .imax = 4096,
     .def = "64",
     .doc = "Token slots per staged/committed block; >= 32 so per-channel key scales and zero "
            "points amortise over enough tokens."},
    {SEC_DAEMON, "compress_threads", T_U32, DMN(compress_threads), .imin = 1, .imax = 256,
     .def = "2",
     .doc = "Compressor threads on the host backend (off the critical path); 2 keeps up with "
            "several workers without taking their cores."},
    {SEC_DAEMON, "compress_queue", T_U32, DMN(compress_queue), .imin = 1, .imax = 1 << 20,
     .def = "1024",
     .doc = "Bounded compressor queue (jobs): when full, transitions wait for the next round "
            "instead of growing memory without bound."},
    {SEC_DAEMON, "log_level", T_ENUM, DMN(log_level), .enums = level_names, .reload = true,
     .def = "info",
     .doc = "Least important level logged (error, warning, notice, info, debug). info logs "
            "per-session events, never one line per round or token."},
    {SEC_DAEMON, "metrics", T_STRING, DMN(metrics), .check = check_host_port,
     .def = "127.0.0.1:9464",
     .doc = "Prometheus endpoint host:port; loopback by default so per-tenant figures stay on the "
            "node; empty disables it."},
    {SEC_DAEMON, "remote", T_STRING, DMN(remote), .check = check_remote_url, .def = "",
     .doc = "Remote tier for moving sessions between nodes, e.g. redis://127.0.0.1:6379 (Redis or "
            "Valkey); empty = off."},
    {SEC_DAEMON, "remote_tcp", T_STRING, DMN(remote_tcp), .check = check_tcp_endpoint, .def = "",
     .doc = "ZeroMQ tcp:// endpoint for remote control with CURVE (needs both curve keys); empty = "
            "off, local ipc only."},
    {SEC_DAEMON, "curve_secret_key", T_STRING, DMN(curve_secret_key), .check = check_z85_key,
     .def = "",
     .doc = "Server CURVE secret key (40 Z85 characters) for remote_tcp; keep this file mode 0640 "
            "root:commitkv."},
    {SEC_DAEMON, "curve_public_key", T_STRING, DMN(curve_public_key), .check = check_z85_key,
     .def = "",
     .doc = "Server CURVE public key (40 Z85 characters) that remote clients pin."},

    /* ---- [policy] ---- (attention values are relative: 1.0 = uniform share) */
    {SEC_POLICY, "default", T_ENUM, POL(default_policy), .enums = policy_enum, .reload = true,
     .def = "commitkv",
     .doc = "Policy of sessions that name none: the lifecycle (DESIGN.md 1); the baselines fp16, "
            "int8, kivi4, kivi2, h2o, streaming exist for side-by-side comparison."},
    {SEC_POLICY, "judge", T_ENUM, POL(judge), .enums = judge_names, .reload = true, .def = "rules",
     .doc = "Transition judge: rules (thresholds below; deterministic, explainable) or mlp (a "
            "two-layer perceptron over the same features, needs mlp_weights)."},
    {SEC_POLICY, "mlp_weights", T_STRING, POL(mlp_weights), .check = check_abs_path,
     .reload = true, .def = "",
     .doc = "Weight file of the mlp judge (absolute path); empty = none."},
    {SEC_POLICY, "trace", T_STRING, POL(trace), .check = check_abs_path, .reload = true, .def = "",
     .doc = "File the daemon appends mlp-judge training traces to (per-token features and attention; "
            "no token ids or text); empty = off. See docs/mlp-judge.md."},
    {SEC_POLICY, "trace_every", T_U32, POL(trace_every), .imin = 1, .imax = 8, .reload = true, .def = "4",
     .doc = "Record every Nth round (<= 8, so the attention rings cover the rounds between); a "
            "32K-token round costs about 90 ms and 2.6 MB."},
    {SEC_POLICY, "trace_max_bytes", T_SIZE, POL(trace_max_bytes), .imin = 0, .imax = PIB, .reload = true,
     .def = "1G", .doc = "Stop recording after this many bytes per open (logged once); 0 = no limit."},
    {SEC_POLICY, "attn_threshold", T_DOUBLE, POL(attn_threshold), .dmin = 0, .dmax = 1e6,
     .reload = true, .def = "1",
     .doc = "draft->staged when mean relative attention over history_rounds exceeds this. 1.0 = "
            "above an average token: INT8 measured almost lossless (KL 0.0008), so staging is cheap "
            "to do early."},
    {SEC_POLICY, "semantic_threshold", T_DOUBLE, POL(semantic_threshold), .dmin = 0, .dmax = 1,
     .reload = true, .def = "0.3",
     .doc = "Semantic score (0..1) a token needs to be promoted: the filler filter, so 'ok', 'got "
            "it' draw attention but never earn bits."},
    {SEC_POLICY, "high_attn_threshold", T_DOUBLE, POL(high_attn_threshold), .dmin = 0, .dmax = 1e6,
     .reload = true, .def = "2",
     .doc = "staged->committed when relative attention stays above this for persistence_rounds: a "
            "lasting fact, not one round's spike (>= attn_threshold)."},
    {SEC_POLICY, "history_rounds", T_U32, POL(history_rounds), .imin = 1, .imax = 8,
     .reload = true, .def = "8",
     .doc = "R: rounds of attention kept per token (at most 8: one byte each, which keeps the "
            "per-token metadata within its 32-byte budget); 8 smooths one noisy round."},
    {SEC_POLICY, "sink_tokens", T_U32, POL(sink_tokens), .imin = 0, .imax = 4096, .reload = true,
     .def = "4",
     .doc = "S: first positions (attention sinks, StreamingLLM) never recycled and kept FP16; 4 as "
            "in the fidelity measurement."},
    {SEC_POLICY, "recent_window", T_U32, POL(recent_window), .imin = 0, .imax = 1 << 20,
     .reload = true, .def = "32",
     .doc = "W: last tokens always draft (KIVI's residual window); 32 as in the fidelity "
            "measurement, about one user turn."},
    {SEC_POLICY, "persistence_rounds", T_U32, POL(persistence_rounds), .imin = 1, .imax = 100000,
     .reload = true, .def = "4",
     .doc = "Rounds above high_attn_threshold before staged->committed (one-way, lossy): 4 rounds "
            "of sustained use mark a confirmed fact."},
    {SEC_POLICY, "idle_rounds", T_U32, POL(idle_rounds), .imin = 1, .imax = 1000000,
     .reload = true, .def = "16",
     .doc = "Rounds without attention before a token is recycled. Eviction is the costliest "
            "mistake (KL 1.1 at a 20% budget), so only long silence frees a token."},
    {SEC_POLICY, "budget", T_DOUBLE, POL(budget), .dmin = 0.01, .dmax = 1, .reload = true,
     .def = "0.25",
     .doc = "h2o and streaming baselines: bytes kept as a fraction of FP16; 0.25 matches what "
            "INT4 costs, for comparisons at equal memory."},
    {SEC_POLICY, "commit_bits", T_ENUM, POL(commit_bits), .enums = bits_names, .reload = true,
     .def = "4",
     .doc = "Bits per element of committed blocks (4 or 2). INT4 already cost KL 0.12 when applied "
            "everywhere; INT2 is for memory-bound tenants who measured it."},
    {SEC_POLICY, "prune_keep", T_DOUBLE, POL(prune_keep), .dmin = 0.125, .dmax = 1,
     .reload = true, .def = "1",
     .doc = "Fraction of key channels kept in committed blocks (ThinK-style pruning); 1.0 = off, as "
            "pruning adds error on top of quantization."},
    {SEC_POLICY, "semantic_estimate", T_BOOL, POL(semantic_estimate), .reload = true,
     .def = "yes",
     .doc = "Estimate a semantic score from the keys when the worker sends none, so the filler "
            "filter always has a signal."},

    /* ---- [tenant.NAME] ---- */
    {SEC_TENANT, "uids", T_UIDS, TEN(uids), .offset2 = offsetof(ckv_tenant_config, n_uids),
     .def = "",
     .doc = "Users (numbers or names) whose workers belong to this tenant (SO_PEERCRED); a uid "
            "belongs to one tenant only."},
    {SEC_TENANT, "gids", T_GIDS, TEN(gids), .offset2 = offsetof(ckv_tenant_config, n_gids),
     .def = "",
     .doc = "Groups (numbers or names) whose members belong to this tenant when no tenant lists "
            "their uid."},
    {SEC_TENANT, "quota", T_SIZE, TEN(quota), .imin = 0, .imax = PIB, .reload = true, .def = "0",
     .doc = "Bytes this tenant may hold across all tiers; under pressure the engine compresses "
            "and recycles before refusing. 0 = bounded by the tiers only."},
    {SEC_TENANT, "quota_host", T_SIZE, TEN(quota_host), .imin = 0, .imax = PIB, .reload = true,
     .def = "0", .doc = "Bytes in the host-memory tier; 0 = no cap of its own."},
    {SEC_TENANT, "quota_disk", T_SIZE, TEN(quota_disk), .imin = 0, .imax = PIB, .reload = true,
     .def = "0", .doc = "Bytes in the disk tier; 0 = no cap of its own."},
    {SEC_TENANT, "policies", T_POLICIES, TEN(policies), .reload = true, .def = "all",
     .doc = "Policies this tenant's sessions may choose (names or all)."},
    {SEC_TENANT, "default_policy", T_ENUM, TEN(default_policy), .enums = tenant_policy_enum,
     .reload = true, .def = "inherit",
     .doc = "Policy of this tenant's sessions that name none; inherit = [policy] default. Must be "
            "in policies."},
    {SEC_TENANT, "max_sessions", T_U32, TEN(max_sessions), .imin = 0, .imax = 1000000,
     .reload = true, .def = "0",
     .doc = "Open sessions of this tenant; 0 = [daemon] max_sessions."},
};

#define N_KEYS (sizeof config_keys / sizeof config_keys[0])

static const char *const section_names[] = {
    [SEC_DAEMON] = "daemon", [SEC_POLICY] = "policy", [SEC_TENANT] = "tenant.NAME"};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

static void seterr(char *err, size_t errlen, const char *fmt, ...) CKV_PRINTF_FMT(3, 4);
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static const config_key *find_key(section_kind sec, const char *key) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (config_keys[i].section == sec && strcmp(config_keys[i].key, key) == 0)
      return &config_keys[i];
  return NULL;
}

static size_t key_index(const config_key *k) { return (size_t)(k - config_keys); }

static bool valid_tenant_name(const char *n) {
  size_t len = strlen(n);
  if (len < 1 || len >= CKV_TENANT_NAME_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if (!(islower((unsigned char)n[i]) || isdigit((unsigned char)n[i]) || n[i] == '_' ||
          n[i] == '-'))
      return false;
  return true;
}

int ckv_config_policy_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < CKV_POLICY_COUNT; i++)
    if (strcmp(name, ckv_policy_names[i]) == 0) return i;
  return -1;
}

/* ------------------------------------------------------------------------ */
/* Numbers, sizes, durations                                                 */

/* Digits only (no sign, no space, no 0x): strtoull alone accepts "-1". */
static int parse_digits(const char *s, const char **end, uint64_t *ret) {
  if (!isdigit((unsigned char)*s)) return CKV_ERR_INVALID;
  uint64_t v = 0;
  for (; isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return CKV_ERR_RANGE;
    v = v * 10 + d;
  }
  *end = s;
  *ret = v;
  return CKV_OK;
}

static int mul_checked(uint64_t a, uint64_t b, uint64_t *ret) {
  if (b != 0 && a > UINT64_MAX / b) return CKV_ERR_RANGE;
  *ret = a * b;
  return CKV_OK;
}

int ckv_parse_size(const char *text, uint64_t *ret_bytes) {
  if (!text) return CKV_ERR_INVALID;
  const char *p;
  uint64_t v;
  int r = parse_digits(text, &p, &v);
  if (r < 0) return r;
  uint64_t mult = 1;
  switch (toupper((unsigned char)*p)) {
    case 'K': mult = KIB; p++; break;
    case 'M': mult = MIB; p++; break;
    case 'G': mult = GIB; p++; break;
    case 'T': mult = TIB; p++; break;
    case 'P': mult = PIB; p++; break;
    default: break;
  }
  if (mult != 1 && (p[0] == 'i' || p[0] == 'I') && (p[1] == 'B' || p[1] == 'b'))
    p += 2;
  else if (*p == 'B' || *p == 'b')
    p++;
  if (*p != '\0') return CKV_ERR_INVALID;
  uint64_t bytes;
  r = mul_checked(v, mult, &bytes);
  if (r < 0) return r;
  *ret_bytes = bytes;
  return CKV_OK;
}

static const struct {
  const char *suffix;
  uint64_t ms;
} duration_units[] = {{"ms", 1}, {"s", SEC}, {"m", 60 * SEC}, {"h", 3600 * SEC}, {"d", DAY}};

int ckv_parse_duration_ms(const char *text, uint64_t *ret_ms) {
  if (!text) return CKV_ERR_INVALID;
  const char *p;
  uint64_t v;
  int r = parse_digits(text, &p, &v);
  if (r < 0) return r;
  if (*p == '\0') {
    if (v != 0) return CKV_ERR_INVALID; /* "500": ms or s?  Say it. */
    *ret_ms = 0;
    return CKV_OK;
  }
  for (size_t i = 0; i < sizeof duration_units / sizeof duration_units[0]; i++) {
    if (strcmp(p, duration_units[i].suffix) == 0) {
      uint64_t ms;
      r = mul_checked(v, duration_units[i].ms, &ms);
      if (r < 0) return r;
      *ret_ms = ms;
      return CKV_OK;
    }
  }
  return CKV_ERR_INVALID;
}

void ckv_format_size(uint64_t bytes, char *buf, size_t len) {
  static const char units[] = "KMGTP";
  int u = -1;
  while (bytes != 0 && u < 4 && bytes % 1024 == 0) {
    bytes /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(buf, len, "%" PRIu64, bytes);
  else
    snprintf(buf, len, "%" PRIu64 "%c", bytes, units[u]);
}

void ckv_format_duration_ms(uint64_t ms, char *buf, size_t len) {
  if (ms == 0) {
    snprintf(buf, len, "0");
    return;
  }
  for (size_t i = sizeof duration_units / sizeof duration_units[0]; i-- > 0;) {
    if (ms % duration_units[i].ms == 0) {
      snprintf(buf, len, "%" PRIu64 "%s", ms / duration_units[i].ms, duration_units[i].suffix);
      return;
    }
  }
}

/* Shortest text that strtod reads back to the same double. */
static void format_double(double v, char *buf, size_t len) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

/* ------------------------------------------------------------------------ */
/* String validators (run on non-empty values)                                */

static int check_endpoint(const char *v, char *err, size_t errlen) {
  if (strncmp(v, "ipc://", 6) == 0 || strncmp(v, "tcp://", 6) == 0) return CKV_OK;
  seterr(err, errlen, "'%s' is not a ZeroMQ endpoint (ipc://PATH or tcp://HOST:PORT)", v);
  return CKV_ERR_INVALID;
}

static int check_abs_path(const char *v, char *err, size_t errlen) {
  if (v[0] == '/') return CKV_OK;
  seterr(err, errlen, "'%s' is not an absolute path", v);
  return CKV_ERR_INVALID;
}

static int check_unix_path(const char *v, char *err, size_t errlen) {
  if (check_abs_path(v, err, errlen) < 0) return CKV_ERR_INVALID;
  if (strlen(v) >= 108) { /* sizeof(sun_path) on Linux */
    seterr(err, errlen, "'%s' is longer than a unix socket path may be (107 bytes)", v);
    return CKV_ERR_INVALID;
  }
  return CKV_OK;
}

static int check_port(const char *p) {
  const char *end;
  uint64_t port;
  if (parse_digits(p, &end, &port) < 0 || *end != '\0' || port < 1 || port > 65535)
    return CKV_ERR_INVALID;
  return CKV_OK;
}

static int check_host_port(const char *v, char *err, size_t errlen) {
  const char *colon = strrchr(v, ':');
  if (colon && colon != v && check_port(colon + 1) == CKV_OK) return CKV_OK;
  seterr(err, errlen, "'%s' is not HOST:PORT (port 1..65535)", v);
  return CKV_ERR_INVALID;
}

static int check_remote_url(const char *v, char *err, size_t errlen) {
  if (strncmp(v, "redis://", 8) == 0 || strncmp(v, "rediss://", 9) == 0 ||
      strncmp(v, "unix://", 7) == 0)
    return CKV_OK;
  seterr(err, errlen, "'%s' is not a redis://, rediss:// or unix:// URL", v);
  return CKV_ERR_INVALID;
}

static int check_tcp_endpoint(const char *v, char *err, size_t errlen) {
  if (strncmp(v, "tcp://", 6) == 0 && check_host_port(v + 6, NULL, 0) == CKV_OK) return CKV_OK;
  seterr(err, errlen, "'%s' is not a tcp://HOST:PORT endpoint", v);
  return CKV_ERR_INVALID;
}

static int check_z85_key(const char *v, char *err, size_t errlen) {
  static const char z85[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (strlen(v) == 40 && strspn(v, z85) == 40) return CKV_OK;
  seterr(err, errlen, "not a CURVE key (40 Z85 characters)");
  return CKV_ERR_INVALID;
}

/* ------------------------------------------------------------------------ */
/* Reading one value into its field                                           */

static bool is_list_sep(char ch) { return ch == ',' || isspace((unsigned char)ch); }

/* Splits a list value into items; calls fn for each.  Empty list: no call. */
static int for_each_item(const char *value, int (*fn)(const char *item, void *ctx), void *ctx) {
  const char *p = value;
  char item[256];
  for (;;) {
    while (*p && is_list_sep(*p)) p++;
    if (!*p) return CKV_OK;
    size_t n = 0;
    while (p[n] && !is_list_sep(p[n])) n++;
    if (n >= sizeof item) return CKV_ERR_INVALID;
    memcpy(item, p, n);
    item[n] = '\0';
    p += n;
    int r = fn(item, ctx);
    if (r < 0) return r;
  }
}

typedef struct id_list_ctx {
  bool groups;
  uint32_t ids[CKV_TENANT_MAX_IDS];
  size_t n;
  char *err;
  size_t errlen;
} id_list_ctx;

static int add_id(const char *item, void *vctx) {
  id_list_ctx *x = vctx;
  uint64_t id;
  const char *end;
  if (isdigit((unsigned char)item[0])) {
    int r = parse_digits(item, &end, &id);
    if (r < 0 || *end != '\0' || id >= UINT32_MAX) { /* (uid_t)-1 means "none" */
      seterr(x->err, x->errlen, "'%s' is not a valid %s", item, x->groups ? "gid" : "uid");
      return CKV_ERR_INVALID;
    }
  } else {
    /* A name: resolved once, now; the daemon matches numbers at attach time. */
    char buf[4096];
    int r;
    bool found = false;
    if (x->groups) {
      struct group gr, *res = NULL;
      r = getgrnam_r(item, &gr, buf, sizeof buf, &res);
      if (r == 0 && res) {
        id = res->gr_gid;
        found = true;
      }
    } else {
      struct passwd pw, *res = NULL;
      r = getpwnam_r(item, &pw, buf, sizeof buf, &res);
      if (r == 0 && res) {
        id = res->pw_uid;
        found = true;
      }
    }
    if (!found) {
      /* getpwnam_r returns 0 (or ENOENT on some libcs) for a missing name. */
      if (r != 0 && r != ENOENT && r != ESRCH)
        seterr(x->err, x->errlen, "cannot look up %s '%s': %s", x->groups ? "group" : "user",
               item, strerror(r));
      else
        seterr(x->err, x->errlen, "unknown %s '%s'", x->groups ? "group" : "user", item);
      return CKV_ERR_INVALID;
    }
  }
  for (size_t i = 0; i < x->n; i++) {
    if (x->ids[i] == (uint32_t)id) {
      seterr(x->err, x->errlen, "%s %" PRIu64 " listed twice", x->groups ? "gid" : "uid", id);
      return CKV_ERR_INVALID;
    }
  }
  if (x->n >= CKV_TENANT_MAX_IDS) {
    seterr(x->err, x->errlen, "more than %d %s", CKV_TENANT_MAX_IDS, x->groups ? "gids" : "uids");
    return CKV_ERR_INVALID;
  }
  x->ids[x->n++] = (uint32_t)id;
  return CKV_OK;
}

typedef struct policy_list_ctx {
  uint32_t mask;
  char *err;
  size_t errlen;
} policy_list_ctx;

static int add_policy(const char *item, void *vctx) {
  policy_list_ctx *x = vctx;
  if (strcmp(item, "all") == 0) {
    x->mask = CKV_POLICY_ALL_MASK;
    return CKV_OK;
  }
  int p = ckv_config_policy_from_name(item);
  if (p < 0) {
    seterr(x->err, x->errlen, "unknown policy '%s' (fp16, int8, kivi4, kivi2, h2o, streaming, "
           "commitkv or all)", item);
    return CKV_ERR_INVALID;
  }
  x->mask |= UINT32_C(1) << p;
  return CKV_OK;
}

static void range_text(const config_key *k, char *buf, size_t len) {
  char a[32], b[32];
  switch (k->type) {
    case T_U32:
    case T_U64:
      snprintf(buf, len, "%" PRIu64 "..%" PRIu64, k->imin, k->imax);
      return;
    case T_SIZE:
      ckv_format_size(k->imin, a, sizeof a);
      ckv_format_size(k->imax, b, sizeof b);
      snprintf(buf, len, "%s..%s", a, b);
      return;
    case T_DURATION:
      ckv_format_duration_ms(k->imin, a, sizeof a);
      ckv_format_duration_ms(k->imax, b, sizeof b);
      snprintf(buf, len, "%s..%s", a, b);
      return;
    case T_DOUBLE:
      format_double(k->dmin, a, sizeof a);
      format_double(k->dmax, b, sizeof b);
      snprintf(buf, len, "%s..%s", a, b);
      return;
    case T_ENUM: {
      size_t n = 0;
      buf[0] = '\0';
      for (const enum_entry *e = k->enums; e->name && n < len; e++) {
        int w = snprintf(buf + n, len - n, "%s%s", e == k->enums ? "" : "|", e->name);
        if (w < 0) break;
        n += (size_t)w;
      }
      return;
    }
    case T_BOOL: snprintf(buf, len, "yes|no"); return;
    case T_UIDS: snprintf(buf, len, "up to %d users", CKV_TENANT_MAX_IDS); return;
    case T_GIDS: snprintf(buf, len, "up to %d groups", CKV_TENANT_MAX_IDS); return;
    case T_POLICIES: snprintf(buf, len, "policy names|all"); return;
    case T_STRING: snprintf(buf, len, "up to %zu bytes", k->size - 1); return;
  }
  buf[0] = '\0';
}

static int out_of_range(const config_key *k, const char *value, char *err, size_t errlen) {
  char r[96];
  range_text(k, r, sizeof r);
  seterr(err, errlen, "'%s' is out of range (allowed %s)", value, r);
  return CKV_ERR_RANGE;
}

/* Parses `value` per the row and stores it at base + offset.  On error the
 * field is unchanged and err holds the reason (without file/key). */
static int set_value(const config_key *k, void *base, const char *value, char *err,
                     size_t errlen) {
  char *field = (char *)base + k->offset;
  uint64_t u;
  int r;
  switch (k->type) {
    case T_STRING: {
      size_t len = strlen(value);
      if (len >= k->size) {
        seterr(err, errlen, "longer than %zu bytes", k->size - 1);
        return CKV_ERR_INVALID;
      }
      for (size_t i = 0; i < len; i++) {
        if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f) {
          seterr(err, errlen, "control character in value");
          return CKV_ERR_INVALID;
        }
      }
      if (len > 0 && k->check && k->check(value, err, errlen) < 0) return CKV_ERR_INVALID;
      memset(field, 0, k->size); /* whole field: writes and compares stay deterministic */
      memcpy(field, value, len);
      return CKV_OK;
    }
    case T_BOOL: {
      static const char *const yes[] = {"yes", "true", "on", "1"};
      static const char *const no[] = {"no", "false", "off", "0"};
      for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(value, yes[i]) == 0) {
          *(bool *)field = true;
          return CKV_OK;
        }
        if (strcasecmp(value, no[i]) == 0) {
          *(bool *)field = false;
          return CKV_OK;
        }
      }
      seterr(err, errlen, "'%s' is not a boolean (yes or no)", value);
      return CKV_ERR_INVALID;
    }
    case T_U32:
    case T_U64: {
      const char *end;
      r = parse_digits(value, &end, &u);
      if (r == CKV_OK && *end != '\0') r = CKV_ERR_INVALID;
      if (r == CKV_ERR_INVALID) {
        seterr(err, errlen, "'%s' is not a non-negative integer", value);
        return r;
      }
      if (r == CKV_ERR_RANGE || u < k->imin || u > k->imax)
        return out_of_range(k, value, err, errlen);
      if (k->type == T_U32)
        *(uint32_t *)field = (uint32_t)u;
      else
        *(uint64_t *)field = u;
      return CKV_OK;
    }
    case T_SIZE:
      r = ckv_parse_size(value, &u);
      if (r == CKV_ERR_INVALID) {
        seterr(err, errlen, "'%s' is not a size (a number with an optional K, M, G, T or P suffix)",
               value);
        return r;
      }
      if (r == CKV_ERR_RANGE || u < k->imin || u > k->imax)
        return out_of_range(k, value, err, errlen);
      *(uint64_t *)field = u;
      return CKV_OK;
    case T_DURATION:
      r = ckv_parse_duration_ms(value, &u);
      if (r == CKV_ERR_INVALID) {
        seterr(err, errlen, "'%s' is not a duration (a number with ms, s, m, h or d)", value);
        return r;
      }
      if (r == CKV_ERR_RANGE || u < k->imin || u > k->imax)
        return out_of_range(k, value, err, errlen);
      *(uint64_t *)field = u;
      return CKV_OK;
    case T_DOUBLE: {
      char *end = NULL;
      /* strtod takes "inf", "nan", hex and leading spaces: accept only decimal text. */
      if (!*value || strspn(value, "0123456789.eE+-") != strlen(value)) {
        seterr(err, errlen, "'%s' is not a number", value);
        return CKV_ERR_INVALID;
      }
      errno = 0;
      double d = strtod(value, &end);
      if (*end != '\0' || end == value) {
        seterr(err, errlen, "'%s' is not a number", value);
        return CKV_ERR_INVALID;
      }
      if (errno == ERANGE || !isfinite(d) || d < k->dmin || d > k->dmax)
        return out_of_range(k, value, err, errlen);
      *(double *)field = d;
      return CKV_OK;
    }
    case T_ENUM:
      for (const enum_entry *e = k->enums; e->name; e++) {
        if (strcmp(value, e->name) == 0) {
          *(int *)field = e->value;
          return CKV_OK;
        }
      }
      {
        char r2[128];
        range_text(k, r2, sizeof r2);
        seterr(err, errlen, "'%s' is not one of %s", value, r2);
      }
      return CKV_ERR_INVALID;
    case T_UIDS:
    case T_GIDS: {
      id_list_ctx x = {.groups = k->type == T_GIDS, .err = err, .errlen = errlen};
      r = for_each_item(value, add_id, &x);
      if (r < 0) {
        if (err && errlen && !err[0]) seterr(err, errlen, "bad list '%s'", value);
        return CKV_ERR_INVALID;
      }
      memset(field, 0, k->size);
      memcpy(field, x.ids, x.n * sizeof x.ids[0]);
      *(size_t *)((char *)base + k->offset2) = x.n;
      return CKV_OK;
    }
    case T_POLICIES: {
      policy_list_ctx x = {.mask = 0, .err = err, .errlen = errlen};
      r = for_each_item(value, add_policy, &x);
      if (r < 0) {
        if (err && errlen && !err[0]) seterr(err, errlen, "bad list '%s'", value);
        return CKV_ERR_INVALID;
      }
      if (x.mask == 0) {
        seterr(err, errlen, "at least one policy is needed");
        return CKV_ERR_INVALID;
      }
      *(uint32_t *)field = x.mask;
      return CKV_OK;
    }
  }
  return CKV_ERR_INTERNAL;
}

/* Text of a field as the file would hold it (unquoted). */
static void format_value(const config_key *k, const void *base, char *buf, size_t len) {
  const char *field = (const char *)base + k->offset;
  switch (k->type) {
    case T_STRING: snprintf(buf, len, "%s", field); return;
    case T_BOOL: snprintf(buf, len, "%s", *(const bool *)field ? "yes" : "no"); return;
    case T_U32: snprintf(buf, len, "%" PRIu32, *(const uint32_t *)field); return;
    case T_U64: snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field); return;
    case T_SIZE: ckv_format_size(*(const uint64_t *)field, buf, len); return;
    case T_DURATION: ckv_format_duration_ms(*(const uint64_t *)field, buf, len); return;
    case T_DOUBLE: format_double(*(const double *)field, buf, len); return;
    case T_ENUM:
      for (const enum_entry *e = k->enums; e->name; e++) {
        if (e->value == *(const int *)field) {
          snprintf(buf, len, "%s", e->name);
          return;
        }
      }
      snprintf(buf, len, "?");
      return;
    case T_UIDS:
    case T_GIDS: {
      size_t count = *(const size_t *)((const char *)base + k->offset2);
      const uint32_t *ids = (const uint32_t *)field;
      size_t n = 0;
      buf[0] = '\0';
      for (size_t i = 0; i < count && n < len; i++) {
        int w = snprintf(buf + n, len - n, "%s%" PRIu32, i ? ", " : "", ids[i]);
        if (w < 0) break;
        n += (size_t)w;
      }
      return;
    }
    case T_POLICIES: {
      uint32_t mask = *(const uint32_t *)field;
      if (mask == CKV_POLICY_ALL_MASK) {
        snprintf(buf, len, "all");
        return;
      }
      size_t n = 0;
      buf[0] = '\0';
      for (int p = 0; p < CKV_POLICY_COUNT && n < len; p++) {
        if (!(mask & (UINT32_C(1) << p))) continue;
        int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", ckv_policy_names[p]);
        if (w < 0) break;
        n += (size_t)w;
      }
      return;
    }
  }
  buf[0] = '\0';
}

static bool field_equal(const config_key *k, const void *a, const void *b) {
  const char *fa = (const char *)a + k->offset, *fb = (const char *)b + k->offset;
  if (k->type == T_STRING) return strcmp(fa, fb) == 0;
  if (k->type == T_UIDS || k->type == T_GIDS) {
    size_t na = *(const size_t *)((const char *)a + k->offset2);
    size_t nb = *(const size_t *)((const char *)b + k->offset2);
    return na == nb && memcmp(fa, fb, na * sizeof(uint32_t)) == 0;
  }
  return memcmp(fa, fb, k->size) == 0;
}

static void copy_field(const config_key *k, void *dst, const void *src) {
  memcpy((char *)dst + k->offset, (const char *)src + k->offset, k->size);
  if (k->type == T_UIDS || k->type == T_GIDS)
    memcpy((char *)dst + k->offset2, (const char *)src + k->offset2, sizeof(size_t));
}

/* ------------------------------------------------------------------------ */
/* Defaults, tenants                                                          */

static void apply_defaults(section_kind sec, void *base) {
  for (size_t i = 0; i < N_KEYS; i++) {
    if (config_keys[i].section != sec) continue;
    char err[256];
    if (set_value(&config_keys[i], base, config_keys[i].def, err, sizeof err) < 0) {
      /* A default that does not parse is a bug in the table (a test loads them all). */
      fprintf(stderr, "commitkvd: bad default for %s: %s\n", config_keys[i].key, err);
      abort();
    }
  }
}

void ckv_config_init_defaults(ckv_config *c) {
  memset(c, 0, sizeof *c);
  apply_defaults(SEC_DAEMON, c);
  apply_defaults(SEC_POLICY, c);
}

void ckv_config_done(ckv_config *c) {
  if (!c) return;
  free(c->tenants);
  c->tenants = NULL;
  c->n_tenants = 0;
}

static ckv_tenant_config *find_tenant(const ckv_config *c, const char *name) {
  for (size_t i = 0; i < c->n_tenants; i++)
    if (strcmp(c->tenants[i].name, name) == 0) return &c->tenants[i];
  return NULL;
}

/* Appends a tenant with defaults; name must be valid.  NULL on -ENOMEM or
 * when the tenant limit is reached (*ret_err says which). */
static ckv_tenant_config *add_tenant(ckv_config *c, const char *name, int *ret_err) {
  if (c->n_tenants >= CKV_CONFIG_MAX_TENANTS) {
    *ret_err = CKV_ERR_LIMIT;
    return NULL;
  }
  ckv_tenant_config *t = realloc(c->tenants, (c->n_tenants + 1) * sizeof *t);
  if (!t) {
    *ret_err = -ENOMEM;
    return NULL;
  }
  c->tenants = t;
  t = &c->tenants[c->n_tenants++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  apply_defaults(SEC_TENANT, t);
  return t;
}

const ckv_tenant_config *ckv_config_tenant_by_name(const ckv_config *c, const char *name) {
  return name ? find_tenant(c, name) : NULL;
}

const ckv_tenant_config *ckv_config_tenant_for(const ckv_config *c, uint32_t uid, uint32_t gid) {
  for (size_t i = 0; i < c->n_tenants; i++)
    for (size_t j = 0; j < c->tenants[i].n_uids; j++)
      if (c->tenants[i].uids[j] == uid) return &c->tenants[i];
  for (size_t i = 0; i < c->n_tenants; i++)
    for (size_t j = 0; j < c->tenants[i].n_gids; j++)
      if (c->tenants[i].gids[j] == gid) return &c->tenants[i];
  return NULL;
}

bool ckv_tenant_allows_policy(const ckv_tenant_config *t, int policy) {
  return t && policy >= 0 && policy < CKV_POLICY_COUNT && (t->policies & (UINT32_C(1) << policy));
}

int ckv_tenant_default_policy(const ckv_config *c, const ckv_tenant_config *t) {
  return (t && t->default_policy >= 0) ? t->default_policy : c->policy.default_policy;
}

int ckv_config_ensure_default_tenant(ckv_config *c, uint32_t own_uid) {
  if (c->n_tenants > 0) return 0;
  int r = 0;
  ckv_tenant_config *t = add_tenant(c, "default", &r);
  if (!t) return r == -ENOMEM ? -ENOMEM : r;
  t->uids[t->n_uids++] = own_uid;
  if (own_uid != 0) t->uids[t->n_uids++] = 0;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Cross-key checks                                                           */

/* Which keys a cross-check failure concerns, so the loader can name the line
 * of the one the file set last. */
typedef struct blame {
  const ckv_tenant_config *tenant; /* NULL for [daemon]/[policy] keys */
  const char *key_a, *key_b;       /* key_b may be NULL */
} blame;

static int check_all(const ckv_config *c, blame *b, char *err, size_t errlen) {
  *b = (blame){0};
  if (c->heartbeat_ms * 2 > c->lease_ms) {
    *b = (blame){NULL, "heartbeat", "lease"};
    seterr(err, errlen, "heartbeat (%" PRIu64 "ms) must be at most half the lease (%" PRIu64
           "ms), so one lost heartbeat does not expire a lease", c->heartbeat_ms, c->lease_ms);
    return CKV_ERR_INVALID;
  }
  if (!c->curve_secret_key[0] != !c->curve_public_key[0]) {
    *b = (blame){NULL, "curve_secret_key", "curve_public_key"};
    seterr(err, errlen, "curve_secret_key and curve_public_key go together: set both or neither");
    return CKV_ERR_INVALID;
  }
  if (c->remote_tcp[0] && !c->curve_secret_key[0]) {
    *b = (blame){NULL, "remote_tcp", NULL};
    seterr(err, errlen, "remote_tcp needs curve_secret_key and curve_public_key: the control "
           "protocol never goes over TCP unencrypted");
    return CKV_ERR_INVALID;
  }
  if (c->policy.high_attn_threshold < c->policy.attn_threshold) {
    *b = (blame){NULL, "high_attn_threshold", "attn_threshold"};
    seterr(err, errlen, "high_attn_threshold (%g) is below attn_threshold (%g)",
           c->policy.high_attn_threshold, c->policy.attn_threshold);
    return CKV_ERR_INVALID;
  }
  if (c->policy.judge == CKV_JUDGE_MLP && !c->policy.mlp_weights[0]) {
    *b = (blame){NULL, "judge", "mlp_weights"};
    seterr(err, errlen, "judge = mlp needs mlp_weights");
    return CKV_ERR_INVALID;
  }
  if ((uint64_t)c->policy.sink_tokens + c->policy.recent_window >= c->max_tokens_per_session) {
    *b = (blame){NULL, "recent_window", "max_tokens_per_session"};
    seterr(err, errlen, "sink_tokens + recent_window (%" PRIu64 ") must be below "
           "max_tokens_per_session (%" PRIu32 ")",
           (uint64_t)c->policy.sink_tokens + c->policy.recent_window, c->max_tokens_per_session);
    return CKV_ERR_INVALID;
  }
  for (size_t i = 0; i < c->n_tenants; i++) {
    const ckv_tenant_config *t = &c->tenants[i];
    if (t->n_uids == 0 && t->n_gids == 0) {
      *b = (blame){t, "uids", "gids"};
      seterr(err, errlen, "tenant '%s' has neither uids nor gids: no client could reach it",
             t->name);
      return CKV_ERR_INVALID;
    }
    int dp = ckv_tenant_default_policy(c, t);
    if (!ckv_tenant_allows_policy(t, dp)) {
      *b = (blame){t, "policies", "default_policy"};
      seterr(err, errlen, "tenant '%s': its default policy '%s' is not in its policies (set "
             "default_policy)", t->name, ckv_policy_names[dp]);
      return CKV_ERR_INVALID;
    }
    /* A uid (or gid) claimed by an earlier tenant: the later claim is the error. */
    for (size_t j = 0; j < i; j++) {
      const ckv_tenant_config *o = &c->tenants[j];
      for (size_t a = 0; a < t->n_uids; a++)
        for (size_t z = 0; z < o->n_uids; z++)
          if (t->uids[a] == o->uids[z]) {
            *b = (blame){t, "uids", NULL};
            seterr(err, errlen, "uid %" PRIu32 " of tenant '%s' is already claimed by tenant '%s'",
                   t->uids[a], t->name, o->name);
            return CKV_ERR_INVALID;
          }
      for (size_t a = 0; a < t->n_gids; a++)
        for (size_t z = 0; z < o->n_gids; z++)
          if (t->gids[a] == o->gids[z]) {
            *b = (blame){t, "gids", NULL};
            seterr(err, errlen, "gid %" PRIu32 " of tenant '%s' is already claimed by tenant '%s'",
                   t->gids[a], t->name, o->name);
            return CKV_ERR_INVALID;
          }
    }
  }
  return CKV_OK;
}

int ckv_config_check(const ckv_config *c, char *err, size_t errlen) {
  blame b;
  return check_all(c, &b, err, errlen);
}

/* dst = prefix + ($env's first entry, else fallback) [+ "/" + file].
 * CKV_ERR_INVALID when the result does not fit. */
static int derive_path(char *dst, size_t cap, const char *env, const char *file,
                       const char *fallback, const char *prefix) {
  const char *dir = getenv(env);
  char first[CKV_CONFIG_PATH_MAX];
  if (dir && dir[0] == '/') {
    /* systemd passes a colon-separated list when the unit names several. */
    size_t n = strcspn(dir, ":");
    if (n >= sizeof first) n = sizeof first - 1;
    memcpy(first, dir, n);
    first[n] = '\0';
    dir = first;
  } else {
    dir = fallback;
  }
  int n = file ? snprintf(dst, cap, "%s%s/%s", prefix, dir, file)
               : snprintf(dst, cap, "%s%s", prefix, dir);
  if (n < 0 || (size_t)n >= cap) {
    dst[0] = '\0';
    return CKV_ERR_INVALID;
  }
  return CKV_OK;
}

int ckv_config_finalize(ckv_config *c, char *err, size_t errlen) {
  if (!c->socket[0] && derive_path(c->socket, sizeof c->socket, "RUNTIME_DIRECTORY",
                                   "commitkvd.sock", "/run/commitkv", "ipc://") < 0) {
    seterr(err, errlen, "socket: $RUNTIME_DIRECTORY is too long for an endpoint");
    return CKV_ERR_INVALID;
  }
  if (!c->attach_socket[0]) {
    int r;
    if (strncmp(c->socket, "ipc://", 6) == 0) {
      /* Next to the control socket, so one RuntimeDirectory holds both. */
      const char *path = c->socket + 6;
      const char *slash = strrchr(path, '/');
      int dirlen = slash ? (int)(slash - path) : 0;
      int n = snprintf(c->attach_socket, sizeof c->attach_socket, "%.*s/commitkvd.attach",
                       dirlen, path);
      r = (n < 0 || (size_t)n >= sizeof c->attach_socket) ? CKV_ERR_INVALID : CKV_OK;
    } else {
      r = derive_path(c->attach_socket, sizeof c->attach_socket, "RUNTIME_DIRECTORY",
                      "commitkvd.attach", "/run/commitkv", "");
    }
    if (r < 0) {
      c->attach_socket[0] = '\0';
      seterr(err, errlen, "attach_socket: derived path too long; set attach_socket");
      return CKV_ERR_INVALID;
    }
  }
  if (!c->state_dir[0] && derive_path(c->state_dir, sizeof c->state_dir, "STATE_DIRECTORY", NULL,
                                      "/var/lib/commitkv", "") < 0) {
    seterr(err, errlen, "state_dir: $STATE_DIRECTORY is too long");
    return CKV_ERR_INVALID;
  }
  char e2[256];
  if (check_unix_path(c->attach_socket, e2, sizeof e2) < 0) {
    seterr(err, errlen, "attach_socket: %s", e2);
    return CKV_ERR_INVALID;
  }
  return ckv_config_check(c, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* The file                                                                   */

typedef struct loader {
  ckv_config *c;
  const char *name;
  unsigned line;
  section_kind sec;
  bool in_section;
  ckv_tenant_config *tenant; /* SEC_TENANT: index into c->tenants via tenant_idx */
  size_t tenant_idx;
  unsigned *lines;       /* [daemon]/[policy]: line per key index; 0 = not set */
  unsigned *tlines;      /* per tenant: N_KEYS + 1 entries (last = section line) */
  size_t tlines_cap;
  char *err;
  size_t errlen;
} loader;

static int lerr(loader *L, unsigned line, const char *fmt, ...) CKV_PRINTF_FMT(3, 4);
static int lerr(loader *L, unsigned line, const char *fmt, ...) {
  if (!L->err || L->errlen == 0) return CKV_ERR_INVALID;
  int n = snprintf(L->err, L->errlen, "%s:%u: ", L->name, line);
  if (n < 0 || (size_t)n >= L->errlen) return CKV_ERR_INVALID;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(L->err + n, L->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return CKV_ERR_INVALID;
}

static unsigned *tenant_lines(loader *L, size_t idx) { return L->tlines + idx * (N_KEYS + 1); }

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t') p++;
  return p;
}

static bool comment_start(const char *p) { return *p == '#' || *p == ';'; }

static int parse_section(loader *L, const char *p) {
  const char *close = strchr(p, ']');
  if (!close) return lerr(L, L->line, "missing ']' in section header");
  const char *rest = skip_ws(close + 1);
  if (*rest && !comment_start(rest)) return lerr(L, L->line, "junk after section header");
  p = skip_ws(p + 1);
  const char *e = close;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
  char name[128];
  size_t n = (size_t)(e - p);
  if (n >= sizeof name) return lerr(L, L->line, "section name too long");
  memcpy(name, p, n);
  name[n] = '\0';
  L->in_section = true;
  L->tenant = NULL;
  if (strcmp(name, "daemon") == 0) {
    L->sec = SEC_DAEMON;
    return CKV_OK;
  }
  if (strcmp(name, "policy") == 0) {
    L->sec = SEC_POLICY;
    return CKV_OK;
  }
  if (strncmp(name, "tenant.", 7) == 0) {
    const char *tn = name + 7;
    if (!valid_tenant_name(tn))
      return lerr(L, L->line, "bad tenant name '%s' (1 to 63 of a-z, 0-9, '_', '-')", tn);
    ckv_tenant_config *old = find_tenant(L->c, tn);
    if (old) {
      unsigned first = tenant_lines(L, (size_t)(old - L->c->tenants))[N_KEYS];
      return lerr(L, L->line, "duplicate section [tenant.%s] (first on line %u)", tn, first);
    }
    int r = 0;
    if (L->c->n_tenants >= L->tlines_cap) {
      size_t cap = L->tlines_cap ? L->tlines_cap * 2 : 8;
      unsigned *nl = realloc(L->tlines, cap * (N_KEYS + 1) * sizeof *nl);
      if (!nl) return -ENOMEM;
      L->tlines = nl;
      L->tlines_cap = cap;
    }
    ckv_tenant_config *t = add_tenant(L->c, tn, &r);
    if (!t) {
      if (r == -ENOMEM) return r;
      return lerr(L, L->line, "more than %d tenants", CKV_CONFIG_MAX_TENANTS);
    }
    L->sec = SEC_TENANT;
    L->tenant_idx = L->c->n_tenants - 1;
    L->tenant = t;
    unsigned *tl = tenant_lines(L, L->tenant_idx);
    memset(tl, 0, (N_KEYS + 1) * sizeof *tl);
    tl[N_KEYS] = L->line;
    return CKV_OK;
  }
  return lerr(L, L->line, "unknown section [%s] (daemon, policy or tenant.NAME)", name);
}

/* Extracts the value after '=': quoted ("..." with \" and \\) or bare up to a
 * comment that follows whitespace; trailing blanks trimmed. */
static int parse_value(loader *L, const char *p, char *out, size_t cap) {
  p = skip_ws(p);
  size_t n = 0;
  if (*p == '"') {
    p++;
    for (;; p++) {
      if (*p == '\0') return lerr(L, L->line, "unterminated quoted value");
      if (*p == '"') break;
      if (*p == '\\') {
        p++;
        if (*p != '"' && *p != '\\') return lerr(L, L->line, "bad escape in quoted value");
      }
      if (n + 1 >= cap) return lerr(L, L->line, "value too long");
      out[n++] = *p;
    }
    const char *rest = skip_ws(p + 1);
    if (*rest && !comment_start(rest)) return lerr(L, L->line, "junk after quoted value");
    out[n] = '\0';
    return CKV_OK;
  }
  for (; *p; p++) {
    if (comment_start(p) && (n == 0 || out[n - 1] == ' ' || out[n - 1] == '\t')) break;
    if (n + 1 >= cap) return lerr(L, L->line, "value too long");
    out[n++] = *p;
  }
  while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\t')) n--;
  out[n] = '\0';
  return CKV_OK;
}

static const char *section_display(const loader *L, char *buf, size_t len) {
  if (L->sec == SEC_TENANT)
    snprintf(buf, len, "tenant.%s", L->tenant->name);
  else
    snprintf(buf, len, "%s", section_names[L->sec]);
  return buf;
}

static int parse_line(loader *L, char *line) {
  const char *p = skip_ws(line);
  if (*p == '\0' || comment_start(p)) return CKV_OK;
  if (*p == '[') return parse_section(L, p);
  const char *eq = strchr(p, '=');
  if (!eq) return lerr(L, L->line, "expected 'key = value' or '[section]'");
  const char *e = eq;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
  char key[64];
  size_t kn = (size_t)(e - p);
  if (kn == 0) return lerr(L, L->line, "missing key before '='");
  if (kn >= sizeof key) return lerr(L, L->line, "key too long");
  memcpy(key, p, kn);
  key[kn] = '\0';
  if (!L->in_section) return lerr(L, L->line, "key '%s' before any [section]", key);
  char secname[96];
  section_display(L, secname, sizeof secname);
  const config_key *k = find_key(L->sec, key);
  if (!k) return lerr(L, L->line, "unknown key '%s' in [%s]", key, secname);
  unsigned *seen = L->sec == SEC_TENANT ? &tenant_lines(L, L->tenant_idx)[key_index(k)]
                                        : &L->lines[key_index(k)];
  if (*seen) return lerr(L, L->line, "'%s' in [%s] given twice (first on line %u)", key, secname,
                         *seen);
  char value[4096];
  int r = parse_value(L, eq + 1, value, sizeof value);
  if (r < 0) return r;
  char why[512] = "";
  void *base = L->sec == SEC_TENANT ? (void *)L->tenant : (void *)L->c;
  if (set_value(k, base, value, why, sizeof why) < 0)
    return lerr(L, L->line, "bad value for '%s' in [%s]: %s", key, secname, why);
  *seen = L->line;
  return CKV_OK;
}

/* The line to blame for a cross-check failure: the later of the keys' lines,
 * else the tenant's section line, else the last line of the file. */
static unsigned blame_line(loader *L, const blame *b) {
  unsigned line = 0;
  const char *keys[2] = {b->key_a, b->key_b};
  for (int i = 0; i < 2; i++) {
    if (!keys[i]) continue;
    const config_key *k = find_key(b->tenant ? SEC_TENANT : SEC_DAEMON, keys[i]);
    if (!k && !b->tenant) k = find_key(SEC_POLICY, keys[i]);
    if (!k) continue;
    unsigned l = b->tenant ? tenant_lines(L, (size_t)(b->tenant - L->c->tenants))[key_index(k)]
                           : L->lines[key_index(k)];
    if (l > line) line = l;
  }
  if (line == 0 && b->tenant) line = tenant_lines(L, (size_t)(b->tenant - L->c->tenants))[N_KEYS];
  return line ? line : L->line;
}

int ckv_config_load_string(ckv_config *c, const char *text, const char *name, char *err,
                           size_t errlen) {
  if (err && errlen) err[0] = '\0';
  loader L = {.c = c, .name = name ? name : "<config>", .err = err, .errlen = errlen};
  L.lines = calloc(N_KEYS, sizeof *L.lines);
  if (!L.lines) return -ENOMEM;
  /* Tenants already in *c (from ckv_config_set) get line records too. */
  L.tlines_cap = c->n_tenants + 8;
  L.tlines = calloc(L.tlines_cap * (N_KEYS + 1), sizeof *L.tlines);
  if (!L.tlines) {
    free(L.lines);
    return -ENOMEM;
  }
  int r = CKV_OK;
  char *buf = NULL;
  size_t bufcap = 0;
  const char *p = text;
  while (*p) {
    L.line++;
    size_t n = strcspn(p, "\n");
    if (n + 1 > bufcap) {
      char *nb = realloc(buf, n + 1);
      if (!nb) {
        r = -ENOMEM;
        break;
      }
      buf = nb;
      bufcap = n + 1;
    }
    memcpy(buf, p, n);
    buf[n] = '\0';
    if (n > 0 && buf[n - 1] == '\r') buf[n - 1] = '\0';
    p += n;
    if (*p == '\n') p++;
    r = parse_line(&L, buf);
    if (r < 0) break;
  }
  if (r == CKV_OK) {
    blame b;
    char why[512];
    if (check_all(c, &b, why, sizeof why) < 0) r = lerr(&L, blame_line(&L, &b), "%s", why);
  }
  free(buf);
  free(L.lines);
  free(L.tlines);
  if (r == -ENOMEM) seterr(err, errlen, "%s: out of memory", L.name);
  return r;
}

#define CONFIG_FILE_MAX (1 << 20)

int ckv_config_load_file(ckv_config *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    seterr(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  char *text = malloc(CONFIG_FILE_MAX + 1);
  if (!text) {
    fclose(f);
    seterr(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  size_t n = fread(text, 1, CONFIG_FILE_MAX + 1, f);
  int rerr = ferror(f);
  fclose(f);
  int r;
  if (rerr) {
    seterr(err, errlen, "%s: read error", path);
    r = -EIO;
  } else if (n > CONFIG_FILE_MAX) {
    seterr(err, errlen, "%s: larger than %d bytes", path, CONFIG_FILE_MAX);
    r = CKV_ERR_INVALID;
  } else if (memchr(text, '\0', n)) {
    text[n] = '\0';
    unsigned line = 1;
    for (const char *q = text; *q; q++) line += *q == '\n';
    seterr(err, errlen, "%s:%u: NUL byte in file", path, line);
    r = CKV_ERR_INVALID;
  } else {
    text[n] = '\0';
    r = ckv_config_load_string(c, text, path, err, errlen);
  }
  free(text);
  return r;
}

int ckv_config_set(ckv_config *c, const char *section, const char *key, const char *value,
                   char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!section || !key || !value) {
    seterr(err, errlen, "missing section, key or value");
    return CKV_ERR_INVALID;
  }
  section_kind sec;
  void *base;
  if (strcmp(section, "daemon") == 0) {
    sec = SEC_DAEMON;
    base = c;
  } else if (strcmp(section, "policy") == 0) {
    sec = SEC_POLICY;
    base = c;
  } else if (strncmp(section, "tenant.", 7) == 0 && valid_tenant_name(section + 7)) {
    sec = SEC_TENANT;
    base = NULL; /* found or created once the key is known to exist */
  } else {
    seterr(err, errlen, "unknown section [%s]", section);
    return CKV_ERR_INVALID;
  }
  const config_key *k = find_key(sec, key);
  if (!k) {
    seterr(err, errlen, "unknown key '%s' in [%s]", key, section);
    return CKV_ERR_INVALID;
  }
  if (sec == SEC_TENANT) {
    base = find_tenant(c, section + 7);
    if (!base) {
      int r = 0;
      base = add_tenant(c, section + 7, &r);
      if (!base) {
        seterr(err, errlen, r == -ENOMEM ? "out of memory" : "too many tenants");
        return r;
      }
    }
  }
  char why[512] = "";
  if (set_value(k, base, value, why, sizeof why) < 0) {
    seterr(err, errlen, "bad value for '%s' in [%s]: %s", key, section, why);
    return CKV_ERR_INVALID;
  }
  return CKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                    */

static void write_quoted(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    fputc(*s, out);
  }
  fputc('"', out);
}

static void write_key_value(FILE *out, const config_key *k, const void *base, const char *prefix) {
  char buf[CKV_TENANT_MAX_IDS * 12 + CKV_CONFIG_PATH_MAX];
  format_value(k, base, buf, sizeof buf);
  fprintf(out, "%s%s = ", prefix, k->key);
  if (k->type == T_STRING || buf[0] == '\0') /* "" reads better than a dangling '=' */
    write_quoted(out, buf);
  else
    fputs(buf, out);
  fputc('\n', out);
}

static void write_section(FILE *out, section_kind sec, const void *base) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (config_keys[i].section == sec) write_key_value(out, &config_keys[i], base, "");
}

static int finish(FILE *out) { return (fflush(out) != 0 || ferror(out)) ? -EIO : CKV_OK; }

int ckv_config_write(const ckv_config *c, FILE *out) {
  fprintf(out, "# commitkvd effective configuration\n\n[daemon]\n");
  write_section(out, SEC_DAEMON, c);
  fprintf(out, "\n[policy]\n");
  write_section(out, SEC_POLICY, c);
  for (size_t i = 0; i < c->n_tenants; i++) {
    fprintf(out, "\n[tenant.%s]\n", c->tenants[i].name);
    write_section(out, SEC_TENANT, &c->tenants[i]);
  }
  return finish(out);
}

/* Wraps doc text into "# "-prefixed lines of at most ~78 columns. */
static void write_comment(FILE *out, const char *text) {
  const char *p = text;
  while (*p) {
    size_t take = strlen(p);
    if (take > 76) {
      take = 76;
      while (take > 0 && p[take] != ' ') take--;
      if (take == 0) take = strcspn(p, " ");
    }
    fprintf(out, "# %.*s\n", (int)take, p);
    p += take;
    while (*p == ' ') p++;
  }
}

static void write_template_section(FILE *out, section_kind sec) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &config_keys[i];
    if (k->section != sec) continue;
    char range[128];
    range_text(k, range, sizeof range);
    fputc('\n', out);
    write_comment(out, k->doc);
    fprintf(out, "# (%s%s)\n", range, k->reload ? "; reloaded on SIGHUP" : "");
    fprintf(out, "#%s = ", k->key);
    if (k->type == T_STRING)
      write_quoted(out, k->def);
    else
      fputs(k->def, out);
    fputc('\n', out);
  }
}

int ckv_config_write_template(FILE *out) {
  fputs("# /etc/commitkv/commitkvd.conf - configuration of commitkvd, the CommitKV daemon.\n"
        "#\n"
        "# Every key is listed with its default, commented out: uncomment and change\n"
        "# what you need.  Sizes take K, M, G, T suffixes (powers of 1024); durations\n"
        "# need a unit: ms, s, m, h, d.  Strings may be double-quoted.  Check a file\n"
        "# with `commitkvd --check-config FILE`; see commitkvd.conf(5).\n"
        "# Attention thresholds are relative: 1.0 is the share of an average token.\n"
        "# Generated from the key table in daemon/config.c; keep them in step.\n\n"
        "[daemon]\n",
        out);
  write_template_section(out, SEC_DAEMON);
  fputs("\n[policy]\n", out);
  write_template_section(out, SEC_POLICY);
  fputs("\n# Tenants: one section per tenant, [tenant.NAME] with NAME of a-z, 0-9, '_', '-'.\n"
        "# A worker belongs to the tenant listing its uid, else the one listing its gid;\n"
        "# others are refused.  Without any tenant section, commitkvd serves its own\n"
        "# user and root as tenant \"default\".  Example:\n"
        "#\n"
        "#[tenant.NAME]\n",
        out);
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &config_keys[i];
    if (k->section != SEC_TENANT) continue;
    char range[128];
    range_text(k, range, sizeof range);
    fputs("#\n", out);
    write_comment(out, k->doc);
    fprintf(out, "# (%s%s)\n#%s = ", range, k->reload ? "; reloaded on SIGHUP" : "", k->key);
    if (k->type == T_STRING || k->def[0] == '\0')
      write_quoted(out, k->def);
    else
      fputs(k->def, out);
    fputc('\n', out);
  }
  return finish(out);
}

static const char *type_name(key_type t) {
  switch (t) {
    case T_STRING: return "string";
    case T_BOOL: return "bool";
    case T_U32:
    case T_U64: return "integer";
    case T_SIZE: return "size";
    case T_DURATION: return "duration";
    case T_DOUBLE: return "number";
    case T_ENUM: return "enum";
    case T_UIDS: return "user list";
    case T_GIDS: return "group list";
    case T_POLICIES: return "policy list";
  }
  return "?";
}

/* troff needs leading dots/quotes and backslashes escaped. */
static void write_man_text(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '\\')
      fputs("\\e", out);
    else if (*s == '-')
      fputs("\\-", out);
    else
      fputc(*s, out);
  }
}

int ckv_config_write_docs(FILE *out, ckv_config_doc_format format) {
  static const char *const headers[] = {[SEC_DAEMON] = "[daemon]", [SEC_POLICY] = "[policy]",
                                        [SEC_TENANT] = "[tenant.NAME]"};
  for (int s = SEC_DAEMON; s <= SEC_TENANT; s++) {
    if (format == CKV_CONFIG_DOC_MARKDOWN)
      fprintf(out, "%s### %s\n\n| key | type | default | range | reload | description |\n"
              "| --- | --- | --- | --- | --- | --- |\n", s ? "\n" : "", headers[s]);
    else
      fprintf(out, ".SH \"%s\"\n", headers[s]);
    for (size_t i = 0; i < N_KEYS; i++) {
      const config_key *k = &config_keys[i];
      if ((int)k->section != s) continue;
      char range[128];
      range_text(k, range, sizeof range);
      const char *def = k->def[0] ? k->def : "\"\"";
      if (format == CKV_CONFIG_DOC_MARKDOWN) {
        fprintf(out, "| `%s` | %s | `%s` | ", k->key, type_name(k->type), def);
        for (const char *r = range; *r; r++) { /* '|' would split the cell */
          if (*r == '|') fputs("\\|", out);
          else fputc(*r, out);
        }
        fprintf(out, " | %s | %s |\n", k->reload ? "yes" : "no", k->doc);
      } else {
        fprintf(out, ".TP\n.BR %s \" = \" \"", k->key);
        write_man_text(out, def);
        fputs("\"\n", out);
        write_man_text(out, k->doc);
        fprintf(out, " (%s; ", type_name(k->type));
        write_man_text(out, range);
        fprintf(out, "%s)\n", k->reload ? "; reloaded on SIGHUP" : "");
      }
    }
  }
  return finish(out);
}

/* ------------------------------------------------------------------------ */
/* Reload                                                                     */

void ckv_config_apply_reload(ckv_config *live, const ckv_config *fresh) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &config_keys[i];
    if (!k->reload) continue;
    if (k->section != SEC_TENANT) {
      copy_field(k, live, fresh);
      continue;
    }
    for (size_t t = 0; t < live->n_tenants; t++) {
      const ckv_tenant_config *ft = find_tenant(fresh, live->tenants[t].name);
      if (ft) copy_field(k, &live->tenants[t], ft);
    }
  }
}

typedef struct diff_out {
  char *buf;
  size_t len, used;
  int count;
} diff_out;

static void diff_add(diff_out *d, const char *fmt, ...) CKV_PRINTF_FMT(2, 3);
static void diff_add(diff_out *d, const char *fmt, ...) {
  if (d->buf && d->len > 0 && d->used < d->len) {
    if (d->count > 0) {
      int w = snprintf(d->buf + d->used, d->len - d->used, ", ");
      if (w > 0) d->used = d->used + (size_t)w < d->len ? d->used + (size_t)w : d->len - 1;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(d->buf + d->used, d->len - d->used, fmt, ap);
    va_end(ap);
    if (w > 0) d->used = d->used + (size_t)w < d->len ? d->used + (size_t)w : d->len - 1;
  }
  d->count++;
}

int ckv_config_reload_diff(const ckv_config *live, const ckv_config *fresh, char *buf,
                           size_t buflen) {
  diff_out d = {.buf = buf, .len = buflen};
  if (buf && buflen) buf[0] = '\0';
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &config_keys[i];
    if (k->reload || k->section == SEC_TENANT) continue;
    if (!field_equal(k, live, fresh)) diff_add(&d, "%s", k->key);
  }
  for (size_t t = 0; t < live->n_tenants; t++) {
    const ckv_tenant_config *lt = &live->tenants[t];
    const ckv_tenant_config *ft = find_tenant(fresh, lt->name);
    if (!ft) {
      diff_add(&d, "tenant.%s (removed)", lt->name);
      continue;
    }
    for (size_t i = 0; i < N_KEYS; i++) {
      const config_key *k = &config_keys[i];
      if (k->section == SEC_TENANT && !k->reload && !field_equal(k, lt, ft))
        diff_add(&d, "tenant.%s.%s", lt->name, k->key);
    }
  }
  for (size_t t = 0; t < fresh->n_tenants; t++)
    if (!find_tenant(live, fresh->tenants[t].name))
      diff_add(&d, "tenant.%s (added)", fresh->tenants[t].name);
  return d.count;
}

int ckv_config_policy_range(const char *key, double *ret_min, double *ret_max) {
  for (size_t i = 0; key && i < sizeof(config_keys) / sizeof(config_keys[0]); i++) {
    const config_key *k = &config_keys[i];
    if (k->section != SEC_POLICY || strcmp(k->key, key) != 0) continue;
    if (k->type == T_DOUBLE) {
      *ret_min = k->dmin;
      *ret_max = k->dmax;
      return CKV_OK;
    }
    if (k->type == T_U32) {
      *ret_min = (double)k->imin;
      *ret_max = (double)k->imax;
      return CKV_OK;
    }
    return CKV_ERR_INVALID; /* not a number */
  }
  return CKV_ERR_NOT_FOUND;
}

void ckv_config_judge_params(const ckv_policy_params *p, ckv_judge_params *ret) {
  *ret = (ckv_judge_params){
      .policy = p->default_policy,
      .attn_threshold = (float)p->attn_threshold,
      .semantic_threshold = (float)p->semantic_threshold,
      .high_attn_threshold = (float)p->high_attn_threshold,
      .history_rounds = p->history_rounds < CKV_ATTN_HISTORY ? p->history_rounds : CKV_ATTN_HISTORY,
      .sink_tokens = p->sink_tokens,
      .recent_window = p->recent_window,
      .persistence_rounds = p->persistence_rounds,
      .idle_rounds = p->idle_rounds,
      .budget = (float)p->budget,
      .commit_bits = p->commit_bits,
      .prune_keep = (float)p->prune_keep,
      .semantic_estimate_enabled = p->semantic_estimate,
  };
}
