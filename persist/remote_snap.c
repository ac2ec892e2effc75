/* remote_snap.c - session snapshots in the remote store (see remote_snap.h). */
#include "common/fail.h"
#include "persist/remote_snap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "persist/fence.h"
#include "persist/remote.h"
#include "persist/seal.h"
#include "persist/snapdir.h"
#include "persist/snapshot.h"
#include "persist/statefile.h"

static int slurp(const char *path, uint8_t **ret, size_t *ret_len, char *err, size_t errlen) {
  int r = ckv_statefile_check_file(path, 2, err, errlen); /* the daemon's own file, or nothing goes to the store */
  if (r < 0) return r;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO: refused below, never waited on */
  if (fd < 0) return ckv_fail(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ckv_fail(err, errlen, -EINVAL, "%s is not a regular file", path);
  }
  uint8_t *buf = malloc(st.st_size ? (size_t)st.st_size : 1);
  if (!buf) {
    close(fd);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory for %s", path);
  }
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      free(buf);
      close(fd);
      return ckv_fail(err, errlen, -e, "reading %s: %s", path, n < 0 ? strerror(e) : "the file shrank");
    }
    got += (size_t)n;
  }
  close(fd);
  *ret = buf;
  *ret_len = got;
  return CKV_OK;
}

/* Seals buf for tenant under key and stores it. */
static int put_sealed(ckv_remote *r, const char *tenant, const char *key, const uint8_t *buf, size_t len,
                      uint64_t *ret_stored, char *err, size_t errlen) {
  const ckv_seal *seal = ckv_remote_seal(r);
  if (!seal) return ckv_fail(err, errlen, CKV_ERR_INVALID, "the remote store has no key to seal values with");
  uint8_t *sealed = NULL;
  size_t sealed_len = 0;
  if (ckv_seal_wrap(seal, tenant, key, buf, len, &sealed, &sealed_len) < 0)
    return ckv_fail(err, errlen, -ENOMEM, "out of memory sealing %zu bytes", len);
  int rc = ckv_remote_put(r, key, sealed, sealed_len, err, errlen);
  free(sealed);
  if (rc == CKV_OK && ret_stored) *ret_stored = sealed_len; /* what the store holds */
  return rc;
}

/* Reads the value under key (at most max_bytes of snapshot) and opens its seal for tenant. */
static int get_sealed(ckv_remote *r, const char *tenant, const char *key, uint64_t max_bytes, uint8_t **ret,
                      size_t *ret_len, char *err, size_t errlen) {
  const ckv_seal *seal = ckv_remote_seal(r);
  if (!seal) return ckv_fail(err, errlen, CKV_ERR_INVALID, "the remote store has no key to open values with");
  uint8_t *sealed = NULL;
  size_t sealed_len = 0;
  int rc = ckv_remote_get(r, key, max_bytes ? max_bytes + CKV_SEAL_OVERHEAD : 0, &sealed, &sealed_len, err, errlen);
  if (rc < 0) return rc;
  char serr[512];
  rc = ckv_seal_unwrap(seal, tenant, key, sealed, sealed_len, ret, ret_len, serr, sizeof serr);
  free(sealed);
  if (rc < 0) return ckv_fail(err, errlen, rc, "the remote store %s: %s", ckv_remote_url_text(r), serr);
  return CKV_OK;
}

static int key_of(const char *tenant, const char *model_id, const char *model_revision, const char *name, char *key,
                  size_t len, char *err, size_t errlen) {
  int r = ckv_remote_key(CKV_SNAP_VERSION, tenant, model_id ? model_id : "", model_revision ? model_revision : "",
                         name, key, len);
  if (r < 0) return ckv_fail(err, errlen, CKV_ERR_INVALID, "no remote store key can be made for snapshot '%s'", name);
  return CKV_OK;
}

int ckv_remote_snap_push(ckv_remote *r, const char *state_dir, const char *tenant, const char *model_id,
                         const char *model_revision, const char *name, char *err, size_t errlen) {
  char key[CKV_REMOTE_KEY_MAX], path[4096];
  int rc = key_of(tenant, model_id, model_revision, name, key, sizeof key, err, errlen);
  if (rc < 0) return rc;
  if ((rc = ckv_snapdir_file(state_dir, tenant, name, path, sizeof path)) < 0)
    return ckv_fail(err, errlen, rc, "no snapshot file for '%s'", name);
  uint8_t *buf = NULL;
  size_t len = 0;
  if ((rc = slurp(path, &buf, &len, err, errlen)) < 0) return rc;
  rc = put_sealed(r, tenant, key, buf, len, NULL, err, errlen);
  free(buf);
  return rc;
}

int ckv_remote_snap_load(ckv_remote *r, const char *state_dir, const char *tenant, const char *model_id,
                         const char *model_revision, const char *name, uint64_t max_bytes, ckv_snap *ret,
                         ckv_snap_origin *ret_origin, char *err, size_t errlen) {
  char path[4096], lerr[768] = "", rerr[3072] = "";
  ckv_snap local, remote;
  int lr = -ENOENT, rr = -ENOENT;
  if (ckv_snapdir_file(state_dir, tenant, name, path, sizeof path) == CKV_OK)
    lr = ckv_snapdir_read(path, &local, lerr, sizeof lerr);
  if (!r) {
    if (lr == CKV_OK) {
      *ret = local;
      *ret_origin = CKV_SNAP_FROM_LOCAL;
    } else {
      snprintf(err, errlen, "%s", lr == -ENOENT ? "no such snapshot" : lerr);
    }
    return lr;
  }
  char key[CKV_REMOTE_KEY_MAX];
  uint8_t *buf = NULL;
  size_t len = 0;
  rr = key_of(tenant, model_id, model_revision, name, key, sizeof key, rerr, sizeof rerr);
  if (rr == CKV_OK) rr = get_sealed(r, tenant, key, max_bytes, &buf, &len, rerr, sizeof rerr);
  if (rr == CKV_OK) {
    char perr[320];
    rr = ckv_snap_parse(buf, len, &remote, perr, sizeof perr);
    free(buf);
    if (rr < 0) snprintf(rerr, sizeof rerr, "the remote store's copy (%s, key %s): %s", ckv_remote_url_text(r), key, perr);
  }
  /* A copy that exists and fails validation refuses the restore: falling back
   * to the other one would hand out an older context without a word. */
  if (lr < 0 && lr != -ENOENT) {
    if (rr == CKV_OK) ckv_snap_done(&remote);
    return ckv_fail(err, errlen, lr, "%s", lerr);
  }
  if (rr < 0 && rr != -ENOENT && rr != -EIO) {
    if (lr == CKV_OK) ckv_snap_done(&local);
    return ckv_fail(err, errlen, rr, "%s", rerr);
  }
  if (rr == -EIO) {
    if (lr == -ENOENT) return ckv_fail(err, errlen, -EIO, "no local snapshot, and %s", rerr);
    ckv_log(CKV_LOG_WARNING, "remote-unavailable", tenant, name,
            "%s; restoring the local snapshot, which may be older than the store's", rerr);
    *ret = local;
    *ret_origin = CKV_SNAP_FROM_LOCAL;
    return CKV_OK;
  }
  if (lr == -ENOENT && rr == -ENOENT)
    return ckv_fail(err, errlen, -ENOENT, "neither here nor in the remote store %s (key %s)", ckv_remote_url_text(r), key);
  bool take_remote = lr == -ENOENT || (rr == CKV_OK && remote.saved_at_ms > local.saved_at_ms);
  if (take_remote) {
    if (lr == CKV_OK) ckv_snap_done(&local);
    *ret = remote;
  } else {
    if (rr == CKV_OK) ckv_snap_done(&remote);
    *ret = local;
  }
  *ret_origin = take_remote ? CKV_SNAP_FROM_REMOTE : CKV_SNAP_FROM_LOCAL;
  return CKV_OK;
}

/* ---- the remote tier (tier.h): a session's tier file, moved to the store ---- */

static int tier_key_of(const char *tenant, const char *model_id, const char *model_revision, const char *id,
                       char *key, size_t len, char *err, size_t errlen) {
  if (ckv_remote_tier_key(CKV_SNAP_VERSION, tenant, model_id ? model_id : "", model_revision ? model_revision : "", id,
                          key, len) < 0)
    return ckv_fail(err, errlen, CKV_ERR_INVALID, "no remote store key can be made for session '%s'", id);
  return CKV_OK;
}

int ckv_remote_tier_push(ckv_remote *r, const char *state_dir, const char *tenant, const char *model_id,
                         const char *model_revision, const char *id, uint64_t *ret_bytes, char *err, size_t errlen) {
  char key[CKV_REMOTE_KEY_MAX], path[4096];
  int rc = tier_key_of(tenant, model_id, model_revision, id, key, sizeof key, err, errlen);
  if (rc < 0) return rc;
  if ((rc = ckv_snapdir_area_file(state_dir, CKV_SNAPDIR_TIER, tenant, id, path, sizeof path)) < 0)
    return ckv_fail(err, errlen, rc, "no tier file for session '%s'", id);
  uint8_t *buf = NULL;
  size_t len = 0;
  if ((rc = slurp(path, &buf, &len, err, errlen)) < 0) return rc;
  rc = put_sealed(r, tenant, key, buf, len, ret_bytes, err, errlen);
  free(buf);
  return rc;
}

int ckv_remote_tier_load(ckv_remote *r, const char *tenant, const char *model_id, const char *model_revision,
                         const char *id, uint64_t max_bytes, ckv_snap *ret, ckv_store_fence *ret_fence, char *err,
                         size_t errlen) {
  char key[CKV_REMOTE_KEY_MAX], fkey[CKV_REMOTE_KEY_MAX];
  int rc = tier_key_of(tenant, model_id, model_revision, id, key, sizeof key, err, errlen);
  if (rc < 0) return rc;
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!ret_fence) {
    if ((rc = get_sealed(r, tenant, key, max_bytes, &buf, &len, err, errlen)) < 0) return rc;
  } else {
    if (ckv_remote_fence_key(tenant, id, fkey, sizeof fkey) < 0)
      return ckv_fail(err, errlen, CKV_ERR_INVALID, "no remote store key can be made for the fence of '%s'", id);
    const ckv_seal *seal = ckv_remote_seal(r);
    if (!seal) return ckv_fail(err, errlen, CKV_ERR_INVALID, "the remote store has no key to open values with");
    uint8_t *sealed = NULL, *rec = NULL;
    size_t sealed_len = 0, rec_len = 0;
    rc = ckv_remote_get_with_side(r, key, max_bytes ? max_bytes + CKV_SEAL_OVERHEAD : 0, fkey, CKV_FENCE_RECORD_MAX,
                                  &sealed, &sealed_len, &rec, &rec_len, err, errlen);
    if (rc == CKV_OK || rc == -ENOENT) {
      /* a record too long to be one was not read: refused all the same */
      static const uint8_t too_long[CKV_FENCE_RECORD_MAX + 1];
      ckv_fence_open(r, tenant, fkey, rec ? rec : rec_len ? too_long : NULL, rec ? rec_len : sizeof too_long,
                     ret_fence);
      free(rec);
    }
    if (rc < 0) return rc;
    char serr[512];
    rc = ckv_seal_unwrap(seal, tenant, key, sealed, sealed_len, &buf, &len, serr, sizeof serr);
    free(sealed);
    if (rc < 0) return ckv_fail(err, errlen, rc, "the remote store %s: %s", ckv_remote_url_text(r), serr);
  }
  char perr[320];
  rc = ckv_snap_parse(buf, len, ret, perr, sizeof perr);
  free(buf);
  if (rc < 0) return ckv_fail(err, errlen, rc, "the remote store's copy (%s, key %s): %s", ckv_remote_url_text(r), key, perr);
  return CKV_OK;
}

int ckv_remote_tier_drop(ckv_remote *r, const char *tenant, const char *model_id, const char *model_revision,
                         const char *id, char *err, size_t errlen) {
  char key[CKV_REMOTE_KEY_MAX];
  int rc = tier_key_of(tenant, model_id, model_revision, id, key, sizeof key, err, errlen);
  if (rc < 0) return rc;
  return ckv_remote_del(r, key, err, errlen);
}
