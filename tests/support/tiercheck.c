/* tiercheck.c - see tiercheck.h. */
#include "tiercheck.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "client/rpc.h"
#include "commitkv.pb-c.h"
#include "commitkv/status.h"

Commitkv__V1__Response *ckv_test_list_sessions(ckv_client *c) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions l = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &l;
  Commitkv__V1__Response *rep = NULL;
  cr_assert_eq(ckv_rpc(c, &req, &rep), CKV_OK);
  cr_assert_not_null(rep->session_list, "ListSessions answered without a session list");
  return rep;
}

char *ckv_test_session_tier(ckv_client *c, const char *sid, char *buf, size_t len) {
  Commitkv__V1__Response *rep = ckv_test_list_sessions(c);
  snprintf(buf, len, "?");
  for (size_t i = 0; i < rep->session_list->n_sessions; i++)
    if (strcmp(rep->session_list->sessions[i]->session_id, sid) == 0)
      snprintf(buf, len, "%s", rep->session_list->sessions[i]->tier);
  ckv_rpc_free(rep);
  return buf;
}

bool ckv_test_tier_file_exists(const ckv_test_daemon *d, const char *id) {
  char top[512];
  snprintf(top, sizeof top, "%s/tier", d->dir);
  DIR *dir = opendir(top);
  if (!dir) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(dir))) {
    if (e->d_name[0] == '.') continue;
    char path[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/%s.ckvsnap", top, e->d_name, id);
    found = stat(path, &st) == 0;
  }
  closedir(dir);
  return found;
}
