/* daemon/config_table.h - the configuration's key table, shared by the
 * config_*.c files (not by the rest of the daemon: it uses config.h).
 *
 * config_table.c holds the table (one row per key: where the value lives, its
 * type and bounds, its default as file text, whether SIGHUP may change it,
 * its doc line) and the writers it drives (docs, template); config_value.c
 * reads and prints one value per row; config_tenant.c finds and adds tenant
 * sections; config.c reads files and flags, checks keys against each other
 * and applies reloads. */
#ifndef CKV_DAEMON_CONFIG_TABLE_H
#define CKV_DAEMON_CONFIG_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/log.h" /* CKV_PRINTF_FMT */
#include "daemon/config_types.h"

typedef enum key_type {
  T_STRING,   /* char[] field; `size` is its capacity */
  T_BOOL,     /* bool; yes|no|true|false|on|off|1|0 */
  T_U32,      /* uint32_t */
  T_U64,      /* uint64_t */
  T_SIZE,     /* uint64_t bytes; K/M/G/T/P suffixes */
  T_DURATION, /* uint64_t milliseconds; ms/s/m/h/d suffixes */
  T_DOUBLE,   /* double, finite */
  T_ENUM,     /* int; one of `enums` */
  T_UIDS,     /* uint32_t[CKV_TENANT_MAX_IDS] + size_t count at offset2; numbers or user names */
  T_GIDS,     /* same, group names */
  T_POLICIES, /* uint32_t bit set of ckv_policy_id; names or "all" */
} key_type;

typedef enum section_kind { SEC_DAEMON, SEC_POLICY, SEC_TENANT } section_kind;

typedef struct enum_entry {
  const char *name;
  int value;
} enum_entry;

typedef int (*key_check_fn)(const char *value, char *err, size_t errlen);

typedef struct config_key {
  section_kind section;
  const char *key;
  key_type type;
  size_t offset;  /* into ckv_config (daemon, policy) or ckv_tenant_config (tenant) */
  size_t size;    /* bytes of the field (capacity for strings) */
  size_t offset2; /* T_UIDS/T_GIDS: the count field */
  uint64_t imin, imax;
  double dmin, dmax;
  const enum_entry *enums; /* T_ENUM: terminated by a NULL name */
  key_check_fn check;      /* T_STRING: extra validation of a non-empty value */
  bool reload;             /* SIGHUP may change it */
  const char *def;         /* default, as file text */
  const char *doc;
} config_key;

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define TIB (GIB * 1024)
#define PIB (TIB * 1024)
#define SEC UINT64_C(1000)
#define DAY (SEC * 86400)

/* The table (config_table.c), in the order of the docs, the template and
 * --check-config's output. */
extern const config_key ckv_cfg_keys[];
extern const size_t ckv_cfg_n_keys;
#define N_KEYS ckv_cfg_n_keys

/* "daemon", "policy", "tenant.NAME" by section_kind. */
extern const char *const ckv_cfg_section_names[];

/* The row of a key, or NULL. */
const config_key *ckv_cfg_find_key(section_kind sec, const char *key);
static inline size_t ckv_cfg_key_index(const config_key *k) { return (size_t)(k - ckv_cfg_keys); }

/* A valid unix socket path (absolute, fits sun_path); err says why not. */
int ckv_cfg_check_unix_path(const char *v, char *err, size_t errlen);

/* Writes s in double quotes, escaping '"' and '\\'. */
void ckv_cfg_write_quoted(FILE *out, const char *s);
/* CKV_OK, or -EIO when writing to out failed. */
int ckv_cfg_finish(FILE *out);

/* ---- config_value.c ---- */

/* snprintf into err when err is not NULL. */
void ckv_cfg_seterr(char *err, size_t errlen, const char *fmt, ...) CKV_PRINTF_FMT(3, 4);

/* Digits only (no sign, no space, no 0x); *end is the first other byte. */
int ckv_cfg_parse_digits(const char *s, const char **end, uint64_t *ret);

/* The allowed values of a row as text ("32..4096", "auto|host|cuda"). */
void ckv_cfg_range_text(const config_key *k, char *buf, size_t len);

/* Parses `value` per the row and stores it at base + offset.  On error the
 * field is unchanged and err holds the reason (without file/key). */
int ckv_cfg_set_value(const config_key *k, void *base, const char *value, char *err, size_t errlen);

/* Text of a field as the file would hold it (unquoted). */
void ckv_cfg_format_value(const config_key *k, const void *base, char *buf, size_t len);

bool ckv_cfg_field_equal(const config_key *k, const void *a, const void *b);
void ckv_cfg_copy_field(const config_key *k, void *dst, const void *src);

/* Every key of the section to its default (aborts on a default that does
 * not parse: a bug in the table, which test_config loads whole). */
void ckv_cfg_apply_defaults(section_kind sec, void *base);

/* ---- config_tenant.c ---- */

/* [a-z0-9_-]{1,63} */
bool ckv_cfg_valid_tenant_name(const char *n);
ckv_tenant_config *ckv_cfg_find_tenant(const ckv_config *c, const char *name);
/* Appends a tenant with defaults; name must be valid.  NULL with *ret_err =
 * -ENOMEM or CKV_ERR_LIMIT (CKV_CONFIG_MAX_TENANTS reached). */
ckv_tenant_config *ckv_cfg_add_tenant(ckv_config *c, const char *name, int *ret_err);

#endif
