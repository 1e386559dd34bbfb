// `loom bench qmatmul`, `bench decode` and `bench bandwidth` on tiny sizes: they run, print their JSON
// line, honour LOOM_QUANT_KERNEL, and refuse bad values by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "support/cli.h"

using loom::test::run_cli;

namespace {
nlohmann::json last_json_line(const std::string& out) {
  const size_t start = out.rfind('{');
  EXPECT_NE(start, std::string::npos) << out;
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start));
}
}  // namespace

TEST(QuantBenchCli, QmatmulRunsAndRefusesBadValues) {
  auto r = run_cli("bench qmatmul --type Q4_1 -m 5 -n 40 -k 64 --calls 2 --threads 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = last_json_line(r.output);
  EXPECT_EQ(j["type"], "Q4_1");
  EXPECT_EQ(j["N"], 40);
  EXPECT_GT(j["weight_gb_per_s"].get<double>(), 0.0);

  r = run_cli("bench qmatmul --type Q5_0 -n 40 -k 64 --calls 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("unknown weight type 'Q5_0'"), std::string::npos) << r.output;
  r = run_cli("bench qmatmul --path sse -n 40 -k 64 --calls 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--path sse"), std::string::npos) << r.output;
}

TEST(QuantBenchCli, KernelPathCanBeForcedByEnvironment) {
  setenv("LOOM_QUANT_KERNEL", "scalar", 1);
  auto r = run_cli("bench qmatmul --type Q8_0 -n 16 -k 64 --calls 1 --threads 1", false);
  setenv("LOOM_QUANT_KERNEL", "neon", 1);
  auto bad = run_cli("bench qmatmul --type Q8_0 -n 16 -k 64 --calls 1 --threads 1");
  unsetenv("LOOM_QUANT_KERNEL");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(last_json_line(r.output)["path"], "scalar");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("LOOM_QUANT_KERNEL=neon is not a kernel path"), std::string::npos) << bad.output;
}

TEST(QuantBenchCli, DecodeAndBandwidthRun) {
  auto r = run_cli("bench decode --layers 1 --vocab 128 --prompt-tokens 3 --new-tokens 2 --repeats 1 --threads 1",
                   false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = last_json_line(r.output);
  EXPECT_GT(j["decode_tok_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["weight_bytes"].get<int64_t>(), 0);

  // The fused quantized step: one parallel region per token; op by op, one per matmul at least.
  r = run_cli("bench decode --layers 2 --vocab 128 --prompt-tokens 3 --new-tokens 2 --repeats 1 --threads 2", false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(last_json_line(r.output)["parallel_regions_per_token"].get<double>(), 1.0) << r.output;
  EXPECT_GT(last_json_line(r.output)["decode_cpu_ms_per_token"].get<double>(), 0.0) << r.output;
  r = run_cli("bench decode --layers 2 --vocab 128 --prompt-tokens 3 --new-tokens 2 --repeats 1 --threads 2 --unfused",
              false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_GE(last_json_line(r.output)["parallel_regions_per_token"].get<double>(), 15.0) << r.output;
  // A real GGUF file instead of the synthetic model.
  r = run_cli("bench decode --gguf " LOOM_SOURCE_DIR "/tests/models/llama/fixtures/tiny_llama.gguf --prompt-tokens 2 "
              "--new-tokens 2 --repeats 1 --threads 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_GT(last_json_line(r.output)["weight_bytes"].get<int64_t>(), 0) << r.output;
  r = run_cli("bench decode --gguf " LOOM_SOURCE_DIR "/tests/models/llama/fixtures/tiny_llama.gguf "
              "--prompt-tokens 2000 --new-tokens 2 --repeats 1 --threads 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("2000 + 2 tokens exceed the model's context length"), std::string::npos) << r.output;

  r = run_cli("bench decode --layers 1 --vocab 128 --weights Q2_K --new-tokens 1 --repeats 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--weights Q2_K"), std::string::npos) << r.output;

  r = run_cli("bench bandwidth --mib 4 --threads 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_GT(last_json_line(r.output)["read_gb_per_s"].get<double>(), 0.0);
  r = run_cli("bench bandwidth --mib 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--mib: must be in [1, "), std::string::npos) << r.output;
}

// Every bench subcommand takes --threads as 0 (the default count) or a count up to kMaxThreads; a
// negative or absurd value is an error naming it, not a silent run on the default count.
TEST(BenchCli, ThreadsAndWarmupOutOfRangeAreRefusedByName) {
  const char* commands[] = {
      "bench peak",
      "bench bandwidth --mib 4",
      "bench qmatmul --type Q8_0 -n 16 -k 64 --calls 1",
      "bench decode --layers 1 --vocab 128 --new-tokens 1 --repeats 1",
      "bench train --preset tiny --batch 1 --steps 1 --warmup 0",
      "bench roofline --preset tiny --batch 1 --steps 1 --warmup 0 --bandwidth-mib 4",
  };
  for (const char* command : commands) {
    for (const char* threads : {"-1", "100000"}) {
      auto r = run_cli(std::string(command) + " --threads " + threads);
      EXPECT_EQ(r.status, 1) << command << " --threads " << threads << "\n" << r.output;
      // -1 is refused as the option is parsed (no option takes a negative number), 100000 by the bound.
      EXPECT_NE(r.output.find("--threads"), std::string::npos) << command << "\n" << r.output;
      EXPECT_NE(r.output.find(std::string("got ") + threads), std::string::npos) << command << "\n" << r.output;
    }
  }
  auto r = run_cli("bench train --preset tiny --batch 1 --steps 1 --warmup -1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--warmup: must be >= 0, got -1"), std::string::npos) << r.output;
}
