// The GGUF reader and writer, against files PyPI's `gguf` package (llama.cpp's own Python writer) wrote
// and a corpus of malformed files. Both come from make_fixtures.py beside this file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "support/files.h"
#include "support/gguf_files.h"
#include "support/op_test.h"

namespace fs = std::filesystem;
using namespace loom::gguf;
using loom::quant::QuantType;
using namespace loom::test;

namespace {

const fs::path kCorpus = fs::path(LOOM_TEST_DIR) / "corpus";
const fs::path kFixtures = fs::path(LOOM_TEST_DIR) / "fixtures";

// gguf's Python reader names types "UINT32", "ARRAY", ...
std::string python_type_name(ValueType t) {
  static const char* names[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32", "FLOAT32",
                                "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  return names[static_cast<int>(t)];
}

// A scalar value as JSON, the way the fixture holds it.
nlohmann::json scalar_json(const Value& v) {
  return std::visit(
      [](const auto& x) -> nlohmann::json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Array>) {
          return nullptr;
        } else {
          return x;
        }
      },
      v.v);
}

}  // namespace

TEST(GgufFormat, ReadsWhatTheGgufPackageWrote) {
  const nlohmann::json expected = read_json(kFixtures / "values.json");
  ASSERT_EQ(expected.size(), 4u);
  for (const auto& [name, want] : expected.items()) {
    SCOPED_TRACE(name);
    GgufFile f = GgufFile::open((kCorpus / "valid" / name).string());
    const Header& h = f.header();
    EXPECT_EQ(h.version, 3u);
    std::vector<std::string> keys;
    for (const auto& kv : h.metadata) keys.push_back(kv.key);
    EXPECT_EQ(nlohmann::json(keys), want["keys_in_order"]);
    for (const auto& [key, w] : want["metadata"].items()) {
      SCOPED_TRACE(key);
      const Value* v = h.find(key);
      ASSERT_NE(v, nullptr);
      EXPECT_EQ(python_type_name(v->type()), w["types"][0].get<std::string>());
      if (const Array* a = std::get_if<Array>(&v->v)) {
        EXPECT_EQ(python_type_name(a->element), w["types"][1].get<std::string>());
        if (a->element == ValueType::Array) continue;  // checked by hand below (the fixture flattens it)
        ASSERT_EQ(a->count, w["value"].size());
        for (uint64_t i = 0; i < a->count; ++i) {
          if (a->element == ValueType::String) {
            EXPECT_EQ(a->string(i), w["value"][i].get<std::string>());
          } else if (a->element == ValueType::Bool) {
            EXPECT_EQ(a->integer(i) != 0, w["value"][i].get<bool>());
          } else if (a->element == ValueType::F32) {
            EXPECT_EQ(a->number(i), w["value"][i].get<double>());
          } else {
            EXPECT_EQ(a->integer(i), w["value"][i].get<int64_t>());
          }
        }
      } else if (v->type() == ValueType::F32) {
        EXPECT_EQ(static_cast<double>(std::get<float>(v->v)), w["value"].get<double>());
      } else {
        EXPECT_EQ(scalar_json(*v), w["value"]);
      }
    }
    ASSERT_EQ(h.tensors.size(), want["tensors"].size());
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      const auto& t = h.tensors[i];
      const auto& wt = want["tensors"][i];
      SCOPED_TRACE(t.name);
      EXPECT_EQ(t.name, wt["name"].get<std::string>());
      EXPECT_EQ(quant_type_name(t.type), wt["type"].get<std::string>());
      EXPECT_EQ(nlohmann::json(t.ne), wt["ne"]);
      EXPECT_EQ(h.data_start + t.offset, wt["offset"].get<uint64_t>());  // gguf reports file offsets
      loom::Tensor x = f.dequantized(t.name);
      ASSERT_EQ(static_cast<size_t>(x.numel()), wt["values"].size());
      for (int64_t j = 0; j < x.numel(); ++j) EXPECT_EQ(x.data<float>()[j], wt["values"][j].get<float>()) << j;
    }
  }
  // The nested array, which gguf's contents() flattens: [[1, 2], [3]] of i32.
  GgufFile f = GgufFile::open((kCorpus / "valid" / "all_types.gguf").string());
  const Array& nested = f.header().get_array("test.nested");
  ASSERT_EQ(nested.count, 2u);
  const Array& first = std::get<Array>(nested.items[0].v);
  const Array& second = std::get<Array>(nested.items[1].v);
  EXPECT_EQ(first.count, 2u);
  EXPECT_EQ(first.integer(1), 2);
  EXPECT_EQ(second.count, 1u);
  EXPECT_EQ(second.integer(0), 3);
  EXPECT_EQ(f.header().alignment, 32u);
  EXPECT_EQ(GgufFile::open((kCorpus / "valid" / "alignment_64.gguf").string()).header().alignment, 64u);
  // Shapes: ne reversed.
  EXPECT_EQ(f.shape("q8_0"), loom::Shape({2, 64}));
}

TEST(GgufFormat, TypedGettersNameTheKeyAndWhatItHolds) {
  GgufFile f = GgufFile::open((kCorpus / "valid" / "all_types.gguf").string());
  const Header& h = f.header();
  EXPECT_EQ(h.get_uint("test.u64"), 9223372036854775813ull);
  EXPECT_EQ(h.get_uint("test.u8"), 200u);
  EXPECT_EQ(h.get_number("test.i32"), -2000000000.0);
  EXPECT_EQ(h.get_string("general.architecture"), "test");
  EXPECT_TRUE(h.get_bool("test.bool"));
  EXPECT_NE(error_of([&] { h.get_uint("test.i8"); }).find("'test.i8' is i8 -100, expected a non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { h.get_string("test.u32"); }).find("'test.u32' is u32 4000000000, expected a string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { h.get_uint("nope"); }).find("'nope' is missing"), std::string::npos);
  EXPECT_NE(error_of([&] { h.get_array("test.array_i32").string(0); }).find("an array of i32"), std::string::npos);
}

TEST(GgufFormat, RefusesEveryMalformedFileNamingTheProblem) {
  const nlohmann::json expected = read_json(kFixtures / "malformed_expected.json");
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus / "malformed")) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name));
    const std::string err = error_of([&] { GgufFile::open(entry.path().string()); });
    EXPECT_NE(err.find(expected[name].get<std::string>()), std::string::npos) << err;
    EXPECT_EQ(err.rfind(entry.path().string() + ": ", 0), 0u) << err;  // prefixed with the path
    ++n;
  }
  EXPECT_EQ(n, expected.size());
}

TEST(GgufFormat, EveryTruncationOfAValidFileIsRefused) {
  for (const char* name : {"all_types.gguf", "alignment_64.gguf"}) {
    const std::vector<uint8_t> bytes = read_bytes(kCorpus / "valid" / name);
    for (size_t n = 0; n < bytes.size(); ++n) {
      // A file cut inside the last tensor's padding is still whole; everything shorter must be refused.
      const Header full = parse_gguf(bytes.data(), bytes.size());
      if (n >= full.data_start + full.data_bytes) continue;
      const std::string err = error_of([&] { parse_gguf(bytes.data(), n); });
      EXPECT_NE(err.find("truncated file"), std::string::npos) << name << " cut at " << n << ": " << err;
    }
  }
}

TEST(GgufFormat, WriterRoundTripsTheGgufPackagesFilesByteForByte) {
  TempDir dir;
  for (const auto& entry : fs::directory_iterator(kCorpus / "valid")) {
    SCOPED_TRACE(entry.path().filename().string());
    const std::vector<uint8_t> bytes = read_bytes(entry.path());
    const std::string out = rewrite_gguf(entry.path().string(), dir / "out.gguf");
    // Same layout as gguf.GGUFWriter: metadata and tensors in order, each tensor aligned and padded.
    EXPECT_EQ(read_bytes(out), bytes);
  }
}

TEST(GgufFormat, WriterRefusesWhatTheReaderWould) {
  const float x[4] = {1, 2, 3, 4};
  auto err = [&](std::vector<KeyValue> kv, std::vector<TensorEntry> t) {
    return error_of([&] { serialize_gguf(kv, t); });
  };
  EXPECT_NE(err({}, {{"a", {4}, QuantType::F32, x, 12}}).find("has 12 bytes but F32 ne = [4] needs 16"), std::string::npos);
  EXPECT_NE(err({}, {{"a", {4}, QuantType::F32, x, 16}, {"a", {4}, QuantType::F32, x, 16}}).find("given twice"),
            std::string::npos);
  EXPECT_NE(err({{"k", Value{uint32_t{1}}}, {"k", Value{uint32_t{1}}}}, {}).find("given twice"), std::string::npos);
  EXPECT_NE(err({{"general.alignment", Value{uint32_t{24}}}}, {}).find("power of two"), std::string::npos);
  EXPECT_NE(err({}, {{std::string(65, 'x'), {4}, QuantType::F32, x, 16}}).find("longer than 64"), std::string::npos);
  EXPECT_NE(err({}, {{"q", {4}, QuantType::Q8_0, x, 16}}).find("not a whole number of Q8_0 blocks"), std::string::npos);
}

TEST(GgufFormat, WrittenFilesAreAtomicAndHonourTheAlignment) {
  TempDir dir;
  const float x[3] = {1.5f, -2.0f, 0.25f};
  std::vector<KeyValue> kv = {{"general.alignment", Value{uint32_t{128}}}, {"s", Value{std::string("x")}},
                              {"list", string_array({"a", "bc"})}};
  write_gguf_file(dir / "a.gguf", kv, {{"t1", {3}, QuantType::F32, x, 12}, {"t2", {1, 3}, QuantType::F32, x, 12}});
  GgufFile f = GgufFile::open(dir / "a.gguf");
  EXPECT_EQ(f.header().alignment, 128u);
  EXPECT_EQ(f.header().data_start % 128, 0u);
  EXPECT_EQ(f.info("t2").offset, 128u);
  EXPECT_EQ(f.dequantized("t2").data<float>()[2], 0.25f);
  EXPECT_EQ(f.header().get_array("list").string(1), "bc");
  // A refused write leaves the old file and no temporary behind.
  EXPECT_NE(error_of([&] { write_gguf_file(dir / "a.gguf", kv, {{"t", {3}, QuantType::F32, x, 4}}); }), "");
  EXPECT_EQ(GgufFile::open(dir / "a.gguf").header().tensors.size(), 2u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}
