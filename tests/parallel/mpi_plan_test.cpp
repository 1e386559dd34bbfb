// `loom plan` against loom's own pipelined runs under mpirun, rank by rank: bench/plan.cpp trains the
// layout as the trainer does on every rank (each rank a process with its own allocator) and prints, per
// rank, the bytes it handed to the communicator per kind and step and its allocator's peak, beside the
// plan's estimate for that rank's stage. The bytes must be equal and the peak within 5%.
// tools/plan_check.py runs the whole table of docs/plan.md the same way (more layouts, step times).
// Skipped without MPI, mpirun, or the benchmark programs (LOOM_BUILD_BENCH=OFF).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mesh/mpi.h"

namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> run_bench(const std::string& args, int ranks) {
  const fs::path bench = fs::path(LOOM_CLI).parent_path() / "bench" / "loom_bench_plan";
  const std::string cmd = "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " +
                          bench.string() + " " + args + " 2>&1";
  std::vector<nlohmann::json> out;
  FILE* p = popen(cmd.c_str(), "r");
  std::string all;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) {
    all += buf;
    if (buf[0] == '{') out.push_back(nlohmann::json::parse(buf));
  }
  const int st = pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd << "\n" << all;
  EXPECT_EQ(static_cast<int>(out.size()), ranks) << cmd << "\n" << all;
  return out;
}

}  // namespace

TEST(MpiPlan, EachPipelineRankMeetsThePlanBytesExactlyAndPeakMemoryWithinFivePercent) {
  if (!loom::dist::mpi_built()) GTEST_SKIP() << "loom built without MPI";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not on PATH";
  if (!fs::exists(fs::path(LOOM_CLI).parent_path() / "bench" / "loom_bench_plan")) {
    GTEST_SKIP() << "build/bench/loom_bench_plan not built (LOOM_BUILD_BENCH=OFF)";
  }
  // Tiny Llama with 4 blocks, 16 sequences of 64 tokens a step; the device's speed given, so nothing is
  // measured (time is not checked here: docs/plan.md).
  const std::string model = "--config tiny --set model.num_layers=4 --batch 16 --steps 2 --warmup 2 "
                            "--flops 1e10 --bandwidth 1e10 ";
  struct Case {
    std::string layout;
    int ranks;
  };
  for (const Case& c : std::vector<Case>{
           {"--mesh pipe=2 --mode dp --schedule 1f1b --micro 4", 2},
           {"--mesh pipe=2 --mode dp --schedule gpipe --micro 4", 2},
           {"--mesh pipe=2,data=2 --mode fsdp --schedule 1f1b --micro 2 --recompute full", 4}}) {
    SCOPED_TRACE(c.layout);
    for (const nlohmann::json& r : run_bench(model + c.layout, c.ranks)) {
      SCOPED_TRACE("rank " + std::to_string(r.at("rank").get<int>()) + ", stage " + std::to_string(r.at("stage").get<int>()));
      EXPECT_EQ(r.at("invalid").get<std::string>(), "");
      for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}) {
        EXPECT_EQ(r["measured"][kind].get<double>(), r["plan"][kind].get<double>()) << kind;
      }
      EXPECT_GT(r["measured"]["send_recv"].get<double>(), 0);
      // The calls (sends, receives, sums, buckets, FSDP's gathers and reduce-scatters): what the measured
      // per-call costs of docs/plan/cpu-collectives.json multiply.
      EXPECT_EQ(r["measured"]["calls"].get<double>(), r["plan"]["calls"].get<double>());
      const double ratio = r["measured"]["peak"].get<double>() / r["plan"]["peak"].get<double>();
      std::printf("%s rank %d: allocator peak %.0f, plan %.0f (%.4f)\n", c.layout.c_str(), r["rank"].get<int>(),
                  r["measured"]["peak"].get<double>(), r["plan"]["peak"].get<double>(), ratio);
      EXPECT_GT(ratio, 0.95);
      EXPECT_LT(ratio, 1.05);
    }
  }
}
