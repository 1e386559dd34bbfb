// `loom config --config C [--set section.key=value]...`: the resolved training config, every key, as
// `loom train` would run it. A preset states only what differs from its base (train/presets.h), so this
// is where one reads a preset in full, and what bench/'s PyTorch and JAX scripts read a model from.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "train/config.h"

namespace {
struct Options {
  std::string config = "default";
  std::vector<std::string> overrides;
};

loom::cli::Register reg("config", "Print a preset or config file resolved in full (JSON), with overrides applied",
                        [](CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  loom::cli::in_file(cmd.add_option("--config", o->config, "preset name or config file"), "config")
      ->type_name("PRESET|FILE")
      ->capture_default_str();
  cmd.add_option("--set", o->overrides, "override a config value: section.key=value (repeatable)");
  cmd.callback([o] {
    std::printf("%s\n", loom::train::TrainConfig::load(o->config, o->overrides).to_json().dump(2).c_str());
  });
});
}  // namespace
