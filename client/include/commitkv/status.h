/* commitkv/status.h - the one error space of CommitKV.
 *
 * Every fallible function of every layer (kernels, shm, client, daemon) returns
 * a ckv_status.  CKV_OK is 0.  Our own failures live in a reserved negative
 * range [-1999, -1000]; anything in [-4095, -1] is a negated errno value folded
 * in unchanged (e.g. -ENOMEM, -EACCES).  The same numbers travel on the wire in
 * every reply's `code` field, so a client in any language can switch on them.
 *
 * This header is plain ISO C11 and safe to include from C++ and FFI bindings. */
#ifndef COMMITKV_STATUS_H
#define COMMITKV_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro list: name, value, text.  One line adds a code everywhere. */
#define CKV_STATUS_LIST(X)                                                                  \
  X(CKV_OK, 0, "success")                                                                   \
  X(CKV_ERR_INVALID, -1001, "invalid argument or request")                                \
  X(CKV_ERR_PROTO, -1002, "malformed message (cannot be decoded)")                          \
  X(CKV_ERR_VERSION, -1003, "unsupported protocol version")                                 \
  X(CKV_ERR_NOT_FOUND, -1004, "no such session or object")                                  \
  X(CKV_ERR_EXISTS, -1005, "already exists")                                                \
  X(CKV_ERR_QUOTA, -1006, "tenant quota exceeded and nothing more can be reclaimed")        \
  X(CKV_ERR_NOSPACE, -1007, "arena memory exhausted")                                       \
  X(CKV_ERR_LIMIT, -1008, "value beyond a configured limit")                                \
  X(CKV_ERR_RANGE, -1009, "index out of range")                                             \
  X(CKV_ERR_AUTH, -1010, "not authenticated (attach first) or not allowed")                 \
  X(CKV_ERR_STATE, -1011, "object is in the wrong state for this request")                  \
  X(CKV_ERR_FORMAT, -1012, "block format or build format mismatch")                         \
  X(CKV_ERR_DAEMON_RESTARTED, -1013, "the daemon restarted: reconnect and re-attach")       \
  X(CKV_ERR_TIMEOUT, -1014, "timed out waiting for the daemon")                             \
  X(CKV_ERR_DEVICE, -1015, "device (GPU) error or device unavailable")                      \
  X(CKV_ERR_CORRUPT, -1016, "data is corrupt (checksum or magic mismatch)")                 \
  X(CKV_ERR_UNSUPPORTED, -1017, "operation not supported by this build or backend")         \
  X(CKV_ERR_BUSY, -1018, "resource busy, retry later")                                      \
  X(CKV_ERR_TOO_LARGE, -1019, "message or request too large")                               \
  X(CKV_ERR_DISCONNECTED, -1020, "not connected to the daemon")                             \
  X(CKV_ERR_INTERNAL, -1999, "internal error (a bug: please report)")

typedef enum ckv_status {
#define CKV_STATUS_ENUM_(name, value, text) name = (value),
  CKV_STATUS_LIST(CKV_STATUS_ENUM_)
#undef CKV_STATUS_ENUM_
} ckv_status;

/* Human-readable text for any status: ours or a folded -errno.  Never NULL;
 * the returned string is static (thread-safe, never freed). */
const char *ckv_strerror(int status);

/* Symbolic name ("CKV_ERR_QUOTA", "ENOENT"...) for logs and JSON. */
const char *ckv_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif
