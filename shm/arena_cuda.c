/* shm/arena_cuda.c - the CUDA arena backend (see shm/arena_cuda.h).
 *
 * Plain C against the CUDA headers and the static runtime.  Driver-API calls
 * (the VMM functions) go through shm/cuda_driver.h, never through libcuda at
 * link time.  Every backend slot first makes the arena's device current on
 * the calling thread (cudaSetDevice: the daemon calls from several threads).
 *
 * Export blob (ckv_arena_desc.handle, handle_len = sizeof(cuda_blob)): a
 * header naming the path and the device, then either the VMM chunk list (one
 * fd per chunk in desc.fds, mapped back to back from offset 0) or the legacy
 * cudaIpcMemHandle_t and the arena's offset inside that allocation. */
#ifdef CKV_SHM_CUDA_BUILD
#include "shm/arena_cuda.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "shm/cuda_driver.h"

#define CKV_CUDA_BLOB_MAGIC UINT32_C(0x43564b43) /* "CKVC" little-endian */
#define CKV_CUDA_BLOB_VERSION 2u /* 2: up to CKV_ARENA_MAX_FDS (8) chunks, committed prefix */

/* The handle blob.  Same host, same build on both sides (the arena header's
 * format word checks the latter), so it is copied as bytes. */
typedef struct cuda_blob {
  uint32_t magic;   /* CKV_CUDA_BLOB_MAGIC */
  uint16_t version; /* CKV_CUDA_BLOB_VERSION */
  uint16_t path;    /* CKV_CUDA_PATH_VMM or CKV_CUDA_PATH_LEGACY_IPC */
  uint8_t uuid[16]; /* exporting device: an importer without it refuses */
  union {
    struct {
      uint32_t n_chunks;                          /* = desc.n_fds */
      uint32_t reserved;                          /* zero */
      uint64_t chunk_bytes[CKV_ARENA_MAX_FDS];    /* physical size of each chunk, mapped in order */
    } vmm;
    struct {
      uint64_t base_offset;                       /* arena start inside the IPC allocation */
      uint8_t handle[64];                         /* cudaIpcMemHandle_t */
    } ipc;
  } u;
} cuda_blob;
_Static_assert(sizeof(cuda_blob) <= CKV_ARENA_HANDLE_MAX, "CUDA export blob must fit the descriptor");
_Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");

typedef struct cuda_chunk {
  CUmemGenericAllocationHandle h; /* owner: kept for the arena's life; importer: released after map */
  bool has_h;
  int fd;                         /* owner: exported POSIX fd; importer: -1 */
  uint64_t off, bytes;            /* place in the reserved range */
} cuda_chunk;

/* One legacy IPC allocation known to this process: created here, or opened
 * from another process's handle.  CUDA allows one open per handle per
 * process and no open of one's own handle, so every import goes through
 * this list. */
typedef struct ipc_entry {
  struct ipc_entry *next;
  uint8_t handle[64];
  void *ptr;    /* allocation base in this process */
  bool owned;   /* cudaMalloc'd here (free) vs opened (close) */
  int device;
  unsigned refs;
} ipc_entry;

typedef struct cuda_ctx {
  int path;          /* CKV_CUDA_PATH_* */
  int device;        /* runtime ordinal in this process */
  bool owner;
  uint8_t uuid[16];
  /* vmm */
  CUdeviceptr va;    /* reserved range */
  uint64_t va_bytes; /* its size: sum of the chunks */
  uint32_t n_chunks;
  cuda_chunk chunks[CKV_ARENA_MAX_FDS];
  /* legacy */
  ipc_entry *ipc;
  uint64_t base_offset;
} cuda_ctx;

/* ---- process state ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_device = -1;
static int g_path = CKV_CUDA_PATH_NONE;
static char g_reason[320];
static uint8_t g_uuid[16];
static ipc_entry *g_ipc; /* guarded by g_lock */
static _Thread_local char t_err[320];

const char *ckv_arena_cuda_last_error(void) { return t_err; }

__attribute__((format(printf, 2, 3))) static int fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_err, sizeof t_err, fmt, ap);
  va_end(ap);
  return code;
}

static int rt_fail(const char *what, cudaError_t e) {
  return fail(e == cudaErrorMemoryAllocation ? -ENOMEM : CKV_ERR_DEVICE, "%s: %d (%s)", what, (int)e,
              cudaGetErrorString(e));
}

static int cu_fail(const char *what, CUresult r) {
  char buf[160];
  return fail(r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : CKV_ERR_DEVICE, "%s: %s", what,
              ckv_cu_strerror(r, buf, sizeof buf));
}

static void uuid_str(const uint8_t u[16], char *out) {
  static const char hex[] = "0123456789abcdef";
  size_t k = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[k++] = '-';
    out[k++] = hex[u[i] >> 4];
    out[k++] = hex[u[i] & 15];
  }
  out[k] = 0;
}

/* Makes `dev` current on this thread and its primary context live. */
static int use_device(int dev) {
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess) e = cudaFree(NULL);
  if (e != cudaSuccess) return rt_fail("cudaSetDevice", e);
  return CKV_OK;
}

static uint64_t round_up(uint64_t v, uint64_t g) { return (v + g - 1) / g * g; }

/* ---- probe and path choice ---- */

int ckv_cuda_probe(uint32_t device, char *uuid_out, char *reason, size_t len) {
  char scratch[8];
  if (!reason) {
    reason = scratch;
    len = sizeof scratch;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(reason, len, "%s: cudaGetDeviceCount returned %d (%s)",
             e == cudaErrorInsufficientDriver ? "no CUDA driver (or one too old for this build)"
             : e == cudaErrorNoDevice         ? "no CUDA device"
                                              : "CUDA unavailable",
             (int)e, cudaGetErrorString(e));
    return CKV_ERR_DEVICE;
  }
  if (n <= 0) {
    snprintf(reason, len, "no CUDA device: the driver reports 0 devices");
    return CKV_ERR_DEVICE;
  }
  if (device >= (uint32_t)n) {
    snprintf(reason, len, "no CUDA device %u: the driver reports %d device%s (ordinals 0..%d, after CUDA_VISIBLE_DEVICES)",
             device, n, n == 1 ? "" : "s", n - 1);
    return CKV_ERR_DEVICE;
  }
  struct cudaDeviceProp p;
  e = cudaGetDeviceProperties(&p, (int)device);
  if (e != cudaSuccess) {
    snprintf(reason, len, "CUDA device %u: cudaGetDeviceProperties returned %d (%s)", device, (int)e,
             cudaGetErrorString(e));
    return CKV_ERR_DEVICE;
  }
  int mode = cudaComputeModeDefault;
  if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, (int)device) == cudaSuccess &&
      mode == cudaComputeModeProhibited) {
    snprintf(reason, len, "CUDA device %u (%s) is in prohibited compute mode", device, p.name);
    return CKV_ERR_DEVICE;
  }
  e = cudaSetDevice((int)device);
  if (e == cudaSuccess) e = cudaFree(NULL); /* creates the primary context: busy/exclusive devices fail here */
  if (e != cudaSuccess) {
    snprintf(reason, len, "CUDA device %u (%s): cannot create a context: %d (%s)", device, p.name, (int)e,
             cudaGetErrorString(e));
    return CKV_ERR_DEVICE;
  }
  char u[CKV_CUDA_UUID_STR];
  uuid_str((const uint8_t *)p.uuid.bytes, u);
  if (uuid_out) memcpy(uuid_out, u, sizeof u);
  snprintf(reason, len, "CUDA device %u: %s, sm_%d%d, %.1f GiB, uuid %s", device, p.name, p.major, p.minor,
           (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), u);
  return CKV_OK;
}

static int device_uuid(int dev, uint8_t out[16]) {
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, dev);
  if (e != cudaSuccess) return rt_fail("cudaGetDeviceProperties", e);
  memcpy(out, p.uuid.bytes, 16);
  return CKV_OK;
}

/* Runtime ordinal of the device with this UUID in this process, or an error
 * (another host, or a device hidden by CUDA_VISIBLE_DEVICES). */
static int device_by_uuid(const uint8_t uuid[16], int *ret) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return rt_fail("cudaGetDeviceCount", e);
  for (int i = 0; i < n; i++) {
    uint8_t u[16];
    if (device_uuid(i, u) == CKV_OK && memcmp(u, uuid, 16) == 0) {
      *ret = i;
      return CKV_OK;
    }
  }
  char s[CKV_CUDA_UUID_STR];
  uuid_str(uuid, s);
  return fail(CKV_ERR_DEVICE, "the arena lives on CUDA device %s, which this process cannot see (%d device%s visible)",
              s, n, n == 1 ? "" : "s");
}

static void vmm_prop(CUmemAllocationProp *prop, CUdevice cu) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = cu;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Whether the VMM path works on `dev`: entry points, attributes and a trial
 * allocation + export of one granule.  `why` receives the cause when not. */
static bool vmm_usable(int dev, size_t *ret_gran, char *why, size_t len) {
  const ckv_cu_driver *d;
  char buf[160];
  if (ckv_cu_driver_get(&d, buf, sizeof buf) < 0) {
    snprintf(why, len, "driver entry points: %s", buf);
    return false;
  }
  CUdevice cu;
  CUresult r = d->DeviceGet(&cu, dev);
  if (r != CUDA_SUCCESS) {
    snprintf(why, len, "cuDeviceGet: %s", ckv_cu_strerror(r, buf, sizeof buf));
    return false;
  }
  int vmm = 0, posix = 0;
  if (d->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu) != CUDA_SUCCESS)
    vmm = 0;
  if (!vmm) {
    snprintf(why, len, "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0");
    return false;
  }
  if (d->DeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cu) !=
      CUDA_SUCCESS)
    posix = 0;
  if (!posix) {
    snprintf(why, len, "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0");
    return false;
  }
  CUmemAllocationProp prop;
  vmm_prop(&prop, cu);
  size_t gran = 0;
  r = d->MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || gran == 0) {
    snprintf(why, len, "cuMemGetAllocationGranularity: %s", ckv_cu_strerror(r, buf, sizeof buf));
    return false;
  }
  if (CKV_CUDA_ARENA_GRANULARITY % gran != 0) {
    snprintf(why, len, "VMM granularity %zu KiB does not divide the arena granularity (%llu KiB)", gran / 1024,
             (unsigned long long)(CKV_CUDA_ARENA_GRANULARITY / 1024));
    return false;
  }
  CUmemGenericAllocationHandle h;
  r = d->MemCreate(&h, gran, &prop, 0);
  if (r != CUDA_SUCCESS) {
    snprintf(why, len, "trial cuMemCreate(POSIX fd): %s", ckv_cu_strerror(r, buf, sizeof buf));
    return false;
  }
  int fd = -1;
  r = d->MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (fd >= 0) close(fd);
  d->MemRelease(h);
  if (r != CUDA_SUCCESS) {
    snprintf(why, len, "trial cuMemExportToShareableHandle: %s", ckv_cu_strerror(r, buf, sizeof buf));
    return false;
  }
  *ret_gran = gran;
  return true;
}

static bool legacy_usable(int dev, char *why, size_t len) {
  (void)dev;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, CKV_CUDA_ARENA_GRANULARITY);
  if (e == cudaSuccess) {
    cudaIpcMemHandle_t h;
    e = cudaIpcGetMemHandle(&h, p);
    cudaFree(p);
    if (e == cudaSuccess) return true;
    snprintf(why, len, "trial cudaIpcGetMemHandle: %d (%s)", (int)e, cudaGetErrorString(e));
  } else {
    snprintf(why, len, "trial cudaMalloc: %d (%s)", (int)e, cudaGetErrorString(e));
  }
  return false;
}

int ckv_arena_cuda_init(uint32_t device, char *why, size_t len) {
  char scratch[8], probe[256], vmm_why[200];
  if (!why) {
    why = scratch;
    len = sizeof scratch;
  }
  if (ckv_cuda_probe(device, NULL, probe, sizeof probe) < 0) {
    snprintf(why, len, "%s", probe);
    return CKV_ERR_DEVICE;
  }
  const char *force = getenv("CKV_CUDA_ARENA_PATH");
  bool want_legacy = force && strcmp(force, "legacy") == 0;
  bool want_vmm = force && strcmp(force, "vmm") == 0;
  int path = CKV_CUDA_PATH_NONE;
  char reason[sizeof g_reason];
  size_t gran = 0;
  if (want_legacy) {
    snprintf(vmm_why, sizeof vmm_why, "forced by CKV_CUDA_ARENA_PATH=legacy");
  } else if (vmm_usable((int)device, &gran, vmm_why, sizeof vmm_why)) {
    path = CKV_CUDA_PATH_VMM;
    snprintf(reason, sizeof reason,
             "vmm: cuMemCreate + POSIX fd handles over SCM_RIGHTS (device granularity %zu KiB)%s", gran / 1024,
             want_vmm ? ", forced by CKV_CUDA_ARENA_PATH=vmm" : "");
  } else if (want_vmm) {
    snprintf(why, len, "CKV_CUDA_ARENA_PATH=vmm but VMM is unavailable on device %u: %s", device, vmm_why);
    return CKV_ERR_DEVICE;
  }
  if (path == CKV_CUDA_PATH_NONE) {
    char lw[200];
    if (!legacy_usable((int)device, lw, sizeof lw)) {
      snprintf(why, len, "CUDA device %u: neither VMM (%s) nor legacy IPC (%s) works", device, vmm_why, lw);
      return CKV_ERR_DEVICE;
    }
    path = CKV_CUDA_PATH_LEGACY_IPC;
    snprintf(reason, sizeof reason, "legacy-ipc: cudaMalloc + cudaIpcGetMemHandle (VMM unavailable: %s)", vmm_why);
  }
  uint8_t u[16] = {0};
  if (device_uuid((int)device, u) < 0) {
    snprintf(why, len, "%s", t_err);
    return CKV_ERR_DEVICE;
  }
  pthread_mutex_lock(&g_lock);
  g_device = (int)device;
  g_path = path;
  memcpy(g_uuid, u, sizeof u);
  snprintf(g_reason, sizeof g_reason, "%s", reason);
  pthread_mutex_unlock(&g_lock);
  snprintf(why, len, "%s", reason);
  return CKV_OK;
}

int ckv_arena_cuda_path(void) {
  pthread_mutex_lock(&g_lock);
  int p = g_path;
  pthread_mutex_unlock(&g_lock);
  return p;
}

const char *ckv_arena_cuda_path_reason(void) { return g_reason; }

int ckv_arena_cuda_desc_uuid(const ckv_arena_desc *e, char *ret) {
  cuda_blob b;
  if (!e || !ret || e->handle_len != sizeof b) return CKV_ERR_FORMAT;
  memcpy(&b, e->handle, sizeof b);
  if (b.magic != CKV_CUDA_BLOB_MAGIC || b.version != CKV_CUDA_BLOB_VERSION) return CKV_ERR_FORMAT;
  uuid_str(b.uuid, ret);
  return CKV_OK;
}

/* ---- vmm ---- */

/* Unmaps and releases whatever of c's VMM state exists (also a half-built one). */
static void vmm_teardown(cuda_ctx *c) {
  const ckv_cu_driver *d;
  if (ckv_cu_driver_get(&d, NULL, 0) < 0) return;
  if (c->va) {
    for (uint32_t i = 0; i < c->n_chunks; i++)
      if (c->chunks[i].bytes) (void)d->MemUnmap(c->va + c->chunks[i].off, c->chunks[i].bytes);
    (void)d->MemAddressFree(c->va, c->va_bytes);
    c->va = 0;
  }
  for (uint32_t i = 0; i < c->n_chunks; i++) {
    if (c->chunks[i].has_h) (void)d->MemRelease(c->chunks[i].h);
    c->chunks[i].has_h = false;
    if (c->chunks[i].fd >= 0) close(c->chunks[i].fd);
    c->chunks[i].fd = -1;
  }
}

static int vmm_granularity(const ckv_cu_driver *d, int dev, CUdevice *ret_cu, size_t *ret_gran) {
  CUresult r = d->DeviceGet(ret_cu, dev);
  if (r != CUDA_SUCCESS) return cu_fail("cuDeviceGet", r);
  CUmemAllocationProp prop;
  vmm_prop(&prop, *ret_cu);
  r = d->MemGetAllocationGranularity(ret_gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || *ret_gran == 0) return cu_fail("cuMemGetAllocationGranularity", r);
  if (CKV_CUDA_ARENA_GRANULARITY % *ret_gran != 0)
    return fail(CKV_ERR_DEVICE, "device VMM granularity %zu does not divide the arena granularity", *ret_gran);
  return CKV_OK;
}

/* Reserves the arena's whole address range once: chunks are mapped into it
 * as the arena grows, so nothing mapped ever moves. */
static int vmm_reserve(const ckv_cu_driver *d, cuda_ctx *c, uint64_t bytes, size_t gran) {
  c->va_bytes = round_up(bytes, gran);
  CUresult r = d->MemAddressReserve(&c->va, c->va_bytes, gran, 0, 0);
  if (r != CUDA_SUCCESS) {
    c->va = 0;
    return cu_fail("cuMemAddressReserve", r);
  }
  return CKV_OK;
}

/* Maps chunk k (handle set) at its offset and grants this device read-write
 * access to it.  On failure the chunk is left unmapped (bytes 0). */
static int vmm_map_chunk(const ckv_cu_driver *d, cuda_ctx *c, cuda_chunk *k, CUdevice cu) {
  CUresult r = d->MemMap(c->va + k->off, k->bytes, 0, k->h, 0);
  if (r != CUDA_SUCCESS) {
    uint64_t b = k->bytes;
    k->bytes = 0;
    return cu_fail(b ? "cuMemMap" : "cuMemMap (empty chunk)", r);
  }
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = cu;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d->MemSetAccess(c->va + k->off, k->bytes, &ad, 1);
  if (r != CUDA_SUCCESS) return cu_fail("cuMemSetAccess", r); /* teardown unmaps it */
  return CKV_OK;
}

/* Owner: backs [off, off + bytes) with a new exported chunk, mapped and zeroed. */
static int vmm_add_chunk(cuda_ctx *c, uint64_t off, uint64_t bytes) {
  const ckv_cu_driver *d;
  char buf[200];
  if (ckv_cu_driver_get(&d, buf, sizeof buf) < 0) return fail(CKV_ERR_DEVICE, "%s", buf);
  if (c->n_chunks >= CKV_ARENA_MAX_FDS) return fail(CKV_ERR_LIMIT, "arena already has %u chunks", c->n_chunks);
  CUdevice cu;
  size_t gran;
  int rc = vmm_granularity(d, c->device, &cu, &gran);
  if (rc < 0) return rc;
  if (bytes == 0 || bytes % gran != 0 || off % gran != 0 || off + bytes > c->va_bytes)
    return fail(CKV_ERR_INVALID, "chunk [%llu, +%llu) outside the reservation", (unsigned long long)off,
                (unsigned long long)bytes);
  cuda_chunk *k = &c->chunks[c->n_chunks];
  *k = (cuda_chunk){.fd = -1, .off = off, .bytes = bytes};
  CUmemAllocationProp prop;
  vmm_prop(&prop, cu);
  CUresult r = d->MemCreate(&k->h, k->bytes, &prop, 0);
  if (r != CUDA_SUCCESS) {
    k->bytes = 0;
    return cu_fail("cuMemCreate", r);
  }
  k->has_h = true;
  c->n_chunks++; /* from here on teardown releases it */
  r = d->MemExportToShareableHandle(&k->fd, k->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) {
    k->fd = -1;
    rc = cu_fail("cuMemExportToShareableHandle", r);
  }
  if (rc == CKV_OK) {
    (void)fcntl(k->fd, F_SETFD, FD_CLOEXEC); /* the driver's fd is not close-on-exec: ours all are */
    rc = vmm_map_chunk(d, c, k, cu);
  }
  if (rc == CKV_OK) {
    /* The interface promises zeroed memory; cuMemCreate does not. */
    /* On the legacy stream, waited for alone: the daemon's compressor streams
     * (non-blocking) keep running. */
    cudaError_t e = cudaMemsetAsync((void *)(uintptr_t)(c->va + off), 0, (size_t)bytes, cudaStreamLegacy);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
    if (e != cudaSuccess) rc = rt_fail("cudaMemset", e);
  }
  if (rc < 0) { /* undo this chunk only: what was mapped before stays */
    if (k->bytes && c->va) (void)d->MemUnmap(c->va + k->off, k->bytes);
    (void)d->MemRelease(k->h);
    if (k->fd >= 0) close(k->fd);
    *k = (cuda_chunk){.fd = -1};
    c->n_chunks--;
  }
  return rc;
}

static int vmm_create(cuda_ctx *c, uint64_t bytes, uint64_t initial) {
  const ckv_cu_driver *d;
  char buf[200];
  if (ckv_cu_driver_get(&d, buf, sizeof buf) < 0) return fail(CKV_ERR_DEVICE, "%s", buf);
  CUdevice cu;
  size_t gran;
  int rc = vmm_granularity(d, c->device, &cu, &gran);
  if (rc == CKV_OK) rc = vmm_reserve(d, c, bytes, gran);
  if (rc == CKV_OK) rc = vmm_add_chunk(c, 0, round_up(initial, gran));
  if (rc < 0) vmm_teardown(c);
  return rc;
}

/* Importer: imports and maps the blob's chunks [c->n_chunks, n) behind the
 * ones already mapped; the first c->n_chunks must be the ones we have. */
static int vmm_import_chunks(cuda_ctx *c, const ckv_arena_desc *e, const cuda_blob *b) {
  const ckv_cu_driver *d;
  char buf[200];
  if (ckv_cu_driver_get(&d, buf, sizeof buf) < 0) return fail(CKV_ERR_DEVICE, "%s", buf);
  uint32_t n = b->u.vmm.n_chunks;
  if (n == 0 || n > CKV_ARENA_MAX_FDS || n != e->n_fds || n < c->n_chunks)
    return fail(CKV_ERR_FORMAT, "vmm export: %u chunks for %u fds (%u mapped)", n, e->n_fds, c->n_chunks);
  CUdevice cu;
  size_t gran;
  int rc = vmm_granularity(d, c->device, &cu, &gran);
  if (rc < 0) return rc;
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t sz = b->u.vmm.chunk_bytes[i];
    if (sz == 0 || sz % gran != 0 || sz > c->va_bytes - total) return fail(CKV_ERR_FORMAT, "vmm export: bad chunk size");
    if (i < c->n_chunks && (c->chunks[i].bytes != sz || c->chunks[i].off != total))
      return fail(CKV_ERR_FORMAT, "vmm export: chunk %u differs from the one mapped", i);
    total += sz;
  }
  if (total != e->committed) return fail(CKV_ERR_FORMAT, "vmm export: chunks do not add up to the committed size");
  for (uint32_t i = c->n_chunks; i < n; i++) {
    cuda_chunk *k = &c->chunks[i];
    uint64_t off = i ? c->chunks[i - 1].off + c->chunks[i - 1].bytes : 0;
    *k = (cuda_chunk){.fd = -1, .off = off, .bytes = b->u.vmm.chunk_bytes[i]};
    CUresult r = d->MemImportFromShareableHandle(&k->h, (void *)(uintptr_t)e->fds[i],
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      /* Not a CUDA allocation fd (or one of another device): not an arena. */
      k->bytes = 0;
      rc = cu_fail("cuMemImportFromShareableHandle", r);
      return rc == CKV_ERR_DEVICE ? CKV_ERR_FORMAT : rc;
    }
    k->has_h = true;
    if ((rc = vmm_map_chunk(d, c, k, cu)) < 0) { /* leave only whole chunks behind */
      if (k->bytes) (void)d->MemUnmap(c->va + k->off, k->bytes);
      (void)d->MemRelease(k->h);
      *k = (cuda_chunk){.fd = -1};
      return rc;
    }
    c->n_chunks = i + 1;
    /* The mapping keeps the physical memory alive; the handle is not needed. */
    (void)d->MemRelease(k->h);
    k->has_h = false;
  }
  return CKV_OK;
}

static int vmm_import(cuda_ctx *c, const ckv_arena_desc *e, const cuda_blob *b) {
  const ckv_cu_driver *d;
  char buf[200];
  if (ckv_cu_driver_get(&d, buf, sizeof buf) < 0) return fail(CKV_ERR_DEVICE, "%s", buf);
  CUdevice cu;
  size_t gran;
  int rc = vmm_granularity(d, c->device, &cu, &gran);
  if (rc == CKV_OK) rc = vmm_reserve(d, c, e->bytes, gran);
  if (rc == CKV_OK) rc = vmm_import_chunks(c, e, b);
  if (rc < 0) vmm_teardown(c);
  return rc;
}

/* ---- legacy IPC ---- */

static void ipc_put(ipc_entry *x) {
  pthread_mutex_lock(&g_lock);
  if (--x->refs > 0) {
    pthread_mutex_unlock(&g_lock);
    return;
  }
  for (ipc_entry **p = &g_ipc; *p; p = &(*p)->next) {
    if (*p == x) {
      *p = x->next;
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (cudaSetDevice(x->device) == cudaSuccess) {
    if (x->owned)
      (void)cudaFree(x->ptr);
    else
      (void)cudaIpcCloseMemHandle(x->ptr);
  }
  free(x);
}

static int legacy_create(cuda_ctx *c, uint64_t bytes) {
  ipc_entry *x = calloc(1, sizeof *x);
  if (!x) return -ENOMEM;
  cudaError_t e = cudaMalloc(&x->ptr, (size_t)bytes);
  if (e != cudaSuccess) {
    free(x);
    return rt_fail("cudaMalloc", e);
  }
  cudaIpcMemHandle_t h;
  e = cudaMemset(x->ptr, 0, (size_t)bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&h, x->ptr);
  if (e != cudaSuccess) {
    int rc = rt_fail("cudaIpcGetMemHandle", e);
    cudaFree(x->ptr);
    free(x);
    return rc;
  }
  memcpy(x->handle, &h, sizeof x->handle);
  x->owned = true;
  x->device = c->device;
  x->refs = 1;
  pthread_mutex_lock(&g_lock);
  x->next = g_ipc;
  g_ipc = x;
  pthread_mutex_unlock(&g_lock);
  c->ipc = x;
  c->base_offset = 0;
  return CKV_OK;
}

static int legacy_import(cuda_ctx *c, const ckv_arena_desc *e, const cuda_blob *b) {
  if (e->n_fds != 0) return fail(CKV_ERR_FORMAT, "legacy-ipc export with fds");
  uint64_t off = b->u.ipc.base_offset;
  if (off > CKV_ARENA_MAX_BYTES) return fail(CKV_ERR_FORMAT, "legacy-ipc export: bad base offset");
  /* One open per handle per process, and none of our own: share the entry. */
  pthread_mutex_lock(&g_lock);
  for (ipc_entry *x = g_ipc; x; x = x->next) {
    if (memcmp(x->handle, b->u.ipc.handle, sizeof x->handle) == 0) {
      x->refs++;
      pthread_mutex_unlock(&g_lock);
      c->ipc = x;
      c->base_offset = off;
      return CKV_OK;
    }
  }
  pthread_mutex_unlock(&g_lock);
  ipc_entry *x = calloc(1, sizeof *x);
  if (!x) return -ENOMEM;
  cudaIpcMemHandle_t h;
  memcpy(&h, b->u.ipc.handle, sizeof h);
  cudaError_t ce = cudaIpcOpenMemHandle(&x->ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (ce != cudaSuccess) {
    free(x);
    int rc = rt_fail("cudaIpcOpenMemHandle", ce);
    return rc == CKV_ERR_DEVICE ? CKV_ERR_FORMAT : rc; /* a handle that does not open is not an arena */
  }
  /* The allocation must hold the whole arena: a short one would let the
   * header check read past its end. */
  const ckv_cu_driver *d;
  if (ckv_cu_driver_get(&d, NULL, 0) == CKV_OK) {
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = d->MemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)x->ptr);
    if (r != CUDA_SUCCESS || (uint64_t)size < off || (uint64_t)size - off < e->bytes) {
      (void)cudaIpcCloseMemHandle(x->ptr);
      free(x);
      return fail(CKV_ERR_FORMAT, "legacy-ipc: the allocation (%zu bytes) is smaller than the arena", size);
    }
  }
  memcpy(x->handle, b->u.ipc.handle, sizeof x->handle);
  x->owned = false;
  x->device = c->device;
  x->refs = 1;
  /* Another thread may have opened the same handle meanwhile: keep one. */
  pthread_mutex_lock(&g_lock);
  for (ipc_entry *y = g_ipc; y; y = y->next) {
    if (memcmp(y->handle, x->handle, sizeof x->handle) == 0) {
      y->refs++;
      pthread_mutex_unlock(&g_lock);
      (void)cudaIpcCloseMemHandle(x->ptr);
      free(x);
      c->ipc = y;
      c->base_offset = off;
      return CKV_OK;
    }
  }
  x->next = g_ipc;
  g_ipc = x;
  pthread_mutex_unlock(&g_lock);
  c->ipc = x;
  c->base_offset = off;
  return CKV_OK;
}

/* ---- backend slots ---- */

static uint64_t cuda_granularity(void) { return CKV_CUDA_ARENA_GRANULARITY; }

static int cuda_create(uint64_t bytes, uint64_t initial, const char *label, void **ret_ctx, void **ret_base) {
  (void)label;
  if (bytes > SIZE_MAX) return CKV_ERR_LIMIT;
  pthread_mutex_lock(&g_lock);
  int path = g_path, dev = g_device;
  uint8_t u[16];
  memcpy(u, g_uuid, sizeof u);
  pthread_mutex_unlock(&g_lock);
  if (path == CKV_CUDA_PATH_NONE) {
    char why[320];
    if (ckv_arena_cuda_init(0, why, sizeof why) < 0) return fail(CKV_ERR_DEVICE, "%s", why);
    return cuda_create(bytes, initial, label, ret_ctx, ret_base);
  }
  int rc = use_device(dev);
  if (rc < 0) return rc;
  cuda_ctx *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  for (size_t i = 0; i < CKV_ARENA_MAX_FDS; i++) c->chunks[i].fd = -1;
  c->path = path;
  c->device = dev;
  c->owner = true;
  memcpy(c->uuid, u, sizeof u);
  /* VMM backs `initial` and grows chunk by chunk; legacy IPC cannot grow an
   * allocation, so it takes the whole arena at once. */
  rc = path == CKV_CUDA_PATH_VMM ? vmm_create(c, bytes, initial) : legacy_create(c, bytes);
  if (rc < 0) {
    free(c);
    return rc;
  }
  *ret_ctx = c;
  *ret_base = path == CKV_CUDA_PATH_VMM ? (void *)(uintptr_t)c->va : (uint8_t *)c->ipc->ptr + c->base_offset;
  return CKV_OK;
}

static int cuda_import(const ckv_arena_desc *e, void **ret_ctx, void **ret_base) {
  cuda_blob b;
  if (e->handle_len != sizeof b) return fail(CKV_ERR_FORMAT, "CUDA export: handle of %u bytes", e->handle_len);
  memcpy(&b, e->handle, sizeof b);
  if (b.magic != CKV_CUDA_BLOB_MAGIC || b.version != CKV_CUDA_BLOB_VERSION ||
      (b.path != CKV_CUDA_PATH_VMM && b.path != CKV_CUDA_PATH_LEGACY_IPC))
    return fail(CKV_ERR_FORMAT, "CUDA export: bad magic, version or path");
  int dev = 0;
  int rc = device_by_uuid(b.uuid, &dev);
  if (rc < 0) return rc;
  rc = use_device(dev);
  if (rc < 0) return rc;
  cuda_ctx *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  for (size_t i = 0; i < CKV_ARENA_MAX_FDS; i++) c->chunks[i].fd = -1;
  c->path = b.path;
  c->device = dev;
  c->owner = false;
  memcpy(c->uuid, b.uuid, sizeof c->uuid);
  rc = b.path == CKV_CUDA_PATH_VMM ? vmm_import(c, e, &b) : legacy_import(c, e, &b);
  if (rc < 0) {
    free(c);
    return rc;
  }
  *ret_ctx = c;
  *ret_base = b.path == CKV_CUDA_PATH_VMM ? (void *)(uintptr_t)c->va : (uint8_t *)c->ipc->ptr + c->base_offset;
  return CKV_OK;
}

static void cuda_destroy(void *ctx, void *base, uint64_t bytes) {
  (void)base;
  (void)bytes;
  cuda_ctx *c = ctx;
  if (!c) return;
  /* Work queued on the arena must finish before its memory goes away. */
  if (cudaSetDevice(c->device) == cudaSuccess) (void)cudaDeviceSynchronize();
  if (c->path == CKV_CUDA_PATH_VMM)
    vmm_teardown(c);
  else if (c->ipc)
    ipc_put(c->ipc);
  free(c);
}

static int cuda_export(void *ctx, ckv_arena_desc *e) {
  cuda_ctx *c = ctx;
  if (!c->owner) return CKV_ERR_STATE;
  cuda_blob b;
  memset(&b, 0, sizeof b);
  b.magic = CKV_CUDA_BLOB_MAGIC;
  b.version = CKV_CUDA_BLOB_VERSION;
  b.path = (uint16_t)c->path;
  memcpy(b.uuid, c->uuid, sizeof b.uuid);
  e->n_fds = 0;
  if (c->path == CKV_CUDA_PATH_VMM) {
    b.u.vmm.n_chunks = c->n_chunks;
    for (uint32_t i = 0; i < c->n_chunks; i++) {
      b.u.vmm.chunk_bytes[i] = c->chunks[i].bytes;
      e->fds[i] = c->chunks[i].fd;
    }
    e->n_fds = c->n_chunks;
  } else {
    b.u.ipc.base_offset = c->base_offset;
    memcpy(b.u.ipc.handle, c->ipc->handle, sizeof b.u.ipc.handle);
  }
  memcpy(e->handle, &b, sizeof b);
  e->handle_len = sizeof b;
  return CKV_OK;
}

static int cuda_grow(void *ctx, void *base, uint64_t from, uint64_t to) {
  (void)base;
  cuda_ctx *c = ctx;
  if (c->path != CKV_CUDA_PATH_VMM) return CKV_OK; /* legacy: all of it exists already */
  int rc = use_device(c->device);
  if (rc < 0) return rc;
  uint64_t mapped = c->n_chunks ? c->chunks[c->n_chunks - 1].off + c->chunks[c->n_chunks - 1].bytes : 0;
  if (to <= mapped) return CKV_OK; /* a device granule larger than asked covered it already */
  if (from > mapped) return fail(CKV_ERR_INTERNAL, "grow from %llu but %llu mapped", (unsigned long long)from,
                                 (unsigned long long)mapped);
  return vmm_add_chunk(c, mapped, to - mapped);
}

static int cuda_refresh(void *ctx, void *base, uint64_t from, const ckv_arena_desc *e) {
  (void)base;
  (void)from;
  cuda_ctx *c = ctx;
  if (c->path != CKV_CUDA_PATH_VMM) return CKV_OK; /* legacy: mapped whole at import */
  cuda_blob b;
  if (e->handle_len != sizeof b) return fail(CKV_ERR_FORMAT, "CUDA export: handle of %u bytes", e->handle_len);
  memcpy(&b, e->handle, sizeof b);
  if (b.magic != CKV_CUDA_BLOB_MAGIC || b.version != CKV_CUDA_BLOB_VERSION || b.path != CKV_CUDA_PATH_VMM ||
      memcmp(b.uuid, c->uuid, sizeof b.uuid) != 0)
    return fail(CKV_ERR_FORMAT, "CUDA export: another arena's handle");
  int rc = use_device(c->device);
  if (rc < 0) return rc;
  return vmm_import_chunks(c, e, &b);
}

static int cuda_read(void *ctx, void *base, uint64_t off, void *dst, size_t len) {
  cuda_ctx *c = ctx;
  cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, (uint8_t *)base + off, len, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? CKV_OK : rt_fail("cudaMemcpy D2H", e);
}

static int cuda_write(void *ctx, void *base, uint64_t off, const void *src, size_t len) {
  cuda_ctx *c = ctx;
  cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) e = cudaMemcpy((uint8_t *)base + off, src, len, cudaMemcpyHostToDevice);
  /* A pageable copy may return before its DMA landed: other processes read this. */
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  return e == cudaSuccess ? CKV_OK : rt_fail("cudaMemcpy H2D", e);
}

static int cuda_resident(void *ctx, uint64_t *ret_bytes) {
  cuda_ctx *c = ctx;
  if (!c->owner) return CKV_ERR_UNSUPPORTED;
  /* Device memory is committed at create (no lazy pages on the GPU). */
  uint64_t n = 0;
  if (c->path == CKV_CUDA_PATH_VMM) {
    for (uint32_t i = 0; i < c->n_chunks; i++) n += c->chunks[i].bytes;
  } else {
    const ckv_cu_driver *d;
    CUdeviceptr b = 0;
    size_t s = 0;
    if (ckv_cu_driver_get(&d, NULL, 0) == CKV_OK &&
        d->MemGetAddressRange(&b, &s, (CUdeviceptr)(uintptr_t)c->ipc->ptr) == CUDA_SUCCESS)
      n = s;
    else
      return CKV_ERR_UNSUPPORTED;
  }
  *ret_bytes = n;
  return CKV_OK;
}

const ckv_arena_backend ckv_arena_cuda_backend = {
    .name = "cuda",
    .granularity = cuda_granularity,
    .create = cuda_create,
    .import = cuda_import,
    .destroy = cuda_destroy,
    .export_handles = cuda_export,
    .grow = cuda_grow,
    .refresh = cuda_refresh,
    .discard = NULL, /* device chunks stay mapped while the arena lives: nothing moves, nothing shrinks */
    .read = cuda_read,
    .write = cuda_write,
    .resident = cuda_resident,
};
#endif
