// Running the built `loom` binary from a test (LOOM_CLI, set per test area by tests/CMakeLists.txt).
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace loom::test {

struct CliRun {
  int status = -1;      // exit status, or -1 when killed by a signal
  std::string output;   // stdout, and stderr too unless dropped
  double seconds = 0;   // wall time of the command
};

// `loom ARGS` through the shell (args are shell words; quote what needs it).
inline CliRun run_cli(const std::string& args, bool with_stderr = true) {
  const std::string cmd = std::string(LOOM_CLI) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << cmd;
  CliRun r;
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace loom::test
