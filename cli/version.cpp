// `loom version`: the version and what this build contains.
#include <cstdio>

#include "cli/command.h"
#include "core/parallel.h"

namespace {
loom::cli::Register reg("version", "Print loom's version and build configuration", [](CLI::App& cmd) {
  cmd.callback([] {
    std::printf("loom 0.1.0\nbackends: cpu\nthreads: %d\n", loom::num_threads());
  });
});
}  // namespace
