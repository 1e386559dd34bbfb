// Modules and models: TransformerBlock, every model family through models::LanguageModel (built from a
// config's model section), and the Llama-style TransformerLM's own constructor, with their weights as
// numpy arrays under their dotted names, forward, loss, gradients, save/load and generation.
// python/loom/model.py wraps these in the public classes.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <mutex>

#include "convert.h"
#include "core/autograd.h"
#include "generate/generate.h"
#include "io/json.h"
#include "io/outputs.h"
#include "models/llama/model.h"
#include "models/model_config.h"
#include "runs/load.h"
#include "runs/memory.h"

namespace loom::python {

namespace {

// i32 [T] = 0..T-1.
Tensor arange_positions(int64_t t) {
  std::vector<int32_t> p(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return Tensor::from_vector(Shape{t}, p);
}

nb::list names_of(nn::Module& module) {
  nb::list out;
  for (auto* p : module.parameters()) out.append(p->name);
  return out;
}

// name -> array. live: views of the parameters' storage (writes change the model); else copies.
nb::dict weights_of(nn::Module& module, bool live) {
  nb::dict out;
  for (auto* p : module.parameters()) out[p->name.c_str()] = live ? to_numpy(p->value) : to_numpy_copy(p->value);
  return out;
}

void load_weight(nn::Module& module, const std::string& name, const Tensor& values) {
  nn::Parameter& p = module.parameter(name);
  LOOM_CHECK(values.shape() == p.value.shape(), "the model's '", name, "' has shape ", p.value.shape(),
             " but the given array has shape ", values.shape());
  p.value.copy_from(values);
  p.value_changed();  // a mixed-precision bf16 copy no longer matches
}

// A model's memory held to the budget before anything is allocated, as the CLI's commands hold theirs
// (runs/memory.h: the smallest of MemAvailable, the cgroup's room and RLIMIT_AS/RLIMIT_DATA): a
// vocab_size of 2^31 is an error naming the sizes, not "could not allocate 137438953408 bytes".
void check_model_memory(const models::ModelConfig& config, const std::string& what) {
  runs::check_memory(runs::model_memory(config), runs::MemoryBudget::of_machine(), what);
}

}  // namespace

void bind_models(nb::module_& m) {
  nb::class_<nn::Module>(m, "Module")
      .def("parameter_names", &names_of)
      .def("state_dict", [](nn::Module& self) { return weights_of(self, false); })
      // The arrays share the parameters' storage (each keeps its tensor alive), so no keep_alive is needed.
      .def("parameters", [](nn::Module& self) { return weights_of(self, true); })
      .def("load_parameter", [](nn::Module& self, const std::string& name, In<float> values) {
        load_weight(self, name, to_tensor(values));
      });

  nb::class_<nn::TransformerBlock, nn::Module>(m, "TransformerBlock")
      .def("__init__",
           [](nn::TransformerBlock* self, int64_t d_model, int64_t num_heads, int64_t d_ff, int64_t max_seq_len,
              float rope_theta, float norm_eps, uint64_t seed) {
             LOOM_CHECK(d_model > 0 && num_heads > 0 && d_ff > 0 && max_seq_len > 0,
                        "TransformerBlock: sizes must be positive: d_model=", d_model, " num_heads=", num_heads,
                        " d_ff=", d_ff, " max_seq_len=", max_seq_len);
             LOOM_CHECK(d_model % num_heads == 0 && (d_model / num_heads) % 2 == 0, "TransformerBlock: d_model=",
                        d_model, " must split into num_heads=", num_heads, " heads of even size");
             // Its f32 weights (q, k, v, output [C, C]; w1, w3 [F, C], w2 [C, F]; two norms) and RoPE tables
             // (cos, sin [max_seq_len, D/2]) within the budget.
             const double bytes = 4.0 * (4.0 * double(d_model) * double(d_model) +
                                         3.0 * double(d_model) * double(d_ff) + 2.0 * double(d_model) +
                                         double(max_seq_len) * double(d_model / num_heads));
             const runs::MemoryBudget budget = runs::MemoryBudget::of_machine();
             LOOM_CHECK(bytes <= budget.bytes, "TransformerBlock: d_model=", d_model, ", d_ff=", d_ff,
                        " and max_seq_len=", max_seq_len, " need ",
                        runs::format_bytes(bytes), " of weights, more than the ", runs::format_bytes(budget.bytes),
                        " loom may use (", budget.source, ")");
             new (self) nn::TransformerBlock("", d_model, num_heads, d_ff, max_seq_len, rope_theta, norm_eps,
                                             RngKey::from_seed(seed));
           })
      // x: [B, T, C]; positions: i32 [T] or [B, T] (default 0..T-1).
      .def(
          "forward",
          [](const nn::TransformerBlock& self, In<float> x, std::optional<In<int32_t>> positions) {
            Tensor tx = to_tensor(x);
            Tensor tp = positions ? to_tensor(*positions) : Tensor();
            Tensor y = without_gil([&] {
              autograd::NoGradGuard no_grad;
              check_ndim(tx, 3, "TransformerBlock.forward", "x");
              return self.forward(tx, tp.defined() ? tp : arange_positions(tx.size(1)));
            });
            return to_numpy(y);
          },
          nb::arg("x"), nb::arg("positions").none());

  nb::class_<models::LanguageModel, nn::Module>(m, "LanguageModel")
      .def_prop_ro("config_json", [](const models::LanguageModel& self) { return self.model_config().json().dump(); })
      .def_prop_ro("arch", [](const models::LanguageModel& self) { return self.arch(); })
      .def_prop_ro("num_params", [](models::LanguageModel& self) { return self.num_parameters(); })
      // ids: i32 [B, T] -> logits [B, T, V].
      .def("forward",
           [](const models::LanguageModel& self, In<int32_t> ids) {
             Tensor t = to_tensor(ids);
             Tensor y = without_gil([&] {
               autograd::NoGradGuard no_grad;
               return self.logits(t);
             });
             return to_numpy(y);
           })
      .def("loss",
           [](const models::LanguageModel& self, In<int32_t> inputs, In<int32_t> targets) {
             Tensor x = to_tensor(inputs), y = to_tensor(targets);
             return without_gil([&] {
               autograd::NoGradGuard no_grad;
               return self.loss(x, y).item();
             });
           })
      // The mean loss and d(loss)/d(parameter) for every parameter, by name (fresh arrays each call).
      // Gradients accumulate in the parameters, so calls on one model from several threads (the GIL is
      // released) take turns on the model's lock.
      .def("loss_and_grads",
           [](models::LanguageModel& self, In<int32_t> inputs, In<int32_t> targets) {
             Tensor x = to_tensor(inputs), y = to_tensor(targets);
             auto params = self.parameters();
             std::vector<Tensor> grads(params.size());
             float loss = without_gil([&] {
               std::lock_guard<std::mutex> lock(self.backward_mutex());
               for (auto* p : params) p->value.set_grad(Tensor());
               Tensor l = self.loss(x, y);
               l.backward();
               for (size_t i = 0; i < params.size(); ++i) {
                 Tensor g = params[i]->value.grad();
                 grads[i] = g.defined() ? g.clone() : Tensor::zeros(params[i]->value.shape());
                 params[i]->value.set_grad(Tensor());
               }
               return l.item();
             });
             nb::dict out;
             for (size_t i = 0; i < params.size(); ++i) out[params[i]->name.c_str()] = to_numpy(grads[i]);
             return nb::make_tuple(loss, out);
           })
      .def("save",
           [](const models::LanguageModel& self, const std::string& path) {
             io::check_output_outside_runs("Model.save: path", path);  // a run's files are its own
             without_gil([&] { runs::save_model_weights(self, path); });
           })
      // New tokens (not the prompt), sampled with the model's decoding cache.
      .def(
          "generate",
          [](const models::LanguageModel& self, std::vector<int32_t> prompt, int64_t max_new_tokens,
             float temperature, int64_t top_k, float top_p, uint64_t seed, int32_t stop_token) {
            generate::GenerateOptions o;
            o.max_new_tokens = max_new_tokens;
            o.sampling = {temperature, top_k, top_p};
            o.seed = seed;
            o.stop_token = stop_token;
            InterruptCheck interrupted;  // Ctrl-C ends a long generation with KeyboardInterrupt
            return without_gil([&] { return generate::generate(self, prompt, o, [&](int32_t) { interrupted(); }); });
          },
          nb::arg("prompt"), nb::arg("max_new_tokens"), nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"),
          nb::arg("seed"), nb::arg("stop_token"));

  nb::class_<llama::TransformerLM, models::LanguageModel>(m, "TransformerLM")
      .def("__init__",
           [](llama::TransformerLM* self, int64_t vocab_size, int64_t context_length, int64_t d_model,
              int64_t num_layers, int64_t num_heads, int64_t d_ff, float rope_theta, float norm_eps, uint64_t seed,
              int64_t num_kv_heads) {
             llama::Config c;
             c.num_kv_heads = num_kv_heads == num_heads ? 0 : num_kv_heads;
             c.vocab_size = vocab_size;
             c.context_length = context_length;
             c.d_model = d_model;
             c.num_layers = num_layers;
             c.num_heads = num_heads;
             c.d_ff = d_ff;
             c.rope_theta = rope_theta;
             c.norm_eps = norm_eps;
             c.validate();
             nlohmann::json j = c.to_json();
             j["arch"] = "llama";
             check_model_memory(models::ModelConfig::from_json(j), "TransformerLM");
             new (self) llama::TransformerLM(c, seed);
           });

  // Any family, from a model section as JSON text ({"arch": "gpt2", ...}; missing keys take the family's
  // defaults).
  m.def("build_model", [](const std::string& config_json, uint64_t seed) {
    models::ModelConfig config = models::ModelConfig::from_json(io::parse_json(config_json, "build_model config"));
    check_model_memory(config, "Model.from_config");
    return without_gil([&] { return config.build(seed); });
  });

  m.def("load_model_weights", [](const std::string& path) {
    return without_gil([&] {
      auto model = runs::load_model_weights(path);
      runs::check_weights_finite(*model, path);  // as every other loader does (issue 32)
      return model;
    });
  });
  // (model, tokenizer or None, config JSON text or None) of a run directory or a weights file.
  m.def("load_run", [](const std::string& path, bool is_weights_file) {
    runs::LoadedRun run = without_gil([&] { return is_weights_file ? runs::load_weights(path) : runs::load_run(path); });
    nb::object model = nb::cast(run.model.release(), nb::rv_policy::take_ownership);
    nb::object tok = run.tokenizer ? nb::cast(std::move(*run.tokenizer), nb::rv_policy::move) : nb::none();
    nb::object cfg = run.config ? nb::cast(run.config->dump()) : nb::none();
    return nb::make_tuple(model, tok, cfg);
  });
}

}  // namespace loom::python
