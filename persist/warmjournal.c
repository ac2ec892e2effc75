/* warmjournal.c - the warm journal kept current while serving (see
 * warmjournal.h).  The loop captures and keeps the books; one writer thread
 * of its own writes the files (a batch in flight at most), and the loop
 * picks its result up at the next housekeeping. */
#include "persist/warmjournal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <xxhash.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "persist/persist.h"
#include "persist/session_snap.h"
#include "persist/snapdir.h"
#include "persist/snapshot.h"
#include "persist/tier.h"
#include "persist/warm.h"
#include "persist/warmlog.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

/* What a journal entry that may be on disk names: the blocks the next
 * daemon would claim for the session. */
typedef struct jentry {
  const ckv_tenant *tenant;
  uint64_t *off;
  size_t n, cap;
  /* The entry known durable: the session's mark when it was captured and
   * the batch that made it durable (0: none is known durable yet).  A reply
   * held for the session goes once one of a batch built after its change
   * is (ckv_warm_journal_covers). */
  uint64_t mark, durable_seq;
} jentry;

typedef struct jwrite {
  char key[CKV_SNAP_TENANT_MAX + CKV_SNAP_ID_MAX + 2];
  char tenant[CKV_SNAP_TENANT_MAX + 1];
  char id[CKV_SNAP_ID_MAX + 1];
  const ckv_tenant *t; /* the loop's: tenants live as long as the store */
  uint64_t mark;       /* the session's mark_of when captured */
  ckv_snap snap;
} jwrite;

typedef struct jkey {
  char tenant[CKV_SNAP_TENANT_MAX + 1];
  char id[CKV_SNAP_ID_MAX + 1];
} jkey;

/* One batch: the writer thread's between submit and done. */
typedef struct jbatch {
  uint64_t seq; /* 1, 2, ... in the order the loop built them */
  char state_dir[4096];
  jwrite *w;
  size_t n_w;
  jkey *rm; /* entries of sessions the manifest no longer lists */
  size_t n_rm;
  uint8_t *manifest;
  size_t manifest_len;
  bool sweep; /* the first batch: every other file under warm/ goes */
  /* A checkpoint (every listed session's entry file, the manifest, a new
   * empty log) or, when false, records appended to the log (warmlog.h). */
  bool checkpoint;
  uint64_t log_bytes;   /* the log's size after this batch (the writer's) */
  uint64_t tenants_sig; /* a checkpoint's: ckv_warm_tenants_sig when built */
  int status;
  char err[400];
  uint64_t io_us;
} jbatch;

struct ckv_warm_journal {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake, done_cv;
  jbatch *queued, *written; /* the batch waiting for the thread, the one it wrote; both NULL while idle */
  bool stop, thread_up;
  jbatch *inflight; /* the loop's: submitted, not landed */
  uint64_t last_ms;
  uint64_t seq;            /* the last batch built */
  uint64_t retry_after_ms; /* after a failed batch, the next one waits until then */
  int efd;                 /* eventfd: the writer thread says a batch is written */
  /* The writer's (and the loop's while no batch is in flight): the log the
   * last checkpoint began, open for appending (-1: none, the next batch is
   * a checkpoint), and its records so far. */
  int log_fd;
  uint64_t log_seq, log_bytes_w;
  /* The loop's: the log's size after the last batch, the tenants' part of
   * the last checkpoint's manifest (ckv_warm_tenants_sig). */
  uint64_t log_bytes, tenants_sig;
  bool want_checkpoint;   /* a failed batch: the next one is a checkpoint */
  uint64_t compact_bytes; /* the log is compacted into a checkpoint past this size */
  uint64_t wanted_since_ms; /* when a held reply first wanted a batch none has been built for (0: none) */
  ckv_strmap *wanted;       /* "tenant/id" -> (void *)1: sessions held replies wait for, not yet captured */
  ckv_strmap *entries;    /* "tenant/id" -> jentry */
};

static uint64_t mark_of(const ckv_srv_session *s) {
  XXH64_state_t *h = XXH64_createState();
  if (!h) return 0;
  XXH64_reset(h, 0);
  uint64_t head[5] = {s->rounds, (uint64_t)s->tokens.n, s->epoch, s->incarnation, (uint64_t)s->n_blocks};
  XXH64_update(h, head, sizeof head);
  XXH64_update(h, s->count_by_state, sizeof s->count_by_state);
  for (size_t i = 0; i < s->n_blocks; i++) {
    const ckv_sblock *b = &s->blocks[i];
    uint64_t row[3] = {b->offset, b->format, b->used};
    XXH64_update(h, row, sizeof row);
  }
  uint64_t m = XXH64_digest(h) | 1u; /* never 0: 0 means "no entry" */
  XXH64_freeState(h);
  return m;
}

static void batch_free(jbatch *b) {
  if (!b) return;
  for (size_t i = 0; i < b->n_w; i++) ckv_snap_done(&b->w[i].snap);
  free(b->w);
  free(b->rm);
  free(b->manifest);
  free(b);
}

static jentry *jentry_free(jentry *e) {
  if (e) free(e->off);
  free(e);
  return NULL;
}

/* ---- the writer thread ---- */

typedef struct sweep_ctx {
  const jbatch *b;
} sweep_ctx;

static bool written_in(void *ctx, const char *tenant, const char *id) {
  const jbatch *b = ((sweep_ctx *)ctx)->b;
  for (size_t i = 0; i < b->n_w; i++)
    if (strcmp(b->w[i].tenant, tenant) == 0 && strcmp(b->w[i].id, id) == 0) return true;
  return false;
}

/* A checkpoint: entries first (each atomically replaced), then the
 * manifest, then a new empty log naming it, then what it no longer names:
 * a kill at any point leaves a manifest whose every entry on disk names only
 * blocks that are still held, and a log that is either the old manifest's
 * (the old one still in place) or the new one's. */
static void write_checkpoint(ckv_warm_journal *j, jbatch *b) {
  for (size_t i = 0; i < b->n_w && b->status == CKV_OK; i++) {
    char dir[4096], err[320];
    int r = ckv_snapdir_area_dir(b->state_dir, CKV_WARM_AREA, b->w[i].tenant,
                                 /* create= */ 1, dir, sizeof dir, err, sizeof err);
    if (r == CKV_OK) r = ckv_snap_write(dir, b->w[i].id, &b->w[i].snap, NULL, err, sizeof err);
    if (r < 0) {
      b->status = r;
      snprintf(b->err, sizeof b->err, "entry of %.63s/%.64s: %.200s", b->w[i].tenant, b->w[i].id, err);
    }
  }
  if (b->status == CKV_OK)
    b->status = ckv_warm_manifest_write(b->state_dir, b->manifest, b->manifest_len, b->err, sizeof b->err);
  if (b->status == CKV_OK) {
    if (j->log_fd >= 0) close(j->log_fd);
    j->log_fd = -1;
    uint64_t msum;
    memcpy(&msum, b->manifest + b->manifest_len - 8, 8);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", b->state_dir, CKV_WARM_AREA);
    b->status = ckv_warmlog_create(dir, msum, &j->log_fd, b->err, sizeof b->err);
    j->log_seq = 0;
    b->log_bytes = CKV_WARMLOG_HEADER_BYTES;
  }
  if (b->status == CKV_OK) {
    for (size_t i = 0; i < b->n_rm; i++) {
      char path[4096];
      if (ckv_snapdir_area_file(b->state_dir, CKV_WARM_AREA, b->rm[i].tenant, b->rm[i].id, path, sizeof path) == CKV_OK)
        unlink(path);
    }
    if (b->sweep) {
      ckv_persist fake = {.opt = {.state_dir = b->state_dir}};
      sweep_ctx c = {b};
      ckv_warm_sweep(&fake, written_in, &c);
    }
  }
}

/* Records appended to the log: a PUT per session written, a DEL per session
 * no longer listed, one write and one fdatasync.  A failed append may leave
 * part of them in the file: the log is closed and the next batch is a
 * checkpoint (the reader cuts such a tail at the last good record). */
static void write_records(ckv_warm_journal *j, jbatch *b) {
  ckv_warmlog_buf rb = {0};
  uint64_t seq = j->log_seq;
  for (size_t i = 0; i < b->n_w && !rb.oom; i++) {
    uint8_t *entry = NULL;
    size_t n = 0;
    if (ckv_snap_encode(&b->w[i].snap, &entry, &n) < 0) {
      rb.oom = true;
      break;
    }
    ckv_warmlog_encode(&rb, ++seq, CKV_WARMLOG_PUT, b->w[i].tenant, b->w[i].id, entry, n);
    free(entry);
  }
  for (size_t i = 0; i < b->n_rm && !rb.oom; i++)
    ckv_warmlog_encode(&rb, ++seq, CKV_WARMLOG_DEL, b->rm[i].tenant, b->rm[i].id, NULL, 0);
  if (rb.oom) {
    b->status = -ENOMEM;
    snprintf(b->err, sizeof b->err, "out of memory encoding the journal's records");
  } else {
    b->status = ckv_warmlog_append(j->log_fd, rb.p, rb.n, b->err, sizeof b->err);
  }
  if (b->status == CKV_OK) {
    j->log_seq = seq;
    b->log_bytes += rb.n;
  } else if (!rb.oom) {
    close(j->log_fd);
    j->log_fd = -1;
  }
  ckv_warmlog_buf_done(&rb);
}

static void write_batch(ckv_warm_journal *j, jbatch *b) {
  uint64_t t0 = ckv_now_us();
  b->status = CKV_OK;
  if (b->checkpoint) {
    write_checkpoint(j, b);
  } else if (j->log_fd < 0) { /* never: the loop asks for a checkpoint then */
    b->status = CKV_ERR_INTERNAL;
    snprintf(b->err, sizeof b->err, "no log to append to");
  } else {
    b->log_bytes = j->log_bytes_w;
    write_records(j, b);
    j->log_bytes_w = b->log_bytes;
  }
  if (b->checkpoint && b->status == CKV_OK) j->log_bytes_w = b->log_bytes;
  b->io_us = ckv_now_us() - t0;
}

static void *writer_main(void *arg) {
  ckv_warm_journal *j = arg;
  pthread_mutex_lock(&j->lock);
  for (;;) {
    while (!j->queued && !j->stop) pthread_cond_wait(&j->wake, &j->lock);
    if (!j->queued) break;
    jbatch *b = j->queued;
    j->queued = NULL;
    pthread_mutex_unlock(&j->lock);
    write_batch(j, b);
    pthread_mutex_lock(&j->lock);
    j->written = b;
    pthread_cond_broadcast(&j->done_cv);
    uint64_t one = 1;
    if (write(j->efd, &one, sizeof one) < 0) { /* full (never: 2^64 - 2) or closed; the loop looks anyway */
    }
  }
  pthread_mutex_unlock(&j->lock);
  return NULL;
}

/* ---- the loop's books ---- */

static int entry_note(ckv_warm_journal *j, const char *key, const ckv_tenant *t, const ckv_snap *snap, bool merge) {
  jentry *e = ckv_strmap_get(j->entries, key);
  if (!e) {
    if (!(e = calloc(1, sizeof(*e)))) return -ENOMEM;
    e->tenant = t;
    if (ckv_strmap_put(j->entries, key, e) < 0) {
      jentry_free(e);
      return -ENOMEM;
    }
  }
  if (!merge) e->n = 0;
  for (size_t i = 0; i < snap->n_blocks; i++) {
    if (e->n == e->cap) {
      size_t cap = e->cap ? 2 * e->cap : 16;
      uint64_t *o = realloc(e->off, cap * sizeof(*o));
      if (!o) return -ENOMEM;
      e->off = o;
      e->cap = cap;
    }
    e->off[e->n++] = snap->blocks[i].arena_offset;
  }
  return CKV_OK;
}

static ckv_srv_session *session_of(ckv_persist *p, const char *key) { return ckv_strmap_get(p->store->sessions, key); }

/* The batch came back: what is on disk now. */
static void land(ckv_persist *p, jbatch *b) {
  ckv_warm_journal *j = p->journal;
  bool ok = b->status == CKV_OK;
  for (size_t i = 0; i < b->n_w; i++) {
    const ckv_tenant *t = b->w[i].t;
    ckv_srv_session *s = session_of(p, b->w[i].key);
    /* On failure the new entry may be on disk all the same (its rename
     * happened, the manifest's did not): both are named from now on. */
    if (entry_note(j, b->w[i].key, t, &b->w[i].snap, /* merge= */ !ok) < 0) {
      /* cannot keep the books: hold every freed block of the tenant from now on
       * (never released) */
      ckv_log(CKV_LOG_ERROR, "warm-journal-failed", t->name, b->w[i].id,
              "out of memory noting a journal entry: its tenant's freed blocks "
              "stay held");
      ((ckv_tenant *)t)->journal_hold = true;
    }
    if (!ok && s) s->warm_mark = 0; /* written again by the next batch */
    jentry *e = ok ? ckv_strmap_get(j->entries, b->w[i].key) : NULL;
    if (e) {
      e->mark = b->w[i].mark;
      e->durable_seq = b->seq;
    }
  }
  if (ok) {
    j->log_bytes = b->log_bytes;
    if (b->checkpoint) {
      j->tenants_sig = b->tenants_sig;
      j->want_checkpoint = false;
    }
    for (size_t i = 0; i < b->n_rm; i++) {
      char key[sizeof b->w[0].key];
      snprintf(key, sizeof key, "%s/%s", b->rm[i].tenant, b->rm[i].id);
      jentry_free(ckv_strmap_del(j->entries, key));
    }
    p->counters.warm_checkpoints++;
    p->counters.warm_entries += b->n_w;
    if (b->checkpoint)
      ckv_log(CKV_LOG_DEBUG, "warm-checkpoint", NULL, NULL,
              "warm journal checkpoint durable: %zu entries written, %zu removed, in %.3f ms", b->n_w, b->n_rm,
              (double)b->io_us / 1e3);
    else
      ckv_log(CKV_LOG_DEBUG, "warm-log", NULL, NULL,
              "warm journal records durable: %zu session(s) written, %zu removed, log at %llu bytes, in %.3f ms",
              b->n_w, b->n_rm, (unsigned long long)b->log_bytes, (double)b->io_us / 1e3);
  } else {
    j->want_checkpoint = true; /* what the log holds may end in a torn record */
    p->counters.warm_journal_errors++;
    ckv_log(CKV_LOG_ERROR, "warm-journal-failed", NULL, NULL,
            "warm journal checkpoint not written: %s (%s); the previous one "
            "stays, and what it names stays held",
            b->err, ckv_strerror(b->status));
  }
  batch_free(b);
}

typedef struct named_ctx {
  uint64_t *off;
  size_t n;
} named_ctx;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static bool named(void *ctx, uint64_t offset) {
  const named_ctx *c = ctx;
  return bsearch(&offset, c->off, c->n, sizeof(*c->off), cmp_u64) != NULL;
}

/* Gives back the held blocks no entry that may be on disk names (no batch in
 * flight). */
static void release_held(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  for (size_t i = 0; i < p->store->n_tenants; i++) {
    ckv_tenant *t = p->store->tenants[i];
    if (!t->n_held) continue;
    named_ctx c = {0};
    size_t cap = 0, cursor = 0;
    jentry *e;
    bool oom = false;
    while ((e = ckv_strmap_next(j->entries, &cursor, NULL))) {
      if (e->tenant != t || !e->n) continue;
      if (c.n + e->n > cap) {
        size_t ncap = (c.n + e->n) * 2;
        uint64_t *o = realloc(c.off, ncap * sizeof(*o));
        if (!o) {
          oom = true;
          break;
        }
        c.off = o;
        cap = ncap;
      }
      memcpy(c.off + c.n, e->off, e->n * sizeof(*e->off));
      c.n += e->n;
    }
    if (!oom) {
      if (c.n) qsort(c.off, c.n, sizeof(*c.off), cmp_u64);
      ckv_tenant_release_held(t, c.n ? named : NULL, &c); /* NULL: no entry names anything of t */
    }
    free(c.off);
  }
}

/* Whether sess may be listed with a new entry captured now. */
static bool capturable(const ckv_srv_session *s) {
  return !s->quarantined && !s->doomed && !s->jobs_inflight && ckv_tier_state_of(s) == CKV_TIER_RESIDENT;
}

/* Whether sess's previous entry may stay listed: its blocks are still in the
 * arena. */
static bool may_stay(const ckv_srv_session *s) {
  ckv_tier_state ts = ckv_tier_state_of(s);
  return !s->quarantined && !s->doomed && (ts == CKV_TIER_RESIDENT || ts == CKV_TIER_OFFLOADING);
}

typedef struct listing {
  ckv_strmap *keys; /* listed "tenant/id" -> (void *)1 */
} listing;

static bool is_listed(void *ctx, const ckv_srv_session *s) {
  char key[400];
  ckv_store_session_key(s->tenant, s->id, key, sizeof key);
  return ckv_strmap_get(((listing *)ctx)->keys, key) != NULL;
}

/* Captures session s ("tenant/id" key) into b when it changed since its
 * entry (or always, when `all`), noting it in `listed` (NULL: no listing
 * kept).  0 done (captured, unchanged or not capturable now), 1 when a
 * checkpoint cannot list it now (its last record may be in the log), -1
 * out of memory. */
static int add_session(ckv_persist *p, jbatch *b, size_t *cap_w, ckv_strmap *listed, const char *key,
                       ckv_srv_session *s, bool all) {
  ckv_warm_journal *j = p->journal;
  bool has_entry = ckv_strmap_get(j->entries, key) != NULL;
  uint64_t mark = 0;
  bool changed = !has_entry || all || s->warm_mark != (mark = mark_of(s));
  if (!changed) return listed && ckv_strmap_put(listed, key, (void *)1) < 0 ? -1 : 0;
  char err[320] = "";
  int r = capturable(s) ? ckv_srv_session_flush_meta(s) : CKV_ERR_BUSY;
  ckv_snap snap;
  if (r == CKV_OK) r = ckv_session_snap_capture_refs(s, &snap, err, sizeof err);
  if (r < 0) {
    /* A checkpoint lists every session with its entry file: one whose last
     * record is in the log and cannot be captured now makes it wait. */
    if (b->checkpoint && has_entry && may_stay(s)) return 1;
    /* not now (moves in flight, away on disk): its previous entry stays while
     * its blocks do */
    if (listed && has_entry && may_stay(s) && ckv_strmap_put(listed, key, (void *)1) < 0) return -1;
    if (r != CKV_ERR_BUSY)
      ckv_log(CKV_LOG_DEBUG, "warm-journal", s->tenant->name, s->id, "not journaled now: %s", err);
    return 0;
  }
  if (b->n_w == *cap_w) {
    size_t ncap = *cap_w ? 2 * *cap_w : 16;
    jwrite *w = realloc(b->w, ncap * sizeof(*w));
    if (!w) {
      ckv_snap_done(&snap);
      return -1;
    }
    b->w = w;
    *cap_w = ncap;
  }
  jwrite *w = &b->w[b->n_w++];
  memset(w, 0, sizeof *w);
  snprintf(w->key, sizeof w->key, "%s", key);
  snprintf(w->tenant, sizeof w->tenant, "%s", s->tenant->name);
  snprintf(w->id, sizeof w->id, "%s", s->id);
  w->t = s->tenant;
  w->snap = snap;
  s->warm_mark = mark ? mark : mark_of(s);
  w->mark = s->warm_mark;
  return listed && ckv_strmap_put(listed, key, (void *)1) < 0 ? -1 : 0;
}

/* Records of the sessions held replies wait for (j->wanted) that changed:
 * those captured leave the set, with those gone or in no entry any more
 * (their DEL comes with the next full batch).  Cost: the sessions waited
 * for, not every session.  NULL when none could be captured now. */
static jbatch *build_wanted(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  jbatch *b = calloc(1, sizeof(*b));
  size_t cap_w = 0, cursor = 0;
  if (!b) goto oom;
  snprintf(b->state_dir, sizeof b->state_dir, "%s", p->opt.state_dir);
  const char *k;
  while (ckv_strmap_next(j->wanted, &cursor, &k)) {
    char key[sizeof b->w[0].key];
    snprintf(key, sizeof key, "%s", k);
    ckv_srv_session *s = session_of(p, key);
    size_t before = b->n_w;
    if (s && may_stay(s) && add_session(p, b, &cap_w, NULL, key, s, /* all= */ false) < 0) goto oom;
    if (!s || !may_stay(s) || b->n_w > before || s->warm_mark == mark_of(s)) ckv_strmap_del(j->wanted, key);
  }
  if (!b->n_w) {
    batch_free(b);
    return NULL;
  }
  b->seq = ++j->seq;
  return b;
oom:
  ckv_log(CKV_LOG_ERROR, "warm-journal-failed", NULL, NULL, "out of memory building a warm journal batch");
  if (b)
    for (size_t i = 0; i < b->n_w; i++) { /* written again next time */
      ckv_srv_session *ws = session_of(p, b->w[i].key);
      if (ws) ws->warm_mark = 0;
    }
  batch_free(b);
  return NULL;
}

/* Captures what changed into a batch of records, or, when checkpoint, every
 * session into a checkpoint; NULL when nothing changed, when a checkpoint
 * cannot be written now (*ret_busy: a session it must list cannot be
 * captured now), or out of memory (logged). */
static jbatch *build_batch(ckv_persist *p, bool checkpoint, bool *ret_busy) {
  ckv_warm_journal *j = p->journal;
  jbatch *b = calloc(1, sizeof(*b));
  listing l = {0};
  size_t cap_w = 0;
  *ret_busy = false;
  if (!b || ckv_strmap_new(&l.keys) < 0) goto oom;
  snprintf(b->state_dir, sizeof b->state_dir, "%s", p->opt.state_dir);
  b->sweep = b->checkpoint = checkpoint;
  size_t cursor = 0;
  const char *key;
  ckv_srv_session *s;
  while ((s = ckv_strmap_next(p->store->sessions, &cursor, &key))) {
    int r = add_session(p, b, &cap_w, l.keys, key, s, /* all= */ checkpoint);
    if (r < 0) goto oom;
    if (r > 0) {
      *ret_busy = true;
      goto abandon;
    }
  }
  /* entries of sessions no longer listed (dropped, closed for good, moved to
   * disk) */
  size_t cap_rm = 0;
  cursor = 0;
  jentry *e;
  while ((e = ckv_strmap_next(j->entries, &cursor, &key))) {
    if (ckv_strmap_get(l.keys, key)) continue;
    if (b->n_rm == cap_rm) {
      size_t ncap = cap_rm ? 2 * cap_rm : 16;
      jkey *k = realloc(b->rm, ncap * sizeof(*k));
      if (!k) goto oom;
      b->rm = k;
      cap_rm = ncap;
    }
    jkey *k = &b->rm[b->n_rm++];
    const char *slash = strchr(key, '/');
    snprintf(k->tenant, sizeof k->tenant, "%.*s", slash ? (int)(slash - key) : 0, key);
    snprintf(k->id, sizeof k->id, "%s", slash ? slash + 1 : key);
  }
  if (!checkpoint && !b->n_w && !b->n_rm) {
    ckv_strmap_free(l.keys);
    batch_free(b);
    return NULL;
  }
  if (checkpoint && ckv_warm_manifest_encode(p, is_listed, &l, &b->manifest, &b->manifest_len) < 0) goto oom;
  ckv_strmap_free(l.keys);
  b->seq = ++j->seq;
  return b;
oom:
  ckv_log(CKV_LOG_ERROR, "warm-journal-failed", NULL, NULL, "out of memory building a warm journal checkpoint");
abandon:
  if (b)
    for (size_t i = 0; i < b->n_w; i++) { /* written again next time */
      ckv_srv_session *ws = session_of(p, b->w[i].key);
      if (ws) ws->warm_mark = 0;
    }
  ckv_strmap_free(l.keys);
  batch_free(b);
  return NULL;
}

/* CKV_TEST_WARM_COMPACT_BYTES=N (tests only): compact the log past N bytes
 * instead of CKV_WARM_COMPACT_BYTES. */
#define CKV_WARM_COMPACT_BYTES (UINT64_C(8) << 20)
static uint64_t compact_bytes(void) {
  const char *v = getenv("CKV_TEST_WARM_COMPACT_BYTES");
  long long n = v ? strtoll(v, NULL, 10) : 0;
  return n > 0 ? (uint64_t)n : CKV_WARM_COMPACT_BYTES;
}

/* The next batch: records appended to the log, or a checkpoint when one is
 * due (the first of this daemon, no usable log, a failed batch, the tenants
 * changed: it waits until it can be written; the log past its size: when
 * it can, else records). */
static jbatch *next_batch(ckv_persist *p, bool first, bool wanted_only) {
  ckv_warm_journal *j = p->journal;
  uint64_t sig = ckv_warm_tenants_sig(p);
  bool must = first || j->log_fd < 0 || j->want_checkpoint || sig != j->tenants_sig;
  bool busy = false;
  if (must || j->log_bytes > j->compact_bytes) {
    jbatch *b = build_batch(p, /* checkpoint= */ true, &busy);
    if (b) {
      b->tenants_sig = sig;
      ckv_strmap_free(j->wanted); /* every session captured: none waits any more */
      if (ckv_strmap_new(&j->wanted) < 0) j->wanted = NULL;
    }
    if (b || must) return b;
  }
  return wanted_only && j->wanted ? build_wanted(p) : build_batch(p, /* checkpoint= */ false, &busy);
}

/* ---- the module's face ---- */

int ckv_warm_journal_new(ckv_persist *p) {
  if (!p->opt.warm_journal_ms || !ckv_warm_enabled(p)) return CKV_OK;
  ckv_warm_journal *j = calloc(1, sizeof(*j));
  if (!j) return -ENOMEM;
  if (ckv_strmap_new(&j->entries) < 0) {
    free(j);
    return -ENOMEM;
  }
  j->log_fd = -1;
  j->compact_bytes = compact_bytes();
  if (ckv_strmap_new(&j->wanted) < 0) j->wanted = NULL; /* then every batch is a full one */
  j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (j->efd < 0) {
    int r = -errno;
    ckv_strmap_free(j->entries);
    ckv_strmap_free(j->wanted);
    free(j);
    return r;
  }
  pthread_mutex_init(&j->lock, NULL);
  pthread_cond_init(&j->wake, NULL);
  pthread_cond_init(&j->done_cv, NULL);
  int r = pthread_create(&j->thread, NULL, writer_main, j);
  if (r != 0) {
    close(j->efd);
    ckv_strmap_free(j->entries);
    ckv_strmap_free(j->wanted);
    free(j);
    return -r;
  }
  j->thread_up = true;
  p->journal = j;
  return CKV_OK;
}

bool ckv_warm_journal_first(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  if (!j || j->inflight) return false;
  ckv_snapdir_clean_temps(p->opt.state_dir, CKV_WARM_AREA);
  for (size_t i = 0; i < p->store->n_tenants; i++) p->store->tenants[i]->journal_hold = true;
  jbatch *b = next_batch(p, /* first= */ true, /* wanted_only= */ false);
  if (!b) return false;
  write_batch(j, b); /* here: before the first request, a kill finds this daemon's
                     journal */
  bool ok = b->status == CKV_OK;
  size_t n = b->n_w;
  uint64_t us = b->io_us;
  land(p, b);
  j->last_ms = ckv_now_ms();
  if (ok)
    ckv_log(CKV_LOG_INFO, "warm-journal", NULL, NULL,
            "warm journal current from the start: %zu session(s) journaled in "
            "%.3f ms",
            n, (double)us / 1e3);
  return ok;
}

/* The finished batch, if any (the loop's, after this). */
static jbatch *take_done(ckv_warm_journal *j, bool wait) {
  pthread_mutex_lock(&j->lock);
  while (wait && !j->written && (j->queued || j->inflight)) pthread_cond_wait(&j->done_cv, &j->lock);
  jbatch *b = j->written;
  j->written = NULL;
  pthread_mutex_unlock(&j->lock);
  return b;
}

/* Lands the batch the writer thread finished, if any: 1 when one landed, 0
 * when none was in flight, -1 while one is still on its way. */
static int land_done(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  if (!j->inflight) return 0;
  uint64_t n;
  while (read(j->efd, &n, sizeof n) == sizeof n) {
  }
  jbatch *b = take_done(j, /* wait= */ false);
  if (!b) return -1;
  j->inflight = NULL;
  if (b->status != CKV_OK) {
    uint64_t pause = p->opt.warm_journal_ms < 1000 ? p->opt.warm_journal_ms : 1000;
    j->retry_after_ms = ckv_now_ms() + pause; /* a failing disk is not hammered */
  }
  land(p, b);
  return 1;
}

/* Builds the next batch and hands it to the writer thread (none in flight). */
static void submit(ckv_persist *p, uint64_t now_ms, bool wanted_only) {
  ckv_warm_journal *j = p->journal;
  j->last_ms = now_ms;
  j->wanted_since_ms = 0;
  jbatch *b = next_batch(p, /* first= */ false, wanted_only);
  if (!b) return;
  pthread_mutex_lock(&j->lock);
  j->queued = b;
  pthread_cond_signal(&j->wake);
  pthread_mutex_unlock(&j->lock);
  j->inflight = b;
}

void ckv_warm_journal_scan(ckv_persist *p, uint64_t now_ms) {
  ckv_warm_journal *j = p->journal;
  if (!j || !j->thread_up) return;
  if (land_done(p) < 0) return; /* nothing is given back while a batch is on its way */
  release_held(p);
  if (now_ms - j->last_ms < p->opt.warm_journal_ms || now_ms < j->retry_after_ms) return;
  submit(p, now_ms, /* wanted_only= */ false);
}

int ckv_warm_journal_fd(const ckv_persist *p) { return p->journal && p->journal->thread_up ? p->journal->efd : -1; }

void ckv_warm_journal_pump(ckv_persist *p, bool wanted, uint64_t now_ms) {
  ckv_warm_journal *j = p->journal;
  if (!j || !j->thread_up) return;
  int landed = land_done(p);
  if (landed < 0) return;
  if (landed) release_held(p); /* blocks no entry on disk names any more (none in flight now) */
  if (!wanted || now_ms < j->retry_after_ms) return;
  if (!j->wanted_since_ms) j->wanted_since_ms = now_ms;
  if (now_ms - j->wanted_since_ms < p->opt.warm_journal_delay_ms) return; /* more changes may join it */
  submit(p, now_ms, /* wanted_only= */ true);
}

uint64_t ckv_warm_journal_wait_ms(const ckv_persist *p, uint64_t now_ms) {
  const ckv_warm_journal *j = p->journal;
  if (!j || !j->wanted_since_ms || j->inflight) return UINT64_MAX;
  uint64_t at = j->wanted_since_ms + p->opt.warm_journal_delay_ms;
  return at > now_ms ? at - now_ms : 0;
}

uint64_t ckv_warm_journal_need(ckv_persist *p, const ckv_srv_session *s) {
  ckv_warm_journal *j = p->journal;
  if (!j || !j->thread_up || !s || !may_stay(s)) return 0;
  char key[400];
  ckv_store_session_key(s->tenant, s->id, key, sizeof key);
  const jentry *e = ckv_strmap_get(j->entries, key);
  if (e && e->durable_seq && e->mark == mark_of(s)) return 0; /* no change since its durable entry */
  if (j->wanted && ckv_strmap_put(j->wanted, key, (void *)1) < 0) { /* the next full batch catches it */
  }
  return j->seq + 1; /* the next batch built */
}

bool ckv_warm_journal_covers(ckv_persist *p, const char *key, uint64_t need) {
  ckv_warm_journal *j = p->journal;
  if (!j || !j->thread_up) return true;
  const ckv_srv_session *s = session_of(p, key);
  if (!s || !may_stay(s)) return true; /* gone (its end is in incarnations.log), or in no journal entry */
  const jentry *e = ckv_strmap_get(j->entries, key);
  if (!e || !e->durable_seq) return false;
  return e->durable_seq >= need || e->mark == mark_of(s);
}

bool ckv_warm_journal_flush(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  if (!j || !j->thread_up) return true;
  if (j->inflight) {
    jbatch *b = take_done(j, /* wait= */ true);
    j->inflight = NULL;
    if (b) land(p, b);
  }
  jbatch *b = next_batch(p, /* first= */ false, /* wanted_only= */ false);
  if (!b) return true;
  write_batch(j, b); /* here: the loop has stopped serving */
  bool ok = b->status == CKV_OK;
  land(p, b);
  return ok;
}

void ckv_warm_journal_stop(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  if (!j || !j->thread_up) return;
  if (j->inflight) {
    jbatch *b = take_done(j, /* wait= */ true);
    j->inflight = NULL;
    if (b) land(p, b);
  }
  pthread_mutex_lock(&j->lock);
  j->stop = true;
  pthread_cond_signal(&j->wake);
  pthread_mutex_unlock(&j->lock);
  pthread_join(j->thread, NULL);
  j->thread_up = false;
}

void ckv_warm_journal_free(ckv_persist *p) {
  ckv_warm_journal *j = p->journal;
  if (!j) return;
  ckv_warm_journal_stop(p);
  batch_free(j->written);
  batch_free(j->queued);
  size_t cursor = 0;
  jentry *e;
  while ((e = ckv_strmap_next(j->entries, &cursor, NULL))) jentry_free(e);
  ckv_strmap_free(j->entries);
  ckv_strmap_free(j->wanted);
  close(j->efd);
  if (j->log_fd >= 0) close(j->log_fd);
  pthread_mutex_destroy(&j->lock);
  pthread_cond_destroy(&j->wake);
  pthread_cond_destroy(&j->done_cv);
  free(j);
  p->journal = NULL;
}
