// CPU GEMM through oneDNN's matmul primitive, with a per-problem primitive cache. See gemm.h for the
// contract and docs/gemm.md for the measurements behind the choice.
//
// Legend: M rows of C, N columns of C, K the reduction, row-major throughout.
#include "backends/cpu/gemm.h"
#include "backends/row_sums.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <algorithm>
#include <type_traits>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "backends/cpu/gemm_blocked.h"
#include "backends/cpu/isa.h"
#include "core/amx.h"
#include "core/error.h"
#include "core/parallel.h"

namespace loom::cpu {
namespace {

using dnnl::memory;

// Everything that makes one oneDNN primitive differ from another.
struct GemmKey {
  bool trans_a = false, trans_b = false, bias = false;
  DType dtype = DType::F32;  // of A and B; C is always f32
  int threads = 1;
  int64_t batch = 1, M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0, ldc = 0, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool operator==(const GemmKey& o) const {
    return trans_a == o.trans_a && trans_b == o.trans_b && bias == o.bias && dtype == o.dtype &&
           threads == o.threads && batch == o.batch && M == o.M && N == o.N && K == o.K &&
           lda == o.lda && ldb == o.ldb && ldc == o.ldc && stride_a == o.stride_a &&
           stride_b == o.stride_b && stride_c == o.stride_c &&
           std::memcmp(&alpha, &o.alpha, sizeof(float)) == 0 &&
           std::memcmp(&beta, &o.beta, sizeof(float)) == 0;
  }
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(k.trans_a) | (static_cast<uint64_t>(k.trans_b) << 1) |
        (static_cast<uint64_t>(k.bias) << 2) | (static_cast<uint64_t>(k.dtype) << 3) |
        (static_cast<uint64_t>(k.threads) << 8));
    for (int64_t v : {k.batch, k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.stride_a, k.stride_b, k.stride_c})
      mix(static_cast<uint64_t>(v));
    uint32_t a, b;
    std::memcpy(&a, &k.alpha, 4);
    std::memcpy(&b, &k.beta, 4);
    mix((static_cast<uint64_t>(a) << 32) | b);
    return static_cast<size_t>(h);
  }
};

struct GemmPrimitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory::desc src_md, wei_md, dst_md, bias_md;
};

// The process-wide primitive memo. A pure cache: it changes how fast a call runs, never its result.
class GemmCache {
 public:
  static GemmCache& instance() {
    static GemmCache cache;
    return cache;
  }
  const dnnl::engine& engine() const { return engine_; }

  const GemmPrimitive& get(const GemmKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.lookups;
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    ++stats_.primitives_created;
    // unordered_map never moves its nodes, so the reference stays valid after later inserts.
    return map_.emplace(key, create(key)).first->second;
  }
  GemmCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  GemmCache() : engine_(dnnl::engine::kind::cpu, 0) {}

  GemmPrimitive create(const GemmKey& k) const {
    const memory::data_type ab = k.dtype == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::data_type f32 = memory::data_type::f32;
    const bool batched = k.batch > 1;
    // A shared operand (stride 0) is a broadcast batch dimension of size 1 in oneDNN's terms.
    const int64_t batch_a = (batched && k.stride_a == 0) ? 1 : k.batch;
    const int64_t batch_b = (batched && k.stride_b == 0) ? 1 : k.batch;
    // Logical A is [M,K]; a transposed A is stored [K,M], i.e. strides (1, lda).
    memory::dims a_strides = k.trans_a ? memory::dims{1, k.lda} : memory::dims{k.lda, 1};
    memory::dims b_strides = k.trans_b ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1};
    memory::dims c_strides = {k.ldc, 1};
    memory::dims a_dims = {k.M, k.K}, b_dims = {k.K, k.N}, c_dims = {k.M, k.N}, bias_dims = {1, k.N};
    memory::dims bias_strides = {k.N, 1};
    if (batched) {
      // A batch dimension of size 1 (broadcast) still needs a sane stride: use the matrix size.
      auto outer = [](int64_t stride, int64_t rows, int64_t ld) { return stride != 0 ? stride : rows * ld; };
      a_dims.insert(a_dims.begin(), batch_a);
      a_strides.insert(a_strides.begin(), outer(k.stride_a, k.trans_a ? k.K : k.M, k.lda));
      b_dims.insert(b_dims.begin(), batch_b);
      b_strides.insert(b_strides.begin(), outer(k.stride_b, k.trans_b ? k.N : k.K, k.ldb));
      c_dims.insert(c_dims.begin(), k.batch);
      c_strides.insert(c_strides.begin(), k.stride_c);
      bias_dims.insert(bias_dims.begin(), 1);
      bias_strides.insert(bias_strides.begin(), k.N);
    }
    GemmPrimitive p;
    p.src_md = memory::desc(a_dims, ab, a_strides);
    p.wei_md = memory::desc(b_dims, ab, b_strides);
    p.dst_md = memory::desc(c_dims, f32, c_strides);
    if (k.bias) p.bias_md = memory::desc(bias_dims, f32, bias_strides);

    dnnl::primitive_attr attr;
    // With oneDNN's default library-managed scratchpad (Debian's build has DNNL_ENABLE_CONCURRENT_EXEC
    // off), two threads running the same cached primitive at once got wrong results (docs/gemm.md).
    // Each caller passes its own thread-local scratchpad instead.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(k.beta);
      attr.set_post_ops(ops);
    }
    try {
      auto desc = k.bias ? dnnl::matmul::desc(p.src_md, p.wei_md, p.bias_md, p.dst_md)
                         : dnnl::matmul::desc(p.src_md, p.wei_md, p.dst_md);
      p.pd = dnnl::matmul::primitive_desc(desc, attr, engine_);
      p.prim = dnnl::matmul(p.pd);
    } catch (const dnnl::error& e) {
      LOOM_FAIL("gemm: oneDNN cannot create a matmul for M=", k.M, " N=", k.N, " K=", k.K, " batch=", k.batch,
                " trans_a=", k.trans_a, " trans_b=", k.trans_b, " dtype=", k.dtype, ": ", e.what());
    }
    return p;
  }

  dnnl::engine engine_;
  std::mutex mutex_;
  std::unordered_map<GemmKey, GemmPrimitive, GemmKeyHash> map_;
  GemmCacheStats stats_;
};

// Below this many flops (~10 us of one core) a GEMM runs single-threaded.
constexpr double kSerialFlops = 4.0e6;

// The threads a problem runs on, whichever kernel runs it: one inside a parallel region or under
// kSerialFlops (waking a second thread costs more than it saves, and on a busy machine a parallel
// region can wait a whole time slice for a descheduled thread: gradchecks of small matmuls ran 5-100x
// slower on 2 threads than on 1 here), else loom::num_threads().
int threads_for(const GemmKey& k) {
  const double flops = 2.0 * static_cast<double>(k.batch) * static_cast<double>(k.M) * static_cast<double>(k.N) *
                       static_cast<double>(k.K);
  return (omp_in_parallel() || flops < kSerialFlops) ? 1 : num_threads();
}

void check_problem(const GemmKey& k) {
  LOOM_CHECK(k.M >= 0 && k.N >= 0 && k.K >= 0 && k.batch >= 0, "gemm: negative size M=", k.M, " N=", k.N,
             " K=", k.K, " batch=", k.batch);
  // An empty product reads neither operand (and with K = 0 only writes C), so the leading dimensions
  // of an operand with a zero side are not checked: a contiguous [M, 0] or [0, N] array has ld 0, and
  // numpy and PyTorch give [m, 0] @ [0, n] as zeros and [0, k] @ [k, n] as an empty result.
  const bool writes_c = k.batch > 0 && k.M > 0 && k.N > 0;
  const bool reads_ab = writes_c && k.K > 0;
  const int64_t min_lda = k.trans_a ? k.M : k.K;
  const int64_t min_ldb = k.trans_b ? k.K : k.N;
  LOOM_CHECK(!reads_ab || k.lda >= min_lda, "gemm: lda=", k.lda, " is less than ", min_lda,
             " (trans_a=", k.trans_a, ", M=", k.M, ", K=", k.K, ")");
  LOOM_CHECK(!reads_ab || k.ldb >= min_ldb, "gemm: ldb=", k.ldb, " is less than ", min_ldb,
             " (trans_b=", k.trans_b, ", K=", k.K, ", N=", k.N, ")");
  LOOM_CHECK(!writes_c || k.ldc >= k.N, "gemm: ldc=", k.ldc, " is less than N=", k.N);
  LOOM_CHECK(!reads_ab || k.batch <= 1 || k.stride_a != 0 || k.stride_b != 0,
             "gemm: batch=", k.batch, " with both A and B shared (stride 0) is not supported");
  LOOM_CHECK(!writes_c || k.batch <= 1 || k.stride_c >= k.M * k.ldc, "gemm: stride_c=", k.stride_c,
             " overlaps the batches (M*ldc=", k.M * k.ldc, ")");
}

// C = beta * C (+ bias): what a GEMM with K = 0 leaves.
void scale_c(const GemmKey& k, const float* bias, float* C) {
  for (int64_t b = 0; b < k.batch; ++b) {
    for (int64_t m = 0; m < k.M; ++m) {
      float* c = C + b * k.stride_c + m * k.ldc;
      for (int64_t n = 0; n < k.N; ++n) {
        float v = k.beta == 0.0f ? 0.0f : k.beta * c[n];
        c[n] = bias != nullptr ? v + bias[n] : v;
      }
    }
  }
}

// Whether this CPU has oneDNN bf16 matmul kernels (AVX512-BF16/AMX, or AVX512 emulation). Without
// them oneDNN 2.x refuses a bf16 matmul outright, and loom widens the operands to f32 instead.
bool bf16_kernels_available() {
  static const bool available = [] {
    try {
      memory::desc a({8, 8}, memory::data_type::bf16, memory::dims{8, 1});
      memory::desc c({8, 8}, memory::data_type::f32, memory::dims{8, 1});
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, c), GemmCache::instance().engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

// Elements an operand spans: `rows` rows of leading dimension `ld`, repeated `batch` times `stride` apart.
int64_t operand_extent(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return (batch > 1 && stride != 0 ? (batch - 1) * stride : 0) + rows * ld;
}

void execute(GemmKey key, const void* A, const void* B, const float* bias, float* C);

// The kernel set by set_gemm_kernel; -1 while none is (then LOOM_GEMM, else Auto).
std::atomic<int> g_kernel_override{-1};

GemmKernel kernel_from_env() {
  static const GemmKernel from_env = [] {
    const char* env = std::getenv("LOOM_GEMM");
    return env == nullptr || *env == '\0' ? GemmKernel::Auto : parse_gemm_kernel(env);
  }();
  return from_env;
}

// Decode-sized f32 problems (a few rows) stay on oneDNN: packing all of B for one row costs as much as
// the product itself, and oneDNN's GEMV reads B once.
constexpr int64_t kBlockedMinRows = 8;

// oneDNN 2.6's AVX2 f32 kernel (gemm:jit) on weight-gradient products, C = A^T B, whose output is
// 256..512 on both sides and whose inner dimension is long (K >= 1024: the batch's rows): measured on
// Zen 3 at 0.55-0.85x the blocked kernel's rate (medians of 5 interleaved runs, 1 and 2 threads; 640
// and up, 128, and the other transpositions at 0.85-1.1x: docs/gemm.md). These are the q/k/v/output
// projections' dW in a d_model-512 model, 16 GEMMs of a CS336 step.
bool onednn_avx2_is_slow_at(const GemmKey& k) {
  const bool output_256_to_512 = k.M >= 256 && k.M <= 512 && k.N >= 256 && k.N <= 512;
  return k.trans_a && !k.trans_b && output_256_to_512 && k.K >= 1024;
}

// On AVX-512 CPUs without AMX (Zen 4 measured), oneDNN 2.6's brgemm and the blocked kernel's 14 x 32
// tile run most shapes within 5% of each other; the blocked kernel leads on two LM-head products of a
// large vocabulary (medians of 7 interleaved rounds, 2 threads, docs/gemm.md "AVX-512 tile"):
//   dx = dlogits W, f32, K = the vocabulary >= 16384: 1.18-1.26x (GPT-2's 1024 x 768 x 50257);
//   dW = dlogits^T x, bf16, M = the vocabulary >= 10000: 1.05-1.08x (CS336's 10000) to 1.22-1.42x
//   (GPT-2's). dsv3-mini's 8192 (1.04-1.08x alone) stays: its bf16 step ran 0.88-0.97x with it.
bool blocked_leads_on_avx512(const GemmKey& k) {
  if (cpu_isa() != CpuIsa::Avx512 || cpu_has_amx_bf16()) return false;
  if (k.dtype == DType::F32) return !k.trans_a && !k.trans_b && k.K >= 16384 && k.M >= 256;
  return k.trans_a && !k.trans_b && k.M >= 10000 && k.K >= 256 && cpu_has_avx512_bf16();
}

// On AVX-512 CPUs with AMX (a 2-vCPU Sapphire Rapids measured: docs/gemm.md, "Sapphire Rapids"), oneDNN 2.6
// keeps bf16 (its AMX kernels run at 2-4x the FMA peak), but its f32 kernels fall far behind the
// blocked kernel's on a few training shapes (medians of 3 interleaved repetitions, 1 and 2 threads):
//   B untransposed with N >= 3072: GPT-2's MLP down-projection backward, dx (1024, 3072, 768) and dW
//   (768, 3072, 1024): 21-30% of the FMA peak against 63-67% (2.2-3.0x);
//   the LM head's dx, K = the vocabulary >= 16384: 1.16-1.43x (GPT-2's 50257);
//   the LM head's dW, A transposed, M = the vocabulary >= 16384: 1.46-1.70x.
bool blocked_leads_on_amx_cpu(const GemmKey& k) {
  if (cpu_isa() != CpuIsa::Avx512 || !cpu_has_amx_bf16() || k.dtype != DType::F32 || k.trans_b) return false;
  if (k.N >= 3072 && k.M >= 256 && k.K >= 256) return true;
  return k.trans_a ? k.M >= 16384 && k.K >= 256 : k.K >= 16384 && k.M >= 256;
}

bool use_blocked(const GemmKey& k) {
  switch (gemm_kernel()) {
    case GemmKernel::Blocked:
      return k.M >= kBlockedMinRows;
    case GemmKernel::OneDnn:
      return false;
    case GemmKernel::Auto:
      // oneDNN, which the blocked kernel only matches on most shapes (docs/gemm.md), except: the
      // LM-head shapes where the AVX-512 copy leads (above); in f32, the shapes where oneDNN's AVX2
      // kernel is measurably slow; in bf16 on a CPU without oneDNN bf16 kernels, every GEMM, since
      // oneDNN would first copy both operands to f32 in full (the blocked kernel widens them while it packs).
      if (blocked_leads_on_avx512(k) || blocked_leads_on_amx_cpu(k)) return true;
      if (k.dtype == DType::F32) return cpu_isa() == CpuIsa::Avx2 && onednn_avx2_is_slow_at(k);
      return k.dtype == DType::BF16 && !bf16_kernels_available() && cpu_isa_supported(CpuIsa::Avx2);
  }
  return false;
}

void run_blocked(const GemmKey& key, const void* A, const void* B, const float* bias, float* C) {
  BlockedGemm g;
  g.trans_a = key.trans_a;
  g.trans_b = key.trans_b;
  g.bf16 = key.dtype == DType::BF16;
  g.batch = key.batch;
  g.M = key.M;
  g.N = key.N;
  g.K = key.K;
  g.alpha = key.alpha;
  g.beta = key.beta;
  g.A = A;
  g.lda = key.lda;
  g.stride_a = key.batch > 1 ? key.stride_a : 0;
  g.B = B;
  g.ldb = key.ldb;
  g.stride_b = key.batch > 1 ? key.stride_b : 0;
  g.bias = key.bias ? bias : nullptr;
  g.C = C;
  g.ldc = key.ldc;
  g.stride_c = key.batch > 1 ? key.stride_c : 0;
  g.threads = key.threads;
  // The copy follows cpu_isa() (LOOM_CPU_ISA), so the tests can run each; below AVX2 (a scalar choice on
  // an AVX2 CPU) the AVX2 copy still runs: set_gemm_kernel allows Blocked only where it can.
  if (cpu_isa() == CpuIsa::Avx512) {
    g.bf16_pairs = g.bf16 && cpu_has_avx512_bf16();
    g.amx = g.bf16 && cpu_has_amx_bf16() && amx_allowed() && amx_usable();
    isa_avx512::blocked_gemm(g);
  } else {
    isa_avx2::blocked_gemm(g);
  }
}

void run(GemmKey key, const void* A, const void* B, const float* bias, float* C) {
  const bool empty = key.batch == 0 || key.M == 0 || key.N == 0 || key.K == 0;
  if (key.dtype != DType::BF16 || bf16_kernels_available() || empty || use_blocked(key))
    return execute(key, A, B, bias, C);  // the blocked kernel widens bf16 while it packs
  check_problem(key);
  // Same bf16 values, exact f32 products: only the speed differs from a native bf16 kernel.
  thread_local std::vector<float> wide_a, wide_b;
  auto widen = [](const void* src, int64_t n, std::vector<float>& dst) {
    dst.resize(static_cast<size_t>(n));
    const bf16* s = static_cast<const bf16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[static_cast<size_t>(i)] = s[i].to_float();
  };
  widen(A, operand_extent(key.batch, key.stride_a, key.trans_a ? key.K : key.M, key.lda), wide_a);
  widen(B, operand_extent(key.batch, key.stride_b, key.trans_b ? key.N : key.K, key.ldb), wide_b);
  key.dtype = DType::F32;
  execute(key, wide_a.data(), wide_b.data(), bias, C);
}

void execute(GemmKey key, const void* A, const void* B, const float* bias, float* C) {
  check_problem(key);
  if (key.batch == 0 || key.M == 0 || key.N == 0) return;
  if (key.K == 0) {
    scale_c(key, bias, C);
    return;
  }
  if (key.batch == 1) key.stride_a = key.stride_b = key.stride_c = 0;
  key.threads = threads_for(key);
  if (use_blocked(key)) {
    run_blocked(key, A, B, bias, C);  // it sizes its own parallel region from key.threads
    return;
  }
  // oneDNN (OpenMP build) sizes its parallel regions from the calling thread's OpenMP setting.
  const bool nested = omp_in_parallel();
  const int caller_threads = num_threads();
  const bool serial = !nested && key.threads == 1;
  if (!nested && omp_get_max_threads() != key.threads) omp_set_num_threads(key.threads);
  struct RestoreThreads {  // a serial call leaves the caller's OpenMP setting as it found it
    bool active;
    int threads;
    ~RestoreThreads() {
      if (active) omp_set_num_threads(threads);
    }
  } restore{!nested && serial && caller_threads != 1, caller_threads};

  GemmCache& cache = GemmCache::instance();
  const GemmPrimitive& p = cache.get(key);
  const dnnl::engine& eng = cache.engine();
  thread_local dnnl::stream stream(eng);
  memory src(p.src_md, eng, const_cast<void*>(A));
  memory wei(p.wei_md, eng, const_cast<void*>(B));
  memory dst(p.dst_md, eng, C);
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (key.bias) args.emplace(DNNL_ARG_BIAS, memory(p.bias_md, eng, const_cast<float*>(bias)));
  const memory::desc scratch_md = p.pd.scratchpad_desc();
  thread_local std::vector<uint8_t> scratch;  // grows to the largest scratchpad this thread has needed
  if (scratch.size() < scratch_md.get_size()) scratch.resize(scratch_md.get_size());
  args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratch_md, eng, scratch.data()));
  p.prim.execute(stream, args);
  stream.wait();
}

GemmKey make_key(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                 int64_t lda, int64_t stride_a, int64_t ldb, int64_t stride_b, float beta, int64_t ldc,
                 int64_t stride_c, DType dtype, bool bias) {
  GemmKey k;
  k.trans_a = trans_a;
  k.trans_b = trans_b;
  k.bias = bias;
  k.dtype = dtype;
  k.batch = batch;
  k.M = M;
  k.N = N;
  k.K = K;
  k.lda = lda;
  k.ldb = ldb;
  k.ldc = ldc;
  k.stride_a = stride_a;
  k.stride_b = stride_b;
  k.stride_c = stride_c;
  k.alpha = alpha;
  k.beta = beta;
  return k;
}

template <typename T>
float to_f32(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return v.to_float();
  } else {
    return v;
  }
}

template <typename T>
void reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        float a = to_f32(trans_a ? A[k * lda + m] : A[m * lda + k]);
        float b = to_f32(trans_b ? B[n * ldb + k] : B[k * ldb + n]);
        acc += static_cast<double>(a) * b;
      }
      double c = alpha * acc;
      if (beta != 0.0f) c += static_cast<double>(beta) * C[m * ldc + n];
      C[m * ldc + n] = static_cast<float>(c);
    }
  }
}

// LOOM_AMX=off, else set_amx_allowed; -1 while unset.
std::atomic<int> g_amx_override{-1};

bool amx_from_env() {
  static const bool allowed = [] {
    const char* env = std::getenv("LOOM_AMX");
    if (env == nullptr || *env == '\0' || std::strcmp(env, "on") == 0) return true;
    LOOM_CHECK(std::strcmp(env, "off") == 0, "LOOM_AMX='", env, "' is not one of: on, off");
    return false;
  }();
  return allowed;
}

// Which grouped kernel runs: the blocked one (and its bf16 path), or one oneDNN GEMM per group.
enum class GroupedPath { PerGroup, Values, Pairs, Tiles };

GroupedPath grouped_path(DType dtype) {
  if (gemm_kernel() == GemmKernel::OneDnn || !cpu_isa_supported(CpuIsa::Avx2)) return GroupedPath::PerGroup;
  if (dtype == DType::F32 || cpu_isa() != CpuIsa::Avx512) return GroupedPath::Values;
  if (cpu_has_amx_bf16() && amx_allowed() && amx_usable()) return GroupedPath::Tiles;
  return cpu_has_avx512_bf16() ? GroupedPath::Pairs : GroupedPath::Values;
}

// Rows per oneDNN call in the per-group path: its primitives are cached by shape, and the experts' row
// counts change every step, so each group is cut into tiles of at most this many rows (and, where the
// groups' K differ, K into blocks of as many, accumulated with beta = 1): at most kGroupTile sizes of
// tail, however the counts move. 128 was measured as the best tile height for the MoE (docs/moe.md).
constexpr int64_t kGroupTile = 128;

// One oneDNN GEMM per tile, each on one thread (a parallel region over the tiles, heaviest groups
// first), gathered rows copied into a per-thread buffer first.
template <typename T>
void grouped_per_group(bool trans_a, bool trans_b, int64_t N, float alpha, int64_t lda, int64_t ldb, float beta,
                       int64_t ldc, const std::vector<GemmGroup>& groups) {
  if (N == 0) return;
  const int64_t G = static_cast<int64_t>(groups.size());
  bool same_k = true;
  for (const GemmGroup& g : groups) same_k = same_k && g.K == groups.front().K;
  struct Task {
    int64_t group, m0, cost;
  };
  std::vector<Task> tasks;
  for (int64_t i = 0; i < G; ++i) {
    const GemmGroup& g = groups[static_cast<size_t>(i)];
    for (int64_t m0 = 0; m0 < g.M; m0 += kGroupTile)
      tasks.push_back({i, m0, std::min(kGroupTile, g.M - m0) * std::max<int64_t>(g.K, 1)});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  std::exception_ptr error;
  std::mutex error_mutex;
  // A parallel region whenever the work is worth a second thread, so every GEMM in it runs on one
  // thread (gemm.h) and the result cannot depend on the thread count.
  double flops = 0;
  for (const GemmGroup& g : groups) flops += 2.0 * static_cast<double>(g.M) * static_cast<double>(N) * static_cast<double>(g.K);
  const int threads = flops < kSerialFlops ? 1 : num_threads();  // (each tile then under kSerialFlops too)
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (size_t t = 0; t < tasks.size(); ++t) {
    try {
      const GemmGroup& g = groups[static_cast<size_t>(tasks[t].group)];
      const int64_t m0 = tasks[t].m0, mc = std::min(kGroupTile, g.M - m0);
      const T* A = static_cast<const T*>(g.A);
      const T* B = static_cast<const T*>(g.B);
      float* C = g.C + m0 * ldc;
      auto run = [&](const T* a, int64_t a_ld, const T* b, int64_t b_ld, int64_t kc, float beta_k) {
        if constexpr (std::is_same_v<T, bf16>) {
          gemm_bf16(trans_a, trans_b, mc, N, kc, alpha, a, a_ld, b, b_ld, beta_k, C, ldc);
        } else {
          gemm(trans_a, trans_b, mc, N, kc, alpha, a, a_ld, b, b_ld, beta_k, C, ldc);
        }
      };
      if (g.K == 0) {
        run(A, 1, B, 1, 0, beta);  // C = beta * C
        continue;
      }
      const int64_t kb = same_k ? g.K : kGroupTile;
      thread_local std::vector<T> a_rows, b_rows;
      for (int64_t k0 = 0; k0 < g.K; k0 += kb) {
        const int64_t kc = std::min(kb, g.K - k0);
        const T* a = trans_a ? A + k0 * lda + m0 : A + m0 * lda + k0;
        int64_t a_ld = lda;
        if (g.a_rows != nullptr) {
          a_rows.resize(static_cast<size_t>(mc * kc));
          for (int64_t m = 0; m < mc; ++m)
            std::memcpy(a_rows.data() + m * kc, A + static_cast<int64_t>(g.a_rows[m0 + m]) * lda + k0,
                        sizeof(T) * static_cast<size_t>(kc));
          a = a_rows.data();
          a_ld = kc;
        }
        const T* b = trans_b ? B + k0 : B + k0 * ldb;
        int64_t b_ld = ldb;
        if (g.b_rows != nullptr) {
          b_rows.resize(static_cast<size_t>(kc * N));
          for (int64_t k = 0; k < kc; ++k)
            std::memcpy(b_rows.data() + k * N, B + static_cast<int64_t>(g.b_rows[k0 + k]) * ldb,
                        sizeof(T) * static_cast<size_t>(N));
          b = b_rows.data();
          b_ld = N;
        }
        run(a, a_ld, b, b_ld, kc, k0 == 0 ? beta : 1.0f);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

template <typename T>
void grouped(bool trans_a, bool trans_b, int64_t N, float alpha, int64_t lda, int64_t ldb, float beta, int64_t ldc,
             const std::vector<GemmGroup>& groups) {
  constexpr DType dtype = std::is_same_v<T, bf16> ? DType::BF16 : DType::F32;
  LOOM_CHECK(N >= 0, "gemm_grouped: negative N=", N);
  LOOM_CHECK(ldc >= N, "gemm_grouped: ldc=", ldc, " is less than N=", N);
  for (size_t i = 0; i < groups.size(); ++i) {
    const GemmGroup& g = groups[i];
    LOOM_CHECK(g.M >= 0 && g.K >= 0, "gemm_grouped: group ", i, " has a negative size M=", g.M, " K=", g.K);
    LOOM_CHECK(g.a_rows == nullptr || !trans_a, "gemm_grouped: group ", i, " gathers the rows of a transposed A");
    LOOM_CHECK(g.b_rows == nullptr || !trans_b, "gemm_grouped: group ", i, " gathers the rows of a transposed B");
    if (g.M == 0 || N == 0 || g.K == 0) continue;
    const int64_t min_lda = trans_a ? g.M : g.K, min_ldb = trans_b ? g.K : N;
    LOOM_CHECK(lda >= min_lda, "gemm_grouped: lda=", lda, " is less than ", min_lda, " in group ", i, " (M=", g.M,
               ", K=", g.K, ")");
    LOOM_CHECK(ldb >= min_ldb, "gemm_grouped: ldb=", ldb, " is less than ", min_ldb, " in group ", i, " (K=", g.K,
               ", N=", N, ")");
    LOOM_CHECK(g.A != nullptr && g.B != nullptr && g.C != nullptr, "gemm_grouped: group ", i, " has a null operand");
  }
  const GroupedPath path = grouped_path(dtype);
  if (path == GroupedPath::PerGroup) return grouped_per_group<T>(trans_a, trans_b, N, alpha, lda, ldb, beta, ldc, groups);
  if (N == 0) return;
  std::vector<BlockedGemmGroup> blocked(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    const GemmGroup& g = groups[i];
    blocked[i] = {g.M, g.K, g.A, g.B, g.C, g.a_rows, g.b_rows};
  }
  GroupedBlockedGemm g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.bf16 = dtype == DType::BF16;
  g.bf16_pairs = path == GroupedPath::Pairs;
  g.amx = path == GroupedPath::Tiles;
  g.N = N;
  g.alpha = alpha;
  g.beta = beta;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.groups = blocked.data();
  g.count = static_cast<int64_t>(blocked.size());
  // As threads_for: one thread inside a parallel region or for a small problem in all.
  double flops = 0;
  for (const GemmGroup& grp : groups) flops += 2.0 * static_cast<double>(grp.M) * static_cast<double>(N) * static_cast<double>(grp.K);
  g.threads = omp_in_parallel() || flops < kSerialFlops ? 1 : num_threads();
  if (cpu_isa() == CpuIsa::Avx512) {
    isa_avx512::grouped_gemm(g);
  } else {
    isa_avx2::grouped_gemm(g);
  }
}

}  // namespace

void gemm_grouped(bool trans_a, bool trans_b, int64_t N, float alpha, int64_t lda, int64_t ldb, float beta,
                  int64_t ldc, const std::vector<GemmGroup>& groups) {
  grouped<float>(trans_a, trans_b, N, alpha, lda, ldb, beta, ldc, groups);
}

void gemm_grouped_bf16(bool trans_a, bool trans_b, int64_t N, float alpha, int64_t lda, int64_t ldb, float beta,
                       int64_t ldc, const std::vector<GemmGroup>& groups) {
  grouped<bf16>(trans_a, trans_b, N, alpha, lda, ldb, beta, ldc, groups);
}

bool amx_usable() { return cpu_has_amx_bf16() && amx_tile_state_granted(); }

bool amx_allowed() {
  const int chosen = g_amx_override.load(std::memory_order_relaxed);
  return chosen >= 0 ? chosen != 0 : amx_from_env();
}

void set_amx_allowed(bool allowed) { g_amx_override.store(allowed ? 1 : 0, std::memory_order_relaxed); }

std::string gemm_grouped_implementation(DType dtype) {
  switch (grouped_path(dtype)) {
    case GroupedPath::PerGroup:
      return "onednn, one GEMM per group";
    case GroupedPath::Values:
      return cpu_isa() == CpuIsa::Avx512 ? "loom blocked avx512 14x32" : "loom blocked avx2 6x16";
    case GroupedPath::Pairs:
      return "loom blocked avx512 14x32, bf16 pairs by vdpbf16ps";
    case GroupedPath::Tiles:
      return "loom blocked, AMX tiles 32x32";
  }
  return "?";
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run(make_key(trans_a, trans_b, 1, M, N, K, alpha, lda, 0, ldb, 0, beta, ldc, 0, DType::F32, false), A, B,
      nullptr, C);
}

void gemm_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, const float* bias, float beta, float* C, int64_t ldc) {
  run(make_key(trans_a, trans_b, 1, M, N, K, 1.0f, lda, 0, ldb, 0, beta, ldc, 0, DType::F32, bias != nullptr),
      A, B, bias, C);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c) {
  run(make_key(trans_a, trans_b, batch, M, N, K, alpha, lda, stride_a, ldb, stride_b, beta, ldc, stride_c,
               DType::F32, false),
      A, B, nullptr, C);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
               int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run(make_key(trans_a, trans_b, 1, M, N, K, alpha, lda, 0, ldb, 0, beta, ldc, 0, DType::BF16, false), A, B,
      nullptr, C);
}

void gemm_bias_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A,
                    int64_t lda, const bf16* B, int64_t ldb, const float* bias, float beta, float* C,
                    int64_t ldc) {
  run(make_key(trans_a, trans_b, 1, M, N, K, 1.0f, lda, 0, ldb, 0, beta, ldc, 0, DType::BF16,
               bias != nullptr),
      A, B, bias, C);
}

void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                       float alpha, const bf16* A, int64_t lda, int64_t stride_a, const bf16* B,
                       int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c) {
  run(make_key(trans_a, trans_b, batch, M, N, K, alpha, lda, stride_a, ldb, stride_b, beta, ldc, stride_c,
               DType::BF16, false),
      A, B, nullptr, C);
}

void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_reference_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
                         int64_t ldc) {
  reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void sum_rows(const float* x, int64_t M, int64_t N, float* out) {
  // Columns are split into fixed chunks; each chunk sums the rows block by block in the order of
  // backends/row_sums.h (the CUDA kernel's), so every output element is summed in the same order
  // whatever the thread count or the backend.
  parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) {
    std::vector<float> block(static_cast<size_t>(n1 - n0));
    for (int64_t n = n0; n < n1; ++n) out[n] = 0.0f;
    for (int64_t m0 = 0; m0 < M; m0 += kRowSumBlock) {
      std::fill(block.begin(), block.end(), 0.0f);
      for (int64_t m = m0; m < std::min(M, m0 + kRowSumBlock); ++m) {
        const float* row = x + m * N;
        for (int64_t n = n0; n < n1; ++n) block[static_cast<size_t>(n - n0)] += row[n];
      }
      for (int64_t n = n0; n < n1; ++n) out[n] += block[static_cast<size_t>(n - n0)];
    }
  });
}

GemmCacheStats gemm_cache_stats() { return GemmCache::instance().stats(); }

GemmKernel gemm_kernel() {
  const int chosen = g_kernel_override.load(std::memory_order_relaxed);
  return chosen >= 0 ? static_cast<GemmKernel>(chosen) : kernel_from_env();
}

void set_gemm_kernel(GemmKernel kernel) {
  LOOM_CHECK(kernel != GemmKernel::Blocked || cpu_isa_supported(CpuIsa::Avx2),
             "gemm: the blocked kernel needs a CPU with AVX2 and FMA; this one has ", cpu_isa_name(cpu_isa()));
  g_kernel_override.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::Auto:
      return "auto";
    case GemmKernel::OneDnn:
      return "onednn";
    case GemmKernel::Blocked:
      return "blocked";
  }
  return "?";
}

GemmKernel parse_gemm_kernel(const char* text) {
  const std::string t = text != nullptr ? text : "";
  if (t == "auto") return GemmKernel::Auto;
  if (t == "onednn") return GemmKernel::OneDnn;
  if (t == "blocked") {
    LOOM_CHECK(cpu_isa_supported(CpuIsa::Avx2), "LOOM_GEMM=blocked needs a CPU with AVX2 and FMA; this one has ",
               cpu_isa_name(cpu_isa()));
    return GemmKernel::Blocked;
  }
  LOOM_FAIL("gemm kernel '", t, "' is not one of: auto, onednn, blocked (LOOM_GEMM)");
}

std::string gemm_implementation(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType dtype) {
  LOOM_CHECK(dtype == DType::F32 || dtype == DType::BF16, "gemm_implementation: dtype ", dtype,
             " is not f32 or bf16");
  GemmKey k = make_key(trans_a, trans_b, 1, M, N, K, 1.0f, trans_a ? M : K, 0, trans_b ? K : N, 0, 0.0f, N, 0,
                       dtype, false);
  check_problem(k);
  if (use_blocked(k)) {
    const std::string copy = cpu_isa() == CpuIsa::Avx512 ? "loom blocked avx512 14x32" : "loom blocked avx2 6x16";
    if (dtype == DType::F32) return copy;
    const bool pairs = cpu_isa() == CpuIsa::Avx512 && cpu_has_avx512_bf16();
    if (cpu_isa() == CpuIsa::Avx512 && cpu_has_amx_bf16() && amx_allowed() && amx_usable())
      return "loom blocked, AMX tiles 32x32";
    return copy + (pairs ? ", bf16 pairs by vdpbf16ps" : ", bf16 widened while packing");
  }
  k.threads = threads_for(k);
  if (dtype == DType::BF16 && !bf16_kernels_available()) {
    k.dtype = DType::F32;
    return std::string("bf16 widened to f32, ") + GemmCache::instance().get(k).pd.impl_info_str();
  }
  return GemmCache::instance().get(k).pd.impl_info_str();
}

}  // namespace loom::cpu
