/* daemon/config.h - commitkvd's configuration: one INI file, one table.
 *
 * Every knob of the daemon is one row of a static table in config_table.c
 * (section, key, type, offset into the structs below, bounds, default,
 * one-line doc),
 * the way Redis drives its config from static_configs[].  That single table
 * parses the file, validates values and ranges, fills the defaults, prints the
 * effective configuration (`commitkvd --check-config`), writes the reference
 * documentation (`commitkvd --help-config`, commitkvd.conf(5)) and the
 * commented default file shipped in packaging/commitkvd.conf.  A key that is
 * not in the table does not exist.  The files: config_table.c (the table,
 * the docs and the template), config_value.c (one value, text to field and
 * back), config.c (files through libinih, flags, cross-key checks, reload),
 * config_tenant.c (tenant sections and lookup).
 *
 * The order the daemon applies things in:
 *   ckv_config_init_defaults -> ckv_config_load_file (optional)
 *   -> ckv_config_set for each command-line flag -> ckv_config_finalize
 *   -> ckv_config_ensure_default_tenant.
 * On SIGHUP: init_defaults + load_file + finalize + ensure_default_tenant
 * into a fresh struct, ckv_config_reload_changes(live, fresh) to warn about
 * what needs a restart, then ckv_config_apply_reload(live, fresh) and
 * ckv_config_done(fresh).
 *
 * The struct is plain data: readers use its fields directly.  Nothing here
 * locks; the thread that owns the live config applies reloads, and other
 * threads read the fields they need through their own synchronisation. */
#ifndef CKV_DAEMON_CONFIG_H
#define CKV_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/config_types.h"

/* Fills every field with the table's defaults and no tenants.  Never fails.
 * Does not free: call ckv_config_done first when reusing a loaded struct. */
void ckv_config_init_defaults(ckv_config *c);

/* The judge's parameters for a [policy] section (history_rounds clamped to
 * what the attention ring keeps; mlp left NULL: loading weights is the
 * caller's).  With the defaults it equals ckv_judge_params_init's. */
struct ckv_judge_params;
void ckv_config_judge_params(const ckv_policy_params *p, struct ckv_judge_params *ret);

/* Frees the tenants and leaves *c empty (safe to call twice, or on a
 * zero-filled struct). */
void ckv_config_done(ckv_config *c);

/* Reads an INI file over *c (which holds defaults or an earlier config).
 * Syntax: `[section]`, `key = value`, comments on their own line or after
 * whitespace with '#' or ';', string values optionally in double quotes
 * (\" and \\ escapes).  Every error names the file and line, e.g.
 * "/etc/commitkv/commitkvd.conf:12: unknown key 'foo' in [daemon]": unknown
 * section or key, bad value, out of range, key given twice, duplicate tenant,
 * a uid or gid claimed by two tenants, inconsistent values (heartbeat not
 * shorter than lease...).  Only a regular file is read: the path is opened
 * without blocking and anything else (a FIFO, a directory, a device) is
 * refused before a byte is read ("PATH: is a FIFO, not a regular file"), so
 * neither --check-config nor a SIGHUP reload can hang on it.  Returns CKV_OK;
 * CKV_ERR_INVALID with err filled on a bad or non-regular file (*c is then
 * partially updated: discard it); -errno when the file cannot be opened or
 * read; -ENOMEM.  err may be NULL. */
int ckv_config_load_file(ckv_config *c, const char *path, char *err, size_t errlen);

/* Same as ckv_config_load_file, over text in memory; `name` is used in
 * messages in place of the file name. */
int ckv_config_load_string(ckv_config *c, const char *text, const char *name, char *err,
                           size_t errlen);

/* Sets one key from text, as a file line would (the daemon's command-line
 * flags go through here).  section is "daemon", "policy" or "tenant.NAME"
 * (created when missing).  Returns CKV_OK, CKV_ERR_INVALID (unknown key, bad
 * value, out of range; err says which) or -ENOMEM.  Cross-key checks run in
 * ckv_config_finalize. */
int ckv_config_set(ckv_config *c, const char *section, const char *key, const char *value,
                   char *err, size_t errlen);

/* Cross-key checks and derived defaults, once all sources are applied:
 * socket "" -> ipc://$RUNTIME_DIRECTORY/commitkvd.sock (else
 * ipc:///run/commitkv/commitkvd.sock), attach_socket "" -> the same directory's
 * commitkvd.attach, state_dir "" -> $STATE_DIRECTORY (first entry) or
 * /var/lib/commitkv.  Returns CKV_OK or CKV_ERR_INVALID with err filled. */
int ckv_config_finalize(ckv_config *c, char *err, size_t errlen);

/* Cross-key checks only (what finalize and load_file run). */
int ckv_config_check(const ckv_config *c, char *err, size_t errlen);

/* Adds tenant "default" for own_uid and root (uid 0), all policies, no quota
 * of its own, when the config has no tenant at all.  Returns 1 when added,
 * 0 when tenants exist, -ENOMEM. */
int ckv_config_ensure_default_tenant(ckv_config *c, uint32_t own_uid);

/* The tenant a peer with these credentials belongs to: a tenant listing the
 * uid wins; otherwise one listing the gid; NULL = refuse the peer.  The
 * pointer lives until the tenants change (reload, done). */
const ckv_tenant_config *ckv_config_tenant_for(const ckv_config *c, uint32_t uid, uint32_t gid);

/* The clients tenant t may have attached at once: its max_clients, else an
 * equal share of [daemon] max_clients among the tenants (at least 1); never
 * above [daemon] max_clients. */
uint32_t ckv_tenant_max_clients(const ckv_config *c, const ckv_tenant_config *t);

/* Bytes of [daemon] memory meant for tenant t's arena: for a tenant with a
 * quota, the arena its quota needs; for one without, an equal share of what
 * the tenants with quotas leave (a multiple of 2 MiB; 0 when they leave
 * nothing).  The server still cuts every arena to what is left of memory. */
uint64_t ckv_tenant_memory_share(const ckv_config *c, const ckv_tenant_config *t);

/* Tenant by name, or NULL. */
const ckv_tenant_config *ckv_config_tenant_by_name(const ckv_config *c, const char *name);

/* Whether the tenant may use the policy (ckv_policy_id). */
bool ckv_tenant_allows_policy(const ckv_tenant_config *t, int policy);

/* The policy a tenant's session gets when OpenSession names none. */
int ckv_tenant_default_policy(const ckv_config *c, const ckv_tenant_config *t);

/* Writes the configuration as INI that ckv_config_load_file reads back to an
 * equal struct (every key of every section, tenants in order).  Returns
 * CKV_OK or -EIO when writing fails. */
int ckv_config_write(const ckv_config *c, FILE *out);

/* Writes the commented default configuration (every key as "#key = default"
 * under its doc line, and a commented tenant example): the content of
 * packaging/commitkvd.conf.  Returns CKV_OK or -EIO. */
int ckv_config_write_template(FILE *out);

typedef enum ckv_config_doc_format {
  CKV_CONFIG_DOC_MARKDOWN = 0, /* one table per section: key, type, default, range, doc */
  CKV_CONFIG_DOC_MAN = 1,      /* troff .TP entries for commitkvd.conf(5) */
} ckv_config_doc_format;

/* Writes the reference of every key (default, range, doc) for --help-config
 * and the man page.  Returns CKV_OK or -EIO. */
int ckv_config_write_docs(FILE *out, ckv_config_doc_format format);

/* Applies the live-reloadable fields of `fresh` to `live`: log level, the
 * [policy] section, and for each tenant present in both (matched by name)
 * its quotas, allowed policies, default policy, session and client limits.  Tenants
 * added or removed, uid/gid changes and every other [daemon] key need a
 * restart (see ckv_config_reload_changes). */
void ckv_config_apply_reload(ckv_config *live, const ckv_config *fresh);

/* Calls fn once for each change between live and fresh that
 * ckv_config_apply_reload ignores (it needs a restart): section is "daemon",
 * "policy" or "tenant.NAME"; key is the key, or NULL for a tenant section
 * that was "added" or "removed" (note).  Returns how many there are (0 = the
 * reload took everything).  fn may be NULL. */
typedef void (*ckv_config_change_fn)(void *ctx, const char *section, const char *key,
                                     const char *note);
int ckv_config_reload_changes(const ckv_config *live, const ckv_config *fresh,
                              ckv_config_change_fn fn, void *ctx);

/* The same changes as text in buf ("memory, tenant.alice.uids, tenant.bob
 * (removed)"); returns how many there are.  buf may be NULL. */
int ckv_config_reload_diff(const ckv_config *live, const ckv_config *fresh, char *buf,
                           size_t buflen);

/* "4G", "512M", "1024", "16KiB", "2T": binary multiples (K = 1024), an
 * optional B or iB, case-insensitive; no sign, no fraction, no spaces inside.
 * Returns CKV_OK, CKV_ERR_INVALID (junk) or CKV_ERR_RANGE (> UINT64_MAX). */
int ckv_parse_size(const char *text, uint64_t *ret_bytes);

/* "250ms", "10s", "5m", "2h", "1d" -> milliseconds; "0" alone is allowed,
 * any other number needs its unit.  Same return codes as ckv_parse_size. */
int ckv_parse_duration_ms(const char *text, uint64_t *ret_ms);

/* Shortest exact text for a size ("4G", "1536K", "1000") and a duration
 * ("5m", "250ms", "0"), loadable by the parsers above. */
void ckv_format_size(uint64_t bytes, char *buf, size_t len);
void ckv_format_duration_ms(uint64_t ms, char *buf, size_t len);

#endif
