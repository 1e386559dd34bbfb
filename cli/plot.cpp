// `loom plot DIR`: loss and learning-rate charts (SVG) from a run's metrics.jsonl.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "report/plot.h"

namespace {
loom::cli::Register reg("plot", "Draw a run's loss and learning-rate curves as SVG", [](CLI::App& cmd) {
  auto dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd.add_option("dir", *dir, "run directory holding metrics.jsonl")->required();
  cmd.add_option("--out", *out, "where to write loss.svg and lr.svg (default: the run directory)");
  cmd.callback([dir, out] {
    for (const auto& path : loom::report::plot_run(*dir, *out)) std::printf("wrote %s\n", path.c_str());
  });
});
}  // namespace
