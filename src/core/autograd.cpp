#include "core/autograd.h"

#include <unordered_map>

#include "core/hooks.h"
#include "core/profile.h"

namespace loom::autograd {
namespace {
thread_local bool g_grad_enabled = true;
thread_local std::function<void(TensorImpl*)> g_leaf_hook;
}  // namespace

LeafGradHook::LeafGradHook(std::function<void(TensorImpl*)> hook) : previous_(std::move(g_leaf_hook)) {
  g_leaf_hook = std::move(hook);
}
LeafGradHook::~LeafGradHook() { g_leaf_hook = std::move(previous_); }

bool grad_enabled() { return g_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

EnableGradGuard::EnableGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { g_grad_enabled = previous_; }

bool any_requires_grad(const TensorList& inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(const char* name, const TensorList& inputs, const TensorList& outputs, BackwardFn backward) {
  if (!g_grad_enabled) return;
  profile::Profile* profile = profile::active();  // null unless `loom bench roofline` (or a test) profiles
  const int profile_index = profile != nullptr ? profile->on_record(name, inputs, outputs) : -1;
  if (!any_requires_grad(inputs)) return;
  LOOM_ASSERT(inputs.size() <= 64, "ops have at most 64 inputs");
  auto node = std::make_shared<Node>();
  node->name = name;
  node->backward = std::move(backward);
  node->profile_index = profile_index;
  if (profile_index >= 0) profile->ops[static_cast<size_t>(profile_index)].has_backward = true;
  node->inputs.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined() && t.requires_grad()) {
      if (t.grad_fn()) {
        e.node = t.grad_fn();
        e.output_index = t.output_index();
      } else {
        e.leaf = t.impl_ptr();
      }
    }
    node->inputs.push_back(std::move(e));
  }
  int index = 0;
  for (const Tensor& out : outputs) {
    node->output_shapes.push_back(out.shape());
    node->output_dtypes.push_back(out.dtype());
    node->device = out.device();
    const_cast<Tensor&>(out).set_grad_fn(node, index++);
  }
}

namespace {

// True when nothing else refers to `t` or its memory, so a leaf may take it as its .grad without a copy
// (a fresh gradient a backward function just computed). A shared or viewed buffer is cloned instead:
// writing into the leaf's grad later (accumulation, clipping) must not change anyone else's tensor.
bool owns_its_buffer(const Tensor& t) {
  const TensorImpl* impl = t.impl();
  return t.impl_ptr().use_count() == 1 && impl->storage && impl->storage.use_count() == 1 &&
         impl->offset_bytes == 0 && !impl->grad_fn;
}

void accumulate(Tensor& slot, const Tensor& grad) {
  if (!slot.defined()) {
    slot = grad;
  } else {
    slot = hooks::add_gradients(slot, grad);
  }
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad_root) {
  LOOM_CHECK(root.defined(), "backward: the root tensor is undefined");
  LOOM_CHECK(root.requires_grad(), "backward: ", root.describe(),
             " does not require grad (no parameter reached it, or it was computed under NoGradGuard)");
  Tensor seed = grad_root;
  if (!seed.defined()) {
    LOOM_CHECK(root.numel() == 1, "backward: the root must be a scalar when no gradient is given, got ",
               root.describe());
    seed = Tensor::full(root.shape(), 1.0f, root.dtype(), root.device());
  }
  LOOM_CHECK(seed.shape() == root.shape(), "backward: gradient shape ", seed.shape(),
             " differs from root shape ", root.shape());
  NoGradGuard no_grad;

  if (!root.grad_fn()) {  // the root is itself a leaf
    TensorImpl* leaf = root.impl();
    if (!leaf->grad.defined()) leaf->grad = seed.clone();
    else hooks::add_gradient_into(leaf->grad, seed);
    return;
  }

  // Count, for every node, how many edges point at it; a node runs once all its consumers have run,
  // which processes the graph in reverse topological order.
  // With a leaf hook, also count the edges into each leaf: the hook fires when the last one delivers.
  const std::function<void(TensorImpl*)> hook = g_leaf_hook;
  std::unordered_map<TensorImpl*, int> leaf_edges;
  Node* root_node = root.grad_fn().get();
  std::vector<Node*> stack{root_node};
  root_node->dependencies = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (Edge& e : n->inputs) {
      if (e.node && e.node->dependencies++ == 0) stack.push_back(e.node.get());
      if (hook && !e.node && e.leaf) ++leaf_edges[e.leaf.get()];
    }
  }

  root.grad_fn()->pending_grads.assign(root.grad_fn()->output_shapes.size(), Tensor());
  root.grad_fn()->pending_grads[static_cast<size_t>(root.output_index())] = seed;
  std::vector<std::shared_ptr<Node>> ready{root.grad_fn()};
  profile::Profile* profile = profile::active();
  const double profile_start = profile != nullptr ? profile->stamp() : 0.0;
  double in_nodes = 0;
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    TensorList grads = std::move(node->pending_grads);
    grads.resize(node->output_shapes.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = Tensor::zeros(node->output_shapes[i], node->output_dtypes[i], node->device);
    }
    uint64_t mask = 0;
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      if (node->inputs[i].active()) mask |= uint64_t{1} << i;
    }
    LOOM_CHECK(node->backward, "backward: the graph through '", node->name,
               "' was already used by an earlier backward()");
    TensorList input_grads;
    if (profile == nullptr) {
      input_grads = node->backward(BackwardContext(grads, mask));
    } else {
      const double t0 = profile->stamp();
      input_grads = node->backward(BackwardContext(grads, mask));
      const double dt = profile->stamp() - t0;
      in_nodes += dt;
      profile->on_backward(node->profile_index, dt);
    }
    node->backward = nullptr;  // release saved tensors
    grads.clear();
    LOOM_ASSERT(input_grads.size() <= node->inputs.size(), node->name, " returned ", input_grads.size(),
                " gradients for ", node->inputs.size(), " inputs");
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      Edge& e = node->inputs[i];
      if (!e.active()) continue;
      Tensor g = i < input_grads.size() ? std::move(input_grads[i]) : Tensor();
      if (e.node) {
        Node* producer = e.node.get();
        if (g.defined()) {
          LOOM_ASSERT(g.shape() == producer->output_shapes[static_cast<size_t>(e.output_index)], node->name,
                      ": gradient of input ", i, " has shape ", g.shape(), ", expected ",
                      producer->output_shapes[static_cast<size_t>(e.output_index)]);
          if (producer->pending_grads.empty()) producer->pending_grads.resize(producer->output_shapes.size());
          accumulate(producer->pending_grads[static_cast<size_t>(e.output_index)], g);
        }
        if (--producer->dependencies == 0) ready.push_back(e.node);
      } else {
        TensorImpl* leaf = e.leaf.get();
        if (g.defined()) {
          LOOM_ASSERT(g.shape() == leaf->shape, node->name, ": gradient of input ", i, " has shape ",
                      g.shape(), ", expected ", leaf->shape);
          if (!leaf->grad.defined()) {
            leaf->grad = g.dtype() != leaf->dtype ? g.to(leaf->dtype) : owns_its_buffer(g) ? std::move(g) : g.clone();
          } else {
            hooks::add_gradient_into(leaf->grad, g);
          }
        }
        if (hook && --leaf_edges[leaf] == 0) hook(leaf);
      }
    }
  }
  if (profile != nullptr) profile->backward_glue_seconds += profile->stamp() - profile_start - in_nodes;
}

void backward(const TensorList& roots, const TensorList& grad_roots) {
  LOOM_CHECK(roots.size() == grad_roots.size() && !roots.empty(), "backward: ", roots.size(), " roots but ",
             grad_roots.size(), " gradients");
  if (roots.size() == 1) return backward(roots[0], grad_roots[0]);
  // One node joins the roots: its backward hands each root its gradient.
  Tensor joint = Tensor::zeros({1});
  {
    EnableGradGuard grad;
    record("backward_roots", roots, {joint}, [grad_roots](const BackwardContext&) { return grad_roots; });
  }
  backward(joint);
}

namespace {

// The outputs a keep_outputs checkpoint keeps: filled in its first run, read back in order in its second.
struct KeptOutputs {
  std::vector<Tensor>* outputs = nullptr;
  bool replay = false;
  size_t next = 0;
};
thread_local KeptOutputs g_kept;

class KeptScope {
 public:
  KeptScope(std::vector<Tensor>* outputs, bool replay) : previous_(g_kept) {
    LOOM_ASSERT(g_kept.outputs == nullptr || outputs == nullptr, "checkpoint: recomputation regions do not nest");
    g_kept = {outputs, replay, 0};
  }
  ~KeptScope() { g_kept = previous_; }
  size_t consumed() const { return g_kept.next; }
  KeptScope(const KeptScope&) = delete;
  KeptScope& operator=(const KeptScope&) = delete;

 private:
  KeptOutputs previous_;
};

}  // namespace

Tensor recall_output() {
  if (g_kept.outputs == nullptr || !g_kept.replay) return Tensor();
  LOOM_ASSERT(g_kept.next < g_kept.outputs->size(), "checkpoint: the recomputation asked for more kept outputs (",
              g_kept.next + 1, ") than the first run kept (", g_kept.outputs->size(), ")");
  return (*g_kept.outputs)[g_kept.next++];
}

void remember_output(const Tensor& out) {
  if (g_kept.outputs != nullptr && !g_kept.replay) g_kept.outputs->push_back(out.detach());
}

TensorList checkpoint(const char* name, const TensorList& inputs, CheckpointFn fn, bool keep_outputs) {
  if (!any_requires_grad(inputs)) return fn(inputs);
  auto kept = std::make_shared<std::vector<Tensor>>();
  TensorList outputs;
  {
    NoGradGuard no_grad;
    KeptScope scope(keep_outputs ? kept.get() : nullptr, /*replay=*/false);
    outputs = fn(inputs);
  }
  TensorList saved;
  std::vector<bool> needs;
  for (const Tensor& t : inputs) {
    saved.push_back(t.defined() ? t.detach() : t);
    needs.push_back(t.defined() && t.requires_grad());
  }
  // The node's outputs: the defined ones; `slot[i]` is output i's place among them (or -1).
  TensorList recorded;
  std::vector<int> slot;
  for (const Tensor& t : outputs) {
    slot.push_back(t.defined() ? static_cast<int>(recorded.size()) : -1);
    if (t.defined()) recorded.push_back(t);
  }
  if (recorded.empty()) return outputs;
  record(name, inputs, recorded,
         [fn = std::move(fn), saved, needs, slot, kept, keep_outputs](const BackwardContext& ctx) {
           TensorList xs = saved;
           for (size_t i = 0; i < xs.size(); ++i) {
             if (needs[i]) xs[i] = saved[i].detach().set_requires_grad(true);
           }
           TensorList ys;
           {
             EnableGradGuard grad;
             KeptScope scope(keep_outputs ? kept.get() : nullptr, /*replay=*/true);
             ys = fn(xs);
             LOOM_ASSERT(scope.consumed() == kept->size(), "checkpoint: the recomputation used ", scope.consumed(),
                         " of the ", kept->size(), " outputs the first run kept");
           }
           kept->clear();
           LOOM_ASSERT(ys.size() == slot.size(), "checkpoint: the recomputation returned ", ys.size(),
                       " outputs, the first run ", slot.size());
           TensorList roots, grads;
           for (size_t i = 0; i < ys.size(); ++i) {
             if (slot[i] < 0 || !ys[i].defined() || !ys[i].requires_grad()) continue;
             roots.push_back(ys[i]);
             grads.push_back(ctx.grad_output(slot[i]));
           }
           if (!roots.empty()) backward(roots, grads);
           TensorList dx(xs.size());
           for (size_t i = 0; i < xs.size(); ++i) {
             if (needs[i]) dx[i] = xs[i].grad();
           }
           return dx;
         });
  return outputs;
}

}  // namespace loom::autograd
