#include "nn/sharded.h"

#include <cstring>
#include <string>

#include "core/autograd.h"
#include "core/error.h"
#include "nn/overlap.h"
#include "ops/collective.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace loom::dist {

namespace {

DimSplit axis_of(const nn::Parameter& p, int dim) {
  if (p.spec.dims.empty()) return {};
  return p.spec.dims[static_cast<size_t>(dim)];
}

// An FSDP dimension: one split over data, alone or with the expert axis folded in (fsdp_ep's dense
// weights). The layer gathers it before computing, over the ranks that hold its blocks.
bool is_data_dim(const nn::Parameter& p, int dim) { return axis_of(p, dim).has(MeshAxis::Data); }
Group data_dim_group(const nn::Parameter& p, int dim, const RankContext& c) { return c.group(axis_of(p, dim)); }

// `t` gathered on every FSDP dimension of the spec, differentiably.
Tensor gather_data_dims(Tensor t, const nn::Parameter& p, const RankContext& c) {
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (is_data_dim(p, d)) t = ops::all_gather(t, d, data_dim_group(p, d, c));
  }
  return t;
}

// y [..., N] + b [N] (broadcast over rows); db = sum over rows of dy. The row-parallel Linear adds its
// bias after the all-reduce, once.
Tensor add_bias(const Tensor& y, const Tensor& b) {
  check_dtype(y, DType::F32, "add_bias", "y");
  check_dtype(b, DType::F32, "add_bias", "b");
  const int64_t N = b.numel(), rows = y.numel() / N;
  LOOM_CHECK(y.size(-1) == N, "add_bias: y ", y.describe(), " does not end in the bias's ", N);
  Tensor out = Tensor::empty(y.shape());
  const float* src = y.data<float>();
  const float* bias = b.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < N; ++j) dst[r * N + j] = src[r * N + j] + bias[j];
  }
  autograd::record("add_bias", {y, b}, {out}, [N, rows](const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);
    Tensor db;
    if (ctx.needs_input_grad(1)) {
      db = Tensor::zeros({N});
      const float* g = dy.data<float>();
      float* acc = db.data<float>();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < N; ++j) acc[j] += g[r * N + j];
      }
    }
    return TensorList{dy, db};
  });
  return out;
}

// Values only (not recorded): `t` gathered on the spec's FSDP dims, and the reverse reduce-scatter of
// a whole-tensor gradient onto the shard.
Tensor gather_data_values(Tensor t, const nn::Parameter& p, const RankContext& c) {
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (is_data_dim(p, d)) t = ops::all_gather_values(t, d, data_dim_group(p, d, c));
  }
  return t;
}
Tensor scatter_data_values(Tensor g, const nn::Parameter& p, const RankContext& c) {
  for (int d = static_cast<int>(p.spec.dims.size()) - 1; d >= 0; --d) {
    if (is_data_dim(p, d)) g = ops::reduce_scatter_values(g, d, data_dim_group(p, d, c));
  }
  return g;
}
bool has_data_dim(const nn::Parameter& p) { return is_split_over(p, MeshAxis::Data); }
// The one FSDP dimension of the spec, or -1 (none, or several: those take the blocking path).
int data_dim(const nn::Parameter& p) {
  int found = -1;
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (is_data_dim(p, d)) {
      if (found >= 0) return -1;
      found = d;
    }
  }
  return found;
}

// The block a parameter belongs to: its name up to the second dot ("layers.3"), or the whole name.
std::string block_of(const nn::Parameter& p) {
  const size_t first = p.name.find('.');
  const size_t second = first == std::string::npos ? first : p.name.find('.', first + 1);
  return second == std::string::npos ? p.name : p.name.substr(0, second);
}

// Whether `p` can join a packed gather over `ranks`: one FSDP dim, gathered over those ranks.
bool packs_over(const nn::Parameter& p, const std::vector<int>& ranks, const RankContext& c) {
  const int d = data_dim(p);
  return d >= 0 && data_dim_group(p, d, c).ranks == ranks;
}

// Cuts a learned order into groups: runs of consecutive uses of one block that gather over the same
// ranks (a use that cannot pack is a group of its own).
void cut_groups(OverlapState::Order& o, const RankContext& c) {
  if (!o.learned || o.group_end.size() == o.uses.size()) return;
  const size_t n = o.uses.size();
  o.group_end.assign(n, n);
  size_t start = 0;
  for (size_t i = 1; i <= n; ++i) {
    bool joins = i < n;
    if (joins) {
      const nn::Parameter& first = *o.uses[start].weight;
      const nn::Parameter& w = *o.uses[i].weight;
      const int d = data_dim(first);
      joins = d >= 0 && block_of(w) == block_of(first) && packs_over(w, data_dim_group(first, d, c).ranks, c);
    }
    if (!joins) {
      for (size_t k = start; k < i; ++k) o.group_end[k] = i;
      start = i;
    }
  }
}

// The packing of the uses [from, to) of `o`: their weights, and the biases gathered with them, that
// gather over the first weight's FSDP ranks (a bias not split over data stays out).
OverlapState::Packing pack_uses(const OverlapState::Order& o, size_t from, size_t to, const RankContext& c) {
  const nn::Parameter& first = *o.uses[from].weight;
  const Group group = data_dim_group(first, data_dim(first), c);
  OverlapState::Packing k;
  for (size_t i = from; i < to; ++i) {
    for (const nn::Parameter* p : {o.uses[i].weight, o.uses[i].bias}) {
      if (!p || k.has(p) || !packs_over(*p, group.ranks, c)) continue;
      k.members.push_back(p);
      k.offsets.push_back(k.block);
      k.block += p->value.numel();
    }
  }
  k.ranks = group.size();
  return k;
}

// The group the packing's members gather over (the first member's FSDP ranks).
Group packing_group(const OverlapState::Packing& k, const RankContext& c) {
  const nn::Parameter& first = *k.members.front();
  return data_dim_group(first, data_dim(first), c);
}

// The uses [from, to) of `o` packed and all-gathered in one call, started in the background: its
// Gathered, and the collective that fills its raw.
std::pair<OverlapState::Gathered, ops::StartedCollective> start_group(const OverlapState::Order& o, size_t from, size_t to,
                                                                      const RankContext& c) {
  OverlapState::Gathered g;
  static_cast<OverlapState::Packing&>(g) = pack_uses(o, from, to, c);
  Tensor send = Tensor::empty({g.block});  // this rank's shards, one after another
  for (size_t m = 0; m < g.members.size(); ++m) {
    const Tensor& shard = g.members[m]->value;
    std::memcpy(send.data<float>() + g.offsets[m], shard.data<float>(), shard.nbytes());
  }
  Tensor raw = Tensor::empty({g.ranks * g.block});
  const Group group = packing_group(g, c);
  Communicator* comm = group.comm;
  auto work = comm->start_all_gather(send.data<float>(), g.block, raw.data<float>(), group.ranks);
  return {std::move(g), ops::StartedCollective([comm, work, send, raw] {
            comm->wait(work);
            return raw;
          })};
}

// Member `p` of a gathered group, whole: rank r's shard is block r of p's data dim.
Tensor unpack(const OverlapState::Gathered& g, const nn::Parameter& p) {
  const size_t m = g.index_of(&p);
  const int d = data_dim(p);
  const Shape& shard = p.value.shape();
  int64_t outer = 1, row = 1;  // shard: [outer, row] around dim d (row: dim d and everything after it)
  for (int i = 0; i < static_cast<int>(shard.size()); ++i) (i < d ? outer : row) *= shard[static_cast<size_t>(i)];
  Shape whole = shard;
  whole[static_cast<size_t>(d)] *= g.ranks;
  Tensor out = Tensor::empty(whole);  // [outer, ranks, row]
  float* dst = out.data<float>();
  const float* src = g.raw.data<float>() + g.offsets[m];
  for (int64_t r = 0; r < g.ranks; ++r) {
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(dst + (o * g.ranks + r) * row, src + r * g.block + o * row, static_cast<size_t>(row) * sizeof(float));
    }
  }
  return out;
}

// The whole weight (and bias) of an FSDP Linear for this pass. With overlap, once the pass's order is
// learned, a block's Linears are gathered in one collective (the group's; the first group of a pass
// when its first Linear runs, each later one started then for the group after it, to run while this
// group computes), and each Linear copies its whole weight out of it. Before that (the first step's
// passes), each on its own. A backward gathers the biases of its group's forward too (a recomputed
// forward inside it then finds them), so every gather of a block carries the same bytes.
std::pair<Tensor, Tensor> gather_layer(const nn::Parameter& w, const nn::Parameter* b, const RankContext& c,
                                       bool backward_pass) {
  OverlapState* s = overlap_of(c);
  if (!s) return {gather_data_values(w.value, w, c), b ? gather_data_values(b->value, *b, c) : Tensor()};
  if (backward_pass) s->forward.close();  // the forward before this backward has ended
  OverlapState::Order& order = backward_pass ? s->backward : s->forward;
  const OverlapState::Use* forward_use = backward_pass ? s->forward.find(&w) : nullptr;
  order.note({&w, backward_pass ? (forward_use ? forward_use->bias : nullptr) : b});
  cut_groups(order, c);
  OverlapState::Prefetch& pre = s->prefetch;
  auto start_after = [&](const OverlapState::Order& o, size_t end) {
    if (end >= o.uses.size() || data_dim(*o.uses[end].weight) < 0) return;
    auto [group, done] = start_group(o, end, o.group_end[end], c);
    pre.group = std::move(group);
    pre.done = std::move(done);
    pre.order = &o;
    pre.end = o.group_end[end];
  };
  // A pass that begins finds nothing of an earlier one (a pass that did not reach its last Linear, such as
  // a forward without a training-only module, may have left its group; the shards may have changed since).
  auto at = order.position.find(&w);
  if (order.learned && at != order.position.end() && at->second == 0 && !pre.group.has(&w)) {
    s->current = {};
    pre = {};
  }
  if (!s->current.has(&w)) {
    s->current = {};  // freed before the next group lands
    if (pre.group.has(&w)) {
      s->current = std::move(pre.group);
      s->current.raw = pre.done.wait();
      const OverlapState::Order* from = pre.order;
      const size_t end = pre.end;
      pre = {};
      start_after(*from, end);
    } else {
      pre = {};  // a prefetch this pass did not use (another path through the model) is waited for and dropped
      if (!order.learned || at == order.position.end() || data_dim(w) < 0) {  // the order is being learned: this Linear alone
        return {gather_data_values(w.value, w, c), b ? gather_data_values(b->value, *b, c) : Tensor()};
      }
      const size_t end = order.group_end[at->second];
      auto [group, done] = start_group(order, at->second, end, c);
      s->current = std::move(group);
      s->current.raw = done.wait();
      start_after(order, end);
    }
  }
  Tensor wf = unpack(s->current, w);
  Tensor bf = !b ? Tensor() : s->current.has(b) ? unpack(s->current, *b) : gather_data_values(b->value, *b, c);
  // After the pass's last Linear nothing it gathered is kept: the next pass starts afresh.
  if (order.learned && at != order.position.end() && at->second + 1 == order.uses.size()) {
    s->current = {};
    pre = {};
  }
  return {wf, bf};
}

// A gradient of the whole `p` reduce-scattered onto its shard in the background (overlap on), added to
// the shard's .grad by finish_gradients or when a later layer's sums start. Returns false when it must
// take the blocking path (no single data dim).
bool reduce_in_background(OverlapState& s, const Tensor& grad, const nn::Parameter& p, const Tensor& shard,
                          bool accumulate, const RankContext& c) {
  const int d = data_dim(p);
  if (d < 0) return false;
  OverlapState::GradSum sum;
  sum.parts.push_back({shard, accumulate, 0});
  sum.sum = ops::start_reduce_scatter_values(grad, d, data_dim_group(p, d, c));
  s.grads.push_back(std::move(sum));
  return true;
}

// With the backward's order learned, the gradients of a block's Linears (and of the biases their forward
// gathers with them) go into one bucket, reduce-scattered in one call when the block's last Linear has
// added its own. Returns false for a gradient that takes the one-call path instead.
bool add_to_bucket(OverlapState& s, const nn::Parameter& p, const Tensor& whole, bool accumulate,
                   const nn::Parameter& weight, const RankContext& c) {
  const OverlapState::Order& o = s.backward;
  auto it = o.position.find(&weight);
  if (!o.learned || it == o.position.end() || o.group_end.size() != o.uses.size() || data_dim(weight) < 0) return false;
  const size_t end = o.group_end[it->second];
  OverlapState::GradBucket& k = s.bucket;
  if (!k.members.empty() && k.end != end) start_bucket_sum(s, c);  // a path the order did not foresee
  if (k.members.empty()) {
    size_t start = it->second;
    while (start > 0 && o.group_end[start - 1] == end) --start;
    static_cast<OverlapState::Packing&>(k) = pack_uses(o, start, end, c);
    k.end = end;
    k.added.assign(k.members.size(), 0);
    k.accumulate.assign(k.members.size(), 0);
    k.packed = Tensor::zeros({k.ranks * k.block});
  }
  const size_t m = k.index_of(&p);
  if (m == k.members.size()) return false;
  // Block r of the whole gradient on p's data dim goes to rank r's block of the bucket.
  const int d = data_dim(p);
  for (int64_t r = 0; r < k.ranks; ++r) {
    const Tensor part = ops::block_of(whole, d, r, k.ranks);
    std::memcpy(k.packed.data<float>() + r * k.block + k.offsets[m], part.data<float>(), part.nbytes());
  }
  k.added[m] = 1;
  k.accumulate[m] = accumulate ? 1 : 0;
  return true;
}

// Closes the bucket after the block's last Linear in the backward's order.
void close_bucket_after(OverlapState& s, const nn::Parameter& weight, const RankContext& c) {
  if (s.bucket.members.empty()) return;
  auto it = s.backward.position.find(&weight);
  if (it != s.backward.position.end() && it->second + 1 == s.bucket.end) start_bucket_sum(s, c);
}

void complete_grad_sum(OverlapState::GradSum& g) {
  Tensor sum = g.sum.wait();
  for (const OverlapState::GradPart& part : g.parts) {
    if (!part.accumulate) continue;
    const int64_t n = part.shard.numel();
    Tensor piece = sum.numel() == n ? sum.view(part.shard.shape()) : sum.slice(part.offset, n).view(part.shard.shape()).clone();
    Tensor current = part.shard.grad();
    if (!current.defined()) {
      Tensor shard = part.shard;
      shard.set_grad(piece);
    } else {
      ops::add_(current, piece);  // as backward() accumulates a leaf's gradients
    }
  }
}


// y = x W^T (+ b) with W (and b) split over data: W is gathered for the forward and freed when it
// returns, gathered again in the backward and freed after it, so a whole weight lives only while its
// layer computes (FSDP). x: [..., in] -> [..., out]; dW is reduce-scattered onto the shard.
Tensor fsdp_linear(const Tensor& x, const nn::Parameter& weight, const nn::Parameter* bias,
                   ops::MatmulPrecision precision) {
  const RankContext& c = *weight.dist;
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    const auto [w_full, b_full] = gather_layer(weight, bias, c, /*backward_pass=*/false);  // freed on return
    y = ops::linear(x, w_full, b_full, ops::WeightLayout::OutIn, precision);
  }
  const Tensor w_shard = weight.value;
  const nn::Parameter* w = &weight;
  const nn::Parameter* b = bias;
  TensorList inputs{x, w_shard};
  if (bias) inputs.push_back(bias->value);
  autograd::record("fsdp_linear", inputs, {y}, [x, w_shard, w, b](const autograd::BackwardContext& ctx) {
    const RankContext& c = *w->dist;
    const Tensor& dy = ctx.grad_output(0);
    const int64_t in = x.size(-1), out = dy.size(-1), M = x.numel() / in;
    const Tensor dy2 = dy.view({M, out}), x2 = x.detach().view({M, in});
    TensorList grads(b ? 3 : 2);
    // The gather runs on every rank whatever needs_input_grad says: collectives must match up.
    const Tensor w_full = gather_layer(*w, nullptr, c, /*backward_pass=*/true).first;  // [out, in], freed on return
    if (ctx.needs_input_grad(0)) grads[0] = ops::matmul(dy2, w_full).view(x.shape());       // dx = dy W
    const Tensor dW = ops::matmul(dy2, x2, /*transpose_a=*/true);                           // dW = dy^T x
    Tensor db;
    if (b) {
      db = Tensor::zeros({out});
      const float* g = dy2.data<float>();
      float* acc = db.data<float>();
      for (int64_t r = 0; r < M; ++r) {
        for (int64_t j = 0; j < out; ++j) acc[j] += g[r * out + j];
      }
    }
    // With overlap, the sums onto the shards run while the layers before this one compute their
    // backward; their results reach .grad in finish_gradients (the engine gets none here).
    OverlapState* s = overlap_of(c);
    const size_t before = s ? s->grads.size() : 0;
    const bool bucketed = s && add_to_bucket(*s, *w, dW, ctx.needs_input_grad(1), *w, c);
    if (!bucketed && (!s || !reduce_in_background(*s, dW, *w, w_shard, ctx.needs_input_grad(1), c))) {
      grads[1] = scatter_data_values(dW, *w, c);
    }
    if (b && !(s && add_to_bucket(*s, *b, db, ctx.needs_input_grad(2), *w, c)) &&
        (!s || !reduce_in_background(*s, db, *b, b->value, ctx.needs_input_grad(2), c))) {
      grads[2] = scatter_data_values(db, *b, c);
    }
    if (s) close_bucket_after(*s, *w, c);
    // Keep in flight only this layer's sums, or the newest block's bucket until the next one starts;
    // none after the pass's last Linear (nothing whole outlives its backward into the next forward).
    if (s) {
      auto at = s->backward.position.find(w);
      const bool last = bucketed && at != s->backward.position.end() && at->second + 1 == s->backward.uses.size();
      complete_grad_sums(*s, last ? 0 : bucketed ? std::min<size_t>(s->grads.size(), 1) : s->grads.size() - before);
    }
    return grads;
  });
  return y;
}

}  // namespace

OverlapState* overlap_of(const RankContext& c) { return c.overlap ? c.overlap_state.get() : nullptr; }

// The open bucket's reduce-scatter started (the members that did not add a gradient, on a path the
// order did not foresee, were packed as zeros and are not added to anything).
void start_bucket_sum(OverlapState& s, const RankContext& c) {
  OverlapState::GradBucket& k = s.bucket;
  if (k.members.empty()) return;
  OverlapState::GradSum sum;
  for (size_t m = 0; m < k.members.size(); ++m) {
    if (k.added[m]) sum.parts.push_back({k.members[m]->value, k.accumulate[m] != 0, k.offsets[m]});
  }
  const Group group = packing_group(k, c);
  Tensor out = Tensor::empty({k.block});
  Tensor packed = k.packed;
  Communicator* comm = group.comm;
  auto work = comm->start_reduce_scatter_sum(packed.data<float>(), k.block, out.data<float>(), group.ranks);
  sum.sum = ops::StartedCollective([comm, work, packed, out] {
    comm->wait(work);
    return out;
  });
  s.grads.push_back(std::move(sum));
  k = {};
}


// By now the older sums have had a layer's backward to run; completing them bounds the whole-size
// gradients alive.
void complete_grad_sums(OverlapState& s, size_t keep) {
  while (s.grads.size() > keep) {
    complete_grad_sum(s.grads.front());
    s.grads.pop_front();
  }
}

bool is_split_over(const nn::Parameter& p, MeshAxis axis) { return p.spec.splits_over(axis); }

Tensor data_gathered_value(const nn::Parameter& p) {
  LOOM_ASSERT(p.dist, "data_gathered_value: '", p.name, "' is not sharded");
  return gather_data_dims(p.value, p, *p.dist);
}

Tensor enter_tensor_split(const Tensor& x, const nn::Parameter& p) {
  if (!p.dist || !is_split_over(p, MeshAxis::Tensor)) return x;
  return ops::copy_to_group(x, p.dist->group(MeshAxis::Tensor));
}

Tensor leave_tensor_split(const Tensor& y, const nn::Parameter& p) {
  if (!p.dist || !is_split_over(p, MeshAxis::Tensor)) return y;
  return ops::all_reduce(y, p.dist->group(MeshAxis::Tensor));
}

Tensor gathered_value(const nn::Parameter& p) {
  LOOM_ASSERT(p.dist, "gathered_value: '", p.name, "' is not sharded");
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    LOOM_ASSERT(!axis_of(p, d).has(MeshAxis::Expert) || is_data_dim(p, d), "gathered_value: '", p.name,
                "' is split over the expert axis; its layer computes on its own experts (nn/expert_parallel.h)");
  }
  const RankContext& c = *p.dist;
  Tensor t = gather_data_dims(p.value, p, c);  // FSDP dims, (data, expert) ones included
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (axis_of(p, d) == DimSplit(MeshAxis::Tensor)) t = ops::gather_replicated(t, d, c.group(MeshAxis::Tensor));
  }
  return t;
}

Tensor sharded_linear(const Tensor& x, const nn::Parameter& weight, const nn::Parameter* bias,
                      ops::MatmulPrecision precision) {
  const RankContext& c = *weight.dist;
  const bool column = weight.group == nn::ParamGroup::DenseIn && axis_of(weight, 0) == DimSplit(MeshAxis::Tensor);
  const bool row = weight.group == nn::ParamGroup::DenseOut && axis_of(weight, 1) == DimSplit(MeshAxis::Tensor);
  const bool fsdp = has_data_dim(weight);
  if (!column && !row) {  // nothing computed on tensor shards: FSDP's gather-compute-free, or a plain Linear
    if (fsdp) return fsdp_linear(x, weight, bias, precision);
    return ops::linear(x, gathered_value(weight), bias ? gathered_value(*bias) : Tensor(), ops::WeightLayout::OutIn,
                       precision);
  }
  // The local product, gathering FSDP dims around it when there are any: [out/t, in] or [out, in/t].
  auto local_linear = [&](const Tensor& in, const nn::Parameter* b) {
    if (fsdp) return fsdp_linear(in, weight, b, precision);
    return ops::linear(in, weight.value, b ? b->value : Tensor(), ops::WeightLayout::OutIn, precision);
  };
  const Group tensor = c.group(MeshAxis::Tensor);
  if (column) {
    // x: [..., C] replicated over tensor -> y: [..., out/t]. f: the input's gradient sums the ranks' parts.
    LOOM_ASSERT(!bias || !has_data_dim(*bias) || fsdp, "a column-parallel bias is never split over data");
    return local_linear(ops::copy_to_group(x, tensor), bias);
  }
  // x: [..., in/t] (this rank's heads or d_ff slice) -> partial [..., out], summed over tensor (g).
  Tensor y = ops::all_reduce(local_linear(x, nullptr), tensor);
  return bias ? add_bias(y, gather_data_dims(bias->value, *bias, c)) : y;
}

std::vector<ParamInfo> param_infos(const std::vector<nn::Parameter*>& params) {
  std::vector<ParamInfo> out;
  out.reserve(params.size());
  for (const nn::Parameter* p : params) out.push_back({p->name, p->global_shape, p->group});
  return out;
}

}  // namespace loom::dist
