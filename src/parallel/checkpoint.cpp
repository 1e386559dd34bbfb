#include "parallel/checkpoint.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/json.h"
#include "tokenizer/formats.h"

namespace loom::dist {
namespace fs = std::filesystem;
using nlohmann::json;

std::string shard_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard.rank_%05d.safetensors", rank);
  return buf;
}

bool owns_block(const nn::Parameter& p, const RankContext& c) {
  // A (data, expert) dimension splits over both: every rank of that grid owns its block.
  for (MeshAxis a : {MeshAxis::Data, MeshAxis::Tensor, MeshAxis::Expert}) {
    if (!p.spec.splits_over(a) && c.coord(a) != 0) return false;
  }
  // Under a pipe axis: the first stage that runs it (the others' copies are not trained).
  return p.pipe_stages.empty() || c.coord(MeshAxis::Pipe) == p.pipe_stages.front();
}

void write_rank_shards(const std::string& path, const std::vector<nn::Parameter*>& params,
                       const std::vector<const Tensor*>& m, const std::vector<const Tensor*>& v, const RankContext& c,
                       const StateTensors& state) {
  io::NamedTensors tensors;
  if (c.rank == 0) {
    for (const auto& [name, t] : state) tensors.emplace_back(name, t);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!owns_block(*params[i], c)) continue;
    tensors.emplace_back(params[i]->name, params[i]->value.detach());
    tensors.emplace_back(params[i]->name + ".exp_avg", *m[i]);
    tensors.emplace_back(params[i]->name + ".exp_avg_sq", *v[i]);
  }
  io::write_safetensors(path, tensors, {{"loom.shard_rank", std::to_string(c.rank)}, {"loom.mesh", c.mesh.str()}});
}

json shard_index(const std::vector<nn::Parameter*>& params, const std::vector<TensorLayout>& layout,
                 const RankContext& c, const StateTensors& state) {
  json tensors = json::array();
  for (const auto& [name, t] : state) {
    const std::vector<int64_t> zeros(static_cast<size_t>(t.ndim()), 0);
    tensors.push_back({{"name", name}, {"shape", t.shape().vec()}, {"spec", "()"}, {"parameter", false}, {"state", true},
                       {"blocks", json::array({{{"file", shard_file_name(0)}, {"offset", zeros}, {"shape", t.shape().vec()}}})}});
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const nn::Parameter& p = *params[i];
    json blocks = json::array();
    for (const Shard& s : layout[i].shards) {
      RankContext holder = c;
      holder.rank = static_cast<int>(s.rank);
      if (!owns_block(p, holder)) continue;
      blocks.push_back({{"file", shard_file_name(static_cast<int>(s.rank))}, {"offset", s.offset}, {"shape", s.shape.vec()}});
    }
    for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq"}) {
      tensors.push_back({{"name", p.name + suffix}, {"shape", p.global_shape.vec()}, {"spec", p.spec.str()},
                         {"blocks", blocks}, {"parameter", *suffix == '\0'}});
    }
  }
  return {{"format", "loom-sharded-checkpoint"}, {"version", 1}, {"mesh", c.mesh.str()},
          {"mode", parallel_mode_name(c.mode)}, {"ranks", c.mesh.size()}, {"tensors", tensors}};
}

ShardedCheckpoint::ShardedCheckpoint(const std::string& dir) : dir_(dir) {
  const std::string path = (fs::path(dir) / kShardIndex).string();
  json j = io::try_parse_json(tokenizer::read_file(path));
  LOOM_CHECK(!j.is_discarded() && j.is_object() && j.value("format", "") == "loom-sharded-checkpoint", path,
             " is not a loom sharded-checkpoint index");
  try {
    for (const json& t : j.at("tensors")) {
      std::vector<Block> blocks;
      for (const json& b : t.at("blocks")) {
        blocks.push_back({b.at("file").get<std::string>(), b.at("offset").get<std::vector<int64_t>>(),
                          Shape(b.at("shape").get<std::vector<int64_t>>())});
      }
      blocks_[t.at("name").get<std::string>()] = {Shape(t.at("shape").get<std::vector<int64_t>>()), std::move(blocks)};
      if (t.at("parameter").get<bool>()) ++num_params_;
    }
  } catch (const json::exception& e) {
    LOOM_FAIL(path, ": malformed index: ", e.what());
  }
}

Tensor ShardedCheckpoint::whole(const std::string& name) {
  auto it = blocks_.find(name);
  LOOM_CHECK(it != blocks_.end(), dir_, "/", kShardIndex, ": no tensor '", name, "'");
  const auto& [shape, blocks] = it->second;
  Tensor out = Tensor::zeros(shape);
  int64_t covered = 0;
  for (const Block& b : blocks) {
    auto f = files_.find(b.file);
    if (f == files_.end()) f = files_.emplace(b.file, io::SafetensorsFile::open((fs::path(dir_) / b.file).string())).first;
    LOOM_CHECK(f->second.contains(name), dir_, "/", b.file, ": missing '", name, "', which the index places there");
    Tensor block = f->second.tensor(name);
    if (block.dtype() != DType::F32) block = block.to(DType::F32);
    Shard s;
    s.offset = b.offset;
    s.shape = b.shape;
    LOOM_CHECK(block.shape() == b.shape && static_cast<int>(b.offset.size()) == shape.ndim(), dir_, "/", b.file, ": '", name,
               "' has shape ", block.shape(), ", the index says ", b.shape);
    for (int d = 0; d < shape.ndim(); ++d) {
      LOOM_CHECK(b.offset[static_cast<size_t>(d)] >= 0 && b.offset[static_cast<size_t>(d)] + b.shape[d] <= shape[d], dir_,
                 ": block of '", name, "' lies outside its shape ", shape);
    }
    paste_block(out, block, s);
    covered += b.shape.numel();
  }
  LOOM_CHECK(covered == shape.numel(), dir_, ": the blocks of '", name, "' cover ", covered, " of its ", shape.numel(),
             " elements");
  return out;
}

std::string broadcast_text(const std::string& text, int root, const RankContext& c) {
  const auto world = c.comm->world();
  float n = static_cast<float>(text.size());
  c.comm->broadcast(&n, 1, root, world);
  std::vector<float> chars(static_cast<size_t>(n));
  if (c.rank == root) {
    for (size_t i = 0; i < text.size(); ++i) chars[i] = static_cast<float>(static_cast<unsigned char>(text[i]));
  }
  if (!chars.empty()) c.comm->broadcast(chars.data(), static_cast<int64_t>(chars.size()), root, world);
  std::string out(chars.size(), '\0');
  for (size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<char>(static_cast<unsigned char>(chars[i]));
  return out;
}

}  // namespace loom::dist
