// Sharded training speed and traffic (docs/mesh.md): tokens/s and the bytes each rank hands to the
// communicator per step, next to what the mode should move in theory, and memory per rank.
//
//   loom_bench_mesh [--threads N]                                  one process, the baseline
//   mpirun -np 2 loom_bench_mesh --mode dp --mesh data=2           one line per run
//   mpirun -np 2 loom_bench_mesh --mode dp --mesh data=2 --no-overlap   every collective waited on at once
//   mpirun -np 2 loom_bench_mesh --model dsv3-mini --mode dp_ep --mesh expert=2 --batch 4 --steps 5
//
// With a mesh it also reports the time rank 0's compute thread spent blocked in collectives per step
// (CommStats::wait_seconds: blocking calls, and waits on collectives started in the background), the
// number that overlapping communication with compute brings down.
//
// --model dsv3-mini trains the dsv3-mini preset's DeepSeek-V3 (36.2M parameters; T 256) instead, with the
// aux-loss-free bias updates on; it reports the all-to-all bytes and the parameter and AdamW bytes per
// rank too (no theory column: the all-to-all's volume depends on the routing).
//
// The model is the tiny preset's Llama (vocab 512, T 64, d 64, 2 layers, 4 heads, d_ff 192), batch 16,
// f32, AdamW with clipping, synthetic batches. Bytes are payloads as CommStats counts them (an all-reduce
// of n floats counts 4n; an all-gather counts this rank's 4n input; a reduce-scatter its whole 4gn input),
// not wire bytes (a ring all-reduce puts about 2(g-1)/g of its payload on the wire per rank).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/allocator.h"
#include "core/cpu_time.h"
#include "core/parallel.h"
#include "mesh/mpi.h"
#include "parallel/runtime.h"
#include "models/deepseek_v3/model.h"
#include "models/llama/model.h"
#include "train/optimizer.h"

using namespace loom;

namespace {

llama::Config tiny() {
  return {.vocab_size = 512, .context_length = 64, .d_model = 64, .num_layers = 2, .num_heads = 4, .d_ff = 192};
}
int64_t kBatch = 16;  // --batch
int64_t kSeq = 64, kVocab = 512;

std::pair<Tensor, Tensor> batch_of(int step) {
  const int64_t T = kSeq, V = kVocab;
  std::vector<int32_t> ids(static_cast<size_t>(kBatch * T)), targets(ids.size());
  uint32_t h = 2166136261u ^ static_cast<uint32_t>(step);
  for (size_t i = 0; i < ids.size(); ++i) {
    h = (h ^ 0x9e3779b9u) * 16777619u;
    ids[i] = static_cast<int32_t>((h >> 7) % V);
    targets[i] = static_cast<int32_t>((h >> 13) % V);
  }
  return {Tensor::from_vector<int32_t>({kBatch, T}, ids), Tensor::from_vector<int32_t>({kBatch, T}, targets)};
}

// The payload bytes per rank per step the mode implies for this model (see the header's counting).
double theory_bytes(dist::ParallelMode mode, const dist::Mesh& mesh) {
  const llama::Config c = tiny();
  const double C = static_cast<double>(c.d_model), F = static_cast<double>(c.d_ff), V = static_cast<double>(c.vocab_size);
  const double L = static_cast<double>(c.num_layers), d = static_cast<double>(mesh.data), t = static_cast<double>(mesh.tensor);
  const double dense = L * (4 * C * C + 3 * C * F);   // q, k, v, output_proj, w1, w2, w3
  const double other = 2 * V * C + L * 2 * C + C;     // embedding, lm_head, norms
  const double tokens = static_cast<double>(kBatch) / (mode == dist::ParallelMode::Tp ? 1 : d) *
                        static_cast<double>(c.context_length);
  const double scalars = 8 * (1 /*loss*/ + 1 /*stop*/ + 1 /*grad norm*/) * (d > 1 || mode == dist::ParallelMode::Tp ? 1 : 0);
  double bytes = 0;
  switch (mode) {
    case dist::ParallelMode::Dp:  // every gradient all-reduced over data
      bytes = 4 * (dense + other);
      break;
    case dist::ParallelMode::Fsdp:  // dense: gather (fwd) + gather (bwd) of the shard, reduce-scatter of the whole grad
      bytes = 4 * (2 * dense / d + dense) + 4 * other;
      break;
    case dist::ParallelMode::Tp:  // per layer: 5 f all-reduces (bwd) + 2 g all-reduces (fwd) of [B,T,C]; 2 table gathers
      bytes = 4 * (L * 7 * tokens * C) + 4 * (2 * V * C / t);
      break;
    case dist::ParallelMode::FsdpTp:  // tp's activations on B/d rows, fsdp's traffic on each tensor shard
      bytes = 4 * (L * 7 * tokens * C) + 4 * (2 * V * C / t) + 4 * (2 * dense / (d * t) + dense / t) +
              4 * (2 * V * C / t + L * 2 * C + C);
      break;
    case dist::ParallelMode::DpEp:
    case dist::ParallelMode::FsdpEp:
      return 0;  // the Llama has no experts
  }
  return bytes + scalars - (mode == dist::ParallelMode::Tp ? 8 : 0);  // tp has no data axis: no loss all-reduce
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode_name, mesh_text, model_name = "tiny-llama";
  int threads = 1, steps = 30;
  bool overlap = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-overlap")) overlap = false;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--model")) model_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--batch")) kBatch = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mode")) mode_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--mesh")) mesh_text = argv[i + 1];
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  set_num_threads(threads);
  std::shared_ptr<dist::Communicator> comm;
  std::shared_ptr<dist::RankContext> ctx;
  if (!mode_name.empty()) {
    comm = dist::mpi_world();
    ctx = std::make_shared<dist::RankContext>(dist::RankContext{dist::Mesh::parse(mesh_text),
                                                                dist::parallel_mode_from_name(mode_name), comm.get(),
                                                                comm->rank(), overlap});
  }
  const bool moe = model_name == "dsv3-mini";
  std::unique_ptr<models::LanguageModel> model;
  if (moe) {
    const deepseek_v3::Config c;  // the defaults are the dsv3-mini preset's model
    kSeq = c.context_length;
    kVocab = c.vocab_size;
    model = std::make_unique<deepseek_v3::DeepSeekV3>(c, 1);
  } else {
    model = std::make_unique<llama::TransformerLM>(tiny(), 1);
  }
  std::vector<dist::TensorLayout> layout;
  if (ctx) layout = dist::shard_model(*model, ctx);
  auto params = model->parameters();
  int64_t param_bytes = 0;
  for (nn::Parameter* p : params) param_bytes += static_cast<int64_t>(p->value.nbytes());
  train::AdamW opt(params, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f});
  auto step = [&](int s) {
    model->begin_training_step();
    opt.zero_grad();
    auto [ids, targets] = batch_of(s);
    const models::ForwardContext train_ctx = models::ForwardContext::train(RngKey::from_seed(1));
    Tensor loss = ctx ? model->loss(dist::local_batch(ids, *ctx), dist::local_batch(targets, *ctx), train_ctx)
                      : model->loss(ids, targets, train_ctx);
    if (ctx) {
      dist::global_loss(loss.item(), *ctx);
      double stop = 0;  // the trainer's per-step stop agreement
      comm->all_reduce_sum(&stop, 1, comm->world());
    }
    if (ctx) {
      dist::backward(loss, params, *ctx);
      dist::finish_gradients(params, *ctx);
      dist::clip_grad_norm(params, layout, *ctx, 1.0);
    } else {
      loss.backward();
      train::clip_grad_norm(train::gradients_of(params), 1.0);
    }
    opt.step();
    model->end_training_step(true);
    model->take_training_metrics();
  };
  for (int s = 0; s < 3; ++s) step(s);  // warm-up: caches, the allocator, MPI's groups
  allocator_for(Device::cpu()).reset_peak();
  if (comm) comm->barrier(comm->world());
  const dist::CommStats before = comm ? comm->stats : dist::CommStats{};
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds();
  for (int s = 3; s < 3 + steps; ++s) step(s);
  const dist::CommStats after = comm ? comm->stats : dist::CommStats{};
  const double cpu_per_step = (process_cpu_seconds() - cpu_start) / steps;
  if (comm) comm->barrier(comm->world());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (comm && comm->rank() != 0) return 0;
  const double tok_s = static_cast<double>(steps * kBatch * kSeq) / seconds;
  const int64_t peak = allocator_for(Device::cpu()).stats().peak_bytes_in_use;
  if (!ctx) {
    std::printf("%s, 1 rank x %d threads, batch %lld: %.0f tokens/s, CPU %.2f s/step, parameters %lld B, peak allocator "
                "bytes %lld\n", model_name.c_str(), threads, static_cast<long long>(kBatch), tok_s, cpu_per_step,
                static_cast<long long>(param_bytes), static_cast<long long>(peak));
    return 0;
  }
  const dist::CommStats& a = after;
  if (moe) {
    std::printf("%s on %s (%d ranks x %d thread), batch %lld x %lld: %.0f tokens/s, rank 0 CPU %.2f s/step, bytes/step/rank %.0f (all_to_all "
                "%.0f, all_reduce %.0f, all_gather %.0f, reduce_scatter %.0f), rank 0 parameters %lld B + AdamW %lld B, "
                "peak allocator bytes %lld\n",
                mode_name.c_str(), ctx->mesh.str().c_str(), comm->size(), threads, static_cast<long long>(kBatch),
                static_cast<long long>(kSeq), tok_s, cpu_per_step, static_cast<double>(a.total_bytes() - before.total_bytes()) / steps,
                static_cast<double>(a.all_to_all_bytes - before.all_to_all_bytes) / steps,
                static_cast<double>(a.all_reduce_bytes - before.all_reduce_bytes) / steps,
                static_cast<double>(a.all_gather_bytes - before.all_gather_bytes) / steps,
                static_cast<double>(a.reduce_scatter_bytes - before.reduce_scatter_bytes) / steps,
                static_cast<long long>(param_bytes), static_cast<long long>(2 * param_bytes), static_cast<long long>(peak));
    return 0;
  }
  const double per_step = static_cast<double>(a.total_bytes() - before.total_bytes()) / steps;
  std::printf("%s on %s (%d ranks x %d thread, overlap %s): %.0f tokens/s, %.2f ms/step, of which %.2f ms waiting in "
              "collectives, bytes/step/rank measured %.0f (all_reduce %.0f, "
              "all_gather %.0f, reduce_scatter %.0f) theory %.0f, rank 0 parameters %lld B, peak allocator bytes %lld\n",
              mode_name.c_str(), ctx->mesh.str().c_str(), comm->size(), threads, overlap ? "on" : "off", tok_s,
              1e3 * seconds / steps, 1e3 * (a.wait_seconds - before.wait_seconds) / steps, per_step,
              static_cast<double>(a.all_reduce_bytes - before.all_reduce_bytes) / steps,
              static_cast<double>(a.all_gather_bytes - before.all_gather_bytes) / steps,
              static_cast<double>(a.reduce_scatter_bytes - before.reduce_scatter_bytes) / steps,
              theory_bytes(ctx->mode, ctx->mesh), static_cast<long long>(param_bytes), static_cast<long long>(peak));
  return 0;
}
