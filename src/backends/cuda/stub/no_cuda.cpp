// The CUDA backend of a build without the CUDA toolkit: the device queries answer "no GPU", and
// everything that would touch a GPU throws an error saying so. Chosen by CMake (cmake/cuda.cmake)
// instead of the backend's sources, so nothing else in loom has an #ifdef.
#include "backends/cuda/activation.h"
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_chunked.h"
#include "backends/cuda/elementwise.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/graph.h"
#include "backends/cuda/loss.h"
#include "backends/cuda/mla.h"
#include "backends/cuda/moe.h"
#include "backends/cuda/moe_route.h"
#include "backends/cuda/norm.h"
#include "backends/cuda/optimizer.h"
#include "backends/cuda/rope.h"
#include "backends/cuda/softmax.h"
#include "backends/cuda/runtime.h"
#include "backends/cuda/shape.h"
#include "core/caching_allocator.h"

namespace loom::cuda {
namespace {
[[noreturn]] void not_built(const std::string& what) {
  LOOM_FAIL(what, ": this loom was built without the CUDA backend (no CUDA toolkit was found when it was "
                  "configured; install it and reconfigure with -DLOOM_CUDA=ON, see docs/cuda.md)");
}
}  // namespace

bool built() { return false; }
bool chunked_attention_enabled() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this loom was built without the CUDA backend"; }
std::string describe() { return "CUDA backend not built"; }
void check_device(const char* op, Device device) { not_built(str(op, ": cannot use ", device)); }
size_t total_memory(int index) { not_built(str("total_memory: cannot use ", Device::cuda(index))); }
Context& context(int index) { not_built(str("context of cuda:", index)); }
Allocator& device_allocator(int index) { not_built(str("allocator of cuda:", index)); }
CachingAllocator& caching_allocator(int index) { not_built(str("allocator of cuda:", index)); }
void copy(void*, Device, const void*, Device, size_t, const char* op) { not_built(op); }
void zero(void*, Device, size_t, const char* op) { not_built(op); }
void synchronize(Device, const char* op) { not_built(op); }

std::unique_ptr<StepCapture> make_graph_step_capture(int, StepCaptureOptions) { not_built("step capture"); }

// Kernels: unreachable in practice (no CUDA tensor can be made without the backend), but they must link.
void add_forward(const Context&, float*, const float*, const float*, int64_t) { not_built("add"); }
void add_forward(const Context&, bf16*, const bf16*, const bf16*, int64_t) { not_built("add"); }
void add_inplace(const Context&, float*, const float*, int64_t) { not_built("add_"); }
void mul_forward(const Context&, float*, const float*, const float*, int64_t) { not_built("mul"); }
void scale_forward(const Context&, float*, const float*, float, int64_t) { not_built("scale"); }
void sum_rows(const Context&, const float*, int64_t, int64_t, float*) { not_built("sum_rows"); }
void convert_f32_to_bf16(const Context&, bf16*, const float*, int64_t) { not_built("to(bf16)"); }
void convert_bf16_to_f32(const Context&, float*, const bf16*, int64_t) { not_built("to(f32)"); }
void rms_norm_forward(const Context&, float*, float*, const float*, const float*, int64_t, int64_t, float) {
  not_built("rms_norm");
}
void rms_norm_forward(const Context&, bf16*, float*, const bf16*, const float*, int64_t, int64_t, float) {
  not_built("rms_norm");
}
void rms_norm_backward(const Context&, float*, float*, const float*, const float*, const float*, const float*,
                       int64_t, int64_t) {
  not_built("rms_norm backward");
}
void rms_norm_backward(const Context&, bf16*, float*, const bf16*, const bf16*, const float*, const float*,
                       int64_t, int64_t) {
  not_built("rms_norm backward");
}
void add_rms_norm_forward(const Context&, float*, float*, float*, const float*, const float*, const float*, int64_t,
                          int64_t, float) {
  not_built("add_rms_norm");
}
void add_rms_norm_forward(const Context&, bf16*, bf16*, float*, const bf16*, const bf16*, const float*, int64_t,
                          int64_t, float) {
  not_built("add_rms_norm");
}
void add_rms_norm_backward(const Context&, float*, float*, const float*, const float*, const float*, const float*,
                           const float*, int64_t, int64_t) {
  not_built("add_rms_norm backward");
}
void add_rms_norm_backward(const Context&, bf16*, float*, const bf16*, const bf16*, const bf16*, const float*,
                           const float*, int64_t, int64_t) {
  not_built("add_rms_norm backward");
}
void layer_norm_forward(const Context&, float*, float*, float*, const float*, const float*, const float*, int64_t,
                        int64_t, float) {
  not_built("layer_norm");
}
void layer_norm_forward(const Context&, bf16*, float*, float*, const bf16*, const float*, const float*, int64_t,
                        int64_t, float) {
  not_built("layer_norm");
}
void layer_norm_backward(const Context&, float*, float*, float*, const float*, const float*, const float*,
                         const float*, const float*, int64_t, int64_t) {
  not_built("layer_norm backward");
}
void layer_norm_backward(const Context&, bf16*, float*, float*, const bf16*, const bf16*, const float*, const float*,
                         const float*, int64_t, int64_t) {
  not_built("layer_norm backward");
}
IdScan scan_ids(const Context&, const int32_t*, int64_t, int64_t, int64_t, const char* op) { not_built(op); }
void embedding_forward(const Context&, void*, const int32_t*, const void*, int64_t, int64_t, int64_t, int64_t) {
  not_built("embedding");
}
void embedding_backward(const Context&, float*, const int32_t*, const float*, int64_t, int64_t, int64_t) {
  not_built("embedding backward");
}
void rope_apply(const Context&, float*, const float*, const float*, const float*, int64_t, int64_t, int64_t, bool,
                bool, bool, int64_t) {
  not_built("rope");
}
void softmax_forward(const Context&, float*, const float*, int64_t, int64_t, int64_t) { not_built("softmax"); }
void softmax_backward(const Context&, float*, const float*, const float*, int64_t, int64_t, int64_t) {
  not_built("softmax backward");
}
void count_targets(const Context&, int64_t*, const int32_t*, int64_t, int32_t) { not_built("cross_entropy"); }
void cross_entropy_rows(const Context&, double*, float*, const float*, const int32_t*, int64_t, int64_t, int32_t,
                        const int64_t*, int64_t) {
  not_built("cross_entropy");
}
void mean_loss(const Context&, float*, const double*, int64_t, const int64_t*) { not_built("cross_entropy"); }
void scale_by(const Context&, float*, const float*, int64_t) { not_built("cross_entropy backward"); }
void adamw_update(const Context&, float*, const float*, float*, float*, int64_t, float, float, float, float, float,
                  double, double, bf16*) {
  not_built("AdamW");
}
void add_sum_of_squares(const Context&, double*, const float*, int64_t) { not_built("global_grad_norm"); }
void silu_forward(const Context&, float*, const float*, int64_t) { not_built("silu"); }
void silu_forward(const Context&, bf16*, const bf16*, int64_t) { not_built("silu"); }
void silu_backward(const Context&, float*, const float*, const float*, int64_t) { not_built("silu backward"); }
void silu_backward(const Context&, bf16*, const bf16*, const bf16*, int64_t) { not_built("silu backward"); }
void gelu_forward(const Context&, float*, const float*, int64_t, bool) { not_built("gelu"); }
void gelu_forward(const Context&, bf16*, const bf16*, int64_t, bool) { not_built("gelu"); }
void gelu_backward(const Context&, float*, const float*, const float*, int64_t, bool) { not_built("gelu backward"); }
void gelu_backward(const Context&, bf16*, const bf16*, const bf16*, int64_t, bool) { not_built("gelu backward"); }
void swiglu_forward(const Context&, float*, const float*, const float*, int64_t) { not_built("swiglu"); }
void swiglu_forward(const Context&, bf16*, const bf16*, const bf16*, int64_t) { not_built("swiglu"); }
void swiglu_backward(const Context&, float*, float*, const float*, const float*, const float*, int64_t) {
  not_built("swiglu backward");
}
void swiglu_backward(const Context&, bf16*, bf16*, const bf16*, const bf16*, const bf16*, int64_t) {
  not_built("swiglu backward");
}
void dropout_forward(const Context&, float*, const float*, int64_t, float, RngKey) { not_built("dropout"); }
void dropout_forward(const Context&, bf16*, const bf16*, int64_t, float, RngKey) { not_built("dropout"); }
void flash_attention_forward(const Context&, const AttentionProblem&, const float*, const float*, const float*,
                             float*, float*) {
  not_built("flash_attention");
}
void flash_attention_forward(const Context&, const AttentionProblem&, const bf16*, const bf16*, const bf16*,
                             bf16*, float*) {
  not_built("flash_attention");
}
void flash_attention_backward(const Context&, const AttentionProblem&, const float*, const float*, const float*,
                              const float*, const float*, const float*, float*, float*, float*) {
  not_built("flash_attention backward");
}
void flash_attention_backward(const Context&, const AttentionProblem&, const bf16*, const bf16*, const bf16*,
                              const bf16*, const bf16*, const float*, bf16*, bf16*, bf16*) {
  not_built("flash_attention backward");
}
template <typename T>
void moe_experts_forward(const Context&, const MoeDeviceDispatch&, const T*, const float*, const T*, const T*,
                         const T*, int64_t, int64_t, float*, float*, float*) {
  not_built("moe_experts");
}
template <typename T>
void moe_experts_backward(const Context&, const MoeDeviceDispatch&, const float*, const T*, const float*, const T*,
                          const T*, const T*, const float*, const float*, int64_t, int64_t, float*, float*, float*,
                          float*, float*) {
  not_built("moe_experts backward");
}
template void moe_experts_forward<float>(const Context&, const MoeDeviceDispatch&, const float*, const float*,
                                         const float*, const float*, const float*, int64_t, int64_t, float*, float*,
                                         float*);
template void moe_experts_forward<bf16>(const Context&, const MoeDeviceDispatch&, const bf16*, const float*,
                                        const bf16*, const bf16*, const bf16*, int64_t, int64_t, float*, float*, float*);
template void moe_experts_backward<float>(const Context&, const MoeDeviceDispatch&, const float*, const float*,
                                          const float*, const float*, const float*, const float*, const float*,
                                          const float*, int64_t, int64_t, float*, float*, float*, float*, float*);
template void moe_experts_backward<bf16>(const Context&, const MoeDeviceDispatch&, const float*, const bf16*,
                                         const float*, const bf16*, const bf16*, const bf16*, const float*, const float*,
                                         int64_t, int64_t, float*, float*, float*, float*, float*);
void gemm(const Context&, const GemmProblem&) { not_built("gemm"); }
void gemm(const Context&, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
          float, float*, int64_t, const float*, GemmEpilogue) {
  not_built("gemm");
}
void gemm_bf16(const Context&, bool, bool, int64_t, int64_t, int64_t, float, const bf16*, int64_t, const bf16*,
               int64_t, float, float*, int64_t, const float*, GemmEpilogue) {
  not_built("gemm");
}
void gemm_bf16(const Context&, bool, bool, int64_t, int64_t, int64_t, float, const bf16*, int64_t, const bf16*,
               int64_t, float, bf16*, int64_t, const float*, GemmEpilogue) {
  not_built("gemm");
}

// Shape copies (shape.h).
void copy_rows(const Context&, const void*, int64_t, int64_t, void*, int64_t, int64_t, int64_t, int64_t, int64_t, size_t,
               const char* op) {
  not_built(op);
}
void transpose_copy(const Context&, const void*, void*, int64_t, int64_t, int64_t, int64_t, int64_t, size_t) {
  not_built("transpose");
}

// MLA head layouts (mla.h).
void mla_query_heads(const Context&, const float*, float*, const float*, const float*, int64_t, int64_t, int64_t,
                     int64_t, int64_t, bool, bool backward) {
  not_built(backward ? "mla_query_heads backward" : "mla_query_heads");
}
void mla_key_value_heads_forward(const Context&, const float*, const float*, const float*, const float*, int64_t,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, bool, float*, float*) {
  not_built("mla_key_value_heads");
}
void mla_key_value_heads_backward(const Context&, const float*, const float*, const float*, const float*, int64_t,
                                  int64_t, int64_t, int64_t, int64_t, int64_t, bool, float*, float*) {
  not_built("mla_key_value_heads backward");
}

// MoE routing, balance loss, bias update (moe_route.h).
template <typename T>
void moe_route_forward(const Context&, const T*, const float*, int64_t, int64_t, int64_t, float, int32_t*, float*,
                       float*, int32_t*) {
  not_built("moe_route");
}
template <typename T>
void moe_route_backward(const Context&, T*, const float*, const float*, const float*, const int32_t*, int64_t, int64_t,
                        int64_t, float) {
  not_built("moe_route backward");
}
template void moe_route_forward<float>(const Context&, const float*, const float*, int64_t, int64_t, int64_t, float,
                                       int32_t*, float*, float*, int32_t*);
template void moe_route_forward<bf16>(const Context&, const bf16*, const float*, int64_t, int64_t, int64_t, float,
                                      int32_t*, float*, float*, int32_t*);
template void moe_route_backward<float>(const Context&, float*, const float*, const float*, const float*,
                                        const int32_t*, int64_t, int64_t, int64_t, float);
template void moe_route_backward<bf16>(const Context&, bf16*, const float*, const float*, const float*, const int32_t*,
                                       int64_t, int64_t, int64_t, float);
void moe_balance_loss_forward(const Context&, const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, float,
                              float*, float*, double*) {
  not_built("moe_sequence_balance_loss");
}
void moe_balance_loss_backward(const Context&, float*, const float*, const float*, const float*, int64_t, int64_t,
                               int64_t, float) {
  not_built("moe_sequence_balance_loss backward");
}
void moe_update_bias(const Context&, float*, const int32_t*, int64_t, float) { not_built("moe_update_bias_"); }

}  // namespace loom::cuda
