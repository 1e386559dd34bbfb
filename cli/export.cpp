// `loom export --run DIR --format hf --out HFDIR`: a Hugging Face transformers directory (train/hf.h).
#include <cstdio>

#include "cli/command.h"
#include "models/hf.h"
#include "train/run.h"

namespace {

struct ExportArgs {
  std::string run, format = "hf", out;
};

loom::cli::Register reg("export", "Export a run as a Hugging Face directory (LlamaForCausalLM, GPT2LMHeadModel)", [](CLI::App& cmd) {
  static ExportArgs a;
  cmd.add_option("--run", a.run, "run directory (or a weights file)")->required();
  cmd.add_option("--format", a.format, "output format (hf)");
  cmd.add_option("--out", a.out, "output directory")->required();
  cmd.callback([] {
    LOOM_CHECK(a.format == "hf", "export: unknown --format \"", a.format, "\" (supported: hf)");
    auto loaded = std::filesystem::is_directory(a.run) ? loom::train::load_run(a.run) : loom::train::load_weights(a.run);
    if (!loaded.tokenizer) std::fprintf(stderr, "note: no tokenizer.json in %s: exporting the weights only\n", a.run.c_str());
    loom::models::export_hf(*loaded.model, loaded.tokenizer ? &*loaded.tokenizer : nullptr, a.out);
    std::fprintf(stderr, "wrote %s (config.json, model.safetensors%s)\n", a.out.c_str(),
                 loaded.tokenizer ? ", generation_config.json and the tokenizer" : ", generation_config.json");
  });
});

}  // namespace
