/* bench_judge.h - the judge's part of `commitkv-bench control`: tokens judged
 * per second on one core and ReportRound latency (record the round's
 * attention + run the judge + plan the moves; compression excluded) for
 * sessions of 4K, 32K, 128K, 512K and 1M tokens, measured in-process on the daemon's
 * own modules. */
#ifndef CKV_BENCH_JUDGE_H
#define CKV_BENCH_JUDGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckv_judge_bench {
  uint64_t tokens;
  double tokens_per_s;    /* judge pass alone */
  double round_p50_us;    /* record + judge + plan */
  double round_p99_us;
  double record_p50_us;   /* recording the round's attention alone */
  double record_p99_us;
  double judge_p50_us;    /* judge + plan */
  double judge_p99_us;
  double cpu_p50_us;      /* the whole round in this thread's CPU time (the machine may be shared) */
  double cpu_p99_us;
  uint64_t rounds;
  uint64_t transitions;   /* decided over the measured rounds */
  uint32_t judge_every;   /* the parameters it ran with */
  float far_sample;
} ckv_judge_bench;

/* Measures one session size; returns 0 or a negative status. */
int ckv_bench_judge_run(uint64_t tokens, double seconds, ckv_judge_bench *ret);
/* The same with judge_every and far_sample set (1 and 1: the defaults). */
int ckv_bench_judge_run_sampled(uint64_t tokens, double seconds, uint32_t judge_every, float far_sample,
                                ckv_judge_bench *ret);

#endif
