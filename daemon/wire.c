/* wire.c - capped decoding of untrusted requests (see wire.h). */
#include "daemon/wire.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "daemon/utf8.h"

/* Replies nest 4 deep (Response > Stats > TenantStats > TokenCounts); the
 * bound only guards against a descriptor cycle. */
#define FIX_MAX_DEPTH 16
#define FIX_PLACEHOLDER "(text not valid UTF-8)"

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

/* Reads a varint at *at; false when the bytes end first or it is too long. */
static bool read_varint(const uint8_t *p, size_t len, size_t *at, uint64_t *ret) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 64 && *at < len; shift += 7) {
    uint8_t b = p[(*at)++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *ret = v;
      return true;
    }
  }
  return false;
}

uint64_t ckv_wire_peek_request_id(const void *data, size_t len) {
  const uint8_t *p = data;
  size_t at = 0;
  /* protobuf-c and the other encoders write fields in number order, so
   * request_id comes within the first few; the bound keeps this O(1). */
  for (int field = 0; field < 8 && at < len; field++) {
    uint64_t key, v;
    if (!read_varint(p, len, &at, &key)) return 0;
    switch (key & 7) {
    case 0: /* varint */
      if (!read_varint(p, len, &at, &v)) return 0;
      if (key >> 3 == 2) return v;
      break;
    case 1: /* 64-bit */
      if (len - at < 8) return 0;
      at += 8;
      break;
    case 2: /* length-delimited: skipped without reading it */
      if (!read_varint(p, len, &at, &v) || v > len - at) return 0;
      at += (size_t)v;
      break;
    case 5: /* 32-bit */
      if (len - at < 4) return 0;
      at += 4;
      break;
    default:
      return 0;
    }
  }
  return 0;
}

/* True when messages of type `d` can hold a string anywhere below them, so
 * a long repeated field of plain numbers (TransitionRange) is skipped whole. */
static bool desc_has_strings(const ProtobufCMessageDescriptor *d, int depth) {
  if (depth > FIX_MAX_DEPTH) return true;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type == PROTOBUF_C_TYPE_STRING) return true;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && desc_has_strings(f->descriptor, depth + 1)) return true;
  }
  return false;
}

static size_t fix_string(ckv_wire_arena *scratch, char **slot) {
  const char *s = *slot;
  if (!s) return 0;
  size_t len = strlen(s);
  if (ckv_utf8_valid(s, len)) return 0;
  size_t need = ckv_utf8_copy_size(s, len);
  char *copy = scratch ? arena_alloc(scratch, need) : NULL;
  if (copy)
    ckv_utf8_copy(copy, need, s, len);
  else
    copy = FIX_PLACEHOLDER;
  *slot = copy;
  return 1;
}

static size_t fix_message(ckv_wire_arena *scratch, ProtobufCMessage *m, int depth) {
  if (!m || depth > FIX_MAX_DEPTH) return 0;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  size_t fixed = 0;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && !desc_has_strings(f->descriptor, depth + 1)) continue;
    char *base = (char *)m;
    /* A oneof's members share storage: only the one set may be read. */
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(uint32_t *)(base + f->quantifier_offset) != f->id) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(size_t *)(base + f->quantifier_offset);
      void **v = *(void ***)(base + f->offset);
      for (size_t k = 0; v && k < n; k++)
        fixed += f->type == PROTOBUF_C_TYPE_STRING ? fix_string(scratch, (char **)&v[k])
                                                   : fix_message(scratch, v[k], depth + 1);
    } else if (f->type == PROTOBUF_C_TYPE_STRING) {
      fixed += fix_string(scratch, (char **)(base + f->offset));
    } else {
      fixed += fix_message(scratch, *(ProtobufCMessage **)(base + f->offset), depth + 1);
    }
  }
  return fixed;
}

size_t ckv_wire_fix_strings(ckv_wire_arena *scratch, ProtobufCMessage *m) { return fix_message(scratch, m, 0); }

/* One message's bytes (descriptor d), nested at most CHECK_DEPTH deep; a
 * string's problem goes into bad ("field.field: why"). */
#define CHECK_DEPTH 8
static int check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, int depth, char *bad,
                         size_t badlen) {
  size_t at = 0;
  while (at < len) {
    uint64_t key, v;
    if (!read_varint(p, len, &at, &key)) return CKV_OK; /* the decoder took it: nothing of ours to check */
    switch (key & 7) {
    case 0:
      if (!read_varint(p, len, &at, &v)) return CKV_OK;
      continue;
    case 1: at += 8; continue;
    case 5: at += 4; continue;
    case 2: break;
    default: return CKV_OK; /* groups: never in our schema, skipped by the decoder as unknown */
    }
    if (!read_varint(p, len, &at, &v) || v > len - at) return CKV_OK;
    const uint8_t *field = p + at;
    size_t n = (size_t)v;
    at += n;
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
    if (!f) continue; /* unknown: kept, never read */
    if (f->type == PROTOBUF_C_TYPE_STRING) {
      const char *why = memchr(field, 0, n) ? "holds a NUL byte" : !ckv_utf8_valid((const char *)field, n)
                                                                      ? "is not valid UTF-8"
                                                                      : NULL;
      if (why) {
        snprintf(bad, badlen, "%s %s", f->name, why);
        return CKV_ERR_INVALID;
      }
    } else if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < CHECK_DEPTH) {
      int r = check_strings(f->descriptor, field, n, depth + 1, bad, badlen);
      if (r < 0) {
        size_t used = strlen(bad);
        char inner[256];
        snprintf(inner, sizeof inner, "%.*s", (int)(used < sizeof inner ? used : sizeof inner - 1), bad);
        snprintf(bad, badlen, "%s.%s", f->name, inner);
        return r;
      }
    }
  }
  return CKV_OK;
}

int ckv_wire_check_strings(const void *data, size_t len, char *bad, size_t badlen) {
  return check_strings(&commitkv__v1__request__descriptor, data, len, 0, bad, badlen);
}

