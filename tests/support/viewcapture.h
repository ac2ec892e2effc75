/* viewcapture.h - what a session's published view holds, byte for byte, and
 * the comparison of two such captures: the tests of snapshots, the disk tier
 * and the remote store check that a session that went away and came back
 * (restore, resume, another daemon) reads exactly as before.  A capture keeps,
 * per block, its format, its valid (slot, position) pairs and its payload
 * bytes; per position its format (CKV_FORMAT_COUNT_: absent). */
#ifndef CKV_TEST_VIEWCAPTURE_H
#define CKV_TEST_VIEWCAPTURE_H

#include <stddef.h>
#include <stdint.h>

#include "commitkv/commitkv.h"
#include "kernels/format.h"

typedef struct ckv_captured_block {
  uint32_t format, capacity, n_valid;
  uint32_t slots[1024], positions[1024];
  uint8_t *payload;
  size_t payload_len;
} ckv_captured_block;

typedef struct ckv_capture {
  uint64_t epoch, n_tokens;
  ckv_captured_block *blocks;
  size_t n_blocks;
  uint8_t *format_of; /* per position */
  size_t per_format[CKV_FORMAT_COUNT_];
} ckv_capture;

/* GetView of session sid on c, every block checked against g and copied
 * (asserts on any failure). */
ckv_capture ckv_test_capture_view(ckv_client *c, const char *sid, const ckv_geometry *g);
void ckv_test_capture_free(ckv_capture *c);
/* b holds the same blocks as a (matched by format and valid (slot, position)
 * pairs: block ids may be new), byte for byte, and every token in the same
 * format; `what` names the comparison in the failure. */
void ckv_test_expect_same_view(const ckv_capture *a, const ckv_capture *b, const char *what);
/* The daemon still answers a Status request on c (after a refusal, a kill, a store gone). */
void ckv_test_expect_serving(ckv_client *c);

#endif
