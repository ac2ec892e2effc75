/* shm/arena.h - arenas: one region of KV memory shared by commitkvd and its workers.
 *
 * The daemon owns every byte of KV memory.  It creates arenas (one or more per
 * tenant, never shared between tenants), carves them into blocks with the slab
 * allocator (shm/slab.h), and exports each arena to the worker processes of
 * its tenant, which map the same memory and address blocks by offset.
 *
 * An arena is a backend (a static const table of functions, ggml style) plus
 * that backend's context.  The host backend (always linked) is a sealed memfd
 * whose fd travels over a unix socket with SCM_RIGHTS (shm/fdpass.h).  A CUDA
 * backend registers itself with ckv_arena_backend_register() when built; its
 * export carries either fds (VMM POSIX fd handles) or an opaque handle blob
 * (a legacy cudaIpcMemHandle_t), which is why an export has room for both.
 *
 * Every arena starts with a ckv_arena_header in its first CKV_ARENA_HEADER_BYTES
 * bytes: magic, a format word (version + hash of the shared layout, so builds
 * that disagree on it refuse to share), size, a random generation and the
 * creator's pid.  Blocks live at offsets >= CKV_ARENA_HEADER_BYTES.  Importers
 * validate the header and refuse a mismatch with CKV_ERR_FORMAT.  The header is
 * writable by every process that maps the arena, so the daemon never trusts it
 * after creation: it keeps its own copy of everything it needs.
 *
 * Thread safety: an arena's accessors may be called from any thread; new/free,
 * export, import and discard need no lock of their own (they touch no shared
 * mutable state of this module) but the caller must not free an arena while
 * another thread uses it.  ckv_arena_backend_register() is for start-up only. */
#ifndef CKV_SHM_ARENA_H
#define CKV_SHM_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_arena ckv_arena;
typedef struct ckv_arena_backend ckv_arena_backend;

/* Bytes reserved at offset 0 for the header; the first block starts here. */
#define CKV_ARENA_HEADER_BYTES 4096u
/* Limits of an export descriptor (kept small: it travels in every Welcome). */
#define CKV_ARENA_KIND_MAX 16u   /* backend name incl. NUL */
#define CKV_ARENA_LABEL_MAX 64u  /* label incl. NUL; longer labels are cut */
#define CKV_ARENA_MAX_FDS 8u     /* fds of one export (CUDA: one per physical chunk) */
#define CKV_ARENA_HANDLE_MAX 128u /* opaque handle bytes (cudaIpcMemHandle_t is 64) */
/* Largest arena we agree to create or map (1 PiB): keeps size arithmetic far
 * from overflow whatever a descriptor says. */
#define CKV_ARENA_MAX_BYTES (UINT64_C(1) << 50)

#define CKV_ARENA_MAGIC UINT64_C(0x414e455241564b43) /* "CKVARENA" read as little-endian */
#define CKV_ARENA_VERSION 1u

/* Values of ckv_arena_header.state. */
enum {
  CKV_ARENA_STATE_INIT = 0,    /* being set up: not valid yet */
  CKV_ARENA_STATE_LIVE = 1,    /* header complete; published with a release store */
  CKV_ARENA_STATE_RETIRED = 2, /* the owner freed the arena: importers should unmap */
};

/* The header at offset 0 of every arena.  Shared between processes: only fixed-
 * width integers and byte arrays, no pointers; sizes and offsets are pinned
 * below and hashed into the format word. */
typedef struct ckv_arena_header {
  uint64_t magic;       /* CKV_ARENA_MAGIC: this is a CommitKV arena at all */
  uint64_t format;      /* ckv_arena_format(): version and layout hash of the build that made it */
  uint64_t bytes;       /* size of the whole region including this header: import checks
                         * it against the descriptor and the backing object */
  uint64_t generation;  /* random nonzero id of this arena instance: a descriptor from
                         * another arena (or an earlier daemon) does not match */
  uint64_t data_offset; /* first byte available for blocks (CKV_ARENA_HEADER_BYTES) */
  uint32_t creator_pid; /* pid of the process that created it, for diagnostics */
  uint32_t state;       /* CKV_ARENA_STATE_*; accessed with acquire/release only */
  char kind[CKV_ARENA_KIND_MAX];   /* backend name, NUL-terminated: host and CUDA never mix */
  char label[CKV_ARENA_LABEL_MAX]; /* creator's label (tenant name...), NUL-terminated */
} ckv_arena_header;

_Static_assert(sizeof(ckv_arena_header) == 128, "ckv_arena_header size is part of the format");
_Static_assert(sizeof(ckv_arena_header) <= CKV_ARENA_HEADER_BYTES, "header must fit its page");

/* What a client needs to map an arena.  Produced by ckv_arena_export() in the
 * daemon, carried over the wire (fds with SCM_RIGHTS, the rest in protobuf),
 * consumed by ckv_arena_import() in the worker. */
typedef struct ckv_arena_desc {
  char kind[CKV_ARENA_KIND_MAX];        /* backend name, NUL-terminated ("host") */
  uint64_t bytes;                       /* size of the whole region, header included */
  uint64_t generation;                  /* must equal the header's generation */
  uint64_t committed;                   /* bytes from offset 0 usable so far (see ckv_arena_grow) */
  uint32_t n_fds;                       /* valid entries of fds[] */
  int fds[CKV_ARENA_MAX_FDS];           /* file descriptors (host: the memfd) */
  uint32_t handle_len;                  /* valid bytes of handle[] */
  uint8_t handle[CKV_ARENA_HANDLE_MAX]; /* opaque backend handle (CUDA IPC), else unused */
} ckv_arena_desc;

/* A backend: a static const table of functions.  The generic code validates
 * arguments (sizes, ranges, alignment, ownership) before calling a slot, so a
 * backend only does the work.  `ctx` is the backend's private context for one
 * arena; `base` is where the region is mapped in this process. */
struct ckv_arena_backend {
  /* Name: the kind reported by ckv_arena_kind(), carried in exports and used
   * by ckv_arena_backend_find().  Required; shorter than CKV_ARENA_KIND_MAX. */
  const char *name;
  /* Size granularity in bytes (a power of two): regions are rounded up to it
   * and discards must be aligned to it.  Optional; NULL means the page size. */
  uint64_t (*granularity)(void);
  /* Create `bytes` (a granularity multiple) of shareable memory, of which at
   * least the first `initial` bytes (a granularity multiple) are backed and
   * mapped read-write, and return its context and mapping.  Contents read as
   * zero.  Required. */
  int (*create)(uint64_t bytes, uint64_t initial, const char *label, void **ret_ctx, void **ret_base);
  /* Owner: back and map [from, to) (granularity multiples, from = the bytes
   * usable so far), zeroed, without moving anything mapped.  Optional; NULL
   * means everything was usable from create on (host memory commits lazily). */
  int (*grow)(void *ctx, void *base, uint64_t from, uint64_t to);
  /* Importer: map what `e` adds beyond the `from` bytes mapped so far (e has
   * passed the generic checks: same arena, committed >= from).  Borrows
   * e->fds.  Optional; NULL means an import maps everything at once. */
  int (*refresh)(void *ctx, void *base, uint64_t from, const ckv_arena_desc *e);
  /* Map the region described by `e` (already checked: kind matches, bytes in
   * range, counts in range).  Borrows e->fds: never closes them.  Required. */
  int (*import)(const ckv_arena_desc *e, void **ret_ctx, void **ret_base);
  /* Unmap and release everything of ctx (created or imported).  Never fails.
   * Required. */
  void (*destroy)(void *ctx, void *base, uint64_t bytes);
  /* Fill e->fds/n_fds and/or e->handle/handle_len for a created arena.  The
   * fds stay owned by ctx (borrowed by the caller).  Required for backends
   * that create. */
  int (*export_handles)(void *ctx, ckv_arena_desc *e);
  /* Give the pages of [off, off+len) back to the OS (granularity-aligned, past
   * the header, owner only); afterwards the range reads as zero.  Optional;
   * NULL means discarding is a no-op and pages stay committed. */
  int (*discard)(void *ctx, void *base, uint64_t off, uint64_t len);
  /* Copy `len` bytes at `off` of the region into host memory `dst`, or from
   * `src` into the region: how the generic code reads and writes the header of
   * memory the CPU cannot address (device memory).  Optional, both or neither;
   * NULL means plain loads and stores through base. */
  int (*read)(void *ctx, void *base, uint64_t off, void *dst, size_t len);
  int (*write)(void *ctx, void *base, uint64_t off, const void *src, size_t len);
  /* Bytes of the region currently backed by memory.  Optional. */
  int (*resident)(void *ctx, uint64_t *ret_bytes);
  /* Owner of an arena another process created (a daemon before a restart,
   * its fds handed back by systemd's fd store): map `e` like import and keep
   * a descriptor of its own (dup) so the arena can be exported, discarded
   * and adopted again.  Borrows e->fds.  Optional; NULL means the backend's
   * arenas cannot outlive their creator. */
  int (*adopt)(const ckv_arena_desc *e, void **ret_ctx, void **ret_base);
};

/* The host backend: sealed memfd, mmap MAP_SHARED, holes punched on discard. */
extern const ckv_arena_backend ckv_arena_host_backend;

/* The format word written in every header: CKV_ARENA_VERSION in the high 32
 * bits, a hash of the shared layout (header size, field offsets, alignment of
 * uint64_t, header page size) in the low 32.  Also worth sending in Hello. */
uint64_t ckv_arena_format(void);

/* Backend registered under `name` ("host" always; "cuda" once registered), or
 * NULL when there is none.  `name` NULL returns NULL. */
const ckv_arena_backend *ckv_arena_backend_find(const char *name);

/* Registers a backend for ckv_arena_backend_find() and ckv_arena_import().
 * The table must outlive every arena (use a static const table).  Not
 * thread-safe: call it at start-up.  Returns CKV_OK, CKV_ERR_INVALID (NULL,
 * missing required slot, bad name), CKV_ERR_EXISTS (name taken) or
 * CKV_ERR_LIMIT (registry full). */
int ckv_arena_backend_register(const ckv_arena_backend *be);

/* Creates an arena with room for `bytes` bytes of blocks: the region is
 * CKV_ARENA_HEADER_BYTES + bytes rounded up to the backend granularity, so
 * offsets [CKV_ARENA_HEADER_BYTES, CKV_ARENA_HEADER_BYTES + bytes) are usable.
 * Memory is committed lazily (on first touch), so an arena may be sized at a
 * tenant's whole quota.  `label` (may be NULL) names it for diagnostics
 * (/proc/PID/maps shows "memfd:commitkv:<label>").  The caller owns *ret and
 * releases it with ckv_arena_free().
 * Returns CKV_OK; CKV_ERR_INVALID (NULL be/ret, bytes 0); CKV_ERR_LIMIT (bytes
 * beyond CKV_ARENA_MAX_BYTES); CKV_ERR_UNSUPPORTED (backend cannot create);
 * a negated errno from the backend (-ENOMEM, -EMFILE...). */
int ckv_arena_new(const ckv_arena_backend *be, uint64_t bytes, const char *label, ckv_arena **ret);

/* Releases an arena: the owner marks the header retired (importers can see it
 * with ckv_arena_is_live()), then the mapping and the backing object are
 * released (memory stays alive while any importer still maps it).  Accepts
 * NULL; always returns NULL (`a = ckv_arena_free(a);`). */
ckv_arena *ckv_arena_free(ckv_arena *a);

/* Makes a later ckv_arena_free() leave the header live: the memory is handed
 * on (systemd's fd store keeps the memfd across a daemon restart) and
 * importers must go on using it.  Owner only; a no-op otherwise. */
void ckv_arena_keep_live(ckv_arena *a);

/* Becomes the owner of an arena that another process created and handed on
 * (ckv_arena_keep_live, then fds passed back, e.g. by systemd's fd store).
 * `e` says what is expected: kind, bytes and generation (all must match the
 * backing object and the header, which must be live and of this build's
 * format).  The whole region counts as committed.  Borrows e->fds (the
 * backend keeps a duplicate).  The caller owns *ret (ckv_arena_free).
 * Returns CKV_OK; CKV_ERR_INVALID (NULL, counts); CKV_ERR_UNSUPPORTED (no
 * such backend, or it cannot adopt); CKV_ERR_FORMAT (not a sealed region of
 * that size, or a header of another build, arena, size or a retired one);
 * a negated errno. */
int ckv_arena_adopt(const ckv_arena_desc *e, ckv_arena **ret);

/* Where the region is mapped in this process (the header is at offset 0; a
 * block at offset `off` is at base + off).  For device backends a device
 * pointer.  Never NULL for a valid arena. */
void *ckv_arena_base(const ckv_arena *a);
/* Size of the whole region, header included. */
uint64_t ckv_arena_size(const ckv_arena *a);
/* First offset available for blocks: CKV_ARENA_HEADER_BYTES. */
uint64_t ckv_arena_data_offset(const ckv_arena *a);
/* Backend name, e.g. "host".  Static string. */
const char *ckv_arena_kind(const ckv_arena *a);
/* The arena's generation (equal in the owner and every importer). */
uint64_t ckv_arena_generation(const ckv_arena *a);
/* Bytes from offset 0 that are backed and mapped in this process (the owner
 * grows it with ckv_arena_grow; an importer learns it from the export it
 * imported or refreshed with).  Offsets at or beyond it must not be touched. */
uint64_t ckv_arena_committed(const ckv_arena *a);
/* Owner: makes [0, end) usable, growing the committed prefix by doubling
 * (from about 1/128 of the arena, so at most CKV_ARENA_MAX_FDS steps reach
 * the whole arena) without moving anything mapped.  Importers see the new
 * range after ckv_arena_refresh() with a new export.
 * Returns CKV_OK (also when already usable), CKV_ERR_INVALID (end beyond the
 * arena), CKV_ERR_STATE (imported arena) or the backend's error (-ENOMEM when
 * the device is out of memory: the committed prefix is unchanged). */
int ckv_arena_grow(ckv_arena *a, uint64_t end);
/* Importer: maps what a newer export `e` of the same arena adds (its
 * committed prefix).  Borrows e->fds like ckv_arena_import().
 * Returns CKV_OK, CKV_ERR_FORMAT (another arena: kind, size or generation
 * differ), CKV_ERR_INVALID (committed shrank or exceeds the arena, bad
 * counts), CKV_ERR_STATE (the owner's arena) or the backend's error. */
int ckv_arena_refresh(ckv_arena *a, const ckv_arena_desc *e);

/* Non-zero when this process created the arena, zero when it imported it. */
int ckv_arena_is_owner(const ckv_arena *a);
/* Non-zero while the header says live: an importer polls it to learn that
 * the owner released the arena (a crashed owner never retires it: detect that
 * through the connection).  Host memory only; device arenas always report 1. */
int ckv_arena_is_live(const ckv_arena *a);

/* Describes the arena for another process.  *ret receives kind, bytes,
 * generation and the backend's fds and/or handle.  The fds are BORROWED from
 * the arena: valid until ckv_arena_free(), never to be closed by the caller;
 * to hand them over, send them with ckv_frame_send() (SCM_RIGHTS gives the
 * receiver its own descriptors).  Owner only.
 * Returns CKV_OK, CKV_ERR_INVALID (NULL), CKV_ERR_STATE (imported arena) or a
 * backend error. */
int ckv_arena_export(const ckv_arena *a, ckv_arena_desc *ret);

/* Maps an arena exported by another process.  The backend is looked up by
 * e->kind; the mapping is checked (host: sealed memfd of exactly e->bytes) and
 * the header validated (magic, format word, size, generation, live).
 * Ownership: import BORROWS e->fds in every case, success or failure; the
 * caller closes them when it no longer needs them (a host mapping survives the
 * close, so closing right after a successful import is normal).  The caller
 * owns *ret (release with ckv_arena_free(), which only unmaps).
 * Returns CKV_OK; CKV_ERR_INVALID (NULL, counts beyond limits, kind not
 * NUL-terminated, bad fd); CKV_ERR_UNSUPPORTED (no such backend in this
 * build); CKV_ERR_FORMAT (not a sealed region of that size, or header
 * mismatch: other build, other arena, retired); a negated errno (-ENOMEM...). */
int ckv_arena_import(const ckv_arena_desc *e, ckv_arena **ret);

/* Gives the pages of [off, off+len) back to the OS: the daemon calls it for
 * chunks its allocator no longer uses.  The range must lie within
 * [ckv_arena_data_offset(), ckv_arena_size()) and off and len must be
 * multiples of the page size (the backend granularity); len 0 does nothing.
 * Afterwards the range's contents are unspecified (zero on host) and cost no
 * memory until touched again.  Owner only.
 * Returns CKV_OK, CKV_ERR_INVALID (range or alignment), CKV_ERR_STATE
 * (imported arena) or a negated errno from the backend. */
int ckv_arena_discard(ckv_arena *a, uint64_t off, uint64_t len);

/* ckv_arena_discard() with the signature of a ckv_slab_discard_fn (shm/slab.h),
 * `arena` being a ckv_arena *: `.discard = ckv_arena_discard_cb,
 * .discard_opaque = arena`. */
int ckv_arena_discard_cb(void *arena, uint64_t off, uint64_t len);

/* Bytes of the region currently backed by memory (host: the memfd's blocks).
 * Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_UNSUPPORTED (backend cannot tell;
 * importers cannot tell either) or a negated errno. */
int ckv_arena_resident(const ckv_arena *a, uint64_t *ret_bytes);

#endif
