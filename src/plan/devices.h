// The devices `loom plan` knows: peak throughput, memory, and the links between them, each value with
// where it comes from (a vendor datasheet, a paper, or a measurement on this machine).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace loom::plan {

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
  std::map<std::string, std::string> sources;  // field -> where its value comes from
};

// The built-in devices (not "cpu", which is measured).
const std::vector<DeviceSpec>& known_devices();
// A built-in device by name, or "cpu": this machine, its f32 peak measured with the FMA loop of
// `loom bench peak` and its read bandwidth with `loom bench bandwidth`'s loop on `threads` threads (0:
// all), one node whose ranks talk through shared memory at that bandwidth. Throws naming the known ones.
DeviceSpec device_named(const std::string& name, int threads = 0);

}  // namespace loom::plan
