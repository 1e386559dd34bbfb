// Helpers shared by the tokenizer tests: fixtures, temp dirs, running the CLI in a subprocess.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/formats.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/train.h"

namespace loom::tokenizer::testing {

inline std::string fixture(const std::string& name) { return std::string(LOOM_TEST_DIR) + "/" + name; }

// Where tools/setup.sh installs GPT-2's vocabulary (LOOM_GPT2_DIR overrides).
inline std::string gpt2_dir() {
  if (const char* env = std::getenv("LOOM_GPT2_DIR")) return env;
  return std::string(LOOM_SOURCE_DIR) + "/data/gpt2";
}

inline bool have_gpt2() { return std::filesystem::exists(gpt2_dir() + "/vocab.json"); }

#define LOOM_REQUIRE_GPT2()                                                                              \
  if (!::loom::tokenizer::testing::have_gpt2())                                                          \
  GTEST_SKIP() << "GPT-2 vocabulary not found in " << ::loom::tokenizer::testing::gpt2_dir()             \
               << " (tools/setup.sh installs it: python3 tools/fetch_gpt2_vocab.py data/gpt2)"

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loom_tok_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RunResult {
  int exit_code = -1;
  std::string out, err;
  long max_rss_kb = 0;  // the child's peak resident memory
};

// Runs the loom CLI with `args`, stdin from `stdin_path` (or /dev/null), stdout to `stdout_path` (or a
// temp file that is read back).
inline RunResult run_cli(const std::vector<std::string>& args, const std::string& stdin_path = "",
                         const std::string& stdout_path = "") {
  TempDir tmp;
  const std::string out_path = stdout_path.empty() ? tmp / "stdout" : stdout_path;
  const std::string err_path = tmp / "stderr";
  std::vector<std::string> argv_s{LOOM_CLI};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int in = open(stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  RunResult r;
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss_kb = usage.ru_maxrss;
  if (stdout_path.empty()) r.out = read_text(out_path);
  r.err = read_text(err_path);
  return r;
}

inline std::vector<TokenId> parse_ids(const std::string& s) {
  std::vector<TokenId> ids;
  std::istringstream in(s);
  uint64_t v;
  while (in >> v) ids.push_back(static_cast<TokenId>(v));
  return ids;
}

// Varied text: English words, punctuation, digits, accents, CJK, emoji, odd whitespace.
inline std::string random_text(size_t bytes, uint32_t seed) {
  static const std::vector<std::string> words = {
      "the", "of", "and", "to", "in", "tokenizer", "Pride", "Prejudice", "don't", "I'll", "it's", "42", "3.14",
      "1999", "caf\u00e9", "na\u00efve", "\u00fcber", "\u65e5\u672c\u8a9e", "\U0001F600", "\u0440\u0443\u0441",
      "!!!", "?", ",", ".", ";", "(x)", "#", "a_b", "CamelCase", "e\u0301", "\u00a0", "\u3000"};
  static const std::vector<std::string> gaps = {" ", " ", " ", " ", "  ", "\n", "\n\n", "\t", "   \n", ""};
  std::mt19937 rng(seed);
  std::string out;
  out.reserve(bytes + 64);
  while (out.size() < bytes) {
    out += words[rng() % words.size()];
    out += gaps[rng() % gaps.size()];
  }
  return out;
}

// A small tokenizer trained on random_text, with <|endoftext|>.
inline Tokenizer small_tokenizer(size_t vocab_size = 600) {
  TrainOptions o;
  o.vocab_size = vocab_size;
  o.special_tokens = {"<|endoftext|>"};
  o.threads = 1;
  return train_bpe_on_text(random_text(200000, 7), o);
}

}  // namespace loom::tokenizer::testing
