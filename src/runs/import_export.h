// `loom import` and `loom export`: a Hugging Face directory or a GGUF file as a loom run directory, and a
// run as a Hugging Face directory or a GGUF file, under the run-directory rules (runs/run_dir.h: a new or
// empty directory, or one of loom's with overwrite; locked while writing). The formats themselves are
// models/hf.h's and models/gguf.h's. Each reports notes (what was adapted, what is missing) through
// `note` as it goes, before it writes, and returns what it wrote for the caller's summary.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "quant/quant.h"
#include "runs/memory.h"

namespace loom::runs {

using NoteFn = std::function<void(const std::string& note)>;

struct ImportResult {
  std::string weights_path;        // out/model.safetensors
  int64_t parameters = 0;
  bool tokenizer = false;          // out/tokenizer.json was written
  bool tokenizer_config = false;   // and out/tokenizer_config.json (bos/eos, chat template: from a GGUF)
};

// A GGUF file (any of its block types, dequantized to f32) as the run directory `out`: model.safetensors,
// and with the file's tokenizer metadata tokenizer.json and tokenizer_config.json. The model must fit
// `memory`.
ImportResult import_gguf_run(const std::string& gguf, const std::string& out, bool overwrite, const MemoryBudget& memory,
                             const NoteFn& note = {});
// A Hugging Face directory (Llama, GPT-2, DeepSeek-V3) as the run directory `out`: model.safetensors under
// loom's names, and tokenizer.json when it has one, whose ids must fit the model. The import must fit
// `memory`, judged from config.json and the safetensors headers before anything is built.
ImportResult import_hf_run(const std::string& hf, const std::string& out, bool overwrite, const MemoryBudget& memory,
                           const NoteFn& note = {});

// What an export wrote.
struct ExportResult {
  bool tokenizer = false;  // the run had a tokenizer, and it went with the weights
};

// A run directory or a weights file as a GGUF file `out` (llama.cpp, ollama, LM Studio), its weight
// matrices stored as `type`; the tokenizer with bos/eos and the chat template (a GGUF's own, else the
// run's tokenizer_config.json, else <|endoftext|> as both). `out` must not exist unless `overwrite`.
ExportResult export_run_gguf(const std::string& run, const std::string& out, quant::QuantType type, bool overwrite,
                             const NoteFn& note = {});
// A run directory or a weights file as the Hugging Face directory `out` (LlamaForCausalLM, GPT2LMHeadModel):
// config.json, model.safetensors, generation_config.json and the tokenizer.
ExportResult export_run_hf(const std::string& run, const std::string& out, bool overwrite, const NoteFn& note = {});

}  // namespace loom::runs
