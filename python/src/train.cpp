// Optimizer, schedule, clipping, batches, safetensors files and the training entry point.
//
// The optimizer works on numpy arrays the caller owns: each step wraps them (no copy) as the values and
// gradients of placeholder parameters and runs train::AdamW, so the update is the trainer's own kernel
// and the arrays change in place. One optimizer may be used from several Python threads: its calls take
// turns (a mutex), since a step runs with the GIL released.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "convert.h"
#include "core/autograd.h"
#include "data/batch.h"
#include "io/json.h"
#include "io/outputs.h"
#include "io/safetensors.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "runs/memory.h"
#include "runs/run_dir.h"
#include "train/run.h"
#include "train/trainer.h"

namespace loom::python {

namespace {

class PyAdamW {
 public:
  explicit PyAdamW(train::AdamWOptions options) : options_(options) { options_.validate(); }

  // params: float32 arrays updated in place (cast without conversion: a converted copy would be
  // updated instead of the caller's array); grads: same shapes, or None to leave that parameter alone.
  void step(nb::list params, nb::list grads, float lr) {
    auto lock = lock_without_gil();
    // The wrappers go when the step ends, thrown or not: the arrays they point into may go after.
    struct DropWrappers {
      std::vector<std::unique_ptr<nn::Parameter>>& slots;
      ~DropWrappers() {
        for (auto& slot : slots) slot->value = Tensor();
      }
    } drop{slots_};
    LOOM_CHECK(params.size() == grads.size(), "AdamW.step: ", params.size(), " parameters but ", grads.size(),
               " gradients");
    LOOM_CHECK(!opt_ || params.size() == slots_.size(), "AdamW.step: this optimizer holds state for ",
               slots_.size(), " parameters, got ", params.size());
    std::vector<InOut<float>> keep;  // the arrays stay referenced while wrapped
    keep.reserve(2 * params.size());
    std::vector<Tensor> ps, gs;
    for (size_t i = 0; i < params.size(); ++i) {
      keep.push_back(nb::cast<InOut<float>>(params[i], false));
      ps.push_back(wrap_array(keep.back()));
      Tensor g;
      if (!grads[i].is_none()) {
        keep.push_back(nb::cast<InOut<float>>(grads[i], false));
        g = wrap_array(keep.back());
        LOOM_CHECK(g.shape() == ps[i].shape(), "AdamW.step: grads[", i, "] has shape ", g.shape(), " but params[", i,
                   "] has shape ", ps[i].shape());
      }
      gs.push_back(g);
    }
    if (!opt_) create(ps);
    for (size_t i = 0; i < ps.size(); ++i) {
      slots_[i]->value = ps[i];
      ps[i].set_grad(gs[i]);  // undefined for None: AdamW skips that parameter
      if (!gs[i].defined()) continue;
      Tensor& m = opt_->exp_avg(i);
      if (touched_[i]) {
        LOOM_CHECK(m.shape() == ps[i].shape(), "AdamW.step: parameter ", i, " has shape ", ps[i].shape(),
                   " but its optimizer state has shape ", m.shape());
      } else if (!m.defined() || m.shape() != ps[i].shape()) {
        m = Tensor::zeros(ps[i].shape());
        opt_->exp_avg_sq(i) = Tensor::zeros(ps[i].shape());
      }
      touched_[i] = true;
    }
    without_gil([&] { opt_->step(lr); });
  }

  nb::dict state() {
    auto lock = lock_without_gil();
    nb::dict d;
    d["step"] = opt_ ? opt_->step_count() : 0;
    nb::list m, v;
    for (size_t i = 0; i < slots_.size(); ++i) {
      m.append(touched_[i] ? to_numpy_copy(opt_->exp_avg(i)) : nb::none());
      v.append(touched_[i] ? to_numpy_copy(opt_->exp_avg_sq(i)) : nb::none());
    }
    d["exp_avg"] = m;
    d["exp_avg_sq"] = v;
    return d;
  }

  // Moments by position (None: that parameter has had no update yet).
  void load_state(int64_t step, nb::list exp_avg, nb::list exp_avg_sq) {
    auto lock = lock_without_gil();
    LOOM_CHECK(step >= 0, "AdamW.load_state_dict: step must be >= 0, got ", step);
    LOOM_CHECK(exp_avg.size() == exp_avg_sq.size(), "AdamW.load_state_dict: ", exp_avg.size(), " exp_avg but ",
               exp_avg_sq.size(), " exp_avg_sq");
    std::vector<Tensor> ms, vs, shapes;
    for (size_t i = 0; i < exp_avg.size(); ++i) {
      LOOM_CHECK(exp_avg[i].is_none() == exp_avg_sq[i].is_none(), "AdamW.load_state_dict: parameter ", i,
                 " has one moment but not the other");
      Tensor m, v;
      if (!exp_avg[i].is_none()) {
        m = to_tensor(nb::cast<In<float>>(exp_avg[i], false));
        v = to_tensor(nb::cast<In<float>>(exp_avg_sq[i], false));
        LOOM_CHECK(m.shape() == v.shape(), "AdamW.load_state_dict: parameter ", i, " has exp_avg ", m.shape(),
                   " but exp_avg_sq ", v.shape());
      }
      ms.push_back(m);
      vs.push_back(v);
      shapes.push_back(m.defined() ? Tensor::empty(m.shape()) : Tensor::empty(Shape{0}));
    }
    slots_.clear();
    opt_.reset();
    create(shapes);
    for (size_t i = 0; i < ms.size(); ++i) {
      touched_[i] = ms[i].defined();
      if (!touched_[i]) continue;
      opt_->exp_avg(i) = ms[i];
      opt_->exp_avg_sq(i) = vs[i];
    }
    opt_->set_step_count(step);
    for (auto& slot : slots_) slot->value = Tensor();
  }

  const train::AdamWOptions& options() const { return options_; }

 private:
  // The train::AdamW over placeholder parameters, made once the number and shapes of the parameters are
  // known (its constructor may size state from them).
  void create(const std::vector<Tensor>& values) {
    std::vector<nn::Parameter*> ptrs;
    for (size_t i = 0; i < values.size(); ++i) {
      slots_.push_back(std::make_unique<nn::Parameter>());
      slots_.back()->name = std::to_string(i);
      slots_.back()->value = values[i];
      ptrs.push_back(slots_.back().get());
    }
    opt_ = std::make_unique<train::AdamW>(ptrs, options_);
    touched_.assign(values.size(), false);
  }

  // Calls take turns. A step releases the GIL while it computes, so the lock is taken with the GIL
  // released too: a thread waiting for it while holding the GIL would keep the thread that holds it
  // from ever finishing its step.
  std::unique_lock<std::mutex> lock_without_gil() {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      nb::gil_scoped_release release;
      lock.lock();
    }
    return lock;
  }

  std::mutex mu_;
  train::AdamWOptions options_;
  std::vector<std::unique_ptr<nn::Parameter>> slots_;
  std::unique_ptr<train::AdamW> opt_;
  std::vector<bool> touched_;  // whether parameter i has been updated (has meaningful moments)
};

// Any C-contiguous CPU array, read only: save_safetensors takes its bytes as they are.
using AnyArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// The safetensors dtype of a DLPack dtype, where safetensors has one.
std::optional<io::SafetensorsDtype> safetensors_dtype_of(nb::dlpack::dtype d) {
  using io::SafetensorsDtype;
  using Code = nb::dlpack::dtype_code;
  if (d.lanes != 1) return std::nullopt;
  switch (static_cast<Code>(d.code)) {
    case Code::Bool: return d.bits == 8 ? std::optional(SafetensorsDtype::BOOL) : std::nullopt;
    case Code::Int:
      switch (d.bits) {
        case 8: return SafetensorsDtype::I8;
        case 16: return SafetensorsDtype::I16;
        case 32: return SafetensorsDtype::I32;
        case 64: return SafetensorsDtype::I64;
      }
      return std::nullopt;
    case Code::UInt:
      switch (d.bits) {
        case 8: return SafetensorsDtype::U8;
        case 16: return SafetensorsDtype::U16;
        case 32: return SafetensorsDtype::U32;
        case 64: return SafetensorsDtype::U64;
      }
      return std::nullopt;
    case Code::Float:
      switch (d.bits) {
        case 16: return SafetensorsDtype::F16;
        case 32: return SafetensorsDtype::F32;
        case 64: return SafetensorsDtype::F64;
      }
      return std::nullopt;
    case Code::Bfloat: return d.bits == 16 ? std::optional(SafetensorsDtype::BF16) : std::nullopt;
    case Code::Complex: return d.bits == 64 ? std::optional(SafetensorsDtype::C64) : std::nullopt;
    default: return std::nullopt;
  }
}

// The DLPack dtype numpy reads for a safetensors dtype, where numpy has one.
std::optional<nb::dlpack::dtype> numpy_dtype_of(io::SafetensorsDtype d) {
  using io::SafetensorsDtype;
  using Code = nb::dlpack::dtype_code;
  auto of = [](Code code, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (d) {
    case SafetensorsDtype::BOOL: return of(Code::Bool, 8);
    case SafetensorsDtype::I8: return of(Code::Int, 8);
    case SafetensorsDtype::I16: return of(Code::Int, 16);
    case SafetensorsDtype::I32: return of(Code::Int, 32);
    case SafetensorsDtype::I64: return of(Code::Int, 64);
    case SafetensorsDtype::U8: return of(Code::UInt, 8);
    case SafetensorsDtype::U16: return of(Code::UInt, 16);
    case SafetensorsDtype::U32: return of(Code::UInt, 32);
    case SafetensorsDtype::U64: return of(Code::UInt, 64);
    case SafetensorsDtype::F16: return of(Code::Float, 16);
    case SafetensorsDtype::F32: return of(Code::Float, 32);
    case SafetensorsDtype::F64: return of(Code::Float, 64);
    case SafetensorsDtype::C64: return of(Code::Complex, 64);
    default: return std::nullopt;  // BF16 (converted by the caller) and the 4-, 6- and 8-bit floats
  }
}

// A copy of tensor `name` as a numpy array of its own dtype.
nb::object array_of(const io::SafetensorsFile& file, const std::string& name) {
  const io::SafetensorsTensorInfo& info = file.info(name);
  if (info.dtype == io::SafetensorsDtype::BF16) return to_numpy_copy(file.tensor(name).to(DType::F32));
  const auto dtype = numpy_dtype_of(info.dtype);
  LOOM_CHECK(dtype.has_value(), file.path(), ": tensor ", io::quote_name(name), " has dtype ",
             io::safetensors_dtype_name(info.dtype), ", which numpy has no dtype for");
  LOOM_CHECK(info.shape.size() <= 32, file.path(), ": tensor ", io::quote_name(name), " has ", info.shape.size(),
             " dimensions; numpy arrays have at most 32");
  std::span<const uint8_t> bytes = file.bytes(name);
  if (info.dtype == io::SafetensorsDtype::BOOL) {  // numpy's bool, like C++'s, is 0 or 1 and nothing else
    for (size_t i = 0; i < bytes.size(); ++i) {
      LOOM_CHECK(bytes[i] <= 1, file.path(), ": tensor ", io::quote_name(name), " is BOOL but element ", i,
                 " is byte ", int(bytes[i]), ", not 0 or 1");
    }
  }
  // operator new's storage is aligned for any dtype; one byte at least, so an empty array has a pointer.
  auto* copy = new std::vector<uint8_t>(std::max<size_t>(bytes.size(), 1));
  std::copy(bytes.begin(), bytes.end(), copy->begin());
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  std::vector<size_t> shape(info.shape.begin(), info.shape.end());
  return nb::cast(nb::ndarray<nb::numpy>(copy->data(), shape.size(), shape.data(), owner, nullptr, *dtype));
}

nb::dict summary_dict(const train::TrainSummary& s) {
  nb::dict d;
  d["steps_completed"] = s.steps_completed;
  d["steps_skipped"] = s.steps_skipped;
  d["last_loss"] = s.last_loss;
  d["first_val_loss"] = s.first_val_loss ? nb::cast(*s.first_val_loss) : nb::none();
  d["last_val_loss"] = s.last_val_loss ? nb::cast(*s.last_val_loss) : nb::none();
  d["tokens_per_s"] = s.tokens_per_s;
  d["stopped_early"] = s.stopped_early;
  return d;
}

}  // namespace

void bind_train(nb::module_& m) {
  nb::class_<PyAdamW>(m, "AdamW")
      .def("__init__",
           [](PyAdamW* self, float lr, float beta1, float beta2, float eps, float weight_decay) {
             new (self) PyAdamW(train::AdamWOptions{lr, beta1, beta2, eps, weight_decay});
           })
      .def("step", &PyAdamW::step)
      .def("state", &PyAdamW::state)
      .def("load_state", &PyAdamW::load_state)
      .def_prop_ro("lr", [](const PyAdamW& o) { return o.options().lr; })
      .def_prop_ro("betas", [](const PyAdamW& o) { return nb::make_tuple(o.options().beta1, o.options().beta2); })
      .def_prop_ro("eps", [](const PyAdamW& o) { return o.options().eps; })
      .def_prop_ro("weight_decay", [](const PyAdamW& o) { return o.options().weight_decay; });

  // Scales the float32 arrays in place when their global L2 norm exceeds max_norm; None entries are
  // skipped. Returns the norm before clipping.
  m.def("clip_grad_norm", [](nb::list grads, double max_norm) {
    std::vector<InOut<float>> keep;
    keep.reserve(grads.size());
    std::vector<Tensor> ts;
    for (nb::handle g : grads) {
      if (g.is_none()) continue;
      keep.push_back(nb::cast<InOut<float>>(g, false));
      ts.push_back(wrap_array(keep.back()));
    }
    return without_gil([&] { return train::clip_grad_norm(ts, max_norm); });
  });
  m.def("cosine_lr", &train::cosine_lr);

  // "" when `device` ("cpu", "cuda", "cuda:1") can hold a model, else why not (backends/backend.h's
  // model_device: no CUDA backend, driver or GPU, or the models not running on CUDA yet). A malformed
  // name raises ValueError.
  m.def("model_device_error", [](const std::string& device, const std::string& what) -> std::string {
    (void)Device::parse(device);
    try {
      model_device(device, what.c_str());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  });
  // (bytes, where the number comes from): the memory a job may use, the smallest of MemAvailable, the
  // cgroup's room and RLIMIT_AS / RLIMIT_DATA less what the process maps (runs/memory.h), as every CLI
  // command that checks memory uses. python/loom/_arrays.py holds large array conversions to it.
  m.def("memory_budget", [] {
    const runs::MemoryBudget b = runs::MemoryBudget::of_machine();
    return nb::make_tuple(b.bytes, b.source);
  });
  m.def("cuda_available", [] { return cuda_available(); });
  m.def("cuda_device_count", [] { return cuda_device_count(); });

  // The window starts of random batch `index` drawn with `seed`: uniform over [0, n-T-1].
  m.def("random_starts", [](uint64_t seed, uint64_t index, int64_t n, int64_t batch_size, int64_t context_length) {
    LOOM_CHECK(batch_size > 0 && context_length > 0, "get_batch: batch_size=", batch_size,
               " and context_length=", context_length, " must be positive");
    LOOM_CHECK(n > context_length, "get_batch: ", n, " tokens cannot hold a window of context_length=",
               context_length, " plus its target");
    auto starts = data::random_starts(RngKey::from_seed(seed).fold_in(index), n, batch_size, context_length);
    return starts;
  });

  // name -> array of any dtype safetensors stores (bool, int8..int64, uint8..uint64, float16/32/64,
  // complex64; bfloat16 from libraries that export it), written byte for byte, with string metadata.
  // No conversion happens here: python/loom/checkpoint.py makes the arrays contiguous and little-endian
  // and refuses other dtypes with their numpy names.
  m.def("save_safetensors", [](const std::string& path, nb::dict tensors, std::map<std::string, std::string> meta) {
    std::vector<AnyArray> keep;  // the arrays stay referenced while their bytes are written
    keep.reserve(tensors.size());
    std::vector<io::SafetensorsEntry> entries;
    for (auto [k, v] : tensors) {
      std::string name = nb::cast<std::string>(k);
      AnyArray a;
      LOOM_CHECK(nb::try_cast(v, a, false), "save_safetensors: '", name,
                 "' is not a C-contiguous array in CPU memory");
      auto dtype = safetensors_dtype_of(a.dtype());
      LOOM_CHECK(dtype.has_value(), "save_safetensors: '", name, "' has a dtype (DLPack code ",
                 int(a.dtype().code), ", ", int(a.dtype().bits), " bits) that safetensors cannot store");
      std::vector<uint64_t> shape(a.ndim());
      for (size_t i = 0; i < a.ndim(); ++i) shape[i] = a.shape(i);
      keep.push_back(a);
      entries.push_back({std::move(name), *dtype, std::move(shape), a.data(), a.nbytes()});
    }
    io::check_output_outside_runs("save_safetensors: path", path);  // a run's files are its own
    without_gil([&] { io::write_safetensors(path, entries, meta); });
  });
  // name -> a numpy array of the stored dtype (BF16 comes out as float32: numpy has no bfloat16).
  m.def("load_safetensors", [](const std::string& path) {
    auto file = without_gil([&] { return io::SafetensorsFile::open(path); });
    nb::dict tensors;
    for (const auto& name : file.names()) tensors[name.c_str()] = array_of(file, name);
    return nb::make_tuple(tensors, file.metadata());
  });

  // The resolved configuration, as JSON text, from a preset name or JSON file plus "key=value" overrides,
  // or from JSON text (is_json) checked against the defaults.
  m.def("resolve_config", [](const std::string& source, bool is_json, std::vector<std::string> overrides) {
    train::TrainConfig cfg = is_json ? train::TrainConfig::from_json(io::parse_json(source, "config"))
                                     : train::TrainConfig::load(source, overrides);
    return cfg.to_json().dump();
  });
  // What `loom train` does (train::run_training, the same function): data, training,
  // DIR/model.safetensors, DIR/tokenizer.json, under the same run-directory rules (runs/run_dir.h: a new or
  // empty directory, or one of loom's runs with overwrite; locked while training), without the console
  // notes and the samples. Ctrl-C stops cleanly after the current step (the weights are still saved).
  m.def("train", [](const std::string& config_json, const std::string& out, bool overwrite) {
    auto cfg = train::TrainConfig::from_json(io::parse_json(config_json, "config"));
    train::TrainRunOptions options;
    options.out = out;
    options.existing = overwrite ? runs::ExistingRun::Overwrite : runs::ExistingRun::Refuse;
    options.data_progress = cfg.logging.progress != "none";
    options.samples = false;
    train::TrainSummary summary = without_gil([&] { return train::run_training(cfg, options).summary; });
    return summary_dict(summary);
  }, nb::arg("config_json"), nb::arg("out"), nb::arg("overwrite") = false);
}

}  // namespace loom::python
