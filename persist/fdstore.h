/* fdstore.h - systemd's file descriptor store, for arenas that outlive a
 * daemon (warm restart, warm.h).
 *
 * A service with FileDescriptorStoreMax= may hand fds to systemd
 * (sd_pid_notify_with_fds "FDSTORE=1\nFDNAME=..."); systemd keeps them while
 * the service restarts (systemctl restart, or Restart= after a crash:
 * measured on systemd 252) and passes them to the next process like socket
 * activation (LISTEN_FDS, LISTEN_FDNAMES).  An explicit stop empties the
 * store.  Each arena travels under the name "ckv-arena.<generation>.<owner>"
 * (16 hex digits each): the generation is the arena's; the owner is a tag
 * of the daemon process that holds it now (from its boot token).  A daemon
 * that adopts an arena stores it again under its own tag, so a journal of
 * an earlier daemon (which names the earlier tag) can never match an arena
 * that a later one changed.  The journal says which tenant it was.
 *
 * Without NOTIFY_SOCKET (not under systemd) every call is a no-op. */
#ifndef CKV_PERSIST_FDSTORE_H
#define CKV_PERSIST_FDSTORE_H

#include <stddef.h>
#include <stdint.h>

#define CKV_FDSTORE_ARENA_PREFIX "ckv-arena."

/* True when a service manager listens (NOTIFY_SOCKET is set). */
int ckv_fdstore_available(void);
/* Hands fd to the store under the arena name of (generation, owner).
 * Returns 1 when sent, 0 without a manager, a negated errno on failure
 * (logged).  systemd ignores a file it holds already, under any name:
 * remove it first to rename it. */
int ckv_fdstore_put_arena(int fd, uint64_t generation, uint64_t owner);
/* Asks the store to drop every fd named like the arena of (generation, owner). */
void ckv_fdstore_remove_arena(uint64_t generation, uint64_t owner);

/* One arena fd the store handed back at start. */
typedef struct ckv_fdstore_arena {
  int fd;              /* owned by the caller: close it, or keep a duplicate */
  uint64_t generation; /* from the name */
  uint64_t owner;      /* from the name: the tag of the daemon that stored it */
} ckv_fdstore_arena;

/* Takes the arena fds systemd passed (sd_listen_fds_with_names); other fds
 * (the attach socket of socket activation) are left alone.  A name that
 * does not parse is logged and its fd closed and removed from the store.
 * *ret (free()) holds *ret_n entries; both are 0/NULL when there are none. */
void ckv_fdstore_take_arenas(ckv_fdstore_arena **ret, size_t *ret_n);

#endif
