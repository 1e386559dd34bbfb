// Dropout on the attention probabilities in the fused causal_self_attention.
//
// The oracle is causal_self_attention_reference with the same AttentionDropout: it materialises the
// [B, H, T, T] probabilities from basic ops, multiplies them by keep/(1-p) drawn with random_uniform at
// the documented counter, and gets its backward from autodiff. Beyond that: the mask itself against
// random_uniform (read off the output with one-hot values), finite differences, thread counts, p = 0
// being the plain op bit for bit, and the errors.
#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "core/parallel.h"
#include "ops/attention.h"
#include "fixture_check.h"
#include "support/op_test.h"

using namespace loom;
using test::bitwise_equal;
using test::expect_all_close;
using test::run_with_grads;

namespace {

const RngKey kKey = RngKey::from_seed(7).fold_in("attn_dropout");

Tensor positions(int64_t b, int64_t t, bool per_batch) {
  Tensor pos = Tensor::empty(per_batch ? Shape{b, t} : Shape{t}, DType::I32);
  for (int64_t i = 0; i < pos.numel(); ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(per_batch ? (i * 37) % 500 : i);
  return pos;
}

// The counter causal_self_attention documents for (b, h, i, j), written out independently of the kernels.
uint64_t documented_counter(int64_t b, int64_t h, int64_t i, int64_t j, int64_t heads, int64_t t) {
  const int64_t t64 = (t + 63) / 64 * 64;
  return static_cast<uint64_t>(((b * heads + h) * t + i) * t64 + j);
}

struct Case {
  int64_t b, t, h, kv, d;
  bool rope;
  ops::RopeStyle style;
  bool batch_pos;
  float p;
};

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) +
         " Hkv=" + std::to_string(c.kv) + " D=" + std::to_string(c.d) + (c.rope ? " rope" : "") +
         " p=" + std::to_string(c.p);
}

}  // namespace

TEST(AttentionDropout, FusedMatchesCompositeReference) {
  // MHA and GQA (multi-query too), with and without RoPE, T crossing the kernels' query (32) and key
  // (128) blocks and not a multiple of either or of the 64-draw Philox tile, D not a multiple of 16.
  using S = ops::RopeStyle;
  for (Case c : {Case{2, 70, 3, 3, 32, true, S::Interleaved, false, 0.1f},
                 Case{1, 33, 2, 2, 64, true, S::RotateHalf, true, 0.3f},
                 Case{2, 130, 2, 2, 16, false, S::Interleaved, false, 0.3f},
                 Case{2, 70, 4, 2, 32, true, S::RotateHalf, false, 0.5f},
                 Case{1, 45, 4, 1, 10, true, S::Interleaved, true, 0.9f},
                 Case{2, 150, 6, 3, 8, false, S::Interleaved, false, 0.2f},
                 Case{3, 1, 4, 2, 8, true, S::Interleaved, false, 0.3f}}) {
    SCOPED_TRACE(describe(c));
    TensorList qkv = {test::randn({c.b, c.t, c.h * c.d}, 40), test::randn({c.b, c.t, c.kv * c.d}, 41),
                      test::randn({c.b, c.t, c.kv * c.d}, 42)};
    Tensor dy = test::randn({c.b, c.t, c.h * c.d}, 43);
    std::optional<ops::RopeOptions> rope;
    if (c.rope) rope = ops::RopeOptions{positions(c.b, c.t, c.batch_pos), 10000.0f, c.style, {}};
    const ops::AttentionDropout dropout{c.p, kKey};
    const int h = static_cast<int>(c.h), kv = static_cast<int>(c.kv);
    auto fused = run_with_grads(
        [&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], h, rope, kv, dropout); },
        qkv, dy);
    auto composite = run_with_grads(
        [&](const TensorList& in) {
          return ops::causal_self_attention_reference(in[0], in[1], in[2], h, rope, kv, dropout);
        },
        qkv, dy);
    expect_all_close(fused, composite, 3e-5f, 3e-4f, "fused vs composite");
    // Dropout changed something: the oracle comparison above is not between two undropped results.
    auto plain = run_with_grads(
        [&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], h, rope, kv); }, qkv, dy);
    if (c.t > 1) {
      EXPECT_FALSE(bitwise_equal(fused[0], plain[0]));
    }
  }
}

TEST(AttentionDropout, CompositeWithNegligiblePEqualsThePlainReference) {
  // The composite's dropout path (matmuls, softmax, the GQA reshape) against the masked-sdpa path that
  // the PyTorch fixtures check: at p = 2^-24 an element is dropped only when its 24 random bits are all 0.
  const float p = 1.0f / 16777216.0f;
  const int64_t b = 2, t = 40, h = 4, kv = 2, d = 16;
  TensorList qkv = {test::randn({b, t, h * d}, 50), test::randn({b, t, kv * d}, 51), test::randn({b, t, kv * d}, 52)};
  Tensor dy = test::randn({b, t, h * d}, 53);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j <= i; ++j)
          ASSERT_FALSE(random_uniform(kKey, documented_counter(bi, hi, i, j, h, t)) < p) << "pick another key";
  ops::RopeOptions rope{positions(b, t, false), 10000.0f, ops::RopeStyle::RotateHalf, {}};
  auto dropped = run_with_grads([&](const TensorList& in) {
    return ops::causal_self_attention_reference(in[0], in[1], in[2], h, rope, kv, ops::AttentionDropout{p, kKey});
  }, qkv, dy);
  auto plain = run_with_grads([&](const TensorList& in) {
    return ops::causal_self_attention_reference(in[0], in[1], in[2], h, rope, kv);
  }, qkv, dy);
  expect_all_close(dropped, plain, 2e-5f, 2e-4f, "composite p=2^-24 vs plain");
}

TEST(AttentionDropout, MaskIsRandomUniformAtTheDocumentedCounter) {
  // q = 0 makes P_ij = 1/(i+1); v_j = e_j (one-hot, D = T) puts Z_ij P_ij in out[b, i, h*D + j]. So the
  // output shows the mask: zero exactly where random_uniform(key, counter(b, h, i, j)) < p. GQA, so the
  // mask follows the query head; T = 130 crosses key blocks and is not a multiple of 64.
  const int64_t b = 2, t = 130, h = 2, kv = 1, d = t;
  Tensor q = Tensor::zeros({b, t, h * d}), k = test::randn({b, t, kv * d}, 60), v = Tensor::zeros({b, t, kv * d});
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t j = 0; j < t; ++j) v.data<float>()[(bi * t + j) * d + j] = 1.0f;
  for (float p : {0.1f, 0.5f}) {
    SCOPED_TRACE(p);
    Tensor y = ops::causal_self_attention(q, k, v, h, std::nullopt, kv, ops::AttentionDropout{p, kKey});
    int64_t visible = 0, dropped = 0, mismatches = 0;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t i = 0; i < t; ++i)
          for (int64_t j = 0; j < t; ++j) {
            const float got = y.data<float>()[(bi * t + i) * h * d + hi * d + j];
            if (j > i) {
              mismatches += got != 0.0f;
              continue;
            }
            const bool drop = random_uniform(kKey, documented_counter(bi, hi, i, j, h, t)) < p;
            const float want = drop ? 0.0f : 1.0f / ((1.0f - p) * static_cast<float>(i + 1));
            mismatches += drop ? got != 0.0f : std::fabs(got - want) > 1e-5f * want;
            ++visible;
            dropped += drop;
          }
    EXPECT_EQ(mismatches, 0);
    // Binomial(visible, p): 6 standard deviations is a false alarm once in ~10^9 runs.
    const double frac = static_cast<double>(dropped) / static_cast<double>(visible);
    EXPECT_NEAR(frac, p, 6 * std::sqrt(p * (1.0 - p) / static_cast<double>(visible)));
    // Another key, another mask.
    Tensor y2 = ops::causal_self_attention(q, k, v, h, std::nullopt, kv, ops::AttentionDropout{p, kKey.fold_in(1)});
    EXPECT_FALSE(bitwise_equal(y, y2));
  }
}

TEST(AttentionDropout, Gradcheck) {
  // A fixed key makes the dropped function deterministic and smooth in q, k, v.
  Tensor pos = Tensor::from_vector<int32_t>({5}, {3, 1, 1, 8, 2});
  ops::RopeOptions rope{pos, 100.0f, ops::RopeStyle::Interleaved, {}};
  const ops::AttentionDropout dropout{0.3f, kKey};
  {
    SCOPED_TRACE("MHA + RoPE");
    Tensor q = test::param(test::randn({2, 5, 12}, 70)), k = test::param(test::randn({2, 5, 12}, 71)),
           v = test::param(test::randn({2, 5, 12}, 72));
    test::gradcheck([&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], 2, rope, 0, dropout); },
                    {q, k, v});
  }
  {
    SCOPED_TRACE("MQA, no RoPE");
    Tensor q = test::param(test::randn({2, 5, 16}, 73)), k = test::param(test::randn({2, 5, 4}, 74)),
           v = test::param(test::randn({2, 5, 4}, 75));
    test::gradcheck(
        [&](const TensorList& in) { return ops::causal_self_attention(in[0], in[1], in[2], 4, std::nullopt, 1, dropout); },
        {q, k, v});
  }
}

TEST(AttentionDropout, DeterministicAcrossThreadCounts) {
  // 8 heads x T=100: heads are split over threads. 2 heads x T=300: the forward also splits each head's
  // query blocks into spans, differently for 1, 2 and 3 threads.
  struct Shape4 { int64_t b, t, h, kv, d; };
  for (Shape4 c : {Shape4{2, 100, 4, 4, 32}, Shape4{2, 100, 8, 2, 32}, Shape4{1, 300, 2, 2, 32}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " Hkv=" + std::to_string(c.kv));
    TensorList qkv = {test::randn({c.b, c.t, c.h * c.d}, 80), test::randn({c.b, c.t, c.kv * c.d}, 81),
                      test::randn({c.b, c.t, c.kv * c.d}, 82)};
    Tensor dy = test::randn({c.b, c.t, c.h * c.d}, 83);
    ops::RopeOptions rope{positions(c.b, c.t, false), 10000.0f, ops::RopeStyle::Interleaved, {}};
    auto f = [&](const TensorList& in) {
      return ops::causal_self_attention(in[0], in[1], in[2], static_cast<int>(c.h), rope, static_cast<int>(c.kv),
                                        ops::AttentionDropout{0.2f, kKey});
    };
    const auto runs = test::run_on_1_2_3_threads(f, qkv, dy);
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_TRUE(bitwise_equal(runs[0][i], runs[1][i])) << i;
      EXPECT_TRUE(bitwise_equal(runs[0][i], runs[2][i])) << i;
    }
  }
}

TEST(AttentionDropout, ZeroPIsBitwiseTheOpWithoutDropout) {
  const int64_t b = 2, t = 70, h = 4, kv = 2, d = 32;
  TensorList qkv = {test::randn({b, t, h * d}, 90), test::randn({b, t, kv * d}, 91), test::randn({b, t, kv * d}, 92)};
  Tensor dy = test::randn({b, t, h * d}, 93);
  ops::RopeOptions rope{positions(b, t, true), 10000.0f, ops::RopeStyle::RotateHalf, {}};
  for (bool reference : {false, true}) {
    SCOPED_TRACE(reference ? "reference" : "fused");
    auto call = [&](const TensorList& in, const ops::AttentionDropout& dropout) {
      return reference ? ops::causal_self_attention_reference(in[0], in[1], in[2], h, rope, kv, dropout)
                       : ops::causal_self_attention(in[0], in[1], in[2], h, rope, kv, dropout);
    };
    auto zero = run_with_grads([&](const TensorList& in) { return call(in, ops::AttentionDropout{0.0f, kKey}); }, qkv, dy);
    auto none = run_with_grads([&](const TensorList& in) { return call(in, {}); }, qkv, dy);
    for (size_t i = 0; i < zero.size(); ++i) EXPECT_TRUE(bitwise_equal(zero[i], none[i])) << i;
  }
}

TEST(AttentionDropout, MemoryStaysLinearInT) {
  // One head, T=4096, forward and backward with dropout: a [T, T] mask or probability matrix alone would
  // be 64 MiB; the kernels' scratch (from the CPU allocator) must stay at a few [T, D] buffers.
  test::expect_memory_linear_in_t([](const TensorList& in) {
    return ops::causal_self_attention(in[0], in[1], in[2], 1, std::nullopt, 0, ops::AttentionDropout{0.1f, kKey});
  }, 100);
}

TEST(AttentionDropout, BadPIsAnErrorNamingIt) {
  Tensor x = Tensor::zeros({2, 4, 12});
  for (float p : {1.0f, -0.5f, 2.0f}) {
    std::ostringstream want;
    want << "p=" << p;
    test::expect_error_mentions([&] { ops::causal_self_attention(x, x, x, 2, std::nullopt, 0, ops::AttentionDropout{p, kKey}); },
                                {"causal_self_attention", "dropout", want.str(), "[0, 1)"});
    test::expect_error_mentions(
        [&] { ops::causal_self_attention_reference(x, x, x, 2, std::nullopt, 0, ops::AttentionDropout{p, kKey}); },
        {want.str()});
  }
  test::expect_error_mentions(
      [&] {
        ops::causal_self_attention(x, x, x, 2, std::nullopt, 0,
                                   ops::AttentionDropout{std::numeric_limits<float>::quiet_NaN(), kKey});
      },
      {"p=nan"});
}
