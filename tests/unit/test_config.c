/* tests/unit/test_config.c - daemon/config*.c: the key table, the INI reader
 * and its errors (each with file and line), sizes and durations, tenant
 * lookup, CLI overrides, derived defaults, reload rules, the write -> load
 * round trip, the docs and the shipped packaging/commitkvd.conf. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commitkv/status.h"
#include "daemon/config.h"
#include "common/log.h"
#include "store/tenant.h"
#include "lifecycle/judge.h"
#include "lifecycle/policy.h"
#include "testutil.h"

/* ---- helpers ---- */

static char *tmpdir_path;

static void setup(void) { tmpdir_path = ckv_test_tmpdir("ckv-config"); }
static void teardown(void) {
  ckv_test_rmdir(tmpdir_path);
  tmpdir_path = NULL;
}

/* Writes text to a fresh file in the test's temp dir; returns its path (static buffer). */
static const char *write_tmp(const char *text) {
  static char path[512];
  static int n;
  snprintf(path, sizeof path, "%s/c%d.conf", tmpdir_path, n++);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

/* Captures what fn writes to a FILE into a malloc'ed string. */
static char *capture(int (*fn)(const void *arg, FILE *f), const void *arg) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  cr_assert_eq(fn(arg, f), CKV_OK);
  fclose(f);
  return buf;
}

static int do_write(const void *arg, FILE *f) { return ckv_config_write(arg, f); }
static int do_template(const void *arg, FILE *f) { return ckv_config_write_template(f); }
static int do_md(const void *arg, FILE *f) { return ckv_config_write_docs(f, CKV_CONFIG_DOC_MARKDOWN); }
static int do_man(const void *arg, FILE *f) { return ckv_config_write_docs(f, CKV_CONFIG_DOC_MAN); }

/* ---- defaults ---- */

Test(config, defaults) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  cr_expect_str_eq(c.socket, "");
  cr_expect_str_eq(c.attach_socket, "");
  cr_expect_eq(c.backend, CKV_BACKEND_AUTO);
  cr_expect_eq(c.memory, 4ull << 30);
  cr_expect_eq(c.host_memory, 0);
  cr_expect_eq(c.disk_memory, 0);
  cr_expect_eq(c.lease_ms, 10000);
  cr_expect_eq(c.heartbeat_ms, 2000);
  cr_expect_eq(c.detach_keep_ms, 300000);
  cr_expect_eq(c.max_message, 16u << 20);
  cr_expect_eq(c.draft_block_tokens, 16);
  cr_expect_eq(c.commit_block_tokens, 32);
  cr_expect_eq(c.compress_threads, 2);
  cr_expect_eq(c.log_level, CKV_LOG_INFO);
  cr_expect_str_eq(c.metrics, "127.0.0.1:9464");
  cr_expect_str_eq(c.remote, "");
  cr_expect_eq(c.policy.default_policy, CKV_POLICY_COMMITKV);
  cr_expect_eq(c.policy.judge, CKV_JUDGE_RULES);
  cr_expect_eq(c.policy.commit_bits, 4);
  cr_expect_eq(c.policy.sink_tokens, 4);
  cr_expect_eq(c.policy.recent_window, 12);
  cr_expect_float_eq(c.policy.budget, 0.25, 1e-12);
  cr_expect_float_eq(c.policy.prune_keep, 1.0, 1e-12);
  cr_expect(c.policy.semantic_estimate);
  cr_expect_eq(c.n_tenants, 0);
  cr_expect_null(c.tenants);
  char err[256];
  cr_expect_eq(ckv_config_check(&c, err, sizeof err), CKV_OK, "%s", err);
  ckv_config_done(&c);
  ckv_config_done(&c); /* twice is fine */
}

/* ---- a good file ---- */

Test(config, good_file, .init = setup, .fini = teardown) {
  const char *path = write_tmp(
      "# a comment\n"
      "; another\n"
      "\n"
      "[daemon]\n"
      "socket = ipc:///run/ckv-test/d.sock   # trailing comment\n"
      "backend=host\n"
      "  memory = 512M\n"
      "host_memory = 2GiB\n"
      "lease = 30s\r\n"
      "heartbeat = 500ms\n"
      "detach_keep = 1h\n"
      "max_clients = 17\n"
      "max_message = 1M\n"
      "log_level = debug\n"
      "metrics = \"\"\n"
      "remote = redis://127.0.0.1:6379\n"
      "state_dir = \"/var/lib/ckv test\"\n"
      "\n"
      "[ policy ]\n"
      "default = kivi4\n"
      "attn_threshold = 1.5\n"
      "high_attn_threshold = 3e0\n"
      "commit_bits = 2\n"
      "semantic_estimate = off\n"
      "\n"
      "[tenant.alice]\n"
      "uids = 1000, 1001 root\n"
      "gids = 2000\n"
      "quota = 1G\n"
      "policies = commitkv, fp16\n"
      "default_policy = commitkv\n"
      "max_sessions = 3\n"
      "[tenant.bob_2-x]\n"
      "uids = 1002\n"
      "policies = fp16\n"
      "default_policy = fp16\n");
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  cr_assert_eq(ckv_config_load_file(&c, path, err, sizeof err), CKV_OK, "%s", err);
  cr_expect_str_eq(c.socket, "ipc:///run/ckv-test/d.sock");
  cr_expect_eq(c.backend, CKV_BACKEND_HOST);
  cr_expect_eq(c.memory, 512ull << 20);
  cr_expect_eq(c.host_memory, 2ull << 30);
  cr_expect_eq(c.lease_ms, 30000);
  cr_expect_eq(c.heartbeat_ms, 500);
  cr_expect_eq(c.detach_keep_ms, 3600000);
  cr_expect_eq(c.max_clients, 17);
  cr_expect_eq(c.max_message, 1u << 20);
  cr_expect_eq(c.log_level, CKV_LOG_DEBUG);
  cr_expect_str_eq(c.metrics, "");
  cr_expect_str_eq(c.remote, "redis://127.0.0.1:6379");
  cr_expect_str_eq(c.state_dir, "/var/lib/ckv test");
  cr_expect_eq(c.policy.default_policy, CKV_POLICY_KIVI4);
  cr_expect_float_eq(c.policy.attn_threshold, 1.5, 1e-12);
  cr_expect_float_eq(c.policy.high_attn_threshold, 3.0, 1e-12);
  cr_expect_eq(c.policy.commit_bits, 2);
  cr_expect_not(c.policy.semantic_estimate);
  cr_assert_eq(c.n_tenants, 2);
  const ckv_tenant_config *a = &c.tenants[0];
  cr_expect_str_eq(a->name, "alice");
  cr_assert_eq(a->n_uids, 3);
  cr_expect_eq(a->uids[0], 1000);
  cr_expect_eq(a->uids[1], 1001);
  cr_expect_eq(a->uids[2], 0); /* "root" resolved by name */
  cr_assert_eq(a->n_gids, 1);
  cr_expect_eq(a->gids[0], 2000);
  cr_expect_eq(a->quota, 1ull << 30);
  cr_expect_eq(a->quota_host, 0);
  cr_expect_eq(a->policies, (1u << CKV_POLICY_COMMITKV) | (1u << CKV_POLICY_FP16));
  cr_expect_eq(a->max_sessions, 3);
  cr_expect_eq(a->default_policy, CKV_POLICY_COMMITKV);
  cr_expect(ckv_tenant_allows_policy(a, CKV_POLICY_FP16));
  cr_expect_not(ckv_tenant_allows_policy(a, CKV_POLICY_H2O));
  cr_expect_not(ckv_tenant_allows_policy(a, -1));
  cr_expect_not(ckv_tenant_allows_policy(a, CKV_POLICY_COUNT));
  cr_expect_eq(ckv_tenant_default_policy(&c, a), CKV_POLICY_COMMITKV);
  const ckv_tenant_config *b = ckv_config_tenant_by_name(&c, "bob_2-x");
  cr_assert_not_null(b);
  cr_expect_eq(b->policies, 1u << CKV_POLICY_FP16);
  cr_expect_eq(ckv_tenant_default_policy(&c, b), CKV_POLICY_FP16);
  cr_expect_null(ckv_config_tenant_by_name(&c, "carol"));
  ckv_config_done(&c);
}

/* ---- bad files: each names the file and the right line ---- */

/* Inline arrays, no pointers: Criterion hands parameters to a fresh test
 * process, where pointers into the parent's (ASLR-placed) data are junk. */
typedef struct bad_case {
  char text[320];
  unsigned line;
  char needle[96]; /* substring of the message after "path:line: " */
} bad_case;

static const bad_case bad_cases[] = {
    {"[daemon]\nmemory = 4G\n[frobnicate]\n", 3, "unknown section [frobnicate]"},
    {"[daemon]\n\n\nfoo = 1\n", 4, "unknown key 'foo' in [daemon]"},
    {"[policy]\nsocket = ipc:///x\n", 2, "unknown key 'socket' in [policy]"},
    {"[tenant.a]\nuids = 5\nlease = 1s\n", 3, "unknown key 'lease' in [tenant.a]"},
    {"[daemon]\nmemory = lots\n", 2, "not a size"},
    {"[daemon]\nmemory = 4Q\n", 2, "not a size"},
    {"[daemon]\nmemory = -4G\n", 2, "not a size"},
    {"[daemon]\nmemory = 99999999999999999999\n", 2, "out of range"},
    {"[daemon]\nmemory = 16777216T\n", 2, "out of range"}, /* 2^64: overflows */
    {"[daemon]\nmemory = 2P\n", 2, "out of range"},
    {"[daemon]\ncommit_block_tokens = 16\n", 2, "out of range (allowed 32..4096)"},
    {"[daemon]\nmax_clients = 0\n", 2, "out of range"},
    {"[daemon]\nmax_clients = -1\n", 2, "not a non-negative integer"},
    {"[daemon]\nmax_clients = 12abc\n", 2, "not a non-negative integer"},
    {"[daemon]\nmax_clients = 99999999999999999999999\n", 2, "out of range"},
    {"[daemon]\nlease = 10\n", 2, "not a duration"},
    {"[daemon]\nlease = 10 s\n", 2, "not a duration"},
    {"[daemon]\nlease = 2d\n", 2, "out of range"},
    {"[daemon]\nbackend = gpu\n", 2, "not one of auto|host|cuda"},
    {"[daemon]\nlog_level = verbose\n", 2, "not one of"},
    {"[policy]\nsemantic_estimate = maybe\n", 2, "not a boolean"},
    {"[policy]\nbudget = nan\n", 2, "not a number"},
    {"[policy]\nbudget = 0x1p-2\n", 2, "not a number"},
    {"[policy]\nbudget = 1.5\n", 2, "out of range"},
    {"[policy]\nbudget = 1e999\n", 2, "out of range"},
    {"[policy]\ncommit_bits = 3\n", 2, "not one of 4|2"},
    {"[policy]\ndefault = lru\n", 2, "not one of"},
    {"[daemon]\nsocket = /run/x.sock\n", 2, "not a ZeroMQ endpoint"},
    {"[daemon]\nmetrics = localhost\n", 2, "not HOST:PORT"},
    {"[daemon]\nmetrics = :9464\n", 2, "not HOST:PORT"},
    {"[daemon]\nmetrics = h:70000\n", 2, "not HOST:PORT"},
    {"[daemon]\nremote = http://x\n", 2, "not a redis://"},
    {"[daemon]\nremote_tcp = ipc:///x\n", 2, "not a tcp://"},
    {"[daemon]\ncurve_public_key = short\n", 2, "not a CURVE key"},
    {"[daemon]\nstate_dir = relative/dir\n", 2, "not an absolute path"},
    {"[daemon]\nattach_socket = /"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaa\n", 2, "unix socket path"},
    {"[daemon]\nsocket = \"ipc:///a\tb\"\n", 2, "control character"},
    {"[daemon]\nmemory = 4G\nlease = 20s\nmemory = 8G\n", 4, "given twice (first on line 2)"},
    {"[daemon]\nmemory = 4G\n[policy]\n[daemon]\nmemory = 8G\n", 5, "given twice"},
    {"[tenant.a]\nuids = 1\n[tenant.b]\nuids = 2\n[tenant.a]\n", 5,
     "duplicate section [tenant.a] (first on line 1)"},
    {"[tenant.a]\nuids = 1000\n[tenant.b]\ngids = 5\nuids = 7, 1000\n", 5,
     "uid 1000 of tenant 'b' is already claimed by tenant 'a'"},
    {"[tenant.a]\ngids = 9\n[tenant.b]\nuids = 3\ngids = 9\n", 5, "gid 9 of tenant 'b'"},
    {"[tenant.a]\nuids = 4, 4\n", 2, "listed twice"},
    {"[tenant.a]\nuids = no_such_user_ckv\n", 2, "unknown user 'no_such_user_ckv'"},
    {"[tenant.a]\ngids = no_such_group_ckv\n", 2, "unknown group"},
    {"[tenant.a]\nuids = 4294967295\n", 2, "not a valid uid"},
    {"[tenant.a]\nuids = -3\n", 2, "unknown user"},
    {"[tenant.a]\nuids = 1\npolicies = fp16, lru\n", 3, "unknown policy 'lru'"},
    {"[tenant.a]\nuids = 1\npolicies = \"\"\n", 3, "at least one policy"},
    {"[tenant.Alice]\n", 1, "bad tenant name 'Alice'"},
    {"[tenant.]\n", 1, "bad tenant name"},
    {"[tenant.a b]\n", 1, "bad tenant name"},
    {"[daemon\n", 1, "missing ']'"},
    {"[daemon] x\n", 1, "junk after section header"},
    {"memory = 4G\n", 1, "before any [section]"},
    {"[daemon]\nmemory 4G\n", 2, "expected 'key = value'"},
    {"[daemon]\n= 4G\n", 2, "missing key"},
    {"[daemon]\nsocket = \"ipc:///x\n", 2, "unterminated quoted value"},
    {"[daemon]\nsocket = \"ipc:///x\" y\n", 2, "junk after quoted value"},
    {"[daemon]\nsocket = \"ipc:///\\x\"\n", 2, "bad escape"},
    /* Cross-key checks blame the line of the key set last. */
    {"[daemon]\nheartbeat = 6s\n\n", 2, "at most half the lease"},
    {"[daemon]\nheartbeat = 3s\nlease = 5s\n", 3, "at most half the lease"},
    {"[daemon]\n\nremote_tcp = tcp://0.0.0.0:5555\n", 3, "remote_tcp needs curve"},
    {"[daemon]\ncurve_public_key = rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\n", 2, "go together"},
    {"[policy]\nhigh_attn_threshold = 0.5\n\n[daemon]\nmemory = 1G\n", 2, "below attn_threshold"},
    {"[policy]\njudge = mlp\n", 2, "needs mlp_weights"},
    {"[policy]\nrecent_window = 200\n[daemon]\nmax_tokens_per_session = 100\n", 4,
     "below max_tokens_per_session"},
    {"[tenant.a]\nquota = 1G\n[tenant.b]\nuids = 3\n", 1, "neither uids nor gids"},
    {"[tenant.a]\nuids = 1\npolicies = fp16, int8\n", 3, "default policy 'commitkv' is not in"},
    {"[tenant.a]\nuids = 1\npolicies = fp16\ndefault_policy = h2o\n", 4, "default policy 'h2o'"},
};

ParameterizedTestParameters(config, bad_file) {
  return cr_make_param_array(bad_case, bad_cases, sizeof bad_cases / sizeof bad_cases[0]);
}

ParameterizedTest(const bad_case *bc, config, bad_file, .init = setup, .fini = teardown) {
  const char *path = write_tmp(bc->text);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  int r = ckv_config_load_file(&c, path, err, sizeof err);
  cr_expect_eq(r, CKV_ERR_INVALID, "file %s: got %d", bc->text, r);
  char prefix[600];
  snprintf(prefix, sizeof prefix, "%s:%u: ", path, bc->line);
  cr_expect(strncmp(err, prefix, strlen(prefix)) == 0, "expected prefix '%s', got '%s'", prefix,
            err);
  cr_expect(strstr(err, bc->needle) != NULL, "expected '%s' in '%s'", bc->needle, err);
  ckv_config_done(&c);
}

Test(config, missing_file) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[256];
  cr_expect_eq(ckv_config_load_file(&c, "/nonexistent/ckv.conf", err, sizeof err), -ENOENT);
  cr_expect(strstr(err, "/nonexistent/ckv.conf") != NULL, "%s", err);
  ckv_config_done(&c);
}

Test(config, nul_byte_in_file, .init = setup, .fini = teardown) {
  char path[512];
  snprintf(path, sizeof path, "%s/nul.conf", tmpdir_path);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fwrite("[daemon]\nmemory = 4G\0\n", 1, 22, f);
  fclose(f);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[600];
  cr_expect_eq(ckv_config_load_file(&c, path, err, sizeof err), CKV_ERR_INVALID);
  char want[600];
  snprintf(want, sizeof want, "%s:2: NUL byte in file", path);
  cr_expect_str_eq(err, want);
  ckv_config_done(&c);
}

Test(config, error_with_null_buffer) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  cr_expect_eq(ckv_config_load_string(&c, "[daemon]\nfoo = 1\n", "x", NULL, 0), CKV_ERR_INVALID);
  char tiny[4];
  cr_expect_eq(ckv_config_load_string(&c, "[nope]\n", "x", tiny, sizeof tiny), CKV_ERR_INVALID);
  cr_expect_eq(strlen(tiny), 3);
  ckv_config_done(&c);
}

/* Only regular files are read: a FIFO would block the reader for ever (with
 * no writer), a directory gave "read error".  Both are refused by type. */
Test(config, non_regular_file_is_refused_by_type, .init = setup, .fini = teardown, .timeout = 10) {
  char fifo[512], dir[512];
  snprintf(fifo, sizeof fifo, "%s/fifo.conf", tmpdir_path);
  snprintf(dir, sizeof dir, "%s/dir.conf", tmpdir_path);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(mkdir(dir, 0700), 0);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[700], want[700];
  cr_expect_eq(ckv_config_load_file(&c, fifo, err, sizeof err), CKV_ERR_INVALID);
  snprintf(want, sizeof want, "%s: is a FIFO, not a regular file", fifo);
  cr_expect_str_eq(err, want);
  cr_expect_eq(ckv_config_load_file(&c, dir, err, sizeof err), CKV_ERR_INVALID);
  snprintf(want, sizeof want, "%s: is a directory, not a regular file", dir);
  cr_expect_str_eq(err, want);
  cr_expect_eq(ckv_config_load_file(&c, "/dev/null", err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(err, "/dev/null: is a character device, not a regular file");
  ckv_config_done(&c);
}

/* Lines longer than libinih's default 200 bytes, indented lines (which inih
 * would read as a continuation), CRLF, inline comments after a quoted value
 * holding ';' and '#'. */
Test(config, reader_details) {
  char text[2048];
  char uids[1200] = "";
  size_t n = 0;
  for (int i = 0; i < 64; i++) n += (size_t)snprintf(uids + n, sizeof uids - n, "%s%d", i ? ", " : "", 100000 + i);
  snprintf(text, sizeof text,
           "[daemon]\r\n  memory = 8G ; eight\r\n\tstate_dir = \"/srv/a ;b #c\"  # comment\n"
           "[tenant.t]\nuids = %s\n",
           uids);
  cr_assert_gt(strlen(uids), 400);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  cr_assert_eq(ckv_config_load_string(&c, text, "r", err, sizeof err), CKV_OK, "%s", err);
  cr_expect_eq(c.memory, 8ull << 30);
  cr_expect_str_eq(c.state_dir, "/srv/a ;b #c");
  cr_assert_eq(c.n_tenants, 1);
  cr_expect_eq(c.tenants[0].n_uids, 64);
  cr_expect_eq(c.tenants[0].uids[63], 100063);
  ckv_config_done(&c);
  /* inih would take "key: value"; the file syntax has only '='. */
  ckv_config_init_defaults(&c);
  cr_expect_eq(ckv_config_load_string(&c, "[daemon]\nmemory: 4G\n", "r", err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(err, "r:2: expected 'key = value' or '[section]'");
  ckv_config_done(&c);
}

/* ---- sizes and durations ---- */

typedef struct num_case {
  const char *text;
  int status;
  uint64_t value;
} num_case;

/* Each case through parse, its output preset to `unset`: the status, then the value on success or the output
 * untouched on failure. */
static void expect_num_cases(int (*parse)(const char *, uint64_t *), const num_case *cases, size_t n, uint64_t unset) {
  for (size_t i = 0; i < n; i++) {
    uint64_t v = unset;
    int r = parse(cases[i].text, &v);
    cr_expect_eq(r, cases[i].status, "'%s': got %d", cases[i].text, r);
    if (cases[i].status == CKV_OK)
      cr_expect_eq(v, cases[i].value, "'%s': got %llu", cases[i].text, (unsigned long long)v);
    else
      cr_expect_eq(v, unset, "'%s': output written on failure", cases[i].text);
  }
}

Test(config, parse_size) {
  static const num_case cases[] = {
      {"0", CKV_OK, 0},
      {"1", CKV_OK, 1},
      {"1000", CKV_OK, 1000},
      {"16K", CKV_OK, 16384},
      {"16k", CKV_OK, 16384},
      {"16KB", CKV_OK, 16384},
      {"16KiB", CKV_OK, 16384},
      {"512M", CKV_OK, 512ull << 20},
      {"4G", CKV_OK, 4ull << 30},
      {"4gib", CKV_OK, 4ull << 30},
      {"2T", CKV_OK, 2ull << 40},
      {"1P", CKV_OK, 1ull << 50},
      {"7B", CKV_OK, 7},
      {"18446744073709551615", CKV_OK, UINT64_MAX},
      {"18446744073709551616", CKV_ERR_RANGE, 0},
      {"16777216T", CKV_ERR_RANGE, 0},
      {"16777215T", CKV_OK, 16777215ull << 40},
      {"99999999999999999999999999", CKV_ERR_RANGE, 0},
      {"", CKV_ERR_INVALID, 0},
      {"-1", CKV_ERR_INVALID, 0},
      {"+1", CKV_ERR_INVALID, 0},
      {" 4G", CKV_ERR_INVALID, 0},
      {"4G ", CKV_ERR_INVALID, 0},
      {"4 G", CKV_ERR_INVALID, 0},
      {"1.5G", CKV_ERR_INVALID, 0},
      {"4X", CKV_ERR_INVALID, 0},
      {"4GiBx", CKV_ERR_INVALID, 0},
      {"4GG", CKV_ERR_INVALID, 0},
      {"4iB", CKV_ERR_INVALID, 0},
      {"G", CKV_ERR_INVALID, 0},
      {"0x10", CKV_ERR_INVALID, 0},
  };
  expect_num_cases(ckv_parse_size, cases, sizeof cases / sizeof cases[0], 12345);
  cr_expect_eq(ckv_parse_size(NULL, &(uint64_t){0}), CKV_ERR_INVALID);
}

Test(config, parse_duration) {
  static const num_case cases[] = {
      {"0", CKV_OK, 0},
      {"0s", CKV_OK, 0},
      {"1ms", CKV_OK, 1},
      {"250ms", CKV_OK, 250},
      {"10s", CKV_OK, 10000},
      {"5m", CKV_OK, 300000},
      {"2h", CKV_OK, 7200000},
      {"1d", CKV_OK, 86400000},
      {"18446744073709551615ms", CKV_OK, UINT64_MAX},
      {"18446744073709551615s", CKV_ERR_RANGE, 0},
      {"18446744073709552s", CKV_ERR_RANGE, 0},
      {"10", CKV_ERR_INVALID, 0},
      {"", CKV_ERR_INVALID, 0},
      {"s", CKV_ERR_INVALID, 0},
      {"-1s", CKV_ERR_INVALID, 0},
      {"1.5s", CKV_ERR_INVALID, 0},
      {"10sec", CKV_ERR_INVALID, 0},
      {"10S", CKV_ERR_INVALID, 0},
      {"10 s", CKV_ERR_INVALID, 0},
      {"1m30s", CKV_ERR_INVALID, 0},
      {"5us", CKV_ERR_INVALID, 0},
  };
  expect_num_cases(ckv_parse_duration_ms, cases, sizeof cases / sizeof cases[0], 777);
}

/* Each value formats to its text, and that text parses back to the value. */
static void expect_round_trips(void (*format)(uint64_t, char *, size_t), int (*parse)(const char *, uint64_t *),
                               const uint64_t *values, const char *const *texts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char buf[32];
    uint64_t back = 0;
    format(values[i], buf, sizeof buf);
    cr_expect_str_eq(buf, texts[i]);
    cr_expect_eq(parse(buf, &back), CKV_OK, "%s", buf);
    cr_expect_eq(back, values[i], "%s", buf);
  }
}

Test(config, format_round_trip) {
  static const uint64_t sizes[] = {0, 1, 1023, 1024, 1536, 4ull << 30, 3ull << 40, 5ull << 50,
                                   (1ull << 60), 1000000007ull, UINT64_MAX};
  static const char *const size_text[] = {"0", "1", "1023", "1K", "1536", "4G", "3T", "5P",
                                          "1024P", "1000000007", "18446744073709551615"};
  expect_round_trips(ckv_format_size, ckv_parse_size, sizes, size_text, sizeof sizes / sizeof sizes[0]);
  static const uint64_t durs[] = {0, 1, 999, 1000, 1500, 60000, 90000, 3600000, 86400000, 172800001};
  static const char *const dur_text[] = {"0", "1ms", "999ms", "1s", "1500ms", "1m", "90s",
                                         "1h", "1d", "172800001ms"};
  expect_round_trips(ckv_format_duration_ms, ckv_parse_duration_ms, durs, dur_text, sizeof durs / sizeof durs[0]);
}

/* ---- policies ---- */

/* The [policy] keys of the judge are the lifecycle's parameter table
 * (lifecycle/policy.h): same names, same defaults as ckv_judge_params_init,
 * same bounds (policy names themselves: tests/unit/test_policy.c). */
Test(config, policy_section_is_the_lifecycle_table) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  ckv_judge_params from_cfg, lib;
  ckv_config_judge_params(&c.policy, &from_cfg);
  ckv_judge_params_init(&lib);
  cr_expect_eq(from_cfg.policy, lib.policy);
  char err[256];
  for (size_t i = 0; i < ckv_judge_param_count; i++) {
    const ckv_judge_param *d = &ckv_judge_param_table[i];
    cr_expect_eq(ckv_judge_param_get(&from_cfg, d), ckv_judge_param_get(&lib, d), "%s: config default %g, lifecycle %g",
                 d->name, ckv_judge_param_get(&from_cfg, d), ckv_judge_param_get(&lib, d));
    if (d->type == CKV_JUDGE_PARAM_BOOL) continue;
    char v[64];
    snprintf(v, sizeof v, "%.17g", d->min);
    cr_expect_eq(ckv_config_set(&c, "policy", d->name, v, err, sizeof err), CKV_OK, "%s=%s: %s", d->name, v, err);
    snprintf(v, sizeof v, "%.17g", d->max);
    cr_expect_eq(ckv_config_set(&c, "policy", d->name, v, err, sizeof err), CKV_OK, "%s=%s: %s", d->name, v, err);
    snprintf(v, sizeof v, "%.17g", d->max + 1);
    cr_expect_eq(ckv_config_set(&c, "policy", d->name, v, err, sizeof err), CKV_ERR_INVALID, "%s=%s accepted", d->name, v);
    if (d->type == CKV_JUDGE_PARAM_FLOAT ? d->min > 0 : d->min >= 1) {
      snprintf(v, sizeof v, "%.17g", d->min - (d->type == CKV_JUDGE_PARAM_FLOAT ? d->min / 2 : 1));
      cr_expect_eq(ckv_config_set(&c, "policy", d->name, v, err, sizeof err), CKV_ERR_INVALID, "%s=%s accepted",
                   d->name, v);
    }
  }
  ckv_config_done(&c);
}

/* ---- tenants ---- */

Test(config, tenant_lookup) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  int r = ckv_config_load_string(&c,
                                 "[tenant.a]\nuids = 1000\ngids = 50\n"
                                 "[tenant.b]\nuids = 1001, 1002\n"
                                 "[tenant.c]\ngids = 60, 70\n",
                                 "t", err, sizeof err);
  cr_assert_eq(r, CKV_OK, "%s", err);
  const ckv_tenant_config *t;
  t = ckv_config_tenant_for(&c, 1000, 999);
  cr_assert_not_null(t);
  cr_expect_str_eq(t->name, "a");
  t = ckv_config_tenant_for(&c, 1002, 50); /* uid wins over an earlier tenant's gid */
  cr_assert_not_null(t);
  cr_expect_str_eq(t->name, "b");
  t = ckv_config_tenant_for(&c, 4242, 70);
  cr_assert_not_null(t);
  cr_expect_str_eq(t->name, "c");
  t = ckv_config_tenant_for(&c, 4242, 50);
  cr_assert_not_null(t);
  cr_expect_str_eq(t->name, "a");
  cr_expect_null(ckv_config_tenant_for(&c, 4242, 4242));
  cr_expect_null(ckv_config_tenant_for(&c, 0, 0));
  ckv_config_done(&c);
}

Test(config, ensure_default_tenant) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  cr_expect_null(ckv_config_tenant_for(&c, 1000, 1000));
  cr_assert_eq(ckv_config_ensure_default_tenant(&c, 1000), 1);
  cr_assert_eq(c.n_tenants, 1);
  cr_expect_str_eq(c.tenants[0].name, "default");
  cr_expect_eq(c.tenants[0].n_uids, 2);
  cr_expect_eq(c.tenants[0].policies, CKV_POLICY_ALL_MASK);
  cr_expect_eq(c.tenants[0].quota, 0);
  cr_expect_eq(ckv_config_tenant_for(&c, 1000, 5), &c.tenants[0]);
  cr_expect_eq(ckv_config_tenant_for(&c, 0, 0), &c.tenants[0]);
  cr_expect_null(ckv_config_tenant_for(&c, 1001, 1001));
  cr_expect_eq(ckv_config_ensure_default_tenant(&c, 1000), 0);
  cr_expect_eq(c.n_tenants, 1);
  char err[256];
  cr_expect_eq(ckv_config_check(&c, err, sizeof err), CKV_OK, "%s", err);
  ckv_config_done(&c);

  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_ensure_default_tenant(&c, 0), 1);
  cr_expect_eq(c.tenants[0].n_uids, 1); /* root once, not twice */
  ckv_config_done(&c);

  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_set(&c, "tenant.x", "uids", "5", err, sizeof err), CKV_OK);
  cr_expect_eq(ckv_config_ensure_default_tenant(&c, 1000), 0);
  cr_expect_null(ckv_config_tenant_for(&c, 1000, 1000));
  ckv_config_done(&c);
}

/* A tenant's client limit: its own max_clients (never above the daemon's),
 * else an equal share of [daemon] max_clients. */
Test(config, tenant_max_clients_share) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  cr_assert_eq(ckv_config_load_string(&c,
                                       "[daemon]\nmax_clients = 10\n"
                                       "[tenant.a]\nuids = 1\n[tenant.b]\nuids = 2\n"
                                       "[tenant.c]\nuids = 3\nmax_clients = 7\n"
                                       "[tenant.d]\nuids = 4\nmax_clients = 50\n",
                                       "m", err, sizeof err),
               CKV_OK, "%s", err);
  cr_expect_eq(ckv_tenant_max_clients(&c, &c.tenants[0]), 2); /* 10 / 4 tenants */
  cr_expect_eq(ckv_tenant_max_clients(&c, &c.tenants[2]), 7);
  cr_expect_eq(ckv_tenant_max_clients(&c, &c.tenants[3]), 10, "the daemon's max_clients is the ceiling");
  ckv_config_done(&c);
  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_ensure_default_tenant(&c, 1000), 1);
  cr_expect_eq(ckv_tenant_max_clients(&c, &c.tenants[0]), 256, "one tenant alone has every slot");
  ckv_config_done(&c);
}

/* [daemon] memory is a total: tenants with a quota reserve the arena their
 * quota needs, the others share what is left equally, in whole chunks. */
Test(config, tenant_memory_share) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  cr_assert_eq(ckv_config_load_string(&c,
                                       "[daemon]\nmemory = 1G\n"
                                       "[tenant.a]\nuids = 1\n[tenant.b]\nuids = 2\n"
                                       "[tenant.q]\nuids = 3\nquota = 100M\n",
                                       "m", err, sizeof err),
               CKV_OK, "%s", err);
  uint64_t qa = ckv_tenant_memory_share(&c, &c.tenants[2]);
  cr_expect_eq(qa, ckv_tenant_arena_for_quota(100ull << 20));
  cr_expect_geq(ckv_tenant_quota_for_arena(qa), 100ull << 20, "the arena holds its quota");
  uint64_t share = ckv_tenant_memory_share(&c, &c.tenants[0]);
  cr_expect_eq(share, ckv_tenant_memory_share(&c, &c.tenants[1]));
  cr_expect_eq(share % CKV_TENANT_ARENA_ALIGN, 0);
  cr_expect_leq(2 * share + qa, 1ull << 30, "the shares add up to more than [daemon] memory");
  cr_expect_gt(2 * share + qa, (1ull << 30) - 2 * CKV_TENANT_ARENA_ALIGN, "the shares leave memory unused");
  ckv_config_done(&c);
  /* Sizing round trip: an arena made for a quota holds it, for any size. */
  for (uint64_t q = 1; q < (1ull << 42); q = q * 3 + 7)
    cr_expect_geq(ckv_tenant_quota_for_arena(ckv_tenant_arena_for_quota(q)), q, "quota %llu", (unsigned long long)q);
}

/* ---- command-line overrides ---- */

Test(config, set_from_cli) {
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512];
  cr_expect_eq(ckv_config_set(&c, "daemon", "memory", "8G", err, sizeof err), CKV_OK);
  cr_expect_eq(c.memory, 8ull << 30);
  cr_expect_eq(ckv_config_set(&c, "daemon", "backend", "host", err, sizeof err), CKV_OK);
  cr_expect_eq(c.backend, CKV_BACKEND_HOST);
  cr_expect_eq(ckv_config_set(&c, "daemon", "socket", "ipc:///tmp/x.sock", err, sizeof err), CKV_OK);
  cr_expect_str_eq(c.socket, "ipc:///tmp/x.sock");
  cr_expect_eq(ckv_config_set(&c, "daemon", "state_dir", "/srv/ckv", err, sizeof err), CKV_OK);
  cr_expect_str_eq(c.state_dir, "/srv/ckv");
  cr_expect_eq(ckv_config_set(&c, "policy", "idle_rounds", "99", err, sizeof err), CKV_OK);
  cr_expect_eq(c.policy.idle_rounds, 99);

  cr_expect_eq(ckv_config_set(&c, "daemon", "memory", "8Q", err, sizeof err), CKV_ERR_INVALID);
  cr_expect(strstr(err, "'memory'") && strstr(err, "not a size"), "%s", err);
  cr_expect_eq(c.memory, 8ull << 30, "failed set must not change the field");
  cr_expect_eq(ckv_config_set(&c, "daemon", "socket", "nope", err, sizeof err), CKV_ERR_INVALID);
  cr_expect_str_eq(c.socket, "ipc:///tmp/x.sock");
  cr_expect_eq(ckv_config_set(&c, "daemon", "nosuch", "1", err, sizeof err), CKV_ERR_INVALID);
  cr_expect(strstr(err, "unknown key 'nosuch'"), "%s", err);
  cr_expect_eq(ckv_config_set(&c, "server", "memory", "1G", err, sizeof err), CKV_ERR_INVALID);
  cr_expect(strstr(err, "unknown section"), "%s", err);
  cr_expect_eq(ckv_config_set(&c, "tenant.Bad", "uids", "1", err, sizeof err), CKV_ERR_INVALID);
  cr_expect_eq(ckv_config_set(&c, "tenant.ok", "nosuch", "1", err, sizeof err), CKV_ERR_INVALID);
  cr_expect_eq(c.n_tenants, 0, "a bad key must not create the tenant");
  cr_expect_eq(ckv_config_set(&c, "tenant.ok", "uids", "42", err, sizeof err), CKV_OK);
  cr_expect_eq(ckv_config_set(&c, "tenant.ok", "quota", "3G", err, sizeof err), CKV_OK);
  cr_assert_eq(c.n_tenants, 1);
  cr_expect_eq(c.tenants[0].quota, 3ull << 30);
  cr_expect_eq(ckv_config_set(&c, NULL, "x", "y", err, sizeof err), CKV_ERR_INVALID);
  ckv_config_done(&c);
}

/* ---- derived defaults ---- */

Test(config, finalize_under_systemd) {
  setenv("RUNTIME_DIRECTORY", "/run/commitkv-t:/run/other", 1);
  setenv("STATE_DIRECTORY", "/var/lib/commitkv-t", 1);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[256];
  cr_assert_eq(ckv_config_finalize(&c, err, sizeof err), CKV_OK, "%s", err);
  cr_expect_str_eq(c.socket, "ipc:///run/commitkv-t/commitkvd.sock");
  cr_expect_str_eq(c.attach_socket, "/run/commitkv-t/commitkvd.attach");
  cr_expect_str_eq(c.state_dir, "/var/lib/commitkv-t");
  ckv_config_done(&c);
}

Test(config, finalize_env_too_long) {
  char longdir[700] = "/";
  memset(longdir + 1, 'd', sizeof longdir - 2);
  longdir[sizeof longdir - 1] = '\0';
  setenv("RUNTIME_DIRECTORY", longdir, 1);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[256];
  cr_expect_eq(ckv_config_finalize(&c, err, sizeof err), CKV_ERR_INVALID);
  cr_expect(strstr(err, "too long") != NULL, "%s", err);
  ckv_config_done(&c);
}

Test(config, finalize_by_hand) {
  unsetenv("RUNTIME_DIRECTORY");
  unsetenv("STATE_DIRECTORY");
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[256];
  cr_assert_eq(ckv_config_finalize(&c, err, sizeof err), CKV_OK, "%s", err);
  cr_expect_str_eq(c.socket, "ipc:///run/commitkv/commitkvd.sock");
  cr_expect_str_eq(c.attach_socket, "/run/commitkv/commitkvd.attach");
  cr_expect_str_eq(c.state_dir, "/var/lib/commitkv");
  ckv_config_done(&c);

  /* An explicit socket puts the attach socket next to it. */
  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_set(&c, "daemon", "socket", "ipc:///tmp/t1/ctl.sock", err, sizeof err),
               CKV_OK);
  cr_assert_eq(ckv_config_finalize(&c, err, sizeof err), CKV_OK, "%s", err);
  cr_expect_str_eq(c.attach_socket, "/tmp/t1/commitkvd.attach");
  ckv_config_done(&c);

  /* Cross checks run there too. */
  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_set(&c, "daemon", "heartbeat", "9s", err, sizeof err), CKV_OK);
  cr_expect_eq(ckv_config_finalize(&c, err, sizeof err), CKV_ERR_INVALID);
  cr_expect(strstr(err, "half the lease"), "%s", err);
  ckv_config_done(&c);
}

/* ---- write -> load ---- */

Test(config, round_trip, .init = setup, .fini = teardown) {
  ckv_config a;
  ckv_config_init_defaults(&a);
  char err[512] = "";
  static const char *const sets[][3] = {
      {"daemon", "socket", "ipc:///run/a \"quoted\" \\ dir/s.sock"},
      {"daemon", "memory", "1536M"},
      {"daemon", "disk_memory", "1000000007"},
      {"daemon", "lease", "90s"},
      {"daemon", "detach_keep", "0"},
      {"daemon", "log_level", "warning"},
      {"daemon", "metrics", "[::1]:9000"},
      {"daemon", "remote_tcp", "tcp://0.0.0.0:7000"},
      {"daemon", "curve_secret_key", "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"},
      {"daemon", "curve_public_key", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"},
      {"policy", "attn_threshold", "0.1"},
      {"policy", "high_attn_threshold", "0.30000000000000004"},
      {"policy", "semantic_threshold", "0.123456789012345"},
      {"policy", "judge", "mlp"},
      {"policy", "mlp_weights", "/etc/commitkv/judge.w"},
      {"policy", "semantic_estimate", "no"},
      {"tenant.zeta", "uids", "7, 8, 9"},
      {"tenant.zeta", "policies", "h2o streaming"},
      {"tenant.zeta", "default_policy", "h2o"},
      {"tenant.zeta", "quota_disk", "7T"},
      {"tenant.alpha", "gids", "100"},
      {"tenant.alpha", "max_sessions", "5"},
  };
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    cr_assert_eq(ckv_config_set(&a, sets[i][0], sets[i][1], sets[i][2], err, sizeof err), CKV_OK,
                 "%s.%s: %s", sets[i][0], sets[i][1], err);
  cr_assert_eq(ckv_config_check(&a, err, sizeof err), CKV_OK, "%s", err);

  char *text = capture(do_write, &a);
  const char *path = write_tmp(text);
  ckv_config b;
  ckv_config_init_defaults(&b);
  cr_assert_eq(ckv_config_load_file(&b, path, err, sizeof err), CKV_OK, "%s\n%s", err, text);
  char *text2 = capture(do_write, &b);
  cr_expect_str_eq(text2, text);
  cr_expect_str_eq(b.socket, "ipc:///run/a \"quoted\" \\ dir/s.sock");
  cr_expect_eq(b.memory, 1536ull << 20);
  cr_expect_eq(b.disk_memory, 1000000007ull);
  cr_expect_eq(b.detach_keep_ms, 0);
  cr_expect_eq(b.policy.attn_threshold, 0.1);                 /* bit-exact */
  cr_expect_eq(b.policy.high_attn_threshold, 0.30000000000000004);
  cr_expect_eq(b.policy.semantic_threshold, 0.123456789012345);
  cr_expect_str_eq(b.curve_secret_key, a.curve_secret_key);
  cr_assert_eq(b.n_tenants, 2);
  cr_expect_str_eq(b.tenants[0].name, "zeta");
  cr_expect_eq(b.tenants[0].n_uids, 3);
  cr_expect_eq(b.tenants[0].policies, a.tenants[0].policies);
  cr_expect_eq(b.tenants[0].default_policy, CKV_POLICY_H2O);
  cr_expect_eq(b.tenants[1].n_uids, 0);
  cr_expect_eq(b.tenants[1].gids[0], 100);
  cr_expect_eq(ckv_config_reload_diff(&a, &b, NULL, 0), 0);
  free(text);
  free(text2);
  ckv_config_done(&a);
  ckv_config_done(&b);
}

/* ---- reload ---- */

Test(config, reload) {
  ckv_config live, fresh;
  char err[512] = "";
  ckv_config_init_defaults(&live);
  cr_assert_eq(ckv_config_load_string(&live,
                                      "[tenant.alice]\nuids = 1000\nquota = 1G\n"
                                      "[tenant.bob]\nuids = 1001\n",
                                      "live", err, sizeof err),
               CKV_OK, "%s", err);
  ckv_config_init_defaults(&fresh);
  cr_assert_eq(ckv_config_load_string(&fresh,
                                      "[daemon]\nmemory = 8G\nlog_level = debug\n"
                                      "[policy]\nidle_rounds = 3\nsink_tokens = 8\n"
                                      "[tenant.alice]\nuids = 1000, 1005\nquota = 2G\n"
                                      "policies = fp16\ndefault_policy = fp16\n"
                                      "[tenant.carol]\nuids = 1002\n",
                                      "fresh", err, sizeof err),
               CKV_OK, "%s", err);
  char diff[256];
  int n = ckv_config_reload_diff(&live, &fresh, diff, sizeof diff);
  cr_expect_eq(n, 4, "%s", diff);
  cr_expect_str_eq(diff, "memory, tenant.alice.uids, tenant.bob (removed), tenant.carol (added)");

  ckv_config_apply_reload(&live, &fresh);
  cr_expect_eq(live.memory, 4ull << 30, "memory needs a restart");
  cr_expect_eq(live.log_level, CKV_LOG_DEBUG);
  cr_expect_eq(live.policy.idle_rounds, 3);
  cr_expect_eq(live.policy.sink_tokens, 8);
  cr_assert_eq(live.n_tenants, 2);
  cr_expect_eq(live.tenants[0].quota, 2ull << 30);
  cr_expect_eq(live.tenants[0].policies, 1u << CKV_POLICY_FP16);
  cr_expect_eq(live.tenants[0].default_policy, CKV_POLICY_FP16);
  cr_expect_eq(live.tenants[0].n_uids, 1, "uids need a restart");
  cr_expect_null(ckv_config_tenant_by_name(&live, "carol"));
  cr_expect_eq(ckv_config_reload_diff(&live, &fresh, NULL, 0), 4);
  ckv_config_done(&live);
  ckv_config_done(&fresh);
}

static void collect_change(void *ctx, const char *section, const char *key, const char *note) {
  char *out = ctx;
  size_t n = strlen(out);
  snprintf(out + n, 512 - n, "%s%s%s%s%s;", section, key ? "." : "", key ? key : "", note ? " " : "",
           note ? note : "");
}

/* One change per key that needs a restart, by section and key; the
 * reloadable ones (quota, max_clients) are applied. */
Test(config, reload_changes_name_section_and_key) {
  ckv_config live, fresh;
  char err[512] = "";
  ckv_config_init_defaults(&live);
  cr_assert_eq(ckv_config_load_string(&live, "[tenant.a]\nuids = 1000\nquota = 4M\n", "live", err, sizeof err),
               CKV_OK, "%s", err);
  ckv_config_init_defaults(&fresh);
  cr_assert_eq(ckv_config_load_string(&fresh,
                                      "[daemon]\nbackend = host\n"
                                      "[tenant.a]\nuids = 1000, 1001\ngids = 7\nquota = 8M\nmax_clients = 3\n",
                                      "fresh", err, sizeof err),
               CKV_OK, "%s", err);
  char seen[512] = "";
  cr_expect_eq(ckv_config_reload_changes(&live, &fresh, collect_change, seen), 3);
  cr_expect_str_eq(seen, "daemon.backend;tenant.a.uids;tenant.a.gids;");
  ckv_config_apply_reload(&live, &fresh);
  cr_expect_eq(live.tenants[0].quota, 8ull << 20);
  cr_expect_eq(live.tenants[0].max_clients, 3);
  cr_expect_eq(live.tenants[0].n_uids, 1);
  ckv_config_done(&live);
  ckv_config_done(&fresh);
}

/* ---- the template, the shipped file, the docs ---- */

/* Calls fn for each "#key = default" line of the generated template. */
static size_t for_each_template_key(const char *tmpl, void (*fn)(const char *line, void *),
                                    void *ctx) {
  size_t n = 0;
  const char *p = tmpl;
  while (*p) {
    size_t len = strcspn(p, "\n");
    if (len > 1 && p[0] == '#' && p[1] != ' ' && p[1] != '[' && memchr(p, '=', len)) {
      char line[1024];
      cr_assert_lt(len, sizeof line);
      memcpy(line, p, len);
      line[len] = '\0';
      fn(line, ctx);
      n++;
    }
    p += len;
    if (*p) p++;
  }
  return n;
}

static void expect_line_in(const char *line, void *ctx) {
  const char *text = ctx;
  char want[1100];
  snprintf(want, sizeof want, "\n%s\n", line);
  cr_expect(strstr(text, want) != NULL, "missing '%s'", line);
}

static void expect_key_in_docs(const char *line, void *ctx) {
  char key[128];
  cr_assert_eq(sscanf(line, "#%127[a-z_] =", key), 1, "%s", line);
  char want[160];
  snprintf(want, sizeof want, "| `%s` |", key);
  cr_expect(strstr(ctx, want) != NULL, "docs miss %s", key);
}

static void uncomment_into(const char *line, void *ctx) {
  FILE *f = ctx;
  fprintf(f, "%s\n", line + 1);
}

Test(config, template_loads_and_uncommented_equals_defaults, .init = setup, .fini = teardown) {
  char *tmpl = capture(do_template, NULL);
  ckv_config c, d;
  char err[512] = "";
  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_load_file(&c, write_tmp(tmpl), err, sizeof err), CKV_OK, "%s", err);
  cr_expect_eq(c.n_tenants, 0);

  /* Every "#key = default" line, uncommented, must load and give the defaults.
   * Template order is [daemon], [policy], then the tenant example. */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  const char *pol = strstr(tmpl, "\n[policy]\n");
  const char *ten = strstr(tmpl, "\n#[tenant.NAME]\n");
  cr_assert(pol && ten);
  char *daemon_part = strndup(tmpl, (size_t)(pol - tmpl));
  char *policy_part = strndup(pol, (size_t)(ten - pol));
  fputs("[daemon]\n", f);
  size_t nd = for_each_template_key(daemon_part, uncomment_into, f);
  fputs("[policy]\n", f);
  size_t np = for_each_template_key(policy_part, uncomment_into, f);
  fputs("[tenant.t]\n", f);
  size_t nt = for_each_template_key(ten, uncomment_into, f);
  fputs("uids = 1\n", f); /* the example's uids default is empty; a tenant needs one */
  fclose(f);
  cr_expect_eq(nd, 36); /* + warm_journal, warm_journal_delay (issue 43) */
  cr_expect_eq(np, 32); /* + share_grace_rounds (issue 41), filler_demote_staged, fact_cold_rounds (issue 39) */
  cr_expect_eq(nt, 11); /* + high_water (issue 43) */
  /* uids appears twice now: drop the empty one. */
  char *dup = strstr(text, "uids = \"\"\n");
  cr_assert_not_null(dup);
  memcpy(dup, "#ids = \"\"\n", 10);
  ckv_config_init_defaults(&d);
  cr_assert_eq(ckv_config_load_string(&d, text, "uncommented", err, sizeof err), CKV_OK, "%s\n%s",
               err, text);
  ckv_config_done(&c);
  ckv_config_init_defaults(&c);
  cr_assert_eq(ckv_config_set(&c, "tenant.t", "uids", "1", err, sizeof err), CKV_OK);
  char *wc = capture(do_write, &c), *wd = capture(do_write, &d);
  cr_expect_str_eq(wd, wc);
  free(wc);
  free(wd);
  free(daemon_part);
  free(policy_part);
  free(text);
  free(tmpl);
  ckv_config_done(&c);
  ckv_config_done(&d);
}

Test(config, packaging_file_matches_table) {
  const char *src = getenv("CKV_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/packaging/commitkvd.conf", src && *src ? src : ".");
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512] = "";
  cr_assert_eq(ckv_config_load_file(&c, path, err, sizeof err), CKV_OK, "%s", err);
  ckv_config_done(&c);

  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char *text = calloc(1, 1 << 20);
  text[0] = '\n';
  size_t n = fread(text + 1, 1, (1 << 20) - 2, f);
  fclose(f);
  text[n + 1] = '\0';
  char *tmpl = capture(do_template, NULL);
  /* Every key of the table, with its current default. */
  size_t keys = for_each_template_key(tmpl, expect_line_in, text);
  cr_expect_eq(keys, 79); /* + [daemon] warm_journal_delay, [policy] share_grace_rounds, filler_demote_staged, fact_cold_rounds */
  cr_expect_str_eq(text + 1, tmpl,
                   "packaging/commitkvd.conf is stale: regenerate it with "
                   "ckv_config_write_template (commitkvd --print-default-config)");
  free(tmpl);
  free(text);
}

Test(config, docs_cover_every_key) {
  char *tmpl = capture(do_template, NULL);
  char *md = capture(do_md, NULL);
  for_each_template_key(tmpl, expect_key_in_docs, md);
  cr_expect(strstr(md, "### [daemon]") && strstr(md, "### [policy]") && strstr(md, "### [tenant.NAME]"));
  cr_expect(strstr(md, "| `backend` | enum | `auto` | auto\\|host\\|cuda |") != NULL, "%s", md);
  char *man = capture(do_man, NULL);
  cr_expect(strstr(man, ".SH \"[daemon]\"") != NULL);
  cr_expect(strstr(man, ".TP\n.BR memory \" = \" \"4G\"") != NULL, "%s", man);
  free(man);
  free(md);
  free(tmpl);
}
