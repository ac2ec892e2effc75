/* attach_frame.h - one attach-socket frame read from a non-blocking socket,
 * a piece at a time.
 *
 * The daemon's loop is one thread and the attach socket is open to every
 * local user, so it may never wait for a peer: it reads what a socket has
 * whenever poll says it is readable and keeps its place in the frame here.
 * The frame is shm/fdpass.h's (4-byte little-endian length, then the
 * payload); the length is bounded before a byte of payload is read or
 * buffered, and reads never go past the end of the current frame, so a frame
 * queued behind it stays on the socket.  Attach requests carry no file
 * descriptors: any that arrive are closed and the frame is refused. */
#ifndef CKV_DAEMON_ATTACH_FRAME_H
#define CKV_DAEMON_ATTACH_FRAME_H

#include <stdbool.h>
#include <stdint.h>

/* ckv_attach_frame_read: the frame is not complete yet; poll again. */
#define CKV_ATTACH_FRAME_MORE 1

typedef struct ckv_attach_frame {
  uint8_t hdr[4];    /* the length prefix, as far as it arrived */
  uint32_t hdr_got;  /* bytes of hdr read */
  uint32_t len;      /* the announced payload length, once hdr_got == 4 */
  uint32_t got;      /* payload bytes read */
  uint8_t *body;     /* `len` bytes, allocated once the length is known and accepted */
} ckv_attach_frame;

/* An all-zero ckv_attach_frame (calloc) is a valid empty reader too. */
void ckv_attach_frame_init(ckv_attach_frame *f);
/* Frees the payload and makes `f` ready for the next frame. */
void ckv_attach_frame_done(ckv_attach_frame *f);
/* True once a byte of the current frame was read. */
bool ckv_attach_frame_started(const ckv_attach_frame *f);

/* Reads what the non-blocking socket `sock` holds now, up to the end of the
 * current frame, without waiting.  Returns CKV_OK when the frame is complete
 * (f->body holds f->len bytes, NULL when 0, until ckv_attach_frame_done);
 * CKV_ATTACH_FRAME_MORE when the socket ran dry first; CKV_ERR_TOO_LARGE
 * (announced length above max_len: nothing of the payload was read);
 * CKV_ERR_PROTO (the peer closed inside the frame, or sent descriptors,
 * which were closed); CKV_ERR_DISCONNECTED (closed before the frame's first
 * byte, or reset); -ENOMEM; another negated errno.  After an error the
 * stream's position is lost: close the socket. */
int ckv_attach_frame_read(ckv_attach_frame *f, int sock, uint32_t max_len);

#endif
