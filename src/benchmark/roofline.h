// `loom bench roofline`: where a training step's time goes, against what the machine can do.
//
// It measures the machine's two roofs (the FMA peak, the bf16 dot-product peak where the CPU has one,
// and the memory read bandwidth), runs training steps with the op profiler on (core/profile.h), and
// puts each op family's time next to its FLOPs and the bytes it must move:
//
//   arithmetic intensity I = FLOPs / bytes;  bound = min(peak, I x bandwidth);  % of bound = achieved / bound
//
// FLOPs are model FLOPs per op, from the shapes it saw (op_cost): 2MNK a GEMM, the full T x T square for
// attention (as PaLM's 12·L·d·T and MFU count it; a causal kernel does about half of it), a few FLOPs per
// element for norms and activations. Bytes are compulsory traffic: every input and output tensor once,
// gradients included in the backward; intermediates a fused op keeps in cache are not counted, so GB/s
// is a lower bound on the real traffic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/profile.h"
#include "models/model_config.h"

namespace loom::bench {

// One op's cost model. family: "matmul", "attention", "norm", ...; unknown ops are their own family with
// no FLOPs and the bytes of their tensors.
struct OpCost {
  std::string family;
  double forward_flops = 0, backward_flops = 0;
  double forward_bytes = 0, backward_bytes = 0;
  double palm_flops = 0;  // the part of forward + backward FLOPs that PaLM's formula counts (GEMMs, attention)
};
OpCost op_cost(const profile::OpRecord& op);

struct RooflineOptions {
  int64_t batch_size = 8;
  int64_t steps = 3;         // profiled steps, after warm-up
  int64_t warmup_steps = 1;
  int threads = 0;           // 0: loom::num_threads()
  bool bf16 = false;         // mixed-precision GEMMs, as `loom bench train --bf16`
  int64_t bandwidth_mib = 512;
  double peak_seconds = 0.5;
  uint64_t seed = 0;
};

struct FamilyRow {
  std::string family;
  double seconds = 0;  // per step
  double flops = 0;    // per step
  double palm_flops = 0;  // per step: the GEMM and attention FLOPs among them
  double bytes = 0;    // per step
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  double gflops() const { return seconds > 0 ? flops / seconds / 1e9 : 0; }
  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double bound_gflops = 0;  // min(peak, I x bandwidth); 0 for an op without FLOPs
  bool memory_bound = false;
  double fraction_of_bound = 0;  // achieved GFLOP/s over the bound; GB/s over the bandwidth without FLOPs
};

struct RooflineReport {
  std::string preset_description;
  int threads = 0;
  bool bf16 = false;
  double peak_gflops = 0;       // f32 FMA
  double bf16_peak_gflops = 0;  // 0: no bf16 dot-product instruction
  double gemm_peak_gflops = 0;  // the roof of the GEMM families: bf16's where it runs on bf16 units
  double bandwidth_gb_per_s = 0;
  double step_seconds = 0;      // wall time of a whole step (profiled)
  int64_t tokens_per_step = 0;
  double model_flops_per_step = 0;  // ModelStats: PaLM FLOPs per token x tokens per step
  double counted_flops_per_step = 0;  // sum over the families
  double palm_counted_flops_per_step = 0;  // the GEMM and attention part of the sum: equals model_flops_per_step
  std::vector<FamilyRow> families;  // by time, largest first
  std::string table() const;  // Markdown
  std::string svg() const;    // log-log roofline, op families as labelled points
  std::string json() const;
  // Writes out_dir/roofline.svg and out_dir/roofline.json (creating out_dir); returns their paths.
  std::vector<std::string> write(const std::string& out_dir) const;
};

// Aggregates a profile of `steps` steps into per-family rows (no roofs yet: bound fields stay 0).
std::vector<FamilyRow> aggregate_profile(const profile::Profile& profile, int64_t steps);

RooflineReport bench_roofline(const models::ModelConfig& config, const RooflineOptions& options);

}  // namespace loom::bench
