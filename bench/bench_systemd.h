/* bench_systemd.h - commitkvd as a unit of a private `systemd --user`
 * (Type=notify, FileDescriptorStoreMax=64, Restart=on-failure,
 * RestartSec=100ms) for benchmarks that kill it and want the warm restart
 * (docs/warm-restart.md).  Needs root (a mount namespace of its own), systemd
 * and systemctl; without them start says why and the bench skips. */
#ifndef CKV_BENCH_SYSTEMD_H
#define CKV_BENCH_SYSTEMD_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct ckv_bench_sd {
  char dir[128];              /* set by the caller: an empty directory of its own, short */
  char daemon[PATH_MAX];      /* set by the caller: the commitkvd binary */
  const char *journal;        /* set by the caller or NULL: [daemon] warm_journal for the unit */
  char extra[1024];           /* set by the caller or empty: more commitkvd arguments */
  const char *exec_start_pre; /* set by the caller or NULL: a command the unit runs before every start of the
                                 daemon (ExecStartPre=) */
  const char *environment;    /* set by the caller or NULL: one more NAME=VALUE for the daemon (Environment=) */
  char xdg[160], cfg[160], state[160]; /* set by start: dir/xdg, dir/cfg, dir/state (the daemon's --state-dir) */
  char socket[192], attach[192], log[192]; /* the daemon's endpoints and log (every life appends to it) */
  char unit[64];              /* <prefix>-<pid>.service: concurrent runs never share a unit's cgroup */
  pid_t manager;
} ckv_bench_sd;

/* Starts the manager in e->dir and the unit.  0; 1 with `why` when no
 * private systemd can run here (the bench skips); -1 with `why` when one ran
 * but the unit did not start (stopped again). */
int ckv_bench_sd_start(ckv_bench_sd *e, const char *unit_prefix, char *why, size_t whylen);
/* The unit's main pid now, 0 when none. */
pid_t ckv_bench_sd_main_pid(const ckv_bench_sd *e);
/* `systemctl --user VERB <the unit>` against the private manager (VERB may
 * carry options: "is-active --quiet"); its exit status, -1 when it did not run. */
int ckv_bench_sd_ctl_unit(const ckv_bench_sd *e, const char *verb);
/* Waits until systemd restarted the unit after `old` died: a new main pid
 * and an attach socket that accepts.  The new pid, or -ETIMEDOUT. */
pid_t ckv_bench_sd_wait_restart(const ckv_bench_sd *e, pid_t old, int timeout_ms);
/* Stops the unit (SIGTERM: a clean stop) and the manager; a daemon that
 * outlives them is killed.  0; -1 when the stop failed; -2 when a daemon
 * outlived them (it was killed).  Accepts an e that never started. */
int ckv_bench_sd_stop(ckv_bench_sd *e);
/* Lines of the daemon's log (every life) that a sanitizer wrote ("ERROR: AddressSanitizer", "LeakSanitizer",
 * "runtime error:"): a daemon that aborted on one is restarted by systemd like a killed one, so the bench must
 * look.  Call after ckv_bench_sd_stop (leaks are reported at the clean exit). */
int ckv_bench_sd_sanitizer_reports(const ckv_bench_sd *e);
/* The last `max` (< 1024) bytes of a file, newlines and quotes blanked (for a
 * JSON reason), in a static buffer. */
const char *ckv_bench_file_tail(const char *path, size_t max);

#endif
