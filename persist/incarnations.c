/* incarnations.c - the durable record of each id's current conversation (see incarnations.h). */
#include "persist/incarnations.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "commitkv/status.h"
#include "common/fail.h"
#include "common/log.h"
#include "common/strmap.h"
#include "persist/statefile.h"

#define LOG_NAME "incarnations.log"
#define MAGIC 0x49564b43u       /* "CKVI" */
#define NAME_MAX_BYTES 255u     /* tenant and id are far shorter (63, 128) */
#define RECORD_MAX (8u + 2u * (2u + NAME_MAX_BYTES))
#define COMPACT_SLACK 1024u     /* records beyond twice the ids before the log is rewritten */

struct ckv_incarnations {
  char path[4096];
  int fd;                /* the log, append-only; -1 in memory only */
  ckv_strmap *current;   /* "tenant/id" -> uint64_t incarnation (0: ended) */
  size_t records;        /* in the log */
};

uint64_t ckv_incarnations_new_id(void) {
  uint64_t v = 0;
  while (v == 0)
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() ^ (uint64_t)time(NULL);
  return v;
}

static int remember(ckv_incarnations *reg, const char *key, uint64_t inc) {
  uint64_t *v = ckv_strmap_get(reg->current, key);
  if (v) {
    *v = inc;
    return CKV_OK;
  }
  if (!(v = malloc(sizeof *v))) return -ENOMEM;
  *v = inc;
  if (ckv_strmap_put(reg->current, key, v) < 0) {
    free(v);
    return -ENOMEM;
  }
  return CKV_OK;
}

/* One record into buf (RECORD_MAX + 16 bytes at least); its length. */
static size_t encode(uint8_t *buf, const char *tenant, const char *id, uint64_t inc) {
  size_t tl = strlen(tenant), il = strlen(id), at = 8;
  memcpy(buf + at, &inc, 8), at += 8;
  uint16_t l16 = (uint16_t)tl;
  memcpy(buf + at, &l16, 2), at += 2;
  memcpy(buf + at, tenant, tl), at += tl;
  l16 = (uint16_t)il;
  memcpy(buf + at, &l16, 2), at += 2;
  memcpy(buf + at, id, il), at += il;
  uint32_t magic = MAGIC, len = (uint32_t)(at - 8);
  memcpy(buf, &magic, 4);
  memcpy(buf + 4, &len, 4);
  uint64_t sum = XXH64(buf, at, 0);
  memcpy(buf + at, &sum, 8);
  return at + 8;
}

/* The record at buf[0..n): its length (0: torn or damaged) and, when whole, key and incarnation. */
static size_t decode(const uint8_t *buf, size_t n, char *key, size_t keylen, uint64_t *inc) {
  uint32_t magic, len;
  if (n < 8) return 0;
  memcpy(&magic, buf, 4);
  memcpy(&len, buf + 4, 4);
  if (magic != MAGIC || len < 12 || len > RECORD_MAX || n < 8u + len + 8u) return 0;
  uint64_t sum;
  memcpy(&sum, buf + 8 + len, 8);
  if (sum != XXH64(buf, 8 + len, 0)) return 0;
  const uint8_t *p = buf + 8, *end = buf + 8 + len;
  memcpy(inc, p, 8), p += 8;
  uint16_t tl, il;
  memcpy(&tl, p, 2), p += 2;
  if (tl == 0 || p + tl + 2 > end) return 0;
  const uint8_t *t = p;
  p += tl;
  memcpy(&il, p, 2), p += 2;
  if (il == 0 || p + il != end) return 0;
  if (snprintf(key, keylen, "%.*s/%.*s", (int)tl, (const char *)t, (int)il, (const char *)p) >= (int)keylen) return 0;
  return 8u + len + 8u;
}

static int load(ckv_incarnations *reg, char *err, size_t errlen) {
  int r = ckv_statefile_check_file(reg->path, 0, err, errlen);
  if (r == -ENOENT) return CKV_OK;
  if (r < 0) return r;
  int fd = open(reg->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return ckv_fail(err, errlen, -errno, "cannot open %s: %s", reg->path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0) {
    close(fd);
    return ckv_fail(err, errlen, -errno, "cannot stat %s: %s", reg->path, strerror(errno));
  }
  size_t n = (size_t)st.st_size, got = 0;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    close(fd);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory for %s (%zu bytes)", reg->path, n);
  }
  while (got < n) {
    ssize_t k = read(fd, buf + got, n - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  size_t at = 0;
  while (at < got) {
    char key[2 * NAME_MAX_BYTES + 2];
    uint64_t inc;
    size_t len = decode(buf + at, got - at, key, sizeof key, &inc);
    if (!len) break;
    if ((r = remember(reg, key, inc)) < 0) {
      free(buf);
      return ckv_fail(err, errlen, r, "out of memory reading %s", reg->path);
    }
    reg->records++;
    at += len;
  }
  free(buf);
  if (at < got) {
    /* a torn append (a crash) or damage: what follows is not trusted; cut off */
    ckv_log(CKV_LOG_WARNING, "incarnations-cut", NULL, NULL,
            "%s: %zu bytes after its %zu whole records are torn or damaged and were cut off (a crash while "
            "appending?); ids recorded only there are taken as never recorded",
            reg->path, got - at, reg->records);
    if (truncate(reg->path, (off_t)at) < 0)
      return ckv_fail(err, errlen, -errno, "cannot cut %s to its whole records: %s", reg->path, strerror(errno));
  }
  return CKV_OK;
}

static int open_log(ckv_incarnations *reg, char *err, size_t errlen) {
  reg->fd = open(reg->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (reg->fd < 0) return ckv_fail(err, errlen, -errno, "cannot open %s: %s", reg->path, strerror(errno));
  return CKV_OK;
}

int ckv_incarnations_open(const char *state_dir, ckv_incarnations **ret, char *err, size_t errlen) {
  ckv_incarnations *reg = calloc(1, sizeof(*reg));
  if (!reg || ckv_strmap_new(&reg->current) < 0) {
    free(reg);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory");
  }
  reg->fd = -1;
  int r = CKV_OK;
  if (state_dir && *state_dir) {
    if (snprintf(reg->path, sizeof reg->path, "%s/%s", state_dir, LOG_NAME) >= (int)sizeof reg->path)
      r = ckv_fail(err, errlen, -ENAMETOOLONG, "state_dir path too long");
    if (r == CKV_OK && mkdir(state_dir, 0700) < 0 && errno != EEXIST)
      r = ckv_fail(err, errlen, -errno, "cannot create %s: %s", state_dir, strerror(errno));
    if (r == CKV_OK) r = load(reg, err, errlen);
    if (r == CKV_OK) r = open_log(reg, err, errlen);
  }
  if (r < 0) {
    ckv_incarnations_free(reg);
    return r;
  }
  *ret = reg;
  return CKV_OK;
}

ckv_incarnations *ckv_incarnations_free(ckv_incarnations *reg) {
  if (!reg) return NULL;
  if (reg->fd >= 0) close(reg->fd);
  size_t cur = 0;
  void *v;
  while ((v = ckv_strmap_next(reg->current, &cur, NULL))) free(v);
  ckv_strmap_free(reg->current);
  free(reg);
  return NULL;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k < 0 ? -errno : -EIO;
    p += k;
    n -= (size_t)k;
  }
  return CKV_OK;
}

/* Rewrites the log with one record per id (temporary file, fsync, rename). */
static void compact(ckv_incarnations *reg) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s~tmp", reg->path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  int r = CKV_OK;
  size_t cur = 0, n = 0;
  const char *key;
  uint64_t *v;
  while (r == CKV_OK && (v = ckv_strmap_next(reg->current, &cur, &key))) {
    const char *slash = strchr(key, '/');
    char tenant[NAME_MAX_BYTES + 1];
    snprintf(tenant, sizeof tenant, "%.*s", (int)(slash - key), key);
    uint8_t rec[RECORD_MAX + 16];
    r = write_all(fd, rec, encode(rec, tenant, slash + 1, *v));
    n++;
  }
  if (r == CKV_OK && fsync(fd) < 0) r = -errno;
  close(fd);
  if (r == CKV_OK && rename(tmp, reg->path) < 0) r = -errno;
  if (r < 0) {
    unlink(tmp);
    return; /* the long log stays: correct, only bigger */
  }
  close(reg->fd);
  char err[256];
  if (open_log(reg, err, sizeof err) < 0) ckv_log(CKV_LOG_ERROR, "incarnations-reopen", NULL, NULL, "%s", err);
  reg->records = n;
}

int ckv_incarnations_set(ckv_incarnations *reg, const char *tenant, const char *id, uint64_t incarnation, char *err,
                         size_t errlen) {
  size_t tl = strlen(tenant), il = strlen(id);
  if (!tl || !il || tl > NAME_MAX_BYTES || il > NAME_MAX_BYTES)
    return ckv_fail(err, errlen, CKV_ERR_INVALID, "tenant '%s' / id '%s' cannot be recorded", tenant, id);
  char key[2 * NAME_MAX_BYTES + 2];
  snprintf(key, sizeof key, "%s/%s", tenant, id);
  if (reg->fd >= 0) {
    uint8_t rec[RECORD_MAX + 16];
    int r = write_all(reg->fd, rec, encode(rec, tenant, id, incarnation));
    if (r == CKV_OK && fdatasync(reg->fd) < 0) r = -errno;
    if (r < 0) return ckv_fail(err, errlen, r, "cannot record the conversation in %s: %s", reg->path, strerror(-r));
    reg->records++;
  }
  int r = remember(reg, key, incarnation);
  if (r < 0) return ckv_fail(err, errlen, r, "out of memory");
  if (reg->fd >= 0 && reg->records > 2 * ckv_strmap_size(reg->current) + COMPACT_SLACK) compact(reg);
  return CKV_OK;
}

int ckv_incarnations_get(const ckv_incarnations *reg, const char *tenant, const char *id, uint64_t *ret) {
  char key[2 * NAME_MAX_BYTES + 2];
  snprintf(key, sizeof key, "%s/%s", tenant, id);
  const uint64_t *v = ckv_strmap_get(reg->current, key);
  if (!v) return -ENOENT;
  *ret = *v;
  return CKV_OK;
}
