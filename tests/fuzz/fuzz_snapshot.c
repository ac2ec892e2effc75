/* tests/fuzz/fuzz_snapshot.c - the snapshot reader (persist/snapshot.c): the
 * input is a snapshot file's bytes, as RestoreSession or a resume reads them
 * from the state directory.  Every section's checksum, length and the
 * cross-references (token -> block slot -> position) are checked by the
 * reader; this target checks that whatever it accepts is self-consistent
 * (every token's block is one of the snapshot's blocks and its slot within
 * that block's capacity) and that refusing never leaks.
 *
 * Random bytes would almost never get past the XXH64 of a section, so the
 * first input byte chooses: odd, the sections' checksums are recomputed
 * (docs/snapshot.md: 24-byte header, XXH64 of its first 16 bytes and the
 * payload) before parsing, which lets the fuzzer reach the tables; even,
 * the bytes are parsed as they are (the checksums' own refusals). */
#include <string.h>
#include <xxhash.h>

#include "commitkv/status.h"
#include "persist/snapshot.h"
#include "fuzz.h"

static void fix_checksums(uint8_t *b, size_t n) {
  size_t o = 16; /* the preamble */
  while (o + 24 <= n) {
    uint64_t len;
    memcpy(&len, b + o + 8, 8);
    if (len > n - o - 24) return;
    XXH64_state_t *st = XXH64_createState();
    if (!st) return;
    XXH64_reset(st, 0);
    XXH64_update(st, b + o, 16);
    XXH64_update(st, b + o + 24, (size_t)len);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    memcpy(b + o + 16, &h, 8);
    o += 24 + (size_t)len;
  }
}

int ckv_fuzz_snapshot_init(void) { return 0; }

int ckv_fuzz_snapshot(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  ckv_snap s;
  char err[512];
  uint8_t *b = malloc(size - 1 ? size - 1 : 1);
  if (!b) return 0;
  memcpy(b, data + 1, size - 1);
  if (data[0] & 1) fix_checksums(b, size - 1);
  int r = ckv_snap_parse(b, size - 1, &s, err, sizeof(err));
  CKV_FUZZ_CHECK(r != -12, "parsing %zu bytes ran out of memory", size);
  if (r != CKV_OK) {
    CKV_FUZZ_CHECK(err[0] != '\0', "refused (%d) without a text", r);
    free(b);
    return 0;
  }
  for (size_t p = 0; p < s.tokens.n; p++) {
    uint32_t blk = s.tokens.block[p];
    if (blk == CKV_NO_BLOCK) continue;
    size_t k = 0;
    while (k < s.n_blocks && s.blocks[k].index != blk) k++;
    CKV_FUZZ_CHECK(k < s.n_blocks, "token %zu names block %u, which the snapshot does not hold", p, blk);
    CKV_FUZZ_CHECK(s.tokens.slot[p] < s.blocks[k].capacity, "token %zu: slot %u beyond capacity %u", p,
                   s.tokens.slot[p], s.blocks[k].capacity);
  }
  ckv_snap_done(&s);
  free(b);
  return 0;
}
