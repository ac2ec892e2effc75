/* daemon/config_docs.c - what the key table writes: the commented default
 * file (packaging/commitkvd.conf, `commitkvd --config-template`), the
 * reference (`commitkvd --help-config`, commitkvd.conf(5)), and the quoting
 * both share with ckv_config_write. */
#include "daemon/config_table.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "daemon/config.h"
#include "lifecycle/policy.h"
#include "persist/remote.h"

/* ------------------------------------------------------------------------ */
/* The shipped default file and the reference docs                          */

void ckv_cfg_write_quoted(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    fputc(*s, out);
  }
  fputc('"', out);
}


int ckv_cfg_finish(FILE *out) { return (fflush(out) != 0 || ferror(out)) ? -EIO : CKV_OK; }

/* Wraps doc text into "# "-prefixed lines of at most ~78 columns. */
static void write_comment(FILE *out, const char *text) {
  const char *p = text;
  while (*p) {
    size_t take = strlen(p);
    if (take > 76) {
      take = 76;
      while (take > 0 && p[take] != ' ') take--;
      if (take == 0) take = strcspn(p, " ");
    }
    fprintf(out, "# %.*s\n", (int)take, p);
    p += take;
    while (*p == ' ') p++;
  }
}

static void write_template_section(FILE *out, section_kind sec) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &ckv_cfg_keys[i];
    if (k->section != sec) continue;
    char range[128];
    ckv_cfg_range_text(k, range, sizeof range);
    fputc('\n', out);
    write_comment(out, k->doc);
    fprintf(out, "# (%s%s)\n", range, k->reload ? "; reloaded on SIGHUP" : "");
    fprintf(out, "#%s = ", k->key);
    if (k->type == T_STRING)
      ckv_cfg_write_quoted(out, k->def);
    else
      fputs(k->def, out);
    fputc('\n', out);
  }
}

int ckv_config_write_template(FILE *out) {
  fputs("# /etc/commitkv/commitkvd.conf - configuration of commitkvd, the CommitKV daemon.\n"
        "#\n"
        "# Every key is listed with its default, commented out: uncomment and change\n"
        "# what you need.  Sizes take K, M, G, T suffixes (powers of 1024); durations\n"
        "# need a unit: ms, s, m, h, d.  Strings may be double-quoted.  Check a file\n"
        "# with `commitkvd --check-config FILE`; see commitkvd.conf(5).\n"
        "# Attention thresholds are relative: 1.0 is the share of an average token.\n"
        "# Generated from the key table in daemon/config.c; keep them in step.\n\n"
        "[daemon]\n",
        out);
  write_template_section(out, SEC_DAEMON);
  fputs("\n[policy]\n", out);
  write_template_section(out, SEC_POLICY);
  fputs("\n# Tenants: one section per tenant, [tenant.NAME] with NAME of a-z, 0-9, '_', '-'.\n"
        "# A worker belongs to the tenant listing its uid, else the one listing its gid;\n"
        "# others are refused.  Without any tenant section, commitkvd serves its own\n"
        "# user and root as tenant \"default\".  Example:\n"
        "#\n"
        "#[tenant.NAME]\n",
        out);
  for (size_t i = 0; i < N_KEYS; i++) {
    const config_key *k = &ckv_cfg_keys[i];
    if (k->section != SEC_TENANT) continue;
    char range[128];
    ckv_cfg_range_text(k, range, sizeof range);
    fputs("#\n", out);
    write_comment(out, k->doc);
    fprintf(out, "# (%s%s)\n#%s = ", range, k->reload ? "; reloaded on SIGHUP" : "", k->key);
    if (k->type == T_STRING || k->def[0] == '\0')
      ckv_cfg_write_quoted(out, k->def);
    else
      fputs(k->def, out);
    fputc('\n', out);
  }
  return ckv_cfg_finish(out);
}

static const char *type_name(key_type t) {
  switch (t) {
    case T_STRING: return "string";
    case T_BOOL: return "bool";
    case T_U32:
    case T_U64: return "integer";
    case T_SIZE: return "size";
    case T_DURATION: return "duration";
    case T_DOUBLE: return "number";
    case T_ENUM: return "enum";
    case T_UIDS: return "user list";
    case T_GIDS: return "group list";
    case T_POLICIES: return "policy list";
  }
  return "?";
}

/* troff needs leading dots/quotes and backslashes escaped. */
static void write_man_text(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '\\')
      fputs("\\e", out);
    else if (*s == '-')
      fputs("\\-", out);
    else
      fputc(*s, out);
  }
}

int ckv_config_write_docs(FILE *out, ckv_config_doc_format format) {
  static const char *const headers[] = {[SEC_DAEMON] = "[daemon]", [SEC_POLICY] = "[policy]",
                                        [SEC_TENANT] = "[tenant.NAME]"};
  for (int s = SEC_DAEMON; s <= SEC_TENANT; s++) {
    if (format == CKV_CONFIG_DOC_MARKDOWN)
      fprintf(out, "%s### %s\n\n| key | type | default | range | reload | description |\n"
              "| --- | --- | --- | --- | --- | --- |\n", s ? "\n" : "", headers[s]);
    else
      fprintf(out, ".SH \"%s\"\n", headers[s]);
    for (size_t i = 0; i < N_KEYS; i++) {
      const config_key *k = &ckv_cfg_keys[i];
      if ((int)k->section != s) continue;
      char range[128];
      ckv_cfg_range_text(k, range, sizeof range);
      const char *def = k->def[0] ? k->def : "\"\"";
      if (format == CKV_CONFIG_DOC_MARKDOWN) {
        fprintf(out, "| `%s` | %s | `%s` | ", k->key, type_name(k->type), def);
        for (const char *r = range; *r; r++) { /* '|' would split the cell */
          if (*r == '|') fputs("\\|", out);
          else fputc(*r, out);
        }
        fprintf(out, " | %s | %s |\n", k->reload ? "yes" : "no", k->doc);
      } else {
        fprintf(out, ".TP\n.BR %s \" = \" \"", k->key);
        write_man_text(out, def);
        fputs("\"\n", out);
        write_man_text(out, k->doc);
        fprintf(out, " (%s; ", type_name(k->type));
        write_man_text(out, range);
        fprintf(out, "%s)\n", k->reload ? "; reloaded on SIGHUP" : "");
      }
    }
  }
  return ckv_cfg_finish(out);
}

