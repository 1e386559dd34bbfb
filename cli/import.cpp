// `loom import --hf HFDIR --out RUNDIR`: a Hugging Face directory (Llama or GPT-2) as a loom run directory
// (model.safetensors under loom's names, tokenizer.json), for generate/eval/export.
// `loom import --gguf FILE --out RUNDIR`: the same from a GGUF file (models/gguf.h): weights dequantized
// to f32, the tokenizer from its metadata as tokenizer.json, bos/eos and the chat template in
// tokenizer_config.json.
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "tokenizer/formats.h"
#include "models/gguf.h"
#include "models/hf.h"
#include "data/provenance.h"
#include "runs/memory.h"
#include "runs/load.h"
#include "runs/run_dir.h"

namespace {

struct ImportArgs {
  std::string hf, gguf, out, max_memory;
  bool overwrite = false;
};

loom::cli::Register reg("import", "Import a Hugging Face directory (Llama, GPT-2, DeepSeek-V3) or a GGUF file (Llama, GPT-2) as a loom run", [](CLI::App& cmd) {
  static ImportArgs a;
  auto* hf = cmd.add_option("--hf", a.hf, "Hugging Face directory (config.json, model.safetensors, tokenizer.json)");
  auto* gguf = cmd.add_option("--gguf", a.gguf, "GGUF file (llama.cpp's format; any of its block types)");
  hf->excludes(gguf);
  cmd.add_option("--out", a.out, "run directory to write")->required();
  cmd.add_flag("--overwrite", a.overwrite, "replace the loom run in --out (files loom did not write stay)");
  cmd.add_option("--max-memory", a.max_memory,
                 "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  cmd.callback([] {
    LOOM_CHECK(!a.hf.empty() || !a.gguf.empty(), "import: give --hf DIR or --gguf FILE");
    // A new or empty directory, or (with --overwrite) one of loom's runs; locked until the end (runs/run_dir.h).
    auto run_dir = loom::runs::RunDir::claim(a.out, loom::runs::RunKind::Import,
                                              a.overwrite ? loom::runs::ExistingRun::Overwrite
                                                          : loom::runs::ExistingRun::Refuse);
    if (!a.gguf.empty()) {
      auto g = loom::models::import_gguf(a.gguf);
      loom::runs::check_memory(loom::runs::model_memory(g.model->model_config()),
                                loom::runs::MemoryBudget::from_setting(a.max_memory), "import " + a.gguf);
      run_dir.start();
      for (const auto& note : g.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
      std::filesystem::create_directories(a.out);
      const auto weights = std::filesystem::path(a.out) / "model.safetensors";
      loom::runs::save_model_weights(*g.model, weights.string());
      if (g.tokenizer) {
        loom::tokenizer::save_hf_json(*g.tokenizer, (std::filesystem::path(a.out) / "tokenizer.json").string());
        loom::models::write_tokenizer_config(a.out, *g.tokenizer, g.bos, g.eos, g.chat_template,
                                             g.model->model_config().json().value("context_length", int64_t{0}));
      }
      run_dir.finish(loom::runs::RunState::Finished);
      std::fprintf(stderr, "wrote %s (%lld parameters)%s\n", weights.c_str(),
                   static_cast<long long>(g.model->num_parameters()),
                   g.tokenizer ? ", tokenizer.json and tokenizer_config.json" : "");
      return;
    }
    // Before anything is built: the model config.json describes must fit (sizes from the headers).
    loom::runs::check_memory(loom::runs::hf_import_memory(a.hf), loom::runs::MemoryBudget::from_setting(a.max_memory),
                              "import " + a.hf);
    auto hf = loom::models::import_hf(a.hf);
    if (hf.tokenizer) {  // its ids must be rows of the model's embedding table
      loom::data::TokenizerIdentity tok;
      tok.path = a.hf + " (tokenizer)";
      tok.vocab_size = static_cast<int64_t>(hf.tokenizer->vocab_size());
      loom::data::check_tokenizer_fits_model(tok, hf.model->vocab_size(), a.hf + "/config.json");
    }
    run_dir.start();
    for (const auto& note : hf.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
    std::filesystem::create_directories(a.out);
    const auto weights = std::filesystem::path(a.out) / "model.safetensors";
    loom::runs::save_model_weights(*hf.model, weights.string());
    if (hf.tokenizer) loom::tokenizer::save_hf_json(*hf.tokenizer, (std::filesystem::path(a.out) / "tokenizer.json").string());
    run_dir.finish(loom::runs::RunState::Finished);
    std::fprintf(stderr, "wrote %s (%lld parameters)%s\n", weights.c_str(),
                 static_cast<long long>(hf.model->num_parameters()), hf.tokenizer ? " and tokenizer.json" : "");
  });
});

}  // namespace
