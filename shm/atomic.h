/* shm/atomic.h - acquire/release access to words that two processes share.
 *
 * Shared-memory structs (arena headers, block headers, rings) are declared with
 * plain fixed-width integers so that one layout compiles as C and as CUDA and
 * can be pinned by _Static_assert.  Every load or store of such a word that
 * another process may touch at the same time goes through these helpers
 * (liburing's barrier.h does the same): they view the plain word as a C11
 * _Atomic object of the same size and alignment and access it with an explicit
 * memory order.  Lock-free 32- and 64-bit atomics are address-free on every
 * platform we build for, so they work across processes mapping the same pages.
 *
 * Use ckv_store_release_* to publish a word after the data it guards has been
 * written, and ckv_load_acquire_* to read it before reading that data.  The
 * *_relaxed helpers are for counters and statistics with no ordering meaning. */
#ifndef CKV_SHM_ATOMIC_H
#define CKV_SHM_ATOMIC_H

#include <stdatomic.h>
#include <stdint.h>

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free to be shared");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to be shared");
_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "atomic u32 differs in size");
_Static_assert(sizeof(_Atomic uint64_t) == sizeof(uint64_t), "atomic u64 differs in size");
_Static_assert(_Alignof(_Atomic uint64_t) == _Alignof(uint64_t), "atomic u64 differs in alignment");

static inline uint32_t ckv_load_acquire_u32(const uint32_t *p) {
  return atomic_load_explicit((const _Atomic uint32_t *)p, memory_order_acquire);
}

static inline uint64_t ckv_load_acquire_u64(const uint64_t *p) {
  return atomic_load_explicit((const _Atomic uint64_t *)p, memory_order_acquire);
}

static inline void ckv_store_release_u32(uint32_t *p, uint32_t v) {
  atomic_store_explicit((_Atomic uint32_t *)p, v, memory_order_release);
}

static inline void ckv_store_release_u64(uint64_t *p, uint64_t v) {
  atomic_store_explicit((_Atomic uint64_t *)p, v, memory_order_release);
}

static inline uint32_t ckv_load_relaxed_u32(const uint32_t *p) {
  return atomic_load_explicit((const _Atomic uint32_t *)p, memory_order_relaxed);
}

static inline uint64_t ckv_load_relaxed_u64(const uint64_t *p) {
  return atomic_load_explicit((const _Atomic uint64_t *)p, memory_order_relaxed);
}

static inline void ckv_store_relaxed_u64(uint64_t *p, uint64_t v) {
  atomic_store_explicit((_Atomic uint64_t *)p, v, memory_order_relaxed);
}

/* Returns the previous value. */
static inline uint64_t ckv_fetch_add_u64(uint64_t *p, uint64_t v) {
  return atomic_fetch_add_explicit((_Atomic uint64_t *)p, v, memory_order_acq_rel);
}

#endif
