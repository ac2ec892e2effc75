/* handlers.c - one handler per request type, chosen from a table keyed by
 * the proto's oneof case.
 *
 * Every request is untrusted: each handler validates sizes, ids, geometry
 * and ownership before it touches state, and answers a failure with a code
 * and a sentence.  Sessions are looked up within the caller's tenant only, so
 * another tenant's session id answers NOT_FOUND, exactly like an unknown id. */
#include "daemon/handlers.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "daemon/attach.h"
#include "daemon/config.h"
#include "daemon/held.h"
#include "daemon/metrics.h"
#include "daemon/parked.h"
#include "daemon/reply.h"
#include "daemon/utf8.h"
#include "lifecycle/policy.h"
#include "lifecycle/trace.h"
#include "persist/autosave.h"
#include "persist/diskjob.h"
#include "persist/diskuse.h"
#include "persist/fencejob.h"
#include "persist/persist.h"
#include "persist/remote.h"
#include "persist/remote_snap.h"
#include "persist/savegame.h"
#include "persist/service.h"
#include "persist/session_snap.h"
#include "persist/snapdir.h"
#include "persist/snapio.h"
#include "persist/snapshot.h"
#include "persist/tier.h"
#include "persist/warm.h"
#include "shm/arena.h"
#include "store/cold.h"
#include "store/compressor.h"
#include "store/moves.h"
#include "store/prefix.h"
#include "store/shared.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

typedef struct reply_ctx {
  Commitkv__V1__Response *rep;
  uint64_t t0_us; /* when the request was taken up */
  char msg[512];
} reply_ctx;

typedef int (*handler_fn)(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x);

__attribute__((format(printf, 3, 4))) static int fail(reply_ctx *x, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->msg, sizeof(x->msg), fmt, ap);
  va_end(ap);
  ckv_utf8_trim(x->msg); /* a text cut at the buffer's end ends on a whole character */
  return code;
}

/* Echoing a client's string: at most this many bytes, cut on a character
 * boundary ("%.*s", ECHO(s)); the packing step repairs invalid bytes. */
#define ECHO_MAX 64
#define ECHO(str) ckv_utf8_prefix((str), ECHO_MAX), (str)

/* Why a float from a client is refused, or NULL when it is fine: finite and
 * >= 0, and <= 1 as well when `unit`.  `buf` holds the text. */
static const char *float_problem(float v, bool unit, char *buf, size_t len) {
  if (isnan(v)) return "is NaN";
  if (isinf(v)) return v > 0 ? "is inf" : "is -inf";
  if (v < 0.f) {
    snprintf(buf, len, "is negative (%g)", (double)v);
    return buf;
  }
  if (unit && v > 1.f) {
    snprintf(buf, len, "is %g, above 1", (double)v);
    return buf;
  }
  return NULL;
}

/* Refuses the first bad value of a float column with CKV_ERR_INVALID and a
 * text naming it ("attention[17] is NaN"); CKV_OK when all are fine. */
static int check_floats(reply_ctx *x, const char *what, const float *v, size_t n, bool unit) {
  char buf[48];
  for (size_t i = 0; i < n; i++) {
    const char *why = float_problem(v[i], unit, buf, sizeof(buf));
    if (why) return fail(x, CKV_ERR_INVALID, "%s[%zu] %s%s", what, i, why, unit ? " (scores are in [0,1])" : "");
  }
  return CKV_OK;
}

static void *new_msg(ckv_server *s, size_t size, const void *init) {
  void *p = ckv_wire_alloc(&s->out, size);
  if (p) memcpy(p, init, size);
  return p;
}
/* A reply sub-message from the scratch arena, initialised with its INIT value. */
#define NEW(s, type, init) ((type *)new_msg((s), sizeof(type), &(type)init))

/* Per-session overrides (OpenSession.params): the judge parameters whose
 * row in the lifecycle's table (lifecycle/policy.h) allows it, within that
 * row's bounds (the same as the [policy] section's). */
static int apply_params(const Commitkv__V1__OpenSession *o, ckv_judge_params *p, reply_ctx *x) {
  for (size_t i = 0; i < o->n_params; i++) {
    const char *key = o->params[i]->key;
    const ckv_judge_param *d = ckv_judge_param_find(key);
    if (!d || !d->per_session)
      return fail(x, CKV_ERR_INVALID, "unknown policy parameter '%.*s'", ECHO(key ? key : ""));
    char err[160];
    if (ckv_judge_param_set(p, d, o->params[i]->value, err, sizeof err) < 0)
      return fail(x, CKV_ERR_INVALID, "%s", err);
  }
  return CKV_OK;
}

/* Look a session up in the caller's tenant and check the caller owns it. */
static int find_session(ckv_server *s, ckv_conn *c, const char *id, bool need_owner, ckv_srv_session **ret,
                        reply_ctx *x) {
  if (!c->tenant) return fail(x, CKV_ERR_AUTH, "this client is attached without a tenant (admin only)");
  if (ckv_wire_check_session_id(id) < 0)
    return fail(x, CKV_ERR_INVALID, "session id must be 1..128 characters of [A-Za-z0-9._:-]");
  char key[256];
  ckv_store_session_key(c->tenant, id, key, sizeof(key));
  ckv_srv_session *sess = ckv_strmap_get(s->store.sessions, key);
  if (!sess) return fail(x, CKV_ERR_NOT_FOUND, "no session '%s'", id);
  if (need_owner && sess->owner != c->id) {
    if (sess->owner == 0) return fail(x, CKV_ERR_STATE, "session '%s' is detached: open it with resume", id);
    return fail(x, CKV_ERR_BUSY, "session '%s' is attached to another client", id);
  }
  *ret = sess;
  return CKV_OK;
}

/* The refusal every changing request on a quarantined session gets. */
static int quarantined(const ckv_srv_session *sess, reply_ctx *x) {
  return fail(x, CKV_ERR_CORRUPT, "session '%s' is quarantined: %s; drop it and open a new one", sess->id,
              sess->quarantine_reason);
}

static Commitkv__V1__ArenaInfo **arena_infos(ckv_server *s, const ckv_tenant *t, size_t *ret_n) {
  *ret_n = 0;
  if (!t) return NULL;
  Commitkv__V1__ArenaInfo **v = ckv_wire_alloc(&s->out, sizeof(*v));
  Commitkv__V1__ArenaInfo *a = NEW(s, Commitkv__V1__ArenaInfo, COMMITKV__V1__ARENA_INFO__INIT);
  if (!v || !a) return NULL;
  a->arena_id = t->arena_id;
  a->kind = (char *)ckv_arena_kind(t->arena);
  a->bytes = ckv_arena_size(t->arena);
  a->device_uuid = (char *)t->device_uuid;
  /* What can travel without SCM_RIGHTS: generation, committed prefix and the
   * opaque handle (legacy CUDA IPC: the 64-byte cudaIpcMemHandle_t).  Only
   * this tenant's connections ever get here. */
  ckv_arena_desc d;
  uint8_t *handle;
  if (ckv_arena_export(t->arena, &d) == CKV_OK) {
    a->generation = d.generation;
    a->committed = d.committed;
    if (d.handle_len && (handle = ckv_wire_alloc(&s->out, d.handle_len))) {
      memcpy(handle, d.handle, d.handle_len);
      a->handle = (ProtobufCBinaryData){d.handle_len, handle};
    }
  }
  v[0] = a;
  *ret_n = 1;
  return v;
}

static int h_hello(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__Hello *h = req->hello;
  uint32_t lo = h->min_version ? h->min_version : 1, hi = h->max_version ? h->max_version : 1;
  if (lo > CKV_PROTOCOL_VERSION || hi < CKV_PROTOCOL_VERSION)
    return fail(x, CKV_ERR_VERSION, "client speaks versions %u..%u, this daemon speaks %u", lo, hi,
                CKV_PROTOCOL_VERSION);
  Commitkv__V1__Welcome *w = NEW(s, Commitkv__V1__Welcome, COMMITKV__V1__WELCOME__INIT);
  if (!w) return -ENOMEM;
  c->hello = true;
  c->version = CKV_PROTOCOL_VERSION;
  /* Repaired and cut on a character boundary: the name goes to logs. */
  if (h->client_name && *h->client_name)
    ckv_utf8_copy(c->name, sizeof(c->name), h->client_name, strlen(h->client_name));
  w->version = CKV_PROTOCOL_VERSION;
  w->tenant = c->tenant ? c->tenant->name : "";
  w->client_id = c->id;
  w->lease_ms = s->opt.lease_ms;
  w->heartbeat_ms = s->opt.heartbeat_ms;
  w->max_message_bytes = s->opt.max_message;
  w->max_tokens_per_session = s->opt.max_tokens_per_session;
  w->arenas = arena_infos(s, c->tenant, &w->n_arenas);
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_WELCOME;
  x->rep->welcome = w;
  return CKV_OK;
}

static Commitkv__V1__Geometry *geometry_msg(ckv_server *s, const ckv_srv_session *sess) {
  Commitkv__V1__Geometry *g = NEW(s, Commitkv__V1__Geometry, COMMITKV__V1__GEOMETRY__INIT);
  if (!g) return NULL;
  g->n_layers = sess->geom.n_layers;
  g->n_kv_heads = sess->geom.n_kv_heads;
  g->head_dim = sess->geom.head_dim;
  g->dtype = (Commitkv__V1__Dtype)sess->geom.dtype;
  g->draft_block_tokens = sess->draft_tokens;
  g->commit_block_tokens = sess->commit_tokens;
  return g;
}

static int opened_reply(ckv_server *s, ckv_srv_session *sess, bool resumed, reply_ctx *x) {
  Commitkv__V1__SessionOpened *o = NEW(s, Commitkv__V1__SessionOpened, COMMITKV__V1__SESSION_OPENED__INIT);
  if (!o || !(o->geometry = geometry_msg(s, sess))) return -ENOMEM;
  o->session_id = sess->id;
  o->model_id = sess->model_id;
  o->model_revision = sess->model_revision;
  o->resumed = resumed;
  o->epoch = sess->epoch;
  o->n_tokens = sess->tokens.n;
  o->policy = sess->policy;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_SESSION_OPENED;
  x->rep->session_opened = o;
  return CKV_OK;
}

/* NOT_FOUND for a resume of an id nobody holds, saying so when the warm
 * restart at start dropped it (warm.h): what could not be kept is said. */
static int not_resumable(const ckv_server *s, const ckv_conn *c, const char *id, reply_ctx *x) {
  const char *why = ckv_warm_dropped(&s->persist, c->tenant->name, id);
  if (why)
    return fail(x, CKV_ERR_NOT_FOUND, "no session '%s' to resume: the daemon's warm restart dropped it: %s", id, why);
  if ((why = ckv_warm_unclean(&s->persist))) return fail(x, CKV_ERR_NOT_FOUND, "no session '%s' to resume (%s)", id, why);
  return fail(x, CKV_ERR_NOT_FOUND, "no session '%s' to resume", id);
}

/* A model id or revision from a client: at most 128 bytes, no control
 * characters (it goes to logs and into snapshot headers). */
static int check_model_name(const char *what, const char *v, reply_ctx *x) {
  size_t n = v ? strnlen(v, CKV_SESSION_MODEL_MAX + 1) : 0;
  if (n > CKV_SESSION_MODEL_MAX) return fail(x, CKV_ERR_INVALID, "%s is longer than %d bytes", what, CKV_SESSION_MODEL_MAX);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) return fail(x, CKV_ERR_INVALID, "%s holds a control character", what);
  return CKV_OK;
}

static const char *str_or_empty(const char *v) { return v ? v : ""; }

static int restore_session(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, const char *id,
                           const char *name, const char *model_id, const char *model_revision,
                           const Commitkv__V1__Geometry *geom, bool resume, reply_ctx *x);

static int prefix_ids(ckv_server *s, const ProtobufCBinaryData *b, const char *what, const uint32_t **ret,
                      size_t *ret_n, reply_ctx *x);
static void *column(ckv_server *s, const ProtobufCBinaryData *b);

static int h_open(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__OpenSession *o = req->open_session;
  if (!c->tenant) return fail(x, CKV_ERR_AUTH, "this client is attached without a tenant (admin only)");
  if (ckv_wire_check_session_id(o->session_id) < 0)
    return fail(x, CKV_ERR_INVALID, "session id must be 1..128 characters of [A-Za-z0-9._:-]");
  int mr = check_model_name("model_id", o->model_id, x);
  if (mr == CKV_OK) mr = check_model_name("model_revision", o->model_revision, x);
  if (mr < 0) return mr;
  const char *model_id = str_or_empty(o->model_id), *model_revision = str_or_empty(o->model_revision);
  ckv_judge_params params = *s->opt.policy;
  int pid = o->policy && *o->policy ? ckv_policy_from_name(o->policy)
                                    : (c->tenant->default_policy >= 0 ? c->tenant->default_policy : params.policy);
  if (pid < 0)
    return fail(x, CKV_ERR_INVALID, "unknown policy '%.*s' (commitkv, fp16, int8, kivi4, kivi2, h2o, streaming)",
                ECHO(o->policy));
  if (c->tenant->policies && !(c->tenant->policies & (1u << pid)))
    return fail(x, CKV_ERR_AUTH, "policy '%s' is not allowed for tenant '%s'", ckv_policy_names[pid],
                c->tenant->name);
  params.policy = pid;
  if (pid == CKV_POLICY_KIVI2) params.commit_bits = 2;
  if (pid == CKV_POLICY_KIVI4) params.commit_bits = 4;
  int pr = apply_params(o, &params, x);
  if (pr < 0) return pr;
  if (pid == CKV_POLICY_KIVI2 || pid == CKV_POLICY_KIVI4) params.rotate = 0; /* the baselines stay KIVI's */
  const char *policy = ckv_policy_names[pid];
  int r0;
  char key[256];
  ckv_store_session_key(c->tenant, o->session_id, key, sizeof(key));
  ckv_srv_session *sess = ckv_strmap_get(s->store.sessions, key);
  if (o->resume) {
    if (!sess) {
      /* Only a snapshot of it, if any (a daemon restart, a save game):
       * restore it; no snapshot either: NOT_FOUND. */
      return restore_session(s, c, req, o->session_id, o->session_id, model_id, model_revision, o->geometry,
                             /* resume= */ true, x);
    }
    if (strcmp(sess->model_id, model_id) != 0 || strcmp(sess->model_revision, model_revision) != 0)
      return fail(x, CKV_ERR_FORMAT, "session '%s' holds K/V of model '%s' revision '%s', not '%.*s' revision '%.*s'",
                  o->session_id, sess->model_id, sess->model_revision, ECHO(model_id), ECHO(model_revision));
    if (sess->owner && sess->owner != c->id)
      return fail(x, CKV_ERR_BUSY, "session '%s' is attached to another client", o->session_id);
    const Commitkv__V1__Geometry *g = o->geometry;
    if (g && g->n_layers && (g->n_layers != sess->geom.n_layers || g->n_kv_heads != sess->geom.n_kv_heads ||
                             g->head_dim != sess->geom.head_dim || (uint32_t)g->dtype != sess->geom.dtype))
      return fail(x, CKV_ERR_FORMAT, "session '%s' has another geometry", o->session_id);
    if (!sess->owner) s->counters.sessions_resumed++;
    sess->owner = c->id;
    sess->warm_unresumed = false;
    sess->acked_epoch = 0;
    ckv_log(CKV_LOG_INFO, "session-resume", c->tenant->name, sess->id, "resumed by client %llu",
            (unsigned long long)c->id);
    return opened_reply(s, sess, true, x);
  }
  if (sess) return fail(x, CKV_ERR_EXISTS, "session '%s' exists (use resume to attach to it)", o->session_id);
  if (!o->geometry) return fail(x, CKV_ERR_INVALID, "OpenSession needs a geometry");
  const uint32_t *reuse_ids = NULL;
  size_t n_reuse = 0;
  if (o->reuse_prefix && (r0 = prefix_ids(s, &o->token_ids, "open_session.token_ids", &reuse_ids, &n_reuse, x)) < 0)
    return r0;
  ckv_geometry g = {o->geometry->n_layers, o->geometry->n_kv_heads, o->geometry->head_dim,
                    (uint32_t)o->geometry->dtype};
  uint32_t dt = o->geometry->draft_block_tokens ? o->geometry->draft_block_tokens : s->opt.draft_block_tokens;
  uint32_t ct = o->geometry->commit_block_tokens ? o->geometry->commit_block_tokens : s->opt.commit_block_tokens;
  int r = ckv_srv_session_check_geometry(&g, &dt, &ct);
  if (r == CKV_ERR_LIMIT)
    return fail(x, r, "geometry beyond limits (layers <= %u, kv heads <= %u, head_dim <= %u, block tokens <= %u, "
                      "committed block tokens >= 32)",
                CKV_MAX_LAYERS, CKV_MAX_KV_HEADS, CKV_MAX_HEAD_DIM, CKV_MAX_BLOCK_TOKENS);
  if (r < 0) return fail(x, r, "invalid geometry: every size must be > 0, head_dim even, dtype fp16 or bf16");
  if (ckv_draft_block_bytes(&g, dt) > c->tenant->quota_bytes)
    return fail(x, CKV_ERR_QUOTA, "one draft block (%zu bytes) exceeds the tenant quota",
                ckv_draft_block_bytes(&g, dt));
  if (c->tenant->n_sessions >= c->tenant->max_sessions)
    return fail(x, CKV_ERR_LIMIT, "tenant '%s' has its maximum of %u sessions", c->tenant->name,
                c->tenant->max_sessions);
  r = ckv_srv_session_new(o->session_id, c->tenant, &g, dt, ct, policy, &params, &s->store.next_block_id, &sess);
  if (r < 0) return fail(x, r, "cannot create session: %s", ckv_strerror(r));
  snprintf(sess->model_id, sizeof sess->model_id, "%s", model_id);
  snprintf(sess->model_revision, sizeof sess->model_revision, "%s", model_revision);
  if ((r = ckv_store_add_session(&s->store, sess, c->id)) < 0) return fail(x, r, "out of memory");
  char err[320];
  if ((r = ckv_persist_begin_conversation(&s->persist, sess, err, sizeof err)) < 0) {
    ckv_store_drop_session(&s->store, sess);
    return fail(x, r, "cannot open session '%s': %s", o->session_id, err);
  }
  ckv_autosave_session_new(&s->persist, sess, false); /* a crash copy of an earlier session of this id goes */
  size_t matched = 0;
  sess->declared_prefix_tokens = n_reuse;
  if (n_reuse && (r = ckv_prefix_attach(sess, reuse_ids, n_reuse, &matched)) < 0) {
    ckv_store_drop_session(&s->store, sess);
    return fail(x, r, "cannot open session '%s' on a shared prefix: %s", o->session_id, ckv_strerror(r));
  }
  char shared[64] = "";
  if (o->reuse_prefix) snprintf(shared, sizeof shared, ", %zu of %zu prefix tokens shared", matched, n_reuse);
  ckv_log(CKV_LOG_INFO, "session-open", c->tenant->name, sess->id, "%u layers x %u kv heads x %u dims, policy %s%s",
          g.n_layers, g.n_kv_heads, g.head_dim, policy, shared);
  if ((r = opened_reply(s, sess, false, x)) < 0) return r;
  x->rep->session_opened->matched_tokens = matched;
  return CKV_OK;
}

/* A token_ids column of a prefix request: n x uint32, n <= the per-session
 * token cap; copied out of the (possibly unaligned) message. */
static int prefix_ids(ckv_server *s, const ProtobufCBinaryData *b, const char *what, const uint32_t **ret,
                      size_t *ret_n, reply_ctx *x) {
  if (b->len % 4) return fail(x, CKV_ERR_INVALID, "%s must hold uint32 values (%zu bytes)", what, b->len);
  size_t n = b->len / 4;
  if (n > s->opt.max_tokens_per_session)
    return fail(x, CKV_ERR_LIMIT, "%s holds %zu tokens, more than max_tokens_per_session (%llu)", what, n,
                (unsigned long long)s->opt.max_tokens_per_session);
  const uint32_t *ids = column(s, b);
  if (n && !ids) return -ENOMEM;
  *ret = ids;
  *ret_n = n;
  return CKV_OK;
}

static int h_lookup_prefix(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__LookupPrefix *l = req->lookup_prefix;
  if (!c->tenant) return fail(x, CKV_ERR_AUTH, "this client is attached without a tenant (admin only)");
  int r = check_model_name("model_id", l->model_id, x);
  if (r == CKV_OK) r = check_model_name("model_revision", l->model_revision, x);
  const uint32_t *ids = NULL;
  size_t n = 0;
  if (r == CKV_OK) r = prefix_ids(s, &l->token_ids, "lookup_prefix.token_ids", &ids, &n, x);
  if (r < 0) return r;
  Commitkv__V1__PrefixMatch *m = NEW(s, Commitkv__V1__PrefixMatch, COMMITKV__V1__PREFIX_MATCH__INIT);
  if (!m) return -ENOMEM;
  m->matched_tokens = n ? ckv_prefix_lookup(c->tenant, str_or_empty(l->model_id), str_or_empty(l->model_revision), ids, n)
                        : 0;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_PREFIX_MATCH;
  x->rep->prefix_match = m;
  return CKV_OK;
}

static int h_fork(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__ForkSession *f = req->fork_session;
  ckv_srv_session *parent, *child = NULL;
  /* any client of the tenant may fork (a sub-agent may run in another process) */
  int r = find_session(s, c, f->parent_id, /* need_owner= */ false, &parent, x);
  if (r < 0) return r;
  if (parent->quarantined) return quarantined(parent, x);
  if (ckv_wire_check_session_id(f->new_id) < 0)
    return fail(x, CKV_ERR_INVALID, "new_id must be 1..128 characters of [A-Za-z0-9._:-]");
  if (ckv_store_session(&s->store, c->tenant, f->new_id))
    return fail(x, CKV_ERR_EXISTS, "session '%s' exists", f->new_id);
  if (c->tenant->n_sessions >= c->tenant->max_sessions)
    return fail(x, CKV_ERR_LIMIT, "tenant '%s' has its maximum of %u sessions", c->tenant->name,
                c->tenant->max_sessions);
  uint64_t at = f->at_position ? f->at_position : parent->reported_tokens;
  if (at == 0) return fail(x, CKV_ERR_INVALID, "session '%s' has no reported tokens to fork from", parent->id);
  if (at > parent->tokens.n)
    return fail(x, CKV_ERR_RANGE, "at_position %llu is beyond the parent's %zu tokens", (unsigned long long)at,
                parent->tokens.n);
  ckv_store_settle_session(&s->store, parent); /* moves in flight land first: their tokens' blocks are known */
  r = ckv_srv_session_new(f->new_id, c->tenant, &parent->geom, parent->draft_tokens, parent->commit_tokens,
                          parent->policy, &parent->params, &s->store.next_block_id, &child);
  if (r < 0) return fail(x, r, "cannot create session: %s", ckv_strerror(r));
  snprintf(child->model_id, sizeof child->model_id, "%s", parent->model_id);
  snprintf(child->model_revision, sizeof child->model_revision, "%s", parent->model_revision);
  if ((r = ckv_store_add_session(&s->store, child, c->id)) < 0) return fail(x, r, "out of memory");
  char err[320];
  if ((r = ckv_persist_begin_conversation(&s->persist, child, err, sizeof err)) < 0) {
    ckv_store_drop_session(&s->store, child);
    return fail(x, r, "cannot open session '%s': %s", f->new_id, err);
  }
  ckv_autosave_session_new(&s->persist, child, false);
  size_t shared = 0;
  if ((r = ckv_prefix_fork(parent, child, (size_t)at, &shared, err, sizeof err)) < 0) {
    ckv_store_drop_session(&s->store, child);
    if (r == CKV_ERR_STATE || r == CKV_ERR_UNSUPPORTED)
      return fail(x, r, "cannot fork session '%s' at %llu: %s", parent->id, (unsigned long long)at, err);
    return fail(x, r, "cannot fork session '%s': %s", parent->id, ckv_strerror(r));
  }
  ckv_log(CKV_LOG_INFO, "session-fork", c->tenant->name, child->id, "forked from '%s' at %llu (%zu tokens shared)",
          parent->id, (unsigned long long)at, shared);
  if ((r = opened_reply(s, child, false, x)) < 0) return r;
  x->rep->session_opened->matched_tokens = shared;
  return CKV_OK;
}

/* Copy a packed little-endian column out of a (possibly unaligned) bytes field. */
static void *column(ckv_server *s, const ProtobufCBinaryData *b) {
  if (!b->len) return NULL;
  void *p = ckv_wire_alloc(&s->out, b->len);
  if (p) memcpy(p, b->data, b->len);
  return p;
}

static Commitkv__V1__TransitionRange **transitions_msg(ckv_server *s, const ckv_transition_list *l, size_t *ret_n) {
  Commitkv__V1__TransitionRange **v = ckv_wire_alloc(&s->out, (l->n + 1) * sizeof(*v));
  if (!v) return NULL;
  for (size_t i = 0; i < l->n; i++) {
    Commitkv__V1__TransitionRange *tr = NEW(s, Commitkv__V1__TransitionRange, COMMITKV__V1__TRANSITION_RANGE__INIT);
    if (!tr) return NULL;
    tr->first_position = l->v[i].first;
    tr->count = l->v[i].count;
    tr->from = (Commitkv__V1__TokenState)l->v[i].from;
    tr->to = (Commitkv__V1__TokenState)l->v[i].to;
    v[i] = tr;
  }
  *ret_n = l->n;
  return v;
}

static int h_append(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__AppendTokens *a = req->append_tokens;
  ckv_srv_session *sess;
  int r = find_session(s, c, a->session_id, true, &sess, x);
  if (r < 0) return r;
  if (sess->quarantined) return quarantined(sess, x);
  uint32_t n = a->count;
  if (n == 0) return fail(x, CKV_ERR_INVALID, "count must be > 0");
  if (n > s->opt.max_append) return fail(x, CKV_ERR_LIMIT, "at most %u tokens per AppendTokens", s->opt.max_append);
  if (sess->tokens.n + n > s->opt.max_tokens_per_session)
    return fail(x, CKV_ERR_LIMIT, "session would exceed max_tokens_per_session (%llu)",
                (unsigned long long)s->opt.max_tokens_per_session);
  if (a->roles.len && a->roles.len != n) return fail(x, CKV_ERR_INVALID, "roles must have count bytes");
  if (a->tags.len && a->tags.len != n) return fail(x, CKV_ERR_INVALID, "tags must have count bytes");
  if (a->semantic.len && a->semantic.len != 4ull * n)
    return fail(x, CKV_ERR_INVALID, "semantic must have count float32 values");
  if (a->token_ids.len && a->token_ids.len != 4ull * n)
    return fail(x, CKV_ERR_INVALID, "token_ids must have count uint32 values");
  for (size_t i = 0; i < a->roles.len; i++)
    if (a->roles.data[i] > COMMITKV__V1__ROLE__ROLE_TOOL) return fail(x, CKV_ERR_INVALID, "role %zu is unknown", i);
  float *sem = column(s, &a->semantic);
  uint32_t *ids = column(s, &a->token_ids);
  if ((a->semantic.len && !sem) || (a->token_ids.len && !ids)) return -ENOMEM;
  if (sem && (r = check_floats(x, "semantic", sem, n, /* unit= */ true)) < 0) return r;
  size_t max_runs = ckv_srv_session_max_runs(sess, n), n_runs = 0;
  ckv_slot_run *runs = ckv_wire_alloc(&s->out, max_runs * sizeof(*runs));
  Commitkv__V1__TokensAppended *t = NEW(s, Commitkv__V1__TokensAppended, COMMITKV__V1__TOKENS_APPENDED__INIT);
  if (!runs || !t) return -ENOMEM;
  uint64_t first;
  ckv_transition_list made_room = {0};
  uint64_t need = ckv_srv_session_append_bytes(sess, n);
  if (need && !ckv_tenant_would_fit(sess->tenant, need)) {
    /* Quota pressure: the tenant's coldest other sessions go to disk first
     * (lossless; the reply waits for them, tier.h), then this session makes
     * room before refusing, cheapest
     * loss first: compress draft -> staged, then staged -> committed, then
     * recycle the least valuable tokens (the reply reports every transition). */
    if (ckv_tier_make_room(&s->persist, sess, need, s->reply_armed) == CKV_TIER_PARK &&
        (r = ckv_parked_add(s, c, NULL, req)) == CKV_REPLY_DEFERRED)
      return r; /* served again once those sessions are on disk (out of memory to park it: the old way) */
    ckv_store_settle_session(&s->store, sess);
    for (int from = CKV_STATE_DRAFT; from <= CKV_STATE_STAGED && !ckv_tenant_would_fit(sess->tenant, need); from++) {
      if (ckv_moves_escalate(sess, s->store.compressor, from, &made_room) <= 0) continue;
      ckv_store_settle_session(&s->store, sess);
      ckv_srv_session_release_retired(sess); /* the requester re-reads its view from this reply */
    }
    uint64_t recycled = 0;
    r = ckv_moves_reclaim(sess, s->store.compressor, need, &made_room, &recycled);
    if (recycled)
      ckv_log(CKV_LOG_NOTICE, "quota-reclaim", c->tenant->name, sess->id, "recycled %llu tokens to make room",
              (unsigned long long)recycled);
  }
  r = ckv_srv_session_append(sess, n, a->roles.len ? a->roles.data : NULL, a->tags.len ? a->tags.data : NULL, sem,
                             ids, runs, &n_runs, &first);
  if (r == CKV_OK && made_room.n) {
    t->transitions = transitions_msg(s, &made_room, &t->n_transitions);
    if (!t->transitions) r = -ENOMEM;
  }
  if (r < 0 && made_room.n)
    ckv_log(CKV_LOG_NOTICE, "quota-escalate", c->tenant->name, sess->id,
            "refused append after compressing %zu token ranges (no token was recycled)", made_room.n);
  ckv_transition_list_done(&made_room);
  if (r == CKV_ERR_QUOTA)
    return fail(x, r, "tenant '%s' quota of %llu bytes reached (%llu used)", c->tenant->name,
                (unsigned long long)c->tenant->quota_bytes, (unsigned long long)c->tenant->bytes_used);
  if (r < 0) return fail(x, r, "append failed: %s", ckv_strerror(r));
  ckv_prefix_note_append(sess, first, n, ids); /* content keys of its blocks (store/prefix.h) */
  t->first_position = first;
  t->count = n;
  t->epoch = sess->epoch;
  t->slots = ckv_wire_alloc(&s->out, n_runs * sizeof(*t->slots));
  if (!t->slots) return -ENOMEM;
  for (size_t i = 0; i < n_runs; i++) {
    Commitkv__V1__SlotRun *sr = NEW(s, Commitkv__V1__SlotRun, COMMITKV__V1__SLOT_RUN__INIT);
    if (!sr) return -ENOMEM;
    const ckv_sblock *b = &sess->blocks[runs[i].block];
    sr->block_id = b->id;
    sr->arena_id = sess->tenant->arena_id;
    sr->block_offset = b->offset;
    sr->capacity = b->capacity;
    sr->first_slot = runs[i].first_slot;
    sr->count = runs[i].count;
    sr->first_position = runs[i].first_position;
    t->slots[i] = sr;
  }
  t->n_slots = n_runs;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_TOKENS_APPENDED;
  x->rep->tokens_appended = t;
  return CKV_OK;
}

static int h_report(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__ReportRound *rr = req->report_round;
  ckv_srv_session *sess;
  int r = find_session(s, c, rr->session_id, true, &sess, x);
  if (r < 0) return r;
  if (sess->quarantined) return quarantined(sess, x);
  if (rr->attention.len % 4) return fail(x, CKV_ERR_INVALID, "attention must hold float32 values");
  if (rr->semantic_positions.len % 4 || rr->semantic_positions.len != rr->semantic_scores.len)
    return fail(x, CKV_ERR_INVALID, "semantic_positions and semantic_scores must pair uint32 with float32");
  size_t n = rr->attention.len / 4, m = rr->semantic_positions.len / 4;
  /* Positions are checked without ever computing a sum that can wrap. */
  const unsigned long long first = rr->first_position;
  if (n > UINT64_MAX - first)
    return fail(x, CKV_ERR_RANGE, "first_position %llu + %zu tokens overflows", first, n);
  if (first > sess->tokens.n)
    return fail(x, CKV_ERR_RANGE, "positions %llu.. are beyond the session's %zu tokens", first, sess->tokens.n);
  if (n > sess->tokens.n - first)
    return fail(x, CKV_ERR_RANGE, "attention covers positions %llu..%llu but the session has %zu tokens", first,
                first + n - 1, sess->tokens.n);
  float *attn = column(s, &rr->attention), *scores = column(s, &rr->semantic_scores);
  uint32_t *pos = column(s, &rr->semantic_positions);
  if ((n && !attn) || (m && (!scores || !pos))) return -ENOMEM;
  /* Nothing of the round is applied unless every value is good. */
  if ((r = check_floats(x, "attention", attn, n, /* unit= */ false)) < 0) return r;
  if ((r = check_floats(x, "semantic_scores", scores, m, /* unit= */ true)) < 0) return r;
  for (size_t i = 0; i < m; i++)
    if (pos[i] >= sess->tokens.n)
      return fail(x, CKV_ERR_RANGE, "semantic_positions[%zu] = %u is beyond the session's %zu tokens", i, pos[i],
                  sess->tokens.n);
  if (rr->round == 0) return fail(x, CKV_ERR_INVALID, "rounds start at 1");
  /* before the round is recorded: which demoted tokens it found attended (store/cold.h) */
  if (rr->round > sess->last_round && (r = ckv_cold_note_report(sess, rr->first_position, attn, n)) < 0) return r;
  r = ckv_srv_session_report_round(sess, rr->round, rr->first_position, attn, n, pos, scores, m);
  if (r == CKV_ERR_INVALID)
    return fail(x, r, "round %llu does not follow round %llu", (unsigned long long)rr->round,
                (unsigned long long)sess->last_round);
  if (r < 0) return fail(x, r, "bad round report: %s", ckv_strerror(r));
  s->counters.rounds++;
  sess->recalled_blocks += rr->recalled_blocks < sess->n_blocks ? rr->recalled_blocks : sess->n_blocks;
  if (s->trace) {
    /* returns an error once, when it stops recording (limit or I/O) */
    int tr = ckv_trace_round(s->trace, sess->lane, (uint32_t)rr->round, &sess->tokens, &sess->params);
    if (tr < 0)
      ckv_log(CKV_LOG_WARNING, "trace", sess->tenant->name, sess->id, "trace stopped: %s", ckv_strerror(tr));
  }
  /* Blocks the worker is now past can be matched by other sessions (before
   * the judge: a block published now is planned as shared only when another
   * session holds it too). */
  ckv_prefix_publish(sess);
  ckv_transition_list decided = {0};
  r = ckv_moves_round(sess, s->store.compressor, (uint32_t)rr->round, &decided);
  for (size_t i = 0; i < decided.n; i++) c->tenant->recycle_runs += decided.v[i].to == CKV_STATE_RECYCLED;
  ckv_metrics_observe_round_tenant(s->metrics, c->tenant->name, (double)(ckv_now_us() - x->t0_us) * 1e-6);
  Commitkv__V1__RoundReport *out = NEW(s, Commitkv__V1__RoundReport, COMMITKV__V1__ROUND_REPORT__INIT);
  if (out && decided.n) out->transitions = transitions_msg(s, &decided, &out->n_transitions);
  bool oom = !out || (decided.n && !out->transitions);
  ckv_transition_list_done(&decided);
  if (oom) return -ENOMEM;
  if (r < 0) ckv_log(CKV_LOG_ERROR, "lifecycle", sess->tenant->name, sess->id, "planning moves: %s", ckv_strerror(r));
  out->round = rr->round;
  out->epoch = sess->epoch;
  out->pending = (uint32_t)ckv_moves_pending(sess);
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_ROUND_REPORT;
  x->rep->round_report = out;
  return CKV_OK;
}

static int h_ack(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  ckv_srv_session *sess;
  int r = find_session(s, c, req->ack_epoch->session_id, true, &sess, x);
  if (r < 0) return r;
  uint64_t reclaimed = 0;
  r = ckv_srv_session_ack(sess, req->ack_epoch->epoch, &reclaimed);
  if (r < 0)
    return fail(x, r, "epoch %llu is beyond the current epoch %llu", (unsigned long long)req->ack_epoch->epoch,
                (unsigned long long)sess->epoch);
  Commitkv__V1__EpochAcked *e = NEW(s, Commitkv__V1__EpochAcked, COMMITKV__V1__EPOCH_ACKED__INIT);
  if (!e) return -ENOMEM;
  e->epoch = sess->acked_epoch;
  e->reclaimed_bytes = reclaimed;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_EPOCH_ACKED;
  x->rep->epoch_acked = e;
  return CKV_OK;
}

static int view_reply(ckv_server *s, ckv_srv_session *sess, reply_ctx *x) {
  Commitkv__V1__View *v = NEW(s, Commitkv__V1__View, COMMITKV__V1__VIEW__INIT);
  if (!v) return -ENOMEM;
  v->resident = true; /* a view is answered only once the session is back (the tier parks the request, parked.h) */
  v->tier = (char *)"primary";
  /* lists: draft, staged, committed, cold (store/cold.h) */
  size_t counts[4] = {0};
  uint8_t *list_of = sess->n_blocks ? ckv_wire_alloc(&s->out, sess->n_blocks) : NULL;
  if (sess->n_blocks && !list_of) return -ENOMEM;
  for (size_t i = 0; i < sess->n_blocks; i++) {
    uint8_t f = sess->blocks[i].format;
    if (f == CKV_BLOCK_UNUSED) continue;
    list_of[i] = f == CKV_FORMAT_DRAFT ? 0 : f == CKV_FORMAT_STAGED ? 1 : ckv_cold_block(sess, (uint32_t)i) ? 3 : 2;
    counts[list_of[i]]++;
  }
  Commitkv__V1__BlockRef **lists[4];
  for (int k = 0; k < 4; k++) {
    lists[k] = counts[k] ? ckv_wire_alloc(&s->out, counts[k] * sizeof(*lists[k])) : NULL;
    if (counts[k] && !lists[k]) return -ENOMEM;
  }
  size_t fill[4] = {0};
  for (size_t i = 0; i < sess->n_blocks; i++) {
    const ckv_sblock *b = &sess->blocks[i];
    if (b->format == CKV_BLOCK_UNUSED) continue;
    int k = list_of[i];
    Commitkv__V1__BlockRef *ref = NEW(s, Commitkv__V1__BlockRef, COMMITKV__V1__BLOCK_REF__INIT);
    if (!ref) return -ENOMEM;
    ref->block_id = b->id;
    ref->arena_id = sess->tenant->arena_id;
    ref->offset = b->offset;
    ref->bytes = b->bytes;
    ref->format = (Commitkv__V1__BlockFormat)b->format;
    ref->capacity = b->capacity;
    lists[k][fill[k]++] = ref;
  }
  v->epoch = sess->epoch;
  v->n_tokens = sess->tokens.n;
  v->draft = lists[0];
  v->n_draft = counts[0];
  v->staged = lists[1];
  v->n_staged = counts[1];
  v->committed = lists[2];
  v->n_committed = counts[2];
  v->cold = lists[3];
  v->n_cold = counts[3];
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_VIEW;
  x->rep->view = v;
  return CKV_OK;
}

static int h_view(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  ckv_srv_session *sess;
  int r = find_session(s, c, req->get_view->session_id, true, &sess, x);
  if (r < 0) return r;
  c->tenant->hits++; /* host backend: every block is resident */
  c->tenant->hit_tokens += sess->tokens.n;
  if (req->get_view->known_epoch && req->get_view->known_epoch == sess->epoch) {
    Commitkv__V1__View *v = NEW(s, Commitkv__V1__View, COMMITKV__V1__VIEW__INIT);
    if (!v) return -ENOMEM;
    v->epoch = sess->epoch;
    v->n_tokens = sess->tokens.n;
    v->unchanged = true;
    x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_VIEW;
    x->rep->view = v;
    return CKV_OK;
  }
  return view_reply(s, sess, x);
}

static int h_acquire(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  /* A session on disk was parked by the tier gate until it is back, unless
   * this is a prefetch: the gate started the read, and the answer is now. */
  ckv_srv_session *sess;
  int r = find_session(s, c, req->acquire->session_id, true, &sess, x);
  if (r < 0) return r;
  ckv_tier_state ts = ckv_tier_state_of(sess);
  if (req->acquire->prefetch && ts != CKV_TIER_RESIDENT && ts != CKV_TIER_OFFLOADING) {
    Commitkv__V1__View *v = NEW(s, Commitkv__V1__View, COMMITKV__V1__VIEW__INIT);
    if (!v) return -ENOMEM;
    v->epoch = sess->epoch;
    v->n_tokens = sess->tokens.n;
    v->resident = false;
    v->tier = (char *)ckv_tier_state_name(ts);
    x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_VIEW;
    x->rep->view = v;
    return CKV_OK;
  }
  c->tenant->hits++;
  c->tenant->hit_tokens += sess->tokens.n;
  return view_reply(s, sess, x);
}

static int h_close(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  ckv_srv_session *sess;
  int r = find_session(s, c, req->close_session->session_id, true, &sess, x);
  if (r < 0) return r;
  ckv_attach_detach_session(s, sess);
  ckv_log(CKV_LOG_INFO, "session-close", sess->tenant->name, sess->id, "detached; kept %llu ms for resume",
          (unsigned long long)s->opt.detach_keep_ms);
  return CKV_OK;
}

/* A drop whose reply waits for the store fence (fencejob.h). */
typedef struct drop_wait {
  ckv_server *s;
  ckv_reply_to to;
  char id[CKV_SNAP_ID_MAX + 1];
} drop_wait;

/* The drop's reply: code 0 (the conversation is ended), with a text when
 * the store did not take the fence or the delete. */
static void drop_answered(void *ctx, int status, const char *text) {
  drop_wait *w = ctx;
  ckv_server *s = w->s;
  ckv_conn *c = status == -ECANCELED ? NULL : ckv_strmap_get(s->conns, w->to.keyhex);
  if (c && c->id == w->to.conn_id) {
    c->io_inflight--;
    c->last_seen_ms = ckv_now_ms();
    ckv_wire_reset(&s->out);
    Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
    rep.request_id = w->to.request_id;
    char msg[512] = "";
    if (status < 0) {
      snprintf(msg, sizeof msg, "session '%s' is dropped, but %s", w->id, text);
      ckv_utf8_trim(msg);
      rep.message = msg;
    }
    ckv_reply_finish(s, c, &rep);
    ckv_reply_send(s, &w->to, c, &rep);
  }
  free(w);
}

static int h_drop(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__DropSession *d = req->drop_session;
  ckv_srv_session *sess = NULL;
  if (d->tenant && *d->tenant) {
    if (!c->admin) return fail(x, CKV_ERR_AUTH, "only an admin may drop another tenant's session");
    if (ckv_wire_check_session_id(d->session_id) < 0) return fail(x, CKV_ERR_INVALID, "bad session id");
    char key[256];
    snprintf(key, sizeof(key), "%.63s/%s", d->tenant, d->session_id);
    sess = ckv_strmap_get(s->store.sessions, key);
    if (!sess) return fail(x, CKV_ERR_NOT_FOUND, "no session '%s'", d->session_id);
  } else {
    int r = find_session(s, c, d->session_id, false, &sess, x);
    if (r < 0) return r;
  }
  if (sess->owner && sess->owner != c->id && !c->admin)
    return fail(x, CKV_ERR_BUSY, "session '%s' is attached to another client", d->session_id);
  ckv_log(CKV_LOG_INFO, "session-drop", sess->tenant->name, sess->id, "dropped by client %llu",
          (unsigned long long)c->id);
  /* With the remote tier on, the reply waits for the store: its fence
   * written and the remote copy deleted, or the text says they are not
   * (fencejob.h; at most twice the store's timeout + 0.5 s, never over 4 s).  Code 0 either
   * way: the conversation is ended and this daemon's record fences it. */
  drop_wait *w = s->reply_armed ? calloc(1, sizeof(*w)) : NULL;
  if (w) {
    w->s = s;
    w->to = s->reply_to;
    w->to.request_id = req->request_id;
    snprintf(w->id, sizeof w->id, "%s", sess->id);
  }
  char err[320];
  int r = ckv_persist_end_conversation(&s->persist, sess, w ? drop_answered : NULL, w, err, sizeof err);
  if (r < 0) {
    free(w);
    return fail(x, r, "session '%s' is not dropped: %s; retry", sess->id, err);
  }
  ckv_autosave_forget(&s->persist, sess->tenant, sess->id); /* dropped on purpose: never back from a crash copy */
  ckv_store_drop_session(&s->store, sess);
  if (r != CKV_FENCE_WAIT) {
    free(w);
    return CKV_OK;
  }
  c->io_inflight++; /* waiting on the store, not silent: the lease holds */
  s->reply_deferred = true;
  return CKV_REPLY_DEFERRED;
}

/* Snapshots (session_snap.c, snapshot.c, snapio.c, docs/snapshot.md).  The
 * disk is the I/O thread's (snapio.h): a save captures the session here, on
 * the loop (the snapshot is the session as of this request; the requests
 * after it are served at once and are not in the file; its full blocks are
 * read in place by the I/O thread, the tenant pinned: savegame.h), and the reply goes out
 * when the file is written; a restore's file is read and validated there and
 * applied here.  Meanwhile the loop serves everyone else. */

/* One save or restore waiting for the I/O thread: persist/'s part
 * (savegame.h) and where the reply goes. */
typedef struct io_request {
  ckv_savegame sg; /* first: snapio hands back the job (sg.job), the request around it */
  ckv_reply_to to;
} io_request;

static void io_request_destroy(ckv_snapio_job *j) {
  io_request *q = (io_request *)j;
  ckv_savegame_done(&q->sg);
  free(q);
}

static int save_done(ckv_server *s, io_request *q, reply_ctx *x);
static int restore_done(ckv_server *s, ckv_conn *c, io_request *q, reply_ctx *x);

/* Hands q to the I/O thread (the reply comes later: CKV_REPLY_DEFERRED), or,
 * outside serve_one, runs it here and answers at once.  q is taken either way. */
static int run_io(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, io_request *q, reply_ctx *x) {
  q->sg.job.destroy = io_request_destroy;
  /* what the store may send: no more than the tenant's arena and token columns could hold */
  ckv_savegame_address(&s->persist, c->tenant,
                       ckv_arena_size(c->tenant->arena) + (uint64_t)s->opt.max_tokens_per_session * 64u + (1u << 20),
                       &q->sg);
  if (!s->reply_armed) {
    ckv_snapio_run(&q->sg.job);
    ckv_persist_job_landed(&s->persist, &q->sg.job);
    int r = q->sg.job.kind == CKV_SNAPIO_SAVE ? save_done(s, q, x) : restore_done(s, c, q, x);
    io_request_destroy(&q->sg.job);
    return r;
  }
  q->to = s->reply_to;
  q->to.request_id = req->request_id;
  if (ckv_snapio_submit(s->persist.snapio, &q->sg.job) < 0) {
    io_request_destroy(&q->sg.job);
    return fail(x, CKV_ERR_BUSY, "%u snapshot saves and restores are waiting for the disk; retry later",
                CKV_SNAPIO_DEPTH);
  }
  c->io_inflight++;
  s->reply_deferred = true;
  return CKV_REPLY_DEFERRED;
}

static int h_save(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__SaveSession *sv = req->save_session;
  ckv_srv_session *sess;
  int r = find_session(s, c, sv->session_id, false, &sess, x);
  if (r < 0) return r;
  const char *name = sv->name && *sv->name ? sv->name : sess->id;
  if (ckv_wire_check_session_id(name) < 0)
    return fail(x, CKV_ERR_INVALID, "snapshot name must be 1..128 characters of [A-Za-z0-9._:-]");
  if (sess->quarantined) return quarantined(sess, x);
  if (!s->opt.state_dir || !*s->opt.state_dir)
    return fail(x, CKV_ERR_INVALID, "the daemon has no state directory ([daemon] state_dir, --state-dir)");
  ckv_store_settle_session(&s->store, sess); /* no move in flight: every byte is where the tokens say */
  io_request *q = calloc(1, sizeof(*q));
  if (!q) return -ENOMEM;
  char err[400];
  r = ckv_savegame_capture(&s->persist, sess, name, sv->committed_only, &q->sg, err, sizeof err);
  if (r < 0) {
    free(q);
    if (r == CKV_ERR_BUSY) return fail(x, r, "%s", err);
    if (r == CKV_ERR_QUOTA) { /* the tenant's own limit: its reply says so; the log only in debug */
      ckv_log(CKV_LOG_DEBUG, "session-save", c->tenant->name, sess->id, "snapshot '%s' refused: %s", name, err);
      return fail(x, r, "snapshot '%s' of session '%s' not saved: %s", name, sess->id, err);
    }
    ckv_log(CKV_LOG_ERROR, "session-save", c->tenant->name, sess->id, "saving snapshot '%s' failed: %s", name, err);
    return fail(x, r, "cannot save session '%s': %s", sess->id, err);
  }
  return run_io(s, c, req, q, x);
}

static int save_done(ckv_server *s, io_request *q, reply_ctx *x) {
  const ckv_savegame *g = &q->sg;
  const ckv_snapio_job *j = &g->job;
  if (j->status < 0) {
    ckv_log(CKV_LOG_ERROR, "session-save", g->tenant->name, g->id, "saving snapshot '%s' failed: %s (%s)", j->name,
            j->err, ckv_status_name(j->status));
    return fail(x, j->status, "cannot save session '%s': %s (%s)", g->id, j->err, ckv_status_name(j->status));
  }
  ckv_log(CKV_LOG_INFO, "session-save", g->tenant->name, g->id,
          "snapshot '%s': %llu bytes, %llu tokens kept%s%llu dropped (draft/staged); copied in %.3f ms on the loop, "
          "written in %.3f ms by the I/O thread",
          j->name, (unsigned long long)j->bytes, (unsigned long long)g->tokens,
          g->committed_only ? ", committed only: " : ", ", (unsigned long long)j->snap.dropped_tokens,
          (double)g->copy_us / 1e3, (double)j->io_us / 1e3);
  /* The remote copy after the local one (pushed by the I/O thread): a store
   * that fails leaves the local snapshot as written, and the reply says both. */
  if (j->remote_status < 0) {
    ckv_log(CKV_LOG_ERROR, "remote-save", g->tenant->name, g->id,
            "snapshot '%s' is saved locally, but not in the remote store: %s", j->name, j->remote_err);
    return fail(x, j->remote_status,
                "session '%s' is saved locally (snapshot '%s', %llu bytes, intact) but not in the remote store: %s",
                g->id, j->name, (unsigned long long)j->bytes, j->remote_err);
  }
  Commitkv__V1__SessionSaved *o = NEW(s, Commitkv__V1__SessionSaved, COMMITKV__V1__SESSION_SAVED__INIT);
  char *nm = ckv_wire_alloc(&s->out, strlen(j->name) + 1);
  if (!o || !nm) return -ENOMEM;
  memcpy(nm, j->name, strlen(j->name) + 1);
  o->name = nm;
  o->bytes = j->bytes;
  o->tokens = g->tokens;
  o->dropped_tokens = j->snap.dropped_tokens;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_SESSION_SAVED;
  x->rep->session_saved = o;
  return CKV_OK;
}

/* The checks a restore makes before the read and again after it (the loop
 * served other requests meanwhile: the id may be taken, the limit reached). */
static int restore_allowed(ckv_server *s, ckv_conn *c, const char *id, reply_ctx *x) {
  char key[256];
  ckv_store_session_key(c->tenant, id, key, sizeof(key));
  if (ckv_strmap_get(s->store.sessions, key))
    return fail(x, CKV_ERR_EXISTS, "session '%s' exists: drop it before restoring it from a snapshot", id);
  if (c->tenant->n_sessions >= c->tenant->max_sessions)
    return fail(x, CKV_ERR_LIMIT, "tenant '%s' has its maximum of %u sessions", c->tenant->name,
                c->tenant->max_sessions);
  return CKV_OK;
}

/* Restores snapshot `name` of the caller's tenant as session `id`, attached
 * to c.  model_id / model_revision (NULL: not checked) and geom (NULL or
 * zero: not checked) must match the snapshot.  resume: an OpenSession with
 * resume of an id that only a snapshot holds (no snapshot: "no session to
 * resume"). */
static int restore_session(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, const char *id,
                           const char *name, const char *model_id, const char *model_revision,
                           const Commitkv__V1__Geometry *geom, bool resume, reply_ctx *x) {
  int r = restore_allowed(s, c, id, x);
  if (r < 0) return r;
  if ((!s->opt.state_dir || !*s->opt.state_dir) && !s->opt.remote) {
    if (resume) return not_resumable(s, c, id, x);
    return fail(x, CKV_ERR_INVALID, "the daemon has no state directory for snapshots");
  }
  io_request *q = calloc(1, sizeof(*q));
  if (!q) return -ENOMEM;
  ckv_geometry g = {0};
  if (geom) g = (ckv_geometry){geom->n_layers, geom->n_kv_heads, geom->head_dim, (uint32_t)geom->dtype};
  ckv_savegame_want_restore(&s->persist, c->tenant, id, name, model_id, model_revision, geom ? &g : NULL, resume,
                            &q->sg);
  return run_io(s, c, req, q, x);
}

static int restore_done(ckv_server *s, ckv_conn *c, io_request *q, reply_ctx *x) {
  ckv_snapio_job *j = &q->sg.job;
  const char *id = q->sg.id, *name = j->name;
  if (j->status == -ENOENT) {
    if (q->sg.resume) return not_resumable(s, c, id, x);
    return fail(x, CKV_ERR_NOT_FOUND, "no snapshot '%s'", name);
  }
  if (j->status < 0) {
    ckv_log(CKV_LOG_WARNING, "snapshot-refused", c->tenant->name, id, "snapshot '%s' refused: %s", name, j->err);
    return fail(x, j->status, "snapshot '%s' refused: %s", name, j->err);
  }
  int r = restore_allowed(s, c, id, x);
  if (r < 0) return r;
  char err[320];
  uint64_t dropped = j->snap.dropped_tokens, copy_incarnation = j->snap.incarnation;
  bool mlp_lost = j->snap.params_mlp && !s->opt.policy->mlp;
  ckv_srv_session *sess = NULL;
  if ((r = ckv_savegame_apply_restore(&s->persist, &q->sg, c->id, &sess, err, sizeof err)) < 0) {
    ckv_log(CKV_LOG_WARNING, "snapshot-refused", c->tenant->name, id, "snapshot '%s' refused: %s", name, err);
    return fail(x, r, "snapshot '%s' refused: %s", name, err);
  }
  if (sess->incarnation != copy_incarnation) /* a new conversation of the id (savegame.h): the store fence says so */
    ckv_fence_publish(&s->persist, sess->tenant, sess->id, sess->model_id, sess->model_revision, sess->incarnation,
                      /* done= */ NULL, NULL);
  if (j->autosave_status < 0)
    ckv_log(CKV_LOG_WARNING, "autosave-refused", c->tenant->name, sess->id,
            "its autosave was refused (%s): restored from snapshot '%s' instead", j->autosave_err, name);
  ckv_log(CKV_LOG_INFO, "session-restore", c->tenant->name, sess->id,
          "restored from %s snapshot '%s': %zu tokens (%llu draft, %llu staged, %llu committed, %llu recycled), %llu "
          "not kept by its save%s; read in %.3f ms by the I/O thread",
          j->from_tier == 2            ? "the remote tier's"
          : j->from_tier               ? "the disk tier's"
          : j->from_autosave           ? "its autosave, newer than its"
          : j->origin == CKV_SNAP_FROM_REMOTE ? "the remote store's"
                                              : "the local",
          name, sess->tokens.n,
          (unsigned long long)sess->count_by_state[0], (unsigned long long)sess->count_by_state[1],
          (unsigned long long)sess->count_by_state[2], (unsigned long long)sess->count_by_state[3],
          (unsigned long long)dropped, mlp_lost ? "; it used the mlp judge, which is not loaded: the rule judge decides" : "",
          (double)j->io_us / 1e3);
  int o = opened_reply(s, sess, true, x);
  if (o == CKV_OK) {
    x->rep->session_opened->restored = true;
    x->rep->session_opened->dropped_tokens = dropped;
  }
  return o;
}

static int h_restore(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  const Commitkv__V1__RestoreSession *rs = req->restore_session;
  if (!c->tenant) return fail(x, CKV_ERR_AUTH, "this client is attached without a tenant (admin only)");
  if (ckv_wire_check_session_id(rs->session_id) < 0)
    return fail(x, CKV_ERR_INVALID, "session id must be 1..128 characters of [A-Za-z0-9._:-]");
  const char *name = rs->name && *rs->name ? rs->name : rs->session_id;
  if (ckv_wire_check_session_id(name) < 0)
    return fail(x, CKV_ERR_INVALID, "snapshot name must be 1..128 characters of [A-Za-z0-9._:-]");
  int r = check_model_name("model_id", rs->model_id, x);
  if (r == CKV_OK) r = check_model_name("model_revision", rs->model_revision, x);
  if (r < 0) return r;
  return restore_session(s, c, req, rs->session_id, name, rs->model_id && *rs->model_id ? rs->model_id : NULL,
                         rs->model_revision && *rs->model_revision ? rs->model_revision : NULL, NULL,
                         /* resume= */ false, x);
}

/* The error reply of a handler's failure r (CKV_OK and CKV_REPLY_DEFERRED:
 * nothing to do): no body, the code, the text. */
static void answer_failure(reply_ctx *x, int r) {
  if (r >= 0) return;
  if (r == -ENOMEM && !x->msg[0]) snprintf(x->msg, sizeof(x->msg), "out of memory building the reply");
  /* The error reply carries no body: whatever a handler built is dropped. */
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY__NOT_SET;
  x->rep->code = r;
  static char msg[sizeof(x->msg)];
  memcpy(msg, x->msg, sizeof(msg));
  x->rep->message = msg;
}

void ckv_handle_io_done(ckv_server *s, ckv_snapio_job *j) {
  io_request *q = (io_request *)j;
  ckv_conn *c = ckv_strmap_get(s->conns, q->to.keyhex);
  if (c && c->id != q->to.conn_id) c = NULL;
  if (!c) {
    /* the client went away while its file was read or written: a save is on
     * disk all the same; a restore is not applied (nobody would own it) */
    bool save = j->kind == CKV_SNAPIO_SAVE;
    ckv_log(CKV_LOG_INFO, save ? "session-save" : "snapshot-refused", q->sg.tenant->name, q->sg.id,
            "%s of snapshot '%s' finished (%s) after its client left; %s", save ? "save" : "read", j->name,
            j->status < 0 ? ckv_status_name(j->status) : "ok", save ? "nobody to answer" : "not restored");
    io_request_destroy(j);
    return;
  }
  c->io_inflight--;
  c->last_seen_ms = ckv_now_ms();
  ckv_wire_reset(&s->out);
  Commitkv__V1__Response rep = COMMITKV__V1__RESPONSE__INIT;
  rep.request_id = q->to.request_id;
  reply_ctx x = {.rep = &rep, .t0_us = ckv_now_us()};
  ckv_held_clear(s);
  int r = j->kind == CKV_SNAPIO_SAVE ? save_done(s, q, &x) : restore_done(s, c, q, &x);
  if (r == CKV_OK && j->kind != CKV_SNAPIO_SAVE) { /* the restored session: durable before acknowledged */
    ckv_srv_session *restored = ckv_store_session(&s->store, c->tenant, q->sg.id);
    if (restored) ckv_held_note(s, restored);
  }
  answer_failure(&x, r);
  ckv_reply_to to = q->to;
  ckv_reply_finish(s, c, &rep);
  if (!ckv_held_take(s, &to, c, &rep)) ckv_reply_send(s, &to, c, &rep);
  io_request_destroy(j); /* after the reply: its texts may point into the job */
}

typedef struct snap_list_ctx {
  ckv_server *s;
  Commitkv__V1__SnapshotList *l;
  size_t cap;
  bool oom;
} snap_list_ctx;

static char *out_str(ckv_server *s, const char *v) {
  char *p = ckv_wire_alloc(&s->out, strlen(v) + 1);
  if (p) memcpy(p, v, strlen(v) + 1);
  return p;
}

/* One snapshot of the disk index (persist/diskuse.h): what its header said
 * when it was written or found at start-up; no file is read here. */
static void list_one(void *ctx, const char *tenant, const char *name, uint64_t bytes, const ckv_diskuse_snapinfo *h) {
  snap_list_ctx *lc = ctx;
  ckv_server *s = lc->s;
  if (lc->oom) return;
  if (lc->l->n_snapshots == lc->cap) {
    size_t ncap = lc->cap ? lc->cap * 2 : 16;
    Commitkv__V1__SnapshotInfo **nv = ckv_wire_alloc(&s->out, ncap * sizeof(*nv));
    if (!nv) {
      lc->oom = true;
      return;
    }
    if (lc->l->n_snapshots) memcpy(nv, lc->l->snapshots, lc->l->n_snapshots * sizeof(*nv));
    lc->l->snapshots = nv;
    lc->cap = ncap;
  }
  Commitkv__V1__SnapshotInfo *i = NEW(s, Commitkv__V1__SnapshotInfo, COMMITKV__V1__SNAPSHOT_INFO__INIT);
  if (!i || !(i->name = out_str(s, name)) || !(i->tenant = out_str(s, tenant))) {
    lc->oom = true;
    return;
  }
  i->bytes = bytes;
  if (h->error) {
    char why[400];
    snprintf(why, sizeof why, "%s", h->error);
    ckv_utf8_trim(why);
    i->error = out_str(s, why);
    if (!i->error) lc->oom = true;
  } else {
    i->session_id = out_str(s, h->session_id);
    i->model_id = out_str(s, h->model_id);
    i->model_revision = out_str(s, h->model_revision);
    i->tokens = h->tokens;
    i->saved_at_ms = h->saved_at_ms;
    i->committed_only = h->committed_only;
    Commitkv__V1__Geometry *g = NEW(s, Commitkv__V1__Geometry, COMMITKV__V1__GEOMETRY__INIT);
    if (g) {
      g->n_layers = h->geom.n_layers;
      g->n_kv_heads = h->geom.n_kv_heads;
      g->head_dim = h->geom.head_dim;
      g->dtype = (Commitkv__V1__Dtype)h->geom.dtype;
      g->draft_block_tokens = h->draft_tokens;
      g->commit_block_tokens = h->commit_tokens;
    }
    i->geometry = g;
    if (!i->session_id || !i->model_id || !i->model_revision || !g) lc->oom = true;
  }
  if (!lc->oom) lc->l->snapshots[lc->l->n_snapshots++] = i;
}

static int h_list_snapshots(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  (void)req;
  if (!c->tenant && !c->admin) return fail(x, CKV_ERR_AUTH, "this client has no tenant");
  Commitkv__V1__SnapshotList *l = NEW(s, Commitkv__V1__SnapshotList, COMMITKV__V1__SNAPSHOT_LIST__INIT);
  if (!l) return -ENOMEM;
  snap_list_ctx lc = {.s = s, .l = l};
  int r = ckv_diskuse_each_snapshot(s->persist.diskuse, c->admin ? NULL : c->tenant->name, list_one, &lc);
  if (r < 0 || lc.oom) return -ENOMEM;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_SNAPSHOT_LIST;
  x->rep->snapshot_list = l;
  return CKV_OK;
}

static Commitkv__V1__TokenCounts *token_counts(ckv_server *s, const uint64_t *c4, const ckv_cold_figures *cold) {
  Commitkv__V1__TokenCounts *t = NEW(s, Commitkv__V1__TokenCounts, COMMITKV__V1__TOKEN_COUNTS__INIT);
  if (!t) return NULL;
  t->draft = c4[0];
  t->staged = c4[1];
  t->committed = c4[2];
  t->recycled = c4[3];
  t->cold = cold->cold_tokens;
  t->dropped = cold->dropped_tokens;
  return t;
}

/* bytes: draft, staged, committed (all committed formats), total, fp16; cold
 * and primary from the cold tier's figures */
static Commitkv__V1__ByteCounts *byte_counts(ckv_server *s, const uint64_t *b5, const ckv_cold_figures *cold) {
  Commitkv__V1__ByteCounts *b = NEW(s, Commitkv__V1__ByteCounts, COMMITKV__V1__BYTE_COUNTS__INIT);
  if (!b) return NULL;
  b->draft = b5[0];
  b->staged = b5[1];
  b->committed = b5[2];
  b->total = b5[3];
  b->fp16_equivalent = b5[4];
  b->cold = cold->cold_bytes;
  b->primary = b5[3] > cold->cold_bytes ? b5[3] - cold->cold_bytes : 0;
  return b;
}

/* Stats.tiers: primary (the arenas), disk and, when the remote tier is on,
 * remote (tier.h), for the caller's tenant or, for an admin, all of them. */
static int tier_stats(ckv_server *s, const ckv_conn *c, Commitkv__V1__Stats *st) {
  const ckv_tenant *only = c->admin ? NULL : c->tenant;
  ckv_tier_stats d;
  ckv_tier_get_stats(&s->persist, only, &d);
  Commitkv__V1__TierStats *p = NEW(s, Commitkv__V1__TierStats, COMMITKV__V1__TIER_STATS__INIT);
  Commitkv__V1__TierStats *k = NEW(s, Commitkv__V1__TierStats, COMMITKV__V1__TIER_STATS__INIT);
  Commitkv__V1__TierStats *m = d.remote_on ? NEW(s, Commitkv__V1__TierStats, COMMITKV__V1__TIER_STATS__INIT) : NULL;
  st->tiers = ckv_wire_alloc(&s->out, 3 * sizeof(*st->tiers));
  if (!p || !k || !st->tiers || (d.remote_on && !m)) return -ENOMEM;
  p->tier = "primary";
  for (size_t i = 0; i < s->store.n_tenants; i++) {
    const ckv_tenant *t = s->store.tenants[i];
    if (!(c->admin || t == c->tenant)) continue;
    p->bytes += t->bytes_used;
    p->capacity += ckv_arena_size(t->arena);
    p->hits += t->hits;
    p->hit_tokens += t->hit_tokens;
    p->sessions += t->n_sessions;
  }
  uint64_t below = d.disk_sessions + d.remote_sessions;
  p->sessions -= below < p->sessions ? below : p->sessions;
  p->misses = d.restores + d.remote_restores; /* each brought back from disk or the store */
  p->miss_tokens = d.restore_tokens + d.remote_restore_tokens;
  k->tier = "disk";
  k->bytes = d.disk_bytes;
  k->capacity = d.capacity;
  k->sessions = d.disk_sessions;
  k->hits = d.restores;
  k->hit_tokens = d.restore_tokens;
  k->offloads = d.offloads;
  k->offload_bytes = d.offload_bytes;
  k->restores = d.restores;
  k->restore_bytes = d.restore_bytes;
  k->cancelled = d.cancelled;
  k->refused = d.refused;
  k->pressure_moves = d.pressure_moves;
  k->errors = d.errors;
  st->tiers[0] = p;
  st->tiers[1] = k;
  st->n_tiers = 2;
  if (m) { /* the remote tier (remote_idle): its offloads are sessions moved on from disk */
    m->tier = "remote";
    m->bytes = d.remote_bytes;
    m->sessions = d.remote_sessions;
    m->hits = d.remote_restores;
    m->hit_tokens = d.remote_restore_tokens;
    m->offloads = d.pushes;
    m->offload_bytes = d.push_bytes;
    m->restores = d.remote_restores;
    m->restore_bytes = d.remote_restore_bytes;
    m->errors = d.remote_errors;
    st->tiers[st->n_tiers++] = m;
  }
  return CKV_OK;
}

static int h_stats(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  int r;
  Commitkv__V1__Stats *st = NEW(s, Commitkv__V1__Stats, COMMITKV__V1__STATS__INIT);
  if (!st) return -ENOMEM;
  size_t nt = 0;
  for (size_t i = 0; i < s->store.n_tenants; i++)
    if (c->admin || s->store.tenants[i] == c->tenant) nt++;
  st->tenants = ckv_wire_alloc(&s->out, (nt + 1) * sizeof(*st->tenants));
  st->arenas = ckv_wire_alloc(&s->out, (nt + 1) * sizeof(*st->arenas));
  if (!st->tenants || !st->arenas) return -ENOMEM;
  uint64_t all_tok[4] = {0}, all_bytes[5] = {0}, detached = 0, sessions = 0, clients = 0;
  uint64_t all_shared_tok = 0, all_shared_bytes = 0;
  ckv_cold_figures all_cold = {0};
  for (size_t i = 0; i < s->store.n_tenants; i++) {
    ckv_tenant *t = s->store.tenants[i];
    if (!(c->admin || t == c->tenant)) continue;
    uint64_t tok[4] = {0}, bytes[5] = {0}, shared_tok = 0;
    ckv_cold_figures cold = {0};
    size_t cur = 0;
    ckv_srv_session *sess;
    while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL))) {
      if (sess->tenant != t) continue;
      ckv_srv_session_figures(sess, tok, bytes);
      ckv_cold_figures_add(sess, &cold);
      shared_tok += ckv_prefix_session_shared_tokens(sess);
      if (!sess->owner) detached++;
    }
    Commitkv__V1__TenantStats *ts = NEW(s, Commitkv__V1__TenantStats, COMMITKV__V1__TENANT_STATS__INIT);
    Commitkv__V1__ArenaStats *as = NEW(s, Commitkv__V1__ArenaStats, COMMITKV__V1__ARENA_STATS__INIT);
    /* shared blocks are in every holder's figures: the tenant holds them once */
    ckv_prefix_figures pf;
    ckv_prefix_tenant_figures(t, &pf);
    bytes[0] -= pf.excess_bytes < bytes[0] ? pf.excess_bytes : bytes[0];
    bytes[3] -= pf.excess_bytes < bytes[3] ? pf.excess_bytes : bytes[3];
    if (!ts || !as || !(ts->tokens = token_counts(s, tok, &cold)) || !(ts->bytes = byte_counts(s, bytes, &cold)))
      return -ENOMEM;
    ts->bytes->shared = pf.shared_bytes;
    ts->tokens->shared = shared_tok;
    ts->dedup_ratio = bytes[3] ? (double)bytes[4] / (double)bytes[3] : 0.0;
    ts->prefix_lookup_tokens = pf.lookup_tokens;
    ts->prefix_hit_tokens = pf.hit_tokens;
    bool index_complete;
    ckv_prefix_index_state(t, &ts->prefix_index_keys, &ts->prefix_index_slots, &index_complete);
    ts->prefix_index_complete = index_complete;
    all_shared_tok += shared_tok;
    all_shared_bytes += pf.shared_bytes;
    ts->name = t->name;
    ts->sessions = t->n_sessions;
    ts->clients = t->n_clients;
    ts->quota_bytes = t->quota_bytes;
    ckv_diskuse_usage du;
    ckv_diskuse_usage_of(s->persist.diskuse, t->name, &du);
    ts->disk_bytes = du.bytes;
    ts->snapshots = du.files[CKV_DISKUSE_SNAPSHOT];
    ts->quota_disk = t->quota_disk;
    ts->max_snapshots = t->max_snapshots;
    as->kind = (char *)ckv_arena_kind(t->arena);
    as->bytes_total = ckv_arena_size(t->arena);
    as->bytes_committed = ckv_arena_committed(t->arena);
    as->bytes_used = t->bytes_used;
    as->tenant = t->name;
    as->arena_id = t->arena_id;
    st->tenants[st->n_tenants++] = ts;
    st->arenas[st->n_arenas++] = as;
    for (int k = 0; k < 4; k++) all_tok[k] += tok[k];
    for (int k = 0; k < 5; k++) all_bytes[k] += bytes[k];
    all_cold.cold_tokens += cold.cold_tokens;
    all_cold.cold_bytes += cold.cold_bytes;
    all_cold.dropped_tokens += cold.dropped_tokens;
    sessions += t->n_sessions;
    clients += t->n_clients;
  }
  if (c->admin) clients = ckv_strmap_size(s->conns);
  if (!(st->tokens = token_counts(s, all_tok, &all_cold)) || !(st->bytes = byte_counts(s, all_bytes, &all_cold)))
    return -ENOMEM;
  st->tokens->shared = all_shared_tok;
  st->bytes->shared = all_shared_bytes;
  st->sessions = sessions;
  st->clients = clients;
  st->requests = s->counters.requests;
  st->errors = s->counters.errors;
  st->rounds = s->counters.rounds;
  st->uptime_ms = ckv_now_ms() - s->start_ms;
  st->backend = (char *)s->opt.backend;
  st->detached_sessions = detached;
  st->leases_expired = s->counters.leases_expired;
  st->sessions_detached = s->counters.sessions_detached;
  st->sessions_resumed = s->counters.sessions_resumed;
  st->sessions_expired = s->counters.sessions_expired;
  ckv_compressor_stats cs;
  ckv_compressor_get_stats(s->store.compressor, &cs);
  st->compress_queue = cs.queued;
  st->compress_jobs = cs.completed;
  st->compress_refused = cs.refused_busy;
  st->compress_busy_us = cs.busy_ns / 1000u;
  st->autosave_lag_ms = s->persist.counters.autosave_lag_ms;
  st->disk_refused_saves = s->persist.counters.disk_refused_saves;
  st->disk_refused_autosaves = s->persist.counters.disk_refused_autosaves;
  st->disk_refused_offloads = s->persist.counters.disk_refused_offloads;
  uint64_t tr[4][4];
  memcpy(tr, s->counters.transitions, sizeof(tr));
  st->semantic_given_tokens = s->counters.semantic_given; /* of gone sessions, as the transitions */
  size_t tcur = 0;
  ckv_srv_session *ts;
  while ((ts = ckv_strmap_next(s->store.sessions, &tcur, NULL))) {
    if (!(c->admin || ts->tenant == c->tenant)) continue;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) tr[i][j] += ts->transitions[i][j];
    st->pending_tokens += ckv_moves_pending(ts);
    st->semantic_given_tokens += ts->semantic_given;
  }
  st->transitions_staged = tr[0][1];
  st->transitions_committed = tr[1][2];
  st->transitions_recycled = tr[0][3] + tr[1][3] + tr[2][3];
  if ((r = tier_stats(s, c, st)) < 0) return r;
  if (s->opt.remote) {
    Commitkv__V1__RemoteStats *rs = NEW(s, Commitkv__V1__RemoteStats, COMMITKV__V1__REMOTE_STATS__INIT);
    if (!rs) return -ENOMEM;
    ckv_remote_stats rst;
    ckv_remote_get_stats(s->opt.remote, &rst);
    rs->url = (char *)ckv_remote_url_text(s->opt.remote);
    rs->saves = rst.saves;
    rs->save_bytes = rst.save_bytes;
    rs->loads = rst.loads;
    rs->load_bytes = rst.load_bytes;
    rs->misses = rst.misses;
    rs->errors = rst.errors;
    rs->connected = rst.connected;
    st->remote = rs;
  }
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_STATS;
  x->rep->stats = st;
  return CKV_OK;
}

static int h_list(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  Commitkv__V1__SessionList *l = NEW(s, Commitkv__V1__SessionList, COMMITKV__V1__SESSION_LIST__INIT);
  if (!l) return -ENOMEM;
  size_t n = ckv_strmap_size(s->store.sessions), cur = 0;
  l->sessions = ckv_wire_alloc(&s->out, (n + 1) * sizeof(*l->sessions));
  if (!l->sessions) return -ENOMEM;
  ckv_srv_session *sess;
  while ((sess = ckv_strmap_next(s->store.sessions, &cur, NULL))) {
    if (!c->admin && sess->tenant != c->tenant) continue;
    Commitkv__V1__SessionInfo *i = NEW(s, Commitkv__V1__SessionInfo, COMMITKV__V1__SESSION_INFO__INIT);
    uint64_t tok[4] = {0}, bytes[5] = {0};
    ckv_cold_figures cold = {0};
    ckv_srv_session_figures(sess, tok, bytes);
    ckv_cold_figures_add(sess, &cold);
    if (!i || !(i->tokens = token_counts(s, tok, &cold)) || !(i->bytes = byte_counts(s, bytes, &cold)) ||
        !(i->geometry = geometry_msg(s, sess)))
      return -ENOMEM;
    i->tokens->shared = ckv_prefix_session_shared_tokens(sess);
    i->bytes->shared = ckv_prefix_session_shared_bytes(sess);
    i->session_id = sess->id;
    i->recalled_blocks = cold.recalled_blocks;
    i->recalled_tokens = cold.recalled_tokens;
    i->tenant = sess->tenant->name;
    i->policy = sess->policy;
    i->attached = sess->owner != 0;
    i->epoch = sess->epoch;
    i->rounds = sess->rounds;
    i->pending_tokens = ckv_moves_pending(sess);
    i->tier = (char *)ckv_tier_state_name(ckv_tier_state_of(sess));
    l->sessions[l->n_sessions++] = i;
  }
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_SESSION_LIST;
  x->rep->session_list = l;
  return CKV_OK;
}

/* Lookups a worker answered from the published index count as the
 * tenant's (its own figures only; matched never above asked). */
static int note_local_lookups(ckv_conn *c, const Commitkv__V1__Heartbeat *hb, reply_ctx *x) {
  if (!hb || (!hb->prefix_lookup_tokens && !hb->prefix_hit_tokens)) return CKV_OK;
  if (!c->tenant) return fail(x, CKV_ERR_AUTH, "heartbeat: prefix lookups counted for no tenant (admin client)");
  if (hb->prefix_hit_tokens > hb->prefix_lookup_tokens || hb->prefix_lookup_tokens > (1ull << 48))
    return fail(x, CKV_ERR_INVALID, "heartbeat: prefix_hit_tokens above prefix_lookup_tokens, or a count above 2^48");
  ckv_prefix_count_lookups(c->tenant, hb->prefix_lookup_tokens, hb->prefix_hit_tokens);
  return CKV_OK;
}

static int h_heartbeat(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  int r = note_local_lookups(c, req->heartbeat, x);
  if (r < 0) return r;
  Commitkv__V1__HeartbeatAck *h = NEW(s, Commitkv__V1__HeartbeatAck, COMMITKV__V1__HEARTBEAT_ACK__INIT);
  if (!h) return -ENOMEM;
  h->server_time_ms = ckv_now_ms();
  h->lease_ms = s->opt.lease_ms;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_HEARTBEAT_ACK;
  x->rep->heartbeat_ack = h;
  return CKV_OK;
}

static int h_status(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, reply_ctx *x) {
  Commitkv__V1__DaemonStatus *d = NEW(s, Commitkv__V1__DaemonStatus, COMMITKV__V1__DAEMON_STATUS__INIT);
  if (!d) return -ENOMEM;
  d->version = CKV_VERSION_STRING;
  d->backend = (char *)s->opt.backend;
  d->backend_reason = (char *)(s->opt.backend_reason ? s->opt.backend_reason : "");
  d->pid = (uint32_t)getpid();
  d->uptime_ms = ckv_now_ms() - s->start_ms;
  d->socket = (char *)s->opt.socket;
  d->attach_socket = (char *)s->opt.attach_socket;
  d->protocol_version = CKV_PROTOCOL_VERSION;
  x->rep->body_case = COMMITKV__V1__RESPONSE__BODY_STATUS;
  x->rep->status = d;
  return CKV_OK;
}

/* What a request type means before its handler runs (the disk tier's gate
 * reads it): the session it names, whether it needs that session's K/V in
 * memory, and who may ask. */
enum {
  H_KV = 1u << 0,         /* needs the named session's K/V resident: it comes back from a tier first */
  H_OWNER_ONLY = 1u << 1, /* only the session's reader may ask (the handler refuses everyone else) */
  H_OPEN = 1u << 2,       /* OpenSession: with resume it needs K/V (the reader, or nobody's), without it is new */
  H_APPENDS = 1u << 3,    /* the worker writes K/V from now on (AppendTokens) */
  H_REPORTS = 1u << 4,    /* the worker has written what it appended (ReportRound) */
  H_PREFETCH = 1u << 5,   /* Acquire: with prefetch the read starts and the request is answered at once */
};

typedef struct handler_entry {
  Commitkv__V1__Request__BodyCase kind;
  const char *name;
  handler_fn fn;
  unsigned flags;
  /* The session the request names (NULL: none, or the session may stay where it is). */
  const char *(*session_of)(const Commitkv__V1__Request *req);
  /* The session whose journaled state it changes when it succeeds: its
   * reply waits for the warm journal (held.h).  NULL: none (reads; a drop,
   * which incarnations.log makes durable before the reply). */
  const char *(*changes)(const Commitkv__V1__Request *req);
} handler_entry;

static const char *open_session_id(const Commitkv__V1__Request *r) { return r->open_session->session_id; }
static const char *append_session_id(const Commitkv__V1__Request *r) { return r->append_tokens->session_id; }
static const char *report_session_id(const Commitkv__V1__Request *r) { return r->report_round->session_id; }
static const char *ack_session_id(const Commitkv__V1__Request *r) { return r->ack_epoch->session_id; }
static const char *acquire_session_id(const Commitkv__V1__Request *r) { return r->acquire->session_id; }
static const char *view_session_id(const Commitkv__V1__Request *r) { return r->get_view->session_id; }
static const char *save_session_id(const Commitkv__V1__Request *r) { return r->save_session->session_id; }
static const char *close_session_id(const Commitkv__V1__Request *r) { return r->close_session->session_id; }
static const char *fork_parent_id(const Commitkv__V1__Request *r) { return r->fork_session->parent_id; }
static const char *fork_new_id(const Commitkv__V1__Request *r) { return r->fork_session->new_id; }

/* Drop, Restore, Stats and the lists name no session the tier must bring
 * back: a dropped session's file goes with it (ckv_tier_forget). */
static const handler_entry k_handlers[] = {
    {COMMITKV__V1__REQUEST__BODY_HELLO, "hello", h_hello, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_OPEN_SESSION, "open_session", h_open, H_OPEN, open_session_id, open_session_id},
    {COMMITKV__V1__REQUEST__BODY_APPEND_TOKENS, "append_tokens", h_append, H_KV | H_OWNER_ONLY | H_APPENDS,
     append_session_id, append_session_id},
    {COMMITKV__V1__REQUEST__BODY_REPORT_ROUND, "report_round", h_report, H_KV | H_OWNER_ONLY | H_REPORTS,
     report_session_id, report_session_id},
    {COMMITKV__V1__REQUEST__BODY_ACK_EPOCH, "ack_epoch", h_ack, H_OWNER_ONLY, ack_session_id, ack_session_id},
    {COMMITKV__V1__REQUEST__BODY_ACQUIRE, "acquire", h_acquire, H_KV | H_OWNER_ONLY | H_PREFETCH, acquire_session_id, NULL},
    {COMMITKV__V1__REQUEST__BODY_GET_VIEW, "get_view", h_view, H_KV | H_OWNER_ONLY, view_session_id, NULL},
    {COMMITKV__V1__REQUEST__BODY_SAVE_SESSION, "save_session", h_save, H_KV, save_session_id, NULL},
    {COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION, "restore_session", h_restore, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_CLOSE_SESSION, "close_session", h_close, H_OWNER_ONLY, close_session_id, NULL},
    {COMMITKV__V1__REQUEST__BODY_DROP_SESSION, "drop_session", h_drop, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_STATS, "stats", h_stats, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS, "list_sessions", h_list, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_HEARTBEAT, "heartbeat", h_heartbeat, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_STATUS, "status", h_status, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_LIST_SNAPSHOTS, "list_snapshots", h_list_snapshots, 0, NULL, NULL},
    {COMMITKV__V1__REQUEST__BODY_LOOKUP_PREFIX, "lookup_prefix", h_lookup_prefix, 0, NULL, NULL},
    /* the parent's K/V must be resident: it comes back from a tier first */
    {COMMITKV__V1__REQUEST__BODY_FORK_SESSION, "fork_session", h_fork, H_KV, fork_parent_id, fork_new_id},
};

/* The disk tier first: a session on disk (or in the remote store) comes back
 * before its request is handled.  CKV_OK: handle it now; CKV_REPLY_DEFERRED:
 * it waits (parked.h); < 0: refuse it with the text in x->msg. */
static int tier_gate(ckv_server *s, ckv_conn *c, const handler_entry *h, const Commitkv__V1__Request *req,
                     reply_ctx *x) {
  const char *id = h->session_of ? h->session_of(req) : NULL;
  if (!c->tenant || !id || ckv_wire_check_session_id(id) < 0) return CKV_OK; /* the handler refuses what is wrong */
  bool resume = (h->flags & H_OPEN) && req->open_session->resume;
  const ckv_tier_request tr = {
      .tenant = c->tenant,
      .id = id,
      .client = c->id,
      .kv = (h->flags & H_KV) || resume,
      .owner_only = h->flags & H_OWNER_ONLY,
      .resume = resume,
      .open_new = (h->flags & H_OPEN) && !resume,
      .appends = h->flags & H_APPENDS,
      .reports = h->flags & H_REPORTS,
      .prefetch = (h->flags & H_PREFETCH) && req->acquire->prefetch,
      .can_wait = s->reply_armed,
      .model_id = (h->flags & H_OPEN) ? req->open_session->model_id : NULL,
      .model_revision = (h->flags & H_OPEN) ? req->open_session->model_revision : NULL,
  };
  int r = ckv_tier_gate(&s->persist, &tr, x->msg, sizeof x->msg);
  if (r != CKV_TIER_PARK) return r;
  char key[256];
  ckv_store_session_key(c->tenant, id, key, sizeof key);
  return ckv_parked_add(s, c, key, req);
}

void ckv_handle_request(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, Commitkv__V1__Response *rep) {
  reply_ctx x = {.rep = rep, .t0_us = ckv_now_us()};
  int r;
  ckv_held_clear(s);
  if (req->version > CKV_PROTOCOL_VERSION) {
    r = fail(&x, CKV_ERR_VERSION, "request version %u is newer than this daemon's %u", req->version,
             CKV_PROTOCOL_VERSION);
  } else {
    const handler_entry *h = NULL;
    for (size_t i = 0; i < sizeof(k_handlers) / sizeof(k_handlers[0]); i++)
      if (k_handlers[i].kind == req->body_case) h = &k_handlers[i];
    r = h ? tier_gate(s, c, h, req, &x) : CKV_OK;
    if (r == CKV_OK)
      r = h ? h->fn(s, c, req, &x) : fail(&x, CKV_ERR_INVALID, "empty or unknown request type %d", (int)req->body_case);
    else if (r < 0)
      ckv_utf8_trim(x.msg);
    if (r == CKV_OK && h && h->changes && c->tenant) { /* durable before acknowledged (held.h) */
      ckv_srv_session *changed = ckv_store_session(&s->store, c->tenant, h->changes(req));
      if (changed) ckv_held_note(s, changed);
    }
  }
  answer_failure(&x, r);
}

/* The payload of one request from client c, answered into rep: the
 * max_message cap, the capped decode into the per-request arena, the
 * handler.  serve_one calls it once the routing id named c; the request
 * fuzzer (tests/fuzz) calls it the same way. */
void ckv_handle_payload(ckv_server *s, ckv_conn *c, const void *data, size_t len, Commitkv__V1__Response *rep) {
  static char msg[256];
  c->last_seen_ms = ckv_now_ms();
  if (len > s->opt.max_message) {
    rep->code = CKV_ERR_TOO_LARGE;
    rep->request_id = ckv_wire_peek_request_id(data, len);
    snprintf(msg, sizeof(msg),
             "request of %zu bytes is over max_message (%llu bytes); it was dropped undecoded (above %lld bytes "
             "the connection is closed instead)",
             len, (unsigned long long)s->opt.max_message, (long long)ckv_transport_cap(s->opt.max_message));
    rep->message = msg;
    return;
  }
  Commitkv__V1__Request *req = NULL;
  int r = ckv_wire_decode_request(&s->in, data, len, &req);
  if (r < 0) {
    rep->code = r;
    snprintf(msg, sizeof(msg), "could not decode a commitkv.v1.Request from %zu bytes", len);
    rep->message = msg;
    return;
  }
  rep->request_id = req->request_id;
  char bad[160];
  if ((r = ckv_wire_check_strings(data, len, bad, sizeof bad)) < 0) {
    rep->code = r;
    snprintf(msg, sizeof(msg), "request refused: %s (a name or id is taken exactly as sent or not at all)", bad);
    rep->message = msg;
    return;
  }
  ckv_handle_request(s, c, req, rep);
}
