// StepCapture's CPU implementation (core/step_capture.h): the step runs eagerly, and the capture
// checks the promise a CUDA graph relies on, that a step takes no new memory after warm-up.
#include <gtest/gtest.h>

#include "backends/cuda/runtime.h"
#include "core/step_capture.h"
#include "core/tensor.h"

using namespace loom;

TEST(StepCapture, CpuRunsTheStepEveryTimeAndSeesNoNewMemoryInASteadyStep) {
  auto capture = make_step_capture(Device::cpu(), {.warmup_steps = 1, .strict = true});
  EXPECT_EQ(capture->kind(), "eager");
  Tensor acc = Tensor::zeros({257});
  int calls = 0;
  for (int i = 0; i < 5; ++i) {
    capture->run([&] {
      Tensor tmp = Tensor::full({257}, 2.0f);   // the same sizes every step: served from the cache
      Tensor other = Tensor::empty({3, 1001});
      float* a = acc.data<float>();
      for (int64_t j = 0; j < acc.numel(); ++j) a[j] += tmp.data<float>()[j];
      ++calls;
    });
  }
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(acc.to_vector<float>()[256], 10.0f);
  const StepCaptureStats s = capture->stats();
  EXPECT_EQ(s.steps, 5);
  EXPECT_EQ(s.eager_steps, 5);
  EXPECT_EQ(s.captures, 0);
  EXPECT_EQ(s.steps_with_new_memory, 0);
}

TEST(StepCapture, CpuReportsAStepThatKeepsTakingNewMemory) {
  // Sizes no other test uses, growing each step, so the allocator's cache can never serve them.
  int64_t n = 1'234'567;
  auto growing_step = [&] { Tensor t = Tensor::empty({n += 4099}); };
  auto lenient = make_step_capture(Device::cpu(), {.warmup_steps = 1, .strict = false});
  for (int i = 0; i < 4; ++i) lenient->run(growing_step);
  EXPECT_EQ(lenient->stats().steps_with_new_memory, 3);  // every step after the one warm-up step
  EXPECT_GE(lenient->stats().new_allocations_after_warmup, 3);

  auto strict = make_step_capture(Device::cpu(), {.warmup_steps = 2, .strict = true});
  strict->run(growing_step);
  strict->run(growing_step);  // warm-up: allowed
  try {
    strict->run(growing_step);
    FAIL() << "a step taking new memory after warm-up was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 3 took 1 new block of memory after 2 warm-up steps"),
              std::string::npos)
        << e.what();
  }
  strict->reset();  // warm-up starts again
  strict->run(growing_step);
  EXPECT_EQ(strict->stats().steps, 4);
}

TEST(StepCapture, RejectsBadOptionsAndUnusableDevices) {
  EXPECT_THROW(make_step_capture(Device::cpu(), {.warmup_steps = -1}), Error);
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: tests/backends/cuda covers the CUDA capture";
  try {
    make_step_capture(Device::cuda(0));
    FAIL() << "a CUDA step capture was made without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step capture"), std::string::npos) << e.what();
  }
}
