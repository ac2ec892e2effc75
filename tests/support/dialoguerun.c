/* dialoguerun.c - see dialoguerun.h. */
#include "dialoguerun.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *ckv_test_dialogue_report(ckv_test_daemon *d, const char *const *argv, const char *tag, int timeout_ms) {
  char out[512];
  snprintf(out, sizeof(out), "%s/dialogue-%s.out", d->dir, tag);
  int rc = ckv_test_wait(ckv_test_spawn(argv, out), timeout_ms);
  char *text = ckv_test_read_file(out);
  const char *obj = NULL;
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
    if (*p == '{') obj = p;
  json_t *j = rc == 0 && obj ? json_loads(obj, JSON_ALLOW_NUL, NULL) : NULL; /* "said" may hold byte 0 */
  if (!j) {
    ckv_test_daemon_stop(d);
    cr_assert_fail("commitkv-dialogue (%s) failed (%d): %s", tag, rc, text ? text : "(no output)");
  }
  free(text);
  return j;
}
