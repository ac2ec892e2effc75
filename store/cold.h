/* cold.h - a session's cold tier: demoted tokens.
 *
 * With the demote parameter (lifecycle/policy.h) a recycled token keeps its
 * bytes, in a committed format (moves.c commits draft and staged ones in
 * cold_bits first); only a quota rule drops it for good (moves.c
 * ckv_moves_reclaim, counted in tokens_dropped).  A committed block all of
 * whose tokens are demoted is *cold*: the view lists it apart (View.cold),
 * attention skips it unless the worker's query could need it
 * (ckv_session_cold_select), and it counts in the session's cold bytes,
 * not its primary ones.  A demoted token the worker reports attended again
 * (relative attention >= recall_attn) is recalled: committed again, its
 * block primary again.
 *
 * On the host backend the cold blocks stay in the tenant's arena (host
 * memory either way); moving them to a separate host arena on GPU hosts, and
 * to disk, is not built yet (docs/tiers.md). */
#ifndef CKV_STORE_COLD_H
#define CKV_STORE_COLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/session.h"

/* Whether block `idx` is cold: committed, not being filled, holding at
 * least one token, every one of them demoted. */
bool ckv_cold_block(const ckv_srv_session *s, uint32_t idx);

/* Notes the demoted tokens a report finds attended at or above recall_attn
 * (relative to an average live token); ckv_moves_round recalls them.  Call
 * before the report is recorded.  Returns -ENOMEM or CKV_OK. */
int ckv_cold_note_report(ckv_srv_session *s, uint64_t first, const float *attn, size_t n);

typedef struct ckv_cold_figures {
  uint64_t cold_bytes;      /* bytes of cold blocks */
  uint64_t cold_tokens;     /* demoted tokens (recycled, bytes kept) */
  uint64_t dropped_tokens;  /* tokens whose bytes went for good */
  uint64_t recalled_tokens; /* demoted tokens recalled to committed */
  uint64_t recalled_blocks; /* cold blocks the worker said it read (ReportRound.recalled_blocks) */
} ckv_cold_figures;

/* Adds the session's figures to *add. */
void ckv_cold_figures_add(const ckv_srv_session *s, ckv_cold_figures *add);

#endif
