// Entry point of the `loom` CLI: builds the subcommands that cli/*.cpp registered and runs one.
// Exit statuses: cli/exit_codes.h.
#include "cli/command.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/isa.h"
#include "cli/exit_codes.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/thread_count.h"
#include "core/version.h"
#include "io/json.h"
#include "io/outputs.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
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

// A message as one readable line: control characters and bytes that are not UTF-8 escaped (\n, \x9f), a
// word longer than 160 bytes cut to its first 80 with its length, and the whole kept under about 1,200
// bytes (its head and its end, where what to do is said). A value the user typed is named, never
// echoed whole (a 20 KB prompt, a path of garbage bytes), and the message stays the last line of stderr.
std::string printable_message(const std::string& message) {
  std::string clean;
  for (size_t i = 0; i < message.size();) {
    const auto c = static_cast<unsigned char>(message[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool valid = len > 0 && i + len <= message.size() && !(len == 2 && c < 0xC2);
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(message[i + k]) & 0xC0) == 0x80;
    if (!valid || c < 0x20 || c == 0x7F) {
      char buf[8];
      if (c == '\n') std::snprintf(buf, sizeof buf, "\\n");
      else if (c == '\t') std::snprintf(buf, sizeof buf, "\\t");
      else std::snprintf(buf, sizeof buf, "\\x%02x", c);
      clean += buf;
      ++i;
      continue;
    }
    clean.append(message, i, len);
    i += len;
  }
  std::string out;
  for (size_t i = 0; i < clean.size();) {
    size_t end = clean.find(' ', i);
    if (end == std::string::npos) end = clean.size();
    const std::string_view word = std::string_view(clean).substr(i, end - i);
    out += word.size() > 160 ? io::brief_text(word, 80) : std::string(word);
    if (end < clean.size()) out += ' ';
    i = end + 1;
  }
  if (out.size() > 1200) {
    const std::string_view v(out);
    std::string head = io::brief_text(v.substr(0, 800), 800), tail(v.substr(v.size() - 300));
    while (!tail.empty() && (static_cast<unsigned char>(tail.front()) & 0xC0) == 0x80) tail.erase(0, 1);
    out = str(head, " [... ", out.size() - 1100, " bytes ...] ", tail);
  }
  return out;
}

// CLI11's own messages, as one line "error: ...". It reports a missing required option or subcommand
// before an argument it did not recognise; that argument is the user's mistake, so it comes first
// ("unknown command 'frobnicate'", not "a subcommand is required").
std::string failure_message(const CLI::App* root, const CLI::Error& e) {
  std::string where = "loom";
  const CLI::App* app = root;
  while (true) {
    const auto parsed = app->get_subcommands();
    if (parsed.empty()) break;
    app = parsed.back();
    where += " " + app->get_name();
  }
  std::string what = e.what();
  const std::vector<std::string> extra = root->remaining(true);
  if (!extra.empty()) {
    const std::string& first = extra.front();
    if (!first.empty() && first[0] == '-') {
      what = str("unknown option ", first);
    } else if (!app->get_subcommands({}).empty()) {
      std::string names;
      for (const CLI::App* sub : app->get_subcommands({})) {
        if (sub->get_group().empty()) continue;  // hidden
        names += (names.empty() ? "" : ", ") + sub->get_name();
      }
      what = str("unknown command '", first, "' (", where, " has: ", names, ")");
    } else {
      what = str("unexpected argument '", first, "'");
    }
  }
  if (!what.empty()) what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  return str("error: ", where, ": ", printable_message(what), " (", where, " --help lists the options)\n");
}

// Every number on loom's command line is a finite decimal >= 0 (no option takes a negative count, seed,
// temperature or fraction): checked on the text, before CLI11 converts it, because its conversion takes
// "-1" as 2^64-1 for an unsigned option, saturates a value too large for its type, reads "010" as octal
// and lets nan and inf through. Leading zeros are dropped ("010" is 10). Applied in main() to every
// option whose type is INT, UINT or FLOAT, so no command can forget it; then the range the option
// declared with in_range (cli/command.h), if any.
//
// number_text_check: "" when the text is such a number (it may have lost its leading zeros), else why not.
std::string number_text_check(const std::string& type, std::string& text) {
  const std::string shown = io::brief_text(text, 40);
  if (type == "FLOAT") {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || text.find_first_of("xXpP") != std::string::npos) {
      return str("expected a number, got \"", shown, "\"");
    }
    if (!std::isfinite(v) || errno == ERANGE) return str("expected a finite number, got ", shown);
    if (v < 0) return str("must be >= 0, got ", shown);
    return {};
  }
  if (!text.empty() && text[0] == '-' && text.size() > 1 &&
      std::all_of(text.begin() + 1, text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return str("must be >= 0, got ", shown);
  }
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return str("expected a whole number, got \"", shown, "\"");
  }
  const size_t nonzero = text.find_first_not_of('0');
  text = nonzero == std::string::npos ? "0" : text.substr(nonzero);
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  const unsigned long long max = type == "UINT" ? ~0ULL : static_cast<unsigned long long>(INT64_MAX);
  if (errno == ERANGE || v > max) return str(shown, " is too large (at most ", max, ")");
  return {};
}

// Its errors are loom's (exit 1, as the command's own checks of a value are), naming the command, the
// option and the value: "generate: --temperature: must be >= 0, got -1".
CLI::Validator number_check(const std::string& command, const std::string& option, const std::string& type,
                            std::optional<NumberRange> range) {
  const std::string lead = command + ": " + option + ": ";
  return CLI::Validator(
      [lead, type, range](std::string& text) -> std::string {
        const std::string why = number_text_check(type, text);
        if (!why.empty()) throw Error(lead + why);
        if (!range) return {};
        const double v = std::strtod(text.c_str(), nullptr);
        const bool above = range->max_inclusive ? v > range->max : v >= range->max;
        if (v < range->min || above) {
          const auto shown = [](double x) {
            return x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string(static_cast<long long>(x)) : str(x);
          };
          throw Error(str(lead, "must be in [", shown(range->min), ", ", shown(range->max),
                          range->max_inclusive ? "]" : ")", ", got ", io::brief_text(text, 40)));
        }
        return {};
      },
      "", "loom-number");
}

// A path option's value checked against its tag (cli/command.h) as it is parsed, before the command
// runs: an input exists and is a file or a directory as the option reads; an output is not empty and is
// not a directory where a file is written (or a file where a directory is). The error is loom's (exit 1),
// naming the option and the path. What the file holds is the command's to check.
CLI::Validator path_check(std::string command, std::string option, PathTag tag, std::string description) {
  // "eval: --data x: ...", or for a positional argument "inspect: x: ...".
  const std::string lead = command + ": " + (option.empty() ? "" : option + " ");
  // A missing input is said with what the option expects (its --help text: "run directory holding
  // metrics.jsonl", "... (tools/get_corpus.sh extracts it)").
  const std::string expects = description.empty() ? "" : " (expected: " + description + ")";
  return CLI::Validator(
      [lead, tag, expects](std::string& value) -> std::string {
        namespace fs = std::filesystem;
        const std::string shown = io::brief_text(value, 200);
        if (value.empty()) throw Error(str(lead, "\"\": the path is empty"));
        // A name the system cannot hold: said here, with the option, rather than as the system's
        // "File name too long" from wherever the command first uses it.
        if (value.size() >= PATH_MAX) throw IoError(str(lead, shown, ": the path is ", value.size(), " bytes long (at most ", PATH_MAX - 1, ")"));
        for (const auto& part : fs::path(value)) {
          if (part.native().size() > NAME_MAX) {
            throw IoError(str(lead, shown, ": a name in the path is ", part.native().size(), " bytes long (at most ", NAME_MAX, ")"));
          }
        }
        std::error_code ec;
        const fs::file_status status = fs::status(value, ec);
        const bool exists = fs::exists(status);
        const bool is_dir = fs::is_directory(status);
        const PathRole role = tag.role;
        if (role == PathRole::InFile || role == PathRole::InDir || role == PathRole::InPath) {
          // A config is a preset's name too: a bare word that is no file is left to the preset lookup.
          if (!exists && tag.holds == "config" && value.find('/') == std::string::npos && !value.ends_with(".json")) return {};
          if (!exists) {
            const std::string why = ec && ec != std::errc::no_such_file_or_directory ? ec.message() : "no such file or directory";
            throw IoError(str(lead, shown, ": ", why, expects));
          }
          if (role == PathRole::InFile && is_dir) throw IoError(str(lead, shown, ": is a directory; expected a file"));
          if (role == PathRole::InDir && !is_dir) throw IoError(str(lead, shown, ": is a file; expected a directory"));
          return {};
        }
        if (role == PathRole::OutFile && is_dir) throw IoError(str(lead, shown, ": is a directory; expected a file to write"));
        if (!exists) {  // the directory it will be made in: a directory, and writable
          fs::path up = fs::absolute(value, ec).parent_path();
          while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
          if (!fs::is_directory(up, ec)) throw IoError(str(lead, shown, ": ", up.string(), " is not a directory"));
          if (::access(up.c_str(), W_OK) != 0) {
            throw IoError(str(lead, shown, ": cannot create it in ", up.string(), ": ", std::strerror(errno)));
          }
        } else if (is_dir && role != PathRole::OutFile && ::access(value.c_str(), W_OK) != 0) {
          throw IoError(str(lead, shown, ": cannot write in it: ", std::strerror(errno)));
        }
        if (role == PathRole::OutDir && exists && !is_dir) {
          throw IoError(str(lead, shown, ": exists and is not a directory; expected a directory to write into"));
        }
        return {};
      },
      "", "loom-path");
}

// The writers' rule (io/outputs.h) for the command about to run, from its tags: every output given is
// apart from every input given (not the same path, not inside it, not holding it), and an output that is
// not itself a run directory (train, import, export, finetune, merge claim theirs through runs::RunDir) is not inside
// one: a plot, a token file or a tokenizer never lands among a run's files. `loom plot DIR` draws into
// DIR, the run it reads, by default and with --out DIR. Runs after parsing, before the command's callback.
void check_outputs(const CLI::App& root) {
  const CLI::App* app = &root;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().back();
  const std::string command = app->get_name();
  struct Given {
    std::string name;
    PathTag tag;
    std::vector<std::string> values;
  };
  std::vector<Given> ins, outs;
  for (const CLI::Option* opt : app->get_options()) {
    const auto tag = path_tags().find(opt);
    if (tag == path_tags().end() || opt->count() == 0) continue;
    const PathRole r = tag->second.role;
    const bool out = r == PathRole::OutFile || r == PathRole::OutDir || r == PathRole::OutPath;
    (out ? outs : ins).push_back({opt->nonpositional() ? opt->get_name() : opt->get_name(true, false), tag->second,
                                  opt->results()});
  }
  for (const Given& out : outs) {
    const std::string what = command + " " + out.name;
    for (const std::string& o : out.values) {
      std::string own_run;  // plot's own run
      // Writers whose output is a run directory they claim through runs::RunDir (finetune as a training
      // run, merge as an imported one), which applies the rule for runs itself.
      const bool claims_run = out.tag.holds == "train" || out.tag.holds == "import" || out.tag.holds == "export" ||
                              out.tag.holds == "finetune" || out.tag.holds == "merge";
      for (const Given& in : ins) {
        for (const std::string& i : in.values) {
          if (out.tag.holds == "plots" && in.tag.holds == "run" && !in.name.starts_with("--")) {
            own_run = i;
            std::error_code e1, e2;
            if (std::filesystem::weakly_canonical(o, e1) == std::filesystem::weakly_canonical(i, e2) && !e1 && !e2) continue;
          }
          io::check_output_apart(what, o, in.name, i, claims_run);
        }
      }
      if (!claims_run) io::check_output_outside_runs(what, o, own_run);
      const bool file = out.tag.role == PathRole::OutFile || out.tag.role == PathRole::OutPath;
      if (file && !claims_run) io::check_output_file_new(what, o);
    }
  }
}

// Adds number_check to every numeric option of `app` and its subcommands, and path_check to every
// tagged path option.
void check_values(CLI::App& app, const std::string& command) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    // Every --threads is bounded alike (0: the default count); above the cores it is clamped with a note
    // where the count is used (core/thread_count.h).
    if (opt->get_name() == "--threads" && !number_ranges().count(opt)) in_range(opt, 0, static_cast<double>(kMaxThreads));
    if (type == "INT" || type == "UINT" || type == "FLOAT") {
      const auto range = number_ranges().find(opt);
      opt->transform(number_check(command, opt->get_name(), type,
                                  range == number_ranges().end() ? std::nullopt : std::optional<NumberRange>(range->second)));
    }
    if (const auto tag = path_tags().find(opt); tag != path_tags().end()) {
      opt->check(path_check(command, opt->nonpositional() ? opt->get_name() : "", tag->second, opt->get_description()));
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) {
    check_values(*sub, command.empty() ? sub->get_name() : command + " " + sub->get_name());
  }
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
  loom::cli::check_values(app, "");
  app.parse_complete_callback([&app] { loom::cli::check_outputs(app); });
  app.failure_message(loom::cli::failure_message);
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
    std::fprintf(stderr, "error: %s\n", loom::cli::printable_message(e.what()).c_str());
    return loom::cli::kExitError;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "error: %s\n", loom::cli::printable_message(loom::cli::describe(e)).c_str());
    return loom::cli::kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", loom::cli::printable_message(e.what()).c_str());
    return loom::cli::kExitError;
  }
  return loom::cli::kExitOk;
}
