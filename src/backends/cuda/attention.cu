// Flash attention kernels (attention.h).
//
// Lane l of a warp owns elements l, l + 32, ... (at most kPerLane = 8 of them, so D, Dv <= 256) of the
// row vectors it accumulates; a dot product is the lanes' partial sums added by warp_sum. A block is
// kWarps warps (kWarps rows); the tiles of the other operand (kTile rows) go through shared memory.
#include <cmath>

#include "backends/cuda/attention.h"
#include "backends/cuda/attention_chunked.h"
#include "backends/cuda/attention_mask.cuh"
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"

namespace loom::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPerLane = 8;
constexpr int kMaxDim = 32 * kPerLane;
constexpr float kLog2e = 1.4426950408889634f;

// Everything the kernels need from the AttentionProblem, by value (kernel arguments).
struct Geometry {
  int64_t heads_per_batch, tq, tk, d, dv, kv_group;
  float scale_log2;  // scale * log2(e)
  float scale;
  bool causal;
  HeadLayout q, k, v, out;
  AttentionDropout dropout;
};

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ int64_t row_offset(const HeadLayout& l, int64_t b, int64_t h, int64_t t) {
  return b * l.batch_stride + h * l.head_stride + t * l.row_stride;
}

// Keys [0, limit) are visible to query row i.
__device__ __forceinline__ int64_t key_limit(const Geometry& g, int64_t i) { return cuda::key_limit(g.causal, g.tq, g.tk, i); }

// Loads `rows` rows of width `width` starting at row `first` of an operand into a shared [tile, width]
// buffer (f32), by the whole block; rows past `limit` are not read.
template <typename T>
__device__ void stage_rows(float* smem, const T* base, const HeadLayout& l, int64_t b, int64_t h, int64_t first,
                           int rows, int64_t limit, int64_t width) {
  for (int64_t e = threadIdx.x; e < rows * width; e += blockDim.x) {
    const int64_t r = e / width, c = e % width;
    const int64_t t = first + r;
    smem[e] = t < limit ? load_f32(base, row_offset(l, b, h, t) + c) : 0.0f;
  }
}

template <typename T>
__global__ void forward_kernel(Geometry g, const T* q, const T* k, const T* v, T* out, float* lse, int tile) {
  extern __shared__ float smem[];
  float* ks = smem;                 // [tile, D]
  float* vs = smem + tile * g.d;    // [tile, Dv]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = blockIdx.y;  // query head
  const int64_t b = n / g.heads_per_batch, h = n % g.heads_per_batch, hk = h / g.kv_group;
  const int64_t i0 = int64_t(blockIdx.x) * kWarps;
  const int64_t i = i0 + warp;
  const bool active = i < g.tq;
  const int64_t limit = active ? key_limit(g, i) : 0;
  // The block's furthest key: the last active row's limit (limits grow with i).
  const int64_t block_limit = key_limit(g, imin(i0 + kWarps, g.tq) - 1);

  float qr[kPerLane], acc[kPerLane];
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    qr[u] = active && c < g.d ? load_f32(q, row_offset(g.q, b, h, i) + c) : 0.0f;
    acc[u] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 < block_limit; j0 += tile) {
    const int rows = int(imin(tile, block_limit - j0));
    __syncthreads();  // the previous tile is no longer read
    stage_rows(ks, k, g.k, b, hk, j0, rows, g.tk, g.d);
    stage_rows(vs, v, g.v, b, hk, j0, rows, g.tk, g.dv);
    __syncthreads();
    for (int r = 0; r < rows && j0 + r < limit; ++r) {
      float s = 0.0f;
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t c = lane + 32 * u;
        if (c < g.d) s += qr[u] * ks[r * g.d + c];
      }
      s = warp_sum(s) * g.scale_log2;
      const float m_new = fmaxf(m, s);
      const float corr = exp2f(m - m_new);  // 0 on the first key (m = -inf)
      const float pij = exp2f(s - m_new);
      l = l * corr + pij;
      const float pz = pij * g.dropout.factor(n, i, j0 + r);
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t c = lane + 32 * u;
        if (c < g.dv) acc[u] = acc[u] * corr + pz * vs[r * g.dv + c];
      }
      m = m_new;
    }
  }
  if (!active) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: zeros
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < g.dv) store_f32(out, row_offset(g.out, b, h, i) + c, acc[u] * inv);
  }
  if (lane == 0) lse[n * g.tq + i] = l > 0.0f ? m + log2f(l) : INFINITY;
}

// delta[n, i] = dout_i . out_i, one warp per row.
template <typename T>
__global__ void delta_kernel(Geometry g, const T* out, const T* dout, float* delta, int64_t heads) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // n * tq + i
  if (row >= heads * g.tq) return;
  const int64_t n = row / g.tq, i = row % g.tq;
  const int64_t b = n / g.heads_per_batch, h = n % g.heads_per_batch;
  const int64_t o = row_offset(g.out, b, h, i);
  float s = 0.0f;
  for (int64_t c = lane; c < g.dv; c += 32) s += load_f32(dout, o + c) * load_f32(out, o + c);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// dq: one warp per query row, keys in shared tiles (as the forward).
template <typename T>
__global__ void dq_kernel(Geometry g, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                          const float* delta, T* dq, int tile) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = smem + tile * g.d;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = blockIdx.y;
  const int64_t b = n / g.heads_per_batch, h = n % g.heads_per_batch, hk = h / g.kv_group;
  const int64_t i0 = int64_t(blockIdx.x) * kWarps;
  const int64_t i = i0 + warp;
  const bool active = i < g.tq;
  const int64_t limit = active ? key_limit(g, i) : 0;
  const int64_t block_limit = key_limit(g, imin(i0 + kWarps, g.tq) - 1);
  float qr[kPerLane], dor[kPerLane], acc[kPerLane];
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    qr[u] = active && c < g.d ? load_f32(q, row_offset(g.q, b, h, i) + c) : 0.0f;
    dor[u] = active && c < g.dv ? load_f32(dout, row_offset(g.out, b, h, i) + c) : 0.0f;
    acc[u] = 0.0f;
  }
  const float li = active ? lse[n * g.tq + i] : INFINITY;
  const float di = active ? delta[n * g.tq + i] : 0.0f;
  for (int64_t j0 = 0; j0 < block_limit; j0 += tile) {
    const int rows = int(imin(tile, block_limit - j0));
    __syncthreads();
    stage_rows(ks, k, g.k, b, hk, j0, rows, g.tk, g.d);
    stage_rows(vs, v, g.v, b, hk, j0, rows, g.tk, g.dv);
    __syncthreads();
    for (int r = 0; r < rows && j0 + r < limit; ++r) {
      float s = 0.0f, dp = 0.0f;
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t c = lane + 32 * u;
        if (c < g.d) s += qr[u] * ks[r * g.d + c];
        if (c < g.dv) dp += dor[u] * vs[r * g.dv + c];
      }
      s = warp_sum(s) * g.scale_log2;
      dp = warp_sum(dp) * g.dropout.factor(n, i, j0 + r);
      const float ds = exp2f(s - li) * (dp - di);
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t c = lane + 32 * u;
        if (c < g.d) acc[u] += ds * ks[r * g.d + c];
      }
    }
  }
  if (!active) return;
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < g.d) store_f32(dq, row_offset(g.q, b, h, i) + c, acc[u] * g.scale);
  }
}

// dk, dv: one warp per key row j of k/v head (b, hk), over the query rows of each query head of the
// group in turn (in order), query tiles staged in shared memory: q [tile, D], dout [tile, Dv], lse, delta.
template <typename T>
__global__ void dkdv_kernel(Geometry g, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                            const float* delta, T* dk, T* dv, int tile) {
  extern __shared__ float smem[];
  float* qs = smem;                      // [tile, D]
  float* ds_ = smem + tile * g.d;        // [tile, Dv]: dout rows
  float* ls = ds_ + tile * g.dv;         // [tile]
  float* es = ls + tile;                 // [tile]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t kv_heads_per_batch = g.heads_per_batch / g.kv_group;
  const int64_t nk = blockIdx.y;  // k/v head
  const int64_t b = nk / kv_heads_per_batch, hk = nk % kv_heads_per_batch;
  const int64_t j0w = int64_t(blockIdx.x) * kWarps;
  const int64_t j = j0w + warp;
  const bool active = j < g.tk;
  // Query rows that see key j: i >= j - (tk - tq) under the causal rule; the block starts at its first key's.
  const int64_t shift = g.tk - g.tq;
  const int64_t first_i = g.causal ? imax(0, j0w - shift) : 0;
  const int64_t my_first = g.causal ? imax(0, j - shift) : 0;
  float kr[kPerLane], vr[kPerLane], dka[kPerLane], dva[kPerLane];
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    kr[u] = active && c < g.d ? load_f32(k, row_offset(g.k, b, hk, j) + c) : 0.0f;
    vr[u] = active && c < g.dv ? load_f32(v, row_offset(g.v, b, hk, j) + c) : 0.0f;
    dka[u] = dva[u] = 0.0f;
  }
  for (int64_t gi = 0; gi < g.kv_group; ++gi) {
    const int64_t h = hk * g.kv_group + gi;
    const int64_t n = b * g.heads_per_batch + h;
    for (int64_t i0 = first_i; i0 < g.tq; i0 += tile) {
      const int rows = int(imin(tile, g.tq - i0));
      __syncthreads();
      stage_rows(qs, q, g.q, b, h, i0, rows, g.tq, g.d);
      stage_rows(ds_, dout, g.out, b, h, i0, rows, g.tq, g.dv);
      for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        ls[r] = lse[n * g.tq + i0 + r];
        es[r] = delta[n * g.tq + i0 + r];
      }
      __syncthreads();
      if (!active) continue;
      for (int r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        if (i < my_first) continue;
        float s = 0.0f, dp = 0.0f;
        for (int u = 0; u < kPerLane; ++u) {
          const int64_t c = lane + 32 * u;
          if (c < g.d) s += kr[u] * qs[r * g.d + c];
          if (c < g.dv) dp += vr[u] * ds_[r * g.dv + c];
        }
        s = warp_sum(s) * g.scale_log2;
        const float z = g.dropout.factor(n, i, j);
        const float pij = exp2f(s - ls[r]);
        const float dsij = pij * (warp_sum(dp) * z - es[r]);
        const float pz = pij * z;
        for (int u = 0; u < kPerLane; ++u) {
          const int64_t c = lane + 32 * u;
          if (c < g.d) dka[u] += dsij * qs[r * g.d + c];
          if (c < g.dv) dva[u] += pz * ds_[r * g.dv + c];
        }
      }
    }
  }
  if (!active) return;
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < g.d) store_f32(dk, row_offset(g.k, b, hk, j) + c, dka[u] * g.scale);
    if (c < g.dv) store_f32(dv, row_offset(g.v, b, hk, j) + c, dva[u]);
  }
}

Geometry geometry(const AttentionProblem& p, const char* op) {
  LOOM_CHECK(p.rope.cos == nullptr, op, ": the CUDA kernels take RoPE'd q and k (rope is not fused here)");
  LOOM_CHECK(p.d > 0 && p.d <= kMaxDim && p.dv > 0 && p.dv <= kMaxDim, op, ": head dimensions D=", p.d, ", Dv=",
             p.dv, " must be in [1, ", kMaxDim, "] for the CUDA kernels");
  LOOM_CHECK(p.kv_group > 0 && p.heads_per_batch % p.kv_group == 0, op, ": kv_group=", p.kv_group,
             " must divide heads_per_batch=", p.heads_per_batch);
  LOOM_CHECK(p.dropout_p >= 0.0f && p.dropout_p < 1.0f, op, ": dropout p must be in [0, 1), got ", p.dropout_p);
  LOOM_CHECK(p.heads() <= 65535 && p.kv_heads() <= 65535, op, ": ", p.heads(), " heads exceed one launch's grid");
  Geometry g;
  g.heads_per_batch = p.heads_per_batch;
  g.tq = p.tq;
  g.tk = p.tk;
  g.d = p.d;
  g.dv = p.dv;
  g.kv_group = p.kv_group;
  g.scale = p.scale;
  g.scale_log2 = p.scale * kLog2e;
  g.causal = p.causal;
  g.q = p.q;
  g.k = p.k;
  g.v = p.v;
  g.out = p.out;
  g.dropout = AttentionDropout::of(p);
  return g;
}

// Rows per shared tile: 32, or 16 when two 32-row tiles of D + Dv floats would pass 48 KiB.
int tile_rows(const AttentionProblem& p) { return (p.d + p.dv) * 32 * 4 <= 48 * 1024 - 1024 ? 32 : 16; }

template <typename T>
void forward(const Context& ctx, const AttentionProblem& p, const T* q, const T* k, const T* v, T* out,
             float* lse) {
  const char* op = "flash_attention";
  const Geometry g = geometry(p, op);
  if (p.heads() == 0 || p.tq == 0) return;
  const int tile = tile_rows(p);
  const dim3 grid(unsigned((p.tq + kWarps - 1) / kWarps), unsigned(p.heads()));
  DeviceGuard guard(ctx.index, op);
  forward_kernel<<<grid, kThreads, size_t(tile) * (p.d + p.dv) * sizeof(float), ctx.stream>>>(g, q, k, v, out, lse,
                                                                                             tile);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
void backward(const Context& ctx, const AttentionProblem& p, const T* q, const T* k, const T* v, const T* out,
              const T* dout, const float* lse, T* dq, T* dk, T* dv) {
  const char* op = "flash_attention backward";
  const Geometry g = geometry(p, op);
  if (p.heads() == 0) return;
  DeviceGuard guard(ctx.index, op);
  const int tile = tile_rows(p);
  if (p.tq == 0) {  // no query: dk, dv are zeros (dq is empty)
    const int64_t nk = p.kv_heads() * p.tk;
    if (nk > 0) {
      dkdv_kernel<<<dim3(unsigned((p.tk + kWarps - 1) / kWarps), unsigned(p.kv_heads())), kThreads,
                    size_t(tile) * (p.d + p.dv + 2) * sizeof(float), ctx.stream>>>(g, q, k, v, dout, lse, nullptr, dk,
                                                                                  dv, tile);
      LOOM_CUDA_CHECK_LAUNCH(op);
    }
    return;
  }
  Allocator& allocator = device_allocator(ctx.index);
  const size_t delta_bytes = size_t(p.heads() * p.tq) * sizeof(float);
  auto* delta = static_cast<float*>(allocator.allocate(delta_bytes));
  delta_kernel<<<unsigned((p.heads() * p.tq + kWarps - 1) / kWarps), kThreads, 0, ctx.stream>>>(g, out, dout, delta,
                                                                                               p.heads());
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    dq_kernel<<<dim3(unsigned((p.tq + kWarps - 1) / kWarps), unsigned(p.heads())), kThreads,
                size_t(tile) * (p.d + p.dv) * sizeof(float), ctx.stream>>>(g, q, k, v, dout, lse, delta, dq, tile);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && p.tk > 0) {
    dkdv_kernel<<<dim3(unsigned((p.tk + kWarps - 1) / kWarps), unsigned(p.kv_heads())), kThreads,
                  size_t(tile) * (p.d + p.dv + 2) * sizeof(float), ctx.stream>>>(g, q, k, v, dout, lse, delta, dk, dv,
                                                                                tile);
    e = cudaGetLastError();
  }
  allocator.deallocate(delta, delta_bytes);  // the stream orders any reuse after these kernels
  LOOM_CUDA_CHECK(op, e);
}

}  // namespace

// f32 tensors: blocks of GEMMs (attention_chunked.h), unless LOOM_CUDA_ATTENTION=warp; the checks of
// geometry() apply to both, so the two accept the same problems.
void flash_attention_forward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                             const float* v, float* out, float* lse) {
  if (chunked_attention_enabled()) {
    geometry(p, "flash_attention");
    chunked_attention_forward(ctx, p, q, k, v, out, lse);
    return;
  }
  forward(ctx, p, q, k, v, out, lse);
}
void flash_attention_forward(const Context& ctx, const AttentionProblem& p, const bf16* q, const bf16* k,
                             const bf16* v, bf16* out, float* lse) {
  forward(ctx, p, q, k, v, out, lse);
}
void flash_attention_backward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                              const float* v, const float* out, const float* dout, const float* lse, float* dq,
                              float* dk, float* dv) {
  if (chunked_attention_enabled()) {
    geometry(p, "flash_attention backward");
    chunked_attention_backward(ctx, p, q, k, v, out, dout, lse, dq, dk, dv);
    return;
  }
  backward(ctx, p, q, k, v, out, dout, lse, dq, dk, dv);
}
void flash_attention_backward(const Context& ctx, const AttentionProblem& p, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const bf16* dout, const float* lse, bf16* dq, bf16* dk,
                              bf16* dv) {
  backward(ctx, p, q, k, v, out, dout, lse, dq, dk, dv);
}

}  // namespace loom::cuda
