// The deepseek_v3 family's registration (models/family.h).
#pragma once

#include "models/family.h"

namespace loom::deepseek_v3 {

const models::Family& family();

}  // namespace loom::deepseek_v3
