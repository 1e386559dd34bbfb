#include "train/run.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "tokenizer/formats.h"
#include "tokenizer/train.h"
#include "models/gguf.h"
#include "models/hf.h"
#include "data/provenance.h"
#include "train/consistency.h"

namespace loom::train {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> corpus_files(const std::string& corpus) {
  LOOM_CHECK(fs::exists(corpus), "data.corpus = \"", corpus,
             "\" does not exist: fetch the default corpus with tools/get_corpus.sh, or point data.corpus at a "
             "folder of .txt files (or one file)");
  std::vector<std::string> files;
  if (fs::is_regular_file(corpus)) {
    files.push_back(corpus);
  } else {
    for (const auto& entry : fs::directory_iterator(corpus)) {
      if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  LOOM_CHECK(!files.empty(), "data.corpus = \"", corpus, "\" holds no .txt files");
  return files;
}

}  // namespace

std::vector<std::string> ensure_training_data(const TrainConfig& config, bool progress) {
  std::vector<std::string> made;
  const auto& d = config.data;
  if (fs::exists(d.train) && fs::exists(d.val)) return made;
  std::vector<std::string> files = corpus_files(d.corpus);
  if (!fs::exists(d.tokenizer)) {
    tokenizer::TrainOptions options;
    options.vocab_size = static_cast<size_t>(config.model.vocab_size());
    options.special_tokens = {"<|endoftext|>"};
    options.progress = progress;
    tokenizer::Tokenizer tok = tokenizer::train_bpe(files, options);
    if (!fs::path(d.tokenizer).parent_path().empty()) fs::create_directories(fs::path(d.tokenizer).parent_path());
    tokenizer::save_hf_json(tok, d.tokenizer);
    made.push_back(str("trained a ", tok.vocab_size(), "-token BPE tokenizer on ", files.size(), " file(s) -> ",
                       d.tokenizer));
  }
  // The tokenizer's ids must fit the model before minutes go into preparing tokens with it.
  data::check_tokenizer_fits_model(data::identify_tokenizer(d.tokenizer), config.model.vocab_size(),
                                   "config: model.vocab_size");
  const fs::path out_dir = fs::path(d.train).parent_path();
  LOOM_CHECK(fs::path(d.train).filename() == "train.bin" && fs::path(d.val).filename() == "val.bin" &&
                 fs::path(d.val).parent_path() == out_dir,
             "data.train = \"", d.train, "\" and data.val = \"", d.val,
             "\" do not exist; to prepare them automatically they must be train.bin and val.bin in one folder");
  data::PrepareOptions prep;
  prep.tokenizer = d.tokenizer;
  prep.inputs = files;
  prep.out_dir = out_dir.string();
  prep.val_fraction = d.val_fraction;
  prep.progress = progress;
  data::PrepareResult r = data::prepare_dataset(prep);
  made.push_back(str("prepared ", r.train_tokens, " train and ", r.val_tokens, " validation tokens (", r.dtype,
                     ") -> ", prep.out_dir));
  return made;
}

void save_run_tokenizer(const TrainConfig& config, const std::string& run_dir) {
  const fs::path from(config.data.tokenizer), to = fs::path(run_dir) / "tokenizer.json";
  if (fs::is_regular_file(from)) {
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  } else if (fs::is_directory(from)) {
    tokenizer::save_hf_json(tokenizer::load_tokenizer(from.string()), to.string());
  }
}

void save_model_weights(const models::LanguageModel& model, const std::string& path) {
  io::NamedTensors tensors;
  for (nn::Parameter* p : const_cast<models::LanguageModel&>(model).parameters()) {
    tensors.emplace_back(p->name, p->value.detach());
  }
  for (const auto& [name, t] : model.state_tensors()) tensors.emplace_back(name, t);
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

LoadedRun load_weights(const std::string& path, const MemoryBudget& memory, const ModelJobMemory& job,
                       bool quantized_gguf) {
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
    check_loaded_run(run, path);
    return run;
  }
  if (models::is_gguf_file(path)) {  // a GGUF file (models/gguf.h): dequantized to f32
    models::GgufImport g = models::import_gguf(path, quantized_gguf);
    check_memory(job(g.model->model_config()), memory, str("import ", path));
    run.model = std::move(g.model);
    run.tokenizer = std::move(g.tokenizer);
    if (run.tokenizer) run.tokenizer_path = path;
    run.eos = g.eos;
    run.chat_template = std::move(g.chat_template);
    check_loaded_run(run, path);
    return run;
  }
  run.model = load_model_weights(path, memory, job);
  fs::path tok = fs::path(path).parent_path() / "tokenizer.json";
  if (fs::exists(tok)) {
    run.tokenizer = tokenizer::load_tokenizer(tok.string());
    run.tokenizer_path = tok.string();
  }
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
  if (fs::exists(config)) run.config = TrainConfig::load(config.string());
  return run;
}

}  // namespace loom::train
