/* shm/arena_cuda.h - the CUDA arena backend: KV memory in GPU memory, shared
 * with the workers of one tenant (library ckv_shm_cuda, CUDA builds only;
 * consumers see CKV_HAVE_CUDA_ARENA defined when it is linked).
 *
 * Two ways to share device memory, chosen once per process per device by
 * ckv_arena_cuda_init() (the choice and its reason are kept for logs and
 * `commitkvctl status`):
 *
 *  - "vmm" (preferred): the CUDA virtual-memory API.  Physical memory from
 *    cuMemCreate with POSIX file-descriptor handles, exported as fds that
 *    travel like host memfds (SCM_RIGHTS, ckv_arena_desc.fds).  The importer
 *    imports each fd (cuMemImportFromShareableHandle), reserves one VA range,
 *    maps every chunk at its offset and sets access once.  The arena's whole
 *    address range is reserved at create, but only a prefix is backed: the
 *    first chunk holds about 1/128 of it and each ckv_arena_grow() maps one
 *    more chunk doubling the prefix (at most CKV_ARENA_MAX_FDS chunks), so GPU
 *    memory is taken as sessions need it and nothing mapped ever moves.  An
 *    importer reserves the same range and maps new chunks when it refreshes
 *    with a newer export (ckv_arena_refresh).  The fds are the capability:
 *    a process without them cannot map
 *    the memory, and they are sent only to the arena's tenant.
 *
 *  - "legacy-ipc" (fallback where VMM or POSIX-fd handles are unsupported):
 *    cudaMalloc + cudaIpcGetMemHandle; the 64-byte handle travels in the
 *    handle blob, the importer calls cudaIpcOpenMemHandle once per arena per
 *    process (opens are cached and reference-counted; importing an arena in
 *    the process that created it returns the owner's own pointer, since CUDA
 *    refuses that open).  The handle is a bearer token: it must reach only
 *    the arena's tenant (the daemon sends it in that tenant's AttachReply).
 *
 * In both cases the export's handle blob starts with a small header (magic,
 * version, path, the exporting device's UUID): an importer on another device
 * or another host is refused with CKV_ERR_DEVICE instead of mapping garbage,
 * and a desc whose generation does not match the arena header is refused
 * with CKV_ERR_FORMAT by the generic import.
 *
 * The arena header lives in device memory: the backend's read/write slots
 * copy it with cudaMemcpy.  ckv_arena_base() of a CUDA arena is a device
 * pointer: only GPU code (or cudaMemcpy) may touch it.
 *
 * Nothing here links libcuda; without a driver every call fails with
 * CKV_ERR_DEVICE and a reason, never a crash.  CUDA is initialised lazily by
 * the first call (never at load time), so a process may fork before it and
 * use CUDA in the child.  Granularity is 2 MiB for every arena (the VMM
 * granularity of current NVIDIA GPUs; a device with a coarser one gets its
 * physical chunks rounded up internally). */
#ifndef CKV_SHM_ARENA_CUDA_H
#define CKV_SHM_ARENA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "shm/arena.h"

/* Size of a UUID string "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" with its NUL. */
#define CKV_CUDA_UUID_STR 37u
/* Granularity of CUDA arenas (ckv_arena_backend.granularity). */
#define CKV_CUDA_ARENA_GRANULARITY (UINT64_C(2) << 20)

/* The backend table ("cuda").  Register it with ckv_arena_backend_register()
 * in every process that creates or imports CUDA arenas. */
extern const ckv_arena_backend ckv_arena_cuda_backend;

/* Sharing paths (ckv_arena_cuda_init). */
enum { CKV_CUDA_PATH_NONE = 0, CKV_CUDA_PATH_VMM = 1, CKV_CUDA_PATH_LEGACY_IPC = 2 };

/* Probes CUDA device `device` (a runtime ordinal, after CUDA_VISIBLE_DEVICES):
 * a driver answers, the device exists, is not in prohibited compute mode and
 * a context can be created on it.  On success writes the device's UUID to
 * uuid_out (CKV_CUDA_UUID_STR bytes; may be NULL) and a one-line description
 * ("NVIDIA H200, sm_90, 140.4 GiB, uuid ...") to reason.  On failure writes
 * why (e.g. "no CUDA driver: cudaGetDeviceCount returned 35 (CUDA driver
 * version is insufficient for CUDA runtime version)") to reason.  Never
 * aborts.  reason may be NULL.
 * Returns CKV_OK or CKV_ERR_DEVICE. */
int ckv_cuda_probe(uint32_t device, char *uuid_out, char *reason, size_t len);

/* Chooses the device that this process creates arenas on and the sharing
 * path: VMM when the driver, the device (VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
 * HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) and a trial allocation and
 * export allow it, legacy IPC otherwise.  The environment variable
 * CKV_CUDA_ARENA_PATH=vmm|legacy forces a path (for tests; vmm forced on a
 * device without it fails).  Writes "vmm: ..." / "legacy-ipc: <why VMM is
 * unavailable>" to `why` (may be NULL).  Call it at start-up; calling it
 * again re-decides (arenas already created keep their path).  Without it,
 * the first create initialises device 0 with the default choice.
 * Returns CKV_OK or CKV_ERR_DEVICE (why says why). */
int ckv_arena_cuda_init(uint32_t device, char *why, size_t len);

/* The path chosen by the last successful ckv_arena_cuda_init()
 * (CKV_CUDA_PATH_NONE before) and its reason (static storage, "" before). */
int ckv_arena_cuda_path(void);
const char *ckv_arena_cuda_path_reason(void);

/* Why the last failing call of this backend in this thread failed (the
 * CUDA call and its error), for logs and test messages: the generic arena
 * API only carries a code.  Thread-local static storage, never NULL. */
const char *ckv_arena_cuda_last_error(void);

/* The exporting device's UUID carried by a CUDA export (for
 * ArenaInfo.device_uuid): writes CKV_CUDA_UUID_STR bytes to ret.
 * Returns CKV_OK or CKV_ERR_FORMAT (not a CUDA export). */
int ckv_arena_cuda_desc_uuid(const ckv_arena_desc *e, char *ret);

#endif
