#include "train/run_data.h"

#include <filesystem>

#include "core/error.h"
#include "data/prepare.h"
#include "data/provenance.h"
#include "tokenizer/formats.h"
#include "tokenizer/train.h"

namespace loom::train {
namespace fs = std::filesystem;

namespace {
data::TokenFile open_checked(const std::string& path, const char* key, data::TokenDType dtype) {
  if (!fs::is_regular_file(path)) {
    throw IoError(str("config: ", key, " = ", path, " does not exist (run `loom prepare`, or set ", key, ")"));
  }
  return data::TokenFile::open(path, dtype);
}

// data.tokenizer must be the tokenizer data.train's meta.json records (and exist when meta.json records
// one: samples and checkpoints use it), and its vocabulary must fit model.vocab_size.
void check_training_tokenizer(const TrainConfig& c, const std::string& meta_path) {
  const data::TokenProvenance recorded = data::read_provenance(meta_path);
  std::error_code ec;
  if (!fs::exists(c.data.tokenizer, ec)) {
    LOOM_CHECK(!recorded.records_tokenizer(), "config: data.tokenizer = ", c.data.tokenizer, " does not exist, but ",
               meta_path, " says data.train was made by the tokenizer ", recorded.tokenizer_path,
               ": set data.tokenizer to it (samples and checkpoints need the tokenizer the data was made with)");
    return;
  }
  const data::TokenizerIdentity tok = data::identify_tokenizer(c.data.tokenizer);
  data::check_made_by(tok, recorded, "config: data.tokenizer");
  data::check_tokenizer_fits_model(tok, c.model.vocab_size(), "config: model.vocab_size");
}

// Every id in the token file is below model.vocab_size; `key` is its config key (data.train).
void check_training_tokens(const TrainConfig& c, const data::TokenFile& tokens, const std::string& key) {
  data::check_tokens_fit_model(tokens, c.model.vocab_size(), str("config: model.vocab_size; ", key));
}
}  // namespace

RunData open_run_data(const TrainConfig& c) {
  fs::path meta_path = fs::path(c.data.train).parent_path() / "meta.json";
  if (!fs::is_regular_file(meta_path)) {
    throw IoError(str("config: data.train = ", c.data.train, " has no meta.json beside it (", meta_path.string(),
                      "); `loom prepare` writes one"));
  }
  data::TokenMeta meta = data::read_token_meta(meta_path.string());
  check_training_tokenizer(c, meta_path.string());  // before any compute
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

namespace {

std::vector<std::string> corpus_files(const std::string& corpus) {
  LOOM_CHECK(fs::exists(corpus), "data.corpus = \"", corpus,
             "\" does not exist: fetch the default corpus with tools/get_corpus.sh, or point data.corpus at a "
             "folder of .txt files (or one file)");
  std::vector<std::string> files;
  if (fs::is_regular_file(corpus)) {
    files.push_back(corpus);
  } else {
    for (const auto& entry : fs::directory_iterator(corpus)) {
      if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  LOOM_CHECK(!files.empty(), "data.corpus = \"", corpus, "\" holds no .txt files");
  return files;
}

}  // namespace

std::vector<std::string> ensure_training_data(const TrainConfig& config, bool progress) {
  std::vector<std::string> made;
  const auto& d = config.data;
  if (fs::exists(d.train) && fs::exists(d.val)) return made;
  std::vector<std::string> files = corpus_files(d.corpus);
  if (!fs::exists(d.tokenizer)) {
    tokenizer::TrainOptions options;
    options.vocab_size = static_cast<size_t>(config.model.vocab_size());
    options.special_tokens = {"<|endoftext|>"};
    options.progress = progress;
    tokenizer::Tokenizer tok = tokenizer::train_bpe(files, options);
    if (!fs::path(d.tokenizer).parent_path().empty()) fs::create_directories(fs::path(d.tokenizer).parent_path());
    tokenizer::save_hf_json(tok, d.tokenizer);
    made.push_back(str("trained a ", tok.vocab_size(), "-token BPE tokenizer on ", files.size(), " file(s) -> ",
                       d.tokenizer));
  }
  // The tokenizer's ids must fit the model before minutes go into preparing tokens with it.
  data::check_tokenizer_fits_model(data::identify_tokenizer(d.tokenizer), config.model.vocab_size(),
                                   "config: model.vocab_size");
  const fs::path out_dir = fs::path(d.train).parent_path();
  LOOM_CHECK(fs::path(d.train).filename() == "train.bin" && fs::path(d.val).filename() == "val.bin" &&
                 fs::path(d.val).parent_path() == out_dir,
             "data.train = \"", d.train, "\" and data.val = \"", d.val,
             "\" do not exist; to prepare them automatically they must be train.bin and val.bin in one folder");
  data::PrepareOptions prep;
  prep.tokenizer = d.tokenizer;
  prep.inputs = files;
  prep.out_dir = out_dir.string();
  prep.val_fraction = d.val_fraction;
  prep.progress = progress;
  data::PrepareResult r = data::prepare_dataset(prep);
  made.push_back(str("prepared ", r.train_tokens, " train and ", r.val_tokens, " validation tokens (", r.dtype,
                     ") -> ", prep.out_dir));
  return made;
}

void save_run_tokenizer(const TrainConfig& config, const std::string& run_dir) {
  const fs::path from(config.data.tokenizer), to = fs::path(run_dir) / "tokenizer.json";
  if (fs::is_regular_file(from)) {
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  } else if (fs::is_directory(from)) {
    tokenizer::save_hf_json(tokenizer::load_tokenizer(from.string()), to.string());
  }
}

}  // namespace loom::train
