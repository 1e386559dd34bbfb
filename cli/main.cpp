// Entry point of the `loom` CLI: builds the subcommands that cli/*.cpp registered and runs one.
// Exit statuses: cli/exit_codes.h.
#include "cli/command.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/isa.h"
#include "cli/exit_codes.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/version.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

namespace loom::cli {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

namespace {
// "/runs/x: cannot create directories: Permission denied" from libstdc++'s "filesystem error: cannot create
// directories: Permission denied [/runs/x]": the path first, then what could not be done and why.
std::string describe(const std::filesystem::filesystem_error& e) {
  std::string what = e.what();
  const std::string prefix = "filesystem error: ";
  if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  if (const size_t bracket = what.find(" ["); bracket != std::string::npos) what.erase(bracket);
  std::string paths = e.path1().string();
  if (!e.path2().empty()) paths += " -> " + e.path2().string();
  return paths.empty() ? what : paths + ": " + what;
}
}  // namespace
}  // namespace loom::cli

int main(int argc, char** argv) {
  // GNU OpenMP has read its wait policy from the environment before main runs: to give it loom's
  // default (a bounded spin, core/parallel.h) when the user set none, the CLI runs itself once more
  // with the variable set. The second run finds it set and goes on; if the exec fails, so does this one,
  // with OpenMP's default.
  if (loom::set_default_wait_policy_env()) execv("/proc/self/exe", argv);
  CLI::App app{"loom: language models from scratch, in C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("loom ") + loom::kVersion);
  auto& commands = loom::cli::registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    command.setup(*sub);
  }
  try {
    loom::cpu::cpu_isa();  // a LOOM_CPU_ISA this CPU cannot run is an error before any work (isa.h)
    loom::cpu::gemm_kernel();  // so is a LOOM_GEMM that names no kernel, or one this CPU cannot run (gemm.h)
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);  // prints the help, the version, or what does not parse
    return status == 0 ? loom::cli::kExitOk : loom::cli::kExitUsage;
  } catch (const loom::cli::ExitStatus& e) {
    return e.code;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return loom::cli::kExitError;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "error: %s\n", loom::cli::describe(e).c_str());
    return loom::cli::kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return loom::cli::kExitError;
  }
  return loom::cli::kExitOk;
}
