// The devices `loom plan` knows: peak throughput, memory, and the links between them, each value with
// where it comes from (a vendor datasheet, a paper, or a measurement on this machine).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace loom::plan {

// What one collective call adds to a step on this machine, measured through loom's communicator (its
// MPI waits and their naps, its communication thread) by bench/collectives.cpp with
// tools/measure_collectives.py (docs/plan.md, "The network of this CPU"): for one kind ("all_reduce",
// "all_gather", "reduce_scatter", "send_recv": one message; "started_all_gather": the part of a collective
// started in the background that `gap_s` of compute did not hide), one group size, one number of ranks
// sharing the machine, and a gap of compute between calls, the seconds per call at a few payloads (bytes
// as CommStats counts them).
struct CollectiveCost {
  std::string kind;
  int group = 2, ranks = 2;
  double gap_s = 0;
  std::vector<std::pair<double, double>> points;  // (bytes, seconds per call), by bytes
  // (bytes, CPU seconds per call): what a call takes from the cores (every thread of a rank: the waits'
  // polling and naps, the copies, the communication thread), the ranks' mean; empty when not measured.
  std::vector<std::pair<double, double>> cpu_points;
  // Seconds per call at `bytes`: linear between the measured payloads, the first one's below them, the
  // last segment's slope above them; never negative.
  double seconds(double bytes) const;
  double cpu_seconds(double bytes) const;  // the same over cpu_points (0 when empty)
};

struct DeviceSpec {
  std::string name;         // "h100", "h200", "a100", "tpu-v5p", "h800", "cpu"
  std::string description;  // "NVIDIA H100 SXM5 80GB"
  double bf16_flops = 0;    // dense peak, FLOP/s (no sparsity)
  double f32_flops = 0;     // the f32 (non-tensor-core) peak
  double memory_bytes = 0;  // device memory (HBM), bytes
  double memory_bandwidth = 0;        // bytes/s
  int devices_per_node = 8;           // devices that share the fast intra-node links
  double intra_node_bandwidth = 0;    // bytes/s per device, one direction (NVLink, ICI)
  double inter_node_bandwidth = 0;    // bytes/s per device, one direction (the NIC)
  double intra_node_latency = 0;      // seconds per collective step
  double inter_node_latency = 0;
  // The fraction of the peak that large GEMMs reach on the device (the planner's compute efficiency; the
  // one assumption of the time model that is not a datasheet number).
  double gemm_efficiency = 0.7;
  // Where it was measured at several GEMM heights (this CPU: tools/plan_check.py calibrates one-process
  // steps of 1024 tokens, whole and in micro-batches of 256 and 128): (rows a GEMM multiplies, the
  // fraction it reached), used in place of gemm_efficiency at the height a layout's micro-batches give
  // a rank. Empty: gemm_efficiency at any.
  std::vector<std::pair<double, double>> efficiency_by_rows;
  // The efficiency at `rows`: interpolated in log(rows) between the measured heights, held at the
  // nearest outside them; gemm_efficiency when none were measured.
  double efficiency_at(double rows) const;
  // Devices that share cores (this CPU): the cores all ranks share, and each rank's compute threads; the
  // fraction of the measured peak a rank gets when the ranks' threads outnumber the cores (cores / (ranks
  // x threads), set where the peak is scaled: cli/plan.cpp, bench/plan.cpp). cores = 0: every device
  // computes alone (the GPUs, TPUs).
  double cores = 0, rank_threads = 1, peak_share = 1;
  // With more ranks' threads than cores: the CPU time a rank's compute takes over what it takes with a
  // core of its own (the caches each switch between ranks leaves cold). tools/plan_check.py measures it
  // as copies of the one-process step sharing the cores against one alone; 1: not measured.
  double shared_core_slowdown = 1;
  // The share of a one-process step spent in the op families a tensor axis leaves whole (the norms, the
  // residual adds and other elementwise ops, the embedding, the sums of gradients that meet): every
  // tensor rank runs them over its tokens' whole activations, where the FLOPs' split charges them 1/t.
  // tools/plan_check.py measures it with `loom bench roofline`; 0: not measured (the catalog's devices).
  double tensor_replicated_share = 0;
  std::map<std::string, std::string> sources;  // field -> where its value comes from
  // Measured collective costs (empty: the ring and tree formula over the links above). When a kind, group
  // and rank count has an entry, the planner charges each call of it the entry's cost instead.
  std::vector<CollectiveCost> collective_costs;
  // The entry for a kind, a group, the ranks on the machine and the compute between calls: among the
  // kind and group's entries, the nearest rank count at or above `ranks` (else the largest), then the
  // gap nearest `gap_s` (by ratio); nullptr when the kind or group was not measured.
  const CollectiveCost* cost_of(const std::string& kind, int64_t group, int64_t ranks, double gap_s) const;
};

// Reads the measured collective costs of a data file (docs/plan/cpu-collectives.json: the entries, when
// and by which command they were measured) into `device`, with the file's provenance as a source. Throws
// naming the file and the value when it is malformed.
void load_collective_costs(DeviceSpec& device, const std::string& path);

// The built-in devices (not "cpu", which is measured).
const std::vector<DeviceSpec>& known_devices();
// A built-in device by name, or "cpu": this machine, its f32 peak measured with the FMA loop of
// `loom bench peak` and its read bandwidth with `loom bench bandwidth`'s loop on `threads` threads (0:
// all), one node whose ranks talk through shared memory at that bandwidth. Throws naming the known ones.
DeviceSpec device_named(const std::string& name, int threads = 0);

}  // namespace loom::plan
