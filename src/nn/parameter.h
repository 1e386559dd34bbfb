// Parameters and the modules that own them.
//
// A Parameter carries everything later work needs: the dotted name users see in checkpoints
// (`layers.3.attn.q_proj.weight`), the global shape, the partition spec over the mesh, and the local
// shard `value` (the whole tensor while replicated), whose .grad() backward() fills. Optimizer state is
// kept by the optimizer, laid out like `value`.
//
// Initialisation is keyed by (seed, name) through the counter RNG, and a shard draws with its global
// offset, so every rank gets its slice of the same global tensor whatever the mesh or thread count.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "mesh/sharding.h"

namespace loom::dist {
struct RankContext;
}

namespace loom::nn {

// What a parameter is, for sharding and reports (mesh/sharding.h: the mesh maps each group to a
// partition spec per parallel mode).
using ParamGroup = dist::ParamGroup;
using dist::param_group_name;

struct Parameter {
  std::string name;
  Tensor value;
  Shape global_shape;
  dist::PartitionSpec spec;
  ParamGroup group = ParamGroup::DenseIn;
  // Set when the model is sharded over a mesh (dist::shard_model): the rank, mesh, mode and
  // communicator the layers use to gather what they need. Null: one process, value is the whole tensor.
  std::shared_ptr<const dist::RankContext> dist;
  // Under a pipe axis (parallel/pipeline.h): the pipeline stages that use it, ascending (one; the first
  // and the last for a tied GPT-2 table). On other stages `value` is empty (shard_model drops it); the
  // first listed writes it to checkpoints and counts it in the gradient norm. Empty: no pipe axis.
  std::vector<int> pipe_stages;

  // Mixed precision (ops::MatmulPrecision::BF16): `value` rounded to bf16, the operand the GEMMs read.
  // A layer that multiplies by this parameter in bf16 allocates it (bf16_weight_of); train::AdamW then
  // rewrites it in the same pass as each update and marks it current, so the weights are not converted
  // again every step. Anything else that writes `value` in place must call value_changed() (loading
  // weights does), else the GEMMs would read the old weights.
  Tensor bf16_copy;
  bool bf16_copy_current = false;
  void value_changed() { bf16_copy_current = false; }
};

// The bf16 copy of p.value for a mixed-precision GEMM: p.bf16_copy when the optimizer has kept it current,
// else p.value converted into it (allocated on first use). Not for sharded parameters (dist::).
Tensor bf16_weight_of(Parameter& p);

// The tensor compute reads: `value` itself, or, when sharded, `value` gathered over every mesh axis
// (differentiably: gradients flow back to the shard). Layers that compute on shards directly (Linear's
// tensor parallelism) use dist::sharded_linear instead.
Tensor compute_value(const Parameter& p);

// How a parameter's initial values are drawn.
struct Init {
  enum class Kind { Zeros, Ones, TruncatedNormal, Normal, Uniform } kind = Kind::Zeros;
  float std = 1.0f;     // Uniform: the bound (values in [-std, std))
  float cutoff = 3.0f;  // truncate at +-cutoff*std
  static Init zeros() { return {Kind::Zeros}; }
  static Init ones() { return {Kind::Ones}; }
  static Init truncated_normal(float std, float cutoff_in_std = 3.0f) {
    return {Kind::TruncatedNormal, std, cutoff_in_std};
  }
  static Init normal(float std) { return {Kind::Normal, std, 0.0f}; }
  static Init uniform(float bound) { return {Kind::Uniform, bound, 0.0f}; }
};

// While one lives on a thread, make_parameter there allocates without drawing (values unspecified): for
// loaders that overwrite every parameter right after building a model (drawing SmolLM2-135M's 163M
// initial values took 13 of the 15 s of a GGUF import). Like autograd::NoGradGuard, scoped and nestable.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};

// Makes a (replicated) parameter and draws its values from key.fold_in(name).
Parameter make_parameter(const std::string& name, const Shape& shape, const Init& init, RngKey key,
                         ParamGroup group = ParamGroup::DenseIn);

// Base class for anything holding parameters. Subclasses register theirs in their constructor;
// children are registered so that parameters() walks the tree in registration order.
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // All parameters of this module and its children, in a stable order.
  std::vector<Parameter*> parameters();
  // The child modules, in registration order (to find layers by type: models/adapters.h).
  const std::vector<Module*>& children() const { return children_; }
  // Looks a parameter up by dotted name; throws naming it if absent.
  Parameter& parameter(const std::string& name);

  // Says that what this module's layers hold changed in a way their values in place would not show: a
  // weight now held quantized or no longer (Linear::set_quantized calls it), parameters' tensors
  // replaced or sharded (dist::shard_model). Runs on_layers_changed on this module, then on each module
  // above it, so a model that derives something from its layers once (the Llama's fused decode step)
  // rebuilds it then, and never has to check per call. New values copied into the tensors in place
  // (load_parameter, the optimizer) need no call.
  void layers_changed();

 protected:
  Parameter& add_parameter(Parameter p);
  void add_child(Module* child);
  // Unregisters a child add_child registered (a LoRA detached from its layer).
  void remove_child(Module* child);
  virtual void on_layers_changed() {}

 private:
  std::vector<std::unique_ptr<Parameter>> own_;
  std::vector<Module*> children_;
  Module* parent_ = nullptr;  // the module that add_child'ed this one
};

// Joins a prefix and a name with a dot: join("layers.0", "attn") -> "layers.0.attn".
inline std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace loom::nn
