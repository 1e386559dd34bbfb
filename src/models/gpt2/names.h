// The gpt2 family's table of tensor names (models/tensor_names.h): loom's, GPT2LMHeadModel's and
// llama.cpp's "gpt2" architecture's, which models/hf.cpp and models/gguf.cpp loop over.
#pragma once

#include "models/tensor_names.h"

namespace loom::gpt2 {

const models::TensorTable& tensor_names();

}  // namespace loom::gpt2
