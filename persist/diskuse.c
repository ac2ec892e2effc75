/* diskuse.c - the index of the tenants' files in the state directory (see
 * diskuse.h): tenant name -> one map of files per area, each file its size
 * (and, for a snapshot, its header's identity), with the tenant's totals
 * kept as entries come and go. */
#include "persist/diskuse.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "common/strmap.h"
#include "persist/snapdir.h"
#include "persist/snapshot.h"
#include "persist/statefile.h"

/* Unreadable snapshots said one by one at start-up; the rest are counted. */
#define UNREADABLE_SAID 10u

typedef struct du_file {
  uint64_t bytes;
  ckv_diskuse_snapinfo *info; /* SNAPSHOT only; NULL elsewhere */
} du_file;

typedef struct du_tenant {
  ckv_diskuse_usage use;
  ckv_strmap *files[CKV_DISKUSE_AREAS_]; /* name -> du_file */
} du_tenant;

struct ckv_diskuse {
  ckv_strmap *tenants; /* name -> du_tenant */
};

static const char *const area_dirs[CKV_DISKUSE_AREAS_] = {CKV_SNAPDIR_SNAPSHOTS, CKV_SNAPDIR_AUTOSAVE,
                                                          CKV_SNAPDIR_TIER};
static const char *const area_what[CKV_DISKUSE_AREAS_] = {"snapshot", "autosave", "disk-tier file"};

static ckv_diskuse_snapinfo *info_free(ckv_diskuse_snapinfo *i) {
  if (!i) return NULL;
  free((char *)i->session_id);
  free((char *)i->model_id);
  free((char *)i->model_revision);
  free((char *)i->error);
  free(i);
  return NULL;
}

static du_file *file_free(du_file *f) {
  if (f) info_free(f->info);
  free(f);
  return NULL;
}

static du_tenant *tenant_free(du_tenant *t) {
  if (!t) return NULL;
  for (int a = 0; a < CKV_DISKUSE_AREAS_; a++) {
    size_t cur = 0;
    du_file *f;
    while ((f = ckv_strmap_next(t->files[a], &cur, NULL))) file_free(f);
    ckv_strmap_free(t->files[a]);
  }
  free(t);
  return NULL;
}

int ckv_diskuse_new(ckv_diskuse **ret) {
  ckv_diskuse *du = calloc(1, sizeof(*du));
  if (!du || ckv_strmap_new(&du->tenants) < 0) {
    free(du);
    return -ENOMEM;
  }
  *ret = du;
  return CKV_OK;
}

ckv_diskuse *ckv_diskuse_free(ckv_diskuse *du) {
  if (!du) return NULL;
  size_t cur = 0;
  du_tenant *t;
  while ((t = ckv_strmap_next(du->tenants, &cur, NULL))) tenant_free(t);
  ckv_strmap_free(du->tenants);
  free(du);
  return NULL;
}

static du_tenant *tenant_of(const ckv_diskuse *du, const char *name) {
  return du && name ? ckv_strmap_get(du->tenants, name) : NULL;
}

static du_tenant *tenant_make(ckv_diskuse *du, const char *name) {
  du_tenant *t = tenant_of(du, name);
  if (t) return t;
  if (!(t = calloc(1, sizeof(*t)))) return NULL;
  for (int a = 0; a < CKV_DISKUSE_AREAS_; a++)
    if (ckv_strmap_new(&t->files[a]) < 0) return tenant_free(t);
  if (ckv_strmap_put(du->tenants, name, t) < 0) return tenant_free(t);
  return t;
}

static char *dup_or_null(const char *s, bool *oom) {
  char *d = strdup(s ? s : "");
  if (!d) *oom = true;
  return d;
}

static ckv_diskuse_snapinfo *info_new(const ckv_snap *h, const char *error) {
  ckv_diskuse_snapinfo *i = calloc(1, sizeof(*i));
  if (!i) return NULL;
  bool oom = false;
  if (error) {
    i->error = dup_or_null(error, &oom);
  } else {
    i->session_id = dup_or_null(h->session_id, &oom);
    i->model_id = dup_or_null(h->model_id, &oom);
    i->model_revision = dup_or_null(h->model_revision, &oom);
    i->tokens = h->tokens.n;
    i->saved_at_ms = h->saved_at_ms;
    i->committed_only = (h->flags & CKV_SNAP_COMMITTED_ONLY) != 0;
    i->geom = h->geom;
    i->draft_tokens = h->draft_tokens;
    i->commit_tokens = h->commit_tokens;
  }
  return oom ? info_free(i) : i;
}

static void uncount(du_tenant *t, ckv_diskuse_area area, const du_file *f) {
  t->use.bytes -= f->bytes;
  t->use.area_bytes[area] -= f->bytes;
  t->use.files[area]--;
}

int ckv_diskuse_put(ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name, uint64_t bytes,
                    const ckv_snap *info, const char *error) {
  if (!du || (unsigned)area >= CKV_DISKUSE_AREAS_) return CKV_ERR_INVALID;
  du_tenant *t = tenant_make(du, tenant);
  if (!t) return -ENOMEM;
  du_file *f = calloc(1, sizeof(*f));
  if (!f) return -ENOMEM;
  f->bytes = bytes;
  if (area == CKV_DISKUSE_SNAPSHOT && (info || error) && !(f->info = info_new(info, error))) {
    free(f);
    return -ENOMEM;
  }
  du_file *old = ckv_strmap_get(t->files[area], name);
  if (ckv_strmap_put(t->files[area], name, f) < 0) {
    file_free(f);
    return -ENOMEM;
  }
  if (old) { /* a copy replaced: only the growth counts */
    uncount(t, area, old);
    file_free(old);
  }
  t->use.bytes += bytes;
  t->use.area_bytes[area] += bytes;
  t->use.files[area]++;
  return CKV_OK;
}

void ckv_diskuse_del(ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name) {
  du_tenant *t = tenant_of(du, tenant);
  if (!t || (unsigned)area >= CKV_DISKUSE_AREAS_) return;
  du_file *f = ckv_strmap_del(t->files[area], name);
  if (!f) return;
  uncount(t, area, f);
  file_free(f);
}

bool ckv_diskuse_has(const ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name,
                     uint64_t *ret_bytes) {
  const du_tenant *t = tenant_of(du, tenant);
  const du_file *f = t && (unsigned)area < CKV_DISKUSE_AREAS_ ? ckv_strmap_get(t->files[area], name) : NULL;
  if (f && ret_bytes) *ret_bytes = f->bytes;
  return f != NULL;
}

void ckv_diskuse_usage_of(const ckv_diskuse *du, const char *tenant, ckv_diskuse_usage *ret) {
  const du_tenant *t = tenant_of(du, tenant);
  *ret = t ? t->use : (ckv_diskuse_usage){0};
}

int ckv_diskuse_admit(ckv_diskuse *du, const char *tenant, ckv_diskuse_area area, const char *name, uint64_t bytes,
                      const ckv_diskuse_limits *lim, ckv_diskuse_claim *ret, char *err, size_t errlen) {
  *ret = (ckv_diskuse_claim){0};
  if (!du || (unsigned)area >= CKV_DISKUSE_AREAS_) return CKV_OK;
  uint64_t old = 0;
  bool exists = ckv_diskuse_has(du, tenant, area, name, &old);
  uint64_t growth = bytes > old ? bytes - old : 0;
  uint32_t new_files = area == CKV_DISKUSE_SNAPSHOT && !exists;
  ckv_diskuse_usage u;
  ckv_diskuse_usage_of(du, tenant, &u);
  if (new_files && lim->max_snapshots && u.files[CKV_DISKUSE_SNAPSHOT] + u.reserved_snapshots + 1 > lim->max_snapshots) {
    snprintf(err, errlen,
             "tenant '%s' max_snapshots: %" PRIu32 " snapshots; %" PRIu64 " saved + %" PRIu64
             " being written + 1 for the new snapshot '%s' would pass it (saving over an existing name is "
             "allowed)",
             tenant, lim->max_snapshots, u.files[CKV_DISKUSE_SNAPSHOT], u.reserved_snapshots, name);
    return CKV_ERR_QUOTA;
  }
  if (growth && lim->quota_disk && u.bytes + u.reserved + growth > lim->quota_disk) {
    char net[96] = "";
    if (exists) snprintf(net, sizeof net, " (%" PRIu64 " bytes, less the %" PRIu64 " of the copy it replaces)", bytes, old);
    snprintf(err, errlen,
             "tenant '%s' quota_disk: %" PRIu64 " bytes; %" PRIu64 " used + %" PRIu64 " being written + %" PRIu64
             " for this %s '%s'%s would pass it",
             tenant, lim->quota_disk, u.bytes, u.reserved, growth, area_what[area], name, net);
    return CKV_ERR_QUOTA;
  }
  if (!growth && !new_files) return CKV_OK;
  du_tenant *t = tenant_make(du, tenant);
  if (!t) return CKV_OK; /* out of memory: admitted unreserved rather than refused for nothing */
  t->use.reserved += growth;
  t->use.reserved_snapshots += new_files;
  *ret = (ckv_diskuse_claim){.bytes = growth, .files = new_files};
  return CKV_OK;
}

void ckv_diskuse_release(ckv_diskuse *du, const char *tenant, ckv_diskuse_claim *claim) {
  du_tenant *t = tenant_of(du, tenant);
  if (t) {
    t->use.reserved -= claim->bytes < t->use.reserved ? claim->bytes : t->use.reserved;
    t->use.reserved_snapshots -= claim->files < t->use.reserved_snapshots ? claim->files : t->use.reserved_snapshots;
  }
  *claim = (ckv_diskuse_claim){0};
}

/* ---- the listing ---------------------------------------------------------- */

typedef struct listed {
  const char *tenant, *name;
  const du_file *f;
} listed;

static int by_tenant_name(const void *a, const void *b) {
  const listed *x = a, *y = b;
  int c = strcmp(x->tenant, y->tenant);
  return c ? c : strcmp(x->name, y->name);
}

int ckv_diskuse_each_snapshot(const ckv_diskuse *du, const char *tenant, ckv_diskuse_snap_fn fn, void *ctx) {
  if (!du) return CKV_OK;
  size_t n = 0, cap = 0, tc = 0;
  const char *tname;
  du_tenant *t;
  while ((t = ckv_strmap_next(du->tenants, &tc, &tname)))
    if (!tenant || strcmp(tname, tenant) == 0) cap += ckv_strmap_size(t->files[CKV_DISKUSE_SNAPSHOT]);
  if (!cap) return CKV_OK;
  listed *v = malloc(cap * sizeof(*v));
  if (!v) return -ENOMEM;
  tc = 0;
  while ((t = ckv_strmap_next(du->tenants, &tc, &tname))) {
    if (tenant && strcmp(tname, tenant) != 0) continue;
    size_t fc = 0;
    const char *fname;
    du_file *f;
    while (n < cap && (f = ckv_strmap_next(t->files[CKV_DISKUSE_SNAPSHOT], &fc, &fname)))
      v[n++] = (listed){tname, fname, f};
  }
  qsort(v, n, sizeof(*v), by_tenant_name);
  static const ckv_diskuse_snapinfo none = {.error = "not indexed (out of memory when it was written)"};
  for (size_t i = 0; i < n; i++) fn(ctx, v[i].tenant, v[i].name, v[i].f->bytes, v[i].f->info ? v[i].f->info : &none);
  free(v);
  return CKV_OK;
}

/* ---- start-up --------------------------------------------------------------- */

typedef struct scan_ctx {
  ckv_diskuse *du;
  ckv_diskuse_area area;
  size_t ok, bad;
} scan_ctx;

static void scan_one(void *ctx, const char *tenant, const char *name, const char *path, uint64_t bytes) {
  scan_ctx *c = ctx;
  if (c->area != CKV_DISKUSE_SNAPSHOT) {
    ckv_diskuse_put(c->du, tenant, c->area, name, bytes, NULL, NULL);
    return;
  }
  ckv_snap h;
  char err[320];
  int r = ckv_statefile_check_file(path, 2, err, sizeof err);
  if (r == CKV_OK) r = ckv_snap_read_header(path, &h, err, sizeof err);
  if (r < 0) {
    char why[400];
    snprintf(why, sizeof why, "%s (%s)", err, ckv_status_name(r));
    ckv_diskuse_put(c->du, tenant, c->area, name, bytes, NULL, why);
    if (c->bad++ < UNREADABLE_SAID)
      ckv_log(CKV_LOG_WARNING, "snapshot-unreadable", tenant, name, "%s: %s; it will not be restored", path, why);
    return;
  }
  c->ok++;
  ckv_diskuse_put(c->du, tenant, c->area, name, bytes, &h, NULL);
  ckv_snap_done(&h);
}

size_t ckv_diskuse_scan(ckv_diskuse *du, const char *state_dir) {
  if (!du || !state_dir || !*state_dir) return 0;
  scan_ctx c = {.du = du};
  for (int a = 0; a < CKV_DISKUSE_AREAS_; a++) {
    c.area = (ckv_diskuse_area)a;
    ckv_snapdir_area_each(state_dir, area_dirs[a], NULL, scan_one, &c);
  }
  if (c.bad > UNREADABLE_SAID)
    ckv_log(CKV_LOG_WARNING, "snapshot-unreadable", NULL, NULL,
            "and %zu more snapshots that cannot be read (ListSnapshots says why for each)", c.bad - UNREADABLE_SAID);
  static const char *const events[CKV_DISKUSE_AREAS_] = {"snapshot-found", "autosave-found", "tier-found"};
  static const char *const hints[CKV_DISKUSE_AREAS_] = {
      "restore with RestoreSession or OpenSession{resume}",
      "OpenSession with resume brings each back (when newer than its snapshot)",
      "OpenSession with resume brings each session back"};
  size_t cur = 0;
  const char *name;
  du_tenant *t;
  while ((t = ckv_strmap_next(du->tenants, &cur, &name)))
    for (int a = 0; a < CKV_DISKUSE_AREAS_; a++)
      if (t->use.files[a])
        ckv_log(CKV_LOG_NOTICE, events[a], name, NULL, "%" PRIu64 " %s%s, %" PRIu64 " bytes in %s/%s/%s; %s",
                t->use.files[a], area_what[a], t->use.files[a] == 1 ? "" : "s", t->use.area_bytes[a], state_dir,
                area_dirs[a], name, hints[a]);
  return c.ok;
}
