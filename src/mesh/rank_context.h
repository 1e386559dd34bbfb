// What one rank knows about a sharded run: the mesh, the parallel mode, the communicator and its place
// in them. Made by the program that starts the ranks (`loom train`, tests, Python), attached to every
// parameter by parallel/runtime.h's shard_model, and read by the layers that compute on shards
// (nn/sharded.h) and by the step's gradient sums (parallel/runtime.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mesh/communicator.h"
#include "mesh/mesh.h"

namespace loom::dist {

struct OverlapState;  // nn/overlap.h

// What one rank knows about the run.
struct RankContext {
  Mesh mesh;
  ParallelMode mode = ParallelMode::Dp;
  Communicator* comm = nullptr;
  int rank = 0;
  // Overlap communication with compute (docs/mesh.md, "What is overlapped"): FSDP gathers the next
  // layer's weight while this one computes and reduce-scatters gradients in the background; the data
  // axis all-reduces gradients in buckets during backward (dist::backward). Off: every collective is
  // waited on where it is issued. The results are bitwise the same either way.
  bool overlap = true;
  int64_t bucket_bytes = int64_t{256} << 10;  // a gradient all-reduce starts when this much is final
  // The runtime's state for it (prefetched weights, gradient collectives in flight); made by shard_model.
  mutable std::shared_ptr<OverlapState> overlap_state{};
  // Expert parallelism: the most token rows one rank may receive for its experts in one MoE layer (0:
  // no cap beyond the natural bound; see nn/expert_parallel.h). A larger count is an error naming both.
  int64_t max_expert_rows = 0;
  // The pipe axis (parallel/pipeline.h): stage s runs layers [pipe_bounds[s], pipe_bounds[s + 1]); empty
  // before shard_model, which fills it (balanced by estimated cost) when the mesh has pipe > 1 and it is
  // still empty. The schedule of the micro-batches: "1f1b", "gpipe" or "interleaved" (interleaved 1F1B:
  // pipe_chunks virtual stages per rank, so pipe_bounds then has pipe * pipe_chunks + 1 entries and
  // virtual stage k * pipe + s runs on pipe coordinate s).
  mutable std::vector<int64_t> pipe_bounds{};
  std::string pipe_schedule = "1f1b";
  int64_t pipe_chunks = 1;

  int64_t coord(MeshAxis axis) const { return mesh.coord(rank, axis); }
  Group group(MeshAxis axis) const { return {comm, mesh.group(rank, axis)}; }
  // The ranks holding the blocks of a dimension split over `split` (one axis or several folded), in
  // block order: the group its gathers and reduce-scatters run on.
  Group group(const DimSplit& split) const { return {comm, mesh.split_group(rank, split)}; }
  Group world() const { return {comm, comm->world()}; }
  // The ranks that split the batch with this one (data, and expert under dp_ep / fsdp_ep).
  Group batch_group() const { return {comm, mesh.group(rank, batch_axes(mode))}; }
};

}  // namespace loom::dist
