// An opt-in per-op timer for the training step: `loom bench roofline` uses it to put each op family's
// time next to its FLOPs and bytes.
//
// Off unless a ProfileScope is alive on the calling thread. Off, the hooks in autograd::record and in the
// backward engine cost one thread-local load and a branch per op; nothing is allocated or timed.
//
// On, each op that autograd::record sees (with grad enabled) becomes an OpRecord with the shapes and
// dtypes of its inputs and outputs. Its forward time is the wall time since the previous record (or
// since mark()): an op runs its kernel and then records itself, so the interval is the op's own work
// plus any untracked glue before it (views, rope tables), which is small next to the kernels. Its
// backward time is the wall time of its Node's backward function, measured exactly by the engine; the
// engine's own work between nodes (summing gradients that meet, accumulating into .grad) goes to
// `backward_glue_seconds`. Only the thread that owns the scope is timed: ops recorded on other threads
// are not seen.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace loom {
class Tensor;
using TensorList = std::vector<Tensor>;
}  // namespace loom

namespace loom::profile {

struct TensorInfo {
  Shape shape;
  DType dtype = DType::F32;
  bool requires_grad = false;
  int64_t bytes() const { return shape.numel() * static_cast<int64_t>(dtype_size(dtype)); }
};

struct OpRecord {
  std::string name;  // the op's autograd name: "linear", "rms_norm", ...
  std::vector<TensorInfo> inputs, outputs;
  double forward_seconds = 0;
  double backward_seconds = 0;
  bool has_backward = false;  // a Node was made (some input required grad)
};

class Profile {
 public:
  // Starts a forward interval now: the next recorded op's time is measured from here.
  void mark() { last_mark_ = stamp(); }
  // Adds `seconds` to a region timed by the caller (the optimizer step, gradient clipping).
  void add_region(const std::string& name, double seconds);

  std::vector<OpRecord> ops;
  std::vector<std::pair<std::string, double>> regions;  // in first-seen order
  double backward_glue_seconds = 0;

  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  // A time stamp after `wait`: on a GPU, kernels are queued and return at once, so each stamp first
  // waits for the device (wait = the stream's synchronize) and an op is charged the kernels it queued.
  double stamp() const {
    if (wait) wait();
    return now();
  }
  std::function<void()> wait;  // null on the CPU

  // Hooks (autograd.cpp): a new op; returns its index in `ops`.
  int on_record(const char* name, const TensorList& inputs, const TensorList& outputs);
  void on_backward(int index, double seconds);

 private:
  double last_mark_ = now();
};

// The profile the calling thread reports to, or null (profiling off).
Profile* active();

// Makes `profile` the calling thread's active profile for the scope's lifetime (nesting restores the
// outer one).
class ProfileScope {
 public:
  explicit ProfileScope(Profile& profile);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profile* previous_;
};

}  // namespace loom::profile
