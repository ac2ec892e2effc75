/* ext.h - the C side of the `commitkv` Python module (commitkv._commitkv).
 *
 * Three small types over libcommitkv: _Client (one ckv_client), _Session (one
 * ckv_session) and _ArenaBuffer (a read-only PEP 3118 buffer over a piece of
 * the mapped arena, the base of every zero-copy numpy array view() hands
 * out).  The Pythonic layer (commitkv/__init__.py) wraps them; everything here
 * takes and returns plain objects and buffers, so the module does not need
 * numpy's C API.
 *
 * Locking: the GIL is released around every libcommitkv call (they may block
 * on the daemon, or on the client's lock another thread holds) and around
 * every kernel.  While it is released no Python object is touched: arguments
 * are copied or pinned (Py_buffer) before, results are built after. */
#ifndef CKV_PYTHON_EXT_H
#define CKV_PYTHON_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdbool.h>

#include "commitkv/commitkv.h"

typedef struct ckvpy_session ckvpy_session;

typedef struct ckvpy_client {
  PyObject_HEAD
  ckv_client *c;      /* NULL once freed */
  bool closed;        /* close() was called: every method refuses */
  Py_ssize_t exports; /* live _ArenaBuffer objects over this client's arena */
  Py_ssize_t busy;    /* calls on c in flight without the GIL: c is freed only when none is */
  ckvpy_session *sessions; /* open sessions (intrusive list), detached by close() */
  PyObject *weakrefs;
} ckvpy_client;

struct ckvpy_session {
  PyObject_HEAD
  ckvpy_client *client; /* strong reference: the arena stays mapped while a session lives */
  ckv_session *s;       /* NULL once closed or dropped */
  ckv_geometry geom;
  char id[129];
  /* lock serialises this wrapper's calls on s (the view and transitions
   * libcommitkv returns live in s until the next call on it).  readers is
   * held shared by attention kernels reading the view's blocks after lock
   * is released, exclusively by what may free those blocks (ack, close,
   * drop), so an ack never reclaims memory a kernel in flight still reads.
   * Order: lock, then readers. */
  pthread_mutex_t lock;
  pthread_rwlock_t readers;
  ckvpy_session *next, *prev; /* in client->sessions */
  PyObject *weakrefs;
};

extern PyTypeObject ckvpy_client_type;
extern PyTypeObject ckvpy_session_type;
extern PyTypeObject ckvpy_arena_buffer_type;

/* Raises the commitkv.Error subclass of `status` with `text` (the daemon's
 * explanation, or empty for ckv_strerror's).  Returns NULL. */
PyObject *ckvpy_raise(int status, const char *text);
/* ckvpy_raise with the client's last error (copy it before re-taking the GIL
 * when another thread might overwrite it: see ckvpy_copy_error). */
void ckvpy_copy_error(ckv_client *c, int status, char *buf, size_t len);

/* A new _ArenaBuffer over [ptr, ptr + len) of the client's mapped arena; it
 * keeps the client (and so the mapping) alive. */
PyObject *ckvpy_arena_buffer_new(ckvpy_client *owner, const void *ptr, Py_ssize_t len);
/* Frees the ckv_client of a closed client once no export and no call is
 * left (the GIL held). */
void ckvpy_client_maybe_free(ckvpy_client *c);

/* Opens a session on the client (used by _Client.open_session). */
PyObject *ckvpy_session_new(ckvpy_client *owner, ckv_session *s, const char *id);
/* Detaches (keep) or drops the session; the GIL must be held. 0 or -1 with an exception. */
int ckvpy_session_finish(ckvpy_session *self, bool keep);

/* Gets a C-contiguous buffer of `obj` whose item format is one of `formats`
 * (struct codes, e.g. "e" or "Hh"), or raises a ValueError that names `what`,
 * what it got and what is wanted (`want`).  Release with PyBuffer_Release. */
int ckvpy_get_buffer(PyObject *obj, const char *formats, const char *what, const char *want, Py_buffer *view);

#endif
