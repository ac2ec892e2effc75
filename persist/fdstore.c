/* fdstore.c - arenas in systemd's file descriptor store (see fdstore.h). */
#include "persist/fdstore.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "common/log.h"

int ckv_fdstore_available(void) {
  const char *e = getenv("NOTIFY_SOCKET");
  return e && *e;
}

int ckv_fdstore_put_arena(int fd, uint64_t generation, uint64_t owner) {
  if (!ckv_fdstore_available()) return 0;
  char msg[96];
  snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=" CKV_FDSTORE_ARENA_PREFIX "%016" PRIx64 ".%016" PRIx64, generation,
           owner);
  int r = sd_pid_notify_with_fds(0, /* unset_environment= */ 0, msg, &fd, 1);
  if (r < 0)
    ckv_log(CKV_LOG_WARNING, "fdstore-put", NULL, NULL,
            "cannot hand arena %016" PRIx64 " to the service manager: %s (a restart will not keep it)", generation,
            strerror(-r));
  return r;
}

void ckv_fdstore_remove_arena(uint64_t generation, uint64_t owner) {
  if (!ckv_fdstore_available()) return;
  char msg[96];
  snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=" CKV_FDSTORE_ARENA_PREFIX "%016" PRIx64 ".%016" PRIx64,
           generation, owner);
  (void)sd_notify(0, msg);
}

void ckv_fdstore_take_arenas(ckv_fdstore_arena **ret, size_t *ret_n) {
  *ret = NULL;
  *ret_n = 0;
  char **names = NULL;
  int n = sd_listen_fds_with_names(/* unset_environment= */ 0, &names);
  if (n <= 0 || !names) {
    free(names);
    return;
  }
  ckv_fdstore_arena *out = calloc((size_t)n, sizeof(*out));
  size_t k = 0;
  const size_t plen = strlen(CKV_FDSTORE_ARENA_PREFIX);
  for (int i = 0; i < n; i++) {
    int fd = SD_LISTEN_FDS_START + i;
    const char *name = names[i] ? names[i] : "";
    if (strncmp(name, CKV_FDSTORE_ARENA_PREFIX, plen) == 0) {
      /* "<16 hex>.<16 hex>" exactly */
      const char *p = name + plen;
      bool ok = strlen(p) == 33 && p[16] == '.';
      for (int h = 0; ok && h < 33; h++) ok = h == 16 || isxdigit((unsigned char)p[h]);
      unsigned long long g = ok ? strtoull(p, NULL, 16) : 0, o = ok ? strtoull(p + 17, NULL, 16) : 0;
      if (!ok || !g || !out) {
        ckv_log(CKV_LOG_WARNING, "fdstore-refused", NULL, NULL,
                "fd %d named '%.80s' from the store is no arena: closed", fd, name);
        close(fd);
        char msg[320];
        snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%.255s", name);
        (void)sd_notify(0, msg);
      } else {
        out[k++] = (ckv_fdstore_arena){.fd = fd, .generation = g, .owner = o};
      }
    }
    free(names[i]);
  }
  free(names);
  if (!k) {
    free(out);
    return;
  }
  *ret = out;
  *ret_n = k;
}
