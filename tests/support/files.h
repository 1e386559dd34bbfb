// Files in tests: a fresh temp folder per test, fixtures read whole (JSON, raw bytes, text), and small
// files written whole.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::test {

// A fresh folder under the system temp dir, removed afterwards. Its name carries `name`, this process's
// id and a counter, so tests running side by side (ctest -j, several in one process) never share one.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name = "test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("loom_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of `name` inside the folder, as the string the APIs under test take.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `text` to `p`, creating its folder first.
inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace loom::test
