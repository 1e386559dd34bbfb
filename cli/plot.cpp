// `loom plot DIR`: loss and learning-rate charts (SVG) from a run's metrics.jsonl.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "report/plot.h"

namespace {
loom::cli::Register reg("plot", "Draw a run's loss and learning-rate curves as SVG", [](CLI::App& cmd) {
  auto dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  loom::cli::in_dir(cmd.add_option("dir", *dir, "run directory holding metrics.jsonl"), "run")->required();
  auto compare = std::make_shared<std::vector<std::string>>();
  loom::cli::out_dir(cmd.add_option("--out", *out, "where to write loss.svg and lr.svg (default: the run directory)"), "plots");
  loom::cli::in_dir(cmd.add_option("--compare", *compare,
                 "other run directories to draw beside DIR: compare_loss.svg and compare_loss_gap.svg (their loss "
                 "minus DIR's) go to --out"), "run");
  cmd.callback([dir, out, compare] {
    if (!compare->empty()) {
      std::vector<std::string> dirs{*dir};
      dirs.insert(dirs.end(), compare->begin(), compare->end());
      for (const auto& path : loom::report::plot_compare(dirs, *out)) std::printf("wrote %s\n", path.c_str());
      return;
    }
    for (const auto& path : loom::report::plot_run(*dir, *out)) std::printf("wrote %s\n", path.c_str());
  });
});
}  // namespace
