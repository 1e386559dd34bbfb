// Entry point of the `loom` CLI: builds the subcommands that cli/*.cpp registered and runs one.
#include "cli/command.h"
#include "core/error.h"

#include <algorithm>
#include <cstdio>
#include <exception>

namespace loom::cli {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace loom::cli

int main(int argc, char** argv) {
  CLI::App app{"loom: language models from scratch, in C++"};
  app.require_subcommand(1);
  auto& commands = loom::cli::registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
