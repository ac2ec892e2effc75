/* remote.c - the Redis/Valkey remote tier over hiredis (see remote.h). */
#include "persist/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/fail.h"
#include "persist/seal.h"

/* Bytes per SET/APPEND of a put: bounded so hiredis' copy of a command stays
 * small and no value meets the server's proto-max-bulk-len (512 MB). */
#define CHUNK_BYTES (4u << 20)
/* A temporary key outlives a put cut short by this much, then expires. */
#define TMP_TTL_MS "600000"
#define COMPONENT_MAX 128u

struct ckv_remote {
  ckv_remote_url url;
  char text[CKV_REMOTE_HOST_MAX + 64]; /* for messages: redis://HOST:PORT or unix://PATH */
  char *password;
  struct timeval timeout;
  redisContext *ctx;
  uint64_t tmp_seq;
  bool stale; /* the last failure found the kept connection dead */
  ckv_remote_stats stats;
  ckv_seal *seal; /* seals what is stored (seal.h); owned */
};

/* ---- URL ---- */

static int parse_u32(const char *s, const char *end, uint64_t max, uint64_t *ret) {
  if (s == end) return -1;
  uint64_t v = 0;
  for (const char *p = s; p < end; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (uint64_t)(*p - '0');
    if (v > max) return -1;
  }
  *ret = v;
  return 0;
}

int ckv_remote_url_parse(const char *url, ckv_remote_url *ret, char *err, size_t errlen) {
  ckv_remote_url u;
  memset(&u, 0, sizeof u);
  u.port = 6379;
  if (strncmp(url, "rediss://", 9) == 0)
    return ckv_fail(err, errlen, CKV_ERR_UNSUPPORTED,
                "'%s': TLS (rediss://) needs hiredis_ssl, which this build's hiredis (Debian bookworm, 0.14) does "
                "not have; use redis:// over a trusted network or a TLS tunnel (stunnel, spiped) on loopback",
                url);
  if (strncmp(url, "unix://", 7) == 0) {
    const char *p = url + 7;
    if (p[0] != '/' || strlen(p) >= sizeof u.host)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': unix:// needs an absolute socket path (unix:///run/redis.sock)",
                  url);
    u.unix_socket = true;
    snprintf(u.host, sizeof u.host, "%s", p);
    *ret = u;
    return CKV_OK;
  }
  if (strncmp(url, "redis://", 8) != 0)
    return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s' is not a redis:// or unix:// URL", url);
  const char *p = url + 8, *at = strchr(p, '@'), *slash = strchr(p, '/');
  if (at && (!slash || at < slash)) {
    if (memchr(p, ':', (size_t)(at - p)))
      return ckv_fail(err, errlen, CKV_ERR_INVALID, /* not echoed: the text goes to logs */
                  "the remote URL holds a password (USER:PASSWORD@): put it in remote_password_file (mode 0600 or "
                  "0640), never in the configuration");
    if ((size_t)(at - p) >= sizeof u.user || at == p)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': the user name is empty or too long", url);
    memcpy(u.user, p, (size_t)(at - p));
    p = at + 1;
  }
  const char *host_end, *port_from = NULL, *end = slash ? slash : p + strlen(p);
  if (*p == '[') { /* [IPv6] */
    const char *close = memchr(p, ']', (size_t)(end - p));
    if (!close) return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': an IPv6 address needs its closing ']'", url);
    if ((size_t)(close - p - 1) >= sizeof u.host || close == p + 1)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': bad IPv6 address", url);
    memcpy(u.host, p + 1, (size_t)(close - p - 1));
    host_end = close + 1;
    if (host_end < end && *host_end != ':') return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': junk after ']'", url);
    if (host_end < end) port_from = host_end + 1;
  } else {
    const char *colon = memchr(p, ':', (size_t)(end - p));
    host_end = colon ? colon : end;
    if (host_end == p || (size_t)(host_end - p) >= sizeof u.host)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': no host, or a host name too long", url);
    memcpy(u.host, p, (size_t)(host_end - p));
    if (colon) port_from = colon + 1;
  }
  for (const char *h = u.host; *h; h++)
    if ((unsigned char)*h <= 0x20 || *h == 0x7f || *h == '@' || *h == '/' || *h == '?' || *h == '#')
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': the host holds a character no host name has", url);
  uint64_t v;
  if (port_from) {
    if (parse_u32(port_from, end, 65535, &v) < 0 || v == 0)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': the port must be 1..65535", url);
    u.port = (uint16_t)v;
  }
  if (slash && slash[1]) {
    if (parse_u32(slash + 1, slash + strlen(slash), 1u << 20, &v) < 0)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "'%s': the database after '/' must be a number", url);
    u.db = (uint32_t)v;
  }
  *ret = u;
  return CKV_OK;
}

/* ---- password file ---- */

int ckv_remote_read_password(const char *path, char **ret_password, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO: refused below, never waited on */
  if (fd < 0) return ckv_fail(err, errlen, -errno, "remote_password_file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ckv_fail(err, errlen, CKV_ERR_INVALID, "remote_password_file %s is not a regular file", path);
  }
  /* A secret others can read is no secret; one others can write lets them
   * point the daemon at a store of their choosing under our name. */
  if (st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP) || (st.st_uid != 0 && st.st_uid != geteuid())) {
    close(fd);
    return ckv_fail(err, errlen, CKV_ERR_AUTH,
                "remote_password_file %s has mode %04o, owner uid %u: it must belong to root or the daemon's user "
                "and be neither readable nor writable by others (chmod 0600 or 0640)",
                path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
  }
  char buf[CKV_REMOTE_PASSWORD_MAX + 2];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  if (n < 0) return ckv_fail(err, errlen, -errno, "reading remote_password_file %s: %s", path, strerror(errno));
  size_t len = (size_t)n;
  if (len && buf[len - 1] == '\n') len--;
  if (len && buf[len - 1] == '\r') len--;
  if (len == 0 || len > CKV_REMOTE_PASSWORD_MAX || memchr(buf, '\n', len) || memchr(buf, '\0', len))
    return ckv_fail(err, errlen, CKV_ERR_INVALID,
                "remote_password_file %s must hold one line of 1..%u bytes (the password)", path,
                CKV_REMOTE_PASSWORD_MAX);
  char *pw = malloc(len + 1);
  if (!pw) return ckv_fail(err, errlen, -ENOMEM, "out of memory");
  memcpy(pw, buf, len);
  pw[len] = 0;
  memset(buf, 0, sizeof buf);
  *ret_password = pw;
  return CKV_OK;
}

/* ---- keys ---- */

static int put_component(const char *v, bool may_be_empty, char **p, char *end) {
  size_t n = strlen(v);
  if ((!n && !may_be_empty) || n > COMPONENT_MAX) return CKV_ERR_INVALID;
  static const char hex[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)v[i];
    if (ch < 0x20 || ch == 0x7f) return CKV_ERR_INVALID;
    bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                 ch == '_' || ch == '-';
    if (end - *p < (plain ? 2 : 4)) return CKV_ERR_LIMIT; /* and the NUL */
    if (plain) {
      *(*p)++ = (char)ch;
    } else {
      *(*p)++ = '%';
      *(*p)++ = hex[ch >> 4];
      *(*p)++ = hex[ch & 15];
    }
  }
  return CKV_OK;
}

static int make_key(const char *space, uint32_t format_version, const char *tenant, const char *model_id,
                    const char *model_revision, const char *name, char *buf, size_t len) {
  if (!tenant || !name || !model_id || !model_revision) return CKV_ERR_INVALID;
  int n = snprintf(buf, len, "%sv%u:", space, format_version);
  if (n < 0 || (size_t)n >= len) return CKV_ERR_LIMIT;
  char *p = buf + n, *end = buf + len;
  const char *parts[4] = {tenant, model_id, model_revision, name};
  for (int i = 0; i < 4; i++) {
    int r = put_component(parts[i], /* may_be_empty= */ i == 1 || i == 2, &p, end);
    if (r < 0) return r;
    if (i < 3) {
      if (end - p < 2) return CKV_ERR_LIMIT;
      *p++ = ':';
    }
  }
  *p = 0;
  return CKV_OK;
}

int ckv_remote_key(uint32_t format_version, const char *tenant, const char *model_id, const char *model_revision,
                   const char *name, char *buf, size_t len) {
  return make_key("ckv:", format_version, tenant, model_id, model_revision, name, buf, len);
}

int ckv_remote_fence_key(const char *tenant, const char *session_id, char *buf, size_t len) {
  if (!tenant || !session_id) return CKV_ERR_INVALID;
  int n = snprintf(buf, len, "ckv:fence:");
  if (n < 0 || (size_t)n >= len) return CKV_ERR_LIMIT;
  char *p = buf + n, *end = buf + len;
  int r = put_component(tenant, /* may_be_empty= */ false, &p, end);
  if (r < 0) return r;
  if (end - p < 2) return CKV_ERR_LIMIT;
  *p++ = ':';
  if ((r = put_component(session_id, /* may_be_empty= */ false, &p, end)) < 0) return r;
  *p = 0;
  return CKV_OK;
}

int ckv_remote_tier_key(uint32_t format_version, const char *tenant, const char *model_id,
                        const char *model_revision, const char *session_id, char *buf, size_t len) {
  return make_key("ckv:tier:", format_version, tenant, model_id, model_revision, session_id, buf, len);
}

/* ---- the connection ---- */

int ckv_remote_new(const char *url, const char *password, uint32_t timeout_ms, ckv_remote **ret, char *err,
                   size_t errlen) {
  ckv_remote_url u;
  int r = ckv_remote_url_parse(url, &u, err, errlen);
  if (r < 0) return r;
  ckv_remote *rs = calloc(1, sizeof(*rs));
  if (!rs) return ckv_fail(err, errlen, -ENOMEM, "out of memory");
  rs->url = u;
  snprintf(rs->text, sizeof rs->text, "%s", url);
  if (password && *password && !(rs->password = strdup(password))) {
    free(rs);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory");
  }
  if (!timeout_ms) timeout_ms = 2000;
  rs->timeout.tv_sec = timeout_ms / 1000;
  rs->timeout.tv_usec = (timeout_ms % 1000) * 1000;
  *ret = rs;
  return CKV_OK;
}

static void disconnect(ckv_remote *r) {
  if (r->ctx) redisFree(r->ctx);
  r->ctx = NULL;
  __atomic_store_n(&r->stats.connected, false, __ATOMIC_RELAXED);
}

ckv_remote *ckv_remote_free(ckv_remote *r) {
  if (!r) return NULL;
  r->seal = ckv_seal_free(r->seal);
  disconnect(r);
  if (r->password) {
    memset(r->password, 0, strlen(r->password));
    free(r->password);
  }
  free(r);
  return NULL;
}

const char *ckv_remote_url_text(const ckv_remote *r) { return r->text; }

/* The connection broke (or never came up): say so, drop it. */
static int conn_error(ckv_remote *r, char *err, size_t errlen, const char *doing) {
  const char *why = r->ctx && r->ctx->errstr[0] ? r->ctx->errstr : "no connection";
  char buf[64];
  if (r->ctx && r->ctx->err == REDIS_ERR_IO && strstr(why, "temporarily unavailable")) { /* SO_RCVTIMEO */
    snprintf(buf, sizeof buf, "no answer within %ld ms", (long)(r->timeout.tv_sec * 1000 + r->timeout.tv_usec / 1000));
    why = buf;
  }
  /* Found dead (the store restarted or closed an idle connection) rather
   * than slow: worth one more try on a new connection. */
  r->stale = r->ctx && (r->ctx->err == REDIS_ERR_EOF ||
                        (r->ctx->err == REDIS_ERR_IO && (strstr(why, "reset by peer") || strstr(why, "Broken pipe"))));
  ckv_fail(err, errlen, -EIO, "remote store %s: %s: %s", r->text, doing, why);
  disconnect(r);
  return -EIO;
}

/* One command; *ret the reply (the caller frees it).  An error reply is
 * -EIO with the server's text (the connection stays); a broken connection
 * is -EIO too, and dropped. */
static int command(ckv_remote *r, int argc, const char **argv, const size_t *lens, redisReply **ret, char *err,
                   size_t errlen) {
  redisReply *rep = redisCommandArgv(r->ctx, argc, argv, lens);
  if (!rep) {
    char doing[64];
    snprintf(doing, sizeof doing, "%s", argv[0]);
    return conn_error(r, err, errlen, doing);
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    ckv_fail(err, errlen, -EIO, "remote store %s: %s answered: %s", r->text, argv[0], rep->str ? rep->str : "an error");
    freeReplyObject(rep);
    return -EIO;
  }
  *ret = rep;
  return CKV_OK;
}

static int simple(ckv_remote *r, int argc, const char **argv, const size_t *lens, char *err, size_t errlen) {
  redisReply *rep = NULL;
  int rc = command(r, argc, argv, lens, &rep, err, errlen);
  if (rc == CKV_OK) freeReplyObject(rep);
  return rc;
}

static int connect_store(ckv_remote *r, char *err, size_t errlen) {
  if (r->ctx) return CKV_OK;
  r->ctx = r->url.unix_socket ? redisConnectUnixWithTimeout(r->url.host, r->timeout)
                              : redisConnectWithTimeout(r->url.host, r->url.port, r->timeout);
  if (!r->ctx) return ckv_fail(err, errlen, -ENOMEM, "remote store %s: out of memory", r->text);
  if (r->ctx->err) return conn_error(r, err, errlen, "connect");
  /* hiredis opens its socket without O_CLOEXEC */
  int fl = fcntl(r->ctx->fd, F_GETFD);
  if (fl >= 0) fcntl(r->ctx->fd, F_SETFD, fl | FD_CLOEXEC);
  if (redisSetTimeout(r->ctx, r->timeout) != REDIS_OK) return conn_error(r, err, errlen, "setting the timeout");
  int rc = CKV_OK;
  if (r->password) {
    const char *argv[3] = {"AUTH", r->url.user[0] ? r->url.user : r->password, r->password};
    size_t lens[3] = {4, strlen(argv[1]), strlen(r->password)};
    rc = simple(r, r->url.user[0] ? 3 : 2, argv, lens, err, errlen);
  }
  if (rc == CKV_OK && r->url.db) {
    char db[16];
    snprintf(db, sizeof db, "%u", r->url.db);
    const char *argv[2] = {"SELECT", db};
    size_t lens[2] = {6, strlen(db)};
    rc = simple(r, 2, argv, lens, err, errlen);
  }
  if (rc < 0)
    disconnect(r); /* refused AUTH or SELECT: nothing may run on this connection */
  else
    __atomic_store_n(&r->stats.connected, true, __ATOMIC_RELAXED);
  return rc;
}

int ckv_remote_ping(ckv_remote *r, char *err, size_t errlen) {
  int rc = connect_store(r, err, errlen);
  if (rc == CKV_OK) {
    const char *argv[1] = {"PING"};
    size_t lens[1] = {4};
    rc = simple(r, 1, argv, lens, err, errlen);
  }
  if (rc < 0) __atomic_fetch_add(&r->stats.errors, 1, __ATOMIC_RELAXED);
  return rc;
}

/* Runs op once, and once more on a fresh connection when the kept one
 * turned out broken (the store restarted since the last call). */
typedef int (*op_fn)(ckv_remote *r, void *ctx, char *err, size_t errlen);
static int with_retry(ckv_remote *r, op_fn op, void *ctx, char *err, size_t errlen) {
  for (int attempt = 0;; attempt++) {
    bool kept = r->ctx != NULL;
    r->stale = false;
    int rc = connect_store(r, err, errlen);
    if (rc == CKV_OK) rc = op(r, ctx, err, errlen);
    if (rc != -EIO || !kept || !r->stale || attempt > 0) return rc;
  }
}

/* ---- put ---- */

typedef struct put_ctx {
  const char *key;
  const uint8_t *buf;
  size_t len;
} put_ctx;

static int do_put(ckv_remote *r, void *vctx, char *err, size_t errlen) {
  put_ctx *pc = vctx;
  char tmp[CKV_REMOTE_KEY_MAX + 64];
  snprintf(tmp, sizeof tmp, "{%s}:tmp:%ld-%llu", pc->key, (long)getpid(), (unsigned long long)++r->tmp_seq);
  size_t off = 0;
  int rc = CKV_OK;
  do { /* SET the first chunk (with the expiry), APPEND the others */
    size_t n = pc->len - off < CHUNK_BYTES ? pc->len - off : CHUNK_BYTES;
    const char *argv[5] = {off ? "APPEND" : "SET", tmp, (const char *)pc->buf + off, "PX", TMP_TTL_MS};
    size_t lens[5] = {strlen(argv[0]), strlen(tmp), n, 2, strlen(TMP_TTL_MS)};
    rc = simple(r, off ? 3 : 5, argv, lens, err, errlen);
    off += n;
  } while (rc == CKV_OK && off < pc->len);
  if (rc < 0) return rc;
  /* The value appears under key in one step, without the temporary expiry. */
  const char *multi[1] = {"MULTI"}, *rename[3] = {"RENAME", tmp, pc->key}, *persist[2] = {"PERSIST", pc->key},
             *exec[1] = {"EXEC"};
  size_t mlen[1] = {5}, rlen[3] = {6, strlen(tmp), strlen(pc->key)}, plen[2] = {7, strlen(pc->key)}, elen[1] = {4};
  if ((rc = simple(r, 1, multi, mlen, err, errlen)) < 0) return rc;
  if ((rc = simple(r, 3, rename, rlen, err, errlen)) < 0 || (rc = simple(r, 2, persist, plen, err, errlen)) < 0) {
    if (r->ctx) { /* leave the transaction, or the next command would be queued in it */
      const char *discard[1] = {"DISCARD"};
      size_t dlen[1] = {7};
      simple(r, 1, discard, dlen, NULL, 0);
    }
    return rc;
  }
  redisReply *rep = NULL;
  if ((rc = command(r, 1, exec, elen, &rep, err, errlen)) < 0) return rc;
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 || rep->element[0]->type == REDIS_REPLY_ERROR)
    rc = ckv_fail(err, errlen, -EIO, "remote store %s: RENAME of the temporary key failed: %s", r->text,
              rep->type == REDIS_REPLY_ARRAY && rep->elements && rep->element[0]->str ? rep->element[0]->str
                                                                                     : "the transaction was aborted");
  freeReplyObject(rep);
  return rc;
}

int ckv_remote_put(ckv_remote *r, const char *key, const void *buf, size_t len, char *err, size_t errlen) {
  put_ctx pc = {.key = key, .buf = buf, .len = len};
  int rc = with_retry(r, do_put, &pc, err, errlen);
  if (rc == CKV_OK) {
    __atomic_fetch_add(&r->stats.saves, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&r->stats.save_bytes, len, __ATOMIC_RELAXED);
  } else {
    __atomic_fetch_add(&r->stats.errors, 1, __ATOMIC_RELAXED);
  }
  return rc;
}

/* ---- get ---- */

/* n commands sent at once (hiredis' pipeline), their n replies read in
 * order into rep[] (the caller frees each).  A broken connection is -EIO
 * (dropped); an error reply is kept in rep[] for the caller to judge. */
static int pipeline(ckv_remote *r, int n, const int *argc, const char *const *const *argv, const size_t *const *lens,
                    redisReply **rep, char *err, size_t errlen) {
  for (int i = 0; i < n; i++) rep[i] = NULL;
  for (int i = 0; i < n; i++)
    if (redisAppendCommandArgv(r->ctx, argc[i], (const char **)argv[i], lens[i]) != REDIS_OK)
      return conn_error(r, err, errlen, argv[i][0]);
  for (int i = 0; i < n; i++) {
    void *v = NULL;
    if (redisGetReply(r->ctx, &v) != REDIS_OK || !v) {
      for (int k = 0; k < i; k++) freeReplyObject(rep[k]), rep[k] = NULL;
      return conn_error(r, err, errlen, argv[i][0]);
    }
    rep[i] = v;
  }
  return CKV_OK;
}

static void free_replies(redisReply **rep, int n) {
  for (int i = 0; i < n; i++)
    if (rep[i]) freeReplyObject(rep[i]), rep[i] = NULL;
}

static int reply_error(ckv_remote *r, const redisReply *rep, const char *cmd, char *err, size_t errlen) {
  return ckv_fail(err, errlen, -EIO, "remote store %s: %s answered: %s", r->text, cmd, rep->str ? rep->str : "an error");
}

typedef struct get_ctx {
  const char *key;
  uint64_t max;
  uint8_t *buf;
  size_t len;
  const char *side_key; /* get_with_side: read with the STRLEN */
  size_t side_max;
  uint8_t *side;
  size_t side_len;
} get_ctx;

/* The value under gc->key, whose STRLEN was n. */
static int fetch_value(ckv_remote *r, get_ctx *gc, long long n, char *err, size_t errlen) {
  if (n < 0) return ckv_fail(err, errlen, -EIO, "remote store %s: STRLEN did not answer a number", r->text);
  if (n == 0) return ckv_fail(err, errlen, -ENOENT, "remote store %s holds no key %s", r->text, gc->key);
  if ((uint64_t)n > gc->max)
    return ckv_fail(err, errlen, CKV_ERR_TOO_LARGE, "remote store %s: %s holds %lld bytes, more than %llu allowed",
                r->text, gc->key, n, (unsigned long long)gc->max);
  /* One GET: the value is read as one version (a concurrent put renames a
   * whole new value in; reading ranges could mix two). */
  const char *get_argv[2] = {"GET", gc->key};
  size_t lens[2] = {3, strlen(gc->key)};
  redisReply *rep = NULL;
  int rc = command(r, 2, get_argv, lens, &rep, err, errlen);
  if (rc < 0) return rc;
  if (rep->type == REDIS_REPLY_NIL) {
    freeReplyObject(rep);
    return ckv_fail(err, errlen, -ENOENT, "remote store %s holds no key %s", r->text, gc->key);
  }
  if (rep->type != REDIS_REPLY_STRING || (uint64_t)rep->len > gc->max) {
    freeReplyObject(rep);
    return ckv_fail(err, errlen, -EIO, "remote store %s: GET %s did not answer a value of at most %llu bytes", r->text,
                gc->key, (unsigned long long)gc->max);
  }
  gc->buf = malloc(rep->len ? rep->len : 1);
  if (!gc->buf) {
    freeReplyObject(rep);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory for %zu bytes from the remote store", rep->len);
  }
  memcpy(gc->buf, rep->str, rep->len);
  gc->len = rep->len;
  freeReplyObject(rep);
  return CKV_OK;
}

static int do_get(ckv_remote *r, void *vctx, char *err, size_t errlen) {
  get_ctx *gc = vctx;
  const char *strlen_argv[2] = {"STRLEN", gc->key};
  size_t lens[2] = {6, strlen(gc->key)};
  redisReply *rep = NULL;
  int rc = command(r, 2, strlen_argv, lens, &rep, err, errlen);
  if (rc < 0) return rc;
  long long n = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
  freeReplyObject(rep);
  return fetch_value(r, gc, n, err, errlen);
}

/* GET side and STRLEN key in one round trip, then the value. */
static int do_get_side(ckv_remote *r, void *vctx, char *err, size_t errlen) {
  get_ctx *gc = vctx;
  const char *side_argv[2] = {"GET", gc->side_key}, *strlen_argv[2] = {"STRLEN", gc->key};
  size_t side_lens[2] = {3, strlen(gc->side_key)}, strlen_lens[2] = {6, strlen(gc->key)};
  const int argc[2] = {2, 2};
  const char *const *argv[2] = {side_argv, strlen_argv};
  const size_t *const lens[2] = {side_lens, strlen_lens};
  redisReply *rep[2];
  int rc = pipeline(r, 2, argc, argv, lens, rep, err, errlen);
  if (rc < 0) return rc;
  for (int i = 0; i < 2; i++)
    if (rep[i]->type == REDIS_REPLY_ERROR) {
      rc = reply_error(r, rep[i], argv[i][0], err, errlen);
      free_replies(rep, 2);
      return rc;
    }
  free(gc->side);
  gc->side = NULL;
  gc->side_len = 0;
  if (rep[0]->type == REDIS_REPLY_STRING) {
    gc->side_len = rep[0]->len;
    if (rep[0]->len <= gc->side_max && (gc->side = malloc(rep[0]->len ? rep[0]->len : 1)))
      memcpy(gc->side, rep[0]->str, rep[0]->len);
    else if (rep[0]->len <= gc->side_max)
      rc = ckv_fail(err, errlen, -ENOMEM, "out of memory for %zu bytes from the remote store", rep[0]->len);
  }
  long long n = rep[1]->type == REDIS_REPLY_INTEGER ? rep[1]->integer : -1;
  free_replies(rep, 2);
  if (rc < 0) return rc;
  return fetch_value(r, gc, n, err, errlen);
}

static int finish_get(ckv_remote *r, get_ctx *gc, int rc, uint8_t **ret_buf, size_t *ret_len) {
  if (rc == CKV_OK) {
    __atomic_fetch_add(&r->stats.loads, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&r->stats.load_bytes, gc->len, __ATOMIC_RELAXED);
    *ret_buf = gc->buf;
    *ret_len = gc->len;
  } else if (rc == -ENOENT) {
    __atomic_fetch_add(&r->stats.misses, 1, __ATOMIC_RELAXED);
  } else {
    __atomic_fetch_add(&r->stats.errors, 1, __ATOMIC_RELAXED);
  }
  return rc;
}

int ckv_remote_get_with_side(ckv_remote *r, const char *key, uint64_t max_bytes, const char *side_key,
                             size_t side_max, uint8_t **ret_buf, size_t *ret_len, uint8_t **ret_side,
                             size_t *ret_side_len, char *err, size_t errlen) {
  get_ctx gc = {.key = key, .max = max_bytes, .side_key = side_key, .side_max = side_max};
  int rc = finish_get(r, &gc, with_retry(r, do_get_side, &gc, err, errlen), ret_buf, ret_len);
  if (rc == CKV_OK || rc == -ENOENT) {
    *ret_side = gc.side;
    *ret_side_len = gc.side_len;
  } else {
    free(gc.side);
  }
  return rc;
}

int ckv_remote_get(ckv_remote *r, const char *key, uint64_t max_bytes, uint8_t **ret_buf, size_t *ret_len, char *err,
                   size_t errlen) {
  get_ctx gc = {.key = key, .max = max_bytes};
  return finish_get(r, &gc, with_retry(r, do_get, &gc, err, errlen), ret_buf, ret_len);
}

/* ---- conditional put ---- */

typedef struct put_if_ctx {
  const char *key, *del_key;
  const uint8_t *buf;
  size_t len;
  ckv_remote_replace_fn replace;
  void *ctx;
} put_if_ctx;

static int do_put_if(ckv_remote *r, void *vctx, char *err, size_t errlen) {
  put_if_ctx *pc = vctx;
  size_t klen = strlen(pc->key);
  const char *watch[2] = {"WATCH", pc->key}, *get[2] = {"GET", pc->key};
  size_t wlen[2] = {5, klen}, glen[2] = {3, klen};
  const int argc1[2] = {2, 2};
  const char *const *argv1[2] = {watch, get};
  const size_t *const lens1[2] = {wlen, glen};
  redisReply *rep[5];
  int rc = pipeline(r, 2, argc1, argv1, lens1, rep, err, errlen);
  if (rc < 0) return rc;
  bool replace = false;
  if (rep[0]->type == REDIS_REPLY_ERROR || rep[1]->type == REDIS_REPLY_ERROR)
    rc = reply_error(r, rep[0]->type == REDIS_REPLY_ERROR ? rep[0] : rep[1], "WATCH/GET", err, errlen);
  else if (rep[1]->type == REDIS_REPLY_STRING)
    replace = pc->replace(pc->ctx, (const uint8_t *)rep[1]->str, rep[1]->len);
  else
    replace = pc->replace(pc->ctx, NULL, 0);
  free_replies(rep, 2);
  if (rc == CKV_OK && !replace) rc = CKV_ERR_EXISTS;
  if (rc < 0) { /* leave the WATCH, or it would stay on the connection */
    const char *unwatch[1] = {"UNWATCH"};
    size_t ulen[1] = {7};
    if (r->ctx) simple(r, 1, unwatch, ulen, NULL, 0);
    return rc;
  }
  const char *multi[1] = {"MULTI"}, *set[3] = {"SET", pc->key, (const char *)pc->buf}, *del[2] = {"DEL", pc->del_key},
             *exec[1] = {"EXEC"};
  size_t mlen[1] = {5}, slen[3] = {3, klen, pc->len}, dlen[2] = {3, pc->del_key ? strlen(pc->del_key) : 0},
         elen[1] = {4};
  int n = pc->del_key ? 4 : 3;
  const int argc2[4] = {1, 3, pc->del_key ? 2 : 1, 1};
  const char *const *argv2[4] = {multi, set, pc->del_key ? del : exec, exec};
  const size_t *const lens2[4] = {mlen, slen, pc->del_key ? dlen : elen, elen};
  if ((rc = pipeline(r, n, argc2, argv2, lens2, rep, err, errlen)) < 0) return rc;
  const redisReply *ex = rep[n - 1];
  for (int i = 0; i < n - 1 && rc == CKV_OK; i++)
    if (rep[i]->type == REDIS_REPLY_ERROR) rc = reply_error(r, rep[i], argv2[i][0], err, errlen);
  if (rc == CKV_OK) {
    if (ex->type == REDIS_REPLY_NIL)
      rc = ckv_fail(err, errlen, -EAGAIN, "remote store %s: %s was written by another daemon meanwhile", r->text,
                    pc->key);
    else if (ex->type != REDIS_REPLY_ARRAY || ex->elements != (size_t)(n - 2))
      rc = ckv_fail(err, errlen, -EIO, "remote store %s: the transaction on %s was aborted", r->text, pc->key);
    else
      for (size_t i = 0; i < ex->elements && rc == CKV_OK; i++)
        if (ex->element[i]->type == REDIS_REPLY_ERROR) rc = reply_error(r, ex->element[i], "EXEC", err, errlen);
  }
  free_replies(rep, n);
  return rc;
}

int ckv_remote_put_if(ckv_remote *r, const char *key, const void *buf, size_t len, ckv_remote_replace_fn replace,
                      void *ctx, const char *del_key, char *err, size_t errlen) {
  put_if_ctx pc = {.key = key, .del_key = del_key, .buf = buf, .len = len, .replace = replace, .ctx = ctx};
  int rc = with_retry(r, do_put_if, &pc, err, errlen);
  if (rc == CKV_OK) {
    __atomic_fetch_add(&r->stats.saves, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&r->stats.save_bytes, len, __ATOMIC_RELAXED);
  } else if (rc != CKV_ERR_EXISTS && rc != -EAGAIN) {
    __atomic_fetch_add(&r->stats.errors, 1, __ATOMIC_RELAXED);
  }
  return rc;
}

uint32_t ckv_remote_timeout_ms(const ckv_remote *r) {
  return (uint32_t)(r->timeout.tv_sec * 1000 + r->timeout.tv_usec / 1000);
}

/* ---- del ---- */

static int do_del(ckv_remote *r, void *vctx, char *err, size_t errlen) {
  const char *key = vctx;
  const char *argv[2] = {"DEL", key};
  size_t lens[2] = {3, strlen(key)};
  return simple(r, 2, argv, lens, err, errlen);
}

int ckv_remote_del(ckv_remote *r, const char *key, char *err, size_t errlen) {
  int rc = with_retry(r, do_del, (void *)key, err, errlen);
  if (rc < 0) __atomic_fetch_add(&r->stats.errors, 1, __ATOMIC_RELAXED);
  return rc;
}

/* The I/O thread calls the store while the loop reads these: every field
 * is read and written atomically (relaxed: counters, no ordering needed). */
void ckv_remote_get_stats(const ckv_remote *r, ckv_remote_stats *ret) {
  ret->saves = __atomic_load_n(&r->stats.saves, __ATOMIC_RELAXED);
  ret->save_bytes = __atomic_load_n(&r->stats.save_bytes, __ATOMIC_RELAXED);
  ret->loads = __atomic_load_n(&r->stats.loads, __ATOMIC_RELAXED);
  ret->load_bytes = __atomic_load_n(&r->stats.load_bytes, __ATOMIC_RELAXED);
  ret->misses = __atomic_load_n(&r->stats.misses, __ATOMIC_RELAXED);
  ret->errors = __atomic_load_n(&r->stats.errors, __ATOMIC_RELAXED);
  ret->connected = __atomic_load_n(&r->stats.connected, __ATOMIC_RELAXED);
}

void ckv_remote_set_seal(ckv_remote *r, ckv_seal *seal) {
  ckv_seal_free(r->seal);
  r->seal = seal;
}

const ckv_seal *ckv_remote_seal(const ckv_remote *r) { return r->seal; }

bool ckv_remote_has_password(const ckv_remote *r) { return r->password != NULL; }

