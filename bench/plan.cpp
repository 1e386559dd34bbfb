// `loom plan` against loom's own run of the same layout (docs/plan.md, "Against loom's own runs").
//
// Every rank trains the model as the trainer does (micro-batches through the pipe axis's schedule, or
// accumulated without one; the loss and stop all-reduces; the gradient sums; clipping; AdamW; DeepSeek-V3's
// bias updates), then reports what it measured over the timed steps: the bytes it handed to the
// communicator per kind and step (CommStats), its allocator's peak (each rank is a process: its own
// allocator), and the step's wall time. Rank 0 prints one JSON line per rank with the plan's estimate
// for that rank's pipeline stage beside each number.
//
//   loom_bench_plan --config tiny --batch 16 --micro 2                       one process
//   mpirun -np 4 loom_bench_plan --config tiny --set model.num_layers=4 --mesh pipe=2,data=2 --mode dp
//       --schedule gpipe --micro 4 --batch 32                                (one command line)
//
// The plan's time needs the device's speed: --flops (f32 FLOP/s of one core; default: `loom bench peak`'s
// FMA loop, measured here on rank 0) times --efficiency (default: the plan's cpu assumption), the peak
// divided among the ranks when they outnumber the cores (as `loom plan --device cpu` does; --cores: the
// cores the run has, default the machine's), and
// --bandwidth (bytes/s; default: `loom bench bandwidth`'s loop); with both given nothing is measured.
// tools/plan_check.py calibrates the efficiency on one-process runs and keeps it for the others:
// --efficiency-at ROWS:E,... gives it at several GEMM heights (the tokens of a micro-batch on a rank);
// --shared-core-slowdown S what ranks sharing the cores cost their compute (DeviceSpec::shared_core_slowdown);
// --tensor-replicated-share F the one-process step's share in families a tensor axis leaves whole
// (DeviceSpec::tensor_replicated_share).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/cpu_time.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "mesh/mpi.h"
#include "ops/elementwise.h"
#include "ops/shape.h"
#include "parallel/pipeline.h"
#include "parallel/runtime.h"
#include "plan/plan.h"
#include "train/config.h"
#include "train/optimizer.h"

using namespace loom;

namespace {

// Token ids [B, T + 1] drawn from a key: inputs are the first T, targets the last T.
Tensor ids_for(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T + 1}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(random_bits(RngKey::from_seed(seed), static_cast<uint64_t>(i)) % V);
  }
  return t;
}

// What one rank measured, as doubles (summed over the ranks to reach rank 0: each rank fills its slot).
enum Field { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSend, kPeak, kSeconds, kWait, kCalls, kSends, kCpu, kMainCpu, kWaitCpu, kFields };

}  // namespace

int main(int argc, char** argv) {
  std::string config = "tiny", mesh_text, mode_name = "dp", schedule = "1f1b", recompute = "none";
  std::vector<std::string> overrides;
  int64_t batch = 16, seq = 0, micro = 1;
  int steps = 10, warmup = 3, threads = 1;
  double flops = 0, bandwidth = 0, efficiency = 0;
  std::string efficiency_at;  // "ROWS:E,ROWS:E": the efficiency measured at several GEMM heights
  double cores_given = 0;  // the cores the run has (tools/plan_check.py measures its share of the machine)
  double shared_core_slowdown = 1;  // DeviceSpec::shared_core_slowdown (tools/plan_check.py measures it)
  double tensor_replicated_share = 0;  // DeviceSpec::tensor_replicated_share (likewise)
  bool overlap = true;
  std::string collectives_file;  // measured collective costs (docs/plan/cpu-collectives.json)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s wants a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    // A whole number in (lo, hi), or [lo, hi) with lo_included, else a message naming it and exit 2.
    auto number_in = [](const std::string& flag, const std::string& v, double lo, double hi, bool lo_included) {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !((lo_included ? x >= lo : x > lo) && x < hi)) {
        std::fprintf(stderr, "%s wants a number in %c%g, %g), got \"%s\"\n", flag.c_str(), lo_included ? '[' : '(', lo,
                     hi, v.c_str());
        std::exit(2);
      }
      return x;
    };
    if (a == "--config") config = next();
    else if (a == "--set") overrides.push_back(next());
    else if (a == "--mesh") mesh_text = next();
    else if (a == "--mode") mode_name = next();
    else if (a == "--schedule") schedule = next();
    else if (a == "--recompute") recompute = next();
    else if (a == "--batch") batch = std::atoll(next().c_str());
    else if (a == "--seq") seq = std::atoll(next().c_str());
    else if (a == "--micro") micro = std::atoll(next().c_str());
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--flops") flops = std::atof(next().c_str());
    else if (a == "--bandwidth") bandwidth = std::atof(next().c_str());
    else if (a == "--efficiency") efficiency = std::atof(next().c_str());
    else if (a == "--efficiency-at") efficiency_at = next();
    else if (a == "--no-overlap") overlap = false;
    else if (a == "--collectives") collectives_file = next();
    else if (a == "--cores") cores_given = std::atof(next().c_str());
    else if (a == "--shared-core-slowdown") shared_core_slowdown = number_in(a, next(), 0, 10, false);
    else if (a == "--tensor-replicated-share") tensor_replicated_share = number_in(a, next(), 0, 1, true);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  set_num_threads(threads);
  const train::TrainConfig cfg = train::TrainConfig::load(config, overrides);
  const models::ModelConfig& mc = cfg.model;
  const int64_t T = seq > 0 ? seq : mc.context_length();
  const models::Recompute rc = models::recompute_from_name(recompute);

  std::shared_ptr<dist::Communicator> comm;
  std::shared_ptr<dist::RankContext> ctx;
  dist::Mesh mesh;
  if (!mesh_text.empty()) {
    comm = dist::mpi_world();
    mesh = dist::Mesh::parse(mesh_text);
    ctx = std::make_shared<dist::RankContext>(
        dist::RankContext{mesh, dist::parallel_mode_from_name(mode_name), comm.get(), comm->rank(), overlap});
    ctx->pipe_schedule = schedule;
  }
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;

  // The plan of this layout; loom runs the plan's stage cut (the planner's own, given to loom as
  // parallel.pipe_layers would give it).
  plan::Request req;
  req.model = mc;
  req.batch = batch;
  req.seq = T;
  req.devices = world;
  req.precision = "f32";
  req.overlap = overlap;
  req.memory_per_device = 1e15;
  plan::Layout layout;
  layout.data = mesh.data;
  layout.tensor = mesh.tensor;
  layout.pipe = mesh.pipe;
  layout.expert = mesh.expert;
  const dist::ParallelMode mode = ctx ? ctx->mode : dist::ParallelMode::Dp;
  layout.shard = mode == dist::ParallelMode::Fsdp || mode == dist::ParallelMode::FsdpTp || mode == dist::ParallelMode::FsdpEp
                     ? "fsdp"
                     : "none";
  layout.recompute = rc;
  layout.micro_batches = micro;
  layout.schedule = schedule;
  if (ctx && mesh.pipe > 1) ctx->pipe_bounds = plan::estimate_stage(req, layout, 0).stage_bounds;

  auto model = mc.build(1);
  std::vector<dist::TensorLayout> shards;
  if (ctx) shards = dist::shard_model(*model, ctx);
  auto params = model->parameters();
  train::AdamW opt(params, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f});
  const int64_t rows = batch / micro;  // sequences per micro-batch, global
  const int64_t V = mc.vocab_size();

  auto step = [&](int s) {
    opt.zero_grad();
    model->begin_training_step();
    std::vector<dist::MicroBatch> mbs;
    for (int64_t m = 0; m < micro; ++m) {
      Tensor ids = ids_for(rows, T, V, static_cast<uint64_t>(s * micro + m));
      Tensor x = ops::narrow(ids, 1, 0, T), y = ops::narrow(ids, 1, 1, T);
      const auto fc = models::ForwardContext::train(RngKey::from_seed(1), rc);
      mbs.push_back(ctx ? dist::MicroBatch{dist::local_batch(x, *ctx), dist::local_batch(y, *ctx), fc}
                        : dist::MicroBatch{x, y, fc});
    }
    if (ctx && mesh.pipe > 1) {
      dist::pipeline_step(*model, params, mbs, *ctx);
    } else {
      for (int64_t m = 0; m < micro; ++m) {
        Tensor loss = model->loss(mbs[static_cast<size_t>(m)].ids, mbs[static_cast<size_t>(m)].targets, mbs[static_cast<size_t>(m)].ctx);
        if (ctx) dist::global_loss(loss.item(), *ctx);
        const Tensor scaled = micro > 1 ? ops::scale(loss, 1.0f / static_cast<float>(micro)) : loss;
        if (ctx) dist::backward(scaled, params, *ctx, m + 1 == micro);
        else scaled.backward();
      }
    }
    if (ctx) {
      double stop = 0;  // the trainer's per-step stop agreement
      comm->all_reduce_sum(&stop, 1, comm->world());
      dist::finish_gradients(params, *ctx);
      dist::finish_pipe_gradients(params, *ctx);
      dist::clip_grad_norm(params, shards, *ctx, 1.0);
    } else {
      train::clip_grad_norm(train::gradients_of(params), 1.0);
    }
    opt.step();
    model->end_training_step(true);
    model->take_training_metrics();
  };
  for (int s = 0; s < warmup; ++s) step(s);  // caches, the allocator, MPI's groups, FSDP's recorded order
  if (comm) comm->barrier(comm->world());
  allocator_for(Device::cpu()).reset_peak();
  const dist::CommStats before = comm ? comm->stats : dist::CommStats{};
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds(), main_cpu_start = thread_cpu_seconds();
  for (int s = warmup; s < warmup + steps; ++s) step(s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = process_cpu_seconds() - cpu_start, main_cpu = thread_cpu_seconds() - main_cpu_start;
  const dist::CommStats a = comm ? comm->stats : dist::CommStats{};
  std::vector<double> got(static_cast<size_t>(world * kFields), 0.0);
  double* mine = got.data() + static_cast<ptrdiff_t>(rank) * kFields;
  const double n = steps;
  mine[kAllReduce] = static_cast<double>(a.all_reduce_bytes - before.all_reduce_bytes) / n;
  mine[kAllGather] = static_cast<double>(a.all_gather_bytes - before.all_gather_bytes) / n;
  mine[kReduceScatter] = static_cast<double>(a.reduce_scatter_bytes - before.reduce_scatter_bytes) / n;
  mine[kAllToAll] = static_cast<double>(a.all_to_all_bytes - before.all_to_all_bytes) / n;
  mine[kSend] = static_cast<double>(a.send_bytes - before.send_bytes) / n;
  mine[kPeak] = static_cast<double>(allocator_for(Device::cpu()).stats().peak_bytes_in_use);
  mine[kSeconds] = seconds / n;
  mine[kWait] = (a.wait_seconds - before.wait_seconds) / n;
  mine[kCalls] = static_cast<double>(a.calls - before.calls) / n;
  mine[kSends] = static_cast<double>(a.sends - before.sends) / n;
  mine[kCpu] = cpu / n;
  mine[kMainCpu] = main_cpu / n;
  mine[kWaitCpu] = (a.wait_cpu_seconds - before.wait_cpu_seconds) / n;
  if (comm) comm->all_reduce_sum(got.data(), static_cast<int64_t>(got.size()), comm->world());
  if (rank != 0) return 0;

  // The device: one core's FMA peak and the read bandwidth (measured, or given: then nothing is
  // measured), the peak shared by the ranks beyond the cores.
  if (flops > 0 && bandwidth > 0) {
    req.device.name = "cpu";
    req.device.devices_per_node = 1 << 20;
    req.device.memory_bandwidth = bandwidth;
    req.device.intra_node_bandwidth = req.device.inter_node_bandwidth = bandwidth / 4;  // as plan::device_named
    req.device.intra_node_latency = req.device.inter_node_latency = 20e-6;
    req.device.gemm_efficiency = 0.5;
  } else {
    req.device = plan::device_named("cpu", threads);
  }
  if (!collectives_file.empty()) plan::load_collective_costs(req.device, collectives_file);
  if (flops > 0) req.device.f32_flops = req.device.bf16_flops = flops;
  if (efficiency > 0) req.device.gemm_efficiency = efficiency;
  {
    std::stringstream list(efficiency_at);
    std::string item;
    while (std::getline(list, item, ',')) {
      const size_t colon = item.find(':');
      const double rows = colon == std::string::npos ? 0 : std::atof(item.substr(0, colon).c_str());
      const double e = colon == std::string::npos ? 0 : std::atof(item.substr(colon + 1).c_str());
      if (rows <= 0 || e <= 0) {
        std::fprintf(stderr, "--efficiency-at wants ROWS:EFFICIENCY pairs, both > 0; got \"%s\"\n", item.c_str());
        return 2;
      }
      req.device.efficiency_by_rows.emplace_back(rows, e);
    }
  }
  const double cores = cores_given > 0 ? cores_given : std::max(1u, std::thread::hardware_concurrency());
  const double wanted = static_cast<double>(world) * threads;
  req.device.cores = cores;
  req.device.rank_threads = threads;
  req.device.shared_core_slowdown = shared_core_slowdown;
  req.device.tensor_replicated_share = tensor_replicated_share;
  if (wanted > cores) {
    req.device.peak_share = cores / wanted;
    req.device.f32_flops *= cores / wanted;
    req.device.bf16_flops *= cores / wanted;
  }
  for (int r = 0; r < world; ++r) {
    const double* m = got.data() + static_cast<ptrdiff_t>(r) * kFields;
    const int64_t stage = ctx ? mesh.coord(r, dist::MeshAxis::Pipe) : 0;
    const plan::Estimate e = plan::estimate_stage(req, layout, stage);
    std::map<std::string, double> planned;
    double planned_calls = 0;
    for (const plan::Collective& k : e.collectives) {
      planned[k.kind] += k.bytes;
      planned_calls += k.calls;
    }
    nlohmann::json j = {
        {"config", config},        {"mesh", ctx ? mesh.str() : "single"},
        {"mode", ctx ? mode_name : "single"}, {"schedule", schedule}, {"recompute", recompute},
        {"micro", micro},          {"batch", batch},
        {"seq", T},                {"rank", r},
        {"stage", stage},          {"ranks", world},
        {"invalid", e.invalid},
        {"measured",
         {{"all_reduce", m[kAllReduce]}, {"all_gather", m[kAllGather]}, {"reduce_scatter", m[kReduceScatter]},
          {"all_to_all", m[kAllToAll]}, {"send_recv", m[kSend]}, {"peak", m[kPeak]}, {"step_s", m[kSeconds]},
          {"wait_s", m[kWait]}, {"calls", m[kCalls]}, {"sends", m[kSends]},
          {"cpu_s", m[kCpu]}, {"main_thread_cpu_s", m[kMainCpu]},
          {"wait_cpu_s", m[kWaitCpu]}}},
        {"plan",
         {{"all_reduce", planned["all_reduce"]}, {"all_gather", planned["all_gather"]},
          {"reduce_scatter", planned["reduce_scatter"]}, {"all_to_all", planned["all_to_all"]},
          {"send_recv", planned["send_recv"]}, {"calls", planned_calls}, {"peak", e.memory()}, {"step_s", e.step_s},
          {"compute_s", e.compute_s}, {"exposed_comm_s", e.exposed_comm_s}, {"bubble_s", e.bubble_s},
          {"optimizer_s", e.optimizer_s}, {"cpu_s", e.cpu_s}, {"comm_cpu_s", e.comm_cpu_s},
          {"cpu_bound_s", e.cpu_bound_s}, {"shared_pipeline_s", e.shared_pipeline_s}, {"params", e.params},
          {"grads", e.grads}, {"optimizer", e.optimizer},
          {"activations", e.activations}, {"pipeline_buffers", e.pipeline_buffers}, {"transient", e.transient}}},
        {"device",
         {{"f32_flops", req.device.f32_flops}, {"memory_bandwidth", req.device.memory_bandwidth},
          {"gemm_efficiency", req.device.gemm_efficiency}}}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
