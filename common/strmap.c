/* strmap.c - linear-probing string map with tombstones (see strmap.h). */
#include "common/strmap.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"

#define TOMBSTONE ((char *)(uintptr_t)1)

typedef struct entry {
  char *key; /* NULL = empty, TOMBSTONE = deleted */
  void *value;
} entry;

struct ckv_strmap {
  entry *e;
  size_t cap; /* power of two */
  size_t size;
  size_t used; /* live + tombstones */
};

static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

int ckv_strmap_new(ckv_strmap **ret) {
  ckv_strmap *m = calloc(1, sizeof(*m));
  if (!m) return -ENOMEM;
  m->cap = 16;
  m->e = calloc(m->cap, sizeof(entry));
  if (!m->e) {
    free(m);
    return -ENOMEM;
  }
  *ret = m;
  return CKV_OK;
}

ckv_strmap *ckv_strmap_free(ckv_strmap *m) {
  if (!m) return NULL;
  for (size_t i = 0; i < m->cap; i++)
    if (m->e[i].key && m->e[i].key != TOMBSTONE) free(m->e[i].key);
  free(m->e);
  free(m);
  return NULL;
}

static entry *find(const ckv_strmap *m, const char *key) {
  size_t mask = m->cap - 1;
  for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
    entry *e = &m->e[i];
    if (!e->key) return NULL;
    if (e->key != TOMBSTONE && strcmp(e->key, key) == 0) return e;
  }
}

/* Rehashes into `ncap` slots, dropping tombstones. */
static int rehash(ckv_strmap *m, size_t ncap) {
  entry *ne = calloc(ncap, sizeof(entry));
  if (!ne) return -ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    entry *e = &m->e[i];
    if (!e->key || e->key == TOMBSTONE) continue;
    size_t j = hash(e->key) & (ncap - 1);
    while (ne[j].key) j = (j + 1) & (ncap - 1);
    ne[j] = *e;
  }
  free(m->e);
  m->e = ne;
  m->cap = ncap;
  m->used = m->size;
  return CKV_OK;
}

int ckv_strmap_put(ckv_strmap *m, const char *key, void *value) {
  entry *e = find(m, key);
  if (e) {
    e->value = value;
    return CKV_OK;
  }
  if ((m->used + 1) * 4 >= m->cap * 3) {
    /* Full of live keys: double.  Full of tombstones (a daemon whose short
     * clients come and go): sweep them at the same size, or the table would
     * double forever while holding a handful of keys. */
    size_t ncap = (m->size + 1) * 2 >= m->cap ? m->cap * 2 : m->cap;
    int r = rehash(m, ncap);
    if (r < 0) return r;
  }
  char *k = strdup(key);
  if (!k) return -ENOMEM;
  size_t mask = m->cap - 1;
  size_t i = hash(key) & mask;
  while (m->e[i].key && m->e[i].key != TOMBSTONE) i = (i + 1) & mask;
  if (!m->e[i].key) m->used++;
  m->e[i].key = k;
  m->e[i].value = value;
  m->size++;
  return CKV_OK;
}

void *ckv_strmap_get(const ckv_strmap *m, const char *key) {
  entry *e = find(m, key);
  return e ? e->value : NULL;
}

void *ckv_strmap_del(ckv_strmap *m, const char *key) {
  entry *e = find(m, key);
  if (!e) return NULL;
  void *v = e->value;
  free(e->key);
  e->key = TOMBSTONE;
  e->value = NULL;
  m->size--;
  return v;
}

size_t ckv_strmap_size(const ckv_strmap *m) { return m->size; }
size_t ckv_strmap_capacity(const ckv_strmap *m) { return m->cap; }

void *ckv_strmap_next(const ckv_strmap *m, size_t *cursor, const char **ret_key) {
  for (size_t i = *cursor; i < m->cap; i++) {
    entry *e = &m->e[i];
    if (e->key && e->key != TOMBSTONE) {
      *cursor = i + 1;
      if (ret_key) *ret_key = e->key;
      return e->value;
    }
  }
  *cursor = m->cap;
  return NULL;
}
