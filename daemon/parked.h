/* parked.h - requests waiting for their session (or for room), kept until
 * persist/ says they may go on; the loop (server.c) serves them again.
 *
 * A request whose session is on disk or in the remote store, or coming back
 * from there, waits here (ckv_tier_gate answered CKV_TIER_PARK): its bytes as
 * they came, under the session's key, in arrival order.  When persist/ says
 * the session is ready (ckv_persist_hooks.session_ready) the loop takes them
 * and serves each again exactly as it serves a request (through the gate,
 * which lets it pass now), or answers it with persist/'s error.  Requests
 * that made the tier move other sessions down for room (ckv_tier_make_room)
 * wait in one list of their own (room_made).  A waiting client is not
 * silent: its lease holds while it waits (ckv_conn.io_inflight). */
#ifndef CKV_DAEMON_PARKED_H
#define CKV_DAEMON_PARKED_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/daemon.h"

/* One waiting request: its bytes as they came, and where its reply goes. */
typedef struct ckv_parked_req {
  struct ckv_parked_req *next;
  ckv_reply_to to;
  size_t len;
  uint8_t data[];
} ckv_parked_req;

/* Request req of client c (being served: its reply goes to s->reply_to)
 * waits for session `key` ("tenant/id"), or for room when key is NULL.
 * Returns CKV_REPLY_DEFERRED (the reply comes later), or -ENOMEM. */
int ckv_parked_add(ckv_server *s, ckv_conn *c, const char *key, const Commitkv__V1__Request *req);
/* The requests waiting for session `key` (NULL: for room), in arrival order,
 * taken out: the caller answers each and frees it.  NULL when none waits. */
ckv_parked_req *ckv_parked_take(ckv_server *s, const char *key);
/* Frees every waiting request, unanswered (the daemon stops). */
void ckv_parked_free(ckv_server *s);

#endif
