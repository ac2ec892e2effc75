/* instance.c - one commitkvd per socket (see instance.h). */
#include "daemon/instance.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "shm/fdpass.h"

/* The pid the lock's owner wrote, or 0 when unreadable. */
static long owner_pid(int fd) {
  char buf[32] = "";
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  return strtol(buf, NULL, 10);
}

/* True when a process accepts on the unix socket file behind ipc://PATH.  A
 * daemon that was killed leaves its file behind: only a connect tells. */
static bool ipc_served(const char *endpoint) {
  if (strncmp(endpoint, "ipc://", 6) != 0 || endpoint[6] == '@') return false; /* tcp, abstract: bind decides */
  int fd = -1;
  if (ckv_unix_connect(endpoint + 6, &fd) != CKV_OK) return false;
  close(fd);
  return true;
}

int ckv_instance_claim(const char *control_endpoint, const char *attach_path, int *ret_lock_fd, char *err,
                       size_t errlen) {
  char lock_path[4096];
  if (snprintf(lock_path, sizeof(lock_path), "%s.lock", attach_path) >= (int)sizeof(lock_path)) {
    snprintf(err, errlen, "attach socket path too long: %.200s", attach_path);
    return -ENAMETOOLONG;
  }
  int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "cannot create the instance lock %.300s: %s", lock_path, strerror(e));
    return -e;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    long pid = e == EWOULDBLOCK ? owner_pid(fd) : 0;
    close(fd);
    if (e != EWOULDBLOCK) {
      snprintf(err, errlen, "cannot lock %.300s: %s", lock_path, strerror(e));
      return -e;
    }
    if (pid > 0)
      snprintf(err, errlen, "another commitkvd (pid %ld) serves %.300s: stop it first, or give this one other sockets",
               pid, attach_path);
    else
      snprintf(err, errlen, "another commitkvd serves %.300s (it holds %.300s): stop it first", attach_path,
               lock_path);
    return -EADDRINUSE;
  }
  if (ipc_served(control_endpoint)) {
    close(fd);
    snprintf(err, errlen, "another process serves %.300s: stop it first, or give this daemon another --socket",
             control_endpoint);
    return -EADDRINUSE;
  }
  char pid[32];
  int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) /* the lock holds without it */
    ckv_log(CKV_LOG_WARNING, "instance-lock", NULL, NULL, "cannot write the pid into %s: %s", lock_path,
            strerror(errno));
  *ret_lock_fd = fd;
  return CKV_OK;
}
