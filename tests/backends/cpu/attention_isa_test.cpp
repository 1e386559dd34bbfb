// Flash attention's per-instruction-set copies (backends/cpu/isa.h): every copy this CPU can run,
// against the naive masked oracle and against the portable (scalar) copy, with causal and full masks,
// grouped-query heads, fused RoPE and dropout. LOOM_CPU_ISA picks one copy for a whole test run.
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/rope.h"
#include "core/parallel.h"
#include "support/op_test.h"

using namespace loom;
using cpu::CpuIsa;

namespace {

struct Case {
  const char* name;
  bool causal;
  int64_t kv_group;
  bool rope;
  float dropout_p;
  int64_t t, d;
};

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// [B, T, H*D] projections, as the model passes them (H = 4 query heads, 4 / kv_group k/v heads).
struct Problem {
  AttentionProblem p;
  std::vector<float> q, k, v, dout, cos, sin;

  explicit Problem(const Case& c) {
    const int64_t B = 2, H = 4, Hk = H / c.kv_group, T = c.t, D = c.d;
    p.batches = B;
    p.heads_per_batch = H;
    p.tq = p.tk = T;
    p.d = p.dv = D;
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    p.causal = c.causal;
    p.kv_group = c.kv_group;
    p.q = p.out = {T * H * D, D, H * D};
    p.k = p.v = {T * Hk * D, D, Hk * D};
    p.dropout_p = c.dropout_p;
    p.dropout_key = RngKey{21, 22};
    auto fill = [](std::vector<float>& dst, int64_t n, uint64_t seed) {
      Tensor r = test::randn({n}, seed, 0.7f);
      dst.assign(r.data<float>(), r.data<float>() + n);
    };
    fill(q, B * T * H * D, 91);
    fill(k, B * T * Hk * D, 92);
    fill(v, B * T * Hk * D, 93);
    fill(dout, B * T * H * D, 94);
    if (c.rope) {
      std::vector<int32_t> pos(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      cos.resize(static_cast<size_t>(T * D / 2));
      sin.resize(cos.size());
      cpu::rope_tables(cos.data(), sin.data(), pos.data(), T, D, 10000.0f);
      p.rope.cos = cos.data();
      p.rope.sin = sin.data();
    }
  }

  Result run_flash() const {
    Result r;
    r.out.resize(q.size());
    r.lse.resize(static_cast<size_t>(p.heads() * p.tq));
    r.dq.resize(q.size());
    r.dk.resize(k.size());
    r.dv.resize(v.size());
    cpu::flash_attention_forward(p, q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
    cpu::flash_attention_backward(p, q.data(), k.data(), v.data(), r.out.data(), dout.data(), r.lse.data(),
                                  r.dq.data(), r.dk.data(), r.dv.data());
    return r;
  }

  Result run_oracle() const {
    Result r;
    r.out.resize(q.size());
    r.lse.resize(static_cast<size_t>(p.heads() * p.tq));
    r.dq.resize(q.size());
    r.dk.resize(k.size());
    r.dv.resize(v.size());
    cpu::masked_attention_forward(p, nullptr, 0, q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
    cpu::masked_attention_backward(p, nullptr, 0, q.data(), k.data(), v.data(), dout.data(), r.lse.data(),
                                   r.dq.data(), r.dk.data(), r.dv.data());
    return r;
  }
};

Tensor t(const std::vector<float>& v) { return Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v); }

void expect_results_close(const Result& got, const Result& want, float atol, float rtol, const std::string& what,
                          bool with_lse) {
  test::expect_close(t(got.out), t(want.out), atol, rtol, what + " out");
  test::expect_close(t(got.dq), t(want.dq), atol, rtol, what + " dq");
  test::expect_close(t(got.dk), t(want.dk), atol, rtol, what + " dk");
  test::expect_close(t(got.dv), t(want.dv), atol, rtol, what + " dv");
  if (with_lse) test::expect_close(t(got.lse), t(want.lse), atol, rtol, what + " lse");
}

}  // namespace

TEST(AttentionIsa, EveryFlashCopyMatchesTheOracleAndTheScalarCopy) {
  // T = 150 crosses a 128-key block and leaves tails of both tiles; D = 32 is the benchmark model's.
  const Case cases[] = {{"causal", true, 1, false, 0.0f, 150, 32},
                        {"full, grouped-query", false, 2, false, 0.0f, 150, 32},
                        {"causal, RoPE, D 20", true, 1, true, 0.0f, 37, 20},
                        {"causal, RoPE, dropout", true, 2, true, 0.2f, 150, 32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr(c);
    Result scalar;
    {
      cpu::ScopedCpuIsa use(CpuIsa::Scalar);
      scalar = pr.run_flash();
    }
    // The oracle knows no RoPE or dropout: it checks the plain cases; the others are held to the
    // scalar copy, which the attention tests in tests/ops check against the composite reference.
    const bool oracle = !c.rope && c.dropout_p == 0.0f;
    const Result want = oracle ? pr.run_oracle() : Result{};
    for (CpuIsa isa : cpu::supported_cpu_isas()) {
      SCOPED_TRACE(cpu::cpu_isa_name(isa));
      Result got;
      {
        cpu::ScopedCpuIsa use(isa);
        got = pr.run_flash();
      }
      // lse is in the log2 domain for the flash kernels and natural-log for the oracle: compared to the
      // scalar copy only. The same products in the same order; an FMA contracted on one target only
      // moves the last bits.
      if (oracle) expect_results_close(got, want, 3e-5f, 3e-4f, "vs oracle", false);
      expect_results_close(got, scalar, 1e-6f, 1e-5f, "vs scalar copy", true);
    }
  }
}

namespace {

float bf16_round(float x) { return bf16::from_float(x).to_float(); }

std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_round(x[i]);
  return r;
}

float relative_max_error(const std::vector<float>& got, const std::vector<float>& want) {
  return test::max_error_relative_to_max(t(got), t(want));
}

}  // namespace

// bf16 products (AttentionProblem::bf16_products): every output within 3x the error that rounding the
// inputs alone to bf16 costs the f32 kernels (the rest is P and dS rounded before their products), and
// under 1% of the output's largest value. A wrong pair layout is off by O(1).
TEST(AttentionIsa, Bf16ProductsTrackF32WithinBf16Rounding) {
  if (!cpu::cpu_isa_supported(CpuIsa::Avx512) || !cpu::cpu_has_avx512_bf16())
    GTEST_SKIP() << "bf16 products need AVX512-BF16";
  const Case cases[] = {{"causal", true, 1, false, 0.0f, 150, 32},
                        {"full, grouped-query", false, 2, false, 0.0f, 150, 32},
                        {"causal, RoPE, D 20, odd T", true, 1, true, 0.0f, 37, 20},
                        {"causal, RoPE, dropout", true, 2, true, 0.2f, 150, 32},
                        {"causal, D 64, T 300", true, 1, false, 0.0f, 300, 64}};
  cpu::ScopedCpuIsa use(CpuIsa::Avx512);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr(c);
    const Result f32 = pr.run_flash();
    pr.p.bf16_products = true;
    ASSERT_TRUE(cpu::flash_attention_uses_bf16(pr.p));
    const Result got = pr.run_flash();
    Problem in(c);  // the f32 kernels on q, k, v and dO rounded to bf16
    in.q = rounded(in.q);
    in.k = rounded(in.k);
    in.v = rounded(in.v);
    in.dout = rounded(in.dout);
    const Result inputs_rounded = in.run_flash();
    auto check = [](const char* name, const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& rounded_inputs) {
      const float err = relative_max_error(got, want), input_err = relative_max_error(rounded_inputs, want);
      EXPECT_LE(err, 3.0f * input_err) << name;
      EXPECT_LT(err, 0.01f) << name;
      EXPECT_GT(err, 0.0f) << name << ": bitwise the f32 result, so no bf16 product ran";
    };
    check("out", got.out, f32.out, inputs_rounded.out);
    check("dq", got.dq, f32.dq, inputs_rounded.dq);
    check("dk", got.dk, f32.dk, inputs_rounded.dk);
    check("dv", got.dv, f32.dv, inputs_rounded.dv);
  }
}

// The bf16 path keeps the kernels' contract: bitwise the same for any thread count, and copies without
// bf16 products (scalar, AVX2) ignore the flag: bitwise their f32 result.
TEST(AttentionIsa, Bf16ProductsAreDeterministicAndOtherCopiesStayF32) {
  Problem pr({"causal, RoPE, dropout", true, 2, true, 0.2f, 150, 32});
  for (CpuIsa isa : cpu::supported_cpu_isas()) {
    SCOPED_TRACE(cpu::cpu_isa_name(isa));
    cpu::ScopedCpuIsa use(isa);
    pr.p.bf16_products = false;
    const Result f32 = pr.run_flash();
    pr.p.bf16_products = true;
    const bool bf16 = cpu::flash_attention_uses_bf16(pr.p);
    EXPECT_EQ(bf16, isa == CpuIsa::Avx512 && cpu::cpu_has_avx512_bf16());
    const int saved = num_threads();
    set_num_threads(1);
    const Result one = pr.run_flash();
    set_num_threads(3);
    const Result two = pr.run_flash();
    set_num_threads(saved);
    for (const auto& [a, b] : {std::pair{&one.out, &two.out}, {&one.dq, &two.dq}, {&one.dk, &two.dk},
                               {&one.dv, &two.dv}, {&one.lse, &two.lse}})
      EXPECT_EQ(*a, *b) << "thread count changed a bf16 result";
    if (!bf16) {
      EXPECT_EQ(one.out, f32.out);
      EXPECT_EQ(one.dq, f32.dq);
    }
  }
}
