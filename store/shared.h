/* shared.h - the records of shared blocks, below the session: one arena
 * block that several sessions' tables point at (ckv_pblock), its holders'
 * count, the tenant's registry of them (by arena offset, and by content key
 * for the indexed ones), and a session's chain of content keys.  The rules
 * (what is shared when, what is frozen) are store/prefix.h's; this module
 * only keeps the books, so session.c can give a shared block back without
 * knowing them. */
#ifndef CKV_STORE_SHARED_H
#define CKV_STORE_SHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_prefix ckv_prefix;

#include "shm/prefix_index.h" /* ckv_pkey, the index workers map */

typedef struct ckv_srv_session ckv_srv_session;

/* A table entry that points at a shared block: session and block index. */
typedef struct ckv_pblock_user {
  ckv_srv_session *s;
  uint32_t idx;
} ckv_pblock_user;

/* One arena block that sessions' tables share. */
typedef struct ckv_pblock {
  ckv_pkey key;    /* content key (when keyed) */
  /* A compressed block (store/shared_moves.h) holds the tokens of several
   * consecutive draft blocks: the content keys of those, in slot order
   * (sub-block j holds slots [j*sub_tokens, (j+1)*sub_tokens)).  0 subkeys:
   * the block is one draft block, keyed by `key`. */
  ckv_pkey *subkeys;
  uint32_t n_subkeys;
  uint16_t sub_tokens;
  uint8_t format;  /* the block's format (draft until compressed once) */
  bool swapping;   /* a compression of it is in flight (shared_moves.c) */
  /* Its publisher, while the only holder, keeps it frozen until its round
   * reaches this (share_grace_rounds; 0: no grace). */
  uint64_t grace_round;
  /* The table entries pointing at it (holders counts these and the retired
   * entries still waiting for their reader). */
  ckv_pblock_user *users;
  uint32_t n_users, cap_users;
  uint64_t offset; /* in the tenant's arena */
  uint64_t bytes;
  uint64_t id;       /* the block id every holder's table shows */
  uint16_t capacity; /* token slots (all valid) */
  bool keyed;        /* key is set */
  bool indexed; /* in the tenant's index: LookupPrefix and reuse_prefix find it
                 */
  uint32_t holders; /* table entries plus retired entries of sessions pointing
                       at it */
  uint8_t *meta; /* the daemon's record of the header region (copied into each
                    holder's shadow) */
  uint8_t *roles, *tags; /* per slot, as the first holder had them (NULL:
                            unknown, warm restart) */
  uint16_t *semantic;
} ckv_pblock;

/* Frozen: held by more than one session; nothing may write or move it. */
static inline bool ckv_pblock_frozen(const ckv_pblock *pb) {
  return pb && pb->holders > 1;
}

/* A session's content keys (prefix.h): token ids from position 0 while all
 * are known, and the key of each whole block of them. */
typedef struct ckv_prefix_chain {
  bool root_set;
  bool broken; /* a token came without its id: no key from there on */
  ckv_pkey root;
  uint32_t *ids; /* token id by position, while not broken */
  size_t n_ids, cap_ids;
  ckv_pkey *keys; /* key of block k, k < n_keys */
  size_t n_keys, cap_keys;
  size_t next_publish; /* first block not yet looked at for publishing */
} ckv_prefix_chain;
void ckv_prefix_chain_free(ckv_prefix_chain *ch);

/* A (model, revision, geometry, block size) whose sessions published
 * blocks: what LookupPrefix, which names no geometry, tries. */
typedef struct ckv_prefix_root {
  char model_id[129];
  char model_revision[129];
  ckv_pkey root;
  uint32_t block_tokens;
} ckv_prefix_root;

typedef struct ckv_prefix_figures {
  uint64_t
      shared_bytes; /* bytes of blocks with more than one holder, each once */
  uint64_t shared_blocks;
  uint64_t excess_bytes; /* what the sessions' own byte counts count more than
                            once: sum (holders-1)*bytes */
  uint64_t indexed_blocks;
  uint64_t lookup_tokens; /* tokens asked for (LookupPrefix, OpenSession
                             reuse_prefix), since start */
  uint64_t hit_tokens;    /* of those, matched */
} ckv_prefix_figures;

/* The tenant's registry, made on first use (freed with the tenant); NULL
 * on -ENOMEM. */
ckv_prefix *ckv_shared_registry(ckv_tenant *t);
/* The indexed block of key k, or NULL. */
ckv_pblock *ckv_shared_by_key(const ckv_prefix *p, ckv_pkey k);
/* A new record pb (holders set by the caller) joins the registry by its
 * offset; CKV_OK or -ENOMEM. */
int ckv_shared_add(ckv_prefix *p, ckv_pblock *pb);
/* pb (in the registry) gets key k and, when no block has it yet, enters the
 * index.  CKV_OK, CKV_ERR_EXISTS (keyed, not indexed) or -ENOMEM. */
int ckv_shared_index(ckv_prefix *p, ckv_pblock *pb, ckv_pkey k);
/* Removes pb's record from the registry and frees it (not the block). */
void ckv_shared_forget(ckv_prefix *p, ckv_pblock *pb);
/* pb leaves the index (LookupPrefix and reuse_prefix no longer find it);
 * the record stays. */
void ckv_shared_unindex(ckv_prefix *p, ckv_pblock *pb);
/* pb (in the registry, a compressed block) enters the index under the n
 * draft-block keys it holds, in slot order (pb keeps a copy).  Keys another
 * block has are skipped.  CKV_OK or -ENOMEM. */
int ckv_shared_index_group(ckv_prefix *p, ckv_pblock *pb, const ckv_pkey *keys, uint32_t n, uint16_t sub_tokens);
/* Which sub-block of pb key k is (0 for a plain block), or -1. */
int ckv_shared_sub_of(const ckv_pblock *pb, ckv_pkey k);
/* Table entry (s, idx) points at pb now / no more.  add: CKV_OK or -ENOMEM. */
int ckv_shared_user_add(ckv_pblock *pb, ckv_srv_session *s, uint32_t idx);
void ckv_shared_user_del(ckv_pblock *pb, const ckv_srv_session *s, uint32_t idx);
void ckv_pblock_free(ckv_pblock *pb);
ckv_prefix_figures *ckv_shared_figures(ckv_prefix *p);
void ckv_shared_note_root(ckv_prefix *p, const ckv_prefix_root *r);
size_t ckv_shared_roots(const ckv_prefix *p, const ckv_prefix_root **ret);

/* The published copy of the tenant's index (shm/prefix_index.h): every
 * change to the index above is mirrored into it.  It starts with MIN slots
 * (128 KiB) and is replaced by one twice its size when it fills up, up to
 * MAX (2^22 slots: 3.1 M keys, 128 MiB); past that, workers ask the daemon
 * while it is full. */
#define CKV_PREFIX_INDEX_MIN_SLOTS (1u << 12)
#define CKV_PREFIX_INDEX_MAX_SLOTS (1u << 22)
/* A read-only descriptor of the tenant's published index (owned by the
 * tenant; makes the registry and the index on first use) and its size, or
 * -1 when there is none (out of memory, no memfd). */
int ckv_prefix_index_fd(ckv_tenant *t, uint64_t *ret_bytes);
/* The published index's keys, slots and whether it holds every indexed key
 * (stats); 0 and false without one.  Makes nothing. */
void ckv_prefix_index_state(const ckv_tenant *t, uint64_t *ret_keys, uint32_t *ret_slots, bool *ret_complete);

/* One more holder. */
void ckv_prefix_hold(ckv_tenant *t, ckv_pblock *pb);
/* One holder fewer; at none the block goes back to the tenant's allocator. */
void ckv_prefix_unref(ckv_tenant *t, ckv_pblock *pb);
/* Warm restart: the shared record of the block at `offset` (the first
 * session put back there), or NULL. */
ckv_pblock *ckv_prefix_at_offset(ckv_tenant *t, uint64_t offset);
/* The tenant's figures (zero without a registry). */
void ckv_prefix_tenant_figures(const ckv_tenant *t, ckv_prefix_figures *ret);

#endif
