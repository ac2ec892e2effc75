/* dialogue.c - commitkv-dialogue: the public agent dialogues through a real
 * model whose KV cache lives in commitkvd, recall by exact match of its
 * greedy answers (examples/llm/dialogue_run.c has the whole story). */
#include "examples/llm/dialogue_run.h"

int main(int argc, char **argv) { return ckv_dialogue_main(argc, argv); }
