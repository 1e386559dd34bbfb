// The llama family's registration (models/family.h).
#pragma once

#include <vector>

#include "models/family.h"

namespace loom::llama {

const models::Family& family();
// configs/*.json whose model.arch is "llama", compiled in (presets.cpp, generated).
std::vector<models::Preset> presets();

}  // namespace loom::llama
