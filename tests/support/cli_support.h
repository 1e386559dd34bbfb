// Helpers for the CLI tests of the checks made before work starts (a tokenizer's provenance in tests/data,
// memory budgets in tests/runs, config files in tests/train): the built `loom` (LOOM_CLI) run as a child
// with its exit status, output, wall time and peak RSS (from wait4), a temp folder per test (files.h), and
// small text corpora to train tokenizers on.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/files.h"

namespace loom::test {

struct CliResult {
  int status = -1;        // exit code; -1 when killed by a signal
  int signal = 0;
  std::string output;     // stdout and stderr together
  double seconds = 0;
  long max_rss_kib = 0;   // the child's peak resident set (at least this process's: Linux keeps the
                          // peak of the forked copy across exec)
};

// Runs LOOM_CLI with `args` in `cwd` (empty: this process's), measuring it.
inline CliResult run_loom(const std::vector<std::string>& args, const std::filesystem::path& cwd = {}) {
  const std::filesystem::path out_path =
      std::filesystem::temp_directory_path() / ("loom_checks_out_" + std::to_string(::getpid()));
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    // A runaway child (the failure these tests guard against) fails its test quickly instead of taking
    // the machine's memory or minutes of CPU.
    const struct rlimit address_space {8ull << 30, 8ull << 30}, cpu {20, 20};
    ::setrlimit(RLIMIT_AS, &address_space);
    ::setrlimit(RLIMIT_CPU, &cpu);
    std::vector<char*> argv;
    std::string cli = LOOM_CLI;
    argv.push_back(cli.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(cli.c_str(), argv.data());
    ::_exit(127);
  }
  CliResult r;
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.max_rss_kib = usage.ru_maxrss;
  if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  std::filesystem::remove(out_path);
  return r;
}

// Deterministic English-like text of `words` words drawn from a vocabulary that depends on `seed`, so
// tokenizers trained on two seeds learn different merges.
inline void write_text(const std::filesystem::path& path, int words, unsigned seed) {
  static const char* const syllables[] = {"ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da",
                                          "the", "and", "ing", "ion", "er", "ou", "st", "th", "an", "es"};
  std::ofstream out(path);
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (int i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const int parts = 1 + static_cast<int>(x % 3);
    for (int p = 0; p < parts; ++p) out << syllables[(x >> (8 + 5 * p)) % (10 + 10 * (seed % 2))];
    out << ((i % 12 == 11) ? ".\n" : " ");
  }
}

}  // namespace loom::test
