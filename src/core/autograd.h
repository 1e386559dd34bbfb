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

// Grad on again inside a NoGradGuard: activation recomputation's second forward runs inside backward().
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

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
// The same for several roots at once, roots[i] receiving grad_roots[i] (one pass over their joint graph).
void backward(const TensorList& roots, const TensorList& grad_roots);

// ---- Activation recomputation (training.recompute; docs/plan.md, "Recomputation") -------------------
//
// checkpoint(name, inputs, fn) runs fn(inputs) without recording anything, so of everything fn computes
// only its outputs stay alive, and records one node whose backward runs fn again on the saved inputs
// with grad on and back-propagates the outputs' gradients through that second graph: the parameters fn
// reads receive their gradients (and the leaf hook, as in any backward), the inputs theirs. fn must
// compute the same bits both times (loom's kernels are deterministic, dropout masks are keyed, not drawn
// from a stream), so a recomputed step gives the same bits as a stored one. Undefined outputs are
// allowed (and stay undefined); at least one input must require grad, else fn simply runs.
//
// keep_outputs (selective recomputation): the ops that call remember_output (the GEMMs: ops::linear)
// keep their outputs from the first run, and in the second run recall_output hands each back instead of
// computing it again. So the GEMMs run once and the cheap ops between them (norms, activations, the
// attention core, residual adds) run twice, and what is stored is the GEMMs' outputs.
using CheckpointFn = std::function<TensorList(const TensorList&)>;
TensorList checkpoint(const char* name, const TensorList& inputs, CheckpointFn fn, bool keep_outputs = false);
// For ops: in a keep_outputs checkpoint's second run, the output the op computed in the first (in call
// order); undefined otherwise (compute it).
Tensor recall_output();
// For ops: in a keep_outputs checkpoint's first run, keeps `out` for the second; a no-op otherwise.
void remember_output(const Tensor& out);

}  // namespace loom::autograd
