// `loom prepare`: text files -> train.bin / val.bin / meta.json (see src/data/prepare.h).
#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "data/prepare.h"

namespace {
loom::cli::Register reg("prepare", "Tokenize text files into train.bin, val.bin and meta.json", [](CLI::App& cmd) {
  auto o = std::make_shared<loom::data::PrepareOptions>();
  loom::cli::in_path(cmd.add_option("--tokenizer", o->tokenizer, "tokenizer.json, or a directory with vocab.json + merges.txt"), "tokenizer")->required();
  loom::cli::in_file(cmd.add_option("--input", o->inputs, "Text files; each is one document"), "text")->required();
  loom::cli::out_dir(cmd.add_option("--out", o->out_dir, "Output directory"), "tokens")->required();
  cmd.add_option("--val-fraction", o->val_fraction, "Fraction of the tokens (the last ones) that go to val.bin")
      ->capture_default_str();
  cmd.add_option("--eot-token", o->eot_token, "Special token written between documents")->capture_default_str();
  cmd.add_option("--threads", o->threads, "Encoding threads (0: all cores)");
  cmd.add_flag("--progress", o->progress, "Report progress on stderr (on by default above 32 MB of input)");
  cmd.callback([o] {
    uint64_t total = 0;
    for (const std::string& path : o->inputs) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(path, ec);
      if (!ec) total += size;
    }
    if (total > (uint64_t{32} << 20)) o->progress = true;
    loom::data::PrepareResult r = loom::data::prepare_dataset(*o);
    std::fprintf(stderr, "prepare: %llu train + %llu val tokens (%s, vocab %llu, eot %u) -> %s\n",
                 static_cast<unsigned long long>(r.train_tokens), static_cast<unsigned long long>(r.val_tokens),
                 r.dtype.c_str(), static_cast<unsigned long long>(r.vocab_size), r.eot_id, o->out_dir.c_str());
  });
});
}  // namespace
