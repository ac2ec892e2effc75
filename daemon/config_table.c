/* daemon/config_table.c - the configuration's key table and its documentation.
 *
 * ckv_cfg_keys[] below is the only list of keys.  Each row says where the
 * value lives (section and offset), how to read and print it (type, bounds,
 * enum names, an optional validator), its default as text in the file's own
 * syntax (so defaults go through the same parser as the file and cannot drift
 * from it), whether SIGHUP may change it, and one line of doc saying what it
 * is and why the default is what it is.  The reference docs (--help-config,
 * commitkvd.conf(5)) and the shipped default file are written from here;
 * parsing, range checks, --check-config output and the reload rules loop over
 * the same rows (config_value.c, config.c).  The judge's [policy] rows are
 * made from the lifecycle library's parameter list (CKV_JUDGE_PARAM_LIST in
 * lifecycle/policy.h), which holds their defaults, bounds and docs. */
#include "daemon/config_table.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "lifecycle/policy.h"
#include "persist/remote.h"

static const enum_entry backend_names[] = {
    {"auto", CKV_BACKEND_AUTO}, {"host", CKV_BACKEND_HOST}, {"cuda", CKV_BACKEND_CUDA}, {NULL, 0}};
static const enum_entry judge_names[] = {
    {"rules", CKV_JUDGE_RULES}, {"mlp", CKV_JUDGE_MLP}, {NULL, 0}};
static const enum_entry level_names[] = {
    {"error", CKV_LOG_ERROR}, {"warning", CKV_LOG_WARNING}, {"notice", CKV_LOG_NOTICE},
    {"info", CKV_LOG_INFO},   {"debug", CKV_LOG_DEBUG},     {NULL, 0}};
static const enum_entry bits_names[] = {{"4", 4}, {"2", 2}, {NULL, 0}};
#define POLICY_ENTRY_(id, name) {name, CKV_POLICY_##id},
static const enum_entry policy_enum[] = {CKV_POLICY_LIST(POLICY_ENTRY_){NULL, 0}};
static const enum_entry tenant_policy_enum[] = {{"inherit", -1}, CKV_POLICY_LIST(POLICY_ENTRY_){NULL, 0}};
#undef POLICY_ENTRY_

static int check_endpoint(const char *v, char *err, size_t errlen);
static int check_abs_path(const char *v, char *err, size_t errlen);
static int check_host_port(const char *v, char *err, size_t errlen);
static int check_remote_url(const char *v, char *err, size_t errlen);
static int check_tcp_endpoint(const char *v, char *err, size_t errlen);
static int check_z85_key(const char *v, char *err, size_t errlen);

#define FLD_(base, f) .offset = offsetof(base, f), .size = sizeof(((base *)0)->f)
#define DMN(f) FLD_(ckv_config, f)
#define POL(f) FLD_(ckv_config, policy.f)
#define TEN(f) FLD_(ckv_tenant_config, f)

/* One [policy] row per CKV_JUDGE_PARAM_LIST entry; the default text is the
 * list's literal, so the file, the docs and ckv_judge_params_init agree. */
#define POLICY_PARAM_ROW_(key, field, kind_, def_, lo_, hi_, per_session_, doc_)                      \
  POLICY_ROW_##kind_(key, def_, lo_, hi_, doc_)
#define POLICY_ROW_FLOAT(key, def_, lo_, hi_, doc_)                                                   \
  {SEC_POLICY, #key, T_DOUBLE, POL(key), .dmin = lo_, .dmax = hi_, .reload = true, .def = #def_, .doc = doc_},
#define POLICY_ROW_U32(key, def_, lo_, hi_, doc_)                                                     \
  {SEC_POLICY, #key, T_U32, POL(key), .imin = lo_, .imax = hi_, .reload = true, .def = #def_, .doc = doc_},
#define POLICY_ROW_BITS(key, def_, lo_, hi_, doc_)                                                    \
  {SEC_POLICY, #key, T_ENUM, POL(key), .enums = bits_names, .reload = true, .def = #def_, .doc = doc_},
#define POLICY_ROW_BOOL(key, def_, lo_, hi_, doc_)                                                    \
  {SEC_POLICY, #key, T_BOOL, POL(key), .reload = true, .def = CKV_JUDGE_PARAM_YESNO_##def_, .doc = doc_},

/* The order of the rows is the order of the docs, the template and
 * --check-config's output. */
const config_key ckv_cfg_keys[] = {
    /* ---- [daemon] ---- */
    {SEC_DAEMON, "socket", T_STRING, DMN(socket), .check = check_endpoint, .def = "",
     .doc = "ZeroMQ control endpoint. Empty: ipc://$RUNTIME_DIRECTORY/commitkvd.sock under systemd, "
            "else ipc:///run/commitkv/commitkvd.sock (kept out of /tmp, which PrivateTmp hides)."},
    {SEC_DAEMON, "attach_socket", T_STRING, DMN(attach_socket), .check = ckv_cfg_check_unix_path, .def = "",
     .doc = "Unix socket where workers attach (SO_PEERCRED identifies the tenant, arena fds are passed "
            "over it). Empty: commitkvd.attach next to the control socket."},
    {SEC_DAEMON, "backend", T_ENUM, DMN(backend), .enums = backend_names, .def = "auto",
     .doc = "Where KV memory lives. auto uses a CUDA device when one answers and falls back to host "
            "memory, so one config serves GPU and CPU-only nodes."},
    {SEC_DAEMON, "device", T_U32, DMN(device), .imin = 0, .imax = 1023, .def = "0",
     .doc = "CUDA device ordinal for the GPU arena (one daemon per GPU: run one instance per device)."},
    {SEC_DAEMON, "shadow_headers", T_BOOL, DMN(shadow_headers), .def = "no",
     .doc = "Deprecated, ignored: block headers always live in daemon-private shadows written into "
            "the arena at flush points, on every backend (workers can write their arena, so the "
            "daemon never reads a header back from it). Accepted so old configs still load."},
    {SEC_DAEMON, "memory", T_SIZE, DMN(memory), .imin = MIB, .imax = PIB, .def = "4G",
     .doc = "Bytes of the primary KV tier (GPU memory, or host memory on the host backend), for all "
            "tenants together: their arenas never add up to more. 4G fits a small model's sessions "
            "without starving the engine's weights; size it to what is left after the model."},
    {SEC_DAEMON, "host_memory", T_SIZE, DMN(host_memory), .imin = 0, .imax = PIB, .def = "0",
     .doc = "Bytes of the host-memory offload tier for rarely read committed blocks; 0 = off (no "
            "tier unless asked for: it costs pinned RAM)."},
    {SEC_DAEMON, "disk_memory", T_SIZE, DMN(disk_memory), .imin = 0, .imax = PIB, .def = "0",
     .doc = "Bytes of the disk offload tier under state_dir (its files, all tenants); 0 = off. When "
            "full, an idle session stays in memory and the daemon says so."},
    {SEC_DAEMON, "disk_idle", T_DURATION, DMN(disk_idle_ms), .imin = 0, .imax = 30 * DAY, .def = "0s",
     .doc = "A session no request named for this long (seconds or more: 30s, 10m; detached, or attached "
            "and quiet) is written to the disk tier and its memory given back; its next request brings "
            "it back first. Needs disk_memory and state_dir. 0 = never: moving a session costs a write "
            "and a read, worth it only where memory is short, so it is asked for."},
    {SEC_DAEMON, "remote_idle", T_DURATION, DMN(remote_idle_ms), .imin = 0, .imax = 30 * DAY, .def = "0s",
     .doc = "A session on the disk tier that no request named for this long more moves on to the remote "
            "store (`remote`): its tier file is stored there and then removed, and its next request reads "
            "it back from the store. Needs remote and the disk tier. 0 = never (the default)."},
    {SEC_DAEMON, "disk_pressure", T_BOOL, DMN(disk_pressure), .def = "yes",
     .doc = "When a request of a tenant needs more memory than its quota has left, first move the "
            "tenant's coldest other sessions (least recently used, quiet) to the disk tier, and "
            "only then compress, recycle or refuse; the request waits for the moves. Needs "
            "disk_memory and state_dir (disk_idle may be 0). Lossless, so on by default."},
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
    {SEC_DAEMON, "autosave", T_DURATION, DMN(autosave_ms), .imin = 0, .imax = 30 * DAY, .def = "0s",
     .doc = "Crash copies: every live session that changed (a round, tokens, a move) is saved this "
            "often, one at a time, to state_dir/autosave (full snapshots, never listed, never sent to "
            "the remote store). After a kill -9 or a crash, OpenSession with resume brings a session "
            "back from its autosave when that is newer than its snapshot; what came after the autosave "
            "is lost and the reply's token count says where it stands. Dropping or expiring a session "
            "removes its autosave. The copy is made on the loop (about the session's bytes), so size "
            "the period to the sessions: 30s or more. 0 = off (the default)."},
    {SEC_DAEMON, "warm_journal", T_DURATION, DMN(warm_journal_ms), .imin = 0, .imax = 60000, .def = "100ms",
     .doc = "Under systemd with a state directory (a warm restart, docs/warm-restart.md): the warm "
            "journal is kept current while serving, so that after a kill -9 the next daemon keeps every "
            "session on its blocks with every change it answered: a reply to a request that changed a "
            "session (open, append, report, ack, fork, restore) is sent once the change is on disk "
            "(records appended to a log off the loop, one fdatasync per batch, compacted into a "
            "checkpoint now and then). Changes no reply waits for are journaled this often. Freed blocks "
            "a durable record names stay allocated until none does. 0 = only at a clean stop (nothing "
            "held, nothing kept after a kill)."},
    {SEC_DAEMON, "warm_journal_delay", T_DURATION, DMN(warm_journal_delay_ms), .imin = 0, .imax = 100,
     .def = "0",
     .doc = "With warm_journal on: how long a batch may wait for more changes after the first reply "
            "started waiting for one (group commit: fewer, larger writes for a little latency on every "
            "held reply). 0 = a batch starts as soon as a reply waits and none is being written."},
    {SEC_DAEMON, "max_clients", T_U32, DMN(max_clients), .imin = 1, .imax = 65536, .def = "256",
     .doc = "Connected clients, all tenants together: every resource a peer can claim has a limit. "
            "The ceiling over each tenant's own max_clients."},
    {SEC_DAEMON, "max_sessions", T_U32, DMN(max_sessions), .imin = 1, .imax = 1000000, .def = "64",
     .doc = "Open sessions per tenant unless the tenant sets its own max_sessions."},
    {SEC_DAEMON, "max_message", T_SIZE, DMN(max_message), .imin = 64 * KIB, .imax = GIB,
     .def = "16M",
     .doc = "Largest control message: a larger request is answered CKV_ERR_TOO_LARGE without being "
            "decoded; ZeroMQ itself drops frames over 2 x max_message + 64K (ZMQ_MAXMSGSIZE: nothing "
            "else bounds what a peer sends). 16M holds a ReportRound for a 1M-token session."},
    {SEC_DAEMON, "max_tokens_per_session", T_U32, DMN(max_tokens_per_session), .imin = 16,
     .imax = 16 * 1024 * 1024, .def = "131072",
     .doc = "Tokens a session may hold (128K, today's long-context models); bounds per-session "
            "metadata and a ReportRound's size."},
    {SEC_DAEMON, "draft_block_tokens", T_U32, DMN(draft_block_tokens), .imin = 1, .imax = 1024,
     .def = "16",
     .doc = "Token slots per draft (FP16) block: small, so an append wastes little."},
    {SEC_DAEMON, "commit_block_tokens", T_U32, DMN(commit_block_tokens), .imin = 32, .imax = 4096,
     .def = "32",
     .doc = "Token slots per staged/committed block; >= 32 so per-channel key scales and zero "
            "points amortise over enough tokens. 32: a session's partly filled blocks (one per "
            "format) waste half as much as at 64: agent-synthetic 0.200 -> 0.187 of FP16."},
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
     .doc = "Remote tier for moving sessions between nodes: redis://[USER@]HOST[:PORT][/DB] or "
            "unix://PATH (Redis or Valkey); saves go to it too, restores take the newer copy; empty = "
            "off. rediss:// (TLS) is refused: this build's hiredis has no TLS."},
    {SEC_DAEMON, "remote_password_file", T_STRING, DMN(remote_password_file), .check = check_abs_path,
     .def = "",
     .doc = "File holding the remote store's AUTH password (one line; owner root or the daemon's user, "
            "mode 0600 or 0640): never the password itself in this file; empty = no AUTH."},
    {SEC_DAEMON, "remote_key_file", T_STRING, DMN(remote_key_file), .check = check_abs_path, .def = "",
     .doc = "File of 32 random bytes (the daemon's user's, mode 0600) that every value put in the remote store "
            "is sealed with, per tenant (encrypted and authenticated; a forged or foreign value is refused); set "
            "the same file on every daemon of a fleet sharing a store; empty = STATE_DIR/remote.key, created at "
            "the first start."},
    {SEC_DAEMON, "remote_allow_no_auth", T_BOOL, DMN(remote_allow_no_auth), .def = "no",
     .doc = "Run on a remote store with no AUTH password (remote_password_file empty). Its values stay sealed, "
            "but any local user can delete them or put back older ones: the daemon refuses to start on such a "
            "store unless this says yes."},
    {SEC_DAEMON, "remote_timeout", T_DURATION, DMN(remote_timeout_ms), .imin = 10, .imax = 60 * SEC,
     .def = "2s",
     .doc = "Longest wait for the remote store per connect and per command; a save or restore that "
            "meets a dead store fails after this long instead of hanging."},
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
    {SEC_POLICY, "trace_every", T_U32, POL(trace_every), .imin = 1, .imax = CKV_ATTN_HISTORY,
     .reload = true, .def = "4",
     .doc = "Record every Nth round (<= 8, so the attention rings cover the rounds between); a "
            "32K-token round costs about 90 ms and 2.6 MB."},
    {SEC_POLICY, "trace_max_bytes", T_SIZE, POL(trace_max_bytes), .imin = 0, .imax = PIB, .reload = true,
     .def = "1G", .doc = "Stop recording after this many bytes per open (logged once); 0 = no limit."},
    /* The judge's parameters: name, default, bounds and doc are the lifecycle
     * library's (lifecycle/policy.h), all reloaded on SIGHUP. */
    CKV_JUDGE_PARAM_LIST(POLICY_PARAM_ROW_)

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
            "and recycles before refusing. 0 = an equal share of what [daemon] memory leaves after "
            "the tenants with a quota. Its arena (the quota plus headroom) comes out of [daemon] "
            "memory; a quota larger than what is left is cut to fit."},
    {SEC_TENANT, "high_water", T_DOUBLE, TEN(high_water), .dmin = 0, .dmax = 1, .reload = true, .def = "0",
     .doc = "Fraction of quota (e.g. 0.9) above which the disk tier moves this tenant's coldest "
            "sessions to disk in the background, before an append needs the room, so appends "
            "rarely wait for a move. Needs the disk tier ([daemon] disk_memory); the sessions that "
            "may go are those memory pressure may move (docs/tiers.md). 0 = off: moves start only "
            "when the quota is short."},
    {SEC_TENANT, "quota_host", T_SIZE, TEN(quota_host), .imin = 0, .imax = PIB, .reload = true,
     .def = "0",
     .doc = "Bytes in the host-memory tier; 0 = no cap of its own. The host tier is not implemented "
            "yet: the daemon warns at start when this is set, and it limits nothing."},
    {SEC_TENANT, "quota_disk", T_SIZE, TEN(quota_disk), .imin = 0, .imax = PIB, .reload = true,
     .def = "0",
     .doc = "Bytes of this tenant's files in the state directory: its snapshots, autosaves and "
            "disk-tier files together. A save, autosave or move to disk that would pass it is "
            "refused before any byte is written (SaveSession answers CKV_ERR_QUOTA with the "
            "numbers; the others stay in memory, logged and counted); a file that replaces an "
            "older copy counts its growth only. 0 = no cap."},
    {SEC_TENANT, "max_snapshots", T_U32, TEN(max_snapshots), .imin = 0, .imax = 100000000,
     .reload = true, .def = "10000",
     .doc = "Snapshots this tenant may keep in the state directory; a save under a new name "
            "beyond it is refused with CKV_ERR_QUOTA (saving over an existing name is not). "
            "0 = no limit."},
    {SEC_TENANT, "policies", T_POLICIES, TEN(policies), .reload = true, .def = "all",
     .doc = "Policies this tenant's sessions may choose (names or all)."},
    {SEC_TENANT, "default_policy", T_ENUM, TEN(default_policy), .enums = tenant_policy_enum,
     .reload = true, .def = "inherit",
     .doc = "Policy of this tenant's sessions that name none; inherit = [policy] default. Must be "
            "in policies."},
    {SEC_TENANT, "max_sessions", T_U32, TEN(max_sessions), .imin = 0, .imax = 1000000,
     .reload = true, .def = "0",
     .doc = "Open sessions of this tenant; 0 = [daemon] max_sessions."},
    {SEC_TENANT, "max_clients", T_U32, TEN(max_clients), .imin = 0, .imax = 65536,
     .reload = true, .def = "0",
     .doc = "Attached clients of this tenant, so that one tenant cannot take every slot; 0 = an "
            "equal share of [daemon] max_clients among the tenants (at least 1). [daemon] "
            "max_clients stays the ceiling of all tenants together."},
};

const size_t ckv_cfg_n_keys = sizeof ckv_cfg_keys / sizeof ckv_cfg_keys[0];

const char *const ckv_cfg_section_names[] = {
    [SEC_DAEMON] = "daemon", [SEC_POLICY] = "policy", [SEC_TENANT] = "tenant.NAME"};

const config_key *ckv_cfg_find_key(section_kind sec, const char *key) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (ckv_cfg_keys[i].section == sec && strcmp(ckv_cfg_keys[i].key, key) == 0)
      return &ckv_cfg_keys[i];
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* String validators (run on non-empty values)                                */

static int check_endpoint(const char *v, char *err, size_t errlen) {
  if (strncmp(v, "ipc://", 6) == 0 || strncmp(v, "tcp://", 6) == 0) return CKV_OK;
  ckv_cfg_seterr(err, errlen, "'%s' is not a ZeroMQ endpoint (ipc://PATH or tcp://HOST:PORT)", v);
  return CKV_ERR_INVALID;
}

static int check_abs_path(const char *v, char *err, size_t errlen) {
  if (v[0] == '/') return CKV_OK;
  ckv_cfg_seterr(err, errlen, "'%s' is not an absolute path", v);
  return CKV_ERR_INVALID;
}

int ckv_cfg_check_unix_path(const char *v, char *err, size_t errlen) {
  if (check_abs_path(v, err, errlen) < 0) return CKV_ERR_INVALID;
  if (strlen(v) >= 108) { /* sizeof(sun_path) on Linux */
    ckv_cfg_seterr(err, errlen, "'%s' is longer than a unix socket path may be (107 bytes)", v);
    return CKV_ERR_INVALID;
  }
  return CKV_OK;
}

static int check_port(const char *p) {
  const char *end;
  uint64_t port;
  if (ckv_cfg_parse_digits(p, &end, &port) < 0 || *end != '\0' || port < 1 || port > 65535)
    return CKV_ERR_INVALID;
  return CKV_OK;
}

static int check_host_port(const char *v, char *err, size_t errlen) {
  const char *colon = strrchr(v, ':');
  if (colon && colon != v && check_port(colon + 1) == CKV_OK) return CKV_OK;
  ckv_cfg_seterr(err, errlen, "'%s' is not HOST:PORT (port 1..65535)", v);
  return CKV_ERR_INVALID;
}

static int check_remote_url(const char *v, char *err, size_t errlen) {
  ckv_remote_url u;
  char why[512];
  if (ckv_remote_url_parse(v, &u, why, sizeof why) == CKV_OK) return CKV_OK;
  ckv_cfg_seterr(err, errlen, "%s", why);
  return CKV_ERR_INVALID;
}

static int check_tcp_endpoint(const char *v, char *err, size_t errlen) {
  if (strncmp(v, "tcp://", 6) == 0 && check_host_port(v + 6, NULL, 0) == CKV_OK) return CKV_OK;
  ckv_cfg_seterr(err, errlen, "'%s' is not a tcp://HOST:PORT endpoint", v);
  return CKV_ERR_INVALID;
}

static int check_z85_key(const char *v, char *err, size_t errlen) {
  static const char z85[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (strlen(v) == 40 && strspn(v, z85) == 40) return CKV_OK;
  ckv_cfg_seterr(err, errlen, "not a CURVE key (40 Z85 characters)");
  return CKV_ERR_INVALID;
}
