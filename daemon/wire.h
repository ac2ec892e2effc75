/* wire.h - decoding untrusted requests and encoding replies.
 *
 * Requests are unpacked with a capped allocator over a per-request bump arena,
 * so a hostile message cannot make protobuf-c allocate more than the cap.
 * The arena is reset (not freed) between requests. */
#ifndef CKV_DAEMON_WIRE_H
#define CKV_DAEMON_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "commitkv.pb-c.h"

typedef struct ckv_wire_arena {
  uint8_t *buf;
  size_t cap;
  size_t used;
  ProtobufCAllocator allocator; /* points back at this arena */
} ckv_wire_arena;

/* Reserve `cap` bytes for decoding.  Returns CKV_OK or -ENOMEM. */
int ckv_wire_arena_init(ckv_wire_arena *a, size_t cap);
void ckv_wire_arena_done(ckv_wire_arena *a);

/* Scratch allocation for building replies; NULL when the arena is full. */
void *ckv_wire_alloc(ckv_wire_arena *a, size_t size);
static inline void ckv_wire_reset(ckv_wire_arena *a) { a->used = 0; }

/* Decode one Request from untrusted bytes.  On success *ret points into the
 * arena and stays valid until the next decode.  CKV_ERR_PROTO when the bytes
 * are not a Request or decoding needs more than the cap. */
int ckv_wire_decode_request(ckv_wire_arena *a, const void *data, size_t len, Commitkv__V1__Request **ret);

/* The request_id (Request field 2) of bytes too large to decode, found by
 * walking the first few top-level fields without unpacking anything, so an
 * error reply can still name the request it answers.  0 when not found. */
uint64_t ckv_wire_peek_request_id(const void *data, size_t len);

/* Makes every `string` field of the message `m` and of its sub-messages
 * (singular, repeated, oneof members, map entries) valid UTF-8, as proto3
 * requires and standard clients check: a field that is not gets a repaired
 * copy (ckv_utf8_copy) from `scratch`, or, when `scratch` is NULL or full, a
 * fixed text saying so.  Only pointers in `m` change, never the text they
 * pointed at.  Called on each reply just before it is packed, so no handler
 * can forget it.  Returns the number of fields repaired. */
size_t ckv_wire_fix_strings(ckv_wire_arena *scratch, ProtobufCMessage *m);

/* Every `string` field of the Request in data (decoded already), at any
 * depth, read off the wire as sent: one that holds a NUL byte (which the
 * decoder would silently cut it at) or is not valid UTF-8 (a proto3 string
 * must be) answers CKV_ERR_INVALID, naming the field and why in bad
 * ("open_session.model_id is not valid UTF-8").  Names and ids are never
 * changed behind a client's back. */
int ckv_wire_check_strings(const void *data, size_t len, char *bad, size_t badlen);

/* Session ids: 1..128 bytes of [A-Za-z0-9._:-].  Returns CKV_OK or CKV_ERR_INVALID. */
int ckv_wire_check_session_id(const char *id);

/* Little-endian packed column helpers: number of elements of `elem` bytes in a
 * bytes field, or -1 when the length is not a multiple. */
static inline long ckv_wire_column_len(const ProtobufCBinaryData *b, size_t elem) {
  return b->len % elem ? -1 : (long)(b->len / elem);
}

#endif
