/* client.c - attach, connect, request/reply, heartbeat (see commitkv.h).
 *
 * Attach: a unix stream socket to the daemon's attach socket; the kernel
 * proves our uid; the reply brings the tenant's arena fds (SCM_RIGHTS) and a
 * random key that becomes our ZeroMQ routing id.  We keep that socket open:
 * when this process dies the daemon sees EOF and reclaims our lease at once.
 *
 * CUDA arenas (CUDA builds only): the export carries VMM chunk fds and/or a
 * handle blob; before importing, the arena's device (ArenaInfo.device_uuid,
 * and the UUID inside the blob) must be the device this process computes
 * on, or the attach is refused with CKV_ERR_DEVICE.  Views and draft slots
 * then hold device pointers.
 *
 * Requests: one DEALER, one request in flight, replies matched by
 * request_id (a late reply to a timed-out request is discarded).  The boot
 * token in every reply detects a daemon restart. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "client/rpc.h"
#include "shm/arena.h"
#include "shm/fdpass.h"
#ifdef CKV_HAVE_CUDA_ARENA
#include <cuda_runtime_api.h>

#include "shm/arena_cuda.h"
#endif

#define DEFAULT_TIMEOUT_MS 5000
#define ATTACH_MAX_FRAME 4096
#define ATTACH_MAX_FDS (CKV_ARENA_MAX_FDS + 1) /* the arena's and the prefix index's */
#define HB_BACKOFF_MAX_MS 4000u /* the heartbeat's reconnect attempts back off to this */

static void default_socket(char *buf, size_t len) {
  const char *env = getenv("CKV_SOCKET");
  const char *rt = getenv("RUNTIME_DIRECTORY");
  if (env && *env)
    snprintf(buf, len, "%s", env);
  else if (rt && *rt)
    snprintf(buf, len, "ipc://%s/commitkvd.sock", rt);
  else
    snprintf(buf, len, "ipc:///run/commitkv/commitkvd.sock");
}

/* commitkvd.attach beside an ipc:// socket; the standard path otherwise. */
static void default_attach(const char *socket, char *buf, size_t len) {
  const char *env = getenv("CKV_ATTACH_SOCKET");
  if (env && *env) {
    snprintf(buf, len, "%s", env);
    return;
  }
  if (strncmp(socket, "ipc://", 6) == 0) {
    const char *path = socket + 6, *slash = strrchr(path, '/');
    if (slash) {
      snprintf(buf, len, "%.*s/commitkvd.attach", (int)(slash - path), path);
      return;
    }
  }
  snprintf(buf, len, "/run/commitkv/commitkvd.attach");
}

#ifdef CKV_HAVE_CUDA_ARENA
/* The backend registry is start-up-only state: register once per process,
 * whichever client (or thread) meets a CUDA arena first. */
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;
static int g_cuda_registered;

static void register_cuda_backend(void) {
  int r = ckv_arena_backend_register(&ckv_arena_cuda_backend);
  g_cuda_registered = r == CKV_ERR_EXISTS ? CKV_OK : r; /* the application registered it itself */
}

/* "GPU-xxxxxxxx-..." (nvidia-smi's spelling) and "xxxxxxxx-..." name the same device. */
static const char *bare_uuid(const char *u) { return strncasecmp(u, "GPU-", 4) == 0 ? u + 4 : u; }

/* A CUDA arena must live on the device this process computes on: a worker on
 * another GPU (or another host) would hand device pointers of one GPU to
 * kernels running on another.  The device is the calling thread's current one
 * at the first CUDA attach (cudaSetDevice before ckv_client_connect), and the
 * same ordinal for every later re-attach, whichever thread reconnects. */
static int check_cuda_device(ckv_client *c, const Commitkv__V1__ArenaInfo *a, const ckv_arena_desc *d) {
  char exported[CKV_CUDA_UUID_STR], mine[CKV_CUDA_UUID_STR], why[300];
  if (ckv_arena_cuda_desc_uuid(d, exported) != CKV_OK) {
    snprintf(c->last_error, sizeof(c->last_error), "arena %u: kind cuda but no CUDA export handle", a->arena_id);
    return CKV_ERR_FORMAT;
  }
  const char *want = exported;
  if (a->device_uuid && *a->device_uuid) {
    if (strcasecmp(bare_uuid(a->device_uuid), exported) != 0) {
      snprintf(c->last_error, sizeof(c->last_error),
               "arena %u: the daemon announces CUDA device %.60s but the export handle names %s", a->arena_id,
               a->device_uuid, exported);
      return CKV_ERR_DEVICE;
    }
    want = bare_uuid(a->device_uuid);
  }
  int dev = c->cuda_device;
  if (dev < 0) {
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
      snprintf(c->last_error, sizeof(c->last_error),
               "arena %u lives on CUDA device %.40s, but this process has no CUDA device: cudaGetDevice: %s",
               a->arena_id, want, cudaGetErrorString(e));
      (void)cudaGetLastError();
      return CKV_ERR_DEVICE;
    }
  }
  if (ckv_cuda_probe((uint32_t)dev, mine, why, sizeof(why)) != CKV_OK) {
    snprintf(c->last_error, sizeof(c->last_error),
             "arena %u lives on CUDA device %.40s, but this process cannot use a CUDA device: %s", a->arena_id, want,
             why);
    return CKV_ERR_DEVICE;
  }
  if (strcasecmp(mine, want) != 0) {
    snprintf(c->last_error, sizeof(c->last_error),
             "arena %u lives on CUDA device %.40s, but this process computes on CUDA device %d (%s): select the "
             "daemon's device (cudaSetDevice or CUDA_VISIBLE_DEVICES) before ckv_client_connect",
             a->arena_id, want, dev, mine);
    return CKV_ERR_DEVICE;
  }
  c->cuda_device = dev;
  return CKV_OK;
}
#endif

/* Fills d's backend part (fds, handle) from an ArenaInfo and checks what can
 * be checked before mapping.  fds[fd_index...] are the arena's fds. */
static int arena_desc(ckv_client *c, const Commitkv__V1__ArenaInfo *a, const int *fds, size_t n_fds,
                      ckv_arena_desc *d) {
  memset(d, 0, sizeof(*d));
  snprintf(d->kind, sizeof(d->kind), "%s", a->kind ? a->kind : "");
  d->bytes = a->bytes;
  d->generation = a->generation;
  d->committed = a->committed;
  if (a->handle.len > sizeof(d->handle)) return CKV_ERR_PROTO;
  if (a->handle.len) memcpy(d->handle, a->handle.data, a->handle.len);
  d->handle_len = (uint32_t)a->handle.len;
  if (strcmp(d->kind, "host") == 0) {
    if (a->fd_index >= n_fds) return CKV_ERR_PROTO;
    d->fds[0] = fds[a->fd_index];
    d->n_fds = 1;
    return CKV_OK;
  }
  if (strcmp(d->kind, "cuda") == 0) {
#ifdef CKV_HAVE_CUDA_ARENA
    /* VMM: one fd per physical chunk, from fd_index on (legacy IPC: none). */
    if (a->fd_index > n_fds || n_fds - a->fd_index > CKV_ARENA_MAX_FDS) return CKV_ERR_PROTO;
    d->n_fds = (uint32_t)(n_fds - a->fd_index);
    for (uint32_t i = 0; i < d->n_fds; i++) d->fds[i] = fds[a->fd_index + i];
    pthread_once(&g_cuda_once, register_cuda_backend);
    if (g_cuda_registered != CKV_OK) {
      snprintf(c->last_error, sizeof(c->last_error), "cannot register the CUDA arena backend: %s",
               ckv_strerror(g_cuda_registered));
      return g_cuda_registered;
    }
    return check_cuda_device(c, a, d);
#else
    snprintf(c->last_error, sizeof(c->last_error),
             "arena %u is CUDA device memory, but this libcommitkv was built without CUDA", a->arena_id);
    return CKV_ERR_UNSUPPORTED;
#endif
  }
  return CKV_OK; /* an unknown kind: ckv_arena_import says it is unsupported */
}

/* One AttachRequest / AttachReply exchange on c->attach_fd.  On CKV_OK *ret_rep
 * is a reply whose code is 0 (free it with
 * commitkv__v1__attach_reply__free_unpacked) and fds[0..*ret_n_fds) are the
 * descriptors that came with it, which the caller closes.  On failure
 * nothing is left open and c->last_error says why when the daemon did. */
static int attach_exchange(ckv_client *c, const Commitkv__V1__AttachRequest *req, int fds[ATTACH_MAX_FDS],
                           size_t *ret_n_fds, Commitkv__V1__AttachReply **ret_rep) {
  uint8_t buf[ATTACH_MAX_FRAME];
  size_t len = commitkv__v1__attach_request__get_packed_size(req);
  commitkv__v1__attach_request__pack(req, buf);
  int r = ckv_frame_send(c->attach_fd, buf, len, NULL, 0);
  if (r < 0) return r;
  size_t n_fds = 0;
  r = ckv_frame_recv(c->attach_fd, buf, sizeof(buf), &len, fds, ATTACH_MAX_FDS, &n_fds);
  if (r < 0) return r == -EAGAIN || r == -EWOULDBLOCK ? CKV_ERR_TIMEOUT : r;
  Commitkv__V1__AttachReply *rep = commitkv__v1__attach_reply__unpack(NULL, len, buf);
  if (!rep) {
    r = CKV_ERR_PROTO;
  } else if (rep->code != 0) {
    r = rep->code;
    snprintf(c->last_error, sizeof(c->last_error), "%s", rep->message && *rep->message ? rep->message : ckv_strerror(r));
  } else if (rep->boot_token.len != sizeof(c->boot_token)) {
    r = CKV_ERR_PROTO;
  }
  if (r < 0) {
    for (size_t i = 0; i < n_fds; i++) close(fds[i]);
    if (rep) commitkv__v1__attach_reply__free_unpacked(rep, NULL);
    return r;
  }
  *ret_n_fds = n_fds;
  *ret_rep = rep;
  return CKV_OK;
}

/* c->last_error for an arena that could not be mapped: the generic code and,
 * for CUDA, the CUDA call that failed. */
static void arena_error(ckv_client *c, const char *what, uint32_t arena_id, const char *kind, int r) {
  const char *detail = "";
#ifdef CKV_HAVE_CUDA_ARENA
  if (strcmp(kind, "cuda") == 0) detail = ckv_arena_cuda_last_error();
#endif
  snprintf(c->last_error, sizeof(c->last_error), "%s %u (%s): %s%s%.300s", what, arena_id, kind, ckv_strerror(r),
           *detail ? ": " : "", detail);
}

/* Maps the tenant's prefix index (shm/prefix_index.h).  Optional: an index
 * that cannot be mapped only sends lookups to the daemon. */
static void set_prefix_index(ckv_client *c, ckv_pindex_view *v) {
  pthread_rwlock_wrlock(&c->pindex_lock);
  ckv_pindex_unmap(c->pindex);
  c->pindex = v;
  pthread_rwlock_unlock(&c->pindex_lock);
}

static void map_prefix_index(ckv_client *c, int fd) {
  ckv_pindex_view *v = NULL;
  set_prefix_index(c, ckv_pindex_map(fd, &v) < 0 ? NULL : v);
}

static int attach(ckv_client *c, const char *path, const char *name, bool want_arenas) {
  int r = ckv_unix_connect(path, &c->attach_fd);
  if (r < 0) {
    snprintf(c->last_error, sizeof(c->last_error), "cannot connect to %.300s: %s", path, ckv_strerror(r));
    return r;
  }
  struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
  setsockopt(c->attach_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(c->attach_fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = CKV_CLIENT_VERSION;
  req.client_name = (char *)name;
  req.want_arenas = want_arenas;
  req.want_prefix_index = want_arenas;
  int fds[ATTACH_MAX_FDS];
  size_t n_fds = 0;
  Commitkv__V1__AttachReply *rep = NULL;
  c->last_error[0] = 0;
  r = attach_exchange(c, &req, fds, &n_fds, &rep);
  if (r < 0) {
    if (!c->last_error[0])
      snprintf(c->last_error, sizeof(c->last_error), "attach: no reply from %.300s: %s", path, ckv_strerror(r));
    return r;
  }
  if (rep->attach_key.len != sizeof(c->key)) {
    r = CKV_ERR_PROTO;
    goto out;
  }
  memcpy(c->key, rep->attach_key.data, sizeof(c->key));
  memcpy(c->boot_token, rep->boot_token.data, sizeof(c->boot_token));
  snprintf(c->tenant, sizeof(c->tenant), "%s", rep->tenant ? rep->tenant : "");
  c->admin = rep->admin;
  c->arena_kept = false;
  /* The prefix index's fd comes after the arena's (which run to it). */
  size_t n_arena_fds = n_fds;
  if (rep->prefix_index) {
    if (rep->prefix_index->fd_index >= n_fds) {
      r = CKV_ERR_PROTO;
      goto out;
    }
    n_arena_fds = rep->prefix_index->fd_index;
    map_prefix_index(c, fds[n_arena_fds]);
  }
  for (size_t i = 0; i < rep->n_arenas && i < 1; i++) {
    const Commitkv__V1__ArenaInfo *a = rep->arenas[i];
    ckv_arena_desc d;
    r = arena_desc(c, a, fds, n_arena_fds, &d);
    if (r < 0) goto out;
    /* A warm restart (the daemon kept its arenas in systemd's fd store)
     * hands back the very arena this process still maps: keep that mapping,
     * so every pointer the worker holds into it stays valid. */
    ckv_arena *prev = c->previous_arena;
    if (prev && strcmp(ckv_arena_kind(prev), d.kind) == 0 && ckv_arena_generation(prev) == d.generation &&
        ckv_arena_size(prev) == d.bytes && ckv_arena_is_live(prev)) {
      c->arena = prev;
      c->previous_arena = NULL;
      c->arena_id = a->arena_id;
      c->arena_kept = true;
      continue;
    }
    r = ckv_arena_import(&d, &c->arena);
    if (r < 0) {
      arena_error(c, "cannot map arena", a->arena_id, d.kind, r);
      goto out;
    }
    c->arena_id = a->arena_id;
  }
  r = CKV_OK;
out:
  for (size_t i = 0; i < n_fds; i++) close(fds[i]); /* a host mapping survives its fd */
  commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  return r;
}

static void *heartbeat_main(void *arg) {
  ckv_client *c = arg;
  unsigned failures = 0; /* reconnects in a row that found no daemon: back off */
  pthread_mutex_lock(&c->hb_lock);
  while (!c->hb_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* heartbeat, then twice as long after each failed reconnect, at most
     * HB_BACKOFF_MAX_MS (or the heartbeat, when longer) */
    uint64_t wait_ms = c->heartbeat_ms, cap = c->heartbeat_ms > HB_BACKOFF_MAX_MS ? c->heartbeat_ms : HB_BACKOFF_MAX_MS;
    for (unsigned i = 0; i < failures && wait_ms < cap; i++) wait_ms *= 2;
    if (wait_ms > cap) wait_ms = cap;
    uint64_t ns = (uint64_t)ts.tv_nsec + wait_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&c->hb_cond, &c->hb_lock, &ts);
    if (c->hb_stop) break;
    pthread_mutex_unlock(&c->hb_lock);
    /* A restarted daemon knows nothing of us: re-attach without the worker's help. */
    if (ckv_client_heartbeat(c) == CKV_ERR_DAEMON_RESTARTED)
      failures = ckv_client_reconnect(c) == CKV_OK ? 0 : failures + 1;
    else
      failures = 0;
    pthread_mutex_lock(&c->hb_lock);
  }
  pthread_mutex_unlock(&c->hb_lock);
  return NULL;
}

/* Attach, map, connect the DEALER and say Hello: everything a (re)connection does. */
static int establish(ckv_client *c) {
  int r = attach(c, c->attach_path, c->name, c->want_arenas);
  if (r < 0) return r;
  void *dealer = zmq_socket(c->zctx, ZMQ_DEALER);
  if (!dealer) return -ENOMEM;
  int zero = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof(zero));
  zmq_setsockopt(dealer, ZMQ_ROUTING_ID, c->key, sizeof(c->key));
  if (zmq_connect(dealer, c->socket_ep) != 0) {
    r = -zmq_errno();
    snprintf(c->last_error, sizeof(c->last_error), "cannot connect %.300s: %s", c->socket_ep,
             zmq_strerror(zmq_errno()));
    zmq_close(dealer);
    return r;
  }
  pthread_mutex_lock(&c->lock);
  c->dealer = dealer;
  __atomic_store_n(&c->restarted, false, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&c->lock);
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Hello hello = COMMITKV__V1__HELLO__INIT;
  hello.max_version = CKV_CLIENT_VERSION;
  hello.min_version = CKV_CLIENT_VERSION;
  hello.client_name = c->name;
  req.body_case = COMMITKV__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  Commitkv__V1__Response *rep;
  r = ckv_rpc(c, &req, &rep);
  if (r < 0) return r;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_WELCOME) {
    ckv_rpc_free(rep);
    return CKV_ERR_PROTO;
  }
  c->lease_ms = rep->welcome->lease_ms;
  c->heartbeat_ms = rep->welcome->heartbeat_ms ? rep->welcome->heartbeat_ms : 1000;
  __atomic_store_n(&c->max_tokens, rep->welcome->max_tokens_per_session, __ATOMIC_RELAXED);
  ckv_rpc_free(rep);
  return CKV_OK;
}

/* Drop the connection and every mapping of the old daemon's memory. */
static void teardown(ckv_client *c) {
  pthread_mutex_lock(&c->lock);
  if (c->dealer) zmq_close(c->dealer);
  c->dealer = NULL;
  if (c->attach_fd >= 0) close(c->attach_fd);
  c->attach_fd = -1;
  /* A host mapping of the dead daemon's memfd stays one reconnect longer:
   * unmapping it under a reader would crash the reader.  Device memory goes
   * at once (a dead exporter's memory must not be kept alive: DESIGN.md §10).
   * After a failed reconnect there is no current arena: the mapping kept
   * from before stays, so that a worker retrying while systemd restarts the
   * daemon still gets it back (ckv_client_arena_kept) at the attempt that
   * succeeds; dropping it there made the kept mapping stale at the second try
   * (commitkv-bench failover: arena_remapped at every kill). */
  if (c->arena) {
    ckv_arena_free(c->previous_arena);
    c->previous_arena = NULL;
    if (strcmp(ckv_arena_kind(c->arena), "cuda") != 0)
      c->previous_arena = c->arena;
    else
      ckv_arena_free(c->arena);
    c->arena = NULL;
  }
  /* The dead daemon's index says nothing about the next one's blocks. */
  set_prefix_index(c, NULL);
  __atomic_store_n(&c->restarted, true, __ATOMIC_RELEASE);
  /* Every session handle of the old daemon is stale from here on, in the same
   * step as its memory goes: a session opened on the next connection (by
   * another thread, as soon as establish clears `restarted`) never is. */
  c->generation++;
  pthread_mutex_unlock(&c->lock);
}

/* Why the last ckv_client_connect of this thread failed (the client is gone by then). */
static _Thread_local char g_connect_error[512];

const char *ckv_client_connect_error(void) { return g_connect_error; }

int ckv_client_connect(const ckv_client_options *opt, ckv_client **ret) {
  ckv_client_options o = opt ? *opt : (ckv_client_options){0};
  if (!ret) return CKV_ERR_INVALID;
  ckv_client *c = calloc(1, sizeof(*c));
  if (!c) return -ENOMEM;
  pthread_mutex_init(&c->lock, NULL);
  pthread_rwlock_init(&c->pindex_lock, NULL);
  pthread_mutex_init(&c->hb_lock, NULL);
  pthread_mutex_init(&c->reconnect_lock, NULL);
  pthread_cond_init(&c->hb_cond, NULL);
  c->attach_fd = -1;
  c->cuda_device = -1;
  c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : DEFAULT_TIMEOUT_MS;
  if (o.socket)
    snprintf(c->socket_ep, sizeof(c->socket_ep), "%s", o.socket);
  else
    default_socket(c->socket_ep, sizeof(c->socket_ep));
  if (o.attach_socket)
    snprintf(c->attach_path, sizeof(c->attach_path), "%s", o.attach_socket);
  else
    default_attach(c->socket_ep, c->attach_path, sizeof(c->attach_path));
  snprintf(c->name, sizeof(c->name), "%s", o.name ? o.name : "libcommitkv");
  c->want_arenas = !o.no_arenas;
  c->generation = 1;
  c->zctx = zmq_ctx_new();
  int r = c->zctx ? establish(c) : -ENOMEM;
  if (r < 0) goto fail;
  if (o.heartbeat) {
    if (pthread_create(&c->hb_thread, NULL, heartbeat_main, c) == 0) c->hb_running = true;
  }
  *ret = c;
  g_connect_error[0] = 0;
  return CKV_OK;
fail:
  snprintf(g_connect_error, sizeof(g_connect_error), "%s", c->last_error[0] ? c->last_error : ckv_strerror(r));
  ckv_client_free(c);
  return r;
}

int ckv_client_reconnect(ckv_client *c) {
  if (!c) return CKV_ERR_INVALID;
  pthread_mutex_lock(&c->reconnect_lock);
  /* Every thread that saw CKV_ERR_DAEMON_RESTARTED, and the heartbeat, may
   * call this for the same restart: once one has re-attached, tearing the new
   * connection down again would make the sessions opened on it stale.  A
   * client that is not cut off and whose heartbeat reaches the same daemon
   * keeps its connection. */
  int r;
  if (!ckv_client_restarted(c) && ckv_client_heartbeat(c) == CKV_OK) {
    r = CKV_OK;
  } else {
    teardown(c);
    r = establish(c);
    if (r < 0) teardown(c); /* half a connection is no connection */
  }
  pthread_mutex_unlock(&c->reconnect_lock);
  return r;
}

bool ckv_client_restarted(const ckv_client *c) {
  /* The heartbeat thread writes the flag: read it under the client's lock. */
  ckv_client *m = (ckv_client *)c;
  pthread_mutex_lock(&m->lock);
  bool r = m->restarted;
  pthread_mutex_unlock(&m->lock);
  return r;
}

bool ckv_client_arena_kept(const ckv_client *c) {
  ckv_client *m = (ckv_client *)c;
  pthread_mutex_lock(&m->lock);
  bool r = m->arena_kept;
  pthread_mutex_unlock(&m->lock);
  return r;
}

uint64_t ckv_rpc_generation(ckv_client *c) {
  pthread_mutex_lock(&c->lock);
  uint64_t g = c->generation;
  pthread_mutex_unlock(&c->lock);
  return g;
}

ckv_client *ckv_client_free(ckv_client *c) {
  if (!c) return NULL;
  if (c->hb_running) {
    pthread_mutex_lock(&c->hb_lock);
    c->hb_stop = true;
    pthread_cond_signal(&c->hb_cond);
    pthread_mutex_unlock(&c->hb_lock);
    pthread_join(c->hb_thread, NULL);
  }
  /* Lookups answered here since the last heartbeat still count. */
  if (c->dealer && !c->restarted &&
      (__atomic_load_n(&c->local_lookup_tokens, __ATOMIC_RELAXED) || __atomic_load_n(&c->local_hit_tokens, __ATOMIC_RELAXED)))
    (void)ckv_client_heartbeat(c);
  if (c->dealer) zmq_close(c->dealer);
  if (c->zctx) zmq_ctx_term(c->zctx);
  if (c->attach_fd >= 0) close(c->attach_fd);
  ckv_pindex_unmap(c->pindex);
  ckv_arena_free(c->arena);
  ckv_arena_free(c->previous_arena);
  pthread_cond_destroy(&c->hb_cond);
  pthread_mutex_destroy(&c->hb_lock);
  pthread_mutex_destroy(&c->reconnect_lock);
  pthread_mutex_destroy(&c->lock);
  pthread_rwlock_destroy(&c->pindex_lock);
  free(c);
  return NULL;
}

const char *ckv_client_tenant(const ckv_client *c) { return c->tenant; }

int ckv_rpc_memory(ckv_client *c) {
  pthread_mutex_lock(&c->lock); /* a reconnect swaps the arena under this lock */
  int m = !c->arena                                   ? CKV_RPC_MEM_NONE
          : strcmp(ckv_arena_kind(c->arena), "cuda") == 0 ? CKV_RPC_MEM_CUDA
                                                          : CKV_RPC_MEM_HOST;
  pthread_mutex_unlock(&c->lock);
  return m;
}

const char *ckv_client_memory_kind(const ckv_client *c) {
  if (!c) return "none";
  static const char *const names[] = {[CKV_RPC_MEM_NONE] = "none", [CKV_RPC_MEM_HOST] = "host",
                                      [CKV_RPC_MEM_CUDA] = "cuda"};
  return names[ckv_rpc_memory((ckv_client *)c)];
}

void ckv_rpc_set_error(ckv_client *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&c->lock);
  vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
  pthread_mutex_unlock(&c->lock);
  va_end(ap);
}
const char *ckv_client_last_error(const ckv_client *c) { return c->last_error; }
const char *ckv_client_last_note(const ckv_client *c) { return c->last_note; }
uint32_t ckv_client_lease_ms(const ckv_client *c) { return c->lease_ms; }

int ckv_client_heartbeat(ckv_client *c) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Heartbeat hb = COMMITKV__V1__HEARTBEAT__INIT;
  hb.prefix_lookup_tokens = __atomic_exchange_n(&c->local_lookup_tokens, 0, __ATOMIC_RELAXED);
  hb.prefix_hit_tokens = __atomic_exchange_n(&c->local_hit_tokens, 0, __ATOMIC_RELAXED);
  req.body_case = COMMITKV__V1__REQUEST__BODY_HEARTBEAT;
  req.heartbeat = &hb;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  if (r == 0) {
    ckv_rpc_free(rep);
  } else if (r != CKV_ERR_INVALID && r != CKV_ERR_AUTH) { /* not counted: try with the next one */
    __atomic_fetch_add(&c->local_lookup_tokens, hb.prefix_lookup_tokens, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->local_hit_tokens, hb.prefix_hit_tokens, __ATOMIC_RELAXED);
  }
  return r;
}

/* The daemon grew the arena past what we mapped: ask for it again on the
 * attach socket (AttachRequest{refresh}) and map the new part.  Caller holds
 * c->lock (the attach socket carries one exchange at a time). */
static int refresh_arenas(ckv_client *c) {
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = CKV_CLIENT_VERSION;
  req.want_arenas = true;
  req.refresh = true;
  int fds[ATTACH_MAX_FDS];
  size_t n_fds = 0;
  Commitkv__V1__AttachReply *rep = NULL;
  int r = attach_exchange(c, &req, fds, &n_fds, &rep);
  if (r < 0) return r;
  if (memcmp(rep->boot_token.data, c->boot_token, sizeof(c->boot_token)) != 0) {
    r = CKV_ERR_DAEMON_RESTARTED;
  } else {
    r = CKV_ERR_PROTO; /* unless our arena is in the reply */
    for (size_t i = 0; i < rep->n_arenas; i++) {
      const Commitkv__V1__ArenaInfo *a = rep->arenas[i];
      if (a->arena_id != c->arena_id) continue;
      ckv_arena_desc d;
      r = arena_desc(c, a, fds, n_fds, &d);
      if (r == CKV_OK) r = ckv_arena_refresh(c->arena, &d);
      if (r < 0) arena_error(c, "cannot map the grown arena", a->arena_id, d.kind, r);
    }
  }
  for (size_t i = 0; i < n_fds; i++) close(fds[i]);
  commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  return r;
}

int ckv_rpc_refresh_prefix_index(ckv_client *c) {
  pthread_mutex_lock(&c->lock); /* the attach socket carries one exchange at a time */
  int r = CKV_ERR_DAEMON_RESTARTED;
  if (c->restarted || c->attach_fd < 0) goto out;
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = CKV_CLIENT_VERSION;
  req.want_arenas = true;
  req.refresh = true;
  req.want_prefix_index = true;
  int fds[ATTACH_MAX_FDS];
  size_t n_fds = 0;
  Commitkv__V1__AttachReply *rep = NULL;
  if ((r = attach_exchange(c, &req, fds, &n_fds, &rep)) < 0) goto out;
  if (memcmp(rep->boot_token.data, c->boot_token, sizeof(c->boot_token)) != 0)
    r = CKV_ERR_DAEMON_RESTARTED;
  else if (!rep->prefix_index || rep->prefix_index->fd_index >= n_fds)
    r = CKV_ERR_PROTO;
  else
    map_prefix_index(c, fds[rep->prefix_index->fd_index]);
  for (size_t i = 0; i < n_fds; i++) close(fds[i]);
  commitkv__v1__attach_reply__free_unpacked(rep, NULL);
out:
  pthread_mutex_unlock(&c->lock);
  return r;
}

void *ckv_rpc_arena_ptr(ckv_client *c, uint32_t arena_id, uint64_t off, uint64_t len) {
  pthread_mutex_lock(&c->lock);
  void *p = NULL;
  if (c->arena && arena_id == c->arena_id) {
    uint64_t size = ckv_arena_size(c->arena);
    if (off <= size && len <= size - off) {
      /* Beyond what we mapped: the arena grew since; map the rest first. */
      if (off + len <= ckv_arena_committed(c->arena) ||
          (refresh_arenas(c) == CKV_OK && off + len <= ckv_arena_committed(c->arena)))
        p = (uint8_t *)ckv_arena_base(c->arena) + off;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return p;
}

/* Whether the attach socket reached EOF: the daemon that holds our arenas
 * and sessions is gone (it keeps the socket open for our whole life).  Data
 * on it (never sent unasked) is left alone. */
static bool attach_closed(ckv_client *c) {
  char b;
  ssize_t n = recv(c->attach_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ckv_rpc(ckv_client *c, Commitkv__V1__Request *req, Commitkv__V1__Response **ret) {
  pthread_mutex_lock(&c->lock);
  int r;
  Commitkv__V1__Response *rep = NULL;
  if (c->restarted || !c->dealer) {
    r = CKV_ERR_DAEMON_RESTARTED;
    snprintf(c->last_error, sizeof(c->last_error), "the daemon restarted: ckv_client_reconnect() re-attaches");
    goto out;
  }
  req->version = CKV_CLIENT_VERSION;
  req->request_id = ++c->next_request_id;
  size_t len = commitkv__v1__request__get_packed_size(req);
  zmq_msg_t m;
  if (zmq_msg_init_size(&m, len) != 0) {
    r = -ENOMEM;
    goto out;
  }
  commitkv__v1__request__pack(req, zmq_msg_data(&m));
  if (zmq_msg_send(&m, c->dealer, 0) < 0) {
    zmq_msg_close(&m);
    r = CKV_ERR_DISCONNECTED;
    goto out;
  }
  int64_t deadline = now_ms() + c->timeout_ms;
  /* The attach socket too: its EOF says at once that the daemon died, where
   * the request alone would wait out the whole timeout. */
  bool watch_attach = c->attach_fd >= 0;
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      r = CKV_ERR_TIMEOUT;
      snprintf(c->last_error, sizeof(c->last_error), "no reply from the daemon within %d ms", c->timeout_ms);
      goto out;
    }
    zmq_pollitem_t it[2] = {{.socket = c->dealer, .events = ZMQ_POLLIN},
                            {.fd = c->attach_fd, .events = ZMQ_POLLIN}};
    if (zmq_poll(it, watch_attach ? 2 : 1, (long)left) <= 0) continue;
    if (watch_attach && it[1].revents) {
      if (attach_closed(c)) {
        __atomic_store_n(&c->restarted, true, __ATOMIC_RELEASE);
        r = CKV_ERR_DAEMON_RESTARTED;
        snprintf(c->last_error, sizeof(c->last_error),
                 "the daemon went away (its attach socket closed): ckv_client_reconnect() re-attaches once a "
                 "daemon listens again");
        goto out;
      }
      watch_attach = false; /* unexpected bytes: not ours to read here; stop polling them */
    }
    if (!(it[0].revents & ZMQ_POLLIN)) continue;
    zmq_msg_t in;
    zmq_msg_init(&in);
    if (zmq_msg_recv(&in, c->dealer, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&in);
      continue;
    }
    rep = commitkv__v1__response__unpack(NULL, zmq_msg_size(&in), zmq_msg_data(&in));
    zmq_msg_close(&in);
    if (!rep) {
      r = CKV_ERR_PROTO;
      goto out;
    }
    if (rep->request_id == req->request_id || rep->request_id == 0) break;
    commitkv__v1__response__free_unpacked(rep, NULL); /* late reply to an abandoned request */
    rep = NULL;
  }
  if (rep->boot_token.len == sizeof(c->boot_token) && memcmp(rep->boot_token.data, c->boot_token, 16) != 0) {
    __atomic_store_n(&c->restarted, true, __ATOMIC_RELEASE);
    r = CKV_ERR_DAEMON_RESTARTED;
    snprintf(c->last_error, sizeof(c->last_error), "the daemon restarted: ckv_client_reconnect() re-attaches");
    goto out;
  }
  if (rep->code != 0) {
    r = rep->code;
    snprintf(c->last_error, sizeof(c->last_error), "%s", rep->message ? rep->message : "");
    goto out;
  }
  snprintf(c->last_note, sizeof(c->last_note), "%s", rep->message ? rep->message : "");
  *ret = rep;
  rep = NULL;
  r = CKV_OK;
out:
  if (rep) commitkv__v1__response__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return r;
}

void ckv_rpc_free(Commitkv__V1__Response *rep) {
  if (rep) commitkv__v1__response__free_unpacked(rep, NULL);
}
