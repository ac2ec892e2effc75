/* packaging/gen_conf_man.c - build-time generator of commitkvd.conf(5).
 *
 * Copies the hand-written frame packaging/man/commitkvd.conf.5.in to the
 * output and replaces its line "@KEYS@" with the troff reference of every key
 * that ckv_config_write_docs() prints from the key table in daemon/config.c,
 * so the man page can never disagree with what the daemon accepts.
 *
 *   gen_conf_man IN OUT */
#include <stdio.h>
#include <string.h>

#include "daemon/config.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: gen_conf_man IN OUT\n");
    return 2;
  }
  FILE *in = fopen(argv[1], "r"), *out = fopen(argv[2], "w");
  if (!in || !out) {
    perror(!in ? argv[1] : argv[2]);
    return 1;
  }
  char line[4096];
  int keys = 0, rc = 0;
  while (fgets(line, sizeof(line), in)) {
    if (strcmp(line, "@KEYS@\n") == 0) {
      keys++;
      if (ckv_config_write_docs(out, CKV_CONFIG_DOC_MAN) < 0) rc = 1;
    } else {
      fputs(line, out);
    }
  }
  if (keys != 1) {
    fprintf(stderr, "gen_conf_man: %s: expected one @KEYS@ line, found %d\n", argv[1], keys);
    rc = 1;
  }
  if (ferror(in) || fclose(out) != 0) rc = 1;
  fclose(in);
  return rc;
}
