// What the CUDA backend must do on every machine, GPU or not: answer the device queries without
// crashing, refuse device memory with a clear error when there is no GPU, and give ops' dispatch errors
// that name the op and the device. Runs in CI (no GPU there).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "backends/backend.h"
#include "mesh/nccl/nccl_communicator.h"
#include "core/step_capture.h"
#include "gpu_test.h"
#include "support/errors.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/optimizer.h"
#include "ops/rope.h"
#include "ops/softmax.h"
#include "train/optimizer.h"

using namespace loom;
using test::error_of;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(CudaRuntime, DeviceQueriesAnswerWithoutCrashing) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  EXPECT_EQ(cuda::device_count(), n);  // asked twice: the probe is cached and stable
  EXPECT_EQ(cuda::unavailable_reason().empty(), n > 0);
  EXPECT_FALSE(cuda::describe().empty());
  // The build flag CMake passes to this suite says whether the backend should be there.
  EXPECT_EQ(cuda::built(), LOOM_TEST_CUDA_BUILT != 0);
}

TEST(CudaRuntime, WithoutAGpuDeviceMemoryIsRefusedWithTheReason) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  const std::string reason = cuda::unavailable_reason();
  const std::string m = error_of([] { Tensor::empty({4}, DType::F32, Device::cuda(0)); });
  EXPECT_TRUE(contains(m, "cuda:0")) << m;
  EXPECT_TRUE(contains(m, reason)) << m << " lacks " << reason;
  const std::string m2 = error_of([] { Tensor::from_vector<float>({2}, {1, 2}).to(Device::cuda(1)); });
  EXPECT_TRUE(contains(m2, "cuda:1")) << m2;
  EXPECT_TRUE(contains(error_of([] { cuda::synchronize(Device::cuda(0), "sync"); }), "sync")) ;
}

TEST(CudaRuntime, ToTheSameDeviceIsTheSameTensor) {
  Tensor t = Tensor::from_vector<float>({2}, {1, 2});
  EXPECT_TRUE(t.to(Device::cpu()).is_same(t));
}

TEST(CudaDispatch, AnOpWithoutACudaKernelNamesTheOpAndDevice) {
  Tensor x = test::fake_cuda({2, 3});
  const std::string m = error_of([&] { ops::sub(x, x); });
  EXPECT_TRUE(contains(m, "sub")) << m;
  EXPECT_TRUE(contains(m, "cuda:0")) << m;
  if (cuda::built()) {
    EXPECT_TRUE(contains(m, "the CUDA backend has no kernel for this op yet")) << m;
  } else {
    EXPECT_TRUE(contains(m, "built without the CUDA toolkit")) << m;
  }
}

TEST(CudaDispatch, MixedDevicesAreRefusedNamingBoth) {
  Tensor a = Tensor::zeros({2, 3});
  Tensor b = test::fake_cuda({2, 3});
  const std::string m = error_of([&] { ops::add(a, b); });
  EXPECT_TRUE(contains(m, "add")) << m;
  EXPECT_TRUE(contains(m, "cpu")) << m;
  EXPECT_TRUE(contains(m, "cuda:0")) << m;
}

TEST(CudaDispatch, AnOpWithACudaKernelNamesTheOpWhenNoGpuIsThere) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  Tensor x = test::fake_cuda({4, 8});
  Tensor w = test::fake_cuda({8});
  Tensor ids = test::fake_cuda({4}, DType::I32);
  Tensor positions = Tensor::zeros({4}, DType::I32);  // on the CPU: rope reads them on the host
  Tensor x3 = test::fake_cuda({1, 4, 8});
  Tensor idx2 = test::fake_cuda({4, 2}, DType::I32), x2 = test::fake_cuda({4, 2});
  Tensor w13 = test::fake_cuda({3, 5, 8}), w2 = test::fake_cuda({3, 8, 5});
  for (const auto& [op, f] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"rms_norm", [&] { ops::rms_norm(x, w); }},
           {"add", [&] { ops::add(x, x); }},
           {"mul", [&] { ops::mul(x, x); }},
           {"scale", [&] { ops::scale(x, 2.0f); }},
           {"add_", [&] { ops::add_(x, x); }},
           {"softmax", [&] { ops::softmax(x); }},
           {"linear", [&] { ops::linear(x, x); }},
           {"matmul", [&] { ops::matmul(x, x, false, true); }},
           {"layer_norm", [&] { ops::layer_norm(x, w, w); }},
           {"add_rms_norm", [&] { ops::add_rms_norm(x, x, w); }},
           {"embedding", [&] { ops::embedding(ids, x); }},
           {"rope", [&] { ops::rope(x, positions); }},
           {"dropout", [&] { ops::dropout(x, 0.5f, RngKey{}); }},
           {"silu", [&] { ops::silu(x); }},
           {"gelu", [&] { ops::gelu(x, ops::GeluApproximation::Tanh); }},
           {"swiglu", [&] { ops::swiglu(x, x); }},
           {"cross_entropy", [&] { ops::cross_entropy(x, ids); }},
           {"linear_cross_entropy", [&] { ops::linear_cross_entropy(x, x, ids); }},
           {"scaled_dot_product_attention", [&] { ops::scaled_dot_product_attention(x, x, x); }},
           {"causal_self_attention", [&] { ops::causal_self_attention(x3, x3, x3, 2); }},
           {"moe_experts", [&] { ops::moe_experts(x, idx2, x2, w13, w13, w2); }},
           // train::global_grad_norm and AdamW go through the optimizer ops, which name themselves.
           {"sum_of_squares", [&] { train::global_grad_norm({x}); }},
           {"adamw_update", [&] { ops::adamw_update(x, x, x, x, ops::AdamWStep{}); }},
           {"scale_", [&] { ops::scale_(x, 2.0f); }},
           {"convert_", [&] { Tensor dst = test::fake_cuda({4, 8}, DType::BF16); ops::convert_(dst, x); }}}) {
    const std::string m = error_of(f);
    EXPECT_TRUE(contains(m, op + ": ")) << op << ": " << m;
    EXPECT_TRUE(contains(m, "cuda:0")) << op << ": " << m;
    EXPECT_TRUE(contains(m, cuda::unavailable_reason())) << op << ": " << m;
  }
  EXPECT_TRUE(contains(error_of([] { dist::make_nccl_communicator(nullptr, 0); }), "nccl"));
}

// `loom train/generate --device`: without a usable GPU, one clear error naming the device and the
// reason, before any file is read or written; a malformed name is named too.
TEST(CudaCli, DeviceCudaIsRefusedWithTheReason) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present (the refusal then names the missing model support)";
  const std::string out_dir = testing::TempDir() + "/cuda_cli_run";
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"train --config tiny --device cuda --out " + out_dir, "train: cannot use cuda:0: "},
           {"train --config tiny --device cuda:2 --out " + out_dir, "train: cannot use cuda:2: "},
           // An existing file (the CLI checks the path as it parses): the device is refused before it is read.
           {"generate --weights " + std::string(LOOM_CLI) + " --prompt hi --device cuda", "generate: cannot use cuda:0: "},
           {"train --config tiny --device tpu --out " + out_dir, "unknown device 'tpu'"}}) {
    const std::string cmd = std::string(LOOM_CLI) + " " + c.args + " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buf[512];
    while (fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
    const int status = pclose(pipe);
    EXPECT_NE(status, 0) << cmd;
    EXPECT_TRUE(contains(output, c.expect)) << cmd << "\n" << output;
    if (c.expect.find("cannot use") != std::string::npos) {
      EXPECT_TRUE(contains(output, cuda::unavailable_reason())) << output;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(out_dir)) << "the refused run wrote its directory";
}
