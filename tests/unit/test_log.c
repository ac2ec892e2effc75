/* tests/unit/test_log.c - daemon/log.c: the stderr line format, level
 * filtering and runtime changes, sanitising of client-chosen fields, the
 * journal-stream check, truncation, and whole lines under concurrency.
 * Each test points fd 2 at a temporary file and reads back what was written. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "testutil.h"

static char *dir;
static char path[512];
static int saved_stderr = -1;

static void setup(void) {
  dir = ckv_test_tmpdir("ckv-log");
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0);
  saved_stderr = dup(STDERR_FILENO);
  cr_assert_geq(dup2(fd, STDERR_FILENO), 0);
  close(fd);
  unsetenv("JOURNAL_STREAM");
  ckv_log_init("commitkvd", CKV_LOG_TARGET_STDERR);
  ckv_log_set_level(CKV_LOG_INFO);
  ckv_log_set_rate_limit(10000, 0); /* off: the format tests write identical lines on purpose */
}

static void teardown(void) {
  if (saved_stderr >= 0) {
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    saved_stderr = -1;
  }
  ckv_test_rmdir(dir);
  dir = NULL;
}

/* Everything written to stderr so far (malloc'ed). */
static char *captured(void) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  size_t cap = 1 << 22, n = 0;
  char *buf = malloc(cap + 1);
  cr_assert_not_null(buf);
  n = fread(buf, 1, cap, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

TestSuite(log, .init = setup, .fini = teardown);

Test(log, stderr_format) {
  ckv_log(CKV_LOG_WARNING, "lease.expired", "alice", "s1", "gone after %ds", 10);
  ckv_log(CKV_LOG_NOTICE, NULL, NULL, NULL, "started, %s", "ready");
  ckv_log(CKV_LOG_INFO, "session.open", NULL, NULL, "opened");
  ckv_log(CKV_LOG_ERROR, NULL, "bob", NULL, "quota");
  ckv_log(CKV_LOG_INFO, NULL, NULL, "x-9", "only session");
  char *out = captured();
  cr_expect_str_eq(out,
                   "commitkvd: warning: [lease.expired] tenant=alice session=s1: gone after 10s\n"
                   "commitkvd: notice: started, ready\n"
                   "commitkvd: info: [session.open]: opened\n"
                   "commitkvd: error: tenant=bob: quota\n"
                   "commitkvd: info: session=x-9: only session\n");
  free(out);
}

Test(log, ident) {
  ckv_log_init("ckv-test", CKV_LOG_TARGET_STDERR);
  ckv_log(CKV_LOG_NOTICE, "e", NULL, NULL, "m");
  char *out = captured();
  cr_expect_str_eq(out, "ckv-test: notice: [e]: m\n");
  free(out);
}

Test(log, level_filter) {
  ckv_log_set_level(CKV_LOG_WARNING);
  cr_expect_eq(ckv_log_get_level(), CKV_LOG_WARNING);
  cr_expect(ckv_log_enabled(CKV_LOG_ERROR));
  cr_expect(ckv_log_enabled(CKV_LOG_WARNING));
  cr_expect_not(ckv_log_enabled(CKV_LOG_NOTICE));
  ckv_log(CKV_LOG_ERROR, NULL, NULL, NULL, "e1");
  ckv_log(CKV_LOG_WARNING, NULL, NULL, NULL, "w1");
  ckv_log(CKV_LOG_NOTICE, NULL, NULL, NULL, "n1");
  ckv_log(CKV_LOG_INFO, NULL, NULL, NULL, "i1");
  ckv_log(CKV_LOG_DEBUG, NULL, NULL, NULL, "d1");
  ckv_log_set_level(CKV_LOG_DEBUG); /* changed at runtime, as SIGHUP does */
  ckv_log(CKV_LOG_DEBUG, NULL, NULL, NULL, "d2");
  ckv_log_set_level(CKV_LOG_ERROR);
  ckv_log(CKV_LOG_WARNING, NULL, NULL, NULL, "w2");
  char *out = captured();
  cr_expect_str_eq(out, "commitkvd: error: e1\ncommitkvd: warning: w1\ncommitkvd: debug: d2\n");
  free(out);
}

Test(log, clamp_and_names) {
  ckv_log_set_level(99);
  cr_expect_eq(ckv_log_get_level(), CKV_LOG_DEBUG);
  ckv_log_set_level(-5);
  cr_expect_eq(ckv_log_get_level(), CKV_LOG_ERROR);
  static const char *const names[] = {"error", "warning", "notice", "info", "debug"};
  for (int l = CKV_LOG_ERROR; l <= CKV_LOG_DEBUG; l++) {
    cr_expect_str_eq(ckv_log_level_name(l), names[l - CKV_LOG_ERROR]);
    cr_expect_eq(ckv_log_level_from_name(names[l - CKV_LOG_ERROR]), l);
  }
  cr_expect_str_eq(ckv_log_level_name(2), "?");
  cr_expect_str_eq(ckv_log_level_name(8), "?");
  cr_expect_eq(ckv_log_level_from_name("verbose"), -1);
  cr_expect_eq(ckv_log_level_from_name(NULL), -1);
  /* Levels are syslog priorities, so PRIORITY= needs no mapping. */
  cr_expect_eq(CKV_LOG_ERROR, 3);
  cr_expect_eq(CKV_LOG_DEBUG, 7);
}

Test(log, control_bytes_sanitised) {
  ckv_log(CKV_LOG_INFO, "ev\x1b", "ten\tant", "s\nfake: line", "multi\nline\rmsg\x7f");
  char *out = captured();
  cr_expect_str_eq(out, "commitkvd: info: [ev?] tenant=ten?ant session=s?fake: line: "
                        "multi?line?msg?\n");
  free(out);
}

Test(log, long_message_truncated_to_one_line) {
  char big[10000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  char longsess[1000];
  memset(longsess, 's', sizeof longsess - 1);
  longsess[sizeof longsess - 1] = '\0';
  ckv_log(CKV_LOG_INFO, "e", "t", longsess, "%s", big);
  ckv_log(CKV_LOG_INFO, NULL, NULL, NULL, "after");
  char *out = captured();
  char *nl = strchr(out, '\n');
  cr_assert_not_null(nl);
  cr_expect_lt(nl - out, 4096);
  cr_expect_gt(nl - out, 1500);
  cr_expect_str_eq(nl + 1, "commitkvd: info: after\n");
  free(out);
}

Test(log, preserves_errno) {
  errno = EPIPE;
  ckv_log(CKV_LOG_INFO, NULL, NULL, NULL, "x");
  cr_expect_eq(errno, EPIPE);
  errno = EAGAIN;
  ckv_log(CKV_LOG_DEBUG, NULL, NULL, NULL, "filtered");
  cr_expect_eq(errno, EAGAIN);
}

Test(log, journal_stream_detection) {
  struct stat st;
  cr_assert_eq(fstat(STDERR_FILENO, &st), 0);
  char v[64];
  unsetenv("JOURNAL_STREAM");
  cr_expect_not(ckv_log_stderr_is_journal());
  snprintf(v, sizeof v, "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
  setenv("JOURNAL_STREAM", v, 1);
  cr_expect(ckv_log_stderr_is_journal());
  snprintf(v, sizeof v, "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino + 1);
  setenv("JOURNAL_STREAM", v, 1);
  cr_expect_not(ckv_log_stderr_is_journal(), "another inode: stderr was redirected");
  snprintf(v, sizeof v, "%ju:%ju", (uintmax_t)st.st_dev + 1, (uintmax_t)st.st_ino);
  setenv("JOURNAL_STREAM", v, 1);
  cr_expect_not(ckv_log_stderr_is_journal());
  snprintf(v, sizeof v, "%ju:%jux", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
  setenv("JOURNAL_STREAM", v, 1);
  cr_expect_not(ckv_log_stderr_is_journal());
  setenv("JOURNAL_STREAM", "garbage", 1);
  cr_expect_not(ckv_log_stderr_is_journal());
  setenv("JOURNAL_STREAM", "", 1);
  cr_expect_not(ckv_log_stderr_is_journal());
  /* AUTO without a journal stream writes to stderr. */
  unsetenv("JOURNAL_STREAM");
  ckv_log_init(NULL, CKV_LOG_TARGET_AUTO);
  ckv_log(CKV_LOG_NOTICE, NULL, NULL, NULL, "auto");
  char *out = captured();
  cr_expect_str_eq(out, "commitkvd: notice: auto\n");
  free(out);
}

Test(log, journal_target_leaves_stderr_alone) {
  /* With the journal target, a record goes to journald, never to stderr as
   * well (journald would store it twice: once native, once from the stream).
   * Without journald, sd_journal_sendv drops it and reports success; only a
   * real send error falls back to stderr. */
  ckv_log_init(NULL, CKV_LOG_TARGET_JOURNAL);
  ckv_log(CKV_LOG_NOTICE, "j", "t", "s", "to the journal");
  char *out = captured();
  cr_expect_str_eq(out, "");
  free(out);
}

#define THREADS 4
#define PER_THREAD 300

static void *spam(void *arg) {
  long id = (long)arg;
  for (int i = 0; i < PER_THREAD; i++)
    ckv_log(CKV_LOG_INFO, "load", "tenant", "session", "thread %ld line %d %s", id, i,
            "padding-padding-padding-padding-padding-padding-padding-padding");
  return NULL;
}

Test(log, concurrent_lines_stay_whole) {
  pthread_t th[THREADS];
  for (long i = 0; i < THREADS; i++) cr_assert_eq(pthread_create(&th[i], NULL, spam, (void *)i), 0);
  /* Level changes race with the writers: must be safe (atomic). */
  for (int i = 0; i < 1000; i++) ckv_log_set_level(i % 2 ? CKV_LOG_INFO : CKV_LOG_DEBUG);
  ckv_log_set_level(CKV_LOG_INFO);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  char *out = captured();
  int seen[THREADS][PER_THREAD] = {{0}};
  int lines = 0;
  for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    long id;
    int n;
    char pad[128];
    int got = sscanf(l, "commitkvd: info: [load] tenant=tenant session=session: thread %ld line %d %127s",
                     &id, &n, pad);
    cr_assert_eq(got, 3, "torn line: %s", l);
    cr_assert(id >= 0 && id < THREADS && n >= 0 && n < PER_THREAD);
    seen[id][n]++;
    lines++;
  }
  cr_expect_eq(lines, THREADS * PER_THREAD);
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < PER_THREAD; i++) cr_expect_eq(seen[t][i], 1);
  free(out);
}

static int count_of(const char *text, const char *needle) {
  int n = 0;
  for (const char *q = text; (q = strstr(q, needle)); q += strlen(needle)) n++;
  return n;
}

/* Issue 11 item 8: a failure repeated thousands of times writes its first
 * lines, then is counted, and the count is said once the interval passed. */
Test(log, identical_lines_are_rate_limited) {
  ckv_log_set_rate_limit(300, 5);
  for (int i = 0; i < 10000; i++)
    ckv_log(CKV_LOG_ERROR, "compress-failed", "t", "s", "moving %d tokens failed: %s", 28, "data is corrupt");
  ckv_log(CKV_LOG_ERROR, "compress-failed", "t", "other", "moving %d tokens failed: %s", 28, "data is corrupt");
  ckv_log(CKV_LOG_ERROR, "compress-failed", "t", "s", "moving %d tokens failed: %s", 29, "data is corrupt");
  char *out = captured();
  cr_assert_eq(count_of(out, "session=s: moving 28 tokens"), 5, "%s", out);
  cr_assert_eq(count_of(out, "session=other: moving 28"), 1, "another session's line is its own");
  cr_assert_eq(count_of(out, "moving 29 tokens"), 1, "another text is its own");
  cr_assert_null(strstr(out, "suppressed"));
  free(out);
  usleep(350000);
  ckv_log(CKV_LOG_ERROR, "compress-failed", "t", "s", "moving %d tokens failed: %s", 28, "data is corrupt");
  out = captured();
  cr_assert_eq(count_of(out, "session=s: moving 28 tokens"), 6, "%s", out);
  cr_assert(strstr(out, "data is corrupt (9995 identical lines suppressed in 0.3 s)"), "%s", out);
  free(out);
}

Test(log, rate_limit_off_writes_everything) {
  ckv_log_set_rate_limit(10000, 0);
  for (int i = 0; i < 100; i++) ckv_log(CKV_LOG_WARNING, "x", NULL, NULL, "same");
  char *out = captured();
  cr_assert_eq(count_of(out, "[x]: same"), 100);
  free(out);
}
