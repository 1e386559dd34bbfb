// A small token corpus a model can learn, for training-loop tests: token t+1 = (3t + 1) mod 61 with 10%
// noise, written as uint16 train.bin / val.bin with a meta.json (vocabulary 64) in a fresh temp folder
// that is removed afterwards.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/rng.h"

namespace loom::test {

inline void write_synthetic_tokens(const std::filesystem::path& path, int64_t n, uint64_t seed) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  uint16_t t = 0;
  RngKey key = RngKey::from_seed(seed);
  for (int64_t i = 0; i < n; ++i) {
    t = (random_uniform(key, static_cast<uint64_t>(i)) < 0.1f)
            ? static_cast<uint16_t>(random_bits(key, 1u << 30 | static_cast<uint64_t>(i)) % 61)
            : static_cast<uint16_t>((t * 3 + 1) % 61);
    tokens[static_cast<size_t>(i)] = t;
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

// A temp folder holding train.bin (20000 tokens), val.bin (4000) and meta.json.
struct SyntheticCorpusDir {
  std::filesystem::path dir;
  explicit SyntheticCorpusDir(const std::string& prefix) {
    static int counter = 0;
    dir = std::filesystem::temp_directory_path() /
          (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write_synthetic_tokens(dir / "train.bin", 20000, 1);
    write_synthetic_tokens(dir / "val.bin", 4000, 2);
    std::ofstream(dir / "meta.json") << R"({"dtype": "uint16", "vocab_size": 64})";
  }
  ~SyntheticCorpusDir() { std::filesystem::remove_all(dir); }
  SyntheticCorpusDir(const SyntheticCorpusDir&) = delete;
  SyntheticCorpusDir& operator=(const SyntheticCorpusDir&) = delete;
};

}  // namespace loom::test
