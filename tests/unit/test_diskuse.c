/* test_diskuse.c - the disk index (persist/diskuse.c) on its own: a file
 * that replaces an older copy counts its growth only, removals give room
 * back, admissions reserve until they land and refuse with the numbers,
 * the snapshot count limit ignores saves over an existing name, and the
 * listing comes out sorted with its header fields. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "persist/diskuse.h"
#include "persist/snapshot.h"

static ckv_diskuse *make(void) {
  ckv_diskuse *du = NULL;
  cr_assert_eq(ckv_diskuse_new(&du), CKV_OK);
  return du;
}

Test(diskuse, replaced_files_count_their_growth) {
  ckv_diskuse *du = make();
  ckv_diskuse_usage u;
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "s1", 1000, NULL, NULL), CKV_OK);
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_AUTOSAVE, "s1", 300, NULL, NULL), CKV_OK);
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "s1", 1200, NULL, NULL), CKV_OK); /* replaced */
  ckv_diskuse_usage_of(du, "a", &u);
  cr_assert_eq(u.bytes, 1500);
  cr_assert_eq(u.files[CKV_DISKUSE_SNAPSHOT], 1);
  cr_assert_eq(u.files[CKV_DISKUSE_AUTOSAVE], 1);
  ckv_diskuse_del(du, "a", CKV_DISKUSE_AUTOSAVE, "s1");
  ckv_diskuse_del(du, "a", CKV_DISKUSE_AUTOSAVE, "s1"); /* twice: nothing more */
  ckv_diskuse_usage_of(du, "a", &u);
  cr_assert_eq(u.bytes, 1200);
  ckv_diskuse_usage_of(du, "b", &u);
  cr_assert_eq(u.bytes, 0);
  ckv_diskuse_free(du);
}

Test(diskuse, quota_refused_with_the_numbers_and_reservations_count) {
  ckv_diskuse *du = make();
  ckv_diskuse_limits lim = {.quota_disk = 10000};
  ckv_diskuse_claim c1, c2, c3;
  char err[400];
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "old", 4000, NULL, NULL), CKV_OK);
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_SNAPSHOT, "n1", 5000, &lim, &c1, err, sizeof err), CKV_OK);
  cr_assert_eq(c1.bytes, 5000);
  /* 4000 used + 5000 being written + 2000 > 10000 */
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_TIER, "t", 2000, &lim, &c2, err, sizeof err), CKV_ERR_QUOTA);
  cr_assert(strstr(err, "quota_disk: 10000 bytes") && strstr(err, "4000 used") && strstr(err, "5000 being written") &&
                strstr(err, "2000 for this disk-tier file 't'"),
            "%s", err);
  /* replacing 'old' with 4500 bytes grows it by 500 only: fits */
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_SNAPSHOT, "old", 4500, &lim, &c3, err, sizeof err), CKV_OK);
  cr_assert_eq(c3.bytes, 500);
  /* another tenant has its own quota */
  cr_assert_eq(ckv_diskuse_admit(du, "b", CKV_DISKUSE_SNAPSHOT, "x", 9000, &lim, &c2, err, sizeof err), CKV_OK);
  ckv_diskuse_release(du, "b", &c2);
  /* n1 lands: the reservation turns into the file */
  ckv_diskuse_release(du, "a", &c1);
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "n1", 5000, NULL, NULL), CKV_OK);
  ckv_diskuse_release(du, "a", &c3);
  ckv_diskuse_usage u;
  ckv_diskuse_usage_of(du, "a", &u);
  cr_assert_eq(u.reserved, 0);
  cr_assert_eq(u.bytes, 9000);
  /* a write that does not grow the tenant is admitted even over the quota */
  lim.quota_disk = 100;
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_SNAPSHOT, "n1", 10, &lim, &c1, err, sizeof err), CKV_OK);
  cr_assert_eq(c1.bytes, 0);
  /* room comes back when a file goes */
  lim.quota_disk = 10000;
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_AUTOSAVE, "z", 2000, &lim, &c1, err, sizeof err), CKV_ERR_QUOTA);
  ckv_diskuse_del(du, "a", CKV_DISKUSE_SNAPSHOT, "old");
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_AUTOSAVE, "z", 2000, &lim, &c1, err, sizeof err), CKV_OK);
  ckv_diskuse_release(du, "a", &c1);
  ckv_diskuse_free(du);
}

Test(diskuse, snapshot_count_limit) {
  ckv_diskuse *du = make();
  ckv_diskuse_limits lim = {.max_snapshots = 2};
  ckv_diskuse_claim c;
  char err[400];
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "s1", 10, NULL, NULL), CKV_OK);
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_SNAPSHOT, "s2", 10, &lim, &c, err, sizeof err), CKV_OK);
  cr_assert_eq(c.files, 1);
  ckv_diskuse_claim c2;
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_SNAPSHOT, "s3", 10, &lim, &c2, err, sizeof err), CKV_ERR_QUOTA);
  cr_assert(strstr(err, "max_snapshots: 2 snapshots; 1 saved + 1 being written + 1 for the new snapshot 's3'"), "%s",
            err);
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_SNAPSHOT, "s1", 20, &lim, &c2, err, sizeof err), CKV_OK,
               "saving over an existing name is refused: %s", err);
  ckv_diskuse_release(du, "a", &c2);
  /* autosaves and tier files are not snapshots */
  cr_assert_eq(ckv_diskuse_admit(du, "a", CKV_DISKUSE_AUTOSAVE, "s3", 10, &lim, &c2, err, sizeof err), CKV_OK);
  ckv_diskuse_release(du, "a", &c2);
  ckv_diskuse_release(du, "a", &c);
  ckv_diskuse_free(du);
}

typedef struct seen {
  char names[8][32];
  uint64_t tokens[8];
  int n, errors;
} seen;

static void collect(void *ctx, const char *tenant, const char *name, uint64_t bytes,
                    const ckv_diskuse_snapinfo *info) {
  (void)bytes;
  seen *s = ctx;
  if (s->n < 8) {
    snprintf(s->names[s->n], sizeof s->names[0], "%s/%s", tenant, name);
    s->tokens[s->n] = info->tokens;
  }
  s->n++;
  if (info->error) s->errors++;
}

Test(diskuse, listing_sorted_with_header_fields) {
  ckv_diskuse *du = make();
  ckv_snap h;
  memset(&h, 0, sizeof h);
  snprintf(h.session_id, sizeof h.session_id, "sid");
  snprintf(h.model_id, sizeof h.model_id, "m");
  h.tokens.n = 42;
  cr_assert_eq(ckv_diskuse_put(du, "b", CKV_DISKUSE_SNAPSHOT, "z", 1, &h, NULL), CKV_OK);
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "y", 1, &h, NULL), CKV_OK);
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_SNAPSHOT, "x", 1, NULL, "damaged"), CKV_OK);
  cr_assert_eq(ckv_diskuse_put(du, "a", CKV_DISKUSE_TIER, "w", 1, NULL, NULL), CKV_OK); /* never listed */
  seen s = {0};
  cr_assert_eq(ckv_diskuse_each_snapshot(du, NULL, collect, &s), CKV_OK);
  cr_assert_eq(s.n, 3);
  cr_assert_str_eq(s.names[0], "a/x");
  cr_assert_str_eq(s.names[1], "a/y");
  cr_assert_str_eq(s.names[2], "b/z");
  cr_assert_eq(s.tokens[1], 42);
  cr_assert_eq(s.errors, 1);
  seen t = {0};
  cr_assert_eq(ckv_diskuse_each_snapshot(du, "b", collect, &t), CKV_OK);
  cr_assert_eq(t.n, 1);
  ckv_diskuse_free(du);
}
