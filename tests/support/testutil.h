/* testutil.h - helpers shared by the test suites: temporary directories,
 * starting and stopping a real commitkvd, running real worker processes and
 * commitkvctl.  Every process is real; nothing here mocks the daemon. */
#ifndef CKV_TESTUTIL_H
#define CKV_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Directory of the built binaries (CKV_BIN_DIR, set by CTest; "build/bin" otherwise). */
const char *ckv_test_bin_dir(void);

/* mkdtemp under /tmp; aborts the test on failure.  Caller frees with ckv_test_rmdir. */
char *ckv_test_tmpdir(const char *prefix);
void ckv_test_rmdir(char *dir);

/* A commitkvd started for one test, in its own temporary directory. */
typedef struct ckv_test_daemon {
  pid_t pid;
  char *dir;             /* temporary directory (removed by stop) */
  char socket[300];      /* ipc://DIR/commitkvd.sock */
  char attach[300];      /* DIR/commitkvd.attach */
  char log[300];         /* DIR/commitkvd.log: the daemon's stderr */
} ckv_test_daemon;

/* Starts build/bin/commitkvd with --socket/--attach-socket in a new temporary
 * directory plus `extra` arguments (NULL-terminated array, may be NULL) plus
 * one --set per word of $CKV_TEST_DAEMON_SET, and
 * waits up to 5 s for the attach socket to appear.  Returns 0 or -1. */
int ckv_test_daemon_start(ckv_test_daemon *d, const char *const *extra);
/* SIGTERM, wait up to 5 s (then SIGKILL); returns the exit status (or -1 when
 * it had to be killed) and removes the directory. */
int ckv_test_daemon_stop(ckv_test_daemon *d);
/* True while the daemon process is still running. */
int ckv_test_daemon_alive(const ckv_test_daemon *d);

/* Spawns a program from the bin dir with argv (argv[0] = program name,
 * NULL-terminated); stdout/stderr go to `out_path` when not NULL.  Returns the pid. */
pid_t ckv_test_spawn(const char *const *argv, const char *out_path);
/* Waits for pid; returns its exit status, 128+signal when killed, -1 on timeout (it is then killed). */
int ckv_test_wait(pid_t pid, int timeout_ms);
/* Runs bin_dir/commitkv-bench with args (NULL-terminated, at most 30) and
 * TMPDIR=dir, stdout and stderr into dir/bench.out and dir/bench.err; waits up
 * to timeout_ms.  *ret_out / *ret_err (either may be NULL): the files' contents
 * (malloc'd, NULL if unreadable).  Returns the exit status as ckv_test_wait. */
int ckv_test_run_bench(const char *const *args, const char *dir, int timeout_ms, char **ret_out, char **ret_err);

/* A piece of a test run in a child process as another local user: it
 * fills `report` (zeroed, as many bytes as the caller asked for), which
 * comes back to the parent through a pipe. */
typedef void (*ckv_test_child_fn)(const void *ctx, void *report);

/* Forks a child that ignores SIGPIPE, drops to uid/gid (setgroups,
 * setresgid, setresuid; skipped when uid is 0) before it opens anything, so
 * SO_PEERCRED sees them, runs fn(ctx, report) and writes the report of
 * report_len bytes back.  Returns the pid, or -1 when the pipe or the fork
 * failed; *ret_fd is the pipe's end to read (ckv_test_collect closes it). */
pid_t ckv_test_fork_as(uid_t uid, gid_t gid, ckv_test_child_fn fn, const void *ctx, size_t report_len, int *ret_fd);

/* What came back from a child of ckv_test_fork_as. */
typedef struct ckv_test_child {
  int status;       /* ckv_test_wait's answer: 0 when the child exited 0 */
  int switch_errno; /* not 0: the child could not take the uid and fn did not run */
  size_t got;       /* bytes of the report that came back */
} ckv_test_child;

/* Reads the child's report into `report` (report_len bytes, zeroed first),
 * closes fd and waits up to timeout_ms for the child. */
ckv_test_child ckv_test_collect(pid_t pid, int fd, void *report, size_t report_len, int timeout_ms);

/* True when something accepts on the unix socket `path`: a SIGKILLed daemon
 * leaves its socket file behind, so the file existing proves nothing. */
int ckv_test_attach_accepts(const char *path);

/* Runs `commitkvctl --socket S ARGS...` and returns its stdout (malloc'd, NUL-terminated) or NULL. */
char *ckv_test_ctl(const ckv_test_daemon *d, const char *const *args);
/* Extracts an unsigned integer JSON field by dotted path ("bytes.total",
 * "arenas.0.bytes_used") from commitkvctl's JSON; returns 0 on success. */
int ckv_test_json_u64(const char *json, const char *path, unsigned long long *ret);

/* The whole file (malloc'd, NUL-terminated), or NULL when it cannot be read. */
char *ckv_test_read_file(const char *path);
/* The last `max` bytes of a file (malloc'd; never NULL: a file that cannot
 * be read gives a line saying so), for assertion messages. */
char *ckv_test_file_tail(const char *path, size_t max);

/* A deterministic K/V element for (position, layer, K or V, element), in
 * [-1, 1]: every 7th channel spans the whole range, the others half of it,
 * as real keys have channels of different ranges. */
float ckv_test_kv_value(size_t pos, uint32_t layer, uint32_t kv, uint32_t e);

/* Milliseconds on the monotonic clock. */
long long ckv_test_now_ms(void);

#endif
