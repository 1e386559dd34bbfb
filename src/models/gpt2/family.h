// The gpt2 family's registration (models/family.h).
#pragma once

#include "models/family.h"

namespace loom::gpt2 {

const models::Family& family();

}  // namespace loom::gpt2
