#include "mesh/mesh.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"

namespace loom::dist {

const char* param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::DenseIn: return "dense_in";
    case ParamGroup::DenseOut: return "dense_out";
    case ParamGroup::Embedding: return "embedding";
    case ParamGroup::LmHead: return "lm_head";
    case ParamGroup::Norm: return "norm";
    case ParamGroup::Bias: return "bias";
    case ParamGroup::Position: return "position";
    case ParamGroup::DenseInWhole: return "dense_in_whole";
    case ParamGroup::ExpertIn: return "expert_in";
    case ParamGroup::ExpertOut: return "expert_out";
  }
  return "?";
}


namespace {
constexpr MeshAxis kData = MeshAxis::Data;
constexpr MeshAxis kTensor = MeshAxis::Tensor;

PartitionSpec spec(std::initializer_list<DimSplit> dims) { return PartitionSpec{std::vector<DimSplit>(dims)}; }

constexpr MeshAxis kExpert = MeshAxis::Expert;

// Whether the mode splits weights over the axis.
bool uses_axis(ParallelMode mode, MeshAxis axis) {
  if (axis == kData) return mode == ParallelMode::Fsdp || mode == ParallelMode::FsdpTp || mode == ParallelMode::FsdpEp;
  if (axis == kTensor) return mode == ParallelMode::Tp || mode == ParallelMode::FsdpTp;
  return is_expert_mode(mode);
}

constexpr ParallelMode kModes[] = {ParallelMode::Dp,     ParallelMode::Fsdp, ParallelMode::Tp,
                                   ParallelMode::FsdpTp, ParallelMode::DpEp, ParallelMode::FsdpEp};

int64_t parse_axis_size(const std::string& text, const std::string& part) {
  const std::string value = part.substr(part.find('=') + 1);
  int64_t n = 0;
  size_t used = 0;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LOOM_CHECK(used == value.size() && !value.empty() && n >= 1, "mesh \"", text, "\": ", part,
             " needs a positive integer size");
  return n;
}
}  // namespace

const char* parallel_mode_name(ParallelMode mode) {
  switch (mode) {
    case ParallelMode::Dp: return "dp";
    case ParallelMode::Fsdp: return "fsdp";
    case ParallelMode::Tp: return "tp";
    case ParallelMode::FsdpTp: return "fsdp_tp";
    case ParallelMode::DpEp: return "dp_ep";
    case ParallelMode::FsdpEp: return "fsdp_ep";
  }
  return "?";
}

bool is_expert_mode(ParallelMode mode) { return mode == ParallelMode::DpEp || mode == ParallelMode::FsdpEp; }

std::vector<MeshAxis> batch_axes(ParallelMode mode) {
  if (mode == ParallelMode::Tp) return {};
  if (is_expert_mode(mode)) return {kData, kExpert};
  return {kData};
}

int64_t batch_slices(const Mesh& mesh, ParallelMode mode) {
  int64_t n = 1;
  for (MeshAxis a : batch_axes(mode)) n *= mesh.axis_size(a);
  return n;
}

ParallelMode parallel_mode_from_name(const std::string& name) {
  for (ParallelMode m : kModes) {
    if (name == parallel_mode_name(m)) return m;
  }
  LOOM_FAIL("unknown parallel mode \"", name, "\": expected one of dp, fsdp, tp, fsdp_tp, dp_ep, fsdp_ep");
}

Mesh Mesh::parse(const std::string& text) {
  Mesh m;
  bool seen_data = false, seen_tensor = false, seen_expert = false, seen_pipe = false;
  std::stringstream ss(text);
  std::string part;
  int parts = 0;
  while (std::getline(ss, part, ',')) {
    ++parts;
    const auto eq = part.find('=');
    const std::string axis = eq == std::string::npos ? part : part.substr(0, eq);
    LOOM_CHECK(eq != std::string::npos, "mesh \"", text, "\": expected axis=size pairs like data=4,tensor=2, got \"",
               part, "\"");
    if (axis == "data") {
      LOOM_CHECK(!seen_data, "mesh \"", text, "\" names the data axis twice");
      seen_data = true;
      m.data = parse_axis_size(text, part);
    } else if (axis == "tensor") {
      LOOM_CHECK(!seen_tensor, "mesh \"", text, "\" names the tensor axis twice");
      seen_tensor = true;
      m.tensor = parse_axis_size(text, part);
    } else if (axis == "expert") {
      LOOM_CHECK(!seen_expert, "mesh \"", text, "\" names the expert axis twice");
      seen_expert = true;
      m.expert = parse_axis_size(text, part);
    } else if (axis == "pipe") {
      LOOM_CHECK(!seen_pipe, "mesh \"", text, "\" names the pipe axis twice");
      seen_pipe = true;
      m.pipe = parse_axis_size(text, part);
    } else {
      LOOM_FAIL("mesh \"", text, "\": unknown axis \"", axis, "\" (the mesh axes are data, tensor, expert and pipe)");
    }
  }
  LOOM_CHECK(parts > 0, "mesh is empty: expected axis=size pairs like data=4,tensor=2");
  return m;
}

std::string Mesh::str() const {
  std::string s = "data=" + std::to_string(data) + ",tensor=" + std::to_string(tensor);
  if (expert > 1) s += ",expert=" + std::to_string(expert);
  return pipe > 1 ? s + ",pipe=" + std::to_string(pipe) : s;
}

int64_t Mesh::axis_size(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::Data: return data;
    case MeshAxis::Tensor: return tensor;
    case MeshAxis::Expert: return expert;
    case MeshAxis::Pipe: return pipe;
  }
  return 1;
}

int64_t Mesh::coord(int64_t rank, MeshAxis axis) const {
  LOOM_ASSERT(rank >= 0 && rank < size(), "rank ", rank, " outside mesh ", str());
  switch (axis) {
    case MeshAxis::Data: return (rank / (tensor * expert)) % data;
    case MeshAxis::Tensor: return rank % tensor;
    case MeshAxis::Expert: return (rank / tensor) % expert;
    case MeshAxis::Pipe: return rank / (tensor * expert * data);
  }
  return 0;
}

std::vector<int> Mesh::group(int64_t rank, MeshAxis axis) const { return group(rank, std::vector<MeshAxis>{axis}); }

int64_t Mesh::split_size(const DimSplit& split) const {
  int64_t n = 1;
  for (MeshAxis a : split.axes) n *= axis_size(a);
  return n;
}

int64_t Mesh::split_coord(int64_t rank, const DimSplit& split) const {
  int64_t c = 0;
  for (MeshAxis a : split.axes) c = c * axis_size(a) + coord(rank, a);
  return c;
}

std::vector<int> Mesh::split_group(int64_t rank, const DimSplit& split) const {
  std::vector<int> ranks = group(rank, split.axes);
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return split_coord(a, split) < split_coord(b, split); });
  return ranks;
}

std::vector<int> Mesh::group(int64_t rank, const std::vector<MeshAxis>& axes) const {
  auto free = [&](MeshAxis a) { return std::find(axes.begin(), axes.end(), a) != axes.end(); };
  std::vector<int> ranks;
  for (int64_t r = 0; r < size(); ++r) {
    bool same = true;
    for (MeshAxis a : {kData, kTensor, kExpert, MeshAxis::Pipe}) same = same && (free(a) || coord(r, a) == coord(rank, a));
    if (same) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

void validate_mesh_for_mode(const Mesh& mesh, ParallelMode mode) {
  LOOM_CHECK(mesh.data >= 1 && mesh.tensor >= 1 && mesh.expert >= 1 && mesh.pipe >= 1, "mesh ", mesh.str(),
             ": axis sizes must be positive");
  const char* name = parallel_mode_name(mode);
  LOOM_CHECK(is_expert_mode(mode) || mesh.expert == 1, "parallel mode ", name, " needs expert=1, but the mesh is ",
             mesh.str(), " (the expert axis is used by dp_ep and fsdp_ep)");
  switch (mode) {
    case ParallelMode::DpEp:
    case ParallelMode::FsdpEp:
      LOOM_CHECK(mesh.tensor == 1 && mesh.expert > 1, "parallel mode ", name,
                 " needs tensor=1 and expert > 1, but the mesh is ", mesh.str(), " (e.g. --mesh data=2,expert=4)");
      break;
    case ParallelMode::Dp:
    case ParallelMode::Fsdp:
      LOOM_CHECK(mesh.tensor == 1, "parallel mode ", name, " needs tensor=1, but the mesh is ", mesh.str(),
                 " (use tp or fsdp_tp to split over the tensor axis)");
      break;
    case ParallelMode::Tp:
      LOOM_CHECK(mesh.data == 1, "parallel mode tp needs data=1, but the mesh is ", mesh.str(),
                 " (use fsdp_tp to also split over the data axis)");
      break;
    case ParallelMode::FsdpTp:
      LOOM_CHECK(mesh.data > 1 && mesh.tensor > 1, "parallel mode fsdp_tp needs data > 1 and tensor > 1, but the mesh is ",
                 mesh.str(), " (use fsdp or tp for a one-axis mesh)");
      break;
  }
}

void validate_mesh_for_ranks(const Mesh& mesh, int64_t ranks, const std::string& launcher) {
  LOOM_CHECK(mesh.size() <= ranks, "mesh ", mesh.str(), " needs ", mesh.size(), " ranks, but ", launcher, " started only ",
             ranks, " (start ", mesh.size(), " ranks, e.g. mpirun -np ", mesh.size(), ", or use a smaller mesh)");
  LOOM_CHECK(mesh.size() == ranks, "mesh ", mesh.str(), " uses ", mesh.size(), " ranks, but ", launcher, " started ", ranks,
             " (the mesh size must equal the number of ranks)");
}

PartitionSpec spec_for(ParamGroup group, ParallelMode mode, int ndim) {
  const bool data = uses_axis(mode, kData), tensor = uses_axis(mode, kTensor);
  // FSDP's split of the dense weights: over the ranks that split the batch, so under fsdp_ep over data
  // with the expert axis folded in (torchtitan's dp_shard); the routed experts, split over expert already,
  // take data alone on another dimension.
  const DimSplit d = !data ? DimSplit() : mode == ParallelMode::FsdpEp ? DimSplit::folded({kData, kExpert}) : DimSplit(kData);
  const DimSplit d_expert = data ? DimSplit(kData) : DimSplit();
  const DimSplit t = tensor ? DimSplit(kTensor) : DimSplit();
  switch (group) {
    case ParamGroup::DenseIn:  // [out, in]: tensor splits out (column parallel), data splits in
      LOOM_ASSERT(ndim == 2, "a dense_in parameter must be 2-D, got ", ndim, " dims");
      return spec({t, d});
    case ParamGroup::DenseOut:  // [out, in]: data splits out, tensor splits in (row parallel)
      LOOM_ASSERT(ndim == 2, "a dense_out parameter must be 2-D, got ", ndim, " dims");
      return spec({d, t});
    case ParamGroup::DenseInWhole:  // [out, in]: data splits in; its output stays whole over tensor
      LOOM_ASSERT(ndim == 2, "a dense_in_whole parameter must be 2-D, got ", ndim, " dims");
      return spec({std::nullopt, d});
    case ParamGroup::ExpertIn:  // [E, F, C]: expert splits E, tensor splits F, data splits C
    case ParamGroup::ExpertOut: {  // [E, C, F]: expert splits E, data splits C, tensor splits F
      LOOM_ASSERT(ndim == 3, "an expert parameter must be 3-D, got ", ndim, " dims");
      const DimSplit e = uses_axis(mode, kExpert) ? DimSplit(kExpert) : DimSplit();
      return group == ParamGroup::ExpertIn ? spec({e, t, d_expert}) : spec({e, d_expert, t});
    }
    case ParamGroup::Embedding:
    case ParamGroup::LmHead:
    case ParamGroup::Position:  // [rows, C]: tensor splits d_model
      LOOM_ASSERT(ndim == 2, "an embedding-like parameter must be 2-D, got ", ndim, " dims");
      return spec({std::nullopt, t});
    case ParamGroup::Norm:
      return PartitionSpec{std::vector<DimSplit>(static_cast<size_t>(ndim))};
    case ParamGroup::Bias:
      LOOM_ASSERT(false, "spec_for(Bias): a bias's spec depends on its weight; use spec_for_bias");
  }
  return {};
}

PartitionSpec spec_for_bias(ParamGroup weight_group, ParallelMode mode) {
  const PartitionSpec w = spec_for(weight_group, mode, 2);
  return PartitionSpec{{w.dims[0]}};  // a bias lives on its weight's output dimension
}

PartitionSpec batch_spec(ParallelMode mode) {
  // Under dp_ep and fsdp_ep the rows split over data x expert (slice d * expert + e).
  if (mode == ParallelMode::Tp) return spec({std::nullopt, std::nullopt});
  if (is_expert_mode(mode)) return spec({DimSplit::folded({kData, kExpert}), std::nullopt});
  return spec({kData, std::nullopt});
}

int64_t TensorLayout::replication() const {
  int64_t blocks = 1;
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    if (spec.dims[i] && !shards.empty()) blocks *= global_shape[static_cast<int>(i)] / shards[0].shape[static_cast<int>(i)];
  }
  return static_cast<int64_t>(shards.size()) / blocks;
}

Shard shard_of(const std::string& name, const Shape& global_shape, const PartitionSpec& spec, const Mesh& mesh,
               int64_t rank) {
  LOOM_ASSERT(spec.dims.empty() || static_cast<int>(spec.dims.size()) == global_shape.ndim(), name, ": spec ",
              spec.str(), " does not match shape ", global_shape);
  Shard s;
  s.rank = rank;
  s.offset.assign(static_cast<size_t>(global_shape.ndim()), 0);
  s.shape = global_shape;
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    const DimSplit& split = spec.dims[i];
    if (!split) continue;
    const int64_t n = mesh.split_size(split), size = global_shape[static_cast<int>(i)];
    const std::string axes = split.axes.size() == 1 ? "the " + split.str() + " axis of size " + std::to_string(n)
                                                    : "the " + split.str() + " axes (" + std::to_string(n) + " ranks)";
    LOOM_CHECK(size % n == 0, "parameter '", name, "' has shape ", global_shape, ": its dimension ", i, " of size ",
               size, " does not divide by ", axes, " (spec ", spec.str(), ", mesh ", mesh.str(), ")");
    s.shape[static_cast<int>(i)] = size / n;
    s.offset[i] = mesh.split_coord(rank, split) * (size / n);
  }
  return s;
}

namespace {
std::vector<TensorLayout> plan(const std::vector<ParamInfo>& params, const Mesh& mesh, ParallelMode mode,
                               bool with_moments) {
  validate_mesh_for_mode(mesh, mode);
  std::map<std::string, ParamGroup> groups;
  for (const ParamInfo& p : params) groups[p.name] = p.group;
  std::vector<TensorLayout> out;
  for (const ParamInfo& p : params) {
    TensorLayout l;
    l.name = p.name;
    l.group = p.group;
    l.global_shape = p.global_shape;
    if (p.group == ParamGroup::Bias) {
      // "<prefix>.bias" follows "<prefix>.weight".
      const std::string suffix = "bias";
      LOOM_ASSERT(p.name.size() >= suffix.size() && p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0,
                  "bias parameter '", p.name, "' does not end in 'bias'");
      const std::string weight = p.name.substr(0, p.name.size() - suffix.size()) + "weight";
      auto it = groups.find(weight);
      LOOM_ASSERT(it != groups.end(), "bias '", p.name, "' has no weight '", weight, "'");
      l.spec = spec_for_bias(it->second, mode);
    } else {
      l.spec = spec_for(p.group, mode, p.global_shape.ndim());
    }
    for (int64_t r = 0; r < mesh.size(); ++r) l.shards.push_back(shard_of(p.name, p.global_shape, l.spec, mesh, r));
    out.push_back(l);
    if (with_moments) {
      for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
        TensorLayout m = l;
        m.name = p.name + moment;
        out.push_back(std::move(m));
      }
    }
  }
  return out;
}
}  // namespace

std::vector<TensorLayout> plan_layout(const std::vector<ParamInfo>& params, const Mesh& mesh, ParallelMode mode) {
  return plan(params, mesh, mode, false);
}

std::vector<TensorLayout> plan_layout_with_moments(const std::vector<ParamInfo>& params, const Mesh& mesh,
                                                   ParallelMode mode) {
  return plan(params, mesh, mode, true);
}

void validate_model_for_mesh(int64_t num_heads, int64_t num_kv_heads, const Mesh& mesh, ParallelMode mode) {
  if (!uses_axis(mode, kTensor)) return;
  LOOM_CHECK(num_heads % mesh.tensor == 0, "model.num_heads=", num_heads, " does not divide by tensor=", mesh.tensor,
             ": tensor parallelism gives each rank whole attention heads");
  LOOM_CHECK(num_kv_heads % mesh.tensor == 0, "model's key/value heads (", num_kv_heads,
             ") do not divide by tensor=", mesh.tensor, ": tensor parallelism gives each rank whole key/value heads");
}

void validate_batch_for_mesh(int64_t batch_size, const Mesh& mesh, ParallelMode mode) {
  if (batch_spec(mode).is_replicated()) return;
  if (is_expert_mode(mode)) {
    LOOM_CHECK(batch_size % (mesh.data * mesh.expert) == 0, "training.batch_size=", batch_size,
               " does not divide by data x expert = ", mesh.data, " x ", mesh.expert,
               ": under ", parallel_mode_name(mode), " every rank reads an equal slice of the global batch");
    return;
  }
  LOOM_CHECK(batch_size % mesh.data == 0, "training.batch_size=", batch_size, " does not divide by data=", mesh.data,
             ": each data rank reads an equal slice of the global batch");
}

void validate_experts_for_mesh(int64_t n_routed, const Mesh& mesh, ParallelMode mode) {
  if (!is_expert_mode(mode)) return;
  LOOM_CHECK(n_routed % mesh.expert == 0, "model.n_routed=", n_routed, " does not divide by expert=", mesh.expert,
             ": expert parallelism gives each expert rank n_routed / expert whole experts");
}

namespace {

// Calls fn(whole_offset, block_offset, run) for each contiguous run of the block in row-major order.
template <typename Fn>
void for_each_run(const Shape& whole, const Shard& s, Fn&& fn) {
  const int nd = whole.ndim();
  if (nd == 0) {
    fn(0, 0, 1);
    return;
  }
  const int64_t run = s.shape[nd - 1];
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);  // index within the block, last dim fixed at 0
  const int64_t runs = s.shape.numel() / std::max<int64_t>(run, 1);
  for (int64_t k = 0; k < runs; ++k) {
    int64_t w = 0;
    for (int d = 0; d < nd; ++d) w = w * whole[d] + s.offset[static_cast<size_t>(d)] + idx[static_cast<size_t>(d)];
    fn(w, k * run, run);
    for (int d = nd - 2; d >= 0; --d) {  // odometer over the outer dims
      if (++idx[static_cast<size_t>(d)] < s.shape[d]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

}  // namespace

Tensor copy_block(const Tensor& whole, const Shard& shard) {
  check_dtype(whole, DType::F32, "copy_block", "whole");
  Tensor out = Tensor::empty(shard.shape);
  const float* src = whole.data<float>();
  float* dst = out.data<float>();
  for_each_run(whole.shape(), shard, [&](int64_t w, int64_t b, int64_t n) {
    std::memcpy(dst + b, src + w, static_cast<size_t>(n) * sizeof(float));
  });
  return out;
}

void paste_block(Tensor& whole, const Tensor& block, const Shard& shard) {
  LOOM_CHECK(block.shape() == shard.shape, "paste_block: block ", block.describe(), " is not the shard's ", shard.shape);
  const float* src = block.data<float>();
  float* dst = whole.data<float>();
  for_each_run(whole.shape(), shard, [&](int64_t w, int64_t b, int64_t n) {
    std::memcpy(dst + w, src + b, static_cast<size_t>(n) * sizeof(float));
  });
}

}  // namespace loom::dist
