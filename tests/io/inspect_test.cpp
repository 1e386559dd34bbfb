// `loom inspect`: runs the CLI on a good and a bad file.
#include <gtest/gtest.h>

#include <string>

#include "support/cli.h"

namespace {

using loom::test::CliRun;
CliRun run(const std::string& args) { return loom::test::run_cli(args); }

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
  EXPECT_NE(missing.output.find("no such file"), std::string::npos) << missing.output;
}

}  // namespace
