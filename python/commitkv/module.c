/* module.c - commitkv._commitkv: module setup, errors, buffers.
 *
 * The exception classes live in commitkv/_errors.py (one per ckv_status, with
 * docstrings); this file turns a status into an instance of the right class
 * through _errors.from_status, checks the buffers callers hand in (dtype and
 * shape refused with a ValueError that says what was wanted, never a crash),
 * and exports _ArenaBuffer, the read-only buffer over mapped arena memory that
 * every zero-copy array of view() rests on. */
#include <string.h>

#include "ext.h"

static PyObject *g_from_status; /* commitkv._errors.from_status */

PyObject *ckvpy_raise(int status, const char *text) {
  if (!g_from_status) {
    PyErr_Format(PyExc_RuntimeError, "commitkv: %s (%d): %s", ckv_status_name(status), status, text ? text : "");
    return NULL;
  }
  PyObject *exc = PyObject_CallFunction(g_from_status, "is", status, text ? text : "");
  if (!exc) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

void ckvpy_copy_error(ckv_client *c, int status, char *buf, size_t len) {
  const char *t = c ? ckv_client_last_error(c) : "";
  snprintf(buf, len, "%s", t && *t ? t : ckv_strerror(status));
}

/* ---- buffers ------------------------------------------------------------- */

/* The item format without a native/little-endian prefix ("<e" -> "e"); NULL
 * for a byte-swapped or composite format. */
static const char *plain_format(const char *f) {
  if (!f) return "B";
  if (*f == '@' || *f == '=' || *f == '<') f++;
  if (f[0] == 0 || f[1] != 0) return NULL;
  return f;
}

int ckvpy_get_buffer(PyObject *obj, const char *formats, const char *what, const char *want, Py_buffer *view) {
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
    if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
        PyErr_ExceptionMatches(PyExc_ValueError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError,
                   "%s: a C-contiguous array (buffer protocol) is required, got a %.100s that is not one; wanted %s",
                   what, Py_TYPE(obj)->tp_name, want);
    }
    return -1;
  }
  const char *f = plain_format(view->format);
  if (!f || !strchr(formats, f[0])) {
    PyErr_Format(PyExc_ValueError, "%s: wrong dtype (buffer format '%s', %zd-byte items); wanted %s", what,
                 view->format ? view->format : "B", view->itemsize, want);
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

/* ---- _ArenaBuffer ---------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  ckvpy_client *owner;
  const void *ptr;
  Py_ssize_t len;
} ckvpy_arena_buffer;

PyObject *ckvpy_arena_buffer_new(ckvpy_client *owner, const void *ptr, Py_ssize_t len) {
  ckvpy_arena_buffer *b = PyObject_New(ckvpy_arena_buffer, &ckvpy_arena_buffer_type);
  if (!b) return NULL;
  Py_INCREF(owner);
  b->owner = owner;
  b->ptr = ptr;
  b->len = len;
  owner->exports++;
  return (PyObject *)b;
}

static void arena_buffer_dealloc(ckvpy_arena_buffer *b) {
  ckvpy_client *owner = b->owner;
  owner->exports--;
  ckvpy_client_maybe_free(owner);
  Py_DECREF(owner);
  PyObject_Free(b);
}

static int arena_buffer_get(ckvpy_arena_buffer *b, Py_buffer *view, int flags) {
  if (flags & PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError, "commitkv: views of the arena are read-only (the daemon owns this memory)");
    view->obj = NULL;
    return -1;
  }
  return PyBuffer_FillInfo(view, (PyObject *)b, (void *)b->ptr, b->len, /* readonly= */ 1, flags);
}

static PyObject *arena_buffer_address(ckvpy_arena_buffer *b, PyObject *unused) {
  return PyLong_FromVoidPtr((void *)b->ptr);
}

static PyBufferProcs arena_buffer_procs = {.bf_getbuffer = (getbufferproc)arena_buffer_get};
static PyMethodDef arena_buffer_methods[] = {
    {"address", (PyCFunction)arena_buffer_address, METH_NOARGS, "Address of the first byte in this process."},
    {NULL}};
static Py_ssize_t arena_buffer_len(ckvpy_arena_buffer *b) { return b->len; }
static PySequenceMethods arena_buffer_seq = {.sq_length = (lenfunc)arena_buffer_len};

PyTypeObject ckvpy_arena_buffer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commitkv._commitkv._ArenaBuffer",
    .tp_basicsize = sizeof(ckvpy_arena_buffer),
    .tp_dealloc = (destructor)arena_buffer_dealloc,
    .tp_as_buffer = &arena_buffer_procs,
    .tp_as_sequence = &arena_buffer_seq,
    .tp_methods = arena_buffer_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only memory of the mapped arena (keeps its client's mapping alive).",
};

/* ---- module functions ------------------------------------------------------ */

static PyObject *status_table(PyObject *m, PyObject *unused) {
  PyObject *list = PyList_New(0);
  if (!list) return NULL;
#define CKVPY_STATUS_ROW_(name, value, text)                          \
  do {                                                                \
    PyObject *row = Py_BuildValue("(sis)", #name, (int)(value), text); \
    if (!row || PyList_Append(list, row) < 0) {                       \
      Py_XDECREF(row);                                                \
      Py_DECREF(list);                                                \
      return NULL;                                                    \
    }                                                                 \
    Py_DECREF(row);                                                   \
  } while (0);
  CKV_STATUS_LIST(CKVPY_STATUS_ROW_)
#undef CKVPY_STATUS_ROW_
  return list;
}

static PyObject *status_name(PyObject *m, PyObject *arg) {
  int code = (int)PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(ckv_status_name(code));
}

static PyObject *strerror_(PyObject *m, PyObject *arg) {
  int code = (int)PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(ckv_strerror(code));
}

static PyObject *set_error_factory(PyObject *m, PyObject *fn) {
  if (!PyCallable_Check(fn)) return PyErr_Format(PyExc_TypeError, "a callable is required");
  Py_INCREF(fn);
  Py_XSETREF(g_from_status, fn);
  Py_RETURN_NONE;
}

static PyObject *connect_(PyObject *m, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"socket", "attach_socket", "heartbeat", "name", "timeout_ms", NULL};
  const char *sock = NULL, *attach = NULL, *name = "python";
  int heartbeat = 1, timeout_ms = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzpzi", kwlist, &sock, &attach, &heartbeat, &name, &timeout_ms))
    return NULL;
  ckvpy_client *self = PyObject_New(ckvpy_client, &ckvpy_client_type);
  if (!self) return NULL;
  self->c = NULL;
  self->closed = false;
  self->exports = 0;
  self->busy = 0;
  self->sessions = NULL;
  self->weakrefs = NULL;
  ckv_client_options o = {.socket = sock, .attach_socket = attach, .name = name, .timeout_ms = timeout_ms,
                          .heartbeat = heartbeat != 0};
  ckv_client *c = NULL;
  int r;
  char err[512];
  Py_BEGIN_ALLOW_THREADS
  r = ckv_client_connect(&o, &c);
  if (r < 0) snprintf(err, sizeof(err), "%s", *ckv_client_connect_error() ? ckv_client_connect_error() : ckv_strerror(r));
  Py_END_ALLOW_THREADS
  if (r < 0) {
    self->closed = true;
    Py_DECREF(self);
    return ckvpy_raise(r, err);
  }
  self->c = c;
  return (PyObject *)self;
}

static PyMethodDef module_methods[] = {
    {"connect", (PyCFunction)(void (*)(void))connect_, METH_VARARGS | METH_KEYWORDS,
     "connect(socket=None, attach_socket=None, heartbeat=True, name='python', timeout_ms=0) -> _Client"},
    {"status_table", status_table, METH_NOARGS, "[(name, value, text)] of every ckv_status (commitkv/status.h)."},
    {"status_name", status_name, METH_O, "ckv_status_name(code)."},
    {"strerror", strerror_, METH_O, "ckv_strerror(code)."},
    {"_set_error_factory", set_error_factory, METH_O, "Registers commitkv._errors.from_status."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, .m_name = "commitkv._commitkv",
    .m_doc = "The C extension under commitkv (libcommitkv, zero-copy buffers).  Use the commitkv package.",
    .m_size = -1, .m_methods = module_methods};

PyMODINIT_FUNC PyInit__commitkv(void) {
  if (PyType_Ready(&ckvpy_client_type) < 0 || PyType_Ready(&ckvpy_session_type) < 0 ||
      PyType_Ready(&ckvpy_arena_buffer_type) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (PyModule_AddStringConstant(m, "__version__", CKV_VERSION_STRING) < 0 ||
      PyModule_AddIntConstant(m, "PROTOCOL_VERSION", CKV_CLIENT_VERSION) < 0 ||
      PyModule_AddObjectRef(m, "_Client", (PyObject *)&ckvpy_client_type) < 0 ||
      PyModule_AddObjectRef(m, "_Session", (PyObject *)&ckvpy_session_type) < 0 ||
      PyModule_AddObjectRef(m, "_ArenaBuffer", (PyObject *)&ckvpy_arena_buffer_type) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
