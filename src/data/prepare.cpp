#include "data/prepare.h"

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>

#include <unistd.h>

#include "core/error.h"
#include "data/provenance.h"
#include "io/json.h"
#include "tokenizer/formats.h"
#include "tokenizer/tokenizer.h"

namespace loom::data {
namespace fs = std::filesystem;
using tokenizer::TokenId;

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_file(const std::string& path, const char* mode) {
  File f(std::fopen(path.c_str(), mode));
  if (!f) throw IoError(str("prepare: cannot open ", path, ": ", std::strerror(errno)));
  return f;
}

// Appends ids to a token file as little-endian integers of `width` bytes.
class TokenWriter {
 public:
  TokenWriter(const std::string& path, int width) : path_(path), file_(open_file(path, "wb")), width_(width) {}
  void write(std::span<const TokenId> ids) {
    buf_.resize(ids.size() * static_cast<size_t>(width_));
    unsigned char* p = buf_.data();
    for (TokenId id : ids) {
      for (int b = 0; b < width_; ++b) *p++ = static_cast<unsigned char>(id >> (8 * b));
    }
    if (std::fwrite(buf_.data(), 1, buf_.size(), file_.get()) != buf_.size()) {
      throw IoError(str("prepare: error writing ", path_, ": ", std::strerror(errno)));
    }
    count_ += ids.size();
  }
  uint64_t count() const { return count_; }
  void close() {
    if (std::fclose(file_.release()) != 0) throw IoError(str("prepare: error writing ", path_));
  }

 private:
  std::string path_;
  File file_;
  int width_;
  std::vector<unsigned char> buf_;
  uint64_t count_ = 0;
};

// Re-preparing a folder with the tokenizer that made its token files is fine (other inputs, another
// split); with another tokenizer it would replace a data set that runs may still point at.
void refuse_other_tokenizers_tokens(const std::string& out_dir, const TokenizerIdentity& tok) {
  const fs::path meta = fs::path(out_dir) / "meta.json";
  std::error_code ec;
  if (!fs::exists(meta, ec)) return;
  const TokenProvenance recorded = read_provenance(meta.string());
  LOOM_CHECK(made_by(tok, recorded), "prepare: ", meta.string(), " says the token files in ", out_dir,
             " were made by the tokenizer ", recorded.tokenizer_path, " (vocab_size ", recorded.vocab_size,
             "), not by --tokenizer ", tok.path, " (vocab_size ", tok.vocab_size,
             "); preparing would replace them. Choose another --out, or delete ", out_dir, " first");
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  LOOM_CHECK(!options.inputs.empty(), "prepare: no input files");
  LOOM_CHECK(options.val_fraction >= 0.0 && options.val_fraction < 1.0, "prepare: val fraction must be in [0, 1), got ",
             options.val_fraction);
  LOOM_CHECK(!options.out_dir.empty(), "prepare: no output directory");
  for (const std::string& path : options.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw IoError(str("prepare: cannot read input ", path, ": not a readable file"));
  }
  tokenizer::Tokenizer tok = tokenizer::load_tokenizer(options.tokenizer);
  auto eot = tok.special_token_id(options.eot_token);
  LOOM_CHECK(eot.has_value(), "prepare: --eot-token \"", io::brief_text(options.eot_token), "\": the tokenizer ",
             options.tokenizer, " has no such special token to separate documents (train it with --special-token)");

  PrepareResult result;
  result.vocab_size = tok.vocab_size();
  result.dtype = tok.vocab_size() <= 65536 ? "uint16" : "uint32";
  const int width = result.dtype == "uint16" ? 2 : 4;
  result.eot_id = *eot;
  result.tokenizer_hash = tokenizer::tokenizer_hash(options.tokenizer);
  const TokenizerIdentity identity = identify_tokenizer(tok, options.tokenizer);
  refuse_other_tokenizers_tokens(options.out_dir, identity);

  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  LOOM_CHECK(!ec, "prepare: cannot create ", options.out_dir, ": ", ec.message());
  const std::string train_path = (fs::path(options.out_dir) / "train.bin").string();
  const std::string val_path = (fs::path(options.out_dir) / "val.bin").string();

  // Everything goes to train.bin first; the tail moves to val.bin once the total is known.
  TokenWriter writer(train_path, width);
  tokenizer::EncodeOptions encode_options;
  encode_options.threads = options.threads;
  bool last_was_eot = true;  // nothing to separate from before the first document
  uint64_t bytes_done = 0;
  auto last_report = std::chrono::steady_clock::now();
  // On a terminal one line rewritten in place; into a file or pipe, one line per update.
  const bool tty = ::isatty(::fileno(stderr)) != 0;
  const char* const cr = tty ? "\r" : "";
  const char* const nl = tty ? "" : "\n";
  for (const std::string& path : options.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(str("prepare: cannot open ", path, ": ", std::strerror(errno)));
    bool first_part = true;
    tok.encode_stream(
        in,
        [&](std::span<const TokenId> ids) {
          if (ids.empty()) return;
          if (first_part && !last_was_eot && ids.front() != *eot) {
            const TokenId sep = *eot;
            writer.write({&sep, 1});
          }
          first_part = false;
          writer.write(ids);
          last_was_eot = ids.back() == *eot;
          if (options.progress && std::chrono::steady_clock::now() - last_report > std::chrono::seconds(1)) {
            std::fprintf(stderr, "%sprepare: %s: %llu tokens so far%s", cr, path.c_str(),
                         static_cast<unsigned long long>(writer.count()), nl);
            last_report = std::chrono::steady_clock::now();
          }
        },
        encode_options);
    if (in.bad()) throw IoError(str("prepare: error reading ", path));
    bytes_done += fs::file_size(path, ec);
    if (options.progress) {
      std::fprintf(stderr, "%sprepare: %.1f MB -> %llu tokens%s", cr, static_cast<double>(bytes_done) / 1e6,
                   static_cast<unsigned long long>(writer.count()), nl);
    }
  }
  if (options.progress && tty) std::fprintf(stderr, "\n");
  writer.close();
  const uint64_t total = writer.count();
  LOOM_CHECK(total > 0, "prepare: the input is empty (", options.inputs.size(), " file(s) with no text)");

  uint64_t val = static_cast<uint64_t>(std::llround(options.val_fraction * static_cast<double>(total)));
  if (options.val_fraction > 0 && val == 0 && total >= 2) val = 1;
  if (val >= total) val = total - 1;
  result.val_tokens = val;
  result.train_tokens = total - val;
  {
    File src = open_file(train_path, "rb");
    File dst = open_file(val_path, "wb");
    if (std::fseek(src.get(), static_cast<long>(result.train_tokens * width), SEEK_SET) != 0) {
      throw IoError(str("prepare: cannot seek in ", train_path));
    }
    std::vector<char> buf(1 << 20);
    uint64_t left = val * width;
    while (left > 0) {
      size_t k = std::fread(buf.data(), 1, std::min<uint64_t>(left, buf.size()), src.get());
      if (k == 0) throw IoError(str("prepare: short read from ", train_path));
      if (std::fwrite(buf.data(), 1, k, dst.get()) != k) throw IoError(str("prepare: error writing ", val_path));
      left -= k;
    }
    if (std::fclose(dst.release()) != 0) throw IoError(str("prepare: error writing ", val_path));
  }
  fs::resize_file(train_path, result.train_tokens * width, ec);
  LOOM_CHECK(!ec, "prepare: cannot truncate ", train_path, ": ", ec.message());

  nlohmann::ordered_json meta = {{"dtype", result.dtype},
                                 {"vocab_size", result.vocab_size},
                                 {"tokenizer_hash", result.tokenizer_hash},
                                 {"tokenizer_content_hash", identity.content_hash},
                                 {"train_tokens", result.train_tokens},
                                 {"val_tokens", result.val_tokens},
                                 {"eot_id", result.eot_id},
                                 {"eot_token", options.eot_token},
                                 {"val_fraction", options.val_fraction},
                                 {"tokenizer", options.tokenizer},
                                 {"inputs", options.inputs}};
  tokenizer::write_file((fs::path(options.out_dir) / "meta.json").string(), meta.dump(2) + "\n");
  return result;
}

}  // namespace loom::data
