/* attention.cu - fused decode attention on the GPU over blocks of mixed
 * formats, read in place and dequantized in registers.
 *
 * Kernels: headers (every block's header and seal word gathered in one
 * launch and one copy back, instead of two synchronous copies per block),
 * scores (a CUDA block per (KV block, KV head); a warp per slot reading the
 * key row together against the query tile in shared memory, or, for
 * prefill-sized query tiles, a thread per slot; every query head of the
 * group, all rows; empty slots and unsealed chunks get -inf), softmax statistics (max and sum per query head and row, a
 * numerically stable two-pass reduction over the materialised scores),
 * output split over the tokens (a CUDA block per (query head and row, run of
 * blocks holding about SPLIT_TOKENS slots), a thread per dim, partial sums
 * reduced in split order so results do not depend on scheduling) and
 * per-slot mass.  Scores are materialised (slots x query heads floats, 16 MB
 * at 128K tokens x 32 heads) rather than merged online as on the CPU.
 * Rotated blocks (formats v2) are scored against the query rotated once per
 * call (k_rotate_q) and their values summed in the rotated basis into a
 * second set of partials, rotated back once per output vector in
 * k_out_reduce, as on the CPU.
 * TODO(perf): online softmax in one pass with shared-memory K/V tiles. */
#include <vector>

#include "kernels/cuda/cuda_internal.h"

namespace {

/* Slots per output split: enough splits to fill the GPU at 32K tokens. */
constexpr uint32_t SPLIT_TOKENS = 256;

/* What the host needs of a block before launching: header and seal word. */
struct HeadInfo {
  ckv_block_header h;
  uint32_t sealed, ok;
};

__global__ void k_headers(ckv_geometry g, const uint8_t *const *ptrs, uint32_t n, HeadInfo *out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  HeadInfo r;
  r.h = *(const ckv_block_header *)ptrs[i];
  r.sealed = 0;
  r.ok = r.h.magic == CKV_BLOCK_MAGIC && ckv_format_valid(r.h.format, &g, r.h.capacity, r.h.kept_channels);
  if (r.ok && ckv_format_is_commit(r.h.format)) r.sealed = *(const uint32_t *)(ptrs[i] + ckv_commit_meta_offset(r.h.capacity));
  out[i] = r;
}

struct BlockDev {
  const uint8_t *p;
  uint32_t fmt, cap, kept, sealed;
  uint64_t base;
};

__device__ bool slot_ok(const BlockDev &b, uint32_t t) {
  const uint64_t *w = (const uint64_t *)(b.p + ckv_block_bitmap_offset(b.cap));
  if (!((w[t / 64] >> (t % 64)) & 1u)) return false;
  return !ckv_format_is_commit(b.fmt) || ((b.sealed >> (t / CKV_COMMIT_CHUNK_TOKENS)) & 1u);
}

/* The key channels a committed block keeps for (layer L, head h), in order:
 * idx[j] is the head-dim channel of stored channel j (one thread writes). */
__device__ void kept_channels(const ckv_geometry &g, const BlockDev &b, uint32_t L, uint32_t h, uint32_t *idx) {
  const uint64_t *mask = (const uint64_t *)(b.p + ckv_commit_mask_offset(b.fmt, &g, b.cap, b.kept, L, h));
  uint32_t n = 0;
  for (uint32_t c = 0; c < g.head_dim; c++)
    if ((mask[c / 64] >> (c % 64)) & 1u) idx[n++] = c;
}

/* One thread per (row, query head): q rotated with its KV head's key rotation. */
__global__ void k_rotate_q(ckv_geometry g, uint32_t L, const float *q, uint32_t n, uint32_t G, float *qr) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, D = g.head_dim, QH = G * g.n_kv_heads;
  if (i >= n) return;
  float x[CKV_MAX_HEAD_DIM];
  for (uint32_t d = 0; d < D; d++) x[d] = q[(size_t)i * D + d];
  ckv_rot_forward(x, D, L, 0, (i % QH) / G);
  for (uint32_t d = 0; d < D; d++) qr[(size_t)i * D + d] = x[d];
}

/* Key element d of a rotated block's slot t, head h (still rotated). */
__device__ float rot_key(const ckv_geometry &g, const BlockDev &b, uint32_t L, uint32_t h, uint32_t t, uint32_t d) {
  uint32_t bits = ckv_format_code_bits(b.fmt);
  size_t k = (size_t)t * g.n_kv_heads + h;
  const uint8_t *row = b.p + ckv_rot_codes_offset(b.fmt, &g, b.cap, L, 0) + k * ckv_rot_row_bytes(b.fmt, &g);
  float sc = ckv_rot_scale_value((b.p + ckv_rot_scales_offset(b.fmt, &g, b.cap, L, 0))[k]);
  const uint16_t *mean = (const uint16_t *)(b.p + ckv_rot_mean_offset(&g, b.cap, L, h));
  return ckv_rot_value(ckv_unpack_code(row, d, bits), sc, bits) + ckv_rot_finite(ckv_f16_to_f32(mean[d]));
}

__global__ void k_scores(ckv_geometry g, uint32_t L, const BlockDev *blocks, const float *q_plain, const float *q_rot,
                         float scale, uint32_t QH, uint32_t G, uint32_t RG, uint64_t total, float *S) {
  const BlockDev b = blocks[blockIdx.x];
  const bool rot = ckv_format_is_rot(b.fmt);
  const float *q = rot ? q_rot : q_plain;
  uint32_t h = blockIdx.y, D = g.head_dim;
  __shared__ uint32_t idx[CKV_MAX_HEAD_DIM];
  bool commit = ckv_format_is_commit(b.fmt);
  if (commit && threadIdx.x == 0) kept_channels(g, b, L, h, idx);
  __syncthreads();
  uint32_t bits = ckv_format_code_bits(b.fmt);
  for (uint32_t t = threadIdx.x; t < b.cap; t += blockDim.x) {
    bool ok = slot_ok(b, t);
    const uint8_t *ch = nullptr, *row = nullptr;
    if (ok && commit) {
      ch = b.p + ckv_commit_key_chunk_offset(b.fmt, &g, b.cap, b.kept, L, h, t / CKV_COMMIT_CHUNK_TOKENS);
      row = ch + (size_t)b.kept * 4u + (t % CKV_COMMIT_CHUNK_TOKENS) * ckv_commit_key_row_bytes(b.fmt, b.kept);
    }
    for (uint32_t rg = 0; rg < RG; rg++) {
      float *out = S + ((uint64_t)h * RG + rg) * total + b.base + t;
      if (!ok) {
        *out = -INFINITY;
        continue;
      }
      const float *qv = q + ((size_t)(rg / G) * QH + (size_t)h * G + rg % G) * D;
      float acc = 0.0f;
      if (rot) {
        for (uint32_t d = 0; d < D; d++) acc += qv[d] * rot_key(g, b, L, h, t, d);
      } else if (!commit) {
        for (uint32_t d = 0; d < D; d++) acc += qv[d] * ckv_dev_read(g, b.p, b.fmt, b.cap, L, 0, t, (size_t)h * D + d);
      } else {
        const uint16_t *sc = (const uint16_t *)ch, *zp = sc + b.kept;
        for (uint32_t j = 0; j < b.kept; j++)
          acc += qv[idx[j]] * ckv_mul_add((float)ckv_unpack_code(row, j, bits), ckv_f16_to_f32(sc[j]), ckv_f16_to_f32(zp[j]));
      }
      *out = acc * scale;
    }
  }
}

/* Largest query tile (rows x group heads x head_dim floats) the warp kernel
 * keeps in shared memory; bigger calls (prefill-sized) take k_scores. */
constexpr uint32_t WARP_SCORES_MAX_Q = 8192; /* 32 KiB */
constexpr uint32_t MAX_LANE_ELEMS = CKV_MAX_HEAD_DIM / 32;

__device__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* k_scores with a warp per slot: the lanes read one key row together
 * (coalesced), keep it in registers and reduce one dot product per query
 * (head of the group, row) against the query tile in shared memory.
 * Same results as k_scores up to FP32 summation order. */
__global__ void __launch_bounds__(128, 3) k_scores_warp(ckv_geometry g, uint32_t L, const BlockDev *blocks, const float *q_plain,
                              const float *q_rot, float scale, uint32_t QH, uint32_t G, uint32_t RG, uint64_t total, float *S) {
  const BlockDev b = blocks[blockIdx.x];
  const bool rot = ckv_format_is_rot(b.fmt);
  const float *q = rot ? q_rot : q_plain;
  const uint32_t h = blockIdx.y, D = g.head_dim, lane = threadIdx.x % 32u, warp = threadIdx.x / 32u,
                 nw = blockDim.x / 32u;
  extern __shared__ float qs[]; /* [RG][D] */
  __shared__ uint32_t idx[CKV_MAX_HEAD_DIM];
  for (uint32_t i = threadIdx.x; i < RG * D; i += blockDim.x) {
    uint32_t rg = i / D, d = i % D;
    qs[i] = q[((size_t)(rg / G) * QH + (size_t)h * G + rg % G) * D + d];
  }
  const bool commit = ckv_format_is_commit(b.fmt);
  if (commit && threadIdx.x == 0) kept_channels(g, b, L, h, idx);
  __syncthreads();
  const uint32_t bits = ckv_format_code_bits(b.fmt), n_el = commit ? b.kept : D;
  for (uint32_t t = warp; t < b.cap; t += nw) {
    if (!slot_ok(b, t)) {
      for (uint32_t rg = lane; rg < RG; rg += 32) S[((uint64_t)h * RG + rg) * total + b.base + t] = -INFINITY;
      continue;
    }
    float kr[MAX_LANE_ELEMS];
    uint32_t qi[MAX_LANE_ELEMS];
    if (rot) {
#pragma unroll
      for (uint32_t i = 0; i < MAX_LANE_ELEMS; i++) {
        uint32_t d = lane + 32u * i;
        kr[i] = d < D ? rot_key(g, b, L, h, t, d) : 0.0f;
        qi[i] = d < D ? d : 0;
      }
    } else if (!commit) {
#pragma unroll
      for (uint32_t i = 0; i < MAX_LANE_ELEMS; i++) {
        uint32_t d = lane + 32u * i;
        kr[i] = d < D ? ckv_dev_read(g, b.p, b.fmt, b.cap, L, 0, t, (size_t)h * D + d) : 0.0f;
        qi[i] = d < D ? d : 0;
      }
    } else {
      const uint8_t *ch = b.p + ckv_commit_key_chunk_offset(b.fmt, &g, b.cap, b.kept, L, h, t / CKV_COMMIT_CHUNK_TOKENS);
      const uint8_t *row = ch + (size_t)b.kept * 4u + (t % CKV_COMMIT_CHUNK_TOKENS) * ckv_commit_key_row_bytes(b.fmt, b.kept);
      const uint16_t *sc = (const uint16_t *)ch, *zp = sc + b.kept;
#pragma unroll
      for (uint32_t i = 0; i < MAX_LANE_ELEMS; i++) {
        uint32_t j = lane + 32u * i;
        kr[i] = j < n_el ? ckv_mul_add((float)ckv_unpack_code(row, j, bits), ckv_f16_to_f32(sc[j]), ckv_f16_to_f32(zp[j]))
                         : 0.0f;
        qi[i] = j < n_el ? idx[j] : 0;
      }
    }
    for (uint32_t rg = 0; rg < RG; rg++) {
      const float *qv = qs + (size_t)rg * D;
      float acc = 0.0f;
#pragma unroll
      for (uint32_t i = 0; i < MAX_LANE_ELEMS; i++)
        if (lane + 32u * i < n_el) acc += qv[qi[i]] * kr[i];
      acc = warp_sum(acc);
      if (lane == 0) S[((uint64_t)h * RG + rg) * total + b.base + t] = acc * scale;
    }
  }
}

__global__ void k_stats(const float *S, uint64_t total, float *m_out, float *l_out) {
  __shared__ float red[256];
  const float *s = S + (uint64_t)blockIdx.x * total;
  float m = -INFINITY;
  for (uint64_t i = threadIdx.x; i < total; i += blockDim.x) m = fmaxf(m, s[i]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (uint32_t o = blockDim.x / 2; o; o >>= 1) {
    if (threadIdx.x < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float l = 0.0f;
  if (m != -INFINITY)
    for (uint64_t i = threadIdx.x; i < total; i += blockDim.x)
      if (s[i] != -INFINITY) l += expf(s[i] - m);
  red[threadIdx.x] = l;
  __syncthreads();
  for (uint32_t o = blockDim.x / 2; o; o >>= 1) {
    if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    m_out[blockIdx.x] = m;
    l_out[blockIdx.x] = red[0];
  }
}

/* Value element e of slot t; rotated blocks give it in the rotated basis of its head. */
__device__ float value_at(const ckv_geometry &g, const BlockDev &b, uint32_t L, uint32_t t, size_t e) {
  if (ckv_format_is_rot(b.fmt)) {
    uint32_t bits = ckv_format_code_bits(b.fmt), h = (uint32_t)(e / g.head_dim);
    size_t k = (size_t)t * g.n_kv_heads + h;
    const uint8_t *row = b.p + ckv_rot_codes_offset(b.fmt, &g, b.cap, L, 1) + k * ckv_rot_row_bytes(b.fmt, &g);
    float sc = ckv_rot_scale_value((b.p + ckv_rot_scales_offset(b.fmt, &g, b.cap, L, 1))[k]);
    return ckv_rot_value(ckv_unpack_code(row, e % g.head_dim, bits), sc, bits);
  }
  if (!ckv_format_is_commit(b.fmt)) return ckv_dev_read(g, b.p, b.fmt, b.cap, L, 1, t, e);
  uint32_t bits = ckv_format_code_bits(b.fmt), ng = ckv_commit_value_groups(&g), q = (uint32_t)(e / CKV_COMMIT_VALUE_GROUP);
  const uint16_t *par = (const uint16_t *)(b.p + ckv_commit_value_params_offset(b.fmt, &g, b.cap, b.kept, L)) + (size_t)t * ng * 2u;
  const uint8_t *row = b.p + ckv_commit_value_codes_offset(b.fmt, &g, b.cap, b.kept, L) + (size_t)t * ckv_commit_value_row_bytes(b.fmt, &g);
  return ckv_mul_add((float)ckv_unpack_code(row, e, bits), ckv_f16_to_f32(par[2u * q]), ckv_f16_to_f32(par[2u * q + 1u]));
}

/* Partial output of one split: blocks [first_block[split], first_block[split + 1]). */
__global__ void k_out_split(ckv_geometry g, uint32_t L, const BlockDev *blocks, const uint32_t *first_block,
                            const float *S, uint64_t total, const float *m_in, const float *l_in, uint32_t RG,
                            float *partial) {
  uint32_t hr = blockIdx.x, split = blockIdx.y, h = hr / RG, d = threadIdx.x, D = g.head_dim;
  if (d >= D) return;
  float m = m_in[hr], l = l_in[hr], acc = 0.0f, racc = 0.0f;
  const float *s = S + (uint64_t)hr * total;
  if (l > 0.0f)
    for (uint32_t bi = first_block[split]; bi < first_block[split + 1]; bi++) {
      const BlockDev b = blocks[bi];
      const bool rot = ckv_format_is_rot(b.fmt);
      for (uint32_t t = 0; t < b.cap; t++) {
        float sc = s[b.base + t];
        if (sc == -INFINITY) continue;
        float v = expf(sc - m) * value_at(g, b, L, t, (size_t)h * D + d);
        if (rot)
          racc += v;
        else
          acc += v;
      }
    }
  /* the rotated partials follow the plain ones: [2][split][hr][D] */
  uint64_t plane = (uint64_t)gridDim.y * gridDim.x * D;
  partial[((uint64_t)split * gridDim.x + hr) * D + d] = acc;
  partial[plane + ((uint64_t)split * gridDim.x + hr) * D + d] = racc;
}

__global__ void k_out_reduce(ckv_geometry g, uint32_t L, const float *partial, uint32_t n_splits, const float *l_in,
                             uint32_t QH, uint32_t G, uint32_t RG, int has_rot, float *out) {
  uint32_t hr = blockIdx.x, h = hr / RG, rg = hr % RG, d = threadIdx.x, D = g.head_dim, HR = gridDim.x;
  __shared__ float rsum[CKV_MAX_HEAD_DIM];
  uint64_t plane = (uint64_t)n_splits * HR * D;
  float acc = 0.0f, racc = 0.0f, l = l_in[hr];
  if (d < D)
    for (uint32_t sp = 0; sp < n_splits; sp++) {
      acc += partial[((uint64_t)sp * HR + hr) * D + d];
      racc += partial[plane + ((uint64_t)sp * HR + hr) * D + d];
    }
  if (has_rot) { /* the rotated sum back to the model's basis: one thread, the whole head */
    if (d < D) rsum[d] = racc;
    __syncthreads();
    if (d == 0) ckv_rot_inverse(rsum, D, L, 1, h);
    __syncthreads();
    if (d < D) acc += rsum[d];
  }
  if (d < D) out[((size_t)(rg / G) * QH + (size_t)h * G + rg % G) * D + d] = l > 0.0f ? acc / l : 0.0f;
}

__global__ void k_mass(const float *S, uint64_t total, uint32_t HR, const float *m_in, const float *l_in, float *mass) {
  uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  float acc = 0.0f;
  for (uint32_t hr = 0; hr < HR; hr++) {
    float s = S[(uint64_t)hr * total + i];
    if (s != -INFINITY && l_in[hr] > 0.0f) acc += expf(s - m_in[hr]) / l_in[hr];
  }
  mass[i] = acc;
}

/* Scratch in stream order (cudaMallocAsync/cudaFreeAsync): no allocation or
 * free synchronises the device behind the caller's other streams. */
struct DevMem {
  cudaStream_t s;
  void *p[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  explicit DevMem(cudaStream_t st) : s(st) {}
  cudaError_t alloc(int i, size_t n) { return cudaMallocAsync(&p[i], n, s); }
  ~DevMem() {
    for (void *x : p)
      if (x) cudaFreeAsync(x, s);
  }
};

} // namespace

extern "C" ckv_status ckv_cuda_attention(const ckv_attn_args *a, void *stream) {
  if (ckv_cuda_available() != CKV_OK) return CKV_ERR_DEVICE;
  if (!a || !a->geom || !a->q || !a->out || (!a->blocks && a->n_blocks)) return CKV_ERR_INVALID;
  const ckv_geometry *g = a->geom;
  if (!ckv_format_valid(CKV_FORMAT_DRAFT, g, 1, 0)) return CKV_ERR_INVALID;
  if (a->layer >= g->n_layers) return CKV_ERR_RANGE;
  if (a->n_rows == 0 || a->n_q_heads == 0 || a->n_q_heads % g->n_kv_heads) return CKV_ERR_INVALID;
  cudaStream_t s = (cudaStream_t)stream;
  for (uint32_t i = 0; i < a->n_blocks; i++)
    if (!a->blocks[i]) return CKV_ERR_INVALID; /* checked here: the header kernel would fault on it */
  std::vector<BlockDev> bl(a->n_blocks);
  uint64_t total = 0;
  DevMem mem(s);
  if (a->n_blocks) {
    /* Every header in one launch and one copy back. */
    std::vector<HeadInfo> hi(a->n_blocks);
    CKV_CUDA_TRY(mem.alloc(4, a->n_blocks * sizeof(void *)));
    CKV_CUDA_TRY(mem.alloc(5, a->n_blocks * sizeof(HeadInfo)));
    CKV_CUDA_TRY(cudaMemcpyAsync(mem.p[4], a->blocks, a->n_blocks * sizeof(void *), cudaMemcpyHostToDevice, s));
    k_headers<<<(a->n_blocks + 127u) / 128u, 128, 0, s>>>(*g, (const uint8_t *const *)mem.p[4], a->n_blocks,
                                                          (HeadInfo *)mem.p[5]);
    CKV_CUDA_TRY(cudaGetLastError());
    CKV_CUDA_TRY(cudaMemcpyAsync(hi.data(), mem.p[5], a->n_blocks * sizeof(HeadInfo), cudaMemcpyDeviceToHost, s));
    CKV_CUDA_TRY(cudaStreamSynchronize(s));
    for (uint32_t i = 0; i < a->n_blocks; i++) {
      const ckv_block_header &h = hi[i].h;
      if (h.magic != CKV_BLOCK_MAGIC) return CKV_ERR_CORRUPT;
      if (h.dtype != g->dtype || !hi[i].ok) return CKV_ERR_FORMAT;
      if (ckv_format_is_commit(h.format) && h.kept_channels == 0) return CKV_ERR_FORMAT; /* as ckv_block_check */
      bl[i] = BlockDev{(const uint8_t *)a->blocks[i], h.format, h.capacity, h.kept_channels, hi[i].sealed, total};
      total += h.capacity;
    }
  }
  uint32_t H = g->n_kv_heads, G = a->n_q_heads / H, RG = a->n_rows * G, D = g->head_dim;
  size_t qn = (size_t)a->n_rows * a->n_q_heads * D;
  if (total == 0) {
    CKV_CUDA_TRY(cudaMemsetAsync(a->out, 0, qn * sizeof(float), s));
    return CKV_OK;
  }
  /* Output splits: runs of whole blocks of about SPLIT_TOKENS slots. */
  std::vector<uint32_t> first_block{0};
  for (uint32_t i = 0, acc = 0; i < a->n_blocks; i++) {
    acc += bl[i].cap;
    if (acc >= SPLIT_TOKENS || i + 1 == a->n_blocks) {
      first_block.push_back(i + 1);
      acc = 0;
    }
  }
  uint32_t n_splits = (uint32_t)first_block.size() - 1;
  size_t first_bytes = (first_block.size() * sizeof(uint32_t) + 15u) / 16u * 16u;
  bool has_rot = false;
  for (const BlockDev &b : bl) has_rot |= ckv_format_is_rot(b.fmt) != 0;
  /* partials: plain then rotated; then, with rotated blocks, the rotated query */
  size_t part_floats = 2u * (size_t)n_splits * H * RG * D;
  CKV_CUDA_TRY(mem.alloc(3, first_bytes + (part_floats + (has_rot ? qn : 0)) * sizeof(float)));
  CKV_CUDA_TRY(cudaMemcpyAsync(mem.p[3], first_block.data(), first_block.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, s));
  const uint32_t *d_first = (const uint32_t *)mem.p[3];
  float *partial = (float *)((uint8_t *)mem.p[3] + first_bytes);
  float *q_rot = has_rot ? partial + part_floats : nullptr;
  CKV_CUDA_TRY(mem.alloc(0, bl.size() * sizeof(BlockDev)));
  CKV_CUDA_TRY(mem.alloc(1, (size_t)H * RG * total * sizeof(float)));
  CKV_CUDA_TRY(mem.alloc(2, (size_t)H * RG * 2 * sizeof(float)));
  /* On the caller's stream: a plain cudaMemcpy would run on the legacy
   * stream, which a non-blocking stream's kernels do not wait for. */
  CKV_CUDA_TRY(cudaMemcpyAsync(mem.p[0], bl.data(), bl.size() * sizeof(BlockDev), cudaMemcpyHostToDevice, s));
  const BlockDev *d_bl = (const BlockDev *)mem.p[0];
  float *S = (float *)mem.p[1], *m = (float *)mem.p[2], *l = m + (size_t)H * RG;
  float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
  uint32_t nq = a->n_rows * a->n_q_heads;
  if (has_rot) k_rotate_q<<<(nq + 127u) / 128u, 128, 0, s>>>(*g, a->layer, a->q, nq, G, q_rot);
  if ((size_t)RG * D <= WARP_SCORES_MAX_Q)
    k_scores_warp<<<dim3(a->n_blocks, H), 128, (size_t)RG * D * sizeof(float), s>>>(*g, a->layer, d_bl, a->q, q_rot, scale,
                                                                                  a->n_q_heads, G, RG, total, S);
  else
    k_scores<<<dim3(a->n_blocks, H), 64, 0, s>>>(*g, a->layer, d_bl, a->q, q_rot, scale, a->n_q_heads, G, RG, total, S);
  k_stats<<<H * RG, 256, 0, s>>>(S, total, m, l);
  k_out_split<<<dim3(H * RG, n_splits), ((D + 31u) / 32u) * 32u, 0, s>>>(*g, a->layer, d_bl, d_first, S, total, m, l, RG, partial);
  k_out_reduce<<<H * RG, ((D + 31u) / 32u) * 32u, 0, s>>>(*g, a->layer, partial, n_splits, l, a->n_q_heads, G, RG,
                                                          has_rot ? 1 : 0, a->out);
  if (a->mass) k_mass<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(S, total, H * RG, m, l, a->mass);
  CKV_CUDA_TRY(cudaGetLastError());
  CKV_CUDA_TRY(cudaStreamSynchronize(s)); /* the scratch is freed on return */
  return CKV_OK;
}
