/* persist.h - the KV beyond memory, as one object (types only; service.h
 * runs it): the snapshot I/O thread
 * and the policies over the store that use it (the disk and remote tiers,
 * autosave, the warm restart), with what they need to know of the daemon
 * (its state directory, the remote store, the policy new sessions start
 * from) and their counters.  The daemon embeds one (ckv_server.persist) over
 * its ckv_store.
 *
 * persist/ never sees a request or a client: the daemon tells it what a
 * request means (tier.h ckv_tier_request), and when a request must wait for
 * its session to come back (or for room), persist answers CKV_TIER_PARK and
 * later says so through ckv_persist_hooks: the daemon keeps the requests
 * (daemon/parked.c) and serves them again.  Runs on the server loop; the I/O
 * thread only ever sees a job. */
#ifndef CKV_PERSIST_PERSIST_H
#define CKV_PERSIST_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_store ckv_store;
typedef struct ckv_snapio ckv_snapio;
typedef struct ckv_snapio_job ckv_snapio_job;
typedef struct ckv_tier ckv_tier;
typedef struct ckv_remote ckv_remote;
typedef struct ckv_judge_params ckv_judge_params;
typedef struct ckv_arena_backend ckv_arena_backend;
typedef struct ckv_warm_memory ckv_warm_memory;
typedef struct ckv_incarnations ckv_incarnations;
typedef struct ckv_diskuse ckv_diskuse;
typedef struct ckv_fences ckv_fences;
typedef struct ckv_warm_journal ckv_warm_journal;

typedef struct ckv_persist_options {
  const char *state_dir; /* NULL or "": no files at all */
  /* The disk tier (tier.h): sessions no request named for disk_idle_ms move
   * to files under state_dir, at most disk_memory bytes of them; either 0 = off. */
  uint64_t disk_idle_ms, disk_memory;
  bool disk_pressure; /* under quota pressure the coldest sessions move down first (needs disk_memory) */
  /* The remote tier: a session on disk no request named for remote_idle_ms
   * more moves on to `remote` (0 or no store: never). */
  uint64_t remote_idle_ms;
  ckv_remote *remote; /* the remote store (remote.h): the caller's, outliving this; NULL = none */
  uint64_t autosave_ms; /* autosave.h: each changed live session at most this often; 0 = off */
  const ckv_judge_params *policy; /* what restored sessions rebuild their judge from (the caller's); may be NULL */
  const ckv_arena_backend *backend; /* warm.h: only host arenas outlive the process */
  uint64_t owner_tag;               /* warm.h: this daemon's tag on the arenas it hands to the fd store */
  uint64_t warm_journal_ms;         /* warmjournal.h: changed sessions journaled this often; 0 = at a clean stop only */
  uint64_t warm_journal_delay_ms;   /* warmjournal.h: a batch a reply waits for starts at most this late */
} ckv_persist_options;

/* What the daemon must hear from persist/; every slot may be NULL. */
typedef struct ckv_persist_hooks {
  /* The requests parked for session `key` ("tenant/id", ckv_store_session_key)
   * may go on: status CKV_OK, the session is resident (serve them again, in
   * order), or the error to answer them with, with its text. */
  void (*session_ready)(void *ctx, const char *key, int status, const char *msg);
  /* The offloads made for memory pressure landed (or failed): the requests
   * parked for room are served again, once (ckv_tier_make_room answers
   * CKV_OK while they are). */
  void (*room_made)(void *ctx);
  void *ctx;
} ckv_persist_hooks;

typedef struct ckv_persist_counters {
  uint64_t warm_kept, warm_dropped; /* sessions the warm restart at start kept / dropped (warm.h) */
  uint64_t warm_checkpoints, warm_entries, warm_journal_errors; /* warmjournal.h: checkpoints durable, entries written */
  uint64_t autosaves, autosave_bytes, autosave_errors; /* autosave.h */
  uint64_t autosave_resumes; /* sessions a resume brought back from their autosave */
  uint64_t autosave_lag_ms;  /* gauge: the oldest change of a live session that no autosave copy holds yet */
  /* writes refused by a tenant's quota_disk or max_snapshots (diskuse.h), before any byte was written */
  uint64_t disk_refused_saves, disk_refused_autosaves, disk_refused_offloads;
} ckv_persist_counters;

typedef struct ckv_persist {
  ckv_persist_options opt;
  ckv_store *store;
  ckv_snapio *snapio; /* the snapshot I/O thread (snapio.h); NULL once stopped */
  ckv_tier *tier;     /* the disk and remote tiers' policy and bookkeeping (tier.h) */
  unsigned autosave_inflight; /* autosaves copied and waiting for the I/O thread (at most CKV_AUTOSAVE_INFLIGHT) */
  bool autosave_found;    /* state_dir/autosave held files at start (removed as their sessions end) */
  ckv_warm_memory *warm;  /* what the warm restart at start dropped, and why (warm.h) */
  ckv_warm_journal *journal; /* the continuous warm journal and its writer thread (warmjournal.h); NULL: off */
  ckv_incarnations *incarnations; /* each id's current conversation, durable (incarnations.h) */
  ckv_diskuse *diskuse;           /* each tenant's files in state_dir and their sizes (diskuse.h) */
  ckv_fences *fences;             /* store fence writes not landed yet, drops waiting for theirs (fencejob.h) */
  ckv_persist_counters counters;
  ckv_persist_hooks hooks;
} ckv_persist;

#endif
