/* daemon/activation.h - systemd socket activation of the attach socket.
 *
 * packaging/systemd/commitkvd-attach.socket may own the attach socket
 * (ListenStream=/run/commitkv/commitkvd.attach): systemd binds it before the
 * daemon starts, workers can connect (and queue) while commitkvd starts or
 * restarts, and the daemon receives the listening fd through the
 * sd_listen_fds(3) protocol (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES).
 *
 * Only the attach socket can be inherited: the control socket is bound by
 * ZeroMQ itself.  A daemon that inherited the attach socket must not unlink
 * or chmod its path on exit: the socket unit owns the file (SocketMode=,
 * SocketUser=, RemoveOnStop=). */
#ifndef CKV_DAEMON_ACTIVATION_H
#define CKV_DAEMON_ACTIVATION_H

/* Returns the inherited listening AF_UNIX stream socket bound to
 * expected_path (the configured attach_socket), made non-blocking and
 * close-on-exec, or -1 when none was passed (not socket-activated, LISTEN_PID
 * names another process, or no passed fd is such a socket on that path).
 * expected_path NULL or "" accepts the first listening unix stream socket.
 * Passed fds that are not taken stay open (they are systemd's to account
 * for).  Call once, before any thread starts; never fails otherwise. */
int ckv_activation_attach_fd(const char *expected_path);

#endif
