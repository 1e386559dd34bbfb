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
}  // namespace

LoraDropoutScope::LoraDropoutScope(std::optional<RngKey> key) : previous_(dropout_key) { dropout_key = key; }
LoraDropoutScope::~LoraDropoutScope() { dropout_key = previous_; }

LoRA::LoRA(const std::string& layer_, int64_t in, int64_t out, const LoraOptions& o, RngKey key)
    : layer(layer_),
      rank(checked(layer_, o, in, out).rank),
      alpha(o.alpha),
      scale(o.alpha / static_cast<float>(o.rank)),
      dropout(o.dropout),
      // PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / in) = 1/sqrt(in).
      A(add_parameter(make_parameter(join(layer_, "lora_A.weight"), {o.rank, in},
                                     Init::uniform(1.0f / std::sqrt(static_cast<float>(in))), key))),
      B(add_parameter(make_parameter(join(layer_, "lora_B.weight"), {out, o.rank}, Init::zeros(), key))) {}

Tensor LoRA::delta(const Tensor& x, ops::MatmulPrecision precision) const {
  Tensor in = x;
  if (dropout > 0 && dropout_key) in = ops::dropout(x, dropout, dropout_key->fold_in(layer));
  // scale applied to the [..., r] intermediate, the smallest tensor on the way.
  Tensor h = ops::scale(ops::linear(in, A.value, Tensor(), ops::WeightLayout::OutIn, precision), scale);
  return ops::linear(h, B.value, Tensor(), ops::WeightLayout::OutIn, precision);
}

Tensor LoRA::merged_delta() const {
  autograd::NoGradGuard no_grad;
  // [out, r] @ [r, in]
  return ops::scale(ops::matmul(B.value, A.value), scale);
}

}  // namespace loom::nn
