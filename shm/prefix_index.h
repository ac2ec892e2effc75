/* shm/prefix_index.h - a tenant's prefix index, published read-only to its
 * workers (issue 41): LookupPrefix answered in the worker's process.
 *
 * The daemon keeps, per tenant, the content keys of the blocks a new session
 * can reuse (store/prefix.h says what a key covers and when a block enters
 * the index).  It mirrors that index into a sealed memfd of fixed size that
 * every attached worker of the tenant maps read-only (the fd it gets is a
 * read-only reopen: the worker can neither write nor resize it), so a lookup
 * is a hash of the worker's token ids and a few probes, with no round trip
 * to the daemon.  The answer is advisory, like LookupPrefix's: OpenSession
 * with reuse_prefix matches again in the daemon, which decides.
 *
 * Layout (one truth, pinned by _Static_assert): a 64-byte header, the roots
 * (one per model, revision, geometry and block size whose sessions published
 * blocks: the chain's start, store/prefix.c root_of), then `slots` 32-byte
 * slots of an open-addressing table (linear probing from the key's home,
 * backward-shift deletion, so no tombstones).  A slot holds a key, the
 * identity of the block it names (several keys of a block compressed once
 * share it, store/shared_moves.h), which sub-block of it the key is and its
 * tokens per key; tokens 0 marks an empty slot.
 *
 * Consistency: a sequence lock.  The daemon (one thread) makes `seq` odd,
 * changes the table, makes it even again; a reader that saw an odd or a
 * changed `seq` retries, and after CKV_PINDEX_TRIES tries says BUSY (the
 * client then asks the daemon).  `complete` is 0 while an entry could not
 * be published (the table was full): readers ask the daemon then, until
 * the daemon rebuilds the mirror with room.  A table that fills up is
 * replaced by one twice its size (the daemon's choice, store/shared.c):
 * the old one is marked `superseded` and its lookups say STATE, upon which
 * the worker fetches the new one (AttachRequest{refresh, want_prefix_index}). */
#ifndef CKV_SHM_PREFIX_INDEX_H
#define CKV_SHM_PREFIX_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKV_PINDEX_MAGIC 0x3158444950564b43ull /* "CKVPIDX1" */
#define CKV_PINDEX_VERSION 1u
#define CKV_PINDEX_MAX_ROOTS 32u
#define CKV_PINDEX_NAME_MAX 128u   /* bytes of a model id / revision (OpenSession's limit) */
#define CKV_PINDEX_NAME_BYTES 136u /* their fields, NUL-terminated */
#define CKV_PINDEX_TRIES 16u
/* The most tokens one key covers (a draft block's capacity). */
#define CKV_PINDEX_MAX_KEY_TOKENS 1024u

/* A content key: XXH3-128 of a chain link. */
typedef struct ckv_pkey {
  uint64_t lo, hi;
} ckv_pkey;

typedef struct ckv_pindex_header {
  uint64_t magic;
  uint32_t version;
  uint32_t slots; /* a power of two */
  uint64_t seq;   /* odd while the daemon changes the index */
  uint64_t bytes; /* of the whole mapping */
  uint64_t entries;
  uint32_t n_roots;
  uint32_t complete;   /* 0: some entry is missing; ask the daemon */
  uint32_t superseded; /* 1: the daemon publishes a bigger index now; fetch it (attach refresh) */
  uint8_t reserved[12];
} ckv_pindex_header;
_Static_assert(sizeof(ckv_pindex_header) == 64, "prefix index header layout");

typedef struct ckv_pindex_root {
  char model_id[CKV_PINDEX_NAME_BYTES];
  char model_revision[CKV_PINDEX_NAME_BYTES];
  uint64_t lo, hi; /* the chain's root key */
  uint32_t block_tokens;
  uint32_t reserved;
} ckv_pindex_root;
_Static_assert(sizeof(ckv_pindex_root) == 296, "prefix index root layout");

typedef struct ckv_pindex_slot {
  uint64_t lo, hi;  /* the key */
  uint64_t group;   /* the block's identity */
  uint32_t sub;     /* which of its sub-blocks the key is (0: a plain block) */
  uint32_t tokens;  /* tokens the key covers; 0: an empty slot */
} ckv_pindex_slot;
_Static_assert(sizeof(ckv_pindex_slot) == 32, "prefix index slot layout");

/* The key of the block after `prev` holding ids[0..d) (d <= CKV_PINDEX_MAX_KEY_TOKENS). */
ckv_pkey ckv_pkey_link(ckv_pkey prev, const uint32_t *ids, uint32_t d);

/* Daemon side: the writer ----------------------------------------------- */

typedef struct ckv_pindex ckv_pindex;

/* A new, empty, complete index of `slots` slots (rounded up to a power of
 * two, at least 64) in a sealed memfd.  CKV_OK, CKV_ERR_INVALID, -errno. */
int ckv_pindex_new(uint32_t slots, ckv_pindex **ret);
void ckv_pindex_free(ckv_pindex *ix);
/* A read-only descriptor of the memfd, to pass to workers (owned by ix). */
int ckv_pindex_reader_fd(const ckv_pindex *ix);
uint64_t ckv_pindex_bytes(const ckv_pindex *ix);
uint32_t ckv_pindex_slots(const ckv_pindex *ix);
/* Key k names sub-block `sub` of block `group`, `tokens` tokens.  Replaces
 * an entry of the same key.  No room (3/4 of the slots used): the index
 * becomes incomplete and false is returned. */
bool ckv_pindex_put(ckv_pindex *ix, ckv_pkey k, uint64_t group, uint32_t sub, uint32_t tokens);
void ckv_pindex_del(ckv_pindex *ix, ckv_pkey k);
/* A root (at most CKV_PINDEX_MAX_ROOTS; past them: incomplete, false). */
bool ckv_pindex_add_root(ckv_pindex *ix, const char *model_id, const char *model_revision, ckv_pkey root,
                         uint32_t block_tokens);
bool ckv_pindex_complete(const ckv_pindex *ix);
uint64_t ckv_pindex_entries(const ckv_pindex *ix);
/* Marks the index superseded (a bigger one replaces it): readers' lookups
 * say CKV_ERR_STATE from now on. */
void ckv_pindex_supersede(ckv_pindex *ix);
/* A rebuild: every entry goes (roots stay), then the caller puts them all
 * again and ends it; readers see neither half (the sequence stays odd). */
void ckv_pindex_rebuild_begin(ckv_pindex *ix);
void ckv_pindex_rebuild_end(ckv_pindex *ix);

/* Worker side: the reader ------------------------------------------------ */

typedef struct ckv_pindex_view ckv_pindex_view;

/* Maps fd read-only and checks what it can (size, seals, magic, version,
 * slots).  CKV_OK, CKV_ERR_FORMAT (not an index of this version),
 * CKV_ERR_CORRUPT (sizes that do not add up), -errno.  The fd stays the
 * caller's. */
int ckv_pindex_map(int fd, ckv_pindex_view **ret);
void ckv_pindex_unmap(ckv_pindex_view *v);
/* How many leading tokens of ids[0..n) match published blocks of
 * (model_id, model_revision), the best over the roots: what LookupPrefix
 * answers.  CKV_OK, CKV_ERR_BUSY (the daemon kept changing the index, or
 * it is incomplete: ask the daemon), CKV_ERR_STATE (superseded: fetch the
 * new one), CKV_ERR_INVALID. */
int ckv_pindex_lookup(const ckv_pindex_view *v, const char *model_id, const char *model_revision,
                      const uint32_t *ids, size_t n, uint64_t *ret_matched);

#endif
