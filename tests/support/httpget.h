/* httpget.h - a minimal HTTP/1.0 GET over a TCP socket for the metrics
 * tests: no library, so a test checks the bytes on the wire the way a
 * Prometheus scraper would get them.  Header-only (static functions). */
#ifndef CKV_TEST_HTTPGET_H
#define CKV_TEST_HTTPGET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Sends "METHOD PATH HTTP/1.0" to 127.0.0.1:port and reads the whole
 * answer (headers and body) until the server closes, for at most
 * timeout_ms.  Returns a malloc'd NUL-terminated string or NULL. */
static inline char *ckv_test_http(unsigned port, const char *method, const char *path, int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return NULL;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return NULL;
  }
  char req[512];
  int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n", method, path);
  if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
    close(fd);
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) <= 0) {
      free(buf);
      buf = NULL;
      break;
    }
    if (cap - len < 2048) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
    if (got < 0) {
      free(buf);
      buf = NULL;
      break;
    }
    if (got == 0) break;
    len += (size_t)got;
  }
  close(fd);
  if (buf) buf[len] = 0;
  return buf;
}

/* The body of an HTTP answer (after the blank line), or NULL. */
static inline const char *ckv_test_http_body(const char *answer) {
  const char *b = answer ? strstr(answer, "\r\n\r\n") : NULL;
  return b ? b + 4 : NULL;
}

#endif
