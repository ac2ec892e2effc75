/* tier.h - the disk tier, session by session: idle sessions move to files
 * under state_dir/tier and come back before their next request.
 *
 * Policy (ckv_tier_scan, from the loop's housekeeping): a session that no
 * request named for disk_idle_ms (detached, or attached and quiet: no
 * tokens appended since its last report, whose K/V its worker may still be
 * writing) is copied on the loop (ckv_session_snap_capture) and written by
 * the snapshot I/O thread (snapio.h) as state_dir/tier/TENANT/ID.ckvsnap:
 * the snapshot format, a directory of its own that ListSnapshots never
 * shows.  Only once that file is durable (temporary file, fsync, rename,
 * directory fsync) are the session's arena blocks freed and its quota given
 * back; a request naming the session while the write is in flight cancels
 * the move (the blocks stay, the file is removed).  disk_memory caps the
 * tier files' bytes: when a session does not fit it stays in memory, and
 * the daemon says so once per idle spell.
 *
 * Memory pressure (disk_pressure; ckv_tier_make_room, from AppendTokens, and
 * the way back below): when a tenant's quota cannot take a request's new
 * blocks, the tenant's coldest other sessions that may go are written the
 * same way first, and the request waits, parked, until those offloads land;
 * then it is served the old way (compress, recycle, refuse) with the room
 * they made.  docs/tiers.md says who may go.
 *
 * The way back (ckv_tier_gate, before every request's handler): a request
 * that needs the session's K/V (AppendTokens, ReportRound, Acquire, GetView,
 * SaveSession, OpenSession with resume) on a session on disk is parked, the
 * I/O thread reads and validates the file, and the loop rebuilds the session
 * in fresh blocks (ckv_session_snap_restore: K/V bytes and token states as
 * written) under a new epoch, then serves the parked requests in order: their
 * replies carry the new epoch, so the worker re-reads its view.  When the
 * quota cannot take it back, the parked requests are answered CKV_ERR_QUOTA
 * with the numbers, and the file is kept.  Requests that do not touch K/V
 * (AckEpoch, CloseSession, DropSession, Stats, ListSessions) are served with
 * the session left on disk; a drop removes its file.
 *
 * A tier file outlives the daemon (kill -9, or a stop while the session was
 * on disk): a restarted daemon counts it against disk_memory and an
 * OpenSession with resume of that id restores it (before any save game of
 * the same name: it is the newer copy), then removes it.
 *
 * The remote tier (ckv_tier_set_remote: a remote store and remote_idle_ms):
 * a session on disk that no request named for remote_idle_ms more is pushed
 * by the I/O thread to the store under its tier key (remote_snap.h); once
 * the store has it whole, the tier file is removed and the session is
 * remote.  Its next request that needs K/V reads it back from the store (the
 * same validation as a file), the loop rebuilds it as above, and the
 * store's copy is deleted.  A request during the push reads the tier file,
 * which is still there, and the pushed copy is deleted.  A push that fails
 * leaves the session on disk (tried again after another remote_idle_ms); a
 * read that fails leaves it remote, the requests answered with the store's
 * error.  A resume (OpenSession with resume) with no tier file here looks
 * for the session in the remote tier before its snapshots: another daemon
 * of the fleet may have moved it there. */
#ifndef CKV_PERSIST_TIER_H
#define CKV_PERSIST_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_persist ckv_persist;
typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_tier ckv_tier;
typedef struct ckv_tier_slot ckv_tier_slot;
typedef struct ckv_remote ckv_remote;

/* Offloads written at once: each holds a copy of its session in memory. */
#define CKV_TIER_INFLIGHT 4u

/* Under memory pressure an attached session moves down only when no
 * request named it for this long (its worker may be reading its view). */
#define CKV_TIER_PRESSURE_QUIET_MS 1000u

/* Where a session's K/V is. */
typedef enum ckv_tier_state {
  CKV_TIER_RESIDENT = 0, /* in the primary arena */
  CKV_TIER_OFFLOADING,   /* in the arena, and a copy is being written to disk */
  CKV_TIER_ON_DISK,      /* only in its tier file; no arena blocks */
  CKV_TIER_RESTORING,    /* the tier file (or the remote tier's copy) is being read back */
  CKV_TIER_PUSHING,      /* on disk, and its file is being copied to the remote store */
  CKV_TIER_ON_REMOTE,    /* only in the remote store; no arena blocks, no tier file */
} ckv_tier_state;

/* The name ListSessions and View give state st ("primary", "offloading",
 * "disk", "restoring", "pushing", "remote"). */
const char *ckv_tier_state_name(ckv_tier_state st);

/* The disk tier's figures: daemon-wide (tenant NULL) or one tenant's. */
typedef struct ckv_tier_stats {
  uint64_t disk_bytes, disk_sessions, capacity;
  uint64_t offloads, offload_bytes, restores, restore_bytes;
  uint64_t restore_tokens; /* tokens of the sessions brought back (the disk tier's hit tokens) */
  uint64_t cancelled, refused, errors;
  uint64_t pressure_moves; /* offloads made for memory pressure (part of offloads) */
  uint64_t resident_bytes5[5]; /* of sessions on disk: what they held in memory (stats bytes layout) */
  /* the remote tier */
  bool remote_on;
  uint64_t remote_bytes, remote_sessions;
  uint64_t remote_resident_bytes5[5]; /* of sessions in the store: what they held in memory */
  uint64_t pushes, push_bytes; /* sessions moved from disk to the store */
  uint64_t remote_restores, remote_restore_bytes, remote_restore_tokens; /* brought back from the store */
  uint64_t remote_errors;      /* pushes and reads back that failed */
} ckv_tier_stats;

/* The tier of a daemon: on when cap_bytes and state_dir are set and idle_ms
 * or pressure is (else every call is a no-op and the stats stay 0): idle_ms
 * moves idle sessions down, pressure the coldest when a tenant's quota is
 * short (ckv_tier_make_room).  CKV_OK or -ENOMEM. */
int ckv_tier_new(uint64_t idle_ms, uint64_t cap_bytes, bool pressure, const char *state_dir, ckv_tier **ret);
/* Accepts NULL, returns NULL.  Sessions must be gone (ckv_tier_forget). */
ckv_tier *ckv_tier_free(ckv_tier *t);
/* Turns the remote tier on: sessions on disk no request named for idle_ms
 * more move on to store r (the daemon's; used by the I/O thread only).  A
 * no-op when r is NULL, idle_ms 0 or the disk tier off. */
void ckv_tier_set_remote(ckv_tier *t, ckv_remote *r, uint64_t idle_ms);
bool ckv_tier_enabled(const ckv_tier *t);
/* Whether the remote tier is on (ckv_tier_set_remote). */
bool ckv_tier_remote_on(const ckv_tier *t);

/* Start-up: removes temporary files of cut-short tier writes, counts the
 * tier files a previous run left (they stay resumable) and logs them. */
void ckv_tier_startup(ckv_persist *p);

/* A request's answer from the tier meaning "it waits": the daemon keeps it
 * and serves it again when ckv_persist_hooks says (session_ready for the
 * session it names, room_made after ckv_tier_make_room). */
#define CKV_TIER_PARK 1

/* What a request means to the tier, as the daemon's request table says it
 * (the tier never sees a request). */
typedef struct ckv_tier_request {
  const ckv_tenant *tenant; /* the asking client's tenant */
  const char *id;           /* the session it names (a valid session id) */
  uint64_t client;          /* the asking client's id */
  bool kv;                  /* it needs the session's K/V resident */
  bool owner_only;          /* only the session's reader may ask (anyone else: the handler refuses; the tier does nothing) */
  bool resume;              /* OpenSession with resume: the session's reader, or nobody's */
  bool open_new;            /* OpenSession without resume: a new conversation of this id */
  bool appends, reports;    /* AppendTokens (its worker writes K/V from now on) / ReportRound (it has written it) */
  bool prefetch;            /* Acquire with prefetch: the read starts, the request is answered at once */
  bool can_wait;            /* a loop serves it again later (false: no loop, the read runs on this thread) */
  const char *model_id, *model_revision; /* open_new: the key of a remote copy that must never come back */
} ckv_tier_request;

/* Before request r is handled: notes the session it names as used now and,
 * when that session is on disk or coming back and the request needs it,
 * returns CKV_TIER_PARK (the daemon parks the request until session_ready;
 * without a loop, r->can_wait false, the session is brought back on this
 * thread and CKV_OK returned).  A request during an offload write cancels
 * that offload.  CKV_OK: handle it now; < 0: refuse it with the text in msg. */
int ckv_tier_gate(ckv_persist *p, const ckv_tier_request *r, char *msg, size_t msglen);

/* Housekeeping: starts the offload of every session idle for idle_ms that
 * may go (see the top of this file), within the cap and CKV_TIER_INFLIGHT. */
void ckv_tier_scan(ckv_persist *p, uint64_t now_ms);

/* Memory pressure: a request on resident session sess needs `need` more
 * bytes than sess's tenant has left.  Starts writing the tenant's coldest
 * other sessions to disk (least recently named first; never sess, one
 * mid-move, with jobs in flight or pending moves, attached with appends not
 * yet reported, or attached and named by a request within
 * CKV_TIER_PRESSURE_QUIET_MS), as many as cover the shortfall: CKV_TIER_PARK,
 * and the daemon parks the request until room_made, which comes once those
 * offloads land (their blocks freed) or fail; served then, with no second
 * round of moves.  CKV_OK: nothing could go (pressure off, no candidate, the
 * tier full, can_wait false, or this is that second serving): the caller
 * goes on the old way. */
int ckv_tier_make_room(ckv_persist *p, ckv_srv_session *sess, uint64_t need, bool can_wait);
/* (The way back does the same by itself: a session coming back that does
 * not fit its tenant's quota has the coldest others written first, queued
 * ahead of its read.) */

/* Session sess is being destroyed (ckv_store_drop_session, the store hook): requests
 * parked for it are answered NOT_FOUND (session_ready), its tier file removed (kept when
 * the daemon is stopping: p->snapio is gone then, and the file is resumable
 * after a restart) and its slot freed. */
void ckv_tier_forget(ckv_persist *p, ckv_srv_session *sess);

/* Session sess came back from an earlier run's tier file, or (from_remote)
 * the remote tier's copy (an OpenSession with resume, savegame.c): the file
 * is removed and uncounted, the store's copy deleted, the restore counted. */
void ckv_tier_resumed(ckv_persist *p, const ckv_srv_session *sess, bool from_remote);

/* Where sess's K/V is now. */
ckv_tier_state ckv_tier_state_of(const ckv_srv_session *sess);
/* The figures of tenant (NULL: all tenants) into *ret. */
void ckv_tier_get_stats(const ckv_persist *p, const ckv_tenant *tenant, ckv_tier_stats *ret);

#endif
