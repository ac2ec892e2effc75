/* warmjournal.h - the warm journal kept current while serving
 * ([daemon] warm_journal; docs/warm-restart.md, issue 43).
 *
 * warm.h writes the journal (manifest + one CKV_SNAP_BLOCK_REFS entry per
 * session under STATE_DIR/warm) at a clean stop.  This module keeps it
 * current in between, so that after a kill -9 the next daemon adopts the
 * arenas from systemd's fd store and the sessions on their blocks, each as
 * of its last durable record.  It is a write-ahead log over a checkpoint:
 * the loop captures each session that changed (rounds, tokens, epoch, block
 * table; opens, drops, tier moves), header regions and token columns only,
 * and hands the batch to the journal's own writer thread, which appends one
 * record per session (warmlog.h: PUT with the entry's bytes, DEL for a
 * session no longer journaled, each sealed with its XXH64) to
 * STATE_DIR/warm/journal.log and fdatasyncs once per batch.  Now and then
 * (the log past CKV_WARM_COMPACT_BYTES, the tenants changed, a batch
 * failed, a daemon's first) a batch is a checkpoint instead: every
 * session's entry file (temporary file, fsync, rename, directory fsync),
 * then the manifest, then a new empty log naming that manifest, then the
 * entries no longer listed go.  One batch is in flight at a time.
 *
 * The rule that makes an entry safe to adopt: a block a journal entry on
 * disk may name keeps its bytes.  While the journal is on, every block a
 * tenant frees is held (store/tenant.h journal_hold: still allocated and
 * charged) and given back only when no batch is in flight and no entry of
 * the last durable batch (or an earlier entry a failed batch may have left
 * on disk) names its offset.  A session that cannot be captured now
 * (compressor jobs in flight, a move's tokens pending) keeps its previous
 * entry, and the blocks that entry names stay held until one replaces it.
 *
 * Durable before acknowledged: the daemon holds the reply to a request that
 * changed a session (daemon/held.h) until an entry of that session captured
 * after the change is durable (ckv_warm_journal_need / _covers).  Such a
 * reply does not wait for the period: while one waits and no batch is in
 * flight, the loop starts the next batch at once (ckv_warm_journal_pump),
 * with only the sessions replies wait for (the periodic batch walks all),
 * and the writer thread wakes the loop through an eventfd when it is
 * written (group commit: every change made while a batch is written goes
 * in the next one).  Reads are never held. */
#ifndef CKV_PERSIST_WARMJOURNAL_H
#define CKV_PERSIST_WARMJOURNAL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ckv_persist ckv_persist;
typedef struct ckv_srv_session ckv_srv_session;

/* From ckv_persist_init: sets up p->journal when the warm restart is on
 * (warm.h) and warm_journal_ms is not 0; starts the writer thread.
 * CKV_OK (also when off) or -errno / -ENOMEM. */
int ckv_warm_journal_new(ckv_persist *p);
/* From ckv_warm_start, after the rebuild: the first checkpoint of this
 * daemon, written on the calling thread (every kept session, the manifest
 * under this daemon's tag, leftover files removed).  false when it could
 * not be written (logged; the caller removes the old journal). */
bool ckv_warm_journal_first(ckv_persist *p);
/* The loop's housekeeping: lands a finished batch, gives back the held
 * blocks no entry names, and starts the next batch when one is due. */
void ckv_warm_journal_scan(ckv_persist *p, uint64_t now_ms);
/* The eventfd the loop polls: readable when the writer thread finished a
 * batch (ckv_warm_journal_pump drains it).  -1 when the journal is off. */
int ckv_warm_journal_fd(const ckv_persist *p);
/* After every turn of the loop: lands a batch the writer finished (as the
 * housekeeping does) and, when `wanted` (a reply waits for the journal) and
 * none is in flight, builds and submits the next one: at once, or once
 * [daemon] warm_journal_delay has passed since a reply first wanted it. */
void ckv_warm_journal_pump(ckv_persist *p, bool wanted, uint64_t now_ms);
/* How long the loop may sleep before a batch that a held reply wants may
 * start ([daemon] warm_journal_delay); UINT64_MAX when none is waiting. */
uint64_t ckv_warm_journal_wait_ms(const ckv_persist *p, uint64_t now_ms);
/* Right after a request changed session s (the loop): 0 when its reply
 * need not wait (the journal is off; s is in no journal entry, being
 * quarantined or on the disk tier; its durable entry already holds its
 * state), else the batch whose landing may cover it, for _covers. */
uint64_t ckv_warm_journal_need(ckv_persist *p, const ckv_srv_session *s);
/* Whether the change a reply waits for ("tenant/id", the `need` above) is
 * durable: an entry of the session from batch `need` or later is on disk,
 * or its durable entry holds its state now, or the session is gone or in
 * no entry any more (a drop is durable in incarnations.log first). */
bool ckv_warm_journal_covers(ckv_persist *p, const char *key, uint64_t need);
/* At a clean stop, after the drain: waits for the batch in flight and
 * writes one more on the calling thread, so the replies still held can go.
 * false when that batch failed (logged). */
bool ckv_warm_journal_flush(ckv_persist *p);
/* Before the clean stop writes its own journal (warm.h): waits for the
 * batch in flight, stops the writer thread.  Held blocks stay held. */
void ckv_warm_journal_stop(ckv_persist *p);
/* Frees p->journal (ckv_persist_done). */
void ckv_warm_journal_free(ckv_persist *p);

#endif
