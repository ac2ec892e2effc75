/* warm.h - warm restart: the arenas and their sessions outlive the daemon
 * process under systemd (docs/warm-restart.md).
 *
 * Every host arena goes to systemd's fd store when its tenant comes up
 * (fdstore.h).  At a clean stop (SIGTERM: systemctl restart, an upgrade) the
 * daemon writes a journal under STATE_DIR/warm: a manifest (tenants, the
 * generation and size of each one's arena, their sessions) and per session a
 * snapshot-format entry whose blocks name their place in the arena instead
 * of carrying their bytes (CKV_SNAP_BLOCK_REFS); then it leaves the arenas
 * live and unpunched.  The next daemon takes the fds back, checks each
 * against the manifest (name, size, seals, header, generation), adopts the
 * arenas, rebuilds the allocators and the sessions on the very same blocks
 * (so the workers' mappings and every byte in them stay valid), scrubs what
 * no kept block holds, and keeps the sessions detached for resume.
 *
 * The journal is consumed when read (replaced by the new daemon's first
 * checkpoint, or removed), so it only ever describes the arenas of the
 * daemon that wrote it.  While serving, warmjournal.h keeps it current
 * ([daemon] warm_journal: a checkpoint and an append-only log, warmlog.h),
 * so after a crash (kill -9) the sessions come back as of their last durable
 * record (every change whose reply was sent); with it off there is no journal after a
 * crash and the arenas in the store are dropped, which the log says (saved
 * sessions come back from their snapshots).  Anything refused (a journal truncated, corrupt, of another
 * version; an arena missing, of another size or generation; a session entry
 * that does not validate or whose blocks do not fit the arena) is logged and
 * dropped; the daemon serves either way.  A resume of a session the warm
 * restart dropped answers NOT_FOUND saying so (ckv_warm_dropped). */
#ifndef CKV_PERSIST_WARM_H
#define CKV_PERSIST_WARM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_persist ckv_persist;
typedef struct ckv_tenant ckv_tenant;

#define CKV_WARM_AREA "warm"
#define CKV_WARM_MANIFEST "journal"
#define CKV_WARM_STOPPED "stopped" /* beside the manifest when a clean stop wrote it */
#define CKV_WARM_MAGIC "CKVWARM"
#define CKV_WARM_VERSION 1u

/* At start, before serving: adopt what the fd store handed back, rebuild
 * the sessions the journal lists.  Never fails (what cannot be kept is
 * dropped and logged). */
void ckv_warm_start(ckv_persist *p);
/* Removes the journal under STATE_DIR/warm (what ckv_warm_start does itself
 * when the continuous journal is off; with it, when its first checkpoint
 * could not be written). */
void ckv_warm_discard(ckv_persist *p);
/* A tenant came up: its arena goes to the fd store (host arenas, with a
 * state directory, under a service manager). */
void ckv_warm_tenant_up(ckv_persist *p, ckv_tenant *t);
/* At a clean stop, after the drain, before the store is freed: writes the
 * journal and hands the arenas on.  Returns the number of sessions kept. */
size_t ckv_warm_stop(ckv_persist *p);
/* Why the warm restart did not keep session `id` of `tenant`, or NULL. */
const char *ckv_warm_dropped(const ckv_persist *p, const char *tenant, const char *id);
/* Why sessions of the previous daemon may be missing although no journal
 * named them (it was killed or crashed: the store held arenas, no journal
 * came with them), or NULL.  Says nothing about any one id. */
const char *ckv_warm_unclean(const ckv_persist *p);
/* Frees what the start remembered of its drops (ckv_persist_done). */
void ckv_warm_forget(ckv_persist *p);

/* For the continuous journal (warmjournal.h).  manifest_encode: the
 * manifest (format in warm.c) of every tenant of p's store under this
 * daemon's tag, with those of its sessions for which listed() is true;
 * CKV_OK with *ret (malloc'd) and *ret_len, or -ENOMEM.  manifest_write:
 * STATE_DIR/warm/journal replaced by those bytes (temporary file, fsync,
 * rename, directory fsync); CKV_OK or -errno with err.  entry_dir: the
 * directory of tenant's entries (made when create). */
typedef struct ckv_srv_session ckv_srv_session;
int ckv_warm_manifest_encode(ckv_persist *p, bool (*listed)(void *ctx, const ckv_srv_session *s), void *ctx,
                             uint8_t **ret, size_t *ret_len);
/* A hash of the tenants' part of the manifest (names, arenas, limits): the
 * continuous journal writes a checkpoint when it changes (0: out of memory). */
uint64_t ckv_warm_tenants_sig(const ckv_persist *p);
int ckv_warm_manifest_write(const char *state_dir, const uint8_t *m, size_t n, char *err, size_t errlen);
/* Removes the entry files (and leftover temporary files) under STATE_DIR/warm
 * of every tenant/id that keep() does not want. */
void ckv_warm_sweep(const ckv_persist *p, bool (*keep)(void *ctx, const char *tenant, const char *id), void *ctx);
/* Whether the warm restart is on for p (a state directory, the fd store, host arenas). */
bool ckv_warm_enabled(const ckv_persist *p);

#endif
