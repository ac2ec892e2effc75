/* seal.c - values in the remote store, sealed per tenant (see seal.h). */
#include "persist/seal.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "common/fail.h"
#include "common/log.h"

#define MAGIC "CKVSEAL1"
#define SECRET_BYTES 32u
#define NONCE_BYTES crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define TAG_BYTES crypto_aead_xchacha20poly1305_ietf_ABYTES

struct ckv_seal {
  unsigned char *secret; /* sodium_malloc'd: locked, guarded, wiped at free */
};

/* Reads exactly SECRET_BYTES from fd into s (a file of another size is refused). */
static int read_secret(int fd, const char *path, unsigned char *s, char *err, size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) < 0) return ckv_fail(err, errlen, -errno, "remote key %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_size != SECRET_BYTES)
    return ckv_fail(err, errlen, CKV_ERR_INVALID, "remote key %s is not a %u-byte regular file", path, SECRET_BYTES);
  if (st.st_uid != geteuid() || (st.st_mode & 077))
    return ckv_fail(err, errlen, CKV_ERR_AUTH,
                    "remote key %s has mode %04o and owner uid %u: it must be the daemon's (uid %u) and readable by "
                    "nobody else (chmod 0600)",
                    path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)geteuid());
  size_t got = 0;
  while (got < SECRET_BYTES) {
    ssize_t n = read(fd, s + got, SECRET_BYTES - got);
    if (n <= 0) return ckv_fail(err, errlen, n < 0 ? -errno : -EIO, "reading remote key %s failed", path);
    got += (size_t)n;
  }
  return CKV_OK;
}

/* A new secret at path (O_EXCL: never one over another's). */
static int create_secret(const char *path, unsigned char *s, char *err, size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -errno;
  randombytes_buf(s, SECRET_BYTES);
  size_t done = 0;
  while (done < SECRET_BYTES) {
    ssize_t n = write(fd, s + done, SECRET_BYTES - done);
    if (n <= 0) break;
    done += (size_t)n;
  }
  int r = done == SECRET_BYTES && fsync(fd) == 0 ? CKV_OK : -errno;
  close(fd);
  if (r < 0) {
    unlink(path);
    return ckv_fail(err, errlen, r ? r : -EIO, "cannot write remote key %s", path);
  }
  ckv_log(CKV_LOG_NOTICE, "remote-key", NULL, NULL,
          "created %s: the values this daemon stores in the remote store are sealed with it (a fleet sharing a "
          "store sets the same [daemon] remote_key_file on every daemon)",
          path);
  return CKV_OK;
}

int ckv_seal_open(const char *key_file, const char *state_dir, ckv_seal **ret, char *err, size_t errlen) {
  if (sodium_init() < 0) return ckv_fail(err, errlen, -EIO, "libsodium cannot initialise");
  char path[4096];
  bool given = key_file && *key_file;
  if (given)
    snprintf(path, sizeof path, "%s", key_file);
  else if (!state_dir || !*state_dir)
    return ckv_fail(err, errlen, CKV_ERR_INVALID,
                    "a remote store needs a key to seal its values: set [daemon] remote_key_file or state_dir");
  else if (snprintf(path, sizeof path, "%s/%s", state_dir, CKV_SEAL_KEY_FILE) >= (int)sizeof path)
    return ckv_fail(err, errlen, -ENAMETOOLONG, "state_dir path too long");
  ckv_seal *s = calloc(1, sizeof(*s));
  if (!s || !(s->secret = sodium_malloc(SECRET_BYTES))) {
    free(s);
    return ckv_fail(err, errlen, -ENOMEM, "out of memory");
  }
  int r;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd >= 0) {
    r = read_secret(fd, path, s->secret, err, errlen);
    close(fd);
  } else if (errno == ENOENT && !given) {
    if (mkdir(state_dir, 0700) < 0 && errno != EEXIST)
      r = ckv_fail(err, errlen, -errno, "cannot create %s: %s", state_dir, strerror(errno));
    else
      r = create_secret(path, s->secret, err, errlen);
  } else {
    r = ckv_fail(err, errlen, -errno, "remote key %s: %s", path, strerror(errno));
  }
  if (r < 0) {
    ckv_seal_free(s);
    return r;
  }
  *ret = s;
  return CKV_OK;
}

ckv_seal *ckv_seal_free(ckv_seal *s) {
  if (!s) return NULL;
  sodium_free(s->secret);
  free(s);
  return NULL;
}

/* The tenant's key: BLAKE2b keyed with the secret, over a context and the tenant's name. */
static void tenant_key(const ckv_seal *s, const char *tenant, unsigned char key[crypto_aead_xchacha20poly1305_ietf_KEYBYTES]) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, s->secret, SECRET_BYTES, crypto_aead_xchacha20poly1305_ietf_KEYBYTES);
  static const char ctx[] = "commitkv remote value v1 tenant";
  crypto_generichash_update(&h, (const unsigned char *)ctx, sizeof ctx);
  crypto_generichash_update(&h, (const unsigned char *)tenant, strlen(tenant) + 1);
  crypto_generichash_final(&h, key, crypto_aead_xchacha20poly1305_ietf_KEYBYTES);
}

/* What the seal binds besides the bytes: the tenant and the store key. */
static size_t bound_to(const char *tenant, const char *store_key, unsigned char *ad, size_t cap) {
  int n = snprintf((char *)ad, cap, "%s%c%s", tenant, 0, store_key);
  return n < 0 || (size_t)n >= cap ? cap - 1 : (size_t)n;
}

int ckv_seal_wrap(const ckv_seal *s, const char *tenant, const char *store_key, const uint8_t *plain, size_t len,
                  uint8_t **ret, size_t *ret_len) {
  size_t out_len = len + CKV_SEAL_OVERHEAD;
  uint8_t *out = malloc(out_len);
  if (!out) return -ENOMEM;
  memcpy(out, MAGIC, 8);
  unsigned char *nonce = out + 8;
  randombytes_buf(nonce, NONCE_BYTES);
  unsigned char key[crypto_aead_xchacha20poly1305_ietf_KEYBYTES], ad[512];
  tenant_key(s, tenant, key);
  size_t ad_len = bound_to(tenant, store_key, ad, sizeof ad);
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(out + 8 + NONCE_BYTES, &clen, plain, len, ad, ad_len, NULL, nonce, key);
  sodium_memzero(key, sizeof key);
  *ret = out;
  *ret_len = 8 + NONCE_BYTES + (size_t)clen;
  return CKV_OK;
}

int ckv_seal_unwrap(const ckv_seal *s, const char *tenant, const char *store_key, const uint8_t *sealed, size_t len,
                    uint8_t **ret, size_t *ret_len, char *err, size_t errlen) {
  if (len < CKV_SEAL_OVERHEAD || memcmp(sealed, MAGIC, 8) != 0)
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT,
                    "the value under %s is not sealed by a CommitKV daemon (%zu bytes): refused", store_key, len);
  size_t plain_len = len - CKV_SEAL_OVERHEAD;
  uint8_t *out = malloc(plain_len ? plain_len : 1);
  if (!out) return ckv_fail(err, errlen, -ENOMEM, "out of memory for a %zu-byte value", len);
  unsigned char key[crypto_aead_xchacha20poly1305_ietf_KEYBYTES], ad[512];
  tenant_key(s, tenant, key);
  size_t ad_len = bound_to(tenant, store_key, ad, sizeof ad);
  unsigned long long got = 0;
  int r = crypto_aead_xchacha20poly1305_ietf_decrypt(out, &got, NULL, sealed + 8 + NONCE_BYTES, len - 8 - NONCE_BYTES,
                                                     ad, ad_len, sealed + 8, key);
  sodium_memzero(key, sizeof key);
  if (r != 0) {
    free(out);
    return ckv_fail(err, errlen, CKV_ERR_CORRUPT,
                    "the value under %s does not open with this daemon's key for tenant '%s' (forged, another "
                    "tenant's or key's, sealed by a daemon with another remote key, or damaged): refused",
                    store_key, tenant);
  }
  *ret = out;
  *ret_len = (size_t)got;
  return CKV_OK;
}
