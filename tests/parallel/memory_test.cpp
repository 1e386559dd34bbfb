// FSDP holds a layer's whole weights only while the layer computes: after a forward pass (whose graph
// is kept for backward) the ranks hold their shards, not gathered copies. Measured with the allocator's
// bytes in use, summed over the ranks (the in-process ranks share one allocator), at the same point
// of a dp run and an fsdp run of the same model and batch. With overlap on, the next block's gather is
// in flight while a block computes and one layer's gradient sum while the layer before computes: the
// peak over a step may grow by about two blocks' weights per rank, never by the model's.
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/parallel.h"
#include "parallel/runtime.h"
#include "models/llama/model.h"

using namespace loom;

namespace {

llama::Config wide() {  // parameters dominate the activations of a [2, 4] batch
  return {.vocab_size = 256, .context_length = 8, .d_model = 128, .num_layers = 4, .num_heads = 4, .d_ff = 512};
}

struct Measured {
  int64_t params = 0;        // bytes of parameter values, summed over ranks
  int64_t after_forward = 0; // bytes in use with every rank's forward graph alive, minus the baseline
  int64_t forward_peak = 0;  // the peak during the forward, minus the baseline
  int64_t peak = 0;          // the peak over forward, backward and finish_gradients, minus the baseline
};

Measured measure(dist::ParallelMode mode, bool overlap) {
  Measured m;
  std::vector<int64_t> in_use(4);
  dist::run_in_process(2, [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{{2, 1}, mode, &comm, rank, overlap});
    auto model = std::make_unique<llama::TransformerLM>(wide(), 3);
    dist::shard_model(*model, ctx);
    auto params = model->parameters();
    std::vector<int32_t> ids(16);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((7 * i) % 256);
    Tensor x = Tensor::from_vector<int32_t>({4, 4}, ids);
    // A first step, in which the runtime learns the order to prefetch in.
    dist::backward(model->loss(dist::local_batch(x, *ctx), dist::local_batch(x, *ctx)), params, *ctx);
    dist::finish_gradients(params, *ctx);
    for (nn::Parameter* p : params) p->value.set_grad(Tensor());
    int64_t bytes = 0;
    for (nn::Parameter* p : model->parameters()) bytes += static_cast<int64_t>(p->value.nbytes());
    comm.barrier(comm.world());
    if (rank == 0) {
      in_use[0] = allocator_for(Device::cpu()).stats().bytes_in_use;
      allocator_for(Device::cpu()).reset_peak();
    }
    comm.barrier(comm.world());
    Tensor loss = model->loss(dist::local_batch(x, *ctx), dist::local_batch(x, *ctx));
    comm.barrier(comm.world());
    if (rank == 0) {
      in_use[1] = allocator_for(Device::cpu()).stats().bytes_in_use;
      in_use[3] = allocator_for(Device::cpu()).stats().peak_bytes_in_use;
    }
    double total = static_cast<double>(bytes);
    comm.all_reduce_sum(&total, 1, comm.world());
    if (rank == 0) m.params = static_cast<int64_t>(total);
    comm.barrier(comm.world());
    dist::backward(loss, params, *ctx);  // and the backward, with its re-gathers, completes
    dist::finish_gradients(params, *ctx);
    comm.barrier(comm.world());
    if (rank == 0) in_use[2] = allocator_for(Device::cpu()).stats().peak_bytes_in_use;
    EXPECT_EQ(comm.stats.started > 0, overlap);
  });
  m.after_forward = in_use[1] - in_use[0];
  m.peak = in_use[2] - in_use[0];
  m.forward_peak = in_use[3] - in_use[0];
  return m;
}

}  // namespace

TEST(FsdpMemory, GatheredWeightsDoNotOutliveTheirLayer) {
  set_num_threads(1);
  const Measured dp = measure(dist::ParallelMode::Dp, false), fsdp = measure(dist::ParallelMode::Fsdp, false);
  const Measured fsdp_overlap = measure(dist::ParallelMode::Fsdp, true);
  // Shards: the dense weights split in two (norms, embedding and head stay whole).
  EXPECT_LT(fsdp.params, dp.params);
  // The forward graphs of fsdp hold what dp's hold (activations), not the gathered dense weights: had
  // the graph kept each gathered weight, fsdp would hold every whole dense weight on top of its shards.
  const int64_t saved = dp.params - fsdp.params;  // half the dense weights, summed over ranks
  EXPECT_LE(fsdp.after_forward, dp.after_forward + saved / 8)
      << "fsdp's forward kept " << fsdp.after_forward << " bytes alive, dp's " << dp.after_forward;
  // With overlap: still nothing gathered alive after the forward (a pass drops its gathers after its last
  // Linear). A block's Linears are gathered in one collective, the next block's while one computes, so
  // the forward's peak is at most, per rank, two blocks' weights whole above fsdp's without overlap (the
  // block computing and the one in flight, 4 x [128, 128] + 3 x [512, 128] floats each), this rank's
  // packed shards of the one in flight, and the weight copied out of its block. Over the step add the
  // block's gradients packed whole for their reduce-scatter, a Linear's gradient being packed, and the
  // bucket copies of the gradients all-reduced over data (the embedding and head tables and the
  // norms, [256, 128] x 2 + 9 x [128]).
  const int64_t weight = 512 * 128 * 4, block = (4 * 128 * 128 + 3 * 512 * 128) * 4;
  const int64_t buckets = (2 * 256 * 128 + 9 * 128) * 4;
  EXPECT_LE(fsdp_overlap.after_forward, dp.after_forward + saved / 8);
  EXPECT_LE(fsdp_overlap.forward_peak, fsdp.forward_peak + 2 * (2 * block + block / 2 + weight))
      << "overlapped fsdp's forward peaked at " << fsdp_overlap.forward_peak << " bytes, without overlap at "
      << fsdp.forward_peak;
  EXPECT_LE(fsdp_overlap.peak, fsdp.peak + 2 * (3 * block + block / 2 + 3 * weight + buckets))
      << "overlapped fsdp peaked at " << fsdp_overlap.peak << " bytes, fsdp without overlap at " << fsdp.peak;
  std::printf("peak above the baseline, both ranks, forward / step: dp %lld / %lld B, fsdp %lld / %lld B, fsdp "
              "overlapped %lld / %lld B\n",
              static_cast<long long>(dp.forward_peak), static_cast<long long>(dp.peak),
              static_cast<long long>(fsdp.forward_peak), static_cast<long long>(fsdp.peak),
              static_cast<long long>(fsdp_overlap.forward_peak), static_cast<long long>(fsdp_overlap.peak));
  std::printf("parameters, both ranks: dp %lld B, fsdp %lld B; live after forward: dp %lld B, fsdp %lld B\n",
              static_cast<long long>(dp.params), static_cast<long long>(fsdp.params),
              static_cast<long long>(dp.after_forward), static_cast<long long>(fsdp.after_forward));
}
