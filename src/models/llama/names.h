// The llama family's table of tensor names (models/tensor_names.h): loom's, LlamaForCausalLM's and
// llama.cpp's "llama" architecture's, which models/hf.cpp and models/gguf.cpp loop over.
#pragma once

#include "models/tensor_names.h"

namespace loom::llama {

const models::TensorTable& tensor_names();

}  // namespace loom::llama
