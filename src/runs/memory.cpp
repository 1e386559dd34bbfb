#include "runs/memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/hf.h"
#include "models/stats.h"

namespace loom::runs {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kF32 = 4;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
// Values kept per token, per layer, per unit of d_model (see memory.h for the measurement).
constexpr double kActivationValues = 24;
constexpr double kLossChunkRows = 512;  // ops::linear_cross_entropy's default chunk
constexpr double kRuntimeBytes = 64 * kMiB;
// Above this many parameters (4 PB of f32) no machine holds the model, and a family's int64 counts could
// overflow: the double-precision bound stands in for the family's stats.
constexpr double kStatsLimit = 1e15;

double model_int(const json& model, const char* key) {
  return model.contains(key) && model[key].is_number() ? model[key].get<double>() : 0.0;
}

// "model.d_model=64 model.num_layers=2": the model keys among `keys` this family has.
std::string model_keys(const json& model, std::initializer_list<const char*> keys) {
  std::string out;
  for (const char* k : keys) {
    if (!model.contains(k)) continue;
    out += str(out.empty() ? "" : " ", "model.", k, "=", model[k].dump());
  }
  return out;
}

std::string joined(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (!p.empty()) out += (out.empty() ? "" : " ") + p;
  }
  return out;
}

// A lower bound on the parameters that every family meets (token embeddings plus the attention's square
// projections), in double.
double parameter_bound(const models::ModelConfig& model) {
  const json& j = model.json();
  const double V = model_int(j, "vocab_size"), d = model_int(j, "d_model"), L = model_int(j, "num_layers");
  return V * d + L * 2.0 * d * d;
}

// What the estimate reads from the family's stats, or from the bound and the generic keys when the
// model is too large for the family's int64 arithmetic.
struct ModelCounts {
  double params = 0;
  double kv_floats_per_token = 0;
};
ModelCounts counts_of(const models::ModelConfig& model) {
  const double bound = parameter_bound(model);
  if (bound > kStatsLimit) {
    const json& j = model.json();
    return {bound, 2 * model_int(j, "num_layers") * model_int(j, "d_model")};
  }
  const models::ModelStats s = model.stats();
  return {std::max(static_cast<double>(s.total_params), bound), static_cast<double>(s.kv_cache_floats_per_token)};
}

// "12345678 parameters: model.vocab_size=512 ..."
std::string param_keys(const json& j, double count) {
  char n[32];
  std::snprintf(n, sizeof n, "%.4g", count);
  return str(n, " parameters: ", model_keys(j, {"vocab_size", "d_model", "num_layers", "d_ff"}));
}

// The activation width: d_model (every family has it).
double width(const models::ModelConfig& model) { return model_int(model.json(), "d_model"); }

void add_activations(MemoryEstimate& e, const models::ModelConfig& model, double batch, double context,
                     const std::string& batch_key, const std::string& context_key, bool training) {
  const json& j = model.json();
  const double layers = training ? model_int(j, "num_layers") : 1.0;
  e.add(training ? "activations kept for backward" : "activations of one layer",
        joined({batch_key + "=" + str(static_cast<int64_t>(batch)), context_key + "=" + str(static_cast<int64_t>(context)),
                model_keys(j, training ? std::initializer_list<const char*>{"d_model", "num_layers"}
                                       : std::initializer_list<const char*>{"d_model"})}),
        batch * context * width(model) * layers * kActivationValues * kF32);
}

void add_loss_chunk(MemoryEstimate& e, const models::ModelConfig& model, double rows) {
  e.add("LM head chunk", model_keys(model.json(), {"vocab_size"}),
        std::min(rows, kLossChunkRows) * static_cast<double>(model.vocab_size()) * 2 * kF32);
}

void add_kv_cache(MemoryEstimate& e, const models::ModelConfig& model, double batch) {
  e.add("KV cache", joined({model_keys(model.json(), {"num_layers", "d_model", "num_kv_heads", "context_length"}),
                            batch > 1 ? str("batch=", static_cast<int64_t>(batch)) : ""}),
        batch * counts_of(model).kv_floats_per_token * static_cast<double>(model.context_length()) * kF32);
}

double json_number(const json& j, std::initializer_list<const char*> keys, std::string* used) {
  for (const char* k : keys) {
    if (j.contains(k) && j[k].is_number()) {
      *used += str(used->empty() ? "" : " ", k, "=", j[k].dump());
      return j[k].get<double>();
    }
  }
  return 0.0;
}

double parse_meminfo_kib(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      double kib = -1;
      fields >> kib;
      return kib;
    }
  }
  return -1;
}

// The cgroup v2 limit left to this process: memory.max - memory.current, or -1 when unlimited/unknown.
double cgroup_room() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return -1;
  const fs::path dir = fs::path("/sys/fs/cgroup") / fs::path(path).relative_path();
  std::ifstream max_in(dir / "memory.max"), cur_in(dir / "memory.current");
  std::string max_text;
  double current = 0;
  if (!(max_in >> max_text) || max_text == "max" || !(cur_in >> current)) return -1;
  char* end = nullptr;
  const double max = std::strtod(max_text.c_str(), &end);
  if (end == max_text.c_str()) return -1;
  return std::max(0.0, max - current);
}

}  // namespace

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= kGiB) {
    std::snprintf(buf, sizeof buf, bytes >= 1e5 * kGiB ? "%.3g GiB" : "%.1f GiB", bytes / kGiB);
  } else if (bytes >= kMiB / 10) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / kMiB);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024);
  }
  return buf;
}

void MemoryEstimate::add(std::string what, std::string keys, double bytes) {
  terms.push_back({std::move(what), std::move(keys), bytes});
}

void MemoryEstimate::add(const MemoryEstimate& other) {
  terms.insert(terms.end(), other.terms.begin(), other.terms.end());
}

double MemoryEstimate::total_bytes() const {
  double total = 0;
  for (const MemoryTerm& t : terms) total += t.bytes;
  return total;
}

std::string MemoryEstimate::describe() const {
  std::vector<MemoryTerm> sorted = terms;
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  // The terms that make the total, largest first; those under 1% of it in one sum.
  const double total = total_bytes();
  std::string out;
  double rest = 0;
  int rest_count = 0;
  for (const MemoryTerm& t : sorted) {
    if (!out.empty() && t.bytes < 0.01 * total) {
      rest += t.bytes;
      ++rest_count;
      continue;
    }
    out += str(out.empty() ? "" : "; ", t.what, " ", format_bytes(t.bytes), t.keys.empty() ? "" : " (" + t.keys + ")");
  }
  if (rest_count > 0) out += str("; ", rest_count, " smaller terms ", format_bytes(rest));
  return out;
}

MemoryEstimate model_memory(const models::ModelConfig& model) {
  MemoryEstimate e;
  const double P = counts_of(model).params;
  e.add("parameters", param_keys(model.json(), P), P * kF32);
  e.add("position tables", model_keys(model.json(), {"context_length"}), static_cast<double>(model.context_length()) * 8);
  e.add("runtime", "", kRuntimeBytes);
  return e;
}

MemoryEstimate training_step_memory(const models::ModelConfig& model, int64_t batch_size, bool bf16,
                                    const std::string& batch_key) {
  const double P = counts_of(model).params, B = static_cast<double>(batch_size);
  const double T = static_cast<double>(model.context_length());
  MemoryEstimate e = model_memory(model);
  // The parameters' gradients and AdamW moments: 12 more bytes per parameter (14 with bf16 copies).
  MemoryTerm& weights = e.terms.front();
  LOOM_ASSERT(weights.what == "parameters");
  weights.what = bf16 ? "parameters, gradients, AdamW moments and bf16 copies" : "parameters, gradients and AdamW moments";
  weights.bytes = P * (4 * kF32 + (bf16 ? 2 : 0));
  add_activations(e, model, B, T, batch_key, "model.context_length", /*training=*/true);
  add_loss_chunk(e, model, B * T);
  e.add("batch", "", B * T * 8);
  return e;
}

MemoryEstimate kv_cache_memory(const models::ModelConfig& model, int64_t batch) {
  MemoryEstimate e;
  add_kv_cache(e, model, static_cast<double>(batch));
  return e;
}

MemoryEstimate inference_memory(const models::ModelConfig& model, int64_t batch, int64_t context, int64_t logits_rows) {
  const double T = static_cast<double>(context > 0 ? context : model.context_length());
  MemoryEstimate e = model_memory(model);
  add_activations(e, model, static_cast<double>(batch), T, "batch", context > 0 ? "--context-length" : "model.context_length",
                  /*training=*/false);
  add_loss_chunk(e, model, static_cast<double>(batch) * T);
  if (logits_rows > 0) {
    e.add("logits", model_keys(model.json(), {"vocab_size"}),
          static_cast<double>(logits_rows) * static_cast<double>(model.vocab_size()) * kF32);
  }
  return e;
}

MemoryEstimate generation_memory(const models::ModelConfig& model, int64_t batch) {
  MemoryEstimate e = model_memory(model);
  add_kv_cache(e, model, static_cast<double>(batch));
  e.add("logits", model_keys(model.json(), {"vocab_size"}),
        static_cast<double>(batch) * static_cast<double>(model.vocab_size()) * kF32);
  return e;
}

MemoryEstimate hf_import_memory(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "config.json";
  const json c = models::hf_read_json(config_path);
  std::string keys;
  const double V = json_number(c, {"vocab_size"}, &keys);
  const double d = json_number(c, {"hidden_size", "n_embd", "d_model"}, &keys);
  const double L = json_number(c, {"num_hidden_layers", "n_layer", "num_layers"}, &keys);
  double F = json_number(c, {"intermediate_size", "n_inner"}, &keys);
  if (F == 0) F = 4 * d;
  const double T = json_number(c, {"max_position_embeddings", "n_positions"}, &keys);
  const double from_config = 2 * V * d + L * (4 * d * d + 3 * d * F) + T * d;
  // The weights as the headers describe them (nothing but the headers is read).
  double elements = 0, largest = 0;
  for (const std::string& path : models::hf_weight_files(dir)) {
    io::SafetensorsFile file = io::SafetensorsFile::open(path);
    for (const std::string& name : file.names()) {
      const double n = static_cast<double>(file.info(name).numel());
      elements += n;
      largest = std::max(largest, n);
    }
  }
  MemoryEstimate e;
  e.add("parameters", str(config_path.string(), ": ", keys), std::max(from_config, elements) * kF32);
  e.add("position tables", "", T * 8);
  e.add("conversion buffers", "the largest tensor in the safetensors headers", 2 * largest * kF32);
  e.add("runtime", "", kRuntimeBytes);
  return e;
}

ActivationModel activation_model(const models::ModelConfig& model, models::Recompute recompute, int64_t tensor) {
  const json& j = model.json();
  const double t = static_cast<double>(std::max<int64_t>(tensor, 1));
  const double C = model_int(j, "d_model"), H = model_int(j, "num_heads");
  double none = 0, selective = 0, head_extra = 0;
  std::string terms;
  const std::string& arch = model.arch();
  if (arch == "gpt2") {
    const double F = model_int(j, "d_ff") > 0 ? model_int(j, "d_ff") : 4 * C;
    none = 4 * C + 4 + (4 * C + H + 2 * F) / t + (t > 1 ? 2 * C : 0);
    head_extra = 1;  // LayerNorm keeps a mean beside the rstd
    selective = 3 * C + (3 * C + F) / t;
    terms = "x, ln1 (mean, rstd, out), q, k, v, attention out and lse, h, ln2, fc out, gelu out";
  } else if (arch == "deepseek_v3") {
    const double Q = model_int(j, "q_rank"), R = model_int(j, "kv_rank"), P = model_int(j, "d_rope");
    const double N = model_int(j, "d_nope"), Dv = model_int(j, "d_v"), F = model_int(j, "d_ff");
    const double E = model_int(j, "n_routed"), K = model_int(j, "top_k"), De = model_int(j, "d_expert");
    const double S = model_int(j, "n_shared"), L = model_int(j, "num_layers"), dense = model_int(j, "n_dense");
    // MLA: x, rstd, norm out, wq_a out, q_norm (rstd, out), wkv_a out, kv_norm (rstd, out), per-head q,
    // k, v, attention out, lse, h, ffn_norm (rstd, out).
    const double mla = 4 * C + 2 * Q + (R + P) + R + 4 + (2 * H * (N + P) + 2 * H * Dv + H) / t;
    const double mla_kept = C + Q + (R + P) + H * (N + P) / t + H * (N + Dv) / t + C;
    const double dense_ffn = 3 * F / t, dense_kept = 2 * F / t + C;
    // MoE: router logits and scores, the K slots' rows and w1 x, w3 x, swiglu out, the shared experts.
    const double moe_ffn = 2 * E + K * (C + 3 * De) + 3 * S * De / t, moe_kept = E + 2 * S * De / t + (S > 0 ? C : 0);
    const double moe_layers = L - dense;
    none = mla + (dense * dense_ffn + moe_layers * moe_ffn) / std::max(L, 1.0) + (t > 1 ? Q + R + P + 2 * C : 0);
    selective = mla_kept + (dense * dense_kept + moe_layers * moe_kept) / std::max(L, 1.0);
    terms = "MLA's norms, latents, per-head q, k, v and attention out; the dense SwiGLU's or the MoE's slots (the layers' mean)";
  } else {  // llama
    const double kv = model_int(j, "num_kv_heads") > 0 ? model_int(j, "num_kv_heads") : H;
    const double K = H > 0 ? kv * C / H : C, F = model_int(j, "d_ff");
    none = 4 * C + 3 + (2 * C + 2 * K + H + 3 * F) / t + (t > 1 ? 3 * C : 0);
    selective = 3 * C + (C + 2 * K + 2 * F) / t;
    terms = "x, ln1 (rstd, out), q, k, v, attention out and lse, h, ln2, w1 x, w3 x, swiglu out";
  }
  ActivationModel a;
  // The last layer's output, ln_final's output and statistics, and the fused head's input gradient,
  // which ops::linear_cross_entropy computes in the forward (the logits never exist).
  a.head = 3 * C + 1 + head_extra;
  switch (recompute) {
    case models::Recompute::None:
      a.per_layer = none;
      a.terms = terms;
      break;
    case models::Recompute::Full:
      a.per_layer = C;
      a.recompute = none - C;
      a.terms = "the layer's input x (the rest is recomputed in its backward)";
      break;
    case models::Recompute::Selective:
      a.per_layer = selective;
      a.recompute = none - selective;
      a.terms = "x and the GEMMs' outputs (norms, activations and the attention core recomputed)";
      break;
  }
  return a;
}

double kept_activation_bytes(const ActivationModel& a, double tokens, int64_t layers) {
  return tokens * (static_cast<double>(layers) * a.per_layer + a.head) * kF32;
}

double loss_forward_bytes(const models::ModelConfig& model, double tokens, int64_t tensor) {
  (void)tensor;  // the head's table is gathered whole before the loss: its chunk is V wide on every rank
  return std::min(tokens, kLossChunkRows) * static_cast<double>(model.vocab_size()) * 2 * kF32 + tokens * width(model) * kF32;
}

double step_peak_bytes(const ActivationModel& a, const models::ModelConfig& model, double tokens, int64_t layers,
                       double grad_bytes) {
  const double loss = loss_forward_bytes(model, tokens);
  const double backward = grad_bytes + tokens * a.recompute * kF32;
  return kept_activation_bytes(a, tokens, layers) + std::max(loss, backward);
}

MemoryBudget MemoryBudget::of_machine() {
  const double available_kib = parse_meminfo_kib("MemAvailable");
  MemoryBudget b;
  if (available_kib < 0) {
    b.bytes = std::numeric_limits<double>::infinity();
    b.source = "no limit known (no MemAvailable in /proc/meminfo)";
  } else {
    b.bytes = available_kib * 1024;
    b.source = "MemAvailable in /proc/meminfo";
  }
  const double room = cgroup_room();
  if (room >= 0 && room < b.bytes) {
    b.bytes = room;
    b.source = "the cgroup's memory.max minus memory.current";
  }
  return b;
}

MemoryBudget MemoryBudget::parse(const std::string& size, const std::string& what) {
  const char* begin = size.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  std::string unit(end);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }), unit.end());
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = -1;
  if (unit.empty() || unit == "B") scale = 1;
  const std::string prefixes = "KMGT";
  const size_t p = unit.empty() ? std::string::npos : prefixes.find(unit[0]);
  if (p != std::string::npos && (unit.size() == 1 || unit.substr(1) == "B" || unit.substr(1) == "IB")) {
    scale = std::pow(1024.0, static_cast<double>(p + 1));
  }
  LOOM_CHECK(end != begin && scale > 0 && std::isfinite(number) && number > 0, what, " must be a size such as 8G, ",
             "512MiB or 1.5GiB, got \"", size, "\"");
  return {number * scale, str(what, " ", size)};
}

MemoryBudget MemoryBudget::from_setting(const std::string& setting, const std::string& what) {
  return setting.empty() ? of_machine() : parse(setting, what);
}

void check_memory(const MemoryEstimate& estimate, const MemoryBudget& budget, const std::string& job) {
  const double total = estimate.total_bytes();
  if (total <= budget.bytes) return;
  LOOM_FAIL(job, ": needs an estimated ", format_bytes(total), " of memory, more than the ", format_bytes(budget.bytes),
            " available (", budget.source, "): ", estimate.describe(),
            ". Make the keys named first smaller; if the estimate is too cautious for this job, set --max-memory "
            "(the estimate is explained in src/runs/memory.h)");
}

}  // namespace loom::runs
