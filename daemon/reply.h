/* reply.h - a reply on its way out: finished (the boot token, header
 * shadows flushed to the arena, error counters, valid UTF-8) and sent over
 * the ROUTER socket without waiting. */
#ifndef CKV_DAEMON_REPLY_H
#define CKV_DAEMON_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/daemon.h"

/* What every reply gets before it is packed (c may be NULL). */
void ckv_reply_finish(ckv_server *s, ckv_conn *c, Commitkv__V1__Response *rep);
/* Packs rep and sends it to `to` when that client is still attached (c, the
 * caller's lookup of it, not NULL); a vanished peer costs a dropped reply. */
void ckv_reply_send(ckv_server *s, const ckv_reply_to *to, ckv_conn *c, Commitkv__V1__Response *rep);
/* Packs rep and sends [id][empty, when delim][reply] (c, for the log, may be NULL). */
void ckv_reply_send_raw(ckv_server *s, const void *id, size_t id_len, bool delim, const ckv_conn *c,
                        Commitkv__V1__Response *rep);

/* Sends a reply packed before: [id][empty, when delim][data] (c, for the log, may be NULL). */
void ckv_reply_send_packed(ckv_server *s, const void *id, size_t id_len, bool delim, const ckv_conn *c,
                           const void *data, size_t len);

#endif
