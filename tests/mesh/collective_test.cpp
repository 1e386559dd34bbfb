// The in-process communicator (src/mesh/communicator.h) and the differentiable collectives
// (src/ops/collective.h): values, gradients (each op's backward is its conjugate), groups, failures.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/autograd.h"
#include "core/error.h"
#include "mesh/communicator.h"
#include "mesh/mesh.h"
#include "ops/collective.h"
#include "ops/elementwise.h"

using namespace loom;

namespace {

// Rank r's deterministic values: v(r, i) = 100 r + i.
std::vector<float> values_of(int r, int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * (100.0f * static_cast<float>(r) + static_cast<float>(i));
  return v;
}

dist::Group whole(dist::Communicator& c) { return {&c, c.world()}; }

}  // namespace

TEST(InProcess, CollectivesOnTheWorldAndOnSubgroups) {
  dist::run_in_process(4, [](int r, dist::Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 4);
    std::vector<float> x = values_of(r, 3);
    c.all_reduce_sum(x.data(), 3, c.world());
    EXPECT_EQ(x, (std::vector<float>{600, 604, 608}));

    std::vector<float> g(8);
    std::vector<float> mine = values_of(r, 2);
    c.all_gather(mine.data(), 2, g.data(), c.world());
    EXPECT_EQ(g, (std::vector<float>{0, 1, 100, 101, 200, 201, 300, 301}));

    std::vector<float> in = values_of(r, 8), out(2);
    c.reduce_scatter_sum(in.data(), 2, out.data(), c.world());
    // Block r of every member: sum over m of 100 m + 2r + j = 600 + 8r + 4j.
    EXPECT_EQ(out, (std::vector<float>{600.0f + 8.0f * r, 604.0f + 8.0f * r}));

    std::vector<float> b = values_of(r, 2);
    c.broadcast(b.data(), 2, 2, c.world());
    EXPECT_EQ(b, (std::vector<float>{200, 201}));

    // The two data groups of a (data=2, tensor=2) mesh run at the same time without mixing.
    const dist::Mesh mesh{2, 2};
    const auto group = mesh.group(r, dist::MeshAxis::Data);
    std::vector<float> y = values_of(r, 1);
    c.all_reduce_sum(y.data(), 1, group);
    const float expected = r % 2 == 0 ? 200.0f : 400.0f;  // {0, 2} and {1, 3}
    EXPECT_EQ(y[0], expected);
    double d = 0.5 * r;
    c.all_reduce_sum(&d, 1, c.world());
    EXPECT_EQ(d, 3.0);
    c.barrier(c.world());
    EXPECT_GT(c.stats.total_bytes(), 0);
  });
}

TEST(InProcess, AFailingRankReleasesTheOthers) {
  const auto start = std::chrono::steady_clock::now();
  try {
    dist::run_in_process(3, [](int r, dist::Communicator& c) {
      if (r == 1) throw Error("out of memory in layer 3");
      std::vector<float> x(4, 1.0f);
      c.all_reduce_sum(x.data(), 4, c.world());  // would wait for rank 1 forever
    });
    FAIL() << "expected the failure to propagate";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("out of memory in layer 3"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(InProcess, AMissingRankTimesOut) {
  dist::InProcessWorld world(2, std::chrono::milliseconds(200));
  std::atomic<bool> threw{false};
  std::string message;
  std::thread t([&] {
    try {
      float x = 1;
      world.communicator(0).all_reduce_sum(&x, 1, {0, 1});  // rank 1 never comes
    } catch (const Error& e) {
      threw = true;
      message = e.what();
    }
  });
  t.join();
  EXPECT_TRUE(threw);
  EXPECT_NE(message.find("all_reduce timed out after 200 ms"), std::string::npos) << message;
}

// Started collectives (Communicator::start_*) give the blocking calls' bits, in start order, while the
// caller goes on; a blocking collective issued meanwhile waits for them and cannot overtake them.
TEST(InProcess, StartedCollectivesEqualTheBlockingOnesAndKeepTheirOrder) {
  constexpr int64_t n = 37;  // values of different magnitudes: a sum in another order would round differently
  auto value = [](int r, int64_t i) { return std::ldexp(1.0f + 0.013f * static_cast<float>(i), 3 * r - 6) / 3.0f; };
  dist::run_in_process(4, [&](int r, dist::Communicator& c) {
    const auto data_group = dist::Mesh{2, 2}.group(r, dist::MeshAxis::Data);
    std::vector<float> mine(n), gathered(4 * n), big(4 * n), scattered(n), reduced(n), sub(n);
    for (int64_t i = 0; i < n; ++i) mine[i] = value(r, i);
    for (int64_t i = 0; i < 4 * n; ++i) big[i] = value(r, i);
    reduced = mine;
    sub = mine;
    auto g = c.start_all_gather(mine.data(), n, gathered.data(), c.world());
    auto s = c.start_reduce_scatter_sum(big.data(), n, scattered.data(), c.world());
    auto a = c.start_all_reduce_sum(reduced.data(), n, c.world());
    auto d = c.start_all_reduce_sum(sub.data(), n, data_group);
    double flag = 1;  // blocking, issued while the four may still run: it must come after them
    c.all_reduce_sum(&flag, 1, c.world());
    EXPECT_EQ(flag, 4.0);
    c.wait(a);  // in any order
    c.wait(g);
    c.wait(s);
    c.wait(d);
    // Blocking equivalents, and sums in group order by hand.
    std::vector<float> gathered2(4 * n), scattered2(n), reduced2 = mine;
    c.all_gather(mine.data(), n, gathered2.data(), c.world());
    c.reduce_scatter_sum(big.data(), n, scattered2.data(), c.world());
    c.all_reduce_sum(reduced2.data(), n, c.world());
    EXPECT_EQ(gathered, gathered2);
    EXPECT_EQ(scattered, scattered2);
    EXPECT_EQ(reduced, reduced2);
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0, block = 0, pair = 0;
      for (int m = 0; m < 4; ++m) {
        sum += value(m, i);
        block += value(m, r * n + i);
      }
      for (int m : data_group) pair += value(m, i);
      ASSERT_EQ(reduced[i], sum) << i;
      ASSERT_EQ(scattered[i], block) << i;
      ASSERT_EQ(sub[i], pair) << i;
      ASSERT_EQ(gathered[2 * n + i], value(2, i)) << i;
    }
    EXPECT_EQ(c.stats.started, 4);
    EXPECT_GE(c.stats.wait_seconds, 0.0);
    c.wait_all();
    c.wait(nullptr);  // a null handle is done
  });
}

// A blocking call's time is counted twice over: its wall time (wait_seconds) and the CPU the caller's
// thread took meanwhile (wait_cpu_seconds: tools/plan_check.py splits the ranks' CPU with it), never
// more than the wall time, and little of it while the thread sleeps on a peer.
TEST(InProcess, ABlockingCallCountsItsWallAndCpuTime) {
  dist::run_in_process(2, [](int r, dist::Communicator& c) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    double x = 1;
    c.all_reduce_sum(&x, 1, c.world());
    EXPECT_EQ(x, 2.0);
    if (r == 0) {
      EXPECT_GE(c.stats.wait_seconds, 0.025);
      EXPECT_GT(c.stats.wait_cpu_seconds, 0.0);
      EXPECT_LT(c.stats.wait_cpu_seconds, 0.5 * c.stats.wait_seconds);
    }
  });
}

TEST(InProcess, AStartedCollectiveReportsAFailedRank) {
  try {
    dist::run_in_process(3, [](int r, dist::Communicator& c) {
      if (r == 2) throw Error("disk full");
      std::vector<float> x(4, 1.0f);
      auto w = c.start_all_reduce_sum(x.data(), 4, c.world());  // rank 2 never joins
      c.wait(w);
    });
    FAIL() << "expected the failure to propagate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disk full"), std::string::npos) << e.what();
  }
}

TEST(CollectiveOps, StartedGatherAndScatterEqualTheOneCallVersions) {
  dist::run_in_process(2, [](int r, dist::Communicator& c) {
    const dist::Group g = whole(c);
    Tensor x = Tensor::from_vector<float>({2, 3}, values_of(r, 6, 0.1f));
    Tensor y = Tensor::from_vector<float>({4, 6}, values_of(r, 24, 0.3f));
    for (int dim : {0, 1}) {
      auto started = ops::start_all_gather_values(x, dim, g);
      auto scattering = ops::start_reduce_scatter_values(y, dim, g);
      Tensor gathered = started.wait(), scattered = scattering.wait();
      EXPECT_FALSE(started.defined());
      EXPECT_EQ(gathered.shape(), ops::all_gather_values(x, dim, g).shape());
      EXPECT_EQ(gathered.to_vector<float>(), ops::all_gather_values(x, dim, g).to_vector<float>()) << dim;
      EXPECT_EQ(scattered.to_vector<float>(), ops::reduce_scatter_values(y, dim, g).to_vector<float>()) << dim;
    }
    // One nobody waits for is waited for when it goes (its buffers outlive the collective).
    { auto dropped = ops::start_all_gather_values(x, 1, g); }
    c.barrier(c.world());
  });
}

// Each op on 2 ranks of a [2, 3] tensor along dim 1, with loss_r = sum(c_r * out_r), c_r = r + 1: the
// gradients are those of the global loss sum_r loss_r for the all_gather/reduce_scatter pair and the
// Megatron f/g pair, and those of one replicated copy for the *_replicated pair.
TEST(CollectiveOps, ForwardValuesAndConjugateGradients) {
  dist::run_in_process(2, [](int r, dist::Communicator& c) {
    const dist::Group g = whole(c);
    const float cr = static_cast<float>(r + 1);
    auto leaf = [&](const Shape& s) {
      Tensor x = Tensor::from_vector(s, values_of(r, s.numel()));
      x.set_requires_grad();
      return x;
    };
    auto run = [&](const Tensor& out) { ops::sum(ops::scale(out, cr)).backward(); };

    {  // all_gather: [2, 3] -> [2, 6]; d/dx_r = sum_m c_m = 3 on every element
      Tensor x = leaf({2, 3});
      Tensor y = ops::all_gather(x, 1, g);
      ASSERT_EQ(y.shape(), Shape({2, 6}));
      EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105}));
      run(y);
      for (float v : x.grad().to_vector<float>()) EXPECT_EQ(v, 3.0f);
    }
    {  // reduce_scatter: [2, 4] -> [2, 2], block r along dim 1; d/dx_r = c of the block's owner
      Tensor x = leaf({2, 4});
      Tensor y = ops::reduce_scatter(x, 1, g);
      ASSERT_EQ(y.shape(), Shape({2, 2}));
      const float o = static_cast<float>(2 * r);  // this rank's block starts at column 2r
      EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{100 + 2 * o, 102 + 2 * o, 108 + 2 * o, 110 + 2 * o}));
      run(y);
      EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2}));
    }
    {  // all_reduce (g): sum forward, identity backward
      Tensor x = leaf({3});
      Tensor y = ops::all_reduce(x, g);
      EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{100, 102, 104}));
      run(y);
      for (float v : x.grad().to_vector<float>()) EXPECT_EQ(v, cr);
    }
    {  // copy_to_group (f): identity forward, all-reduce backward
      Tensor x = leaf({3});
      Tensor y = ops::copy_to_group(x, g);
      EXPECT_EQ(y.to_vector<float>(), values_of(r, 3));
      run(y);
      for (float v : x.grad().to_vector<float>()) EXPECT_EQ(v, 3.0f);
    }
    {  // gather_replicated: concat forward, own block of the (local) gradient backward
      Tensor x = leaf({2, 1});
      Tensor y = ops::gather_replicated(x, 1, g);
      EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 100, 1, 101}));
      run(y);
      for (float v : x.grad().to_vector<float>()) EXPECT_EQ(v, cr);
    }
    {  // split_replicated: own block forward, all-gather of the blocks' gradients backward
      Tensor x = leaf({1, 4});
      Tensor y = ops::split_replicated(x, 1, g);
      EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{100.0f * r + 2 * r, 100.0f * r + 2 * r + 1}));
      run(y);
      EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1, 2, 2}));
    }
  });
}

TEST(CollectiveOps, AGroupOfOneIsTheIdentity) {
  dist::run_in_process(1, [](int, dist::Communicator& c) {
    const dist::Group g = whole(c);
    Tensor x = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
    x.set_requires_grad();
    Tensor y = ops::all_gather(ops::reduce_scatter(ops::gather_replicated(ops::split_replicated(x, 0, g), 0, g), 1, g), 1, g);
    EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
    ops::sum(ops::all_reduce(ops::copy_to_group(y, g), g)).backward();
    EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
  });
}
