#include "train/config.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/thread_count.h"
#include "mesh/mesh.h"
#include "parallel/pipeline.h"
#include "generate/generate.h"
#include "io/file.h"
#include "io/json_checked.h"
#include "models/family.h"
#include "io/json.h"
#include "train/config_file.h"
#include "train/presets.h"

namespace loom::train {
namespace fs = std::filesystem;
using nlohmann::json;
using io::merge_checked;

namespace {

// Applies one "a.b=value" override to the merged JSON.
void apply_override(json& merged, const std::string& assignment) {
  auto [path, value] = parse_override(assignment);
  // Find the default at that path to decide how to read the text.
  const json* slot = &merged;
  std::stringstream ss(path);
  std::string part;
  json overlay_value = value;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (const auto& p : parts) {
    if (!slot->is_object() || !slot->contains(p)) {
      slot = nullptr;
      break;
    }
    slot = &(*slot)[p];
  }
  // A string key takes the text as written (`--set data.train=x.bin`, `--set sample.prompt=1984`), unless
  // it was written as a quoted JSON string.
  if (slot && slot->is_string() && !value.is_string()) {
    overlay_value = assignment.substr(assignment.find('=') + 1);
  }
  json overlay = overlay_value;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) overlay = json{{*it, overlay}};
  merge_checked(merged, overlay, "");
}

template <typename T>
void check_positive(T v, const char* key) {
  LOOM_CHECK(v > 0, "config: ", key, " must be positive, got ", v);
}
template <typename T>
void check_non_negative(T v, const char* key) {
  LOOM_CHECK(v >= 0, "config: ", key, " must be >= 0, got ", v);
}

// The family a config and its overrides ask for: the last "--set model.arch=..." wins over the file.
std::string requested_arch(const json& j, const std::vector<std::string>& overrides) {
  std::string arch = "llama";
  if (j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("arch") &&
      j["model"]["arch"].is_string()) {
    arch = j["model"]["arch"].get<std::string>();
  }
  for (const auto& o : overrides) {
    if (o.rfind("model.arch=", 0) == 0) arch = o.substr(11);
  }
  return arch;
}

}  // namespace

std::pair<std::string, json> parse_override(const std::string& assignment) {
  auto eq = assignment.find('=');
  LOOM_CHECK(eq != std::string::npos && eq > 0, "config: --set expects section.key=value, got \"",
             io::brief_text(assignment), "\"");
  std::string path = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  // A config is JSON, which holds UTF-8 text only: bytes that are not fail here, naming the key, rather
  // than in a JSON library's message when the config is written out.
  try {
    (void)json(text).dump();
  } catch (const json::type_error&) {
    LOOM_FAIL("config: ", path, "=", io::brief_text(text), ": the value is not valid UTF-8");
  }
  json value = io::try_parse_json(text);
  if (value.is_discarded()) value = text;  // not JSON: a plain string
  return {path, value};
}

const std::vector<io::KeyRelation>& TrainConfig::relations() {
  // warmup_steps, eval.interval and checkpoint.interval above max_steps are no relation: the run then ends
  // inside the warmup, or before its first evaluation or checkpoint, and a resumed run may go further.
  static const std::vector<io::KeyRelation> r = {
      {io::Relation::AtMost, "optimizer.min_lr", "optimizer.lr", " (the cosine decays from lr to min_lr)"},
  };
  return r;
}

json TrainConfig::defaults_json(const std::string& arch) {
  TrainConfig c;
  c.model = models::ModelConfig::from_json(json{{"arch", arch}});
  return c.to_json();
}

json TrainConfig::to_json() const {
  return json{
      {"description", description},
      {"model", model.json()},
      {"optimizer",
       {{"lr", optimizer.lr},
        {"min_lr", optimizer.min_lr},
        {"beta1", optimizer.beta1},
        {"beta2", optimizer.beta2},
        {"eps", optimizer.eps},
        {"weight_decay", optimizer.weight_decay},
        {"grad_clip", optimizer.grad_clip}}},
      {"schedule", {{"warmup_steps", schedule.warmup_steps}, {"cosine_steps", schedule.cosine_steps}}},
      {"data",
       {{"corpus", data.corpus},
        {"val_fraction", data.val_fraction},
        {"tokenizer", data.tokenizer},
        {"train", data.train},
        {"val", data.val}}},
      {"training",
       {{"max_steps", training.max_steps},
        {"batch_size", training.batch_size},
        {"grad_accum_steps", training.grad_accum_steps},
        {"seed", training.seed},
        {"threads", training.threads},
        {"sampling", data::sampling_name(training.sampling)},
        {"precision", training.precision},
        {"recompute", training.recompute},
        {"device", training.device}}},
      {"eval", {{"interval", eval.interval}, {"batches", eval.batches}}},
      {"checkpoint", {{"interval", checkpoint.interval}, {"keep_last", checkpoint.keep_last}}},
      {"logging",
       {{"interval", logging.interval}, {"progress", logging.progress}, {"peak_flops", logging.peak_flops}}},
      {"sample",
       {{"prompt", sample.prompt},
        {"num_samples", sample.num_samples},
        {"max_new_tokens", sample.max_new_tokens},
        {"temperature", sample.temperature},
        {"top_k", sample.top_k},
        {"top_p", sample.top_p}}},
      {"parallel",
       {{"mode", parallel.mode},
        {"mesh", parallel.mesh},
        {"max_expert_rows", parallel.max_expert_rows},
        {"schedule", parallel.schedule},
        {"pipe_layers", parallel.pipe_layers},
        {"virtual_stages", parallel.virtual_stages}}},
  };
}

TrainConfig TrainConfig::from_json(const json& j) {
  json m = defaults_json(requested_arch(j, {}));
  merge_checked(m, j, "");
  TrainConfig c;
  c.description = m["description"].get<std::string>();
  c.model = models::ModelConfig::from_json(m["model"]);
  const json& o = m["optimizer"];
  c.optimizer = {o["lr"].get<double>(),    o["min_lr"].get<double>(),       o["beta1"].get<double>(),
                 o["beta2"].get<double>(), o["eps"].get<double>(),          o["weight_decay"].get<double>(),
                 o["grad_clip"].get<double>()};
  c.schedule = {m["schedule"]["warmup_steps"].get<int64_t>(), m["schedule"]["cosine_steps"].get<int64_t>()};
  const json& d = m["data"];
  c.data = {d["corpus"].get<std::string>(), d["val_fraction"].get<double>(), d["tokenizer"].get<std::string>(),
            d["train"].get<std::string>(), d["val"].get<std::string>()};
  const json& t = m["training"];
  c.training.max_steps = t["max_steps"].get<int64_t>();
  c.training.batch_size = t["batch_size"].get<int64_t>();
  c.training.grad_accum_steps = t["grad_accum_steps"].get<int64_t>();
  c.training.seed = t["seed"].get<uint64_t>();
  c.training.threads = t["threads"].get<int64_t>();
  std::string sampling = t["sampling"].get<std::string>();
  LOOM_CHECK(sampling == "random" || sampling == "sequential",
             "config: training.sampling must be \"random\" or \"sequential\", got \"", sampling, "\"");
  c.training.sampling = data::sampling_from_name(sampling);
  c.training.precision = t["precision"].get<std::string>();
  LOOM_CHECK(c.training.precision == "f32" || c.training.precision == "bf16",
             "config: training.precision must be \"f32\" or \"bf16\", got \"", c.training.precision, "\"");
  c.training.recompute = t["recompute"].get<std::string>();
  LOOM_CHECK(c.training.recompute == "none" || c.training.recompute == "full" || c.training.recompute == "selective",
             "config: training.recompute must be \"none\", \"full\" or \"selective\", got \"", c.training.recompute,
             "\"");
  c.training.device = t["device"].get<std::string>();
  try {
    (void)Device::parse(c.training.device);
  } catch (const Error& e) {
    LOOM_FAIL("config: training.device: ", e.what());
  }
  c.eval = {m["eval"]["interval"].get<int64_t>(), m["eval"]["batches"].get<int64_t>()};
  c.checkpoint = {m["checkpoint"]["interval"].get<int64_t>(), m["checkpoint"]["keep_last"].get<int64_t>()};
  const json& l = m["logging"];
  c.logging = {l["interval"].get<int64_t>(), l["progress"].get<std::string>(), l["peak_flops"].get<double>()};
  const json& s = m["sample"];
  c.sample = {s["prompt"].get<std::string>(),  s["num_samples"].get<int64_t>(), s["max_new_tokens"].get<int64_t>(),
              s["temperature"].get<double>(), s["top_k"].get<int64_t>(),       s["top_p"].get<double>()};
  c.parallel = {m["parallel"]["mode"].get<std::string>(), m["parallel"]["mesh"].get<std::string>(),
                m["parallel"]["max_expert_rows"].get<int64_t>(), m["parallel"]["schedule"].get<std::string>(),
                m["parallel"]["pipe_layers"].get<std::string>(), m["parallel"]["virtual_stages"].get<int64_t>()};
  c.validate();
  return c;
}

void TrainConfig::validate() const {
  model.family().validate(model.json());

  LOOM_CHECK(std::isfinite(optimizer.lr) && optimizer.lr >= 0, "config: optimizer.lr must be >= 0, got ",
             optimizer.lr);
  check_non_negative(optimizer.min_lr, "optimizer.min_lr");
  LOOM_CHECK(optimizer.beta1 >= 0 && optimizer.beta1 < 1, "config: optimizer.beta1 must be in [0, 1), got ",
             optimizer.beta1);
  LOOM_CHECK(optimizer.beta2 >= 0 && optimizer.beta2 < 1, "config: optimizer.beta2 must be in [0, 1), got ",
             optimizer.beta2);
  check_positive(optimizer.eps, "optimizer.eps");
  check_non_negative(optimizer.weight_decay, "optimizer.weight_decay");
  check_non_negative(optimizer.grad_clip, "optimizer.grad_clip");

  // warmup_steps > max_steps is allowed: the run then ends inside the warmup.
  check_non_negative(schedule.warmup_steps, "schedule.warmup_steps");
  check_non_negative(schedule.cosine_steps, "schedule.cosine_steps");

  // A path the system cannot hold is said with its key, not as "File name too long" from wherever it is
  // first opened.
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"data.corpus", data.corpus},
                                  {"data.tokenizer", data.tokenizer}, {"data.train", data.train}, {"data.val", data.val}}) {
    LOOM_CHECK(path.size() < PATH_MAX, "config: ", key, " = ", io::brief_text(path), " is ", path.size(),
               " bytes long, longer than a path can be (", PATH_MAX - 1, ")");
    for (const auto& part : std::filesystem::path(path)) {
      LOOM_CHECK(part.native().size() <= NAME_MAX, "config: ", key, " = ", io::brief_text(path), ": a name in it is ",
                 part.native().size(), " bytes long (at most ", NAME_MAX, ")");
    }
  }
  LOOM_CHECK(!data.train.empty(), "config: data.train must name the training token file");
  LOOM_CHECK(!data.val.empty(), "config: data.val must name the validation token file");
  LOOM_CHECK(data.val_fraction > 0 && data.val_fraction < 1, "config: data.val_fraction must be in (0, 1), got ",
             data.val_fraction);

  check_positive(training.max_steps, "training.max_steps");
  check_positive(training.batch_size, "training.batch_size");
  check_positive(training.grad_accum_steps, "training.grad_accum_steps");
  LOOM_CHECK(training.threads >= 0 && training.threads <= kMaxThreads, "config: training.threads must be in [0, ",
             kMaxThreads, "] (0: every core), got ", training.threads);

  check_non_negative(eval.interval, "eval.interval");
  check_positive(eval.batches, "eval.batches");
  check_non_negative(checkpoint.interval, "checkpoint.interval");
  check_non_negative(checkpoint.keep_last, "checkpoint.keep_last");
  check_positive(logging.interval, "logging.interval");
  LOOM_CHECK(logging.progress == "auto" || logging.progress == "bar" || logging.progress == "lines" ||
                 logging.progress == "none",
             "config: logging.progress must be \"auto\", \"bar\", \"lines\" or \"none\", got \"", logging.progress,
             "\"");
  check_non_negative(logging.peak_flops, "logging.peak_flops");

  check_non_negative(sample.num_samples, "sample.num_samples");
  LOOM_CHECK(sample.max_new_tokens >= 0 && sample.max_new_tokens <= generate::kMaxNewTokens,
             "config: sample.max_new_tokens must be in [0, ", generate::kMaxNewTokens, "], got ",
             sample.max_new_tokens);
  check_non_negative(sample.temperature, "sample.temperature");
  check_non_negative(sample.top_k, "sample.top_k");
  LOOM_CHECK(sample.top_p > 0 && sample.top_p <= 1, "config: sample.top_p must be in (0, 1], got ", sample.top_p);

  // The mode, the mesh, and what the model and batch need of them (the ranks are checked at launch).
  check_non_negative(parallel.max_expert_rows, "parallel.max_expert_rows");
  try {
    const dist::ParallelMode mode = dist::parallel_mode_from_name(parallel.mode);
    const dist::Mesh mesh = dist::Mesh::parse(parallel.mesh);
    dist::validate_mesh_for_mode(mesh, mode);
    dist::validate_batch_for_mesh(training.batch_size, mesh, mode);
    const json& mj = model.json();
    LOOM_CHECK(parallel.schedule == "1f1b" || parallel.schedule == "gpipe" || parallel.schedule == "interleaved",
               "unknown parallel.schedule \"", parallel.schedule, "\": expected 1f1b, gpipe or interleaved");
    if (mesh.pipe > 1) {
      dist::check_pipe_schedule(parallel.schedule, parallel.virtual_stages, mesh.pipe, training.grad_accum_steps);
      const int64_t layers = mj.value("num_layers", int64_t{0}), stages = mesh.pipe * parallel.virtual_stages;
      LOOM_CHECK(stages <= layers, "mesh ", mesh.str(), ": pipe=", mesh.pipe,
                 parallel.virtual_stages > 1 ? str(" x parallel.virtual_stages=", parallel.virtual_stages) : std::string(),
                 " needs at least as many blocks, but model.num_layers is ", layers);
      if (!parallel.pipe_layers.empty()) dist::stage_bounds_from_counts(parallel.pipe_layers, layers, stages);
    } else {
      LOOM_CHECK(parallel.pipe_layers.empty(), "parallel.pipe_layers=\"", parallel.pipe_layers,
                 "\" sets the stages of a pipe axis, but the mesh ", mesh.str(), " has none");
      LOOM_CHECK(parallel.virtual_stages == 1, "parallel.virtual_stages=", parallel.virtual_stages,
                 " sets the stages per rank of a pipe axis, but the mesh ", mesh.str(), " has none");
    }
    if (mj.contains("num_heads") && mj["num_heads"].is_number_integer()) {
      const int64_t heads = mj["num_heads"].get<int64_t>();
      const int64_t kv = mj.contains("num_kv_heads") && mj["num_kv_heads"].get<int64_t>() > 0
                             ? mj["num_kv_heads"].get<int64_t>() : heads;
      dist::validate_model_for_mesh(heads, kv, mesh, mode);
    }
    if (mj.contains("n_routed") && mj["n_routed"].is_number_integer()) {
      dist::validate_experts_for_mesh(mj["n_routed"].get<int64_t>(), mesh, mode);
    } else {
      LOOM_CHECK(!dist::is_expert_mode(mode), "parallel mode ", parallel.mode,
                 " splits routed experts, but the model (", mj.value("arch", std::string("?")), ") has none");
    }
  } catch (const Error& e) {
    throw Error(std::string("config: parallel: ") + e.what());
  }
  io::check_relations(to_json(), relations(), "", "config: ");
}

void TrainConfig::check_data_size(int64_t train_tokens, int64_t val_tokens) const {
  const int64_t B = training.batch_size, T = model.context_length();
  LOOM_CHECK(train_tokens >= B * T + 1, "config: training.batch_size=", B, " x model.context_length=", T,
             " needs at least ", B * T + 1, " tokens but data.train (", data.train, ") holds ", train_tokens);
  if (eval.interval > 0) {
    LOOM_CHECK(val_tokens >= B * T + 1, "config: training.batch_size=", B, " x model.context_length=", T,
               " needs at least ", B * T + 1, " tokens but data.val (", data.val, ") holds ", val_tokens);
  }
}

TrainConfig TrainConfig::load(const std::string& preset_or_file, const std::vector<std::string>& overrides) {
  std::string source = preset_or_file.empty() ? "default" : preset_or_file;
  json j;
  bool looks_like_path = source.find('/') != std::string::npos || source.ends_with(".json");
  if (looks_like_path || fs::is_regular_file(source)) {
    j = layer_on_base(io::read_json_file(source, "config"), source);  // missing keys from a preset (train/config_file.h)
  } else {
    j = resolve_preset(source);  // complete: its bases layered onto the defaults (train/presets.h)
  }
  const std::string arch = requested_arch(j, overrides);
  json merged = defaults_json(arch);
  if (j.is_object() && j.contains("model") && j["model"].is_object()) j["model"]["arch"] = arch;
  merge_checked(merged, j, "");
  for (const auto& o : overrides) apply_override(merged, o);
  return from_json(merged);
}

std::string TrainConfig::write(const std::string& run_dir) const {
  fs::create_directories(run_dir);
  fs::path path = fs::path(run_dir) / "config.json";
  // Atomically: `loom train --resume` reads it back, and a kill -9 mid-write must not leave half a file.
  const std::string text = to_json().dump(2) + "\n";
  io::write_file_atomically(path.string(), [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
  return path.string();
}

}  // namespace loom::train
