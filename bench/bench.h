/* bench.h - commitkv-bench subcommands.  Each bench_<name>.c implements one
 * entry point; main.c dispatches on argv[1].  Every subcommand prints a table
 * for people and, with --json, exactly one JSON object on stdout. */
#ifndef CKV_BENCH_H
#define CKV_BENCH_H

/* argv[0] is the subcommand name; returns a process exit code. */
int ckv_bench_kernels(int argc, char **argv);
int ckv_bench_control(int argc, char **argv);
int ckv_bench_quality(int argc, char **argv);
int ckv_bench_epoch(int argc, char **argv);
int ckv_bench_formats(int argc, char **argv);
int ckv_bench_soak(int argc, char **argv);
/* One verifying worker of soak --verify-workers (bench/soak_worker.c). */
int ckv_bench_soak_worker(int argc, char **argv);
int ckv_bench_tiers(int argc, char **argv);
/* N agents of one tenant on a shared prefix (issue 41). */
int ckv_bench_agents(int argc, char **argv);
/* kill -9 of commitkvd under a private systemd --user while workers write rounds (issue 43). */
int ckv_bench_failover(int argc, char **argv);

#endif
