/* redisstore.h - a redis-server of the test's own on a free loopback port
 * (the remote tier's tests: test_remote, test_tier_remote), and hiredis
 * calls to look into it.  Without /usr/bin/redis-server (make deps installs
 * it) ckv_test_store_start skips the test, saying so. */
#ifndef CKV_TEST_REDISSTORE_H
#define CKV_TEST_REDISSTORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ckv_test_store {
  pid_t pid;
  int port;
  char *dir;
  char url[64]; /* redis://127.0.0.1:PORT */
} ckv_test_store;

/* A remote key file (persist/seal.h: 32 random bytes, mode 0600) named
 * `name` in st's directory, made on first use: daemons given the same one
 * are one fleet (they open each other's values). */
const char *ckv_test_store_key_file(const ckv_test_store *st, const char *name);

/* Starts a store in a fresh temporary directory, on a free port. */
void ckv_test_store_start(ckv_test_store *st);
/* Starts it (again) on `port` (st->dir set). */
void ckv_test_store_start_on(ckv_test_store *st, int port);
/* SIGKILL, and waits for it (the directory stays). */
void ckv_test_store_kill(ckv_test_store *st);
/* Kills it and removes its directory. */
void ckv_test_store_stop(ckv_test_store *st);
/* The value under key (malloc'd), or NULL with *len 0 when there is none. */
uint8_t *ckv_test_store_get(const ckv_test_store *st, const char *key, size_t *len);
/* One command (hiredis format); asserts it was not an error. */
void ckv_test_store_cmd(const ckv_test_store *st, const char *fmt, ...);
/* How many keys match the glob pattern (KEYS). */
size_t ckv_test_store_count(const ckv_test_store *st, const char *pattern);

#endif
