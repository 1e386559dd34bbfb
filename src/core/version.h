// loom's version, one constant for `loom version`, `loom --version` and the run.json marker that every
// run directory carries (runs/run_dir.h). Keep it equal to pyproject.toml's.
#pragma once

namespace loom {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace loom
