/* test_tenant.c - store/tenant.c: the warm journal's hold on freed blocks
 * (issue 43): a block freed while the hold is on stays allocated (never
 * handed out again) until the journal says no entry names it, counts
 * against the arena and not the quota, and goes through the pins' deferral
 * when a save reads the arena at that moment. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "commitkv/status.h"
#include "kernels/format.h"
#include "shm/arena.h"
#include "store/tenant.h"

#define QUOTA (UINT64_C(1) << 20)

static const ckv_geometry k_geom = {2, 2, 32, CKV_DTYPE_FP16};

static ckv_tenant *tenant(void) {
  ckv_tenant *t = NULL;
  cr_assert_eq(ckv_tenant_new("t", QUOTA, ckv_tenant_arena_for_quota(QUOTA), 1, &ckv_arena_host_backend, &t), CKV_OK);
  return t;
}

static uint64_t block_bytes(void) { return ckv_draft_block_bytes(&k_geom, 16); }

static uint64_t alloc(ckv_tenant *t) {
  uint64_t off = 0;
  int r = ckv_tenant_block_alloc(t, block_bytes(), CKV_FORMAT_DRAFT, &off);
  cr_assert_eq(r, CKV_OK, "alloc: %s", ckv_strerror(r));
  return off;
}

typedef struct names {
  uint64_t off[8];
  size_t n;
} names;

static bool named(void *ctx, uint64_t offset) {
  const names *m = ctx;
  for (size_t i = 0; i < m->n; i++)
    if (m->off[i] == offset) return true;
  return false;
}

Test(tenant, journal_hold_keeps_freed_blocks_until_no_entry_names_them) {
  ckv_tenant *t = tenant();
  const uint64_t b = block_bytes();
  uint64_t off[3] = {alloc(t), alloc(t), alloc(t)};
  t->journal_hold = true;
  for (int i = 0; i < 3; i++) ckv_tenant_block_free(t, off[i], b, CKV_FORMAT_DRAFT);
  cr_assert_eq(t->bytes_used, 3 * b, "held blocks stay allocated");
  cr_assert_eq(t->held_bytes, 3 * b);
  cr_assert_eq(t->n_held, 3);
  /* they do not count against the quota: a tenant at its quota can still reclaim room */
  cr_assert(ckv_tenant_would_fit(t, QUOTA - 0), "held bytes counted against the quota");
  cr_assert_not(ckv_tenant_would_fit(t, QUOTA + 1));
  /* and nothing is handed out on top of them */
  for (int k = 0; k < 8; k++) {
    uint64_t o = alloc(t);
    for (int i = 0; i < 3; i++) cr_assert_neq(o, off[i], "a held block was handed out again");
  }
  /* an entry still names the second: only the others go back */
  names m = {.off = {off[1]}, .n = 1};
  uint64_t before = t->bytes_used;
  cr_assert_eq(ckv_tenant_release_held(t, named, &m), 2);
  cr_assert_eq(t->bytes_used, before - 2 * b);
  cr_assert_eq(t->held_bytes, b);
  cr_assert_eq(t->n_held, 1);
  cr_assert_eq(ckv_tenant_release_held(t, named, &m), 0, "a named block was given back");
  cr_assert_eq(ckv_tenant_release_held(t, NULL, NULL), 1);
  cr_assert_eq(t->held_bytes, 0);
  cr_assert_eq(t->bytes_used, before - 3 * b);
  ckv_tenant_free(t);
}

Test(tenant, held_blocks_released_under_a_pin_wait_for_the_unpin) {
  ckv_tenant *t = tenant();
  const uint64_t b = block_bytes();
  uint64_t o = alloc(t);
  t->journal_hold = true;
  ckv_tenant_block_free(t, o, b, CKV_FORMAT_DRAFT);
  ckv_tenant_pin(t); /* a save reads the arena now */
  cr_assert_eq(ckv_tenant_release_held(t, NULL, NULL), 1);
  cr_assert_eq(t->held_bytes, 0);
  cr_assert_eq(t->bytes_used, b, "given back under a pin: it waits for the unpin");
  cr_assert_neq(alloc(t), o, "a block a pinned save may read was handed out again");
  ckv_tenant_unpin(t);
  cr_assert_eq(t->bytes_used, b, "after the unpin only the new block is allocated");
  ckv_tenant_free(t);
}

Test(tenant, without_the_hold_a_free_is_immediate) {
  ckv_tenant *t = tenant();
  uint64_t o = alloc(t);
  ckv_tenant_block_free(t, o, block_bytes(), CKV_FORMAT_DRAFT);
  cr_assert_eq(t->bytes_used, 0);
  cr_assert_eq(t->n_held, 0);
  ckv_tenant_free(t);
}
