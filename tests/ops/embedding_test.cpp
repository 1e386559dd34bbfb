// ops::embedding: PyTorch fixture, gradcheck, deterministic backward across thread counts, bad ids.
#include "ops/embedding.h"

#include <string>

#include "core/autograd.h"
#include "core/parallel.h"
#include "support/op_test.h"

using namespace loom;

TEST(Embedding, MatchesPyTorchWithRepeatedIds) {
  const auto f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/embedding.json");
  Tensor table = test::param(f.get("table"));
  Tensor out = ops::embedding(f.get("ids"), table);
  test::expect_close(out, f.get("out"), 0.0f, 0.0f, "out");  // a copy: exact
  autograd::backward(out, f.get("dout"));
  test::expect_close(table.grad(), f.get("dtable"), 1e-6f, 1e-6f, "dtable");
}

TEST(Embedding, Gradcheck) {
  Tensor ids = Tensor::from_vector<int32_t>({2, 3}, {4, 0, 4, 12, 4, 1});
  Tensor table = test::param(test::randn({13, 33}, 1));
  test::gradcheck([ids](const TensorList& in) { return ops::embedding(ids, in[0]); }, {table});
}

TEST(Embedding, BackwardIsBitwiseTheSameForOneAndTwoThreads) {
  const int64_t N = 4096, V = 50, C = 200;  // many tokens per row, several column chunks
  std::vector<int32_t> idv(N);
  for (int64_t i = 0; i < N; ++i) idv[i] = static_cast<int32_t>(random_bits(RngKey::from_seed(5), i) % V);
  Tensor ids = Tensor::from_vector<int32_t>({N}, idv);
  Tensor dout = test::randn({N, C}, 6);
  std::vector<float> grads[2];
  const int before = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor table = test::param(test::randn({V, C}, 7));
    autograd::backward(ops::embedding(ids, table), dout);
    grads[threads - 1] = table.grad().to_vector<float>();
  }
  set_num_threads(before);
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(Embedding, Bf16TableForward) {
  Tensor table = test::randn({9, 7}, 1).to(DType::BF16);
  Tensor ids = Tensor::from_vector<int32_t>({3}, {8, 0, 8});
  Tensor out = ops::embedding(ids, table);
  EXPECT_EQ(out.dtype(), DType::BF16);
  EXPECT_EQ(out.shape(), (Shape{3, 7}));
  auto t = table.to(DType::F32).to_vector<float>(), o = out.to(DType::F32).to_vector<float>();
  for (int c = 0; c < 7; ++c) EXPECT_EQ(o[7 + c], t[c]);
}

TEST(Embedding, OutOfRangeIdNamesTheIdAndV) {
  Tensor table = Tensor::zeros({10, 4});
  for (int32_t bad : {10, -1}) {
    Tensor ids = Tensor::from_vector<int32_t>({2, 2}, {1, 2, bad, 3});
    try {
      ops::embedding(ids, table);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("V=10"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(ops::embedding(Tensor::zeros({2}), table), Error);  // f32 ids
}
