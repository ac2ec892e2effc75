/* bench_daemon.h - what every benchmark needs to run a real commitkvd: find
 * the binary beside commitkv-bench, start it on the host backend in a
 * temporary directory, stop it with SIGTERM and check it drained, and remove
 * the directory.  Diagnostics go to stderr; nothing here exits. */
#ifndef CKV_BENCH_DAEMON_H
#define CKV_BENCH_DAEMON_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CKV_BENCH_DAEMON_START_MS 10000
#define CKV_BENCH_DAEMON_STOP_MS 10000

typedef struct ckv_bench_daemon {
  pid_t pid;
  bool log_shown; /* its log's tail went to stderr already */
  const char *backend; /* --backend for start; NULL: host */
  const char *sets[16]; /* extra "--set KEY=VALUE" for start (e.g. "daemon.disk_idle=1s"); NULL ends */
  char socket[PATH_MAX], attach[PATH_MAX], log[PATH_MAX];
} ckv_bench_daemon;

/* PATH of program `prog` beside this binary (/proc/self/exe). 0 or -errno. */
int ckv_bench_beside_self(const char *prog, char *buf, size_t len);
/* `given`, or commitkvd beside this binary; checks it is executable. 0 or -errno. */
int ckv_bench_find_daemon(const char *given, char *buf, size_t len);
/* Starts `path` with --backend d->backend (host when NULL) --memory `memory` in `dir` and waits for
 * its attach socket.  A killed bench leaves no daemon behind (PDEATHSIG).
 * 0 or -errno (the log's tail is printed on failure). */
int ckv_bench_daemon_start(ckv_bench_daemon *d, const char *path, const char *dir, const char *memory);
/* SIGTERM, then the exit status: 0 when it drained and exited cleanly. */
int ckv_bench_daemon_stop(ckv_bench_daemon *d);
/* Prints the end of the daemon's log once, to explain a failure. */
void ckv_bench_daemon_log_tail(ckv_bench_daemon *d);
/* The daemon-wide compressor figures of a Stats request over client `c`:
 * tokens whose bytes do not match their state yet, and compressor jobs
 * waiting or running.  Either pointer may be NULL.  0 or the RPC's status. */
typedef struct ckv_client ckv_client;
int ckv_bench_compress_stats(ckv_client *c, uint64_t *ret_pending_tokens, uint64_t *ret_queue, uint64_t *ret_busy_us);

/* rm -rf dir (no-op for NULL or ""). */
void ckv_bench_rm_tree(const char *dir);

#endif
