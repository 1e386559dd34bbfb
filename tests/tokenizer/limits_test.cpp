// The tokenizer readers and encoder on hostile input: JSON nested past io/json.h's limit, fields of the
// wrong type, huge keys quoted in messages, thread counts past kMaxThreads.
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "support/errors.h"

using namespace loom;
using loom::test::error_of;
using namespace loom::tokenizer;
using namespace loom::tokenizer::testing;

namespace {

const std::string kDeep = std::string(70000, '[') + std::string(70000, ']');

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST(TokenizerLimits, DeepTokenizerJsonIsRefusedQuickly) {
  // An added token's id nested ~70,000 deep used to overflow the stack in the message's dump().
  for (const std::string& text :
       {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"added_tokens\":[{\"id\":" + kDeep + "}]}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[" + kDeep + "]}}", kDeep}) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_HAS(error_of([&] { tokenizer_from_hf_json(text, "deep.json"); }),
               "deep.json nests JSON arrays/objects more than 64 levels deep");
    EXPECT_LT(seconds_since(start), 1.0);
  }
  EXPECT_HAS(error_of([&] { tokenizer_from_gpt2_files("{\"a\":" + kDeep + "}", "", "vocab.json"); }),
             "vocab.json nests JSON arrays/objects more than 64 levels deep");
}

TEST(TokenizerLimits, FieldsOfTheWrongTypeAreErrorsNamingThem) {
  // nlohmann's value() threw its own type_error here, which is no loom::Error (fuzz/tokenizer_json_fuzz).
  const std::string base = R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})";
  auto with = [&](const std::string& extra) { return base.substr(0, base.size() - 1) + ", " + extra + "}"; };
  EXPECT_HAS(error_of([] { tokenizer_from_hf_json(R"({"model": {"type": 1, "vocab": {}, "merges": []}})", "t.json"); }),
             "t.json: model.type must be a string, got 1");
  const std::string prefix_space = with(R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "no"})");
  EXPECT_HAS(error_of([&] { tokenizer_from_hf_json(prefix_space, "t.json"); }),
             "t.json: pre_tokenizer.add_prefix_space must be true or false, got \"no\"");
  const std::string no_regex = with(R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": 0})");
  EXPECT_HAS(error_of([&] { tokenizer_from_hf_json(no_regex, "t.json"); }),
             "t.json: pre_tokenizer.use_regex must be true or false, got 0");
  EXPECT_HAS(error_of([&] { tokenizer_from_hf_json(with(R"("decoder": {"type": ["ByteLevel"]})"), "t.json"); }),
             "t.json: decoder.type must be a string");
}

TEST(TokenizerLimits, MessagesQuoteAShortPrefix) {
  Tokenizer tok = small_tokenizer(300);
  auto j = nlohmann::json::parse(to_hf_json(tok));
  const std::string long_key(1 << 20, 'q');
  j["model"]["vocab"][long_key] = -1;
  std::string msg = error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); });
  EXPECT_HAS(msg, "t.json: vocabulary entry \"qqqq");
  EXPECT_LT(msg.size(), 300u);

  j = nlohmann::json::parse(to_hf_json(tok));
  j["model"]["merges"][0] = nlohmann::json::array({std::string(1 << 20, 'm')});
  msg = error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); });
  EXPECT_HAS(msg, "t.json: merge 0 is [\"mmmm");
  EXPECT_LT(msg.size(), 300u);

  // A parse error after a megabyte-long unterminated string.
  msg = error_of([&] { tokenizer_from_hf_json("{\"model\": \"" + std::string(1 << 20, 'u'), "t.json"); });
  EXPECT_HAS(msg, "t.json is not valid JSON");
  EXPECT_LT(msg.size(), 400u);
  msg = error_of([&] { tokenizer_from_gpt2_files("{\"" + std::string(1 << 20, 'u'), "", "vocab.json"); });
  EXPECT_HAS(msg, "vocab.json: not valid JSON");
  EXPECT_LT(msg.size(), 400u);
}

TEST(TokenizerLimits, ThreadCountsAreBounded) {
  // threads=100000 aborted the process: a std::thread that failed to start left the others joinable.
  Tokenizer tok = small_tokenizer(300);
  for (int threads : {100000, 1025, -1}) {
    EncodeOptions o;
    o.threads = threads;
    EXPECT_HAS(error_of([&] { tok.encode("hello world", o); }),
               "encode: threads must be in [0, 1024] (0: every core), got " + std::to_string(threads));
    TrainOptions t;
    t.vocab_size = 300;
    t.threads = threads;
    EXPECT_HAS(error_of([&] { train_bpe_on_text("hello world hello world", t); }),
               "train: threads must be in [0, 1024] (0: every core), got " + std::to_string(threads));
  }
  EncodeOptions o;
  o.threads = 0;
  EXPECT_EQ(tok.encode("hello world", o), tok.encode("hello world"));
}

TEST(TokenizerLimits, CliRefusesTooManyThreads) {
  TempDir dir;
  save_hf_json(small_tokenizer(300), dir / "tok.json");
  write_text(dir / "in.txt", "hello world");
  RunResult r = run_cli({"tokenizer", "encode", "--tokenizer", dir / "tok.json", "--input", dir / "in.txt",
                         "--threads", "100000"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_HAS(r.err, "--threads: must be in [0, 1024]");
}

TEST(TokenizerLimits, TokenBytesInMessagesAreCutShort) {
  Tokenizer tok = small_tokenizer(300);
  std::vector<std::string> vocab = tok.vocab();
  vocab.push_back(std::string(1 << 20, 'w'));
  vocab.push_back(std::string(1 << 20, 'w'));  // the same bytes twice
  std::string msg = error_of([&] { Tokenizer(vocab, tok.merges(), {}); });
  EXPECT_HAS(msg, "are the same bytes \"wwww");
  EXPECT_LT(msg.size(), 300u);
  msg = error_of([&] { Tokenizer(tok.vocab(), tok.merges(), {std::string(1 << 20, 's')}); });
  EXPECT_HAS(msg, "tokenizer: special token (--special-token) \"ssss");
  EXPECT_LT(msg.size(), 300u);
}

TEST(TokenizerLimits, AnIdPastTheNumberOfEntriesIsRefusedBeforeAllocating) {
  // One entry with id 1,344,444,440 in a 9 KB file made the reader resize its table to that many
  // strings (43 GB; fuzz/tokenizer_json_fuzz.cpp found it). Ids must be contiguous, so an id at or past
  // the number of entries the file lists is an error found first.
  Tokenizer tok = small_tokenizer(300);
  auto j = nlohmann::json::parse(to_hf_json(tok));
  const size_t listed = j["model"]["vocab"].size() + j["added_tokens"].size();
  j["model"]["vocab"]["zzz"] = 1'344'444'440;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_HAS(error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); }),
             "t.json: vocabulary entry \"zzz\" has id 1344444440, but the file lists only " +
                 std::to_string(listed + 1) + " tokens");
  EXPECT_LT(seconds_since(start), 1.0);
  const std::string vocab = to_gpt2_vocab_json(tok);
  const std::string big_id = vocab.substr(0, vocab.rfind('}')) + ", \"zzz\": 2000000000}";
  EXPECT_HAS(error_of([&] { tokenizer_from_gpt2_files(big_id, "", "vocab.json"); }),
             "vocab.json: vocabulary entry \"zzz\" has id 2000000000, but the file lists only");
}
