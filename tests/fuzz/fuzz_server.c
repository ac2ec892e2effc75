/* tests/fuzz/fuzz_server.c - see fuzz_server.h. */
#include "fuzz_server.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "commitkv/status.h"
#include "daemon/config.h"
#include "common/log.h"
#include "common/strmap.h"
#include "store/tenant.h"
#include "fuzz.h"

void ckv_fuzz_server_start(ckv_fuzz_server *f, const char *name, ckv_tenant_resolver resolve, void *ctx) {
  memset(f, 0, sizeof(*f));
  ckv_log_init(name, CKV_LOG_TARGET_STDERR);
  ckv_log_set_level(getenv("CKV_FUZZ_VERBOSE") ? CKV_LOG_DEBUG : CKV_LOG_ERROR);
  snprintf(f->dir, sizeof(f->dir), "/tmp/ckv-%s-XXXXXX", name);
  CKV_FUZZ_CHECK(mkdtemp(f->dir), "mkdtemp %s", f->dir);
  snprintf(f->socket, sizeof(f->socket), "ipc://%s/d.sock", f->dir);
  snprintf(f->attach, sizeof(f->attach), "%s/attach.sock", f->dir);
  ckv_config cfg;
  ckv_config_init_defaults(&cfg);
  char err[256];
  CKV_FUZZ_CHECK(ckv_config_finalize(&cfg, err, sizeof(err)) == 0, "config: %s", err);
  ckv_config_judge_params(&cfg.policy, &f->policy);
  /* The sizes are cut so one input runs in milliseconds. */
  ckv_server_options so = {
      .socket = f->socket,
      .attach_socket = f->attach,
      .backend = "host",
      .backend_reason = "fuzz",
      .memory_bytes = 64u << 20,
      .state_dir = f->dir,
      .lease_ms = (uint32_t)cfg.lease_ms,
      .heartbeat_ms = (uint32_t)cfg.heartbeat_ms,
      .detach_keep_ms = cfg.detach_keep_ms,
      .max_clients = 8,
      .max_sessions = 8,
      .max_message = 256u << 10,
      .max_tokens_per_session = 16384,
      .max_append = 4096,
      .draft_block_tokens = cfg.draft_block_tokens,
      .commit_block_tokens = cfg.commit_block_tokens,
      .compress_threads = 0,
      .compress_queue = cfg.compress_queue,
      .metrics = "",
      .policy = &f->policy,
      .resolve_tenant = resolve,
      .resolve_ctx = ctx,
  };
  ckv_config_done(&cfg);
  int r = ckv_server_new(&so, &f->server, err, sizeof(err));
  CKV_FUZZ_CHECK(r == CKV_OK, "ckv_server_new: %s", err);
}

ckv_conn *ckv_fuzz_server_conn(ckv_fuzz_server *f, ckv_tenant *t, bool admin) {
  ckv_server *s = f->server;
  ckv_conn *c = calloc(1, sizeof(*c));
  CKV_FUZZ_CHECK(c, "calloc");
  for (size_t i = 0; i < CKV_KEY_BYTES; i++) c->key[i] = (uint8_t)(0x81 + i + 16 * s->next_conn_id);
  for (size_t i = 0; i < CKV_KEY_BYTES; i++) snprintf(c->keyhex + 2 * i, 3, "%02x", c->key[i]);
  c->id = ++s->next_conn_id;
  c->tenant = t;
  c->uid = admin ? 0 : 4242;
  c->gid = 4242;
  c->pid = (uint32_t)getpid();
  c->admin = admin;
  c->attach_fd = -1;
  c->last_seen_ms = ckv_now_ms();
  snprintf(c->name, sizeof(c->name), "fuzz-%llu", (unsigned long long)c->id);
  CKV_FUZZ_CHECK(ckv_strmap_put(s->conns, c->keyhex, c) == 0, "strmap_put");
  if (t) t->n_clients++;
  return c;
}

int ckv_fuzz_open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  CKV_FUZZ_CHECK(d, "opendir /proc/self/fd");
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

void ckv_fuzz_print_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[300], target[256];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = 0;
    fprintf(stderr, "  fd %s -> %s\n", e->d_name, target);
  }
  closedir(d);
}
