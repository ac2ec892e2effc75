/* tests/fuzz/fuzz.h - the fuzz targets' entry points and a reader for their
 * input bytes.
 *
 * Each target is `int ckv_fuzz_<name>(const uint8_t *data, size_t size)` in
 * tests/fuzz/fuzz_<name>.c: libfuzzer_main.c wraps one of them into a
 * libFuzzer binary (clang, -fsanitize=fuzzer), and the Criterion suite
 * tests/unit/test_fuzz_regressions.c links all of them (gcc) to run every
 * seed and every reproducer in `make test`.  An entry sets up what it needs
 * once per process (ckv_fuzz_<name>_init, also called lazily), returns 0,
 * and abort()s when one of its own checks fails: that is a finding, like a
 * sanitizer report. */
#ifndef CKV_TESTS_FUZZ_H
#define CKV_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckv_fuzz_requests_init(void);
int ckv_fuzz_requests(const uint8_t *data, size_t size);
int ckv_fuzz_arena_init(void);
int ckv_fuzz_arena(const uint8_t *data, size_t size);
int ckv_fuzz_attach_frame_init(void);
int ckv_fuzz_attach_frame(const uint8_t *data, size_t size);
int ckv_fuzz_config_init(void);
int ckv_fuzz_config(const uint8_t *data, size_t size);
int ckv_fuzz_mlp_weights_init(void);
int ckv_fuzz_mlp_weights(const uint8_t *data, size_t size);
int ckv_fuzz_trace_init(void);
int ckv_fuzz_trace(const uint8_t *data, size_t size);
int ckv_fuzz_snapshot_init(void);
int ckv_fuzz_snapshot(const uint8_t *data, size_t size);

/* A failed invariant: say which, then abort so the fuzzer keeps the input. */
#define CKV_FUZZ_CHECK(cond, ...)                                       \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
      abort();                                                          \
    }                                                                   \
  } while (0)

/* Consumes input bytes front to back; past the end everything reads 0. */
typedef struct ckv_fuzz_in {
  const uint8_t *p;
  size_t n;
} ckv_fuzz_in;

static inline uint8_t ckv_fuzz_u8(ckv_fuzz_in *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}
static inline uint16_t ckv_fuzz_u16(ckv_fuzz_in *in) {
  uint16_t lo = ckv_fuzz_u8(in);
  return (uint16_t)(lo | (uint16_t)ckv_fuzz_u8(in) << 8);
}
static inline uint32_t ckv_fuzz_u32(ckv_fuzz_in *in) {
  uint32_t lo = ckv_fuzz_u16(in);
  return lo | (uint32_t)ckv_fuzz_u16(in) << 16;
}
/* Up to `want` bytes (fewer at the end): *ret points into the input. */
static inline size_t ckv_fuzz_bytes(ckv_fuzz_in *in, size_t want, const uint8_t **ret) {
  size_t n = want < in->n ? want : in->n;
  *ret = in->p;
  in->p += n;
  in->n -= n;
  return n;
}

/* The frame format of the request and attach targets (and of the seed
 * generator): 2-byte little-endian length, then that many bytes (fewer when
 * the input ends first). */
static inline size_t ckv_fuzz_frame(ckv_fuzz_in *in, const uint8_t **ret) {
  size_t len = ckv_fuzz_u16(in);
  return ckv_fuzz_bytes(in, len, ret);
}

#endif
