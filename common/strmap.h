/* strmap.h - an open-addressing hash map from NUL-terminated strings to
 * pointers.  Keys are copied; values are borrowed.  Not thread-safe. */
#ifndef CKV_DAEMON_STRMAP_H
#define CKV_DAEMON_STRMAP_H

#include <stddef.h>

typedef struct ckv_strmap ckv_strmap;

int ckv_strmap_new(ckv_strmap **ret);
ckv_strmap *ckv_strmap_free(ckv_strmap *m);
/* Insert or replace.  CKV_OK or -ENOMEM. */
int ckv_strmap_put(ckv_strmap *m, const char *key, void *value);
void *ckv_strmap_get(const ckv_strmap *m, const char *key);
/* Remove and return the value (NULL when absent). */
void *ckv_strmap_del(ckv_strmap *m, const char *key);
size_t ckv_strmap_size(const ckv_strmap *m);
/* Slots in the table: iteration costs this much.  Bounded by the peak number
 * of live keys (a few times it), never by how many keys were ever put. */
size_t ckv_strmap_capacity(const ckv_strmap *m);
/* Iterate: *cursor starts at 0; returns the next value or NULL at the end.
 * Removing the entry just returned is allowed during iteration. */
void *ckv_strmap_next(const ckv_strmap *m, size_t *cursor, const char **ret_key);

#endif
