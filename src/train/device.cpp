#include "train/device.h"

#include <chrono>

#include "backends/backend.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/runtime.h"
#include "core/error.h"
#include "core/rng.h"
#include "mesh/mesh.h"
#include "models/deepseek_v3/model.h"

namespace loom::train {

Device training_device(const std::string& text, const std::string& mesh, const char* what) {
  Device device;
  try {
    device = usable_device(text, what);
  } catch (const Error& e) {  // e.g. --resume of a GPU run (its config.json says cuda) on a machine without one
    LOOM_FAIL(e.what(), " (training.device; --device cpu trains on the CPU, where a GPU run's checkpoints resume too)");
  }
  if (device.is_cpu()) return device;
  const int64_t ranks = dist::Mesh::parse(mesh).size();
  LOOM_CHECK(ranks == 1, what, ": ", device, " with the mesh '", mesh, "' (", ranks,
             " ranks): a mesh trains on CPUs for now (the NCCL communicator is not checked on GPUs yet, "
             "docs/cuda.md); train on one GPU without --mesh, or on the mesh with --device cpu");
  return device;
}

void move_to_device(models::LanguageModel& model, Device device) {
  if (device.is_cpu()) return;
  for (nn::Parameter* p : model.parameters()) {
    const bool grad = p->value.requires_grad();
    p->value = p->value.to(device);
    if (grad) p->value.set_requires_grad();
    p->value_changed();  // a mixed-precision bf16 copy made on the host is stale
  }
  // DeepSeek-V3's routing biases: the step's loads move them on the device (ops::moe_update_bias_ wants
  // both on one device).
  if (auto* dsv3 = dynamic_cast<deepseek_v3::DeepSeekV3*>(&model)) {
    for (deepseek_v3::MoE* m : dsv3->moe_layers()) m->bias = m->bias.to(device);
  }
}

runs::MemoryBudget memory_budget(Device device, const runs::MemoryBudget& host) {
  if (device.is_cpu()) return host;
  runs::MemoryBudget b;
  b.bytes = static_cast<double>(cuda::total_memory(device.index()));
  b.source = str(device, "'s memory");
  return b;
}

double gpu_matrix_peak_flops(Device device, bool bf16) {
  cuda::check_device("peak FLOP/s", device);
  constexpr int64_t n = 8192;
  const DType dtype = bf16 ? DType::BF16 : DType::F32;
  // Random operands: zeros run faster on tensor cores.
  Tensor a = Tensor::empty({n, n}, dtype), b = Tensor::empty({n, n}, dtype);
  const RngKey key = RngKey::from_seed(7);
  for (int64_t i = 0; i < n * n; ++i) {
    const float v = static_cast<float>(random_bits(key, static_cast<uint64_t>(i)) % 2001) / 1000.0f - 1.0f;
    if (bf16) {
      a.data<loom::bf16>()[i] = loom::bf16::from_float(v);
      b.data<loom::bf16>()[i] = loom::bf16::from_float(-v);
    } else {
      a.data<float>()[i] = v;
      b.data<float>()[i] = -v;
    }
  }
  a = a.to(device);
  b = b.to(device);
  Tensor c = Tensor::empty({n, n}, dtype, device);
  const cuda::Context& ctx = cuda::context(device.index());
  auto one = [&] {
    if (bf16) {
      cuda::gemm_bf16(ctx, false, false, n, n, n, 1.0f, a.data<loom::bf16>(), n, b.data<loom::bf16>(), n, 0.0f,
                      c.data<loom::bf16>(), n);
    } else {
      cuda::gemm(ctx, false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);
    }
  };
  for (int i = 0; i < 3; ++i) one();
  cuda::synchronize(device, "peak FLOP/s");
  constexpr int reps = 10;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) one();
  cuda::synchronize(device, "peak FLOP/s");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * double(n) * double(n) * double(n) * reps / seconds;
}

}  // namespace loom::train
