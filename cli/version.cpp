// `loom version`: the version and what this build contains.
#include <cstdio>

#include "cli/command.h"
#include "core/parallel.h"
#include "core/version.h"

namespace {
loom::cli::Register reg("version", "Print loom's version and build configuration", [](CLI::App& cmd) {
  cmd.callback([] {
    std::printf("loom %s\nbackends: cpu\nthreads: %d\n", loom::kVersion, loom::num_threads());
  });
});
}  // namespace
