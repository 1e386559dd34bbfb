// Tokenizer, token files and model are checked against each other before any compute (runs/consistency.h,
// data/provenance.h), through the CLI as a user meets them: `loom train` with another tokenizer's token
// files, `loom eval` of a run on another tokenizer's data, `loom prepare` over another tokenizer's folder,
// and a tokenizer larger than the model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "support/cli_support.h"
#include "core/error.h"
#include "data/provenance.h"
#include "tokenizer/formats.h"
#include "tokenizer/train.h"

namespace fs = std::filesystem;
using loom::test::CliResult;
using loom::test::run_loom;
using loom::test::TempDir;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Two tokenizers of the same vocabulary size trained on different text (A and B), one larger (big), and
// token files prepared with A and with B.
struct Prepared {
  TempDir dir{"tok"};
  Prepared() {
    loom::test::write_text(dir.path / "a.txt", 6000, 0);
    loom::test::write_text(dir.path / "b.txt", 6000, 1);
    for (auto [name, text, vocab] : {std::tuple{"A", "a.txt", "300"}, {"B", "b.txt", "300"}, {"big", "b.txt", "700"}}) {
      CliResult r = run_loom({"tokenizer", "train", "--input", dir / text, "--vocab-size", vocab, "--special-token",
                              "<|endoftext|>", "--out", dir / (std::string("tok") + name + ".json")});
      EXPECT_EQ(r.status, 0) << r.output;
    }
    for (auto [tok, text, out] : {std::tuple{"tokA.json", "a.txt", "dataA"}, {"tokB.json", "b.txt", "dataB"}}) {
      CliResult r = run_loom({"prepare", "--tokenizer", dir / tok, "--input", dir / text, "--out", dir / out});
      EXPECT_EQ(r.status, 0) << r.output;
    }
  }
  // `loom train` of a tiny model for two steps, no validation, checkpoints or samples.
  std::vector<std::string> train(const std::string& tok, const std::string& data, const std::string& out) const {
    return {"train", "--config", "tiny", "--out", dir / out, "--set", "data.tokenizer=" + (dir / tok),
            "--set", "data.train=" + (dir / (data + "/train.bin")), "--set", "data.val=" + (dir / (data + "/val.bin")),
            "--set", "training.max_steps=2", "--set", "training.batch_size=2", "--set", "eval.interval=0",
            "--set", "checkpoint.interval=0", "--set", "sample.num_samples=0", "--set", "logging.progress=none"};
  }
};

}  // namespace

TEST(TokenizerChecks, TrainingWithAnotherTokenizersTokenFilesIsRefusedNamingBothFiles) {
  Prepared s;
  CliResult ok = run_loom(s.train("tokA.json", "dataA", "runA"));
  ASSERT_EQ(ok.status, 0) << ok.output;
  CliResult r = run_loom(s.train("tokB.json", "dataA", "runB"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r.output, "data.tokenizer = " + (s.dir / "tokB.json"))) << r.output;
  EXPECT_TRUE(has(r.output, s.dir / "dataA/meta.json")) << r.output;
  EXPECT_TRUE(has(r.output, "tokA.json")) << r.output;
  EXPECT_FALSE(has(r.output, "training ")) << "refused before training started:\n" << r.output;
  EXPECT_FALSE(fs::exists(s.dir.path / "runB" / "model.safetensors"));
}

TEST(TokenizerChecks, EvalOfARunOnAnotherTokenizersDataIsRefusedNamingBothFiles) {
  Prepared s;
  CliResult trained = run_loom(s.train("tokA.json", "dataA", "runA"));
  ASSERT_EQ(trained.status, 0) << trained.output;
  CliResult same = run_loom({"eval", "--run", s.dir / "runA", "--data", s.dir / "dataA/val.bin", "--max-windows", "2"});
  EXPECT_EQ(same.status, 0) << same.output;
  EXPECT_TRUE(has(same.output, "\"loss\"")) << same.output;

  CliResult other = run_loom({"eval", "--run", s.dir / "runA", "--data", s.dir / "dataB/val.bin"});
  EXPECT_EQ(other.status, 1) << other.output;
  EXPECT_TRUE(has(other.output, s.dir / "runA/tokenizer.json")) << other.output;
  EXPECT_TRUE(has(other.output, s.dir / "dataB/meta.json")) << other.output;
  EXPECT_FALSE(has(other.output, "\"loss\"")) << other.output;

  // The weights file's folder holds the same tokenizer.json: the same check.
  CliResult weights = run_loom({"eval", "--weights", s.dir / "runA/model.safetensors", "--data", s.dir / "dataB/val.bin"});
  EXPECT_EQ(weights.status, 1) << weights.output;
  EXPECT_TRUE(has(weights.output, s.dir / "dataB/meta.json")) << weights.output;
}

TEST(TokenizerChecks, PrepareRefusesToReplaceAnotherTokenizersTokenFiles) {
  Prepared s;
  const auto before = fs::file_size(s.dir.path / "dataA" / "train.bin");
  CliResult r = run_loom({"prepare", "--tokenizer", s.dir / "tokB.json", "--input", s.dir / "b.txt", "--out", s.dir / "dataA"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r.output, s.dir / "dataA/meta.json")) << r.output;
  EXPECT_TRUE(has(r.output, "tokB.json")) << r.output;
  EXPECT_EQ(fs::file_size(s.dir.path / "dataA" / "train.bin"), before) << "the old token files are untouched";
  // The tokenizer that made them may prepare the folder again.
  CliResult again = run_loom({"prepare", "--tokenizer", s.dir / "tokA.json", "--input", s.dir / "b.txt", "--out", s.dir / "dataA"});
  EXPECT_EQ(again.status, 0) << again.output;
}

TEST(TokenizerChecks, ATokenizerLargerThanTheModelIsRefusedBeforeTraining) {
  Prepared s;
  CliResult prep = run_loom({"prepare", "--tokenizer", s.dir / "tokbig.json", "--input", s.dir / "b.txt", "--out", s.dir / "dataBig"});
  ASSERT_EQ(prep.status, 0) << prep.output;
  CliResult r = run_loom(s.train("tokbig.json", "dataBig", "runBig"));  // tiny: vocab_size 512
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r.output, "512")) << r.output;
  EXPECT_TRUE(has(r.output, "tokbig.json") || has(r.output, "dataBig/meta.json")) << r.output;
  EXPECT_FALSE(has(r.output, "training ")) << r.output;

  // Token ids at or above model.vocab_size are found by a scan when meta.json records nothing to compare.
  std::ofstream(s.dir.path / "dataBig" / "meta.json") << R"({"dtype": "uint16"})";
  std::vector<std::string> args = s.train("nope.json", "dataBig", "runBig2");
  args.insert(args.end(), {"--set", "model.vocab_size=300"});
  CliResult ids = run_loom(args);
  EXPECT_EQ(ids.status, 1) << ids.output;
  EXPECT_TRUE(has(ids.output, "holds token id")) << ids.output;
  EXPECT_TRUE(has(ids.output, "vocab_size=300")) << ids.output;
}

TEST(TokenizerChecks, TheSameTokenizerInAnotherFileIsRecognisedByItsContent) {
  TempDir dir("content");
  loom::test::write_text(dir.path / "a.txt", 3000, 0);
  loom::tokenizer::TrainOptions options;
  options.vocab_size = 300;
  options.special_tokens = {"<|endoftext|>"};
  const auto tok = loom::tokenizer::train_bpe({dir / "a.txt"}, options);
  loom::tokenizer::save_hf_json(tok, dir / "tok.json");
  loom::tokenizer::save_gpt2_files(tok, dir / "gpt2");  // vocab.json + merges.txt: other bytes, same tokenizer
  loom::data::TokenProvenance recorded;
  recorded.meta_path = dir / "meta.json";
  recorded.tokenizer_path = dir / "tok.json";
  recorded.tokenizer_hash = loom::tokenizer::tokenizer_hash(dir / "tok.json");
  recorded.tokenizer_content_hash = loom::data::tokenizer_content_hash(tok);
  const auto other_format = loom::data::identify_tokenizer(dir / "gpt2");
  EXPECT_NE(other_format.file_hash, recorded.tokenizer_hash);
  EXPECT_TRUE(loom::data::made_by(other_format, recorded));
  // An older meta.json without the content hash: compared through the recorded file.
  recorded.tokenizer_content_hash.clear();
  EXPECT_TRUE(loom::data::made_by(other_format, recorded));
  fs::remove(dir.path / "tok.json");  // ... and refused when that file is gone: nothing proves they agree
  EXPECT_FALSE(loom::data::made_by(other_format, recorded));
  EXPECT_THROW(loom::data::check_made_by(other_format, recorded, "test"), loom::Error);
}
