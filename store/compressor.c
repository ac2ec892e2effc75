/* compressor.c - worker threads draining per-thread FIFO queues (see
 * compressor.h).  A lane maps to one thread (lane % threads), which gives the
 * per-lane ordering without any cross-thread dependency tracking. */
#include "store/compressor.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "store/blockmem.h"

typedef struct worker {
  pthread_t thread;
  struct ckv_compressor *c;
  ckv_job *head, *tail; /* waiting jobs */
  bool running_job;
  pthread_cond_t wake;  /* a job arrived or stop */
  pthread_cond_t idle;  /* this worker finished a job */
  uint64_t submitted, finished; /* per-worker counters for drain_lane */
} worker;

struct ckv_compressor {
  pthread_mutex_t lock;
  worker *w;
  unsigned n_threads, depth;
  bool stop;
  int efd;
  ckv_job *done_head, *done_tail;
  ckv_compressor_stats st;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

ckv_job *ckv_job_free(ckv_job *j) {
  if (!j) return NULL;
  free(j->moves);
  free(j->headers);
  free(j->user);
  free(j);
  return NULL;
}

/* CKV_TEST_COMPRESS_HOLD=PATH (tests only; read once, at
 * ckv_compressor_new; documented in docs/snapshot.md): while the file PATH
 * exists, a job stops half-way through its moves (the first half written
 * into their destination blocks) and creates PATH.held to say so, so a test
 * can kill the daemon in the middle of a compression
 * (tests/integration/test_snapshot.c).  It waits at most 60 s.  Unset: no
 * effect. */
static char hold_path[512];

static void test_hold(void) {
  if (!hold_path[0] || access(hold_path, F_OK) != 0) return;
  char held[600];
  snprintf(held, sizeof held, "%s.held", hold_path);
  int fd = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  for (int i = 0; i < 6000 && access(hold_path, F_OK) == 0; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static void run_job(ckv_job *j) {
  const ckv_blockmem *mem = j->mem ? j->mem : &ckv_blockmem_host;
  size_t half = hold_path[0] ? j->n_moves / 2 : 0;
  j->status = half ? mem->run(&j->geom, j->moves, half, j->copy) : CKV_OK;
  test_hold();
  if (j->status == CKV_OK) j->status = mem->run(&j->geom, j->moves + half, j->n_moves - half, j->copy);
  j->done_ns = now_ns();
}

/* Caller holds c->lock. */
static void finish(ckv_compressor *c, ckv_job *j) {
  j->next = NULL;
  if (c->done_tail)
    c->done_tail->next = j;
  else
    c->done_head = j;
  c->done_tail = j;
  c->st.completed++;
  c->st.queued--;
  c->st.moves += j->n_moves;
  uint64_t one = 1;
  (void)!write(c->efd, &one, sizeof(one));
}

static void *worker_main(void *arg) {
  worker *w = arg;
  ckv_compressor *c = w->c;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!w->head && !c->stop) pthread_cond_wait(&w->wake, &c->lock);
    if (!w->head && c->stop) break;
    ckv_job *j = w->head;
    w->head = j->next;
    if (!w->head) w->tail = NULL;
    w->running_job = true;
    pthread_mutex_unlock(&c->lock);
    uint64_t t0 = now_ns();
    run_job(j);
    pthread_mutex_lock(&c->lock);
    c->st.busy_ns += now_ns() - t0;
    w->running_job = false;
    w->finished++;
    finish(c, j);
    pthread_cond_broadcast(&w->idle);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

int ckv_compressor_new(unsigned threads, unsigned depth, ckv_compressor **ret) {
  const char *hold = getenv("CKV_TEST_COMPRESS_HOLD");
  snprintf(hold_path, sizeof hold_path, "%s", hold ? hold : "");
  ckv_compressor *c = calloc(1, sizeof(*c));
  if (!c) return -ENOMEM;
  pthread_mutex_init(&c->lock, NULL);
  c->depth = depth ? depth : 1;
  c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->efd < 0) {
    int r = -errno;
    free(c);
    return r;
  }
  c->n_threads = threads;
  if (threads) {
    c->w = calloc(threads, sizeof(*c->w));
    if (!c->w) {
      close(c->efd);
      free(c);
      return -ENOMEM;
    }
    for (unsigned i = 0; i < threads; i++) {
      worker *w = &c->w[i];
      w->c = c;
      pthread_cond_init(&w->wake, NULL);
      pthread_cond_init(&w->idle, NULL);
      if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        c->n_threads = i;
        ckv_compressor_free(c);
        return -EAGAIN;
      }
    }
  }
  *ret = c;
  return CKV_OK;
}

ckv_compressor *ckv_compressor_free(ckv_compressor *c) {
  if (!c) return NULL;
  pthread_mutex_lock(&c->lock);
  c->stop = true;
  for (unsigned i = 0; i < c->n_threads; i++) pthread_cond_signal(&c->w[i].wake);
  pthread_mutex_unlock(&c->lock);
  for (unsigned i = 0; i < c->n_threads; i++) {
    pthread_join(c->w[i].thread, NULL);
    pthread_cond_destroy(&c->w[i].wake);
    pthread_cond_destroy(&c->w[i].idle);
  }
  for (ckv_job *j = c->done_head, *n; j; j = n) {
    n = j->next;
    ckv_job_free(j);
  }
  free(c->w);
  close(c->efd);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return NULL;
}

int ckv_compressor_submit(ckv_compressor *c, ckv_job *j) {
  pthread_mutex_lock(&c->lock);
  if (c->st.queued >= c->depth) {
    c->st.refused_busy++;
    pthread_mutex_unlock(&c->lock);
    return CKV_ERR_BUSY;
  }
  c->st.queued++;
  c->st.submitted++;
  j->next = NULL;
  j->submitted_ns = now_ns();
  if (!c->n_threads) { /* synchronous mode */
    pthread_mutex_unlock(&c->lock);
    run_job(j);
    pthread_mutex_lock(&c->lock);
    finish(c, j);
    pthread_mutex_unlock(&c->lock);
    return CKV_OK;
  }
  worker *w = &c->w[j->lane % c->n_threads];
  if (w->tail)
    w->tail->next = j;
  else
    w->head = j;
  w->tail = j;
  w->submitted++;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&c->lock);
  return CKV_OK;
}

int ckv_compressor_fd(const ckv_compressor *c) { return c->efd; }

ckv_job *ckv_compressor_collect(ckv_compressor *c) {
  uint64_t v;
  (void)!read(c->efd, &v, sizeof(v));
  pthread_mutex_lock(&c->lock);
  ckv_job *h = c->done_head;
  c->done_head = c->done_tail = NULL;
  pthread_mutex_unlock(&c->lock);
  return h;
}

void ckv_compressor_drain_lane(ckv_compressor *c, uint64_t lane) {
  if (!c->n_threads) return;
  pthread_mutex_lock(&c->lock);
  worker *w = &c->w[lane % c->n_threads];
  uint64_t target = w->submitted;
  while (w->finished < target) pthread_cond_wait(&w->idle, &c->lock);
  pthread_mutex_unlock(&c->lock);
}

unsigned ckv_compressor_room(ckv_compressor *c) {
  pthread_mutex_lock(&c->lock);
  unsigned room = c->st.queued >= c->depth ? 0 : c->depth - (unsigned)c->st.queued;
  pthread_mutex_unlock(&c->lock);
  return room;
}

void ckv_compressor_get_stats(ckv_compressor *c, ckv_compressor_stats *ret) {
  pthread_mutex_lock(&c->lock);
  *ret = c->st;
  pthread_mutex_unlock(&c->lock);
}
