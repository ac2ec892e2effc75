/* redisstore.c - a redis-server of the test's own (see redisstore.h). */
#include "redisstore.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define DEADLINE_MS 20000
#define REDIS_SERVER "/usr/bin/redis-server"

#define DEADLINE_MS 20000
#define REDIS_SERVER "/usr/bin/redis-server"

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind: %s", strerror(errno));
  socklen_t len = sizeof a;
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static redisContext *store_conn(const ckv_test_store *st) {
  redisContext *c = redisConnectWithTimeout("127.0.0.1", st->port, (struct timeval){2, 0});
  cr_assert(c && !c->err, "cannot connect to redis on %d: %s", st->port, c ? c->errstr : "oom");
  return c;
}

void ckv_test_store_start_on(ckv_test_store *st, int port) {
  st->port = port;
  snprintf(st->url, sizeof st->url, "redis://127.0.0.1:%d", port);
  char portstr[16], log[512];
  snprintf(portstr, sizeof portstr, "%d", port);
  snprintf(log, sizeof log, "%s/redis.log", st->dir);
  st->pid = fork();
  cr_assert_geq(st->pid, 0);
  if (st->pid == 0) {
    /* dies with the test: a failed assertion skips store_stop (three redis-servers
     * outlived failed runs of this suite on the shared machine) */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(125);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (chdir(st->dir) != 0) _exit(126);
    execl(REDIS_SERVER, "redis-server", "--port", portstr, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
          "--daemonize", "no", (char *)NULL);
    _exit(127);
  }
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  for (;;) {
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, (struct timeval){0, 200000});
    if (c && !c->err) {
      redisReply *r = redisCommand(c, "PING");
      bool ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
      redisFree(c);
      if (ok) return;
    } else if (c) {
      redisFree(c);
    }
    cr_assert_eq(waitpid(st->pid, NULL, WNOHANG), 0, "redis-server died at start (log %s)", log);
    cr_assert_lt(ckv_test_now_ms(), end, "redis-server never answered on %d", port);
    usleep(20000);
  }
}

void ckv_test_store_start(ckv_test_store *st) {
  if (access(REDIS_SERVER, X_OK) != 0)
    cr_skip_test(REDIS_SERVER " not found (make deps installs redis-server): the remote tier is NOT tested");
  st->dir = ckv_test_tmpdir("ckv-redis");
  ckv_test_store_start_on(st, free_port());
}

void ckv_test_store_kill(ckv_test_store *st) {
  if (st->pid <= 0) return;
  kill(st->pid, SIGKILL);
  waitpid(st->pid, NULL, 0);
  st->pid = 0;
}

void ckv_test_store_stop(ckv_test_store *st) {
  ckv_test_store_kill(st);
  ckv_test_rmdir(st->dir);
}

uint8_t *ckv_test_store_get(const ckv_test_store *st, const char *key, size_t *len) {
  redisContext *c = store_conn(st);
  redisReply *r = redisCommand(c, "GET %s", key);
  cr_assert_not_null(r);
  uint8_t *v = NULL;
  *len = 0;
  if (r->type == REDIS_REPLY_STRING) {
    v = malloc(r->len + 1);
    memcpy(v, r->str, r->len);
    *len = r->len;
  }
  freeReplyObject(r);
  redisFree(c);
  return v;
}

void ckv_test_store_cmd(const ckv_test_store *st, const char *fmt, ...) {
  redisContext *c = store_conn(st);
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  cr_assert(r && r->type != REDIS_REPLY_ERROR, "redis: %s", r ? r->str : c->errstr);
  freeReplyObject(r);
  redisFree(c);
}

/* ---- daemons ---- */

size_t ckv_test_store_count(const ckv_test_store *st, const char *pattern) {
  redisContext *c = store_conn(st);
  redisReply *r = redisCommand(c, "KEYS %s", pattern);
  cr_assert(r && r->type == REDIS_REPLY_ARRAY, "redis KEYS: %s", r ? r->str : c->errstr);
  size_t n = r->elements;
  freeReplyObject(r);
  redisFree(c);
  return n;
}

const char *ckv_test_store_key_file(const ckv_test_store *st, const char *name) {
  static char path[4][600];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, sizeof path[0], "%s/%s.key", st->dir, name);
  if (access(p, F_OK) == 0) return p;
  uint8_t secret[32];
  FILE *rnd = fopen("/dev/urandom", "rb");
  cr_assert(rnd && fread(secret, 1, sizeof secret, rnd) == sizeof secret, "no random bytes for %s", p);
  fclose(rnd);
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
  cr_assert_eq(write(fd, secret, sizeof secret), (ssize_t)sizeof secret);
  close(fd);
  return p;
}

