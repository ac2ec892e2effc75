/* client.c - commitkv._commitkv._Client: one ckv_client.
 *
 * Opens sessions, asks the daemon for its figures (the object
 * `commitkvctl stats --json` prints, as a dict), heartbeats and reconnects.
 * close() detaches the sessions still open; the connection and the arena
 * mapping go when the last zero-copy array over the arena is released, so
 * an array a caller still holds never points at unmapped memory. */
#include <errno.h>
#include <string.h>

#include "client/rpc.h"
#include "ext.h"

static PyObject *closed_error(void) { return ckvpy_raise(CKV_ERR_DISCONNECTED, "this commitkv client is closed"); }

static void free_client(ckvpy_client *self) {
  ckv_client *c = self->c;
  self->c = NULL;
  if (!c) return;
  Py_BEGIN_ALLOW_THREADS
  ckv_client_free(c); /* joins the heartbeat thread */
  Py_END_ALLOW_THREADS
}

void ckvpy_client_maybe_free(ckvpy_client *self) {
  if (self->closed && self->exports == 0 && self->busy == 0) free_client(self);
}

/* Around every use of c without the GIL: close() from another thread then
 * waits for the call to end instead of freeing c under it. */
static bool enter(ckvpy_client *self) {
  if (self->closed || !self->c) {
    closed_error();
    return false;
  }
  self->busy++;
  return true;
}

static void leave(ckvpy_client *self) {
  self->busy--;
  ckvpy_client_maybe_free(self);
}

static void client_dealloc(ckvpy_client *self) {
  /* Sessions and arena buffers hold references: none is left here. */
  if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
  free_client(self);
  PyObject_Free(self);
}

static PyObject *client_close(ckvpy_client *self, PyObject *unused) {
  if (self->closed) Py_RETURN_NONE;
  self->closed = true;
  int rc = 0;
  self->busy++; /* the sessions' close requests below use c without the GIL */
  while (self->sessions) {
    ckvpy_session *s = self->sessions;
    Py_INCREF(s);
    if (ckvpy_session_finish(s, /* keep= */ true) < 0) rc = -1;
    Py_DECREF(s);
  }
  leave(self);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *client_open_session(ckvpy_client *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"id",     "n_layers", "n_kv_heads", "head_dim", "dtype", "policy", "names", "values",
                           "resume", "draft_block_tokens", "commit_block_tokens", "token_ids", "reuse_prefix",
                           "model_id", "model_revision", NULL};
  const char *id, *policy = NULL, *model_id = NULL, *model_revision = NULL;
  unsigned int layers = 0, heads = 0, dim = 0, dtype = 0, draft = 0, commit = 0;
  PyObject *names = NULL, *values = NULL;
  int resume = 0, reuse = 0;
  const char *ids = NULL;
  Py_ssize_t ids_len = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|IIIIzOOpIIz#pzz", kwlist, &id, &layers, &heads, &dim, &dtype, &policy,
                                   &names, &values, &resume, &draft, &commit, &ids, &ids_len, &reuse, &model_id,
                                   &model_revision))
    return NULL;
  if (ids_len % 4) return PyErr_Format(PyExc_ValueError, "token_ids must be packed uint32 values");
  if (self->closed) return closed_error();
  Py_ssize_t n = 0;
  if (names && names != Py_None) {
    if (!PyTuple_Check(names) || !values || !PyTuple_Check(values) || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(values))
      return PyErr_Format(PyExc_TypeError, "names and values must be tuples of the same length");
    n = PyTuple_GET_SIZE(names);
  }
  const char **pn = n ? PyMem_Calloc((size_t)n, sizeof(*pn)) : NULL;
  double *pv = n ? PyMem_Calloc((size_t)n, sizeof(*pv)) : NULL;
  if (n && (!pn || !pv)) {
    PyMem_Free(pn);
    PyMem_Free(pv);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    pn[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
    pv[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(values, i));
    if (!pn[i] || (pv[i] == -1.0 && PyErr_Occurred())) {
      PyMem_Free(pn);
      PyMem_Free(pv);
      return NULL;
    }
  }
  ckv_geometry g = {layers, heads, dim, dtype};
  /* token_ids: a copy, aligned (the bytes object's buffer need not be) */
  uint32_t *tids = ids_len ? PyMem_Malloc((size_t)ids_len) : NULL;
  if (ids_len && !tids) {
    PyMem_Free(pn);
    PyMem_Free(pv);
    return PyErr_NoMemory();
  }
  if (ids_len) memcpy(tids, ids, (size_t)ids_len);
  ckv_session_options o = {.policy = policy, .resume = resume != 0, .draft_block_tokens = draft,
                           .commit_block_tokens = commit, .param_names = pn, .param_values = pv, .n_params = (size_t)n,
                           .model_id = model_id, .model_revision = model_revision, .token_ids = tids,
                           .n_token_ids = (size_t)ids_len / 4, .reuse_prefix = reuse != 0};
  ckv_session *s = NULL;
  int r;
  char err[512];
  if (!enter(self)) {
    PyMem_Free(pn);
    PyMem_Free(pv);
    PyMem_Free(tids);
    return NULL;
  }
  ckv_client *c = self->c;
  Py_BEGIN_ALLOW_THREADS
  r = ckv_session_open(c, id, resume && layers == 0 ? NULL : &g, &o, &s);
  if (r < 0) ckvpy_copy_error(c, r, err, sizeof(err));
  Py_END_ALLOW_THREADS
  PyMem_Free(pn);
  PyMem_Free(pv);
  PyMem_Free(tids);
  PyObject *ret;
  if (r < 0) {
    ret = ckvpy_raise(r, err);
  } else if (self->closed) { /* closed by another thread meanwhile: it detached what it knew of */
    Py_BEGIN_ALLOW_THREADS
    ckv_session_close(s);
    Py_END_ALLOW_THREADS
    ret = closed_error();
  } else {
    ret = ckvpy_session_new(self, s, id);
  }
  leave(self);
  return ret;
}

/* ---- stats: the object of `commitkvctl stats --json`, key for key ---------- */

static PyObject *token_counts(const Commitkv__V1__TokenCounts *t) {
  return Py_BuildValue("{sKsKsKsKsKsKsK}", "draft", (unsigned long long)(t ? t->draft : 0), "staged",
                       (unsigned long long)(t ? t->staged : 0), "committed", (unsigned long long)(t ? t->committed : 0),
                       "recycled", (unsigned long long)(t ? t->recycled : 0), "cold",
                       (unsigned long long)(t ? t->cold : 0), "dropped", (unsigned long long)(t ? t->dropped : 0),
                       "shared", (unsigned long long)(t ? t->shared : 0));
}

static PyObject *byte_counts(const Commitkv__V1__ByteCounts *b) {
  return Py_BuildValue("{sKsKsKsKsKsK}", "draft", (unsigned long long)(b ? b->draft : 0), "staged",
                       (unsigned long long)(b ? b->staged : 0), "committed", (unsigned long long)(b ? b->committed : 0),
                       "total", (unsigned long long)(b ? b->total : 0), "fp16_equivalent",
                       (unsigned long long)(b ? b->fp16_equivalent : 0), "shared",
                       (unsigned long long)(b ? b->shared : 0));
}

static PyObject *stats_dict(const Commitkv__V1__Stats *s) {
  PyObject *arenas = PyList_New((Py_ssize_t)s->n_arenas), *tenants = PyList_New((Py_ssize_t)s->n_tenants);
  if (!arenas || !tenants) goto fail;
  for (size_t i = 0; i < s->n_arenas; i++) {
    const Commitkv__V1__ArenaStats *a = s->arenas[i];
    PyObject *d = Py_BuildValue("{szszsIsKsKsK}", "kind", a->kind, "tenant", a->tenant, "arena_id", a->arena_id,
                                "bytes_total", (unsigned long long)a->bytes_total, "bytes_committed",
                                (unsigned long long)a->bytes_committed, "bytes_used", (unsigned long long)a->bytes_used);
    if (!d) goto fail;
    PyList_SET_ITEM(arenas, (Py_ssize_t)i, d);
  }
  for (size_t i = 0; i < s->n_tenants; i++) {
    const Commitkv__V1__TenantStats *t = s->tenants[i];
    PyObject *d = Py_BuildValue("{szsKsKsKsKsKsKsKsNsNsds{sKsKsKsKsO}}", "name", t->name, "sessions", (unsigned long long)t->sessions,
                                "clients", (unsigned long long)t->clients, "quota_bytes",
                                (unsigned long long)t->quota_bytes, "disk_bytes", (unsigned long long)t->disk_bytes,
                                "snapshots", (unsigned long long)t->snapshots, "quota_disk",
                                (unsigned long long)t->quota_disk, "max_snapshots", (unsigned long long)t->max_snapshots,
                                "tokens", token_counts(t->tokens), "bytes", byte_counts(t->bytes), "dedup_ratio",
                                t->dedup_ratio, "prefix", "lookup_tokens", (unsigned long long)t->prefix_lookup_tokens,
                                "hit_tokens", (unsigned long long)t->prefix_hit_tokens, "index_keys",
                                (unsigned long long)t->prefix_index_keys, "index_slots",
                                (unsigned long long)t->prefix_index_slots, "index_complete",
                                t->prefix_index_complete ? Py_True : Py_False);
    if (!d) goto fail;
    PyList_SET_ITEM(tenants, (Py_ssize_t)i, d);
  }
  PyObject *d = Py_BuildValue(
      "{sKsKsNsNsNsNsKsKsKsKsKsKsKsKsKsKsz}", "sessions", (unsigned long long)s->sessions, "clients",
      (unsigned long long)s->clients, "tokens", token_counts(s->tokens), "bytes", byte_counts(s->bytes), "arenas",
      arenas, "tenants", tenants, "detached_sessions", (unsigned long long)s->detached_sessions, "leases_expired",
      (unsigned long long)s->leases_expired, "sessions_detached", (unsigned long long)s->sessions_detached,
      "sessions_resumed", (unsigned long long)s->sessions_resumed, "sessions_expired",
      (unsigned long long)s->sessions_expired, "requests", (unsigned long long)s->requests, "errors",
      (unsigned long long)s->errors, "rounds", (unsigned long long)s->rounds, "uptime_ms",
      (unsigned long long)s->uptime_ms, "semantic_given_tokens", (unsigned long long)s->semantic_given_tokens,
      "backend", s->backend);
  if (!d) return NULL; /* "N" stole arenas and tenants */
  /* the compressor's figures, as `commitkvctl stats --json` has them */
  const struct {
    const char *key;
    uint64_t v;
  } compress[] = {{"pending_tokens", s->pending_tokens},         {"compress_queue", s->compress_queue},
                  {"compress_jobs", s->compress_jobs},           {"compress_refused", s->compress_refused},
                  {"transitions_staged", s->transitions_staged}, {"transitions_committed", s->transitions_committed},
                  {"transitions_recycled", s->transitions_recycled}, {"autosave_lag_ms", s->autosave_lag_ms},
                  {"disk_refused_saves", s->disk_refused_saves},
                  {"disk_refused_autosaves", s->disk_refused_autosaves},
                  {"disk_refused_offloads", s->disk_refused_offloads}};
  for (size_t i = 0; i < sizeof(compress) / sizeof(compress[0]); i++) {
    PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)compress[i].v);
    if (!v || PyDict_SetItemString(d, compress[i].key, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(v);
  }
  /* the remote store, as `commitkvctl stats --json` has it: null without one */
  const Commitkv__V1__RemoteStats *rs = s->remote;
  PyObject *remote = rs ? Py_BuildValue("{szsKsKsKsKsKsKsO}", "url", rs->url, "saves", (unsigned long long)rs->saves,
                                        "save_bytes", (unsigned long long)rs->save_bytes, "loads",
                                        (unsigned long long)rs->loads, "load_bytes", (unsigned long long)rs->load_bytes,
                                        "misses", (unsigned long long)rs->misses, "errors",
                                        (unsigned long long)rs->errors, "connected", rs->connected ? Py_True : Py_False)
                        : (Py_INCREF(Py_None), Py_None);
  if (!remote || PyDict_SetItemString(d, "remote", remote) < 0) {
    Py_XDECREF(remote);
    Py_DECREF(d);
    return NULL;
  }
  Py_DECREF(remote);
  /* per tier, as `commitkvctl stats --json` has them */
  PyObject *tiers = PyList_New((Py_ssize_t)s->n_tiers);
  for (size_t i = 0; tiers && i < s->n_tiers; i++) {
    const Commitkv__V1__TierStats *t = s->tiers[i];
    PyObject *td = Py_BuildValue(
        "{szsKsKsKsKsKsKsKsKsKsKsKsKsKsKsK}", "tier", t->tier, "bytes", (unsigned long long)t->bytes, "capacity",
        (unsigned long long)t->capacity, "sessions", (unsigned long long)t->sessions, "hits",
        (unsigned long long)t->hits, "misses", (unsigned long long)t->misses, "offloads",
        (unsigned long long)t->offloads, "offload_bytes", (unsigned long long)t->offload_bytes, "restores",
        (unsigned long long)t->restores, "restore_bytes", (unsigned long long)t->restore_bytes, "cancelled",
        (unsigned long long)t->cancelled, "refused", (unsigned long long)t->refused, "errors",
        (unsigned long long)t->errors, "pressure_moves", (unsigned long long)t->pressure_moves, "hit_tokens",
        (unsigned long long)t->hit_tokens, "miss_tokens", (unsigned long long)t->miss_tokens);
    if (!td) {
      Py_CLEAR(tiers);
      break;
    }
    PyList_SET_ITEM(tiers, (Py_ssize_t)i, td);
  }
  if (!tiers || PyDict_SetItemString(d, "tiers", tiers) < 0) {
    Py_XDECREF(tiers);
    Py_DECREF(d);
    return NULL;
  }
  Py_DECREF(tiers);
  return d;
fail:
  Py_XDECREF(arenas);
  Py_XDECREF(tenants);
  return NULL;
}

static PyObject *client_stats(ckvpy_client *self, PyObject *unused) {
  if (!enter(self)) return NULL;
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep = NULL;
  int r;
  char err[512];
  ckv_client *c = self->c;
  Py_BEGIN_ALLOW_THREADS
  r = ckv_rpc(c, &req, &rep);
  if (r == CKV_OK && (rep->body_case != COMMITKV__V1__RESPONSE__BODY_STATS || !rep->stats)) {
    ckv_rpc_free(rep);
    r = CKV_ERR_PROTO;
    snprintf(err, sizeof(err), "the daemon answered a stats request without stats");
  } else if (r < 0) {
    ckvpy_copy_error(c, r, err, sizeof(err));
  }
  Py_END_ALLOW_THREADS
  leave(self);
  if (r < 0) return ckvpy_raise(r, err);
  PyObject *d = stats_dict(rep->stats);
  ckv_rpc_free(rep);
  return d;
}

/* ---- small calls ------------------------------------------------------------ */

static PyObject *client_heartbeat(ckvpy_client *self, PyObject *unused) {
  if (!enter(self)) return NULL;
  int r;
  char err[512];
  ckv_client *c = self->c;
  Py_BEGIN_ALLOW_THREADS
  r = ckv_client_heartbeat(c);
  if (r < 0) ckvpy_copy_error(c, r, err, sizeof(err));
  Py_END_ALLOW_THREADS
  leave(self);
  if (r < 0) return ckvpy_raise(r, err);
  Py_RETURN_NONE;
}

static PyObject *client_reconnect(ckvpy_client *self, PyObject *unused) {
  if (!enter(self)) return NULL;
  int r;
  char err[512];
  ckv_client *c = self->c;
  Py_BEGIN_ALLOW_THREADS
  r = ckv_client_reconnect(c);
  if (r < 0) ckvpy_copy_error(c, r, err, sizeof(err));
  Py_END_ALLOW_THREADS
  leave(self);
  if (r < 0) return ckvpy_raise(r, err);
  Py_RETURN_NONE;
}

static PyObject *client_get_tenant(ckvpy_client *self, void *unused) {
  if (!self->c) return closed_error();
  return PyUnicode_FromString(ckv_client_tenant(self->c));
}

static PyObject *client_get_memory_kind(ckvpy_client *self, void *unused) {
  if (!self->c) return PyUnicode_FromString("none");
  return PyUnicode_FromString(ckv_client_memory_kind(self->c));
}

static PyObject *client_get_lease_ms(ckvpy_client *self, void *unused) {
  if (!self->c) return closed_error();
  return PyLong_FromUnsignedLong(ckv_client_lease_ms(self->c));
}

static PyObject *client_get_restarted(ckvpy_client *self, void *unused) {
  if (!enter(self)) return NULL;
  bool r;
  ckv_client *c = self->c;
  Py_BEGIN_ALLOW_THREADS
  r = ckv_client_restarted(c);
  Py_END_ALLOW_THREADS
  leave(self);
  return PyBool_FromLong(r);
}

static PyObject *client_get_closed(ckvpy_client *self, void *unused) { return PyBool_FromLong(self->closed); }

static PyObject *client_lookup_prefix(ckvpy_client *self, PyObject *args) {
  const char *ids, *model_id = NULL, *model_revision = NULL;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "y#|zz", &ids, &len, &model_id, &model_revision)) return NULL;
  if (len % 4) return PyErr_Format(PyExc_ValueError, "token_ids must be packed uint32 values");
  if (self->closed) return closed_error();
  uint32_t *tids = len ? PyMem_Malloc((size_t)len) : NULL;
  if (len && !tids) return PyErr_NoMemory();
  if (len) memcpy(tids, ids, (size_t)len);
  if (!enter(self)) {
    PyMem_Free(tids);
    return NULL;
  }
  ckv_client *c = self->c;
  uint64_t matched = 0;
  char err[512];
  int r;
  Py_BEGIN_ALLOW_THREADS
  r = ckv_client_lookup_prefix(c, tids, (size_t)len / 4, model_id, model_revision, &matched);
  if (r < 0) ckvpy_copy_error(c, r, err, sizeof(err));
  Py_END_ALLOW_THREADS
  PyMem_Free(tids);
  leave(self);
  if (r < 0) return ckvpy_raise(r, err);
  return PyLong_FromUnsignedLongLong(matched);
}

static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS, "Detaches open sessions and disconnects."},
    {"open_session", (PyCFunction)(void (*)(void))client_open_session, METH_VARARGS | METH_KEYWORDS,
     "open_session(id, n_layers, n_kv_heads, head_dim, dtype, policy, names, values, resume, draft_block_tokens, "
     "commit_block_tokens) -> _Session"},
    {"stats", (PyCFunction)client_stats, METH_NOARGS, "The daemon's figures as a dict."},
    {"lookup_prefix", (PyCFunction)client_lookup_prefix, METH_VARARGS,
     "lookup_prefix(token_ids_bytes, model_id=None, model_revision=None) -> matched tokens"},
    {"heartbeat", (PyCFunction)client_heartbeat, METH_NOARGS, "One heartbeat now."},
    {"reconnect", (PyCFunction)client_reconnect, METH_NOARGS, "Re-attaches after a daemon restart."},
    {NULL}};

static PyGetSetDef client_getset[] = {{"tenant", (getter)client_get_tenant, NULL, "Tenant name.", NULL},
                                      {"memory_kind", (getter)client_get_memory_kind, NULL, "host, cuda or none.", NULL},
                                      {"lease_ms", (getter)client_get_lease_ms, NULL, "Lease length (ms).", NULL},
                                      {"restarted", (getter)client_get_restarted, NULL, "Daemon restart noticed.", NULL},
                                      {"closed", (getter)client_get_closed, NULL, "close() was called.", NULL},
                                      {NULL}};

PyTypeObject ckvpy_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commitkv._commitkv._Client",
    .tp_basicsize = sizeof(ckvpy_client),
    .tp_dealloc = (destructor)client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One connection to commitkvd (use commitkv.connect).",
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_weaklistoffset = offsetof(ckvpy_client, weakrefs),
};
