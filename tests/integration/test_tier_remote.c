/* test_tier_remote.c - the remote tier as a tier (issue 15): a real
 * redis-server on a free loopback port, real commitkvd processes with
 * disk_idle = 1s and remote_idle = 1s pointing at it, libcommitkv in this
 * process, hiredis to look into the store.
 *
 * - idle_session_goes_disk_then_remote_and_back: a quiet session with draft,
 *   staged and committed blocks moves to disk and then on to the store: its
 *   tier file is removed, the store holds it under the documented tier key
 *   with exactly the bytes Stats reports, ListSessions says "remote"; a
 *   GetView brings it back under a new epoch with every block's payload byte
 *   for byte and every token in the same format, the store's copy is
 *   deleted, and the counters add up (a remote hit in tokens, a primary
 *   miss, nothing left below).  A second session dropped while remote takes
 *   its store copy with it.
 * - store_stopped_keeps_the_session_and_says_so: with the store stopped
 *   (SIGSTOP: it takes connections and never answers) a session goes to
 *   disk, its push fails, and it stays on disk with its file intact (errors
 *   counted); the store back, it moves on; the store stopped again, a
 *   request for it is answered -EIO naming the store and saying the copy is
 *   kept, the session stays remote and the daemon keeps serving; the store
 *   back, the next request brings it back identical.
 * - kill9_on_one_resumes_on_another: a session moved to the store by daemon
 *   1, daemon 1 killed with SIGKILL, and daemon 2 (its own socket and state
 *   directory, the same store) resumes it with OpenSession{resume},
 *   identical, and deletes the store's copy.
 * - The store fence (issue 40, persist/fence.h): a second daemon of the fleet
 *   never takes a copy the fence ended, a forged or moved fence record never
 *   lets an old value through, and a drop's reply says (code 0, its text)
 *   when the store did not take the delete, within the store's timeout. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "commitkv/status.h"
#include "kernels/format.h"
#include "redisstore.h"
#include "testcheck.h"
#include "testutil.h"
#include "tiercheck.h"
#include "viewcapture.h"

TestSuite(tier_remote, .fini = ckv_test_leak_check);

#define DEADLINE_MS 20000
#define MODEL "stories260K"
#define REV "r1"
/* the key remote.h documents (CKV_SNAP_VERSION is 3) */
#define TIER_KEY(id) "ckv:tier:v3:default:" MODEL ":" REV ":" id

static void daemon_start(ckv_test_daemon *d, const ckv_test_store *st) {
  char remote[96], keyset[700];
  snprintf(remote, sizeof remote, "daemon.remote=%s", st->url);
  snprintf(keyset, sizeof keyset, "daemon.remote_key_file=%s", ckv_test_store_key_file(st, "fleet"));
  const char *args[] = {"--set", "daemon.disk_idle=1s",    "--set", "daemon.remote_idle=1s", "--set",
                        "daemon.disk_memory=64M", "--set", "daemon.detach_keep=60s", "--set", "daemon.lease=30s",
                        "--set", remote,          "--set", "daemon.remote_timeout=1s", "--set",
                        "daemon.remote_allow_no_auth=yes", "--set", keyset, NULL};
  cr_assert_eq(ckv_test_daemon_start(d, args), 0, "commitkvd with %s did not start: %s", remote,
               ckv_test_file_tail(d->log, 2000));
}

static ckv_client *connect_to(const ckv_test_daemon *d) {
  ckv_client_options o = {.socket = d->socket, .attach_socket = d->attach, .name = "test_tier_remote",
                          .timeout_ms = 15000};
  ckv_client *c = NULL;
  int r = ckv_client_connect(&o, &c);
  cr_assert_eq(r, CKV_OK, "connect: %s (%s)", ckv_strerror(r), ckv_client_connect_error());
  return c;
}

/* A fresh store, daemon d on it, and a client of d: how most tests begin. */
static ckv_client *start_with_store(ckv_test_store *st, ckv_test_daemon *d) {
  ckv_test_store_start(st);
  daemon_start(d, st);
  return connect_to(d);
}

/* How they end: c freed, d stopped (it must exit 0), then the store. */
static void stop_with_store(ckv_client *c, ckv_test_daemon *d, ckv_test_store *st) {
  ckv_client_free(c);
  cr_assert_eq(ckv_test_daemon_stop(d), 0);
  ckv_test_store_stop(st);
}

/* Until the store holds `want` keys matching pattern. */
static void wait_store_keys(const ckv_test_store *st, const char *pattern, size_t want) {
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  size_t n;
  while ((n = ckv_test_store_count(st, pattern)) != want) {
    cr_assert_lt(ckv_test_now_ms(), end, "the store holds %zu keys %s (want %zu)", n, pattern, want);
    usleep(20000);
  }
}

/* ---- a session with history ---- */

#define LAYERS 2u
#define HEADS 2u
#define DIM 32u

static const ckv_geometry k_geom = {LAYERS, HEADS, DIM, 0};

/* `id` (commitkv, the test's model) with `rounds` rounds of history
 * (ckv_test_session_with_rounds: staged and committed blocks). */
static ckv_session *session_with_rounds(ckv_client *c, const char *id, uint32_t rounds) {
  ckv_session_options so = {.policy = "commitkv", .model_id = MODEL, .model_revision = REV};
  return ckv_test_session_with_rounds(c, id, &k_geom, &so, rounds);
}

/* session_with_rounds, its moves done, then quiet until it is in the remote tier. */
static ckv_session *session_in_store(const ckv_test_daemon *d, ckv_client *c, const char *id, uint32_t rounds) {
  ckv_session *s = session_with_rounds(c, id, rounds);
  ckv_test_wait_settled(c);
  ckv_test_wait_tier(d, c, id, "remote");
  return s;
}

/* GetView of `id`, its code and text (no assertion on either). */
static int get_view_raw(ckv_client *c, const char *id, char *msg, size_t len) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__GetView gv = COMMITKV__V1__GET_VIEW__INIT;
  gv.session_id = (char *)id;
  req.body_case = COMMITKV__V1__REQUEST__BODY_GET_VIEW;
  req.get_view = &gv;
  Commitkv__V1__Response *rep = NULL;
  int r = ckv_rpc(c, &req, &rep);
  snprintf(msg, len, "%s", r == CKV_OK ? "" : ckv_client_last_error(c));
  if (r == CKV_OK) ckv_rpc_free(rep);
  return r;
}

/* ---- tests ---- */

Test(tier_remote, idle_session_goes_disk_then_remote_and_back, .timeout = 120) {
  ckv_test_store st;
  ckv_test_daemon d;
  ckv_client *c = start_with_store(&st, &d);
  ckv_session *a = session_with_rounds(c, "rt-a", 12);
  ckv_session *b = session_with_rounds(c, "rt-b", 4);
  ckv_test_wait_settled(c);
  ckv_capture before = ckv_test_capture_view(c, "rt-a", &k_geom);
  size_t compressed = 0;
  for (int f = CKV_FORMAT_STAGED; f < CKV_FORMAT_COUNT_; f++) compressed += before.per_format[f];
  cr_assert(before.per_format[CKV_FORMAT_DRAFT] > 0 && compressed > 0, "the history made no mixed formats");
  size_t tokens_a = ckv_session_tokens(a);

  /* quiet: disk after disk_idle, then the store after remote_idle more */
  ckv_test_wait_tier(&d, c, "rt-a", "remote");
  ckv_test_wait_tier(&d, c, "rt-b", "remote");
  cr_assert(!ckv_test_tier_file_exists(&d, "rt-a"), "the tier file stayed after the push");
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.sessions"), 2);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.offloads"), 2);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.offloads"), 2);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.sessions"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.bytes"), 0, "bytes still counted on disk");
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.sessions"), 0);
  cr_assert_eq(ckv_test_stat(&d, "arenas.0.bytes_used"), 0);
  size_t len_a = 0, len_b = 0;
  uint8_t *va = ckv_test_store_get(&st, TIER_KEY("rt-a"), &len_a), *vb = ckv_test_store_get(&st, TIER_KEY("rt-b"), &len_b);
  cr_assert(va && vb, "the store holds no %s / rt-b", TIER_KEY("rt-a"));
  cr_assert_eq(memcmp(va, "CKVSEAL1", 8), 0, "the value is not a sealed snapshot (persist/seal.h)");
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.bytes"), len_a + len_b, "stats and the store disagree on the bytes");
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.offload_bytes"), len_a + len_b);
  free(va);
  free(vb);

  /* GetView brings rt-a back from the store: a new epoch, the same bytes and states */
  ckv_capture after = ckv_test_capture_view(c, "rt-a", &k_geom);
  cr_assert_gt(after.epoch, before.epoch);
  ckv_test_expect_same_view(&before, &after, "rt-a back from the remote tier");
  wait_store_keys(&st, TIER_KEY("rt-a"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.restores"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.hits"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.hit_tokens"), tokens_a);
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.misses"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.0.miss_tokens"), tokens_a);
  cr_assert_eq(ckv_test_stat(&d, "tiers.1.restores"), 0, "counted as a disk restore");
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.sessions"), 1);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.bytes"), len_b);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.errors"), 0);

  /* a drop while remote deletes the store's copy */
  cr_assert_eq(ckv_session_drop(b), CKV_OK, "drop: %s", ckv_client_last_error(c));
  wait_store_keys(&st, "ckv:tier:*", 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.sessions"), 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.bytes"), 0);

  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(a);
  stop_with_store(c, &d, &st);
}

Test(tier_remote, store_stopped_keeps_the_session_and_says_so, .timeout = 180) {
  ckv_test_store st;
  ckv_test_daemon d;
  ckv_client *c = start_with_store(&st, &d);
  cr_assert_eq(kill(st.pid, SIGSTOP), 0);
  ckv_session *a = session_with_rounds(c, "rt-s", 10);
  ckv_test_wait_settled(c);
  ckv_capture before = ckv_test_capture_view(c, "rt-s", &k_geom);

  /* to disk; the push finds no answer within remote_timeout: it stays on disk, intact */
  ckv_test_wait_stat_at_least(&d, "tiers.1.offloads", 1);
  ckv_test_wait_stat_at_least(&d, "tiers.2.errors", 1);
  char tier[32];
  ckv_test_session_tier(c, "rt-s", tier, sizeof tier);
  cr_assert(strcmp(tier, "disk") == 0 || strcmp(tier, "pushing") == 0, "after a failed push: '%s'", tier);
  cr_assert(ckv_test_tier_file_exists(&d, "rt-s"), "a failed push lost the tier file");
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "tier-push-failed") && strstr(log, st.url), "the log does not say the push failed");
  free(log);

  /* the store back: it moves on */
  cr_assert_eq(kill(st.pid, SIGCONT), 0);
  ckv_test_wait_tier(&d, c, "rt-s", "remote");
  cr_assert(!ckv_test_tier_file_exists(&d, "rt-s"));

  /* the store stopped again: a request is refused with the store's error, the session stays remote */
  cr_assert_eq(kill(st.pid, SIGSTOP), 0);
  char msg[1024];
  int r = get_view_raw(c, "rt-s", msg, sizeof msg);
  cr_assert_eq(r, -EIO, "GetView with the store stopped: %s (%s)", ckv_strerror(r), msg);
  cr_assert(strstr(msg, "remote store") && strstr(msg, st.url) && strstr(msg, "kept"), "the text: %s", msg);
  cr_assert_str_eq(ckv_test_session_tier(c, "rt-s", tier, sizeof tier), "remote");
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.sessions"), 1);
  ckv_test_expect_serving(c);

  /* the store back: the next request brings it back, identical */
  cr_assert_eq(kill(st.pid, SIGCONT), 0);
  ckv_capture after = ckv_test_capture_view(c, "rt-s", &k_geom);
  ckv_test_expect_same_view(&before, &after, "rt-s after the store came back");
  wait_store_keys(&st, "ckv:tier:*", 0);
  cr_assert_eq(ckv_test_stat(&d, "tiers.2.restores"), 1);

  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(a);
  stop_with_store(c, &d, &st);
}

Test(tier_remote, kill9_on_one_resumes_on_another, .timeout = 120) {
  ckv_test_store st;
  ckv_test_store_start(&st);
  ckv_test_daemon d1, d2;
  daemon_start(&d1, &st);
  daemon_start(&d2, &st);
  ckv_client *c1 = connect_to(&d1);
  ckv_session *s = session_with_rounds(c1, "rt-k", 10);
  ckv_test_wait_settled(c1);
  ckv_capture before = ckv_test_capture_view(c1, "rt-k", &k_geom);
  ckv_session_close(s); /* detached: it goes down all the same */
  ckv_test_wait_tier(&d1, c1, "rt-k", "remote");
  ckv_client_free(c1);
  cr_assert_eq(kill(d1.pid, SIGKILL), 0);
  cr_assert_eq(ckv_test_wait(d1.pid, DEADLINE_MS), 128 + SIGKILL);

  /* daemon 2 never held it: its state directory has neither a tier file nor a snapshot */
  ckv_client *c2 = connect_to(&d2);
  ckv_session_options so = {.policy = "commitkv", .resume = true, .model_id = MODEL, .model_revision = REV};
  ckv_session *s2 = NULL;
  int r = ckv_session_open(c2, "rt-k", &k_geom, &so, &s2);
  cr_assert_eq(r, CKV_OK, "resume on the other daemon: %s (%s)", ckv_strerror(r), ckv_client_last_error(c2));
  ckv_capture after = ckv_test_capture_view(c2, "rt-k", &k_geom);
  ckv_test_expect_same_view(&before, &after, "rt-k resumed on daemon 2");
  wait_store_keys(&st, "ckv:tier:*", 0);
  cr_assert_eq(ckv_test_stat(&d2, "tiers.2.restores"), 1);
  cr_assert_eq(ckv_test_stat(&d2, "tiers.2.hit_tokens"), ckv_session_tokens(s2));
  char *log = ckv_test_read_file(d2.log);
  cr_assert(log && strstr(log, "the remote tier's"), "daemon 2 does not say where the session came from");
  free(log);

  ckv_test_capture_free(&before);
  ckv_test_capture_free(&after);
  ckv_session_close(s2);
  ckv_client_free(c2);
  cr_assert_eq(ckv_test_daemon_stop(&d2), 0);
  ckv_test_rmdir(d1.dir);
  ckv_test_store_stop(&st);
}

/* a_dropped_session_never_comes_back_from_the_store (issue 40 N1): a session in the remote tier is
 * dropped while the store is down (killed after a SAVE), so the delete fails and, once the store is
 * back on its port with its data, it still holds the copy (checked); a resume of the id must not
 * restore the ended conversation (before: it came back with every token and code 0).  The end of
 * the conversation was recorded before the drop was answered, and the store's copy is fenced. */
Test(tier_remote, a_dropped_session_never_comes_back_from_the_store, .timeout = 180) {
  ckv_test_store st;
  ckv_test_daemon d;
  ckv_client *c = start_with_store(&st, &d);
  ckv_session *s = session_in_store(&d, c, "rt-n1", 6);
  ckv_test_store_cmd(&st, "SAVE"); /* what the store holds now comes back with it */
  int port = st.port;
  ckv_test_store_kill(&st);
  cr_assert_eq(ckv_session_drop(s), CKV_OK, "drop: %s", ckv_client_last_error(c));
  usleep(1500000); /* the I/O thread's delete meets no store */
  ckv_test_store_start_on(&st, port);
  size_t len = 0;
  uint8_t *left = ckv_test_store_get(&st, TIER_KEY("rt-n1"), &len);
  cr_assert_not_null(left, "the store came back without the copy: the window this test needs was missed");
  free(left);
  ckv_session_options ro = {.resume = true, .model_id = MODEL, .model_revision = REV};
  ckv_session *back = NULL;
  int r = ckv_session_open(c, "rt-n1", NULL, &ro, &back);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "the dropped conversation came back from the store: %s (%s), %llu tokens",
               ckv_strerror(r), ckv_client_last_error(c), back ? (unsigned long long)ckv_session_tokens(back) : 0ull);
  char *log = ckv_test_read_file(d.log);
  cr_assert(log && strstr(log, "copy-fenced"), "the daemon did not say it fenced the store's copy");
  free(log);
  stop_with_store(c, &d, &st);
}

/* ---- the store fence (issue 40: "with a store shared by several daemons
 * the fence lives in the store too"; "a drop whose remote delete failed
 * says so in its reply text") ---- */

#define FENCE_KEY(id) "ckv:fence:default:" id

/* Until the store holds a value under key other than `was` (NULL: any), or
 * DEADLINE_MS ran out: whether it does (no assertion: on a daemon without
 * the store fence it never comes). */
static bool store_changes_soon(const ckv_test_store *st, const char *key, const uint8_t *was, size_t was_len) {
  long long end = ckv_test_now_ms() + DEADLINE_MS;
  while (ckv_test_now_ms() < end) {
    size_t len = 0;
    uint8_t *v = ckv_test_store_get(st, key, &len);
    bool changed = v && (!was || len != was_len || memcmp(v, was, len) != 0);
    free(v);
    if (changed) return true;
    usleep(50000);
  }
  return false;
}

/* Resumes `id` on daemon c; asserts the old conversation did not come back. */
static void resume_refused(ckv_client *c, const char *id, const char *what) {
  ckv_session_options ro = {.resume = true, .model_id = MODEL, .model_revision = REV};
  ckv_session *back = NULL;
  int r = ckv_session_open(c, id, NULL, &ro, &back);
  cr_assert_eq(r, CKV_ERR_NOT_FOUND, "%s: the ended conversation came back from the store: %s (%s), %llu tokens", what,
               ckv_strerror(r), ckv_client_last_error(c), back ? (unsigned long long)ckv_session_tokens(back) : 0ull);
}

/* a_second_daemon_never_takes_a_copy_the_store_fence_ended (issue 40): daemons A and B, each with
 * its own state directory, share one store and one key file (one fleet).  A session of A goes to
 * the remote tier; the store is killed (its data saved) and A drops the session: code 0, and the
 * reply's text says the remote copy could not be deleted and is fenced.  The store comes back (with
 * the record of the conversation's open); A's retry writes the ended record over it.  The old value is then put back under its key (a delete that
 * failed, a late push: the same bytes, sealed with the fleet's key), and B, which never recorded
 * the id, resumes it: NOT_FOUND, never the old bytes.  (Before the store fence B restored every
 * token with code 0.) */
Test(tier_remote, a_second_daemon_never_takes_a_copy_the_store_fence_ended, .timeout = 180) {
  ckv_test_store st;
  ckv_test_daemon a, b;
  ckv_client *ca = start_with_store(&st, &a);
  ckv_session *s = session_in_store(&a, ca, "rt-fleet", 6);
  size_t old_len = 0;
  uint8_t *old = ckv_test_store_get(&st, TIER_KEY("rt-fleet"), &old_len);
  cr_assert_not_null(old, "the remote tier's value is not under its key");
  size_t open_len = 0;
  uint8_t *open_rec = ckv_test_store_get(&st, FENCE_KEY("rt-fleet"), &open_len); /* the open's record, if any */
  ckv_test_store_cmd(&st, "SAVE");
  int port = st.port;
  ckv_test_store_kill(&st);
  long long t0 = ckv_test_now_ms();
  cr_assert_eq(ckv_session_drop(s), CKV_OK, "drop: %s", ckv_client_last_error(ca));
  long long waited = ckv_test_now_ms() - t0;
  cr_log_info("drop with the store down answered in %lld ms", waited);
  char note[512];
  snprintf(note, sizeof note, "%s", ckv_client_last_note(ca));
  ckv_test_store_start_on(&st, port);
  bool fenced = store_changes_soon(&st, FENCE_KEY("rt-fleet"), open_rec, open_len); /* the drop's record */
  free(open_rec);
  ckv_test_store_cmd(&st, "SET %s %b", TIER_KEY("rt-fleet"), old, old_len); /* the copy a failed delete leaves */
  free(old);
  daemon_start(&b, &st);
  ckv_client *cb = connect_to(&b);
  resume_refused(cb, "rt-fleet", "daemon B");
  cr_assert(fenced, "daemon A never wrote the store fence after the store came back");
  cr_assert(strstr(note, "remote copy could not be deleted") && strstr(note, "fenced"),
            "the drop's reply does not say its remote delete failed: '%s'", note);
  cr_assert_lt(waited, 3000, "the drop's reply took %lld ms with the store down (its timeout is 1 s)", waited);
  char *log = ckv_test_read_file(b.log);
  cr_assert(log && strstr(log, "copy-fenced") && strstr(log, "ended"), "daemon B did not say it fenced the copy");
  free(log);
  ckv_client_free(cb);
  cr_assert_eq(ckv_test_daemon_stop(&b), 0);
  stop_with_store(ca, &a, &st);
}

/* a_forged_or_moved_store_fence_never_lets_an_old_value_through (issue 40): daemon A drops a session
 * of the remote tier with the store up (the reply's text is empty; the store then holds the fence
 * and no value).  The old value is put back, and the fence record is replaced by (1) bytes written
 * without the key (a forger's "sealed" record), (2) the genuine, sealed record of another id
 * (rt-live, a live conversation) moved under this id's key, as another tenant's record would be:
 * neither opens, and daemon B (which never recorded the id) refuses the value each time, saying why;
 * with the genuine record back it refuses it too. */
Test(tier_remote, a_forged_or_moved_store_fence_never_lets_an_old_value_through, .timeout = 180) {
  ckv_test_store st;
  ckv_test_daemon a, b;
  ckv_client *ca = start_with_store(&st, &a);
  ckv_session *s = session_in_store(&a, ca, "rt-forge", 6);
  size_t old_len = 0, gen_len = 0, live_len = 0;
  uint8_t *old = ckv_test_store_get(&st, TIER_KEY("rt-forge"), &old_len);
  cr_assert_not_null(old);
  long long t0 = ckv_test_now_ms();
  cr_assert_eq(ckv_session_drop(s), CKV_OK, "drop: %s", ckv_client_last_error(ca));
  cr_log_info("drop with the store up answered in %lld ms", ckv_test_now_ms() - t0);
  cr_assert_str_empty(ckv_client_last_note(ca), "a drop with the store up says: %s", ckv_client_last_note(ca));
  uint8_t *genuine = ckv_test_store_get(&st, FENCE_KEY("rt-forge"), &gen_len);
  cr_assert_not_null(genuine, "the drop's reply came before the store fence was written");
  size_t left = 0;
  free(ckv_test_store_get(&st, TIER_KEY("rt-forge"), &left));
  cr_assert_eq(left, 0, "the drop did not delete the remote copy");
  ckv_session *live = session_with_rounds(ca, "rt-live", 1);
  cr_assert(store_changes_soon(&st, FENCE_KEY("rt-live"), NULL, 0), "a new conversation wrote no store fence");
  uint8_t *live_rec = ckv_test_store_get(&st, FENCE_KEY("rt-live"), &live_len);
  ckv_test_store_cmd(&st, "SET %s %b", TIER_KEY("rt-forge"), old, old_len);
  daemon_start(&b, &st);
  ckv_client *cb = connect_to(&b);
  /* (1) forged: the seal's header and random bytes */
  uint8_t forged[64] = "CKVSEAL1";
  for (size_t i = 8; i < sizeof forged; i++) forged[i] = (uint8_t)(i * 37u + 11u);
  ckv_test_store_cmd(&st, "SET %s %b", FENCE_KEY("rt-forge"), forged, sizeof forged);
  resume_refused(cb, "rt-forge", "a forged fence");
  /* (2) another id's genuine record, moved */
  ckv_test_store_cmd(&st, "SET %s %b", FENCE_KEY("rt-forge"), live_rec, live_len);
  resume_refused(cb, "rt-forge", "a moved fence");
  /* the genuine record of the drop */
  ckv_test_store_cmd(&st, "SET %s %b", FENCE_KEY("rt-forge"), genuine, gen_len);
  resume_refused(cb, "rt-forge", "the genuine fence");
  char *log = ckv_test_read_file(b.log);
  cr_assert(log && strstr(log, "does not open"), "daemon B did not say the fence record does not open");
  free(log);
  free(old);
  free(genuine);
  free(live_rec);
  ckv_session_close(live);
  ckv_client_free(cb);
  cr_assert_eq(ckv_test_daemon_stop(&b), 0);
  stop_with_store(ca, &a, &st);
}

/* a_drop_with_the_store_hung_is_answered_within_its_timeout (issue 40): the store stopped
 * (SIGSTOP: it takes the connection and never answers), a drop of a session in the remote tier is
 * answered 0 after the store's timeout (1 s here), not at once and not after the client's, with a
 * text naming the failed delete; the store back, the retry writes the fence and deletes the copy. */
Test(tier_remote, a_drop_with_the_store_hung_is_answered_within_its_timeout, .timeout = 120) {
  ckv_test_store st;
  ckv_test_daemon d;
  ckv_client *c = start_with_store(&st, &d);
  ckv_session *s = session_in_store(&d, c, "rt-hung", 4);
  size_t open_len = 0;
  uint8_t *open_rec = ckv_test_store_get(&st, FENCE_KEY("rt-hung"), &open_len);
  cr_assert_eq(kill(st.pid, SIGSTOP), 0);
  long long t0 = ckv_test_now_ms();
  int r = ckv_session_drop(s);
  long long waited = ckv_test_now_ms() - t0;
  char note[512];
  snprintf(note, sizeof note, "%s", ckv_client_last_note(c));
  cr_assert_eq(kill(st.pid, SIGCONT), 0);
  cr_log_info("drop with the store hung answered in %lld ms: %s", waited, note);
  cr_assert_eq(r, CKV_OK, "drop: %s (%s)", ckv_strerror(r), ckv_client_last_error(c));
  cr_assert(strstr(note, "remote copy") && strstr(note, "fenced"), "the drop's text: '%s'", note);
  cr_assert(waited >= 900 && waited < 3000, "the drop was answered after %lld ms (timeout 1 s)", waited);
  cr_assert(store_changes_soon(&st, FENCE_KEY("rt-hung"), open_rec, open_len), "the fence's retry never landed");
  wait_store_keys(&st, TIER_KEY("rt-hung"), 0);
  free(open_rec);
  stop_with_store(c, &d, &st);
}
