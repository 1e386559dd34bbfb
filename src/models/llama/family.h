// The llama family's registration (models/family.h).
#pragma once

#include "models/family.h"

namespace loom::llama {

const models::Family& family();

}  // namespace loom::llama
