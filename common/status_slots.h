/* status_slots.h - one counter slot per ckv_status of commitkv/status.h, in
 * list order (tenants count their error replies in them; metrics.c names
 * them).  CKV_OK is never an error, so slot 0 counts every folded -errno. */
#ifndef CKV_COMMON_STATUS_SLOTS_H
#define CKV_COMMON_STATUS_SLOTS_H

#include "commitkv/status.h"

#define CKV_STATUS_COUNT_ONE_(name, value, text) +1
#define CKV_STATUS_SLOTS (0 CKV_STATUS_LIST(CKV_STATUS_COUNT_ONE_))

#endif
