/* held.c - replies held until their change is durable (see held.h). */
#include "daemon/held.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strmap.h"
#include "daemon/reply.h"
#include "persist/warmjournal.h"
#include "store/session.h"
#include "store/store.h"
#include "store/tenant.h"

struct ckv_held_reply {
  struct ckv_held_reply *next;
  ckv_reply_to to;
  char key[CKV_HELD_KEY_MAX]; /* "tenant/id" of the session whose change it
                                 acknowledges */
  uint64_t need;              /* the journal batch that may cover it (warmjournal.h) */
  size_t len;
  uint8_t data[]; /* the packed reply */
};

void ckv_held_note(ckv_server *s, const ckv_srv_session *sess) {
  uint64_t need = ckv_warm_journal_need(&s->persist, sess);
  if (!need) return;
  ckv_store_session_key(sess->tenant, sess->id, s->hold_key, sizeof s->hold_key);
  s->hold_need = need;
}

void ckv_held_clear(ckv_server *s) {
  s->hold_need = 0;
  s->hold_key[0] = 0;
}

bool ckv_held_take(ckv_server *s, const ckv_reply_to *to, ckv_conn *c, Commitkv__V1__Response *rep) {
  uint64_t need = s->hold_need;
  char key[CKV_HELD_KEY_MAX];
  memcpy(key, s->hold_key, sizeof key);
  ckv_held_clear(s);
  if (!need || rep->code != 0 || !c) return false;
  if (ckv_warm_journal_covers(&s->persist, key, need)) return false;
  size_t len = commitkv__v1__response__get_packed_size(rep);
  struct ckv_held_reply *h = malloc(sizeof(*h) + len);
  if (!h) {
    ckv_log(CKV_LOG_ERROR, "reply-not-held", c->tenant ? c->tenant->name : NULL, NULL,
            "out of memory holding a reply until its change is durable: sent now");
    return false;
  }
  commitkv__v1__response__pack(rep, h->data);
  h->len = len;
  h->to = *to;
  h->need = need;
  memcpy(h->key, key, sizeof key);
  h->next = NULL;
  *s->held_tail = h;
  s->held_tail = &h->next;
  s->n_held++;
  c->io_inflight++; /* waiting for the disk, not silent: the lease holds */
  return true;
}

/* Sends h (if its client is still there) and frees it. */
static void send_one(ckv_server *s, struct ckv_held_reply *h) {
  ckv_conn *c = ckv_strmap_get(s->conns, h->to.keyhex);
  if (c && c->id == h->to.conn_id) {
    c->io_inflight--;
    ckv_reply_send_packed(s, c->key, CKV_KEY_BYTES, h->to.delim, c, h->data, h->len);
  }
  free(h);
}

void ckv_held_release(ckv_server *s) {
  struct ckv_held_reply **at = &s->held_head;
  while (*at) {
    struct ckv_held_reply *h = *at;
    if (!ckv_warm_journal_covers(&s->persist, h->key, h->need)) {
      at = &h->next;
      continue;
    }
    *at = h->next;
    s->n_held--;
    send_one(s, h);
  }
  s->held_tail = at;
}

size_t ckv_held_count(const ckv_server *s) { return s->n_held; }

void ckv_held_free(ckv_server *s) {
  if (s->n_held)
    ckv_log(CKV_LOG_WARNING, "reply-not-sent", NULL, NULL,
            "%zu repl%s held for the warm journal not sent at the stop: the "
            "journal could not write their change "
            "(the clients retry after the restart)",
            s->n_held, s->n_held == 1 ? "y" : "ies");
  while (s->held_head) {
    struct ckv_held_reply *h = s->held_head;
    s->held_head = h->next;
    ckv_conn *c = s->conns ? ckv_strmap_get(s->conns, h->to.keyhex) : NULL;
    if (c && c->id == h->to.conn_id) c->io_inflight--;
    free(h);
  }
  s->n_held = 0;
  s->held_tail = &s->held_head;
}
