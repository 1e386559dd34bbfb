// How a tensor is laid out over the device mesh.
//
// The mesh has named axes (data, tensor, expert). A PartitionSpec says, for each dimension of a
// parameter, which mesh axes (if any) split it: `{tensor, None}` is a column-parallel weight [out, in]
// split along out. A dimension may be split over several axes at once, folded into one, as JAX's
// P(('data', 'expert')) and torchtitan's dp_shard: `(None, (data, expert))` cuts `in` into data x expert
// blocks, one per rank of the data x expert grid (block d * expert + e: the axes outermost first). Model
// code states specs; the modes differ only in the specs they assign.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom::dist {

// Pipe cuts the layers into stages (parallel/pipeline.h); no partition spec names it.
enum class MeshAxis { Data, Tensor, Expert, Pipe };

inline const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::Data: return "data";
    case MeshAxis::Tensor: return "tensor";
    case MeshAxis::Expert: return "expert";
    case MeshAxis::Pipe: return "pipe";
  }
  return "?";
}

// The mesh axes that split one dimension, outermost first: none (the dimension is whole on every rank),
// one, or several folded into one. There is deliberately no `== MeshAxis`: "split over data" means
// has(Data) for a folded dimension too, and each caller must say which question it asks.
struct DimSplit {
  std::vector<MeshAxis> axes;

  DimSplit() = default;
  DimSplit(std::nullopt_t) {}  // NOLINT: reads like JAX's None in spec tables
  DimSplit(MeshAxis a) : axes{a} {}  // NOLINT
  static DimSplit folded(std::vector<MeshAxis> outer_first) {
    DimSplit s;
    s.axes = std::move(outer_first);
    return s;
  }

  explicit operator bool() const { return !axes.empty(); }
  bool has(MeshAxis a) const {
    for (MeshAxis x : axes) {
      if (x == a) return true;
    }
    return false;
  }
  bool operator==(const DimSplit& o) const { return axes == o.axes; }
  bool operator!=(const DimSplit& o) const { return axes != o.axes; }
  // "None", "data", "(data, expert)".
  std::string str() const {
    if (axes.empty()) return "None";
    if (axes.size() == 1) return mesh_axis_name(axes[0]);
    std::string s = "(";
    for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + std::string(mesh_axis_name(axes[i]));
    return s + ")";
  }
};

struct PartitionSpec {
  std::vector<DimSplit> dims;  // empty: replicated everywhere

  static PartitionSpec replicated() { return {}; }
  bool is_replicated() const {
    for (const auto& d : dims) {
      if (d) return false;
    }
    return true;
  }
  // Whether any dimension is split over `axis` (alone or folded with others).
  bool splits_over(MeshAxis axis) const {
    for (const auto& d : dims) {
      if (d.has(axis)) return true;
    }
    return false;
  }
  // "(None, (data, expert))".
  std::string str() const {
    std::string s = "(";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].str();
    return s + ")";
  }
};

// What a parameter is, for sharding (the mesh maps each group to a partition spec per parallel mode, as
// in the JAX-LM design's table, mesh/mesh.h) and for reports. nn::Parameter carries one.
enum class ParamGroup {
  DenseIn,    // a Linear that widens or reads the residual stream: q, k, v, w1, w3, fc
  DenseOut,   // a Linear that writes back to the residual stream: output_proj, w2, proj
  Embedding,  // the token embedding table
  LmHead,     // an untied output head
  Norm,       // norm gains (and their biases)
  Bias,       // Linear biases
  Position,   // learned position embeddings
  DenseInWhole,  // a Linear whose output is read whole (normed, or the residual stream): MLA's wq_a and
                 // wkv_a, a MoE router, MTP's proj; tensor parallelism keeps it whole (mesh/mesh.h)
  ExpertIn,   // routed experts' w1, w3 [E, F, C]
  ExpertOut,  // routed experts' w2 [E, C, F]
};
const char* param_group_name(ParamGroup group);

}  // namespace loom::dist
