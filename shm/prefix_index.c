/* prefix_index.c - a tenant's prefix index in a sealed memfd: the daemon's
 * writer and the worker's reader (see prefix_index.h). */
#include "shm/prefix_index.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "commitkv/status.h"
#include "shm/atomic.h"

#define MIN_SLOTS 64u
#define MAX_SLOTS (1u << 24)
#define ROOTS_OFFSET sizeof(ckv_pindex_header)
#define SLOTS_OFFSET (ROOTS_OFFSET + CKV_PINDEX_MAX_ROOTS * sizeof(ckv_pindex_root))
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

ckv_pkey ckv_pkey_link(ckv_pkey prev, const uint32_t *ids, uint32_t d) {
  uint32_t buf[4 + CKV_PINDEX_MAX_KEY_TOKENS];
  if (d > CKV_PINDEX_MAX_KEY_TOKENS) d = CKV_PINDEX_MAX_KEY_TOKENS;
  memcpy(buf, &prev, sizeof prev);
  memcpy(buf + 4, ids, (size_t)d * sizeof(*ids));
  XXH128_hash_t h = XXH3_128bits(buf, (4 + (size_t)d) * sizeof(uint32_t));
  return (ckv_pkey){h.low64, h.high64};
}

static size_t home(ckv_pkey k, uint32_t slots) {
  return (size_t)(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull)) & (slots - 1);
}

static uint64_t bytes_for(uint32_t slots) { return SLOTS_OFFSET + (uint64_t)slots * sizeof(ckv_pindex_slot); }

/* ---- the writer ---- */

struct ckv_pindex {
  int fd, ro_fd;
  uint8_t *base;
  ckv_pindex_header *h;
  ckv_pindex_root *roots;
  ckv_pindex_slot *slot;
  uint32_t slots;
  uint64_t entries;
  bool rebuilding;
};

/* Every change is one write section: readers that overlap it retry. */
static void write_begin(ckv_pindex *ix) {
  if (ix->rebuilding) return;
  ckv_store_relaxed_u64(&ix->h->seq, ix->h->seq + 1);
  atomic_thread_fence(memory_order_release);
}

static void write_end(ckv_pindex *ix) {
  if (ix->rebuilding) return;
  ckv_store_release_u64(&ix->h->seq, ix->h->seq + 1);
}

/* A slot's words, each stored atomically (a reader may load them at once). */
static void slot_set(ckv_pindex_slot *s, const ckv_pindex_slot *v) {
  ckv_store_relaxed_u64(&s->lo, v->lo);
  ckv_store_relaxed_u64(&s->hi, v->hi);
  ckv_store_relaxed_u64(&s->group, v->group);
  ckv_store_relaxed_u64((uint64_t *)(void *)&s->sub, (uint64_t)v->sub | (uint64_t)v->tokens << 32);
}

int ckv_pindex_new(uint32_t slots, ckv_pindex **ret) {
  *ret = NULL;
  if (slots > MAX_SLOTS) return CKV_ERR_INVALID;
  uint32_t n = MIN_SLOTS;
  while (n < slots) n *= 2;
  ckv_pindex *ix = calloc(1, sizeof(*ix));
  if (!ix) return -ENOMEM;
  ix->fd = ix->ro_fd = -1;
  uint64_t bytes = bytes_for(n);
  ix->slots = n;
  int r = 0;
  ix->fd = memfd_create("commitkv-prefix-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ix->fd < 0 || ftruncate(ix->fd, (off_t)bytes) < 0 || fcntl(ix->fd, F_ADD_SEALS, SEALS) < 0) {
    r = -errno;
    goto fail;
  }
  ix->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ix->fd, 0);
  if (ix->base == MAP_FAILED) {
    ix->base = NULL;
    r = -errno;
    goto fail;
  }
  /* The workers' descriptor: a read-only open of the same file, so neither
   * mmap(PROT_WRITE, MAP_SHARED) nor write() works through it. */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ix->fd);
  ix->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
  if (ix->ro_fd < 0) {
    r = -errno;
    goto fail;
  }
  ix->h = (ckv_pindex_header *)(void *)ix->base;
  ix->roots = (ckv_pindex_root *)(void *)(ix->base + ROOTS_OFFSET);
  ix->slot = (ckv_pindex_slot *)(void *)(ix->base + SLOTS_OFFSET);
  ix->h->version = CKV_PINDEX_VERSION;
  ix->h->slots = n;
  ix->h->bytes = bytes;
  ix->h->complete = 1;
  ckv_store_release_u64(&ix->h->magic, CKV_PINDEX_MAGIC);
  *ret = ix;
  return CKV_OK;
fail:
  ckv_pindex_free(ix);
  return r ? r : -EIO;
}

void ckv_pindex_free(ckv_pindex *ix) {
  if (!ix) return;
  if (ix->base) munmap(ix->base, bytes_for(ix->slots));
  if (ix->fd >= 0) close(ix->fd);
  if (ix->ro_fd >= 0) close(ix->ro_fd);
  free(ix);
}

int ckv_pindex_reader_fd(const ckv_pindex *ix) { return ix->ro_fd; }
uint64_t ckv_pindex_bytes(const ckv_pindex *ix) { return bytes_for(ix->slots); }
uint32_t ckv_pindex_slots(const ckv_pindex *ix) { return ix->slots; }
bool ckv_pindex_complete(const ckv_pindex *ix) { return ix->h->complete != 0; }
uint64_t ckv_pindex_entries(const ckv_pindex *ix) { return ix->entries; }

static void set_complete(ckv_pindex *ix, bool on) {
  ckv_store_release_u32(&ix->h->complete, on ? 1u : 0u);
}

static bool key_is(const ckv_pindex_slot *s, ckv_pkey k) { return s->tokens && s->lo == k.lo && s->hi == k.hi; }

bool ckv_pindex_put(ckv_pindex *ix, ckv_pkey k, uint64_t group, uint32_t sub, uint32_t tokens) {
  if (!tokens) return true;
  size_t mask = ix->slots - 1, i = home(k, ix->slots);
  while (ix->slot[i].tokens && !key_is(&ix->slot[i], k)) i = (i + 1) & mask;
  bool fresh = !ix->slot[i].tokens;
  if (fresh && (ix->entries + 1) * 4 > (uint64_t)ix->slots * 3) {
    write_begin(ix);
    set_complete(ix, false);
    write_end(ix);
    return false;
  }
  ckv_pindex_slot v = {k.lo, k.hi, group, sub, tokens};
  write_begin(ix);
  slot_set(&ix->slot[i], &v);
  if (fresh) ix->entries++;
  ckv_store_relaxed_u64(&ix->h->entries, ix->entries);
  write_end(ix);
  return true;
}

void ckv_pindex_del(ckv_pindex *ix, ckv_pkey k) {
  size_t mask = ix->slots - 1, i = home(k, ix->slots);
  while (ix->slot[i].tokens && !key_is(&ix->slot[i], k)) i = (i + 1) & mask;
  if (!ix->slot[i].tokens) return;
  static const ckv_pindex_slot empty;
  write_begin(ix);
  slot_set(&ix->slot[i], &empty);
  for (size_t j = (i + 1) & mask; ix->slot[j].tokens; j = (j + 1) & mask) {
    size_t h = home((ckv_pkey){ix->slot[j].lo, ix->slot[j].hi}, ix->slots);
    /* the entry at j may move to the hole at i when its home is not in (i, j] */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      ckv_pindex_slot moved = ix->slot[j];
      slot_set(&ix->slot[i], &moved);
      slot_set(&ix->slot[j], &empty);
      i = j;
    }
  }
  ix->entries--;
  ckv_store_relaxed_u64(&ix->h->entries, ix->entries);
  write_end(ix);
}

bool ckv_pindex_add_root(ckv_pindex *ix, const char *model_id, const char *model_revision, ckv_pkey root,
                         uint32_t block_tokens) {
  uint32_t n = ix->h->n_roots;
  for (uint32_t i = 0; i < n; i++)
    if (ix->roots[i].lo == root.lo && ix->roots[i].hi == root.hi) return true;
  write_begin(ix);
  bool ok = n < CKV_PINDEX_MAX_ROOTS && strlen(model_id) < CKV_PINDEX_NAME_BYTES &&
            strlen(model_revision) < CKV_PINDEX_NAME_BYTES;
  if (ok) {
    ckv_pindex_root *r = &ix->roots[n];
    memset(r, 0, sizeof(*r));
    memcpy(r->model_id, model_id, strlen(model_id));
    memcpy(r->model_revision, model_revision, strlen(model_revision));
    r->lo = root.lo;
    r->hi = root.hi;
    r->block_tokens = block_tokens;
    ckv_store_release_u32(&ix->h->n_roots, n + 1);
  } else {
    set_complete(ix, false);
  }
  write_end(ix);
  return ok;
}

void ckv_pindex_supersede(ckv_pindex *ix) {
  write_begin(ix);
  ckv_store_release_u32(&ix->h->superseded, 1);
  write_end(ix);
}

void ckv_pindex_rebuild_begin(ckv_pindex *ix) {
  write_begin(ix);
  ix->rebuilding = true;
  memset(ix->slot, 0, (size_t)ix->slots * sizeof(*ix->slot));
  ix->entries = 0;
  set_complete(ix, true);
}

void ckv_pindex_rebuild_end(ckv_pindex *ix) {
  ix->rebuilding = false;
  ckv_store_relaxed_u64(&ix->h->entries, ix->entries);
  write_end(ix);
}

/* ---- the reader ---- */

struct ckv_pindex_view {
  const uint8_t *base;
  size_t bytes;
  const ckv_pindex_header *h;
  const ckv_pindex_root *roots;
  const ckv_pindex_slot *slot;
  uint32_t slots;
};

int ckv_pindex_map(int fd, ckv_pindex_view **ret) {
  *ret = NULL;
  struct stat st;
  if (fstat(fd, &st) < 0) return -errno;
  if (st.st_size < (off_t)SLOTS_OFFSET) return CKV_ERR_CORRUPT;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return CKV_ERR_FORMAT; /* a file that could shrink under us could fault a lookup */
  size_t bytes = (size_t)st.st_size;
  /* Populated now: a lookup that first touches a page would take a fault
   * per page (512 keys of a cold index: about 100 us more, measured). */
  void *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return -errno;
  const ckv_pindex_header *h = p;
  int r = CKV_OK;
  uint32_t slots = ckv_load_acquire_u32(&h->slots);
  if (ckv_load_acquire_u64(&h->magic) != CKV_PINDEX_MAGIC || h->version != CKV_PINDEX_VERSION)
    r = CKV_ERR_FORMAT;
  else if (slots < MIN_SLOTS || slots > MAX_SLOTS || (slots & (slots - 1)) || bytes_for(slots) != bytes ||
           h->bytes != bytes)
    r = CKV_ERR_CORRUPT;
  ckv_pindex_view *v = r == CKV_OK ? calloc(1, sizeof(*v)) : NULL;
  if (r == CKV_OK && !v) r = -ENOMEM;
  if (r < 0) {
    munmap(p, bytes);
    return r;
  }
  v->base = p;
  v->bytes = bytes;
  v->h = h;
  v->roots = (const ckv_pindex_root *)(const void *)(v->base + ROOTS_OFFSET);
  v->slot = (const ckv_pindex_slot *)(const void *)(v->base + SLOTS_OFFSET);
  v->slots = slots;
  *ret = v;
  return CKV_OK;
}

void ckv_pindex_unmap(ckv_pindex_view *v) {
  if (!v) return;
  munmap((void *)v->base, v->bytes);
  free(v);
}

typedef struct probed {
  uint64_t group;
  uint32_t sub, tokens;
} probed;

/* The entry of key k as loaded now (tokens 0: none).  Bounded: a table the
 * writer is changing may have no empty slot on the way, so at most `slots`
 * probes; the sequence check after the lookup discards what a race read. */
static probed probe(const ckv_pindex_view *v, ckv_pkey k) {
  size_t mask = v->slots - 1, i = home(k, v->slots);
  for (uint32_t n = 0; n < v->slots; n++, i = (i + 1) & mask) {
    const ckv_pindex_slot *s = &v->slot[i];
    uint64_t st = ckv_load_relaxed_u64((const uint64_t *)(const void *)&s->sub);
    uint32_t tokens = (uint32_t)(st >> 32);
    if (!tokens) break;
    if (ckv_load_relaxed_u64(&s->lo) == k.lo && ckv_load_relaxed_u64(&s->hi) == k.hi)
      return (probed){ckv_load_relaxed_u64(&s->group), (uint32_t)st, tokens};
  }
  return (probed){0, 0, 0};
}

#define WALK_BATCH 32u /* keys hashed ahead, their slots prefetched together */

/* Leading tokens of ids that the chain from root r matches (prefix.c match:
 * whole blocks of the root's size, a compressed block's sub-blocks in order).
 * The keys of a batch of blocks are hashed first and their home slots
 * prefetched, so the probes' cache misses overlap instead of following one
 * another (an index the daemon just wrote is cold in the worker's cache). */
static uint64_t walk(const ckv_pindex_view *v, ckv_pkey root, uint32_t d, const uint32_t *ids, size_t n) {
  if (!d || d > CKV_PINDEX_MAX_KEY_TOKENS) return 0;
  const size_t blocks = n / d;
  size_t k = 0;
  bool have_last = false;
  uint64_t last_group = 0;
  uint32_t last_sub = 0;
  ckv_pkey prev = root, keys[WALK_BATCH];
  while (k < blocks) {
    size_t batch = blocks - k < WALK_BATCH ? blocks - k : WALK_BATCH;
    for (size_t i = 0; i < batch; i++) {
      prev = keys[i] = ckv_pkey_link(prev, ids + (k + i) * d, d);
      __builtin_prefetch(&v->slot[home(keys[i], v->slots)]);
    }
    for (size_t i = 0; i < batch; i++, k++) {
      probed e = probe(v, keys[i]);
      if (e.tokens != d) return (uint64_t)k * d;
      bool next_of_last = have_last && e.group == last_group;
      if (next_of_last ? e.sub != last_sub + 1 : e.sub != 0) return (uint64_t)k * d;
      have_last = true;
      last_group = e.group;
      last_sub = e.sub;
    }
  }
  return (uint64_t)k * d;
}

static bool name_is(const char *field, const char *want) {
  char buf[CKV_PINDEX_NAME_BYTES];
  memcpy(buf, field, sizeof buf);
  buf[sizeof buf - 1] = 0;
  return strcmp(buf, want) == 0;
}

int ckv_pindex_lookup(const ckv_pindex_view *v, const char *model_id, const char *model_revision,
                      const uint32_t *ids, size_t n, uint64_t *ret_matched) {
  if (!v || !ret_matched || (n && !ids)) return CKV_ERR_INVALID;
  const char *mid = model_id ? model_id : "", *rev = model_revision ? model_revision : "";
  for (uint32_t t = 0; t < CKV_PINDEX_TRIES; t++) {
    uint64_t seq = ckv_load_acquire_u64(&v->h->seq);
    if (seq & 1) continue;
    if (ckv_load_acquire_u32(&v->h->superseded)) return CKV_ERR_STATE;
    if (!ckv_load_acquire_u32(&v->h->complete)) return CKV_ERR_BUSY;
    uint32_t n_roots = ckv_load_acquire_u32(&v->h->n_roots);
    if (n_roots > CKV_PINDEX_MAX_ROOTS) n_roots = CKV_PINDEX_MAX_ROOTS;
    uint64_t best = 0;
    for (uint32_t i = 0; i < n_roots; i++) {
      ckv_pindex_root r;
      memcpy(&r, &v->roots[i], sizeof r);
      if (!name_is(r.model_id, mid) || !name_is(r.model_revision, rev)) continue;
      uint64_t m = walk(v, (ckv_pkey){r.lo, r.hi}, r.block_tokens, ids, n);
      if (m > best) best = m;
    }
    atomic_thread_fence(memory_order_acquire);
    if (ckv_load_relaxed_u64(&v->h->seq) == seq) {
      *ret_matched = best;
      return CKV_OK;
    }
  }
  return CKV_ERR_BUSY;
}
