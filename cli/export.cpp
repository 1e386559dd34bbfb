// `loom export --run DIR --format hf --out HFDIR`: a Hugging Face transformers directory (models/hf.h).
// `loom export --run DIR --format gguf --out FILE.gguf [--gguf-type q8_0]`: a GGUF file (models/gguf.h)
// for llama.cpp, ollama, LM Studio.
#include <cstdio>

#include "cli/command.h"
#include "models/gguf.h"
#include "models/hf.h"
#include "runs/load.h"
#include "runs/run_dir.h"

namespace {

struct ExportArgs {
  std::string run, format = "hf", out, gguf_type = "f16";
  bool overwrite = false;
};

loom::cli::Register reg("export", "Export a run as a Hugging Face directory (LlamaForCausalLM, GPT2LMHeadModel) or a GGUF file (Llama, GPT-2)", [](CLI::App& cmd) {
  static ExportArgs a;
  cmd.add_option("--run", a.run, "run directory (or a weights file)")->required();
  cmd.add_option("--format", a.format, "output format: hf (a directory) or gguf (a file)");
  cmd.add_option("--out", a.out, "output directory (hf) or file (gguf)")->required();
  cmd.add_option("--gguf-type", a.gguf_type, "storage of the weight matrices in a GGUF: f32, f16, bf16, q8_0, q4_0, q4_1");
  cmd.add_flag("--overwrite", a.overwrite, "replace the loom export in --out (files loom did not write stay)");
  cmd.callback([] {
    LOOM_CHECK(a.format == "hf" || a.format == "gguf", "export: unknown --format \"", a.format, "\" (supported: hf, gguf)");
    if (a.format == "gguf") {
      loom::models::GgufExportOptions o;
      o.type = loom::models::gguf_export_type(a.gguf_type);
      LOOM_CHECK(a.overwrite || !std::filesystem::exists(a.out), "export: ", a.out,
                 " exists (give --overwrite to replace it)");
      LOOM_CHECK(!std::filesystem::is_directory(a.out), "export: --out ", a.out, " is a directory; a GGUF export is a file");
      const bool dir = std::filesystem::is_directory(a.run);
      auto loaded = dir ? loom::runs::load_run(a.run) : loom::runs::load_weights(a.run);
      if (!loaded.tokenizer) std::fprintf(stderr, "note: no tokenizer.json in %s: exporting the weights only\n", a.run.c_str());
      o.name = std::filesystem::path(a.run).filename().string();
      if (loaded.tokenizer) {
        const std::string tok_dir = dir ? a.run : std::filesystem::path(a.run).parent_path().string();
        // bos/eos/chat template: a GGUF's own, else the run's tokenizer_config.json (from `import --gguf`).
        if (!loom::models::is_gguf_file(a.run)) {
          loom::models::read_tokenizer_config(tok_dir.empty() ? "." : tok_dir, *loaded.tokenizer, o);
        }
        if (loaded.eos) o.eos = loaded.eos;
        if (!loaded.chat_template.empty()) o.chat_template = loaded.chat_template;
        if (!o.eos) {
          if (auto eot = loaded.tokenizer->special_token_id("<|endoftext|>")) o.bos = o.eos = *eot;
        }
      }
      loom::models::export_gguf(*loaded.model, loaded.tokenizer ? &*loaded.tokenizer : nullptr, a.out, o);
      std::fprintf(stderr, "wrote %s (%s weight matrices%s)\n", a.out.c_str(), loom::quant::quant_type_name(o.type),
                   loaded.tokenizer ? ", tokenizer" : "");
      return;
    }
    // A new or empty directory, or (with --overwrite) one of loom's; locked until the end (runs/run_dir.h).
    auto out_dir = loom::runs::RunDir::claim(a.out, loom::runs::RunKind::Export,
                                              a.overwrite ? loom::runs::ExistingRun::Overwrite
                                                          : loom::runs::ExistingRun::Refuse);
    auto loaded = std::filesystem::is_directory(a.run) ? loom::runs::load_run(a.run) : loom::runs::load_weights(a.run);
    if (!loaded.tokenizer) std::fprintf(stderr, "note: no tokenizer.json in %s: exporting the weights only\n", a.run.c_str());
    out_dir.start();
    loom::models::export_hf(*loaded.model, loaded.tokenizer ? &*loaded.tokenizer : nullptr, a.out);
    out_dir.finish(loom::runs::RunState::Finished);
    std::fprintf(stderr, "wrote %s (config.json, model.safetensors%s)\n", a.out.c_str(),
                 loaded.tokenizer ? ", generation_config.json and the tokenizer" : ", generation_config.json");
  });
});

}  // namespace
