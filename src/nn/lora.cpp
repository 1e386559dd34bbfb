#include "nn/lora.h"

#include <cmath>

#include "core/autograd.h"
#include "ops/activation.h"
#include "ops/elementwise.h"

namespace loom::nn {

namespace {
thread_local std::optional<RngKey> dropout_key;

const LoraOptions& checked(const std::string& layer, const LoraOptions& o, int64_t in, int64_t out) {
  LOOM_CHECK(o.rank > 0 && o.rank <= std::min(in, out), layer, ": LoRA rank must be in [1, min(in, out) = ",
             std::min(in, out), "], got ", o.rank);
  LOOM_CHECK(std::isfinite(o.alpha) && o.alpha > 0, layer, ": LoRA alpha must be positive, got ", o.alpha);
  LOOM_CHECK(o.dropout >= 0 && o.dropout < 1, layer, ": LoRA dropout must be in [0, 1), got ", o.dropout);
  return o;
}

// [E, ...s] for an expert stack, s for one layer.
Shape stacked(int64_t experts, const Shape& s) {
  if (experts == 0) return s;
  Shape out{experts};
  for (int64_t d : s) out.push_back(d);
  return out;
}
}  // namespace

LoraDropoutScope::LoraDropoutScope(std::optional<RngKey> key) : previous_(dropout_key) { dropout_key = key; }
LoraDropoutScope::~LoraDropoutScope() { dropout_key = previous_; }

LoRA::LoRA(const std::string& layer_, int64_t in, int64_t out, const LoraOptions& o, RngKey key, int64_t experts_)
    : layer(layer_),
      rank(checked(layer_, o, in, out).rank),
      alpha(o.alpha),
      scale(o.alpha / static_cast<float>(o.rank)),
      dropout(o.dropout),
      experts(experts_),
      // PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / in) = 1/sqrt(in)
      // (per expert the same bound: fan_in is `in` for each expert's A).
      A(add_parameter(make_parameter(join(layer_, "lora_A.weight"), stacked(experts_, {o.rank, in}),
                                     Init::uniform(1.0f / std::sqrt(static_cast<float>(in))), key))),
      B(add_parameter(make_parameter(join(layer_, "lora_B.weight"), stacked(experts_, {out, o.rank}), Init::zeros(), key))) {
  LOOM_CHECK(experts_ >= 0, layer_, ": expert count must not be negative, got ", experts_);
  // Folding the adapters into the experts' weights (adapted()) multiplies every token by W + s B A: a
  // dropout mask on the adapter's input alone has no such form.
  LOOM_CHECK(experts_ == 0 || o.dropout == 0, layer_, ": LoRA dropout on routed experts is not supported (their "
             "adapters are folded into the experts' weights); set lora.dropout=0 or leave the experts out of the targets, "
             "got dropout ", o.dropout);
}

Tensor LoRA::adapted(const Tensor& w) const {
  LOOM_CHECK(experts > 0, layer, ": adapted() is for an expert stack; a layer adds delta(x)");
  LOOM_CHECK(w.shape() == (Shape{experts, B.value.size(1), A.value.size(2)}), layer, ": expert weights ", w.describe(),
             " do not match the adapters' [", experts, ", ", B.value.size(1), ", ", A.value.size(2), "]");
  // [E, out, r] @ [E, r, in], scaled after the product (merged_delta's order, so merging gives these bits).
  return ops::add(w, ops::scale(ops::matmul(B.value, A.value), scale));
}

Tensor LoRA::delta(const Tensor& x, ops::MatmulPrecision precision) const {
  LOOM_CHECK(experts == 0, layer, ": an expert stack's adapters act through adapted(weights), not delta(x)");
  Tensor in = x;
  if (dropout > 0 && dropout_key) in = ops::dropout(x, dropout, dropout_key->fold_in(layer));
  // scale applied to the [..., r] intermediate, the smallest tensor on the way.
  Tensor h = ops::scale(ops::linear(in, A.value, Tensor(), ops::WeightLayout::OutIn, precision), scale);
  return ops::linear(h, B.value, Tensor(), ops::WeightLayout::OutIn, precision);
}

Tensor LoRA::delta(const Tensor& x, ops::MatmulPrecision precision, std::function<Tensor()> recompute_x) const {
  if ((dropout > 0 && dropout_key) || precision != ops::MatmulPrecision::F32 || x.dtype() != DType::F32 || experts != 0)
    return delta(x, precision);
  // delta(x)'s two GEMMs and scale in its order; only A's GEMM keeps recompute_x instead of x.
  Tensor h = ops::scale(ops::linear_recomputed_input(x, A.value, std::move(recompute_x)), scale);
  return ops::linear(h, B.value, Tensor(), ops::WeightLayout::OutIn, precision);
}

Tensor LoRA::merged_delta() const {
  autograd::NoGradGuard no_grad;
  // [out, r] @ [r, in]
  return ops::scale(ops::matmul(B.value, A.value), scale);
}

}  // namespace loom::nn
