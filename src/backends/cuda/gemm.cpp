// cuBLASLt GEMMs (gemm.h), checked against the CPU on an H200 (docs/cuda.md).
//
// cuBLASLt is loaded with dlopen at the first GEMM, not linked: libcublasLt.so is ~540 MB, and linking
// it made every loom program (the CLI, every test) map and relocate it at start-up (220 MB of RSS for
// `loom version`, against 10 MB), GPU or not. The entry points below are the library's own, by name.
#include "backends/cuda/gemm.h"

#include <dlfcn.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "backends/cuda/check.h"

namespace loom::cuda {
namespace {

struct LtApi {
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute = nullptr;
};

// The library CMake found (LOOM_CUBLASLT_LIBRARY), else the soname on the loader's path.
const LtApi& lt() {
  static LtApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {LOOM_CUBLASLT_LIBRARY, "libcublasLt.so.13", "libcublasLt.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* why = dlerror();
      tried += str(tried.empty() ? "" : "; ", name, ": ", why != nullptr ? why : "not found");
    }
    if (lib == nullptr) {
      error = str("gemm: cannot load cuBLASLt (", tried, ")");
      return;
    }
    auto load = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr && error.empty()) error = str("gemm: cuBLASLt has no ", symbol);
    };
    load(api.Create, "cublasLtCreate");
    load(api.Matmul, "cublasLtMatmul");
    load(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    load(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
    load(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    load(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    load(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    load(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    load(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    load(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    load(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    load(api.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  });
  LOOM_CHECK(error.empty(), error);
  return api;
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kMaxDevices = 64;

struct Plan;
struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mutex;                                        // guards plans (and the handle's workspace)
  std::unordered_map<std::string, std::shared_ptr<Plan>> plans;  // by plan_key
};

// One per device, made on first use and kept for the process (like the device's context).
LtState& lt_state(const Context& ctx) {
  static std::mutex mutex;
  static auto* states = new std::array<std::unique_ptr<LtState>, kMaxDevices>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& s = (*states)[static_cast<size_t>(ctx.index)];
  if (!s) {
    auto made = std::make_unique<LtState>();
    DeviceGuard guard(ctx.index, "gemm");
    LOOM_CUBLAS_CHECK("gemm", lt().Create(&made->handle));
    made->workspace = device_allocator(ctx.index).allocate(kWorkspaceBytes);
    s = std::move(made);
  }
  return *s;
}

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Owns the descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) lt().MatmulPreferenceDestroy(pref);
    if (c) lt().MatrixLayoutDestroy(c);
    if (b) lt().MatrixLayoutDestroy(b);
    if (a) lt().MatrixLayoutDestroy(a);
    if (op) lt().MatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride) {
  if (batch == 1) return;
  int32_t count = static_cast<int32_t>(batch);
  LOOM_CUBLAS_CHECK("gemm", lt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                              sizeof(count)));
  LOOM_CUBLAS_CHECK("gemm", lt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                              &stride, sizeof(stride)));
}

void validate(const GemmProblem& p) {
  LOOM_CHECK(p.M >= 0 && p.N >= 0 && p.K >= 0, "gemm: sizes must be >= 0, got M=", p.M, " N=", p.N, " K=", p.K);
  LOOM_CHECK(p.input == DType::F32 || p.input == DType::BF16, "gemm: inputs must be f32 or bf16, got ", p.input);
  LOOM_CHECK(p.output == DType::F32 || (p.output == DType::BF16 && p.input == DType::BF16),
             "gemm: output must be f32, or bf16 with bf16 inputs; got ", p.input, " inputs and ", p.output,
             " output");
  LOOM_CHECK(p.lda >= (p.trans_a ? p.M : p.K) && p.ldb >= (p.trans_b ? p.K : p.N) && p.ldc >= p.N,
             "gemm: leading dimensions too small: lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc, " for M=", p.M,
             " N=", p.N, " K=", p.K, " trans_a=", p.trans_a, " trans_b=", p.trans_b);
  LOOM_CHECK(p.epilogue == GemmEpilogue::None || p.bias != nullptr, "gemm: a bias epilogue needs a bias");
  LOOM_CHECK(p.batch >= 1, "gemm: batch must be >= 1, got ", p.batch);
  const int64_t limit = 0x7fffffff;
  LOOM_CHECK(p.M <= limit && p.N <= limit && p.K <= limit && p.batch <= limit,
             "gemm: sizes beyond cuBLASLt's 32-bit limits: M=", p.M, " N=", p.N, " K=", p.K, " batch=", p.batch);
}

// A cached plan: the descriptors and the algorithm cuBLASLt's heuristic chose for one problem's shape,
// layouts, types, epilogue and operand alignments. Made once per shape (a training step repeats its
// shapes every step), so a call costs one cublasLtMatmul instead of eleven descriptor calls and a
// heuristic query, which cost more host time than the GPU spends on a small GEMM.
struct Plan {
  Descriptors d;
  cublasLtMatmulAlgo_t algo{};
};

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing a pointer: the heuristic
// must be told the operands' real alignment, or it may pick a kernel that needs 256-byte-aligned ones
// (attention's GEMMs start at a head's or a row's offset inside a tensor).
uint32_t alignment_of(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

std::unique_ptr<Plan> make_plan(const LtState& state, const GemmProblem& p, uint32_t align_a, uint32_t align_b,
                                uint32_t align_c) {
  auto plan = std::make_unique<Plan>();
  Descriptors& d = plan->d;
  // Column-major view: D^T[N,M] = opB'(B^T) @ opA'(A^T); cuBLASLt's "A" is our B and its "B" our A.
  const cublasOperation_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (p.epilogue != GemmEpilogue::None) {
    const cublasLtEpilogue_t epi =
        p.epilogue == GemmEpilogue::Bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias,
                                                              sizeof(p.bias)));
    const cudaDataType_t bias_type = CUDA_R_32F;  // loom keeps biases in f32
    LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                              sizeof(bias_type)));
    if (p.batch > 1) {
      const int64_t bias_stride = 0;  // one bias for every batch
      LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                                &bias_stride, sizeof(bias_stride)));
    }
  }
  const cudaDataType_t in = cuda_type(p.input), out = cuda_type(p.output);
  // Stored (pre-op) shapes, column-major: our row-major X[r, c] with ld is column-major [c, r] with ld.
  LOOM_CUBLAS_CHECK("gemm", lt().MatrixLayoutCreate(&d.a, in, p.trans_b ? p.K : p.N, p.trans_b ? p.N : p.K, p.ldb));
  LOOM_CUBLAS_CHECK("gemm", lt().MatrixLayoutCreate(&d.b, in, p.trans_a ? p.M : p.K, p.trans_a ? p.K : p.M, p.lda));
  LOOM_CUBLAS_CHECK("gemm", lt().MatrixLayoutCreate(&d.c, out, p.N, p.M, p.ldc));
  set_batch(d.a, p.batch, p.stride_b);
  set_batch(d.b, p.batch, p.stride_a);
  set_batch(d.c, p.batch, p.stride_c);

  LOOM_CUBLAS_CHECK("gemm", lt().MatmulPreferenceCreate(&d.pref));
  LOOM_CUBLAS_CHECK("gemm", lt().MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                  &kWorkspaceBytes, sizeof(kWorkspaceBytes)));
  // cuBLASLt's A is our B (and its B our A).
  for (auto [attribute, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}}) {
    LOOM_CUBLAS_CHECK("gemm", lt().MatmulPreferenceSetAttribute(d.pref, attribute, &align, sizeof(align)));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LOOM_CUBLAS_CHECK("gemm", lt().MatmulAlgoGetHeuristic(state.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1,
                                                            &heuristic, &found));
  LOOM_CHECK(found > 0, "gemm: cuBLASLt has no algorithm for M=", p.M, " N=", p.N, " K=", p.K, " (", p.input,
             " -> ", p.output, ", trans_a=", p.trans_a, " trans_b=", p.trans_b, ", epilogue ",
             static_cast<int>(p.epilogue), ")");
  plan->algo = heuristic.algo;
  return plan;
}

// Everything a plan depends on, as one string of numbers (the map is per device, touched under its lock).
std::string plan_key(const GemmProblem& p, uint32_t align_a, uint32_t align_b, uint32_t align_c) {
  return str(p.trans_a, p.trans_b, ' ', p.M, ' ', p.N, ' ', p.K, ' ', p.lda, ' ', p.ldb, ' ', p.ldc, ' ',
             static_cast<int>(p.input), static_cast<int>(p.output), static_cast<int>(p.epilogue), ' ', p.batch, ' ',
             p.stride_a, ' ', p.stride_b, ' ', p.stride_c, ' ', align_a, ' ', align_b, ' ', align_c);
}

}  // namespace

void gemm(const Context& ctx, const GemmProblem& p) {
  validate(p);
  if (p.M == 0 || p.N == 0) return;
  DeviceGuard guard(ctx.index, "gemm");
  LtState& state = lt_state(ctx);
  const uint32_t align_a = alignment_of(p.A), align_b = alignment_of(p.B), align_c = alignment_of(p.C);
  std::lock_guard<std::mutex> lock(state.mutex);
  const std::string key = plan_key(p, align_a, align_b, align_c);
  auto it = state.plans.find(key);
  if (it == state.plans.end()) {
    if (state.plans.size() >= 4096) state.plans.clear();  // a bound for programs whose shapes never repeat
    it = state.plans.emplace(key, std::shared_ptr<Plan>(make_plan(state, p, align_a, align_b, align_c))).first;
  }
  Plan& plan = *it->second;
  if (p.epilogue != GemmEpilogue::None) {  // the bias is the one pointer the descriptors hold
    LOOM_CUBLAS_CHECK("gemm", lt().MatmulDescSetAttribute(plan.d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias,
                                                              sizeof(p.bias)));
  }
  LOOM_CUBLAS_CHECK("gemm", lt().Matmul(state.handle, plan.d.op, &p.alpha, p.B, plan.d.a, p.A, plan.d.b, &p.beta,
                                            p.C, plan.d.c, p.C, plan.d.c, &plan.algo, state.workspace,
                                            kWorkspaceBytes, ctx.stream));
}

void gemm(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          const float* bias, GemmEpilogue epilogue) {
  gemm(ctx, GemmProblem{trans_a, trans_b, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, DType::F32, DType::F32,
                        bias, epilogue});
}

void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc,
               const float* bias, GemmEpilogue epilogue) {
  gemm(ctx, GemmProblem{trans_a, trans_b, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, DType::BF16, DType::F32,
                        bias, epilogue});
}

void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc,
               const float* bias, GemmEpilogue epilogue) {
  gemm(ctx, GemmProblem{trans_a, trans_b, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, DType::BF16, DType::BF16,
                        bias, epilogue});
}

}  // namespace loom::cuda
