/* daemon/config_tenant.c - the [tenant.NAME] sections: adding them, finding
 * the tenant a peer belongs to, and the shares of the daemon's limits that a
 * tenant gets when it sets none of its own. */
#include "daemon/config_table.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commitkv/status.h"
#include "store/tenant.h"

bool ckv_cfg_valid_tenant_name(const char *n) {
  size_t len = strlen(n);
  if (len < 1 || len >= CKV_TENANT_NAME_MAX)
    return false;
  for (size_t i = 0; i < len; i++)
    if (!(islower((unsigned char)n[i]) || isdigit((unsigned char)n[i]) ||
          n[i] == '_' || n[i] == '-'))
      return false;
  return true;
}

ckv_tenant_config *ckv_cfg_find_tenant(const ckv_config *c, const char *name) {
  for (size_t i = 0; i < c->n_tenants; i++)
    if (strcmp(c->tenants[i].name, name) == 0)
      return &c->tenants[i];
  return NULL;
}

/* Appends a tenant with defaults; name must be valid.  NULL on -ENOMEM or
 * when the tenant limit is reached (*ret_err says which). */
ckv_tenant_config *ckv_cfg_add_tenant(ckv_config *c, const char *name,
                                      int *ret_err) {
  if (c->n_tenants >= CKV_CONFIG_MAX_TENANTS) {
    *ret_err = CKV_ERR_LIMIT;
    return NULL;
  }
  ckv_tenant_config *t = realloc(c->tenants, (c->n_tenants + 1) * sizeof *t);
  if (!t) {
    *ret_err = -ENOMEM;
    return NULL;
  }
  c->tenants = t;
  t = &c->tenants[c->n_tenants++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  ckv_cfg_apply_defaults(SEC_TENANT, t);
  return t;
}

const ckv_tenant_config *ckv_config_tenant_by_name(const ckv_config *c,
                                                   const char *name) {
  return name ? ckv_cfg_find_tenant(c, name) : NULL;
}

const ckv_tenant_config *ckv_config_tenant_for(const ckv_config *c,
                                               uint32_t uid, uint32_t gid) {
  for (size_t i = 0; i < c->n_tenants; i++)
    for (size_t j = 0; j < c->tenants[i].n_uids; j++)
      if (c->tenants[i].uids[j] == uid)
        return &c->tenants[i];
  for (size_t i = 0; i < c->n_tenants; i++)
    for (size_t j = 0; j < c->tenants[i].n_gids; j++)
      if (c->tenants[i].gids[j] == gid)
        return &c->tenants[i];
  return NULL;
}

bool ckv_tenant_allows_policy(const ckv_tenant_config *t, int policy) {
  return t && policy >= 0 && policy < CKV_POLICY_COUNT &&
         (t->policies & (UINT32_C(1) << policy));
}

int ckv_tenant_default_policy(const ckv_config *c, const ckv_tenant_config *t) {
  return (t && t->default_policy >= 0) ? t->default_policy
                                       : c->policy.default_policy;
}

int ckv_config_ensure_default_tenant(ckv_config *c, uint32_t own_uid) {
  if (c->n_tenants > 0)
    return 0;
  int r = 0;
  ckv_tenant_config *t = ckv_cfg_add_tenant(c, "default", &r);
  if (!t)
    return r == -ENOMEM ? -ENOMEM : r;
  t->uids[t->n_uids++] = own_uid;
  if (own_uid != 0)
    t->uids[t->n_uids++] = 0;
  return 1;
}

uint32_t ckv_tenant_max_clients(const ckv_config *c,
                                const ckv_tenant_config *t) {
  uint32_t ceiling = c->max_clients;
  if (t && t->max_clients)
    return t->max_clients < ceiling ? t->max_clients : ceiling;
  size_t n = c->n_tenants ? c->n_tenants : 1;
  uint32_t share = (uint32_t)(ceiling / n);
  return share ? share : 1;
}

uint64_t ckv_tenant_memory_share(const ckv_config *c,
                                 const ckv_tenant_config *t) {
  if (t && t->quota)
    return ckv_tenant_arena_for_quota(t->quota);
  uint64_t reserved = 0;
  size_t shares = 0;
  for (size_t i = 0; i < c->n_tenants; i++) {
    if (c->tenants[i].quota) {
      uint64_t a = ckv_tenant_arena_for_quota(c->tenants[i].quota);
      reserved = reserved + a < reserved ? UINT64_MAX : reserved + a;
    } else {
      shares++;
    }
  }
  if (shares == 0)
    shares = 1; /* t is not in c: it would be the one */
  if (reserved >= c->memory)
    return 0;
  uint64_t share = (c->memory - reserved) / shares;
  return share / CKV_TENANT_ARENA_ALIGN * CKV_TENANT_ARENA_ALIGN;
}
