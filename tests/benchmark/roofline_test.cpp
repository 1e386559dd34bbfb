// `loom bench roofline`: the op profiler (core/profile.h), the per-op cost model, the log-log chart,
// and the command run end to end on the tiny preset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "backends/cpu/attention.h"
#include "backends/cpu/isa.h"
#include "core/profile.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "report/plot.h"
#include "benchmark/roofline.h"
#include "models/stats.h"
#include "support/cli.h"
#include "train/config.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

Tensor ramp(const Shape& shape, float scale) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>((i * 7) % 11) - 0.3f;
  return Tensor::from_vector(shape, v);
}

// Linear then sum, forward and backward; returns w's gradient.
std::vector<float> linear_step() {
  Tensor x = ramp({4, 3}, 0.1f).set_requires_grad(), w = ramp({5, 3}, 0.2f).set_requires_grad();
  Tensor loss = ops::sum(ops::linear(x, w));
  loss.backward();
  const Tensor g = w.grad();
  return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
}

}  // namespace

TEST(Profile, RecordsOpsOnlyInsideAScopeAndChangesNoResult) {
  EXPECT_EQ(profile::active(), nullptr);
  const std::vector<float> plain = linear_step();
  profile::Profile p;
  std::vector<float> profiled;
  {
    profile::ProfileScope scope(p);
    EXPECT_EQ(profile::active(), &p);
    p.mark();
    profiled = linear_step();
    {
      profile::Profile inner;
      profile::ProfileScope nested(inner);
      EXPECT_EQ(profile::active(), &inner);
    }
    EXPECT_EQ(profile::active(), &p);
  }
  EXPECT_EQ(profile::active(), nullptr);
  EXPECT_EQ(plain, profiled);  // bitwise: profiling only times
  ASSERT_EQ(p.ops.size(), 2u);
  EXPECT_EQ(p.ops[0].name, "linear");
  EXPECT_EQ(p.ops[1].name, "sum");
  EXPECT_EQ(p.ops[0].inputs[1].shape, (Shape{5, 3}));
  EXPECT_EQ(p.ops[0].outputs[0].shape, (Shape{4, 5}));
  for (const auto& op : p.ops) {
    EXPECT_TRUE(op.has_backward);
    EXPECT_GE(op.forward_seconds, 0.0);
    EXPECT_GT(op.backward_seconds, 0.0) << op.name;  // the engine timed its Node
  }
  linear_step();  // outside the scope: nothing more is recorded
  EXPECT_EQ(p.ops.size(), 2u);
}

TEST(Roofline, CostOfALinearIsTwoMnkEachWay) {
  profile::OpRecord op;
  op.name = "linear";
  op.inputs = {{Shape{2, 8, 16}, DType::F32, true}, {Shape{32, 16}, DType::F32, true}};
  op.outputs = {{Shape{2, 8, 32}, DType::F32, true}};
  op.has_backward = true;
  auto c = bench::op_cost(op);
  EXPECT_EQ(c.family, "matmul");
  EXPECT_DOUBLE_EQ(c.forward_flops, 2.0 * 16 * 32 * 16);
  EXPECT_DOUBLE_EQ(c.backward_flops, 2 * c.forward_flops);  // dx and dw
  EXPECT_DOUBLE_EQ(c.forward_bytes, 4.0 * (256 + 512 + 512));
  op.inputs[0].requires_grad = false;  // the first layer's input: dw only
  EXPECT_DOUBLE_EQ(bench::op_cost(op).backward_flops, c.forward_flops);
  op.name = "some_new_op";
  auto unknown = bench::op_cost(op);
  EXPECT_EQ(unknown.family, "some_new_op");
  EXPECT_EQ(unknown.forward_flops, 0.0);
}

TEST(Roofline, CostOfTheRoutedExpertsIsTheirGemms) {
  // N 10 tokens, C 8, K 2 of E 4 experts, F 6: P = 20 slots, three 2·F·C GEMMs each way.
  profile::OpRecord op;
  op.name = "moe_experts";
  op.inputs = {{Shape{10, 8}, DType::F32, true}, {Shape{10, 2}, DType::F32, true}, {Shape{4, 6, 8}, DType::F32, true},
               {Shape{4, 6, 8}, DType::F32, true}, {Shape{4, 8, 6}, DType::F32, true}};
  op.outputs = {{Shape{10, 8}, DType::F32, true}};
  op.has_backward = true;
  const double gemm = 2.0 * 20 * 6 * 8;
  auto c = bench::op_cost(op);
  EXPECT_EQ(c.family, "moe");
  EXPECT_DOUBLE_EQ(c.palm_flops, 3 * gemm + 6 * gemm);  // dau, dx (two), dw1, dw3, dw2
  EXPECT_GT(c.forward_flops, 3 * gemm);                 // + SwiGLU and the combine
  EXPECT_GT(c.backward_flops, 6 * gemm);
  for (auto& in : op.inputs) in.requires_grad = false;  // frozen experts, no dx: dau only
  EXPECT_DOUBLE_EQ(bench::op_cost(op).palm_flops, 3 * gemm + gemm);
  op.name = "moe_route";
  EXPECT_EQ(bench::op_cost(op).family, "moe");
  EXPECT_EQ(bench::op_cost(op).forward_flops, 0.0);
}

TEST(Plot, LogAxesPlaceDecadesEvenlyAndLeaveOutNonPositivePoints) {
  report::Chart c;
  c.log_x = c.log_y = true;
  report::Series s;
  s.x = {1, 10, 100, 0};
  s.y = {1, 10, 100, -5};
  s.line = false;
  s.markers = true;
  s.point_labels = {"a", "b", "c", "d"};
  c.series.push_back(s);
  const std::string svg = report::render_svg(c);
  std::regex circle("<circle cx=\"([0-9.]+)\" cy=\"([0-9.]+)\"");
  std::vector<std::pair<double, double>> pts;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), circle); it != std::sregex_iterator(); ++it)
    pts.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  ASSERT_EQ(pts.size(), 3u);  // (0, -5) has no place on a log axis
  EXPECT_NEAR(pts[1].first - pts[0].first, pts[2].first - pts[1].first, 0.02);  // one decade each
  EXPECT_NEAR(pts[0].second - pts[1].second, pts[1].second - pts[2].second, 0.02);
  EXPECT_EQ(svg.find("<polyline"), std::string::npos);  // markers only
  EXPECT_NE(svg.find(">b</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">d</text>"), std::string::npos);
  EXPECT_NE(svg.find(">100</text>"), std::string::npos);  // a decade tick
  s.point_labels = {"one"};
  c.series = {s};
  EXPECT_THROW(report::render_svg(c), Error);
}

// One small profiled step: enough to exercise every family without timing anything carefully.
static bench::RooflineOptions quick_options() {
  return {.batch_size = 2, .steps = 1, .warmup_steps = 0, .bandwidth_mib = 8, .peak_seconds = 0.02};
}

TEST(Roofline, TinyPresetFamiliesAddUpToTheModelsFlops) {
  auto config = train::TrainConfig::load("tiny").model;
  bench::RooflineOptions o = quick_options();
  auto r = bench::bench_roofline(config, o);
  // GEMMs and attention against PaLM's 6N + 12·L·d·T: N also counts the norms' weights, which no GEMM
  // multiplies (0.2% of tiny's N), hence the 0.5%.
  EXPECT_NEAR(r.palm_counted_flops_per_step / r.model_flops_per_step, 1.0, 0.005);
  // Everything else (norms, activations, loss, AdamW) adds a few percent at most.
  EXPECT_GE(r.counted_flops_per_step, r.palm_counted_flops_per_step);
  EXPECT_LT(r.counted_flops_per_step / r.model_flops_per_step, 1.05);
  std::set<std::string> names;
  double seconds = 0;
  for (const auto& f : r.families) {
    names.insert(f.family);
    seconds += f.seconds;
    if (f.flops > 0 && f.bytes > 0) {
      EXPECT_GT(f.bound_gflops, 0) << f.family;
      EXPECT_LE(f.bound_gflops, std::max(r.peak_gflops, r.gemm_peak_gflops) * 1.0000001) << f.family;
    }
  }
  for (const char* f : {"matmul", "attention", "norm", "activation", "lm_head+loss", "embedding", "adamw"})
    EXPECT_TRUE(names.count(f)) << f;
  EXPECT_GT(r.peak_gflops, 0);
  EXPECT_GT(r.bandwidth_gb_per_s, 0);
  EXPECT_LE(seconds, r.step_seconds * 1.01);  // the families are parts of the step
  const std::string table = r.table();
  EXPECT_NE(table.find("| matmul |"), std::string::npos) << table;
  const std::string svg = r.svg();
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find(">matmul "), std::string::npos) << svg;
  EXPECT_EQ(nlohmann::json::parse(r.json())["families"].size(), r.families.size());
}

// Under --bf16 the families whose FLOPs run on bf16 GEMMs (matmul, the LM head, the routed experts) sit
// under the bf16 roof; flash attention computes in f32, so its roof stays the FMA peak. (On a CPU without
// a bf16 dot product both roofs are the FMA peak and this only checks the bound's formula.)
// DeepSeek-V3's step runs its MTP module too (a projection, a dense block and the shared head again, on
// T - 1 positions): the model's PaLM count includes it, so the GEMMs and attention the step profiles
// (MLA's five projections, the router, the shared and routed experts, both heads) add up to it. Without
// the module's term the ratio was 1.35 (dsv3-mini) and here 1.30; the norms' weights, in N but in no
// GEMM, are a larger share of this tiny shape (d_model 32) than of tiny's, hence the 1%.
TEST(Roofline, Dsv3FamiliesAddUpToTheModelsFlopsWithTheMtpModule) {
  auto config = train::TrainConfig::load("dsv3-tiny").model;
  const models::ModelStats s = config.stats();
  ASSERT_EQ(s.training_modules, 1);
  bench::RooflineOptions o = quick_options();
  auto r = bench::bench_roofline(config, o);
  EXPECT_NEAR(r.palm_counted_flops_per_step / r.model_flops_per_step, 1.0, 0.01);
  EXPECT_GT(s.training_module_flops_per_token_at(32.0), 0.2 * s.palm_flops_per_token());
}

// Under --bf16 the GEMM families have the bf16 roof, and attention too where its kernels take bf16
// products (AVX512-BF16); every other family keeps the FMA roof.
TEST(Roofline, UnderBf16TheFamiliesOnBf16UnitsHaveTheBf16Roof) {
  auto config = train::TrainConfig::load("dsv3-tiny").model;
  bench::RooflineOptions o = quick_options();
  o.bf16 = true;
  auto r = bench::bench_roofline(config, o);
  if (r.bf16_peak_gflops > 0) {
    EXPECT_EQ(r.gemm_peak_gflops, r.bf16_peak_gflops);
  }
  std::set<std::string> checked;
  for (const auto& f : r.families) {
    if (f.flops <= 0 || f.bytes <= 0) continue;
    AttentionProblem attention;
    attention.bf16_products = true;
    const bool on_bf16_units = f.family == "matmul" || f.family == "lm_head+loss" || f.family == "moe" ||
                               (f.family == "attention" && cpu::flash_attention_uses_bf16(attention));
    const double roof = on_bf16_units ? r.gemm_peak_gflops : r.peak_gflops;
    EXPECT_DOUBLE_EQ(f.bound_gflops, std::min(roof, f.intensity() * r.bandwidth_gb_per_s)) << f.family;
    checked.insert(f.family);
  }
  for (const char* f : {"matmul", "moe", "attention", "lm_head+loss"}) EXPECT_TRUE(checked.count(f)) << f;
}

TEST(Roofline, CommandWritesTheChartAndRefusesBadArguments) {
  fs::path dir = fs::temp_directory_path() / ("loom_roofline_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto r = test::run_cli("bench roofline --preset tiny --batch 1 --steps 1 --warmup 0 --threads 1 --bandwidth-mib 8 --out " +
                         dir.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("| family | ms/step |"), std::string::npos) << r.output;
  std::ifstream svg(dir / "roofline.svg");
  std::stringstream ss;
  ss << svg.rdbuf();
  EXPECT_NE(ss.str().find("</svg>"), std::string::npos);
  std::ifstream json(dir / "roofline.json");
  auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["cpu_kernels"], cpu::cpu_isa_name(cpu::cpu_isa()));  // the child saw the same CPU and environment
  fs::remove_all(dir);
  auto bad = test::run_cli("bench roofline --preset tiny --steps 0");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("--steps: must be in [1, "), std::string::npos) << bad.output;
  // A kernel instruction set the user asks for by name must exist and run here: an error, before any work.
  cpu::cpu_isa();  // this process's choice is made (from its own environment) before the variable changes
  ::setenv("LOOM_CPU_ISA", "avx3", 1);
  auto bad_isa = test::run_cli("bench roofline --preset tiny --steps 1");
  ::unsetenv("LOOM_CPU_ISA");
  EXPECT_EQ(bad_isa.status, 1);
  EXPECT_NE(bad_isa.output.find("'avx3' is not one of scalar, avx2, avx512"), std::string::npos) << bad_isa.output;
}
