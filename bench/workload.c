/* workload.c - the synthetic multi-turn agent workload (see workload.h).
 *
 * The session is planned once at ckv_workload_new (token counts per round,
 * where each fact is stated, confirmed and queried, so positions are known up
 * front); ckv_workload_next then generates one round's tokens, K/V and
 * queries from a random stream seeded by (seed, round), so a round's bytes do
 * not depend on who asked for the rounds before it.  Directions (one unit
 * vector per kind of token per layer and kv head) and the outlier channels
 * are drawn once from the seed. */
#include "bench/workload.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/commitkv.h"
#include "kernels/quant.h"

void ckv_workload_defaults(ckv_workload_params *p) {
  *p = (ckv_workload_params){
      /* A Llama-3-8B-like KV geometry: 32 layers, 8 kv heads of 128, 32 query heads. */
      .n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .q_per_kv = 4, .seed = 20240611,
      /* 32 rounds of about 40 tokens, a tool output every 5 rounds: ~1500 tokens. */
      .rounds = 32, .system_tokens = 24, .sink_tokens = 4, .user_tokens = 16, .assistant_tokens = 24,
      .filler_tokens = 3, .tool_every = 5, .tool_tokens = 48, .topic_rounds = 6, .queries = 2,
      /* goal, constraint and order id stated in rounds 2-4, each queried twice in rounds 17-32;
       * goal and constraint stay in view, the order id is silent until asked for. */
      .n_facts = 3, .fact_tokens = 4, .fact_first_round = 2, .fact_queries = 2, .persistent_facts = 2,
      /* 4 outlier key channels per head at 10-50x (the KIVI observation). */
      .outlier_channels = 4, .outlier_min = 10.f, .outlier_max = 50.f, .key_amplitude = 1.f,
      /* Logits: sinks draw ~20% of a row, the current topic most of the rest, filler as much
       * per token as a sink would for a content word, a fact asked for ~80% of its row. */
      .sink_logit = 6.f, .system_logit = 1.f, .topic_logit = 4.f, .filler_logit = 5.f, .tool_logit = 4.f,
      .fact_logit = 10.f, .fact_echo_logit = 2.5f, .query_noise = 0.5f};
}

void ckv_workload_quick(ckv_workload_params *p) {
  ckv_workload_defaults(p);
  p->n_layers = 4;
  p->n_kv_heads = 2;
  p->head_dim = 64;
  p->user_tokens = 10;
  p->assistant_tokens = 14;
  p->tool_tokens = 24;
  p->system_tokens = 16;
}

/* ---- random numbers: splitmix64 seeding, xoshiro256** ---- */
typedef struct rng {
  uint64_t s[4];
} rng;

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull);
  for (int i = 0; i < 4; i++) r->s[i] = splitmix(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_u64(rng *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

static double rng_unit(rng *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

static float rng_gauss(rng *r) {
  double u = rng_unit(r), v = rng_unit(r);
  if (u < 1e-300) u = 1e-300;
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static uint32_t jitter(rng *r, uint32_t mean) { /* mean +-25%, at least 1 */
  double f = 0.75 + 0.5 * rng_unit(r);
  uint32_t n = (uint32_t)lround(mean * f);
  return n ? n : 1;
}

/* ---- the plan ---- */
/* Kinds of token; a token's key direction is dir_index(kind, arg). */
enum { K_SINK, K_SYSTEM, K_TOPIC, K_FILLER, K_FACT, K_TOOL };

typedef struct round_plan {
  uint64_t first;
  uint32_t n_user, n_asst, n_tool; /* n_user/n_asst include fact statement / confirmation tokens */
  int32_t stated_fact, confirmed_fact; /* -1 when none */
  int32_t tool_index;                  /* -1 when no tool output this round */
  uint32_t topic;
} round_plan;

static const char *const k_fact_names[] = {"goal", "constraint", "order_id", "fact3",
                                           "fact4", "fact5", "fact6", "fact7"};

struct ckv_workload {
  ckv_workload_params p;
  round_plan *plan;  /* [rounds + 1], index = round */
  ckv_workload_fact facts[CKV_WL_MAX_FACTS];
  uint32_t n_topics, n_tools, n_dirs;
  float *dirs;       /* [layer][kv head][dir][head_dim], unit vectors */
  uint32_t *out_ch;  /* [layer][kv head][outlier_channels] */
  float *out_mag;    /* same shape: signed magnitude */
  uint64_t total;
  uint32_t next_round;
  /* the current round's arrays */
  uint8_t *roles, *tags;
  float *semantic;
  uint32_t *ids;
  uint16_t *kv;
  float *q;
  int32_t *qfact;
  uint8_t *kind;
  uint32_t *kind_arg;
  size_t cap_tokens;
  float *tmp;        /* head_dim floats */
};

static uint32_t dir_index(const ckv_workload *w, int kind, uint32_t arg) {
  switch (kind) {
    case K_SINK: return 0;
    case K_SYSTEM: return 1;
    case K_TOPIC: return 2 + arg;
    case K_FILLER: return 2 + w->n_topics + arg; /* one per topic: old filler goes cold with its topic */
    case K_FACT: return 2 + 2 * w->n_topics + arg;
    default: return 2 + 2 * w->n_topics + w->p.n_facts + arg;
  }
}

static float *dir_at(const ckv_workload *w, uint32_t layer, uint32_t head, uint32_t d) {
  return w->dirs + (((size_t)layer * w->p.n_kv_heads + head) * w->n_dirs + d) * w->p.head_dim;
}

static int plan(ckv_workload *w) {
  const ckv_workload_params *p = &w->p;
  w->plan = calloc(p->rounds + 1u, sizeof(*w->plan));
  if (!w->plan) return -ENOMEM;
  rng r;
  rng_seed(&r, p->seed, 0x91a2);
  uint64_t pos = 0;
  uint32_t tools = 0;
  for (uint32_t i = 0; i < p->n_facts; i++) {
    ckv_workload_fact *f = &w->facts[i];
    f->name = k_fact_names[i];
    f->stated_round = p->fact_first_round + i;
    f->n_tokens = p->fact_tokens;
  }
  /* Later queries: slots spread over the second half, fact by fact. */
  uint32_t half = p->rounds / 2 + 1, slots = p->n_facts * p->fact_queries;
  for (uint32_t k = 0; k < p->fact_queries; k++)
    for (uint32_t i = 0; i < p->n_facts; i++) {
      uint32_t s = k * p->n_facts + i;
      uint32_t rd = half + (uint32_t)(((uint64_t)(s + 1) * (p->rounds - half)) / slots);
      w->facts[i].query_rounds[w->facts[i].n_query_rounds++] = rd;
    }
  for (uint32_t rd = 1; rd <= p->rounds; rd++) {
    round_plan *rp = &w->plan[rd];
    rp->first = pos;
    rp->stated_fact = rp->confirmed_fact = rp->tool_index = -1;
    rp->topic = rd == 1 ? 0 : (rd - 2) / p->topic_rounds;
    if (rd == 1) {
      rp->n_user = p->system_tokens;
    } else {
      rp->n_user = jitter(&r, p->user_tokens);
      rp->n_asst = jitter(&r, p->assistant_tokens);
      if (rp->n_asst < p->filler_tokens + 1) rp->n_asst = p->filler_tokens + 1;
      for (uint32_t i = 0; i < p->n_facts; i++) {
        if (w->facts[i].stated_round == rd) {
          rp->stated_fact = (int32_t)i;
          w->facts[i].first_stated = pos;
          if (rp->n_user < p->fact_tokens + 1) rp->n_user = p->fact_tokens + 1;
        }
        if (w->facts[i].stated_round + 1 == rd) {
          rp->confirmed_fact = (int32_t)i;
          w->facts[i].first_confirmed = pos + rp->n_user + p->filler_tokens;
          if (rp->n_asst < p->filler_tokens + p->fact_tokens + 1) rp->n_asst = p->filler_tokens + p->fact_tokens + 1;
        }
      }
      if (p->tool_every && rd % p->tool_every == 0 && rd < p->rounds) {
        rp->tool_index = (int32_t)tools++;
        rp->n_tool = p->tool_tokens;
      }
    }
    pos += rp->n_user + rp->n_asst + rp->n_tool;
  }
  w->total = pos;
  w->n_tools = tools;
  w->n_topics = w->plan[p->rounds].topic + 1;
  return 0;
}

static int make_dirs(ckv_workload *w) {
  const ckv_workload_params *p = &w->p;
  w->n_dirs = 2 + 2 * w->n_topics + p->n_facts + (w->n_tools ? w->n_tools : 1);
  size_t heads = (size_t)p->n_layers * p->n_kv_heads;
  w->dirs = malloc(heads * w->n_dirs * p->head_dim * sizeof(float));
  w->out_ch = malloc((heads * p->outlier_channels + 1) * sizeof(uint32_t));
  w->out_mag = malloc((heads * p->outlier_channels + 1) * sizeof(float));
  if (!w->dirs || !w->out_ch || !w->out_mag) return -ENOMEM;
  rng r;
  rng_seed(&r, p->seed, 0xd125);
  for (size_t i = 0; i < heads * w->n_dirs; i++) {
    float *d = w->dirs + i * p->head_dim;
    double n2 = 0;
    for (uint32_t c = 0; c < p->head_dim; c++) {
      d[c] = rng_gauss(&r);
      n2 += (double)d[c] * d[c];
    }
    float inv = (float)(1.0 / sqrt(n2 > 0 ? n2 : 1));
    for (uint32_t c = 0; c < p->head_dim; c++) d[c] *= inv;
  }
  for (size_t h = 0; h < heads; h++)
    for (uint32_t j = 0; j < p->outlier_channels; j++) {
      uint32_t ch;
      int dup;
      do { /* distinct channels */
        ch = (uint32_t)(rng_u64(&r) % p->head_dim);
        dup = 0;
        for (uint32_t k = 0; k < j; k++) dup |= w->out_ch[h * p->outlier_channels + k] == ch;
      } while (dup);
      float mag = p->outlier_min + (float)rng_unit(&r) * (p->outlier_max - p->outlier_min);
      w->out_ch[h * p->outlier_channels + j] = ch;
      w->out_mag[h * p->outlier_channels + j] = (rng_u64(&r) & 1) ? mag : -mag;
    }
  return 0;
}

int ckv_workload_new(const ckv_workload_params *p, ckv_workload **ret, const char **ret_err) {
  const char *err = NULL;
  if (!p->n_layers || !p->n_kv_heads || p->head_dim < 8 || !p->q_per_kv) err = "bad geometry";
  else if (p->rounds < 8) err = "rounds must be at least 8";
  else if (p->sink_tokens >= p->system_tokens) err = "the system prompt must be longer than the sinks";
  else if (p->n_facts > CKV_WL_MAX_FACTS || p->fact_queries > CKV_WL_MAX_FACT_QUERIES) err = "too many facts";
  else if (p->n_facts && p->fact_first_round < 2) err = "facts are stated from round 2 on";
  else if (p->n_facts && p->fact_first_round + p->n_facts + 2 > p->rounds / 2 + 1)
    err = "facts must be stated and confirmed in the first half of the session";
  else if (!p->topic_rounds || !p->queries) err = "topic_rounds and queries must be positive";
  else if (p->outlier_channels > p->head_dim / 4 || p->outlier_min > p->outlier_max) err = "bad outliers";
  if (err) {
    if (ret_err) *ret_err = err;
    return -EINVAL;
  }
  ckv_workload *w = calloc(1, sizeof(*w));
  if (!w) return -ENOMEM;
  w->p = *p;
  w->next_round = 1;
  w->tmp = malloc(p->head_dim * sizeof(float));
  w->qfact = malloc(p->queries * sizeof(int32_t));
  w->q = malloc((size_t)p->n_layers * p->queries * p->q_per_kv * p->n_kv_heads * p->head_dim * sizeof(float));
  int r = (!w->tmp || !w->qfact || !w->q) ? -ENOMEM : plan(w);
  if (r == 0) r = make_dirs(w);
  if (r < 0) {
    ckv_workload_free(w);
    return r;
  }
  *ret = w;
  return 0;
}

ckv_workload *ckv_workload_free(ckv_workload *w) {
  if (!w) return NULL;
  free(w->plan);
  free(w->dirs);
  free(w->out_ch);
  free(w->out_mag);
  free(w->roles);
  free(w->tags);
  free(w->semantic);
  free(w->ids);
  free(w->kv);
  free(w->q);
  free(w->qfact);
  free(w->kind);
  free(w->kind_arg);
  free(w->tmp);
  free(w);
  return NULL;
}

static int reserve(ckv_workload *w, size_t n) {
  if (n <= w->cap_tokens) return 0;
  const ckv_workload_params *p = &w->p;
  size_t kv = n * p->n_layers * 2u * p->n_kv_heads * p->head_dim;
#define GROW(f, count)                                  \
  do {                                                  \
    void *np = realloc(w->f, (count) * sizeof(*w->f));  \
    if (!np) return -ENOMEM;                            \
    w->f = np;                                          \
  } while (0)
  GROW(roles, n);
  GROW(tags, n);
  GROW(semantic, n);
  GROW(ids, n);
  GROW(kind, n);
  GROW(kind_arg, n);
  GROW(kv, kv);
#undef GROW
  w->cap_tokens = n;
  return 0;
}

/* Token i of the round: role, tags, semantic score, id and key direction. */
static void set_token(ckv_workload *w, size_t i, uint8_t role, uint8_t tags, float sem, uint32_t id, int kind,
                      uint32_t arg) {
  w->roles[i] = role;
  if (w->p.attention_only) tags &= (uint8_t)~CKV_TAG_CONFIRMATION;
  w->tags[i] = tags;
  w->semantic[i] = sem;
  w->ids[i] = id;
  w->kind[i] = (uint8_t)kind;
  w->kind_arg[i] = arg;
}

static void fill_tokens(ckv_workload *w, const round_plan *rp, uint32_t rd, rng *r) {
  const ckv_workload_params *p = &w->p;
  size_t i = 0;
  if (rd == 1) {
    for (; i < p->system_tokens; i++) {
      int sink = i < p->sink_tokens;
      set_token(w, i, CKV_ROLE_SYSTEM, i == 0 ? CKV_TAG_TURN_START | CKV_TAG_SENTENCE_START : 0, sink ? 0.5f : 0.8f,
                sink ? 1u + (uint32_t)i : 200u + (uint32_t)(rng_u64(r) % 30000u), sink ? K_SINK : K_SYSTEM, 0);
    }
    return;
  }
  /* user turn: a fact statement first when one is planted here */
  for (uint32_t j = 0; j < rp->n_user; j++, i++) {
    uint8_t tags = j == 0 ? CKV_TAG_TURN_START | CKV_TAG_SENTENCE_START : (rng_u64(r) % 12 == 0 ? CKV_TAG_SENTENCE_START : 0);
    if (rp->stated_fact >= 0 && j < p->fact_tokens)
      set_token(w, i, CKV_ROLE_USER, tags, 0.95f, 5000u + 100u * (uint32_t)rp->stated_fact + j, K_FACT,
                (uint32_t)rp->stated_fact);
    else
      set_token(w, i, CKV_ROLE_USER, tags, 0.2f + 0.6f * (float)rng_unit(r), 200u + (uint32_t)(rng_u64(r) % 30000u),
                K_TOPIC, rp->topic);
  }
  /* assistant turn: templated filler, then the confirmation of last round's fact, then content */
  for (uint32_t j = 0; j < rp->n_asst; j++, i++) {
    uint8_t tags = j == 0 ? CKV_TAG_TURN_START | CKV_TAG_SENTENCE_START : 0;
    if (j < p->filler_tokens) {
      set_token(w, i, CKV_ROLE_ASSISTANT, tags, 0.05f, 100u + j % 3u, K_FILLER, rp->topic); /* "ok", "got it" */
    } else if (rp->confirmed_fact >= 0 && j < p->filler_tokens + p->fact_tokens) {
      uint32_t k = j - p->filler_tokens;
      set_token(w, i, CKV_ROLE_ASSISTANT, CKV_TAG_CONFIRMATION | (k == 0 ? CKV_TAG_SENTENCE_START : 0), 0.95f,
                5000u + 100u * (uint32_t)rp->confirmed_fact + k, K_FACT, (uint32_t)rp->confirmed_fact);
    } else {
      set_token(w, i, CKV_ROLE_ASSISTANT, rng_u64(r) % 12 == 0 ? CKV_TAG_SENTENCE_START : 0,
                0.2f + 0.6f * (float)rng_unit(r), 200u + (uint32_t)(rng_u64(r) % 30000u), K_TOPIC, rp->topic);
    }
  }
  for (uint32_t j = 0; j < rp->n_tool; j++, i++)
    set_token(w, i, CKV_ROLE_TOOL, j == 0 ? CKV_TAG_TURN_START : 0, 0.4f, 200u + (uint32_t)(rng_u64(r) % 30000u),
              K_TOOL, (uint32_t)rp->tool_index);
}

static void fill_kv(ckv_workload *w, size_t n, rng *r) {
  const ckv_workload_params *p = &w->p;
  const uint32_t H = p->n_kv_heads, D = p->head_dim;
  const float amp = p->key_amplitude * sqrtf((float)D); /* noise norm is ~sqrt(D) */
  for (size_t i = 0; i < n; i++)
    for (uint32_t l = 0; l < p->n_layers; l++) {
      uint16_t *k = w->kv + ((i * p->n_layers + l) * 2u) * H * D, *v = k + (size_t)H * D;
      for (uint32_t h = 0; h < H; h++) {
        const float *u = dir_at(w, l, h, dir_index(w, w->kind[i], w->kind_arg[i]));
        float a = amp * (1.f + 0.15f * rng_gauss(r));
        for (uint32_t c = 0; c < D; c++) w->tmp[c] = a * u[c] + rng_gauss(r);
        const size_t o = ((size_t)l * H + h) * p->outlier_channels;
        for (uint32_t j = 0; j < p->outlier_channels; j++) /* nearly constant per channel */
          w->tmp[w->out_ch[o + j]] = w->out_mag[o + j] * (1.f + 0.05f * rng_gauss(r));
        for (uint32_t c = 0; c < D; c++) k[h * D + c] = ckv_f32_to_f16(w->tmp[c]);
        /* values: N(0,1); sinks carry small values (they are where attention rests, not content) */
        float vs = w->kind[i] == K_SINK ? 0.1f : 1.f;
        for (uint32_t c = 0; c < D; c++) v[h * D + c] = ckv_f32_to_f16(vs * rng_gauss(r));
      }
    }
}

/* Queries: row weights per direction, turned into q vectors. */
typedef struct qterm {
  uint32_t dir;
  float logit;
} qterm;

static void fill_queries(ckv_workload *w, const round_plan *rp, uint32_t rd, rng *r) {
  const ckv_workload_params *p = &w->p;
  const uint32_t H = p->n_kv_heads, D = p->head_dim, QH = H * p->q_per_kv, R = p->queries;
  const float inv_amp = 1.f / p->key_amplitude; /* logit = w * (amp . sqrt(D) / amp) / sqrt(D) */
  const float noise = p->query_noise / sqrtf(1.f + p->key_amplitude * p->key_amplitude); /* |k|^2 ~ D(1+amp^2) */
  for (uint32_t row = 0; row < R; row++) w->qfact[row] = -1;
  /* facts asked for this round take rows from 0 */
  uint32_t next_row = 0;
  for (uint32_t f = 0; f < p->n_facts; f++)
    for (uint32_t k = 0; k < w->facts[f].n_query_rounds; k++)
      if (w->facts[f].query_rounds[k] == rd && next_row < R) w->qfact[next_row++] = (int32_t)f;
  for (uint32_t row = 0; row < R; row++) {
    qterm t[16];
    size_t nt = 0;
    t[nt++] = (qterm){dir_index(w, K_SINK, 0), p->sink_logit};
    t[nt++] = (qterm){dir_index(w, K_SYSTEM, 0), p->system_logit};
    if (rd > 1) {
      int asking = w->qfact[row] >= 0;
      t[nt++] = (qterm){dir_index(w, K_TOPIC, rp->topic), asking ? 0.5f * p->topic_logit : p->topic_logit};
      t[nt++] = (qterm){dir_index(w, K_FILLER, rp->topic), asking ? 0.5f * p->filler_logit : p->filler_logit};
      for (uint32_t f = 0; f < p->n_facts; f++) {
        float lg = f < p->persistent_facts && w->facts[f].stated_round <= rd ? p->fact_echo_logit : 0.f;
        /* statement and confirmation rounds: the fact is what the turn is about */
        if (row == 0 && (w->facts[f].stated_round == rd || w->facts[f].stated_round + 1 == rd)) lg = p->fact_logit;
        if ((int32_t)f == w->qfact[row]) lg = p->fact_logit;
        if (lg != 0.f) t[nt++] = (qterm){dir_index(w, K_FACT, f), lg};
      }
      if (rd >= 2 && w->plan[rd - 1].tool_index >= 0) /* last round's tool output, read once */
        t[nt++] = (qterm){dir_index(w, K_TOOL, (uint32_t)w->plan[rd - 1].tool_index), p->tool_logit};
    }
    for (uint32_t l = 0; l < p->n_layers; l++)
      for (uint32_t qh = 0; qh < QH; qh++) {
        uint32_t h = qh / p->q_per_kv;
        float *q = w->q + (((size_t)l * R + row) * QH + qh) * D;
        /* logit noise: a random component giving each token a logit N(0, query_noise) */
        for (uint32_t c = 0; c < D; c++) q[c] = noise * rng_gauss(r);
        for (size_t j = 0; j < nt; j++) {
          const float *u = dir_at(w, l, h, t[j].dir);
          float s = t[j].logit * inv_amp * (1.f + 0.1f * rng_gauss(r)); /* heads differ a little */
          for (uint32_t c = 0; c < D; c++) q[c] += s * u[c];
        }
        const size_t o = ((size_t)l * H + h) * p->outlier_channels;
        for (uint32_t j = 0; j < p->outlier_channels; j++) /* outlier channels: a small, shared offset */
          q[w->out_ch[o + j]] = 0.02f * (w->out_mag[o + j] > 0 ? 1.f : -1.f);
      }
  }
}

int ckv_workload_next(ckv_workload *w, ckv_workload_round *ret) {
  const ckv_workload_params *p = &w->p;
  uint32_t rd = w->next_round;
  if (rd > p->rounds) return -ENOENT;
  const round_plan *rp = &w->plan[rd];
  size_t n = rp->n_user + rp->n_asst + rp->n_tool;
  int e = reserve(w, n);
  if (e < 0) return e;
  rng r;
  rng_seed(&r, p->seed, 0x1000u + rd);
  fill_tokens(w, rp, rd, &r);
  fill_kv(w, n, &r);
  fill_queries(w, rp, rd, &r);
  *ret = (ckv_workload_round){.round = rd, .topic = rp->topic, .first_position = rp->first, .n_tokens = (uint32_t)n,
                              .roles = w->roles, .tags = w->tags,
                              .semantic = p->attention_only ? NULL : w->semantic, .token_ids = w->ids,
                              .kv = w->kv, .n_queries = p->queries, .q = w->q, .query_fact = w->qfact};
  w->next_round++;
  return 0;
}

const ckv_workload_params *ckv_workload_params_of(const ckv_workload *w) { return &w->p; }
uint32_t ckv_workload_n_facts(const ckv_workload *w) { return w->p.n_facts; }
const ckv_workload_fact *ckv_workload_fact_at(const ckv_workload *w, uint32_t i) {
  return i < w->p.n_facts ? &w->facts[i] : NULL;
}
uint64_t ckv_workload_total_tokens(const ckv_workload *w) { return w->total; }
size_t ckv_workload_token_layer_bytes(const ckv_workload *w) {
  return (size_t)w->p.n_kv_heads * w->p.head_dim * 2u;
}
