/* session.c - libcommitkv sessions: open, append, write K/V, views, rounds.
 *
 * The client keeps, per position, where its draft slot is (arena offset of
 * the block and slot index), so writing a token's K/V is pointer arithmetic
 * over the mapped arena: no copy through the daemon.
 *
 * CUDA arenas (device memory): writes are cudaMemcpy(Async) with
 * cudaMemcpyDefault, so K/V may come from device or host memory.  The
 * streams of asynchronous writes are remembered until the next report, which
 * synchronises them first: the daemon may compress a token as soon as it
 * has the report, so its K/V must have landed by then. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cold_gather.h"
#include "client/cold_select.h"
#include "client/rpc.h"
#include "kernels/format.h"
#ifdef CKV_HAVE_CUDA_ARENA
#include <cuda_runtime_api.h>
#endif

typedef struct slot_ref {
  uint64_t block_offset; /* UINT64_MAX: no draft slot */
  uint32_t arena_id;
  uint16_t capacity;
  uint16_t slot;
} slot_ref;

struct ckv_session {
  ckv_client *c;
  uint64_t generation; /* the client's generation at open: older = the daemon restarted */
  char id[129];
  ckv_geometry geom;
  uint32_t draft_tokens, commit_tokens;
  uint64_t epoch;
  /* Draft slots of the tokens appended since the last report: slots[i] is
   * position first_writable + i.  Older tokens may have been moved by the
   * daemon, so they have no writable slot. */
  slot_ref *slots;
  uint64_t n_tokens, first_writable, cap_slots;
  uint64_t matched_tokens; /* started with these from shared blocks (SessionOpened.matched_tokens) */
  /* the last fetched view */
  ckv_view view;
  ckv_block_view *blocks;
  size_t cap_blocks;
  uint64_t view_epoch; /* 0 = none fetched */
  /* pending semantic updates for the next report */
  uint32_t *sem_pos;
  float *sem_scores;
  size_t n_sem;
  ckv_transition *transitions;
  /* CUDA streams (NULL = the default stream) that wrote K/V asynchronously
   * since the last report: synchronised before the next report. */
  void **streams;
  size_t n_streams, cap_streams;
  /* cold blocks: their key summaries, and how many the next report says were read */
  ckv_cold_cache *cold;
  ckv_cold_gather_scratch *gather;
  uint64_t recalled;
};

/* A handle from before a reconnect names a session the new daemon never had. */
static bool stale(ckv_session *s) { return s->generation != ckv_rpc_generation(s->c); }

static ckv_session *session_free(ckv_session *s) {
  if (!s) return NULL;
  free(s->slots);
  free(s->blocks);
  free(s->sem_pos);
  free(s->sem_scores);
  free(s->transitions);
  free(s->streams);
  ckv_cold_cache_free(s->cold);
  ckv_cold_gather_scratch_free(s->gather);
  free(s);
  return NULL;
}

#ifdef CKV_HAVE_CUDA_ARENA
static int cuda_failed(ckv_session *s, const char *what, cudaError_t e) {
  ckv_rpc_set_error(s->c, "session %s: %s: %s (%s)", s->id, what, cudaGetErrorName(e), cudaGetErrorString(e));
  (void)cudaGetLastError(); /* a non-sticky error must not fail the next call */
  return CKV_ERR_DEVICE;
}

/* Adds a stream to those synchronised by the next report (once each). */
static int remember_stream(ckv_session *s, void *stream) {
  for (size_t i = 0; i < s->n_streams; i++)
    if (s->streams[i] == stream) return CKV_OK;
  if (s->n_streams == s->cap_streams) {
    size_t ncap = s->cap_streams ? 2 * s->cap_streams : 4;
    void **ns = realloc(s->streams, ncap * sizeof(*ns));
    if (!ns) return -ENOMEM;
    s->streams = ns;
    s->cap_streams = ncap;
  }
  s->streams[s->n_streams++] = stream;
  return CKV_OK;
}
#endif

/* Waits for every stream that wrote K/V since the last report and forgets
 * them (also after a failure: a stream the worker destroyed cannot be waited
 * for twice).  Returns CKV_OK or CKV_ERR_DEVICE. */
static int sync_streams(ckv_session *s) {
  int r = CKV_OK;
#ifdef CKV_HAVE_CUDA_ARENA
  for (size_t i = 0; i < s->n_streams; i++) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)s->streams[i]);
    if (e != cudaSuccess && r == CKV_OK) r = cuda_failed(s, "cudaStreamSynchronize before the report", e);
  }
#endif
  s->n_streams = 0;
  return r;
}

static int session_from_reply(ckv_client *c, const char *id, Commitkv__V1__Response *rep, ckv_session **ret);

int ckv_session_open(ckv_client *c, const char *id, const ckv_geometry *g, const ckv_session_options *opt,
                     ckv_session **ret) {
  if (!c || !id || !ret || (!g && !(opt && opt->resume))) return CKV_ERR_INVALID;
  if (opt && opt->n_params && (!opt->param_names || !opt->param_values)) return CKV_ERR_INVALID;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__OpenSession o = COMMITKV__V1__OPEN_SESSION__INIT;
  Commitkv__V1__Geometry pg = COMMITKV__V1__GEOMETRY__INIT;
  o.session_id = (char *)id;
  if (g) {
    pg.n_layers = g->n_layers;
    pg.n_kv_heads = g->n_kv_heads;
    pg.head_dim = g->head_dim;
    pg.dtype = (Commitkv__V1__Dtype)g->dtype;
    o.geometry = &pg;
  }
  Commitkv__V1__OpenSession__ParamsEntry *entries = NULL, **eptr = NULL;
  if (opt) {
    o.policy = (char *)(opt->policy ? opt->policy : "");
    o.resume = opt->resume;
    o.model_id = (char *)(opt->model_id ? opt->model_id : "");
    o.model_revision = (char *)(opt->model_revision ? opt->model_revision : "");
    pg.draft_block_tokens = opt->draft_block_tokens;
    pg.commit_block_tokens = opt->commit_block_tokens;
    if (opt->reuse_prefix && opt->n_token_ids) {
      if (!opt->token_ids || opt->n_token_ids > SIZE_MAX / 4) return CKV_ERR_INVALID;
      o.reuse_prefix = true;
      o.token_ids.data = (uint8_t *)opt->token_ids; /* little-endian hosts: the wire's byte order */
      o.token_ids.len = opt->n_token_ids * 4;
    }
    if (opt->n_params) {
      entries = calloc(opt->n_params, sizeof(*entries));
      eptr = calloc(opt->n_params, sizeof(*eptr));
      if (!entries || !eptr) {
        free(entries);
        free(eptr);
        return -ENOMEM;
      }
      for (size_t i = 0; i < opt->n_params; i++) {
        commitkv__v1__open_session__params_entry__init(&entries[i]);
        entries[i].key = (char *)opt->param_names[i];
        entries[i].value = opt->param_values[i];
        eptr[i] = &entries[i];
      }
      o.params = eptr;
      o.n_params = opt->n_params;
    }
  }
  req.body_case = COMMITKV__V1__REQUEST__BODY_OPEN_SESSION;
  req.open_session = &o;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  free(entries);
  free(eptr);
  if (r < 0) return r;
  return session_from_reply(c, id, rep, ret);
}

/* A handle for the session a SessionOpened reply (freed here) describes. */
static int session_from_reply(ckv_client *c, const char *id, Commitkv__V1__Response *rep, ckv_session **ret) {
  const Commitkv__V1__SessionOpened *so = rep->session_opened;
  ckv_session *s = calloc(1, sizeof(*s));
  if (!s || rep->body_case != COMMITKV__V1__RESPONSE__BODY_SESSION_OPENED || !so->geometry) {
    free(s);
    ckv_rpc_free(rep);
    return s ? CKV_ERR_PROTO : -ENOMEM;
  }
  s->c = c;
  s->generation = ckv_rpc_generation(c);
  snprintf(s->id, sizeof(s->id), "%s", id);
  s->geom = (ckv_geometry){so->geometry->n_layers, so->geometry->n_kv_heads, so->geometry->head_dim,
                           (uint32_t)so->geometry->dtype};
  s->draft_tokens = so->geometry->draft_block_tokens;
  s->commit_tokens = so->geometry->commit_block_tokens;
  s->epoch = so->epoch;
  s->n_tokens = so->n_tokens;
  s->matched_tokens = so->matched_tokens;
  ckv_rpc_free(rep);
  s->first_writable = s->n_tokens; /* a resumed session's tokens are written already */
  *ret = s;
  return CKV_OK;
}

int ckv_session_fork(ckv_session *parent, const char *new_id, uint64_t at_position, ckv_session **ret) {
  if (!parent || !new_id || !ret) return CKV_ERR_INVALID;
  if (stale(parent)) return CKV_ERR_DAEMON_RESTARTED;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ForkSession f = COMMITKV__V1__FORK_SESSION__INIT;
  f.parent_id = parent->id;
  f.new_id = (char *)new_id;
  f.at_position = at_position;
  req.body_case = COMMITKV__V1__REQUEST__BODY_FORK_SESSION;
  req.fork_session = &f;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(parent->c, &req, &rep);
  if (r < 0) return r;
  return session_from_reply(parent->c, new_id, rep, ret);
}

uint64_t ckv_session_matched_tokens(const ckv_session *s) { return s ? s->matched_tokens : 0; }

/* A model name the daemon accepts (handlers.c check_model_name): a name it
 * refuses goes to the daemon, which says why. */
static bool model_name_ok(const char *v) {
  size_t n = v ? strnlen(v, CKV_PINDEX_NAME_BYTES) : 0;
  if (n > CKV_PINDEX_NAME_MAX) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) return false;
  return true;
}

int ckv_client_lookup_prefix(ckv_client *c, const uint32_t *token_ids, size_t n, const char *model_id,
                             const char *model_revision, uint64_t *ret_matched) {
  if (!c || !ret_matched || (n && !token_ids) || n > SIZE_MAX / 4) return CKV_ERR_INVALID;
  /* In this process when the daemon published the tenant's index: no round
   * trip (the answer is advisory either way: reuse_prefix matches again). */
  /* what the daemon refuses (names, more ids than a session holds) goes to it, which says why */
  uint64_t max_tokens = __atomic_load_n(&c->max_tokens, __ATOMIC_RELAXED);
  bool local_ok = model_name_ok(model_id) && model_name_ok(model_revision) && (!max_tokens || n <= max_tokens);
  int local = CKV_ERR_BUSY;
  for (int attempt = 0; attempt < 2; attempt++) {
    pthread_rwlock_rdlock(&c->pindex_lock);
    local = c->pindex && local_ok && !__atomic_load_n(&c->restarted, __ATOMIC_ACQUIRE)
                ? ckv_pindex_lookup(c->pindex, model_id, model_revision, token_ids, n, ret_matched)
                : CKV_ERR_BUSY;
    pthread_rwlock_unlock(&c->pindex_lock);
    /* superseded: the daemon grew the index; fetch the new one and look again */
    if (local != CKV_ERR_STATE || ckv_rpc_refresh_prefix_index(c) < 0) break;
  }
  if (local == CKV_OK) {
    __atomic_fetch_add(&c->local_lookup_tokens, (uint64_t)n, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->local_hit_tokens, *ret_matched, __ATOMIC_RELAXED);
  }
  if (local == CKV_OK) return CKV_OK;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__LookupPrefix l = COMMITKV__V1__LOOKUP_PREFIX__INIT;
  l.token_ids.data = (uint8_t *)token_ids;
  l.token_ids.len = n * 4;
  l.model_id = (char *)(model_id ? model_id : "");
  l.model_revision = (char *)(model_revision ? model_revision : "");
  req.body_case = COMMITKV__V1__REQUEST__BODY_LOOKUP_PREFIX;
  req.lookup_prefix = &l;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  if (r < 0) return r;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_PREFIX_MATCH)
    r = CKV_ERR_PROTO;
  else
    *ret_matched = rep->prefix_match->matched_tokens;
  ckv_rpc_free(rep);
  return r;
}

int ckv_session_restore(ckv_client *c, const char *id, const char *name, const ckv_session_options *opt,
                        ckv_session **ret) {
  if (!c || !id || !ret) return CKV_ERR_INVALID;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__RestoreSession rs = COMMITKV__V1__RESTORE_SESSION__INIT;
  rs.session_id = (char *)id;
  rs.name = (char *)(name ? name : "");
  if (opt && opt->model_id) rs.model_id = (char *)opt->model_id;
  if (opt && opt->model_revision) rs.model_revision = (char *)opt->model_revision;
  req.body_case = COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION;
  req.restore_session = &rs;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(c, &req, &rep);
  if (r < 0) return r;
  return session_from_reply(c, id, rep, ret);
}

int ckv_session_save(ckv_session *s, const char *name, bool committed_only, uint64_t *ret_bytes) {
  if (!s) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__SaveSession sv = COMMITKV__V1__SAVE_SESSION__INIT;
  sv.session_id = s->id;
  sv.name = (char *)(name ? name : "");
  sv.committed_only = committed_only;
  req.body_case = COMMITKV__V1__REQUEST__BODY_SAVE_SESSION;
  req.save_session = &sv;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(s->c, &req, &rep);
  if (r < 0) return r;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_SESSION_SAVED) r = CKV_ERR_PROTO;
  else if (ret_bytes) *ret_bytes = rep->session_saved->bytes;
  ckv_rpc_free(rep);
  return r;
}

static int simple_session_request(ckv_session *s, bool drop) {
  (void)sync_streams(s); /* no copy may still be landing in memory the daemon frees or keeps */
  if (stale(s)) {
    session_free(s);
    return CKV_ERR_DAEMON_RESTARTED;
  }
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__CloseSession cl = COMMITKV__V1__CLOSE_SESSION__INIT;
  Commitkv__V1__DropSession dr = COMMITKV__V1__DROP_SESSION__INIT;
  if (drop) {
    dr.session_id = s->id;
    req.body_case = COMMITKV__V1__REQUEST__BODY_DROP_SESSION;
    req.drop_session = &dr;
  } else {
    cl.session_id = s->id;
    req.body_case = COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION;
    req.close_session = &cl;
  }
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(s->c, &req, &rep);
  if (r == 0) ckv_rpc_free(rep);
  session_free(s);
  return r;
}

int ckv_session_close(ckv_session *s) { return s ? simple_session_request(s, false) : CKV_ERR_INVALID; }
int ckv_session_drop(ckv_session *s) { return s ? simple_session_request(s, true) : CKV_ERR_INVALID; }

const char *ckv_session_id(const ckv_session *s) { return s->id; }
const ckv_geometry *ckv_session_geometry(const ckv_session *s) { return &s->geom; }
uint64_t ckv_session_tokens(const ckv_session *s) { return s->n_tokens; }
uint64_t ckv_session_epoch(const ckv_session *s) { return s->epoch; }

int ckv_session_append(ckv_session *s, uint32_t count, const uint8_t *roles, const uint8_t *tags,
                       const float *semantic, const uint32_t *token_ids, uint64_t *ret_first_position) {
  if (!s || !count) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AppendTokens a = COMMITKV__V1__APPEND_TOKENS__INIT;
  a.session_id = s->id;
  a.count = count;
  if (roles) a.roles = (ProtobufCBinaryData){count, (uint8_t *)roles};
  if (tags) a.tags = (ProtobufCBinaryData){count, (uint8_t *)tags};
  if (semantic) a.semantic = (ProtobufCBinaryData){4u * (size_t)count, (uint8_t *)semantic};
  if (token_ids) a.token_ids = (ProtobufCBinaryData){4u * (size_t)count, (uint8_t *)token_ids};
  req.body_case = COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS;
  req.append_tokens = &a;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(s->c, &req, &rep);
  if (r < 0) return r;
  const Commitkv__V1__TokensAppended *t = rep->tokens_appended;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_TOKENS_APPENDED || t->first_position != s->n_tokens ||
      t->count != count) {
    ckv_rpc_free(rep);
    return CKV_ERR_PROTO;
  }
  uint64_t need = s->n_tokens + count, base = s->first_writable;
  if (need - base > s->cap_slots) {
    uint64_t ncap = s->cap_slots ? s->cap_slots : 256;
    while (ncap < need - base) ncap *= 2;
    slot_ref *ns = realloc(s->slots, ncap * sizeof(*ns));
    if (!ns) {
      ckv_rpc_free(rep);
      return -ENOMEM;
    }
    s->slots = ns;
    s->cap_slots = ncap;
  }
  for (uint64_t i = s->n_tokens; i < need; i++) s->slots[i - base].block_offset = UINT64_MAX;
  for (size_t i = 0; i < t->n_slots; i++) {
    const Commitkv__V1__SlotRun *sr = t->slots[i];
    uint64_t block_bytes = ckv_draft_block_bytes(&s->geom, sr->capacity);
    if (sr->first_position < s->n_tokens || sr->count > need - sr->first_position ||
        sr->first_slot + (uint64_t)sr->count > sr->capacity ||
        !ckv_rpc_arena_ptr(s->c, sr->arena_id, sr->block_offset, block_bytes)) {
      ckv_rpc_free(rep);
      return CKV_ERR_PROTO;
    }
    for (uint32_t k = 0; k < sr->count; k++)
      s->slots[sr->first_position + k - base] =
          (slot_ref){sr->block_offset, sr->arena_id, (uint16_t)sr->capacity, (uint16_t)(sr->first_slot + k)};
  }
  /* Quota pressure moves only reported tokens (below first_writable), so the
   * reply's transitions never touch a writable slot. */
  s->n_tokens = need;
  if (t->epoch > s->epoch) s->epoch = t->epoch;
  if (ret_first_position) *ret_first_position = t->first_position;
  ckv_rpc_free(rep);
  return CKV_OK;
}

void *ckv_session_kv_ptr(ckv_session *s, uint64_t position, uint32_t layer, int kv) {
  if (!s || position < s->first_writable || position >= s->n_tokens || layer >= s->geom.n_layers ||
      (kv != 0 && kv != 1) || stale(s))
    return NULL;
  const slot_ref *r = &s->slots[position - s->first_writable];
  if (r->block_offset == UINT64_MAX) return NULL;
  uint8_t *base = ckv_rpc_arena_ptr(s->c, r->arena_id, r->block_offset, ckv_draft_block_bytes(&s->geom, r->capacity));
  if (!base) return NULL;
  return base + ckv_draft_kv_offset(&s->geom, r->capacity, layer, (uint32_t)kv, r->slot);
}

int ckv_session_write_kv(ckv_session *s, uint64_t position, uint32_t layer, const void *k, const void *v) {
  if (s && stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  uint8_t *kp = ckv_session_kv_ptr(s, position, layer, 0), *vp = ckv_session_kv_ptr(s, position, layer, 1);
  if (!kp || !vp) return CKV_ERR_RANGE;
  size_t bytes = ckv_draft_token_elems(&s->geom) * 2u;
  if (ckv_rpc_memory(s->c) == CKV_RPC_MEM_CUDA) {
#ifdef CKV_HAVE_CUDA_ARENA
    /* cudaMemcpy returns before a device-to-device (or staged host) copy has
     * landed: copy on this thread's default stream and wait for it, so the
     * write is done on return without waiting for the application's other
     * streams (the legacy default stream would wait for every blocking one). */
    cudaError_t e = cudaSuccess;
    if (k) e = cudaMemcpyAsync(kp, k, bytes, cudaMemcpyDefault, cudaStreamPerThread);
    if (e == cudaSuccess && v) e = cudaMemcpyAsync(vp, v, bytes, cudaMemcpyDefault, cudaStreamPerThread);
    cudaError_t w = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess) return cuda_failed(s, "cudaMemcpy of K/V into the draft slot", e);
    if (w != cudaSuccess) return cuda_failed(s, "cudaStreamSynchronize after the K/V copy", w);
    return CKV_OK;
#else
    return CKV_ERR_UNSUPPORTED; /* unreachable: a build without CUDA maps no CUDA arena */
#endif
  }
  if (k) memcpy(kp, k, bytes);
  if (v) memcpy(vp, v, bytes);
  return CKV_OK;
}

int ckv_session_write_kv_async(ckv_session *s, uint64_t position, uint32_t layer, const void *k, const void *v,
                               void *stream) {
  if (!s) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  if (ckv_rpc_memory(s->c) != CKV_RPC_MEM_CUDA) {
    if (stream) {
      ckv_rpc_set_error(s->c, "session %s: a CUDA stream was given, but the arena is %s memory", s->id,
                        ckv_client_memory_kind(s->c));
      return CKV_ERR_UNSUPPORTED;
    }
    return ckv_session_write_kv(s, position, layer, k, v);
  }
#ifdef CKV_HAVE_CUDA_ARENA
  uint8_t *kp = ckv_session_kv_ptr(s, position, layer, 0), *vp = ckv_session_kv_ptr(s, position, layer, 1);
  if (!kp || !vp) return CKV_ERR_RANGE;
  size_t bytes = ckv_draft_token_elems(&s->geom) * 2u;
  /* Remembered before queueing: even a half-queued write is waited for. */
  int r = remember_stream(s, stream);
  if (r < 0) return r;
  cudaError_t e = cudaSuccess;
  if (k) e = cudaMemcpyAsync(kp, k, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  if (e == cudaSuccess && v) e = cudaMemcpyAsync(vp, v, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  if (e != cudaSuccess) return cuda_failed(s, "cudaMemcpyAsync of K/V into the draft slot", e);
  return CKV_OK;
#else
  return CKV_ERR_UNSUPPORTED;
#endif
}

static int fill_blocks(ckv_session *s, Commitkv__V1__BlockRef **refs, size_t n, size_t at, size_t *ret_n) {
  for (size_t i = 0; i < n; i++) {
    const Commitkv__V1__BlockRef *b = refs[i];
    void *p = ckv_rpc_arena_ptr(s->c, b->arena_id, b->offset, b->bytes);
    if (!p) return CKV_ERR_PROTO;
    s->blocks[at + i] = (ckv_block_view){p, b->block_id, b->bytes, (uint32_t)b->format, b->capacity};
  }
  *ret_n = n;
  return CKV_OK;
}

int ckv_session_view(ckv_session *s, const ckv_view **ret) {
  if (!s || !ret) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  /* Always ask: moves are published asynchronously, so only the daemon knows
   * whether the epoch moved.  An unchanged view costs one small round trip. */
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__GetView g = COMMITKV__V1__GET_VIEW__INIT;
  g.session_id = s->id;
  g.known_epoch = s->view_epoch;
  req.body_case = COMMITKV__V1__REQUEST__BODY_GET_VIEW;
  req.get_view = &g;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(s->c, &req, &rep);
  if (r < 0) return r;
  const Commitkv__V1__View *v = rep->view;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_VIEW) {
    ckv_rpc_free(rep);
    return CKV_ERR_PROTO;
  }
  if (v->unchanged && s->view_epoch && v->epoch == s->view_epoch) {
    s->view.n_tokens = v->n_tokens;
    ckv_rpc_free(rep);
    *ret = &s->view;
    return CKV_OK;
  }
  size_t total = v->n_draft + v->n_staged + v->n_committed + v->n_cold;
  if (total > s->cap_blocks) {
    ckv_block_view *nb = realloc(s->blocks, total * sizeof(*nb));
    if (!nb) {
      ckv_rpc_free(rep);
      return -ENOMEM;
    }
    s->blocks = nb;
    s->cap_blocks = total;
  }
  size_t nd, ns, nc, nk;
  if ((r = fill_blocks(s, v->draft, v->n_draft, 0, &nd)) < 0 ||
      (r = fill_blocks(s, v->staged, v->n_staged, nd, &ns)) < 0 ||
      (r = fill_blocks(s, v->committed, v->n_committed, nd + ns, &nc)) < 0 ||
      (r = fill_blocks(s, v->cold, v->n_cold, nd + ns + nc, &nk)) < 0) {
    ckv_rpc_free(rep);
    s->view_epoch = 0;
    return r;
  }
  s->view = (ckv_view){.epoch = v->epoch, .n_tokens = v->n_tokens, .draft = s->blocks, .n_draft = nd,
                       .staged = s->blocks + nd, .n_staged = ns, .committed = s->blocks + nd + ns,
                       .n_committed = nc, .cold = s->blocks + nd + ns + nc, .n_cold = nk};
  s->view_epoch = v->epoch;
  if (v->epoch > s->epoch) s->epoch = v->epoch;
  ckv_rpc_free(rep);
  *ret = &s->view;
  return CKV_OK;
}

int ckv_session_set_semantic(ckv_session *s, const uint32_t *positions, const float *scores, size_t n) {
  if (!s || (n && (!positions || !scores))) return CKV_ERR_INVALID;
  uint32_t *np = realloc(s->sem_pos, (s->n_sem + n) * sizeof(*np) + 1);
  if (!np) return -ENOMEM;
  s->sem_pos = np;
  float *nsc = realloc(s->sem_scores, (s->n_sem + n) * sizeof(*nsc) + 1);
  if (!nsc) return -ENOMEM;
  s->sem_scores = nsc;
  memcpy(s->sem_pos + s->n_sem, positions, n * sizeof(*positions));
  memcpy(s->sem_scores + s->n_sem, scores, n * sizeof(*scores));
  s->n_sem += n;
  return CKV_OK;
}

int ckv_session_report(ckv_session *s, uint64_t round, uint64_t first_position, const float *attn, size_t n,
                       ckv_round_result *ret) {
  if (!s || (n && !attn)) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  /* The daemon may compress this round's tokens right after the report: every
   * asynchronous K/V write must have landed before it is sent. */
  int r = sync_streams(s);
  if (r < 0) return r;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ReportRound rr = COMMITKV__V1__REPORT_ROUND__INIT;
  rr.session_id = s->id;
  rr.round = round;
  rr.first_position = first_position;
  rr.attention = (ProtobufCBinaryData){n * 4u, (uint8_t *)attn};
  rr.semantic_positions = (ProtobufCBinaryData){s->n_sem * 4u, (uint8_t *)s->sem_pos};
  rr.semantic_scores = (ProtobufCBinaryData){s->n_sem * 4u, (uint8_t *)s->sem_scores};
  rr.recalled_blocks = s->recalled;
  req.body_case = COMMITKV__V1__REQUEST__BODY_REPORT_ROUND;
  req.report_round = &rr;
  Commitkv__V1__Response *rep;
  r = ckv_rpc(s->c, &req, &rep);
  s->n_sem = 0;
  s->recalled = 0;
  if (r < 0) return r;
  const Commitkv__V1__RoundReport *out = rep->round_report;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_ROUND_REPORT) {
    ckv_rpc_free(rep);
    return CKV_ERR_PROTO;
  }
  free(s->transitions);
  s->transitions = out->n_transitions ? calloc(out->n_transitions, sizeof(*s->transitions)) : NULL;
  if (out->n_transitions && !s->transitions) {
    ckv_rpc_free(rep);
    return -ENOMEM;
  }
  for (size_t i = 0; i < out->n_transitions; i++) {
    const Commitkv__V1__TransitionRange *t = out->transitions[i];
    s->transitions[i] = (ckv_transition){t->first_position, t->count, (uint8_t)t->from, (uint8_t)t->to};
  }
  /* After a report the daemon may move any draft token (promotion,
   * compaction): draft slots are writable only until the next report. */
  s->first_writable = s->n_tokens;
  if (out->epoch > s->epoch) s->epoch = out->epoch;
  if (ret)
    *ret = (ckv_round_result){.epoch = out->epoch, .pending = out->pending, .transitions = s->transitions,
                              .n_transitions = out->n_transitions};
  ckv_rpc_free(rep);
  return CKV_OK;
}

int ckv_session_prefetch(ckv_session *s, bool *ret_resident) {
  if (!s) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__Acquire a = COMMITKV__V1__ACQUIRE__INIT;
  a.session_id = s->id;
  a.prefetch = true;
  req.body_case = COMMITKV__V1__REQUEST__BODY_ACQUIRE;
  req.acquire = &a;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(s->c, &req, &rep);
  if (r < 0) return r;
  if (rep->body_case != COMMITKV__V1__RESPONSE__BODY_VIEW) {
    ckv_rpc_set_error(s->c, "session %s: Acquire answered without a view", s->id);
    ckv_rpc_free(rep);
    return CKV_ERR_PROTO;
  }
  if (ret_resident) *ret_resident = rep->view->resident;
  ckv_rpc_free(rep); /* the view itself is read with ckv_session_view */
  return CKV_OK;
}

int ckv_session_ack(ckv_session *s, uint64_t epoch, uint64_t *ret_reclaimed) {
  if (!s) return CKV_ERR_INVALID;
  if (stale(s)) return CKV_ERR_DAEMON_RESTARTED;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__AckEpoch a = COMMITKV__V1__ACK_EPOCH__INIT;
  a.session_id = s->id;
  a.epoch = epoch;
  req.body_case = COMMITKV__V1__REQUEST__BODY_ACK_EPOCH;
  req.ack_epoch = &a;
  Commitkv__V1__Response *rep;
  int r = ckv_rpc(s->c, &req, &rep);
  if (r < 0) return r;
  if (ret_reclaimed && rep->body_case == COMMITKV__V1__RESPONSE__BODY_EPOCH_ACKED)
    *ret_reclaimed = rep->epoch_acked->reclaimed_bytes;
  ckv_rpc_free(rep);
  return CKV_OK;
}

int ckv_session_ack_after_stream(ckv_session *s, uint64_t epoch, void *stream, uint64_t *ret_reclaimed) {
  if (!s) return CKV_ERR_INVALID;
#ifdef CKV_HAVE_CUDA_ARENA
  /* Memory of an older view may be reused as soon as the daemon has the ack:
   * whatever the GPU still has queued against it must be finished first. */
  if (stream) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) return cuda_failed(s, "cudaStreamSynchronize before the ack", e);
  } else if (ckv_rpc_memory(s->c) == CKV_RPC_MEM_CUDA) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return cuda_failed(s, "cudaDeviceSynchronize before the ack", e);
  }
#else
  if (stream) {
    ckv_rpc_set_error(s->c, "session %s: a CUDA stream was given, but this libcommitkv was built without CUDA", s->id);
    return CKV_ERR_UNSUPPORTED;
  }
#endif
  return ckv_session_ack(s, epoch, ret_reclaimed);
}

int ckv_session_cold_select_top(ckv_session *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                                float min_weight, size_t max_blocks, uint32_t *ret_idx, size_t *ret_n) {
  if (!s || !ret_n) return CKV_ERR_INVALID;
  if (!s->view_epoch) return CKV_ERR_STATE;
  if (s->view.n_cold && strcmp(ckv_client_memory_kind(s->c), "host") != 0) return CKV_ERR_UNSUPPORTED;
  return ckv_cold_select(&s->cold, &s->geom, &s->view, layer, q, n_q_heads, scale, min_weight, max_blocks, ret_idx,
                         ret_n);
}

int ckv_session_cold_select(ckv_session *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                            float min_weight, uint32_t *ret_idx, size_t *ret_n) {
  return ckv_session_cold_select_top(s, layer, q, n_q_heads, scale, min_weight, 0, ret_idx, ret_n);
}

int ckv_session_cold_gather(ckv_session *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                            uint32_t max_tokens, void *block, uint32_t capacity, uint32_t *ret_src, size_t *ret_n) {
  if (!s || !ret_n) return CKV_ERR_INVALID;
  if (!s->view_epoch) return CKV_ERR_STATE;
  if (s->view.n_cold && strcmp(ckv_client_memory_kind(s->c), "host") != 0) return CKV_ERR_UNSUPPORTED;
  return ckv_cold_gather(&s->cold, &s->gather, &s->geom, &s->view, layer, q, n_q_heads, scale, max_tokens, block,
                         capacity, ret_src, ret_n);
}

size_t ckv_session_cold_summary_bytes(const ckv_session *s) { return s ? ckv_cold_cache_bytes(s->cold, &s->geom) : 0; }

int ckv_session_note_recalled(ckv_session *s, uint64_t n) {
  if (!s) return CKV_ERR_INVALID;
  s->recalled += n;
  return CKV_OK;
}
