/* server.h - commitkvd's server loop: the ZeroMQ ROUTER socket, the attach
 * socket, the snapshot I/O thread's completions, housekeeping (leases,
 * expiry, tiers, autosave), signals and the metrics page's refresh.
 *
 * One thread runs the loop (ckv_server_run); it never blocks on anything but
 * zmq_poll.  The state it works on is daemon.h's; attach.c, handlers.c,
 * parked.c and reply.c do the work of one client, request or reply. */
#ifndef CKV_DAEMON_SERVER_H
#define CKV_DAEMON_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/daemon.h"

/* Sets up sockets (binds; stale ipc/unix files are replaced).  Returns
 * CKV_OK or a status with an explanation in err. */
int ckv_server_new(const ckv_server_options *opt, ckv_server **ret, char *err, size_t errlen);
ckv_server *ckv_server_free(ckv_server *s);
/* Runs until SIGTERM/SIGINT (then drains: answers what is queued, detaches
 * every session, closes sockets).  Returns 0 on a clean stop. */
int ckv_server_run(ckv_server *s);
/* True once a SIGHUP asked for a reload; clears the flag. */
bool ckv_server_take_reload(ckv_server *s);

#endif
