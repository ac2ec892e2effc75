/* parked.c - requests waiting for their session or for room (see parked.h). */
#include "daemon/parked.h"

#include <errno.h>
#include <stdlib.h>

#include "commitkv/status.h"
#include "common/strmap.h"

typedef ckv_parked_req parked_req;
typedef struct ckv_parked ckv_parked;

typedef struct parked_list {
  parked_req *head, *tail;
} parked_list;

struct ckv_parked {
  ckv_strmap *by_session; /* "tenant/id" -> parked_list */
  parked_list room;       /* waiting for the pressure moves to land */
};

static ckv_parked *parked_of(ckv_server *s) {
  if (s->parked) return s->parked;
  ckv_parked *pk = calloc(1, sizeof(*pk));
  if (!pk || ckv_strmap_new(&pk->by_session) < 0) {
    free(pk);
    return NULL;
  }
  return s->parked = pk;
}

int ckv_parked_add(ckv_server *s, ckv_conn *c, const char *key, const Commitkv__V1__Request *req) {
  ckv_parked *pk = parked_of(s);
  if (!pk) return -ENOMEM;
  parked_list *l = &pk->room;
  if (key && !(l = ckv_strmap_get(pk->by_session, key))) {
    if (!(l = calloc(1, sizeof(*l)))) return -ENOMEM;
    if (ckv_strmap_put(pk->by_session, key, l) < 0) {
      free(l);
      return -ENOMEM;
    }
  }
  size_t len = commitkv__v1__request__get_packed_size(req);
  parked_req *p = malloc(sizeof(*p) + len);
  if (!p) return -ENOMEM; /* an empty list stays: taken by the next ready or the end */
  commitkv__v1__request__pack(req, p->data);
  p->len = len;
  p->next = NULL;
  p->to = s->reply_to;
  p->to.request_id = req->request_id;
  if (l->tail)
    l->tail->next = p;
  else
    l->head = p;
  l->tail = p;
  c->io_inflight++; /* waiting on the disk, not silent: the lease holds */
  s->reply_deferred = true;
  return CKV_REPLY_DEFERRED;
}

ckv_parked_req *ckv_parked_take(ckv_server *s, const char *key) {
  if (!s->parked) return NULL;
  if (!key) {
    parked_req *p = s->parked->room.head;
    s->parked->room = (parked_list){0};
    return p;
  }
  parked_list *l = ckv_strmap_del(s->parked->by_session, key);
  if (!l) return NULL;
  parked_req *p = l->head;
  free(l);
  return p;
}

static void free_list(parked_req *p) {
  while (p) {
    parked_req *next = p->next;
    free(p);
    p = next;
  }
}

void ckv_parked_free(ckv_server *s) {
  ckv_parked *pk = s->parked;
  if (!pk) return;
  size_t cur = 0;
  parked_list *l;
  while ((l = ckv_strmap_next(pk->by_session, &cur, NULL))) {
    free_list(l->head);
    free(l);
  }
  ckv_strmap_free(pk->by_session);
  free_list(pk->room.head);
  free(pk);
  s->parked = NULL;
}
