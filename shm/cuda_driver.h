/* shm/cuda_driver.h - the few CUDA driver-API functions the CUDA arena needs,
 * fetched at run time.
 *
 * CommitKV never links libcuda (DESIGN.md §10): a binary that does will not
 * even start on a machine without the NVIDIA driver.  The static CUDA runtime
 * (cudart_static) hands out driver entry points through
 * cudaGetDriverEntryPointByVersion(), which fails cleanly (error 35, "driver
 * version is insufficient") when there is no driver.  This module asks for
 * each function once, for the ABI of CUDA 12.0 (every function here has kept
 * that signature since 10.2/11.x), and keeps the pointers in one table.
 *
 * Compiled only in the CUDA build (library ckv_shm_cuda). */
#ifndef CKV_SHM_CUDA_DRIVER_H
#define CKV_SHM_CUDA_DRIVER_H

#include <cuda.h>
#include <stddef.h>

/* Driver entry points; every member is non-NULL once ckv_cu_driver_get()
 * succeeded, except the ones marked optional. */
typedef struct ckv_cu_driver {
  CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
  CUresult (*DeviceGetAttribute)(int *value, CUdevice_attribute attr, CUdevice dev);
  CUresult (*MemGetAllocationGranularity)(size_t *gran, const CUmemAllocationProp *prop,
                                          CUmemAllocationGranularity_flags option);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                        unsigned long long flags);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle h);
  CUresult (*MemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle h,
                                         CUmemAllocationHandleType type, unsigned long long flags);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *h, void *shareable,
                                           CUmemAllocationHandleType type);
  CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                unsigned long long flags);
  CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t size);
  CUresult (*MemMap)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                     unsigned long long flags);
  CUresult (*MemUnmap)(CUdeviceptr ptr, size_t size);
  CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
  CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
  /* Optional: error text for logs (NULL: print the number only). */
  CUresult (*GetErrorString)(CUresult err, const char **str);
} ckv_cu_driver;

/* The table, loaded on the first call (thread-safe; later calls are cheap).
 * On failure *ret is left alone and `reason` (may be NULL) says which symbol
 * or which runtime error was the cause.
 * Returns CKV_OK or CKV_ERR_DEVICE (no driver, or a driver too old for one of
 * the functions). */
int ckv_cu_driver_get(const ckv_cu_driver **ret, char *reason, size_t len);

/* "CUDA_ERROR_OUT_OF_MEMORY (2)"-like text for a driver result, written into
 * buf; returns buf. */
const char *ckv_cu_strerror(CUresult r, char *buf, size_t len);

#endif
