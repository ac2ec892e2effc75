/* tests/fuzz/fuzz_config.c - the config reader: the input is the INI file.
 *
 * The daemon's start and SIGHUP path: ckv_config_load_file over defaults,
 * ckv_config_finalize, the default tenant, the uid -> tenant mapping and
 * each tenant's shares; then a reload against the defaults (what changed,
 * what needs a restart, applying it).  A config that loads must also
 * survive `commitkvd --check-config`'s echo: ckv_config_write's text, read
 * back, loads and finalizes and writes the same text again (else an
 * operator's printed config would not start the daemon it came from). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"
#include "common/log.h"
#include "fuzz.h"
#include "fuzz_file.h"

static ckv_fuzz_file g_file;
static bool g_ready;

int ckv_fuzz_config_init(void) {
  if (g_ready) return 0;
  ckv_log_init("fuzz_config", CKV_LOG_TARGET_STDERR);
  ckv_log_set_level(getenv("CKV_FUZZ_VERBOSE") ? CKV_LOG_DEBUG : CKV_LOG_ERROR);
  ckv_fuzz_file_open(&g_file, "fuzz-config");
  g_ready = true;
  return 0;
}

static void ignore_change(void *ctx, const char *section, const char *key, const char *note) {
  (void)ctx;
  (void)section;
  (void)key;
  (void)note;
}

/* ckv_config_write into a string (caller frees). */
static char *written(const ckv_config *c, size_t *ret_len) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  CKV_FUZZ_CHECK(f, "open_memstream");
  int r = ckv_config_write(c, f);
  fclose(f);
  CKV_FUZZ_CHECK(r == 0, "ckv_config_write failed (%d) on a finalized config", r);
  *ret_len = len;
  return text;
}

int ckv_fuzz_config(const uint8_t *data, size_t size) {
  ckv_fuzz_config_init();
  ckv_fuzz_file_set(&g_file, data, size);
  ckv_config c;
  ckv_config_init_defaults(&c);
  char err[512];
  int r = ckv_config_load_file(&c, g_file.path, err, sizeof(err));
  if (r == 0) r = ckv_config_finalize(&c, err, sizeof(err));
  if (r == 0) r = ckv_config_check(&c, err, sizeof(err));
  if (r == 0) {
    CKV_FUZZ_CHECK(ckv_config_ensure_default_tenant(&c, 1000) >= 0, "default tenant");
    static const uint32_t ids[] = {0, 1, 1000, 65534, 4294967295u};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
      const ckv_tenant_config *t = ckv_config_tenant_for(&c, ids[i], ids[i]);
      if (!t) continue;
      (void)ckv_tenant_max_clients(&c, t);
      (void)ckv_tenant_memory_share(&c, t);
      (void)ckv_tenant_default_policy(&c, t);
      CKV_FUZZ_CHECK(ckv_config_tenant_by_name(&c, t->name) == t, "tenant '%s' not found by name", t->name);
    }
    /* A SIGHUP from the defaults to this file. */
    ckv_config live;
    ckv_config_init_defaults(&live);
    CKV_FUZZ_CHECK(ckv_config_finalize(&live, err, sizeof(err)) == 0, "defaults: %s", err);
    char diff[1024];
    (void)ckv_config_reload_changes(&live, &c, ignore_change, NULL);
    (void)ckv_config_reload_diff(&live, &c, diff, sizeof(diff));
    ckv_config_apply_reload(&live, &c);
    ckv_config_done(&live);

    /* The echo must read back as the same config. */
    size_t len1 = 0, len2 = 0;
    char *text1 = written(&c, &len1);
    ckv_config again;
    ckv_config_init_defaults(&again);
    char err2[512];
    int r2 = ckv_config_load_string(&again, text1, "written", err2, sizeof(err2));
    if (r2 == 0) r2 = ckv_config_finalize(&again, err2, sizeof(err2));
    CKV_FUZZ_CHECK(r2 == 0, "ckv_config_write's text does not load back: %s\n--- text:\n%s", err2, text1);
    CKV_FUZZ_CHECK(ckv_config_ensure_default_tenant(&again, 1000) >= 0, "default tenant");
    char *text2 = written(&again, &len2);
    CKV_FUZZ_CHECK(len1 == len2 && memcmp(text1, text2, len1) == 0,
                   "written config changes when read back\n--- first:\n%s\n--- second:\n%s", text1, text2);
    free(text1);
    free(text2);
    ckv_config_done(&again);
  }
  ckv_config_done(&c);
  return 0;
}
