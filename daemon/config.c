/* daemon/config.c - reading the configuration: the file, the flags, the
 * checks across keys, the derived defaults and SIGHUP's reload rules.
 *
 * Everything here loops over the key table (config_table.h): a key that is
 * not in the table does not exist.  The INI syntax is libinih's; the values
 * in it are read by config_value.c, row by row. */
#include "daemon/config.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "daemon/config_table.h"
#include "common/log.h"
#include "lifecycle/judge.h"
#include "lifecycle/policy.h"

void ckv_config_init_defaults(ckv_config *c) {
  memset(c, 0, sizeof *c);
  ckv_cfg_apply_defaults(SEC_DAEMON, c);
  ckv_cfg_apply_defaults(SEC_POLICY, c);
}

void ckv_config_done(ckv_config *c) {
  if (!c) return;
  free(c->tenants);
  c->tenants = NULL;
  c->n_tenants = 0;
}

/* ------------------------------------------------------------------------ */
/* Cross-key checks                                                           */

/* Which keys a cross-check failure concerns, so the loader can name the line
 * of the one the file set last. */
typedef struct blame {
  const ckv_tenant_config *tenant; /* NULL for [daemon]/[policy] keys */
  const char *key_a, *key_b;       /* key_b may be NULL */
} blame;

static int check_all(const ckv_config *c, blame *b, char *err, size_t errlen) {
  *b = (blame){0};
  if (c->heartbeat_ms * 2 > c->lease_ms) {
    *b = (blame){NULL, "heartbeat", "lease"};
    ckv_cfg_seterr(err, errlen, "heartbeat (%" PRIu64 "ms) must be at most half the lease (%" PRIu64
           "ms), so one lost heartbeat does not expire a lease", c->heartbeat_ms, c->lease_ms);
    return CKV_ERR_INVALID;
  }
  if (!c->curve_secret_key[0] != !c->curve_public_key[0]) {
    *b = (blame){NULL, "curve_secret_key", "curve_public_key"};
    ckv_cfg_seterr(err, errlen, "curve_secret_key and curve_public_key go together: set both or neither");
    return CKV_ERR_INVALID;
  }
  if (c->remote_tcp[0] && !c->curve_secret_key[0]) {
    *b = (blame){NULL, "remote_tcp", NULL};
    ckv_cfg_seterr(err, errlen, "remote_tcp needs curve_secret_key and curve_public_key: the control "
           "protocol never goes over TCP unencrypted");
    return CKV_ERR_INVALID;
  }
  if (c->policy.high_attn_threshold < c->policy.attn_threshold) {
    *b = (blame){NULL, "high_attn_threshold", "attn_threshold"};
    ckv_cfg_seterr(err, errlen, "high_attn_threshold (%g) is below attn_threshold (%g)",
           c->policy.high_attn_threshold, c->policy.attn_threshold);
    return CKV_ERR_INVALID;
  }
  if (c->policy.judge == CKV_JUDGE_MLP && !c->policy.mlp_weights[0]) {
    *b = (blame){NULL, "judge", "mlp_weights"};
    ckv_cfg_seterr(err, errlen, "judge = mlp needs mlp_weights");
    return CKV_ERR_INVALID;
  }
  if ((uint64_t)c->policy.sink_tokens + c->policy.recent_window >= c->max_tokens_per_session) {
    *b = (blame){NULL, "recent_window", "max_tokens_per_session"};
    ckv_cfg_seterr(err, errlen, "sink_tokens + recent_window (%" PRIu64 ") must be below "
           "max_tokens_per_session (%" PRIu32 ")",
           (uint64_t)c->policy.sink_tokens + c->policy.recent_window, c->max_tokens_per_session);
    return CKV_ERR_INVALID;
  }
  for (size_t i = 0; i < c->n_tenants; i++) {
    const ckv_tenant_config *t = &c->tenants[i];
    if (t->n_uids == 0 && t->n_gids == 0) {
      *b = (blame){t, "uids", "gids"};
      ckv_cfg_seterr(err, errlen, "tenant '%s' has neither uids nor gids: no client could reach it",
             t->name);
      return CKV_ERR_INVALID;
    }
    int dp = ckv_tenant_default_policy(c, t);
    if (!ckv_tenant_allows_policy(t, dp)) {
      *b = (blame){t, "policies", "default_policy"};
      ckv_cfg_seterr(err, errlen, "tenant '%s': its default policy '%s' is not in its policies (set "
             "default_policy)", t->name, ckv_policy_names[dp]);
      return CKV_ERR_INVALID;
    }
    /* A uid (or gid) claimed by an earlier tenant: the later claim is the error. */
    for (size_t j = 0; j < i; j++) {
      const ckv_tenant_config *o = &c->tenants[j];
      for (size_t a = 0; a < t->n_uids; a++)
        for (size_t z = 0; z < o->n_uids; z++)
          if (t->uids[a] == o->uids[z]) {
            *b = (blame){t, "uids", NULL};
            ckv_cfg_seterr(err, errlen, "uid %" PRIu32 " of tenant '%s' is already claimed by tenant '%s'",
                   t->uids[a], t->name, o->name);
            return CKV_ERR_INVALID;
          }
      for (size_t a = 0; a < t->n_gids; a++)
        for (size_t z = 0; z < o->n_gids; z++)
          if (t->gids[a] == o->gids[z]) {
            *b = (blame){t, "gids", NULL};
            ckv_cfg_seterr(err, errlen, "gid %" PRIu32 " of tenant '%s' is already claimed by tenant '%s'",
                   t->gids[a], t->name, o->name);
            return CKV_ERR_INVALID;
          }
    }
  }
  return CKV_OK;
}

int ckv_config_check(const ckv_config *c, char *err, size_t errlen) {
  blame b;
  return check_all(c, &b, err, errlen);
}

/* dst = prefix + ($env's first entry, else fallback) [+ "/" + file].
 * CKV_ERR_INVALID when the result does not fit. */
static int derive_path(char *dst, size_t cap, const char *env, const char *file,
                       const char *fallback, const char *prefix) {
  const char *dir = getenv(env);
  char first[CKV_CONFIG_PATH_MAX];
  if (dir && dir[0] == '/') {
    /* systemd passes a colon-separated list when the unit names several. */
    size_t n = strcspn(dir, ":");
    if (n >= sizeof first) n = sizeof first - 1;
    memcpy(first, dir, n);
    first[n] = '\0';
    dir = first;
  } else {
    dir = fallback;
  }
  int n = file ? snprintf(dst, cap, "%s%s/%s", prefix, dir, file)
               : snprintf(dst, cap, "%s%s", prefix, dir);
  if (n < 0 || (size_t)n >= cap) {
    dst[0] = '\0';
    return CKV_ERR_INVALID;
  }
  return CKV_OK;
}

int ckv_config_finalize(ckv_config *c, char *err, size_t errlen) {
  if (!c->socket[0] && derive_path(c->socket, sizeof c->socket, "RUNTIME_DIRECTORY",
                                   "commitkvd.sock", "/run/commitkv", "ipc://") < 0) {
    ckv_cfg_seterr(err, errlen, "socket: $RUNTIME_DIRECTORY is too long for an endpoint");
    return CKV_ERR_INVALID;
  }
  if (!c->attach_socket[0]) {
    int r;
    if (strncmp(c->socket, "ipc://", 6) == 0) {
      /* Next to the control socket, so one RuntimeDirectory holds both. */
      const char *path = c->socket + 6;
      const char *slash = strrchr(path, '/');
      int dirlen = slash ? (int)(slash - path) : 0;
      int n = snprintf(c->attach_socket, sizeof c->attach_socket, "%.*s/commitkvd.attach",
                       dirlen, path);
      r = (n < 0 || (size_t)n >= sizeof c->attach_socket) ? CKV_ERR_INVALID : CKV_OK;
    } else {
      r = derive_path(c->attach_socket, sizeof c->attach_socket, "RUNTIME_DIRECTORY",
                      "commitkvd.attach", "/run/commitkv", "");
    }
    if (r < 0) {
      c->attach_socket[0] = '\0';
      ckv_cfg_seterr(err, errlen, "attach_socket: derived path too long; set attach_socket");
      return CKV_ERR_INVALID;
    }
  }
  if (!c->state_dir[0] && derive_path(c->state_dir, sizeof c->state_dir, "STATE_DIRECTORY", NULL,
                                      "/var/lib/commitkv", "") < 0) {
    ckv_cfg_seterr(err, errlen, "state_dir: $STATE_DIRECTORY is too long");
    return CKV_ERR_INVALID;
  }
  char e2[256];
  if (ckv_cfg_check_unix_path(c->attach_socket, e2, sizeof e2) < 0) {
    ckv_cfg_seterr(err, errlen, "attach_socket: %s", e2);
    return CKV_ERR_INVALID;
  }
  return ckv_config_check(c, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* The file                                                                   */

/* libinih splits lines into sections and `key = value` pairs; this side
 * feeds it the text line by line (counting lines, so every message says
 * file:line, and reading section headers first, so an empty or repeated
 * section is seen too), then reads each value with the old rules: double
 * quotes with \" and \\ escapes, comments after whitespace with '#' or ';'. */

typedef struct loader {
  ckv_config *c;
  const char *name;
  const char *next;          /* text not yet handed to inih */
  unsigned line;             /* of the line inih is parsing */
  section_kind sec;
  bool in_section;
  ckv_tenant_config *tenant; /* SEC_TENANT: index into c->tenants via tenant_idx */
  size_t tenant_idx;
  unsigned *lines;           /* [daemon]/[policy]: line per key index; 0 = not set */
  unsigned *tlines;          /* per tenant: N_KEYS + 1 entries (last = section line) */
  size_t tlines_cap;
  int status;                /* first error (or -ENOMEM); parsing stops there */
  char *err;
  size_t errlen;
} loader;

/* Lines inih may hand over, and so the longest line a file may hold: a
 * value takes up to 4 KiB (a path or a list of 64 uids is far shorter). */
#define CONFIG_LINE_MAX 8192

static int lerr(loader *L, unsigned line, const char *fmt, ...) CKV_PRINTF_FMT(3, 4);
static int lerr(loader *L, unsigned line, const char *fmt, ...) {
  L->status = CKV_ERR_INVALID;
  if (!L->err || L->errlen == 0) return CKV_ERR_INVALID;
  int n = snprintf(L->err, L->errlen, "%s:%u: ", L->name, line);
  if (n < 0 || (size_t)n >= L->errlen) return CKV_ERR_INVALID;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(L->err + n, L->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return CKV_ERR_INVALID;
}

static unsigned *tenant_lines(loader *L, size_t idx) { return L->tlines + idx * (N_KEYS + 1); }

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t') p++;
  return p;
}

static bool comment_start(const char *p) { return *p == '#' || *p == ';'; }

static int parse_section(loader *L, const char *p) {
  const char *close = strchr(p, ']');
  if (!close) return lerr(L, L->line, "missing ']' in section header");
  const char *rest = skip_ws(close + 1);
  if (*rest && !comment_start(rest)) return lerr(L, L->line, "junk after section header");
  p = skip_ws(p + 1);
  const char *e = close;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
  char name[128];
  size_t n = (size_t)(e - p);
  if (n >= sizeof name) return lerr(L, L->line, "section name too long");
  memcpy(name, p, n);
  name[n] = '\0';
  L->in_section = true;
  L->tenant = NULL;
  if (strcmp(name, "daemon") == 0) {
    L->sec = SEC_DAEMON;
    return CKV_OK;
  }
  if (strcmp(name, "policy") == 0) {
    L->sec = SEC_POLICY;
    return CKV_OK;
  }
  if (strncmp(name, "tenant.", 7) == 0) {
    const char *tn = name + 7;
    if (!ckv_cfg_valid_tenant_name(tn))
      return lerr(L, L->line, "bad tenant name '%s' (1 to 63 of a-z, 0-9, '_', '-')", tn);
    ckv_tenant_config *old = ckv_cfg_find_tenant(L->c, tn);
    if (old) {
      unsigned first = tenant_lines(L, (size_t)(old - L->c->tenants))[N_KEYS];
      return lerr(L, L->line, "duplicate section [tenant.%s] (first on line %u)", tn, first);
    }
    int r = 0;
    if (L->c->n_tenants >= L->tlines_cap) {
      size_t cap = L->tlines_cap ? L->tlines_cap * 2 : 8;
      unsigned *nl = realloc(L->tlines, cap * (N_KEYS + 1) * sizeof *nl);
      if (!nl) return L->status = -ENOMEM;
      L->tlines = nl;
      L->tlines_cap = cap;
    }
    ckv_tenant_config *t = ckv_cfg_add_tenant(L->c, tn, &r);
    if (!t) {
      if (r == -ENOMEM) return L->status = r;
      return lerr(L, L->line, "more than %d tenants", CKV_CONFIG_MAX_TENANTS);
    }
    L->sec = SEC_TENANT;
    L->tenant_idx = L->c->n_tenants - 1;
    L->tenant = t;
    unsigned *tl = tenant_lines(L, L->tenant_idx);
    memset(tl, 0, (N_KEYS + 1) * sizeof *tl);
    tl[N_KEYS] = L->line;
    return CKV_OK;
  }
  return lerr(L, L->line, "unknown section [%s] (daemon, policy or tenant.NAME)", name);
}

/* inih's reader: the next line of the text, leading blanks dropped (inih
 * would take an indented line for the continuation of the previous value).
 * Section headers are read here, before inih sees them; a line that inih
 * would read as `key: value` is refused, as the file syntax has only '='.
 * NULL ends the parse: at the end of the text, or at the first error. */
static char *next_line(char *str, int num, void *stream) {
  loader *L = stream;
  if (L->status < 0 || !*L->next) return NULL;
  L->line++;
  const char *p = skip_ws(L->next);
  size_t n = strcspn(p, "\n");
  L->next = p[n] == '\n' ? p + n + 1 : p + n;
  if (n + 2 > (size_t)num) { /* the line, its '\n' and the NUL */
    lerr(L, L->line, "line longer than %d bytes", num - 2);
    return NULL;
  }
  memcpy(str, p, n);
  str[n] = '\0';
  if (n > 0 && str[n - 1] == '\r') str[n - 1] = ' ';
  if (*str == '[') {
    if (parse_section(L, str) < 0) return NULL;
    /* inih keeps its own idea of the section, which the handler ignores; a
     * header it may not read the same way ("[a] # x") becomes a comment. */
    str[0] = '#';
  } else if (!comment_start(str) && str[strcspn(str, "=:")] == ':') {
    lerr(L, L->line, "expected 'key = value' or '[section]'");
    return NULL;
  }
  str[n] = '\n';
  str[n + 1] = '\0';
  return str;
}

/* Extracts the value after '=': quoted ("..." with \" and \\) or bare up to a
 * comment that follows whitespace; trailing blanks trimmed. */
static int parse_value(loader *L, const char *p, char *out, size_t cap) {
  p = skip_ws(p);
  size_t n = 0;
  if (*p == '"') {
    p++;
    for (;; p++) {
      if (*p == '\0') return lerr(L, L->line, "unterminated quoted value");
      if (*p == '"') break;
      if (*p == '\\') {
        p++;
        if (*p != '"' && *p != '\\') return lerr(L, L->line, "bad escape in quoted value");
      }
      if (n + 1 >= cap) return lerr(L, L->line, "value too long");
      out[n++] = *p;
    }
    const char *rest = skip_ws(p + 1);
    if (*rest && !comment_start(rest)) return lerr(L, L->line, "junk after quoted value");
    out[n] = '\0';
    return CKV_OK;
  }
  for (; *p; p++) {
    if (comment_start(p) && (n == 0 || out[n - 1] == ' ' || out[n - 1] == '\t')) break;
    if (n + 1 >= cap) return lerr(L, L->line, "value too long");
    out[n++] = *p;
  }
  while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\t')) n--;
  out[n] = '\0';
  return CKV_OK;
}

static const char *section_display(const loader *L, char *buf, size_t len) {
  if (L->sec == SEC_TENANT)
    snprintf(buf, len, "tenant.%s", L->tenant->name);
  else
    snprintf(buf, len, "%s", ckv_cfg_section_names[L->sec]);
  return buf;
}

/* inih's handler: one `key = value` of line L->line, in the section the
 * reader saw last.  Returns 1 to go on, 0 on an error (L->status says it). */
static int on_pair(void *user, const char *section, const char *key, const char *raw) {
  (void)section;
  loader *L = user;
  if (L->status < 0) return 0;
  if (!key[0]) return lerr(L, L->line, "missing key before '='"), 0;
  if (strlen(key) >= 64) return lerr(L, L->line, "key too long"), 0;
  if (!L->in_section) return lerr(L, L->line, "key '%s' before any [section]", key), 0;
  char secname[96];
  section_display(L, secname, sizeof secname);
  const config_key *k = ckv_cfg_find_key(L->sec, key);
  if (!k) return lerr(L, L->line, "unknown key '%s' in [%s]", key, secname), 0;
  unsigned *seen = L->sec == SEC_TENANT ? &tenant_lines(L, L->tenant_idx)[ckv_cfg_key_index(k)]
                                        : &L->lines[ckv_cfg_key_index(k)];
  if (*seen) {
    lerr(L, L->line, "'%s' in [%s] given twice (first on line %u)", key, secname, *seen);
    return 0;
  }
  char value[4096];
  if (parse_value(L, raw, value, sizeof value) < 0) return 0;
  char why[512] = "";
  void *base = L->sec == SEC_TENANT ? (void *)L->tenant : (void *)L->c;
  if (ckv_cfg_set_value(k, base, value, why, sizeof why) < 0) {
    lerr(L, L->line, "bad value for '%s' in [%s]: %s", key, secname, why);
    return 0;
  }
  *seen = L->line;
  return 1;
}

/* The line to blame for a cross-check failure: the later of the keys' lines,
 * else the tenant's section line, else the last line of the file. */
static unsigned blame_line(loader *L, const blame *b) {
  unsigned line = 0;
  const char *keys[2] = {b->key_a, b->key_b};
  for (int i = 0; i < 2; i++) {
    if (!keys[i]) continue;
    const config_key *k = ckv_cfg_find_key(b->tenant ? SEC_TENANT : SEC_DAEMON, keys[i]);
    if (!k && !b->tenant) k = ckv_cfg_find_key(SEC_POLICY, keys[i]);
    if (!k) continue;
    unsigned l = b->tenant
                     ? tenant_lines(L, (size_t)(b->tenant - L->c->tenants))[ckv_cfg_key_index(k)]
                     : L->lines[ckv_cfg_key_index(k)];
    if (l > line) line = l;
  }
  if (line == 0 && b->tenant) line = tenant_lines(L, (size_t)(b->tenant - L->c->tenants))[N_KEYS];
  return line ? line : L->line;
}

/* libinih's run-time options (Debian's build has them; upstream's are
 * compile-time only, and its defaults then apply: 200-byte lines, ';'
 * comments cut even inside quotes). */
static void set_inih_options(void) {
#ifdef CKV_HAVE_INIH_RUNTIME_OPTIONS
  ini_allow_inline_comments = false; /* parse_value knows quotes; inih does not */
  ini_allow_multiline = false;
  ini_allow_no_value = false;
  ini_use_stack = false; /* so that the line buffer may be CONFIG_LINE_MAX */
  ini_allow_realloc = false;
  ini_max_line = CONFIG_LINE_MAX;
  ini_initial_alloc = CONFIG_LINE_MAX;
#endif
}

int ckv_config_load_string(ckv_config *c, const char *text, const char *name, char *err,
                           size_t errlen) {
  if (err && errlen) err[0] = '\0';
  loader L = {.c = c, .name = name ? name : "<config>", .next = text, .err = err, .errlen = errlen};
  L.lines = calloc(N_KEYS, sizeof *L.lines);
  if (!L.lines) return -ENOMEM;
  /* Tenants already in *c (from ckv_config_set) get line records too. */
  L.tlines_cap = c->n_tenants + 8;
  L.tlines = calloc(L.tlines_cap * (N_KEYS + 1), sizeof *L.tlines);
  if (!L.tlines) {
    free(L.lines);
    return -ENOMEM;
  }
  /* Skip a UTF-8 byte order mark, as inih would. */
  if (strncmp(L.next, "\xEF\xBB\xBF", 3) == 0) L.next += 3;
  set_inih_options();
  int bad_line = ini_parse_stream(next_line, &L, on_pair, &L);
  int r = L.status;
  if (r == CKV_OK && bad_line == -2) r = -ENOMEM;
  else if (r == CKV_OK && bad_line != 0) /* what inih refuses itself: a line without '=' */
    r = lerr(&L, (unsigned)bad_line, "expected 'key = value' or '[section]'");
  if (r == CKV_OK) {
    blame b;
    char why[512];
    if (check_all(c, &b, why, sizeof why) < 0) r = lerr(&L, blame_line(&L, &b), "%s", why);
  }
  free(L.lines);
  free(L.tlines);
  if (r == -ENOMEM) ckv_cfg_seterr(err, errlen, "%s: out of memory", L.name);
  return r;
}

#define CONFIG_FILE_MAX (1 << 20)

/* "is a FIFO" and the like for a file type that is not a regular file. */
static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

/* The whole file, NUL-terminated, in *ret_text (malloc'd).  Only a regular
 * file is read: it is opened without blocking (a FIFO would wait for a
 * writer forever: --check-config would hang, and so would the daemon's loop
 * on SIGHUP) and refused by its type before a byte is read. */
static int read_config_file(const char *path, char **ret_text, size_t *ret_len, char *err,
                            size_t errlen) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    ckv_cfg_seterr(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    ckv_cfg_seterr(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    ckv_cfg_seterr(err, errlen, "%s: is %s, not a regular file", path, file_kind(st.st_mode));
    return CKV_ERR_INVALID;
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    int e = errno;
    close(fd);
    ckv_cfg_seterr(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  char *text = malloc(CONFIG_FILE_MAX + 1);
  if (!text) {
    fclose(f);
    ckv_cfg_seterr(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  size_t n = fread(text, 1, CONFIG_FILE_MAX + 1, f);
  int rerr = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (rerr || n > CONFIG_FILE_MAX) {
    free(text);
    if (rerr) {
      ckv_cfg_seterr(err, errlen, "%s: read error: %s", path, strerror(rerr));
      return -rerr;
    }
    ckv_cfg_seterr(err, errlen, "%s: larger than %d bytes", path, CONFIG_FILE_MAX);
    return CKV_ERR_INVALID;
  }
  text[n] = '\0';
  *ret_text = text;
  *ret_len = n;
  return CKV_OK;
}

int ckv_config_load_file(ckv_config *c, const char *path, char *err, size_t errlen) {
  char *text = NULL;
  size_t n = 0;
  int r = read_config_file(path, &text, &n, err, errlen);
  if (r < 0) return r;
  if (memchr(text, '\0', n)) {
    unsigned line = 1;
    for (const char *q = text; *q; q++) line += *q == '\n';
    ckv_cfg_seterr(err, errlen, "%s:%u: NUL byte in file", path, line);
    r = CKV_ERR_INVALID;
  } else {
    r = ckv_config_load_string(c, text, path, err, errlen);
  }
  free(text);
  return r;
}

int ckv_config_set(ckv_config *c, const char *section, const char *key, const char *value,
                   char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!section || !key || !value) {
    ckv_cfg_seterr(err, errlen, "missing section, key or value");
    return CKV_ERR_INVALID;
  }
  section_kind sec;
  void *base;
  if (strcmp(section, "daemon") == 0) {
    sec = SEC_DAEMON;
    base = c;
  } else if (strcmp(section, "policy") == 0) {
    sec = SEC_POLICY;
    base = c;
  } else if (strncmp(section, "tenant.", 7) == 0 && ckv_cfg_valid_tenant_name(section + 7)) {
    sec = SEC_TENANT;
    base = NULL; /* found or created once the key is known to exist */
  } else {
    ckv_cfg_seterr(err, errlen, "unknown section [%s]", section);
    return CKV_ERR_INVALID;
  }
  const config_key *k = ckv_cfg_find_key(sec, key);
  if (!k) {
    ckv_cfg_seterr(err, errlen, "unknown key '%s' in [%s]", key, section);
    return CKV_ERR_INVALID;
  }
  if (sec == SEC_TENANT) {
    base = ckv_cfg_find_tenant(c, section + 7);
    if (!base) {
      int r = 0;
      base = ckv_cfg_add_tenant(c, section + 7, &r);
      if (!base) {
        ckv_cfg_seterr(err, errlen, r == -ENOMEM ? "out of memory" : "too many tenants");
        return r;
      }
    }
  }
  char why[512] = "";
  if (ckv_cfg_set_value(k, base, value, why, sizeof why) < 0) {
    ckv_cfg_seterr(err, errlen, "bad value for '%s' in [%s]: %s", key, section, why);
    return CKV_ERR_INVALID;
  }
  return CKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                    */
static void write_key_value(FILE *out, const config_key *k, const void *base, const char *prefix) {
  char buf[CKV_TENANT_MAX_IDS * 12 + CKV_CONFIG_PATH_MAX];
  ckv_cfg_format_value(k, base, buf, sizeof buf);
  fprintf(out, "%s%s = ", prefix, k->key);
  if (k->type == T_STRING || buf[0] == '\0') /* "" reads better than a dangling '=' */
    ckv_cfg_write_quoted(out, buf);
  else
    fputs(buf, out);
  fputc('\n', out);
}

static void write_section(FILE *out, section_kind sec, const void *base) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (ckv_cfg_keys[i].section == sec) write_key_value(out, &ckv_cfg_keys[i], base, "");
}

int ckv_config_write(const ckv_config *c, FILE *out) {
  fprintf(out, "# commitkvd effective configuration\n\n[daemon]\n");
  write_section(out, SEC_DAEMON, c);
  fprintf(out, "\n[policy]\n");
  write_section(out, SEC_POLICY, c);
  for (size_t i = 0; i < c->n_tenants; i++) {
    fprintf(out, "\n[tenant.%s]\n", c->tenants[i].name);
    write_section(out, SEC_TENANT, &c->tenants[i]);
  }
  return ckv_cfg_finish(out);
}

/* ------------------------------------------------------------------------ */
/* Reload                                                                     */

void ckv_config_apply_reload(ckv_config *live, const ckv_config *fresh) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &ckv_cfg_keys[i];
    if (!k->reload) continue;
    if (k->section != SEC_TENANT) {
      ckv_cfg_copy_field(k, live, fresh);
      continue;
    }
    for (size_t t = 0; t < live->n_tenants; t++) {
      const ckv_tenant_config *ft = ckv_cfg_find_tenant(fresh, live->tenants[t].name);
      if (ft) ckv_cfg_copy_field(k, &live->tenants[t], ft);
    }
  }
}

typedef struct diff_out {
  char *buf;
  size_t len, used;
  int count;
} diff_out;

static void diff_add(diff_out *d, const char *fmt, ...) CKV_PRINTF_FMT(2, 3);
static void diff_add(diff_out *d, const char *fmt, ...) {
  if (d->buf && d->len > 0 && d->used < d->len) {
    if (d->count > 0) {
      int w = snprintf(d->buf + d->used, d->len - d->used, ", ");
      if (w > 0) d->used = d->used + (size_t)w < d->len ? d->used + (size_t)w : d->len - 1;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(d->buf + d->used, d->len - d->used, fmt, ap);
    va_end(ap);
    if (w > 0) d->used = d->used + (size_t)w < d->len ? d->used + (size_t)w : d->len - 1;
  }
  d->count++;
}

int ckv_config_reload_changes(const ckv_config *live, const ckv_config *fresh,
                              ckv_config_change_fn fn, void *ctx) {
  int count = 0;
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &ckv_cfg_keys[i];
    if (k->reload || k->section == SEC_TENANT) continue;
    if (ckv_cfg_field_equal(k, live, fresh)) continue;
    count++;
    if (fn) fn(ctx, ckv_cfg_section_names[k->section], k->key, NULL);
  }
  char section[8 + CKV_TENANT_NAME_MAX];
  for (size_t t = 0; t < live->n_tenants; t++) {
    const ckv_tenant_config *lt = &live->tenants[t];
    const ckv_tenant_config *ft = ckv_cfg_find_tenant(fresh, lt->name);
    snprintf(section, sizeof section, "tenant.%s", lt->name);
    if (!ft) {
      count++;
      if (fn) fn(ctx, section, NULL, "removed");
      continue;
    }
    for (size_t i = 0; i < N_KEYS; i++) {
      const config_key *k = &ckv_cfg_keys[i];
      if (k->section != SEC_TENANT || k->reload || ckv_cfg_field_equal(k, lt, ft)) continue;
      count++;
      if (fn) fn(ctx, section, k->key, NULL);
    }
  }
  for (size_t t = 0; t < fresh->n_tenants; t++) {
    if (ckv_cfg_find_tenant(live, fresh->tenants[t].name)) continue;
    count++;
    snprintf(section, sizeof section, "tenant.%s", fresh->tenants[t].name);
    if (fn) fn(ctx, section, NULL, "added");
  }
  return count;
}

/* "memory, tenant.alice.uids, tenant.bob (removed)": [daemon] keys bare. */
static void diff_text(void *ctx, const char *section, const char *key, const char *note) {
  diff_out *d = ctx;
  if (!key)
    diff_add(d, "%s (%s)", section, note);
  else if (strncmp(section, "tenant.", 7) == 0)
    diff_add(d, "%s.%s", section, key);
  else
    diff_add(d, "%s", key);
}

int ckv_config_reload_diff(const ckv_config *live, const ckv_config *fresh, char *buf,
                           size_t buflen) {
  diff_out d = {.buf = buf, .len = buflen};
  if (buf && buflen) buf[0] = '\0';
  ckv_config_reload_changes(live, fresh, diff_text, &d);
  return d.count;
}

/* The config keeps doubles (printed back exactly by --check-config); the
 * judge runs on floats. */
#define TO_FLOAT(v) ((float)(v))
#define TO_U32(v) (v)
#define TO_BITS(v) (v)
#define TO_BOOL(v) ((v) ? 1 : 0)
#define COPY_PARAM_(key, field, kind_, ...) ret->field = TO_##kind_(p->key);

void ckv_config_judge_params(const ckv_policy_params *p, ckv_judge_params *ret) {
  ckv_judge_params_init(ret);
  ret->policy = p->default_policy;
  CKV_JUDGE_PARAM_LIST(COPY_PARAM_)
  if (ret->history_rounds > CKV_ATTN_HISTORY) ret->history_rounds = CKV_ATTN_HISTORY;
}
