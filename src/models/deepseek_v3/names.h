// The deepseek_v3 family's table of tensor names (models/tensor_names.h): loom's and
// DeepseekV3ForCausalLM's (DeepSeek's checkpoints), which models/hf.cpp loops over. No GGUF.
#pragma once

#include "models/tensor_names.h"

namespace loom::deepseek_v3 {

const models::TensorTable& tensor_names();

}  // namespace loom::deepseek_v3
