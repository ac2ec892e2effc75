/* force_inline.h - AI: `static inline`, forced (always_inline) except under
 * AddressSanitizer, for the SIMD tiles' small helpers.
 *
 * Forced inlining keeps a tile's accumulators in registers; under
 * AddressSanitizer clang-14 spends minutes and gigabytes on the forced
 * expansion of the attention files (the fuzz build: >5 min, >4 GB; 7 s
 * without), and speed does not matter there. */
#ifndef CKV_KERNELS_FORCE_INLINE_H
#define CKV_KERNELS_FORCE_INLINE_H

#if defined(__SANITIZE_ADDRESS__)
#define AI static inline
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AI static inline
#endif
#endif
#ifndef AI
#define AI static inline __attribute__((always_inline))
#endif

#endif
