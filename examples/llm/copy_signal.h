/* copy_signal.h - which turns the model copies from: a signal from the
 * model, not from the text's look (issue 39).
 *
 * A fact is something the model could not predict when it was said and
 * reads again later: a name given, then confirmed; a code in a confirmation,
 * then in an answer.  The worker sees both halves in its own next-token
 * probabilities, on any model and any text:
 *  - an n-gram (LLM_COPY_NGRAM tokens) is *surprising* when the surprisal of
 *    its tokens (-ln p under the worker's logits) adds up to `nats`;
 *  - a *copy* is an n-gram the model predicted (adding up to less than
 *    `copy_nats`) that was surprising when another turn said it before: the
 *    model found it in its context, not in its weights (what induction heads
 *    do).  Only n-grams inside one turn and after its first token count:
 *    the role markers and turn boundaries are the dialogue's frame, said
 *    again every turn.
 * Both turns of a copy are raised: the one copied from and the one copying.
 * Surprise alone is not enough: chit-chat the model never saw costs it as
 * many nats as a name does (the public agent dialogues' small talk: 5-8
 * nats at its branching words) and is never read again.
 *
 * The signal lives in the worker (examples/llm/worker.c feeds it; the
 * dialogue front end turns it off for turns its text scorer judged). */
#ifndef CKV_EXAMPLES_LLM_COPY_SIGNAL_H
#define CKV_EXAMPLES_LLM_COPY_SIGNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLM_COPY_NGRAM 5 /* tokens a copy must match, the copied one last */

typedef struct llm_copy_signal llm_copy_signal;

/* A stream of at most `cap` tokens.  CKV_OK or -ENOMEM. */
int llm_copy_signal_new(size_t cap, float nats, float copy_nats, llm_copy_signal **ret);
void llm_copy_signal_free(llm_copy_signal *c);

/* Token `id` at position `pos` (positions come in order from 0; a position
 * already seen restarts the stream there), with surprisal `s`; `turn_start`:
 * it opens a turn; `judged`: that turn is someone else's to score, never
 * raised (its tokens are still matched against).  Returns how many turns
 * this token raised (0-2). */
unsigned llm_copy_signal_add(llm_copy_signal *c, uint64_t pos, uint32_t id, float s, bool turn_start, bool judged);

/* Per position: 1 when its turn is raised.  Valid until the next add. */
const uint8_t *llm_copy_signal_raised(const llm_copy_signal *c);

#endif
