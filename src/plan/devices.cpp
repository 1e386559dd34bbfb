#include "plan/devices.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/peak.h"
#include "benchmark/bandwidth.h"
#include "core/error.h"
#include "core/parallel.h"

namespace loom::plan {

namespace {

constexpr double T = 1e12, G = 1e9, GiB = 1024.0 * 1024.0 * 1024.0;

DeviceSpec h100() {
  DeviceSpec d;
  d.name = "h100";
  d.description = "NVIDIA H100 SXM5 80GB";
  d.bf16_flops = 989.4 * T;
  d.f32_flops = 66.9 * T;
  d.memory_bytes = 80 * G;
  d.memory_bandwidth = 3.35e12;
  d.intra_node_bandwidth = 450 * G;
  d.inter_node_bandwidth = 50 * G;
  d.intra_node_latency = 5e-6;
  d.inter_node_latency = 10e-6;
  d.gemm_efficiency = 0.75;
  const std::string sheet = "NVIDIA H100 Tensor Core GPU datasheet (SXM5): ";
  d.sources = {{"bf16_flops", sheet + "1,979 TFLOPS bf16 with sparsity, half of it dense"},
               {"f32_flops", sheet + "67 TFLOPS FP32"},
               {"memory_bytes", sheet + "80 GB HBM3"},
               {"memory_bandwidth", sheet + "3.35 TB/s"},
               {"intra_node_bandwidth", sheet + "NVLink 900 GB/s (both directions), 450 GB/s each way"},
               {"inter_node_bandwidth", "DGX H100 user guide: 8 ConnectX-7 400 Gb/s InfiniBand ports, one per GPU = 50 GB/s"},
               {"intra_node_latency", "assumption: a few microseconds per NCCL ring step over NVLink"},
               {"inter_node_latency", "assumption: ~10 microseconds per step over InfiniBand"},
               {"gemm_efficiency", "assumption: large bf16 GEMMs reach ~700-750 of the 989 TFLOPS in cuBLAS"}};
  return d;
}

DeviceSpec h200() {
  DeviceSpec d = h100();
  d.name = "h200";
  d.description = "NVIDIA H200 SXM 141GB";
  d.memory_bytes = 141 * G;
  d.memory_bandwidth = 4.8e12;
  const std::string sheet = "NVIDIA H200 Tensor Core GPU datasheet (SXM): ";
  d.sources["bf16_flops"] = sheet + "1,979 TFLOPS bf16 with sparsity, half of it dense (the H100's compute)";
  d.sources["memory_bytes"] = sheet + "141 GB HBM3e";
  d.sources["memory_bandwidth"] = sheet + "4.8 TB/s";
  d.sources["intra_node_bandwidth"] = sheet + "NVLink 900 GB/s, 450 GB/s each way";
  d.sources["inter_node_bandwidth"] = "assumption: a 400 Gb/s NIC per GPU, as DGX H100/H200";
  return d;
}

DeviceSpec h800() {
  DeviceSpec d = h100();
  d.name = "h800";
  d.description = "NVIDIA H800 SXM5 80GB (export variant: the H100's compute, reduced NVLink)";
  d.intra_node_bandwidth = 160 * G;
  d.inter_node_bandwidth = 50 * G;
  d.sources["bf16_flops"] = "DeepSeek-V3 technical report (arXiv 2412.19437) sec. 3: H800 compute as H100 SXM, 989 TFLOPS bf16 dense";
  d.sources["intra_node_bandwidth"] = "DeepSeek-V3 technical report sec. 3.2.2: NVLink 160 GB/s";
  d.sources["inter_node_bandwidth"] = "DeepSeek-V3 technical report sec. 3.2.2: InfiniBand 50 GB/s per GPU";
  return d;
}

DeviceSpec a100() {
  DeviceSpec d;
  d.name = "a100";
  d.description = "NVIDIA A100 SXM4 80GB";
  d.bf16_flops = 312 * T;
  d.f32_flops = 19.5 * T;
  d.memory_bytes = 80 * G;
  d.memory_bandwidth = 2.039e12;
  d.intra_node_bandwidth = 300 * G;
  d.inter_node_bandwidth = 25 * G;
  d.intra_node_latency = 5e-6;
  d.inter_node_latency = 10e-6;
  d.gemm_efficiency = 0.8;
  const std::string sheet = "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): ";
  d.sources = {{"bf16_flops", sheet + "312 TFLOPS bf16 dense"},
               {"f32_flops", sheet + "19.5 TFLOPS FP32"},
               {"memory_bytes", sheet + "80 GB HBM2e"},
               {"memory_bandwidth", sheet + "2,039 GB/s"},
               {"intra_node_bandwidth", sheet + "NVLink 600 GB/s, 300 GB/s each way"},
               {"inter_node_bandwidth", "Narayanan et al. 2021 (Selene): 8 x 200 Gb/s HDR InfiniBand per node = 25 GB/s per GPU"},
               {"intra_node_latency", "assumption"},
               {"inter_node_latency", "assumption"},
               {"gemm_efficiency", "assumption: cuBLAS bf16 GEMMs reach ~250 of 312 TFLOPS on large shapes"}};
  return d;
}

DeviceSpec tpu_v5p() {
  DeviceSpec d;
  d.name = "tpu-v5p";
  d.description = "Google Cloud TPU v5p (one chip)";
  d.bf16_flops = 459 * T;
  d.f32_flops = 459 * T / 4;
  d.memory_bytes = 95 * G;
  d.memory_bandwidth = 2.765e12;
  d.devices_per_node = 8960;  // the ICI domain: a whole pod
  d.intra_node_bandwidth = 300 * G;
  d.inter_node_bandwidth = 25 * G;
  d.intra_node_latency = 5e-6;
  d.inter_node_latency = 20e-6;
  d.gemm_efficiency = 0.75;
  const std::string doc = "Google Cloud TPU v5p documentation (system architecture): ";
  d.sources = {{"bf16_flops", doc + "459 TFLOPS bf16 per chip"},
               {"f32_flops", "assumption: f32 matmuls as several bf16 passes, a quarter of the bf16 peak"},
               {"memory_bytes", doc + "95 GB HBM2e per chip"},
               {"memory_bandwidth", doc + "2,765 GB/s per chip"},
               {"devices_per_node", doc + "up to 8,960 chips in one pod on the inter-chip interconnect (3D torus)"},
               {"intra_node_bandwidth", doc + "ICI 4,800 Gb/s per chip (600 GB/s), taken as 300 GB/s each way"},
               {"inter_node_bandwidth", "assumption: data-centre network between pods, 25 GB/s per chip"},
               {"intra_node_latency", "assumption"},
               {"inter_node_latency", "assumption"},
               {"gemm_efficiency", "assumption"}};
  return d;
}

}  // namespace

const std::vector<DeviceSpec>& known_devices() {
  static const std::vector<DeviceSpec> all = {h100(), h200(), a100(), tpu_v5p(), h800()};
  return all;
}

DeviceSpec device_named(const std::string& name, int threads) {
  for (const DeviceSpec& d : known_devices()) {
    if (d.name == name) return d;
  }
  if (name == "cpu") {
    const int n = threads > 0 ? threads : num_threads();
    DeviceSpec d;
    d.name = "cpu";
    const cpu::FmaPeak peak = cpu::measure_fma_peak(n, 0.3);
    const bench::BandwidthResult bw = bench::measure_read_bandwidth(n, int64_t{256} << 20, 3);
    d.description = str("this machine's CPU, ", n, " thread", n == 1 ? "" : "s");
    d.f32_flops = peak.gflops * 1e9;
    d.bf16_flops = d.f32_flops;  // loom's CPU GEMMs: f32 (bf16 on AVX512-BF16 only)
    d.memory_bytes = 0;          // the planner takes the machine's MemAvailable (runs::MemoryBudget)
    d.memory_bandwidth = bw.gb_per_s * 1e9;
    d.devices_per_node = 1 << 20;
    d.intra_node_bandwidth = d.memory_bandwidth / 4;  // a collective reads and writes each byte about twice per rank
    d.inter_node_bandwidth = d.intra_node_bandwidth;
    d.intra_node_latency = d.inter_node_latency = 20e-6;
    d.gemm_efficiency = 0.5;
    d.sources = {{"f32_flops", "measured: `loom bench peak`'s FMA loop, 0.3 s"},
                 {"memory_bandwidth", "measured: `loom bench bandwidth`'s read loop, 256 MiB"},
                 {"intra_node_bandwidth", "model: MPI over shared memory copies each byte in and out, a quarter of the read bandwidth"},
                 {"intra_node_latency", "assumption: a shared-memory MPI step, tens of microseconds with ranks oversubscribed"},
                 {"gemm_efficiency", "assumption: loom's whole training step (GEMMs, attention, norms) at half the FMA peak"}};
    return d;
  }
  std::string names;
  for (const DeviceSpec& d : known_devices()) names += d.name + ", ";
  LOOM_FAIL("plan: unknown device \"", name, "\" (known: ", names, "cpu)");
}

namespace {

// Linear between the points, the first one's value below them, the last segment's slope above them
// (a falling one held flat: noise); never negative.
double interpolate(const std::vector<std::pair<double, double>>& points, double bytes) {
  if (points.empty()) return 0;
  if (points.size() == 1 || bytes <= points.front().first) return std::max(0.0, points.front().second);
  for (size_t i = 1; i < points.size(); ++i) {
    const auto [x0, y0] = points[i - 1];
    const auto [x1, y1] = points[i];
    if (bytes <= x1 || i + 1 == points.size()) {
      const double slope = x1 > x0 ? (y1 - y0) / (x1 - x0) : 0;
      const double y = bytes <= x1 ? y0 + slope * (bytes - x0) : y1 + std::max(0.0, slope) * (bytes - x1);
      return std::max(0.0, y);
    }
  }
  return std::max(0.0, points.back().second);
}

}  // namespace

double DeviceSpec::efficiency_at(double rows) const {
  if (efficiency_by_rows.empty()) return gemm_efficiency;
  std::vector<std::pair<double, double>> e = efficiency_by_rows;
  std::sort(e.begin(), e.end());
  if (rows <= e.front().first) return e.front().second;
  if (rows >= e.back().first) return e.back().second;
  for (size_t i = 1; i < e.size(); ++i) {
    if (rows <= e[i].first) {
      const double t = std::log(rows / e[i - 1].first) / std::log(e[i].first / e[i - 1].first);
      return e[i - 1].second + t * (e[i].second - e[i - 1].second);
    }
  }
  return e.back().second;
}

double CollectiveCost::seconds(double bytes) const { return interpolate(points, bytes); }
double CollectiveCost::cpu_seconds(double bytes) const { return interpolate(cpu_points, bytes); }

const CollectiveCost* DeviceSpec::cost_of(const std::string& kind, int64_t group, int64_t ranks, double gap_s) const {
  // The rank count: the nearest at or above `ranks` (more ranks share the cores: never optimistic), else
  // the largest measured.
  int best_ranks = -1;
  for (const CollectiveCost& c : collective_costs) {
    if (c.kind != kind || c.group != group) continue;
    const bool covers = c.ranks >= ranks, best_covers = best_ranks >= ranks;
    if (best_ranks < 0 || (covers && (!best_covers || c.ranks < best_ranks)) || (!covers && !best_covers && c.ranks > best_ranks)) {
      best_ranks = c.ranks;
    }
  }
  const CollectiveCost* best = nullptr;
  auto distance = [&](double gap) { return std::abs(std::log(std::max(gap, 1e-7) / std::max(gap_s, 1e-7))); };
  for (const CollectiveCost& c : collective_costs) {
    if (c.kind != kind || c.group != group || c.ranks != best_ranks) continue;
    if (!best || distance(c.gap_s) < distance(best->gap_s)) best = &c;
  }
  return best;
}

void load_collective_costs(DeviceSpec& d, const std::string& path) {
  std::ifstream in(path);
  LOOM_CHECK(in.good(), "plan: cannot read the collective costs file \"", path, "\"");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("plan: ", path, " is not JSON: ", e.what());
  }
  LOOM_CHECK(j.is_object() && j.contains("costs") && j["costs"].is_array(), "plan: ", path,
             " wants an object with a \"costs\" array");
  d.collective_costs.clear();
  for (const nlohmann::json& c : j["costs"]) {
    CollectiveCost k;
    try {
      k.kind = c.at("kind").get<std::string>();
      k.group = c.at("group").get<int>();
      k.ranks = c.at("ranks").get<int>();
      k.gap_s = c.at("gap_s").get<double>();
      for (const nlohmann::json& p : c.at("points")) k.points.emplace_back(p.at(0).get<double>(), p.at(1).get<double>());
      if (c.contains("cpu_points")) {
        for (const nlohmann::json& p : c.at("cpu_points")) k.cpu_points.emplace_back(p.at(0).get<double>(), p.at(1).get<double>());
      }
    } catch (const nlohmann::json::exception& e) {
      LOOM_FAIL("plan: ", path, ": an entry of \"costs\" (", c.dump(), "): ", e.what());
    }
    LOOM_CHECK(k.group >= 2 && k.ranks >= k.group && k.gap_s >= 0 && !k.points.empty(), "plan: ", path, ": entry ",
               c.dump(), " wants group >= 2, ranks >= group, gap_s >= 0 and at least one [bytes, seconds] point");
    std::sort(k.points.begin(), k.points.end());
    std::sort(k.cpu_points.begin(), k.cpu_points.end());
    d.collective_costs.push_back(std::move(k));
  }
  d.sources["collective_costs"] = str("measured: `", j.value("command", std::string("?")), "` at ",
                                      j.value("measured_at", std::string("?")), ", load average ",
                                      j.contains("load_average_before") ? j["load_average_before"].dump() : "?", " (", path, ")");
}

}  // namespace loom::plan
