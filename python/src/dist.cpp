// The device mesh from Python (docs/mesh.md): Mesh, the modes' validation (loom::Error -> ValueError),
// the layout table, and ShardedModel: one model sharded over N simulated devices, the ranks of an
// in-process communicator (threads), like JAX's --xla_force_host_platform_device_count. It exposes, for
// every parameter and optimizer moment, its partition spec, global shape and each device's shard
// (device, offset, array), and trains on global batches exactly as one process would.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <thread>

#include "convert.h"
#include "dist/communicator.h"
#include "dist/runtime.h"
#include "io/json.h"
#include "models/model_config.h"
#include "train/optimizer.h"

namespace loom::python {
namespace {

nb::tuple spec_tuple(const dist::PartitionSpec& spec, int ndim) {
  nb::list dims;
  for (int i = 0; i < ndim; ++i) {
    const auto& a = spec.dims.empty() ? std::nullopt : spec.dims[static_cast<size_t>(i)];
    if (a) {
      dims.append(nb::str(dist::mesh_axis_name(*a)));
    } else {
      dims.append(nb::none());
    }
  }
  return nb::tuple(dims);
}

nb::tuple int_tuple(const std::vector<int64_t>& v) {
  nb::list l;
  for (int64_t x : v) l.append(x);
  return nb::tuple(l);
}

class ShardedModel {
 public:
  ShardedModel(const std::string& model_json, const dist::Mesh& mesh, const std::string& mode, uint64_t seed,
               train::AdamWOptions adamw, double grad_clip, bool overlap)
      : mesh_(mesh), mode_(dist::parallel_mode_from_name(mode)), clip_(grad_clip) {
    dist::validate_mesh_for_mode(mesh_, mode_);
    LOOM_CHECK(grad_clip >= 0, "ShardedModel: grad_clip must be >= 0, got ", grad_clip);
    const models::ModelConfig config = models::ModelConfig::from_json(io::parse_json(model_json, "ShardedModel config"));
    world_ = std::make_unique<dist::InProcessWorld>(static_cast<int>(mesh_.size()));
    for (int r = 0; r < mesh_.size(); ++r) {
      ranks_.push_back(Rank{});
      Rank& k = ranks_.back();
      k.ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh_, mode_, &world_->communicator(r), r, overlap});
      k.model = config.build(seed);
      k.layout = dist::shard_model(*k.model, k.ctx);  // plans, checks, keeps this device's blocks
      k.opt = std::make_unique<train::AdamW>(k.model->parameters(), adamw);
    }
  }

  // One optimizer step on the global batch; returns the global loss (as one process computes it).
  double step(const Tensor& ids, const Tensor& targets, float lr) {
    std::vector<double> loss(ranks_.size());
    std::vector<std::exception_ptr> errors(ranks_.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          Rank& k = ranks_[r];
          auto params = k.model->parameters();
          k.opt->zero_grad();
          Tensor l = k.model->loss(dist::local_batch(ids, *k.ctx), dist::local_batch(targets, *k.ctx));
          loss[r] = dist::global_loss(l.item(), *k.ctx);
          dist::backward(l, params, *k.ctx);  // starts the gradient all-reduces as they become final
          dist::finish_gradients(params, *k.ctx);
          if (clip_ > 0) dist::clip_grad_norm(params, k.layout, *k.ctx, clip_);
          k.opt->step(lr);
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

  const dist::Mesh& mesh() const { return mesh_; }
  std::string mode() const { return dist::parallel_mode_name(mode_); }

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
  std::unique_ptr<dist::InProcessWorld> world_;
  std::vector<Rank> ranks_;
};

}  // namespace

void bind_dist(nb::module_& m) {
  nb::class_<dist::Mesh>(m, "Mesh")
      .def("__init__",
           [](dist::Mesh* self, int64_t data, int64_t tensor) {
             LOOM_CHECK(data >= 1 && tensor >= 1, "Mesh: axis sizes must be positive, got data=", data, " tensor=", tensor);
             new (self) dist::Mesh{data, tensor};
           },
           nb::arg("data") = 1, nb::arg("tensor") = 1)
      .def_static("parse", &dist::Mesh::parse)
      .def_prop_ro("data", [](const dist::Mesh& s) { return s.data; })
      .def_prop_ro("tensor", [](const dist::Mesh& s) { return s.tensor; })
      .def_prop_ro("size", &dist::Mesh::size)
      .def_prop_ro("shape", [](const dist::Mesh& s) { return nb::make_tuple(s.data, s.tensor); })
      .def("coords", [](const dist::Mesh& s, int64_t rank) {
        LOOM_CHECK(rank >= 0 && rank < s.size(), "Mesh.coords: device ", rank, " outside [0, ", s.size(), ")");
        return nb::make_tuple(s.coord(rank, dist::MeshAxis::Data), s.coord(rank, dist::MeshAxis::Tensor));
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
  m.def("batch_spec", [](const std::string& mode) {
    return spec_tuple(dist::batch_spec(dist::parallel_mode_from_name(mode)), 2);
  });

  nb::class_<ShardedModel>(m, "ShardedModel")
      .def("__init__",
           [](ShardedModel* self, const std::string& model_json, const dist::Mesh& mesh, const std::string& mode,
              uint64_t seed, float lr, float beta1, float beta2, float eps, float weight_decay, double grad_clip,
              bool overlap) {
             new (self) ShardedModel(model_json, mesh, mode, seed, {lr, beta1, beta2, eps, weight_decay}, grad_clip,
                                     overlap);
           })
      .def("step",
           [](ShardedModel& self, In<int32_t> ids, In<int32_t> targets, float lr) {
             Tensor a = to_tensor(ids), b = to_tensor(targets);
             return without_gil([&] { return self.step(a, b, lr); });
           })
      .def("layout", &ShardedModel::layout)
      .def_prop_ro("mesh", &ShardedModel::mesh)
      .def_prop_ro("mode", &ShardedModel::mode);
}

}  // namespace loom::python
