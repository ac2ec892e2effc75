/* held.h - replies held until the change they acknowledge is durable in the
 * warm journal (issue 43; persist/warmjournal.h).
 *
 * A request that changes a session (open, append, report, ack, fork,
 * restore) is served at once, but its reply waits here, packed, until the
 * journal has written an entry of that session captured after the change
 * (group commit: the loop starts a batch as soon as a reply waits and none
 * is in flight; the writer thread wakes it when the batch is on disk).  So
 * after a kill -9 every change a worker was told about comes back.  Error
 * replies, reads and every reply while the journal is off go at once.
 * Held replies go in the order they were held; one whose client went away
 * meanwhile is dropped.  A waiting client is not silent: its lease holds. */
#ifndef CKV_DAEMON_HELD_H
#define CKV_DAEMON_HELD_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/daemon.h"

/* From the handler that changed session sess (the loop): the reply being
 * built waits for sess's change (ckv_held_take), unless the journal has
 * nothing to wait for (off, sess in no entry, no change). */
void ckv_held_note(ckv_server *s, const ckv_srv_session *sess);
/* Forgets a note (the request failed after all, or a new one starts). */
void ckv_held_clear(ckv_server *s);
/* Instead of sending rep to `to` (client c): when a note is pending and rep
 * is no error, rep is packed and held, and true is returned (the caller
 * sends nothing).  false: the caller sends it now.  The note is cleared
 * either way.  Out of memory: false (sent now, logged). */
bool ckv_held_take(ckv_server *s, const ckv_reply_to *to, ckv_conn *c, Commitkv__V1__Response *rep);
/* Sends every held reply whose change is durable now (the loop, each turn). */
void ckv_held_release(ckv_server *s);
/* Held replies waiting. */
size_t ckv_held_count(const ckv_server *s);
/* Drops every held reply unsent (logged when there are any): at the stop,
 * after ckv_warm_journal_flush and ckv_held_release. */
void ckv_held_free(ckv_server *s);

#endif
