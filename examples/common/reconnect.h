/* reconnect.h - how the reference workers ride through a daemon restart.
 *
 * When commitkvd dies (kill -9, a crash, a restart by systemd) a worker's
 * calls fail with CKV_ERR_TIMEOUT (the request went to the dead daemon),
 * CKV_ERR_DISCONNECTED (it could not be sent) or CKV_ERR_DAEMON_RESTARTED
 * (a new daemon answered, or the heartbeat thread already re-attached to it
 * and the session handle is of the old one).  The worker then re-attaches
 * with exponential backoff (reconnect_client), reopens each session
 * (reconnect_session: resumed when the daemon still holds exactly what the
 * worker wrote, else opened afresh) and re-prefills the fresh ones from what
 * it knows of its own tokens, then goes on with the round it was on.
 *
 * Shared by commitkv-worker and commitkv-llm; libcommitkv itself never
 * sleeps, retries or prints. */
#ifndef CKV_EXAMPLES_RECONNECT_H
#define CKV_EXAMPLES_RECONNECT_H

#include <stdbool.h>
#include <stdint.h>

#include "commitkv/commitkv.h"

#define RECONNECT_FIRST_MS 50         /* first pause between two tries */
#define RECONNECT_MAX_MS 2000         /* the pause doubles up to this */
#define RECONNECT_DEFAULT_GIVE_UP_MS 30000

/* Milliseconds on the monotonic clock. */
long long reconnect_now_ms(void);

/* True when `status` (from a call on session s of client c, s may be NULL)
 * means the daemon went away rather than refused the request: a transport
 * status, a client cut off since, or a handle that a reconnect by the
 * heartbeat thread made stale (then the new daemon may have answered
 * CKV_ERR_NOT_FOUND for the old session's id; ckv_session_view tells). */
bool reconnect_daemon_gone(ckv_client *c, ckv_session *s, int status);

/* True when the daemon answered but refused for a while, not for good: a
 * resume that needs the remote store while it is unreachable (-EIO), or a
 * busy daemon (CKV_ERR_BUSY).  The reference workers pause
 * (reconnect_pause) and try again until their deadline, as for a daemon
 * that went away. */
bool reconnect_transient(int status);
/* Sleeps before the next try after a transient refusal: RECONNECT_MAX_MS / 4,
 * or what is left to deadline_ms. */
void reconnect_pause(long long deadline_ms);

/* Calls ckv_client_reconnect until it succeeds, pausing RECONNECT_FIRST_MS,
 * doubling to RECONNECT_MAX_MS, between tries, and gives up once the
 * monotonic clock passes deadline_ms.  Returns CKV_OK or the last try's
 * status (ckv_client_last_error() says why). */
int reconnect_client(ckv_client *c, long long deadline_ms);

/* The first connect, waiting for a daemon that is not there yet (a worker
 * started while commitkvd starts or restarts): ckv_client_connect with the
 * same backoff as reconnect_client until deadline_ms.  A daemon that
 * answers and refuses (CKV_ERR_AUTH, CKV_ERR_LIMIT, CKV_ERR_VERSION,
 * CKV_ERR_INVALID) is not waited for.  Returns CKV_OK with *ret, or the last
 * try's status (ckv_client_connect_error() says why). */
int reconnect_first_connect(const ckv_client_options *o, ckv_client **ret, long long deadline_ms);

/* Reopens session `id` after reconnect_client.  *s is the old handle (or
 * NULL) and is freed here.  The session is resumed when the daemon still has
 * it with exactly `tokens` tokens and may_keep is true (false when a request
 * whose effect is unknown, such as a report, was lost on it); otherwise a
 * session the daemon still has is dropped and a new one opened with g and
 * opt.  On CKV_OK *s is the new handle, *ret_fresh says whether it is a new
 * (empty) session the caller must re-prefill and *ret_restarted whether the
 * old handle belonged to a daemon that has since been replaced.  On failure
 * *s is NULL. */
int reconnect_session(ckv_client *c, ckv_session **s, const char *id, const ckv_geometry *g,
                      const ckv_session_options *opt, uint64_t tokens, bool may_keep, bool *ret_fresh,
                      bool *ret_restarted);

#endif
