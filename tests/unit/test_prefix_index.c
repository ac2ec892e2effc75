/* test_prefix_index.c - the published prefix index (shm/prefix_index.c):
 * what a worker's lookup reads is what the daemon put, through a real
 * read-only memfd mapping.
 *
 * - a chain's whole blocks match up to the first block not put or deleted,
 *   per root and revision; a compressed block's sub-blocks only in order;
 *   a partial block never;
 * - churn: 20 000 random puts and deletes against a reference set, every
 *   lookup agreeing (backward-shift deletion keeps every key findable);
 * - a full table makes the index incomplete (lookups say BUSY), and a
 *   rebuild with room makes it complete and exact again; a superseded one
 *   says STATE (fetch the new one);
 * - the workers' descriptor is read-only: no write, no shared writable
 *   mapping, no resize;
 * - a mapping that is not an index (bad magic, unsealed, short) is refused;
 * - a reader racing a writer thread never returns a match the writer never
 *   made (it sees either a consistent table or BUSY). */
#include "shm/prefix_index.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "testcheck.h"

TestSuite(prefix_index, .fini = ckv_test_leak_check);

#define D 16u
static const ckv_pkey k_root = {0x1234, 0x5678};

typedef struct fixture {
  ckv_pindex *ix;
  ckv_pindex_view *v;
} fixture;

static fixture open_index(uint32_t slots) {
  fixture f = {0};
  cr_assert_eq(ckv_pindex_new(slots, &f.ix), CKV_OK);
  cr_assert_eq(ckv_pindex_map(ckv_pindex_reader_fd(f.ix), &f.v), CKV_OK);
  return f;
}

static void close_index(fixture *f) {
  ckv_pindex_unmap(f->v);
  ckv_pindex_free(f->ix);
}

static uint64_t lookup(const fixture *f, const char *model, const char *rev, const uint32_t *ids, size_t n) {
  uint64_t m = 12345;
  int r = ckv_pindex_lookup(f->v, model, rev, ids, n, &m);
  cr_assert_eq(r, CKV_OK, "lookup: %d", r);
  return m;
}

/* Key k of the chain over ids from root (block k: ids[k*D .. (k+1)*D)). */
static ckv_pkey chain_key(ckv_pkey root, const uint32_t *ids, size_t k) {
  ckv_pkey key = root;
  for (size_t i = 0; i <= k; i++) key = ckv_pkey_link(key, ids + i * D, D);
  return key;
}

static uint32_t *make_ids(size_t n, uint32_t seed) {
  uint32_t *ids = malloc(n * sizeof(*ids));
  cr_assert_not_null(ids);
  for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)(i * 2654435761u) ^ seed;
  return ids;
}

Test(prefix_index, chain_matches_whole_blocks_in_order) {
  fixture f = open_index(1024);
  uint32_t *ids = make_ids(10 * D + 5, 7);
  cr_assert(ckv_pindex_add_root(f.ix, "m", "r1", k_root, D));
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D), 0, "an empty index matched");
  for (size_t k = 0; k < 6; k++) cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, k), 100 + k, 0, D));
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D + 5), 6 * D);
  cr_assert_eq(lookup(&f, "m", "r1", ids, 4 * D + 3), 4 * D, "a partial block matched");
  cr_assert_eq(lookup(&f, "m", "r2", ids, 10 * D), 0, "another revision matched");
  cr_assert_eq(lookup(&f, "other", "r1", ids, 10 * D), 0, "another model matched");
  cr_assert_eq(lookup(&f, NULL, NULL, ids, 10 * D), 0);
  ids[3 * D + 2] ^= 1; /* block 3 differs: 0..2 match */
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D), 3 * D);
  ids[3 * D + 2] ^= 1;
  ckv_pindex_del(f.ix, chain_key(k_root, ids, 2));
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D), 2 * D, "a deleted block matched");
  /* a block of another size under the same key stops the match */
  cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, 2), 102, 0, D * 2));
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D), 2 * D);
  cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, 2), 102, 0, D));
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D), 6 * D);
  /* a second root of the same model (another geometry): the best of both */
  const ckv_pkey root2 = {9, 9};
  cr_assert(ckv_pindex_add_root(f.ix, "m", "r1", root2, D));
  for (size_t k = 0; k < 8; k++) cr_assert(ckv_pindex_put(f.ix, chain_key(root2, ids, k), 200 + k, 0, D));
  cr_assert_eq(lookup(&f, "m", "r1", ids, 10 * D), 8 * D);
  free(ids);
  close_index(&f);
}

Test(prefix_index, compressed_block_sub_blocks_in_order) {
  fixture f = open_index(256);
  uint32_t *ids = make_ids(8 * D, 3);
  cr_assert(ckv_pindex_add_root(f.ix, "m", "", k_root, D));
  /* blocks 0..3 compressed once into block 50 (sub-blocks 0..3), 4 plain */
  for (uint32_t j = 0; j < 4; j++) cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, j), 50, j, D));
  cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, 4), 51, 0, D));
  cr_assert_eq(lookup(&f, "m", "", ids, 8 * D), 5 * D);
  /* sub-blocks out of order (1 listed as 2): the match stops before it */
  cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, 1), 50, 2, D));
  cr_assert_eq(lookup(&f, "m", "", ids, 8 * D), 1 * D);
  /* a group that starts mid-way (sub 1 first) never matches */
  cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, 0), 50, 1, D));
  cr_assert_eq(lookup(&f, "m", "", ids, 8 * D), 0);
  free(ids);
  close_index(&f);
}

Test(prefix_index, churn_agrees_with_a_reference) {
  enum { CHAINS = 32, BLOCKS = 24 };
  fixture f = open_index(4096);
  uint32_t *ids[CHAINS];
  ckv_pkey keys[CHAINS][BLOCKS];
  bool in[CHAINS][BLOCKS] = {{false}};
  cr_assert(ckv_pindex_add_root(f.ix, "m", "r", k_root, D));
  for (int c = 0; c < CHAINS; c++) {
    ids[c] = make_ids(BLOCKS * D, (uint32_t)c * 977u + 1);
    for (int k = 0; k < BLOCKS; k++) keys[c][k] = chain_key(k_root, ids[c], (size_t)k);
  }
  srand(42);
  for (int step = 0; step < 20000; step++) {
    int c = rand() % CHAINS, k = rand() % BLOCKS;
    if (rand() % 3) {
      cr_assert(ckv_pindex_put(f.ix, keys[c][k], (uint64_t)(c * BLOCKS + k), 0, D));
      in[c][k] = true;
    } else {
      ckv_pindex_del(f.ix, keys[c][k]);
      in[c][k] = false;
    }
    if (step % 7 == 0) {
      int q = rand() % CHAINS;
      uint64_t want = 0;
      while (want < BLOCKS && in[q][want]) want++;
      cr_assert_eq(lookup(&f, "m", "r", ids[q], BLOCKS * D), want * D, "step %d chain %d", step, q);
    }
  }
  uint64_t n = 0;
  for (int c = 0; c < CHAINS; c++)
    for (int k = 0; k < BLOCKS; k++) n += in[c][k];
  cr_assert_eq(ckv_pindex_entries(f.ix), n);
  for (int c = 0; c < CHAINS; c++) free(ids[c]);
  close_index(&f);
}

Test(prefix_index, full_table_is_incomplete_until_rebuilt) {
  fixture f = open_index(64);
  uint32_t *ids = make_ids(64 * D, 5);
  cr_assert(ckv_pindex_add_root(f.ix, "m", "r", k_root, D));
  size_t put = 0;
  while (ckv_pindex_put(f.ix, chain_key(k_root, ids, put), put, 0, D)) put++;
  cr_assert_eq(put, 48, "3/4 of 64 slots hold %zu keys", put);
  cr_assert(!ckv_pindex_complete(f.ix));
  uint64_t m = 0;
  cr_assert_eq(ckv_pindex_lookup(f.v, "m", "r", ids, 64 * D, &m), CKV_ERR_BUSY,
               "an incomplete index answered (it would under-count)");
  ckv_pindex_rebuild_begin(f.ix);
  for (size_t k = 0; k < 20; k++) cr_assert(ckv_pindex_put(f.ix, chain_key(k_root, ids, k), k, 0, D));
  ckv_pindex_rebuild_end(f.ix);
  cr_assert(ckv_pindex_complete(f.ix));
  cr_assert_eq(lookup(&f, "m", "r", ids, 64 * D), 20 * D, "the roots stay through a rebuild");
  /* replaced by a bigger one: its readers are told to fetch that */
  ckv_pindex_supersede(f.ix);
  cr_assert_eq(ckv_pindex_lookup(f.v, "m", "r", ids, 64 * D, &m), CKV_ERR_STATE,
               "a superseded index answered");
  free(ids);
  close_index(&f);
}

Test(prefix_index, workers_descriptor_is_read_only) {
  fixture f = open_index(64);
  int fd = ckv_pindex_reader_fd(f.ix);
  cr_assert_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  void *p = mmap(NULL, ckv_pindex_bytes(f.ix), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert_eq(p, MAP_FAILED, "a writable shared mapping of the index was allowed");
  cr_assert_eq(errno, EACCES);
  cr_assert_lt(pwrite(fd, "x", 1, 0), 0, "the index was writable through the workers' fd");
  cr_assert_lt(ftruncate(fd, 0), 0, "the index could be truncated");
  /* nor through a read-write reopen of the same fd: the seals stop resizing */
  int seals = fcntl(fd, F_GET_SEALS);
  cr_assert(seals & F_SEAL_SHRINK && seals & F_SEAL_GROW && seals & F_SEAL_SEAL, "seals %#x", seals);
  close_index(&f);
}

static int memfd_with(const void *data, size_t len, bool seal) {
  int fd = memfd_create("not-an-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)len), 0);
  cr_assert_eq(pwrite(fd, data, len, 0), (ssize_t)len);
  if (seal) cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

Test(prefix_index, a_mapping_that_is_not_an_index_is_refused) {
  fixture f = open_index(64);
  uint64_t bytes = ckv_pindex_bytes(f.ix);
  uint8_t *copy = calloc(1, bytes);
  cr_assert_eq(pread(ckv_pindex_reader_fd(f.ix), copy, bytes, 0), (ssize_t)bytes);
  ckv_pindex_view *v = NULL;
  int fd = memfd_with(copy, bytes, false);
  cr_assert_eq(ckv_pindex_map(fd, &v), CKV_ERR_FORMAT, "an unsealed file was mapped");
  close(fd);
  copy[0] ^= 1;
  fd = memfd_with(copy, bytes, true);
  cr_assert_eq(ckv_pindex_map(fd, &v), CKV_ERR_FORMAT, "a bad magic was mapped");
  close(fd);
  copy[0] ^= 1;
  ((ckv_pindex_header *)(void *)copy)->slots = 100; /* not a power of two */
  fd = memfd_with(copy, bytes, true);
  cr_assert_eq(ckv_pindex_map(fd, &v), CKV_ERR_CORRUPT);
  close(fd);
  fd = memfd_with(copy, 64, true);
  cr_assert_eq(ckv_pindex_map(fd, &v), CKV_ERR_CORRUPT, "a short file was mapped");
  close(fd);
  cr_assert_null(v);
  free(copy);
  close_index(&f);
}

typedef struct race {
  ckv_pindex *ix;
  const uint32_t *ids;
  atomic_bool stop;
} race;

/* Rebuilds the table with blocks 0..9 of the chain, then empty, without
 * end: a reader that sees a consistent table matches all ten or none. */
static void *writer_main(void *arg) {
  race *r = arg;
  while (!atomic_load(&r->stop)) {
    ckv_pindex_rebuild_begin(r->ix);
    for (size_t k = 0; k < 10; k++) ckv_pindex_put(r->ix, chain_key(k_root, r->ids, k), k, 0, D);
    ckv_pindex_rebuild_end(r->ix);
    usleep(20); /* a stable table now and then */
    ckv_pindex_rebuild_begin(r->ix);
    ckv_pindex_rebuild_end(r->ix);
    usleep(20);
  }
  return NULL;
}

Test(prefix_index, reader_racing_a_writer_sees_whole_states) {
  fixture f = open_index(256);
  uint32_t *ids = make_ids(12 * D, 11);
  cr_assert(ckv_pindex_add_root(f.ix, "m", "r", k_root, D));
  race r = {.ix = f.ix, .ids = ids};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, writer_main, &r), 0);
  unsigned all = 0, none = 0, busy = 0;
  /* 100 000 lookups at least, on until both tables were seen (a loaded
   * machine may not run the writer for a while), at most 20 s */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0;; i++) {
    if (i >= 100000 && ((all && none) || (clock_gettime(CLOCK_MONOTONIC, &now), now.tv_sec - t0.tv_sec > 20))) break;
    uint64_t m = 0;
    int rc = ckv_pindex_lookup(f.v, "m", "r", ids, 12 * D, &m);
    cr_assert(rc == CKV_OK || rc == CKV_ERR_BUSY, "%d", rc);
    if (rc == CKV_OK) {
      cr_assert(m == 0 || m == 10 * D, "matched %llu: a table half rebuilt was read", (unsigned long long)m);
      all += m != 0;
      none += m == 0;
    } else {
      busy++;
    }
  }
  atomic_store(&r.stop, true);
  pthread_join(t, NULL);
  cr_log_info("racing lookups: %u whole, %u empty, %u busy", all, none, busy);
  cr_assert(all > 0 && none > 0, "the race was not exercised (%u whole, %u empty)", all, none);
  free(ids);
  close_index(&f);
}
