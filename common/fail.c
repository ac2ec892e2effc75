/* fail.c - see fail.h. */
#include "common/fail.h"

#include <stdarg.h>
#include <stdio.h>

int ckv_fail(char *err, size_t len, int code, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return code;
}
