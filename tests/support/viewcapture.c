/* viewcapture.c - see viewcapture.h. */
#include "viewcapture.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/status.h"
#include "kernels/kernels.h"

ckv_capture ckv_test_capture_view(ckv_client *c, const char *sid, const ckv_geometry *g) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__GetView gv = COMMITKV__V1__GET_VIEW__INIT;
  gv.session_id = (char *)sid;
  req.body_case = COMMITKV__V1__REQUEST__BODY_GET_VIEW;
  req.get_view = &gv;
  Commitkv__V1__Response *rep = NULL;
  int r = ckv_rpc(c, &req, &rep);
  cr_assert_eq(r, CKV_OK, "GetView %s: %s (%s)", sid, ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(rep->body_case == COMMITKV__V1__RESPONSE__BODY_VIEW && rep->view, "GetView %s answered no view", sid);
  const Commitkv__V1__View *v = rep->view;
  ckv_capture cap = {.epoch = v->epoch, .n_tokens = v->n_tokens};
  /* cold blocks too: demoted tokens are the session's K/V as much as any (a
   * block may go cold, or stop being a fill block, across a restore) */
  size_t total = v->n_draft + v->n_staged + v->n_committed + v->n_cold;
  cap.blocks = calloc(total + 1, sizeof(*cap.blocks));
  cap.format_of = malloc(v->n_tokens + 1);
  cr_assert(cap.blocks && cap.format_of);
  memset(cap.format_of, CKV_FORMAT_COUNT_, v->n_tokens + 1);
  Commitkv__V1__BlockRef **lists[4] = {v->draft, v->staged, v->committed, v->cold};
  size_t counts[4] = {v->n_draft, v->n_staged, v->n_committed, v->n_cold};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; i < counts[k]; i++) {
      const Commitkv__V1__BlockRef *b = lists[k][i];
      const uint8_t *base = ckv_rpc_arena_ptr(c, b->arena_id, b->offset, b->bytes);
      cr_assert_not_null(base, "view block outside the mapped arena");
      cr_assert_eq(ckv_block_check(base, g), CKV_OK, "block %llu fails its header check",
                   (unsigned long long)b->block_id);
      cr_assert_leq(b->capacity, 1024);
      ckv_captured_block *cb = &cap.blocks[cap.n_blocks++];
      cb->format = b->format;
      cb->capacity = b->capacity;
      const uint32_t *pos = ckv_block_positions_const(base);
      for (uint32_t slot = 0; slot < b->capacity; slot++)
        if (ckv_block_slot_valid(base, slot)) {
          cr_assert_lt(pos[slot], v->n_tokens);
          cb->slots[cb->n_valid] = slot;
          cb->positions[cb->n_valid++] = pos[slot];
          cap.format_of[pos[slot]] = (uint8_t)b->format;
        }
      size_t head = ckv_block_payload_offset(b->capacity);
      cb->payload_len = b->bytes - head;
      cb->payload = malloc(cb->payload_len);
      cr_assert_not_null(cb->payload);
      memcpy(cb->payload, base + head, cb->payload_len);
      cap.per_format[b->format]++;
    }
  ckv_rpc_free(rep);
  return cap;
}

void ckv_test_capture_free(ckv_capture *c) {
  for (size_t i = 0; i < c->n_blocks; i++) free(c->blocks[i].payload);
  free(c->blocks);
  free(c->format_of);
  memset(c, 0, sizeof(*c));
}

void ckv_test_expect_same_view(const ckv_capture *a, const ckv_capture *b, const char *what) {
  cr_assert_eq(a->n_tokens, b->n_tokens, "%s: %llu tokens, had %llu", what, (unsigned long long)b->n_tokens,
               (unsigned long long)a->n_tokens);
  for (uint64_t p = 0; p < a->n_tokens; p++)
    cr_assert_eq(a->format_of[p], b->format_of[p], "%s: token %llu in format %u, was %u", what,
                 (unsigned long long)p, b->format_of[p], a->format_of[p]);
  size_t matched = 0;
  for (size_t i = 0; i < a->n_blocks; i++) {
    const ckv_captured_block *x = &a->blocks[i];
    if (!x->n_valid) continue; /* an empty fill block carries no K/V */
    const ckv_captured_block *y = NULL;
    for (size_t j = 0; j < b->n_blocks && !y; j++)
      if (b->blocks[j].format == x->format && b->blocks[j].n_valid == x->n_valid &&
          memcmp(b->blocks[j].slots, x->slots, x->n_valid * 4) == 0 &&
          memcmp(b->blocks[j].positions, x->positions, x->n_valid * 4) == 0)
        y = &b->blocks[j];
    cr_assert_not_null(y, "%s: no block of format %u holds positions %u.. in the same slots", what, x->format,
                       x->positions[0]);
    cr_assert_eq(y->payload_len, x->payload_len);
    cr_assert_eq(memcmp(y->payload, x->payload, x->payload_len), 0, "%s: block of format %u (positions %u..) differs",
                 what, x->format, x->positions[0]);
    matched++;
  }
  cr_assert_gt(matched, 0, "%s: no block with K/V to compare", what);
}

void ckv_test_expect_serving(ckv_client *c) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatusRequest st = COMMITKV__V1__STATUS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATUS;
  req.status = &st;
  Commitkv__V1__Response *rep = NULL;
  int r = ckv_rpc(c, &req, &rep);
  cr_assert_eq(r, CKV_OK, "status: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  ckv_rpc_free(rep);
}
