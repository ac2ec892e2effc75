/* shm/arena.c - the backend-independent half of arenas (see shm/arena.h).
 *
 * This file owns the rules every backend shares: the backend registry, size
 * rounding and limits, the header at offset 0 (written on create, validated
 * on import, retired on free) and argument checks, so that a backend only
 * creates, maps, exports and discards memory. */
#include "shm/arena.h"

#include "commitkv/status.h"
#include "shm/atomic.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

struct ckv_arena {
  const ckv_arena_backend *be;
  void *ctx;                       /* backend context */
  void *base;                      /* mapping in this process */
  uint64_t bytes;                  /* whole region */
  uint64_t generation;             /* copy of the header's, never re-read */
  uint64_t committed;              /* usable prefix: grown by the owner, learned by importers */
  bool owner;                      /* created here (vs imported) */
  bool keep_live;                  /* handed on: free leaves the header live */
};

#define CKV_ARENA_MAX_BACKENDS 8

static const ckv_arena_backend *registry[CKV_ARENA_MAX_BACKENDS] = {&ckv_arena_host_backend};

/* FNV-1a over 64-bit words; a constant expression once inlined. */
static uint64_t fnv_mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

uint64_t ckv_arena_format(void) {
  static const uint64_t layout[] = {
      sizeof(ckv_arena_header),
      offsetof(ckv_arena_header, magic),
      offsetof(ckv_arena_header, format),
      offsetof(ckv_arena_header, bytes),
      offsetof(ckv_arena_header, generation),
      offsetof(ckv_arena_header, data_offset),
      offsetof(ckv_arena_header, creator_pid),
      offsetof(ckv_arena_header, state),
      offsetof(ckv_arena_header, kind),
      offsetof(ckv_arena_header, label),
      _Alignof(uint64_t),
      _Alignof(ckv_arena_header),
      CKV_ARENA_HEADER_BYTES,
  };
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) h = fnv_mix(h, layout[i]);
  return ((uint64_t)CKV_ARENA_VERSION << 32) | ((h ^ (h >> 32)) & UINT64_C(0xffffffff));
}

/* ---- registry ---- */

static bool name_ok(const char *name) {
  return name && name[0] && strnlen(name, CKV_ARENA_KIND_MAX) < CKV_ARENA_KIND_MAX;
}

const ckv_arena_backend *ckv_arena_backend_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < CKV_ARENA_MAX_BACKENDS; i++)
    if (registry[i] && strcmp(registry[i]->name, name) == 0) return registry[i];
  return NULL;
}

int ckv_arena_backend_register(const ckv_arena_backend *be) {
  if (!be || !name_ok(be->name) || !be->create || !be->import || !be->destroy ||
      !be->export_handles || (!be->read) != (!be->write))
    return CKV_ERR_INVALID;
  if (ckv_arena_backend_find(be->name)) return CKV_ERR_EXISTS;
  for (size_t i = 0; i < CKV_ARENA_MAX_BACKENDS; i++) {
    if (!registry[i]) {
      registry[i] = be;
      return CKV_OK;
    }
  }
  return CKV_ERR_LIMIT;
}

/* ---- helpers ---- */

static uint64_t granularity(const ckv_arena_backend *be) {
  uint64_t g = be->granularity ? be->granularity() : 0;
  if (g == 0) {
    long p = sysconf(_SC_PAGESIZE);
    g = p > 0 ? (uint64_t)p : 4096;
  }
  return g;
}

static uint64_t new_generation(void) {
  uint64_t g = 0;
  if (getrandom(&g, sizeof g, GRND_NONBLOCK) != (ssize_t)sizeof g) {
    /* No entropy yet (early boot): unique enough for telling arenas apart. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g = fnv_mix(fnv_mix(UINT64_C(0xcbf29ce484222325), (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec),
                (uint64_t)getpid());
  }
  return g ? g : 1;
}

/* First committed prefix of an arena of `total` bytes: about 1/128 of it, so
 * doubling reaches the whole arena in at most 7 steps (8 physical chunks on a
 * device), and never less than one granule. */
static uint64_t initial_committed(uint64_t total, uint64_t g) {
  uint64_t first = (total / 128 + g - 1) / g * g;
  if (first < g) first = g;
  if (first < CKV_ARENA_HEADER_BYTES) first = (CKV_ARENA_HEADER_BYTES + g - 1) / g * g;
  return first < total ? first : total;
}

static int header_read(const ckv_arena *a, ckv_arena_header *h) {
  if (a->be->read) return a->be->read(a->ctx, a->base, 0, h, sizeof *h);
  memcpy(h, a->base, sizeof *h);
  /* The state word is the publication point: read it with acquire so the
   * rest is at least as new as the state we act on. */
  h->state = ckv_load_acquire_u32(&((const ckv_arena_header *)a->base)->state);
  return CKV_OK;
}

/* Writes everything but `state`, then publishes `state` with a release store. */
static int header_write(ckv_arena *a, const ckv_arena_header *h) {
  if (a->be->write) return a->be->write(a->ctx, a->base, 0, h, sizeof *h);
  ckv_arena_header *dst = a->base;
  ckv_arena_header tmp = *h;
  tmp.state = CKV_ARENA_STATE_INIT;
  memcpy(dst, &tmp, sizeof tmp);
  ckv_store_release_u32(&dst->state, h->state);
  return CKV_OK;
}

static void set_state(ckv_arena *a, uint32_t state) {
  if (a->be->write) {
    (void)a->be->write(a->ctx, a->base, offsetof(ckv_arena_header, state), &state, sizeof state);
    return;
  }
  ckv_store_release_u32(&((ckv_arena_header *)a->base)->state, state);
}

/* ---- lifecycle ---- */

int ckv_arena_new(const ckv_arena_backend *be, uint64_t bytes, const char *label, ckv_arena **ret) {
  if (!be || !ret || bytes == 0) return CKV_ERR_INVALID;
  if (!be->create || !be->export_handles) return CKV_ERR_UNSUPPORTED;
  if (bytes > CKV_ARENA_MAX_BYTES) return CKV_ERR_LIMIT;
  uint64_t g = granularity(be);
  uint64_t total = (CKV_ARENA_HEADER_BYTES + bytes + g - 1) / g * g;

  ckv_arena *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->be = be;
  a->bytes = total;
  a->owner = true;
  a->generation = new_generation();
  a->committed = initial_committed(total, g);
  int r = be->create(total, a->committed, label ? label : "", &a->ctx, &a->base);
  if (r < 0) {
    free(a);
    return r;
  }

  ckv_arena_header h = {
      .magic = CKV_ARENA_MAGIC,
      .format = ckv_arena_format(),
      .bytes = total,
      .generation = a->generation,
      .data_offset = CKV_ARENA_HEADER_BYTES,
      .creator_pid = (uint32_t)getpid(),
      .state = CKV_ARENA_STATE_LIVE,
  };
  snprintf(h.kind, sizeof h.kind, "%s", be->name);
  if (label) snprintf(h.label, sizeof h.label, "%s", label);
  r = header_write(a, &h);
  if (r < 0) {
    be->destroy(a->ctx, a->base, a->bytes);
    free(a);
    return r;
  }
  *ret = a;
  return CKV_OK;
}

ckv_arena *ckv_arena_free(ckv_arena *a) {
  if (!a) return NULL;
  if (a->owner && !a->keep_live) set_state(a, CKV_ARENA_STATE_RETIRED);
  a->be->destroy(a->ctx, a->base, a->bytes);
  free(a);
  return NULL;
}

void ckv_arena_keep_live(ckv_arena *a) {
  if (a && a->owner) a->keep_live = true;
}

void *ckv_arena_base(const ckv_arena *a) { return a->base; }
uint64_t ckv_arena_size(const ckv_arena *a) { return a->bytes; }
uint64_t ckv_arena_data_offset(const ckv_arena *a) {
  (void)a; /* the same for every arena today; kept per arena for device backends */
  return CKV_ARENA_HEADER_BYTES;
}
const char *ckv_arena_kind(const ckv_arena *a) { return a->be->name; }
uint64_t ckv_arena_generation(const ckv_arena *a) { return a->generation; }
uint64_t ckv_arena_committed(const ckv_arena *a) { return a->committed; }

int ckv_arena_grow(ckv_arena *a, uint64_t end) {
  if (!a) return CKV_ERR_INVALID;
  if (!a->owner) return CKV_ERR_STATE;
  if (end > a->bytes) return CKV_ERR_INVALID;
  while (a->committed < end) {
    uint64_t to = a->committed * 2 < a->bytes ? a->committed * 2 : a->bytes;
    if (a->be->grow) {
      int r = a->be->grow(a->ctx, a->base, a->committed, to);
      if (r < 0) return r;
    }
    a->committed = to;
  }
  return CKV_OK;
}

/* The generic checks of an export's counts and descriptors. */
static int desc_counts_check(const ckv_arena_desc *e) {
  if (strnlen(e->kind, sizeof e->kind) >= sizeof e->kind) return CKV_ERR_INVALID;
  if (e->n_fds > CKV_ARENA_MAX_FDS || e->handle_len > CKV_ARENA_HANDLE_MAX) return CKV_ERR_INVALID;
  for (uint32_t i = 0; i < e->n_fds; i++)
    if (e->fds[i] < 0) return CKV_ERR_INVALID;
  return CKV_OK;
}

/* The committed prefix an export announces: whole granules within the arena. */
static int desc_committed_check(const ckv_arena_desc *e, const ckv_arena_backend *be) {
  if (e->committed < CKV_ARENA_HEADER_BYTES || e->committed > e->bytes || e->committed % granularity(be) != 0)
    return CKV_ERR_INVALID;
  return CKV_OK;
}

int ckv_arena_refresh(ckv_arena *a, const ckv_arena_desc *e) {
  if (!a || !e) return CKV_ERR_INVALID;
  if (a->owner) return CKV_ERR_STATE;
  if (strncmp(e->kind, a->be->name, sizeof e->kind) != 0 || e->bytes != a->bytes || e->generation != a->generation)
    return CKV_ERR_FORMAT;
  int r = desc_counts_check(e);
  if (r == CKV_OK) r = desc_committed_check(e, a->be);
  if (r < 0) return r;
  if (e->committed < a->committed) return CKV_ERR_INVALID;
  if (e->committed == a->committed) return CKV_OK;
  if (a->be->refresh && (r = a->be->refresh(a->ctx, a->base, a->committed, e)) < 0) return r;
  a->committed = e->committed;
  return CKV_OK;
}
int ckv_arena_is_owner(const ckv_arena *a) { return a->owner; }

int ckv_arena_is_live(const ckv_arena *a) {
  if (a->be->read) return 1;
  return ckv_load_acquire_u32(&((const ckv_arena_header *)a->base)->state) == CKV_ARENA_STATE_LIVE;
}

/* ---- sharing ---- */

int ckv_arena_export(const ckv_arena *a, ckv_arena_desc *ret) {
  if (!a || !ret) return CKV_ERR_INVALID;
  if (!a->owner) return CKV_ERR_STATE;
  ckv_arena_desc e;
  memset(&e, 0, sizeof e);
  for (size_t i = 0; i < CKV_ARENA_MAX_FDS; i++) e.fds[i] = -1;
  snprintf(e.kind, sizeof e.kind, "%s", a->be->name);
  e.bytes = a->bytes;
  e.generation = a->generation;
  e.committed = a->committed;
  int r = a->be->export_handles(a->ctx, &e);
  if (r < 0) return r;
  if (e.n_fds > CKV_ARENA_MAX_FDS || e.handle_len > CKV_ARENA_HANDLE_MAX) return CKV_ERR_INTERNAL;
  *ret = e;
  return CKV_OK;
}

static int validate_header(const ckv_arena_header *h, const ckv_arena_desc *e, const ckv_arena_backend *be) {
  if (h->magic != CKV_ARENA_MAGIC) return CKV_ERR_FORMAT;
  if (h->format != ckv_arena_format()) return CKV_ERR_FORMAT;
  if (h->bytes != e->bytes) return CKV_ERR_FORMAT;
  if (h->generation != e->generation) return CKV_ERR_FORMAT;
  if (h->data_offset != CKV_ARENA_HEADER_BYTES) return CKV_ERR_FORMAT;
  if (strncmp(h->kind, be->name, sizeof h->kind) != 0) return CKV_ERR_FORMAT;
  if (h->state != CKV_ARENA_STATE_LIVE) return CKV_ERR_FORMAT;
  return CKV_OK;
}

/* Maps e with `map` (the backend's import or adopt) into a (calloc'd, its
 * backend, bytes and committed set), reads and validates the header and sets
 * the generation; on failure a is unmapped and freed. */
static int map_checked(ckv_arena *a, const ckv_arena_desc *e,
                       int (*map)(const ckv_arena_desc *, void **, void **), ckv_arena_header *h) {
  int r = map(e, &a->ctx, &a->base);
  if (r < 0) {
    free(a);
    return r;
  }
  r = header_read(a, h);
  if (r == CKV_OK) r = validate_header(h, e, a->be);
  if (r < 0) {
    a->be->destroy(a->ctx, a->base, a->bytes);
    free(a);
    return r;
  }
  a->generation = h->generation;
  return CKV_OK;
}

int ckv_arena_import(const ckv_arena_desc *e, ckv_arena **ret) {
  if (!e || !ret) return CKV_ERR_INVALID;
  int r = desc_counts_check(e);
  if (r < 0) return r;
  const ckv_arena_backend *be = ckv_arena_backend_find(e->kind);
  if (!be) return CKV_ERR_UNSUPPORTED;
  if (e->bytes <= CKV_ARENA_HEADER_BYTES || e->bytes > CKV_ARENA_MAX_BYTES + CKV_ARENA_HEADER_BYTES ||
      e->bytes % granularity(be) != 0)
    return CKV_ERR_FORMAT;
  if ((r = desc_committed_check(e, be)) < 0) return r;

  ckv_arena *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->be = be;
  a->bytes = e->bytes;
  a->owner = false;
  a->committed = e->committed;
  ckv_arena_header h;
  if ((r = map_checked(a, e, be->import, &h)) < 0) return r;
  *ret = a;
  return CKV_OK;
}

int ckv_arena_discard(ckv_arena *a, uint64_t off, uint64_t len) {
  if (!a) return CKV_ERR_INVALID;
  if (!a->owner) return CKV_ERR_STATE;
  uint64_t g = granularity(a->be);
  if (off < CKV_ARENA_HEADER_BYTES || off > a->bytes || len > a->bytes - off) return CKV_ERR_INVALID;
  if (off % g != 0 || len % g != 0) return CKV_ERR_INVALID;
  if (len == 0 || !a->be->discard) return CKV_OK;
  return a->be->discard(a->ctx, a->base, off, len);
}

int ckv_arena_discard_cb(void *arena, uint64_t off, uint64_t len) {
  return ckv_arena_discard(arena, off, len);
}

int ckv_arena_resident(const ckv_arena *a, uint64_t *ret_bytes) {
  if (!a || !ret_bytes) return CKV_ERR_INVALID;
  if (!a->owner || !a->be->resident) return CKV_ERR_UNSUPPORTED;
  return a->be->resident(a->ctx, ret_bytes);
}

int ckv_arena_adopt(const ckv_arena_desc *e, ckv_arena **ret) {
  if (!e || !ret) return CKV_ERR_INVALID;
  int r = desc_counts_check(e);
  if (r < 0) return r;
  const ckv_arena_backend *be = ckv_arena_backend_find(e->kind);
  if (!be || !be->adopt) return CKV_ERR_UNSUPPORTED;
  if (e->bytes <= CKV_ARENA_HEADER_BYTES || e->bytes > CKV_ARENA_MAX_BYTES + CKV_ARENA_HEADER_BYTES ||
      e->bytes % granularity(be) != 0)
    return CKV_ERR_FORMAT;
  ckv_arena *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->be = be;
  a->bytes = e->bytes;
  a->committed = e->bytes; /* a backend that grows cannot adopt (no grow state crosses a restart) */
  ckv_arena_header h;
  if ((r = map_checked(a, e, be->adopt, &h)) < 0) return r;
  a->owner = true;
  /* The header names its creator for diagnostics: that is us from now on. */
  h.creator_pid = (uint32_t)getpid();
  (void)header_write(a, &h);
  *ret = a;
  return CKV_OK;
}
