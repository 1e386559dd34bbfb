// ops::row_linear and ops::paged_attention, the batch-invariant ops of serving: each against a
// double-precision reference, and each row's result bitwise the same whatever rows it is computed with,
// in whatever order, on any number of threads.
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "backends/cpu/fast_exp.h"
#include "backends/cpu/row_linear.h"
#include "core/parallel.h"
#include "ops/paged_attention.h"
#include "ops/row_linear.h"
#include "support/op_test.h"

using namespace loom;

namespace {

// Rows `rows` of x [M, K] as a tensor [rows.size(), K].
Tensor take_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  const int64_t K = x.size(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), K});
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.data<float>() + static_cast<int64_t>(i) * K, x.data<float>() + rows[i] * K,
                static_cast<size_t>(K) * sizeof(float));
  }
  return out;
}

// Restores the thread count when it leaves scope.
struct Threads {
  int saved = num_threads();
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(saved); }
};

}  // namespace

TEST(RowLinear, MatchesTheReferenceAtOddSizes) {
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 7, 5}, {4, 8, 2}, {9, 67, 33}, {17, 128, 70}}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
    Tensor x = test::randn({M, K}, 1), w = test::randn({N, K}, 2);
    Tensor y = ops::row_linear(x, w);
    Tensor ref = Tensor::empty({M, N});
    cpu::row_linear_reference(x.data<float>(), M, K, w.data<float>(), N, ref.data<float>());
    test::expect_close(y, ref, 1e-4f, 1e-5f, "row_linear");
  }
}

TEST(RowLinear, EachRowIsTheSameAloneInAnyBatchAndOnAnyThreadCount) {
  // K = 67: a vector part and a tail; M = 11: groups of four and single rows; N = 70: pairs of columns,
  // a single column, chunks of 32 split over threads.
  const int64_t M = 11, K = 67, N = 70;
  Tensor x = test::randn({M, K}, 3), w = test::randn({N, K}, 4);
  Tensor all = ops::row_linear(x, w);
  std::vector<int64_t> order(M);
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  Tensor reversed = ops::row_linear(take_rows(x, order), w);
  for (int64_t m = 0; m < M; ++m) {
    SCOPED_TRACE("row " + std::to_string(m));
    Tensor alone = ops::row_linear(take_rows(x, {m}), w);
    test::expect_bitwise(alone, take_rows(all, {m}), "alone vs in a batch of 11");
    test::expect_bitwise(take_rows(reversed, {M - 1 - m}), take_rows(all, {m}), "reversed batch");
  }
  for (int threads : {1, 2, 3}) {
    Threads t(threads);
    test::expect_bitwise(ops::row_linear(x, w), all, "threads=" + std::to_string(threads));
  }
}

TEST(RowLinear, RefusesWhatItCannotMultiplyNamingIt) {
  EXPECT_HAS(test::error_of([] { ops::row_linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})); }), "K=3");
  EXPECT_HAS(test::error_of([] { ops::row_linear(Tensor::zeros({2, 3}, DType::I32), Tensor::zeros({4, 3})); }), "x");
  EXPECT_HAS(test::error_of([] { ops::row_linear(Tensor::zeros({3}), Tensor::zeros({4, 3})); }), "x");
}

namespace {

// A paged cache [NB, Hkv, S, D] holding sequences' keys and values at the slots their tables name, and the
// reference attention of one row in double.
struct PagedCase {
  int64_t NB = 12, Hkv = 2, S = 4, D = 8, H = 4;
  Tensor k_cache = Tensor::zeros({NB, Hkv, S, D}), v_cache = Tensor::zeros({NB, Hkv, S, D});

  // out [H, D] of query q [H, D] at position P over k, v [P + 1, Hkv, D] of its sequence.
  std::vector<double> reference(const float* q, const Tensor& k, const Tensor& v, int64_t P) const {
    std::vector<double> out(static_cast<size_t>(H * D), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      std::vector<double> s(static_cast<size_t>(P + 1));
      double max = -1e300;
      for (int64_t j = 0; j <= P; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[h * D + d]) * k.data<float>()[(j * Hkv + g) * D + d];
        s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(D));
        max = std::max(max, s[static_cast<size_t>(j)]);
      }
      double total = 0;
      for (double& e : s) total += (e = std::exp(e - max));
      for (int64_t j = 0; j <= P; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          out[static_cast<size_t>(h * D + d)] += s[static_cast<size_t>(j)] / total * v.data<float>()[(j * Hkv + g) * D + d];
        }
      }
    }
    return out;
  }
};

}  // namespace

TEST(PagedAttention, MatchesTheReferenceAndIsTheSameInAnyBatch) {
  PagedCase c;
  // Two sequences of 7 and 10 positions, their blocks interleaved and out of order in the cache.
  const std::vector<int32_t> table_a = {5, 0, 9}, table_b = {2, 11, 7};
  const int64_t Pa = 7, Pb = 10;
  Tensor ka = test::randn({Pa, c.Hkv, c.D}, 10), va = test::randn({Pa, c.Hkv, c.D}, 11);
  Tensor kb = test::randn({Pb, c.Hkv, c.D}, 12), vb = test::randn({Pb, c.Hkv, c.D}, 13);
  auto write = [&](const std::vector<int32_t>& table, const Tensor& k, const Tensor& v, int64_t P) {
    ops::PagedRows rows;
    for (int64_t p = 0; p < P; ++p) {
      rows.positions.push_back(p);
      rows.tables.push_back(&table);
    }
    ops::paged_kv_write(c.k_cache, c.v_cache, k, v, rows);
  };
  write(table_a, ka, va, Pa);
  write(table_b, kb, vb, Pb);
  Tensor q = test::randn({5, c.H, c.D}, 14);
  // Rows: b at 9, a at 3, a at 6, b at 0, b at 4.
  ops::PagedRows rows;
  rows.positions = {9, 3, 6, 0, 4};
  rows.tables = {&table_b, &table_a, &table_a, &table_b, &table_b};
  Tensor out = ops::paged_attention(q, c.k_cache, c.v_cache, rows);
  for (int64_t r = 0; r < 5; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const bool is_a = rows.tables[static_cast<size_t>(r)] == &table_a;
    const std::vector<double> ref =
        c.reference(q.data<float>() + r * c.H * c.D, is_a ? ka : kb, is_a ? va : vb, rows.positions[static_cast<size_t>(r)]);
    for (int64_t i = 0; i < c.H * c.D; ++i) EXPECT_NEAR(out.data<float>()[r * c.H * c.D + i], ref[static_cast<size_t>(i)], 1e-5);
    // Alone, on one or three threads: the same bits.
    ops::PagedRows one;
    one.positions = {rows.positions[static_cast<size_t>(r)]};
    one.tables = {rows.tables[static_cast<size_t>(r)]};
    Tensor q1 = Tensor::empty({1, c.H, c.D});
    std::memcpy(q1.data<float>(), q.data<float>() + r * c.H * c.D, static_cast<size_t>(c.H * c.D) * sizeof(float));
    for (int threads : {1, 3}) {
      Threads t(threads);
      Tensor alone = ops::paged_attention(q1, c.k_cache, c.v_cache, one);
      EXPECT_EQ(std::memcmp(alone.data<float>(), out.data<float>() + r * c.H * c.D, static_cast<size_t>(c.H * c.D) * sizeof(float)), 0)
          << "threads=" << threads;
    }
  }
}

TEST(PagedAttention, RefusesRowsItsTablesDoNotCoverNamingThem) {
  PagedCase c;
  const std::vector<int32_t> short_table = {1};
  const std::vector<int32_t> bad_block = {1, 40};
  ops::PagedRows rows;
  rows.positions = {4};  // block 1 of a one-block table
  rows.tables = {&short_table};
  Tensor q = Tensor::zeros({1, c.H, c.D});
  EXPECT_HAS(test::error_of([&] { ops::paged_attention(q, c.k_cache, c.v_cache, rows); }), "needs block 1");
  rows.tables = {&bad_block};
  EXPECT_HAS(test::error_of([&] { ops::paged_attention(q, c.k_cache, c.v_cache, rows); }), "block 40");
  rows.tables = {&short_table};
  rows.positions = {0};
  EXPECT_HAS(test::error_of([&] { ops::paged_attention(Tensor::zeros({1, 3, c.D}), c.k_cache, c.v_cache, rows); }),
             "not a multiple");
  Tensor k_wrong = Tensor::zeros({2, c.Hkv, c.D});
  EXPECT_HAS(test::error_of([&] { ops::paged_kv_write(c.k_cache, c.v_cache, k_wrong, k_wrong, rows); }), "should be [1");
}

// Multi-head latent attention's use: one cache whose slots are the keys, and in their first Dv numbers
// the values, with a scale of its own. Against the reference in double, and refusals naming the option.
TEST(PagedAttention, OneLatentCacheServesAsKeysAndValuesWithItsOwnScale) {
  const int64_t NB = 6, S = 4, W = 8, Dv = 5, H = 3, P = 6;
  const float scale = 0.3f;
  Tensor cache = Tensor::zeros({NB, 1, S, W});
  const std::vector<int32_t> table = {4, 1};
  Tensor latents = test::randn({P + 1, 1, W}, 21);
  ops::PagedRows write;
  for (int64_t p = 0; p <= P; ++p) {
    write.positions.push_back(p);
    write.tables.push_back(&table);
  }
  ops::paged_cache_write(cache, latents, write);
  Tensor q = test::randn({2, H, W}, 22);
  ops::PagedRows rows;
  rows.positions = {P, 2};
  rows.tables = {&table, &table};
  ops::PagedAttentionOptions o;
  o.scale = scale;
  o.value_dim = Dv;
  Tensor out = ops::paged_attention(q, cache, cache, rows, o);
  ASSERT_EQ(out.shape(), Shape({2, H, Dv}));
  const float* l = latents.data<float>();
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t at = rows.positions[static_cast<size_t>(r)];
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(static_cast<size_t>(at + 1));
      double max = -1e300, total = 0;
      for (int64_t j = 0; j <= at; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < W; ++d) dot += static_cast<double>(q.data<float>()[(r * H + h) * W + d]) * l[j * W + d];
        s[static_cast<size_t>(j)] = dot * scale;
        max = std::max(max, s[static_cast<size_t>(j)]);
      }
      for (double& e : s) total += (e = std::exp(e - max));
      for (int64_t d = 0; d < Dv; ++d) {
        double want = 0;
        for (int64_t j = 0; j <= at; ++j) want += s[static_cast<size_t>(j)] / total * l[j * W + d];
        EXPECT_NEAR(out.data<float>()[(r * H + h) * Dv + d], want, 1e-5) << "row " << r << ", head " << h << ", " << d;
      }
    }
  }
  o.value_dim = W + 1;
  EXPECT_HAS(test::error_of([&] { ops::paged_attention(q, cache, cache, rows, o); }), "value_dim 9");
  o.value_dim = 0;
  o.scale = -1;
  EXPECT_HAS(test::error_of([&] { ops::paged_attention(q, cache, cache, rows, o); }), "scale -1");
  EXPECT_HAS(test::error_of([&] { ops::paged_cache_write(cache, test::randn({2, 1, W}, 3), write); }), "should be [7");
}

// The kernel computes exactly the order paged_attention.h states, whatever it does to go faster (four
// keys' dots side by side, up to four query heads of a k/v head side by side, the value sums in
// registers 64 at a time): a plain float reference of that order gives the same bits. D = 64 takes the
// 64-wide value sums, 72 them and a tail of 8, 8 the tail alone; positions 0..13 over blocks of 4 end
// blocks at every slot (the four-key dots and their remainder); 1, 2, 3, 4, 5 and 9 query heads a k/v
// head take every count of heads side by side and the splits of a larger group. The serving paths'
// bits (prefill chunks = decode = batch) rest on this order.
TEST(PagedAttention, ComputesTheStatedOrderBitForBit) {
  // fixed_dot.h's order: lane i sums k = i, i+8, ... by fma, lanes combined as a tree, then the tail.
  auto fixed_dot = [](const float* a, const float* b, int64_t K) {
    float l[8] = {};
    const int64_t k8 = K - K % 8;
    for (int64_t k = 0; k < k8; ++k) l[k % 8] = std::fma(a[k], b[k], l[k % 8]);
    float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (int64_t k = k8; k < K; ++k) sum = std::fma(a[k], b[k], sum);
    return sum;
  };
  for (const auto& [D, H, Hkv] : {std::tuple<int64_t, int64_t, int64_t>{64, 6, 2}, {72, 6, 2}, {8, 6, 2}, {64, 2, 2},
                                  {64, 4, 2}, {72, 8, 2}, {64, 5, 1}, {64, 18, 2}}) {
    SCOPED_TRACE("D=" + std::to_string(D) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv));
    const int64_t NB = 8, S = 4, P = 13;
    Tensor k_cache = test::randn({NB, Hkv, S, D}, 31), v_cache = test::randn({NB, Hkv, S, D}, 32);
    const std::vector<int32_t> table = {6, 1, 3, 0};
    Tensor q = test::randn({P + 1, H, D}, 33);
    ops::PagedRows rows;
    for (int64_t p = 0; p <= P; ++p) {
      rows.positions.push_back(p);
      rows.tables.push_back(&table);
    }
    const Tensor out = ops::paged_attention(q, k_cache, v_cache, rows);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t r = 0; r <= P; ++r) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / Hkv);
        auto slot = [&](const Tensor& c, int64_t j) {
          return c.data<float>() + ((table[static_cast<size_t>(j / S)] * Hkv + g) * S + j % S) * D;
        };
        const float* qh = q.data<float>() + (r * H + h) * D;
        std::vector<float> s(static_cast<size_t>(r + 1));
        float max = -INFINITY;
        for (int64_t j = 0; j <= r; ++j) max = std::max(max, s[static_cast<size_t>(j)] = fixed_dot(qh, slot(k_cache, j), D) * scale);
        double total = 0;
        for (float& e : s) {
          // The kernel's exp: 16 lanes with AVX-512 (cpu/fast_exp.h), the scalar one elsewhere.
#if defined(__AVX512F__)
          e = _mm512_cvtss_f32(cpu::exp16(_mm512_set1_ps(e - max)));
#else
          e = cpu::fast_exp(e - max);
#endif
          total += e;
        }
        const float inv = static_cast<float>(1.0 / total);
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= r; ++j) acc = std::fma(s[static_cast<size_t>(j)], slot(v_cache, j)[d], acc);
          const float want = acc * inv, got = out.data<float>()[(r * H + h) * D + d];
          ASSERT_EQ(std::memcmp(&want, &got, sizeof(float)), 0) << "row " << r << ", head " << h << ", " << d << ": " << got << " vs " << want;
        }
      }
    }
  }
}
