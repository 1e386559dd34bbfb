// `loom import --hf HFDIR --out RUNDIR`: a Hugging Face directory (Llama or GPT-2) as a loom run directory
// (model.safetensors under loom's names, tokenizer.json), for generate/eval/export.
// `loom import --gguf FILE --out RUNDIR`: the same from a GGUF file (models/gguf.h): weights dequantized
// to f32, the tokenizer from its metadata as tokenizer.json, bos/eos and the chat template in
// tokenizer_config.json. Both are runs/import_export.h's.
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "runs/import_export.h"
#include "runs/memory.h"

namespace {

struct ImportArgs {
  std::string hf, gguf, out, max_memory;
  bool overwrite = false;
};

loom::cli::Register reg("import", "Import a Hugging Face directory (Llama, GPT-2, DeepSeek-V3) or a GGUF file (Llama, GPT-2) as a loom run", [](CLI::App& cmd) {
  static ImportArgs a;
  auto* hf = loom::cli::in_dir(cmd.add_option("--hf", a.hf, "Hugging Face directory (config.json, model.safetensors, tokenizer.json)"), "hf");
  auto* gguf = loom::cli::in_file(cmd.add_option("--gguf", a.gguf, "GGUF file (llama.cpp's format; any of its block types)"), "gguf");
  hf->excludes(gguf);
  loom::cli::out_dir(cmd.add_option("--out", a.out, "run directory to write"), "import")->required();
  cmd.add_flag("--overwrite", a.overwrite, "replace the loom run in --out (files loom did not write stay)");
  cmd.add_option("--max-memory", a.max_memory,
                 "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  cmd.callback([] {
    LOOM_CHECK(!a.hf.empty() || !a.gguf.empty(), "import: give --hf DIR or --gguf FILE");
    const auto budget = loom::runs::MemoryBudget::from_setting(a.max_memory);
    const auto note = [](const std::string& n) { std::fprintf(stderr, "note: %s\n", n.c_str()); };
    if (!a.gguf.empty()) {
      const auto r = loom::runs::import_gguf_run(a.gguf, a.out, a.overwrite, budget, note);
      std::fprintf(stderr, "wrote %s (%lld parameters)%s\n", r.weights_path.c_str(), static_cast<long long>(r.parameters),
                   r.tokenizer ? ", tokenizer.json and tokenizer_config.json" : "");
      return;
    }
    const auto r = loom::runs::import_hf_run(a.hf, a.out, a.overwrite, budget, note);
    std::fprintf(stderr, "wrote %s (%lld parameters)%s\n", r.weights_path.c_str(), static_cast<long long>(r.parameters),
                 r.tokenizer ? " and tokenizer.json" : "");
  });
});

}  // namespace
