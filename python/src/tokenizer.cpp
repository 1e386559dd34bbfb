// The byte-level BPE tokenizer: construction from vocab/merges, the two file formats, encode/decode,
// lazy encoding of an iterable (StreamEncoder), and BPE training. Token bytes cross as Python bytes.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>

#include "convert.h"
#include "core/thread_count.h"
#include "io/outputs.h"
#include "tokenizer/formats.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/train.h"

namespace loom::python {

namespace {

using tokenizer::TokenId;
using tokenizer::Tokenizer;

// ids as an int32 numpy array (a vocabulary never reaches 2^31 ids).
nb::object ids_to_numpy(std::vector<TokenId> ids) {
  auto* v = new std::vector<int32_t>(ids.begin(), ids.end());
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  size_t shape[1] = {v->size()};
  return nb::cast(Out<int32_t>(v->data(), 1, shape, owner));
}

std::vector<TokenId> checked_ids(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<TokenId> out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    LOOM_CHECK(id >= 0 && static_cast<uint64_t>(id) < tok.vocab_size(), "decode: ids[", out.size(), "]=", id,
               " is outside the vocabulary [0, vocab_size=", tok.vocab_size(), ")");
    out.push_back(static_cast<TokenId>(id));
  }
  return out;
}

std::string bytes_of(nb::handle h) {
  nb::bytes b = nb::cast<nb::bytes>(h);
  return std::string(b.c_str(), b.size());
}

// The tokenizer with `specials` made special tokens, appending to the vocabulary those it lacks.
Tokenizer with_special_tokens(const Tokenizer& tok, const std::vector<std::string>& specials) {
  std::vector<std::string> vocab = tok.vocab();
  std::vector<std::string> all = tok.special_tokens();
  for (const auto& s : specials) {
    if (!tok.token_id(s)) vocab.push_back(s);
    if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
  }
  return Tokenizer(std::move(vocab), tok.merges(), std::move(all));
}

// Encodes text pushed piece by piece, holding back only what might still join the next piece: the
// buffer is cut at a place where pre-tokenization of the parts equals that of the whole
// (find_split_point), so the ids are exactly encode() of the concatenation. Memory: the unencoded
// tail, about `chunk` bytes plus the longest pre-token.
class StreamEncoder {
 public:
  StreamEncoder(const Tokenizer& tok, size_t chunk)
      : tok_(tok), md_(std::make_unique<tokenizer::PreTokenizer::MatchData>(tok.pre_tokenizer())),
        chunk_(chunk), next_try_(chunk) {}

  std::vector<TokenId> feed(std::string_view text) {
    buffer_.append(text);
    if (buffer_.size() < next_try_) return {};
    size_t p = tokenizer::find_split_point(buffer_, tok_.special_matcher(), tok_.pre_tokenizer(), *md_);
    if (p == 0) {
      next_try_ = 2 * buffer_.size();  // no cut yet: look again when the buffer has doubled
      return {};
    }
    std::vector<TokenId> ids = tok_.encode(std::string_view(buffer_).substr(0, p));
    buffer_.erase(0, p);
    next_try_ = std::max(chunk_, buffer_.size() + chunk_);
    return ids;
  }

  std::vector<TokenId> finish() {
    std::vector<TokenId> ids = tok_.encode(buffer_);
    buffer_.clear();
    next_try_ = chunk_;
    return ids;
  }

 private:
  const Tokenizer& tok_;
  std::unique_ptr<tokenizer::PreTokenizer::MatchData> md_;
  std::string buffer_;
  size_t chunk_, next_try_;
};

}  // namespace

void bind_tokenizer(nb::module_& m) {
  nb::class_<Tokenizer>(m, "Tokenizer")
      // vocab: list of bytes (id = index); merges: (left id, right id) by rank; special tokens as text.
      .def("__init__",
           [](Tokenizer* self, nb::list vocab, std::vector<std::pair<TokenId, TokenId>> merges,
              std::vector<std::string> specials) {
             std::vector<std::string> v;
             v.reserve(vocab.size());
             for (nb::handle h : vocab) v.push_back(bytes_of(h));
             new (self) Tokenizer(std::move(v), std::move(merges), std::move(specials));
           })
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def("vocab_bytes",
           [](const Tokenizer& t) {
             nb::list out;
             for (const auto& s : t.vocab()) out.append(nb::bytes(s.data(), s.size()));
             return out;
           })
      .def("merge_ids", [](const Tokenizer& t) { return t.merges(); })
      .def("special_tokens", [](const Tokenizer& t) { return t.special_tokens(); })
      .def("token_id",
           [](const Tokenizer& t, nb::bytes b) -> nb::object {
             auto id = t.token_id(std::string_view(b.c_str(), b.size()));
             return id ? nb::cast(*id) : nb::none();
           })
      .def("special_token_id",
           [](const Tokenizer& t, std::string_view text) -> nb::object {
             auto id = t.special_token_id(text);
             return id ? nb::cast(*id) : nb::none();
           })
      .def("with_special_tokens", &with_special_tokens)
      // threads=1 encodes on the calling thread and starts none; 0 takes every core.
      .def("encode",
           [](const Tokenizer& t, std::string_view text, int64_t threads) {
             // Checked here, before narrowing to int; the library checks the same bound.
             resolve_thread_count(threads, "encode: threads");
             std::vector<TokenId> ids = without_gil([&] {
               if (threads == 1) return t.encode(text);
               tokenizer::EncodeOptions o;
               o.threads = static_cast<int>(threads);
               return t.encode(text, o);
             });
             return ids_to_numpy(std::move(ids));
           })
      .def("decode",
           [](const Tokenizer& t, const std::vector<int64_t>& ids) { return t.decode(checked_ids(t, ids)); })
      .def("decode_bytes",
           [](const Tokenizer& t, const std::vector<int64_t>& ids) {
             std::string s = t.decode_bytes(checked_ids(t, ids));
             return nb::bytes(s.data(), s.size());
           })
      // Never into a loom run directory: a run's tokenizer.json is its own (issue 32).
      .def("save",
           [](const Tokenizer& t, const std::string& path) {
             io::check_output_outside_runs("Tokenizer.save: path", path);
             tokenizer::save_hf_json(t, path);
           })
      .def("save_gpt2", [](const Tokenizer& t, const std::string& dir) {
        io::check_output_outside_runs("Tokenizer.save_gpt2: directory", dir);
        tokenizer::save_gpt2_files(t, dir);
      });

  nb::class_<StreamEncoder>(m, "StreamEncoder")
      .def(nb::init<const Tokenizer&, size_t>(), nb::keep_alive<1, 2>())
      .def("feed", [](StreamEncoder& e, std::string_view text) { return ids_to_numpy(e.feed(text)); })
      .def("finish", [](StreamEncoder& e) { return ids_to_numpy(e.finish()); });

  m.def("load_tokenizer", [](const std::string& path) { return tokenizer::load_tokenizer(path); });
  m.def("tokenizer_from_gpt2_files", [](const std::string& vocab_path, const std::string& merges_path) {
    return tokenizer::tokenizer_from_gpt2_files(tokenizer::read_file(vocab_path), tokenizer::read_file(merges_path),
                                                vocab_path + " + " + merges_path);
  });
  m.def("train_bpe", [](std::vector<std::string> files, size_t vocab_size, std::vector<std::string> specials,
                        int64_t threads) {
    resolve_thread_count(threads, "train: threads");  // before narrowing to int
    tokenizer::TrainOptions o;
    o.vocab_size = vocab_size;
    o.special_tokens = std::move(specials);
    o.threads = static_cast<int>(threads);
    return without_gil([&] { return tokenizer::train_bpe(files, o); });
  });
}

}  // namespace loom::python
