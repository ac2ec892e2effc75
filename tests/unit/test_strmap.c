/* test_strmap.c - the daemon's string map (daemon/strmap.c): put, get,
 * replace, delete; removal while iterating; and a table that stays small
 * under churn (every commitkvctl run is a client that comes and goes: the
 * daemon's map of clients must not grow with how many ever came). */
#include "common/strmap.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "testcheck.h"

TestSuite(strmap, .fini = ckv_test_leak_check);

static ckv_strmap *mk(void) {
  ckv_strmap *m = NULL;
  cr_assert_eq(ckv_strmap_new(&m), CKV_OK);
  return m;
}

static void *val(uintptr_t i) { return (void *)(i + 1); } /* never NULL */

/* "PREFIX-I" in buf (32 bytes). */
static const char *key(char *buf, const char *prefix, uintptr_t i) {
  snprintf(buf, 32, "%s-%zu", prefix, (size_t)i);
  return buf;
}

/* Puts PREFIX-0 .. PREFIX-(n-1), each with val(i). */
static void put_all(ckv_strmap *m, const char *prefix, uintptr_t n) {
  char k[32];
  for (uintptr_t i = 0; i < n; i++) cr_assert_eq(ckv_strmap_put(m, key(k, prefix, i), val(i)), CKV_OK);
}

Test(strmap, put_get_replace_delete) {
  ckv_strmap *m = mk();
  char k[32];
  put_all(m, "key", 1000);
  cr_expect_eq(ckv_strmap_size(m), 1000);
  for (uintptr_t i = 0; i < 1000; i++) cr_assert_eq(ckv_strmap_get(m, key(k, "key", i)), val(i), "%s lost", k);
  cr_expect_eq(ckv_strmap_put(m, "key-7", val(70)), CKV_OK);
  cr_expect_eq(ckv_strmap_size(m), 1000, "a replace is not an insert");
  cr_expect_eq(ckv_strmap_get(m, "key-7"), val(70));
  for (uintptr_t i = 0; i < 1000; i += 2) cr_assert_not_null(ckv_strmap_del(m, key(k, "key", i)));
  cr_expect_null(ckv_strmap_del(m, "key-0"), "deleting twice finds nothing");
  cr_expect_null(ckv_strmap_get(m, "no-such-key"));
  cr_expect_eq(ckv_strmap_size(m), 500);
  for (uintptr_t i = 1; i < 1000; i += 2)
    cr_assert_not_null(ckv_strmap_get(m, key(k, "key", i)), "%s lost after its neighbours were deleted", k);
  ckv_strmap_free(m);
}

Test(strmap, remove_while_iterating_visits_every_entry) {
  ckv_strmap *m = mk();
  put_all(m, "c", 300);
  size_t cur = 0, seen = 0;
  const char *name;
  while (ckv_strmap_next(m, &cur, &name)) {
    char copy[32];
    snprintf(copy, sizeof(copy), "%s", name);
    cr_assert_not_null(ckv_strmap_del(m, copy));
    seen++;
  }
  cr_expect_eq(seen, 300);
  cr_expect_eq(ckv_strmap_size(m), 0);
  ckv_strmap_free(m);
}

Test(strmap, churn_keeps_the_table_small) {
  ckv_strmap *m = mk();
  char k[32];
  /* Four long-lived clients and 200000 that come and go, one at a time. */
  put_all(m, "worker", 4);
  size_t peak = 0;
  for (uintptr_t i = 0; i < 200000; i++) {
    cr_assert_eq(ckv_strmap_put(m, key(k, "ctl", i), val(i)), CKV_OK);
    cr_assert_eq(ckv_strmap_del(m, k), val(i));
    if (ckv_strmap_capacity(m) > peak) peak = ckv_strmap_capacity(m);
  }
  cr_expect_leq(peak, 64, "5 live keys at most, yet the table grew to %zu slots", peak);
  for (uintptr_t i = 0; i < 4; i++)
    cr_expect_eq(ckv_strmap_get(m, key(k, "worker", i)), val(i), "%s lost in the sweeps", k);
  cr_expect_eq(ckv_strmap_size(m), 4);
  ckv_strmap_free(m);
}
