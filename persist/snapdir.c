/* snapdir.c - the snapshot directory (see snapdir.h). */
#include "persist/snapdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "persist/snapshot.h"
#include "persist/statefile.h"

static int name_ok(const char *n) { return n && *n && n[0] != '.' && !strchr(n, '/'); }

static int mkdir_one(const char *path) {
  if (mkdir(path, 0700) == 0 || errno == EEXIST) return CKV_OK;
  return -errno;
}

int ckv_snapdir_area_dir(const char *state_dir, const char *area, const char *tenant, int create, char *dir,
                         size_t len, char *err, size_t errlen) {
  if (!state_dir || !*state_dir) {
    snprintf(err, errlen, "the daemon has no state directory ([daemon] state_dir, --state-dir)");
    return CKV_ERR_INVALID;
  }
  if (!name_ok(tenant)) {
    snprintf(err, errlen, "tenant name '%s' cannot name a directory", tenant ? tenant : "");
    return CKV_ERR_INVALID;
  }
  if (snprintf(dir, len, "%s/%s/%s", state_dir, area, tenant) >= (int)len) {
    snprintf(err, errlen, "snapshot directory path too long");
    return -ENAMETOOLONG;
  }
  if (!create) return CKV_OK;
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", state_dir);
  int r = mkdir_one(parent);
  if (r == CKV_OK) {
    snprintf(parent, sizeof parent, "%s/%s", state_dir, area);
    r = mkdir_one(parent);
  }
  if (r == CKV_OK) r = mkdir_one(dir);
  if (r < 0) {
    snprintf(err, errlen, "cannot create %s: %s", dir, strerror(-r));
    return r;
  }
  /* the area and the tenant's directory: the daemon's, never a symlink to somewhere else */
  if ((r = ckv_statefile_check_dir(parent, err, errlen)) < 0 || (r = ckv_statefile_check_dir(dir, err, errlen)) < 0) return r;
  return CKV_OK;
}

int ckv_snapdir_read(const char *path, ckv_snap *ret, char *err, size_t errlen) {
  int r = ckv_statefile_check_file(path, 2, err, errlen);
  return r < 0 ? r : ckv_snap_read(path, ret, err, errlen);
}

int ckv_snapdir_dir(const char *state_dir, const char *tenant, int create, char *dir, size_t len, char *err,
                    size_t errlen) {
  return ckv_snapdir_area_dir(state_dir, CKV_SNAPDIR_SNAPSHOTS, tenant, create, dir, len, err, errlen);
}

int ckv_snapdir_area_file(const char *state_dir, const char *area, const char *tenant, const char *name, char *path,
                          size_t len) {
  if (!state_dir || !*state_dir || !name_ok(tenant)) return CKV_ERR_INVALID;
  if (snprintf(path, len, "%s/%s/%s/%s%s", state_dir, area, tenant, name, CKV_SNAP_SUFFIX) >= (int)len)
    return -ENAMETOOLONG;
  return CKV_OK;
}

int ckv_snapdir_file(const char *state_dir, const char *tenant, const char *name, char *path, size_t len) {
  return ckv_snapdir_area_file(state_dir, CKV_SNAPDIR_SNAPSHOTS, tenant, name, path, len);
}

static int has_suffix(const char *n, const char *suf) {
  size_t a = strlen(n), b = strlen(suf);
  return a > b && strcmp(n + a - b, suf) == 0;
}

static void each_in(const char *state_dir, const char *area, const char *tenant, ckv_snapdir_fn fn, void *ctx) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s/%s/%s", state_dir, area, tenant) >= (int)sizeof dir) return;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!has_suffix(e->d_name, CKV_SNAP_SUFFIX)) continue;
    char path[4096 + 256], name[256];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;
    size_t n = strlen(e->d_name) - strlen(CKV_SNAP_SUFFIX);
    memcpy(name, e->d_name, n);
    name[n] = 0;
    fn(ctx, tenant, name, path, (uint64_t)st.st_size);
  }
  closedir(d);
}

void ckv_snapdir_area_each(const char *state_dir, const char *area, const char *tenant, ckv_snapdir_fn fn,
                           void *ctx) {
  if (!state_dir || !*state_dir) return;
  if (tenant) {
    if (name_ok(tenant)) each_in(state_dir, area, tenant, fn, ctx);
    return;
  }
  char top[4096];
  if (snprintf(top, sizeof top, "%s/%s", state_dir, area) >= (int)sizeof top) return;
  DIR *d = opendir(top);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)))
    if (name_ok(e->d_name)) each_in(state_dir, area, e->d_name, fn, ctx);
  closedir(d);
}

void ckv_snapdir_each(const char *state_dir, const char *tenant, ckv_snapdir_fn fn, void *ctx) {
  ckv_snapdir_area_each(state_dir, CKV_SNAPDIR_SNAPSHOTS, tenant, fn, ctx);
}

/* Whether directory entry n is a save cut short: NAME.ckvsnap~tmp~PID~N,
 * or the older .NAME.ckvsnap.tmp.PID.N.  Never a name ending in .ckvsnap:
 * that is a session's file, whatever its id looks like (".x.ckvsnap.tmp.1"
 * is a legal id). */
static bool is_temp(const char *n) {
  size_t len = strlen(n), sl = strlen(CKV_SNAP_SUFFIX);
  if (len >= sl && strcmp(n + len - sl, CKV_SNAP_SUFFIX) == 0) return false;
  return strstr(n, CKV_SNAP_SUFFIX CKV_SNAP_TEMP_MARK) || (n[0] == '.' && strstr(n, CKV_SNAP_SUFFIX ".tmp."));
}

/* Removes the temporary files of saves cut short in one tenant directory. */
static void clean_temps(const char *state_dir, const char *area, const char *tenant) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s/%s/%s", state_dir, area, tenant) >= (int)sizeof dir) return;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_temp(e->d_name)) continue;
    char path[4096 + 256];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) == 0)
      ckv_log(CKV_LOG_WARNING, "snapshot-temp-removed", tenant, NULL,
              "removed %s: a save cut short (the daemon died while writing); the previous snapshot of that name is "
              "intact",
              path);
  }
  closedir(d);
}

void ckv_snapdir_clean_temps(const char *state_dir, const char *area) {
  if (!state_dir || !*state_dir) return;
  char top[4096];
  if (snprintf(top, sizeof top, "%s/%s", state_dir, area) >= (int)sizeof top) return;
  DIR *d = opendir(top);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)))
    if (name_ok(e->d_name)) clean_temps(state_dir, area, e->d_name);
  closedir(d);
}

void ckv_snapdir_startup(const char *state_dir) {
  if (!state_dir || !*state_dir) return;
  ckv_snapdir_clean_temps(state_dir, CKV_SNAPDIR_SNAPSHOTS);
}
