/* patch.cu - the daemon's small writes into device blocks: header patches
 * (ckv_cuda_patch_apply) and same-format slot copies for compaction
 * (ckv_cuda_copy_slots).  See kernels/cuda/kernels_cuda.h.
 *
 * Patches: the host packs every patch's bytes into one staging buffer
 * (8-byte aligned pieces), uploads it with the descriptors in one copy, and
 * one kernel launch applies them all, a thread block per patch: copy the
 * bytes, then zero what follows.  Patches touch disjoint ranges (the caller
 * sends each block at most once per call), so their order does not matter. */
#include <map>
#include <vector>

#include "kernels/cuda/cuda_internal.h"

namespace {

struct Patch {
  uint8_t *dst;
  uint64_t src_off;   /* into the staged bytes */
  uint64_t bytes;
  uint64_t zero_bytes;
};

__global__ void k_patch(const Patch *p, const uint8_t *staged) {
  const Patch q = p[blockIdx.x];
  bool wide = ((uintptr_t)q.dst % 8u) == 0 && q.src_off % 8u == 0;
  uint64_t words = wide ? q.bytes / 8u : 0;
  for (uint64_t i = threadIdx.x; i < words; i += blockDim.x)
    ((uint64_t *)q.dst)[i] = ((const uint64_t *)(staged + q.src_off))[i];
  for (uint64_t i = words * 8u + threadIdx.x; i < q.bytes; i += blockDim.x) q.dst[i] = staged[q.src_off + i];
  uint8_t *z = q.dst + q.bytes;
  uint64_t zw = ((uintptr_t)z % 8u) == 0 ? q.zero_bytes / 8u : 0;
  for (uint64_t i = threadIdx.x; i < zw; i += blockDim.x) ((uint64_t *)z)[i] = 0;
  for (uint64_t i = zw * 8u + threadIdx.x; i < q.zero_bytes; i += blockDim.x) z[i] = 0;
}

/* One same-format copy, resolved on the host: byte ranges of one (layer, kv). */
struct Copy {
  const uint8_t *src;
  uint8_t *dst;
  uint32_t src_cap, dst_cap, src_slot, dst_slot, fmt, pad;
};

/* Grid: (moves, layers * 2); block: threads over the row's bytes. */
__global__ void k_copy_slots(ckv_geometry g, const Copy *c) {
  const Copy m = c[blockIdx.x];
  uint32_t l = blockIdx.y / 2u, kv = blockIdx.y % 2u;
  size_t elems = ckv_draft_token_elems(&g);
  if (m.fmt == CKV_FORMAT_DRAFT) {
    const uint16_t *s = (const uint16_t *)(m.src + ckv_draft_kv_offset(&g, m.src_cap, l, kv, m.src_slot));
    uint16_t *d = (uint16_t *)(m.dst + ckv_draft_kv_offset(&g, m.dst_cap, l, kv, m.dst_slot));
    for (size_t i = threadIdx.x; i < elems; i += blockDim.x) d[i] = s[i];
  } else {
    size_t groups = ckv_staged_groups(&g);
    const int8_t *s = (const int8_t *)(m.src + ckv_staged_codes_offset(&g, m.src_cap, l, kv)) + (size_t)m.src_slot * elems;
    int8_t *d = (int8_t *)(m.dst + ckv_staged_codes_offset(&g, m.dst_cap, l, kv)) + (size_t)m.dst_slot * elems;
    for (size_t i = threadIdx.x; i < elems; i += blockDim.x) d[i] = s[i];
    const uint16_t *ss = (const uint16_t *)(m.src + ckv_staged_scales_offset(&g, m.src_cap, l, kv)) + (size_t)m.src_slot * groups;
    uint16_t *ds = (uint16_t *)(m.dst + ckv_staged_scales_offset(&g, m.dst_cap, l, kv)) + (size_t)m.dst_slot * groups;
    for (size_t i = threadIdx.x; i < groups; i += blockDim.x) ds[i] = ss[i];
  }
  if (blockIdx.y == 0 && threadIdx.x == 0 && !m.pad) /* pad: trusted headers, the caller keeps positions */
    ((uint32_t *)(m.dst + ckv_block_positions_offset()))[m.dst_slot] =
        ((const uint32_t *)(m.src + ckv_block_positions_offset()))[m.src_slot];
}

/* Stream-ordered scratch (cudaMallocAsync): no device-wide synchronisation,
 * unlike cudaMalloc/cudaFree, so the daemon's header patches never wait for
 * the compressor's kernels on other streams. */
template <typename T> ckv_status upload(const std::vector<T> &v, T **ret, cudaStream_t s) {
  *ret = nullptr;
  if (v.empty()) return CKV_OK;
  CKV_CUDA_TRY(cudaMallocAsync((void **)ret, v.size() * sizeof(T), s));
  CKV_CUDA_TRY(cudaMemcpyAsync(*ret, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return CKV_OK;
}

ckv_status apply(const ckv_cuda_patch *p, size_t n, cudaStream_t s, Patch **d_p, uint8_t **d_staged) {
  std::vector<Patch> ps(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (!p[i].dst || (p[i].bytes && !p[i].src)) return CKV_ERR_INVALID;
    ps[i] = Patch{(uint8_t *)p[i].dst, total, p[i].bytes, p[i].zero_bytes};
    total += (p[i].bytes + 7u) / 8u * 8u;
  }
  std::vector<uint8_t> staged(total ? total : 1);
  for (size_t i = 0; i < n; i++)
    if (p[i].bytes) memcpy(staged.data() + ps[i].src_off, p[i].src, p[i].bytes);
  ckv_status st;
  if ((st = upload(ps, d_p, s)) != CKV_OK) return st;
  CKV_CUDA_TRY(cudaMallocAsync((void **)d_staged, staged.size(), s));
  CKV_CUDA_TRY(cudaMemcpyAsync(*d_staged, staged.data(), staged.size(), cudaMemcpyHostToDevice, s));
  for (size_t first = 0; first < n; first += 65535u) { /* grid x limit of older devices: keep it simple */
    unsigned count = (unsigned)(n - first < 65535u ? n - first : 65535u);
    k_patch<<<count, 256, 0, s>>>(*d_p + first, *d_staged);
  }
  CKV_CUDA_TRY(cudaGetLastError());
  CKV_CUDA_TRY(cudaStreamSynchronize(s));
  return CKV_OK;
}

} // namespace

extern "C" ckv_status ckv_cuda_patch_apply(const ckv_cuda_patch *patches, size_t n, void *stream) {
  if (!patches && n) return CKV_ERR_INVALID;
  if (n == 0) return CKV_OK;
  if (ckv_cuda_available() != CKV_OK) return CKV_ERR_DEVICE;
  cudaStream_t s = (cudaStream_t)stream;
  Patch *d_p = nullptr;
  uint8_t *d_staged = nullptr;
  ckv_status st = apply(patches, n, s, &d_p, &d_staged);
  if (d_p) cudaFreeAsync(d_p, s);
  if (d_staged) cudaFreeAsync(d_staged, s);
  return st;
}

extern "C" ckv_status ckv_cuda_copy_slots(const ckv_geometry *g, const ckv_move *moves, size_t n_moves, void *stream) {
  if (!g || (!moves && n_moves) || !ckv_format_valid(CKV_FORMAT_DRAFT, g, 1, 0)) return CKV_ERR_INVALID;
  if (n_moves == 0) return CKV_OK;
  if (ckv_cuda_available() != CKV_OK) return CKV_ERR_DEVICE;
  std::map<const void *, ckv_block_header> cache;
  auto header = [&](const void *blk, const ckv_block_header *trusted, ckv_block_header *ret) -> ckv_status {
    if (trusted) { /* the caller's record: the block's own header is worker-writable */
      *ret = *trusted;
      return trusted->magic == CKV_BLOCK_MAGIC ? CKV_OK : CKV_ERR_CORRUPT;
    }
    auto it = cache.find(blk);
    if (it == cache.end()) {
      ckv_block_header h;
      ckv_status st = ckv_cuda_fetch_header(blk, &h);
      if (st != CKV_OK) return st;
      if (h.magic != CKV_BLOCK_MAGIC) return CKV_ERR_CORRUPT;
      it = cache.emplace(blk, h).first;
    }
    *ret = it->second;
    return CKV_OK;
  };
  std::vector<Copy> cs(n_moves);
  for (size_t i = 0; i < n_moves; i++) {
    const ckv_move &m = moves[i];
    ckv_block_header sh, dh;
    ckv_status st;
    if (!m.src || !m.dst) return CKV_ERR_INVALID;
    if ((st = header(m.src, m.src_hdr, &sh)) != CKV_OK || (st = header(m.dst, m.dst_hdr, &dh)) != CKV_OK) return st;
    if (sh.format != dh.format || sh.dtype != dh.dtype) return CKV_ERR_FORMAT;
    if (sh.format != CKV_FORMAT_DRAFT && sh.format != CKV_FORMAT_STAGED) return CKV_ERR_UNSUPPORTED;
    if (m.src_slot >= sh.capacity || m.dst_slot >= dh.capacity) return CKV_ERR_INVALID;
    cs[i] = Copy{(const uint8_t *)m.src, (uint8_t *)m.dst, sh.capacity, dh.capacity, m.src_slot, m.dst_slot, sh.format,
                 m.dst_hdr ? 1u : 0u};
  }
  Copy *d_c = nullptr;
  cudaStream_t s = (cudaStream_t)stream;
  ckv_status st = upload(cs, &d_c, s);
  if (st == CKV_OK) {
    for (size_t first = 0; first < n_moves && st == CKV_OK; first += 65535u) {
      unsigned count = (unsigned)(n_moves - first < 65535u ? n_moves - first : 65535u);
      k_copy_slots<<<dim3(count, g->n_layers * 2u), 128, 0, s>>>(*g, d_c + first);
    }
    if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) st = CKV_ERR_DEVICE;
  }
  if (d_c) cudaFreeAsync(d_c, s);
  return st;
}
