#include "train/run.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "tokenizer/formats.h"
#include "tokenizer/train.h"
#include "train/hf.h"

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

nlohmann::json model_config_json(const llama::Config& c) {
  return {{"arch", "llama"},           {"vocab_size", c.vocab_size}, {"context_length", c.context_length},
          {"d_model", c.d_model},      {"num_layers", c.num_layers}, {"num_heads", c.num_heads},
          {"num_kv_heads", c.num_kv_heads}, {"d_ff", c.d_ff},        {"rope_theta", c.rope_theta},
          {"norm_eps", c.norm_eps}};
}

llama::Config model_config_from_json(const nlohmann::json& j, const std::string& source) {
  try {
    llama::Config c;
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.context_length = j.at("context_length").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.num_heads = j.at("num_heads").get<int64_t>();
    c.num_kv_heads = j.value("num_kv_heads", int64_t{0});  // absent in files saved before GQA: 0 = num_heads
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.rope_theta = j.at("rope_theta").get<float>();
    c.norm_eps = j.at("norm_eps").get<float>();
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL(source, ": malformed model config in the metadata: ", e.what());
  }
}

}  // namespace

std::vector<std::string> ensure_training_data(const TrainConfig& config, bool progress) {
  std::vector<std::string> made;
  const auto& d = config.data;
  if (fs::exists(d.train) && fs::exists(d.val)) return made;
  std::vector<std::string> files = corpus_files(d.corpus);
  if (!fs::exists(d.tokenizer)) {
    tokenizer::TrainOptions options;
    options.vocab_size = static_cast<size_t>(config.model.vocab_size);
    options.special_tokens = {"<|endoftext|>"};
    options.progress = progress;
    tokenizer::Tokenizer tok = tokenizer::train_bpe(files, options);
    if (!fs::path(d.tokenizer).parent_path().empty()) fs::create_directories(fs::path(d.tokenizer).parent_path());
    tokenizer::save_hf_json(tok, d.tokenizer);
    made.push_back(str("trained a ", tok.vocab_size(), "-token BPE tokenizer on ", files.size(), " file(s) -> ",
                       d.tokenizer));
  }
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

void save_model_weights(const llama::TransformerLM& model, const std::string& path) {
  io::NamedTensors tensors;
  for (nn::Parameter* p : const_cast<llama::TransformerLM&>(model).parameters()) {
    tensors.emplace_back(p->name, p->value.detach());
  }
  io::write_safetensors(path, tensors, {{"loom.model_config", model_config_json(model.config()).dump()}});
}

std::unique_ptr<llama::TransformerLM> load_model_weights(const std::string& path) {
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  auto it = file.metadata().find("loom.model_config");
  LOOM_CHECK(it != file.metadata().end(), path,
             ": no \"loom.model_config\" in the metadata (not written by loom's save_model_weights)");
  nlohmann::json j = io::parse_json(it->second, path + ": the metadata's loom.model_config");
  auto model = std::make_unique<llama::TransformerLM>(model_config_from_json(j, path), 0);
  for (nn::Parameter* p : model->parameters()) {
    LOOM_CHECK(file.contains(p->name), path, ": missing parameter '", p->name, "'");
    model->load_parameter(p->name, file.tensor(p->name));
  }
  LOOM_CHECK(file.size() == model->parameters().size(), path, ": holds ", file.size(), " tensors, the model has ",
             model->parameters().size(), " parameters");
  return model;
}

LoadedRun load_weights(const std::string& path) {
  LOOM_CHECK(fs::exists(path), "weights file \"", path, "\" does not exist");
  LoadedRun run;
  if (is_hf_dir(path)) {  // a Hugging Face Llama directory (train/hf.h)
    HfImport hf = import_hf(path);
    run.model = std::move(hf.model);
    run.tokenizer = std::move(hf.tokenizer);
    return run;
  }
  run.model = load_model_weights(path);
  fs::path tok = fs::path(path).parent_path() / "tokenizer.json";
  if (fs::exists(tok)) run.tokenizer = tokenizer::load_tokenizer(tok.string());
  return run;
}

LoadedRun load_run(const std::string& dir) {
  LOOM_CHECK(fs::is_directory(dir), "run directory \"", dir, "\" does not exist");
  fs::path weights = fs::path(dir) / "model.safetensors";
  if (is_hf_dir(dir)) return load_weights(dir);
  LOOM_CHECK(fs::exists(weights), "run directory \"", dir, "\" has no model.safetensors (has training finished?)");
  LoadedRun run = load_weights(weights.string());
  fs::path config = fs::path(dir) / "config.json";
  if (fs::exists(config)) run.config = TrainConfig::load(config.string());
  return run;
}

}  // namespace loom::train
