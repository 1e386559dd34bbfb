// `loom tokenizer train|encode|decode`: byte-level BPE from the command line (see src/tokenizer/).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/formats.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/train.h"

namespace {
using namespace loom::tokenizer;
namespace fs = std::filesystem;

struct TrainArgs {
  std::vector<std::string> inputs;
  size_t vocab_size = 0;
  std::vector<std::string> specials;
  std::string out;
  int threads = 0;
  bool progress = false;
};

struct CodecArgs {
  std::string tokenizer;
  std::vector<std::string> specials;
  std::string input;
  int threads = 0;
};

Tokenizer load_with_specials(const CodecArgs& a) {
  Tokenizer tok = load_tokenizer(a.tokenizer);
  for (const std::string& s : a.specials) tok.add_special_token(s);
  return tok;
}

// stdin, or the file named by --input.
ReadFn open_input(const std::string& path, std::unique_ptr<std::FILE, int (*)(std::FILE*)>& holder) {
  std::FILE* f = stdin;
  if (!path.empty()) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw loom::IoError(loom::str("cannot read ", path, ": it is a directory"));
    f = std::fopen(path.c_str(), "rb");
    if (!f) throw loom::IoError(loom::str("cannot open ", path, ": ", std::strerror(errno)));
    holder.reset(f);
  }
  return [f, path](char* dst, size_t n) -> size_t {
    size_t k = std::fread(dst, 1, n, f);
    if (k < n && std::ferror(f)) throw loom::IoError(loom::str("error reading ", path.empty() ? "stdin" : path));
    return k;
  };
}

// Ids as decimal text, space-separated, through one buffer (printf per id would dominate the run time).
class IdPrinter {
 public:
  void print(std::span<const TokenId> ids) {
    for (TokenId id : ids) {
      if (!first_) buf_.push_back(' ');
      first_ = false;
      char tmp[16];
      int n = 0;
      do {
        tmp[n++] = static_cast<char>('0' + id % 10);
        id /= 10;
      } while (id);
      while (n) buf_.push_back(tmp[--n]);
    }
    if (buf_.size() > (1 << 20)) flush();
  }
  void finish() {
    buf_.push_back('\n');
    flush();
    std::fflush(stdout);
  }

 private:
  void flush() {
    if (std::fwrite(buf_.data(), 1, buf_.size(), stdout) != buf_.size()) throw loom::IoError("error writing stdout");
    buf_.clear();
  }
  std::vector<char> buf_;
  bool first_ = true;
};

// Writes decoded bytes as text, keeping an incomplete UTF-8 character at the end of a block for the
// next one, so that U+FFFD replacement sees whole sequences.
class TextPrinter {
 public:
  void add(std::string_view bytes) {
    pending_ += bytes;
    if (pending_.size() > (1 << 20)) flush(false);
  }
  void flush(bool final) {
    size_t cut = pending_.size();
    if (!final) {
      for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
        auto c = static_cast<unsigned char>(pending_[pending_.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead byte
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back) cut = pending_.size() - back;
        break;
      }
    }
    std::string text = replace_invalid_utf8(std::string_view(pending_).substr(0, cut));
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) throw loom::IoError("error writing stdout");
    pending_.erase(0, cut);
    if (final) std::fflush(stdout);
  }

 private:
  std::string pending_;
};

void run_train(const TrainArgs& a) {
  TrainOptions options;
  options.vocab_size = a.vocab_size;
  options.special_tokens = a.specials;
  options.threads = a.threads;
  uint64_t total = 0;
  for (const std::string& path : a.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw loom::IoError(loom::str("train: cannot read input ", path, ": not a readable file"));
    total += fs::file_size(path, ec);
  }
  options.progress = a.progress || total > (uint64_t{32} << 20);
  Tokenizer tok = train_bpe(a.inputs, options);
  save_tokenizer(tok, a.out);
  std::fprintf(stderr, "train: %zu tokens (%zu merges) -> %s\n", tok.vocab_size(), tok.merges().size(), a.out.c_str());
}

void run_encode(const CodecArgs& a) {
  Tokenizer tok = load_with_specials(a);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> holder(nullptr, &std::fclose);
  ReadFn read = open_input(a.input, holder);
  IdPrinter printer;
  EncodeOptions options;
  options.threads = a.threads;
  tok.encode_stream(read, [&](std::span<const TokenId> ids) { printer.print(ids); }, options);
  printer.finish();
}

void run_decode(const CodecArgs& a) {
  Tokenizer tok = load_with_specials(a);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> holder(nullptr, &std::fclose);
  ReadFn read = open_input(a.input, holder);
  TextPrinter printer;
  std::vector<char> buf(1 << 16);
  uint64_t value = 0;
  bool in_number = false;
  std::string bad;
  auto emit = [&] {
    LOOM_CHECK(value < tok.vocab_size(), "decode: token id ", value, " is out of range (vocabulary has ",
               tok.vocab_size(), " tokens)");
    printer.add(tok.token_bytes(static_cast<TokenId>(value)));
    value = 0;
    in_number = false;
  };
  while (size_t n = read(buf.data(), buf.size())) {
    for (size_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c >= '0' && c <= '9') {
        value = value * 10 + static_cast<uint64_t>(c - '0');
        LOOM_CHECK(value < (uint64_t{1} << 40), "decode: token id starting \"", value, "\" is too large");
        in_number = true;
      } else if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == ',') {
        if (in_number) emit();
      } else {
        LOOM_FAIL("decode: expected whitespace-separated token ids, found character '", c, "'");
      }
    }
  }
  if (in_number) emit();
  printer.flush(true);
}

loom::cli::Register reg("tokenizer", "Train, encode and decode byte-level BPE", [](CLI::App& cmd) {
  cmd.require_subcommand(1);

  auto train_args = std::make_shared<TrainArgs>();
  CLI::App* train = cmd.add_subcommand("train", "Train a byte-level BPE tokenizer (CS336 semantics)");
  loom::cli::in_file(train->add_option("--input", train_args->inputs, "Text files to train on"), "text")->required();
  train->add_option("--vocab-size", train_args->vocab_size, "Size of the vocabulary: specials + 256 bytes + merges")
      ->required();
  train->add_option("--special-token", train_args->specials, "A special token (repeat for more)");
  loom::cli::out_path(train->add_option("--out", train_args->out,
                                       "Output: a path ending in .json gets a Hugging Face tokenizer.json, anything "
                                       "else a directory with vocab.json + merges.txt"),
                      "tokenizer")
      ->required();
  train->add_option("--threads", train_args->threads, "Pre-tokenization threads (0: all cores)");
  train->add_flag("--progress", train_args->progress, "Report progress (on by default above 32 MB of input)");
  train->callback([train_args] { run_train(*train_args); });

  auto enc_args = std::make_shared<CodecArgs>();
  CLI::App* enc = cmd.add_subcommand("encode", "Encode text to token ids (printed whitespace-separated)");
  loom::cli::in_path(enc->add_option("--tokenizer", enc_args->tokenizer, "tokenizer.json, or a directory with vocab.json + merges.txt"),
                     "tokenizer")
      ->required();
  enc->add_option("--special-token", enc_args->specials, "Treat this vocabulary entry as a special token");
  loom::cli::in_file(enc->add_option("--input", enc_args->input, "Text file (default: stdin)"), "text");
  enc->add_option("--threads", enc_args->threads, "Encoding threads (0: all cores; 1: no extra thread)");
  enc->callback([enc_args] { run_encode(*enc_args); });

  auto dec_args = std::make_shared<CodecArgs>();
  CLI::App* dec = cmd.add_subcommand("decode", "Decode whitespace-separated token ids to text");
  loom::cli::in_path(dec->add_option("--tokenizer", dec_args->tokenizer, "tokenizer.json, or a directory with vocab.json + merges.txt"),
                     "tokenizer")
      ->required();
  dec->add_option("--special-token", dec_args->specials, "Treat this vocabulary entry as a special token");
  loom::cli::in_file(dec->add_option("--input", dec_args->input, "File of token ids (default: stdin)"), "ids");
  dec->callback([dec_args] { run_decode(*dec_args); });
});

}  // namespace
