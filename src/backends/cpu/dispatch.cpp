// The API functions of the kernel families compiled once per instruction set (activation.h,
// attention.h): each forwards to the copy cpu_isa() names (isa.h). The kernels are activation.inc and
// attention.inc, built by isa_scalar.cpp, isa_avx2.cpp and isa_avx512.cpp.
#include "backends/cpu/activation.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/kernels.h"

namespace loom::cpu {

// ---- activations, SwiGLU, dropout (activation.inc) ------------------------------------------------

void silu_forward(float* y, const float* x, int64_t n) { LOOM_CPU_DISPATCH(silu_forward, y, x, n); }
void silu_forward(bf16* y, const bf16* x, int64_t n) { LOOM_CPU_DISPATCH(silu_forward, y, x, n); }
void silu_backward(float* dx, const float* dy, const float* x, int64_t n) { LOOM_CPU_DISPATCH(silu_backward, dx, dy, x, n); }
void silu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n) { LOOM_CPU_DISPATCH(silu_backward, dx, dy, x, n); }

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_forward, y, x, n, tanh_approximation);
}
void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_forward, y, x, n, tanh_approximation);
}
void gelu_forward(bf16* y, const float* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_forward, y, x, n, tanh_approximation);
}
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_backward, dx, dy, x, n, tanh_approximation);
}
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_backward, dx, dy, x, n, tanh_approximation);
}

void swiglu_forward(float* y, const float* gate, const float* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_forward, y, gate, up, n);
}
void swiglu_forward(bf16* y, const bf16* gate, const bf16* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_forward, y, gate, up, n);
}
void swiglu_forward(bf16* y, const float* gate, const float* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_forward, y, gate, up, n);
}
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_backward, dgate, dup, dy, gate, up, n);
}
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_backward, dgate, dup, dy, gate, up, n);
}

void dropout_forward(float* y, const float* x, int64_t n, float p, RngKey key) {
  LOOM_CPU_DISPATCH(dropout_forward, y, x, n, p, key);
}
void dropout_forward(bf16* y, const bf16* x, int64_t n, float p, RngKey key) {
  LOOM_CPU_DISPATCH(dropout_forward, y, x, n, p, key);
}

// ---- attention (attention.inc) -----------------------------------------------------------------

bool flash_attention_uses_bf16(const AttentionProblem& p) {
  return p.bf16_products && cpu_isa() == CpuIsa::Avx512 && cpu_has_avx512_bf16();
}

void flash_attention_forward(const AttentionProblem& p, const float* q, const float* k, const float* v,
                             float* out, float* lse) {
  LOOM_CPU_DISPATCH(flash_attention_forward, p, q, k, v, out, lse);
}

void flash_attention_backward(const AttentionProblem& p, const float* q, const float* k, const float* v,
                              const float* out, const float* dout, const float* lse, float* dq, float* dk,
                              float* dv) {
  LOOM_CPU_DISPATCH(flash_attention_backward, p, q, k, v, out, dout, lse, dq, dk, dv);
}

void masked_attention_forward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,
                              const float* q, const float* k, const float* v, float* out, float* lse) {
  LOOM_CPU_DISPATCH(masked_attention_forward, p, mask, mask_head_stride, q, k, v, out, lse);
}

void masked_attention_backward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,
                               const float* q, const float* k, const float* v, const float* dout,
                               const float* lse, float* dq, float* dk, float* dv) {
  LOOM_CPU_DISPATCH(masked_attention_backward, p, mask, mask_head_stride, q, k, v, dout, lse, dq, dk, dv);
}

}  // namespace loom::cpu
