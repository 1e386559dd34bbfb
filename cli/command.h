// The `loom` CLI is a set of subcommands, each registered from its own cli/<name>.cpp file:
//
//   static loom::cli::Register reg("tokenizer", "Train, encode and decode byte-level BPE",
//                                  [](CLI::App& cmd) { ...add options and subcommands... });
//
// The setup function adds options and a callback; the callback calls the library (cli/ stays thin).
// main.cpp catches loom::Error, prints "error: <message>" and exits 1.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace loom::cli {

struct Command {
  std::string name;
  std::string description;
  std::function<void(CLI::App&)> setup;
};

std::vector<Command>& registry();

struct Register {
  Register(std::string name, std::string description, std::function<void(CLI::App&)> setup) {
    registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace loom::cli
