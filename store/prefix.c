/* prefix.c - shared prefix blocks: keys, the tenant's index, publish,
 * attach, fork and the holders' count (see prefix.h). */
#include "store/prefix.h"
#include "store/shared.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/quant.h"
#include "lifecycle/tokens.h"
#include "store/blockmem.h"
#include "store/session.h"
#include "store/tenant.h"

/* Bumped whenever what a key covers, or the draft layout, changes: keys of
 * another version never meet (they are not persisted, so this guards a
 * mixed build only). */
#define PREFIX_KEY_VERSION 1u
/* ---- keys ---- */

static ckv_prefix *registry(ckv_tenant *t) { return ckv_shared_registry(t); }

static void put_str(XXH3_state_t *st, const char *v) {
  uint32_t n = (uint32_t)strlen(v);
  XXH3_128bits_update(st, &n, sizeof n);
  XXH3_128bits_update(st, v, n);
}

/* The root: everything that decides what a draft block's bytes are, besides
 * the tokens. */
static ckv_pkey root_of(const ckv_srv_session *s) {
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  const uint32_t head[] = {PREFIX_KEY_VERSION,
                           s->geom.n_layers,
                           s->geom.n_kv_heads,
                           s->geom.head_dim,
                           s->geom.dtype,
                           s->draft_tokens,
                           (uint32_t)ckv_block_payload_offset(s->draft_tokens),
                           (uint32_t)sizeof(ckv_block_header),
                           CKV_ROT_SEED};
  XXH3_128bits_update(&st, head, sizeof head);
  put_str(&st, "tenant");
  put_str(&st, s->tenant->name);
  put_str(&st, s->model_id);
  put_str(&st, s->model_revision);
  XXH128_hash_t h = XXH3_128bits_digest(&st);
  return (ckv_pkey){h.low64, h.high64};
}

/* Key of the block after `prev` holding ids[0..d): the one rule workers
 * use too (shm/prefix_index.h). */
static ckv_pkey link_key(ckv_pkey prev, const uint32_t *ids, uint32_t d) {
  _Static_assert(CKV_MAX_BLOCK_TOKENS <= CKV_PINDEX_MAX_KEY_TOKENS, "a draft block's key covers it whole");
  _Static_assert(CKV_SESSION_MODEL_MAX == CKV_PINDEX_NAME_MAX, "the index holds every model name");
  return ckv_pkey_link(prev, ids, d);
}

static ckv_prefix_chain *chain_of(ckv_srv_session *s) {
  if (!s->chain)
    s->chain = calloc(1, sizeof(*s->chain));
  ckv_prefix_chain *ch = s->chain;
  if (ch && !ch->root_set) { /* lazily: the model names are set after the
                                session is made */
    ch->root = root_of(s);
    ch->root_set = true;
  }
  return ch;
}

static void chain_break(ckv_prefix_chain *ch) {
  ch->broken = true;
  free(ch->ids);
  ch->ids = NULL;
  ch->n_ids = ch->cap_ids = 0;
}

static int chain_add_ids(ckv_prefix_chain *ch, const uint32_t *ids, size_t n,
                         uint32_t d) {
  if (ch->n_ids + n > ch->cap_ids) {
    size_t ncap = ch->cap_ids ? ch->cap_ids : 256;
    while (ncap < ch->n_ids + n)
      ncap *= 2;
    uint32_t *ni = realloc(ch->ids, ncap * sizeof(*ni));
    if (!ni)
      return -ENOMEM;
    ch->ids = ni;
    ch->cap_ids = ncap;
  }
  memcpy(ch->ids + ch->n_ids, ids, n * sizeof(*ids));
  ch->n_ids += n;
  size_t want = ch->n_ids / d;
  if (want > ch->cap_keys) {
    size_t ncap = ch->cap_keys ? ch->cap_keys : 16;
    while (ncap < want)
      ncap *= 2;
    ckv_pkey *nk = realloc(ch->keys, ncap * sizeof(*nk));
    if (!nk)
      return -ENOMEM;
    ch->keys = nk;
    ch->cap_keys = ncap;
  }
  for (; ch->n_keys < want; ch->n_keys++) {
    ckv_pkey prev = ch->n_keys ? ch->keys[ch->n_keys - 1] : ch->root;
    ch->keys[ch->n_keys] = link_key(prev, ch->ids + ch->n_keys * d, d);
  }
  return CKV_OK;
}

void ckv_prefix_note_append(ckv_srv_session *s, uint64_t first, uint32_t count,
                            const uint32_t *ids) {
  ckv_prefix_chain *ch = chain_of(s);
  if (!ch || ch->broken)
    return;
  /* Only a chain from position 0 holds keys (a restored session has none). */
  if (!ids || first != ch->n_ids ||
      chain_add_ids(ch, ids, count, s->draft_tokens) < 0)
    chain_break(ch);
}

/* ---- publish ---- */

/* Block k of s, when it is whole: full, every slot holding its own position
 * in order, in draft format, nothing moving.  Its table index, or
 * CKV_NO_BLOCK. */
static uint32_t whole_block(const ckv_srv_session *s, size_t k) {
  const ckv_tokens *t = &s->tokens;
  const uint32_t d = s->draft_tokens;
  size_t first = k * d;
  if (first + d > t->n)
    return CKV_NO_BLOCK;
  uint32_t idx = t->block[first];
  if (idx == CKV_NO_BLOCK || idx >= s->n_blocks)
    return CKV_NO_BLOCK;
  const ckv_sblock *b = &s->blocks[idx];
  if (b->format != CKV_FORMAT_DRAFT || b->capacity != d || b->used != d ||
      b->refs != d)
    return CKV_NO_BLOCK;
  for (uint32_t i = 0; i < d; i++) {
    size_t p = first + i;
    if (t->block[p] != idx || t->slot[p] != i ||
        (t->flags[p] & CKV_TOKEN_PENDING) || t->state[p] == CKV_STATE_RECYCLED)
      return CKV_NO_BLOCK;
  }
  return idx;
}

/* Whether the parent's tokens [k*D, (k+1)*D) lie in consecutive slots of
 * one shared block (held by another session too, or compressed once:
 * shared_moves.h): a fork links that block.  A compression of it in flight
 * does not matter (its tokens move only in the tables of sessions whose
 * states all agree, and a new holder's do not yet). */
static bool compressed_shared(const ckv_srv_session *s, size_t k) {
  const ckv_tokens *t = &s->tokens;
  const uint32_t d = s->draft_tokens;
  size_t first = k * d;
  if (first + d > t->n)
    return false;
  uint32_t idx = t->block[first];
  if (idx == CKV_NO_BLOCK || idx >= s->n_blocks)
    return false;
  const ckv_pblock *pb = s->blocks[idx].shared;
  if (!pb || (pb->format == CKV_FORMAT_DRAFT && pb->holders < 2 && !pb->swapping))
    return false;
  for (uint32_t i = 0; i < d; i++) {
    size_t p = first + i;
    if (t->block[p] != idx || t->slot[p] != t->slot[first] + i)
      return false;
  }
  return true;
}

static void note_root(ckv_prefix *p, const ckv_srv_session *s, ckv_pkey root) {
  ckv_prefix_root pr = {.root = root, .block_tokens = s->draft_tokens};
  memcpy(pr.model_id, s->model_id, sizeof pr.model_id);
  memcpy(pr.model_revision, s->model_revision, sizeof pr.model_revision);
  ckv_shared_note_root(p, &pr);
}

ckv_pblock *ckv_prefix_share_entry(ckv_srv_session *s, uint32_t idx,
                                   const ckv_pkey *key) {
  ckv_prefix *p = registry(s->tenant);
  if (!p)
    return NULL;
  ckv_sblock *b = &s->blocks[idx];
  const uint32_t d = b->capacity;
  size_t head = ckv_block_payload_offset(d);
  ckv_pblock *pb = calloc(1, sizeof(*pb));
  if (!pb || !(pb->meta = malloc(head)) || !(pb->roles = calloc(d, 1)) ||
      !(pb->tags = calloc(d, 1)) ||
      !(pb->semantic = calloc(d, sizeof(*pb->semantic)))) {
    ckv_pblock_free(pb);
    return NULL;
  }
  memcpy(pb->meta, b->meta, head);
  /* the tokens, by slot: what a session linking the block starts them with */
  const uint32_t *positions = ckv_block_positions_const(b->meta);
  for (uint32_t i = 0; i < d; i++) {
    uint32_t pos = positions[i];
    if (!ckv_block_slot_valid(b->meta, i) || pos >= s->tokens.n)
      continue;
    pb->roles[i] = s->tokens.role[pos];
    pb->tags[i] = s->tokens.tags[pos];
    pb->semantic[i] = s->tokens.semantic[pos];
  }
  pb->offset = b->offset;
  pb->bytes = b->bytes;
  pb->id = b->id;
  pb->capacity = (uint16_t)d;
  pb->format = b->format;
  if (ckv_shared_add(p, pb) < 0) {
    ckv_pblock_free(pb);
    return NULL;
  }
  if (ckv_shared_user_add(pb, s, idx) < 0) {
    ckv_shared_forget(p, pb);
    return NULL;
  }
  if (key)
    (void)ckv_shared_index(
        p, pb,
        *key); /* another block with these bytes is indexed: this one is not */
  pb->holders = 1;
  b->shared = pb;
  return pb;
}

size_t ckv_prefix_publish(ckv_srv_session *s) {
  ckv_prefix_chain *ch = s->chain;
  if (!ch || !ch->n_keys || s->quarantined)
    return 0;
  ckv_prefix *p = registry(s->tenant);
  if (!p)
    return 0;
  const uint32_t d = s->draft_tokens;
  size_t published = 0;
  for (; ch->next_publish < ch->n_keys &&
         (ch->next_publish + 1) * d <= s->reported_tokens;
       ch->next_publish++) {
    size_t k = ch->next_publish;
    uint32_t idx = whole_block(s, k);
    if (idx == CKV_NO_BLOCK)
      continue;
    ckv_sblock *b = &s->blocks[idx];
    if (b->shared || ckv_shared_by_key(p, ch->keys[k]))
      continue; /* linked already, or the same bytes are indexed */
    /* The header region must be in the arena before another session's view
     * can name the block: a linking session never writes it. */
    if (b->meta_state != CKV_META_CLEAN && ckv_srv_session_flush_meta(s) < 0)
      break;
    ckv_pblock *pb = ckv_prefix_share_entry(s, idx, &ch->keys[k]);
    if (!pb)
      break;
    if ((k + 1) * d <= s->declared_prefix_tokens && s->params.share_grace_rounds)
      pb->grace_round = s->last_round + s->params.share_grace_rounds;
    published++;
  }
  if (published)
    note_root(p, s, ch->root);
  return published;
}

/* ---- attach, lookup, fork ---- */

/* The logical state a linked token starts in: the one its block's format
 * stores (a compressed shared block holds staged or committed tokens). */
static uint8_t state_of_format(uint32_t format) {
  return format == CKV_FORMAT_DRAFT    ? CKV_STATE_DRAFT
         : format == CKV_FORMAT_STAGED ? CKV_STATE_STAGED
                                       : CKV_STATE_COMMITTED;
}

/* Appends the tokens of slots [first, first+count) of pb (consecutive
 * positions: a draft block's tokens, or sub-blocks of a compressed one) at
 * s's next positions, which are theirs; pb enters s's table when *idx is
 * CKV_NO_BLOCK (then set).  CKV_OK or -ENOMEM. */
static int link_tokens(ckv_srv_session *s, ckv_pblock *pb, uint32_t first, uint32_t count, uint32_t *idx) {
  int r = ckv_tokens_reserve(&s->tokens, count);
  if (r < 0)
    return r;
  if (*idx == CKV_NO_BLOCK) {
    if ((r = ckv_srv_session_link_block(s, pb, CKV_NO_BLOCK, idx)) < 0)
      return r;
    s->blocks[*idx].refs = 0;
  }
  const uint8_t st = state_of_format(pb->format);
  for (uint32_t slot = first; slot < first + count; slot++) {
    size_t pos = ckv_tokens_push(&s->tokens, pb->roles ? pb->roles[slot] : 0,
                                 pb->tags ? pb->tags[slot] : 0, -1.f,
                                 (uint32_t)s->last_round, *idx, (uint16_t)slot);
    s->tokens.semantic[pos] =
        pb->semantic ? pb->semantic[slot] : ckv_q16_from_unit(0.5f);
    s->tokens.flags[pos] &= (uint8_t)~CKV_TOKEN_SEM_GIVEN;
    s->tokens.state[pos] = st;
  }
  s->blocks[*idx].refs = (uint16_t)(s->blocks[*idx].refs + count);
  s->count_by_state[st] += count;
  return CKV_OK;
}

/* Leading draft blocks of ids[0..n) indexed under `root`: each one's shared
 * block into out[] and its sub-block into sub[] when out is not NULL (room
 * for n / d).  Returns how many. */
static size_t match(const ckv_prefix *p, ckv_pkey root, uint32_t d,
                    const uint32_t *ids, size_t n, ckv_pblock **out,
                    uint32_t *sub) {
  size_t k = 0;
  ckv_pblock *last = NULL;
  int last_sub = -1;
  for (ckv_pkey prev = root; (k + 1) * d <= n; k++) {
    ckv_pkey key = link_key(prev, ids + k * d, d);
    ckv_pblock *pb = ckv_shared_by_key(p, key);
    if (!pb)
      break;
    int j = ckv_shared_sub_of(pb, key);
    uint32_t bd = pb->n_subkeys ? pb->sub_tokens : pb->capacity;
    /* a compressed block is read in slot order: its next sub-block, or the first of another */
    if (j < 0 || bd != d || (pb == last ? j != last_sub + 1 : j != 0))
      break;
    if (out) {
      out[k] = pb;
      sub[k] = (uint32_t)j;
    }
    last = pb;
    last_sub = j;
    prev = key;
  }
  return k;
}

int ckv_prefix_attach(ckv_srv_session *s, const uint32_t *ids, size_t n,
                      size_t *ret_matched) {
  *ret_matched = 0;
  ckv_prefix *p = registry(s->tenant);
  ckv_prefix_chain *ch = chain_of(s);
  if (!p || !ch)
    return -ENOMEM;
  if (s->tokens.n)
    return CKV_ERR_STATE;
  const uint32_t d = s->draft_tokens;
  ckv_pblock **hit = malloc((n / d + 1) * sizeof(*hit));
  uint32_t *sub = malloc((n / d + 1) * sizeof(*sub));
  if (!hit || !sub) {
    free(hit);
    free(sub);
    return -ENOMEM;
  }
  size_t k = match(p, ch->root, d, ids, n, hit, sub);
  ckv_shared_figures(p)->lookup_tokens += n;
  int r = CKV_OK;
  size_t linked = 0;
  uint32_t idx = CKV_NO_BLOCK;
  for (; linked < k; linked++) {
    if (linked && hit[linked] != hit[linked - 1])
      idx = CKV_NO_BLOCK;
    if ((r = link_tokens(s, hit[linked], sub[linked] * d, d, &idx)) != CKV_OK)
      break;
  }
  free(hit);
  free(sub);
  if (linked) {
    ckv_prefix_note_append(s, 0, (uint32_t)(linked * d), ids);
    ch->next_publish = linked; /* those are shared already */
    s->reported_tokens = linked * d;
  }
  ckv_shared_figures(p)->hit_tokens += linked * d;
  *ret_matched = linked * d;
  return linked ? CKV_OK : r;
}

size_t ckv_prefix_lookup(ckv_tenant *t, const char *model_id,
                         const char *model_revision, const uint32_t *ids,
                         size_t n) {
  ckv_prefix *p = registry(t);
  if (!p)
    return 0;
  size_t best = 0;
  const ckv_prefix_root *roots;
  size_t n_roots = ckv_shared_roots(p, &roots);
  for (size_t i = 0; i < n_roots; i++) {
    const ckv_prefix_root *r = &roots[i];
    if (strcmp(r->model_id, model_id) != 0 ||
        strcmp(r->model_revision, model_revision) != 0)
      continue;
    size_t m =
        match(p, r->root, r->block_tokens, ids, n, NULL, NULL) * r->block_tokens;
    if (m > best)
      best = m;
  }
  ckv_shared_figures(p)->lookup_tokens += n;
  ckv_shared_figures(p)->hit_tokens += best;
  return best;
}

void ckv_prefix_count_lookups(ckv_tenant *t, uint64_t asked, uint64_t hit) {
  ckv_prefix *p = registry(t);
  if (!p)
    return;
  ckv_shared_figures(p)->lookup_tokens += asked;
  ckv_shared_figures(p)->hit_tokens += hit;
}

static int why_fail(char *why, size_t len, int code, const char *fmt,
                    unsigned long long a) {
  if (why && len)
    snprintf(why, len, fmt, a);
  return code;
}

int ckv_prefix_fork(ckv_srv_session *parent, ckv_srv_session *child, size_t at,
                    size_t *ret_shared, char *why, size_t whylen) {
  *ret_shared = 0;
  const ckv_tokens *pt = &parent->tokens;
  const uint32_t d = parent->draft_tokens;
  if (child->tokens.n || child->draft_tokens != d)
    return CKV_ERR_STATE;
  if (at > parent->reported_tokens)
    return why_fail(
        why, whylen, CKV_ERR_STATE,
        "at_position %llu is past the tokens the parent reported a round over",
        (unsigned long long)at);
  /* Check every token first: a refusal changes nothing. */
  size_t whole = at / d;
  for (size_t k = 0; k < whole; k++) {
    uint32_t idx = whole_block(parent, k);
    if (idx == CKV_NO_BLOCK && !compressed_shared(parent, k))
      return why_fail(why, whylen, CKV_ERR_STATE,
                      "tokens of block %llu were compressed, recycled or are "
                      "moving (forks share whole draft blocks and shared "
                      "blocks compressed once)",
                      (unsigned long long)k);
  }
  for (size_t pos = whole * d; pos < at; pos++) {
    uint32_t idx = pt->block[pos];
    if (idx == CKV_NO_BLOCK || parent->blocks[idx].format != CKV_FORMAT_DRAFT ||
        (pt->flags[pos] & CKV_TOKEN_PENDING) ||
        pt->state[pos] == CKV_STATE_RECYCLED)
      return why_fail(why, whylen, CKV_ERR_STATE,
                      "token %llu was compressed, recycled or is moving",
                      (unsigned long long)pos);
  }
  const ckv_tenant *t = parent->tenant;
  if (at % d && t->mem != &ckv_blockmem_host)
    return why_fail(why, whylen, CKV_ERR_UNSUPPORTED,
                    "at_position %llu is not a multiple of the draft block "
                    "size, and a device arena's tail cannot be "
                    "copied yet",
                    (unsigned long long)at);
  ckv_prefix_chain *pch = chain_of(parent), *cch = chain_of(child);
  if (!pch || !cch || !registry(parent->tenant))
    return -ENOMEM;
  int r = CKV_OK;
  uint32_t cidx = CKV_NO_BLOCK;
  const ckv_pblock *last = NULL;
  for (size_t k = 0; k < whole && r == CKV_OK; k++) {
    if (compressed_shared(parent, k)) { /* the child links the same block, these slots */
      uint32_t pidx = pt->block[k * d];
      ckv_pblock *cpb = parent->blocks[pidx].shared;
      if (cpb != last)
        cidx = CKV_NO_BLOCK;
      last = cpb;
      r = link_tokens(child, cpb, pt->slot[k * d], d, &cidx);
      continue;
    }
    last = NULL;
    uint32_t idx = whole_block(parent, k);
    ckv_pblock *pb = parent->blocks[idx].shared;
    if (!pb) {
      const ckv_pkey *key =
          !pch->broken && k < pch->n_keys ? &pch->keys[k] : NULL;
      ckv_sblock *b = &parent->blocks[idx];
      if (b->meta_state != CKV_META_CLEAN &&
          (r = ckv_srv_session_flush_meta(parent)) < 0)
        break;
      if (!(pb = ckv_prefix_share_entry(parent, idx, key)))
        r = -ENOMEM;
    }
    cidx = CKV_NO_BLOCK;
    if (r == CKV_OK)
      r = link_tokens(child, pb, 0, d, &cidx);
  }
  if (r == CKV_OK && at % d) { /* the tail: a private copy */
    uint32_t m = (uint32_t)(at - whole * d);
    size_t first = whole * d;
    uint8_t *roles = malloc(m), *tags = malloc(m);
    float *sem = malloc(m * sizeof(*sem));
    ckv_slot_run runs[4];
    size_t n_runs = 0;
    uint64_t pos0 = 0;
    if (!roles || !tags || !sem)
      r = -ENOMEM;
    for (uint32_t i = 0; r == CKV_OK && i < m; i++) {
      roles[i] = pt->role[first + i];
      tags[i] = pt->tags[first + i];
      sem[i] = ckv_q16_to_unit(pt->semantic[first + i]);
    }
    if (r == CKV_OK)
      r = ckv_srv_session_append(child, m, roles, tags, sem, NULL, runs,
                                 &n_runs, &pos0);
    free(roles);
    free(tags);
    free(sem);
    if (r == CKV_OK && (n_runs != 1 || pos0 != first))
      r = CKV_ERR_INTERNAL; /* m < d: one fresh block */
    if (r == CKV_OK) {
      child->semantic_given -= m; /* append counted them all as the worker's:
                                     the parent's flags say */
      for (uint32_t i = 0; i < m; i++) {
        child->tokens.flags[first + i] =
            pt->flags[first + i] & CKV_TOKEN_SEM_GIVEN;
        child->semantic_given +=
            (pt->flags[first + i] & CKV_TOKEN_SEM_GIVEN) != 0;
      }
      const ckv_geometry *g = &parent->geom;
      const size_t tok = ckv_draft_token_elems(g) * 2u;
      const uint32_t dst = runs[0].block;
      /* the child's block is fresh: its header shadow goes out with the payload
       */
      for (uint32_t layer = 0; layer < g->n_layers && r == CKV_OK; layer++)
        for (uint32_t kv = 0; kv < 2 && r == CKV_OK; kv++)
          for (uint32_t i = 0; i < m && r == CKV_OK; i++) {
            uint32_t sblk = pt->block[first + i], sslot = pt->slot[first + i];
            const uint8_t *src =
                (const uint8_t *)ckv_srv_session_block_ptr(parent, sblk) +
                ckv_draft_kv_offset(g, parent->blocks[sblk].capacity, layer, kv,
                                    sslot);
            ckv_meta_write w = {
                .offset =
                    child->blocks[dst].offset +
                    ckv_draft_kv_offset(g, child->blocks[dst].capacity, layer,
                                        kv, runs[0].first_slot + i),
                .src = src,
                .bytes = tok};
            r = t->mem->write(ckv_tenant_ptr(t, 0), &w, 1);
          }
    }
  }
  if (r == CKV_OK) {
    if (!pch->broken && pch->n_ids >= at)
      ckv_prefix_note_append(child, 0, (uint32_t)at, pch->ids);
    else
      chain_break(cch);
    cch->next_publish = whole;
    child->reported_tokens = at;
    *ret_shared = whole * d;
  }
  return r;
}

/* ---- the lifecycle's question ---- */

/* A block its publisher alone holds, waiting for a second holder. */
static bool in_grace(const ckv_srv_session *s, const ckv_pblock *pb) {
  return pb->holders == 1 && pb->indexed && s->last_round < pb->grace_round;
}

bool ckv_prefix_is_frozen(const ckv_srv_session *s, uint32_t idx) {
  if (idx == CKV_NO_BLOCK || idx >= s->n_blocks)
    return false;
  const ckv_pblock *pb = s->blocks[idx].shared;
  return pb && (pb->holders > 1 || in_grace(s, pb));
}

bool ckv_prefix_frozen(ckv_srv_session *s, uint32_t idx) {
  if (idx == CKV_NO_BLOCK || idx >= s->n_blocks)
    return false;
  ckv_sblock *b = &s->blocks[idx];
  ckv_pblock *pb = b->shared;
  if (!pb)
    return false;
  if (pb->holders > 1 || pb->swapping || in_grace(s, pb)) /* a compression in flight names it */
    return true;
  /* Ours alone (no retired entry of ours holds it either): private again. */
  b->shared = NULL;
  ckv_shared_forget(s->tenant->prefix, pb);
  return false;
}

/* ---- warm restart ---- */

int ckv_prefix_note_claim(ckv_srv_session *s, uint32_t idx) {
  ckv_sblock *b = &s->blocks[idx];
  if (b->shared)
    return CKV_OK;
  ckv_prefix *p = registry(s->tenant);
  if (!p)
    return -ENOMEM;
  ckv_pblock *pb = calloc(1, sizeof(*pb));
  size_t head = ckv_block_payload_offset(b->capacity);
  if (!pb || !(pb->meta = malloc(head))) {
    free(pb);
    return -ENOMEM;
  }
  memcpy(pb->meta, b->meta, head);
  pb->offset = b->offset;
  pb->bytes = b->bytes;
  pb->id = b->id;
  pb->capacity = b->capacity;
  pb->format = b->format;
  if (ckv_shared_add(p, pb) < 0) {
    ckv_pblock_free(pb);
    return -ENOMEM;
  }
  if (ckv_shared_user_add(pb, s, idx) < 0) {
    ckv_shared_forget(p, pb);
    return -ENOMEM;
  }
  pb->holders = 1;
  b->shared = pb;
  return CKV_OK;
}

/* ---- figures ---- */

uint64_t ckv_prefix_session_shared_tokens(const ckv_srv_session *s) {
  uint64_t n = 0;
  for (size_t i = 0; i < s->n_blocks; i++)
    if (s->blocks[i].format != CKV_BLOCK_UNUSED &&
        ckv_prefix_is_frozen(s, (uint32_t)i))
      n += s->blocks[i].refs;
  return n;
}

uint64_t ckv_prefix_session_shared_bytes(const ckv_srv_session *s) {
  uint64_t n = 0;
  for (size_t i = 0; i < s->n_blocks; i++)
    if (s->blocks[i].format != CKV_BLOCK_UNUSED &&
        ckv_prefix_is_frozen(s, (uint32_t)i))
      n += s->blocks[i].bytes;
  return n;
}
