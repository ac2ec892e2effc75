/* test_slab.c - the block allocator (shm/slab.c): no overlap under random
 * alloc/free checked against a shadow bitmap, full reuse after free, chunks
 * returned (and discarded) when a slab empties, coalescing of free chunks,
 * NOSPACE, refusal of double/foreign frees without corruption, and warm
 * chunks (kept backed within a budget, taken first, reported as reused), and
 * an allocator rebuilt over kept blocks (claim, scrub: the warm restart). */
#include "commitkv/status.h"
#include "shm/slab.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "testcheck.h"

TestSuite(slab, .fini = ckv_test_leak_check);

#define BASE 4096u
#define CHUNK (64u * 1024u)

static ckv_slab *mk(uint64_t chunks, uint32_t align, uint32_t min_blocks, uint32_t keep_empty) {
  ckv_slab_config cfg = {
      .offset = BASE,
      .bytes = chunks * CHUNK,
      .chunk_bytes = CHUNK,
      .block_align = align,
      .min_blocks = min_blocks,
      .keep_empty = keep_empty,
  };
  ckv_slab *s = NULL;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_OK);
  cr_assert_not_null(s);
  return s;
}

static ckv_slab_stats stats(const ckv_slab *s) {
  ckv_slab_stats st;
  ckv_slab_get_stats(s, &st);
  return st;
}

static uint32_t cls(ckv_slab *s, uint64_t bytes, uint64_t tag) {
  uint32_t c = UINT32_MAX;
  cr_assert_eq(ckv_slab_class(s, bytes, tag, &c), CKV_OK);
  return c;
}

/* Allocates until NOSPACE; returns the count and the offsets in *out. */
static size_t fill(ckv_slab *s, uint32_t c, uint64_t *out, size_t cap) {
  size_t n = 0;
  uint64_t off;
  int r;
  while ((r = ckv_slab_alloc(s, c, &off)) == CKV_OK) {
    cr_assert_lt(n, cap, "more blocks than can fit");
    out[n++] = off;
  }
  cr_assert_eq(r, CKV_ERR_NOSPACE);
  return n;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- no overlap: randomized alloc/free against a shadow bitmap ---- */

#define UNIT 64u
static uint8_t shadow[(64u * CHUNK) / UNIT];

Test(slab, random_no_overlap) {
  const uint64_t chunks = 64;
  ckv_slab *s = mk(chunks, UNIT, 4, 0);
  const uint64_t sizes[] = {100, 4096, 10000, 70000, 200000, 64};
  uint32_t ids[6];
  for (int i = 0; i < 6; i++) ids[i] = cls(s, sizes[i], (uint64_t)i);

  enum { MAXLIVE = 4096 };
  static uint64_t live_off[MAXLIVE];
  static int live_cls[MAXLIVE];
  size_t n_live = 0;
  uint64_t used = 0;
  memset(shadow, 0, sizeof shadow);
  srand(12345);
  size_t nospace = 0;
  for (int step = 0; step < 40000; step++) {
    bool do_alloc = n_live == 0 || (n_live < MAXLIVE && rand() % 100 < (step % 8000 < 5000 ? 65 : 35));
    if (do_alloc) {
      int ci = rand() % 6;
      uint64_t off;
      int r = ckv_slab_alloc(s, ids[ci], &off);
      if (r == CKV_ERR_NOSPACE) {
        nospace++;
        continue;
      }
      cr_assert_eq(r, CKV_OK);
      ckv_slab_class_stats cs;
      cr_assert_eq(ckv_slab_get_class_stats(s, ids[ci], &cs), CKV_OK);
      cr_assert_eq(off % UNIT, 0, "misaligned block");
      cr_assert_geq(off, BASE);
      cr_assert_leq(off + cs.stride, BASE + chunks * CHUNK, "block beyond the range");
      for (uint64_t u = (off - BASE) / UNIT; u < (off - BASE + cs.stride) / UNIT; u++) {
        cr_assert_eq(shadow[u], 0, "overlap at offset %llu (step %d)", (unsigned long long)off, step);
        shadow[u] = 1;
      }
      uint32_t got;
      cr_assert_eq(ckv_slab_lookup(s, off, &got), CKV_OK);
      cr_assert_eq(got, ids[ci]);
      live_off[n_live] = off;
      live_cls[n_live] = ci;
      n_live++;
      used += cs.stride;
    } else {
      size_t i = (size_t)rand() % n_live;
      ckv_slab_class_stats cs;
      cr_assert_eq(ckv_slab_get_class_stats(s, ids[live_cls[i]], &cs), CKV_OK);
      cr_assert_eq(ckv_slab_dealloc(s, live_off[i]), CKV_OK);
      for (uint64_t u = (live_off[i] - BASE) / UNIT; u < (live_off[i] - BASE + cs.stride) / UNIT; u++) shadow[u] = 0;
      used -= cs.stride;
      live_off[i] = live_off[n_live - 1];
      live_cls[i] = live_cls[n_live - 1];
      n_live--;
    }
    ckv_slab_stats st = stats(s);
    cr_assert_eq(st.bytes_used, used);
    cr_assert_eq(st.blocks_used, n_live);
    cr_assert_leq(st.bytes_used, st.bytes_reserved);
    cr_assert_eq(st.bytes_reserved + st.chunks_free * CHUNK, st.bytes_total);
  }
  cr_assert_gt(nospace, 0, "the test never filled the range");
  while (n_live) cr_assert_eq(ckv_slab_dealloc(s, live_off[--n_live]), CKV_OK);
  ckv_slab_stats st = stats(s);
  cr_assert_eq(st.bytes_used, 0);
  cr_assert_eq(st.bytes_reserved, 0, "empty slabs were not returned");
  cr_assert_eq(st.chunks_free, chunks);
  ckv_slab_free(s);
}

/* ---- full reuse after free ---- */

Test(slab, full_reuse_after_free) {
  ckv_slab *s = mk(16, 256, 4, 0);
  uint32_t c = cls(s, 5000, 0);
  uint64_t a[1024], b[1024];
  size_t n = fill(s, c, a, 1024);
  ckv_slab_class_stats cs;
  ckv_slab_get_class_stats(s, c, &cs);
  cr_assert_eq(n, (size_t)(16 / cs.chunks_per_slab) * cs.blocks_per_slab, "range not fully used: %zu", n);
  for (size_t i = 0; i < n; i++) cr_assert_eq(ckv_slab_dealloc(s, a[i]), CKV_OK);
  cr_assert_eq(stats(s).chunks_free, 16);
  size_t m = fill(s, c, b, 1024);
  cr_assert_eq(m, n, "second fill got %zu blocks, first %zu", m, n);
  qsort(a, n, sizeof a[0], cmp_u64);
  qsort(b, m, sizeof b[0], cmp_u64);
  cr_assert_eq(memcmp(a, b, n * sizeof a[0]), 0, "the same space was not reused");
  ckv_slab_free(s);
}

/* ---- chunks return when a slab empties, with a discard call ---- */

typedef struct {
  int calls;
  uint64_t off, len;
} discard_log;

static int log_discard(void *opaque, uint64_t off, uint64_t len) {
  discard_log *l = opaque;
  l->calls++;
  l->off = off;
  l->len = len;
  return CKV_OK;
}

Test(slab, chunk_return_when_empty) {
  discard_log log = {0};
  ckv_slab_config cfg = {.offset = BASE,
                         .bytes = 8 * CHUNK,
                         .chunk_bytes = CHUNK,
                         .block_align = 256,
                         .min_blocks = 4,
                         .discard = log_discard,
                         .discard_opaque = &log};
  ckv_slab *s;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_OK);
  /* 40000-byte blocks: a slab spans several chunks. */
  uint32_t c = cls(s, 40000, 7);
  ckv_slab_class_stats cs;
  ckv_slab_get_class_stats(s, c, &cs);
  cr_assert_geq(cs.blocks_per_slab, 4);
  uint64_t span = (uint64_t)cs.chunks_per_slab * CHUNK;

  uint64_t x, y;
  cr_assert_eq(ckv_slab_alloc(s, c, &x), CKV_OK);
  cr_assert_eq(ckv_slab_alloc(s, c, &y), CKV_OK);
  ckv_slab_stats st = stats(s);
  cr_assert_eq(st.bytes_reserved, span);
  cr_assert_eq(st.chunks_free, 8 - cs.chunks_per_slab);
  cr_assert_eq(st.slabs, 1);
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  cr_assert_eq(stats(s).bytes_reserved, span, "slab returned while a block lives");
  cr_assert_eq(log.calls, 0);
  cr_assert_eq(ckv_slab_dealloc(s, y), CKV_OK);
  st = stats(s);
  cr_assert_eq(st.bytes_reserved, 0, "empty slab kept its chunks");
  cr_assert_eq(st.chunks_free, 8);
  cr_assert_eq(st.slabs, 0);
  cr_assert_eq(log.calls, 1, "discard not called");
  cr_assert_eq(log.off, BASE);
  cr_assert_eq(log.len, span);
  ckv_slab_free(s);
}

Test(slab, keep_empty_then_reclaim_for_others) {
  ckv_slab *s = mk(4, 256, 1, /* keep_empty= */ 1);
  uint32_t a = cls(s, CHUNK, 1);      /* one chunk per slab */
  uint32_t b = cls(s, 4 * CHUNK, 2);  /* needs all four chunks */
  uint64_t x, y;
  cr_assert_eq(ckv_slab_alloc(s, a, &x), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  cr_assert_eq(stats(s).bytes_reserved, CHUNK, "keep_empty did not keep the slab");
  cr_assert_eq(ckv_slab_alloc(s, a, &y), CKV_OK);
  cr_assert_eq(y, x, "kept slab not reused");
  cr_assert_eq(ckv_slab_dealloc(s, y), CKV_OK);
  /* The kept empty slab must not make another class fail. */
  cr_assert_eq(ckv_slab_alloc(s, b, &y), CKV_OK);
  cr_assert_eq(stats(s).bytes_reserved, 4 * CHUNK);
  ckv_slab_free(s);
}

/* ---- coalescing: a long run is available again once its pieces are free ---- */

Test(slab, free_chunks_coalesce) {
  const uint64_t n = 12;
  ckv_slab *s = mk(n, 256, 1, 0);
  uint32_t one = cls(s, CHUNK, 0);
  uint32_t three = cls(s, 3 * CHUNK, 0);
  uint64_t off[12];
  for (size_t i = 0; i < n; i++) cr_assert_eq(ckv_slab_alloc(s, one, &off[i]), CKV_OK);
  qsort(off, n, sizeof off[0], cmp_u64);
  uint64_t big;
  /* Free every other chunk: half the range free, no run of three. */
  for (size_t i = 0; i < n; i += 2) cr_assert_eq(ckv_slab_dealloc(s, off[i]), CKV_OK);
  cr_assert_eq(stats(s).chunks_free, n / 2);
  cr_assert_eq(ckv_slab_alloc(s, three, &big), CKV_ERR_NOSPACE);
  /* Free chunks 3 and 5 (odd ones, freed in an order that merges left then right). */
  cr_assert_eq(ckv_slab_dealloc(s, off[3]), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, off[5]), CKV_OK);
  cr_assert_eq(ckv_slab_alloc(s, three, &big), CKV_OK, "coalesced run not found");
  cr_assert_geq(big, off[2]);
  cr_assert_leq(big + 3 * CHUNK, off[6] + CHUNK);
  cr_assert_eq(ckv_slab_dealloc(s, big), CKV_OK);
  for (size_t i = 1; i < n; i += 2)
    if (i != 3 && i != 5) cr_assert_eq(ckv_slab_dealloc(s, off[i]), CKV_OK);
  /* Everything free again: one run of the whole range. */
  uint32_t all = cls(s, n * CHUNK, 0);
  cr_assert_eq(ckv_slab_alloc(s, all, &big), CKV_OK, "range not fully coalesced");
  cr_assert_eq(big, BASE);
  ckv_slab_free(s);
}

/* ---- multi-chunk slabs for ~2 MiB blocks ---- */

Test(slab, large_blocks_span_chunks) {
  ckv_slab_config cfg = {.offset = BASE, .bytes = UINT64_C(64) << 20}; /* defaults: 2 MiB chunks */
  ckv_slab *s;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_OK);
  /* 32 layers x 8 heads x 128 dims x 16 tokens x K,V x 2 bytes + a small header. */
  const uint64_t blk = 32ull * 8 * 128 * 16 * 2 * 2 + 72;
  uint32_t c = cls(s, blk, 0);
  ckv_slab_class_stats cs;
  ckv_slab_get_class_stats(s, c, &cs);
  cr_assert_geq(cs.blocks_per_slab, 4);
  cr_assert_gt(cs.chunks_per_slab, 1);
  cr_assert_eq(cs.stride % 256, 0);
  uint64_t prev = 0, off;
  for (uint32_t i = 0; i < cs.blocks_per_slab; i++) {
    cr_assert_eq(ckv_slab_alloc(s, c, &off), CKV_OK);
    if (i) cr_assert_eq(off, prev + cs.stride, "blocks of one slab not contiguous");
    prev = off;
  }
  cr_assert_eq(stats(s).slabs, 1);
  cr_assert_leq(prev + cs.stride, BASE + (uint64_t)cs.chunks_per_slab * cfg.bytes / stats(s).chunks_total,
                "blocks run past their slab");
  /* The next slab starts after the first one's last block. */
  cr_assert_eq(ckv_slab_alloc(s, c, &off), CKV_OK);
  cr_assert_eq(stats(s).slabs, 2);
  cr_assert_geq(off, prev + cs.stride, "second slab overlaps the first");
  ckv_slab_free(s);
}

/* ---- NOSPACE ---- */

Test(slab, nospace_when_full) {
  ckv_slab *s = mk(4, 256, 4, 0);
  uint32_t c = cls(s, 16384, 0);
  uint64_t offs[64];
  size_t n = fill(s, c, offs, 64);
  cr_assert_eq(n, 16);
  ckv_slab_stats before = stats(s), after;
  uint64_t off = 0xdead;
  cr_assert_eq(ckv_slab_alloc(s, c, &off), CKV_ERR_NOSPACE);
  cr_assert_eq(off, 0xdead, "ret_offset written on failure");
  after = stats(s);
  cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "a failed alloc changed the stats");
  /* A class that needs a fresh slab fails too. */
  uint32_t d = cls(s, 512, 0);
  cr_assert_eq(ckv_slab_alloc(s, d, &off), CKV_ERR_NOSPACE);
  cr_assert_eq(ckv_slab_dealloc(s, offs[3]), CKV_OK);
  cr_assert_eq(ckv_slab_alloc(s, c, &off), CKV_OK);
  cr_assert_eq(off, offs[3]);
  ckv_slab_free(s);
}

/* ---- double free and foreign offsets are refused and change nothing ---- */

Test(slab, double_and_foreign_free_refused) {
  ckv_slab *s = mk(8, 256, 4, 0);
  uint32_t c = cls(s, 1000, 0); /* stride 1024 */
  ckv_slab_class_stats cs;
  ckv_slab_get_class_stats(s, c, &cs);
  uint64_t a, b;
  cr_assert_eq(ckv_slab_alloc(s, c, &a), CKV_OK);
  cr_assert_eq(ckv_slab_alloc(s, c, &b), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, a), CKV_OK);
  ckv_slab_stats before = stats(s), after;
  cr_assert_eq(ckv_slab_dealloc(s, a), CKV_ERR_INVALID, "double free accepted");
  cr_assert_eq(ckv_slab_dealloc(s, b + 1), CKV_ERR_INVALID, "misaligned free accepted");
  cr_assert_eq(ckv_slab_dealloc(s, b + 256), CKV_ERR_INVALID, "mid-block free accepted");
  cr_assert_eq(ckv_slab_dealloc(s, 0), CKV_ERR_INVALID, "offset below the range accepted");
  cr_assert_eq(ckv_slab_dealloc(s, BASE + 8 * CHUNK), CKV_ERR_INVALID, "offset past the range accepted");
  cr_assert_eq(ckv_slab_dealloc(s, UINT64_MAX), CKV_ERR_INVALID);
  cr_assert_eq(ckv_slab_dealloc(s, BASE + 5 * CHUNK), CKV_ERR_INVALID, "offset in a free chunk accepted");
  cr_assert_eq(ckv_slab_dealloc(NULL, b), CKV_ERR_INVALID);
  after = stats(s);
  cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "a refused free changed the stats");
  cr_assert_eq(ckv_slab_lookup(s, a, NULL), CKV_ERR_INVALID);
  cr_assert_eq(ckv_slab_lookup(s, b, NULL), CKV_OK);
  /* Only one of two frees of the same block may succeed: the block is then
   * handed out once, not twice. */
  uint64_t x, y;
  cr_assert_eq(ckv_slab_alloc(s, c, &x), CKV_OK);
  cr_assert_eq(ckv_slab_alloc(s, c, &y), CKV_OK);
  cr_assert_neq(x, y);
  cr_assert_eq(ckv_slab_dealloc(s, b), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, b), CKV_ERR_INVALID);
  ckv_slab_free(s);
}

/* ---- classes and configuration ---- */

Test(slab, classes_keyed_by_size_and_tag) {
  ckv_slab *s = mk(8, 256, 4, 0);
  uint32_t a = cls(s, 4096, 1), b = cls(s, 4096, 2), a2 = cls(s, 4096, 1), d = cls(s, 8192, 1);
  cr_assert_eq(a, a2);
  cr_assert_neq(a, b, "same size, other tag must be another class");
  cr_assert_neq(a, d);
  uint64_t x;
  cr_assert_eq(ckv_slab_alloc(s, a, &x), CKV_OK);
  uint32_t got;
  cr_assert_eq(ckv_slab_lookup(s, x, &got), CKV_OK);
  cr_assert_eq(got, a);
  uint64_t y;
  cr_assert_eq(ckv_slab_alloc(s, b, &y), CKV_OK);
  cr_assert_neq((x - BASE) / CHUNK, (y - BASE) / CHUNK, "two classes share a chunk");
  cr_assert_eq(ckv_slab_alloc(s, 99, &x), CKV_ERR_INVALID);
  uint32_t r;
  cr_assert_eq(ckv_slab_class(s, 0, 0, &r), CKV_ERR_INVALID);
  cr_assert_eq(ckv_slab_class(s, 8 * CHUNK + 1, 0, &r), CKV_ERR_LIMIT);
  for (uint32_t i = 0; i < CKV_SLAB_MAX_CLASSES - 3; i++) cls(s, 64, 100 + i);
  cr_assert_eq(ckv_slab_class(s, 64, 9999, &r), CKV_ERR_LIMIT);
  cr_assert_eq(ckv_slab_class(s, 4096, 2, &r), CKV_OK, "existing class not found when full");
  cr_assert_eq(r, b);
  ckv_slab_free(s);
}

Test(slab, bad_config_refused) {
  ckv_slab *s = (ckv_slab *)0x1;
  ckv_slab_config cfg = {.offset = BASE, .bytes = CHUNK - 1, .chunk_bytes = CHUNK};
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_ERR_INVALID, "range below one chunk accepted");
  cfg.bytes = 4 * CHUNK;
  cfg.block_align = 100;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_ERR_INVALID, "non power of two alignment accepted");
  cfg.block_align = 256;
  cfg.offset = 100;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_ERR_INVALID, "misaligned offset accepted");
  cfg.offset = BASE;
  cfg.chunk_bytes = CHUNK + 8;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_ERR_INVALID, "chunk not a multiple of the alignment");
  cfg.chunk_bytes = CHUNK;
  cr_assert_eq(ckv_slab_new(NULL, &s), CKV_ERR_INVALID);
  cr_assert_eq(s, (ckv_slab *)0x1, "ret written on failure");
  cr_assert_null(ckv_slab_free(NULL));
}

/* ---- warm chunks: kept backed up to warm_bytes, taken first, never in the way ---- */

static ckv_slab *mk_warm(uint64_t chunks, uint64_t warm_chunks, discard_log *log) {
  ckv_slab_config cfg = {.offset = BASE,
                         .bytes = chunks * CHUNK,
                         .chunk_bytes = CHUNK,
                         .block_align = 256,
                         .min_blocks = 1,
                         .warm_bytes = warm_chunks * CHUNK,
                         .discard = log_discard,
                         .discard_opaque = log};
  ckv_slab *s = NULL;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_OK);
  return s;
}

Test(slab, take_says_when_a_block_held_bytes_before) {
  discard_log log = {0};
  ckv_slab *s = mk_warm(4, /* warm_chunks= */ 0, &log);
  uint32_t c = cls(s, CHUNK / 4, 1); /* four blocks per one-chunk slab */
  uint64_t x, y, z;
  bool reused = true;
  cr_assert_eq(ckv_slab_take(s, c, &x, &reused), CKV_OK);
  cr_assert(!reused, "a block of never used memory said reused");
  cr_assert_eq(ckv_slab_take(s, c, &y, &reused), CKV_OK);
  cr_assert(!reused);
  cr_assert_eq(ckv_slab_dealloc(s, y), CKV_OK);
  cr_assert_eq(ckv_slab_take(s, c, &z, &reused), CKV_OK);
  cr_assert_eq(z, y, "the freed block was not the next one");
  cr_assert(reused, "a freed block handed out again said fresh");
  /* The slab empties: without warm budget its chunk is discarded and reads zero again. */
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, z), CKV_OK);
  cr_assert_eq(log.calls, 1, "an empty slab without warm budget was not discarded");
  cr_assert_eq(ckv_slab_take(s, c, &x, &reused), CKV_OK);
  cr_assert(!reused, "a block of discarded memory said reused");
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  ckv_slab_free(s);
}

Test(slab, warm_chunks_kept_within_budget_and_taken_first) {
  discard_log log = {0};
  ckv_slab *s = mk_warm(8, /* warm_chunks= */ 2, &log);
  uint32_t one = cls(s, CHUNK, 1), other = cls(s, CHUNK, 2);
  uint64_t off[4];
  for (int i = 0; i < 4; i++) cr_assert_eq(ckv_slab_alloc(s, one, &off[i]), CKV_OK);
  for (int i = 0; i < 4; i++) cr_assert_eq(ckv_slab_dealloc(s, off[i]), CKV_OK);
  ckv_slab_stats st = stats(s);
  cr_assert_eq(st.bytes_warm, 2 * CHUNK, "warm bytes %llu, budget two chunks", (unsigned long long)st.bytes_warm);
  cr_assert_eq(log.calls, 2, "chunks beyond the warm budget were not discarded");
  cr_assert_eq(st.chunks_free, 8);
  cr_assert_eq(st.bytes_reserved, 0, "warm chunks counted as reserved");
  /* Another class takes the warm chunks (the first two freed) before any cold one. */
  uint64_t a, b;
  bool reused = false;
  cr_assert_eq(ckv_slab_take(s, other, &a, &reused), CKV_OK);
  cr_assert(reused, "a block in a warm chunk said fresh");
  cr_assert(a == off[0] || a == off[1], "a new slab skipped the warm chunks");
  cr_assert_eq(ckv_slab_take(s, other, &b, &reused), CKV_OK);
  cr_assert(reused && (b == off[0] || b == off[1]) && b != a);
  cr_assert_eq(stats(s).bytes_warm, 0);
  uint64_t c;
  cr_assert_eq(ckv_slab_take(s, other, &c, &reused), CKV_OK);
  cr_assert(!reused, "a block in a discarded chunk said reused");
  ckv_slab_free(s);
}

Test(slab, warm_and_cold_neighbours_still_make_a_long_run) {
  discard_log log = {0};
  ckv_slab *s = mk_warm(4, /* warm_chunks= */ 4, &log);
  uint32_t one = cls(s, CHUNK, 1), four = cls(s, 4 * CHUNK, 2);
  uint64_t x, y;
  /* Chunk 0 warm, chunks 1..3 cold: no run of four of one kind. */
  cr_assert_eq(ckv_slab_alloc(s, one, &x), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  cr_assert_eq(stats(s).bytes_warm, CHUNK);
  bool reused = false;
  cr_assert_eq(ckv_slab_take(s, four, &y, &reused), CKV_OK, "warm and cold chunks side by side made a run unusable");
  cr_assert_eq(y, BASE);
  cr_assert(!reused, "the warm chunk was discarded to merge: the run reads zero");
  cr_assert_eq(log.calls, 1);
  cr_assert_eq(stats(s).bytes_warm, 0);
  ckv_slab_free(s);
}

Test(slab, without_discard_merged_runs_are_warm) {
  ckv_slab *s = mk(4, 256, 1, 0); /* no discard callback: freed chunks keep their bytes */
  uint32_t one = cls(s, CHUNK, 1), four = cls(s, 4 * CHUNK, 2);
  uint64_t x, y;
  cr_assert_eq(ckv_slab_alloc(s, one, &x), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  bool reused = false;
  cr_assert_eq(ckv_slab_take(s, four, &y, &reused), CKV_OK);
  cr_assert(reused, "a run with undiscarded bytes said fresh");
  ckv_slab_free(s);
}

/* ---- rebuilding over kept memory (warm restart) ---- */

Test(slab, claim_rebuilds_the_same_blocks_and_scrub_discards_the_rest) {
  discard_log log = {0};
  ckv_slab *s = mk_warm(16, 0, &log);
  uint32_t small = cls(s, CHUNK / 4, 1), big = cls(s, CHUNK + CHUNK / 2, 2); /* one chunk / two chunks per block */
  uint64_t a[6], b[3], slab_a[6], slab_b[3];
  for (int i = 0; i < 6; i++) cr_assert_eq(ckv_slab_alloc(s, small, &a[i]), CKV_OK);
  for (int i = 0; i < 3; i++) cr_assert_eq(ckv_slab_alloc(s, big, &b[i]), CKV_OK);
  for (int i = 0; i < 6; i++) cr_assert_eq(ckv_slab_block_slab(s, a[i], &slab_a[i]), CKV_OK);
  for (int i = 0; i < 3; i++) cr_assert_eq(ckv_slab_block_slab(s, b[i], &slab_b[i]), CKV_OK);
  cr_assert_eq(ckv_slab_block_slab(s, a[0] + 8, &slab_a[0]), CKV_ERR_INVALID, "not a block start");
  ckv_slab_stats before = stats(s);
  ckv_slab_free(s);

  /* a new allocator keeps a[1], a[4], b[2] (the others were dropped) */
  s = mk_warm(16, 0, &log);
  small = cls(s, CHUNK / 4, 1);
  big = cls(s, CHUNK + CHUNK / 2, 2);
  cr_assert_eq(ckv_slab_claim(s, small, slab_a[1], a[1]), CKV_OK);
  cr_assert_eq(ckv_slab_claim(s, small, slab_a[4], a[4]), CKV_OK);
  cr_assert_eq(ckv_slab_claim(s, big, slab_b[2], b[2]), CKV_OK);
  /* refused: twice, another class's slab, off the grid, outside the range */
  cr_assert_eq(ckv_slab_claim(s, small, slab_a[1], a[1]), CKV_ERR_EXISTS);
  cr_assert_eq(ckv_slab_claim(s, big, slab_a[1], slab_a[1]), CKV_ERR_EXISTS, "on a slab of another class");
  cr_assert_eq(ckv_slab_claim(s, small, slab_a[1], a[1] + 256), CKV_ERR_INVALID);
  cr_assert_eq(ckv_slab_claim(s, small, slab_a[1] + CHUNK * 64, a[1] + CHUNK * 64), CKV_ERR_INVALID);
  cr_assert_eq(ckv_slab_claim(s, 99, slab_a[1], a[1]), CKV_ERR_INVALID);
  ckv_slab_stats st = stats(s);
  cr_assert_eq(st.blocks_used, 3);
  cr_assert_lt(st.blocks_used, before.blocks_used);
  log.calls = 0;
  cr_assert_eq(ckv_slab_scrub(s), 0);
  cr_assert_gt(log.calls, 0, "nothing of the free range was discarded");
  /* kept blocks are live; new blocks never overlap them; those of a kept slab say reused */
  cr_assert_eq(ckv_slab_lookup(s, a[4], NULL), CKV_OK);
  uint64_t x;
  bool reused = false;
  cr_assert_eq(ckv_slab_take(s, small, &x, &reused), CKV_OK);
  cr_assert(x != a[1] && x != a[4]);
  if (x >= slab_a[1] && x < slab_a[1] + CHUNK) cr_assert(reused, "a block beside kept ones said fresh");
  cr_assert_eq(ckv_slab_dealloc(s, a[1]), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, a[4]), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, b[2]), CKV_OK);
  cr_assert_eq(ckv_slab_dealloc(s, x), CKV_OK);
  st = stats(s);
  cr_assert_eq(st.blocks_used, 0);
  cr_assert_eq(st.chunks_free, st.chunks_total, "chunks lost in the rebuild");
  ckv_slab_free(s);
}
