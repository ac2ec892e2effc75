/* statefile.c - the state directory's files, opened trusting nothing (see statefile.h). */
#include "persist/statefile.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"

/* Whether st is the daemon's own and nobody else may change it. */
static bool owned_and_closed(const struct stat *st) {
  return st->st_uid == geteuid() && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

int ckv_statefile_check_dir(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) < 0) return -errno;
  if (S_ISDIR(st.st_mode) && owned_and_closed(&st)) return CKV_OK;
  if (!S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) {
    snprintf(err, errlen, "%.300s is not a directory", path);
    return -ENOTDIR;
  }
  snprintf(err, errlen,
           "%.300s is %s (mode %04o, owner uid %u): the state directory must be the daemon's alone (uid %u, no "
           "symlinks, not writable by group or others)",
           path, S_ISLNK(st.st_mode) ? "a symlink" : "not the daemon's", (unsigned)(st.st_mode & 07777),
           (unsigned)st.st_uid, (unsigned)geteuid());
  return CKV_ERR_AUTH;
}

int ckv_statefile_check_root(const char *state_dir, char *err, size_t errlen) {
  if (!state_dir || !*state_dir) return CKV_OK;
  struct stat st;
  if (stat(state_dir, &st) < 0) {
    if (errno == ENOENT) return CKV_OK; /* made (0700) at the first write */
    snprintf(err, errlen, "state_dir %.300s: %s", state_dir, strerror(errno));
    return -errno;
  }
  if (S_ISDIR(st.st_mode) && owned_and_closed(&st)) return CKV_OK;
  snprintf(err, errlen,
           "state_dir %.300s is %s (mode %04o, owner uid %u): it must be a directory of the daemon's user (uid %u) "
           "that neither its group nor others can write, or anyone who can would plant sessions in it (chown it, "
           "chmod 0700)",
           state_dir, S_ISDIR(st.st_mode) ? "not the daemon's alone" : "not a directory",
           (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)geteuid());
  return CKV_ERR_AUTH;
}

int ckv_statefile_check_file(const char *path, unsigned parents, char *err, size_t errlen) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  for (unsigned up = 0; up < parents; up++) {
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) break;
    *slash = 0;
    int r = ckv_statefile_check_dir(dir, err, errlen);
    if (r < 0) return r;
  }
  struct stat st;
  if (lstat(path, &st) < 0) {
    int e = errno;
    snprintf(err, errlen, "cannot open %.300s: %s", path, strerror(e));
    return -e;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%.300s is %s, not a regular file", path, S_ISLNK(st.st_mode) ? "a symlink" : "a special file");
    return S_ISLNK(st.st_mode) ? CKV_ERR_AUTH : CKV_ERR_CORRUPT;
  }
  if (!owned_and_closed(&st)) {
    snprintf(err, errlen,
             "%.300s has mode %04o and owner uid %u: only the daemon's own files (uid %u, not writable by group or "
             "others) are read",
             path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)geteuid());
    return CKV_ERR_AUTH;
  }
  return CKV_OK;
}
