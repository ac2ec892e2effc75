/* test_remote.c - the remote tier (issue 15): a real redis-server on a free
 * loopback port, two real commitkvd with their own sockets and state
 * directories pointing at it, libcommitkv in this process, hiredis to look
 * into the store.
 *
 * - saved_on_one_resumes_on_other: a session with draft, staged and
 *   committed blocks is saved on daemon 1 and comes back on daemon 2, whose
 *   state directory never held it (OpenSession{resume} for one session,
 *   RestoreSession for another): every block's payload byte for byte, every
 *   token in the same format, the round counter; the value sits under the
 *   documented key; stats count the save and the load with their bytes.
 * - tampered_value_refused: a byte flipped in the store's value (SETRANGE) in
 *   the header, a block and the end section: each restore on daemon 2 is
 *   CKV_ERR_CORRUPT naming the store, the daemon keeps serving, and the
 *   value put back restores.
 * - store_gone_mid_save: the store stops answering during a save (CLIENT
 *   PAUSE): the save answers EIO naming the store and saying the local
 *   snapshot is intact, the store still holds the previous value whole, and
 *   a restore takes the newer local copy; the store killed (SIGKILL): the
 *   same, the daemon keeps serving; the store back on its port (empty): the
 *   next save reaches it again. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "testcheck.h"
#include "redisstore.h"
#include "testutil.h"
#include "viewcapture.h"

/* Keys carry the snapshot format version (persist/snapshot.h CKV_SNAP_VERSION). */
#define KEY_PREFIX "ckv:v3"

TestSuite(remote, .fini = ckv_test_leak_check);

#define DEADLINE_MS 20000
#define SEAL_OVERHEAD 48u /* persist/seal.h CKV_SEAL_OVERHEAD: magic, nonce, tag */
/* ---- daemons ---- */

/* A daemon on store st whose values are sealed with `key` (ckv_test_store_key_file). */
static void daemon_start_keyed(ckv_test_daemon *d, const ckv_test_store *st, const char *timeout, const char *key) {
  char remote[96], to[64], keyset[700];
  snprintf(remote, sizeof remote, "daemon.remote=%s", st->url);
  snprintf(to, sizeof to, "daemon.remote_timeout=%s", timeout);
  snprintf(keyset, sizeof keyset, "daemon.remote_key_file=%s", key);
  const char *const args[] = {"--set", "daemon.backend=host", "--set", "daemon.detach_keep=60s", "--set", remote,
                              "--set", to, "--set", keyset, "--set", "daemon.remote_allow_no_auth=yes", NULL};
  cr_assert_eq(ckv_test_daemon_start(d, args), 0, "commitkvd with %s did not start: %s", remote,
               ckv_test_file_tail(d->log, 2000));
}

static void daemon_start(ckv_test_daemon *d, const ckv_test_store *st, const char *timeout) {
  daemon_start_keyed(d, st, timeout, ckv_test_store_key_file(st, "fleet"));
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_remote", .timeout_ms = 15000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* ---- a session with history (the workload of test_snapshot.c) ---- */

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u
#define PER_ROUND 24u
#define MODEL "stories260K"
#define REV "r1"

static const ckv_geometry k_geom = {LAYERS, HEADS, DIM, 0};

typedef struct workload {
  ckv_session *s;
  size_t n;
  uint32_t round;
} workload;

static void run_rounds(ckv_client *c, workload *w, uint32_t rounds) {
  size_t elems = HEADS * DIM;
  for (uint32_t k = 0; k < rounds; k++) {
    uint32_t round = ++w->round;
    float sem[PER_ROUND];
    uint8_t roles[PER_ROUND];
    for (uint32_t i = 0; i < PER_ROUND; i++) {
      sem[i] = (w->n + i) % 8 == 1 ? 0.9f : (w->n + i) % 3 == 0 ? 0.2f : 0.5f;
      roles[i] = round == 1 && i < 6 ? CKV_ROLE_SYSTEM : CKV_ROLE_USER;
    }
    uint64_t first = 0;
    int r = ckv_session_append(w->s, PER_ROUND, roles, NULL, sem, NULL, &first);
    cr_assert_eq(r, CKV_OK, "append: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    for (size_t pos = w->n; pos < w->n + PER_ROUND; pos++)
      for (uint32_t layer = 0; layer < LAYERS; layer++) {
        uint16_t kk[HEADS * DIM], vv[HEADS * DIM];
        for (uint32_t e = 0; e < elems; e++) {
          kk[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 0, e));
          vv[e] = ckv_f32_to_f16(ckv_test_kv_value(pos, layer, 1, e));
        }
        cr_assert_eq(ckv_session_write_kv(w->s, pos, layer, kk, vv), CKV_OK);
      }
    w->n += PER_ROUND;
    float *attn = malloc(w->n * sizeof(float));
    for (size_t pos = 0; pos < w->n; pos++)
      attn[pos] = pos % 8 == 1 ? 4.f : pos + PER_ROUND >= w->n ? 1.f : (pos % 3 == 0 && round > 6) ? 0.f : 0.3f;
    ckv_round_result rr;
    r = ckv_session_report(w->s, round, 0, attn, w->n, &rr);
    free(attn);
    cr_assert_eq(r, CKV_OK, "report: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
    cr_assert_eq(ckv_session_ack(w->s, rr.epoch, NULL), CKV_OK);
  }
}

static workload open_workload(ckv_client *c, const char *id, uint32_t rounds) {
  const char *names[] = {"sink_tokens", "recent_window", "persistence_rounds", "idle_rounds", "prune_keep", "rotate"};
  const double values[] = {4, 16, 2, 6, 1, 1};
  ckv_session_options so = {.policy = "commitkv", .param_names = names, .param_values = values, .n_params = 6,
                            .model_id = MODEL, .model_revision = REV};
  workload w = {0};
  int r = ckv_session_open(c, id, &k_geom, &so, &w.s);
  cr_assert_eq(r, CKV_OK, "open %s: %s (%s)", id, ckv_strerror(r), ckv_client_last_error(c));
  run_rounds(c, &w, rounds);
  return w;
}

static int restore_raw(ckv_client *c, const char *id, char *msg, size_t len) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__RestoreSession rs = COMMITKV__V1__RESTORE_SESSION__INIT;
  rs.session_id = (char *)id;
  rs.name = (char *)"";
  rs.model_id = (char *)MODEL;
  rs.model_revision = (char *)REV;
  req.body_case = COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION;
  req.restore_session = &rs;
  Commitkv__V1__Response *rep = NULL;
  int r = ckv_rpc(c, &req, &rep);
  snprintf(msg, len, "%s", r == CKV_OK ? "" : ckv_client_last_error(c));
  if (r == CKV_OK) ckv_rpc_free(rep);
  return r;
}

static uint8_t *read_local(const ckv_test_daemon *d, const char *name, size_t *len) {
  char path[600];
  snprintf(path, sizeof path, "%s/snapshots/default/%s.ckvsnap", d->dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    *len = 0;
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* ---- the tests ---- */

Test(remote, saved_on_one_resumes_on_other, .timeout = 120) {
  ckv_test_store st;
  ckv_test_store_start(&st);
  ckv_test_daemon d1, d2;
  daemon_start(&d1, &st, "2s");
  daemon_start(&d2, &st, "2s");
  ckv_client *c1 = connect_to(&d1), *c2 = connect_to(&d2);
  workload a = open_workload(c1, "fleet-1", 12), b = open_workload(c1, "fleet:2", 9);
  uint64_t bytes = 0;
  cr_assert_eq(ckv_session_save(a.s, NULL, false, &bytes), CKV_OK, "save: %s", ckv_client_last_error(c1));
  cr_assert_eq(ckv_session_save(b.s, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c1));
  ckv_capture before_a = ckv_test_capture_view(c1, "fleet-1", &k_geom), before_b = ckv_test_capture_view(c1, "fleet:2", &k_geom);
  cr_assert_gt(before_a.per_format[CKV_FORMAT_DRAFT], 0, "no draft block");
  cr_assert_gt(before_a.per_format[CKV_FORMAT_STAGED] + before_b.per_format[CKV_FORMAT_STAGED], 0, "no staged block");
  cr_assert_gt(before_a.per_format[CKV_FORMAT_ROT4], 0, "no committed (ROT4) block");

  /* the documented key holds the local file sealed ("fleet:2": ':' encoded): none of its bytes in the clear */
  size_t local_len, remote_len;
  uint8_t *local = read_local(&d1, "fleet-1", &local_len);
  uint8_t *remote = ckv_test_store_get(&st, KEY_PREFIX ":default:" MODEL ":" REV ":fleet-1", &remote_len);
  cr_assert_not_null(remote, "nothing under " KEY_PREFIX ":default:" MODEL ":" REV ":fleet-1");
  cr_assert(local && local_len == bytes, "the local snapshot is not what the save reported");
  cr_assert_eq(remote_len, local_len + SEAL_OVERHEAD, "the store's value is not the snapshot file sealed");
  cr_assert_eq(memcmp(remote, "CKVSEAL1", 8), 0, "the store's value is not sealed");
  cr_assert_null(memmem(remote, remote_len, local + local_len / 2, 64), "the store holds the snapshot in the clear");
  cr_assert_null(memmem(remote, remote_len, "CKVSNAP", 7), "the store holds the snapshot's magic in the clear");
  free(local);
  free(remote);
  remote = ckv_test_store_get(&st, KEY_PREFIX ":default:" MODEL ":" REV ":fleet%3A2", &remote_len);
  cr_assert_not_null(remote, "nothing under the encoded key of fleet:2");
  free(remote);
  cr_assert_eq(ckv_test_stat(&d1, "remote.saves"), 2);
  size_t b_len;
  free(read_local(&d1, "fleet:2", &b_len));
  cr_assert_eq(ckv_test_stat(&d1, "remote.save_bytes"), bytes + b_len + 2 * SEAL_OVERHEAD);

  /* daemon 2 never saw them: OpenSession{resume} and RestoreSession find them in the store */
  ckv_session *a2 = NULL, *b2 = NULL;
  ckv_session_options ro = {.resume = true, .model_id = MODEL, .model_revision = REV};
  int r = ckv_session_open(c2, "fleet-1", NULL, &ro, &a2);
  cr_assert_eq(r, CKV_OK, "resume on daemon 2: %s (%s)", ckv_strerror(r), ckv_client_last_error(c2));
  ckv_session_options mo = {.model_id = MODEL, .model_revision = REV};
  r = ckv_session_restore(c2, "fleet:2", NULL, &mo, &b2);
  cr_assert_eq(r, CKV_OK, "restore on daemon 2: %s (%s)", ckv_strerror(r), ckv_client_last_error(c2));
  cr_assert_null(read_local(&d2, "fleet-1", &local_len), "daemon 2 had a local snapshot: the store was not used");
  ckv_capture after_a = ckv_test_capture_view(c2, "fleet-1", &k_geom), after_b = ckv_test_capture_view(c2, "fleet:2", &k_geom);
  ckv_test_expect_same_view(&before_a, &after_a, "fleet-1 on daemon 2");
  ckv_test_expect_same_view(&before_b, &after_b, "fleet:2 on daemon 2");
  const char *states[4] = {"tokens.draft", "tokens.staged", "tokens.committed", "tokens.recycled"};
  for (int i = 0; i < 4; i++)
    cr_assert_eq(ckv_test_stat(&d2, states[i]), ckv_test_stat(&d1, states[i]), "%s differs between the daemons",
                 states[i]);
  cr_assert_eq(ckv_test_stat(&d2, "remote.loads"), 2);
  cr_assert_eq(ckv_test_stat(&d2, "remote.load_bytes"), bytes + b_len + 2 * SEAL_OVERHEAD);
  /* the round counter came along: round 12 again is refused, 13 accepted */
  float *attn = calloc(before_a.n_tokens, sizeof(float));
  ckv_round_result rr;
  cr_assert_eq(ckv_session_report(a2, 12, 0, attn, before_a.n_tokens, &rr), CKV_ERR_INVALID);
  cr_assert_eq(ckv_session_report(a2, 13, 0, attn, before_a.n_tokens, &rr), CKV_OK, "%s", ckv_client_last_error(c2));
  free(attn);
  char *log = ckv_test_read_file(d2.log);
  cr_assert(log && strstr(log, "restored from the remote store's snapshot"), "daemon 2's log: %s", log ? log : "");
  free(log);
  /* an id neither daemon nor the store knows */
  ckv_session *none = NULL;
  cr_assert_eq(ckv_session_open(c2, "nobody", NULL, &ro, &none), CKV_ERR_NOT_FOUND);
  cr_assert_eq(ckv_test_stat(&d2, "remote.misses"), 1);

  ckv_test_capture_free(&before_a);
  ckv_test_capture_free(&before_b);
  ckv_test_capture_free(&after_a);
  ckv_test_capture_free(&after_b);
  ckv_session_drop(a.s);
  ckv_session_drop(b.s);
  ckv_session_drop(a2);
  ckv_session_drop(b2);
  ckv_client_free(c1);
  ckv_client_free(c2);
  cr_expect_eq(ckv_test_daemon_stop(&d1), 0);
  cr_expect_eq(ckv_test_daemon_stop(&d2), 0);
  ckv_test_store_stop(&st);
}

Test(remote, tampered_value_refused, .timeout = 120) {
  ckv_test_store st;
  ckv_test_store_start(&st);
  ckv_test_daemon d1, d2;
  daemon_start(&d1, &st, "2s");
  daemon_start(&d2, &st, "2s");
  ckv_client *c1 = connect_to(&d1), *c2 = connect_to(&d2);
  workload w = open_workload(c1, "t-1", 8);
  cr_assert_eq(ckv_session_save(w.s, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c1));
  const char *key = KEY_PREFIX ":default:" MODEL ":" REV ":t-1";
  size_t len;
  uint8_t *orig = ckv_test_store_get(&st, key, &len);
  cr_assert_not_null(orig);
  /* in the header section, in the middle (a block's payload), in the end section */
  size_t offs[3] = {40, len / 2, len - 4};
  char msg[600];
  for (int i = 0; i < 3; i++) {
    ckv_test_store_cmd(&st, "SET %s %b", key, orig, len);
    char flipped[1] = {(char)(orig[offs[i]] ^ 0x10)}, off[24];
    snprintf(off, sizeof off, "%zu", offs[i]);
    ckv_test_store_cmd(&st, "SETRANGE %s %s %b", key, off, flipped, (size_t)1);
    int r = restore_raw(c2, "t-1", msg, sizeof msg);
    cr_assert_eq(r, CKV_ERR_CORRUPT, "byte %zu of %zu flipped in the store: restore answered %s (%s)", offs[i], len,
                 ckv_status_name(r), msg);
    cr_assert(strstr(msg, "remote store") && strstr(msg, st.url), "the refusal does not name the store: %s", msg);
    ckv_test_expect_serving(c2);
  }
  ckv_test_store_cmd(&st, "SET %s %b", key, orig, len);
  cr_assert_eq(restore_raw(c2, "t-1", msg, sizeof msg), CKV_OK, "the untouched value: %s", msg);
  free(orig);
  ckv_session_drop(w.s);
  ckv_client_free(c1);
  ckv_client_free(c2);
  cr_expect_eq(ckv_test_daemon_stop(&d1), 0);
  cr_expect_eq(ckv_test_daemon_stop(&d2), 0);
  ckv_test_store_stop(&st);
}

Test(remote, store_gone_mid_save, .timeout = 120) {
  ckv_test_store st;
  ckv_test_store_start(&st);
  ckv_test_daemon d;
  daemon_start(&d, &st, "300ms");
  ckv_client *c = connect_to(&d);
  workload w = open_workload(c, "g-1", 6);
  cr_assert_eq(ckv_session_save(w.s, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c));
  const char *key = KEY_PREFIX ":default:" MODEL ":" REV ":g-1";
  size_t v1_len;
  uint8_t *v1 = ckv_test_store_get(&st, key, &v1_len);
  cr_assert_not_null(v1);
  run_rounds(c, &w, 4); /* the next save holds more */

  /* the store stops answering writes in the middle of the save */
  ckv_test_store_cmd(&st, "CLIENT PAUSE 10000 WRITE");
  int r = ckv_session_save(w.s, NULL, false, NULL);
  char msg[600];
  snprintf(msg, sizeof msg, "%s", ckv_client_last_error(c));
  ckv_test_store_cmd(&st, "CLIENT UNPAUSE");
  cr_assert_eq(r, -EIO, "save with the store paused answered %s (%s)", ckv_status_name(r), msg);
  cr_assert(strstr(msg, st.url) && strstr(msg, "saved locally") && strstr(msg, "intact"), "the text: %s", msg);
  ckv_capture saved = ckv_test_capture_view(c, "g-1", &k_geom);
  /* the store still holds the first save whole, the local file the second */
  size_t now_len, local_len;
  uint8_t *now = ckv_test_store_get(&st, key, &now_len);
  cr_assert(now && now_len == v1_len && memcmp(now, v1, v1_len) == 0, "the store's value changed in a failed save");
  free(now);
  uint8_t *local = read_local(&d, "g-1", &local_len);
  cr_assert(local && (local_len != v1_len || memcmp(local, v1, v1_len) != 0), "the local snapshot is not the newer one");
  free(local);
  /* the restore takes the newer copy: the local one */
  cr_assert_eq(ckv_session_drop(w.s), CKV_OK);
  r = restore_raw(c, "g-1", msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "restore after the failed push: %s (%s)", ckv_status_name(r), msg);
  ckv_capture back = ckv_test_capture_view(c, "g-1", &k_geom);
  ckv_test_expect_same_view(&saved, &back, "g-1 restored after the failed push");
  ckv_test_capture_free(&back);

  /* the store dies: the save says so, the local snapshot is written */
  ckv_session_options ro = {.resume = true, .model_id = MODEL, .model_revision = REV};
  cr_assert_eq(ckv_session_open(c, "g-1", NULL, &ro, &w.s), CKV_OK, "%s", ckv_client_last_error(c));
  ckv_test_store_kill(&st);
  r = ckv_session_save(w.s, NULL, false, NULL);
  snprintf(msg, sizeof msg, "%s", ckv_client_last_error(c));
  cr_assert_eq(r, -EIO, "save with the store dead answered %s (%s)", ckv_status_name(r), msg);
  cr_assert(strstr(msg, st.url) && strstr(msg, "saved locally"), "the text: %s", msg);
  ckv_test_expect_serving(c);
  cr_assert_eq(ckv_session_drop(w.s), CKV_OK);
  r = restore_raw(c, "g-1", msg, sizeof msg);
  cr_assert_eq(r, CKV_OK, "restore with the store dead: %s (%s)", ckv_status_name(r), msg);
  back = ckv_test_capture_view(c, "g-1", &k_geom);
  ckv_test_expect_same_view(&saved, &back, "g-1 restored with the store dead");
  ckv_test_capture_free(&back);
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "remote-unavailable"), "no remote-unavailable line: %s", log ? log : "");
  free(log);
  cr_assert_geq(ckv_test_stat(&d, "remote.errors"), 2);

  /* back on its port, empty: the next save reaches it again */
  ckv_test_store_start_on(&st, st.port);
  cr_assert_eq(ckv_session_open(c, "g-1", NULL, &ro, &w.s), CKV_OK, "%s", ckv_client_last_error(c));
  r = ckv_session_save(w.s, NULL, false, NULL);
  cr_assert_eq(r, CKV_OK, "save with the store back: %s (%s)", ckv_status_name(r), ckv_client_last_error(c));
  now = ckv_test_store_get(&st, key, &now_len);
  cr_assert_not_null(now, "the save did not reach the restarted store");
  free(now);
  /* and one that restarts between two saves costs nothing: the dead connection is made again */
  ckv_test_store_kill(&st);
  ckv_test_store_start_on(&st, st.port);
  r = ckv_session_save(w.s, NULL, false, NULL);
  cr_assert_eq(r, CKV_OK, "save after a store restart: %s (%s)", ckv_status_name(r), ckv_client_last_error(c));
  cr_assert_eq(ckv_test_stat(&d, "remote.saves"), 3);

  free(v1);
  ckv_test_capture_free(&saved);
  ckv_session_drop(w.s);
  ckv_client_free(c);
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);
  ckv_test_store_stop(&st);
}

/* forged_or_foreign_values_refused (issue 40 N4): a value in the store that this daemon did not seal
 * for that tenant and key never restores: the snapshot file written straight into the store (what a
 * local user without the key can forge: a valid file, checksums and all), a value moved to another
 * key, and a value sealed by a daemon with another remote key are each refused with CKV_ERR_CORRUPT
 * saying why, and the daemon keeps serving; the genuine value still restores.  A store without AUTH
 * is refused at start unless remote_allow_no_auth says yes. */
Test(remote, forged_or_foreign_values_refused, .timeout = 120) {
  ckv_test_store st;
  ckv_test_store_start(&st);
  ckv_test_daemon d1, d2, other;
  daemon_start(&d1, &st, "2s");
  daemon_start(&d2, &st, "2s");
  daemon_start_keyed(&other, &st, "2s", ckv_test_store_key_file(&st, "other-fleet"));
  ckv_client *c1 = connect_to(&d1), *c2 = connect_to(&d2), *co = connect_to(&other);
  workload w = open_workload(c1, "f-1", 6);
  cr_assert_eq(ckv_session_save(w.s, NULL, false, NULL), CKV_OK, "save: %s", ckv_client_last_error(c1));
  const char *key = KEY_PREFIX ":default:" MODEL ":" REV ":f-1", *key2 = KEY_PREFIX ":default:" MODEL ":" REV ":f-2";
  size_t len, flen;
  uint8_t *sealed = ckv_test_store_get(&st, key, &len), *file = read_local(&d1, "f-1", &flen);
  cr_assert(sealed && file);
  char msg[700];
  /* another remote key: sealed by a daemon that is not of this fleet */
  int r = restore_raw(co, "f-1", msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_CORRUPT, "another fleet's daemon restored the value: %s (%s)", ckv_status_name(r), msg);
  cr_assert(strstr(msg, "does not open"), "%s", msg);
  /* the value moved to another name's key */
  ckv_test_store_cmd(&st, "SET %s %b", key2, sealed, len);
  r = restore_raw(c2, "f-2", msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_CORRUPT, "a value moved to another key restored: %s (%s)", ckv_status_name(r), msg);
  /* a forged value: a whole, valid snapshot file, written straight into the store */
  ckv_test_store_cmd(&st, "SET %s %b", key, file, flen);
  r = restore_raw(c2, "f-1", msg, sizeof msg);
  cr_assert_eq(r, CKV_ERR_CORRUPT, "an unsealed snapshot file in the store restored: %s (%s)", ckv_status_name(r),
               msg);
  cr_assert(strstr(msg, "not sealed"), "%s", msg);
  ckv_test_expect_serving(c2);
  /* the genuine value, put back, restores on the fleet's other daemon */
  ckv_test_store_cmd(&st, "SET %s %b", key, sealed, len);
  cr_assert_eq(restore_raw(c2, "f-1", msg, sizeof msg), CKV_OK, "the genuine value: %s", msg);
  free(sealed);
  free(file);
  ckv_session_drop(w.s);
  ckv_client_free(c1);
  ckv_client_free(c2);
  ckv_client_free(co);
  cr_expect_eq(ckv_test_daemon_stop(&d1), 0);
  cr_expect_eq(ckv_test_daemon_stop(&d2), 0);
  cr_expect_eq(ckv_test_daemon_stop(&other), 0);
  /* no AUTH, not allowed: the daemon refuses to start and says why */
  ckv_test_daemon bare;
  char remote[96];
  snprintf(remote, sizeof remote, "daemon.remote=%s", st.url);
  const char *const args[] = {"--set", remote, NULL};
  cr_assert_eq(ckv_test_daemon_start(&bare, args), -1, "commitkvd started on a store without AUTH");
  bare.pid = 0;
  char *log = ckv_test_read_file(bare.log);
  cr_assert(log && strstr(log, "no AUTH password") && strstr(log, "remote_allow_no_auth"), "%s", log ? log : "");
  free(log);
  ckv_test_daemon_stop(&bare);
  ckv_test_store_stop(&st);
}

