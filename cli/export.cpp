// `loom export --run DIR --format hf --out HFDIR`: a Hugging Face transformers directory (models/hf.h).
#include <cstdio>

#include "cli/command.h"
#include "models/hf.h"
#include "train/run.h"
#include "train/run_dir.h"

namespace {

struct ExportArgs {
  std::string run, format = "hf", out;
  bool overwrite = false;
};

loom::cli::Register reg("export", "Export a run as a Hugging Face directory (LlamaForCausalLM, GPT2LMHeadModel)", [](CLI::App& cmd) {
  static ExportArgs a;
  cmd.add_option("--run", a.run, "run directory (or a weights file)")->required();
  cmd.add_option("--format", a.format, "output format (hf)");
  cmd.add_option("--out", a.out, "output directory")->required();
  cmd.add_flag("--overwrite", a.overwrite, "replace the loom export in --out (files loom did not write stay)");
  cmd.callback([] {
    LOOM_CHECK(a.format == "hf", "export: unknown --format \"", a.format, "\" (supported: hf)");
    // A new or empty directory, or (with --overwrite) one of loom's; locked until the end (train/run_dir.h).
    auto out_dir = loom::train::RunDir::claim(a.out, loom::train::RunKind::Export,
                                              a.overwrite ? loom::train::ExistingRun::Overwrite
                                                          : loom::train::ExistingRun::Refuse);
    auto loaded = std::filesystem::is_directory(a.run) ? loom::train::load_run(a.run) : loom::train::load_weights(a.run);
    if (!loaded.tokenizer) std::fprintf(stderr, "note: no tokenizer.json in %s: exporting the weights only\n", a.run.c_str());
    out_dir.start();
    loom::models::export_hf(*loaded.model, loaded.tokenizer ? &*loaded.tokenizer : nullptr, a.out);
    out_dir.finish(loom::train::RunState::Finished);
    std::fprintf(stderr, "wrote %s (config.json, model.safetensors%s)\n", a.out.c_str(),
                 loaded.tokenizer ? ", generation_config.json and the tokenizer" : ", generation_config.json");
  });
});

}  // namespace
