/* test_block_reuse.c - a reused block never shows an earlier session's K/V.
 *
 * The daemon keeps freed arena memory warm (backed and mapped, tenant.c) and
 * hands freed blocks of a live slab out again, so a new block may sit where
 * another session's K/V was.  A real commitkvd and a worker (this process,
 * libcommitkv, the arena mapped read-write as every worker maps it): session
 * "a" fills a draft block with K/V and is dropped; session "b" then gets a
 * block at the same address (checked: otherwise the test proves nothing) and
 * reads every slot of it before writing anything: all zero, as fresh arena
 * memory reads.  Two ways to the same memory: a freed block of a slab that
 * another session keeps alive, and a whole slab freed and taken again (its
 * chunks kept warm instead of being given back to the OS). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "testcheck.h"
#include "testutil.h"

static const char *const k_daemon_args[] = {"--set", "daemon.backend=host", NULL};

TestSuite(block_reuse, .fini = ckv_test_leak_check);

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u
#define ELEMS (HEADS * DIM)
/* One draft block (16 slots) exactly. */
#define TOKENS 16u

static const ckv_geometry k_geom = {LAYERS, HEADS, DIM, 0};

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "block-reuse",
                          .timeout_ms = 15000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

static ckv_session *open_filled(ckv_client *c, const char *id, uint16_t fill) {
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geom, NULL, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s", id, ckv_strerror(r));
  uint64_t first = 0;
  cr_assert_eq(ckv_session_append(s, TOKENS, NULL, NULL, NULL, NULL, &first), CKV_OK);
  for (uint32_t t = 0; fill && t < TOKENS; t++)
    for (uint32_t l = 0; l < LAYERS; l++)
      for (int kv = 0; kv < 2; kv++) {
        uint16_t *p = ckv_session_kv_ptr(s, first + t, l, kv);
        cr_assert_not_null(p);
        for (uint32_t e = 0; e < ELEMS; e++) p[e] = fill;
      }
  return s;
}

/* Counts the non-zero elements of every draft slot of s (read before any write). */
static size_t nonzero_elems(ckv_session *s) {
  size_t n = 0;
  for (uint32_t t = 0; t < TOKENS; t++)
    for (uint32_t l = 0; l < LAYERS; l++)
      for (int kv = 0; kv < 2; kv++) {
        const uint16_t *p = ckv_session_kv_ptr(s, t, l, kv);
        cr_assert_not_null(p);
        for (uint32_t e = 0; e < ELEMS; e++) n += p[e] != 0;
      }
  return n;
}

/* a is filled with 0x5a5a and dropped, then b opens: its slots must read 0. */
static void check_reuse(bool keep_slab_alive) {
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, k_daemon_args), 0, "commitkvd did not start");
  ckv_client *c = connect_to(&d);
  /* "keep" holds the slab's first block, so freeing a's block leaves the slab live. */
  ckv_session *keep = keep_slab_alive ? open_filled(c, "keep", 0x1111) : NULL;
  ckv_session *a = open_filled(c, "a", 0x5a5a);
  const void *where = ckv_session_kv_ptr(a, 0, 0, 0);
  cr_assert_eq(ckv_session_drop(a), CKV_OK);

  ckv_session *b = open_filled(c, "b", /* fill= */ 0);
  cr_assert_eq(ckv_session_kv_ptr(b, 0, 0, 0), where,
               "b's block is not where a's was: the allocator changed and this test no longer reuses memory");
  size_t stale = nonzero_elems(b);
  cr_expect_eq(stale, 0, "a fresh block of session b shows %zu of %u elements of dropped session a's K/V", stale,
               TOKENS * LAYERS * 2u * ELEMS);
  cr_assert_eq(ckv_session_drop(b), CKV_OK);
  if (keep) cr_assert_eq(ckv_session_drop(keep), CKV_OK);
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(&d), 0, "commitkvd did not exit cleanly (log %s)", d.log);
}

Test(block_reuse, freed_block_of_a_live_slab_reads_zero) { check_reuse(/* keep_slab_alive= */ true); }

Test(block_reuse, warm_chunks_of_a_freed_slab_read_zero) { check_reuse(/* keep_slab_alive= */ false); }
