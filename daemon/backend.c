/* daemon/backend.c - the arena backend decision (see daemon/backend.h).
 * The CUDA half exists only when ckv_shm_cuda is linked (CKV_HAVE_CUDA_ARENA). */
#include "daemon/backend.h"

#include <stdio.h>

#include "commitkv/status.h"
#include "daemon/config.h"
#include "shm/arena.h"
#ifdef CKV_HAVE_CUDA_ARENA
#include "shm/arena_cuda.h"
#endif

static void say(char *buf, size_t len, const char *text) {
  if (buf && len) snprintf(buf, len, "%s", text);
}

static int pick_host(const ckv_arena_backend **ret, char *name_out, size_t name_len, char *reason, size_t reason_len,
                     const char *why) {
  *ret = &ckv_arena_host_backend;
  say(name_out, name_len, ckv_arena_host_backend.name);
  say(reason, reason_len, why);
  return CKV_OK;
}

#ifdef CKV_HAVE_CUDA_ARENA
/* Probes, initialises and registers the CUDA arena; `why` gets the outcome. */
static int try_cuda(uint32_t device, char *why, size_t len) {
  char probe[256], path[320];
  if (ckv_cuda_probe(device, NULL, probe, sizeof probe) < 0) {
    snprintf(why, len, "%s", probe);
    return CKV_ERR_DEVICE;
  }
  if (ckv_arena_cuda_init(device, path, sizeof path) < 0) {
    snprintf(why, len, "%s: %s", probe, path);
    return CKV_ERR_DEVICE;
  }
  int r = ckv_arena_backend_register(&ckv_arena_cuda_backend);
  if (r < 0 && r != CKV_ERR_EXISTS) {
    snprintf(why, len, "cannot register the CUDA arena backend: %s", ckv_strerror(r));
    return r;
  }
  snprintf(why, len, "%s; arenas: %s", probe, path);
  return CKV_OK;
}
#endif

int ckv_backend_select(int kind, uint32_t device, const ckv_arena_backend **ret, char *name_out, size_t name_len,
                       char *reason, size_t reason_len) {
  if (!ret) return CKV_ERR_INVALID;
  char why[640], msg[720];
  switch (kind) {
    case CKV_BACKEND_HOST:
      return pick_host(ret, name_out, name_len, reason, reason_len, "host backend requested: memfd arenas");
    case CKV_BACKEND_CUDA:
    case CKV_BACKEND_AUTO: break;
    default: say(reason, reason_len, "unknown backend kind"); return CKV_ERR_INVALID;
  }
#ifdef CKV_HAVE_CUDA_ARENA
  int r = try_cuda(device, why, sizeof why);
  if (r == CKV_OK) {
    *ret = &ckv_arena_cuda_backend;
    say(name_out, name_len, ckv_arena_cuda_backend.name);
    snprintf(msg, sizeof msg, "%s%s", kind == CKV_BACKEND_AUTO ? "auto: " : "", why);
    say(reason, reason_len, msg);
    return CKV_OK;
  }
  if (kind == CKV_BACKEND_CUDA) {
    snprintf(msg, sizeof msg, "backend cuda: no usable CUDA device %u: %s", device, why);
    say(reason, reason_len, msg);
    return r;
  }
  snprintf(msg, sizeof msg, "auto: no usable CUDA device %u, using host memfd arenas: %s", device, why);
  return pick_host(ret, name_out, name_len, reason, reason_len, msg);
#else
  (void)device;
  (void)why;
  if (kind == CKV_BACKEND_CUDA) {
    say(reason, reason_len, "backend cuda: this commitkvd was built without CUDA (CKV_WITH_CUDA=OFF or no nvcc)");
    return CKV_ERR_UNSUPPORTED;
  }
  snprintf(msg, sizeof msg, "auto: built without CUDA, using host memfd arenas");
  return pick_host(ret, name_out, name_len, reason, reason_len, msg);
#endif
}
