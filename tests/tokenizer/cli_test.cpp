// The `loom tokenizer` and `loom prepare` commands, run as subprocesses: round trips, streaming in
// bounded memory, the prepared token files, and errors (exit code 1, "error: ..." on stderr).
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/sha256.h"

using namespace loom::tokenizer;
using namespace loom::tokenizer::testing;

TEST(Cli, TrainEncodeDecodeRoundTrip) {
  TempDir dir;
  write_text(dir / "a.txt", random_text(100000, 1));
  write_text(dir / "b.txt", random_text(50000, 2) + "<|endoftext|>" + random_text(5000, 3));
  auto r = run_cli({"tokenizer", "train", "--input", dir / "a.txt", dir / "b.txt", "--vocab-size", "700",
                    "--special-token", "<|endoftext|>", "--out", dir / "tok.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Tokenizer tok = load_tokenizer(dir / "tok.json");
  EXPECT_EQ(tok.vocab_size(), 700u);

  const std::string text = "Hello <|endoftext|> caf\u00e9 \U0001F600\n\n  trailing  ";
  write_text(dir / "in.txt", text);
  r = run_cli({"tokenizer", "encode", "--tokenizer", dir / "tok.json", "--input", dir / "in.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out), tok.encode(text));
  write_text(dir / "ids.txt", r.out);
  r = run_cli({"tokenizer", "decode", "--tokenizer", dir / "tok.json"}, dir / "ids.txt");  // ids on stdin
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, text);

  // Ids that end inside a UTF-8 character decode to U+FFFD; a bad id is an error.
  write_text(dir / "half.txt", std::to_string(*tok.token_id("\xe6")) + " " + std::to_string(*tok.token_id("\x97")) +
                                   " " + std::to_string(*tok.token_id("a")) + "\n");
  r = run_cli({"tokenizer", "decode", "--tokenizer", dir / "tok.json", "--input", dir / "half.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "\xEF\xBF\xBD" "a");
  write_text(dir / "bad_ids.txt", "1 2 700");
  r = run_cli({"tokenizer", "decode", "--tokenizer", dir / "tok.json", "--input", dir / "bad_ids.txt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: decode: token id 700 is out of range"), std::string::npos) << r.err;

  // The same through vocab.json + merges.txt.
  r = run_cli({"tokenizer", "train", "--input", dir / "a.txt", "--vocab-size", "400", "--out", dir / "gpt2fmt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli({"tokenizer", "encode", "--tokenizer", dir / "gpt2fmt"}, dir / "in.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out), load_tokenizer(dir / "gpt2fmt").encode(text));
}

TEST(Cli, Gpt2EncodeMatchesTiktokenFixture) {
  LOOM_REQUIRE_GPT2();
  TempDir dir;
  auto cases = nlohmann::json::parse(read_text(fixture("gpt2_reference.json")))["cases"];
  write_text(dir / "in.txt", cases[2]["text"].get<std::string>());  // "Hello world<|endoftext|>\n\n..."
  auto r = run_cli({"tokenizer", "encode", "--tokenizer", gpt2_dir(), "--input", dir / "in.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out), cases[2]["ids"].get<std::vector<TokenId>>());
}

TEST(Cli, StreamingEncodeUsesBoundedMemory) {
  TempDir dir;
  Tokenizer tok = small_tokenizer(500);
  save_hf_json(tok, dir / "tok.json");
  // 64 MB of text: the encoder must not hold it (or its ~20M ids) in memory at once.
  const std::string block = random_text(1 << 20, 4);
  {
    std::ofstream out(dir / "big.txt", std::ios::binary);
    for (int i = 0; i < 64; ++i) out << block << (i % 8 == 7 ? "<|endoftext|>" : "");
  }
  auto r = run_cli({"tokenizer", "encode", "--tokenizer", dir / "tok.json", "--input", dir / "big.txt", "--threads", "2"},
                   "", "/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.max_rss_kb, 48 * 1024) << "peak memory " << r.max_rss_kb / 1024 << " MB for a 64 MB input";
}

TEST(Cli, PrepareWritesTokenFilesAndMeta) {
  TempDir dir;
  Tokenizer tok = small_tokenizer(600);
  save_hf_json(tok, dir / "tok.json");
  const std::string doc1 = random_text(30000, 8), doc2 = random_text(20000, 9) + "<|endoftext|>" + random_text(100, 10);
  write_text(dir / "d1.txt", doc1);
  write_text(dir / "d2.txt", doc2);
  auto r = run_cli({"prepare", "--tokenizer", dir / "tok.json", "--input", dir / "d1.txt", dir / "d2.txt", "--out",
                    dir / "out", "--val-fraction", "0.25"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  std::vector<TokenId> expect = tok.encode(doc1);
  const TokenId eot = *tok.special_token_id("<|endoftext|>");
  expect.push_back(eot);
  for (TokenId t : tok.encode(doc2)) expect.push_back(t);

  auto meta = nlohmann::json::parse(read_text(dir / "out/meta.json"));
  EXPECT_EQ(meta["dtype"], "uint16");
  EXPECT_EQ(meta["vocab_size"], 600);
  EXPECT_EQ(meta["eot_id"], eot);
  EXPECT_EQ(meta["tokenizer_hash"], sha256_hex(read_text(dir / "tok.json")));
  const uint64_t n_train = meta["train_tokens"], n_val = meta["val_tokens"];
  EXPECT_EQ(n_train + n_val, expect.size());
  EXPECT_NEAR(static_cast<double>(n_val), 0.25 * static_cast<double>(expect.size()), 1.0);

  std::string bytes = read_text(dir / "out/train.bin") + read_text(dir / "out/val.bin");
  ASSERT_EQ(bytes.size(), 2 * expect.size());
  ASSERT_EQ(read_text(dir / "out/train.bin").size(), 2 * n_train);
  std::vector<TokenId> got;
  for (size_t i = 0; i < bytes.size(); i += 2) {
    got.push_back(static_cast<unsigned char>(bytes[i]) | (static_cast<unsigned char>(bytes[i + 1]) << 8));
  }
  EXPECT_EQ(got, expect);
}

TEST(Cli, PrepareUsesUint32ForLargeVocabularies) {
  LOOM_REQUIRE_GPT2();
  // GPT-2 fits uint16; a 70000-token vocabulary does not: pad GPT-2's vocabulary with unused tokens.
  Tokenizer gpt2 = load_tokenizer(gpt2_dir());
  std::vector<std::string> vocab = gpt2.vocab();
  for (int i = 0; vocab.size() < 70000; ++i) vocab.push_back("<|unused" + std::to_string(i) + "|>");
  Tokenizer big(vocab, gpt2.merges(), {"<|endoftext|>"});
  TempDir dir;
  save_hf_json(big, dir / "big.json");
  write_text(dir / "d.txt", "Hello world");
  auto r = run_cli({"prepare", "--tokenizer", dir / "big.json", "--input", dir / "d.txt", "--out", dir / "out",
                    "--val-fraction", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto meta = nlohmann::json::parse(read_text(dir / "out/meta.json"));
  EXPECT_EQ(meta["dtype"], "uint32");
  // "Hello world" = GPT-2 ids 15496 (0x3C88) and 995 (0x03E3), as little-endian uint32.
  EXPECT_EQ(read_text(dir / "out/train.bin"), std::string("\x88\x3c\x00\x00\xe3\x03\x00\x00", 8));
}

TEST(Cli, BadInputGivesErrorAndExitCodeOne) {
  TempDir dir;
  write_text(dir / "empty.txt", "");
  write_text(dir / "text.txt", "some text here");
  write_text(dir / "bad.json", "{\"model\": ");
  save_hf_json(small_tokenizer(300), dir / "tok.json");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"tokenizer", "train", "--input", dir / "empty.txt", "--vocab-size", "300", "--out", dir / "t.json"}, "empty"},
      {{"tokenizer", "train", "--input", dir / "text.txt", "--vocab-size", "200", "--out", dir / "t.json"},
       "--vocab-size: must be in [256, "},
      {{"tokenizer", "train", "--input", dir / "missing.txt", "--vocab-size", "300", "--out", dir / "t.json"},
       "missing.txt"},
      {{"tokenizer", "encode", "--tokenizer", dir / "bad.json", "--input", dir / "text.txt"}, "not valid JSON"},
      {{"tokenizer", "encode", "--tokenizer", dir / "nope.json", "--input", dir / "text.txt"}, "no such file"},
      {{"prepare", "--tokenizer", dir / "bad.json", "--input", dir / "text.txt", "--out", dir / "o"}, "bad.json"},
      {{"prepare", "--tokenizer", dir / "tok.json", "--input", dir / "empty.txt", "--out", dir / "o"}, "empty"},
      {{"prepare", "--tokenizer", dir / "tok.json", "--input", dir / "missing.txt", "--out", dir / "o"}, "missing.txt"},
      {{"prepare", "--tokenizer", dir / "tok.json", "--input", dir / "text.txt", "--out", dir / "o", "--val-fraction",
        "1.5"},
       "--val-fraction"},
  };
  for (const Case& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args[1] << ": " << r.err;
    EXPECT_TRUE(r.err.starts_with("error: ")) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
}
