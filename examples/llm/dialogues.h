/* dialogues.h - the agent dialogues of ../shared/models/agent-dialogues.jsonl
 * (and of tools/agentlm/gen.py): reading the JSON-lines file, and what a
 * recall question is (its fact kind, how far back its fact was stated).
 *
 * One dialogue a line: {"id": str, "turns": [{"role": "S"|"U"|"A"|"T",
 * "text": str}], "recall": [{"turn": i, "question_turn": j, "answer": str}]}.
 * Rendered for a byte-level model as BOS, then the bytes of "R: text\n" per
 * turn; recall turn i is an assistant turn whose text repeats the fact's
 * sentence `answer`.  Positions below count BOS as position 0, as
 * tools/agentlm/data.py does, so distances match tools/agentlm/eval.py's.
 *
 * The file is not trusted: every field is type- and range-checked, texts
 * must be valid UTF-8 without NUL or newline (a newline would end a turn of
 * the rendering), and a failure names the line and the field. */
#ifndef CKV_EXAMPLES_LLM_DIALOGUES_H
#define CKV_EXAMPLES_LLM_DIALOGUES_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dialogue_turn {
  char role; /* 'S', 'U', 'A' or 'T' */
  char *text;
  size_t len;
} dialogue_turn;

typedef struct dialogue_recall {
  size_t turn, question_turn;
  char *answer;
  size_t len;
} dialogue_recall;

typedef struct dialogue {
  char *id;
  dialogue_turn *turns;
  size_t n_turns;
  dialogue_recall *recall;
  size_t n_recall;
} dialogue;

typedef struct dialogue_set {
  dialogue *d;
  size_t n;
} dialogue_set;

/* Reads the first `limit` dialogues of path (0: all) into *ret (free with
 * dialogue_set_free).  Blank lines are skipped.  On failure writes why into
 * err (naming the line) and returns CKV_ERR_INVALID (a malformed line),
 * -errno (open/read) or -ENOMEM; *ret is left empty. */
int dialogue_set_load(const char *path, size_t limit, dialogue_set *ret, char *err, size_t err_size);
void dialogue_set_free(dialogue_set *s);

/* Bytes of turn t's rendering "R: text\n". */
size_t dialogue_turn_bytes(const dialogue_turn *t);

/* Position of the first byte of turn t's rendering ('R'). */
size_t dialogue_turn_position(const dialogue *d, size_t t);

/* The recall entry answered by turn t, or NULL. */
const dialogue_recall *dialogue_recall_at(const dialogue *d, size_t t);

/* Whether turn t abandons the topic before it: a user turn that says so in
 * the words of the dialogues' topic shifts ("Forget that, let us do
 * something else.", "Never mind that, ..."; the file has no other marker). */
bool dialogue_turn_is_topic_shift(const dialogue_turn *t);

/* The fact kind of an answer sentence ("Your booking code is KX4821." ->
 * "booking_code"), from the task's fixed sentence forms (the table of
 * tools/agentlm/gen.py); "note" for the copy curriculum, else "other". */
const char *dialogue_fact_kind(const char *answer);

/* Where the fact was stated: the position of the last occurrence of the
 * answer sentence in the turns before the answer turn, earlier answers that
 * repeat it whole not counted (tools/agentlm/data.py's fact_offset).  -1 if
 * it was never stated. */
long dialogue_fact_position(const dialogue *d, const dialogue_recall *r);

/* Whether turn t holds a value of one of the dialogue's recalled facts: a
 * word of an answer sentence (split at spaces and . , ? !) of two or more
 * bytes that has a digit, or starts with a capital and is not the
 * sentence's first word ("The passenger is Dmitri Silva." -> Dmitri, Silva;
 * "Your ticket number is FR7907." -> FR7907).  Labels read off the answers,
 * which no worker knows in advance: commitkv-dialogue --semantic oracle
 * uses them to measure what bits by value could keep with a perfect
 * semantic signal, never as a policy's input. */
bool dialogue_turn_holds_fact(const dialogue *d, size_t t);

/* Whether turn t names an entity, as a worker can tell from the text alone:
 * a word (split at spaces and . , ? ! : ;) of two or more bytes that has a
 * digit, or starts with a capital without starting a sentence ("Oslo",
 * "August 23", "FR7907", the "Silva" of "Dmitri Silva.").  The names,
 * dates and ids that DESIGN.md's committed state is for; commitkv-dialogue
 * --semantic entities scores such turns as lasting facts. */
bool dialogue_turn_names_entity(const dialogue_turn *t);

/* Whether every entity word of turn `old` (dialogue_turn_names_entity's
 * words) appears in turn `later`: the later turn restates what the old one
 * said ("Dmitri Silva." restated by "Confirmed. ... The passenger is Dmitri
 * Silva.").  False when `old` names no entity. */
bool dialogue_turn_restates(const dialogue_turn *later, const dialogue_turn *old);

/* The entity scorer's label of a turn (dialogue_entity_label). */
typedef enum dialogue_label {
  DIALOGUE_OTHER, /* names no entity: filler */
  DIALOGUE_FACT,  /* names an entity no turn still held says with more: a lasting fact */
  DIALOGUE_COPY,  /* names only entities of one earlier held turn that says more: it adds nothing */
} dialogue_label;

/* Labels turn t of d from the text, given held[k] for every k < t (true: the
 * scorer still holds turn k as a fact).  An assistant turn that restates
 * every entity of a held turn supersedes it (a confirmation, an answer:
 * what later answers copy from); a user reading a booking back only checks
 * it, so only assistant turns supersede.  Superseded turns get
 * superseded[k] = true and held[k] = false (superseded may be NULL).  A
 * turn that supersedes nothing and whose entities are all in one held turn
 * that names more (an answer repeating one value of a confirmation, a
 * read-back) is a copy when copies_cold, else a fact.  Sets held[t]: a
 * fact. */
dialogue_label dialogue_entity_label(const dialogue *d, size_t t, bool *held, bool *superseded, bool copies_cold);

/* Distance buckets in bytes, as tools/agentlm/eval.py prints them. */
#define DIALOGUE_N_BUCKETS 5
/* Bucket index of a distance (DIALOGUE_N_BUCKETS - 1: unknown, dist < 0). */
int dialogue_distance_bucket(long dist);
const char *dialogue_bucket_name(int bucket);

#endif
