#include "train/memory.h"

#include "core/error.h"

namespace loom::train {

runs::MemoryEstimate training_memory(const TrainConfig& c) {
  runs::MemoryEstimate e = runs::training_step_memory(c.model, c.training.batch_size, c.training.precision == "bf16");
  const double B = static_cast<double>(c.training.batch_size), T = static_cast<double>(c.model.context_length());
  if (c.eval.interval > 0) {
    e.add("validation batches",
          str("eval.batches=", c.eval.batches, " training.batch_size=", c.training.batch_size,
              " model.context_length=", c.model.context_length()),
          static_cast<double>(c.eval.batches) * B * T * 8);
  }
  if (c.sample.num_samples > 0) e.add(runs::kv_cache_memory(c.model, 1));
  return e;
}

}  // namespace loom::train
