/* daemon/instance.h - one commitkvd per socket.
 *
 * A second commitkvd started on the paths of a running one (by hand beside
 * the systemd unit, a supervisor's double start) must leave the running one
 * alone.  Binding is not enough to tell: ZeroMQ replaces an ipc:// file that
 * exists and removes it when its socket closes, so a second daemon that got
 * as far as zmq_bind and then failed on the attach socket would cut every
 * client of the first one off.  The claim happens before anything is bound:
 * an exclusive flock(2) on ATTACH_SOCKET.lock (it holds the owner's pid, for
 * the error text) and a probe of the control socket's ipc file. */
#ifndef CKV_DAEMON_INSTANCE_H
#define CKV_DAEMON_INSTANCE_H

#include <stddef.h>

/* Claims `attach_path` (its lock file) and the ipc:// `control_endpoint` for
 * this process.  On success *ret_lock_fd holds the lock until it is closed
 * (close it when the daemon exits; the file stays, the lock is what counts).
 * Returns CKV_OK; -EADDRINUSE (another daemon holds the lock or listens on
 * the control socket: `err` names it and its pid when known); another
 * negated errno (the lock file cannot be created: `err` says where). */
int ckv_instance_claim(const char *control_endpoint, const char *attach_path, int *ret_lock_fd, char *err,
                       size_t errlen);

#endif
