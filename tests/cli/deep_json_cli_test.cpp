// Every CLI command that reads JSON, given JSON nested ~70,000 deep: each used to die of a stack overflow
// (exit status 139) while writing its error message. Now each exits 1 with a message naming the limit,
// in well under a second.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/cli.h"

namespace fs = std::filesystem;

namespace {

using loom::test::CliRun;
CliRun run(const std::string& args) { return loom::test::run_cli(args); }

const std::string kDeep = std::string(70000, '[') + std::string(70000, ']');

std::string safetensors_bytes(std::string header) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header;
}

class DeepJsonCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_deep_json_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }

  void expect_refused(const std::string& args) {
    const CliRun r = run(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find("more than 64 levels deep"), std::string::npos) << args << "\n"
                                                                            << r.output.substr(0, 2000);
    EXPECT_LT(r.output.size(), 2000u) << args;
    EXPECT_LT(r.seconds, 1.0) << args;
  }

  fs::path dir_;
};

}  // namespace

TEST_F(DeepJsonCli, TrainConfig) {
  expect_refused("train --config " + write("deep.json", "{\"model\": " + kDeep + "}") + " --out " +
                 (dir_ / "run").string());
  expect_refused("train --config " + write("deep_top.json", kDeep) + " --out " + (dir_ / "run").string());
}

TEST_F(DeepJsonCli, InspectAndGenerateASafetensorsHeader) {
  const std::string entry = "{\"a\":{\"dtype\":\"U8\",\"shape\":" + kDeep + ",\"data_offsets\":[0,0]}}";
  const std::string shape = write("deep.safetensors", safetensors_bytes(entry));
  const std::string meta =
      write("deep_meta.safetensors", safetensors_bytes("{\"__metadata__\":{\"x\":" + kDeep + "}}"));
  expect_refused("inspect " + shape);
  expect_refused("inspect " + meta);
  expect_refused("generate --weights " + shape + " --prompt hi");
}

TEST_F(DeepJsonCli, GenerateWithAModelConfigInTheMetadata) {
  // The header is fine; the JSON inside the metadata string loom.model_config is not.
  const std::string weights = write(
      "model.safetensors",
      safetensors_bytes("{\"__metadata__\":{\"loom.model_config\":\"{\\\"d_model\\\": " + kDeep + "}\"}}"));
  expect_refused("generate --weights " + weights + " --prompt hi");
}

TEST_F(DeepJsonCli, TokenizerFiles) {
  const std::string text = write("text.txt", "hello world");
  expect_refused("tokenizer encode --tokenizer " +
                 write("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"added_tokens\":"
                                         "[{\"id\":" + kDeep + "}]}") +
                 " --input " + text);
  fs::create_directories(dir_ / "gpt2");
  write("gpt2/vocab.json", "{\"a\":" + kDeep + "}");
  write("gpt2/merges.txt", "#version: 0.2\n");
  expect_refused("tokenizer encode --tokenizer " + (dir_ / "gpt2").string() + " --input " + text);
}
