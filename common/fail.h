/* fail.h - the one way a module without a logger reports why it failed:
 * the reason into the caller's buffer (err may be NULL or len 0), the code
 * returned, so `return ckv_fail(err, len, CKV_ERR_INVALID, "...", ...);`
 * is one line at the point of failure. */
#ifndef CKV_COMMON_FAIL_H
#define CKV_COMMON_FAIL_H

#include <stddef.h>

__attribute__((format(printf, 4, 5))) int ckv_fail(char *err, size_t len, int code, const char *fmt, ...);

#endif
