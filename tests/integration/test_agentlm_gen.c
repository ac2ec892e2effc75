/* test_agentlm_gen.c - tools/agentlm/gen.py, the generator of the agent LM's
 * training dialogues, keeps the task's rules.
 *
 * Runs tools/agentlm/check_gen.py (Python standard library only; no torch, so
 * `make deps` stays light) under /usr/bin/python3: it generates 200 dialogues
 * plus copy-curriculum samples and checks the public file's schema, the byte
 * bound of each rendering (BOS included), that every question asks a fact of a
 * live task and is answered with exactly the sentence that task confirmed,
 * that a seed repeats its output and another seed does not, and that no public
 * dialogue, confirming turn or tool turn of ../shared/models/agent-dialogues.jsonl
 * is produced (the public file is the evaluation set; when it is absent that
 * last part is skipped, and the test says so).  A second case checks that the
 * checker itself fails on a dialogue that breaks the rules.  Two more do the
 * same for tools/agentlm/variants.py (issue 39's robustness sets A-E):
 * check_variants.py, and that its variant-A check tells a base dialogue from
 * its variant. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define PYTHON "/usr/bin/python3"

static const char *source_dir(void) {
  const char *s = getenv("CKV_SOURCE_DIR");
  return s && *s ? s : ".";
}

/* Runs cmd through the shell; stdout+stderr in *ret_out (malloc'd); returns the exit status. */
static int run(const char *cmd, char **ret_out) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  cr_assert_not_null(p, "popen %s", cmd);
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap);
  cr_assert_not_null(buf);
  while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 2) {
      buf = realloc(buf, cap *= 2);
      cr_assert_not_null(buf);
    }
  }
  buf[len] = 0;
  int rc = pclose(p);
  *ret_out = buf;
  return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void python_or_skip(void) {
  if (access(PYTHON, X_OK) != 0) cr_skip_test(PYTHON " not found: tools/agentlm/gen.py NOT checked");
}

Test(agentlm_gen, dialogues_keep_the_rules_and_never_the_public_ones, .timeout = 120) {
  python_or_skip();
  char pub[2048], cmd[4096];
  const char *dir = getenv("CKV_MODEL_DIR");
  snprintf(pub, sizeof pub, "%s/agent-dialogues.jsonl", dir && *dir ? dir : "../shared/models");
  struct stat st;
  int have_public = stat(pub, &st) == 0;
  snprintf(cmd, sizeof cmd, PYTHON " %s/tools/agentlm/check_gen.py --count 200 --seed 7%s%s", source_dir(),
           have_public ? " --public " : "", have_public ? pub : "");
  char *out;
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "check_gen.py failed (exit %d):\n%s", rc, out);
  cr_assert(strstr(out, "check_gen: ok: 210 samples") != NULL, "unexpected output:\n%s", out);
  if (!have_public) {
    free(out);
    cr_skip_test("%s not found: generated dialogues were NOT compared with the public ones", pub);
  }
  cr_assert(strstr(out, "200 public dialogues disjoint") != NULL, "public file not compared:\n%s", out);
  free(out);
}

/* The checker must be able to fail: a dialogue that asks a fact after a topic
 * shift, one over the byte bound and one whose answer is not what the task
 * confirmed are each reported. */
Test(agentlm_gen, checker_reports_broken_dialogues, .timeout = 60) {
  python_or_skip();
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           PYTHON " -c '"
           "import sys; sys.path.insert(0, \"%s/tools/agentlm\"); import check_gen as c\n"
           "S={\"role\":\"S\",\"text\":\"sys\"}\n"
           "U=lambda t:{\"role\":\"U\",\"text\":t}\n"
           "A=lambda t:{\"role\":\"A\",\"text\":t}\n"
           "conf=A(\"Confirmed. The hotel is in Lyon. The stay is 3 nights.\")\n"
           "shift=[U(\"Forget that, let us do something else.\"), A(\"No problem.\")]\n"
           "q=[U(\"How many nights?\"), A(\"The stay is 3 nights.\")]\n"
           "d1={\"id\":\"after-shift\",\"turns\":[S,conf]+shift+q,\"recall\":[{\"turn\":5,\"question_turn\":4,"
           "\"answer\":\"The stay is 3 nights.\"}]}\n"
           "d2={\"id\":\"too-long\",\"turns\":[S,U(\"x\"*990)],\"recall\":[]}\n"
           "d3={\"id\":\"wrong\",\"turns\":[S,conf,U(\"How many nights?\"),A(\"The stay is 4 nights.\")],"
           "\"recall\":[{\"turn\":3,\"question_turn\":2,\"answer\":\"The stay is 4 nights.\"}]}\n"
           "d4={\"id\":\"ok\",\"turns\":[S,conf]+q,\"recall\":[{\"turn\":3,\"question_turn\":2,"
           "\"answer\":\"The stay is 3 nights.\"}]}\n"
           "for d in (d1,d2,d3,d4): print(d[\"id\"], len(c.check_sample(d, 1000)))\n"
           "'",
           source_dir());
  char *out;
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "python failed (exit %d):\n%s", rc, out);
  cr_assert(strstr(out, "after-shift 1\n") && strstr(out, "too-long 1\n") && strstr(out, "wrong 1\n") &&
                strstr(out, "ok 0\n"),
            "the checker missed a broken dialogue (or flagged a good one):\n%s", out);
  free(out);
}

/* tools/agentlm/variants.py (issue 39's robustness sets A-E) keeps the same
 * rules, is deterministic, and variant A hides every asked value from the
 * worker's text heuristic: check_variants.py on 60 generated dialogues. */
Test(agentlm_gen, variants_keep_the_rules_and_a_hides_the_facts, .timeout = 120) {
  python_or_skip();
  char cmd[4096];
  snprintf(cmd, sizeof cmd, PYTHON " %s/tools/agentlm/check_variants.py --count 60 --seed 7", source_dir());
  char *out;
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "check_variants.py failed (exit %d):\n%s", rc, out);
  cr_assert(strstr(out, "check_variants: ok: 60 dialogues") != NULL, "unexpected output:\n%s", out);
  free(out);
}

/* The A check must be able to fail: a base dialogue (digits and capitalised
 * names in its facts) is reported, its variant A is not. */
Test(agentlm_gen, variant_check_reports_visible_facts, .timeout = 60) {
  python_or_skip();
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           PYTHON " -c '"
           "import sys; sys.path.insert(0, \"%s/tools/agentlm\")\n"
           "import gen, variants, check_variants as c\n"
           "d = gen.sample(7, \"dialogue\", 0)\n"
           "print(\"base\", len(c.check_hidden(d, True)) > 0)\n"
           "print(\"A\", len(c.check_hidden(variants.transform(d, \"A\"), True)) > 0)\n"
           "'",
           source_dir());
  char *out;
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "python failed (exit %d):\n%s", rc, out);
  cr_assert(strstr(out, "base True\n") && strstr(out, "A False\n"), "the A check does not tell:\n%s", out);
  free(out);
}
