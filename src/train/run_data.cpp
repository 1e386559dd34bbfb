#include "train/run_data.h"

#include <filesystem>

#include "core/error.h"
#include "train/consistency.h"

namespace loom::train {
namespace fs = std::filesystem;

namespace {
data::TokenFile open_checked(const std::string& path, const char* key, data::TokenDType dtype) {
  if (!fs::is_regular_file(path)) {
    throw IoError(str("config: ", key, " = ", path, " does not exist (run `loom prepare`, or set ", key, ")"));
  }
  return data::TokenFile::open(path, dtype);
}
}  // namespace

RunData open_run_data(const TrainConfig& c) {
  fs::path meta_path = fs::path(c.data.train).parent_path() / "meta.json";
  if (!fs::is_regular_file(meta_path)) {
    throw IoError(str("config: data.train = ", c.data.train, " has no meta.json beside it (", meta_path.string(),
                      "); `loom prepare` writes one"));
  }
  data::TokenMeta meta = data::read_token_meta(meta_path.string());
  check_training_tokenizer(c, meta_path.string());  // before any compute (train/consistency.h)
  LOOM_CHECK(meta.vocab_size == 0 || meta.vocab_size <= c.model.vocab_size(), "config: model.vocab_size=",
             c.model.vocab_size(), " is smaller than the tokenizer's vocabulary (", meta_path.string(),
             " says vocab_size=", meta.vocab_size, ")");
  data::TokenFile train = open_checked(c.data.train, "data.train", meta.dtype);
  std::optional<data::TokenFile> val;
  if (c.eval.interval > 0) val = open_checked(c.data.val, "data.val", meta.dtype);
  check_training_tokens(c, train, "data.train");
  if (val) check_training_tokens(c, *val, "data.val");
  c.check_data_size(train.size(), val ? val->size() : 0);

  RngKey root = RngKey::from_seed(c.training.seed);
  RunData out{data::BatchLoader(std::move(train), c.training.batch_size, c.model.context_length(),
                                c.training.sampling, root.fold_in("train")),
              std::nullopt, meta};
  if (val) {
    out.val.emplace(std::move(*val), c.training.batch_size, c.model.context_length(), data::Sampling::Random,
                    root.fold_in("val"));
  }
  return out;
}

}  // namespace loom::train
