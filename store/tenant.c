/* tenant.c - a tenant's arena, allocator, quota and usage, and how big an
 * arena a quota needs (see tenant.h).
 *
 * Freed chunks stay warm (backed, mapped in the daemon) up to an eighth of
 * the quota (WARM_SHARE): the next blocks are taken from them, so a move's
 * destination is memory that is already mapped instead of fresh shmem pages
 * that fault and are zeroed one by one on a compressor thread, and the server
 * thread punches no hole.  The warm chunks are not the tenant's: its quota
 * and bytes_used count its blocks only; they sit inside the arena's headroom
 * (an eighth of the quota plus 16 MiB, see ckv_tenant_arena_for_quota), so
 * what the daemon keeps resident never exceeds the arenas it sized against
 * [daemon] memory.  A block whose memory may hold an earlier block's bytes
 * (a warm chunk, a freed block of its slab) is zeroed before it is handed
 * out: no block ever shows K/V it was not given (another session's, a
 * dropped one's). */
#include "store/tenant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "store/blockmem.h"
#include "common/log.h"
#include "shm/arena.h"
#ifdef CKV_HAVE_CUDA_ARENA
#include "shm/arena_cuda.h"
#endif
#include "shm/slab.h"

/* Headroom of an arena over its quota: a fixed part for the header and the
 * partly used slabs of a few block classes, and an eighth for rounding. */
#define ARENA_SLACK (UINT64_C(16) << 20)
/* Freed chunks kept warm: this share of the quota (within the headroom). */
#define WARM_SHARE 8u

uint64_t ckv_tenant_arena_for_quota(uint64_t quota) {
  const uint64_t a = CKV_TENANT_ARENA_ALIGN;
  if (quota > (UINT64_MAX - 2 * ARENA_SLACK) / 9 * 8) return UINT64_MAX / a * a;
  uint64_t need = quota + quota / 8 + ARENA_SLACK + CKV_ARENA_HEADER_BYTES;
  uint64_t arena = (need + a - 1) / a * a;
  while (ckv_tenant_quota_for_arena(arena) < quota) arena += a; /* integer rounding: a chunk at most */
  return arena;
}

uint64_t ckv_tenant_quota_for_arena(uint64_t arena_bytes) {
  if (arena_bytes <= CKV_ARENA_HEADER_BYTES) return 0;
  uint64_t usable = arena_bytes - CKV_ARENA_HEADER_BYTES;
  /* Small arenas (below twice the fixed slack) keep half as headroom. */
  if (usable < 2 * ARENA_SLACK) return usable / 2;
  return (usable - ARENA_SLACK) / 9 * 8;
}

static int tenant_make(const char *name, uint64_t quota_bytes, const ckv_arena_backend *be, uint64_t arena_bytes,
                       ckv_arena *adopted, uint32_t arena_id, ckv_tenant **ret) {
  ckv_tenant *t = calloc(1, sizeof(*t));
  if (!t) {
    ckv_arena_free(adopted);
    return -ENOMEM;
  }
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->quota_bytes = quota_bytes;
  t->arena_id = arena_id;
  t->mem = &ckv_blockmem_host;
  t->arena = adopted;
  int r = adopted ? CKV_OK : ckv_arena_new(be, arena_bytes - CKV_ARENA_HEADER_BYTES, name, &t->arena);
  if (r < 0) goto fail;
  ckv_slab_config cfg = {
      .offset = ckv_arena_data_offset(t->arena),
      .bytes = ckv_arena_size(t->arena) - ckv_arena_data_offset(t->arena),
      .discard = ckv_arena_discard_cb,
      .discard_opaque = t->arena,
      .warm_bytes = quota_bytes / WARM_SHARE,
  };
  r = ckv_slab_new(&cfg, &t->slab);
  if (r < 0) goto fail;
#ifdef CKV_HAVE_CUDA_ARENA
  ckv_arena_desc d;
  if (strcmp(ckv_arena_kind(t->arena), ckv_arena_cuda_backend.name) == 0 && ckv_arena_export(t->arena, &d) == CKV_OK)
    (void)ckv_arena_cuda_desc_uuid(&d, t->device_uuid);
#endif
  *ret = t;
  return CKV_OK;
fail:
  ckv_tenant_free(t);
  return r;
}

int ckv_tenant_new(const char *name, uint64_t quota_bytes, uint64_t arena_bytes, uint32_t arena_id,
                   const ckv_arena_backend *be, ckv_tenant **ret) {
  if (arena_bytes <= CKV_ARENA_HEADER_BYTES) return CKV_ERR_INVALID;
  return tenant_make(name, quota_bytes, be, arena_bytes, NULL, arena_id, ret);
}

int ckv_tenant_adopt(const char *name, uint64_t quota_bytes, ckv_arena *arena, uint32_t arena_id, ckv_tenant **ret) {
  if (!arena) return CKV_ERR_INVALID;
  return tenant_make(name, quota_bytes, NULL, 0, arena, arena_id, ret);
}

void ckv_tenant_keep(ckv_tenant *t) {
  t->slab = ckv_slab_free(t->slab);
  ckv_arena_keep_live(t->arena);
}

ckv_tenant *ckv_tenant_free(ckv_tenant *t) {
  if (!t) return NULL;
  if (t->prefix_free) t->prefix_free(t->prefix);
  free(t->deferred);
  free(t->held);
  ckv_slab_free(t->slab);
  ckv_arena_free(t->arena);
  free(t);
  return NULL;
}

bool ckv_tenant_would_fit(const ckv_tenant *t, uint64_t bytes) {
  /* Blocks held for the warm journal are freed as far as the tenant is
   * concerned (given back within a journal period or two): they take arena
   * headroom, not quota, or reclaiming under quota pressure would not help. */
  return t->bytes_used - t->held_bytes + bytes <= t->quota_bytes;
}

int ckv_tenant_block_alloc(ckv_tenant *t, uint64_t bytes, uint32_t format, uint64_t *ret_offset) {
  if (!ckv_tenant_would_fit(t, bytes)) return CKV_ERR_QUOTA;
  if (!t->slab) return CKV_ERR_STATE; /* handed on (ckv_tenant_keep) */
  uint32_t cls;
  /* One class per block size and format: blocks of one class are interchangeable. */
  int r = ckv_slab_class(t->slab, bytes, format, &cls);
  if (r < 0) return r == CKV_ERR_LIMIT ? CKV_ERR_NOSPACE : r;
  if (t->claim.pending) { /* a warm restart puts the block back where it was, bytes and all */
    t->claim.pending = false;
    if (t->claim.offset + bytes > ckv_arena_size(t->arena)) return CKV_ERR_INVALID;
    if ((r = ckv_slab_claim(t->slab, cls, t->claim.slab_offset, t->claim.offset)) < 0) return r;
    *ret_offset = t->claim.offset;
    t->bytes_used += bytes;
    if (format < CKV_FORMAT_COUNT_) t->bytes_by_format[format] += bytes;
    return CKV_OK;
  }
  bool reused = false;
  r = ckv_slab_take(t->slab, cls, ret_offset, &reused);
  if (r < 0) return r;
  /* The arena backs a growing prefix (device memory is taken as needed):
   * extend it over this block.  Workers map the new part when they meet it. */
  if (*ret_offset + bytes > ckv_arena_committed(t->arena)) {
    r = ckv_arena_grow(t->arena, *ret_offset + bytes);
    if (r < 0) {
      ckv_log(CKV_LOG_WARNING, "arena-full", t->name, NULL, "cannot grow arena %u past %llu bytes: %s", t->arena_id,
              (unsigned long long)ckv_arena_committed(t->arena), ckv_strerror(r));
      (void)ckv_slab_dealloc(t->slab, *ret_offset);
      return r == -ENOMEM || r == CKV_ERR_LIMIT ? CKV_ERR_NOSPACE : r;
    }
    ckv_log(CKV_LOG_INFO, "arena-grow", t->name, NULL, "arena %u: %llu of %llu bytes backed", t->arena_id,
            (unsigned long long)ckv_arena_committed(t->arena), (unsigned long long)ckv_arena_size(t->arena));
  }
  if (reused) {
    /* Earlier bytes (another session's K/V) never show through a new block:
     * it reads zero, as fresh arena memory does, before anyone can see it.
     * Warm memory is mapped, so this runs at memset speed. */
    ckv_meta_write z = {.offset = *ret_offset, .src = NULL, .bytes = 0, .zero_bytes = bytes};
    r = t->mem->write(ckv_arena_base(t->arena), &z, 1);
    if (r < 0) {
      ckv_log(CKV_LOG_WARNING, "block-clear", t->name, NULL, "cannot clear a reused block: %s", ckv_strerror(r));
      (void)ckv_slab_dealloc(t->slab, *ret_offset);
      return r;
    }
  }
  t->bytes_used += bytes;
  if (format < CKV_FORMAT_COUNT_) t->bytes_by_format[format] += bytes;
  return CKV_OK;
}

struct ckv_deferred_free {
  uint64_t offset, bytes;
  uint32_t format;
};

static void release(ckv_tenant *t, uint64_t offset, uint64_t bytes, uint32_t format) {
  if (!t->slab) return; /* handed on: the next daemon's blocks now */
  if (ckv_slab_dealloc(t->slab, offset) < 0) return; /* not ours: never corrupt the accounting */
  t->bytes_used -= bytes;
  if (format < CKV_FORMAT_COUNT_) t->bytes_by_format[format] -= bytes;
}

void ckv_tenant_pin(ckv_tenant *t) { t->pins++; }

void ckv_tenant_unpin(ckv_tenant *t) {
  if (!t->pins || --t->pins) return;
  for (size_t i = 0; i < t->n_deferred; i++)
    release(t, t->deferred[i].offset, t->deferred[i].bytes, t->deferred[i].format);
  t->n_deferred = 0;
}

/* Appends a free to one of the tenant's waiting lists; false when out of memory. */
static bool defer(struct ckv_deferred_free **list, size_t *n, size_t *cap, uint64_t offset, uint64_t bytes,
                  uint32_t format) {
  if (*n == *cap) {
    size_t ncap = *cap ? 2 * *cap : 64;
    struct ckv_deferred_free *d = realloc(*list, ncap * sizeof *d);
    if (!d) return false;
    *list = d;
    *cap = ncap;
  }
  (*list)[(*n)++] = (struct ckv_deferred_free){offset, bytes, format};
  return true;
}

static void free_unheld(ckv_tenant *t, uint64_t offset, uint64_t bytes, uint32_t format);

void ckv_tenant_block_free(ckv_tenant *t, uint64_t offset, uint64_t bytes, uint32_t format) {
  if (t->journal_hold && t->slab) {
    if (!defer(&t->held, &t->n_held, &t->cap_held, offset, bytes, format)) {
      /* cannot wait: the block stays allocated (leaked to this tenant) rather than reused under a journal entry */
      ckv_log(CKV_LOG_ERROR, "block-free", t->name, NULL,
              "out of memory holding a freed block for the warm journal: %llu bytes stay allocated",
              (unsigned long long)bytes);
      return;
    }
    t->held_bytes += bytes;
    return;
  }
  free_unheld(t, offset, bytes, format);
}

size_t ckv_tenant_release_held(ckv_tenant *t, bool (*named)(void *ctx, uint64_t offset), void *ctx) {
  size_t kept = 0, given = 0;
  for (size_t i = 0; i < t->n_held; i++) {
    struct ckv_deferred_free d = t->held[i];
    if (named && named(ctx, d.offset)) {
      t->held[kept++] = d; /* the order of frees is kept */
      continue;
    }
    t->held_bytes -= d.bytes;
    free_unheld(t, d.offset, d.bytes, d.format);
    given++;
  }
  t->n_held = kept;
  return given;
}

static void free_unheld(ckv_tenant *t, uint64_t offset, uint64_t bytes, uint32_t format) {
  if (t->pins && t->slab) {
    if (t->n_deferred == t->cap_deferred) {
      size_t cap = t->cap_deferred ? 2 * t->cap_deferred : 64;
      struct ckv_deferred_free *d = realloc(t->deferred, cap * sizeof *d);
      if (!d) { /* cannot wait: the block stays allocated (leaked to this tenant) rather than reused under a reader */
        ckv_log(CKV_LOG_ERROR, "block-free", t->name, NULL,
                "out of memory deferring a block free during a save: %llu bytes stay allocated",
                (unsigned long long)bytes);
        return;
      }
      t->deferred = d;
      t->cap_deferred = cap;
    }
    t->deferred[t->n_deferred++] = (struct ckv_deferred_free){offset, bytes, format};
    return;
  }
  release(t, offset, bytes, format);
}

void *ckv_tenant_ptr(const ckv_tenant *t, uint64_t offset) { return (uint8_t *)ckv_arena_base(t->arena) + offset; }
