// `loom inspect FILE`: what a safetensors file holds (tensors, metadata) and, for a loom weights file, the
// model it describes, as text for the console.
#pragma once

#include <string>

#include "io/safetensors.h"

namespace loom::report {

// "PATH: N tensors, ... bytes", the metadata, then one row per tensor (name, dtype, shape, bytes), sorted
// by name (the file's own order is by dtype), and the total; `path` names the file in the first line.
std::string format_safetensors_listing(const io::SafetensorsFile& file, const std::string& path);

// A loom weights file's model (its metadata's loom.model_config): family, shape, parameters and decoding
// cache per token; "" when the file has no loom.model_config. Throws loom::Error when it is malformed.
std::string describe_weights_model(const io::SafetensorsFile& file, const std::string& path);

}  // namespace loom::report
