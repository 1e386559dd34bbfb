// Sharded checkpoints: every rank writes the blocks it owns, rank 0 adds an index, and the directory
// is committed as one (runs/checkpoint.h's temporary directory, manifest and rename).
//
//   step_<N>/shards.json                  the index: mesh, mode, and for every tensor (parameters and
//                                         their AdamW moments) its global shape, spec and blocks
//                                         (file, offset, shape)
//   step_<N>/shard.rank_<R>.safetensors   rank R's blocks: "<param>", "<param>.exp_avg", "<param>.exp_avg_sq";
//                                         rank 0's also the model state (DeepSeek-V3's routing biases),
//                                         whole: it is the same on every rank
//   step_<N>/trainer_state.json, manifest.json   as in an unsharded checkpoint
//
// A block replicated over some axes is written once, by its holder at coordinate 0 on those axes. The
// files go into one temporary directory that rank 0 names, and rank 0 renames it only after every rank
// has written and fsync'ed its file (a barrier) and the manifest lists every file's sha256: a checkpoint
// some ranks did not finish is never renamed into place, so never loaded. All ranks must share the file
// system that holds the run directory (one machine, or NFS/Lustre across machines).
//
// Loading assembles each whole tensor from its blocks and keeps this rank's block for the current mesh
// (LanguageModel::load_parameter), so a checkpoint resumes on any mesh or mode, or on one process.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/runtime.h"
#include "io/safetensors.h"

namespace loom::dist {

constexpr const char* kShardIndex = "shards.json";
std::string shard_file_name(int rank);  // "shard.rank_00003.safetensors"

// Whether this rank writes the block it holds of `p` (exactly one holder of each block does).
bool owns_block(const nn::Parameter& p, const RankContext& c);

using StateTensors = std::vector<std::pair<std::string, Tensor>>;  // LanguageModel::state_tensors()

// This rank's owned blocks of the parameters and of their moments (m[i], v[i] laid out like params[i]),
// and on rank 0 the model state, durably to `path`.
void write_rank_shards(const std::string& path, const std::vector<nn::Parameter*>& params,
                       const std::vector<const Tensor*>& m, const std::vector<const Tensor*>& v, const RankContext& c,
                       const StateTensors& state = {});
// The index of a checkpoint written by write_rank_shards on every rank of `c`'s mesh (state tensors are
// listed with "state": true).
nlohmann::json shard_index(const std::vector<nn::Parameter*>& params, const std::vector<TensorLayout>& layout,
                           const RankContext& c, const StateTensors& state = {});

// A sharded checkpoint directory opened for reading whole tensors.
class ShardedCheckpoint {
 public:
  explicit ShardedCheckpoint(const std::string& dir);  // reads and checks shards.json
  bool contains(const std::string& tensor) const { return blocks_.count(tensor) > 0; }
  size_t num_parameters() const { return num_params_; }
  // The whole tensor, assembled from its blocks; throws naming the tensor if a block is missing.
  Tensor whole(const std::string& tensor);

 private:
  struct Block {
    std::string file;
    std::vector<int64_t> offset;
    Shape shape;
  };
  std::string dir_;
  std::map<std::string, std::pair<Shape, std::vector<Block>>> blocks_;
  std::map<std::string, io::SafetensorsFile> files_;
  size_t num_params_ = 0;
};

// Sends rank `root`'s text to every rank of the world (the temporary directory's name).
std::string broadcast_text(const std::string& text, int root, const RankContext& c);

}  // namespace loom::dist
