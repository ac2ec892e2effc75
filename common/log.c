/* daemon/log.c - journal or stderr records; see log.h.
 *
 * The level lives in an atomic int read with relaxed order on every call
 * (a stale level for one record is harmless).  The target and identifier are
 * set once by ckv_log_init before threads start.  Records are built in a
 * fixed stack buffer so logging never allocates, which matters on the
 * out-of-memory paths that most need a log line. */
#define SD_JOURNAL_SUPPRESS_LOCATION /* CODE_FILE= would always say log.c */
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-journal.h>

#define LOG_MSG_MAX 2048  /* message text after formatting */
#define LOG_LINE_MAX 3072 /* whole stderr line: prefix, fields, message */
#define LOG_FIELD_MAX 256 /* event, tenant, session each */

static const char *const level_names[] = {
    [CKV_LOG_ERROR] = "error", [CKV_LOG_WARNING] = "warning", [CKV_LOG_NOTICE] = "notice",
    [CKV_LOG_INFO] = "info",   [CKV_LOG_DEBUG] = "debug",
};

static atomic_int log_level = CKV_LOG_INFO;
static ckv_log_target log_target = CKV_LOG_TARGET_STDERR; /* resolved; never AUTO */
static char log_ident[32] = "commitkvd";
static pthread_mutex_t log_write_lock = PTHREAD_MUTEX_INITIALIZER;

/* Rate limiting of identical records: a small direct-mapped table keyed by
 * a hash of the record; a collision evicts the older entry (at worst a few
 * more lines get through). */
#define RL_SLOTS 64
typedef struct rl_entry {
  uint64_t key;
  uint64_t window_start_ms;
  unsigned in_window;  /* records of this key seen in the current window */
  unsigned suppressed; /* of those, not written */
} rl_entry;
static pthread_mutex_t rl_lock = PTHREAD_MUTEX_INITIALIZER;
static rl_entry rl_table[RL_SLOTS];
static unsigned rl_interval_ms = 10000, rl_burst = 5;

static int clamp_level(int level) {
  if (level < CKV_LOG_ERROR) return CKV_LOG_ERROR;
  if (level > CKV_LOG_DEBUG) return CKV_LOG_DEBUG;
  return level;
}

const char *ckv_log_level_name(int level) {
  if (level < CKV_LOG_ERROR || level > CKV_LOG_DEBUG) return "?";
  return level_names[level];
}

int ckv_log_level_from_name(const char *name) {
  if (!name) return -1;
  for (int l = CKV_LOG_ERROR; l <= CKV_LOG_DEBUG; l++)
    if (strcmp(name, level_names[l]) == 0) return l;
  return -1;
}

void ckv_log_set_rate_limit(unsigned interval_ms, unsigned burst) {
  pthread_mutex_lock(&rl_lock);
  rl_interval_ms = interval_ms;
  rl_burst = burst;
  memset(rl_table, 0, sizeof rl_table);
  pthread_mutex_unlock(&rl_lock);
}

static uint64_t fnv1a(uint64_t h, const char *s) {
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return (h ^ 0xff) * 0x100000001b3ull; /* a separator: ("ab","c") != ("a","bc") */
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether this record may be written; *ret_suppressed receives how many
 * identical ones were held back since it last was (0 usually). */
static bool rl_admit(int level, const char *event, const char *tenant, const char *session, const char *msg,
                     unsigned *ret_suppressed) {
  *ret_suppressed = 0;
  uint64_t key = 0xcbf29ce484222325ull ^ (uint64_t)level;
  key = fnv1a(fnv1a(fnv1a(fnv1a(key, event), tenant), session), msg);
  key |= 1; /* 0 marks an empty slot */
  uint64_t now = mono_ms();
  bool admit = true;
  pthread_mutex_lock(&rl_lock);
  if (rl_burst) {
    rl_entry *e = &rl_table[key % RL_SLOTS];
    if (e->key != key || now - e->window_start_ms >= rl_interval_ms) {
      if (e->key == key) *ret_suppressed = e->suppressed;
      *e = (rl_entry){.key = key, .window_start_ms = now, .in_window = 1};
    } else if (++e->in_window > rl_burst) {
      e->suppressed++;
      admit = false;
    }
  }
  pthread_mutex_unlock(&rl_lock);
  return admit;
}

void ckv_log_set_level(int level) {
  atomic_store_explicit(&log_level, clamp_level(level), memory_order_relaxed);
}

int ckv_log_get_level(void) { return atomic_load_explicit(&log_level, memory_order_relaxed); }

bool ckv_log_enabled(int level) { return level <= ckv_log_get_level(); }

bool ckv_log_stderr_is_journal(void) {
  const char *e = getenv("JOURNAL_STREAM");
  if (!e || !*e) return false;
  uintmax_t dev, ino;
  char tail;
  if (sscanf(e, "%ju:%ju%c", &dev, &ino, &tail) != 2) return false;
  struct stat st;
  if (fstat(STDERR_FILENO, &st) < 0) return false;
  return (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
}

void ckv_log_init(const char *ident, ckv_log_target target) {
  if (ident && *ident) snprintf(log_ident, sizeof log_ident, "%s", ident);
  if (target == CKV_LOG_TARGET_AUTO)
    target = ckv_log_stderr_is_journal() ? CKV_LOG_TARGET_JOURNAL : CKV_LOG_TARGET_STDERR;
  log_target = target;
}

/* Copies s into dst (at most cap-1 bytes), control bytes replaced by '?'. */
static void sanitize(char *dst, size_t cap, const char *s) {
  size_t n = 0;
  for (; s && *s && n + 1 < cap; s++, n++) {
    unsigned char ch = (unsigned char)*s;
    dst[n] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
  }
  dst[n] = '\0';
}

static void write_all(int fd, const char *p, size_t len) {
  pthread_mutex_lock(&log_write_lock);
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      break; /* nowhere left to complain to */
    }
    p += w;
    len -= (size_t)w;
  }
  pthread_mutex_unlock(&log_write_lock);
}

static void log_stderr(int level, const char *event, const char *tenant, const char *session,
                       const char *msg) {
  char field[LOG_FIELD_MAX], clean[LOG_MSG_MAX];
  char ev[LOG_FIELD_MAX + 2] = "", tn[LOG_FIELD_MAX + 8] = "", ss[LOG_FIELD_MAX + 9] = "";
  /* Each part is built with room to spare, so only the final line could be
   * cut, and LOG_LINE_MAX is larger than all parts together. */
  if (event) {
    sanitize(field, sizeof field, event);
    snprintf(ev, sizeof ev, "[%s]", field);
  }
  if (tenant) {
    sanitize(field, sizeof field, tenant);
    snprintf(tn, sizeof tn, "%stenant=%s", event ? " " : "", field);
  }
  if (session) {
    sanitize(field, sizeof field, session);
    snprintf(ss, sizeof ss, "%ssession=%s", (event || tenant) ? " " : "", field);
  }
  sanitize(clean, sizeof clean, msg);
  char line[LOG_LINE_MAX];
  int k = snprintf(line, sizeof line, "%s: %s: %s%s%s%s%s\n", log_ident, ckv_log_level_name(level),
                   ev, tn, ss, (event || tenant || session) ? ": " : "", clean);
  if (k <= 0) return;
  size_t n = (size_t)k;
  if (n >= sizeof line) { /* cannot happen with the sizes above; stay one line anyway */
    n = sizeof line - 1;
    line[n - 1] = '\n';
  }
  write_all(STDERR_FILENO, line, n);
}

static void log_journal(int level, const char *event, const char *tenant, const char *session,
                        const char *msg) {
  char f_msg[LOG_MSG_MAX + 16], f_prio[16], f_ident[64];
  char f_event[LOG_FIELD_MAX + 16], f_tenant[LOG_FIELD_MAX + 16], f_session[LOG_FIELD_MAX + 16];
  struct iovec iov[6];
  int n = 0;
  /* Journal fields are binary-safe: no sanitising, but the same length caps. */
#define FIELD(buf, ...)                                          \
  do {                                                           \
    int k_ = snprintf(buf, sizeof buf, __VA_ARGS__);             \
    if (k_ < 0) break;                                           \
    size_t len_ = (size_t)k_ < sizeof buf ? (size_t)k_ : sizeof buf - 1; \
    iov[n++] = (struct iovec){.iov_base = buf, .iov_len = len_}; \
  } while (0)
  FIELD(f_msg, "MESSAGE=%s", msg);
  FIELD(f_prio, "PRIORITY=%d", level);
  FIELD(f_ident, "SYSLOG_IDENTIFIER=%s", log_ident);
  if (event) FIELD(f_event, "CKV_EVENT=%.*s", LOG_FIELD_MAX - 1, event);
  if (tenant) FIELD(f_tenant, "TENANT=%.*s", LOG_FIELD_MAX - 1, tenant);
  if (session) FIELD(f_session, "SESSION=%.*s", LOG_FIELD_MAX - 1, session);
#undef FIELD
  if (sd_journal_sendv(iov, n) < 0) log_stderr(level, event, tenant, session, msg);
}

void ckv_logv(int level, const char *event, const char *tenant, const char *session,
              const char *fmt, va_list ap) {
  level = clamp_level(level);
  if (!ckv_log_enabled(level)) return;
  int saved_errno = errno; /* callers often log, then return -errno */
  char msg[LOG_MSG_MAX];
  msg[0] = '\0';
  if (fmt && vsnprintf(msg, sizeof msg, fmt, ap) < 0) msg[0] = '\0';
  unsigned suppressed;
  if (!rl_admit(level, event, tenant, session, msg, &suppressed)) {
    errno = saved_errno;
    return;
  }
  if (suppressed) {
    size_t len = strlen(msg);
    snprintf(msg + len, sizeof msg - len, " (%u identical lines suppressed in %g s)", suppressed,
             rl_interval_ms / 1000.0);
  }
  if (log_target == CKV_LOG_TARGET_JOURNAL)
    log_journal(level, event, tenant, session, msg);
  else
    log_stderr(level, event, tenant, session, msg);
  errno = saved_errno;
}

void ckv_log(int level, const char *event, const char *tenant, const char *session,
             const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ckv_logv(level, event, tenant, session, fmt, ap);
  va_end(ap);
}
