/* seal.h - values in the remote store, sealed per tenant.
 *
 * A Redis or Valkey store is shared by every daemon of a fleet and, without
 * AUTH, reachable by every local user: a value read there is another
 * tenant's K/V in the clear, and a value written there (tenant and id
 * rewritten, the snapshot checksums resealed) is served to whoever resumes
 * that key.  So every value this daemon stores is sealed: encrypted and
 * authenticated (XChaCha20-Poly1305, libsodium) with a key derived for its
 * tenant (BLAKE2b keyed with the daemon's secret) and bound to the store
 * key it is stored under, so a value moved to another key, another
 * tenant's, forged, or damaged does not open.
 *
 * The secret: 32 bytes in a file only the daemon's user reads (mode 0600),
 * STATE_DIR/remote.key, created at the first start, or [daemon]
 * remote_key_file (the same file on every daemon of a fleet that shares a
 * store).  A sealed value: "CKVSEAL1" · 24-byte nonce · ciphertext · 16-byte
 * tag. */
#ifndef CKV_PERSIST_SEAL_H
#define CKV_PERSIST_SEAL_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_seal ckv_seal;

#define CKV_SEAL_KEY_FILE "remote.key"
#define CKV_SEAL_OVERHEAD (8u + 24u + 16u)

/* The secret of key_file (when set: it must exist, belong to the daemon's
 * user and be readable by nobody else), or of STATE_DIR/remote.key, created
 * (0600, random) when missing.  CKV_OK, or a status with err (the daemon
 * refuses to start: it would store values it cannot seal). */
int ckv_seal_open(const char *key_file, const char *state_dir, ckv_seal **ret, char *err, size_t errlen);
/* Accepts NULL, returns NULL (the secret is wiped). */
ckv_seal *ckv_seal_free(ckv_seal *s);

/* plain (len bytes), for tenant, to be stored under store_key: *ret (malloc'd,
 * len + CKV_SEAL_OVERHEAD bytes).  CKV_OK or -ENOMEM. */
int ckv_seal_wrap(const ckv_seal *s, const char *tenant, const char *store_key, const uint8_t *plain, size_t len,
                  uint8_t **ret, size_t *ret_len);
/* The value read under store_key for tenant, opened: *ret (malloc'd).
 * CKV_ERR_CORRUPT with err when it does not open (not sealed, sealed by
 * another key, for another tenant or key, forged or damaged), -ENOMEM. */
int ckv_seal_unwrap(const ckv_seal *s, const char *tenant, const char *store_key, const uint8_t *sealed, size_t len,
                    uint8_t **ret, size_t *ret_len, char *err, size_t errlen);

#endif
