// `loom options --json` (hidden): every command of the CLI, nested ones too (`tokenizer train`, `bench
// decode`), with each option as CLI11 defines it: its names, its type (INT, UINT, FLOAT, TEXT; none for a
// flag), whether it is required or repeatable, its default, what it excludes or needs, and for a path
// option the tag given where it is defined (cli/command.h: a file, a directory or either, read or
// written, and what it holds). The wrong-way harness (tools/wrong_way.py) generates its cases from this,
// so a new option is tried the wrong way as soon as it exists.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/version.h"
#include "models/family.h"
#include "train/config.h"
#include "train/finetune.h"

namespace loom::cli {
std::map<const CLI::Option*, PathTag>& path_tags() {
  static std::map<const CLI::Option*, PathTag> tags;
  return tags;
}

std::map<const CLI::Option*, NumberRange>& number_ranges() {
  static std::map<const CLI::Option*, NumberRange> ranges;
  return ranges;
}

const char* path_role_name(PathRole role) {
  switch (role) {
    case PathRole::InFile: return "in-file";
    case PathRole::InDir: return "in-dir";
    case PathRole::InPath: return "in-path";
    case PathRole::OutFile: return "out-file";
    case PathRole::OutDir: return "out-dir";
    case PathRole::OutPath: return "out-path";
  }
  return "?";
}
}  // namespace loom::cli

namespace {
using nlohmann::ordered_json;

// "--max-new-tokens", "-m", or a positional's name ("file").
std::string option_name(const CLI::Option* opt) {
  if (!opt->get_lnames().empty()) return "--" + opt->get_lnames().front();
  if (!opt->get_snames().empty()) return "-" + opt->get_snames().front();
  return opt->get_name(true, false);
}

ordered_json describe_option(const CLI::Option* opt) {
  ordered_json o;
  std::vector<std::string> names;
  for (const auto& n : opt->get_lnames()) names.push_back("--" + n);
  for (const auto& n : opt->get_snames()) names.push_back("-" + n);
  if (!opt->nonpositional()) names.push_back(opt->get_name(true, false));
  o["name"] = option_name(opt);
  o["names"] = names;
  o["positional"] = !opt->nonpositional();
  const bool flag = opt->get_expected_max() == 0 || (opt->get_type_name().empty() && opt->get_items_expected_max() == 0);
  o["flag"] = flag;
  const auto tag = loom::cli::path_tags().find(opt);
  o["type"] = flag ? "" : tag != loom::cli::path_tags().end() ? "PATH" : opt->get_type_name();
  o["required"] = opt->get_required();
  o["repeatable"] = !flag && opt->get_items_expected_max() > 1;
  o["default"] = opt->get_default_str();
  if (tag != loom::cli::path_tags().end()) {
    o["path"] = {{"role", loom::cli::path_role_name(tag->second.role)}, {"holds", tag->second.holds}};
  }
  if (const auto range = loom::cli::number_ranges().find(opt); range != loom::cli::number_ranges().end()) {
    o["range"] = {{"min", range->second.min}, {"max", range->second.max}, {"max_inclusive", range->second.max_inclusive}};
  }
  std::vector<std::string> excludes, needs;
  for (const CLI::Option* other : opt->get_excludes()) excludes.push_back(option_name(other));
  for (const CLI::Option* other : opt->get_needs()) needs.push_back(option_name(other));
  o["excludes"] = excludes;
  o["needs"] = needs;
  o["description"] = opt->get_description();
  return o;
}

void describe_app(const CLI::App* app, const std::vector<std::string>& path, ordered_json& commands) {
  if (!path.empty()) {
    ordered_json c;
    c["command"] = path;
    c["description"] = app->get_description();
    c["hidden"] = app->get_group().empty();
    std::vector<std::string> subs;
    for (const CLI::App* sub : app->get_subcommands({})) subs.push_back(sub->get_name());
    c["subcommands"] = subs;
    c["requires_subcommand"] = app->get_require_subcommand_min() > 0;
    ordered_json options = ordered_json::array();
    for (const CLI::Option* opt : app->get_options()) {
      if (opt == app->get_help_ptr() || opt == app->get_help_all_ptr()) continue;
      options.push_back(describe_option(opt));
    }
    c["options"] = options;
    commands.push_back(c);
  }
  for (const CLI::App* sub : app->get_subcommands({})) {
    std::vector<std::string> sub_path = path;
    sub_path.push_back(sub->get_name());
    describe_app(sub, sub_path, commands);
  }
}

loom::cli::Register reg("options", "", [](CLI::App& cmd) {
  cmd.group("");  // hidden: a tool's interface, not a user's
  static bool json = false;
  cmd.add_flag("--json", json, "print the description as JSON (the only form)");
  cmd.callback([&cmd] {
    const CLI::App* root = &cmd;
    while (root->get_parent()) root = root->get_parent();
    ordered_json commands = ordered_json::array();
    describe_app(root, {}, commands);
    ordered_json out = {{"loom", loom::kVersion}, {"commands", commands}};
    // The relations between config keys that validation checks (train/config.h, each family's fields):
    // tools/wrong_way.py breaks each one alone.
    ordered_json model = ordered_json::object();
    for (const loom::models::Family* f : loom::models::families()) {
      model[f->arch] = loom::io::relations_json(f->relations, "model.");
    }
    out["config_relations"] = {{"train", loom::io::relations_json(loom::train::TrainConfig::relations(), "")},
                               {"finetune", loom::io::relations_json(loom::train::FinetuneConfig::relations(), "")},
                               {"model", model}};
    std::printf("%s\n", out.dump(1).c_str());
  });
});

}  // namespace
