// What the CUDA backend must do on every machine, GPU or not: answer the device queries without
// crashing, refuse device memory with a clear error when there is no GPU, and give ops' dispatch errors
// that name the op and the device. Runs in CI (no GPU there).
#include <gtest/gtest.h>

#include "backends/backend.h"
#include "backends/cuda/nccl/nccl_communicator.h"
#include "core/step_capture.h"
#include "gpu_test.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/softmax.h"

using namespace loom;

namespace {
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
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
  const std::string m = message_of([] { Tensor::empty({4}, DType::F32, Device::cuda(0)); });
  EXPECT_TRUE(contains(m, "cuda:0")) << m;
  EXPECT_TRUE(contains(m, reason)) << m << " lacks " << reason;
  const std::string m2 = message_of([] { Tensor::from_vector<float>({2}, {1, 2}).to(Device::cuda(1)); });
  EXPECT_TRUE(contains(m2, "cuda:1")) << m2;
  EXPECT_TRUE(contains(message_of([] { cuda::synchronize(Device::cuda(0), "sync"); }), "sync")) ;
}

TEST(CudaRuntime, ToTheSameDeviceIsTheSameTensor) {
  Tensor t = Tensor::from_vector<float>({2}, {1, 2});
  EXPECT_TRUE(t.to(Device::cpu()).is_same(t));
}

TEST(CudaDispatch, AnOpWithoutACudaKernelNamesTheOpAndDevice) {
  Tensor x = test::fake_cuda({2, 3});
  const std::string m = message_of([&] { ops::softmax(x); });
  EXPECT_TRUE(contains(m, "softmax")) << m;
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
  const std::string m = message_of([&] { ops::add(a, b); });
  EXPECT_TRUE(contains(m, "add")) << m;
  EXPECT_TRUE(contains(m, "cpu")) << m;
  EXPECT_TRUE(contains(m, "cuda:0")) << m;
}

TEST(CudaDispatch, AnOpWithACudaKernelNamesTheOpWhenNoGpuIsThere) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  Tensor x = test::fake_cuda({4, 8});
  Tensor w = test::fake_cuda({8});
  for (const auto& [op, f] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"rms_norm", [&] { ops::rms_norm(x, w); }},
           {"add", [&] { ops::add(x, x); }},
           {"mul", [&] { ops::mul(x, x); }},
           {"scale", [&] { ops::scale(x, 2.0f); }},
           {"add_", [&] { ops::add_(x, x); }}}) {
    const std::string m = message_of(f);
    EXPECT_TRUE(contains(m, op + ": ")) << op << ": " << m;
    EXPECT_TRUE(contains(m, "cuda:0")) << op << ": " << m;
    EXPECT_TRUE(contains(m, cuda::unavailable_reason())) << op << ": " << m;
  }
  EXPECT_TRUE(contains(message_of([] { cuda::make_nccl_communicator(nullptr, 0); }), "nccl"));
}
