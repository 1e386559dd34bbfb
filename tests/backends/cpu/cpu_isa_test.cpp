// The run-time instruction-set choice (backends/cpu/isa.h) and the activation kernels' copies: every
// copy this CPU can run, against the std:: double oracles and against the portable (scalar) copy.
// CI on any machine thereby tests each variant its CPU has; LOOM_CPU_ISA picks one for a whole run.
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/activation.h"
#include "backends/cpu/isa.h"
#include "support/norm_helpers.h"

using namespace loom;
using test::expect_error_mentions;
using cpu::CpuIsa;

namespace {

// A dense sweep over [-30, 30], the saturated tails, and the values the clamps must get right.
std::vector<float> sweep_values() {
  std::vector<float> v;
  const int64_t n = 70001;  // several parallel chunks, a vector tail
  for (int64_t i = 0; i < n; ++i) v.push_back(-30.0f + 60.0f * static_cast<float>(i) / static_cast<float>(n - 1));
  for (float t : {-1e30f, -100.0f, -88.0f, -87.0f, -20.5f, 0.0f, -0.0f, 1e-40f, 20.5f, 87.0f, 88.0f, 100.0f, 1e30f})
    v.push_back(t);
  return v;
}

// Outputs of every activation kernel for one copy, f32 and bf16, in a fixed order.
struct Outputs {
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<bf16>> b16;
};

Outputs run_all(const std::vector<float>& x, const std::vector<float>& up, const std::vector<float>& dy) {
  const int64_t n = static_cast<int64_t>(x.size());
  Outputs o;
  auto out = [&]() -> float* { return o.f32.emplace_back(static_cast<size_t>(n)).data(); };
  cpu::silu_forward(out(), x.data(), n);
  cpu::silu_backward(out(), dy.data(), x.data(), n);
  for (bool t : {false, true}) {
    cpu::gelu_forward(out(), x.data(), n, t);
    cpu::gelu_backward(out(), dy.data(), x.data(), n, t);
  }
  cpu::swiglu_forward(out(), x.data(), up.data(), n);
  float* dg = out();
  cpu::swiglu_backward(dg, out(), dy.data(), x.data(), up.data(), n);
  cpu::swiglu_backward(out(), nullptr, dy.data(), x.data(), up.data(), n);
  cpu::swiglu_backward(nullptr, out(), dy.data(), x.data(), up.data(), n);
  cpu::dropout_forward(out(), x.data(), n, 0.3f, RngKey{11, 12});

  std::vector<bf16> xb(x.size()), ub(x.size()), db(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = bf16::from_float(x[i]);
    ub[i] = bf16::from_float(up[i]);
    db[i] = bf16::from_float(dy[i]);
  }
  auto outb = [&]() -> bf16* { return o.b16.emplace_back(static_cast<size_t>(n)).data(); };
  cpu::silu_forward(outb(), xb.data(), n);
  cpu::silu_backward(outb(), db.data(), xb.data(), n);
  cpu::gelu_forward(outb(), xb.data(), n, true);
  cpu::gelu_backward(outb(), db.data(), xb.data(), n, false);
  cpu::swiglu_forward(outb(), xb.data(), ub.data(), n);
  bf16* dgb = outb();
  cpu::swiglu_backward(dgb, outb(), db.data(), xb.data(), ub.data(), n);
  cpu::dropout_forward(outb(), xb.data(), n, 0.3f, RngKey{11, 12});
  return o;
}

Tensor as_tensor(const std::vector<float>& v) {
  return Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v);
}
Tensor as_tensor(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = v[i].to_float();
  return as_tensor(f);
}

}  // namespace

TEST(CpuIsa, NamesParseAndOthersAreRejected) {
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    EXPECT_EQ(cpu::parse_cpu_isa(cpu::cpu_isa_name(isa)), isa);
  expect_error_mentions([] { cpu::parse_cpu_isa("avx3"); }, {"'avx3'", "scalar, avx2, avx512"});
  expect_error_mentions([] { cpu::parse_cpu_isa(""); }, {"''"});
}

TEST(CpuIsa, TheChoiceIsOneTheCpuRunsAndOnlySuchCanBeSet) {
  const std::vector<CpuIsa> ok = cpu::supported_cpu_isas();
  ASSERT_FALSE(ok.empty());
  EXPECT_EQ(ok.front(), CpuIsa::Scalar);
  EXPECT_TRUE(cpu::cpu_isa_supported(cpu::cpu_isa()));
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (cpu::cpu_isa_supported(isa)) continue;
    const std::string name = cpu::cpu_isa_name(isa);
    expect_error_mentions([&] { cpu::set_cpu_isa(isa); }, {"cannot run the", name.c_str()});
  }
  const CpuIsa before = cpu::cpu_isa();
  {
    cpu::ScopedCpuIsa scalar(CpuIsa::Scalar);
    EXPECT_EQ(cpu::cpu_isa(), CpuIsa::Scalar);
  }
  EXPECT_EQ(cpu::cpu_isa(), before);
}

// Each copy against the double oracles (the tolerances of FastKernelsMatchReferenceOverSweep), and
// against the scalar copy: the same formulas in the same order, so only an FMA contracted on one target
// and not the other can separate them: on one machine with -march=native they agree bitwise; a scalar
// copy built without FMA (LOOM_NATIVE=OFF) differs by a few ulp of the terms, which where a gradient
// crosses zero (silu' at x = -1.28) is all of a tiny result: hence an absolute tolerance as well, 2e-6
// against values of order 1 (measured: 1e-6). Dropout's mask and scale are exact, so it is bitwise.
TEST(CpuIsa, EveryActivationCopyMatchesTheOraclesAndTheScalarCopy) {
  const std::vector<float> x = sweep_values();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> up(x.size()), dy(x.size());
  Tensor ru = test::randn({n}, 81), rd = test::randn({n}, 82);
  for (int64_t i = 0; i < n; ++i) {
    up[static_cast<size_t>(i)] = ru.data<float>()[i];
    dy[static_cast<size_t>(i)] = rd.data<float>()[i];
  }
  // The oracles, in the order of run_all's f32 outputs (swiglu's from silu's: y = silu(g) u,
  // dgate = dy u silu'(g), dup = dy silu(g)).
  std::vector<std::vector<float>> want(12, std::vector<float>(x.size()));
  std::vector<float> ones(x.size(), 1.0f), silu_grad(x.size());
  cpu::silu_forward_reference(want[0].data(), x.data(), n);
  cpu::silu_backward_reference(want[1].data(), dy.data(), x.data(), n);
  cpu::gelu_forward_reference(want[2].data(), x.data(), n, false);
  cpu::gelu_backward_reference(want[3].data(), dy.data(), x.data(), n, false);
  cpu::gelu_forward_reference(want[4].data(), x.data(), n, true);
  cpu::gelu_backward_reference(want[5].data(), dy.data(), x.data(), n, true);
  cpu::silu_backward_reference(silu_grad.data(), ones.data(), x.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    want[6][i] = static_cast<float>(static_cast<double>(want[0][i]) * up[i]);
    want[7][i] = want[9][i] = static_cast<float>(static_cast<double>(dy[i]) * up[i] * silu_grad[i]);
    want[8][i] = want[10][i] = static_cast<float>(static_cast<double>(dy[i]) * want[0][i]);
  }
  cpu::dropout_forward_reference(want[11].data(), x.data(), n, 0.3f, RngKey{11, 12});
  const char* names[] = {"silu",   "silu bwd",      "gelu",         "gelu bwd",          "gelu tanh", "gelu tanh bwd",
                         "swiglu", "swiglu dgate", "swiglu dup", "swiglu dgate only", "swiglu dup only", "dropout"};

  Outputs scalar;
  {
    cpu::ScopedCpuIsa use(CpuIsa::Scalar);
    scalar = run_all(x, up, dy);
  }
  for (CpuIsa isa : cpu::supported_cpu_isas()) {
    SCOPED_TRACE(cpu::cpu_isa_name(isa));
    Outputs got;
    {
      cpu::ScopedCpuIsa use(isa);
      got = run_all(x, up, dy);
    }
    ASSERT_EQ(got.f32.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      SCOPED_TRACE(names[k]);
      Tensor g = as_tensor(got.f32[k]);
      // The products of swiglu's gradient round twice more than silu's alone: 4 ulp.
      test::expect_close(g, as_tensor(want[k]), 2e-6f, k == 11 ? 0.0f : 4e-6f, "vs oracle");
      if (k == 11) {
        EXPECT_TRUE(test::bitwise_equal(g, as_tensor(scalar.f32[k])));
      } else {
        test::expect_close(g, as_tensor(scalar.f32[k]), 2e-6f, 1e-6f, "vs scalar copy");
      }
    }
    // bf16 results: one rounding of nearly the same f32 value, so at most one bf16 ulp apart (of the
    // terms, for the same reason as above).
    for (size_t k = 0; k < got.b16.size(); ++k) {
      SCOPED_TRACE("bf16 output " + std::to_string(k));
      test::expect_close(as_tensor(got.b16[k]), as_tensor(scalar.b16[k]), 1e-4f, 1.0f / 128, "vs scalar copy");
    }
    EXPECT_TRUE(test::bitwise_equal(as_tensor(got.b16.back()), as_tensor(scalar.b16.back()))) << "bf16 dropout";
  }
}
