// Reverse-mode autodiff over coarse ops, PyTorch-style: each recorded op result points at the Node
// that made it, and backward() walks those Nodes in reverse topological order.
//
// An op records itself like this (see ops/norm.cpp for a full example):
//
//   Tensor y = Tensor::empty(...);   cpu::rms_norm_forward(...);
//   autograd::record("rms_norm", {x, w}, {y}, [x, w, rstd](const autograd::BackwardContext& ctx) {
//     const Tensor& dy = ctx.grad_output(0);
//     Tensor dx, dw;  ... compute only what ctx.needs_input_grad(i) asks for ...
//     return TensorList{dx, dw};  // one entry per input; undefined where not needed
//   });
//
// Rules the engine relies on:
//   * A backward returns fresh gradients for its inputs (activation gradients "overwrite"); the engine
//     sums them when an input feeds several ops, and accumulates into leaves' .grad with += (parameter
//     gradients accumulate, so gradient accumulation over micro-batches needs no extra code).
//   * A missing gradient for an output arrives as a zero tensor of the output's shape.
//   * After backward() the graph's saved tensors are released (no retain_graph).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace loom::autograd {

// Whether ops record themselves. Off inside a NoGradGuard (evaluation, generation, optimizer steps).
bool grad_enabled();

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

class BackwardContext {
 public:
  BackwardContext(const TensorList& grad_outputs, uint64_t needs_mask)
      : grad_outputs_(grad_outputs), needs_mask_(needs_mask) {}
  const Tensor& grad_output(int i) const { return grad_outputs_[static_cast<size_t>(i)]; }
  bool needs_input_grad(int i) const { return (needs_mask_ >> i) & 1u; }

 private:
  const TensorList& grad_outputs_;
  uint64_t needs_mask_;
};

using BackwardFn = std::function<TensorList(const BackwardContext&)>;

// Where an input's gradient goes: into the Node that produced it, or into a leaf's .grad.
struct Edge {
  std::shared_ptr<Node> node;           // producer, or null for a leaf / a tensor without grad
  int output_index = 0;
  std::shared_ptr<TensorImpl> leaf;     // set for leaves that require grad
  bool active() const { return node != nullptr || leaf != nullptr; }
};

struct Node {
  const char* name = "";
  std::vector<Edge> inputs;
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  Device device;
  BackwardFn backward;
  int profile_index = -1;  // this op's entry in the active profile::Profile when it was recorded, else -1
  // Scratch used by the engine during backward().
  TensorList pending_grads;
  int dependencies = 0;
};

// True when grad is enabled and some input requires a gradient.
bool any_requires_grad(const TensorList& inputs);

// Records an op: if any input requires grad, makes a Node and marks the outputs as its results.
// Outputs must be fresh tensors made by the op.
void record(const char* name, const TensorList& inputs, const TensorList& outputs, BackwardFn backward);

// While one lives, backward() on this thread calls `hook(leaf)` as soon as a leaf has received the last
// gradient this backward() gives it, so its .grad is final for the pass (like PyTorch's post-accumulate-
// grad hooks). The sharded runtime starts gradient all-reduces there, overlapping them with the rest of
// the backward (parallel/runtime.cpp). Scoped and nestable; the calls come in the engine's (fixed) order.
class LeafGradHook {
 public:
  explicit LeafGradHook(std::function<void(TensorImpl* leaf)> hook);
  ~LeafGradHook();
  LeafGradHook(const LeafGradHook&) = delete;
  LeafGradHook& operator=(const LeafGradHook&) = delete;

 private:
  std::function<void(TensorImpl*)> previous_;
};

// Accumulates d(root)/d(leaf) into each reachable leaf's .grad. `grad_root` defaults to ones for a
// one-element root.
void backward(const Tensor& root, const Tensor& grad_root = Tensor());

}  // namespace loom::autograd
