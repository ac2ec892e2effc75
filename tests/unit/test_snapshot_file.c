/* test_snapshot_file.c - the snapshot reader and writer (persist/snapshot.c) on
 * their own: a snapshot written and read back is the same, and snapshots
 * whose checksums are right but whose tables lie (a token in a slot that is
 * not valid or names another position, a valid slot beyond those handed out,
 * state counts that do not add up, a policy parameter out of bounds) are
 * refused with CKV_ERR_CORRUPT: the reader trusts no byte of the file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "persist/snapshot.h"
#include "kernels/kernels.h"
#include "lifecycle/policy.h"
#include "testutil.h"

#define CAP 16u
static const ckv_geometry k_geom = {1, 1, 8, 0};

typedef struct fixture {
  ckv_snap snap;
  ckv_snap_block block;
  uint8_t *bytes; /* the whole block: header region then payload */
  char *dir;
} fixture;

/* Two draft tokens in block 0, slots 0 and 1. */
static void make(fixture *f) {
  memset(f, 0, sizeof(*f));
  ckv_snap *s = &f->snap;
  snprintf(s->tenant, sizeof s->tenant, "default");
  snprintf(s->session_id, sizeof s->session_id, "unit");
  snprintf(s->model_id, sizeof s->model_id, "m");
  snprintf(s->model_revision, sizeof s->model_revision, "r");
  s->geom = k_geom;
  s->draft_tokens = CAP;
  s->staged_tokens = s->commit_tokens = 64;
  ckv_judge_params_init(&s->params);
  s->epoch = 3;
  s->rounds = s->last_round = 1;
  s->count_by_state[CKV_STATE_DRAFT] = 2;
  for (int i = 0; i < CKV_FORMAT_COUNT_; i++) s->fill[i] = CKV_NO_BLOCK;
  s->fill[CKV_FORMAT_DRAFT] = 0;
  s->n_table = 1;
  ckv_tokens_init(&s->tokens);
  cr_assert_eq(ckv_tokens_reserve(&s->tokens, 2), CKV_OK);
  ckv_tokens_push(&s->tokens, 1, 0, 0.5f, 1, 0, 0);
  ckv_tokens_push(&s->tokens, 2, 0, 0.9f, 1, 0, 1);
  size_t bytes = ckv_format_block_bytes(CKV_FORMAT_DRAFT, &k_geom, CAP, 0);
  f->bytes = calloc(1, bytes);
  cr_assert_eq(ckv_block_init_header(f->bytes, CKV_FORMAT_DRAFT, &k_geom, CAP, 0, 7), CKV_OK);
  uint32_t *pos = ckv_block_positions(f->bytes);
  pos[0] = 0;
  pos[1] = 1;
  ckv_block_set_valid(f->bytes, 0, true);
  ckv_block_set_valid(f->bytes, 1, true);
  size_t head = ckv_block_payload_offset(CAP);
  for (size_t i = head; i < bytes; i++) f->bytes[i] = (uint8_t)(i * 7);
  f->block = (ckv_snap_block){.index = 0, .format = CKV_FORMAT_DRAFT, .capacity = CAP, .used = 2, .bytes = bytes,
                              .meta = f->bytes, .payload = f->bytes + head};
  s->blocks = &f->block;
  s->n_blocks = 1;
  f->dir = ckv_test_tmpdir("ckv-snap-unit");
}

static void done(fixture *f) {
  ckv_tokens_done(&f->snap.tokens);
  free(f->bytes);
  ckv_test_rmdir(f->dir);
}

/* Writes f's snapshot and reads it back: the reader's status, its text in err. */
static int roundtrip(fixture *f, ckv_snap *out, char *err, size_t len) {
  uint64_t bytes = 0;
  char werr[256];
  cr_assert_eq(ckv_snap_write(f->dir, "unit", &f->snap, &bytes, werr, sizeof werr), CKV_OK, "%s", werr);
  cr_assert_gt(bytes, 0);
  /* the disk quota charges a save this figure before it is written (persist/diskuse.h) */
  cr_assert_eq(ckv_snap_file_size(&f->snap), bytes, "file_size %llu, written %llu",
               (unsigned long long)ckv_snap_file_size(&f->snap), (unsigned long long)bytes);
  char path[512];
  snprintf(path, sizeof path, "%s/unit%s", f->dir, CKV_SNAP_SUFFIX);
  return ckv_snap_read(path, out, err, len);
}

Test(snapshot_file, roundtrip_is_identical) {
  fixture f;
  make(&f);
  ckv_snap r;
  char err[256];
  cr_assert_eq(roundtrip(&f, &r, err, sizeof err), CKV_OK, "%s", err);
  cr_assert_str_eq(r.tenant, "default");
  cr_assert_str_eq(r.session_id, "unit");
  cr_assert_str_eq(r.model_id, "m");
  cr_assert_str_eq(r.model_revision, "r");
  cr_assert_eq(r.geom.head_dim, 8);
  cr_assert_eq(r.tokens.n, 2);
  cr_assert_eq(r.tokens.role[1], 2);
  cr_assert_eq(r.tokens.semantic[1], f.snap.tokens.semantic[1]);
  cr_assert_eq(r.n_blocks, 1);
  cr_assert_eq(r.blocks[0].bytes, f.block.bytes);
  cr_assert_eq(memcmp(r.blocks[0].payload, f.block.payload, f.block.bytes - ckv_block_payload_offset(CAP)), 0);
  cr_assert_eq(r.epoch, 3);
  cr_assert_eq(r.params.history_rounds, f.snap.params.history_rounds);
  ckv_snap_expect e = {.tenant = "default", .model_id = "m", .model_revision = "r", .geom = &k_geom};
  cr_assert_eq(ckv_snap_check_identity(&r, &e, err, sizeof err), CKV_OK);
  e.tenant = "other";
  cr_assert_eq(ckv_snap_check_identity(&r, &e, err, sizeof err), CKV_ERR_AUTH);
  e.tenant = NULL;
  e.model_revision = "r2";
  cr_assert_eq(ckv_snap_check_identity(&r, &e, err, sizeof err), CKV_ERR_FORMAT);
  ckv_snap_done(&r);
  char path[512];
  snprintf(path, sizeof path, "%s/unit%s", f.dir, CKV_SNAP_SUFFIX);
  ckv_snap h;
  cr_assert_eq(ckv_snap_read_header(path, &h, err, sizeof err), CKV_OK, "%s", err);
  cr_assert_eq(h.tokens.n, 2);
  ckv_snap_done(&h);
  done(&f);
}

static void expect_corrupt(fixture *f, const char *what) {
  ckv_snap r;
  char err[256] = "";
  int st = roundtrip(f, &r, err, sizeof err);
  if (st == CKV_OK) ckv_snap_done(&r);
  cr_assert_eq(st, CKV_ERR_CORRUPT, "%s: %s (%s)", what, ckv_status_name(st), err);
  cr_assert_gt(strlen(err), 5);
}

Test(snapshot_file, token_in_an_invalid_slot_refused) {
  fixture f;
  make(&f);
  ckv_block_set_valid(f.bytes, 1, false);
  expect_corrupt(&f, "token 1 in a slot that is not valid");
  done(&f);
}

Test(snapshot_file, slot_naming_another_position_refused) {
  fixture f;
  make(&f);
  ckv_block_positions(f.bytes)[1] = 0;
  expect_corrupt(&f, "slot 1 names token 0");
  done(&f);
}

Test(snapshot_file, valid_slot_beyond_used_refused) {
  fixture f;
  make(&f);
  ckv_block_set_valid(f.bytes, 5, true);
  expect_corrupt(&f, "slot 5 valid, 2 used");
  done(&f);
}

Test(snapshot_file, state_counts_must_add_up) {
  fixture f;
  make(&f);
  f.snap.count_by_state[CKV_STATE_DRAFT] = 3;
  expect_corrupt(&f, "three draft tokens counted, two in the columns");
  done(&f);
}

Test(snapshot_file, policy_parameter_out_of_bounds_refused) {
  fixture f;
  make(&f);
  f.snap.params.history_rounds = 99; /* beyond the attention ring */
  expect_corrupt(&f, "history_rounds 99");
  done(&f);
}

Test(snapshot_file, token_state_out_of_range_refused) {
  fixture f;
  make(&f);
  f.snap.tokens.state[0] = 7;
  expect_corrupt(&f, "state 7");
  done(&f);
}
