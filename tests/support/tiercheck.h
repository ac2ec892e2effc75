/* tiercheck.h - what the tier tests (test_tiers, test_tier_remote,
 * test_tier_pressure, test_high_water) share: sessions given K/V and a
 * history the same way (so a view that went down and came back can be
 * checked against ckv_test_kv_value), a tenant's arena bytes, where a session
 * lives (the tier its ListSessions entry names, whether its file sits in the
 * disk tier, state_dir/tier/<tenant>/<id>.ckvsnap), and the waits for a
 * session, a stats field or every move to get where a test needs it.  The
 * waits poll for up to CKV_TEST_TIER_DEADLINE_MS and then fail the test. */
#ifndef CKV_TEST_TIERCHECK_H
#define CKV_TEST_TIERCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "testutil.h"

/* How long each ckv_test_wait_* below waits before it fails the test. */
#define CKV_TEST_TIER_DEADLINE_MS 20000

/* ---- sessions with K/V ---- */

/* Writes K and V of every layer of g for positions [from, from + n): fp16 of
 * ckv_test_kv_value (K: kv 0, V: kv 1), asserting each write. */
void ckv_test_write_tokens(ckv_session *s, const ckv_geometry *g, size_t from, size_t n);

/* Opens `id` on g with `base`'s options and runs `rounds` rounds of 24
 * tokens each (facts hot, older text cold, a third of it forgotten: with the
 * commitkv policy, staged and committed blocks), acking every epoch.  When
 * base->policy is "commitkv" the workload's parameters are set (sink_tokens 4,
 * recent_window 16, persistence_rounds 2, idle_rounds 6, prune_keep 1) in
 * place of base's.  Asserts every step; the session is the caller's. */
ckv_session *ckv_test_session_with_rounds(ckv_client *c, const char *id, const ckv_geometry *g,
                                          const ckv_session_options *base, uint32_t rounds);

/* An fp16 session of n tokens on g with K/V written and one round reported
 * (so the daemon knows its worker is done writing), its epoch acked.  It
 * asserts nothing about the steps (a child of ckv_test_run_as may call it):
 * NULL, the failing step's code in *ret_code and "id: error (text)" in msg
 * when one failed; otherwise the session, *ret_code CKV_OK. */
ckv_session *ckv_test_written_session(ckv_client *c, const char *id, const ckv_geometry *g, uint32_t n, int *ret_code,
                                      char *msg, size_t len);

/* ---- where bytes and sessions are ---- */

/* Tenant `name`'s arena bytes in use (Stats; c must see that tenant's
 * arena); fails the test when it has none. */
unsigned long long ckv_test_arena_used(ckv_client *c, const char *name);

/* The ListSessions reply (asserted to be one); free it with ckv_rpc_free. */
Commitkv__V1__Response *ckv_test_list_sessions(ckv_client *c);
/* The tier ListSessions names for `sid` ("primary", "disk", ...) into buf, "?"
 * when the session is not listed; returns buf. */
char *ckv_test_session_tier(ckv_client *c, const char *sid, char *buf, size_t len);
/* Whether state_dir/tier/<any tenant>/<id>.ckvsnap exists. */
bool ckv_test_tier_file_exists(const ckv_test_daemon *d, const char *id);

/* ---- waits ---- */

/* Until stats field `path` reads at least `want`; returns what it read. */
unsigned long long ckv_test_wait_stat_at_least(const ckv_test_daemon *d, const char *path, unsigned long long want);
/* Until ListSessions says session `id` is in tier `want` (ListSessions names
 * no session for the tier, so it never brings one back). */
void ckv_test_wait_tier(const ckv_test_daemon *d, ckv_client *c, const char *id, const char *want);
/* Until every decided move of every session is done (the views stop changing). */
void ckv_test_wait_settled(ckv_client *c);

#endif
