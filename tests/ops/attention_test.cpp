#include <algorithm>
#include <cmath>

#include "backends/cpu/attention.h"
#include "core/parallel.h"
#include "fixture_check.h"
#include "ops/attention.h"
#include "ops/elementwise.h"

using namespace loom;
using test::expect_all_close;
using test::run_with_grads;

namespace {

// Flash (causal or unmasked) path: the fixtures' "_causal" and "_scale" entries select the call.
Tensor sdpa_from_fixture(const test::Fixture& f, const std::string& p, const TensorList& in) {
  const bool causal = f.get(p + "causal").data<int32_t>()[0] != 0;
  const float sc = f.get(p + "scale").item();
  Tensor mask = f.has(p + "mask") ? f.get(p + "mask") : Tensor();
  std::optional<float> scale;
  if (sc != 0.0f) scale = sc;
  return ops::scaled_dot_product_attention(in[0], in[1], in[2], mask, causal, scale);
}

// Max |a - b| over all elements.
float max_abs_diff(const Tensor& a, const Tensor& b) {
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return m;
}

bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.data<float>()[i])) return false;
  return true;
}

}  // namespace

// ---- scaled_dot_product_attention -----------------------------------------------------------------

TEST(Attention, SdpaMatchesPyTorch) {
  auto f = test::load_fixture("sdpa");
  for (const char* name : {"plain", "causal_wide", "causal_tall", "causal_square", "mask_full", "mask_shared",
                           "mask_causal", "t1", "long"}) {
    SCOPED_TRACE(name);
    std::string p = std::string(name) + "_";
    test::check_against_fixture(
        f, p, [&](const TensorList& in) { return sdpa_from_fixture(f, p, in); }, {"q", "k", "v"},
        {"dq", "dk", "dv"}, 3e-5f, 2e-4f);
  }
}

TEST(Attention, FullyMaskedRowsGiveZerosNotNaN) {
  // causal with Tq > Tk: rows 0 and 1 see no key. And a mask row that is all false.
  Tensor q = test::param(test::randn({2, 4, 8}, 1)), k = test::param(test::randn({2, 2, 8}, 2)),
         v = test::param(test::randn({2, 2, 8}, 3));
  Tensor y = ops::scaled_dot_product_attention(q, k, v, Tensor(), true);
  for (int64_t i = 0; i < 2 * 8; ++i) EXPECT_EQ(y.data<float>()[i], 0.0f);  // head 0, rows 0-1
  autograd::backward(y, test::randn(y.shape(), 4));
  EXPECT_TRUE(all_finite(q.grad()) && all_finite(k.grad()) && all_finite(v.grad()));
  for (int64_t i = 0; i < 2 * 8; ++i) EXPECT_EQ(q.grad().data<float>()[i], 0.0f);

  Tensor mask = Tensor::zeros({4, 2}, DType::Bool);
  mask.data<bool>()[2 * 2] = true;  // only row 2 may attend (key 0)
  Tensor y2 = ops::scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), mask);
  EXPECT_TRUE(all_finite(y2));
  EXPECT_EQ(y2.data<float>()[0], 0.0f);
  EXPECT_EQ(y2.data<float>()[2 * 8], v.data<float>()[0]);  // one key: its value exactly
}

TEST(Attention, CausalFlashEqualsMaskedLowerTriangle) {
  // Shapes that cross the kernel's query (32) and key (64) blocks and D not a multiple of 16.
  struct Case { int64_t n, t, d; };
  for (Case c : {Case{3, 1, 6}, Case{2, 77, 10}, Case{1, 130, 32}, Case{2, 65, 64}, Case{1, 40, 72}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " D=" + std::to_string(c.d));
    TensorList qkv = {test::randn({c.n, c.t, c.d}, 10), test::randn({c.n, c.t, c.d}, 11),
                      test::randn({c.n, c.t, c.d}, 12)};
    Tensor dy = test::randn({c.n, c.t, c.d}, 13);
    auto flash = run_with_grads([](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), true);
    }, qkv, dy);
    auto masked = run_with_grads([&](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], ops::causal_mask(c.t), false);
    }, qkv, dy);
    expect_all_close(flash, masked, 2e-5f, 2e-4f, "flash vs masked");
  }
}

TEST(Attention, NonCausalFlashEqualsMaskedAllTrueWithTqNotTk) {
  TensorList qkv = {test::randn({2, 3, 45, 10}, 20), test::randn({2, 3, 70, 10}, 21),
                    test::randn({2, 3, 70, 5}, 22)};
  Tensor dy = test::randn({2, 3, 45, 5}, 23);
  Tensor mask = Tensor::zeros({45, 70}, DType::Bool);
  std::fill(mask.data<bool>(), mask.data<bool>() + mask.numel(), true);
  for (bool causal : {false, true}) {
    Tensor m = mask;
    if (causal) {  // causal with Tk > Tq: query i sees keys j <= i + 25
      m = mask.clone();
      for (int i = 0; i < 45; ++i)
        for (int j = 0; j < 70; ++j) m.data<bool>()[i * 70 + j] = j <= i + 25;
    }
    auto flash = run_with_grads([&](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), causal, 0.2f);
    }, qkv, dy);
    auto masked = run_with_grads([&](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], m, false, 0.2f);
    }, qkv, dy);
    expect_all_close(flash, masked, 2e-5f, 2e-4f, causal ? "causal Tq<Tk" : "full");
  }
}

TEST(Attention, OnlineSoftmaxRescalesAcrossKeyBlocks) {
  // Keys grow with j, so every later key block (128 keys) raises a row's running max and the kernel
  // must rescale what it accumulated (scaled logits reach ~20).
  const int64_t t = 300, d = 16;
  Tensor q = test::randn({2, t, d}, 80), k = test::randn({2, t, d}, 81), v = test::randn({2, t, d}, 82);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t j = 0; j < t; ++j)
      for (int64_t c = 0; c < d; ++c) {
        k.data<float>()[(n * t + j) * d + c] = 0.5f + 0.02f * static_cast<float>(j);
        q.data<float>()[(n * t + j) * d + c] = std::fabs(q.data<float>()[(n * t + j) * d + c]);
      }
  Tensor dy = test::randn({2, t, d}, 83);
  for (bool causal : {false, true}) {
    auto flash = run_with_grads([&](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), causal);
    }, {q, k, v}, dy);
    Tensor mask = causal ? ops::causal_mask(t) : Tensor::empty({t, t}, DType::Bool);
    if (!causal) std::fill(mask.data<bool>(), mask.data<bool>() + mask.numel(), true);
    auto masked = run_with_grads([&](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], mask, false);
    }, {q, k, v}, dy);
    expect_all_close(flash, masked, 1e-4f, 1e-3f, causal ? "causal" : "full");
    EXPECT_TRUE(all_finite(flash[0]) && all_finite(flash[1]));
  }
}

TEST(Attention, GradcheckFlashAndMasked) {
  Tensor q = test::param(test::randn({2, 5, 6}, 30)), k = test::param(test::randn({2, 7, 6}, 31)),
         v = test::param(test::randn({2, 7, 3}, 32));
  test::gradcheck([](const TensorList& in) {
    return ops::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), true);
  }, {q, k, v});
  Tensor mask = Tensor::empty({2, 5, 7}, DType::Bool);
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = (i * 7 % 5) != 0;
  test::gradcheck([&](const TensorList& in) {
    return ops::scaled_dot_product_attention(in[0], in[1], in[2], mask, false);
  }, {q, k, v});
}

TEST(Attention, SdpaInvalidInputsNameTheValues) {
  Tensor q = Tensor::zeros({2, 4, 8}), k = Tensor::zeros({2, 5, 8}), v = Tensor::zeros({2, 5, 8});
  test::expect_error_mentions([&] { ops::scaled_dot_product_attention(q, Tensor::zeros({2, 5, 6}), v); },
                              {"D=8", "D=6"});
  test::expect_error_mentions([&] { ops::scaled_dot_product_attention(q, k, Tensor::zeros({2, 4, 8})); },
                              {"Tk=5", "4 rows"});
  test::expect_error_mentions([&] { ops::scaled_dot_product_attention(q, Tensor::zeros({3, 5, 8}), v); },
                              {"[2, 4, 8]", "[3, 5, 8]"});
  test::expect_error_mentions([&] { ops::scaled_dot_product_attention(q, k, v, Tensor::zeros({4, 4}, DType::Bool)); },
                              {"mask has shape [4, 4]", "[4, 5]"});
  // No query heads over one k/v head (issue 32's Python harness: 0 % 1 == 0 made it "grouped", then 0 / 0
  // killed the process with SIGFPE).
  test::expect_error_mentions(
      [&] { ops::scaled_dot_product_attention(Tensor::zeros({0, 4, 8}), Tensor::zeros({1, 5, 8}), Tensor::zeros({1, 5, 8})); },
      {"leading dimensions differ", "[0, 4, 8]"});
}

// ---- causal_self_attention ------------------------------------------------------------------------

TEST(Attention, CausalSelfAttentionMatchesPyTorch) {
  auto f = test::load_fixture("causal_self_attention");
  struct Case { const char* name; int heads; bool rope; ops::RopeStyle style; };
  for (Case c : {Case{"norope", 3, false, ops::RopeStyle::Interleaved},
                 Case{"interleaved", 2, true, ops::RopeStyle::Interleaved},
                 Case{"half_batchpos", 2, true, ops::RopeStyle::RotateHalf},
                 Case{"t1", 2, true, ops::RopeStyle::Interleaved}}) {
    SCOPED_TRACE(c.name);
    std::string p = std::string(c.name) + "_";
    std::optional<ops::RopeOptions> rope;
    if (c.rope) rope = ops::RopeOptions{f.get(p + "pos"), 10000.0f, c.style, {}};
    for (bool reference : {false, true}) {
      SCOPED_TRACE(reference ? "reference composite" : "fused");
      test::check_against_fixture(
          f, p, [&](const TensorList& in) {
            return reference ? ops::causal_self_attention_reference(in[0], in[1], in[2], c.heads, rope)
                             : ops::causal_self_attention(in[0], in[1], in[2], c.heads, rope);
          }, {"q", "k", "v"}, {"dq", "dk", "dv"}, 3e-5f, 2e-4f);
    }
  }
}

TEST(Attention, FusedEqualsCompositeAtModelShapes) {
  // The benchmark model's head size (D=32) and D=64, T crossing blocks, both RoPE styles, [B,T] positions.
  struct Case { int64_t b, t, h, d; ops::RopeStyle style; bool batch_pos; };
  for (Case c : {Case{2, 70, 3, 32, ops::RopeStyle::Interleaved, false},
                 Case{1, 33, 2, 64, ops::RopeStyle::RotateHalf, true},
                 Case{3, 1, 4, 10, ops::RopeStyle::RotateHalf, false}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " D=" + std::to_string(c.d));
    const int64_t w = c.h * c.d;
    TensorList qkv = {test::randn({c.b, c.t, w}, 40), test::randn({c.b, c.t, w}, 41), test::randn({c.b, c.t, w}, 42)};
    Tensor dy = test::randn({c.b, c.t, w}, 43);
    Tensor pos;
    if (c.batch_pos) {
      pos = Tensor::empty({c.b, c.t}, DType::I32);
      for (int64_t i = 0; i < pos.numel(); ++i) pos.data<int32_t>()[i] = static_cast<int32_t>((i * 37) % 500);
    } else {
      pos = Tensor::empty({c.t}, DType::I32);
      for (int64_t i = 0; i < c.t; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(i);
    }
    ops::RopeOptions rope{pos, 10000.0f, c.style, {}};
    auto fused = run_with_grads([&](const TensorList& in) {
      return ops::causal_self_attention(in[0], in[1], in[2], static_cast<int>(c.h), rope);
    }, qkv, dy);
    auto composite = run_with_grads([&](const TensorList& in) {
      return ops::causal_self_attention_reference(in[0], in[1], in[2], static_cast<int>(c.h), rope);
    }, qkv, dy);
    expect_all_close(fused, composite, 3e-5f, 3e-4f, "fused vs composite");
  }
}

TEST(Attention, GradcheckCausalSelfAttention) {
  Tensor pos = Tensor::from_vector<int32_t>({4}, {3, 1, 1, 8});  // arbitrary, repeated positions
  Tensor q = test::param(test::randn({2, 4, 12}, 50)), k = test::param(test::randn({2, 4, 12}, 51)),
         v = test::param(test::randn({2, 4, 12}, 52));
  for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf}) {
    ops::RopeOptions rope{pos, 100.0f, style, {}};
    test::gradcheck([&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], 2, rope); },
                    {q, k, v});
  }
}

TEST(Attention, DeterministicAcrossThreadCounts) {
  // Large enough (8 heads x T=100 x D=32) for the kernels to split the heads over threads.
  TensorList qkv = {test::randn({2, 100, 128}, 60), test::randn({2, 100, 128}, 61), test::randn({2, 100, 128}, 62)};
  Tensor dy = test::randn({2, 100, 128}, 63);
  Tensor pos = Tensor::empty({100}, DType::I32);
  for (int i = 0; i < 100; ++i) pos.data<int32_t>()[i] = i;
  auto f = [&](const TensorList& in) {
    return ops::causal_self_attention(in[0], in[1], in[2], 4, ops::RopeOptions{pos, 10000.0f, ops::RopeStyle::Interleaved, {}});
  };
  const auto [one, two, three] = test::run_on_1_2_3_threads(f, qkv, dy);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(max_abs_diff(one[i], two[i]), 0.0f) << i;
    EXPECT_EQ(max_abs_diff(one[i], three[i]), 0.0f) << i;
  }
}

TEST(Attention, EmptySequencesAndBatches) {
  for (Shape shape : {Shape{2, 0, 8}, Shape{0, 3, 8}}) {
    Tensor q = test::param(Tensor::zeros(shape)), k = test::param(Tensor::zeros(shape)),
           v = test::param(Tensor::zeros(shape));
    Tensor y = ops::causal_self_attention(q, k, v, 2);
    EXPECT_EQ(y.shape(), shape);
    autograd::backward(y, Tensor::zeros(shape));
    EXPECT_EQ(q.grad().shape(), shape);
  }
  // Tk = 0: every query row sees nothing.
  Tensor y = ops::scaled_dot_product_attention(test::randn({2, 3, 4}, 1), Tensor::zeros({2, 0, 4}),
                                               Tensor::zeros({2, 0, 5}));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], 0.0f);
}

TEST(Attention, CausalSelfAttentionInvalidInputsNameTheValues) {
  Tensor x = Tensor::zeros({2, 4, 12});
  test::expect_error_mentions([&] { ops::causal_self_attention(x, x, x, 5); }, {"num_heads=5", "12"});
  test::expect_error_mentions([&] { ops::causal_self_attention(x, x, Tensor::zeros({2, 4, 8}), 2); },
                              {"[2, 4, 12]", "[2, 4, 8]"});
  Tensor pos = Tensor::from_vector<int32_t>({4}, {0, 1, 2, 3});
  test::expect_error_mentions([&] { ops::causal_self_attention(x, x, x, 4, ops::RopeOptions{pos, 10000.0f, ops::RopeStyle::Interleaved, {}}); },
                              {"D=3", "even"});
  test::expect_error_mentions(
      [&] { ops::causal_self_attention(x, x, x, 2, ops::RopeOptions{Tensor::zeros({3}, DType::I32), 10000.0f, ops::RopeStyle::Interleaved, {}}); },
      {"[3]", "[4]", "[2, 4]"});
}

TEST(Attention, CausalMemoryIsLinearInT) {
  // One head, T=4096: a materialised score matrix alone would be T*T*4 = 64 MiB. The flash path's
  // scratch comes from the CPU allocator, so its peak shows in the allocator statistics.
  const int64_t growth = test::expect_memory_linear_in_t(
      [](const TensorList& in) { return ops::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), true); }, 70);
  RecordProperty("peak_growth_bytes", static_cast<int>(growth));
}

// ---- grouped-query attention ----------------------------------------------------------------------

namespace {

// [B, T, Hkv*D] -> [B, T, H*D]: k/v head h / group copied to every query head h of its group.
Tensor repeat_kv_heads(const Tensor& x, int64_t heads, int64_t kv_heads) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2) / kv_heads, group = heads / kv_heads;
  Tensor out = Tensor::empty({b, t, heads * d});
  for (int64_t r = 0; r < b * t; ++r)
    for (int64_t h = 0; h < heads; ++h)
      std::copy(x.data<float>() + r * kv_heads * d + (h / group) * d, x.data<float>() + r * kv_heads * d + (h / group + 1) * d,
                out.data<float>() + r * heads * d + h * d);
  return out;
}

// The gradient of repeat_kv_heads: each k/v head's gradient is the sum over its group, in head order.
Tensor sum_kv_groups(const Tensor& g, int64_t heads, int64_t kv_heads) {
  const int64_t b = g.size(0), t = g.size(1), d = g.size(2) / heads, group = heads / kv_heads;
  Tensor out = Tensor::zeros({b, t, kv_heads * d});
  for (int64_t r = 0; r < b * t; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < d; ++c)
        out.data<float>()[r * kv_heads * d + (h / group) * d + c] += g.data<float>()[r * heads * d + h * d + c];
  return out;
}

}  // namespace

TEST(Attention, GroupedQueryEqualsMultiHeadOnRepeatedKvHeads) {
  // The oracle is ordinary multi-head attention on k/v heads repeated to every query head, whose k/v
  // gradients summed over each group are the grouped gradients. Fused (flash) and composite (masked)
  // paths both; T crosses the key/query blocks; multi-query (1 k/v head) included.
  struct Case { int64_t b, t, h, kv, d; bool batch_pos; };
  for (Case c : {Case{2, 70, 4, 2, 32, false}, Case{1, 33, 4, 1, 16, true}, Case{2, 5, 6, 3, 8, false}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " Hkv=" + std::to_string(c.kv));
    Tensor q = test::randn({c.b, c.t, c.h * c.d}, 80), k = test::randn({c.b, c.t, c.kv * c.d}, 81),
           v = test::randn({c.b, c.t, c.kv * c.d}, 82), dy = test::randn({c.b, c.t, c.h * c.d}, 83);
    Tensor pos = Tensor::empty(c.batch_pos ? Shape{c.b, c.t} : Shape{c.t}, DType::I32);
    for (int64_t i = 0; i < pos.numel(); ++i) pos.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 300);
    ops::RopeOptions rope{pos, 10000.0f, ops::RopeStyle::RotateHalf, {}};
    const int h = static_cast<int>(c.h), kv = static_cast<int>(c.kv);
    auto repeated = run_with_grads([&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], h, rope); },
                                   {q, repeat_kv_heads(k, c.h, c.kv), repeat_kv_heads(v, c.h, c.kv)}, dy);
    TensorList want = {repeated[0], repeated[1], sum_kv_groups(repeated[2], c.h, c.kv), sum_kv_groups(repeated[3], c.h, c.kv)};
    auto fused = run_with_grads(
        [&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], h, rope, kv); }, {q, k, v}, dy);
    expect_all_close(fused, want, 2e-5f, 2e-4f, "fused GQA vs repeated heads");
    auto composite = run_with_grads(
        [&](const TensorList& in) { return ops::causal_self_attention_reference(in[0], in[1], in[2], h, rope, kv); },
        {q, k, v}, dy);
    expect_all_close(composite, want, 2e-5f, 2e-4f, "composite GQA vs repeated heads");
  }
}

TEST(Attention, SdpaWithFewerKvHeadsEqualsRepeatedHeads) {
  // q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D]: the KV-cache decoding layout. Causal flash, and masked.
  const int64_t b = 2, hq = 4, hkv = 2, tq = 3, tk = 9, d = 8;
  Tensor q = test::randn({b, hq, tq, d}, 90), k = test::randn({b, hkv, tk, d}, 91), v = test::randn({b, hkv, tk, d}, 92);
  Tensor dy = test::randn({b, hq, tq, d}, 93);
  auto expand = [&](const Tensor& x) {  // [B, Hkv, T, D] -> [B, Hq, T, D]
    Tensor out = Tensor::empty({b, hq, x.size(2), d});
    const int64_t n = x.size(2) * d;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < hq; ++h)
        std::copy(x.data<float>() + (bi * hkv + h / (hq / hkv)) * n, x.data<float>() + (bi * hkv + h / (hq / hkv) + 1) * n,
                  out.data<float>() + (bi * hq + h) * n);
    return out;
  };
  auto fold = [&](const Tensor& g) {  // the gradient of expand
    Tensor out = Tensor::zeros({b, hkv, g.size(2), d});
    const int64_t n = g.size(2) * d;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t i = 0; i < n; ++i) out.data<float>()[(bi * hkv + h / (hq / hkv)) * n + i] += g.data<float>()[(bi * hq + h) * n + i];
    return out;
  };
  Tensor mask = Tensor::empty({tq, tk}, DType::Bool);
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = (i * 5) % 3 != 0;
  for (bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "masked" : "causal flash");
    auto f = [&](const TensorList& in) {
      return ops::scaled_dot_product_attention(in[0], in[1], in[2], masked ? mask : Tensor(), !masked);
    };
    auto repeated = run_with_grads(f, {q, expand(k), expand(v)}, dy);
    auto grouped = run_with_grads(f, {q, k, v}, dy);
    expect_all_close(grouped, {repeated[0], repeated[1], fold(repeated[2]), fold(repeated[3])}, 2e-5f, 2e-4f, "sdpa GQA");
  }
  test::expect_error_mentions([&] { ops::scaled_dot_product_attention(q, test::randn({b, 3, tk, d}, 1), test::randn({b, 3, tk, d}, 2)); },
                              {"[2, 4, 3, 8]", "[2, 3, 9, 8]", "fewer heads"});
}

TEST(Attention, GroupedQueryGradcheckAndDeterminism) {
  Tensor pos = Tensor::from_vector<int32_t>({4}, {3, 1, 1, 8});
  Tensor q = test::param(test::randn({2, 4, 16}, 100)), k = test::param(test::randn({2, 4, 4}, 101)),
         v = test::param(test::randn({2, 4, 4}, 102));
  ops::RopeOptions rope{pos, 100.0f, ops::RopeStyle::Interleaved, {}};
  test::gradcheck([&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], 4, rope, 1); },
                  {q, k, v});
  // Big enough to split k/v groups over threads: bitwise the same for 1, 2 and 3 threads.
  TensorList qkv = {test::randn({2, 100, 256}, 110), test::randn({2, 100, 64}, 111), test::randn({2, 100, 64}, 112)};
  Tensor dy = test::randn({2, 100, 256}, 113);
  auto f = [&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], 8, std::nullopt, 2); };
  const auto runs = test::run_on_1_2_3_threads(f, qkv, dy);
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(max_abs_diff(runs[0][i], runs[1][i]), 0.0f) << i;
    EXPECT_EQ(max_abs_diff(runs[0][i], runs[2][i]), 0.0f) << i;
  }
  Tensor x = Tensor::zeros({2, 4, 12});
  test::expect_error_mentions([&] { ops::causal_self_attention(x, x, x, 2, std::nullopt, 4); },
                              {"num_kv_heads=4", "num_heads=2"});
  test::expect_error_mentions([&] { ops::causal_self_attention(x, Tensor::zeros({2, 4, 4}), x, 3, std::nullopt, 1); },
                              {"[2, 4, 4]", "[2, 4, 12]"});
}

// The ops pass MatmulPrecision::BF16 on to the flash kernels: bf16 products where the CPU has them (close
// to f32, not equal), and exactly the f32 result where it has not or where the masked kernel runs.
TEST(Attention, Bf16PrecisionReachesTheFlashKernels) {
  AttentionProblem probe;
  probe.bf16_products = true;
  const bool bf16 = cpu::flash_attention_uses_bf16(probe);
  const int64_t B = 2, T = 40, H = 2, D = 16;
  const TensorList qkv = {test::randn({B, T, H * D}, 11), test::randn({B, T, H * D}, 12), test::randn({B, T, H * D}, 13)};
  const Tensor dy = test::randn({B, T, H * D}, 14);
  auto fused = [&](ops::MatmulPrecision precision) {
    return run_with_grads([&](const TensorList& in) {
      return ops::causal_self_attention(in[0], in[1], in[2], static_cast<int>(H), std::nullopt, 0, {}, precision);
    }, qkv, dy);
  };
  auto sdpa = [&](ops::MatmulPrecision precision, bool masked) {
    return run_with_grads([&](const TensorList& in) {
      Tensor q = ops::split_heads(in[0], static_cast<int>(H)), k = ops::split_heads(in[1], static_cast<int>(H));
      Tensor v = ops::split_heads(in[2], static_cast<int>(H));
      return ops::merge_heads(ops::scaled_dot_product_attention(q, k, v, masked ? ops::causal_mask(T) : Tensor(),
                                                                !masked, std::nullopt, precision));
    }, qkv, dy);
  };
  auto check = [&](const TensorList& f32, const TensorList& mixed) {
    for (size_t i = 0; i < f32.size(); ++i) {
      const float diff = max_abs_diff(f32[i], mixed[i]);
      if (bf16) {
        EXPECT_GT(diff, 0.0f) << "output " << i << ": no bf16 product ran";
        test::expect_close(mixed[i], f32[i], 0.03f, 0.03f, "bf16 against f32");
      } else {
        EXPECT_EQ(diff, 0.0f) << "output " << i << ": no bf16 dot product here, so f32 bits";
      }
    }
  };
  check(fused(ops::MatmulPrecision::F32), fused(ops::MatmulPrecision::BF16));
  check(sdpa(ops::MatmulPrecision::F32, false), sdpa(ops::MatmulPrecision::BF16, false));
  const TensorList masked_f32 = sdpa(ops::MatmulPrecision::F32, true), masked_bf16 = sdpa(ops::MatmulPrecision::BF16, true);
  for (size_t i = 0; i < masked_f32.size(); ++i) EXPECT_EQ(max_abs_diff(masked_f32[i], masked_bf16[i]), 0.0f) << i;
}

// bf16 products with Tq != Tk and Dv != D (DeepSeek-V3's MLA has Dv != D) over two key blocks, causal
// (with the Tk - Tq offset) and not: each output within 3x the error that rounding q, k, v and dy alone to
// bf16 costs the f32 kernels, so a pair layout that mixes up D and Dv, or Tq and Tk, cannot pass (one that
// offset the second key block's V pairs by D instead of Dv was tried, and failed).
TEST(Attention, Bf16ProductsWithTqNotTkAndDvNotD) {
  AttentionProblem probe;
  probe.bf16_products = true;
  if (!cpu::flash_attention_uses_bf16(probe)) GTEST_SKIP() << "no bf16 attention products on this CPU";
  auto rounded = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const TensorList qkv = {test::randn({2, 3, 37, 24}, 21), test::randn({2, 3, 150, 24}, 22),
                            test::randn({2, 3, 150, 40}, 23)};
    const Tensor dy = test::randn({2, 3, 37, 40}, 24);
    auto run = [&](const TensorList& in, const Tensor& g, ops::MatmulPrecision precision) {
      return run_with_grads([&](const TensorList& x) {
        return ops::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), causal, std::nullopt, precision);
      }, in, g);
    };
    const TensorList f32 = run(qkv, dy, ops::MatmulPrecision::F32);
    const TensorList bf16 = run(qkv, dy, ops::MatmulPrecision::BF16);
    const TensorList inputs_rounded =
        run({rounded(qkv[0]), rounded(qkv[1]), rounded(qkv[2])}, rounded(dy), ops::MatmulPrecision::F32);
    const char* names[] = {"y", "dq", "dk", "dv"};
    for (size_t i = 0; i < f32.size(); ++i) {
      const float err = test::max_error_relative_to_max(bf16[i], f32[i]);
      const float input_err = test::max_error_relative_to_max(inputs_rounded[i], f32[i]);
      EXPECT_LE(err, 3.0f * input_err) << names[i];
      EXPECT_LT(err, 0.01f) << names[i];
      EXPECT_GT(err, 0.0f) << names[i];
    }
  }
}

// ---- document masking (packed rows) --------------------------------------------------------------

namespace {
// key_begin [B, T] of rows packing documents of the given lengths (the rest of a row: one more document).
Tensor key_begin_of(const std::vector<std::vector<int64_t>>& docs, int64_t t) {
  Tensor kb = Tensor::empty({static_cast<int64_t>(docs.size()), t}, DType::I32);
  for (size_t r = 0; r < docs.size(); ++r) {
    int64_t start = 0;
    for (int64_t n : docs[r]) {
      for (int64_t i = start; i < start + n; ++i) kb.data<int32_t>()[r * t + i] = static_cast<int32_t>(start);
      start += n;
    }
    for (int64_t i = start; i < t; ++i) kb.data<int32_t>()[r * t + i] = static_cast<int32_t>(start);
  }
  return kb;
}
}  // namespace

TEST(Attention, DocumentMaskingEqualsTheDenseBlockDiagonalMask) {
  // Rows of 300 positions: documents that cross the kernels' 128-key and 32-query blocks and start
  // mid-block (the skipped leading key blocks, the partly masked ones), grouped-query heads, RoPE
  // positions restarting per document ([B, T]), and a row holding one document (the plain causal case).
  const int64_t b = 2, t = 300, h = 4, hkv = 2, d = 16;
  Tensor kb = key_begin_of({{45, 150, 70}, {300}}, t);
  Tensor pos = Tensor::empty({b, t}, DType::I32);
  for (int64_t i = 0; i < b * t; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(i % t - kb.data<int32_t>()[i]);
  ops::RopeOptions rope{pos, 10000.0f, ops::RopeStyle::RotateHalf, {}};
  TensorList qkv = {test::randn({b, t, h * d}, 80), test::randn({b, t, hkv * d}, 81), test::randn({b, t, hkv * d}, 82)};
  Tensor dy = test::randn({b, t, h * d}, 83);
  auto fused = run_with_grads([&](const TensorList& in) {
    return ops::causal_self_attention(in[0], in[1], in[2], static_cast<int>(h), rope, static_cast<int>(hkv), {},
                                      ops::MatmulPrecision::F32, kb);
  }, qkv, dy);
  auto dense = run_with_grads([&](const TensorList& in) {
    return ops::causal_self_attention_reference(in[0], in[1], in[2], static_cast<int>(h), rope, static_cast<int>(hkv),
                                                {}, kb);
  }, qkv, dy);
  expect_all_close(fused, dense, 3e-5f, 3e-4f, "document-masked flash vs dense mask");
  // And each document alone is ordinary causal attention: row 0's second document (positions 45..194).
  auto slice = [&](const Tensor& x, int64_t from, int64_t n) {
    const int64_t c = x.size(2);
    Tensor out = Tensor::empty({1, n, c});
    std::copy(x.data<float>() + from * c, x.data<float>() + (from + n) * c, out.data<float>());
    return out;
  };
  Tensor pos_doc = Tensor::empty({150}, DType::I32);
  for (int i = 0; i < 150; ++i) pos_doc.data<int32_t>()[i] = i;
  Tensor alone = ops::causal_self_attention(slice(qkv[0], 45, 150), slice(qkv[1], 45, 150), slice(qkv[2], 45, 150),
                                            static_cast<int>(h), ops::RopeOptions{pos_doc, 10000.0f, ops::RopeStyle::RotateHalf, {}},
                                            static_cast<int>(hkv));
  EXPECT_LT(max_abs_diff(alone, slice(fused[0], 45, 150)), 1e-5f);
  // Determinism over threads holds with the mask too.
  auto f = [&](const TensorList& in) {
    return ops::causal_self_attention(in[0], in[1], in[2], static_cast<int>(h), rope, static_cast<int>(hkv), {},
                                      ops::MatmulPrecision::F32, kb);
  };
  const auto [one, two, three] = test::run_on_1_2_3_threads(f, qkv, dy);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(max_abs_diff(one[i], two[i]), 0.0f) << i;
    EXPECT_EQ(max_abs_diff(one[i], three[i]), 0.0f) << i;
  }
}

TEST(Attention, SdpaDocumentMaskingEqualsTheDenseBlockDiagonalMask) {
  // scaled_dot_product_attention on [B, H, T, D] heads (MLA's: q/k of width D, v of another Dv) with
  // key_begin: every head of row b reads row b's documents; the same as the dense [B, H, T, T] mask.
  const int64_t b = 2, t = 300, h = 3, d = 12, dv = 8;
  Tensor kb = key_begin_of({{45, 150, 70}, {130, 170}}, t);
  Tensor mask = Tensor::empty({b, h, t, t}, DType::Bool);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j)
          mask.data<bool>()[((r * h + hh) * t + i) * t + j] = j <= i && j >= kb.data<int32_t>()[r * t + i];
  TensorList qkv = {test::randn({b, h, t, d}, 90), test::randn({b, h, t, d}, 91), test::randn({b, h, t, dv}, 92)};
  Tensor dy = test::randn({b, h, t, dv}, 93);
  auto fused = run_with_grads([&](const TensorList& in) {
    return ops::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), true, 0.3f, ops::MatmulPrecision::F32, kb);
  }, qkv, dy);
  auto dense = run_with_grads([&](const TensorList& in) {
    return ops::scaled_dot_product_attention(in[0], in[1], in[2], mask, false, 0.3f);
  }, qkv, dy);
  expect_all_close(fused, dense, 3e-5f, 3e-4f, "sdpa with key_begin vs dense mask");
  test::expect_error_mentions([&] { ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], Tensor(), false, 0.3f,
                                                                      ops::MatmulPrecision::F32, kb); },
                              {"key_begin", "causal"});
}

TEST(Attention, DocumentMaskingRefusesKeyBeginsAfterTheirPosition) {
  TensorList qkv = {test::randn({1, 4, 8}, 90), test::randn({1, 4, 8}, 91), test::randn({1, 4, 8}, 92)};
  Tensor kb = Tensor::from_vector<int32_t>({1, 4}, {0, 0, 3, 2});  // position 2 cannot start at 3
  test::expect_error_mentions([&] { ops::causal_self_attention(qkv[0], qkv[1], qkv[2], 2, std::nullopt, 0, {},
                                                               ops::MatmulPrecision::F32, kb); },
                              {"key_begin[0, 2] = 3"});
  Tensor wrong = Tensor::from_vector<int32_t>({4}, {0, 0, 0, 0});
  test::expect_error_mentions([&] { ops::causal_self_attention(qkv[0], qkv[1], qkv[2], 2, std::nullopt, 0, {},
                                                               ops::MatmulPrecision::F32, wrong); },
                              {"key_begin has shape", "[1, 4]"});
}
