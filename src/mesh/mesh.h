// The device mesh, the four parallel modes, and where every parameter's shards live.
//
// The mesh is (data, tensor), as in the JAX-LM design (seed, "Implementing Distributed Training"), plus
// an `expert` axis for mixture-of-experts models (expert parallelism, the dp_ep and fsdp_ep modes).
// Ranks are numbered with tensor fastest, then expert: rank = (d * expert + e) * tensor + t, so a tensor
// group is a run of neighbouring ranks (one node, when ranks are packed by node as mpirun and srun do by
// default), and an expert group, which exchanges tokens in every MoE layer, comes next.
//
// A mode assigns each parameter group a PartitionSpec. loom's Linear weights are [out, in], so the 2-D
// specs are the seed's JAX specs transposed:
//
//   group                  | dp           | fsdp           | tp               | fsdp_tp
//   dense_in  [F, C]       | (None, None) | (None, data)   | (tensor, None)   | (tensor, data)
//   dense_out [C, F]       | (None, None) | (data, None)   | (None, tensor)   | (data, tensor)
//   embedding [V, C]       | replicated   | replicated     | (None, tensor)   | (None, tensor)
//   lm_head   [V, C]       | replicated   | replicated     | (None, tensor)   | (None, tensor)
//   position  [T, C]       | replicated   | replicated     | (None, tensor)   | (None, tensor)   (GPT-2)
//   bias      [out]        | its weight's spec on the output dim: dense_in -> (tensor) under tp and
//                          | fsdp_tp; dense_out -> (data) under fsdp and fsdp_tp; else replicated (GPT-2)
//   norm      [C]          | replicated everywhere (gains and LayerNorm biases)
//   batch     [B, T]       | (data, None) | (data, None)   | replicated       | (data, None)
//
// DeepSeek-V3 adds three groups (docs/mesh.md has the whole table, with the expert modes):
//   dense_in_whole [F, C]  | replicated   | (None, data)   | replicated       | (None, data)
//     a Linear whose output a norm or the residual stream reads whole (MLA's wq_a and wkv_a, the
//     router, MTP's proj): tensor parallelism cannot split its output, so the tensor ranks compute it
//     redundantly.
//   expert_in  [E, F, C]   | replicated   | (None, None, data) | (None, tensor, None) | (None, tensor, data)
//   expert_out [E, C, F]   | replicated   | (None, data, None) | (None, None, tensor) | (None, data, tensor)
//   under dp_ep: experts (expert, None, None), everything else replicated. fsdp_ep: experts
//   (expert, None, data) / (expert, data, None); the dense groups (dense_in, dense_out, dense_in_whole)
//   take fsdp's spec with the expert axis folded into data, e.g. dense_in (None, (data, expert)): every
//   rank that splits the batch holds 1/(data x expert) of them. The batch splits over (data, expert) in
//   both.
//
// GPT-2's position table is laid out like the token table (both are read by a lookup and summed into
// the residual stream, whose d_model the tensor axis splits). A Linear bias lives on its weight's output
// dimension, so it is split exactly when that dimension is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "mesh/sharding.h"
#include "core/tensor.h"

namespace loom::dist {

enum class ParallelMode { Dp, Fsdp, Tp, FsdpTp, DpEp, FsdpEp };

const char* parallel_mode_name(ParallelMode mode);
// "dp", "fsdp", "tp", "fsdp_tp", "dp_ep", "fsdp_ep"; anything else throws naming the value and the valid modes.
ParallelMode parallel_mode_from_name(const std::string& name);

struct Mesh {
  int64_t data = 1, tensor = 1, expert = 1;
  // Pipeline stages (parallel/pipeline.h): the outermost axis, rank = p * (data * expert * tensor) + ...,
  // so each stage is a whole data x expert x tensor mesh of its own and the stages talk only point to
  // point, the traffic that crosses nodes best. Parameters are never split over it: a stage holds (and
  // trains) the layers it runs.
  int64_t pipe = 1;

  // "data=4,tensor=2" or "data=2,expert=4" (any order; an axis left out is 1). Throws naming the text on
  // anything else.
  static Mesh parse(const std::string& text);
  std::string str() const;  // "data=4,tensor=2", with ",expert=E" when expert > 1, ",pipe=P" when pipe > 1
  int64_t size() const { return data * tensor * expert * pipe; }
  int64_t axis_size(MeshAxis axis) const;
  // A rank's coordinate on an axis (0 on axes the mesh does not have).
  int64_t coord(int64_t rank, MeshAxis axis) const;
  int64_t rank_at(int64_t data_index, int64_t tensor_index, int64_t expert_index = 0, int64_t pipe_index = 0) const {
    return ((pipe_index * data + data_index) * expert + expert_index) * tensor + tensor_index;
  }
  // The ranks that share every coordinate of `rank` but the one on `axis`, in axis order: the group a
  // collective over that axis runs on.
  std::vector<int> group(int64_t rank, MeshAxis axis) const;
  // The ranks that share every coordinate of `rank` but those on `axes`, in rank order.
  std::vector<int> group(int64_t rank, const std::vector<MeshAxis>& axes) const;
  // A dimension split over `split` (one axis, or several folded; sharding.h): how many blocks it is cut
  // into (the product of the axes' sizes), the block `rank` holds (its coordinates on the axes, outermost
  // first: d * expert + e for (data, expert)), and the ranks that hold the other blocks of the same
  // piece, ordered by block, which is the order a gather over them concatenates in.
  int64_t split_size(const DimSplit& split) const;
  int64_t split_coord(int64_t rank, const DimSplit& split) const;
  std::vector<int> split_group(int64_t rank, const DimSplit& split) const;
};

// Whether the mode splits the batch over the expert axis too (dp_ep, fsdp_ep): the axes over which the
// batch is split, in mesh order, and how many slices that makes.
bool is_expert_mode(ParallelMode mode);
std::vector<MeshAxis> batch_axes(ParallelMode mode);
int64_t batch_slices(const Mesh& mesh, ParallelMode mode);

// dp and fsdp need tensor = 1; tp needs data = 1; fsdp_tp needs both > 1; dp_ep and fsdp_ep need
// tensor = 1 and expert > 1; every other mode expert = 1. Throws naming the mesh.
void validate_mesh_for_mode(const Mesh& mesh, ParallelMode mode);
// The mesh must use exactly the ranks that were started (a larger one is an error, so is a smaller one:
// the extra ranks would idle). `launcher` names where `ranks` came from, for the message.
void validate_mesh_for_ranks(const Mesh& mesh, int64_t ranks, const std::string& launcher);

// The table above, for a parameter of `ndim` dimensions. `group` of Bias needs the owning weight's
// group: use spec_for_bias.
PartitionSpec spec_for(ParamGroup group, ParallelMode mode, int ndim);
PartitionSpec spec_for_bias(ParamGroup weight_group, ParallelMode mode);
PartitionSpec batch_spec(ParallelMode mode);

// What the layout needs to know about a parameter (nn::Parameter carries all of it: dist::param_infos).
struct ParamInfo {
  std::string name;
  Shape global_shape;
  ParamGroup group = ParamGroup::DenseIn;
};

// One device's block of a tensor: dims [offset[i], offset[i] + shape[i]) of the global array.
struct Shard {
  int64_t rank = 0;
  std::vector<int64_t> offset;
  Shape shape;
};

// Where a tensor lives on the mesh: its spec, global shape and one Shard per rank (replicated blocks
// repeat on the ranks that share them).
struct TensorLayout {
  std::string name;
  ParamGroup group = ParamGroup::DenseIn;
  PartitionSpec spec;
  Shape global_shape;
  std::vector<Shard> shards;  // indexed by rank
  // How many ranks hold each block (mesh size / number of distinct blocks).
  int64_t replication() const;
};

// The shard of `rank` for a tensor of `global_shape` laid out by `spec`. Throws (naming `name`, the
// dimension and the axis) when a split dimension does not divide by its axis.
Shard shard_of(const std::string& name, const Shape& global_shape, const PartitionSpec& spec, const Mesh& mesh,
               int64_t rank);

// The block of `whole` that `shard` describes (a copy), and the reverse (writes `block` into `whole`).
Tensor copy_block(const Tensor& whole, const Shard& shard);
void paste_block(Tensor& whole, const Tensor& block, const Shard& shard);

// The layout of every parameter under `mode` on `mesh` (validated for the mode). Throws on the first
// parameter whose split dimension does not divide, naming it.
std::vector<TensorLayout> plan_layout(const std::vector<ParamInfo>& params, const Mesh& mesh, ParallelMode mode);
// The same plus, after each parameter, its AdamW moments "<name>.exp_avg" and "<name>.exp_avg_sq",
// laid out exactly like it (the optimizer updates each shard elementwise).
std::vector<TensorLayout> plan_layout_with_moments(const std::vector<ParamInfo>& params, const Mesh& mesh,
                                                   ParallelMode mode);

// Checks what a model needs beyond divisible shapes: tensor parallelism splits whole attention heads, so
// num_heads and num_kv_heads (from the model section) must divide by tensor. Throws naming the key.
void validate_model_for_mesh(int64_t num_heads, int64_t num_kv_heads, const Mesh& mesh, ParallelMode mode);
// The batch splits over data (and expert): batch_size must divide by it. Throws naming training.batch_size.
void validate_batch_for_mesh(int64_t batch_size, const Mesh& mesh, ParallelMode mode);
// Expert parallelism gives each expert rank whole experts: n_routed must divide by expert. Throws naming
// model.n_routed.
void validate_experts_for_mesh(int64_t n_routed, const Mesh& mesh, ParallelMode mode);

}  // namespace loom::dist
