// safetensors reader and writer, against files the reference library (PyPI safetensors) wrote and a
// corpus of malformed files. Both come from make_corpus.py beside this file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "io/file.h"
#include "io/safetensors.h"
#include "support/files.h"
#include "support/op_test.h"

namespace fs = std::filesystem;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using namespace loom::io;
using namespace loom::test;

namespace {

const fs::path kCorpus = fs::path(LOOM_TEST_DIR) / "corpus";
const fs::path kFixtures = fs::path(LOOM_TEST_DIR) / "fixtures";

template <typename T>
std::vector<T> bytes_as(std::span<const uint8_t> bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<float> values_as_float(const Tensor& t) {
  std::vector<float> out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::F32: out.push_back(t.data<float>()[i]); break;
      case DType::BF16: out.push_back(t.data<loom::bf16>()[i].to_float()); break;
      case DType::I32: out.push_back(static_cast<float>(t.data<int32_t>()[i])); break;
      case DType::U16: out.push_back(static_cast<float>(t.data<uint16_t>()[i])); break;
      case DType::Bool: out.push_back(t.data<bool>()[i] ? 1.0f : 0.0f); break;
    }
  }
  return out;
}

// ---- malformed files --------------------------------------------------------------------------------

TEST(SafetensorsMalformed, EveryFileIsRefusedWithItsSpecificError) {
  const nlohmann::json expected = read_json(kFixtures / "malformed_expected.json");
  std::set<std::string> on_disk;
  for (const auto& entry : fs::directory_iterator(kCorpus / "malformed")) on_disk.insert(entry.path().filename());
  std::set<std::string> listed;
  for (const auto& [name, text] : expected.items()) listed.insert(name);
  EXPECT_EQ(on_disk, listed) << "every corpus file needs an expected error, and every expectation a file";
  ASSERT_GE(listed.size(), 11u);

  for (const auto& [name, text] : expected.items()) {
    SCOPED_TRACE(name);
    const fs::path path = kCorpus / "malformed" / name;
    const std::string msg = error_of([&] { SafetensorsFile::open(path.string()); });
    EXPECT_NE(msg.find(text.get<std::string>()), std::string::npos) << "message: " << msg;
    EXPECT_NE(msg.find(path.string()), std::string::npos) << "the message names the file: " << msg;
    // The memory reader applies the same rules.
    const std::vector<uint8_t> bytes = read_bytes(path);
    const std::string mem = error_of([&] { SafetensorsFile::from_memory(bytes.data(), bytes.size()); });
    EXPECT_NE(mem.find(text.get<std::string>()), std::string::npos) << "message: " << mem;
  }
}

TEST(SafetensorsMalformed, AWrongKindOfFileIsNamedForWhatItLooksLike) {
  // `--weights tokenizer.json` or a GGUF without its extension: say what the file is, not only that
  // its "header length" is absurd.
  const std::string json_text = R"({"version": "1.0", "model": {"type": "BPE"}})";
  const std::string text_msg = error_of([&] {
    SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(json_text.data()), json_text.size());
  });
  EXPECT_NE(text_msg.find("not a safetensors file: it starts with the text '{\"versio'"), std::string::npos)
      << text_msg;
  std::vector<uint8_t> gguf = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const std::string gguf_msg = error_of([&] { SafetensorsFile::from_memory(gguf.data(), gguf.size()); });
  EXPECT_NE(gguf_msg.find("this is a GGUF file"), std::string::npos) << gguf_msg;
}

TEST(SafetensorsMalformed, EveryTruncationAndByteFlipOfAValidFileIsHandled) {
  // A small exhaustive fuzz: every prefix must be refused; every single-byte change must be refused or
  // parsed, never crash or throw anything but loom::Error.
  const std::vector<uint8_t> good = read_bytes(kCorpus / "valid" / "reference_loom_dtypes.safetensors");
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_THROW(parse_safetensors_header(good.data(), n), loom::Error) << "prefix of " << n << " bytes";
  }
  const uint64_t header = 8 + parse_safetensors_header(good.data(), good.size()).header_bytes;
  std::vector<uint8_t> mutated = good;
  for (size_t i = 0; i < header; ++i) {
    for (uint8_t v : {uint8_t{0}, uint8_t{'0'}, uint8_t{'9'}, uint8_t{'"'}, uint8_t{'}'}, uint8_t{0xff}}) {
      mutated[i] = v;
      try {
        parse_safetensors_header(mutated.data(), mutated.size());
      } catch (const loom::Error&) {
      }
      mutated[i] = good[i];
    }
  }
}

TEST(SafetensorsMalformed, TensorsLoomCannotRepresentGiveClearErrors) {
  auto bools = SafetensorsFile::open((kCorpus / "valid" / "bool_not_0_or_1.safetensors").string());
  EXPECT_NE(error_of([&] { bools.tensor("m"); }).find("is BOOL but element 1 is byte 2, not 0 or 1"),
            std::string::npos);
  auto nine = SafetensorsFile::open((kCorpus / "valid" / "nine_dims.safetensors").string());
  EXPECT_NE(error_of([&] { nine.tensor("t"); }).find("with 9 dimensions; loom tensors have at most 8"),
            std::string::npos);
  auto ref = SafetensorsFile::open((kCorpus / "valid" / "reference_numpy.safetensors").string());
  EXPECT_NE(error_of([&] { ref.tensor("half"); }).find("has dtype F16, which loom tensors do not have"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ref.tensor("nope"); }).find("no tensor named 'nope'"), std::string::npos);
}

// ---- files the reference library wrote ------------------------------------------------------------

TEST(SafetensorsReference, FilesWrittenByTheReferenceLoadWithIdenticalValues) {
  const nlohmann::json files = read_json(kFixtures / "reference_values.json")["files"];
  ASSERT_GE(files.size(), 4u);
  for (const auto& [fname, want] : files.items()) {
    SCOPED_TRACE(fname);
    const SafetensorsFile file = SafetensorsFile::open((kCorpus / "valid" / fname).string());
    if (want["metadata"].is_null()) {
      EXPECT_FALSE(file.header().has_metadata);
      EXPECT_TRUE(file.metadata().empty());
    } else {
      using Meta = std::map<std::string, std::string>;
      EXPECT_EQ(file.metadata(), want["metadata"].get<Meta>());
    }
    ASSERT_EQ(file.size(), want["tensors"].size());
    for (const auto& [name, t] : want["tensors"].items()) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(file.contains(name));
      const auto& info = file.info(name);
      EXPECT_EQ(safetensors_dtype_name(info.dtype), t["dtype"].get<std::string>());
      EXPECT_EQ(info.shape, t["shape"].get<std::vector<uint64_t>>());
      const std::span<const uint8_t> raw = file.bytes(name);
      if (t.contains("values")) {  // a loom dtype: compare the loom tensor's values exactly
        const Tensor tensor = file.tensor(name);
        EXPECT_EQ(tensor.shape(), Shape(t["shape"].get<std::vector<int64_t>>()));
        EXPECT_EQ(values_as_float(tensor), t["values"].get<std::vector<float>>());
      } else if (info.dtype == SafetensorsDtype::F32) {  // special floats: compare bits (NaN != NaN)
        const Tensor tensor = file.tensor(name);
        std::vector<uint32_t> bits(static_cast<size_t>(tensor.numel()));
        std::memcpy(bits.data(), tensor.raw_data(), tensor.nbytes());
        EXPECT_EQ(bits, t["bits"].get<std::vector<uint32_t>>());
      } else {  // dtypes loom only inspects: compare the raw bytes
        EXPECT_EQ(bytes_as<uint8_t>(raw), t["bits"].get<std::vector<uint8_t>>());
      }
    }
  }
}

// Builds loom tensors holding the values the reference wrote into reference_loom_dtypes.safetensors.
NamedTensors reference_loom_tensors() {
  const nlohmann::json tensors =
      read_json(kFixtures / "reference_values.json")["files"]["reference_loom_dtypes.safetensors"]["tensors"];
  NamedTensors out;
  for (const auto& [name, t] : tensors.items()) {
    const Shape shape(t["shape"].get<std::vector<int64_t>>());
    const std::vector<double> v = t["values"].get<std::vector<double>>();
    const std::string dtype = t["dtype"];
    Tensor x;
    if (dtype == "F32") {
      x = Tensor::from_vector<float>(shape, std::vector<float>(v.begin(), v.end()));
    } else if (dtype == "BF16") {
      std::vector<loom::bf16> b;
      for (double d : v) b.push_back(loom::bf16::from_float(static_cast<float>(d)));
      x = Tensor::from_vector<loom::bf16>(shape, b);
    } else if (dtype == "I32") {
      x = Tensor::from_vector<int32_t>(shape, std::vector<int32_t>(v.begin(), v.end()));
    } else if (dtype == "U16") {
      x = Tensor::from_vector<uint16_t>(shape, std::vector<uint16_t>(v.begin(), v.end()));
    } else if (dtype == "BOOL") {
      std::vector<bool> b(v.begin(), v.end());
      x = Tensor::empty(shape, DType::Bool);
      for (size_t i = 0; i < b.size(); ++i) x.data<bool>()[i] = b[i];
    }
    out.emplace_back(name, x);
  }
  return out;
}

TEST(SafetensorsReference, WriterReproducesTheReferenceFileByteForByte) {
  TempDir dir;
  // Given in the fixture's (name) order: the writer must find the reference's layout on its own.
  write_safetensors(dir / "out.safetensors", reference_loom_tensors());
  EXPECT_EQ(read_bytes(dir / "out.safetensors"),
            read_bytes(kCorpus / "valid" / "reference_loom_dtypes.safetensors"));
}

TEST(SafetensorsReference, MisalignedTensorsAreCopiedAlignedOnesAreMapped) {
  const auto unaligned = SafetensorsFile::open((kCorpus / "valid" / "unaligned.safetensors").string());
  const Tensor x = unaligned.tensor("x");
  EXPECT_NE(x.raw_data(), static_cast<const void*>(unaligned.bytes("x").data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw_data()) % 4, 0u);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1.0f, 2.0f, -3.5f}));
  EXPECT_EQ(unaligned.names(), (std::vector<std::string>{"pad", "x"}));  // file order, not header order

  const auto aligned = SafetensorsFile::open((kCorpus / "valid" / "reference_loom_dtypes.safetensors").string());
  for (const auto& name : aligned.names()) {
    EXPECT_EQ(aligned.tensor(name).raw_data(), static_cast<const void*>(aligned.bytes(name).data())) << name;
  }
}

// ---- round trips and the writer -------------------------------------------------------------------

TEST(SafetensorsWriter, RoundTripIsBitwiseIdentical) {
  TempDir dir;
  std::mt19937 rng(1234);
  auto random_tensor = [&](const Shape& shape, DType dtype) {
    Tensor t = Tensor::empty(shape, dtype);
    auto* p = static_cast<uint8_t*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
    if (dtype == DType::Bool) {
      for (size_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;
    }
    return t;  // random bits: NaNs and denormals included for the float types
  };
  NamedTensors tensors = {
      {"layers.0.attn.q_proj.weight", random_tensor({8, 16}, DType::F32)},
      {"layers.0.mlp.w1", random_tensor({3, 5, 7}, DType::BF16)},
      {"tokens", random_tensor({33}, DType::I32)},
      {"ids", random_tensor({9}, DType::U16)},
      {"mask", random_tensor({5, 5}, DType::Bool)},
      {"scalar", random_tensor({}, DType::F32)},
      {"empty", random_tensor({0, 4}, DType::BF16)},
      {"odd.bf16", random_tensor({3}, DType::BF16)},  // 6 bytes: the next tensor's alignment relies on order
      {"名前 \"quoted\"", random_tensor({2}, DType::F32)},
  };
  const std::map<std::string, std::string> meta = {{"step", "100"}, {"note", "café ✓ \"q\" \n"}};
  const std::string path = dir / "model.safetensors";
  write_safetensors(path, tensors, meta);

  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, std::string> want_meta = meta;
  want_meta["format"] = "pt";
  EXPECT_EQ(file.metadata(), want_meta);
  EXPECT_EQ(file.header().header_bytes % 8, 0u);
  ASSERT_EQ(file.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const Tensor back = file.tensor(name);
    EXPECT_EQ(back.dtype(), t.dtype());
    EXPECT_EQ(back.shape(), t.shape());
    ASSERT_EQ(back.nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()), 0);
    EXPECT_EQ(back.raw_data(), static_cast<const void*>(file.bytes(name).data())) << "zero-copy";
  }
  // Deterministic: the same tensors given in another order give the same bytes.
  NamedTensors reversed(tensors.rbegin(), tensors.rend());
  write_safetensors(dir / "again.safetensors", reversed, meta);
  EXPECT_EQ(read_bytes(path), read_bytes(dir / "again.safetensors"));
}

TEST(SafetensorsWriter, MappedTensorsAreCopyOnWriteAndOutliveTheFileObject) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  write_safetensors(path, std::map<std::string, Tensor>{
                              {"w", Tensor::from_vector<float>({4}, {1.0f, 2.0f, 3.0f, 4.0f})}});
  Tensor w;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    w = file.tensor("w");
  }  // the tensor keeps the mapping alive
  w.fill_(7.0f);  // an optimizer updating a loaded parameter in place
  EXPECT_EQ(w.to_vector<float>(), std::vector<float>(4, 7.0f));
  EXPECT_EQ(load_safetensors(path).at("w").to_vector<float>(), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));

  // Overwriting the file (by rename) leaves the old mapping intact.
  const SafetensorsFile old = SafetensorsFile::open(path);
  const Tensor old_w = old.tensor("w");
  write_safetensors(path, NamedTensors{{"w", Tensor::from_vector<float>({1}, {9.0f})}});
  EXPECT_EQ(old_w.to_vector<float>(), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  EXPECT_EQ(load_safetensors(path).at("w").to_vector<float>(), std::vector<float>{9.0f});
}

TEST(SafetensorsWriter, KeepsAFormatTheCallerSetsAndWritesRawEntries) {
  TempDir dir;
  const std::vector<int64_t> step = {42, -7};
  const std::vector<SafetensorsEntry> entries = {
      {"step", SafetensorsDtype::I64, {2}, step.data(), 16}, {"none", SafetensorsDtype::F16, {0}, nullptr, 0}};
  write_safetensors(dir / "raw.safetensors", entries, {{"format", "mlx"}});
  const SafetensorsFile file = SafetensorsFile::open(dir / "raw.safetensors");
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "mlx"}}));
  EXPECT_EQ(bytes_as<int64_t>(file.bytes("step")), step);
  EXPECT_EQ(file.info("none").nbytes(), 0u);
}

TEST(SafetensorsWriter, RefusesWhatCannotBeWritten) {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  const Tensor t = Tensor::zeros({2});
  EXPECT_NE(error_of([&] { write_safetensors(path, NamedTensors{{"a", t}, {"a", t}}); })
                .find("two tensors are named 'a'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(path, NamedTensors{{"__metadata__", t}}); })
                .find("cannot be named __metadata__"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(path, NamedTensors{{"bad\xff", t}}); }).find("not valid UTF-8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(path, NamedTensors{{"u", Tensor()}}); }).find("is undefined"),
            std::string::npos);
  const float data[3] = {};
  EXPECT_NE(error_of([&] {
              write_safetensors(path, std::vector<SafetensorsEntry>{{"x", SafetensorsDtype::F32, {2}, data, 12}});
            }).find("has 12 bytes, but shape [2] of F32 needs 8"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path)) << "a refused write creates nothing";
  EXPECT_TRUE(fs::is_empty(dir.path)) << "and leaves no temporary file";
}

TEST(AtomicWrite, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir / "f.bin";
  write_file_atomically(path, [](FileWriter& w) { w.write("old", 3); });
  EXPECT_THROW(write_file_atomically(path,
                                     [](FileWriter& w) {
                                       w.write("new data", 8);
                                       throw loom::IoError("simulated failure mid-write");
                                     }),
               loom::IoError);
  EXPECT_EQ(read_bytes(path), (std::vector<uint8_t>{'o', 'l', 'd'}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
  EXPECT_THROW(write_file_atomically(dir / "missing/f.bin", [](FileWriter&) {}), loom::IoError);
  EXPECT_THROW(MappedFile::open(dir / "nope"), loom::IoError);
}

}  // namespace
