#include "models/model.h"

namespace loom::models {

void LanguageModel::load_parameter(const std::string& name, const Tensor& values) {
  nn::Parameter& p = parameter(name);
  LOOM_CHECK(values.shape() == p.value.shape(), "load_parameter: '", name, "' has shape ", p.value.shape(),
             " but the given values have shape ", values.shape());
  Tensor v = values.dtype() == p.value.dtype() ? values : values.to(p.value.dtype());
  p.value.copy_from(v);
}

void LanguageModel::load_state(const std::string& name, const Tensor& values) {
  std::string known;
  for (auto& [n, t] : state_tensors()) {
    if (n != name) {
      known += (known.empty() ? "" : ", ") + n;
      continue;
    }
    LOOM_CHECK(values.shape() == t.shape(), "load_state: '", name, "' has shape ", t.shape(),
               " but the given values have shape ", values.shape());
    Tensor v = values.dtype() == t.dtype() ? values : values.to(t.dtype());
    Tensor dst = t;
    dst.copy_from(v);
    return;
  }
  LOOM_FAIL("load_state: the model has no state tensor '", name, "' (it has: ", known.empty() ? "none" : known, ")");
}

int64_t LanguageModel::num_parameters() {
  int64_t n = 0;
  for (nn::Parameter* p : parameters()) n += p->value.numel();
  return n;
}

}  // namespace loom::models
