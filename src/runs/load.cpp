#include "runs/load.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/json.h"
#include "io/safetensors.h"
#include "tokenizer/formats.h"
#include "models/gguf.h"
#include "models/hf.h"
#include "data/provenance.h"
#include "runs/consistency.h"

namespace loom::runs {
namespace fs = std::filesystem;

void save_model_weights(const models::LanguageModel& model, const std::string& path) {
  io::NamedTensors tensors;
  for (nn::Parameter* p : const_cast<models::LanguageModel&>(model).parameters()) {
    tensors.emplace_back(p->name, p->value.detach().to(Device::cpu()));  // a GPU's model from a host copy
  }
  for (const auto& [name, t] : model.state_tensors()) tensors.emplace_back(name, t.to(Device::cpu()));
  io::write_safetensors(path, tensors, {{"loom.model_config", model.model_config().json().dump()}});
}

std::unique_ptr<models::LanguageModel> load_model_weights(const std::string& path, const MemoryBudget& memory,
                                                          const ModelJobMemory& job) {
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  auto it = file.metadata().find("loom.model_config");
  LOOM_CHECK(it != file.metadata().end(), path,
             ": no \"loom.model_config\" in the metadata (not written by loom's save_model_weights)");
  nlohmann::json j = io::parse_json(it->second, path + ": the metadata's loom.model_config");
  models::ModelConfig config;
  try {
    config = models::ModelConfig::from_json(j);
  } catch (const Error& e) {
    LOOM_FAIL(path, ": the metadata's loom.model_config is not a model loom can build: ", e.what());
  }
  check_memory(job(config), memory, str(path, " (its loom.model_config)"));
  auto model = config.build(0);
  load_model_tensors(*model, file, path);
  return model;
}

void load_model_tensors(models::LanguageModel& model, const io::SafetensorsFile& file, const std::string& where) {
  const auto params = model.parameters();
  const auto state = model.state_tensors();
  for (nn::Parameter* p : params) {
    LOOM_CHECK(file.contains(p->name), where, ": missing parameter '", p->name, "'");
    model.load_parameter(p->name, file.tensor(p->name));
  }
  for (const auto& [name, t] : state) {
    LOOM_CHECK(file.contains(name), where, ": missing model state '", name, "'");
    model.load_state(name, file.tensor(name));
  }
  LOOM_CHECK(file.size() == params.size() + state.size(), where, ": holds ", file.size(), " tensors, the model has ",
             params.size(), " parameters", state.empty() ? "" : str(" and ", state.size(), " state tensors"));
}

// Weights that hold NaN or Inf give a model whose every output is NaN: sampled, the same token over and
// over; evaluated, a NaN loss after reading every window (issue 32). Checked once, when the weights are
// loaded (one pass over the f32 parameters: ~0.1 s for SmolLM2-135M), with an error naming the tensor
// and the first bad element. A GGUF's matrices kept quantized are not dequantized for this.
void check_weights_finite(models::LanguageModel& model, const std::string& where) {
  for (nn::Parameter* p : model.parameters()) {
    const Tensor& t = p->value;
    if (t.dtype() != DType::F32 || t.device() != Device::cpu() || t.numel() == 0) continue;
    const float* v = t.data<float>();
    const int64_t n = t.numel();
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i += 4096) {  // a block at a time: no early exit inside it
      const int64_t end = std::min(n, i + 4096);
      float sum = 0;
      for (int64_t k = i; k < end; ++k) sum += v[k] * 0.0f;  // NaN or Inf anywhere makes it NaN
      if (sum != sum) {
        for (int64_t k = i; k < end; ++k) {
          if (!std::isfinite(v[k])) {
            bad = k;
            break;
          }
        }
      }
    }
    LOOM_CHECK(bad < 0, where, ": tensor '", p->name, "' holds a value that is not finite (", v[bad], " at element ", bad,
               " of ", n, "): the model would produce NaN; these weights are damaged (a diverged run's, or a "
               "broken file)");
  }
}

LoadedRun load_weights(const std::string& path, const MemoryBudget& memory, const ModelJobMemory& job,
                       bool quantized_gguf, bool quantized_only) {
  LOOM_CHECK(fs::exists(path), "weights file \"", path, "\" does not exist");
  LoadedRun run;
  if (models::is_hf_dir(path)) {  // a Hugging Face directory (models/hf.h)
    check_memory(hf_import_memory(path), memory, str("import ", path));
    models::HfImport hf = models::import_hf(path);
    run.model = std::move(hf.model);
    run.tokenizer = std::move(hf.tokenizer);
    if (run.tokenizer) {  // where models::hf_read_tokenizer found it
      const fs::path json_file = fs::path(path) / "tokenizer.json";
      run.tokenizer_path = fs::exists(json_file) ? json_file.string() : path;
    }
    check_weights_finite(*run.model, path);
    check_loaded_run(run, path);
    return run;
  }
  if (models::is_gguf_file(path)) {  // a GGUF file (models/gguf.h): dequantized to f32
    models::GgufImport g = models::import_gguf(path, quantized_gguf, quantized_only);
    check_memory(job(g.model->model_config()), memory, str("import ", path));
    run.model = std::move(g.model);
    run.tokenizer = std::move(g.tokenizer);
    if (run.tokenizer) run.tokenizer_path = path;
    run.eos = g.eos;
    run.chat_template = std::move(g.chat_template);
    check_weights_finite(*run.model, path);
    check_loaded_run(run, path);
    return run;
  }
  // A file named .gguf whose magic is not GGUF's is a broken GGUF, not a safetensors header problem.
  LOOM_CHECK(fs::path(path).extension() != ".gguf", path, ": not a GGUF file: its first bytes are not the magic \"GGUF\" "
             "(truncated, or not a GGUF at all)");
  run.model = load_model_weights(path, memory, job);
  fs::path tok = fs::path(path).parent_path() / "tokenizer.json";
  if (fs::exists(tok)) {
    run.tokenizer = tokenizer::load_tokenizer(tok.string());
    run.tokenizer_path = tok.string();
  }
  check_weights_finite(*run.model, path);
  check_loaded_run(run, path);
  return run;
}

LoadedRun load_run(const std::string& dir, const MemoryBudget& memory, const ModelJobMemory& job) {
  LOOM_CHECK(fs::is_directory(dir), "run directory \"", dir, "\" does not exist");
  fs::path weights = fs::path(dir) / "model.safetensors";
  if (models::is_hf_dir(dir)) return load_weights(dir, memory, job);
  LOOM_CHECK(fs::exists(weights), "run directory \"", dir, "\" has no model.safetensors (has training finished?)");
  LoadedRun run = load_weights(weights.string(), memory, job);
  fs::path config = fs::path(dir) / "config.json";
  if (fs::exists(config)) run.config = io::read_json_file(config.string(), "the run's config.json");
  return run;
}

LoadedRun load_for_job(const std::string& run, const std::string& weights, const MemoryBudget& memory,
                       const ModelJobMemory& job, const std::string& job_name, bool quantized_gguf,
                       bool quantized_only) {
  LoadedRun loaded =
      run.empty() ? load_weights(weights, memory, job, quantized_gguf, quantized_only) : load_run(run, memory, job);
  check_memory(job(loaded.model->model_config()), memory, job_name);  // an HF import's model
  return loaded;
}

ChatSettings chat_settings(const LoadedRun& loaded, const std::string& run_dir) {
  ChatSettings s{loaded.chat_template, loaded.eos};
  if (s.chat_template.empty() && !run_dir.empty()) {  // an imported run keeps them in tokenizer_config.json
    LOOM_CHECK(loaded.tokenizer.has_value(), "chat: ", run_dir, " has no tokenizer");
    models::GgufExportOptions o;
    models::read_tokenizer_config(run_dir, *loaded.tokenizer, o);
    s.chat_template = o.chat_template;
    if (!s.eos) s.eos = o.eos;
  }
  return s;
}

}  // namespace loom::runs
