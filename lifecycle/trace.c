/* trace.c - per-token training traces for the mlp judge (format in trace.h). */
#include "lifecycle/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"

struct ckv_trace {
  pthread_mutex_t lock;
  FILE *f;
  uint32_t every;
  uint64_t max_bytes; /* 0 = unlimited */
  uint64_t bytes;     /* written in this segment */
  int stopped;        /* max_bytes reached or a write failed: no more rows */
};

static int put(ckv_trace *tr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int put(ckv_trace *tr, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vfprintf(tr->f, fmt, ap);
  va_end(ap);
  if (n < 0) return -(errno ? errno : EIO);
  tr->bytes += (uint64_t)n;
  return CKV_OK;
}

int ckv_trace_open(const char *path, uint32_t every, uint64_t max_bytes, ckv_trace **ret, char *err,
                   size_t errlen) {
  if (every < 1 || every > CKV_ATTN_HISTORY) {
    if (err && errlen)
      snprintf(err, errlen, "%s: trace_every = %u not in [1, %u] (the attention ring must cover the rounds between samples)",
               path, every, CKV_ATTN_HISTORY);
    return CKV_ERR_INVALID;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) {
    int e = errno;
    if (err && errlen) snprintf(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  ckv_trace *tr = calloc(1, sizeof(*tr));
  FILE *f = tr ? fdopen(fd, "a") : NULL;
  if (!f) {
    int e = tr ? errno : ENOMEM;
    free(tr);
    close(fd);
    if (err && errlen) snprintf(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  pthread_mutex_init(&tr->lock, NULL);
  tr->f = f;
  tr->every = every;
  tr->max_bytes = max_bytes;
  int r = put(tr, "# commitkv-trace %d features=%d history=%u every=%u pid=%ld\n", CKV_TRACE_VERSION,
              CKV_JUDGE_FEATURES, CKV_ATTN_HISTORY, every, (long)getpid());
  if (r == CKV_OK) r = put(tr, "session,round,pos,state,role,judged");
  for (int i = 0; i < CKV_JUDGE_FEATURES && r == CKV_OK; i++) r = put(tr, ",f%d", i);
  if (r == CKV_OK) r = put(tr, ",ring\n");
  if (r == CKV_OK && fflush(f) != 0) r = -(errno ? errno : EIO);
  if (r < 0) {
    if (err && errlen) snprintf(err, errlen, "%s: %s", path, strerror(-r));
    ckv_trace_close(tr);
    return r;
  }
  *ret = tr;
  return CKV_OK;
}

static int write_round(ckv_trace *tr, uint64_t session_id, uint32_t round, const ckv_tokens *t,
                       const ckv_judge_params *p, const uint8_t *rings) {
  const uint8_t *src = rings ? rings : t->attn;
  static const char hex[] = "0123456789abcdef";
  const size_t end = t->n > p->recent_window ? t->n - p->recent_window : 0;
  float f[CKV_JUDGE_FEATURES];
  char ring[2 * CKV_ATTN_HISTORY + 1];
  for (size_t pos = 0; pos < t->n; pos++) {
    if (t->state[pos] == CKV_STATE_RECYCLED && !rings) continue;
    ckv_judge_features(t, pos, round, p, f);
    for (uint32_t i = 0; i < CKV_ATTN_HISTORY; i++) {
      /* byte i: round - (R-1) + i */
      uint32_t back = CKV_ATTN_HISTORY - 1 - i;
      uint8_t code = back < round ? src[pos * CKV_ATTN_HISTORY + (round - back) % CKV_ATTN_HISTORY] : 0;
      ring[2 * i] = hex[code >> 4];
      ring[2 * i + 1] = hex[code & 15];
    }
    ring[2 * CKV_ATTN_HISTORY] = '\0';
    int judged = pos >= p->sink_tokens && pos < end && t->state[pos] != CKV_STATE_RECYCLED;
    int r = put(tr, "%llu,%u,%zu,%u,%u,%d", (unsigned long long)session_id, round, pos, t->state[pos],
                t->role[pos], judged);
    for (int i = 0; i < CKV_JUDGE_FEATURES && r == CKV_OK; i++) r = put(tr, ",%.6g", (double)f[i]);
    if (r == CKV_OK) r = put(tr, ",%s\n", ring);
    if (r < 0) return r;
  }
  if (fflush(tr->f) != 0) return -(errno ? errno : EIO);
  return CKV_OK;
}

static int trace_round(ckv_trace *tr, uint64_t session_id, uint32_t round, const ckv_tokens *t,
                       const ckv_judge_params *p, const uint8_t *rings) {
  if (round % tr->every) return CKV_OK;
  pthread_mutex_lock(&tr->lock);
  int r = CKV_OK;
  if (tr->stopped) {
    r = CKV_OK;
  } else if (tr->max_bytes && tr->bytes >= tr->max_bytes) {
    tr->stopped = 1;
    r = CKV_ERR_LIMIT;
  } else {
    r = write_round(tr, session_id, round, t, p, rings);
    if (r < 0) tr->stopped = 1;
  }
  pthread_mutex_unlock(&tr->lock);
  return r;
}

int ckv_trace_round(ckv_trace *tr, uint64_t session_id, uint32_t round, const ckv_tokens *t,
                    const ckv_judge_params *p) {
  return trace_round(tr, session_id, round, t, p, NULL);
}

int ckv_trace_round_rings(ckv_trace *tr, uint64_t session_id, uint32_t round, const ckv_tokens *t,
                          const ckv_judge_params *p, const uint8_t *rings) {
  return trace_round(tr, session_id, round, t, p, rings);
}

uint64_t ckv_trace_bytes(const ckv_trace *tr) {
  ckv_trace *w = (ckv_trace *)tr; /* the lock is not part of the logical state */
  pthread_mutex_lock(&w->lock);
  uint64_t n = w->bytes;
  pthread_mutex_unlock(&w->lock);
  return n;
}

ckv_trace *ckv_trace_close(ckv_trace *tr) {
  if (!tr) return NULL;
  if (tr->f) fclose(tr->f);
  pthread_mutex_destroy(&tr->lock);
  free(tr);
  return NULL;
}
