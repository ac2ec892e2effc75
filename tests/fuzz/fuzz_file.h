/* tests/fuzz/fuzz_file.h - an input as a file: the file readers are fuzzed
 * through the very entry the daemon uses for a path (open, fstat, read), on
 * a memfd named by /proc/self/fd/N, so no disk is touched per execution. */
#ifndef CKV_TESTS_FUZZ_FILE_H
#define CKV_TESTS_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"

typedef struct ckv_fuzz_file {
  int fd;
  char path[64];
} ckv_fuzz_file;

static inline void ckv_fuzz_file_open(ckv_fuzz_file *f, const char *name) {
  f->fd = memfd_create(name, MFD_CLOEXEC);
  CKV_FUZZ_CHECK(f->fd >= 0, "memfd_create");
  snprintf(f->path, sizeof(f->path), "/proc/self/fd/%d", f->fd);
}

/* Makes the file hold exactly data[0..size). */
static inline void ckv_fuzz_file_set(ckv_fuzz_file *f, const uint8_t *data, size_t size) {
  CKV_FUZZ_CHECK(ftruncate(f->fd, 0) == 0, "ftruncate");
  size_t done = 0;
  while (done < size) {
    ssize_t w = pwrite(f->fd, data + done, size - done, (off_t)done);
    CKV_FUZZ_CHECK(w > 0, "pwrite");
    done += (size_t)w;
  }
}

#endif
