/* model.c - llama2.c legacy checkpoint loader and FP32 forward pass, split at
 * the attention step so the KV cache can live outside the model (see model.h).
 *
 * The checkpoint is mapped read-only and shared by every state; a state holds
 * one sequence's activations (one allocation) and, optionally, a private FP32
 * cache laid out [layer][pos][kv_dim].  Matrix-vector products keep LANES
 * independent partial sums per output row: that is a reduction gcc -O2 can
 * turn into SIMD without -ffast-math (a single running sum would force it to
 * keep the sequential order), and the fixed order keeps results bitwise
 * reproducible from run to run.  No threads, no global state. */
#include "examples/llm/model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"

#define HEADER_INTS 7
#define HEADER_BYTES (HEADER_INTS * (int)sizeof(int32_t))
/* llama2.c's version-1+ exporter starts its files with this magic ("ak42"). */
#define LLAMA2C_V1_MAGIC 0x616b3432
#define RMS_EPS 1e-5f
#define ROPE_THETA 10000.0
#define LANES 8

struct ckv_model {
  ckv_model_config cfg;
  void *map;
  size_t map_size;
  const float *tok_emb;   /* vocab x dim */
  const float *rms_att;   /* layers x dim */
  const float *wq;        /* layers x dim x dim */
  const float *wk;        /* layers x kv_dim x dim */
  const float *wv;        /* layers x kv_dim x dim */
  const float *wo;        /* layers x dim x dim */
  const float *rms_ffn;   /* layers x dim */
  const float *w1;        /* layers x hidden x dim */
  const float *w2;        /* layers x dim x hidden */
  const float *w3;        /* layers x hidden x dim */
  const float *rms_final; /* dim */
  const float *wcls;      /* vocab x dim (== tok_emb when shared) */
};

/* Where a state is in the embed -> (qkv -> finish) x layers -> logits chain. */
enum phase { PHASE_EMBED, PHASE_QKV, PHASE_FINISH, PHASE_LOGITS };

struct ckv_model_state {
  const ckv_model *m;
  float *x;    /* residual stream, dim */
  float *xb;   /* normalised input, dim */
  float *xb2;  /* projection output, dim */
  float *q;    /* dim */
  float *k;    /* kv_dim */
  float *v;    /* kv_dim */
  float *att;  /* attention output scratch for the caller, dim */
  float *hb;   /* hidden */
  float *hb2;  /* hidden */
  float *kc;   /* private cache K: layers x seq_len x kv_dim, or NULL */
  float *vc;   /* private cache V, same shape */
  int cache_len;
  int layer;   /* the layer the next qkv/finish call must name */
  int pos;     /* position given to layer 0's qkv; later layers must repeat it */
  enum phase phase;
};

/* ---- loading ------------------------------------------------------------ */

int ckv_model_path_from_env(char *buf, size_t size) {
  if (!buf || size == 0) return CKV_ERR_INVALID;
  const char *file = getenv("CKV_MODEL");
  const char *dir = getenv("CKV_MODEL_DIR");
  int n;
  if (file && *file)
    n = snprintf(buf, size, "%s", file);
  else if (dir && *dir)
    n = snprintf(buf, size, "%s/%s", dir, CKV_MODEL_DEFAULT_FILE);
  else
    return CKV_ERR_NOT_FOUND;
  if (n < 0) return CKV_ERR_INVALID;
  if ((size_t)n >= size) return -ENAMETOOLONG;
  return CKV_OK;
}

/* *acc += a*b*c, false on uint64 overflow (a, b, c < 2^31 each). */
static bool add_prod(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t ab = a * b; /* < 2^62: cannot overflow */
  if (c != 0 && ab > UINT64_MAX / c) return false;
  uint64_t abc = ab * c;
  if (abc > UINT64_MAX - *acc) return false;
  *acc += abc;
  return true;
}

/* Validate the header and fill cfg; *ret_floats = floats the file must hold
 * after the header. */
static int parse_header(const int32_t h[HEADER_INTS], ckv_model_config *cfg, uint64_t *ret_floats) {
  if (h[0] == LLAMA2C_V1_MAGIC) return CKV_ERR_FORMAT;
  int32_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], vocab = h[5],
          seq = h[6];
  if (dim <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || seq <= 0)
    return CKV_ERR_CORRUPT;
  if (vocab == 0 || vocab == INT32_MIN) return CKV_ERR_CORRUPT;
  if (dim % heads != 0 || heads % kv_heads != 0) return CKV_ERR_CORRUPT;
  int32_t head_dim = dim / heads;
  if (head_dim % 2 != 0) return CKV_ERR_FORMAT;
  bool shared = vocab > 0;
  if (!shared) vocab = -vocab;
  uint64_t D = (uint64_t)dim, H = (uint64_t)hidden, L = (uint64_t)layers, V = (uint64_t)vocab;
  uint64_t KV = (uint64_t)kv_heads * (uint64_t)head_dim, S = (uint64_t)seq;
  uint64_t n = 0;
  bool ok = add_prod(&n, V, D, 1)             /* token_embedding */
            && add_prod(&n, L, D, 1)          /* rms_att_weight */
            && add_prod(&n, L, D, D)          /* wq */
            && add_prod(&n, L, KV, D)         /* wk */
            && add_prod(&n, L, KV, D)         /* wv */
            && add_prod(&n, L, D, D)          /* wo */
            && add_prod(&n, L, D, 1)          /* rms_ffn_weight */
            && add_prod(&n, L, H, D)          /* w1 */
            && add_prod(&n, L, D, H)          /* w2 */
            && add_prod(&n, L, H, D)          /* w3 */
            && add_prod(&n, D, 1, 1)          /* rms_final_weight */
            && add_prod(&n, S, (uint64_t)head_dim / 2, 2) /* freq_cis_real + imag */
            && (shared || add_prod(&n, V, D, 1));         /* wcls */
  if (!ok) return CKV_ERR_CORRUPT;
  *cfg = (ckv_model_config){
      .dim = dim,
      .hidden_dim = hidden,
      .n_layers = layers,
      .n_heads = heads,
      .n_kv_heads = kv_heads,
      .vocab_size = vocab,
      .seq_len = seq,
      .head_dim = head_dim,
      .kv_dim = kv_heads * head_dim,
      .shared_classifier = shared,
  };
  *ret_floats = n;
  return CKV_OK;
}

static int read_full(int fd, void *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return CKV_ERR_CORRUPT;
    done += (size_t)r;
  }
  return CKV_OK;
}

/* Point the weight arrays into the mapping, in file order. */
static void map_weights(ckv_model *m) {
  const ckv_model_config *c = &m->cfg;
  size_t D = (size_t)c->dim, H = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
  size_t V = (size_t)c->vocab_size, KV = (size_t)c->kv_dim, S = (size_t)c->seq_len;
  const float *p = (const float *)((const char *)m->map + HEADER_BYTES);
  m->tok_emb = p, p += V * D;
  m->rms_att = p, p += L * D;
  m->wq = p, p += L * D * D;
  m->wk = p, p += L * KV * D;
  m->wv = p, p += L * KV * D;
  m->wo = p, p += L * D * D;
  m->rms_ffn = p, p += L * D;
  m->w1 = p, p += L * H * D;
  m->w2 = p, p += L * D * H;
  m->w3 = p, p += L * H * D;
  m->rms_final = p, p += D;
  p += S * ((size_t)c->head_dim / 2) * 2; /* legacy RoPE tables: recomputed instead */
  m->wcls = c->shared_classifier ? m->tok_emb : p;
}

int ckv_model_load(const char *path, ckv_model **ret) {
  if (!path || !ret) return CKV_ERR_INVALID;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  return CKV_ERR_UNSUPPORTED;
#endif
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ckv_model *m = NULL;
  struct stat st;
  int r;
  if (fstat(fd, &st) < 0) {
    r = -errno;
    goto out;
  }
  if (S_ISDIR(st.st_mode)) {
    r = -EISDIR;
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    r = CKV_ERR_INVALID;
    goto out;
  }
  if (st.st_size < HEADER_BYTES) {
    r = CKV_ERR_CORRUPT;
    goto out;
  }
  int32_t h[HEADER_INTS];
  r = read_full(fd, h, sizeof h);
  if (r < 0) goto out;
  ckv_model_config cfg;
  uint64_t n_floats;
  r = parse_header(h, &cfg, &n_floats);
  if (r < 0) goto out;
  /* n_floats <= UINT64_MAX; the byte count must not wrap either. */
  if (n_floats > (UINT64_MAX - HEADER_BYTES) / sizeof(float) ||
      (uint64_t)st.st_size != HEADER_BYTES + n_floats * sizeof(float) ||
      (uint64_t)st.st_size > SIZE_MAX) {
    r = CKV_ERR_CORRUPT;
    goto out;
  }
  m = calloc(1, sizeof *m);
  if (!m) {
    r = -ENOMEM;
    goto out;
  }
  m->cfg = cfg;
  m->map_size = (size_t)st.st_size;
  m->map = mmap(NULL, m->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m->map == MAP_FAILED) {
    r = -errno;
    m->map = NULL;
    goto out;
  }
  /* A NaN or Inf weight would only show up later as garbage logits. */
  const float *w = (const float *)((const char *)m->map + HEADER_BYTES);
  for (uint64_t i = 0; i < n_floats; i++)
    if (!isfinite(w[i])) {
      r = CKV_ERR_CORRUPT;
      goto out;
    }
  map_weights(m);
  *ret = m;
  m = NULL;
  r = CKV_OK;
out:
  ckv_model_free(m);
  close(fd);
  return r;
}

ckv_model *ckv_model_free(ckv_model *m) {
  if (!m) return NULL;
  if (m->map) munmap(m->map, m->map_size);
  free(m);
  return NULL;
}

const ckv_model_config *ckv_model_config_get(const ckv_model *m) {
  return &m->cfg;
}

/* ---- kernels ------------------------------------------------------------ */

/* out[i] = w[i, :] . x for i < n; w is row-major n x d.  LANES partial sums
 * per row: see the file comment. */
static void matmul(float *restrict out, const float *restrict w, const float *restrict x, int n,
                   int d) {
  for (int i = 0; i < n; i++) {
    const float *restrict row = w + (size_t)i * (size_t)d;
    float acc[LANES] = {0};
    int j = 0;
    for (; j + LANES <= d; j += LANES)
      for (int l = 0; l < LANES; l++) acc[l] += row[j + l] * x[j + l];
    float tail = 0.0f;
    for (; j < d; j++) tail += row[j] * x[j];
    out[i] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) +
             tail;
  }
}

static void rmsnorm(float *restrict out, const float *restrict x, const float *restrict w, int n) {
  float ss = 0.0f;
  for (int j = 0; j < n; j++) ss += x[j] * x[j];
  float scale = 1.0f / sqrtf(ss / (float)n + RMS_EPS);
  for (int j = 0; j < n; j++) out[j] = w[j] * (scale * x[j]);
}

static void rope(float *vec, int n_heads, int head_dim, int pos) {
  for (int i = 0; i < head_dim; i += 2) {
    double angle = (double)pos * pow(ROPE_THETA, -(double)i / (double)head_dim);
    float c = (float)cos(angle), s = (float)sin(angle);
    for (int h = 0; h < n_heads; h++) {
      float *p = vec + (size_t)h * (size_t)head_dim + (size_t)i;
      float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

static float dot(const float *restrict a, const float *restrict b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* ---- state and the split forward ------------------------------------------ */

int ckv_model_state_new(const ckv_model *m, bool private_cache, ckv_model_state **ret) {
  if (!m || !ret) return CKV_ERR_INVALID;
  const ckv_model_config *c = &m->cfg;
  size_t D = (size_t)c->dim, KV = (size_t)c->kv_dim, H = (size_t)c->hidden_dim;
  ckv_model_state *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  /* x, xb, xb2, q, att: dim each; k, v: kv_dim; hb, hb2: hidden. */
  float *a = calloc(5 * D + 2 * KV + 2 * H, sizeof(float));
  if (!a) goto nomem;
  s->x = a, a += D;
  s->xb = a, a += D;
  s->xb2 = a, a += D;
  s->q = a, a += D;
  s->att = a, a += D;
  s->k = a, a += KV;
  s->v = a, a += KV;
  s->hb = a, a += H;
  s->hb2 = a;
  if (private_cache) {
    size_t per_layer = (size_t)c->seq_len * KV, total = 0;
    if (per_layer / KV == (size_t)c->seq_len && per_layer <= SIZE_MAX / (size_t)c->n_layers)
      total = per_layer * (size_t)c->n_layers;
    if (total == 0) goto nomem;
    s->kc = calloc(total, sizeof(float));
    s->vc = calloc(total, sizeof(float));
    if (!s->kc || !s->vc) goto nomem;
  }
  s->m = m;
  s->phase = PHASE_EMBED;
  *ret = s;
  return CKV_OK;
nomem:
  ckv_model_state_free(s);
  return -ENOMEM;
}

ckv_model_state *ckv_model_state_free(ckv_model_state *s) {
  if (!s) return NULL;
  free(s->x); /* the start of the activation block */
  free(s->kc);
  free(s->vc);
  free(s);
  return NULL;
}

void ckv_model_state_reset(ckv_model_state *s) {
  if (!s) return;
  s->cache_len = 0;
  s->phase = PHASE_EMBED;
}

const float *ckv_model_state_q(const ckv_model_state *s) { return s->q; }
const float *ckv_model_state_k(const ckv_model_state *s) { return s->k; }
const float *ckv_model_state_v(const ckv_model_state *s) { return s->v; }
float *ckv_model_state_attn_buf(ckv_model_state *s) { return s->att; }
const float *ckv_model_state_hidden(const ckv_model_state *s) { return s->xb; } /* ckv_model_logits leaves it there */

int ckv_model_embed(const ckv_model *m, ckv_model_state *s, int token) {
  if (!m || !s || s->m != m) return CKV_ERR_INVALID;
  if (token < 0 || token >= m->cfg.vocab_size) return CKV_ERR_RANGE;
  size_t D = (size_t)m->cfg.dim;
  memcpy(s->x, m->tok_emb + (size_t)token * D, D * sizeof(float));
  s->layer = 0;
  s->phase = PHASE_QKV;
  return CKV_OK;
}

int ckv_model_qkv(const ckv_model *m, ckv_model_state *s, int layer, int pos) {
  if (!m || !s || s->m != m) return CKV_ERR_INVALID;
  const ckv_model_config *c = &m->cfg;
  if (layer < 0 || layer >= c->n_layers || pos < 0 || pos >= c->seq_len) return CKV_ERR_RANGE;
  if (s->phase != PHASE_QKV || layer != s->layer || (layer > 0 && pos != s->pos))
    return CKV_ERR_STATE;
  size_t D = (size_t)c->dim, KV = (size_t)c->kv_dim, l = (size_t)layer;
  rmsnorm(s->xb, s->x, m->rms_att + l * D, c->dim);
  matmul(s->q, m->wq + l * D * D, s->xb, c->dim, c->dim);
  matmul(s->k, m->wk + l * KV * D, s->xb, c->kv_dim, c->dim);
  matmul(s->v, m->wv + l * KV * D, s->xb, c->kv_dim, c->dim);
  rope(s->q, c->n_heads, c->head_dim, pos);
  rope(s->k, c->n_kv_heads, c->head_dim, pos);
  s->pos = pos;
  s->phase = PHASE_FINISH;
  return CKV_OK;
}

int ckv_model_finish_layer(const ckv_model *m, ckv_model_state *s, int layer, const float *attn_out) {
  if (!m || !s || s->m != m || !attn_out) return CKV_ERR_INVALID;
  const ckv_model_config *c = &m->cfg;
  if (layer < 0 || layer >= c->n_layers) return CKV_ERR_RANGE;
  if (s->phase != PHASE_FINISH || layer != s->layer) return CKV_ERR_STATE;
  size_t D = (size_t)c->dim, H = (size_t)c->hidden_dim, l = (size_t)layer;
  matmul(s->xb2, m->wo + l * D * D, attn_out, c->dim, c->dim);
  for (int i = 0; i < c->dim; i++) s->x[i] += s->xb2[i];
  rmsnorm(s->xb, s->x, m->rms_ffn + l * D, c->dim);
  matmul(s->hb, m->w1 + l * H * D, s->xb, c->hidden_dim, c->dim);
  matmul(s->hb2, m->w3 + l * H * D, s->xb, c->hidden_dim, c->dim);
  for (int i = 0; i < c->hidden_dim; i++) {
    float g = s->hb[i];
    s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
  }
  matmul(s->xb2, m->w2 + l * D * H, s->hb, c->dim, c->hidden_dim);
  for (int i = 0; i < c->dim; i++) s->x[i] += s->xb2[i];
  s->layer = layer + 1;
  s->phase = s->layer == c->n_layers ? PHASE_LOGITS : PHASE_QKV;
  return CKV_OK;
}

int ckv_model_logits(const ckv_model *m, ckv_model_state *s, float *ret_logits) {
  if (!m || !s || s->m != m || !ret_logits) return CKV_ERR_INVALID;
  if (s->phase != PHASE_LOGITS) return CKV_ERR_STATE;
  const ckv_model_config *c = &m->cfg;
  rmsnorm(s->xb, s->x, m->rms_final, c->dim);
  matmul(ret_logits, m->wcls, s->xb, c->vocab_size, c->dim);
  return CKV_OK;
}

int ckv_model_attend_fp32(const ckv_model_config *c, const float *q, const float *k_cache,
                          const float *v_cache, size_t row_stride, int n_pos, float *ret_out,
                          float *ret_probs) {
  if (!c || !q || !k_cache || !v_cache || !ret_out || n_pos < 1) return CKV_ERR_INVALID;
  if (c->head_dim < 1 || c->n_kv_heads < 1 || c->n_heads < c->n_kv_heads ||
      c->n_heads % c->n_kv_heads != 0 || c->kv_dim != c->n_kv_heads * c->head_dim ||
      row_stride < (size_t)c->kv_dim)
    return CKV_ERR_INVALID;
  int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  float scale = 1.0f / sqrtf((float)hd);
  if (ret_probs) memset(ret_probs, 0, (size_t)n_pos * sizeof(float));
  for (int h = 0; h < c->n_heads; h++) {
    const float *qh = q + (size_t)h * (size_t)hd;
    float *oh = ret_out + (size_t)h * (size_t)hd;
    size_t kv_off = (size_t)(h / group) * (size_t)hd;
    /* Online softmax: one pass over the cache, rescaling the partial sums
     * whenever a larger score appears. */
    float mx = -INFINITY, sum = 0.0f;
    memset(oh, 0, (size_t)hd * sizeof(float));
    for (int t = 0; t < n_pos; t++) {
      const float *kt = k_cache + (size_t)t * row_stride + kv_off;
      const float *vt = v_cache + (size_t)t * row_stride + kv_off;
      float sc = dot(qh, kt, hd) * scale;
      if (sc > mx) {
        float corr = expf(mx - sc); /* 0 on the first position */
        sum *= corr;
        for (int i = 0; i < hd; i++) oh[i] *= corr;
        mx = sc;
      }
      float e = expf(sc - mx);
      sum += e;
      for (int i = 0; i < hd; i++) oh[i] += e * vt[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++) oh[i] *= inv;
    if (ret_probs)
      for (int t = 0; t < n_pos; t++) {
        const float *kt = k_cache + (size_t)t * row_stride + kv_off;
        ret_probs[t] += expf(dot(qh, kt, hd) * scale - mx) * inv;
      }
  }
  return CKV_OK;
}

/* ---- convenience forward over the private cache -------------------------- */

int ckv_model_forward(const ckv_model *m, ckv_model_state *s, int token, int pos, float *ret_logits) {
  if (!m || !s || s->m != m || !ret_logits) return CKV_ERR_INVALID;
  const ckv_model_config *c = &m->cfg;
  if (!s->kc) return CKV_ERR_STATE;
  if (pos < 0 || pos > s->cache_len || pos >= c->seq_len) return CKV_ERR_RANGE;
  int r = ckv_model_embed(m, s, token);
  if (r < 0) return r;
  size_t KV = (size_t)c->kv_dim, per_layer = (size_t)c->seq_len * KV;
  s->cache_len = pos; /* a failure below leaves position pos unusable */
  for (int l = 0; l < c->n_layers; l++) {
    r = ckv_model_qkv(m, s, l, pos);
    if (r < 0) return r;
    float *kl = s->kc + (size_t)l * per_layer, *vl = s->vc + (size_t)l * per_layer;
    memcpy(kl + (size_t)pos * KV, s->k, KV * sizeof(float));
    memcpy(vl + (size_t)pos * KV, s->v, KV * sizeof(float));
    r = ckv_model_attend_fp32(c, s->q, kl, vl, KV, pos + 1, s->att, NULL);
    if (r < 0) return r;
    r = ckv_model_finish_layer(m, s, l, s->att);
    if (r < 0) return r;
  }
  r = ckv_model_logits(m, s, ret_logits);
  if (r < 0) return r;
  s->cache_len = pos + 1;
  return CKV_OK;
}

int ckv_model_cache_len(const ckv_model_state *s) {
  return s && s->kc ? s->cache_len : 0;
}

int ckv_model_cache_kv(const ckv_model_state *s, int layer, int pos, const float **ret_k,
                       const float **ret_v) {
  if (!s || !ret_k || !ret_v) return CKV_ERR_INVALID;
  if (!s->kc) return CKV_ERR_STATE;
  const ckv_model_config *c = &s->m->cfg;
  if (layer < 0 || layer >= c->n_layers || pos < 0 || pos >= s->cache_len) return CKV_ERR_RANGE;
  size_t off = ((size_t)layer * (size_t)c->seq_len + (size_t)pos) * (size_t)c->kv_dim;
  *ret_k = s->kc + off;
  *ret_v = s->vc + off;
  return CKV_OK;
}

/* ---- utilities ------------------------------------------------------------ */

int ckv_model_argmax(const float *x, int n) {
  if (!x || n < 1) return -1;
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

void ckv_model_softmax(float *x, int n) {
  if (!x || n < 1) return;
  float mx = x[0];
  for (int i = 1; i < n; i++)
    if (x[i] > mx) mx = x[i];
  float sum = 0.0f;
  for (int i = 0; i < n; i++) {
    x[i] = expf(x[i] - mx);
    sum += x[i];
  }
  for (int i = 0; i < n; i++) x[i] /= sum;
}

/* log(sum(exp(x))) in double; -INFINITY if every x is -inf. */
static double logsumexp(const float *x, int n) {
  double mx = -INFINITY;
  for (int i = 0; i < n; i++)
    if (x[i] > mx) mx = x[i];
  if (mx == -INFINITY) return mx;
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
  return mx + log(sum);
}

double ckv_model_kl(const float *ref_logits, const float *test_logits, int n) {
  if (!ref_logits || !test_logits || n < 1) return NAN;
  for (int i = 0; i < n; i++)
    /* -inf is a legitimate "masked" logit; NaN and +inf are not. */
    if (isnan(ref_logits[i]) || isnan(test_logits[i]) || ref_logits[i] == INFINITY ||
        test_logits[i] == INFINITY)
      return NAN;
  double lr = logsumexp(ref_logits, n), lt = logsumexp(test_logits, n);
  if (lr == -INFINITY || lt == -INFINITY) return NAN;
  double kl = 0.0;
  for (int i = 0; i < n; i++) {
    if (ref_logits[i] == -INFINITY) continue; /* p_ref = 0 contributes 0 */
    double log_p = (double)ref_logits[i] - lr;
    double log_q = (double)test_logits[i] - lt; /* -inf if the test masked it */
    kl += exp(log_p) * (log_p - log_q);
  }
  return kl > 0.0 ? kl : 0.0;
}

void ckv_model_rng_seed(ckv_model_rng *r, uint64_t seed) {
  r->state = seed;
}

uint64_t ckv_model_rng_next(ckv_model_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

float ckv_model_rng_uniform(ckv_model_rng *r) {
  return (float)(ckv_model_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

int ckv_model_sample(const float *logits, int n, float temperature, ckv_model_rng *r) {
  if (!logits || n < 1) return -1;
  if (!(temperature > 0.0f) || !isfinite(temperature)) return ckv_model_argmax(logits, n);
  if (!r) return -1;
  float mx = logits[ckv_model_argmax(logits, n)];
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += exp(((double)logits[i] - mx) / temperature);
  double u = (double)ckv_model_rng_uniform(r) * sum, cum = 0.0;
  int last = 0;
  for (int i = 0; i < n; i++) {
    double w = exp(((double)logits[i] - mx) / temperature);
    if (w <= 0.0) continue;
    cum += w;
    last = i;
    if (u < cum) return i;
  }
  return last; /* u landed past the rounded total */
}
