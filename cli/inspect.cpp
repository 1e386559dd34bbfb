// `loom inspect FILE`: the tensors (name, dtype, shape, bytes) and metadata of a safetensors file
// (report/inspect.h). A malformed file is an error (exit 1) whose message names what is wrong.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "io/safetensors.h"
#include "report/inspect.h"

namespace {

loom::cli::Register reg("inspect", "List the tensors and metadata of a safetensors file", [](CLI::App& cmd) {
  auto path = std::make_shared<std::string>();
  loom::cli::in_file(cmd.add_option("file", *path, "The .safetensors file"), "safetensors")->required();
  cmd.callback([path] {
    const loom::io::SafetensorsFile file = loom::io::SafetensorsFile::open(*path);
    std::fputs(loom::report::format_safetensors_listing(file, *path).c_str(), stdout);
    std::fputs(loom::report::describe_weights_model(file, *path).c_str(), stdout);
  });
});

}  // namespace
