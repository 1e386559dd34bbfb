// The mesh, the modes' validation and the per-parameter layout (src/mesh/mesh.h).
//
// The expected layout is restated here from the issue's table in terms of parameter names (which
// dimension of which weight each axis splits), independently of dist::spec_for, and every tensor's
// shards are checked to tile its global array exactly.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "core/error.h"
#include "mesh/mesh.h"
#include "nn/sharded.h"
#include "models/gpt2/model.h"
#include "models/llama/model.h"
#include "support/errors.h"

using namespace loom;
using loom::test::error_of;
using dist::Mesh;
using dist::ParallelMode;

namespace {

llama::Config tiny_llama() {
  return {.vocab_size = 64, .context_length = 16, .d_model = 32, .num_layers = 2, .num_heads = 8, .num_kv_heads = 4,
      .d_ff = 64};
}

gpt2::Config tiny_gpt2(bool tied) {
  return {.vocab_size = 64, .context_length = 16, .d_model = 32, .num_layers = 2, .num_heads = 8, .tie_embeddings = tied};
}

const std::vector<std::pair<int64_t, int64_t>> kMeshes = {{8, 1}, {1, 4}, {4, 2}, {2, 2}, {2, 1}, {1, 2}};
const std::vector<ParallelMode> kModes = {ParallelMode::Dp, ParallelMode::Fsdp, ParallelMode::Tp, ParallelMode::FsdpTp};

bool valid(ParallelMode mode, const Mesh& m) {
  switch (mode) {
    case ParallelMode::Dp:
    case ParallelMode::Fsdp: return m.tensor == 1;
    case ParallelMode::Tp: return m.data == 1;
    case ParallelMode::FsdpTp: return m.data > 1 && m.tensor > 1;
    case ParallelMode::DpEp:
    case ParallelMode::FsdpEp: return false;  // these meshes have no expert axis (expert_test.cpp covers it)
  }
  return false;
}

bool matches(const std::string& name, const char* pattern) { return std::regex_match(name, std::regex(pattern)); }

// The issue's table by name: for each dimension, the axis that splits it ("data", "tensor" or "").
std::vector<std::string> expected_axes(const std::string& raw_name, ParallelMode mode, int ndim) {
  // Moments are laid out like their parameter.
  const std::string name = std::regex_replace(raw_name, std::regex("\\.exp_avg(_sq)?$"), "");
  const bool fsdp = mode == ParallelMode::Fsdp || mode == ParallelMode::FsdpTp;
  const bool tp = mode == ParallelMode::Tp || mode == ParallelMode::FsdpTp;
  const std::string d = fsdp ? "data" : "", t = tp ? "tensor" : "";
  // dense_in: q, k, v, w1, w3 (Llama), fc (GPT-2): [out, in] -> (tensor, data)
  if (matches(name, R"(.*\.(q_proj|k_proj|v_proj|w1|w3|fc)\.weight)")) return {t, d};
  if (matches(name, R"(.*\.(q_proj|k_proj|v_proj|w1|w3|fc)\.bias)")) return {t};
  // dense_out: output_proj, w2 (Llama), proj (GPT-2): [out, in] -> (data, tensor)
  if (matches(name, R"(.*\.(output_proj|w2|proj)\.weight)")) return {d, t};
  if (matches(name, R"(.*\.(output_proj|w2|proj)\.bias)")) return {d};
  // embedding, lm_head, GPT-2 positions: tensor on d_model (dim 1), never data
  if (matches(name, R"((token_embeddings|position_embeddings|lm_head)\.weight)")) return {"", t};
  // norms: replicated
  if (matches(name, R"((.*\.)?(ln1|ln2|ln_final)\.(weight|bias))")) return std::vector<std::string>(static_cast<size_t>(ndim));
  ADD_FAILURE() << "no expectation for parameter " << name;
  return {};
}

int64_t axis_coord(const Mesh& m, int64_t rank, const std::string& axis) {
  if (axis == "data") return rank / m.tensor;
  if (axis == "tensor") return rank % m.tensor;
  return 0;
}
int64_t axis_size(const Mesh& m, const std::string& axis) {
  return axis == "data" ? m.data : axis == "tensor" ? m.tensor : 1;
}

void check_layout(const std::vector<dist::ParamInfo>& params, const Mesh& mesh, ParallelMode mode) {
  SCOPED_TRACE(std::string(dist::parallel_mode_name(mode)) + " on " + mesh.str());
  auto layouts = dist::plan_layout_with_moments(params, mesh, mode);
  ASSERT_EQ(layouts.size(), params.size() * 3);  // each parameter and its two moments
  for (const dist::TensorLayout& l : layouts) {
    SCOPED_TRACE(l.name);
    const int nd = l.global_shape.ndim();
    const auto axes = expected_axes(l.name, mode, nd);
    ASSERT_EQ(static_cast<int>(axes.size()), nd);
    ASSERT_EQ(static_cast<int64_t>(l.shards.size()), mesh.size());
    // Spec and shards per rank, as the table says.
    for (int i = 0; i < nd; ++i) {
      const dist::DimSplit got = l.spec.dims.empty() ? dist::DimSplit() : l.spec.dims[static_cast<size_t>(i)];
      EXPECT_EQ(got ? got.str() : std::string(), axes[static_cast<size_t>(i)]) << "dim " << i;
    }
    for (int64_t r = 0; r < mesh.size(); ++r) {
      const dist::Shard& s = l.shards[static_cast<size_t>(r)];
      EXPECT_EQ(s.rank, r);
      for (int i = 0; i < nd; ++i) {
        const std::string& a = axes[static_cast<size_t>(i)];
        const int64_t n = axis_size(mesh, a), g = l.global_shape[i];
        EXPECT_EQ(s.shape[i], g / n) << "rank " << r << " dim " << i;
        EXPECT_EQ(s.offset[static_cast<size_t>(i)], axis_coord(mesh, r, a) * (g / n)) << "rank " << r << " dim " << i;
      }
    }
    // Tiling: every element is covered by the same number of ranks, which is the replication, and the
    // distinct blocks partition the array (their sizes add up to it).
    std::vector<int> cover(static_cast<size_t>(l.global_shape.numel()), 0);
    std::map<std::vector<int64_t>, int> blocks;
    for (const dist::Shard& s : l.shards) {
      ++blocks[s.offset];
      const int64_t rows = nd == 2 ? s.shape[0] : 1, cols = s.shape[nd - 1];
      const int64_t r0 = nd == 2 ? s.offset[0] : 0, c0 = s.offset[static_cast<size_t>(nd - 1)];
      const int64_t width = l.global_shape[nd - 1];
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) ++cover[static_cast<size_t>((r0 + i) * width + c0 + j)];
      }
    }
    const int64_t rep = l.replication();
    EXPECT_EQ(rep * static_cast<int64_t>(blocks.size()), mesh.size());
    for (const auto& [offset, count] : blocks) EXPECT_EQ(count, rep);
    for (int c : cover) ASSERT_EQ(c, rep);
  }
}

}  // namespace

TEST(Mesh, ParsesAndPrints) {
  Mesh m = Mesh::parse("data=4,tensor=2");
  EXPECT_EQ(m.data, 4);
  EXPECT_EQ(m.tensor, 2);
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.str(), "data=4,tensor=2");
  EXPECT_EQ(Mesh::parse("tensor=2").str(), "data=1,tensor=2");
  EXPECT_EQ(Mesh::parse("tensor=3,data=2").str(), "data=2,tensor=3");
  // Tensor fastest: a tensor group is neighbouring ranks.
  EXPECT_EQ(m.group(5, dist::MeshAxis::Tensor), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(5, dist::MeshAxis::Data), (std::vector<int>{1, 3, 5, 7}));
  for (const char* bad : {"", "data", "data=0", "data=-1", "data=x", "data=2,data=2", "pipeline=2", "data=2;tensor=2"}) {
    EXPECT_THROW(Mesh::parse(bad), Error) << bad;
  }
  EXPECT_NE(error_of([] { Mesh::parse("pipeline=2"); }).find("unknown axis \"pipeline\""), std::string::npos);
}

TEST(Mesh, ModesAndTheirValidation) {
  for (ParallelMode m : kModes) EXPECT_EQ(dist::parallel_mode_from_name(dist::parallel_mode_name(m)), m);
  const std::string unknown = error_of([] { dist::parallel_mode_from_name("zero3"); });
  EXPECT_NE(unknown.find("\"zero3\""), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("fsdp_tp"), std::string::npos) << unknown;

  for (auto [d, t] : kMeshes) {
    const Mesh mesh{d, t};
    for (ParallelMode mode : kModes) {
      if (valid(mode, mesh)) {
        EXPECT_NO_THROW(dist::validate_mesh_for_mode(mesh, mode)) << mesh.str();
      } else {
        const std::string e = error_of([&] { dist::validate_mesh_for_mode(mesh, mode); });
        EXPECT_NE(e.find(mesh.str()), std::string::npos) << e;
        EXPECT_NE(e.find(dist::parallel_mode_name(mode)), std::string::npos) << e;
      }
    }
  }
  EXPECT_NE(error_of([] { dist::validate_mesh_for_mode({2, 2}, ParallelMode::Dp); }).find("needs tensor=1"), std::string::npos);
  EXPECT_NE(error_of([] { dist::validate_mesh_for_mode({2, 2}, ParallelMode::Tp); }).find("needs data=1"), std::string::npos);
  EXPECT_NE(error_of([] { dist::validate_mesh_for_mode({1, 2}, ParallelMode::FsdpTp); }).find("data > 1 and tensor > 1"),
            std::string::npos);

  const std::string too_big = error_of([] { dist::validate_mesh_for_ranks({4, 2}, 4, "mpirun"); });
  EXPECT_NE(too_big.find("needs 8 ranks, but mpirun started only 4"), std::string::npos) << too_big;
  EXPECT_THROW(dist::validate_mesh_for_ranks({2, 1}, 4, "mpirun"), Error);
  EXPECT_NO_THROW(dist::validate_mesh_for_ranks({2, 2}, 4, "mpirun"));
}

TEST(Mesh, BatchSpecs) {
  EXPECT_EQ(dist::batch_spec(ParallelMode::Dp).str(), "(data, None)");
  EXPECT_EQ(dist::batch_spec(ParallelMode::Fsdp).str(), "(data, None)");
  EXPECT_EQ(dist::batch_spec(ParallelMode::Tp).str(), "(None, None)");
  EXPECT_EQ(dist::batch_spec(ParallelMode::FsdpTp).str(), "(data, None)");
  EXPECT_NO_THROW(dist::validate_batch_for_mesh(6, {4, 1}, ParallelMode::Tp));  // tp never splits the batch
  const std::string e = error_of([] { dist::validate_batch_for_mesh(6, {4, 1}, ParallelMode::Dp); });
  EXPECT_NE(e.find("training.batch_size=6"), std::string::npos) << e;
}

TEST(Layout, LlamaMatchesTheTableAndTilesOnEveryMesh) {
  llama::TransformerLM model(tiny_llama(), 1);
  const auto params = dist::param_infos(model.parameters());
  int checked = 0;
  for (auto [d, t] : kMeshes) {
    for (ParallelMode mode : kModes) {
      if (!valid(mode, {d, t})) continue;
      check_layout(params, {d, t}, mode);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);  // (8,1),(2,1): dp+fsdp; (1,4),(1,2): tp; (4,2),(2,2): fsdp_tp
}

TEST(Layout, Gpt2BiasesAndPositionsFollowTheTable) {
  for (bool tied : {true, false}) {
    gpt2::GPT2 model(tiny_gpt2(tied), 1);
    const auto params = dist::param_infos(model.parameters());
    for (auto [d, t] : kMeshes) {
      for (ParallelMode mode : kModes) {
        if (valid(mode, {d, t})) check_layout(params, {d, t}, mode);
      }
    }
  }
}

TEST(Layout, ADimensionThatDoesNotDivideNamesTheParameter) {
  llama::Config c = tiny_llama();
  c.d_ff = 36;  // w1/w3 [36, 32] split 8 ways on the output dim
  llama::TransformerLM model(c, 1);
  const std::string e =
      error_of([&] { dist::plan_layout(dist::param_infos(model.parameters()), {1, 8}, ParallelMode::Tp); });
  EXPECT_NE(e.find("'layers.0.ffn.w1.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("size 36 does not divide by the tensor axis of size 8"), std::string::npos) << e;
  // The same model is fine where only d_model is split.
  EXPECT_NO_THROW(dist::plan_layout(dist::param_infos(model.parameters()), {8, 1}, ParallelMode::Fsdp));
  // Heads: 8 query heads and 4 key/value heads cannot split 8 ways without cutting a head.
  const std::string heads = error_of([] { dist::validate_model_for_mesh(8, 4, {1, 8}, ParallelMode::Tp); });
  EXPECT_NE(heads.find("(4) do not divide by tensor=8"), std::string::npos) << heads;
  EXPECT_NO_THROW(dist::validate_model_for_mesh(8, 4, {8, 1}, ParallelMode::Fsdp));
}
