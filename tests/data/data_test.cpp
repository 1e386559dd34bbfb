// Token files and batch sampling: CS336 get_batch semantics, uniform starts, determinism, resume.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/batch.h"
#include "data/token_file.h"
#include "support/errors.h"

namespace fs = std::filesystem;
using loom::RngKey;
using loom::test::error_of;
using loom::data::BatchLoader;
using loom::data::Sampling;
using loom::data::TokenDType;
using loom::data::TokenFile;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("loom_trainkit_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

template <typename T>
void write_tokens(const fs::path& p, const std::vector<T>& v) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// A file whose token i is i % 60000 (uint16), so every window's content identifies its start.
struct DataDir {
  fs::path dir = temp_dir("data");
  fs::path bin = dir / "train.bin";
  int64_t n;
  explicit DataDir(int64_t n_tokens) : n(n_tokens) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 60000);
    write_tokens(bin, v);
    write_text(dir / "meta.json", R"({"dtype": "uint16", "vocab_size": 60000, "eot_id": 0})");
  }
  ~DataDir() { fs::remove_all(dir); }
};

}  // namespace

TEST(TokenFile, ReadsUint16AndUint32WithDtypeFromMetaOrArgument) {
  fs::path dir = temp_dir("tokfile");
  write_tokens<uint32_t>(dir / "a.bin", {1, 70000, 3});
  write_text(dir / "meta.json", R"({"dtype": "uint32", "vocab_size": 80000})");
  TokenFile f = TokenFile::open((dir / "a.bin").string());
  EXPECT_EQ(f.dtype(), TokenDType::U32);
  ASSERT_EQ(f.size(), 3);
  EXPECT_EQ(f[1], 70000u);
  EXPECT_EQ(f.max_token(), 70000u);
  // The same 12 bytes read as uint16 (explicit dtype overrides meta.json): little-endian halves.
  TokenFile g = TokenFile::open((dir / "a.bin").string(), TokenDType::U16);
  ASSERT_EQ(g.size(), 6);
  EXPECT_EQ(g[0], 1u);
  EXPECT_EQ(g[2], 70000u & 0xffffu);
  EXPECT_EQ(g[3], 70000u >> 16);
  std::vector<int32_t> out(2);
  f.copy_to(1, 2, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{70000, 3}));
  EXPECT_THROW(f.copy_to(2, 2, out.data()), loom::Error);
  fs::remove_all(dir);
}

TEST(TokenFile, ErrorsNameTheProblem) {
  fs::path dir = temp_dir("tokerr");
  write_tokens<uint8_t>(dir / "odd.bin", {1, 2, 3});
  write_tokens<uint8_t>(dir / "empty.bin", {});
  write_tokens<uint8_t>(dir / "six.bin", {1, 2, 3, 4, 5, 6});
  std::string odd = error_of([&] { TokenFile::open((dir / "odd.bin").string(), TokenDType::U16); });
  EXPECT_NE(odd.find("3 bytes"), std::string::npos) << odd;
  EXPECT_NE(odd.find("uint16"), std::string::npos) << odd;
  std::string six = error_of([&] { TokenFile::open((dir / "six.bin").string(), TokenDType::U32); });
  EXPECT_NE(six.find("not a multiple of 4"), std::string::npos) << six;
  std::string empty = error_of([&] { TokenFile::open((dir / "empty.bin").string(), TokenDType::U16); });
  EXPECT_NE(empty.find("empty"), std::string::npos) << empty;
  EXPECT_THROW(TokenFile::open((dir / "missing.bin").string(), TokenDType::U16), loom::IoError);
  // No dtype and no meta.json.
  std::string nometa = error_of([&] { TokenFile::open((dir / "six.bin").string()); });
  EXPECT_NE(nometa.find("meta.json"), std::string::npos) << nometa;
  write_text(dir / "meta.json", R"({"dtype": "int8"})");
  std::string baddtype = error_of([&] { TokenFile::open((dir / "six.bin").string()); });
  EXPECT_NE(baddtype.find("int8"), std::string::npos) << baddtype;
  write_text(dir / "meta.json", R"({"dtype": "uint16", "vocab_size": "big"})");
  std::string badvocab = error_of([&] { loom::data::read_token_meta((dir / "meta.json").string()); });
  EXPECT_NE(badvocab.find("vocab_size"), std::string::npos) << badvocab;
  fs::remove_all(dir);
}

TEST(Batch, UniformBelowHasNoBiasAtAnAwkwardRange) {
  // range = 3 * 2^62: plain modulo of 64 bits would give 0 .. 2^62 twice as often as the rest.
  RngKey key = RngKey::from_seed(5);
  const uint64_t range = 3ull << 62;
  int low = 0;
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) low += loom::data::uniform_below(key, static_cast<uint64_t>(i), range) < (1ull << 62);
  // Unbiased: P(low) = 1/3 (sd ~ 0.0027); biased modulo would give 1/2.
  EXPECT_NEAR(static_cast<double>(low) / draws, 1.0 / 3.0, 0.015);
  EXPECT_EQ(loom::data::uniform_below(key, 0, 1), 0u);
}

TEST(Batch, RandomStartsAreUniformOverTheWholeRange) {
  // n = 20, T = 4: starts 0..15 (n-T = 16 values). 32000 draws, chi-square with 15 degrees of freedom.
  const int64_t n = 20, T = 4, B = 8;
  std::vector<int64_t> counts(n - T, 0);
  RngKey key = RngKey::from_seed(1234);
  int64_t draws = 0;
  for (uint64_t step = 0; step < 4000; ++step) {
    for (int64_t s : loom::data::random_starts(key.fold_in(step), n, B, T)) {
      ASSERT_GE(s, 0);
      ASSERT_LE(s, n - T - 1);
      counts[static_cast<size_t>(s)]++;
      ++draws;
    }
  }
  EXPECT_GT(counts.front(), 0);  // both ends occur
  EXPECT_GT(counts.back(), 0);
  double expected = static_cast<double>(draws) / static_cast<double>(counts.size());
  double chi2 = 0;
  for (int64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
  // 99.9th percentile of chi-square(15) is 37.7.
  EXPECT_LT(chi2, 37.7) << "chi-square " << chi2;
}

TEST(Batch, RandomStartsOverALargeFileHaveUniformMoments) {
  const int64_t n = 1'000'003, T = 256;
  const double hi = static_cast<double>(n - T - 1);
  RngKey key = RngKey::from_seed(7);
  double sum = 0, sum2 = 0;
  int64_t mn = n, mx = -1, count = 0;
  for (uint64_t step = 0; step < 2000; ++step) {
    for (int64_t s : loom::data::random_starts(key.fold_in(step), n, 16, T)) {
      sum += static_cast<double>(s);
      sum2 += static_cast<double>(s) * static_cast<double>(s);
      mn = std::min(mn, s);
      mx = std::max(mx, s);
      ++count;
    }
  }
  double mean = sum / count, var = sum2 / count - mean * mean;
  EXPECT_NEAR(mean / hi, 0.5, 0.01);             // uniform mean hi/2, sd of mean/hi ~ 0.0016
  EXPECT_NEAR(var / (hi * hi), 1.0 / 12, 0.004);  // uniform variance hi^2/12
  EXPECT_LT(mn, n / 1000);                        // reaches both ends of the range
  EXPECT_GT(mx, n - T - 1 - n / 1000);
  EXPECT_LE(mx, n - T - 1);
}

TEST(Batch, TargetsAreInputsShiftedByOneAndWindowsMatchTheFile) {
  DataDir data(5000);
  TokenFile f = TokenFile::open(data.bin.string());
  auto starts = loom::data::random_starts(RngKey::from_seed(3), f.size(), 4, 32);
  loom::data::Batch b = loom::data::gather_batch(f, starts, 32);
  EXPECT_EQ(b.inputs.shape(), (loom::Shape{4, 32}));
  EXPECT_EQ(b.targets.shape(), (loom::Shape{4, 32}));
  EXPECT_EQ(b.inputs.dtype(), loom::DType::I32);
  auto x = b.inputs.to_vector<int32_t>(), y = b.targets.to_vector<int32_t>();
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t t = 0; t < 32; ++t) {
      EXPECT_EQ(x[static_cast<size_t>(r * 32 + t)], starts[static_cast<size_t>(r)] + t);  // token i == i
      EXPECT_EQ(y[static_cast<size_t>(r * 32 + t)], starts[static_cast<size_t>(r)] + t + 1);
    }
  }
}

TEST(Batch, SameSeedAndStepGiveTheSameBatch) {
  DataDir data(10000);
  auto make = [&](uint64_t seed) {
    return BatchLoader(TokenFile::open(data.bin.string()), 8, 64, Sampling::Random, RngKey::from_seed(seed));
  };
  BatchLoader a = make(1), b = make(1), c = make(2);
  for (int i = 0; i < 5; ++i) {
    auto sa = a.next_starts(), sb = b.next_starts(), sc = c.next_starts();
    EXPECT_EQ(sa, sb);
    EXPECT_NE(sa, sc);
  }
  // get_batch with the loader's per-batch key reproduces batch k directly.
  BatchLoader d = make(1);
  d.next();
  loom::data::Batch third = d.next();
  loom::data::Batch direct = loom::data::get_batch(d.tokens(), 8, 64, RngKey::from_seed(1).fold_in(1));
  EXPECT_EQ(third.inputs.to_vector<int32_t>(), direct.inputs.to_vector<int32_t>());
}

TEST(Batch, StateSavesAndRestoresExactly) {
  DataDir data(10000);
  for (Sampling mode : {Sampling::Random, Sampling::Sequential}) {
    BatchLoader a(TokenFile::open(data.bin.string()), 4, 100, mode, RngKey::from_seed(9));
    for (int i = 0; i < 7; ++i) a.next();
    nlohmann::json saved = a.state();
    std::vector<std::vector<int64_t>> expected;
    for (int i = 0; i < 5; ++i) expected.push_back(a.next_starts());

    BatchLoader b(TokenFile::open(data.bin.string()), 4, 100, mode, RngKey::from_seed(9));
    b.restore(saved.get<loom::data::LoaderState>());
    EXPECT_EQ(b.state().batches, 7u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b.next_starts(), expected[static_cast<size_t>(i)]) << sampling_name(mode);
  }
}

TEST(Batch, SequentialWalksNonOverlappingWindowsAndWraps) {
  DataDir data(1001);  // (1001-1)/100 = 10 windows of T=100
  BatchLoader loader(TokenFile::open(data.bin.string()), 4, 100, Sampling::Sequential, RngKey::from_seed(0));
  EXPECT_EQ(loader.num_windows(), 10);
  EXPECT_EQ(loader.next_starts(), (std::vector<int64_t>{0, 100, 200, 300}));
  EXPECT_EQ(loader.next_starts(), (std::vector<int64_t>{400, 500, 600, 700}));
  EXPECT_EQ(loader.next_starts(), (std::vector<int64_t>{800, 900, 0, 100}));  // the last window ends at token 1000
  EXPECT_EQ(loader.state().position, 2);
  loom::data::Batch b = loader.next();
  EXPECT_EQ(b.targets.to_vector<int32_t>()[0], 201);
  EXPECT_THROW(loader.restore({0, 10}), loom::Error);
}

TEST(Batch, FixedBatchesDoNotMoveTheLoader) {
  DataDir data(10000);
  BatchLoader loader(TokenFile::open(data.bin.string()), 2, 16, Sampling::Random, RngKey::from_seed(4));
  auto fixed = loader.fixed_batches(3);
  ASSERT_EQ(fixed.size(), 3u);
  EXPECT_EQ(loader.state().batches, 0u);
  auto again = loader.fixed_batches(3);
  EXPECT_EQ(fixed[2].inputs.to_vector<int32_t>(), again[2].inputs.to_vector<int32_t>());
  EXPECT_EQ(fixed[0].inputs.to_vector<int32_t>(), loader.next().inputs.to_vector<int32_t>());
}

TEST(Batch, BatchLargerThanTheDataIsRejectedNamingTheValues) {
  DataDir data(100);
  std::string e = error_of([&] {
    BatchLoader(TokenFile::open(data.bin.string()), 4, 32, Sampling::Random, RngKey::from_seed(0));
  });
  EXPECT_NE(e.find("batch_size=4"), std::string::npos) << e;
  EXPECT_NE(e.find("context_length=32"), std::string::npos) << e;
  EXPECT_NE(e.find("129"), std::string::npos) << e;  // tokens needed
  EXPECT_NE(e.find("holds 100"), std::string::npos) << e;
  // Exactly B*T + 1 tokens is enough: the one random start is 0 .. n-T-1.
  BatchLoader ok(TokenFile::open(data.bin.string()), 3, 33, Sampling::Random, RngKey::from_seed(0));
  EXPECT_NO_THROW(ok.next());
  EXPECT_THROW(loom::data::sampling_from_name("shuffled"), loom::Error);
}
