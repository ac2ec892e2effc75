/* wire.c - capped decoding of untrusted requests (see wire.h). */
#include "daemon/wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"

static void *arena_alloc(void *data, size_t size) {
  ckv_wire_arena *a = data;
  size_t aligned = (size + 15u) & ~(size_t)15u;
  if (aligned < size || aligned > a->cap - a->used) return NULL; /* cap reached: decode fails */
  void *p = a->buf + a->used;
  a->used += aligned;
  return p;
}

static void arena_free(void *data, void *ptr) {
  (void)data;
  (void)ptr; /* bump arena: everything goes at the next reset */
}

void *ckv_wire_alloc(ckv_wire_arena *a, size_t size) {
  void *p = arena_alloc(a, size);
  if (p) memset(p, 0, size);
  return p;
}

int ckv_wire_arena_init(ckv_wire_arena *a, size_t cap) {
  memset(a, 0, sizeof(*a));
  a->buf = malloc(cap);
  if (!a->buf) return -ENOMEM;
  a->cap = cap;
  a->allocator.alloc = arena_alloc;
  a->allocator.free = arena_free;
  a->allocator.allocator_data = a;
  return CKV_OK;
}

void ckv_wire_arena_done(ckv_wire_arena *a) {
  free(a->buf);
  memset(a, 0, sizeof(*a));
}

int ckv_wire_decode_request(ckv_wire_arena *a, const void *data, size_t len, Commitkv__V1__Request **ret) {
  a->used = 0;
  Commitkv__V1__Request *r = commitkv__v1__request__unpack(&a->allocator, len, data);
  if (!r) return CKV_ERR_PROTO;
  *ret = r;
  return CKV_OK;
}

int ckv_wire_check_session_id(const char *id) {
  if (!id) return CKV_ERR_INVALID;
  size_t n = strnlen(id, 129);
  if (n == 0 || n > 128) return CKV_ERR_INVALID;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == ':' || c == '-'))
      return CKV_ERR_INVALID;
  }
  return CKV_OK;
}
