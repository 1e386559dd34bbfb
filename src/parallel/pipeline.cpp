#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>
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

void plan_pipeline(models::LanguageModel& model, const RankContext& c) {
  const int64_t P = c.mesh.pipe, L = model.pipeline_layers();
  LOOM_CHECK(L > 0, "the pipe axis cannot cut model family ", model.arch(),
             " into stages (it runs llama, gpt2 and deepseek_v3): use a mesh without pipe");
  LOOM_CHECK(P <= L, "pipe=", P, " needs at least as many blocks, but the model has ", L,
             " (model.num_layers): use pipe <= ", L);
  LOOM_CHECK(c.pipe_schedule == "1f1b" || c.pipe_schedule == "gpipe", "unknown pipeline schedule \"", c.pipe_schedule,
             "\": expected 1f1b or gpipe");
  if (c.pipe_bounds.empty()) c.pipe_bounds = estimated_stage_bounds(model, P);
  const auto& b = c.pipe_bounds;
  LOOM_CHECK(static_cast<int64_t>(b.size()) == P + 1 && b.front() == 0 && b.back() == L, "pipeline: ", b.size(),
             " stage bounds for pipe=", P, " and ", L, " blocks");
  for (size_t s = 0; s + 1 < b.size(); ++s) LOOM_CHECK(b[s] < b[s + 1], "pipeline: stage ", s, " holds no block");
  for (nn::Parameter* p : model.parameters()) {
    const int64_t block = block_of(p->name);
    p->pipe_stages.clear();
    if (block >= 0 && block < L) {
      p->pipe_stages.push_back(static_cast<int>(stage_of_block(b, block)));
      continue;
    }
    const int ends = model.pipeline_ends(*p);
    if (ends & 1) p->pipe_stages.push_back(0);
    if (ends & 2) p->pipe_stages.push_back(static_cast<int>(P - 1));  // P > 1: never stage 0 again
  }
}

std::vector<std::pair<bool, int64_t>> pipeline_order(const std::string& schedule, int64_t stages, int64_t stage,
                                                     int64_t micro) {
  std::vector<std::pair<bool, int64_t>> order;
  if (schedule == "gpipe") {
    for (int64_t m = 0; m < micro; ++m) order.emplace_back(true, m);
    for (int64_t m = 0; m < micro; ++m) order.emplace_back(false, m);
    return order;
  }
  LOOM_CHECK(schedule == "1f1b", "unknown pipeline schedule \"", schedule, "\": expected 1f1b or gpipe");
  const int64_t warmup = std::min(stages - stage - 1, micro);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) order.emplace_back(true, f);
  for (; f < micro; ++f, ++b) {
    order.emplace_back(true, f);
    order.emplace_back(false, b);
  }
  for (; b < micro; ++b) order.emplace_back(false, b);
  return order;
}

double ideal_bubble(int64_t stages, int64_t micro) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro + stages - 1);
}

double pipeline_step(const models::LanguageModel& model, const std::vector<nn::Parameter*>& params,
                     const std::vector<MicroBatch>& micro, const RankContext& c, PipelineTiming* timing) {
  const auto start = Clock::now();
  const int64_t P = c.mesh.pipe, s = c.coord(MeshAxis::Pipe), M = static_cast<int64_t>(micro.size());
  LOOM_CHECK(M >= 1, "pipeline_step: no micro-batches");
  LOOM_ASSERT(static_cast<int64_t>(c.pipe_bounds.size()) == P + 1, "pipeline_step: the model was not planned for pipe=", P);
  const int64_t first = c.pipe_bounds[static_cast<size_t>(s)], last = c.pipe_bounds[static_cast<size_t>(s + 1)];
  const int64_t C = d_model_of(model);
  const int prev = s > 0 ? stage_rank(c, s - 1) : -1, next = s + 1 < P ? stage_rank(c, s + 1) : -1;
  struct InFlight {
    Tensor in, out;  // the received activations (a leaf) and what this stage made of them
    Tensor aux;      // a scalar the stage's blocks add to the objective (DeepSeek-V3's balance loss), or undefined
  };
  std::vector<InFlight> held(static_cast<size_t>(M));
  std::vector<double> losses(static_cast<size_t>(M), 0.0);
  double busy = 0;
  int64_t in_flight = 0, peak = 0;
  bool has_aux = false;  // a stage before the last whose blocks add to the loss (the same on the stage's ranks)
  for (const auto& [forward, m] : pipeline_order(c.pipe_schedule, P, s, M)) {
    const MicroBatch& mb = micro[static_cast<size_t>(m)];
    InFlight& h = held[static_cast<size_t>(m)];
    const Shape act{mb.ids.size(0), mb.ids.size(1), C};  // [b, T, C]
    if (forward) {
      if (prev >= 0) {
        h.in = Tensor::empty(act);
        c.comm->recv(h.in.data<float>(), h.in.numel(), prev);
        h.in.set_requires_grad();
      }
      const auto t0 = Clock::now();
      h.out = model.stage_forward(first, last, h.in, mb.ids, mb.targets, mb.ctx, &h.aux);
      busy += since(t0);
      if (next >= 0) {
        LOOM_CHECK(h.out.shape() == act, "pipeline: stage ", s, " made ", h.out.describe(), ", expected ", act);
        c.comm->send(payload(h.out, "activations"), h.out.numel(), next);
        if (h.aux.defined()) {
          losses[static_cast<size_t>(m)] = h.aux.item();
          has_aux = true;
        }
      } else {
        losses[static_cast<size_t>(m)] = h.out.item();
      }
      peak = std::max(peak, ++in_flight);
      continue;
    }
    Tensor objective;
    if (next < 0) {
      objective = M > 1 ? ops::scale(h.out, 1.0f / static_cast<float>(M)) : h.out;  // the trainer's mean
    } else {
      Tensor g = Tensor::empty(act);
      c.comm->recv(g.data<float>(), g.numel(), next);
      objective = ops::sum(ops::mul(h.out, g));  // d objective / d out = g, exactly
      // The stage's own terms of the loss, weighted like the last stage's loss: 1 / micro-batches.
      if (h.aux.defined()) objective = ops::add(objective, M > 1 ? ops::scale(h.aux, 1.0f / static_cast<float>(M)) : h.aux);
    }
    const auto t0 = Clock::now();
    backward(objective, params, c, m + 1 == M);
    busy += since(t0);
    if (prev >= 0) c.comm->send(payload(h.in.grad(), "activation gradient"), h.in.numel(), prev);
    h = {};
    --in_flight;
  }
  c.comm->complete_sends();
  // The loss: the last stage's ranks hold it, and the earlier stages their blocks' own terms (if any);
  // each micro-batch's is the mean over the ranks that split the batch (inside the stage), then the
  // stages' sums are added (for llama and gpt2 the others add zeros: exact).
  double sum = 0;
  if (next < 0 || has_aux) {
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
  const int64_t P = c.mesh.pipe, s = c.coord(MeshAxis::Pipe);
  const int64_t first = c.pipe_bounds[static_cast<size_t>(s)], last = c.pipe_bounds[static_cast<size_t>(s + 1)];
  Tensor in;
  if (s > 0) {
    in = Tensor::empty({ids.size(0), ids.size(1), d_model_of(model)});
    c.comm->recv(in.data<float>(), in.numel(), stage_rank(c, s - 1));
  }
  Tensor out = model.stage_forward(first, last, in, ids, targets, {}, nullptr);
  double loss = 0;
  if (s + 1 < P) {
    c.comm->send(payload(out, "activations"), out.numel(), stage_rank(c, s + 1));
    c.comm->complete_sends();
  } else {
    loss = global_loss(out.item(), c);
  }
  c.comm->all_reduce_sum(&loss, 1, c.mesh.group(c.rank, MeshAxis::Pipe));
  return loss;
}

}  // namespace loom::dist
