// `loom prepare`: turns text files into token files for training.
//
// Output, in `out_dir`:
//   train.bin, val.bin  token ids, little-endian uint16 (uint32 when the vocabulary has more than 65536
//                       tokens), no header. Each input file is one document; the end-of-text token sits
//                       between documents (not doubled when a document already starts or ends with it;
//                       a file that contains the end-of-text text itself is thereby several documents).
//                       The first (1 - val_fraction) of the token stream is train.bin, the rest val.bin.
//   meta.json           {"dtype": "uint16"|"uint32", "vocab_size", "tokenizer_hash" (sha256 of the
//                       tokenizer file, see tokenizer_hash), "train_tokens", "val_tokens", "eot_id", ...}
// Files are encoded as streams on several threads, so inputs of any size fit in bounded memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct PrepareOptions {
  std::string tokenizer;  // tokenizer.json, or a directory with vocab.json + merges.txt
  std::vector<std::string> inputs;
  std::string out_dir;
  double val_fraction = 0.1;
  std::string eot_token = "<|endoftext|>";
  int threads = 0;  // 0 takes every core
  bool progress = false;
};

struct PrepareResult {
  std::string dtype;
  uint64_t vocab_size = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  uint32_t eot_id = 0;
  std::string tokenizer_hash;
};

PrepareResult prepare_dataset(const PrepareOptions& options);

}  // namespace loom::data
