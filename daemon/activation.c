/* daemon/activation.c - picks the attach socket out of the fds systemd
 * passed (sd_listen_fds), see activation.h. */
#include "daemon/activation.h"

#include <fcntl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include "common/log.h"

int ckv_activation_attach_fd(const char *expected_path) {
  /* unset_environment = 0: LISTEN_PID already keeps children from taking
   * the fds, and leaving the variables lets a second call see the same. */
  int n = sd_listen_fds(0);
  if (n <= 0) return -1;
  const char *path = expected_path && *expected_path ? expected_path : NULL;
  int sockets = 0; /* the fd store's arenas (memfds, fdstore.h) come in the same list */
  for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; fd++) {
    sockets += sd_is_socket(fd, AF_UNSPEC, 0, -1) > 0;
    /* length 0: path is a NUL-terminated file system path. */
    if (sd_is_socket_unix(fd, SOCK_STREAM, /* listening= */ 1, path, 0) <= 0) continue;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    ckv_log(CKV_LOG_NOTICE, "attach.activated", NULL, NULL, "using the attach socket passed by systemd (fd %d%s%s)",
            fd, path ? ", " : "", path ? path : "");
    return fd;
  }
  if (sockets)
    ckv_log(CKV_LOG_WARNING, "attach.activated", NULL, NULL,
            "systemd passed %d socket(s) but none listens on %s: binding it myself", sockets,
            path ? path : "a unix path");
  return -1;
}
