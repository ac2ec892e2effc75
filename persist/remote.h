/* remote.h - the remote tier: one Redis or Valkey endpoint (hiredis),
 * shared by every commitkvd of a fleet, holding session snapshots.
 *
 * A value is the exact bytes of a snapshot file (docs/snapshot.md), so a
 * value read back goes through the same validating reader as a local file
 * and nothing here needs to trust the store.  Keys say what the bytes are
 * (DESIGN.md invariant 9):
 *     ckv:v<format version>:<tenant>:<model id>:<model revision>:<name>
 * every component percent-encoded (bytes outside [A-Za-z0-9._-] become %XX),
 * so the encoding is injective: no id can reach into another component, and
 * no key carries a '{' that would move it to another Redis Cluster slot.
 *
 * A put never shows a partial value under the real key: the bytes go to a
 * temporary key `{KEY}:tmp:PID-N` (a hash tag, so it lives in KEY's cluster
 * slot) with an expiry, in chunks, then MULTI / RENAME / PERSIST / EXEC
 * makes it the value in one step.  A put cut short leaves the previous value
 * and a temporary key that expires by itself.
 *
 * Every call blocks for at most the timeout per connect and per command
 * (the daemon calls it from its server loop: docs/snapshot.md says so).  A
 * broken connection is dropped and made again on the next call; a call that
 * finds its kept connection dead (closed or reset by the store, not merely
 * slow) reconnects once and tries again.  Store
 * failures are -EIO with err naming the store and what it said.
 *
 * TLS (rediss://) is refused: Debian bookworm's hiredis 0.14 has no
 * hiredis_ssl.  Passwords come from a file (remote_password_file), never
 * from the URL. */
#ifndef CKV_PERSIST_REMOTE_H
#define CKV_PERSIST_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKV_REMOTE_HOST_MAX 256u
#define CKV_REMOTE_USER_MAX 128u
#define CKV_REMOTE_PATH_MAX 256u
#define CKV_REMOTE_PASSWORD_MAX 512u
/* The longest key: prefix, five components of at most 128 bytes each,
 * tripled by the encoding, and separators. */
#define CKV_REMOTE_KEY_MAX 2048u

typedef struct ckv_remote ckv_remote;

/* A parsed remote URL:
 *   redis://[USER@]HOST[:PORT][/DB]   (HOST may be [IPv6]; PORT 6379; DB 0)
 *   unix://PATH                      (an absolute path to the server's socket) */
typedef struct ckv_remote_url {
  bool unix_socket;
  char host[CKV_REMOTE_HOST_MAX]; /* or the socket path */
  uint16_t port;
  char user[CKV_REMOTE_USER_MAX]; /* ACL user for AUTH; "" = the default user */
  uint32_t db;                    /* SELECT'ed after connect when not 0 */
} ckv_remote_url;

/* Parses url into *ret.  CKV_ERR_UNSUPPORTED for rediss:// (no TLS in this
 * build), CKV_ERR_INVALID for anything else malformed or for a password in
 * the URL; err says which. */
int ckv_remote_url_parse(const char *url, ckv_remote_url *ret, char *err, size_t errlen);

/* Reads a password file: a regular file owned by the daemon's user or root,
 * not readable or writable by others, one line (a trailing newline is cut).
 * *ret_password is malloc'd.  CKV_ERR_AUTH (modes), CKV_ERR_INVALID (empty,
 * too long, not one line), -errno; err says which. */
int ckv_remote_read_password(const char *path, char **ret_password, char *err, size_t errlen);

/* Builds the key of snapshot `name` (see above) into buf.  tenant and name
 * must be non-empty, model id and revision may be empty; no component may
 * hold a control byte or be longer than 128 bytes.  CKV_OK, CKV_ERR_INVALID,
 * CKV_ERR_LIMIT (buf too small). */
int ckv_remote_key(uint32_t format_version, const char *tenant, const char *model_id, const char *model_revision,
                   const char *name, char *buf, size_t len);

/* The key of the remote tier's copy of a session (tier.h):
 *     ckv:tier:v<format version>:<tenant>:<model id>:<model revision>:<session id>
 * encoded as above; no snapshot key starts with "ckv:tier:" (theirs go on
 * with "v<digits>"), so a session on the remote tier never meets a save
 * game of the same name.  The same returns as ckv_remote_key. */
int ckv_remote_tier_key(uint32_t format_version, const char *tenant, const char *model_id,
                        const char *model_revision, const char *session_id, char *buf, size_t len);

/* The key of the store fence of session `session_id` of tenant (fence.h):
 *     ckv:fence:<tenant>:<session id>
 * encoded as above.  One per id, whatever the model: a conversation
 * replaced under another model fences the old model's copy too.  The same
 * returns as ckv_remote_key. */
int ckv_remote_fence_key(const char *tenant, const char *session_id, char *buf, size_t len);

/* A handle on the store at url (password: NULL or "" = no AUTH;
 * timeout_ms: per connect and per command).  Nothing is connected yet:
 * ckv_remote_ping connects and says whether the store answers.  Returns
 * CKV_OK, the parse errors above, -ENOMEM. */
int ckv_remote_new(const char *url, const char *password, uint32_t timeout_ms, ckv_remote **ret, char *err,
                   size_t errlen);
ckv_remote *ckv_remote_free(ckv_remote *r);
/* What seals the values stored (seal.h): the store owns it from here on.
 * Without one nothing is stored or read (remote_snap.h refuses). */
typedef struct ckv_seal ckv_seal;
void ckv_remote_set_seal(ckv_remote *r, ckv_seal *seal);
const ckv_seal *ckv_remote_seal(const ckv_remote *r);
/* Whether an AUTH password was given for the store. */
bool ckv_remote_has_password(const ckv_remote *r);
/* The URL as configured (it never holds a secret), for logs and stats. */
const char *ckv_remote_url_text(const ckv_remote *r);

/* Connects (when not connected) and sends PING.  CKV_OK or -EIO. */
int ckv_remote_ping(ckv_remote *r, char *err, size_t errlen);

/* Stores len bytes under key, atomically (see above).  CKV_OK, -EIO. */
int ckv_remote_put(ckv_remote *r, const char *key, const void *buf, size_t len, char *err, size_t errlen);
/* The value under key into *ret_buf (malloc'd, *ret_len bytes).
 * -ENOENT: no such key; CKV_ERR_TOO_LARGE: longer than max_bytes (nothing
 * is read); -EIO; -ENOMEM. */
int ckv_remote_get(ckv_remote *r, const char *key, uint64_t max_bytes, uint8_t **ret_buf, size_t *ret_len, char *err,
                   size_t errlen);

/* ckv_remote_get of key, and with it, in the same round trip (STRLEN key
 * and GET side_key pipelined), the small value under side_key: *ret_side
 * (malloc'd, *ret_side_len bytes) or NULL when the store holds none (or one
 * longer than side_max: NULL, and *ret_side_len says its length).  The side
 * value is read before the main one.  Returns what ckv_remote_get returns;
 * *ret_side is set only when the side value was read (CKV_OK and -ENOENT
 * of the main key). */
int ckv_remote_get_with_side(ckv_remote *r, const char *key, uint64_t max_bytes, const char *side_key,
                             size_t side_max, uint8_t **ret_buf, size_t *ret_len, uint8_t **ret_side,
                             size_t *ret_side_len, char *err, size_t errlen);

/* A conditional small put: decides whether `buf` replaces the value under
 * key, given what key holds now (cur NULL: nothing); true to replace. */
typedef bool (*ckv_remote_replace_fn)(void *ctx, const uint8_t *cur, size_t cur_len);
/* Stores len bytes (a small value: one SET) under key when `replace` says
 * so of its current value, and deletes del_key (NULL: none) in the same
 * transaction: WATCH key, GET key, then MULTI / SET / DEL / EXEC, so a
 * write of key by another daemon in between aborts it.  CKV_OK (stored),
 * CKV_ERR_EXISTS (replace said no: nothing written, nothing deleted),
 * -EAGAIN (key changed meanwhile: nothing written), -EIO. */
int ckv_remote_put_if(ckv_remote *r, const char *key, const void *buf, size_t len, ckv_remote_replace_fn replace,
                      void *ctx, const char *del_key, char *err, size_t errlen);

/* The timeout per connect and per command, in milliseconds. */
uint32_t ckv_remote_timeout_ms(const ckv_remote *r);

/* Deletes key (CKV_OK whether or not the store held it), -EIO. */
int ckv_remote_del(ckv_remote *r, const char *key, char *err, size_t errlen);

/* What the store was asked since start. */
typedef struct ckv_remote_stats {
  uint64_t saves, save_bytes; /* values stored */
  uint64_t loads, load_bytes; /* values read back */
  uint64_t misses;            /* gets of a key the store does not hold */
  uint64_t errors;            /* calls that failed: store unreachable, timed out, or an error reply */
  bool connected;             /* a connection is open now */
} ckv_remote_stats;
void ckv_remote_get_stats(const ckv_remote *r, ckv_remote_stats *ret);

#endif
