// io/json.h: the limits every JSON reader shares, and the short quotes of JSON in messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "io/json.h"
#include "support/op_test.h"

namespace fs = std::filesystem;
using loom::io::brief_json;
using loom::io::brief_text;
using loom::io::JsonLimits;
using nlohmann::json;

namespace {

using loom::test::error_of;

std::string nested(size_t depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

}  // namespace

TEST(JsonLimits, DepthUpToTheLimitParses) {
  EXPECT_NO_THROW(loom::io::parse_json(nested(64), "x"));
  // Objects count the same: {"a":{"a":...}} 64 deep, and 32 arrays around 32 objects.
  auto objects = [](int depth) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += "{\"a\":";
    return s + "1" + std::string(depth, '}');
  };
  EXPECT_NO_THROW(loom::io::parse_json(objects(64), "x"));
  EXPECT_NO_THROW(loom::io::parse_json(std::string(32, '[') + objects(32) + std::string(32, ']'), "x"));
  EXPECT_THROW(loom::io::parse_json(std::string(32, '[') + objects(33) + std::string(32, ']'), "x"), loom::Error);
}

TEST(JsonLimits, OneLevelPastTheLimitIsRefusedNamingTheFileAndOffset) {
  const std::string msg = error_of([] { loom::io::parse_json(nested(65), "configs/x.json"); });
  EXPECT_HAS(msg, "configs/x.json nests JSON arrays/objects more than 64 levels deep (at byte offset 64)");
  const std::string custom = error_of([] { loom::io::parse_json(nested(4), "f", JsonLimits{.max_depth = 3}); });
  EXPECT_HAS(custom, "more than 3 levels deep (at byte offset 3)");
}

TEST(JsonLimits, SeventyThousandLevelsAreRefusedQuickly) {
  // This depth overflowed the stack in nlohmann's dump() (a segfault in `loom train` and `loom inspect`).
  const std::string deep = "{\"model\": " + nested(70000) + "}";
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { loom::io::parse_json(deep, "deep.json"); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_HAS(msg, "more than 64 levels deep");
  EXPECT_LT(seconds, 0.5);
  EXPECT_TRUE(loom::io::try_parse_json(deep).is_discarded());
}

TEST(JsonLimits, BracketsInsideStringsAreNotNesting) {
  const std::string text = "{\"a\": \"" + nested(1000) + "\\\"[[[[\", \"b\": [\"]]]]\\\\\"]}";
  json j = loom::io::parse_json(text, "x");
  EXPECT_EQ(j["a"].get<std::string>(), nested(1000) + "\"[[[[");
  EXPECT_EQ(j["b"][0].get<std::string>(), "]]]]\\");
  // Closing brackets inside a string do not hide real nesting after it.
  EXPECT_HAS(error_of([] { loom::io::parse_json("[\"]]]]]]]]\"," + nested(64) + "]", "x"); }),
             "more than 64 levels deep");
}

TEST(JsonLimits, SizeIsLimited) {
  const std::string msg = error_of([] { loom::io::parse_json("[" + std::string(100, ' ') + "]", "big.json",
                                                             JsonLimits{.max_depth = 64, .max_bytes = 50}); });
  EXPECT_HAS(msg, "big.json is 102 bytes, over loom's limit of 50 bytes");
}

TEST(JsonLimits, ReadJsonFileRefusesABigFileBeforeReadingIt) {
  const fs::path path = fs::temp_directory_path() / ("loom_json_test_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << "[" << std::string(1000, ' ') << "]";
  }
  EXPECT_HAS(error_of([&] { loom::io::read_json_file(path.string(), "config", JsonLimits{.max_bytes = 100}); }),
             "config: " + path.string() + " is 1002 bytes, over loom's limit of 100 bytes");
  EXPECT_EQ(loom::io::read_json_file(path.string(), "config"), json::array());
  fs::remove(path);
  try {
    loom::io::read_json_file(path.string(), "config");
    ADD_FAILURE() << "a missing file was read";
  } catch (const loom::IoError& e) {
    EXPECT_HAS(std::string(e.what()), "config: cannot open " + path.string());
  }
}

TEST(JsonLimits, ParseErrorsQuoteAShortPrefixOfTheBadToken) {
  // An unterminated string: nlohmann's message quotes everything it read, here a megabyte.
  const std::string text = "{\"a\": \"" + std::string(1 << 20, 'x');
  const std::string msg = error_of([&] { loom::io::parse_json(text, "bad.json"); });
  EXPECT_HAS(msg, "bad.json is not valid JSON: ");
  EXPECT_HAS(msg, "last read: '\"xxxx");
  EXPECT_LT(msg.size(), 300u) << msg.substr(0, 500);
}

TEST(BriefJson, ShortValuesAreWhole) {
  EXPECT_EQ(brief_json(json::parse(R"({"a":[1,2.5,"x",null,true]})")), R"({"a":[1,2.5,"x",null,true]})");
  EXPECT_EQ(brief_json(json("caf\xc3\xa9")), "\"caf\xc3\xa9\"");
}

TEST(BriefJson, LongValuesAreCutWithoutSerializingTheRest) {
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(std::string(100, 'y'));
  const std::string b = brief_json(big);
  EXPECT_LE(b.size(), 83u);
  EXPECT_EQ(b.substr(0, 5), "[\"yyy");
  EXPECT_EQ(b.substr(b.size() - 3), "...");
  EXPECT_EQ(brief_json(json(std::string(1 << 20, 'z')), 10), "\"zzzzzzzzz...");
}

TEST(BriefJson, DeepValuesBuiltInMemoryAreCutToo) {
  // Not from a parser (no depth limit there), so brief_json itself must not recurse per level.
  json deep = json::array();
  for (int i = 0; i < 100000; ++i) {
    json outer = json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  EXPECT_EQ(brief_json(deep, 20), std::string(20, '[') + "...");
}

TEST(BriefJson, CutsAtCharacterBoundaries) {
  const std::string s = brief_json(json(std::string(200, '\xc3') + ""), 10);  // invalid UTF-8: replaced
  EXPECT_LE(s.size(), 20u);
  std::string euros;
  for (int i = 0; i < 50; ++i) euros += "\xe2\x82\xac";  // U+20AC, 3 bytes each
  const std::string e = brief_json(json(euros), 11);     // '"' + 3 whole euros + "..."
  EXPECT_EQ(e, "\"" + euros.substr(0, 9) + "...");
}

TEST(BriefText, CutsAndSaysHowLong) {
  EXPECT_EQ(brief_text("short"), "short");
  EXPECT_EQ(brief_text(std::string(100, 'k'), 4), "kkkk... (100 bytes)");
}
