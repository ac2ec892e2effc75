/* daemon/backend.h - which arena backend commitkvd runs on, and why.
 *
 * One decision at start-up, from [daemon] backend and device:
 *   host -> the memfd backend;
 *   cuda -> the CUDA backend on `device`, or a clean failure that says why
 *           (no driver, no such device, device unusable, or a build without
 *           CUDA);
 *   auto -> CUDA when ckv_cuda_probe() finds a usable device, host otherwise.
 * The reason is one line for the log and for `commitkvctl status` (the
 * server's backend_reason): the chosen device and sharing path (VMM or
 * legacy IPC, with the cause of a fallback), or why CUDA was not used. */
#ifndef CKV_DAEMON_BACKEND_H
#define CKV_DAEMON_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_arena_backend ckv_arena_backend;

/* Selects the backend for `kind` (a ckv_backend_kind of daemon/config.h)
 * and CUDA device ordinal `device`.  When CUDA is chosen, initialises the
 * CUDA arena on that device (ckv_arena_cuda_init) and registers its backend
 * with ckv_arena_backend_register (idempotent), so ckv_arena_backend_find()
 * and imports know "cuda" too.
 * On success writes the backend to *ret, its name ("host" or "cuda") to
 * name_out and why to reason.  On failure writes why to reason and leaves
 * *ret and name_out alone.  name_out and reason may be NULL (with length 0).
 * Returns CKV_OK; CKV_ERR_INVALID (NULL ret, unknown kind); CKV_ERR_DEVICE
 * (cuda requested, no usable device); CKV_ERR_UNSUPPORTED (cuda requested
 * in a build without CUDA); or a registry error (CKV_ERR_LIMIT). */
int ckv_backend_select(int kind, uint32_t device, const ckv_arena_backend **ret, char *name_out, size_t name_len,
                       char *reason, size_t reason_len);

#endif
