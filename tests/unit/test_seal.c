/* test_seal.c - values in the remote store, sealed per tenant (persist/seal.c):
 * a value opens only with the secret, tenant and store key it was sealed
 * for; every flipped byte is refused; the secret file is created 0600 at the
 * first start, read back the same at the next, and refused when others may
 * read it or it has the wrong size. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "persist/seal.h"
#include "testutil.h"

static ckv_seal *open_in(const char *dir) {
  ckv_seal *s = NULL;
  char err[512];
  int r = ckv_seal_open(NULL, dir, &s, err, sizeof err);
  cr_assert_eq(r, CKV_OK, "%s", err);
  return s;
}

Test(seal, opens_only_for_its_secret_tenant_and_key) {
  char *dir = ckv_test_tmpdir("ckv-seal");
  ckv_seal *s = open_in(dir);
  const uint8_t plain[] = "the K/V of tenant a, session x";
  uint8_t *sealed = NULL, *back = NULL;
  size_t len = 0, back_len = 0;
  char err[512];
  cr_assert_eq(ckv_seal_wrap(s, "a", "ckv:v3:a:m:r:x", plain, sizeof plain, &sealed, &len), CKV_OK);
  cr_assert_eq(len, sizeof plain + CKV_SEAL_OVERHEAD);
  cr_assert_null(memmem(sealed, len, "tenant a", 8), "the plaintext shows through");
  cr_assert_eq(ckv_seal_unwrap(s, "a", "ckv:v3:a:m:r:x", sealed, len, &back, &back_len, err, sizeof err), CKV_OK, "%s",
               err);
  cr_assert(back_len == sizeof plain && memcmp(back, plain, back_len) == 0);
  free(back);
  /* another tenant, another key, every byte flipped in turn */
  cr_assert_eq(ckv_seal_unwrap(s, "b", "ckv:v3:a:m:r:x", sealed, len, &back, &back_len, err, sizeof err),
               CKV_ERR_CORRUPT);
  cr_assert_eq(ckv_seal_unwrap(s, "a", "ckv:v3:a:m:r:y", sealed, len, &back, &back_len, err, sizeof err),
               CKV_ERR_CORRUPT);
  for (size_t i = 0; i < len; i++) {
    sealed[i] ^= 0x01;
    cr_assert_eq(ckv_seal_unwrap(s, "a", "ckv:v3:a:m:r:x", sealed, len, &back, &back_len, err, sizeof err),
                 CKV_ERR_CORRUPT, "byte %zu flipped opened", i);
    sealed[i] ^= 0x01;
  }
  cr_assert_eq(ckv_seal_unwrap(s, "a", "ckv:v3:a:m:r:x", sealed, len - 1, &back, &back_len, err, sizeof err),
               CKV_ERR_CORRUPT, "a cut value opened");
  /* another daemon's secret */
  char *dir2 = ckv_test_tmpdir("ckv-seal-2");
  ckv_seal *s2 = open_in(dir2);
  cr_assert_eq(ckv_seal_unwrap(s2, "a", "ckv:v3:a:m:r:x", sealed, len, &back, &back_len, err, sizeof err),
               CKV_ERR_CORRUPT);
  cr_assert(strstr(err, "does not open"), "%s", err);
  free(sealed);
  ckv_seal_free(s);
  ckv_seal_free(s2);
  ckv_test_rmdir(dir);
  ckv_test_rmdir(dir2);
}

Test(seal, the_secret_file_is_the_daemons_alone) {
  char *dir = ckv_test_tmpdir("ckv-seal");
  char path[600], err[512];
  snprintf(path, sizeof path, "%s/%s", dir, CKV_SEAL_KEY_FILE);
  ckv_seal *s = open_in(dir); /* created at the first start */
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600);
  cr_assert_eq(st.st_size, 32);
  uint8_t *sealed = NULL, *back = NULL;
  size_t len, back_len;
  cr_assert_eq(ckv_seal_wrap(s, "t", "k", (const uint8_t *)"v", 1, &sealed, &len), CKV_OK);
  ckv_seal_free(s);
  s = open_in(dir); /* the next start reads the same secret */
  cr_assert_eq(ckv_seal_unwrap(s, "t", "k", sealed, len, &back, &back_len, err, sizeof err), CKV_OK, "%s", err);
  free(back);
  free(sealed);
  ckv_seal_free(s);
  /* readable by others: refused; the wrong size: refused; a given key_file that is missing: refused */
  cr_assert_eq(chmod(path, 0644), 0);
  cr_assert_eq(ckv_seal_open(NULL, dir, &s, err, sizeof err), CKV_ERR_AUTH, "a 0644 secret was taken");
  cr_assert(strstr(err, "0644"), "%s", err);
  cr_assert_eq(chmod(path, 0600), 0);
  cr_assert_eq(truncate(path, 16), 0);
  cr_assert_eq(ckv_seal_open(NULL, dir, &s, err, sizeof err), CKV_ERR_INVALID, "a 16-byte secret was taken");
  char missing[640];
  snprintf(missing, sizeof missing, "%s/none.key", dir);
  cr_assert_lt(ckv_seal_open(missing, dir, &s, err, sizeof err), 0, "a missing remote_key_file was made up");
  ckv_test_rmdir(dir);
}
