/* warmlog.c - the warm journal's append-only log (see warmlog.h). */
#include "persist/warmlog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "commitkv/status.h"

#define LOG_MAGIC "CKVWLOG"
#define LOG_VERSION 1u
#define REC_MAGIC 0x52564b43u       /* "CKVR" */
#define LOG_MAX (UINT64_C(1) << 30) /* compaction keeps it far below */

static void put(ckv_warmlog_buf *b, const void *src, size_t n) {
  if (b->oom || !n) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

static uint64_t rec_sum(const uint8_t *head, const char *tenant, size_t tl, const char *id, size_t il,
                        const uint8_t *entry, size_t n) {
  XXH64_state_t *st = XXH64_createState();
  if (!st) return 0; /* no record checks (never: a few bytes) */
  XXH64_reset(st, 0);
  XXH64_update(st, head, 32);
  XXH64_update(st, tenant, tl);
  XXH64_update(st, id, il);
  if (n) XXH64_update(st, entry, n);
  uint64_t sum = XXH64_digest(st);
  XXH64_freeState(st);
  return sum;
}

void ckv_warmlog_encode(ckv_warmlog_buf *b, uint64_t seq, uint32_t type, const char *tenant, const char *id,
                        const uint8_t *entry, size_t n) {
  uint8_t head[CKV_WARMLOG_RECORD_BYTES] = {0};
  uint32_t magic = REC_MAGIC;
  uint16_t tl = (uint16_t)strlen(tenant), il = (uint16_t)strlen(id);
  uint64_t len = n;
  memcpy(head, &magic, 4);
  memcpy(head + 4, &type, 4);
  memcpy(head + 8, &seq, 8);
  memcpy(head + 16, &tl, 2);
  memcpy(head + 18, &il, 2);
  memcpy(head + 24, &len, 8);
  uint64_t sum = rec_sum(head, tenant, tl, id, il, entry, n);
  memcpy(head + 32, &sum, 8);
  put(b, head, sizeof head);
  put(b, tenant, tl);
  put(b, id, il);
  put(b, entry, n);
}

void ckv_warmlog_buf_done(ckv_warmlog_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static int log_path(const char *warm_dir, char *path, size_t len) {
  return snprintf(path, len, "%s/%s", warm_dir, CKV_WARM_LOG) >= (int)len ? -ENAMETOOLONG : CKV_OK;
}

int ckv_warmlog_create(const char *warm_dir, uint64_t manifest_sum, int *ret_fd, char *err, size_t errlen) {
  char path[4200], tmp[4300];
  if (log_path(warm_dir, path, sizeof path) < 0) {
    snprintf(err, errlen, "state directory path too long");
    return -ENAMETOOLONG;
  }
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  uint8_t head[CKV_WARMLOG_HEADER_BYTES];
  uint32_t ver = LOG_VERSION, nver = ~ver;
  memcpy(head, LOG_MAGIC, 8);
  memcpy(head + 8, &ver, 4);
  memcpy(head + 12, &nver, 4);
  memcpy(head + 16, &manifest_sum, 8);
  uint64_t sum = XXH64(head, 24, 0);
  memcpy(head + 24, &sum, 8);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600);
  int r = fd < 0 || write(fd, head, sizeof head) != (ssize_t)sizeof head || fsync(fd) < 0 ? (errno ? -errno : -EIO)
                                                                                          : CKV_OK;
  if (r == CKV_OK && rename(tmp, path) < 0) r = -errno;
  if (r == CKV_OK) {
    int dfd = open(warm_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) < 0) r = -errno;
    if (dfd >= 0) close(dfd);
  }
  if (r < 0) {
    snprintf(err, errlen, "cannot write %.300s: %s", path, strerror(-r));
    if (fd >= 0) close(fd);
    unlink(tmp);
    return r;
  }
  *ret_fd = fd;
  return CKV_OK;
}

int ckv_warmlog_append(int fd, const void *buf, size_t len, char *err, size_t errlen) {
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, (const uint8_t *)buf + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int r = w < 0 ? -errno : -EIO;
      snprintf(err, errlen, "appending to the warm journal's log: %s", strerror(-r));
      return r;
    }
    done += (size_t)w;
  }
  if (fdatasync(fd) < 0) {
    int r = -errno;
    snprintf(err, errlen, "fdatasync of the warm journal's log: %s", strerror(-r));
    return r;
  }
  return CKV_OK;
}

void ckv_warmlog_remove(const char *warm_dir) {
  char path[4200];
  if (log_path(warm_dir, path, sizeof path) == CKV_OK) unlink(path);
}

void ckv_warmlog_done(ckv_warmlog *l) {
  free(l->buf_);
  free(l->recs);
  memset(l, 0, sizeof *l);
}

/* Reads the whole file (at most LOG_MAX bytes). */
static int slurp(const char *path, uint8_t **ret, size_t *ret_len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return -ENOENT;
    int r = -errno;
    snprintf(err, errlen, "cannot open %.300s: %s", path, strerror(errno));
    return r;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > LOG_MAX) {
    snprintf(err, errlen, "%.300s is not a regular file of at most %llu bytes", path, (unsigned long long)LOG_MAX);
    close(fd);
    return CKV_ERR_CORRUPT;
  }
  size_t len = (size_t)st.st_size, got = 0;
  uint8_t *p = malloc(len ? len : 1);
  while (p && got < len) {
    ssize_t r = read(fd, p + got, len - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (!p || got != len) {
    free(p);
    snprintf(err, errlen, "cannot read %.300s", path);
    return p ? -EIO : -ENOMEM;
  }
  *ret = p;
  *ret_len = len;
  return CKV_OK;
}

/* Whether s (n bytes, not terminated) is a usable name: no NUL, no '/'. */
static bool name_ok(const uint8_t *s, size_t n) {
  if (!n) return false;
  for (size_t i = 0; i < n; i++)
    if (!s[i] || s[i] == '/') return false;
  return true;
}

int ckv_warmlog_read(const char *warm_dir, uint64_t manifest_sum, ckv_warmlog *ret, char *err, size_t errlen) {
  char path[4200];
  if (log_path(warm_dir, path, sizeof path) < 0) return -ENAMETOOLONG;
  uint8_t *p = NULL;
  size_t len = 0;
  int r = slurp(path, &p, &len, err, errlen);
  if (r < 0) return r;
  uint32_t ver, nver;
  uint64_t msum, hsum;
  if (len < CKV_WARMLOG_HEADER_BYTES || memcmp(p, LOG_MAGIC, 8) != 0) {
    snprintf(err, errlen, "%.300s: no log header (%zu bytes)", path, len);
    free(p);
    return CKV_ERR_CORRUPT;
  }
  memcpy(&ver, p + 8, 4);
  memcpy(&nver, p + 12, 4);
  memcpy(&msum, p + 16, 8);
  memcpy(&hsum, p + 24, 8);
  if (ver != (uint32_t)~nver || ver != LOG_VERSION || XXH64(p, 24, 0) != hsum) {
    snprintf(err, errlen, "%.300s: damaged header or version %u (this build reads %u)", path, ver, LOG_VERSION);
    free(p);
    return CKV_ERR_CORRUPT;
  }
  if (msum != manifest_sum) {
    snprintf(err, errlen, "%.300s follows another checkpoint than the manifest's", path);
    free(p);
    return -ESTALE;
  }
  memset(ret, 0, sizeof *ret);
  ret->buf_ = p;
  ret->file_bytes = len;
  size_t at = CKV_WARMLOG_HEADER_BYTES, cap = 0;
  const char *why = NULL;
  char whybuf[160];
  while (at < len) {
    uint64_t seq_want = ret->n + 1;
    if (len - at < CKV_WARMLOG_RECORD_BYTES) {
      why = "a record header cut short (torn tail)";
      break;
    }
    const uint8_t *h = p + at;
    uint32_t magic, type;
    uint64_t seq, elen, sum;
    uint16_t tl, il;
    memcpy(&magic, h, 4);
    memcpy(&type, h + 4, 4);
    memcpy(&seq, h + 8, 8);
    memcpy(&tl, h + 16, 2);
    memcpy(&il, h + 18, 2);
    memcpy(&elen, h + 24, 8);
    memcpy(&sum, h + 32, 8);
    size_t left = len - at - CKV_WARMLOG_RECORD_BYTES;
    if (magic != REC_MAGIC || (type != CKV_WARMLOG_PUT && type != CKV_WARMLOG_DEL)) {
      why = "no record magic or an unknown type";
      break;
    }
    if (tl > CKV_WARMLOG_TENANT_MAX || il > CKV_WARMLOG_ID_MAX || (type == CKV_WARMLOG_DEL && elen)) {
      why = "lengths out of range";
      break;
    }
    if ((uint64_t)tl + il > left || elen > left - tl - il) {
      why = "a record cut short (torn tail)";
      break;
    }
    const uint8_t *tenant = h + CKV_WARMLOG_RECORD_BYTES, *id = tenant + tl, *entry = id + il;
    if (rec_sum(h, (const char *)tenant, tl, (const char *)id, il, entry, (size_t)elen) != sum) {
      why = "checksum mismatch";
      break;
    }
    if (seq != seq_want) {
      snprintf(whybuf, sizeof whybuf, "sequence %llu where %llu belongs", (unsigned long long)seq,
               (unsigned long long)seq_want);
      why = whybuf;
      break;
    }
    if (!name_ok(tenant, tl) || !name_ok(id, il)) {
      why = "a tenant or session id that is no name";
      break;
    }
    if (ret->n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      ckv_warmlog_rec *nr = realloc(ret->recs, ncap * sizeof(*nr));
      if (!nr) {
        ckv_warmlog_done(ret);
        snprintf(err, errlen, "out of memory reading %.300s", path);
        return -ENOMEM;
      }
      ret->recs = nr;
      cap = ncap;
    }
    ckv_warmlog_rec *rec = &ret->recs[ret->n++];
    memset(rec, 0, sizeof *rec);
    rec->type = type;
    rec->seq = seq;
    rec->offset = at;
    memcpy(rec->tenant, tenant, tl);
    memcpy(rec->id, id, il);
    rec->entry = entry;
    rec->entry_len = (size_t)elen;
    at += CKV_WARMLOG_RECORD_BYTES + tl + il + (size_t)elen;
  }
  ret->good_bytes = at;
  if (why)
    snprintf(ret->cut, sizeof ret->cut,
             "record %zu at offset %zu: %s; the %zu byte(s) from there on are "
             "not applied",
             ret->n + 1, at, why, len - at);
  return CKV_OK;
}
