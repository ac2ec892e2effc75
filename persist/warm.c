/* warm.c - warm restart: the journal at a clean stop, adoption and rebuild
 * at start (see warm.h).
 *
 * The manifest, STATE_DIR/warm/journal (all integers little-endian):
 *   "CKVWARM\0" · u32 version · u32 ~version · u64 written_at_ms ·
 *   u64 owner (the writer's tag: its arenas sit in the fd store under it) ·
 *   u32 n_tenants, then per tenant: str name · u64 arena generation ·
 *   u64 arena bytes · u64 quota · u32 max_sessions · u32 max_clients ·
 *   u32 policies · i32 default_policy · u32 n_sessions, then n_sessions
 *   times str session id ·
 *   u64 XXH64 (seed 0) of every byte before it.
 * (str = u32 length + bytes.)  Session entries: STATE_DIR/warm/TENANT/ID.ckvsnap
 * snapshots with CKV_SNAP_BLOCK_REFS (docs/snapshot.md, docs/warm-restart.md),
 * each section checksummed and cross-checked by the snapshot reader. */
#include "persist/warm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "commitkv/status.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "lifecycle/judge.h"
#include "persist/fdstore.h"
#include "persist/persist.h"
#include "persist/session_snap.h"
#include "persist/snapdir.h"
#include "persist/snapshot.h"
#include "kernels/format.h"
#include "persist/incarnations.h"
#include "persist/statefile.h"
#include "persist/tier.h"
#include "persist/warmlog.h"
#include "shm/arena.h"
#include "shm/slab.h"
#include "store/blockmem.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

#define MANIFEST_MAX (UINT64_C(64) << 20) /* far beyond any tenant count we allow */

/* ---- sessions the warm restart dropped (answered on resume) ---- */

typedef struct dropped {
  struct dropped *next;
  char key[256]; /* tenant/id */
  char why[200];
} dropped;

struct ckv_warm_memory {
  dropped *dropped;
  /* The start found arenas in the store and no journal: the daemon before us
   * was killed or crashed.  Said on every resume that finds nothing. */
  bool unclean;
  /* It found a journal that a clean stop did not write (no STATE_DIR/warm/
   * stopped beside it): the continuous journal of a daemon that was killed
   * or crashed; sessions came back as of their last durable record. */
  bool killed_with_journal;
};

/* p->warm, made on first use; NULL when out of memory (then nothing is remembered). */
static ckv_warm_memory *memory_of(ckv_persist *p) {
  if (!p->warm) p->warm = calloc(1, sizeof(*p->warm));
  return p->warm;
}

__attribute__((format(printf, 4, 5))) static void note_dropped(ckv_persist *p, const char *tenant, const char *id,
                                                               const char *fmt, ...) {
  ckv_warm_memory *m = memory_of(p);
  dropped *d = m ? calloc(1, sizeof(*d)) : NULL;
  if (!d) return;
  snprintf(d->key, sizeof d->key, "%s/%s", tenant, id);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->why, sizeof d->why, fmt, ap);
  va_end(ap);
  d->next = m->dropped;
  m->dropped = d;
}

const char *ckv_warm_dropped(const ckv_persist *p, const char *tenant, const char *id) {
  char key[256];
  snprintf(key, sizeof key, "%s/%s", tenant, id);
  for (const dropped *d = p->warm ? p->warm->dropped : NULL; d; d = d->next)
    if (strcmp(d->key, key) == 0) return d->why;
  return NULL;
}

const char *ckv_warm_unclean(const ckv_persist *p) {
  if (p->warm && p->warm->killed_with_journal)
    return "the daemon before this one was killed or crashed: sessions came back with every change it had "
           "answered, and this one was in none of its journal's records (its open was cut short by the kill)";
  return p->warm && p->warm->unclean
             ? "the daemon before this one did not stop cleanly (killed or crashed): sessions that lived only "
               "in its memory are gone, saved ones come back from their snapshots"
             : NULL;
}

void ckv_warm_forget(ckv_persist *p) {
  if (!p->warm) return;
  for (dropped *d = p->warm->dropped, *next; d; d = next) {
    next = d->next;
    free(d);
  }
  free(p->warm);
  p->warm = NULL;
}

/* ---- manifest encoding ---- */

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->n + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
  uint32_t n = (uint32_t)strlen(s);
  put_u32(b, n);
  put(b, s, n);
}

typedef struct cur {
  const uint8_t *p;
  size_t n, at;
  bool short_;
} cur;

static const uint8_t *get(cur *c, size_t n) {
  if (c->short_ || n > c->n - c->at) {
    c->short_ = true;
    return NULL;
  }
  const uint8_t *r = c->p + c->at;
  c->at += n;
  return r;
}
static uint32_t get_u32(cur *c) {
  uint32_t v = 0;
  const uint8_t *p = get(c, 4);
  if (p) memcpy(&v, p, 4);
  return v;
}
static uint64_t get_u64(cur *c) {
  uint64_t v = 0;
  const uint8_t *p = get(c, 8);
  if (p) memcpy(&v, p, 8);
  return v;
}
static bool get_str(cur *c, char *out, size_t max) {
  uint32_t n = get_u32(c);
  if (c->short_ || n >= max) return false;
  const uint8_t *p = get(c, n);
  if (!p) return false;
  memcpy(out, p, n);
  out[n] = 0;
  return memchr(out, 0, n) == NULL;
}

static uint64_t now_ms_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* This daemon's tag in the fd store's names (fdstore.h): from its boot token. */
static uint64_t owner_tag(const ckv_persist *p) { return p->opt.owner_tag ? p->opt.owner_tag : 1; }

static bool warm_enabled(const ckv_persist *p) {
  return p->opt.state_dir && *p->opt.state_dir && ckv_fdstore_available() && p->opt.backend &&
         strcmp(p->opt.backend->name, ckv_arena_host_backend.name) == 0;
}

bool ckv_warm_enabled(const ckv_persist *p) { return warm_enabled(p); }

/* The tenant's part of the manifest; the session ids follow (their count at *ret_count_at). */
static void put_tenant(buf *m, const ckv_tenant *t, size_t *ret_count_at) {
  put_str(m, t->name);
  put_u64(m, ckv_arena_generation(t->arena));
  put_u64(m, ckv_arena_size(t->arena));
  put_u64(m, t->quota_bytes);
  put_u32(m, t->max_sessions);
  put_u32(m, t->max_clients);
  put_u32(m, t->policies);
  put_u32(m, (uint32_t)t->default_policy);
  *ret_count_at = m->n;
  put_u32(m, 0);
}

static void put_head(buf *m, const ckv_persist *p) {
  put(m, CKV_WARM_MAGIC, 8);
  put_u32(m, CKV_WARM_VERSION);
  put_u32(m, ~(uint32_t)CKV_WARM_VERSION);
  put_u64(m, now_ms_real());
  put_u64(m, owner_tag(p));
  put_u32(m, (uint32_t)p->store->n_tenants);
}

uint64_t ckv_warm_tenants_sig(const ckv_persist *p) {
  buf m = {0};
  for (size_t i = 0; i < p->store->n_tenants; i++) {
    size_t count_at;
    put_tenant(&m, p->store->tenants[i], &count_at);
  }
  uint64_t sig = m.oom ? 0 : XXH64(m.p, m.n, 0);
  free(m.p);
  return sig;
}

int ckv_warm_manifest_encode(ckv_persist *p, bool (*listed)(void *ctx, const ckv_srv_session *s), void *ctx,
                             uint8_t **ret, size_t *ret_len) {
  buf m = {0};
  put_head(&m, p);
  for (size_t i = 0; i < p->store->n_tenants; i++) {
    ckv_tenant *t = p->store->tenants[i];
    size_t count_at;
    put_tenant(&m, t, &count_at);
    uint32_t n = 0;
    size_t cursor = 0;
    ckv_srv_session *sess;
    while ((sess = ckv_strmap_next(p->store->sessions, &cursor, NULL)))
      if (sess->tenant == t && listed(ctx, sess)) {
        put_str(&m, sess->id);
        n++;
      }
    if (!m.oom) memcpy(m.p + count_at, &n, 4);
  }
  uint64_t sum = m.oom ? 0 : XXH64(m.p, m.n, 0);
  put_u64(&m, sum);
  if (m.oom) {
    free(m.p);
    return -ENOMEM;
  }
  *ret = m.p;
  *ret_len = m.n;
  return CKV_OK;
}

int ckv_warm_manifest_write(const char *state_dir, const uint8_t *m, size_t n, char *err, size_t errlen) {
  char top[4096], path[4200], tmp[4300];
  if (snprintf(top, sizeof top, "%s/%s", state_dir, CKV_WARM_AREA) >= (int)sizeof top) return -ENAMETOOLONG;
  snprintf(path, sizeof path, "%s/%s", top, CKV_WARM_MANIFEST);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (mkdir(top, 0700) < 0 && errno != EEXIST) {
    int r = -errno;
    snprintf(err, errlen, "cannot create %.300s: %s", top, strerror(errno));
    return r;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  size_t done = 0;
  while (fd >= 0 && done < n) {
    ssize_t w = write(fd, m + done, n - done);
    if (w <= 0) break;
    done += (size_t)w;
  }
  int r = fd < 0 || done != n || fsync(fd) < 0 ? (errno ? -errno : -EIO) : CKV_OK;
  if (fd >= 0) close(fd);
  if (r == CKV_OK && rename(tmp, path) < 0) r = -errno;
  if (r == CKV_OK) { /* the rename itself durable */
    int dfd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) < 0) r = -errno;
    if (dfd >= 0) close(dfd);
  }
  if (r < 0) {
    snprintf(err, errlen, "cannot write %.300s: %s", path, strerror(-r));
    unlink(tmp);
  }
  return r;
}

static int manifest_path(const ckv_persist *p, char *path, size_t len) {
  if (snprintf(path, len, "%s/%s/%s", p->opt.state_dir, CKV_WARM_AREA, CKV_WARM_MANIFEST) >= (int)len)
    return -ENAMETOOLONG;
  return CKV_OK;
}

/* Removes STATE_DIR/warm and everything in it (two levels: the tenants'
 * directories and their entries). */
static void remove_journal(const ckv_persist *p) {
  char top[4096];
  if (snprintf(top, sizeof top, "%s/%s", p->opt.state_dir, CKV_WARM_AREA) >= (int)sizeof top) return;
  DIR *d = opendir(top);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    char entry[4096 + 256];
    snprintf(entry, sizeof entry, "%s/%s", top, e->d_name);
    DIR *sub = opendir(entry);
    if (sub) {
      struct dirent *f;
      while ((f = readdir(sub))) {
        if (f->d_name[0] == '.' && (!f->d_name[1] || (f->d_name[1] == '.' && !f->d_name[2]))) continue;
        char q[4096 + 512];
        snprintf(q, sizeof q, "%s/%s", entry, f->d_name);
        unlink(q);
      }
      closedir(sub);
      rmdir(entry);
    } else {
      unlink(entry);
    }
  }
  closedir(d);
  rmdir(top);
}

/* Removes every entry file (and temporary file) under STATE_DIR/warm whose
 * tenant/id keep() does not want. */
void ckv_warm_sweep(const ckv_persist *p, bool (*keep)(void *ctx, const char *tenant, const char *id), void *ctx) {
  char top[4096];
  if (snprintf(top, sizeof top, "%s/%s", p->opt.state_dir, CKV_WARM_AREA) >= (int)sizeof top) return;
  DIR *d = opendir(top);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char entry[4096 + 256];
    snprintf(entry, sizeof entry, "%s/%s", top, e->d_name);
    DIR *sub = opendir(entry);
    if (!sub) continue; /* the manifest */
    struct dirent *f;
    while ((f = readdir(sub))) {
      if (f->d_name[0] == '.') continue;
      char id[300];
      size_t len = strlen(f->d_name), ext = strlen(".ckvsnap");
      bool entry_file = len > ext && len - ext < sizeof id && strcmp(f->d_name + len - ext, ".ckvsnap") == 0;
      if (entry_file) {
        memcpy(id, f->d_name, len - ext);
        id[len - ext] = 0;
        if (keep(ctx, e->d_name, id)) continue;
      }
      char q[4096 + 512];
      snprintf(q, sizeof q, "%s/%s", entry, f->d_name);
      unlink(q);
    }
    closedir(sub);
  }
  closedir(d);
}

/* ---- start ---- */

typedef struct jtenant {
  char name[64];
  uint64_t generation, bytes, quota;
  uint32_t max_sessions, max_clients, policies, n_sessions;
  int32_t default_policy;
  char (*ids)[CKV_SESSION_ID_MAX + 1];
  const ckv_warmlog_rec **rec; /* per id: its last record in the log, NULL: its entry file (apply_log) */
} jtenant;

static void jtenants_free(jtenant *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(t[i].ids);
    free(t[i].rec);
  }
  free(t);
}

static void session_dropped_name(ckv_persist *p, const char *tenant, const char *id, const char *err);

/* The log over the manifest, record by record, the last one per session
 * winning: each tenant's sessions become those the manifest lists less
 * those a DEL removed, plus those a PUT added, each with its last record
 * (rec, NULL for its entry file).  A record of a tenant the manifest does
 * not have drops its session (never: a new tenant makes a checkpoint).
 * -ENOMEM (nothing changed) or CKV_OK. */
static int apply_log(ckv_persist *p, jtenant *jt, size_t n_jt, const ckv_warmlog *wl) {
  ckv_strmap *last = NULL;
  if (ckv_strmap_new(&last) < 0) return -ENOMEM;
  char key[CKV_WARMLOG_TENANT_MAX + CKV_WARMLOG_ID_MAX + 2];
  for (size_t i = 0; i < wl->n; i++) {
    snprintf(key, sizeof key, "%s/%s", wl->recs[i].tenant, wl->recs[i].id);
    if (ckv_strmap_put(last, key, &wl->recs[i]) < 0) {
      ckv_strmap_free(last);
      return -ENOMEM;
    }
  }
  for (size_t i = 0; i < n_jt; i++) {
    jtenant *j = &jt[i];
    size_t cap = (size_t)j->n_sessions + wl->n, n = 0;
    char(*ids)[CKV_SESSION_ID_MAX + 1] = calloc(cap ? cap : 1, sizeof(*ids));
    const ckv_warmlog_rec **rec = calloc(cap ? cap : 1, sizeof(*rec));
    if (!ids || !rec) {
      free(ids);
      free(rec);
      ckv_strmap_free(last);
      return -ENOMEM;
    }
    for (uint32_t k = 0; k < j->n_sessions; k++) {
      snprintf(key, sizeof key, "%s/%s", j->name, j->ids[k]);
      const ckv_warmlog_rec *r = ckv_strmap_del(last, key);
      if (r && r->type == CKV_WARMLOG_DEL) continue; /* left the journal after the checkpoint */
      memcpy(ids[n], j->ids[k], sizeof ids[n]);
      rec[n++] = r;
    }
    size_t cursor = 0, tl = strlen(j->name);
    const char *k;
    const ckv_warmlog_rec *r;
    while ((r = ckv_strmap_next(last, &cursor, &k))) {
      if (strncmp(k, j->name, tl) != 0 || k[tl] != '/' || r->type != CKV_WARMLOG_PUT) continue;
      snprintf(ids[n], sizeof ids[n], "%s", r->id);
      rec[n++] = r;
    }
    free(j->ids);
    free(j->rec);
    j->ids = ids;
    j->rec = rec;
    j->n_sessions = (uint32_t)n;
  }
  size_t cursor = 0;
  const ckv_warmlog_rec *r;
  while ((r = ckv_strmap_next(last, &cursor, NULL))) {
    bool known = false;
    for (size_t i = 0; i < n_jt && !known; i++) known = strcmp(jt[i].name, r->tenant) == 0;
    if (r->type == CKV_WARMLOG_PUT && !known)
      session_dropped_name(p, r->tenant, r->id, "its tenant is in no checkpoint of the journal");
  }
  ckv_strmap_free(last);
  return CKV_OK;
}

/* Reads and checks the manifest.  CKV_OK with *ret and *ret_n, -ENOENT when
 * there is none, else a code and err. */
static int read_manifest(const char *path, jtenant **ret, size_t *ret_n, uint64_t *ret_written, uint64_t *ret_owner,
                         uint64_t *ret_sum, char *err, size_t errlen) {
  int cr = ckv_statefile_check_file(path, 1, err, errlen); /* the daemon's own journal, in its own directory */
  if (cr == -ENOENT) return -ENOENT;
  if (cr < 0) return cr;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO: refused below, never waited on */
  if (fd < 0) {
    if (errno == ENOENT) return -ENOENT;
    snprintf(err, errlen, "cannot open %.300s: %s", path, strerror(errno));
    return -errno;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MANIFEST_MAX) {
    snprintf(err, errlen, "%.300s is not a regular file of at most %llu bytes", path, (unsigned long long)MANIFEST_MAX);
    close(fd);
    return CKV_ERR_CORRUPT;
  }
  size_t len = (size_t)st.st_size;
  uint8_t *p = malloc(len ? len : 1);
  size_t got = 0;
  while (p && got < len) {
    ssize_t r = read(fd, p + got, len - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (!p || got != len) {
    free(p);
    snprintf(err, errlen, "cannot read %.300s", path);
    return p ? -EIO : -ENOMEM;
  }
  int r = CKV_ERR_CORRUPT;
  jtenant *ts = NULL;
  uint32_t nt = 0;
  if (len < 16 + 8 || memcmp(p, CKV_WARM_MAGIC, 8) != 0) {
    snprintf(err, errlen, "%.300s: no journal magic (%zu bytes)", path, len);
    goto out;
  }
  uint32_t ver, nver;
  memcpy(&ver, p + 8, 4);
  memcpy(&nver, p + 12, 4);
  if (ver != (uint32_t)~nver) {
    snprintf(err, errlen, "%.300s: damaged version word", path);
    goto out;
  }
  if (ver != CKV_WARM_VERSION) {
    snprintf(err, errlen, "%.300s: journal version %u, this build reads %u", path, ver, CKV_WARM_VERSION);
    r = CKV_ERR_FORMAT;
    goto out;
  }
  uint64_t sum;
  memcpy(&sum, p + len - 8, 8);
  if (XXH64(p, len - 8, 0) != sum) {
    snprintf(err, errlen, "%.300s: checksum mismatch (truncated or damaged)", path);
    goto out;
  }
  cur c = {.p = p, .n = len - 8, .at = 16};
  uint64_t written = get_u64(&c), owner = get_u64(&c);
  nt = get_u32(&c);
  if (c.short_ || nt > 4096) {
    snprintf(err, errlen, "%.300s: %u tenants", path, nt);
    goto out;
  }
  ts = calloc(nt ? nt : 1, sizeof(*ts));
  if (!ts) {
    r = -ENOMEM;
    goto out;
  }
  for (uint32_t i = 0; i < nt; i++) {
    jtenant *t = &ts[i];
    bool ok = get_str(&c, t->name, sizeof t->name) && t->name[0];
    t->generation = get_u64(&c);
    t->bytes = get_u64(&c);
    t->quota = get_u64(&c);
    t->max_sessions = get_u32(&c);
    t->max_clients = get_u32(&c);
    t->policies = get_u32(&c);
    t->default_policy = (int32_t)get_u32(&c);
    t->n_sessions = get_u32(&c);
    if (!ok || c.short_ || t->n_sessions > (1u << 20) || !t->generation) {
      snprintf(err, errlen, "%.300s: tenant %u does not parse", path, i);
      goto out;
    }
    t->ids = calloc(t->n_sessions ? t->n_sessions : 1, sizeof(*t->ids));
    if (!t->ids) {
      r = -ENOMEM;
      goto out;
    }
    for (uint32_t k = 0; k < t->n_sessions; k++)
      if (!get_str(&c, t->ids[k], sizeof t->ids[k]) || !t->ids[k][0] || strchr(t->ids[k], '/')) {
        snprintf(err, errlen, "%.300s: session %u of tenant '%s' does not parse", path, k, t->name);
        goto out;
      }
  }
  if (c.at != c.n) {
    snprintf(err, errlen, "%.300s: %zu bytes after the last tenant", path, c.n - c.at);
    goto out;
  }
  *ret = ts;
  *ret_n = nt;
  *ret_written = written;
  *ret_owner = owner;
  *ret_sum = sum;
  ts = NULL;
  r = CKV_OK;
out:
  if (ts) jtenants_free(ts, nt);
  free(p);
  return r;
}

static void drop_arena_fd(ckv_fdstore_arena *a, const char *why) {
  if (a->fd < 0) return;
  ckv_log(CKV_LOG_WARNING, "warm-arena-dropped", NULL, NULL, "arena %016" PRIx64 " from the fd store dropped: %s",
          a->generation, why);
  close(a->fd);
  a->fd = -1;
  ckv_fdstore_remove_arena(a->generation, a->owner);
}

static void session_dropped_name(ckv_persist *p, const char *tenant, const char *id, const char *err) {
  ckv_log(CKV_LOG_WARNING, "warm-session-dropped", tenant, id, "not kept across the restart: %s", err);
  note_dropped(p, tenant, id, "%.190s", err);
}

static void session_dropped(ckv_persist *p, const ckv_tenant *t, const char *id, const char *err) {
  session_dropped_name(p, t->name, id, err);
}

/* Reads session `id`'s journal entry into *snap and checks it against what
 * outlived the daemon that wrote it; false (logged, noted) when it is not
 * to be kept.  Runs for every session of the tenant before any is rebuilt:
 * the checks read the arena's block headers as the killed daemon left them. */
static bool load_entry(ckv_persist *p, ckv_tenant *t, const char *id, const ckv_warmlog_rec *rec, ckv_snap *snap) {
  char path[4096], err[512] = "", why[512];
  int r;
  if (rec) { /* its last record in the log (warmlog.h), checked there; the entry is checked here */
    r = ckv_snap_parse(rec->entry, rec->entry_len, snap, err, sizeof err);
  } else {
    r = ckv_snapdir_area_file(p->opt.state_dir, CKV_WARM_AREA, t->name, id, path, sizeof path);
    if (r == CKV_OK)
      r = ckv_snapdir_read(path, snap, err, sizeof err);
    else
      snprintf(err, sizeof err, "no journal entry path: %s", ckv_strerror(r));
  }
  if (r < 0) {
    snprintf(why, sizeof why, "its journal %s was refused (%.300s)", rec ? "record" : "entry", err);
    session_dropped(p, t, id, why);
    return false;
  }
  const char *bad = NULL;
  /* The conversation the entry holds must still be the id's current one:
   * a DropSession (or a new open of the id) recorded after the entry was
   * written must not be undone by a crash (DESIGN.md invariant 10). */
  uint64_t current = 0;
  if (ckv_incarnations_get(p->incarnations, t->name, id, &current) == CKV_OK && current != snap->incarnation) {
    snprintf(why, sizeof why,
             current ? "the id's conversation was replaced after its journal entry was written (incarnation "
                       "%016llx, the entry holds %016llx)"
                     : "the conversation was ended (dropped or expired) after its journal entry was written",
             (unsigned long long)current, (unsigned long long)snap->incarnation);
    bad = why;
  }
  /* Every block the entry names must still be that block: the arena's
   * header at its offset (as the daemon that wrote the entry left it) has
   * the same magic, format, capacity and generation (the block's id, new at
   * every allocation).  A block freed and handed out again since fails
   * here, whatever the holds did or did not prevent. */
  for (size_t i = 0; !bad && i < snap->n_blocks; i++) {
    const ckv_snap_block *sb = &snap->blocks[i];
    const uint64_t size = ckv_arena_size(t->arena);
    if (sb->arena_offset < CKV_ARENA_HEADER_BYTES || sb->arena_offset > size ||
        sizeof(ckv_block_header) > size - sb->arena_offset)
      continue; /* refused with its reason by the restore */
    ckv_block_header now, then;
    memcpy(&now, ckv_tenant_ptr(t, sb->arena_offset), sizeof now);
    memcpy(&then, sb->meta, sizeof then);
    if (now.magic != then.magic || now.format != then.format || now.capacity != then.capacity ||
        now.generation != then.generation) {
      snprintf(why, sizeof why,
               "block %u at offset %llu is no longer the block its journal entry names (arena header: format %u, "
               "%u slots, generation %llu; the entry: format %u, %u slots, generation %llu)",
               sb->index, (unsigned long long)sb->arena_offset, now.format, now.capacity,
               (unsigned long long)now.generation, then.format, then.capacity, (unsigned long long)then.generation);
      bad = why;
    }
  }
  if (bad) {
    session_dropped(p, t, id, bad);
    ckv_snap_done(snap);
    return false;
  }
  return true;
}

/* Rebuilds session `id` of t from its checked journal entry (consumed); logs and notes a drop. */
static bool rebuild_session(ckv_persist *p, ckv_tenant *t, const char *id, const char *from, ckv_snap *snapp) {
  char err[512] = "";
  int r;
  ckv_snap snap = *snapp;
  ckv_srv_session *sess = NULL;
  ckv_snap_expect e = {.tenant = t->name};
  if ((r = ckv_snap_check_identity(&snap, &e, err, sizeof err)) == CKV_OK && strcmp(snap.session_id, id) != 0) {
    snprintf(err, sizeof err, "the entry names session '%.128s'", snap.session_id);
    r = CKV_ERR_CORRUPT;
  }
  if (r == CKV_OK)
    r = ckv_session_snap_restore_kept(&snap, id, t, p->opt.policy ? p->opt.policy->mlp : NULL, &p->store->next_block_id,
                                      &sess, err, sizeof err);
  ckv_snap_done(&snap);
  if (r == CKV_OK && (r = ckv_srv_session_flush_meta(sess)) < 0) {
    snprintf(err, sizeof err, "cannot write the rebuilt headers: %s", ckv_strerror(r));
    sess = ckv_srv_session_free(sess);
  }
  if (r == CKV_OK && (r = ckv_store_add_session(p->store, sess, /* owner= */ 0)) < 0) { /* sess freed */
    snprintf(err, sizeof err, "out of memory");
    sess = NULL;
  }
  if (r < 0) {
    session_dropped(p, t, id, err);
    return false;
  }
  /* detached: its worker resumes it (OpenSession resume) within detach_keep */
  sess->detached_at_ms = ckv_now_ms();
  sess->warm_unresumed = true;
  ckv_log(CKV_LOG_INFO, "warm-session-kept", t->name, id,
          "kept across the restart on its blocks (%s): %zu tokens (%llu draft, %llu staged, %llu committed, %llu "
          "recycled), epoch %llu",
          from, sess->tokens.n, (unsigned long long)sess->count_by_state[0], (unsigned long long)sess->count_by_state[1],
          (unsigned long long)sess->count_by_state[2], (unsigned long long)sess->count_by_state[3],
          (unsigned long long)sess->epoch);
  return true;
}

/* The log that follows the manifest (warmlog.h), applied over jt: what it
 * holds, what was cut and why, is logged.  A log of another checkpoint is
 * ignored (that checkpoint's manifest replaced it, with everything in it). */
static void read_log(ckv_persist *p, uint64_t msum, jtenant *jt, size_t n_jt, ckv_warmlog *wl) {
  char err[512] = "";
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/%s", p->opt.state_dir, CKV_WARM_AREA);
  int r = ckv_warmlog_read(dir, msum, wl, err, sizeof err);
  if (r == -ENOENT) return; /* a clean stop's journal, or an older daemon's */
  if (r == -ESTALE) {
    ckv_log(CKV_LOG_INFO, "warm-log", NULL, NULL, "warm journal log ignored: %s", err);
    return;
  }
  if (r < 0) {
    ckv_log(CKV_LOG_ERROR, "warm-log-cut", NULL, NULL,
            "warm journal log refused (%s): sessions come back as of the checkpoint, without any record after it",
            err);
    return;
  }
  if (wl->cut[0])
    ckv_log(CKV_LOG_WARNING, "warm-log-cut", NULL, NULL,
            "warm journal log cut at its last good record (%zu record(s), %llu of %llu bytes kept): %s", wl->n,
            (unsigned long long)wl->good_bytes, (unsigned long long)wl->file_bytes, wl->cut);
  else
    ckv_log(CKV_LOG_INFO, "warm-log", NULL, NULL, "warm journal log read whole: %zu record(s), %llu bytes", wl->n,
            (unsigned long long)wl->file_bytes);
  if (apply_log(p, jt, n_jt, wl) < 0) {
    ckv_log(CKV_LOG_ERROR, "warm-log-cut", NULL, NULL,
            "out of memory applying the warm journal log: sessions come back as of the checkpoint");
  }
}

void ckv_warm_start(ckv_persist *p) {
  ckv_fdstore_arena *fds = NULL;
  size_t n_fds = 0;
  ckv_fdstore_take_arenas(&fds, &n_fds);
  jtenant *jt = NULL;
  size_t n_jt = 0;
  uint64_t written = 0, owner = 0, msum = 0;
  char path[4096], err[512] = "";
  int r = -ENOENT;
  if (p->opt.state_dir && *p->opt.state_dir && manifest_path(p, path, sizeof path) == CKV_OK)
    r = read_manifest(path, &jt, &n_jt, &written, &owner, &msum, err, sizeof err);
  if (r == CKV_OK) {
    char marker[4200];
    snprintf(marker, sizeof marker, "%s/%s/%s", p->opt.state_dir, CKV_WARM_AREA, CKV_WARM_STOPPED);
    bool clean = access(marker, F_OK) == 0;
    unlink(marker); /* this daemon's checkpoints are no clean stop's */
    if (!clean && memory_of(p)) p->warm->killed_with_journal = true;
    if (!clean)
      ckv_log(CKV_LOG_WARNING, "warm-journal-killed", NULL, NULL,
              "the daemon before this one did not stop cleanly: its sessions come back as of their last durable "
              "warm-journal record (every change it answered)");
  }
  if (r < 0 && r != -ENOENT)
    ckv_log(CKV_LOG_ERROR, "warm-journal-refused", NULL, NULL,
            "warm-restart journal refused, no session is kept from it: %s", err);
  bool unclean = r == -ENOENT && n_fds;
  if (unclean && memory_of(p)) p->warm->unclean = true;
  if (unclean)
    ckv_log(CKV_LOG_WARNING, "warm-journal-missing", NULL, NULL,
            "the fd store holds %zu arena(s) but there is no journal: the previous daemon did not stop cleanly "
            "(killed or crashed); its sessions are not kept (saved ones come back from their snapshots)",
            n_fds);
  if (r == CKV_OK && !warm_enabled(p)) {
    ckv_log(CKV_LOG_WARNING, "warm-journal-refused", NULL, NULL,
            "a warm-restart journal of %zu tenant(s) is here, but this daemon runs without systemd's fd store or "
            "on another backend: nothing kept",
            n_jt);
    r = CKV_ERR_UNSUPPORTED;
  }
  ckv_warmlog wl = {0};
  if (r == CKV_OK) read_log(p, msum, jt, n_jt, &wl);
  size_t kept = 0, lost = 0;
  for (size_t i = 0; r == CKV_OK && i < n_jt; i++) {
    jtenant *j = &jt[i];
    ckv_fdstore_arena *a = NULL;
    bool later = false; /* the arena is there, stored by a later daemon than the journal's writer */
    for (size_t k = 0; k < n_fds && !a; k++)
      if (fds[k].fd >= 0 && fds[k].generation == j->generation) {
        if (fds[k].owner == owner)
          a = &fds[k];
        else
          later = true;
      }
    const char *why = NULL;
    ckv_arena *arena = NULL;
    char whybuf[200];
    if (!a) {
      why = later ? "the journal is stale: a later daemon held its arena since (and changed it)"
                  : "systemd did not hand its arena back";
    } else {
      ckv_arena_desc d;
      memset(&d, 0, sizeof d);
      snprintf(d.kind, sizeof d.kind, "%s", ckv_arena_host_backend.name);
      d.bytes = j->bytes;
      d.generation = j->generation;
      d.committed = j->bytes;
      d.n_fds = 1;
      d.fds[0] = a->fd;
      int ar = ckv_arena_adopt(&d, &arena);
      if (ar < 0) {
        snprintf(whybuf, sizeof whybuf, "its arena (%llu bytes) cannot be adopted: %s", (unsigned long long)j->bytes,
                 ckv_strerror(ar));
        why = whybuf;
      }
    }
    if (!why && ckv_store_find_tenant(p->store, j->name)) why = "the journal names the tenant twice";
    if (!why && ckv_store_arenas_bytes(p->store) + j->bytes > p->store->limits.memory_bytes)
      why = "its arena no longer fits [daemon] memory";
    ckv_tenant *t = NULL;
    if (!why && ckv_store_reserve_tenant(p->store) < 0) why = "out of memory";
    if (!why) {
      uint64_t holds = ckv_tenant_quota_for_arena(j->bytes);
      int tr = ckv_tenant_adopt(j->name, j->quota && j->quota < holds ? j->quota : holds, arena,
                                (uint32_t)p->store->n_tenants + 1, &t);
      arena = NULL; /* the tenant's now, also on failure */
      if (tr < 0) {
        snprintf(whybuf, sizeof whybuf, "cannot set up its tenant: %s", ckv_strerror(tr));
        why = whybuf;
      }
    }
    ckv_arena_free(arena); /* not adopted: an importer-side unmap of the memfd (the header stays as it is) */
    if (why) {
      ckv_log(CKV_LOG_WARNING, "warm-tenant-dropped", j->name, NULL, "%u session(s) not kept across the restart: %s",
              j->n_sessions, why);
      for (uint32_t k = 0; k < j->n_sessions; k++) note_dropped(p, j->name, j->ids[k], "%s", why);
      lost += j->n_sessions;
      if (a) drop_arena_fd(a, why);
      continue;
    }
    close(a->fd); /* the arena keeps a duplicate; the store keeps its own */
    a->fd = -1;
    /* Ours from now on: stored again under this daemon's tag (the store's
     * tenant_up hook, ckv_warm_tenant_up), so this journal (replaced below,
     * but a copy may linger) never matches it again.  Removed first: the
     * store keeps one entry per open file and ignores a second name for it. */
    ckv_fdstore_remove_arena(a->generation, a->owner);
    ckv_tenant_spec limits = {.name = j->name,
                              .max_sessions = j->max_sessions,
                              .max_clients = j->max_clients,
                              .policies = j->policies,
                              .default_policy = j->default_policy};
    ckv_store_add_tenant(p->store, t, &limits);
    size_t tk = 0;
    ckv_snap *snaps = calloc(j->n_sessions ? j->n_sessions : 1, sizeof(*snaps));
    bool *ok = calloc(j->n_sessions ? j->n_sessions : 1, sizeof(*ok));
    for (uint32_t k = 0; snaps && ok && k < j->n_sessions; k++)
      ok[k] = load_entry(p, t, j->ids[k], j->rec ? j->rec[k] : NULL, &snaps[k]);
    for (uint32_t k = 0; k < j->n_sessions; k++) {
      if (snaps && ok) {
        char from[80] = "from the checkpoint";
        if (j->rec && j->rec[k])
          snprintf(from, sizeof from, "from log record %llu", (unsigned long long)j->rec[k]->seq);
        if (ok[k]) tk += rebuild_session(p, t, j->ids[k], from, &snaps[k]);
      } else {
        session_dropped(p, t, j->ids[k], "out of memory");
      }
    }
    free(snaps);
    free(ok);
    /* Memory no kept block holds (dropped sessions, freed blocks, warm
     * chunks) reads zero from here on: no stale K/V shows through. */
    uint64_t failed = ckv_slab_scrub(t->slab);
    ckv_log(CKV_LOG_NOTICE, "warm-tenant-kept", t->name, NULL,
            "arena %u (%016" PRIx64 ", %llu bytes) kept across the restart with %zu of %u session(s)%s", t->arena_id,
            ckv_arena_generation(t->arena), (unsigned long long)ckv_arena_size(t->arena), tk, j->n_sessions,
            failed ? "; some free chunks could not be discarded (they are cleared when used)" : "");
    kept += tk;
    lost += j->n_sessions - tk;
  }
  for (size_t k = 0; k < n_fds; k++)
    drop_arena_fd(&fds[k], r == CKV_OK ? "no tenant of the journal has it" : "no usable journal");
  if (r == CKV_OK)
    ckv_log(CKV_LOG_NOTICE, "warm-restart", NULL, NULL,
            "warm restart: %zu session(s) kept, %zu dropped (journal written %llu ms before)", kept, lost,
            (unsigned long long)(now_ms_real() > written ? now_ms_real() - written : 0));
  p->counters.warm_kept = kept;
  p->counters.warm_dropped = lost;
  /* Consumed: a later start (after a crash of this daemon) must never read
   * a journal of arenas that have moved on since.  With the continuous
   * journal (warmjournal.h) this daemon's first checkpoint replaces it at
   * once (the kept sessions under this daemon's tag, the rest removed), or
   * ckv_warm_discard removes it when that cannot be written. */
  if (p->opt.state_dir && *p->opt.state_dir && !p->journal) remove_journal(p);
  jtenants_free(jt, n_jt);
  ckv_warmlog_done(&wl); /* after the rebuild: the records pointed into it */
  free(fds);
}

void ckv_warm_discard(ckv_persist *p) {
  if (p->opt.state_dir && *p->opt.state_dir) remove_journal(p);
}

void ckv_warm_tenant_up(ckv_persist *p, ckv_tenant *t) {
  if (!warm_enabled(p)) return;
  if (p->journal) t->journal_hold = true; /* its frees wait for the journal (warmjournal.h) */
  ckv_arena_desc d;
  if (ckv_arena_export(t->arena, &d) < 0 || d.n_fds != 1) return;
  (void)ckv_fdstore_put_arena(d.fds[0], ckv_arena_generation(t->arena), owner_tag(p));
}

/* ---- stop ---- */

/* ckv_warm_sweep's keep at the stop: entries of sessions the store still holds. */
static bool in_store(void *ctx, const char *tenant, const char *id) {
  const ckv_persist *p = ctx;
  char key[400];
  snprintf(key, sizeof key, "%s/%s", tenant, id);
  return ckv_strmap_get(p->store->sessions, key) != NULL;
}

size_t ckv_warm_stop(ckv_persist *p) {
  if (!warm_enabled(p)) return 0;
  char top[4096], err[512];
  if (snprintf(top, sizeof top, "%s/%s", p->opt.state_dir, CKV_WARM_AREA) >= (int)sizeof top) return 0;
  /* The continuous journal's last checkpoint stays until this one's
   * manifest replaces it (a kill during the stop finds it); without it, a
   * half-written journal of an earlier stop goes first. */
  bool continuous = p->journal != NULL; /* its writer stopped by the caller (ckv_persist_warm_stop) */
  if (!continuous) remove_journal(p);
  if (mkdir(top, 0700) < 0 && errno != EEXIST) {
    ckv_log(CKV_LOG_ERROR, "warm-journal-failed", NULL, NULL, "cannot create %s: %s; nothing is kept", top,
            strerror(errno));
    for (size_t i = 0; i < p->store->n_tenants; i++)
      ckv_fdstore_remove_arena(ckv_arena_generation(p->store->tenants[i]->arena), owner_tag(p));
    return 0;
  }
  buf m = {0};
  put_head(&m, p);
  size_t kept = 0, skipped = 0;
  for (size_t i = 0; i < p->store->n_tenants; i++) {
    ckv_tenant *t = p->store->tenants[i];
    size_t count_at;
    put_tenant(&m, t, &count_at);
    uint32_t n = 0;
    char dir[4096];
    bool have_dir = ckv_snapdir_area_dir(p->opt.state_dir, CKV_WARM_AREA, t->name, 1, dir, sizeof dir, err,
                                         sizeof err) == CKV_OK;
    size_t cursor = 0;
    ckv_srv_session *sess;
    while (have_dir && (sess = ckv_strmap_next(p->store->sessions, &cursor, NULL))) {
      if (sess->tenant != t) continue;
      ckv_store_settle_session(p->store, sess);
      ckv_snap snap;
      /* only sessions whose bytes are all in the arena (an offload in
       * flight has them there too, and its file is abandoned with it) */
      ckv_tier_state ts = ckv_tier_state_of(sess);
      bool away = ts == CKV_TIER_ON_DISK || ts == CKV_TIER_RESTORING;
      int r = away || sess->quarantined ? CKV_ERR_STATE : ckv_srv_session_flush_meta(sess);
      if (r == CKV_OK)
        r = ckv_session_snap_capture_refs(sess, &snap, err, sizeof err);
      else
        snprintf(err, sizeof err, "%s",
                 away ? "its bytes are on the disk tier" : sess->quarantined ? "it is quarantined"
                                                                            : "its headers cannot be written");
      if (r == CKV_OK) {
        r = ckv_snap_write(dir, sess->id, &snap, NULL, err, sizeof err);
        ckv_snap_done(&snap);
      }
      if (r < 0) {
        ckv_log(CKV_LOG_WARNING, "warm-session-skipped", t->name, sess->id, "not journaled: %s", err);
        skipped++;
        continue;
      }
      put_str(&m, sess->id);
      n++;
    }
    if (!m.oom) memcpy(m.p + count_at, &n, 4);
    kept += n;
  }
  uint64_t sum = m.oom ? 0 : XXH64(m.p, m.n, 0);
  put_u64(&m, sum);
  /* temporary file, fsync, rename, directory fsync: the same writer as the continuous journal's */
  int r = m.oom ? -ENOMEM : ckv_warm_manifest_write(p->opt.state_dir, m.p, m.n, err, sizeof err);
  free(m.p);
  if (r < 0) {
    ckv_log(CKV_LOG_ERROR, "warm-journal-failed", NULL, NULL,
            "cannot write the warm-restart journal: %s; nothing is kept", ckv_strerror(r));
    remove_journal(p);
    /* the arenas are freed as usual: the store must not offer them either */
    for (size_t i = 0; i < p->store->n_tenants; i++)
      ckv_fdstore_remove_arena(ckv_arena_generation(p->store->tenants[i]->arena), owner_tag(p));
    return 0;
  }
  /* the continuous journal's records: all in this journal now */
  ckv_warmlog_remove(top);
  if (continuous) ckv_warm_sweep(p, in_store, p); /* entries of sessions gone since the last checkpoint */
  { /* this journal is a clean stop's (said at the next start; a checkpoint's is a killed daemon's) */
    char marker[4200];
    snprintf(marker, sizeof marker, "%s/%s", top, CKV_WARM_STOPPED);
    int mfd = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (mfd >= 0) close(mfd);
  }
  /* Hand the arenas on: no block goes back to an allocator (no hole is
   * punched) and no header is retired while the sessions are freed. */
  for (size_t i = 0; i < p->store->n_tenants; i++) ckv_tenant_keep(p->store->tenants[i]);
  ckv_log(CKV_LOG_NOTICE, "warm-journal", NULL, NULL,
          "warm-restart journal written: %zu tenant(s), %zu session(s) kept in their arenas, %zu not journaled",
          p->store->n_tenants, kept, skipped);
  return kept;
}
