/* test_warmlog.c - the warm journal's append-only log (persist/warmlog.c):
 * records read back in order with their names and entries; a log cut at
 * every byte of its last record (a torn tail) gives exactly the records
 * before it and says it was cut; a byte flipped anywhere in a record in the
 * middle cuts the log there (that record and every one after it are not
 * applied, though the later ones are intact); a log that follows another
 * checkpoint is stale; a damaged file header is refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "persist/warmlog.h"
#include "testutil.h"

#define MSUM UINT64_C(0x1234abcd5678ef01)

/* A log of n records in `dir` (a state directory's warm/): PUT t/s<i> with an entry of 100+i
 * bytes (i, i+1, ...), every third a DEL.  Returns the file's path; the
 * records' offsets go to off[] (off[n] = the file's size). */
static char *make_log(const char *dir, size_t n, size_t *off) {
  char *path = malloc(4300);
  cr_assert_not_null(path);
  char err[400];
  int fd = -1;
  cr_assert_eq(ckv_warmlog_create(dir, MSUM, &fd, err, sizeof err), CKV_OK, "%s", err);
  size_t at = CKV_WARMLOG_HEADER_BYTES;
  for (size_t i = 0; i < n; i++) {
    ckv_warmlog_buf b = {0};
    char id[32];
    snprintf(id, sizeof id, "s%zu", i);
    uint8_t entry[200];
    for (size_t k = 0; k < sizeof entry; k++) entry[k] = (uint8_t)(i + k);
    if (i % 3 == 2)
      ckv_warmlog_encode(&b, i + 1, CKV_WARMLOG_DEL, "t", id, NULL, 0);
    else
      ckv_warmlog_encode(&b, i + 1, CKV_WARMLOG_PUT, "t", id, entry, 100 + i);
    cr_assert_not(b.oom);
    cr_assert_eq(ckv_warmlog_append(fd, b.p, b.n, err, sizeof err), CKV_OK, "%s", err);
    off[i] = at;
    at += b.n;
    ckv_warmlog_buf_done(&b);
  }
  off[n] = at;
  close(fd);
  snprintf(path, 4300, "%s/%s", dir, CKV_WARM_LOG);
  return path;
}

static void expect_records(const ckv_warmlog *l, size_t n) {
  cr_assert_eq(l->n, n, "%zu records read, %zu expected (cut: %s)", l->n, n, l->cut);
  for (size_t i = 0; i < n; i++) {
    const ckv_warmlog_rec *r = &l->recs[i];
    char id[32];
    snprintf(id, sizeof id, "s%zu", i);
    cr_assert_eq(r->seq, i + 1);
    cr_assert_str_eq(r->tenant, "t");
    cr_assert_str_eq(r->id, id);
    if (i % 3 == 2) {
      cr_assert_eq(r->type, CKV_WARMLOG_DEL);
      cr_assert_eq(r->entry_len, 0);
    } else {
      cr_assert_eq(r->type, CKV_WARMLOG_PUT);
      cr_assert_eq(r->entry_len, 100 + i);
      for (size_t k = 0; k < r->entry_len; k++) cr_assert_eq(r->entry[k], (uint8_t)(i + k));
    }
  }
}

static void flip(const char *path, size_t at) {
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0);
  uint8_t b;
  cr_assert_eq(pread(fd, &b, 1, (off_t)at), 1);
  b ^= 0x40;
  cr_assert_eq(pwrite(fd, &b, 1, (off_t)at), 1);
  close(fd);
}

Test(warmlog, records_read_back_in_order) {
  char *dir = ckv_test_tmpdir("ckv-wlog");
  size_t off[9];
  char *path = make_log(dir, 8, off);
  ckv_warmlog l;
  char err[400];
  cr_assert_eq(ckv_warmlog_read(dir, MSUM, &l, err, sizeof err), CKV_OK, "%s", err);
  expect_records(&l, 8);
  cr_assert_str_empty(l.cut);
  cr_assert_eq(l.good_bytes, off[8]);
  ckv_warmlog_done(&l);
  free(path);
  ckv_test_rmdir(dir);
}

Test(warmlog, torn_tail_cut_at_last_good_record) {
  char *dir = ckv_test_tmpdir("ckv-wlog");
  size_t off[7];
  char *path = make_log(dir, 6, off);
  char err[400];
  uint8_t *whole = malloc(off[6]);
  cr_assert_not_null(whole);
  int fd = open(path, O_RDONLY);
  cr_assert_eq(read(fd, whole, off[6]), (ssize_t)off[6]);
  close(fd);
  /* every length from the start of the last record to one byte short of its end */
  for (size_t len = off[5]; len < off[6]; len++) {
    fd = open(path, O_WRONLY | O_TRUNC);
    cr_assert_eq(write(fd, whole, len), (ssize_t)len);
    close(fd);
    ckv_warmlog l;
    cr_assert_eq(ckv_warmlog_read(dir, MSUM, &l, err, sizeof err), CKV_OK, "%s", err);
    expect_records(&l, 5);
    cr_assert_eq(l.good_bytes, off[5]);
    if (len > off[5])
      cr_assert(strstr(l.cut, "record 6") && strstr(l.cut, "torn"), "cut at %zu bytes: '%s'", len, l.cut);
    else
      cr_assert_str_empty(l.cut);
    ckv_warmlog_done(&l);
  }
  free(whole);
  free(path);
  ckv_test_rmdir(dir);
}

Test(warmlog, corrupt_record_in_the_middle_cuts_everything_after_it) {
  char *dir = ckv_test_tmpdir("ckv-wlog");
  size_t off[9];
  char *path = make_log(dir, 8, off);
  char err[400];
  /* every byte of record 4 (index 3), flipped alone: records 1-3 stay, 4-8 go */
  for (size_t at = off[3]; at < off[4]; at++) {
    flip(path, at);
    ckv_warmlog l;
    cr_assert_eq(ckv_warmlog_read(dir, MSUM, &l, err, sizeof err), CKV_OK, "%s", err);
    expect_records(&l, 3);
    cr_assert_eq(l.good_bytes, off[3], "byte %zu flipped: %llu good bytes", at, (unsigned long long)l.good_bytes);
    cr_assert(strstr(l.cut, "record 4"), "byte %zu flipped: cut '%s'", at, l.cut);
    ckv_warmlog_done(&l);
    flip(path, at);
  }
  free(path);
  ckv_test_rmdir(dir);
}

Test(warmlog, stale_or_damaged_header) {
  char *dir = ckv_test_tmpdir("ckv-wlog");
  size_t off[3];
  char *path = make_log(dir, 2, off);
  char err[400];
  ckv_warmlog l;
  cr_assert_eq(ckv_warmlog_read(dir, MSUM + 1, &l, err, sizeof err), -ESTALE);
  for (size_t at = 0; at < CKV_WARMLOG_HEADER_BYTES; at++) {
    flip(path, at);
    int r = ckv_warmlog_read(dir, MSUM, &l, err, sizeof err);
    cr_assert(r == CKV_ERR_CORRUPT, "header byte %zu flipped: %d", at, r);
    flip(path, at);
  }
  ckv_warmlog_remove(dir);
  cr_assert_eq(ckv_warmlog_read(dir, MSUM, &l, err, sizeof err), -ENOENT);
  free(path);
  ckv_test_rmdir(dir);
}
