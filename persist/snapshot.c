/* snapshot.c - the snapshot file format: writer and validating reader (see
 * snapshot.h and docs/snapshot.md, which this code must match byte by byte).
 *
 * Layout: a 16-byte preamble (magic, version, the version's complement),
 * then sections, each a 24-byte header (type, reserved, length, XXH64 of
 * the header's first 16 bytes and the payload) and its payload: HEADER,
 * TOKENS, IDS, one BLOCK per block, END.  END counts the sections before it
 * and their bytes, so a file cut at any section boundary is refused as
 * truncated, like one cut inside a section. */
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include "common/fail.h"
#include "persist/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "commitkv/status.h"
#include "kernels/quant.h"
#include "lifecycle/policy.h"

static const uint8_t k_magic[8] = {'C', 'K', 'V', 'S', 'N', 'A', 'P', 0};

/* Bounds a file may claim before anything is allocated for it. */
#define MAX_TOKENS (UINT64_C(1) << 32)
#define MAX_TABLE (UINT32_C(1) << 24)
#define MAX_PARAMS 64u
#define MAX_HEADER_BYTES (64u << 10)
#define BLOCK_DESC_BYTES 32u

static const char *section_name(uint32_t type) {
  switch (type) {
    case CKV_SNAP_SEC_HEADER: return "header";
    case CKV_SNAP_SEC_TOKENS: return "tokens";
    case CKV_SNAP_SEC_IDS: return "ids";
    case CKV_SNAP_SEC_BLOCK: return "block";
    case CKV_SNAP_SEC_END: return "end";
    default: return "unknown";
  }
}

/* ---- little-endian encoding (the host is little-endian: x86-64, arm64) ---- */

typedef struct wbuf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
  bool count_only; /* ckv_snap_file_size: n grows, nothing is stored */
} wbuf;

static void put(wbuf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->count_only) {
    b->n += n;
    return;
  }
  if (b->n + n > b->cap) {
    size_t ncap = b->cap ? b->cap : 4096;
    while (ncap < b->n + n) ncap *= 2;
    uint8_t *np = realloc(b->p, ncap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = ncap;
  }
  if (n) memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_f64(wbuf *b, double v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s) {
  uint32_t n = (uint32_t)strlen(s);
  put_u32(b, n);
  put(b, s, n);
}

typedef struct rcur {
  const uint8_t *p;
  size_t n, off;
  bool bad;
} rcur;

static const uint8_t *get(rcur *c, size_t n) {
  if (c->bad || n > c->n - c->off) {
    c->bad = true;
    return NULL;
  }
  const uint8_t *r = c->p + c->off;
  c->off += n;
  return r;
}
static uint32_t get_u32(rcur *c) {
  const uint8_t *p = get(c, 4);
  uint32_t v = 0;
  if (p) memcpy(&v, p, 4);
  return v;
}
static uint64_t get_u64(rcur *c) {
  const uint8_t *p = get(c, 8);
  uint64_t v = 0;
  if (p) memcpy(&v, p, 8);
  return v;
}
static double get_f64(rcur *c) {
  const uint8_t *p = get(c, 8);
  double v = 0;
  if (p) memcpy(&v, p, 8);
  return v;
}
/* A length-prefixed string of at most `max` bytes without NUL into out[max+1]. */
static bool get_str(rcur *c, char *out, size_t max) {
  uint32_t n = get_u32(c);
  if (c->bad || n > max) return false;
  const uint8_t *p = get(c, n);
  if (!p || memchr(p, 0, n)) return false;
  memcpy(out, p, n);
  out[n] = 0;
  return true;
}

static uint64_t section_hash(const uint8_t head16[16], const void *a, size_t alen, const void *b, size_t blen) {
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  XXH64_update(&st, head16, 16);
  if (alen) XXH64_update(&st, a, alen);
  if (blen) XXH64_update(&st, b, blen);
  return XXH64_digest(&st);
}

/* ---- the format table: what each block format's bytes are at this geometry ---- */

/* Capacity of blocks of `fmt` in the session described by s. */
static uint32_t capacity_of(const ckv_snap *s, uint32_t fmt) {
  return fmt == CKV_FORMAT_DRAFT ? s->draft_tokens : fmt == CKV_FORMAT_STAGED ? s->staged_tokens : s->commit_tokens;
}

/* ---- writer ---- */

static void header_payload(wbuf *b, const ckv_snap *s, const uint32_t kept[CKV_FORMAT_COUNT_]) {
  put_u64(b, s->saved_at_ms);
  put_str(b, s->tenant);
  put_str(b, s->session_id);
  put_str(b, s->model_id);
  put_str(b, s->model_revision);
  put_u32(b, s->flags);
  put_u64(b, s->dropped_tokens);
  put_u32(b, s->geom.n_layers);
  put_u32(b, s->geom.n_kv_heads);
  put_u32(b, s->geom.head_dim);
  put_u32(b, s->geom.dtype);
  put_u32(b, s->draft_tokens);
  put_u32(b, s->staged_tokens);
  put_u32(b, s->commit_tokens);
  put_u32(b, CKV_ROT_SEED);
  /* block formats: those valid at this geometry, with their byte sizes */
  uint32_t n_fmt = 0;
  for (uint32_t f = 0; f < CKV_FORMAT_COUNT_; f++)
    n_fmt += ckv_format_block_bytes(f, &s->geom, capacity_of(s, f), kept[f]) != 0;
  put_u32(b, n_fmt);
  for (uint32_t f = 0; f < CKV_FORMAT_COUNT_; f++) {
    uint64_t bytes = ckv_format_block_bytes(f, &s->geom, capacity_of(s, f), kept[f]);
    if (!bytes) continue;
    put_u32(b, f);
    put_u32(b, capacity_of(s, f));
    put_u32(b, kept[f]);
    put_u32(b, (uint32_t)ckv_block_payload_offset(capacity_of(s, f)));
    put_u64(b, bytes);
  }
  /* policy */
  put_u32(b, (uint32_t)s->params.policy);
  put_u32(b, s->params_mlp);
  put_u32(b, (uint32_t)ckv_judge_param_count);
  for (size_t i = 0; i < ckv_judge_param_count; i++) {
    put_str(b, ckv_judge_param_table[i].name);
    put_f64(b, ckv_judge_param_get(&s->params, &ckv_judge_param_table[i]));
  }
  put_u64(b, s->epoch);
  put_u64(b, s->rounds);
  put_u64(b, s->last_round);
  put_u64(b, s->semantic_given);
  for (int i = 0; i < 4; i++) put_u64(b, s->count_by_state[i]);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) put_u64(b, s->transitions[i][j]);
  put_u32(b, CKV_FORMAT_COUNT_);
  for (int f = 0; f < CKV_FORMAT_COUNT_; f++) put_u32(b, s->fill[f]);
  put_u64(b, s->tokens.n);
  put_u32(b, s->n_table);
  put_u32(b, (uint32_t)s->n_blocks);
  put_u64(b, s->n_ids);
  put_u64(b, s->incarnation); /* version 3 */
}

static void tokens_payload(wbuf *b, const ckv_tokens *t) {
  size_t n = t->n;
  put(b, t->state, n);
  put(b, t->role, n);
  put(b, t->tags, n);
  put(b, t->flags, n);
  put(b, t->block, n * 4);
  put(b, t->slot, n * 2);
  put(b, t->semantic, n * 2);
  put(b, t->attn, n * CKV_ATTN_HISTORY);
  put(b, t->last_attended, n * 4);
  put(b, t->last_transition, n * 4);
  put(b, t->cum_attn, n * 4);
}

typedef struct writer {
  FILE *f;
  uint64_t written;
  uint32_t sections;
} writer;

static bool write_section(writer *w, uint32_t type, const void *a, size_t alen, const void *b, size_t blen) {
  uint8_t head[CKV_SNAP_SECTION_HEADER_BYTES];
  uint32_t reserved = 0;
  uint64_t len = alen + blen;
  memcpy(head, &type, 4);
  memcpy(head + 4, &reserved, 4);
  memcpy(head + 8, &len, 8);
  uint64_t h = section_hash(head, a, alen, b, blen);
  memcpy(head + 16, &h, 8);
  if (fwrite(head, sizeof head, 1, w->f) != 1) return false;
  if (alen && fwrite(a, alen, 1, w->f) != 1) return false;
  if (blen && fwrite(b, blen, 1, w->f) != 1) return false;
  w->written += sizeof head + len;
  w->sections++;
  return true;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int r = fsync(fd) < 0 ? -errno : CKV_OK;
  close(fd);
  return r;
}

/* CKV_TEST_SNAP_WRITE_DELAY_MS=N (tests only; documented in
 * docs/snapshot.md): every write sleeps N ms (at most 60 s) once its
 * temporary file exists, so a test can act while a save is in flight
 * (tests/integration/test_snapshot_faults.c).  Unset: no delay. */
static void test_write_delay(void) {
  const char *v = getenv("CKV_TEST_SNAP_WRITE_DELAY_MS");
  long ms = v ? strtol(v, NULL, 10) : 0;
  if (ms <= 0) return;
  if (ms > 60000) ms = 60000;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

/* The dimensions each committed format keeps: the blocks' own, else what
 * the session would allocate. */
static void kept_of(const ckv_snap *snap, uint32_t kept[CKV_FORMAT_COUNT_]) {
  memset(kept, 0, CKV_FORMAT_COUNT_ * sizeof(*kept));
  for (size_t i = 0; i < snap->n_blocks; i++)
    if (snap->blocks[i].format < CKV_FORMAT_COUNT_) kept[snap->blocks[i].format] = snap->blocks[i].kept;
  for (uint32_t f = 0; f < CKV_FORMAT_COUNT_; f++)
    if (ckv_format_is_commit(f) && !kept[f]) {
      double keep = snap->params.prune_keep > 0.f && snap->params.prune_keep < 1.f ? snap->params.prune_keep : 1.0;
      long k = lround(keep * snap->geom.head_dim);
      kept[f] = (uint32_t)(k < 1 ? 1 : k > (long)snap->geom.head_dim ? (long)snap->geom.head_dim : k);
    }
}

/* The same sections ckv_snap_write writes, counted instead of written. */
uint64_t ckv_snap_file_size(const ckv_snap *snap) {
  uint32_t kept[CKV_FORMAT_COUNT_];
  kept_of(snap, kept);
  wbuf hb = {.count_only = true}, tb = {.count_only = true};
  header_payload(&hb, snap, kept);
  tokens_payload(&tb, &snap->tokens);
  uint64_t sh = CKV_SNAP_SECTION_HEADER_BYTES;
  uint64_t n = CKV_SNAP_PREAMBLE_BYTES + (sh + hb.n) + (sh + tb.n) + (sh + (uint64_t)snap->n_ids * 8u);
  for (size_t i = 0; i < snap->n_blocks; i++) {
    const ckv_snap_block *bl = &snap->blocks[i];
    uint64_t body = snap->flags & CKV_SNAP_BLOCK_REFS ? ckv_block_payload_offset(bl->capacity) + 16u : bl->bytes;
    n += sh + BLOCK_DESC_BYTES + body;
  }
  return n + sh + 16u; /* the end section */
}

/* Every section of snap, from the preamble to the end section, to w->f;
 * false on a write error (errno says which). */
static bool write_body(writer *w, const ckv_snap *snap, const wbuf *hb, const wbuf *tb, const wbuf *ib,
                       uint8_t *scratch) {
  uint8_t pre[CKV_SNAP_PREAMBLE_BYTES];
  uint32_t ver = CKV_SNAP_VERSION, nver = ~ver;
  memcpy(pre, k_magic, 8);
  memcpy(pre + 8, &ver, 4);
  memcpy(pre + 12, &nver, 4);
  bool ok = fwrite(pre, sizeof pre, 1, w->f) == 1;
  w->written = sizeof pre;
  ok = ok && write_section(w, CKV_SNAP_SEC_HEADER, hb->p, hb->n, NULL, 0);
  ok = ok && write_section(w, CKV_SNAP_SEC_TOKENS, tb->p, tb->n, NULL, 0);
  ok = ok && write_section(w, CKV_SNAP_SEC_IDS, ib->p, ib->n, NULL, 0);
  for (size_t i = 0; ok && i < snap->n_blocks; i++) {
    const ckv_snap_block *bl = &snap->blocks[i];
    size_t head = ckv_block_payload_offset(bl->capacity);
    uint8_t desc[BLOCK_DESC_BYTES] = {0};
    uint32_t d32[6] = {bl->index, bl->format, bl->capacity, bl->used, bl->kept, 0};
    memcpy(desc, d32, sizeof d32);
    memcpy(desc + 24, &bl->bytes, 8);
    /* one buffer: descriptor | header region | payload (copied once: a
     * worker writing its draft slots must not make the hash lie) */
    memcpy(scratch, bl->meta, head);
    if (snap->flags & CKV_SNAP_BLOCK_REFS) { /* the payload stays in the kept arena */
      memcpy(scratch + head, &bl->arena_offset, 8);
      memcpy(scratch + head + 8, &bl->slab_offset, 8);
      ok = write_section(w, CKV_SNAP_SEC_BLOCK, desc, sizeof desc, scratch, head + 16);
      continue;
    }
    memcpy(scratch + head, bl->payload, bl->bytes - head);
    ok = write_section(w, CKV_SNAP_SEC_BLOCK, desc, sizeof desc, scratch, bl->bytes);
  }
  uint8_t end[16];
  uint32_t nsec = w->sections, zero = 0;
  uint64_t before = w->written;
  memcpy(end, &nsec, 4);
  memcpy(end + 4, &zero, 4);
  memcpy(end + 8, &before, 8);
  ok = ok && write_section(w, CKV_SNAP_SEC_END, end, sizeof end, NULL, 0);
  return ok && fflush(w->f) == 0;
}

/* The header, token and id payloads of snap, and a scratch buffer for its
 * largest block: CKV_OK or -ENOMEM (the caller frees all four either way). */
static int encode_parts(const ckv_snap *snap, wbuf *hb, wbuf *tb, wbuf *ib, uint8_t **ret_scratch) {
  uint32_t kept[CKV_FORMAT_COUNT_];
  kept_of(snap, kept);
  header_payload(hb, snap, kept);
  tokens_payload(tb, &snap->tokens);
  for (size_t i = 0; i < snap->n_ids; i++) {
    put_u32(ib, snap->ids[2 * i]);
    put_u32(ib, snap->ids[2 * i + 1]);
  }
  uint64_t max_payload = 0;
  for (size_t i = 0; i < snap->n_blocks; i++)
    if (snap->blocks[i].bytes > max_payload) max_payload = snap->blocks[i].bytes;
  *ret_scratch = malloc(max_payload + 16);
  return hb->oom || tb->oom || ib->oom || !*ret_scratch ? -ENOMEM : CKV_OK;
}

int ckv_snap_encode(const ckv_snap *snap, uint8_t **ret, size_t *ret_len) {
  wbuf hb = {0}, tb = {0}, ib = {0};
  uint8_t *scratch = NULL;
  char *buf = NULL;
  size_t len = 0;
  int r = encode_parts(snap, &hb, &tb, &ib, &scratch);
  writer w = {0};
  if (r == CKV_OK && !(w.f = open_memstream(&buf, &len))) r = -ENOMEM;
  if (r == CKV_OK && !write_body(&w, snap, &hb, &tb, &ib, scratch)) r = -ENOMEM;
  if (w.f && fclose(w.f) != 0 && r == CKV_OK) r = -ENOMEM;
  if (r == CKV_OK) {
    *ret = (uint8_t *)buf;
    *ret_len = len;
    buf = NULL;
  }
  free(buf);
  free(hb.p);
  free(tb.p);
  free(ib.p);
  free(scratch);
  return r;
}

int ckv_snap_write(const char *dir, const char *name, const ckv_snap *snap, uint64_t *ret_bytes, char *err,
                   size_t errlen) {
  char path[4096], tmp[4096];
  static _Atomic unsigned counter; /* the I/O thread and a caller on another thread may both write */
  if (snprintf(path, sizeof path, "%s/%s%s", dir, name, CKV_SNAP_SUFFIX) >= (int)sizeof path ||
      snprintf(tmp, sizeof tmp, "%s/%s%s" CKV_SNAP_TEMP_MARK "%ld~%u", dir, name, CKV_SNAP_SUFFIX, (long)getpid(),
               ++counter) >=
          (int)sizeof tmp)
    return ckv_fail(err, errlen, -ENAMETOOLONG, "snapshot path too long");
  wbuf hb = {0}, tb = {0}, ib = {0};
  uint8_t *scratch = NULL;
  int r = encode_parts(snap, &hb, &tb, &ib, &scratch);
  if (r < 0) {
    r = ckv_fail(err, errlen, -ENOMEM, "out of memory encoding the snapshot");
    goto out;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    r = ckv_fail(err, errlen, -errno, "cannot create %s: %s", tmp, strerror(errno));
    goto out;
  }
  writer w = {.f = fdopen(fd, "wb")};
  if (!w.f) {
    r = ckv_fail(err, errlen, -errno, "fdopen: %s", strerror(errno));
    close(fd);
    unlink(tmp);
    goto out;
  }
  test_write_delay();
  bool ok = write_body(&w, snap, &hb, &tb, &ib, scratch);
  if (!ok) {
    r = ckv_fail(err, errlen, errno ? -errno : -EIO, "writing %s: %s", tmp, strerror(errno ? errno : EIO));
  } else if (fsync(fileno(w.f)) < 0) {
    r = ckv_fail(err, errlen, -errno, "fsync %s: %s", tmp, strerror(errno));
  }
  if (fclose(w.f) != 0 && r == CKV_OK) r = ckv_fail(err, errlen, -errno, "closing %s: %s", tmp, strerror(errno));
  if (r == CKV_OK && rename(tmp, path) < 0) r = ckv_fail(err, errlen, -errno, "rename to %s: %s", path, strerror(errno));
  if (r < 0) {
    unlink(tmp);
    goto out;
  }
  if ((r = fsync_dir(dir)) < 0) {
    ckv_fail(err, errlen, r, "fsync of directory %s: %s", dir, strerror(-r));
    goto out;
  }
  if (ret_bytes) *ret_bytes = w.written;
out:
  free(hb.p);
  free(tb.p);
  free(ib.p);
  free(scratch);
  return r;
}

/* ---- reader ---- */

/* The preamble: CKV_ERR_CORRUPT or CKV_ERR_FORMAT with a text, else CKV_OK. */
static int check_preamble(const uint8_t *p, size_t len, uint32_t *ret_version, char *err, size_t errlen) {
  if (len < CKV_SNAP_PREAMBLE_BYTES)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "truncated: %zu bytes, shorter than the %u-byte preamble", len,
                CKV_SNAP_PREAMBLE_BYTES);
  if (memcmp(p, k_magic, 8) != 0) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "not a CommitKV snapshot (bad magic)");
  uint32_t ver, nver;
  memcpy(&ver, p + 8, 4);
  memcpy(&nver, p + 12, 4);
  if (ver != ~nver) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "preamble damaged (version word %#x, check %#x)", ver, nver);
  if (ver < CKV_SNAP_VERSION_MIN || ver > CKV_SNAP_VERSION)
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, "snapshot format version %u; this build reads versions %u to %u",
                    ver, CKV_SNAP_VERSION_MIN, CKV_SNAP_VERSION);
  *ret_version = ver;
  return CKV_OK;
}

typedef struct section {
  uint32_t type;
  const uint8_t *data;
  uint64_t len;
} section;

/* Reads the section at *off of buf (section number `no`, expected type
 * `want`), verifying its checksum. */
static int next_section(const uint8_t *buf, size_t len, size_t *off, uint32_t no, uint32_t want, section *ret,
                        char *err, size_t errlen) {
  size_t o = *off;
  if (o == len)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "truncated: the file ends after %u sections, before the %s section", no,
                section_name(want));
  if (len - o < CKV_SNAP_SECTION_HEADER_BYTES)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "truncated inside the header of section %u (%s)", no, section_name(want));
  uint32_t type;
  uint64_t slen, hash;
  memcpy(&type, buf + o, 4);
  memcpy(&slen, buf + o + 8, 8);
  memcpy(&hash, buf + o + 16, 8);
  if (slen > len - o - CKV_SNAP_SECTION_HEADER_BYTES)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "truncated: section %u (%s) claims %llu bytes, %zu are left", no,
                section_name(want), (unsigned long long)slen, len - o - CKV_SNAP_SECTION_HEADER_BYTES);
  const uint8_t *data = buf + o + CKV_SNAP_SECTION_HEADER_BYTES;
  if (section_hash(buf + o, data, slen, NULL, 0) != hash)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "section %u (%s) fails its checksum (xxh64)", no, section_name(want));
  if (type != want)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "section %u is of type %#x (%s), expected %s", no, type,
                section_name(type), section_name(want));
  *ret = (section){type, data, slen};
  *off = o + CKV_SNAP_SECTION_HEADER_BYTES + slen;
  return CKV_OK;
}

static bool geometry_ok(const ckv_snap *s) {
  const ckv_geometry *g = &s->geom;
  if (!ckv_format_valid(CKV_FORMAT_DRAFT, g, s->draft_tokens, 0) ||
      !ckv_format_valid(CKV_FORMAT_STAGED, g, s->staged_tokens, 0) ||
      !ckv_format_valid(CKV_FORMAT_COMMIT4, g, s->commit_tokens, 0))
    return false;
  return g->head_dim % 2 == 0;
}

static int parse_header(const section *sec, uint32_t version, ckv_snap *s, char *err, size_t errlen) {
  rcur c = {.p = sec->data, .n = sec->len};
  memset(s, 0, sizeof(*s));
  s->saved_at_ms = get_u64(&c);
  if (!get_str(&c, s->tenant, CKV_SNAP_TENANT_MAX) || !get_str(&c, s->session_id, CKV_SNAP_ID_MAX) ||
      !get_str(&c, s->model_id, CKV_SNAP_MODEL_MAX) || !get_str(&c, s->model_revision, CKV_SNAP_MODEL_MAX))
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: a name is too long, empty-terminated or cut");
  if (!s->session_id[0]) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: empty session id");
  s->flags = get_u32(&c);
  s->dropped_tokens = get_u64(&c);
  s->geom.n_layers = get_u32(&c);
  s->geom.n_kv_heads = get_u32(&c);
  s->geom.head_dim = get_u32(&c);
  s->geom.dtype = get_u32(&c);
  s->draft_tokens = get_u32(&c);
  s->staged_tokens = get_u32(&c);
  s->commit_tokens = get_u32(&c);
  uint32_t seed = get_u32(&c);
  if (c.bad) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header section too short");
  if (s->flags & ~(uint32_t)(CKV_SNAP_COMMITTED_ONLY | CKV_SNAP_BLOCK_REFS))
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, "header: unknown flags %#x", s->flags);
  if (!geometry_ok(s))
    return ckv_fail(err, errlen, CKV_ERR_FORMAT,
                "geometry %u layers x %u kv heads x %u dims (dtype %u), blocks %u/%u/%u tokens is not one this build "
                "accepts",
                s->geom.n_layers, s->geom.n_kv_heads, s->geom.head_dim, s->geom.dtype, s->draft_tokens,
                s->staged_tokens, s->commit_tokens);
  if (seed != CKV_ROT_SEED)
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, "rotation seed %#x; this build rotates with %#x", seed, CKV_ROT_SEED);
  uint32_t n_fmt = get_u32(&c);
  if (n_fmt > CKV_FORMAT_COUNT_) return ckv_fail(err, errlen, CKV_ERR_FORMAT, "header lists %u block formats", n_fmt);
  uint32_t seen = 0;
  for (uint32_t i = 0; i < n_fmt; i++) {
    uint32_t f = get_u32(&c), cap = get_u32(&c), kept = get_u32(&c), head = get_u32(&c);
    uint64_t bytes = get_u64(&c);
    if (c.bad) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header section too short (block formats)");
    if (f >= CKV_FORMAT_COUNT_ || (seen & (1u << f)))
      return ckv_fail(err, errlen, CKV_ERR_FORMAT, "block format %u unknown to this build (or listed twice)", f);
    seen |= 1u << f;
    uint64_t mine = ckv_format_block_bytes(f, &s->geom, cap, kept);
    if (cap != capacity_of(s, f) || mine != bytes || head != ckv_block_payload_offset(cap))
      return ckv_fail(err, errlen, CKV_ERR_FORMAT,
                  "block format %u: the snapshot's layout (%u tokens, %u channels, %llu bytes, payload at %u) is not "
                  "this build's (%llu bytes, payload at %zu)",
                  f, cap, kept, (unsigned long long)bytes, head, (unsigned long long)mine,
                  ckv_block_payload_offset(cap));
  }
  uint32_t policy = get_u32(&c), mlp = get_u32(&c), n_params = get_u32(&c);
  if (c.bad) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header section too short (policy)");
  if (policy >= CKV_POLICY_COUNT || mlp > 1 || n_params > MAX_PARAMS)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: policy %u, mlp %u, %u parameters", policy, mlp, n_params);
  ckv_judge_params_init(&s->params);
  s->params.policy = (int)policy;
  s->params_mlp = mlp;
  snprintf(s->policy, sizeof s->policy, "%s", ckv_policy_names[policy]);
  for (uint32_t i = 0; i < n_params; i++) {
    char name[64];
    if (!get_str(&c, name, sizeof name - 1)) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: parameter %u cut", i);
    double v = get_f64(&c);
    const ckv_judge_param *d = ckv_judge_param_find(name);
    if (!d) return ckv_fail(err, errlen, CKV_ERR_FORMAT, "policy parameter '%s' is unknown to this build", name);
    char why[160];
    if (ckv_judge_param_set(&s->params, d, v, why, sizeof why) < 0)
      return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: %s", why);
  }
  s->epoch = get_u64(&c);
  s->rounds = get_u64(&c);
  s->last_round = get_u64(&c);
  s->semantic_given = get_u64(&c);
  for (int i = 0; i < 4; i++) s->count_by_state[i] = get_u64(&c);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) s->transitions[i][j] = get_u64(&c);
  uint32_t n_fill = get_u32(&c);
  if (n_fill != CKV_FORMAT_COUNT_) return ckv_fail(err, errlen, CKV_ERR_FORMAT, "header: %u fill targets", n_fill);
  for (int f = 0; f < CKV_FORMAT_COUNT_; f++) s->fill[f] = get_u32(&c);
  uint64_t n_tokens = get_u64(&c);
  s->n_table = get_u32(&c);
  uint32_t n_blocks = get_u32(&c);
  uint64_t n_ids = get_u64(&c);
  if (version >= 3) s->incarnation = get_u64(&c);
  if (c.bad) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header section too short");
  if (c.off != c.n) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header section has %zu bytes too many", c.n - c.off);
  if (n_tokens > MAX_TOKENS || s->n_table > MAX_TABLE || n_blocks > s->n_table || n_ids > n_tokens ||
      s->last_round > UINT32_MAX || s->epoch == 0)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: %llu tokens, %u table entries, %u blocks, %llu ids, round %llu",
                (unsigned long long)n_tokens, s->n_table, n_blocks, (unsigned long long)n_ids,
                (unsigned long long)s->last_round);
  for (int f = 0; f < CKV_FORMAT_COUNT_; f++)
    if (s->fill[f] != CKV_NO_BLOCK && s->fill[f] >= s->n_table)
      return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "header: fill block %u of format %d beyond the table", s->fill[f], f);
  s->tokens.n = (size_t)n_tokens;
  s->n_blocks = n_blocks;
  s->n_ids = (size_t)n_ids;
  return CKV_OK;
}

static int parse_tokens(const section *sec, ckv_snap *s, char *err, size_t errlen) {
  size_t n = s->tokens.n;
  if (sec->len != (uint64_t)n * CKV_TOKENS_BYTES_PER_TOKEN)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "tokens section holds %llu bytes, %zu tokens need %llu",
                (unsigned long long)sec->len, n, (unsigned long long)n * CKV_TOKENS_BYTES_PER_TOKEN);
  ckv_tokens *t = &s->tokens;
  t->n = 0;
  if (n == 0) return CKV_OK; /* no columns to fill (they may not exist: memcpy to NULL) */
  if (ckv_tokens_reserve(t, n) < 0) return ckv_fail(err, errlen, -ENOMEM, "out of memory for %zu tokens", n);
  t->n = n;
  rcur c = {.p = sec->data, .n = sec->len};
  memcpy(t->state, get(&c, n), n);
  memcpy(t->role, get(&c, n), n);
  memcpy(t->tags, get(&c, n), n);
  memcpy(t->flags, get(&c, n), n);
  memcpy(t->block, get(&c, n * 4), n * 4);
  memcpy(t->slot, get(&c, n * 2), n * 2);
  memcpy(t->semantic, get(&c, n * 2), n * 2);
  memcpy(t->attn, get(&c, n * CKV_ATTN_HISTORY), n * CKV_ATTN_HISTORY);
  memcpy(t->last_attended, get(&c, n * 4), n * 4);
  memcpy(t->last_transition, get(&c, n * 4), n * 4);
  memcpy(t->cum_attn, get(&c, n * 4), n * 4);
  uint64_t counts[4] = {0};
  for (size_t p = 0; p < n; p++) {
    if (t->state[p] > CKV_STATE_RECYCLED || t->role[p] > 4 || t->tags[p] > 7 ||
        (t->flags[p] & ~(uint8_t)(CKV_TOKEN_SEM_GIVEN | CKV_TOKEN_FACT | CKV_TOKEN_WARM)))
      return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "token %zu: state %u, role %u, tags %#x, flags %#x", p, t->state[p],
                  t->role[p], t->tags[p], t->flags[p]);
    if (t->last_attended[p] > s->last_round || t->last_transition[p] > s->last_round || !isfinite(t->cum_attn[p]) ||
        t->cum_attn[p] < 0.f)
      return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "token %zu: rounds %u/%u after the last round %llu or bad attention", p,
                  t->last_attended[p], t->last_transition[p], (unsigned long long)s->last_round);
    if (t->state[p] != CKV_STATE_RECYCLED && t->block[p] == CKV_NO_BLOCK)
      return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "token %zu (state %u) has no block", p, t->state[p]);
    counts[t->state[p]]++;
  }
  for (int i = 0; i < 4; i++)
    if (counts[i] != s->count_by_state[i])
      return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "the header counts %llu tokens of state %d, the columns %llu",
                  (unsigned long long)s->count_by_state[i], i, (unsigned long long)counts[i]);
  return CKV_OK;
}

static int parse_ids(const section *sec, ckv_snap *s, char *err, size_t errlen) {
  if (sec->len != (uint64_t)s->n_ids * 8)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "ids section holds %llu bytes for %zu ids", (unsigned long long)sec->len,
                s->n_ids);
  s->ids = calloc(s->n_ids ? 2 * s->n_ids : 1, sizeof(*s->ids));
  if (!s->ids) return ckv_fail(err, errlen, -ENOMEM, "out of memory for %zu ids", s->n_ids);
  memcpy(s->ids, sec->data, s->n_ids * 8);
  return CKV_OK;
}

static int parse_block(const section *sec, ckv_snap *s, size_t i, char *err, size_t errlen) {
  if (sec->len < BLOCK_DESC_BYTES) return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block section %zu too short", i);
  uint32_t d[6];
  uint64_t bytes;
  memcpy(d, sec->data, sizeof d);
  memcpy(&bytes, sec->data + 24, 8);
  ckv_snap_block *b = &s->blocks[i];
  if (d[0] >= s->n_table || (i && d[0] <= s->blocks[i - 1].index) || d[1] >= CKV_FORMAT_COUNT_ || d[5] != 0)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %zu: index %u, format %u", i, d[0], d[1]);
  uint32_t fmt = d[1], cap = d[2];
  uint64_t mine = ckv_format_block_bytes(fmt, &s->geom, cap, d[4]);
  if (cap != capacity_of(s, fmt) || !mine || mine != bytes || d[3] > cap ||
      (!ckv_format_is_commit(fmt) && d[4] != 0) || (ckv_format_is_commit(fmt) && d[4] == 0))
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT,
                "block %zu (format %u): %u slots, %u used, %u channels, %llu bytes do not fit the geometry", i, fmt,
                cap, d[3], d[4], (unsigned long long)bytes);
  bool refs = (s->flags & CKV_SNAP_BLOCK_REFS) != 0;
  uint64_t head = ckv_block_payload_offset(cap), held = refs ? head + 16 : bytes;
  if (sec->len != BLOCK_DESC_BYTES + held)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %zu: section holds %llu bytes, the block %llu", i,
                (unsigned long long)(sec->len - BLOCK_DESC_BYTES), (unsigned long long)held);
  *b = (ckv_snap_block){.index = d[0], .format = (uint8_t)fmt, .capacity = (uint16_t)cap, .used = (uint16_t)d[3],
                        .kept = d[4], .bytes = bytes, .meta = sec->data + BLOCK_DESC_BYTES,
                        .payload = refs ? NULL : sec->data + BLOCK_DESC_BYTES + head};
  if (refs) {
    memcpy(&b->arena_offset, sec->data + BLOCK_DESC_BYTES + head, 8);
    memcpy(&b->slab_offset, sec->data + BLOCK_DESC_BYTES + head + 8, 8);
  }
  /* the valid bitmap: no bit beyond the slots handed out */
  const uint8_t *bm = b->meta + ckv_block_bitmap_offset(cap);
  for (uint32_t slot = 0; slot < ckv_block_bitmap_words(cap) * 64u; slot++)
    if ((bm[slot / 8] >> (slot % 8)) & 1u) {
      if (slot >= b->used)
        return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %zu: slot %u valid beyond the %u used", i, slot, b->used);
      uint32_t pos;
      memcpy(&pos, b->meta + ckv_block_positions_offset() + (size_t)slot * 4, 4);
      if (pos >= s->tokens.n)
        return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %zu slot %u names position %u of %zu", i, slot, pos,
                    s->tokens.n);
    }
  return CKV_OK;
}

static bool slot_valid(const ckv_snap_block *b, uint32_t slot) {
  const uint8_t *bm = b->meta + ckv_block_bitmap_offset(b->capacity);
  return (bm[slot / 8] >> (slot % 8)) & 1u;
}

/* Tokens -> blocks -> positions -> tokens: every live token in one valid
 * slot that names it, every valid slot claimed by its token. */
static int cross_check(ckv_snap *s, char *err, size_t errlen) {
  uint32_t *where = malloc((s->n_table ? s->n_table : 1) * sizeof(*where));
  uint32_t *claimed = calloc(s->n_blocks ? s->n_blocks : 1, sizeof(*claimed));
  int r = CKV_OK;
  if (!where || !claimed) {
    r = ckv_fail(err, errlen, -ENOMEM, "out of memory checking the snapshot");
    goto out;
  }
  for (uint32_t i = 0; i < s->n_table; i++) where[i] = UINT32_MAX;
  for (size_t i = 0; i < s->n_blocks; i++) where[s->blocks[i].index] = (uint32_t)i;
  for (int f = 0; f < CKV_FORMAT_COUNT_; f++)
    if (s->fill[f] != CKV_NO_BLOCK && (where[s->fill[f]] == UINT32_MAX || s->blocks[where[s->fill[f]]].format != f)) {
      r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "fill block %u of format %d is not a block of that format", s->fill[f], f);
      goto out;
    }
  const ckv_tokens *t = &s->tokens;
  for (size_t p = 0; p < t->n; p++) {
    if (t->block[p] == CKV_NO_BLOCK) continue;
    uint32_t bi = t->block[p] < s->n_table ? where[t->block[p]] : UINT32_MAX;
    const ckv_snap_block *b = bi == UINT32_MAX ? NULL : &s->blocks[bi];
    uint32_t pos = UINT32_MAX;
    if (b && t->slot[p] < b->capacity)
      memcpy(&pos, b->meta + ckv_block_positions_offset() + (size_t)t->slot[p] * 4, 4);
    if (!b || t->slot[p] >= b->capacity || !slot_valid(b, t->slot[p]) || pos != p) {
      r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "token %zu: block %u slot %u does not hold it", p, t->block[p],
               t->slot[p]);
      goto out;
    }
    claimed[bi]++;
  }
  for (size_t i = 0; i < s->n_blocks; i++) {
    uint32_t valid = 0;
    for (uint32_t slot = 0; slot < s->blocks[i].capacity; slot++) valid += slot_valid(&s->blocks[i], slot);
    if (valid != claimed[i]) {
      r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "block %u has %u valid slots, %u tokens live there", s->blocks[i].index,
               valid, claimed[i]);
      goto out;
    }
  }
out:
  free(where);
  free(claimed);
  return r;
}

static int parse_owned(uint8_t *buf, size_t len, ckv_snap *ret, char *err, size_t errlen) {
  ckv_snap s;
  memset(&s, 0, sizeof s);
  uint32_t version = 0;
  int r = check_preamble(buf, len, &version, err, errlen);
  if (r < 0) {
    free(buf);
    return r;
  }
  size_t off = CKV_SNAP_PREAMBLE_BYTES;
  uint32_t no = 0;
  section sec;
  if ((r = next_section(buf, len, &off, no++, CKV_SNAP_SEC_HEADER, &sec, err, errlen)) < 0 ||
      (r = parse_header(&sec, version, &s, err, errlen)) < 0) {
    free(buf);
    return r;
  }
  size_t n_tokens = s.tokens.n, n_blocks = s.n_blocks;
  s.tokens.n = 0;
  ckv_tokens_init(&s.tokens);
  s.tokens.n = n_tokens;
  s.n_blocks = 0;
  s.buf_ = buf;
  s.buf_len_ = len;
  s.blocks = calloc(n_blocks ? n_blocks : 1, sizeof(*s.blocks));
  if (!s.blocks) {
    r = ckv_fail(err, errlen, -ENOMEM, "out of memory for %zu blocks", n_blocks);
    goto bad;
  }
  if ((r = next_section(buf, len, &off, no++, CKV_SNAP_SEC_TOKENS, &sec, err, errlen)) < 0 ||
      (r = parse_tokens(&sec, &s, err, errlen)) < 0)
    goto bad;
  if ((r = next_section(buf, len, &off, no++, CKV_SNAP_SEC_IDS, &sec, err, errlen)) < 0 ||
      (r = parse_ids(&sec, &s, err, errlen)) < 0)
    goto bad;
  for (size_t i = 0; i < n_blocks; i++) {
    if ((r = next_section(buf, len, &off, no++, CKV_SNAP_SEC_BLOCK, &sec, err, errlen)) < 0 ||
        (r = parse_block(&sec, &s, i, err, errlen)) < 0)
      goto bad;
    s.n_blocks = i + 1;
  }
  size_t before_end = off;
  if ((r = next_section(buf, len, &off, no, CKV_SNAP_SEC_END, &sec, err, errlen)) < 0) goto bad;
  uint32_t nsec;
  uint64_t bytes;
  if (sec.len != 16) {
    r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "end section of %llu bytes", (unsigned long long)sec.len);
    goto bad;
  }
  memcpy(&nsec, sec.data, 4);
  memcpy(&bytes, sec.data + 8, 8);
  if (nsec != no || bytes != before_end) {
    r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "the end section counts %u sections and %llu bytes, the file has %u and %zu",
             nsec, (unsigned long long)bytes, no, before_end);
    goto bad;
  }
  if (off != len) {
    r = ckv_fail(err, errlen, CKV_ERR_CORRUPT, "%zu bytes after the end section", len - off);
    goto bad;
  }
  if ((r = cross_check(&s, err, errlen)) < 0) goto bad;
  *ret = s;
  return CKV_OK;
bad:
  ckv_snap_done(&s);
  return r;
}

int ckv_snap_parse(const void *buf, size_t len, ckv_snap *ret, char *err, size_t errlen) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return ckv_fail(err, errlen, -ENOMEM, "out of memory for a %zu-byte snapshot", len);
  if (len) memcpy(copy, buf, len);
  return parse_owned(copy, len, ret, err, errlen);
}

/* Reads up to `max` bytes of path (the whole file when max is 0). */
static int read_file(const char *path, size_t max, uint8_t **ret, size_t *ret_len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO: refused below, never waited on */
  if (fd < 0) return ckv_fail(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT, "%s is not a regular file", path);
  }
  size_t want = max && (uint64_t)st.st_size > max ? max : (size_t)st.st_size;
  uint8_t *buf = malloc(want ? want : 1);
  if (!buf) {
    close(fd);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory reading %s", path);
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = read(fd, buf + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return ckv_fail(err, errlen, -e, "reading %s: %s", path, strerror(e));
    }
    if (n == 0) break;
    got += (size_t)n;
  }
  close(fd);
  *ret = buf;
  *ret_len = got;
  return CKV_OK;
}

int ckv_snap_read(const char *path, ckv_snap *ret, char *err, size_t errlen) {
  uint8_t *buf;
  size_t len;
  int r = read_file(path, 0, &buf, &len, err, errlen);
  return r < 0 ? r : parse_owned(buf, len, ret, err, errlen);
}

int ckv_snap_read_header(const char *path, ckv_snap *ret, char *err, size_t errlen) {
  uint8_t *buf;
  size_t len;
  int r = read_file(path, CKV_SNAP_PREAMBLE_BYTES + CKV_SNAP_SECTION_HEADER_BYTES + MAX_HEADER_BYTES, &buf, &len, err,
                    errlen);
  if (r < 0) return r;
  size_t off = CKV_SNAP_PREAMBLE_BYTES;
  section sec;
  ckv_snap s;
  uint32_t version = 0;
  if ((r = check_preamble(buf, len, &version, err, errlen)) == CKV_OK &&
      (r = next_section(buf, len, &off, 0, CKV_SNAP_SEC_HEADER, &sec, err, errlen)) == CKV_OK &&
      (r = parse_header(&sec, version, &s, err, errlen)) == CKV_OK) {
    size_t n = s.tokens.n;
    ckv_tokens_init(&s.tokens);
    s.tokens.n = n; /* a count only: no columns */
    s.n_ids = 0;
    *ret = s;
  }
  free(buf);
  return r;
}

void ckv_snap_done(ckv_snap *s) {
  if (!s) return;
  ckv_tokens_done(&s->tokens);
  free(s->ids);
  free(s->blocks);
  free(s->buf_);
  memset(s, 0, sizeof(*s));
}

int ckv_snap_check_identity(const ckv_snap *s, const ckv_snap_expect *e, char *err, size_t errlen) {
  if (e->tenant && strcmp(e->tenant, s->tenant) != 0)
    return ckv_fail(err, errlen, CKV_ERR_AUTH, "snapshot of session '%s' belongs to tenant '%s', not '%s'", s->session_id,
                s->tenant, e->tenant);
  if (e->session_id && strcmp(e->session_id, s->session_id) != 0)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT,
                    "the copy stored for session '%s' holds session '%s' (swapped or forged): refused, it is not "
                    "this conversation",
                    e->session_id, s->session_id);
  if (e->model_id && strcmp(e->model_id, s->model_id) != 0)
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, "snapshot of session '%s' is of model '%s', not '%s'", s->session_id,
                s->model_id, e->model_id);
  if (e->model_revision && strcmp(e->model_revision, s->model_revision) != 0)
    return ckv_fail(err, errlen, CKV_ERR_FORMAT, "snapshot of session '%s' is of model revision '%s', not '%s'",
                s->session_id, s->model_revision, e->model_revision);
  const ckv_geometry *g = e->geom;
  if (g && g->n_layers &&
      (g->n_layers != s->geom.n_layers || g->n_kv_heads != s->geom.n_kv_heads || g->head_dim != s->geom.head_dim ||
       g->dtype != s->geom.dtype))
    return ckv_fail(err, errlen, CKV_ERR_FORMAT,
                "snapshot of session '%s' has geometry %u x %u x %u (dtype %u), not %u x %u x %u (dtype %u)",
                s->session_id, s->geom.n_layers, s->geom.n_kv_heads, s->geom.head_dim, s->geom.dtype, g->n_layers,
                g->n_kv_heads, g->head_dim, g->dtype);
  return CKV_OK;
}
