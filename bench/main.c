/* main.c - commitkv-bench: dispatches to one benchmark per subcommand. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"

typedef struct bench_cmd {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} bench_cmd;

/* Weak so the binary links while a subcommand is still being written. */
__attribute__((weak)) int ckv_bench_kernels(int argc, char **argv);
__attribute__((weak)) int ckv_bench_control(int argc, char **argv);
__attribute__((weak)) int ckv_bench_quality(int argc, char **argv);
__attribute__((weak)) int ckv_bench_epoch(int argc, char **argv);
__attribute__((weak)) int ckv_bench_formats(int argc, char **argv);
__attribute__((weak)) int ckv_bench_soak(int argc, char **argv);
__attribute__((weak)) int ckv_bench_soak_worker(int argc, char **argv);
__attribute__((weak)) int ckv_bench_tiers(int argc, char **argv);
__attribute__((weak)) int ckv_bench_agents(int argc, char **argv);
__attribute__((weak)) int ckv_bench_failover(int argc, char **argv);

int main(int argc, char **argv) {
  const bench_cmd cmds[] = {
      {"kernels", ckv_bench_kernels, "kernel throughput vs memcpy, fused attention per format [--json]"},
      {"control", ckv_bench_control, "control-plane requests/s and latency vs a ZeroMQ echo [--workers N] [--json]"},
      {"epoch", ckv_bench_epoch, "attach/import time; ReportRound -> published epoch for a 32K-token session [--backend B] [--json]"},
      {"formats", ckv_bench_formats, "bits per element and K/V error of every format on a real model's K/V [--json]"},
      {"tiers", ckv_bench_tiers, "offload/restore GB/s per tier vs plain I/O; resume of a 32K-token session vs its prefill [--json]"},
      {"soak", ckv_bench_soak, "workers appending, reporting and reading with kills and daemon restarts [--json]"},
      {"failover", ckv_bench_failover, "kill -9 of commitkvd under systemd --user mid-round: time to the first round, tokens kept, bytes verified [--json] [--quick]"},
      {"soak-worker", ckv_bench_soak_worker, "(run by soak --verify-workers) drops, reuses ids, checks every byte"},
      {"agents", ckv_bench_agents, "N agents on one shared prefix: bytes vs FP16 private, prefill saved, lookup p99 [--json] [--quick]"},
      {"quality", ckv_bench_quality, "every policy vs FP16 on agent and real-model workloads [--json] [--plot F.png] [--quick]"},
  };
  const size_t n = sizeof(cmds) / sizeof(cmds[0]);
  if (argc >= 2) {
    for (size_t i = 0; i < n; i++)
      if (strcmp(argv[1], cmds[i].name) == 0) {
        if (!cmds[i].run) {
          fprintf(stderr, "commitkv-bench: '%s' is not built in this binary\n", argv[1]);
          return 2;
        }
        return cmds[i].run(argc - 1, argv + 1);
      }
  }
  fprintf(stderr, "usage: commitkv-bench COMMAND [options]\n\ncommands:\n");
  for (size_t i = 0; i < n; i++) fprintf(stderr, "  %-10s %s\n", cmds[i].name, cmds[i].help);
  return argc >= 2 && strcmp(argv[1], "--help") != 0 ? 2 : 0;
}
