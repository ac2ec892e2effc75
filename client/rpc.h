/* rpc.h - libcommitkv internals: the client object and one request/reply
 * exchange with the daemon.  Not installed; commitkvctl and the tests use it. */
#ifndef CKV_CLIENT_RPC_H
#define CKV_CLIENT_RPC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "shm/prefix_index.h"

typedef struct ckv_arena ckv_arena;

struct ckv_client {
  pthread_mutex_t lock; /* serialises every exchange on the DEALER */
  void *zctx, *dealer;
  int attach_fd;        /* kept open: closing it tells the daemon we are gone */
  ckv_arena *arena;     /* the tenant's arena, mapped (host memfd or CUDA device memory) */
  /* The host arena of the daemon before the last restart, still mapped: a
   * thread may be reading a view of it while another one (or the heartbeat)
   * reconnects.  Unmapped at the next reconnect or ckv_client_free. */
  ckv_arena *previous_arena;
  uint32_t arena_id;
  /* The tenant's prefix index, mapped read-only (NULL: none; LookupPrefix
   * goes to the daemon), under its own lock so a lookup never waits for
   * another thread's request (attach and reconnect write it), and the
   * lookups it answered since the last heartbeat (atomic; sent with it: the
   * tenant's lookup figures). */
  pthread_rwlock_t pindex_lock;
  ckv_pindex_view *pindex;
  uint64_t local_lookup_tokens, local_hit_tokens;
  bool arena_kept;      /* the last attach kept previous_arena (a warm restart of the daemon) */
  int cuda_device;      /* CUDA ordinal checked against the arena's device at the first CUDA attach
                         * (-1 before): a reconnect from another thread checks the same device */
  uint8_t key[16];
  uint8_t boot_token[16];
  char tenant[64];
  bool admin;
  uint64_t next_request_id;
  int timeout_ms;
  uint32_t lease_ms, heartbeat_ms;
  uint64_t max_tokens; /* the daemon's max_tokens_per_session (0: not said): longer lookups go to it */
  char last_error[512];
  char last_note[512]; /* the text of the last successful reply (ckv_client_last_note) */
  bool restarted; /* the daemon's boot token changed: every call fails until reconnect (atomic stores:
                   * a prefix lookup reads it without c->lock) */
  uint64_t generation; /* bumped by each reconnect: sessions opened before are stale */
  pthread_mutex_t reconnect_lock;
  char socket_ep[512], attach_path[512], name[64];
  bool want_arenas;
  pthread_t hb_thread;
  bool hb_running;
  pthread_mutex_t hb_lock;
  pthread_cond_t hb_cond;
  bool hb_stop;
};

/* Sends `req` (request_id and version are filled in) and waits for the reply.
 * On CKV_OK *ret is the unpacked Response whose code is 0; free it with
 * ckv_rpc_free.  A reply with a non-zero code returns that code and stores
 * its text in c->last_error.  CKV_ERR_TIMEOUT, CKV_ERR_DAEMON_RESTARTED,
 * CKV_ERR_PROTO are the transport's own failures. */
int ckv_rpc(ckv_client *c, Commitkv__V1__Request *req, Commitkv__V1__Response **ret);
void ckv_rpc_free(Commitkv__V1__Response *rep);

/* The daemon replaced the tenant's prefix index with a bigger one (a lookup
 * said CKV_ERR_STATE): fetch and map it (AttachRequest{refresh,
 * want_prefix_index}).  CKV_OK or the exchange's error. */
int ckv_rpc_refresh_prefix_index(ckv_client *c);

/* The client's connection generation (see ckv_client_reconnect). */
uint64_t ckv_rpc_generation(ckv_client *c);

/* Address of arena offset `off` in this process, or NULL when out of range.
 * A device pointer when the arena is CUDA memory (see ckv_rpc_memory). */
void *ckv_rpc_arena_ptr(ckv_client *c, uint32_t arena_id, uint64_t off, uint64_t len);

/* What the client's arena is: none mapped, host memory (memfd) or CUDA
 * device memory (only CPU-addressable through cudaMemcpy). */
enum { CKV_RPC_MEM_NONE = 0, CKV_RPC_MEM_HOST = 1, CKV_RPC_MEM_CUDA = 2 };
int ckv_rpc_memory(ckv_client *c);

/* Stores a locally detected failure (a CUDA error, an unsupported call) as
 * c->last_error, for ckv_client_last_error(). */
void ckv_rpc_set_error(ckv_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
