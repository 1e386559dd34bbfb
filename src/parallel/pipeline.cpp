#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <tuple>
#include <limits>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/elementwise.h"
#include "parallel/runtime.h"

namespace loom::dist {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The block a parameter belongs to ("layers.<i>.…"), or -1.
int64_t block_of(const std::string& name) {
  const std::string prefix = "layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t end = prefix.size();
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == prefix.size() || end >= name.size() || name[end] != '.') return -1;
  return std::stoll(name.substr(prefix.size(), end - prefix.size()));
}

int64_t stage_of_block(const std::vector<int64_t>& bounds, int64_t block) {
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    if (block < bounds[s + 1]) return static_cast<int64_t>(s);
  }
  LOOM_FAIL("pipeline: block ", block, " lies past the last stage's bound ", bounds.back());
}

// The rank at pipe coordinate `stage` with this rank's data, tensor and expert coordinates: the pipe
// axis is outermost, so stages sit one data x expert x tensor mesh apart.
int stage_rank(const RankContext& c, int64_t stage) {
  const int64_t stride = c.mesh.data * c.mesh.expert * c.mesh.tensor;
  return static_cast<int>(c.rank + (stage - c.coord(MeshAxis::Pipe)) * stride);
}

// The rank running virtual stage `vs` (chunk vs / pipe on pipe coordinate vs % pipe) with this rank's
// other coordinates.
int vstage_rank(const RankContext& c, int64_t vs) { return stage_rank(c, vs % c.mesh.pipe); }

int64_t d_model_of(const models::LanguageModel& model) {
  const auto& j = model.model_config().json();
  LOOM_CHECK(j.contains("d_model"), "pipeline: model family ", model.arch(), " has no model.d_model");
  return j.at("d_model").get<int64_t>();
}

// The payload of an activation or its gradient: f32, contiguous (every loom tensor is).
const float* payload(const Tensor& t, const char* what) {
  LOOM_CHECK(t.defined() && t.dtype() == DType::F32, "pipeline: the ", what, " sent between stages must be f32, got ",
             t.defined() ? t.describe() : std::string("nothing"));
  return t.data<float>();
}

}  // namespace

std::vector<int64_t> balanced_stage_bounds(const std::vector<double>& block_cost, double first_cost, double last_cost,
                                           int64_t stages) {
  const int64_t L = static_cast<int64_t>(block_cost.size());
  LOOM_CHECK(stages >= 1 && stages <= L, "pipe=", stages, " needs at least as many blocks, but the model has ", L,
             " (model.num_layers): use pipe <= ", L);
  std::vector<double> prefix(static_cast<size_t>(L + 1), 0.0);
  for (int64_t i = 0; i < L; ++i) prefix[static_cast<size_t>(i + 1)] = prefix[static_cast<size_t>(i)] + block_cost[static_cast<size_t>(i)];
  auto cost = [&](int64_t s, int64_t a, int64_t b) {  // stage s holding blocks [a, b)
    double c = prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)];
    if (s == 0) c += first_cost;
    if (s == stages - 1) c += last_cost;
    return c;
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][b]: the smallest largest-stage cost of stages 0..s holding blocks [0, b); cut[s][b] where s starts.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages), std::vector<double>(static_cast<size_t>(L + 1), inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(stages), std::vector<int64_t>(static_cast<size_t>(L + 1), 0));
  for (int64_t b = 1; b <= L; ++b) best[0][static_cast<size_t>(b)] = cost(0, 0, b);
  for (int64_t s = 1; s < stages; ++s) {
    for (int64_t b = s + 1; b <= L; ++b) {
      for (int64_t a = s; a < b; ++a) {  // ties go to the earliest cut: stable, and the front stages lighter
        const double v = std::max(best[static_cast<size_t>(s - 1)][static_cast<size_t>(a)], cost(s, a, b));
        if (v < best[static_cast<size_t>(s)][static_cast<size_t>(b)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(b)] = v;
          cut[static_cast<size_t>(s)][static_cast<size_t>(b)] = a;
        }
      }
    }
  }
  std::vector<int64_t> bounds(static_cast<size_t>(stages + 1), 0);
  bounds[static_cast<size_t>(stages)] = L;
  for (int64_t s = stages - 1; s >= 1; --s) {
    bounds[static_cast<size_t>(s)] = cut[static_cast<size_t>(s)][static_cast<size_t>(bounds[static_cast<size_t>(s + 1)])];
  }
  return bounds;
}

std::vector<int64_t> estimated_stage_bounds(models::LanguageModel& model, int64_t stages) {
  const int64_t L = model.pipeline_layers();
  std::vector<double> cost(static_cast<size_t>(L), 0.0);
  double last = 0;
  for (nn::Parameter* p : model.parameters()) {
    const int64_t b = block_of(p->name);
    const double n = static_cast<double>(p->global_shape.numel());
    if (b >= 0 && b < L) {
      cost[static_cast<size_t>(b)] += n;
    } else if (b < 0 && (model.pipeline_ends(*p) & 2) != 0 && p->global_shape.ndim() == 2) {
      last += n;  // the head (a tied table's lookup on the first stage costs nothing)
    }
  }
  return balanced_stage_bounds(cost, 0.0, last, stages);
}

std::vector<int64_t> stage_bounds_from_counts(const std::string& counts, int64_t layers, int64_t stages) {
  std::vector<int64_t> bounds{0};
  std::stringstream ss(counts);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int64_t n = 0;
    size_t used = 0;
    try {
      n = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CHECK(used == part.size() && !part.empty() && n >= 1, "parallel.pipe_layers=\"", counts, "\": \"", part,
               "\" is not a positive block count (expected one count per stage, like 3,1)");
    bounds.push_back(bounds.back() + n);
  }
  LOOM_CHECK(static_cast<int64_t>(bounds.size()) - 1 == stages, "parallel.pipe_layers=\"", counts, "\" lists ",
             bounds.size() - 1, " stages, but the mesh has pipe=", stages);
  LOOM_CHECK(bounds.back() == layers, "parallel.pipe_layers=\"", counts, "\" holds ", bounds.back(),
             " blocks, but the model has ", layers, " (model.num_layers)");
  return bounds;
}

void check_pipe_schedule(const std::string& schedule, int64_t chunks, int64_t stages, int64_t micro) {
  LOOM_CHECK(schedule == "1f1b" || schedule == "gpipe" || schedule == "interleaved", "unknown pipeline schedule \"",
             schedule, "\": expected 1f1b, gpipe or interleaved");
  if (schedule != "interleaved") {
    LOOM_CHECK(chunks == 1, "parallel.virtual_stages=", chunks, " needs parallel.schedule \"interleaved\", not \"",
               schedule, "\"");
    return;
  }
  LOOM_CHECK(chunks >= 2, "the interleaved schedule needs parallel.virtual_stages >= 2 (stages per rank), got ", chunks);
  LOOM_CHECK(micro <= 0 || micro % stages == 0, "the interleaved schedule runs micro-batches in groups of pipe=",
             stages, ": training.grad_accum_steps=", micro, " is not a multiple of it");
}

void plan_pipeline(models::LanguageModel& model, const RankContext& c) {
  const int64_t P = c.mesh.pipe, v = c.pipe_chunks, V = P * v, L = model.pipeline_layers();
  LOOM_CHECK(L > 0, "the pipe axis cannot cut model family ", model.arch(),
             " into stages (it runs llama, gpt2 and deepseek_v3): use a mesh without pipe");
  check_pipe_schedule(c.pipe_schedule, v, P);
  LOOM_CHECK(V <= L, "pipe=", P, v > 1 ? str(" x virtual_stages=", v) : std::string(),
             " needs at least as many blocks, but the model has ", L, " (model.num_layers): use pipe <= ", L / v);
  if (c.pipe_bounds.empty()) c.pipe_bounds = estimated_stage_bounds(model, V);
  const auto& b = c.pipe_bounds;
  LOOM_CHECK(static_cast<int64_t>(b.size()) == V + 1 && b.front() == 0 && b.back() == L, "pipeline: ", b.size(),
             " stage bounds for ", V, " stages and ", L, " blocks");
  for (size_t s = 0; s + 1 < b.size(); ++s) LOOM_CHECK(b[s] < b[s + 1], "pipeline: stage ", s, " holds no block");
  for (nn::Parameter* p : model.parameters()) {
    const int64_t block = block_of(p->name);
    p->pipe_stages.clear();
    if (block >= 0 && block < L) {
      p->pipe_stages.push_back(static_cast<int>(stage_of_block(b, block) % P));
      continue;
    }
    const int ends = model.pipeline_ends(*p);
    if (ends & 1) p->pipe_stages.push_back(0);
    if (ends & 2) p->pipe_stages.push_back(static_cast<int>(P - 1));  // P > 1: never stage 0 again
  }
}

std::vector<PipeStep> pipeline_order(const std::string& schedule, int64_t stages, int64_t stage, int64_t micro,
                                     int64_t chunks) {
  check_pipe_schedule(schedule, chunks, stages, micro);
  std::vector<PipeStep> order;
  if (schedule == "gpipe") {
    for (int64_t m = 0; m < micro; ++m) order.push_back({true, 0, m});
    for (int64_t m = 0; m < micro; ++m) order.push_back({false, 0, m});
    return order;
  }
  if (schedule == "1f1b") {
    const int64_t warmup = std::min(stages - stage - 1, micro);
    int64_t f = 0, b = 0;
    for (; f < warmup; ++f) order.push_back({true, 0, f});
    for (; f < micro; ++f, ++b) {
      order.push_back({true, 0, f});
      order.push_back({false, 0, b});
    }
    for (; b < micro; ++b) order.push_back({false, 0, b});
    return order;
  }
  // Interleaved, Megatron-LM's order: the k-th forward runs micro-batch (k / (P v)) P + k % P on chunk
  // (k % (P v)) / P: P micro-batches through chunk 0, the same P through chunk 1, ..., then the next
  // P; the k-th backward the same with the chunks from the last. Warm-up: 2 (P - s - 1) + (v - 1) P
  // forwards, then one forward and one backward alternate, then the remaining backwards.
  const int64_t P = stages, v = chunks, total = micro * v;
  auto step = [&](int64_t k, bool forward) {
    const int64_t chunk = (k % (P * v)) / P;
    return PipeStep{forward, forward ? chunk : v - 1 - chunk, (k / (P * v)) * P + k % P};
  };
  const int64_t warmup = std::min(total, 2 * (P - stage - 1) + (v - 1) * P);
  for (int64_t k = 0; k < warmup; ++k) order.push_back(step(k, true));
  for (int64_t k = 0; k + warmup < total; ++k) {
    order.push_back(step(k + warmup, true));
    order.push_back(step(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.push_back(step(k, false));
  return order;
}

double ideal_bubble(int64_t stages, int64_t micro, int64_t chunks) {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * micro + stages - 1);
}

namespace {

// What a rank receives from its pipe neighbours in one step, in the order they send it. A neighbour's
// sends to this rank follow its schedule, which this rank knows; under interleaved 1F1B (and with two
// stages, where one neighbour sends both activations and gradients) that is not the order this rank
// wants them in, so a message that arrives early waits in `early`. The transport keeps each pair's
// messages in send order, so nothing is received later than it would be in order: no new waits.
class Inbox {
 public:
  // A message: activations (gradient false) for, or a gradient for the output of, this rank's `chunk`.
  struct Key {
    bool gradient;
    int64_t chunk, micro;
    bool operator<(const Key& o) const {
      return std::tie(gradient, chunk, micro) < std::tie(o.gradient, o.chunk, o.micro);
    }
  };

  Inbox(const RankContext& c, int64_t micro, std::function<Shape(int64_t)> shape_of)
      : c_(c), shape_of_(std::move(shape_of)) {
    const int64_t P = c.mesh.pipe, v = c.pipe_chunks, V = P * v, me = c.coord(MeshAxis::Pipe);
    for (int64_t src = 0; src < P; ++src) {
      if (src == me) continue;
      for (const PipeStep& st : pipeline_order(c.pipe_schedule, P, src, micro, v)) {
        const int64_t vs = st.chunk * P + src;
        if (st.forward && vs + 1 < V && (vs + 1) % P == me) sent_[src].push_back({false, (vs + 1) / P, st.micro});
        if (!st.forward && vs > 0 && (vs - 1) % P == me) sent_[src].push_back({true, (vs - 1) / P, st.micro});
      }
    }
  }

  // The message `key` from pipe coordinate `src`.
  Tensor take(int64_t src, const Key& key) {
    for (;;) {
      if (auto it = early_.find(key); it != early_.end()) {
        Tensor t = std::move(it->second);
        early_.erase(it);
        return t;
      }
      auto& queue = sent_[src];
      size_t& next = next_[src];
      LOOM_ASSERT(next < queue.size(), "pipeline: stage ", src, " sends no more messages, but one is expected");
      const Key k = queue[next++];
      Tensor t = Tensor::empty(shape_of_(k.micro));
      c_.comm->recv(t.data<float>(), t.numel(), stage_rank(c_, src));
      if (!(k < key) && !(key < k)) return t;
      early_.emplace(k, std::move(t));
    }
  }

 private:
  const RankContext& c_;
  std::function<Shape(int64_t)> shape_of_;
  std::map<int64_t, std::vector<Key>> sent_;
  std::map<int64_t, size_t> next_;
  std::map<Key, Tensor> early_;
};

}  // namespace

double pipeline_step(const models::LanguageModel& model, const std::vector<nn::Parameter*>& params,
                     const std::vector<MicroBatch>& micro, const RankContext& c, PipelineTiming* timing) {
  const auto start = Clock::now();
  const int64_t P = c.mesh.pipe, v = c.pipe_chunks, V = P * v, s = c.coord(MeshAxis::Pipe);
  const int64_t M = static_cast<int64_t>(micro.size());
  LOOM_CHECK(M >= 1, "pipeline_step: no micro-batches");
  LOOM_ASSERT(static_cast<int64_t>(c.pipe_bounds.size()) == V + 1, "pipeline_step: the model was not planned for ",
              V, " stages");
  const int64_t C = d_model_of(model);
  auto act_shape = [&](int64_t m) {  // [b, T, C]
    const MicroBatch& mb = micro[static_cast<size_t>(m)];
    return Shape{mb.ids.size(0), mb.ids.size(1), C};
  };
  Inbox inbox(c, M, act_shape);
  struct InFlight {
    Tensor in, out;  // the received activations (a leaf) and what this stage made of them
    Tensor aux;      // a scalar the stage's blocks add to the objective (DeepSeek-V3's balance loss), or undefined
  };
  std::vector<InFlight> held(static_cast<size_t>(M * v));
  std::vector<double> losses(static_cast<size_t>(M), 0.0);
  double busy = 0;
  int64_t in_flight = 0, peak = 0;
  bool has_loss = false;  // this rank's stages add to the loss (the same on the stage's ranks)
  for (const PipeStep& st : pipeline_order(c.pipe_schedule, P, s, M, v)) {
    const int64_t m = st.micro, vs = st.chunk * P + s;
    const int64_t first = c.pipe_bounds[static_cast<size_t>(vs)], last = c.pipe_bounds[static_cast<size_t>(vs + 1)];
    const int prev = vs > 0 ? vstage_rank(c, vs - 1) : -1, next = vs + 1 < V ? vstage_rank(c, vs + 1) : -1;
    const MicroBatch& mb = micro[static_cast<size_t>(m)];
    InFlight& h = held[static_cast<size_t>(st.chunk * M + m)];
    const Shape act = act_shape(m);
    if (st.forward) {
      if (prev >= 0) {
        h.in = inbox.take((vs - 1) % P, {false, st.chunk, m});
        h.in.set_requires_grad();
      }
      const auto t0 = Clock::now();
      h.out = model.stage_forward(first, last, h.in, mb.ids, mb.targets, mb.ctx, &h.aux);
      busy += since(t0);
      if (next >= 0) {
        LOOM_CHECK(h.out.shape() == act, "pipeline: stage ", vs, " made ", h.out.describe(), ", expected ", act);
        c.comm->send(payload(h.out, "activations"), h.out.numel(), next);
        if (h.aux.defined()) {
          losses[static_cast<size_t>(m)] += h.aux.item();
          has_loss = true;
        }
      } else {
        losses[static_cast<size_t>(m)] += h.out.item();
        has_loss = true;
      }
      peak = std::max(peak, ++in_flight);
      continue;
    }
    Tensor objective;
    if (next < 0) {
      objective = M > 1 ? ops::scale(h.out, 1.0f / static_cast<float>(M)) : h.out;  // the trainer's mean
    } else {
      Tensor g = inbox.take((vs + 1) % P, {true, st.chunk, m});
      objective = ops::sum(ops::mul(h.out, g));  // d objective / d out = g, exactly
      // The stage's own terms of the loss, weighted like the last stage's loss: 1 / micro-batches.
      if (h.aux.defined()) objective = ops::add(objective, M > 1 ? ops::scale(h.aux, 1.0f / static_cast<float>(M)) : h.aux);
    }
    const auto t0 = Clock::now();
    // A chunk's last micro-batch makes its parameters' gradients final (each parameter belongs to one
    // chunk of this rank): their data-axis sums may start.
    backward(objective, params, c, m + 1 == M);
    busy += since(t0);
    if (prev >= 0) c.comm->send(payload(h.in.grad(), "activation gradient"), h.in.numel(), prev);
    h = {};
    --in_flight;
  }
  c.comm->complete_sends();
  // The loss: the rank running the last stage holds it, and the others their blocks' own terms (if
  // any); each micro-batch's is the mean over the ranks that split the batch (inside the stage), then
  // the stages' sums are added (for llama and gpt2 the others add zeros: exact).
  double sum = 0;
  if (has_loss) {
    for (double l : losses) sum += global_loss(l, c);
  }
  if (P > 1) c.comm->all_reduce_sum(&sum, 1, c.mesh.group(c.rank, MeshAxis::Pipe));
  if (timing) {
    timing->seconds = since(start);
    timing->busy_seconds = busy;
    timing->peak_in_flight = peak;
  }
  return sum;
}

void finish_pipe_gradients(const std::vector<nn::Parameter*>& params, const RankContext& c) {
  const int s = static_cast<int>(c.coord(MeshAxis::Pipe));
  for (nn::Parameter* p : params) {
    if (p->pipe_stages.size() < 2) continue;
    if (std::find(p->pipe_stages.begin(), p->pipe_stages.end(), s) == p->pipe_stages.end()) continue;
    Tensor g = p->value.grad();
    LOOM_CHECK(g.defined(), "pipeline: parameter '", p->name, "' is used by stage ", s, " but has no gradient");
    std::vector<int> group;
    for (int stage : p->pipe_stages) group.push_back(stage_rank(c, stage));  // ascending: the same sum on each
    c.comm->all_reduce_sum(g.data<float>(), g.numel(), group);
  }
}

double pipeline_loss(const models::LanguageModel& model, const Tensor& ids, const Tensor& targets,
                     const RankContext& c) {
  autograd::NoGradGuard no_grad;
  const int64_t P = c.mesh.pipe, V = P * c.pipe_chunks, s = c.coord(MeshAxis::Pipe);
  double loss = 0;
  for (int64_t vs = s; vs < V; vs += P) {  // this rank's chunks, in order: each waits for the one before
    const int64_t first = c.pipe_bounds[static_cast<size_t>(vs)], last = c.pipe_bounds[static_cast<size_t>(vs + 1)];
    Tensor in;
    if (vs > 0) {
      in = Tensor::empty({ids.size(0), ids.size(1), d_model_of(model)});
      c.comm->recv(in.data<float>(), in.numel(), vstage_rank(c, vs - 1));
    }
    Tensor out = model.stage_forward(first, last, in, ids, targets, {}, nullptr);
    if (vs + 1 < V) {
      c.comm->send(payload(out, "activations"), out.numel(), vstage_rank(c, vs + 1));
    } else {
      loss = global_loss(out.item(), c);
    }
  }
  c.comm->complete_sends();
  c.comm->all_reduce_sum(&loss, 1, c.mesh.group(c.rank, MeshAxis::Pipe));
  return loss;
}

}  // namespace loom::dist
