// `loom export --run DIR --format hf --out HFDIR`: a Hugging Face transformers directory (models/hf.h).
// `loom export --run DIR --format gguf --out FILE.gguf [--gguf-type q8_0]`: a GGUF file (models/gguf.h)
// for llama.cpp, ollama, LM Studio. Both are runs/import_export.h's.
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "models/gguf.h"
#include "runs/import_export.h"

namespace {

struct ExportArgs {
  std::string run, format = "hf", out, gguf_type = "f16";
  bool overwrite = false;
};

loom::cli::Register reg("export", "Export a run as a Hugging Face directory (LlamaForCausalLM, GPT2LMHeadModel) or a GGUF file (Llama, GPT-2)", [](CLI::App& cmd) {
  static ExportArgs a;
  loom::cli::in_path(cmd.add_option("--run", a.run, "run directory (or a weights file)"), "weights")->required();
  cmd.add_option("--format", a.format, "output format: hf (a directory) or gguf (a file)");
  loom::cli::out_path(cmd.add_option("--out", a.out, "output directory (hf) or file (gguf)"), "export")->required();
  cmd.add_option("--gguf-type", a.gguf_type, "storage of the weight matrices in a GGUF: f32, f16, bf16, q8_0, q4_0, q4_1");
  cmd.add_flag("--overwrite", a.overwrite, "replace the loom export in --out (files loom did not write stay)");
  cmd.callback([] {
    LOOM_CHECK(a.format == "hf" || a.format == "gguf", "export: unknown --format \"", a.format, "\" (supported: hf, gguf)");
    const auto note = [](const std::string& n) { std::fprintf(stderr, "note: %s\n", n.c_str()); };
    if (a.format == "gguf") {
      const loom::quant::QuantType type = loom::models::gguf_export_type(a.gguf_type);
      const auto r = loom::runs::export_run_gguf(a.run, a.out, type, a.overwrite, note);
      std::fprintf(stderr, "wrote %s (%s weight matrices%s)\n", a.out.c_str(), loom::quant::quant_type_name(type),
                   r.tokenizer ? ", tokenizer" : "");
      return;
    }
    const auto r = loom::runs::export_run_hf(a.run, a.out, a.overwrite, note);
    std::fprintf(stderr, "wrote %s (config.json, model.safetensors%s)\n", a.out.c_str(),
                 r.tokenizer ? ", generation_config.json and the tokenizer" : ", generation_config.json");
  });
});

}  // namespace
