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
 * confirmation. */
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

Test(dialogues, turns_holding_a_recalled_value_are_labelled_facts) {
  char path[] = "/tmp/ckv-test-dialogues-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  cr_assert(f);
  cr_assert(fputs(k_line, f) >= 0);
  cr_assert(fclose(f) == 0);
  dialogue_set set = {0};
  char err[256] = "";
  int e = dialogue_set_load(path, 0, &set, err, sizeof(err));
  unlink(path);
  cr_assert_eq(e, 0, "load: %s", err);
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
