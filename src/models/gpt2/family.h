// The gpt2 family's registration (models/family.h).
#pragma once

#include <vector>

#include "models/family.h"

namespace loom::gpt2 {

const models::Family& family();
// configs/*.json whose model.arch is "gpt2", compiled in (presets.cpp, generated).
std::vector<models::Preset> presets();

}  // namespace loom::gpt2
