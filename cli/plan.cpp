// `loom plan --config C --devices N --device h100 --batch B`: which layout (data x tensor x pipe x expert,
// sharding, recomputation, micro-batches) fits the model in memory and trains it fastest, with memory,
// FLOPs, bytes per collective and time per step for each (src/plan/plan.h, docs/plan.md).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "plan/plan.h"
#include "runs/memory.h"
#include "train/config.h"

namespace {
struct Options {
  std::string config = "default";
  std::vector<std::string> overrides;
  int64_t devices = 8;
  std::string device = "h100";
  int64_t batch = 0;
  int64_t seq = 0;
  std::string precision;
  std::string mesh;  // evaluate one layout: "data=4,tensor=2,pipe=2,expert=1"
  std::string shard = "none", recompute = "none", schedule = "1f1b";
  int64_t virtual_stages = 1;
  int64_t micro_batches = 1;
  double intra_bw = 0, inter_bw = 0, intra_latency = -1, inter_latency = -1, memory_gib = 0, efficiency = 0;
  int64_t per_node = 0;
  int threads = 0;
  int rows = 12;
  std::string collectives;  // measured collective costs (docs/plan/cpu-collectives.json)
  std::string head = "whole";  // under a tensor axis: "whole" (loom's) or "split" (vocab-parallel, Megatron's)
  bool json = false, no_overlap = false;
};

loom::plan::Layout parse_layout(const Options& o) {
  loom::plan::Layout l;
  std::string text = o.mesh;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, end - start);
    const size_t eq = part.find('=');
    LOOM_CHECK(eq != std::string::npos, "plan: --layout wants axis=size pairs (data, tensor, pipe, expert), got \"", text, "\"");
    const std::string axis = part.substr(0, eq);
    const int64_t size = std::stoll(part.substr(eq + 1));
    LOOM_CHECK(size >= 1, "plan: --layout: ", axis, " must be >= 1");
    if (axis == "data") l.data = size;
    else if (axis == "tensor") l.tensor = size;
    else if (axis == "pipe") l.pipe = size;
    else if (axis == "expert") l.expert = size;
    else LOOM_FAIL("plan: --layout: unknown axis \"", axis, "\" (data, tensor, pipe, expert)");
    start = end + 1;
  }
  LOOM_CHECK(o.shard == "none" || o.shard == "zero1" || o.shard == "fsdp", "plan: --shard must be none, zero1 or fsdp, got \"",
             o.shard, "\"");
  LOOM_CHECK(o.schedule == "1f1b" || o.schedule == "gpipe" || o.schedule == "interleaved",
             "plan: --schedule must be 1f1b, gpipe or interleaved, got \"", o.schedule, "\"");
  LOOM_CHECK((o.schedule == "interleaved") == (o.virtual_stages > 1), "plan: --virtual-stages ", o.virtual_stages,
             " goes with --schedule interleaved (and it with 2 or more), got --schedule ", o.schedule);
  l.shard = o.shard;
  l.recompute = loom::models::recompute_from_name(o.recompute);
  l.micro_batches = o.micro_batches;
  l.schedule = o.schedule;
  l.virtual_stages = o.virtual_stages;
  return l;
}

loom::cli::Register reg("plan", "Which mesh fits a model in memory and trains it fastest: memory, FLOPs, bytes and time per step",
                        [](CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  loom::cli::in_file(cmd.add_option("--config", o->config, "preset name or config file"), "config")
      ->type_name("PRESET|FILE")
      ->capture_default_str();
  cmd.add_option("--set", o->overrides, "override a config value: section.key=value (repeatable)");
  loom::cli::in_range(cmd.add_option("--devices", o->devices, "devices to plan for"), 1, 1 << 24)->capture_default_str();
  cmd.add_option("--device", o->device, "h100, h200, a100, tpu-v5p, h800, or cpu (measured here)")->capture_default_str();
  loom::cli::in_range(cmd.add_option("--batch", o->batch, "global batch in sequences per optimizer step (default: the config's)"), 1, 1 << 30);
  loom::cli::in_range(cmd.add_option("--seq", o->seq, "tokens per sequence (default: model.context_length)"), 1, 1 << 24);
  cmd.add_option("--precision", o->precision, "f32 or bf16 (default: bf16 on accelerators, the config's on cpu)");
  cmd.add_option("--layout", o->mesh, "evaluate only this layout, e.g. data=128,tensor=8,pipe=16");
  cmd.add_option("--shard", o->shard, "with --layout: none, zero1 or fsdp")->capture_default_str();
  cmd.add_option("--recompute", o->recompute, "with --layout: none, selective or full")->capture_default_str();
  loom::cli::in_range(cmd.add_option("--micro-batches", o->micro_batches, "with --layout: micro-batches per step"), 1, 1 << 20)->capture_default_str();
  cmd.add_option("--schedule", o->schedule, "with --layout and pipe > 1: 1f1b, gpipe or interleaved")->capture_default_str();
  loom::cli::in_range(cmd.add_option("--virtual-stages", o->virtual_stages, "with --schedule interleaved: stages per device"),
                      1, 1 << 20)->capture_default_str();
  loom::cli::in_range(cmd.add_option("--intra-bw", o->intra_bw, "intra-node bandwidth per device, GB/s one way (default: the device's)"), 1e-6, 1e9);
  loom::cli::in_range(cmd.add_option("--inter-bw", o->inter_bw, "inter-node bandwidth per device, GB/s one way"), 1e-6, 1e9);
  loom::cli::in_range(cmd.add_option("--intra-latency", o->intra_latency, "seconds per collective step within a node"), 0, 1000);
  loom::cli::in_range(cmd.add_option("--inter-latency", o->inter_latency, "seconds per collective step between nodes"), 0, 1000);
  loom::cli::in_range(cmd.add_option("--devices-per-node", o->per_node, "devices sharing the intra-node links"), 1, 1 << 20);
  loom::cli::in_range(cmd.add_option("--memory-gib", o->memory_gib, "memory per device in GiB (default: the device's)"), 1e-6, 1e6);
  loom::cli::in_range(cmd.add_option("--efficiency", o->efficiency, "fraction of peak the step's GEMMs reach (default: the device's)"), 1e-6, 1);
  cmd.add_option("--threads", o->threads, "with --device cpu: threads per rank to measure");
  loom::cli::in_file(cmd.add_option("--collectives", o->collectives,
                                    "measured collective costs (tools/measure_collectives.py, e.g. docs/plan/cpu-collectives.json)"),
                     "costs");
  loom::cli::in_range(cmd.add_option("--rows", o->rows, "layouts to show"), 1, 10000)->capture_default_str();
  cmd.add_option("--head", o->head,
                 "under a tensor axis, the head's compute: whole (on every tensor rank, as loom runs it) or split "
                 "(vocab-parallel across the tensor ranks, as Megatron-LM runs it)")
      ->capture_default_str();
  cmd.add_flag("--no-overlap", o->no_overlap, "collectives waited on where issued (loom train --no-overlap)");
  cmd.add_flag("--json", o->json, "print one JSON object");
  cmd.callback([o] {
    const auto cfg = loom::train::TrainConfig::load(o->config, o->overrides);
    loom::plan::Request r;
    r.model = cfg.model;
    r.batch = o->batch > 0 ? o->batch : cfg.training.batch_size * cfg.training.grad_accum_steps;
    r.seq = o->seq;
    r.devices = o->devices;
    r.device = loom::plan::device_named(o->device, o->threads);
    if (o->device == "cpu") {
      // Ranks on this machine share its cores: more rank threads than cores divide each one's peak.
      const double cores = std::max(1u, std::thread::hardware_concurrency());
      const double wanted = static_cast<double>(o->devices) * (o->threads > 0 ? o->threads : cores);
      r.device.cores = cores;
      r.device.rank_threads = o->threads > 0 ? o->threads : cores;
      if (wanted > cores) {
        r.device.peak_share = cores / wanted;
        r.device.f32_flops *= cores / wanted;
        r.device.bf16_flops *= cores / wanted;
        r.device.description += loom::str(" (", o->devices, " ranks oversubscribe ", cores, " cores: peak scaled by ",
                                          cores / wanted, ")");
      }
    }
    if (!o->collectives.empty()) loom::plan::load_collective_costs(r.device, o->collectives);
    if (o->intra_bw > 0) r.device.intra_node_bandwidth = o->intra_bw * 1e9;
    if (o->inter_bw > 0) r.device.inter_node_bandwidth = o->inter_bw * 1e9;
    if (o->intra_latency >= 0) r.device.intra_node_latency = o->intra_latency;
    if (o->inter_latency >= 0) r.device.inter_node_latency = o->inter_latency;
    if (o->per_node > 0) r.device.devices_per_node = static_cast<int>(o->per_node);
    if (o->efficiency > 0) r.device.gemm_efficiency = o->efficiency;
    r.precision = !o->precision.empty() ? o->precision : o->device == "cpu" ? cfg.training.precision : "bf16";
    LOOM_CHECK(r.precision == "f32" || r.precision == "bf16", "plan: --precision must be f32 or bf16, got \"", r.precision, "\"");
    r.overlap = !o->no_overlap;
    LOOM_CHECK(o->head == "whole" || o->head == "split", "plan: --head must be whole or split, got \"", o->head, "\"");
    r.head_split = o->head == "split";
    if (o->memory_gib > 0) r.memory_per_device = o->memory_gib * 1024.0 * 1024.0 * 1024.0;
    else if (o->device == "cpu") r.memory_per_device = loom::runs::MemoryBudget::of_machine().bytes / static_cast<double>(o->devices);
    if (!o->mesh.empty()) r.only = parse_layout(*o);
    const loom::plan::Plan p = loom::plan::make_plan(r);
    if (o->json) std::printf("%s\n", loom::plan::to_json(p, o->rows).dump().c_str());
    else std::printf("%s", loom::plan::format_plan(p, o->rows).c_str());
  });
});
}  // namespace
