/* mlp.c - the learned transition judge (see mlp.h): loading, validating,
 * saving and evaluating a two-layer perceptron.
 *
 * Model: z = (f - mean) / std (per feature), h = ReLU(W1 z + b1) with
 * `hidden` units, logits = W2 h + b2 over 4 classes (no change, staged,
 * committed, recycled), answer = argmax, ties to the lowest class.
 *
 * Weight file, version 1 (text: diffable, hand-editable, reviewable):
 *
 *   commitkv-mlp 1 <n_features> <hidden>
 *   # any number of comment lines; '#' starts a comment anywhere
 *   mean  <n_features numbers>
 *   std   <n_features numbers, each > 0>
 *   w1    <hidden * n_features numbers, row h = weights of hidden unit h>
 *   b1    <hidden numbers>
 *   w2    <4 * hidden numbers, row c = weights of class c>
 *   b2    <4 numbers>
 *   end
 *
 * Numbers are C floats (strtof syntax), separated by any whitespace, so a
 * section may span lines.  The first non-comment line must be the header;
 * sections come in exactly this order, each with exactly its count, and
 * nothing but comments may follow `end`.  n_features must equal
 * CKV_JUDGE_FEATURES of this build (the feature vector is documented in
 * lifecycle/judge.c; changing it means a new version).  The loader refuses
 * rather than guesses: a wrong magic, version, feature count or hidden size is
 * CKV_ERR_FORMAT (a file for another build or not ours); anything wrong after
 * a valid header (truncation, a missing `end`, a bad token, NaN, infinity,
 * std <= 0, trailing data) is CKV_ERR_CORRUPT.  The file is at most
 * CKV_MLP_MAX_FILE bytes.  No checksum: the exact counts plus the `end`
 * trailer catch truncation, strict number parsing catches garbage, and the
 * file stays editable by hand.  ckv_mlp_save writes it atomically. */
#include "lifecycle/mlp.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "lifecycle/judge_params.h"
#include "lifecycle/tokens.h"

#define NF CKV_JUDGE_FEATURES
#define NC CKV_MLP_CLASSES
#define CKV_MLP_MAX_FILE (4u << 20) /* 256 hidden units at ~20 bytes a number fit 30 times over */

_Static_assert(CKV_STATE_STAGED == 1 && CKV_STATE_COMMITTED == 2 && CKV_STATE_RECYCLED == 3,
               "class index k > 0 is the CKV_STATE_* it proposes");

struct ckv_mlp {
  uint32_t hidden;
  float mean[NF], std[NF], inv_std[NF];
  float b2[NC];
  float *w1, *b1, *w2; /* point into data[] */
  float data[];        /* w1 [hidden][NF], b1 [hidden], w2 [NC][hidden] */
};

static ckv_mlp *mlp_alloc(uint32_t hidden) {
  size_t n = (size_t)hidden * NF + hidden + (size_t)NC * hidden;
  ckv_mlp *m = calloc(1, sizeof(*m) + n * sizeof(float));
  if (!m) return NULL;
  m->hidden = hidden;
  m->w1 = m->data;
  m->b1 = m->w1 + (size_t)hidden * NF;
  m->w2 = m->b1 + hidden;
  return m;
}

ckv_mlp *ckv_mlp_free(ckv_mlp *m) {
  free(m);
  return NULL;
}

uint32_t ckv_mlp_hidden(const ckv_mlp *m) { return m->hidden; }

static void finish(ckv_mlp *m) {
  for (int i = 0; i < NF; i++) m->inv_std[i] = 1.f / m->std[i];
}

void ckv_mlp_logits(const ckv_mlp *m, const float *f, float out[NC]) {
  float z[NF];
  for (int i = 0; i < NF; i++) z[i] = (f[i] - m->mean[i]) * m->inv_std[i];
  for (int c = 0; c < NC; c++) out[c] = m->b2[c];
  for (uint32_t h = 0; h < m->hidden; h++) {
    const float *w = m->w1 + (size_t)h * NF;
    float a = m->b1[h];
    for (int i = 0; i < NF; i++) a += w[i] * z[i];
    if (!(a > 0.f)) continue; /* ReLU (also drops NaN: callers check features first) */
    for (int c = 0; c < NC; c++) out[c] += m->w2[(size_t)c * m->hidden + h] * a;
  }
}

int ckv_mlp_class(const ckv_mlp *m, const float *f) {
  for (int i = 0; i < NF; i++)
    if (!isfinite(f[i])) return 0;
  float l[NC];
  ckv_mlp_logits(m, f, l);
  for (int c = 0; c < NC; c++)
    if (!isfinite(l[c])) return 0;
  int best = 0;
  for (int c = 1; c < NC; c++)
    if (l[c] > l[best]) best = c; /* strict: a tie keeps the lower class */
  return best;
}

int ckv_mlp_decide(const ckv_mlp *m, const float *features) {
  int c = ckv_mlp_class(m, features);
  return c == 0 ? -1 : c;
}

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int check_values(const char *what, const float *v, size_t n, int positive, char *err, size_t errlen,
                        const char *path) {
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(v[i])) {
      seterr(err, errlen, "%s: %s[%zu] is not a finite number", path, what, i);
      return CKV_ERR_CORRUPT;
    }
    if (positive && !(v[i] > 0.f)) {
      seterr(err, errlen, "%s: %s[%zu] = %g must be > 0", path, what, i, (double)v[i]);
      return CKV_ERR_CORRUPT;
    }
  }
  return CKV_OK;
}

int ckv_mlp_new(const ckv_mlp_spec *s, ckv_mlp **ret, char *err, size_t errlen) {
  if (s->hidden < 1 || s->hidden > CKV_MLP_MAX_HIDDEN) {
    seterr(err, errlen, "hidden size %u not in [1, %u]", s->hidden, CKV_MLP_MAX_HIDDEN);
    return CKV_ERR_FORMAT;
  }
  const size_t H = s->hidden;
  int r;
  if ((r = check_values("mean", s->mean, NF, 0, err, errlen, "weights")) < 0 ||
      (r = check_values("std", s->std, NF, 1, err, errlen, "weights")) < 0 ||
      (r = check_values("w1", s->w1, H * NF, 0, err, errlen, "weights")) < 0 ||
      (r = check_values("b1", s->b1, H, 0, err, errlen, "weights")) < 0 ||
      (r = check_values("w2", s->w2, NC * H, 0, err, errlen, "weights")) < 0 ||
      (r = check_values("b2", s->b2, NC, 0, err, errlen, "weights")) < 0)
    return r;
  ckv_mlp *m = mlp_alloc(s->hidden);
  if (!m) return -ENOMEM;
  memcpy(m->mean, s->mean, sizeof(m->mean));
  memcpy(m->std, s->std, sizeof(m->std));
  memcpy(m->w1, s->w1, H * NF * sizeof(float));
  memcpy(m->b1, s->b1, H * sizeof(float));
  memcpy(m->w2, s->w2, NC * H * sizeof(float));
  memcpy(m->b2, s->b2, sizeof(m->b2));
  finish(m);
  *ret = m;
  return CKV_OK;
}

/* ---- the text reader: whitespace-separated tokens, '#' comments, line numbers ---- */

typedef struct lexer {
  char *p;   /* next unread byte (the buffer is NUL-terminated) */
  int line;  /* line of the token last returned */
  int next_line;
} lexer;

/* Next token, NUL-terminated in place, or NULL at the end of the buffer. */
static char *next_token(lexer *x) {
  for (;;) {
    while (*x->p == ' ' || *x->p == '\t' || *x->p == '\r' || *x->p == '\n') {
      if (*x->p == '\n') x->next_line++;
      x->p++;
    }
    if (*x->p == '#') {
      while (*x->p && *x->p != '\n') x->p++;
      continue;
    }
    break;
  }
  if (!*x->p) {
    x->line = x->next_line;
    return NULL;
  }
  char *t = x->p;
  while (*x->p && *x->p != ' ' && *x->p != '\t' && *x->p != '\r' && *x->p != '\n' && *x->p != '#') x->p++;
  x->line = x->next_line;
  if (*x->p == ' ' || *x->p == '\t' || *x->p == '\r') *x->p++ = '\0';
  else if (*x->p == '\n') {
    *x->p++ = '\0';
    x->next_line++;
  } else if (*x->p == '#') {
    /* a comment glued to a token: end the token, skip the comment */
    *x->p++ = '\0';
    while (*x->p && *x->p != '\n') x->p++;
  }
  return t;
}

/* The header's integer fields: plain decimal, no sign, no overflow. */
static int parse_uint(const char *s, unsigned long *ret) {
  if (!s || *s < '0' || *s > '9') return -1;
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end) return -1;
  *ret = v;
  return 0;
}

static int read_section(lexer *x, const char *path, const char *name, float *v, size_t n, char *err,
                        size_t errlen) {
  char *t = next_token(x);
  if (!t) {
    seterr(err, errlen, "%s: truncated: section '%s' missing at the end of the file (line %d)", path, name, x->line);
    return CKV_ERR_CORRUPT;
  }
  if (strcmp(t, name) != 0) {
    seterr(err, errlen, "%s: line %d: expected section '%s', found '%.40s'", path, x->line, name, t);
    return CKV_ERR_CORRUPT;
  }
  for (size_t i = 0; i < n; i++) {
    t = next_token(x);
    if (!t) {
      seterr(err, errlen, "%s: truncated: section '%s' has %zu of its %zu numbers", path, name, i, n);
      return CKV_ERR_CORRUPT;
    }
    char *end;
    errno = 0;
    float f = strtof(t, &end);
    if ((end == t || *end) && ((*t >= 'a' && *t <= 'z') || (*t >= 'A' && *t <= 'Z'))) {
      seterr(err, errlen, "%s: line %d: section '%s' has %zu of its %zu numbers, then '%.40s'", path, x->line, name, i,
             n, t);
      return CKV_ERR_CORRUPT;
    }
    if (end == t || *end) {
      seterr(err, errlen, "%s: line %d: %s[%zu]: '%.40s' is not a number (section has %zu numbers)", path, x->line,
             name, i, t, n);
      return CKV_ERR_CORRUPT;
    }
    if (!isfinite(f)) {
      seterr(err, errlen, "%s: line %d: %s[%zu] = '%.40s' is not a finite number", path, x->line, name, i, t);
      return CKV_ERR_CORRUPT;
    }
    v[i] = f;
  }
  return CKV_OK;
}

static int read_all(const char *path, char **ret, size_t *ret_len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    seterr(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    seterr(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    seterr(err, errlen, "%s: not a regular file", path);
    return CKV_ERR_FORMAT;
  }
  if ((uint64_t)st.st_size > CKV_MLP_MAX_FILE) {
    close(fd);
    seterr(err, errlen, "%s: %lld bytes, more than a weight file may hold (%u)", path, (long long)st.st_size,
           CKV_MLP_MAX_FILE);
    return CKV_ERR_FORMAT;
  }
  /* one byte more than stat said, to notice a file that grows under us */
  size_t cap = (size_t)st.st_size + 2, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return -ENOMEM;
  }
  while (n < cap - 1) {
    ssize_t k = read(fd, buf + n, cap - 1 - n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      close(fd);
      free(buf);
      seterr(err, errlen, "%s: %s", path, strerror(e));
      return -e;
    }
    if (k == 0) break;
    n += (size_t)k;
  }
  if (n > (size_t)st.st_size) {
    close(fd);
    free(buf);
    seterr(err, errlen, "%s: changed while being read", path);
    return CKV_ERR_CORRUPT;
  }
  close(fd);
  buf[n] = '\0';
  if (memchr(buf, '\0', n)) {
    free(buf);
    seterr(err, errlen, "%s: binary data (NUL byte) in a text weight file", path);
    return CKV_ERR_CORRUPT;
  }
  *ret = buf;
  *ret_len = n;
  return CKV_OK;
}

static int parse(char *buf, const char *path, ckv_mlp **ret, char *err, size_t errlen) {
  lexer x = {buf, 1, 1};
  char *magic = next_token(&x);
  if (!magic) {
    seterr(err, errlen, "%s: empty weight file (truncated?)", path);
    return CKV_ERR_CORRUPT;
  }
  if (strcmp(magic, CKV_MLP_MAGIC) != 0) {
    seterr(err, errlen, "%s: line %d: not an mlp weight file (expected '%s <version> <n_features> <hidden>', found '%.40s')",
           path, x.line, CKV_MLP_MAGIC, magic);
    return CKV_ERR_FORMAT;
  }
  int hline = x.line;
  unsigned long version, nf, hidden;
  char *t = next_token(&x);
  if (parse_uint(t, &version) < 0 || x.line != hline) {
    seterr(err, errlen, "%s: line %d: header needs '%s <version> <n_features> <hidden>'", path, hline, CKV_MLP_MAGIC);
    return CKV_ERR_FORMAT;
  }
  if (version != CKV_MLP_VERSION) {
    seterr(err, errlen, "%s: format version %lu, this build reads version %d", path, version, CKV_MLP_VERSION);
    return CKV_ERR_FORMAT;
  }
  t = next_token(&x);
  if (parse_uint(t, &nf) < 0 || x.line != hline) {
    seterr(err, errlen, "%s: line %d: header needs '%s <version> <n_features> <hidden>'", path, hline, CKV_MLP_MAGIC);
    return CKV_ERR_FORMAT;
  }
  if (nf != NF) {
    seterr(err, errlen, "%s: weights for %lu features, this build's judge has %d (retrain on a trace of this build)",
           path, nf, NF);
    return CKV_ERR_FORMAT;
  }
  t = next_token(&x);
  if (parse_uint(t, &hidden) < 0 || x.line != hline) {
    seterr(err, errlen, "%s: line %d: header needs '%s <version> <n_features> <hidden>'", path, hline, CKV_MLP_MAGIC);
    return CKV_ERR_FORMAT;
  }
  if (hidden < 1 || hidden > CKV_MLP_MAX_HIDDEN) {
    seterr(err, errlen, "%s: hidden size %lu not in [1, %u]", path, hidden, CKV_MLP_MAX_HIDDEN);
    return CKV_ERR_FORMAT;
  }
  ckv_mlp *m = mlp_alloc((uint32_t)hidden);
  if (!m) return -ENOMEM;
  const size_t H = hidden;
  int r;
  if ((r = read_section(&x, path, "mean", m->mean, NF, err, errlen)) < 0 ||
      (r = read_section(&x, path, "std", m->std, NF, err, errlen)) < 0 ||
      (r = read_section(&x, path, "w1", m->w1, H * NF, err, errlen)) < 0 ||
      (r = read_section(&x, path, "b1", m->b1, H, err, errlen)) < 0 ||
      (r = read_section(&x, path, "w2", m->w2, NC * H, err, errlen)) < 0 ||
      (r = read_section(&x, path, "b2", m->b2, NC, err, errlen)) < 0) {
    ckv_mlp_free(m);
    return r;
  }
  for (int i = 0; i < NF; i++) {
    if (!(m->std[i] > 0.f)) {
      seterr(err, errlen, "%s: std[%d] = %g: standard deviations must be > 0", path, i, (double)m->std[i]);
      ckv_mlp_free(m);
      return CKV_ERR_CORRUPT;
    }
  }
  t = next_token(&x);
  if (!t || strcmp(t, "end") != 0) {
    if (t)
      seterr(err, errlen, "%s: line %d: expected 'end' after b2, found '%.40s' (too many numbers?)", path, x.line, t);
    else
      seterr(err, errlen, "%s: truncated: no 'end' line after b2", path);
    ckv_mlp_free(m);
    return CKV_ERR_CORRUPT;
  }
  t = next_token(&x);
  if (t) {
    seterr(err, errlen, "%s: line %d: data after 'end': '%.40s'", path, x.line, t);
    ckv_mlp_free(m);
    return CKV_ERR_CORRUPT;
  }
  finish(m);
  *ret = m;
  return CKV_OK;
}

int ckv_mlp_load(const char *path, ckv_mlp **ret, char *err, size_t errlen) {
  char *buf = NULL;
  size_t len = 0;
  int r = read_all(path, &buf, &len, err, errlen);
  if (r < 0) return r;
  r = parse(buf, path, ret, err, errlen);
  free(buf);
  return r;
}

/* ---- writing ---- */

static void put_section(FILE *f, const char *name, const float *v, size_t n, size_t per_line) {
  fprintf(f, "%s\n", name);
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%.9g%s", (double)v[i], (i + 1) % per_line == 0 || i + 1 == n ? "\n" : " ");
}

int ckv_mlp_save(const ckv_mlp *m, const char *path, const char *comment) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 32);
  if (!tmp) return -ENOMEM;
  snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return -e;
  }
  FILE *f = fdopen(fd, "w");
  if (!f) {
    int e = errno;
    close(fd);
    unlink(tmp);
    free(tmp);
    return -e;
  }
  fprintf(f, "%s %d %d %u\n", CKV_MLP_MAGIC, CKV_MLP_VERSION, NF, m->hidden);
  if (comment) {
    const char *p = comment;
    while (*p) {
      const char *nl = strchr(p, '\n');
      size_t n = nl ? (size_t)(nl - p) : strlen(p);
      fprintf(f, "# %.*s\n", (int)n, p);
      p += n + (nl ? 1 : 0);
    }
  }
  fprintf(f, "# features: see lifecycle/judge.c (ckv_judge_features); classes: no-change staged committed recycled\n");
  put_section(f, "mean", m->mean, NF, NF);
  put_section(f, "std", m->std, NF, NF);
  put_section(f, "w1", m->w1, (size_t)m->hidden * NF, NF);
  put_section(f, "b1", m->b1, m->hidden, m->hidden);
  put_section(f, "w2", m->w2, (size_t)NC * m->hidden, m->hidden);
  put_section(f, "b2", m->b2, NC, NC);
  fprintf(f, "end\n");
  int r = CKV_OK;
  if (fflush(f) != 0 || ferror(f)) r = -(errno ? errno : EIO);
  if (r == CKV_OK && fsync(fileno(f)) < 0) r = -errno;
  if (fclose(f) != 0 && r == CKV_OK) r = -(errno ? errno : EIO);
  if (r == CKV_OK && rename(tmp, path) < 0) r = -errno;
  if (r < 0) unlink(tmp);
  free(tmp);
  return r;
}
