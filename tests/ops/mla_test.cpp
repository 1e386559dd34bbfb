// ops/mla.h: MLA's head layouts against the basic ops they replace (bitwise: the same copies and the
// same rotation), forward and backward, with shared and per-row (packed) positions, and their errors.
#include "fixture_check.h"
#include "ops/elementwise.h"
#include "ops/mla.h"
#include "ops/shape.h"

using namespace loom;

namespace {

constexpr int64_t B = 2, T = 5, H = 3, N = 4, P = 6, Dv = 2;

// The composition MultiHeadLatentAttention used before: split heads, narrow nope and rope, rope, concat.
Tensor composed_queries(const Tensor& q, const Tensor& positions, const ops::RopeCache& cache) {
  Tensor qh = ops::transpose(ops::reshape(q, {B, T, H, N + P}), 1, 2);  // [B, H, T, N+P]
  Tensor pos = positions;
  if (positions.ndim() == 2) {  // [B, T] -> [B, H, T]
    pos = Tensor::empty({B, H, T}, DType::I32);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[(b * H + h) * T + t] = positions.data<int32_t>()[b * T + t];
  }
  Tensor rope = ops::rope(ops::narrow(qh, -1, N, P), pos, cache, ops::RopeStyle::RotateHalf);
  return ops::concat({ops::narrow(qh, -1, 0, N), rope}, -1);
}

std::pair<Tensor, Tensor> composed_keys(const Tensor& kv_b, const Tensor& k_rope, const Tensor& positions,
                                        const ops::RopeCache& cache) {
  Tensor rotated = ops::rope(k_rope, positions, cache, ops::RopeStyle::RotateHalf);  // [B, T, P]
  Tensor kv = ops::transpose(ops::reshape(kv_b, {B, T, H, N + Dv}), 1, 2);            // [B, H, T, N+Dv]
  Tensor shared = ops::reshape(rotated, {B, 1, T, P});
  Tensor k = ops::concat({ops::narrow(kv, -1, 0, N), ops::concat(TensorList(H, shared), 1)}, -1);
  return {k, ops::narrow(kv, -1, N, Dv)};
}

struct HeadsRun {
  Tensor q_heads, k, v, dq, dkv, dk_rope;
};

HeadsRun run(bool fused, const Tensor& positions, const ops::RopeCache& cache) {
  Tensor q = test::param(test::randn({B, T, H * (N + P)}, 1));
  Tensor kv_b = test::param(test::randn({B, T, H * (N + Dv)}, 2));
  Tensor k_rope = test::param(test::randn({B, T, P}, 3));
  HeadsRun r;
  r.q_heads = fused ? ops::mla_query_heads(q, H, N, P, positions, cache) : composed_queries(q, positions, cache);
  std::tie(r.k, r.v) = fused ? ops::mla_key_value_heads(kv_b, k_rope, H, N, Dv, positions, cache)
                             : composed_keys(kv_b, k_rope, positions, cache);
  // One scalar through all three outputs, weighted so that every element matters.
  Tensor loss = ops::add(ops::add(ops::sum(ops::mul(r.q_heads, test::randn(r.q_heads.shape(), 4))),
                                  ops::sum(ops::mul(r.k, test::randn(r.k.shape(), 5)))),
                         ops::sum(ops::mul(r.v, test::randn(r.v.shape(), 6))));
  loss.backward();
  r.dq = q.grad();
  r.dkv = kv_b.grad();
  r.dk_rope = k_rope.grad();
  return r;
}

}  // namespace

TEST(MlaHeads, EqualTheComposedOpsBitwiseForwardAndBackward) {
  const ops::RopeCache cache = ops::make_rope_cache(16, P, 10000.0f);
  Tensor shared = Tensor::from_vector<int32_t>({T}, {0, 1, 2, 3, 4});
  Tensor packed = Tensor::from_vector<int32_t>({B, T}, {0, 1, 2, 0, 1, 7, 8, 0, 1, 2});  // documents restarting
  for (const Tensor& positions : {shared, packed}) {
    SCOPED_TRACE(positions.ndim() == 1 ? "positions [T]" : "positions [B, T]");
    const HeadsRun want = run(false, positions, cache), got = run(true, positions, cache);
    test::expect_bitwise(got.q_heads, want.q_heads, "q heads");
    test::expect_bitwise(got.k, want.k, "k");
    test::expect_bitwise(got.v, want.v, "v");
    test::expect_bitwise(got.dq, want.dq, "dq");
    test::expect_bitwise(got.dkv, want.dkv, "dkv_b");
    // The composed path sums the heads' key gradients through autograd; the fused op in head order.
    test::expect_close(got.dk_rope, want.dk_rope, 1e-6f, 1e-6f, "dk_rope");
  }
}

TEST(MlaHeads, ErrorsNameTheValue) {
  const ops::RopeCache cache = ops::make_rope_cache(16, P, 10000.0f);
  Tensor positions = Tensor::from_vector<int32_t>({T}, {0, 1, 2, 3, 4});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect_error = [&](auto&& f, const std::string& needle) {
    const std::string m = message(f);
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  };
  expect_error([&] { ops::mla_query_heads(test::randn({B, T, 7}, 1), H, N, P, positions, cache); }, "is not [B, T, 3*10]");
  expect_error([&] { ops::mla_query_heads(test::randn({B, T, H * (N + P)}, 1), H, N, P,
                                          Tensor::from_vector<int32_t>({3}, {0, 1, 2}), cache); },
               "(expected [T] or [B, T])");
  expect_error([&] { ops::mla_key_value_heads(test::randn({B, T, H * (N + Dv)}, 1), test::randn({B, 4, P}, 2), H, N, Dv,
                                              positions, cache); },
               "k_rope");
  // A position past the cache is named by the table lookup.
  expect_error([&] { ops::mla_query_heads(test::randn({B, T, H * (N + P)}, 1), H, N, P,
                                          Tensor::from_vector<int32_t>({T}, {0, 1, 2, 3, 99}), cache); },
               "position 99");
}
