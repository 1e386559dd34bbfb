// The per-instruction-set copies of the CPU kernels (isa.h), declared once for each copy, and the
// switch that calls the one cpu_isa() names. Internal to src/backends/cpu: the families' own headers
// (activation.h, attention.h) are the API; their .cpp files forward to these.
//
// Each copy lives in namespace loom::cpu::isa_<name> and has the same signature as the API function
// it implements (activation.inc, attention.inc define them).
#pragma once

#include <cstdint>

#include "backends/cpu/activation.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/isa.h"
#include "core/dtype.h"
#include "core/rng.h"

#define LOOM_CPU_KERNEL_DECLARATIONS                                                                         \
  void silu_forward(float* y, const float* x, int64_t n);                                                    \
  void silu_forward(bf16* y, const bf16* x, int64_t n);                                                      \
  void silu_backward(float* dx, const float* dy, const float* x, int64_t n);                                 \
  void silu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n);                                    \
  void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approximation);                           \
  void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_approximation);                             \
  void gelu_forward(bf16* y, const float* x, int64_t n, bool tanh_approximation);                            \
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation);        \
  void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation);           \
  void swiglu_forward(float* y, const float* gate, const float* up, int64_t n);                              \
  void swiglu_forward(bf16* y, const bf16* gate, const bf16* up, int64_t n);                                 \
  void swiglu_forward(bf16* y, const float* gate, const float* up, int64_t n);                               \
  void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up,         \
                       int64_t n);                                                                           \
  void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up, int64_t n); \
  void dropout_forward(float* y, const float* x, int64_t n, float p, RngKey key);                            \
  void dropout_forward(bf16* y, const bf16* x, int64_t n, float p, RngKey key);                              \
  void flash_attention_forward(const AttentionProblem& p, const float* q, const float* k, const float* v,     \
                               float* out, float* lse);                                                      \
  void flash_attention_backward(const AttentionProblem& p, const float* q, const float* k, const float* v,    \
                                const float* out, const float* dout, const float* lse, float* dq, float* dk, \
                                float* dv);                                                                  \
  void masked_attention_forward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,        \
                                const float* q, const float* k, const float* v, float* out, float* lse);      \
  void masked_attention_backward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,       \
                                 const float* q, const float* k, const float* v, const float* dout,          \
                                 const float* lse, float* dq, float* dk, float* dv);

namespace loom::cpu {
namespace isa_scalar {
LOOM_CPU_KERNEL_DECLARATIONS
}  // namespace isa_scalar
namespace isa_avx2 {
LOOM_CPU_KERNEL_DECLARATIONS
}  // namespace isa_avx2
namespace isa_avx512 {
LOOM_CPU_KERNEL_DECLARATIONS
}  // namespace isa_avx512
}  // namespace loom::cpu

#undef LOOM_CPU_KERNEL_DECLARATIONS

// `return` the call of the copy of `fn` that cpu_isa() names (inside namespace loom::cpu).
#define LOOM_CPU_DISPATCH(fn, ...)                                  \
  switch (::loom::cpu::cpu_isa()) {                                 \
    case ::loom::cpu::CpuIsa::Avx512: return isa_avx512::fn(__VA_ARGS__); \
    case ::loom::cpu::CpuIsa::Avx2: return isa_avx2::fn(__VA_ARGS__);     \
    case ::loom::cpu::CpuIsa::Scalar: break;                        \
  }                                                                 \
  return isa_scalar::fn(__VA_ARGS__)
