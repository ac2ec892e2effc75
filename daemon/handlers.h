/* handlers.h - one request, served: the request table (a handler per type,
 * with what the type means to the disk tier), the capped decode, and the
 * completion of requests that waited for the snapshot I/O thread. */
#ifndef CKV_DAEMON_HANDLERS_H
#define CKV_DAEMON_HANDLERS_H

#include <stddef.h>

#include "daemon/daemon.h"

typedef struct ckv_snapio_job ckv_snapio_job;

/* One request payload of `len` bytes from client c, answered into rep
 * exactly as the loop answers it: over max_message -> CKV_ERR_TOO_LARGE,
 * else decoded with the capped decoder (s->in) and served by
 * ckv_handle_request.  The caller resets s->out first. */
void ckv_handle_payload(ckv_server *s, ckv_conn *c, const void *data, size_t len, Commitkv__V1__Response *rep);
/* Serve one decoded request into `rep`. */
void ckv_handle_request(ckv_server *s, ckv_conn *c, const Commitkv__V1__Request *req, Commitkv__V1__Response *rep);
/* A snapshot I/O job is done: its request is answered (a restore applied
 * first) to the client that asked, when it is still there, and the job
 * freed. */
void ckv_handle_io_done(ckv_server *s, ckv_snapio_job *j);

#endif
