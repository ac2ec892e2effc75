/* bench_gpu.cu - ckv-bench-gpu: the CUDA kernels' throughput against the
 * GPU's peak memory bandwidth (memory clock x bus width, read from the
 * device), and fused attention per format at 4K/32K/128K tokens.  Blocks are
 * built on the host with the CPU kernels and copied to the device (same
 * bytes).  Without a usable GPU it prints why and exits 0 ("skipped").
 * Usage: ckv-bench-gpu [--json] [--mib N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant.h"

namespace {

struct DevBlocks {
  uint8_t *mem = nullptr;
  std::vector<void *> blk;
  size_t each = 0;
};

/* n host-initialised empty blocks of fmt copied to one device allocation. */
bool dev_blocks(DevBlocks &d, uint32_t fmt, const ckv_geometry *g, uint32_t cap, size_t n, const void *const *fill) {
  d.each = ckv_format_block_bytes(fmt, g, cap, 0);
  if (cudaMalloc((void **)&d.mem, d.each * n) != cudaSuccess) return false;
  std::vector<uint8_t> tmp(d.each);
  for (size_t i = 0; i < n; i++) {
    if (fill)
      memcpy(tmp.data(), fill[i], d.each);
    else {
      memset(tmp.data(), 0, d.each);
      ckv_block_init(tmp.data(), fmt, g, cap, 0, 1);
    }
    cudaMemcpy(d.mem + i * d.each, tmp.data(), d.each, cudaMemcpyHostToDevice);
    d.blk.push_back(d.mem + i * d.each);
  }
  return true;
}

void *host_draft(const ckv_geometry *g, uint64_t seed) {
  size_t n = ckv_format_block_bytes(CKV_FORMAT_DRAFT, g, 16, 0);
  void *b = aligned_alloc(64, (n + 63) / 64 * 64);
  memset(b, 0, n);
  ckv_block_init(b, CKV_FORMAT_DRAFT, g, 16, 0, 1);
  uint64_t x = seed | 1;
  size_t te = ckv_draft_token_elems(g);
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t t = 0; t < 16; t++) {
        uint16_t *d = (uint16_t *)((uint8_t *)b + ckv_draft_kv_offset(g, 16, l, kv, t));
        for (size_t e = 0; e < te; e++) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          d[e] = ckv_f32_to_f16(((float)((x >> 40) & 0xffff) / 32768.0f - 1.0f) * ((x & 63) == 0 ? 20.0f : 2.0f));
        }
      }
  for (uint32_t t = 0; t < 16; t++) ckv_block_set_valid(b, t, true);
  return b;
}

} // namespace

int main(int argc, char **argv) {
  bool json = false;
  size_t mib = 256;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = true;
    else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoul(argv[++i], nullptr, 10);
  }
  if (ckv_cuda_available() != CKV_OK) {
    printf(json ? "{\"skipped\": \"%s\"}\n" : "ckv-bench-gpu: skipped: %s\n", ckv_cuda_unavailable_reason());
    return 0;
  }
  cudaDeviceProp prop;
  int clk = 0, bus = 0;
  cudaGetDeviceProperties(&prop, 0);
  cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, 0);
  double peak = 2.0 * clk * 1e3 * (bus / 8.0) / 1e9;
  /* Newer drivers may report no memory clock: the datasheet figure of known
   * parts, or CKV_GPU_PEAK_GBPS, rather than a ratio against zero. */
  if (const char *env = getenv("CKV_GPU_PEAK_GBPS")) peak = strtod(env, nullptr);
  if (peak < 1.0) {
    static const struct { const char *part; double gbps; } known[] = {
        {"H200", 4800}, {"H100 NVL", 3900}, {"H100 PCIe", 2000}, {"H100", 3350}, {"A100-SXM4-80GB", 2039},
        {"A100 80GB PCIe", 1935}, {"A100", 1555}, {"L40S", 864}, {"L4", 300}};
    for (const auto &k : known)
      if (strstr(prop.name, k.part)) {
        peak = k.gbps;
        break;
      }
  }
  fprintf(json ? stderr : stdout, "device: %s, memory clock %d kHz, bus %d bits, peak %.0f GB/s\n", prop.name, clk, bus, peak);

  const ckv_geometry g = {32, 8, 128, CKV_DTYPE_FP16};
  size_t tokens = (mib << 20) / (ckv_token_elems(&g) * 2) / 64 * 64;
  std::vector<void *> hd(tokens / 16);
  for (size_t i = 0; i < hd.size(); i++) hd[i] = host_draft(&g, i + 1);
  DevBlocks dr, st, c4, c2;
  if (!dev_blocks(dr, CKV_FORMAT_DRAFT, &g, 16, hd.size(), hd.data()) || !dev_blocks(st, CKV_FORMAT_STAGED, &g, 64, tokens / 64, nullptr) ||
      !dev_blocks(c4, CKV_FORMAT_COMMIT4, &g, 64, tokens / 64, nullptr) || !dev_blocks(c2, CKV_FORMAT_COMMIT2, &g, 64, tokens / 64, nullptr)) {
    fprintf(stderr, "ckv-bench-gpu: out of device memory\n");
    return 1;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  struct {
    const char *name;
    DevBlocks *dst;
    uint32_t fmt;
  } ops[] = {{"quantize_int8", &st, CKV_FORMAT_STAGED}, {"quantize_int4", &c4, CKV_FORMAT_COMMIT4}, {"quantize_int2", &c2, CKV_FORMAT_COMMIT2}};
  if (json) printf("{\"device\": \"%s\", \"peak_gbps\": %.1f, \"ops\": [", prop.name, peak);
  for (int o = 0; o < 3; o++) {
    std::vector<ckv_move> mv(tokens);
    for (size_t i = 0; i < tokens; i++) mv[i] = ckv_move{dr.blk[i / 16], (uint32_t)(i % 16), (uint32_t)(i % 64), ops[o].dst->blk[i / 64]};
    float best = 1e30f;
    for (int rep = 0; rep < 3; rep++) {
      /* fresh destinations: committed chunks seal */
      std::vector<uint8_t> tmp(ops[o].dst->each);
      for (void *b : ops[o].dst->blk) {
        ckv_block_init(tmp.data(), ops[o].fmt, &g, 64, 0, 1);
        cudaMemcpy(b, tmp.data(), ckv_block_payload_offset(64) + 64, cudaMemcpyHostToDevice);
        if (ckv_format_is_commit(ops[o].fmt))
          for (uint32_t l = 0; l < g.n_layers; l++)
            for (uint32_t h = 0; h < g.n_kv_heads; h++)
              cudaMemset((uint8_t *)b + ckv_commit_mask_offset(ops[o].fmt, &g, 64, 128, l, h), 0, 16);
      }
      cudaEventRecord(e0);
      ckv_status rc = ckv_cuda_move(&g, mv.data(), tokens, 0, nullptr);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      if (rc != CKV_OK) fprintf(stderr, "%s: %s\n", ops[o].name, ckv_strerror(rc));
      if (ms < best) best = ms;
    }
    double bytes = (double)dr.each * dr.blk.size() + (double)ops[o].dst->each * ops[o].dst->blk.size();
    double gbps = bytes / (best * 1e-3) / 1e9;
    if (json) printf("%s{\"name\": \"%s\", \"gbps\": %.2f, \"ratio_to_peak\": %.4f}", o ? ", " : "", ops[o].name, gbps, gbps / peak);
    else printf("%-16s %9.2f GB/s  %.3f of peak (includes host header reads)\n", ops[o].name, gbps, gbps / peak);
  }
  /* attention, one layer, int4 vs fp16 */
  const ckv_geometry ga = {1, 8, 128, CKV_DTYPE_FP16};
  if (json) printf("], \"attention\": [");
  size_t sizes[] = {4096, 32768, 131072};
  int first = 1;
  for (size_t tk : sizes) {
    std::vector<void *> h(tk / 16);
    for (size_t i = 0; i < h.size(); i++) h[i] = host_draft(&ga, 1000 + i);
    DevBlocks d16, d4;
    dev_blocks(d16, CKV_FORMAT_DRAFT, &ga, 16, h.size(), h.data());
    dev_blocks(d4, CKV_FORMAT_COMMIT4, &ga, 64, tk / 64, nullptr);
    std::vector<ckv_move> mv(tk);
    for (size_t i = 0; i < tk; i++) mv[i] = ckv_move{d16.blk[i / 16], (uint32_t)(i % 16), (uint32_t)(i % 64), d4.blk[i / 64]};
    ckv_cuda_move(&ga, mv.data(), tk, CKV_MOVE_SET_VALID, nullptr);
    float *q, *out;
    cudaMalloc(&q, 32 * 128 * 4);
    cudaMalloc(&out, 32 * 128 * 4);
    cudaMemset(q, 0, 32 * 128 * 4);
    double t16 = 0;
    for (int f = 0; f < 2; f++) {
      DevBlocks &b = f ? d4 : d16;
      ckv_attn_args a = {};
      a.geom = &ga, a.n_rows = 1, a.n_q_heads = 32, a.q = q, a.blocks = b.blk.data(), a.n_blocks = (uint32_t)b.blk.size(), a.out = out;
      float best = 1e30f;
      for (int rep = 0; rep < 3; rep++) {
        cudaEventRecord(e0);
        ckv_cuda_attention(&a, nullptr);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best) best = ms;
      }
      double gbps = (double)b.each * b.blk.size() / (best * 1e-3) / 1e9;
      if (!f) t16 = best;
      if (json)
        printf("%s{\"tokens\": %zu, \"format\": \"%s\", \"us_per_query\": %.1f, \"speedup_vs_fp16\": %.3f, \"gbps\": %.2f}",
               first ? "" : ", ", tk, f ? "int4" : "fp16", best * 1e3, t16 / best, gbps);
      else
        printf("attention %6zu tokens %-4s %10.1f us/query  %8.2f GB/s  %.3f of peak\n", tk, f ? "int4" : "fp16", best * 1e3, gbps, gbps / peak);
      first = 0;
    }
    cudaFree(q), cudaFree(out), cudaFree(d16.mem), cudaFree(d4.mem);
    for (void *x : h) free(x);
  }
  if (json) printf("]}\n");
  return 0;
}
