/* test_dialogues.c - examples/llm/dialogues.c: what commitkv-dialogue reads
 * off a dialogue.  dialogue_turn_holds_fact, the labels of --semantic
 * oracle: on the first public dialogue's shape (tools/agentlm's booking
 * task) the turns that state a recalled value (the request's date and city,
 * the user's name, the tool's result, the confirmation, the answers) hold a
 * fact; the questions, chit-chat and filler do not; the answer's first word
 * ("The", "Your"), one-byte words and values of facts nobody is asked about
 * never count.  dialogue_turn_names_entity, the labels of --semantic
 * entities, from the text alone: every turn that holds a recalled value
 * names an entity, and so do statements nobody asks about; and
 * dialogue_turn_restates: the confirmation restates the name, a repeated
 * answer restates the one before, the name does not restate the
 * confirmation; dialogue_entity_label: which turns are facts, which the
 * confirmation supersedes and which only copy a held turn. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "examples/llm/dialogues.h"

static const char k_line[] =
    "{\"id\": \"t0\", \"turns\": ["
    "{\"role\": \"S\", \"text\": \"You are a helpful booking assistant. Answer questions from the conversation.\"},"
    "{\"role\": \"U\", \"text\": \"Book me a flight to Oslo on August 23.\"},"
    "{\"role\": \"A\", \"text\": \"Who is the passenger?\"},"
    "{\"role\": \"U\", \"text\": \"Dmitri Silva.\"},"
    "{\"role\": \"T\", \"text\": \"flight_search: Oslo August 23 seats=ok\"},"
    "{\"role\": \"A\", \"text\": \"Confirmed. The passenger is Dmitri Silva. Your ticket number is FR7907.\"},"
    "{\"role\": \"U\", \"text\": \"Who is the passenger?\"},"
    "{\"role\": \"A\", \"text\": \"The passenger is Dmitri Silva.\"},"
    "{\"role\": \"U\", \"text\": \"What do you think about cats?\"},"
    "{\"role\": \"A\", \"text\": \"Cats are curious and independent. Many people love them.\"},"
    "{\"role\": \"U\", \"text\": \"What date is the flight?\"},"
    "{\"role\": \"A\", \"text\": \"The flight is on August 23.\"},"
    "{\"role\": \"U\", \"text\": \"got it\"},"
    "{\"role\": \"A\", \"text\": \"Your ticket number is FR7907.\"}"
    "], \"recall\": ["
    "{\"turn\": 7, \"question_turn\": 6, \"answer\": \"The passenger is Dmitri Silva.\"},"
    "{\"turn\": 11, \"question_turn\": 10, \"answer\": \"The flight is on August 23.\"}"
    "]}\n";

/* k_line loaded through a file, as commitkv-dialogue reads it. */
static void load_k_line(dialogue_set *set) {
  char path[] = "/tmp/ckv-test-dialogues-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  cr_assert(f);
  cr_assert(fputs(k_line, f) >= 0);
  cr_assert(fclose(f) == 0);
  char err[256] = "";
  int e = dialogue_set_load(path, 0, set, err, sizeof(err));
  unlink(path);
  cr_assert_eq(e, 0, "load: %s", err);
}

Test(dialogues, turns_holding_a_recalled_value_are_labelled_facts) {
  dialogue_set set = {0};
  load_k_line(&set);
  cr_assert_eq(set.n, 1);
  const dialogue *d = &set.d[0];
  cr_assert_eq(d->n_turns, 14);
  /* the ticket number (turns 5 and 13) is never asked about: turn 13 holds no
   * asked value, turn 5 holds the name */
  static const bool want[14] = {false, true, false, true, true, true, false,
                                true,  false, false, false, true, false, false};
  for (size_t t = 0; t < d->n_turns; t++)
    cr_expect_eq(dialogue_turn_holds_fact(d, t), want[t], "turn %zu (%.*s): want %d", t, (int)d->turns[t].len,
                 d->turns[t].text, want[t]);
  cr_expect(!dialogue_turn_holds_fact(d, d->n_turns), "a turn past the end holds nothing");
  /* entities from the text: the fact turns and the ticket number nobody asks about (13); never the questions,
   * the chit-chat ("Many" starts a sentence), "got it" or the system prompt ("Answer" starts one) */
  static const bool entity[14] = {false, true, false, true, true, true, false,
                                  true,  false, false, false, true, false, true};
  for (size_t t = 0; t < d->n_turns; t++)
    cr_expect_eq(dialogue_turn_names_entity(&d->turns[t]), entity[t], "turn %zu (%.*s): want %d", t,
                 (int)d->turns[t].len, d->turns[t].text, entity[t]);
  const dialogue_turn *tu = d->turns;
  cr_expect(dialogue_turn_restates(&tu[5], &tu[3]), "the confirmation restates \"Dmitri Silva.\"");
  cr_expect(!dialogue_turn_restates(&tu[3], &tu[5]), "the name alone does not restate the confirmation");
  cr_expect(dialogue_turn_restates(&tu[11], &tu[1]) == false, "the date answer lacks Oslo");
  cr_expect(dialogue_turn_restates(&tu[13], &tu[5]) == false, "the ticket answer lacks the name");
  cr_expect(dialogue_turn_restates(&tu[7], &tu[7]), "a turn restates itself");
  cr_expect(!dialogue_turn_restates(&tu[5], &tu[6]), "a turn with no entity is restated by nothing");
  dialogue_set_free(&set);
}

/* The entity scorer's labels, turn by turn: the confirmation (5) supersedes the name (3); the answers (7, 11)
 * and the repeated ticket number (13) only repeat a held turn that says more, so they are copies; the tool's
 * result (4) says all the request (1) says and no less, so both stay facts.  With copies kept, they are facts. */
Test(dialogues, answers_that_repeat_a_held_turn_are_copies) {
  dialogue_set set = {0};
  load_k_line(&set);
  const dialogue *d = &set.d[0];
  cr_assert_eq(d->n_turns, 14);
#define O DIALOGUE_OTHER
#define F DIALOGUE_FACT
#define K DIALOGUE_COPY
  static const dialogue_label want[14] = {O, F, O, F, F, F, O, K, O, O, O, K, O, K};
  static const bool held_at_end[14] = {false, true, false, false, true, true, false,
                                       false, false, false, false, false, false, false};
  for (int copies_cold = 1; copies_cold >= 0; copies_cold--) {
    bool held[14] = {false}, superseded[14];
    for (size_t t = 0; t < d->n_turns; t++) {
      dialogue_label l = dialogue_entity_label(d, t, held, superseded, copies_cold);
      dialogue_label w = !copies_cold && want[t] == K ? F : want[t];
      cr_expect_eq(l, w, "copies_cold %d: turn %zu (%.*s) labelled %d, want %d", copies_cold, t,
                   (int)d->turns[t].len, d->turns[t].text, l, w);
      for (size_t k = 0; k < t; k++)
        cr_expect_eq(superseded[k], t == 5 && k == 3, "copies_cold %d: turn %zu superseded turn %zu", copies_cold, t, k);
    }
    for (size_t t = 0; copies_cold && t < d->n_turns; t++)
      cr_expect_eq(held[t], held_at_end[t], "turn %zu held %d at the end", t, held[t]);
  }
#undef O
#undef F
#undef K
  dialogue_set_free(&set);
}
