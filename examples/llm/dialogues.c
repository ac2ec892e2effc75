/* dialogues.c - reading agent dialogues (JSON lines, libjansson) and what
 * their recall questions are: fact kind, where the fact was stated. */
#include "examples/llm/dialogues.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"

/* Fact kind from the answer sentence: the task's fixed sentence forms, the
 * same table as tools/agentlm/gen.py's KINDS (the two must agree, or the C
 * and PyTorch reports split questions differently). */
static const struct {
  const char *prefix, *kind;
} k_kinds[] = {
    {"The table is on ", "booking_day"},       {"The booking is under ", "booking_name"},
    {"Your booking code is ", "booking_code"}, {"The table is for ", "booking_people"},
    {"The flight is on ", "flight_date"},      {"The passenger is ", "flight_passenger"},
    {"You fly to ", "flight_city"},            {"Your ticket number is ", "flight_ticket"},
    {"The price is ", "order_price"},          {"You ordered ", "order_item"},
    {"Your order number is ", "order_number"}, {"The reservation is for ", "hotel_name"},
    {"The hotel is in ", "hotel_city"},        {"Your reservation code is ", "hotel_code"},
    {"The stay is ", "hotel_nights"},
};

/* Upper bounds of the distance buckets (eval.py's 0-127, 128-255, 256-511, 512+). */
static const long k_bucket_hi[DIALOGUE_N_BUCKETS - 1] = {128, 256, 512, -1};
static const char *const k_bucket_names[DIALOGUE_N_BUCKETS] = {"0-127", "128-255", "256-511", "512+", "unknown"};

bool dialogue_turn_is_topic_shift(const dialogue_turn *t) {
  static const char *const openings[] = {"Forget that", "Never mind that"};
  for (size_t i = 0; t->role == 'U' && i < sizeof(openings) / sizeof(openings[0]); i++)
    if (!strncmp(t->text, openings[i], strlen(openings[i]))) return true;
  return false;
}

const char *dialogue_fact_kind(const char *answer) {
  for (size_t i = 0; i < sizeof(k_kinds) / sizeof(k_kinds[0]); i++)
    if (!strncmp(answer, k_kinds[i].prefix, strlen(k_kinds[i].prefix))) return k_kinds[i].kind;
  return strstr(answer, " note was ") ? "note" : "other";
}

int dialogue_distance_bucket(long dist) {
  if (dist < 0) return DIALOGUE_N_BUCKETS - 1;
  for (int b = 0; b < DIALOGUE_N_BUCKETS - 1; b++)
    if (k_bucket_hi[b] < 0 || dist < k_bucket_hi[b]) return b;
  return DIALOGUE_N_BUCKETS - 1;
}

const char *dialogue_bucket_name(int bucket) {
  return bucket >= 0 && bucket < DIALOGUE_N_BUCKETS ? k_bucket_names[bucket] : "?";
}

size_t dialogue_turn_bytes(const dialogue_turn *t) { return 3 + t->len + 1; }

size_t dialogue_turn_position(const dialogue *d, size_t t) {
  size_t pos = 1; /* BOS */
  for (size_t i = 0; i < t && i < d->n_turns; i++) pos += dialogue_turn_bytes(&d->turns[i]);
  return pos;
}

const dialogue_recall *dialogue_recall_at(const dialogue *d, size_t t) {
  for (size_t i = 0; i < d->n_recall; i++)
    if (d->recall[i].turn == t) return &d->recall[i];
  return NULL;
}

/* The last occurrence of needle in hay, or NULL. */
static const char *last_occurrence(const char *hay, size_t hay_len, const char *needle, size_t n) {
  if (n == 0 || n > hay_len) return NULL;
  for (size_t i = hay_len - n + 1; i-- > 0;)
    if (!memcmp(hay + i, needle, n)) return hay + i;
  return NULL;
}

long dialogue_fact_position(const dialogue *d, const dialogue_recall *r) {
  long best = -1;
  for (size_t i = 0; i < r->turn && i < d->n_turns; i++) {
    const dialogue_turn *t = &d->turns[i];
    if (t->role == 'A' && t->len == r->len && !memcmp(t->text, r->answer, r->len)) continue;
    /* "R: " cannot hold the sentence, nor can the newline: search the text. */
    const char *hit = last_occurrence(t->text, t->len, r->answer, r->len);
    if (hit) best = (long)(dialogue_turn_position(d, i) + 3 + (size_t)(hit - t->text));
  }
  return best;
}

static bool word_sep(char c) { return c == ' ' || c == '.' || c == ',' || c == '?' || c == '!'; }

/* Whether word w[0..n) of an answer names a fact's value (dialogues.h). */
static bool value_word(const char *w, size_t n, bool first) {
  if (n < 2) return false;
  for (size_t i = 0; i < n; i++)
    if (w[i] >= '0' && w[i] <= '9') return true;
  return !first && w[0] >= 'A' && w[0] <= 'Z';
}

bool dialogue_turn_holds_fact(const dialogue *d, size_t t) {
  if (t >= d->n_turns) return false;
  const dialogue_turn *turn = &d->turns[t];
  for (size_t k = 0; k < d->n_recall; k++) {
    const char *a = d->recall[k].answer;
    size_t len = d->recall[k].len;
    bool first = true;
    for (size_t i = 0; i < len;) {
      if (word_sep(a[i])) {
        i++;
        continue;
      }
      size_t j = i;
      while (j < len && !word_sep(a[j])) j++;
      if (value_word(a + i, j - i, first) && last_occurrence(turn->text, turn->len, a + i, j - i)) return true;
      first = false;
      i = j;
    }
  }
  return false;
}

static bool entity_sep(char c) { return word_sep(c) || c == ':' || c == ';'; }

/* Calls fn(word, len, arg) for each entity word of t until fn returns
 * false; returns whether t has one (and fn never said stop: the count). */
static size_t entity_words(const dialogue_turn *t, bool (*fn)(const char *, size_t, const void *), const void *arg) {
  bool sentence_start = true;
  size_t n = 0;
  for (size_t i = 0; i < t->len;) {
    char c = t->text[i];
    if (entity_sep(c)) {
      if (c == '.' || c == '?' || c == '!') sentence_start = true;
      i++;
      continue;
    }
    size_t j = i;
    while (j < t->len && !entity_sep(t->text[j])) j++;
    if (value_word(t->text + i, j - i, sentence_start)) {
      n++;
      if (fn && !fn(t->text + i, j - i, arg)) return 0;
    }
    sentence_start = false;
    i = j;
  }
  return n;
}

bool dialogue_turn_names_entity(const dialogue_turn *t) { return entity_words(t, NULL, NULL) > 0; }

static bool word_in(const char *w, size_t n, const void *arg) {
  const dialogue_turn *t = arg;
  return last_occurrence(t->text, t->len, w, n) != NULL;
}

bool dialogue_turn_restates(const dialogue_turn *later, const dialogue_turn *old) {
  return entity_words(old, word_in, later) > 0;
}

dialogue_label dialogue_entity_label(const dialogue *d, size_t t, bool *held, bool *superseded, bool copies_cold) {
  const dialogue_turn *turn = &d->turns[t];
  const bool names = dialogue_turn_names_entity(turn);
  bool supersedes = false;
  for (size_t k = 0; k < t; k++) {
    bool gone = names && held[k] && turn->role == 'A' && dialogue_turn_restates(turn, &d->turns[k]);
    if (superseded) superseded[k] = gone;
    if (gone) held[k] = false, supersedes = true;
  }
  if (!names) {
    held[t] = false;
    return DIALOGUE_OTHER;
  }
  bool copy = false;
  for (size_t k = 0; copies_cold && !supersedes && !copy && k < t; k++)
    copy = held[k] && dialogue_turn_restates(&d->turns[k], turn) && !dialogue_turn_restates(turn, &d->turns[k]);
  held[t] = !copy;
  return copy ? DIALOGUE_COPY : DIALOGUE_FACT;
}

/* ---- loading ------------------------------------------------------------------ */

typedef struct load_ctx {
  const char *path;
  size_t line;
  char *err;
  size_t err_size;
} load_ctx;

static int fail(load_ctx *c, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  snprintf(c->err, c->err_size, "%s:%zu: %s", c->path, c->line, what);
  return CKV_ERR_INVALID;
}

/* A copy of string field `key` of obj: valid UTF-8 (jansson's), no NUL, no
 * newline, at least min_len bytes. */
static int take_string(load_ctx *c, json_t *obj, const char *key, const char *where, size_t min_len, char **ret,
                       size_t *ret_len) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_string(v)) return fail(c, "%s: \"%s\" is missing or not a string", where, key);
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  if (n < min_len) return fail(c, "%s: \"%s\" is empty", where, key);
  if (memchr(s, '\0', n) || memchr(s, '\n', n)) return fail(c, "%s: \"%s\" holds a NUL or a newline", where, key);
  char *copy = malloc(n + 1);
  if (!copy) return -ENOMEM;
  memcpy(copy, s, n + 1);
  *ret = copy;
  if (ret_len) *ret_len = n;
  return CKV_OK;
}

static int take_index(load_ctx *c, json_t *obj, const char *key, const char *where, size_t bound, size_t *ret) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_integer(v)) return fail(c, "%s: \"%s\" is missing or not an integer", where, key);
  json_int_t i = json_integer_value(v);
  if (i < 0 || (size_t)i >= bound) return fail(c, "%s: \"%s\" %lld is not a turn (0..%zu)", where, key, (long long)i, bound - 1);
  *ret = (size_t)i;
  return CKV_OK;
}

static void dialogue_free(dialogue *d) {
  free(d->id);
  for (size_t i = 0; d->turns && i < d->n_turns; i++) free(d->turns[i].text);
  for (size_t i = 0; d->recall && i < d->n_recall; i++) free(d->recall[i].answer);
  free(d->turns);
  free(d->recall);
  *d = (dialogue){0};
}

static int parse_dialogue(load_ctx *c, json_t *root, dialogue *d) {
  char where[64];
  if (!json_is_object(root)) return fail(c, "not a JSON object");
  int e = take_string(c, root, "id", "dialogue", 1, &d->id, NULL);
  if (e < 0) return e;
  json_t *turns = json_object_get(root, "turns"), *recall = json_object_get(root, "recall");
  if (!json_is_array(turns) || !json_array_size(turns)) return fail(c, "\"turns\" is missing, empty or not an array");
  if (!json_is_array(recall)) return fail(c, "\"recall\" is missing or not an array");
  size_t nt = json_array_size(turns), nr = json_array_size(recall);
  d->turns = calloc(nt, sizeof(*d->turns));
  d->recall = calloc(nr ? nr : 1, sizeof(*d->recall));
  if (!d->turns || !d->recall) return -ENOMEM;
  d->n_turns = nt; /* zeroed entries: dialogue_free frees whatever was filled in */
  d->n_recall = nr;
  for (size_t i = 0; i < nt; i++) {
    json_t *t = json_array_get(turns, i);
    snprintf(where, sizeof(where), "turns[%zu]", i);
    if (!json_is_object(t)) return fail(c, "%s is not an object", where);
    char *role = NULL;
    if ((e = take_string(c, t, "role", where, 1, &role, NULL)) < 0) return e;
    bool ok = strlen(role) == 1 && strchr("SUAT", role[0]);
    d->turns[i].role = role[0];
    free(role);
    if (!ok) return fail(c, "%s: role is not one of S, U, A, T", where);
    if ((e = take_string(c, t, "text", where, 0, &d->turns[i].text, &d->turns[i].len)) < 0) return e;
  }
  for (size_t i = 0; i < nr; i++) {
    json_t *r = json_array_get(recall, i);
    dialogue_recall *q = &d->recall[i];
    snprintf(where, sizeof(where), "recall[%zu]", i);
    if (!json_is_object(r)) return fail(c, "%s is not an object", where);
    if ((e = take_index(c, r, "turn", where, nt, &q->turn)) < 0) return e;
    if ((e = take_index(c, r, "question_turn", where, nt, &q->question_turn)) < 0) return e;
    if ((e = take_string(c, r, "answer", where, 1, &q->answer, &q->len)) < 0) return e;
    if (d->turns[q->turn].role != 'A') return fail(c, "%s: turn %zu is not an assistant turn", where, q->turn);
    if (q->question_turn >= q->turn) return fail(c, "%s: the question comes after its answer", where);
    for (size_t j = 0; j < i; j++)
      if (d->recall[j].turn == q->turn) return fail(c, "%s: turn %zu is answered twice", where, q->turn);
  }
  return CKV_OK;
}

int dialogue_set_load(const char *path, size_t limit, dialogue_set *ret, char *err, size_t err_size) {
  load_ctx c = {.path = path, .err = err, .err_size = err_size};
  *ret = (dialogue_set){0};
  FILE *f = fopen(path, "r");
  if (!f) {
    int e = -errno;
    snprintf(err, err_size, "%s: %s", path, strerror(errno));
    return e;
  }
  char *line = NULL;
  size_t cap = 0, n_alloc = 0;
  ssize_t got;
  int e = CKV_OK;
  while ((limit == 0 || ret->n < limit) && (got = getline(&line, &cap, f)) >= 0) {
    c.line++;
    size_t n = (size_t)got;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
    if (!n) continue;
    json_error_t je;
    json_t *root = json_loadb(line, n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
      e = fail(&c, "not JSON: %s (column %d)", je.text, je.column);
      break;
    }
    if (ret->n == n_alloc) {
      size_t nn = n_alloc ? 2 * n_alloc : 64;
      dialogue *nd = realloc(ret->d, nn * sizeof(*nd));
      if (!nd) {
        json_decref(root);
        e = -ENOMEM;
        break;
      }
      ret->d = nd;
      n_alloc = nn;
    }
    dialogue *d = &ret->d[ret->n];
    *d = (dialogue){0};
    e = parse_dialogue(&c, root, d);
    json_decref(root);
    if (e < 0) {
      dialogue_free(d);
      break;
    }
    ret->n++;
  }
  if (e == CKV_OK && ferror(f)) {
    e = -EIO;
    snprintf(err, err_size, "%s: read error", path);
  }
  if (e == -ENOMEM) snprintf(err, err_size, "%s: out of memory", path);
  free(line);
  fclose(f);
  if (e < 0) dialogue_set_free(ret);
  return e;
}

void dialogue_set_free(dialogue_set *s) {
  for (size_t i = 0; s->d && i < s->n; i++) dialogue_free(&s->d[i]);
  free(s->d);
  *s = (dialogue_set){0};
}
