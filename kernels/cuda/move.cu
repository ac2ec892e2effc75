/* move.cu - transitions on the GPU: the same conversions as kernels/move.c
 * (draft -> staged, draft/staged -> committed, key-channel pruning), built
 * from the shared rules in kernels/quant.h so the bytes match the CPU.
 *
 * The host reads the headers of the blocks involved, validates the moves
 * with the CPU rules, sorts them by (destination, slot) and launches:
 * staged rows (a warp per scale group), pruning (a thread per channel, sums
 * in destination-slot order like the CPU), committed keys (a thread per code
 * byte: its 2 or 4 channels' min/max over the chunk, then one byte per slot),
 * committed values (a warp per 32-element group, codes packed with shuffles),
 * then positions, chunk seals and valid bits.  Rotated destinations (formats
 * v2): a thread per (token, layer, K|V, head), k_to_rot. */
#include <algorithm>
#include <map>
#include <vector>

#include "kernels/cuda/cuda_internal.h"

namespace {

struct Entry {
  const uint8_t *src;
  uint8_t *dst;
  uint32_t src_slot, dst_slot, src_fmt, src_cap, dst_fmt, dst_cap, kept, pad;
};
struct Job { /* a committed chunk, or (chunk = ~0) a block to prune */
  uint8_t *dst;
  uint32_t first, count, chunk, fmt, cap, kept;
};

__device__ float warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_min(float v) {
  for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void k_to_staged(ckv_geometry g, const Entry *en) {
  const Entry e = en[blockIdx.x / (g.n_layers * 2u)];
  uint32_t l = (blockIdx.x / 2u) % g.n_layers, kv = blockIdx.x % 2u;
  uint32_t lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, nw = blockDim.x / 32u;
  size_t te = ckv_draft_token_elems(&g), gl = (size_t)ckv_staged_group_heads(&g) * g.head_dim;
  int8_t *codes = (int8_t *)(e.dst + ckv_staged_codes_offset(&g, e.dst_cap, l, kv)) + e.dst_slot * te;
  uint16_t *sc = (uint16_t *)(e.dst + ckv_staged_scales_offset(&g, e.dst_cap, l, kv)) + (size_t)e.dst_slot * ckv_staged_groups(&g);
  for (uint32_t q = warp; q < ckv_staged_groups(&g); q += nw) {
    size_t lo = q * gl, hi = lo + gl < te ? lo + gl : te;
    float am = 0.0f;
    for (size_t i = lo + lane; i < hi; i += 32)
      am = fmaxf(am, fabsf(ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, kv, e.src_slot, i)));
    am = warp_max(am);
    uint16_t s16 = ckv_q8_scale(am);
    if (lane == 0) sc[q] = s16;
    float inv = ckv_inv_scale(s16);
    for (size_t i = lo + lane; i < hi; i += 32)
      codes[i] = ckv_q8_code(ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, kv, e.src_slot, i), inv);
  }
}

/* Rotated destinations: a CUDA block per (entry, layer, K|V), a thread per
 * head doing what kernels/rot.c does on the CPU, with quant.h's rules as
 * they are (the rotation, then ckv_rot_quant_head), so the bytes match. */
/* One head of a move's source in the rotated basis (keys with their block's mean), into x. */
__device__ void rot_source(const ckv_geometry &g, const Entry &e, uint32_t l, uint32_t kv, uint32_t hd, float *x) {
  uint32_t D = g.head_dim;
  if (ckv_format_is_rot(e.src_fmt)) { /* already rotated */
    uint32_t sb = ckv_format_code_bits(e.src_fmt);
    size_t k = (size_t)e.src_slot * g.n_kv_heads + hd;
    const uint8_t *row = e.src + ckv_rot_codes_offset(e.src_fmt, &g, e.src_cap, l, kv) + k * ckv_rot_row_bytes(e.src_fmt, &g);
    float sc = ckv_rot_scale_value((e.src + ckv_rot_scales_offset(e.src_fmt, &g, e.src_cap, l, kv))[k]);
    const uint16_t *mean = (const uint16_t *)(e.src + ckv_rot_mean_offset(&g, e.src_cap, l, hd));
    for (uint32_t i = 0; i < D; i++) {
      x[i] = ckv_rot_value(ckv_unpack_code(row, i, sb), sc, sb);
      if (kv == 0) x[i] = x[i] + ckv_rot_finite(ckv_f16_to_f32(mean[i]));
    }
    return;
  }
  for (uint32_t i = 0; i < D; i++) x[i] = ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, kv, e.src_slot, (size_t)hd * D + i);
  ckv_rot_forward(x, D, l, kv, hd);
}

/* Key means of rotated blocks that have none yet: a CUDA block per (job,
 * layer), a thread per head summing its job's tokens in destination-slot
 * order, as rot.c does. */
__global__ void k_rot_means(ckv_geometry g, const Job *jobs, const Entry *en) {
  const Job j = jobs[blockIdx.x / g.n_layers];
  uint32_t l = blockIdx.x % g.n_layers, hd = threadIdx.x, D = g.head_dim;
  if (hd >= g.n_kv_heads) return;
  float x[CKV_MAX_HEAD_DIM], sum[CKV_MAX_HEAD_DIM];
  for (uint32_t i = 0; i < D; i++) sum[i] = 0.0f;
  for (uint32_t t = 0; t < j.count; t++) {
    rot_source(g, en[j.first + t], l, 0, hd, x);
    for (uint32_t i = 0; i < D; i++) sum[i] = sum[i] + x[i];
  }
  uint16_t *mean = (uint16_t *)(j.dst + ckv_rot_mean_offset(&g, j.cap, l, hd));
  for (uint32_t i = 0; i < D; i++) mean[i] = ckv_rot_mean_f16(sum[i], j.count);
}
__global__ void k_rot_means_set(const Job *jobs, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicOr((unsigned *)(jobs[i].dst + ckv_rot_meta_offset(jobs[i].cap)), CKV_ROT_MEANS_SET);
}

__global__ void k_to_rot(ckv_geometry g, const Entry *en) {
  const Entry e = en[blockIdx.x / (g.n_layers * 2u)];
  uint32_t l = (blockIdx.x / 2u) % g.n_layers, kv = blockIdx.x % 2u, hd = threadIdx.x, D = g.head_dim;
  if (hd >= g.n_kv_heads) return;
  float x[CKV_MAX_HEAD_DIM];
  rot_source(g, e, l, kv, hd, x);
  if (kv == 0) { /* keys less the block's mean */
    const uint16_t *mean = (const uint16_t *)(e.dst + ckv_rot_mean_offset(&g, e.dst_cap, l, hd));
    for (uint32_t i = 0; i < D; i++) x[i] = x[i] - ckv_rot_finite(ckv_f16_to_f32(mean[i]));
  }
  size_t k = (size_t)e.dst_slot * g.n_kv_heads + hd;
  uint8_t *sc = e.dst + ckv_rot_scales_offset(e.dst_fmt, &g, e.dst_cap, l, kv);
  uint8_t *row = e.dst + ckv_rot_codes_offset(e.dst_fmt, &g, e.dst_cap, l, kv) + k * ckv_rot_row_bytes(e.dst_fmt, &g);
  ckv_rot_quant_head(x, D, ckv_format_code_bits(e.dst_fmt), &sc[k], row);
}

__global__ void k_prune(ckv_geometry g, const Job *jobs, const Entry *en) {
  const Job j = jobs[blockIdx.x / (g.n_layers * g.n_kv_heads)];
  uint32_t l = (blockIdx.x / g.n_kv_heads) % g.n_layers, h = blockIdx.x % g.n_kv_heads, c = threadIdx.x, D = g.head_dim;
  __shared__ float mag[CKV_MAX_HEAD_DIM];
  __shared__ unsigned long long words[CKV_MAX_HEAD_DIM / 64];
  if (c < CKV_MAX_HEAD_DIM / 64) words[c] = 0;
  float m = 0.0f;
  if (c < D)
    for (uint32_t i = 0; i < j.count; i++) {
      const Entry e = en[j.first + i];
      m += fabsf(ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, 0, e.src_slot, (size_t)h * D + c));
    }
  if (c < D) mag[c] = isnan(m) ? -1.0f : m;
  __syncthreads();
  if (c < D) {
    uint32_t rank = 0;
    for (uint32_t o = 0; o < D; o++) rank += mag[o] > mag[c] || (mag[o] == mag[c] && o < c);
    if (j.kept == D || rank < j.kept) atomicOr(&words[c / 64], 1ull << (c % 64));
  }
  __syncthreads();
  uint64_t *mask = (uint64_t *)(j.dst + ckv_commit_mask_offset(j.fmt, &g, j.cap, j.kept, l, h));
  if (c < ckv_commit_mask_words(&g)) mask[c] = words[c];
}

__global__ void k_commit_keys(ckv_geometry g, const Job *jobs, const Entry *en) {
  const Job j = jobs[blockIdx.x / (g.n_layers * g.n_kv_heads)];
  uint32_t l = (blockIdx.x / g.n_kv_heads) % g.n_layers, h = blockIdx.x % g.n_kv_heads, D = g.head_dim;
  uint32_t bits = ckv_format_code_bits(j.fmt), per = 8u / bits, T = CKV_COMMIT_CHUNK_TOKENS;
  __shared__ uint32_t idx[CKV_MAX_HEAD_DIM];
  const uint64_t *mask = (const uint64_t *)(j.dst + ckv_commit_mask_offset(j.fmt, &g, j.cap, j.kept, l, h));
  if (threadIdx.x == 0) {
    uint32_t n = 0;
    for (uint32_t c = 0; c < D; c++)
      if ((mask[c / 64] >> (c % 64)) & 1u) idx[n++] = c;
    /* The mask is in worker-writable memory: one that does not hold `kept`
     * channels must not leave indices unset (garbage codes for that session,
     * never an access outside the block; the CPU path refuses the move). */
    if (n != j.kept)
      for (uint32_t c = 0; c < j.kept; c++) idx[c] = c;
  }
  __syncthreads();
  uint8_t *ch = j.dst + ckv_commit_key_chunk_offset(j.fmt, &g, j.cap, j.kept, l, h, j.chunk);
  uint16_t *sc = (uint16_t *)ch, *zp = sc + j.kept;
  size_t krow = ckv_commit_key_row_bytes(j.fmt, j.kept), used = (size_t)j.kept * 4u + T * krow;
  if (threadIdx.x == 0)
    for (size_t p = used; p < ckv_commit_key_chunk_bytes(j.fmt, j.kept); p++) ch[p] = 0;
  for (uint32_t b = threadIdx.x; b < krow; b += blockDim.x) {
    float zf[4], inv[4];
    uint32_t nch = 0;
    for (uint32_t k = 0; k < per && b * per + k < j.kept; k++, nch++) {
      uint32_t jj = b * per + k;
      float mn = INFINITY, mx = -INFINITY;
      for (uint32_t i = 0; i < j.count; i++) {
        const Entry e = en[j.first + i];
        float x = ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, 0, e.src_slot, (size_t)h * D + idx[jj]);
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
      }
      uint16_t s16, z16;
      ckv_qa_params(mn, mx, bits, &s16, &z16);
      sc[jj] = s16;
      zp[jj] = z16;
      zf[k] = ckv_f16_to_f32(z16);
      inv[k] = ckv_inv_scale(s16);
    }
    uint8_t *rows = ch + (size_t)j.kept * 4u;
    for (uint32_t t = 0; t < T; t++) rows[t * krow + b] = 0;
    for (uint32_t i = 0; i < j.count; i++) {
      const Entry e = en[j.first + i];
      uint32_t byte = 0;
      for (uint32_t k = 0; k < nch; k++) {
        float x = ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, 0, e.src_slot, (size_t)h * D + idx[b * per + k]);
        byte |= (uint32_t)ckv_qa_code(x, zf[k], inv[k], bits) << (k * bits);
      }
      rows[(e.dst_slot % T) * krow + b] = (uint8_t)byte;
    }
  }
}

__global__ void k_zero_values(ckv_geometry g, const Job *jobs) {
  const Job j = jobs[blockIdx.x / g.n_layers];
  uint32_t l = blockIdx.x % g.n_layers, T = CKV_COMMIT_CHUNK_TOKENS, ng = ckv_commit_value_groups(&g);
  uint8_t *par = j.dst + ckv_commit_value_params_offset(j.fmt, &g, j.cap, j.kept, l) + (size_t)j.chunk * T * ng * 4u;
  size_t vrow = ckv_commit_value_row_bytes(j.fmt, &g);
  uint8_t *codes = j.dst + ckv_commit_value_codes_offset(j.fmt, &g, j.cap, j.kept, l) + (size_t)j.chunk * T * vrow;
  for (size_t i = threadIdx.x; i < (size_t)T * ng * 4u; i += blockDim.x) par[i] = 0;
  for (size_t i = threadIdx.x; i < T * vrow; i += blockDim.x) codes[i] = 0;
}

__global__ void k_commit_values(ckv_geometry g, const Entry *en) {
  const Entry e = en[blockIdx.x / g.n_layers];
  uint32_t l = blockIdx.x % g.n_layers, lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, nw = blockDim.x / 32u;
  uint32_t bits = ckv_format_code_bits(e.dst_fmt), ng = ckv_commit_value_groups(&g);
  size_t te = ckv_draft_token_elems(&g);
  uint16_t *par = (uint16_t *)(e.dst + ckv_commit_value_params_offset(e.dst_fmt, &g, e.dst_cap, e.kept, l)) + (size_t)e.dst_slot * ng * 2u;
  uint8_t *row = e.dst + ckv_commit_value_codes_offset(e.dst_fmt, &g, e.dst_cap, e.kept, l) +
                 (size_t)e.dst_slot * ckv_commit_value_row_bytes(e.dst_fmt, &g);
  for (uint32_t q = warp; q < ng; q += nw) {
    size_t el = (size_t)q * CKV_COMMIT_VALUE_GROUP + lane;
    bool in = el < te;
    float x = in ? ckv_dev_read(g, e.src, e.src_fmt, e.src_cap, l, 1, e.src_slot, el) : 0.0f;
    float mn = warp_min(in ? x : INFINITY), mx = warp_max(in ? x : -INFINITY);
    uint16_t s16, z16;
    ckv_qa_params(mn, mx, bits, &s16, &z16);
    if (lane == 0) {
      par[2u * q] = s16;
      par[2u * q + 1u] = z16;
    }
    uint32_t code = in ? ckv_qa_code(x, ckv_f16_to_f32(z16), ckv_inv_scale(s16), bits) : 0u, byte = code;
    for (uint32_t k = 1; k < 8u / bits; k++) byte |= __shfl_down_sync(0xffffffffu, code, k) << (k * bits);
    if (in && lane % (8u / bits) == 0) row[el * bits / 8u] = (uint8_t)byte;
  }
}

__global__ void k_finish(const Entry *en, uint32_t n, unsigned set_valid) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Entry e = en[i];
  if (!e.pad) /* pad: trusted headers, the caller keeps positions (kernels/move.c copy_position) */
    ((uint32_t *)(e.dst + ckv_block_positions_offset()))[e.dst_slot] =
        ((const uint32_t *)(e.src + ckv_block_positions_offset()))[e.src_slot];
  if (!set_valid) return;
  unsigned long long *w = (unsigned long long *)(e.dst + ckv_block_bitmap_offset(e.dst_cap)) + e.dst_slot / 64u;
  unsigned long long bit = 1ull << (e.dst_slot % 64u);
  if (!(atomicOr(w, bit) & bit)) atomicAdd((unsigned *)(e.dst + offsetof(ckv_block_header, n_valid)), 1u);
}

__global__ void k_seal(const Job *jobs, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicOr((unsigned *)(jobs[i].dst + ckv_commit_meta_offset(jobs[i].cap)), 1u << jobs[i].chunk);
}

struct BlockInfo {
  ckv_block_header h;
  uint32_t sealed;
  bool mask_empty;
};

ckv_status check_header(const ckv_block_header &h, const ckv_geometry *g) {
  if (h.magic != CKV_BLOCK_MAGIC) return CKV_ERR_CORRUPT;
  if (h.dtype != g->dtype || !ckv_format_valid(h.format, g, h.capacity, h.kept_channels)) return CKV_ERR_FORMAT;
  if (ckv_format_is_commit(h.format) && h.kept_channels == 0) return CKV_ERR_FORMAT;
  return CKV_OK;
}

template <typename T> ckv_status upload(const std::vector<T> &v, T **ret, cudaStream_t s) {
  *ret = nullptr;
  if (v.empty()) return CKV_OK;
  /* Stream-ordered: the kernels on `s` see the copy complete (a plain
   * cudaMemcpy runs on the legacy stream, which a non-blocking stream does not
   * wait for), and no allocation synchronises the whole device. */
  CKV_CUDA_TRY(cudaMallocAsync((void **)ret, v.size() * sizeof(T), s));
  CKV_CUDA_TRY(cudaMemcpyAsync(*ret, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return CKV_OK;
}

ckv_status info_of(std::map<const void *, BlockInfo> &cache, const void *blk, const ckv_block_header *trusted,
                   const ckv_geometry *g, BlockInfo **ret) {
  auto it = cache.find(blk);
  if (it == cache.end()) {
    BlockInfo bi{};
    ckv_status st = trusted ? CKV_OK : ckv_cuda_fetch_header(blk, &bi.h);
    if (trusted) bi.h = *trusted;
    if (st != CKV_OK) return st;
    if ((st = check_header(bi.h, g)) != CKV_OK) return st;
    if (ckv_format_is_rot(bi.h.format))
      CKV_CUDA_TRY(cudaMemcpy(&bi.sealed, (const uint8_t *)blk + ckv_rot_meta_offset(bi.h.capacity), 4, cudaMemcpyDeviceToHost));
    if (ckv_format_is_commit(bi.h.format)) {
      CKV_CUDA_TRY(cudaMemcpy(&bi.sealed, (const uint8_t *)blk + ckv_commit_meta_offset(bi.h.capacity), 4, cudaMemcpyDeviceToHost));
      uint64_t w[CKV_MAX_HEAD_DIM / 64] = {0};
      CKV_CUDA_TRY(cudaMemcpy(w, (const uint8_t *)blk + ckv_commit_mask_offset(bi.h.format, g, bi.h.capacity, bi.h.kept_channels, 0, 0),
                              ckv_commit_mask_words(g) * 8u, cudaMemcpyDeviceToHost));
      bi.mask_empty = true;
      for (uint32_t i = 0; i < ckv_commit_mask_words(g); i++) bi.mask_empty &= w[i] == 0;
    }
    it = cache.emplace(blk, bi).first;
  }
  *ret = &it->second;
  return CKV_OK;
}

/* What info_of needs of one block, read on the device. */
struct InfoDev {
  ckv_block_header h;
  uint32_t sealed, ok, mask_empty, pad;
};

/* given[i]: the caller's trusted header of block i, or all zero (magic 0):
 * read the block's own. */
__global__ void k_block_info(ckv_geometry g, const uint8_t *const *ptrs, const ckv_block_header *given, uint32_t n,
                             InfoDev *out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  InfoDev r;
  r.h = given[i].magic ? given[i] : *(const ckv_block_header *)ptrs[i];
  r.sealed = 0;
  r.mask_empty = 1;
  r.pad = 0;
  r.ok = r.h.magic == CKV_BLOCK_MAGIC && r.h.dtype == g.dtype &&
         ckv_format_valid(r.h.format, &g, r.h.capacity, r.h.kept_channels) &&
         !(ckv_format_is_commit(r.h.format) && r.h.kept_channels == 0);
  if (r.ok && ckv_format_is_rot(r.h.format)) r.sealed = *(const uint32_t *)(ptrs[i] + ckv_rot_meta_offset(r.h.capacity));
  if (r.ok && ckv_format_is_commit(r.h.format)) {
    r.sealed = *(const uint32_t *)(ptrs[i] + ckv_commit_meta_offset(r.h.capacity));
    const uint64_t *w = (const uint64_t *)(ptrs[i] + ckv_commit_mask_offset(r.h.format, &g, r.h.capacity, r.h.kept_channels, 0, 0));
    for (uint32_t k = 0; k < ckv_commit_mask_words(&g); k++)
      if (w[k]) r.mask_empty = 0;
  }
  out[i] = r;
}

/* Fills the cache for every block the moves name with one launch and one
 * copy back (instead of up to three synchronous copies per block).  Blocks
 * whose header is bad are left out: info_of then reports them exactly. */
ckv_status prefetch_info(std::map<const void *, BlockInfo> &cache, const ckv_move *moves, size_t n,
                         const ckv_geometry *g, cudaStream_t s) {
  std::map<const void *, uint32_t> index;
  std::vector<const void *> ptrs;
  std::vector<ckv_block_header> given;
  for (size_t i = 0; i < n; i++) {
    const void *p2[2] = {moves[i].src, (const void *)moves[i].dst};
    const ckv_block_header *h2[2] = {moves[i].src_hdr, moves[i].dst_hdr};
    for (int k = 0; k < 2; k++)
      if (p2[k] && index.emplace(p2[k], (uint32_t)ptrs.size()).second) {
        ptrs.push_back(p2[k]);
        ckv_block_header none{};
        given.push_back(h2[k] ? *h2[k] : none);
      }
  }
  if (ptrs.empty()) return CKV_OK;
  std::vector<InfoDev> info(ptrs.size());
  const void **d_ptrs = nullptr;
  ckv_block_header *d_given = nullptr;
  InfoDev *d_info = nullptr;
  ckv_status st = CKV_OK;
  if (cudaMallocAsync((void **)&d_ptrs, ptrs.size() * sizeof(void *), s) != cudaSuccess ||
      cudaMallocAsync((void **)&d_given, given.size() * sizeof(ckv_block_header), s) != cudaSuccess ||
      cudaMallocAsync((void **)&d_info, info.size() * sizeof(InfoDev), s) != cudaSuccess ||
      cudaMemcpyAsync(d_ptrs, ptrs.data(), ptrs.size() * sizeof(void *), cudaMemcpyHostToDevice, s) != cudaSuccess ||
      cudaMemcpyAsync(d_given, given.data(), given.size() * sizeof(ckv_block_header), cudaMemcpyHostToDevice, s) !=
          cudaSuccess) {
    st = CKV_ERR_DEVICE;
  } else {
    k_block_info<<<((unsigned)ptrs.size() + 127u) / 128u, 128, 0, s>>>(*g, (const uint8_t *const *)d_ptrs, d_given,
                                                                       (uint32_t)ptrs.size(), d_info);
    if (cudaGetLastError() != cudaSuccess ||
        cudaMemcpyAsync(info.data(), d_info, info.size() * sizeof(InfoDev), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
      st = CKV_ERR_DEVICE;
  }
  if (d_ptrs) cudaFreeAsync(d_ptrs, s);
  if (d_given) cudaFreeAsync(d_given, s);
  if (d_info) cudaFreeAsync(d_info, s);
  if (st != CKV_OK) {
    (void)cudaGetLastError();
    return st;
  }
  for (size_t i = 0; i < ptrs.size(); i++)
    if (info[i].ok) cache.emplace(ptrs[i], BlockInfo{info[i].h, info[i].sealed, info[i].mask_empty != 0});
  return CKV_OK;
}

ckv_status run_moves(const ckv_geometry *g, const ckv_move *moves, size_t n, unsigned flags, cudaStream_t s,
                     Entry **d_en, Job **d_jobs, Job **d_prune, Job **d_means) {
  std::map<const void *, BlockInfo> cache;
  ckv_status pst = prefetch_info(cache, moves, n, g, s);
  if (pst != CKV_OK) return pst;
  std::vector<Entry> en(n);
  for (size_t i = 0; i < n; i++) {
    const ckv_move &m = moves[i];
    BlockInfo *si, *di;
    ckv_status st;
    if (!m.src || !m.dst) return CKV_ERR_INVALID;
    if ((st = info_of(cache, m.src, m.src_hdr, g, &si)) != CKV_OK || (st = info_of(cache, m.dst, m.dst_hdr, g, &di)) != CKV_OK)
      return st;
    if (m.src_slot >= si->h.capacity || m.dst_slot >= di->h.capacity) return CKV_ERR_RANGE;
    bool ok = (si->h.format == CKV_FORMAT_DRAFT && di->h.format != CKV_FORMAT_DRAFT) ||
              (si->h.format == CKV_FORMAT_STAGED && ckv_format_is_committed_state(di->h.format)) ||
              (ckv_format_is_rot(si->h.format) && ckv_format_is_rot(di->h.format));
    if (!ok) return CKV_ERR_UNSUPPORTED;
    if (ckv_format_is_commit(di->h.format) && ((di->sealed >> (m.dst_slot / CKV_COMMIT_CHUNK_TOKENS)) & 1u)) return CKV_ERR_STATE;
    en[i] = Entry{(const uint8_t *)m.src, (uint8_t *)m.dst, m.src_slot, m.dst_slot, si->h.format, si->h.capacity,
                  di->h.format, di->h.capacity, di->h.kept_channels, m.dst_hdr ? 1u : 0u};
  }
  std::sort(en.begin(), en.end(), [](const Entry &a, const Entry &b) {
    return a.dst != b.dst ? (uintptr_t)a.dst < (uintptr_t)b.dst : a.dst_slot < b.dst_slot;
  });
  for (size_t i = 1; i < n; i++)
    if (en[i].dst == en[i - 1].dst && en[i].dst_slot == en[i - 1].dst_slot) return CKV_ERR_INVALID;
  std::vector<Entry> staged, commit, rot;
  for (const Entry &e : en) (ckv_format_is_commit(e.dst_fmt) ? commit : ckv_format_is_rot(e.dst_fmt) ? rot : staged).push_back(e);
  std::vector<Job> jobs, prune, means; /* means: rotated blocks whose key means are not set (sealed: the meta word) */
  for (size_t i = 0; i < rot.size();) {
    size_t b = i;
    while (b < rot.size() && rot[b].dst == rot[i].dst) b++;
    if (!(cache[rot[i].dst].sealed & CKV_ROT_MEANS_SET))
      means.push_back(Job{rot[i].dst, (uint32_t)i, (uint32_t)(b - i), 0, rot[i].dst_fmt, rot[i].dst_cap, 0});
    i = b;
  }
  for (size_t i = 0; i < commit.size();) {
    size_t b = i;
    while (b < commit.size() && commit[b].dst == commit[i].dst) b++;
    const Entry &e = commit[i];
    if (cache[e.dst].mask_empty) {
      if (cache[e.dst].sealed) return CKV_ERR_STATE;
      prune.push_back(Job{e.dst, (uint32_t)i, (uint32_t)(b - i), ~0u, e.dst_fmt, e.dst_cap, e.kept});
    }
    for (size_t k = i; k < b;) {
      uint32_t chunk = commit[k].dst_slot / CKV_COMMIT_CHUNK_TOKENS;
      size_t q = k;
      while (q < b && commit[q].dst_slot / CKV_COMMIT_CHUNK_TOKENS == chunk) q++;
      jobs.push_back(Job{e.dst, (uint32_t)k, (uint32_t)(q - k), chunk, e.dst_fmt, e.dst_cap, e.kept});
      k = q;
    }
    i = b;
  }
  ckv_status st;
  if ((st = upload(staged, &d_en[0], s)) != CKV_OK || (st = upload(commit, &d_en[1], s)) != CKV_OK ||
      (st = upload(rot, &d_en[2], s)) != CKV_OK)
    return st;
  Entry *d_staged = d_en[0], *d_commit = d_en[1], *d_rot = d_en[2];
  if ((st = upload(jobs, d_jobs, s)) != CKV_OK || (st = upload(prune, d_prune, s)) != CKV_OK ||
      (st = upload(means, d_means, s)) != CKV_OK)
    return st;
  unsigned L = g->n_layers, H = g->n_kv_heads;
  if (!staged.empty()) k_to_staged<<<(unsigned)staged.size() * L * 2u, 128, 0, s>>>(*g, d_staged);
  if (!rot.empty()) {
    if (!means.empty()) {
      k_rot_means<<<(unsigned)means.size() * L, ((H + 31u) / 32u) * 32u, 0, s>>>(*g, *d_means, d_rot);
      k_rot_means_set<<<((unsigned)means.size() + 255u) / 256u, 256, 0, s>>>(*d_means, (uint32_t)means.size());
    }
    k_to_rot<<<(unsigned)rot.size() * L * 2u, ((H + 31u) / 32u) * 32u, 0, s>>>(*g, d_rot);
    k_finish<<<((unsigned)rot.size() + 255u) / 256u, 256, 0, s>>>(d_rot, (uint32_t)rot.size(), flags & CKV_MOVE_SET_VALID);
  }
  if (!prune.empty()) k_prune<<<(unsigned)prune.size() * L * H, ((g->head_dim + 31u) / 32u) * 32u, 0, s>>>(*g, *d_prune, d_commit);
  if (!jobs.empty()) {
    k_commit_keys<<<(unsigned)jobs.size() * L * H, 128, 0, s>>>(*g, *d_jobs, d_commit);
    k_zero_values<<<(unsigned)jobs.size() * L, 256, 0, s>>>(*g, *d_jobs);
    k_commit_values<<<(unsigned)commit.size() * L, 128, 0, s>>>(*g, d_commit);
  }
  if (!staged.empty()) k_finish<<<((unsigned)staged.size() + 255u) / 256u, 256, 0, s>>>(d_staged, (uint32_t)staged.size(), flags & CKV_MOVE_SET_VALID);
  if (!commit.empty()) {
    k_seal<<<((unsigned)jobs.size() + 255u) / 256u, 256, 0, s>>>(*d_jobs, (uint32_t)jobs.size());
    k_finish<<<((unsigned)commit.size() + 255u) / 256u, 256, 0, s>>>(d_commit, (uint32_t)commit.size(), flags & CKV_MOVE_SET_VALID);
  }
  CKV_CUDA_TRY(cudaGetLastError());
  CKV_CUDA_TRY(cudaStreamSynchronize(s));
  return CKV_OK;
}

} // namespace

extern "C" ckv_status ckv_cuda_move(const ckv_geometry *g, const ckv_move *moves, size_t n_moves, unsigned flags, void *stream) {
  if (ckv_cuda_available() != CKV_OK) return CKV_ERR_DEVICE;
  if (!g || (!moves && n_moves) || !ckv_format_valid(CKV_FORMAT_DRAFT, g, 1, 0)) return CKV_ERR_INVALID;
  if (n_moves == 0) return CKV_OK;
  Entry *d_en[3] = {nullptr, nullptr, nullptr};
  Job *d_jobs = nullptr, *d_prune = nullptr, *d_means = nullptr;
  ckv_status st = run_moves(g, moves, n_moves, flags, (cudaStream_t)stream, d_en, &d_jobs, &d_prune, &d_means);
  cudaStream_t s = (cudaStream_t)stream;
  for (void *p : {(void *)d_en[0], (void *)d_en[1], (void *)d_en[2], (void *)d_jobs, (void *)d_prune, (void *)d_means})
    if (p) cudaFreeAsync(p, s);
  if (st != CKV_OK) (void)cudaStreamSynchronize(s); /* the host vectors the copies read die with run_moves */
  return st;
}
