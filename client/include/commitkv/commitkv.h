/* commitkv/commitkv.h - libcommitkv, the worker's side of CommitKV.
 *
 * A worker (an inference engine process) attaches to commitkvd, maps its
 * tenant's KV arenas, opens sessions, appends tokens and writes their K/V
 * straight into the slots the daemon hands out (zero copy), reads K/V back
 * through views (block tables with an epoch), reports each round's attention
 * mass and acknowledges view epochs so the daemon can reclaim memory.
 *
 * Rules:
 * - Every call returns a ckv_status (0 = CKV_OK, negative = error; see
 *   commitkv/status.h and ckv_strerror()).  The library never prints, aborts
 *   or exits.  ckv_client_last_error() gives the daemon's explanation of the
 *   last refused request.
 * - A ckv_client and its sessions may be used from several threads: calls
 *   are serialised by the client's lock.  The background heartbeat shares it.
 * - Out-parameters are written only on success.
 * - If the daemon restarts (its per-boot token, carried by every reply,
 *   changes), calls fail with CKV_ERR_DAEMON_RESTARTED until
 *   ckv_client_reconnect() re-attaches (the heartbeat thread does it by
 *   itself); sessions of the old daemon are gone.
 * - Arenas are host memory or, when the daemon serves from a GPU, CUDA device
 *   memory (ckv_client_memory_kind()).  With CUDA arenas every pointer the
 *   library hands out (draft slots, view blocks) is a device pointer of the
 *   daemon's GPU; write K/V with ckv_session_write_kv(_async) and read views
 *   with GPU kernels (or cudaMemcpy).  The library never needs the NVIDIA
 *   driver unless a CUDA arena is mapped.
 *
 * Plain ISO C11; usable from C++ and FFI. */
#ifndef COMMITKV_COMMITKV_H
#define COMMITKV_COMMITKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commitkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKV_CLIENT_VERSION 1u /* protocol version spoken */

typedef struct ckv_client ckv_client;
typedef struct ckv_session ckv_session;

/* A session's model geometry (identical to kernels/format.h). */
#ifndef CKV_GEOMETRY_DEFINED
#define CKV_GEOMETRY_DEFINED
typedef struct ckv_geometry {
  uint32_t n_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t dtype; /* 0 = FP16, 1 = BF16 */
} ckv_geometry;
#endif

/* Token roles and structure tags (commitkv.proto Role and Tag). */
enum { CKV_ROLE_UNSPECIFIED = 0, CKV_ROLE_SYSTEM = 1, CKV_ROLE_USER = 2, CKV_ROLE_ASSISTANT = 3, CKV_ROLE_TOOL = 4 };
enum { CKV_TAG_TURN_START = 1, CKV_TAG_SENTENCE_START = 2, CKV_TAG_CONFIRMATION = 4 };
/* Token states (commitkv.proto TokenState). */
enum { CKV_TOKEN_DRAFT = 0, CKV_TOKEN_STAGED = 1, CKV_TOKEN_COMMITTED = 2, CKV_TOKEN_RECYCLED = 3 };

typedef struct ckv_client_options {
  const char *socket;        /* ZeroMQ endpoint; NULL: $CKV_SOCKET, else
                              * ipc://$RUNTIME_DIRECTORY/commitkvd.sock, else ipc:///run/commitkv/commitkvd.sock */
  const char *attach_socket; /* unix path; NULL: $CKV_ATTACH_SOCKET, else commitkvd.attach beside the socket */
  const char *name;          /* shown in the daemon's logs; NULL: "libcommitkv" */
  int timeout_ms;            /* per request; 0: 5000 */
  bool heartbeat;            /* keep the lease alive from a background thread */
  bool no_arenas;            /* admin tools: attach without mapping arenas */
} ckv_client_options;

/* Attaches (unix socket, SO_PEERCRED), maps the tenant's arenas, connects
 * the control socket and says Hello.  opt may be NULL (all defaults).
 * CUDA arenas are mapped on the calling thread's current CUDA device (call
 * cudaSetDevice first when the process sees several); the daemon's device
 * must be that device, and every later re-attach checks the same ordinal.
 * Returns CKV_OK; CKV_ERR_AUTH (uid not mapped to a tenant); CKV_ERR_VERSION;
 * CKV_ERR_DISCONNECTED / -ENOENT / -ECONNREFUSED (no daemon there);
 * CKV_ERR_TIMEOUT; CKV_ERR_FORMAT (arena from an incompatible build);
 * CKV_ERR_DEVICE (CUDA arena on another GPU than this process's, or no usable
 * GPU here; ckv_client_connect_error() names both devices);
 * CKV_ERR_UNSUPPORTED (CUDA arena, but a libcommitkv built without CUDA). */
int ckv_client_connect(const ckv_client_options *opt, ckv_client **ret);
/* The daemon's (or the transport's) explanation of this thread's last failed
 * ckv_client_connect, e.g. "uid 1001 / gid 1001 is not mapped to any tenant".
 * Empty after a success. */
const char *ckv_client_connect_error(void);
/* Disconnects and unmaps.  Sessions still open are detached by the daemon
 * (kept for resume); their handles must have been freed first or are freed
 * here.  Accepts NULL; returns NULL. */
ckv_client *ckv_client_free(ckv_client *c);
const char *ckv_client_tenant(const ckv_client *c);
/* The daemon's explanation of the last failed request (empty when none). */
const char *ckv_client_last_error(const ckv_client *c);
/* The text the daemon put on the last request that succeeded, empty when
 * it put none: a success with something to say, e.g. a ckv_session_drop
 * whose remote copy could not be deleted ("session 'x' is dropped, but the
 * remote copy could not be deleted: ...; it is fenced ..."): the
 * conversation is ended all the same.  Valid until the next request on c. */
const char *ckv_client_last_note(const ckv_client *c);
/* After CKV_ERR_DAEMON_RESTARTED: drops the mappings of the old daemon's
 * memory (a host arena stays mapped until the next reconnect, so a thread
 * still reading a view of it cannot fault; device memory is dropped at once),
 * attaches to the new daemon and maps its arenas, without the worker
 * process restarting.  Sessions opened before are gone with the old daemon:
 * their handles answer CKV_ERR_DAEMON_RESTARTED; free them with
 * ckv_session_close and open new ones (with resume: a warm restart, below,
 * kept them).  The background heartbeat (if enabled) calls this by itself
 * when it notices a restart.  Returns CKV_OK or why the new daemon cannot be
 * reached (calls keep failing with CKV_ERR_DAEMON_RESTARTED until a
 * reconnect succeeds).
 * Warm restart (commitkvd under systemd with its fd store): the new daemon
 * hands back the very arena this process maps; the mapping is kept (every
 * pointer into it stays valid, ckv_client_arena_kept says so) and sessions
 * the daemon kept resume, on the same bytes, with ckv_session_open(resume).
 * A session it could not keep answers CKV_ERR_NOT_FOUND saying why. */
int ckv_client_reconnect(ckv_client *c);
/* Whether the last (re)connect kept the arena mapping of the connection
 * before it (a warm restart of the daemon), rather than mapping anew. */
bool ckv_client_arena_kept(const ckv_client *c);
/* True between noticing a daemon restart and a successful reconnect. */
bool ckv_client_restarted(const ckv_client *c);
/* One heartbeat now (the background thread does this by itself). */
int ckv_client_heartbeat(ckv_client *c);
/* Lease length the daemon announced, in milliseconds. */
uint32_t ckv_client_lease_ms(const ckv_client *c);
/* Where the mapped arena lives: "host" (shared host memory: view data and
 * ckv_session_kv_ptr are CPU pointers), "cuda" (GPU memory: they are device
 * pointers of the daemon's GPU, for kernels and cudaMemcpy only), or "none"
 * (attached without arenas, or between a daemon restart and the reconnect).
 * A static string; may change across ckv_client_reconnect().  Any thread. */
const char *ckv_client_memory_kind(const ckv_client *c);

typedef struct ckv_session_options {
  const char *policy;            /* NULL: daemon default ("commitkv") */
  bool resume;                   /* attach to an existing (detached) session */
  uint32_t draft_block_tokens;   /* 0: daemon default */
  uint32_t commit_block_tokens;  /* 0: daemon default */
  const char *const *param_names; /* per-session policy overrides ([policy] keys) */
  const double *param_values;
  size_t n_params;
  /* What computes the K/V (at most 128 bytes each; NULL = ""): part of the
   * session's identity.  A resume (or a restore) by another model id or
   * revision is refused with CKV_ERR_FORMAT. */
  const char *model_id;
  const char *model_revision;
  /* Shared prefixes (new sessions only; ignored on resume): with
   * reuse_prefix, the session starts on the tenant's shared blocks whose
   * content matches the leading whole draft blocks of token_ids[0..n_token_ids)
   * (same model, revision and geometry); ckv_session_matched_tokens() says
   * how many tokens it holds already, and the worker appends (and prefills)
   * from there.  Blocks become matchable once their writer reported a round
   * past them. */
  const uint32_t *token_ids;
  size_t n_token_ids;
  bool reuse_prefix;
} ckv_session_options;

/* Opens (or, with opt->resume, resumes) session `id` (1..128 of
 * [A-Za-z0-9._:-]).  g may be NULL when resuming.  Returns CKV_OK,
 * CKV_ERR_EXISTS, CKV_ERR_NOT_FOUND (resume), CKV_ERR_LIMIT (geometry or
 * session count), CKV_ERR_INVALID, CKV_ERR_BUSY, CKV_ERR_FORMAT. */
int ckv_session_open(ckv_client *c, const char *id, const ckv_geometry *g, const ckv_session_options *opt,
                     ckv_session **ret);
/* Leading tokens of token_ids[0..n) that the tenant's shared blocks of
 * model (model_id, model_revision; NULL = "") hold: a session opened with
 * reuse_prefix on them needs no prefill for that many.  *ret_matched is a
 * multiple of the draft block size.  Answered in this process from the
 * tenant's prefix index the daemon publishes (no request; a few us), or by
 * the daemon when that index is busy, full or not mapped.  The answer is a
 * hint: ckv_session_open with reuse_prefix matches again.  Returns CKV_OK,
 * CKV_ERR_INVALID, CKV_ERR_LIMIT (more ids than a session may hold). */
int ckv_client_lookup_prefix(ckv_client *c, const uint32_t *token_ids, size_t n, const char *model_id,
                             const char *model_revision, uint64_t *ret_matched);
/* Opens session `new_id` (attached to this client) as a fork of `parent`:
 * it starts with parent's first at_position tokens (0: all the parent
 * reported a round over) and diverges after.  Whole draft blocks are shared
 * with the parent (read-only to both), a partial tail is copied.  Every
 * token before at_position must still be in draft format: CKV_ERR_STATE
 * otherwise (the daemon's message says which).  Returns CKV_OK,
 * CKV_ERR_EXISTS, CKV_ERR_NOT_FOUND, CKV_ERR_RANGE, CKV_ERR_STATE,
 * CKV_ERR_LIMIT, CKV_ERR_QUOTA. */
int ckv_session_fork(ckv_session *parent, const char *new_id, uint64_t at_position, ckv_session **ret);
/* Tokens the session started with from shared blocks (reuse_prefix or a
 * fork; 0 otherwise). */
uint64_t ckv_session_matched_tokens(const ckv_session *s);

/* Writes the session to the daemon's state directory as snapshot `name`
 * (NULL or "": the session id), atomically; committed_only keeps only the
 * committed tokens (the save game: draft and staged ones are not kept).
 * *ret_bytes (may be NULL): the file's size.  Returns CKV_OK,
 * CKV_ERR_UNSUPPORTED (not a host arena), CKV_ERR_CORRUPT (quarantined),
 * CKV_ERR_INVALID (no state directory, bad name), -errno (the disk). */
int ckv_session_save(ckv_session *s, const char *name, bool committed_only, uint64_t *ret_bytes);
/* Restores snapshot `name` (NULL or "": id) of this client's tenant as
 * session `id`, attached to this client (a daemon restart in between is
 * fine; OpenSession with resume does the same for an id that exists only as
 * a snapshot).  opt: only model_id / model_revision are read; when set they
 * must be the snapshot's.  Returns CKV_OK, CKV_ERR_NOT_FOUND, CKV_ERR_EXISTS
 * (a live session of that id), CKV_ERR_CORRUPT (truncated or damaged),
 * CKV_ERR_FORMAT (another format version, layout, model or revision),
 * CKV_ERR_AUTH (another tenant's), CKV_ERR_QUOTA. */
int ckv_session_restore(ckv_client *c, const char *id, const char *name, const ckv_session_options *opt,
                        ckv_session **ret);
/* Detaches the session (the daemon keeps it for resume) and frees the handle.
 * Returns the daemon's status; the handle is freed in every case, an error
 * included: never use s after the call, whatever it returned. */
int ckv_session_close(ckv_session *s);
/* Drops the session in the daemon (its memory is freed) and frees the
 * handle.  Returns the daemon's status; the handle is freed in every case,
 * an error included (CKV_ERR_DAEMON_RESTARTED, a refused drop): never use s
 * after the call, whatever it returned. */
int ckv_session_drop(ckv_session *s);

const char *ckv_session_id(const ckv_session *s);
const ckv_geometry *ckv_session_geometry(const ckv_session *s);
/* Tokens appended so far (the next position). */
uint64_t ckv_session_tokens(const ckv_session *s);
/* The newest view epoch this client has heard of. */
uint64_t ckv_session_epoch(const ckv_session *s);

/* Appends `count` tokens; roles, tags (one byte each), semantic (float in
 * [0,1]) and token_ids may be NULL.  On success the tokens have draft slots:
 * write their K/V with ckv_session_write_kv / ckv_session_kv_ptr.
 * Returns CKV_OK, CKV_ERR_QUOTA, CKV_ERR_LIMIT, CKV_ERR_INVALID. */
int ckv_session_append(ckv_session *s, uint32_t count, const uint8_t *roles, const uint8_t *tags,
                       const float *semantic, const uint32_t *token_ids, uint64_t *ret_first_position);
/* Address of the draft slot of `position` for layer `layer`: kv 0 = K, 1 = V;
 * n_kv_heads * head_dim 16-bit elements, head-major.  Slots are writable from
 * the append until the session's next ckv_session_report (after it, the
 * daemon may move the token); NULL outside that window.  A device pointer on
 * a CUDA arena (ckv_client_memory_kind() "cuda"): the worker's own kernels may
 * write it, and must have completed before ckv_session_report (the library
 * waits only for the streams given to ckv_session_write_kv_async). */
void *ckv_session_kv_ptr(ckv_session *s, uint64_t position, uint32_t layer, int kv);
/* Copies one token's K and V of one layer into its draft slot (k or v may be
 * NULL to skip one).  On a CUDA arena k/v may be host or device pointers; the
 * copy is cudaMemcpy (cudaMemcpyDefault) and has landed when the call returns.
 * CKV_ERR_RANGE (no draft slot / layer out of range), CKV_ERR_DEVICE (a CUDA
 * error, named by ckv_client_last_error()). */
int ckv_session_write_kv(ckv_session *s, uint64_t position, uint32_t layer, const void *k, const void *v);
/* ckv_session_write_kv queued on a CUDA stream: `stream` is a cudaStream_t
 * (NULL: the default stream); k/v may be device, pinned or pageable host
 * pointers and must stay unchanged until the stream has executed the copies.
 * The session remembers the streams used since its last report and
 * ckv_session_report() synchronises them before it sends the report (the
 * daemon may compress the tokens right after it), as do ckv_session_close()
 * and ckv_session_drop(): keep each stream alive until then.  On a host arena
 * with stream NULL this is ckv_session_write_kv.  Same thread rules as the
 * session's other calls.
 * Returns CKV_OK, CKV_ERR_RANGE, CKV_ERR_DEVICE (CUDA refused the copy),
 * CKV_ERR_UNSUPPORTED (a stream on a host arena, or a build without CUDA),
 * -ENOMEM. */
int ckv_session_write_kv_async(ckv_session *s, uint64_t position, uint32_t layer, const void *k, const void *v,
                               void *stream);

/* One block of a view, mapped in this process.  Decode with kernels/format.h.
 * data is a device pointer when ckv_client_memory_kind() is "cuda". */
typedef struct ckv_block_view {
  const void *data;
  uint64_t id;
  uint64_t bytes;
  uint32_t format; /* kernels/format.h: 0 draft, 1 staged, 2/3 committed KIVI INT4/INT2, 4-7 rotated ROT4..ROT1 */
  uint32_t capacity;
} ckv_block_view;

typedef struct ckv_view {
  uint64_t epoch;
  uint64_t n_tokens;
  const ckv_block_view *draft;
  size_t n_draft;
  const ckv_block_view *staged;
  size_t n_staged;
  const ckv_block_view *committed;
  size_t n_committed;
  /* Cold blocks: every token in them was demoted (recycled with its bytes
   * kept, DESIGN.md's "recycled to a colder tier").  Attention reads them
   * only when the query could need them: ckv_session_cold_select. */
  const ckv_block_view *cold;
  size_t n_cold;
} ckv_view;

/* The session's current view (fetched from the daemon when the epoch moved).
 * Valid until the next call on this session.  Reading it is safe until this
 * client acknowledges a newer epoch. */
int ckv_session_view(ckv_session *s, const ckv_view **ret);

/* The cold blocks of the current view (the last ckv_session_view) that the
 * attention of query q at `layer` could need: ret_idx[0..*ret_n) index
 * view->cold.  q is [n_q_heads][head_dim], as ckv_kernels_attention takes it
 * (one query row); scale 0 means 1/sqrt(head_dim).  A block is left out only
 * when none of its keys can take `min_weight` (e.g. 0.01) of any query head's
 * softmax weight: its per-channel key bounds (computed once per block, from
 * its bytes) against the best exact score over the view's draft blocks,
 * which attention always reads.  A block whose bytes cannot be read back is
 * always selected.  Pass the selected blocks to attention with the view's
 * others, and say how many were read with ckv_session_note_recalled.
 * ret_idx needs room for view->n_cold entries.  Host arenas only.
 * Returns CKV_OK, CKV_ERR_INVALID, CKV_ERR_STATE (no view fetched yet),
 * CKV_ERR_UNSUPPORTED (a CUDA arena: read every cold block), -ENOMEM. */
int ckv_session_cold_select(ckv_session *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                            float min_weight, uint32_t *ret_idx, size_t *ret_n);
/* ckv_session_cold_select, at most max_blocks of them (0: no cap): when more
 * pass the bar, those whose bound passes it the most, over the query heads
 * (Quest's top-k pages).  ret_idx ascending, as ckv_session_cold_select's. */
int ckv_session_cold_select_top(ckv_session *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                                float min_weight, size_t max_blocks, uint32_t *ret_idx, size_t *ret_n);
/* The cold tokens of the current view that query q at `layer` needs most,
 * gathered into `block`, which the caller owns and attention reads with the
 * view's others: at most max_tokens of them, ranked by the largest share of
 * any query head's softmax mass over the cold tokens, first from each cold
 * block's one-bit key sketch (kept with its summary, computed once per block),
 * then exactly from the keys of the best 16 x max_tokens.  Their K and V of
 * this layer are written as FP16 to slots 0..*ret_n of `block` (ascending
 * positions, valid bits set, every other slot invalid): a draft block of the
 * session's geometry and `capacity` >= max_tokens slots, of
 * ckv_format_block_bytes(CKV_FORMAT_DRAFT, geometry, capacity, 0) bytes,
 * 64-byte aligned, which this call (re)initialises.  Only this layer's rows
 * are written: gather again for the next layer.  ret_src (NULL, or room for
 * max_tokens) gets each slot's index into view->cold.  Tokens of a cold block
 * whose bytes cannot be read back are never gathered.  Host arenas only.
 * q and scale as ckv_session_cold_select.  Returns CKV_OK, CKV_ERR_INVALID,
 * CKV_ERR_STATE (no view fetched yet), CKV_ERR_UNSUPPORTED (a CUDA arena),
 * -ENOMEM. */
int ckv_session_cold_gather(ckv_session *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                            uint32_t max_tokens, void *block, uint32_t capacity, uint32_t *ret_src, size_t *ret_n);
/* The bytes this process holds to serve the session's cold blocks: the
 * summaries ckv_session_cold_select and ckv_session_cold_gather keep per cold
 * block (key bounds, key sketches, slot lists), which the daemon's byte counts
 * do not see.  0 before any cold block was summarised. */
size_t ckv_session_cold_summary_bytes(const ckv_session *s);
/* Adds n to the cold blocks the next ckv_session_report says this round's
 * attention read (ReportRound.recalled_blocks: counted by the daemon per
 * session, stats and ListSessions). */
int ckv_session_note_recalled(ckv_session *s, uint64_t n);

typedef struct ckv_transition {
  uint64_t first_position;
  uint32_t count;
  uint8_t from, to; /* CKV_TOKEN_* */
} ckv_transition;

typedef struct ckv_round_result {
  uint64_t epoch;   /* view epoch after this round's published transitions */
  uint32_t pending; /* transitions still being compressed */
  const ckv_transition *transitions; /* valid until the next call on the session */
  size_t n_transitions;
} ckv_round_result;

/* Reports round `round` (strictly increasing, from 1): attn[i] is the
 * attention mass of position first_position + i.  ret may be NULL.
 * First waits for the streams of ckv_session_write_kv_async since the last
 * report; if one fails, returns CKV_ERR_DEVICE without sending anything (the
 * round's draft slots stay writable: rewrite the K/V and report again). */
int ckv_session_report(ckv_session *s, uint64_t round, uint64_t first_position, const float *attn, size_t n,
                       ckv_round_result *ret);
/* Semantic-score updates for a report: call before ckv_session_report; they
 * travel with it. */
int ckv_session_set_semantic(ckv_session *s, const uint32_t *positions, const float *scores, size_t n);
/* Asks for the session to be resident before its next round (Acquire with
 * prefetch): a session the daemon moved to disk (docs/tiers.md) starts
 * coming back and the call returns at once.  *ret_resident (may be NULL)
 * says whether its K/V is in the primary tier now; a request that needs it
 * (the view, append, report) waits for it either way.  Call it when a
 * request for the session is on its way (an engine's router: the user is
 * typing) to hide the read-back. */
int ckv_session_prefetch(ckv_session *s, bool *ret_resident);
/* This client no longer reads anything older than `epoch`.  ret_reclaimed
 * (may be NULL) receives the bytes the daemon freed. */
int ckv_session_ack(ckv_session *s, uint64_t epoch, uint64_t *ret_reclaimed);
/* ckv_session_ack once `stream` (a cudaStream_t) has finished everything
 * queued on it so far, e.g. attention kernels reading the view of an older
 * epoch: acknowledging lets the daemon reuse that memory at once.  Waits with
 * cudaStreamSynchronize(stream); stream NULL waits for the whole current
 * device (cudaDeviceSynchronize) on a CUDA arena and not at all on a host
 * arena.  Blocks the calling thread, not the client's other users.
 * Returns ckv_session_ack's codes, CKV_ERR_DEVICE (the wait failed: nothing
 * was acknowledged), CKV_ERR_UNSUPPORTED (a stream in a build without CUDA). */
int ckv_session_ack_after_stream(ckv_session *s, uint64_t epoch, void *stream, uint64_t *ret_reclaimed);

#ifdef __cplusplus
}
#endif
#endif
