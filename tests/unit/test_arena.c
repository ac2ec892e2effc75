/* test_arena.c - arenas (shm/arena.c, shm/arena_host.c): create, export over a
 * unix socket to a forked process that imports and writes, header validation
 * on import, seals, discard giving pages back, lazy commit, the registry, an
 * arena kept live and adopted by its generation (warm restart), and
 * the slab allocator discarding through an arena. */
#include "commitkv/status.h"
#include "shm/arena.h"
#include "shm/fdpass.h"
#include "shm/slab.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "testcheck.h"

TestSuite(arena, .fini = ckv_test_leak_check);

#define MiB (UINT64_C(1) << 20)

static ckv_arena *mk(uint64_t bytes) {
  ckv_arena *a = NULL;
  cr_assert_eq(ckv_arena_new(&ckv_arena_host_backend, bytes, "test", &a), CKV_OK);
  cr_assert_not_null(a);
  return a;
}

static ckv_arena_desc desc_of(const ckv_arena *a) {
  ckv_arena_desc d;
  cr_assert_eq(ckv_arena_export(a, &d), CKV_OK);
  return d;
}

static uint8_t pattern(uint64_t i) { return (uint8_t)(i * 131u + (i >> 11)); }

Test(arena, create_header_and_accessors) {
  ckv_arena *a = mk(3 * MiB + 5);
  long page = sysconf(_SC_PAGESIZE);
  uint64_t want = (CKV_ARENA_HEADER_BYTES + 3 * MiB + 5 + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
  cr_assert_eq(ckv_arena_size(a), want);
  cr_assert_str_eq(ckv_arena_kind(a), "host");
  cr_assert_eq(ckv_arena_data_offset(a), CKV_ARENA_HEADER_BYTES);
  cr_assert(ckv_arena_is_owner(a));
  cr_assert(ckv_arena_is_live(a));
  cr_assert_neq(ckv_arena_generation(a), 0);
  const ckv_arena_header *h = ckv_arena_base(a);
  cr_assert_eq(h->magic, CKV_ARENA_MAGIC);
  cr_assert_eq(h->format, ckv_arena_format());
  cr_assert_eq(h->format >> 32, CKV_ARENA_VERSION);
  cr_assert_eq(h->bytes, want);
  cr_assert_eq(h->generation, ckv_arena_generation(a));
  cr_assert_eq(h->creator_pid, (uint32_t)getpid());
  cr_assert_eq(h->state, CKV_ARENA_STATE_LIVE);
  cr_assert_str_eq(h->kind, "host");
  cr_assert_str_eq(h->label, "test");
  const uint8_t *p = (const uint8_t *)ckv_arena_base(a) + CKV_ARENA_HEADER_BYTES;
  for (uint64_t i = 0; i < 3 * MiB; i += 4096) cr_assert_eq(p[i], 0);

  ckv_arena_desc d = desc_of(a);
  cr_assert_str_eq(d.kind, "host");
  cr_assert_eq(d.bytes, want);
  cr_assert_eq(d.n_fds, 1);
  cr_assert_geq(d.fds[0], 0);
  cr_assert_eq(d.handle_len, 0);
  cr_assert(fcntl(d.fds[0], F_GETFD) & FD_CLOEXEC, "memfd without close-on-exec");
  /* A second arena gets another generation. */
  ckv_arena *b = mk(MiB);
  cr_assert_neq(ckv_arena_generation(b), ckv_arena_generation(a));
  cr_assert_null(ckv_arena_free(b));
  cr_assert_null(ckv_arena_free(a));
  cr_assert_null(ckv_arena_free(NULL));
}

Test(arena, bad_arguments) {
  ckv_arena *a = (ckv_arena *)0x1;
  cr_assert_eq(ckv_arena_new(NULL, MiB, NULL, &a), CKV_ERR_INVALID);
  cr_assert_eq(ckv_arena_new(&ckv_arena_host_backend, 0, NULL, &a), CKV_ERR_INVALID);
  cr_assert_eq(ckv_arena_new(&ckv_arena_host_backend, CKV_ARENA_MAX_BYTES + 1, NULL, &a), CKV_ERR_LIMIT);
  cr_assert_eq(a, (ckv_arena *)0x1, "ret written on failure");
  cr_assert_eq(ckv_arena_import(NULL, &a), CKV_ERR_INVALID);
}

/* ---- export to another process, which writes; the parent reads back ---- */

enum { CHILD_OK = 0, CHILD_RECV = 10, CHILD_IMPORT, CHILD_CHECK, CHILD_SEND };

static int child_main(int sock, uint64_t data_bytes) {
  ckv_arena_desc d;
  size_t len, n_fds;
  int fds[CKV_FRAME_MAX_FDS];
  if (ckv_frame_recv(sock, &d, sizeof d, &len, fds, CKV_FRAME_MAX_FDS, &n_fds) != CKV_OK || len != sizeof d ||
      n_fds != 1)
    return CHILD_RECV;
  d.fds[0] = fds[0];
  ckv_arena *a = NULL;
  if (ckv_arena_import(&d, &a) != CKV_OK) return CHILD_IMPORT;
  close(fds[0]); /* import borrows: the mapping outlives the fd */
  if (ckv_arena_is_owner(a) || ckv_arena_generation(a) != d.generation || ckv_arena_size(a) != d.bytes)
    return CHILD_CHECK;
  ckv_arena_desc again;
  if (ckv_arena_export(a, &again) != CKV_ERR_STATE || ckv_arena_discard(a, CKV_ARENA_HEADER_BYTES, 4096) != CKV_ERR_STATE)
    return CHILD_CHECK;
  uint8_t *p = (uint8_t *)ckv_arena_base(a) + CKV_ARENA_HEADER_BYTES;
  for (uint64_t i = 0; i < data_bytes; i++)
    if (p[i] != 0x5a) return CHILD_CHECK; /* what the parent wrote first */
  for (uint64_t i = 0; i < data_bytes; i++) p[i] = pattern(i);
  char ok = 'k';
  if (ckv_frame_send(sock, &ok, 1, NULL, 0) != CKV_OK) return CHILD_SEND;
  /* Wait for the parent's reply so the mapping is alive while it reads. */
  if (ckv_frame_recv(sock, &ok, 1, &len, NULL, 0, NULL) != CKV_OK) return CHILD_RECV;
  ckv_arena_free(a);
  return CHILD_OK;
}

Test(arena, export_import_across_processes) {
  const uint64_t data = 8 * MiB;
  int sv[2];
  /* Fork first, before any arena exists: the child gets the memory only
   * through the socket, as a worker does. */
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    _exit(child_main(sv[1], data));
  }
  close(sv[1]);
  ckv_sock_set_timeout(sv[0], 20000);
  ckv_arena *a = mk(data);
  uint8_t *p = (uint8_t *)ckv_arena_base(a) + CKV_ARENA_HEADER_BYTES;
  memset(p, 0x5a, data);
  ckv_arena_desc d = desc_of(a);
  cr_assert_eq(ckv_frame_send(sv[0], &d, sizeof d, d.fds, d.n_fds), CKV_OK);
  char ok = 0;
  size_t len;
  int r = ckv_frame_recv(sv[0], &ok, 1, &len, NULL, 0, NULL);
  if (r != CKV_OK) {
    int st = 0;
    waitpid(pid, &st, 0);
    cr_assert_fail("child did not answer (%s), exit %d", ckv_status_name(r), WEXITSTATUS(st));
  }
  cr_assert_eq(ok, 'k');
  for (uint64_t i = 0; i < data; i++)
    if (p[i] != pattern(i)) cr_assert_fail("byte %llu differs", (unsigned long long)i);
  cr_assert_eq(ckv_frame_send(sv[0], &ok, 1, NULL, 0), CKV_OK);
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed with %d", WEXITSTATUS(st));
  close(sv[0]);
  ckv_arena_free(a);
}

/* ---- an importer sees the owner's writes; the owner's free retires it ---- */

Test(arena, import_in_process_shares_memory_and_sees_retire) {
  ckv_arena *a = mk(MiB);
  ckv_arena_desc d = desc_of(a);
  int fd = fcntl(d.fds[0], F_DUPFD_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  d.fds[0] = fd;
  ckv_arena *b = NULL;
  cr_assert_eq(ckv_arena_import(&d, &b), CKV_OK);
  close(fd);
  cr_assert_neq(ckv_arena_base(a), ckv_arena_base(b));
  ((volatile uint8_t *)ckv_arena_base(a))[CKV_ARENA_HEADER_BYTES + 7] = 42;
  cr_assert_eq(((volatile uint8_t *)ckv_arena_base(b))[CKV_ARENA_HEADER_BYTES + 7], 42);
  cr_assert(ckv_arena_is_live(b));
  ckv_arena_free(a);
  cr_assert_not(ckv_arena_is_live(b), "importer did not see the owner retire the arena");
  cr_assert_eq(((volatile uint8_t *)ckv_arena_base(b))[CKV_ARENA_HEADER_BYTES + 7], 42, "mapping lost");
  ckv_arena_free(b);
}

/* ---- header mismatch and non-arenas refused ---- */

static int try_import(const ckv_arena_desc *d) {
  ckv_arena *b = NULL;
  int r = ckv_arena_import(d, &b);
  if (r == CKV_OK) ckv_arena_free(b);
  else cr_assert_null(b, "ret written on failure");
  return r;
}

Test(arena, header_mismatch_refused) {
  ckv_arena *a = mk(MiB);
  ckv_arena_desc d = desc_of(a);
  ckv_arena_header *h = ckv_arena_base(a);
  cr_assert_eq(try_import(&d), CKV_OK);

  uint64_t saved = h->magic;
  h->magic ^= 1;
  cr_assert_eq(try_import(&d), CKV_ERR_FORMAT, "bad magic accepted");
  h->magic = saved;

  saved = h->format;
  h->format ^= 1; /* another build's layout hash */
  cr_assert_eq(try_import(&d), CKV_ERR_FORMAT, "other layout accepted");
  h->format = saved + (UINT64_C(1) << 32); /* another version */
  cr_assert_eq(try_import(&d), CKV_ERR_FORMAT, "other version accepted");
  h->format = saved;

  saved = h->bytes;
  h->bytes += 4096;
  cr_assert_eq(try_import(&d), CKV_ERR_FORMAT, "header size mismatch accepted");
  h->bytes = saved;

  h->state = CKV_ARENA_STATE_RETIRED;
  cr_assert_eq(try_import(&d), CKV_ERR_FORMAT, "retired arena accepted");
  h->state = CKV_ARENA_STATE_LIVE;

  strcpy(h->kind, "cuda");
  cr_assert_eq(try_import(&d), CKV_ERR_FORMAT, "kind mismatch accepted");
  strcpy(h->kind, "host");

  ckv_arena_desc e = d;
  e.generation ^= 0x100;
  cr_assert_eq(try_import(&e), CKV_ERR_FORMAT, "stale generation accepted");
  e = d;
  e.bytes += 4096;
  cr_assert_eq(try_import(&e), CKV_ERR_FORMAT, "descriptor size mismatch accepted");
  e = d;
  e.bytes = 0;
  cr_assert_eq(try_import(&e), CKV_ERR_FORMAT);
  e = d;
  strcpy(e.kind, "nosuch");
  cr_assert_eq(try_import(&e), CKV_ERR_UNSUPPORTED);
  e = d;
  memset(e.kind, 'x', sizeof e.kind);
  cr_assert_eq(try_import(&e), CKV_ERR_INVALID, "unterminated kind accepted");
  e = d;
  e.n_fds = CKV_ARENA_MAX_FDS + 1;
  cr_assert_eq(try_import(&e), CKV_ERR_INVALID);
  e = d;
  e.n_fds = 0;
  cr_assert_eq(try_import(&e), CKV_ERR_INVALID);
  e = d;
  e.fds[0] = -1;
  cr_assert_eq(try_import(&e), CKV_ERR_INVALID);

  cr_assert_eq(try_import(&d), CKV_OK, "restored header refused");
  ckv_arena_free(a);
}

Test(arena, unsealed_or_foreign_memory_refused) {
  ckv_arena *a = mk(MiB);
  ckv_arena_desc d = desc_of(a);
  /* An unsealed memfd with a perfect copy of the header: could shrink under
   * the mapping, so it is not an arena. */
  int fd = memfd_create("fake", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)d.bytes), 0);
  cr_assert_eq(pwrite(fd, ckv_arena_base(a), CKV_ARENA_HEADER_BYTES, 0), CKV_ARENA_HEADER_BYTES);
  ckv_arena_desc e = d;
  e.fds[0] = fd;
  cr_assert_eq(try_import(&e), CKV_ERR_FORMAT, "unsealed memfd accepted");
  close(fd);
  /* Not a regular file at all. */
  int p[2];
  cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
  e.fds[0] = p[0];
  cr_assert_eq(try_import(&e), CKV_ERR_FORMAT, "pipe accepted");
  close(p[0]);
  close(p[1]);
  ckv_arena_free(a);
}

/* ---- seals: nobody holding the fd can resize or freeze the arena ---- */

Test(arena, sealed_against_resize_and_new_seals) {
  ckv_arena *a = mk(MiB);
  ckv_arena_desc d = desc_of(a);
  int seals = fcntl(d.fds[0], F_GET_SEALS);
  cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  cr_assert_neq(ftruncate(d.fds[0], 4096), 0, "arena shrank");
  cr_assert_neq(ftruncate(d.fds[0], (off_t)(d.bytes * 2)), 0, "arena grew");
  cr_assert_neq(fcntl(d.fds[0], F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0, "a new seal was added");
  ckv_arena_free(a);
}

/* ---- discard gives pages back and zeroes them ---- */

Test(arena, discard_returns_pages) {
  const uint64_t data = 16 * MiB;
  ckv_arena *a = mk(data);
  uint8_t *p = (uint8_t *)ckv_arena_base(a);
  uint64_t r0, r1, r2;
  cr_assert_eq(ckv_arena_resident(a, &r0), CKV_OK);
  cr_assert_lt(r0, MiB, "memory committed up front: %llu", (unsigned long long)r0);
  memset(p + CKV_ARENA_HEADER_BYTES, 0xab, data);
  cr_assert_eq(ckv_arena_resident(a, &r1), CKV_OK);
  cr_assert_geq(r1, data);
  /* Give back the middle 8 MiB (page aligned). */
  const uint64_t off = CKV_ARENA_HEADER_BYTES + 4 * MiB, len = 8 * MiB;
  cr_assert_eq(ckv_arena_discard(a, off, len), CKV_OK);
  cr_assert_eq(ckv_arena_resident(a, &r2), CKV_OK);
  cr_assert_leq(r2, r1 - len, "pages not returned: %llu -> %llu", (unsigned long long)r1, (unsigned long long)r2);
  for (uint64_t i = off; i < off + len; i += 512) cr_assert_eq(p[i], 0, "discarded byte %llu not zero", (unsigned long long)i);
  cr_assert_eq(p[off - 1], 0xab, "byte before the range lost");
  cr_assert_eq(p[off + len], 0xab, "byte after the range lost");
  cr_assert_eq(((ckv_arena_header *)p)->magic, CKV_ARENA_MAGIC);

  uint64_t sz = ckv_arena_size(a);
  cr_assert_eq(ckv_arena_discard(a, 0, 4096), CKV_ERR_INVALID, "header discarded");
  cr_assert_eq(ckv_arena_discard(a, off + 1, 4096), CKV_ERR_INVALID, "misaligned offset accepted");
  cr_assert_eq(ckv_arena_discard(a, off, 100), CKV_ERR_INVALID, "partial page accepted");
  cr_assert_eq(ckv_arena_discard(a, sz - 4096, 8192), CKV_ERR_INVALID, "range past the end accepted");
  cr_assert_eq(ckv_arena_discard(a, off, UINT64_MAX - 4095), CKV_ERR_INVALID, "overflowing range accepted");
  cr_assert_eq(ckv_arena_discard(a, off, 0), CKV_OK);
  cr_assert_eq(p[off - 1], 0xab);
  ckv_arena_free(a);
}

Test(arena, huge_arena_is_lazy) {
  /* A tenant-quota-sized arena costs nothing until touched. */
  ckv_arena *a = mk(UINT64_C(64) << 30);
  uint64_t r;
  cr_assert_eq(ckv_arena_resident(a, &r), CKV_OK);
  cr_assert_lt(r, MiB);
  ((uint8_t *)ckv_arena_base(a))[ckv_arena_size(a) - 1] = 1;
  cr_assert_eq(ckv_arena_resident(a, &r), CKV_OK);
  cr_assert_lt(r, MiB);
  ckv_arena_free(a);
}

/* ---- the slab allocator discards through the arena ---- */

Test(arena, slab_discards_through_arena) {
  const uint64_t data = 16 * MiB;
  ckv_arena *a = mk(data);
  ckv_slab_config cfg = {.offset = ckv_arena_data_offset(a),
                         .bytes = data,
                         .discard = ckv_arena_discard_cb,
                         .discard_opaque = a};
  ckv_slab *s;
  cr_assert_eq(ckv_slab_new(&cfg, &s), CKV_OK);
  uint32_t c;
  cr_assert_eq(ckv_slab_class(s, MiB, 0, &c), CKV_OK);
  uint64_t offs[4];
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(ckv_slab_alloc(s, c, &offs[i]), CKV_OK);
    memset((uint8_t *)ckv_arena_base(a) + offs[i], 0x11, MiB);
  }
  uint64_t r1, r2;
  cr_assert_eq(ckv_arena_resident(a, &r1), CKV_OK);
  cr_assert_geq(r1, 4 * MiB);
  for (int i = 0; i < 4; i++) cr_assert_eq(ckv_slab_dealloc(s, offs[i]), CKV_OK);
  cr_assert_eq(ckv_arena_resident(a, &r2), CKV_OK);
  cr_assert_lt(r2, MiB, "freed chunks still resident: %llu", (unsigned long long)r2);
  ckv_slab_stats st;
  ckv_slab_get_stats(s, &st);
  cr_assert_eq(st.discard_errors, 0);
  ckv_slab_free(s);
  ckv_arena_free(a);
}

/* ---- registry ---- */

static int fake_create(uint64_t b, uint64_t i, const char *l, void **c, void **p) { return CKV_ERR_DEVICE; }
static int fake_import(const ckv_arena_desc *e, void **c, void **p) { return CKV_ERR_DEVICE; }
static void fake_destroy(void *c, void *p, uint64_t b) {}
static int fake_export(void *c, ckv_arena_desc *e) { return CKV_ERR_DEVICE; }

static const ckv_arena_backend fake_backend = {
    .name = "fake",
    .create = fake_create,
    .import = fake_import,
    .destroy = fake_destroy,
    .export_handles = fake_export,
};

Test(arena, backend_registry) {
  cr_assert_eq(ckv_arena_backend_find("host"), &ckv_arena_host_backend);
  cr_assert_null(ckv_arena_backend_find("fake"));
  cr_assert_null(ckv_arena_backend_find(NULL));
  cr_assert_eq(ckv_arena_backend_register(&ckv_arena_host_backend), CKV_ERR_EXISTS);
  ckv_arena_backend broken = fake_backend;
  broken.import = NULL;
  cr_assert_eq(ckv_arena_backend_register(&broken), CKV_ERR_INVALID);
  cr_assert_eq(ckv_arena_backend_register(&fake_backend), CKV_OK);
  cr_assert_eq(ckv_arena_backend_find("fake"), &fake_backend);
  ckv_arena *a = (ckv_arena *)0x1;
  cr_assert_eq(ckv_arena_new(&fake_backend, MiB, NULL, &a), CKV_ERR_DEVICE, "backend error not passed on");
  cr_assert_eq(a, (ckv_arena *)0x1);
  ckv_arena_desc d = {.kind = "fake", .bytes = 2 * MiB, .committed = 2 * MiB};
  cr_assert_eq(ckv_arena_import(&d, &a), CKV_ERR_DEVICE);
}

/* The committed prefix: grown by doubling by the owner, carried by exports,
 * learned by importers through refresh; nothing mapped moves. */
Test(arena, grows_and_importers_refresh) {
  ckv_arena *a = mk(64 * MiB);
  uint64_t size = ckv_arena_size(a), c0 = ckv_arena_committed(a);
  cr_assert_geq(c0, CKV_ARENA_HEADER_BYTES);
  cr_assert_lt(c0, size / 64, "the first prefix is about 1/128 of the arena, got %llu of %llu",
               (unsigned long long)c0, (unsigned long long)size);
  void *base = ckv_arena_base(a);
  ckv_arena_desc e;
  cr_assert_eq(ckv_arena_export(a, &e), CKV_OK);
  cr_assert_eq(e.committed, c0);
  ckv_arena *b;
  cr_assert_eq(ckv_arena_import(&e, &b), CKV_OK);
  cr_assert_eq(ckv_arena_committed(b), c0);
  cr_assert_eq(ckv_arena_grow(b, c0 + 1), CKV_ERR_STATE, "an importer cannot grow");
  cr_assert_eq(ckv_arena_grow(a, c0), CKV_OK);
  cr_assert_eq(ckv_arena_committed(a), c0, "already usable: no growth");
  cr_assert_eq(ckv_arena_grow(a, 10 * MiB + 1), CKV_OK);
  uint64_t c1 = ckv_arena_committed(a);
  cr_assert_geq(c1, 10 * MiB + 1);
  cr_assert_lt(c1, 2 * (10 * MiB + 1), "growth doubles, never more");
  cr_assert_eq(c1 % c0, 0);
  cr_assert_eq(ckv_arena_base(a), base, "growing moved the mapping");
  cr_assert_eq(ckv_arena_grow(a, size + 1), CKV_ERR_INVALID);
  /* The importer maps what the new export adds. */
  ckv_arena_desc e1;
  cr_assert_eq(ckv_arena_export(a, &e1), CKV_OK);
  cr_assert_eq(e1.committed, c1);
  cr_assert_eq(ckv_arena_refresh(a, &e1), CKV_ERR_STATE, "the owner does not refresh");
  ckv_arena_desc bad = e1;
  bad.generation ^= 1;
  cr_assert_eq(ckv_arena_refresh(b, &bad), CKV_ERR_FORMAT, "another arena's export");
  bad = e1;
  bad.committed = size + 4096;
  cr_assert_eq(ckv_arena_refresh(b, &bad), CKV_ERR_INVALID, "beyond the arena");
  cr_assert_eq(ckv_arena_refresh(b, &e1), CKV_OK);
  cr_assert_eq(ckv_arena_committed(b), c1);
  cr_assert_eq(ckv_arena_refresh(b, &e), CKV_ERR_INVALID, "the prefix never shrinks");
  uint8_t *pa = base, *pb = ckv_arena_base(b);
  pa[c1 - 1] = 0x5a;
  cr_assert_eq(pb[c1 - 1], 0x5a, "the grown range is shared");
  /* Grows all the way, in at most CKV_ARENA_MAX_FDS prefixes. */
  unsigned steps = 1;
  for (uint64_t c = ckv_arena_committed(a); c < size; c = ckv_arena_committed(a), steps++)
    cr_assert_eq(ckv_arena_grow(a, c + 1), CKV_OK);
  cr_assert_eq(ckv_arena_committed(a), size);
  cr_assert_leq(steps, CKV_ARENA_MAX_FDS, "%u prefixes to cover the arena", steps);
  ckv_arena_free(b);
  ckv_arena_free(a);
}

/* ---- handed on across a restart (warm restart) ---- */

Test(arena, kept_live_then_adopted_by_generation) {
  ckv_arena *a = mk(MiB);
  ckv_arena_desc d = desc_of(a);
  int fd = fcntl(d.fds[0], F_DUPFD_CLOEXEC, 0); /* what systemd's fd store holds */
  cr_assert_geq(fd, 0);
  uint64_t gen = ckv_arena_generation(a), bytes = ckv_arena_size(a);
  ((volatile uint8_t *)ckv_arena_base(a))[CKV_ARENA_HEADER_BYTES + 9] = 77;
  ckv_arena_keep_live(a);
  ckv_arena_free(a);
  ckv_arena_desc e = {.bytes = bytes, .generation = gen, .committed = bytes, .n_fds = 1, .fds = {fd}};
  snprintf(e.kind, sizeof e.kind, "host");
  /* another generation, another size: refused */
  e.generation = gen ^ 1;
  ckv_arena *b = NULL;
  cr_assert_eq(ckv_arena_adopt(&e, &b), CKV_ERR_FORMAT);
  cr_assert_null(b);
  e.generation = gen;
  e.bytes = bytes * 2;
  cr_assert_eq(ckv_arena_adopt(&e, &b), CKV_ERR_FORMAT);
  e.bytes = bytes;
  cr_assert_eq(ckv_arena_adopt(&e, &b), CKV_OK);
  close(fd); /* the adopter keeps its own descriptor */
  cr_assert(ckv_arena_is_owner(b));
  cr_assert_eq(ckv_arena_generation(b), gen);
  cr_assert_eq(((volatile uint8_t *)ckv_arena_base(b))[CKV_ARENA_HEADER_BYTES + 9], 77, "the bytes did not survive");
  ckv_arena_desc again;
  cr_assert_eq(ckv_arena_export(b, &again), CKV_OK, "an adopted arena cannot be exported");
  cr_assert_eq(ckv_arena_discard(b, CKV_ARENA_HEADER_BYTES, 4096), CKV_OK);
  cr_assert_eq(((volatile uint8_t *)ckv_arena_base(b))[CKV_ARENA_HEADER_BYTES + 9], 0);
  /* a retired arena is not adopted */
  int fd2 = fcntl(again.fds[0], F_DUPFD_CLOEXEC, 0);
  ckv_arena_free(b);
  e.fds[0] = fd2;
  cr_assert_eq(ckv_arena_adopt(&e, &b), CKV_ERR_FORMAT, "a retired arena was adopted");
  close(fd2);
}
