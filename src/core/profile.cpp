#include "core/profile.h"

#include "core/tensor.h"

namespace loom::profile {
namespace {
thread_local Profile* g_active = nullptr;

std::vector<TensorInfo> describe(const TensorList& ts) {
  std::vector<TensorInfo> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) {
    if (!t.defined()) {
      out.push_back(TensorInfo{Shape{0}, DType::F32, false});
      continue;
    }
    out.push_back(TensorInfo{t.shape(), t.dtype(), t.requires_grad()});
  }
  return out;
}
}  // namespace

Profile* active() { return g_active; }

ProfileScope::ProfileScope(Profile& profile) : previous_(g_active) { g_active = &profile; }
ProfileScope::~ProfileScope() { g_active = previous_; }

void Profile::add_region(const std::string& name, double seconds) {
  for (auto& [n, s] : regions) {
    if (n == name) {
      s += seconds;
      return;
    }
  }
  regions.emplace_back(name, seconds);
}

int Profile::on_record(const char* name, const TensorList& inputs, const TensorList& outputs) {
  const double t = stamp();
  OpRecord r;
  r.name = name;
  r.forward_seconds = t - last_mark_;
  r.inputs = describe(inputs);
  r.outputs = describe(outputs);
  ops.push_back(std::move(r));
  last_mark_ = now();  // the bookkeeping above is not charged to the next op
  return static_cast<int>(ops.size()) - 1;
}

void Profile::on_backward(int index, double seconds) {
  if (index < 0 || index >= static_cast<int>(ops.size())) return;
  ops[static_cast<size_t>(index)].backward_seconds += seconds;
}

}  // namespace loom::profile
