// The deepseek_v3 family's registration (models/family.h).
#pragma once

#include <vector>

#include "models/family.h"

namespace loom::deepseek_v3 {

const models::Family& family();
// configs/*.json whose model.arch is "deepseek_v3", compiled in (presets.cpp, generated).
std::vector<models::Preset> presets();

}  // namespace loom::deepseek_v3
