/* session.c - commitkv._commitkv._Session: one ckv_session.
 *
 * Appends tokens, writes K/V from caller buffers into the draft slots (dtype
 * and shape checked first), hands out the view's blocks as read-only arena
 * buffers, runs the fused mixed-format attention kernel over the view and
 * folds its per-slot mass into per-position mass, reports rounds and
 * acknowledges epochs.  Every libcommitkv call and the kernel run with the
 * GIL released; see ext.h for the two locks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/rpc.h"
#include "ext.h"
#include "kernels/format.h"
#include "kernels/kernels.h"

#define NOT_OPEN_TEXT "this session is closed"

static PyObject *closed_error(ckvpy_session *self) { return ckvpy_raise(CKV_ERR_STATE, NOT_OPEN_TEXT); }

PyObject *ckvpy_session_new(ckvpy_client *owner, ckv_session *s, const char *id) {
  ckvpy_session *self = PyObject_New(ckvpy_session, &ckvpy_session_type);
  if (!self) {
    Py_BEGIN_ALLOW_THREADS
    ckv_session_close(s);
    Py_END_ALLOW_THREADS
    return NULL;
  }
  Py_INCREF(owner);
  self->client = owner;
  self->s = s;
  self->geom = *ckv_session_geometry(s);
  snprintf(self->id, sizeof(self->id), "%s", id);
  pthread_mutex_init(&self->lock, NULL);
  pthread_rwlock_init(&self->readers, NULL);
  self->weakrefs = NULL;
  self->prev = NULL;
  self->next = owner->sessions;
  if (owner->sessions) owner->sessions->prev = self;
  owner->sessions = self;
  return (PyObject *)self;
}

static void unlink_session(ckvpy_session *self) {
  ckvpy_client *c = self->client;
  if (self->prev)
    self->prev->next = self->next;
  else if (c->sessions == self)
    c->sessions = self->next;
  if (self->next) self->next->prev = self->prev;
  self->next = self->prev = NULL;
}

int ckvpy_session_finish(ckvpy_session *self, bool keep) {
  if (!self->s) return 0;
  unlink_session(self);
  int r;
  char err[512];
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  pthread_rwlock_wrlock(&self->readers); /* no kernel reads the view any more */
  ckv_session *s = self->s;
  self->s = NULL;
  r = s ? (keep ? ckv_session_close(s) : ckv_session_drop(s)) : 0;
  if (r == CKV_ERR_DAEMON_RESTARTED) r = 0; /* the session went with the old daemon: nothing left to close */
  if (r < 0) ckvpy_copy_error(c, r, err, sizeof(err));
  pthread_rwlock_unlock(&self->readers);
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) {
    ckvpy_raise(r, err);
    return -1;
  }
  return 0;
}

static void session_dealloc(ckvpy_session *self) {
  if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
  /* Forgotten without close(): detach, so the daemon keeps it for resume
   * (detach_keep) instead of losing its tokens. */
  if (self->s && ckvpy_session_finish(self, /* keep= */ true) < 0) PyErr_Clear();
  pthread_rwlock_destroy(&self->readers);
  pthread_mutex_destroy(&self->lock);
  Py_DECREF(self->client);
  PyObject_Free(self);
}

static PyObject *session_close(ckvpy_session *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"keep", NULL};
  int keep = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &keep)) return NULL;
  if (ckvpy_session_finish(self, keep != 0) < 0) return NULL;
  Py_RETURN_NONE;
}

/* ---- append ------------------------------------------------------------------ */

/* An optional per-token array: None, or `count` items of one of `formats`. */
static int optional_array(PyObject *obj, const char *formats, const char *what, const char *want, uint32_t count,
                          Py_buffer *view, const void **ret) {
  *ret = NULL;
  if (!obj || obj == Py_None) return 0;
  if (ckvpy_get_buffer(obj, formats, what, want, view) < 0) return -1;
  Py_ssize_t n = view->itemsize ? view->len / view->itemsize : 0;
  if (n != (Py_ssize_t)count) {
    PyErr_Format(PyExc_ValueError, "%s: %zd items for %u tokens", what, n, count);
    PyBuffer_Release(view);
    view->obj = NULL;
    return -1;
  }
  *ret = view->buf;
  return 0;
}

static PyObject *session_append(ckvpy_session *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"count", "roles", "tags", "semantic", "token_ids", NULL};
  unsigned int count;
  PyObject *o_roles = NULL, *o_tags = NULL, *o_sem = NULL, *o_ids = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "I|OOOO", kwlist, &count, &o_roles, &o_tags, &o_sem, &o_ids))
    return NULL;
  Py_buffer b[4] = {{0}};
  const void *p[4];
  PyObject *result = NULL;
  if (optional_array(o_roles, "B", "roles", "uint8", count, &b[0], &p[0]) < 0 ||
      optional_array(o_tags, "B", "tags", "uint8", count, &b[1], &p[1]) < 0 ||
      optional_array(o_sem, "f", "semantic", "float32", count, &b[2], &p[2]) < 0 ||
      optional_array(o_ids, "I", "token_ids", "uint32", count, &b[3], &p[3]) < 0)
    goto out;
  int r;
  uint64_t first = 0;
  char err[512];
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  r = self->s ? ckv_session_append(self->s, count, p[0], p[1], p[2], p[3], &first) : CKV_ERR_STATE;
  if (r < 0) ckvpy_copy_error(self->s ? c : NULL, r, err, sizeof(err));
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0)
    ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
  else
    result = PyLong_FromUnsignedLongLong(first);
out:
  for (int i = 0; i < 4; i++)
    if (b[i].obj) PyBuffer_Release(&b[i]);
  return result;
}

/* ---- write_kv ---------------------------------------------------------------- */

/* Number of tokens in a K or V buffer of this session's geometry: shape
 * (H, D) or (H*D,) is one token; (n, H, D) or (n, H*D) is n tokens. */
static long tokens_in(const ckvpy_session *self, const Py_buffer *b, const char *what, const char *want) {
  Py_ssize_t H = self->geom.n_kv_heads, D = self->geom.head_dim;
  const Py_ssize_t *sh = b->shape;
  long n = -1;
  if (b->ndim == 1 && sh[0] == H * D) n = 1;
  if (b->ndim == 2 && sh[0] == H && sh[1] == D) n = 1;
  if (b->ndim == 2 && n < 0 && sh[1] == H * D && sh[0] > 0) n = (long)sh[0];
  if (b->ndim == 3 && sh[1] == H && sh[2] == D && sh[0] > 0) n = (long)sh[0];
  if (n < 0) {
    char got[96] = "(";
    for (int i = 0; i < b->ndim && i < 6; i++)
      snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%zd", i ? ", " : "", sh[i]);
    snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s)", b->ndim == 1 ? "," : "");
    PyErr_Format(PyExc_ValueError,
                 "%s: wrong shape %s; session '%s' wants (n_kv_heads=%zd, head_dim=%zd) per token, or (n, %zd, %zd) "
                 "for n tokens, %s",
                 what, got, self->id, H, D, H, D, want);
  }
  return n;
}

static PyObject *session_write_kv(ckvpy_session *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"position", "layer", "k", "v", NULL};
  unsigned long long pos;
  unsigned int layer;
  PyObject *ok, *ov;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "KIOO", kwlist, &pos, &layer, &ok, &ov)) return NULL;
  bool bf16 = self->geom.dtype == CKV_DTYPE_BF16;
  const char *fmts = bf16 ? "Hh" : "e";
  const char *want = bf16 ? "uint16 holding bfloat16 bits (bf16 session)" : "float16 (fp16 session)";
  Py_buffer kb = {0}, vb = {0};
  PyObject *result = NULL;
  long nk = 0, nv = 0;
  if (ok != Py_None) {
    if (ckvpy_get_buffer(ok, fmts, "k", want, &kb) < 0) goto out;
    if ((nk = tokens_in(self, &kb, "k", want)) < 0) goto out;
  }
  if (ov != Py_None) {
    if (ckvpy_get_buffer(ov, fmts, "v", want, &vb) < 0) goto out;
    if ((nv = tokens_in(self, &vb, "v", want)) < 0) goto out;
  }
  if (nk && nv && nk != nv) {
    PyErr_Format(PyExc_ValueError, "k holds %ld tokens, v %ld", nk, nv);
    goto out;
  }
  long n = nk ? nk : nv;
  size_t elems = ckv_draft_token_elems(&self->geom);
  int r = CKV_OK;
  char err[512];
  ckv_client *c = self->client->c;
  const uint16_t *kp = kb.obj ? kb.buf : NULL, *vp = vb.obj ? vb.buf : NULL;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  for (long i = 0; i < n && r == CKV_OK; i++)
    r = self->s ? ckv_session_write_kv(self->s, pos + (uint64_t)i, layer, kp ? kp + (size_t)i * elems : NULL,
                                       vp ? vp + (size_t)i * elems : NULL)
                : CKV_ERR_STATE;
  if (r < 0) {
    if (r == CKV_ERR_RANGE)
      snprintf(err, sizeof(err), "no writable draft slot for position %llu layer %u of session '%s' (%u layers; "
               "slots are writable from append until the next report)",
               pos, layer, self->id, self->geom.n_layers);
    else
      ckvpy_copy_error(self->s ? c : NULL, r, err, sizeof(err));
  }
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0)
    ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
  else
    result = PyLong_FromLong(n);
out:
  if (kb.obj) PyBuffer_Release(&kb);
  if (vb.obj) PyBuffer_Release(&vb);
  return result;
}

/* ---- view ---------------------------------------------------------------------- */

/* The current view's blocks copied out of the session (draft, staged,
 * committed, cold in that order); call with self->lock held. */
typedef struct view_copy {
  uint64_t epoch, n_tokens, tokens;
  ckv_block_view *blocks;
  size_t n, n_draft, n_staged, n_committed; /* the rest are cold */
} view_copy;

/* Which cold blocks an attention call reads: those query rows q
 * ([rows][qheads][head_dim]) could need at `layer`, at most max_blocks per
 * row (ckv_session_cold_select_top, min_weight), their union. */
typedef struct cold_query {
  uint32_t layer, rows, qheads, max_blocks;
  float scale, min_weight;
  const float *q;
} cold_query;

/* Marks in `pick` (one byte per cold block of v) the blocks cq selects. */
static int pick_cold(ckvpy_session *self, const ckv_view *v, const cold_query *cq, uint8_t *pick, char *err,
                     size_t errlen) {
  uint32_t *idx = malloc(v->n_cold * sizeof(*idx));
  if (!idx) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  const size_t row = (size_t)cq->qheads * self->geom.head_dim;
  int r = CKV_OK;
  for (uint32_t i = 0; i < cq->rows && r == CKV_OK; i++) {
    size_t n = 0;
    r = ckv_session_cold_select_top(self->s, cq->layer, cq->q + i * row, cq->qheads, cq->scale, cq->min_weight,
                                    cq->max_blocks, idx, &n);
    for (size_t k = 0; r == CKV_OK && k < n; k++) pick[idx[k]] = 1;
  }
  if (r < 0) ckvpy_copy_error(self->client->c, r, err, errlen);
  free(idx);
  return r;
}

/* cq NULL: every cold block (a view); else the cold blocks cq selects. */
static int copy_view(ckvpy_session *self, view_copy *ret, const cold_query *cq, char *err, size_t errlen) {
  if (!self->s) {
    snprintf(err, errlen, NOT_OPEN_TEXT);
    return CKV_ERR_STATE;
  }
  ckv_client *c = self->client->c;
  if (strcmp(ckv_client_memory_kind(c), "host") != 0) {
    snprintf(err, errlen, "the arena is '%s' memory: views and CPU attention need host memory",
             ckv_client_memory_kind(c));
    return CKV_ERR_UNSUPPORTED;
  }
  const ckv_view *v;
  int r = ckv_session_view(self->s, &v);
  if (r < 0) {
    ckvpy_copy_error(c, r, err, errlen);
    return r;
  }
  size_t n = v->n_draft + v->n_staged + v->n_committed;
  ckv_block_view *b = malloc((n + v->n_cold + 1) * sizeof(*b)); /* +1: a gathered block (session_attention) */
  uint8_t *pick = cq && v->n_cold ? calloc(v->n_cold, 1) : NULL;
  if (!b || (cq && v->n_cold && !pick)) {
    free(b);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  if (v->n_draft) memcpy(b, v->draft, v->n_draft * sizeof(*b));
  if (v->n_staged) memcpy(b + v->n_draft, v->staged, v->n_staged * sizeof(*b));
  if (v->n_committed) memcpy(b + v->n_draft + v->n_staged, v->committed, v->n_committed * sizeof(*b));
  size_t primary = n;
  if (pick && (r = pick_cold(self, v, cq, pick, err, errlen)) < 0) {
    free(pick);
    free(b);
    return r;
  }
  for (size_t i = 0; i < v->n_cold; i++)
    if (!cq || pick[i]) b[n++] = v->cold[i];
  free(pick);
  *ret = (view_copy){.epoch = v->epoch, .n_tokens = v->n_tokens, .tokens = ckv_session_tokens(self->s),
                     .blocks = b, .n = n, .n_draft = v->n_draft, .n_staged = v->n_staged,
                     .n_committed = primary - v->n_draft - v->n_staged};
  return CKV_OK;
}

static PyObject *block_dict(ckvpy_session *self, const ckv_block_view *b, const char *category) {
  PyObject *buf = ckvpy_arena_buffer_new(self->client, b->data, (Py_ssize_t)b->bytes);
  if (!buf) return NULL;
  uint32_t cap = b->capacity;
  PyObject *strides = Py_None;
  Py_INCREF(Py_None);
  /* Draft K/V as arrays only when the block holds every byte the layout
   * names: a daemon's word is checked before numpy is pointed at memory. */
  if (b->format == CKV_FORMAT_DRAFT && cap && b->bytes >= ckv_draft_block_bytes(&self->geom, cap)) {
    size_t base = ckv_draft_kv_offset(&self->geom, cap, 0, 0, 0);
    Py_DECREF(strides);
    strides = Py_BuildValue("(nnn)", (Py_ssize_t)(ckv_draft_kv_offset(&self->geom, cap, 1, 0, 0) - base),
                            (Py_ssize_t)(ckv_draft_kv_offset(&self->geom, cap, 0, 1, 0) - base),
                            (Py_ssize_t)(ckv_draft_kv_offset(&self->geom, cap, 0, 0, 1) - base));
    if (!strides) {
      Py_DECREF(buf);
      return NULL;
    }
  }
  bool header_fits = b->bytes >= ckv_block_payload_offset(cap);
  return Py_BuildValue("{sssIsKsIsKsNsnsnsnsN}", "category", category, "format", b->format, "id",
                       (unsigned long long)b->id, "capacity", cap, "bytes", (unsigned long long)b->bytes, "buffer",
                       buf, "positions_offset", header_fits ? (Py_ssize_t)ckv_block_positions_offset() : (Py_ssize_t)-1,
                       "bitmap_offset", header_fits ? (Py_ssize_t)ckv_block_bitmap_offset(cap) : (Py_ssize_t)-1,
                       "payload_offset", header_fits ? (Py_ssize_t)ckv_block_payload_offset(cap) : (Py_ssize_t)-1,
                       "draft_strides", strides);
}

static PyObject *session_view(ckvpy_session *self, PyObject *unused) {
  view_copy vc = {0};
  int r;
  char err[512];
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  r = copy_view(self, &vc, NULL, err, sizeof(err));
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) return ckvpy_raise(r, err);
  PyObject *list = PyList_New((Py_ssize_t)vc.n), *result = NULL;
  if (!list) goto out;
  for (size_t i = 0; i < vc.n; i++) {
    const char *cat = i < vc.n_draft                                ? "draft"
                      : i < vc.n_draft + vc.n_staged                ? "staged"
                      : i < vc.n_draft + vc.n_staged + vc.n_committed ? "committed"
                                                                      : "cold";
    PyObject *d = block_dict(self, &vc.blocks[i], cat);
    if (!d) goto out;
    PyList_SET_ITEM(list, (Py_ssize_t)i, d);
  }
  result = Py_BuildValue("(KKO)", (unsigned long long)vc.epoch, (unsigned long long)vc.n_tokens, list);
out:
  Py_XDECREF(list);
  free(vc.blocks);
  return result;
}

/* ---- attention --------------------------------------------------------------------- */

/* A private draft block of every layer holding n_extra tokens' FP16 K/V
 * (ek, ev: [n_extra][n_kv_heads][head_dim]) in `layer` and zeros elsewhere,
 * at positions after the session's: tokens the caller attends to without
 * appending them (greedy decoding aside, as the C worker's aside block).
 * NULL when out of memory. */
static void *extra_block(const ckv_geometry *g, uint32_t layer, uint32_t n_extra, uint64_t first_pos,
                         const uint16_t *ek, const uint16_t *ev) {
  size_t bytes = ckv_format_block_bytes(CKV_FORMAT_DRAFT, g, n_extra, 0);
  void *blk = bytes ? aligned_alloc(64, (bytes + 63u) / 64u * 64u) : NULL;
  if (!blk) return NULL;
  memset(blk, 0, bytes);
  if (ckv_block_init(blk, CKV_FORMAT_DRAFT, g, n_extra, 0, 1) != CKV_OK) {
    free(blk);
    return NULL;
  }
  size_t te = ckv_draft_token_elems(g);
  for (uint32_t t = 0; t < n_extra; t++) {
    memcpy((uint8_t *)blk + ckv_draft_kv_offset(g, n_extra, layer, 0, t), ek + t * te, te * 2u);
    memcpy((uint8_t *)blk + ckv_draft_kv_offset(g, n_extra, layer, 1, t), ev + t * te, te * 2u);
    ckv_block_positions(blk)[t] = (uint32_t)(first_pos + t);
    ckv_block_set_valid(blk, t, true);
  }
  return blk;
}

/* The kernel over the copied view (and the extra block, when given, after
 * it), then per-slot mass summed per position (the extra tokens' mass is
 * not counted).  Runs without the GIL and without self->lock, under
 * self->readers. */
static int attend(const ckvpy_session *self, const view_copy *vc, uint32_t layer, uint32_t rows, uint32_t qheads,
                  float scale, uint32_t threads, const float *q, const void *extra, float *out, float *pos_mass) {
  size_t nb = vc->n + (extra ? 1u : 0u);
  const void **blocks = malloc((nb ? nb : 1) * sizeof(*blocks));
  if (!blocks) return -ENOMEM;
  for (size_t i = 0; i < vc->n; i++) blocks[i] = vc->blocks[i].data;
  if (extra) blocks[vc->n] = extra;
  ckv_attn_args a = {.geom = &self->geom, .layer = layer, .n_rows = rows, .n_q_heads = qheads, .scale = scale,
                     .q = q, .blocks = blocks, .n_blocks = (uint32_t)nb, .out = out, .n_threads = threads};
  size_t need = ckv_attention_mass_len(blocks, (uint32_t)nb);
  float *slot_mass = malloc((need ? need : 1) * sizeof(float));
  size_t ws = ckv_attention_workspace_bytes(&a);
  void *work = ws ? malloc(ws) : NULL;
  int r = -ENOMEM;
  if (slot_mass && (work || !ws)) {
    a.mass = slot_mass;
    a.workspace = work;
    a.workspace_bytes = work ? ws : 0;
    r = ckv_kernels_attention(&a);
  }
  if (r == CKV_OK) {
    size_t base = 0;
    for (size_t b = 0; b < vc->n; b++) {
      const uint32_t *positions = ckv_block_positions_const(blocks[b]);
      uint32_t cap = ((const ckv_block_header *)blocks[b])->capacity;
      for (uint32_t sl = 0; sl < cap && base + sl < need; sl++) {
        float m = slot_mass[base + sl];
        if (m > 0.f && ckv_block_slot_valid(blocks[b], sl) && positions[sl] < vc->tokens) pos_mass[positions[sl]] += m;
      }
      base += cap;
    }
  }
  free(work);
  free(slot_mass);
  free(blocks);
  return r;
}

/* cold_gather: per query row, the cold tokens it needs most (ckv_session_cold_gather) in a private draft
 * block of `per_row` slots, as the C worker reads the cold tier; the blocks of one call hold at most
 * GATHER_MAX_BYTES. */
#define GATHER_MAX_BYTES ((size_t)256 << 20)
typedef struct gathered {
  void **blk;
  ckv_block_view *view; /* blk[i] as a block of the view, for attend */
  size_t *n;            /* tokens gathered for row i */
} gathered;

static void gathered_free(gathered *gb, uint32_t rows) {
  for (uint32_t i = 0; gb->blk && i < rows; i++) free(gb->blk[i]);
  free(gb->blk);
  free(gb->view);
  free(gb->n);
  *gb = (gathered){0};
}

/* Fills gb for `rows` query rows; call with self->lock held, after copy_view (the view it gathers from). */
static int gather_cold(ckvpy_session *self, uint32_t layer, uint32_t rows, uint32_t qheads, float scale, const float *q,
                       uint32_t per_row, gathered *gb, char *err, size_t errlen) {
  const size_t bytes = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &self->geom, per_row, 0);
  const size_t row = (size_t)qheads * self->geom.head_dim;
  gb->blk = calloc(rows, sizeof(void *));
  gb->view = calloc(rows, sizeof(ckv_block_view));
  gb->n = calloc(rows, sizeof(size_t));
  if (!bytes || !gb->blk || !gb->view || !gb->n) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < rows; i++) {
    if (!(gb->blk[i] = aligned_alloc(64, (bytes + 63u) / 64u * 64u))) {
      snprintf(err, errlen, "out of memory");
      return -ENOMEM;
    }
    memset(gb->blk[i], 0, bytes); /* rows of slots the gather leaves invalid are never garbage */
    int r = ckv_session_cold_gather(self->s, layer, q + i * row, qheads, scale, per_row, gb->blk[i], per_row, NULL,
                                    &gb->n[i]);
    if (r < 0) {
      ckvpy_copy_error(self->client->c, r, err, errlen);
      return r;
    }
    gb->view[i] = (ckv_block_view){.data = gb->blk[i], .bytes = bytes, .format = CKV_FORMAT_DRAFT, .capacity = per_row};
  }
  return CKV_OK;
}

static PyObject *session_attention(ckvpy_session *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"layer", "q", "scale", "threads", "extra_k", "extra_v", "cold_max_blocks",
                           "cold_min_weight", "cold_gather", NULL};
  unsigned int layer, threads = 0, cold_max = 4, gather = 0;
  PyObject *oq, *oek = NULL, *oev = NULL;
  double scale = 0.0, cold_min_weight = 0.01;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "IO|dIOOIdI", kwlist, &layer, &oq, &scale, &threads, &oek, &oev, &cold_max,
                                   &cold_min_weight, &gather))
    return NULL;
  if (!(cold_min_weight > 0.0 && cold_min_weight <= 1.0)) {
    PyErr_SetString(PyExc_ValueError, "cold_min_weight: a share of attention in (0, 1]");
    return NULL;
  }
  if (gather > CKV_MAX_BLOCK_TOKENS) {
    PyErr_Format(PyExc_ValueError, "cold_gather: %u tokens per query row; at most %u", gather, CKV_MAX_BLOCK_TOKENS);
    return NULL;
  }
  if ((oek && oek != Py_None) != (oev && oev != Py_None)) {
    PyErr_SetString(PyExc_ValueError, "extra_k and extra_v go together");
    return NULL;
  }
  if (layer >= self->geom.n_layers) {
    char t[128];
    snprintf(t, sizeof(t), "layer %u of a session with %u layers", layer, self->geom.n_layers);
    return ckvpy_raise(CKV_ERR_RANGE, t);
  }
  char want[160];
  snprintf(want, sizeof(want), "float32 of shape (n_q_heads, %u) or (n_rows, n_q_heads, %u), n_q_heads a multiple of %u",
           self->geom.head_dim, self->geom.head_dim, self->geom.n_kv_heads);
  Py_buffer qb, kb = {0}, vb = {0};
  if (ckvpy_get_buffer(oq, "f", "q", want, &qb) < 0) return NULL;
  PyObject *out_obj = NULL, *mass_obj = NULL, *result = NULL;
  void *extra = NULL;
  uint32_t n_extra = 0;
  if (oek && oek != Py_None) {
    if (self->geom.dtype != CKV_DTYPE_FP16) {
      PyErr_SetString(PyExc_ValueError, "extra_k, extra_v: extra tokens need a session of dtype fp16");
      goto out;
    }
    size_t te = ckv_draft_token_elems(&self->geom);
    char ew[160];
    snprintf(ew, sizeof(ew), "float16 of shape (n, %u, %u), 1 <= n <= %u", self->geom.n_kv_heads, self->geom.head_dim,
             CKV_MAX_BLOCK_TOKENS);
    if (ckvpy_get_buffer(oek, "e", "extra_k", ew, &kb) < 0) goto out;
    if (ckvpy_get_buffer(oev, "e", "extra_v", ew, &vb) < 0) goto out;
    size_t nk = (size_t)kb.len / 2u;
    if (nk == 0 || nk % te != 0 || nk / te > CKV_MAX_BLOCK_TOKENS || vb.len != kb.len) {
      PyErr_Format(PyExc_ValueError, "extra_k, extra_v: %zd and %zd bytes; wanted %s each", kb.len, vb.len, ew);
      goto out;
    }
    n_extra = (uint32_t)(nk / te);
  }
  Py_ssize_t rows = qb.ndim == 3 ? qb.shape[0] : 1, qh = qb.ndim >= 2 ? qb.shape[qb.ndim - 2] : 0;
  if ((qb.ndim != 2 && qb.ndim != 3) || qb.shape[qb.ndim - 1] != (Py_ssize_t)self->geom.head_dim || rows < 1 ||
      qh < 1 || qh % self->geom.n_kv_heads != 0 || qh > 65536 || rows > 65536) {
    PyErr_Format(PyExc_ValueError, "q: wrong shape (ndim %d); wanted %s", qb.ndim, want);
    goto out;
  }
  if (gather) { /* a block of every layer per row: bounded, so many rows cannot take the host's memory */
    size_t per_row = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &self->geom, gather, 0);
    if (!per_row || (size_t)rows > GATHER_MAX_BYTES / per_row) {
      PyErr_Format(PyExc_ValueError,
                   "cold_gather: %u tokens for each of %zd query rows need %zu bytes of blocks; at most %zu: pass "
                   "fewer rows or tokens",
                   gather, rows, (size_t)rows * per_row, (size_t)GATHER_MAX_BYTES);
      goto out;
    }
  }
  out_obj = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(qb.len));
  if (!out_obj) goto out;
  float *out = (float *)PyByteArray_AS_STRING(out_obj);
  view_copy vc = {0};
  float *pos_mass = NULL;
  gathered gb = {0};
  int r;
  char err[512];
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  /* cold_gather: no cold block whole (no row selects one), each row's cold tokens gathered instead */
  cold_query cq = {.layer = layer, .rows = gather ? 0u : (uint32_t)rows, .qheads = (uint32_t)qh, .max_blocks = cold_max,
                   .scale = (float)scale, .min_weight = (float)cold_min_weight, .q = qb.buf};
  r = copy_view(self, &vc, &cq, err, sizeof(err));
  if (r == CKV_OK && gather)
    r = gather_cold(self, layer, (uint32_t)rows, (uint32_t)qh, (float)scale, qb.buf, gather, &gb, err, sizeof(err));
  bool reading = r == CKV_OK;
  if (reading) pthread_rwlock_rdlock(&self->readers); /* before the lock goes: no ack in between */
  pthread_mutex_unlock(&self->lock);
  if (r == CKV_OK && n_extra &&
      !(extra = extra_block(&self->geom, layer, n_extra, vc.tokens, (const uint16_t *)kb.buf, (const uint16_t *)vb.buf)))
    r = -ENOMEM;
  if (r == CKV_OK) {
    pos_mass = calloc(vc.tokens ? vc.tokens : 1, sizeof(float));
    if (!pos_mass) r = -ENOMEM;
    else if (!gather)
      r = attend(self, &vc, layer, (uint32_t)rows, (uint32_t)qh, (float)scale, threads, qb.buf, extra, out, pos_mass);
    else /* row by row, each over the view and its own gathered block (listed last, so its mass counts) */
      for (Py_ssize_t i = 0; i < rows && r == CKV_OK; i++) {
        const size_t row = (size_t)qh * self->geom.head_dim;
        view_copy vr = vc;
        if (gb.n[i]) vr.blocks[vr.n++] = gb.view[i];
        r = attend(self, &vr, layer, 1, (uint32_t)qh, (float)scale, threads, (const float *)qb.buf + (size_t)i * row,
                   extra, out + (size_t)i * row, pos_mass);
      }
  }
  gathered_free(&gb, (uint32_t)rows);
  if (reading) {
    pthread_rwlock_unlock(&self->readers);
    if (r < 0) snprintf(err, sizeof(err), "attention kernel: %s", ckv_strerror(r));
  }
  Py_END_ALLOW_THREADS
  free(extra);
  free(vc.blocks);
  if (r < 0) {
    free(pos_mass);
    ckvpy_raise(r, err);
    goto out;
  }
  mass_obj = PyByteArray_FromStringAndSize((const char *)pos_mass, (Py_ssize_t)(vc.tokens * sizeof(float)));
  free(pos_mass);
  if (!mass_obj) goto out;
  result = Py_BuildValue("(OOKK)", out_obj, mass_obj, (unsigned long long)vc.epoch, (unsigned long long)vc.tokens);
out:
  Py_XDECREF(out_obj);
  Py_XDECREF(mass_obj);
  PyBuffer_Release(&qb);
  if (kb.obj) PyBuffer_Release(&kb);
  if (vb.obj) PyBuffer_Release(&vb);
  return result;
}

/* ---- report, ack ---------------------------------------------------------------------- */

static PyObject *session_report(ckvpy_session *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"round", "attention_mass", "first_position", "semantic_positions", "semantic_scores", NULL};
  unsigned long long round, first = 0;
  PyObject *om, *osp = Py_None, *oss = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "KO|KOO", kwlist, &round, &om, &first, &osp, &oss)) return NULL;
  Py_buffer mb = {0}, pb = {0}, sb = {0};
  PyObject *result = NULL, *list = NULL;
  ckv_transition *tr = NULL;
  if (ckvpy_get_buffer(om, "f", "attention_mass", "float32, one value per position", &mb) < 0) goto out;
  size_t n_sem = 0;
  if (osp != Py_None || oss != Py_None) {
    if (ckvpy_get_buffer(osp, "I", "semantic positions", "uint32", &pb) < 0) goto out;
    if (ckvpy_get_buffer(oss, "f", "semantic scores", "float32", &sb) < 0) goto out;
    if (pb.len / 4 != sb.len / 4) {
      PyErr_Format(PyExc_ValueError, "semantic: %zd positions but %zd scores", pb.len / 4, sb.len / 4);
      goto out;
    }
    n_sem = (size_t)(pb.len / 4);
  }
  int r;
  char err[512];
  ckv_round_result rr = {0};
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  r = self->s ? CKV_OK : CKV_ERR_STATE;
  if (r == CKV_OK && n_sem) r = ckv_session_set_semantic(self->s, pb.buf, sb.buf, n_sem);
  if (r == CKV_OK) r = ckv_session_report(self->s, round, first, mb.buf, (size_t)(mb.len / 4), &rr);
  if (r == CKV_OK && rr.n_transitions) {
    tr = malloc(rr.n_transitions * sizeof(*tr)); /* rr.transitions lives until the next call */
    if (tr)
      memcpy(tr, rr.transitions, rr.n_transitions * sizeof(*tr));
    else
      r = -ENOMEM;
  }
  if (r < 0) ckvpy_copy_error(self->s ? c : NULL, r, err, sizeof(err));
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) {
    ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
    goto out;
  }
  list = PyList_New((Py_ssize_t)rr.n_transitions);
  if (!list) goto out;
  for (size_t i = 0; i < rr.n_transitions; i++) {
    PyObject *t = Py_BuildValue("(KIii)", (unsigned long long)tr[i].first_position, tr[i].count, (int)tr[i].from,
                                (int)tr[i].to);
    if (!t) goto out;
    PyList_SET_ITEM(list, (Py_ssize_t)i, t);
  }
  result = Py_BuildValue("(KIO)", (unsigned long long)rr.epoch, rr.pending, list);
out:
  free(tr);
  Py_XDECREF(list);
  if (mb.obj) PyBuffer_Release(&mb);
  if (pb.obj) PyBuffer_Release(&pb);
  if (sb.obj) PyBuffer_Release(&sb);
  return result;
}

/* (epoch, pending_tokens, compress_queue): this session's epoch and pending
 * tokens as the daemon has them now (ListSessions) and the jobs its
 * compressor has waiting or running (Stats, all sessions): what settle()
 * polls until the round's moves are done. */
static PyObject *session_info(ckvpy_session *self, PyObject *unused) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  Commitkv__V1__Response *rep = NULL;
  int r;
  char err[512] = "";
  uint64_t epoch = 0, pending = 0, queue = 0;
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  r = self->s ? ckv_rpc(c, &req, &rep) : CKV_ERR_STATE;
  if (r == CKV_OK) {
    const Commitkv__V1__SessionList *l =
        rep->body_case == COMMITKV__V1__RESPONSE__BODY_SESSION_LIST ? rep->session_list : NULL;
    r = CKV_ERR_NOT_FOUND;
    for (size_t i = 0; l && i < l->n_sessions; i++)
      if (l->sessions[i]->session_id && !strcmp(l->sessions[i]->session_id, self->id)) {
        epoch = l->sessions[i]->epoch;
        pending = l->sessions[i]->pending_tokens;
        r = CKV_OK;
      }
    if (r < 0) snprintf(err, sizeof(err), "the daemon does not list session '%s'", self->id);
    ckv_rpc_free(rep);
  } else if (r < 0 && self->s) {
    ckvpy_copy_error(c, r, err, sizeof(err));
  }
  if (r == CKV_OK) {
    Commitkv__V1__Request sq = COMMITKV__V1__REQUEST__INIT;
    Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
    sq.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
    sq.stats = &sr;
    r = ckv_rpc(c, &sq, &rep);
    if (r == CKV_OK) {
      queue = rep->body_case == COMMITKV__V1__RESPONSE__BODY_STATS && rep->stats ? rep->stats->compress_queue : 0;
      ckv_rpc_free(rep);
    }
  }
  if (r < 0 && !err[0] && self->s) {
    ckvpy_copy_error(c, r, err, sizeof(err));
  }
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) return ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
  return Py_BuildValue("(KKK)", (unsigned long long)epoch, (unsigned long long)pending, (unsigned long long)queue);
}

static PyObject *session_ack(ckvpy_session *self, PyObject *arg) {
  unsigned long long epoch = PyLong_AsUnsignedLongLong(arg);
  if (epoch == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  int r;
  uint64_t reclaimed = 0;
  char err[512];
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  pthread_rwlock_wrlock(&self->readers); /* kernels in flight finish reading first */
  r = self->s ? ckv_session_ack(self->s, epoch, &reclaimed) : CKV_ERR_STATE;
  if (r < 0) ckvpy_copy_error(self->s ? c : NULL, r, err, sizeof(err));
  pthread_rwlock_unlock(&self->readers);
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) return ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
  return PyLong_FromUnsignedLongLong(reclaimed);
}

static PyObject *session_prefetch(ckvpy_session *self, PyObject *unused) {
  int r;
  bool resident = false;
  char err[512];
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  r = self->s ? ckv_session_prefetch(self->s, &resident) : CKV_ERR_STATE;
  if (r < 0) ckvpy_copy_error(self->s ? c : NULL, r, err, sizeof(err));
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) return ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
  return PyBool_FromLong(resident);
}

static PyObject *locked_u64(ckvpy_session *self, uint64_t (*fn)(const ckv_session *));

static PyObject *session_fork(ckvpy_session *self, PyObject *args) {
  const char *new_id;
  unsigned long long at = 0;
  if (!PyArg_ParseTuple(args, "sK", &new_id, &at)) return NULL;
  if (self->client->closed) return ckvpy_raise(CKV_ERR_DISCONNECTED, "this commitkv client is closed");
  int r;
  ckv_session *child = NULL;
  char err[512];
  ckv_client *c = self->client->c;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  r = self->s ? ckv_session_fork(self->s, new_id, at, &child) : CKV_ERR_STATE;
  if (r < 0) ckvpy_copy_error(self->s ? c : NULL, r, err, sizeof(err));
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (r < 0) return ckvpy_raise(r, r == CKV_ERR_STATE && !self->s ? NOT_OPEN_TEXT : err);
  return ckvpy_session_new(self->client, child, new_id);
}

static PyObject *session_get_matched(ckvpy_session *self, void *unused) {
  return locked_u64(self, ckv_session_matched_tokens);
}

/* ---- attributes ----------------------------------------------------------------------- */

static PyObject *locked_u64(ckvpy_session *self, uint64_t (*fn)(const ckv_session *)) {
  uint64_t v = 0;
  bool open;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->lock);
  open = self->s != NULL;
  if (open) v = fn(self->s);
  pthread_mutex_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (!open) return closed_error(self);
  return PyLong_FromUnsignedLongLong(v);
}

static PyObject *session_get_tokens(ckvpy_session *self, void *unused) { return locked_u64(self, ckv_session_tokens); }
static PyObject *session_get_epoch(ckvpy_session *self, void *unused) { return locked_u64(self, ckv_session_epoch); }
static PyObject *session_get_id(ckvpy_session *self, void *unused) { return PyUnicode_FromString(self->id); }
static PyObject *session_get_closed(ckvpy_session *self, void *unused) { return PyBool_FromLong(self->s == NULL); }
static PyObject *session_get_geometry(ckvpy_session *self, void *unused) {
  return Py_BuildValue("(IIII)", self->geom.n_layers, self->geom.n_kv_heads, self->geom.head_dim, self->geom.dtype);
}

static PyMethodDef session_methods[] = {
    {"fork", (PyCFunction)session_fork, METH_VARARGS,
     "fork(new_id, at_position) -> _Session: a new session on the first at_position tokens (0: all reported)."},
    {"close", (PyCFunction)(void (*)(void))session_close, METH_VARARGS | METH_KEYWORDS,
     "close(keep=False): drops the session, or detaches it (kept for resume) with keep."},
    {"append", (PyCFunction)(void (*)(void))session_append, METH_VARARGS | METH_KEYWORDS,
     "append(count, roles, tags, semantic, token_ids) -> first position"},
    {"write_kv", (PyCFunction)(void (*)(void))session_write_kv, METH_VARARGS | METH_KEYWORDS,
     "write_kv(position, layer, k, v) -> tokens written"},
    {"view", (PyCFunction)session_view, METH_NOARGS, "view() -> (epoch, n_tokens, [block dict])"},
    {"info", (PyCFunction)session_info, METH_NOARGS, "info() -> (epoch, pending_tokens, compress_queue) as the daemon has them now"},
    {"attention", (PyCFunction)(void (*)(void))session_attention, METH_VARARGS | METH_KEYWORDS,
     "attention(layer, q, scale=0, threads=0, extra_k=None, extra_v=None, cold_max_blocks=4, cold_min_weight=0.01, cold_gather=0) -> (out bytes, mass bytes, epoch, n_positions)"},
    {"report", (PyCFunction)(void (*)(void))session_report, METH_VARARGS | METH_KEYWORDS,
     "report(round, attention_mass, first_position, semantic_positions, semantic_scores) -> (epoch, pending, "
     "[transition])"},
    {"ack", (PyCFunction)session_ack, METH_O, "ack(epoch) -> bytes reclaimed"},
    {"prefetch", (PyCFunction)session_prefetch, METH_NOARGS,
     "prefetch() -> resident: start bringing a session the daemon moved to disk back, without waiting"},
    {NULL}};

static PyGetSetDef session_getset[] = {{"id", (getter)session_get_id, NULL, "Session id.", NULL},
                                       {"tokens", (getter)session_get_tokens, NULL, "Tokens appended.", NULL},
                                       {"epoch", (getter)session_get_epoch, NULL, "Newest epoch heard of.", NULL},
                                       {"matched_tokens", (getter)session_get_matched, NULL,
                                        "Tokens it started with from shared blocks.", NULL},
                                       {"geometry", (getter)session_get_geometry, NULL, "(layers, heads, dim, dtype)",
                                        NULL},
                                       {"closed", (getter)session_get_closed, NULL, "Closed or dropped.", NULL},
                                       {NULL}};

PyTypeObject ckvpy_session_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commitkv._commitkv._Session",
    .tp_basicsize = sizeof(ckvpy_session),
    .tp_dealloc = (destructor)session_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One session (use commitkv.Client.open_session).",
    .tp_methods = session_methods,
    .tp_getset = session_getset,
    .tp_weaklistoffset = offsetof(ckvpy_session, weakrefs),
};
