/* compact.h - same-format token copies, for compaction.
 *
 * Tokens leave blocks one by one (promotion, recycling), so blocks empty out
 * unevenly; a block with a single survivor costs as much as a full one.
 * Compaction copies the survivors of sparse draft and staged blocks into the
 * current fill block of the same format (bytes as they are: no
 * requantisation, no loss), publishes, and lets the emptied block retire.
 * Committed blocks are quantized a 32-token chunk at a time and are not
 * compacted. */
#ifndef CKV_STORE_COMPACT_H
#define CKV_STORE_COMPACT_H

#include <stddef.h>

#include "kernels/kernels.h"

/* Copies each move's token (all layers, K and V, scales included) and its
 * position; source and destination blocks must have the same format, which
 * must be draft or staged.  Valid bits are not touched (publish sets them).
 * Returns CKV_OK, CKV_ERR_FORMAT or CKV_ERR_UNSUPPORTED (committed). */
int ckv_copy_slots(const ckv_geometry *g, const ckv_move *moves, size_t n_moves);

#endif
