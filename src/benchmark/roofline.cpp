#include "benchmark/roofline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backends/cpu/attention.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/peak.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/parallel.h"
#include "models/model.h"
#include "models/stats.h"
#include "benchmark/bandwidth.h"
#include "report/plot.h"
#include "train/optimizer.h"

namespace loom::bench {
namespace {

double numel(const profile::TensorInfo& t) { return static_cast<double>(t.shape.numel()); }
double bytes_of(const std::vector<profile::TensorInfo>& ts) {
  double b = 0;
  for (const auto& t : ts) b += static_cast<double>(t.bytes());
  return b;
}
// Bytes of the gradients a backward writes: one per input that requires grad.
double grad_bytes(const std::vector<profile::TensorInfo>& inputs) {
  double b = 0;
  for (const auto& t : inputs) b += t.requires_grad ? static_cast<double>(t.bytes()) : 0.0;
  return b;
}
bool needs(const profile::OpRecord& op, size_t i) { return i < op.inputs.size() && op.inputs[i].requires_grad; }

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// FLOPs per output element (forward, backward) of the elementwise-like ops: rough counts of the
// arithmetic in the kernels (an exp or a division counted as one), enough to place them on the roofline,
// where they sit far left whatever the constant.
struct PerElement {
  const char* family;
  double forward, backward;
};
const std::map<std::string, PerElement>& per_element_ops() {
  static const std::map<std::string, PerElement> table = {
      {"rms_norm", {"norm", 4, 8}},         {"add_rms_norm", {"norm", 5, 9}},
      {"layer_norm", {"norm", 7, 12}},      {"silu", {"activation", 4, 6}},
      {"gelu", {"activation", 10, 14}},     {"swiglu", {"activation", 5, 8}},
      {"dropout", {"activation", 2, 1}},    {"softmax", {"softmax", 5, 4}},
      {"rope", {"rope", 3, 3}},             {"add", {"elementwise", 1, 0}},
      {"sub", {"elementwise", 1, 1}},       {"mul", {"elementwise", 1, 2}},
      {"scale", {"elementwise", 1, 1}},     {"add_bias", {"elementwise", 1, 1}},
  };
  return table;
}

}  // namespace

OpCost op_cost(const profile::OpRecord& op) {
  OpCost c;
  const double in_bytes = bytes_of(op.inputs), out_bytes = bytes_of(op.outputs);
  // The default traffic: forward reads its inputs and writes its outputs; backward reads the output
  // gradients and the saved inputs and writes the input gradients.
  c.forward_bytes = in_bytes + out_bytes;
  c.backward_bytes = op.has_backward ? out_bytes + in_bytes + grad_bytes(op.inputs) : 0;
  const double out_numel = op.outputs.empty() ? 0 : numel(op.outputs[0]);
  const std::string& n = op.name;

  if (one_of(n, {"linear", "linear_bf16", "fsdp_linear"}) && op.inputs.size() >= 2 && !op.outputs.empty()) {
    // x: [..., K], y: [..., N]; M = rows.
    const double K = static_cast<double>(op.inputs[0].shape.back());
    const double N = static_cast<double>(op.outputs[0].shape.back());
    const double M = out_numel / std::max(N, 1.0);
    const bool bias = op.inputs.size() >= 3 && op.inputs[2].shape.numel() > 0;
    c.family = "matmul";
    c.forward_flops = 2 * M * N * K + (bias ? M * N : 0);
    c.palm_flops = 2 * M * N * K;
    if (op.has_backward) {
      const double dx = needs(op, 0) ? 2 * M * N * K : 0, dw = needs(op, 1) ? 2 * M * N * K : 0;
      c.backward_flops = dx + dw + (bias && needs(op, 2) ? M * N : 0);
      c.palm_flops += dx + dw;
    }
  } else if (n == "matmul" && op.inputs.size() >= 2 && !op.outputs.empty()) {
    // out: [..., M, N]; a: [..., M, K] or [..., K, M] (possibly unbatched against a batched out).
    const Shape& os = op.outputs[0].shape;
    const double N = static_cast<double>(os.back());
    const double M = os.ndim() >= 2 ? static_cast<double>(os[os.ndim() - 2]) : 1.0;
    const double K = op.inputs[0].shape.ndim() == os.ndim() ? numel(op.inputs[0]) * N / std::max(out_numel, 1.0)
                                                             : numel(op.inputs[0]) / std::max(M, 1.0);
    c.family = "matmul";
    c.forward_flops = c.palm_flops = 2 * out_numel * K;
    if (op.has_backward) {
      c.backward_flops = (needs(op, 0) ? 2 * out_numel * K : 0) + (needs(op, 1) ? 2 * out_numel * K : 0);
      c.palm_flops += c.backward_flops;
    }
  } else if (one_of(n, {"causal_self_attention", "scaled_dot_product_attention"}) && op.inputs.size() >= 3 &&
             !op.outputs.empty()) {
    // scores Q K^T and the weighted sum P V over the full Tq x Tk square: 2·Tk FLOPs per element of q
    // and per element of out. causal_self_attention's k is [B, T, H·D], sdpa's [..., Tk, D].
    const Shape& ks = op.inputs[1].shape;
    const double Tk = n == "causal_self_attention" ? static_cast<double>(ks[1]) : static_cast<double>(ks[ks.ndim() - 2]);
    c.family = "attention";
    c.forward_flops = 2 * numel(op.inputs[0]) * Tk + 2 * out_numel * Tk;
    c.backward_flops = op.has_backward ? 2 * c.forward_flops : 0;  // dV, dP, dQ, dK: four GEMMs of the two
    c.palm_flops = c.forward_flops + c.backward_flops;
  } else if (n == "linear_cross_entropy" && op.inputs.size() >= 2) {
    // x: [R, C], w: [V, C]. The forward also computes dx and dw (the logits never leave the cache), so
    // all three GEMMs are forward time here; the recorded backward only rescales them.
    const double C = static_cast<double>(op.inputs[0].shape.back());
    const double R = numel(op.inputs[0]) / std::max(C, 1.0);
    const double V = numel(op.inputs[1]) / std::max(C, 1.0);
    c.family = "lm_head+loss";
    const double gemms = 2 * R * V * C * (1 + (op.has_backward && needs(op, 0) ? 1 : 0) + (op.has_backward && needs(op, 1) ? 1 : 0));
    c.forward_flops = gemms + 6 * R * V;  // max, exp, sum, log; the gradient's scale and subtract
    c.palm_flops = gemms;
    c.forward_bytes = in_bytes + out_bytes + (op.has_backward ? grad_bytes(op.inputs) : 0);
    c.backward_bytes = op.has_backward ? grad_bytes(op.inputs) * 2 : 0;  // rescaled in place
    c.backward_flops = op.has_backward ? grad_bytes(op.inputs) / 4 : 0;
  } else if (n == "cross_entropy" && !op.inputs.empty()) {
    c.family = "lm_head+loss";
    c.forward_flops = 4 * numel(op.inputs[0]);
    c.backward_flops = op.has_backward ? 2 * numel(op.inputs[0]) : 0;
  } else if (n == "embedding" && op.inputs.size() >= 2) {
    // Reads the looked-up rows (as many bytes as it writes), not the whole table; the backward zeroes
    // a table-sized gradient and adds the rows into it.
    c.family = "embedding";
    c.forward_bytes = static_cast<double>(op.inputs[0].bytes()) + 2 * out_bytes;
    c.backward_flops = op.has_backward ? out_numel : 0;
    c.backward_bytes = op.has_backward ? 2 * out_bytes + static_cast<double>(op.inputs[1].bytes()) : 0;
  } else if (n == "sum" && !op.inputs.empty()) {
    c.family = "elementwise";
    c.forward_flops = numel(op.inputs[0]);
  } else if (auto it = per_element_ops().find(n); it != per_element_ops().end()) {
    c.family = it->second.family;
    c.forward_flops = it->second.forward * out_numel;
    c.backward_flops = op.has_backward ? it->second.backward * out_numel : 0;
  } else if (one_of(n, {"reshape", "transpose", "narrow", "concat", "split_heads", "merge_heads", "mla_query_heads",
                         "mla_key_value_heads"})) {
    c.family = "layout";
  } else if (one_of(n, {"all_reduce", "all_gather", "reduce_scatter", "copy_to_group", "gather_replicated",
                        "split_replicated"})) {
    c.family = "communication";
  } else if (n == "moe_experts" && op.inputs.size() >= 5 && op.inputs[2].shape.ndim() == 3) {
    // x [N, C], gates [N, K], w1, w3 [E, F, C], w2 [E, C, F]: each of the P = N·K routed slots runs its
    // expert's three GEMMs (2·F·C each), SwiGLU between them and the gated combine (backends/cpu/moe.h).
    // The backward: dau = dy w2 always, dx two GEMMs, each weight gradient one; the SwiGLU gradient.
    const double C = static_cast<double>(op.inputs[0].shape.back());
    const double N = numel(op.inputs[0]) / std::max(C, 1.0);
    const double K = static_cast<double>(op.inputs[1].shape.back());
    const double F = static_cast<double>(op.inputs[2].shape[1]);
    const double P = N * K, gemm = 2 * P * F * C;
    c.family = "moe";
    c.forward_flops = 3 * gemm + 5 * P * F + 2 * P * C;
    c.palm_flops = 3 * gemm;
    if (op.has_backward) {
      const double weights = (needs(op, 2) ? gemm : 0) + (needs(op, 3) ? gemm : 0) + (needs(op, 4) ? gemm : 0);
      const double gemms = gemm + (needs(op, 0) ? 2 * gemm : 0) + weights;
      c.backward_flops = gemms + 10 * P * F + P * C;
      c.palm_flops += gemms;
    }
  } else if (n.rfind("moe", 0) == 0) {
    c.family = "moe";
  } else {
    c.family = n;
  }
  return c;
}

std::vector<FamilyRow> aggregate_profile(const profile::Profile& profile, int64_t steps) {
  LOOM_CHECK(steps > 0, "roofline: steps must be positive, got ", steps);
  std::map<std::string, FamilyRow> rows;
  for (const auto& op : profile.ops) {
    const OpCost c = op_cost(op);
    FamilyRow& r = rows[c.family];
    r.family = c.family;
    r.seconds += op.forward_seconds + op.backward_seconds;
    r.flops += c.forward_flops + c.backward_flops;
    r.palm_flops += c.palm_flops;
    r.bytes += c.forward_bytes + c.backward_bytes;
  }
  if (profile.backward_glue_seconds > 0) {
    FamilyRow& r = rows["autograd (gradient sums)"];
    r.family = "autograd (gradient sums)";
    r.seconds += profile.backward_glue_seconds;
  }
  std::vector<FamilyRow> out;
  for (auto& [name, r] : rows) out.push_back(r);
  for (const auto& [name, seconds] : profile.regions) {
    auto it = std::find_if(out.begin(), out.end(), [&](const FamilyRow& r) { return r.family == name; });
    if (it == out.end()) {
      out.push_back(FamilyRow{});
      it = out.end() - 1;
      it->family = name;
    }
    it->seconds += seconds;
  }
  const double s = static_cast<double>(steps);
  for (auto& r : out) {
    r.seconds /= s;
    r.flops /= s;
    r.palm_flops /= s;
    r.bytes /= s;
  }
  std::sort(out.begin(), out.end(), [](const FamilyRow& a, const FamilyRow& b) { return a.seconds > b.seconds; });
  return out;
}

RooflineReport bench_roofline(const models::ModelConfig& config, const RooflineOptions& options) {
  LOOM_CHECK(options.batch_size > 0, "bench roofline: batch size must be positive, got ", options.batch_size);
  LOOM_CHECK(options.steps > 0, "bench roofline: steps must be positive, got ", options.steps);
  LOOM_CHECK(options.warmup_steps >= 0, "bench roofline: warm-up steps must be >= 0, got ", options.warmup_steps);
  LOOM_CHECK(options.bandwidth_mib >= 1, "bench roofline: bandwidth buffer must be >= 1 MiB, got ", options.bandwidth_mib);
  set_num_threads(threads_or_default(options.threads, "bench roofline: threads"));
  RooflineReport rep;
  rep.threads = num_threads();
  rep.bf16 = options.bf16;
  const models::ModelStats stats = config.stats();
  rep.preset_description = stats.description;

  std::unique_ptr<models::LanguageModel> model = config.build(options.seed);
  if (options.bf16) model->set_matmul_precision(ops::MatmulPrecision::BF16);
  train::AdamW optimizer(model->parameters(), train::AdamWOptions{.lr = 1e-3f, .weight_decay = 0.1f});
  int64_t n_params = 0;
  for (const nn::Parameter* p : model->parameters()) n_params += p->value.numel();
  const int64_t B = options.batch_size, T = config.context_length(), V = config.vocab_size();
  Tensor ids = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  RngKey key = RngKey::from_seed(options.seed).fold_in("roofline-data");
  for (int64_t i = 0; i < B * T; ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(random_bits(key, static_cast<uint64_t>(2 * i)) % static_cast<uint64_t>(V));
    targets.data<int32_t>()[i] = static_cast<int32_t>(random_bits(key, static_cast<uint64_t>(2 * i + 1)) % static_cast<uint64_t>(V));
  }
  const RngKey dropout_key = RngKey::from_seed(options.seed).fold_in("dropout");
  int64_t step_index = 0;
  profile::Profile prof;
  auto step = [&](bool profiled) {
    auto region = [&](const char* name, auto&& fn) {
      autograd::NoGradGuard no_grad;  // so that no op inside is taken for a forward op
      const double t0 = profile::Profile::now();
      fn();
      if (profiled) prof.add_region(name, profile::Profile::now() - t0);
    };
    optimizer.zero_grad();
    prof.mark();
    Tensor loss = model->loss(ids, targets, models::ForwardContext::train(dropout_key.fold_in(static_cast<uint64_t>(step_index++))));
    loss.backward();
    region("clip_grad_norm", [&] { train::clip_grad_norm(train::gradients_of(model->parameters()), 1.0); });
    region("adamw", [&] { optimizer.step(); });
  };
  // The roofs are measured before and after the steps and the higher kept: on a shared machine a single
  // measurement caught during someone else's burst would put every op above its roof.
  auto measure_roofs = [&] {
    rep.peak_gflops = std::max(rep.peak_gflops, cpu::measure_fma_peak(rep.threads, options.peak_seconds).gflops);
    rep.bf16_peak_gflops = std::max(rep.bf16_peak_gflops, cpu::measure_bf16_dot_peak(rep.threads, options.peak_seconds).gflops);
    rep.bandwidth_gb_per_s = std::max(rep.bandwidth_gb_per_s,
                                      measure_read_bandwidth(rep.threads, options.bandwidth_mib << 20, 3).gb_per_s);
  };
  measure_roofs();
  for (int64_t i = 0; i < options.warmup_steps; ++i) step(false);
  const double t0 = profile::Profile::now();
  {
    profile::ProfileScope scope(prof);
    for (int64_t i = 0; i < options.steps; ++i) step(true);
  }
  rep.step_seconds = (profile::Profile::now() - t0) / static_cast<double>(options.steps);
  rep.families = aggregate_profile(prof, options.steps);
  // The optimizer regions' traffic: clipping reads every gradient twice (the norm, then the scale) and
  // writes it once; AdamW reads parameter, gradient and both moments and writes three of them.
  for (auto& r : rep.families) {
    const double n = static_cast<double>(n_params);
    if (r.family == "clip_grad_norm") r.flops = 3 * n, r.bytes = 12 * n;
    if (r.family == "adamw") r.flops = 12 * n, r.bytes = 28 * n;
  }

  rep.tokens_per_step = B * T;
  rep.model_flops_per_step = stats.palm_flops_per_token() * static_cast<double>(B * T);
  for (const auto& r : rep.families) {
    rep.counted_flops_per_step += r.flops;
    rep.palm_counted_flops_per_step += r.palm_flops;
  }

  measure_roofs();
  rep.gemm_peak_gflops = options.bf16 && rep.bf16_peak_gflops > 0 ? rep.bf16_peak_gflops : rep.peak_gflops;
  for (auto& r : rep.families) {
    // The families whose FLOPs run on bf16 units under --bf16: the routed experts' GEMMs take bf16
    // operands too, and flash attention's products where the kernels take bf16 products (AVX512-BF16:
    // cpu::flash_attention_uses_bf16); elsewhere attention computes in f32 and its roof is the FMA peak.
    AttentionProblem bf16_attention;
    bf16_attention.bf16_products = options.bf16;
    const bool gemm = r.family == "matmul" || r.family == "lm_head+loss" || r.family == "moe" ||
                      (r.family == "attention" && cpu::flash_attention_uses_bf16(bf16_attention));
    const double peak = gemm ? rep.gemm_peak_gflops : rep.peak_gflops;
    if (r.flops > 0 && r.bytes > 0) {
      const double memory_roof = r.intensity() * rep.bandwidth_gb_per_s;
      r.memory_bound = memory_roof < peak;
      r.bound_gflops = std::min(peak, memory_roof);
      r.fraction_of_bound = r.gflops() / r.bound_gflops;
    } else if (r.bytes > 0) {
      r.memory_bound = true;
      r.fraction_of_bound = r.gb_per_s() / rep.bandwidth_gb_per_s;
    }
  }
  return rep;
}

namespace {
std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}
}  // namespace

std::string RooflineReport::table() const {
  std::string s;
  s += "model: " + preset_description + "\n";
  s += str("threads ", threads, ", ", bf16 ? "bf16 GEMMs" : "f32", ", ", cpu::cpu_isa_name(cpu::cpu_isa()),
           " kernels; FMA peak ", fixed(peak_gflops, 1), " GFLOP/s",
           bf16_peak_gflops > 0 ? ", bf16 dot-product peak " + fixed(bf16_peak_gflops, 1) + " GFLOP/s"
                                : std::string(", no bf16 dot-product instruction"),
           ", read bandwidth ", fixed(bandwidth_gb_per_s, 1), " GB/s (ridge at ",
           fixed(peak_gflops / std::max(bandwidth_gb_per_s, 1e-9), 1), " FLOP/byte)\n");
  s += str("step ", fixed(step_seconds * 1e3, 1), " ms for ", tokens_per_step, " tokens (",
           fixed(static_cast<double>(tokens_per_step) / step_seconds, 0), " tokens/s, profiler on)\n");
  s += "| family | ms/step | % of step | GFLOP | MB | FLOP/byte | GFLOP/s | GB/s | bound GFLOP/s | % of bound |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|\n";
  double total_seconds = 0;
  for (const auto& r : families) total_seconds += r.seconds;
  for (const auto& r : families) {
    std::string bound = r.flops > 0 && r.bytes > 0 ? fixed(r.bound_gflops, 1) + (r.memory_bound ? " (memory)" : " (compute)")
                        : r.bytes > 0 ? "memory" : "-";
    std::string pct = r.fraction_of_bound > 0 ? fixed(100 * r.fraction_of_bound, 0) + "%" + (r.flops > 0 ? "" : " of GB/s") : "-";
    s += str("| ", r.family, " | ", fixed(r.seconds * 1e3, 2), " | ", fixed(100 * r.seconds / step_seconds, 1), "% | ",
             fixed(r.flops / 1e9, 3), " | ", fixed(r.bytes / 1e6, 1), " | ", r.bytes > 0 ? fixed(r.intensity(), 2) : "-",
             " | ", fixed(r.gflops(), 1), " | ", fixed(r.gb_per_s(), 1), " | ", bound, " | ", pct, " |\n");
  }
  s += str("| (untimed: between ops, outside the families) | ", fixed((step_seconds - total_seconds) * 1e3, 2), " | ",
           fixed(100 * (step_seconds - total_seconds) / step_seconds, 1), "% | | | | | | | |\n");
  s += "(bound: min(peak, FLOP/byte x DRAM read bandwidth); above 100% an op's data came from the caches)\n";
  s += str("FLOPs per step: counted ", fixed(counted_flops_per_step / 1e9, 3), " G; of which GEMMs and attention ",
           fixed(palm_counted_flops_per_step / 1e9, 3), " G against the model's PaLM count (6N + 12·L·d·T) ",
           fixed(model_flops_per_step / 1e9, 3), " G (", fixed(100 * palm_counted_flops_per_step / model_flops_per_step, 2),
           "%)\n");
  return s;
}

std::string RooflineReport::json() const {
  nlohmann::json j = {{"model", preset_description}, {"threads", threads}, {"bf16", bf16},
                      {"peak_gflops", peak_gflops}, {"bf16_peak_gflops", bf16_peak_gflops},
                      {"bandwidth_gb_per_s", bandwidth_gb_per_s}, {"step_seconds", step_seconds},
                      {"tokens_per_step", tokens_per_step}, {"model_flops_per_step", model_flops_per_step},
                      {"counted_flops_per_step", counted_flops_per_step},
                      {"palm_counted_flops_per_step", palm_counted_flops_per_step},
                      {"cpu_kernels", cpu::cpu_isa_name(cpu::cpu_isa())}};
  j["families"] = nlohmann::json::array();
  for (const auto& r : families) {
    j["families"].push_back({{"family", r.family}, {"seconds", r.seconds}, {"flops", r.flops},
                             {"palm_flops", r.palm_flops}, {"bytes", r.bytes}, {"intensity", r.intensity()},
                             {"gflops", r.gflops()}, {"gb_per_s", r.gb_per_s()}, {"bound_gflops", r.bound_gflops},
                             {"memory_bound", r.memory_bound}, {"fraction_of_bound", r.fraction_of_bound}});
  }
  return j.dump(1);
}

std::vector<std::string> RooflineReport::write(const std::string& out_dir) const {
  std::filesystem::create_directories(out_dir);
  const std::string svg_path = (std::filesystem::path(out_dir) / "roofline.svg").string();
  std::ofstream svg_file(svg_path);
  LOOM_CHECK(svg_file.good(), "bench roofline: cannot write ", svg_path);
  svg_file << svg();
  const std::string json_path = (std::filesystem::path(out_dir) / "roofline.json").string();
  std::ofstream(json_path) << json() << "\n";
  return {svg_path, json_path};
}

std::string RooflineReport::svg() const {
  report::Chart chart;
  chart.title = str("Roofline: training step, ", threads, " threads, ", bf16 ? "bf16 GEMMs" : "f32");
  chart.x_label = "arithmetic intensity (FLOP/byte)";
  chart.y_label = "GFLOP/s";
  chart.log_x = chart.log_y = true;
  chart.width = 900;
  chart.height = 560;
  chart.legend_bottom_right = true;  // the roof's flat part runs along the top
  double lo = 1e-2, hi = 1e3;
  for (const auto& r : families) {
    if (r.flops > 0 && r.bytes > 0) lo = std::min(lo, r.intensity() / 2), hi = std::max(hi, r.intensity() * 2);
  }
  lo = std::pow(10.0, std::floor(std::log10(lo)));  // whole decades, as the axis spans
  hi = std::pow(10.0, std::ceil(std::log10(hi)));
  auto roof = [&](double peak, const std::string& label, const std::string& color) {
    report::Series s;
    s.label = label;
    s.color = color;
    s.stroke_width = 2;
    const double ridge = peak / bandwidth_gb_per_s;
    for (double x : {lo, ridge, hi}) {
      if (x < lo || x > hi) continue;
      s.x.push_back(x);
      s.y.push_back(std::min(peak, x * bandwidth_gb_per_s));
    }
    return s;
  };
  chart.series.push_back(roof(peak_gflops, str("f32 FMA roof (", fixed(peak_gflops, 0), " GFLOP/s, ",
                                               fixed(bandwidth_gb_per_s, 0), " GB/s)"), "#444444"));
  if (bf16_peak_gflops > 0) chart.series.push_back(roof(bf16_peak_gflops, str("bf16 dot roof (", fixed(bf16_peak_gflops, 0), ")"), "#d62728"));
  report::Series ops;
  ops.label = "op families";
  ops.color = "#1f77b4";
  ops.line = false;
  ops.markers = true;
  for (const auto& r : families) {
    if (r.flops <= 0 || r.bytes <= 0 || r.seconds <= 0) continue;
    const std::string label = str(r.family, " ", fixed(100 * r.seconds / step_seconds, 0), "%");
    // Families whose points nearly coincide (norms, activations and AdamW all sit near 0.4 FLOP/byte)
    // share one label, "a 3%, b 2%", at the first of them, instead of printing over each other.
    bool merged = false;
    for (size_t j = 0; j < ops.x.size() && !merged; ++j) {
      if (std::fabs(std::log10(ops.x[j] / r.intensity())) < 0.25 && std::fabs(std::log10(ops.y[j] / r.gflops())) < 0.12 &&
          !ops.point_labels[j].empty()) {
        ops.point_labels[j] += ", " + label;
        merged = true;
      }
    }
    ops.x.push_back(r.intensity());
    ops.y.push_back(r.gflops());
    ops.point_labels.push_back(merged ? "" : label);
  }
  chart.series.push_back(ops);
  return report::render_svg(chart);
}

}  // namespace loom::bench
