// How a tensor is laid out over the device mesh.
//
// The mesh has named axes (data, tensor, and later expert). A PartitionSpec says, for each dimension of
// a parameter, which mesh axis (if any) splits it: `{Tensor, None}` is a column-parallel weight
// [out, in] split along out. Model code states specs; the dp/fsdp/tp/fsdp_tp modes differ only in the
// specs they assign. Until the distributed runtime lands every spec is replicated.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom::dist {

enum class MeshAxis { Data, Tensor, Expert };

inline const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::Data: return "data";
    case MeshAxis::Tensor: return "tensor";
    case MeshAxis::Expert: return "expert";
  }
  return "?";
}

struct PartitionSpec {
  std::vector<std::optional<MeshAxis>> dims;  // empty: replicated everywhere

  static PartitionSpec replicated() { return {}; }
  bool is_replicated() const {
    for (const auto& d : dims) {
      if (d) return false;
    }
    return true;
  }
  std::string str() const {
    std::string s = "(";
    for (size_t i = 0; i < dims.size(); ++i) {
      s += (i ? ", " : "") + std::string(dims[i] ? mesh_axis_name(*dims[i]) : "None");
    }
    return s + ")";
  }
};

}  // namespace loom::dist
