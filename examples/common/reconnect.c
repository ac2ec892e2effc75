/* reconnect.c - re-attach with backoff and reopen sessions (see reconnect.h). */
#include "examples/common/reconnect.h"

#include <errno.h>
#include <time.h>

long long reconnect_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long long ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

bool reconnect_daemon_gone(ckv_client *c, ckv_session *s, int status) {
  if (status == CKV_ERR_DAEMON_RESTARTED || status == CKV_ERR_DISCONNECTED || status == CKV_ERR_TIMEOUT) return true;
  if (ckv_client_restarted(c)) return true;
  /* A stale handle answers at once, without asking any daemon. */
  const ckv_view *v;
  return s && ckv_session_view(s, &v) == CKV_ERR_DAEMON_RESTARTED;
}

bool reconnect_transient(int status) { return status == -EIO || status == CKV_ERR_BUSY; }

void reconnect_pause(long long deadline_ms) {
  long long left = deadline_ms - reconnect_now_ms(), pause = RECONNECT_MAX_MS / 4;
  if (left > 0) sleep_ms(pause < left ? pause : left);
}

int reconnect_client(ckv_client *c, long long deadline_ms) {
  long long pause = RECONNECT_FIRST_MS;
  for (;;) {
    int r = ckv_client_reconnect(c);
    if (r == CKV_OK) return CKV_OK;
    long long left = deadline_ms - reconnect_now_ms();
    if (left <= 0) return r;
    sleep_ms(pause < left ? pause : left);
    pause = pause * 2 < RECONNECT_MAX_MS ? pause * 2 : RECONNECT_MAX_MS;
  }
}

int reconnect_first_connect(const ckv_client_options *o, ckv_client **ret, long long deadline_ms) {
  long long pause = RECONNECT_FIRST_MS;
  for (;;) {
    int r = ckv_client_connect(o, ret);
    if (r == CKV_OK) return CKV_OK;
    if (r == CKV_ERR_AUTH || r == CKV_ERR_LIMIT || r == CKV_ERR_VERSION || r == CKV_ERR_INVALID) return r;
    long long left = deadline_ms - reconnect_now_ms();
    if (left <= 0) return r;
    sleep_ms(pause < left ? pause : left);
    pause = pause * 2 < RECONNECT_MAX_MS ? pause * 2 : RECONNECT_MAX_MS;
  }
}

int reconnect_session(ckv_client *c, ckv_session **s, const char *id, const ckv_geometry *g,
                      const ckv_session_options *opt, uint64_t tokens, bool may_keep, bool *ret_fresh,
                      bool *ret_restarted) {
  bool restarted = false;
  if (*s) {
    /* Frees the handle in every case; a live daemon keeps the session for the resume below. */
    restarted = ckv_session_close(*s) == CKV_ERR_DAEMON_RESTARTED;
    *s = NULL;
  }
  ckv_session *n = NULL;
  int r = ckv_session_open(c, id, g, &(ckv_session_options){.resume = true}, &n);
  if (r == CKV_OK && may_keep && ckv_session_tokens(n) == tokens) {
    *s = n;
    *ret_fresh = false;
    *ret_restarted = restarted;
    return CKV_OK;
  }
  /* Not what the worker wrote (an append whose reply was lost took effect,
   * or a lost report may have): start it again from the worker's own tokens. */
  if (r == CKV_OK) r = ckv_session_drop(n);
  if (r == CKV_OK || r == CKV_ERR_NOT_FOUND) r = ckv_session_open(c, id, g, opt, &n);
  if (r < 0) return r;
  *s = n;
  *ret_fresh = true;
  *ret_restarted = restarted;
  return CKV_OK;
}
