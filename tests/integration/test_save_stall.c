/* test_save_stall.c - issue 40 N12: one tenant's large save neither freezes
 * the daemon nor reads blocks that were handed out again under it.
 *
 * A SaveSession used to copy the whole session on the server loop before
 * the I/O thread wrote it (4.9 s for 538 MB under load): no tenant got a
 * reply meanwhile.  Now the loop copies the session's columns and header
 * regions, the I/O thread reads the full blocks in place, and the tenant is
 * pinned (store/tenant.h) so a block freed during the save is not reused
 * until the file is written.  Real commitkvd, real clients, a 512 MiB
 * session of FP16 K/V (policy fp16: nothing moves it), the other tenant a
 * process of another uid. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#define RAW_CLIENT_NAME "test_save_stall"
#include "rawcheck.h"
#include "testcheck.h"
#include "testutil.h"

TestSuite(save_stall, .fini = ckv_test_leak_check);

#define OTHER_UID 65534u /* nobody: tenant 'other' */
static const ckv_geometry k_geometry = {8, 8, 128, 0};
#define ROW (8u * 128u) /* fp16 elements of one token's K (or V) in one layer */
#define TOKENS 16384u   /* 16384 x 8 layers x (K+V) x 2 KiB = 512 MiB of K/V */
#define CHUNK 1024u

static const char k_config[] = "[daemon]\nmemory = 3G\ndetach_keep = 60s\n"
                               "[tenant.big]\nuids = 0\nquota = 2600M\n"
                               "[tenant.other]\nuids = 65534\nquota = 64M\n";

static long long now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The fp16 bits of element e of (pos, layer, kv) in conversation `salt`:
 * finite values (exponent below 0x1f), different for every argument. */
static uint16_t element(uint32_t salt, uint64_t pos, uint32_t layer, int kv, uint32_t e) {
  uint64_t x = (pos * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)layer << 40) ^ ((uint64_t)kv << 47) ^ ((uint64_t)e << 20) ^
               ((uint64_t)salt * 0xD6E8FEB86659FD93ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (uint16_t)(x & 0x3bff);
}

static void row(uint32_t salt, uint64_t pos, uint32_t layer, int kv, uint16_t *out) {
  for (uint32_t e = 0; e < ROW; e++) out[e] = element(salt, pos, layer, kv, e);
}

static ckv_client *connect_to(const ckv_test_daemon *d, const char *name) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = name, .timeout_ms = 60000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* Session `id` of TOKENS tokens whose K/V is conversation `salt`'s, one round reported. */
static ckv_session *filled(ckv_client *c, const char *id, uint32_t salt) {
  ckv_session_options so = {.policy = "fp16"};
  ckv_session *s = NULL;
  int r = ckv_session_open(c, id, &k_geometry, &so, &s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  static uint16_t k[ROW], v[ROW];
  for (uint32_t done = 0; done < TOKENS; done += CHUNK) {
    r = ckv_session_append(s, CHUNK, NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    for (uint64_t p = done; p < done + CHUNK; p++)
      for (uint32_t l = 0; l < k_geometry.n_layers; l++) {
        row(salt, p, l, 0, k);
        row(salt, p, l, 1, v);
        cr_assert_eq(ckv_session_write_kv(s, p, l, k, v), CKV_OK, "%s", ckv_client_last_error(c));
      }
  }
  float *attn = calloc(TOKENS, sizeof(float));
  ckv_round_result rr;
  r = ckv_session_report(s, 1, 0, attn, TOKENS, &rr);
  free(attn);
  cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  return s;
}

/* How many of s's K/V rows (read through its view: every token draft)
 * differ from conversation `salt`'s; every position must be there once. */
static uint64_t rows_differing(ckv_session *s, uint32_t salt) {
  const ckv_view *v = NULL;
  int r = ckv_session_view(s, &v);
  cr_assert_eq(r, CKV_OK, "view: %s", ckv_strerror(r));
  cr_assert_eq(v->n_staged + v->n_committed + v->n_cold, 0u, "policy fp16 moved tokens");
  static uint16_t want[ROW];
  static uint8_t seen[TOKENS];
  memset(seen, 0, sizeof seen);
  uint64_t bad = 0;
  for (size_t i = 0; i < v->n_draft; i++) {
    const ckv_block_view *bv = &v->draft[i];
    const uint32_t *pos = ckv_block_positions_const(bv->data);
    for (uint32_t slot = 0; slot < bv->capacity; slot++) {
      if (!ckv_block_slot_valid(bv->data, slot)) continue;
      cr_assert_lt(pos[slot], TOKENS);
      cr_assert_eq(seen[pos[slot]]++, 0, "position %u is in the view twice", pos[slot]);
      for (uint32_t l = 0; l < k_geometry.n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          row(salt, pos[slot], l, (int)kv, want);
          const uint8_t *got = (const uint8_t *)bv->data + ckv_draft_kv_offset(&k_geometry, bv->capacity, l, kv, slot);
          bad += memcmp(got, want, sizeof want) != 0;
        }
    }
  }
  for (uint32_t p = 0; p < TOKENS; p++) cr_assert_eq(seen[p], 1, "position %u is not in the view", p);
  return bad;
}

/* ---- the other tenant: heartbeats, each timed, until told to stop ---- */

#define MAX_BEATS 200000
#define PERIOD_US 2000

typedef struct beats {
  char socket[300], attach[300];
  atomic_int stop, ready;
  int code;
  char msg[300];
  uint32_t n;
  long long due_us[MAX_BEATS]; /* CLOCK_MONOTONIC: the same clock in both processes */
  float ms[MAX_BEATS];
} beats;

static void heartbeat_loop(const void *ctx, void *report) {
  beats *b = (beats *)ctx; /* a MAP_SHARED mapping: the parent reads it */
  (void)report;
  ckv_client_options co = {.socket = b->socket, .attach_socket = b->attach, .name = "other", .timeout_ms = 30000};
  ckv_client *c = NULL;
  if ((b->code = ckv_client_connect(&co, &c)) != CKV_OK) {
    snprintf(b->msg, sizeof b->msg, "connect: %s", ckv_client_connect_error());
    atomic_store(&b->ready, 1);
    return;
  }
  atomic_store(&b->ready, 1);
  /* One heartbeat due every PERIOD_US, each timed from when it was due, not
   * from when it could be sent: a reply held up 300 ms delays the ~150 beats
   * due meanwhile, as it would a worker's rounds (no coordinated omission). */
  long long due = now_us();
  while (!atomic_load(&b->stop) && b->n < MAX_BEATS) {
    long long wait = due - now_us();
    if (wait > 0) usleep((useconds_t)wait);
    if ((b->code = ckv_client_heartbeat(c)) != CKV_OK) {
      snprintf(b->msg, sizeof b->msg, "heartbeat: %s", ckv_client_last_error(c));
      break;
    }
    b->due_us[b->n] = due;
    b->ms[b->n] = (float)(now_us() - due) / 1e3f;
    b->n++;
    due += PERIOD_US;
  }
  ckv_client_free(c);
}

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* The bound on the other tenant's p99 heartbeat during the save: the
 * issue's aim, 50 ms.  Measured here (2 shared cores, the suite alone, 3
 * runs each, heartbeats due every 2 ms): with the copy on the loop a 512 MiB
 * save took 0.85-1.06 s and held every reply ~300 ms (p99 298-320 ms, max
 * 306-327 ms); reading the blocks in place, 0.48-0.54 s, p99 5.7-6.2 ms,
 * max 7.6-8.2 ms (the loop still copies the token columns and header
 * regions).  x4 under a sanitizer. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLOWER 4.0
#else
#define SLOWER 1.0
#endif
#define P99_BOUND_MS (50.0 * SLOWER)

Test(save_stall, a_large_save_does_not_hold_up_another_tenant, .timeout = 300) {
  char cfg[400];
  char *cfgdir = ckv_test_write_config(k_config, cfg, sizeof cfg);
  const char *extra[] = {"--config", cfg, NULL};
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, extra), 0, "commitkvd did not start: %s", ckv_test_file_tail(d.log, 2000));
  cr_assert_eq(chmod(d.dir, 0755), 0); /* tenant 'other' (another uid) must reach the sockets */
  ckv_client *c = connect_to(&d, "big");
  ckv_session *s = filled(c, "big", 1);

  beats *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(b, MAP_FAILED);
  memset(b, 0, sizeof *b);
  snprintf(b->socket, sizeof b->socket, "%s", d.socket);
  snprintf(b->attach, sizeof b->attach, "%s", d.attach);
  int fd = -1;
  int done = 0; /* the child's report: unused (it writes into b) */
  pid_t pid = ckv_test_begin_as(OTHER_UID, OTHER_UID, heartbeat_loop, b, sizeof done, &fd);
  while (!atomic_load(&b->ready)) usleep(1000);
  cr_assert_eq(b->code, CKV_OK, "%s", b->msg);
  usleep(200000);

  long long t0 = now_us();
  uint64_t bytes = 0;
  int r = ckv_session_save(s, "big", false, &bytes);
  long long t1 = now_us();
  cr_assert_eq(r, CKV_OK, "save: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  usleep(100000);
  atomic_store(&b->stop, 1);
  ckv_test_end_as(pid, fd, &done, sizeof done, 30000);
  cr_assert_eq(b->code, CKV_OK, "the other tenant: %s", b->msg);

  /* the heartbeats that overlapped the save */
  static float during[MAX_BEATS];
  uint32_t n = 0;
  float worst = 0;
  for (uint32_t i = 0; i < b->n; i++)
    if (b->due_us[i] + (long long)(b->ms[i] * 1e3f) >= t0 && b->due_us[i] <= t1) {
      during[n++] = b->ms[i];
      if (b->ms[i] > worst) worst = b->ms[i];
    }
  cr_assert_geq(n, 20u, "only %u heartbeats during the %.0f ms save: nothing was measured", n, (t1 - t0) / 1e3);
  qsort(during, n, sizeof during[0], by_value);
  float p50 = during[n / 2], p99 = during[n * 99 / 100];
  fprintf(stderr,
          "test_save_stall: save of %llu bytes took %.0f ms; the other tenant's %u heartbeats meanwhile: p50 %.2f ms, "
          "p99 %.2f ms, max %.2f ms\n",
          (unsigned long long)bytes, (t1 - t0) / 1e3, n, p50, p99, worst);
  cr_assert_gt(bytes, (uint64_t)TOKENS * 8u * 2u * ROW * 2u, "the snapshot is smaller than its K/V");
  cr_assert_lt(p99, P99_BOUND_MS, "the other tenant's p99 heartbeat was %.1f ms during the save (aim < 50 ms)", p99);
  munmap(b, sizeof *b);

  ckv_session_drop(s);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}

/* A save runs while its session is dropped and a new one takes the freed
 * memory at once, with other bytes: the snapshot is still every byte of
 * the saved conversation (the freed blocks waited for the save). */
Test(save_stall, blocks_freed_during_a_save_wait_for_it, .timeout = 300) {
  char cfg[400];
  char *cfgdir = ckv_test_write_config(k_config, cfg, sizeof cfg);
  const char *extra[] = {"--config", cfg, NULL};
  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, extra), 0, "commitkvd did not start: %s", ckv_test_file_tail(d.log, 2000));
  ckv_client *c = connect_to(&d, "owner");
  ckv_session *s = filled(c, "first", 1);

  /* another client of the tenant asks for the save and does not wait */
  raw saver;
  raw_connect(&saver, &d);
  Commitkv__V1__Request q = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__SaveSession sv = COMMITKV__V1__SAVE_SESSION__INIT;
  sv.session_id = "first";
  sv.name = "first";
  q.body_case = COMMITKV__V1__REQUEST__BODY_SAVE_SESSION;
  q.save_session = &sv;
  cr_assert_eq(ckv_raw_send_request(&saver, &q), 0);
  usleep(30000); /* the save's capture is served; its file is being written */
  cr_assert_eq(ckv_session_drop(s), CKV_OK);
  Commitkv__V1__Response *rep = NULL;
  int early = ckv_raw_recv(&saver, 0, &rep);
  cr_assert_eq(early, CKV_RAW_NO_REPLY, "the save was answered (%d: %s) before the drop: nothing was tested", early,
               ckv_raw_last_text());
  /* the dropped session's memory, taken at once by other bytes */
  ckv_session *other = filled(c, "second", 2);
  int code = ckv_raw_recv(&saver, 120000, &rep);
  cr_assert_eq(code, CKV_OK, "save: %d (%s)", code, ckv_raw_last_text());
  cr_assert_not_null(rep->session_saved);
  commitkv__v1__response__free_unpacked(rep, NULL);
  raw_done(&saver);
  cr_assert_eq(rows_differing(other, 2), 0u, "the new session's own bytes changed");

  ckv_session *back = NULL;
  ckv_session_options so = {.policy = "fp16"};
  int r = ckv_session_restore(c, "back", "first", &so, &back);
  cr_assert_eq(r, CKV_OK, "restore: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  uint64_t bad = rows_differing(back, 1);
  cr_assert_eq(bad, 0u, "%llu K/V rows of the snapshot are not the saved conversation's", (unsigned long long)bad);
  ckv_session_drop(back);
  ckv_session_drop(other);
  ckv_client_free(c);
  ckv_test_stop_clean(&d);
  ckv_test_rmdir(cfgdir);
}
