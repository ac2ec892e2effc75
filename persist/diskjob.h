/* diskjob.h - the disk index (diskuse.h) and the I/O thread's jobs
 * (snapio.h): a write is admitted against its tenant's quota_disk and
 * max_snapshots before it is queued, its reservation rides on the job, and
 * what the job did to the state directory reaches the index when it lands.
 * Runs on the server loop. */
#ifndef CKV_PERSIST_DISKJOB_H
#define CKV_PERSIST_DISKJOB_H

#include <stddef.h>
#include <stdint.h>

#include "persist/diskuse.h"
#include "persist/persist.h"

typedef struct ckv_tenant ckv_tenant;

/* Job j came back from the I/O thread (or ran on the loop): the index
 * takes what it did (a file written or removed; a failed write leaves the
 * file it would have replaced) and its reservation is given back.  Call
 * once per job, before its completion, wherever the job is collected. */
void ckv_persist_job_landed(ckv_persist *p, ckv_snapio_job *j);

/* May `bytes` be written as file `name` (area) of tenant t, within its
 * quota_disk and max_snapshots?  CKV_OK with j->disk_claim holding the
 * reservation (given back when j lands, or by the job's destroy), or
 * CKV_ERR_QUOTA with err naming the numbers. */
int ckv_persist_disk_admit(ckv_persist *p, const ckv_tenant *t, ckv_diskuse_area area, const char *name,
                           uint64_t bytes, ckv_snapio_job *j, char *err, size_t errlen);

#endif
