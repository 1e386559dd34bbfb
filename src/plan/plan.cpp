#include "plan/plan.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "parallel/pipeline.h"
#include "runs/memory.h"

namespace loom::plan {
using nlohmann::json;
using dist::ParamGroup;

namespace {

double key(const json& j, const char* k, double fallback = 0) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : fallback;
}
bool flag(const json& j, const char* k, bool fallback) {
  return j.contains(k) && j[k].is_boolean() ? j[k].get<bool>() : fallback;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    out.push_back(i);
    if (i != n / i) out.push_back(n / i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes >= 1024.0 * 1024 * 1024 ? "%.1f GiB" : "%.2f MiB",
                bytes >= 1024.0 * 1024 * 1024 ? bytes / (1024.0 * 1024 * 1024) : bytes / (1024.0 * 1024));
  return buf;
}

}  // namespace

// ---- the model's parameters ----------------------------------------------------------------------

std::vector<ParamCount> census(const models::ModelConfig& model) {
  const json& j = model.json();
  const std::string& arch = model.arch();
  const double V = key(j, "vocab_size"), C = key(j, "d_model"), L = key(j, "num_layers"), H = key(j, "num_heads");
  std::vector<ParamCount> out;
  auto add = [&](std::string name, ParamGroup g, int ndim, double count, int64_t layer, ParamGroup owner = ParamGroup::DenseIn) {
    out.push_back({std::move(name), g, owner, ndim, count, layer});
  };
  const int64_t layers = static_cast<int64_t>(L);
  if (arch == "gpt2") {
    const double T = key(j, "context_length"), F = key(j, "d_ff") > 0 ? key(j, "d_ff") : 4 * C;
    const bool qkv_bias = flag(j, "qkv_bias", true), out_bias = flag(j, "output_proj_bias", true);
    add("token_embeddings", ParamGroup::Embedding, 2, V * C, -1);
    add("position_embeddings", ParamGroup::Position, 2, T * C, -1);
    for (int64_t l = 0; l < layers; ++l) {
      add("ln1", ParamGroup::Norm, 1, 2 * C, l);
      add("q, k, v", ParamGroup::DenseIn, 2, 3 * C * C, l);
      if (qkv_bias) add("q, k, v bias", ParamGroup::Bias, 1, 3 * C, l, ParamGroup::DenseIn);
      add("output_proj", ParamGroup::DenseOut, 2, C * C, l);
      if (out_bias) add("output_proj bias", ParamGroup::Bias, 1, C, l, ParamGroup::DenseOut);
      add("ln2", ParamGroup::Norm, 1, 2 * C, l);
      add("fc", ParamGroup::DenseIn, 2, F * C, l);
      add("fc bias", ParamGroup::Bias, 1, F, l, ParamGroup::DenseIn);
      add("proj", ParamGroup::DenseOut, 2, C * F, l);
      add("proj bias", ParamGroup::Bias, 1, C, l, ParamGroup::DenseOut);
    }
    add("ln_final", ParamGroup::Norm, 1, 2 * C, layers);
    if (!flag(j, "tie_embeddings", true)) add("lm_head", ParamGroup::LmHead, 2, V * C, layers);
  } else if (arch == "deepseek_v3") {
    const double Q = key(j, "q_rank"), R = key(j, "kv_rank"), P = key(j, "d_rope"), N = key(j, "d_nope");
    const double Dv = key(j, "d_v"), F = key(j, "d_ff"), E = key(j, "n_routed"), De = key(j, "d_expert");
    const double S = key(j, "n_shared"), dense = key(j, "n_dense"), mtp = key(j, "n_mtp");
    auto block = [&](int64_t l, bool moe) {
      add("attn_norm", ParamGroup::Norm, 1, C, l);
      add("wq_a, wkv_a", ParamGroup::DenseInWhole, 2, Q * C + (R + P) * C, l);
      add("q_norm, kv_norm", ParamGroup::Norm, 1, Q + R, l);
      add("wq_b, wkv_b", ParamGroup::DenseIn, 2, H * (N + P) * Q + H * (N + Dv) * R, l);
      add("wo", ParamGroup::DenseOut, 2, C * H * Dv, l);
      add("ffn_norm", ParamGroup::Norm, 1, C, l);
      if (!moe) {
        add("mlp w1, w3", ParamGroup::DenseIn, 2, 2 * F * C, l);
        add("mlp w2", ParamGroup::DenseOut, 2, C * F, l);
        return;
      }
      add("router", ParamGroup::DenseInWhole, 2, E * C, l);
      if (S > 0) {
        add("shared w1, w3", ParamGroup::DenseIn, 2, 2 * S * De * C, l);
        add("shared w2", ParamGroup::DenseOut, 2, C * S * De, l);
      }
      add("experts w1, w3", ParamGroup::ExpertIn, 3, 2 * E * De * C, l);
      add("experts w2", ParamGroup::ExpertOut, 3, E * C * De, l);
    };
    add("token_embeddings", ParamGroup::Embedding, 2, V * C, -1);
    for (int64_t l = 0; l < layers; ++l) block(l, static_cast<double>(l) >= dense);
    for (int64_t k = 0; k < static_cast<int64_t>(mtp); ++k) {
      add("mtp norms", ParamGroup::Norm, 1, 2 * C, layers);
      add("mtp proj", ParamGroup::DenseInWhole, 2, 2 * C * C, layers);
      block(layers, false);
      out.back().layer = out[out.size() - 2].layer = layers;
    }
    add("ln_final", ParamGroup::Norm, 1, C, layers);
    add("lm_head", ParamGroup::LmHead, 2, V * C, layers);
  } else {  // llama
    const double kv = key(j, "num_kv_heads") > 0 ? key(j, "num_kv_heads") : H, F = key(j, "d_ff");
    const double K = kv * C / H;
    add("token_embeddings", ParamGroup::Embedding, 2, V * C, -1);
    for (int64_t l = 0; l < layers; ++l) {
      add("ln1, ln2", ParamGroup::Norm, 1, 2 * C, l);
      add("q, k, v", ParamGroup::DenseIn, 2, C * C + 2 * K * C, l);
      add("output_proj", ParamGroup::DenseOut, 2, C * C, l);
      add("w1, w3", ParamGroup::DenseIn, 2, 2 * F * C, l);
      add("w2", ParamGroup::DenseOut, 2, C * F, l);
    }
    add("ln_final", ParamGroup::Norm, 1, C, layers);
    add("lm_head", ParamGroup::LmHead, 2, V * C, layers);
  }
  return out;
}

// ---- layouts -----------------------------------------------------------------------------------

std::string Layout::str() const {
  std::string s = "data=" + std::to_string(data);
  if (tensor > 1) s += ",tensor=" + std::to_string(tensor);
  if (pipe > 1) s += ",pipe=" + std::to_string(pipe);
  if (expert > 1) s += ",expert=" + std::to_string(expert);
  s += " " + (shard == "none" ? std::string("dp") : shard);
  s += std::string(" ") + models::recompute_name(recompute);
  s += " m=" + std::to_string(micro_batches);
  if (pipe > 1) s += " " + schedule;
  if (pipe > 1 && virtual_stages > 1) s += " x" + std::to_string(virtual_stages);
  return s;
}

std::string Layout::loom_mode() const {
  if (shard == "zero1") return "";
  const bool fsdp = shard == "fsdp" && data > 1;
  if (expert > 1) return tensor > 1 ? "" : (fsdp || (shard == "fsdp" && data == 1)) ? "fsdp_ep" : "dp_ep";
  if (tensor > 1) return data == 1 ? "tp" : fsdp ? "fsdp_tp" : "";
  return fsdp ? "fsdp" : "dp";
}

namespace {

// What fraction of a parameter group one rank holds, as loom's partition specs split it (mesh/mesh.h),
// extended to the layouts loom does not run yet: tensor splits the Megatron groups, fsdp splits over data
// (data x expert for the dense groups under expert parallelism), expert splits the routed experts.
struct Split {
  double tensor = 1, shard = 1, expert = 1;
  double total() const { return tensor * shard * expert; }
};

Split split_of(const ParamCount& p, const Layout& l) {
  Split s;
  const ParamGroup g = p.group == ParamGroup::Bias ? p.owner : p.group;
  const bool fsdp = l.shard == "fsdp";
  const double dense_shard = static_cast<double>(l.data * l.expert);
  switch (g) {
    case ParamGroup::DenseIn:
    case ParamGroup::DenseOut:
      s.tensor = static_cast<double>(l.tensor);
      // A bias lives on its weight's output dim: a dense_in bias splits over tensor, a dense_out one over data.
      if (p.group == ParamGroup::Bias) {
        s.tensor = g == ParamGroup::DenseIn ? static_cast<double>(l.tensor) : 1;
        if (fsdp && g == ParamGroup::DenseOut) s.shard = dense_shard;
        break;
      }
      if (fsdp) s.shard = dense_shard;
      break;
    case ParamGroup::DenseInWhole:
      if (fsdp) s.shard = dense_shard;
      break;
    case ParamGroup::Embedding:
    case ParamGroup::LmHead:
    case ParamGroup::Position:
      s.tensor = static_cast<double>(l.tensor);
      break;
    case ParamGroup::ExpertIn:
    case ParamGroup::ExpertOut:
      s.expert = static_cast<double>(l.expert);
      s.tensor = l.expert > 1 ? 1 : static_cast<double>(l.tensor);
      if (fsdp) s.shard = static_cast<double>(l.data);
      break;
    default:
      break;
  }
  return s;
}

// Layers [first, last) of pipeline stage s: the layers split as evenly as they go, the extra ones to
// the middle stages (the first holds the embedding, the last the head).
std::pair<int64_t, int64_t> stage_layers(int64_t L, int64_t p, int64_t s) {
  const int64_t base = L / p, extra = L % p;
  // The extra layers go to stages 1..extra (or the first ones when p <= extra + 1).
  auto size = [&](int64_t k) { return base + ((p > 2 && k >= 1 && k <= extra) || (p <= 2 && k < extra) ? 1 : 0); };
  // The extra layers on the stages before s.
  const int64_t before = p > 2 ? std::clamp<int64_t>(s - 1, 0, extra) : std::min(s, extra);
  const int64_t first = s * base + before;
  return {first, first + size(s)};
}

struct Link {
  double bandwidth = 0, latency = 0;
  bool inter = false;
};

// Ranks are numbered tensor fastest, then expert, then data, then pipe (loom's mesh order, with pipe
// outermost): an axis whose span (its size times the axes inside it) fits in a node stays on NVLink.
Link link_for(const Request& r, int64_t inner, int64_t size) {
  const DeviceSpec& d = r.device;
  Link k;
  k.inter = inner * size > d.devices_per_node;
  k.bandwidth = k.inter ? d.inter_node_bandwidth : d.intra_node_bandwidth;
  k.latency = k.inter ? d.inter_node_latency : d.intra_node_latency;
  return k;
}

Collective collective(std::string name, std::string kind, std::string axis, int64_t group, double bytes,
                      const Link& link, bool overlapped, double calls) {
  Collective c;
  c.name = std::move(name);
  c.kind = kind;
  c.axis = std::move(axis);
  c.group = group;
  c.bytes = bytes;
  c.calls = kind == "send_recv" ? 2 * calls : calls;  // each message sent is received: two calls
  const double g = static_cast<double>(group);
  // Wire bytes per device on a ring: an all-reduce 2(g-1)/g of its payload, an all-gather (g-1) times its
  // input, a reduce-scatter (g-1)/g of its whole input; an all-to-all and a send what they send.
  if (kind == "all_reduce") c.wire_bytes = bytes * 2 * (g - 1) / g;
  else if (kind == "all_gather") c.wire_bytes = bytes * (g - 1);
  else if (kind == "reduce_scatter") c.wire_bytes = bytes * (g - 1) / g;
  else c.wire_bytes = bytes;
  c.link_bandwidth = link.bandwidth;
  c.inter_node = link.inter;
  // Latency: a tree's depth (NCCL's trees, MPI's recursive doubling), twice for an all-reduce.
  const double depth = std::ceil(std::log2(std::max(g, 2.0)));
  const double steps = kind == "all_reduce" ? 2 * depth : kind == "send_recv" ? 1 : depth;
  c.seconds = group > 1 || kind == "send_recv" ? c.wire_bytes / link.bandwidth + calls * steps * link.latency : 0;
  c.overlapped = overlapped;
  return c;
}

// Tensor parallelism's activation all-reduces per layer and micro-batch, of [tokens, d_model] each, as
// loom's layers issue them: Megatron's f in the backward of every column-parallel input, g in the forward
// of every row-parallel output.
double tp_all_reduces_per_layer(const models::ModelConfig& m) {
  if (m.arch() == "gpt2") return 6;         // f: q, k, v, fc; g: output_proj, proj
  if (m.arch() == "deepseek_v3") return 8;  // MLA's wq_b, wkv_b, RoPE key f, wo g; the FFN's f, f, g and the MoE gates
  return 7;                                 // f: q, k, v, w1, w3; g: output_proj, w2
}

// The Linears of a block whose weights FSDP gathers, one collective each per pass without overlap: q, k, v,
// output_proj and the MLP's (Llama w1, w3, w2; GPT-2 fc, proj); DeepSeek-V3's MLA wq_a, wkv_a, wq_b, wkv_b,
// wo and a dense MLP's three (a MoE block's shared expert and router, about as many).
double linears_per_layer(const models::ModelConfig& m) {
  if (m.arch() == "gpt2") return 6;
  if (m.arch() == "deepseek_v3") return 8;
  return 7;
}

}  // namespace

// What a layout's pipeline schedule costs stage `stage` beyond its compute: the bubble as a share of
// the compute ((P - 1) / M micro-batch slots of fill and drain under GPipe and 1F1B, 1/v of that under
// interleaved 1F1B, whose fill and drain run chunk-sized pieces), the point-to-point messages it sends
// per micro-batch (activations to the next stage unless it runs the last, the input's gradient to the
// previous one unless it runs the first: for every one of its v chunks), and the micro-batches whose
// activations it holds at once (interleaved: Megatron-LM's warm-up of 2 (P - s - 1) + (v - 1) P chunk
// forwards, plus the one running, each 1/v of the stage's layers).
struct PipeScheduleCost {
  double bubble_per_compute = 0, messages_per_micro = 0, in_flight = 1;
  // Micro-batches whose head terms (the last stage's logits' share and the head's weight gradient) are
  // held at once: interleaved, only the last chunk's, which runs each backward right after its forward.
  double head_in_flight = std::numeric_limits<double>::infinity();
};
double shared_core_pipeline_s(const std::string& schedule, const std::vector<double>& stage_work, int64_t micro,
                              double cores, int64_t chunks) {
  const int64_t P = static_cast<int64_t>(stage_work.size()), M = micro;
  const int64_t v = schedule == "interleaved" ? chunks : 1, V = P * v;
  LOOM_CHECK(P >= 1 && M >= 1 && cores > 0, "shared_core_pipeline_s: ", P, " stages, ", M, " micro-batches, ",
             cores, " cores");
  // Each stage's order: the one the trainer runs (dist::pipeline_order, which refuses a schedule, chunk
  // count or micro-batch count the trainer would).
  using Op = dist::PipeStep;
  std::vector<std::vector<Op>> order;
  for (int64_t s = 0; s < P; ++s) order.push_back(dist::pipeline_order(schedule, P, s, M, v));
  // Done flags by virtual stage (chunk x P + stage) and micro-batch.
  std::vector<char> forward_done(static_cast<size_t>(V * M), 0), backward_done(static_cast<size_t>(V * M), 0);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> left(static_cast<size_t>(P), -1);  // the running op's work left; -1: none started
  const double scale = std::max(1e-300, *std::max_element(stage_work.begin(), stage_work.end()));
  auto ready = [&](int64_t s) {
    const Op& op = order[static_cast<size_t>(s)][next[static_cast<size_t>(s)]];
    const int64_t vs = op.chunk * P + s;
    if (op.forward) return vs == 0 || forward_done[static_cast<size_t>((vs - 1) * M + op.micro)] != 0;
    if (vs == V - 1) return forward_done[static_cast<size_t>(vs * M + op.micro)] != 0;
    return backward_done[static_cast<size_t>((vs + 1) * M + op.micro)] != 0;
  };
  double t = 0;
  std::vector<int64_t> running;
  for (;;) {
    running.clear();
    bool finished = true;
    for (int64_t s = 0; s < P; ++s) {
      const size_t k = static_cast<size_t>(s);
      if (next[k] == order[k].size()) continue;
      finished = false;
      if (left[k] < 0 && ready(s)) {
        const double share = order[k][next[k]].forward ? 1.0 / 3.0 : 2.0 / 3.0;
        left[k] = std::max(0.0, stage_work[k]) / static_cast<double>(M * v) * share;
      }
      if (left[k] >= 0) running.push_back(s);
    }
    if (finished) return t;
    LOOM_ASSERT(!running.empty(), "shared_core_pipeline_s: no stage can run (", schedule, ")");
    const double rate = std::min(1.0, cores / static_cast<double>(running.size()));
    double dt = std::numeric_limits<double>::infinity();
    for (int64_t s : running) dt = std::min(dt, left[static_cast<size_t>(s)] / rate);
    t += dt;
    for (int64_t s : running) {
      const size_t k = static_cast<size_t>(s);
      left[k] -= dt * rate;
      if (left[k] > 1e-12 * scale) continue;
      const Op& op = order[k][next[k]];
      (op.forward ? forward_done : backward_done)[static_cast<size_t>((op.chunk * P + s) * M + op.micro)] = 1;
      ++next[k];
      left[k] = -1;
    }
  }
}

PipeScheduleCost pipe_schedule_cost(const Layout& l, int64_t stage) {
  PipeScheduleCost c;
  if (l.pipe == 1) return c;
  const double P = static_cast<double>(l.pipe), M = static_cast<double>(l.micro_batches);
  const bool interleaved = l.schedule == "interleaved";
  const double v = interleaved ? static_cast<double>(l.virtual_stages) : 1.0;
  c.bubble_per_compute = (P - 1) / (v * M);
  c.messages_per_micro = 2 * v - (stage == 0 ? 1.0 : 0.0) - (stage == l.pipe - 1 ? 1.0 : 0.0);
  if (interleaved) {
    const double s = static_cast<double>(stage);
    c.in_flight = std::min(v * M, 2 * (P - s - 1) + (v - 1) * P + 1) / v;
    if (stage == l.pipe - 1) c.head_in_flight = 1;
  } else {
    c.in_flight = l.schedule == "gpipe" ? M : std::min(P - static_cast<double>(stage), M);
  }
  return c;
}

Estimate estimate_stage(const Request& r, const Layout& l, int64_t stage) {
  Estimate e;
  e.layout = l;
  const models::ModelConfig& m = r.model;
  const json& j = m.json();
  const double V = key(j, "vocab_size"), C = key(j, "d_model"), H = key(j, "num_heads");
  const int64_t L = static_cast<int64_t>(key(j, "num_layers"));
  const double kv = key(j, "num_kv_heads") > 0 ? key(j, "num_kv_heads") : H;
  const int64_t T = r.seq > 0 ? r.seq : m.context_length();
  const bool moe = m.arch() == "deepseek_v3";
  const double E = key(j, "n_routed"), topk = key(j, "top_k");
  const bool bf16 = r.precision == "bf16";
  const double act_bytes = bf16 ? 2 : 4;  // what an activation is stored in (loom's bf16 stores some in f32)

  // ---- validity ----
  const int64_t slices = l.data * l.expert;
  if (l.devices() != r.devices) e.invalid = str("uses ", l.devices(), " devices, not ", r.devices);
  else if (r.batch % slices != 0) e.invalid = str("batch ", r.batch, " does not divide by data x expert = ", slices);
  else if ((r.batch / slices) % l.micro_batches != 0)
    e.invalid = str("the ", r.batch / slices, " sequences per rank do not divide into ", l.micro_batches, " micro-batches");
  else if (static_cast<int64_t>(H) % l.tensor != 0 || static_cast<int64_t>(kv) % l.tensor != 0)
    e.invalid = str("heads (", H, ", ", kv, " k/v) do not divide by tensor=", l.tensor);
  else if (l.tensor > r.device.devices_per_node) e.invalid = str("tensor=", l.tensor, " spans nodes");
  else if (l.expert > 1 && (!moe || static_cast<int64_t>(E) % l.expert != 0))
    e.invalid = moe ? str("n_routed=", E, " does not divide by expert=", l.expert) : "no routed experts";
  else if (l.pipe > L) e.invalid = str("pipe=", l.pipe, " exceeds the ", L, " layers");
  else if (l.pipe > 1 && l.micro_batches < l.pipe) e.invalid = str("pipe=", l.pipe, " needs at least as many micro-batches, got ", l.micro_batches);
  else if (l.pipe > 1 && l.schedule == "interleaved" && (l.virtual_stages < 2 || l.pipe * l.virtual_stages > L ||
                                                         l.micro_batches % l.pipe != 0))
    e.invalid = str("interleaved x", l.virtual_stages, " on pipe=", l.pipe, " needs 2 or more stages per device, ",
                    l.pipe * l.virtual_stages, " <= ", L, " layers and micro-batches a multiple of pipe (got ",
                    l.micro_batches, ")");

  // ---- memory per device: pipeline stage `stage` ----
  const std::vector<ParamCount> params = census(m);
  const bool tied = m.arch() == "gpt2" && flag(j, "tie_embeddings", true);
  // Under a pipe axis the last stage reads the token table too: GPT-2's tied head, DeepSeek-V3's MTP.
  const bool table_on_last = tied || (m.arch() == "deepseek_v3" && key(j, "n_mtp") > 0);
  const int64_t worst_stage = std::clamp<int64_t>(stage, 0, l.pipe - 1);
  const auto [stage_first, stage_last] = stage_layers(L, l.pipe, worst_stage);
  const int64_t worst_layers = stage_last - stage_first;
  // Whether parameter p lives on this stage: its block's stage, the tables on the first, the head and
  // what follows the blocks on the last (with the token table where the last stage reads it too).
  auto on_stage = [&](const ParamCount& p) {
    return (p.layer >= stage_first && p.layer < stage_last) || (p.layer < 0 && worst_stage == 0) ||
           (p.layer >= L && worst_stage == l.pipe - 1) ||
           (table_on_last && p.group == ParamGroup::Embedding && worst_stage == l.pipe - 1);
  };
  double stage_params = 0, largest_weight = 0, gathered_whole = 0, shard_ways = 1;
  for (const ParamCount& p : params) {
    if (!on_stage(p)) continue;
    const Split sp = split_of(p, l);
    stage_params += p.count / sp.total();
    // The largest weight FSDP gathers whole (over its shard axis; still split over tensor and expert).
    if (p.ndim >= 2 && p.layer >= 0 && p.layer < L && sp.shard > 1) {
      largest_weight = std::max(largest_weight, p.count / sp.tensor / sp.expert);
    }
    // What the stage's blocks gather whole, weights and biases (FSDP's packed groups: one block each).
    if (p.layer >= 0 && p.layer < L && sp.shard > 1) {
      gathered_whole += p.count / sp.tensor / sp.expert;
      shard_ways = sp.shard;
    }
  }
  e.worst_stage = worst_stage;
  for (int64_t st = 0; st < l.pipe; ++st) e.stage_bounds.push_back(stage_layers(L, l.pipe, st).first);
  e.stage_bounds.push_back(L);
  const double P = stage_params;
  e.params = 4 * P;
  e.grads = 4 * P;
  e.optimizer = 8 * P / (l.shard == "zero1" ? static_cast<double>(l.data * l.expert) : 1);
  e.bf16_copies = bf16 ? 2 * P : 0;

  const runs::ActivationModel am = runs::activation_model(m, l.recompute, l.tensor);
  const double local_seqs = static_cast<double>(r.batch) / static_cast<double>(slices);
  const double mb_tokens = local_seqs / static_cast<double>(l.micro_batches) * static_cast<double>(T);
  // Micro-batches whose activations a stage holds at once: 1 without a pipeline (each micro-batch's
  // backward runs before the next forward), all of them under GPipe, up to `pipe` under 1F1B (stage 0).
  const PipeScheduleCost schedule_cost = pipe_schedule_cost(l, worst_stage);
  const double in_flight = schedule_cost.in_flight;
  const bool last_stage = worst_stage == l.pipe - 1;
  // What one micro-batch keeps from its forward to its backward: its layers' activations, and the stage's
  // output (a stage before the last: held for the backward's sum(out · g)), or on the last stage the head's
  // terms (runs::activation_model) and the head's weight gradient, which ops::linear_cross_entropy
  // computes in the forward and its autograd node holds until the backward (V x C, f32: the table is
  // gathered whole under tensor parallelism).
  // Under tensor parallelism the head's table, gathered whole for the loss, is kept by the loss's graph too.
  const double head_grad = last_stage ? 4 * V * C : 0;
  const double per_micro = mb_tokens * act_bytes * (static_cast<double>(worst_layers) * am.per_layer + (last_stage ? am.head : C)) +
                           head_grad * (l.tensor > 1 ? 2 : 1);
  const double layers_micro = mb_tokens * act_bytes * static_cast<double>(worst_layers) * am.per_layer;
  // n micro-batches in flight; the head's terms for at most schedule_cost.head_in_flight of them.
  auto held = [&](double n) {
    const double cap = schedule_cost.head_in_flight;
    return n <= cap ? n * per_micro : n * layers_micro + cap * (per_micro - layers_micro);
  };
  e.activations = held(in_flight);
  // The gradient a stage before the last receives for its output, alive through the micro-batch's
  // backward (the received activations are its first block's input, counted above; the sends are
  // copies MPI holds outside loom's allocator until they complete).
  if (l.pipe > 1 && !last_stage) e.pipeline_buffers = mb_tokens * C * act_bytes;
  // The step's peak comes in one of four phases (measured with the allocator on every stage of pipe=2
  // and pipe=4 runs under GPipe and 1F1B: bench/plan.cpp, docs/plan.md):
  //   the loss's forward (the last stage): everything kept, its 512-row chunk of logits and of their
  //     gradient; the gradients exist then when a backward ran before it (accumulated micro-batches
  //     without a pipe; under 1F1B a stage that runs forwards after its first backward);
  //   the first backward: the micro-batches in flight, no gradients yet, the backward's own transient
  //     values (the gradient flowing back, C per token, and an MLP's hidden gradients, F/t, 2F/t on a
  //     stage before the last, which also holds the gradient it received; the dW being added to its
  //     parameter's gradient), one layer's recomputed values, FSDP's gathered weights (the one computing,
  //     the prefetched one and the whole-size gradient being reduce-scattered);
  //   a later backward: the same with every gradient, and the micro-batches still in flight then
  //     (min(in flight, M - 1)), less the head's weight gradient of the one it runs (added to the
  //     parameter's gradient as the backward starts, and freed);
  //   the last backward under dp: the gradients, and loom's data-axis buckets, which hold a copy of the
  //     gradients they all-reduce as they become final (dp: all of them), with the backward's values;
  //   the end of the last backward: the gradients and the buckets.
  const double F_hidden = m.arch() == "gpt2" ? (key(j, "d_ff") > 0 ? key(j, "d_ff") : 4 * C) : key(j, "d_ff");
  const double loss_chunk = last_stage ? 2 * std::min(mb_tokens, 512.0) * V * 4 : 0;  // ops::linear_cross_entropy's chunk
  // FSDP's gathered weights: without overlap the weight computing, and the whole-size gradient being
  // reduce-scattered with its staging copy; with it (nn/sharded.cpp) the block computing and the next
  // block's gather in flight (each packed whole: a block's weights and biases, and this rank's packed
  // shards), the block's gradient bucket (whole), the weight copied out of the block and the gradient
  // being packed into the bucket.
  const double block_whole = worst_layers > 0 ? 4 * gathered_whole / static_cast<double>(worst_layers) : 0;
  const double gathered = l.shard != "fsdp" ? 0
                          : r.overlap       ? 3 * block_whole + block_whole / shard_ways + 2 * 4 * largest_weight
                                            : 3 * 4 * largest_weight;
  const double weight_grad = l.shard == "fsdp" ? 0 : 4 * F_hidden * C / static_cast<double>(l.tensor);
  const double hidden_grads = (l.pipe > 1 && !last_stage ? 2 : 1) * F_hidden / static_cast<double>(l.tensor);
  const double backward_values = mb_tokens * act_bytes * (C + hidden_grads + am.recompute) + weight_grad + gathered;
  const double buckets = l.shard == "none" && l.data * l.expert > 1 && r.overlap ? e.grads : 0;
  const double resident = e.params + e.optimizer + e.bf16_copies;
  const double M = static_cast<double>(l.micro_batches);
  const bool grads_in_forward = l.pipe == 1 ? M > 1 : l.schedule != "gpipe" && M > in_flight;
  const double phase_loss = last_stage ? resident + (grads_in_forward ? e.grads : 0) + e.activations + loss_chunk : 0;
  const double phase_first_backward = resident + e.activations + backward_values;
  const double phase_later_backward =
      M > 1 ? resident + e.grads + held(std::min(in_flight, M - 1)) - head_grad + backward_values : 0;
  const double phase_bucketed_backward = buckets > 0 ? resident + e.grads + buckets + backward_values : 0;
  const double phase_end = resident + e.grads + buckets + gathered;
  e.peak = std::max({phase_loss, phase_first_backward, phase_later_backward, phase_bucketed_backward, phase_end});
  e.transient = e.peak - (resident + e.grads + e.activations);
  e.memory_limit = r.memory_per_device > 0 ? r.memory_per_device : r.device.memory_bytes;

  // ---- FLOPs ----
  const models::ModelStats st = m.stats();
  const double tokens = static_cast<double>(r.batch) * static_cast<double>(T);
  const double attention = 12.0 * static_cast<double>(L) * static_cast<double>(st.attention_width) * static_cast<double>(T);
  // PaLM's count, with the training-only modules (DeepSeek-V3's MTP) the step runs (models/stats.h).
  const double per_token = st.palm_flops_per_token_at(static_cast<double>(T));
  e.model_flops = per_token * tokens;
  // Recomputation runs the layers' forward again: full, all of it (2N of the layers' matmuls and a third
  // of attention); selective, the attention core's forward (a third of PaLM's attention term).
  const double layer_matmuls = 2.0 * static_cast<double>(st.matmul_params) -
                               2.0 * V * C * (tied ? 1 : (moe || m.arch() == "llama") ? 1 : 0);
  double extra = 0;
  if (l.recompute == models::Recompute::Full) extra = layer_matmuls + attention / 3;
  if (l.recompute == models::Recompute::Selective) extra = attention / 3;
  // Under tensor parallelism loom computes the whole head on every tensor rank (Request::head_split):
  // its 6·V·C FLOPs per token (forward and both backward GEMMs), once for the head and once for each
  // MTP module that reads it, run tensor times where the count above runs them once.
  const double heads = 1 + (moe ? key(j, "n_mtp") : 0);
  const double head_repeat = l.tensor > 1 && !r.head_split ? static_cast<double>(l.tensor - 1) : 0;
  extra += head_repeat * heads * 6 * V * C;
  e.hardware_flops = (per_token + extra) * tokens;
  // The efficiency at the rows a rank's GEMMs multiply: a micro-batch's tokens on this rank (where it was
  // measured at several heights, DeviceSpec::efficiency_by_rows; else the one gemm_efficiency).
  const double peak = (bf16 ? r.device.bf16_flops : r.device.f32_flops) * r.device.efficiency_at(mb_tokens);
  const double N = static_cast<double>(r.devices);
  e.compute_s = e.hardware_flops / N / peak;
  // The families a tensor axis leaves whole (DeviceSpec::tensor_replicated_share of the one-process
  // step, measured): each tensor rank runs its tokens' share of them in full, t times what the FLOPs'
  // split above charges.
  if (l.tensor > 1 && r.device.tensor_replicated_share > 0) {
    e.compute_s += r.device.tensor_replicated_share * (e.model_flops / peak) * static_cast<double>(l.tensor - 1) / N;
  }
  // The compute of an even share (the pipeline's slowest stage adjusts compute_s below; the cores do
  // every stage's work, which sums to the even shares).
  double even_compute = e.compute_s;
  std::vector<double> stage_cost;  // each stage's share of the compute (under a pipe axis)
  if (l.pipe > 1) {
    // A pipeline runs at the pace of its slowest stage: each stage's share of the compute is its blocks'
    // matmul weights (a routed expert's at top_k / n_routed: the share a token runs), PaLM's attention term
    // per block (2·H·D·T weight-equivalents), and on the last stage the head (a tied table's too) and what
    // follows the blocks (DeepSeek-V3's MTP modules). The lookups cost nothing.
    std::vector<double> cost(static_cast<size_t>(l.pipe), 0.0);
    std::vector<int64_t> stage_of(static_cast<size_t>(L) + 1, l.pipe - 1);
    for (int64_t s = 0; s < l.pipe; ++s) {
      const auto [a, b] = stage_layers(L, l.pipe, s);
      for (int64_t k = a; k < b; ++k) stage_of[static_cast<size_t>(k)] = s;
      cost[static_cast<size_t>(s)] += static_cast<double>(b - a) * 2.0 * static_cast<double>(st.attention_width) *
                                      static_cast<double>(T);
    }
    for (const ParamCount& p : params) {
      if (p.ndim < 2 || p.layer < 0) continue;
      const bool routed = p.group == ParamGroup::ExpertIn || p.group == ParamGroup::ExpertOut;
      const int64_t s = stage_of[static_cast<size_t>(std::min(p.layer, L))];
      cost[static_cast<size_t>(s)] += p.count * (routed && E > 0 ? topk / E : 1.0);
    }
    if (tied) cost.back() += V * C;
    cost.back() += head_repeat * heads * V * C;  // the head repeated on every tensor rank (loom's)
    double total = 0, slowest = 0;
    for (double c : cost) {
      total += c;
      slowest = std::max(slowest, c);
    }
    if (total > 0) {
      e.compute_s *= static_cast<double>(l.pipe) * slowest / total;
      for (double c : cost) stage_cost.push_back(c / total);
    }
  }
  // Selective recomputation also runs the layers' cheap ops again: the norms, activations, RoPE and
  // residual adds between the GEMMs, which FLOPs do not count (runs::activation_model's `recompute`
  // values per token and layer). They are memory-bound: each value written once from about two read,
  // 3 x its bytes at the device's memory bandwidth. (Measured with CPU time on the tiny Llama, one
  // process: selective adds 13% to the step, the attention core's FLOPs alone 4%: docs/plan.md.)
  if (l.recompute == models::Recompute::Selective && r.device.memory_bandwidth > 0) {
    const double cheap = local_seqs * static_cast<double>(T) * static_cast<double>(worst_layers) * am.recompute * act_bytes * 3 /
                         r.device.memory_bandwidth;
    e.compute_s += cheap;
    even_compute += cheap;
  }

  // ---- collectives (per device per step) ----
  const double g_data = static_cast<double>(l.data);
  const Link tensor_link = link_for(r, 1, l.tensor);
  const Link expert_link = link_for(r, l.tensor, l.expert);
  const Link data_link = link_for(r, l.tensor * l.expert, l.data);
  const Link dx_link = link_for(r, l.tensor, l.expert * l.data);
  const Link pipe_link = link_for(r, l.tensor * l.expert * l.data, l.pipe);
  const double layers_here = static_cast<double>(worst_layers);
  const double micro = static_cast<double>(l.micro_batches);
  if (l.tensor > 1) {
    // Recomputation (either kind) runs the forward's g all-reduces again: selective keeps the local GEMM
    // outputs, not the sums.
    double n = tp_all_reduces_per_layer(m) + (l.recompute != models::Recompute::None ? 2 : 0);
    e.collectives.push_back(collective("tensor-parallel activation all-reduces", "all_reduce", "tensor", l.tensor,
                                       act_bytes * n * layers_here * mb_tokens * C * micro, tensor_link, false,
                                       n * layers_here * micro));
    // The token table gathered for the lookup (the first stage) and the head's for the loss (the last);
    // one gather for a tied table used by both on one rank.
    const double gathers = l.pipe == 1 ? (tied ? 1 : 2) : (worst_stage == 0 ? 1 : 0) + (last_stage ? 1 : 0);
    const double tables = gathers * V * C / static_cast<double>(l.tensor);
    e.collectives.push_back(collective("embedding/head table gathers", "all_gather", "tensor", l.tensor, 4 * tables * micro,
                                       tensor_link, false, gathers * micro));
  }
  // Data-axis gradient sums: the parameters replicated over the batch axes.
  double replicated = 0, sharded_shard = 0, sharded_whole = 0, expert_replicated = 0, sharded_bias = 0;
  double sharded_bias_tensors = 0;  // FSDP-sharded biases: a gather in each forward, a reduce-scatter each backward
  // FSDP-sharded routed experts (DeepSeek-V3): gathered whole by their layer's forward, each tensor on its
  // own, and kept to its backward, which reduce-scatters each gradient (the census's "w1, w3" is two).
  double sharded_experts = 0, sharded_expert_tensors = 0;
  double last_block_shard = 0;  // the stage's last block's sharded weights and biases, experts aside
  std::vector<double> replicated_order;  // the replicated gradients' bytes, in the census's order
  for (const ParamCount& p : params) {
    if (!on_stage(p)) continue;
    const Split sp = split_of(p, l);
    const double local = p.count / sp.total();
    if (sp.shard > 1) {
      if (p.group == ParamGroup::Bias) {
        sharded_bias += local;  // gathered by the forward only
        sharded_bias_tensors += 1;
      }
      else sharded_shard += local;
      sharded_whole += local * sp.shard;
      if (p.group == ParamGroup::ExpertIn || p.group == ParamGroup::ExpertOut) {
        sharded_experts += local;
        sharded_expert_tensors += p.group == ParamGroup::ExpertIn ? 2 : 1;
      } else if (p.layer == stage_last - 1) {
        last_block_shard += local;
      }
    } else if (p.group == ParamGroup::ExpertIn || p.group == ParamGroup::ExpertOut) {
      expert_replicated += local;
    } else {
      replicated += local;
      replicated_order.push_back(4 * local);
    }
  }
  const bool batch_split = l.data * l.expert > 1;
  if (batch_split && l.shard != "zero1") {
    if (replicated > 0) {
      // With overlap, in buckets started as the backward makes the gradients final (parallel/runtime.cpp):
      // a bucket closes once it holds RankContext::bucket_bytes (256 KiB), the last one at the end. The
      // backward finishes the gradients about in the census's reverse order (the head first).
      const bool bucketed = r.overlap && l.expert == 1;
      double buckets_n = 0, filling = 0;
      for (auto it = replicated_order.rbegin(); it != replicated_order.rend(); ++it) {
        filling += *it;
        if (filling >= 262144) {
          buckets_n += 1;
          filling = 0;
        }
      }
      if (filling > 0) buckets_n += 1;
      e.collectives.push_back(collective("gradient all-reduce", "all_reduce", l.expert > 1 ? "data x expert" : "data",
                                         l.data * l.expert, 4 * replicated, l.expert > 1 ? dx_link : data_link, bucketed,
                                         bucketed ? buckets_n : 1));
    }
    if (expert_replicated > 0 && l.data > 1) {
      e.collectives.push_back(collective("expert gradient all-reduce", "all_reduce", "data", l.data, 4 * expert_replicated,
                                         data_link, false, 1));
    }
  }
  if (l.shard == "zero1" && batch_split) {  // ZeRO-1: reduce-scatter the gradients, all-gather the updated weights
    const double all = replicated + expert_replicated;
    const int64_t g = l.data * l.expert;
    e.collectives.push_back(collective("gradient reduce-scatter (ZeRO-1)", "reduce_scatter", "data", g, 4 * all, dx_link, true, 1));
    e.collectives.push_back(collective("weight all-gather (ZeRO-1)", "all_gather", "data", g, 4 * all / static_cast<double>(g),
                                       dx_link, true, 1));
  }
  if (l.shard == "fsdp" && sharded_shard > 0) {
    const int64_t g = l.expert > 1 ? l.data * l.expert : l.data;
    const Link& k = l.expert > 1 ? dx_link : data_link;
    // With overlap (nn/sharded.cpp), a block's Linears are gathered in one call per pass, their
    // weights and the biases their forward adds packed together: a forward and a backward per
    // micro-batch, for each of the stage's blocks (on the last stage DeepSeek-V3's MTP modules are
    // blocks too); under recomputation the recomputed forward of the stage's last block gathers its
    // block once more (the forward's gathers end with its pass; every other block's recomputed forward
    // uses its backward's prefetched group), unless the forward ends in an MTP module, which is not
    // recomputed. The routed experts are gathered on their own, once per forward. Without overlap
    // (approximately, as before the groups): one gather per Linear and pass, one per sharded bias and
    // forward, recomputed forwards included.
    const bool again = l.recompute != models::Recompute::None;
    const double passes = micro * (again ? 3 : 2), forwards = micro * (again ? 2 : 1);
    double bytes = 4 * (sharded_shard * passes + sharded_bias * forwards);
    const double linears = linears_per_layer(m);
    double gathers = passes * layers_here * linears + sharded_bias_tensors * forwards;
    const double blocks_here = layers_here + (m.arch() == "deepseek_v3" && last_stage ? key(j, "n_mtp") : 0);
    if (r.overlap) {
      const double blocks_bytes = sharded_shard + sharded_bias - sharded_experts;
      const bool last_again = again && blocks_here == layers_here;
      gathers = micro * (2 * blocks_here + (last_again ? 1 : 0)) + sharded_expert_tensors * forwards;
      bytes = 4 * (blocks_bytes * 2 * micro + (last_again ? micro * last_block_shard : 0) + sharded_experts * forwards);
    }
    e.collectives.push_back(collective("FSDP weight all-gathers", "all_gather", l.expert > 1 ? "data x expert" : "data", g,
                                       bytes, k, r.overlap, gathers));
    // One reduce-scatter per block and backward with overlap (its Linears' gradients and their biases'
    // in one bucket) and one per routed-expert tensor, else one per Linear and sharded bias.
    e.collectives.push_back(collective("FSDP gradient reduce-scatters", "reduce_scatter", l.expert > 1 ? "data x expert" : "data",
                                       g, 4 * sharded_whole * micro, k, r.overlap,
                                       micro * (r.overlap ? blocks_here + sharded_expert_tensors
                                                          : layers_here * linears + sharded_bias_tensors)));
  }
  if (l.expert > 1) {
    const double moe_layers_here = layers_here * (1 - key(j, "n_dense") / static_cast<double>(L));
    const double passes = 4 + (l.recompute != models::Recompute::None ? 2 : 0);
    const double g = static_cast<double>(l.expert);
    e.collectives.push_back(collective("expert all-to-alls (balanced routing)", "all_to_all", "expert", l.expert,
                                       act_bytes * passes * moe_layers_here * mb_tokens * topk * C * (g - 1) / g * micro,
                                       expert_link, false, passes * moe_layers_here * micro));
  }
  if (l.pipe > 1) {
    // What the stage sends: its activations to the next stage (not the last), the gradient of its input
    // to the previous one (not the first), one message per micro-batch each way.
    const double directions = schedule_cost.messages_per_micro;  // interleaved: v chunks' worth
    e.collectives.push_back(collective("pipeline activations and gradients", "send_recv", "pipe", l.pipe,
                                       directions * micro * mb_tokens * C * act_bytes, pipe_link, true,
                                       directions * micro));
    // A token table the last stage reads too (GPT-2's tied head, DeepSeek-V3's MTP): its gradient summed
    // over the first and last stage.
    if (table_on_last && (worst_stage == 0 || worst_stage == l.pipe - 1)) {
      e.collectives.push_back(collective("tied table gradient all-reduce", "all_reduce", "pipe", 2,
                                         4 * V * C / static_cast<double>(l.tensor), pipe_link, false, 1));
    }
    // The loss's sum over the stages (the scalars every layout has follow below).
    e.collectives.push_back(collective("loss over the stages", "all_reduce", "pipe", l.pipe, 8, pipe_link, false, 1));
  }
  // The scalars, each over the ranks loom sums it over (parallel/pipeline.cpp, runtime.cpp): the loss of
  // each micro-batch over the batch axes (under a pipe axis on the last stage, after the schedule), and
  // the stop agreement and gradient norm over the world. (Charged as one world group until 12-05, they
  // cost 8-rank meetings where loom's calls meet 2 ranks.)
  if (l.pipe > 1 || batch_split || l.tensor > 1) {
    if (batch_split && (l.pipe == 1 || worst_stage == l.pipe - 1)) {
      e.collectives.push_back(collective("loss over the batch axes", "all_reduce", l.expert > 1 ? "data x expert" : "data",
                                         l.data * l.expert, 8 * micro, dx_link, false, micro));
    }
    e.collectives.push_back(collective("stop and gradient-norm scalars", "all_reduce", "world", l.devices(), 16,
                                       data_link, false, 2));
  }
  (void)g_data;

  // ---- measured collective costs (this CPU: docs/plan/cpu-collectives.json) ----
  // Where the device's collectives were measured through loom's communicator, each call costs what the
  // measurement says it adds to a step with the same ranks on the machine and about the same compute
  // between calls: a blocking call its transfer and the wake-ups of ranks that napped waiting for it
  // (the MPI wait polls with naps of up to 1 ms), an overlapped one (FSDP's prefetched gathers and
  // background reduce-scatters, the data-axis buckets) the part its compute window did not hide,
  // measured on a collective started on the communication thread. A pipeline's messages keep the
  // formula (overlapped: a stage's receive mostly finds its message there, the wait for the previous
  // stage's compute being the bubble), and so does what was not measured (all-to-alls).
  // With more ranks than cores (this CPU under --oversubscribe) a rank that waits leaves its core to one
  // that computes: the chain below runs at a whole core's speed and each wall cost is the one measured
  // with a core per rank (the transfer and the meeting); the time-slicing is the CPU floor's (below).
  const double rank_threads = std::max(1.0, r.device.rank_threads);
  const bool oversubscribed = r.device.cores > 0 && N * rank_threads > r.device.cores;
  const double chain_share = oversubscribed ? r.device.peak_share : 1.0;
  // What sharing the cores costs the compute itself (DeviceSpec::shared_core_slowdown), measured.
  const double slowdown = oversubscribed && r.device.shared_core_slowdown > 0 ? r.device.shared_core_slowdown : 1.0;
  const int64_t wall_ranks =
      oversubscribed ? std::max<int64_t>(1, static_cast<int64_t>(r.device.cores / rank_threads)) : l.devices();
  if (!r.device.collective_costs.empty()) {
    double blocking_calls = 0, overlapped_calls = 0;
    for (const Collective& c : e.collectives) {
      if (c.kind == "send_recv" || c.kind == "all_to_all") continue;
      (c.overlapped ? overlapped_calls : blocking_calls) += c.calls;
    }
    for (Collective& c : e.collectives) {
      if (c.kind == "send_recv" || c.kind == "all_to_all" || c.calls <= 0 || c.group < 2) continue;
      // The compute between two calls of the same kind of wait (the measurement's gap).
      const double gap = chain_share * e.compute_s / std::max(1.0, c.overlapped ? overlapped_calls : blocking_calls);
      const CollectiveCost* k = r.device.cost_of(c.overlapped ? "started_all_gather" : c.kind, c.group, wall_ranks, gap);
      if (!k) continue;
      c.seconds = c.calls * k->seconds(c.bytes / c.calls);
      c.measured = true;
    }
    // What every call takes from the cores, measured beside its wall cost (a pipeline's messages too,
    // where send_recv was measured: the wait for them stays the bubble's).
    for (const Collective& c : e.collectives) {
      if (c.kind == "all_to_all" || c.calls <= 0 || c.group < 2) continue;
      const double gap = e.compute_s / std::max(1.0, c.kind == "send_recv" ? c.calls : c.overlapped ? overlapped_calls : blocking_calls);
      const std::string kind = c.kind == "send_recv" ? "send_recv" : c.overlapped ? "started_all_gather" : c.kind;
      const CollectiveCost* k = r.device.cost_of(kind, c.kind == "send_recv" ? 2 : c.group, l.devices(), gap);
      if (k) e.comm_cpu_s += c.calls * k->cpu_seconds(c.bytes / c.calls);
    }
  }

  // ---- time ----
  double overlapped = 0, exposed = 0;
  for (const Collective& c : e.collectives) {
    e.comm_s += c.seconds;
    if (c.overlapped && !c.measured) overlapped += c.seconds;
    else exposed += c.seconds;
  }
  // What overlaps hides behind the compute (the backward for gradient sums, the whole step for FSDP's
  // gathers and a pipeline's sends), never more than the compute itself; the first gather of a pass and
  // the last bucket are exposed (a layer's worth).
  const double hidden = std::min(overlapped, e.compute_s);
  exposed += overlapped - hidden;
  e.exposed_comm_s = exposed;
  if (l.pipe > 1) {
    e.bubble_s = e.compute_s * schedule_cost.bubble_per_compute;
  }
  // AdamW: read the parameter, gradient and two moments, write the parameter and moments (bf16 copy too).
  e.optimizer_s = (P / (l.shard == "zero1" ? static_cast<double>(l.data * l.expert) : 1)) * (bf16 ? 30 : 28) /
                  r.device.memory_bandwidth;
  e.step_s = (e.compute_s + e.bubble_s) * chain_share * slowdown + e.exposed_comm_s + e.optimizer_s;
  // Ranks sharing cores (this CPU): the step takes at least every rank's CPU over the cores, however its
  // waits overlap. A rank's compute and AdamW take its threads at a whole core's speed (compute_s is at
  // the share of the peak a rank gets: peak_share), its collectives what the measurement says a call
  // takes from the cores. Where the ranks' threads outnumber the cores this is what bounds the step:
  // one rank's wait is another's compute, and the communication thread's polling and copies take
  // compute time (with 2 ranks on 2 cores, each rank's communication thread shares its core).
  if (r.device.cores > 0) {
    e.cpu_s = (even_compute * r.device.peak_share * slowdown + e.optimizer_s) * rank_threads + e.comm_cpu_s;
    e.cpu_bound_s = N * e.cpu_s / std::min(r.device.cores, N * rank_threads);
    e.step_s = std::max(e.step_s, e.cpu_bound_s);
    // A pipeline whose stages outnumber the cores: the floor above assumes every core busy throughout,
    // but while stages wait on each other (fill, drain, and a stage waiting for a slower neighbour)
    // fewer ranks can run than there are cores. The schedule played out with the cores shared among
    // the ranks that can run (shared_core_pipeline_s); each replica of the pipeline (over data, tensor
    // and expert) gets its share of the cores. A stage's work: its share of the compute at a whole
    // core, slowed by the sharing, and the CPU its calls take.
    if (oversubscribed && e.invalid.empty() && !stage_cost.empty()) {
      const double replicas = N / static_cast<double>(l.pipe);
      const double pipeline_cores = r.device.cores / replicas / rank_threads;
      std::vector<double> work;
      for (double c : stage_cost) {
        work.push_back(even_compute * r.device.peak_share * slowdown * static_cast<double>(l.pipe) * c +
                       e.comm_cpu_s / rank_threads);
      }
      e.shared_pipeline_s = shared_core_pipeline_s(l.schedule, work, l.micro_batches, pipeline_cores, l.virtual_stages);
      const double optimizer_wall = e.optimizer_s * std::max(1.0, N * rank_threads / r.device.cores);
      e.step_s = std::max(e.step_s, e.shared_pipeline_s + optimizer_wall + e.exposed_comm_s);
    }
  }
  e.tokens_per_s = tokens / e.step_s;
  e.mfu = e.model_flops / (e.step_s * N * (bf16 ? r.device.bf16_flops : r.device.f32_flops));
  e.hfu = e.hardware_flops / (e.step_s * N * (bf16 ? r.device.bf16_flops : r.device.f32_flops));
  return e;
}

Estimate estimate(const Request& r, const Layout& l) {
  Estimate worst = estimate_stage(r, l, 0);
  if (!worst.invalid.empty()) return worst;
  // The candidates: the first stage (the most micro-batches in flight under 1F1B), the first middle one
  // (the extra layers go to the middle stages from stage 1 on: the most layers, and under 1F1B the most
  // in flight among them), the last (the head and the loss). Every other stage holds no more than these.
  std::vector<int64_t> candidates;
  if (l.pipe >= 2) candidates.push_back(1);
  if (l.pipe >= 3) candidates.push_back(l.pipe - 1);
  for (int64_t s : candidates) {
    Estimate e = estimate_stage(r, l, s);
    if (e.peak > worst.peak) worst = std::move(e);
  }
  return worst;
}

Plan make_plan(const Request& r) {
  LOOM_CHECK(r.devices >= 1, "plan: --devices must be >= 1, got ", r.devices);
  LOOM_CHECK(r.batch >= 1, "plan: --batch must be >= 1, got ", r.batch);
  Plan plan;
  plan.request = r;
  std::vector<Estimate> all;
  if (r.only) {
    all.push_back(estimate(r, *r.only));
  } else {
    const json& j = r.model.json();
    const int64_t L = static_cast<int64_t>(key(j, "num_layers"));
    const bool moe = r.model.arch() == "deepseek_v3";
    for (int64_t t : divisors(r.devices)) {
      if (t > r.device.devices_per_node) continue;
      for (int64_t ex : divisors(r.devices / t)) {
        if (ex > 1 && !moe) continue;
        for (int64_t p : divisors(r.devices / t / ex)) {
          if (p > L) continue;
          const int64_t d = r.devices / t / ex / p;
          if (r.batch % (d * ex) != 0) continue;
          const int64_t local = r.batch / (d * ex);
          for (int64_t mb : divisors(local)) {
            if (p == 1 && mb > 64) continue;
            if (p > 1 && (mb < p || mb > 16 * p)) continue;
            for (const char* shard : {"none", "zero1", "fsdp"}) {
              if (d * ex == 1 && std::string(shard) != "none") continue;
              for (auto rc : {models::Recompute::None, models::Recompute::Selective, models::Recompute::Full}) {
                Layout l{d, t, p, ex, shard, rc, mb, "1f1b"};
                all.push_back(estimate(r, l));
                // Interleaved 1F1B (v stages per device) cuts the bubble to (p - 1) / (v m) for 2v - 1
                // or 2v messages a micro-batch and Megatron-LM's larger warm-up in flight: tried where
                // loom runs it (micro-batches a multiple of pipe, pipe x v <= layers).
                if (p > 1 && mb % p == 0) {
                  for (int64_t v : {2, 3, 4, 6, 8}) {
                    if (p * v > L) break;
                    Layout il{d, t, p, ex, shard, rc, mb, "interleaved", v};
                    all.push_back(estimate(r, il));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  plan.evaluated = static_cast<int64_t>(all.size());
  for (Estimate& e : all) (e.fits() ? plan.fitting : plan.rejected).push_back(std::move(e));
  std::stable_sort(plan.fitting.begin(), plan.fitting.end(), [](const Estimate& a, const Estimate& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    if (a.layout.micro_batches != b.layout.micro_batches) return a.layout.micro_batches < b.layout.micro_batches;
    return a.memory() < b.memory();
  });
  std::stable_sort(plan.rejected.begin(), plan.rejected.end(), [](const Estimate& a, const Estimate& b) {
    if (a.invalid.empty() != b.invalid.empty()) return a.invalid.empty();
    return a.memory() / a.memory_limit < b.memory() / b.memory_limit;
  });
  // Why each loses to the best: the term of the step that grew most against it.
  if (!plan.fitting.empty()) {
    const Estimate& best = plan.fitting.front();
    for (size_t i = 0; i < plan.fitting.size(); ++i) {
      Estimate& e = plan.fitting[i];
      if (i == 0) {
        e.verdict = str("best: the fastest layout that fits (", gib(e.memory()), " of ", gib(e.memory_limit), ")");
        continue;
      }
      const double dc = e.compute_s - best.compute_s, dx = e.exposed_comm_s - best.exposed_comm_s,
                   db = e.bubble_s - best.bubble_s, dopt = e.optimizer_s - best.optimizer_s;
      const double worst = std::max({dc, dx, db, dopt});
      char buf[200];
      const double pct = 100 * (e.step_s / best.step_s - 1);
      // Where the compute grew: recomputation, a pipeline's slowest stage, or the head every tensor rank
      // computes whole.
      const char* why_compute = e.layout.recompute != models::Recompute::None && e.layout.recompute != best.layout.recompute
                                    ? " (recomputation)"
                                : e.layout.pipe > 1                      ? " (the slowest pipeline stage)"
                                : e.layout.tensor > 1 && !r.head_split ? " (the head on every tensor rank)"
                                                                         : "";
      // Ranks sharing cores (this CPU): the step may be the ranks' CPU over the cores, or a pipeline's
      // schedule on the shared cores, rather than the sum of the terms above.
      const bool shared_pipeline = e.shared_pipeline_s > 0 && e.step_s > e.cpu_bound_s;
      const bool cpu_bound = !shared_pipeline && e.cpu_bound_s > 0 && e.step_s <= e.cpu_bound_s;
      if (pct > 0 && shared_pipeline)
        std::snprintf(buf, sizeof buf, "+%.1f%%: its pipeline schedule on the shared cores, %.3g s", pct,
                      e.shared_pipeline_s);
      else if (pct > 0 && cpu_bound && e.cpu_bound_s > best.cpu_bound_s)
        std::snprintf(buf, sizeof buf, "+%.1f%%: its ranks' CPU over the cores, %.3g s more", pct,
                      e.cpu_bound_s - best.cpu_bound_s);
      else if (worst <= 0) std::snprintf(buf, sizeof buf, "ties (+%.1f%%); ranked after it by micro-batches, then memory", pct);
      else if (worst == dx) std::snprintf(buf, sizeof buf, "+%.1f%%: %.3g s more exposed communication", pct, dx);
      else if (worst == db) std::snprintf(buf, sizeof buf, "+%.1f%%: %.3g s more pipeline bubble", pct, db);
      else if (worst == dc) std::snprintf(buf, sizeof buf, "+%.1f%%: %.3g s more compute%s", pct, dc, why_compute);
      else std::snprintf(buf, sizeof buf, "+%.1f%%: %.3g s more optimizer time", pct, dopt);
      e.verdict = buf;
    }
  }
  for (Estimate& e : plan.rejected) {
    e.verdict = !e.invalid.empty() ? e.invalid
                                   : str("does not fit: needs ", gib(e.memory()), " of ", gib(e.memory_limit),
                                         " (params ", gib(e.params), ", grads ", gib(e.grads), ", AdamW ",
                                         gib(e.optimizer), ", activations ", gib(e.activations), ")");
  }
  return plan;
}

// ---- output ---------------------------------------------------------------------------------------

json to_json(const Estimate& e) {
  json c = json::array();
  for (const Collective& k : e.collectives) {
    c.push_back({{"name", k.name}, {"kind", k.kind}, {"axis", k.axis}, {"group", k.group}, {"bytes", k.bytes},
                 {"wire_bytes", k.wire_bytes}, {"link_bandwidth", k.link_bandwidth}, {"inter_node", k.inter_node}, {"calls", k.calls}, {"measured", k.measured},
                 {"seconds", k.seconds}, {"overlapped", k.overlapped}});
  }
  const Layout& l = e.layout;
  return {{"layout",
           {{"data", l.data}, {"tensor", l.tensor}, {"pipe", l.pipe}, {"expert", l.expert}, {"shard", l.shard},
            {"recompute", models::recompute_name(l.recompute)}, {"micro_batches", l.micro_batches},
            {"schedule", l.schedule}, {"virtual_stages", l.virtual_stages}, {"loom_mode", l.loom_mode()}}},
          {"fits", e.fits()},
          {"invalid", e.invalid},
          {"memory",
           {{"params", e.params}, {"grads", e.grads}, {"optimizer", e.optimizer}, {"bf16_copies", e.bf16_copies},
            {"activations", e.activations}, {"pipeline_buffers", e.pipeline_buffers}, {"transient", e.transient},
            {"total", e.memory()}, {"limit", e.memory_limit}}},
          {"model_flops", e.model_flops},
          {"hardware_flops", e.hardware_flops},
          {"collectives", c},
          {"time",
           {{"compute_s", e.compute_s}, {"comm_s", e.comm_s}, {"exposed_comm_s", e.exposed_comm_s},
            {"bubble_s", e.bubble_s}, {"optimizer_s", e.optimizer_s}, {"cpu_s", e.cpu_s},
            {"comm_cpu_s", e.comm_cpu_s}, {"cpu_bound_s", e.cpu_bound_s},
            {"shared_pipeline_s", e.shared_pipeline_s}, {"step_s", e.step_s}}},
          {"tokens_per_s", e.tokens_per_s},
          {"mfu", e.mfu},
          {"hfu", e.hfu},
          {"verdict", e.verdict}};
}

json to_json(const Plan& p, int rows) {
  json fitting = json::array(), rejected = json::array();
  for (size_t i = 0; i < p.fitting.size() && static_cast<int>(i) < rows; ++i) fitting.push_back(to_json(p.fitting[i]));
  for (size_t i = 0; i < p.rejected.size() && static_cast<int>(i) < rows; ++i) rejected.push_back(to_json(p.rejected[i]));
  const Request& r = p.request;
  json sources = json::object();
  for (const auto& [k, v] : r.device.sources) sources[k] = v;
  return {{"model", r.model.arch()},
          {"params", r.model.stats().total_params},
          {"batch", r.batch},
          {"seq", r.seq > 0 ? r.seq : r.model.context_length()},
          {"devices", r.devices},
          {"device",
           {{"name", r.device.name}, {"description", r.device.description}, {"bf16_flops", r.device.bf16_flops},
            {"f32_flops", r.device.f32_flops}, {"memory_bytes", r.device.memory_bytes},
            {"memory_bandwidth", r.device.memory_bandwidth}, {"devices_per_node", r.device.devices_per_node},
            {"intra_node_bandwidth", r.device.intra_node_bandwidth},
            {"inter_node_bandwidth", r.device.inter_node_bandwidth}, {"gemm_efficiency", r.device.gemm_efficiency},
            {"sources", sources}}},
          {"precision", r.precision},
          {"head", r.head_split ? "split across the tensor ranks" : "whole on every tensor rank (loom)"},
          {"evaluated", p.evaluated},
          {"fitting_count", p.fitting.size()},
          {"best", p.fitting.empty() ? json(nullptr) : to_json(p.fitting.front())},
          {"best_in_loom", [&] {
             for (const Estimate& e : p.fitting) {
               if (!e.layout.loom_mode().empty()) return to_json(e);
             }
             return json(nullptr);
           }()},
          {"fitting", fitting},
          {"rejected", rejected}};
}

std::string format_plan(const Plan& p, int rows) {
  const Request& r = p.request;
  std::ostringstream o;
  char buf[512];
  std::snprintf(buf, sizeof buf, "plan: %s (%s parameters), batch %lld x %lld tokens, %lld x %s (%s), %s\n",
                r.model.arch().c_str(), std::to_string(r.model.stats().total_params).c_str(),
                static_cast<long long>(r.batch), static_cast<long long>(r.seq > 0 ? r.seq : r.model.context_length()),
                static_cast<long long>(r.devices), r.device.name.c_str(), r.device.description.c_str(), r.precision.c_str());
  o << buf;
  o << "head under a tensor axis: " << (r.head_split ? "split across the tensor ranks (vocab-parallel)" : "whole on every tensor rank (loom)")
    << "\n";
  std::snprintf(buf, sizeof buf, "%lld layouts evaluated, %zu fit in %s per device\n\n", static_cast<long long>(p.evaluated),
                p.fitting.size(), gib(p.fitting.empty() ? (p.rejected.empty() ? 0 : p.rejected.front().memory_limit)
                                                         : p.fitting.front().memory_limit).c_str());
  o << buf;
  auto row = [&](const Estimate& e) {
    const std::string mode = e.layout.loom_mode().empty() ? "-" : e.layout.loom_mode();
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %s | %s | %.3g | %.3g | %.3g | %.3g | %.4g | %.3g | %.1f%% | %s |\n",
                  e.layout.str().c_str(), mode.c_str(), gib(e.memory()).c_str(), gib(e.params + e.grads + e.optimizer + e.bf16_copies).c_str(),
                  gib(e.activations + e.pipeline_buffers).c_str(), e.compute_s, e.exposed_comm_s, e.bubble_s, e.optimizer_s,
                  e.step_s, e.tokens_per_s, 100 * e.mfu, e.verdict.c_str());
    o << buf;
  };
  o << "| layout | loom mode | memory/device | weights+grads+AdamW | activations+buffers | compute s | exposed comm s "
       "| bubble s | optimizer s | step s | tokens/s | MFU | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < p.fitting.size() && static_cast<int>(i) < rows; ++i) row(p.fitting[i]);
  if (!p.rejected.empty()) {
    o << "\nclosest that do not fit or cannot run:\n";
    for (size_t i = 0; i < p.rejected.size() && static_cast<int>(i) < std::max(3, rows / 3); ++i) {
      o << "- " << p.rejected[i].layout.str() << ": " << p.rejected[i].verdict << "\n";
    }
  }
  if (!p.fitting.empty()) {
    const Estimate& b = p.fitting.front();
    o << "\nbest: " << b.layout.str() << (b.layout.loom_mode().empty() ? " (not runnable in loom yet)" : " (loom mode " + b.layout.loom_mode() + ")")
      << "\n";
    for (const Estimate& e : p.fitting) {
      if (e.layout.loom_mode().empty()) continue;
      if (&e != &b) {
        std::snprintf(buf, sizeof buf, "best that loom runs today: %s (loom mode %s), %.4g s/step, %.3g tokens/s, MFU %.1f%%\n",
                      e.layout.str().c_str(), e.layout.loom_mode().c_str(), e.step_s, e.tokens_per_s, 100 * e.mfu);
        o << buf;
      }
      break;
    }
    for (const Collective& c : b.collectives) {
      std::snprintf(buf, sizeof buf, "  %-42s %-14s over %-13s (%lld ranks, %s): %.4g B/step payload, %.4g B on the wire, %.3g s%s\n",
                    c.name.c_str(), c.kind.c_str(), c.axis.c_str(), static_cast<long long>(c.group),
                    c.inter_node ? "inter-node" : "intra-node", c.bytes, c.wire_bytes, c.seconds,
                    c.overlapped ? " (overlapped)" : "");
      o << buf;
    }
  }
  return o.str();
}

}  // namespace loom::plan
