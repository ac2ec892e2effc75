/* shm/arena_host.c - the host arena backend: a sealed memfd mapped MAP_SHARED.
 *
 * memfd_create gives an anonymous shmem file whose pages are allocated on
 * first touch (no up-front commit or accounting), so an arena can be sized at
 * a tenant's whole quota.  It is sealed against shrinking and growing (a
 * mapping can never SIGBUS because someone truncated the file) and then
 * against further seals (a worker holding the fd cannot add F_SEAL_WRITE or
 * F_SEAL_FUTURE_WRITE and freeze the daemon).  Freed chunks are given back
 * with fallocate(PUNCH_HOLE), which shmem permits under these seals.
 *
 * The fd crosses to workers with SCM_RIGHTS (shm/fdpass.h).  An importer maps
 * it and keeps no fd of its own: the mapping pins the memory.  KV memory is
 * excluded from core dumps (MADV_DONTDUMP): a crash of a 40 GiB daemon should
 * not write 40 GiB. */
#include "commitkv/status.h"
#include "shm/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

typedef struct host_ctx {
  int fd; /* the memfd (owner only; -1 in importers) */
} host_ctx;

static void no_dump(void *base, uint64_t bytes) {
  /* Advisory: a failure only means the KV bytes may appear in a core dump. */
  if (bytes > CKV_ARENA_HEADER_BYTES)
    (void)madvise((char *)base + CKV_ARENA_HEADER_BYTES, bytes - CKV_ARENA_HEADER_BYTES, MADV_DONTDUMP);
}

/* The whole memfd is mapped at once (pages commit on first touch), so
 * `initial` needs nothing and there is no grow or refresh slot. */
static int host_create(uint64_t bytes, uint64_t initial, const char *label, void **ret_ctx, void **ret_base) {
  (void)initial;
  if (bytes > (uint64_t)INT64_MAX || bytes > SIZE_MAX) return CKV_ERR_LIMIT;
  char name[128];
  snprintf(name, sizeof name, "commitkv:%s", label && *label ? label : "arena");
  host_ctx *c = malloc(sizeof *c);
  if (!c) return -ENOMEM;
  int r;
  c->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (c->fd < 0) {
    r = -errno;
    goto fail;
  }
  if (ftruncate(c->fd, (off_t)bytes) < 0 || fcntl(c->fd, F_ADD_SEALS, HOST_SEALS) < 0) {
    r = -errno;
    goto fail;
  }
  void *base = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
  if (base == MAP_FAILED) {
    r = -errno;
    goto fail;
  }
  no_dump(base, bytes);
  *ret_ctx = c;
  *ret_base = base;
  return CKV_OK;
fail:
  if (c->fd >= 0) close(c->fd);
  free(c);
  return r;
}

static int host_import(const ckv_arena_desc *e, void **ret_ctx, void **ret_base) {
  if (e->n_fds != 1) return CKV_ERR_INVALID;
  int fd = e->fds[0];
  struct stat st;
  if (fstat(fd, &st) < 0) return errno == EBADF ? CKV_ERR_INVALID : -errno;
  /* Only a regular shmem file sealed exactly as we seal it, of the announced
   * size, is an arena: anything else could shrink under the mapping. */
  if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != e->bytes) return CKV_ERR_FORMAT;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & HOST_SEALS) != HOST_SEALS) return CKV_ERR_FORMAT;
  if (e->bytes > SIZE_MAX) return CKV_ERR_LIMIT;
  host_ctx *c = malloc(sizeof *c);
  if (!c) return -ENOMEM;
  c->fd = -1;
  void *base = mmap(NULL, (size_t)e->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int r = -errno;
    free(c);
    return r;
  }
  no_dump(base, e->bytes);
  *ret_ctx = c;
  *ret_base = base;
  return CKV_OK;
}

/* An import that keeps a duplicate of the fd: the adopter exports, discards
 * (punches holes) and hands the memfd on again, as its creator did. */
static int host_adopt(const ckv_arena_desc *e, void **ret_ctx, void **ret_base) {
  int r = host_import(e, ret_ctx, ret_base);
  if (r < 0) return r;
  host_ctx *c = *ret_ctx;
  c->fd = fcntl(e->fds[0], F_DUPFD_CLOEXEC, 0);
  if (c->fd < 0) {
    r = -errno;
    munmap(*ret_base, (size_t)e->bytes);
    free(c);
    return r;
  }
  return CKV_OK;
}

static void host_destroy(void *ctx, void *base, uint64_t bytes) {
  host_ctx *c = ctx;
  if (base) munmap(base, (size_t)bytes);
  if (c && c->fd >= 0) close(c->fd);
  free(c);
}

static int host_export(void *ctx, ckv_arena_desc *e) {
  host_ctx *c = ctx;
  if (c->fd < 0) return CKV_ERR_STATE;
  e->fds[0] = c->fd;
  e->n_fds = 1;
  e->handle_len = 0;
  return CKV_OK;
}

static int host_discard(void *ctx, void *base, uint64_t off, uint64_t len) {
  (void)base;
  host_ctx *c = ctx;
  if (c->fd < 0) return CKV_ERR_STATE;
  if (fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0) return -errno;
  return CKV_OK;
}

static int host_resident(void *ctx, uint64_t *ret_bytes) {
  host_ctx *c = ctx;
  struct stat st;
  if (c->fd < 0) return CKV_ERR_UNSUPPORTED;
  if (fstat(c->fd, &st) < 0) return -errno;
  *ret_bytes = (uint64_t)st.st_blocks * 512u;
  return CKV_OK;
}

const ckv_arena_backend ckv_arena_host_backend = {
    .name = "host",
    .granularity = NULL, /* the page size */
    .create = host_create,
    .import = host_import,
    .destroy = host_destroy,
    .export_handles = host_export,
    .discard = host_discard,
    .read = NULL, /* CPU-addressable: the generic code loads and stores directly */
    .write = NULL,
    .resident = host_resident,
    .adopt = host_adopt,
};
