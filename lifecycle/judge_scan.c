/* judge_scan.c - the AVX2 pre-scan of the rule judge (see judge_scan.h),
 * compiled for its target by attribute and called only where the CPU has
 * it.  Each lane evaluates, for one token, the conditions judge_rules()
 * tests before it would leave a committed token as it is. */
#include "lifecycle/judge_scan.h"

#include "lifecycle/tokens.h"

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static inline __m256i load8_u8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* a >= b, unsigned 32-bit lanes */
__attribute__((target("avx2"))) static inline __m256i ge_u32(__m256i a, __m256i b) {
  return _mm256_cmpeq_epi32(_mm256_max_epu32(a, b), a);
}

__attribute__((target("avx2"))) size_t ckv_judge_scan_avx2(const ckv_judge_scan *s, size_t p, size_t end,
                                                            uint32_t *out, size_t max, size_t *n_out) {
  const __m256i round = _mm256_set1_epi32((int)s->round), idle_rounds = _mm256_set1_epi32((int)s->idle_rounds);
  const __m256i frr = _mm256_set1_epi32((int)s->filler_recycle_rounds);
  const __m256i fact_q = _mm256_set1_epi32((int)s->fact_q), empty_q = _mm256_set1_epi32((int)s->empty_q);
  const __m256i committed = _mm256_set1_epi32(CKV_STATE_COMMITTED), one = _mm256_set1_epi32(CKV_STATE_STAGED);
  const __m256i staged_age = _mm256_set1_epi32((int)s->staged_age);
  const __m256i system = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
  const __m256i confirmed = _mm256_set1_epi32(4), fact_flag = _mm256_set1_epi32(CKV_TOKEN_FACT);
  const __m256i given = _mm256_set1_epi32(CKV_TOKEN_SEM_GIVEN);
  const __m256i filler_on = s->filler_recycle_rounds ? _mm256_set1_epi32(-1) : zero;
  const __m256i fact_cold_on = s->fact_cold_rounds ? _mm256_set1_epi32(-1) : zero;
  const __m256i fact_cold = _mm256_set1_epi32((int)s->fact_cold_rounds);
  size_t n = 0;
  for (; p + 8 <= end && n + 8 <= max; p += 8) {
    __m256i st = load8_u8(s->state + p), role = load8_u8(s->role + p);
    __m256i tags = load8_u8(s->tags + p), flags = load8_u8(s->flags + p);
    __m256i sem = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s->semantic + p)));
    __m256i idle = _mm256_sub_epi32(round, _mm256_loadu_si256((const __m256i *)(s->last_attended + p)));
    __m256i age = _mm256_sub_epi32(round, _mm256_loadu_si256((const __m256i *)(s->last_transition + p)));
    __m256i draft = _mm256_cmpeq_epi32(st, zero), staged = _mm256_cmpeq_epi32(st, one);
    __m256i is_committed = _mm256_cmpeq_epi32(st, committed);
    __m256i not_system = _mm256_xor_si256(_mm256_cmpeq_epi32(role, system), _mm256_set1_epi32(-1));
    __m256i is_given = _mm256_cmpeq_epi32(_mm256_and_si256(flags, given), given);
    /* sem values are below 2^16: the signed compares are the unsigned ones */
    __m256i fact = _mm256_or_si256(
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(tags, confirmed), confirmed),
                        _mm256_cmpeq_epi32(_mm256_and_si256(flags, fact_flag), fact_flag)),
        _mm256_and_si256(is_given, _mm256_cmpgt_epi32(_mm256_add_epi32(sem, _mm256_set1_epi32(1)), fact_q)));
    __m256i idle_out = _mm256_and_si256(ge_u32(idle, idle_rounds), not_system); /* recycled unless a lasting fact */
    /* a fact old enough to go cold: the rules read its attention */
    __m256i goes_idle = _mm256_or_si256(_mm256_andnot_si256(fact, idle_out),
                                        _mm256_and_si256(_mm256_and_si256(fact, fact_cold_on),
                                                         _mm256_and_si256(ge_u32(age, fact_cold), not_system)));
    __m256i filler = _mm256_and_si256(_mm256_and_si256(filler_on, ge_u32(age, frr)),
                                      _mm256_and_si256(not_system, _mm256_and_si256(is_given, _mm256_cmpgt_epi32(empty_q, sem))));
    __m256i staged_may = _mm256_or_si256(idle_out, ge_u32(age, staged_age)); /* a staged token is never a lasting fact */
    __m256i cand = _mm256_or_si256(_mm256_or_si256(draft, _mm256_and_si256(staged, staged_may)),
                                   _mm256_and_si256(is_committed, _mm256_or_si256(goes_idle, filler)));
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(cand));
    while (m) {
      out[n++] = (uint32_t)(p + (size_t)__builtin_ctz(m));
      m &= m - 1;
    }
  }
  *n_out = n;
  return p;
}

#else /* no vector path on this architecture: judge.c never calls it */

size_t ckv_judge_scan_avx2(const ckv_judge_scan *s, size_t p, size_t end, uint32_t *out, size_t max, size_t *n_out) {
  (void)s, (void)end, (void)out, (void)max;
  *n_out = 0;
  return p;
}

#endif
