/* dialogue_run.h - the agent-dialogue run (dialogue_run.c) as a call, so
 * commitkv-dialogue and commitkv-llm --dialogues are the same program. */
#ifndef CKV_EXAMPLES_LLM_DIALOGUE_RUN_H
#define CKV_EXAMPLES_LLM_DIALOGUE_RUN_H

/* Runs commitkv-dialogue with its command line (argv[0] the program name;
 * the options of dialogue_run.c's usage).  The exit status: 0 success, 1 a
 * runtime failure, 2 bad arguments or a bad dialogue file. */
int ckv_dialogue_main(int argc, char **argv);

#endif
