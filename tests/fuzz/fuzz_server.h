/* tests/fuzz/fuzz_server.h - an in-process commitkvd server for the fuzz
 * targets: the daemon's defaults (ckv_config_init_defaults), sockets bound in
 * a fresh temporary directory (never polled: the target calls the handlers
 * the loop would call), the host backend, a synchronous compressor, metrics
 * off, and every peer mapped by `resolve`. */
#ifndef CKV_TESTS_FUZZ_SERVER_H
#define CKV_TESTS_FUZZ_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "lifecycle/judge.h"
#include "daemon/server.h"

typedef struct ckv_fuzz_server {
  ckv_server *server;
  ckv_judge_params policy;
  char dir[64], socket[128], attach[128];
} ckv_fuzz_server;

/* Aborts on failure (a broken harness is not a finding to keep). */
void ckv_fuzz_server_start(ckv_fuzz_server *f, const char *name, ckv_tenant_resolver resolve, void *ctx);
/* One attached client of tenant t, as ckv_attach_serve makes it (no attach
 * socket: attach_fd -1), registered in the server's connections. */
ckv_conn *ckv_fuzz_server_conn(ckv_fuzz_server *f, ckv_tenant *t, bool admin);
/* Open descriptors of this process (/proc/self/fd). */
int ckv_fuzz_open_fds(void);
/* Lists them on stderr (what a descriptor check that failed found). */
void ckv_fuzz_print_fds(void);

#endif
