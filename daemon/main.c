/* main.c - commitkvd: flags, configuration, systemd notification, the loop.
 *
 * Runs in the foreground (systemd style).  Configuration comes from the INI
 * file (--config) with the flags applied over it; --check-config validates a
 * file and prints the effective configuration. */
#include "daemon/server.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "daemon/attach.h"
#include "daemon/backend.h"
#include "daemon/config.h"
#include "lifecycle/judge.h"
#include "lifecycle/mlp.h"
#include "lifecycle/trace.h"
#include "persist/remote.h"
#include "persist/seal.h"
#include "persist/service.h"
#include "persist/warm.h"
#include "store/blockmem.h"
#include "store/tenant.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: commitkvd [options]\n"
          "  --config FILE         INI configuration (default: none; /etc/commitkv/commitkvd.conf in packages)\n"
          "  --socket ENDPOINT     ZeroMQ control endpoint (default ipc://$RUNTIME_DIRECTORY/commitkvd.sock)\n"
          "  --attach-socket PATH  unix socket for attach and fd passing (default beside the control socket)\n"
          "  --backend auto|host|cuda\n"
          "  --device N            CUDA device ordinal (backend cuda/auto)\n"
          "  --memory SIZE         KV memory for all tenants together, e.g. 4G\n"
          "  --state-dir DIR       snapshots and disk tier\n"
          "  --set SECTION.KEY=VALUE  any configuration key (repeatable)\n"
          "  --check-config FILE   validate FILE, print the effective configuration, exit\n"
          "  --help-config         print every configuration key with its default and meaning\n"
          "  --print-default-config  print the documented default configuration file\n"
          "  --version\n");
}

#define CKV_MAX_FLAGS 64

typedef struct app {
  ckv_config cfg;
  ckv_judge_params policy; /* what new sessions start from; refreshed on SIGHUP */
  ckv_mlp *mlp;
  ckv_mlp **old_mlps; /* weights replaced by a reload: sessions may still use them */
  size_t n_old_mlps;
  ckv_trace *trace;
  const char *config_path;
  ckv_server *server;
  bool notify;
  /* The command line's keys, applied over the file at start and on reload:
   * flags win over the file both times. */
  struct app_flag {
    char section[8 + CKV_TENANT_NAME_MAX], key[64], value[1024];
  } flags[CKV_MAX_FLAGS];
  size_t n_flags;
} app;

/* What the server needs of a configured tenant, its shares of the daemon's
 * memory and clients included. */
static void tenant_spec(const ckv_config *cfg, const ckv_tenant_config *t, ckv_tenant_spec *ret) {
  ret->name = t->name;
  ret->quota_bytes = t->quota;
  ret->arena_bytes = ckv_tenant_memory_share(cfg, t);
  ret->max_sessions = t->max_sessions;
  ret->max_clients = ckv_tenant_max_clients(cfg, t);
  ret->quota_disk = t->quota_disk;
  ret->high_water = t->high_water;
  ret->max_snapshots = t->max_snapshots;
  ret->policies = t->policies;
  ret->default_policy = t->default_policy;
}

static bool resolve_tenant(void *ctx, uint32_t uid, uint32_t gid, ckv_tenant_spec *ret) {
  app *a = ctx;
  const ckv_tenant_config *t = ckv_config_tenant_for(&a->cfg, uid, gid);
  if (!t) return false;
  tenant_spec(&a->cfg, t, ret);
  return true;
}

/* [policy] -> the judge's parameters (and the mlp judge's weights). */
static int policy_from_config(app *a, char *err, size_t errlen) {
  const ckv_policy_params *p = &a->cfg.policy;
  ckv_judge_params j;
  ckv_config_judge_params(p, &j);
  ckv_mlp *mlp = NULL;
  if (p->judge == CKV_JUDGE_MLP) {
    if (!p->mlp_weights[0]) {
      snprintf(err, errlen, "[policy] judge = mlp needs mlp_weights");
      return CKV_ERR_INVALID;
    }
    int r = ckv_mlp_load(p->mlp_weights, &mlp, err, errlen);
    if (r < 0) return r;
  }
  /* Sessions keep a pointer to the weights: the old ones stay alive until exit. */
  if (mlp && a->mlp) {
    ckv_mlp **n = realloc(a->old_mlps, (a->n_old_mlps + 1) * sizeof(*n));
    if (n) {
      a->old_mlps = n;
      a->old_mlps[a->n_old_mlps++] = a->mlp;
    }
  }
  j.mlp = mlp ? mlp : a->mlp;
  if (mlp) a->mlp = mlp;
  if (p->judge != CKV_JUDGE_MLP) j.mlp = NULL;
  a->policy = j;
  /* training traces: reopened on every (re)load */
  a->trace = ckv_trace_close(a->trace);
  if (p->trace[0]) {
    int r = ckv_trace_open(p->trace, p->trace_every, p->trace_max_bytes, &a->trace, err, errlen);
    if (r < 0) return r;
  }
  if (a->server) a->server->trace = a->trace;
  return CKV_OK;
}

static void on_ready(void *ctx) {
  app *a = ctx;
  if (a->notify) sd_notify(0, "READY=1\nSTATUS=serving");
}

/* One warning per change a reload cannot apply. */
static void warn_restart(void *ctx, const char *section, const char *key, const char *note) {
  const char *path = ctx;
  if (key)
    ckv_log(CKV_LOG_WARNING, "reload-restart", NULL, NULL,
            "%s: %s.%s changed, but it needs a restart; keeping the old value", path, section, key);
  else
    ckv_log(CKV_LOG_WARNING, "reload-restart", NULL, NULL,
            "%s: [%s] %s, but tenants are added and removed by a restart; keeping the old tenants", path,
            section, note);
}

static void reload(app *a) {
  if (!a->config_path) return;
  ckv_config fresh;
  ckv_config_init_defaults(&fresh);
  char err[512];
  int r = ckv_config_load_file(&fresh, a->config_path, err, sizeof(err));
  for (size_t i = 0; r == 0 && i < a->n_flags; i++)
    r = ckv_config_set(&fresh, a->flags[i].section, a->flags[i].key, a->flags[i].value, err, sizeof(err));
  if (r == 0) r = ckv_config_finalize(&fresh, err, sizeof(err));
  /* As at start: a file without tenants serves the daemon's user and root. */
  if (r == 0 && ckv_config_ensure_default_tenant(&fresh, (uint32_t)geteuid()) < 0) {
    snprintf(err, sizeof(err), "out of memory");
    r = -ENOMEM;
  }
  if (r < 0) {
    ckv_log(CKV_LOG_ERROR, "reload-failed", NULL, NULL, "keeping the running configuration: %s", err);
  } else {
    ckv_config_reload_changes(&a->cfg, &fresh, warn_restart, (void *)a->config_path);
    ckv_config_apply_reload(&a->cfg, &fresh);
    ckv_log_set_level(a->cfg.log_level);
    if (policy_from_config(a, err, sizeof(err)) < 0)
      ckv_log(CKV_LOG_ERROR, "reload-failed", NULL, NULL, "policy: %s", err);
    /* Live tenants take their new quotas and limits now. */
    for (size_t i = 0; a->server && i < a->server->store.n_tenants; i++) {
      ckv_tenant *t = a->server->store.tenants[i];
      const ckv_tenant_config *tc = ckv_config_tenant_by_name(&a->cfg, t->name);
      if (!tc) continue;
      ckv_tenant_spec spec = {.default_policy = -1};
      tenant_spec(&a->cfg, tc, &spec);
      ckv_attach_retune_tenant(a->server, t, &spec);
    }
    ckv_log(CKV_LOG_NOTICE, "reload", NULL, NULL, "configuration reloaded from %s", a->config_path);
  }
  ckv_config_done(&fresh);
}

static void on_tick(void *ctx, const char *status) {
  app *a = ctx;
  if (a->server && ckv_server_take_reload(a->server)) {
    if (a->notify) sd_notify(0, "RELOADING=1");
    reload(a);
    if (a->notify) sd_notify(0, "READY=1");
  }
  if (a->notify) sd_notifyf(0, "WATCHDOG=1\nSTATUS=%s", status);
}

/* The remote store of `remote` (remote.h), or *ret NULL when none is
 * configured.  A store that does not answer yet is a warning, not a failure:
 * it is asked again on every save and restore, and KV serving must not wait
 * for it. */
static int open_remote(const ckv_config *cfg, ckv_remote **ret, char *err, size_t errlen) {
  *ret = NULL;
  if (!cfg->remote[0]) return 0;
  char *password = NULL;
  int r = 0;
  if (cfg->remote_password_file[0] &&
      (r = ckv_remote_read_password(cfg->remote_password_file, &password, err, errlen)) < 0)
    return r;
  bool with_auth = password != NULL;
  if (!with_auth && !cfg->remote_allow_no_auth) {
    snprintf(err, errlen,
             "remote store %s: no AUTH password (remote_password_file): any local user could delete the sessions "
             "stored there or put back older ones; set remote_password_file, or remote_allow_no_auth = yes to run "
             "so anyway",
             cfg->remote);
    return CKV_ERR_AUTH;
  }
  r = ckv_remote_new(cfg->remote, password, (uint32_t)cfg->remote_timeout_ms, ret, err, errlen);
  if (password) {
    memset(password, 0, strlen(password));
    free(password);
  }
  if (r < 0) return r;
  ckv_seal *seal = NULL;
  if ((r = ckv_seal_open(cfg->remote_key_file, cfg->state_dir, &seal, err, errlen)) < 0) {
    *ret = ckv_remote_free(*ret);
    return r;
  }
  ckv_remote_set_seal(*ret, seal);
  if (!with_auth)
    ckv_log(CKV_LOG_WARNING, "remote-no-auth", NULL, NULL,
            "remote store %s has no AUTH password (remote_allow_no_auth = yes): its values are sealed (nobody can "
            "read or forge them), but any local user can delete them or put back older ones",
            cfg->remote);
  char why[512];
  if (ckv_remote_ping(*ret, why, sizeof why) < 0)
    ckv_log(CKV_LOG_WARNING, "remote-unavailable", NULL, NULL,
            "%s; saves keep their local snapshot and say the push failed until it answers", why);
  else
    ckv_log(CKV_LOG_NOTICE, "remote", NULL, NULL, "remote store %s answers%s; snapshots go to it too",
            ckv_remote_url_text(*ret), password ? " (AUTH)" : "");
  return 0;
}

static int apply_flag(app *a, const char *section, const char *key, const char *value) {
  char err[512];
  int r = ckv_config_set(&a->cfg, section, key, value, err, sizeof(err));
  if (r < 0) {
    fprintf(stderr, "commitkvd: --%s: %s\n", key, err);
    return r;
  }
  /* Kept, so that a reload applies the flags over the file again. */
  if (a->n_flags < CKV_MAX_FLAGS) {
    struct app_flag *f = &a->flags[a->n_flags++];
    snprintf(f->section, sizeof(f->section), "%s", section);
    snprintf(f->key, sizeof(f->key), "%s", key);
    snprintf(f->value, sizeof(f->value), "%s", value);
  }
  return r;
}

int main(int argc, char **argv) {
  static app a;
  ckv_config_init_defaults(&a.cfg);
  ckv_log_init("commitkvd", CKV_LOG_TARGET_AUTO);
  enum { OPT_ATTACH = 1000, OPT_SET, OPT_CHECK, OPT_HELP_CONFIG, OPT_VERSION, OPT_STATE, OPT_DEFAULT_CONFIG, OPT_DEVICE };
  static const struct option opts[] = {
      {"config", required_argument, 0, 'c'},    {"socket", required_argument, 0, 's'},
      {"attach-socket", required_argument, 0, OPT_ATTACH}, {"backend", required_argument, 0, 'b'},
      {"memory", required_argument, 0, 'm'},    {"device", required_argument, 0, OPT_DEVICE},    {"state-dir", required_argument, 0, OPT_STATE},
      {"set", required_argument, 0, OPT_SET},   {"check-config", required_argument, 0, OPT_CHECK},
      {"help-config", no_argument, 0, OPT_HELP_CONFIG}, {"version", no_argument, 0, OPT_VERSION},
      {"print-default-config", no_argument, 0, OPT_DEFAULT_CONFIG},
      {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
  /* First pass: the config file, so flags apply over it whatever their order. */
  int o;
  while ((o = getopt_long(argc, argv, "c:s:b:m:h", opts, NULL)) != -1) {
    if (o == 'c') a.config_path = optarg;
    if (o == '?') {
      usage(stderr);
      return 2;
    }
  }
  char err[512];
  if (a.config_path) {
    int r = ckv_config_load_file(&a.cfg, a.config_path, err, sizeof(err));
    if (r < 0) {
      fprintf(stderr, "commitkvd: %s\n", err);
      return 1;
    }
  }
  optind = 1;
  while ((o = getopt_long(argc, argv, "c:s:b:m:h", opts, NULL)) != -1) {
    int r = 0;
    switch (o) {
      case 'c': break;
      case 's': r = apply_flag(&a, "daemon", "socket", optarg); break;
      case OPT_ATTACH: r = apply_flag(&a, "daemon", "attach_socket", optarg); break;
      case 'b': r = apply_flag(&a, "daemon", "backend", optarg); break;
      case 'm': r = apply_flag(&a, "daemon", "memory", optarg); break;
      case OPT_STATE: r = apply_flag(&a, "daemon", "state_dir", optarg); break;
      case OPT_DEVICE: r = apply_flag(&a, "daemon", "device", optarg); break;
      case OPT_SET: {
        char buf[1024];
        snprintf(buf, sizeof(buf), "%s", optarg);
        /* the key is after the last '.' before '=' (sections may hold dots: tenant.NAME) */
        char *eq = strchr(buf, '=');
        char *dot = NULL;
        if (eq) {
          *eq = 0;
          dot = strrchr(buf, '.');
        }
        if (!eq || !dot) {
          fprintf(stderr, "commitkvd: --set wants SECTION.KEY=VALUE, got '%s'\n", optarg);
          return 2;
        }
        *dot = 0;
        r = apply_flag(&a, buf, dot + 1, eq + 1);
        break;
      }
      case OPT_CHECK: {
        ckv_config chk;
        ckv_config_init_defaults(&chk);
        int rc = ckv_config_load_file(&chk, optarg, err, sizeof(err));
        if (rc == 0) rc = ckv_config_finalize(&chk, err, sizeof(err));
        if (rc < 0) {
          fprintf(stderr, "commitkvd: %s\n", err);
          ckv_config_done(&chk);
          return 1;
        }
        ckv_config_write(&chk, stdout);
        ckv_config_done(&chk);
        return 0;
      }
      case OPT_HELP_CONFIG: return ckv_config_write_docs(stdout, CKV_CONFIG_DOC_MARKDOWN) < 0 ? 1 : 0;
      case OPT_DEFAULT_CONFIG: return ckv_config_write_template(stdout) < 0 ? 1 : 0;
      case OPT_VERSION: printf("commitkvd %s (protocol %u)\n", CKV_VERSION_STRING, CKV_PROTOCOL_VERSION); return 0;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
    if (r < 0) return 2;
  }
  if (ckv_config_finalize(&a.cfg, err, sizeof(err)) < 0) {
    fprintf(stderr, "commitkvd: %s\n", err);
    return 1;
  }
  /* Keys the configuration knows but this build does not serve yet: refuse
   * rather than pretend (a remote endpoint that silently does nothing is worse
   * than a daemon that says so). */
  if (a.cfg.remote_tcp[0]) {
    fprintf(stderr, "commitkvd: remote_tcp is set, but the CURVE remote control endpoint is not implemented in this "
                    "build\n");
    ckv_config_done(&a.cfg);
    return 1;
  }
  if (a.cfg.host_memory)
    ckv_log(CKV_LOG_WARNING, "tiers", NULL, NULL,
            "host_memory is set, but the host tier is not implemented yet (on the host backend the primary tier is "
            "host memory already); the disk tier is disk_memory and disk_idle");
  for (size_t i = 0; i < a.cfg.n_tenants; i++)
    if (a.cfg.tenants[i].quota_host)
      ckv_log(CKV_LOG_WARNING, "tiers", a.cfg.tenants[i].name, NULL,
              "quota_host is set, but the host tier it caps is not implemented yet: it limits nothing (quota "
              "caps the tenant's memory, quota_disk its files)");
  if (a.cfg.disk_idle_ms && !a.cfg.disk_memory)
    ckv_log(CKV_LOG_WARNING, "tiers", NULL, NULL, "disk_idle is set but disk_memory is 0: the disk tier is off");
  else if (a.cfg.disk_memory && !a.cfg.disk_idle_ms && !a.cfg.disk_pressure)
    ckv_log(CKV_LOG_WARNING, "tiers", NULL, NULL,
            "disk_memory is set but disk_idle is 0 and disk_pressure off: no session ever moves down");
  if (a.cfg.remote_idle_ms && (!a.cfg.remote[0] || !a.cfg.disk_memory))
    ckv_log(CKV_LOG_WARNING, "tiers", NULL, NULL, "remote_idle is set but %s: the remote tier is off",
            !a.cfg.remote[0] ? "no remote store is (remote)" : "the disk tier is off (disk_memory is 0)");
  ckv_config_ensure_default_tenant(&a.cfg, (uint32_t)geteuid());
  ckv_log_set_level(a.cfg.log_level);
  if (policy_from_config(&a, err, sizeof(err)) < 0) {
    fprintf(stderr, "commitkvd: %s\n", err);
    ckv_config_done(&a.cfg);
    return 1;
  }

  /* Arena backend: host, or CUDA on [daemon] device (auto: when one answers). */
  const ckv_arena_backend *arena_be = NULL;
  static char backend[16], reason[900];
  int br = ckv_backend_select(a.cfg.backend, a.cfg.device, &arena_be, backend, sizeof(backend), reason,
                              sizeof(reason));
  if (br < 0) {
    ckv_log(CKV_LOG_ERROR, "start-failed", NULL, NULL, "%s", reason);
    ckv_config_done(&a.cfg);
    return 1;
  }
  /* How the daemon writes arena memory: in place on the host; through
   * header shadows and CUDA kernels on a device (daemon/blockmem.h). */
  const ckv_blockmem *mem = &ckv_blockmem_host;
  if (strcmp(backend, "cuda") == 0) {
    mem = ckv_blockmem_cuda(a.cfg.device);
    if (!mem) { /* the arena came without the kernels: a broken build, say so */
      ckv_log(CKV_LOG_ERROR, "start-failed", NULL, NULL,
              "backend cuda: this commitkvd has the CUDA arena but not the CUDA kernels (build error)");
      ckv_config_done(&a.cfg);
      return 1;
    }
  }
  /* commitkvctl status shows it too: how block headers reach the memory. */
  size_t rl = strlen(reason);
  snprintf(reason + rl, sizeof(reason) - rl, " (block writes: %s)", mem->name);
  ckv_log(CKV_LOG_NOTICE, "backend", NULL, NULL, "%s: %s", backend, reason);
  ckv_remote *remote = NULL;
  if (open_remote(&a.cfg, &remote, err, sizeof(err)) < 0) {
    ckv_log(CKV_LOG_ERROR, "start-failed", NULL, NULL, "%s", err);
    ckv_config_done(&a.cfg);
    return 1;
  }
  ckv_server_options so = {
      .socket = a.cfg.socket,
      .attach_socket = a.cfg.attach_socket,
      .backend = backend,
      .backend_reason = reason,
      .mem = mem,
      .memory_bytes = a.cfg.memory,
      .state_dir = a.cfg.state_dir,
      .disk_idle_ms = a.cfg.disk_idle_ms,
      .disk_memory = a.cfg.disk_memory,
      .remote_idle_ms = a.cfg.remote_idle_ms,
      .disk_pressure = a.cfg.disk_pressure,
      .lease_ms = (uint32_t)a.cfg.lease_ms,
      .heartbeat_ms = (uint32_t)a.cfg.heartbeat_ms,
      .detach_keep_ms = a.cfg.detach_keep_ms,
      .autosave_ms = a.cfg.autosave_ms,
      .warm_journal_ms = a.cfg.warm_journal_ms,
      .warm_journal_delay_ms = a.cfg.warm_journal_delay_ms,
      .max_clients = a.cfg.max_clients,
      .max_sessions = a.cfg.max_sessions,
      .max_message = a.cfg.max_message,
      .max_tokens_per_session = a.cfg.max_tokens_per_session,
      .max_append = 1u << 20,
      .draft_block_tokens = a.cfg.draft_block_tokens,
      .commit_block_tokens = a.cfg.commit_block_tokens,
      .compress_threads = a.cfg.compress_threads,
      .compress_queue = a.cfg.compress_queue,
      .metrics = a.cfg.metrics,
      .remote = remote,
      .policy = &a.policy,
      .resolve_tenant = resolve_tenant,
      .resolve_ctx = &a,
      .on_ready = on_ready,
      .on_tick = on_tick,
      .notify_ctx = &a,
      .tick_ms = 1000,
  };
  uint64_t wd_usec = 0;
  a.notify = getenv("NOTIFY_SOCKET") != NULL;
  if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec / 2000 < so.tick_ms) so.tick_ms = (uint32_t)(wd_usec / 2000);
  if (so.tick_ms == 0) so.tick_ms = 1;

  int r = ckv_server_new(&so, &a.server, err, sizeof(err));
  if (r < 0) {
    ckv_log(CKV_LOG_ERROR, "start-failed", NULL, NULL, "%s", err);
    if (a.notify) sd_notifyf(0, "STATUS=failed: %s\nERRNO=%d", err, r < 0 && r > -4096 ? -r : 0);
    ckv_remote_free(remote);
    ckv_config_done(&a.cfg);
    return 1;
  }
  a.server->trace = a.trace;
  ckv_persist_warm_start(&a.server->persist); /* arenas and sessions a warm restart kept (warm.h), journaled anew */
  r = ckv_server_run(a.server);
  if (r == 0) ckv_persist_warm_stop(&a.server->persist); /* a clean stop hands the arenas on */
  if (a.notify) sd_notify(0, "STOPPING=1\nSTATUS=draining");
  a.server = ckv_server_free(a.server);
  remote = ckv_remote_free(remote); /* after the server: the drain may still save */
  a.mlp = ckv_mlp_free(a.mlp);
  for (size_t i = 0; i < a.n_old_mlps; i++) ckv_mlp_free(a.old_mlps[i]);
  free(a.old_mlps);
  a.trace = ckv_trace_close(a.trace);
  ckv_config_done(&a.cfg);
  return r == 0 ? 0 : 1;
}
