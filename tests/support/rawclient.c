/* rawclient.c - see rawclient.h. */
#include "rawclient.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "commitkv/status.h"
#include "shm/fdpass.h"

static char last_text[1024];

static void note_text(ckv_raw *r, const char *message) {
  snprintf(r->msg, sizeof(r->msg), "%s", message ? message : "");
  snprintf(last_text, sizeof(last_text), "%s", r->msg);
}

const char *ckv_raw_last_text(void) { return last_text; }

void ckv_raw_init(ckv_raw *r) {
  memset(r, 0, sizeof(*r));
  r->attach_fd = -1;
}

void ckv_raw_done(ckv_raw *r) {
  if (r->dealer) zmq_close(r->dealer);
  if (r->zctx) zmq_ctx_term(r->zctx);
  if (r->attach_fd >= 0) close(r->attach_fd);
  ckv_raw_init(r);
}

int ckv_raw_attach_send(int fd, const char *name, bool want_arenas, bool refresh) {
  Commitkv__V1__AttachRequest req = COMMITKV__V1__ATTACH_REQUEST__INIT;
  req.version = 1;
  req.client_name = (char *)name;
  req.want_arenas = want_arenas;
  req.refresh = refresh;
  uint8_t buf[CKV_RAW_FRAME_MAX];
  if (commitkv__v1__attach_request__get_packed_size(&req) > sizeof(buf)) return CKV_ERR_TOO_LARGE;
  size_t len = commitkv__v1__attach_request__pack(&req, buf);
  return ckv_frame_send(fd, buf, len, NULL, 0);
}

int ckv_raw_attach_recv(int fd, Commitkv__V1__AttachReply **ret) {
  if (ret) *ret = NULL;
  uint8_t buf[CKV_RAW_FRAME_MAX];
  size_t len = 0;
  int fds[CKV_FRAME_MAX_FDS];
  size_t n_fds = 0;
  int rc = ckv_frame_recv(fd, buf, sizeof(buf), &len, fds, CKV_FRAME_MAX_FDS, &n_fds);
  if (rc < 0) return rc;
  for (size_t i = 0; i < n_fds; i++) close(fds[i]);
  Commitkv__V1__AttachReply *rep = commitkv__v1__attach_reply__unpack(NULL, len, buf);
  if (!rep) return CKV_RAW_BAD_REPLY;
  int code = rep->code;
  if (ret)
    *ret = rep;
  else
    commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  return code;
}

int ckv_raw_attach_answer(int fd, char *text, size_t cap) {
  Commitkv__V1__AttachReply *rep = NULL;
  int code = ckv_raw_attach_recv(fd, &rep);
  if (rep && text) snprintf(text, cap, "%s", rep->message ? rep->message : "");
  if (rep) commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  return code;
}

int ckv_raw_attach(ckv_raw *r, const char *path, const char *name) {
  r->name = name;
  int rc = ckv_unix_connect(path, &r->attach_fd);
  if (rc < 0) return rc;
  ckv_sock_set_timeout(r->attach_fd, CKV_RAW_TIMEOUT_MS);
  rc = ckv_raw_attach_send(r->attach_fd, name, false, false);
  if (rc < 0) return rc;
  Commitkv__V1__AttachReply *rep = NULL;
  rc = ckv_raw_attach_recv(r->attach_fd, &rep);
  if (!rep) return rc;
  note_text(r, rep->message);
  if (r->inspect) r->inspect(r, &rep->base, r->inspect_ctx);
  if (rc == 0 && rep->attach_key.len == sizeof(r->key)) {
    memcpy(r->key, rep->attach_key.data, sizeof(r->key));
    snprintf(r->tenant, sizeof(r->tenant), "%s", rep->tenant ? rep->tenant : "");
  } else if (rc == 0) {
    rc = CKV_ERR_PROTO;
  }
  commitkv__v1__attach_reply__free_unpacked(rep, NULL);
  return rc;
}

int ckv_raw_dealer(ckv_raw *r, const char *endpoint, const void *id, size_t id_len) {
  r->zctx = zmq_ctx_new();
  if (!r->zctx) return -1;
  r->dealer = zmq_socket(r->zctx, ZMQ_DEALER);
  if (!r->dealer) return -1;
  int zero = 0;
  zmq_setsockopt(r->dealer, ZMQ_LINGER, &zero, sizeof(zero));
  if (id && zmq_setsockopt(r->dealer, ZMQ_ROUTING_ID, id, id_len) != 0) return -1;
  return zmq_connect(r->dealer, endpoint) == 0 ? 0 : -1;
}

int ckv_raw_send(ckv_raw *r, const void *const *frames, const size_t *lens, int n) {
  for (int i = 0; i < n; i++)
    if (zmq_send(r->dealer, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0) return -zmq_errno();
  return 0;
}

int ckv_raw_send_request(ckv_raw *r, Commitkv__V1__Request *req) {
  static uint64_t next_id = 1;
  if (!req->version) req->version = 1;
  req->request_id = next_id++;
  size_t len = commitkv__v1__request__get_packed_size(req);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return -ENOMEM;
  commitkv__v1__request__pack(req, buf);
  int rc = ckv_raw_send(r, (const void *const[]){buf}, &len, 1);
  free(buf);
  return rc;
}

int ckv_raw_recv(ckv_raw *r, int timeout_ms, Commitkv__V1__Response **ret) {
  if (ret) *ret = NULL;
  zmq_pollitem_t it = {.socket = r->dealer, .events = ZMQ_POLLIN};
  if (zmq_poll(&it, 1, timeout_ms) <= 0) return CKV_RAW_NO_REPLY;
  Commitkv__V1__Response *rep = NULL;
  int more = 1;
  r->frames = 0;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, r->dealer, 0) < 0) {
      zmq_msg_close(&m);
      break;
    }
    r->frames++;
    more = zmq_msg_more(&m);
    if (!more) rep = commitkv__v1__response__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
    zmq_msg_close(&m);
  }
  if (!rep) return CKV_RAW_BAD_REPLY;
  int code = rep->code;
  r->request_id = rep->request_id;
  note_text(r, rep->message);
  if (r->inspect) r->inspect(r, &rep->base, r->inspect_ctx);
  if (ret)
    *ret = rep;
  else
    commitkv__v1__response__free_unpacked(rep, NULL);
  return code;
}
