// The device mesh from Python (docs/mesh.md): Mesh, the modes' validation (loom::Error -> ValueError),
// the layout table, and ShardedModel: one model sharded over N simulated devices, the ranks of an
// in-process communicator (threads), like JAX's --xla_force_host_platform_device_count. It exposes, for
// every parameter and optimizer moment, its partition spec, global shape and each device's shard
// (device, offset, array), and trains on global batches exactly as one process would. The expert axis
// (dp_ep, fsdp_ep; nn/expert_parallel.h) is there too: routed experts split over it, tokens exchanged between
// the expert ranks by the in-process all-to-all.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <thread>

#include "convert.h"
#include "mesh/communicator.h"
#include "parallel/runtime.h"
#include "core/rng.h"
#include "io/json.h"
#include "models/model_config.h"
#include "train/optimizer.h"

namespace loom::python {
namespace {

// JAX's PartitionSpec entries: None, an axis name, or a tuple of names for axes folded into one
// dimension (fsdp_ep's dense weights: ("data", "expert")).
nb::tuple spec_tuple(const dist::PartitionSpec& spec, int ndim) {
  nb::list dims;
  for (int i = 0; i < ndim; ++i) {
    const dist::DimSplit split = spec.dims.empty() ? dist::DimSplit() : spec.dims[static_cast<size_t>(i)];
    if (split.axes.size() == 1) {
      dims.append(nb::str(dist::mesh_axis_name(split.axes[0])));
    } else if (split) {
      nb::list names;
      for (dist::MeshAxis a : split.axes) names.append(nb::str(dist::mesh_axis_name(a)));
      dims.append(nb::tuple(names));
    } else {
      dims.append(nb::none());
    }
  }
  return nb::tuple(dims);
}

dist::MeshAxis axis_from_name(const std::string& axis) {
  if (axis == "data") return dist::MeshAxis::Data;
  if (axis == "tensor") return dist::MeshAxis::Tensor;
  LOOM_CHECK(axis == "expert", "Mesh.coord: unknown axis \"", axis, "\" (the mesh axes are data, tensor and expert)");
  return dist::MeshAxis::Expert;
}

nb::tuple int_tuple(const std::vector<int64_t>& v) {
  nb::list l;
  for (int64_t x : v) l.append(x);
  return nb::tuple(l);
}

class ShardedModel {
 public:
  ShardedModel(const std::string& model_json, const dist::Mesh& mesh, const std::string& mode, uint64_t seed,
               train::AdamWOptions adamw, double grad_clip, bool overlap, int64_t max_expert_rows)
      : mesh_(mesh), mode_(dist::parallel_mode_from_name(mode)), clip_(grad_clip), seed_(seed) {
    dist::validate_mesh_for_mode(mesh_, mode_);
    LOOM_CHECK(grad_clip >= 0, "ShardedModel: grad_clip must be >= 0, got ", grad_clip);
    LOOM_CHECK(max_expert_rows >= 0, "ShardedModel: max_expert_rows must be >= 0 (0: no cap), got ", max_expert_rows);
    const models::ModelConfig config = models::ModelConfig::from_json(io::parse_json(model_json, "ShardedModel config"));
    world_ = std::make_unique<dist::InProcessWorld>(static_cast<int>(mesh_.size()));
    for (int r = 0; r < mesh_.size(); ++r) {
      ranks_.push_back(Rank{});
      Rank& k = ranks_.back();
      auto ctx = std::make_shared<dist::RankContext>();  // fields by name: the struct grows
      ctx->mesh = mesh_;
      ctx->mode = mode_;
      ctx->comm = &world_->communicator(r);
      ctx->rank = r;
      ctx->overlap = overlap;
      ctx->max_expert_rows = max_expert_rows;
      k.ctx = std::move(ctx);
      k.model = config.build(seed);
      k.layout = dist::shard_model(*k.model, k.ctx);  // plans, checks, keeps this device's blocks
      k.opt = std::make_unique<train::AdamW>(k.model->parameters(), adamw);
    }
  }

  // One training step on the global batch, as the trainer takes it (training forward: dropout, and
  // DeepSeek-V3's MTP and balance losses; its routing biases move afterwards on the global expert
  // loads); returns the global loss (as one process computes it).
  double step(const Tensor& ids, const Tensor& targets, float lr) {
    // Every rank uses the same dropout key, as the ranks of `loom train --mesh` do.
    const models::ForwardContext fwd = models::ForwardContext::train(RngKey::from_seed(seed_).fold_in(steps_++));
    std::vector<double> loss(ranks_.size());
    std::vector<std::exception_ptr> errors(ranks_.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          Rank& k = ranks_[r];
          auto params = k.model->parameters();
          k.model->begin_training_step();
          k.opt->zero_grad();
          Tensor l = k.model->loss(dist::local_batch(ids, *k.ctx), dist::local_batch(targets, *k.ctx), fwd);
          loss[r] = dist::global_loss(l.item(), *k.ctx);
          dist::backward(l, params, *k.ctx);  // starts the gradient all-reduces as they become final
          dist::finish_gradients(params, *k.ctx);
          if (clip_ > 0) dist::clip_grad_norm(params, k.layout, *k.ctx, clip_);
          k.opt->step(lr);
          k.model->end_training_step(true);  // collective under expert modes: every rank calls it
        } catch (const std::exception& e) {
          errors[r] = std::current_exception();
          world_->abort(static_cast<int>(r), e.what());
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);  // a bad batch fails every rank alike: the first says why
    }
    return loss[0];
  }

  // name -> {"spec", "global_shape", "group", "shards": [{"device", "offset", "array"}]}, for every
  // parameter and, after it, its moments "<name>.exp_avg" and "<name>.exp_avg_sq".
  nb::dict layout() {
    nb::dict out;
    auto params0 = ranks_[0].model->parameters();
    for (size_t i = 0; i < params0.size(); ++i) {
      const nn::Parameter& p = *params0[i];
      for (int which = 0; which < 3; ++which) {
        const std::string name = p.name + (which == 0 ? "" : which == 1 ? ".exp_avg" : ".exp_avg_sq");
        nb::list shards;
        for (size_t r = 0; r < ranks_.size(); ++r) {
          Rank& k = ranks_[r];
          const Tensor& t = which == 0 ? k.model->parameters()[i]->value : which == 1 ? k.opt->exp_avg(i) : k.opt->exp_avg_sq(i);
          nb::dict s;
          s["device"] = static_cast<int>(r);
          s["offset"] = int_tuple(k.layout[i].shards[r].offset);
          s["array"] = to_numpy_copy(t);
          shards.append(s);
        }
        nb::dict d;
        d["spec"] = spec_tuple(p.spec, p.global_shape.ndim());
        d["global_shape"] = int_tuple(p.global_shape.vec());
        d["group"] = nn::param_group_name(p.group);
        d["shards"] = shards;
        out[name.c_str()] = d;
      }
    }
    return out;
  }

  // The model state that is not a parameter (DeepSeek-V3's routing biases), name -> array per device:
  // replicated, so every device's copy must agree.
  nb::dict state() {
    nb::dict out;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (const auto& [name, t] : ranks_[r].model->state_tensors()) {
        if (r == 0) out[name.c_str()] = nb::list();
        nb::list(out[name.c_str()]).append(to_numpy_copy(t));
      }
    }
    return out;
  }

  const dist::Mesh& mesh() const { return mesh_; }
  std::string mode() const { return dist::parallel_mode_name(mode_); }
  std::string config_json() const { return ranks_[0].model->model_config().json().dump(); }

 private:
  struct Rank {
    std::shared_ptr<dist::RankContext> ctx;
    std::unique_ptr<models::LanguageModel> model;
    std::vector<dist::TensorLayout> layout;
    std::unique_ptr<train::AdamW> opt;
  };
  dist::Mesh mesh_;
  dist::ParallelMode mode_;
  double clip_;
  uint64_t seed_;
  uint64_t steps_ = 0;
  std::unique_ptr<dist::InProcessWorld> world_;
  std::vector<Rank> ranks_;
};

}  // namespace

void bind_dist(nb::module_& m) {
  nb::class_<dist::Mesh>(m, "Mesh")
      .def("__init__",
           [](dist::Mesh* self, int64_t data, int64_t tensor, int64_t expert) {
             LOOM_CHECK(data >= 1 && tensor >= 1 && expert >= 1, "Mesh: axis sizes must be positive, got data=", data,
                        " tensor=", tensor, " expert=", expert);
             new (self) dist::Mesh{data, tensor, expert};
           },
           nb::arg("data") = 1, nb::arg("tensor") = 1, nb::arg("expert") = 1)
      .def_static("parse", &dist::Mesh::parse)
      .def_prop_ro("data", [](const dist::Mesh& s) { return s.data; })
      .def_prop_ro("tensor", [](const dist::Mesh& s) { return s.tensor; })
      .def_prop_ro("expert", [](const dist::Mesh& s) { return s.expert; })
      .def_prop_ro("size", &dist::Mesh::size)
      // (data, tensor), and (data, tensor, expert) when the mesh has an expert axis, as str() writes it.
      .def_prop_ro("shape",
                   [](const dist::Mesh& s) {
                     if (s.expert > 1) return nb::make_tuple(s.data, s.tensor, s.expert);
                     return nb::make_tuple(s.data, s.tensor);
                   })
      .def("coords",
           [](const dist::Mesh& s, int64_t rank) {
             LOOM_CHECK(rank >= 0 && rank < s.size(), "Mesh.coords: device ", rank, " outside [0, ", s.size(), ")");
             const int64_t d = s.coord(rank, dist::MeshAxis::Data), t = s.coord(rank, dist::MeshAxis::Tensor);
             return s.expert > 1 ? nb::make_tuple(d, t, s.coord(rank, dist::MeshAxis::Expert)) : nb::make_tuple(d, t);
           })
      .def("coord",
           [](const dist::Mesh& s, int64_t rank, const std::string& axis) {
             LOOM_CHECK(rank >= 0 && rank < s.size(), "Mesh.coord: device ", rank, " outside [0, ", s.size(), ")");
             return s.coord(rank, axis_from_name(axis));
           })
      // A spec entry's tuple of folded axes, ("data", "expert"): the device's block index d * expert + e.
      .def("coord",
           [](const dist::Mesh& s, int64_t rank, const std::vector<std::string>& axes) {
             LOOM_CHECK(rank >= 0 && rank < s.size(), "Mesh.coord: device ", rank, " outside [0, ", s.size(), ")");
             std::vector<dist::MeshAxis> split;
             for (const std::string& a : axes) split.push_back(axis_from_name(a));
             return s.split_coord(rank, dist::DimSplit::folded(split));
           })
      .def("__repr__", [](const dist::Mesh& s) { return "Mesh(" + s.str() + ")"; })
      .def("__str__", &dist::Mesh::str);

  m.def("validate_parallel_mode", [](const std::string& mode) { dist::parallel_mode_from_name(mode); });
  m.def("validate_mesh_for_mode", [](const dist::Mesh& mesh, const std::string& mode) {
    dist::validate_mesh_for_mode(mesh, dist::parallel_mode_from_name(mode));
  });
  m.def("validate_mesh_for_devices", [](const dist::Mesh& mesh, int64_t devices) {
    dist::validate_mesh_for_ranks(mesh, devices, "the caller");
  });
  m.def("validate_experts_for_mesh", [](int64_t n_routed, const dist::Mesh& mesh, const std::string& mode) {
    dist::validate_experts_for_mesh(n_routed, mesh, dist::parallel_mode_from_name(mode));
  });
  m.def("batch_spec", [](const std::string& mode) {
    return spec_tuple(dist::batch_spec(dist::parallel_mode_from_name(mode)), 2);
  });

  nb::class_<ShardedModel>(m, "ShardedModel")
      .def("__init__",
           [](ShardedModel* self, const std::string& model_json, const dist::Mesh& mesh, const std::string& mode,
              uint64_t seed, float lr, float beta1, float beta2, float eps, float weight_decay, double grad_clip,
              bool overlap, int64_t max_expert_rows) {
             new (self) ShardedModel(model_json, mesh, mode, seed, {lr, beta1, beta2, eps, weight_decay}, grad_clip,
                                     overlap, max_expert_rows);
           })
      .def("step",
           [](ShardedModel& self, In<int32_t> ids, In<int32_t> targets, float lr) {
             Tensor a = to_tensor(ids), b = to_tensor(targets);
             return without_gil([&] { return self.step(a, b, lr); });
           })
      .def("layout", &ShardedModel::layout)
      .def("state", &ShardedModel::state)
      .def_prop_ro("mesh", &ShardedModel::mesh)
      .def_prop_ro("mode", &ShardedModel::mode)
      .def_prop_ro("config_json", &ShardedModel::config_json);
}

}  // namespace loom::python
