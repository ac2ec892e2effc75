/* shm/fdpass.h - the unix-socket side channel: frames with file descriptors.
 *
 * ZeroMQ cannot carry file descriptors, so host arenas (memfds) reach workers
 * over a plain AF_UNIX stream socket, which also tells the daemon who the
 * peer is (SO_PEERCRED: uid, gid, pid, checked by the kernel, the basis of
 * tenant isolation).  This module has the small pieces for that: a listening
 * socket at a path with a mode, connect and accept, and one frame format:
 *
 *   4-byte little-endian payload length | payload
 *
 * with up to CKV_FRAME_MAX_FDS descriptors attached by SCM_RIGHTS.  The
 * receiver bounds the length before reading the payload (an oversized frame is
 * refused without buffering it), gets its descriptors with O_CLOEXEC already
 * set (MSG_CMSG_CLOEXEC), and never leaks one: descriptors it did not ask for
 * or cannot take are closed.
 *
 * Sockets are blocking; time limits come from SO_RCVTIMEO / SO_SNDTIMEO (see
 * ckv_sock_set_timeout).  EINTR is retried, partial writes are continued, and
 * writing to a closed peer returns an error instead of raising SIGPIPE
 * (MSG_NOSIGNAL).  After any error other than a CKV_ERR_TIMEOUT reported
 * before a single byte of the frame was read, the stream's position inside
 * the frame protocol is unknown: close the socket.  The functions keep no
 * state and are thread-safe as long as one socket is not read (or written) by
 * two threads at once. */
#ifndef CKV_SHM_FDPASS_H
#define CKV_SHM_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* Most descriptors one frame may carry (the kernel allows 253). */
#define CKV_FRAME_MAX_FDS 16u
/* Bytes of the length prefix. */
#define CKV_FRAME_HEADER_BYTES 4u

/* Credentials of a socket's peer, as the kernel recorded them at connect(). */
typedef struct ckv_peer {
  uid_t uid;
  gid_t gid;
  pid_t pid;
} ckv_peer;

/* Sends one frame: `len` bytes of `buf` (NULL allowed when len is 0) and the
 * `n_fds` descriptors of `fds` (NULL allowed when n_fds is 0).  The
 * descriptors stay owned by the caller (the receiver gets duplicates).
 * Returns CKV_OK; CKV_ERR_INVALID (bad arguments, n_fds above
 * CKV_FRAME_MAX_FDS, a negative fd); CKV_ERR_TOO_LARGE (len above 2^32-1);
 * CKV_ERR_TIMEOUT (SO_SNDTIMEO expired); CKV_ERR_DISCONNECTED (peer closed:
 * EPIPE, ECONNRESET); another negated errno (-EBADF, -ENOTSOCK...). */
int ckv_frame_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds);

/* Receives one frame into `buf` (capacity `max_len`, which is also the
 * largest frame accepted) and up to `max_fds` descriptors into `ret_fds`.
 * On success writes the payload length to *ret_len and the number of
 * descriptors to *ret_n_fds; the caller then owns those descriptors (all have
 * FD_CLOEXEC set).  On any error no descriptor is returned: every descriptor
 * that arrived has been closed.  A frame carrying more than `max_fds`
 * descriptors (including a truncated control message) is consumed and
 * refused.
 * Returns CKV_OK; CKV_ERR_INVALID (bad arguments, max_fds above
 * CKV_FRAME_MAX_FDS); CKV_ERR_TOO_LARGE (announced length above max_len: the
 * payload was not read, close the socket); CKV_ERR_PROTO (the peer closed in
 * the middle of a frame, or sent too many descriptors); CKV_ERR_DISCONNECTED
 * (orderly close before the first byte of a frame, or ECONNRESET);
 * CKV_ERR_TIMEOUT (SO_RCVTIMEO expired); another negated errno. */
int ckv_frame_recv(int sock, void *buf, size_t max_len, size_t *ret_len, int *ret_fds, size_t max_fds,
                   size_t *ret_n_fds);

/* The peer's credentials (SO_PEERCRED) of a connected AF_UNIX socket.
 * Returns CKV_OK, CKV_ERR_INVALID (NULL) or a negated errno (-ENOTSOCK...). */
int ckv_peercred(int sock, ckv_peer *ret);

/* Creates a listening SOCK_STREAM (close-on-exec) unix socket at `path` with
 * permissions `mode` (e.g. 0660), `backlog` pending connections (<= 0: 64).
 * A stale socket file at `path` (nobody accepts on it) is removed first; a
 * live one is left alone (-EADDRINUSE), and so is any path that is not a
 * socket (-EEXIST).  The mode is applied before listen(), so no connection
 * is accepted while the file still has its umask permissions.  The caller
 * owns *ret_fd and unlinks `path` when done.
 * Returns CKV_OK; CKV_ERR_INVALID (NULL or empty path); -ENAMETOOLONG (path
 * longer than sun_path); -EADDRINUSE; -EEXIST; another negated errno. */
int ckv_unix_listen(const char *path, unsigned mode, int backlog, int *ret_fd);

/* Connects a close-on-exec SOCK_STREAM socket to the unix socket at `path`.
 * The caller owns *ret_fd.  Returns CKV_OK; CKV_ERR_INVALID; -ENAMETOOLONG;
 * -ENOENT / -ECONNREFUSED (no daemon) / -EACCES (mode); another negated errno. */
int ckv_unix_connect(const char *path, int *ret_fd);

/* Accepts one connection (close-on-exec) on a listening socket.  The caller
 * owns *ret_fd.  Returns CKV_OK; CKV_ERR_TIMEOUT (SO_RCVTIMEO of the
 * listening socket expired, or it is non-blocking and nobody is waiting);
 * another negated errno. */
int ckv_unix_accept(int listen_sock, int *ret_fd);

/* Sets SO_RCVTIMEO and SO_SNDTIMEO of `sock` to `timeout_ms` (0: wait
 * forever).  Returns CKV_OK or a negated errno. */
int ckv_sock_set_timeout(int sock, unsigned timeout_ms);

#endif
