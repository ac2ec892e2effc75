/* reply.c - a reply finished and sent (see reply.h). */
#include "daemon/reply.h"

#include <string.h>
#include <zmq.h>

#include "commitkv/status.h"
#include "common/log.h"
#include "daemon/metrics.h"
#include "store/session.h"
#include "store/tenant.h"

void ckv_reply_finish(ckv_server *s, ckv_conn *c, Commitkv__V1__Response *rep) {
  rep->boot_token.data = s->boot_token;
  rep->boot_token.len = sizeof(s->boot_token);
  s->counters.requests++;
  /* Header shadows reach the arena before any reply can send a reader to them. */
  if (s->store.dirty_head) {
    int fr = ckv_srv_session_flush_all_meta(&s->store.dirty_head);
    if (fr < 0) {
      ckv_log(CKV_LOG_ERROR, "flush-failed", c && c->tenant ? c->tenant->name : NULL, NULL,
              "writing block headers to the arena failed: %s", ckv_strerror(fr));
      if (rep->code == 0) {
        rep->code = fr;
        rep->message = "the daemon could not write block headers to KV memory (device error); retry";
      }
    }
  }
  if (rep->code != 0) {
    s->counters.errors++;
    if (c && c->tenant) c->tenant->errors[ckv_metrics_error_index(rep->code)]++;
  }
  /* Every text a reply carries is valid UTF-8, whichever handler wrote it:
   * standard protobuf clients refuse the whole reply otherwise. */
  ckv_wire_fix_strings(&s->out, &rep->base);
}

/* Sends out (taken) as the last frame after [id][empty, when delim]. */
static void send_msg(ckv_server *s, const void *id, size_t id_len, bool delim, const ckv_conn *c, zmq_msg_t *out) {
  int rc = zmq_send(s->router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (rc >= 0 && delim) rc = zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (rc >= 0) rc = zmq_msg_send(out, s->router, ZMQ_DONTWAIT);
  if (rc < 0) {
    /* EHOSTUNREACH: the peer went away; EAGAIN: its queue is full. Either
     * way the reply is dropped, never the loop stalled. */
    ckv_log(CKV_LOG_DEBUG, "reply-dropped", c && c->tenant ? c->tenant->name : NULL, NULL, "%s",
            zmq_strerror(zmq_errno()));
    zmq_msg_close(out);
  }
}

void ckv_reply_send_raw(ckv_server *s, const void *id, size_t id_len, bool delim, const ckv_conn *c,
                       Commitkv__V1__Response *rep) {
  size_t len = commitkv__v1__response__get_packed_size(rep);
  zmq_msg_t out;
  if (zmq_msg_init_size(&out, len) != 0) return;
  commitkv__v1__response__pack(rep, zmq_msg_data(&out));
  send_msg(s, id, id_len, delim, c, &out);
}

void ckv_reply_send_packed(ckv_server *s, const void *id, size_t id_len, bool delim, const ckv_conn *c,
                           const void *data, size_t len) {
  zmq_msg_t out;
  if (zmq_msg_init_size(&out, len) != 0) return;
  memcpy(zmq_msg_data(&out), data, len);
  send_msg(s, id, id_len, delim, c, &out);
}

void ckv_reply_send(ckv_server *s, const ckv_reply_to *to, ckv_conn *c, Commitkv__V1__Response *rep) {
  ckv_reply_send_raw(s, c->key, CKV_KEY_BYTES, to->delim, c, rep);
}
