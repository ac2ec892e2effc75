/* tiercheck.h - where a session lives, as the tier tests see it: the tier its
 * ListSessions entry names, and whether its file sits in the disk tier
 * (state_dir/tier/<tenant>/<id>.ckvsnap).  Shared by test_tiers and
 * test_tier_pressure. */
#ifndef CKV_TEST_TIERCHECK_H
#define CKV_TEST_TIERCHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "commitkv.pb-c.h"
#include "commitkv/commitkv.h"
#include "testutil.h"

/* The ListSessions reply (asserted to be one); free it with ckv_rpc_free. */
Commitkv__V1__Response *ckv_test_list_sessions(ckv_client *c);
/* The tier ListSessions names for `sid` ("primary", "disk", ...) into buf, "?"
 * when the session is not listed; returns buf. */
char *ckv_test_session_tier(ckv_client *c, const char *sid, char *buf, size_t len);
/* Whether state_dir/tier/<any tenant>/<id>.ckvsnap exists. */
bool ckv_test_tier_file_exists(const ckv_test_daemon *d, const char *id);

#endif
