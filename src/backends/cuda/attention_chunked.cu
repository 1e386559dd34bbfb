// Attention as blocks of GEMMs (attention_chunked.h says why and how).
//
// The row kernels run one warp per row of a block buffer [B Hkv, c, j1]: lane l takes keys l, l + 32, ...
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/attention_chunked.h"
#include "backends/cuda/attention_mask.cuh"
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/gemm.h"

namespace loom::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 4;  // rows per block of the row kernels
constexpr int kThreads = 32 * kWarps;
// The f32 score buffer of one GEMM call. Measured on an H200 (docs/cuda.md): one call per head (432
// launches a layer for GPT-2 small) was bound by host time per launch; all B Hkv heads in one call was
// fastest up to ~200 MB of scores and slower at batch 64 (0.5 GB); a 32 MiB cap (to stay in L2) was in
// between. Calls take as many k/v heads as fit this budget.
constexpr size_t kBlockBufferBytes = size_t(256) << 20;
constexpr int64_t kMaxBlockRows = 256;                  // small enough that causal blocks skip ~half

// What the row kernels need about one block (by value: a kernel argument).
struct Block {
  int64_t batches;          // the call's k/v heads j0 .. j0 + batches - 1 (of B * Hkv)
  int64_t j0;
  int64_t rows;             // c
  int64_t i0;               // the block's first query row
  int64_t width;            // j1: the keys a row of the buffers holds
  int64_t ld;               // the buffers' row stride: j1 rounded up to 8 (16-byte rows for bf16 GEMMs)
  int64_t tq, tk;
  bool causal;
  float scale_log2;         // scale * log2(e)
  int64_t group;            // g = kv_group: query head n = j * g + member for batch j
  int64_t member;
  AttentionDropout dropout;
};

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// P = exp2(S * scale_log2 - lse) * Z over the row's visible keys, 0 past them; lse per row (+inf with
// no visible key, as the warp kernels).
template <typename E>
__global__ void softmax_rows_kernel(Block g, const float* s, E* p, float* lse) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // j * rows + r
  if (row >= g.batches * g.rows) return;
  const int64_t j = g.j0 + row / g.rows, i = g.i0 + row % g.rows;
  const int64_t n = j * g.group + g.member;
  const int64_t limit = key_limit(g.causal, g.tq, g.tk, i);  // <= width
  const float* srow = s + row * g.ld;
  float m = -INFINITY;
  for (int64_t k = lane; k < limit; k += 32) m = fmaxf(m, srow[k] * g.scale_log2);
  m = warp_max(m);
  float l = 0.0f;
  for (int64_t k = lane; k < limit; k += 32) l += exp2f(srow[k] * g.scale_log2 - m);
  l = warp_sum(l);
  const float row_lse = limit > 0 ? m + log2f(l) : INFINITY;
  E* prow = p + row * g.ld;
  for (int64_t k = lane; k < g.width; k += 32) {
    const float v = k < limit ? exp2f(srow[k] * g.scale_log2 - row_lse) * g.dropout.factor(n, i, k) : 0.0f;
    store_f32(prow, k, v);
  }
  if (lane == 0) lse[n * g.tq + i] = row_lse;
}

// dS = P (dP Z - delta), PZ = P Z from the raw scores S and dP (f32); ds may alias s, pz may alias dp
// (each element is read, then written, by the same thread).
template <typename E>
__global__ void softmax_backward_rows_kernel(Block g, const float* s, const float* dp, const float* lse,
                                             const float* delta, E* ds, E* pz) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= g.batches * g.rows) return;
  const int64_t j = g.j0 + row / g.rows, i = g.i0 + row % g.rows;
  const int64_t n = j * g.group + g.member;
  const int64_t limit = key_limit(g.causal, g.tq, g.tk, i);
  const float li = lse[n * g.tq + i], di = delta[n * g.tq + i];
  const int64_t base = row * g.ld;
  for (int64_t k = lane; k < g.width; k += 32) {
    float dsv = 0.0f, pzv = 0.0f;
    if (k < limit) {
      const float pij = exp2f(s[base + k] * g.scale_log2 - li);
      const float z = g.dropout.factor(n, i, k);
      dsv = pij * (dp[base + k] * z - di);
      pzv = pij * z;
    }
    store_f32(ds, base + k, dsv);
    store_f32(pz, base + k, pzv);
  }
}

__device__ __forceinline__ int64_t row_offset(const HeadLayout& l, int64_t b, int64_t h, int64_t t) {
  return b * l.batch_stride + h * l.head_stride + t * l.row_stride;
}

// delta[n, i] = dout_i . out_i, one warp per row.
__global__ void delta_kernel(const float* out, const float* dout, HeadLayout l, int64_t heads, int64_t heads_per_batch,
                             int64_t tq, int64_t dv, float* delta) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // n * tq + i
  if (row >= heads * tq) return;
  const int64_t n = row / tq, i = row % tq;
  const int64_t o = row_offset(l, n / heads_per_batch, n % heads_per_batch, i);
  float s = 0.0f;
  for (int64_t c = lane; c < dv; c += 32) s += dout[o + c] * out[o + c];
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// dst [B, H, T, W] (head-major, contiguous, f32 or rounded to bf16) = src rows in layout l.
template <typename E>
__global__ void pack_kernel(const float* src, HeadLayout l, int64_t heads, int64_t t, int64_t width, int64_t total,
                            E* dst) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t c = e % width, r = (e / width) % t, h = (e / (width * t)) % heads, b = e / (width * t * heads);
  store_f32(dst, e, src[row_offset(l, b, h, r) + c]);
}

// dst rows in layout l = src [B, H, T, W] (head-major, contiguous f32).
__global__ void unpack_kernel(const float* src, HeadLayout l, int64_t heads, int64_t t, int64_t width, int64_t total,
                              float* dst) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t c = e % width, r = (e / width) % t, h = (e / (width * t)) % heads, b = e / (width * t * heads);
  dst[row_offset(l, b, h, r) + c] = src[e];
}

// Device scratch from the caching allocator, returned at scope exit (stream-ordered reuse).
class Scratch {
 public:
  Scratch(int device, size_t bytes) : allocator_(device_allocator(device)), bytes_(std::max<size_t>(bytes, 1)) {
    ptr_ = allocator_.allocate(bytes_);
  }
  ~Scratch() { allocator_.deallocate(ptr_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  Allocator& allocator_;
  size_t bytes_;
  void* ptr_;
};

// A head-major packed operand [B, H, T, W] (f32, or bf16 for bf16 products).
struct Packed {
  std::unique_ptr<Scratch> buffer;
  int64_t t = 0, width = 0;
  size_t element = 4;
  // Row t0 of head n (n = b * H + h).
  const void* at(int64_t n, int64_t t0) const {
    return buffer->as<char>() + ((n * t + t0) * width) * int64_t(element);
  }
};

Packed pack(const Context& ctx, const float* x, const HeadLayout& l, int64_t batches, int64_t heads, int64_t t,
            int64_t width, bool bf16_products, const char* op) {
  Packed p;
  p.t = t;
  p.width = width;
  p.element = bf16_products ? sizeof(bf16) : sizeof(float);
  const int64_t total = batches * heads * t * width;
  p.buffer = std::make_unique<Scratch>(ctx.index, size_t(total) * p.element);
  if (total > 0) {
    if (bf16_products) {
      pack_kernel<<<grid_for(total, 256), 256, 0, ctx.stream>>>(x, l, heads, t, width, total, p.buffer->as<bf16>());
    } else {
      pack_kernel<<<grid_for(total, 256), 256, 0, ctx.stream>>>(x, l, heads, t, width, total, p.buffer->as<float>());
    }
    LOOM_CUDA_CHECK_LAUNCH(op);
  }
  return p;
}

void unpack(const Context& ctx, const float* src, const HeadLayout& l, int64_t batches, int64_t heads, int64_t t,
            int64_t width, float* dst, const char* op) {
  const int64_t total = batches * heads * t * width;
  if (total == 0) return;
  unpack_kernel<<<grid_for(total, 256), 256, 0, ctx.stream>>>(src, l, heads, t, width, total, dst);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

Block block_geometry(const AttentionProblem& p) {
  Block g{};
  g.batches = p.batches * (p.heads_per_batch / p.kv_group);
  g.tq = p.tq;
  g.tk = p.tk;
  g.causal = p.causal;
  g.scale_log2 = p.scale * kLog2e;
  g.group = p.kv_group;
  g.dropout = AttentionDropout::of(p);
  return g;
}

int64_t padded(int64_t n) { return (n + 7) / 8 * 8; }

// Query rows per block: at most kMaxBlockRows, fewer when one k/v head's rows of Tk floats would pass
// the buffer's budget.
int64_t block_rows(const AttentionProblem& p) {
  const int64_t per_row = std::max<int64_t>(1, padded(std::max<int64_t>(p.tk, 1)) * int64_t(sizeof(float)));
  return std::clamp<int64_t>(int64_t(kBlockBufferBytes) / per_row, 1, std::min<int64_t>(kMaxBlockRows, p.tq));
}

// k/v heads per GEMM call for a block of `rows` x `ld` scores: as many as the budget holds.
int64_t heads_per_call(int64_t rows, int64_t ld, int64_t jobs) {
  const int64_t per_head = std::max<int64_t>(1, rows * ld * int64_t(sizeof(float)));
  return std::clamp<int64_t>(int64_t(kBlockBufferBytes) / per_head, 1, jobs);
}

// The block's key count j1: keys [0, j1) are visible to some row of [i0, i0 + rows).
int64_t block_width(const AttentionProblem& p, int64_t i0, int64_t rows) {
  return key_limit(p.causal, p.tq, p.tk, i0 + rows - 1);
}

// C = alpha A B (+ beta C), batched with the given strides.
void batched_gemm(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, float beta,
                  float* C, int64_t ldc, int64_t stride_c, bool bf16_inputs, int64_t batches) {
  GemmProblem g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.M = M;
  g.N = N;
  g.K = K;
  g.alpha = alpha;
  g.beta = beta;
  g.A = A;
  g.lda = lda;
  g.B = B;
  g.ldb = ldb;
  g.C = C;
  g.ldc = ldc;
  g.input = bf16_inputs ? DType::BF16 : DType::F32;
  g.output = DType::F32;
  g.batch = batches;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_c = stride_c;
  gemm(ctx, g);
}

}  // namespace

bool chunked_attention_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("LOOM_CUDA_ATTENTION");
    return v == nullptr || std::strcmp(v, "warp") != 0;
  }();
  return enabled;
}

void chunked_attention_forward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                               const float* v, float* out, float* lse) {
  const char* op = "flash_attention";
  if (p.heads() == 0 || p.tq == 0) return;
  DeviceGuard guard(ctx.index, op);
  const bool bf = p.bf16_products;
  const int64_t B = p.batches, Hq = p.heads_per_batch, G = p.kv_group, Hkv = Hq / G, jobs = B * Hkv;
  const Packed qp = pack(ctx, q, p.q, B, Hq, p.tq, p.d, bf, op);
  const Packed kp = pack(ctx, k, p.k, B, Hkv, p.tk, p.d, bf, op);
  const Packed vp = pack(ctx, v, p.v, B, Hkv, p.tk, p.dv, bf, op);
  // O packed [B, Hq, Tq, Dv], zero where a block sees no key (it is then not written), unpacked at the end.
  const int64_t n_out = B * Hq * p.tq * p.dv;
  Scratch o_packed(ctx.index, size_t(n_out) * sizeof(float));
  LOOM_CUDA_CHECK(op, cudaMemsetAsync(o_packed.as<void>(), 0, size_t(n_out) * sizeof(float), ctx.stream));
  const int64_t chunk = block_rows(p);
  const size_t cells = std::max<size_t>(kBlockBufferBytes / sizeof(float), size_t(chunk * padded(std::max<int64_t>(p.tk, 1))));
  Scratch s_buf(ctx.index, cells * sizeof(float)), p_buf(ctx.index, cells * (bf ? sizeof(bf16) : sizeof(float)));
  Block g = block_geometry(p);
  // Batch j = b * Hkv + hk reads k/v head j and query head n = j * G + r: strides G rows of heads apart.
  const int64_t q_stride = G * p.tq * p.d, k_stride = p.tk * p.d, v_stride = p.tk * p.dv, o_stride = G * p.tq * p.dv;
  for (int64_t r = 0; r < G; ++r) {
    g.member = r;
    for (int64_t i0 = 0; i0 < p.tq; i0 += chunk) {
      const int64_t rows = std::min(chunk, p.tq - i0), j1 = block_width(p, i0, rows), ld = padded(j1);
      const int64_t per_call = heads_per_call(rows, std::max<int64_t>(ld, 1), jobs);
      g.i0 = i0;
      g.rows = rows;
      g.width = j1;
      g.ld = ld;
      for (int64_t j0 = 0; j0 < jobs; j0 += per_call) {
        const int64_t nb = std::min(per_call, jobs - j0);
        g.j0 = j0;
        g.batches = nb;
        if (j1 > 0) {
          batched_gemm(ctx, false, true, rows, j1, p.d, 1.0f, qp.at(j0 * G + r, i0), p.d, q_stride, kp.at(j0, 0), p.d,
                       k_stride, 0.0f, s_buf.as<float>(), ld, rows * ld, bf, nb);
        }
        const unsigned grid = unsigned((nb * rows + kWarps - 1) / kWarps);
        if (bf) {
          softmax_rows_kernel<<<grid, kThreads, 0, ctx.stream>>>(g, s_buf.as<float>(), p_buf.as<bf16>(), lse);
        } else {
          softmax_rows_kernel<<<grid, kThreads, 0, ctx.stream>>>(g, s_buf.as<float>(), p_buf.as<float>(), lse);
        }
        LOOM_CUDA_CHECK_LAUNCH(op);
        if (j1 > 0) {
          batched_gemm(ctx, false, false, rows, p.dv, j1, 1.0f, p_buf.as<void>(), ld, rows * ld, vp.at(j0, 0), p.dv,
                       v_stride, 0.0f, o_packed.as<float>() + ((j0 * G + r) * p.tq + i0) * p.dv, p.dv, o_stride, bf,
                       nb);
        }
      }
    }
  }
  unpack(ctx, o_packed.as<float>(), p.out, B, Hq, p.tq, p.dv, out, op);
}

void chunked_attention_backward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                                const float* v, const float* out, const float* dout, const float* lse, float* dq,
                                float* dk, float* dv) {
  const char* op = "flash_attention backward";
  if (p.heads() == 0) return;
  DeviceGuard guard(ctx.index, op);
  const bool bf = p.bf16_products;
  const int64_t B = p.batches, Hq = p.heads_per_batch, G = p.kv_group, Hkv = Hq / G, jobs = B * Hkv;
  // dQ packed [B, Hq, Tq, D] (zero where a block sees no key); dK, dV packed [B, Hkv, Tk, *] summed in f32
  // over every member of the group and every block; all unpacked into their layouts at the end.
  const int64_t nq = B * Hq * p.tq * p.d, nk = jobs * p.tk * p.d, nv = jobs * p.tk * p.dv;
  Scratch dq_acc(ctx.index, size_t(nq) * sizeof(float));
  Scratch dk_acc(ctx.index, size_t(nk) * sizeof(float)), dv_acc(ctx.index, size_t(nv) * sizeof(float));
  LOOM_CUDA_CHECK(op, cudaMemsetAsync(dq_acc.as<void>(), 0, size_t(nq) * sizeof(float), ctx.stream));
  LOOM_CUDA_CHECK(op, cudaMemsetAsync(dk_acc.as<void>(), 0, size_t(nk) * sizeof(float), ctx.stream));
  LOOM_CUDA_CHECK(op, cudaMemsetAsync(dv_acc.as<void>(), 0, size_t(nv) * sizeof(float), ctx.stream));

  if (p.tq > 0) {
    Scratch delta(ctx.index, size_t(p.heads() * p.tq) * sizeof(float));
    delta_kernel<<<unsigned((p.heads() * p.tq + kWarps - 1) / kWarps), kThreads, 0, ctx.stream>>>(
        out, dout, p.out, p.heads(), Hq, p.tq, p.dv, delta.as<float>());
    LOOM_CUDA_CHECK_LAUNCH(op);
    const Packed qp = pack(ctx, q, p.q, B, Hq, p.tq, p.d, bf, op);
    const Packed kp = pack(ctx, k, p.k, B, Hkv, p.tk, p.d, bf, op);
    const Packed vp = pack(ctx, v, p.v, B, Hkv, p.tk, p.dv, bf, op);
    const Packed dop = pack(ctx, dout, p.out, B, Hq, p.tq, p.dv, bf, op);
    const int64_t chunk = block_rows(p);
    const size_t cells = std::max<size_t>(kBlockBufferBytes / sizeof(float), size_t(chunk * padded(std::max<int64_t>(p.tk, 1))));
    // f32 S and dP; dS and PZ over them in f32, or in their own bf16 buffers.
    Scratch s_buf(ctx.index, cells * sizeof(float)), dp_buf(ctx.index, cells * sizeof(float));
    std::unique_ptr<Scratch> ds_b, pz_b;
    if (bf) {
      ds_b = std::make_unique<Scratch>(ctx.index, cells * sizeof(bf16));
      pz_b = std::make_unique<Scratch>(ctx.index, cells * sizeof(bf16));
    }
    const void* ds = bf ? ds_b->as<void>() : s_buf.as<void>();
    const void* pz = bf ? pz_b->as<void>() : dp_buf.as<void>();
    const int64_t q_stride = G * p.tq * p.d, k_stride = p.tk * p.d, v_stride = p.tk * p.dv;
    const int64_t do_stride = G * p.tq * p.dv;
    Block g = block_geometry(p);
    for (int64_t r = 0; r < G; ++r) {
      g.member = r;
      for (int64_t i0 = 0; i0 < p.tq; i0 += chunk) {
        const int64_t rows = std::min(chunk, p.tq - i0), j1 = block_width(p, i0, rows), ld = padded(j1);
        if (j1 == 0) continue;  // no key: dq rows stay 0, nothing reaches dk, dv
        const int64_t per_call = heads_per_call(rows, ld, jobs);
        g.i0 = i0;
        g.rows = rows;
        g.width = j1;
        g.ld = ld;
        for (int64_t j0 = 0; j0 < jobs; j0 += per_call) {
          const int64_t nb = std::min(per_call, jobs - j0), n0 = j0 * G + r;  // the call's first query head
          g.j0 = j0;
          g.batches = nb;
          batched_gemm(ctx, false, true, rows, j1, p.d, 1.0f, qp.at(n0, i0), p.d, q_stride, kp.at(j0, 0), p.d,
                       k_stride, 0.0f, s_buf.as<float>(), ld, rows * ld, bf, nb);
          batched_gemm(ctx, false, true, rows, j1, p.dv, 1.0f, dop.at(n0, i0), p.dv, do_stride, vp.at(j0, 0), p.dv,
                       v_stride, 0.0f, dp_buf.as<float>(), ld, rows * ld, bf, nb);
          const unsigned grid = unsigned((nb * rows + kWarps - 1) / kWarps);
          if (bf) {
            softmax_backward_rows_kernel<<<grid, kThreads, 0, ctx.stream>>>(
                g, s_buf.as<float>(), dp_buf.as<float>(), lse, delta.as<float>(), ds_b->as<bf16>(), pz_b->as<bf16>());
          } else {
            softmax_backward_rows_kernel<<<grid, kThreads, 0, ctx.stream>>>(
                g, s_buf.as<float>(), dp_buf.as<float>(), lse, delta.as<float>(), s_buf.as<float>(), dp_buf.as<float>());
          }
          LOOM_CUDA_CHECK_LAUNCH(op);
          // dQ rows of this block: scale dS K.
          batched_gemm(ctx, false, false, rows, p.d, j1, p.scale, ds, ld, rows * ld, kp.at(j0, 0), p.d, k_stride, 0.0f,
                       dq_acc.as<float>() + (n0 * p.tq + i0) * p.d, p.d, q_stride, bf, nb);
          // dK[0:j1] += scale dS^T Q, dV[0:j1] += PZ^T dO.
          batched_gemm(ctx, true, false, j1, p.d, rows, p.scale, ds, ld, rows * ld, qp.at(n0, i0), p.d, q_stride, 1.0f,
                       dk_acc.as<float>() + j0 * k_stride, p.d, k_stride, bf, nb);
          batched_gemm(ctx, true, false, j1, p.dv, rows, 1.0f, pz, ld, rows * ld, dop.at(n0, i0), p.dv, do_stride,
                       1.0f, dv_acc.as<float>() + j0 * v_stride, p.dv, v_stride, bf, nb);
        }
      }
    }
  }
  unpack(ctx, dq_acc.as<float>(), p.q, B, Hq, p.tq, p.d, dq, op);
  unpack(ctx, dk_acc.as<float>(), p.k, B, Hkv, p.tk, p.d, dk, op);
  unpack(ctx, dv_acc.as<float>(), p.v, B, Hkv, p.tk, p.dv, dv, op);
}

}  // namespace loom::cuda
