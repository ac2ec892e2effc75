/* test_copy_signal.c - examples/llm/copy_signal.c: both turns of a copy are
 * raised, and nothing else is.
 *
 * Streams are written by hand: each token with its surprisal as a worker's
 * logits would give it.  A turn says an n-gram the model could not predict
 * (10+ nats in all), a later turn says it again predicted (under 1 nat):
 * both turns are raised, the turns between are not; the same n-gram
 * predicted at its first occurrence raises nothing; a copy inside one turn,
 * or across the frame (a turn's first token), raises nothing; a judged turn
 * is never raised but is still copied from; a position seen again (a
 * re-prefill) changes nothing. */
#include <criterion/criterion.h>
#include <string.h>

#include "commitkv/status.h"
#include "examples/llm/copy_signal.h"

#define NATS 10.0f
#define COPY_NATS 1.0f

typedef struct stream {
  llm_copy_signal *c;
  uint64_t pos;
  unsigned raised; /* turns raised so far */
} stream;

/* Appends the bytes of text as one turn (its first byte opens it), each with
 * surprisal s; judged: the turn is someone else's to score. */
static void turn(stream *st, const char *text, float s, bool judged) {
  for (size_t i = 0; text[i]; i++)
    st->raised += llm_copy_signal_add(st->c, st->pos++, (uint8_t)text[i], s, i == 0, judged);
}

/* Whether every position of [from, to) is raised (want 1) or none is (want 0). */
static void expect_raised(const stream *st, uint64_t from, uint64_t to, int want, const char *what) {
  const uint8_t *r = llm_copy_signal_raised(st->c);
  for (uint64_t p = from; p < to; p++) cr_expect_eq(r[p], want, "%s: position %lu raised %d", what, (unsigned long)p, r[p]);
}

static stream open_stream(void) {
  stream st = {0};
  cr_assert_eq(llm_copy_signal_new(1024, NATS, COPY_NATS, &st.c), CKV_OK);
  return st;
}

Test(copy_signal, both_turns_of_a_copy_are_raised_and_nothing_else) {
  stream st = open_stream();
  turn(&st, "U: rania schmidt.\n", 4.0f, false); /* 5 bytes at 4 nats: 20 nats, surprising */
  uint64_t a = st.pos;
  turn(&st, "A: nice weather\n", 0.5f, false); /* predicted, but never said before */
  uint64_t b = st.pos;
  cr_expect_eq(st.raised, 0, "nothing copied yet");
  turn(&st, "A: under rania schmidt.\n", 0.1f, false);
  cr_expect_eq(st.raised, 2, "the source and the copy");
  expect_raised(&st, 0, a, 1, "the turn copied from");
  expect_raised(&st, a, b, 0, "the turn between");
  expect_raised(&st, b, st.pos, 1, "the copying turn");
  turn(&st, "U: ok\n", 0.1f, false);
  expect_raised(&st, b + 24, st.pos, 0, "a later turn");
  llm_copy_signal_free(st.c);
}

Test(copy_signal, a_predicted_first_occurrence_is_no_source) {
  stream st = open_stream();
  turn(&st, "U: the weather is nice\n", 1.5f, false); /* 5 bytes at 1.5: 7.5 nats, below NATS */
  turn(&st, "A: the weather is nice\n", 0.1f, false);
  cr_expect_eq(st.raised, 0);
  expect_raised(&st, 0, st.pos, 0, "small talk said twice");
  llm_copy_signal_free(st.c);
}

Test(copy_signal, copies_within_a_turn_or_across_the_frame_do_not_count) {
  stream st = open_stream();
  /* within one turn: surprising, then the same bytes predicted */
  turn(&st, "U: qzxwv ", 5.0f, false);
  for (const char *p = "qzxwv\n"; *p; p++) /* the same turn goes on */
    st.raised += llm_copy_signal_add(st.c, st.pos++, (uint8_t)*p, 0.1f, false, false);
  cr_expect_eq(st.raised, 0, "a turn repeating itself");
  /* the frame: "U: W" opens a turn surprising, later ones predicted */
  turn(&st, "U: W\n", 6.0f, false);
  turn(&st, "U: W\n", 0.1f, false);
  cr_expect_eq(st.raised, 0, "a turn's opening bytes");
  llm_copy_signal_free(st.c);
}

Test(copy_signal, a_judged_turn_is_copied_from_but_never_raised) {
  stream st = open_stream();
  turn(&st, "U: kxeicb code\n", 4.0f, true);
  uint64_t a = st.pos;
  turn(&st, "A: code kxeicb\n", 0.1f, false);
  cr_expect_eq(st.raised, 1, "only the copying turn");
  expect_raised(&st, 0, a, 0, "the judged source");
  expect_raised(&st, a, st.pos, 1, "the copying turn");
  /* a re-prefill sends positions again: nothing changes */
  cr_expect_eq(llm_copy_signal_add(st.c, 3, 'k', 0.0f, false, false), 0);
  expect_raised(&st, 0, a, 0, "after a position came again");
  llm_copy_signal_free(st.c);
}

Test(copy_signal, bad_sizes_are_refused) {
  llm_copy_signal *c = (llm_copy_signal *)1;
  cr_expect_eq(llm_copy_signal_new(0, NATS, COPY_NATS, &c), CKV_ERR_INVALID);
  cr_expect_null(c);
}
