/* test_remote.c - remote.c without a store: the key scheme
 * (documented layout, percent-encoding, what is refused), the URL parser
 * (rediss:// and passwords refused) and the password file's checks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "persist/remote.h"
#include "testutil.h"

static char key[CKV_REMOTE_KEY_MAX];

static int mk(const char *tenant, const char *model, const char *rev, const char *name) {
  return ckv_remote_key(1, tenant, model, rev, name, key, sizeof key);
}

Test(remote_store, key_layout) {
  cr_assert_eq(mk("default", "stories260K", "r1", "chat-42"), CKV_OK);
  cr_assert_str_eq(key, "ckv:v1:default:stories260K:r1:chat-42");
  cr_assert_eq(ckv_remote_key(7, "t", "", "", "s", key, sizeof key), CKV_OK);
  cr_assert_str_eq(key, "ckv:v7:t:::s", "empty model id and revision keep their places");
}

Test(remote_store, components_are_encoded_injectively) {
  /* ':' in a session id or model name cannot move bytes into another component */
  cr_assert_eq(mk("t", "a:b", "c", "d"), CKV_OK);
  char one[CKV_REMOTE_KEY_MAX];
  snprintf(one, sizeof one, "%s", key);
  cr_assert_eq(mk("t", "a", "b:c", "d"), CKV_OK);
  cr_assert_str_neq(one, key);
  cr_assert_str_eq(one, "ckv:v1:t:a%3Ab:c:d");
  cr_assert_str_eq(key, "ckv:v1:t:a:b%3Ac:d");
  /* the escape character itself, braces (Redis Cluster hash tags), spaces, UTF-8 */
  cr_assert_eq(mk("t", "m%3A", "{x}", "s"), CKV_OK);
  cr_assert_str_eq(key, "ckv:v1:t:m%253A:%7Bx%7D:s");
  cr_assert_eq(mk("t", "Llama 3 \xc3\xa9", "r", "s"), CKV_OK);
  cr_assert_str_eq(key, "ckv:v1:t:Llama%203%20%C3%A9:r:s");
  cr_assert_null(strchr(key, '{'));
}

Test(remote_store, bad_components_refused) {
  cr_assert_eq(mk("", "m", "r", "s"), CKV_ERR_INVALID, "empty tenant");
  cr_assert_eq(mk("t", "m", "r", ""), CKV_ERR_INVALID, "empty name");
  cr_assert_eq(mk("t", "m\n", "r", "s"), CKV_ERR_INVALID, "control byte");
  cr_assert_eq(mk("t", "m", "r\x7f", "s"), CKV_ERR_INVALID, "DEL");
  cr_assert_eq(ckv_remote_key(1, NULL, "m", "r", "s", key, sizeof key), CKV_ERR_INVALID);
  char longer[130];
  memset(longer, 'a', 129);
  longer[129] = 0;
  cr_assert_eq(mk("t", longer, "r", "s"), CKV_ERR_INVALID, "a component over 128 bytes");
  longer[128] = 0;
  cr_assert_eq(mk("t", longer, "r", "s"), CKV_OK);
  /* the longest components, all escaped, still fit the documented maximum */
  char esc[129];
  memset(esc, ' ', 128);
  esc[128] = 0;
  cr_assert_eq(mk(esc, esc, esc, esc), CKV_OK);
  char small[32];
  cr_assert_eq(ckv_remote_key(1, "tenant", "model", "rev", "session-id", small, sizeof small), CKV_ERR_LIMIT);
}

Test(remote_store, urls) {
  ckv_remote_url u;
  char err[512];
  cr_assert_eq(ckv_remote_url_parse("redis://127.0.0.1", &u, err, sizeof err), CKV_OK, "%s", err);
  cr_assert(!u.unix_socket && strcmp(u.host, "127.0.0.1") == 0 && u.port == 6379 && u.db == 0 && !u.user[0]);
  cr_assert_eq(ckv_remote_url_parse("redis://cache@kv.example:7000/3", &u, err, sizeof err), CKV_OK, "%s", err);
  cr_assert(strcmp(u.host, "kv.example") == 0 && u.port == 7000 && u.db == 3 && strcmp(u.user, "cache") == 0);
  cr_assert_eq(ckv_remote_url_parse("redis://[::1]:6380", &u, err, sizeof err), CKV_OK, "%s", err);
  cr_assert(strcmp(u.host, "::1") == 0 && u.port == 6380);
  cr_assert_eq(ckv_remote_url_parse("unix:///run/redis/redis.sock", &u, err, sizeof err), CKV_OK);
  cr_assert(u.unix_socket && strcmp(u.host, "/run/redis/redis.sock") == 0);

  cr_assert_eq(ckv_remote_url_parse("rediss://kv:6380", &u, err, sizeof err), CKV_ERR_UNSUPPORTED);
  cr_assert(strstr(err, "TLS") && strstr(err, "hiredis"), "%s", err);
  cr_assert_eq(ckv_remote_url_parse("redis://user:secret@kv:6379", &u, err, sizeof err), CKV_ERR_INVALID);
  cr_assert(strstr(err, "remote_password_file") && !strstr(err, "secret"), "the password is echoed: %s", err);
  const char *bad[] = {"http://kv:6379", "redis://", "redis://kv:0", "redis://kv:65536", "redis://kv:x",
                       "redis://kv/db", "redis://[::1", "unix://relative.sock", "redis://k v:1", NULL};
  for (int i = 0; bad[i]; i++)
    cr_expect_eq(ckv_remote_url_parse(bad[i], &u, err, sizeof err), CKV_ERR_INVALID, "%s accepted", bad[i]);
}

static void write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  cr_assert_eq(chmod(path, mode), 0);
}

Test(remote_store, password_file) {
  char *dir = ckv_test_tmpdir("ckv-remote-pw");
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/pw", dir);
  char *pw = NULL;
  write_file(path, "s3cret\n", 0600);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), CKV_OK, "%s", err);
  cr_assert_str_eq(pw, "s3cret");
  free(pw);
  pw = NULL;
  write_file(path, "s3cret\n", 0640);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), CKV_OK, "%s", err);
  free(pw);
  pw = NULL;
  write_file(path, "s3cret\n", 0644);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), CKV_ERR_AUTH, "a world-readable file");
  cr_assert(strstr(err, "0644") && !strstr(err, "s3cret"), "%s", err);
  write_file(path, "s3cret\n", 0620);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), CKV_ERR_AUTH, "a group-writable file");
  write_file(path, "", 0600);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), CKV_ERR_INVALID, "an empty file");
  write_file(path, "a\nb\n", 0600);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), CKV_ERR_INVALID, "two lines");
  cr_assert_eq(ckv_remote_read_password(dir, &pw, err, sizeof err), CKV_ERR_INVALID, "a directory");
  snprintf(path, sizeof path, "%s/none", dir);
  cr_assert_eq(ckv_remote_read_password(path, &pw, err, sizeof err), -ENOENT);
  cr_assert_null(pw);
  ckv_test_rmdir(dir);
}

Test(remote_store, unreachable_store_is_eio_naming_it) {
  ckv_remote *r = NULL;
  char err[512];
  /* port 1 on loopback: nothing listens there */
  cr_assert_eq(ckv_remote_new("redis://127.0.0.1:1", NULL, 500, &r, err, sizeof err), CKV_OK, "%s", err);
  cr_assert_eq(ckv_remote_ping(r, err, sizeof err), -EIO);
  cr_assert(strstr(err, "redis://127.0.0.1:1"), "%s", err);
  uint8_t *buf = NULL;
  size_t len = 0;
  cr_assert_eq(ckv_remote_get(r, "ckv:v1:t:::s", 1 << 20, &buf, &len, err, sizeof err), -EIO);
  cr_assert_eq(ckv_remote_put(r, "ckv:v1:t:::s", "x", 1, err, sizeof err), -EIO);
  ckv_remote_stats st;
  ckv_remote_get_stats(r, &st);
  cr_assert_eq(st.errors, 3);
  cr_assert_eq(st.saves + st.loads, 0);
  cr_assert(!st.connected);
  r = ckv_remote_free(r);
  cr_assert_null(r);
}
