/* diskjob.c - see diskjob.h. */
#include "persist/diskjob.h"

#include <stdbool.h>

#include "persist/snapio.h"
#include "store/tenant.h"

/* The index's area of job j's file; false: the job's area is no file of the state directory. */
static bool area_of(const ckv_snapio_job *j, ckv_diskuse_area *ret) {
  switch (j->area) {
    case CKV_SNAPIO_SNAPSHOT: *ret = CKV_DISKUSE_SNAPSHOT; return true;
    case CKV_SNAPIO_AUTOSAVE: *ret = CKV_DISKUSE_AUTOSAVE; return true;
    case CKV_SNAPIO_TIER: *ret = CKV_DISKUSE_TIER; return true;
    case CKV_SNAPIO_TIER_FIRST:
    case CKV_SNAPIO_TIER_REMOTE: break;
  }
  return false;
}

void ckv_persist_job_landed(ckv_persist *p, ckv_snapio_job *j) {
  ckv_diskuse_release(p->diskuse, j->tenant, &j->disk_claim);
  ckv_diskuse_area area;
  if (j->status < 0 || !area_of(j, &area)) return;
  if (j->kind == CKV_SNAPIO_SAVE)
    ckv_diskuse_put(p->diskuse, j->tenant, area, j->name, j->bytes, area == CKV_DISKUSE_SNAPSHOT ? &j->snap : NULL,
                    NULL);
  else if (j->kind == CKV_SNAPIO_REMOVE)
    ckv_diskuse_del(p->diskuse, j->tenant, area, j->name);
}

int ckv_persist_disk_admit(ckv_persist *p, const ckv_tenant *t, ckv_diskuse_area area, const char *name,
                           uint64_t bytes, ckv_snapio_job *j, char *err, size_t errlen) {
  ckv_diskuse_limits lim = {.quota_disk = t->quota_disk, .max_snapshots = t->max_snapshots};
  return ckv_diskuse_admit(p->diskuse, t->name, area, name, bytes, &lim, &j->disk_claim, err, errlen);
}
