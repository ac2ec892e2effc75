/* shm/slab.c - the block allocator (see shm/slab.h).
 *
 * Two levels.  The chunk pool keeps free runs of chunks ("spans") in
 * segregated lists: one list per exact length below EXACT_LISTS, then one per
 * power of two.  A free span records its length in boundary tags at its first
 * and last chunk, so a span being returned merges with free neighbours in
 * O(1).  Above it, each class keeps a list of its slabs that have free blocks;
 * a slab keeps a stack of free block indices (O(1) alloc and free) and a
 * bitmap of live blocks (O(1) double-free detection).  owner[] maps every
 * chunk to the slab using it, so freeing an offset finds its slab in O(1).
 *
 * Free spans are warm or cold, never mixed: a cold span was discarded (reads
 * zero, costs no memory), a warm one was kept backed (up to cfg.warm_bytes:
 * no hole punched now, no page fault and kernel zeroing when it is used
 * again) or could not be discarded.  New slabs take warm spans first.  When
 * no span of either kind is long enough, every warm span is discarded and
 * merged with its cold neighbours before giving up, so keeping chunks warm
 * never makes an allocation fail. */
#include "shm/slab.h"

#include "commitkv/status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define EXACT_LISTS 64u               /* spans of 1..63 chunks: one list per length */
#define N_LISTS (EXACT_LISTS + 32u)   /* then one list per power of two up to 2^31 */
#define MAX_UNITS_PER_CHUNK (1u << 24) /* chunk_bytes / block_align */

typedef struct slab slab;
struct slab {
  slab *prev, *next;    /* in the class's list of slabs with free blocks */
  bool listed;          /* on that list */
  uint32_t cls;         /* owning class */
  uint32_t first_chunk; /* first chunk of the span */
  uint32_t n_chunks;    /* chunks of the span */
  uint32_t n_blocks;    /* blocks that fit */
  uint32_t n_used;      /* allocated blocks */
  uint32_t hwm;         /* blocks [0, hwm) were handed out at least once */
  bool warm;            /* made of warm chunks: every block may hold old bytes */
  uint64_t offset;      /* arena offset of block 0 */
  uint32_t *stack;      /* free block indices: stack[0 .. n_blocks-n_used) */
  uint64_t bits[];      /* live-block bitmap, then the stack */
};

typedef struct slab_class {
  uint64_t block_bytes, tag, stride;
  uint32_t chunks_per_slab, blocks_per_slab;
  slab *head, *tail; /* slabs with free blocks; allocation takes the head */
  uint64_t blocks_used;
  uint64_t slabs;
  uint32_t empty; /* empty slabs kept */
} slab_class;

struct ckv_slab {
  ckv_slab_config cfg;
  uint32_t n_chunks;
  slab **owner;    /* per chunk: the slab using it, NULL when free */
  uint32_t *flen;  /* free span length, valid at a free span's first and last chunk */
  uint32_t *fnext; /* free list links, valid at a free span's first chunk */
  uint32_t *fprev;
  uint8_t *fwarm;  /* 1 for a warm free span, valid at its first and last chunk */
  uint32_t lists[2][N_LISTS]; /* [0] cold spans, [1] warm spans */
  uint64_t chunks_warm;       /* chunks in warm free spans */
  uint64_t warm_max;          /* cfg.warm_bytes in chunks */
  uint32_t n_classes;
  slab_class classes[CKV_SLAB_MAX_CLASSES];
  uint64_t chunks_free;
  uint64_t blocks_used;
  uint64_t bytes_used;
  uint64_t slabs;
  uint64_t discard_errors;
};

static uint32_t floor_log2(uint64_t v) { return 63u - (uint32_t)__builtin_clzll(v); }

static uint32_t list_index(uint32_t len) {
  return len < EXACT_LISTS ? len : EXACT_LISTS + floor_log2(len) - floor_log2(EXACT_LISTS);
}

/* ---- chunk pool ---- */

static void span_insert(ckv_slab *s, uint32_t start, uint32_t len, uint8_t warm) {
  uint32_t li = list_index(len);
  uint32_t *list = &s->lists[warm][li];
  s->flen[start] = len;
  s->flen[start + len - 1] = len;
  s->fwarm[start] = s->fwarm[start + len - 1] = warm;
  s->fprev[start] = NIL;
  s->fnext[start] = *list;
  if (*list != NIL) s->fprev[*list] = start;
  *list = start;
  if (warm) s->chunks_warm += len;
}

static void span_remove(ckv_slab *s, uint32_t start) {
  uint32_t li = list_index(s->flen[start]);
  uint8_t warm = s->fwarm[start];
  uint32_t p = s->fprev[start], n = s->fnext[start];
  if (p != NIL)
    s->fnext[p] = n;
  else
    s->lists[warm][li] = n;
  if (n != NIL) s->fprev[n] = p;
  if (warm) s->chunks_warm -= s->flen[start];
}

/* First fit of k chunks among the spans of one kind; NIL when none. */
static uint32_t span_find(const ckv_slab *s, uint8_t warm, uint32_t k) {
  const uint32_t *lists = s->lists[warm];
  uint32_t found = NIL;
  uint32_t li = list_index(k);
  if (k < EXACT_LISTS) {
    for (uint32_t i = li; i < N_LISTS && found == NIL; i++) found = lists[i];
  } else {
    /* The list of k's power of two mixes shorter and longer spans: first fit
     * there, then any span of a higher list (all long enough). */
    for (uint32_t c = lists[li]; c != NIL && found == NIL; c = s->fnext[c])
      if (s->flen[c] >= k) found = c;
    for (uint32_t i = li + 1; i < N_LISTS && found == NIL; i++) found = lists[i];
  }
  return found;
}

/* Takes a free run of k chunks, warm ones first; returns its first chunk or
 * NIL, and whether it is warm in *ret_warm. */
static uint32_t span_take(ckv_slab *s, uint32_t k, bool *ret_warm) {
  uint8_t warm = 1;
  uint32_t found = span_find(s, warm, k);
  if (found == NIL) found = span_find(s, warm = 0, k);
  if (found == NIL) return NIL;
  uint32_t len = s->flen[found];
  span_remove(s, found);
  if (len > k) span_insert(s, found + k, len - k, warm);
  s->chunks_free -= k;
  *ret_warm = warm;
  return found;
}

/* Returns chunks [start, start+k) (owner[] already cleared) as a span of
 * kind `warm` and merges it with free neighbours of the same kind, or with
 * any neighbour when `absorb` (the merged span is then warm: it may hold old
 * bytes). */
static void span_give(ckv_slab *s, uint32_t start, uint32_t k, uint8_t warm, bool absorb) {
  s->chunks_free += k;
  if (start > 0 && !s->owner[start - 1] && (s->fwarm[start - 1] == warm || (absorb && s->fwarm[start - 1] < 2))) {
    uint32_t left = start - s->flen[start - 1];
    span_remove(s, left);
    k += start - left;
    start = left;
  }
  if (start + k < s->n_chunks && !s->owner[start + k] &&
      (s->fwarm[start + k] == warm || (absorb && s->fwarm[start + k] < 2))) {
    uint32_t rlen = s->flen[start + k];
    span_remove(s, start + k);
    k += rlen;
  }
  span_insert(s, start, k, warm);
}

/* Discards chunks [start, start+k); true when they now read zero. */
static bool discard(ckv_slab *s, uint32_t start, uint32_t k) {
  if (!s->cfg.discard) return false; /* nothing gives the pages back: they keep their bytes */
  if (s->cfg.discard(s->cfg.discard_opaque, s->cfg.offset + (uint64_t)start * s->cfg.chunk_bytes,
                     (uint64_t)k * s->cfg.chunk_bytes) < 0) {
    s->discard_errors++;
    return false;
  }
  return true;
}

/* Discards every warm span (they merge with their cold neighbours): the
 * last resort before an allocation fails for want of a long enough run.
 * A span that cannot be discarded (no discard callback, or it failed) merges
 * with its neighbours anyway and the result is warm: a run of free chunks is
 * never unusable for being of two kinds.  Returns whether anything merged. */
static bool cool_all(ckv_slab *s) {
  uint32_t chain = NIL; /* the warm spans, detached, linked through fnext */
  for (uint32_t li = 0; li < N_LISTS; li++) {
    for (uint32_t c; (c = s->lists[1][li]) != NIL;) {
      span_remove(s, c);
      s->fwarm[c] = s->fwarm[c + s->flen[c] - 1] = 2; /* detached: no neighbour merges with it */
      s->fnext[c] = chain;
      chain = c;
    }
  }
  bool any = false;
  while (chain != NIL) {
    uint32_t c = chain, len = s->flen[c];
    chain = s->fnext[c];
    s->chunks_free -= len; /* span_give counts them again */
    bool cold = discard(s, c, len);
    span_give(s, c, len, cold ? 0 : 1, /* absorb= */ !cold);
    any = true;
  }
  return any;
}

/* ---- slabs ---- */

static void list_push(slab_class *c, slab *sl, bool front) {
  sl->listed = true;
  if (front) {
    sl->prev = NULL;
    sl->next = c->head;
    if (c->head)
      c->head->prev = sl;
    else
      c->tail = sl;
    c->head = sl;
  } else {
    sl->next = NULL;
    sl->prev = c->tail;
    if (c->tail)
      c->tail->next = sl;
    else
      c->head = sl;
    c->tail = sl;
  }
}

static void list_unlink(slab_class *c, slab *sl) {
  if (sl->prev)
    sl->prev->next = sl->next;
  else
    c->head = sl->next;
  if (sl->next)
    sl->next->prev = sl->prev;
  else
    c->tail = sl->prev;
  sl->prev = sl->next = NULL;
  sl->listed = false;
}

static void slab_destroy(ckv_slab *s, slab *sl);

/* Returns every kept empty slab to the pool; how many were returned. */
static uint32_t drop_empty_slabs(ckv_slab *s) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->n_classes; i++) {
    slab_class *c = &s->classes[i];
    slab *sl = c->head;
    while (c->empty > 0 && sl) {
      slab *next = sl->next;
      if (sl->n_used == 0) {
        c->empty--;
        slab_destroy(s, sl);
        n++;
      }
      sl = next;
    }
  }
  return n;
}

static int slab_create(ckv_slab *s, uint32_t cls, slab **ret) {
  slab_class *c = &s->classes[cls];
  size_t words = ((size_t)c->blocks_per_slab + 63) / 64;
  slab *sl = malloc(sizeof *sl + words * sizeof(uint64_t) + (size_t)c->blocks_per_slab * sizeof(uint32_t));
  if (!sl) return -ENOMEM;
  bool warm = false;
  uint32_t first = span_take(s, c->chunks_per_slab, &warm);
  if (first == NIL && drop_empty_slabs(s) > 0) first = span_take(s, c->chunks_per_slab, &warm);
  if (first == NIL && cool_all(s)) first = span_take(s, c->chunks_per_slab, &warm);
  if (first == NIL) {
    free(sl);
    return CKV_ERR_NOSPACE;
  }
  sl->listed = false;
  sl->prev = sl->next = NULL;
  sl->cls = cls;
  sl->first_chunk = first;
  sl->n_chunks = c->chunks_per_slab;
  sl->n_blocks = c->blocks_per_slab;
  sl->n_used = 0;
  sl->hwm = 0;
  sl->warm = warm;
  sl->offset = s->cfg.offset + (uint64_t)first * s->cfg.chunk_bytes;
  memset(sl->bits, 0, words * sizeof(uint64_t));
  sl->stack = (uint32_t *)(sl->bits + words);
  /* Pop order 0, 1, 2...: blocks fill the slab from its start. */
  for (uint32_t i = 0; i < sl->n_blocks; i++) sl->stack[i] = sl->n_blocks - 1 - i;
  for (uint32_t i = 0; i < sl->n_chunks; i++) s->owner[first + i] = sl;
  c->slabs++;
  s->slabs++;
  *ret = sl;
  return CKV_OK;
}

static void slab_destroy(ckv_slab *s, slab *sl) {
  slab_class *c = &s->classes[sl->cls];
  if (sl->listed) list_unlink(c, sl);
  for (uint32_t i = 0; i < sl->n_chunks; i++) s->owner[sl->first_chunk + i] = NULL;
  /* Kept warm while the budget lasts (no hole now, no fault later); else
   * given back to the OS.  A discard that fails leaves the bytes: warm. */
  bool keep = s->chunks_warm + sl->n_chunks <= s->warm_max;
  bool cold = !keep && discard(s, sl->first_chunk, sl->n_chunks);
  span_give(s, sl->first_chunk, sl->n_chunks, cold ? 0 : 1, /* absorb= */ false);
  c->slabs--;
  s->slabs--;
  free(sl);
}

/* ---- public ---- */

int ckv_slab_new(const ckv_slab_config *cfg, ckv_slab **ret) {
  if (!cfg || !ret) return CKV_ERR_INVALID;
  ckv_slab_config c = *cfg;
  if (!c.chunk_bytes) c.chunk_bytes = CKV_SLAB_CHUNK_DEFAULT;
  if (!c.block_align) c.block_align = CKV_SLAB_ALIGN_DEFAULT;
  if (!c.min_blocks) c.min_blocks = CKV_SLAB_MIN_BLOCKS_DEFAULT;
  if (c.block_align < 8 || (c.block_align & (c.block_align - 1)) != 0) return CKV_ERR_INVALID;
  if (c.chunk_bytes % c.block_align != 0 || c.offset % c.block_align != 0) return CKV_ERR_INVALID;
  if (c.offset > UINT64_MAX - c.bytes) return CKV_ERR_INVALID;
  if (c.chunk_bytes / c.block_align > MAX_UNITS_PER_CHUNK) return CKV_ERR_LIMIT;
  if (c.min_blocks > CKV_SLAB_MIN_BLOCKS_MAX) return CKV_ERR_LIMIT;
  uint64_t n = c.bytes / c.chunk_bytes;
  if (n == 0) return CKV_ERR_INVALID;
  if (n >= NIL) return CKV_ERR_LIMIT;

  ckv_slab *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->cfg = c;
  s->n_chunks = (uint32_t)n;
  s->owner = calloc(n, sizeof *s->owner);
  s->flen = malloc(n * sizeof *s->flen);
  s->fnext = malloc(n * sizeof *s->fnext);
  s->fprev = malloc(n * sizeof *s->fprev);
  s->fwarm = malloc(n);
  if (!s->owner || !s->flen || !s->fnext || !s->fprev || !s->fwarm) {
    ckv_slab_free(s);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < N_LISTS; i++) s->lists[0][i] = s->lists[1][i] = NIL;
  s->warm_max = c.warm_bytes / c.chunk_bytes;
  /* The range starts as the arena made it: zero, costing nothing (cold). */
  span_insert(s, 0, s->n_chunks, 0);
  s->chunks_free = n;
  *ret = s;
  return CKV_OK;
}

ckv_slab *ckv_slab_free(ckv_slab *s) {
  if (!s) return NULL;
  if (s->owner) {
    for (uint32_t i = 0; i < s->n_chunks;) {
      slab *sl = s->owner[i];
      if (!sl) {
        i++;
        continue;
      }
      i += sl->n_chunks; /* owner[] reaches a slab first at its first chunk */
      free(sl);
    }
  }
  free(s->owner);
  free(s->flen);
  free(s->fnext);
  free(s->fprev);
  free(s->fwarm);
  free(s);
  return NULL;
}

int ckv_slab_class(ckv_slab *s, uint64_t block_bytes, uint64_t tag, uint32_t *ret_class) {
  if (!s || !ret_class || block_bytes == 0) return CKV_ERR_INVALID;
  for (uint32_t i = 0; i < s->n_classes; i++) {
    if (s->classes[i].block_bytes == block_bytes && s->classes[i].tag == tag) {
      *ret_class = i;
      return CKV_OK;
    }
  }
  const uint64_t chunk = s->cfg.chunk_bytes, total = (uint64_t)s->n_chunks * chunk;
  if (block_bytes > total) return CKV_ERR_LIMIT;
  if (s->n_classes == CKV_SLAB_MAX_CLASSES) return CKV_ERR_LIMIT;
  const uint64_t align = s->cfg.block_align;
  const uint64_t stride = (block_bytes + align - 1) / align * align;
  if (stride > total) return CKV_ERR_LIMIT;

  /* Fewest chunks holding min_blocks blocks (fewer blocks only if the range
   * is that small), then the span length up to twice that which wastes the
   * smallest fraction of its bytes in the tail (ties: shorter). */
  uint64_t k0 = (stride > total / s->cfg.min_blocks) ? s->n_chunks
                                                           : (s->cfg.min_blocks * stride + chunk - 1) / chunk;
  if (k0 > s->n_chunks) k0 = s->n_chunks;
  uint64_t kmax = 2 * k0 < s->n_chunks ? 2 * k0 : s->n_chunks;
  uint64_t best_k = k0;
  double best_waste = 2.0;
  for (uint64_t k = k0; k <= kmax; k++) {
    uint64_t bytes = k * chunk;
    double waste = (double)(bytes % stride) / (double)bytes;
    if (waste < best_waste - 1e-12) {
      best_waste = waste;
      best_k = k;
    }
  }
  slab_class *c = &s->classes[s->n_classes];
  memset(c, 0, sizeof *c);
  c->block_bytes = block_bytes;
  c->tag = tag;
  c->stride = stride;
  c->chunks_per_slab = (uint32_t)best_k;
  c->blocks_per_slab = (uint32_t)(best_k * chunk / stride);
  *ret_class = s->n_classes++;
  return CKV_OK;
}

int ckv_slab_alloc(ckv_slab *s, uint32_t cls, uint64_t *ret_offset) {
  return ckv_slab_take(s, cls, ret_offset, NULL);
}

int ckv_slab_take(ckv_slab *s, uint32_t cls, uint64_t *ret_offset, bool *ret_reused) {
  if (!s || !ret_offset || cls >= s->n_classes) return CKV_ERR_INVALID;
  slab_class *c = &s->classes[cls];
  slab *sl = c->head;
  if (!sl) {
    int r = slab_create(s, cls, &sl);
    if (r < 0) return r;
    list_push(c, sl, /* front= */ true);
  } else if (sl->n_used == 0) {
    c->empty--; /* only kept empty slabs are listed with no block in use */
  }
  uint32_t idx = sl->stack[sl->n_blocks - sl->n_used - 1];
  /* Indices pop 0, 1, 2... the first time, so one below hwm was used before. */
  bool reused = sl->warm || idx < sl->hwm;
  if (idx >= sl->hwm) sl->hwm = idx + 1;
  sl->n_used++;
  sl->bits[idx / 64] |= UINT64_C(1) << (idx % 64);
  if (sl->n_used == sl->n_blocks) list_unlink(c, sl);
  c->blocks_used++;
  s->blocks_used++;
  s->bytes_used += c->stride;
  *ret_offset = sl->offset + (uint64_t)idx * c->stride;
  if (ret_reused) *ret_reused = reused;
  return CKV_OK;
}

/* The slab and block index of a live block at `offset`, or NULL. */
static slab *find_block(const ckv_slab *s, uint64_t offset, uint32_t *ret_idx) {
  if (offset < s->cfg.offset) return NULL;
  uint64_t rel = offset - s->cfg.offset;
  if (rel / s->cfg.chunk_bytes >= s->n_chunks) return NULL;
  slab *sl = s->owner[rel / s->cfg.chunk_bytes];
  if (!sl) return NULL;
  const slab_class *c = &s->classes[sl->cls];
  uint64_t in = offset - sl->offset;
  if (in % c->stride != 0 || in / c->stride >= sl->n_blocks) return NULL;
  uint32_t idx = (uint32_t)(in / c->stride);
  if (!(sl->bits[idx / 64] & (UINT64_C(1) << (idx % 64)))) return NULL;
  *ret_idx = idx;
  return sl;
}

int ckv_slab_dealloc(ckv_slab *s, uint64_t offset) {
  if (!s) return CKV_ERR_INVALID;
  uint32_t idx;
  slab *sl = find_block(s, offset, &idx);
  if (!sl) return CKV_ERR_INVALID;
  slab_class *c = &s->classes[sl->cls];
  sl->bits[idx / 64] &= ~(UINT64_C(1) << (idx % 64));
  sl->stack[sl->n_blocks - sl->n_used] = idx;
  sl->n_used--;
  c->blocks_used--;
  s->blocks_used--;
  s->bytes_used -= c->stride;
  /* A slab that was full rejoins at the tail: allocation prefers the slabs
   * at the head, so sparse ones get a chance to drain and be returned. */
  if (!sl->listed) list_push(c, sl, /* front= */ false);
  if (sl->n_used == 0) {
    if (c->empty < s->cfg.keep_empty) {
      c->empty++;
      list_unlink(c, sl);
      list_push(c, sl, /* front= */ false);
    } else {
      slab_destroy(s, sl);
    }
  }
  return CKV_OK;
}

int ckv_slab_lookup(const ckv_slab *s, uint64_t offset, uint32_t *ret_class) {
  if (!s) return CKV_ERR_INVALID;
  uint32_t idx;
  const slab *sl = find_block(s, offset, &idx);
  if (!sl) return CKV_ERR_INVALID;
  if (ret_class) *ret_class = sl->cls;
  return CKV_OK;
}

void ckv_slab_get_stats(const ckv_slab *s, ckv_slab_stats *ret) {
  ckv_slab_stats st = {
      .bytes_total = (uint64_t)s->n_chunks * s->cfg.chunk_bytes,
      .bytes_used = s->bytes_used,
      .bytes_reserved = ((uint64_t)s->n_chunks - s->chunks_free) * s->cfg.chunk_bytes,
      .chunks_total = s->n_chunks,
      .chunks_free = s->chunks_free,
      .bytes_warm = s->chunks_warm * s->cfg.chunk_bytes,
      .blocks_used = s->blocks_used,
      .slabs = s->slabs,
      .classes = s->n_classes,
      .discard_errors = s->discard_errors,
  };
  *ret = st;
}

int ckv_slab_get_class_stats(const ckv_slab *s, uint32_t cls, ckv_slab_class_stats *ret) {
  if (!s || !ret || cls >= s->n_classes) return CKV_ERR_INVALID;
  const slab_class *c = &s->classes[cls];
  ckv_slab_class_stats st = {
      .block_bytes = c->block_bytes,
      .tag = c->tag,
      .stride = c->stride,
      .chunks_per_slab = c->chunks_per_slab,
      .blocks_per_slab = c->blocks_per_slab,
      .blocks_used = c->blocks_used,
      .slabs = c->slabs,
  };
  *ret = st;
  return CKV_OK;
}

/* ---- rebuilding over kept memory ---- */

int ckv_slab_block_slab(const ckv_slab *s, uint64_t offset, uint64_t *ret_slab_offset) {
  if (!s || !ret_slab_offset) return CKV_ERR_INVALID;
  uint32_t idx;
  const slab *sl = find_block(s, offset, &idx);
  if (!sl) return CKV_ERR_INVALID;
  *ret_slab_offset = sl->offset;
  return CKV_OK;
}

/* Takes chunks [first, first+k) out of the free pool, whichever free spans
 * hold them; false (nothing changed) unless every one is free. */
static bool span_take_at(ckv_slab *s, uint32_t first, uint32_t k) {
  if (first >= s->n_chunks || k > s->n_chunks - first) return false;
  for (uint32_t i = first; i < first + k; i++)
    if (s->owner[i]) return false;
  /* The run of free chunks holding `first` starts a span (spans never hold
   * used chunks); hop span by span (flen is valid at a span's first chunk)
   * to the one holding each chunk. */
  uint32_t run = first;
  while (run > 0 && !s->owner[run - 1]) run--;
  uint32_t c = first, sp = run;
  while (c < first + k) {
    while (sp + s->flen[sp] <= c) sp += s->flen[sp];
    uint32_t len = s->flen[sp], end = sp + len;
    uint8_t warm = s->fwarm[sp];
    span_remove(s, sp);
    uint32_t stop = end < first + k ? end : first + k;
    if (sp < c) span_insert(s, sp, c - sp, warm);
    if (end > stop) span_insert(s, stop, end - stop, warm);
    s->chunks_free -= stop - c;
    c = sp = stop;
  }
  return true;
}

int ckv_slab_claim(ckv_slab *s, uint32_t cls, uint64_t slab_offset, uint64_t offset) {
  if (!s || cls >= s->n_classes || slab_offset < s->cfg.offset || offset < slab_offset) return CKV_ERR_INVALID;
  slab_class *c = &s->classes[cls];
  uint64_t rel = slab_offset - s->cfg.offset;
  if (rel % s->cfg.chunk_bytes != 0 || (offset - slab_offset) % c->stride != 0) return CKV_ERR_INVALID;
  uint64_t first = rel / s->cfg.chunk_bytes, idx = (offset - slab_offset) / c->stride;
  if (first >= s->n_chunks || c->chunks_per_slab > s->n_chunks - first || idx >= c->blocks_per_slab)
    return CKV_ERR_INVALID;
  slab *sl = s->owner[first];
  if (sl && (sl->cls != cls || sl->offset != slab_offset)) return CKV_ERR_EXISTS;
  if (!sl) {
    size_t words = ((size_t)c->blocks_per_slab + 63) / 64;
    sl = malloc(sizeof *sl + words * sizeof(uint64_t) + (size_t)c->blocks_per_slab * sizeof(uint32_t));
    if (!sl) return -ENOMEM;
    if (!span_take_at(s, (uint32_t)first, c->chunks_per_slab)) {
      free(sl);
      return CKV_ERR_EXISTS;
    }
    *sl = (slab){.cls = cls, .first_chunk = (uint32_t)first, .n_chunks = c->chunks_per_slab,
                 .n_blocks = c->blocks_per_slab, .hwm = c->blocks_per_slab, .warm = true, .offset = slab_offset};
    memset(sl->bits, 0, words * sizeof(uint64_t));
    sl->stack = (uint32_t *)(sl->bits + words);
    for (uint32_t i = 0; i < sl->n_blocks; i++) sl->stack[i] = sl->n_blocks - 1 - i;
    for (uint32_t i = 0; i < sl->n_chunks; i++) s->owner[first + i] = sl;
    c->slabs++;
    s->slabs++;
    list_push(c, sl, /* front= */ false);
  }
  if (sl->bits[idx / 64] & (UINT64_C(1) << (idx % 64))) return CKV_ERR_EXISTS;
  /* out of the free stack (a linear search: rebuilding runs once, at start) */
  uint32_t n_free = sl->n_blocks - sl->n_used;
  for (uint32_t i = 0; i < n_free; i++)
    if (sl->stack[i] == idx) {
      sl->stack[i] = sl->stack[n_free - 1];
      break;
    }
  sl->bits[idx / 64] |= UINT64_C(1) << (idx % 64);
  sl->n_used++;
  if (sl->n_used == sl->n_blocks) list_unlink(c, sl);
  c->blocks_used++;
  s->blocks_used++;
  s->bytes_used += c->stride;
  return CKV_OK;
}

uint64_t ckv_slab_scrub(ckv_slab *s) {
  if (!s) return 0;
  uint64_t failed = 0;
  for (uint32_t c = 0; c < s->n_chunks;) {
    if (s->owner[c]) {
      c = s->owner[c]->first_chunk + s->owner[c]->n_chunks;
      continue;
    }
    /* a maximal run of free chunks: out of the pool span by span, one
     * discard, back as one span (its neighbours are used or the edges) */
    uint32_t end = c;
    while (end < s->n_chunks && !s->owner[end]) {
      uint32_t len = s->flen[end];
      span_remove(s, end);
      end += len;
    }
    s->chunks_free -= end - c; /* span_give counts them again */
    bool cold = discard(s, c, end - c);
    if (!cold) failed++;
    span_give(s, c, end - c, cold ? 0 : 1, /* absorb= */ false);
    c = end;
  }
  return failed;
}
