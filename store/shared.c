/* shared.c - the records of shared blocks and their holders (see shared.h). */
#include "store/shared.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "kernels/format.h"
#include "store/tenant.h"

#define PREFIX_MAX_ROOTS 32u

/* ---- a map from 128-bit keys to shared blocks (linear probing) ---- */

typedef struct ptab {
  ckv_pkey *keys;
  ckv_pblock **vals; /* NULL: empty */
  size_t cap, n;
} ptab;

static size_t ptab_home(const ptab *m, ckv_pkey k) {
  return (size_t)(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull)) & (m->cap - 1);
}
static bool key_eq(ckv_pkey a, ckv_pkey b) {
  return a.lo == b.lo && a.hi == b.hi;
}

static ckv_pblock *ptab_get(const ptab *m, ckv_pkey k) {
  if (!m->cap)
    return NULL;
  for (size_t i = ptab_home(m, k);; i = (i + 1) & (m->cap - 1)) {
    if (!m->vals[i])
      return NULL;
    if (key_eq(m->keys[i], k))
      return m->vals[i];
  }
}

static int ptab_put(ptab *m, ckv_pkey k, ckv_pblock *v) {
  if ((m->n + 1) * 2 > m->cap) {
    ptab old = *m;
    size_t ncap = old.cap ? old.cap * 2 : 64;
    ckv_pkey *nk = calloc(ncap, sizeof(*nk));
    ckv_pblock **nv = calloc(ncap, sizeof(*nv));
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return -ENOMEM;
    }
    *m = (ptab){nk, nv, ncap, 0};
    for (size_t i = 0; i < old.cap; i++)
      if (old.vals[i])
        (void)ptab_put(m, old.keys[i], old.vals[i]);
    free(old.keys);
    free(old.vals);
  }
  size_t i = ptab_home(m, k);
  while (m->vals[i] && !key_eq(m->keys[i], k))
    i = (i + 1) & (m->cap - 1);
  if (!m->vals[i])
    m->n++;
  m->keys[i] = k;
  m->vals[i] = v;
  return CKV_OK;
}

/* Removes k (backward-shift deletion: no tombstones). */
static void ptab_del(ptab *m, ckv_pkey k) {
  if (!m->cap)
    return;
  size_t mask = m->cap - 1, i = ptab_home(m, k);
  while (m->vals[i] && !key_eq(m->keys[i], k))
    i = (i + 1) & mask;
  if (!m->vals[i])
    return;
  m->vals[i] = NULL;
  m->n--;
  for (size_t j = (i + 1) & mask; m->vals[j]; j = (j + 1) & mask) {
    size_t h = ptab_home(m, m->keys[j]);
    /* can the entry at j move to the hole at i? (its home is not in (i, j]) */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      m->vals[j] = NULL;
      i = j;
    }
  }
}

static void ptab_done(ptab *m) {
  free(m->keys);
  free(m->vals);
  *m = (ptab){0};
}

/* ---- the tenant's registry ---- */

struct ckv_prefix {
  ptab by_key; /* indexed blocks */
  ptab by_off; /* every shared block, by arena offset ({offset, 0}) */
  ckv_prefix_root roots[PREFIX_MAX_ROOTS];
  size_t n_roots;
  ckv_prefix_figures fig;
  ckv_pindex *pub; /* the published mirror of by_key and roots (NULL: none) */
};

static ckv_pkey off_key(uint64_t offset) { return (ckv_pkey){offset, 0}; }

void ckv_pblock_free(ckv_pblock *pb) {
  if (!pb)
    return;
  free(pb->meta);
  free(pb->subkeys);
  free(pb->users);
  free(pb->roles);
  free(pb->tags);
  free(pb->semantic);
  free(pb);
}

static void registry_free(ckv_prefix *p) {
  if (!p)
    return;
  /* Records still held (a tenant freed with sessions left): the arena goes
   * with the tenant; only the records are ours. */
  for (size_t i = 0; i < p->by_off.cap; i++)
    ckv_pblock_free(p->by_off.vals[i]);
  ptab_done(&p->by_key);
  ptab_done(&p->by_off);
  ckv_pindex_free(p->pub);
  free(p);
}

ckv_prefix *ckv_shared_registry(ckv_tenant *t) {
  if (!t->prefix && (t->prefix = calloc(1, sizeof(*t->prefix)))) {
    t->prefix_free = registry_free;
    /* Without a published index, workers ask the daemon (LookupPrefix). */
    (void)ckv_pindex_new(CKV_PREFIX_INDEX_MIN_SLOTS, &t->prefix->pub);
  }
  return t->prefix;
}

/* ---- the published mirror (shm/prefix_index.h) ---- */

static uint32_t key_tokens(const ckv_pblock *pb) {
  return pb->n_subkeys ? pb->sub_tokens : pb->capacity;
}

static bool put_key(ckv_pindex *ix, ckv_pkey k, const ckv_pblock *pb) {
  int j = ckv_shared_sub_of(pb, k);
  return j < 0 || ckv_pindex_put(ix, k, pb->offset, (uint32_t)j, key_tokens(pb));
}

/* Everything the registry indexes, into ix (empty). */
static void fill_index(const ckv_prefix *p, ckv_pindex *ix) {
  for (size_t i = 0; i < p->by_key.cap; i++)
    if (p->by_key.vals[i])
      (void)put_key(ix, p->by_key.keys[i], p->by_key.vals[i]);
  for (size_t i = 0; i < p->n_roots; i++)
    (void)ckv_pindex_add_root(ix, p->roots[i].model_id, p->roots[i].model_revision, p->roots[i].root,
                              p->roots[i].block_tokens);
}

/* The published index is full: a new one of twice its slots takes every
 * key, and the old one tells its readers to fetch it.  At the largest size,
 * or out of memory, the old one stays (incomplete: readers ask the daemon). */
static void grow_index(ckv_prefix *p) {
  uint32_t slots = ckv_pindex_slots(p->pub);
  ckv_pindex *nx = NULL;
  if (slots >= CKV_PREFIX_INDEX_MAX_SLOTS || ckv_pindex_new(slots * 2, &nx) < 0)
    return;
  fill_index(p, nx);
  ckv_pindex_supersede(p->pub);
  ckv_pindex_free(p->pub); /* the workers' mappings keep the old file until they fetch the new one */
  p->pub = nx;
}

static void publish_key(ckv_prefix *p, ckv_pkey k, const ckv_pblock *pb) {
  if (p->pub && !put_key(p->pub, k, pb))
    grow_index(p);
}

/* An incomplete mirror (it was full) is rebuilt once the index fits in half
 * of its slots again. */
static void unpublish_key(ckv_prefix *p, ckv_pkey k) {
  if (!p->pub)
    return;
  ckv_pindex_del(p->pub, k);
  if (ckv_pindex_complete(p->pub) || p->by_key.n * 2 > ckv_pindex_slots(p->pub))
    return;
  ckv_pindex_rebuild_begin(p->pub);
  fill_index(p, p->pub);
  ckv_pindex_rebuild_end(p->pub);
}

int ckv_prefix_index_fd(ckv_tenant *t, uint64_t *ret_bytes) {
  ckv_prefix *p = ckv_shared_registry(t);
  if (!p || !p->pub)
    return -1;
  *ret_bytes = ckv_pindex_bytes(p->pub);
  return ckv_pindex_reader_fd(p->pub);
}

void ckv_prefix_index_state(const ckv_tenant *t, uint64_t *ret_keys, uint32_t *ret_slots, bool *ret_complete) {
  const ckv_prefix *p = t->prefix;
  *ret_keys = p && p->pub ? ckv_pindex_entries(p->pub) : 0;
  *ret_slots = p && p->pub ? ckv_pindex_slots(p->pub) : 0;
  *ret_complete = p && p->pub && ckv_pindex_complete(p->pub);
}

ckv_pblock *ckv_shared_by_key(const ckv_prefix *p, ckv_pkey k) {
  return ptab_get(&p->by_key, k);
}

int ckv_shared_add(ckv_prefix *p, ckv_pblock *pb) {
  return ptab_put(&p->by_off, off_key(pb->offset), pb);
}

int ckv_shared_index(ckv_prefix *p, ckv_pblock *pb, ckv_pkey k) {
  pb->key = k;
  pb->keyed = true;
  if (ptab_get(&p->by_key, k))
    return CKV_ERR_EXISTS;
  int r = ptab_put(&p->by_key, k, pb);
  if (r < 0)
    return r;
  publish_key(p, k, pb);
  pb->indexed = true;
  p->fig.indexed_blocks++;
  return CKV_OK;
}

void ckv_shared_unindex(ckv_prefix *p, ckv_pblock *pb) {
  if (!pb->indexed)
    return;
  if (pb->n_subkeys) {
    for (uint32_t j = 0; j < pb->n_subkeys; j++)
      if (ptab_get(&p->by_key, pb->subkeys[j]) == pb) {
        ptab_del(&p->by_key, pb->subkeys[j]);
        unpublish_key(p, pb->subkeys[j]);
      }
  } else if (ptab_get(&p->by_key, pb->key) == pb) {
    ptab_del(&p->by_key, pb->key);
    unpublish_key(p, pb->key);
  }
  pb->indexed = false;
  p->fig.indexed_blocks--;
}

int ckv_shared_index_group(ckv_prefix *p, ckv_pblock *pb, const ckv_pkey *keys, uint32_t n, uint16_t sub_tokens) {
  ckv_pkey *copy = malloc((n ? n : 1) * sizeof(*copy));
  if (!copy)
    return -ENOMEM;
  memcpy(copy, keys, n * sizeof(*copy));
  free(pb->subkeys);
  pb->subkeys = copy;
  pb->n_subkeys = n;
  pb->sub_tokens = sub_tokens;
  pb->keyed = n > 0;
  if (n)
    pb->key = keys[0];
  bool any = false;
  for (uint32_t j = 0; j < n; j++) {
    if (ptab_get(&p->by_key, keys[j]))
      continue;
    int r = ptab_put(&p->by_key, keys[j], pb);
    if (r < 0) {
      ckv_shared_unindex(p, pb);
      return r;
    }
    publish_key(p, keys[j], pb);
    if (!any)
      p->fig.indexed_blocks++;
    any = true;
    pb->indexed = true;
  }
  return CKV_OK;
}

int ckv_shared_sub_of(const ckv_pblock *pb, ckv_pkey k) {
  if (!pb->n_subkeys)
    return pb->keyed && key_eq(pb->key, k) ? 0 : -1;
  for (uint32_t j = 0; j < pb->n_subkeys; j++)
    if (key_eq(pb->subkeys[j], k))
      return (int)j;
  return -1;
}

int ckv_shared_user_add(ckv_pblock *pb, ckv_srv_session *s, uint32_t idx) {
  if (pb->n_users == pb->cap_users) {
    uint32_t ncap = pb->cap_users ? pb->cap_users * 2 : 4;
    ckv_pblock_user *nu = realloc(pb->users, ncap * sizeof(*nu));
    if (!nu)
      return -ENOMEM;
    pb->users = nu;
    pb->cap_users = ncap;
  }
  pb->users[pb->n_users++] = (ckv_pblock_user){s, idx};
  return CKV_OK;
}

void ckv_shared_user_del(ckv_pblock *pb, const ckv_srv_session *s, uint32_t idx) {
  for (uint32_t i = 0; i < pb->n_users; i++)
    if (pb->users[i].s == s && pb->users[i].idx == idx) {
      pb->users[i] = pb->users[--pb->n_users];
      return;
    }
}

void ckv_shared_forget(ckv_prefix *p, ckv_pblock *pb) {
  ckv_shared_unindex(p, pb);
  ptab_del(&p->by_off, off_key(pb->offset));
  ckv_pblock_free(pb);
}

ckv_prefix_figures *ckv_shared_figures(ckv_prefix *p) { return &p->fig; }

void ckv_shared_note_root(ckv_prefix *p, const ckv_prefix_root *r) {
  for (size_t i = 0; i < p->n_roots; i++)
    if (key_eq(p->roots[i].root, r->root))
      return;
  if (p->n_roots < PREFIX_MAX_ROOTS) {
    p->roots[p->n_roots++] = *r;
    if (p->pub)
      (void)ckv_pindex_add_root(p->pub, r->model_id, r->model_revision, r->root, r->block_tokens);
  }
}

size_t ckv_shared_roots(const ckv_prefix *p, const ckv_prefix_root **ret) {
  *ret = p->roots;
  return p->n_roots;
}

void ckv_prefix_hold(ckv_tenant *t, ckv_pblock *pb) {
  ckv_prefix *p = t->prefix;
  if (pb->holders >= 1) {
    p->fig.excess_bytes += pb->bytes;
    if (pb->holders == 1) {
      p->fig.shared_bytes += pb->bytes;
      p->fig.shared_blocks++;
    }
  }
  pb->holders++;
}

void ckv_prefix_unref(ckv_tenant *t, ckv_pblock *pb) {
  ckv_prefix *p = t->prefix;
  if (pb->holders > 1) {
    p->fig.excess_bytes -= pb->bytes;
    if (pb->holders == 2) {
      p->fig.shared_bytes -= pb->bytes;
      p->fig.shared_blocks--;
    }
  }
  if (--pb->holders)
    return;
  uint64_t off = pb->offset, bytes = pb->bytes;
  uint32_t format = pb->format;
  ckv_shared_forget(p, pb);
  ckv_tenant_block_free(t, off, bytes, format);
}

ckv_pblock *ckv_prefix_at_offset(ckv_tenant *t, uint64_t offset) {
  return t->prefix ? ptab_get(&t->prefix->by_off, off_key(offset)) : NULL;
}

void ckv_prefix_tenant_figures(const ckv_tenant *t, ckv_prefix_figures *ret) {
  if (t->prefix)
    *ret = t->prefix->fig;
  else
    *ret = (ckv_prefix_figures){0};
}

void ckv_prefix_chain_free(ckv_prefix_chain *ch) {
  if (!ch)
    return;
  free(ch->ids);
  free(ch->keys);
  free(ch);
}
