/* attach.h - clients come and go: the attach handshake over the unix socket
 * (SO_PEERCRED, the tenant a peer maps to, the attach key, the arenas' fds),
 * the limits on clients, an attached client's later refreshes, and a client's
 * end (its sessions detached, kept for resume until detach_keep). */
#ifndef CKV_DAEMON_ATTACH_H
#define CKV_DAEMON_ATTACH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/daemon.h"

/* The run-time tenant for spec->name, created on first use within the
 * daemon's memory (ckv_store_tenant). */
ckv_tenant *ckv_attach_tenant(ckv_server *s, const ckv_tenant_spec *spec, int *ret_status);
/* Applies a reloaded spec to live tenant t: quota (cut to what its arena
 * holds: a bigger arena needs a restart), session and client limits,
 * policies.  Logs what changed. */
void ckv_attach_retune_tenant(ckv_server *s, ckv_tenant *t, const ckv_tenant_spec *spec);
/* Why a new client of tenant spec (NULL: an admin of no tenant) must be
 * refused for want of a slot, written into buf, or NULL when it may attach:
 * the tenant's max_clients first, then the daemon's (all tenants). */
const char *ckv_attach_client_limit(const ckv_server *s, const ckv_tenant_spec *spec, char *buf, size_t len);
/* The client is gone: its sessions are detached, the connection freed, and
 * `why` logged at `level` (a ckv_log_level). */
void ckv_attach_drop_conn(ckv_server *s, ckv_conn *c, int level, const char *why);
/* Nobody reads the session any more: kept for resume until detach_keep. */
void ckv_attach_detach_session(ckv_server *s, ckv_srv_session *sess);
/* A connection just accepted on the attach socket (non-blocking); takes
 * ownership of fd.  A peer that maps to no tenant and is not admin is
 * refused at once (CKV_ERR_AUTH), before anything is read from it; a request
 * already there is served; otherwise the connection waits in s->pending
 * (within the per-uid and total bounds, else CKV_ERR_LIMIT). */
void ckv_attach_accept(ckv_server *s, int fd);
/* Pending attach `i` is readable: reads what arrived and, once the frame is
 * complete or broken, answers it and removes entry i (the last entry moves
 * into its place, so walk the entries from the end). */
void ckv_attach_pending_input(ckv_server *s, size_t i);
/* Refused connection `i` is readable: drops what arrived, unread, and closes
 * it at EOF (removing entry i as ckv_attach_pending_input does). */
void ckv_attach_refused_input(ckv_server *s, size_t i);
/* Closes, with CKV_ERR_TIMEOUT, pending attaches whose deadline passed, and
 * refused connections whose time is up. */
void ckv_attach_expire(ckv_server *s, uint64_t now_ms);
/* Closes every pending and refused attach connection and frees the set
 * (server shutdown). */
void ckv_attach_pending_free(ckv_server *s);
/* True when attached client c began an attach-socket frame that missed its
 * deadline (the caller drops the client). */
bool ckv_attach_conn_late(const ckv_conn *c, uint64_t now_ms);
/* Input on an attached client's unix socket, read without waiting: once an
 * AttachRequest{refresh} is complete it is answered with the tenant's arenas
 * as they are now (new chunks' fds included); any other complete request is
 * answered with CKV_ERR_PROTO.  Returns false when the socket reached EOF or
 * broke, or the frame was not a frame (the caller drops the client). */
bool ckv_attach_conn_input(ckv_server *s, ckv_conn *c);

#endif
