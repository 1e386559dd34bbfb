// The device mesh, the four parallel modes, and where every parameter's shards live.
//
// The mesh is 2-D, (data, tensor), as in the JAX-LM design (seed, "Implementing Distributed Training").
// Ranks are numbered with tensor fastest: rank = d * tensor + t, so a tensor group is a run of
// neighbouring ranks (one node, when ranks are packed by node as mpirun and srun do by default).
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
// GPT-2's position table is laid out like the token table (both are read by a lookup and summed into
// the residual stream, whose d_model the tensor axis splits). A Linear bias lives on its weight's output
// dimension, so it is split exactly when that dimension is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "dist/sharding.h"
#include "nn/parameter.h"

namespace loom::dist {

enum class ParallelMode { Dp, Fsdp, Tp, FsdpTp };

const char* parallel_mode_name(ParallelMode mode);
// "dp", "fsdp", "tp", "fsdp_tp"; anything else throws naming the value and the valid modes.
ParallelMode parallel_mode_from_name(const std::string& name);

struct Mesh {
  int64_t data = 1, tensor = 1;

  // "data=4,tensor=2" (either order; an axis left out is 1). Throws naming the text on anything else.
  static Mesh parse(const std::string& text);
  std::string str() const;  // "data=4,tensor=2"
  int64_t size() const { return data * tensor; }
  int64_t axis_size(MeshAxis axis) const;
  // A rank's coordinate on an axis (0 on axes the mesh does not have).
  int64_t coord(int64_t rank, MeshAxis axis) const;
  int64_t rank_at(int64_t data_index, int64_t tensor_index) const { return data_index * tensor + tensor_index; }
  // The ranks that share every coordinate of `rank` but the one on `axis`, in axis order: the group a
  // collective over that axis runs on.
  std::vector<int> group(int64_t rank, MeshAxis axis) const;
};

// dp and fsdp need tensor = 1; tp needs data = 1; fsdp_tp needs both > 1. Throws naming the mesh.
void validate_mesh_for_mode(const Mesh& mesh, ParallelMode mode);
// The mesh must use exactly the ranks that were started (a larger one is an error, so is a smaller one:
// the extra ranks would idle). `launcher` names where `ranks` came from, for the message.
void validate_mesh_for_ranks(const Mesh& mesh, int64_t ranks, const std::string& launcher);

// The table above, for a parameter of `ndim` dimensions. `group` of Bias needs the owning weight's
// group: use spec_for_bias.
PartitionSpec spec_for(nn::ParamGroup group, ParallelMode mode, int ndim);
PartitionSpec spec_for_bias(nn::ParamGroup weight_group, ParallelMode mode);
PartitionSpec batch_spec(ParallelMode mode);

// What the layout needs to know about a parameter (nn::Parameter carries all of it).
struct ParamInfo {
  std::string name;
  Shape global_shape;
  nn::ParamGroup group = nn::ParamGroup::DenseIn;
};
std::vector<ParamInfo> param_infos(const std::vector<nn::Parameter*>& params);

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
  nn::ParamGroup group = nn::ParamGroup::DenseIn;
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
// The batch splits over data: batch_size must divide by it. Throws naming training.batch_size.
void validate_batch_for_mesh(int64_t batch_size, const Mesh& mesh, ParallelMode mode);

}  // namespace loom::dist
