/* status.c - text for the ckv_status error space (see commitkv/status.h). */
#include "commitkv/status.h"

#include <string.h>

#define CKV_STATUS_TEXT_(name, value, text) \
  case value:                               \
    return text;
#define CKV_STATUS_NAME_(name, value, text) \
  case value:                               \
    return #name;

const char *ckv_strerror(int status) {
  switch (status) { CKV_STATUS_LIST(CKV_STATUS_TEXT_) }
  if (status < 0 && status > -4096)
    return strerror(-status); /* glibc: static table for known errnos */
  return "unknown status code";
}

const char *ckv_status_name(int status) {
  switch (status) { CKV_STATUS_LIST(CKV_STATUS_NAME_) }
  if (status < 0 && status > -4096) {
    const char *n = strerrorname_np(-status);
    return n ? n : "ERRNO";
  }
  return "UNKNOWN";
}
