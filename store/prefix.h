/* prefix.h - shared prefix blocks: one copy of a common prefix for every
 * session of a tenant (issue 41).
 *
 * Content addressing.  A session's draft blocks hold positions [k*D, (k+1)*D)
 * in order (D = its draft block capacity), so block k of a session has a key:
 * a hash chain (XXH3-128) whose root covers the tenant name, model id and
 * revision, geometry, draft block capacity, the draft layout version and the
 * rotation seed, and whose link k covers key k-1 and the token ids of block
 * k.  Equal keys mean equal K/V.  The chain needs every token id from
 * position 0 (AppendTokens.token_ids, or OpenSession.token_ids for a reused
 * prefix); a session that appends without ids has no keys from there on.
 *
 * Publishing.  Block k becomes matchable (it enters its tenant's index) only
 * once it is full and sealed: the session's worker reported a round past it
 * (ckv_srv_session.reported_tokens), every slot still holds its token in
 * draft format and no move of it is in flight.  Only whole blocks are ever
 * matched: the partly filled last block stays private and the worker
 * prefills the rest (OpenSession answers how many tokens it can skip).
 *
 * Sharing.  A shared block (ckv_pblock) is one arena block that several
 * sessions' tables point at (same offset); `holders` counts those table
 * entries and retired entries.  It returns to the allocator only when the
 * last holder lets go, and each holder lets go only after its own reader
 * acknowledged the epoch that dropped it (session.c), so no session ever
 * reads a freed block.  The tenant's quota is charged once (the block was
 * allocated once).  Sharing never crosses tenants: the index lives in the
 * tenant, and the tenant's name is in every key.
 *
 * The lifecycle on shared blocks: while a block has more than one holder
 * it is frozen to every session's own moves: no move, recycle, demotion or
 * quota reclaim of one session takes a token out of it (the judge's decision
 * is kept and counted as pending).  It is compressed once, for every holder,
 * when all of them agree (store/shared_moves.h), and the compressed block
 * takes the draft blocks' places in the index.  A block with a single holder
 * is that session's again: the first move that touches it takes it out of
 * the index first (ckv_prefix_frozen).  Except while it waits for a second
 * holder: a session opened with reuse_prefix keeps each block it publishes
 * within the token ids it gave (the prefix it means to share) frozen for
 * share_grace_rounds of its own rounds (lifecycle/policy.h), so a commitkv
 * writer's judge does not stage the prefix it just published before anyone
 * could link it. */
#ifndef CKV_STORE_PREFIX_H
#define CKV_STORE_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckv_tenant ckv_tenant;
typedef struct ckv_srv_session ckv_srv_session;
typedef struct ckv_prefix ckv_prefix;
typedef struct ckv_prefix_chain ckv_prefix_chain;
typedef struct ckv_pblock ckv_pblock;
typedef struct ckv_pkey ckv_pkey;

/* Session side ---------------------------------------------------------- */

/* Appends of `count` tokens at `first` with `ids` (NULL: none given, the
 * chain stops): extends the chain's ids and keys.  Never fails (out of
 * memory stops the chain). */
void ckv_prefix_note_append(ckv_srv_session *s, uint64_t first, uint32_t count,
                            const uint32_t *ids);
/* After a ReportRound: publishes the sealed blocks (see above).  Returns the
 * number of blocks published. */
size_t ckv_prefix_publish(ckv_srv_session *s);
/* New session s (no tokens yet): points its table at the longest run of the
 * tenant's indexed blocks whose keys match ids[0..n) (whole blocks only) and
 * appends their tokens.  *ret_matched: tokens it starts with (a multiple of
 * the draft block size, <= n).  Counts the lookup in the tenant's figures.
 * CKV_OK or -ENOMEM (nothing linked). */
int ckv_prefix_attach(ckv_srv_session *s, const uint32_t *ids, size_t n,
                      size_t *ret_matched);
/* How many leading tokens of ids[0..n) a new session of model
 * (model_id, model_revision) of tenant t could reuse: the best over the
 * geometries the tenant's sessions published.  Counts the lookup. */
size_t ckv_prefix_lookup(ckv_tenant *t, const char *model_id,
                         const char *model_revision, const uint32_t *ids,
                         size_t n);
/* Lookups a worker of t answered from the published index (shm/prefix_index.h):
 * `asked` tokens, `hit` of them matched, added to the tenant's figures. */
void ckv_prefix_count_lookups(ckv_tenant *t, uint64_t asked, uint64_t hit);
/* Child (new, same tenant, geometry and block sizes as parent, no tokens)
 * starts with parent's first `at` tokens: whole draft blocks are shared
 * (made shared blocks if they are not yet), the partial tail is copied into
 * a private draft block of the child.  Every token before `at` must be
 * reported and still in a draft block with no move in flight.
 * *ret_shared: tokens in shared blocks.  Returns CKV_OK, CKV_ERR_STATE (a
 * token before `at` was moved, recycled or is moving: the message says
 * which, in why), CKV_ERR_UNSUPPORTED (a tail copy on a device arena),
 * CKV_ERR_QUOTA / CKV_ERR_NOSPACE (the tail block), -ENOMEM. */
int ckv_prefix_fork(ckv_srv_session *parent, ckv_srv_session *child, size_t at,
                    size_t *ret_shared, char *why, size_t whylen);
/* Makes block idx of s (private, every valid slot one of s's tokens) a
 * shared block with s as its one holder, keyed with `key` when key is not
 * NULL (another block with that key indexed: not indexed).  The header
 * region must already be in the arena.  NULL on -ENOMEM. */
ckv_pblock *ckv_prefix_share_entry(ckv_srv_session *s, uint32_t idx,
                                   const ckv_pkey *key);
/* Whether block `idx` of s is frozen (shared with another session): no
 * move may touch it.  A shared block with s as its only holder is taken
 * back (out of the index, private again) and false is returned. */
bool ckv_prefix_frozen(ckv_srv_session *s, uint32_t idx);
/* Like ckv_prefix_frozen, changing nothing. */
bool ckv_prefix_is_frozen(const ckv_srv_session *s, uint32_t idx);

/* Warm restart: block `idx` of s was claimed at its old offset: noted, so a
 * later session holding the same offset shares it.  CKV_OK or -ENOMEM. */
int ckv_prefix_note_claim(ckv_srv_session *s, uint32_t idx);

/* Figures ---------------------------------------------------------------- */

/* Tokens of s that lie in blocks shared with another session. */
uint64_t ckv_prefix_session_shared_tokens(const ckv_srv_session *s);
/* Bytes of s's blocks shared with another session. */
uint64_t ckv_prefix_session_shared_bytes(const ckv_srv_session *s);
/* The tenant's figures: ckv_prefix_tenant_figures (shared.h). */

#endif
