/* fence.c - the store fence's record, its rule and its write (see fence.h). */
#include "persist/fence.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commitkv/status.h"
#include "common/fail.h"
#include "persist/remote.h"
#include "persist/seal.h"

#define MAGIC 0x46564b43u /* "CKVF" */
#define VERSION 1u
#define PLAIN_BYTES 24u

uint64_t ckv_fence_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void encode(uint8_t *b, uint64_t incarnation, uint64_t decided_ms) {
  uint32_t magic = MAGIC, version = VERSION;
  memcpy(b, &magic, 4);
  memcpy(b + 4, &version, 4);
  memcpy(b + 8, &incarnation, 8);
  memcpy(b + 16, &decided_ms, 8);
}

void ckv_fence_open(const ckv_remote *r, const char *tenant, const char *key, const uint8_t *rec, size_t len,
                    ckv_store_fence *ret) {
  *ret = (ckv_store_fence){.state = CKV_FENCE_NONE};
  if (!rec) return;
  ret->state = CKV_FENCE_REFUSED;
  const ckv_seal *seal = ckv_remote_seal(r);
  if (!seal) {
    snprintf(ret->why, sizeof ret->why, "this daemon has no key to open it");
    return;
  }
  if (len > CKV_FENCE_RECORD_MAX) {
    snprintf(ret->why, sizeof ret->why, "%zu bytes, more than a record takes", len);
    return;
  }
  uint8_t *plain = NULL;
  size_t plain_len = 0;
  char serr[200];
  if (ckv_seal_unwrap(seal, tenant, key, rec, len, &plain, &plain_len, serr, sizeof serr) < 0) {
    snprintf(ret->why, sizeof ret->why, "%.150s", serr);
    return;
  }
  uint32_t magic = 0, version = 0;
  if (plain_len == PLAIN_BYTES) {
    memcpy(&magic, plain, 4);
    memcpy(&version, plain + 4, 4);
  }
  if (magic != MAGIC || version != VERSION) {
    snprintf(ret->why, sizeof ret->why, "not a fence record of version %u", VERSION);
  } else {
    ret->state = CKV_FENCE_SET;
    memcpy(&ret->incarnation, plain + 8, 8);
    memcpy(&ret->decided_ms, plain + 16, 8);
  }
  free(plain);
}

bool ckv_fence_admits(const ckv_store_fence *f, uint64_t copy, const char **ret_why) {
  switch (f->state) {
    case CKV_FENCE_NONE: return true;
    case CKV_FENCE_REFUSED: *ret_why = "the store's fence record does not open (foreign or forged)"; return false;
    case CKV_FENCE_SET: break;
  }
  if (f->incarnation == 0) {
    *ret_why = "the store's fence says the id's conversation was ended";
    return false;
  }
  if (copy != f->incarnation) {
    *ret_why = "the store's fence names another conversation of the id";
    return false;
  }
  return true;
}

typedef struct replace_ctx {
  const ckv_remote *r;
  const char *tenant, *key;
  uint64_t decided_ms;
  bool superseded;
} replace_ctx;

/* A record replaces the store's unless that one opens and is newer (or as new).
 */
static bool replaces(void *vctx, const uint8_t *cur, size_t cur_len) {
  replace_ctx *c = vctx;
  ckv_store_fence f;
  ckv_fence_open(c->r, c->tenant, c->key, cur, cur_len, &f);
  c->superseded = f.state == CKV_FENCE_SET && f.decided_ms > c->decided_ms;
  return !c->superseded;
}

int ckv_fence_write(ckv_remote *r, const char *tenant, const char *id, uint64_t incarnation, uint64_t decided_ms,
                    const char *del_key, bool *ret_superseded, char *err, size_t errlen) {
  char key[CKV_REMOTE_KEY_MAX];
  *ret_superseded = false;
  if (ckv_remote_fence_key(tenant, id, key, sizeof key) < 0)
    return ckv_fail(err, errlen, CKV_ERR_INVALID, "no remote store key can be made for the fence of '%s'", id);
  const ckv_seal *seal = ckv_remote_seal(r);
  if (!seal) return ckv_fail(err, errlen, CKV_ERR_INVALID, "the remote store has no key to seal values with");
  uint8_t plain[PLAIN_BYTES];
  encode(plain, incarnation, decided_ms);
  uint8_t *sealed = NULL;
  size_t sealed_len = 0;
  if (ckv_seal_wrap(seal, tenant, key, plain, sizeof plain, &sealed, &sealed_len) < 0)
    return ckv_fail(err, errlen, -ENOMEM, "out of memory sealing a fence record");
  replace_ctx c = {.r = r, .tenant = tenant, .key = key, .decided_ms = decided_ms};
  int rc = ckv_remote_put_if(r, key, sealed, sealed_len, replaces, &c, del_key, err, errlen);
  free(sealed);
  if (rc == CKV_ERR_EXISTS) { /* a newer decision (another daemon's) stands:
                                 nothing of ours to write */
    *ret_superseded = true;
    err[0] = 0;
    return CKV_OK;
  }
  return rc;
}
