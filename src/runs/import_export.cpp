#include "runs/import_export.h"

#include <filesystem>

#include "core/error.h"
#include "data/provenance.h"
#include "io/outputs.h"
#include "models/gguf.h"
#include "models/hf.h"
#include "runs/load.h"
#include "runs/run_dir.h"
#include "tokenizer/formats.h"

namespace loom::runs {
namespace fs = std::filesystem;

namespace {
ExistingRun existing(bool overwrite) { return overwrite ? ExistingRun::Overwrite : ExistingRun::Refuse; }

void tell(const NoteFn& note, const std::string& text) {
  if (note) note(text);
}

// A run directory, or a weights file (with a tokenizer.json beside it).
LoadedRun load_source(const std::string& run) { return fs::is_directory(run) ? load_run(run) : load_weights(run); }

// bos, eos and the chat template an export carries: a GGUF's own, else the run's tokenizer_config.json
// (written by `import --gguf` and `finetune`), else <|endoftext|> as both ends (GPT-2's tokenizers).
void find_special_tokens(const std::string& run, const LoadedRun& loaded, models::GgufExportOptions& o) {
  const std::string tok_dir = fs::is_directory(run) ? run : fs::path(run).parent_path().string();
  if (!models::is_gguf_file(run)) models::read_tokenizer_config(tok_dir.empty() ? "." : tok_dir, *loaded.tokenizer, o);
  if (loaded.eos) o.eos = loaded.eos;
  if (!loaded.chat_template.empty()) o.chat_template = loaded.chat_template;
  if (!o.eos) {
    if (auto eot = loaded.tokenizer->special_token_id("<|endoftext|>")) o.bos = o.eos = *eot;
  }
}
}  // namespace

ImportResult import_gguf_run(const std::string& gguf, const std::string& out, bool overwrite, const MemoryBudget& memory,
                             const NoteFn& note) {
  // A new or empty directory, or (with overwrite) one of loom's runs; locked until the end (runs/run_dir.h).
  io::check_output_apart("import --out", out, "--gguf", gguf);  // io/outputs.h
  auto run_dir = RunDir::claim(out, RunKind::Import, existing(overwrite));
  auto g = models::import_gguf(gguf);
  check_memory(model_memory(g.model->model_config()), memory, "import " + gguf);
  run_dir.start();
  for (const auto& n : g.notes) tell(note, n);
  fs::create_directories(out);
  ImportResult r;
  r.weights_path = (fs::path(out) / "model.safetensors").string();
  save_model_weights(*g.model, r.weights_path);
  if (g.tokenizer) {
    tokenizer::save_hf_json(*g.tokenizer, (fs::path(out) / "tokenizer.json").string());
    models::write_tokenizer_config(out, *g.tokenizer, g.bos, g.eos, g.chat_template,
                                   g.model->model_config().json().value("context_length", int64_t{0}));
    r.tokenizer = r.tokenizer_config = true;
  }
  run_dir.finish(RunState::Finished);
  r.parameters = g.model->num_parameters();
  return r;
}

ImportResult import_hf_run(const std::string& hf_dir, const std::string& out, bool overwrite, const MemoryBudget& memory,
                           const NoteFn& note) {
  io::check_output_apart("import --out", out, "--hf", hf_dir);  // io/outputs.h
  auto run_dir = RunDir::claim(out, RunKind::Import, existing(overwrite));
  // Before anything is built: the model config.json describes must fit (sizes from the headers).
  check_memory(hf_import_memory(hf_dir), memory, "import " + hf_dir);
  auto hf = models::import_hf(hf_dir);
  if (hf.tokenizer) {  // its ids must be rows of the model's embedding table
    data::TokenizerIdentity tok;
    tok.path = hf_dir + " (tokenizer)";
    tok.vocab_size = static_cast<int64_t>(hf.tokenizer->vocab_size());
    data::check_tokenizer_fits_model(tok, hf.model->vocab_size(), hf_dir + "/config.json");
  }
  run_dir.start();
  for (const auto& n : hf.notes) tell(note, n);
  fs::create_directories(out);
  ImportResult r;
  r.weights_path = (fs::path(out) / "model.safetensors").string();
  save_model_weights(*hf.model, r.weights_path);
  if (hf.tokenizer) {
    tokenizer::save_hf_json(*hf.tokenizer, (fs::path(out) / "tokenizer.json").string());
    r.tokenizer = true;
  }
  run_dir.finish(RunState::Finished);
  r.parameters = hf.model->num_parameters();
  return r;
}

ExportResult export_run_gguf(const std::string& run, const std::string& out, quant::QuantType type, bool overwrite,
                             const NoteFn& note) {
  models::GgufExportOptions o;
  o.type = type;
  LOOM_CHECK(overwrite || !fs::exists(out), "export: ", out, " exists (give --overwrite to replace it)");
  LOOM_CHECK(!fs::is_directory(out), "export: --out ", out, " is a directory; a GGUF export is a file");
  // --overwrite replaces only the writer's own kind of output (io/outputs.h): a GGUF file, never a user's file
  // or another command's that happens to be at --out.
  LOOM_CHECK(!fs::exists(out) || models::is_gguf_file(out), "export --overwrite: ", out,
             " is not a GGUF file; --overwrite replaces only a GGUF export, so nothing was changed: choose another --out");
  io::check_output_apart("export --out", out, "--run", run);
  io::check_output_outside_runs("export --out", out);
  auto loaded = load_source(run);
  if (!loaded.tokenizer) tell(note, "no tokenizer.json in " + run + ": exporting the weights only");
  o.name = fs::path(run).filename().string();
  if (loaded.tokenizer) find_special_tokens(run, loaded, o);
  models::export_gguf(*loaded.model, loaded.tokenizer ? &*loaded.tokenizer : nullptr, out, o);
  return {loaded.tokenizer.has_value()};
}

ExportResult export_run_hf(const std::string& run, const std::string& out, bool overwrite, const NoteFn& note) {
  // A new or empty directory, or (with overwrite) one of loom's; locked until the end (runs/run_dir.h).
  io::check_output_apart("export --out", out, "--run", run);  // io/outputs.h
  auto out_dir = RunDir::claim(out, RunKind::Export, existing(overwrite));
  auto loaded = load_source(run);
  if (!loaded.tokenizer) tell(note, "no tokenizer.json in " + run + ": exporting the weights only");
  out_dir.start();
  models::export_hf(*loaded.model, loaded.tokenizer ? &*loaded.tokenizer : nullptr, out);
  if (loaded.tokenizer) {
    // The family's export writes a tokenizer_config.json of its own; the run's ends of text and chat
    // template go into it too, so that transformers' apply_chat_template, `loom finetune --weights` and
    // `loom chat` on the export render chats as they did on the run.
    models::GgufExportOptions special;
    find_special_tokens(run, loaded, special);
    const fs::path config = fs::path(out) / "tokenizer_config.json";
    nlohmann::json tc = fs::exists(config) ? models::hf_read_json(config) : nlohmann::json::object();
    if (special.bos) tc["bos_token"] = loaded.tokenizer->token_bytes(*special.bos);
    if (special.eos) tc["eos_token"] = loaded.tokenizer->token_bytes(*special.eos);
    if (!special.chat_template.empty()) tc["chat_template"] = special.chat_template;
    models::hf_write_json(config, tc);
  }
  out_dir.finish(RunState::Finished);
  return {loaded.tokenizer.has_value()};
}

}  // namespace loom::runs
