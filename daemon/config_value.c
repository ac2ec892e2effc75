/* daemon/config_value.c - one configuration value: text to field and back.
 *
 * Sizes ("4G"), durations ("250ms"), integers, numbers, booleans, enums, and
 * the lists (uids, gids, policies) are read here with the bounds of their
 * row in the key table (config_table.h), and printed back in the file's own
 * syntax, so what --check-config prints loads to the same values. */
#include "daemon/config_table.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "commitkv/status.h"

void ckv_cfg_seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Numbers, sizes, durations                                                 */

/* Digits only (no sign, no space, no 0x): strtoull alone accepts "-1". */
int ckv_cfg_parse_digits(const char *s, const char **end, uint64_t *ret) {
  if (!isdigit((unsigned char)*s)) return CKV_ERR_INVALID;
  uint64_t v = 0;
  for (; isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return CKV_ERR_RANGE;
    v = v * 10 + d;
  }
  *end = s;
  *ret = v;
  return CKV_OK;
}

static int mul_checked(uint64_t a, uint64_t b, uint64_t *ret) {
  if (b != 0 && a > UINT64_MAX / b) return CKV_ERR_RANGE;
  *ret = a * b;
  return CKV_OK;
}

int ckv_parse_size(const char *text, uint64_t *ret_bytes) {
  if (!text) return CKV_ERR_INVALID;
  const char *p;
  uint64_t v;
  int r = ckv_cfg_parse_digits(text, &p, &v);
  if (r < 0) return r;
  uint64_t mult = 1;
  switch (toupper((unsigned char)*p)) {
    case 'K': mult = KIB; p++; break;
    case 'M': mult = MIB; p++; break;
    case 'G': mult = GIB; p++; break;
    case 'T': mult = TIB; p++; break;
    case 'P': mult = PIB; p++; break;
    default: break;
  }
  if (mult != 1 && (p[0] == 'i' || p[0] == 'I') && (p[1] == 'B' || p[1] == 'b'))
    p += 2;
  else if (*p == 'B' || *p == 'b')
    p++;
  if (*p != '\0') return CKV_ERR_INVALID;
  uint64_t bytes;
  r = mul_checked(v, mult, &bytes);
  if (r < 0) return r;
  *ret_bytes = bytes;
  return CKV_OK;
}

static const struct {
  const char *suffix;
  uint64_t ms;
} duration_units[] = {{"ms", 1}, {"s", SEC}, {"m", 60 * SEC}, {"h", 3600 * SEC}, {"d", DAY}};

int ckv_parse_duration_ms(const char *text, uint64_t *ret_ms) {
  if (!text) return CKV_ERR_INVALID;
  const char *p;
  uint64_t v;
  int r = ckv_cfg_parse_digits(text, &p, &v);
  if (r < 0) return r;
  if (*p == '\0') {
    if (v != 0) return CKV_ERR_INVALID; /* "500": ms or s?  Say it. */
    *ret_ms = 0;
    return CKV_OK;
  }
  for (size_t i = 0; i < sizeof duration_units / sizeof duration_units[0]; i++) {
    if (strcmp(p, duration_units[i].suffix) == 0) {
      uint64_t ms;
      r = mul_checked(v, duration_units[i].ms, &ms);
      if (r < 0) return r;
      *ret_ms = ms;
      return CKV_OK;
    }
  }
  return CKV_ERR_INVALID;
}

void ckv_format_size(uint64_t bytes, char *buf, size_t len) {
  static const char units[] = "KMGTP";
  int u = -1;
  while (bytes != 0 && u < 4 && bytes % 1024 == 0) {
    bytes /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(buf, len, "%" PRIu64, bytes);
  else
    snprintf(buf, len, "%" PRIu64 "%c", bytes, units[u]);
}

void ckv_format_duration_ms(uint64_t ms, char *buf, size_t len) {
  if (ms == 0) {
    snprintf(buf, len, "0");
    return;
  }
  for (size_t i = sizeof duration_units / sizeof duration_units[0]; i-- > 0;) {
    if (ms % duration_units[i].ms == 0) {
      snprintf(buf, len, "%" PRIu64 "%s", ms / duration_units[i].ms, duration_units[i].suffix);
      return;
    }
  }
}

/* Shortest text that strtod reads back to the same double. */
static void format_double(double v, char *buf, size_t len) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

/* ------------------------------------------------------------------------ */
/* Reading one value into its field                                           */

static bool is_list_sep(char ch) { return ch == ',' || isspace((unsigned char)ch); }

/* Splits a list value into items; calls fn for each.  Empty list: no call. */
static int for_each_item(const char *value, int (*fn)(const char *item, void *ctx), void *ctx) {
  const char *p = value;
  char item[256];
  for (;;) {
    while (*p && is_list_sep(*p)) p++;
    if (!*p) return CKV_OK;
    size_t n = 0;
    while (p[n] && !is_list_sep(p[n])) n++;
    if (n >= sizeof item) return CKV_ERR_INVALID;
    memcpy(item, p, n);
    item[n] = '\0';
    p += n;
    int r = fn(item, ctx);
    if (r < 0) return r;
  }
}

typedef struct id_list_ctx {
  bool groups;
  uint32_t ids[CKV_TENANT_MAX_IDS];
  size_t n;
  char *err;
  size_t errlen;
} id_list_ctx;

static int add_id(const char *item, void *vctx) {
  id_list_ctx *x = vctx;
  uint64_t id;
  const char *end;
  if (isdigit((unsigned char)item[0])) {
    int r = ckv_cfg_parse_digits(item, &end, &id);
    if (r < 0 || *end != '\0' || id >= UINT32_MAX) { /* (uid_t)-1 means "none" */
      ckv_cfg_seterr(x->err, x->errlen, "'%s' is not a valid %s", item, x->groups ? "gid" : "uid");
      return CKV_ERR_INVALID;
    }
  } else {
    /* A name: resolved once, now; the daemon matches numbers at attach time. */
    char buf[4096];
    int r;
    bool found = false;
    if (x->groups) {
      struct group gr, *res = NULL;
      r = getgrnam_r(item, &gr, buf, sizeof buf, &res);
      if (r == 0 && res) {
        id = res->gr_gid;
        found = true;
      }
    } else {
      struct passwd pw, *res = NULL;
      r = getpwnam_r(item, &pw, buf, sizeof buf, &res);
      if (r == 0 && res) {
        id = res->pw_uid;
        found = true;
      }
    }
    if (!found) {
      /* getpwnam_r returns 0 (or ENOENT on some libcs) for a missing name. */
      if (r != 0 && r != ENOENT && r != ESRCH)
        ckv_cfg_seterr(x->err, x->errlen, "cannot look up %s '%s': %s", x->groups ? "group" : "user",
               item, strerror(r));
      else
        ckv_cfg_seterr(x->err, x->errlen, "unknown %s '%s'", x->groups ? "group" : "user", item);
      return CKV_ERR_INVALID;
    }
  }
  for (size_t i = 0; i < x->n; i++) {
    if (x->ids[i] == (uint32_t)id) {
      ckv_cfg_seterr(x->err, x->errlen, "%s %" PRIu64 " listed twice", x->groups ? "gid" : "uid", id);
      return CKV_ERR_INVALID;
    }
  }
  if (x->n >= CKV_TENANT_MAX_IDS) {
    ckv_cfg_seterr(x->err, x->errlen, "more than %d %s", CKV_TENANT_MAX_IDS, x->groups ? "gids" : "uids");
    return CKV_ERR_INVALID;
  }
  x->ids[x->n++] = (uint32_t)id;
  return CKV_OK;
}

typedef struct policy_list_ctx {
  uint32_t mask;
  char *err;
  size_t errlen;
} policy_list_ctx;

static int add_policy(const char *item, void *vctx) {
  policy_list_ctx *x = vctx;
  if (strcmp(item, "all") == 0) {
    x->mask = CKV_POLICY_ALL_MASK;
    return CKV_OK;
  }
  int p = ckv_policy_from_name(item);
  if (p < 0) {
    ckv_cfg_seterr(x->err, x->errlen, "unknown policy '%s' (fp16, int8, kivi4, kivi2, h2o, streaming, "
           "commitkv or all)", item);
    return CKV_ERR_INVALID;
  }
  x->mask |= UINT32_C(1) << p;
  return CKV_OK;
}

void ckv_cfg_range_text(const config_key *k, char *buf, size_t len) {
  char a[32], b[32];
  switch (k->type) {
    case T_U32:
    case T_U64:
      snprintf(buf, len, "%" PRIu64 "..%" PRIu64, k->imin, k->imax);
      return;
    case T_SIZE:
      ckv_format_size(k->imin, a, sizeof a);
      ckv_format_size(k->imax, b, sizeof b);
      snprintf(buf, len, "%s..%s", a, b);
      return;
    case T_DURATION:
      ckv_format_duration_ms(k->imin, a, sizeof a);
      ckv_format_duration_ms(k->imax, b, sizeof b);
      snprintf(buf, len, "%s..%s", a, b);
      return;
    case T_DOUBLE:
      format_double(k->dmin, a, sizeof a);
      format_double(k->dmax, b, sizeof b);
      snprintf(buf, len, "%s..%s", a, b);
      return;
    case T_ENUM: {
      size_t n = 0;
      buf[0] = '\0';
      for (const enum_entry *e = k->enums; e->name && n < len; e++) {
        int w = snprintf(buf + n, len - n, "%s%s", e == k->enums ? "" : "|", e->name);
        if (w < 0) break;
        n += (size_t)w;
      }
      return;
    }
    case T_BOOL: snprintf(buf, len, "yes|no"); return;
    case T_UIDS: snprintf(buf, len, "up to %d users", CKV_TENANT_MAX_IDS); return;
    case T_GIDS: snprintf(buf, len, "up to %d groups", CKV_TENANT_MAX_IDS); return;
    case T_POLICIES: snprintf(buf, len, "policy names|all"); return;
    case T_STRING: snprintf(buf, len, "up to %zu bytes", k->size - 1); return;
  }
  buf[0] = '\0';
}

static int out_of_range(const config_key *k, const char *value, char *err, size_t errlen) {
  char r[96];
  ckv_cfg_range_text(k, r, sizeof r);
  ckv_cfg_seterr(err, errlen, "'%s' is out of range (allowed %s)", value, r);
  return CKV_ERR_RANGE;
}

/* Parses `value` per the row and stores it at base + offset.  On error the
 * field is unchanged and err holds the reason (without file/key). */
int ckv_cfg_set_value(const config_key *k, void *base, const char *value, char *err,
                     size_t errlen) {
  char *field = (char *)base + k->offset;
  uint64_t u;
  int r;
  switch (k->type) {
    case T_STRING: {
      size_t len = strlen(value);
      if (len >= k->size) {
        ckv_cfg_seterr(err, errlen, "longer than %zu bytes", k->size - 1);
        return CKV_ERR_INVALID;
      }
      for (size_t i = 0; i < len; i++) {
        if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f) {
          ckv_cfg_seterr(err, errlen, "control character in value");
          return CKV_ERR_INVALID;
        }
      }
      if (len > 0 && k->check && k->check(value, err, errlen) < 0) return CKV_ERR_INVALID;
      memset(field, 0, k->size); /* whole field: writes and compares stay deterministic */
      memcpy(field, value, len);
      return CKV_OK;
    }
    case T_BOOL: {
      static const char *const yes[] = {"yes", "true", "on", "1"};
      static const char *const no[] = {"no", "false", "off", "0"};
      for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(value, yes[i]) == 0) {
          *(bool *)field = true;
          return CKV_OK;
        }
        if (strcasecmp(value, no[i]) == 0) {
          *(bool *)field = false;
          return CKV_OK;
        }
      }
      ckv_cfg_seterr(err, errlen, "'%s' is not a boolean (yes or no)", value);
      return CKV_ERR_INVALID;
    }
    case T_U32:
    case T_U64: {
      const char *end;
      r = ckv_cfg_parse_digits(value, &end, &u);
      if (r == CKV_OK && *end != '\0') r = CKV_ERR_INVALID;
      if (r == CKV_ERR_INVALID) {
        ckv_cfg_seterr(err, errlen, "'%s' is not a non-negative integer", value);
        return r;
      }
      if (r == CKV_ERR_RANGE || u < k->imin || u > k->imax)
        return out_of_range(k, value, err, errlen);
      if (k->type == T_U32)
        *(uint32_t *)field = (uint32_t)u;
      else
        *(uint64_t *)field = u;
      return CKV_OK;
    }
    case T_SIZE:
      r = ckv_parse_size(value, &u);
      if (r == CKV_ERR_INVALID) {
        ckv_cfg_seterr(err, errlen, "'%s' is not a size (a number with an optional K, M, G, T or P suffix)",
               value);
        return r;
      }
      if (r == CKV_ERR_RANGE || u < k->imin || u > k->imax)
        return out_of_range(k, value, err, errlen);
      *(uint64_t *)field = u;
      return CKV_OK;
    case T_DURATION:
      r = ckv_parse_duration_ms(value, &u);
      if (r == CKV_ERR_INVALID) {
        ckv_cfg_seterr(err, errlen, "'%s' is not a duration (a number with ms, s, m, h or d)", value);
        return r;
      }
      if (r == CKV_ERR_RANGE || u < k->imin || u > k->imax)
        return out_of_range(k, value, err, errlen);
      *(uint64_t *)field = u;
      return CKV_OK;
    case T_DOUBLE: {
      char *end = NULL;
      /* strtod takes "inf", "nan", hex and leading spaces: accept only decimal text. */
      if (!*value || strspn(value, "0123456789.eE+-") != strlen(value)) {
        ckv_cfg_seterr(err, errlen, "'%s' is not a number", value);
        return CKV_ERR_INVALID;
      }
      errno = 0;
      double d = strtod(value, &end);
      if (*end != '\0' || end == value) {
        ckv_cfg_seterr(err, errlen, "'%s' is not a number", value);
        return CKV_ERR_INVALID;
      }
      if (errno == ERANGE || !isfinite(d) || d < k->dmin || d > k->dmax)
        return out_of_range(k, value, err, errlen);
      *(double *)field = d;
      return CKV_OK;
    }
    case T_ENUM:
      for (const enum_entry *e = k->enums; e->name; e++) {
        if (strcmp(value, e->name) == 0) {
          *(int *)field = e->value;
          return CKV_OK;
        }
      }
      {
        char r2[128];
        ckv_cfg_range_text(k, r2, sizeof r2);
        ckv_cfg_seterr(err, errlen, "'%s' is not one of %s", value, r2);
      }
      return CKV_ERR_INVALID;
    case T_UIDS:
    case T_GIDS: {
      id_list_ctx x = {.groups = k->type == T_GIDS, .err = err, .errlen = errlen};
      r = for_each_item(value, add_id, &x);
      if (r < 0) {
        if (err && errlen && !err[0]) ckv_cfg_seterr(err, errlen, "bad list '%s'", value);
        return CKV_ERR_INVALID;
      }
      memset(field, 0, k->size);
      memcpy(field, x.ids, x.n * sizeof x.ids[0]);
      *(size_t *)((char *)base + k->offset2) = x.n;
      return CKV_OK;
    }
    case T_POLICIES: {
      policy_list_ctx x = {.mask = 0, .err = err, .errlen = errlen};
      r = for_each_item(value, add_policy, &x);
      if (r < 0) {
        if (err && errlen && !err[0]) ckv_cfg_seterr(err, errlen, "bad list '%s'", value);
        return CKV_ERR_INVALID;
      }
      if (x.mask == 0) {
        ckv_cfg_seterr(err, errlen, "at least one policy is needed");
        return CKV_ERR_INVALID;
      }
      *(uint32_t *)field = x.mask;
      return CKV_OK;
    }
  }
  return CKV_ERR_INTERNAL;
}

/* Text of a field as the file would hold it (unquoted). */
void ckv_cfg_format_value(const config_key *k, const void *base, char *buf, size_t len) {
  const char *field = (const char *)base + k->offset;
  switch (k->type) {
    case T_STRING: snprintf(buf, len, "%s", field); return;
    case T_BOOL: snprintf(buf, len, "%s", *(const bool *)field ? "yes" : "no"); return;
    case T_U32: snprintf(buf, len, "%" PRIu32, *(const uint32_t *)field); return;
    case T_U64: snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field); return;
    case T_SIZE: ckv_format_size(*(const uint64_t *)field, buf, len); return;
    case T_DURATION: ckv_format_duration_ms(*(const uint64_t *)field, buf, len); return;
    case T_DOUBLE: format_double(*(const double *)field, buf, len); return;
    case T_ENUM:
      for (const enum_entry *e = k->enums; e->name; e++) {
        if (e->value == *(const int *)field) {
          snprintf(buf, len, "%s", e->name);
          return;
        }
      }
      snprintf(buf, len, "?");
      return;
    case T_UIDS:
    case T_GIDS: {
      size_t count = *(const size_t *)((const char *)base + k->offset2);
      const uint32_t *ids = (const uint32_t *)field;
      size_t n = 0;
      buf[0] = '\0';
      for (size_t i = 0; i < count && n < len; i++) {
        int w = snprintf(buf + n, len - n, "%s%" PRIu32, i ? ", " : "", ids[i]);
        if (w < 0) break;
        n += (size_t)w;
      }
      return;
    }
    case T_POLICIES: {
      uint32_t mask = *(const uint32_t *)field;
      if (mask == CKV_POLICY_ALL_MASK) {
        snprintf(buf, len, "all");
        return;
      }
      size_t n = 0;
      buf[0] = '\0';
      for (int p = 0; p < CKV_POLICY_COUNT && n < len; p++) {
        if (!(mask & (UINT32_C(1) << p))) continue;
        int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", ckv_policy_names[p]);
        if (w < 0) break;
        n += (size_t)w;
      }
      return;
    }
  }
  buf[0] = '\0';
}

bool ckv_cfg_field_equal(const config_key *k, const void *a, const void *b) {
  const char *fa = (const char *)a + k->offset, *fb = (const char *)b + k->offset;
  if (k->type == T_STRING) return strcmp(fa, fb) == 0;
  if (k->type == T_UIDS || k->type == T_GIDS) {
    size_t na = *(const size_t *)((const char *)a + k->offset2);
    size_t nb = *(const size_t *)((const char *)b + k->offset2);
    return na == nb && memcmp(fa, fb, na * sizeof(uint32_t)) == 0;
  }
  return memcmp(fa, fb, k->size) == 0;
}

void ckv_cfg_copy_field(const config_key *k, void *dst, const void *src) {
  memcpy((char *)dst + k->offset, (const char *)src + k->offset, k->size);
  if (k->type == T_UIDS || k->type == T_GIDS)
    memcpy((char *)dst + k->offset2, (const char *)src + k->offset2, sizeof(size_t));
}

/* ------------------------------------------------------------------------ */
/* Defaults                                                                   */

void ckv_cfg_apply_defaults(section_kind sec, void *base) {
  for (size_t i = 0; i < N_KEYS; i++) {
    if (ckv_cfg_keys[i].section != sec) continue;
    char err[256];
    if (ckv_cfg_set_value(&ckv_cfg_keys[i], base, ckv_cfg_keys[i].def, err, sizeof err) < 0) {
      /* A default that does not parse is a bug in the table (a test loads them all). */
      fprintf(stderr, "commitkvd: bad default for %s: %s\n", ckv_cfg_keys[i].key, err);
      abort();
    }
  }
}

