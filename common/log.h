/* daemon/log.h - commitkvd's structured log.
 *
 * One record = level, event name (a short dotted word such as "session.open"
 * that operators filter on), optional tenant and session, and a printf-style
 * message.  Under systemd (stderr is the journal stream: $JOURNAL_STREAM names
 * stderr's device and inode, the check systemd documents) each record goes to
 * the journal with sd_journal_sendv and the fields MESSAGE=, PRIORITY=,
 * TENANT=, SESSION=, CKV_EVENT=, SYSLOG_IDENTIFIER=; otherwise it is one line
 * on stderr:
 *     commitkvd: warning: [lease.expired] tenant=alice session=s1: message
 * (parts whose value is NULL are left out; control bytes in any part are
 * replaced by '?' so a client-chosen session id cannot forge lines).
 *
 * Identical records (same level, event, tenant, session and text) are rate
 * limited: within an interval (default 10 s) the first `burst` (default 5)
 * are written, the rest counted, and the next one written after the
 * interval says how many were suppressed ("... (37 identical lines
 * suppressed in 10 s)").  A failure that repeats cannot flood the journal,
 * and its first lines are never lost.
 *
 * Thread-safe: each record is formatted on the caller's stack and written
 * with one write(2) under a mutex.  The level is an atomic, so SIGHUP's
 * reload can change it while other threads log.  Level numbers are syslog
 * priorities, so PRIORITY= needs no mapping.  Nothing here allocates. */
#ifndef CKV_DAEMON_LOG_H
#define CKV_DAEMON_LOG_H

#include <stdarg.h>
#include <stdbool.h>

typedef enum ckv_log_level {
  CKV_LOG_ERROR = 3,   /* the daemon or a request failed and could not go on */
  CKV_LOG_WARNING = 4, /* something is wrong but handled (lease expired, quota hit) */
  CKV_LOG_NOTICE = 5,  /* normal but significant (start, stop, reload) */
  CKV_LOG_INFO = 6,    /* per-client / per-session events; never per round or token */
  CKV_LOG_DEBUG = 7,   /* anything, including per-round detail */
} ckv_log_level;

typedef enum ckv_log_target {
  CKV_LOG_TARGET_AUTO = 0,    /* journal when stderr is the journal stream, else stderr */
  CKV_LOG_TARGET_STDERR = 1,
  CKV_LOG_TARGET_JOURNAL = 2,
} ckv_log_target;

#if defined(__GNUC__) || defined(__clang__)
#define CKV_PRINTF_FMT(a, b) __attribute__((format(printf, a, b)))
#else
#define CKV_PRINTF_FMT(a, b)
#endif

/* Sets the identifier ("commitkvd" when never called; copied, at most 31
 * bytes) and the target; AUTO decides now, from $JOURNAL_STREAM and stderr.
 * Call once at start-up (not thread-safe against concurrent ckv_log). */
void ckv_log_init(const char *ident, ckv_log_target target);

/* Rate limit for identical records: at most `burst` per `interval_ms`;
 * burst 0 turns limiting off.  Safe from any thread. */
void ckv_log_set_rate_limit(unsigned interval_ms, unsigned burst);

/* Records above this level are dropped.  Out-of-range values are clamped to
 * [CKV_LOG_ERROR, CKV_LOG_DEBUG].  Both are safe from any thread. */
void ckv_log_set_level(int level);
int ckv_log_get_level(void);

/* Whether a record at `level` would be written: guard expensive arguments. */
bool ckv_log_enabled(int level);

/* "error", "warning", "notice", "info", "debug"; "?" for anything else. */
const char *ckv_log_level_name(int level);

/* Name -> level, or -1 when unknown. */
int ckv_log_level_from_name(const char *name);

/* True when stderr is connected to the journal: $JOURNAL_STREAM is
 * "DEV:INO" and matches fstat(2) of fd 2. */
bool ckv_log_stderr_is_journal(void);

/* Writes one record.  event, tenant and session may be NULL.  The message is
 * truncated to about 2 KiB.  Never fails visibly (a lost log line must not
 * take a request down); errno is preserved. */
void ckv_log(int level, const char *event, const char *tenant, const char *session,
             const char *fmt, ...) CKV_PRINTF_FMT(5, 6);
void ckv_logv(int level, const char *event, const char *tenant, const char *session,
              const char *fmt, va_list ap) CKV_PRINTF_FMT(5, 0);

#endif
