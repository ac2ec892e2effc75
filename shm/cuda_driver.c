/* shm/cuda_driver.c - driver-API entry points through the static runtime
 * (see shm/cuda_driver.h).  No libcuda at link time, no dlopen of our own:
 * cudart_static already knows how to find the driver, and reports its absence
 * as an error code instead of a failed program start. */
#ifdef CKV_SHM_CUDA_BUILD
#include "shm/cuda_driver.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"

/* ABI version asked of cudaGetDriverEntryPointByVersion. */
#define CKV_CU_ABI 12000

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static ckv_cu_driver table;
static int load_status = CKV_ERR_DEVICE;
static char load_reason[256] = "driver entry points not loaded";

static int fetch(const char *sym, void **fn, int optional) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
  cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, CKV_CU_ABI, cudaEnableDefault, &q);
  if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && *fn) return CKV_OK;
  *fn = NULL;
  if (optional) return CKV_OK;
  if (e != cudaSuccess)
    snprintf(load_reason, sizeof load_reason, "cudaGetDriverEntryPointByVersion(%s) returned %d (%s)", sym, (int)e,
             cudaGetErrorString(e));
  else
    snprintf(load_reason, sizeof load_reason, "the CUDA driver has no %s for CUDA %d.%d (query result %d)", sym,
             CKV_CU_ABI / 1000, CKV_CU_ABI % 1000 / 10, (int)q);
  return CKV_ERR_DEVICE;
}

static void load(void) {
  ckv_cu_driver t;
  memset(&t, 0, sizeof t);
  /* One row per function: name and slot, so the list cannot drift from the struct. */
  struct {
    const char *sym;
    void **slot;
    int optional;
  } rows[] = {
      {"cuDeviceGet", (void **)&t.DeviceGet, 0},
      {"cuDeviceGetAttribute", (void **)&t.DeviceGetAttribute, 0},
      {"cuMemGetAllocationGranularity", (void **)&t.MemGetAllocationGranularity, 0},
      {"cuMemCreate", (void **)&t.MemCreate, 0},
      {"cuMemRelease", (void **)&t.MemRelease, 0},
      {"cuMemExportToShareableHandle", (void **)&t.MemExportToShareableHandle, 0},
      {"cuMemImportFromShareableHandle", (void **)&t.MemImportFromShareableHandle, 0},
      {"cuMemAddressReserve", (void **)&t.MemAddressReserve, 0},
      {"cuMemAddressFree", (void **)&t.MemAddressFree, 0},
      {"cuMemMap", (void **)&t.MemMap, 0},
      {"cuMemUnmap", (void **)&t.MemUnmap, 0},
      {"cuMemSetAccess", (void **)&t.MemSetAccess, 0},
      {"cuMemGetAddressRange", (void **)&t.MemGetAddressRange, 0},
      {"cuGetErrorString", (void **)&t.GetErrorString, 1},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    if (fetch(rows[i].sym, rows[i].slot, rows[i].optional) < 0) return;
  table = t;
  load_status = CKV_OK;
  load_reason[0] = 0;
}

int ckv_cu_driver_get(const ckv_cu_driver **ret, char *reason, size_t len) {
  pthread_once(&load_once, load);
  if (load_status < 0) {
    if (reason && len) snprintf(reason, len, "%s", load_reason);
    return load_status;
  }
  *ret = &table;
  return CKV_OK;
}

const char *ckv_cu_strerror(CUresult r, char *buf, size_t len) {
  const char *s = NULL;
  if (load_status == CKV_OK && table.GetErrorString && table.GetErrorString(r, &s) != CUDA_SUCCESS) s = NULL;
  snprintf(buf, len, "CUresult %d%s%s%s", (int)r, s ? " (" : "", s ? s : "", s ? ")" : "");
  return buf;
}
#endif
