// Attention kernels: the run-time choice of instruction set. The kernels themselves (and the algorithm
// notes) are attention.inc, compiled once per instruction set (isa.h); see attention.h for the contract.
#include "backends/cpu/attention.h"

#include "backends/cpu/kernels.h"

namespace loom::cpu {

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
