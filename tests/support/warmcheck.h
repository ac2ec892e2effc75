/* warmcheck.h - commitkvd as a unit of a private `systemd --user`, and the
 * worker's side of a warm restart (issue 15, docs/warm-restart.md): the
 * scaffolding that test_warm_restart (clean restarts, the fd store, the
 * journal at a clean stop) and test_warm_kill9 (kill -9, the journal log)
 * share.
 *
 * ckv_warm_start starts, through bench/bench_systemd.h (the private manager
 * of commitkv-bench failover and soak: tests may use bench/, never the
 * reverse), a private user manager (`systemd --user`) in a mount namespace
 * of its own, where /run/systemd/system exists (systemd 252
 * refuses --user without it, and PID 1 of a container is no systemd), with
 * XDG_RUNTIME_DIR and XDG_CONFIG_HOME in a temporary directory, and runs
 * commitkvd as a unit there (Type=notify, FileDescriptorStoreMax=,
 * Restart=on-failure), driven with `systemctl --user` over the manager's
 * private socket (systemd-run needs a D-Bus session bus).  The worker is
 * libcommitkv in the test's process.  Where no systemd can run (not root, no
 * systemd or systemctl binary, no mount namespace), SKIP_WITHOUT_SYSTEMD
 * prints "SKIPPED: <reason>" and skips the test. */
#ifndef CKV_TEST_WARMCHECK_H
#define CKV_TEST_WARMCHECK_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench/bench_systemd.h"
#include "commitkv/commitkv.h"
#include "testutil.h"

typedef struct ckv_arena ckv_arena;

#define CKV_WARM_DEADLINE_MS 30000
/* The geometry of every session of the warm suites (ckv_warm_geom). */
#define CKV_WARM_LAYERS 2u
#define CKV_WARM_HEADS 2u
#define CKV_WARM_DIM 32u
/* Tokens a round appends. */
#define CKV_WARM_PER_ROUND 24u

extern const ckv_geometry ckv_warm_geom;

/* ---- a private systemd user manager ---------------------------------- */

typedef struct ckv_warm_env {
  char *dir;               /* the test's temporary directory (removed by ckv_warm_stop) */
  ckv_bench_sd sd;         /* the manager and the unit in dir; sd.state is the daemon's --state-dir */
  char damage_script[400]; /* dir/damage.sh, the unit's ExecStartPre (ckv_warm_request_damage) */
  ckv_test_daemon d;       /* socket, attach, log of the unit's daemon; dir = the state dir */
} ckv_warm_env;

/* More environment for the unit's daemon, e.g.
 * "CKV_TEST_WARM_COMPACT_BYTES=1"; set before ckv_warm_start. */
void ckv_warm_set_unit_env(const char *env);
/* Starts the manager and the unit (one per test process: its name carries the
 * pid); false (with why) when no manager can run here.  `config`: text of a
 * commitkvd.conf for the unit, or NULL.  Fails the test when a manager ran
 * but the unit did not start.  The suite's fini (ckv_warm_suite_fini) stops
 * what a failed assertion left running. */
bool ckv_warm_start(ckv_warm_env *e, const char *config, char *why, size_t whylen);
/* Stops the unit and the manager, removes e->dir; fails the test (expect)
 * when a commitkvd of this test outlived them. */
void ckv_warm_stop(ckv_warm_env *e);
/* The suites' .fini: stops a manager still running, then the leak check. */
void ckv_warm_suite_fini(void);
/* `systemctl --user VERB <this test's unit>`; its exit status. */
int ckv_warm_ctl_unit(const ckv_warm_env *e, const char *verb);
/* The unit's main pid, 0 when none. */
long ckv_warm_main_pid(const ckv_warm_env *e);
/* Waits until systemd restarted the unit (a new main pid that accepts
 * attaches) and sets e->d.pid; fails the test at the deadline. */
void ckv_warm_wait_restarted(ckv_warm_env *e, long old_pid);
/* Asks the unit's ExecStartPre to damage the journal once, between the old
 * daemon's stop and the new one's start: "manifest", "entry", "entrytrunc",
 * "truncate", "version", "logtrunc N", "logflip OFFSET"; "stash" keeps a copy
 * of the journal the next daemon consumes, "unstash" puts that copy back. */
void ckv_warm_request_damage(const ckv_warm_env *e, const char *what);
/* Writes `text` to `path`; fails the test when it cannot. */
void ckv_warm_write_file(const char *path, const char *text);

#define SKIP_WITHOUT_SYSTEMD(e) SKIP_WITHOUT_SYSTEMD_CONF(e, NULL)
#define SKIP_WITHOUT_SYSTEMD_CONF(e, conf)                                                                    \
  do {                                                                                                        \
    char why_[512];                                                                                           \
    if (!ckv_warm_start(e, conf, why_, sizeof why_)) {                                                        \
      printf("SKIPPED: %s (test_warm_restart.snapshot_path_without_systemd covers the snapshot path)\n", why_); \
      fflush(stdout);                                                                                         \
      cr_skip("%s", why_);                                                                                    \
    }                                                                                                         \
  } while (0)

/* ---- the worker ------------------------------------------------------- */

/* A client of d (fails the test when it cannot connect). */
ckv_client *ckv_warm_connect(const ckv_test_daemon *d);
/* Opens `id` and runs `rounds` rounds (facts hot, older text cold, some
 * forgotten): draft, staged and committed blocks, acking every view. */
ckv_session *ckv_warm_session_with_rounds(ckv_client *c, const char *id, uint32_t rounds);
/* Resumes `id`: the session, or NULL with the code in *ret_code; the
 * daemon's text in msg either way. */
ckv_session *ckv_warm_resume(ckv_client *c, const char *id, int *ret_code, char *msg, size_t msglen);
/* The daemon's tokens.draft, .staged, .committed and .recycled. */
void ckv_warm_tokens_by_state(const ckv_test_daemon *d, unsigned long long tok[4]);
/* Whether the file at `path` contains `needle`. */
bool ckv_warm_log_has(const char *path, const char *needle);
/* kill -9 and the wait for systemd's restart; the worker reconnects onto
 * the same mapping (fails the test otherwise). */
void ckv_warm_kill_and_reconnect(ckv_warm_env *e, ckv_client *c, const ckv_arena *mapping);

/* What the worker's mapping shows of a session's blocks: where and what. */
typedef struct ckv_warm_mapped {
  size_t n;
  const uint8_t *at[512];
  uint64_t bytes[512];
  uint8_t *copy[512];
} ckv_warm_mapped;

/* Records where every block of s's view (cold ones too) lies in the
 * worker's mapping, with a copy of its payload; free with ckv_warm_mapped_free. */
void ckv_warm_map_blocks(ckv_client *c, ckv_session *s, ckv_warm_mapped *m);
/* Fails the test unless the old mapping still shows every byte it showed. */
void ckv_warm_expect_mapping_intact(const ckv_warm_mapped *m, const char *what);
/* Whether p is one of the recorded blocks. */
bool ckv_warm_mapped_at(const ckv_warm_mapped *m, const void *p);
void ckv_warm_mapped_free(ckv_warm_mapped *m);

#endif
