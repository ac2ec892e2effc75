/* testutil.h - helpers shared by the test suites: temporary directories,
 * starting and stopping a real commitkvd, running real worker processes and
 * commitkvctl.  Every process is real; nothing here mocks the daemon. */
#ifndef CKV_TESTUTIL_H
#define CKV_TESTUTIL_H

#include <stddef.h>
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

/* Milliseconds on the monotonic clock. */
long long ckv_test_now_ms(void);

#endif
