/* tokens.c - the per-token column store (see tokens.h). */
#include "daemon/tokens.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"

_Static_assert(CKV_TOKENS_BYTES_PER_TOKEN <= 32, "per-token metadata must stay within 32 bytes");

void ckv_tokens_init(ckv_tokens *t) { memset(t, 0, sizeof(*t)); }

void ckv_tokens_done(ckv_tokens *t) {
  free(t->state);
  free(t->role);
  free(t->tags);
  free(t->flags);
  free(t->block);
  free(t->slot);
  free(t->semantic);
  free(t->attn);
  free(t->last_attended);
  free(t->last_transition);
  free(t->token_id);
  memset(t, 0, sizeof(*t));
}

static int grow_col(void **col, size_t elem, size_t old_cap, size_t new_cap) {
  void *p = realloc(*col, elem * new_cap);
  if (!p) return -ENOMEM;
  memset((char *)p + elem * old_cap, 0, elem * (new_cap - old_cap));
  *col = p;
  return CKV_OK;
}

int ckv_tokens_reserve(ckv_tokens *t, size_t extra) {
  if (t->n + extra <= t->cap) return CKV_OK;
  size_t ncap = t->cap ? t->cap : 256;
  while (ncap < t->n + extra) ncap *= 2;
  /* Grow every column; a failure part-way leaves larger columns but an
   * unchanged cap, which is still consistent. */
  if (grow_col((void **)&t->state, 1, t->cap, ncap) || grow_col((void **)&t->role, 1, t->cap, ncap) ||
      grow_col((void **)&t->tags, 1, t->cap, ncap) || grow_col((void **)&t->flags, 1, t->cap, ncap) ||
      grow_col((void **)&t->block, 4, t->cap, ncap) || grow_col((void **)&t->slot, 2, t->cap, ncap) ||
      grow_col((void **)&t->semantic, 2, t->cap, ncap) ||
      grow_col((void **)&t->attn, 2 * CKV_ATTN_HISTORY, t->cap, ncap) ||
      grow_col((void **)&t->last_attended, 4, t->cap, ncap) ||
      grow_col((void **)&t->last_transition, 4, t->cap, ncap) || grow_col((void **)&t->token_id, 4, t->cap, ncap))
    return -ENOMEM;
  t->cap = ncap;
  return CKV_OK;
}

size_t ckv_tokens_push(ckv_tokens *t, uint8_t role, uint8_t tags, float semantic, uint32_t token_id,
                       uint32_t block, uint16_t slot) {
  size_t p = t->n++;
  t->state[p] = CKV_STATE_DRAFT;
  t->role[p] = role;
  t->tags[p] = tags;
  t->flags[p] = 0;
  t->block[p] = block;
  t->slot[p] = slot;
  t->semantic[p] = ckv_q16_from_unit(semantic);
  memset(&t->attn[p * CKV_ATTN_HISTORY], 0, 2 * CKV_ATTN_HISTORY);
  t->last_attended[p] = 0;
  t->last_transition[p] = 0;
  t->token_id[p] = token_id;
  return p;
}

void ckv_tokens_record_round(ckv_tokens *t, uint32_t round, size_t first, const float *attn, size_t n,
                             float floor) {
  const size_t ring = round % CKV_ATTN_HISTORY;
  const size_t end = first + n < t->n ? first + n : t->n;
  for (size_t p = 0; p < t->n; p++) {
    float a = (p >= first && p < end) ? attn[p - first] : 0.f;
    if (!(a >= 0.f) || isinf(a)) a = 0.f; /* NaN/negative/inf from a buggy worker count as nothing */
    t->attn[p * CKV_ATTN_HISTORY + ring] = ckv_half_from_float(a);
    if (a > floor) t->last_attended[p] = round;
  }
}

float ckv_tokens_attn_mean(const ckv_tokens *t, size_t pos) {
  float s = 0.f;
  for (size_t i = 0; i < CKV_ATTN_HISTORY; i++) s += ckv_half_to_float(t->attn[pos * CKV_ATTN_HISTORY + i]);
  return s / (float)CKV_ATTN_HISTORY;
}

uint16_t ckv_half_from_float(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* may carry into the exponent: correct */
  return (uint16_t)(sign | h);
}

float ckv_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
  if (exp == 0) {
    if (!mant) {
      x = sign;
    } else {
      exp = 113; /* 127 - 15 + 1 */
      while (!(mant & 0x400u)) {
        mant <<= 1;
        exp--;
      }
      x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}
