/* dialoguerun.h - commitkv-dialogue run by a test, its JSON report parsed.
 * Shared by test_dialogue and test_agentlm_model. */
#ifndef CKV_TEST_DIALOGUERUN_H
#define CKV_TEST_DIALOGUERUN_H

#include <jansson.h>

#include "testutil.h"

/* Runs argv (argv[0] "commitkv-dialogue", with --json) against d, its output
 * in d->dir/dialogue-<tag>.out, and returns the report: the last line that is
 * a JSON object.  When it fails, d is stopped first (nothing outlives the
 * test) and the test fails with the tool's output. */
json_t *ckv_test_dialogue_report(ckv_test_daemon *d, const char *const *argv, const char *tag, int timeout_ms);

#endif
