#include "models/model.h"

#include <cstring>

namespace loom::models {

Tensor LanguageModel::decode_last(const Tensor& ids, DecodeCache& cache) const {
  Tensor all = decode(ids, cache);  // [B, t, V]
  const int64_t B = all.size(0), t = all.size(1), V = all.size(2);
  Tensor last = Tensor::empty({B, 1, V}, all.dtype());
  const size_t row = static_cast<size_t>(V) * dtype_size(all.dtype());
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(static_cast<char*>(last.raw_data()) + b * row, static_cast<const char*>(all.raw_data()) + ((b * t) + t - 1) * row, row);
  }
  return last;
}

void LanguageModel::load_parameter(const std::string& name, const Tensor& values) {
  nn::Parameter& p = parameter(name);
  LOOM_CHECK(values.shape() == p.value.shape(), "load_parameter: '", name, "' has shape ", p.value.shape(),
             " but the given values have shape ", values.shape());
  Tensor v = values.dtype() == p.value.dtype() ? values : values.to(p.value.dtype());
  p.value.copy_from(v);
}

int64_t LanguageModel::num_parameters() {
  int64_t n = 0;
  for (nn::Parameter* p : parameters()) n += p->value.numel();
  return n;
}

}  // namespace loom::models
