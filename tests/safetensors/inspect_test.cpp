// `loom inspect`: runs the CLI on a good and a bad file.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct CliRun {
  int status;
  std::string output;  // stdout and stderr
};

CliRun run(const std::string& args) {
  const std::string cmd = std::string(LOOM_CLI) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  CliRun r{-1, ""};
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kCorpus = std::string(LOOM_TEST_DIR) + "/corpus";

TEST(InspectCli, ListsTensorsAndMetadata) {
  const CliRun r = run("inspect " + kCorpus + "/valid/reference_numpy.safetensors");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("7 tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: café ✓"), std::string::npos) << r.output;
  // name, dtype, shape, bytes on one line
  EXPECT_NE(r.output.find("model.embed_tokens.weight  F32    [3, 4]  48"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step                       I64    [1]     8"), std::string::npos) << r.output;

  const CliRun u = run("inspect " + kCorpus + "/valid/unaligned.safetensors");
  EXPECT_EQ(u.status, 0) << u.output;
  EXPECT_NE(u.output.find("metadata:\n  empty: \n  format: pt\n  z: 1\n"), std::string::npos) << u.output;
}

TEST(InspectCli, MalformedFileExitsNonZeroNamingTheProblem) {
  const CliRun r = run("inspect " + kCorpus + "/malformed/gap.safetensors");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gap in the data section: data bytes [16, 20)"), std::string::npos) << r.output;

  const CliRun dup = run("inspect " + kCorpus + "/malformed/duplicate_tensor_name.safetensors");
  EXPECT_EQ(dup.status, 1) << dup.output;
  EXPECT_NE(dup.output.find("duplicate tensor name 'a'"), std::string::npos) << dup.output;

  const CliRun missing = run("inspect " + kCorpus + "/does_not_exist.safetensors");
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find("No such file"), std::string::npos) << missing.output;
}

}  // namespace
