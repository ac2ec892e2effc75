/* rawclient.h - a client of commitkvd built by hand, for the suites that
 * send what libcommitkv never would.
 *
 * The attach handshake is done here (AttachRequest over the unix socket, the
 * AttachReply's key), then a ZeroMQ DEALER whose routing id is that key
 * carries Requests packed with the generated protobuf-c code, one frame or
 * any frames the caller likes.  Nothing is checked beyond what a transport
 * must: the suites judge the replies (rawcheck.h holds the Criterion side).
 * Plain C; every process is real. */
#ifndef CKV_TEST_RAWCLIENT_H
#define CKV_TEST_RAWCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv.pb-c.h"

#define CKV_RAW_TIMEOUT_MS 5000 /* how long a call waits for its reply */
#define CKV_RAW_NO_REPLY 1      /* nothing came back in time */
#define CKV_RAW_BAD_REPLY 2     /* what came back does not decode */
#define CKV_RAW_FRAME_MAX 4096  /* the largest attach frame read */

typedef struct ckv_raw ckv_raw;

/* Sees every reply that decodes (the AttachReply, then each Response), with
 * the client it came to; a suite checks there what it checks of all replies. */
typedef void (*ckv_raw_inspect_fn)(const ckv_raw *r, const ProtobufCMessage *m, void *ctx);

struct ckv_raw {
  int attach_fd; /* the attach connection: closing it ends the client */
  void *zctx, *dealer;
  uint8_t key[16];   /* the attach key, the DEALER's routing id */
  char tenant[64];   /* as the AttachReply named it */
  const char *name;  /* client_name sent at attach (and in Hello) */
  char msg[1024];    /* message of the last reply */
  uint64_t request_id; /* request_id of the last Response */
  int frames;        /* frames of the last Response's message */
  ckv_raw_inspect_fn inspect; /* may be NULL */
  void *inspect_ctx;
};

/* A client with nothing open (raw_done's state). */
void ckv_raw_init(ckv_raw *r);
/* Closes what is open and returns to ckv_raw_init's state. */
void ckv_raw_done(ckv_raw *r);

/* The attach handshake on `path` as `name` (no arenas).  Returns the
 * AttachReply's code (CKV_ERR_PROTO when it holds no key), a transport error
 * or CKV_RAW_BAD_REPLY.  The connection stays open: it is the client's life. */
int ckv_raw_attach(ckv_raw *r, const char *path, const char *name);
/* A DEALER on `endpoint` with routing id `id` (NULL: ZeroMQ's own).  0 or -1. */
int ckv_raw_dealer(ckv_raw *r, const char *endpoint, const void *id, size_t id_len);

/* Sends `n` frames as one message: 0 or a negated errno. */
int ckv_raw_send(ckv_raw *r, const void *const *frames, const size_t *lens, int n);
/* Packs `req` (version 1 unless set, a fresh request_id written back into
 * it) and sends it as one frame: 0 or a negated errno. */
int ckv_raw_send_request(ckv_raw *r, Commitkv__V1__Request *req);
/* Waits up to timeout_ms for one message; its last frame is the Response.
 * Returns its code, CKV_RAW_NO_REPLY or CKV_RAW_BAD_REPLY; *ret (may be
 * NULL) gets the decoded Response (free with
 * commitkv__v1__response__free_unpacked), NULL when none. */
int ckv_raw_recv(ckv_raw *r, int timeout_ms, Commitkv__V1__Response **ret);

/* The text of the last reply any client of this process decoded (for
 * failure messages and checks on the latest answer). */
const char *ckv_raw_last_text(void);

/* ---- attach frames on a connection the caller owns ---------------------- */

/* Sends AttachRequest{version 1, name, want_arenas, refresh}: CKV_OK or the
 * transport error. */
int ckv_raw_attach_send(int fd, const char *name, bool want_arenas, bool refresh);
/* Reads one AttachReply (descriptors it carries are closed).  Returns its
 * code, the transport error, or CKV_RAW_BAD_REPLY when it does not decode;
 * *ret (may be NULL) gets it (free with
 * commitkv__v1__attach_reply__free_unpacked). */
int ckv_raw_attach_recv(int fd, Commitkv__V1__AttachReply **ret);
/* ckv_raw_attach_recv's code; the reply's message into `text` (when it
 * decoded and text is not NULL). */
int ckv_raw_attach_answer(int fd, char *text, size_t cap);

#endif
