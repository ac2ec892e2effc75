/* snapdir.h - where snapshots live: state_dir/snapshots/TENANT/NAME.ckvsnap.
 *
 * One directory per tenant (mode 0700, like the state directory), so a
 * tenant's snapshots are found without reading anyone else's.  At start-up
 * the daemon indexes what it finds (diskuse.h): sessions come back
 * from their snapshots on RestoreSession or OpenSession{resume}, and what a
 * cut-short save left behind (a temporary file) is removed and said. */
#ifndef CKV_PERSIST_SNAPDIR_H
#define CKV_PERSIST_SNAPDIR_H

#include <stddef.h>
#include <stdint.h>

/* The areas of the state directory: user snapshots (save games, listed by
 * ListSnapshots) and the disk tier's files (tier.h: sessions moved out of
 * memory, never listed), kept apart so neither ever reads the other's. */
#define CKV_SNAPDIR_SNAPSHOTS "snapshots"
#define CKV_SNAPDIR_TIER "tier"
#define CKV_SNAPDIR_AUTOSAVE "autosave" /* autosave.h: crash copies of live sessions, never listed */

/* dir = state_dir/snapshots/tenant, created (with its parents) when `create`.
 * CKV_OK, CKV_ERR_INVALID (no state directory, or a tenant name that is no
 * directory name), -ENAMETOOLONG, or mkdir's -errno; err says which. */
int ckv_snapdir_dir(const char *state_dir, const char *tenant, int create, char *dir, size_t len, char *err,
                    size_t errlen);
/* The file of snapshot `name` of `tenant` (not created). */
int ckv_snapdir_file(const char *state_dir, const char *tenant, const char *name, char *path, size_t len);

/* Calls fn for every NAME.ckvsnap under state_dir/snapshots (only tenant's
 * when tenant is not NULL), tenants and names in directory order. */
typedef void (*ckv_snapdir_fn)(void *ctx, const char *tenant, const char *name, const char *path, uint64_t bytes);
void ckv_snapdir_each(const char *state_dir, const char *tenant, ckv_snapdir_fn fn, void *ctx);

/* The same for any area (CKV_SNAPDIR_*): state_dir/area/tenant[/name.ckvsnap]. */
int ckv_snapdir_area_dir(const char *state_dir, const char *area, const char *tenant, int create, char *dir,
                         size_t len, char *err, size_t errlen);
int ckv_snapdir_area_file(const char *state_dir, const char *area, const char *tenant, const char *name, char *path,
                          size_t len);
void ckv_snapdir_area_each(const char *state_dir, const char *area, const char *tenant, ckv_snapdir_fn fn,
                           void *ctx);
/* Removes the temporary files of writes a crash cut short in every tenant
 * directory of `area` (and says so). */
void ckv_snapdir_clean_temps(const char *state_dir, const char *area);

/* Reads and validates the snapshot file at path, a file of the state
 * directory (state_dir/AREA/TENANT/NAME.ckvsnap): trusted only when it and
 * its directories are the daemon's alone (statefile.h), then
 * ckv_snap_read. */
typedef struct ckv_snap ckv_snap;
int ckv_snapdir_read(const char *path, ckv_snap *ret, char *err, size_t errlen);

/* Start-up: removes temporary files of saves a crash cut short.  What is
 * there is indexed (and said, one line per tenant) by diskuse.h's scan. */
void ckv_snapdir_startup(const char *state_dir);

#endif
