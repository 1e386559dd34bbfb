// `loom plan`: before renting a cluster, which mesh fits a model in memory and how fast it will run.
//
// For a model (a preset or config), a global batch and sequence length, a device kind (plan/devices.h)
// and a network, it enumerates the layouts data x tensor x pipe x expert (with the data axis replicating,
// sharding the optimizer state, ZeRO-1, or sharding everything, FSDP), activation recomputation (none,
// selective, full) and micro-batches, and estimates for each:
//
//   memory per device   parameters, gradients, AdamW moments, bf16 copies, activations (runs::
//                       activation_model, the formula tests/train/recompute_test holds to the allocator),
//                       pipeline buffers and in-flight micro-batches, FSDP's gathered weights
//   FLOPs per step      models::ModelStats' PaLM count (6N + 12·L·H·D·T per token), plus what
//                       recomputation runs again
//   bytes               per collective and per link, counted as loom's CommStats counts payloads (an
//                       all-reduce of n floats 4n bytes, an all-gather its input, a reduce-scatter its
//                       whole input); exact for the modes loom runs (tests/plan/plan_test.cpp)
//   time                compute at the device's peak times its GEMM efficiency; collectives on a ring,
//                       2(g-1)/g of an all-reduce's payload on the slowest link the axis crosses; what loom
//                       overlaps (FSDP gathers and reduce-scatters, data-axis gradient buckets) hidden
//                       behind compute up to the compute's length; tensor-parallel all-reduces, expert
//                       all-to-alls and pipeline fill and drain exposed; the AdamW update at memory bandwidth;
//                       selective recomputation's cheap ops at memory bandwidth; on a device whose
//                       collectives were measured (this CPU, DeviceSpec::collective_costs) each call
//                       charged what the measurement says it adds to a step; where the ranks share
//                       cores (this CPU), the step no shorter than all the ranks' CPU (compute, AdamW
//                       and each call's measured CPU) over the cores, and with more ranks than cores
//                       one rank's chain at a whole core's speed (a waiting rank leaves its core)
//
// and picks the fastest layout that fits, saying for the others why they lose. docs/plan.md checks the
// model against loom's own runs and against published large runs.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mesh/mesh.h"
#include "models/model.h"
#include "models/model_config.h"
#include "plan/devices.h"

namespace loom::plan {

// One way to spread the step over the devices.
struct Layout {
  int64_t data = 1, tensor = 1, pipe = 1, expert = 1;
  // What the data axis (and, for the dense weights, data x expert) shards: "none" (replicated, dp),
  // "zero1" (the AdamW moments), "fsdp" (parameters, gradients and moments: ZeRO-3).
  std::string shard = "none";
  models::Recompute recompute = models::Recompute::None;
  int64_t micro_batches = 1;       // per optimizer step: pipeline micro-batches, or gradient accumulation
  std::string schedule = "1f1b";   // with pipe > 1: "1f1b", "gpipe" or "interleaved"
  int64_t virtual_stages = 1;      // with "interleaved": stages per device (loom's parallel.virtual_stages)
  int64_t devices() const { return data * tensor * pipe * expert; }
  std::string str() const;  // "data=4,tensor=2 fsdp recompute=full m=2"
  // The loom parallel mode that runs this layout (with its pipe axis, when pipe > 1), or "" when loom
  // does not run it yet (zero1, data x tensor without fsdp, tensor x expert).
  std::string loom_mode() const;
};

struct Request {
  models::ModelConfig model;
  int64_t batch = 0;         // global batch: sequences per optimizer step
  int64_t seq = 0;           // tokens per sequence; 0: the model's context_length
  int64_t devices = 1;
  DeviceSpec device;
  std::string precision = "bf16";  // "f32" or "bf16" (loom's mixed precision: bf16 GEMMs, f32 master weights)
  bool overlap = true;             // loom's overlap of FSDP and data-axis collectives with compute
  double memory_per_device = 0;    // bytes; 0: the device's (for "cpu": the machine's MemAvailable / devices)
  std::optional<Layout> only;      // evaluate this layout alone
  // Under a tensor axis, how the output head's compute is charged. loom (false) gathers the head's table
  // whole and every tensor rank computes all the logits, the loss and their gradients for its tokens
  // (mesh/mesh.h: lm_head (None, tensor), gathered before use; the batch replicated over tensor), so the
  // head's 6·V·C FLOPs per token are not divided by the tensor ranks. true: the head is vocab-parallel,
  // its FLOPs split across the tensor ranks as Megatron-LM's is (the published-run rows, docs/plan.md).
  // Only the compute changes: the memory and the table gathers stay loom's.
  bool head_split = false;
};

// One collective of a step, per device.
struct Collective {
  std::string name;      // "gradient all-reduce", "FSDP weight all-gather", ...
  std::string kind;      // "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"
  std::string axis;      // "data", "tensor", "expert", "pipe", "data x expert"
  int64_t group = 1;     // ranks in the group
  double bytes = 0;      // payload per step per device, as CommStats counts it
  double wire_bytes = 0; // bytes that leave the device per step on the ring (or point to point)
  double link_bandwidth = 0;  // bytes/s of the slowest link the group crosses
  bool inter_node = false;
  double calls = 0;      // calls per step per device, as CommStats counts them
  double seconds = 0;    // on the link, per step
  bool overlapped = false;  // hidden behind compute (up to the compute's length)
  // `seconds` is what the collective adds to the step, from the device's measured collective costs
  // (DeviceSpec::collective_costs): for an overlapped one the part its compute window did not hide, so
  // it is not hidden again.
  bool measured = false;
};

struct Estimate {
  Layout layout;
  std::string invalid;   // why the layout cannot run this model at all ("" when it can)
  // Memory per device (the most loaded rank: the pipeline stage with the largest peak), bytes.
  double params = 0, grads = 0, optimizer = 0, bf16_copies = 0, activations = 0, pipeline_buffers = 0,
         transient = 0;  // the peak phase's buffers beyond the terms before it
  // The peak over the step's phases (plan.cpp): the loss's forward, the backward, the end of the backward.
  double peak = 0;
  double memory() const { return peak; }
  double memory_limit = 0;
  bool fits() const { return invalid.empty() && memory() <= memory_limit; }
  double model_flops = 0;     // per step, all devices (PaLM's count)
  double hardware_flops = 0;  // per step, all devices, with recomputation
  std::vector<Collective> collectives;
  double compute_s = 0, exposed_comm_s = 0, comm_s = 0, bubble_s = 0, optimizer_s = 0, step_s = 0;
  // On a device whose ranks share cores (this CPU: DeviceSpec::cores): the core-seconds one rank's step
  // takes (its compute and AdamW at a whole core's speed, and its collectives' measured CPU per call), and
  // what all the ranks' take over the cores, a floor under the step whatever overlaps: step_s is the
  // larger of that floor and compute + bubble + exposed communication + AdamW (with more ranks than cores,
  // compute and bubble at a whole core's speed, the waits as measured with a core per rank). 0 elsewhere.
  double cpu_s = 0, comm_cpu_s = 0, cpu_bound_s = 0;
  // A pipeline with more ranks than cores: its schedule's wall time with the cores shared among the ranks
  // that can run (shared_core_pipeline_s), under the step with AdamW and the exposed communication. 0
  // elsewhere.
  double shared_pipeline_s = 0;
  double tokens_per_s = 0, mfu = 0;
  double hfu = 0;  // hardware FLOPs (recomputation included) over the peak: what Megatron-LM's papers report
  // The pipeline stage the memory and the collectives are given for (the most loaded), and every stage's
  // first block: stage s runs blocks [stage_bounds[s], stage_bounds[s + 1]) (loom's parallel.pipe_layers).
  int64_t worst_stage = 0;
  std::vector<int64_t> stage_bounds;
  std::string verdict;        // why it wins, or why it loses to the best
};

struct Plan {
  Request request;
  std::vector<Estimate> fitting;   // fastest first
  std::vector<Estimate> rejected;  // invalid or over memory, by how far over
  int64_t evaluated = 0;
};

// Every parameter of the model as its layout sees it: count, group, and which layer it belongs to
// (-1 before the layers: tables; num_layers: after them: final norm, head, MTP modules). Analytic from
// the config (no model is built), equal to the built model's (tests/plan/plan_test.cpp).
struct ParamCount {
  std::string name;
  dist::ParamGroup group = dist::ParamGroup::DenseIn;
  dist::ParamGroup owner = dist::ParamGroup::DenseIn;  // a bias: its weight's group
  int ndim = 2;
  double count = 0;
  int64_t layer = 0;
};
std::vector<ParamCount> census(const models::ModelConfig& model);

// The layout's estimate for the most loaded pipeline stage (the largest peak memory; without a pipe
// axis, every rank's).
Estimate estimate(const Request& request, const Layout& layout);
// The same for the ranks of pipeline stage `stage` (0 <= stage < layout.pipe): their memory, collectives
// and point-to-point bytes (bench/plan.cpp compares each rank of a run with its stage's).
Estimate estimate_stage(const Request& request, const Layout& layout, int64_t stage);
// A pipeline step's compute where its stages' ranks share fewer cores than they are (this CPU with more
// ranks than cores): the schedule ("gpipe", "1f1b", or "interleaved" with `chunks` stages a rank, in
// loom's order) played out as events, every rank that can run getting an equal share of the cores (at
// most a whole one) and a rank that waits for its neighbour's activations or gradients leaving its
// share to the others. stage_work[s]: stage s's CPU seconds a step at a whole core, a micro-batch's
// forward a third of its share and its backward two thirds. Returns the wall time; with a core per
// stage, (M + P - 1) / M of the slowest stage's work for even stages (fill and drain).
double shared_core_pipeline_s(const std::string& schedule, const std::vector<double>& stage_work, int64_t micro,
                              double cores, int64_t chunks = 1);
Plan make_plan(const Request& request);

std::string format_plan(const Plan& plan, int rows = 12);
nlohmann::json to_json(const Plan& plan, int rows = 12);
nlohmann::json to_json(const Estimate& e);

}  // namespace loom::plan
